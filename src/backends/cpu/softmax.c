/* CPU kernels of SOFTMAX, LOG_SOFTMAX and their backward ops over x viewed
 * as [outer, d, inner] with the softmax over d (cti_softmax_params),
 * contiguous. forward: in x; out y. backward: in grad_y, y; out dx.
 *
 *   softmax:     m = max(x);  y = exp(x - m) / sum(exp(x - m))
 *   log_softmax: y = (x - m) - log(sum(exp(x - m)))
 *   backward, from the output y and its gradient g:
 *     softmax:     dx = y * (g - sum(g * y))
 *     log_softmax: dx = g - exp(y) * sum(g)
 *
 * A f32 forward output of NN_STREAM_BYTES or more is written with
 * non-temporal stores. With inner == 1 a task takes whole rows. Otherwise the d elements of one
 * softmax lie inner apart, and a task takes COL_BLOCK adjacent columns at
 * once so that the inner loops run over contiguous memory and vectorize.
 * The typed row functions are compiled per row type (this file includes
 * itself through nn_types.h). */
#ifndef NN_T
#if defined(__GNUC__) && !defined(__clang__) /* clang vectorizes them at -O2 and knows no such pragma */
#pragma GCC optimize("O3")
#endif

#include "nn_impl.h"

/* Inner-dim columns one softmax task handles when the dim is not the last. */
#define COL_BLOCK 64

#define NN_TYPED "softmax.c"
#include "nn_types.h"

typedef struct sm_ctx {
    ct_call *c;
    int64_t outer, d, inner, nblk;
    bool lg, bwd;
    bool stream; /* f32 forward output larger than the caches: non-temporal stores */
    atomic_bool oom;
} sm_ctx;

static void sm_rows_task(int64_t r0, int64_t r1, void *p) {
    sm_ctx *k = p;
    ct_call *c = k->c;
    ct_tensor *a = c->in[0], *b = k->bwd ? c->in[1] : NULL, *o = c->out[0];
    int64_t d = k->d;
    ct_dtype dt = a->dtype;
    /* a row of exp(x - max) for the forward; halves also get a, b, y rows */
    size_t acc = dt == CT_F64 ? sizeof(double) : sizeof(float);
    char *buf = scratch(acc * (size_t)((is_half(dt) ? 4 : 1) * d));
    if (!buf) {
        atomic_store(&k->oom, true);
        return;
    }
    if (dt == CT_F64) {
        const double *A = (const double *)cti_data(a), *B = b ? (const double *)cti_data(b) : NULL;
        double *O = (double *)cti_data(o);
        for (int64_t r = r0; r < r1; r++) {
            if (k->bwd) softmax_bwd_row_d(A + r * d, B + r * d, O + r * d, d, k->lg);
            else softmax_row_d(A + r * d, O + r * d, d, k->lg, (double *)buf, false, NULL);
        }
    } else if (dt == CT_F32) {
        const float *A = (const float *)cti_data(a), *B = b ? (const float *)cti_data(b) : NULL;
        float *O = (float *)cti_data(o);
        for (int64_t r = r0; r < r1; r++) {
            if (k->bwd) softmax_bwd_row_f(A + r * d, B + r * d, O + r * d, d, k->lg);
            else softmax_row_f(A + r * d, O + r * d, d, k->lg, (float *)buf, k->stream,
                               k->stream && r + 1 < r1 ? A + (r + 1) * d : NULL);
        }
        if (k->stream) stream_fence();
    } else {
        float *tmp = (float *)buf, *ar = tmp + d, *br = ar + d, *orow = br + d;
        size_t es = ct_dtype_size(dt);
        for (int64_t r = r0; r < r1; r++) {
            load_f32(cti_data(a) + r * d * es, dt, d, 1, ar);
            if (k->bwd) {
                load_f32(cti_data(b) + r * d * es, dt, d, 1, br);
                softmax_bwd_row_f(ar, br, orow, d, k->lg);
            } else {
                softmax_row_f(ar, orow, d, k->lg, tmp, false, NULL);
            }
            store_f32(orow, dt, d, 1, cti_data(o) + r * d * es);
        }
    }
    free(buf);
}

