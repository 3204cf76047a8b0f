/* NumPy files: .npy round trips of every dtype and layout (row-major,
 * strided copies, column-major written as Fortran order), the bytes of a
 * written header against numpy.save's, files laid out by hand as NumPy
 * writes them (big-endian, Fortran order, versions 2.0 and 3.0, Python 2
 * sizes, bfloat16 as two-byte voids), a table of malformed files with the
 * status and message each gives, and .npz archives: round trips stored and
 * deflated, and damaged archives. tests/test_interop.py checks the same
 * files against NumPy itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#include "test_fixture.h"

static char tmpdir[64];

static const char *tpath(const char *name) {
    static char buf[8][256];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    unlink(path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
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
    b[len] = '\0'; /* the header text is searched with strstr */
    *n = (size_t)len;
    return b;
}

/* A .npy file of version major.0 with header text dict (no padding) and n
 * data bytes; returns its size. */
static size_t make_npy(const char *path, int major, const char *dict, const void *data,
                       size_t n) {
    size_t hl = strlen(dict), pre = major == 1 ? 10 : 12;
    unsigned char *b = malloc(pre + hl + n + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    for (size_t k = 0; k < pre - 8; k++) b[8 + k] = (unsigned char)(hl >> (8 * k));
    memcpy(b + pre, dict, hl);
    if (n) memcpy(b + pre + hl, data, n);
    write_bytes(path, b, pre + hl + n);
    free(b);
    return pre + hl + n;
}

/* Asserts t has the given dtype, shape and row-major values. */
static void expect_values(ct_tensor *t, ct_dtype dt, int nd, const int64_t *shape,
                          const double *vals) {
    assert_non_null(t);
    assert_int_equal(ct_tensor_dtype(t), dt);
    assert_int_equal(ct_tensor_device(t).type, CT_DEVICE_CPU);
    assert_int_equal(ct_tensor_ndim(t), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(t)[d], shape[d]);
    int64_t n = tu_numel(nd, shape);
    double *got = tu_values(t);
    tu_assert_close(got, vals, n, 0, 0); /* the same dtype: exact */
    free(got);
}

/* ---- round trips ------------------------------------------------------------------------ */

static void test_npy_roundtrip(void **state) {
    (void)state;
    static const struct {
        int nd;
        int64_t shape[4];
    } shapes[] = {{0, {0}}, {1, {7}}, {2, {3, 5}}, {3, {2, 3, 4}}, {2, {0, 3}}, {4, {2, 1, 3, 2}}};
    const char *path = tpath("rt.npy");
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int nd = shapes[s].nd;
            const int64_t *shape = shapes[s].shape;
            double *vals;
            ct_tensor *t = tu_rand(nd, shape, dt, -100, 100, &vals);
            /* Row-major, then a strided copy (saved through a staging copy). */
            ct_tensor *views[2] = {ct_tensor_retain(t), tu_noncontig(t)};
            for (int v = 0; v < 2; v++) {
                assert_int_equal(ct_save_npy(path, views[v]), CT_OK);
                ct_tensor *u = ct_load_npy(path);
                expect_values(u, dt, nd, shape, vals);
                assert_true(ct_tensor_is_contiguous(u));
                ct_tensor_release(u);
                ct_tensor_release(views[v]);
            }
            /* Column-major: written as is with fortran_order True and read
             * back with the same strides. */
            if (nd >= 2) {
                int64_t perm[4] = {3, 2, 1, 0};
                for (int d = 0; d < nd; d++) perm[d] = nd - 1 - d;
                ct_tensor *tt = ct_permute(t, nd, perm);
                assert_int_equal(ct_save_npy(path, tt), CT_OK);
                size_t n;
                unsigned char *b = read_bytes(path, &n);
                bool fortran = strstr((char *)b + 10, "'fortran_order': True") != NULL;
                free(b);
                assert_true(fortran == !ct_tensor_is_contiguous(tt));
                ct_tensor *u = ct_load_npy(path);
                assert_non_null(u);
                for (int d = 0; d < nd; d++) {
                    assert_int_equal(ct_tensor_shape(u)[d], ct_tensor_shape(tt)[d]);
                    if (ct_tensor_shape(u)[d] > 1 && tu_numel(nd, shape) > 0)
                        assert_int_equal(ct_tensor_strides(u)[d], ct_tensor_strides(tt)[d]);
                }
                double *a = tu_values(u), *e = tu_values(tt);
                tu_assert_close(a, e, tu_numel(nd, shape), 0, 0);
                free(a);
                free(e);
                ct_tensor_release(u);
                ct_tensor_release(tt);
            }
            free(vals);
            ct_tensor_release(t);
        }
    }
}

