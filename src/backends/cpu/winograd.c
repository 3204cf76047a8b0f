/* Winograd F(2x2, 3x3) convolution, f32, AVX-512.
 *
 * Each 2x2 block of outputs (a tile) comes from a 4x4 input patch d:
 * y = A^T [(G g G^T) . (B^T d B)] A, summed over input channels, where the
 * products at the 16 positions xi of the 4x4 "Winograd domain" are 16
 * independent GEMMs [Co x C] x [C x tiles]. That is 2.25 times fewer
 * multiplications than direct convolution, and the transforms add and
 * subtract only (the weight's has halves), so the rounding stays close to
 * direct convolution's. F(4x4, 3x3) would save more but loses about two
 * decimal digits in f32.
 *
 * The work is cut into blocks of a few tile rows (of one or more images) so
 * that one block's transformed input (16 x C x tiles) and products (16 x Co x
 * tiles) stay in L2; the blocks go to the pool's threads dynamically. Inside a
 * block: input transform, 16 GEMMs with an AVX-512 register-blocked kernel
 * (OpenBLAS would thread and pack each small product), output transform
 * written straight to y. The transforms run 16 tiles of a tile row at a time,
 * one per vector lane, reading rows of the zero-padded input.
 *
 * The input gradient is the same convolution of dy with the weight flipped
 * and its channel axes swapped, padding 2 - p. The weight gradient is the
 * adjoint of the forward in the Winograd domain: dU[xi] = sum over tiles of
 * (A dY A^T)[xi] x (B^T d B)[xi]^T, then dw = G^T dU G; the sum over tiles is
 * a GEMM with the tiles as its depth, so the transformed input is stored
 * transposed (tiles x channels). Partial sums per slab of blocks are added in
 * a fixed order, so results do not depend on the thread count or schedule. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "winograd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define WINO_X86 1
#include <immintrin.h>
#endif

#ifdef WINO_X86

#define WT __attribute__((target("avx512f,fma")))
#define WTI __attribute__((target("avx512f,fma"), always_inline)) inline

bool cti_wino_supported(void) { return cti_cpu_isa() >= CTI_ISA_AVX512; }

/* ---- plan ------------------------------------------------------------------------ */

/* Target tiles per block: 16 x (C + Co) x tiles floats must sit in L2. */
#define WINO_BLOCK_TILES 128

/* One convolution in forward form (the input gradient is planned as one too):
 * Ci -> Co channels per group, Hi x Wi -> Ho x Wo, padding ph/pw. */
typedef struct plan {
    int64_t N, G, Ci, Co, Hi, Wi, Ho, Wo, ph, pw;
    int64_t TH, TW;   /* tile rows and tiles per row */
    int64_t nchunk;   /* 16-tile chunks per tile row */
    int64_t tws;      /* tile-row stride in the block matrices: TW, or TW
                       * rounded up to 16 so the transforms' stores align */
    int64_t R;        /* tile rows per block */
    int64_t Tpad;     /* R * TW rounded up to 16 */
    int64_t ld;       /* row stride of the per-block matrices */
    int64_t nblocks;  /* over all N * TH tile rows */
} plan;

static plan make_plan(int64_t N, int64_t G, int64_t Ci, int64_t Co, int64_t Hi, int64_t Wi,
                      int64_t Ho, int64_t Wo, int64_t ph, int64_t pw) {
    plan p = {N, G, Ci, Co, Hi, Wi, Ho, Wo, ph, pw, 0, 0, 0, 0, 0, 0, 0, 0};
    p.TH = (Ho + 1) / 2;
    p.TW = (Wo + 1) / 2;
    p.nchunk = (p.TW + 15) / 16;
    /* aligned rows cost GEMM columns: worth it up to 1/7 more (measured
     * at 28 tiles per row, padded to 32) */
    p.tws = (16 * p.nchunk - p.TW) * 7 <= p.TW ? 16 * p.nchunk : p.TW;
    int64_t rows = N * p.TH;
    int64_t R = (WINO_BLOCK_TILES + p.tws - 1) / p.tws;
    if (R > rows) R = rows;
    if (R < 1) R = 1;
    int64_t nb = (rows + R - 1) / R;
    if (nb < 1) nb = 1; /* callers pass nonempty shapes; keeps the division defined */
    p.R = (rows + nb - 1) / nb; /* even blocks, no small tail */
    p.nblocks = (rows + p.R - 1) / p.R;
    p.Tpad = (p.R * p.tws + 15) / 16 * 16;
    p.ld = p.Tpad % 1024 == 0 ? p.Tpad + 16 : p.Tpad; /* no 4 KiB aliasing between rows */
    return p;
}

