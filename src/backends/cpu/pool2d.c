/* CPU 2-d pooling: max (with argmax indices), average and adaptive average,
 * forward and backward, with PyTorch's window rules. Per plane, output
 * (oh, ow) has the window rows oh * sh - ph + i * dh (i < kh), columns
 * likewise:
 *   max:      y = the window's largest x (NaN wins), idx = its h * W + w
 *   avg:      y = sum of the window's x inside the input / div, div the
 *             window's size clipped to the padded input (count_include_pad)
 *             or to the input
 *   adaptive: rows [floor(oh * H / OH), ceil((oh + 1) * H / OH)), columns
 *             likewise, y = their mean (adaptive max: their largest, with
 *             its index as max's)
 *   backward: dx[idx] += dy (max); dy / div (or / the window's size) added
 *             to each x of the window (avg, adaptive)
 * Work is split over the N*C planes; each task reads a plane into a float64
 * scratch row (exact for every input dtype), pools it and writes its output
 * plane. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

void cti_cpu_register_pool2d(void);

/* The call's cti_pool_params under the short names the loops use. */
typedef struct pgeo {
    int64_t N, C, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw; /* kernel, stride, padding, dilation */
    bool count_include_pad;
} pgeo;

static pgeo pgeo_from_call(const ct_call *c) {
    const cti_pool_params *p = CTI_PARAMS(c, cti_pool_params);
    return (pgeo){.N = p->N, .C = p->C, .H = p->H, .W = p->W, .OH = p->OH, .OW = p->OW,
                  .kh = p->kernel[0], .kw = p->kernel[1], .sh = p->stride[0],
                  .sw = p->stride[1], .ph = p->padding[0], .pw = p->padding[1],
                  .dh = p->dilation[0], .dw = p->dilation[1],
                  .count_include_pad = p->count_include_pad};
}

/* A 3-d (CHW) or 4-d tensor's geometry as 4-d. */
static void as4(const ct_tensor *t, int64_t shape[4], int64_t st[4]) {
    int off = 4 - t->ndim;
    shape[0] = 1;
    st[0] = 0;
    for (int d = 0; d < t->ndim; d++) {
        shape[d + off] = t->shape[d];
        st[d + off] = t->stride[d];
    }
}

/* Reads plane p (= n*C + c) of t into dst as doubles, row-major. */
static void read_plane(const ct_tensor *t, int64_t p, double *restrict dst) {
    int64_t shape[4], st[4];
    as4(t, shape, st);
    int64_t n = p / shape[1], c = p % shape[1], H = shape[2], W = shape[3];
    int64_t es = (int64_t)ct_dtype_size(t->dtype), s = st[3];
    const char *plane = cti_data(t) + (n * st[0] + c * st[1]) * es;
    for (int64_t h = 0; h < H; h++, dst += W) {
        const char *row = plane + h * st[2] * es;
        switch (t->dtype) {
        case CT_F64:
            for (int64_t w = 0; w < W; w++) dst[w] = ((const double *)row)[w * s];
            break;
        case CT_F32:
            for (int64_t w = 0; w < W; w++) dst[w] = ((const float *)row)[w * s];
            break;
        case CT_F16:
            for (int64_t w = 0; w < W; w++) dst[w] = cti_f16_to_f32(((const uint16_t *)row)[w * s]);
            break;
        default:
            for (int64_t w = 0; w < W; w++)
                dst[w] = cti_bf16_to_f32(((const uint16_t *)row)[w * s]);
            break;
        }
    }
}

/* Writes n doubles into plane p of the contiguous tensor t. */
static void write_plane(ct_tensor *t, int64_t p, const double *restrict src, int64_t n) {
    char *base = cti_data(t) + p * n * (int64_t)ct_dtype_size(t->dtype);
    switch (t->dtype) {
    case CT_F64: memcpy(base, src, (size_t)n * sizeof(double)); break;
    case CT_F32:
        for (int64_t i = 0; i < n; i++) ((float *)base)[i] = (float)src[i];
        break;
    case CT_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)base)[i] = cti_f32_to_f16((float)src[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)base)[i] = cti_f32_to_bf16((float)src[i]);
        break;
    }
}

