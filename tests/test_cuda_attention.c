/* The CUDA kernels of scaled dot-product attention (SDPA, SDPA_BACKWARD)
 * against the CPU ones on the same inputs, forward and backward (through
 * autograd on each device): float32 and float64 against the CPU in the same
 * dtype, float16 and bfloat16 against the CPU's float32 on the same rounded
 * values, with a tolerance. Shapes: odd T and S, T != S, T = 1, head dims
 * that are not powers of two and Dv != D, grouped-query attention (1, 2, 4
 * query heads per kv head), q, k, v transposed from [B, T, H, D], 3-d
 * inputs, bool and additive masks (full and broadcasting, with fully masked
 * rows: 0 output and 0 gradients on both), causal with T < S and T > S,
 * dropout (the same generator state draws the same mask on both devices,
 * from the shared Philox rule), several tiles of 64 and more. Outputs are
 * poisoned with NaN first. Mixed devices are refused with a message. A
 * missing CUDA kernel fails its case with a message naming it. Skips
 * without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cuda_test_util.h"
#include "test_util.h"
#include "cuda_module.h"

#include "test_fixture.h"

static int ngpu;

/* Fills freed device blocks of about `bytes` with NaN, so an output the
 * caching allocator hands out next from them starts as NaN. */
static void poison(int64_t bytes) {
    int64_t n = bytes / 4 + 1;
    ct_tensor *t = checked(ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0)));
    ok(ct_fill_(t, NAN));
    ct_tensor_release(t);
}

enum { MASK_NONE, MASK_BOOL, MASK_ADD };
enum { FORM_FULL, FORM_TS, FORM_B1TS, FORM_1H1S };

typedef struct gcase {
    int nd;
    int64_t B, Hq, Hkv, T, S, D, Dv;
    bool transposed;
    int mask_kind, mask_form;
    bool masked_row, causal;
    double p, scale;
} gcase;

/* What one device computed: out, dq, dk, dv as float64 values in logical
 * [B, H, L, E] order. */
typedef struct result {
    double *v[4];
    int64_t n[4];
} result;

static void result_free(result *r) {
    for (int i = 0; i < 4; i++) free(r->v[i]);
}

static double *values_f64(ct_tensor *t, int64_t *n) {
    ct_tensor *c = checked(ct_contiguous(t));
    double *v = tu_values(c);
    *n = ct_tensor_numel(c);
    ct_tensor_release(c);
    return v;
}

/* x (CPU, logical [B, H, L, E] or [H, L, E]) as the op gets it on dev in dtype
 * dt, and the leaf that requires grad: x itself, or the transpose of a
 * [B, L, H, E] copy. */
static ct_tensor *input_on(const gcase *c, ct_tensor *x, ct_dtype dt, ct_device dev,
                           ct_tensor **leaf) {
    ct_tensor *xd = checked(ct_to_dtype(x, dt));
    ct_tensor *lf;
    int a = c->nd - 3, b = c->nd - 2; /* the head and sequence dims */
    if (c->transposed) {
        ct_tensor *t = checked(ct_transpose(xd, a, b));
        ct_tensor *tc = checked(ct_contiguous(t));
        lf = checked(ct_to_device(tc, dev));
        ct_tensor_release(t);
        ct_tensor_release(tc);
    } else {
        lf = checked(ct_to_device(xd, dev));
    }
    ct_tensor_release(xd);
    ok(ct_requires_grad_(lf, true));
    *leaf = lf;
    return c->transposed ? checked(ct_transpose(lf, a, b)) : ct_tensor_retain(lf);
}

static double *leaf_grad(const gcase *c, ct_tensor *leaf, int64_t *n) {
    ct_tensor *g = ct_grad(leaf);
    assert_non_null(g);
    int a = c->nd - 3, b = c->nd - 2;
    ct_tensor *v = c->transposed ? checked(ct_transpose(g, a, b)) : ct_tensor_retain(g);
    ct_tensor *h = checked(ct_to_device(v, CT_CPU));
    double *vals = values_f64(h, n);
    ct_tensor_release(h);
    ct_tensor_release(v);
    return vals;
}

