/* Tests of the elementwise ops of issue 20 that the unary table (unary_ops.inc) does not
 * cover: atan2, fmod, remainder, the bitwise ops and shifts, isnan/isinf/isfinite,
 * nan_to_num, lerp, clamp with tensor bounds, and the special values of the unary ones
 * (half-to-even rounding, signed zeros, infinities, domain edges). Values against float64
 * references written here on fresh random inputs, in every dtype the op takes, contiguous,
 * non-contiguous and broadcast; gradients by gradcheck in float64; bad inputs with status
 * and message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static ct_tensor *chk(ct_tensor *t) {
    if (!t) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(t);
    return t;
}

/* A random CPU tensor of dt in [lo, hi), non-contiguous when nc; its values in *v. */
static ct_tensor *rnd(int nd, const int64_t *shape, ct_dtype dt, double lo, double hi, bool nc,
                      double **v) {
    ct_tensor *t = chk(tu_rand(nd, shape, dt, lo, hi, v));
    if (!nc) return t;
    ct_tensor *w = chk(tu_noncontig(t));
    ct_tensor_release(t);
    return w;
}

/* Row-major index into an operand of shape (na, sa) broadcast to (nd, sh). */
static int64_t bidx(int64_t lin, int nd, const int64_t *sh, int na, const int64_t *sa) {
    int64_t idx = 0, mul = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t i = lin % sh[d];
        lin /= sh[d];
        int da = d - (nd - na);
        if (da >= 0) {
            if (sa[da] != 1) idx += i * mul;
            mul *= sa[da];
        }
    }
    return idx;
}

/* Fills a freed block of the result's size with NaN, so an unwritten output fails. */
static void poison(int64_t n) {
    ct_tensor *t = ct_tensor_full(1, &n, NAN, CT_F64, CT_CPU);
    assert_non_null(t);
    ct_tensor_release(t);
}

static void expect(ct_tensor *got, ct_dtype dt, int nd, const int64_t *shape, const double *ref,
                   double rtol, double atol) {
    chk(got);
    assert_int_equal(ct_tensor_dtype(got), dt);
    assert_int_equal(ct_tensor_ndim(got), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(got)[d], shape[d]);
    double *v = tu_values(got);
    tu_assert_close(v, ref, tu_numel(nd, shape), rtol, atol);
    free(v);
}

/* ---- binary ops ------------------------------------------------------------------------------ */
typedef ct_tensor *(*bfn)(ct_tensor *, ct_tensor *);
typedef ct_tensor *(*sfn)(ct_tensor *, double);

static double r_atan2(double a, double b) { return atan2(a, b); }
static double r_fmod(double a, double b) { return b == 0 && a == trunc(a) ? 0 : fmod(a, b); }
static double r_remainder(double a, double b) {
    if (b == 0 && a == trunc(a)) return 0; /* the integer kernels' zero divisor */
    double m = fmod(a, b);
    return m != 0 && (m < 0) != (b < 0) ? m + b : m;
}
/* Integer references on exact values (int64 inputs are below 2^53 here). */
static double r_and(double a, double b) { return (double)((int64_t)a & (int64_t)b); }
static double r_or(double a, double b) { return (double)((int64_t)a | (int64_t)b); }
static double r_xor(double a, double b) { return (double)((int64_t)a ^ (int64_t)b); }

static const struct {
    const char *name;
    bfn fn;
    sfn sfn;
    double (*ref)(double, double);
    double alo, ahi, blo, bhi;
    bool ints; /* integer dtypes keep theirs (else: float32) */
} bin_cases[] = {
    {"atan2", ct_atan2, NULL, r_atan2, -3, 3, -3, 3, false},
    {"fmod", ct_fmod, ct_fmod_scalar, r_fmod, -9, 9, 0.5, 4, true},
    {"fmod negative divisor", ct_fmod, ct_fmod_scalar, r_fmod, -9, 9, -4, -0.5, true},
    {"remainder", ct_remainder, ct_remainder_scalar, r_remainder, -9, 9, 0.5, 4, true},
    {"remainder negative divisor", ct_remainder, ct_remainder_scalar, r_remainder, -9, 9, -4,
     -0.5, true},
};

/* a [4, 1, 5] with b [3, 1] (broadcast), or both [6, 7] (non-contiguous when nc). */
static void run_binary(size_t k, ct_dtype dt, bool bc, bool nc) {
    static const int64_t sa[] = {4, 1, 5}, sb[] = {3, 1}, so[] = {4, 3, 5}, s2[] = {6, 7};
    int na = bc ? 3 : 2, nb = bc ? 2 : 2, nd = bc ? 3 : 2;
    const int64_t *pa = bc ? sa : s2, *pb = bc ? sb : s2, *po = bc ? so : s2;
    double *va, *vb;
    bool flt = ct_dtype_is_floating(dt);
    ct_tensor *a = rnd(na, pa, dt, bin_cases[k].alo, bin_cases[k].ahi, nc, &va);
    /* integer divisors of the range's sign, never 0 (test_int_zero_divisor) */
    double blo = flt ? bin_cases[k].blo : bin_cases[k].blo > 0 ? 1 : floor(bin_cases[k].blo);
    double bhi = flt ? bin_cases[k].bhi : bin_cases[k].bhi < 0 ? -1 : ceil(bin_cases[k].bhi);
    ct_tensor *b = rnd(nb, pb, dt, blo, bhi, nc, &vb);
    ct_dtype od = flt || bin_cases[k].ints ? dt : CT_F32;
    int64_t n = tu_numel(nd, po);
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        ref[i] = tu_round(bin_cases[k].ref(va[bidx(i, nd, po, na, pa)], vb[bidx(i, nd, po, nb, pb)]),
                          od);
    poison(n);
    ct_tensor *y = bin_cases[k].fn(a, b);
    if (!y) fprintf(stderr, "%s %s: %s\n", bin_cases[k].name, ct_dtype_name(dt), ct_last_error());
    /* fmod's result is exact; halves round their inputs once more on the way out */
    double tol = ct_dtype_is_floating(od) ? tu_rtol(od) : 0;
    expect(y, od, nd, po, ref, tol, tol);
    release_all(3, (ct_tensor *[]){a, b, y});
    free(ref);
    free(va);
    free(vb);
}