/* The bytes numpy.save writes for np.arange(6, dtype='<f4').reshape(2, 3). */
static void test_npy_bytes(void **state) {
    (void)state;
    ct_tensor *t = ct_tensor_arange(0, 6, 1, CT_F32, CT_CPU);
    ct_tensor *v = ct_view(t, CT_SHAPE(2, 3));
    const char *path = tpath("bytes.npy");
    assert_int_equal(ct_save_npy(path, v), CT_OK);
    size_t n;
    unsigned char *b = read_bytes(path, &n);
    static const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    assert_int_equal(n, 128 + 24);
    assert_memory_equal(b, "\x93NUMPY\x01\x00\x76\x00", 10);
    assert_memory_equal(b + 10, dict, strlen(dict));
    for (size_t k = 10 + strlen(dict); k < 127; k++) assert_int_equal(b[k], ' ');
    assert_int_equal(b[127], '\n');
    for (int k = 0; k < 6; k++) {
        float f;
        memcpy(&f, b + 128 + 4 * k, 4);
        assert_true(f == (float)k);
    }
    free(b);
    /* 1-d shapes are written as Python's 1-tuples, 0-d as (). */
    ct_tensor *s = ct_tensor_scalar(1, CT_BOOL, CT_CPU);
    assert_int_equal(ct_save_npy(path, s), CT_OK);
    b = read_bytes(path, &n);
    assert_non_null(strstr((char *)b + 10, "{'descr': '|b1', 'fortran_order': False, 'shape': (), }"));
    assert_int_equal(n, 128 + 1);
    free(b);
    assert_int_equal(ct_save_npy(path, t), CT_OK);
    b = read_bytes(path, &n);
    assert_non_null(strstr((char *)b + 10, "'shape': (6,), }"));
    free(b);
    ct_tensor *h = ct_to_dtype(t, CT_BF16);
    assert_int_equal(ct_save_npy(path, h), CT_OK);
    b = read_bytes(path, &n);
    assert_non_null(strstr((char *)b + 10, "{'descr': '<V2',"));
    free(b);
    ct_tensor_release(h);
    ct_tensor_release(s);
    ct_tensor_release(v);
    ct_tensor_release(t);
}

/* Files as NumPy lays them out, written by hand: byte orders, Fortran
 * order, header versions, spellings numpy.load accepts. */
