/* CPU kernels that create or convert data: copy (any dtype to any dtype, with
 * broadcasting), fill, arange/linspace and the random fills.
 *
 * Conversions follow C casts for values the destination can hold, as PyTorch
 * does: float to integer truncates toward zero, float to bool is v != 0, and
 * f16/bf16 round to nearest even (through float, so f64 -> f16 rounds twice,
 * as PyTorch's static_cast<Half>(double) does). Values an integer cannot hold
 * are where C leaves the result undefined; here they saturate and NaN gives 0,
 * so every input has a defined result. */

/* -O2's vectorizer skips loops of unknown length; these are all such loops. */
#if defined(__GNUC__) && !defined(__clang__) /* clang vectorizes them at -O2 and knows no such pragma */
#pragma GCC optimize("O3")
#endif

#include <math.h>
#include <string.h>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define CTI_HAVE_F16C 1
#endif

#include "cpu_impl.h"

/* ---- scalar conversions --------------------------------------------------------- */

static inline float dec_f16(uint16_t h) {
#ifdef CTI_HAVE_F16C
    return _cvtsh_ss(h);
#else
    return cti_f16_to_f32(h);
#endif
}

static inline uint16_t enc_f16(float f) {
#ifdef CTI_HAVE_F16C
    if (f != f) return cti_f32_to_f16(f); /* the converter's NaN: sign kept, payload dropped */
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return cti_f32_to_f16(f);
#endif
}

/* Written as selects the vectorizer turns into blends: convert in-range
 * values (others as 0), then patch in the saturated ends. NaN fails every
 * comparison and stays 0. */
static inline int32_t f2i32(double v) {
    int32_t r = (int32_t)(v > -2147483649.0 && v < 2147483648.0 ? v : 0.0);
    r = v >= 2147483648.0 ? INT32_MAX : r;
    return v <= -2147483649.0 ? INT32_MIN : r;
}

static inline int64_t f2i64(double v) {
    int64_t r = (int64_t)(v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? v : 0.0);
    r = v >= 9223372036854775808.0 ? INT64_MAX : r;
    return v < -9223372036854775808.0 ? INT64_MIN : r;
}

/* Float sources go through f2i*, integer sources are plain casts (int64 to
 * int32 wraps, as in PyTorch). */
#define TO_I32(v) _Generic((v), float: f2i32, double: f2i32, default: cast_i32)(v)
#define TO_I64(v) _Generic((v), float: f2i64, double: f2i64, default: cast_i64)(v)
static inline int32_t cast_i32(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }
static inline int64_t cast_i64(int64_t v) { return v; }

#define TO_F32(v) ((float)(v))
#define TO_F64(v) ((double)(v))
#define TO_F16(v) enc_f16((float)(v))
#define TO_BF16(v) cti_f32_to_bf16((float)(v))
#define TO_BOOL(v) ((uint8_t)((v) != 0))

/* Storage types and decoders per dtype; the decoded value is float, double or
 * an integer, which the TO_ macros take. */
typedef uint8_t st_BOOL;
typedef int32_t st_I32;
typedef int64_t st_I64;
typedef uint16_t st_F16;
typedef uint16_t st_BF16;
typedef float st_F32;
typedef double st_F64;
#define DEC_BOOL(x) ((int64_t)(x))
#define DEC_I32(x) ((int64_t)(x))
#define DEC_I64(x) ((int64_t)(x))
#define DEC_F16(x) dec_f16(x)
#define DEC_BF16(x) cti_bf16_to_f32(x)
#define DEC_F32(x) (x)
#define DEC_F64(x) (x)

/* ---- copy loops ------------------------------------------------------------------ */

/* One loop per (dst, src) pair: contiguous rows, a broadcast source (stride 0)
 * and the general strided case. ptrs[0]/strides[0] is dst, [1] is src. */
