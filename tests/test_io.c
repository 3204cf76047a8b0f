/* IDX reading (plain and gzip, every element type, every class of damage),
 * safetensors save/load (round trips of every dtype, restoring into
 * existing tensors, a catalogue of malformed headers, random corruption),
 * and the data loader (coverage per epoch, seeding, drop_last, resume). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zlib.h>

#include "test_util.h"

#include "core/tensor_impl.h"
#include "io/io_impl.h"

/* ---- fixtures: every test must leave no tensor or storage alive ---------------------------- */

static cti_alloc_stats start_stats;
static char tmpdir[64];

static int setup(void **state) {
    (void)state;
    ct_clear_error();
    start_stats = cti_get_alloc_stats();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cti_alloc_stats s = cti_get_alloc_stats();
    if (s.live_tensors != start_stats.live_tensors ||
        s.live_storages != start_stats.live_storages || s.live_bytes != start_stats.live_bytes) {
        fprintf(stderr, "leak: tensors %lld -> %lld, storages %lld -> %lld, bytes %lld -> %lld\n",
                (long long)start_stats.live_tensors, (long long)s.live_tensors,
                (long long)start_stats.live_storages, (long long)s.live_storages,
                (long long)start_stats.live_bytes, (long long)s.live_bytes);
        return -1;
    }
    return 0;
}

/* ---- files ------------------------------------------------------------------------------------- */

static const char *tpath(const char *name) {
    static char buf[8][256];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    /* A fresh file rather than a truncated one: ext4 flushes a file that is
     * truncated and rewritten when it is closed, which made this slow. */
    unlink(path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void write_gz(const char *path, const void *data, size_t n) {
    unlink(path);
    gzFile g = gzopen(path, "wb6");
    assert_non_null(g);
    if (n) assert_int_equal(gzwrite(g, data, (unsigned)n), (int)n);
    assert_int_equal(gzclose(g), Z_OK);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Whether tmpdir holds a leftover temporary file of a save. */
static bool temp_files_left(void) {
    DIR *d = opendir(tmpdir);
    assert_non_null(d);
    bool found = false;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp-")) found = true;
    closedir(d);
    return found;
}

/* ---- IDX files --------------------------------------------------------------------------------- */

typedef struct idx_kind {
    unsigned char code;
    int size;
    bool floating;
    double lo, hi;
} idx_kind;

static const idx_kind IDX_KINDS[] = {
    {0x08, 1, false, 0, 256},           {0x09, 1, false, -128, 128},
    {0x0B, 2, false, -32768, 32768},    {0x0C, 4, false, -2147483648.0, 2147483648.0},
    {0x0D, 4, true, -1e6, 1e6},         {0x0E, 8, true, -1e12, 1e12},
};

static void put_be(unsigned char *o, uint64_t v, int size) {
    for (int k = 0; k < size; k++) o[k] = (unsigned char)(v >> (8 * (size - 1 - k)));
}

/* An IDX image: magic, dims, then vals encoded big-endian as kind. */
static unsigned char *idx_image(const idx_kind *kind, int ndim, const uint32_t *dims,
                                const double *vals, int64_t n, size_t *len) {
    size_t total = 4 + 4 * (size_t)ndim + (size_t)n * (size_t)kind->size;
    unsigned char *b = malloc(total + 1);
    b[0] = 0;
    b[1] = 0;
    b[2] = kind->code;
    b[3] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++) put_be(b + 4 + 4 * d, dims[d], 4);
    unsigned char *o = b + 4 + 4 * ndim;
    for (int64_t i = 0; i < n; i++) {
        uint64_t bits;
        if (kind->code == 0x0D) {
            float f = (float)vals[i];
            uint32_t u;
            memcpy(&u, &f, 4);
            bits = u;
        } else if (kind->code == 0x0E) {
            memcpy(&bits, &vals[i], 8);
        } else {
            bits = (uint64_t)(int64_t)vals[i];
        }
        put_be(o + (size_t)i * (size_t)kind->size, bits, kind->size);
    }
    *len = total;
    return b;
}

/* Random values of kind (whole numbers for integer kinds, f32-exact for 0x0D). */
static double *idx_values(const idx_kind *kind, int64_t n) {
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) {
        if (kind->floating) v[i] = tu_uniform(kind->lo, kind->hi);
        else v[i] = (double)tu_randint((int64_t)kind->lo, (int64_t)kind->hi);
        if (kind->code == 0x0D) v[i] = (double)(float)v[i];
    }
    return v;
}

static void assert_shape(const ct_tensor *t, int nd, const int64_t *shape) {
    assert_non_null(t);
    assert_int_equal(ct_tensor_ndim(t), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(t)[d], shape[d]);
}

/* Loads path as dtype and compares with vals (rounded as dtype holds them). */
static void check_idx_load(const char *path, ct_dtype dt, int ndim, const int64_t *shape,
                           const double *vals) {
    ct_tensor *t = ct_idx_load(path, dt);
    if (!t) fprintf(stderr, "ct_idx_load: %s\n", ct_last_error());
    assert_shape(t, ndim, shape);
    assert_int_equal(ct_tensor_dtype(t), dt);
    int64_t n = ct_tensor_numel(t);
    double *got = tu_values(t);
    double *ref = malloc((size_t)(n > 0 ? n : 1) * sizeof *ref);
    for (int64_t i = 0; i < n; i++) ref[i] = tu_round(vals[i], dt);
    tu_assert_close(got, ref, n, 0, 0);
    free(got);
    free(ref);
    ct_tensor_release(t);
}

static void test_idx_valid(void **state) {
    (void)state;
    /* MNIST-like images and labels, plain and gzip, into every dtype. */
    const idx_kind *u8 = &IDX_KINDS[0];
    uint32_t dims[3] = {(uint32_t)tu_randint(1, 9), 28, 28};
    int64_t shape[3] = {dims[0], 28, 28};
    int64_t n = shape[0] * 28 * 28;
    double *vals = idx_values(u8, n);
    size_t len;
    unsigned char *img = idx_image(u8, 3, dims, vals, n, &len);
    write_bytes(tpath("img.idx"), img, len);
    write_gz(tpath("img.idx.gz"), img, len);
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        check_idx_load(tpath("img.idx"), tu_all_dtypes[k], 3, shape, vals);
        check_idx_load(tpath("img.idx.gz"), tu_all_dtypes[k], 3, shape, vals);
    }
    free(img);
    free(vals);

    /* Every element type and rank 0..4, with a size-0 dim now and then. */
    for (size_t k = 0; k < sizeof IDX_KINDS / sizeof IDX_KINDS[0]; k++) {
        const idx_kind *kind = &IDX_KINDS[k];
        for (int nd = 0; nd <= 4; nd++) {
            uint32_t d32[4];
            int64_t d64[4];
            int64_t cnt = 1;
            for (int d = 0; d < nd; d++) {
                d64[d] = d32[d] = (uint32_t)tu_randint(nd == 4 && d == 2 ? 0 : 1, 6);
                cnt *= d64[d];
            }
            double *v = idx_values(kind, cnt);
            unsigned char *b = idx_image(kind, nd, d32, v, cnt, &len);
            const char *p = tpath(k & 1 ? "t.idx.gz" : "t.idx");
            if (k & 1) write_gz(p, b, len);
            else write_bytes(p, b, len);
            check_idx_load(p, CT_F64, nd, d64, v);
            if (!kind->floating) check_idx_load(p, CT_I64, nd, d64, v);
            else
                tu_assert_null_error(ct_idx_load(p, CT_I64), CT_ERR_DTYPE, "ct_idx_load",
                                     "truncate", p);
            free(b);
            free(v);
        }
    }
}

/* Loads path expecting failure with status and words. */
#define assert_idx_error(path, status, ...)                                                 \
    do {                                                                                    \
        ct_tensor *t_ = ct_idx_load((path), CT_F32);                                        \
        tu_assert_null_error(t_, (status), "ct_idx_load", __VA_ARGS__);                     \
    } while (0)

