/* CPU 2-d convolution: im2col + GEMM (OpenBLAS) forward, GEMM + col2im for
 * the input gradient, im2col + GEMM accumulated for the weight gradient.
 * Per image and group, with col = im2col(x) [Cg * kh * kw, OH * OW] (row
 * (c, i, j), column (oh, ow) holds x[c, oh * sh - ph + i * dh,
 * ow * sw - pw + j * dw], zero in the padding) and w as [Cog, Cg * kh * kw]:
 *   y  = w @ col + bias
 *   dx = col2im(w^T @ dy), col2im adding each entry back where im2col read it
 *   dw = sum over images of dy @ col^T
 *   db = sum over images and pixels of dy (k_conv2d_backward_bias)
 * 3x3 stride-1 layers with enough channels take Winograd F(2x2, 3x3) instead
 * for f32, f16 and bf16 on AVX-512 CPUs (winograd.c; use_winograd below), and
 * stride-1 layers with one to four input channels a direct kernel for the
 * forward and the weight gradient (conv_direct.c; use_direct below).
 *
 * The output pixels are processed in column tiles: a few output rows of one
 * image when an image is large (so the im2col tile stays in cache), or several
 * whole images when images are small (so each GEMM is big enough to run at
 * speed). im2col/col2im run on the pool; BLAS runs outside pool tasks with its
 * own threads. f64 computes with dgemm; f32, f16 and bf16 with sgemm, the
 * half types converted to f32 buffers around it.
 *
 * The type-dependent part is written once below and compiled twice (this file
 * includes itself with CONV_T = float, then double). */
#ifndef CONV_T

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "conv_direct.h"
#include "cpu_impl.h"
#include "winograd.h"

void cti_cpu_register_pool2d(void); /* pool2d.c */

/* Geometry of one convolution: the call's cti_conv_params under the short
 * names the loops below use, and the sizes derived from them. */
typedef struct geo {
    int64_t N, C, H, W, Co, kh, kw, OH, OW;
    int64_t sh, sw, ph, pw, dh, dw; /* stride, padding, dilation: [0] h, [1] w */
    int64_t G;   /* groups */
    int64_t Cg;  /* input channels per group */
    int64_t Cog; /* output channels per group */
    int64_t K;   /* Cg * kh * kw: GEMM depth */
    int64_t P;   /* OH * OW */
    int64_t HW;
    bool pointwise; /* 1x1, stride 1, no padding: the input is its own im2col */
} geo;

static geo geo_from_call(const ct_call *c) {
    const cti_conv_params *p = CTI_PARAMS(c, cti_conv_params);
    geo g = {.N = p->N, .C = p->C, .H = p->H, .W = p->W, .Co = p->Co, .kh = p->kh,
             .kw = p->kw, .OH = p->OH, .OW = p->OW, .sh = p->stride[0], .sw = p->stride[1],
             .ph = p->padding[0], .pw = p->padding[1], .dh = p->dilation[0],
             .dw = p->dilation[1], .G = p->groups};
    g.Cg = g.C / g.G;
    g.Cog = g.Co / g.G;
    g.K = g.Cg * g.kh * g.kw;
    g.P = g.OH * g.OW;
    g.HW = g.H * g.W;
    g.pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
    return g;
}

/* Channels per group from which Winograd F(2x2, 3x3) beats im2col + GEMM
 * (measured on a 2-core AVX-512 Xeon, 14x14 to 32x32 images): the forward
 * and input gradient win from 4 channels on each side (3 -> 64 and 1 -> 16
 * stay faster on im2col); the weight gradient pads the input channels to 16
 * and wins from 8. */
#define CONV_WINO_MIN_CHANNELS 4
#define CONV_WINO_MIN_CHANNELS_DW 8

/* 3x3, stride 1, dilation 1, padding 0..2 (so that the input gradient's
 * padding 2 - p is one too), f32 compute, nonempty. which: 0 forward, 1 input
 * gradient, 2 weight gradient. */
static bool use_winograd(const geo *g, ct_dtype dt, int which) {
    if (dt == CT_F64 || g->kh != 3 || g->kw != 3 || g->sh != 1 || g->sw != 1 || g->dh != 1 ||
        g->dw != 1 || g->ph > 2 || g->pw > 2)
        return false;
    int64_t min_in = which == 2 ? CONV_WINO_MIN_CHANNELS_DW : CONV_WINO_MIN_CHANNELS;
    if (g->Cg < min_in || g->Cog < CONV_WINO_MIN_CHANNELS) return false;
    if (g->N == 0 || g->P == 0 || g->HW == 0) return false;
    return cti_wino_supported();
}

#define WINO_ROUTINE "winograd F(2x2,3x3) avx512"