#define COPY_LOOP(D, S)                                                                   \
    static void cp_##S##_to_##D(char **p, const int64_t *st, int64_t n, void *ctx) {     \
        (void)ctx;                                                                        \
        char *d = p[0];                                                                   \
        const char *s = p[1];                                                             \
        if (st[0] == (int64_t)sizeof(st_##D) && st[1] == (int64_t)sizeof(st_##S)) {       \
            st_##D *restrict o = (st_##D *)d;                                             \
            const st_##S *restrict x = (const st_##S *)s;                                 \
            for (int64_t i = 0; i < n; i++) o[i] = TO_##D(DEC_##S(x[i]));                 \
        } else if (st[1] == 0) {                                                          \
            st_##D v = TO_##D(DEC_##S(*(const st_##S *)s));                               \
            for (int64_t i = 0; i < n; i++) *(st_##D *)(d + i * st[0]) = v;               \
        } else {                                                                          \
            for (int64_t i = 0; i < n; i++)                                               \
                *(st_##D *)(d + i * st[0]) = TO_##D(DEC_##S(*(const st_##S *)(s + i * st[1]))); \
        }                                                                                 \
    }

#define COPY_LOOPS_FROM(S)                                                                \
    COPY_LOOP(BOOL, S) COPY_LOOP(I32, S) COPY_LOOP(I64, S) COPY_LOOP(F16, S)              \
    COPY_LOOP(BF16, S) COPY_LOOP(F32, S) COPY_LOOP(F64, S)
COPY_LOOPS_FROM(BOOL)
COPY_LOOPS_FROM(I32)
COPY_LOOPS_FROM(I64)
COPY_LOOPS_FROM(F16)
COPY_LOOPS_FROM(BF16)
COPY_LOOPS_FROM(F32)
COPY_LOOPS_FROM(F64)

/* Same dtype: move the bits (a decode/encode round trip would canonicalize
 * NaN payloads and cost time). */
#define RAW_LOOP(T, NAME)                                                                 \
    static void NAME(char **p, const int64_t *st, int64_t n, void *ctx) {                \
        (void)ctx;                                                                        \
        char *d = p[0];                                                                   \
        const char *s = p[1];                                                             \
        if (st[0] == (int64_t)sizeof(T) && st[1] == (int64_t)sizeof(T)) {                \
            memcpy(d, s, (size_t)n * sizeof(T));                                          \
        } else if (st[1] == 0) {                                                          \
            T v;                                                                          \
            memcpy(&v, s, sizeof v);                                                      \
            for (int64_t i = 0; i < n; i++) *(T *)(d + i * st[0]) = v;                    \
        } else {                                                                          \
            for (int64_t i = 0; i < n; i++) *(T *)(d + i * st[0]) = *(const T *)(s + i * st[1]); \
        }                                                                                 \
    }
RAW_LOOP(uint8_t, raw_copy_1)
RAW_LOOP(uint16_t, raw_copy_2)
RAW_LOOP(uint32_t, raw_copy_4)
RAW_LOOP(uint64_t, raw_copy_8)

#ifdef CTI_HAVE_F16C
/* The two conversions mixed-precision code runs most, 8 lanes at a time. */
static void cp_F32_to_F16_vec(char **p, const int64_t *st, int64_t n, void *ctx) {
    if (st[0] != 2 || st[1] != 4) {
        cp_F32_to_F16(p, st, n, ctx);
        return;
    }
    uint16_t *o = (uint16_t *)p[0];
    const float *x = (const float *)p[1];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        /* NaN lanes go through the scalar path for the canonical NaN. */
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
            for (int k = 0; k < 8; k++) o[i + k] = enc_f16(x[i + k]);
            continue;
        }
        _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++) o[i] = enc_f16(x[i]);
}

static void cp_F16_to_F32_vec(char **p, const int64_t *st, int64_t n, void *ctx) {
    if (st[0] != 4 || st[1] != 2) {
        cp_F16_to_F32(p, st, n, ctx);
        return;
    }
    float *o = (float *)p[0];
    const uint16_t *x = (const uint16_t *)p[1];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) o[i] = dec_f16(x[i]);
}
#define CP_F32_TO_F16 cp_F32_to_F16_vec
#define CP_F16_TO_F32 cp_F16_to_F32_vec
#else
#define CP_F32_TO_F16 cp_F32_to_F16
#define CP_F16_TO_F32 cp_F16_to_F32
#endif

