/* The layer and linear-algebra ops on the CPU: dot, outer, einsum, baddbmm,
 * integer mm/bmm/matmul, batch/group/instance norm, conv1d,
 * conv_transpose2d, max/avg_pool1d, adaptive_avg_pool2d to sizes that do
 * not divide the input, adaptive_max_pool2d, and the nn layers of the norms
 * and convolutions. Each against float64 reference loops written here on
 * fresh random inputs, in every dtype the op takes, contiguous and as
 * non-contiguous views, into poisoned memory; float64 gradient checks; bad
 * inputs with their status and message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"

#define P(...) ((const int64_t[]){__VA_ARGS__})

/* ---- helpers ------------------------------------------------------------------------------ */

/* Fills and frees a block of a result's size with NaN, so that a result the
 * allocator hands back from it and a kernel leaves unwritten fails. */
static void poison(int64_t n) {
    if (n < 1) return;
    ct_tensor *t = ct_tensor_full(1, &n, NAN, CT_F64, CT_CPU);
    assert_non_null(t);
    ct_tensor_release(t);
    t = ct_tensor_full(1, &n, NAN, CT_F32, CT_CPU);
    assert_non_null(t);
    ct_tensor_release(t);
}

/* A random tensor of dtype (values in [lo, hi), *vals row-major), made
 * non-contiguous when nc. */
static ct_tensor *input(int nd, const int64_t *shape, ct_dtype dt, double lo, double hi,
                        bool nc, double **vals) {
    ct_tensor *t = tu_rand(nd, shape, dt, lo, hi, vals);
    assert_non_null(t);
    if (!nc) return t;
    ct_tensor *v = tu_noncontig(t);
    ct_tensor_release(t);
    assert_non_null(v);
    return v;
}

/* Tolerance of a result that sums about k rounded products in dtype. */
static double tol_of(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-11;
    case CT_F32: return 2e-5;
    case CT_F16: return 4e-3;
    case CT_BF16: return 3e-2;
    default: return 0;
    }
}

static void expect(ct_tensor *y, ct_dtype dt, int nd, const int64_t *shape, const double *ref,
                   double rtol, double atol) {
    if (!y) fprintf(stderr, "unexpected error: %s\n", ct_last_error());
    assert_non_null(y);
    assert_int_equal(ct_tensor_dtype(y), dt);
    check_shape(y, nd, shape);
    check_values(y, ref, tu_numel(nd, shape), rtol, atol);
}

/* ---- dot, outer, baddbmm, integer matmul ---------------------------------------------------- */

static const ct_dtype all_mm_dtypes[] = {CT_F32, CT_F64, CT_F16, CT_BF16, CT_I32, CT_I64};

static void test_dot_outer(void **state) {
    (void)state;
    for (size_t k = 0; k < 6; k++) {
        ct_dtype dt = all_mm_dtypes[k];
        for (int nc = 0; nc < 2; nc++) {
            int64_t n = tu_randint(1, 40), m = tu_randint(1, 9);
            double *va, *vb;
            ct_tensor *a = input(1, &n, dt, -3, 3, nc, &va);
            ct_tensor *b = input(1, &n, dt, -3, 3, !nc, &vb);
            double ref = 0;
            for (int64_t i = 0; i < n; i++) ref += va[i] * vb[i];
            poison(1);
            ct_tensor *d = ct_dot(a, b);
            expect(d, dt, 0, NULL, &ref, tol_of(dt), tol_of(dt) * 9 * (double)n);
            ct_tensor_release(d);
            if (ct_dtype_is_floating(dt)) {
                ct_tensor *c = input(1, &m, CT_F64, -2, 2, nc, NULL);
                double *vc = tu_values(c);
                double *ro = malloc(sizeof(double) * (size_t)(n * m));
                for (int64_t i = 0; i < n; i++)
                    for (int64_t j = 0; j < m; j++) ro[i * m + j] = va[i] * vc[j];
                poison(n * m);
                ct_tensor *o = ct_outer(a, c); /* promotes to float64 */
                expect(o, CT_F64, 2, P(n, m), ro, 1e-15, 0);
                ct_tensor_release(o);
                free(ro);
                free(vc);
                ct_tensor_release(c);
            }
            free(va);
            free(vb);
            ct_tensor_release(a);
            ct_tensor_release(b);
        }
    }
    ct_tensor *a = ct_tensor_zeros(1, P(3), CT_F32, CT_CPU), *b = ct_tensor_zeros(1, P(4), CT_F32, CT_CPU);
    ct_tensor *m2 = ct_tensor_zeros(2, P(3, 3), CT_F32, CT_CPU), *c = ct_tensor_zeros(1, P(3), CT_F64, CT_CPU);
    tu_assert_null_error(ct_dot(a, b), CT_ERR_SHAPE, "ct_dot", "same number of elements");
    tu_assert_null_error(ct_dot(a, m2), CT_ERR_SHAPE, "ct_dot", "1D tensors expected");
    tu_assert_null_error(ct_dot(a, c), CT_ERR_DTYPE, "ct_dot", "same dtype");
    tu_assert_null_error(ct_dot(a, NULL), CT_ERR_INVALID_ARG, "ct_dot");
    tu_assert_null_error(ct_outer(m2, a), CT_ERR_SHAPE, "ct_outer", "1D");
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(m2);
    ct_tensor_release(c);
}

/* ref[b, i, j] = sum_l A[b, i, l] B[b, l, j] with batch broadcast (sizes 1). */
static void ref_bmm(const double *a, const double *b, int64_t ba, int64_t bb, int64_t n,
                    int64_t k, int64_t m, double *out) {
    int64_t B = ba > bb ? ba : bb;
    for (int64_t t = 0; t < B; t++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                double s = 0;
                for (int64_t l = 0; l < k; l++)
                    s += a[((ba == 1 ? 0 : t) * n + i) * k + l] *
                         b[((bb == 1 ? 0 : t) * k + l) * m + j];
                out[(t * n + i) * m + j] = s;
            }
}