/* Input channels per group up to which the direct kernels beat im2col + GEMM
 * (measured on a 2-core AVX-512 Xeon: see use_direct), and the most taps
 * (channels x kernel positions) they take. */
#define CONV_DIRECT_MAX_CHANNELS 4
#define CONV_DIRECT_MAX_TAPS 100

/* Stride 1, dilation 1, not 1x1 (a 1x1 layer is a plain GEMM), f32 compute,
 * nonempty, and not already Winograd's. which: 0 forward, 2 weight gradient
 * (the input gradient of a few-channel layer is rarely needed: the input of
 * a first layer takes no gradient). */
static bool use_direct(const geo *g, ct_dtype dt, int which) {
    if (dt == CT_F64 || which == 1 || g->sh != 1 || g->sw != 1 || g->dh != 1 || g->dw != 1 ||
        g->pointwise)
        return false;
    if (g->Cg > CONV_DIRECT_MAX_CHANNELS || g->K > CONV_DIRECT_MAX_TAPS) return false;
    if (g->N == 0 || g->P == 0 || g->HW == 0) return false;
    if (use_winograd(g, dt, which)) return false;
    return cti_direct_supported();
}

#define DIRECT_ROUTINE "direct avx512"

/* Output columns per GEMM. OpenBLAS needs a long N dimension to reach its
 * peak when M (output channels) is small; on the 2-core Emerald Rapids
 * machine one 56x56 output plane per GEMM (3136) measured faster than 1024
 * or 6272 for the 64->64 3x3 layer, though its im2col tile (7 MB) spills L2. */
#ifndef CONV_TILE_COLS
#define CONV_TILE_COLS 3136
#endif

/* A tiling of the N x OH output rows: B whole images per tile, or (B == 1)
 * `rows` output rows of one image per tile. */
typedef struct tiling {
    int64_t B, rows, cols;
} tiling;

static tiling plan_tiles(const geo *g, int64_t target) {
    tiling t;
    if (g->P >= target || g->N <= 1) {
        int64_t rows = target / g->OW;
        if (rows < 1) rows = 1;
        if (rows > g->OH) rows = g->OH;
        int64_t ntiles = (g->OH + rows - 1) / rows;
        t.B = 1;
        t.rows = (g->OH + ntiles - 1) / ntiles; /* even tiles, no small tail */
    } else {
        t.rows = g->OH;
        t.B = target / g->P;
        if (t.B < 1) t.B = 1;
        if (t.B > g->N) t.B = g->N;
        int64_t ntiles = (g->N + t.B - 1) / t.B;
        t.B = (g->N + ntiles - 1) / ntiles;
    }
    t.cols = t.B * t.rows * g->OW;
    return t;
}

/* One tile: images [n0, n0 + nb), output rows [r0, r1). */
typedef struct tile {
    int64_t n0, nb, r0, r1;
} tile;

/* Advances c to the next tile of the plan (start from a zeroed tile). */
static bool next_tile(const geo *g, const tiling *t, tile *c) {
    if (c->nb == 0) {
        c->n0 = 0;
        c->r0 = 0;
    } else if (c->r1 < g->OH) {
        c->r0 = c->r1;
    } else {
        c->n0 += c->nb;
        c->r0 = 0;
    }
    if (c->n0 >= g->N) return false;
    c->nb = g->N - c->n0 < t->B ? g->N - c->n0 : t->B;
    c->r1 = c->r0 + t->rows < g->OH ? c->r0 + t->rows : g->OH;
    return true;
}