static void test_binary_values(void **state) {
    (void)state;
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16, CT_I32, CT_I64};
    for (size_t k = 0; k < sizeof bin_cases / sizeof bin_cases[0]; k++)
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
            for (int v = 0; v < 3; v++) run_binary(k, dts[d], v == 0, v == 2);
}

/* Tensor-scalar forms, and mixed dtypes promoting as PyTorch. */
static void test_binary_scalar_promotion(void **state) {
    (void)state;
    static const int64_t s[] = {5, 9};
    double *v;
    for (int d = 0; d < 4; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        ct_tensor *a = rnd(2, s, dt, -7, 7, d == 1, &v);
        double ref[45], ref2[45];
        for (int i = 0; i < 45; i++) {
            ref[i] = tu_round(r_fmod(v[i], -2.5), dt);
            ref2[i] = tu_round(r_remainder(v[i], -2.5), dt);
        }
        ct_tensor *y = ct_fmod_scalar(a, -2.5), *z = ct_remainder_scalar(a, -2.5);
        expect(y, dt, 2, s, ref, tu_rtol(dt), tu_rtol(dt));
        expect(z, dt, 2, s, ref2, tu_rtol(dt), tu_rtol(dt));
        release_all(3, (ct_tensor *[]){a, y, z});
        free(v);
    }
    /* int64 with an integral scalar stays int64; with 2.5 it becomes float32 */
    ct_tensor *ai = rnd(2, s, CT_I64, -20, 20, false, &v);
    double ri[45], rf[45];
    for (int i = 0; i < 45; i++) ri[i] = r_remainder(v[i], 3), rf[i] = tu_round(r_remainder(v[i], 2.5), CT_F32);
    ct_tensor *yi = ct_remainder_scalar(ai, 3), *yf = ct_remainder_scalar(ai, 2.5);
    expect(yi, CT_I64, 2, s, ri, 0, 0);
    expect(yf, CT_F32, 2, s, rf, 1e-6, 1e-6);
    /* int32 with float64: float64; atan2 of integers: float32 */
    ct_tensor *b64 = rnd(2, s, CT_F64, 0.5, 3, false, NULL);
    ct_tensor *a32 = chk(ct_to_dtype(ai, CT_I32));
    ct_tensor *m = ct_fmod(a32, b64), *at = ct_atan2(a32, a32);
    assert_int_equal(ct_tensor_dtype(chk(m)), CT_F64);
    assert_int_equal(ct_tensor_dtype(chk(at)), CT_F32);
    release_all(6, (ct_tensor *[]){ai, yi, yf, b64, a32, m});
    ct_tensor_release(at);
    free(v);
    /* C's and Python's signs on exact cases; a float zero divisor gives NaN */
    const double a5[] = {7, -7, 7, -7, 5}, b5[] = {3, 3, -3, -3, 0};
    const double fm[] = {1, -1, 1, -1, 0}, rm[] = {1, 2, -2, -1, 0};
    const int64_t s5[] = {5}, s4[] = {4};
    for (int d = 0; d < 2; d++) {
        ct_dtype dt = d ? CT_I32 : CT_F64;
        const int64_t *sz = d ? s4 : s5; /* integers: the first four (0 fails, below) */
        ct_tensor *x = chk(tu_from_f64(a5, 1, sz, dt)), *y = chk(tu_from_f64(b5, 1, sz, dt));
        ct_tensor *f = ct_fmod(x, y), *r = ct_remainder(x, y);
        double want_f[5], want_r[5];
        memcpy(want_f, fm, sizeof fm);
        memcpy(want_r, rm, sizeof rm);
        want_f[4] = want_r[4] = NAN; /* float: fmod(5, 0) is NaN */
        expect(f, dt, 1, sz, want_f, 0, 0);
        expect(r, dt, 1, sz, want_r, 0, 0);
        release_all(4, (ct_tensor *[]){x, y, f, r});
    }
    /* float quotients beyond the vector path's 2^28 (libm's fmodf takes them), zeros and
     * infinities, in float32, float16 and bfloat16 blocks: exact results */
    {
        const double xa[] = {1e30, -3e20, 7, 1e-30, 5, -0.0, 6, INFINITY, 3, -4.5, 1e10, 65000};
        const double xb[] = {3, 0.1, 1e-30, 1e30, INFINITY, 2, -0.0, 2, -INFINITY, 0.75, -7, 3.5};
        const int64_t s12[] = {12};
        for (int d = 0; d < 4; d++) {
            ct_dtype dt = tu_float_dtypes[d];
            ct_tensor *x = chk(tu_from_f64(xa, 1, s12, dt)), *y = chk(tu_from_f64(xb, 1, s12, dt));
            double *ra = tu_values(x), *rb = tu_values(y), wf[12], wr[12];
            for (int i = 0; i < 12; i++) {
                wf[i] = fmod(ra[i], rb[i]);
                double q = wf[i];
                wr[i] = q != 0 && (q < 0) != (rb[i] < 0) ? q + rb[i] : q;
            }
            ct_tensor *f = ct_fmod(x, y), *r = ct_remainder(x, y);
            double *gf = tu_values(chk(f)), *gr = tu_values(chk(r));
            for (int i = 0; i < 12; i++) {
                double wri = tu_round(wr[i], dt); /* m + b rounds where it is not exact */
                bool okf = isnan(wf[i]) ? isnan(gf[i]) : gf[i] == wf[i] && signbit(gf[i]) == signbit(wf[i]);
                bool okr = isnan(wri) ? isnan(gr[i]) : gr[i] == wri;
                if (!okf || !okr) {
                    fprintf(stderr, "%s fmod/remainder(%g, %g) = %g, %g; expected %g, %g\n",
                            ct_dtype_name(dt), ra[i], rb[i], gf[i], gr[i], wf[i], wri);
                    fail();
                }
            }
            free(ra), free(rb), free(gf), free(gr);
            release_all(4, (ct_tensor *[]){x, y, f, r});
        }
    }
    /* INT32_MIN % -1 would overflow in C: 0 */
    const double mn[] = {-2147483648.0}, m1[] = {-1};
    const int64_t s1[] = {1};
    ct_tensor *x = chk(tu_from_f64(mn, 1, s1, CT_I32)), *y = chk(tu_from_f64(m1, 1, s1, CT_I32));
    ct_tensor *f = ct_fmod(x, y), *r = ct_remainder(x, y);
    const double zero[] = {0};
    expect(f, CT_I32, 1, s1, zero, 0, 0);
    expect(r, CT_I32, 1, s1, zero, 0, 0);
    release_all(4, (ct_tensor *[]){x, y, f, r});
}

