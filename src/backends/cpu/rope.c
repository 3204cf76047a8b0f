/* CPU kernels of ROPE, ROPE_BACKWARD, SWIGLU and SWIGLU_BACKWARD
 * (cti_rope_params, cti_swiglu_params; the contract is schema.h's).
 *
 * rope works a row of d elements at a time over the pool: the row's x (its
 * last dim contiguous, its other dims any strides) and its d/2 table entries
 * (the expanded views' strides, 0 where the tables broadcast) are found by
 * stepping an index over x's leading dims, so broadcast tables are read in
 * place, never materialized. The backward is the same rotation with sin
 * negated. swiglu is elementwise over rows with a contiguous last dim (and
 * a row stride each, so chunk halves are read in place). f16/bf16 convert
 * blocks to f32 scratch and back, so every product is computed in f32; f64
 * keeps f64 and libm. Beside an f16/bf16 x, rope's tables may be f32: their
 * entries are rounded to x's dtype as they are loaded, as a cast would. */
#if defined(__GNUC__) && !defined(__clang__) /* clang vectorizes them at -O2 and knows no such pragma */
#pragma GCC optimize("O3")
#endif

#include "nn_impl.h"

/* ---- rope ---------------------------------------------------------------------------------- */

typedef struct rope_ctx {
    ct_call *c;
    const cti_rope_params *p;
    double sign; /* +1 forward, -1 backward: the sign of sin */
    atomic_bool oom;
} rope_ctx;

/* One row turned: y, x of d = 2h elements, c and s of h. */
#define ROPE_ROW(T, NAME)                                                                      \
    static void NAME(T *restrict y, const T *restrict x, const T *restrict c,                  \
                     const T *restrict s, T sign, int64_t h, int layout) {                     \
        if (layout == CTI_ROPE_HALF) {                                                         \
            for (int64_t k = 0; k < h; k++) {                                                  \
                T a = x[k], b = x[k + h], ck = c[k], sk = sign * s[k];                         \
                y[k] = a * ck - b * sk;                                                        \
                y[k + h] = b * ck + a * sk;                                                    \
            }                                                                                  \
        } else {                                                                               \
            for (int64_t k = 0; k < h; k++) {                                                  \
                T a = x[2 * k], b = x[2 * k + 1], ck = c[k], sk = sign * s[k];                 \
                y[2 * k] = a * ck - b * sk;                                                    \
                y[2 * k + 1] = b * ck + a * sk;                                                \
            }                                                                                  \
        }                                                                                      \
    }
ROPE_ROW(float, rope_row_f32)
ROPE_ROW(double, rope_row_f64)

/* n table entries of dtype tdt as x's dtype xdt would hold them, in f32. */
static void load_table(const void *src, ct_dtype tdt, ct_dtype xdt, int64_t n,
                       float *restrict dst) {
    if (tdt == xdt) {
        load_f32(src, xdt, n, 1, dst);
        return;
    }
    const float *s = src;
    if (xdt == CT_F16)
        for (int64_t i = 0; i < n; i++) dst[i] = cti_f16_to_f32(cti_f32_to_f16(s[i]));
    else
        for (int64_t i = 0; i < n; i++) dst[i] = cti_bf16_to_f32(cti_f32_to_bf16(s[i]));
}

/* Rows [r0, r1): idx steps over x's leading dims (an odometer), giving each
 * row's element offsets in x and in the tables. */
