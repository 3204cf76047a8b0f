/* Tests of matmul, mm, bmm, addmm, linear and linear's weight and bias
 * gradients against float64 loops, the
 * BLAS layouts taken without copies, and the OpenBLAS kernel choice. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "dispatch/dispatch_impl.h"
#include "test_util.h"
#include "test_fixture.h"

/* Part of every OpenBLAS build; the library under test switched its kernels. */
char *openblas_get_corename(void);
/* OpenBLAS's cached OPENBLAS_THREAD_TIMEOUT (0: unset); looked up, as cten does. */
typedef int (*timeout_fn)(void);

#define NDT 4

/* ---- references ------------------------------------------------------------------------------ */

/* torch.matmul on row-major doubles; writes the result's shape and returns
 * its values (caller frees). */
static double *ref_matmul(const double *a, int na, const int64_t *sa, const double *b, int nb,
                          const int64_t *sb, int *rnd, int64_t *rshape) {
    int64_t n = na >= 2 ? sa[na - 2] : 1, k = sa[na - 1];
    int64_t m = nb >= 2 ? sb[nb - 1] : 1;
    int ba = na >= 2 ? na - 2 : 0, bb = nb >= 2 ? nb - 2 : 0;
    int nbt = ba > bb ? ba : bb;
    int64_t bshape[CT_MAX_DIMS], nbatch = 1;
    for (int i = 0; i < nbt; i++) {
        int ia = i - (nbt - ba), ib = i - (nbt - bb);
        int64_t x = ia >= 0 ? sa[ia] : 1, y = ib >= 0 ? sb[ib] : 1;
        bshape[i] = x == 1 ? y : x;
        nbatch *= bshape[i];
    }
    *rnd = 0;
    for (int i = 0; i < nbt; i++) rshape[(*rnd)++] = bshape[i];
    if (na >= 2) rshape[(*rnd)++] = n;
    if (nb >= 2) rshape[(*rnd)++] = m;
    double *out = calloc((size_t)(nbatch * n * m + 1), sizeof(double));
    for (int64_t t = 0; t < nbatch; t++) {
        /* batch index -> offsets of a and b, with broadcasting */
        int64_t rem = t, oa = 0, ob = 0, ma = n * k, mb = k * m;
        for (int i = nbt - 1; i >= 0; i--) {
            int64_t idx = rem % bshape[i];
            rem /= bshape[i];
            int ia = i - (nbt - ba), ib = i - (nbt - bb);
            if (ia >= 0) {
                if (sa[ia] != 1) oa += idx * ma;
                ma *= sa[ia];
            }
            if (ib >= 0) {
                if (sb[ib] != 1) ob += idx * mb;
                mb *= sb[ib];
            }
        }
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++) s += a[oa + i * k + p] * b[ob + p * m + j];
                out[t * n * m + i * m + j] = s;
            }
    }
    return out;
}

/* Tolerance for a dot product of length k over values in [-1, 1]. */
static double atol_for(ct_dtype dt, int64_t k) {
    return (dt == CT_F64 ? 1e-13 : 2e-6) * (double)(k + 1);
}

/* Asserts t has shape (nd, shape) and values close to ref. */
static void check_result(ct_tensor *t, int nd, const int64_t *shape, const double *ref,
                         ct_dtype dt, int64_t k) {
    assert_non_null(t);
    assert_int_equal(ct_tensor_dtype(t), dt);
    assert_int_equal(ct_tensor_ndim(t), nd);
    for (int i = 0; i < nd; i++) assert_int_equal(ct_tensor_shape(t)[i], shape[i]);
    int64_t n = tu_numel(nd, shape);
    double *got = tu_values(t);
    tu_assert_close(got, ref, n, tu_rtol(dt), atol_for(dt, k));
    free(got);
}

/* Runs ct_matmul(a, b) and checks it against the reference on a's and b's values. */
static void check_matmul(ct_tensor *a, ct_tensor *b) {
    ct_dtype dt = ct_tensor_dtype(a);
    double *va = tu_values(a), *vb = tu_values(b);
    int rnd;
    int64_t rshape[CT_MAX_DIMS];
    double *ref = ref_matmul(va, ct_tensor_ndim(a), ct_tensor_shape(a), vb, ct_tensor_ndim(b),
                             ct_tensor_shape(b), &rnd, rshape);
    ct_tensor *r = ct_matmul(a, b);
    if (!r) fprintf(stderr, "ct_matmul failed: %s\n", ct_last_error());
    check_result(r, rnd, rshape, ref, dt, ct_tensor_shape(a)[ct_tensor_ndim(a) - 1]);
    ct_tensor_release(r);
    free(ref);
    free(va);
    free(vb);
}

/* A random tensor whose values are seen through a transposed (last two dims
 * swapped) view: storage [.., cols, rows], view [.., rows, cols]. */
static ct_tensor *rand_transposed(int nd, const int64_t *shape, ct_dtype dt) {
    int64_t s[CT_MAX_DIMS];
    memcpy(s, shape, (size_t)nd * sizeof *s);
    s[nd - 1] = shape[nd - 2];
    s[nd - 2] = shape[nd - 1];
    ct_tensor *base = tu_rand(nd, s, dt, -1, 1, NULL);
    ct_tensor *v = ct_transpose(base, nd - 2, nd - 1);
    ct_tensor_release(base);
    return v;
}

/* A random [rows, cols] view of a wider storage: columns [2, 2 + cols) of a
 * [rows, cols + 5] tensor, so the row stride exceeds the width. */
static ct_tensor *rand_narrowed(int64_t rows, int64_t cols, ct_dtype dt) {
    ct_tensor *base = tu_rand(2, (const int64_t[]){rows, cols + 5}, dt, -1, 1, NULL);
    ct_tensor *v = ct_narrow(base, 1, 2, cols);
    ct_tensor_release(base);
    return v;
}

/* ---- ct_mm ----------------------------------------------------------------------------------- */

static void test_mm_shapes(void **state) {
    (void)state;
    static const int64_t sizes[][3] = {{1, 1, 1},   {3, 4, 5},   {17, 33, 9}, {64, 70, 65},
                                       {1, 40, 1},  {40, 1, 40}, {0, 3, 4},   {3, 0, 4},
                                       {3, 4, 0},   {130, 257, 66}};
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            int64_t n = sizes[i][0], k = sizes[i][1], m = sizes[i][2];
            double *va, *vb;
            ct_tensor *a = tu_rand(2, (const int64_t[]){n, k}, dt, -1, 1, &va);
            ct_tensor *b = tu_rand(2, (const int64_t[]){k, m}, dt, -1, 1, &vb);
            int rnd;
            int64_t rs[CT_MAX_DIMS];
            double *ref = ref_matmul(va, 2, ct_tensor_shape(a), vb, 2, ct_tensor_shape(b), &rnd,
                                     rs);
            ct_tensor *r = ct_mm(a, b);
            check_result(r, 2, (const int64_t[]){n, m}, ref, dt, k);
            ct_tensor_release(r);
            free(ref);
            free(va);
            free(vb);
            ct_tensor_release(a);
            ct_tensor_release(b);
        }
    }
}

/* k == 0: the result is zeros, whatever the fresh output memory held. */
static void test_mm_k0_zeros(void **state) {
    (void)state;
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (int rep = 0; rep < 3; rep++) {
            ct_tensor *a = ct_tensor_empty(CT_SHAPE(37, 0), dt, CT_CPU);
            ct_tensor *b = ct_tensor_empty(CT_SHAPE(0, 29), dt, CT_CPU);
            ct_tensor *r = ct_mm(a, b);
            assert_non_null(r);
            double *got = tu_values(r);
            for (int i = 0; i < 37 * 29; i++) assert_true(got[i] == 0.0);
            free(got);
            ct_tensor_release(r);
            ct_tensor_release(a);
            ct_tensor_release(b);
        }
    }
}

/* Runs op on the given views directly and returns the routine the kernel
 * reported (static string), checking the status. */
static const char *dispatch_routine(ct_op op, ct_tensor *input, ct_tensor *a, ct_tensor *b,
                                    ct_tensor *out, double beta, double alpha) {
    cti_gemm_params p = {.beta = beta, .alpha = alpha};
    ct_call c;
    cti_call_init(&c, op);
    cti_call_params(&c, &p);
    int ni = 0;
    if (input) c.in[ni++] = input;
    c.in[ni++] = a;
    c.in[ni++] = b;
    c.nin = ni;
    c.out[0] = out;
    c.nout = 1;
    assert_int_equal(cti_dispatch(&c, CT_CPU, ct_tensor_dtype(out)), CT_OK);
    return c.routine;
}

static const char *gemm_name(ct_dtype dt) {
    switch (dt) {
    case CT_F32: return "cblas_sgemm";
    case CT_F64: return "cblas_dgemm";
    case CT_F16: return "f16->f32 cblas_sgemm";
    default: return "bf16->f32 cblas_sgemm";
    }
}

/* Transposed and column-sliced operands reach BLAS through its transpose
 * flag and leading dimension: right results, and the kernel reports no copy.
 * Element-strided views (tu_noncontig) are copied, and still right. */