/* Integer fmod and remainder by zero fail as PyTorch's ZeroDivisionError: a zero anywhere in
 * a tensor divisor (broadcast or not, int32 or int64 on either side), a scalar 0; the
 * operands are left as they were; a float divisor of 0 is fine (NaN). */
static void test_int_zero_divisor(void **state) {
    (void)state;
    const double av[] = {7, -8, 9, 10, 11, 12}, bv[] = {3, 2, 0, 5, 1, 4};
    for (int d = 0; d < 2; d++) {
        ct_scope *sc = ct_scope_begin(); /* the views and results below */
        ct_dtype dt = d ? CT_I64 : CT_I32, other = d ? CT_I32 : CT_I64;
        ct_tensor *a = chk(tu_from_f64(av, 2, (const int64_t[]){2, 3}, dt));
        ct_tensor *b = chk(tu_from_f64(bv, 2, (const int64_t[]){2, 3}, other));
        ct_tensor *row = chk(ct_narrow(b, 0, 0, 1)); /* [1, 3] with its 0, broadcast */
        tu_assert_null_error(ct_fmod(a, b), CT_ERR_INVALID_ARG, "ct_fmod", "ZeroDivisionError");
        tu_assert_null_error(ct_remainder(a, row), CT_ERR_INVALID_ARG, "ct_remainder",
                             "ZeroDivisionError");
        tu_assert_null_error(ct_fmod_scalar(a, 0), CT_ERR_INVALID_ARG, "ct_fmod_scalar",
                             "ZeroDivisionError");
        tu_assert_null_error(ct_remainder_scalar(a, 0.0), CT_ERR_INVALID_ARG,
                             "ct_remainder_scalar", "ZeroDivisionError");
        /* operands that do not broadcast: the shapes are the error, as in PyTorch */
        ct_tensor *col = chk(ct_narrow(b, 1, 1, 2)); /* [2, 2] with a 0, against [2, 3] */
        tu_assert_null_error(ct_fmod(a, col), CT_ERR_SHAPE, "ct_fmod", "broadcast");
        double *ga = tu_values(a), *gb = tu_values(b);
        for (int i = 0; i < 6; i++) assert_true(ga[i] == av[i] && gb[i] == bv[i]);
        free(ga), free(gb);
        /* without the zero: the values */
        ct_tensor *tail = chk(ct_narrow(ct_flatten(b, 0, -1), 0, 3, 3));
        ct_tensor *at = chk(ct_narrow(ct_flatten(a, 0, -1), 0, 3, 3));
        const double want[] = {0, 0, 0}; /* 10 % 5, 11 % 1, 12 % 4 */
        expect(ct_fmod(at, tail), CT_I64, 1, (const int64_t[]){3}, want, 0, 0);
        /* a float operand makes the division float: NaN, no error */
        ct_tensor *fb = chk(ct_to_dtype(b, CT_F32));
        ct_tensor *fr = ct_fmod(a, fb);
        double *gr = tu_values(chk(fr));
        assert_true(isnan(gr[2]));
        free(gr);
        ct_scope_end(sc);
    }
}

/* ---- bitwise ------------------------------------------------------------------------------------ */
static double r_shl(double a, double b, ct_dtype dt) {
    int bits = dt == CT_I32 ? 32 : 64;
    if (b < 0 || b >= bits) return 0;
    uint64_t u = (uint64_t)(int64_t)a << (int)b;
    return dt == CT_I32 ? (double)(int32_t)(uint32_t)u : (double)(int64_t)u;
}
static double r_shr(double a, double b, ct_dtype dt) {
    int bits = dt == CT_I32 ? 32 : 64;
    int64_t x = (int64_t)a;
    if (b < 0 || b >= bits - 1) return x < 0 ? -1 : 0;
    return (double)(x >> (int)b);
}