struct pool_ctx;
typedef void (*plane_fn_t)(const struct pool_ctx *k, int64_t p, const double *src, double *dst);

typedef struct pool_ctx {
    pgeo g;
    const ct_tensor *in;  /* the plane-wise source: x or grad_out */
    const ct_tensor *idx; /* max pool backward: indices */
    ct_tensor *out, *out_idx;
    plane_fn_t plane_fn;
    int64_t in_plane, out_plane; /* elements of a source and a destination plane */
    atomic_int failed;           /* a task could not allocate, or saw a bad index */
} pool_ctx;

/* Reads each plane, applies plane_fn, writes the result plane. */
static void pool_task(int64_t begin, int64_t end, void *vctx) {
    pool_ctx *k = vctx;
    double *src = malloc((size_t)(k->in_plane + k->out_plane) * sizeof(double));
    if (!src) {
        atomic_store(&k->failed, 1);
        return;
    }
    double *dst = src + k->in_plane;
    for (int64_t p = begin; p < end; p++) {
        read_plane(k->in, p, src);
        k->plane_fn(k, p, src, dst);
        write_plane(k->out, p, dst, k->out_plane);
    }
    free(src);
}

/* Planes per task for planes of per elements read and written. */
static int64_t plane_grain(int64_t per, int64_t planes) {
    return per > 0 ? 1 + 16384 / per : planes;
}

static ct_status bad_indices(const char *op, const pgeo *g) {
    return cti_error(CT_ERR_INDEX, "%s: indices hold a value outside [0, %lld)", op,
                     (long long)(g->H * g->W));
}

/* An empty result needs no work, and the geometry of an empty tensor may
 * multiply past int64 (a zero next to huge sizes), so no product of it is
 * formed. A non-empty result bounds N * C and its own plane, and its input
 * is a real tensor whose sizes multiply within int64. */
static bool nothing_to_write(const ct_call *c) {
    return cti_numel(c->out[0]->ndim, c->out[0]->shape) == 0;
}

/* The general path of every pooling kernel: plane_fn maps an input plane
 * (H x W) to an output plane (OH x OW), or the reverse for the backward
 * kinds; idx are max backward's indices, out_idx max forward's. */
static ct_status pool_planes(ct_call *c, plane_fn_t plane_fn, bool backward,
                             const ct_tensor *idx, ct_tensor *out_idx, const char *routine,
                             const char *op) {
    if (nothing_to_write(c)) return CT_OK;
    pool_ctx k = {.g = pgeo_from_call(c), .in = c->in[0], .idx = idx, .out = c->out[0],
                  .out_idx = out_idx, .plane_fn = plane_fn};
    int64_t in_plane = k.g.H * k.g.W, out_plane = k.g.OH * k.g.OW;
    k.in_plane = backward ? out_plane : in_plane;
    k.out_plane = backward ? in_plane : out_plane;
    c->routine = routine;
    int64_t planes = k.g.N * k.g.C;
    atomic_init(&k.failed, 0);
    cti_parallel_for(planes, plane_grain(k.in_plane + k.out_plane, planes), pool_task, &k);
    int f = atomic_load(&k.failed);
    if (f == 1) return cti_error(CT_ERR_OOM, "%s: out of memory for a plane buffer", op);
    if (f == 2) return bad_indices(op, &k.g);
    return CT_OK;
}

/* ---- max pooling ------------------------------------------------------------------ */