/* copy_loops[dst][src], in ct_dtype order: BOOL, I32, I64, F16, BF16, F32, F64. */
#define ROW(D)                                                                            \
    {cp_BOOL_to_##D, cp_I32_to_##D, cp_I64_to_##D, cp_F16_to_##D, cp_BF16_to_##D,         \
     cp_F32_to_##D, cp_F64_to_##D}
static const cti_loop_fn copy_loops[CT_NUM_DTYPES][CT_NUM_DTYPES] = {
    ROW(BOOL), ROW(I32), ROW(I64), ROW(F16), ROW(BF16), ROW(F32), ROW(F64),
};
#undef ROW

static cti_loop_fn copy_loop(ct_dtype dst, ct_dtype src) {
    if (dst == src) {
        switch (ct_dtype_size(dst)) {
        case 1: return raw_copy_1;
        case 2: return raw_copy_2;
        case 4: return raw_copy_4;
        default: return raw_copy_8;
        }
    }
    if (dst == CT_F16 && src == CT_F32) return CP_F32_TO_F16;
    if (dst == CT_F32 && src == CT_F16) return CP_F16_TO_F32;
    return copy_loops[dst][src];
}

typedef struct memcpy_ctx {
    char *dst;
    const char *src;
} memcpy_ctx;

static void memcpy_range(int64_t begin, int64_t end, void *ctx) {
    memcpy_ctx *m = ctx;
    memcpy(m->dst + begin, m->src + begin, (size_t)(end - begin));
}

static bool same_shape(const ct_tensor *a, const ct_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

/* ---- tiled copy of transposed sources ----------------------------------------------------
 * When dst is contiguous but src is unit-stride in another dim (a transposed
 * or permuted tensor made contiguous), a row-by-row walk reads one element per
 * cache line of src. Tiles over (that dim, dst's last dim) keep both sides'
 * lines in L1 while they are used. */
#define TILE 64

typedef struct tile_job {
    cti_loop_fn fn;
    char *dst;
    const char *src;
    int64_t des, ses;           /* element sizes */
    int kdim, inner;            /* src's unit-stride dim, the last dim */
    int nouter;                 /* the other dims */
    int64_t oshape[CT_MAX_DIMS], odst[CT_MAX_DIMS], osrc[CT_MAX_DIMS];
    int64_t nk, ni;             /* sizes of kdim and inner */
    int64_t dstride_k, sstride_i;
    int64_t tk, ti;             /* tiles along kdim and inner */
} tile_job;

static void tile_range(int64_t begin, int64_t end, void *ctx) {
    const tile_job *j = ctx;
    for (int64_t id = begin; id < end; id++) {
        int64_t tj = id % j->ti, tk = (id / j->ti) % j->tk, b = id / (j->ti * j->tk);
        int64_t doff = 0, soff = 0;
        for (int d = j->nouter - 1; d >= 0; d--) {
            int64_t x = b % j->oshape[d];
            b /= j->oshape[d];
            doff += x * j->odst[d];
            soff += x * j->osrc[d];
        }
        int64_t k0 = tk * TILE, k1 = k0 + TILE < j->nk ? k0 + TILE : j->nk;
        int64_t i0 = tj * TILE, i1 = i0 + TILE < j->ni ? i0 + TILE : j->ni;
        const int64_t strides[2] = {j->des, j->sstride_i * j->ses};
        for (int64_t k = k0; k < k1; k++) {
            char *ptrs[2] = {j->dst + (doff + k * j->dstride_k + i0) * j->des,
                             (char *)j->src + (soff + k + i0 * j->sstride_i) * j->ses};
            j->fn(ptrs, strides, i1 - i0, NULL);
        }
    }
}

static bool try_tiled_copy(ct_tensor *dst, const ct_tensor *src, cti_loop_fn fn, int64_t n) {
    int nd = dst->ndim, inner = nd - 1;
    if (n < 4 * TILE * TILE || nd < 2 || !same_shape(src, dst) || !cti_is_contiguous(dst) ||
        src->stride[inner] == 1 || dst->shape[inner] < 8)
        return false;
    int kdim = -1;
    for (int d = 0; d < inner; d++)
        if (src->stride[d] == 1 && dst->shape[d] >= 8) kdim = d;
    if (kdim < 0) return false;
    tile_job j = {fn, cti_data(dst), cti_data(src), (int64_t)ct_dtype_size(dst->dtype),
                  (int64_t)ct_dtype_size(src->dtype), kdim, inner, 0, {0}, {0}, {0},
                  dst->shape[kdim], dst->shape[inner], dst->stride[kdim], src->stride[inner],
                  (dst->shape[kdim] + TILE - 1) / TILE, (dst->shape[inner] + TILE - 1) / TILE};
    int64_t batches = 1;
    for (int d = 0; d < inner; d++) {
        if (d == kdim) continue;
        j.oshape[j.nouter] = dst->shape[d];
        j.odst[j.nouter] = dst->stride[d];
        j.osrc[j.nouter++] = src->stride[d];
        batches *= dst->shape[d];
    }
    cti_parallel_for(batches * j.tk * j.ti, CTI_GRAIN / (TILE * TILE), tile_range, &j);
    return true;
}

/* in[0] = src, out[0] = dst; src broadcasts to dst's shape (checked by the
 * front end). Registered once per dst dtype; the src dtype picks the loop. */
static ct_status k_copy(ct_call *c) {
    ct_tensor *dst = c->out[0], *src = c->in[0];
    int64_t n = cti_numel(dst->ndim, dst->shape);
    if (n == 0) return CT_OK;
    if (src->dtype == dst->dtype && same_shape(src, dst) && cti_is_contiguous(src) &&
        cti_is_contiguous(dst)) {
        memcpy_ctx m = {cti_data(dst), cti_data(src)};
        int64_t nbytes = n * (int64_t)ct_dtype_size(dst->dtype);
        cti_parallel_for(nbytes, 1 << 20, memcpy_range, &m);
        c->routine = "memcpy";
        return CT_OK;
    }
    cti_loop_fn fn = copy_loop(dst->dtype, src->dtype);
    if (try_tiled_copy(dst, src, fn, n)) {
        c->routine = "cpu_copy_tiled";
        return CT_OK;
    }
    ct_tensor *ops[2] = {dst, src};
    return cti_cpu_foreach(2, ops, fn, NULL);
}

/* ---- fill ----------------------------------------------------------------------------- */

/* The value converted to dst's dtype, as bytes. */
static void encode_value(double v, ct_dtype dt, void *out) {
    switch (dt) {
    case CT_BOOL: *(uint8_t *)out = TO_BOOL(v); break;
    case CT_I32: *(int32_t *)out = TO_I32(v); break;
    case CT_I64: *(int64_t *)out = TO_I64(v); break;
    case CT_F16: *(uint16_t *)out = TO_F16(v); break;
    case CT_BF16: *(uint16_t *)out = TO_BF16(v); break;
    case CT_F32: *(float *)out = TO_F32(v); break;
    default: *(double *)out = v; break;
    }
}

#define FILL_LOOP(T, NAME)                                                                \
    static void NAME(char **p, const int64_t *st, int64_t n, void *ctx) {                \
        T v;                                                                              \
        memcpy(&v, ctx, sizeof v);                                                        \
        char *d = p[0];                                                                   \
        if (st[0] == (int64_t)sizeof(T)) {                                                \
            T *restrict o = (T *)d;                                                       \
            for (int64_t i = 0; i < n; i++) o[i] = v;                                     \
        } else {                                                                          \
            for (int64_t i = 0; i < n; i++) *(T *)(d + i * st[0]) = v;                    \
        }                                                                                 \
    }
FILL_LOOP(uint8_t, fill_1)
FILL_LOOP(uint16_t, fill_2)
FILL_LOOP(uint32_t, fill_4)
FILL_LOOP(uint64_t, fill_8)

typedef struct memset_ctx {
    char *dst;
    int byte;
} memset_ctx;

static void memset_range(int64_t begin, int64_t end, void *ctx) {
    memset_ctx *m = ctx;
    memset(m->dst + begin, m->byte, (size_t)(end - begin));
}

/* out[0] = dst <- value, every element. */
static ct_status k_fill(ct_call *c) {
    const cti_fill_params *p = CTI_PARAMS(c, cti_fill_params);
    ct_tensor *dst = c->out[0];
    int64_t n = cti_numel(dst->ndim, dst->shape);
    if (n == 0) return CT_OK;
    unsigned char bytes[8];
    size_t es = ct_dtype_size(dst->dtype);
    encode_value(p->value, dst->dtype, bytes);
    bool uniform_bytes = true;
    for (size_t k = 1; k < es; k++) uniform_bytes &= bytes[k] == bytes[0];
    if (uniform_bytes && cti_is_contiguous(dst)) {
        memset_ctx m = {cti_data(dst), bytes[0]};
        cti_parallel_for(n * (int64_t)es, 1 << 20, memset_range, &m);
        c->routine = "memset";
        return CT_OK;
    }
    cti_loop_fn fn = es == 1 ? fill_1 : es == 2 ? fill_2 : es == 4 ? fill_4 : fill_8;
    return cti_cpu_foreach(1, &dst, fn, bytes);
}

/* ---- arange / linspace ------------------------------------------------------------------
 * out[0] is a fresh contiguous tensor (cti_range_params):
 *   arange:   out[i] = start + i * step
 *   linspace: out[i] = start + i * step             for i < steps / 2
 *             out[i] = end - (steps - 1 - i) * step  otherwise
 * (PyTorch's symmetric formula, so both ends are exact). Values are computed
 * in double and converted once. */
typedef struct range_ctx {
    ct_tensor *out;
    cti_range_params p;
} range_ctx;

static inline double range_value(const cti_range_params *p, int64_t i) {
    if (!p->linspace || i < p->steps / 2) return p->start + (double)i * p->step;
    return p->end - (double)(p->steps - 1 - i) * p->step;
}

#define RANGE_FN(D)                                                                       \
    static void range_##D(int64_t begin, int64_t end, void *ctx) {                        \
        const range_ctx *r = ctx;                                                         \
        st_##D *o = (st_##D *)cti_data(r->out);                                           \
        for (int64_t i = begin; i < end; i++) o[i] = TO_##D(range_value(&r->p, i));       \
    }
RANGE_FN(BOOL)
RANGE_FN(I32)
RANGE_FN(I64)
RANGE_FN(F16)
RANGE_FN(BF16)
RANGE_FN(F32)
RANGE_FN(F64)
static const cti_range_fn range_fns[CT_NUM_DTYPES] = {range_BOOL, range_I32, range_I64, range_F16,
                                                      range_BF16, range_F32, range_F64};

static ct_status k_arange(ct_call *c) {
    range_ctx r = {c->out[0], *CTI_PARAMS(c, cti_range_params)};
    int64_t n = cti_numel(r.out->ndim, r.out->shape);
    cti_parallel_for(n, CTI_GRAIN, range_fns[r.out->dtype], &r);
    return CT_OK;
}

/* ---- random fills ------------------------------------------------------------------------
 * Philox-4x32-10 draws: draw number j of the call is ct_philox(seed, first + j),
 * with seed and first = offset from the cti_random_params (offset: the first
 * draw the front end reserved from the generator). Element k of the
 * (contiguous, fresh or row-major) output uses draws first + k*D ...
 * first + k*D + D-1, so the result depends only on (seed, first, k), never
 * on threads or chunking:
 *
 *   uniform  f32:  D = 1, u = (d >> 8) * 2^-24                (24 bits)
 *            f16:  D = 1, u = (d >> 21) * 2^-11               (11 bits)
 *            bf16: D = 1, u = (d >> 24) * 2^-8                ( 8 bits)
 *            f64:  D = 2, u = (((d0 << 32) | d1) >> 11) * 2^-53
 *            value = low + (high - low) * u in double, rounded to the dtype.
 *            Taking as many bits as the dtype's significand holds (as PyTorch
 *            does) keeps U[0,1) from rounding up to 1.
 *   normal   elements 2j and 2j+1 share draws of pair j (2D draws): two
 *            uniforms, in double, u1 in (0,1] and u2 in [0,1):
 *              D = 1: u1 = (d0 + 1) * 2^-32, u2 = d1 * 2^-32
 *              D = 2: u1 = 1 - 53-bit(d0,d1), u2 = 53-bit(d2,d3)  (as uniform f64)
 *            r = sqrt(-2 ln u1), element 2j = mean + std * r cos(2 pi u2),
 *            element 2j+1 = mean + std * r sin(2 pi u2) (an odd last element
 *            takes the cos branch; its pair's draws are still reserved).
 *   randint  D = 2, value = low + ((d0 << 32) | d1) mod (high - low),
 *            converted to the dtype exactly (the front end checks the range
 *            fits). */

#define RNG_CHUNK 512

/* buf[j] = draw number first + j, for j < count. */
static void fill_draws(uint64_t seed, uint64_t first, int64_t count, uint32_t *buf) {
    uint64_t idx = first;
    int64_t k = 0;
    while (k < count) {
        uint32_t blk[4];
        cti_philox_block(seed, idx >> 2, blk);
        for (unsigned j = (unsigned)(idx & 3); j < 4 && k < count; j++, idx++) buf[k++] = blk[j];
    }
}

typedef struct rng_ctx {
    ct_tensor *out;
    uint64_t seed, first;
    double a, b;        /* low/high or mean/std */
    int64_t ilow;       /* randint */
    uint64_t irange;    /* randint: high - low */
} rng_ctx;

static inline double u53(uint32_t hi, uint32_t lo) {
    return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

/* Uniform: the per-dtype transform of one element's draws. */
#define U_F32(d) ((double)((d)[0] >> 8) * 0x1p-24)
#define U_F16(d) ((double)((d)[0] >> 21) * 0x1p-11)
#define U_BF16(d) ((double)((d)[0] >> 24) * 0x1p-8)
#define U_F64(d) u53((d)[0], (d)[1])

#define UNIFORM_FN(D, NDRAW)                                                              \
    static void uniform_##D(int64_t begin, int64_t end, void *ctx) {                     \
        const rng_ctx *r = ctx;                                                           \
        st_##D *o = (st_##D *)cti_data(r->out);                                           \
        uint32_t buf[RNG_CHUNK * (NDRAW)];                                                \
        double span = r->b - r->a;                                                        \
        for (int64_t c0 = begin; c0 < end; c0 += RNG_CHUNK) {                             \
            int64_t m = end - c0 < RNG_CHUNK ? end - c0 : RNG_CHUNK;                      \
            fill_draws(r->seed, r->first + (uint64_t)c0 * (NDRAW), m * (NDRAW), buf);     \
            for (int64_t k = 0; k < m; k++)                                               \
                o[c0 + k] = TO_##D(r->a + span * U_##D(buf + k * (NDRAW)));               \
        }                                                                                 \
    }
UNIFORM_FN(F32, 1)
UNIFORM_FN(F16, 1)
UNIFORM_FN(BF16, 1)
UNIFORM_FN(F64, 2)

/* Normal: iterates over pairs; element 2j+1 is written only when it exists. */
#define NORMAL_FN(D, NDRAW)                                                               \
    static void normal_##D(int64_t begin, int64_t end, void *ctx) {                      \
        const rng_ctx *r = ctx;                                                           \
        st_##D *o = (st_##D *)cti_data(r->out);                                           \
        int64_t n = cti_numel(r->out->ndim, r->out->shape);                               \
        uint32_t buf[RNG_CHUNK * 2 * (NDRAW)];                                            \
        for (int64_t c0 = begin; c0 < end; c0 += RNG_CHUNK) {                             \
            int64_t m = end - c0 < RNG_CHUNK ? end - c0 : RNG_CHUNK;                      \
            fill_draws(r->seed, r->first + (uint64_t)c0 * 2 * (NDRAW), m * 2 * (NDRAW), buf); \
            for (int64_t k = 0; k < m; k++) {                                             \
                const uint32_t *d = buf + k * 2 * (NDRAW);                                \
                double u1, u2;                                                            \
                if ((NDRAW) == 1) {                                                       \
                    u1 = ((double)d[0] + 1.0) * 0x1p-32;                                  \
                    u2 = (double)d[1] * 0x1p-32;                                          \
                } else {                                                                  \
                    u1 = 1.0 - u53(d[0], d[1]);                                           \
                    u2 = u53(d[(NDRAW)], d[(NDRAW) + 1]);                                 \
                }                                                                         \
                double rad = sqrt(-2.0 * log(u1)), sn, cs;                                \
                sincos(2.0 * M_PI * u2, &sn, &cs);                                        \
                int64_t e = 2 * (c0 + k);                                                 \
                o[e] = TO_##D(r->a + r->b * rad * cs);                                    \
                if (e + 1 < n) o[e + 1] = TO_##D(r->a + r->b * rad * sn);                 \
            }                                                                             \
        }                                                                                 \
    }