static void test_integer_matmul(void **state) {
    (void)state;
    for (int dti = 0; dti < 2; dti++) {
        ct_dtype dt = dti ? CT_I64 : CT_I32;
        for (int nc = 0; nc < 2; nc++) {
            /* sizes across the kernel's row, k and column blocks */
            int64_t B = tu_randint(1, 4), n = tu_randint(1, 70), k = tu_randint(0, 300),
                    m = tu_randint(1, 300);
            double *va, *vb;
            ct_tensor *a = input(3, P(B, n, k), dt, -50, 50, nc, &va);
            ct_tensor *b = input(3, P(B, k, m), dt, -50, 50, !nc, &vb);
            double *ref = malloc(sizeof(double) * (size_t)(B * n * m));
            ref_bmm(va, vb, B, B, n, k, m, ref);
            poison(B * n * m);
            ct_tensor *y = ct_bmm(a, b);
            expect(y, dt, 3, P(B, n, m), ref, 0, 0);
            ct_tensor_release(y);
            /* matmul with b shared by every batch: [B, n, k] @ [k, m] */
            ct_tensor *b0 = ct_select(b, 0, 0);
            ref_bmm(va, vb, B, 1, n, k, m, ref);
            y = ct_matmul(a, b0);
            expect(y, dt, 3, P(B, n, m), ref, 0, 0);
            ct_tensor_release(y);
            ct_tensor *a0 = ct_select(a, 0, 0);
            y = ct_mm(a0, b0);
            expect(y, dt, 2, P(n, m), ref, 0, 0);
            ct_tensor_release(y);
            ct_tensor_release(a0);
            ct_tensor_release(b0);
            free(ref);
            free(va);
            free(vb);
            ct_tensor_release(a);
            ct_tensor_release(b);
        }
    }
    /* int32 products wrap as two's complement, as PyTorch's */
    int32_t av[2] = {INT32_MAX, 2}, bv[2] = {2, 3};
    ct_tensor *a = ct_tensor_from_data(av, CT_I32, 2, P(1, 2));
    ct_tensor *b = ct_tensor_from_data(bv, CT_I32, 2, P(2, 1));
    ct_tensor *y = ct_mm(a, b);
    assert_non_null(y);
    int32_t got;
    assert_int_equal(ct_tensor_copy_to_host(y, &got, sizeof got), CT_OK);
    assert_int_equal(got, (int32_t)((uint32_t)INT32_MAX * 2u + 6u));
    ct_tensor_release(y);
    /* mixed integer dtypes, bool, and integer addmm stay refused */
    ct_tensor *c = ct_tensor_zeros(2, P(2, 1), CT_I64, CT_CPU);
    tu_assert_null_error(ct_mm(a, c), CT_ERR_DTYPE, "ct_mm", "same dtype");
    ct_tensor *bb = ct_tensor_zeros(2, P(2, 2), CT_BOOL, CT_CPU);
    tu_assert_null_error(ct_mm(bb, bb), CT_ERR_DTYPE, "ct_mm", "bool");
    ct_tensor *z = ct_tensor_zeros(2, P(1, 1), CT_I32, CT_CPU);
    tu_assert_null_error(ct_addmm(z, a, b, 1, 1), CT_ERR_DTYPE, "ct_addmm");
    ct_tensor_release(z);
    ct_tensor_release(bb);
    ct_tensor_release(c);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

static void test_baddbmm(void **state) {
    (void)state;
    for (size_t k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        for (int nc = 0; nc < 2; nc++) {
            int64_t B = tu_randint(1, 4), n = tu_randint(1, 6), kk = tu_randint(1, 7),
                    m = tu_randint(1, 6);
            double beta = tu_uniform(-2, 2), alpha = tu_uniform(-2, 2);
            double *va, *vb, *vi;
            ct_tensor *a = input(3, P(B, n, kk), dt, -1, 1, nc, &va);
            ct_tensor *b = input(3, P(B, kk, m), dt, -1, 1, nc, &vb);
            ct_tensor *in = input(2, P(1, m), dt, -1, 1, nc, &vi); /* broadcasts */
            double *ref = malloc(sizeof(double) * (size_t)(B * n * m));
            ref_bmm(va, vb, B, B, n, kk, m, ref);
            for (int64_t i = 0; i < B * n * m; i++) ref[i] = beta * vi[i % m] + alpha * ref[i];
            poison(B * n * m);
            ct_tensor *y = ct_baddbmm(in, a, b, beta, alpha);
            expect(y, dt, 3, P(B, n, m), ref, tol_of(dt) * 4, tol_of(dt) * 4 * (double)kk);
            ct_tensor_release(y);
            free(ref);
            free(va);
            free(vb);
            free(vi);
            ct_tensor_release(a);
            ct_tensor_release(b);
            ct_tensor_release(in);
        }
    }
    /* beta 0 never reads input (its NaN vanishes) */
    ct_tensor *a = ct_tensor_ones(3, P(1, 2, 2), CT_F32, CT_CPU);
    ct_tensor *nan = ct_tensor_full(3, P(1, 2, 2), NAN, CT_F32, CT_CPU);
    ct_tensor *y = ct_baddbmm(nan, a, a, 0, 0.5);
    double ones[4] = {1, 1, 1, 1};
    expect(y, CT_F32, 3, P(1, 2, 2), ones, 0, 0);
    ct_tensor_release(y);
    ct_tensor *big = ct_tensor_zeros(3, P(2, 2, 2), CT_F32, CT_CPU);
    tu_assert_null_error(ct_baddbmm(big, a, a, 1, 1), CT_ERR_SHAPE, "ct_baddbmm", "broadcast");
    ct_tensor *m2 = ct_tensor_zeros(2, P(2, 2), CT_F32, CT_CPU);
    tu_assert_null_error(ct_baddbmm(m2, m2, a, 1, 1), CT_ERR_SHAPE, "ct_baddbmm", "3-d");
    ct_tensor_release(m2);
    ct_tensor_release(big);
    ct_tensor_release(nan);
    ct_tensor_release(a);
}

/* ---- einsum --------------------------------------------------------------------------------- */

/* Reference einsum over letter subscripts with an explicit output: every
 * assignment of the labels, size-1 dims broadcasting. */
typedef struct eref {
    int n;
    int nd[4];
    int lab[4][8];
    int64_t shape[4][8];
    const double *v[4];
} eref;

static int ref_einsum(const char *eq, int n, const int64_t (*shapes)[8], const int *nds,
                      const double *const *vals, double *out, int64_t *oshape) {
    eref r = {.n = n};
    int64_t size[52] = {0};
    const char *s = eq;
    for (int k = 0; k < n; k++) {
        r.nd[k] = 0;
        for (; *s && *s != ',' && *s != '-'; s++) {
            int l = *s >= 'a' ? *s - 'a' : 26 + *s - 'A';
            int d = r.nd[k]++;
            r.lab[k][d] = l;
            r.shape[k][d] = shapes[k][d];
            if (shapes[k][d] > size[l]) size[l] = shapes[k][d];
        }
        r.v[k] = vals[k];
        if (*s == ',') s++;
    }
    assert_true(nds[0] == r.nd[0]);
    s += 2; /* "->" */
    int out_lab[8], no = 0;
    for (; *s; s++) out_lab[no++] = *s >= 'a' ? *s - 'a' : 26 + *s - 'A';
    int used[52], nu = 0;
    for (int l = 0; l < 52; l++)
        if (size[l] > 0) used[nu++] = l;
    int64_t onum = 1;
    for (int i = 0; i < no; i++) {
        oshape[i] = size[out_lab[i]];
        onum *= oshape[i];
    }
    for (int64_t i = 0; i < onum; i++) out[i] = 0;
    int64_t idx[52] = {0};
    for (;;) {
        double p = 1;
        for (int k = 0; k < n; k++) {
            int64_t off = 0;
            for (int d = 0; d < r.nd[k]; d++)
                off = off * r.shape[k][d] + (r.shape[k][d] == 1 ? 0 : idx[r.lab[k][d]]);
            p *= r.v[k][off];
        }
        int64_t o = 0;
        for (int i = 0; i < no; i++) o = o * oshape[i] + idx[out_lab[i]];
        out[o] += p;
        int u = nu - 1;
        for (; u >= 0; u--) {
            if (++idx[used[u]] < size[used[u]]) break;
            idx[used[u]] = 0;
        }
        if (u < 0) break;
    }
    return no;
}

typedef struct ecase {
    const char *eq;     /* what ct_einsum gets */
    const char *ref_eq; /* letters and explicit output for the reference */
    int n;
    int nd[3];
    int64_t shape[3][8];
} ecase;

static const ecase ecases[] = {
    {"ij,jk->ik", "ij,jk->ik", 2, {2, 2}, {{3, 4}, {4, 5}}},
    {"ij,jk", "ij,jk->ik", 2, {2, 2}, {{2, 3}, {3, 4}}},
    {"bij,bjk->bik", "bij,bjk->bik", 2, {3, 3}, {{2, 3, 4}, {2, 4, 3}}},
    {"ii->i", "ii->i", 1, {2}, {{4, 4}}},
    {"ii", "ii->", 1, {2}, {{5, 5}}},
    {"ij->ji", "ij->ji", 1, {2}, {{3, 5}}},
    {"ba", "ba->ab", 1, {2}, {{3, 2}}},
    {"ijk->", "ijk->", 1, {3}, {{2, 3, 4}}},
    {"i,i->", "i,i->", 2, {1, 1}, {{7}, {7}}},
    {"i,j->ij", "i,j->ij", 2, {1, 1}, {{3}, {4}}},
    {"ij,ij->ij", "ij,ij->ij", 2, {2, 2}, {{3, 4}, {3, 4}}},
    {"ij,kl->ijkl", "ij,kl->ijkl", 2, {2, 2}, {{2, 3}, {2, 2}}},
    {"bhid,bhjd->bhij", "bhid,bhjd->bhij", 2, {4, 4}, {{2, 2, 3, 4}, {2, 2, 5, 4}}},
    {"ijk,ikl,ilm->jm", "ijk,ikl,ilm->jm", 3, {3, 3, 3}, {{2, 3, 4}, {2, 4, 3}, {2, 3, 2}}},
    {"iij,jk->ik", "iij,jk->ik", 2, {3, 2}, {{3, 3, 4}, {4, 2}}},
    {"ij,jk->", "ij,jk->", 2, {2, 2}, {{3, 4}, {4, 2}}},
    {"ab,cd->", "ab,cd->", 2, {2, 2}, {{2, 3}, {4, 2}}},
    {"...ij,...jk->...ik", "abij,bjk->abik", 2, {4, 3}, {{2, 3, 4, 5}, {3, 5, 2}}},
    {"...ij,...jk->...ik", "abij,abjk->abik", 2, {4, 4}, {{2, 1, 3, 4}, {1, 3, 4, 2}}},
    {"i...->...", "iab->ab", 1, {3}, {{4, 2, 3}}},
    {"...i,i", "abi,i->ab", 2, {3, 1}, {{2, 3, 4}, {4}}},
    {"b i j , b j k -> b k i", "bij,bjk->bki", 2, {3, 3}, {{2, 2, 3}, {2, 3, 2}}},
};

static void test_einsum_values(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof ecases / sizeof ecases[0]; c++) {
        const ecase *e = &ecases[c];
        for (size_t k = 0; k < 6; k++) {
            ct_dtype dt = all_mm_dtypes[k];
            bool nc = (c + k) % 2 == 1;
            ct_tensor *ops[3];
            double *vals[3];
            for (int i = 0; i < e->n; i++)
                ops[i] = input(e->nd[i], e->shape[i], dt, -2, 3, nc, &vals[i]);
            double ref[512];
            int64_t oshape[8];
            int no = ref_einsum(e->ref_eq, e->n, e->shape, e->nd, (const double *const *)vals,
                                ref, oshape);
            poison(tu_numel(no, oshape));
            ct_tensor *y = ct_einsum(e->eq, e->n, ops);
            if (!y) fprintf(stderr, "einsum %s %s: %s\n", e->eq, ct_dtype_name(dt), ct_last_error());
            expect(y, dt, no, oshape, ref, tol_of(dt) * 4, tol_of(dt) * 40);
            ct_tensor_release(y);
            for (int i = 0; i < e->n; i++) {
                ct_tensor_release(ops[i]);
                free(vals[i]);
            }
        }
    }
}

