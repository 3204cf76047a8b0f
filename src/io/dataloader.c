/* Minibatches over in-memory tensors: a per-epoch Fisher-Yates permutation
 * drawn from the loader's own Philox stream, rows gathered by memcpy. */
#include <stdlib.h>

#include "io_impl.h"

struct ct_dataloader {
    ct_tensor *inputs, *targets; /* contiguous CPU, owned references; targets may be NULL */
    int64_t n, batch, nbatches, limit; /* limit: samples handed out per epoch */
    int64_t rank, world;               /* the shard (ct_dataloader_shard); world 1: all */
    bool shuffle, drop_last;
    ct_generator gen;
    int64_t epoch, position;
    uint64_t epoch_offset; /* gen.offset where this epoch's permutation was drawn */
    int64_t *perm;         /* NULL when not shuffling */
    ct_status status;
};

/* Sequential 32-bit draws of a Philox stream from a given offset, one block
 * computed per four draws. */
typedef struct draws {
    uint64_t seed, next;
    uint32_t block[4];
    uint64_t block_index;
    bool have;
} draws;

static uint32_t draw(draws *d) {
    uint64_t bi = d->next >> 2;
    if (!d->have || bi != d->block_index) {
        cti_philox_block(d->seed, bi, d->block);
        d->block_index = bi;
        d->have = true;
    }
    return d->block[d->next++ & 3];
}

/* The permutation of the epoch starting now: identity shuffled by
 * Fisher-Yates with j uniform in [0, i] from 64 random bits (Lemire's
 * multiply-shift; bias below 2^-32 for any N that fits in memory). Always
 * takes 2 (N - 1) draws, so the offset after it depends on N alone. */
static void draw_permutation(ct_dataloader *dl) {
    dl->epoch_offset = ct_generator_offset(&dl->gen);
    for (int64_t i = 0; i < dl->n; i++) dl->perm[i] = i;
    if (dl->n < 2) return;
    draws d = {.seed = dl->gen.seed,
               .next = ct_generator_reserve(&dl->gen, 2 * (uint64_t)(dl->n - 1))};
    for (int64_t i = dl->n - 1; i > 0; i--) {
        uint64_t r = (uint64_t)draw(&d) << 32;
        r |= draw(&d);
        int64_t j = (int64_t)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
        int64_t t = dl->perm[i];
        dl->perm[i] = dl->perm[j];
        dl->perm[j] = t;
    }
}

/* Batches and samples per epoch of this loader's shard. */
static void set_sizes(ct_dataloader *dl) {
    /* n / world and m / b rounded up without n + b - 1, which overflows for
     * a batch size near INT64_MAX. */
    int64_t m = dl->n / dl->world + (dl->n % dl->world != 0);
    dl->nbatches = m / dl->batch + (!dl->drop_last && m % dl->batch != 0);
    dl->limit = dl->drop_last ? dl->nbatches * dl->batch : m;
}

/* The sample handed out k-th in this epoch: in the shard, position
 * rank + k world of the epoch's order extended by repeating its start. */
static int64_t sample_at(const ct_dataloader *dl, int64_t k) {
    int64_t q = dl->world > 1 ? (dl->rank + k * dl->world) % dl->n : k;
    return dl->perm ? dl->perm[q] : q;
}

/* A reference the loader owns outside any scope: t itself when contiguous,
 * else a contiguous copy. */
static ct_tensor *own_contiguous(ct_tensor *t) {
    if (cti_is_contiguous(t)) return cti_ref(t);
    ct_tensor *c = ct_contiguous(t);
    if (c) cti_scope_forget(c);
    return c;
}

static ct_status check_source(const char *op, const char *what, const ct_tensor *t) {
    if (t->storage->device.type != CT_DEVICE_CPU)
        return cti_error(CT_ERR_DEVICE, "%s: %s %s must be on the CPU (move batches instead)", op,
                         what, cti_desc(t));
    if (t->ndim < 1)
        return cti_error(CT_ERR_SHAPE, "%s: %s %s needs a sample dim 0", op, what, cti_desc(t));
    return CT_OK;
}

ct_dataloader *ct_dataloader_new(ct_tensor *inputs, ct_tensor *targets, int64_t batch_size,
                                 bool shuffle, bool drop_last, uint64_t seed) {
    static const char op[] = "ct_dataloader_new";
    if (!inputs) return cti_error_null(CT_ERR_INVALID_ARG, "%s: inputs is NULL", op);
    if (check_source(op, "inputs", inputs) || (targets && check_source(op, "targets", targets)))
        return NULL;
    if (targets && targets->shape[0] != inputs->shape[0])
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: inputs %s and targets %s hold different numbers of samples "
                              "(%lld != %lld)",
                              op, cti_desc(inputs), cti_desc(targets),
                              (long long)inputs->shape[0], (long long)targets->shape[0]);
    if (batch_size < 1)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: batch_size %lld must be >= 1", op,
                              (long long)batch_size);
    ct_dataloader *dl = calloc(1, sizeof *dl);
    if (!dl) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    dl->n = inputs->shape[0];
    dl->batch = batch_size;
    dl->shuffle = shuffle;
    dl->drop_last = drop_last;
    dl->world = 1;
    set_sizes(dl);
    dl->gen.seed = seed;
    dl->gen.offset = 0;
    bool ok = (dl->inputs = own_contiguous(inputs)) != NULL;
    if (ok && targets) ok = (dl->targets = own_contiguous(targets)) != NULL;
    if (ok && shuffle) {
        dl->perm = malloc((size_t)(dl->n > 0 ? dl->n : 1) * sizeof *dl->perm);
        if (!dl->perm) {
            cti_error(CT_ERR_OOM, "%s: out of memory for a permutation of %lld", op,
                      (long long)dl->n);
            ok = false;
        }
    }
    if (!ok) {
        ct_dataloader_free(dl);
        return NULL;
    }
    if (shuffle) draw_permutation(dl);
    return dl;
}