static void max_plane(const pool_ctx *k, int64_t p, const double *src, double *dst) {
    const pgeo *g = &k->g;
    int64_t *ind = (int64_t *)cti_data(k->out_idx) + p * k->out_plane;
    for (int64_t oh = 0; oh < g->OH; oh++) {
        int64_t hs = oh * g->sh - g->ph, he = hs + (g->kh - 1) * g->dh + 1;
        if (he > g->H) he = g->H;
        while (hs < 0) hs += g->dh;
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t ws = ow * g->sw - g->pw, we = ws + (g->kw - 1) * g->dw + 1;
            if (we > g->W) we = g->W;
            while (ws < 0) ws += g->dw;
            /* With dilation a window can miss every input element; it gives
             * -inf and index -1, whose gradient the backward drops. */
            double best = -INFINITY;
            int64_t bi = hs < he && ws < we ? hs * g->W + ws : -1;
            for (int64_t h = hs; h < he; h += g->dh)
                for (int64_t w = ws; w < we; w += g->dw) {
                    double v = src[h * g->W + w];
                    /* first maximum wins; NaN propagates (as PyTorch) */
                    if (v > best || isnan(v)) {
                        best = v;
                        bi = h * g->W + w;
                    }
                }
            dst[oh * g->OW + ow] = best;
            ind[oh * g->OW + ow] = bi;
        }
    }
}

/* ---- float32, contiguous, undilated: the layers of a CNN -----------------------------
 * The general path above converts every plane to float64 and back, which
 * costs several times the pooling itself; here the planes are read and
 * written in place, with the same window rules (clipped to the input, the
 * first maximum wins, NaN propagates). */
static bool f32_fast(const pgeo *g, const ct_tensor *a, const ct_tensor *b, const ct_tensor *c) {
    return g->dh == 1 && g->dw == 1 && a->dtype == CT_F32 && cti_is_contiguous(a) &&
           cti_is_contiguous(b) && cti_is_contiguous(c);
}

typedef struct fast_ctx {
    pgeo g;
    const float *x;  /* forward: x; backward: grad_out */
    float *y;        /* forward: y; backward: grad_in */
    int64_t *ind;    /* forward: written; backward: read */
    const int64_t *cind;
    const int32_t *base; /* max2x2_table's, or NULL */
    atomic_int bad;
} fast_ctx;

/* Takes v at index i when it beats best or is NaN (the first NaN then
 * stays): written as selects, since on real data the comparison is a coin
 * flip and a branch would be mispredicted half the time. */
static inline void take_max(float v, int64_t i, float *best, int64_t *bi) {
    uint32_t t = (uint32_t)(v > *best) | (uint32_t)(v != v);
    uint32_t m = 0u - t, vb, bb;
    memcpy(&vb, &v, 4);
    memcpy(&bb, best, 4);
    bb = (vb & m) | (bb & ~m);
    memcpy(best, &bb, 4);
    uint64_t m64 = 0u - (uint64_t)t;
    *bi = (int64_t)(((uint64_t)i & m64) | ((uint64_t)*bi & ~m64));
}

/* The 2x2 window whose top-left input element is src[b], in a plane of
 * width W. */
static inline void max2x2_at(const float *src, int64_t b, int64_t W, float *best, int64_t *bi) {
    *best = src[b];
    *bi = b;
    take_max(src[b + 1], b + 1, best, bi);
    take_max(src[b + W], b + W, best, bi);
    take_max(src[b + W + 1], b + W + 1, best, bi);
}