/* Runs c on dev in dtype dt from the CPU inputs (q, k, v, mask, grad_out)
 * with dropout from a generator at (seed, offset). */
static void run_on(const gcase *c, ct_dtype dt, ct_device dev, ct_tensor *const *in,
                   uint64_t seed, uint64_t offset, result *r) {
    ct_tensor *lq, *lk, *lv;
    ct_tensor *q = input_on(c, in[0], dt, dev, &lq);
    ct_tensor *k = input_on(c, in[1], dt, dev, &lk);
    ct_tensor *v = input_on(c, in[2], dt, dev, &lv);
    ct_tensor *m = NULL;
    if (in[3]) {
        ct_tensor *md = checked(ct_to_dtype(in[3], ct_tensor_dtype(in[3]) == CT_BOOL ? CT_BOOL : dt));
        m = checked(ct_to_device(md, dev));
        ct_tensor_release(md);
    }
    ct_tensor *gd = checked(ct_to_dtype(in[4], dt));
    ct_tensor *g = checked(ct_to_device(gd, dev));
    ct_tensor_release(gd);
    ct_generator *gen = ct_generator_new(seed);
    ct_generator_set_offset(gen, offset);
    if (dev.type == CT_DEVICE_CUDA) poison(ct_tensor_numel(in[4]) * 8);
    ct_tensor *o = checked(ct_scaled_dot_product_attention(q, k, v, m, c->p, c->causal, c->scale, gen));
    ct_tensor *oh = checked(ct_to_device(o, CT_CPU));
    r->v[0] = values_f64(oh, &r->n[0]);
    if (dev.type == CT_DEVICE_CUDA) poison(ct_tensor_numel(in[0]) * 8);
    ok(ct_backward(o, g, false));
    r->v[1] = leaf_grad(c, lq, &r->n[1]);
    r->v[2] = leaf_grad(c, lk, &r->n[2]);
    r->v[3] = leaf_grad(c, lv, &r->n[3]);
    ct_generator_free(gen);
    ct_tensor *rel[] = {q, k, v, lq, lk, lv, m, g, o, oh};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) ct_tensor_release(rel[i]);
}

static void describe(const gcase *c, ct_dtype dt, char *buf, size_t n) {
    snprintf(buf, n,
             "%s %dd B%lld Hq%lld Hkv%lld T%lld S%lld D%lld Dv%lld%s mask %d form %d%s%s p %g "
             "scale %g",
             ct_dtype_name(dt), c->nd, (long long)c->B, (long long)c->Hq, (long long)c->Hkv,
             (long long)c->T, (long long)c->S, (long long)c->D, (long long)c->Dv,
             c->transposed ? " transposed" : "", c->mask_kind, c->mask_form,
             c->masked_row ? " masked-row" : "", c->causal ? " causal" : "", c->p, c->scale);
}

static double tol_of(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-10;
    case CT_F32: return 2e-5;
    case CT_F16: return 5e-3;
    default: return 3e-2;
    }
}

/* The mask's CPU tensor (NULL for none), with row 0 of every head fully
 * masked when c->masked_row. */
