/* Private to the CPU kernels of the neural-network ops (norm.c, softmax.c,
 * loss.c, embedding.c, dropout.c): the row helpers they share.
 *
 * Row math runs in f32 for f32/f16/bf16 and in f64 for f64. Halves are
 * converted a row at a time into per-task scratch, so outputs keep the input
 * dtype while no sum ever accumulates in 16 bits. The front ends
 * (src/ops/nn.c) hand over contiguous inputs and contiguous outputs.
 *
 * Sums use NACC independent accumulators so that they vectorize without
 * reassociation flags; -O2 vectorizes only trivial loops, hence the
 * #pragma GCC optimize("O3") that each of those files starts with, before
 * any include. 64 of them are four AVX-512 vectors: with one, each add waits
 * for the last (4 cycles), which made softmax over 4096-wide rows (read from
 * L1 after the first pass) 1.4x slower.
 *
 * The typed reductions at the end (sum, dot, max) are written once over NN_T
 * and compiled per row type through nn_types.h, as the typed parts of the
 * kernel files are. */
#ifndef NN_T
#ifndef CTEN_CPU_NN_IMPL_H
#define CTEN_CPU_NN_IMPL_H

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "tensor/ops.h"
#include "vmath.h"

#define NACC 64

/* The helpers are plain static functions, not inline ones, so that GCC
 * weighs inlining them as it did when the kernels were measured (inline
 * would pull every use of them into its caller); unused, as no file uses
 * them all. */
#define NN_HELPER static __attribute__((unused))

/* ---- dtype conversion of rows (f16/bf16 <-> f32); stride in elements ------------------ */
NN_HELPER void load_f32(const void *src, ct_dtype dt, int64_t n, int64_t stride,
                        float *restrict dst) {
    if (dt == CT_F16) {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = cti_f16_to_f32(s[i * stride]);
    } else if (dt == CT_BF16) {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = cti_bf16_to_f32(s[i * stride]);
    } else {
        const float *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i * stride];
    }
}

NN_HELPER void store_f32(const float *restrict src, ct_dtype dt, int64_t n, int64_t stride,
                         void *dst) {
    if (dt == CT_F16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i * stride] = cti_f32_to_f16(src[i]);
    } else if (dt == CT_BF16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i * stride] = cti_f32_to_bf16(src[i]);
    } else {
        float *d = dst;
        for (int64_t i = 0; i < n; i++) d[i * stride] = src[i];
    }
}

NN_HELPER bool is_half(ct_dtype dt) { return dt == CT_F16 || dt == CT_BF16; }

/* ---- non-temporal stores -----------------------------------------------------------------
 * An output this large (f32) does not stay in the caches for whoever reads it
 * next; written with ordinary stores, each of its lines is first read from
 * memory (read-for-ownership), a third more traffic than a copy of the same
 * bytes, which memcpy avoids the same way. */
#define NN_STREAM_BYTES ((uint64_t)16 << 20)

#if defined(__x86_64__)
#include <immintrin.h>
/* Lanes of one non-temporal store at the kernel set's width. */
#if defined(__AVX512F__)
#define NN_SW 16
#define NN_VEC __m512
#define NN_SET1 _mm512_set1_ps
#define NN_AFFINE(q, va, vb) _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(q), va), vb)
#define NN_STREAM _mm512_stream_ps
#elif defined(__AVX__)
#define NN_SW 8
#define NN_VEC __m256
#define NN_SET1 _mm256_set1_ps
#define NN_AFFINE(q, va, vb) _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(q), va), vb)
#define NN_STREAM _mm256_stream_ps
#else
#define NN_SW 4
#define NN_VEC __m128
#define NN_SET1 _mm_set1_ps
#define NN_AFFINE(q, va, vb) _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(q), va), vb)
#define NN_STREAM _mm_stream_ps
#endif
#endif

/* y[i] = x[i] * a + b; with stream, the vector-aligned middle of y through
 * non-temporal stores (the same arithmetic), after which the task calls
 * stream_fence() before it returns, so that its stores are visible to the
 * thread that waits for it. */
