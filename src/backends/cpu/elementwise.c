/* CPU kernels for unary, binary, where and clamp: one per (op, dtype).
 *
 * Each kernel hands cti_cpu_foreach an inner loop generated from an element
 * expression. Native types (bool, int32, int64, float, double) get a
 * contiguous branch written for the vectorizer, branches for a broadcast
 * (stride 0) operand, and a strided branch. float16/bfloat16 loops convert
 * blocks of elements to float32, apply the float32 expression and convert
 * back, so the arithmetic vectorizes too. Integer arithmetic wraps (computed
 * in the unsigned type) as PyTorch's does. The transcendental functions of
 * float32 (and so of the halves) are vmath.h's, which vectorize, where libm
 * would be called once per element; float64 keeps libm.
 *
 * The ops with parameters (cti_pointwise_params), per element:
 *   add, sub: out = a + alpha * b (sub's front end passes -alpha)
 *   clamp:    out = min(max(x, lo), hi), NaN bounds giving NaN
 *   softplus: out = log(1 + exp(beta x)) / beta, or x where beta x > threshold
 *   leaky_relu (negative_slope), elu/selu/celu (alpha, scale, input_scale),
 *   hardtanh (lo, hi), nan_to_num (the three replacements), round with
 *   decimals (decimals), lerp's scalar weight (a 0-d third operand)
 * The rest take none; each row below is its element expression. */
#if defined(__GNUC__) && !defined(__clang__) /* clang knows no such pragma */
#pragma GCC optimize("O3", "no-math-errno")
#endif

#include <math.h>
#include <tgmath.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "cpu_impl.h"
#include "vmath.h"

/* What an inner loop sees: the call's parameters (cti_pointwise_params:
 * add/sub's alpha, clamp's bounds, softplus's beta and threshold) and the
 * operands' dtypes. */
typedef struct ew_ctx {
    const cti_pointwise_params *p;
    ct_dtype dt[CTI_MAX_OPERANDS];
} ew_ctx;

/* Loop-invariant parameters in the compute type, named p_* in expressions. */
#define FPARAMS(T)                                                               \
    const T p_alpha = (T)P->p->alpha, p_lo = (T)P->p->lo, p_hi = (T)P->p->hi;    \
    const T p_beta = (T)P->p->beta, p_threshold = (T)P->p->threshold;            \
    (void)p_alpha; (void)p_lo; (void)p_hi; (void)p_beta; (void)p_threshold;      \
    FPARAMS_MORE(T)
/* The parameters of leaky_relu, elu, nan_to_num and round with decimals (10^|d|
 * as PyTorch forms it: a double power rounded to the compute type). */
#define FPARAMS_MORE(T)                                                          \
    const T p_slope = (T)P->p->negative_slope, p_ealpha = (T)P->p->elu_alpha;    \
    const T p_escale = (T)P->p->elu_scale, p_einscale = (T)P->p->elu_input_scale; \
    const T p_nan = (T)P->p->nan_val, p_posinf = (T)P->p->posinf_val;            \
    const T p_neginf = (T)P->p->neginf_val;                                      \
    const bool p_negdec = P->p->decimals < 0;                                    \
    const T p_tenpow = (T)pow(10.0, (double)(p_negdec ? -P->p->decimals : P->p->decimals)); \
    (void)p_slope; (void)p_ealpha; (void)p_escale; (void)p_einscale; (void)p_nan; \
    (void)p_posinf; (void)p_neginf; (void)p_negdec; (void)p_tenpow;
#define IPARAMS(T)                                                               \
    const T p_alpha = (T)P->p->ialpha, p_lo = (T)P->p->ilo, p_hi = (T)P->p->ihi; \
    (void)p_alpha; (void)p_lo; (void)p_hi;
#define BPARAMS(T)                                                               \
    const T p_alpha = P->p->ialpha != 0, p_lo = 0, p_hi = 1;                     \
    (void)p_alpha; (void)p_lo; (void)p_hi;

/* ---- float16 / bfloat16 blocks -------------------------------------------------- */
#define BLK 256

static void load_f16(float *restrict dst, const char *src, int64_t stride, int64_t m) {
    if (stride == 2) {
        const uint16_t *restrict s = (const uint16_t *)src;
        int64_t i = 0;
#if defined(__F16C__)
        for (; i + 8 <= m; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
        for (; i < m; i++) dst[i] = cti_f16_to_f32(s[i]);
    } else {
        const float v0 = cti_f16_to_f32(*(const uint16_t *)src);
        if (stride == 0) {
            for (int64_t i = 0; i < m; i++) dst[i] = v0;
        } else {
            for (int64_t i = 0; i < m; i++) dst[i] = cti_f16_to_f32(*(const uint16_t *)(src + i * stride));
        }
    }
}
static void store_f16(char *dst, int64_t stride, const float *restrict src, int64_t m) {
    if (stride == 2) {
        uint16_t *restrict d = (uint16_t *)dst;
        int64_t i = 0;
#if defined(__F16C__)
        for (; i + 8 <= m; i += 8)
            _mm_storeu_si128((__m128i *)(d + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; i < m; i++) d[i] = cti_f32_to_f16(src[i]);
    } else {
        for (int64_t i = 0; i < m; i++) *(uint16_t *)(dst + i * stride) = cti_f32_to_f16(src[i]);
    }
}
static void load_bf16(float *restrict dst, const char *src, int64_t stride, int64_t m) {
    if (stride == 2) {
        const uint16_t *restrict s = (const uint16_t *)src;
        for (int64_t i = 0; i < m; i++) dst[i] = cti_bf16_to_f32(s[i]);
    } else {
        for (int64_t i = 0; i < m; i++)
            dst[i] = cti_bf16_to_f32(*(const uint16_t *)(src + i * stride));
    }
}
static void store_bf16(char *dst, int64_t stride, const float *restrict src, int64_t m) {
    if (stride == 2) {
        uint16_t *restrict d = (uint16_t *)dst;
        for (int64_t i = 0; i < m; i++) d[i] = cti_f32_to_bf16(src[i]);
    } else {
        for (int64_t i = 0; i < m; i++) *(uint16_t *)(dst + i * stride) = cti_f32_to_bf16(src[i]);
    }
}
/* float32 blocks (sin, cos) copy whole when contiguous: the strided loops
 * do not vectorize and cost as much as the function itself */
static void load_f32(float *restrict dst, const char *src, int64_t stride, int64_t m) {
    if (stride == (int64_t)sizeof(float)) memcpy(dst, src, (size_t)m * sizeof(float));
    else for (int64_t i = 0; i < m; i++) dst[i] = *(const float *)(src + i * stride);
}
static void store_f32(char *dst, int64_t stride, const float *restrict src, int64_t m) {
    if (stride == (int64_t)sizeof(float)) memcpy(dst, src, (size_t)m * sizeof(float));
    else for (int64_t i = 0; i < m; i++) *(float *)(dst + i * stride) = src[i];
}
/* Inputs of a reduced-precision kernel are float16, bfloat16, or a float32
 * 0-d operand that keeps a scalar's precision (as PyTorch's opmath). */
static inline void load_lp(float *restrict dst, const char *src, int64_t stride, int64_t m,
                           ct_dtype dt) {
    if (dt == CT_F16) load_f16(dst, src, stride, m);
    else if (dt == CT_BF16) load_bf16(dst, src, stride, m);
    else load_f32(dst, src, stride, m);
}
static inline void store_lp(char *dst, int64_t stride, const float *restrict src, int64_t m,
                            ct_dtype dt) {
    if (dt == CT_F16) {
        store_f16(dst, stride, src, m);
    } else if (dt == CT_BF16) {
        store_bf16(dst, stride, src, m);
    } else { /* bool results of comparisons and logical ops */
        for (int64_t i = 0; i < m; i++) *(uint8_t *)(dst + i * stride) = src[i] != 0.0f;
    }
}

/* ---- loop generators -------------------------------------------------------------
 * EXPR sees the compute type cT, its unsigned twin uT (integers), the
 * parameters p_*, and the elements x (unary) or a, b (binary). */
#define UNARY_LOOP(name, T, UT, O, PARAMS, EXPR)                                       \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const ew_ctx *P = ctx;                                                         \
        typedef T cT;                                                                  \
        typedef UT uT;                                                                 \
        PARAMS(T)                                                                      \
        if (s[0] == (int64_t)sizeof(O) && s[1] == (int64_t)sizeof(T)) {                \
            O *restrict o = (O *)p[0];                                                 \
            const T *restrict in = (const T *)p[1];                                    \
            for (int64_t i = 0; i < n; i++) {                                          \
                const cT x = in[i];                                                    \
                o[i] = (O)(EXPR);                                                      \
            }                                                                          \
        } else {                                                                       \
            char *po = p[0];                                                           \
            const char *pa = p[1];                                                     \
            for (int64_t i = 0; i < n; i++, po += s[0], pa += s[1]) {                  \
                const cT x = *(const T *)pa;                                           \
                *(O *)po = (O)(EXPR);                                                  \
            }                                                                          \
        }                                                                              \
        (void)sizeof(uT);                                                              \
    }

#define BINARY_LOOP(name, T, UT, O, PARAMS, EXPR)                                      \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const ew_ctx *P = ctx;                                                         \
        typedef T cT;                                                                  \
        typedef UT uT;                                                                 \
        PARAMS(T)                                                                      \
        const int64_t so = (int64_t)sizeof(O), st = (int64_t)sizeof(T);                \
        if (s[0] == so && s[1] == st && s[2] == st) {                                  \
            O *restrict o = (O *)p[0];                                                 \
            const T *restrict x = (const T *)p[1], *restrict y = (const T *)p[2];      \
            for (int64_t i = 0; i < n; i++) {                                          \
                const cT a = x[i], b = y[i];                                           \
                o[i] = (O)(EXPR);                                                      \
            }                                                                          \
        } else if (s[0] == so && s[1] == st && s[2] == 0) {                            \
            O *restrict o = (O *)p[0];                                                 \
            const T *restrict x = (const T *)p[1];                                     \
            const cT b = *(const T *)p[2];                                             \
            for (int64_t i = 0; i < n; i++) {                                          \
                const cT a = x[i];                                                     \
                o[i] = (O)(EXPR);                                                      \
            }                                                                          \
        } else if (s[0] == so && s[1] == 0 && s[2] == st) {                            \
            O *restrict o = (O *)p[0];                                                 \
            const T *restrict y = (const T *)p[2];                                     \
            const cT a = *(const T *)p[1];                                             \
            for (int64_t i = 0; i < n; i++) {                                          \
                const cT b = y[i];                                                     \
                o[i] = (O)(EXPR);                                                      \
            }                                                                          \
        } else {                                                                       \
            char *po = p[0];                                                           \
            const char *pa = p[1], *pb = p[2];                                         \
            for (int64_t i = 0; i < n; i++, po += s[0], pa += s[1], pb += s[2]) {      \
                const cT a = *(const T *)pa, b = *(const T *)pb;                       \
                *(O *)po = (O)(EXPR);                                                  \
            }                                                                          \
        }                                                                              \
        (void)sizeof(uT);                                                              \
    }

