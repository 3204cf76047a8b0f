/* Writes the seed corpora of the fuzz targets into DIR/<target>/: files
 * the library writes (safetensors checkpoints and .npy/.npz files of every
 * dtype, data loader states taken from live loaders), IDX files of every
 * element type, plain and gzip, laid out as the format specifies (cten
 * reads IDX but does not write it), and .npy files laid out as NumPy writes
 * the ones cten does not (big-endian, versions 2.0 and 3.0). Small on
 * purpose: libFuzzer mutates them. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "fuzz.h"

static const char *out_dir;

static void fail(const char *what) {
    fprintf(stderr, "make_seeds: %s: %s\n", what, ct_last_error());
    exit(1);
}

static const char *seed_path(const char *target, const char *name) {
    static char p[4096];
    snprintf(p, sizeof p, "%s/%s", out_dir, target);
    if (mkdir(p, 0777) != 0 && errno != EEXIST) {
        perror(p);
        exit(1);
    }
    snprintf(p, sizeof p, "%s/%s/%s", out_dir, target, name);
    return p;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* ---- safetensors ------------------------------------------------------------------------------- */

static void add(ct_params *ps, const char *name, ct_tensor *t) {
    if (!t || ct_params_add(ps, name, t) != CT_OK) fail(name);
    ct_tensor_release(t);
}

static void save(const char *name, ct_params *ps, ct_metadata *meta) {
    if (ct_save_safetensors(seed_path("safetensors", name), ps, meta) != CT_OK) fail(name);
    ct_params_free(ps);
    ct_metadata_free(meta);
}

static void safetensors_seeds(void) {
    static const ct_dtype all[] = {CT_BOOL, CT_I32, CT_I64, CT_F16, CT_BF16, CT_F32, CT_F64};
    save("empty.safetensors", ct_params_new(), NULL);

    ct_params *ps = ct_params_new();
    ct_metadata *meta = ct_metadata_new();
    ct_metadata_set(meta, "format", "pt");
    ct_metadata_set(meta, "note", "caf\xc3\xa9 \"quoted\"\n");
    char name[64];
    for (size_t d = 0; d < sizeof all / sizeof all[0]; d++) {
        snprintf(name, sizeof name, "w.%s", ct_dtype_name(all[d]));
        add(ps, name, ct_tensor_arange(0, 6, 1, all[d], CT_CPU));
    }
    save("dtypes.safetensors", ps, meta);

    ps = ct_params_new();
    add(ps, "scalar", ct_tensor_scalar(2.5, CT_F32, CT_CPU));
    add(ps, "empty", ct_tensor_zeros(CT_SHAPE(0, 3), CT_F16, CT_CPU));
    add(ps, "matrix", ct_tensor_eye(3, 2, CT_F64, CT_CPU));
    add(ps, "na\xc3\xafve/\\name", ct_tensor_ones(CT_SHAPE(1, 1, 2, 1), CT_BOOL, CT_CPU));
    save("shapes.safetensors", ps, NULL);

    ps = ct_params_new();
    meta = ct_metadata_new();
    for (int i = 0; i < 12; i++) {
        snprintf(name, sizeof name, "layers.%d.weight", i);
        add(ps, name, ct_tensor_full(CT_SHAPE(2, 2), i, CT_BF16, CT_CPU));
        snprintf(name, sizeof name, "k%d", i);
        ct_metadata_set(meta, name, "v");
    }
    save("layers.safetensors", ps, meta);
}

/* ---- IDX ------------------------------------------------------------------------------------- */

static void idx_seed(const char *tag, unsigned char type, int esize, int ndim,
                     const uint32_t *dims) {
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= dims[d];
    size_t n = 4 + 4 * (size_t)ndim + numel * (size_t)esize;
    unsigned char *b = calloc(n, 1);
    b[2] = type;
    b[3] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++)
        for (int k = 0; k < 4; k++) b[4 + 4 * d + k] = (unsigned char)(dims[d] >> (24 - 8 * k));
    unsigned char *data = b + 4 + 4 * ndim;
    for (size_t i = 0; i < numel * (size_t)esize; i++) data[i] = (unsigned char)(i * 37 + type);
    if (type == 0x0D || type == 0x0E) /* a finite leading byte: 0x3f.. and 0x40.. */
        for (size_t i = 0; i < numel; i++) data[i * (size_t)esize] = (unsigned char)(0x3f + (i & 1));
    char name[64];
    snprintf(name, sizeof name, "t%02x-%dd%s.idx", type, ndim, tag);
    write_file(seed_path("idx", name), b, n);
    snprintf(name, sizeof name, "t%02x-%dd%s.idx.gz", type, ndim, tag);
    gzFile g = gzopen(seed_path("idx", name), "wb9");
    if (!g || gzwrite(g, b, (unsigned)n) != (int)n || gzclose(g) != Z_OK) fail(name);
    free(b);
}