static void test_idx_errors(void **state) {
    (void)state;
    const idx_kind *u8 = &IDX_KINDS[0];
    uint32_t dims[2] = {50, 20};
    double *vals = idx_values(u8, 1000);
    size_t len;
    unsigned char *img = idx_image(u8, 2, dims, vals, 1000, &len);
    free(vals);

    assert_idx_error(tpath("missing.idx"), CT_ERR_IO, "cannot open", "missing.idx",
                     "No such file");
    assert_idx_error(tmpdir, CT_ERR_IO, "not a regular file");
    tu_assert_null_error(ct_idx_load(NULL, CT_F32), CT_ERR_INVALID_ARG, "NULL");

    /* Plain files: cut in the data, in the header, in the magic; extra bytes. */
    const char *p = tpath("bad.idx");
    write_bytes(p, img, len - 1);
    assert_idx_error(p, CT_ERR_FORMAT, "truncated", "bad.idx", "1000", "999");
    write_bytes(p, img, 6);
    assert_idx_error(p, CT_ERR_FORMAT, "truncated", "dimension sizes");
    write_bytes(p, img, 2);
    assert_idx_error(p, CT_ERR_FORMAT, "truncated", "magic");
    write_bytes(p, img, 0);
    assert_idx_error(p, CT_ERR_FORMAT, "truncated");
    unsigned char *longer = malloc(len + 3);
    memcpy(longer, img, len);
    memset(longer + len, 7, 3);
    write_bytes(p, longer, len + 3);
    assert_idx_error(p, CT_ERR_FORMAT, "3 trailing bytes");

    /* The same through gzip: damage inside the compressed content. */
    const char *g = tpath("bad.idx.gz");
    write_gz(g, img, len - 10);
    assert_idx_error(g, CT_ERR_FORMAT, "truncated", "bad.idx.gz");
    write_gz(g, longer, len + 3);
    assert_idx_error(g, CT_ERR_FORMAT, "trailing");
    free(longer);

    /* A gzip file cut short, its CRC wrong, its first block invalid. */
    write_gz(g, img, len);
    size_t glen;
    unsigned char *gz = read_bytes(g, &glen);
    write_bytes(g, gz, glen / 2);
    assert_idx_error(g, CT_ERR_FORMAT, "truncated");
    write_bytes(g, gz, glen - 4);
    assert_idx_error(g, CT_ERR_FORMAT, "truncated");
    gz[glen - 8] ^= 0x55; /* CRC-32 of the trailer */
    write_bytes(g, gz, glen);
    assert_idx_error(g, CT_ERR_FORMAT, "gzip", "corrupt");
    gz[glen - 8] ^= 0x55;
    gz[10] = 0x07; /* BFINAL=1, BTYPE=11: a reserved block type */
    write_bytes(g, gz, glen);
    assert_idx_error(g, CT_ERR_FORMAT, "gzip", "corrupt");
    free(gz);

    /* Header content. */
    unsigned char hdr[128] = {0};
    memcpy(hdr, img, 12);
    hdr[0] = 0x1F; /* not IDX */
    write_bytes(p, hdr, 12);
    assert_idx_error(p, CT_ERR_FORMAT, "wrong magic", "1f 00 08 02");
    hdr[0] = 0;
    hdr[2] = 0x0A;
    write_bytes(p, hdr, 12);
    assert_idx_error(p, CT_ERR_FORMAT, "unsupported element type 0x0a");
    hdr[2] = 0x08;
    hdr[3] = 9;
    memset(hdr + 4, 0, 36);
    write_bytes(p, hdr, 40);
    assert_idx_error(p, CT_ERR_FORMAT, "9 dims");

    /* Huge dims: an overflowing count, and counts the file cannot hold
     * (nothing of that size may be allocated: ASan would say so). */
    hdr[2] = 0x0E;
    hdr[3] = 3;
    memset(hdr + 4, 0xFF, 12);
    write_bytes(p, hdr, 16 + 8);
    assert_idx_error(p, CT_ERR_FORMAT, "overflow");
    write_gz(g, hdr, 16 + 8);
    assert_idx_error(g, CT_ERR_FORMAT, "overflow");
    hdr[3] = 2;
    memset(hdr + 4, 0, 8);
    hdr[5] = 1; /* 65536 x 65536 float64 = 32 GiB */
    hdr[9] = 1;
    write_bytes(p, hdr, 12 + 64);
    assert_idx_error(p, CT_ERR_FORMAT, "truncated", "[65536, 65536]");
    write_gz(g, hdr, 12 + 64);
    assert_idx_error(g, CT_ERR_FORMAT, "truncated", "gzip file");
    free(img);
}

/* ---- safetensors --------------------------------------------------------------------------------- */

static ct_params *random_params(int64_t *count) {
    ct_params *ps = ct_params_new();
    assert_non_null(ps);
    int64_t k = 0;
    char name[64];
    static const int64_t shapes[][3] = {{2, 3, 4}, {5, 0, 0}, {7, 0, 0}, {0, 0, 0}, {3, 0, 0}};
    static const int ndims[] = {3, 1, 1, 0, 2};
    for (size_t d = 0; d < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; d++) {
        ct_dtype dt = tu_all_dtypes[d];
        for (size_t s = 0; s < sizeof ndims / sizeof ndims[0]; s++) {
            ct_tensor *t = tu_rand(ndims[s], shapes[s], dt, -50, 50, NULL);
            if (s == 0) { /* non-contiguous source */
                ct_tensor *nc = tu_noncontig(t);
                ct_tensor_release(t);
                t = nc;
                assert_false(ct_tensor_is_contiguous(t));
            }
            snprintf(name, sizeof name, "layer%zu.%s.w%zu", s, ct_dtype_name(dt), d);
            assert_int_equal(ct_params_add(ps, name, t), CT_OK);
            ct_tensor_release(t);
            k++;
        }
    }
    /* Names that need escaping and non-ASCII text. */
    ct_tensor *t = tu_rand(CT_SHAPE(2), CT_F32, -1, 1, NULL);
    assert_int_equal(ct_params_add(ps, "we\"ird\\na\nme \xc3\xa9\xf0\x9f\x98\x80", t), CT_OK);
    ct_tensor_release(t);
    k++;
    *count = k;
    return ps;
}

static void assert_same_tensor(const ct_tensor *a, const ct_tensor *b) {
    assert_int_equal(ct_tensor_dtype(a), ct_tensor_dtype(b));
    assert_shape(b, ct_tensor_ndim(a), ct_tensor_shape(a));
    int64_t n = ct_tensor_numel(a);
    double *va = tu_values(a), *vb = tu_values(b);
    tu_assert_close(vb, va, n, 0, 0);
    free(va);
    free(vb);
}

static void test_st_roundtrip(void **state) {
    (void)state;
    int64_t n;
    ct_params *ps = random_params(&n);
    ct_metadata *meta = ct_metadata_new();
    assert_int_equal(ct_metadata_set(meta, "format", "pt"), CT_OK);
    assert_int_equal(ct_metadata_set(meta, "epoch", "3"), CT_OK);
    assert_int_equal(ct_metadata_set(meta, "note", "quote \" backslash \\ tab\t \xc3\xbc"), CT_OK);
    assert_int_equal(ct_metadata_set(meta, "epoch", "4"), CT_OK); /* replaces */
    assert_int_equal(ct_metadata_count(meta), 3);
    const char *path = tpath("rt.safetensors");
    write_bytes(path, "old", 3); /* replaced atomically */
    assert_int_equal(ct_save_safetensors(path, ps, meta), CT_OK);
    assert_false(temp_files_left());

    /* The layout: an 8-byte length, a space-padded header ending 8-aligned. */
    size_t flen;
    unsigned char *raw = read_bytes(path, &flen);
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = hlen << 8 | raw[k];
    assert_true(hlen + 8 <= flen);
    assert_int_equal((8 + hlen) % 8, 0);
    assert_int_equal(raw[8], '{');
    free(raw);

    ct_metadata *got_meta = NULL;
    ct_params *got = ct_load_safetensors(path, &got_meta);
    if (!got) fprintf(stderr, "%s\n", ct_last_error());
    assert_non_null(got);
    assert_int_equal(ct_params_count(got), n);
    for (int64_t i = 0; i < n; i++) {
        const char *na, *nb;
        ct_tensor *a = ct_params_get(ps, i, &na), *b = ct_params_get(got, i, &nb);
        assert_string_equal(na, nb);
        assert_true(ct_tensor_is_contiguous(b));
        assert_int_equal(ct_tensor_device(b).type, CT_DEVICE_CPU);
        assert_same_tensor(a, b);
    }
    assert_non_null(got_meta);
    assert_int_equal(ct_metadata_count(got_meta), 3);
    assert_string_equal(ct_metadata_get(got_meta, "epoch"), "4");
    assert_string_equal(ct_metadata_get(got_meta, "note"), "quote \" backslash \\ tab\t \xc3\xbc");
    const char *v;
    assert_string_equal(ct_metadata_at(got_meta, 0, &v), "format");
    assert_string_equal(v, "pt");
    assert_null(ct_metadata_get(got_meta, "absent"));
    tu_assert_null_error(ct_metadata_at(got_meta, 3, NULL), CT_ERR_INDEX, "out of range");
    ct_metadata_free(got_meta);
    ct_params_free(got);

    /* No metadata, an empty list, and loading without asking for metadata. */
    assert_int_equal(ct_save_safetensors(path, ps, NULL), CT_OK);
    got = ct_load_safetensors(path, &got_meta);
    assert_non_null(got);
    assert_int_equal(ct_metadata_count(got_meta), 0);
    ct_metadata_free(got_meta);
    ct_params_free(got);
    ct_params *empty = ct_params_new();
    assert_int_equal(ct_save_safetensors(path, empty, meta), CT_OK);
    got = ct_load_safetensors(path, NULL);
    assert_non_null(got);
    assert_int_equal(ct_params_count(got), 0);
    ct_params_free(got);
    ct_params_free(empty);

    /* Inside a scope the loaded tensors stay the list's. */
    assert_int_equal(ct_save_safetensors(path, ps, NULL), CT_OK);
    ct_scope *s = ct_scope_begin();
    got = ct_load_safetensors(path, NULL);
    ct_scope_end(s);
    assert_non_null(got);
    assert_same_tensor(ct_params_get(ps, 0, NULL), ct_params_get(got, 0, NULL));
    ct_params_free(got);
    ct_metadata_free(meta);
    ct_params_free(ps);
}