/* Output columns [lo, hi) whose input column ow * s - off lies in [0, W). */
static void valid_span(int64_t OW, int64_t s, int64_t off, int64_t W, int64_t *lo,
                       int64_t *hi) {
    int64_t l = off <= 0 ? 0 : (off + s - 1) / s;
    int64_t h = W + off <= 0 ? 0 : (W + off + s - 1) / s;
    if (l > OW) l = OW;
    if (h > OW) h = OW;
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

#define CONV_T float
#define CONV_S f32
#define CONV_GEMM cblas_sgemm
#include "conv.c"
#undef CONV_T
#undef CONV_S
#undef CONV_GEMM

#define CONV_T double
#define CONV_S f64
#define CONV_GEMM cblas_dgemm
#include "conv.c"
#undef CONV_T
#undef CONV_S
#undef CONV_GEMM

/* ---- operands in the compute type --------------------------------------------- */

/* A tensor's elements as a contiguous f32 (f64 for f64) buffer: the tensor's
 * own memory when it already is one, else a converted copy. */
typedef struct operand {
    void *p;
    bool owned;
} operand;

typedef struct load_ctx {
    const char *base;
    ct_dtype dt;
    int64_t shape[4], st[4];
    void *dst;
} load_ctx;

static void load_task(int64_t begin, int64_t end, void *vctx) {
    const load_ctx *k = vctx;
    int64_t H = k->shape[2], W = k->shape[3], es = (int64_t)ct_dtype_size(k->dt);
    for (int64_t p = begin; p < end; p++) {
        int64_t n = p / k->shape[1], c = p % k->shape[1];
        const char *plane = k->base + (n * k->st[0] + c * k->st[1]) * es;
        for (int64_t h = 0; h < H; h++) {
            const char *row = plane + h * k->st[2] * es;
            int64_t o = (p * H + h) * W, s = k->st[3];
            switch (k->dt) {
            case CT_F64: {
                const double *r = (const double *)row;
                double *d = (double *)k->dst + o;
                for (int64_t w = 0; w < W; w++) d[w] = r[w * s];
                break;
            }
            case CT_F32: {
                const float *r = (const float *)row;
                float *d = (float *)k->dst + o;
                for (int64_t w = 0; w < W; w++) d[w] = r[w * s];
                break;
            }
            case CT_F16: {
                const uint16_t *r = (const uint16_t *)row;
                float *d = (float *)k->dst + o;
                for (int64_t w = 0; w < W; w++) d[w] = cti_f16_to_f32(r[w * s]);
                break;
            }
            default: {
                const uint16_t *r = (const uint16_t *)row;
                float *d = (float *)k->dst + o;
                for (int64_t w = 0; w < W; w++) d[w] = cti_bf16_to_f32(r[w * s]);
                break;
            }
            }
        }
    }
}

static size_t compute_size(ct_dtype dt) { return dt == CT_F64 ? sizeof(double) : sizeof(float); }

static bool is_compute_type(ct_dtype dt) { return dt == CT_F32 || dt == CT_F64; }

/* Loads a tensor viewed with the given 4-d shape and element strides. */
static ct_status load_shaped(const ct_tensor *t, const int64_t shape[4], const int64_t st[4],
                             bool contiguous, operand *o) {
    o->owned = false;
    o->p = NULL;
    if (contiguous && is_compute_type(t->dtype)) {
        o->p = cti_data(t);
        return CT_OK;
    }
    /* An empty tensor's sizes may multiply past int64 (a zero next to huge
     * sizes): count with cti_numel and load nothing then. */
    int64_t n = cti_numel(4, shape);
    o->p = malloc((size_t)(n > 0 ? n : 1) * compute_size(t->dtype));
    if (!o->p) return cti_error(CT_ERR_OOM, "conv2d: out of memory converting %s", cti_desc(t));
    o->owned = true;
    load_ctx k = {cti_data(t), t->dtype, {shape[0], shape[1], shape[2], shape[3]},
                  {st[0], st[1], st[2], st[3]}, o->p};
    if (n == 0) return CT_OK;
    int64_t planes = shape[0] * shape[1], per = shape[2] * shape[3];
    cti_parallel_for(planes, per > 0 ? 1 + CTI_GRAIN / per : planes, load_task, &k);
    return CT_OK;
}

/* An NCHW (or CHW, taken as one image) tensor. */
static ct_status load_nchw(const ct_tensor *t, operand *o) {
    int64_t shape[4], st[4];
    int off = 4 - t->ndim;
    shape[0] = 1;
    st[0] = 0;
    for (int d = 0; d < t->ndim; d++) {
        shape[d + off] = t->shape[d];
        st[d + off] = t->stride[d];
    }
    return load_shaped(t, shape, st, cti_is_contiguous(t), o);
}

static ct_status load_vector(const ct_tensor *t, operand *o) {
    int64_t shape[4] = {1, 1, 1, t->shape[0]}, st[4] = {0, 0, 0, t->stride[0]};
    return load_shaped(t, shape, st, t->stride[0] == 1 || t->shape[0] <= 1, o);
}

static void operand_free(operand *o) {
    if (o->owned) free(o->p);
    o->p = NULL;
    o->owned = false;
}

/* Where a kernel writes an output: the output itself for f32/f64, an f32
 * buffer for the half types. */
static ct_status out_buffer(const ct_tensor *t, operand *o) {
    o->owned = false;
    if (is_compute_type(t->dtype)) {
        o->p = cti_data(t);
        return CT_OK;
    }
    int64_t n = cti_numel(t->ndim, t->shape);
    o->p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!o->p) return cti_error(CT_ERR_OOM, "conv2d: out of memory for %s", cti_desc(t));
    o->owned = true;
    return CT_OK;
}

typedef struct store_ctx {
    const float *src;
    uint16_t *dst;
    bool bf16;
} store_ctx;