NN_HELPER void store_affine(float *restrict y, const float *restrict x, float a, float b,
                            int64_t n, bool stream) {
    int64_t i = 0;
#if defined(__x86_64__)
    if (stream) {
        const NN_VEC va = NN_SET1(a), vb = NN_SET1(b);
        for (; i < n && ((uintptr_t)(y + i) & (NN_SW * sizeof(float) - 1)); i++)
            y[i] = x[i] * a + b;
        for (; i + NN_SW <= n; i += NN_SW) NN_STREAM(y + i, NN_AFFINE(x + i, va, vb));
    }
#endif
    (void)stream;
    for (; i < n; i++) y[i] = x[i] * a + b;
}

NN_HELPER void stream_fence(void) {
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

/* Scratch for a task; never NULL for n == 0 so that NULL always means OOM. */
NN_HELPER void *scratch(size_t n) { return malloc(n ? n : 1); }

/* Splits n items into chunks of at least grain items, at most one per thread,
 * so per-chunk partial sums reduce in a fixed order for a given thread count. */
NN_HELPER int64_t num_chunks(int64_t n, int64_t grain) {
    int64_t k = grain > 0 ? n / grain : n;
    int64_t t = cti_cpu_threads();
    if (k > t) k = t;
    return k < 1 ? 1 : k;
}
NN_HELPER int64_t chunk_begin(int64_t n, int64_t nchunk, int64_t c) { return n * c / nchunk; }

NN_HELPER int64_t row_grain(int64_t d) {
    int64_t g = CTI_GRAIN / (d > 0 ? d : 1);
    return g < 1 ? 1 : g;
}

/* A kernel registered for every floating dtype. */
typedef struct nn_kernel {
    ct_op op;
    cti_kernel_fn fn;
    const char *name;
} nn_kernel;

NN_HELPER void nn_register_floating(const nn_kernel *ks, size_t n) {
    static const ct_dtype fl[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < sizeof fl / sizeof fl[0]; j++)
            cti_register_kernel(ks[i].op, CT_DEVICE_CPU, fl[j], ks[i].fn, ks[i].name);
}

#define NN_TYPED "nn_impl.h"
#include "nn_types.h"

#endif /* CTEN_CPU_NN_IMPL_H */
#else /* NN_T: the reductions the kernel files share, once per row type */

/* The row reductions keep NACC partial results (independent chains, in
 * vector registers), add the tail into the first lanes and fold the lanes
 * pairwise: a fold of log2(NACC) vector steps, where a serial sum of the
 * lanes would be a chain of NACC scalar adds (most of the time of a row of
 * 100, such as an attention tile's). fold: acc[0] = the sum of the lanes. */
NN_HELPER NN_T NN_F(fold)(NN_T *restrict acc) {
    for (int w = NACC / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

NN_HELPER NN_T NN_F(sum)(const NN_T *restrict x, int64_t n) {
    NN_T acc[NACC] = {0};
    int64_t i = 0;
    for (; i + NACC <= n; i += NACC)
        for (int j = 0; j < NACC; j++) acc[j] += x[i + j];
    for (int j = 0; j < n - i; j++) acc[j] += x[i + j];
    return NN_F(fold)(acc);
}

NN_HELPER NN_T NN_F(dot)(const NN_T *restrict a, const NN_T *restrict b, int64_t n) {
    NN_T acc[NACC] = {0};
    int64_t i = 0;
    for (; i + NACC <= n; i += NACC)
        for (int j = 0; j < NACC; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; j < n - i; j++) acc[j] += a[i + j] * b[i + j];
    return NN_F(fold)(acc);
}

/* NaN-ignoring max; a NaN still poisons the softmax sum that follows. */
NN_HELPER NN_T NN_F(max)(const NN_T *restrict x, int64_t n) {
    NN_T acc[NACC];
    for (int j = 0; j < NACC; j++) acc[j] = -INFINITY;
    int64_t i = 0;
    for (; i + NACC <= n; i += NACC)
        for (int j = 0; j < NACC; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (int j = 0; j < n - i; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (int w = NACC / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] = acc[j + w] > acc[j] ? acc[j + w] : acc[j];
    return acc[0];
}

#endif