static void test_bitwise(void **state) {
    (void)state;
    static const int64_t sa[] = {4, 1, 6}, sb[] = {3, 1}, so[] = {4, 3, 6};
    static const ct_dtype dts[] = {CT_I32, CT_I64, CT_BOOL};
    static const struct {
        bfn fn;
        sfn sfn;
        double (*ref)(double, double);
    } ops[] = {{ct_bitwise_and, ct_bitwise_and_scalar, r_and},
               {ct_bitwise_or, ct_bitwise_or_scalar, r_or},
               {ct_bitwise_xor, ct_bitwise_xor_scalar, r_xor}};
    int64_t n = tu_numel(3, so);
    for (size_t k = 0; k < 3; k++) {
        for (size_t d = 0; d < 3; d++) {
            for (int nc = 0; nc < 2; nc++) {
                double *va, *vb, ref[72];
                ct_tensor *a = rnd(3, sa, dts[d], -1000, 1000, nc, &va);
                ct_tensor *b = rnd(2, sb, dts[d], -1000, 1000, nc, &vb);
                for (int64_t i = 0; i < n; i++)
                    ref[i] = ops[k].ref(va[bidx(i, 3, so, 3, sa)], vb[bidx(i, 3, so, 2, sb)]);
                ct_tensor *y = ops[k].fn(a, b);
                expect(y, dts[d], 3, so, ref, 0, 0);
                double sref[24];
                for (int i = 0; i < 24; i++) sref[i] = ops[k].ref(va[i], dts[d] == CT_BOOL ? 1 : -37);
                ct_tensor *z = ops[k].sfn(a, dts[d] == CT_BOOL ? 1 : -37);
                expect(z, dts[d] == CT_BOOL ? CT_I64 : dts[d], 3, sa, sref, 0, 0);
                release_all(4, (ct_tensor *[]){a, b, y, z});
                free(va);
                free(vb);
            }
        }
    }
    /* shifts with counts inside and outside [0, bits), negative ones too */
    for (size_t d = 0; d < 2; d++) {
        ct_dtype dt = dts[d];
        for (int nc = 0; nc < 2; nc++) {
            double *va, *vb, rl[72], rr[72];
            ct_tensor *a = rnd(3, sa, dt, -100000, 100000, nc, &va);
            ct_tensor *b = rnd(2, sb, dt, -3, dt == CT_I32 ? 35 : 67, nc, &vb);
            for (int64_t i = 0; i < n; i++) {
                double x = va[bidx(i, 3, so, 3, sa)], c = vb[bidx(i, 3, so, 2, sb)];
                rl[i] = r_shl(x, c, dt);
                rr[i] = r_shr(x, c, dt);
            }
            ct_tensor *l = ct_bitwise_left_shift(a, b), *r = ct_bitwise_right_shift(a, b);
            expect(l, dt, 3, so, rl, 0, 0);
            expect(r, dt, 3, so, rr, 0, 0);
            double sl[24];
            for (int i = 0; i < 24; i++) sl[i] = r_shl(va[i], 3, dt);
            ct_tensor *ls = ct_bitwise_left_shift_scalar(a, 3);
            expect(ls, dt, 3, sa, sl, 0, 0);
            for (int i = 0; i < 24; i++) sl[i] = r_shr(va[i], 5, dt);
            ct_tensor *rs = ct_bitwise_right_shift_scalar(a, 5);
            expect(rs, dt, 3, sa, sl, 0, 0);
            release_all(6, (ct_tensor *[]){a, b, l, r, ls, rs});
            free(va);
            free(vb);
        }
    }
    /* promotion: bool with int32 gives int32, int32 with int64 int64; not */
    double *v;
    ct_tensor *bb = rnd(1, (const int64_t[]){9}, CT_BOOL, 0, 2, false, NULL);
    ct_tensor *i32 = rnd(1, (const int64_t[]){9}, CT_I32, -50, 50, false, &v);
    ct_tensor *i64 = chk(ct_to_dtype(i32, CT_I64));
    ct_tensor *p1 = ct_bitwise_or(bb, i32), *p2 = ct_bitwise_xor(i32, i64);
    assert_int_equal(ct_tensor_dtype(chk(p1)), CT_I32);
    assert_int_equal(ct_tensor_dtype(chk(p2)), CT_I64);
    double nref[9];
    for (int i = 0; i < 9; i++) nref[i] = (double)~(int64_t)v[i];
    ct_tensor *nt = ct_bitwise_not(i32), *nt64 = ct_bitwise_not(i64);
    expect(nt, CT_I32, 1, (const int64_t[]){9}, nref, 0, 0);
    expect(nt64, CT_I64, 1, (const int64_t[]){9}, nref, 0, 0);
    double *bv = tu_values(bb), bref[9];
    for (int i = 0; i < 9; i++) bref[i] = bv[i] == 0;
    ct_tensor *nb = ct_bitwise_not(bb);
    expect(nb, CT_BOOL, 1, (const int64_t[]){9}, bref, 0, 0);
    free(bv);
    free(v);
    /* errors */
    ct_tensor *f = chk(ct_tensor_ones(1, (const int64_t[]){9}, CT_F32, CT_CPU));
    tu_assert_null_error(ct_bitwise_and(f, i32), CT_ERR_DTYPE, "ct_bitwise_and",
                         "integer or bool", "float32");
    tu_assert_null_error(ct_bitwise_left_shift(bb, bb), CT_ERR_DTYPE, "ct_bitwise_left_shift",
                         "integer operands", "bool");
    tu_assert_null_error(ct_bitwise_or_scalar(i32, 1.5), CT_ERR_DTYPE, "ct_bitwise_or_scalar",
                         "float32"); /* a float scalar makes the operation float32 */
    tu_assert_null_error(ct_bitwise_not(f), CT_ERR_DTYPE, "ct_bitwise_not", "integer or bool",
                         "float32");
    tu_assert_null_error(ct_bitwise_xor(NULL, i32), CT_ERR_INVALID_ARG, "ct_bitwise_xor");
    tu_assert_null_error(ct_fmod(bb, bb), CT_ERR_DTYPE, "ct_fmod", "bool");
    ct_tensor *i3 = chk(ct_tensor_ones(1, (const int64_t[]){3}, CT_I32, CT_CPU));
    tu_assert_null_error(ct_bitwise_and(i32, i3), CT_ERR_SHAPE, "ct_bitwise_and");
    release_all(9, (ct_tensor *[]){bb, i32, i64, p1, p2, nt, nt64, nb, f});
    ct_tensor_release(i3);
}