static void idx_seeds(void) {
    static const struct {
        unsigned char type;
        int size;
    } types[] = {{0x08, 1}, {0x09, 1}, {0x0B, 2}, {0x0C, 4}, {0x0D, 4}, {0x0E, 8}};
    static const uint32_t dims[3][3] = {{5, 0, 0}, {3, 4, 0}, {2, 3, 2}};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (int nd = 1; nd <= 3; nd++)
            idx_seed("", types[t].type, types[t].size, nd, dims[nd - 1]);
    idx_seed("", 0x08, 1, 0, NULL);
    uint32_t empty[2] = {0, 7};
    idx_seed("-empty", 0x0C, 4, 2, empty);
}

/* ---- NumPy .npy / .npz ------------------------------------------------------------------ */

static const ct_dtype ALL_DTYPES[] = {CT_BOOL, CT_I32, CT_I64, CT_F16, CT_BF16, CT_F32, CT_F64};
#define NUM_ALL (sizeof ALL_DTYPES / sizeof ALL_DTYPES[0])

/* A .npy file as NumPy writes the ones cten does not: version major.0,
 * header text dict, then n data bytes. */
static void raw_npy(const char *name, int major, const char *dict, const void *data, size_t n) {
    size_t hl = strlen(dict), pre = major == 1 ? 10 : 12;
    unsigned char *b = malloc(pre + hl + n);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    for (size_t k = 0; k < pre - 8; k++) b[8 + k] = (unsigned char)(hl >> (8 * k));
    memcpy(b + pre, dict, hl);
    memcpy(b + pre + hl, data, n);
    write_file(seed_path("npy", name), b, pre + hl + n);
    free(b);
}

static void npy_save(const char *name, ct_tensor *t) {
    if (!t || ct_save_npy(seed_path("npy", name), t) != CT_OK) fail(name);
    ct_tensor_release(t);
}

static void npy_seeds(void) {
    char name[64];
    for (size_t d = 0; d < NUM_ALL; d++) {
        const char *dn = ct_dtype_name(ALL_DTYPES[d]);
        ct_tensor *t = ct_tensor_arange(0, 6, 1, ALL_DTYPES[d] == CT_BOOL ? CT_I64 : ALL_DTYPES[d],
                                        CT_CPU);
        ct_tensor *m = ct_view(t, CT_SHAPE(2, 3));
        ct_tensor *c = ct_to_dtype(m, ALL_DTYPES[d]);
        snprintf(name, sizeof name, "%s-2x3.npy", dn);
        npy_save(name, ct_tensor_retain(c));
        snprintf(name, sizeof name, "%s-fortran.npy", dn);
        npy_save(name, ct_t(c));
        ct_tensor_release(c);
        ct_tensor_release(m);
        ct_tensor_release(t);
    }
    npy_save("scalar.npy", ct_tensor_scalar(2.5, CT_F64, CT_CPU));
    npy_save("empty.npy", ct_tensor_zeros(CT_SHAPE(0, 3), CT_F32, CT_CPU));
    npy_save("4d.npy", ct_tensor_ones(CT_SHAPE(1, 2, 1, 2), CT_I32, CT_CPU));
    static const unsigned char be8[16] = {0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0xc0, 0, 0, 0, 0, 0, 0, 0};
    raw_npy("big-endian-f8.npy", 1, "{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }\n",
            be8, 16);
    static const unsigned char be4[8] = {0xff, 0xff, 0xff, 0xfe, 0, 1, 0, 0};
    raw_npy("big-endian-i4.npy", 1, "{'descr': '>i4', 'fortran_order': True, 'shape': (1, 2), }\n",
            be4, 8);
    static const unsigned char f4[8] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
    raw_npy("v2-py2.npy", 2, "{\"shape\": (2L,), \"fortran_order\": False, \"descr\": \"<f4\"}\n", f4,
            8);
    raw_npy("v3-void.npy", 3, "{'descr': '|V2', 'fortran_order': False, 'shape': (2, 1), }", f4, 4);
}

static void npz_save(const char *name, ct_params *ps, bool compress) {
    if (ct_save_npz(seed_path("npz", name), ps, compress) != CT_OK) fail(name);
}

