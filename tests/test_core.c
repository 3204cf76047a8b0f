/* Core objects and the factory layer: dtypes and promotion, half-precision
 * conversion, creation, random numbers, copies between dtypes, views,
 * reshape/cat/stack, scopes and reference counts. */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "test_fixture.h"

#include "core/hashmap.h"
#include "core/tensor_impl.h"
#include "dispatch/dispatch_impl.h"

/* ---- fixtures: every test must leave no tensor or storage alive ---------------------- */

#define N_DTYPES 7
static const ct_dtype all_dt[N_DTYPES] = {CT_BOOL, CT_I32, CT_I64, CT_F16, CT_BF16, CT_F32, CT_F64};

/* ---- float64 references for the half-precision formats --------------------------------- */

/* Rounds |a| (finite, a float value) to a format with `mant` explicit
 * mantissa bits, minimum normal exponent emin and bias, giving the bits
 * without sign; overflow gives the infinity pattern. */
static uint32_t ref_encode_mag(double a, int mant, int emin, int bias, uint32_t inf_bits) {
    if (a == 0) return 0;
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;       /* a in [2^e, 2^(e+1)) */
    if (e < emin) e = emin; /* subnormal range shares the smallest quantum */
    double quantum = ldexp(1.0, e - mant);
    double r = nearbyint(a / quantum); /* ties to even in the default mode */
    uint64_t bits;
    if (a < ldexp(1.0, emin)) {
        bits = (uint64_t)r; /* r == 2^mant lands on the smallest normal, as it should */
    } else {
        bits = ((uint64_t)(e + bias) << mant) + ((uint64_t)r - ((uint64_t)1 << mant));
    }
    if (bits >= inf_bits) return inf_bits;
    return (uint32_t)bits;
}

static uint16_t ref_f16_encode(double x) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (isnan(x)) return sign | 0x7e00;
    if (isinf(x)) return sign | 0x7c00;
    return sign | (uint16_t)ref_encode_mag(fabs(x), 10, -14, 15, 0x7c00);
}

static double ref_f16_decode(uint16_t h) {
    double sign = (h & 0x8000) ? -1.0 : 1.0;
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) return sign * ldexp(m, -24);
    if (e == 31) return m ? NAN : sign * INFINITY;
    return sign * ldexp(1024 + m, e - 25);
}

static uint16_t ref_bf16_encode(double x) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (isnan(x)) return sign | 0x7fc0;
    if (isinf(x)) return sign | 0x7f80;
    return sign | (uint16_t)ref_encode_mag(fabs(x), 7, -126, 127, 0x7f80);
}

static bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* What a copy into dst makes of the exact source value v (see copy.c):
 * C-cast semantics, saturation outside the integer range, NaN -> 0. */
static double ref_convert(double v, ct_dtype src, ct_dtype dst) {
    switch (dst) {
    case CT_F64: return v;
    case CT_F32: return (double)(float)v;
    case CT_F16: return ref_f16_decode(ref_f16_encode((double)(float)v));
    case CT_BF16: return (double)ct_bf16_to_f32(ref_bf16_encode((double)(float)v));
    case CT_BOOL: return v != 0;
    case CT_I32:
        if (!ct_dtype_is_floating(src)) return (double)(int32_t)(uint32_t)(int64_t)v;
        if (isnan(v)) return 0;
        if (v <= -2147483648.0) return -2147483648.0;
        if (v >= 2147483647.0) return 2147483647.0;
        return trunc(v);
    case CT_I64:
        if (isnan(v)) return 0;
        return ct_dtype_is_floating(src) ? trunc(v) : v;
    default: return NAN;
    }
}

/* Source values exercising conversions: fractions of both signs (truncation
 * toward zero), zeros, whole numbers and wider floats. */
static double *mixed_vals(int64_t n, ct_dtype dt) {
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        double x;
        switch (tu_next() % 5) {
        case 0: x = 0.0; break;
        case 1: x = tu_uniform(-0.99, 0.99); break;
        case 2: x = (double)tu_randint(-120, 120); break;
        default: x = tu_uniform(-250.0, 250.0); break;
        }
        if (dt == CT_BOOL) x = x != 0;
        else if (!ct_dtype_is_floating(dt)) x = trunc(x);
        v[i] = tu_round(x, dt);
    }
    return v;
}

static ct_tensor *rand_t(int ndim, const int64_t *shape, ct_dtype dt, double **vals) {
    return tu_rand(ndim, shape, dt, -3.0, 3.0, vals);
}

static void assert_values(const ct_tensor *t, const double *ref, double rtol, double atol) {
    double *g = tu_values(t);
    tu_assert_close(g, ref, ct_tensor_numel(t), rtol, atol);
    free(g);
}

static void assert_shape(const ct_tensor *t, int ndim, const int64_t *shape) {
    assert_non_null(t);
    assert_int_equal(ct_tensor_ndim(t), ndim);
    for (int i = 0; i < ndim; i++) assert_int_equal(ct_tensor_shape(t)[i], shape[i]);
}

/* Row-major index -> element offset in the given geometry. */
static int64_t strided_offset(int64_t k, int nd, const int64_t *shape, const int64_t *stride) {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (k % shape[d]) * stride[d];
        k /= shape[d];
    }
    return off;
}

/* ======================================================================================
 * dtypes, promotion, devices
 * ====================================================================================== */

static void test_dtype_sizes_names(void **state) {
    (void)state;
    static const size_t sizes[N_DTYPES] = {1, 4, 8, 2, 2, 4, 8};
    static const char *names[N_DTYPES] = {"bool", "int32", "int64", "float16", "bfloat16",
                                          "float32", "float64"};
    for (int i = 0; i < N_DTYPES; i++) {
        assert_int_equal(ct_dtype_size(all_dt[i]), sizes[i]);
        assert_string_equal(ct_dtype_name(all_dt[i]), names[i]);
        bool fl = i >= 3;
        assert_int_equal(ct_dtype_is_floating(all_dt[i]), fl);
        assert_int_equal(ct_dtype_is_integral(all_dt[i]), !fl);
    }
    assert_string_equal(ct_dtype_name((ct_dtype)99), "invalid");
    assert_int_equal(ct_dtype_size((ct_dtype)99), 0);
    assert_false(ct_dtype_is_floating((ct_dtype)-1));
    assert_string_equal(ct_status_name(CT_ERR_SHAPE), "CT_ERR_SHAPE");
    assert_string_equal(ct_status_name(CT_OK), "CT_OK");
}

static void test_promotion_table(void **state) {
    (void)state;
    /* torch.promote_types over (bool, int32, int64, float16, bfloat16, float32, float64). */
    enum { B = CT_BOOL, I = CT_I32, L = CT_I64, H = CT_F16, BF = CT_BF16, F = CT_F32, D = CT_F64 };
    static const int table[N_DTYPES][N_DTYPES] = {
        /*          bool int32 int64 f16  bf16  f32 f64 */
        /* bool */ {B, I, L, H, BF, F, D},
        /* i32  */ {I, I, L, H, BF, F, D},
        /* i64  */ {L, L, L, H, BF, F, D},
        /* f16  */ {H, H, H, H, F, F, D},
        /* bf16 */ {BF, BF, BF, F, BF, F, D},
        /* f32  */ {F, F, F, F, F, F, D},
        /* f64  */ {D, D, D, D, D, D, D},
    };
    for (int a = 0; a < N_DTYPES; a++)
        for (int b = 0; b < N_DTYPES; b++) {
            ct_dtype got = ct_promote_types(all_dt[a], all_dt[b]);
            if ((int)got != table[a][b])
                fail_msg("promote(%s, %s) = %s, expected %s", ct_dtype_name(all_dt[a]),
                         ct_dtype_name(all_dt[b]), ct_dtype_name(got),
                         ct_dtype_name((ct_dtype)table[a][b]));
        }
    /* Not dtypes: refused, not returned. */
    assert_int_equal(ct_promote_types((ct_dtype)99, (ct_dtype)-7), CT_NUM_DTYPES);
    tu_assert_error(ct_last_status(), CT_ERR_DTYPE, "ct_promote_types", "invalid dtype 99");
    assert_int_equal(ct_promote_types(CT_F32, (ct_dtype)-7), CT_NUM_DTYPES);
    tu_assert_error(ct_last_status(), CT_ERR_DTYPE, "ct_promote_types", "invalid dtype -7");
    assert_int_equal(ct_promote_types(CT_F32, CT_NUM_DTYPES), CT_NUM_DTYPES);
}

static void test_result_type_and_can_cast(void **state) {
    (void)state;
    int64_t sh[1] = {3};
    ct_tensor *i32 = ct_tensor_zeros(1, sh, CT_I32, CT_CPU);
    ct_tensor *f16 = ct_tensor_zeros(1, sh, CT_F16, CT_CPU);
    ct_tensor *d0 = ct_tensor_scalar(1.0, CT_F64, CT_CPU);
    ct_tensor *l0 = ct_tensor_scalar(1.0, CT_I64, CT_CPU);
    /* A 0-d tensor of a higher category wins, of the same category it does not. */
    assert_int_equal(cti_result_type(2, (ct_tensor *[]){i32, d0}), CT_F64);
    assert_int_equal(cti_result_type(2, (ct_tensor *[]){f16, d0}), CT_F16);
    assert_int_equal(cti_result_type(2, (ct_tensor *[]){i32, l0}), CT_I32);
    assert_int_equal(cti_result_type(2, (ct_tensor *[]){i32, f16}), CT_F16);
    assert_true(cti_can_cast(CT_I32, CT_F32));
    assert_true(cti_can_cast(CT_BOOL, CT_I64));
    assert_false(cti_can_cast(CT_F32, CT_I64));
    assert_false(cti_can_cast(CT_I32, CT_BOOL));
    ct_tensor_release(i32);
    ct_tensor_release(f16);
    ct_tensor_release(d0);
    ct_tensor_release(l0);
}

static void test_device_strings(void **state) {
    (void)state;
    char buf[32];
    assert_string_equal(ct_device_str(CT_CPU, buf, sizeof buf), "cpu");
    assert_string_equal(ct_device_str(CT_CUDA(1), buf, sizeof buf), "cuda:1");
    assert_true(ct_device_eq(CT_CPU, CT_CPU));
    assert_false(ct_device_eq(CT_CPU, CT_CUDA(0)));
    assert_false(ct_device_eq(CT_CUDA(0), CT_CUDA(1)));
    assert_true(ct_backend_available(CT_DEVICE_CPU));
    assert_int_equal(ct_device_count(CT_DEVICE_CPU), 1);
    char sb[64];
    assert_string_equal(ct_shape_str(CT_SHAPE(2, 3), sb, sizeof sb), "[2, 3]");
    assert_string_equal(ct_shape_str(CT_NONE, sb, sizeof sb), "[]");
}

/* ======================================================================================
 * half precision
 * ====================================================================================== */

static void test_f16_decode_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        double ref = ref_f16_decode((uint16_t)h);
        float got = ct_f16_to_f32((uint16_t)h);
        if (isnan(ref)) {
            if (!isnan(got)) fail_msg("f16 0x%04x: expected NaN, got %g", h, got);
            continue;
        }
        if ((double)got != ref || !signbit(got) != !signbit(ref))
            fail_msg("f16 0x%04x: got %.9g, expected %.9g", h, got, ref);
    }
}

static void test_f16_round_trip_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t back = ct_f32_to_f16(ct_f16_to_f32((uint16_t)h));
        if (f16_is_nan((uint16_t)h)) {
            if (!f16_is_nan(back)) fail_msg("NaN 0x%04x came back as 0x%04x", h, back);
            if ((back & 0x8000) != (h & 0x8000)) fail_msg("NaN 0x%04x lost its sign", h);
        } else if (back != h) {
            fail_msg("f16 0x%04x -> %g -> 0x%04x", h, ct_f16_to_f32((uint16_t)h), back);
        }
    }
}

static void check_f16_encode(float f) {
    uint16_t got = ct_f32_to_f16(f), ref = ref_f16_encode(f);
    if (isnan(f)) {
        if (!f16_is_nan(got)) fail_msg("NaN encoded as 0x%04x", got);
        return;
    }
    if (got != ref) {
        uint32_t u;
        memcpy(&u, &f, 4);
        fail_msg("f32 %.9g (0x%08x): got 0x%04x, expected 0x%04x", f, (unsigned)u, got, ref);
    }
}