/* ---- vector helpers ------------------------------------------------------------------ */

static WTI __mmask16 lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* Lanes e of a 16-float load at column c0 that fall inside [0, W). */
static WTI __mmask16 span(int64_t c0, int64_t W) {
    return (__mmask16)(lanes(W - c0) & ~lanes(-c0));
}

/* The input rows 2i - ph .. 2i - ph + 3 of plane, NULL where they fall in
 * the padding. */
static void tile_rows(const plan *p, const float *plane, int64_t i, const float *rows[4]) {
    for (int q = 0; q < 4; q++) {
        int64_t ih = 2 * i - p->ph + q;
        rows[q] = plane && ih >= 0 && ih < p->Hi ? plane + ih * p->Wi : NULL;
    }
}

/* B^T d B for the 16 tiles of chunk k of a tile row: v[4 r + s]. The patches
 * are read straight from the input rows with masked loads, which read the
 * padding as zeros (masked-off lanes are never accessed). */
static WTI void input_chunk(const float *const rows[4], int64_t Wi, int64_t pw, int64_t k,
                            __m512 v[16]) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    int64_t c0 = 32 * k - pw;
    __mmask16 m0 = span(c0, Wi), m1 = span(c0 + 16, Wi), m2 = span(c0 + 2, Wi),
              m3 = span(c0 + 18, Wi);
    __m512 h[4][4];
    for (int q = 0; q < 4; q++) {
        __m512 d0, d1, d2, d3;
        if (rows[q]) {
            const float *s = rows[q] + c0;
            __m512 a0 = _mm512_maskz_loadu_ps(m0, s), a1 = _mm512_maskz_loadu_ps(m1, s + 16);
            __m512 b0 = _mm512_maskz_loadu_ps(m2, s + 2), b1 = _mm512_maskz_loadu_ps(m3, s + 18);
            d0 = _mm512_permutex2var_ps(a0, ev, a1);
            d1 = _mm512_permutex2var_ps(a0, od, a1);
            d2 = _mm512_permutex2var_ps(b0, ev, b1);
            d3 = _mm512_permutex2var_ps(b0, od, b1);
        } else {
            d0 = d1 = d2 = d3 = _mm512_setzero_ps();
        }
        h[q][0] = _mm512_sub_ps(d0, d2);
        h[q][1] = _mm512_add_ps(d1, d2);
        h[q][2] = _mm512_sub_ps(d2, d1);
        h[q][3] = _mm512_sub_ps(d1, d3);
    }
    for (int s = 0; s < 4; s++) {
        v[s] = _mm512_sub_ps(h[0][s], h[2][s]);
        v[4 + s] = _mm512_add_ps(h[1][s], h[2][s]);
        v[8 + s] = _mm512_sub_ps(h[2][s], h[1][s]);
        v[12 + s] = _mm512_sub_ps(h[1][s], h[3][s]);
    }
}

/* Transforms tile row i of one channel's plane into dst[xi * xs + t]. */
static WT void input_row(const plan *p, const float *plane, int64_t i, float *dst, int64_t xs) {
    const float *rows[4];
    tile_rows(p, plane, i, rows);
    for (int64_t k = 0; k < p->nchunk; k++) {
        __m512 v[16];
        input_chunk(rows, p->Wi, p->pw, k, v);
        __mmask16 m = lanes(p->TW - 16 * k);
        for (int x = 0; x < 16; x++) _mm512_mask_storeu_ps(dst + x * xs + 16 * k, m, v[x]);
    }
}

/* A^T M A (+ bias) for one tile row of one output channel: src[xi * xs + t]
 * -> output rows 2i, 2i + 1 of plane. */
