/* CPU reductions: sum, mean, prod, var/std, norm, max/min (with or without
 * indices) and argmax/argmin, for any strides.
 *
 * Per output element, over the n reduced elements x_j:
 *   sum = sum_j x_j, mean = sum / n, prod = prod_j x_j,
 *   var = sum_j (x_j - mean)^2 / max(0, n - correction), std = sqrt(var),
 *   norm = (sum_j |x_j|^p)^(1/p) (p = inf: max |x_j|, -inf: min |x_j|,
 *   0: the count of non-zeros), max/min (NaN if any x_j is) and their
 *   index (the first NaN, else the first max/min).
 *
 * Kernel interface (the front ends are in src/ops/reduce.c):
 *   in[0]   x, any non-negative strides (expanded dims included)
 *   out[0]  the values, or the int64 indices for ARGMAX/ARGMIN; contiguous, one
 *           element per combination of the kept dims in x's dim order (the front
 *           end allocates it with or without the size-1 reduced dims: the layout
 *           is the same)
 *   out[1]  MAX/MIN only, when nout == 2: the int64 indices, same layout
 *   params  cti_reduce_params: mask, the reduced dims of x (bit d reduces dim
 *           d; 0 for a 0-d x); VAR: correction, and std for the standard
 *           deviation instead; NORM: p
 * Output dtypes are the front end's: sum/prod of bool and integers write
 * int64, everything else x's dtype (indices int64). An index counts positions
 * in the row-major order of the reduced dims (the position along the dim for
 * one dim, the flat index when every dim is reduced).
 *
 * Floating inputs are converted to double in small blocks and accumulated in
 * double, so f16/bf16/f32 sums are as accurate as f64 ones; integers and bool
 * are accumulated in int64 (sum and prod wrap as PyTorch's do). Variance is a
 * two-pass mean/deviation per block of a row, blocks and chunks merged with
 * Chan's formula; in column layout it is Welford's update per column.
 *
 * Layout: size-1 dims are dropped and adjacent dims merged where the strides
 * allow. Value reductions visit the reduced dims in decreasing stride order
 * (arg reductions keep the dim order, which defines the index). When the
 * innermost reduced dim has the smallest stride each output reduces its own
 * rows ("row mode": row sums, full reductions); otherwise up to CW neighbouring
 * outputs along the innermost kept dim are reduced together, one loaded row of
 * CW values per reduction position, with vectorizable per-column updates
 * ("column mode": column sums). A few outputs with a long reduction split the
 * reduction into chunks whose partial results are merged in chunk order. Every
 * split depends on the shapes only, so results do not depend on the number of
 * threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

#define RB 1024       /* row elements converted to double per block */
#define CW 256        /* outputs reduced together in column mode */
#define CHUNK 32768   /* reduction elements per chunk when few outputs are long */
#define MAXCHUNKS 64
#define MAXPARTS 32768 /* partial accumulators kept for chunked reductions */

enum { K_SUM, K_MEAN, K_PROD, K_VAR, K_NORM, K_MAX, K_MIN };
enum { P_TWO, P_ONE, P_INF, P_NINF, P_ZERO, P_GEN };

/* One output's running state. s: float sum/product/norm accumulator, the
 * running mean (var) or the float max/min; i: integer sum/product or max/min;
 * m2: squared deviations (var); n: elements seen; idx: index of the max/min. */
typedef struct racc {
    double s, m2;
    int64_t i, n, idx;
} racc;

/* CW outputs of a column-mode group, stored per field so the per-column
 * updates vectorize; n is shared (every column sees every row). */
typedef struct cacc {
    double s[CW], m2[CW];
    int64_t i[CW], idx[CW];
    int64_t n;
} cacc;

typedef struct rctx {
    int kind, pk;
    bool flt;      /* floating input: the double family */
    bool want_idx; /* indices are tracked */
    bool want_std;
    double p, corr;
    ct_dtype dt, odt;
    int nk, nr;
    int64_t ksh[CT_MAX_DIMS], kst[CT_MAX_DIMS]; /* kept dims, strides in bytes */
    int64_t rsh[CT_MAX_DIMS], rst[CT_MAX_DIMS]; /* reduced dims, strides in bytes */
    int64_t O, R;
    bool col;
    int64_t klast, kblocks, ngroups, gw, nchunks, chunk;
    const char *x;
    char *ov, *oi;
    racc *part;
} rctx;

/* for (int64_t i = 0; i < n; i++) { body } with the bulk in blocks of a fixed
 * 16 iterations, which the cheap vectorizer of -O2 takes on. */
