/* CPU kernels of RMS_NORM, LAYER_NORM and their backward ops: rows of d
 * elements normalized on their own (cti_norm_params: rows, d, eps), w and b
 * optional (1 and 0 when absent), every tensor contiguous.
 *
 *   rms_norm:   inv = 1 / sqrt(mean(x^2) + eps);  y = x * inv * w
 *     backward: dx = inv * g * w - x * inv^3 * mean(g * w * x)
 *               dw = sum over rows of g * x * inv
 *   layer_norm: mean = mean(x);  rstd = 1 / sqrt(mean((x - mean)^2) + eps)
 *               xh = (x - mean) * rstd;  y = xh * w + b
 *     backward: gw = g * w;  dx = rstd * (gw - mean(gw) - xh * mean(gw * xh))
 *               dw = sum over rows of g * xh;  db = sum over rows of g
 *
 * The forward saves inv, or mean and rstd, per row (f32, f64 for f64) for
 * the backward. dw and db sum rows into per-chunk partials, at most one
 * chunk per thread, added in chunk order. A f32 rms_norm output of
 * NT_STREAM_BYTES or more is written with non-temporal stores. The typed
 * row functions are compiled per row type (this file includes itself
 * through nn_types.h). */
#ifndef NN_T
#if defined(__GNUC__) && !defined(__clang__) /* clang vectorizes them at -O2 and knows no such pragma */
#pragma GCC optimize("O3")
#endif

#include "nn_impl.h"

/* Outputs at least this large bypass the caches with non-temporal stores. */
#define NT_STREAM_BYTES ((uint64_t)16 << 20)

#if defined(__AVX__)
#include <immintrin.h>
/* y = x * s * w with non-temporal stores: a large output goes to memory without
 * first being read into the cache (no read-for-ownership), as memcpy does for
 * big copies. Returns false (nothing written) when y is not 32-byte aligned. */
static bool stream_scale_row(const float *restrict x, const float *restrict w, float s,
                             float *restrict y, int64_t d) {
    if (((uintptr_t)y & 31) != 0) return false;
    __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_stream_ps(y + i, v);
    }
    for (; i < d; i++) y[i] = x[i] * s * (w ? w[i] : 1.0f);
    return true;
}
#endif

typedef struct norm_ctx {
    ct_call *c;
    int64_t rows, d, nchunk;
    double eps;
    bool stream; /* output larger than the caches: non-temporal stores */
    char *dw_part, *db_part; /* [nchunk][d] partial sums (float or double) */
    atomic_bool oom;
} norm_ctx;

/* Pointer to element i of optional tensor t (NULL when t is NULL). */
static char *opt_at(const ct_tensor *t, int64_t i) {
    return t ? cti_data(t) + i * (int64_t)ct_dtype_size(t->dtype) : NULL;
}

/* Rows of any floating dtype to and from float or double rows (the fused add's row loops). */
static size_t esz(const ct_tensor *t) { return ct_dtype_size(t->dtype); }

/* Row r of t (NULL when t is NULL). */
static char *row_at(const ct_tensor *t, int64_t r, int64_t d) {
    return t ? cti_data(t) + r * d * (int64_t)esz(t) : NULL;
}

static void load_d(const void *src, ct_dtype dt, int64_t n, double *restrict dst) {
    if (dt == CT_F64) {
        memcpy(dst, src, sizeof(double) * (size_t)n);
    } else if (dt == CT_F32) {
        const float *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i];
    } else {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = dt == CT_F16 ? cti_f16_to_f32(s[i]) : cti_bf16_to_f32(s[i]);
    }
}

/* float64 to any floating dtype; a 16-bit one through float32, as ct_to_dtype converts. */
static void store_d(const double *restrict src, ct_dtype dt, int64_t n, void *dst) {
    if (dt == CT_F64) {
        memcpy(dst, src, sizeof(double) * (size_t)n);
    } else if (dt == CT_F32) {
        float *o = dst;
        for (int64_t i = 0; i < n; i++) o[i] = (float)src[i];
    } else {
        uint16_t *o = dst;
        for (int64_t i = 0; i < n; i++)
            o[i] = dt == CT_F16 ? cti_f32_to_f16((float)src[i]) : cti_f32_to_bf16((float)src[i]);
    }
}

/* float32 rows to any floating dtype (store_f32 and float64). */
static void store_any_f(const float *restrict src, ct_dtype dt, int64_t n, void *dst) {
    if (dt == CT_F64) {
        double *o = dst;
        for (int64_t i = 0; i < n; i++) o[i] = src[i];
    } else {
        store_f32(src, dt, n, 1, dst);
    }
}