/* ---- isnan, isinf, isfinite, nan_to_num -------------------------------------------------------- */
static void test_classify(void **state) {
    (void)state;
    static const int64_t s[] = {3, 7};
    for (int d = 0; d < 7; d++) {
        ct_dtype dt = tu_all_dtypes[d];
        bool flt = ct_dtype_is_floating(dt);
        for (int nc = 0; nc < 2; nc++) {
            double *v = tu_rand_vals(21, dt, -5, 5);
            if (flt) v[2] = NAN, v[5] = INFINITY, v[11] = -INFINITY, v[17] = NAN;
            ct_tensor *x0 = chk(tu_from_f64(v, 2, s, dt));
            ct_tensor *x = nc ? chk(tu_noncontig(x0)) : ct_tensor_retain(x0);
            double rn[21], ri[21], rf[21];
            for (int i = 0; i < 21; i++) /* glibc's isinf is -1 for -inf */
                rn[i] = isnan(v[i]) != 0, ri[i] = isinf(v[i]) != 0, rf[i] = isfinite(v[i]) != 0;
            ct_tensor *a = ct_isnan(x), *b = ct_isinf(x), *c = ct_isfinite(x);
            expect(a, CT_BOOL, 2, s, rn, 0, 0);
            expect(b, CT_BOOL, 2, s, ri, 0, 0);
            expect(c, CT_BOOL, 2, s, rf, 0, 0);
            /* nan_to_num: the defaults (0, the dtype's largest and lowest), then given values */
            double top = dt == CT_F16 ? 65504 : dt == CT_BF16 ? 3.3895313892515355e38
                         : dt == CT_F32 ? FLT_MAX : DBL_MAX;
            double r1[21], r2[21];
            for (int i = 0; i < 21; i++) {
                double e = v[i];
                r1[i] = isnan(e) ? 0 : e == INFINITY ? top : e == -INFINITY ? -top : e;
                r2[i] = tu_round(isnan(e) ? 1.5 : e == INFINITY ? 100 : e == -INFINITY ? -7 : e, dt);
            }
            ct_tensor *y1 = ct_nan_to_num(x, 0, NAN, NAN), *y2 = ct_nan_to_num(x, 1.5, 100, -7);
            expect(y1, dt, 2, s, r1, 0, 0);
            expect(y2, dt, 2, s, r2, 0, 0);
            release_all(7, (ct_tensor *[]){x0, x, a, b, c, y1, y2});
            free(v);
        }
    }
    tu_assert_null_error(ct_isnan(NULL), CT_ERR_INVALID_ARG, "ct_isnan");
    tu_assert_null_error(ct_nan_to_num(NULL, 0, NAN, NAN), CT_ERR_INVALID_ARG, "ct_nan_to_num");
}

/* ---- special values of the unary ops ---------------------------------------------------------- */
/* fn at n points in float32 and float64 against want, exactly (NaN matching NaN, the sign of
 * zero compared too). */
static void exact_points(const char *name, ct_tensor *(*fn)(ct_tensor *), const double *x,
                         const double *want, int n) {
    int64_t s[1] = {n};
    for (int d = 0; d < 2; d++) {
        ct_dtype dt = d ? CT_F32 : CT_F64;
        ct_tensor *t = chk(tu_from_f64(x, 1, s, dt));
        ct_tensor *y = fn(t);
        chk(y);
        double *v = tu_values(y);
        for (int i = 0; i < n; i++) {
            double w = tu_round(want[i], dt);
            bool ok = isnan(w) ? isnan(v[i]) : v[i] == w && signbit(v[i]) == signbit(w);
            if (!ok) {
                fprintf(stderr, "%s %s(%.17g) = %.17g, expected %.17g\n", ct_dtype_name(dt), name,
                        x[i], v[i], w);
                fail();
            }
        }
        free(v);
        release_all(2, (ct_tensor *[]){t, y});
    }
}

static ct_tensor *round2(ct_tensor *x) { return ct_round_decimals(x, 2); }
static ct_tensor *round_m2(ct_tensor *x) { return ct_round_decimals(x, -2); }