static void test_f32_to_f16_rounding(void **state) {
    (void)state;
    /* Every halfway point between neighbouring f16 values, and the floats just
     * either side of it, for both signs: ties go to the even mantissa. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double lo = ref_f16_decode((uint16_t)h), hi = ref_f16_decode((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2); /* exact: f16 has 11 significant bits */
        assert_true((double)mid == (lo + hi) / 2);
        uint16_t expect = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (h + 1 == 0x7c00) expect = 0x7c00; /* 65520 rounds to even: infinity */
        assert_int_equal(ct_f32_to_f16(mid), expect);
        assert_int_equal(ct_f32_to_f16(-mid), expect | 0x8000);
        check_f16_encode(nextafterf(mid, 0.0f));
        check_f16_encode(nextafterf(mid, INFINITY));
        check_f16_encode(-nextafterf(mid, INFINITY));
    }
    /* Subnormals, the smallest values and underflow. */
    assert_int_equal(ct_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(ct_f32_to_f16(0x1p-25f), 0x0000);                 /* tie to even: 0 */
    assert_int_equal(ct_f32_to_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    assert_int_equal(ct_f32_to_f16(0x1.8p-24f), 0x0002);               /* 1.5 ulp: tie to 2 */
    assert_int_equal(ct_f32_to_f16(0x1p-14f), 0x0400);                 /* smallest normal */
    assert_int_equal(ct_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(ct_f32_to_f16(1e-10f), 0x0000);
    /* Overflow. */
    assert_int_equal(ct_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(ct_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(ct_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(ct_f32_to_f16(1e30f), 0x7c00);
    assert_int_equal(ct_f32_to_f16(-1e30f), 0xfc00);
    assert_int_equal(ct_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(ct_f32_to_f16(-INFINITY), 0xfc00);
    assert_true(f16_is_nan(ct_f32_to_f16(NAN)));
    assert_true(f16_is_nan(ct_f32_to_f16(bits_f32(0x7f800001u)))); /* signalling payload */
    /* Random floats over the whole range, bit-exact against the reference. */
    for (int i = 0; i < 400000; i++) {
        uint32_t u = (uint32_t)tu_next();
        if (i % 2) u = (u & 0x80000000u) | (0x30000000u + (u % 0x10000000u)); /* near f16 range */
        check_f16_encode(bits_f32(u));
    }
}

static void test_bf16_conversion(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ct_bf16_to_f32((uint16_t)h);
        uint32_t u;
        memcpy(&u, &f, 4);
        assert_int_equal(u, h << 16); /* bf16 is the top half of a float */
        uint16_t back = ct_f32_to_bf16(f);
        if (bf16_is_nan((uint16_t)h)) assert_true(bf16_is_nan(back));
        else assert_int_equal(back, h);
    }
    /* Halfway cases: ties to even. */
    for (uint32_t h = 0; h < 0x7f80; h += 7) {
        uint32_t mid = (h << 16) | 0x8000u;
        uint16_t expect = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        assert_int_equal(ct_f32_to_bf16(bits_f32(mid)), expect);
        assert_int_equal(ct_f32_to_bf16(bits_f32(mid + 1)), h + 1);
        assert_int_equal(ct_f32_to_bf16(bits_f32(mid - 1)), h);
    }
    assert_int_equal(ct_f32_to_bf16(3.4e38f), 0x7f80); /* rounds past the max: inf */
    assert_int_equal(ct_f32_to_bf16(-INFINITY), 0xff80);
    assert_true(bf16_is_nan(ct_f32_to_bf16(NAN)));
    assert_true(bf16_is_nan(ct_f32_to_bf16(bits_f32(0x7f800001u))));
    for (int i = 0; i < 400000; i++) {
        float f = bits_f32((uint32_t)tu_next());
        if (isnan(f)) continue;
        assert_int_equal(ct_f32_to_bf16(f), ref_bf16_encode(f));
    }
}

/* ======================================================================================
 * creation
 * ====================================================================================== */

static void test_from_data_round_trip(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{2, 3, 4}, {1, 1, 1}, {5, 0, 2}, {7, 1, 3}};
    for (int d = 0; d < N_DTYPES; d++) {
        for (int s = 0; s < 4; s++) {
            double *v;
            ct_tensor *t = rand_t(3, shapes[s], all_dt[d], &v);
            assert_shape(t, 3, shapes[s]);
            assert_int_equal(ct_tensor_dtype(t), all_dt[d]);
            assert_true(ct_device_eq(ct_tensor_device(t), CT_CPU));
            assert_true(ct_tensor_is_contiguous(t));
            assert_int_equal(ct_tensor_strides(t)[2], 1);
            assert_int_equal(ct_tensor_strides(t)[1], shapes[s][2]);
            assert_values(t, v, 0, 0);
            free(v);
            ct_tensor_release(t);
        }
        /* 0-d: shape NULL is allowed. */
        double x = 1.0;
        ct_tensor *z = tu_from_f64(&x, 0, NULL, all_dt[d]);
        assert_non_null(z);
        assert_int_equal(ct_tensor_ndim(z), 0);
        assert_int_equal(ct_tensor_numel(z), 1);
        double got;
        assert_int_equal(ct_tensor_item(z, &got), CT_OK);
        assert_true(got == 1.0);
        ct_tensor_release(z);
    }
    /* Empty tensors accept NULL data. */
    ct_tensor *e = ct_tensor_from_data(NULL, CT_F32, CT_SHAPE(0, 4));
    assert_non_null(e);
    assert_int_equal(ct_tensor_numel(e), 0);
    ct_tensor_release(e);
    /* The data is copied, not borrowed. */
    float buf[3] = {1, 2, 3};
    ct_tensor *c = ct_tensor_from_data(buf, CT_F32, CT_SHAPE(3));
    buf[0] = 100;
    double ref[3] = {1, 2, 3};
    assert_values(c, ref, 0, 0);
    ct_tensor_release(c);
}

static void test_creation_errors(void **state) {
    (void)state;
    float buf[4] = {0};
    tu_assert_null_error(ct_tensor_from_data(NULL, CT_F32, CT_SHAPE(2, 2)), CT_ERR_INVALID_ARG,
                         "ct_tensor_from_data", "NULL", "[2, 2]");
    tu_assert_null_error(ct_tensor_from_data(buf, CT_F32, CT_SHAPE(2, -1)), CT_ERR_SHAPE,
                         "ct_tensor_from_data", "negative", "-1");
    tu_assert_null_error(ct_tensor_zeros(CT_SHAPE(-3), CT_F32, CT_CPU), CT_ERR_SHAPE,
                         "ct_tensor_zeros", "-3");
    tu_assert_null_error(ct_tensor_empty(CT_SHAPE(INT64_C(1) << 40, INT64_C(1) << 40), CT_F32, CT_CPU),
                         CT_ERR_OVERFLOW, "ct_tensor_empty", "overflow");
    tu_assert_null_error(ct_tensor_ones(9, (const int64_t[9]){1, 1, 1, 1, 1, 1, 1, 1, 1}, CT_F32,
                                        CT_CPU),
                         CT_ERR_SHAPE, "ct_tensor_ones", "9 dims");
    tu_assert_null_error(ct_tensor_empty(2, NULL, CT_F32, CT_CPU), CT_ERR_INVALID_ARG,
                         "ct_tensor_empty", "NULL");
    tu_assert_null_error(ct_tensor_zeros(CT_SHAPE(2), (ct_dtype)42, CT_CPU), CT_ERR_DTYPE,
                         "ct_tensor_zeros", "dtype 42");
    tu_assert_null_error(ct_tensor_full(CT_SHAPE(2), 1e10, CT_I32, CT_CPU), CT_ERR_INVALID_ARG,
                         "ct_tensor_full", "int32", "overflow");
    tu_assert_null_error(ct_tensor_full(CT_SHAPE(2), NAN, CT_I64, CT_CPU), CT_ERR_INVALID_ARG,
                         "ct_tensor_full", "int64");
    tu_assert_null_error(ct_tensor_full(CT_SHAPE(2), 1e6, CT_F16, CT_CPU), CT_ERR_INVALID_ARG,
                         "float16", "overflow");
    tu_assert_null_error(ct_tensor_scalar(1e300, CT_F32, CT_CPU), CT_ERR_INVALID_ARG,
                         "ct_tensor_scalar", "float32");
    tu_assert_null_error(ct_tensor_zeros_like(NULL), CT_ERR_INVALID_ARG, "ct_tensor_zeros_like");
    /* Infinities and NaN are values floating tensors hold. */
    ct_tensor *inf = ct_tensor_full(CT_SHAPE(2), INFINITY, CT_F16, CT_CPU);
    ct_tensor *nan = ct_tensor_full(CT_SHAPE(2), NAN, CT_BF16, CT_CPU);
    assert_non_null(inf);
    assert_non_null(nan);
    double r1[2] = {INFINITY, INFINITY}, r2[2] = {NAN, NAN};
    assert_values(inf, r1, 0, 0);
    assert_values(nan, r2, 0, 0);
    ct_tensor_release(inf);
    ct_tensor_release(nan);
}

static void test_zeros_ones_full(void **state) {
    (void)state;
    for (int d = 0; d < N_DTYPES; d++) {
        ct_dtype dt = all_dt[d];
        int64_t shape[3] = {3, 1, 5};
        double value = ct_dtype_is_floating(dt) ? -2.75 : dt == CT_BOOL ? 1 : -7;
        ct_tensor *z = ct_tensor_zeros(3, shape, dt, CT_CPU);
        ct_tensor *o = ct_tensor_ones(3, shape, dt, CT_CPU);
        ct_tensor *f = ct_tensor_full(3, shape, value, dt, CT_CPU);
        ct_tensor *e = ct_tensor_empty(3, shape, dt, CT_CPU);
        assert_shape(e, 3, shape);
        assert_int_equal(ct_tensor_dtype(e), dt);
        double rz[15], ro[15], rf[15];
        for (int i = 0; i < 15; i++) rz[i] = 0, ro[i] = 1, rf[i] = value;
        assert_values(z, rz, 0, 0);
        assert_values(o, ro, 0, 0);
        assert_values(f, rf, 0, 0);
        ct_tensor *s = ct_tensor_scalar(value, dt, CT_CPU);
        assert_int_equal(ct_tensor_ndim(s), 0);
        double got;
        assert_int_equal(ct_tensor_item(s, &got), CT_OK);
        assert_true(got == value);
        ct_tensor_release(z);
        ct_tensor_release(o);
        ct_tensor_release(f);
        ct_tensor_release(e);
        ct_tensor_release(s);
    }
    /* A fill value converts like a copy: float -> int truncates. */
    ct_tensor *t = ct_tensor_full(CT_SHAPE(2), -3.9, CT_I32, CT_CPU);
    double r[2] = {-3, -3};
    assert_values(t, r, 0, 0);
    ct_tensor_release(t);
    /* Large tensors (threaded fill and memset paths). */
    ct_tensor *big = ct_tensor_full(CT_SHAPE(1000, 1001), 0.5, CT_F32, CT_CPU);
    double *v = tu_values(big);
    for (int64_t i = 0; i < 1001000; i++)
        if (v[i] != 0.5) fail_msg("element %lld = %g", (long long)i, v[i]);
    free(v);
    ct_tensor_release(big);
}

static void test_like_functions(void **state) {
    (void)state;
    for (int d = 0; d < N_DTYPES; d++) {
        ct_tensor *src = rand_t(CT_SHAPE(4, 2), all_dt[d], NULL);
        ct_tensor *t = ct_transpose(src, 0, 1); /* non-contiguous: _like is still contiguous */
        ct_tensor *e = ct_tensor_empty_like(t), *z = ct_tensor_zeros_like(t),
                  *o = ct_tensor_ones_like(t), *f = ct_tensor_full_like(t, 1.0);
        ct_tensor *all[4] = {e, z, o, f};
        for (int k = 0; k < 4; k++) {
            assert_shape(all[k], 2, (const int64_t[]){2, 4});
            assert_int_equal(ct_tensor_dtype(all[k]), all_dt[d]);
            assert_true(ct_tensor_is_contiguous(all[k]));
            assert_false(ct_tensor_shares_storage(all[k], t));
        }
        double r0[8] = {0}, r1[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        assert_values(z, r0, 0, 0);
        assert_values(o, r1, 0, 0);
        assert_values(f, r1, 0, 0);
        for (int k = 0; k < 4; k++) ct_tensor_release(all[k]);
        ct_tensor_release(t);
        ct_tensor_release(src);
    }
}

static void test_item(void **state) {
    (void)state;
    for (int d = 0; d < N_DTYPES; d++) {
        double *v;
        ct_tensor *t = tu_rand(CT_SHAPE(3, 4), all_dt[d], -50, 50, &v);
        ct_tensor *e = ct_select(t, 0, 2);
        ct_tensor *one = ct_select(e, 0, -1); /* element [2, 3], at offset 11 */
        double got;
        assert_int_equal(ct_tensor_item(one, &got), CT_OK);
        assert_true(got == v[11]);
        ct_tensor *n1 = ct_narrow(t, 1, 1, 1);
        ct_tensor *n2 = ct_narrow(n1, 0, 1, 1); /* [1, 1] holding v[5] */
        assert_int_equal(ct_tensor_item(n2, &got), CT_OK);
        assert_true(got == v[5]);
        tu_assert_error(ct_tensor_item(t, &got), CT_ERR_SHAPE, "ct_tensor_item", "[3, 4]", "12");
        free(v);
        ct_tensor_release(n2);
        ct_tensor_release(n1);
        ct_tensor_release(one);
        ct_tensor_release(e);
        ct_tensor_release(t);
    }
    double got;
    ct_tensor *empty = ct_tensor_zeros(CT_SHAPE(0), CT_F32, CT_CPU);
    tu_assert_error(ct_tensor_item(empty, &got), CT_ERR_SHAPE, "ct_tensor_item", "0 elements");
    tu_assert_error(ct_tensor_item(NULL, &got), CT_ERR_INVALID_ARG, "ct_tensor_item", "NULL");
    tu_assert_error(ct_tensor_item(empty, NULL), CT_ERR_INVALID_ARG, "NULL");
    ct_tensor_release(empty);
}

/* arange's length and values against a float64 loop. */
static void check_arange(double start, double end, double step, ct_dtype dt) {
    ct_tensor *t = ct_tensor_arange(start, end, step, dt, CT_CPU);
    assert_non_null(t);
    int64_t n = (int64_t)ceil((end - start) / step);
    assert_int_equal(ct_tensor_ndim(t), 1);
    assert_int_equal(ct_tensor_numel(t), n);
    double *ref = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) ref[i] = ref_convert(start + (double)i * step, CT_F64, dt);
    assert_values(t, ref, 0, 0);
    free(ref);
    ct_tensor_release(t);
}

static void test_arange(void **state) {
    (void)state;
    for (int d = 1; d < N_DTYPES; d++) {
        check_arange(0, 10, 1, all_dt[d]);
        check_arange(-5, 7, 3, all_dt[d]);
        check_arange(10, -4, -2, all_dt[d]);
        check_arange(3, 3, 1, all_dt[d]);
        check_arange(0, 1, 5, all_dt[d]);
    }
    for (int d = 3; d < N_DTYPES; d++) {
        check_arange(0, 1, 0.1, all_dt[d]);   /* ceil(10.000000000000002) is not 11 */
        check_arange(-1.5, 2.25, 0.3, all_dt[d]);
        check_arange(1, 0, -0.125, all_dt[d]);
        check_arange(0.5, 1000.5, 0.75, all_dt[d]);
    }
    check_arange(0, 100000, 1, CT_F32); /* threaded */
    check_arange(0, 3000, 1, CT_F16);   /* f16 rounds above 2048 */
    check_arange(0, 2, 1, CT_BOOL);
    /* Default-step idiom. */
    ct_tensor *t = ct_tensor_arange(0, 5, 1, CT_I64, CT_CPU);
    double r[5] = {0, 1, 2, 3, 4};
    assert_values(t, r, 0, 0);
    ct_tensor_release(t);
}

static void test_arange_errors(void **state) {
    (void)state;
    tu_assert_null_error(ct_tensor_arange(0, 10, 0, CT_F32, CT_CPU), CT_ERR_INVALID_ARG,
                         "ct_tensor_arange", "step", "nonzero");
    tu_assert_null_error(ct_tensor_arange(0, 10, -1, CT_F32, CT_CPU), CT_ERR_INVALID_ARG,
                         "ct_tensor_arange", "inconsistent", "sign");
    tu_assert_null_error(ct_tensor_arange(5, 0, 1, CT_I64, CT_CPU), CT_ERR_INVALID_ARG,
                         "inconsistent");
    tu_assert_null_error(ct_tensor_arange(0, INFINITY, 1, CT_F32, CT_CPU), CT_ERR_INVALID_ARG,
                         "finite");
    tu_assert_null_error(ct_tensor_arange(0, NAN, 1, CT_F32, CT_CPU), CT_ERR_INVALID_ARG, "finite");
    tu_assert_null_error(ct_tensor_arange(0, 1e300, 1e-300, CT_F64, CT_CPU), CT_ERR_OVERFLOW,
                         "ct_tensor_arange");
    tu_assert_null_error(ct_tensor_arange(0, 10, 1, (ct_dtype)-1, CT_CPU), CT_ERR_DTYPE,
                         "ct_tensor_arange");
}

static void check_linspace(double start, double end, int64_t steps, ct_dtype dt) {
    ct_tensor *t = ct_tensor_linspace(start, end, steps, dt, CT_CPU);
    assert_non_null(t);
    assert_int_equal(ct_tensor_numel(t), steps);
    double *ref = calloc((size_t)(steps > 0 ? steps : 1), sizeof(double));
    double step = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
    for (int64_t i = 0; i < steps; i++) {
        /* PyTorch's symmetric formula: both ends exact. */
        double x = steps == 1 ? start
                   : i < steps / 2 ? start + (double)i * step
                                   : end - (double)(steps - 1 - i) * step;
        ref[i] = ref_convert(x, CT_F64, dt);
    }
    /* and the formula agrees with the textbook one to rounding */
    for (int64_t i = 0; i < steps && dt == CT_F64; i++)
        assert_true(fabs(ref[i] - (start + (double)i * step)) <= 1e-12 * (fabs(start) + fabs(end)));
    assert_values(t, ref, 0, 0);
    if (steps > 1 && ct_dtype_is_floating(dt)) {
        double *v = tu_values(t);
        assert_true(v[0] == tu_round(start, dt));
        assert_true(v[steps - 1] == tu_round(end, dt));
        free(v);
    }
    free(ref);
    ct_tensor_release(t);
}

static void test_linspace(void **state) {
    (void)state;
    for (int d = 3; d < N_DTYPES; d++) {
        check_linspace(0, 1, 11, all_dt[d]);
        check_linspace(-3.3, 7.1, 7, all_dt[d]);
        check_linspace(5, -5, 4, all_dt[d]);
        check_linspace(2, 2, 5, all_dt[d]);
        check_linspace(1.5, 9, 1, all_dt[d]);
        check_linspace(1.5, 9, 2, all_dt[d]);
        check_linspace(0, 1, 0, all_dt[d]);
    }
    check_linspace(0.1, 0.7, 100001, CT_F64); /* threaded, odd count */
    check_linspace(0, 100, 7, CT_I64);
    check_linspace(-10, 10, 6, CT_I32);
    tu_assert_null_error(ct_tensor_linspace(0, 1, -1, CT_F32, CT_CPU), CT_ERR_INVALID_ARG,
                         "ct_tensor_linspace", "-1");
}

static void test_eye(void **state) {
    (void)state;
    const int64_t dims[][2] = {{4, -1}, {3, 5}, {5, 2}, {1, 1}, {0, 3}, {3, 0}};
    for (int d = 0; d < N_DTYPES; d++) {
        for (int k = 0; k < 6; k++) {
            int64_t n = dims[k][0], m = dims[k][1] < 0 ? n : dims[k][1];
            ct_tensor *t = ct_tensor_eye(dims[k][0], dims[k][1], all_dt[d], CT_CPU);
            assert_shape(t, 2, (const int64_t[]){n, m});
            assert_int_equal(ct_tensor_dtype(t), all_dt[d]);
            double ref[25];
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < m; j++) ref[i * m + j] = i == j;
            assert_values(t, ref, 0, 0);
            ct_tensor_release(t);
        }
    }
    tu_assert_null_error(ct_tensor_eye(-2, 3, CT_F32, CT_CPU), CT_ERR_INVALID_ARG, "ct_tensor_eye",
                         "-2");
}

/* ======================================================================================
 * random numbers
 * ====================================================================================== */

static void test_philox(void **state) {
    (void)state;
    /* Known-answer vectors of Random123's philox4x32-10 (counter, key). */
    uint32_t out[4];
    cti_philox_block(0, 0, out);
    assert_int_equal(out[0], 0x6627e8d5u);
    assert_int_equal(out[1], 0xe169c58du);
    assert_int_equal(out[2], 0xbc57ac4cu);
    assert_int_equal(out[3], 0x9b00dbd8u);
    /* ct_philox is the same stream, draw by draw. */
    uint64_t seed = tu_next();
    for (uint64_t blk = 0; blk < 50; blk++) {
        uint64_t b = blk * 7919 + 3;
        cti_philox_block(seed, b, out);
        for (int j = 0; j < 4; j++) assert_int_equal(ct_philox(seed, b * 4 + (uint64_t)j), out[j]);
    }
    /* Generator state: reserve hands out disjoint ranges. */
    ct_generator *g = ct_generator_new(42);
    assert_int_equal(ct_generator_seed(g), 42);
    assert_int_equal(ct_generator_offset(g), 0);
    uint64_t a = ct_generator_reserve(g, 10), b = ct_generator_reserve(g, 3);
    assert_int_equal(a, 0);
    assert_true(b >= 10);
    assert_true(ct_generator_offset(g) >= b + 3);
    ct_generator_set_offset(g, 8);
    assert_int_equal(ct_generator_offset(g), 8);
    ct_generator_set_seed(g, 7);
    assert_int_equal(ct_generator_seed(g), 7);
    assert_int_equal(ct_generator_offset(g), 0);
    ct_generator_free(g);
}

/* What cti_rng_observe's observer heard. */
typedef struct heard {
    int calls;
    ct_generator *gen;
    uint64_t seed, first, n;
} heard;

static void listen(void *ctx, ct_generator *g, uint64_t seed, uint64_t first, uint64_t n) {
    heard *h = ctx;
    h->calls++;
    h->gen = g;
    h->seed = seed;
    h->first = first;
    h->n = n;
}

static void *reserve_elsewhere(void *arg) {
    ct_generator_reserve(arg, 5);
    return NULL;
}

/* The observer hears every reservation of its thread, with the generator
 * (the default one resolved), its seed and the rounded range; none of
 * another thread's, and nothing once removed. */
static void test_rng_observer(void **state) {
    (void)state;
    ct_generator *g = ct_generator_new(1234);
    assert_non_null(g);
    heard h = {0};
    cti_rng_observe(listen, &h);
    ct_tensor *t = ct_tensor_rand(g, CT_SHAPE(10), CT_F32, CT_CPU);
    assert_non_null(t);
    assert_int_equal(h.calls, 1);
    assert_ptr_equal(h.gen, g);
    assert_int_equal(h.seed, 1234);
    assert_int_equal(h.first, 0);
    assert_int_equal(h.n, 12); /* rounded to whole Philox blocks */
    assert_int_equal(ct_generator_offset(g), 12);
    ct_tensor_release(t);
    uint64_t first = ct_generator_reserve(NULL, 3);
    assert_int_equal(h.calls, 2);
    assert_ptr_equal(h.gen, ct_generator_default());
    assert_int_equal(h.first, first);
    assert_int_equal(h.n, 4);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, reserve_elsewhere, g), 0);
    pthread_join(th, NULL);
    assert_int_equal(h.calls, 2);
    cti_rng_observe(NULL, NULL);
    ct_generator_reserve(g, 1);
    assert_int_equal(h.calls, 2);
    ct_generator_free(g);
}

static double *rand_values(ct_generator *g, int kind, int64_t n, ct_dtype dt) {
    ct_tensor *t = kind == 0 ? ct_tensor_rand(g, 1, &n, dt, CT_CPU)
                             : ct_tensor_randn(g, 1, &n, dt, CT_CPU);
    assert_non_null(t);
    double *v = tu_values(t);
    ct_tensor_release(t);
    return v;
}

static void test_random_reproducible(void **state) {
    (void)state;
    const int64_t n = 1001;
    for (int k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        for (int kind = 0; kind < 2; kind++) {
            ct_generator *g1 = ct_generator_new(1234), *g2 = ct_generator_new(1234),
                         *g3 = ct_generator_new(1235);
            double *a = rand_values(g1, kind, n, dt), *b = rand_values(g2, kind, n, dt),
                   *c = rand_values(g3, kind, n, dt), *a2 = rand_values(g1, kind, n, dt);
            assert_memory_equal(a, b, (size_t)n * sizeof(double));
            int same_c = 0, same_a2 = 0;
            for (int64_t i = 0; i < n; i++) {
                same_c += a[i] == c[i];
                same_a2 += a[i] == a2[i];
            }
            /* bf16 uniforms have 256 values: a few coincide by chance. */
            assert_true(same_c < n / 20);
            assert_true(same_a2 < n / 20);
            /* Rewinding the generator replays the stream. */
            ct_generator_set_offset(g1, 0);
            double *a3 = rand_values(g1, kind, n, dt);
            assert_memory_equal(a, a3, (size_t)n * sizeof(double));
            free(a);
            free(b);
            free(c);
            free(a2);
            free(a3);
            ct_generator_free(g1);
            ct_generator_free(g2);
            ct_generator_free(g3);
        }
    }
    /* The default generator follows ct_manual_seed. */
    ct_manual_seed(99);
    double *x = rand_values(NULL, 0, 64, CT_F32);
    ct_manual_seed(99);
    double *y = rand_values(NULL, 0, 64, CT_F32);
    assert_memory_equal(x, y, 64 * sizeof(double));
    free(x);
    free(y);
}

/* The documented draw layout, element by element. */
static void test_random_exact_mapping(void **state) {
    (void)state;
    uint64_t seed = tu_next();
    ct_generator *g = ct_generator_new(seed);
    ct_generator_set_offset(g, 13); /* a first draw in the middle of a Philox block */
    const int64_t n = 37;
    uint64_t first = ct_generator_offset(g);
    ct_tensor *u32 = ct_tensor_rand(g, 1, &n, CT_F32, CT_CPU);
    double *v = tu_values(u32);
    for (int64_t k = 0; k < n; k++)
        assert_true(v[k] == (double)(ct_philox(seed, first + (uint64_t)k) >> 8) * 0x1p-24);
    free(v);

    first = ct_generator_offset(g);
    ct_tensor *u64 = ct_tensor_rand(g, 1, &n, CT_F64, CT_CPU);
    v = tu_values(u64);
    for (int64_t k = 0; k < n; k++) {
        uint64_t hi = ct_philox(seed, first + 2 * (uint64_t)k),
                 lo = ct_philox(seed, first + 2 * (uint64_t)k + 1);
        assert_true(v[k] == (double)(((hi << 32) | lo) >> 11) * 0x1p-53);
    }
    free(v);

    first = ct_generator_offset(g);
    ct_tensor *nrm = ct_tensor_randn(g, 1, &n, CT_F64, CT_CPU);
    v = tu_values(nrm);
    for (int64_t j = 0; 2 * j < n; j++) {
        /* pair j takes draws 4j..4j+3: two for u1, two for u2 (53-bit uniforms) */
        uint64_t b = first + 4 * (uint64_t)j;
        uint64_t w0 = ((uint64_t)ct_philox(seed, b) << 32) | ct_philox(seed, b + 1);
        uint64_t w1 = ((uint64_t)ct_philox(seed, b + 2) << 32) | ct_philox(seed, b + 3);
        double u1 = 1.0 - (double)(w0 >> 11) * 0x1p-53, u2 = (double)(w1 >> 11) * 0x1p-53;
        double r = sqrt(-2.0 * log(u1));
        assert_true(fabs(v[2 * j] - r * cos(2 * M_PI * u2)) <= 1e-15 * (1 + r));
        if (2 * j + 1 < n) assert_true(fabs(v[2 * j + 1] - r * sin(2 * M_PI * u2)) <= 1e-15 * (1 + r));
    }
    free(v);
    /* An odd count reserves the whole last pair. */
    assert_true(ct_generator_offset(g) >= first + 2 * (uint64_t)(n + 1));

    first = ct_generator_offset(g);
    ct_tensor *ri = ct_tensor_randint(g, -5, 1000, 1, &n, CT_I64, CT_CPU);
    v = tu_values(ri);
    for (int64_t k = 0; k < n; k++) {
        uint64_t w = ((uint64_t)ct_philox(seed, first + 2 * (uint64_t)k) << 32) |
                     ct_philox(seed, first + 2 * (uint64_t)k + 1);
        assert_true(v[k] == (double)(-5 + (int64_t)(w % 1005)));
    }
    free(v);
    ct_tensor_release(u32);
    ct_tensor_release(u64);
    ct_tensor_release(nrm);
    ct_tensor_release(ri);
    ct_generator_free(g);
}

static void test_random_thread_independent(void **state) {
    (void)state;
    int saved = ct_get_num_threads();
    const int64_t shape[2] = {300, 701}; /* well above the threading grain */
    double *res[2][3];
    for (int r = 0; r < 2; r++) {
        assert_int_equal(ct_set_num_threads(r == 0 ? 1 : 2), CT_OK);
        ct_generator *g = ct_generator_new(77);
        ct_tensor *a = ct_tensor_rand(g, 2, shape, CT_F32, CT_CPU);
        ct_tensor *b = ct_tensor_randn(g, 2, shape, CT_F64, CT_CPU);
        ct_tensor *c = ct_tensor_randint(g, 0, 1 << 20, 2, shape, CT_I32, CT_CPU);
        res[r][0] = tu_values(a);
        res[r][1] = tu_values(b);
        res[r][2] = tu_values(c);
        ct_tensor_release(a);
        ct_tensor_release(b);
        ct_tensor_release(c);
        ct_generator_free(g);
    }
    assert_int_equal(ct_set_num_threads(saved), CT_OK);
    for (int k = 0; k < 3; k++) {
        assert_memory_equal(res[0][k], res[1][k], (size_t)(300 * 701) * sizeof(double));
        free(res[0][k]);
        free(res[1][k]);
    }
}

static void test_uniform_statistics(void **state) {
    (void)state;
    const int64_t n = 100000;
    for (int k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        /* The draws land on a grid of G points k/G (the dtype's significand). */
        double G = dt == CT_F32 ? 0x1p24 : dt == CT_F64 ? 0x1p53 : dt == CT_F16 ? 0x1p11 : 0x1p8;
        ct_generator *g = ct_generator_new(tu_next());
        double *v = rand_values(g, 0, n, dt);
        double mean = 0, var = 0;
        int64_t bins[10] = {0};
        for (int64_t i = 0; i < n; i++) {
            assert_true(v[i] >= 0.0 && v[i] < 1.0);
            assert_true(v[i] * G == floor(v[i] * G));
            mean += v[i];
            bins[(int)(v[i] * 10)]++;
        }
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++) var += (v[i] - mean) * (v[i] - mean);
        var /= (double)(n - 1);
        /* 5-sigma bounds: sd(mean) = 0.00091, sd(var) = 0.00024. */
        assert_true(fabs(mean - (G - 1) / (2 * G)) < 0.0046);
        assert_true(fabs(var - (G * G - 1) / (12 * G * G)) < 0.0012);
        for (int b = 0; b < 10; b++) {
            double p = (ceil((b + 1) * G / 10) - ceil(b * G / 10)) / G;
            double sd = sqrt((double)n * p * (1 - p));
            assert_true(fabs((double)bins[b] - (double)n * p) < 5 * sd);
        }
        free(v);
        ct_generator_free(g);
    }
}