static void store_task(int64_t begin, int64_t end, void *vctx) {
    const store_ctx *k = vctx;
    if (k->bf16)
        for (int64_t i = begin; i < end; i++) k->dst[i] = cti_f32_to_bf16(k->src[i]);
    else
        for (int64_t i = begin; i < end; i++) k->dst[i] = cti_f32_to_f16(k->src[i]);
}

/* Converts the f32 buffer into the (contiguous, half-typed) output and frees it. */
static void out_finish(ct_tensor *t, operand *o) {
    if (o->owned) {
        store_ctx k = {o->p, (uint16_t *)cti_data(t), t->dtype == CT_BF16};
        cti_parallel_for(cti_numel(t->ndim, t->shape), CTI_GRAIN, store_task, &k);
    }
    operand_free(o);
}

/* ---- kernels ---------------------------------------------------------------------- */

static const char *routine(const geo *g, ct_dtype dt, int which) {
    bool d = dt == CT_F64;
    switch (which) {
    case 0:
        if (g->pointwise) return d ? "cblas_dgemm" : "cblas_sgemm";
        return d ? "im2col+cblas_dgemm" : "im2col+cblas_sgemm";
    case 1:
        if (g->pointwise) return d ? "cblas_dgemm" : "cblas_sgemm";
        return d ? "cblas_dgemm+col2im" : "cblas_sgemm+col2im";
    default:
        if (g->pointwise) return d ? "cblas_dgemm" : "cblas_sgemm";
        return d ? "im2col+cblas_dgemm" : "im2col+cblas_sgemm";
    }
}

/* One of the three convolutions on compute-type arrays, by the path picked
 * for it. which: 0 forward (a = x, b = w, bias -> y), 1 input gradient
 * (a = dy, b = w -> dx), 2 weight gradient (a = dy, b = x -> dw). */
static ct_status conv_run(const geo *g, ct_dtype dt, int which, bool wino, bool direct,
                         const void *a, const void *b, const void *bias, void *out) {
    /* the Winograd and direct kernels' geometry */
    const cti_conv_f32_geo fg = {.N = g->N, .G = g->G, .C = g->Cg, .Co = g->Cog, .H = g->H,
                                 .W = g->W, .OH = g->OH, .OW = g->OW, .kh = g->kh, .kw = g->kw,
                                 .ph = g->ph, .pw = g->pw};
    bool f64 = dt == CT_F64;
    switch (which) {
    case 0:
        if (wino) return cti_wino_forward(&fg, a, b, bias, out);
        if (direct) return cti_direct_forward(&fg, a, b, bias, out);
        return f64 ? conv_forward_f64(g, a, b, bias, out) : conv_forward_f32(g, a, b, bias, out);
    case 1:
        if (wino) return cti_wino_backward_input(&fg, a, b, out);
        return f64 ? conv_backward_input_f64(g, a, b, out) : conv_backward_input_f32(g, a, b, out);
    default:
        if (wino) return cti_wino_backward_weight(&fg, a, b, out);
        if (direct) return cti_direct_backward_weight(&fg, a, b, out);
        return f64 ? conv_backward_weight_f64(g, a, b, out) : conv_backward_weight_f32(g, a, b, out);
    }
}

/* The kernels of the three ops: in[0] and in[1] (and the forward's bias,
 * in[2] or NULL) in the compute type, the output written through an f32
 * buffer for the half types. An empty output needs no work, except the
 * weight gradient of an empty batch: zeros. */
static ct_status conv_op(ct_call *c, int which) {
    geo g = geo_from_call(c);
    ct_tensor *out = c->out[0];
    ct_dtype dt = out->dtype;
    bool wino = use_winograd(&g, dt, which), direct = use_direct(&g, dt, which);
    c->routine = wino ? WINO_ROUTINE : direct ? DIRECT_ROUTINE : routine(&g, dt, which);
    if (which != 2 && cti_numel(out->ndim, out->shape) == 0) return CT_OK;
    operand a = {0}, b = {0}, bias = {0}, o = {0};
    ct_status s = load_nchw(c->in[0], &a);
    if (s == CT_OK) s = load_nchw(c->in[1], &b);
    if (s == CT_OK && which == 0 && c->in[2]) s = load_vector(c->in[2], &bias);
    if (s == CT_OK) s = out_buffer(out, &o);
    if (s == CT_OK) s = conv_run(&g, dt, which, wino, direct, a.p, b.p, bias.p, o.p);
    if (s == CT_OK) out_finish(out, &o);
    else operand_free(&o);
    operand_free(&a);
    operand_free(&b);
    operand_free(&bias);
    return s;
}

/* in: x, w, bias (or NULL); out: y. */
static ct_status k_conv2d(ct_call *c) { return conv_op(c, 0); }

/* in: grad_out, w; out: grad_in. */
static ct_status k_conv2d_backward_input(ct_call *c) { return conv_op(c, 1); }