#define VFOR(i, n, ...)                                                      \
    do {                                                                     \
        int64_t i##_b = 0, i##_n = (n);                                      \
        for (; i##_b + 16 <= i##_n; i##_b += 16)                             \
            for (int i##_j = 0; i##_j < 16; i##_j++) {                       \
                int64_t i = i##_b + i##_j;                                   \
                __VA_ARGS__;                                                 \
            }                                                                \
        for (int64_t i = i##_b; i < i##_n; i++) { __VA_ARGS__; }             \
    } while (0)

/* ---- conversions ----------------------------------------------------------------- */
static inline float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Exact f16 -> f32 in integer and float arithmetic only (M. Dukhan's FP16
 * method), so the conversion loops vectorize on any x86-64: normals rescale
 * the exponent by a multiply, subnormals come from a magic-number subtract. */
static inline float h2f(uint16_t h) {
    uint32_t w = (uint32_t)h << 16;
    uint32_t sign = w & 0x80000000u;
    uint32_t two_w = w + w;
    float normalized = bits_f((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    float denormalized = bits_f((two_w >> 17) | (126u << 23)) - 0.5f;
    uint32_t r = two_w < (1u << 27) ? f_bits(denormalized) : f_bits(normalized);
    return bits_f(sign | r);
}

static inline float bf2f(uint16_t h) { return bits_f((uint32_t)h << 16); }

/* n elements at p (byte stride sb) as doubles: a pointer into x itself for
 * contiguous f64, else buf filled. */
static const double *load_d(ct_dtype dt, const char *p, int64_t sb, int64_t n, double *buf) {
    switch (dt) {
    case CT_F64:
        if (sb == 8) return (const double *)p;
        VFOR(i, n, buf[i] = *(const double *)(p + i * sb));
        break;
    case CT_F32:
        if (sb == 4) {
            const float *q = (const float *)p;
            VFOR(i, n, buf[i] = q[i]);
        } else {
            VFOR(i, n, buf[i] = *(const float *)(p + i * sb));
        }
        break;
    case CT_F16:
        if (sb == 2) {
            const uint16_t *q = (const uint16_t *)p;
            VFOR(i, n, buf[i] = h2f(q[i]));
        } else {
            VFOR(i, n, buf[i] = h2f(*(const uint16_t *)(p + i * sb)));
        }
        break;
    case CT_BF16:
        if (sb == 2) {
            const uint16_t *q = (const uint16_t *)p;
            VFOR(i, n, buf[i] = bf2f(q[i]));
        } else {
            VFOR(i, n, buf[i] = bf2f(*(const uint16_t *)(p + i * sb)));
        }
        break;
    default:
        break;
    }
    return buf;
}

static const int64_t *load_i(ct_dtype dt, const char *p, int64_t sb, int64_t n, int64_t *buf) {
    switch (dt) {
    case CT_I64:
        if (sb == 8) return (const int64_t *)p;
        VFOR(i, n, buf[i] = *(const int64_t *)(p + i * sb));
        break;
    case CT_I32:
        if (sb == 4) {
            const int32_t *q = (const int32_t *)p;
            VFOR(i, n, buf[i] = q[i]);
        } else {
            VFOR(i, n, buf[i] = *(const int32_t *)(p + i * sb));
        }
        break;
    case CT_BOOL:
        if (sb == 1) {
            const uint8_t *q = (const uint8_t *)p;
            VFOR(i, n, buf[i] = q[i] != 0);
        } else {
            VFOR(i, n, buf[i] = *(const uint8_t *)(p + i * sb) != 0);
        }
        break;
    default:
        break;
    }
    return buf;
}

static void store_d(ct_dtype dt, char *o, int64_t k, double v) {
    switch (dt) {
    case CT_F64: ((double *)o)[k] = v; break;
    case CT_F32: ((float *)o)[k] = (float)v; break;
    case CT_F16: ((uint16_t *)o)[k] = cti_f32_to_f16((float)v); break;
    case CT_BF16: ((uint16_t *)o)[k] = cti_f32_to_bf16((float)v); break;
    default: break;
    }
}

static void store_i(ct_dtype dt, char *o, int64_t k, int64_t v) {
    switch (dt) {
    case CT_I64: ((int64_t *)o)[k] = v; break;
    case CT_I32: ((int32_t *)o)[k] = (int32_t)v; break;
    case CT_BOOL: ((uint8_t *)o)[k] = v != 0; break;
    default: break;
    }
}

/* Integer sums and products wrap (two's complement) instead of overflowing. */
static inline int64_t wadd(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t wmul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

/* NaN-propagating max/min: b replaces a when larger (smaller) or NaN, and a
 * NaN a stays. */
static inline double pick_max(double a, double b) { return ((b > a) | (b != b)) ? b : a; }
static inline double pick_min(double a, double b) { return ((b < a) | (b != b)) ? b : a; }

/* ---- block primitives on doubles ------------------------------------------------------- */
/* Eight independent accumulators vectorize and, block by block, keep the
 * rounding error near that of a pairwise sum. */
static double sum_d(const double *b, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += b[i + j];
    double t = 0;
    for (; i < n; i++) t += b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + t;
}

/* sum_i (b[i] - o): deviations from an element of the block are exactly 0
 * for a constant block, so its mean (o + this / n) is exactly that constant
 * and its variance exactly 0, as Welford's update gives. */
static double sum_shift_d(const double *b, int64_t n, double o) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += b[i + j] - o;
    double t = 0;
    for (; i < n; i++) t += b[i] - o;
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + t;
}

static double sumsq_dev_d(const double *b, int64_t n, double m) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            double d = b[i + j] - m;
            acc[j] += d * d;
        }
    double t = 0;
    for (; i < n; i++) t += (b[i] - m) * (b[i] - m);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + t;
}

static double norm_part_d(const double *b, int64_t n, int pk, double p) {
    double acc[8] = {0};
    int64_t i = 0;
    double t = 0;
    switch (pk) {
    case P_TWO:
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += b[i + j] * b[i + j];
        for (; i < n; i++) t += b[i] * b[i];
        break;
    case P_ONE:
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += fabs(b[i + j]);
        for (; i < n; i++) t += fabs(b[i]);
        break;
    case P_ZERO:
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += b[i + j] != 0.0;
        for (; i < n; i++) t += b[i] != 0.0;
        break;
    default:
        for (; i < n; i++) t += pow(fabs(b[i]), p);
        break;
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + t;
}

/* Largest (ismin: smallest) value, NaN if any; |values| when absval. The
 * lanes are 32 wide: too many for the compiler to unroll them into scalars,
 * so the lane loop is vectorized, with four independent vectors. */
#define XL 32
static double extreme_d(const double *b, int64_t n, bool ismin, bool absval) {
    double acc[XL];
    for (int j = 0; j < XL; j++) acc[j] = ismin ? INFINITY : -INFINITY;
    int64_t i = 0;
    if (absval) {
        if (ismin)
            for (; i + XL <= n; i += XL)
                for (int j = 0; j < XL; j++) acc[j] = pick_min(acc[j], fabs(b[i + j]));
        else
            for (; i + XL <= n; i += XL)
                for (int j = 0; j < XL; j++) acc[j] = pick_max(acc[j], fabs(b[i + j]));
    } else {
        if (ismin)
            for (; i + XL <= n; i += XL)
                for (int j = 0; j < XL; j++) acc[j] = pick_min(acc[j], b[i + j]);
        else
            for (; i + XL <= n; i += XL)
                for (int j = 0; j < XL; j++) acc[j] = pick_max(acc[j], b[i + j]);
    }
    double r = acc[0];
    for (int j = 1; j < XL; j++) r = ismin ? pick_min(r, acc[j]) : pick_max(r, acc[j]);
    for (; i < n; i++) {
        double v = absval ? fabs(b[i]) : b[i];
        r = ismin ? pick_min(r, v) : pick_max(r, v);
    }
    return r;
}

/* Whether (v, vi) beats (r, ri) for arg max/min: the first NaN, else the
 * larger (smaller) value, else the smaller index. */
static inline bool arg_better(double v, int64_t vi, double r, int64_t ri, bool ismin) {
    if (r != r) return v != v && vi < ri;
    if (v != v) return true;
    if (ismin ? v < r : v > r) return true;
    return v == r && vi < ri;
}

/* Long rows: XL lanes each keep their own first NaN or first max (min), in
 * vectorizable selects; the lanes are merged with the index tie-break. */
static void arg_lanes_d(const double *b, int64_t n, int64_t idx0, bool ismin, racc *a) {
    double v[XL];
    int64_t vi[XL];
    for (int j = 0; j < XL; j++) {
        v[j] = b[j];
        vi[j] = j;
    }
    int64_t i = XL;
    if (ismin) {
        for (; i + XL <= n; i += XL)
            for (int j = 0; j < XL; j++) {
                double x = b[i + j];
                bool take = (x < v[j]) | ((x != x) & (v[j] == v[j]));
                v[j] = take ? x : v[j];
                vi[j] = take ? i + j : vi[j];
            }
    } else {
        for (; i + XL <= n; i += XL)
            for (int j = 0; j < XL; j++) {
                double x = b[i + j];
                bool take = (x > v[j]) | ((x != x) & (v[j] == v[j]));
                v[j] = take ? x : v[j];
                vi[j] = take ? i + j : vi[j];
            }
    }
    double best = v[0];
    int64_t bi = vi[0];
    for (int j = 1; j < XL; j++)
        if (arg_better(v[j], vi[j], best, bi, ismin)) {
            best = v[j];
            bi = vi[j];
        }
    for (; i < n; i++)
        if (arg_better(b[i], i, best, bi, ismin)) {
            best = b[i];
            bi = i;
        }
    /* a covers earlier elements: it keeps ties. */
    if (a->n == 0 || (a->s == a->s && (best != best || (ismin ? best < a->s : best > a->s)))) {
        a->s = best;
        a->idx = idx0 + bi;
    }
}

/* The first NaN, else the first occurrence of the max (min). */
static void arg_d(const double *b, int64_t n, int64_t idx0, bool ismin, racc *a) {
    if (n >= 4 * XL) {
        arg_lanes_d(b, n, idx0, ismin, a);
        return;
    }
    int64_t i = 0, bi;
    double best;
    if (a->n == 0) {
        best = b[0];
        bi = idx0;
        i = 1;
    } else {
        best = a->s;
        bi = a->idx;
    }
    for (; i < n && best == best; i++) {
        double v = b[i];
        if ((ismin ? v < best : v > best) || v != v) {
            best = v;
            bi = idx0 + i;
        }
    }
    a->s = best;
    a->idx = bi;
}

static void arg_i(const int64_t *b, int64_t n, int64_t idx0, bool ismin, racc *a) {
    int64_t i = 0, bi;
    int64_t best;
    if (a->n == 0) {
        best = b[0];
        bi = idx0;
        i = 1;
    } else {
        best = a->i;
        bi = a->idx;
    }
    if (ismin) {
        for (; i < n; i++)
            if (b[i] < best) {
                best = b[i];
                bi = idx0 + i;
            }
    } else {
        for (; i < n; i++)
            if (b[i] > best) {
                best = b[i];
                bi = idx0 + i;
            }
    }
    a->i = best;
    a->idx = bi;
}

/* ---- accumulator algebra ------------------------------------------------------------------ */
static void acc_init(const rctx *c, racc *a) {
    a->s = 0;
    a->m2 = 0;
    a->i = 0;
    a->n = 0;
    a->idx = -1;
    if (c->kind == K_PROD) {
        a->s = 1;
        a->i = 1;
    } else if (c->kind == K_NORM && c->pk == P_NINF) {
        a->s = INFINITY;
    }
}

/* Chan et al.'s pairwise update of (n, mean, m2). */
static void var_merge(racc *a, int64_t nb, double mb, double m2b) {
    if (nb == 0) return;
    if (a->n == 0) {
        a->n = nb;
        a->s = mb;
        a->m2 = m2b;
        return;
    }
    double na = (double)a->n, nbd = (double)nb, n = na + nbd;
    double d = mb - a->s;
    a->s += d * (nbd / n);
    a->m2 += m2b + d * d * (na * nbd / n);
    a->n += nb;
}

/* Folds b, which covers later elements than a, into a. */
static void acc_merge(const rctx *c, racc *a, const racc *b) {
    switch (c->kind) {
    case K_SUM:
    case K_MEAN:
        a->s += b->s;
        a->i = wadd(a->i, b->i);
        break;
    case K_PROD:
        a->s *= b->s;
        a->i = wmul(a->i, b->i);
        break;
    case K_NORM:
        if (c->pk == P_INF) a->s = pick_max(a->s, b->s);
        else if (c->pk == P_NINF) a->s = pick_min(a->s, b->s);
        else a->s += b->s;
        break;
    case K_VAR:
        var_merge(a, b->n, b->s, b->m2);
        return;
    default: { /* K_MAX, K_MIN: ties keep a, the earlier */
        if (b->n == 0) return;
        bool take;
        if (a->n == 0) {
            take = true;
        } else if (c->flt) {
            take = a->s == a->s &&
                   ((c->kind == K_MAX ? b->s > a->s : b->s < a->s) || b->s != b->s);
        } else {
            take = c->kind == K_MAX ? b->i > a->i : b->i < a->i;
        }
        if (take) {
            a->s = b->s;
            a->i = b->i;
            a->idx = b->idx;
        }
        break;
    }
    }
    a->n += b->n;
}

/* Folds n consecutive reduction elements, the first at index idx0. */
static void row_d(const rctx *c, const double *b, int64_t n, int64_t idx0, racc *a) {
    switch (c->kind) {
    case K_SUM:
    case K_MEAN: a->s += sum_d(b, n); break;
    case K_PROD:
        for (int64_t i = 0; i < n; i++) a->s *= b[i];
        break;
    case K_NORM:
        if (c->pk == P_INF) a->s = pick_max(a->s, extreme_d(b, n, false, true));
        else if (c->pk == P_NINF) a->s = pick_min(a->s, extreme_d(b, n, true, true));
        else a->s += norm_part_d(b, n, c->pk, c->p);
        break;
    case K_VAR: {
        double m = b[0] + sum_shift_d(b, n, b[0]) / (double)n;
        var_merge(a, n, m, sumsq_dev_d(b, n, m));
        return;
    }
    default: {
        bool ismin = c->kind == K_MIN;
        if (c->want_idx) {
            arg_d(b, n, idx0, ismin, a);
        } else {
            double v = extreme_d(b, n, ismin, false);
            a->s = a->n == 0 ? v : ismin ? pick_min(a->s, v) : pick_max(a->s, v);
        }
        break;
    }
    }
    a->n += n;
}

static void row_i(const rctx *c, const int64_t *b, int64_t n, int64_t idx0, racc *a) {
    switch (c->kind) {
    case K_SUM: {
        uint64_t acc[8] = {0}, t = 0;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += (uint64_t)b[i + j];
        for (; i < n; i++) t += (uint64_t)b[i];
        for (int j = 0; j < 8; j++) t += acc[j];
        a->i = wadd(a->i, (int64_t)t);
        break;
    }
    case K_PROD:
        for (int64_t i = 0; i < n; i++) a->i = wmul(a->i, b[i]);
        break;
    default: {
        bool ismin = c->kind == K_MIN;
        if (c->want_idx) {
            arg_i(b, n, idx0, ismin, a);
        } else {
            int64_t acc[8];
            int64_t i = 0;
            for (int j = 0; j < 8; j++) acc[j] = ismin ? INT64_MAX : INT64_MIN;
            if (ismin)
                for (; i + 8 <= n; i += 8)
                    for (int j = 0; j < 8; j++) acc[j] = b[i + j] < acc[j] ? b[i + j] : acc[j];
            else
                for (; i + 8 <= n; i += 8)
                    for (int j = 0; j < 8; j++) acc[j] = b[i + j] > acc[j] ? b[i + j] : acc[j];
            int64_t r = a->n == 0 ? (ismin ? INT64_MAX : INT64_MIN) : a->i;
            for (int j = 0; j < 8; j++) r = ismin ? (acc[j] < r ? acc[j] : r) : (acc[j] > r ? acc[j] : r);
            for (; i < n; i++) r = ismin ? (b[i] < r ? b[i] : r) : (b[i] > r ? b[i] : r);
            a->i = r;
        }
        break;
    }
    }
    a->n += n;
}

/* ---- column mode: one reduction position r, w neighbouring outputs ---------------------- */
static void cacc_init(const rctx *c, cacc *a, int64_t w) {
    racc z;
    acc_init(c, &z);
    for (int64_t j = 0; j < w; j++) {
        a->s[j] = z.s;
        a->m2[j] = 0;
        a->i[j] = z.i;
        a->idx[j] = -1;
    }
    a->n = 0;
}

static void col_d(const rctx *c, const double *restrict b, int64_t w, int64_t r, cacc *a) {
    double *restrict s = a->s;
    switch (c->kind) {
    case K_SUM:
    case K_MEAN:
        VFOR(j, w, s[j] += b[j]);
        break;
    case K_PROD:
        VFOR(j, w, s[j] *= b[j]);
        break;
    case K_NORM:
        switch (c->pk) {
        case P_TWO: VFOR(j, w, s[j] += b[j] * b[j]); break;
        case P_ONE: VFOR(j, w, s[j] += fabs(b[j])); break;
        case P_ZERO: VFOR(j, w, s[j] += b[j] != 0.0); break;
        case P_INF: VFOR(j, w, s[j] = pick_max(s[j], fabs(b[j]))); break;
        case P_NINF: VFOR(j, w, s[j] = pick_min(s[j], fabs(b[j]))); break;
        default: VFOR(j, w, s[j] += pow(fabs(b[j]), c->p)); break;
        }
        break;
    case K_VAR: {
        double *restrict m2 = a->m2;
        double inv = 1.0 / (double)(a->n + 1);
        VFOR(j, w, double d = b[j] - s[j]; s[j] += d * inv; m2[j] += d * (b[j] - s[j]));
        break;
    }
    default: {
        bool ismin = c->kind == K_MIN;
        if (a->n == 0) {
            for (int64_t j = 0; j < w; j++) {
                s[j] = b[j];
                a->idx[j] = r;
            }
        } else if (c->want_idx) {
            int64_t *restrict idx = a->idx;
            VFOR(j, w, bool take = s[j] == s[j] && ((ismin ? b[j] < s[j] : b[j] > s[j]) || b[j] != b[j]);
                 s[j] = take ? b[j] : s[j]; idx[j] = take ? r : idx[j]);
        } else if (ismin) {
            VFOR(j, w, s[j] = pick_min(s[j], b[j]));
        } else {
            VFOR(j, w, s[j] = pick_max(s[j], b[j]));
        }
        break;
    }
    }
    a->n++;
}

static void col_i(const rctx *c, const int64_t *restrict b, int64_t w, int64_t r, cacc *a) {
    int64_t *restrict v = a->i;
    switch (c->kind) {
    case K_SUM:
        VFOR(j, w, v[j] = wadd(v[j], b[j]));
        break;
    case K_PROD:
        VFOR(j, w, v[j] = wmul(v[j], b[j]));
        break;
    default: {
        bool ismin = c->kind == K_MIN;
        if (a->n == 0) {
            for (int64_t j = 0; j < w; j++) {
                v[j] = b[j];
                a->idx[j] = r;
            }
        } else if (c->want_idx) {
            int64_t *restrict idx = a->idx;
            VFOR(j, w, bool take = ismin ? b[j] < v[j] : b[j] > v[j];
                 v[j] = take ? b[j] : v[j]; idx[j] = take ? r : idx[j]);
        } else if (ismin) {
            VFOR(j, w, v[j] = b[j] < v[j] ? b[j] : v[j]);
        } else {
            VFOR(j, w, v[j] = b[j] > v[j] ? b[j] : v[j]);
        }
        break;
    }
    }
    a->n++;
}

/* ---- results ---------------------------------------------------------------------------- */
static void finish(const rctx *c, int64_t k, const racc *a) {
    if (c->oi) ((int64_t *)c->oi)[k] = a->idx;
    if (!c->ov) return;
    if (!c->flt) {
        store_i(c->odt, c->ov, k, a->i);
        return;
    }
    double v = a->s;
    switch (c->kind) {
    case K_MEAN: v = a->s / (double)c->R; break;
    case K_VAR: {
        /* As PyTorch: m2 / max(0, n - correction), so too few elements give
         * NaN (or Inf when the deviations are not all zero). */
        double div = (double)a->n > c->corr ? (double)a->n - c->corr : 0.0;
        v = a->m2 / div;
        if (c->want_std) v = sqrt(v);
        break;
    }
    case K_NORM:
        if (c->pk == P_TWO) v = sqrt(a->s);
        else if (c->pk == P_GEN) v = pow(a->s, 1.0 / c->p);
        break;
    default: break;
    }
    store_d(c->odt, c->ov, k, v);
}

/* ---- iteration ------------------------------------------------------------------------------ */
typedef struct scratch {
    double bd[RB];
    int64_t bi[RB];
} scratch;

/* Byte offset of output o's first element, o counted over the first nk kept dims. */
static int64_t kept_offset(const rctx *c, int64_t o, int nk) {
    int64_t off = 0;
    for (int d = nk - 1; d >= 0; d--) {
        int64_t q = o / c->ksh[d];
        off += (o - q * c->ksh[d]) * c->kst[d];
        o = q;
    }
    return off;
}

/* Sum of contiguous f32 in double accumulators straight from x: the common
 * case, read at memory speed without the staging buffer. */
static double sum_f32(const float *q, int64_t n) {
    double acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += (double)q[i + j];
    double t = 0;
    for (; i < n; i++) t += q[i];
    for (int j = 0; j < 8; j++) acc[j] += acc[j + 8];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + t;
}

static void segment(const rctx *c, const char *p, int64_t sb, int64_t n, int64_t idx0, racc *a,
                    scratch *sc) {
    if (c->dt == CT_F32 && sb == 4 && (c->kind == K_SUM || c->kind == K_MEAN)) {
        for (int64_t k = 0; k < n; k += RB) {
            int64_t m = n - k < RB ? n - k : RB;
            a->s += sum_f32((const float *)p + k, m);
        }
        a->n += n;
        return;
    }
    for (int64_t k = 0; k < n; k += RB) {
        int64_t m = n - k < RB ? n - k : RB;
        if (c->flt) row_d(c, load_d(c->dt, p + k * sb, sb, m, sc->bd), m, idx0 + k, a);
        else row_i(c, load_i(c->dt, p + k * sb, sb, m, sc->bi), m, idx0 + k, a);
    }
}

/* Unravels reduction position r into the counters of the first nd reduced
 * dims; returns its byte offset. */
static int64_t unravel_red(const rctx *c, int64_t r, int nd, int64_t *cnt) {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t q = r / c->rsh[d];
        cnt[d] = r - q * c->rsh[d];
        off += cnt[d] * c->rst[d];
        r = q;
    }
    return off;
}

/* Steps the counters of the first nd reduced dims; returns the offset change. */
static inline int64_t step_red(const rctx *c, int nd, int64_t *cnt) {
    int64_t delta = 0;
    for (int d = nd - 1; d >= 0; d--) {
        delta += c->rst[d];
        if (++cnt[d] < c->rsh[d]) break;
        delta -= cnt[d] * c->rst[d];
        cnt[d] = 0;
    }
    return delta;
}

/* Row mode: reduction positions [r0, r1) of the output whose data starts at base. */
static void reduce_rows(const rctx *c, const char *base, int64_t r0, int64_t r1, racc *a,
                        scratch *sc) {
    if (c->nr == 0) {
        segment(c, base, 0, 1, 0, a, sc);
        return;
    }
    int last = c->nr - 1;
    int64_t len = c->rsh[last], sb = c->rst[last];
    int64_t cnt[CT_MAX_DIMS];
    int64_t off = r0 % len;
    int64_t roff = unravel_red(c, r0 / len, last, cnt);
    for (int64_t pos = r0; pos < r1;) {
        int64_t n = len - off < r1 - pos ? len - off : r1 - pos;
        segment(c, base + roff + off * sb, sb, n, pos, a, sc);
        pos += n;
        off = 0;
        roff += step_red(c, last, cnt);
    }
}

/* Column mode: positions [r0, r1) for the w outputs whose data starts at base. */
static void reduce_cols(const rctx *c, const char *base, int64_t w, int64_t r0, int64_t r1,
                        cacc *a, scratch *sc) {
    int64_t ks = c->kst[c->nk - 1];
    int64_t cnt[CT_MAX_DIMS];
    int64_t roff = unravel_red(c, r0, c->nr, cnt);
    for (int64_t r = r0; r < r1; r++) {
        if (c->flt) col_d(c, load_d(c->dt, base + roff, ks, w, sc->bd), w, r, a);
        else col_i(c, load_i(c->dt, base + roff, ks, w, sc->bi), w, r, a);
        roff += step_red(c, c->nr, cnt);
    }
}

static void run_task(const rctx *c, int64_t t, racc *acc, cacc *ca, scratch *sc) {
    int64_t g = t / c->nchunks, ch = t % c->nchunks;
    int64_t r0 = ch * c->chunk, r1 = r0 + c->chunk < c->R ? r0 + c->chunk : c->R;
    int64_t w, o0;
    if (!c->col) {
        w = 1;
        o0 = g;
        acc_init(c, &acc[0]);
        reduce_rows(c, c->x + kept_offset(c, g, c->nk), r0, r1, &acc[0], sc);
    } else {
        int64_t outer = g / c->kblocks, j0 = (g % c->kblocks) * CW;
        w = c->klast - j0 < CW ? c->klast - j0 : CW;
        o0 = outer * c->klast + j0;
        const char *base = c->x + kept_offset(c, outer, c->nk - 1) + j0 * c->kst[c->nk - 1];
        cacc_init(c, ca, w);
        reduce_cols(c, base, w, r0, r1, ca, sc);
        for (int64_t j = 0; j < w; j++) {
            acc[j].s = ca->s[j];
            acc[j].m2 = ca->m2[j];
            acc[j].i = ca->i[j];
            acc[j].n = ca->n;
            acc[j].idx = ca->idx[j];
        }
    }
    if (c->nchunks == 1) {
        for (int64_t j = 0; j < w; j++) finish(c, o0 + j, &acc[j]);
    } else {
        racc *dst = c->part + (g * c->nchunks + ch) * c->gw;
        memcpy(dst, acc, (size_t)w * sizeof *acc);
    }
}

typedef struct task_mem {
    racc acc[CW];
    cacc ca;
    scratch sc;
} task_mem;

static void task_range(int64_t begin, int64_t end, void *ctx) {
    const rctx *c = ctx;
    task_mem m; /* about 35 KB */
    for (int64_t t = begin; t < end; t++) run_task(c, t, m.acc, &m.ca, &m.sc);
}

/* ---- geometry ---------------------------------------------------------------------------------- */
/* Drops size-1 dims and merges neighbours whose strides chain. */
static int coalesce(int n, int64_t *sh, int64_t *st) {
    int m = 0;
    for (int d = 0; d < n; d++) {
        if (sh[d] == 1) continue;
        if (m > 0 && st[m - 1] == st[d] * sh[d]) {
            sh[m - 1] *= sh[d];
            st[m - 1] = st[d];
        } else {
            sh[m] = sh[d];
            st[m] = st[d];
            m++;
        }
    }
    return m;
}

/* Stable sort of the reduced dims by decreasing stride. */
static void sort_reduced(rctx *c) {
    for (int a = 1; a < c->nr; a++) {
        int64_t sh = c->rsh[a], st = c->rst[a];
        int b = a - 1;
        while (b >= 0 && c->rst[b] < st) {
            c->rsh[b + 1] = c->rsh[b];
            c->rst[b + 1] = c->rst[b];
            b--;
        }
        c->rsh[b + 1] = sh;
        c->rst[b + 1] = st;
    }
}

static void plan(rctx *c) {
    int64_t ks = c->nk ? c->kst[c->nk - 1] : 0;
    int64_t rl = c->nr ? c->rsh[c->nr - 1] : 1, rs = c->nr ? c->rst[c->nr - 1] : 0;
    c->col = c->nk > 0 && (c->nr == 0 || rl < 8 || (ks < rs && c->ksh[c->nk - 1] >= 4));
    if (c->col) {
        c->klast = c->ksh[c->nk - 1];
        c->kblocks = (c->klast + CW - 1) / CW;
        c->ngroups = (c->O / c->klast) * c->kblocks;
        c->gw = c->klast < CW ? c->klast : CW;
    } else {
        c->ngroups = c->O;
        c->gw = 1;
    }
    c->nchunks = 1;
    c->chunk = c->R;
    int64_t work = c->R * c->gw;
    if (c->ngroups < 16 && c->R >= 2 && work >= 2 * CHUNK) {
        int64_t nc = work / CHUNK;
        if (nc > MAXCHUNKS) nc = MAXCHUNKS;
        if (nc > MAXPARTS / (c->ngroups * c->gw)) nc = MAXPARTS / (c->ngroups * c->gw);
        if (nc > c->R) nc = c->R;
        if (nc > 1) {
            c->chunk = (c->R + nc - 1) / nc;
            c->nchunks = (c->R + c->chunk - 1) / c->chunk;
        }
    }
}

static ct_status k_reduce(ct_call *call) {
    rctx c;
    memset(&c, 0, sizeof c);
    const ct_tensor *x = call->in[0];
    c.dt = x->dtype;
    c.flt = ct_dtype_is_floating(x->dtype);
    c.odt = call->out[0]->dtype;
    c.x = cti_data(x);
    c.ov = cti_data(call->out[0]);
    const cti_reduce_params *rp = CTI_PARAMS(call, cti_reduce_params);
    switch (call->op) {
    case CT_OP_SUM: c.kind = K_SUM; break;
    case CT_OP_MEAN: c.kind = K_MEAN; break;
    case CT_OP_PROD: c.kind = K_PROD; break;
    case CT_OP_VAR:
        c.kind = K_VAR;
        c.corr = rp->correction;
        c.want_std = rp->std;
        break;
    case CT_OP_NORM:
        c.kind = K_NORM;
        c.p = rp->p;
        c.pk = c.p == 2 ? P_TWO : c.p == 1 ? P_ONE : c.p == 0 ? P_ZERO
             : c.p == INFINITY ? P_INF : c.p == -INFINITY ? P_NINF : P_GEN;
        break;
    case CT_OP_MAX:
    case CT_OP_MIN:
        c.kind = call->op == CT_OP_MAX ? K_MAX : K_MIN;
        if (call->nout > 1 && call->out[1]) {
            c.oi = cti_data(call->out[1]);
            c.want_idx = true;
        }
        break;
    case CT_OP_ARGMAX:
    case CT_OP_ARGMIN:
        c.kind = call->op == CT_OP_ARGMAX ? K_MAX : K_MIN;
        c.want_idx = true;
        c.oi = c.ov;
        c.ov = NULL;
        break;
    default:
        return cti_error(CT_ERR_UNSUPPORTED, "reduce kernel: unexpected op %s", ct_op_name(call->op));
    }

    int64_t es = (int64_t)ct_dtype_size(x->dtype);
    uint64_t mask = rp->mask;
    if (cti_numel(x->ndim, x->shape) == 0) {
        /* An empty input's strides may be saturated and its reduced sizes
         * may multiply past int64 (a zero next to huge sizes); it is read
         * nowhere, so only the result's count matters: every result is the
         * reduction over no element. */
        int64_t kept[CT_MAX_DIMS];
        int nk = 0;
        for (int d = 0; d < x->ndim; d++)
            if (!(mask >> d & 1)) kept[nk++] = x->shape[d];
        c.O = cti_numel(nk, kept);
        c.R = 0;
        racc a;
        acc_init(&c, &a);
        for (int64_t k = 0; k < c.O; k++) finish(&c, k, &a);
        return CT_OK;
    }
    c.O = 1;
    c.R = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (mask >> d & 1) {
            c.rsh[c.nr] = x->shape[d];
            c.rst[c.nr++] = x->stride[d] * es;
            c.R *= x->shape[d];
        } else {
            c.ksh[c.nk] = x->shape[d];
            c.kst[c.nk++] = x->stride[d] * es;
            c.O *= x->shape[d];
        }
    }
    if (c.O == 0) return CT_OK;
    c.nk = coalesce(c.nk, c.ksh, c.kst);
    if (!c.want_idx) {
        /* Value reductions may visit elements in memory order; indices need
         * the dims' own order. Size-1 dims go first so sorting sees only real ones. */
        c.nr = coalesce(c.nr, c.rsh, c.rst);
        sort_reduced(&c);
    }
    c.nr = coalesce(c.nr, c.rsh, c.rst);
    plan(&c);

    if (c.nchunks > 1) {
        c.part = malloc((size_t)(c.ngroups * c.nchunks * c.gw) * sizeof *c.part);
        if (!c.part)
            return cti_error(CT_ERR_OOM, "ct_%s: out of memory for partial results",
                             ct_op_name(call->op));
    }
    int64_t ntasks = c.ngroups * c.nchunks;
    int64_t per = c.chunk * c.gw;
    int64_t grain = per >= CTI_GRAIN ? 1 : CTI_GRAIN / (per > 0 ? per : 1);
    cti_parallel_for(ntasks, grain, task_range, &c);

    if (c.nchunks > 1) {
        for (int64_t g = 0; g < c.ngroups; g++) {
            int64_t w = c.gw, o0 = g;
            if (c.col) {
                int64_t j0 = (g % c.kblocks) * CW;
                w = c.klast - j0 < CW ? c.klast - j0 : CW;
                o0 = (g / c.kblocks) * c.klast + j0;
            }
            for (int64_t j = 0; j < w; j++) {
                racc a = c.part[(g * c.nchunks) * c.gw + j];
                for (int64_t ch = 1; ch < c.nchunks; ch++)
                    acc_merge(&c, &a, &c.part[(g * c.nchunks + ch) * c.gw + j]);
                finish(&c, o0 + j, &a);
            }
        }
        free(c.part);
    }
    call->routine = c.col ? (c.nchunks > 1 ? "reduce_columns_chunked" : "reduce_columns")
                          : (c.nchunks > 1 ? "reduce_rows_chunked" : "reduce_rows");
    return CT_OK;
}

void cti_cpu_register_reduce(void) {
    static const ct_dtype all[] = {CT_BOOL, CT_I32, CT_I64, CT_F16, CT_BF16, CT_F32, CT_F64};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        ct_dtype dt = all[k];
        cti_register_kernel(CT_OP_SUM, CT_DEVICE_CPU, dt, k_reduce, "cpu_sum");
        cti_register_kernel(CT_OP_PROD, CT_DEVICE_CPU, dt, k_reduce, "cpu_prod");
        cti_register_kernel(CT_OP_MAX, CT_DEVICE_CPU, dt, k_reduce, "cpu_max");
        cti_register_kernel(CT_OP_MIN, CT_DEVICE_CPU, dt, k_reduce, "cpu_min");
        cti_register_kernel(CT_OP_ARGMAX, CT_DEVICE_CPU, dt, k_reduce, "cpu_argmax");
        cti_register_kernel(CT_OP_ARGMIN, CT_DEVICE_CPU, dt, k_reduce, "cpu_argmin");
        if (ct_dtype_is_floating(dt)) {
            cti_register_kernel(CT_OP_MEAN, CT_DEVICE_CPU, dt, k_reduce, "cpu_mean");
            cti_register_kernel(CT_OP_VAR, CT_DEVICE_CPU, dt, k_reduce, "cpu_var");
            cti_register_kernel(CT_OP_NORM, CT_DEVICE_CPU, dt, k_reduce, "cpu_norm");
        }
    }
}