static void test_special_values(void **state) {
    (void)state;
    const double I = INFINITY;
    {
        const double x[] = {0.5, 1.5, 2.5, -0.5, -2.5, 3.7, -3.7, -0.0, I, -I, NAN};
        const double rd[] = {0, 2, 2, -0.0, -2, 4, -4, -0.0, I, -I, NAN};
        const double fl[] = {0, 1, 2, -1, -3, 3, -4, -0.0, I, -I, NAN};
        const double ce[] = {1, 2, 3, -0.0, -2, 4, -3, -0.0, I, -I, NAN};
        const double tr[] = {0, 1, 2, -0.0, -2, 3, -3, -0.0, I, -I, NAN};
        exact_points("round", ct_round, x, rd, 11);
        exact_points("floor", ct_floor, x, fl, 11);
        exact_points("ceil", ct_ceil, x, ce, 11);
        exact_points("trunc", ct_trunc, x, tr, 11);
    }
    {
        const double x[] = {1.125, -1.125, 0.015, 2.345, -0.0, 1250, 1350, -1250};
        const double r2[] = {1.12, -1.12, 0.02, 2.35, -0.0, 1250, 1350, -1250};
        const double rm2[] = {0, -0.0, 0, 0, -0.0, 1200, 1400, -1200};
        /* 1.125 * 100 = 112.5 exactly: even; 0.015 and 2.345 are not exact in binary, so
         * take only the float64 answer where float32 agrees */
        exact_points("round_decimals(2)", round2, x, r2, 2);
        exact_points("round_decimals(-2)", round_m2, x, rm2, 8);
    }
    {
        const double x[] = {-0.0, 0.0, -1, -2, I, 1e-30};
        const double l1p[] = {-0.0, 0, -I, NAN, I, 1e-30};
        exact_points("log1p", ct_log1p, x, l1p, 6);
    }
    {
        const double x[] = {-0.0, 0.0, -I, I, NAN, -200};
        const double em1[] = {-0.0, 0, -1, I, NAN, -1};
        const double e2[] = {1, 1, 0, I, NAN, 0x1p-200};
        exact_points("expm1", ct_expm1, x, em1, 6);
        exact_points("exp2", ct_exp2, x, e2, 6);
    }
    {
        const double x[] = {8, 0.25, 1024, 1, 0, -1, I, NAN};
        const double l2[] = {3, -2, 10, 0, -I, NAN, I, NAN};
        exact_points("log2", ct_log2, x, l2, 8);
        const double e[] = {3, -2, 10, 0, -3, 7};
        const double p2[] = {8, 0.25, 1024, 1, 0.125, 128};
        exact_points("exp2", ct_exp2, e, p2, 6);
    }
    {
        const double x[] = {1, -1, 0, -0.0, 1.5, NAN};
        const double ei[] = {I, -I, 0, -0.0, NAN, NAN};
        exact_points("erfinv", ct_erfinv, x, ei, 6);
        const double x2[] = {0, -0.0, I, -I, NAN};
        const double er[] = {0, -0.0, 1, -1, NAN};
        const double ec[] = {1, 1, 0, 2, NAN};
        exact_points("erf", ct_erf, x2, er, 5);
        exact_points("erfc", ct_erfc, x2, ec, 5);
    }
    {
        const double x[] = {-0.0, 1.5, -1.5, I, NAN};
        const double as[] = {-0.0, NAN, NAN, NAN, NAN};
        const double at[] = {-0.0, atan(1.5), atan(-1.5), M_PI / 2, NAN};
        exact_points("asin", ct_asin, x, as, 5);
        exact_points("atan", ct_atan, x, at, 5);
        const double ac[] = {M_PI / 2, NAN, NAN, NAN, NAN};
        exact_points("acos", ct_acos, x, ac, 5);
        const double x2[] = {1, 0.5, -2, I, NAN};
        const double ach[] = {0, NAN, NAN, I, NAN};
        exact_points("acosh", ct_acosh, x2, ach, 5);
        const double x3[] = {1, -1, 2, -0.0, NAN};
        const double ath[] = {I, -I, NAN, -0.0, NAN};
        exact_points("atanh", ct_atanh, x3, ath, 5);
        const double x4[] = {-0.0, I, -I, 1000, -1000, NAN};
        const double sh[] = {-0.0, I, -I, I, -I, NAN};
        const double chh[] = {1, I, I, I, I, NAN};
        exact_points("sinh", ct_sinh, x4, sh, 6);
        exact_points("cosh", ct_cosh, x4, chh, 6);
        const double x5[] = {-0.0, I, -I, NAN};
        const double tn[] = {-0.0, NAN, NAN, NAN};
        const double asn[] = {-0.0, I, -I, NAN};
        exact_points("tan", ct_tan, x5, tn, 4);
        exact_points("asinh", ct_asinh, x5, asn, 4);
    }
    {
        const double x[] = {-I, I, NAN, -0.0, 2.75, -2.75};
        const double fr[] = {NAN, NAN, NAN, 0.0, 0.75, -0.75}; /* -0 - -0 = +0, as PyTorch */
        exact_points("frac", ct_frac, x, fr, 6);
        const double hsw[] = {NAN, I, NAN, -0.0, 2.75 * 5.75 / 6, -2.75 * 0.25 / 6}; /* -inf * 0 */
        exact_points("hardswish", ct_hardswish, x, hsw, 6);
    }
}

static ct_tensor *celu0(ct_tensor *x) { return ct_celu(x, 0); }

static void test_unary_errors(void **state) {
    (void)state;
    ct_tensor *x = chk(ct_tensor_ones(1, (const int64_t[]){4}, CT_F32, CT_CPU));
    ct_tensor *i = chk(ct_tensor_ones(1, (const int64_t[]){4}, CT_I64, CT_CPU));
    ct_tensor *b = chk(ct_tensor_ones(1, (const int64_t[]){4}, CT_BOOL, CT_CPU));
    tu_assert_null_error(ct_hardtanh(x, 1, -1), CT_ERR_INVALID_ARG, "ct_hardtanh",
                         "cannot be greater");
    tu_assert_null_error(celu0(x), CT_ERR_INVALID_ARG, "ct_celu", "alpha");
    tu_assert_null_error(ct_round_decimals(x, 1000), CT_ERR_INVALID_ARG, "ct_round_decimals",
                         "decimals");
    tu_assert_null_error(ct_round_decimals(i, 0), CT_ERR_DTYPE, "ct_round_decimals", "floating",
                         "int64");
    tu_assert_null_error(ct_floor(b), CT_ERR_DTYPE, "ct_floor", "bool");
    tu_assert_null_error(ct_leaky_relu(i, 0.01), CT_ERR_DTYPE, "ct_leaky_relu", "floating");
    tu_assert_null_error(ct_log1p(NULL), CT_ERR_INVALID_ARG, "ct_log1p");
    /* bool through nan_to_num stays bool, as in PyTorch */
    ct_tensor *nb = ct_nan_to_num(b, 0, NAN, NAN);
    assert_int_equal(ct_tensor_dtype(chk(nb)), CT_BOOL);
    release_all(4, (ct_tensor *[]){x, i, b, nb});
}

/* ---- lerp ---------------------------------------------------------------------------------------- */
static double r_lerp(double a, double b, double w) {
    return fabs(w) < 0.5 ? a + w * (b - a) : b - (b - a) * (1 - w);
}