static WT void output_row(const plan *p, const float *src, int64_t xs, float bias, float *plane,
                          int64_t i) {
    const __m512i il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i ih = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30,
                                         15, 31);
    const __m512 b = _mm512_set1_ps(bias);
    int nrows = 2 * i + 1 < p->Ho ? 2 : 1;
    for (int64_t k = 0; k < p->nchunk; k++) {
        __m512 m[16], u[2][4];
        for (int x = 0; x < 16; x++) m[x] = _mm512_loadu_ps(src + x * xs + 16 * k);
        for (int s = 0; s < 4; s++) {
            u[0][s] = _mm512_add_ps(_mm512_add_ps(m[s], m[4 + s]), m[8 + s]);
            u[1][s] = _mm512_sub_ps(_mm512_sub_ps(m[4 + s], m[8 + s]), m[12 + s]);
        }
        int64_t nv = p->Wo - 32 * k;
        __mmask16 mlo = lanes(nv), mhi = lanes(nv - 16);
        for (int a = 0; a < nrows; a++) {
            __m512 o0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(u[a][0], u[a][1]), u[a][2]), b);
            __m512 o1 = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(u[a][1], u[a][2]), u[a][3]), b);
            float *row = plane + (2 * i + a) * p->Wo + 32 * k;
            _mm512_mask_storeu_ps(row, mlo, _mm512_permutex2var_ps(o0, il, o1));
            _mm512_mask_storeu_ps(row + 16, mhi, _mm512_permutex2var_ps(o0, ih, o1));
        }
    }
}

/* A dY A^T for one tile row of one output channel of dy: the adjoint of
 * output_row, outputs past the edge read as zero. */
static WT void grad_row(const plan *p, const float *plane, int64_t i, float *dst, int64_t xs) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    int nrows = 2 * i + 1 < p->Ho ? 2 : 1;
    for (int64_t k = 0; k < p->nchunk; k++) {
        int64_t nv = p->Wo - 32 * k;
        __mmask16 mlo = lanes(nv), mhi = lanes(nv - 16);
        __m512 d[2][2];
        for (int a = 0; a < 2; a++) {
            if (a < nrows) {
                const float *row = plane + (2 * i + a) * p->Wo + 32 * k;
                __m512 e0 = _mm512_maskz_loadu_ps(mlo, row), e1 = _mm512_maskz_loadu_ps(mhi, row + 16);
                d[a][0] = _mm512_permutex2var_ps(e0, ev, e1);
                d[a][1] = _mm512_permutex2var_ps(e0, od, e1);
            } else {
                d[a][0] = d[a][1] = _mm512_setzero_ps();
            }
        }
        /* w[r][b] = sum_a A[r][a] dY[a][b]; then M[r][s] = sum_b w[r][b] A[s][b] */
        __m512 w[4][2];
        for (int bb = 0; bb < 2; bb++) {
            w[0][bb] = d[0][bb];
            w[1][bb] = _mm512_add_ps(d[0][bb], d[1][bb]);
            w[2][bb] = _mm512_sub_ps(d[0][bb], d[1][bb]);
            w[3][bb] = _mm512_sub_ps(_mm512_setzero_ps(), d[1][bb]);
        }
        __mmask16 m = lanes(p->TW - 16 * k);
        for (int r = 0; r < 4; r++) {
            __m512 s1 = _mm512_add_ps(w[r][0], w[r][1]), s2 = _mm512_sub_ps(w[r][0], w[r][1]);
            __m512 s3 = _mm512_sub_ps(_mm512_setzero_ps(), w[r][1]);
            _mm512_mask_storeu_ps(dst + (4 * r) * xs + 16 * k, m, w[r][0]);
            _mm512_mask_storeu_ps(dst + (4 * r + 1) * xs + 16 * k, m, s1);
            _mm512_mask_storeu_ps(dst + (4 * r + 2) * xs + 16 * k, m, s2);
            _mm512_mask_storeu_ps(dst + (4 * r + 3) * xs + 16 * k, m, s3);
        }
    }
}

/* Transposes the 16 x 16 block r[row] (lane = column) in place. */
static WTI void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* r[4i + j] now holds rows 4i..4i+3, column j of each 4-column lane group */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    }
}

/* ---- GEMM: C[M x N] (+)= A[M x K] B[K x N], row-major, N a multiple of 16 ------------- */