static void test_npy_read_layouts(void **state) {
    (void)state;
    const char *path = tpath("layout.npy");
    /* Big-endian float64 and int32, and float16. */
    double dv[3] = {1.5, -2.25, 1e300};
    unsigned char be[24];
    for (int i = 0; i < 3; i++) {
        uint64_t u;
        memcpy(&u, &dv[i], 8);
        for (int k = 0; k < 8; k++) be[8 * i + k] = (unsigned char)(u >> (56 - 8 * k));
    }
    make_npy(path, 1, "{'descr': '>f8', 'fortran_order': False, 'shape': (3,), }", be, 24);
    ct_tensor *t = ct_load_npy(path);
    expect_values(t, CT_F64, 1, (int64_t[]){3}, dv);
    ct_tensor_release(t);
    unsigned char bi[8] = {0xff, 0xff, 0xff, 0xfe, 0x00, 0x01, 0x00, 0x00};
    make_npy(path, 1, "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }", bi, 8);
    t = ct_load_npy(path);
    expect_values(t, CT_I32, 1, (int64_t[]){2}, (double[]){-2, 65536});
    ct_tensor_release(t);
    unsigned char bh[2] = {0x3c, 0x00}; /* 1.0 in float16, big-endian */
    make_npy(path, 1, "{'descr': '>f2', 'fortran_order': False, 'shape': (1, 1), }", bh, 2);
    t = ct_load_npy(path);
    expect_values(t, CT_F16, 2, (int64_t[]){1, 1}, (double[]){1});
    ct_tensor_release(t);

    /* Fortran order: column-major data of [[0, 1, 2], [3, 4, 5]]. */
    int64_t fv[6] = {0, 3, 1, 4, 2, 5};
    make_npy(path, 1, "{'descr': '<i8', 'fortran_order': True, 'shape': (2, 3), }", fv, 48);
    t = ct_load_npy(path);
    expect_values(t, CT_I64, 2, (int64_t[]){2, 3}, (double[]){0, 1, 2, 3, 4, 5});
    assert_int_equal(ct_tensor_strides(t)[0], 1);
    assert_int_equal(ct_tensor_strides(t)[1], 2);
    ct_tensor_release(t);

    /* Versions 2.0 and 3.0 (4-byte header length), keys in another order,
     * double quotes, no trailing comma, Python 2's long sizes, '=' and no
     * byte order, tabs and newlines. */
    float f[2] = {0.5f, 4};
    make_npy(path, 2, "{\"shape\": (1L, 2L), \"fortran_order\": False, \"descr\": \"=f4\"}\n", f,
             8);
    t = ct_load_npy(path);
    expect_values(t, CT_F32, 2, (int64_t[]){1, 2}, (double[]){0.5, 4});
    ct_tensor_release(t);
    make_npy(path, 3, "{'descr':'f4','fortran_order':False,'shape':(2,),}\t\n", f, 8);
    t = ct_load_npy(path);
    expect_values(t, CT_F32, 1, (int64_t[]){2}, (double[]){0.5, 4});
    ct_tensor_release(t);

    /* bfloat16 as a two-byte void, and bool. */
    uint16_t bf[2] = {0x3f80, 0xc000}; /* 1, -2 */
    make_npy(path, 1, "{'descr': '|V2', 'fortran_order': False, 'shape': (2,), }", bf, 4);
    t = ct_load_npy(path);
    expect_values(t, CT_BF16, 1, (int64_t[]){2}, (double[]){1, -2});
    ct_tensor_release(t);
    unsigned char bo[3] = {1, 0, 1};
    make_npy(path, 1, "{'descr': '|b1', 'fortran_order': True, 'shape': (3,), }", bo, 3);
    t = ct_load_npy(path);
    expect_values(t, CT_BOOL, 1, (int64_t[]){3}, (double[]){1, 0, 1});
    ct_tensor_release(t);

    /* Empty and 0-d. */
    make_npy(path, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 5), }", NULL, 0);
    t = ct_load_npy(path);
    expect_values(t, CT_F64, 2, (int64_t[]){0, 5}, NULL);
    ct_tensor_release(t);
    double one = 3.25;
    make_npy(path, 1, "{'descr': '<f8', 'fortran_order': True, 'shape': (), }", &one, 8);
    t = ct_load_npy(path);
    expect_values(t, CT_F64, 0, NULL, &one);
    ct_tensor_release(t);
}

/* ---- malformed files -------------------------------------------------------------------- */

typedef struct bad_npy {
    int major;       /* 0: raw bytes below instead of a laid-out file */
    const char *dict;
    size_t data_bytes;
    const char *raw; /* with raw_len */
    size_t raw_len;
    const char *words[3];
} bad_npy;

#define F32_12 "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"