typedef struct { const char *eq; int n; } eq_ctx;
static ct_tensor *einsum_fn(ct_tensor *const *in, void *ctx) {
    const eq_ctx *c = ctx;
    return ct_einsum(c->eq, c->n, in);
}

static void test_einsum_grad(void **state) {
    (void)state;
    const size_t picks[] = {0, 2, 3, 4, 10, 13, 14, 17, 20};
    for (size_t p = 0; p < sizeof picks / sizeof picks[0]; p++) {
        const ecase *e = &ecases[picks[p]];
        ct_tensor *ops[3];
        for (int i = 0; i < e->n; i++) {
            ops[i] = input(e->nd[i], e->shape[i], CT_F64, -1, 1, false, NULL);
            assert_int_equal(ct_requires_grad_(ops[i], true), CT_OK);
        }
        eq_ctx c = {e->eq, e->n};
        gradcheck_ok(e->eq, einsum_fn, &c, e->n, ops);
        release_all(e->n, ops);
    }
}

static ct_tensor *baddbmm_fn(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_baddbmm(in[0], in[1], in[2], 0.75, -1.25);
}
static ct_tensor *dot_fn(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_dot(in[0], in[1]);
}
static ct_tensor *outer_fn(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_outer(in[0], in[1]);
}

static void test_linalg_grads(void **state) {
    (void)state;
    ct_tensor *in[3] = {input(2, P(3, 1), CT_F64, -1, 1, false, NULL),
                        input(3, P(2, 3, 4), CT_F64, -1, 1, true, NULL),
                        input(3, P(2, 4, 5), CT_F64, -1, 1, false, NULL)};
    for (int i = 0; i < 3; i++) assert_int_equal(ct_requires_grad_(in[i], true), CT_OK);
    gradcheck_ok("baddbmm", baddbmm_fn, NULL, 3, in);
    release_all(3, in);
    ct_tensor *v[2] = {input(1, P(6), CT_F64, -1, 1, false, NULL),
                       input(1, P(6), CT_F64, -1, 1, true, NULL)};
    for (int i = 0; i < 2; i++) assert_int_equal(ct_requires_grad_(v[i], true), CT_OK);
    gradcheck_ok("dot", dot_fn, NULL, 2, v);
    gradcheck_ok("outer", outer_fn, NULL, 2, v);
    release_all(2, v);
}

static void test_einsum_errors(void **state) {
    (void)state;
    ct_tensor *a = ct_tensor_zeros(2, P(2, 3), CT_F32, CT_CPU);
    ct_tensor *b = ct_tensor_zeros(2, P(4, 5), CT_F32, CT_CPU);
    ct_tensor *d = ct_tensor_zeros(2, P(3, 3), CT_F64, CT_CPU);
    ct_tensor *ab[2] = {a, b}, *ad[2] = {a, d};
    tu_assert_null_error(ct_einsum("ijk", 1, &a), CT_ERR_SHAPE, "ct_einsum",
                         "number of subscripts");
    tu_assert_null_error(ct_einsum("ij,jk->ik", 2, ab), CT_ERR_SHAPE, "ct_einsum",
                         "broadcast");
    tu_assert_null_error(ct_einsum("ii->i", 1, &a), CT_ERR_SHAPE, "ct_einsum", "repeated");
    tu_assert_null_error(ct_einsum("i1", 1, &a), CT_ERR_INVALID_ARG, "ct_einsum",
                         "invalid subscript");
    tu_assert_null_error(ct_einsum("ij->k", 1, &a), CT_ERR_INVALID_ARG, "ct_einsum",
                         "does not appear");
    tu_assert_null_error(ct_einsum("ij->ii", 1, &a), CT_ERR_INVALID_ARG, "ct_einsum",
                         "more than once");
    tu_assert_null_error(ct_einsum("ij", 2, ab), CT_ERR_INVALID_ARG, "ct_einsum",
                         "fewer operands");
    tu_assert_null_error(ct_einsum("ij,jk,kl", 2, ab), CT_ERR_INVALID_ARG, "ct_einsum",
                         "more operands");
    tu_assert_null_error(ct_einsum("ij,jk", 2, ad), CT_ERR_DTYPE, "ct_einsum", "dtype");
    tu_assert_null_error(ct_einsum(NULL, 1, &a), CT_ERR_INVALID_ARG, "ct_einsum");
    tu_assert_null_error(ct_einsum("..i..", 1, &a), CT_ERR_INVALID_ARG, "ct_einsum",
                         "ellipsis");
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(d);
}

/* ---- norms ---------------------------------------------------------------------------------- */

/* x [N, C, S] (S the product of the spatial dims) normalized per (group of)
 * channel(s): groups of G channels per n (group norm: per_n true), or each
 * channel over N and S (batch norm: per_n false). */
static void ref_norm(const double *x, int64_t N, int64_t C, int64_t S, int64_t G, bool per_n,
                     const double *mean_in, const double *var_in, const double *w,
                     const double *b, double eps, double *y, double *mean_out, double *var_out) {
    int64_t cg = C / G;
    for (int64_t g = 0; g < (per_n ? N * G : C); g++) {
        double s = 0, ss = 0;
        int64_t cnt = 0;
        for (int64_t n = 0; n < N; n++) {
            if (per_n && n != g / G) continue;
            for (int64_t c = 0; c < C; c++) {
                if (per_n ? c / cg != g % G : c != g) continue;
                for (int64_t i = 0; i < S; i++) {
                    s += x[(n * C + c) * S + i];
                    cnt++;
                }
            }
        }
        double mean = mean_in ? mean_in[g] : s / (double)cnt;
        for (int64_t n = 0; n < N; n++) {
            if (per_n && n != g / G) continue;
            for (int64_t c = 0; c < C; c++) {
                if (per_n ? c / cg != g % G : c != g) continue;
                for (int64_t i = 0; i < S; i++) {
                    double d = x[(n * C + c) * S + i] - mean;
                    ss += d * d;
                }
            }
        }
        double var = var_in ? var_in[g] : ss / (double)cnt;
        if (mean_out) mean_out[g] = mean;
        if (var_out) var_out[g] = ss / (double)cnt;
        for (int64_t n = 0; n < N; n++) {
            if (per_n && n != g / G) continue;
            for (int64_t c = 0; c < C; c++) {
                if (per_n ? c / cg != g % G : c != g) continue;
                for (int64_t i = 0; i < S; i++) {
                    int64_t o = (n * C + c) * S + i;
                    y[o] = (x[o] - mean) / sqrt(var + eps) * (w ? w[c] : 1) + (b ? b[c] : 0);
                }
            }
        }
    }
}

static double norm_tol(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-10;
    case CT_F32: return 1e-4;
    case CT_F16: return 1e-2;
    default: return 4e-2;
    }
}