/* Work item = (outer index, block of COL_BLOCK inner columns). */
static void sm_cols_task(int64_t i0, int64_t i1, void *p) {
    sm_ctx *k = p;
    ct_call *c = k->c;
    ct_tensor *a = c->in[0], *b = k->bwd ? c->in[1] : NULL, *o = c->out[0];
    int64_t d = k->d, inner = k->inner;
    ct_dtype dt = a->dtype;
    bool h = is_half(dt);
    size_t es = ct_dtype_size(dt);
    size_t acc = dt == CT_F64 ? sizeof(double) : sizeof(float);
    /* m, s per column; halves also get [d][bw] slabs for a, b, o */
    size_t n = 2 * COL_BLOCK + (h ? 3 * (size_t)d * COL_BLOCK : 0);
    char *buf = scratch(acc * n);
    if (!buf) {
        atomic_store(&k->oom, true);
        return;
    }
    for (int64_t it = i0; it < i1; it++) {
        int64_t oi = it / k->nblk, j0 = (it % k->nblk) * COL_BLOCK;
        int64_t bw = inner - j0 < COL_BLOCK ? inner - j0 : COL_BLOCK;
        int64_t base = oi * d * inner + j0;
        if (dt == CT_F64) {
            double *m = (double *)buf, *s = m + COL_BLOCK;
            const double *A = (const double *)cti_data(a) + base;
            double *O = (double *)cti_data(o) + base;
            if (k->bwd) softmax_bwd_cols_d(A, (const double *)cti_data(b) + base, O, d, inner, bw, k->lg, s);
            else softmax_cols_d(A, O, d, inner, bw, k->lg, m, s);
        } else if (!h) {
            float *m = (float *)buf, *s = m + COL_BLOCK;
            const float *A = (const float *)cti_data(a) + base;
            float *O = (float *)cti_data(o) + base;
            if (k->bwd) softmax_bwd_cols_f(A, (const float *)cti_data(b) + base, O, d, inner, bw, k->lg, s);
            else softmax_cols_f(A, O, d, inner, bw, k->lg, m, s);
        } else {
            float *m = (float *)buf, *s = m + COL_BLOCK;
            float *as = s + COL_BLOCK, *bs = as + d * COL_BLOCK, *os = bs + d * COL_BLOCK;
            for (int64_t kk = 0; kk < d; kk++) {
                load_f32(cti_data(a) + (base + kk * inner) * (int64_t)es, dt, bw, 1, as + kk * bw);
                if (k->bwd)
                    load_f32(cti_data(b) + (base + kk * inner) * (int64_t)es, dt, bw, 1, bs + kk * bw);
            }
            if (k->bwd) softmax_bwd_cols_f(as, bs, os, d, bw, bw, k->lg, s);
            else softmax_cols_f(as, os, d, bw, bw, k->lg, m, s);
            for (int64_t kk = 0; kk < d; kk++)
                store_f32(os + kk * bw, dt, bw, 1, cti_data(o) + (base + kk * inner) * (int64_t)es);
        }
    }
    free(buf);
}

static ct_status k_softmax_any(ct_call *c, bool bwd) {
    const cti_softmax_params *p = CTI_PARAMS(c, cti_softmax_params);
    sm_ctx k = {.c = c, .outer = p->outer, .d = p->d, .inner = p->inner, .lg = p->log, .bwd = bwd};
    k.stream = !bwd && c->in[0]->dtype == CT_F32 &&
               (uint64_t)(k.outer * k.d * k.inner) * sizeof(float) >= NN_STREAM_BYTES;
    atomic_init(&k.oom, false);
    /* An empty result: nothing to compute, and its sizes may multiply past
     * int64 (a zero next to huge sizes). */
    if (k.outer == 0 || k.d == 0 || k.inner == 0) return CT_OK;
    if (k.inner == 1) {
        cti_parallel_for(k.outer, row_grain(k.d), sm_rows_task, &k);
    } else {
        k.nblk = (k.inner + COL_BLOCK - 1) / COL_BLOCK;
        int64_t per = k.d > INT64_MAX / COL_BLOCK ? INT64_MAX : k.d * COL_BLOCK;
        cti_parallel_for(k.outer * k.nblk, row_grain(per), sm_cols_task, &k);
        c->routine = "softmax_strided";
    }
    if (atomic_load(&k.oom))
        return cti_error(CT_ERR_OOM, "%s: out of memory for scratch", ct_op_name(c->op));
    return CT_OK;
}
static ct_status k_softmax(ct_call *c) { return k_softmax_any(c, false); }
static ct_status k_softmax_backward(ct_call *c) { return k_softmax_any(c, true); }

void cti_cpu_register_softmax(void) {
    static const nn_kernel ks[] = {
        {CT_OP_SOFTMAX, k_softmax, "cpu_softmax"},
        {CT_OP_LOG_SOFTMAX, k_softmax, "cpu_log_softmax"},
        {CT_OP_SOFTMAX_BACKWARD, k_softmax_backward, "cpu_softmax_backward"},
        {CT_OP_LOG_SOFTMAX_BACKWARD, k_softmax_backward, "cpu_log_softmax_backward"},
    };
    nn_register_floating(ks, sizeof ks / sizeof ks[0]);
}

#else /* NN_T: the row math, once per row type */

/* y = x a + b over n elements, through store_affine for float (non-temporal
 * stores when stream). */