NORMAL_FN(F32, 1)
NORMAL_FN(F16, 1)
NORMAL_FN(BF16, 1)
NORMAL_FN(F64, 2)

#define RANDINT_FN(D)                                                                     \
    static void randint_##D(int64_t begin, int64_t end, void *ctx) {                     \
        const rng_ctx *r = ctx;                                                           \
        st_##D *o = (st_##D *)cti_data(r->out);                                           \
        uint32_t buf[RNG_CHUNK * 2];                                                      \
        for (int64_t c0 = begin; c0 < end; c0 += RNG_CHUNK) {                             \
            int64_t m = end - c0 < RNG_CHUNK ? end - c0 : RNG_CHUNK;                      \
            fill_draws(r->seed, r->first + (uint64_t)c0 * 2, m * 2, buf);                 \
            for (int64_t k = 0; k < m; k++) {                                             \
                uint64_t v = ((uint64_t)buf[2 * k] << 32) | buf[2 * k + 1];               \
                int64_t x = (int64_t)((uint64_t)r->ilow + v % r->irange);                 \
                o[c0 + k] = TO_##D(x);                                                    \
            }                                                                             \
        }                                                                                 \
    }
RANDINT_FN(BOOL)
RANDINT_FN(I32)
RANDINT_FN(I64)
RANDINT_FN(F16)
RANDINT_FN(BF16)
RANDINT_FN(F32)
RANDINT_FN(F64)
static const cti_range_fn randint_fns[CT_NUM_DTYPES] = {
    randint_BOOL, randint_I32, randint_I64, randint_F16, randint_BF16, randint_F32, randint_F64};