static void test_normal_statistics(void **state) {
    (void)state;
    const int64_t n = 100000;
    for (int k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        ct_generator *g = ct_generator_new(tu_next());
        double *v = rand_values(g, 1, n, dt);
        double mean = 0, var = 0, within1 = 0, m3 = 0;
        for (int64_t i = 0; i < n; i++) {
            assert_true(isfinite(v[i]));
            mean += v[i];
            within1 += fabs(v[i]) < 1.0;
        }
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++) {
            var += (v[i] - mean) * (v[i] - mean);
            m3 += pow(v[i] - mean, 3);
        }
        var /= (double)(n - 1);
        m3 /= (double)n;
        assert_true(fabs(mean) < 0.016);          /* 5 * 1/sqrt(n) */
        assert_true(fabs(var - 1.0) < 0.025);     /* 5 * sqrt(2/n) */
        assert_true(fabs(m3) < 0.04);             /* 5 * sqrt(6/n) */
        assert_true(fabs(within1 / (double)n - 0.6827) < 0.008);
        free(v);
        ct_generator_free(g);
    }
}

static void test_uniform_normal_inplace(void **state) {
    (void)state;
    for (int k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        ct_tensor *dense = ct_tensor_zeros(CT_SHAPE(5, 6), dt, CT_CPU);
        ct_tensor *base = ct_tensor_zeros(CT_SHAPE(6, 10), dt, CT_CPU);
        ct_tensor *sl = ct_slice(base, 1, 0, 10, 2);
        ct_tensor *strided = ct_transpose(sl, 0, 1); /* [5, 6], non-contiguous */
        assert_false(ct_tensor_is_contiguous(strided));
        /* Same seed and offset: same values in row-major order, whatever the layout. */
        for (int kind = 0; kind < 2; kind++) {
            ct_generator *g1 = ct_generator_new(5), *g2 = ct_generator_new(5);
            ct_status s1 = kind ? ct_normal_(dense, 3.0, 0.5, g1) : ct_uniform_(dense, -2, 6, g1);
            ct_status s2 = kind ? ct_normal_(strided, 3.0, 0.5, g2) : ct_uniform_(strided, -2, 6, g2);
            assert_int_equal(s1, CT_OK);
            assert_int_equal(s2, CT_OK);
            assert_int_equal(ct_generator_offset(g1), ct_generator_offset(g2));
            double *a = tu_values(dense), *b = tu_values(strided);
            assert_memory_equal(a, b, 30 * sizeof(double));
            for (int i = 0; i < 30 && !kind; i++) assert_true(a[i] >= -2 && a[i] <= 6);
            free(a);
            free(b);
            ct_generator_free(g1);
            ct_generator_free(g2);
        }
        /* Elements outside the view are untouched. */
        ct_tensor *gaps = ct_slice(base, 1, 1, 10, 2);
        double *gv = tu_values(gaps);
        for (int i = 0; i < 30; i++) assert_true(gv[i] == 0);
        free(gv);
        ct_tensor_release(gaps);
        ct_tensor_release(strided);
        ct_tensor_release(sl);
        ct_tensor_release(base);
        ct_tensor_release(dense);
    }
    /* Mean and spread of a scaled normal. */
    ct_tensor *t = ct_tensor_empty(CT_SHAPE(100000), CT_F64, CT_CPU);
    assert_int_equal(ct_normal_(t, -4.0, 3.0, NULL), CT_OK);
    double *v = tu_values(t);
    double mean = 0, var = 0;
    for (int i = 0; i < 100000; i++) mean += v[i];
    mean /= 100000;
    for (int i = 0; i < 100000; i++) var += (v[i] - mean) * (v[i] - mean);
    var /= 99999;
    assert_true(fabs(mean + 4.0) < 0.05);
    assert_true(fabs(var - 9.0) < 0.25);
    free(v);
    /* A degenerate range gives a constant. */
    assert_int_equal(ct_uniform_(t, 2.5, 2.5, NULL), CT_OK);
    v = tu_values(t);
    for (int i = 0; i < 100000; i++) assert_true(v[i] == 2.5);
    free(v);
    ct_tensor_release(t);
}