static void test_mm_layouts(void **state) {
    (void)state;
    const int64_t n = 23, k = 31, m = 19;
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        bool blas_dtype = dt == CT_F32 || dt == CT_F64;
        for (int la = 0; la < 4; la++)
            for (int lb = 0; lb < 4; lb++) {
                ct_tensor *a, *b;
                ct_tensor *ca = tu_rand(2, (const int64_t[]){n, k}, dt, -1, 1, NULL);
                ct_tensor *cb = tu_rand(2, (const int64_t[]){k, m}, dt, -1, 1, NULL);
                switch (la) {
                case 0: a = ct_tensor_retain(ca); break;
                case 1: a = rand_transposed(2, (const int64_t[]){n, k}, dt); break;
                case 2: a = rand_narrowed(n, k, dt); break;
                default: a = tu_noncontig(ca); break;
                }
                switch (lb) {
                case 0: b = ct_tensor_retain(cb); break;
                case 1: b = rand_transposed(2, (const int64_t[]){k, m}, dt); break;
                case 2: b = rand_narrowed(k, m, dt); break;
                default: b = tu_noncontig(cb); break;
                }
                check_matmul(a, b);

                /* the mm kernel itself, on these very views */
                double *va = tu_values(a), *vb = tu_values(b);
                int rnd;
                int64_t rs[CT_MAX_DIMS];
                double *ref = ref_matmul(va, 2, ct_tensor_shape(a), vb, 2, ct_tensor_shape(b),
                                         &rnd, rs);
                ct_tensor *out = ct_tensor_empty(CT_SHAPE(n, m), dt, CT_CPU);
                const char *routine = dispatch_routine(CT_OP_MM, NULL, a, b, out, 0, 1);
                check_result(out, 2, (const int64_t[]){n, m}, ref, dt, k);
                if (blas_dtype) {
                    char want[64];
                    const char *copies = la == 3 && lb == 3 ? "copy A, B + "
                                         : la == 3          ? "copy A + "
                                         : lb == 3          ? "copy B + "
                                                            : "";
                    snprintf(want, sizeof want, "%s%s", copies, gemm_name(dt));
                    assert_string_equal(routine, want);
                } else {
                    assert_string_equal(routine, gemm_name(dt));
                }
                ct_tensor_release(out);
                free(ref);
                free(va);
                free(vb);
                ct_tensor_release(a);
                ct_tensor_release(b);
                ct_tensor_release(ca);
                ct_tensor_release(cb);
            }
    }
}

/* ---- ct_matmul ------------------------------------------------------------------------------- */

typedef struct {
    int na, nb;
    int64_t sa[4], sb[4];
} shape_pair;

static const shape_pair matmul_cases[] = {
    {1, 1, {4}, {4}},                      /* dot -> 0-d */
    {1, 1, {0}, {0}},                      /* empty dot -> 0 */
    {2, 1, {3, 4}, {4}},                   /* matrix-vector */
    {1, 2, {4}, {4, 5}},                   /* vector-matrix */
    {2, 2, {3, 4}, {4, 5}},
    {3, 2, {2, 3, 4}, {4, 5}},             /* batch folded into rows */
    {3, 1, {2, 3, 4}, {4}},
    {1, 3, {4}, {2, 4, 5}},
    {4, 3, {2, 1, 3, 4}, {5, 4, 2}},       /* broadcast batch dims */
    {2, 3, {3, 4}, {2, 4, 5}},
    {3, 3, {2, 3, 4}, {2, 4, 5}},
    {3, 4, {1, 3, 4}, {2, 1, 4, 5}},
    {3, 4, {2, 3, 4}, {1, 1, 4, 5}},
    {3, 2, {0, 3, 4}, {4, 5}},             /* size 0 */
    {3, 2, {2, 0, 4}, {4, 5}},
    {3, 3, {2, 3, 0}, {2, 0, 5}},          /* k = 0 -> zeros */
    {4, 3, {2, 1, 3, 4}, {0, 4, 2}},
    {3, 3, {4, 9, 33}, {4, 33, 17}},
};

static void test_matmul_shapes(void **state) {
    (void)state;
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (size_t i = 0; i < sizeof matmul_cases / sizeof matmul_cases[0]; i++) {
            const shape_pair *c = &matmul_cases[i];
            ct_tensor *a = tu_rand(c->na, c->sa, dt, -1, 1, NULL);
            ct_tensor *b = tu_rand(c->nb, c->sb, dt, -1, 1, NULL);
            check_matmul(a, b);
            /* the same values in element-strided, transposed storage */
            ct_tensor *an = tu_noncontig(a), *bn = tu_noncontig(b);
            check_matmul(an, bn);
            check_matmul(a, bn);
            ct_tensor_release(an);
            ct_tensor_release(bn);
            ct_tensor_release(a);
            ct_tensor_release(b);
        }
    }
}

/* Batched operands whose last two dims are transposed, and a batch that
 * cannot be folded into rows (batch dim innermost in memory). */
static void test_matmul_batched_views(void **state) {
    (void)state;
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        ct_tensor *at = rand_transposed(3, (const int64_t[]){3, 5, 7}, dt);
        ct_tensor *bt = rand_transposed(3, (const int64_t[]){3, 7, 4}, dt);
        ct_tensor *w = tu_rand(2, (const int64_t[]){7, 6}, dt, -1, 1, NULL);
        check_matmul(at, bt);
        check_matmul(at, w); /* a's batch not mergeable into rows */
        /* a batch-innermost layout: storage [5, 7, 3] permuted to [3, 5, 7] */
        ct_tensor *base = tu_rand(3, (const int64_t[]){5, 7, 3}, dt, -1, 1, NULL);
        ct_tensor *ap = ct_permute(base, CT_DIMS(2, 0, 1));
        check_matmul(ap, w);
        check_matmul(ap, bt);
        /* a 4-d broadcast with a transposed 2-d right operand */
        ct_tensor *a4 = tu_rand(4, (const int64_t[]){2, 1, 5, 7}, dt, -1, 1, NULL);
        ct_tensor *wt = rand_transposed(2, (const int64_t[]){7, 6}, dt);
        check_matmul(a4, wt);
        check_matmul(a4, bt);
        ct_tensor *x[] = {at, bt, w, base, ap, a4, wt};
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) ct_tensor_release(x[i]);
    }
}

/* Broadcast batch dims are passed with stride 0, not expanded: the bmm
 * kernel reports a plain GEMM for [2,1,3,4] @ [5,4,2] seen as [2,5,...]. */
static void test_bmm_broadcast_no_copy(void **state) {
    (void)state;
    for (int d = 0; d < 2; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        ct_tensor *a = tu_rand(4, (const int64_t[]){2, 1, 3, 4}, dt, -1, 1, NULL);
        ct_tensor *b = tu_rand(3, (const int64_t[]){5, 4, 2}, dt, -1, 1, NULL);
        ct_tensor *ae = ct_expand(a, CT_SHAPE(2, 5, 3, 4));
        ct_tensor *be = ct_expand(b, CT_SHAPE(2, 5, 4, 2));
        assert_int_equal(ct_tensor_strides(ae)[1], 0);
        assert_int_equal(ct_tensor_strides(be)[0], 0);
        ct_tensor *out = ct_tensor_empty(CT_SHAPE(2, 5, 3, 2), dt, CT_CPU);
        assert_string_equal(dispatch_routine(CT_OP_BMM, NULL, ae, be, out, 0, 1), gemm_name(dt));
        double *va = tu_values(a), *vb = tu_values(b);
        int rnd;
        int64_t rs[CT_MAX_DIMS];
        double *ref = ref_matmul(va, 4, ct_tensor_shape(a), vb, 3, ct_tensor_shape(b), &rnd, rs);
        check_result(out, rnd, rs, ref, dt, 4);
        free(ref);
        free(va);
        free(vb);
        ct_tensor *x[] = {a, b, ae, be, out};
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) ct_tensor_release(x[i]);
    }
}

/* ---- ct_bmm ---------------------------------------------------------------------------------- */

static void test_bmm(void **state) {
    (void)state;
    static const int64_t sizes[][4] = {{3, 4, 5, 2}, {1, 7, 9, 3}, {0, 2, 3, 4},
                                       {2, 0, 3, 4}, {2, 3, 0, 4}, {5, 16, 33, 8}};
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            int64_t B = sizes[i][0], n = sizes[i][1], k = sizes[i][2], m = sizes[i][3];
            int64_t sa[3] = {B, n, k}, sb[3] = {B, k, m};
            ct_tensor *a = tu_rand(3, sa, dt, -1, 1, NULL);
            ct_tensor *b = tu_rand(3, sb, dt, -1, 1, NULL);
            ct_tensor *bt = rand_transposed(3, sb, dt);
            ct_tensor *an = tu_noncontig(a);
            ct_tensor *pairs[3][2] = {{a, b}, {an, bt}, {a, bt}};
            for (int p = 0; p < 3; p++) {
                double *va = tu_values(pairs[p][0]), *vb = tu_values(pairs[p][1]);
                int rnd;
                int64_t rs[CT_MAX_DIMS];
                double *ref = ref_matmul(va, 3, sa, vb, 3, sb, &rnd, rs);
                ct_tensor *r = ct_bmm(pairs[p][0], pairs[p][1]);
                check_result(r, 3, (const int64_t[]){B, n, m}, ref, dt, k);
                ct_tensor_release(r);
                free(ref);
                free(va);
                free(vb);
            }
            ct_tensor *x[] = {a, b, bt, an};
            for (size_t j = 0; j < sizeof x / sizeof x[0]; j++) ct_tensor_release(x[j]);
        }
    }
}