static void test_lerp(void **state) {
    (void)state;
    static const int64_t sa[] = {4, 1, 5}, sb[] = {3, 1}, sw[] = {5}, so[] = {4, 3, 5};
    int64_t n = tu_numel(3, so);
    for (int d = 0; d < 4; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (int nc = 0; nc < 2; nc++) {
            double *va, *vb, *vw;
            ct_tensor *a = rnd(3, sa, dt, -3, 3, nc, &va), *b = rnd(2, sb, dt, -3, 3, nc, &vb);
            ct_tensor *w = rnd(1, sw, dt, -0.5, 1.5, nc, &vw);
            double ref[60], refs[60];
            for (int64_t i = 0; i < n; i++) {
                double x = va[bidx(i, 3, so, 3, sa)], y = vb[bidx(i, 3, so, 2, sb)];
                ref[i] = tu_round(r_lerp(x, y, vw[bidx(i, 3, so, 1, sw)]), dt);
                refs[i] = tu_round(r_lerp(x, y, 0.75), dt);
            }
            poison(n);
            ct_tensor *y = ct_lerp(a, b, w), *z = ct_lerp_scalar(a, b, 0.75);
            /* a few roundings of the operands' size */
            double tol = 4 * tu_rtol(dt);
            expect(y, dt, 3, so, ref, tol, tol);
            expect(z, dt, 3, so, refs, tol, tol);
            release_all(5, (ct_tensor *[]){a, b, w, y, z});
            free(va);
            free(vb);
            free(vw);
        }
    }
    /* weight 1 gives end exactly, 0 start */
    const double av[] = {0.1, -3, 1e10}, bv[] = {0.7, 5, -1e-10};
    ct_tensor *a = chk(tu_from_f64(av, 1, (const int64_t[]){3}, CT_F32));
    ct_tensor *b = chk(tu_from_f64(bv, 1, (const int64_t[]){3}, CT_F32));
    ct_tensor *e1 = ct_lerp_scalar(a, b, 1), *e0 = ct_lerp_scalar(a, b, 0);
    double *g1 = tu_values(chk(e1)), *g0 = tu_values(chk(e0));
    for (int i = 0; i < 3; i++) {
        assert_true(g1[i] == (double)(float)bv[i]);
        assert_true(g0[i] == (double)(float)av[i]);
    }
    free(g1);
    free(g0);
    ct_tensor *d = chk(ct_to_dtype(b, CT_F64)), *ii = chk(ct_to_dtype(a, CT_I32));
    tu_assert_null_error(ct_lerp(a, d, a), CT_ERR_DTYPE, "ct_lerp", "expected dtype float32",
                         "end", "float64");
    tu_assert_null_error(ct_lerp(a, b, d), CT_ERR_DTYPE, "ct_lerp", "weight", "float64");
    tu_assert_null_error(ct_lerp_scalar(ii, ii, 0.5), CT_ERR_DTYPE, "ct_lerp_scalar", "floating");
    tu_assert_null_error(ct_lerp(a, b, NULL), CT_ERR_INVALID_ARG, "ct_lerp");
    ct_tensor *four = chk(ct_tensor_ones(1, (const int64_t[]){4}, CT_F32, CT_CPU));
    tu_assert_null_error(ct_lerp(a, four, a), CT_ERR_SHAPE, "ct_lerp");
    release_all(7, (ct_tensor *[]){a, b, e1, e0, d, ii, four});
}

/* ---- clamp with tensor bounds ------------------------------------------------------------------- */
static void test_clamp_tensor(void **state) {
    (void)state;
    static const int64_t sx[] = {4, 6}, sl[] = {6}, sh[] = {4, 1};
    for (int d = 0; d < 6; d++) {
        ct_dtype dt = tu_all_dtypes[d];
        for (int nc = 0; nc < 2; nc++) {
            double *vx, *vl, *vh;
            ct_tensor *x = rnd(2, sx, dt, -9, 9, nc, &vx), *lo = rnd(1, sl, dt, -6, 0, nc, &vl);
            ct_tensor *hi = rnd(2, sh, dt, 0, 6, nc, &vh);
            if (ct_dtype_is_floating(dt)) {
                vx[3] = NAN;
                ct_tensor_release(x);
                x = chk(tu_from_f64(vx, 2, sx, dt));
            }
            double rb[24], rl[24], rh[24];
            for (int i = 0; i < 24; i++) {
                double v = vx[i], l = vl[i % 6], h = vh[i / 6];
                rl[i] = isnan(v) ? v : fmax(v, l);
                rh[i] = isnan(v) ? v : fmin(v, h);
                rb[i] = isnan(v) ? v : fmin(fmax(v, l), h);
            }
            ct_tensor *yb = ct_clamp_tensor(x, lo, hi), *yl = ct_clamp_tensor(x, lo, NULL);
            ct_tensor *yh = ct_clamp_tensor(x, NULL, hi);
            expect(yb, dt, 2, sx, rb, 0, 0);
            expect(yl, dt, 2, sx, rl, 0, 0);
            expect(yh, dt, 2, sx, rh, 0, 0);
            release_all(6, (ct_tensor *[]){x, lo, hi, yb, yl, yh});
            /* in a scope, each bound alone: the scope's end releases x and the results */
            tu_scope sc = tu_scope_begin();
            ct_tensor *xs = chk(tu_from_f64(vx, 2, sx, dt)), *hs = chk(tu_from_f64(vh, 2, sh, dt));
            assert_non_null(ct_clamp_tensor(xs, NULL, hs));
            assert_non_null(ct_clamp_tensor(xs, hs, NULL));
            tu_scope_end_clean(sc);
            free(vx);
            free(vl);
            free(vh);
        }
    }
    /* promotion: int32 x with float32 bounds gives float32; a NaN bound gives NaN */
    const double xv[] = {-5, 0, 5}, lv[] = {-1.5, NAN, -1.5}, hv[] = {2.5};
    ct_tensor *x = chk(tu_from_f64(xv, 1, (const int64_t[]){3}, CT_I32));
    ct_tensor *lo = chk(tu_from_f64(lv, 1, (const int64_t[]){3}, CT_F32));
    ct_tensor *hi = chk(tu_from_f64(hv, 1, (const int64_t[]){1}, CT_F32));
    ct_tensor *y = ct_clamp_tensor(x, lo, hi);
    const double want[] = {-1.5, NAN, 2.5};
    expect(y, CT_F32, 1, (const int64_t[]){3}, want, 0, 0);
    tu_assert_null_error(ct_clamp_tensor(x, NULL, NULL), CT_ERR_INVALID_ARG, "ct_clamp_tensor",
                         "at least one");
    ct_tensor *b = chk(ct_tensor_ones(1, (const int64_t[]){3}, CT_BOOL, CT_CPU));
    tu_assert_null_error(ct_clamp_tensor(b, b, NULL), CT_ERR_DTYPE, "ct_clamp_tensor", "bool");
    tu_assert_null_error(ct_clamp_tensor(NULL, lo, hi), CT_ERR_INVALID_ARG, "ct_clamp_tensor");
    release_all(5, (ct_tensor *[]){x, lo, hi, y, b});
}