static void test_randint(void **state) {
    (void)state;
    const int64_t n = 20000;
    for (int d = 0; d < N_DTYPES; d++) {
        ct_dtype dt = all_dt[d];
        int64_t lo = dt == CT_BOOL ? 0 : -7, hi = dt == CT_BOOL ? 2 : 9;
        ct_generator *g = ct_generator_new(tu_next());
        ct_tensor *t = ct_tensor_randint(g, lo, hi, 1, &n, dt, CT_CPU);
        assert_non_null(t);
        assert_int_equal(ct_tensor_dtype(t), dt);
        double *v = tu_values(t);
        int64_t count[16] = {0};
        for (int64_t i = 0; i < n; i++) {
            assert_true(v[i] == trunc(v[i]));
            assert_true(v[i] >= (double)lo && v[i] < (double)hi);
            count[(int64_t)v[i] - lo]++;
        }
        /* Each value near n/(hi-lo), within 6 sigma. */
        double p = 1.0 / (double)(hi - lo), sd = sqrt((double)n * p * (1 - p));
        for (int64_t k = 0; k < hi - lo; k++) assert_true(fabs((double)count[k] - (double)n * p) < 6 * sd);
        free(v);
        ct_tensor_release(t);
        ct_generator_free(g);
    }
    /* Wide int64 ranges reach far. */
    ct_tensor *w = ct_tensor_randint(NULL, INT64_MIN / 2, INT64_MAX / 2, CT_SHAPE(1000), CT_I64, CT_CPU);
    int64_t buf[1000];
    assert_int_equal(ct_tensor_copy_to_host(w, buf, sizeof buf), CT_OK);
    int big = 0;
    for (int i = 0; i < 1000; i++) {
        assert_true(buf[i] >= INT64_MIN / 2 && buf[i] < INT64_MAX / 2);
        big += buf[i] > (INT64_C(1) << 60) || buf[i] < -(INT64_C(1) << 60);
    }
    assert_true(big > 500);
    ct_tensor_release(w);
}

static void test_random_errors(void **state) {
    (void)state;
    tu_assert_null_error(ct_tensor_rand(NULL, CT_SHAPE(3), CT_I32, CT_CPU), CT_ERR_DTYPE,
                         "ct_tensor_rand", "floating", "int32");
    tu_assert_null_error(ct_tensor_randn(NULL, CT_SHAPE(3), CT_BOOL, CT_CPU), CT_ERR_DTYPE,
                         "ct_tensor_randn", "bool");
    tu_assert_null_error(ct_tensor_randint(NULL, 5, 5, CT_SHAPE(3), CT_I64, CT_CPU),
                         CT_ERR_INVALID_ARG, "ct_tensor_randint", "low", "5");
    tu_assert_null_error(ct_tensor_randint(NULL, 9, 2, CT_SHAPE(3), CT_I64, CT_CPU),
                         CT_ERR_INVALID_ARG, "low=9", "high=2");
    tu_assert_null_error(ct_tensor_randint(NULL, 0, INT64_C(1) << 40, CT_SHAPE(3), CT_I32, CT_CPU),
                         CT_ERR_INVALID_ARG, "ct_tensor_randint", "int32");
    tu_assert_null_error(ct_tensor_randint(NULL, 0, 3, CT_SHAPE(3), CT_BOOL, CT_CPU),
                         CT_ERR_INVALID_ARG, "bool");
    tu_assert_null_error(ct_tensor_randint(NULL, 0, 5000, CT_SHAPE(3), CT_F16, CT_CPU),
                         CT_ERR_INVALID_ARG, "float16");
    tu_assert_null_error(ct_tensor_rand(NULL, CT_SHAPE(-2), CT_F32, CT_CPU), CT_ERR_SHAPE,
                         "ct_tensor_rand");
    ct_tensor *i = ct_tensor_zeros(CT_SHAPE(3), CT_I64, CT_CPU);
    ct_tensor *f = ct_tensor_zeros(CT_SHAPE(3), CT_F32, CT_CPU);
    tu_assert_error(ct_uniform_(i, 0, 1, NULL), CT_ERR_DTYPE, "ct_uniform_", "int64");
    tu_assert_error(ct_normal_(i, 0, 1, NULL), CT_ERR_DTYPE, "ct_normal_", "int64");
    tu_assert_error(ct_uniform_(f, 2, 1, NULL), CT_ERR_INVALID_ARG, "ct_uniform_", "low");
    tu_assert_error(ct_uniform_(f, 0, INFINITY, NULL), CT_ERR_INVALID_ARG, "finite");
    tu_assert_error(ct_normal_(f, 0, -1, NULL), CT_ERR_INVALID_ARG, "ct_normal_", "std");
    tu_assert_error(ct_normal_(f, 0, NAN, NULL), CT_ERR_INVALID_ARG, "std");
    tu_assert_error(ct_uniform_(NULL, 0, 1, NULL), CT_ERR_INVALID_ARG, "ct_uniform_", "NULL");
    ct_tensor *one = ct_tensor_zeros(CT_SHAPE(1), CT_F32, CT_CPU);
    ct_tensor *ex = ct_expand(one, CT_SHAPE(4));
    tu_assert_error(ct_uniform_(ex, 0, 1, NULL), CT_ERR_INVALID_ARG, "ct_uniform_", "expanded");
    /* Failed calls leave the tensor and the generator alone. */
    ct_generator *g = ct_generator_new(3);
    tu_assert_error(ct_normal_(f, 0, -1, g), CT_ERR_INVALID_ARG, "std");
    assert_int_equal(ct_generator_offset(g), 0);
    ct_generator_free(g);
    ct_tensor_release(ex);
    ct_tensor_release(one);
    ct_tensor_release(i);
    ct_tensor_release(f);
}

/* ======================================================================================
 * copies and conversion
 * ====================================================================================== */

/* dst's values after ct_copy_ of a tensor holding src_vals (shape sshape)
 * into dst (shape dshape), against ref_convert with broadcasting. */
static void check_copy(ct_dtype sdt, ct_dtype ddt, int snd, const int64_t *sshape, int dnd,
                       const int64_t *dshape, bool src_noncontig, bool dst_noncontig) {
    int64_t sn = tu_numel(snd, sshape), dn = tu_numel(dnd, dshape);
    double *sv = mixed_vals(sn, sdt);
    ct_tensor *s0 = tu_from_f64(sv, snd, sshape, sdt);
    ct_tensor *src = src_noncontig ? tu_noncontig(s0) : ct_tensor_retain(s0);
    ct_tensor *d0 = ct_tensor_full(dnd, dshape, 1, ddt, CT_CPU);
    ct_tensor *dst = dst_noncontig ? tu_noncontig(d0) : ct_tensor_retain(d0);
    if (src_noncontig && snd > 1) assert_false(ct_tensor_is_contiguous(src));
    assert_int_equal(ct_copy_(dst, src), CT_OK);
    double *ref = malloc((size_t)(dn > 0 ? dn : 1) * sizeof(double));
    int64_t bstride[CT_MAX_DIMS];
    /* src's row-major strides, 0 where it broadcasts */
    int64_t acc = 1;
    for (int i = dnd - 1; i >= 0; i--) {
        int j = i - (dnd - snd);
        if (j < 0 || sshape[j] == 1) bstride[i] = 0;
        else bstride[i] = acc;
        if (j >= 0) acc *= sshape[j];
    }
    for (int64_t k = 0; k < dn; k++)
        ref[k] = ref_convert(sv[strided_offset(k, dnd, dshape, bstride)], sdt, ddt);
    assert_values(dst, ref, 0, 0);
    free(ref);
    free(sv);
    ct_tensor_release(dst);
    ct_tensor_release(d0);
    ct_tensor_release(src);
    ct_tensor_release(s0);
}

static void test_copy_all_dtype_pairs(void **state) {
    (void)state;
    for (int a = 0; a < N_DTYPES; a++)
        for (int b = 0; b < N_DTYPES; b++) {
            check_copy(all_dt[a], all_dt[b], CT_SHAPE(3, 4, 5), CT_SHAPE(3, 4, 5), false, false);
            check_copy(all_dt[a], all_dt[b], CT_SHAPE(1), CT_SHAPE(1), false, false);
            check_copy(all_dt[a], all_dt[b], CT_SHAPE(0, 3), CT_SHAPE(0, 3), false, false);
        }
}

static void test_copy_noncontig_pairs(void **state) {
    (void)state;
    for (int a = 0; a < N_DTYPES; a++)
        for (int b = 0; b < N_DTYPES; b++) {
            check_copy(all_dt[a], all_dt[b], CT_SHAPE(4, 3, 5), CT_SHAPE(4, 3, 5), true, false);
            check_copy(all_dt[a], all_dt[b], CT_SHAPE(4, 3, 5), CT_SHAPE(4, 3, 5), false, true);
            check_copy(all_dt[a], all_dt[b], CT_SHAPE(6, 7), CT_SHAPE(6, 7), true, true);
        }
}

static void test_copy_broadcast(void **state) {
    (void)state;
    for (int a = 0; a < N_DTYPES; a++)
        for (int b = 0; b < N_DTYPES; b++) {
            check_copy(all_dt[a], all_dt[b], CT_SHAPE(5), CT_SHAPE(3, 5), false, false);
            check_copy(all_dt[a], all_dt[b], CT_SHAPE(4, 1), CT_SHAPE(2, 4, 6), true, false);
            check_copy(all_dt[a], all_dt[b], CT_SHAPE(1, 6), CT_SHAPE(4, 6), false, true);
            check_copy(all_dt[a], all_dt[b], CT_NONE, CT_SHAPE(3, 2), false, true);
        }
    /* A large broadcast exercises the threaded path. */
    check_copy(CT_F32, CT_F64, CT_SHAPE(700, 1), CT_SHAPE(700, 300), false, false);
    check_copy(CT_F64, CT_F16, CT_SHAPE(300), CT_SHAPE(700, 300), true, false);
}

static void test_copy_large(void **state) {
    (void)state;
    /* Above the parallel grain, contiguous and strided, the vectorized
     * f16 paths included. */
    const ct_dtype pairs[][2] = {{CT_F32, CT_F16}, {CT_F16, CT_F32}, {CT_F32, CT_BF16},
                                 {CT_BF16, CT_F32}, {CT_F64, CT_F32}, {CT_I64, CT_F64},
                                 {CT_F32, CT_F32}, {CT_F32, CT_I32}};
    for (int p = 0; p < 8; p++) {
        check_copy(pairs[p][0], pairs[p][1], CT_SHAPE(257, 1031), CT_SHAPE(257, 1031), false, false);
        check_copy(pairs[p][0], pairs[p][1], CT_SHAPE(131, 517), CT_SHAPE(131, 517), true, false);
    }
}

/* Permuted sources large enough for the tiled path, with partial tiles at
 * the edges, batch dims and conversions. */
static void test_copy_permuted_large(void **state) {
    (void)state;
    const int64_t shape[3] = {3, 130, 77};
    const int64_t perms[][3] = {{0, 2, 1}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}};
    const ct_dtype pairs[][2] = {{CT_F32, CT_F32}, {CT_F32, CT_F16}, {CT_F64, CT_F64},
                                 {CT_I32, CT_F64}, {CT_BF16, CT_F32}, {CT_F16, CT_F16}};
    for (int pi = 0; pi < 4; pi++) {
        for (int q = 0; q < 6; q++) {
            double *v;
            ct_tensor *t = tu_rand(3, shape, pairs[q][0], -50, 50, &v);
            ct_tensor *p = ct_permute(t, 3, perms[pi]);
            ct_tensor *c = ct_to_dtype(p, pairs[q][1]);
            if (pairs[q][0] == pairs[q][1]) {
                ct_tensor_release(c);
                c = ct_contiguous(p);
            }
            assert_true(ct_tensor_is_contiguous(c));
            int64_t ps[3], st[3] = {77 * 130, 77, 1}, pst[3];
            for (int d = 0; d < 3; d++) {
                ps[d] = shape[perms[pi][d]];
                pst[d] = st[perms[pi][d]];
            }
            assert_shape(c, 3, ps);
            int64_t n = 3 * 130 * 77;
            double *ref = malloc((size_t)n * sizeof(double));
            for (int64_t k = 0; k < n; k++)
                ref[k] = ref_convert(v[strided_offset(k, 3, ps, pst)], pairs[q][0], pairs[q][1]);
            assert_values(c, ref, 0, 0);
            free(ref);
            free(v);
            ct_tensor_release(c);
            ct_tensor_release(p);
            ct_tensor_release(t);
        }
    }
}

/* Every f16 value and a spread of floats, through the copy kernels, bit for
 * bit against the scalar converters. */
static void test_copy_half_bit_exact(void **state) {
    (void)state;
    const int64_t n = 65536;
    uint16_t *h = malloc(n * sizeof(uint16_t));
    float *f = malloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = (uint16_t)i;
    ct_tensor *th = ct_tensor_from_data(h, CT_F16, 1, &n);
    ct_tensor *tf = ct_to_dtype(th, CT_F32);
    assert_int_equal(ct_tensor_copy_to_host(tf, f, n * sizeof(float)), CT_OK);
    for (int64_t i = 0; i < n; i++) {
        float ref = ct_f16_to_f32((uint16_t)i);
        if (isnan(ref)) assert_true(isnan(f[i]));
        else assert_memory_equal(&f[i], &ref, 4);
    }
    /* Floats around every f16 halfway point, and random floats. */
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        if (i % 3 == 0) {
            u = (uint32_t)tu_next();
        } else {
            float a = ct_f16_to_f32((uint16_t)(i & 0x7bff)), b = ct_f16_to_f32((uint16_t)((i & 0x7bff) + 1));
            float mid = (a + b) / 2;
            if (i % 3 == 2) mid = nextafterf(mid, (tu_next() & 1) ? INFINITY : 0.0f);
            memcpy(&u, &mid, 4);
            u |= (uint32_t)(i & 0x8000) << 16;
        }
        memcpy(&f[i], &u, 4);
    }
    ct_tensor *src = ct_tensor_from_data(f, CT_F32, 1, &n);
    ct_tensor *to_h = ct_to_dtype(src, CT_F16);
    ct_tensor *to_b = ct_to_dtype(src, CT_BF16);
    uint16_t *gh = malloc(n * sizeof(uint16_t)), *gb = malloc(n * sizeof(uint16_t));
    assert_int_equal(ct_tensor_copy_to_host(to_h, gh, n * 2), CT_OK);
    assert_int_equal(ct_tensor_copy_to_host(to_b, gb, n * 2), CT_OK);
    for (int64_t i = 0; i < n; i++) {
        uint16_t rh = ct_f32_to_f16(f[i]), rb = ct_f32_to_bf16(f[i]);
        if (isnan(f[i])) {
            assert_true(f16_is_nan(gh[i]));
            assert_true(bf16_is_nan(gb[i]));
            continue;
        }
        if (gh[i] != rh) fail_msg("f32 %.9g -> f16 0x%04x, converter 0x%04x", f[i], gh[i], rh);
        if (gb[i] != rb) fail_msg("f32 %.9g -> bf16 0x%04x, converter 0x%04x", f[i], gb[i], rb);
    }
    free(h);
    free(f);
    free(gh);
    free(gb);
    ct_tensor_release(th);
    ct_tensor_release(tf);
    ct_tensor_release(src);
    ct_tensor_release(to_h);
    ct_tensor_release(to_b);
}