#define MR 6
#define NVMAX 4
#define KC 128

static WTI void micro(const int mr, const int nv, int64_t K, const float *restrict A, int64_t lda,
                      const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc,
                      bool acc) {
    __m512 c[MR][NVMAX];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++)
            c[i][j] = acc ? _mm512_loadu_ps(C + i * ldc + 16 * j) : _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 b[NVMAX];
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++) b[j] = _mm512_loadu_ps(B + k * ldb + 16 * j);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512 a = _mm512_set1_ps(A[i * lda + k]);
#pragma GCC unroll 4
            for (int j = 0; j < nv; j++) c[i][j] = _mm512_fmadd_ps(a, b[j], c[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++) _mm512_storeu_ps(C + i * ldc + 16 * j, c[i][j]);
}

#define MICRO_CASE(mr, nv)                                                    \
    case (mr) * 8 + (nv):                                                     \
        micro(mr, nv, K, A, lda, B, ldb, C, ldc, acc);                        \
        break;
#define MICRO_ROW(mr) MICRO_CASE(mr, 1) MICRO_CASE(mr, 2) MICRO_CASE(mr, 3) MICRO_CASE(mr, 4)

static WT void micro_any(int mr, int nv, int64_t K, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc, bool acc) {
    switch (mr * 8 + nv) {
        MICRO_ROW(1)
        MICRO_ROW(2)
        MICRO_ROW(3)
        MICRO_ROW(4)
        MICRO_ROW(5)
        MICRO_ROW(6)
    default: break;
    }
}

static WT void gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float *C, int64_t ldc, bool acc) {
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t kc = K - k0 < KC ? K - k0 : KC;
        bool ac = acc || k0 > 0;
        for (int64_t n0 = 0; n0 < N; n0 += 16 * NVMAX) {
            int nv = (int)((N - n0) / 16 < NVMAX ? (N - n0) / 16 : NVMAX);
            for (int64_t m0 = 0; m0 < M; m0 += MR) {
                int mr = (int)(M - m0 < MR ? M - m0 : MR);
                micro_any(mr, nv, kc, A + m0 * lda + k0, lda, B + k0 * ldb + n0, ldb,
                          C + m0 * ldc + n0, ldc, ac);
            }
        }
    }
}

/* ---- weight transforms (double precision, rounded once) ------------------------------------ */

static const double Gm[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};

/* u[xi] = (G g G^T)[xi] for a 3x3 kernel g (element (i, j) at g[i * si + j * sj]). */
static void weight_tile(const float *g, int64_t si, int64_t sj, double u[16]) {
    double t[4][3];
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 3; j++)
            t[r][j] = Gm[r][0] * g[j * sj] + Gm[r][1] * g[si + j * sj] + Gm[r][2] * g[2 * si + j * sj];
    for (int r = 0; r < 4; r++)
        for (int s = 0; s < 4; s++)
            u[4 * r + s] = t[r][0] * Gm[s][0] + t[r][1] * Gm[s][1] + t[r][2] * Gm[s][2];
}

/* U[grp][xi][o][c] for the plan's Ci -> Co. Forward: g = w[grp*Co + o][c];
 * input gradient (flip): g = w[grp*Ci + c][o] rotated by 180 degrees, where w
 * is the forward weight [G*Ci, Co, 3, 3] in the plan's swapped terms. */
static float *make_u(const plan *p, const float *w, bool flip) {
    int64_t per = p->Co * p->Ci;
    float *U = malloc((size_t)(p->G * 16 * per) * sizeof(float));
    if (!U) return NULL;
    for (int64_t grp = 0; grp < p->G; grp++)
        for (int64_t o = 0; o < p->Co; o++)
            for (int64_t c = 0; c < p->Ci; c++) {
                double u[16];
                if (flip)
                    weight_tile(w + ((grp * p->Ci + c) * p->Co + o) * 9 + 8, -3, -1, u);
                else
                    weight_tile(w + ((grp * p->Co + o) * p->Ci + c) * 9, 3, 1, u);
                for (int x = 0; x < 16; x++)
                    U[(grp * 16 + x) * per + o * p->Ci + c] = (float)u[x];
            }
    return U;
}

