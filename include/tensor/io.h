/* cten: reading data sets (IDX files), saving and loading named tensors
 * (safetensors checkpoints, NumPy .npy and .npz files), and a minibatch
 * data loader.
 *
 * Ownership follows core.h: a returned ct_tensor * is a new handle the
 * caller (or the open scope) owns; ct_params and ct_metadata lists returned
 * by a load belong to the caller (ct_params_free, ct_metadata_free).
 * Errors: NULL / a status / false, with the message in ct_last_error(),
 * naming the function and the file. A file that cannot be opened, read or
 * written is CT_ERR_IO; a file whose content is malformed is CT_ERR_FORMAT,
 * never a crash. */
#ifndef CTEN_IO_H
#define CTEN_IO_H

#include "core.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX (the MNIST / Fashion-MNIST format) -------------------------------------------
 * Magic 00 00 <type> <ndims>, then ndims big-endian uint32 sizes, then the
 * elements, big-endian, row-major. Element types: 0x08 uint8, 0x09 int8,
 * 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64. The file may be gzip
 * compressed (detected from its first bytes) or plain.
 *
 * Returns a CPU tensor of the file's shape converted to dtype (uint8 images
 * to CT_F32 keep their values 0..255; labels to CT_I64 for the losses).
 * Floating files into an integer dtype are refused (CT_ERR_DTYPE) rather
 * than truncated. The data must fill the file exactly: a short file
 * ("truncated") or bytes after the data ("trailing") are CT_ERR_FORMAT. */
ct_tensor *ct_idx_load(const char *path, ct_dtype dtype);

/* ---- safetensors -----------------------------------------------------------------------
 * The format of Hugging Face's safetensors: an 8-byte little-endian header
 * length N, N bytes of JSON
 *   {"__metadata__": {"key": "value", ...},
 *    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
 * then the data section: every tensor's elements, row-major, little-endian,
 * at [begin, end) relative to the section's start, the ranges covering the
 * section exactly without holes or overlaps. dtypes: BOOL, I32, I64, F16,
 * BF16, F32, F64. */

/* Ordered string key/value pairs: the header's "__metadata__". */
typedef struct ct_metadata ct_metadata;
ct_metadata *ct_metadata_new(void);
void ct_metadata_free(ct_metadata *m); /* NULL is a no-op */
/* Sets key to value (both copied, valid UTF-8, key non-empty), replacing an
 * existing value. */
ct_status ct_metadata_set(ct_metadata *m, const char *key, const char *value);
/* The value of key (borrowed, valid until the entry changes), or NULL
 * without an error when absent. */
const char *ct_metadata_get(const ct_metadata *m, const char *key);
int64_t ct_metadata_count(const ct_metadata *m);
/* Entry index: its key (borrowed), its value into *value when not NULL;
 * NULL with an error when index is out of range. */
const char *ct_metadata_at(const ct_metadata *m, int64_t index, const char **value);

/* Writes tensors (names and values, from any device and layout, in the
 * list's order) and meta (NULL: none) to path. The file appears
 * atomically: it is written to a temporary file in the same directory
 * ("<path>.tmp-<pid>.<host>.<random>"), synced and renamed over path, so a
 * crash never leaves half a checkpoint. The new file's mode is 0666 less
 * the umask, as for any file a program creates. Temporaries of path that a
 * writer killed mid-write left behind (its process gone) are removed by the
 * next save or load of path on the same host; a live writer's are kept.
 * Names must be valid UTF-8 and not "__metadata__". */
ct_status ct_save_safetensors(const char *path, const ct_params *tensors,
                              const ct_metadata *meta);
/* Reads every tensor of path into new contiguous CPU tensors, in the
 * header's order, after validating the whole header against the file.
 * *meta (when meta is not NULL) receives the metadata (an empty list when
 * the file has none). */
ct_params *ct_load_safetensors(const char *path, ct_metadata **meta);
/* The metadata of path (a new list; empty when the file has none), after
 * validating the whole header against the file, without reading tensors. */
ct_metadata *ct_load_safetensors_metadata(const char *path);
/* Copies the tensors of path into the tensors of dst with the same names
 * (any device; in no-grad mode, so parameters that require grad may be
 * restored): each must be in the file (else CT_ERR_FORMAT) with dst's shape
 * (else CT_ERR_SHAPE) and dtype (else CT_ERR_DTYPE). strict also refuses
 * tensors in the file that dst lacks (as load_state_dict's strict=True).
 * Nothing in dst changes unless every check passes. *meta as for
 * ct_load_safetensors. */
ct_status ct_load_safetensors_into(const char *path, ct_params *dst, bool strict,
                                   ct_metadata **meta);