/* ---- gradients ------------------------------------------------------------------------------------ */
static ct_tensor *rand_leaf(shp s, double lo, double hi, bool nc, bool grad) {
    ct_tensor *t = rnd(s.nd, s.s, CT_F64, lo, hi, nc, NULL);
    if (grad) assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

static ct_tensor *g_atan2(ct_tensor *const *in, void *c) { return (void)c, ct_atan2(in[0], in[1]); }
static ct_tensor *g_fmod(ct_tensor *const *in, void *c) { return (void)c, ct_fmod(in[0], in[1]); }
static ct_tensor *g_rem(ct_tensor *const *in, void *c) { return (void)c, ct_remainder(in[0], in[1]); }
static ct_tensor *g_fmod_s(ct_tensor *const *in, void *c) { return (void)c, ct_fmod_scalar(in[0], -0.7); }
static ct_tensor *g_rem_s(ct_tensor *const *in, void *c) {
    return (void)c, ct_remainder_scalar(in[0], 0.9);
}
static ct_tensor *g_lerp(ct_tensor *const *in, void *c) { return (void)c, ct_lerp(in[0], in[1], in[2]); }
static ct_tensor *g_lerp_s(ct_tensor *const *in, void *c) {
    return (void)c, ct_lerp_scalar(in[0], in[1], 0.3);
}
static ct_tensor *g_clamp_t(ct_tensor *const *in, void *c) {
    return (void)c, ct_clamp_tensor(in[0], in[1], in[2]);
}

/* Whether a finite difference of fmod or remainder (a by b, or by the number
 * by when it is not NAN) could cross one of its jumps: a / b within 1e-4 of a
 * whole number for some pair of broadcast elements. */
static bool near_jump(ct_tensor *a, ct_tensor *b, double by) {
    ct_tensor *q = isnan(by) ? ct_div(a, b) : ct_div_scalar(a, by);
    assert_non_null(q);
    double *v = tu_values(q);
    bool near = false;
    for (int64_t i = 0; i < ct_tensor_numel(q); i++) near |= fabs(v[i] - nearbyint(v[i])) < 1e-4;
    free(v);
    ct_tensor_release(q);
    return near;
}

static void test_gradients(void **state) {
    (void)state;
    static const shp pairs[][3] = {
        {SHP(3, 4), SHP(3, 4), SHP(3, 4)}, {SHP(3, 1), SHP(4), SHP(1)},
        {SHP(2, 1, 3), SHP(4, 1), SHP(3)}, {SHP0, SHP(2, 3), SHP0}};
    /* by: the divisor of an op that jumps where a / by is a whole number
     * (NAN: the tensor in[1]; 0: no jumps). */
    static const struct {
        const char *name;
        ct_gradcheck_fn fn;
        int nin;
        double lo[3], hi[3];
        double by;
    } cases[] = {
        {"atan2", g_atan2, 2, {-2, -2}, {2, 2}, 0},
        {"atan2 positive", g_atan2, 2, {0.2, 0.2}, {2, 2}, 0},
        {"fmod", g_fmod, 2, {-3, 0.6}, {3, 1.7}, NAN},
        {"fmod negative", g_fmod, 2, {-3, -1.7}, {3, -0.6}, NAN},
        {"remainder", g_rem, 2, {-3, 0.6}, {3, 1.7}, NAN},
        {"remainder negative", g_rem, 2, {-3, -1.7}, {3, -0.6}, NAN},
        {"fmod scalar", g_fmod_s, 1, {-3}, {3}, -0.7},
        {"remainder scalar", g_rem_s, 1, {-3}, {3}, 0.9},
        {"lerp", g_lerp, 3, {-2, -2, -0.5}, {2, 2, 1.5}, 0},
        {"lerp scalar", g_lerp_s, 2, {-2, -2}, {2, 2}, 0},
        /* bounds apart from x, so no element sits on a bound */
        {"clamp_tensor", g_clamp_t, 3, {-2, -1, 0.5}, {2, -0.5, 1}, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (size_t s = 0; s < sizeof pairs / sizeof pairs[0]; s++) {
            for (int which = 1; which < (1 << cases[k].nin); which++) {
                for (int nc = 0; nc < 2; nc++) {
                    ct_tensor *in[3] = {NULL, NULL, NULL};
                    do {
                        for (int i = 0; i < cases[k].nin; i++) {
                            ct_tensor_release(in[i]);
                            in[i] = rand_leaf(pairs[s][i], cases[k].lo[i], cases[k].hi[i], nc,
                                              (which >> i) & 1);
                        }
                    } while (cases[k].by != 0 && near_jump(in[0], in[1], cases[k].by));
                    char what[96];
                    snprintf(what, sizeof what, "%s shapes#%zu grads %d%s", cases[k].name, s,
                             which, nc ? " noncontig" : "");
                    gradcheck_ok(what, cases[k].fn, NULL, cases[k].nin, in);
                    for (int i = 0; i < cases[k].nin; i++) ct_tensor_release(in[i]);
                }
            }
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_binary_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_binary_scalar_promotion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_int_zero_divisor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bitwise, setup, teardown),
        cmocka_unit_test_setup_teardown(test_classify, setup, teardown),
        cmocka_unit_test_setup_teardown(test_special_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unary_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lerp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clamp_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradients, setup, teardown),
    };
    tu_seed();
    return tu_run_tests(tests);
}