void ct_dataloader_free(ct_dataloader *dl) {
    if (!dl) return;
    cti_unref(dl->inputs);
    cti_unref(dl->targets);
    free(dl->perm);
    free(dl);
}

/* Rows perm[pos..pos+b) (or pos..pos+b in order) of src into a new tensor. */
static ct_tensor *gather(const ct_dataloader *dl, const ct_tensor *src, int64_t b) {
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[0] = b;
    ct_tensor *out = cti_tensor_new("ct_dataloader_next", src->ndim, shape, src->dtype, CT_CPU);
    if (!out) return NULL;
    size_t row = (size_t)cti_numel(src->ndim - 1, src->shape + 1) * ct_dtype_size(src->dtype);
    if (row == 0 || b == 0) return out;
    const char *s = cti_data(src);
    char *d = cti_data(out);
    if (!dl->perm && dl->world == 1) {
        memcpy(d, s + (size_t)dl->position * row, (size_t)b * row);
    } else {
        for (int64_t k = 0; k < b; k++)
            memcpy(d + (size_t)k * row, s + (size_t)sample_at(dl, dl->position + k) * row, row);
    }
    return out;
}

bool ct_dataloader_next(ct_dataloader *dl, ct_tensor **x, ct_tensor **y) {
    if (x) *x = NULL;
    if (y) *y = NULL;
    if (!dl || !x) {
        ct_status st = cti_error(CT_ERR_INVALID_ARG, "ct_dataloader_next: %s is NULL",
                                 dl ? "x" : "the loader");
        if (dl) dl->status = st;
        return false;
    }
    dl->status = CT_OK;
    if (dl->position >= dl->limit) return false;
    int64_t b = dl->limit - dl->position < dl->batch ? dl->limit - dl->position : dl->batch;
    ct_tensor *bx = gather(dl, dl->inputs, b), *by = NULL;
    if (bx && dl->targets && !(by = gather(dl, dl->targets, b))) {
        ct_tensor_release(bx);
        bx = NULL;
    }
    if (!bx) {
        dl->status = ct_last_status();
        return false;
    }
    dl->position += b;
    *x = bx;
    if (y) *y = by;
    else ct_tensor_release(by);
    return true;
}

ct_status ct_dataloader_status(const ct_dataloader *dl) {
    return dl ? dl->status : CT_ERR_INVALID_ARG;
}

ct_status ct_dataloader_reset(ct_dataloader *dl) {
    if (!dl) return cti_error(CT_ERR_INVALID_ARG, "ct_dataloader_reset: the loader is NULL");
    if (dl->epoch == INT64_MAX)
        return cti_error(CT_ERR_OVERFLOW,
                         "ct_dataloader_reset: epoch %lld is the last an int64 counts; restore "
                         "a smaller epoch with ct_dataloader_set_state",
                         (long long)dl->epoch);
    dl->epoch++;
    dl->position = 0;
    dl->status = CT_OK;
    if (dl->shuffle) draw_permutation(dl);
    return CT_OK;
}

ct_status ct_dataloader_shard(ct_dataloader *dl, int64_t rank, int64_t world) {
    static const char op[] = "ct_dataloader_shard";
    if (!dl) return cti_error(CT_ERR_INVALID_ARG, "%s: the loader is NULL", op);
    if (world < 1 || rank < 0 || rank >= world)
        return cti_error(CT_ERR_INVALID_ARG, "%s: rank %lld of world %lld; expected 0 <= rank < "
                         "world", op, (long long)rank, (long long)world);
    if (dl->position != 0)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: the epoch under way has handed out %lld samples; shard before its "
                         "first batch",
                         op, (long long)dl->position);
    dl->rank = rank;
    dl->world = world;
    set_sizes(dl);
    return CT_OK;
}

int64_t ct_dataloader_num_batches(const ct_dataloader *dl) { return dl ? dl->nbatches : 0; }
int64_t ct_dataloader_num_samples(const ct_dataloader *dl) { return dl ? dl->n : 0; }

ct_dataloader_state ct_dataloader_get_state(const ct_dataloader *dl) {
    ct_dataloader_state s = {0, 0, 0, 0};
    if (!dl) return s;
    s.epoch = dl->epoch;
    s.position = dl->position;
    s.seed = dl->gen.seed;
    s.gen_offset = dl->shuffle ? dl->epoch_offset : ct_generator_offset(&dl->gen);
    return s;
}

ct_status ct_dataloader_set_state(ct_dataloader *dl, const ct_dataloader_state *state) {
    static const char op[] = "ct_dataloader_set_state";
    if (!dl || !state) return cti_error(CT_ERR_INVALID_ARG, "%s: %s is NULL", op,
                                        dl ? "state" : "the loader");
    if (state->epoch < 0)
        return cti_error(CT_ERR_INVALID_ARG, "%s: epoch %lld is negative", op,
                         (long long)state->epoch);
    if (state->position < 0 || state->position > dl->limit ||
        (state->position % dl->batch != 0 && state->position != dl->limit))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: position %lld does not fit a loader of %lld samples in batches of "
                         "%lld (handing out %lld per epoch)",
                         op, (long long)state->position, (long long)dl->n, (long long)dl->batch,
                         (long long)dl->limit);
    dl->epoch = state->epoch;
    dl->position = state->position;
    dl->status = CT_OK;
    dl->gen.seed = state->seed;
    dl->gen.offset = state->gen_offset;
    if (dl->shuffle) draw_permutation(dl);
    return CT_OK;
}