/* in: grad_out, x; out: grad_w. */
static ct_status k_conv2d_backward_weight(ct_call *c) { return conv_op(c, 2); }

/* ---- bias gradient: sums over N, H, W per channel ------------------------------------ */

typedef struct bias_ctx {
    const ct_tensor *dy;
    int64_t N, P, sn, sc, sp; /* planes viewed as N x Co x P when sp != 0 */
    int64_t shape[4], st[4];
    ct_tensor *out;
} bias_ctx;

/* Sum of n contiguous floats, in 16 independent lanes so it vectorizes. */
static double sum_f32(const float *restrict x, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += x[i + l];
    double s = 0;
    for (int l = 0; l < 16; l++) s += acc[l];
    for (; i < n; i++) s += x[i];
    return s;
}

static double load_elem(const char *p, ct_dtype dt) {
    switch (dt) {
    case CT_F64: return *(const double *)p;
    case CT_F32: return *(const float *)p;
    case CT_F16: return cti_f16_to_f32(*(const uint16_t *)p);
    default: return cti_bf16_to_f32(*(const uint16_t *)p);
    }
}

static void store_elem(char *p, ct_dtype dt, double v) {
    switch (dt) {
    case CT_F64: *(double *)p = v; break;
    case CT_F32: *(float *)p = (float)v; break;
    case CT_F16: *(uint16_t *)p = cti_f32_to_f16((float)v); break;
    default: *(uint16_t *)p = cti_f32_to_bf16((float)v); break;
    }
}

static void bias_task(int64_t begin, int64_t end, void *vctx) {
    const bias_ctx *k = vctx;
    ct_dtype dt = k->dy->dtype;
    int64_t es = (int64_t)ct_dtype_size(dt);
    const char *base = cti_data(k->dy);
    bool fast = dt == CT_F32 && k->st[3] == 1 && k->st[2] == k->shape[3];
    /* A plane with no elements ends the sum before the loops over the
     * other sizes start: those may be near INT64_MAX in an empty tensor. */
    bool none = k->shape[0] == 0 || k->shape[2] == 0 || k->shape[3] == 0;
    for (int64_t c = begin; c < end; c++) {
        double s = 0;
        for (int64_t n = 0; n < k->shape[0] && !none; n++) {
            const char *plane = base + (n * k->st[0] + c * k->st[1]) * es;
            if (fast) {
                s += sum_f32((const float *)plane, k->shape[2] * k->shape[3]);
                continue;
            }
            for (int64_t h = 0; h < k->shape[2]; h++)
                for (int64_t w = 0; w < k->shape[3]; w++)
                    s += load_elem(plane + (h * k->st[2] + w * k->st[3]) * es, dt);
        }
        store_elem(cti_data(k->out) + c * es, dt, s);
    }
}

/* in: grad_out (3-d or 4-d); out: [Co]. */
static ct_status k_conv2d_backward_bias(ct_call *c) {
    ct_tensor *dy = c->in[0];
    bias_ctx k = {.dy = dy, .out = c->out[0]};
    int off = 4 - dy->ndim;
    k.shape[0] = 1;
    k.st[0] = 0;
    for (int d = 0; d < dy->ndim; d++) {
        k.shape[d + off] = dy->shape[d];
        k.st[d + off] = dy->stride[d];
    }
    /* Saturated, not overflowing, for an empty grad_out with huge sizes
     * (its channel count is then 0 or each channel sums nothing). */
    int64_t per = cti_numel(3, (const int64_t[]){k.shape[0], k.shape[2], k.shape[3]});
    cti_parallel_for(k.shape[1], per > 0 ? 1 + CTI_GRAIN / per : k.shape[1], bias_task, &k);
    c->routine = "sum";
    return CT_OK;
}

void cti_cpu_register_conv(void) {
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (int i = 0; i < 4; i++) {
        cti_register_kernel(CT_OP_CONV2D, CT_DEVICE_CPU, dts[i], k_conv2d, "conv2d_im2col_gemm");
        cti_register_kernel(CT_OP_CONV2D_BACKWARD_INPUT, CT_DEVICE_CPU, dts[i],
                            k_conv2d_backward_input, "conv2d_gemm_col2im");
        cti_register_kernel(CT_OP_CONV2D_BACKWARD_WEIGHT, CT_DEVICE_CPU, dts[i],
                            k_conv2d_backward_weight, "conv2d_im2col_gemm");
        cti_register_kernel(CT_OP_CONV2D_BACKWARD_BIAS, CT_DEVICE_CPU, dts[i],
                            k_conv2d_backward_bias, "conv2d_bias_sum");
    }
    cti_cpu_register_pool2d();
}

#else /* CONV_T: the type-dependent part, compiled once per compute type */

#define F(name) CAT(name, CONV_S)