static void max_fast_plane(const pgeo *g, const float *restrict src, float *restrict dst,
                           int64_t *restrict ind) {
    /* 2x2 windows at stride 2 that all lie inside the input */
    /* locals: the stores below could alias the geometry for the compiler */
    const int64_t W = g->W, OH = g->OH, OW = g->OW;
    if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0 &&
        2 * OH <= g->H && 2 * OW <= W) {
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++)
                max2x2_at(src, 2 * oh * W + 2 * ow, W, &dst[oh * OW + ow], &ind[oh * OW + ow]);
        return;
    }
    for (int64_t oh = 0; oh < g->OH; oh++) {
        int64_t hs = oh * g->sh - g->ph, he = hs + g->kh;
        if (hs < 0) hs = 0;
        if (he > g->H) he = g->H;
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t ws = ow * g->sw - g->pw, we = ws + g->kw;
            if (ws < 0) ws = 0;
            if (we > g->W) we = g->W;
            float best = -INFINITY;
            int64_t bi = hs < he && ws < we ? hs * g->W + ws : -1;
            for (int64_t h = hs; h < he; h++)
                for (int64_t w = ws; w < we; w++) take_max(src[h * g->W + w], h * g->W + w, &best, &bi);
            dst[oh * g->OW + ow] = best;
            ind[oh * g->OW + ow] = bi;
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define POOL_HAVE_AVX512 1

static inline __attribute__((target("avx512f"))) void take_max16(__m512 v, __m512i i, __m512 *best,
                                                                 __m512i *bi) {
    __mmask16 m = _mm512_cmp_ps_mask(v, *best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    *best = _mm512_mask_mov_ps(*best, m, v);
    *bi = _mm512_mask_mov_epi32(*bi, m, i);
}

/* 2x2 windows at stride 2 over a whole plane, 16 outputs at a time: short
 * output rows (7 or 14 in a small CNN) leave nothing to vectorize along a
 * row, so the four taps of 16 consecutive outputs are gathered through a
 * table of each output's top-left input offset (base). Same order and rules
 * as take_max. Returns how many outputs it wrote (a multiple of 16). */
__attribute__((target("avx512f"))) static int64_t max2x2_plane_avx512(
    const float *src, float *dst, int64_t *ind, int64_t n, int64_t W, const int32_t *base) {
    const __m512i one = _mm512_set1_epi32(1), wv = _mm512_set1_epi32((int32_t)W);
    int64_t q = 0;
    for (; q + 16 <= n; q += 16) {
        __m512i b0 = _mm512_loadu_si512(base + q);
        __m512i b1 = _mm512_add_epi32(b0, one);
        __m512i b2 = _mm512_add_epi32(b0, wv);
        __m512i b3 = _mm512_add_epi32(b2, one);
        __m512 best = _mm512_i32gather_ps(b0, src, 4);
        __m512i bi = b0;
        take_max16(_mm512_i32gather_ps(b1, src, 4), b1, &best, &bi);
        take_max16(_mm512_i32gather_ps(b2, src, 4), b2, &best, &bi);
        take_max16(_mm512_i32gather_ps(b3, src, 4), b3, &best, &bi);
        _mm512_storeu_ps(dst + q, best);
        _mm512_storeu_si512(ind + q, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(bi)));
        _mm512_storeu_si512(ind + q + 8, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(bi, 1)));
    }
    return q;
}
#endif

static void max_fast_task(int64_t begin, int64_t end, void *vctx) {
    fast_ctx *k = vctx;
    const pgeo *g = &k->g;
    int64_t in_plane = g->H * g->W, out_plane = g->OH * g->OW;
    for (int64_t p = begin; p < end; p++) {
        const float *src = k->x + p * in_plane;
        float *dst = k->y + p * out_plane;
        int64_t *ind = k->ind + p * out_plane;
#ifdef POOL_HAVE_AVX512
        if (k->base) {
            int64_t done = max2x2_plane_avx512(src, dst, ind, out_plane, g->W, k->base);
            for (int64_t q = done; q < out_plane; q++)
                max2x2_at(src, k->base[q], g->W, &dst[q], &ind[q]);
            continue;
        }
#endif
        max_fast_plane(g, src, dst, ind);
    }
}

/* The gather table of max2x2_plane_avx512 when it applies (2x2 windows at
 * stride 2 inside the input, planes addressable in 31 bits, AVX-512 present),
 * else NULL: the caller then takes the scalar path. */
static int32_t *max2x2_table(const pgeo *g) {
#ifdef POOL_HAVE_AVX512
    if (g->kh != 2 || g->kw != 2 || g->sh != 2 || g->sw != 2 || g->ph != 0 || g->pw != 0 ||
        2 * g->OH > g->H || 2 * g->OW > g->W || g->H * g->W >= INT32_MAX ||
        g->OH * g->OW < 16 || cti_cpu_isa() < CTI_ISA_AVX512)
        return NULL;
    int32_t *base = malloc((size_t)(g->OH * g->OW) * sizeof(int32_t));
    if (!base) return NULL; /* the scalar path needs no table */
    for (int64_t oh = 0; oh < g->OH; oh++)
        for (int64_t ow = 0; ow < g->OW; ow++)
            base[oh * g->OW + ow] = (int32_t)(2 * oh * g->W + 2 * ow);
    return base;
#else
    (void)g;
    return NULL;
#endif
}