/* ---- forward (and input gradient) ----------------------------------------------------- */

typedef struct fwd_ctx {
    const plan *p;
    const float *x, *U, *bias;
    float *y;
    atomic_int_fast64_t next, done;
} fwd_ctx;

static float *zalloc(int64_t n) {
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    float *q = aligned_alloc(64, bytes);
    if (q) memset(q, 0, bytes);
    return q;
}

static WT void fwd_block(const fwd_ctx *k, int64_t b, float *V, float *Y) {
    const plan *p = k->p;
    int64_t g0 = b * p->R, nr = p->N * p->TH - g0 < p->R ? p->N * p->TH - g0 : p->R;
    int64_t T = (nr * p->tws + 15) / 16 * 16, HWi = p->Hi * p->Wi, HWo = p->Ho * p->Wo;
    for (int64_t grp = 0; grp < p->G; grp++) {
        for (int64_t c = 0; c < p->Ci; c++)
            for (int64_t r = 0; r < nr; r++) {
                int64_t n = (g0 + r) / p->TH, i = (g0 + r) % p->TH;
                const float *plane = k->x + ((n * p->G + grp) * p->Ci + c) * HWi;
                input_row(p, plane, i, V + c * p->ld + r * p->tws, p->Ci * p->ld);
            }
        const float *U = k->U + grp * 16 * p->Co * p->Ci;
        for (int x = 0; x < 16; x++)
            gemm(p->Co, T, p->Ci, U + x * p->Co * p->Ci, p->Ci, V + x * p->Ci * p->ld, p->ld,
                 Y + x * p->Co * p->ld, p->ld, false);
        for (int64_t o = 0; o < p->Co; o++) {
            float bv = k->bias ? k->bias[grp * p->Co + o] : 0.0f;
            for (int64_t r = 0; r < nr; r++) {
                int64_t n = (g0 + r) / p->TH, i = (g0 + r) % p->TH;
                output_row(p, Y + o * p->ld + r * p->tws, p->Co * p->ld, bv,
                           k->y + ((n * p->G + grp) * p->Co + o) * HWo, i);
            }
        }
    }
}

static void fwd_task(int64_t begin, int64_t end, void *vctx) {
    (void)begin;
    (void)end;
    fwd_ctx *k = vctx;
    const plan *p = k->p;
    float *V = zalloc(16 * p->Ci * p->ld + 16);
    float *Y = zalloc(16 * p->Co * p->ld + 16);
    if (V && Y) {
        for (;;) {
            int64_t b = atomic_fetch_add(&k->next, 1);
            if (b >= p->nblocks) break;
            fwd_block(k, b, V, Y);
            atomic_fetch_add(&k->done, 1);
        }
    }
    free(V);
    free(Y);
}

static ct_status run_forward(const plan *p, const float *x, const float *U, const float *bias,
                             float *y, const char *op) {
    fwd_ctx k = {.p = p, .x = x, .U = U, .bias = bias, .y = y};
    atomic_init(&k.next, 0);
    atomic_init(&k.done, 0);
    int64_t nt = cti_cpu_threads();
    if (nt > p->nblocks) nt = p->nblocks;
    cti_parallel_for(nt, 1, fwd_task, &k);
    if (atomic_load(&k.done) < p->nblocks)
        return cti_error(CT_ERR_OOM, "%s: out of memory for the Winograd buffers", op);
    return CT_OK;
}

ct_status cti_wino_forward(const cti_conv_f32_geo *g, const float *x, const float *w,
                           const float *bias, float *y) {
    plan p = make_plan(g->N, g->G, g->C, g->Co, g->H, g->W, g->OH, g->OW, g->ph, g->pw);
    float *U = make_u(&p, w, false);
    if (!U) return cti_error(CT_ERR_OOM, "ct_conv2d: out of memory for the Winograd weights");
    ct_status s = run_forward(&p, x, U, bias, y, "ct_conv2d");
    free(U);
    return s;
}

