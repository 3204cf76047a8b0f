/* CPU kernels of SORT, CUMPROD and NONZERO (schema.h, "sort, cumprod,
 * nonzero", states each one's contract). Inputs and outputs arrive
 * contiguous.
 *  - sort turns each element into an order-preserving unsigned key (NaN
 *    above everything, -0 == +0; descending flips the bits), then sorts
 *    (key, index) pairs stably: insertion sort for short rows, an LSD radix
 *    sort of 8 bits a pass otherwise, skipping the bytes every key of the
 *    row shares (a float32 widened to a 64-bit key has four such bytes).
 *    Rows go to the thread pool.
 *  - cumprod multiplies in index order, as cumsum adds, so every backend
 *    rounds alike.
 *  - nonzero writes the r-th non-zero element's coordinates at row r, with r
 *    from the front end's running count, so chunks run in parallel. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "tensor/ops.h"

static float half_at(const char *x, ct_dtype dt, int64_t i) {
    uint16_t h = ((const uint16_t *)x)[i];
    return dt == CT_F16 ? cti_f16_to_f32(h) : cti_bf16_to_f32(h);
}

static void half_put(char *y, ct_dtype dt, int64_t i, float v) {
    ((uint16_t *)y)[i] = dt == CT_F16 ? cti_f32_to_f16(v) : cti_f32_to_bf16(v);
}

static int64_t int_at(const char *x, ct_dtype dt, int64_t i) {
    switch (dt) {
    case CT_BOOL: return ((const uint8_t *)x)[i] != 0;
    case CT_I32: return ((const int32_t *)x)[i];
    default: return ((const int64_t *)x)[i];
    }
}

/* ---- sort ---------------------------------------------------------------------------------- */

static uint64_t f64_key(double v) {
    if (v != v) return UINT64_MAX;
    if (v == 0) v = 0.0;
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b >> 63 ? ~b : b | (UINT64_C(1) << 63);
}

static uint64_t key_at(const char *x, ct_dtype dt, int64_t i) {
    switch (dt) {
    case CT_F64: return f64_key(((const double *)x)[i]);
    case CT_F32: return f64_key(((const float *)x)[i]);
    case CT_F16:
    case CT_BF16: return f64_key(half_at(x, dt, i));
    default: return (uint64_t)int_at(x, dt, i) ^ (UINT64_C(1) << 63);
    }
}

/* A 32-bit key for the dtypes of at most 4 bytes: the same order as
 * key_at's, in half the width, so a pair is 8 bytes. */
static uint32_t f32_key(float v) {
    if (v != v) return UINT32_MAX;
    if (v == 0) v = 0.0f;
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b >> 31 ? ~b : b | (UINT32_C(1) << 31);
}

static uint32_t key32_at(const char *x, ct_dtype dt, int64_t i) {
    switch (dt) {
    case CT_F32: return f32_key(((const float *)x)[i]);
    case CT_F16:
    case CT_BF16: return f32_key(half_at(x, dt, i)); /* exact: f32 holds every half */
    case CT_I32: return (uint32_t)((const int32_t *)x)[i] ^ (UINT32_C(1) << 31);
    default: return ((const uint8_t *)x)[i] != 0;
    }
}

/* Below this many elements a row is insertion-sorted. */
#define SORT_INSERTION_MAX 32

/* The row sorts, once per pair type: KV {key, idx} with an unsigned key of
 * KB bytes. Insertion sort for short rows; else an LSD radix sort of 8 bits
 * a pass, skipping the bytes every key of the row shares; stable either
 * way. NAME_radix returns the buffer holding the result (a or tmp); hist:
 * KB x 256 counts of scratch. */