/* A float32 view of row r of t: the row itself when t is float32, else its
 * values converted into buf (a float64 gradient of a y asked for in float64
 * is rounded to the float32 the sum is computed in). */
static const float *row_f(const ct_tensor *t, int64_t r, int64_t d, float *buf) {
    if (t->dtype == CT_F32) return (const float *)row_at(t, r, d);
    if (t->dtype == CT_F64) {
        const double *s = (const double *)row_at(t, r, d);
        for (int64_t i = 0; i < d; i++) buf[i] = (float)s[i];
    } else {
        load_f32(row_at(t, r, d), t->dtype, d, 1, buf);
    }
    return buf;
}

#define NN_TYPED "norm.c"
#include "nn_types.h"

/* rms_norm forward: in x, weight|NULL; out y, inv_rms|NULL. */
static void rms_fwd_task(int64_t r0, int64_t r1, void *p) {
    norm_ctx *k = p;
    ct_call *c = k->c;
    ct_tensor *x = c->in[0], *w = c->in[1], *y = c->out[0], *inv = c->out[1];
    int64_t d = k->d;
    if (x->dtype == CT_F64) {
        const double *X = (const double *)cti_data(x), *W = (const double *)opt_at(w, 0);
        double *Y = (double *)cti_data(y), *I = (double *)opt_at(inv, 0);
        for (int64_t r = r0; r < r1; r++) {
            double v = rms_fwd_row_d(X + r * d, W, Y + r * d, d, k->eps);
            if (I) I[r] = v;
        }
    } else if (x->dtype == CT_F32) {
        const float *X = (const float *)cti_data(x), *W = (const float *)opt_at(w, 0);
        float *Y = (float *)cti_data(y), *I = (float *)opt_at(inv, 0);
#if defined(__AVX__)
        if (k->stream) {
            for (int64_t r = r0; r < r1; r++) {
                const float *xr = X + r * d;
                /* the same inverse RMS as rms_fwd_row_f computes */
                float v = 1.0f / sqrtf(dot_f(xr, xr, d) / (float)d + (float)k->eps);
                if (!stream_scale_row(xr, W, v, Y + r * d, d))
                    rms_fwd_row_f(xr, W, Y + r * d, d, (float)k->eps);
                if (I) I[r] = v;
            }
            _mm_sfence();
            return;
        }
#endif
        for (int64_t r = r0; r < r1; r++) {
            float v = rms_fwd_row_f(X + r * d, W, Y + r * d, d, (float)k->eps);
            if (I) I[r] = v;
        }
    } else {
        float *buf = scratch(sizeof(float) * (size_t)(3 * d));
        if (!buf) {
            atomic_store(&k->oom, true);
            return;
        }
        float *xr = buf, *yr = buf + d, *wr = w ? buf + 2 * d : NULL;
        if (w) load_f32(cti_data(w), w->dtype, d, 1, wr);
        size_t es = ct_dtype_size(x->dtype);
        float *I = (float *)opt_at(inv, 0);
        for (int64_t r = r0; r < r1; r++) {
            load_f32(cti_data(x) + r * d * es, x->dtype, d, 1, xr);
            float v = rms_fwd_row_f(xr, wr, yr, d, (float)k->eps);
            store_f32(yr, x->dtype, d, 1, cti_data(y) + r * d * es);
            if (I) I[r] = v;
        }
        free(buf);
    }
}

static ct_status run_rows(norm_ctx *k, cti_range_fn fn, const char *name) {
    atomic_init(&k->oom, false);
    cti_parallel_for(k->rows, row_grain(k->d), fn, k);
    if (atomic_load(&k->oom)) return cti_error(CT_ERR_OOM, "%s: out of memory for row scratch", name);
    return CT_OK;
}

static ct_status k_rms_norm(ct_call *c) {
    const cti_norm_params *p = CTI_PARAMS(c, cti_norm_params);
    norm_ctx k = {.c = c, .rows = p->rows, .d = p->d, .eps = p->eps};
    k.stream = c->in[0]->dtype == CT_F32 && (uint64_t)(k.rows * k.d) * sizeof(float) >= NT_STREAM_BYTES;
    return run_rows(&k, rms_fwd_task, "ct_rms_norm");
}