static void max_back_fast_task(int64_t begin, int64_t end, void *vctx) {
    fast_ctx *k = vctx;
    const pgeo *g = &k->g;
    int64_t in_plane = g->H * g->W, out_plane = g->OH * g->OW;
    for (int64_t p = begin; p < end; p++) {
        const float *go = k->x + p * out_plane;
        const int64_t *ind = k->cind + p * out_plane;
        float *gi = k->y + p * in_plane;
        memset(gi, 0, (size_t)in_plane * sizeof(float));
        for (int64_t o = 0; o < out_plane; o++) {
            int64_t i = ind[o];
            if (i == -1) continue;
            if (i < 0 || i >= in_plane) {
                atomic_store(&k->bad, 1);
                continue;
            }
            gi[i] += go[o];
        }
    }
}

static int64_t fast_grain(const pgeo *g) {
    return plane_grain(g->H * g->W + g->OH * g->OW, 1);
}

/* in: x; out: y, indices (int64). */
static ct_status k_max_pool2d(ct_call *c) {
    if (nothing_to_write(c)) return CT_OK;
    pgeo g = pgeo_from_call(c);
    if (f32_fast(&g, c->in[0], c->out[0], c->out[1])) {
        fast_ctx f = {.g = g, .x = (const float *)cti_data(c->in[0]),
                      .y = (float *)cti_data(c->out[0]), .ind = (int64_t *)cti_data(c->out[1])};
        int32_t *base = max2x2_table(&g);
        f.base = base;
        c->routine = base ? "max_pool2d_f32_2x2_avx512" : "max_pool2d_f32";
        cti_parallel_for(g.N * g.C, fast_grain(&g), max_fast_task, &f);
        free(base);
        return CT_OK;
    }
    return pool_planes(c, max_plane, false, NULL, c->out[1], "max_pool2d_direct", "ct_max_pool2d");
}

static void max_back_plane(const pool_ctx *k, int64_t p, const double *src, double *dst) {
    const int64_t *ind = (const int64_t *)cti_data(k->idx);
    int64_t shape[4], st[4];
    as4(k->idx, shape, st);
    int64_t n = p / shape[1], c = p % shape[1], lim = k->g.H * k->g.W;
    memset(dst, 0, (size_t)lim * sizeof(double));
    for (int64_t oh = 0; oh < k->g.OH; oh++)
        for (int64_t ow = 0; ow < k->g.OW; ow++) {
            int64_t i = ind[n * st[0] + c * st[1] + oh * st[2] + ow * st[3]];
            if (i == -1) continue; /* an empty window */
            if (i < 0 || i >= lim) {
                pool_ctx *mk = (pool_ctx *)k;
                atomic_store(&mk->failed, 2);
                continue;
            }
            dst[i] += src[oh * k->g.OW + ow];
        }
}

/* in: grad_out, x, indices; out: grad_in. */
static ct_status k_max_pool2d_backward(ct_call *c) {
    static const char op[] = "ct_max_pool2d_backward";
    if (nothing_to_write(c)) return CT_OK;
    pgeo g = pgeo_from_call(c);
    /* the indices carry the window: no geometry beyond the plane sizes */
    if (c->in[0]->dtype == CT_F32 && cti_is_contiguous(c->in[0]) &&
        cti_is_contiguous(c->in[2]) && cti_is_contiguous(c->out[0])) {
        fast_ctx f = {.g = g, .x = (const float *)cti_data(c->in[0]),
                      .y = (float *)cti_data(c->out[0]),
                      .cind = (const int64_t *)cti_data(c->in[2])};
        atomic_init(&f.bad, 0);
        c->routine = "max_pool2d_backward_f32";
        cti_parallel_for(g.N * g.C, fast_grain(&g), max_back_fast_task, &f);
        return atomic_load(&f.bad) ? bad_indices(op, &g) : CT_OK;
    }
    return pool_planes(c, max_back_plane, true, c->in[2], NULL, "max_pool2d_backward_direct", op);
}

/* ---- average pooling ----------------------------------------------------------------- */