#define SORT_FUNCS(NAME, KV, KB)                                                             \
    static void NAME##_insertion(KV *a, int64_t n) {                                         \
        for (int64_t i = 1; i < n; i++) {                                                    \
            KV e = a[i];                                                                     \
            int64_t j = i;                                                                   \
            while (j > 0 && a[j - 1].key > e.key) { /* strict: equal keys keep order */      \
                a[j] = a[j - 1];                                                             \
                j--;                                                                         \
            }                                                                                \
            a[j] = e;                                                                        \
        }                                                                                    \
    }                                                                                        \
    static KV *NAME##_radix(KV *a, KV *tmp, int64_t n, int64_t (*hist)[256]) {               \
        memset(hist, 0, KB * sizeof *hist);                                                  \
        for (int64_t i = 0; i < n; i++) {                                                    \
            uint64_t k = a[i].key;                                                           \
            for (int b = 0; b < KB; b++) hist[b][(k >> (8 * b)) & 255]++;                    \
        }                                                                                    \
        KV *src = a, *dst = tmp;                                                             \
        for (int b = 0; b < KB; b++) {                                                       \
            int64_t *h = hist[b];                                                            \
            if (h[(src[0].key >> (8 * b)) & 255] == n) continue; /* a byte all keys share */ \
            int64_t sum = 0;                                                                 \
            for (int v = 0; v < 256; v++) {                                                  \
                int64_t c = h[v];                                                            \
                h[v] = sum;                                                                  \
                sum += c;                                                                    \
            }                                                                                \
            for (int64_t i = 0; i < n; i++) dst[h[(src[i].key >> (8 * b)) & 255]++] = src[i]; \
            KV *t = src;                                                                     \
            src = dst;                                                                       \
            dst = t;                                                                         \
        }                                                                                    \
        return src;                                                                          \
    }

typedef struct kv64 {
    uint64_t key;
    int64_t idx;
} kv64;

typedef struct kv32 {
    uint32_t key;
    uint32_t idx;
} kv32;

SORT_FUNCS(sort64, kv64, 8)
SORT_FUNCS(sort32, kv32, 4)

typedef struct sort_ctx {
    const char *x;
    char *vals;
    int64_t *idx;
    ct_dtype dt;
    size_t es;
    int64_t n;
    bool descending, narrow; /* narrow: 32-bit keys and indices */
    atomic_bool oom;
} sort_ctx;

/* Writes row r's values and indices from its sorted order, idx(j). */
#define SORT_EMIT(s, x, r, IDX)                                                              \
    do {                                                                                     \
        char *v_ = (s)->vals + (size_t)((r) * (s)->n) * (s)->es;                             \
        int64_t *ix_ = (s)->idx + (r) * (s)->n;                                              \
        int64_t n_ = (s)->n;                                                                 \
        switch ((s)->es) { /* by size, so the compiler moves words, not bytes */             \
        case 8:                                                                              \
            for (int64_t j = 0; j < n_; j++) ((uint64_t *)v_)[j] = ((const uint64_t *)(x))[IDX]; \
            break;                                                                           \
        case 4:                                                                              \
            for (int64_t j = 0; j < n_; j++) ((uint32_t *)v_)[j] = ((const uint32_t *)(x))[IDX]; \
            break;                                                                           \
        case 2:                                                                              \
            for (int64_t j = 0; j < n_; j++) ((uint16_t *)v_)[j] = ((const uint16_t *)(x))[IDX]; \
            break;                                                                           \
        default:                                                                             \
            for (int64_t j = 0; j < n_; j++) ((uint8_t *)v_)[j] = ((const uint8_t *)(x))[IDX]; \
        }                                                                                    \
        for (int64_t j = 0; j < n_; j++) ix_[j] = (IDX);                                     \
    } while (0)