/* Sums the per-chunk partials [nchunk][d] in chunk order into out (dtype dt). */
static void reduce_parts(const char *part, int64_t nchunk, int64_t d, ct_dtype dt, ct_tensor *out) {
    if (dt == CT_F64) {
        const double *P = (const double *)part;
        double *O = (double *)cti_data(out);
        for (int64_t i = 0; i < d; i++) O[i] = P[i];
        for (int64_t ch = 1; ch < nchunk; ch++)
            for (int64_t i = 0; i < d; i++) O[i] += P[ch * d + i];
    } else {
        float *P = (float *)part; /* chunk 0 accumulates the others */
        for (int64_t ch = 1; ch < nchunk; ch++)
            for (int64_t i = 0; i < d; i++) P[i] += P[ch * d + i];
        store_f32(P, dt, d, 1, cti_data(out));
    }
}

/* rms_norm backward: in grad_y, x, weight|NULL, inv_rms; out dx|NULL, dweight|NULL.
 * Iterates over chunk indices so each chunk owns one row of dw partials. */
static void rms_bwd_task(int64_t c0, int64_t c1, void *p) {
    norm_ctx *k = p;
    ct_call *c = k->c;
    ct_tensor *g = c->in[0], *x = c->in[1], *w = c->in[2], *inv = c->in[3];
    ct_tensor *dx = c->out[0], *dw = c->out[1];
    int64_t d = k->d;
    for (int64_t ch = c0; ch < c1; ch++) {
        int64_t r0 = chunk_begin(k->rows, k->nchunk, ch), r1 = chunk_begin(k->rows, k->nchunk, ch + 1);
        if (x->dtype == CT_F64) {
            const double *G = (const double *)cti_data(g), *X = (const double *)cti_data(x);
            const double *W = (const double *)opt_at(w, 0), *I = (const double *)cti_data(inv);
            double *DX = (double *)opt_at(dx, 0);
            double *DW = dw ? (double *)k->dw_part + ch * d : NULL;
            if (DW) memset(DW, 0, sizeof(double) * (size_t)d);
            for (int64_t r = r0; r < r1; r++)
                rms_bwd_row_d(G + r * d, X + r * d, W, I[r], DX ? DX + r * d : NULL, DW, d);
        } else if (x->dtype == CT_F32) {
            const float *G = (const float *)cti_data(g), *X = (const float *)cti_data(x);
            const float *W = (const float *)opt_at(w, 0), *I = (const float *)cti_data(inv);
            float *DX = (float *)opt_at(dx, 0);
            float *DW = dw ? (float *)k->dw_part + ch * d : NULL;
            if (DW) memset(DW, 0, sizeof(float) * (size_t)d);
            for (int64_t r = r0; r < r1; r++)
                rms_bwd_row_f(G + r * d, X + r * d, W, I[r], DX ? DX + r * d : NULL, DW, d);
        } else {
            float *buf = scratch(sizeof(float) * (size_t)(4 * d));
            if (!buf) {
                atomic_store(&k->oom, true);
                return;
            }
            float *gr = buf, *xr = buf + d, *dxr = buf + 2 * d, *wr = w ? buf + 3 * d : NULL;
            if (w) load_f32(cti_data(w), w->dtype, d, 1, wr);
            const float *I = (const float *)cti_data(inv);
            float *DW = dw ? (float *)k->dw_part + ch * d : NULL;
            if (DW) memset(DW, 0, sizeof(float) * (size_t)d);
            size_t es = ct_dtype_size(x->dtype);
            for (int64_t r = r0; r < r1; r++) {
                load_f32(cti_data(g) + r * d * es, g->dtype, d, 1, gr);
                load_f32(cti_data(x) + r * d * es, x->dtype, d, 1, xr);
                rms_bwd_row_f(gr, xr, wr, I[r], dx ? dxr : NULL, DW, d);
                if (dx) store_f32(dxr, dx->dtype, d, 1, cti_data(dx) + r * d * es);
            }
            free(buf);
        }
    }
}

/* Runs a backward task over chunks with dw/db partial buffers (of the accumulator of
 * dtype dt), then reduces them. */
