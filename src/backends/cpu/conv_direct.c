/* Direct convolution, f32, AVX-512, for layers with few input channels per
 * group, stride 1, dilation 1: the forward and the weight gradient.
 *
 * With one to four input channels, im2col + GEMM is a thin product (depth
 * C * kh * kw: 9 for a one-channel 3x3 layer) that spends its time writing
 * and reading the im2col buffer. Here the input is copied once, zero-padded,
 * and each output row is computed 16 pixels at a time in registers, for a
 * block of 16 output channels: one vector load of the shifted input row per
 * (channel, tap), then one FMA per output channel with the weight broadcast
 * from memory. The weight gradient runs the same loops the other way: for
 * two output channels and up to nine taps at a time it accumulates
 * dy * (shifted input) over an image in 16 lanes, then adds the lanes. The
 * per-image sums are added in image order (in double), so the result does
 * not depend on the thread count or schedule.
 *
 * Images are processed in chunks whose padded copy stays under
 * DIRECT_CHUNK_FLOATS, so the extra memory is bounded whatever the batch. */
#include <stdlib.h>
#include <string.h>

#include "conv_direct.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define DIRECT_X86 1
#include <immintrin.h>
#endif

#ifdef DIRECT_X86

#define DIRECT_TARGET __attribute__((target("avx512f,fma")))

/* Output channels a register block holds, taps and output channels one
 * weight-gradient pass holds (2 x 9 accumulators: a 3x3 tap set at once). */
#define OCB 16
#define DW_TAPS 9
#define DW_OCS 2
#define DIRECT_CHUNK_FLOATS ((int64_t)1 << 22)

bool cti_direct_supported(void) { return cti_cpu_isa() >= CTI_ISA_AVX512; }

/* ---- the padded input ------------------------------------------------------------ */

/* Per (image, group, channel) a plane of Hp rows of Wp floats holding the
 * input at row ph, column pw and zeros around it; Wp leaves room for a full
 * 16-lane load at the last output column of every tap. */
typedef struct layout {
    int64_t Hp, Wp, plane; /* plane = Hp * Wp */
    int64_t taps;          /* C * kh * kw */
    int64_t nocb;          /* blocks of OCB output channels per group */
    int64_t chunk;         /* images per chunk */
} layout;

static layout make_layout(const cti_conv_f32_geo *g) {
    layout l;
    l.Hp = g->OH + g->kh - 1;
    l.Wp = (g->OW + 15) / 16 * 16 + g->kw - 1;
    l.plane = l.Hp * l.Wp;
    l.taps = g->C * g->kh * g->kw;
    l.nocb = (g->Co + OCB - 1) / OCB;
    int64_t per_image = g->G * g->C * l.plane;
    l.chunk = per_image > 0 ? DIRECT_CHUNK_FLOATS / per_image : g->N;
    if (l.chunk < 1) l.chunk = 1;
    if (l.chunk > g->N) l.chunk = g->N;
    return l;
}

/* Offset of tap t (channel, kernel row, kernel column) in a padded image. */
static int64_t tap_offset(const cti_conv_f32_geo *g, const layout *l, int64_t t) {
    int64_t c = t / (g->kh * g->kw), r = t % (g->kh * g->kw);
    return c * l->plane + (r / g->kw) * l->Wp + r % g->kw;
}

typedef struct pad_ctx {
    const cti_conv_f32_geo *g;
    const layout *l;
    const float *x; /* the chunk's first plane */
    float *xp;
} pad_ctx;

static void pad_task(int64_t begin, int64_t end, void *vctx) {
    const pad_ctx *k = vctx;
    const cti_conv_f32_geo *g = k->g;
    const layout *l = k->l;
    for (int64_t pl = begin; pl < end; pl++) {
        float *dst = k->xp + pl * l->plane;
        const float *src = k->x + pl * g->H * g->W;
        memset(dst, 0, (size_t)l->plane * sizeof(float));
        for (int64_t h = 0; h < g->H; h++)
            memcpy(dst + (h + g->ph) * l->Wp + g->pw, src + h * g->W, (size_t)g->W * sizeof(float));
    }
}

static void pad_chunk(const cti_conv_f32_geo *g, const layout *l, const float *x, int64_t n0,
                      int64_t nb, float *xp) {
    pad_ctx k = {g, l, x + n0 * g->G * g->C * g->H * g->W, xp};
    int64_t per = l->plane > 0 ? l->plane : 1;
    cti_parallel_for(nb * g->G * g->C, 1 + CTI_GRAIN / per, pad_task, &k);
}