/* Threads split the output in chunks; each computes its own draws. */
#define RNG_GRAIN 16384

static rng_ctx rng_setup(const ct_call *c) {
    const cti_random_params *p = CTI_PARAMS(c, cti_random_params);
    rng_ctx r = {c->out[0], p->seed, p->offset, p->a, p->b,
                 p->low, (uint64_t)p->high - (uint64_t)p->low};
    return r;
}

static ct_status k_uniform(ct_call *c) {
    rng_ctx r = rng_setup(c);
    int64_t n = cti_numel(r.out->ndim, r.out->shape);
    cti_range_fn fn;
    switch (r.out->dtype) {
    case CT_F32: fn = uniform_F32; break;
    case CT_F16: fn = uniform_F16; break;
    case CT_BF16: fn = uniform_BF16; break;
    default: fn = uniform_F64; break;
    }
    cti_parallel_for(n, RNG_GRAIN, fn, &r);
    return CT_OK;
}

static ct_status k_normal(ct_call *c) {
    rng_ctx r = rng_setup(c);
    int64_t pairs = (cti_numel(r.out->ndim, r.out->shape) + 1) / 2;
    cti_range_fn fn;
    switch (r.out->dtype) {
    case CT_F32: fn = normal_F32; break;
    case CT_F16: fn = normal_F16; break;
    case CT_BF16: fn = normal_BF16; break;
    default: fn = normal_F64; break;
    }
    cti_parallel_for(pairs, RNG_GRAIN / 2, fn, &r);
    return CT_OK;
}