static ct_tensor *make_mask(const gcase *c) {
    if (c->mask_kind == MASK_NONE) return NULL;
    int64_t s[4];
    int nd;
    switch (c->mask_form) {
    case FORM_TS: nd = 2, s[0] = c->T, s[1] = c->S; break;
    case FORM_B1TS: nd = 4, s[0] = c->B, s[1] = 1, s[2] = c->T, s[3] = c->S; break;
    case FORM_1H1S: nd = 4, s[0] = 1, s[1] = c->Hq, s[2] = 1, s[3] = c->S; break;
    default: nd = 4, s[0] = c->B, s[1] = c->Hq, s[2] = c->T, s[3] = c->S; break;
    }
    if (c->nd == 3 && nd == 4) {
        nd = 3;
        for (int d = 0; d < 3; d++) s[d] = s[d + 1];
    }
    int64_t n = tu_numel(nd, s), S = s[nd - 1], tsz = nd >= 2 ? s[nd - 2] : 1;
    double *v = malloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t e = 0; e < n; e++)
        v[e] = c->mask_kind == MASK_BOOL ? (double)(tu_uniform(0, 1) < 0.8)
               : tu_uniform(0, 1) < 0.15 ? -INFINITY
                                         : tu_round(tu_uniform(-2, 2), CT_BF16);
    if (c->masked_row)
        for (int64_t r = 0; r < n / S; r += tsz)
            for (int64_t j = 0; j < S; j++) v[r * S + j] = c->mask_kind == MASK_BOOL ? 0 : -INFINITY;
    /* additive values are bf16-exact so that every dtype holds them alike */
    ct_tensor *m = tu_from_f64(v, nd, s, c->mask_kind == MASK_BOOL ? CT_BOOL : CT_F64);
    free(v);
    return checked(m);
}

/* One case in dtype dt: the GPU in dt against the CPU in dt (f32, f64) or
 * in float32 (f16, bf16). */
static int run_case(const gcase *c, ct_dtype dt) {
    char d[256];
    describe(c, dt, d, sizeof d);
    if (!ct_supports(CT_OP_SDPA, CT_DEVICE_CUDA, dt) ||
        !ct_supports(CT_OP_SDPA_BACKWARD, CT_DEVICE_CUDA, dt)) {
        fprintf(stderr, "[%s] no CUDA kernel for scaled_dot_product_attention%s in %s\n", d,
                ct_supports(CT_OP_SDPA, CT_DEVICE_CUDA, dt) ? "_backward" : "",
                ct_dtype_name(dt));
        return 1;
    }
    int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, T = c->T, S = c->S, D = c->D, Dv = c->Dv;
    int64_t qs[4] = {B, Hq, T, D}, ks[4] = {B, Hkv, S, D}, vs[4] = {B, Hkv, S, Dv},
            os[4] = {B, Hq, T, Dv};
    int o = 4 - c->nd;
    /* values rounded to dt, held in float64 */
    ct_tensor *in[5] = {tu_rand(c->nd, qs + o, dt, -1, 1, NULL), tu_rand(c->nd, ks + o, dt, -1, 1, NULL),
                        tu_rand(c->nd, vs + o, dt, -1, 1, NULL), make_mask(c),
                        tu_rand(c->nd, os + o, dt, -1, 1, NULL)};
    for (int i = 0; i < 5; i++)
        if (i != 3) {
            ct_tensor *f = checked(ct_to_dtype(in[i], CT_F64));
            ct_tensor_release(in[i]);
            in[i] = f;
        }
    uint64_t seed = tu_next(), offset = (uint64_t)tu_randint(0, 1000);
    bool half = dt == CT_F16 || dt == CT_BF16;
    result ref, got;
    memset(&ref, 0, sizeof ref);
    memset(&got, 0, sizeof got);
    run_on(c, half ? CT_F32 : dt, CT_CPU, in, seed, offset, &ref);
    run_on(c, dt, CT_CUDA(0), in, seed, offset, &got);
    static const char *names[4] = {"out", "dq", "dk", "dv"};
    double tol = tol_of(dt) / (1 - c->p);
    int bad = 0;
    for (int i = 0; i < 4 && !bad; i++) {
        assert_int_equal(got.n[i], ref.n[i]);
        double t = i == 0 ? tol : 3 * tol; /* gradients sum more rounded terms */
        for (int64_t e = 0; e < ref.n[i]; e++) {
            double g = got.v[i][e], r = ref.v[i][e];
            if (!(fabs(g - r) <= t + t * fabs(r))) {
                fprintf(stderr, "[%s] %s element %lld: GPU %.10g, CPU %.10g\n", d, names[i],
                        (long long)e, g, r);
                bad = 1;
                break;
            }
        }
    }
    result_free(&ref);
    result_free(&got);
    for (int i = 0; i < 5; i++) ct_tensor_release(in[i]);
    return bad;
}