static __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* ---- forward ---------------------------------------------------------------------- */

typedef struct fwd_ctx {
    const cti_conv_f32_geo *g;
    const layout *l;
    const float *xp;   /* padded chunk */
    const float *wpk;  /* [G][nocb][taps][OCB], zeros past Co */
    const float *bpk;  /* [G][nocb][OCB] or NULL */
    const int64_t *off; /* [taps] */
    float *y;
    int64_t n0, nb, nrb, rb; /* chunk images; row blocks of rb rows */
} fwd_ctx;

/* Output rows [r0, r1) of one image, one group, one block of output channels. */
DIRECT_TARGET static void fwd_rows(const fwd_ctx *k, const float *x, const float *wpk, const float *bpk,
                        float *y, int nb, int64_t r0, int64_t r1) {
    const cti_conv_f32_geo *g = k->g;
    const int64_t Wp = k->l->Wp, taps = k->l->taps, P = g->OH * g->OW;
    for (int64_t oh = r0; oh < r1; oh++)
        for (int64_t ow0 = 0; ow0 < g->OW; ow0 += 16) {
            __m512 acc[OCB];
#pragma GCC unroll 16
            for (int o = 0; o < OCB; o++) acc[o] = bpk ? _mm512_set1_ps(bpk[o]) : _mm512_setzero_ps();
            const float *row = x + oh * Wp + ow0;
            for (int64_t t = 0; t < taps; t++) {
                __m512 xv = _mm512_loadu_ps(row + k->off[t]);
                const float *wt = wpk + t * OCB;
#pragma GCC unroll 16
                for (int o = 0; o < OCB; o++) acc[o] = _mm512_fmadd_ps(_mm512_set1_ps(wt[o]), xv, acc[o]);
            }
            __mmask16 m = tail_mask(g->OW - ow0);
            float *out = y + oh * g->OW + ow0;
            for (int o = 0; o < nb; o++) _mm512_mask_storeu_ps(out + o * P, m, acc[o]);
        }
}

static void fwd_task(int64_t begin, int64_t end, void *vctx) {
    const fwd_ctx *k = vctx;
    const cti_conv_f32_geo *g = k->g;
    const layout *l = k->l;
    for (int64_t u = begin; u < end; u++) {
        int64_t rbi = u % k->nrb, rest = u / k->nrb;
        int64_t ocb = rest % l->nocb, img = rest / l->nocb; /* img: chunk image * G + group */
        int64_t n = img / g->G, grp = img % g->G;
        int64_t oc0 = ocb * OCB, r0 = rbi * k->rb;
        int64_t r1 = r0 + k->rb < g->OH ? r0 + k->rb : g->OH;
        int nb = (int)(g->Co - oc0 < OCB ? g->Co - oc0 : OCB);
        const float *x = k->xp + img * g->C * l->plane;
        const float *wpk = k->wpk + (grp * l->nocb + ocb) * l->taps * OCB;
        const float *bpk = k->bpk ? k->bpk + (grp * l->nocb + ocb) * OCB : NULL;
        float *y = k->y + ((k->n0 + n) * g->G * g->Co + grp * g->Co + oc0) * g->OH * g->OW;
        fwd_rows(k, x, wpk, bpk, y, nb, r0, r1);
    }
}