/* The window of output (oh, ow) clipped to the input, and its divisor. */
static void avg_window(const pgeo *g, int64_t oh, int64_t ow, int64_t *hs, int64_t *he,
                       int64_t *ws, int64_t *we, double *div) {
    int64_t h0 = oh * g->sh - g->ph, w0 = ow * g->sw - g->pw;
    int64_t h1 = h0 + g->kh, w1 = w0 + g->kw;
    if (h1 > g->H + g->ph) h1 = g->H + g->ph;
    if (w1 > g->W + g->pw) w1 = g->W + g->pw;
    int64_t pool_size = (h1 - h0) * (w1 - w0);
    if (h0 < 0) h0 = 0;
    if (w0 < 0) w0 = 0;
    if (h1 > g->H) h1 = g->H;
    if (w1 > g->W) w1 = g->W;
    *hs = h0;
    *he = h1;
    *ws = w0;
    *we = w1;
    *div = (double)(g->count_include_pad ? pool_size : (h1 - h0) * (w1 - w0));
}

static void avg_plane(const pool_ctx *k, int64_t p, const double *src, double *dst) {
    const pgeo *g = &k->g;
    for (int64_t oh = 0; oh < g->OH; oh++)
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t hs, he, ws, we;
            double div, s = 0;
            avg_window(g, oh, ow, &hs, &he, &ws, &we, &div);
            for (int64_t h = hs; h < he; h++)
                for (int64_t w = ws; w < we; w++) s += src[h * g->W + w];
            dst[oh * g->OW + ow] = hs < he && ws < we ? s / div : 0;
        }
}

static void avg_back_plane(const pool_ctx *k, int64_t p, const double *src, double *dst) {
    const pgeo *g = &k->g;
    memset(dst, 0, (size_t)(g->H * g->W) * sizeof(double));
    for (int64_t oh = 0; oh < g->OH; oh++)
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t hs, he, ws, we;
            double div;
            avg_window(g, oh, ow, &hs, &he, &ws, &we, &div);
            if (hs >= he || ws >= we) continue;
            double v = src[oh * g->OW + ow] / div;
            for (int64_t h = hs; h < he; h++)
                for (int64_t w = ws; w < we; w++) dst[h * g->W + w] += v;
        }
}

static ct_status k_avg_pool2d(ct_call *c) {
    return pool_planes(c, avg_plane, false, NULL, NULL, "avg_pool2d_direct", "ct_avg_pool2d");
}

/* in: grad_out, x; out: grad_in. */
static ct_status k_avg_pool2d_backward(ct_call *c) {
    return pool_planes(c, avg_back_plane, true, NULL, NULL, "avg_pool2d_backward_direct", "ct_avg_pool2d_backward");
}

/* ---- adaptive average pooling ---------------------------------------------------------- */

/* PyTorch's adaptive window: [floor(i*in/out), ceil((i+1)*in/out)). */
/* In 128 bits: the output and input sizes each fit, their product need not. */
static int64_t ad_start(int64_t i, int64_t in, int64_t out) {
    return (int64_t)((__int128)i * in / out);
}
static int64_t ad_end(int64_t i, int64_t in, int64_t out) {
    return (int64_t)(((__int128)(i + 1) * in + out - 1) / out);
}

static void adaptive_plane(const pool_ctx *k, int64_t p, const double *src, double *dst) {
    const pgeo *g = &k->g;
    for (int64_t oh = 0; oh < g->OH; oh++) {
        int64_t hs = ad_start(oh, g->H, g->OH), he = ad_end(oh, g->H, g->OH);
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t ws = ad_start(ow, g->W, g->OW), we = ad_end(ow, g->W, g->OW);
            double s = 0;
            for (int64_t h = hs; h < he; h++)
                for (int64_t w = ws; w < we; w++) s += src[h * g->W + w];
            dst[oh * g->OW + ow] = s / (double)((he - hs) * (we - ws));
        }
    }
}