/* One tile's im2col (or col2im): images n0 .. n0+nb-1, output rows r0 .. r1-1,
 * the Cg channels of one group. */
typedef struct F(col_ctx) {
    const geo *g;
    const CONV_T *x; /* image n0, first channel of the group (im2col) */
    CONV_T *dx;      /* same, written (col2im) */
    CONV_T *col;     /* K x ld */
    int64_t r0, r1, ld;
    bool zero_first; /* col2im: clear the planes before adding (first tile of an image) */
} F(col_ctx);

/* Task t: image t / Cg, channel t % Cg of the tile; writes kh*kw rows of col. */
static void F(im2col_task)(int64_t begin, int64_t end, void *vctx) {
    const F(col_ctx) *k = vctx;
    const geo *g = k->g;
    int64_t rows = k->r1 - k->r0, OW = g->OW, sw = g->sw;
    for (int64_t t = begin; t < end; t++) {
        int64_t b = t / g->Cg, ch = t % g->Cg;
        const CONV_T *plane = k->x + b * g->C * g->HW + ch * g->HW;
        CONV_T *dst = k->col + ch * g->kh * g->kw * k->ld + b * rows * OW;
        for (int64_t i = 0; i < g->kh; i++) {
            for (int64_t j = 0; j < g->kw; j++, dst += k->ld) {
                int64_t off = g->pw - j * g->dw, lo, hi;
                valid_span(OW, sw, off, g->W, &lo, &hi);
                for (int64_t oh = k->r0; oh < k->r1; oh++) {
                    CONV_T *restrict d = dst + (oh - k->r0) * OW;
                    int64_t ih = oh * g->sh - g->ph + i * g->dh;
                    if (ih < 0 || ih >= g->H) {
                        memset(d, 0, (size_t)OW * sizeof(CONV_T));
                        continue;
                    }
                    const CONV_T *restrict row = plane + ih * g->W;
                    for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0;
                    if (sw == 1) {
                        if (hi > lo) memcpy(d + lo, row + (lo - off), (size_t)(hi - lo) * sizeof(CONV_T));
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) d[ow] = row[ow * sw - off];
                    }
                    for (int64_t ow = hi; ow < OW; ow++) d[ow] = 0;
                }
            }
        }
    }
}

/* Task t: adds its kh*kw col rows into plane (image t / Cg, channel t % Cg). */
static void F(col2im_task)(int64_t begin, int64_t end, void *vctx) {
    const F(col_ctx) *k = vctx;
    const geo *g = k->g;
    int64_t rows = k->r1 - k->r0, OW = g->OW, sw = g->sw;
    for (int64_t t = begin; t < end; t++) {
        int64_t b = t / g->Cg, ch = t % g->Cg;
        CONV_T *plane = k->dx + b * g->C * g->HW + ch * g->HW;
        const CONV_T *src = k->col + ch * g->kh * g->kw * k->ld + b * rows * OW;
        if (k->zero_first) memset(plane, 0, (size_t)g->HW * sizeof(CONV_T));
        for (int64_t i = 0; i < g->kh; i++) {
            for (int64_t j = 0; j < g->kw; j++, src += k->ld) {
                int64_t off = g->pw - j * g->dw, lo, hi;
                valid_span(OW, sw, off, g->W, &lo, &hi);
                for (int64_t oh = k->r0; oh < k->r1; oh++) {
                    int64_t ih = oh * g->sh - g->ph + i * g->dh;
                    if (ih < 0 || ih >= g->H) continue;
                    const CONV_T *restrict s = src + (oh - k->r0) * OW;
                    CONV_T *restrict row = plane + ih * g->W;
                    if (sw == 1) {
                        CONV_T *restrict r = row + (lo - off);
                        for (int64_t q = 0; q < hi - lo; q++) r[q] += s[lo + q];
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) row[ow * sw - off] += s[ow];
                    }
                }
            }
        }
    }
}

/* Moves a tile's rows between the NCHW tensor and a Cog x cols matrix:
 * row t is (image t / Cog, channel t % Cog). */
typedef struct F(gather_ctx) {
    const geo *g;
    CONV_T *nchw; /* image n0, first output channel of the group */
    CONV_T *mat;  /* Cog x ld */
    const CONV_T *bias; /* scatter only, may be NULL */
    int64_t ld;
    bool to_mat;
} F(gather_ctx);

static void F(gather_task)(int64_t begin, int64_t end, void *vctx) {
    const F(gather_ctx) *k = vctx;
    const geo *g = k->g;
    for (int64_t t = begin; t < end; t++) {
        int64_t b = t / g->Cog, co = t % g->Cog;
        CONV_T *restrict a = k->nchw + b * g->Co * g->P + co * g->P;
        CONV_T *restrict m = k->mat + co * k->ld + b * g->P;
        if (k->to_mat) {
            memcpy(m, a, (size_t)g->P * sizeof(CONV_T));
        } else {
            CONV_T bv = k->bias ? k->bias[co] : 0;
            for (int64_t p = 0; p < g->P; p++) a[p] = m[p] + bv;
        }
    }
}