/* ---- NumPy .npy / .npz ------------------------------------------------------------------
 * The files numpy.save, numpy.savez and numpy.savez_compressed write
 * (docs/INTEROP.md). A .npy file is the magic "\x93NUMPY", a version (1.0,
 * 2.0 or 3.0), a header that is a Python dict literal
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * and the elements. dtypes (descr): '|b1' bool, '<i4' int32, '<i8' int64,
 * '<f2' float16, '<f4' float32, '<f8' float64, and '<V2' bfloat16 (NumPy has
 * no bfloat16: ml_dtypes' bfloat16 arrays save as '<V2', and cten reads
 * every 2-byte void as bfloat16). Other dtypes (uint8, int16, complex,
 * structured, objects) are refused with CT_ERR_FORMAT naming the descr. An
 * .npz file is a zip archive of .npy members named "<name>.npy", stored or
 * deflated. */

/* Writes t (any device, dtype, layout) to path, little-endian, atomically
 * as ct_save_safetensors does. A CPU tensor laid out column-major (a
 * transpose of a contiguous tensor) is written as is with fortran_order
 * True, as numpy.save does for Fortran arrays; anything else in row-major
 * order. t is unchanged. */
ct_status ct_save_npy(const char *path, ct_tensor *t);
/* Reads path into a new CPU tensor of the file's dtype and shape (caller or
 * scope owns it). Little- and big-endian files are read; a Fortran-order
 * file gives a tensor with column-major strides over its data (not
 * contiguous: ct_contiguous makes a row-major copy). The header is checked
 * against the file's size before the data is allocated: a malformed
 * header, a shape that overflows, too few or too many bytes for the shape,
 * or a bool byte other than 0 or 1 is CT_ERR_FORMAT. */
ct_tensor *ct_load_npy(const char *path);
/* Writes each tensor of the list as the member "<name>.npy", in the list's
 * order, deflated (numpy.savez_compressed) when compress is true, else
 * stored (numpy.savez); atomically, as ct_save_npy. Names must be valid
 * UTF-8. */
ct_status ct_save_npz(const char *path, const ct_params *tensors, bool compress);
/* Reads every member of path, in the archive's order, into a new list
 * (caller frees) named as numpy.load names them ("x.npy" is "x"); each
 * member as ct_load_npy reads a file. Refuses (CT_ERR_FORMAT) a file that is
 * not a zip archive, a member whose name does not end in ".npy" or is not
 * valid UTF-8, two members of one name, encryption, compression other than stored or deflated, sizes
 * the file cannot hold, and a member whose CRC does not match. */
ct_params *ct_load_npz(const char *path);

/* ---- data loader -------------------------------------------------------------------------
 * Minibatches over (inputs [N, ...], targets [N, ...]) as torch's DataLoader
 * over a TensorDataset: each epoch visits every sample once, in a fresh
 * random permutation when shuffling (Fisher-Yates driven by the loader's own
 * Philox generator, so the order depends on the seed alone), else in order.
 *
 *     ct_dataloader *dl = ct_dataloader_new(images, labels, 64, true, false, seed);
 *     for (int epoch = 0; epoch < epochs; epoch++) {
 *         ct_tensor *x, *y;
 *         while (ct_dataloader_next(dl, &x, &y)) { ... }   // x: [64, ...], y: [64, ...]
 *         if (ct_dataloader_status(dl) != CT_OK) ...       // failed, not at the end
 *         ct_dataloader_reset(dl);                         // the next epoch
 *     }
 */
typedef struct ct_dataloader ct_dataloader;

/* inputs and targets (targets may be NULL) are CPU tensors with the same
 * size N >= 0 of dim 0; the loader keeps references to them (contiguous
 * copies when they are not contiguous). batch_size >= 1. drop_last drops the
 * last batch of an epoch when it would be smaller than batch_size. The first
 * epoch (epoch 0) starts at once. */
ct_dataloader *ct_dataloader_new(ct_tensor *inputs, ct_tensor *targets, int64_t batch_size,
                                 bool shuffle, bool drop_last, uint64_t seed);
void ct_dataloader_free(ct_dataloader *dl); /* NULL is a no-op */
/* The next batch of this epoch: *x gets new CPU tensors [B, ...] gathered
 * from inputs (copies, registered in the open scope) and *y those of targets
 * (NULL when the loader has none). Returns false with *x = *y = NULL at the
 * epoch's end (and on every call after it, until ct_dataloader_reset) or on
 * failure; ct_dataloader_status tells which (CT_OK at the end). */
bool ct_dataloader_next(ct_dataloader *dl, ct_tensor **x, ct_tensor **y);
/* CT_OK, or the status of the last failed ct_dataloader_next. */
ct_status ct_dataloader_status(const ct_dataloader *dl);
/* Starts the next epoch (drawing its permutation when shuffling), whether or
 * not the current one was finished. */