static ct_status run_chunks_with_parts(norm_ctx *k, cti_range_fn fn, ct_tensor *dw, ct_tensor *db,
                                       const char *name, ct_dtype dt) {
    size_t acc = dt == CT_F64 ? sizeof(double) : sizeof(float);
    k->nchunk = num_chunks(k->rows, row_grain(k->d));
    k->dw_part = dw ? scratch(acc * (size_t)(k->nchunk * k->d)) : NULL;
    k->db_part = db ? scratch(acc * (size_t)(k->nchunk * k->d)) : NULL;
    if ((dw && !k->dw_part) || (db && !k->db_part)) {
        free(k->dw_part);
        free(k->db_part);
        return cti_error(CT_ERR_OOM, "%s: out of memory for partial sums", name);
    }
    atomic_init(&k->oom, false);
    if (k->rows > 0) {
        cti_parallel_for(k->nchunk, 1, fn, k);
    } else {
        /* No rows: the weight gradient is zeros. */
        k->nchunk = 1;
        if (k->dw_part) memset(k->dw_part, 0, acc * (size_t)k->d);
        if (k->db_part) memset(k->db_part, 0, acc * (size_t)k->d);
    }
    if (!atomic_load(&k->oom)) {
        if (dw) reduce_parts(k->dw_part, k->nchunk, k->d, dw->dtype, dw);
        if (db) reduce_parts(k->db_part, k->nchunk, k->d, db->dtype, db);
    }
    free(k->dw_part);
    free(k->db_part);
    if (atomic_load(&k->oom)) return cti_error(CT_ERR_OOM, "%s: out of memory for row scratch", name);
    return CT_OK;
}

static ct_status k_rms_norm_backward(ct_call *c) {
    const cti_norm_params *p = CTI_PARAMS(c, cti_norm_params);
    norm_ctx k = {.c = c, .rows = p->rows, .d = p->d};
    return run_chunks_with_parts(&k, rms_bwd_task, c->out[1], NULL, "ct_rms_norm_backward",
                                 c->in[1]->dtype);
}

/* layer_norm forward: in x, weight|NULL, bias|NULL; out y, mean, rstd. */
static void ln_fwd_task(int64_t r0, int64_t r1, void *p) {
    norm_ctx *k = p;
    ct_call *c = k->c;
    ct_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
    ct_tensor *y = c->out[0], *mo = c->out[1], *ro = c->out[2];
    int64_t d = k->d;
    if (x->dtype == CT_F64) {
        const double *X = (const double *)cti_data(x), *W = (const double *)opt_at(w, 0),
                     *B = (const double *)opt_at(b, 0);
        double *Y = (double *)cti_data(y), *M = (double *)cti_data(mo), *R = (double *)cti_data(ro);
        for (int64_t r = r0; r < r1; r++)
            ln_fwd_row_d(X + r * d, W, B, Y + r * d, d, k->eps, M + r, R + r);
    } else if (x->dtype == CT_F32) {
        const float *X = (const float *)cti_data(x), *W = (const float *)opt_at(w, 0),
                    *B = (const float *)opt_at(b, 0);
        float *Y = (float *)cti_data(y), *M = (float *)cti_data(mo), *R = (float *)cti_data(ro);
        for (int64_t r = r0; r < r1; r++)
            ln_fwd_row_f(X + r * d, W, B, Y + r * d, d, (float)k->eps, M + r, R + r);
    } else {
        float *buf = scratch(sizeof(float) * (size_t)(4 * d));
        if (!buf) {
            atomic_store(&k->oom, true);
            return;
        }
        float *xr = buf, *yr = buf + d, *wr = w ? buf + 2 * d : NULL, *br = b ? buf + 3 * d : NULL;
        if (w) load_f32(cti_data(w), w->dtype, d, 1, wr);
        if (b) load_f32(cti_data(b), b->dtype, d, 1, br);
        float *M = (float *)cti_data(mo), *R = (float *)cti_data(ro);
        size_t es = ct_dtype_size(x->dtype);
        for (int64_t r = r0; r < r1; r++) {
            load_f32(cti_data(x) + r * d * es, x->dtype, d, 1, xr);
            ln_fwd_row_f(xr, wr, br, yr, d, (float)k->eps, M + r, R + r);
            store_f32(yr, x->dtype, d, 1, cti_data(y) + r * d * es);
        }
        free(buf);
    }
}

static ct_status k_layer_norm(ct_call *c) {
    const cti_norm_params *p = CTI_PARAMS(c, cti_norm_params);
    norm_ctx k = {.c = c, .rows = p->rows, .d = p->d, .eps = p->eps};
    return run_rows(&k, ln_fwd_task, "ct_layer_norm");
}