static void rope_task(int64_t r0, int64_t r1, void *vp) {
    rope_ctx *k = vp;
    ct_call *c = k->c;
    const ct_tensor *x = c->in[0], *tc = c->in[1], *ts = c->in[2];
    ct_tensor *y = c->out[0];
    const int64_t d = k->p->d, h = d / 2;
    const int lead = x->ndim - 1;
    const ct_dtype dt = x->dtype, tdt = tc->dtype;
    const size_t es = ct_dtype_size(dt), tes = ct_dtype_size(tdt);
    int64_t idx[CT_MAX_DIMS] = {0};
    int64_t xo = 0, to = 0;
    for (int64_t i = lead - 1, q = r0; i >= 0; i--) {
        idx[i] = q % x->shape[i];
        q /= x->shape[i];
        xo += idx[i] * x->stride[i];
        to += idx[i] * tc->stride[i];
    }
    float *buf = NULL;
    if (is_half(dt)) {
        buf = scratch(sizeof(float) * (size_t)(2 * d + 2 * h));
        if (!buf) {
            atomic_store(&k->oom, true);
            return;
        }
    }
    int64_t loaded = -1; /* the table offset whose entries cf and sf hold */
    for (int64_t r = r0; r < r1; r++) {
        char *yr = cti_data(y) + (size_t)(r * d) * es;
        const char *xr = cti_data(x) + xo * (int64_t)es;
        const char *cr = cti_data(tc) + to * (int64_t)tes, *sr = cti_data(ts) + to * (int64_t)tes;
        if (dt == CT_F64) {
            rope_row_f64((double *)yr, (const double *)xr, (const double *)cr,
                         (const double *)sr, k->sign, h, k->p->layout);
        } else if (dt == CT_F32) {
            rope_row_f32((float *)yr, (const float *)xr, (const float *)cr, (const float *)sr,
                         (float)k->sign, h, k->p->layout);
        } else {
            float *xf = buf, *yf = buf + d, *cf = buf + 2 * d, *sf = cf + h;
            load_f32(xr, dt, d, 1, xf);
            /* rows under one table row (the heads of [B, T, H, D] beside [T, 1, D/2])
             * follow each other: its entries are converted once for all of them */
            if (to != loaded) {
                load_table(cr, tdt, dt, h, cf);
                load_table(sr, tdt, dt, h, sf);
                loaded = to;
            }
            rope_row_f32(yf, xf, cf, sf, (float)k->sign, h, k->p->layout);
            store_f32(yf, dt, d, 1, yr);
        }
        for (int i = lead - 1; i >= 0; i--) { /* next row */
            xo += x->stride[i];
            to += tc->stride[i];
            if (++idx[i] < x->shape[i]) break;
            xo -= idx[i] * x->stride[i];
            to -= idx[i] * tc->stride[i];
            idx[i] = 0;
        }
    }
    free(buf);
}

static ct_status k_rope(ct_call *c) {
    const cti_rope_params *p = CTI_PARAMS(c, cti_rope_params);
    if (p->rows == 0 || p->d == 0) return CT_OK;
    rope_ctx k = {.c = c, .p = p, .sign = c->op == CT_OP_ROPE_BACKWARD ? -1.0 : 1.0};
    atomic_init(&k.oom, false);
    cti_parallel_for(p->rows, row_grain(p->d), rope_task, &k);
    if (atomic_load(&k.oom))
        return cti_error(CT_ERR_OOM, "%s: out of memory",
                         c->op == CT_OP_ROPE ? "ct_rope" : "ct_rope_backward");
    return CT_OK;
}

/* ---- swiglu -------------------------------------------------------------------------------- */

/* Elements per f32 block of the f16/bf16 paths (on the stack). */
#define SW_BLOCK 512

static void swiglu_f32(float *restrict y, const float *restrict g, const float *restrict u,
                       int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = vm_silu(g[i]) * u[i];
}

/* Both gradients in one pass over the inputs when both are wanted. */
static void swiglu_bwd_f32(float *restrict dg, float *restrict du, const float *restrict go,
                           const float *restrict g, const float *restrict u, int64_t n) {
    if (dg && du) {
        for (int64_t i = 0; i < n; i++) {
            float s = vm_sigmoid(g[i]);
            dg[i] = go[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
            du[i] = go[i] * g[i] * s;
        }
    } else if (dg) {
        for (int64_t i = 0; i < n; i++) {
            float s = vm_sigmoid(g[i]);
            dg[i] = go[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        }
    } else {
        for (int64_t i = 0; i < n; i++) du[i] = go[i] * vm_silu(g[i]);
    }
}

static double sigmoid_f64(double x) {
    return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x));
}

/* The operands of one run of contiguous elements (a row or part of one):
 * byte pointers, NULL where the call has no such operand. */
typedef struct sw_run {
    const char *g, *u, *go;
    char *a, *b;
} sw_run;