ct_status ct_dataloader_reset(ct_dataloader *dl);
/* Makes the loader hand out only rank's share of each epoch, as torch's
 * DistributedSampler (with its drop_last False) under a DataLoader: every
 * rank's loader, built with the same data and seed, draws the same epoch
 * order (the permutation, or 0..N-1 without shuffling), extended by
 * repeating its start to a multiple of world, and takes the samples at
 * positions rank, rank + world, rank + 2 world, ...: ceil(N / world) per
 * epoch, in batches of batch_size (drop_last applies to them). A new seed
 * per epoch is the loader's own (ct_dataloader_reset), so shards change
 * every epoch and never overlap within one. 0 <= rank < world; only before
 * the epoch's first batch. world 1 undoes it. */
ct_status ct_dataloader_shard(ct_dataloader *dl, int64_t rank, int64_t world);
/* Batches per epoch (with drop_last and the shard accounted for) and
 * samples N of the whole data set. */
int64_t ct_dataloader_num_batches(const ct_dataloader *dl);
int64_t ct_dataloader_num_samples(const ct_dataloader *dl);

/* Where a loader stands, for checkpoints: restoring it into a loader over
 * the same data makes the following batches those the saved one would have
 * given. */
typedef struct ct_dataloader_state {
    int64_t epoch;       /* 0 for the first epoch */
    int64_t position;    /* samples of this epoch handed out so far */
    uint64_t seed;       /* the generator's key */
    uint64_t gen_offset; /* generator offset where this epoch's permutation was drawn */
} ct_dataloader_state;
ct_dataloader_state ct_dataloader_get_state(const ct_dataloader *dl);
/* Refuses a state that does not fit this loader (negative epoch, position
 * beyond N or not at a batch boundary). */
ct_status ct_dataloader_set_state(ct_dataloader *dl, const ct_dataloader_state *state);

/* ---- checkpoints ------------------------------------------------------------------------
 * One safetensors file with what a training run needs to go on: the model's
 * parameters under their names, the optimizer's state under
 * "optim.<k>.<what>" (the names of ct_optim_state_get), the data loader's
 * position, and the caller's metadata. The loop that writes one:
 *
 *     ct_metadata *m = ct_metadata_new();
 *     ct_metadata_set_int(m, "step", step);
 *     ct_checkpoint_save("run.safetensors", params, opt, loader, m);
 *
 * and the one that resumes:
 *
 *     ct_metadata *m;
 *     if (ct_checkpoint_load("run.safetensors", params, opt, loader, &m) == CT_OK)
 *         ct_metadata_get_int(m, "step", &step);
 *
 * Keys starting with "cten." are the checkpoint's own: "cten.checkpoint"
 * (the format, "1"), "cten.params" and "cten.optim.state" (tensor counts),
 * and "cten.loader.epoch", ".position", ".seed", ".gen_offset". */

/* Writes params, opt's state (opt may be NULL), loader's state (may be NULL)
 * and meta (may be NULL; no key may start with "cten.") to path, atomically
 * as ct_save_safetensors does. With opt, no parameter name may start with
 * "optim.". */
ct_status ct_checkpoint_save(const char *path, const ct_params *params, const ct_optimizer *opt,
                             const ct_dataloader *loader, const ct_metadata *meta);
/* Restores into params (and opt's state, and loader's position, when not
 * NULL) from a file ct_checkpoint_save wrote: every tensor must be there
 * with its shape and dtype, and with opt the file must hold nothing else
 * and the same number of state tensors (another optimizer or momentum
 * setting is refused); without opt, the file's optimizer state is ignored.
 * Nothing changes unless every check passes. *meta (when meta is not NULL)
 * receives the file's metadata, the caller's keys and the "cten." ones. */
ct_status ct_checkpoint_load(const char *path, ct_params *params, ct_optimizer *opt,
                             ct_dataloader *loader, ct_metadata **meta);

/* Typed metadata values, stored as decimal text (a double as %.17g, which
 * reads back exactly). The getters return CT_ERR_FORMAT naming the key when
 * it is missing or its value is not a whole number of the type (in range)
 * or a number. */
ct_status ct_metadata_set_int(ct_metadata *m, const char *key, int64_t v);
ct_status ct_metadata_set_uint(ct_metadata *m, const char *key, uint64_t v);
ct_status ct_metadata_set_double(ct_metadata *m, const char *key, double v);
ct_status ct_metadata_get_int(const ct_metadata *m, const char *key, int64_t *out);
ct_status ct_metadata_get_uint(const ct_metadata *m, const char *key, uint64_t *out);
ct_status ct_metadata_get_double(const ct_metadata *m, const char *key, double *out);

#ifdef __cplusplus
}
#endif
#endif