/* layer_norm backward: in grad_y, x, weight|NULL, mean, rstd; out dx|NULL, dw|NULL, db|NULL. */
static void ln_bwd_task(int64_t c0, int64_t c1, void *p) {
    norm_ctx *k = p;
    ct_call *c = k->c;
    ct_tensor *g = c->in[0], *x = c->in[1], *w = c->in[2], *mt = c->in[3], *rt = c->in[4];
    ct_tensor *dx = c->out[0], *dw = c->out[1], *db = c->out[2];
    int64_t d = k->d;
    bool dbl = x->dtype == CT_F64;
    void *tmp = scratch((dbl ? sizeof(double) : sizeof(float)) * (size_t)(6 * d));
    if (!tmp) {
        atomic_store(&k->oom, true);
        return;
    }
    for (int64_t ch = c0; ch < c1; ch++) {
        int64_t r0 = chunk_begin(k->rows, k->nchunk, ch), r1 = chunk_begin(k->rows, k->nchunk, ch + 1);
        if (dbl) {
            const double *G = (const double *)cti_data(g), *X = (const double *)cti_data(x);
            const double *W = (const double *)opt_at(w, 0);
            const double *M = (const double *)cti_data(mt), *R = (const double *)cti_data(rt);
            double *DX = (double *)opt_at(dx, 0);
            double *DW = dw ? (double *)k->dw_part + ch * d : NULL;
            double *DB = db ? (double *)k->db_part + ch * d : NULL;
            if (DW) memset(DW, 0, sizeof(double) * (size_t)d);
            if (DB) memset(DB, 0, sizeof(double) * (size_t)d);
            for (int64_t r = r0; r < r1; r++)
                ln_bwd_row_d(G + r * d, X + r * d, W, M[r], R[r], DX ? DX + r * d : NULL, DW, DB,
                             tmp, d);
        } else {
            float *t = tmp, *gr = t + d, *xr = t + 2 * d, *dxr = t + 3 * d;
            float *wr = w ? t + 4 * d : NULL;
            bool h = is_half(x->dtype);
            if (w) load_f32(cti_data(w), w->dtype, d, 1, wr);
            const float *M = (const float *)cti_data(mt), *R = (const float *)cti_data(rt);
            float *DW = dw ? (float *)k->dw_part + ch * d : NULL;
            float *DB = db ? (float *)k->db_part + ch * d : NULL;
            if (DW) memset(DW, 0, sizeof(float) * (size_t)d);
            if (DB) memset(DB, 0, sizeof(float) * (size_t)d);
            size_t es = ct_dtype_size(x->dtype);
            for (int64_t r = r0; r < r1; r++) {
                const float *G = (const float *)(cti_data(g) + r * d * es);
                const float *X = (const float *)(cti_data(x) + r * d * es);
                float *DX = dx ? (float *)(cti_data(dx) + r * d * es) : NULL;
                if (h) {
                    load_f32(G, g->dtype, d, 1, gr);
                    load_f32(X, x->dtype, d, 1, xr);
                    G = gr;
                    X = xr;
                    if (DX) DX = dxr;
                }
                ln_bwd_row_f(G, X, wr, M[r], R[r], DX, DW, DB, t, d);
                if (h && dx) store_f32(dxr, dx->dtype, d, 1, cti_data(dx) + r * d * es);
            }
        }
    }
    free(tmp);
}

static ct_status k_layer_norm_backward(ct_call *c) {
    const cti_norm_params *p = CTI_PARAMS(c, cti_norm_params);
    norm_ctx k = {.c = c, .rows = p->rows, .d = p->d};
    return run_chunks_with_parts(&k, ln_bwd_task, c->out[1], c->out[2], "ct_layer_norm_backward",
                                 c->in[1]->dtype);
}

/* ---- residual add fused with the norm ---------------------------------------------------
 * add_rms_norm / add_layer_norm (schema.h): per row, sum = x + residual in float (double
 * for a float64 sum), rounded to the sum's dtype and stored; y is the norm of the stored
 * row, by the row functions. The backward forms the norm's dx into a float row, adds
 * grad_sum and writes it as dx and dresidual, each in its own dtype. The row loops are
 * add_norm_fwd and add_norm_bwd of the typed part, in float and in double. */

/* The record's op says which norm; the sum's dtype which row type. */
static void add_norm_fwd_task(int64_t r0, int64_t r1, void *p) {
    norm_ctx *k = p;
    bool layer = k->c->op == CT_OP_ADD_LAYER_NORM;
    if (k->c->out[1]->dtype == CT_F64) add_norm_fwd_d(k, layer, r0, r1);
    else add_norm_fwd_f(k, layer, r0, r1);
}

static ct_status k_add_norm(ct_call *c) {
    const cti_norm_params *p = CTI_PARAMS(c, cti_norm_params);
    norm_ctx k = {.c = c, .rows = p->rows, .d = p->d, .eps = p->eps};
    return run_rows(&k, add_norm_fwd_task,
                    c->op == CT_OP_ADD_LAYER_NORM ? "ct_add_layer_norm" : "ct_add_rms_norm");
}