static void test_batch_norm(void **state) {
    (void)state;
    for (size_t k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        for (int v = 0; v < 3; v++) {
            bool nc = v == 1;
            int nd = 2 + v; /* [N, C], [N, C, L], [N, C, H, W] */
            int64_t shape[4] = {tu_randint(2, 5), tu_randint(1, 5), tu_randint(1, 5),
                                tu_randint(1, 4)};
            int64_t N = shape[0], C = shape[1], S = tu_numel(nd - 2, shape + 2);
            double *vx, *vw, *vb, mean[8], var[8];
            ct_tensor *x = input(nd, shape, dt, -2, 3, nc, &vx);
            ct_tensor *w = input(1, &C, dt, 0.5, 2, false, &vw);
            ct_tensor *b = input(1, &C, dt, -1, 1, false, &vb);
            ct_dtype sdt = dt == CT_F64 ? CT_F64 : CT_F32;
            double rm0[8], rv0[8];
            for (int64_t c = 0; c < C; c++) {
                rm0[c] = tu_round(tu_uniform(-1, 1), sdt);
                rv0[c] = tu_round(tu_uniform(0.5, 2), sdt);
            }
            ct_tensor *rm = tu_from_f64(rm0, 1, &C, sdt), *rv = tu_from_f64(rv0, 1, &C, sdt);
            int64_t n = N * C * S;
            double *ref = malloc(sizeof(double) * (size_t)n);
            double momentum = 0.1 + 0.3 * v, eps = 1e-5;
            ref_norm(vx, N, C, S, 1, false, NULL, NULL, vw, vb, eps, ref, mean, var);
            poison(n);
            ct_tensor *y = ct_batch_norm(x, rm, rv, w, b, true, momentum, eps);
            expect(y, dt, nd, shape, ref, norm_tol(dt), norm_tol(dt));
            ct_tensor_release(y);
            /* the running statistics moved by momentum, the variance unbiased */
            double erm[8], erv[8];
            int64_t cnt = N * S;
            for (int64_t c = 0; c < C; c++) {
                erm[c] = (1 - momentum) * rm0[c] + momentum * mean[c];
                erv[c] = (1 - momentum) * rv0[c] + momentum * var[c] * cnt / (cnt - 1);
            }
            check_values(rm, erm, C, 1e-5, 1e-5);
            check_values(rv, erv, C, 1e-5, 1e-5);
            /* eval: the running statistics, without affine */
            double *rmv = tu_values(rm), *rvv = tu_values(rv);
            ref_norm(vx, N, C, S, 1, false, rmv, rvv, NULL, NULL, eps, ref, NULL, NULL);
            poison(n);
            y = ct_batch_norm(x, rm, rv, NULL, NULL, false, momentum, eps);
            expect(y, dt, nd, shape, ref, norm_tol(dt), norm_tol(dt));
            ct_tensor_release(y);
            check_values(rm, rmv, C, 0, 0); /* eval leaves them */
            free(rmv);
            free(rvv);
            free(ref);
            free(vx);
            free(vw);
            free(vb);
            release_all(5, (ct_tensor *[]){x, w, b, rm, rv});
        }
    }
}