ct_status cti_direct_forward(const cti_conv_f32_geo *g, const float *x, const float *w,
                             const float *bias, float *y) {
    layout l = make_layout(g);
    int64_t nw = g->G * l.nocb * l.taps * OCB;
    float *xp = malloc((size_t)(l.chunk * g->G * g->C * l.plane) * sizeof(float));
    float *wpk = calloc((size_t)nw, sizeof(float));
    float *bpk = bias ? calloc((size_t)(g->G * l.nocb * OCB), sizeof(float)) : NULL;
    int64_t *off = malloc((size_t)l.taps * sizeof(int64_t));
    if (!xp || !wpk || (bias && !bpk) || !off) {
        free(xp), free(wpk), free(bpk), free(off);
        return cti_error(CT_ERR_OOM, "ct_conv2d: out of memory for the padded input");
    }
    /* w [G*Co][taps] -> [G][nocb][taps][OCB] */
    for (int64_t grp = 0; grp < g->G; grp++)
        for (int64_t oc = 0; oc < g->Co; oc++)
            for (int64_t t = 0; t < l.taps; t++)
                wpk[((grp * l.nocb + oc / OCB) * l.taps + t) * OCB + oc % OCB] =
                    w[(grp * g->Co + oc) * l.taps + t];
    if (bias)
        for (int64_t grp = 0; grp < g->G; grp++)
            for (int64_t oc = 0; oc < g->Co; oc++)
                bpk[(grp * l.nocb + oc / OCB) * OCB + oc % OCB] = bias[grp * g->Co + oc];
    for (int64_t t = 0; t < l.taps; t++) off[t] = tap_offset(g, &l, t);

    /* Enough tasks for the pool: split rows when there are few (image, block) units. */
    for (int64_t n0 = 0; n0 < g->N; n0 += l.chunk) {
        int64_t nb = g->N - n0 < l.chunk ? g->N - n0 : l.chunk;
        pad_chunk(g, &l, x, n0, nb, xp);
        int64_t units = nb * g->G * l.nocb, nrb = units >= 32 ? 1 : (32 + units - 1) / units;
        if (nrb > g->OH) nrb = g->OH;
        int64_t rb = (g->OH + nrb - 1) / nrb;
        nrb = (g->OH + rb - 1) / rb;
        fwd_ctx k = {g, &l, xp, wpk, bpk, off, y, n0, nb, nrb, rb};
        int64_t work = rb * ((g->OW + 15) / 16) * l.taps * OCB; /* FMAs a task */
        cti_parallel_for(units * nrb, 1 + CTI_GRAIN / (work > 0 ? work : 1), fwd_task, &k);
    }
    free(xp), free(wpk), free(bpk), free(off);
    return CT_OK;
}

/* ---- weight gradient --------------------------------------------------------------- */

typedef struct dw_ctx {
    const cti_conv_f32_geo *g;
    const layout *l;
    const float *xp; /* padded chunk */
    const float *dy;
    const int64_t *off;
    float *part; /* [chunk images][G][nocb][OCB][taps] */
    int64_t n0;
} dw_ctx;

/* sum over the image of dy[o] * x shifted by tap, for output channels o0 and
 * o0 + 1 (when has1) and taps [t0, t0 + nt), into part[o][t]. */
DIRECT_TARGET static void dw_pass(const dw_ctx *k, const float *x, const float *dy, float *part, int64_t o0,
                       bool has1, int64_t t0, int nt) {
    const cti_conv_f32_geo *g = k->g;
    const int64_t Wp = k->l->Wp, taps = k->l->taps, P = g->OH * g->OW;
    int64_t off[DW_TAPS];
    for (int t = 0; t < DW_TAPS; t++) off[t] = t < nt ? k->off[t0 + t] : 0;
    __m512 a0[DW_TAPS], a1[DW_TAPS];
#pragma GCC unroll 9
    for (int t = 0; t < DW_TAPS; t++) a0[t] = a1[t] = _mm512_setzero_ps();
    const float *d0 = dy + o0 * P, *d1 = dy + (has1 ? o0 + 1 : o0) * P;
    for (int64_t oh = 0; oh < g->OH; oh++)
        for (int64_t ow0 = 0; ow0 < g->OW; ow0 += 16) {
            __mmask16 m = tail_mask(g->OW - ow0);
            __m512 v0 = _mm512_maskz_loadu_ps(m, d0 + oh * g->OW + ow0);
            __m512 v1 = _mm512_maskz_loadu_ps(m, d1 + oh * g->OW + ow0);
            const float *row = x + oh * Wp + ow0;
#pragma GCC unroll 9
            for (int t = 0; t < DW_TAPS; t++) {
                __m512 xv = _mm512_loadu_ps(row + off[t]);
                a0[t] = _mm512_fmadd_ps(v0, xv, a0[t]);
                a1[t] = _mm512_fmadd_ps(v1, xv, a1[t]);
            }
        }
    /* Every accumulator is folded (a loop bound the compiler knows keeps
     * them in registers), and only the taps in use are written. */
    float r0[DW_TAPS], r1[DW_TAPS];
#pragma GCC unroll 9
    for (int t = 0; t < DW_TAPS; t++) {
        r0[t] = _mm512_reduce_add_ps(a0[t]);
        r1[t] = _mm512_reduce_add_ps(a1[t]);
    }
    for (int t = 0; t < nt; t++) {
        part[o0 * taps + t0 + t] = r0[t];
        if (has1) part[(o0 + 1) * taps + t0 + t] = r1[t];
    }
}