ct_status cti_wino_backward_input(const cti_conv_f32_geo *g, const float *dy, const float *w,
                                  float *dx) {
    /* dx = dy (*) rot180(w) with the channel axes swapped, padding 2 - p */
    plan p = make_plan(g->N, g->G, g->Co, g->C, g->OH, g->OW, g->H, g->W, 2 - g->ph, 2 - g->pw);
    float *U = make_u(&p, w, true);
    if (!U)
        return cti_error(CT_ERR_OOM,
                         "ct_conv2d_backward_input: out of memory for the Winograd weights");
    ct_status s = run_forward(&p, dy, U, NULL, dx, "ct_conv2d_backward_input");
    free(U);
    return s;
}

/* ---- weight gradient ------------------------------------------------------------------- */

/* Partial sums are kept per slab of consecutive blocks, at most this many. */
#define WINO_SLABS 16

typedef struct bwd_ctx {
    const plan *p;
    const float *dy, *x;
    float *parts; /* nslabs x G x 16 x Co x Cpad */
    int64_t nslabs, Cpad;
    atomic_int_fast64_t next, done;
} bwd_ctx;

typedef struct bwd_scratch {
    float *M, *Vt, *stage;
} bwd_scratch;

static WT void bwd_block(const bwd_ctx *k, int64_t b, const bwd_scratch *s, float *part) {
    const plan *p = k->p;
    int64_t g0 = b * p->R, nr = p->N * p->TH - g0 < p->R ? p->N * p->TH - g0 : p->R;
    int64_t T = nr * p->tws, HWi = p->Hi * p->Wi, HWo = p->Ho * p->Wo, Cpad = k->Cpad;
    int64_t vts = (p->Tpad + 16) * Cpad; /* per xi in Vt */
    for (int64_t grp = 0; grp < p->G; grp++) {
        for (int64_t o = 0; o < p->Co; o++)
            for (int64_t r = 0; r < nr; r++) {
                int64_t n = (g0 + r) / p->TH, i = (g0 + r) % p->TH;
                grad_row(p, k->dy + ((n * p->G + grp) * p->Co + o) * HWo, i,
                         s->M + o * p->ld + r * p->tws, p->Co * p->ld);
            }
        for (int64_t c0 = 0; c0 < Cpad; c0 += 16)
            for (int64_t r = 0; r < nr; r++) {
                int64_t n = (g0 + r) / p->TH, i = (g0 + r) % p->TH;
                const float *rows[16][4];
                for (int cc = 0; cc < 16; cc++) {
                    int64_t c = c0 + cc;
                    tile_rows(p, c < p->Ci ? k->x + ((n * p->G + grp) * p->Ci + c) * HWi : NULL,
                              i, rows[cc]);
                }
                /* rows past this tile row's end are rewritten by the next row
                 * or lie past T, outside the GEMM */
                for (int64_t ch = 0; ch < p->nchunk; ch++) {
                    for (int cc = 0; cc < 16; cc++) {
                        __m512 v[16];
                        input_chunk(rows[cc], p->Wi, p->pw, ch, v);
                        for (int x = 0; x < 16; x++) _mm512_store_ps(s->stage + (x * 16 + cc) * 16, v[x]);
                    }
                    float *dst = s->Vt + (r * p->tws + 16 * ch) * Cpad + c0;
                    for (int x = 0; x < 16; x++) {
                        __m512 t[16];
                        for (int cc = 0; cc < 16; cc++) t[cc] = _mm512_load_ps(s->stage + (x * 16 + cc) * 16);
                        transpose16(t);
                        for (int l = 0; l < 16; l++) _mm512_storeu_ps(dst + x * vts + l * Cpad, t[l]);
                    }
                }
            }
        float *pg = part + grp * 16 * p->Co * Cpad;
        for (int x = 0; x < 16; x++)
            gemm(p->Co, Cpad, T, s->M + x * p->Co * p->ld, p->ld, s->Vt + x * vts, Cpad,
                 pg + x * p->Co * Cpad, Cpad, true);
    }
}