static void sort_task(int64_t r0, int64_t r1, void *pv) {
    sort_ctx *s = pv;
    int64_t n = s->n;
    size_t pair = s->narrow ? sizeof(kv32) : sizeof(kv64);
    void *buf = malloc((size_t)n * 2 * pair);
    int64_t(*hist)[256] = malloc(8 * sizeof *hist);
    if (!buf || !hist) {
        free(buf);
        free(hist);
        atomic_store(&s->oom, true);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const char *x = s->x + (size_t)(r * n) * s->es;
        if (s->narrow) {
            uint32_t flip = s->descending ? UINT32_MAX : 0;
            kv32 *a = buf, *res = a;
            for (int64_t i = 0; i < n; i++) a[i] = (kv32){key32_at(x, s->dt, i) ^ flip, (uint32_t)i};
            if (n <= SORT_INSERTION_MAX) sort32_insertion(a, n);
            else res = sort32_radix(a, a + n, n, hist);
            SORT_EMIT(s, x, r, res[j].idx);
        } else {
            uint64_t flip = s->descending ? UINT64_MAX : 0;
            kv64 *a = buf, *res = a;
            for (int64_t i = 0; i < n; i++) a[i] = (kv64){key_at(x, s->dt, i) ^ flip, i};
            if (n <= SORT_INSERTION_MAX) sort64_insertion(a, n);
            else res = sort64_radix(a, a + n, n, hist);
            SORT_EMIT(s, x, r, res[j].idx);
        }
    }
    free(hist);
    free(buf);
}

static ct_status k_sort(ct_call *c) {
    const cti_sort_params *p = CTI_PARAMS(c, cti_sort_params);
    if (p->outer == 0 || p->n == 0) return CT_OK;
    if ((uint64_t)p->n > SIZE_MAX / (2 * sizeof(kv64)))
        return cti_error(CT_ERR_OOM, "ct_sort: a row of %lld elements does not fit in memory",
                         (long long)p->n);
    sort_ctx s = {.x = cti_data(c->in[0]),
                  .vals = cti_data(c->out[0]),
                  .idx = (int64_t *)cti_data(c->out[1]),
                  .dt = c->in[0]->dtype,
                  .es = ct_dtype_size(c->in[0]->dtype),
                  .n = p->n,
                  .descending = p->descending,
                  .narrow = ct_dtype_size(c->in[0]->dtype) <= 4 && p->n <= UINT32_MAX};
    atomic_init(&s.oom, false);
    int64_t grain = CTI_GRAIN / (8 * p->n) > 0 ? CTI_GRAIN / (8 * p->n) : 1;
    cti_parallel_for(p->outer, grain, sort_task, &s);
    if (atomic_load(&s.oom))
        return cti_error(CT_ERR_OOM, "ct_sort: out of memory for the sort of a row of %lld",
                         (long long)p->n);
    c->routine = p->n <= SORT_INSERTION_MAX ? "cpu_sort_insertion" : "cpu_sort_radix";
    return CT_OK;
}

/* ---- cumprod ------------------------------------------------------------------------------- */

typedef struct cum_ctx {
    const char *x;
    char *y;
    ct_dtype dt;
    int64_t n, inner;
} cum_ctx;

/* One outer slice: each step's row multiplies the previous output row. */
static void cumprod_slice(const cum_ctx *k, int64_t o) {
    int64_t n = k->n, in = k->inner;
    for (int64_t t = 0; t < n; t++) {
        int64_t b = (o * n + t) * in, pb = b - in;
        switch (k->dt) {
        case CT_F64: {
            const double *X = (const double *)k->x;
            double *Y = (double *)k->y;
            for (int64_t r = 0; r < in; r++) Y[b + r] = t ? Y[pb + r] * X[b + r] : X[b + r];
            break;
        }
        case CT_F32: {
            const float *X = (const float *)k->x;
            float *Y = (float *)k->y;
            for (int64_t r = 0; r < in; r++) Y[b + r] = t ? Y[pb + r] * X[b + r] : X[b + r];
            break;
        }
        case CT_F16:
        case CT_BF16: break;
        default: {
            int64_t *Y = (int64_t *)k->y;
            for (int64_t r = 0; r < in; r++) {
                uint64_t v = (uint64_t)int_at(k->x, k->dt, b + r);
                Y[b + r] = (int64_t)(t ? (uint64_t)Y[pb + r] * v : v); /* wraps as PyTorch's */
            }
            break;
        }
        }
    }
    if (k->dt != CT_F16 && k->dt != CT_BF16) return;
    float acc[256]; /* the running products stay in f32, 256 inner positions at a time */
    for (int64_t r0 = 0; r0 < in; r0 += 256) {
        int64_t m = in - r0 < 256 ? in - r0 : 256;
        for (int64_t t = 0; t < n; t++) {
            int64_t b = (o * n + t) * in + r0;
            for (int64_t r = 0; r < m; r++) {
                float v = half_at(k->x, k->dt, b + r);
                acc[r] = t ? acc[r] * v : v;
                half_put(k->y, k->dt, b + r, acc[r]);
            }
        }
    }
}