static void test_copy_special_values(void **state) {
    (void)state;
    const double in[] = {-2.9, -0.5, -0.0, 0.0, 0.5, 2.9, 1e10, -1e10, INFINITY, -INFINITY, NAN,
                         70000.0, 1e-30, 2147483647.5, -2147483648.9};
    const int64_t n = (int64_t)(sizeof in / sizeof in[0]);
    ct_tensor *t = ct_tensor_from_data(in, CT_F64, 1, &n);
    /* to int32: truncation toward zero; saturation and NaN -> 0 beyond C's range */
    ct_tensor *i32 = ct_to_dtype(t, CT_I32);
    const double ri[] = {-2, 0, 0, 0, 0, 2, 2147483647, -2147483648.0, 2147483647, -2147483648.0,
                         0, 70000, 0, 2147483647, -2147483648.0};
    assert_values(i32, ri, 0, 0);
    /* to int64: saturation at both ends, NaN -> 0 */
    ct_tensor *i64 = ct_to_dtype(t, CT_I64);
    int64_t li[15];
    assert_int_equal(ct_tensor_copy_to_host(i64, li, sizeof li), CT_OK);
    const int64_t rl[15] = {-2, 0, 0, 0, 0, 2, 10000000000, -10000000000, INT64_MAX, INT64_MIN,
                            0, 70000, 0, 2147483647, -2147483648};
    assert_memory_equal(li, rl, sizeof rl);
    const double huge[3] = {1e19, -1e19, 9223372036854774784.0};
    ct_tensor *th64 = ct_tensor_from_data(huge, CT_F64, CT_SHAPE(3));
    ct_tensor *h64 = ct_to_dtype(th64, CT_I64);
    assert_int_equal(ct_tensor_copy_to_host(h64, li, 24), CT_OK);
    assert_true(li[0] == INT64_MAX && li[1] == INT64_MIN && li[2] == INT64_C(9223372036854774784));
    ct_tensor_release(h64);
    ct_tensor_release(th64);
    ct_tensor_release(i64);
    ct_tensor *b = ct_to_dtype(t, CT_BOOL);
    const double rb[] = {1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_values(b, rb, 0, 0);
    ct_tensor *h = ct_to_dtype(t, CT_F16);
    const double rh[] = {ref_f16_decode(ref_f16_encode(-2.9f)), -0.5, -0.0, 0, 0.5,
                         ref_f16_decode(ref_f16_encode(2.9f)), INFINITY, -INFINITY, INFINITY,
                         -INFINITY, NAN, INFINITY, 0, INFINITY, -INFINITY};
    assert_values(h, rh, 0, 0);
    double *hv = tu_values(h);
    assert_true(signbit(hv[2]) && !signbit(hv[3])); /* -0 stays -0 */
    free(hv);
    /* int64 -> int32 wraps as a C cast on two's complement; int64 -> float rounds. */
    const int64_t big[] = {(INT64_C(1) << 32) + 5, -(INT64_C(1) << 33) - 7, (INT64_C(1) << 40) + 1};
    ct_tensor *tb = ct_tensor_from_data(big, CT_I64, CT_SHAPE(3));
    ct_tensor *w = ct_to_dtype(tb, CT_I32);
    const double rw[] = {5, -7, 1};
    assert_values(w, rw, 0, 0);
    ct_tensor *bf = ct_to_dtype(tb, CT_F32);
    const double rf[] = {(double)(float)big[0], (double)(float)big[1], (double)(float)big[2]};
    assert_values(bf, rf, 0, 0);
    /* f64 -> f16 goes through float (as PyTorch): a double just above a tie
     * rounds to the tie in float, then to even. */
    double tricky = 1.0 + 0x1p-11 + 0x1p-40; /* above the halfway point of 1 and 1+2^-10 */
    ct_tensor *tt = ct_tensor_from_data(&tricky, CT_F64, CT_SHAPE(1));
    ct_tensor *th = ct_to_dtype(tt, CT_F16);
    double got;
    assert_int_equal(ct_tensor_item(th, &got), CT_OK);
    assert_true(got == 1.0);
    ct_tensor *all[] = {t, i32, b, h, tb, w, bf, tt, th};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

static void test_copy_errors(void **state) {
    (void)state;
    ct_tensor *a = ct_tensor_zeros(CT_SHAPE(2, 4), CT_F32, CT_CPU);
    ct_tensor *b = ct_tensor_zeros(CT_SHAPE(3), CT_F32, CT_CPU);
    ct_tensor *c = ct_tensor_zeros(CT_SHAPE(2, 2, 4), CT_F32, CT_CPU);
    tu_assert_error(ct_copy_(a, b), CT_ERR_SHAPE, "ct_copy_", "[3]", "[2, 4]", "broadcast");
    /* dst never broadcasts */
    tu_assert_error(ct_copy_(a, c), CT_ERR_SHAPE, "ct_copy_", "[2, 2, 4]");
    tu_assert_error(ct_copy_(NULL, b), CT_ERR_INVALID_ARG, "ct_copy_", "NULL");
    tu_assert_error(ct_copy_(a, NULL), CT_ERR_INVALID_ARG, "ct_copy_", "NULL");
    ct_tensor *row = ct_tensor_zeros(CT_SHAPE(1, 4), CT_F32, CT_CPU);
    ct_tensor *ex = ct_expand(row, CT_SHAPE(2, 4));
    tu_assert_error(ct_copy_(ex, a), CT_ERR_INVALID_ARG, "ct_copy_", "expanded");
    tu_assert_error(ct_fill_(ex, 1), CT_ERR_INVALID_ARG, "ct_fill_");
    tu_assert_error(ct_zero_(ex), CT_ERR_INVALID_ARG, "ct_zero_");
    tu_assert_error(ct_fill_(NULL, 1), CT_ERR_INVALID_ARG, "ct_fill_");
    ct_tensor *ia = ct_tensor_zeros(CT_SHAPE(2), CT_I32, CT_CPU);
    tu_assert_error(ct_fill_(ia, 3e9), CT_ERR_INVALID_ARG, "ct_fill_", "int32", "overflow");
    /* The failed calls changed nothing. */
    double z[8] = {0};
    assert_values(a, z, 0, 0);
    assert_values(ia, z, 0, 0);
    assert_values(row, z, 0, 0);
    ct_tensor_release(ia);
    ct_tensor_release(ex);
    ct_tensor_release(row);
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(c);
}

static void test_copy_overlapping_views(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(10), CT_F32, &v);
    ct_tensor *head = ct_narrow(t, 0, 0, 8), *tail = ct_narrow(t, 0, 2, 8);
    /* t[2:] = t[:8]: every element read before any is overwritten. */
    assert_int_equal(ct_copy_(tail, head), CT_OK);
    double ref[10];
    for (int i = 0; i < 10; i++) ref[i] = i < 2 ? v[i] : v[i - 2];
    assert_values(t, ref, 0, 0);
    /* and the other direction */
    assert_int_equal(ct_copy_(head, tail), CT_OK);
    double ref2[10];
    for (int i = 0; i < 10; i++) ref2[i] = i < 8 ? ref[i + 2] : ref[i];
    assert_values(t, ref2, 0, 0);
    /* A transpose onto itself. */
    double *m;
    ct_tensor *sq = rand_t(CT_SHAPE(5, 5), CT_F64, &m);
    ct_tensor *tr = ct_transpose(sq, 0, 1);
    assert_int_equal(ct_copy_(sq, tr), CT_OK);
    double rm[25];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) rm[i * 5 + j] = m[j * 5 + i];
    assert_values(sq, rm, 0, 0);
    /* Onto itself: nothing changes. */
    assert_int_equal(ct_copy_(sq, sq), CT_OK);
    assert_values(sq, rm, 0, 0);
    free(v);
    free(m);
    ct_tensor_release(head);
    ct_tensor_release(tail);
    ct_tensor_release(t);
    ct_tensor_release(tr);
    ct_tensor_release(sq);
}

static void test_fill_zero_strided(void **state) {
    (void)state;
    for (int d = 0; d < N_DTYPES; d++) {
        double *v;
        ct_tensor *t = tu_rand(CT_SHAPE(4, 6), all_dt[d], -9, 9, &v);
        ct_tensor *cols = ct_slice(t, 1, 1, 6, 2); /* columns 1, 3, 5 */
        unsigned before = atomic_load(&t->storage->version);
        double value = all_dt[d] == CT_BOOL ? 1 : 4;
        assert_int_equal(ct_fill_(cols, value), CT_OK);
        assert_true(atomic_load(&t->storage->version) > before);
        double ref[24];
        for (int i = 0; i < 24; i++) ref[i] = (i % 6) % 2 ? value : v[i];
        assert_values(t, ref, 0, 0);
        ct_tensor *rows = ct_narrow(t, 0, 1, 2);
        assert_int_equal(ct_zero_(rows), CT_OK);
        for (int i = 6; i < 18; i++) ref[i] = 0;
        assert_values(t, ref, 0, 0);
        free(v);
        ct_tensor_release(rows);
        ct_tensor_release(cols);
        ct_tensor_release(t);
    }
}

static void test_copy_to_host(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(3, 5), CT_F32, &v);
    ct_tensor *tr = ct_transpose(t, 0, 1);
    float buf[15];
    assert_int_equal(ct_tensor_copy_to_host(tr, buf, sizeof buf), CT_OK);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 3; j++) assert_true(buf[i * 3 + j] == (float)v[j * 5 + i]);
    tu_assert_error(ct_tensor_copy_to_host(t, buf, sizeof buf - 1), CT_ERR_INVALID_ARG,
                    "ct_tensor_copy_to_host", "too small", "59", "60");
    tu_assert_error(ct_tensor_copy_to_host(t, NULL, 60), CT_ERR_INVALID_ARG, "NULL");
    tu_assert_error(ct_tensor_copy_to_host(NULL, buf, 60), CT_ERR_INVALID_ARG, "NULL");
    /* Nothing to copy: any buffer does. */
    ct_tensor *e = ct_tensor_zeros(CT_SHAPE(0, 5), CT_F32, CT_CPU);
    assert_int_equal(ct_tensor_copy_to_host(e, NULL, 0), CT_OK);
    free(v);
    ct_tensor_release(e);
    ct_tensor_release(tr);
    ct_tensor_release(t);
}

static void test_conversions(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = tu_rand(CT_SHAPE(4, 3), CT_F32, -100, 100, &v);
    ct_tensor *tr = ct_transpose(t, 0, 1);
    /* to_dtype: same dtype is a handle on the same storage, others a fresh contiguous copy */
    ct_tensor *same = ct_to_dtype(t, CT_F32);
    assert_true(ct_tensor_shares_storage(same, t));
    ct_tensor *d = ct_to_dtype(tr, CT_F64);
    assert_false(ct_tensor_shares_storage(d, t));
    assert_true(ct_tensor_is_contiguous(d));
    assert_shape(d, 2, (const int64_t[]){3, 4});
    double ref[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) ref[i * 4 + j] = v[j * 3 + i];
    assert_values(d, ref, 0, 0);
    tu_assert_null_error(ct_to_dtype(t, (ct_dtype)17), CT_ERR_DTYPE, "ct_to_dtype", "17");
    tu_assert_null_error(ct_to_dtype(NULL, CT_F32), CT_ERR_INVALID_ARG, "ct_to_dtype");
    /* clone: always a copy; contiguous: a copy only when needed */
    ct_tensor *c = ct_clone(t);
    assert_false(ct_tensor_shares_storage(c, t));
    assert_values(c, v, 0, 0);
    ct_tensor *c2 = ct_clone(tr);
    assert_true(ct_tensor_is_contiguous(c2));
    assert_values(c2, ref, 0, 0);
    ct_tensor *k1 = ct_contiguous(t);
    assert_true(ct_tensor_shares_storage(k1, t));
    ct_tensor *k2 = ct_contiguous(tr);
    assert_false(ct_tensor_shares_storage(k2, t));
    assert_true(ct_tensor_is_contiguous(k2));
    assert_values(k2, ref, 0, 0);
    /* A clone is independent of its source. */
    assert_int_equal(ct_fill_(t, 0), CT_OK);
    assert_values(c, v, 0, 0);
    ct_tensor *dev = ct_to_device(tr, CT_CPU);
    assert_true(ct_tensor_shares_storage(dev, t));
    free(v);
    ct_tensor *all[] = {t, tr, same, d, c, c2, k1, k2, dev};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

static void test_device_errors(void **state) {
    (void)state;
    float buf[4] = {1, 2, 3, 4};
    if (ct_backend_available(CT_DEVICE_CUDA)) skip();
    tu_assert_null_error(ct_tensor_from_data_on(buf, CT_F32, CT_SHAPE(4), CT_CUDA(0)),
                         CT_ERR_DEVICE, "ct_tensor_from_data_on", "cuda:0", "not available",
                         cti_backend_missing(CT_DEVICE_CUDA));
    ct_tensor *t = ct_tensor_from_data_on(buf, CT_F32, CT_SHAPE(4), CT_CPU);
    double ref[4] = {1, 2, 3, 4};
    assert_values(t, ref, 0, 0);
    tu_assert_null_error(ct_to_device(t, CT_CUDA(0)), CT_ERR_DEVICE, "ct_to_device", "cuda:0",
                         "not available");
    tu_assert_null_error(ct_tensor_zeros(CT_SHAPE(2), CT_F32, CT_CUDA(1)), CT_ERR_DEVICE,
                         "ct_tensor_zeros", "cuda:1");
    tu_assert_null_error(ct_tensor_rand(NULL, CT_SHAPE(2), CT_F32, CT_CUDA(0)), CT_ERR_DEVICE,
                         "ct_tensor_rand", "cuda:0");
    tu_assert_null_error(ct_tensor_empty(CT_SHAPE(2), CT_F32, ((ct_device){(ct_device_type)9, 0})),
                         CT_ERR_DEVICE, "ct_tensor_empty", "invalid device");
    tu_assert_null_error(ct_tensor_from_data_on(NULL, CT_F32, CT_SHAPE(4), CT_CPU),
                         CT_ERR_INVALID_ARG, "NULL");
    ct_tensor_release(t);
}

/* ======================================================================================
 * views
 * ====================================================================================== */

static void test_view_basic(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(2, 3, 4), CT_F32, &v);
    ct_tensor *a = ct_view(t, CT_SHAPE(6, 4));
    assert_shape(a, 2, (const int64_t[]){6, 4});
    assert_int_equal(ct_tensor_strides(a)[0], 4);
    assert_int_equal(ct_tensor_strides(a)[1], 1);
    assert_true(ct_tensor_shares_storage(a, t));
    assert_values(a, v, 0, 0);
    ct_tensor *b = ct_view(t, CT_SHAPE(-1, 8));
    assert_shape(b, 2, (const int64_t[]){3, 8});
    ct_tensor *c = ct_view(t, CT_SHAPE(4, -1, 1));
    assert_shape(c, 3, (const int64_t[]){4, 6, 1});
    ct_tensor *flat = ct_view(t, CT_SHAPE(-1));
    assert_shape(flat, 1, (const int64_t[]){24});
    /* Writes through a view reach the base. */
    ct_tensor *el = ct_select(a, 0, 5);
    assert_int_equal(ct_fill_(el, 42), CT_OK);
    v[20] = v[21] = v[22] = v[23] = 42;
    assert_values(t, v, 0, 0);
    /* A view of a transposed tensor where strides allow: merge the untouched dims. */
    ct_tensor *p = ct_permute(t, CT_DIMS(2, 0, 1)); /* [4, 2, 3], dims 0,1 of t are adjacent */
    ct_tensor *pv = ct_view(p, CT_SHAPE(4, 6));
    assert_non_null(pv);
    assert_int_equal(ct_tensor_strides(pv)[0], 1);
    assert_int_equal(ct_tensor_strides(pv)[1], 4);
    double ref[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) ref[i * 6 + j] = v[j * 4 + i];
    assert_values(pv, ref, 0, 0);
    /* A 0-d tensor views as [1] and back; an empty one as any shape of size 0. */
    ct_tensor *s = ct_tensor_scalar(3, CT_F64, CT_CPU);
    ct_tensor *s1 = ct_view(s, CT_SHAPE(1, 1));
    assert_shape(s1, 2, (const int64_t[]){1, 1});
    ct_tensor *s0 = ct_view(s1, CT_NONE);
    assert_int_equal(ct_tensor_ndim(s0), 0);
    free(v);
    ct_tensor *all[] = {t, a, b, c, flat, el, p, pv, s, s1, s0};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

static void test_view_errors(void **state) {
    (void)state;
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(2, 3, 4), CT_F32, CT_CPU);
    tu_assert_null_error(ct_view(t, CT_SHAPE(5, 5)), CT_ERR_SHAPE, "ct_view", "[5, 5]", "24");
    tu_assert_null_error(ct_view(t, CT_SHAPE(-1, -1)), CT_ERR_SHAPE, "ct_view", "one");
    tu_assert_null_error(ct_view(t, CT_SHAPE(-1, 5)), CT_ERR_SHAPE, "ct_view", "24");
    tu_assert_null_error(ct_view(t, CT_SHAPE(-2, 12)), CT_ERR_SHAPE, "ct_view", "-2");
    tu_assert_null_error(ct_view(NULL, CT_SHAPE(24)), CT_ERR_INVALID_ARG, "ct_view");
    ct_tensor *tr = ct_transpose(t, 1, 2); /* [2, 4, 3] */
    tu_assert_null_error(ct_view(tr, CT_SHAPE(2, 12)), CT_ERR_SHAPE, "ct_view", "[2, 12]",
                         "ct_reshape");
    /* the batch dim is still free to split */
    ct_tensor *ok = ct_view(tr, CT_SHAPE(1, 2, 4, 3));
    assert_non_null(ok);
    ct_tensor_release(ok);
    ct_tensor_release(tr);
    ct_tensor_release(t);
}