static void bwd_task(int64_t begin, int64_t end, void *vctx) {
    (void)begin;
    (void)end;
    bwd_ctx *k = vctx;
    const plan *p = k->p;
    bwd_scratch s;
    s.M = zalloc(16 * p->Co * p->ld + 16);
    s.Vt = zalloc(16 * (p->Tpad + 16) * k->Cpad);
    s.stage = zalloc(16 * 16 * 16);
    int64_t per = p->G * 16 * p->Co * k->Cpad;
    if (s.M && s.Vt && s.stage) {
        for (;;) {
            int64_t sl = atomic_fetch_add(&k->next, 1);
            if (sl >= k->nslabs) break;
            float *part = k->parts + sl * per;
            memset(part, 0, (size_t)per * sizeof(float));
            int64_t b0 = sl * p->nblocks / k->nslabs, b1 = (sl + 1) * p->nblocks / k->nslabs;
            for (int64_t b = b0; b < b1; b++) bwd_block(k, b, &s, part);
            atomic_fetch_add(&k->done, 1);
        }
    }
    free(s.M);
    free(s.Vt);
    free(s.stage);
}

ct_status cti_wino_backward_weight(const cti_conv_f32_geo *g, const float *dy, const float *x,
                                   float *dw) {
    plan p = make_plan(g->N, g->G, g->C, g->Co, g->H, g->W, g->OH, g->OW, g->ph, g->pw);
    bwd_ctx k = {.p = &p, .dy = dy, .x = x};
    k.Cpad = (p.Ci + 15) / 16 * 16;
    k.nslabs = p.nblocks < WINO_SLABS ? p.nblocks : WINO_SLABS;
    int64_t per = p.G * 16 * p.Co * k.Cpad;
    k.parts = malloc((size_t)(k.nslabs * per) * sizeof(float));
    if (!k.parts)
        return cti_error(CT_ERR_OOM,
                         "ct_conv2d_backward_weight: out of memory for the Winograd buffers");
    atomic_init(&k.next, 0);
    atomic_init(&k.done, 0);
    int64_t nt = cti_cpu_threads();
    if (nt > k.nslabs) nt = k.nslabs;
    cti_parallel_for(nt, 1, bwd_task, &k);
    if (atomic_load(&k.done) < k.nslabs) {
        free(k.parts);
        return cti_error(CT_ERR_OOM,
                         "ct_conv2d_backward_weight: out of memory for the Winograd buffers");
    }
    /* dw = G^T (sum of the slabs) G, in double */
    for (int64_t grp = 0; grp < p.G; grp++)
        for (int64_t o = 0; o < p.Co; o++)
            for (int64_t c = 0; c < p.Ci; c++) {
                double du[16];
                for (int xi = 0; xi < 16; xi++) {
                    double acc = 0;
                    for (int64_t sl = 0; sl < k.nslabs; sl++)
                        acc += k.parts[sl * per + ((grp * 16 + xi) * p.Co + o) * k.Cpad + c];
                    du[xi] = acc;
                }
                float *out = dw + ((grp * p.Co + o) * p.Ci + c) * 9;
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 3; j++) {
                        double v = 0;
                        for (int r = 0; r < 4; r++)
                            for (int s2 = 0; s2 < 4; s2++) v += Gm[r][i] * du[4 * r + s2] * Gm[s2][j];
                        out[i * 3 + j] = (float)v;
                    }
            }
    free(k.parts);
    return CT_OK;
}

#else /* not x86-64 with GCC/Clang: conv.c keeps im2col + GEMM */

bool cti_wino_supported(void) { return false; }

ct_status cti_wino_forward(const cti_conv_f32_geo *g, const float *x, const float *w,
                           const float *bias, float *y) {
    (void)g, (void)x, (void)w, (void)bias, (void)y;
    return cti_error(CT_ERR_UNSUPPORTED, "ct_conv2d: Winograd kernels need x86-64 AVX-512");
}

ct_status cti_wino_backward_input(const cti_conv_f32_geo *g, const float *dy, const float *w,
                                  float *dx) {
    (void)g, (void)dy, (void)w, (void)dx;
    return cti_error(CT_ERR_UNSUPPORTED,
                     "ct_conv2d_backward_input: Winograd kernels need x86-64 AVX-512");
}

ct_status cti_wino_backward_weight(const cti_conv_f32_geo *g, const float *dy, const float *x,
                                   float *dw) {
    (void)g, (void)dy, (void)x, (void)dw;
    return cti_error(CT_ERR_UNSUPPORTED,
                     "ct_conv2d_backward_weight: Winograd kernels need x86-64 AVX-512");
}

#endif