/* float16/bfloat16 (ODT: the output dtype, CT_F16, CT_BF16 or CT_BOOL). */
#define LP_UNARY_LOOP(name, ODT, EXPR)                                                 \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const ew_ctx *P = ctx;                                                         \
        typedef float cT;                                                              \
        FPARAMS(float)                                                                 \
        float buf[BLK];                                                                \
        for (int64_t off = 0; off < n; off += BLK) {                                   \
            const int64_t m = n - off < BLK ? n - off : BLK;                           \
            load_lp(buf, p[1] + off * s[1], s[1], m, P->dt[1]);                        \
            for (int64_t i = 0; i < m; i++) {                                          \
                const cT x = buf[i];                                                   \
                buf[i] = (float)(EXPR);                                                \
            }                                                                          \
            store_lp(p[0] + off * s[0], s[0], buf, m, ODT);                            \
        }                                                                              \
    }

#define LP_BINARY_LOOP(name, ODT, EXPR)                                                \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const ew_ctx *P = ctx;                                                         \
        typedef float cT;                                                              \
        FPARAMS(float)                                                                 \
        float fa[BLK], fb[BLK];                                                        \
        for (int64_t off = 0; off < n; off += BLK) {                                   \
            const int64_t m = n - off < BLK ? n - off : BLK;                           \
            load_lp(fa, p[1] + off * s[1], s[1], m, P->dt[1]);                         \
            load_lp(fb, p[2] + off * s[2], s[2], m, P->dt[2]);                         \
            for (int64_t i = 0; i < m; i++) {                                          \
                const cT a = fa[i], b = fb[i];                                         \
                fa[i] = (float)(EXPR);                                                 \
            }                                                                          \
            store_lp(p[0] + off * s[0], s[0], fa, m, ODT);                             \
        }                                                                              \
    }

/* Three operands (lerp: start a, end b, weight w): contiguous, a broadcast
 * weight (the scalar form), and strided. */
#define TERNARY_LOOP(name, T, PARAMS, EXPR)                                            \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const ew_ctx *P = ctx;                                                         \
        typedef T cT;                                                                  \
        PARAMS(T)                                                                      \
        const int64_t st = (int64_t)sizeof(T);                                         \
        if (s[0] == st && s[1] == st && s[2] == st && (s[3] == st || s[3] == 0)) {     \
            T *restrict o = (T *)p[0];                                                 \
            const T *restrict x = (const T *)p[1], *restrict y = (const T *)p[2];      \
            const T *restrict z = (const T *)p[3];                                     \
            if (s[3] == 0) {                                                           \
                const cT w = z[0];                                                     \
                for (int64_t i = 0; i < n; i++) {                                      \
                    const cT a = x[i], b = y[i];                                       \
                    o[i] = (T)(EXPR);                                                  \
                }                                                                      \
            } else {                                                                   \
                for (int64_t i = 0; i < n; i++) {                                      \
                    const cT a = x[i], b = y[i], w = z[i];                             \
                    o[i] = (T)(EXPR);                                                  \
                }                                                                      \
            }                                                                          \
        } else {                                                                       \
            char *po = p[0];                                                           \
            const char *pa = p[1], *pb = p[2], *pw = p[3];                             \
            for (int64_t i = 0; i < n; i++, po += s[0], pa += s[1], pb += s[2], pw += s[3]) { \
                const cT a = *(const T *)pa, b = *(const T *)pb, w = *(const T *)pw;   \
                *(T *)po = (T)(EXPR);                                                  \
            }                                                                          \
        }                                                                              \
    }
#define LP_TERNARY_LOOP(name, ODT, EXPR)                                               \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const ew_ctx *P = ctx;                                                         \
        typedef float cT;                                                              \
        FPARAMS(float)                                                                 \
        float fa[BLK], fb[BLK], fw[BLK];                                               \
        for (int64_t off = 0; off < n; off += BLK) {                                   \
            const int64_t m = n - off < BLK ? n - off : BLK;                           \
            load_lp(fa, p[1] + off * s[1], s[1], m, P->dt[1]);                         \
            load_lp(fb, p[2] + off * s[2], s[2], m, P->dt[2]);                         \
            load_lp(fw, p[3] + off * s[3], s[3], m, P->dt[3]);                         \
            for (int64_t i = 0; i < m; i++) {                                          \
                const cT a = fa[i], b = fb[i], w = fw[i];                              \
                fa[i] = (float)(EXPR);                                                 \
            }                                                                          \
            store_lp(p[0] + off * s[0], s[0], fa, m, ODT);                             \
        }                                                                              \
    }