static void test_transpose_permute(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(2, 3, 4), CT_F64, &v);
    ct_tensor *tr = ct_transpose(t, -1, 0); /* [4, 3, 2] */
    assert_shape(tr, 3, (const int64_t[]){4, 3, 2});
    assert_int_equal(ct_tensor_strides(tr)[0], 1);
    assert_int_equal(ct_tensor_strides(tr)[2], 12);
    double ref[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) ref[(i * 3 + j) * 2 + k] = v[(k * 3 + j) * 4 + i];
    assert_values(tr, ref, 0, 0);
    ct_tensor *p = ct_permute(t, CT_DIMS(1, -1, 0)); /* [3, 4, 2] */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 2; k++) ref[(i * 4 + j) * 2 + k] = v[(k * 3 + i) * 4 + j];
    assert_values(p, ref, 0, 0);
    ct_tensor *m = ct_view(t, CT_SHAPE(6, 4));
    ct_tensor *mt = ct_t(m);
    assert_shape(mt, 2, (const int64_t[]){4, 6});
    ct_tensor *one = ct_select(m, 0, 0);
    ct_tensor *onet = ct_t(one); /* 1-d: unchanged */
    assert_shape(onet, 1, (const int64_t[]){4});
    tu_assert_null_error(ct_t(t), CT_ERR_SHAPE, "ct_t", "[2, 3, 4]");
    tu_assert_null_error(ct_transpose(t, 0, 3), CT_ERR_INDEX, "ct_transpose", "3");
    tu_assert_null_error(ct_permute(t, CT_DIMS(0, 1)), CT_ERR_SHAPE, "ct_permute");
    tu_assert_null_error(ct_permute(t, CT_DIMS(0, 1, 1)), CT_ERR_INDEX, "ct_permute", "repeated");
    tu_assert_null_error(ct_permute(t, CT_DIMS(0, 1, 5)), CT_ERR_INDEX, "ct_permute", "5");
    free(v);
    ct_tensor *all[] = {t, tr, p, m, mt, one, onet};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

static void check_slice(int64_t n, int64_t start, int64_t end, int64_t step) {
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(3, n), CT_F32, &v);
    ct_tensor *s = ct_slice(t, -1, start, end, step);
    assert_non_null(s);
    /* Python's rules */
    int64_t b = start < 0 ? start + n : start, e = end < 0 ? end + n : end;
    if (b < 0) b = 0;
    if (b > n) b = n;
    if (e > n) e = n;
    if (e < b) e = b;
    int64_t len = (e - b + step - 1) / step;
    assert_shape(s, 2, (const int64_t[]){3, len});
    assert_true(ct_tensor_shares_storage(s, t));
    double ref[3 * 64];
    for (int i = 0; i < 3; i++)
        for (int64_t k = 0; k < len; k++) ref[i * len + k] = v[i * n + b + k * step];
    assert_values(s, ref, 0, 0);
    free(v);
    ct_tensor_release(s);
    ct_tensor_release(t);
}

static void test_slice(void **state) {
    (void)state;
    check_slice(10, 0, 10, 1);
    check_slice(10, 1, 9, 3);
    check_slice(10, -4, -1, 1);
    check_slice(10, -100, 100, 2);
    check_slice(10, 7, 3, 1);    /* empty */
    check_slice(10, 12, 20, 1);  /* past the end: empty */
    check_slice(10, -3, INT64_MAX, 2);
    check_slice(1, 0, 1, 5);
    for (int r = 0; r < 30; r++) {
        int64_t n = tu_randint(1, 40);
        check_slice(n, tu_randint(-50, 50), tu_randint(-50, 50), tu_randint(1, 6));
    }
    /* A slice writes through to its base. */
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(8), CT_I32, CT_CPU);
    ct_tensor *s = ct_slice(t, 0, 1, 8, 3);
    assert_int_equal(ct_fill_(s, 5), CT_OK);
    double ref[8] = {0, 5, 0, 0, 5, 0, 0, 5};
    assert_values(t, ref, 0, 0);
    tu_assert_null_error(ct_slice(t, 0, 0, 8, 0), CT_ERR_INVALID_ARG, "ct_slice", "step");
    tu_assert_null_error(ct_slice(t, 0, 0, 8, -1), CT_ERR_INVALID_ARG, "ct_slice", "step");
    tu_assert_null_error(ct_slice(t, 1, 0, 8, 1), CT_ERR_INDEX, "ct_slice", "dim");
    ct_tensor *z = ct_tensor_scalar(1, CT_F32, CT_CPU);
    tu_assert_null_error(ct_slice(z, 0, 0, 1, 1), CT_ERR_SHAPE, "ct_slice", "0-d");
    ct_tensor_release(z);
    ct_tensor_release(s);
    ct_tensor_release(t);
}

static void test_select_narrow(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(3, 4, 5), CT_F64, &v);
    ct_tensor *s = ct_select(t, 1, -1); /* [3, 5]: t[:, 3, :] */
    assert_shape(s, 2, (const int64_t[]){3, 5});
    double ref[15];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 5; k++) ref[i * 5 + k] = v[(i * 4 + 3) * 5 + k];
    assert_values(s, ref, 0, 0);
    ct_tensor *s0 = ct_select(t, -3, 2);
    assert_values(s0, v + 40, 0, 0);
    ct_tensor *n = ct_narrow(t, 2, -3, 2); /* columns 2, 3 */
    assert_shape(n, 3, (const int64_t[]){3, 4, 2});
    double rn[24];
    for (int i = 0; i < 12; i++)
        for (int k = 0; k < 2; k++) rn[i * 2 + k] = v[i * 5 + 2 + k];
    assert_values(n, rn, 0, 0);
    ct_tensor *n0 = ct_narrow(t, 0, 3, 0);
    assert_int_equal(ct_tensor_numel(n0), 0);
    tu_assert_null_error(ct_select(t, 1, 4), CT_ERR_INDEX, "ct_select", "4");
    tu_assert_null_error(ct_select(t, 1, -5), CT_ERR_INDEX, "ct_select", "-5");
    tu_assert_null_error(ct_select(t, 3, 0), CT_ERR_INDEX, "ct_select", "dim 3");
    tu_assert_null_error(ct_narrow(t, 2, 3, 3), CT_ERR_INDEX, "ct_narrow");
    tu_assert_null_error(ct_narrow(t, 2, 6, 0), CT_ERR_INDEX, "ct_narrow", "6");
    tu_assert_null_error(ct_narrow(t, 2, 0, -1), CT_ERR_INDEX, "ct_narrow");
    free(v);
    ct_tensor *all[] = {t, s, s0, n, n0};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

/* User-given sizes, offsets and steps that would overflow int64 are refused
 * before any view can reach past its storage. */
static void test_view_integer_overflow(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(1000), CT_F32, CT_CPU);
    /* start + length overflows: refused, not a view of INT64_MAX elements */
    tu_assert_null_error(ct_narrow(t, 0, 2, INT64_MAX), CT_ERR_INDEX, "ct_narrow", "exceeds",
                         "1000");
    tu_assert_null_error(ct_narrow(t, 0, 0, -1), CT_ERR_INDEX, "ct_narrow",
                         "length must be non-negative", "-1");
    ct_tensor *ok = ct_narrow(t, 0, 998, 2);
    assert_non_null(ok);
    assert_int_equal(ct_tensor_numel(ok), 2);

    /* A huge step: one element, the stride of a one-element dim kept. */
    ct_tensor *one = ct_slice(t, 0, 3, INT64_MAX, INT64_MAX);
    assert_non_null(one);
    assert_int_equal(ct_tensor_shape(one)[0], 1);
    assert_int_equal(ct_tensor_offset(one), 3);
    ct_tensor *none = ct_slice(t, 0, INT64_MIN, INT64_MIN, INT64_MAX);
    assert_non_null(none);
    assert_int_equal(ct_tensor_numel(none), 0);
    ct_tensor *ends = ct_slice(t, 0, INT64_MIN, INT64_MAX, 999);
    assert_non_null(ends); /* elements 0 and 999 */
    assert_int_equal(ct_tensor_shape(ends)[0], 2);
    assert_int_equal(ct_tensor_strides(ends)[0], 999);

    /* Expanding to more elements than int64 holds is refused; zero-size
     * expands stay fine. */
    ct_tensor *s1 = ct_tensor_zeros(CT_SHAPE(1), CT_F32, CT_CPU);
    int64_t huge = (int64_t)1 << 32;
    tu_assert_null_error(ct_expand(s1, CT_SHAPE(huge, huge, huge)), CT_ERR_OVERFLOW, "ct_expand");
    ct_tensor *z = ct_expand(s1, CT_SHAPE(huge, huge, 0));
    assert_non_null(z);
    assert_int_equal(ct_tensor_numel(z), 0);
    tu_assert_null_error(ct_expand(s1, CT_SHAPE(-5)), CT_ERR_SHAPE, "ct_expand",
                         "size -5 at dim 0 is negative");
    /* An empty tensor beside huge sizes: its strides and contiguity are
     * computed without overflowing (the sanitizer build checks). */
    ct_tensor *e = ct_tensor_zeros(CT_SHAPE(0, huge, huge), CT_F32, CT_CPU);
    assert_non_null(e);
    assert_int_equal(ct_tensor_numel(e), 0);
    assert_true(ct_tensor_is_contiguous(e));
    assert_int_equal(ct_tensor_strides(e)[2], 1);
    assert_int_equal(ct_tensor_strides(e)[1], huge);
    ct_tensor *ec = ct_contiguous(ct_transpose(e, 0, 2));
    assert_non_null(ec);
    assert_int_equal(ct_tensor_numel(ec), 0);
    ct_scope_end(sc);
}

/* Each misuse gets the status and a message naming the actual fault. */
static void test_misuse_messages(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(2, 3), CT_F32, CT_CPU);
    tu_assert_null_error(ct_permute(t, 2, NULL), CT_ERR_INVALID_ARG, "ct_permute", "dims is NULL");
    tu_assert_null_error(ct_permute(t, 3, (const int64_t[]){0, 1, 2}), CT_ERR_SHAPE, "ct_permute",
                         "got 3 dims");
    ct_tensor *i = ct_tensor_zeros(CT_SHAPE(2, 3), CT_I64, CT_CPU);
    tu_assert_null_error(ct_sub_alpha(i, i, 0.5), CT_ERR_INVALID_ARG, "ct_sub_alpha",
                         "alpha must be an integer", "got 0.5");
    tu_assert_null_error(ct_add_alpha(i, i, -0.5), CT_ERR_INVALID_ARG, "ct_add_alpha", "got -0.5");
    ct_tensor *w = ct_tensor_zeros(CT_SHAPE(2, 3), CT_F32, CT_CPU);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    tu_assert_error(ct_set_grad(w, ct_tensor_zeros(CT_SHAPE(2, 3), CT_F64, CT_CPU)),
                    CT_ERR_DTYPE, "ct_set_grad", "does not match");
    tu_assert_error(ct_set_grad(w, ct_tensor_zeros(CT_SHAPE(3, 2), CT_F32, CT_CPU)),
                    CT_ERR_SHAPE, "ct_set_grad", "does not match");
    tu_assert_null_error(ct_rms_norm(t, 1, NULL, NULL, 1e-6, NULL), CT_ERR_INVALID_ARG,
                         "ct_rms_norm", "normalized_shape is NULL");
    tu_assert_null_error(ct_rms_norm(t, 0, (const int64_t[]){3}, NULL, 1e-6, NULL),
                         CT_ERR_INVALID_ARG, "ct_rms_norm", "at least one dim");
    ct_scope_end(sc);
}

/* A child forked after the pool's workers started runs parallel jobs of
 * its own (it once waited forever for the parent's workers). */