static const gcase base = {.nd = 4, .B = 2, .Hq = 4, .Hkv = 2, .T = 37, .S = 53, .D = 24, .Dv = 24};

static int named_cases(gcase *cs) {
    int n = 0;
    cs[n++] = base;
    cs[n] = base, cs[n].T = 1, n++;
    cs[n] = base, cs[n].D = 80, cs[n].Dv = 20, cs[n].Hkv = 1, n++;            /* GQA 4 */
    cs[n] = base, cs[n].Hkv = 4, cs[n].D = 64, cs[n].Dv = 64, n++;            /* GQA 1 */
    cs[n] = base, cs[n].D = 128, cs[n].Dv = 128, cs[n].T = 130, cs[n].S = 70, n++;
    cs[n] = base, cs[n].transposed = true, cs[n].causal = true, n++;          /* T < S */
    cs[n] = base, cs[n].T = 70, cs[n].S = 29, cs[n].causal = true, n++;       /* T > S */
    cs[n] = base, cs[n].mask_kind = MASK_BOOL, cs[n].mask_form = FORM_TS, cs[n].masked_row = true, n++;
    cs[n] = base, cs[n].mask_kind = MASK_ADD, cs[n].mask_form = FORM_B1TS, cs[n].masked_row = true, n++;
    cs[n] = base, cs[n].mask_kind = MASK_ADD, cs[n].mask_form = FORM_1H1S, n++;
    cs[n] = base, cs[n].mask_kind = MASK_BOOL, cs[n].transposed = true, n++;
    cs[n] = base, cs[n].p = 0.4, n++;
    cs[n] = base, cs[n].p = 0.2, cs[n].causal = true, cs[n].Hkv = 1, cs[n].T = 129, cs[n].S = 129, n++;
    cs[n] = base, cs[n].nd = 3, cs[n].B = 1, cs[n].mask_kind = MASK_BOOL, cs[n].masked_row = true, n++;
    cs[n] = base, cs[n].scale = 0.7, cs[n].T = 257, cs[n].S = 300, cs[n].D = 64, cs[n].Dv = 64, n++;
    cs[n] = base, cs[n].T = 5, cs[n].S = 1, cs[n].D = 1, cs[n].Dv = 3, n++;
    return n;
}

static void run_all(ct_dtype dt) {
    gcase cs[32];
    int n = named_cases(cs), bad = 0;
    for (int i = 0; i < n; i++) bad += run_case(&cs[i], dt);
    /* and random ones */
    static const int64_t lens[] = {1, 7, 31, 64, 65, 100, 129}, dims[] = {8, 16, 24, 33, 64, 80};
    for (int rep = 0; rep < 12; rep++) {
        gcase c = base;
        c.Hkv = tu_randint(1, 3);
        c.Hq = c.Hkv * (int64_t[]){1, 2, 4}[tu_randint(0, 3)];
        c.T = lens[tu_randint(0, 7)];
        c.S = lens[tu_randint(0, 7)];
        c.D = dims[tu_randint(0, 6)];
        c.Dv = tu_randint(0, 2) ? c.D : dims[tu_randint(0, 6)];
        c.transposed = tu_randint(0, 2);
        int kind = (int)tu_randint(0, 4);
        c.mask_kind = kind < 3 ? kind : MASK_NONE;
        c.causal = kind == 3;
        c.mask_form = (int)tu_randint(0, 4);
        c.masked_row = c.mask_kind != MASK_NONE && tu_randint(0, 2);
        c.p = tu_randint(0, 3) == 0 ? 0.25 : 0;
        bad += run_case(&c, dt);
    }
    if (bad) fprintf(stderr, "%d of %d %s cases differ or did not run\n", bad, n + 12, ct_dtype_name(dt));
    assert_int_equal(bad, 0);
}

#define NEED_GPU()             \
    do {                       \
        if (ngpu == 0) skip(); \
    } while (0)