/* ---- ct_addmm -------------------------------------------------------------------------------- */

static void check_addmm(ct_tensor *input, ct_tensor *m1, ct_tensor *m2, double beta,
                        double alpha) {
    ct_dtype dt = ct_tensor_dtype(m1);
    int64_t n = ct_tensor_shape(m1)[0], k = ct_tensor_shape(m1)[1], m = ct_tensor_shape(m2)[1];
    double *vi = tu_values(input), *v1 = tu_values(m1), *v2 = tu_values(m2);
    int ni = ct_tensor_ndim(input);
    const int64_t *si = ct_tensor_shape(input);
    double *ref = malloc((size_t)(n * m + 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            /* input broadcast to [n, m] */
            int64_t ii = ni == 2 && si[0] != 1 ? i : 0;
            int64_t jj = ni >= 1 && si[ni - 1] != 1 ? j : 0;
            int64_t cols = ni >= 1 ? si[ni - 1] : 1;
            double s = 0;
            for (int64_t p = 0; p < k; p++) s += v1[i * k + p] * v2[p * m + j];
            double in = vi[ii * cols + jj];
            ref[i * m + j] = (beta == 0 ? 0.0 : beta * in) + alpha * s;
        }
    ct_tensor *r = ct_addmm(input, m1, m2, beta, alpha);
    if (!r) fprintf(stderr, "ct_addmm failed: %s\n", ct_last_error());
    double scale = fabs(alpha) + fabs(beta) + 1;
    assert_non_null(r);
    assert_int_equal(ct_tensor_ndim(r), 2);
    assert_int_equal(ct_tensor_shape(r)[0], n);
    assert_int_equal(ct_tensor_shape(r)[1], m);
    double *got = tu_values(r);
    tu_assert_close(got, ref, n * m, tu_rtol(dt), atol_for(dt, k) * scale);
    free(got);
    ct_tensor_release(r);
    free(ref);
    free(vi);
    free(v1);
    free(v2);
}

static void test_addmm(void **state) {
    (void)state;
    static const double coef[][2] = {{1, 1}, {0.5, -2}, {-1.25, 0.75}, {0, 1.5}, {2, 0}};
    const int64_t n = 13, k = 21, m = 11;
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        ct_tensor *inputs[] = {
            tu_rand(2, (const int64_t[]){n, m}, dt, -1, 1, NULL),
            tu_rand(1, (const int64_t[]){m}, dt, -1, 1, NULL),
            tu_rand(2, (const int64_t[]){1, m}, dt, -1, 1, NULL),
            tu_rand(2, (const int64_t[]){n, 1}, dt, -1, 1, NULL),
            tu_rand(0, NULL, dt, -1, 1, NULL),
            rand_transposed(2, (const int64_t[]){n, m}, dt),
        };
        ct_tensor *m1 = tu_rand(2, (const int64_t[]){n, k}, dt, -1, 1, NULL);
        ct_tensor *m2 = tu_rand(2, (const int64_t[]){k, m}, dt, -1, 1, NULL);
        ct_tensor *m1t = rand_transposed(2, (const int64_t[]){n, k}, dt);
        ct_tensor *m2n = tu_noncontig(m2);
        for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
            for (size_t c = 0; c < sizeof coef / sizeof coef[0]; c++) {
                check_addmm(inputs[i], m1, m2, coef[c][0], coef[c][1]);
                check_addmm(inputs[i], m1t, m2n, coef[c][0], coef[c][1]);
            }
        /* k = 0: beta * input only */
        ct_tensor *e1 = ct_tensor_empty(CT_SHAPE(n, 0), dt, CT_CPU);
        ct_tensor *e2 = ct_tensor_empty(CT_SHAPE(0, m), dt, CT_CPU);
        check_addmm(inputs[0], e1, e2, 0.5, 3);
        check_addmm(inputs[1], e1, e2, 0, 3);
        for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
            ct_tensor_release(inputs[i]);
        ct_tensor *x[] = {m1, m2, m1t, m2n, e1, e2};
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) ct_tensor_release(x[i]);
    }
}

/* beta == 0 ignores the input, NaN and Inf included, as PyTorch. */
static void test_addmm_beta0_nan(void **state) {
    (void)state;
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        ct_tensor *input = ct_tensor_full(CT_SHAPE(4, 6), NAN, dt, CT_CPU);
        ct_tensor *inf = ct_tensor_full(CT_SHAPE(6), INFINITY, dt, CT_CPU);
        ct_tensor *m1 = tu_rand(2, (const int64_t[]){4, 5}, dt, -1, 1, NULL);
        ct_tensor *m2 = tu_rand(2, (const int64_t[]){5, 6}, dt, -1, 1, NULL);
        ct_tensor *e1 = ct_tensor_empty(CT_SHAPE(4, 0), dt, CT_CPU);
        ct_tensor *e2 = ct_tensor_empty(CT_SHAPE(0, 6), dt, CT_CPU);
        ct_tensor *ins[] = {input, inf};
        for (int i = 0; i < 2; i++) {
            check_addmm(ins[i], m1, m2, 0, 1.5);
            ct_tensor *r = ct_addmm(ins[i], m1, m2, 0, 1.5);
            double *got = tu_values(r);
            for (int j = 0; j < 24; j++) assert_true(isfinite(got[j]));
            free(got);
            ct_tensor_release(r);
            /* k = 0 and beta = 0: exact zeros */
            r = ct_addmm(ins[i], e1, e2, 0, 1);
            got = tu_values(r);
            for (int j = 0; j < 24; j++) assert_true(got[j] == 0.0);
            free(got);
            ct_tensor_release(r);
        }
        /* beta != 0 keeps NaN */
        ct_tensor *r = ct_addmm(input, m1, m2, 1, 1);
        double *got = tu_values(r);
        for (int j = 0; j < 24; j++) assert_true(isnan(got[j]));
        free(got);
        ct_tensor_release(r);
        ct_tensor *x[] = {input, inf, m1, m2, e1, e2};
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) ct_tensor_release(x[i]);
    }
}

/* The addmm kernel takes the broadcast input and the transposed operands as
 * views: no copy reported. */
static void test_addmm_no_copy(void **state) {
    (void)state;
    for (int d = 0; d < 2; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        ct_tensor *bias = tu_rand(1, (const int64_t[]){6}, dt, -1, 1, NULL);
        ct_tensor *in = ct_expand(bias, CT_SHAPE(4, 6));
        ct_tensor *m1 = rand_transposed(2, (const int64_t[]){4, 5}, dt);
        ct_tensor *m2 = rand_transposed(2, (const int64_t[]){5, 6}, dt);
        ct_tensor *out = ct_tensor_empty(CT_SHAPE(4, 6), dt, CT_CPU);
        assert_string_equal(dispatch_routine(CT_OP_ADDMM, in, m1, m2, out, 1, 1), gemm_name(dt));
        ct_tensor *r = ct_addmm(bias, m1, m2, 1, 1);
        double *got = tu_values(out), *want = tu_values(r);
        tu_assert_close(got, want, 24, tu_rtol(dt), atol_for(dt, 5));
        free(got);
        free(want);
        ct_tensor *x[] = {bias, in, m1, m2, out, r};
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) ct_tensor_release(x[i]);
    }
}

/* ---- ct_linear ------------------------------------------------------------------------------- */

static void check_linear(ct_tensor *x, ct_tensor *w, ct_tensor *bias) {
    ct_dtype dt = ct_tensor_dtype(x);
    int nd = ct_tensor_ndim(x);
    int64_t in = ct_tensor_shape(x)[nd - 1], out = ct_tensor_shape(w)[0];
    int64_t rows = tu_numel(nd - 1, ct_tensor_shape(x));
    double *vx = tu_values(x), *vw = tu_values(w), *vb = bias ? tu_values(bias) : NULL;
    double *ref = malloc((size_t)(rows * out + 1) * sizeof(double));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = vb ? vb[o] : 0.0;
            for (int64_t p = 0; p < in; p++) s += vx[r * in + p] * vw[o * in + p];
            ref[r * out + o] = s;
        }
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, ct_tensor_shape(x), (size_t)nd * sizeof *shape);
    shape[nd - 1] = out;
    ct_tensor *res = ct_linear(x, w, bias);
    if (!res) fprintf(stderr, "ct_linear failed: %s\n", ct_last_error());
    check_result(res, nd, shape, ref, dt, in + 1);
    ct_tensor_release(res);
    free(ref);
    free(vx);
    free(vw);
    free(vb);
}