static void test_fork_child_runs_parallel_ops(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    int threads = ct_get_num_threads();
    assert_int_equal(ct_set_num_threads(2), CT_OK);
    ct_tensor *a = ct_tensor_full(CT_SHAPE(1 << 20), 1.5, CT_F32, CT_CPU);
    double v;
    assert_int_equal(ct_tensor_item(ct_sum(ct_add(a, a), 0, NULL, false), &v), CT_OK);
    assert_true(v == 3.0 * (1 << 20)); /* the parent's workers have run */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        double w = 0;
        ct_status st = ct_tensor_item(ct_sum(ct_mul(a, a), 0, NULL, false), &w);
        _exit(st == CT_OK && w == 2.25 * (1 << 20) ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(ct_set_num_threads(threads), CT_OK);
    ct_scope_end(sc);
}

static void test_squeeze_unsqueeze(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(1, 3, 1, 2), CT_F32, &v);
    ct_tensor *s = ct_squeeze(t);
    assert_shape(s, 2, (const int64_t[]){3, 2});
    assert_values(s, v, 0, 0);
    ct_tensor *s2 = ct_squeeze_dim(t, -2);
    assert_shape(s2, 3, (const int64_t[]){1, 3, 2});
    ct_tensor *s3 = ct_squeeze_dim(t, 1); /* size 3: unchanged */
    assert_shape(s3, 4, (const int64_t[]){1, 3, 1, 2});
    ct_tensor *u = ct_unsqueeze(s, 0), *u2 = ct_unsqueeze(s, -1), *u3 = ct_unsqueeze(s, 1);
    assert_shape(u, 3, (const int64_t[]){1, 3, 2});
    assert_shape(u2, 3, (const int64_t[]){3, 2, 1});
    assert_shape(u3, 3, (const int64_t[]){3, 1, 2});
    assert_true(ct_tensor_is_contiguous(u3));
    assert_values(u3, v, 0, 0);
    tu_assert_null_error(ct_unsqueeze(s, 3), CT_ERR_INDEX, "ct_unsqueeze");
    tu_assert_null_error(ct_squeeze_dim(t, 4), CT_ERR_INDEX, "ct_squeeze_dim");
    free(v);
    ct_tensor *all[] = {t, s, s2, s3, u, u2, u3};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

static void test_expand(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(3, 1), CT_F32, &v);
    ct_tensor *e = ct_expand(t, CT_SHAPE(2, 3, 4)); /* new leading dim, size-1 dim grown */
    assert_shape(e, 3, (const int64_t[]){2, 3, 4});
    assert_int_equal(ct_tensor_strides(e)[0], 0);
    assert_int_equal(ct_tensor_strides(e)[2], 0);
    assert_true(ct_tensor_shares_storage(e, t));
    double ref[24];
    for (int i = 0; i < 24; i++) ref[i] = v[(i / 4) % 3];
    assert_values(e, ref, 0, 0);
    ct_tensor *e2 = ct_expand(t, CT_SHAPE(-1, 5));
    assert_shape(e2, 2, (const int64_t[]){3, 5});
    ct_tensor *other = ct_tensor_zeros(CT_SHAPE(4, 3, 6), CT_I32, CT_CPU);
    ct_tensor *e3 = ct_expand_as(t, other);
    assert_shape(e3, 3, (const int64_t[]){4, 3, 6});
    /* Reading an expanded tensor into a fresh one materializes it. */
    ct_tensor *c = ct_contiguous(e);
    assert_false(ct_tensor_shares_storage(c, t));
    assert_values(c, ref, 0, 0);
    tu_assert_null_error(ct_expand(t, CT_SHAPE(4, 4)), CT_ERR_SHAPE, "ct_expand", "3");
    tu_assert_null_error(ct_expand(t, CT_SHAPE(4)), CT_ERR_SHAPE, "ct_expand");
    tu_assert_null_error(ct_expand(t, CT_SHAPE(-1, 3, 1)), CT_ERR_SHAPE, "ct_expand", "-1");
    tu_assert_null_error(ct_expand_as(t, NULL), CT_ERR_INVALID_ARG, "ct_expand_as");
    free(v);
    ct_tensor *all[] = {t, e, e2, other, e3, c};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

static void test_reshape(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(2, 3, 4), CT_BF16, &v);
    /* Contiguous: a view. */
    ct_tensor *r = ct_reshape(t, CT_SHAPE(4, -1));
    assert_shape(r, 2, (const int64_t[]){4, 6});
    assert_true(ct_tensor_shares_storage(r, t));
    assert_values(r, v, 0, 0);
    /* Transposed: only a copy can give row-major order. */
    ct_tensor *tr = ct_transpose(t, 0, 2); /* [4, 3, 2] */
    ct_tensor *rc = ct_reshape(tr, CT_SHAPE(-1));
    assert_shape(rc, 1, (const int64_t[]){24});
    assert_false(ct_tensor_shares_storage(rc, t));
    double ref[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) ref[(i * 3 + j) * 2 + k] = v[(k * 3 + j) * 4 + i];
    assert_values(rc, ref, 0, 0);
    /* Transposed but splitting a dim only: still a view. */
    ct_tensor *rv = ct_reshape(tr, CT_SHAPE(2, 2, 3, 2));
    assert_true(ct_tensor_shares_storage(rv, t));
    assert_values(rv, ref, 0, 0);
    /* Errors name ct_reshape and leave no error behind on success. */
    ct_clear_error();
    ct_tensor *ok = ct_reshape(tr, CT_SHAPE(6, 4));
    assert_non_null(ok);
    assert_int_equal(ct_last_status(), CT_OK);
    tu_assert_null_error(ct_reshape(tr, CT_SHAPE(5, -1)), CT_ERR_SHAPE, "ct_reshape", "24");
    tu_assert_null_error(ct_reshape(t, CT_SHAPE(7)), CT_ERR_SHAPE, "ct_reshape", "[7]");
    tu_assert_null_error(ct_reshape(NULL, CT_SHAPE(7)), CT_ERR_INVALID_ARG, "ct_reshape");
    free(v);
    ct_tensor *all[] = {t, r, tr, rc, rv, ok};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

static void test_flatten(void **state) {
    (void)state;
    double *v;
    ct_tensor *t = rand_t(CT_SHAPE(2, 3, 4, 5), CT_F32, &v);
    ct_tensor *f = ct_flatten(t, 1, 2);
    assert_shape(f, 3, (const int64_t[]){2, 12, 5});
    assert_true(ct_tensor_shares_storage(f, t));
    ct_tensor *all1 = ct_flatten(t, 0, -1);
    assert_shape(all1, 1, (const int64_t[]){120});
    assert_values(all1, v, 0, 0);
    ct_tensor *same = ct_flatten(t, 2, 2);
    assert_shape(same, 4, (const int64_t[]){2, 3, 4, 5});
    ct_tensor *p = ct_permute(t, CT_DIMS(0, 2, 1, 3));
    ct_tensor *pf = ct_flatten(p, 1, 2); /* needs a copy */
    assert_shape(pf, 3, (const int64_t[]){2, 12, 5});
    assert_false(ct_tensor_shares_storage(pf, t));
    double ref[120];
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 3; c++)
                for (int d = 0; d < 5; d++)
                    ref[((a * 4 + b) * 3 + c) * 5 + d] = v[((a * 3 + c) * 4 + b) * 5 + d];
    assert_values(pf, ref, 0, 0);
    ct_tensor *s = ct_tensor_scalar(2, CT_F32, CT_CPU);
    ct_tensor *sf = ct_flatten(s, 0, -1);
    assert_shape(sf, 1, (const int64_t[]){1});
    tu_assert_null_error(ct_flatten(t, 2, 1), CT_ERR_INVALID_ARG, "ct_flatten", "start_dim");
    tu_assert_null_error(ct_flatten(t, 0, 4), CT_ERR_INDEX, "ct_flatten");
    free(v);
    ct_tensor *all[] = {t, f, all1, same, p, pf, s, sf};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

/* ======================================================================================
 * cat and stack
 * ====================================================================================== */

static void test_cat(void **state) {
    (void)state;
    for (int dim = -3; dim < 3; dim++) {
        int d = dim < 0 ? dim + 3 : dim;
        int64_t sizes[3] = {2, 3, 4};
        ct_tensor *in[3];
        double *vals[3];
        int64_t extent[3] = {2, 1, 3}, total = 6;
        ct_dtype dts[3] = {CT_I32, CT_F16, CT_F32};
        for (int i = 0; i < 3; i++) {
            int64_t sh[3] = {sizes[0], sizes[1], sizes[2]};
            sh[d] = extent[i];
            ct_tensor *base = rand_t(3, sh, dts[i], &vals[i]);
            in[i] = i == 1 ? tu_noncontig(base) : ct_tensor_retain(base);
            ct_tensor_release(base);
        }
        ct_tensor *out = ct_cat(3, in, dim);
        int64_t osh[3] = {sizes[0], sizes[1], sizes[2]};
        osh[d] = total;
        assert_shape(out, 3, osh);
        assert_int_equal(ct_tensor_dtype(out), CT_F32);
        int64_t n = tu_numel(3, osh);
        double *ref = malloc((size_t)n * sizeof(double));
        for (int64_t k = 0; k < n; k++) {
            int64_t idx[3] = {k / (osh[1] * osh[2]), (k / osh[2]) % osh[1], k % osh[2]};
            int part = 0;
            int64_t pos = idx[d];
            while (pos >= extent[part]) pos -= extent[part++];
            int64_t sh[3] = {sizes[0], sizes[1], sizes[2]};
            sh[d] = extent[part];
            idx[d] = pos;
            ref[k] = vals[part][(idx[0] * sh[1] + idx[1]) * sh[2] + idx[2]];
        }
        assert_values(out, ref, 0, 0);
        free(ref);
        for (int i = 0; i < 3; i++) {
            free(vals[i]);
            ct_tensor_release(in[i]);
        }
        ct_tensor_release(out);
    }
    /* Promotion: int + bool -> int; f16 + bf16 -> f32; a lone tensor is copied. */
    ct_tensor *a = ct_tensor_ones(CT_SHAPE(2), CT_BOOL, CT_CPU), *b = ct_tensor_full(CT_SHAPE(3), 7, CT_I64, CT_CPU);
    ct_tensor *ab = ct_cat(2, (ct_tensor *[]){a, b}, 0);
    assert_int_equal(ct_tensor_dtype(ab), CT_I64);
    double rab[5] = {1, 1, 7, 7, 7};
    assert_values(ab, rab, 0, 0);
    ct_tensor *h = ct_tensor_full(CT_SHAPE(1), 0.5, CT_F16, CT_CPU), *bf = ct_tensor_full(CT_SHAPE(1), 2, CT_BF16, CT_CPU);
    ct_tensor *hb = ct_cat(2, (ct_tensor *[]){h, bf}, -1);
    assert_int_equal(ct_tensor_dtype(hb), CT_F32);
    ct_tensor *lone = ct_cat(1, &b, 0);
    assert_false(ct_tensor_shares_storage(lone, b));
    assert_values(lone, rab + 2, 0, 0);
    /* 1-d empty tensors are skipped, whatever the others' rank. */
    ct_tensor *e = ct_tensor_zeros(CT_SHAPE(0), CT_F32, CT_CPU);
    ct_tensor *m = ct_tensor_full(CT_SHAPE(2, 2), 3, CT_I32, CT_CPU);
    ct_tensor *em = ct_cat(3, (ct_tensor *[]){e, m, e}, 1);
    assert_shape(em, 2, (const int64_t[]){2, 2});
    assert_int_equal(ct_tensor_dtype(em), CT_F32);
    double r3[4] = {3, 3, 3, 3};
    assert_values(em, r3, 0, 0);
    ct_tensor *ee = ct_cat(2, (ct_tensor *[]){e, e}, 0);
    assert_shape(ee, 1, (const int64_t[]){0});
    /* Other zero-size parts take part normally. */
    ct_tensor *z = ct_tensor_zeros(CT_SHAPE(2, 0), CT_I32, CT_CPU);
    ct_tensor *zm = ct_cat(2, (ct_tensor *[]){z, m}, 1);
    assert_shape(zm, 2, (const int64_t[]){2, 2});
    ct_tensor *all[] = {a, b, ab, h, bf, hb, lone, e, m, em, ee, z, zm};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

static void test_cat_errors(void **state) {
    (void)state;
    ct_tensor *a = ct_tensor_zeros(CT_SHAPE(2, 3), CT_F32, CT_CPU);
    ct_tensor *b = ct_tensor_zeros(CT_SHAPE(2, 4), CT_F32, CT_CPU);
    ct_tensor *c = ct_tensor_zeros(CT_SHAPE(2, 3, 1), CT_F32, CT_CPU);
    ct_tensor *s = ct_tensor_scalar(1, CT_F32, CT_CPU);
    tu_assert_null_error(ct_cat(0, (ct_tensor *[]){a}, 0), CT_ERR_INVALID_ARG, "ct_cat", "non-empty");
    tu_assert_null_error(ct_cat(2, NULL, 0), CT_ERR_INVALID_ARG, "ct_cat");
    tu_assert_null_error(ct_cat(2, (ct_tensor *[]){a, NULL}, 0), CT_ERR_INVALID_ARG, "ct_cat",
                         "tensor 1", "NULL");
    tu_assert_null_error(ct_cat(3, (ct_tensor *[]){a, a, b}, 0), CT_ERR_SHAPE, "ct_cat",
                         "tensor 2", "dim 1", "[2, 4]", "[2, 3]");
    tu_assert_null_error(ct_cat(2, (ct_tensor *[]){a, c}, 0), CT_ERR_SHAPE, "ct_cat", "tensor 1",
                         "number of dims");
    tu_assert_null_error(ct_cat(2, (ct_tensor *[]){a, s}, 0), CT_ERR_SHAPE, "ct_cat",
                         "zero-dimensional", "tensor 1");
    tu_assert_null_error(ct_cat(2, (ct_tensor *[]){a, a}, 2), CT_ERR_INDEX, "ct_cat", "dim 2");
    ct_tensor *ab = ct_cat(2, (ct_tensor *[]){a, b}, 1); /* fine along the mismatched dim */
    assert_shape(ab, 2, (const int64_t[]){2, 7});
    ct_tensor *all[] = {a, b, c, s, ab};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

static void test_stack(void **state) {
    (void)state;
    for (int dim = -3; dim < 3; dim++) {
        int d = dim < 0 ? dim + 3 : dim;
        ct_tensor *in[4];
        double *vals[4];
        for (int i = 0; i < 4; i++) {
            ct_tensor *base = rand_t(CT_SHAPE(3, 5), i == 2 ? CT_F64 : CT_F32, &vals[i]);
            in[i] = i % 2 ? tu_noncontig(base) : ct_tensor_retain(base);
            ct_tensor_release(base);
        }
        ct_tensor *out = ct_stack(4, in, dim);
        int64_t osh[3];
        for (int k = 0, j = 0; k < 3; k++) osh[k] = k == d ? 4 : (j++ == 0 ? 3 : 5);
        assert_shape(out, 3, osh);
        assert_int_equal(ct_tensor_dtype(out), CT_F64);
        double ref[60];
        for (int64_t k = 0; k < 60; k++) {
            int64_t idx[3] = {k / (osh[1] * osh[2]), (k / osh[2]) % osh[1], k % osh[2]};
            int64_t rest[2];
            for (int q = 0, j = 0; q < 3; q++)
                if (q != d) rest[j++] = idx[q];
            ref[k] = vals[idx[d]][rest[0] * 5 + rest[1]];
        }
        assert_values(out, ref, 0, 0);
        for (int i = 0; i < 4; i++) {
            free(vals[i]);
            ct_tensor_release(in[i]);
        }
        ct_tensor_release(out);
    }
    ct_tensor *a = ct_tensor_zeros(CT_SHAPE(2, 3), CT_F32, CT_CPU);
    ct_tensor *b = ct_tensor_zeros(CT_SHAPE(3, 2), CT_F32, CT_CPU);
    tu_assert_null_error(ct_stack(2, (ct_tensor *[]){a, b}, 0), CT_ERR_SHAPE, "ct_stack",
                         "tensor 1", "[3, 2]", "[2, 3]");
    tu_assert_null_error(ct_stack(0, (ct_tensor *[]){a}, 0), CT_ERR_INVALID_ARG, "ct_stack");
    tu_assert_null_error(ct_stack(2, (ct_tensor *[]){a, a}, 3), CT_ERR_INDEX, "ct_stack");
    tu_assert_null_error(ct_stack(1, (ct_tensor *[]){NULL}, 0), CT_ERR_INVALID_ARG, "ct_stack",
                         "NULL");
    /* Scalars stack into a vector. */
    ct_tensor *s1 = ct_tensor_scalar(1, CT_I32, CT_CPU), *s2 = ct_tensor_scalar(2, CT_I32, CT_CPU);
    ct_tensor *st = ct_stack(2, (ct_tensor *[]){s1, s2}, 0);
    double r[2] = {1, 2};
    assert_values(st, r, 0, 0);
    ct_tensor *all[] = {a, b, s1, s2, st};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_release(all[k]);
}

/* ======================================================================================
 * autograd through the value-preserving ops, and in-place refusal
 * ====================================================================================== */

/* Backpropagates a random gradient through y = f(x) and checks x's
 * gradient is that gradient back in x's layout and dtype. */
static void check_identity_grad(ct_tensor *(*f)(ct_tensor *), const char *grad_fn) {
    double *xv;
    ct_tensor *x = tu_rand(CT_SHAPE(3, 4), CT_F64, -1, 1, &xv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *y = f(x);
    assert_non_null(y);
    assert_true(ct_requires_grad(y));
    assert_string_equal(ct_grad_fn_name(y), grad_fn);
    double *gv;
    ct_tensor *g = tu_rand(ct_tensor_ndim(y), ct_tensor_shape(y), ct_tensor_dtype(y), -1, 1, &gv);
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    ct_tensor *gx = ct_grad(x);
    assert_non_null(gx);
    assert_shape(gx, 2, (const int64_t[]){3, 4});
    assert_int_equal(ct_tensor_dtype(gx), CT_F64);
    /* y is x's values in row-major order of y: map back by values */
    double *yv = tu_values(y), *gxv = tu_values(gx);
    for (int64_t k = 0; k < 12; k++) {
        int64_t src = -1;
        for (int64_t q = 0; q < 12; q++)
            if (tu_round(xv[q], ct_tensor_dtype(y)) == yv[k]) src = q;
        assert_true(src >= 0);
        assert_true(gxv[src] == gv[k]);
    }
    free(yv);
    free(gxv);
    free(xv);
    free(gv);
    ct_tensor_release(g);
    ct_tensor_release(y);
    ct_tensor_release(x);
}

static ct_tensor *f_reshape_copy(ct_tensor *x) {
    ct_tensor *t = ct_transpose(x, 0, 1);
    ct_tensor *r = ct_reshape(t, CT_SHAPE(2, -1)); /* needs a copy */
    ct_tensor_release(t);
    return r;
}
static ct_tensor *f_reshape_view(ct_tensor *x) { return ct_reshape(x, CT_SHAPE(6, 2)); }
static ct_tensor *f_flatten(ct_tensor *x) { return ct_flatten(x, 0, -1); }
static ct_tensor *f_clone(ct_tensor *x) { return ct_clone(x); }
static ct_tensor *f_contiguous_t(ct_tensor *x) {
    ct_tensor *t = ct_transpose(x, 0, 1);
    ct_tensor *r = ct_contiguous(t);
    ct_tensor_release(t);
    return r;
}
static ct_tensor *f_to_f32(ct_tensor *x) { return ct_to_dtype(x, CT_F32); }

static void test_autograd_through_copies(void **state) {
    (void)state;
    check_identity_grad(f_reshape_copy, "ReshapeBackward");
    check_identity_grad(f_reshape_view, "ReshapeBackward");
    check_identity_grad(f_flatten, "ReshapeBackward");
    check_identity_grad(f_clone, "CloneBackward");
    check_identity_grad(f_contiguous_t, "CloneBackward");
    check_identity_grad(f_to_f32, "ToCopyBackward");
    /* Integer results carry no history. */
    ct_tensor *x = ct_tensor_ones(CT_SHAPE(2), CT_F32, CT_CPU);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *i = ct_to_dtype(x, CT_I64);
    assert_false(ct_requires_grad(i));
    /* No recording in no-grad mode. */
    bool prev = ct_no_grad_begin();
    ct_tensor *c = ct_clone(x);
    ct_no_grad_end(prev);
    assert_false(ct_requires_grad(c));
    ct_tensor_release(c);
    ct_tensor_release(i);
    ct_tensor_release(x);
}

static void test_inplace_refused_on_grad_leaves(void **state) {
    (void)state;
    double *xv;
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, &xv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *src = ct_tensor_zeros(CT_SHAPE(3), CT_F32, CT_CPU);
    tu_assert_error(ct_copy_(x, src), CT_ERR_AUTOGRAD, "ct_copy_", "leaf");
    tu_assert_error(ct_fill_(x, 2), CT_ERR_AUTOGRAD, "ct_fill_", "leaf");
    tu_assert_error(ct_zero_(x), CT_ERR_AUTOGRAD, "ct_zero_", "leaf");
    tu_assert_error(ct_uniform_(x, 0, 1, NULL), CT_ERR_AUTOGRAD, "ct_uniform_", "leaf");
    tu_assert_error(ct_normal_(x, 0, 1, NULL), CT_ERR_AUTOGRAD, "ct_normal_", "leaf");
    ct_tensor *r = ct_reshape(x, CT_SHAPE(6));
    tu_assert_error(ct_fill_(r, 1), CT_ERR_AUTOGRAD, "ct_fill_", "ReshapeBackward");
    assert_values(x, xv, 0, 0);
    /* In no-grad mode the update goes through (an optimizer step). */
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_copy_(x, src), CT_OK);
    ct_no_grad_end(prev);
    double z[6] = {0};
    assert_values(x, z, 0, 0);
    /* Reading from a tensor that requires grad is fine. */
    ct_tensor *dst = ct_tensor_ones(CT_SHAPE(2, 3), CT_F64, CT_CPU);
    assert_int_equal(ct_copy_(dst, x), CT_OK);
    free(xv);
    ct_tensor_release(dst);
    ct_tensor_release(r);
    ct_tensor_release(src);
    ct_tensor_release(x);
}

/* ======================================================================================
 * scopes and reference counts
 * ====================================================================================== */

static void test_scopes(void **state) {
    (void)state;
    int64_t base = cti_get_alloc_stats().live_tensors;
    ct_scope *s = ct_scope_begin();
    assert_non_null(s);
    ct_tensor *a = ct_tensor_ones(CT_SHAPE(3), CT_F32, CT_CPU);
    ct_tensor *b = ct_reshape(a, CT_SHAPE(1, 3));
    ct_tensor *c = ct_clone(b);
    ct_tensor *kept = ct_keep(ct_tensor_full(CT_SHAPE(2), 5, CT_F32, CT_CPU));
    (void)c;
    assert_int_equal(cti_get_alloc_stats().live_tensors, base + 4);
    /* "No-op" conversions hand out handles the scope owns as well. */
    assert_non_null(ct_contiguous(a));
    assert_non_null(ct_to_dtype(a, CT_F32));
    assert_non_null(ct_to_device(a, CT_CPU));
    assert_int_equal(cti_get_alloc_stats().live_tensors, base + 7);
    ct_scope_end(s);
    assert_int_equal(cti_get_alloc_stats().live_tensors, base + 1);
    double r[2] = {5, 5};
    assert_values(kept, r, 0, 0);
    ct_tensor_release(kept);
    assert_int_equal(cti_get_alloc_stats().live_tensors, base);

    /* Nested: keep hands a tensor to the enclosing scope. */
    ct_scope *outer = ct_scope_begin();
    ct_tensor *x = ct_tensor_zeros(CT_SHAPE(4), CT_F32, CT_CPU);
    ct_scope *inner = ct_scope_begin();
    ct_tensor *y = ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU);
    ct_tensor *z = ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU);
    ct_keep(y);
    assert_int_equal(ct_copy_(x, z), CT_OK);
    ct_scope_end(inner);
    assert_int_equal(cti_get_alloc_stats().live_tensors, base + 2);
    double r1[4] = {1, 1, 1, 1};
    assert_values(y, r1, 0, 0);
    assert_values(x, r1, 0, 0);
    ct_scope_end(outer);
    assert_int_equal(cti_get_alloc_stats().live_tensors, base);

    /* Releasing early inside a scope is fine; ending an outer scope ends inner ones. */
    ct_scope *o2 = ct_scope_begin();
    ct_tensor *early = ct_tensor_zeros(CT_SHAPE(8), CT_F64, CT_CPU);
    ct_tensor_release(early);
    ct_tensor *live = ct_tensor_zeros(CT_SHAPE(8), CT_F64, CT_CPU);
    (void)live;
    ct_scope *i2 = ct_scope_begin();
    ct_tensor *deep = ct_tensor_rand(NULL, CT_SHAPE(8), CT_F32, CT_CPU);
    ct_tensor *deep_view = ct_transpose(ct_view(deep, CT_SHAPE(2, 4)), 0, 1);
    (void)deep_view;
    (void)i2;
    ct_scope_end(o2);
    assert_int_equal(cti_get_alloc_stats().live_tensors, base);
    /* A retained scoped tensor survives the scope by the extra reference. */
    ct_scope *s3 = ct_scope_begin();
    ct_tensor *held = ct_tensor_retain(ct_tensor_ones(CT_SHAPE(2), CT_I32, CT_CPU));
    ct_scope_end(s3);
    double r2[2] = {1, 1};
    assert_values(held, r2, 0, 0);
    ct_tensor_release(held);
    /* Ending twice or NULL is harmless. */
    ct_scope_end(s3);
    ct_scope_end(NULL);
    ct_keep(NULL);
}

static void test_refcounts(void **state) {
    (void)state;
    cti_alloc_stats s0 = cti_get_alloc_stats();
    ct_tensor *t = ct_tensor_ones(CT_SHAPE(1000), CT_F32, CT_CPU);
    cti_alloc_stats s1 = cti_get_alloc_stats();
    assert_int_equal(s1.live_tensors, s0.live_tensors + 1);
    assert_int_equal(s1.live_storages, s0.live_storages + 1);
    assert_true(s1.live_bytes >= s0.live_bytes + 4000);
    assert_ptr_equal(ct_tensor_retain(t), t);
    ct_tensor_release(t);
    double one;
    ct_tensor *el = ct_select(t, 0, 999);
    assert_int_equal(ct_tensor_item(el, &one), CT_OK);
    assert_true(one == 1);
    /* A view keeps the storage alive after its base goes. */
    ct_tensor_release(t);
    assert_int_equal(cti_get_alloc_stats().live_storages, s0.live_storages + 1);
    assert_int_equal(ct_tensor_item(el, &one), CT_OK);
    assert_true(one == 1);
    ct_tensor_release(el);
    cti_alloc_stats s2 = cti_get_alloc_stats();
    assert_int_equal(s2.live_tensors, s0.live_tensors);
    assert_int_equal(s2.live_storages, s0.live_storages);
    assert_int_equal(s2.live_bytes, s0.live_bytes);
    ct_tensor_release(NULL);
    /* Properties of NULL are defined. */
    assert_int_equal(ct_tensor_ndim(NULL), -1);
    assert_int_equal(ct_tensor_numel(NULL), 0);
    assert_null(ct_tensor_data_ptr(NULL));
    assert_int_equal(ct_tensor_size(NULL, 0), -1);
}

static void test_properties(void **state) {
    (void)state;
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(2, 3, 4), CT_F64, CT_CPU);
    assert_int_equal(ct_tensor_size(t, -1), 4);
    assert_int_equal(ct_tensor_size(t, 0), 2);
    assert_int_equal(ct_tensor_size(t, 3), -1);
    tu_assert_error(ct_last_status(), CT_ERR_INDEX, "ct_tensor_size", "3");
    ct_tensor *n = ct_narrow(t, 2, 1, 2);
    assert_int_equal(ct_tensor_offset(n), 1);
    assert_ptr_equal(ct_tensor_data_ptr(n), (char *)ct_tensor_data_ptr(t) + 8);
    assert_false(ct_tensor_is_contiguous(n));
    ct_tensor *s = ct_tensor_scalar(1, CT_F32, CT_CPU);
    assert_int_equal(ct_tensor_size(s, 0), 1);
    ct_tensor_release(s);
    ct_tensor_release(n);
    ct_tensor_release(t);
}