/* sin and cos of float32, float16 and bfloat16 (in and out of one dtype) in
 * blocks: VF (vmath.h, float32) for every element; only in a block with an
 * element beyond VM_TRIG_FAST_MAX (or NaN), VF##_wide (float64 reduction)
 * for those, and libm's float64 DF for any beyond VM_TRIG_MAX. o and x
 * (m elements) must not overlap. */
#define TRIG_BLOCK(o, x, m, VF, DF)                                                    \
    do {                                                                               \
        int big = 0, huge = 0;                                                         \
        for (int64_t i = 0; i < (m); i++) {                                            \
            o[i] = VF(x[i]);                                                           \
            big |= !(fabsf(x[i]) <= VM_TRIG_FAST_MAX);                                 \
        }                                                                              \
        if (big)                                                                       \
            for (int64_t i = 0; i < (m); i++) {                                        \
                float w = VF##_wide(x[i]);                                             \
                o[i] = fabsf(x[i]) <= VM_TRIG_FAST_MAX ? o[i] : w;                     \
                huge |= !(fabsf(x[i]) <= VM_TRIG_MAX);                                 \
            }                                                                          \
        for (int64_t i = 0; huge && i < (m); i++)                                      \
            if (!(fabsf(x[i]) <= VM_TRIG_MAX)) o[i] = (float)DF((double)x[i]);         \
    } while (0)
/* Contiguous float32 in and out (not in place) straight through; the rest
 * through blocks converted to and from float32. */
/* Whether a unary loop's float32 in and out are contiguous and apart, so that blocks
 * can be computed in place of the output without conversions. */
static inline bool f32_straight(const ew_ctx *P, char **p, const int64_t *s) {
    return P->dt[0] == CT_F32 && P->dt[1] == CT_F32 && s[0] == 4 && s[1] == 4 && p[0] != p[1];
}
/* The other unary loops: blocks of x loaded as float32 into in, BLOCK (a statement on
 * out, in and m) run, and out stored in the output's dtype. */
#define LP_BLOCKS(...)                                                                 \
    do {                                                                               \
        float in[BLK], out[BLK];                                                       \
        for (int64_t off = 0; off < n; off += BLK) {                                   \
            const int64_t m = n - off < BLK ? n - off : BLK;                           \
            load_lp(in, p[1] + off * s[1], s[1], m, P->dt[1]);                         \
            __VA_ARGS__;                                                               \
            if (P->dt[0] == CT_F32) store_f32(p[0] + off * s[0], s[0], out, m);        \
            else store_lp(p[0] + off * s[0], s[0], out, m, P->dt[0]);                  \
        }                                                                              \
    } while (0)
#define TRIG_LOOP(name, VF, DF)                                                        \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const ew_ctx *P = ctx;                                                         \
        if (f32_straight(P, p, s)) {                                                   \
            for (int64_t off = 0; off < n; off += BLK) {                               \
                const int64_t m = n - off < BLK ? n - off : BLK;                       \
                float *restrict o = (float *)p[0] + off;                               \
                const float *restrict x = (const float *)p[1] + off;                   \
                TRIG_BLOCK(o, x, m, VF, DF);                                           \
            }                                                                          \
            return;                                                                    \
        }                                                                              \
        LP_BLOCKS(TRIG_BLOCK(out, in, m, VF, DF));                                     \
    }

/* Functions with a cheap central form and a costly tail (erfinv): float32 in chunks of
 * SPLIT_W through CF (vmath.h; it flags each element it does not cover), and only a chunk
 * with a flagged element again through VF, which covers every input. A chunk is one
 * AVX-512 vector (two AVX2 ones), so the tail costs a vector that holds a tail element,
 * not every vector. The block is a function of its own: GCC vectorizes the chunks' loop
 * only with o and x restrict parameters (block-scope restrict pointers leave it
 * versioning for aliasing and vectorizing across chunks). o and x must not overlap. */
#define SPLIT_W 16
#define SPLIT_BLOCK_FN(name, CF, VF)                                                   \
    static inline void name(float *restrict o, const float *restrict x, int64_t m) {   \
        int64_t j = 0;                                                                 \
        for (; j + SPLIT_W <= m; j += SPLIT_W) {                                       \
            int tail = 0;                                                              \
            for (int i = 0; i < SPLIT_W; i++) {                                        \
                int t;                                                                 \
                o[j + i] = CF(x[j + i], &t);                                           \
                tail |= t;                                                             \
            }                                                                          \
            if (tail)                                                                  \
                for (int i = 0; i < SPLIT_W; i++) o[j + i] = VF(x[j + i]);             \
        }                                                                              \
        for (; j < m; j++) o[j] = VF(x[j]);                                            \
    }
/* Contiguous float32 in and out (not in place) straight through; the rest through
 * blocks converted to and from float32, as TRIG_LOOP. */
#define SPLIT_LOOP(name, CF, VF)                                                       \
    SPLIT_BLOCK_FN(name##_block, CF, VF)                                               \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const ew_ctx *P = ctx;                                                         \
        if (f32_straight(P, p, s)) {                                                   \
            name##_block((float *)p[0], (const float *)p[1], n);                       \
            return;                                                                    \
        }                                                                              \
        LP_BLOCKS(name##_block(out, in, m));                                           \
    }

/* fmod and remainder (REM) of float32, float16 and bfloat16 in blocks: vm_fmod
 * for every element, then libm's fmodf for those it does not cover (only in a
 * block that has one). Python's remainder moves fmod into b's sign. */
#define FMOD_BLOCK(o, x, y, m, REM)                                                    \
    do {                                                                               \
        int other = 0;                                                                 \
        for (int64_t i = 0; i < (m); i++) {                                            \
            float r = vm_fmod(x[i], y[i]);                                             \
            if (REM) r = (r != 0 && (y[i] < 0) != (r < 0)) ? r + y[i] : r;            \
            o[i] = r;                                                                  \
            other |= !(fabsf(x[i]) < 0x1p28f * fabsf(y[i]));                           \
        }                                                                              \
        for (int64_t i = 0; other && i < (m); i++) {                                   \
            if (fabsf(x[i]) < 0x1p28f * fabsf(y[i])) continue;                         \
            float r = fmodf(x[i], y[i]);                                               \
            o[i] = (REM) && r != 0 && (y[i] < 0) != (r < 0) ? r + y[i] : r;            \
        }                                                                              \
    } while (0)
#define FMOD_LOOP(name, REM)                                                           \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const ew_ctx *P = ctx;                                                         \
        float fa[BLK], fb[BLK], fo[BLK];                                               \
        for (int64_t off = 0; off < n; off += BLK) {                                   \
            const int64_t m = n - off < BLK ? n - off : BLK;                           \
            load_lp(fa, p[1] + off * s[1], s[1], m, P->dt[1]);                         \
            load_lp(fb, p[2] + off * s[2], s[2], m, P->dt[2]);                         \
            FMOD_BLOCK(fo, fa, fb, m, REM);                                            \
            if (P->dt[0] == CT_F32) store_f32(p[0] + off * s[0], s[0], fo, m);         \
            else store_lp(p[0] + off * s[0], s[0], fo, m, P->dt[0]);                   \
        }                                                                              \
    }