static void add_norm_bwd_task(int64_t c0, int64_t c1, void *p) {
    norm_ctx *k = p;
    bool layer = k->c->op == CT_OP_ADD_LAYER_NORM_BACKWARD;
    if (k->c->in[2]->dtype == CT_F64) add_norm_bwd_d(k, layer, c0, c1);
    else add_norm_bwd_f(k, layer, c0, c1);
}

static ct_status k_add_norm_backward(ct_call *c) {
    const cti_norm_params *p = CTI_PARAMS(c, cti_norm_params);
    norm_ctx k = {.c = c, .rows = p->rows, .d = p->d};
    bool layer = c->op == CT_OP_ADD_LAYER_NORM_BACKWARD;
    return run_chunks_with_parts(&k, add_norm_bwd_task, c->out[2], layer ? c->out[3] : NULL,
                                 layer ? "ct_add_layer_norm_backward" : "ct_add_rms_norm_backward",
                                 c->in[2]->dtype);
}

void cti_cpu_register_norm(void) {
    static const nn_kernel ks[] = {
        {CT_OP_RMS_NORM, k_rms_norm, "cpu_rms_norm"},
        {CT_OP_RMS_NORM_BACKWARD, k_rms_norm_backward, "cpu_rms_norm_backward"},
        {CT_OP_LAYER_NORM, k_layer_norm, "cpu_layer_norm"},
        {CT_OP_LAYER_NORM_BACKWARD, k_layer_norm_backward, "cpu_layer_norm_backward"},
        {CT_OP_ADD_RMS_NORM, k_add_norm, "cpu_add_rms_norm"},
        {CT_OP_ADD_RMS_NORM_BACKWARD, k_add_norm_backward, "cpu_add_rms_norm_backward"},
        {CT_OP_ADD_LAYER_NORM, k_add_norm, "cpu_add_layer_norm"},
        {CT_OP_ADD_LAYER_NORM_BACKWARD, k_add_norm_backward, "cpu_add_layer_norm_backward"},
    };
    nn_register_floating(ks, sizeof ks / sizeof ks[0]);
}

#else /* NN_T: the row math, once per row type */

/* sum of a*b*c */
static NN_T NN_F(dot3)(const NN_T *restrict a, const NN_T *restrict b, const NN_T *restrict c,
                       int64_t n) {
    NN_T acc[NACC] = {0};
    int64_t i = 0;
    for (; i + NACC <= n; i += NACC)
        for (int j = 0; j < NACC; j++) acc[j] += a[i + j] * b[i + j] * c[i + j];
    for (int j = 0; j < n - i; j++) acc[j] += a[i + j] * b[i + j] * c[i + j];
    return NN_F(fold)(acc);
}

/* sum of (x - m)^2 */
static NN_T NN_F(sqdev)(const NN_T *restrict x, NN_T m, int64_t n) {
    NN_T acc[NACC] = {0};
    int64_t i = 0;
    for (; i + NACC <= n; i += NACC)
        for (int j = 0; j < NACC; j++) {
            NN_T d = x[i + j] - m;
            acc[j] += d * d;
        }
    for (int j = 0; j < n - i; j++) acc[j] += (x[i + j] - m) * (x[i + j] - m);
    return NN_F(fold)(acc);
}

/* y = x * inv_rms * w; returns inv_rms. Reads x twice while the row is in cache. */
static NN_T NN_F(rms_fwd_row)(const NN_T *restrict x, const NN_T *restrict w, NN_T *restrict y,
                              int64_t d, NN_T eps) {
    NN_T inv = (NN_T)1 / NN_SQRT(NN_F(dot)(x, x, d) / (NN_T)d + eps);
    if (w)
        for (int64_t i = 0; i < d; i++) y[i] = x[i] * inv * w[i];
    else
        for (int64_t i = 0; i < d; i++) y[i] = x[i] * inv;
    return inv;
}

/* dx = inv * (g*w - x * inv^2 * mean(g*w*x)); dw += g * x * inv */
static void NN_F(rms_bwd_row)(const NN_T *restrict g, const NN_T *restrict x,
                              const NN_T *restrict w, NN_T inv, NN_T *restrict dx,
                              NN_T *restrict dw, int64_t d) {
    if (dx) {
        NN_T c = (w ? NN_F(dot3)(g, w, x, d) : NN_F(dot)(g, x, d)) / (NN_T)d;
        NN_T k = inv * inv * inv * c;
        if (w)
            for (int64_t i = 0; i < d; i++) dx[i] = inv * (g[i] * w[i]) - x[i] * k;
        else
            for (int64_t i = 0; i < d; i++) dx[i] = inv * g[i] - x[i] * k;
    }
    if (dw)
        for (int64_t i = 0; i < d; i++) dw[i] += g[i] * x[i] * inv;
}