static const bad_npy BAD_NPY[] = {
    {0, NULL, 0, "\x93NUMP", 5, {"too short (5 bytes)", "10-byte preamble"}},
    {0, NULL, 0, "\x93NUMPZ\x01\x00\x00\x00", 10, {"not a .npy file", "wrong magic"}},
    {0, NULL, 0, "\x93NUMPY\x04\x00\x00\x00", 10, {"unsupported .npy version 4.0"}},
    {0, NULL, 0, "\x93NUMPY\x01\x01\x00\x00", 10, {"unsupported .npy version 1.1"}},
    {0, NULL, 0, "\x93NUMPY\x02\x00\x00\x00", 10, {"truncated", "header length"}},
    {0, NULL, 0, "\x93NUMPY\x01\x00\x40\x00{}", 12, {"header length 64 exceeds the 2 bytes"}},
    {1, "['descr', '<f4']", 0, NULL, 0, {"malformed header", "expected '{'"}},
    {1, "{'descr': '<f4', 'fortran_order': False}", 0, NULL, 0, {"missing key 'shape'"}},
    {1, "{'descr': '<f4', 'descr': '<f4'}", 0, NULL, 0, {"duplicate key 'descr'"}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", 4, NULL, 0,
     {"unknown key 'x'"}},
    {1, "{'descr': '<u2', 'fortran_order': False, 'shape': (), }", 2, NULL, 0,
     {"descr '<u2' is not a dtype cten has", "b1, i4, i8, f2, f4, f8"}},
    {1, "{'descr': '<c8', 'fortran_order': False, 'shape': (), }", 8, NULL, 0, {"descr '<c8'"}},
    {1, "{'descr': '<f4x', 'fortran_order': False, 'shape': (), }", 4, NULL, 0, {"'<f4x'"}},
    {1, "{'descr': '|f4', 'fortran_order': False, 'shape': (), }", 4, NULL, 0,
     {"gives no byte order"}},
    {1, "{'descr': '>V2', 'fortran_order': False, 'shape': (), }", 2, NULL, 0,
     {"little-endian bfloat16"}},
    {1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (), }", 4, NULL, 0,
     {"structured dtypes"}},
    {1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (), }", 4, NULL, 0,
     {"fortran_order is not True or False"}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", 12, NULL, 0,
     {"is not a tuple", "(n,)"}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3 4), }", 12, NULL, 0,
     {"expected ',' or ')' in the shape, found '4'"}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }", 12, NULL, 0,
     {"expected a size, found '-'"}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,,), }", 12, NULL, 0,
     {"expected a size"}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, NULL, 0,
     {"more than 8 dims"}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0, NULL,
     0, {"size exceeds 9223372036854775807"}},
    {1, "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 0,
     NULL, 0, {"shape [4294967296, 4294967296] of float64 overflows"}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", 8, NULL, 0,
     {"truncated", "needs 4000000000000 bytes of data, it holds 8"}},
    {1, F32_12, 8, NULL, 0, {"truncated", "needs 12 bytes of data, it holds 8"}},
    {1, F32_12, 13, NULL, 0, {"1 trailing bytes after the 12 bytes of data"}},
    {1, F32_12 " x", 12, NULL, 0, {"text after the closing '}'"}},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)", 12, NULL, 0,
     {"the header ends where ',' or '}' after a value was expected"}},
    {1, "{'descr: '<f4', 'fortran_order': False, 'shape': (3,), }", 12, NULL, 0,
     {"unknown key 'descr: '"}},
    {1, "{'descr': '<f4", 12, NULL, 0, {"unterminated string"}},
    {1, "{'descr': '\xc3\xa9', 'fortran_order': False, 'shape': (3,), }", 12, NULL, 0,
     {"byte 0xc3 in a string"}},
    {1, "{'de\\scr': '<f4'}", 0, NULL, 0, {"byte 0x5c in a string", "no escapes"}},
};