static void sw_segment(ct_dtype dt, bool bwd, const sw_run *r, int64_t n) {
    if (dt == CT_F64) {
        const double *g = (const double *)r->g, *u = (const double *)r->u;
        const double *go = (const double *)r->go;
        double *a = (double *)r->a, *b = (double *)r->b;
        for (int64_t i = 0; i < n; i++) {
            double s = sigmoid_f64(g[i]);
            if (!bwd) {
                a[i] = g[i] * s * u[i];
                continue;
            }
            if (a) a[i] = go[i] * u[i] * s * (1 + g[i] * (1 - s));
            if (b) b[i] = go[i] * g[i] * s;
        }
        return;
    }
    if (dt == CT_F32) {
        const float *g = (const float *)r->g, *u = (const float *)r->u;
        if (!bwd) swiglu_f32((float *)r->a, g, u, n);
        else swiglu_bwd_f32((float *)r->a, (float *)r->b, (const float *)r->go, g, u, n);
        return;
    }
    const size_t es = ct_dtype_size(dt);
    float g[SW_BLOCK], u[SW_BLOCK], go[SW_BLOCK], a[SW_BLOCK], b[SW_BLOCK];
    for (int64_t i = 0; i < n; i += SW_BLOCK) {
        int64_t m = n - i < SW_BLOCK ? n - i : SW_BLOCK;
        size_t at = (size_t)i * es;
        load_f32(r->g + at, dt, m, 1, g);
        load_f32(r->u + at, dt, m, 1, u);
        if (!bwd) {
            swiglu_f32(a, g, u, m);
            store_f32(a, dt, m, 1, r->a + at);
            continue;
        }
        load_f32(r->go + at, dt, m, 1, go);
        swiglu_bwd_f32(r->a ? a : NULL, r->b ? b : NULL, go, g, u, m);
        if (r->a) store_f32(a, dt, m, 1, r->a + at);
        if (r->b) store_f32(b, dt, m, 1, r->b + at);
    }
}

/* Elements [i0, i1) of the rows x cols index space, cut at row ends. */
static void sw_task(int64_t i0, int64_t i1, void *vp) {
    ct_call *c = vp;
    const cti_swiglu_params *p = CTI_PARAMS(c, cti_swiglu_params);
    const bool bwd = c->op == CT_OP_SWIGLU_BACKWARD;
    /* forward: in gate, up; out y. backward: in grad_out, gate, up; out dgate, dup. */
    const int kg = bwd ? 1 : 0, ku = bwd ? 2 : 1;
    const ct_tensor *o1 = bwd && c->nout > 1 ? c->out[1] : NULL;
    const ct_dtype dt = c->in[kg]->dtype;
    const size_t es = ct_dtype_size(dt);
    for (int64_t i = i0; i < i1;) {
        int64_t row = i / p->cols, col = i % p->cols;
        int64_t m = p->cols - col < i1 - i ? p->cols - col : i1 - i;
#define IN(k) (cti_data(c->in[k]) + (size_t)(row * p->ld[k] + col) * es)
#define OUT(t) (t ? cti_data(t) + (size_t)(row * p->ldo + col) * es : NULL)
        sw_run r = {.g = IN(kg), .u = IN(ku), .go = bwd ? IN(0) : NULL, .a = OUT(c->out[0]),
                    .b = OUT(o1)};
#undef IN
#undef OUT
        sw_segment(dt, bwd, &r, m);
        i += m;
    }
}

static ct_status k_swiglu(ct_call *c) {
    const cti_swiglu_params *p = CTI_PARAMS(c, cti_swiglu_params);
    int64_t n = p->rows * p->cols;
    if (n > 0) cti_parallel_for(n, CTI_GRAIN / 4, sw_task, c);
    return CT_OK;
}

void cti_cpu_register_rope(void) {
    static const nn_kernel ks[] = {
        {CT_OP_ROPE, k_rope, "cpu_rope"},
        {CT_OP_ROPE_BACKWARD, k_rope, "cpu_rope_backward"},
        {CT_OP_SWIGLU, k_swiglu, "cpu_swiglu"},
        {CT_OP_SWIGLU_BACKWARD, k_swiglu, "cpu_swiglu_backward"},
    };
    nn_register_floating(ks, sizeof ks / sizeof ks[0]);
}