static void test_f32(void **state) {
    (void)state;
    NEED_GPU();
    run_all(CT_F32);
}
static void test_f64(void **state) {
    (void)state;
    NEED_GPU();
    run_all(CT_F64);
}
static void test_f16(void **state) {
    (void)state;
    NEED_GPU();
    run_all(CT_F16);
}
static void test_bf16(void **state) {
    (void)state;
    NEED_GPU();
    run_all(CT_BF16);
}

/* A row with every key masked gives exactly 0 on the GPU, with scores that
 * would overflow, and 0 gradients. */
static void test_fully_masked(void **state) {
    (void)state;
    NEED_GPU();
    double qv[12], kv[16], mv[12];
    for (int i = 0; i < 12; i++) qv[i] = 50.0 * (i + 1);
    for (int i = 0; i < 16; i++) kv[i] = 1.0 + i;
    for (int i = 0; i < 12; i++) mv[i] = i < 4 ? 0 : 1;
    int64_t qs[4] = {1, 1, 3, 4}, ks[4] = {1, 1, 4, 4}, ms[2] = {3, 4};
    ct_tensor *hq = tu_from_f64(qv, 4, qs, CT_F32), *hk = tu_from_f64(kv, 4, ks, CT_F32);
    ct_tensor *hm = tu_from_f64(mv, 2, ms, CT_BOOL);
    ct_tensor *q = checked(ct_to_device(hq, CT_CUDA(0))), *k = checked(ct_to_device(hk, CT_CUDA(0)));
    ct_tensor *m = checked(ct_to_device(hm, CT_CUDA(0)));
    ok(ct_requires_grad_(q, true));
    poison(64);
    ct_tensor *o = checked(ct_scaled_dot_product_attention(q, k, k, m, 0, false, 0, NULL));
    ct_tensor *oh = checked(ct_to_device(o, CT_CPU));
    double *ov = tu_values(oh);
    for (int d = 0; d < 4; d++) assert_true(ov[d] == 0.0);
    for (int e = 4; e < 12; e++) assert_true(isfinite(ov[e]));
    free(ov);
    ct_tensor *g = checked(ct_tensor_ones_like(o));
    ok(ct_backward(o, g, false));
    ct_tensor *gq = checked(ct_to_device(ct_grad(q), CT_CPU));
    double *gv = tu_values(gq);
    for (int d = 0; d < 4; d++) assert_true(gv[d] == 0.0);
    free(gv);
    ct_tensor *rel[] = {hq, hk, hm, q, k, m, o, oh, g, gq};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) ct_tensor_release(rel[i]);
}

/* Tensors on two devices are refused, the mask's included. */
static void test_mixed_devices(void **state) {
    (void)state;
    NEED_GPU();
    int64_t s[4] = {1, 2, 3, 4}, ms[2] = {3, 3};
    ct_tensor *hq = checked(ct_tensor_zeros(4, s, CT_F32, CT_CPU));
    ct_tensor *gq = checked(ct_to_device(hq, CT_CUDA(0)));
    ct_tensor *hm = checked(ct_tensor_zeros(2, ms, CT_BOOL, CT_CPU));
    tu_assert_null_error(ct_scaled_dot_product_attention(gq, hq, gq, NULL, 0, false, 0, NULL),
                         CT_ERR_DEVICE, "ct_scaled_dot_product_attention",
                         "expected all tensors on one device");
    tu_assert_null_error(ct_scaled_dot_product_attention(gq, gq, gq, hm, 0, false, 0, NULL),
                         CT_ERR_DEVICE, "ct_scaled_dot_product_attention",
                         "expected all tensors on one device");
    ct_tensor *rel[] = {hq, gq, hm};
    for (size_t i = 0; i < 3; i++) ct_tensor_release(rel[i]);
}

int main(void) {
    tu_seed();
    cti_init();
    ngpu = tu_cuda_devices_or_skip("cuda_attention");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_f32), T(test_f64), T(test_f16), T(test_bf16), T(test_fully_masked),
        T(test_mixed_devices),
    };
#undef T
    return tu_run_tests(tests);
}