static void test_linear(void **state) {
    (void)state;
    static const int64_t xshapes[][4] = {{2, 5, 12, 0}, {3, 2, 3, 12}, {1, 12, 0, 0},
                                         {2, 0, 12, 0}, {3, 4, 1, 12}};
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        ct_tensor *w = tu_rand(2, (const int64_t[]){7, 12}, dt, -1, 1, NULL);
        ct_tensor *wn = tu_noncontig(w);
        ct_tensor *bias = tu_rand(1, (const int64_t[]){7}, dt, -1, 1, NULL);
        ct_tensor *bn = tu_noncontig(bias);
        for (size_t i = 0; i < sizeof xshapes / sizeof xshapes[0]; i++) {
            int nd = (int)xshapes[i][0];
            ct_tensor *x = tu_rand(nd, &xshapes[i][1], dt, -1, 1, NULL);
            ct_tensor *xn = tu_noncontig(x);
            check_linear(x, w, bias);
            check_linear(x, w, NULL);
            check_linear(xn, wn, bn);
            check_linear(xn, w, NULL);
            ct_tensor_release(x);
            ct_tensor_release(xn);
        }
        /* in_features = 0: the bias alone */
        ct_tensor *x0 = ct_tensor_empty(CT_SHAPE(3, 0), dt, CT_CPU);
        ct_tensor *w0 = ct_tensor_empty(CT_SHAPE(7, 0), dt, CT_CPU);
        check_linear(x0, w0, bias);
        check_linear(x0, w0, NULL);
        ct_tensor *x[] = {w, wn, bias, bn, x0, w0};
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) ct_tensor_release(x[i]);
    }
}

/* ---- ct_linear_backward_weight ---------------------------------------------------------------- */

/* src/ops/linalg.c: the gradients in dtypes of their own (src/autograd/formulas.h). */
ct_status cti_linear_backward_weight_as(ct_tensor *grad_y, ct_tensor *x, ct_dtype dweight_dtype,
                                        ct_dtype dbias_dtype, ct_tensor **dweight,
                                        ct_tensor **dbias);

/* Checks ct_linear_backward_weight(g, x) against float64 sums over the rows of the leading
 * dims: dweight[o][i] = sum_r g[r][o] x[r][i], dbias[o] = sum_r g[r][o]; asked for both,
 * for each alone, and with x NULL for the bias alone. */
static void check_linear_grads(ct_tensor *g, ct_tensor *x) {
    ct_dtype dt = ct_tensor_dtype(g);
    int nd = ct_tensor_ndim(g);
    int64_t out = ct_tensor_shape(g)[nd - 1], in = ct_tensor_shape(x)[nd - 1];
    int64_t rows = tu_numel(nd - 1, ct_tensor_shape(g));
    double *vg = tu_values(g), *vx = tu_values(x);
    double *rw = calloc((size_t)(out * in + 1), sizeof(double));
    double *rb = calloc((size_t)(out + 1), sizeof(double));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            rb[o] += vg[r * out + o];
            for (int64_t i = 0; i < in; i++) rw[o * in + i] += vg[r * out + o] * vx[r * in + i];
        }
    const int64_t wshape[2] = {out, in};
    /* wide 1-3 (float16/bfloat16 only): the widened gradients autograd asks for
     * (cti_linear_backward_weight_as), both float32, the weight's only, the bias's only:
     * each float32 one within float32's tolerance, which a rounding to dt exceeds */
    bool half = dt == CT_F16 || dt == CT_BF16;
    for (int wide = 0; wide < (half ? 4 : 1); wide++)
        for (int ask = 0; ask < 4; ask++) { /* both, the weight's, the bias's, without x */
            ct_tensor *dw = (ct_tensor *)g, *db = (ct_tensor *)g; /* poison: must be replaced */
            bool want_w = ask <= 1, want_b = ask != 1;
            ct_dtype wdt = wide == 1 || wide == 2 ? CT_F32 : dt;
            ct_dtype bdt = wide == 1 || wide == 3 ? CT_F32 : dt;
            ct_tensor *xa = ask == 3 ? NULL : x, **pw = want_w ? &dw : NULL;
            ct_tensor **pb = want_b ? &db : NULL;
            ct_status st = wide ? cti_linear_backward_weight_as(g, xa, wdt, bdt, pw, pb)
                                : ct_linear_backward_weight(g, xa, pw, pb);
            if (st != CT_OK) fprintf(stderr, "ct_linear_backward_weight: %s\n", ct_last_error());
            assert_int_equal(st, CT_OK);
            if (want_w) {
                check_result(dw, 2, wshape, rw, wdt, rows);
                ct_tensor_release(dw);
            }
            if (want_b) {
                check_result(db, 1, &out, rb, bdt, rows);
                ct_tensor_release(db);
            }
        }
    free(vg);
    free(vx);
    free(rw);
    free(rb);
}

static void test_linear_backward_weight(void **state) {
    (void)state;
    /* the number of leading dims, those dims, out, in: [5] rows, a 1-d grad_y and x, [2, 3]
     * rows, 40 rows, no outputs, no rows, no inputs */
    static const int64_t shapes[][5] = {{1, 5, 0, 7, 12},  {0, 0, 0, 7, 12}, {2, 2, 3, 16, 24},
                                        {1, 40, 0, 8, 5},  {1, 6, 0, 0, 12}, {1, 0, 0, 7, 12},
                                        {1, 6, 0, 7, 0}};
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
            int nl = (int)shapes[c][0];
            int64_t gs[CT_MAX_DIMS], xs[CT_MAX_DIMS];
            for (int i = 0; i < nl; i++) gs[i] = xs[i] = shapes[c][1 + i];
            gs[nl] = shapes[c][3];
            xs[nl] = shapes[c][4];
            ct_tensor *g = tu_rand(nl + 1, gs, dt, -1, 1, NULL);
            ct_tensor *x = tu_rand(nl + 1, xs, dt, -1, 1, NULL);
            ct_tensor *gn = tu_noncontig(g), *xn = tu_noncontig(x);
            check_linear_grads(g, x);
            check_linear_grads(gn, xn);
            check_linear_grads(g, xn);
            ct_tensor *ts[] = {g, x, gn, xn};
            for (size_t i = 0; i < 4; i++) ct_tensor_release(ts[i]);
        }
    }
}

/* A backward through t (a result of a backward op run on inputs that need grad) fails,
 * naming the op (schema name) that has no formula. */
static void assert_backward_refused(ct_tensor *t, const char *op) {
    assert_true(ct_requires_grad(t));
    ct_tensor *l = ct_sum(t, 0, NULL, false);
    tu_assert_error(ct_backward(l, NULL, false), CT_ERR_AUTOGRAD, op, "no backward formula");
    ct_tensor_release(l);
}

/* Bad arguments: a status naming the op and what was expected, the outputs NULL, nothing
 * leaked; results of inputs that need grad refuse a backward through them. */