static void NN_F(ln_fwd_row)(const NN_T *restrict x, const NN_T *restrict w,
                             const NN_T *restrict b, NN_T *restrict y, int64_t d, NN_T eps,
                             NN_T *mean_out, NN_T *rstd_out) {
    NN_T mean = NN_F(sum)(x, d) / (NN_T)d;
    NN_T rstd = (NN_T)1 / NN_SQRT(NN_F(sqdev)(x, mean, d) / (NN_T)d + eps);
    if (w && b)
        for (int64_t i = 0; i < d; i++) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
    else if (w)
        for (int64_t i = 0; i < d; i++) y[i] = (x[i] - mean) * rstd * w[i];
    else if (b)
        for (int64_t i = 0; i < d; i++) y[i] = (x[i] - mean) * rstd + b[i];
    else
        for (int64_t i = 0; i < d; i++) y[i] = (x[i] - mean) * rstd;
    *mean_out = mean;
    *rstd_out = rstd;
}

/* xh = (x - mean) * rstd, gw = g * w:
 * dx = rstd * (gw - mean(gw) - xh * mean(gw * xh)); dw += g * xh; db += g.
 * tmp holds d elements (gw). */
static void NN_F(ln_bwd_row)(const NN_T *restrict g, const NN_T *restrict x,
                             const NN_T *restrict w, NN_T mean, NN_T rstd, NN_T *restrict dx,
                             NN_T *restrict dw, NN_T *restrict db, NN_T *restrict tmp, int64_t d) {
    if (dx) {
        const NN_T *gw = g;
        if (w) {
            for (int64_t i = 0; i < d; i++) tmp[i] = g[i] * w[i];
            gw = tmp;
        }
        NN_T sg = NN_F(sum)(gw, d), sgx = NN_F(dot)(gw, x, d);
        /* sum(gw * xh) = rstd * (sum(gw * x) - mean * sum(gw)) */
        NN_T a = sg / (NN_T)d, bb = rstd * (sgx - mean * sg) / (NN_T)d;
        for (int64_t i = 0; i < d; i++)
            dx[i] = rstd * (gw[i] - a - (x[i] - mean) * rstd * bb);
    }
    if (dw)
        for (int64_t i = 0; i < d; i++) dw[i] += g[i] * ((x[i] - mean) * rstd);
    if (db)
        for (int64_t i = 0; i < d; i++) db[i] += g[i];
}


/* ---- the fused residual add, once per row type ---------------------------------------------
 * Rows of a tensor of any floating dtype as NN_T rows: the tensor's own row when it has the
 * row type, else converted into buf; and NN_T rows stored in any floating dtype. */
#if NN_IS_FLOAT
static const float *NN_F(row_as)(const ct_tensor *t, int64_t r, int64_t d, float *buf) {
    return row_f(t, r, d, buf);
}
static void NN_F(store_as)(const float *src, ct_dtype dt, int64_t n, void *dst) {
    store_any_f(src, dt, n, dst);
}
#else
static const double *NN_F(row_as)(const ct_tensor *t, int64_t r, int64_t d, double *buf) {
    if (t->dtype == CT_F64) return (const double *)row_at(t, r, d);
    load_d(row_at(t, r, d), t->dtype, d, buf);
    return buf;
}
static void NN_F(store_as)(const double *src, ct_dtype dt, int64_t n, void *dst) {
    store_d(src, dt, n, dst);
}
#endif

/* add_rms_norm / add_layer_norm forward over rows [r0, r1): in x, residual, weight|NULL
 * (, bias|NULL); out y, sum, inv_rms or mean and rstd. */