static void NN_F(affine)(NN_T *restrict y, const NN_T *restrict x, NN_T a, NN_T b, int64_t n,
                         bool stream) {
#if NN_IS_FLOAT
    store_affine(y, x, a, b, n, stream);
#else
    (void)stream;
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * a + b;
#endif
}

/* Softmax over a contiguous row; y must not alias x. e: d elements of
 * scratch, so that y is written once, at the end (with stream, past the
 * caches). */
static void NN_F(softmax_row)(const NN_T *restrict x, NN_T *restrict y, int64_t d, bool lg,
                              NN_T *restrict e, bool stream, const NN_T *next) {
    NN_T m = NN_F(max)(x, d);
    int64_t i = 0;
    if (next) {
        /* the exps run from L1; meanwhile the next row comes from memory */
        enum { LINE = 64 / sizeof(NN_T) };
        for (; i + LINE <= d; i += LINE) {
            __builtin_prefetch(next + i, 0, 3);
            for (int j = 0; j < LINE; j++) e[i + j] = NN_EXP(x[i + j] - m);
        }
    }
    for (; i < d; i++) e[i] = NN_EXP(x[i] - m);
    NN_T s = NN_F(sum)(e, d);
    if (lg) {
        /* (x - m) - log(s), not x - (m + log(s)): m + log(s) rounds at m's
         * magnitude (a row max of 1000 would cost 6e-5 in float). */
        const NN_T ls = NN_LOG(s);
        for (int64_t k = 0; k < d; k++) y[k] = (x[k] - m) - ls;
    } else {
        NN_F(affine)(y, e, (NN_T)1 / s, (NN_T)0, d, stream);
    }
}

/* softmax: dx = y * (g - sum(g*y)); log_softmax: dx = g - exp(y) * sum(g) */
static void NN_F(softmax_bwd_row)(const NN_T *restrict g, const NN_T *restrict y,
                                  NN_T *restrict dx, int64_t d, bool lg) {
    if (lg) {
        NN_T s = NN_F(sum)(g, d);
        for (int64_t i = 0; i < d; i++) dx[i] = g[i] - NN_EXP(y[i]) * s;
    } else {
        NN_T s = NN_F(dot)(g, y, d);
        for (int64_t i = 0; i < d; i++) dx[i] = y[i] * (g[i] - s);
    }
}

/* Softmax over d elements spaced stride apart, for bw adjacent columns at once (the
 * columns are contiguous, so the inner loops vectorize). m, s: bw scratch. */
static void NN_F(softmax_cols)(const NN_T *restrict x, NN_T *restrict y, int64_t d,
                               int64_t stride, int64_t bw, bool lg, NN_T *restrict m,
                               NN_T *restrict s) {
    for (int64_t j = 0; j < bw; j++) {
        m[j] = -INFINITY;
        s[j] = 0;
    }
    for (int64_t k = 0; k < d; k++) {
        const NN_T *xr = x + k * stride;
        for (int64_t j = 0; j < bw; j++) m[j] = xr[j] > m[j] ? xr[j] : m[j];
    }
    for (int64_t k = 0; k < d; k++) {
        const NN_T *xr = x + k * stride;
        NN_T *yr = y + k * stride;
        for (int64_t j = 0; j < bw; j++) {
            NN_T e = NN_EXP(xr[j] - m[j]);
            s[j] += e;
            if (!lg) yr[j] = e;
        }
    }
    if (lg) {
        for (int64_t j = 0; j < bw; j++) s[j] = NN_LOG(s[j]);
        for (int64_t k = 0; k < d; k++)
            for (int64_t j = 0; j < bw; j++)
                y[k * stride + j] = (x[k * stride + j] - m[j]) - s[j];
    } else {
        for (int64_t j = 0; j < bw; j++) s[j] = (NN_T)1 / s[j];
        for (int64_t k = 0; k < d; k++)
            for (int64_t j = 0; j < bw; j++) y[k * stride + j] *= s[j];
    }
}

static void NN_F(softmax_bwd_cols)(const NN_T *restrict g, const NN_T *restrict y,
                                   NN_T *restrict dx, int64_t d, int64_t stride, int64_t bw,
                                   bool lg, NN_T *restrict s) {
    for (int64_t j = 0; j < bw; j++) s[j] = 0;
    for (int64_t k = 0; k < d; k++)
        for (int64_t j = 0; j < bw; j++)
            s[j] += lg ? g[k * stride + j] : g[k * stride + j] * y[k * stride + j];
    for (int64_t k = 0; k < d; k++)
        for (int64_t j = 0; j < bw; j++) {
            int64_t o = k * stride + j;
            dx[o] = lg ? g[o] - NN_EXP(y[o]) * s[j] : y[o] * (g[o] - s[j]);
        }
}

#endif