static void test_linear_backward_weight_errors(void **state) {
    (void)state;
    tu_scope sc = tu_scope_begin();
    ct_tensor *g = tu_rand(2, (const int64_t[]){4, 3}, CT_F32, -1, 1, NULL);
    ct_tensor *x = tu_rand(2, (const int64_t[]){4, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *x64 = tu_rand(2, (const int64_t[]){4, 5}, CT_F64, -1, 1, NULL);
    ct_tensor *x35 = tu_rand(2, (const int64_t[]){3, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *x3d = tu_rand(3, (const int64_t[]){1, 4, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *gi = ct_tensor_zeros(CT_SHAPE(4, 3), CT_I64, CT_CPU);
    ct_tensor *xi = ct_tensor_zeros(CT_SHAPE(4, 5), CT_I64, CT_CPU);
    ct_tensor *s = ct_tensor_scalar(1.0, CT_F32, CT_CPU);
    ct_tensor *dw = g, *db = g;
    const char *op = "ct_linear_backward_weight";
    tu_assert_error(ct_linear_backward_weight(g, x, NULL, NULL), CT_ERR_INVALID_ARG, op,
                    "no gradient asked for");
    tu_assert_error(ct_linear_backward_weight(NULL, x, &dw, &db), CT_ERR_INVALID_ARG, op,
                    "argument 1 is NULL");
    assert_null(dw);
    assert_null(db);
    dw = db = g;
    tu_assert_error(ct_linear_backward_weight(g, NULL, &dw, &db), CT_ERR_INVALID_ARG, op,
                    "argument 2 is NULL");
    assert_null(dw);
    assert_null(db);
    tu_assert_error(ct_linear_backward_weight(g, x64, &dw, NULL), CT_ERR_DTYPE, op,
                    "grad_y and input", "float32", "float64");
    tu_assert_error(ct_linear_backward_weight(gi, xi, &dw, &db), CT_ERR_DTYPE, op, "int64");
    tu_assert_error(ct_linear_backward_weight(gi, NULL, NULL, &db), CT_ERR_DTYPE, op, "int64");
    tu_assert_error(ct_linear_backward_weight(g, x35, &dw, &db), CT_ERR_SHAPE, op,
                    "[4, 3]", "[3, 5]", "same leading dims");
    tu_assert_error(ct_linear_backward_weight(g, x3d, &dw, &db), CT_ERR_SHAPE, op,
                    "same leading dims");
    tu_assert_error(ct_linear_backward_weight(s, NULL, NULL, &db), CT_ERR_SHAPE, op,
                    "at least 1 dim");
    assert_null(dw);
    assert_null(db);
    /* arguments unchanged by the failures */
    assert_int_equal(ct_tensor_shape(g)[0], 4);
    assert_false(ct_requires_grad(g));

    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    assert_int_equal(ct_linear_backward_weight(g, x, &dw, &db), CT_OK);
    assert_backward_refused(dw, "linear_backward_weight");
    ct_tensor_release(dw);
    ct_tensor_release(db);
    tu_scope_end_clean(sc);
}

/* ---- ct_mlp_gelu -------------------------------------------------------------------------------- */

static double gelu_ref(double v, ct_gelu_approx a) {
    if (a == CT_GELU_TANH) return 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    return 0.5 * v * (1 + erf(v / sqrt(2.0)));
}

static double gelu_grad_ref(double v, ct_gelu_approx a) {
    if (a == CT_GELU_TANH) {
        double t = tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
        return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * v * v);
    }
    return 0.5 * (1 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2 * 3.14159265358979323846);
}

/* The MLP in float64: each array [rows x cols] row-major; mag holds the same sums over
 * absolute values, the scale of each result's rounding error. */
typedef struct mlp_ref {
    int64_t rows, in, hid, out;
    double *pre, *act, *y, *dpre, *dx, *dw1, *db1, *dw2, *db2;
    double *m_y, *m_dx, *m_dw1, *m_db1, *m_dw2, *m_db2;
} mlp_ref;

static double *zeros_d(int64_t n) { return calloc((size_t)n + 1, sizeof(double)); }

static mlp_ref mlp_reference(const double *x, const double *w1, const double *b1,
                             const double *w2, const double *b2, const double *r,
                             int64_t rows, int64_t in, int64_t hid, int64_t out,
                             ct_gelu_approx a) {
    mlp_ref f = {.rows = rows, .in = in, .hid = hid, .out = out};
    double *m_pre = zeros_d(rows * hid), *m_act = zeros_d(rows * hid), *m_dpre = zeros_d(rows * hid);
    f.pre = zeros_d(rows * hid), f.act = zeros_d(rows * hid), f.dpre = zeros_d(rows * hid);
    f.y = zeros_d(rows * out), f.m_y = zeros_d(rows * out);
    f.dx = zeros_d(rows * in), f.m_dx = zeros_d(rows * in);
    f.dw1 = zeros_d(hid * in), f.m_dw1 = zeros_d(hid * in);
    f.db1 = zeros_d(hid), f.m_db1 = zeros_d(hid);
    f.dw2 = zeros_d(out * hid), f.m_dw2 = zeros_d(out * hid);
    f.db2 = zeros_d(out), f.m_db2 = zeros_d(out);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t h = 0; h < hid; h++) {
            double s = b1 ? b1[h] : 0, m = b1 ? fabs(b1[h]) : 0;
            for (int64_t k = 0; k < in; k++) {
                s += x[i * in + k] * w1[h * in + k];
                m += fabs(x[i * in + k] * w1[h * in + k]);
            }
            f.pre[i * hid + h] = s;
            f.act[i * hid + h] = gelu_ref(s, a);
            m_pre[i * hid + h] = m;
            m_act[i * hid + h] = fabs(f.act[i * hid + h]) + 1.2 * m; /* |gelu'| < 1.2 */
        }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t o = 0; o < out; o++) {
            double s = b2 ? b2[o] : 0, m = b2 ? fabs(b2[o]) : 0;
            for (int64_t h = 0; h < hid; h++) {
                s += f.act[i * hid + h] * w2[o * hid + h];
                m += m_act[i * hid + h] * fabs(w2[o * hid + h]);
            }
            f.y[i * out + o] = s;
            f.m_y[i * out + o] = m;
        }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t h = 0; h < hid; h++) {
            double s = 0, m = 0;
            for (int64_t o = 0; o < out; o++) {
                s += r[i * out + o] * w2[o * hid + h];
                m += fabs(r[i * out + o] * w2[o * hid + h]);
            }
            double gd = gelu_grad_ref(f.pre[i * hid + h], a);
            f.dpre[i * hid + h] = s * gd;
            /* gelu'' is below 1 in size: pre's error moves gelu' by at most that much */
            m_dpre[i * hid + h] = m * (fabs(gd) + 1 + m_pre[i * hid + h]);
        }
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t o = 0; o < out; o++) {
            f.db2[o] += r[i * out + o];
            f.m_db2[o] += fabs(r[i * out + o]);
            for (int64_t h = 0; h < hid; h++) {
                f.dw2[o * hid + h] += r[i * out + o] * f.act[i * hid + h];
                f.m_dw2[o * hid + h] += fabs(r[i * out + o]) * m_act[i * hid + h];
            }
        }
        for (int64_t h = 0; h < hid; h++) {
            f.db1[h] += f.dpre[i * hid + h];
            f.m_db1[h] += m_dpre[i * hid + h];
            for (int64_t k = 0; k < in; k++) {
                f.dw1[h * in + k] += f.dpre[i * hid + h] * x[i * in + k];
                f.m_dw1[h * in + k] += m_dpre[i * hid + h] * fabs(x[i * in + k]);
                f.dx[i * in + k] += f.dpre[i * hid + h] * w1[h * in + k];
                f.m_dx[i * in + k] += m_dpre[i * hid + h] * fabs(w1[h * in + k]);
            }
        }
    }
    free(m_pre);
    free(m_act);
    free(m_dpre);
    return f;
}

static void mlp_ref_free(mlp_ref *f) {
    double *all[] = {f->pre, f->act, f->y, f->dpre, f->dx, f->dw1, f->db1, f->dw2, f->db2,
                     f->m_y, f->m_dx, f->m_dw1, f->m_db1, f->m_dw2, f->m_db2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* Asserts t (n values) within c * u(dt) * mag[i] (+ 1e-300) of ref: a few roundings of
 * each term, in t's dtype, for the sums the results are. */
static void assert_within(ct_tensor *t, const double *ref, const double *mag, int64_t n,
                          double c, const char *what) {
    assert_non_null(t);
    assert_int_equal(tu_numel(ct_tensor_ndim(t), ct_tensor_shape(t)), n);
    double u = tu_unit_roundoff(ct_tensor_dtype(t)), *got = tu_values(t);
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - ref[i]) <= c * u * mag[i] + 1e-300)) {
            fprintf(stderr, "%s[%lld]: got %.17g, expected %.17g (bound %g)\n", what,
                    (long long)i, got[i], ref[i], c * u * mag[i]);
            fail();
        }
    free(got);
}

/* ct_mlp_gelu(x, w1, b1, w2, b2) and its gradients from sum(y * r) against the float64
 * chain, with every operand requiring grad; the inputs' layouts as given. */
static void check_mlp(ct_tensor *x, ct_tensor *w1, ct_tensor *b1, ct_tensor *w2, ct_tensor *b2,
                      ct_gelu_approx a) {
    ct_dtype dt = ct_tensor_dtype(x);
    int nd = ct_tensor_ndim(x);
    int64_t in = ct_tensor_shape(x)[nd - 1], hid = ct_tensor_shape(w1)[0];
    int64_t out = ct_tensor_shape(w2)[0], rows = tu_numel(nd - 1, ct_tensor_shape(x));
    double *vx = tu_values(x), *v1 = tu_values(w1), *v2 = tu_values(w2);
    double *vb1 = b1 ? tu_values(b1) : NULL, *vb2 = b2 ? tu_values(b2) : NULL;
    int64_t yshape[CT_MAX_DIMS];
    memcpy(yshape, ct_tensor_shape(x), (size_t)nd * sizeof *yshape);
    yshape[nd - 1] = out;
    double *vr;
    ct_tensor *r = tu_rand(nd, yshape, dt, -1, 1, &vr);
    mlp_ref f = mlp_reference(vx, v1, vb1, v2, vb2, vr, rows, in, hid, out, a);
    ct_tensor *ins[5] = {x, w1, b1, w2, b2};
    for (int i = 0; i < 5; i++)
        if (ins[i]) assert_int_equal(ct_requires_grad_(ins[i], true), CT_OK);
    ct_tensor *y = ct_mlp_gelu(x, w1, b1, w2, b2, a);
    if (!y) fprintf(stderr, "ct_mlp_gelu: %s\n", ct_last_error());
    assert_non_null(y);
    assert_int_equal(ct_tensor_dtype(y), dt);
    assert_int_equal(ct_tensor_ndim(y), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(y)[d], yshape[d]);
    double c = 8.0 + (double)(in + hid); /* a dot product's rounding grows with its length */
    assert_within(y, f.y, f.m_y, rows * out, c, "y");
    ct_tensor *yr = ct_mul(y, r), *l = ct_sum(yr, 0, NULL, false);
    assert_int_equal(ct_backward(l, NULL, false), CT_OK);
    c = 8.0 + (double)(rows + in + hid + out);
    assert_within(ct_grad(x), f.dx, f.m_dx, rows * in, c, "dx");
    assert_within(ct_grad(w1), f.dw1, f.m_dw1, hid * in, c, "dw1");
    assert_within(ct_grad(w2), f.dw2, f.m_dw2, out * hid, c, "dw2");
    if (b1) assert_within(ct_grad(b1), f.db1, f.m_db1, hid, c, "db1");
    if (b2) assert_within(ct_grad(b2), f.db2, f.m_db2, out, c, "db2");
    for (int i = 0; i < 5; i++)
        if (ins[i]) {
            ct_zero_grad(ins[i]);
            assert_int_equal(ct_requires_grad_(ins[i], false), CT_OK);
        }
    ct_tensor_release(l);
    ct_tensor_release(yr);
    ct_tensor_release(y);
    ct_tensor_release(r);
    mlp_ref_free(&f);
    free(vr);
    free(vx);
    free(v1);
    free(v2);
    free(vb1);
    free(vb2);
}