/* The inline bfloat16 conversions kernels use agree with the library's on
 * every bfloat16 value, on random float bit patterns (NaNs included) and on
 * the ties that round to even. */
static void test_bf16_inline_conversions(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = ct_bf16_to_f32((uint16_t)h), b = cti_bf16_to_f32((uint16_t)h);
        assert_memory_equal(&a, &b, sizeof a);
        assert_int_equal(ct_f32_to_bf16(a), cti_f32_to_bf16(a));
    }
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)tu_next();
        if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
        float f;
        memcpy(&f, &u, sizeof f);
        assert_int_equal(ct_f32_to_bf16(f), cti_f32_to_bf16(f));
    }
}

/* Freed blocks from 64 KiB on are reused for the same rounded size; a full
 * cache evicts its oldest blocks, so the most recent sizes stay cached.
 * Assumes CT_CPU_CACHE_MB is unset (512). Tensors stay untouched, so the
 * large ones cost no memory. */
static void test_cpu_block_cache(void **state) {
    (void)state;
    const size_t MiB = (size_t)1 << 20;
    ct_cpu_empty_cache();
    assert_int_equal(ct_cpu_cached_bytes(), 0);
    /* small blocks are not cached; 100 KiB rounds to 128 KiB */
    ct_tensor *t = ct_tensor_empty(CT_SHAPE(1000), CT_F32, CT_CPU);
    ct_tensor_release(t);
    assert_int_equal(ct_cpu_cached_bytes(), 0);
    t = ct_tensor_empty(CT_SHAPE(25600), CT_F32, CT_CPU);
    ct_tensor_release(t);
    assert_int_equal(ct_cpu_cached_bytes(), 128 << 10);
    t = ct_tensor_empty(CT_SHAPE(25000), CT_F32, CT_CPU); /* same rounded size: reused */
    assert_int_equal(ct_cpu_cached_bytes(), 0);
    ct_tensor_release(t);
    /* blocks of 130, 134, ..., 146 MiB in a 512 MiB cache: the 4th evicts the 1st */
    for (int64_t k = 0; k < 5; k++) {
        t = ct_tensor_empty(CT_SHAPE((int64_t)(130 * MiB / 4) + k * 1024 * 1024), CT_F32, CT_CPU);
        assert_non_null(t);
        ct_tensor_release(t);
        assert_true(ct_cpu_cached_bytes() <= 512 * MiB);
    }
    /* the last one is still there: taking it back empties its share */
    size_t before = ct_cpu_cached_bytes();
    t = ct_tensor_empty(CT_SHAPE((int64_t)(130 * MiB / 4) + 4 * 1024 * 1024), CT_F32, CT_CPU);
    assert_int_equal(before - ct_cpu_cached_bytes(), 146 * MiB); /* 130 MiB + 4 * 4 MiB */
    ct_tensor_release(t);
    /* the first one was evicted: taking its size allocates anew */
    before = ct_cpu_cached_bytes();
    t = ct_tensor_empty(CT_SHAPE((int64_t)(130 * MiB / 4)), CT_F32, CT_CPU);
    assert_int_equal(ct_cpu_cached_bytes(), before);
    ct_tensor_release(t);
    ct_cpu_empty_cache();
    assert_int_equal(ct_cpu_cached_bytes(), 0);
}

/* ---- the hash index ------------------------------------------------------------------- */

/* Random insertions, replacements and removals on both key kinds against a
 * plain array: every lookup agrees, through growth and the backward shifts
 * of removal in chains of colliding slots. */
static void test_hashmap_against_reference(void **state) {
    (void)state;
    enum { nkeys = 3000, nops = 200000 };
    static char keys[nkeys][16];
    static int64_t ref[nkeys];
    for (int i = 0; i < nkeys; i++) snprintf(keys[i], sizeof keys[i], "key%d", i);
    for (int kind = 0; kind < 2; kind++) {
        cti_hmap m;
        cti_hmap_init(&m, kind ? CTI_HMAP_PTR : CTI_HMAP_STR);
        for (int i = 0; i < nkeys; i++) ref[i] = -1;
        size_t count = 0;
        for (int op = 0; op < nops; op++) {
            /* Few keys early, so the small tables see long chains. */
            int lim = op < nops / 4 ? 40 : nkeys;
            int k = (int)tu_randint(0, lim);
            /* String keys looked up through a different copy of the text. */
            char probe[16];
            memcpy(probe, keys[k], sizeof probe);
            const void *key = kind ? (const void *)keys[k] : keys[k];
            const void *look = kind ? (const void *)keys[k] : probe;
            int64_t v = tu_randint(0, 1000000);
            switch (tu_randint(0, 4)) {
            case 0:
                assert_true(cti_hmap_put(&m, key, v));
                if (ref[k] < 0) count++;
                ref[k] = v;
                break;
            case 1: {
                int64_t r = cti_hmap_put_new(&m, key, v);
                assert_int_equal(r, ref[k]);
                if (ref[k] < 0) {
                    ref[k] = v;
                    count++;
                }
                break;
            }
            case 2:
                assert_int_equal(cti_hmap_remove(&m, look), ref[k] >= 0);
                if (ref[k] >= 0) count--;
                ref[k] = -1;
                break;
            default:
                assert_int_equal(cti_hmap_get(&m, look), ref[k]);
            }
            assert_int_equal(m.count, count);
        }
        for (int i = 0; i < nkeys; i++)
            assert_int_equal(cti_hmap_get(&m, kind ? (const void *)keys[i] : keys[i]), ref[i]);
        /* A size that cannot be allocated is refused and changes nothing. */
        size_t cap = m.cap;
        assert_false(cti_hmap_reserve(&m, SIZE_MAX));
        assert_false(cti_hmap_reserve(&m, SIZE_MAX / 3));
        assert_int_equal(m.cap, cap);
        assert_int_equal(m.count, count);
        cti_hmap_clear(&m);
        assert_int_equal(cti_hmap_get(&m, keys[0]), -1);
        assert_false(cti_hmap_remove(&m, keys[0]));
    }
}

int main(void) {
    tu_seed();
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_dtype_sizes_names),
        T(test_cpu_block_cache),
        T(test_bf16_inline_conversions),
        T(test_promotion_table),
        T(test_result_type_and_can_cast),
        T(test_device_strings),
        T(test_f16_decode_exhaustive),
        T(test_f16_round_trip_exhaustive),
        T(test_f32_to_f16_rounding),
        T(test_bf16_conversion),
        T(test_from_data_round_trip),
        T(test_creation_errors),
        T(test_zeros_ones_full),
        T(test_like_functions),
        T(test_item),
        T(test_arange),
        T(test_arange_errors),
        T(test_linspace),
        T(test_eye),
        T(test_philox),
        T(test_rng_observer),
        T(test_random_reproducible),
        T(test_random_exact_mapping),
        T(test_random_thread_independent),
        T(test_uniform_statistics),
        T(test_normal_statistics),
        T(test_uniform_normal_inplace),
        T(test_randint),
        T(test_random_errors),
        T(test_copy_all_dtype_pairs),
        T(test_copy_noncontig_pairs),
        T(test_copy_broadcast),
        T(test_copy_large),
        T(test_copy_permuted_large),
        T(test_copy_half_bit_exact),
        T(test_copy_special_values),
        T(test_copy_errors),
        T(test_copy_overlapping_views),
        T(test_fill_zero_strided),
        T(test_copy_to_host),
        T(test_conversions),
        T(test_device_errors),
        T(test_view_basic),
        T(test_view_errors),
        T(test_transpose_permute),
        T(test_slice),
        T(test_select_narrow),
        T(test_view_integer_overflow),
        T(test_misuse_messages),
        T(test_fork_child_runs_parallel_ops),
        T(test_squeeze_unsqueeze),
        T(test_expand),
        T(test_reshape),
        T(test_flatten),
        T(test_cat),
        T(test_cat_errors),
        T(test_stack),
        T(test_autograd_through_copies),
        T(test_inplace_refused_on_grad_leaves),
        T(test_scopes),
        T(test_hashmap_against_reference),
        T(test_refcounts),
        T(test_properties),
    };
#undef T
    return tu_run_tests(tests);
}