/* ---- kernels: the call's operands and parameters into the iterator --------------- */
#define KERNEL(kname, loop, nin)                                                       \
    static ct_status kname(ct_call *c) {                                               \
        ew_ctx P = {.p = CTI_PARAMS(c, cti_pointwise_params)};                         \
        ct_tensor *ops[CTI_MAX_OPERANDS];                                              \
        ops[0] = c->out[0];                                                            \
        P.dt[0] = ops[0]->dtype;                                                       \
        for (int k = 0; k < (nin); k++) {                                              \
            ops[k + 1] = c->in[k];                                                     \
            P.dt[k + 1] = c->in[k]->dtype;                                             \
        }                                                                              \
        return cti_cpu_foreach((nin) + 1, ops, loop, &P);                              \
    }

typedef struct ew_reg {
    ct_op op;
    ct_dtype dtype;
    cti_kernel_fn fn;
    const char *name;
} ew_reg;

/* Per-dtype instantiation of one op. suffixes: b8 i32 i64 f32 f64 f16 bf16. */
#define U_NATIVE(op, sfx, T, UT, O, PARAMS, EXPR)                                      \
    UNARY_LOOP(loop_##op##_##sfx, T, UT, O, PARAMS, EXPR)                              \
    KERNEL(k_##op##_##sfx, loop_##op##_##sfx, 1)
#define U_LP(op, sfx, ODT, EXPR)                                                       \
    LP_UNARY_LOOP(loop_##op##_##sfx, ODT, EXPR)                                        \
    KERNEL(k_##op##_##sfx, loop_##op##_##sfx, 1)
#define B_NATIVE(op, sfx, T, UT, O, PARAMS, EXPR)                                      \
    BINARY_LOOP(loop_##op##_##sfx, T, UT, O, PARAMS, EXPR)                             \
    KERNEL(k_##op##_##sfx, loop_##op##_##sfx, 2)
#define B_LP(op, sfx, ODT, EXPR)                                                       \
    LP_BINARY_LOOP(loop_##op##_##sfx, ODT, EXPR)                                       \
    KERNEL(k_##op##_##sfx, loop_##op##_##sfx, 2)

/* Float ops: float32, float64, and float16/bfloat16 through float32. */
#define U_FLOAT(op, EXPR)                                                              \
    U_NATIVE(op, f32, float, uint32_t, float, FPARAMS, EXPR)                           \
    U_NATIVE(op, f64, double, uint64_t, double, FPARAMS, EXPR)                         \
    U_LP(op, f16, CT_F16, EXPR)                                                        \
    U_LP(op, bf16, CT_BF16, EXPR)
#define U_FLOAT_TO_BOOL(op, EXPR)                                                      \
    U_NATIVE(op, f32, float, uint32_t, uint8_t, FPARAMS, EXPR)                         \
    U_NATIVE(op, f64, double, uint64_t, uint8_t, FPARAMS, EXPR)                        \
    U_LP(op, f16, CT_BOOL, EXPR)                                                       \
    U_LP(op, bf16, CT_BOOL, EXPR)
/* sin, cos: float64 through libm, the rest through TRIG_LOOP; EXPR names the
 * function (vm_##EXPR in vmath.h). */
#define U_TRIG(op, EXPR)                                                               \
    U_NATIVE(op, f64, double, uint64_t, double, FPARAMS, EXPR(x))                      \
    TRIG_LOOP(loop_##op##_f32, vm_##EXPR, EXPR)                                        \
    KERNEL(k_##op##_f32, loop_##op##_f32, 1)                                           \
    KERNEL(k_##op##_f16, loop_##op##_f32, 1)                                           \
    KERNEL(k_##op##_bf16, loop_##op##_f32, 1)
/* erfinv: float64 through EXPR##_d, the rest through SPLIT_LOOP with vm_##EXPR##_central
 * and vm_##EXPR. */
#define U_SPLIT(op, EXPR)                                                              \
    U_NATIVE(op, f64, double, uint64_t, double, FPARAMS, EXPR##_d(x))                  \
    SPLIT_LOOP(loop_##op##_f32, vm_##EXPR##_central, vm_##EXPR)                        \
    KERNEL(k_##op##_f32, loop_##op##_f32, 1)                                           \
    KERNEL(k_##op##_f16, loop_##op##_f32, 1)                                           \
    KERNEL(k_##op##_bf16, loop_##op##_f32, 1)
#define U_INT(op, EXPR)                                                                \
    U_NATIVE(op, i32, int32_t, uint32_t, int32_t, IPARAMS, EXPR)                       \
    U_NATIVE(op, i64, int64_t, uint64_t, int64_t, IPARAMS, EXPR)
#define U_INT_TO_BOOL(op, EXPR)                                                        \
    U_NATIVE(op, i32, int32_t, uint32_t, uint8_t, IPARAMS, EXPR)                       \
    U_NATIVE(op, i64, int64_t, uint64_t, uint8_t, IPARAMS, EXPR)
#define U_BOOL(op, EXPR) U_NATIVE(op, b8, uint8_t, uint8_t, uint8_t, BPARAMS, EXPR)
#define B_FLOAT(op, EXPR)                                                              \
    B_NATIVE(op, f32, float, uint32_t, float, FPARAMS, EXPR)                           \
    B_NATIVE(op, f64, double, uint64_t, double, FPARAMS, EXPR)                         \
    B_LP(op, f16, CT_F16, EXPR)                                                        \
    B_LP(op, bf16, CT_BF16, EXPR)
#define B_FLOAT_TO_BOOL(op, EXPR)                                                      \
    B_NATIVE(op, f32, float, uint32_t, uint8_t, FPARAMS, EXPR)                         \
    B_NATIVE(op, f64, double, uint64_t, uint8_t, FPARAMS, EXPR)                        \
    B_LP(op, f16, CT_BOOL, EXPR)                                                       \
    B_LP(op, bf16, CT_BOOL, EXPR)
#define B_INT(op, EXPR)                                                                \
    B_NATIVE(op, i32, int32_t, uint32_t, int32_t, IPARAMS, EXPR)                       \
    B_NATIVE(op, i64, int64_t, uint64_t, int64_t, IPARAMS, EXPR)
#define B_INT_TO_BOOL(op, EXPR)                                                        \
    B_NATIVE(op, i32, int32_t, uint32_t, uint8_t, IPARAMS, EXPR)                       \
    B_NATIVE(op, i64, int64_t, uint64_t, uint8_t, IPARAMS, EXPR)                       \
    B_NATIVE(op, b8, uint8_t, uint8_t, uint8_t, BPARAMS, EXPR)
#define B_BOOL(op, EXPR) B_NATIVE(op, b8, uint8_t, uint8_t, uint8_t, BPARAMS, EXPR)
/* fmod (EXPR 0) and remainder (EXPR 1): float64 through libm, the rest
 * through FMOD_LOOP. */
#define B_FMOD(op, EXPR)                                                               \
    B_NATIVE(op, f64, double, uint64_t, double, FPARAMS, (EXPR) ? FREM(a, b) : fmod(a, b)) \
    FMOD_LOOP(loop_##op##_f32, EXPR)                                                   \
    KERNEL(k_##op##_f32, loop_##op##_f32, 2)                                           \
    KERNEL(k_##op##_f16, loop_##op##_f32, 2)                                           \
    KERNEL(k_##op##_bf16, loop_##op##_f32, 2)
#define T_FLOAT(op, EXPR)                                                              \
    TERNARY_LOOP(loop_##op##_f32, float, FPARAMS, EXPR)                                \
    KERNEL(k_##op##_f32, loop_##op##_f32, 3)                                           \
    TERNARY_LOOP(loop_##op##_f64, double, FPARAMS, EXPR)                               \
    KERNEL(k_##op##_f64, loop_##op##_f64, 3)                                           \
    LP_TERNARY_LOOP(loop_##op##_f16, CT_F16, EXPR)                                     \
    KERNEL(k_##op##_f16, loop_##op##_f16, 3)                                           \
    LP_TERNARY_LOOP(loop_##op##_bf16, CT_BF16, EXPR)                                   \
    KERNEL(k_##op##_bf16, loop_##op##_bf16, 3)

/* Registration rows. */
#define R(OP, op, sfx, DT) {CT_OP_##OP, DT, k_##op##_##sfx, #op "_" #sfx},
#define R_FLOAT(OP, op)                                                                \
    R(OP, op, f32, CT_F32) R(OP, op, f64, CT_F64) R(OP, op, f16, CT_F16)               \
    R(OP, op, bf16, CT_BF16)
#define R_INT(OP, op) R(OP, op, i32, CT_I32) R(OP, op, i64, CT_I64)
#define R_BOOL(OP, op) R(OP, op, b8, CT_BOOL)

/* A kernel family's registration rows, by the name of its definer. */
#define REG_U_FLOAT R_FLOAT
#define REG_U_TRIG R_FLOAT
#define REG_U_SPLIT R_FLOAT
#define REG_U_FLOAT_TO_BOOL R_FLOAT
#define REG_U_INT R_INT
#define REG_U_INT_TO_BOOL R_INT
#define REG_U_BOOL R_BOOL
#define REG_B_FLOAT R_FLOAT
#define REG_B_FLOAT_TO_BOOL R_FLOAT
#define REG_B_INT R_INT
#define REG_B_INT_TO_BOOL(OP, op) R_INT(OP, op) R_BOOL(OP, op)
#define REG_B_BOOL R_BOOL
#define REG_T_FLOAT R_FLOAT
#define REG_B_FMOD R_FLOAT

/* VEC for float32 (and the halves, computed in float32), REF for float64:
 * the vectorizable functions of vmath.h where libm would be called per
 * element, libm for the reference dtype. */
#define F32_OR_F64(VEC, REF) _Generic((cT)0, float: (VEC), default: (REF))

#define SQRT1_2 0.70710678118654752440
#define SQRT_2_OVER_PI 0.79788456080286535588

/* gelu_backward: d/dx gelu(x), which grad_out multiplies.
 * Exact: Phi(x) + x phi(x). Phi through erfc(-x / sqrt 2), not 1 + erf, so that the
 * left tail keeps its relative accuracy. tanh: with u = k (x + c x^3), t = tanh(u),
 * (1 + t) / 2 + x / 2 (1 - t^2) k (1 + 3 c x^2), PyTorch's formula. Where phi (beyond
 * |x| = 20 in float32, 40 in float64) or 1 - t^2 is 0, the x term is 0 by a select, so
 * that x = +-inf gives the limits 1 and 0 rather than inf * 0; NaN still comes through
 * the other term. */
#define GELU_C 0.044715
#define INV_SQRT_2PI 0.39894228040143267794
VM_INLINE float gelu_grad_f(float x) {
    float pdf = vm_exp(-0.5f * x * x) * (float)INV_SQRT_2PI;
    float xp = fabsf(x) < 20.0f ? x * pdf : 0.0f; /* vm_exp stops at a subnormal, not 0 */
    return 0.5f * vm_erfc(-x * (float)SQRT1_2) + xp;
}
static inline double gelu_grad_d(double x) {
    double pdf = exp(-0.5 * x * x) * INV_SQRT_2PI;
    double xp = fabs(x) < 40.0 ? x * pdf : 0.0; /* where exp underflows to 0 anyway */
    return 0.5 * erfc(-x * SQRT1_2) + xp;
}
VM_INLINE float gelu_tanh_grad_f(float x) {
    const float k = (float)SQRT_2_OVER_PI, c = (float)GELU_C;
    float x2 = x * x;
    float t = vm_tanh(k * x * (1.0f + c * x2));
    float s = 1.0f - t * t;
    float r = s > 0.0f ? x * s * (k * (1.0f + 3.0f * c * x2)) : 0.0f;
    return 0.5f * (1.0f + t) + 0.5f * r;
}
static inline double gelu_tanh_grad_d(double x) {
    const double k = SQRT_2_OVER_PI, c = GELU_C;
    double x2 = x * x;
    double t = tanh(k * x * (1.0 + c * x2));
    double s = 1.0 - t * t;
    double r = s > 0.0 ? x * s * (k * (1.0 + 3.0 * c * x2)) : 0.0;
    return 0.5 * (1.0 + t) + 0.5 * r;
}
/* One loop per approximation, chosen outside it, each a loop GCC vectorizes (restrict
 * parameters: block-scope restrict pointers leave it versioning for aliasing; the
 * derivatives always inlined: GCC keeps the exact one out of line otherwise, and that
 * loop runs scalar). */
static void gelu_bw_block(float *restrict o, const float *restrict g, const float *restrict x,
                          int64_t m, bool tanh_form) {
    if (tanh_form)
        for (int64_t i = 0; i < m; i++) o[i] = g[i] * gelu_tanh_grad_f(x[i]);
    else
        for (int64_t i = 0; i < m; i++) o[i] = g[i] * gelu_grad_f(x[i]);
}
/* float32, float16 and bfloat16 (in grad_out a, x b): contiguous float32 straight
 * through, the rest in blocks converted to and from float32. */
static void loop_gelu_backward_f32(char **p, const int64_t *s, int64_t n, void *ctx) {
    const ew_ctx *P = ctx;
    const bool th = P->p->approximate == 1; /* CT_GELU_TANH */
    if (P->dt[0] == CT_F32 && P->dt[1] == CT_F32 && P->dt[2] == CT_F32 && s[0] == 4 &&
        s[1] == 4 && s[2] == 4 && p[0] != p[1] && p[0] != p[2]) {
        gelu_bw_block((float *)p[0], (const float *)p[1], (const float *)p[2], n, th);
        return;
    }
    float fa[BLK], fb[BLK], fo[BLK];
    for (int64_t off = 0; off < n; off += BLK) {
        const int64_t m = n - off < BLK ? n - off : BLK;
        load_lp(fa, p[1] + off * s[1], s[1], m, P->dt[1]);
        load_lp(fb, p[2] + off * s[2], s[2], m, P->dt[2]);
        gelu_bw_block(fo, fa, fb, m, th);
        if (P->dt[0] == CT_F32) store_f32(p[0] + off * s[0], s[0], fo, m);
        else store_lp(p[0] + off * s[0], s[0], fo, m, P->dt[0]);
    }
}
/* gelu_backward's family: float64 through libm (EXPR unused), the rest through
 * loop_gelu_backward_f32. */
#define B_GELU_BW(op, EXPR)                                                            \
    B_NATIVE(op, f64, double, uint64_t, double, FPARAMS,                               \
             a * (P->p->approximate == 1 ? gelu_tanh_grad_d(b) : gelu_grad_d(b)))      \
    KERNEL(k_##op##_f32, loop_##op##_f32, 2)                                           \
    KERNEL(k_##op##_f16, loop_##op##_f32, 2)                                           \
    KERNEL(k_##op##_bf16, loop_##op##_f32, 2)
#define REG_B_GELU_BW R_FLOAT

/* Bounds as given (NaN bounds give NaN); lo > hi gives hi, as PyTorch's
 * min(max(x, lo), hi). */
#define CLAMP_F(x) ((((x) < p_lo || p_lo != p_lo) ? p_lo : (x)) > p_hi || p_hi != p_hi \
                        ? p_hi : (((x) < p_lo || p_lo != p_lo) ? p_lo : (x)))
#define HSIG6(x)                                                                       \
    ((((x) + 3 < 0 ? (cT)0 : (x) + 3) > 6) ? (cT)6 : ((x) + 3 < 0 ? (cT)0 : (x) + 3))
#define CLAMP_I(x) ((((x) < p_lo) ? p_lo : (x)) > p_hi ? p_hi : (((x) < p_lo) ? p_lo : (x)))

/* Integer power by repeated squaring, wrapping; negative exponents give
 * 1 / a^-b truncated: 1 for a = 1, +-1 for a = -1, else 0. */
#define IPOW_FN(name, T, UT)                                                           \
    static inline T name(T a, T b) {                                                   \
        if (b < 0) {                                                                   \
            if (a == 1) return 1;                                                      \
            if (a == -1) return (b & 1) ? -1 : 1;                                      \
            return 0;                                                                  \
        }                                                                              \
        UT base = (UT)a, r = 1;                                                        \
        while (b) {                                                                    \
            if (b & 1) r *= base;                                                      \
            base *= base;                                                              \
            b >>= 1;                                                                   \
        }                                                                              \
        return (T)r;                                                                   \
    }
IPOW_FN(ipow_i32, int32_t, uint32_t)
IPOW_FN(ipow_i64, int64_t, uint64_t)
#define IPOW(a, b) _Generic((a), int32_t: ipow_i32, int64_t: ipow_i64)(a, b)

/* Integer fmod and remainder: C's % (the sign of a), and Python's (the sign
 * of b). A zero divisor gives 0 (PyTorch raises on the CPU; C's % would be
 * undefined), and so does -1, where INT_MIN % -1 would overflow. */
#define IFMOD(a, b) ((b) == 0 || (b) == -1 ? (cT)0 : (cT)((a) % (b)))
#define IREM(a, b)                                                                     \
    (IFMOD(a, b) != 0 && ((IFMOD(a, b) < 0) != ((b) < 0)) ? (cT)(IFMOD(a, b) + (b))    \
                                                          : IFMOD(a, b))
/* Python's % on floats, as PyTorch: fmod moved into b's sign. */
#define FREM(a, b)                                                                     \
    (fmod(a, b) != 0 && ((b) < 0) != (fmod(a, b) < 0) ? fmod(a, b) + (b) : fmod(a, b))
/* Shifts as PyTorch: counts outside [0, bits) (negative ones too, read as
 * unsigned) give 0 to the left and the sign fill to the right. */
#define NBITS ((uT)(sizeof(cT) * 8))
#define SHL(a, b) ((uT)(b) >= NBITS ? (cT)0 : (cT)((uT)(a) << (b)))
#define SHR(a, b) ((uT)(b) >= NBITS - 1 ? (cT)((a) >> (NBITS - 1)) : (cT)((a) >> (b)))

/* erfinv of float64: Giles' single-precision approximation (Approximating
 * the erfinv function, 2010), then two Newton steps on erf(x) = y, as
 * PyTorch's calc_erfinv refines its own start. float32 and the halves take
 * vm_erfinv, the approximation alone, vectorized. */
static double erfinv_d(double y) {
    if (!(fabs(y) < 1.0)) return y == 1.0 ? INFINITY : y == -1.0 ? -INFINITY : NAN;
    double w = -log((1.0 - y) * (1.0 + y)), p;
    if (w < 5.0) {
        w -= 2.5;
        p = 2.81022636e-08;
        p = 3.43273939e-07 + p * w;
        p = -3.5233877e-06 + p * w;
        p = -4.39150654e-06 + p * w;
        p = 0.00021858087 + p * w;
        p = -0.00125372503 + p * w;
        p = -0.00417768164 + p * w;
        p = 0.246640727 + p * w;
        p = 1.50140941 + p * w;
    } else {
        w = sqrt(w) - 3.0;
        p = -0.000200214257;
        p = 0.000100950558 + p * w;
        p = 0.00134934322 + p * w;
        p = -0.00367342844 + p * w;
        p = 0.00573950773 + p * w;
        p = -0.0076224613 + p * w;
        p = 0.00943887047 + p * w;
        p = 1.00167406 + p * w;
        p = 2.83297682 + p * w;
    }
    double x = p * y;
    for (int k = 0; k < 2; k++) x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x));
    return x;
}

/* ---- the ops ---------------------------------------------------------------------
 * X(ID, op, FAMILY, EXPR): kernels k_<op>_<dtype> of CT_OP_<ID> computing EXPR
 * for the dtypes of FAMILY, which defines them and whose REG_ rows register
 * them: U_ unary, B_ binary; FLOAT f32, f64, f16 and bf16 (through float32),
 * INT i32 and i64, BOOL b8, _TO_BOOL with bool results (B_INT_TO_BOOL: b8
 * too). */
#define EW_OPS(X)                                                                      \
    /* ---- unary ---- */                                                              \
    X(NEG, neg, U_FLOAT, -x)                                                           \
    X(NEG, neg, U_INT, (cT)(0 - (uT)x))                                                \
    X(ABS, abs, U_FLOAT, fabs(x))                                                      \
    X(ABS, abs, U_INT, x < 0 ? (cT)(0 - (uT)x) : x)                                    \
    X(EXP, exp, U_FLOAT, F32_OR_F64(vm_exp(x), exp(x)))                                \
    X(LOG, log, U_FLOAT, F32_OR_F64(vm_log(x), log(x)))                                \
    X(SQRT, sqrt, U_FLOAT, sqrt(x))                                                    \
    X(RSQRT, rsqrt, U_FLOAT, (cT)1 / sqrt(x))                                          \
    X(SIN, sin, U_TRIG, sin)                                                           \
    X(COS, cos, U_TRIG, cos)                                                           \
    X(TANH, tanh, U_FLOAT, F32_OR_F64(vm_tanh(x), tanh(x)))                            \
    X(SIGMOID, sigmoid, U_FLOAT, F32_OR_F64(vm_sigmoid(x), (cT)1 / ((cT)1 + exp(-x)))) \
    /* NaN passes through, as PyTorch's relu (clamp_min) does. */                      \
    X(RELU, relu, U_FLOAT, (x > 0 || x != x) ? x : (cT)0)                              \
    X(RELU, relu, U_INT, x > 0 ? x : (cT)0)                                            \
    X(GELU, gelu, U_FLOAT,                                                             \
      F32_OR_F64(vm_gelu(x), (cT)0.5 * x * ((cT)1 + erf(x * (cT)SQRT1_2))))            \
    X(GELU_TANH, gelu_tanh, U_FLOAT,                                                   \
      F32_OR_F64(vm_gelu_tanh(x), (cT)0.5 * x *                                        \
                 ((cT)1 + tanh((cT)SQRT_2_OVER_PI * (x + (cT)0.044715 * x * x * x)))))   \
    X(SILU, silu, U_FLOAT, F32_OR_F64(vm_silu(x), x / ((cT)1 + exp(-x))))              \
    /* log1p keeps exp(beta x) when it is tiny: no underflow to 0 early */             \
    X(SOFTPLUS, softplus, U_FLOAT,                                                     \
      x * p_beta > p_threshold                                                         \
          ? x                                                                          \
          : F32_OR_F64(vm_softplus(x * p_beta), log1p(exp(x * p_beta))) / p_beta)      \
    X(RECIPROCAL, reciprocal, U_FLOAT, (cT)1 / x)                                      \
    X(SQUARE, square, U_FLOAT, x * x)                                                  \
    X(SQUARE, square, U_INT, (cT)((uT)x * (uT)x))                                      \
    /* As PyTorch: sign(NaN) is 0. */                                                  \
    X(SIGN, sign, U_FLOAT, (cT)((x > 0) - (x < 0)))                                    \
    X(SIGN, sign, U_INT, (cT)((x > 0) - (x < 0)))                                      \
    X(SIGN, sign, U_BOOL, x)                                                           \
    X(LOGICAL_NOT, logical_not, U_FLOAT_TO_BOOL, x == 0)                               \
    X(LOGICAL_NOT, logical_not, U_INT_TO_BOOL, x == 0)                                 \
    X(LOGICAL_NOT, logical_not, U_BOOL, x == 0)                                        \
    X(CLAMP, clamp, U_FLOAT, CLAMP_F(x))                                               \
    X(CLAMP, clamp, U_INT, CLAMP_I(x))                                                 \
    /* ---- binary (sub runs add's kernels: its front end passes -alpha) ---- */       \
    X(ADD, add, B_FLOAT, a + p_alpha * b)                                              \
    X(ADD, add, B_INT, (cT)((uT)a + (uT)p_alpha * (uT)b))                              \
    X(ADD, add, B_BOOL, (cT)(a | (b & p_alpha)))                                       \
    X(MUL, mul, B_FLOAT, a * b)                                                        \
    X(MUL, mul, B_INT, (cT)((uT)a * (uT)b))                                            \
    X(MUL, mul, B_BOOL, (cT)(a & b))                                                   \
    X(DIV, div, B_FLOAT, a / b)                                                        \
    X(POW, pow, B_FLOAT, pow(a, b))                                                    \
    X(POW, pow, B_INT, IPOW(a, b))                                                     \
    /* NaN propagates from either side. */                                             \
    X(MAXIMUM, maximum, B_FLOAT, (a > b || a != a) ? a : b)                            \
    X(MAXIMUM, maximum, B_INT, a > b ? a : b)                                          \
    X(MAXIMUM, maximum, B_BOOL, (cT)(a | b))                                           \
    X(MINIMUM, minimum, B_FLOAT, (a < b || a != a) ? a : b)                            \
    X(MINIMUM, minimum, B_INT, a < b ? a : b)                                          \
    X(MINIMUM, minimum, B_BOOL, (cT)(a & b))                                           \
    X(EQ, eq, B_FLOAT_TO_BOOL, a == b)                                                 \
    X(EQ, eq, B_INT_TO_BOOL, a == b)                                                   \
    X(NE, ne, B_FLOAT_TO_BOOL, a != b)                                                 \
    X(NE, ne, B_INT_TO_BOOL, a != b)                                                   \
    X(LT, lt, B_FLOAT_TO_BOOL, a < b)                                                  \
    X(LT, lt, B_INT_TO_BOOL, a < b)                                                    \
    X(LE, le, B_FLOAT_TO_BOOL, a <= b)                                                 \
    X(LE, le, B_INT_TO_BOOL, a <= b)                                                   \
    X(GT, gt, B_FLOAT_TO_BOOL, a > b)                                                  \
    X(GT, gt, B_INT_TO_BOOL, a > b)                                                    \
    X(GE, ge, B_FLOAT_TO_BOOL, a >= b)                                                 \
    X(GE, ge, B_INT_TO_BOOL, a >= b)                                                   \
    X(LOGICAL_AND, logical_and, B_FLOAT_TO_BOOL, (a != 0) & (b != 0))                  \
    X(LOGICAL_AND, logical_and, B_INT_TO_BOOL, (a != 0) & (b != 0))                    \
    X(LOGICAL_OR, logical_or, B_FLOAT_TO_BOOL, (a != 0) | (b != 0))                    \
    X(LOGICAL_OR, logical_or, B_INT_TO_BOOL, (a != 0) | (b != 0))                       \
    /* ---- math, activations, rounding, bitwise, lerp ---- */                          \
    X(LOG1P, log1p, U_FLOAT, F32_OR_F64(vm_log1p(x), log1p(x)))                         \
    X(EXPM1, expm1, U_FLOAT, F32_OR_F64(vm_expm1(x), expm1(x)))                         \
    X(LOG2, log2, U_FLOAT, F32_OR_F64(vm_log2(x), log2(x)))                             \
    X(LOG10, log10, U_FLOAT, F32_OR_F64(vm_log10(x), log10(x)))                         \
    X(EXP2, exp2, U_FLOAT, F32_OR_F64(vm_exp2(x), exp2(x)))                             \
    X(FLOOR, floor, U_FLOAT, floor(x))                                                  \
    X(FLOOR, floor, U_INT, x)                                                           \
    X(CEIL, ceil, U_FLOAT, ceil(x))                                                     \
    X(CEIL, ceil, U_INT, x)                                                             \
    /* rint: half to even in the default rounding mode */                               \
    X(ROUND, round, U_FLOAT, rint(x))                                                   \
    X(ROUND, round, U_INT, x)                                                           \
    X(ROUND_DECIMALS, round_decimals, U_FLOAT,                                          \
      p_negdec ? rint(x / p_tenpow) * p_tenpow : rint(x * p_tenpow) / p_tenpow)         \
    X(TRUNC, trunc, U_FLOAT, trunc(x))                                                  \
    X(TRUNC, trunc, U_INT, x)                                                           \
    X(FRAC, frac, U_FLOAT, x - trunc(x))                                                \
    X(ERF, erf, U_FLOAT, F32_OR_F64(vm_erf(x), erf(x)))                                 \
    X(ERFC, erfc, U_FLOAT, F32_OR_F64(vm_erfc(x), erfc(x)))                             \
    X(ERFINV, erfinv, U_SPLIT, erfinv)                                                  \
    X(TAN, tan, U_TRIG, tan)                                                            \
    X(ASIN, asin, U_FLOAT, F32_OR_F64(vm_asin(x), asin(x)))                             \
    X(ACOS, acos, U_FLOAT, F32_OR_F64(vm_acos(x), acos(x)))                             \
    X(ATAN, atan, U_FLOAT, F32_OR_F64(vm_atan(x), atan(x)))                             \
    X(SINH, sinh, U_FLOAT, F32_OR_F64(vm_sinh(x), sinh(x)))                             \
    X(COSH, cosh, U_FLOAT, F32_OR_F64(vm_cosh(x), cosh(x)))                             \
    X(ASINH, asinh, U_FLOAT, F32_OR_F64(vm_asinh(x), asinh(x)))                         \
    X(ACOSH, acosh, U_FLOAT, F32_OR_F64(vm_acosh(x), acosh(x)))                         \
    X(ATANH, atanh, U_FLOAT, F32_OR_F64(vm_atanh(x), atanh(x)))                         \
    X(LEAKY_RELU, leaky_relu, U_FLOAT, x > 0 ? x : x * p_slope)                         \
    /* elu, selu, celu: PyTorch's scale, alpha and input_scale */                       \
    X(ELU, elu, U_FLOAT,                                                                \
      x > 0 ? p_escale * x : p_escale * p_ealpha * F32_OR_F64(vm_expm1(x * p_einscale), expm1(x * p_einscale)))\
    X(MISH, mish, U_FLOAT,                                                              \
      F32_OR_F64(vm_mish(x), x * tanh(log1p(exp(x)))))                     \
    X(HARDTANH, hardtanh, U_FLOAT, CLAMP_F(x))                                          \
    /* NaN passes through both, as PyTorch's min(max(x + 3, 0), 6) */                   \
    X(HARDSIGMOID, hardsigmoid, U_FLOAT, HSIG6(x) / (cT)6)                              \
    X(HARDSWISH, hardswish, U_FLOAT, x * HSIG6(x) / (cT)6)                              \
    X(LOGSIGMOID, logsigmoid, U_FLOAT,                                                  \
      F32_OR_F64(-vm_softplus(-x), (x < 0 ? x : (cT)0) - log1p(exp(-fabs(x)))))         \
    X(NAN_TO_NUM, nan_to_num, U_FLOAT,                                                  \
      x != x ? p_nan : x == (cT)INFINITY ? p_posinf : x == -(cT)INFINITY ? p_neginf : x)\
    X(NAN_TO_NUM, nan_to_num, U_INT, x)                                                 \
    X(NAN_TO_NUM, nan_to_num, U_BOOL, x)                                                \
    /* x - x: 0 for finite x, NaN for inf and NaN (integers: always 0) */               \
    X(ISNAN, isnan, U_FLOAT_TO_BOOL, x != x)                                            \
    X(ISNAN, isnan, U_INT_TO_BOOL, x != x)                                              \
    X(ISNAN, isnan, U_BOOL, x != x)                                                     \
    X(ISINF, isinf, U_FLOAT_TO_BOOL, x == x && x - x != 0)                              \
    X(ISINF, isinf, U_INT_TO_BOOL, x - x != 0)                                          \
    X(ISINF, isinf, U_BOOL, x != x)                                                     \
    X(ISFINITE, isfinite, U_FLOAT_TO_BOOL, x - x == 0)                                  \
    X(ISFINITE, isfinite, U_INT_TO_BOOL, x - x == 0)                                    \
    X(ISFINITE, isfinite, U_BOOL, x == x)                                               \
    X(BITWISE_NOT, bitwise_not, U_INT, (cT)~x)                                          \
    X(BITWISE_NOT, bitwise_not, U_BOOL, (cT)!x)                                         \
    X(ATAN2, atan2, B_FLOAT, F32_OR_F64(vm_atan2(a, b), atan2(a, b)))                   \
    X(FMOD, fmod, B_FMOD, 0)                                                          \
    X(FMOD, fmod, B_INT, IFMOD(a, b))                                                   \
    X(REMAINDER, remainder, B_FMOD, 1)                                        \
    X(REMAINDER, remainder, B_INT, IREM(a, b))                                          \
    X(BITWISE_AND, bitwise_and, B_INT, (cT)(a & b))                                     \
    X(BITWISE_AND, bitwise_and, B_BOOL, (cT)(a & b))                                    \
    X(BITWISE_OR, bitwise_or, B_INT, (cT)(a | b))                                       \
    X(BITWISE_OR, bitwise_or, B_BOOL, (cT)(a | b))                                      \
    X(BITWISE_XOR, bitwise_xor, B_INT, (cT)(a ^ b))                                     \
    X(BITWISE_XOR, bitwise_xor, B_BOOL, (cT)(a ^ b))                                    \
    X(BITWISE_LEFT_SHIFT, bitwise_left_shift, B_INT, SHL(a, b))                         \
    X(BITWISE_RIGHT_SHIFT, bitwise_right_shift, B_INT, SHR(a, b))                       \
    /* lerp as PyTorch: from the nearer end, so weight 1 gives end exactly */           \
    X(LERP, lerp, T_FLOAT,                                                              \
      fabs(w) < (cT)0.5 ? a + w * (b - a) : b - (b - a) * ((cT)1 - w))                 \
    /* grad_out (a) times gelu's derivative at x (b), cti_pointwise_params.approximate */ \
    X(GELU_BACKWARD, gelu_backward, B_GELU_BW, 0)                                       \
    /* grad_out (a) where x (b) > threshold, else 0; NaN x passes grad_out */             \
    X(THRESHOLD_BACKWARD, threshold_backward, B_FLOAT, b <= p_threshold ? (cT)0 : a)

#define DEFINE_(ID, op, FAMILY, EXPR) FAMILY(op, EXPR)
EW_OPS(DEFINE_)
#undef DEFINE_

/* ---- where: a select by element size ------------------------------------------------ */
#define WHERE_LOOP(name, T)                                                            \
    static void name(char **p, const int64_t *s, int64_t n, void *ctx) {               \
        const int64_t st = (int64_t)sizeof(T);                                         \
        if (s[0] == st && s[1] == 1 && s[2] == st && s[3] == st) {                     \
            T *restrict o = (T *)p[0];                                                 \
            const uint8_t *restrict c = (const uint8_t *)p[1];                         \
            const T *restrict a = (const T *)p[2], *restrict b = (const T *)p[3];      \
            for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : b[i];                 \
        } else if (s[0] == st && s[1] == 1 && (s[2] == 0 || s[2] == st) &&             \
                   (s[3] == 0 || s[3] == st)) {                                        \
            /* a scalar on one side (relu's backward): a select the compiler          \
             * turns into blends, where the general path below would branch on        \
             * every element */                                                        \
            T *restrict o = (T *)p[0];                                                 \
            const uint8_t *restrict c = (const uint8_t *)p[1];                         \
            const T *restrict a = (const T *)p[2], *restrict b = (const T *)p[3];      \
            const int64_t ia = s[2] ? 1 : 0, ib = s[3] ? 1 : 0;                        \
            if (!ia && ib) {                                                           \
                const T av = a[0];                                                     \
                for (int64_t i = 0; i < n; i++) o[i] = c[i] ? av : b[i];               \
            } else if (ia && !ib) {                                                    \
                const T bv = b[0];                                                     \
                for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : bv;               \
            } else {                                                                   \
                const T av = a[0], bv = b[0];                                          \
                for (int64_t i = 0; i < n; i++) o[i] = c[i] ? av : bv;                 \
            }                                                                          \
        } else {                                                                       \
            char *po = p[0];                                                           \
            const char *pc = p[1], *pa = p[2], *pb = p[3];                             \
            for (int64_t i = 0; i < n; i++, po += s[0], pc += s[1], pa += s[2], pb += s[3]) \
                *(T *)po = *(const uint8_t *)pc ? *(const T *)pa : *(const T *)pb;     \
        }                                                                              \
    }                                                                                  \
    KERNEL(k_##name, name, 3)
WHERE_LOOP(where_1, uint8_t)
WHERE_LOOP(where_2, uint16_t)
WHERE_LOOP(where_4, uint32_t)
WHERE_LOOP(where_8, uint64_t)

static const ew_reg g_regs[] = {
#define REGISTER_(ID, op, FAMILY, EXPR) REG_##FAMILY(ID, op)
    EW_OPS(REGISTER_)
#undef REGISTER_
    R_FLOAT(SUB, add) R_INT(SUB, add)
    {CT_OP_WHERE, CT_BOOL, k_where_1, "where_1"},
    {CT_OP_WHERE, CT_I32, k_where_4, "where_4"},
    {CT_OP_WHERE, CT_I64, k_where_8, "where_8"},
    {CT_OP_WHERE, CT_F16, k_where_2, "where_2"},
    {CT_OP_WHERE, CT_BF16, k_where_2, "where_2"},
    {CT_OP_WHERE, CT_F32, k_where_4, "where_4"},
    {CT_OP_WHERE, CT_F64, k_where_8, "where_8"},
};

void cti_cpu_register_elementwise(void) {
    for (size_t i = 0; i < sizeof g_regs / sizeof g_regs[0]; i++)
        cti_register_kernel(g_regs[i].op, CT_DEVICE_CPU, g_regs[i].dtype, g_regs[i].fn,
                            g_regs[i].name);
}