static void test_mlp_gelu(void **state) {
    (void)state;
    /* the number of leading dims, those dims, in, hidden, out */
    static const int64_t shapes[][6] = {{1, 5, 0, 12, 16, 7}, {0, 0, 0, 9, 20, 4},
                                        {2, 2, 3, 8, 24, 8},  {1, 33, 0, 5, 3, 6},
                                        {1, 0, 0, 8, 16, 8},  {1, 4, 0, 0, 6, 3},
                                        {1, 4, 0, 6, 0, 3},   {1, 4, 0, 6, 5, 0}};
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int nl = (int)shapes[s][0];
            int64_t xs[CT_MAX_DIMS], in = shapes[s][3], hid = shapes[s][4], out = shapes[s][5];
            for (int i = 0; i < nl; i++) xs[i] = shapes[s][1 + i];
            xs[nl] = in;
            ct_tensor *x = tu_rand(nl + 1, xs, dt, -1, 1, NULL);
            ct_tensor *w1 = tu_rand(2, (const int64_t[]){hid, in}, dt, -1, 1, NULL);
            ct_tensor *w2 = tu_rand(2, (const int64_t[]){out, hid}, dt, -1, 1, NULL);
            ct_tensor *b1 = tu_rand(1, &hid, dt, -1, 1, NULL);
            ct_tensor *b2 = tu_rand(1, &out, dt, -1, 1, NULL);
            ct_tensor *xn = tu_noncontig(x), *w1n = tu_noncontig(w1), *w2n = tu_noncontig(w2);
            ct_tensor *b1n = tu_noncontig(b1);
            ct_gelu_approx a = s % 2 ? CT_GELU_NONE : CT_GELU_TANH;
            check_mlp(x, w1, b1, w2, b2, a);
            check_mlp(x, w1, NULL, w2, NULL, a);
            check_mlp(xn, w1n, b1n, w2n, b2, (ct_gelu_approx)!a);
            check_mlp(xn, w1, NULL, w2n, b2, a);
            ct_tensor *all[] = {x, w1, w2, b1, b2, xn, w1n, w2n, b1n};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
        }
    }
}

/* ct_mlp_gelu_backward_hidden(g, w, pre) against float64: dpre = gelu'(pre) * (g @ w) in
 * pre's shape and its sums over the leading dims, asked for and not, on the layouts given. */
static void check_hidden_grad(ct_tensor *g, ct_tensor *w, ct_tensor *pre, ct_gelu_approx a) {
    int nd = ct_tensor_ndim(g);
    int64_t out = ct_tensor_shape(w)[0], hid = ct_tensor_shape(w)[1];
    int64_t rows = tu_numel(nd - 1, ct_tensor_shape(g));
    double *vg = tu_values(g), *vw = tu_values(w), *vp = tu_values(pre);
    double *rd = zeros_d(rows * hid), *md = zeros_d(rows * hid), *rb = zeros_d(hid),
           *mb = zeros_d(hid);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t h = 0; h < hid; h++) {
            double sum = 0, mag = 0, gd = gelu_grad_ref(vp[i * hid + h], a);
            for (int64_t o = 0; o < out; o++) {
                sum += vg[i * out + o] * vw[o * hid + h];
                mag += fabs(vg[i * out + o] * vw[o * hid + h]);
            }
            rd[i * hid + h] = sum * gd;
            md[i * hid + h] = mag * (fabs(gd) + 1);
            rb[h] += rd[i * hid + h];
            mb[h] += md[i * hid + h];
        }
    double c = 8.0 + (double)(rows + out);
    for (int ask = 0; ask < 2; ask++) {
        ct_tensor *d = g, *db = g; /* poison: must be replaced */
        ct_status st = ct_mlp_gelu_backward_hidden(g, w, pre, a, &d, ask ? &db : NULL);
        if (st != CT_OK) fprintf(stderr, "ct_mlp_gelu_backward_hidden: %s\n", ct_last_error());
        assert_int_equal(st, CT_OK);
        assert_int_equal(ct_tensor_ndim(d), nd);
        for (int k = 0; k < nd; k++)
            assert_int_equal(ct_tensor_shape(d)[k], ct_tensor_shape(pre)[k]);
        assert_within(d, rd, md, rows * hid, c, "dpre");
        ct_tensor_release(d);
        if (ask) {
            assert_within(db, rb, mb, hid, c, "db_in");
            ct_tensor_release(db);
        }
    }
    /* inside a scope the results are the scope's: its end leaves nothing */
    tu_scope sc = tu_scope_begin();
    ct_tensor *d = NULL, *db = NULL;
    assert_int_equal(ct_mlp_gelu_backward_hidden(g, w, pre, a, &d, &db), CT_OK);
    assert_int_equal(ct_mlp_gelu_backward_hidden(g, w, pre, a, &d, NULL), CT_OK);
    tu_scope_end_clean(sc);
    double *all[] = {vg, vw, vp, rd, md, rb, mb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static void test_mlp_gelu_backward_hidden(void **state) {
    (void)state;
    /* the number of leading dims, those dims, out, hidden */
    static const int64_t shapes[][5] = {{1, 6, 0, 5, 9}, {2, 2, 3, 4, 16}, {0, 0, 0, 3, 7},
                                        {1, 0, 0, 4, 8}, {1, 5, 0, 0, 6}};
    for (int d = 0; d < NDT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int nl = (int)shapes[s][0];
            int64_t gs[CT_MAX_DIMS], ps[CT_MAX_DIMS], out = shapes[s][3], hid = shapes[s][4];
            for (int i = 0; i < nl; i++) gs[i] = ps[i] = shapes[s][1 + i];
            gs[nl] = out;
            ps[nl] = hid;
            ct_tensor *g = tu_rand(nl + 1, gs, dt, -1, 1, NULL);
            ct_tensor *w = tu_rand(2, (const int64_t[]){out, hid}, dt, -1, 1, NULL);
            ct_tensor *pre = tu_rand(nl + 1, ps, dt, -3, 3, NULL);
            ct_tensor *gn = tu_noncontig(g), *wn = tu_noncontig(w), *pn = tu_noncontig(pre);
            ct_gelu_approx a = s % 2 ? CT_GELU_NONE : CT_GELU_TANH;
            check_hidden_grad(g, w, pre, a);
            check_hidden_grad(gn, wn, pn, (ct_gelu_approx)!a);
            check_hidden_grad(g, wn, pn, a);
            ct_tensor *all[] = {g, w, pre, gn, wn, pn};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
        }
    }
}

static ct_tensor *mlp_fn(ct_tensor *const *in, void *ctx) {
    return ct_mlp_gelu(in[0], in[1], in[2], in[3], in[4], *(const ct_gelu_approx *)ctx);
}

/* float64 gradients against finite differences, with and without recomputation of the
 * activation, and each input alone requiring grad; the node's name. */
static void test_mlp_gelu_gradcheck(void **state) {
    (void)state;
    for (int rec = 0; rec < 2; rec++) {
        bool was = ct_set_recompute_enabled(rec != 0);
        for (int ai = 0; ai < 2; ai++) {
            ct_gelu_approx a = ai ? CT_GELU_TANH : CT_GELU_NONE;
            for (int only = -1; only < 5; only++) {
                ct_tensor *in[5] = {tu_rand(3, (const int64_t[]){2, 3, 4}, CT_F64, -2, 2, NULL),
                                    tu_rand(2, (const int64_t[]){5, 4}, CT_F64, -1, 1, NULL),
                                    tu_rand(1, (const int64_t[]){5}, CT_F64, -1, 1, NULL),
                                    tu_rand(2, (const int64_t[]){3, 5}, CT_F64, -1, 1, NULL),
                                    tu_rand(1, (const int64_t[]){3}, CT_F64, -1, 1, NULL)};
                for (int i = 0; i < 5; i++)
                    if (only < 0 || only == i)
                        assert_int_equal(ct_requires_grad_(in[i], true), CT_OK);
                ct_status st = ct_gradcheck(mlp_fn, &a, 5, in, 1e-6, 1e-7, 1e-6);
                if (st != CT_OK) fprintf(stderr, "gradcheck: %s\n", ct_last_error());
                assert_int_equal(st, CT_OK);
                ct_tensor *y = mlp_fn(in, &a);
                assert_string_equal(ct_grad_fn_name(y), "MlpGeluBackward");
                ct_tensor_release(y);
                for (int i = 0; i < 5; i++) ct_tensor_release(in[i]);
            }
        }
        ct_set_recompute_enabled(was);
    }
}