static void test_npy_malformed(void **state) {
    (void)state;
    const char *path = tpath("bad.npy");
    unsigned char data[64];
    memset(data, 2, sizeof data); /* also not a bool */
    for (size_t k = 0; k < sizeof BAD_NPY / sizeof BAD_NPY[0]; k++) {
        const bad_npy *c = &BAD_NPY[k];
        if (c->major) make_npy(path, c->major, c->dict, data, c->data_bytes);
        else write_bytes(path, c->raw, c->raw_len);
        ct_clear_error();
        ct_tensor *t = ct_load_npy(path);
        if (t || ct_last_status() != CT_ERR_FORMAT)
            fprintf(stderr, "case %zu: %s\n", k, ct_last_error());
        tu_assert_null_error(t, CT_ERR_FORMAT, "ct_load_npy", path);
        for (int w = 0; w < 3 && c->words[w]; w++) {
            if (!strstr(ct_last_error(), c->words[w])) {
                fprintf(stderr, "case %zu: \"%s\" lacks \"%s\"\n", k, ct_last_error(),
                        c->words[w]);
                fail();
            }
        }
    }
    /* A bool byte other than 0 or 1. */
    make_npy(path, 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", "\1\0\2", 3);
    tu_assert_null_error(ct_load_npy(path), CT_ERR_FORMAT, "bool element 2 holds byte 2");
    /* What is not a file. */
    tu_assert_null_error(ct_load_npy(tpath("missing.npy")), CT_ERR_IO, "ct_load_npy",
                         "cannot open");
    tu_assert_null_error(ct_load_npy(tmpdir), CT_ERR_IO, "is not a regular file");
    tu_assert_null_error(ct_load_npy(NULL), CT_ERR_INVALID_ARG, "ct_load_npy: path is NULL");
}

static void test_npy_save_errors(void **state) {
    (void)state;
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(2), CT_F32, CT_CPU);
    tu_assert_error(ct_save_npy(NULL, t), CT_ERR_INVALID_ARG, "ct_save_npy: path is NULL");
    tu_assert_error(ct_save_npy("", t), CT_ERR_INVALID_ARG, "ct_save_npy: path is NULL or empty");
    tu_assert_error(ct_save_npy(tpath("x.npy"), NULL), CT_ERR_INVALID_ARG,
                    "ct_save_npy: tensor is NULL");
    tu_assert_error(ct_save_npy(tpath("no/such/dir.npy"), t), CT_ERR_IO, "ct_save_npy",
                    "temporary file");
    /* A failed save leaves the old file as it was. */
    const char *path = tpath("keep.npy");
    assert_int_equal(ct_save_npy(path, t), CT_OK);
    size_t n0, n1;
    unsigned char *b0 = read_bytes(path, &n0);
    tu_assert_error(ct_save_npy(path, NULL), CT_ERR_INVALID_ARG, "tensor is NULL");
    unsigned char *b1 = read_bytes(path, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(b0, b1, n0);
    free(b0);
    free(b1);
    ct_tensor_release(t);
}

/* ---- .npz --------------------------------------------------------------------------------- */

static ct_params *random_list(double ***vals, int64_t *count) {
    static const char *const names[] = {"w", "bias", "na\xc3\xafve", "dir/x", "mask", "ids",
                                        "half", "bf", "scalar", "empty"};
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F32, CT_I32, CT_BOOL,
                                   CT_I64, CT_F16, CT_BF16, CT_F64, CT_F32};
    static const int64_t shapes[][3] = {{3, 4}, {4}, {2, 2}, {5}, {2, 3},
                                        {6}, {3, 3}, {2, 5}, {0}, {0, 2}};
    static const int nds[] = {2, 1, 2, 1, 2, 1, 2, 2, 0, 2};
    int64_t n = sizeof names / sizeof names[0];
    ct_params *p = ct_params_new();
    *vals = malloc(sizeof(double *) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        ct_tensor *t = tu_rand(nds[i], shapes[i], dts[i], -50, 50, &(*vals)[i]);
        /* Some members from strided views and a transpose. */
        ct_tensor *v = i % 3 == 1 ? tu_noncontig(t) : ct_tensor_retain(t);
        assert_int_equal(ct_params_add(p, names[i], v), CT_OK);
        ct_tensor_release(v);
        ct_tensor_release(t);
    }
    *count = n;
    return p;
}