static void npz_seeds(void) {
    ct_params *ps = ct_params_new();
    npz_save("empty.npz", ps, false);
    char name[64];
    for (size_t d = 0; d < NUM_ALL; d++) {
        snprintf(name, sizeof name, "w.%s", ct_dtype_name(ALL_DTYPES[d]));
        ct_tensor *t = ct_tensor_ones(CT_SHAPE(2, 2), ALL_DTYPES[d], CT_CPU);
        if (!t || ct_params_add(ps, name, t) != CT_OK) fail(name);
        ct_tensor_release(t);
    }
    npz_save("dtypes.npz", ps, false);
    npz_save("dtypes-deflated.npz", ps, true);
    ct_params_free(ps);
    ps = ct_params_new();
    ct_tensor *s = ct_tensor_scalar(1, CT_F32, CT_CPU), *e = ct_tensor_zeros(CT_SHAPE(0), CT_I64, CT_CPU);
    ct_tensor *big = ct_tensor_zeros(CT_SHAPE(64, 64), CT_F32, CT_CPU), *bt = ct_t(big);
    if (ct_params_add(ps, "na\xc3\xafve/x", s) || ct_params_add(ps, "arr_0", e) ||
        ct_params_add(ps, "fortran", bt))
        fail("npz list");
    npz_save("names.npz", ps, false);
    npz_save("names-deflated.npz", ps, true);
    ct_tensor_release(s);
    ct_tensor_release(e);
    ct_tensor_release(bt);
    ct_tensor_release(big);
    ct_params_free(ps);
}

/* ---- data loader ------------------------------------------------------------------------------- */

typedef struct buf {
    unsigned char b[512];
    size_t n;
} buf;

static void put(buf *b, const void *p, size_t k) {
    memcpy(b->b + b->n, p, k);
    b->n += k;
}
static void put8(buf *b, unsigned char c) { put(b, &c, 1); }

/* A loader like the target builds, advanced by `batches` batches and
 * `epochs` resets; its state is what a checkpoint of it would hold. */
static ct_dataloader_state live_state(int64_t n, int width, int64_t batch, bool shuffle,
                                      bool drop_last, uint64_t seed, int epochs, int batches) {
    ct_tensor *x = width ? ct_tensor_zeros(CT_SHAPE(n, width), CT_F64, CT_CPU)
                         : ct_tensor_zeros(CT_SHAPE(n), CT_F64, CT_CPU);
    ct_dataloader *dl = ct_dataloader_new(x, NULL, batch, shuffle, drop_last, seed);
    if (!dl) fail("ct_dataloader_new");
    for (int e = 0; e < epochs; e++) ct_dataloader_reset(dl);
    for (int k = 0; k < batches; k++) {
        ct_tensor *bx;
        if (ct_dataloader_next(dl, &bx, NULL)) ct_tensor_release(bx);
    }
    ct_dataloader_state s = ct_dataloader_get_state(dl);
    ct_dataloader_free(dl);
    ct_tensor_release(x);
    return s;
}

static void loader_seed(const char *name, int64_t n, int width, int64_t batch, bool shuffle,
                        bool drop_last, bool targets, uint64_t seed, int epochs, int batches) {
    buf b = {.n = 0};
    put8(&b, (unsigned char)n);
    put8(&b, (unsigned char)(shuffle | drop_last << 1 | targets << 2 | width << 3));
    put(&b, &batch, 8);
    put(&b, &seed, 8);
    /* Run a while, restore the live loader's state, then check a replay. */
    for (int k = 0; k < 3; k++) put8(&b, 0);
    ct_dataloader_state s = live_state(n, width, batch, shuffle, drop_last, seed, epochs, batches);
    put8(&b, 2);
    put(&b, &s.epoch, 8);
    put(&b, &s.position, 8);
    put(&b, &s.seed, 8);
    put(&b, &s.gen_offset, 8);
    put8(&b, 0);
    put8(&b, 3);
    put8(&b, 1);
    put8(&b, 0);
    write_file(seed_path("dataloader", name), b.b, b.n);
}

static void dataloader_seeds(void) {
    loader_seed("shuffle.bin", 10, 3, 3, true, false, true, 42, 1, 2);
    loader_seed("ordered.bin", 7, 0, 2, false, false, true, 0, 0, 1);
    loader_seed("drop_last.bin", 9, 2, 4, true, true, false, 7, 2, 1);
    loader_seed("one_batch.bin", 63, 1, 64, true, false, true, 1, 0, 1);
    loader_seed("empty.bin", 0, 2, 1, true, false, true, 3, 0, 0);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        perror(out_dir);
        return 1;
    }
    ct_scope *sc = ct_scope_begin();
    safetensors_seeds();
    idx_seeds();
    npy_seeds();
    npz_seeds();
    dataloader_seeds();
    ct_scope_end(sc);
    return 0;
}