static void cumprod_task(int64_t o0, int64_t o1, void *pv) {
    for (int64_t o = o0; o < o1; o++) cumprod_slice(pv, o);
}

static ct_status k_cumprod(ct_call *c) {
    const cti_seq_params *p = CTI_PARAMS(c, cti_seq_params);
    cum_ctx k = {.x = cti_data(c->in[0]),
                 .y = cti_data(c->out[0]),
                 .dt = c->in[0]->dtype,
                 .n = p->n,
                 .inner = p->inner};
    if (p->outer == 0 || p->n == 0 || p->inner == 0) return CT_OK;
    int64_t per = p->n * p->inner, grain = CTI_GRAIN / per;
    cti_parallel_for(p->outer, grain > 0 ? grain : 1, cumprod_task, &k);
    return CT_OK;
}

/* ---- nonzero ------------------------------------------------------------------------------- */

static bool nonzero_at(const char *x, ct_dtype dt, int64_t i) {
    switch (dt) {
    case CT_BOOL: return ((const uint8_t *)x)[i] != 0;
    case CT_I32: return ((const int32_t *)x)[i] != 0;
    case CT_I64: return ((const int64_t *)x)[i] != 0;
    case CT_F16:
    case CT_BF16: return (((const uint16_t *)x)[i] & 0x7fff) != 0; /* -0 is zero, NaN is not */
    case CT_F32: return ((const float *)x)[i] != 0;
    default: return ((const double *)x)[i] != 0;
    }
}

typedef struct nz_ctx {
    const char *x;
    const int64_t *count;
    int64_t *out;
    ct_dtype dt;
    const cti_sort_params *p;
} nz_ctx;

static void nz_task(int64_t i0, int64_t i1, void *pv) {
    const nz_ctx *k = pv;
    int nd = k->p->ndim;
    for (int64_t i = i0; i < i1; i++) {
        if (!nonzero_at(k->x, k->dt, i)) continue;
        int64_t *row = k->out + (k->count[i] - 1) * nd, rest = i;
        for (int d = nd - 1; d >= 0; d--) {
            row[d] = rest % k->p->shape[d];
            rest /= k->p->shape[d];
        }
    }
}

static ct_status k_nonzero(ct_call *c) {
    const cti_sort_params *p = CTI_PARAMS(c, cti_sort_params);
    nz_ctx k = {.x = cti_data(c->in[0]),
                .count = (const int64_t *)cti_data(c->in[1]),
                .out = (int64_t *)cti_data(c->out[0]),
                .dt = c->in[0]->dtype,
                .p = p};
    int64_t numel = cti_numel(c->in[0]->ndim, c->in[0]->shape);
    if (p->ndim == 0 || cti_numel(c->out[0]->ndim, c->out[0]->shape) == 0) return CT_OK;
    cti_parallel_for(numel, CTI_GRAIN, nz_task, &k);
    return CT_OK;
}

/* ---- registration -------------------------------------------------------------------------- */

void cti_cpu_register_sort(void) {
    for (int d = 0; d < CT_NUM_DTYPES; d++) {
        ct_dtype dt = (ct_dtype)d;
        cti_register_kernel(CT_OP_SORT, CT_DEVICE_CPU, dt, k_sort, "cpu_sort");
        cti_register_kernel(CT_OP_CUMPROD, CT_DEVICE_CPU, dt, k_cumprod, "cpu_cumprod");
        cti_register_kernel(CT_OP_NONZERO, CT_DEVICE_CPU, dt, k_nonzero, "cpu_nonzero");
    }
}