static ct_tensor *bn_fn(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_batch_norm(in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
}
static ct_tensor *bn_eval_fn(ct_tensor *const *in, void *ctx) {
    ct_tensor **stats = ctx;
    return ct_batch_norm(in[0], stats[0], stats[1], in[1], in[2], false, 0.1, 1e-5);
}
static ct_tensor *gn_fn(ct_tensor *const *in, void *ctx) {
    return ct_group_norm(in[0], *(const int64_t *)ctx, in[1], in[2], 1e-5);
}
static ct_tensor *in_fn(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_instance_norm(in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
}

static void test_norm_grads(void **state) {
    (void)state;
    ct_tensor *in[3] = {input(4, P(3, 4, 2, 3), CT_F64, -2, 2, false, NULL),
                        input(1, P(4), CT_F64, 0.5, 2, false, NULL),
                        input(1, P(4), CT_F64, -1, 1, false, NULL)};
    for (int i = 0; i < 3; i++) assert_int_equal(ct_requires_grad_(in[i], true), CT_OK);
    gradcheck_ok("batch_norm train", bn_fn, NULL, 3, in);
    ct_tensor *stats[2] = {input(1, P(4), CT_F64, -1, 1, false, NULL),
                           input(1, P(4), CT_F64, 0.5, 2, false, NULL)};
    gradcheck_ok("batch_norm eval", bn_eval_fn, stats, 3, in);
    int64_t groups = 2;
    gradcheck_ok("group_norm", gn_fn, &groups, 3, in);
    gradcheck_ok("instance_norm", in_fn, NULL, 3, in);
    release_all(3, in);
    release_all(2, stats);
}

static void test_group_norm(void **state) {
    (void)state;
    for (size_t k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        for (int v = 0; v < 2; v++) {
            int64_t G = tu_randint(1, 4), shape[4] = {tu_randint(1, 4), G * tu_randint(1, 3),
                                                      tu_randint(1, 5), tu_randint(2, 4)};
            int nd = 3 + v;
            int64_t N = shape[0], C = shape[1], S = tu_numel(nd - 2, shape + 2);
            double *vx, *vw, *vb;
            ct_tensor *x = input(nd, shape, dt, -2, 3, v == 1, &vx);
            ct_tensor *w = input(1, &C, dt, 0.5, 2, false, &vw);
            ct_tensor *b = input(1, &C, dt, -1, 1, false, &vb);
            int64_t n = N * C * S;
            double *ref = malloc(sizeof(double) * (size_t)n);
            ref_norm(vx, N, C, S, G, true, NULL, NULL, v ? vw : NULL, v ? vb : NULL, 1e-5, ref,
                     NULL, NULL);
            poison(n);
            ct_tensor *y = ct_group_norm(x, G, v ? w : NULL, v ? b : NULL, 1e-5);
            expect(y, dt, nd, shape, ref, norm_tol(dt), norm_tol(dt));
            ct_tensor_release(y);
            free(ref);
            free(vx);
            free(vw);
            free(vb);
            release_all(3, (ct_tensor *[]){x, w, b});
        }
    }
}

static void test_instance_norm(void **state) {
    (void)state;
    for (size_t k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        int64_t shape[4] = {tu_randint(1, 4), tu_randint(1, 4), tu_randint(2, 5),
                            tu_randint(1, 4)};
        int64_t N = shape[0], C = shape[1], S = shape[2] * shape[3];
        double *vx, *vw, *vb, mean[16], var[16];
        ct_tensor *x = input(4, shape, dt, -2, 3, k % 2 == 1, &vx);
        ct_tensor *w = input(1, &C, dt, 0.5, 2, false, &vw);
        ct_tensor *b = input(1, &C, dt, -1, 1, false, &vb);
        ct_dtype sdt = dt == CT_F64 ? CT_F64 : CT_F32;
        ct_tensor *rm = ct_tensor_zeros(1, &C, sdt, CT_CPU), *rv = ct_tensor_ones(1, &C, sdt, CT_CPU);
        int64_t n = N * C * S;
        double *ref = malloc(sizeof(double) * (size_t)n);
        /* each (n, c) is a group of one channel over S: group norm with G = C */
        ref_norm(vx, N, C, S, C, true, NULL, NULL, vw, vb, 1e-5, ref, mean, var);
        poison(n);
        ct_tensor *y = ct_instance_norm(x, rm, rv, w, b, true, 0.25, 1e-5);
        expect(y, dt, 4, shape, ref, norm_tol(dt), norm_tol(dt));
        ct_tensor_release(y);
        double erm[4] = {0}, erv[4] = {0};
        for (int64_t c = 0; c < C; c++) {
            for (int64_t i = 0; i < N; i++) {
                erm[c] += mean[i * C + c] / (double)N;
                erv[c] += var[i * C + c] * S / (S - 1) / (double)N;
            }
            erm[c] = 0.25 * erm[c];
            erv[c] = 0.75 + 0.25 * erv[c];
        }
        check_values(rm, erm, C, 1e-5, 1e-5);
        check_values(rv, erv, C, 1e-5, 1e-5);
        /* with the running statistics */
        double *rmv = tu_values(rm), *rvv = tu_values(rv), rmx[16], rvx[16];
        for (int64_t i = 0; i < N * C; i++) {
            rmx[i] = rmv[i % C];
            rvx[i] = rvv[i % C];
        }
        ref_norm(vx, N, C, S, C, true, rmx, rvx, NULL, NULL, 1e-5, ref, NULL, NULL);
        y = ct_instance_norm(x, rm, rv, NULL, NULL, false, 0.25, 1e-5);
        expect(y, dt, 4, shape, ref, norm_tol(dt), norm_tol(dt));
        ct_tensor_release(y);
        free(rmv);
        free(rvv);
        free(ref);
        free(vx);
        free(vw);
        free(vb);
        release_all(5, (ct_tensor *[]){x, w, b, rm, rv});
    }
}

static void test_norm_errors(void **state) {
    (void)state;
    ct_tensor *x = ct_tensor_zeros(4, P(2, 3, 2, 2), CT_F32, CT_CPU);
    ct_tensor *one = ct_tensor_zeros(2, P(1, 3), CT_F32, CT_CPU);
    ct_tensor *w4 = ct_tensor_ones(1, P(4), CT_F32, CT_CPU);
    ct_tensor *w3d = ct_tensor_ones(1, P(3), CT_F64, CT_CPU);
    ct_tensor *xi = ct_tensor_zeros(2, P(2, 3), CT_I64, CT_CPU);
    ct_tensor *rm = ct_tensor_zeros(1, P(3), CT_F32, CT_CPU);
    tu_assert_null_error(ct_batch_norm(one, NULL, NULL, NULL, NULL, true, 0.1, 1e-5),
                         CT_ERR_SHAPE, "ct_batch_norm", "more than 1 value per channel");
    tu_assert_null_error(ct_batch_norm(x, NULL, NULL, w4, NULL, true, 0.1, 1e-5), CT_ERR_SHAPE,
                         "ct_batch_norm", "weight", "[3]");
    tu_assert_null_error(ct_batch_norm(x, NULL, NULL, w3d, NULL, true, 0.1, 1e-5), CT_ERR_DTYPE,
                         "ct_batch_norm", "weight");
    tu_assert_null_error(ct_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5),
                         CT_ERR_INVALID_ARG, "ct_batch_norm", "required");
    tu_assert_null_error(ct_batch_norm(x, rm, NULL, NULL, NULL, true, 0.1, 1e-5),
                         CT_ERR_INVALID_ARG, "ct_batch_norm", "together");
    tu_assert_null_error(ct_batch_norm(xi, NULL, NULL, NULL, NULL, true, 0.1, 1e-5),
                         CT_ERR_DTYPE, "ct_batch_norm", "int64");
    tu_assert_null_error(ct_batch_norm(NULL, NULL, NULL, NULL, NULL, true, 0.1, 1e-5),
                         CT_ERR_INVALID_ARG, "ct_batch_norm");
    tu_assert_null_error(ct_group_norm(x, 2, NULL, NULL, 1e-5), CT_ERR_INVALID_ARG,
                         "ct_group_norm", "divisible by num_groups");
    tu_assert_null_error(ct_group_norm(x, 0, NULL, NULL, 1e-5), CT_ERR_INVALID_ARG,
                         "ct_group_norm");
    tu_assert_null_error(ct_instance_norm(one, NULL, NULL, NULL, NULL, true, 0.1, 1e-5),
                         CT_ERR_SHAPE, "ct_instance_norm", "at least 3 dims");
    ct_tensor *x1 = ct_tensor_zeros(3, P(2, 3, 1), CT_F32, CT_CPU);
    tu_assert_null_error(ct_instance_norm(x1, NULL, NULL, NULL, NULL, true, 0.1, 1e-5),
                         CT_ERR_SHAPE, "ct_instance_norm", "more than 1 spatial element");
    ct_tensor *sm = ct_tensor_zeros(1, P(3), CT_F32, CT_CPU), *sv = ct_tensor_ones(1, P(3), CT_F32, CT_CPU);
    ct_tensor *smd = ct_tensor_zeros(1, P(3), CT_F64, CT_CPU), *dxo = NULL;
    tu_assert_error(ct_batch_norm_backward(x, x, NULL, sm, sv, true, 1e-5, NULL, NULL, NULL),
                    CT_ERR_INVALID_ARG, "ct_batch_norm_backward", "no gradient");
    tu_assert_error(ct_batch_norm_backward(x, x, NULL, smd, sv, true, 1e-5, &dxo, NULL, NULL),
                    CT_ERR_DTYPE, "ct_batch_norm_backward", "float32");
    tu_assert_error(ct_batch_norm_backward(one, x, NULL, sm, sv, true, 1e-5, &dxo, NULL, NULL),
                    CT_ERR_SHAPE, "ct_batch_norm_backward", "grad_y");
    assert_null(dxo);
    release_all(3, (ct_tensor *[]){sm, sv, smd});
    /* the running statistics are untouched by a refused call */
    double zeros[3] = {0, 0, 0};
    check_values(rm, zeros, 3, 0, 0);
    release_all(7, (ct_tensor *[]){x, one, w4, w3d, xi, rm, x1});
}

/* ---- convolution ---------------------------------------------------------------------------- */

/* y [N, Co, OL] of x [N, C, L] and w [Co, C/g, K]. */
static void ref_conv1d(const double *x, const double *w, const double *b, int64_t N, int64_t C,
                       int64_t L, int64_t Co, int64_t K, int64_t s, int64_t p, int64_t d,
                       int64_t g, int64_t OL, double *y) {
    int64_t cg = C / g, cog = Co / g;
    for (int64_t n = 0; n < N; n++)
        for (int64_t co = 0; co < Co; co++)
            for (int64_t o = 0; o < OL; o++) {
                double acc = b ? b[co] : 0;
                for (int64_t c = 0; c < cg; c++)
                    for (int64_t k = 0; k < K; k++) {
                        int64_t l = o * s - p + k * d;
                        if (l < 0 || l >= L) continue;
                        acc += w[(co * cg + c) * K + k] * x[(n * C + co / cog * cg + c) * L + l];
                    }
                y[(n * Co + co) * OL + o] = acc;
            }
}

static void test_conv1d(void **state) {
    (void)state;
    for (size_t k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        for (int v = 0; v < 2; v++) {
            int64_t g = tu_randint(1, 3), N = tu_randint(1, 3), C = g * tu_randint(1, 3),
                    Co = g * tu_randint(1, 3), K = tu_randint(1, 4), s = tu_randint(1, 3),
                    p = tu_randint(0, 3), d = tu_randint(1, 3), L = d * (K - 1) + tu_randint(1, 8);
            int64_t OL = (L + 2 * p - d * (K - 1) - 1) / s + 1;
            double *vx, *vw, *vb;
            ct_tensor *x = input(3, P(N, C, L), dt, -1, 1, v == 1, &vx);
            ct_tensor *w = input(3, P(Co, C / g, K), dt, -1, 1, v == 1, &vw);
            ct_tensor *b = input(1, &Co, dt, -1, 1, false, &vb);
            double *ref = malloc(sizeof(double) * (size_t)(N * Co * OL));
            ref_conv1d(vx, vw, vb, N, C, L, Co, K, s, p, d, g, OL, ref);
            poison(N * Co * OL);
            ct_tensor *y = ct_conv1d(x, w, b, s, p, d, g);
            expect(y, dt, 3, P(N, Co, OL), ref, tol_of(dt) * 4, tol_of(dt) * 4 * (double)(C * K));
            ct_tensor_release(y);
            /* an unbatched [C, L] input */
            ct_tensor *x0 = ct_select(x, 0, 0);
            y = ct_conv1d(x0, w, b, s, p, d, g);
            expect(y, dt, 2, P(Co, OL), ref, tol_of(dt) * 4, tol_of(dt) * 4 * (double)(C * K));
            ct_tensor_release(y);
            ct_tensor_release(x0);
            free(ref);
            free(vx);
            free(vw);
            free(vb);
            release_all(3, (ct_tensor *[]){x, w, b});
        }
    }
    ct_tensor *x = ct_tensor_zeros(3, P(1, 2, 5), CT_F32, CT_CPU);
    ct_tensor *w4 = ct_tensor_zeros(4, P(1, 2, 1, 3), CT_F32, CT_CPU);
    ct_tensor *w = ct_tensor_zeros(3, P(1, 2, 9), CT_F32, CT_CPU);
    tu_assert_null_error(ct_conv1d(x, w4, NULL, 1, 0, 1, 1), CT_ERR_SHAPE, "ct_conv1d", "3-d weight");
    tu_assert_null_error(ct_conv1d(w4, w, NULL, 1, 0, 1, 1), CT_ERR_SHAPE, "ct_conv1d", "input");
    tu_assert_null_error(ct_conv1d(x, w, NULL, 1, 0, 1, 1), CT_ERR_SHAPE, "ct_conv1d", "kernel");
    tu_assert_null_error(ct_conv1d(x, w, NULL, 0, 0, 1, 1), CT_ERR_INVALID_ARG, "ct_conv1d",
                         "stride");
    release_all(3, (ct_tensor *[]){x, w4, w});
}

/* y [N, Co, OH, OW] of x [N, Ci, H, W] and w [Ci, Co/g, kh, kw], scattered. */
typedef struct tgeo {
    int64_t N, Ci, H, W, Co, kh, kw, s[2], p[2], op[2], d[2], g, OH, OW;
} tgeo;

static void ref_conv_t(const tgeo *t, const double *x, const double *w, const double *b,
                       double *y) {
    int64_t cig = t->Ci / t->g, cog = t->Co / t->g;
    for (int64_t i = 0; i < t->N * t->Co * t->OH * t->OW; i++)
        y[i] = b ? b[i / (t->OH * t->OW) % t->Co] : 0;
    for (int64_t n = 0; n < t->N; n++)
        for (int64_t ci = 0; ci < t->Ci; ci++)
            for (int64_t h = 0; h < t->H; h++)
                for (int64_t ww = 0; ww < t->W; ww++) {
                    double xv = x[((n * t->Ci + ci) * t->H + h) * t->W + ww];
                    for (int64_t c = 0; c < cog; c++)
                        for (int64_t i = 0; i < t->kh; i++)
                            for (int64_t j = 0; j < t->kw; j++) {
                                int64_t oh = h * t->s[0] - t->p[0] + i * t->d[0];
                                int64_t ow = ww * t->s[1] - t->p[1] + j * t->d[1];
                                if (oh < 0 || oh >= t->OH || ow < 0 || ow >= t->OW) continue;
                                int64_t co = ci / cig * cog + c;
                                y[((n * t->Co + co) * t->OH + oh) * t->OW + ow] +=
                                    xv * w[((ci * cog + c) * t->kh + i) * t->kw + j];
                            }
                }
}

static tgeo rand_tgeo(void) {
    tgeo t;
    t.g = tu_randint(1, 3);
    t.N = tu_randint(1, 3);
    t.Ci = t.g * tu_randint(1, 3);
    t.Co = t.g * tu_randint(1, 3);
    t.H = tu_randint(1, 5);
    t.W = tu_randint(1, 5);
    t.kh = tu_randint(1, 4);
    t.kw = tu_randint(1, 4);
    for (int d = 0; d < 2; d++) {
        t.s[d] = tu_randint(1, 4);
        t.d[d] = tu_randint(1, 3);
        t.op[d] = tu_randint(0, t.s[d]);
        t.p[d] = tu_randint(0, 2);
    }
    t.OH = (t.H - 1) * t.s[0] - 2 * t.p[0] + t.d[0] * (t.kh - 1) + t.op[0] + 1;
    t.OW = (t.W - 1) * t.s[1] - 2 * t.p[1] + t.d[1] * (t.kw - 1) + t.op[1] + 1;
    if (t.OH < 1 || t.OW < 1) { /* padding too large for this draw: none */
        t.p[0] = t.p[1] = 0;
        t.OH = (t.H - 1) * t.s[0] + t.d[0] * (t.kh - 1) + t.op[0] + 1;
        t.OW = (t.W - 1) * t.s[1] + t.d[1] * (t.kw - 1) + t.op[1] + 1;
    }
    return t;
}

static void test_conv_transpose2d(void **state) {
    (void)state;
    for (size_t k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        for (int v = 0; v < 3; v++) {
            tgeo t = rand_tgeo();
            double *vx, *vw, *vb;
            ct_tensor *x = input(4, P(t.N, t.Ci, t.H, t.W), dt, -1, 1, v == 1, &vx);
            ct_tensor *w = input(4, P(t.Ci, t.Co / t.g, t.kh, t.kw), dt, -1, 1, v == 1, &vw);
            ct_tensor *b = input(1, &t.Co, dt, -1, 1, false, &vb);
            int64_t n = t.N * t.Co * t.OH * t.OW;
            double *ref = malloc(sizeof(double) * (size_t)n);
            ref_conv_t(&t, vx, vw, v == 2 ? NULL : vb, ref);
            poison(n);
            ct_tensor *y = ct_conv_transpose2d(x, w, v == 2 ? NULL : b, t.s, t.p, t.op, t.g, t.d);
            double tol = tol_of(dt) * 4 * (double)(t.Ci * t.kh * t.kw);
            expect(y, dt, 4, P(t.N, t.Co, t.OH, t.OW), ref, tol_of(dt) * 4, tol);
            ct_tensor_release(y);
            if (t.N == 1) { /* unbatched */
                ct_tensor *x0 = ct_select(x, 0, 0);
                y = ct_conv_transpose2d(x0, w, v == 2 ? NULL : b, t.s, t.p, t.op, t.g, t.d);
                expect(y, dt, 3, P(t.Co, t.OH, t.OW), ref, tol_of(dt) * 4, tol);
                ct_tensor_release(y);
                ct_tensor_release(x0);
            }
            free(ref);
            free(vx);
            free(vw);
            free(vb);
            release_all(3, (ct_tensor *[]){x, w, b});
        }
    }
}

typedef struct { tgeo t; } ct_ctx;
static ct_tensor *convt_fn(ct_tensor *const *in, void *ctx) {
    const tgeo *t = ctx;
    return ct_conv_transpose2d(in[0], in[1], in[2], t->s, t->p, t->op, t->g, t->d);
}
typedef struct { int64_t s, p, d, g; } c1_ctx;
static ct_tensor *conv1d_fn(ct_tensor *const *in, void *ctx) {
    const c1_ctx *c = ctx;
    return ct_conv1d(in[0], in[1], in[2], c->s, c->p, c->d, c->g);
}

static void test_conv_grads(void **state) {
    (void)state;
    for (int r = 0; r < 3; r++) {
        tgeo t = rand_tgeo();
        ct_tensor *in[3] = {input(4, P(t.N, t.Ci, t.H, t.W), CT_F64, -1, 1, r == 1, NULL),
                            input(4, P(t.Ci, t.Co / t.g, t.kh, t.kw), CT_F64, -1, 1, false, NULL),
                            input(1, &t.Co, CT_F64, -1, 1, false, NULL)};
        for (int i = 0; i < 3; i++) assert_int_equal(ct_requires_grad_(in[i], true), CT_OK);
        gradcheck_ok("conv_transpose2d", convt_fn, &t, 3, in);
        release_all(3, in);
    }
    c1_ctx c = {2, 1, 2, 2};
    ct_tensor *in[3] = {input(3, P(2, 4, 9), CT_F64, -1, 1, false, NULL),
                        input(3, P(4, 2, 3), CT_F64, -1, 1, false, NULL),
                        input(1, P(4), CT_F64, -1, 1, false, NULL)};
    for (int i = 0; i < 3; i++) assert_int_equal(ct_requires_grad_(in[i], true), CT_OK);
    gradcheck_ok("conv1d", conv1d_fn, &c, 3, in);
    release_all(3, in);
}

static void test_conv_transpose2d_errors(void **state) {
    (void)state;
    ct_tensor *x = ct_tensor_zeros(4, P(1, 4, 3, 3), CT_F32, CT_CPU);
    ct_tensor *w = ct_tensor_zeros(4, P(4, 2, 3, 3), CT_F32, CT_CPU);
    ct_tensor *w3 = ct_tensor_zeros(4, P(3, 2, 3, 3), CT_F32, CT_CPU);
    ct_tensor *wd = ct_tensor_zeros(4, P(4, 2, 3, 3), CT_F64, CT_CPU);
    ct_tensor *b = ct_tensor_zeros(1, P(3), CT_F32, CT_CPU);
    tu_assert_null_error(ct_conv_transpose2d(x, w, NULL, P(2, 2), NULL, P(2, 0), 1, NULL),
                         CT_ERR_INVALID_ARG, "ct_conv_transpose2d", "output_padding");
    tu_assert_null_error(ct_conv_transpose2d(x, w3, NULL, NULL, NULL, NULL, 1, NULL),
                         CT_ERR_SHAPE, "ct_conv_transpose2d", "input channels");
    tu_assert_null_error(ct_conv_transpose2d(x, wd, NULL, NULL, NULL, NULL, 1, NULL),
                         CT_ERR_DTYPE, "ct_conv_transpose2d", "dtype");
    tu_assert_null_error(ct_conv_transpose2d(x, w, b, NULL, NULL, NULL, 1, NULL), CT_ERR_SHAPE,
                         "ct_conv_transpose2d", "bias");
    tu_assert_null_error(ct_conv_transpose2d(x, w, NULL, NULL, P(5, 5), NULL, 1, NULL),
                         CT_ERR_SHAPE, "ct_conv_transpose2d", "output size");
    tu_assert_null_error(ct_conv_transpose2d(x, w, NULL, NULL, NULL, NULL, 3, NULL),
                         CT_ERR_SHAPE, "ct_conv_transpose2d", "groups");
    tu_assert_null_error(ct_conv_transpose2d(x, NULL, NULL, NULL, NULL, NULL, 1, NULL),
                         CT_ERR_INVALID_ARG, "ct_conv_transpose2d");
    release_all(5, (ct_tensor *[]){x, w, w3, wd, b});
}

/* ---- pooling -------------------------------------------------------------------------------- */

static int64_t pool_len(int64_t L, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
    int64_t num = L + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t o = num / s + 1;
    if (ceil_mode && (o - 1) * s >= L + p) o--;
    return o;
}

static void test_pool1d(void **state) {
    (void)state;
    for (size_t kk = 0; kk < 4; kk++) {
        ct_dtype dt = tu_float_dtypes[kk];
        for (int v = 0; v < 2; v++) {
            int64_t N = tu_randint(1, 3), C = tu_randint(1, 4), k = tu_randint(1, 5),
                    s = tu_randint(0, 3), d = tu_randint(1, 3), p = tu_randint(0, k / 2 + 1);
            int64_t L = d * (k - 1) + tu_randint(1, 9);
            bool ceil_mode = v == 1, cip = tu_next() & 1;
            int64_t st = s ? s : k;
            int64_t OL = pool_len(L, k, st, p, d, ceil_mode);
            double *vx;
            ct_tensor *x = input(3, P(N, C, L), dt, -4, 4, v == 1, &vx);
            /* undilated windows give the most outputs (the average's below) */
            int64_t most = pool_len(L, k, st, p, 1, ceil_mode);
            double *ref = malloc(sizeof(double) * (size_t)(N * C * most));
            double *ridx = malloc(sizeof(double) * (size_t)(N * C * most));
            for (int64_t pl = 0; pl < N * C; pl++)
                for (int64_t o = 0; o < OL; o++) {
                    double best = -INFINITY;
                    int64_t bi = -1;
                    for (int64_t j = 0; j < k; j++) {
                        int64_t l = o * st - p + j * d;
                        if (l < 0 || l >= L) continue;
                        if (bi < 0 || vx[pl * L + l] > best) {
                            best = vx[pl * L + l];
                            bi = l;
                        }
                    }
                    ref[pl * OL + o] = best;
                    ridx[pl * OL + o] = (double)bi;
                }
            poison(N * C * OL);
            ct_tensor *idx = NULL;
            ct_tensor *y = ct_max_pool1d(x, k, s, p, d, ceil_mode, &idx);
            expect(y, dt, 3, P(N, C, OL), ref, 0, 0);
            expect(idx, CT_I64, 3, P(N, C, OL), ridx, 0, 0);
            ct_tensor_release(y);
            ct_tensor_release(idx);
            /* average (no dilation) */
            if (p <= k / 2) {
                OL = pool_len(L, k, st, p, 1, ceil_mode);
                for (int64_t pl = 0; pl < N * C; pl++)
                    for (int64_t o = 0; o < OL; o++) {
                        int64_t l0 = o * st - p, l1 = l0 + k;
                        if (l1 > L + p) l1 = L + p;
                        int64_t padded = l1 - l0;
                        double sum = 0;
                        int64_t in = 0;
                        for (int64_t l = l0; l < l1; l++)
                            if (l >= 0 && l < L) {
                                sum += vx[pl * L + l];
                                in++;
                            }
                        ref[pl * OL + o] = sum / (double)(cip ? padded : in);
                    }
                poison(N * C * OL);
                y = ct_avg_pool1d(x, k, s, p, ceil_mode, cip);
                expect(y, dt, 3, P(N, C, OL), ref, tol_of(dt) * 4, tol_of(dt) * 8);
                ct_tensor_release(y);
            }
            free(ref);
            free(ridx);
            free(vx);
            ct_tensor_release(x);
        }
    }
    ct_tensor *x = ct_tensor_zeros(4, P(1, 1, 2, 2), CT_F32, CT_CPU);
    tu_assert_null_error(ct_max_pool1d(x, 2, 0, 0, 1, false, NULL), CT_ERR_SHAPE,
                         "ct_max_pool1d", "3-d");
    ct_tensor *x3 = ct_tensor_zeros(3, P(1, 1, 4), CT_F32, CT_CPU);
    tu_assert_null_error(ct_avg_pool1d(x3, 0, 0, 0, false, true), CT_ERR_INVALID_ARG,
                         "ct_avg_pool1d", "kernel_size");
    tu_assert_null_error(ct_avg_pool1d(x3, 2, 0, 2, false, true), CT_ERR_INVALID_ARG,
                         "ct_avg_pool1d", "padding");
    ct_tensor_release(x);
    ct_tensor_release(x3);
}

static int64_t ad_lo(int64_t i, int64_t in, int64_t out) { return i * in / out; }
static int64_t ad_hi(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

static void test_adaptive_pools(void **state) {
    (void)state;
    /* output sizes that do not divide the input, and larger than it */
    static const int64_t sizes[][4] = {{7, 5, 3, 2}, {5, 7, 4, 3}, {3, 4, 5, 6}, {6, 6, 4, 6},
                                       {1, 9, 1, 4}};
    for (size_t kk = 0; kk < 4; kk++) {
        ct_dtype dt = tu_float_dtypes[kk];
        for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
            int64_t N = tu_randint(1, 3), C = tu_randint(1, 3), H = sizes[c][0], W = sizes[c][1],
                    OH = sizes[c][2], OW = sizes[c][3];
            double *vx;
            ct_tensor *x = input(4, P(N, C, H, W), dt, -4, 4, c % 2 == 1, &vx);
            int64_t n = N * C * OH * OW;
            double *ravg = malloc(sizeof(double) * (size_t)n), *rmax = malloc(sizeof(double) * (size_t)n),
                   *ridx = malloc(sizeof(double) * (size_t)n);
            for (int64_t pl = 0; pl < N * C; pl++)
                for (int64_t i = 0; i < OH; i++)
                    for (int64_t j = 0; j < OW; j++) {
                        double s = 0, best = -INFINITY;
                        int64_t bi = -1, cnt = 0;
                        for (int64_t h = ad_lo(i, H, OH); h < ad_hi(i, H, OH); h++)
                            for (int64_t w = ad_lo(j, W, OW); w < ad_hi(j, W, OW); w++) {
                                double v = vx[pl * H * W + h * W + w];
                                s += v;
                                cnt++;
                                if (bi < 0 || v > best) {
                                    best = v;
                                    bi = h * W + w;
                                }
                            }
                        int64_t o = (pl * OH + i) * OW + j;
                        ravg[o] = s / (double)cnt;
                        rmax[o] = best;
                        ridx[o] = (double)bi;
                    }
            poison(n);
            ct_tensor *y = ct_adaptive_avg_pool2d(x, OH, OW);
            expect(y, dt, 4, P(N, C, OH, OW), ravg, tol_of(dt) * 4, tol_of(dt) * 8);
            ct_tensor_release(y);
            poison(n);
            ct_tensor *idx = NULL;
            y = ct_adaptive_max_pool2d(x, OH, OW, &idx);
            expect(y, dt, 4, P(N, C, OH, OW), rmax, 0, 0);
            expect(idx, CT_I64, 4, P(N, C, OH, OW), ridx, 0, 0);
            ct_tensor_release(y);
            ct_tensor_release(idx);
            free(ravg);
            free(rmax);
            free(ridx);
            free(vx);
            ct_tensor_release(x);
        }
    }
    /* NaN wins the window */
    double v[4] = {1, NAN, 3, 2};
    ct_tensor *x = tu_from_f64(v, 3, P(1, 2, 2), CT_F32);
    ct_tensor *idx = NULL;
    ct_tensor *y = ct_adaptive_max_pool2d(x, 1, 1, &idx);
    double nanv = NAN, one = 1;
    expect(y, CT_F32, 3, P(1, 1, 1), &nanv, 0, 0);
    expect(idx, CT_I64, 3, P(1, 1, 1), &one, 0, 0);
    release_all(3, (ct_tensor *[]){x, y, idx});
    x = ct_tensor_zeros(4, P(1, 1, 2, 2), CT_F32, CT_CPU);
    tu_assert_null_error(ct_adaptive_max_pool2d(x, 0, 1, NULL), CT_ERR_INVALID_ARG,
                         "ct_adaptive_max_pool2d", "positive");
    ct_tensor *xi = ct_tensor_zeros(4, P(1, 1, 2, 2), CT_I32, CT_CPU);
    tu_assert_null_error(ct_adaptive_max_pool2d(xi, 1, 1, NULL), CT_ERR_DTYPE,
                         "ct_adaptive_max_pool2d", "int32");
    ct_tensor *x2 = ct_tensor_zeros(2, P(2, 2), CT_F32, CT_CPU);
    tu_assert_null_error(ct_adaptive_max_pool2d(x2, 1, 1, NULL), CT_ERR_SHAPE,
                         "ct_adaptive_max_pool2d", "3-d");
    release_all(3, (ct_tensor *[]){x, xi, x2});
}

static ct_tensor *amax_fn(ct_tensor *const *in, void *ctx) {
    const int64_t *o = ctx;
    return ct_adaptive_max_pool2d(in[0], o[0], o[1], NULL);
}
static ct_tensor *aavg_fn(ct_tensor *const *in, void *ctx) {
    const int64_t *o = ctx;
    return ct_adaptive_avg_pool2d(in[0], o[0], o[1]);
}
static ct_tensor *mp1_fn(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_max_pool1d(in[0], 3, 2, 1, 1, false, NULL);
}
static ct_tensor *ap1_fn(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_avg_pool1d(in[0], 3, 2, 1, true, false);
}

static void test_pool_grads(void **state) {
    (void)state;
    /* distinct values, so finite differences never cross a tie */
    double v[2 * 3 * 7 * 5];
    for (int i = 0; i < 2 * 3 * 7 * 5; i++) v[i] = (double)((i * 37) % 210) / 50.0 - 2;
    ct_tensor *x = leaf_of(v, 4, P(2, 3, 7, 5), CT_F64);
    int64_t out[2] = {3, 4};
    gradcheck_ok("adaptive_max_pool2d", amax_fn, out, 1, &x);
    gradcheck_ok("adaptive_avg_pool2d", aavg_fn, out, 1, &x);
    ct_tensor *x3 = leaf_of(v, 3, P(2, 3, 35), CT_F64);
    gradcheck_ok("max_pool1d", mp1_fn, NULL, 1, &x3);
    gradcheck_ok("avg_pool1d", ap1_fn, NULL, 1, &x3);
    ct_tensor_release(x);
    ct_tensor_release(x3);
}

/* ---- nn layers ------------------------------------------------------------------------------ */

static void test_nn_layers(void **state) {
    (void)state;
    ct_nn_batch_norm2d *bn = ct_nn_batch_norm2d_new(3, 1e-5, 0.1, true, true, CT_F32, CT_CPU);
    assert_non_null(bn);
    ct_params *p = ct_params_new(), *bufs = ct_params_new();
    assert_int_equal(ct_nn_batch_norm2d_params(bn, "bn", p), CT_OK);
    assert_int_equal(ct_nn_batch_norm2d_buffers(bn, "bn", bufs), CT_OK);
    assert_int_equal(ct_params_count(p), 2);
    assert_int_equal(ct_params_count(bufs), 2);
    assert_non_null(ct_params_find(bufs, "bn.running_var"));
    assert_false(ct_requires_grad(bn->running_mean));
    assert_true(ct_requires_grad(bn->weight));
    double *vx;
    ct_tensor *x = input(4, P(4, 3, 2, 2), CT_F32, 1, 3, false, &vx);
    ct_tensor *y = ct_nn_batch_norm2d_forward(bn, x);
    assert_non_null(y);
    double *rm = tu_values(bn->running_mean);
    for (int c = 0; c < 3; c++) assert_true(rm[c] > 0.05); /* moved toward the batch mean */
    free(rm);
    backward_ones(y);
    assert_non_null(ct_grad(bn->weight));
    ct_tensor_release(y);
    bn->training = false; /* eval: the running statistics, which stay */
    double *rm0 = tu_values(bn->running_mean);
    y = ct_nn_batch_norm2d_forward(bn, x);
    assert_non_null(y);
    check_values(bn->running_mean, rm0, 3, 0, 0);
    free(rm0);
    ct_tensor_release(y);
    ct_tensor *bad = ct_tensor_zeros(4, P(4, 2, 2, 2), CT_F32, CT_CPU);
    tu_assert_null_error(ct_nn_batch_norm2d_forward(bn, bad), CT_ERR_SHAPE,
                         "ct_nn_batch_norm2d_forward", "[N, 3, H, W]");
    ct_nn_batch_norm2d_free(bn);

    ct_nn_group_norm *gn = ct_nn_group_norm_new(3, 3, 1e-5, true, CT_F32, CT_CPU);
    assert_non_null(gn);
    y = ct_nn_group_norm_forward(gn, x);
    check_shape(y, 4, P(4, 3, 2, 2));
    ct_tensor_release(y);
    ct_nn_group_norm_free(gn);
    tu_assert_null_error(ct_nn_group_norm_new(2, 3, 1e-5, true, CT_F32, CT_CPU),
                         CT_ERR_INVALID_ARG, "ct_nn_group_norm_new", "divisible");

    ct_nn_instance_norm2d *in = ct_nn_instance_norm2d_new(3, 1e-5, 0.1, false, true, CT_F16, CT_CPU);
    assert_non_null(in);
    assert_null(in->weight);
    assert_int_equal(ct_tensor_dtype(in->running_mean), CT_F32);
    ct_tensor *xh = ct_to_dtype(x, CT_F16);
    y = ct_nn_instance_norm2d_forward(in, xh);
    assert_non_null(y);
    assert_int_equal(ct_tensor_dtype(y), CT_F16);
    ct_tensor_release(y);
    ct_tensor_release(xh);
    ct_nn_instance_norm2d_free(in);

    ct_nn_conv1d *c1 = ct_nn_conv1d_new(3, 4, 3, 1, 1, 1, 1, true, CT_F32, CT_CPU, NULL);
    assert_non_null(c1);
    ct_tensor *x1 = ct_reshape(x, 3, P(4, 3, 4));
    y = ct_nn_conv1d_forward(c1, x1);
    check_shape(y, 3, P(4, 4, 4));
    ct_tensor_release(y);
    assert_int_equal(ct_nn_conv1d_params(c1, "c1", p), CT_OK);
    ct_nn_conv1d_free(c1);
    ct_tensor_release(x1);

    ct_nn_conv_transpose2d *ctp = ct_nn_conv_transpose2d_new(3, 2, P(3, 3), P(2, 2), P(1, 1),
                                                              P(1, 1), 1, true, NULL, CT_F32,
                                                              CT_CPU, NULL);
    assert_non_null(ctp);
    check_shape(ctp->weight, 4, P(3, 2, 3, 3));
    y = ct_nn_conv_transpose2d_forward(ctp, x);
    check_shape(y, 4, P(4, 2, 4, 4));
    ct_tensor_release(y);
    ct_nn_conv_transpose2d_free(ctp);
    tu_assert_null_error(ct_nn_conv_transpose2d_new(3, 2, P(3, 3), P(1, 1), NULL, P(1, 1), 1,
                                                    true, NULL, CT_F32, CT_CPU, NULL),
                         CT_ERR_INVALID_ARG, "ct_nn_conv_transpose2d_new", "output_padding");
    ct_params_free(p);
    ct_params_free(bufs);
    ct_tensor_release(bad);
    /* the running statistics go into a checkpoint beside the parameters */
    ct_nn_batch_norm2d *b1 = ct_nn_batch_norm2d_new(3, 1e-5, 0.1, true, true, CT_F32, CT_CPU);
    ct_nn_batch_norm2d *b2 = ct_nn_batch_norm2d_new(3, 1e-5, 0.1, true, true, CT_F32, CT_CPU);
    ct_params *l1 = ct_params_new(), *l2 = ct_params_new();
    assert_int_equal(ct_nn_batch_norm2d_params(b1, "bn", l1), CT_OK);
    assert_int_equal(ct_nn_batch_norm2d_buffers(b1, "bn", l1), CT_OK);
    assert_int_equal(ct_nn_batch_norm2d_params(b2, "bn", l2), CT_OK);
    assert_int_equal(ct_nn_batch_norm2d_buffers(b2, "bn", l2), CT_OK);
    y = ct_nn_batch_norm2d_forward(b1, x); /* moves b1's running statistics */
    ct_tensor_release(y);
    char dir[] = "/tmp/cten_layers_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/bn.safetensors", dir);
    assert_int_equal(ct_checkpoint_save(path, l1, NULL, NULL, NULL), CT_OK);
    assert_int_equal(ct_checkpoint_load(path, l2, NULL, NULL, NULL), CT_OK);
    double *m1 = tu_values(b1->running_var);
    check_values(b2->running_var, m1, 3, 0, 0);
    free(m1);
    tu_rm_dir(dir);
    ct_params_free(l1);
    ct_params_free(l2);
    ct_nn_batch_norm2d_free(b1);
    ct_nn_batch_norm2d_free(b2);
    ct_tensor_release(x);
    free(vx);
}

int main(void) {
    tu_seed();
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_dot_outer),       T(test_integer_matmul),   T(test_baddbmm),
        T(test_einsum_values),   T(test_einsum_grad),      T(test_einsum_errors),
        T(test_linalg_grads),
        T(test_batch_norm),      T(test_group_norm),       T(test_instance_norm),
        T(test_norm_grads),      T(test_norm_errors),      T(test_conv1d),
        T(test_conv_transpose2d), T(test_conv_grads),      T(test_conv_transpose2d_errors),
        T(test_pool1d),          T(test_adaptive_pools),   T(test_pool_grads),
        T(test_nn_layers),
    };
#undef T
    return tu_run_tests(tests);
}