/* A small list to save. */
static ct_params *one_tensor_list(void) {
    ct_params *ps = ct_params_new();
    ct_tensor *t = ct_tensor_arange(0, 4, 1, CT_F32, CT_CPU);
    assert_int_equal(ct_params_add(ps, "w", t), CT_OK);
    ct_tensor_release(t);
    return ps;
}

static void touch(const char *path) { write_bytes(path, "x", 1); }

/* A save killed mid-write leaves "<path>.tmp-<pid>.<host>.<random>"
 * behind. The next save, or load, of that path removes it once its writer
 * is gone, and leaves alone what a live writer may still be filling, what
 * another host wrote, another path's temporaries and names it did not
 * make. */
static void test_st_stale_temporaries(void **state) {
    (void)state;
    pid_t dead = fork();
    assert_true(dead >= 0);
    if (dead == 0) _exit(0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    unsigned host = cti_tmp_host_hash();
    const char *path = tpath("ckpt.safetensors");
    char stale[320], live[320], self[320], locked[320], far[320], other[320], odd[320], dir[320];
    snprintf(stale, sizeof stale, "%s.tmp-%ld.%08x.AbC123", path, (long)dead, host);
    snprintf(live, sizeof live, "%s.tmp-%ld.%08x.AbC123", path, (long)getppid(), host);
    snprintf(self, sizeof self, "%s.tmp-%ld.%08x.AbC123", path, (long)getpid(), host);
    snprintf(locked, sizeof locked, "%s.tmp-%ld.%08x.zzzzzz", path, (long)dead, host);
    snprintf(far, sizeof far, "%s.tmp-%ld.%08x.AbC123", path, (long)dead, host ^ 1u);
    snprintf(other, sizeof other, "%s2.tmp-%ld.%08x.AbC123", path, (long)dead, host);
    snprintf(odd, sizeof odd, "%s.tmp-%ldx.%08x.AbC123", path, (long)dead, host);
    snprintf(dir, sizeof dir, "%s.tmp-%ld.%08x.dirdir", path, (long)dead, host);
    const char *kept[] = {live, self, locked, far, other, odd};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) touch(kept[i]);
    assert_int_equal(mkdir(dir, 0700), 0);
    /* Held by a writer that looks dead from here (another pid namespace). */
    int lfd = open(locked, O_RDONLY);
    assert_true(lfd >= 0);
    assert_int_equal(flock(lfd, LOCK_EX), 0);

    ct_params *ps = one_tensor_list();
    for (int round = 0; round < 2; round++) {
        touch(stale);
        if (round == 0) {
            assert_int_equal(ct_save_safetensors(path, ps, NULL), CT_OK);
        } else {
            ct_params *got = ct_load_safetensors(path, NULL);
            assert_non_null(got);
            ct_params_free(got);
        }
        assert_false(file_exists(stale));
        for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) assert_true(file_exists(kept[i]));
        assert_true(file_exists(dir));
    }
    /* A save of its own leaves nothing behind. */
    close(lfd);
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) unlink(kept[i]);
    rmdir(dir);
    assert_int_equal(ct_save_safetensors(path, ps, NULL), CT_OK);
    assert_false(temp_files_left());
    ct_params_free(ps);
    unlink(path);
}

/* Saved files get 0666 less the umask, as open(O_CREAT, 0666) would give,
 * also when they replace a file of another mode. The umask is the
 * process's: the teardown restores it even when an assertion fails. */
static mode_t saved_umask;
static int setup_umask(void **state) {
    saved_umask = umask(022);
    umask(saved_umask);
    return setup(state);
}
static int teardown_umask(void **state) {
    umask(saved_umask);
    return teardown(state);
}

static void test_st_file_mode(void **state) {
    (void)state;
    const char *path = tpath("mode.safetensors");
    ct_params *ps = one_tensor_list();
    static const mode_t masks[] = {022, 077, 0, 027};
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        umask(masks[i]);
        assert_int_equal(ct_save_safetensors(path, ps, NULL), CT_OK);
        struct stat sb;
        assert_int_equal(stat(path, &sb), 0);
        if ((sb.st_mode & 0777) != (0666 & ~masks[i]))
            fprintf(stderr, "umask %03o: mode %03o\n", (unsigned)masks[i],
                    (unsigned)(sb.st_mode & 0777));
        assert_int_equal(sb.st_mode & 0777, 0666 & ~masks[i]);
    }
    umask(saved_umask);
    ct_params_free(ps);
    unlink(path);
}

static void test_st_save_errors(void **state) {
    (void)state;
    ct_params *ps = ct_params_new();
    ct_tensor *t = tu_rand(CT_SHAPE(3), CT_F32, -1, 1, NULL);
    assert_int_equal(ct_params_add(ps, "a", t), CT_OK);
    tu_assert_error(ct_save_safetensors(NULL, ps, NULL), CT_ERR_INVALID_ARG,
                    "ct_save_safetensors", "path");
    tu_assert_error(ct_save_safetensors(tpath("x"), NULL, NULL), CT_ERR_INVALID_ARG, "list");
    tu_assert_error(ct_save_safetensors(tpath("no/such/dir/x.safetensors"), ps, NULL), CT_ERR_IO,
                    "ct_save_safetensors", "no/such/dir", "No such file");
    ct_params *bad = ct_params_new();
    assert_int_equal(ct_params_add(bad, "__metadata__", t), CT_OK);
    tu_assert_error(ct_save_safetensors(tpath("x"), bad, NULL), CT_ERR_INVALID_ARG, "reserved");
    ct_params_free(bad);
    bad = ct_params_new();
    assert_int_equal(ct_params_add(bad, "bad\xff", t), CT_OK);
    tu_assert_error(ct_save_safetensors(tpath("x"), bad, NULL), CT_ERR_INVALID_ARG, "UTF-8");
    ct_params_free(bad);
    assert_false(file_exists(tpath("x")));
    assert_false(temp_files_left());

    ct_metadata *m = ct_metadata_new();
    tu_assert_error(ct_metadata_set(m, "", "v"), CT_ERR_INVALID_ARG, "empty");
    tu_assert_error(ct_metadata_set(m, "k", NULL), CT_ERR_INVALID_ARG, "NULL");
    tu_assert_error(ct_metadata_set(m, "k", "\xc0\xaf"), CT_ERR_INVALID_ARG, "UTF-8");
    tu_assert_error(ct_metadata_set(NULL, "k", "v"), CT_ERR_INVALID_ARG, "NULL");
    assert_int_equal(ct_metadata_count(m), 0);
    ct_metadata_free(m);

    tu_assert_null_error(ct_load_safetensors(tpath("missing.st"), NULL), CT_ERR_IO,
                         "ct_load_safetensors", "missing.st", "No such file");
    tu_assert_null_error(ct_load_safetensors(tmpdir, NULL), CT_ERR_IO, "not a regular file");
    tu_assert_null_error(ct_load_safetensors(NULL, NULL), CT_ERR_INVALID_ARG, "NULL");
    ct_tensor_release(t);
    ct_params_free(ps);
}

/* A two-layer model's parameters as a checkpoint holds them. */
static ct_params *model_params(ct_nn_linear **l1, ct_nn_linear **l2, uint64_t seed) {
    ct_generator *g = ct_generator_new(seed);
    *l1 = ct_nn_linear_new(6, 5, true, CT_F32, CT_CPU, g);
    *l2 = ct_nn_linear_new(5, 3, true, CT_F64, CT_CPU, g);
    ct_generator_free(g);
    ct_params *p = ct_params_new();
    assert_int_equal(ct_nn_linear_params(*l1, "fc1", p), CT_OK);
    assert_int_equal(ct_nn_linear_params(*l2, "fc2", p), CT_OK);
    return p;
}