static void F(gemm)(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int64_t m, int64_t n,
                    int64_t k, const CONV_T *a, int64_t lda, const CONV_T *b, int64_t ldb,
                    CONV_T beta, CONV_T *c, int64_t ldc) {
    CONV_GEMM(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1, a, (blasint)lda, b,
              (blasint)ldb, beta, c, (blasint)ldc);
}

static int64_t F(col_grain)(const geo *g) {
    /* each task writes kh*kw*cols values; keep tiny tiles on one thread */
    int64_t per = g->kh * g->kw * g->OW;
    return per > 0 ? 1 + 4096 / per : 1;
}

static ct_status F(conv_forward)(const geo *g, const CONV_T *x, const CONV_T *w,
                                 const CONV_T *bias, CONV_T *y) {
    tiling t = plan_tiles(g, CONV_TILE_COLS);
    bool direct = g->pointwise && t.B == 1;
    CONV_T *col = direct ? NULL : malloc((size_t)(g->K * t.cols) * sizeof(CONV_T));
    CONV_T *tmp = t.B > 1 ? malloc((size_t)(g->Cog * t.cols) * sizeof(CONV_T)) : NULL;
    if ((!direct && !col) || (t.B > 1 && !tmp)) {
        free(col);
        free(tmp);
        return cti_error(CT_ERR_OOM, "ct_conv2d: out of memory for the im2col buffer");
    }
    for (tile tl = {0}; next_tile(g, &t, &tl);) {
        int64_t n0 = tl.n0, nb = tl.nb, r0 = tl.r0, r1 = tl.r1;
        int64_t pc = nb * (r1 - r0) * g->OW;
        for (int64_t grp = 0; grp < g->G; grp++) {
            const CONV_T *xg = x + (n0 * g->C + grp * g->Cg) * g->HW;
            const CONV_T *wg = w + grp * g->Cog * g->K;
            const CONV_T *bmat = col;
            int64_t ldb = pc;
            if (direct) {
                bmat = xg + r0 * g->W;
                ldb = g->HW;
            } else {
                F(col_ctx) k = {g, xg, NULL, col, r0, r1, pc, false};
                cti_parallel_for(nb * g->Cg, F(col_grain)(g), F(im2col_task), &k);
            }
            if (t.B == 1) {
                /* the bias is written first and the GEMM adds to it (beta 1),
                 * which costs no more than the zeroing beta 0 does */
                CONV_T *out = y + (n0 * g->Co + grp * g->Cog) * g->P + r0 * g->OW;
                if (bias)
                    for (int64_t co = 0; co < g->Cog; co++) {
                        CONV_T bv = bias[grp * g->Cog + co], *restrict o = out + co * g->P;
                        for (int64_t p = 0; p < pc; p++) o[p] = bv;
                    }
                F(gemm)(CblasNoTrans, CblasNoTrans, g->Cog, pc, g->K, wg, g->K, bmat, ldb,
                        bias ? 1 : 0, out, g->P);
            } else {
                F(gemm)(CblasNoTrans, CblasNoTrans, g->Cog, pc, g->K, wg, g->K, bmat, ldb, 0, tmp,
                        pc);
                F(gather_ctx) k = {g, y + (n0 * g->Co + grp * g->Cog) * g->P, tmp,
                                   bias ? bias + grp * g->Cog : NULL, pc, false};
                cti_parallel_for(nb * g->Cog, 1 + CTI_GRAIN / g->P, F(gather_task), &k);
            }
        }
    }
    free(col);
    free(tmp);
    return CT_OK;
}