static void adaptive_back_plane(const pool_ctx *k, int64_t p, const double *src, double *dst) {
    const pgeo *g = &k->g;
    memset(dst, 0, (size_t)(g->H * g->W) * sizeof(double));
    for (int64_t oh = 0; oh < g->OH; oh++) {
        int64_t hs = ad_start(oh, g->H, g->OH), he = ad_end(oh, g->H, g->OH);
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t ws = ad_start(ow, g->W, g->OW), we = ad_end(ow, g->W, g->OW);
            double v = src[oh * g->OW + ow] / (double)((he - hs) * (we - ws));
            for (int64_t h = hs; h < he; h++)
                for (int64_t w = ws; w < we; w++) dst[h * g->W + w] += v;
        }
    }
}

static ct_status k_adaptive_avg_pool2d(ct_call *c) {
    return pool_planes(c, adaptive_plane, false, NULL, NULL, "adaptive_avg_pool2d_direct", "ct_adaptive_avg_pool2d");
}

/* in: grad_out, x; out: grad_in. */
static ct_status k_adaptive_avg_pool2d_backward(ct_call *c) {
    return pool_planes(c, adaptive_back_plane, true, NULL, NULL, "adaptive_avg_pool2d_backward_direct", "ct_adaptive_avg_pool2d_backward");
}

/* ---- adaptive max pooling --------------------------------------------------------------- */

/* The largest x of each adaptive window (NaN wins, as PyTorch's) and its
 * index h * W + w in the plane; the backward is max_pool2d's, from them. */
static void adaptive_max_plane(const pool_ctx *k, int64_t p, const double *src, double *dst) {
    const pgeo *g = &k->g;
    int64_t *ind = (int64_t *)cti_data(k->out_idx) + p * k->out_plane;
    for (int64_t oh = 0; oh < g->OH; oh++) {
        int64_t hs = ad_start(oh, g->H, g->OH), he = ad_end(oh, g->H, g->OH);
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t ws = ad_start(ow, g->W, g->OW), we = ad_end(ow, g->W, g->OW);
            double best = -INFINITY;
            int64_t bi = hs * g->W + ws;
            for (int64_t h = hs; h < he; h++)
                for (int64_t w = ws; w < we; w++) {
                    double v = src[h * g->W + w];
                    if (v > best || isnan(v)) {
                        best = v;
                        bi = h * g->W + w;
                    }
                }
            dst[oh * g->OW + ow] = best;
            ind[oh * g->OW + ow] = bi;
        }
    }
}

/* in: x; out: y, int64 indices. */
static ct_status k_adaptive_max_pool2d(ct_call *c) {
    return pool_planes(c, adaptive_max_plane, false, NULL, c->out[1],
                       "adaptive_max_pool2d_direct", "ct_adaptive_max_pool2d");
}

void cti_cpu_register_pool2d(void) {
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (int i = 0; i < 4; i++) {
        ct_dtype d = dts[i];
        cti_register_kernel(CT_OP_MAX_POOL2D, CT_DEVICE_CPU, d, k_max_pool2d, "max_pool2d");
        cti_register_kernel(CT_OP_MAX_POOL2D_BACKWARD, CT_DEVICE_CPU, d, k_max_pool2d_backward,
                            "max_pool2d_backward");
        cti_register_kernel(CT_OP_AVG_POOL2D, CT_DEVICE_CPU, d, k_avg_pool2d, "avg_pool2d");
        cti_register_kernel(CT_OP_AVG_POOL2D_BACKWARD, CT_DEVICE_CPU, d, k_avg_pool2d_backward,
                            "avg_pool2d_backward");
        cti_register_kernel(CT_OP_ADAPTIVE_AVG_POOL2D, CT_DEVICE_CPU, d, k_adaptive_avg_pool2d,
                            "adaptive_avg_pool2d");
        cti_register_kernel(CT_OP_ADAPTIVE_AVG_POOL2D_BACKWARD, CT_DEVICE_CPU, d,
                            k_adaptive_avg_pool2d_backward, "adaptive_avg_pool2d_backward");
        cti_register_kernel(CT_OP_ADAPTIVE_MAX_POOL2D, CT_DEVICE_CPU, d, k_adaptive_max_pool2d,
                            "adaptive_max_pool2d");
    }
}