static void expect_same_lists(ct_params *got, ct_params *want, double **vals) {
    assert_non_null(got);
    assert_int_equal(ct_params_count(got), ct_params_count(want));
    for (int64_t i = 0; i < ct_params_count(want); i++) {
        const char *gn, *wn;
        ct_tensor *g = ct_params_get(got, i, &gn);
        ct_tensor *w = ct_params_get(want, i, &wn);
        assert_string_equal(gn, wn);
        expect_values(g, ct_tensor_dtype(w), ct_tensor_ndim(w), ct_tensor_shape(w), vals[i]);
    }
}

static void test_npz_roundtrip(void **state) {
    (void)state;
    double **vals;
    int64_t n;
    ct_params *p = random_list(&vals, &n);
    for (int compress = 0; compress < 2; compress++) {
        const char *path = tpath(compress ? "c.npz" : "s.npz");
        assert_int_equal(ct_save_npz(path, p, compress), CT_OK);
        ct_params *q = ct_load_npz(path);
        expect_same_lists(q, p, vals);
        ct_params_free(q);
    }
    /* Deflate works: a large run of zeros shrinks. */
    ct_params *z = ct_params_new();
    ct_tensor *zeros = ct_tensor_zeros(CT_SHAPE(256, 256), CT_F32, CT_CPU);
    assert_int_equal(ct_params_add(z, "zeros", zeros), CT_OK);
    assert_int_equal(ct_save_npz(tpath("z.npz"), z, true), CT_OK);
    struct stat sb;
    assert_int_equal(stat(tpath("z.npz"), &sb), 0);
    assert_true(sb.st_size < 4096);
    ct_params *zq = ct_load_npz(tpath("z.npz"));
    assert_non_null(zq);
    double *zv = tu_values(ct_params_find(zq, "zeros"));
    for (int i = 0; i < 256 * 256; i++) assert_true(zv[i] == 0);
    free(zv);
    ct_params_free(zq);
    /* An empty list is an empty archive. */
    ct_params *e = ct_params_new();
    assert_int_equal(ct_save_npz(tpath("e.npz"), e, false), CT_OK);
    ct_params *eq = ct_load_npz(tpath("e.npz"));
    assert_non_null(eq);
    assert_int_equal(ct_params_count(eq), 0);
    ct_params_free(eq);
    ct_params_free(e);
    ct_tensor_release(zeros);
    ct_params_free(z);
    for (int64_t i = 0; i < n; i++) free(vals[i]);
    free(vals);
    ct_params_free(p);
}

/* Replaces every occurrence of from with to (same length) in b. */
static int patch_all(unsigned char *b, size_t n, const char *from, const char *to) {
    size_t l = strlen(from);
    int hits = 0;
    for (size_t k = 0; k + l <= n; k++)
        if (memcmp(b + k, from, l) == 0) {
            memcpy(b + k, to, l);
            hits++;
        }
    return hits;
}

static void expect_npz_refused(const char *path, const char *word) {
    ct_clear_error();
    ct_params *p = ct_load_npz(path);
    if (p || ct_last_status() != CT_ERR_FORMAT || !strstr(ct_last_error(), word))
        fprintf(stderr, "expected \"%s\": %s\n", word, ct_last_error());
    assert_null(p);
    tu_assert_error(ct_last_status(), CT_ERR_FORMAT, "ct_load_npz", path, word);
}