static ct_status F(conv_backward_input)(const geo *g, const CONV_T *dy, const CONV_T *w,
                                        CONV_T *dx) {
    tiling t = plan_tiles(g, CONV_TILE_COLS);
    bool direct = g->pointwise && t.B == 1;
    CONV_T *col = direct ? NULL : malloc((size_t)(g->K * t.cols) * sizeof(CONV_T));
    CONV_T *tmp = t.B > 1 ? malloc((size_t)(g->Cog * t.cols) * sizeof(CONV_T)) : NULL;
    if ((!direct && !col) || (t.B > 1 && !tmp)) {
        free(col);
        free(tmp);
        return cti_error(CT_ERR_OOM,
                         "ct_conv2d_backward_input: out of memory for the col2im buffer");
    }
    for (tile tl = {0}; next_tile(g, &t, &tl);) {
        int64_t n0 = tl.n0, nb = tl.nb, r0 = tl.r0, r1 = tl.r1;
        int64_t pc = nb * (r1 - r0) * g->OW;
        for (int64_t grp = 0; grp < g->G; grp++) {
            CONV_T *dxg = dx + (n0 * g->C + grp * g->Cg) * g->HW;
            const CONV_T *wg = w + grp * g->Cog * g->K;
            CONV_T *dyg = (CONV_T *)dy + (n0 * g->Co + grp * g->Cog) * g->P;
            const CONV_T *dmat = dyg + r0 * g->OW;
            int64_t ldd = g->P;
            if (t.B > 1) {
                F(gather_ctx) k = {g, dyg, tmp, NULL, pc, true};
                cti_parallel_for(nb * g->Cog, 1 + CTI_GRAIN / g->P, F(gather_task), &k);
                dmat = tmp;
                ldd = pc;
            }
            if (direct) {
                F(gemm)(CblasTrans, CblasNoTrans, g->K, pc, g->Cog, wg, g->K, dmat, ldd, 0,
                        dxg + r0 * g->W, g->HW);
            } else {
                F(gemm)(CblasTrans, CblasNoTrans, g->K, pc, g->Cog, wg, g->K, dmat, ldd, 0, col,
                        pc);
                F(col_ctx) k = {g, NULL, dxg, col, r0, r1, pc, r0 == 0};
                cti_parallel_for(nb * g->Cg, F(col_grain)(g), F(col2im_task), &k);
            }
        }
    }
    free(col);
    free(tmp);
    return CT_OK;
}

/* dW is accumulated transposed, dW^T [K x Cog] += col [K x cols] * dY^T, per
 * group: OpenBLAS packs col faster in this orientation than as col^T (about
 * a sixth less time for a 64-channel 3x3 layer), and the transpose at the end
 * touches only Co * K values. */
static ct_status F(conv_backward_weight)(const geo *g, const CONV_T *dy, const CONV_T *x,
                                         CONV_T *dw) {
    tiling t = plan_tiles(g, CONV_TILE_COLS);
    bool direct = g->pointwise && t.B == 1;
    CONV_T *dwt = calloc((size_t)(g->Co * g->K), sizeof(CONV_T));
    CONV_T *col = direct ? NULL : malloc((size_t)(g->K * t.cols) * sizeof(CONV_T));
    CONV_T *tmp = t.B > 1 ? malloc((size_t)(g->Cog * t.cols) * sizeof(CONV_T)) : NULL;
    if (!dwt || (!direct && !col) || (t.B > 1 && !tmp)) {
        free(dwt);
        free(col);
        free(tmp);
        return cti_error(CT_ERR_OOM,
                         "ct_conv2d_backward_weight: out of memory for the im2col buffer");
    }
    for (tile tl = {0}; next_tile(g, &t, &tl);) {
        int64_t n0 = tl.n0, nb = tl.nb, r0 = tl.r0, r1 = tl.r1;
        int64_t pc = nb * (r1 - r0) * g->OW;
        for (int64_t grp = 0; grp < g->G; grp++) {
            const CONV_T *xg = x + (n0 * g->C + grp * g->Cg) * g->HW;
            CONV_T *dyg = (CONV_T *)dy + (n0 * g->Co + grp * g->Cog) * g->P;
            const CONV_T *dmat = dyg + r0 * g->OW, *cmat = col;
            int64_t ldd = g->P, ldc = pc;
            if (t.B > 1) {
                F(gather_ctx) k = {g, dyg, tmp, NULL, pc, true};
                cti_parallel_for(nb * g->Cog, 1 + CTI_GRAIN / g->P, F(gather_task), &k);
                dmat = tmp;
                ldd = pc;
            }
            if (direct) {
                cmat = xg + r0 * g->W;
                ldc = g->HW;
            } else {
                F(col_ctx) k = {g, xg, NULL, col, r0, r1, pc, false};
                cti_parallel_for(nb * g->Cg, F(col_grain)(g), F(im2col_task), &k);
            }
            F(gemm)(CblasNoTrans, CblasTrans, g->K, g->Cog, pc, cmat, ldc, dmat, ldd, 1,
                    dwt + grp * g->K * g->Cog, g->Cog);
        }
    }
    for (int64_t grp = 0; grp < g->G; grp++)
        for (int64_t co = 0; co < g->Cog; co++) {
            const CONV_T *src = dwt + grp * g->K * g->Cog + co;
            CONV_T *dst = dw + (grp * g->Cog + co) * g->K;
            for (int64_t kk = 0; kk < g->K; kk++) dst[kk] = src[kk * g->Cog];
        }
    free(dwt);
    free(col);
    free(tmp);
    return CT_OK;
}

#undef F
#endif