static void dw_task(int64_t begin, int64_t end, void *vctx) {
    const dw_ctx *k = vctx;
    const cti_conv_f32_geo *g = k->g;
    const layout *l = k->l;
    for (int64_t u = begin; u < end; u++) {
        int64_t ocb = u % l->nocb, img = u / l->nocb; /* img: chunk image * G + group */
        int64_t n = img / g->G, grp = img % g->G, oc0 = ocb * OCB;
        int64_t nb = g->Co - oc0 < OCB ? g->Co - oc0 : OCB;
        const float *x = k->xp + img * g->C * l->plane;
        const float *dy = k->dy + ((k->n0 + n) * g->G * g->Co + grp * g->Co + oc0) * g->OH * g->OW;
        float *part = k->part + u * OCB * l->taps;
        for (int64_t o = 0; o < nb; o += DW_OCS)
            for (int64_t t0 = 0; t0 < l->taps; t0 += DW_TAPS) {
                int nt = (int)(l->taps - t0 < DW_TAPS ? l->taps - t0 : DW_TAPS);
                dw_pass(k, x, dy, part, o, o + 1 < nb, t0, nt);
            }
    }
}

ct_status cti_direct_backward_weight(const cti_conv_f32_geo *g, const float *dy, const float *x,
                                     float *dw) {
    layout l = make_layout(g);
    int64_t per_chunk = l.chunk * g->G * l.nocb * OCB * l.taps;
    int64_t nout = g->G * g->Co * l.taps;
    float *xp = malloc((size_t)(l.chunk * g->G * g->C * l.plane) * sizeof(float));
    float *part = calloc((size_t)per_chunk, sizeof(float));
    double *sum = calloc((size_t)(nout > 0 ? nout : 1), sizeof(double));
    int64_t *off = malloc((size_t)l.taps * sizeof(int64_t));
    if (!xp || !part || !sum || !off) {
        free(xp), free(part), free(sum), free(off);
        return cti_error(CT_ERR_OOM, "ct_conv2d_backward_weight: out of memory for the padded input");
    }
    for (int64_t t = 0; t < l.taps; t++) off[t] = tap_offset(g, &l, t);
    for (int64_t n0 = 0; n0 < g->N; n0 += l.chunk) {
        int64_t nb = g->N - n0 < l.chunk ? g->N - n0 : l.chunk;
        pad_chunk(g, &l, x, n0, nb, xp);
        dw_ctx k = {g, &l, xp, dy, off, part, n0};
        int64_t work = g->OH * ((g->OW + 15) / 16) * OCB * l.taps; /* FMAs a unit */
        cti_parallel_for(nb * g->G * l.nocb, 1 + CTI_GRAIN / (work > 0 ? work : 1), dw_task, &k);
        /* images in order, so the sums do not depend on the schedule */
        for (int64_t n = 0; n < nb; n++)
            for (int64_t grp = 0; grp < g->G; grp++)
                for (int64_t oc = 0; oc < g->Co; oc++) {
                    const float *p = part + (((n * g->G + grp) * l.nocb + oc / OCB) * OCB + oc % OCB) * l.taps;
                    double *s = sum + (grp * g->Co + oc) * l.taps;
                    for (int64_t t = 0; t < l.taps; t++) s[t] += p[t];
                }
    }
    for (int64_t i = 0; i < nout; i++) dw[i] = (float)sum[i];
    free(xp), free(part), free(sum), free(off);
    return CT_OK;
}

#else /* not x86-64 with GCC/Clang: conv.c keeps im2col + GEMM */

bool cti_direct_supported(void) { return false; }

ct_status cti_direct_forward(const cti_conv_f32_geo *g, const float *x, const float *w,
                             const float *bias, float *y) {
    (void)g, (void)x, (void)w, (void)bias, (void)y;
    return cti_error(CT_ERR_UNSUPPORTED, "ct_conv2d: direct kernels need x86-64 AVX-512");
}

ct_status cti_direct_backward_weight(const cti_conv_f32_geo *g, const float *dy, const float *x,
                                     float *dw) {
    (void)g, (void)dy, (void)x, (void)dw;
    return cti_error(CT_ERR_UNSUPPORTED,
                     "ct_conv2d_backward_weight: direct kernels need x86-64 AVX-512");
}

#endif