/* Bad arguments: a status naming the op and what was expected, nothing leaked, the
 * arguments unchanged; the hidden gradient's own checks. */
static void test_mlp_gelu_errors(void **state) {
    (void)state;
    tu_scope sc = tu_scope_begin();
    ct_tensor *x = tu_rand(2, (const int64_t[]){4, 6}, CT_F32, -1, 1, NULL);
    ct_tensor *w1 = tu_rand(2, (const int64_t[]){8, 6}, CT_F32, -1, 1, NULL);
    ct_tensor *b1 = tu_rand(1, (const int64_t[]){8}, CT_F32, -1, 1, NULL);
    ct_tensor *w2 = tu_rand(2, (const int64_t[]){3, 8}, CT_F32, -1, 1, NULL);
    ct_tensor *b2 = tu_rand(1, (const int64_t[]){3}, CT_F32, -1, 1, NULL);
    ct_tensor *w1_64 = tu_rand(2, (const int64_t[]){8, 6}, CT_F64, -1, 1, NULL);
    ct_tensor *w1_bad = tu_rand(2, (const int64_t[]){8, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *w2_bad = tu_rand(2, (const int64_t[]){3, 7}, CT_F32, -1, 1, NULL);
    ct_tensor *xi = ct_tensor_zeros(CT_SHAPE(4, 6), CT_I64, CT_CPU);
    ct_tensor *s = ct_tensor_scalar(1.0, CT_F32, CT_CPU);
    const char *op = "ct_mlp_gelu";
    tu_assert_null_error(ct_mlp_gelu(NULL, w1, b1, w2, b2, CT_GELU_TANH), CT_ERR_INVALID_ARG, op,
                         "argument 1 is NULL");
    tu_assert_null_error(ct_mlp_gelu(x, w1, b1, NULL, b2, CT_GELU_TANH), CT_ERR_INVALID_ARG, op,
                         "argument 3 is NULL");
    tu_assert_null_error(ct_mlp_gelu(x, w1_64, b1, w2, b2, CT_GELU_TANH), CT_ERR_DTYPE, op,
                         "same dtype", "float64");
    tu_assert_null_error(ct_mlp_gelu(xi, w1, b1, w2, b2, CT_GELU_TANH), CT_ERR_DTYPE, op,
                         "same dtype");
    tu_assert_null_error(ct_mlp_gelu(x, w1, b1, w2, b2, (ct_gelu_approx)2), CT_ERR_INVALID_ARG,
                         op, "approximate");
    tu_assert_null_error(ct_mlp_gelu(s, w1, b1, w2, b2, CT_GELU_TANH), CT_ERR_SHAPE, op,
                         "at least 1 dim");
    tu_assert_null_error(ct_mlp_gelu(x, w1_bad, b1, w2, b2, CT_GELU_TANH), CT_ERR_SHAPE, op,
                         "w_in [8, 5]", "do not align");
    tu_assert_null_error(ct_mlp_gelu(x, w1, b1, w2_bad, b2, CT_GELU_TANH), CT_ERR_SHAPE, op,
                         "w_out [3, 7]", "[out, 8]");
    tu_assert_null_error(ct_mlp_gelu(x, w1, b2, w2, b2, CT_GELU_TANH), CT_ERR_SHAPE, op,
                         "b_in must be [8]");
    tu_assert_null_error(ct_mlp_gelu(x, w1, b1, w2, b1, CT_GELU_TANH), CT_ERR_SHAPE, op,
                         "b_out must be [3]");
    assert_int_equal(ct_tensor_shape(x)[0], 4);
    assert_false(ct_requires_grad(x));

    const char *hop = "ct_mlp_gelu_backward_hidden";
    ct_tensor *g = tu_rand(2, (const int64_t[]){4, 3}, CT_F32, -1, 1, NULL);
    ct_tensor *pre = tu_rand(2, (const int64_t[]){4, 8}, CT_F32, -1, 1, NULL);
    ct_tensor *pre_bad = tu_rand(2, (const int64_t[]){5, 8}, CT_F32, -1, 1, NULL);
    ct_tensor *d = g, *db = g;
    tu_assert_error(ct_mlp_gelu_backward_hidden(g, w2, pre, CT_GELU_TANH, NULL, &db),
                    CT_ERR_INVALID_ARG, hop, "dpre is NULL");
    assert_null(db);
    db = g;
    tu_assert_error(ct_mlp_gelu_backward_hidden(g, w2, pre_bad, CT_GELU_TANH, &d, &db),
                    CT_ERR_SHAPE, hop, "same leading dims", "[5, 8]");
    assert_null(d);
    assert_null(db);
    tu_assert_error(ct_mlp_gelu_backward_hidden(g, w2, w1_64, CT_GELU_TANH, &d, NULL),
                    CT_ERR_DTYPE, hop, "float64");
    tu_assert_error(ct_mlp_gelu_backward_hidden(g, w2, pre, (ct_gelu_approx)-1, &d, NULL),
                    CT_ERR_INVALID_ARG, hop, "approximate");
    /* its result refuses a double backward, naming the op */
    assert_int_equal(ct_requires_grad_(g, true), CT_OK);
    assert_int_equal(ct_mlp_gelu_backward_hidden(g, w2, pre, CT_GELU_TANH, &d, &db), CT_OK);
    assert_backward_refused(d, "linear_dgelu");
    ct_tensor_release(d);
    ct_tensor_release(db);
    tu_scope_end_clean(sc);
}

/* ---- errors ---------------------------------------------------------------------------------- */

static void test_errors(void **state) {
    (void)state;
    cti_alloc_stats before = cti_get_alloc_stats();
    ct_tensor *a34 = tu_rand(2, (const int64_t[]){3, 4}, CT_F32, -1, 1, NULL);
    ct_tensor *b56 = tu_rand(2, (const int64_t[]){5, 6}, CT_F32, -1, 1, NULL);
    ct_tensor *b45 = tu_rand(2, (const int64_t[]){4, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *d45 = tu_rand(2, (const int64_t[]){4, 5}, CT_F64, -1, 1, NULL);
    /* integer products run on the CPU (test_layers.c); bool ones are refused */
    ct_tensor *i34 = ct_tensor_zeros(CT_SHAPE(3, 4), CT_BOOL, CT_CPU);
    ct_tensor *i45 = ct_tensor_zeros(CT_SHAPE(4, 5), CT_BOOL, CT_CPU);
    ct_tensor *s = ct_tensor_scalar(2.0, CT_F32, CT_CPU);
    ct_tensor *v4 = tu_rand(1, (const int64_t[]){4}, CT_F32, -1, 1, NULL);
    ct_tensor *v5 = tu_rand(1, (const int64_t[]){5}, CT_F32, -1, 1, NULL);
    ct_tensor *t234 = tu_rand(3, (const int64_t[]){2, 3, 4}, CT_F32, -1, 1, NULL);
    ct_tensor *t345 = tu_rand(3, (const int64_t[]){3, 4, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *t256 = tu_rand(3, (const int64_t[]){2, 5, 6}, CT_F32, -1, 1, NULL);

    tu_assert_null_error(ct_matmul(a34, b56), CT_ERR_SHAPE, "ct_matmul",
                         "shapes [3, 4] and [5, 6] do not align (4 != 5)");
    tu_assert_null_error(ct_matmul(v4, v5), CT_ERR_SHAPE, "ct_matmul", "[4]", "[5]",
                         "(4 != 5)");
    tu_assert_null_error(ct_matmul(a34, v5), CT_ERR_SHAPE, "ct_matmul", "do not align");
    tu_assert_null_error(ct_matmul(a34, d45), CT_ERR_DTYPE, "ct_matmul",
                         "expected both operands to have the same dtype, got float32 and "
                         "float64");
    tu_assert_null_error(ct_matmul(i34, i45), CT_ERR_DTYPE, "ct_matmul", "bool", "floating");
    tu_assert_null_error(ct_matmul(s, b45), CT_ERR_SHAPE, "ct_matmul", "at least 1 dim",
                         "[] float32");
    tu_assert_null_error(ct_matmul(NULL, b45), CT_ERR_INVALID_ARG, "ct_matmul", "NULL");
    tu_assert_null_error(ct_matmul(t234, t345), CT_ERR_SHAPE, "ct_matmul", "batch",
                         "[2, 3, 4]", "[3, 4, 5]", "broadcast");

    tu_assert_null_error(ct_mm(a34, b56), CT_ERR_SHAPE, "ct_mm", "[3, 4] and [5, 6]",
                         "(4 != 5)");
    tu_assert_null_error(ct_mm(v4, b45), CT_ERR_SHAPE, "ct_mm", "2-d", "[4]");
    tu_assert_null_error(ct_mm(a34, d45), CT_ERR_DTYPE, "ct_mm", "float32", "float64");
    tu_assert_null_error(ct_mm(i34, i45), CT_ERR_DTYPE, "ct_mm", "bool");
    tu_assert_null_error(ct_mm(a34, NULL), CT_ERR_INVALID_ARG, "ct_mm", "NULL");

    tu_assert_null_error(ct_bmm(a34, b45), CT_ERR_SHAPE, "ct_bmm", "3-d", "[3, 4]");
    tu_assert_null_error(ct_bmm(t234, t345), CT_ERR_SHAPE, "ct_bmm", "batch", "(2 != 3)");
    tu_assert_null_error(ct_bmm(t234, t256), CT_ERR_SHAPE, "ct_bmm", "do not align",
                         "(4 != 5)");

    ct_tensor *in35 = tu_rand(2, (const int64_t[]){3, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *in7 = tu_rand(1, (const int64_t[]){7}, CT_F32, -1, 1, NULL);
    ct_tensor *in35d = tu_rand(2, (const int64_t[]){3, 5}, CT_F64, -1, 1, NULL);
    tu_assert_null_error(ct_addmm(in7, a34, b45, 1, 1), CT_ERR_SHAPE, "ct_addmm", "[7]",
                         "[3, 5]", "broadcast");
    tu_assert_null_error(ct_addmm(t234, a34, b45, 1, 1), CT_ERR_SHAPE, "ct_addmm",
                         "[2, 3, 4]");
    tu_assert_null_error(ct_addmm(in35, a34, b56, 1, 1), CT_ERR_SHAPE, "ct_addmm",
                         "(4 != 5)");
    tu_assert_null_error(ct_addmm(in35d, a34, b45, 1, 1), CT_ERR_DTYPE, "ct_addmm",
                         "float64, float32 and float32");
    tu_assert_null_error(ct_addmm(in35, v4, b45, 1, 1), CT_ERR_SHAPE, "ct_addmm", "2-d");
    tu_assert_null_error(ct_addmm(NULL, a34, b45, 1, 1), CT_ERR_INVALID_ARG, "ct_addmm",
                         "NULL");

    ct_tensor *w74 = tu_rand(2, (const int64_t[]){7, 4}, CT_F32, -1, 1, NULL);
    ct_tensor *w75 = tu_rand(2, (const int64_t[]){7, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *b6 = tu_rand(1, (const int64_t[]){6}, CT_F32, -1, 1, NULL);
    ct_tensor *b7d = tu_rand(1, (const int64_t[]){7}, CT_F64, -1, 1, NULL);
    tu_assert_null_error(ct_linear(a34, w75, NULL), CT_ERR_SHAPE, "ct_linear", "[3, 4]",
                         "[7, 5]", "(4 != 5");
    tu_assert_null_error(ct_linear(a34, w74, b6), CT_ERR_SHAPE, "ct_linear", "bias", "[7]",
                         "[6]");
    tu_assert_null_error(ct_linear(a34, w74, b7d), CT_ERR_DTYPE, "ct_linear",
                         "float32, float32 and float64");
    tu_assert_null_error(ct_linear(s, w74, NULL), CT_ERR_SHAPE, "ct_linear", "[] float32");
    tu_assert_null_error(ct_linear(a34, v4, NULL), CT_ERR_SHAPE, "ct_linear", "2-d", "[4]");
    tu_assert_null_error(ct_linear(a34, NULL, NULL), CT_ERR_INVALID_ARG, "ct_linear", "NULL");

    ct_tensor *x[] = {a34, b56, b45, d45, i34, i45, s, v4, v5, t234, t345, t256,
                      in35, in7, in35d, w74, w75, b6, b7d};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) ct_tensor_release(x[i]);
    /* failed calls leave nothing behind */
    cti_alloc_stats after = cti_get_alloc_stats();
    assert_int_equal(after.live_tensors, before.live_tensors);
    assert_int_equal(after.live_storages, before.live_storages);
}

/* Every op leaves no tensors behind, inside a scope or not. */
static void test_no_leaks(void **state) {
    (void)state;
    tu_scope sc = tu_scope_begin();
    ct_tensor *a = tu_rand(3, (const int64_t[]){2, 3, 4}, CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(2, (const int64_t[]){5, 4}, CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(1, (const int64_t[]){5}, CT_F32, -1, 1, NULL);
    assert_non_null(ct_linear(a, w, b));
    assert_non_null(ct_linear(tu_noncontig(a), w, NULL));
    assert_non_null(ct_matmul(a, ct_t(w)));
    assert_non_null(ct_bmm(a, ct_transpose(a, 1, 2)));
    tu_scope_end_clean(sc);
}

/* ---- BLAS setup ------------------------------------------------------------------------------ */

static bool cpu_has_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return false;
#endif
}

/* On an AVX-512 CPU, OpenBLAS runs AVX-512 kernels after cten's init, and the
 * environment is as it was. */
static void test_blas_kernels(void **state) {
    (void)state;
    bool user_choice = getenv("OPENBLAS_CORETYPE") != NULL;
    const char *info = ct_blas_info();
    assert_non_null(strstr(info, "OpenBLAS"));
    const char *core = openblas_get_corename();
    assert_non_null(strstr(info, core)); /* names the kernels in use */
    assert_int_equal(getenv("OPENBLAS_CORETYPE") != NULL, user_choice);
    assert_string_equal(ct_kernel_name(CT_OP_MM, CT_DEVICE_CPU, CT_F32), "cblas_sgemm");
    assert_string_equal(ct_kernel_name(CT_OP_BMM, CT_DEVICE_CPU, CT_F64), "cblas_dgemm");
    if (user_choice) {
        assert_non_null(strstr(info, "OPENBLAS_CORETYPE set by the user"));
        skip();
    }
    if (!cpu_has_avx512()) skip();
    fprintf(stderr, "[ info     ] %s\n", info);
    assert_true(strcmp(core, "SkylakeX") == 0 || strcmp(core, "Cooperlake") == 0 ||
                strcmp(core, "SapphireRapids") == 0);
    /* and the switched kernels compute right */
    ct_tensor *a = tu_rand(2, (const int64_t[]){200, 150}, CT_F32, -1, 1, NULL);
    ct_tensor *b = rand_transposed(2, (const int64_t[]){150, 170}, CT_F32);
    check_matmul(a, b);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

/* cten restarts OpenBLAS's thread server with a short idle spin unless the user set one;
 * either way the environment and OpenBLAS's cached copy of it are as they were, and
 * threaded products (m n k far above OpenBLAS's single-thread limit) stay right on the
 * restarted workers. tests/meson.build runs this program again with the variable set. */
static void test_blas_worker_spin(void **state) {
    (void)state;
    const char *user = getenv("OPENBLAS_THREAD_TIMEOUT");
    const char *info = ct_blas_info();
    timeout_fn cached = (timeout_fn)dlsym(RTLD_DEFAULT, "openblas_thread_timeout");
    if (user) {
        assert_null(strstr(info, "set by cten"));
        assert_string_equal(getenv("OPENBLAS_THREAD_TIMEOUT"), user);
        if (cached) assert_int_equal(cached(), atoi(user));
    } else {
        assert_null(getenv("OPENBLAS_THREAD_TIMEOUT"));
        if (!cached) skip();
        fprintf(stderr, "[ info     ] %s\n", info);
        assert_non_null(strstr(info, "idle workers sleep after 2^16 cycles (set by cten)"));
        assert_int_equal(cached(), 0);
    }
    int saved = ct_get_num_threads();
    assert_int_equal(ct_set_num_threads(2), CT_OK);
    ct_tensor *a = tu_rand(2, (const int64_t[]){300, 200}, CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(2, (const int64_t[]){200, 250}, CT_F32, -1, 1, NULL);
    for (int i = 0; i < 3; i++) check_matmul(a, b);
    assert_int_equal(ct_set_num_threads(saved), CT_OK);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

/* Thread-count changes reach OpenBLAS and results stay right. */
static void test_threads(void **state) {
    (void)state;
    int saved = ct_get_num_threads();
    ct_tensor *a = tu_rand(2, (const int64_t[]){300, 200}, CT_F64, -1, 1, NULL);
    ct_tensor *b = tu_rand(2, (const int64_t[]){200, 250}, CT_F64, -1, 1, NULL);
    for (int n = 1; n <= 2; n++) {
        assert_int_equal(ct_set_num_threads(n), CT_OK);
        check_matmul(a, b);
    }
    assert_int_equal(ct_set_num_threads(saved), CT_OK);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_blas_kernels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_blas_worker_spin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mm_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mm_k0_zeros, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mm_layouts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_batched_views, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bmm_broadcast_no_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bmm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_addmm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_addmm_beta0_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_addmm_no_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_backward_weight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_backward_weight_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mlp_gelu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mlp_gelu_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mlp_gelu_backward_hidden, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mlp_gelu_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_leaks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
    };
    return tu_run_tests(tests);
}