static ct_status k_randint(ct_call *c) {
    rng_ctx r = rng_setup(c);
    int64_t n = cti_numel(r.out->ndim, r.out->shape);
    cti_parallel_for(n, RNG_GRAIN, randint_fns[r.out->dtype], &r);
    return CT_OK;
}

/* ---- registration ----------------------------------------------------------------------- */

void cti_cpu_register_copy(void) {
    static const char *const copy_names[CT_NUM_DTYPES] = {
        "cpu_copy_to_bool", "cpu_copy_to_int32", "cpu_copy_to_int64", "cpu_copy_to_float16",
        "cpu_copy_to_bfloat16", "cpu_copy_to_float32", "cpu_copy_to_float64"};
    for (int d = 0; d < CT_NUM_DTYPES; d++) {
        ct_dtype dt = (ct_dtype)d;
        cti_register_kernel(CT_OP_COPY, CT_DEVICE_CPU, dt, k_copy, copy_names[d]);
        cti_register_kernel(CT_OP_FILL, CT_DEVICE_CPU, dt, k_fill, "cpu_fill");
        cti_register_kernel(CT_OP_ARANGE, CT_DEVICE_CPU, dt, k_arange, "cpu_arange");
        cti_register_kernel(CT_OP_RANDINT, CT_DEVICE_CPU, dt, k_randint, "cpu_randint_philox");
        if (ct_dtype_is_floating(dt)) {
            cti_register_kernel(CT_OP_RAND_UNIFORM, CT_DEVICE_CPU, dt, k_uniform,
                                "cpu_uniform_philox");
            cti_register_kernel(CT_OP_RAND_NORMAL, CT_DEVICE_CPU, dt, k_normal,
                                "cpu_normal_philox_box_muller");
        }
    }
}