static void NN_F(add_norm_fwd)(norm_ctx *k, bool layer, int64_t r0, int64_t r1) {
    ct_call *c = k->c;
    ct_tensor *x = c->in[0], *res = c->in[1], *w = c->in[2], *b = layer ? c->in[3] : NULL;
    ct_tensor *y = c->out[0], *s = c->out[1];
    const ct_dtype own = NN_IS_FLOAT ? CT_F32 : CT_F64;
    int64_t d = k->d;
    NN_T *buf = scratch(sizeof(NN_T) * (size_t)(6 * d));
    if (!buf) {
        atomic_store(&k->oom, true);
        return;
    }
    NN_T *xt = buf, *rt = buf + d, *st = buf + 2 * d, *yt = buf + 3 * d;
    const NN_T *W = w ? NN_F(row_as)(w, 0, d, buf + 4 * d) : NULL;
    const NN_T *B = b ? NN_F(row_as)(b, 0, d, buf + 5 * d) : NULL;
    NN_T *S0 = (NN_T *)cti_data(c->out[2]), *S1 = layer ? (NN_T *)cti_data(c->out[3]) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        const NN_T *xr = NN_F(row_as)(x, r, d, xt), *rr = NN_F(row_as)(res, r, d, rt);
        NN_T *sr = s->dtype == own ? (NN_T *)row_at(s, r, d) : st;
        for (int64_t i = 0; i < d; i++) sr[i] = xr[i] + rr[i];
        if (s->dtype != own) { /* the norm reads the sum as stored */
            NN_F(store_as)(st, s->dtype, d, row_at(s, r, d));
            NN_F(row_as)(s, r, d, st);
        }
        NN_T *yr = y->dtype == own ? (NN_T *)row_at(y, r, d) : yt;
        if (layer) NN_F(ln_fwd_row)(sr, W, B, yr, d, (NN_T)k->eps, S0 + r, S1 + r);
        else S0[r] = NN_F(rms_fwd_row)(sr, W, yr, d, (NN_T)k->eps);
        if (y->dtype != own) NN_F(store_as)(yt, y->dtype, d, row_at(y, r, d));
    }
    free(buf);
}

/* Their backward over chunks [c0, c1): in grad_y, grad_sum|NULL, sum, weight|NULL, then
 * inv_rms or mean and rstd; out dx|NULL, dresidual|NULL, dw|NULL(, db|NULL): the norm's
 * dx into a row of NN_T, grad_sum added, stored as dx and as dresidual. */
static void NN_F(add_norm_bwd)(norm_ctx *k, bool layer, int64_t c0, int64_t c1) {
    ct_call *c = k->c;
    ct_tensor *g = c->in[0], *gs = c->in[1], *s = c->in[2], *w = c->in[3];
    ct_tensor *dx = c->out[0], *dr = c->out[1], *dw = c->out[2], *db = layer ? c->out[3] : NULL;
    const ct_dtype own = NN_IS_FLOAT ? CT_F32 : CT_F64;
    int64_t d = k->d;
    NN_T *buf = scratch(sizeof(NN_T) * (size_t)(6 * d));
    if (!buf) {
        atomic_store(&k->oom, true);
        return;
    }
    NN_T *gt = buf, *st = buf + d, *dxr = buf + 2 * d, *tmp = buf + 3 * d, *gst = buf + 4 * d;
    const NN_T *W = w ? NN_F(row_as)(w, 0, d, buf + 5 * d) : NULL;
    const NN_T *S0 = (const NN_T *)cti_data(c->in[4]);
    const NN_T *S1 = layer ? (const NN_T *)cti_data(c->in[5]) : NULL;
    bool want_dx = dx || dr;
    for (int64_t ch = c0; ch < c1; ch++) {
        int64_t r0 = chunk_begin(k->rows, k->nchunk, ch), r1 = chunk_begin(k->rows, k->nchunk, ch + 1);
        NN_T *DW = dw ? (NN_T *)k->dw_part + ch * d : NULL;
        NN_T *DB = db ? (NN_T *)k->db_part + ch * d : NULL;
        if (DW) memset(DW, 0, sizeof(NN_T) * (size_t)d);
        if (DB) memset(DB, 0, sizeof(NN_T) * (size_t)d);
        for (int64_t r = r0; r < r1; r++) {
            const NN_T *gr = NN_F(row_as)(g, r, d, gt), *sr = NN_F(row_as)(s, r, d, st);
            /* dx straight into an output of the row type, which dresidual copies */
            NN_T *own_dx = dx && dx->dtype == own ? (NN_T *)row_at(dx, r, d) : NULL;
            NN_T *o = !want_dx ? NULL : own_dx ? own_dx : dxr;
            if (layer) NN_F(ln_bwd_row)(gr, sr, W, S0[r], S1[r], o, DW, DB, tmp, d);
            else NN_F(rms_bwd_row)(gr, sr, W, S0[r], o, DW, d);
            if (!o) continue;
            if (gs) {
                const NN_T *gsr = NN_F(row_as)(gs, r, d, gst);
                for (int64_t i = 0; i < d; i++) o[i] += gsr[i];
            }
            if (dx && !own_dx) NN_F(store_as)(o, dx->dtype, d, row_at(dx, r, d));
            if (dr) NN_F(store_as)(o, dr->dtype, d, row_at(dr, r, d));
        }
    }
    free(buf);
}

#endif