static void test_npz_malformed(void **state) {
    (void)state;
    ct_params *p = ct_params_new();
    ct_tensor *a = ct_tensor_arange(0, 12, 1, CT_F32, CT_CPU);
    ct_tensor *b = ct_tensor_arange(0, 3, 1, CT_I64, CT_CPU);
    assert_int_equal(ct_params_add(p, "aa", a), CT_OK);
    assert_int_equal(ct_params_add(p, "bb", b), CT_OK);
    const char *good = tpath("good.npz"), *bad = tpath("bad.npz");
    assert_int_equal(ct_save_npz(good, p, false), CT_OK);
    size_t n;
    unsigned char *orig = read_bytes(good, &n);
    unsigned char *m = malloc(n);

    /* Not an archive: a .npy file, a short file, half an archive. */
    assert_int_equal(ct_save_npy(bad, a), CT_OK);
    expect_npz_refused(bad, "is not a zip archive");
    write_bytes(bad, orig, 10);
    expect_npz_refused(bad, "too short (10 bytes)");
    write_bytes(bad, orig, n / 2);
    expect_npz_refused(bad, "not a zip archive");
    /* A member that is not .npy, and two members of one name. */
    memcpy(m, orig, n);
    assert_int_equal(patch_all(m, n, "bb.npy", "bb.txt"), 2);
    write_bytes(bad, m, n);
    expect_npz_refused(bad, "member 'bb.txt' is not a .npy file");
    memcpy(m, orig, n);
    assert_int_equal(patch_all(m, n, "bb.npy", "aa.npy"), 2);
    write_bytes(bad, m, n);
    expect_npz_refused(bad, "two members have one name");
    /* A name not marked UTF-8 is CP437, as Python's zipfile reads it. */
    memcpy(m, orig, n);
    assert_int_equal(patch_all(m, n, "bb.npy", "\x81" "b.npy"), 2);
    write_bytes(bad, m, n);
    ct_params *cp = ct_load_npz(bad);
    assert_non_null(cp);
    assert_non_null(ct_params_find(cp, "\xc3\xbc" "b"));
    ct_params_free(cp);
    /* A damaged member: its .npy magic, then one data byte (the CRC). */
    memcpy(m, orig, n);
    assert_int_equal(patch_all(m, n, "\x93NUMPY\x01", "\x93NUMPZ\x01"), 2);
    write_bytes(bad, m, n);
    expect_npz_refused(bad, "member 'aa.npy' is not a .npy file: wrong magic");
    memcpy(m, orig, n);
    float eleven = 11.0f;
    unsigned char *hit = memmem(m, n, &eleven, 4);
    assert_non_null(hit);
    hit[0] ^= 1;
    write_bytes(bad, m, n);
    expect_npz_refused(bad, "CRC");
    free(m);
    free(orig);

    tu_assert_null_error(ct_load_npz(tpath("missing.npz")), CT_ERR_IO, "ct_load_npz",
                         "cannot open");
    tu_assert_null_error(ct_load_npz(NULL), CT_ERR_INVALID_ARG, "ct_load_npz: path is NULL");
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_params_free(p);
}

static void test_npz_save_errors(void **state) {
    (void)state;
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(2), CT_F32, CT_CPU);
    ct_params *p = ct_params_new();
    assert_int_equal(ct_params_add(p, "bad\xff", t), CT_OK);
    tu_assert_error(ct_save_npz(tpath("x.npz"), p, true), CT_ERR_INVALID_ARG,
                    "ct_save_npz: tensor name number 0 is not valid UTF-8");
    tu_assert_error(ct_save_npz(NULL, p, true), CT_ERR_INVALID_ARG, "ct_save_npz: path is NULL");
    tu_assert_error(ct_save_npz(tpath("x.npz"), NULL, true), CT_ERR_INVALID_ARG,
                    "ct_save_npz: tensor list is NULL");
    assert_int_equal(access(tpath("x.npz"), F_OK), -1);
    ct_params_free(p);
    ct_tensor_release(t);
}

static void rm_tmpdir(void) { tu_rm_dir(tmpdir); }

int main(void) {
    tu_seed();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cten_test_npy_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_npy_roundtrip), T(test_npy_bytes),      T(test_npy_read_layouts),
        T(test_npy_malformed), T(test_npy_save_errors), T(test_npz_roundtrip),
        T(test_npz_malformed), T(test_npz_save_errors),
    };
#undef T
    int rc = tu_run_tests(tests);
    rm_tmpdir();
    return rc;
}