static void test_st_load_into(void **state) {
    (void)state;
    ct_nn_linear *a1, *a2, *b1, *b2;
    ct_params *pa = model_params(&a1, &a2, tu_next());
    ct_params *pb = model_params(&b1, &b2, tu_next());
    const char *path = tpath("model.safetensors");
    ct_metadata *meta = ct_metadata_new();
    assert_int_equal(ct_metadata_set(meta, "step", "120"), CT_OK);
    assert_int_equal(ct_save_safetensors(path, pa, meta), CT_OK);
    ct_metadata_free(meta);

    /* Restoring leaves that require grad, in grad mode. */
    assert_true(ct_is_grad_enabled());
    ct_metadata *got_meta;
    assert_int_equal(ct_load_safetensors_into(path, pb, true, &got_meta), CT_OK);
    assert_string_equal(ct_metadata_get(got_meta, "step"), "120");
    ct_metadata_free(got_meta);
    for (int64_t i = 0; i < ct_params_count(pa); i++) {
        ct_tensor *b = ct_params_get(pb, i, NULL);
        assert_same_tensor(ct_params_get(pa, i, NULL), b);
        assert_true(ct_requires_grad(b));
        assert_true(ct_is_leaf(b));
    }
    assert_true(ct_is_grad_enabled());

    /* A subset loads unless strict. */
    ct_params *sub = ct_params_new();
    ct_tensor *w = ct_tensor_zeros(CT_SHAPE(5, 6), CT_F32, CT_CPU);
    assert_int_equal(ct_params_add(sub, "fc1.weight", w), CT_OK);
    tu_assert_error(ct_load_safetensors_into(path, sub, true, NULL), CT_ERR_FORMAT,
                    "ct_load_safetensors_into", "lacks", "strict");
    double *v = tu_values(w);
    for (int i = 0; i < 30; i++) assert_true(v[i] == 0.0); /* untouched */
    free(v);
    assert_int_equal(ct_load_safetensors_into(path, sub, false, NULL), CT_OK);
    assert_same_tensor(ct_params_get(pa, 0, NULL), w);
    ct_params_free(sub);
    ct_tensor_release(w);

    /* Wrong shape, wrong dtype, missing name: nothing is changed. */
    struct {
        const char *name;
        int nd;
        int64_t shape[2];
        ct_dtype dt;
        ct_status st;
        const char *word;
    } cases[] = {
        {"fc1.weight", 2, {6, 5}, CT_F32, CT_ERR_SHAPE, "[5, 6]"},
        {"fc2.bias", 1, {3, 0}, CT_F32, CT_ERR_DTYPE, "float64"},
        {"fc3.weight", 1, {3, 0}, CT_F32, CT_ERR_FORMAT, "no tensor named 'fc3.weight'"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ct_params *d = ct_params_new();
        ct_tensor *first = ct_tensor_zeros(CT_SHAPE(5), CT_F32, CT_CPU);
        ct_tensor *t = ct_tensor_zeros(cases[c].nd, cases[c].shape, cases[c].dt, CT_CPU);
        assert_int_equal(ct_params_add(d, "fc1.bias", first), CT_OK);
        assert_int_equal(ct_params_add(d, cases[c].name, t), CT_OK);
        tu_assert_error(ct_load_safetensors_into(path, d, false, NULL), cases[c].st,
                        cases[c].word);
        double *fv = tu_values(first);
        for (int i = 0; i < 5; i++) assert_true(fv[i] == 0.0);
        free(fv);
        ct_tensor_release(first);
        ct_tensor_release(t);
        ct_params_free(d);
    }
    tu_assert_error(ct_load_safetensors_into(path, NULL, true, NULL), CT_ERR_INVALID_ARG, "NULL");

    /* Optimizer state (0-d step counters included) survives a round trip. */
    ct_optimizer *opt = ct_optim_adamw_new(pa, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    assert_non_null(opt);
    for (int step = 0; step < 2; step++) {
        ct_scope *s = ct_scope_begin();
        ct_tensor *x = tu_rand(CT_SHAPE(4, 6), CT_F32, -1, 1, NULL);
        ct_tensor *h = ct_to_dtype(ct_nn_linear_forward(a1, x), CT_F64);
        ct_tensor *loss = ct_sum(ct_square(ct_nn_linear_forward(a2, h)), CT_NONE, false);
        ct_optim_zero_grad(opt);
        assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
        assert_int_equal(ct_optim_step(opt), CT_OK);
        ct_scope_end(s);
    }
    ct_optim_zero_grad(opt);
    ct_params *state_list = ct_params_new();
    for (int64_t k = 0; k < ct_optim_state_count(opt); k++) {
        const char *name;
        ct_tensor *t = ct_optim_state_get(opt, k, &name);
        assert_int_equal(ct_params_add(state_list, name, t), CT_OK);
    }
    const char *opath = tpath("optim.safetensors");
    assert_int_equal(ct_save_safetensors(opath, state_list, NULL), CT_OK);
    ct_optimizer *opt2 = ct_optim_adamw_new(pb, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    ct_params *state2 = ct_params_new();
    for (int64_t k = 0; k < ct_optim_state_count(opt2); k++) {
        const char *name;
        ct_tensor *t = ct_optim_state_get(opt2, k, &name);
        assert_int_equal(ct_params_add(state2, name, t), CT_OK);
    }
    assert_int_equal(ct_load_safetensors_into(opath, state2, true, NULL), CT_OK);
    for (int64_t k = 0; k < ct_optim_state_count(opt); k++)
        assert_same_tensor(ct_params_get(state_list, k, NULL), ct_params_get(state2, k, NULL));
    ct_params_free(state_list);
    ct_params_free(state2);
    ct_optim_free(opt);
    ct_optim_free(opt2);

    ct_params_free(pa);
    ct_params_free(pb);
    ct_nn_linear_free(a1);
    ct_nn_linear_free(a2);
    ct_nn_linear_free(b1);
    ct_nn_linear_free(b2);
}

/* A file of an 8-byte length, header text and data_len random data bytes. */
static void write_st(const char *path, const char *header, size_t data_len) {
    size_t hl = strlen(header);
    unsigned char *b = malloc(8 + hl + data_len + 1);
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (unsigned char)(tu_next() & 1);
    write_bytes(path, b, 8 + hl + data_len);
    free(b);
}

#define T_(name, dt, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}"

static void test_st_malformed(void **state) {
    (void)state;
    const char *p = tpath("bad.safetensors");
    static const struct {
        const char *header;
        size_t data;
        const char *words[3];
    } cases[] = {
        /* bad JSON */
        {"{" T_("a", "F32", "[2]", "0", "8"), 8, {"malformed", "expected"}},
        {"{" T_("a", "F32", "[2]", "0", "8") ",}", 8, {"malformed", "expected a string"}},
        {"{\"a\":{\"dtype\":F32,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, {"malformed"}},
        {"[1,2]", 0, {"expected '{'"}},
        {"", 0, {"malformed", "end of the header"}},
        {"{} x", 0, {"after the header"}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}}", 8, {"after"}},
        {"{\"a", 0, {"unterminated string"}},
        {"{\"a\\", 0, {"unterminated string"}},
        {"{\"a\\q\":{}}", 0, {"invalid escape"}},
        {"{\"a\\u12G4\":{}}", 0, {"hex digit"}},
        {"{\"a\tb\":{}}", 0, {"control character"}},
        /* wrong types */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 8, {"'['"}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, {"fraction"}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8, {"exactly two"}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, {"','"}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, {"negative"}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", 8, {"leading zero"}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":3}", 8, {"'{'"}},
        {"{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", 0,
         {"malformed", "tensor 'a'"}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, {"missing key \"data_offsets\""}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
         {"unknown key \"x\""}},
        {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"duplicate key \"dtype\""}},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, {"dtype \"U8\""}},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
         {"more than 8 dims"}},
        {"{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, {"empty"}},
        /* metadata */
        {"{\"__metadata__\":{\"k\":1}}", 0, {"the metadata", "a string"}},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, {"duplicate metadata key"}},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, {"duplicate key \"__metadata__\""}},
        {"{\"__metadata__\":{\"k\":\"1\",\"\":\"2\"}}", 0, {"the metadata", "empty metadata key"}},
        /* names that are not UTF-8 */
        {"{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, {"UTF-8"}},
        {"{\"a\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, {"UTF-8"}},
        {"{\"a\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         {"UTF-8"}},
        {"{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         {"surrogate"}},
        {"{\"a\\udc00\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         {"surrogate"}},
        {"{\"a\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         {"\\u0000"}},
        /* the header against the data */
        {"{" T_("a", "F32", "[2]", "0", "800") "}", 8, {"outside the data section", "'a'"}},
        {"{" T_("a", "F32", "[2]", "8", "0") "}", 8, {"end before they begin"}},
        {"{" T_("a", "F32", "[2]", "0", "8") "," T_("b", "F32", "[2]", "4", "12") "}", 12,
         {"overlap", "'a'", "'b'"}},
        {"{" T_("a", "F32", "[2]", "0", "8") "," T_("b", "F32", "[0]", "4", "4") "}", 8,
         {"overlap"}},
        {"{" T_("a", "F32", "[2]", "0", "8") "," T_("b", "F32", "[2]", "12", "20") "}", 20,
         {"gap", "[8, 12)"}},
        {"{" T_("a", "F32", "[2]", "4", "12") "}", 12, {"gap", "[0, 4)"}},
        {"{" T_("a", "F32", "[2]", "0", "8") "}", 9, {"gap", "[8, 9)", "end"}},
        {"{}", 3, {"gap"}},
        {"{" T_("a", "F32", "[3]", "0", "8") "}", 8, {"need 12 bytes", "span 8"}},
        {"{" T_("a", "F64", "[2]", "0", "8") "}", 8, {"F64", "need 16 bytes"}},
        {"{" T_("a", "F32", "[4294967296,4294967296,4294967296]", "0", "8") "}", 8,
         {"overflows"}},
        {"{" T_("a", "BF16", "[4611686018427387904]", "0", "8") "}", 8, {"overflows"}},
        {"{" T_("a", "F32", "[99999999999999999999]", "0", "8") "}", 8, {"too large"}},
        {"{" T_("a", "I64", "[1]", "0", "8") "," T_("a", "I64", "[1]", "8", "16") "}", 16,
         {"duplicate tensor name 'a'"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        write_st(p, cases[c].header, cases[c].data);
        ct_clear_error();
        ct_params *got = ct_load_safetensors(p, NULL);
        if (got || ct_last_status() != CT_ERR_FORMAT)
            fprintf(stderr, "case %zu (%s): status %s, \"%s\"\n", c, cases[c].header,
                    ct_status_name(ct_last_status()), ct_last_error());
        assert_null(got);
        assert_int_equal(ct_last_status(), CT_ERR_FORMAT);
        assert_non_null(strstr(ct_last_error(), "ct_load_safetensors"));
        assert_non_null(strstr(ct_last_error(), "bad.safetensors"));
        for (int w = 0; w < 3 && cases[c].words[w]; w++) {
            if (!strstr(ct_last_error(), cases[c].words[w]))
                fprintf(stderr, "case %zu: \"%s\" lacks \"%s\"\n", c, ct_last_error(),
                        cases[c].words[w]);
            assert_non_null(strstr(ct_last_error(), cases[c].words[w]));
        }
    }

    /* Deep nesting well past any recursion limit. */
    enum { depth = 200000 };
    static char deep[depth + 16];
    memcpy(deep, "{\"a\":", 5);
    memset(deep + 5, '[', depth);
    deep[5 + depth] = '\0';
    write_st(p, deep, 0);
    tu_assert_null_error(ct_load_safetensors(p, NULL), CT_ERR_FORMAT, "malformed");

    /* A BOOL tensor must hold 0 and 1 only. */
    const char *bh = "{" T_("b", "BOOL", "[4]", "0", "4") "}";
    size_t hl = strlen(bh);
    unsigned char buf[128] = {0};
    buf[0] = (unsigned char)hl;
    memcpy(buf + 8, bh, hl);
    buf[8 + hl + 2] = 2;
    write_bytes(p, buf, 8 + hl + 4);
    tu_assert_null_error(ct_load_safetensors(p, NULL), CT_ERR_FORMAT, "BOOL", "byte 2",
                         "element 2");

    /* The header length against the file. */
    write_bytes(p, "\x01\x02\x03", 3);
    tu_assert_null_error(ct_load_safetensors(p, NULL), CT_ERR_FORMAT, "too short");
    unsigned char lenbuf[16] = {0xE8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(p, lenbuf, 10);
    tu_assert_null_error(ct_load_safetensors(p, NULL), CT_ERR_FORMAT, "header length 1000",
                         "exceeds", "2 bytes");
    memset(lenbuf, 0xFF, 8);
    write_bytes(p, lenbuf, 10);
    tu_assert_null_error(ct_load_safetensors(p, NULL), CT_ERR_FORMAT, "exceeds");
    /* Within a (sparse) large file, but above the 100 MB limit. */
    uint64_t big = 150000000;
    for (int k = 0; k < 8; k++) lenbuf[k] = (unsigned char)(big >> (8 * k));
    write_bytes(p, lenbuf, 8);
    assert_int_equal(truncate(p, 200000000), 0);
    tu_assert_null_error(ct_load_safetensors(p, NULL), CT_ERR_FORMAT, "limit");
    unlink(p);

    /* Valid but unusual: whitespace, escapes, zero-size tensors sharing an offset. */
    write_st(p,
             " {\n \"na\\u00efve\\ud83d\\ude00\\/\" : {\"shape\" : [ ] , \"data_offsets\":[0,4],"
             "\"dtype\":\"I32\"},\t\"e\":{\"dtype\":\"F16\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
             "\"f\":{\"dtype\":\"F16\",\"shape\":[2,0],\"data_offsets\":[4,4]}}   ",
             4);
    ct_params *got = ct_load_safetensors(p, NULL);
    if (!got) fprintf(stderr, "%s\n", ct_last_error());
    assert_non_null(got);
    assert_int_equal(ct_params_count(got), 3);
    const char *name;
    ct_tensor *t = ct_params_get(got, 0, &name);
    assert_string_equal(name, "na\xc3\xafve\xf0\x9f\x98\x80/");
    assert_int_equal(ct_tensor_ndim(t), 0);
    assert_int_equal(ct_tensor_dtype(t), CT_I32);
    assert_int_equal(ct_tensor_numel(ct_params_get(got, 2, NULL)), 0);
    ct_params_free(got);
}

/* A header of n entries, built by entry(i, buf) into a "{...}" object
 * (inside "__metadata__" when meta); caller frees. */
static char *many_entries(int64_t n, bool meta, int (*entry)(int64_t, char *)) {
    size_t cap = (size_t)n * 96 + 64, m = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    m += (size_t)sprintf(h + m, meta ? "{\"__metadata__\":{" : "{");
    for (int64_t i = 0; i < n; i++) {
        if (i) h[m++] = ',';
        m += (size_t)entry(i, h + m);
    }
    m += (size_t)sprintf(h + m, meta ? "}}" : "}");
    assert_true(m < cap);
    return h;
}

/* Keys "k<i>", except that the last repeats key 123 when dup_at_end. */
static bool dup_at_end;
static int meta_entry(int64_t i, char *b) {
    if (dup_at_end && i == 199999) i = 123;
    return sprintf(b, "\"k%lld\":\"v%lld\"", (long long)i, (long long)i);
}
static int empty_tensor_entry(int64_t i, char *b) {
    if (dup_at_end && i == 199999) i = 123;
    return sprintf(b, "\"t%lld\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                   (long long)i);
}

/* Files with 200k metadata keys or 200k (empty) tensors load: names are
 * hashed, not compared with every earlier one, which made this take minutes.
 * A repeated key among them is still found and named. */
static void test_st_many_entries(void **state) {
    (void)state;
    const char *p = tpath("many.safetensors");
    enum { n = 200000 };
    for (int dup = 0; dup < 2; dup++) {
        dup_at_end = dup;
        char *h = many_entries(n, true, meta_entry);
        write_st(p, h, 0);
        free(h);
        ct_metadata *meta = NULL;
        ct_params *got = ct_load_safetensors(p, &meta);
        if (dup) {
            tu_assert_null_error(got, CT_ERR_FORMAT, "ct_load_safetensors", "many.safetensors",
                                 "duplicate metadata key \"k123\"");
            assert_null(meta);
            continue;
        }
        assert_non_null(got);
        assert_int_equal(ct_params_count(got), 0);
        assert_int_equal(ct_metadata_count(meta), n);
        const char *v;
        assert_string_equal(ct_metadata_at(meta, 54321, &v), "k54321");
        assert_string_equal(v, "v54321");
        assert_string_equal(ct_metadata_get(meta, "k199999"), "v199999");
        assert_null(ct_metadata_get(meta, "k200000"));
        assert_int_equal(ct_metadata_set(meta, "k7", "seven"), CT_OK);
        assert_int_equal(ct_metadata_set(meta, "new", "x"), CT_OK);
        assert_int_equal(ct_metadata_count(meta), n + 1);
        assert_string_equal(ct_metadata_get(meta, "k7"), "seven");
        assert_string_equal(ct_metadata_at(meta, n, NULL), "new");
        ct_metadata_free(meta);
        ct_params_free(got);
    }
    for (int dup = 0; dup < 2; dup++) {
        dup_at_end = dup;
        char *h = many_entries(n, false, empty_tensor_entry);
        write_st(p, h, 0);
        free(h);
        ct_params *got = ct_load_safetensors(p, NULL);
        if (dup) {
            tu_assert_null_error(got, CT_ERR_FORMAT, "ct_load_safetensors", "many.safetensors",
                                 "duplicate tensor name 't123'");
            continue;
        }
        assert_non_null(got);
        assert_int_equal(ct_params_count(got), n);
        const char *name;
        ct_tensor *t = ct_params_get(got, 150000, &name);
        assert_string_equal(name, "t150000");
        assert_ptr_equal(ct_params_find(got, "t150000"), t);
        assert_int_equal(ct_tensor_numel(t), 0);
        tu_assert_null_error(ct_params_find(got, "t200000"), CT_ERR_INDEX, "ct_params_find",
                             "t200000", "200000");
        /* Restoring into a copy of itself, strict: every name looked up once. */
        assert_int_equal(ct_load_safetensors_into(p, got, true, NULL), CT_OK);
        ct_params_free(got);
    }
    dup_at_end = false;
    unlink(p);
}

/* Random damage to valid files: every outcome is a clean success or a
 * CT_ERR_FORMAT error, never a crash, an overread or a leak (ASan). */
static void test_fuzz(void **state) {
    (void)state;
    int64_t n;
    ct_params *ps = random_params(&n);
    ct_metadata *meta = ct_metadata_new();
    assert_int_equal(ct_metadata_set(meta, "k", "v"), CT_OK);
    const char *src = tpath("fuzz_src.safetensors");
    assert_int_equal(ct_save_safetensors(src, ps, meta), CT_OK);
    ct_metadata_free(meta);
    ct_params_free(ps);
    size_t len;
    unsigned char *orig = read_bytes(src, &len);
    unsigned char *buf = malloc(len + 64);
    const char *p = tpath("fuzz.safetensors");
    int ok = 0, bad = 0;
    for (int it = 0; it < 1500; it++) {
        memcpy(buf, orig, len);
        size_t flen = len;
        int mode = (int)tu_randint(0, 10);
        if (mode == 0) flen = (size_t)tu_randint(0, (int64_t)len); /* truncation */
        else if (mode == 1) {                                       /* trailing bytes */
            size_t extra = (size_t)tu_randint(1, 64);
            for (size_t k = 0; k < extra; k++) buf[len + k] = (unsigned char)tu_next();
            flen = len + extra;
        }
        int flips = (int)tu_randint(1, 5);
        for (int f = 0; f < flips && flen > 0; f++) {
            /* Mostly in the header, where the parser is. */
            size_t hend = flen < 400 ? flen : 400;
            size_t at = (size_t)tu_randint(0, (int64_t)(tu_next() % 4 ? hend : flen));
            buf[at] = tu_next() % 2 ? (unsigned char)tu_next() : buf[at] ^ (1u << tu_randint(0, 8));
        }
        write_bytes(p, buf, flen);
        ct_metadata *m = NULL;
        ct_params *got = ct_load_safetensors(p, &m);
        if (got) {
            ok++;
            ct_params_free(got);
            ct_metadata_free(m);
        } else {
            bad++;
            if (ct_last_status() != CT_ERR_FORMAT)
                fprintf(stderr, "fuzz: %s %s\n", ct_status_name(ct_last_status()),
                        ct_last_error());
            assert_int_equal(ct_last_status(), CT_ERR_FORMAT);
            assert_null(m);
        }
    }
    assert_true(bad > 0);
    free(orig);
    free(buf);

    /* IDX, plain and gzip. */
    const idx_kind *kinds[2] = {&IDX_KINDS[0], &IDX_KINDS[3]};
    for (int k = 0; k < 2; k++) {
        uint32_t dims[3] = {4, 5, 6};
        double *v = idx_values(kinds[k], 120);
        unsigned char *img = idx_image(kinds[k], 3, dims, v, 120, &len);
        free(v);
        const char *gp = tpath("fuzz_src.idx.gz");
        write_gz(gp, img, len);
        size_t glen;
        unsigned char *gz = read_bytes(gp, &glen);
        for (int it = 0; it < 600; it++) {
            bool zipped = it & 1;
            const unsigned char *o = zipped ? gz : img;
            size_t olen = zipped ? glen : len;
            unsigned char *b = malloc(olen + 8);
            memcpy(b, o, olen);
            size_t flen = olen;
            if (tu_next() % 8 == 0) flen = (size_t)tu_randint(0, (int64_t)olen);
            int flips = (int)tu_randint(1, 4);
            for (int f = 0; f < flips && flen > 0; f++) {
                size_t lim = tu_next() % 2 ? (flen < 24 ? flen : 24) : flen;
                b[tu_randint(0, (int64_t)lim)] ^= (unsigned char)(1u << tu_randint(0, 8));
            }
            const char *fp = tpath("fuzz.idx");
            write_bytes(fp, b, flen);
            free(b);
            ct_tensor *t = ct_idx_load(fp, CT_F64);
            if (t) {
                ok++;
                ct_tensor_release(t);
            } else {
                if (ct_last_status() != CT_ERR_FORMAT)
                    fprintf(stderr, "fuzz idx: %s\n", ct_last_error());
                assert_int_equal(ct_last_status(), CT_ERR_FORMAT);
            }
        }
        free(gz);
        free(img);
    }
    assert_true(ok > 0);
}

/* ---- data loader ----------------------------------------------------------------------------------- */

/* inputs [n, 3, 2] with x[i, ...] = 100 i + k, targets [n] with y[i] = i. */
static void make_data(int64_t n, ct_tensor **x, ct_tensor **y) {
    if (n == 0) {
        *x = ct_tensor_zeros(CT_SHAPE(0, 3, 2), CT_F32, CT_CPU);
        *y = ct_tensor_zeros(CT_SHAPE(0), CT_I64, CT_CPU);
        return;
    }
    double *xv = malloc((size_t)(n > 0 ? n : 1) * 6 * sizeof *xv);
    double *yv = malloc((size_t)(n > 0 ? n : 1) * sizeof *yv);
    for (int64_t i = 0; i < n; i++) {
        for (int k = 0; k < 6; k++) xv[i * 6 + k] = 100.0 * (double)i + k;
        yv[i] = (double)i;
    }
    *x = tu_from_f64(xv, CT_SHAPE(n, 3, 2), CT_F32);
    *y = tu_from_f64(yv, CT_SHAPE(n), CT_I64);
    free(xv);
    free(yv);
}

/* Runs the rest of the epoch; ids[] receives the sample ids in order (checked
 * against the rows of x), returns how many; sizes[] the batch sizes. */
static int64_t run_epoch(ct_dataloader *dl, int64_t *ids, int64_t *sizes, int64_t *nbatches) {
    int64_t m = 0, nb = 0;
    ct_tensor *x, *y;
    while (ct_dataloader_next(dl, &x, &y)) {
        int64_t b = ct_tensor_shape(x)[0];
        assert_int_equal(ct_tensor_ndim(x), 3);
        assert_int_equal(ct_tensor_shape(x)[1], 3);
        assert_int_equal(ct_tensor_dtype(x), CT_F32);
        assert_int_equal(ct_tensor_dtype(y), CT_I64);
        assert_int_equal(ct_tensor_shape(y)[0], b);
        double *xv = tu_values(x), *yv = tu_values(y);
        for (int64_t r = 0; r < b; r++) {
            for (int k = 0; k < 6; k++) assert_true(xv[r * 6 + k] == 100.0 * yv[r] + k);
            ids[m++] = (int64_t)yv[r];
        }
        free(xv);
        free(yv);
        if (sizes) sizes[nb] = b;
        nb++;
        ct_tensor_release(x);
        ct_tensor_release(y);
    }
    assert_null(x);
    assert_null(y);
    assert_int_equal(ct_dataloader_status(dl), CT_OK);
    if (nbatches) *nbatches = nb;
    return m;
}

static void assert_each_once(const int64_t *ids, int64_t m, int64_t n) {
    char *seen = calloc((size_t)n + 1, 1);
    for (int64_t i = 0; i < m; i++) {
        assert_true(ids[i] >= 0 && ids[i] < n);
        assert_false(seen[ids[i]]);
        seen[ids[i]] = 1;
    }
    free(seen);
}

static void test_loader_epochs(void **state) {
    (void)state;
    int64_t n = tu_randint(90, 130), bs = 10;
    ct_tensor *x, *y;
    make_data(n, &x, &y);
    uint64_t seed = tu_next();
    ct_dataloader *a = ct_dataloader_new(x, y, bs, true, false, seed);
    ct_dataloader *b = ct_dataloader_new(x, y, bs, true, false, seed);
    ct_dataloader *c = ct_dataloader_new(x, y, bs, true, false, seed + 1);
    assert_non_null(a);
    assert_int_equal(ct_dataloader_num_batches(a), (n + bs - 1) / bs);
    assert_int_equal(ct_dataloader_num_samples(a), n);
    int64_t *ia = malloc((size_t)n * sizeof *ia), *ib = malloc((size_t)n * sizeof *ib);
    int64_t *prev = malloc((size_t)n * sizeof *prev), *ic = malloc((size_t)n * sizeof *ic);
    int64_t sizes[32], nb;
    for (int epoch = 0; epoch < 3; epoch++) {
        assert_int_equal(run_epoch(a, ia, sizes, &nb), n);
        assert_int_equal(nb, (n + bs - 1) / bs);
        for (int64_t k = 0; k < nb - 1; k++) assert_int_equal(sizes[k], bs);
        assert_int_equal(sizes[nb - 1], n - (nb - 1) * bs);
        assert_each_once(ia, n, n);
        /* Shuffled, the same for the same seed, another for another seed or epoch. */
        int64_t inplace = 0;
        for (int64_t i = 0; i < n; i++) inplace += ia[i] == i;
        assert_true(inplace < n / 4);
        assert_int_equal(run_epoch(b, ib, NULL, NULL), n);
        assert_memory_equal(ia, ib, (size_t)n * sizeof *ia);
        assert_int_equal(run_epoch(c, ic, NULL, NULL), n);
        assert_memory_not_equal(ia, ic, (size_t)n * sizeof *ia);
        if (epoch) assert_memory_not_equal(ia, prev, (size_t)n * sizeof *ia);
        memcpy(prev, ia, (size_t)n * sizeof *ia);
        /* Past the end: nothing more until reset. */
        ct_tensor *bx = (ct_tensor *)1, *by = (ct_tensor *)1;
        assert_false(ct_dataloader_next(a, &bx, &by));
        assert_null(bx);
        assert_null(by);
        assert_int_equal(ct_dataloader_get_state(a).epoch, epoch);
        assert_int_equal(ct_dataloader_reset(a), CT_OK);
        assert_int_equal(ct_dataloader_reset(b), CT_OK);
        assert_int_equal(ct_dataloader_reset(c), CT_OK);
    }
    ct_dataloader_free(a);
    ct_dataloader_free(b);
    ct_dataloader_free(c);

    /* In order, and drop_last. */
    ct_dataloader *o = ct_dataloader_new(x, y, bs, false, false, 0);
    assert_int_equal(run_epoch(o, ia, NULL, NULL), n);
    for (int64_t i = 0; i < n; i++) assert_int_equal(ia[i], i);
    ct_dataloader_free(o);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        ct_dataloader *d = ct_dataloader_new(x, y, bs, shuffle, true, seed);
        assert_int_equal(ct_dataloader_num_batches(d), n / bs);
        assert_int_equal(run_epoch(d, ia, sizes, &nb), n / bs * bs);
        assert_int_equal(nb, n / bs);
        for (int64_t k = 0; k < nb; k++) assert_int_equal(sizes[k], bs);
        assert_each_once(ia, n / bs * bs, n);
        ct_dataloader_free(d);
    }
    free(ia);
    free(ib);
    free(ic);
    free(prev);
    ct_tensor_release(x);
    ct_tensor_release(y);
}

static void test_loader_resume(void **state) {
    (void)state;
    int64_t n = tu_randint(50, 80), bs = 7;
    ct_tensor *x, *y;
    make_data(n, &x, &y);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        ct_dataloader *a = ct_dataloader_new(x, y, bs, shuffle, false, tu_next());
        int64_t *ids = malloc((size_t)n * sizeof *ids);
        run_epoch(a, ids, NULL, NULL);
        ct_dataloader_reset(a);
        ct_tensor *bx, *by;
        for (int k = 0; k < 3; k++) {
            assert_true(ct_dataloader_next(a, &bx, &by));
            ct_tensor_release(bx);
            ct_tensor_release(by);
        }
        ct_dataloader_state st = ct_dataloader_get_state(a);
        assert_int_equal(st.epoch, 1);
        assert_int_equal(st.position, 3 * bs);
        /* A loader built with another seed, restored, continues identically
         * through this epoch and the next. */
        ct_dataloader *b = ct_dataloader_new(x, y, bs, shuffle, false, 12345);
        assert_int_equal(ct_dataloader_set_state(b, &st), CT_OK);
        int64_t *ia = malloc((size_t)n * sizeof *ia), *ib = malloc((size_t)n * sizeof *ib);
        for (int e = 0; e < 2; e++) {
            int64_t ma = run_epoch(a, ia, NULL, NULL), mb = run_epoch(b, ib, NULL, NULL);
            assert_int_equal(ma, mb);
            assert_int_equal(ma, e == 0 ? n - 3 * bs : n);
            assert_memory_equal(ia, ib, (size_t)ma * sizeof *ia);
            ct_dataloader_reset(a);
            ct_dataloader_reset(b);
        }
        ct_dataloader_state sa = ct_dataloader_get_state(a), sb = ct_dataloader_get_state(b);
        assert_int_equal(sa.epoch, 3);
        assert_int_equal(sb.epoch, 3);
        assert_true(sa.gen_offset == sb.gen_offset && sa.seed == sb.seed);

        /* States that do not fit. */
        ct_dataloader_state bad = st;
        bad.position = bs + 1;
        tu_assert_error(ct_dataloader_set_state(b, &bad), CT_ERR_INVALID_ARG,
                        "ct_dataloader_set_state", "position");
        bad.position = n + bs;
        tu_assert_error(ct_dataloader_set_state(b, &bad), CT_ERR_INVALID_ARG, "position");
        bad = st;
        bad.epoch = -1;
        tu_assert_error(ct_dataloader_set_state(b, &bad), CT_ERR_INVALID_ARG, "epoch");
        bad.epoch = 0;
        bad.position = n; /* the end of an epoch is a valid place to stop */
        assert_int_equal(ct_dataloader_set_state(b, &bad), CT_OK);
        assert_false(ct_dataloader_next(b, &bx, &by));
        assert_int_equal(ct_dataloader_status(b), CT_OK);
        free(ids);
        free(ia);
        free(ib);
        ct_dataloader_free(a);
        ct_dataloader_free(b);
    }
    ct_tensor_release(x);
    ct_tensor_release(y);
}

/* Fisher-Yates gives every position the same chance: where sample 0 lands
 * over many epochs of 5 samples, within 6 standard errors. */
static void test_loader_uniform(void **state) {
    (void)state;
    ct_tensor *x, *y;
    make_data(5, &x, &y);
    ct_dataloader *dl = ct_dataloader_new(x, NULL, 5, true, false, tu_next());
    int64_t counts[5] = {0};
    const int epochs = 5000;
    for (int e = 0; e < epochs; e++) {
        ct_tensor *bx, *by = (ct_tensor *)1;
        assert_true(ct_dataloader_next(dl, &bx, &by));
        assert_null(by); /* no targets */
        double *v = tu_values(bx);
        for (int r = 0; r < 5; r++)
            if (v[r * 6] == 0.0) counts[r]++;
        free(v);
        ct_tensor_release(bx);
        ct_dataloader_reset(dl);
    }
    double p = 0.2, sd = sqrt(epochs * p * (1 - p));
    for (int r = 0; r < 5; r++) assert_true(fabs((double)counts[r] - epochs * p) < 6 * sd);
    ct_dataloader_free(dl);
    ct_tensor_release(x);
    ct_tensor_release(y);
}

static void test_loader_misc(void **state) {
    (void)state;
    ct_tensor *x, *y;
    make_data(12, &x, &y);
    /* A non-contiguous source owned by a scope that ends before the loader. */
    ct_scope *s = ct_scope_begin();
    ct_tensor *xn = tu_noncontig(x);
    ct_dataloader *dl = ct_dataloader_new(xn, y, 5, true, false, 7);
    ct_scope_end(s);
    assert_non_null(dl);
    int64_t ids[12];
    assert_int_equal(run_epoch(dl, ids, NULL, NULL), 12);
    assert_each_once(ids, 12, 12);
    ct_dataloader_free(dl);

    /* An empty data set has no batches. */
    ct_tensor *ex, *ey;
    make_data(0, &ex, &ey);
    dl = ct_dataloader_new(ex, ey, 4, true, false, 1);
    assert_non_null(dl);
    assert_int_equal(ct_dataloader_num_batches(dl), 0);
    ct_tensor *bx, *by;
    assert_false(ct_dataloader_next(dl, &bx, &by));
    assert_int_equal(ct_dataloader_status(dl), CT_OK);
    ct_dataloader_free(dl);
    ct_tensor_release(ex);
    ct_tensor_release(ey);

    /* Bad arguments. */
    tu_assert_null_error(ct_dataloader_new(NULL, y, 4, true, false, 1), CT_ERR_INVALID_ARG,
                         "ct_dataloader_new", "inputs");
    tu_assert_null_error(ct_dataloader_new(x, y, 0, true, false, 1), CT_ERR_INVALID_ARG,
                         "batch_size 0");
    ct_tensor *y5 = ct_tensor_zeros(CT_SHAPE(5), CT_I64, CT_CPU);
    tu_assert_null_error(ct_dataloader_new(x, y5, 4, true, false, 1), CT_ERR_SHAPE,
                         "different numbers of samples", "12 != 5");
    ct_tensor *s0 = ct_tensor_scalar(1, CT_F32, CT_CPU);
    tu_assert_null_error(ct_dataloader_new(s0, NULL, 4, true, false, 1), CT_ERR_SHAPE, "dim 0");
    dl = ct_dataloader_new(x, y, 4, false, false, 1);
    assert_false(ct_dataloader_next(dl, NULL, &by));
    assert_int_equal(ct_dataloader_status(dl), CT_ERR_INVALID_ARG);
    ct_dataloader_free(dl);
    tu_assert_error(ct_dataloader_reset(NULL), CT_ERR_INVALID_ARG, "NULL");
    ct_dataloader_free(NULL);
    ct_tensor_release(s0);
    ct_tensor_release(y5);
    ct_tensor_release(x);
    ct_tensor_release(y);
}

/* ---- the real data set, when Debian's dataset-fashion-mnist is installed ------------------------ */

#define FMNIST "/usr/share/datasets/fashion-mnist/"

static void test_fashion_mnist(void **state) {
    (void)state;
    if (!file_exists(FMNIST "t10k-images-idx3-ubyte.gz") ||
        !file_exists(FMNIST "t10k-labels-idx1-ubyte.gz")) {
        fprintf(stderr, "[  SKIPPED ] " FMNIST " absent (package dataset-fashion-mnist)\n");
        skip();
    }
    ct_tensor *img = ct_idx_load(FMNIST "t10k-images-idx3-ubyte.gz", CT_F32);
    ct_tensor *lab = ct_idx_load(FMNIST "t10k-labels-idx1-ubyte.gz", CT_I64);
    if (!img || !lab) fprintf(stderr, "%s\n", ct_last_error());
    assert_shape(img, 3, (const int64_t[]){10000, 28, 28});
    assert_shape(lab, 1, (const int64_t[]){10000});
    double *lv = tu_values(lab);
    int64_t counts[10] = {0};
    for (int i = 0; i < 10000; i++) {
        assert_true(lv[i] >= 0 && lv[i] <= 9);
        counts[(int)lv[i]]++;
    }
    for (int c = 0; c < 10; c++) assert_int_equal(counts[c], 1000); /* a balanced test set */
    free(lv);
    const float *px = ct_tensor_data_ptr(img);
    double sum = 0, mx = 0, mn = 255;
    for (int64_t i = 0; i < 10000 * 784; i++) {
        assert_true(px[i] == floorf(px[i]));
        sum += px[i];
        mx = px[i] > mx ? px[i] : mx;
        mn = px[i] < mn ? px[i] : mn;
    }
    assert_true(mn == 0 && mx == 255);
    double mean = sum / (10000.0 * 784.0); /* Fashion-MNIST's mean pixel is near 0.286 * 255 */
    assert_true(mean > 60 && mean < 85);
    ct_tensor_release(img);
    ct_tensor_release(lab);
}

static void rm_tmpdir(void) { tu_rm_dir(tmpdir); }

/* Integers near INT64_MAX from a caller or a restored state: counted
 * without overflow, or refused by name. */
static void test_loader_extreme_integers(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = ct_tensor_zeros(CT_SHAPE(10, 3), CT_F32, CT_CPU);
    ct_tensor *y = ct_tensor_zeros(CT_SHAPE(10), CT_I64, CT_CPU);
    ct_dataloader *d = ct_dataloader_new(x, y, INT64_MAX, false, false, 0);
    assert_non_null(d);
    assert_int_equal(ct_dataloader_num_batches(d), 1);
    ct_tensor *bx = NULL, *by = NULL;
    assert_true(ct_dataloader_next(d, &bx, &by));
    assert_int_equal(ct_tensor_shape(bx)[0], 10);
    assert_false(ct_dataloader_next(d, &bx, &by));
    ct_dataloader *dd = ct_dataloader_new(x, y, INT64_MAX, false, true, 0);
    assert_non_null(dd);
    assert_int_equal(ct_dataloader_num_batches(dd), 0);
    ct_dataloader_state st = ct_dataloader_get_state(d);
    st.epoch = INT64_MAX;
    st.position = 0;
    assert_int_equal(ct_dataloader_set_state(d, &st), CT_OK);
    tu_assert_error(ct_dataloader_reset(d), CT_ERR_OVERFLOW, "ct_dataloader_reset",
                    "9223372036854775807");
    assert_int_equal(ct_dataloader_get_state(d).epoch, INT64_MAX);
    st.position = INT64_MAX;
    tu_assert_error(ct_dataloader_set_state(d, &st), CT_ERR_INVALID_ARG,
                    "ct_dataloader_set_state", "position 9223372036854775807");
    ct_dataloader_free(d);
    ct_dataloader_free(dd);
    ct_scope_end(sc);
}

/* ct_dataloader_shard: the loaders of world ranks, built alike, hand out
 * disjoint strided shares of each epoch's order that together cover every
 * sample (the order's start repeated as padding), and move with the epoch. */
static void test_loader_shard(void **state) {
    enum { N = 10, B = 3, WORLD = 3 };
    int64_t shape[] = {N};
    double v[N];
    for (int i = 0; i < N; i++) v[i] = i;
    ct_tensor *data = tu_from_f64(v, 1, shape, CT_I64);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        ct_dataloader *dl[WORLD], *whole = ct_dataloader_new(data, NULL, N, shuffle, false, 42);
        for (int r = 0; r < WORLD; r++) {
            dl[r] = ct_dataloader_new(data, NULL, B, shuffle, false, 42);
            assert_int_equal(ct_dataloader_shard(dl[r], r, WORLD), CT_OK);
            /* ceil(10 / 3) = 4 samples: batches of 3 and 1 */
            assert_int_equal(ct_dataloader_num_batches(dl[r]), 2);
        }
        for (int epoch = 0; epoch < 2; epoch++) {
            ct_tensor *x;
            /* The unsharded order of this epoch, from a loader of the same seed. */
            assert_true(ct_dataloader_next(whole, &x, NULL));
            double *order = tu_values(x);
            ct_tensor_release(x);
            for (int r = 0; r < WORLD; r++) {
                int k = 0;
                while (ct_dataloader_next(dl[r], &x, NULL)) {
                    double *xv = tu_values(x);
                    for (int64_t i = 0; i < ct_tensor_numel(x); i++, k++)
                        assert_true(xv[i] == order[(r + k * WORLD) % N]);
                    free(xv);
                    ct_tensor_release(x);
                }
                assert_int_equal(ct_dataloader_status(dl[r]), CT_OK);
                assert_int_equal(k, 4);
                assert_int_equal(ct_dataloader_reset(dl[r]), CT_OK);
            }
            free(order);
            assert_int_equal(ct_dataloader_reset(whole), CT_OK);
        }
        for (int r = 0; r < WORLD; r++) ct_dataloader_free(dl[r]);
        ct_dataloader_free(whole);
    }
    /* drop_last applies to the shard's batches: 4 samples, one batch of 3. */
    ct_dataloader *d = ct_dataloader_new(data, NULL, B, true, true, 1);
    assert_int_equal(ct_dataloader_shard(d, 2, WORLD), CT_OK);
    assert_int_equal(ct_dataloader_num_batches(d), 1);
    tu_assert_error(ct_dataloader_shard(d, 3, 3), CT_ERR_INVALID_ARG, "ct_dataloader_shard",
                    "rank 3 of world 3");
    tu_assert_error(ct_dataloader_shard(d, 0, 0), CT_ERR_INVALID_ARG, "0 <= rank < world");
    tu_assert_error(ct_dataloader_shard(NULL, 0, 1), CT_ERR_INVALID_ARG, "the loader is NULL");
    ct_tensor *x;
    assert_true(ct_dataloader_next(d, &x, NULL));
    ct_tensor_release(x);
    tu_assert_error(ct_dataloader_shard(d, 0, 1), CT_ERR_INVALID_ARG,
                    "shard before its first batch");
    /* world 1 undoes it at the next epoch's start. */
    assert_int_equal(ct_dataloader_reset(d), CT_OK);
    assert_int_equal(ct_dataloader_shard(d, 0, 1), CT_OK);
    assert_int_equal(ct_dataloader_num_batches(d), 3);
    ct_dataloader_free(d);
    ct_tensor_release(data);
}

int main(void) {
    tu_seed();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cten_test_io_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_idx_valid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idx_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_st_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_st_save_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_st_stale_temporaries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_st_file_mode, setup_umask, teardown_umask),
        cmocka_unit_test_setup_teardown(test_st_load_into, setup, teardown),
        cmocka_unit_test_setup_teardown(test_st_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_st_many_entries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fuzz, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loader_epochs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loader_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loader_uniform, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loader_misc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loader_extreme_integers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loader_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fashion_mnist, setup, teardown),
    };
    int rc = tu_run_tests(tests);
    rm_tmpdir();
    return rc;
}
