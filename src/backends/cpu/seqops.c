/* CPU kernels of TRIL, TRIU, CUMSUM, TOPK, TOPK_BACKWARD and MULTINOMIAL
 * (cti_seq_params; schema.h states each one's contract). Inputs and outputs
 * arrive contiguous. The multinomial draws follow the contract's arithmetic
 * step for step (chunked f64 sums, one uniform per sample), which the CUDA
 * kernels repeat, so both draw the same samples for one generator state. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "tensor/ops.h"

/* ---- tril / triu -------------------------------------------------------------------------- */

typedef struct tri_ctx {
    const char *x;
    char *y;
    int64_t rows, cols, diag;
    size_t es;
    bool upper;
} tri_ctx;

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

static void tri_task(int64_t r0, int64_t r1, void *pv) {
    const tri_ctx *k = pv;
    size_t rb = (size_t)k->cols * k->es;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i = r % k->rows;
        /* kept columns [lo, hi); diag is clamped so i + diag cannot overflow */
        int64_t lo = k->upper ? clamp64(i + k->diag, 0, k->cols) : 0;
        int64_t hi = k->upper ? k->cols : clamp64(i + k->diag + 1, 0, k->cols);
        const char *s = k->x + (size_t)r * rb;
        char *d = k->y + (size_t)r * rb;
        memset(d, 0, (size_t)lo * k->es);
        if (hi > lo) memcpy(d + (size_t)lo * k->es, s + (size_t)lo * k->es, (size_t)(hi - lo) * k->es);
        memset(d + (size_t)hi * k->es, 0, (size_t)(k->cols - hi) * k->es);
    }
}

static ct_status k_tri(ct_call *c) {
    const cti_seq_params *p = CTI_PARAMS(c, cti_seq_params);
    tri_ctx k = {.x = cti_data(c->in[0]),
                 .y = cti_data(c->out[0]),
                 .rows = p->n,
                 .cols = p->inner,
                 .diag = clamp64(p->diagonal, -p->n - 1, p->inner + 1),
                 .es = ct_dtype_size(c->in[0]->dtype),
                 .upper = c->op == CT_OP_TRIU};
    int64_t nrows = p->outer * p->n;
    if (nrows == 0 || p->inner == 0) return CT_OK;
    int64_t grain = CTI_GRAIN / (p->inner > 0 ? p->inner : 1);
    cti_parallel_for(nrows, grain > 0 ? grain : 1, tri_task, &k);
    return CT_OK;
}

/* ---- cumsum ----------------------------------------------------------------------------------- */

typedef struct cum_ctx {
    const char *x;
    char *y;
    ct_dtype dt;
    int64_t n, inner;
    bool reverse;
} cum_ctx;

static int64_t read_int(const char *x, ct_dtype dt, int64_t i) {
    switch (dt) {
    case CT_BOOL: return ((const uint8_t *)x)[i] != 0;
    case CT_I32: return ((const int32_t *)x)[i];
    default: return ((const int64_t *)x)[i];
    }
}

static float read_half(const char *x, ct_dtype dt, int64_t i) {
    uint16_t h = ((const uint16_t *)x)[i];
    return dt == CT_F16 ? cti_f16_to_f32(h) : cti_bf16_to_f32(h);
}

static void write_half(char *y, ct_dtype dt, int64_t i, float v) {
    ((uint16_t *)y)[i] = dt == CT_F16 ? cti_f32_to_f16(v) : cti_f32_to_bf16(v);
}

/* One outer slice: the running sums along n, for every inner position. The
 * step's row adds to the previous output row, except for the halves, whose
 * sums stay in f32 (a block of 256 inner positions at a time). */
/* One line (inner == 1) of f32 or f64: a running scalar, same additions. */
static bool cum_line(const cum_ctx *k, int64_t o) {
    int64_t n = k->n, st = k->reverse ? -1 : 1, i0 = o * n + (k->reverse ? n - 1 : 0);
    if (k->dt == CT_F32) {
        const float *X = (const float *)k->x + i0;
        float *Y = (float *)k->y + i0, acc = X[0];
        Y[0] = acc;
        for (int64_t t = 1; t < n; t++) Y[t * st] = acc = acc + X[t * st];
        return true;
    }
    if (k->dt == CT_F64) {
        const double *X = (const double *)k->x + i0;
        double *Y = (double *)k->y + i0, acc = X[0];
        Y[0] = acc;
        for (int64_t t = 1; t < n; t++) Y[t * st] = acc = acc + X[t * st];
        return true;
    }
    return false;
}

static void cum_slice(const cum_ctx *k, int64_t o) {
    int64_t n = k->n, in = k->inner;
    if (in == 1 && cum_line(k, o)) return;
    for (int64_t t = 0; t < n; t++) {
        int64_t i = k->reverse ? n - 1 - t : t, prev = k->reverse ? i + 1 : i - 1;
        int64_t b = (o * n + i) * in, pb = (o * n + prev) * in;
        switch (k->dt) {
        case CT_F64: {
            const double *X = (const double *)k->x;
            double *Y = (double *)k->y;
            for (int64_t r = 0; r < in; r++) Y[b + r] = t ? Y[pb + r] + X[b + r] : X[b + r];
            break;
        }
        case CT_F32: {
            const float *X = (const float *)k->x;
            float *Y = (float *)k->y;
            for (int64_t r = 0; r < in; r++) Y[b + r] = t ? Y[pb + r] + X[b + r] : X[b + r];
            break;
        }
        case CT_F16:
        case CT_BF16: break;
        default: {
            int64_t *Y = (int64_t *)k->y;
            for (int64_t r = 0; r < in; r++) {
                uint64_t v = (uint64_t)read_int(k->x, k->dt, b + r);
                Y[b + r] = (int64_t)(t ? (uint64_t)Y[pb + r] + v : v); /* wraps as PyTorch's */
            }
            break;
        }
        }
    }
    if (k->dt != CT_F16 && k->dt != CT_BF16) return;
    float acc[256];
    for (int64_t r0 = 0; r0 < in; r0 += 256) {
        int64_t m = in - r0 < 256 ? in - r0 : 256;
        for (int64_t t = 0; t < n; t++) {
            int64_t i = k->reverse ? n - 1 - t : t;
            int64_t b = (o * n + i) * in + r0;
            for (int64_t r = 0; r < m; r++) {
                float v = read_half(k->x, k->dt, b + r);
                acc[r] = t ? acc[r] + v : v; /* the first term as it is: -0 stays -0 */
                write_half(k->y, k->dt, b + r, acc[r]);
            }
        }
    }
}

static void cum_task(int64_t o0, int64_t o1, void *pv) {
    for (int64_t o = o0; o < o1; o++) cum_slice(pv, o);
}

static ct_status k_cumsum(ct_call *c) {
    const cti_seq_params *p = CTI_PARAMS(c, cti_seq_params);
    cum_ctx k = {.x = cti_data(c->in[0]),
                 .y = cti_data(c->out[0]),
                 .dt = c->in[0]->dtype,
                 .n = p->n,
                 .inner = p->inner,
                 .reverse = p->reverse};
    if (p->outer == 0 || p->n == 0 || p->inner == 0) return CT_OK;
    int64_t per = p->n * p->inner, grain = CTI_GRAIN / (per > 0 ? per : 1);
    cti_parallel_for(p->outer, grain > 0 ? grain : 1, cum_task, &k);
    return CT_OK;
}

/* ---- topk ----------------------------------------------------------------------------------------- */

/* An order-preserving unsigned key: NaN above everything, -0 equal to +0. */
static uint64_t f64_key(double v) {
    if (v != v) return UINT64_MAX;
    if (v == 0) v = 0.0;
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b >> 63 ? ~b : b | (UINT64_C(1) << 63);
}

static uint64_t elem_key(const char *x, ct_dtype dt, int64_t i) {
    switch (dt) {
    case CT_F64: return f64_key(((const double *)x)[i]);
    case CT_F32: return f64_key(((const float *)x)[i]);
    case CT_F16:
    case CT_BF16: return f64_key(read_half(x, dt, i));
    default: return (uint64_t)read_int(x, dt, i) ^ (UINT64_C(1) << 63);
    }
}

typedef struct kv {
    uint64_t key;
    int64_t idx;
} kv;

static bool better(kv a, kv b) { return a.key > b.key || (a.key == b.key && a.idx < b.idx); }

static int cmp_better(const void *pa, const void *pb) {
    kv a = *(const kv *)pa, b = *(const kv *)pb;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Sifts h[i] down a heap of m whose root is its worst element. */
static void sift_down(kv *h, int64_t m, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < m && better(h[w], h[l])) w = l;
        if (r < m && better(h[w], h[r])) w = r;
        if (w == i) return;
        kv t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void sift_up(kv *h, int64_t i) {
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!better(h[parent], h[i])) return;
        kv t = h[i];
        h[i] = h[parent];
        h[parent] = t;
        i = parent;
    }
}

typedef struct topk_ctx {
    const char *x;
    char *vals;
    int64_t *idx;
    ct_dtype dt;
    size_t es;
    int64_t n, k;
    bool largest;
    atomic_bool oom;
} topk_ctx;

/* The k best of a row in a heap of k (n log k), then sorted best first. */
static void topk_task(int64_t r0, int64_t r1, void *pv) {
    topk_ctx *t = pv;
    kv *h = malloc((size_t)t->k * sizeof *h);
    if (!h) {
        atomic_store(&t->oom, true);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const char *x = t->x + (size_t)(r * t->n) * t->es;
        int64_t m = 0;
        for (int64_t i = 0; i < t->n; i++) {
            uint64_t key = elem_key(x, t->dt, i);
            kv e = {t->largest ? key : ~key, i};
            if (m < t->k) {
                h[m] = e;
                sift_up(h, m++);
            } else if (better(e, h[0])) {
                h[0] = e;
                sift_down(h, m, 0);
            }
        }
        qsort(h, (size_t)m, sizeof *h, cmp_better);
        for (int64_t j = 0; j < t->k; j++) {
            memcpy(t->vals + (size_t)(r * t->k + j) * t->es, x + (size_t)h[j].idx * t->es, t->es);
            t->idx[r * t->k + j] = h[j].idx;
        }
    }
    free(h);
}

static ct_status k_topk(ct_call *c) {
    const cti_seq_params *p = CTI_PARAMS(c, cti_seq_params);
    if (p->k == 0 || p->outer == 0) return CT_OK;
    topk_ctx t = {.x = cti_data(c->in[0]),
                  .vals = cti_data(c->out[0]),
                  .idx = (int64_t *)cti_data(c->out[1]),
                  .dt = c->in[0]->dtype,
                  .es = ct_dtype_size(c->in[0]->dtype),
                  .n = p->n,
                  .k = p->k,
                  .largest = p->largest};
    atomic_init(&t.oom, false);
    int64_t grain = CTI_GRAIN / (p->n > 0 ? p->n : 1);
    cti_parallel_for(p->outer, grain > 0 ? grain : 1, topk_task, &t);
    if (atomic_load(&t.oom))
        return cti_error(CT_ERR_OOM, "ct_topk: out of memory for the selection of %lld of %lld",
                         (long long)p->k, (long long)p->n);
    c->routine = "cpu_topk_heap";
    return CT_OK;
}

static ct_status k_topk_backward(ct_call *c) {
    const cti_seq_params *p = CTI_PARAMS(c, cti_seq_params);
    const char *g = cti_data(c->in[0]);
    const int64_t *I = (const int64_t *)cti_data(c->in[1]);
    char *o = cti_data(c->out[0]);
    size_t es = ct_dtype_size(c->out[0]->dtype);
    memset(o, 0, (size_t)(p->outer * p->n) * es);
    for (int64_t r = 0; r < p->outer; r++)
        for (int64_t j = 0; j < p->k; j++) {
            int64_t i = I[r * p->k + j];
            if (i < 0 || i >= p->n)
                return cti_error(CT_ERR_INDEX,
                                 "ct_topk_backward: index %lld is out of range for dim %d of size "
                                 "%lld",
                                 (long long)i, p->dim, (long long)p->n);
            memcpy(o + (size_t)(r * p->n + i) * es, g + (size_t)(r * p->k + j) * es, es);
        }
    return CT_OK;
}

/* ---- multinomial --------------------------------------------------------------------------------- */

static double read_f(const char *x, ct_dtype dt, int64_t i) {
    switch (dt) {
    case CT_F64: return ((const double *)x)[i];
    case CT_F32: return ((const float *)x)[i];
    default: return read_half(x, dt, i);
    }
}

/* The last Philox block computed, so that consecutive pairs share it. */
typedef struct philox_cache {
    uint64_t block;
    uint32_t b[4];
    bool valid;
} philox_cache;

static uint32_t word(uint64_t seed, uint64_t w, philox_cache *pc) {
    if (!pc->valid || pc->block != w >> 2) {
        pc->block = w >> 2;
        cti_philox_block(seed, pc->block, pc->b);
        pc->valid = true;
    }
    return pc->b[w & 3];
}

/* The uniform of sample t (a draw pair) of the call: words offset + 2t, + 1
 * (in one Philox block unless the offset was set to an odd number). */
static double draw_uniform(uint64_t seed, uint64_t offset, uint64_t t, philox_cache *pc) {
    uint64_t w = offset + 2 * t;
    uint32_t a0 = word(seed, w, pc);
    return cti_multinomial_uniform(a0, word(seed, w + 1, pc));
}

typedef struct mn_ctx {
    const cti_seq_params *p;
    const char *x;
    ct_dtype dt;
    void *out;
    atomic_bool oom;
} mn_ctx;

/* Row r's chunk prefix sums P[0..chunks] (contract in schema.h). */
static void chunk_prefix(const double *w, int64_t n, double *P) {
    int64_t L = (n + CTI_MULTINOMIAL_CHUNKS - 1) / CTI_MULTINOMIAL_CHUNKS;
    P[0] = 0.0;
    for (int c = 0; c < CTI_MULTINOMIAL_CHUNKS; c++) {
        double s = 0.0;
        int64_t a = c * L, e = a + L < n ? a + L : n;
        for (int64_t j = a; j < e; j++) s += w[j];
        P[c + 1] = P[c] + s;
    }
}

/* The first j whose cdf exceeds target (the last positive weight when none). */
static int64_t inverse_cdf(const double *w, int64_t n, const double *P, double target) {
    int lo = 0, hi = CTI_MULTINOMIAL_CHUNKS; /* first c with P[c + 1] > target, in [lo, hi] */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (P[mid + 1] > target) hi = mid;
        else lo = mid + 1;
    }
    if (lo < CTI_MULTINOMIAL_CHUNKS) {
        int64_t L = (n + CTI_MULTINOMIAL_CHUNKS - 1) / CTI_MULTINOMIAL_CHUNKS;
        int64_t a = lo * L, e = a + L < n ? a + L : n;
        double run = 0.0;
        for (int64_t j = a; j < e; j++) {
            run += w[j];
            if (P[lo] + run > target) return j;
        }
    }
    for (int64_t j = n - 1; j > 0; j--)
        if (w[j] > 0) return j;
    return 0;
}

static void mn_task(int64_t r0, int64_t r1, void *pv) {
    mn_ctx *m = pv;
    const cti_seq_params *p = m->p;
    int64_t n = p->n;
    double *w = malloc((size_t)n * sizeof *w), P[CTI_MULTINOMIAL_CHUNKS + 1];
    philox_cache pc = {.valid = false};
    if (!w) {
        atomic_store(&m->oom, true);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t j = 0; j < n; j++) w[j] = read_f(m->x, m->dt, r * n + j);
        if (p->replacement) {
            chunk_prefix(w, n, P);
            double total = P[CTI_MULTINOMIAL_CHUNKS];
            int64_t *out = (int64_t *)m->out + r * p->k;
            for (int64_t s = 0; s < p->k; s++) {
                double u = draw_uniform(p->seed, p->offset, (uint64_t)(r * p->k + s), &pc);
                out[s] = inverse_cdf(w, n, P, u * total);
            }
        } else {
            double *keys = (double *)m->out + r * n;
            for (int64_t j = 0; j < n; j++) {
                if (w[j] == 0) {
                    keys[j] = -1.0;
                    continue;
                }
                double u = draw_uniform(p->seed, p->offset, (uint64_t)(r * n + j), &pc);
                double e = 0.0 - log(1.0 - u); /* +0 for u == 0: an infinite key */
                keys[j] = w[j] / e;
            }
        }
    }
    free(w);
}

/* The weights' checks, on the calling thread so that the first bad row is
 * the one reported. */
static ct_status mn_check(const cti_seq_params *p, const char *x, ct_dtype dt) {
    const char *op = "ct_multinomial";
    for (int64_t r = 0; r < p->outer; r++) {
        double total = 0;
        int64_t nnz = 0;
        for (int64_t j = 0; j < p->n; j++) {
            double v = read_f(x, dt, r * p->n + j);
            if (!(v >= 0) || isinf(v))
                return cti_error(CT_ERR_INVALID_ARG,
                                 "%s: probabilities must be finite and non-negative, got %g at "
                                 "row %lld, element %lld",
                                 op, v, (long long)r, (long long)j);
            total += v;
            nnz += v > 0;
        }
        if (!(total > 0))
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: row %lld of the probabilities sums to 0 (expected a positive "
                             "sum)",
                             op, (long long)r);
        if (!p->replacement && nnz < p->k)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: cannot draw %lld samples without replacement from row %lld, "
                             "which has %lld non-zero probabilities",
                             op, (long long)p->k, (long long)r, (long long)nnz);
    }
    return CT_OK;
}

static ct_status k_multinomial(ct_call *c) {
    const cti_seq_params *p = CTI_PARAMS(c, cti_seq_params);
    mn_ctx m = {.p = p, .x = cti_data(c->in[0]), .dt = c->in[0]->dtype, .out = cti_data(c->out[0])};
    atomic_init(&m.oom, false);
    if (mn_check(p, m.x, m.dt) != CT_OK) return ct_last_status();
    int64_t per = p->n + p->k, grain = CTI_GRAIN / (per > 0 ? per : 1);
    cti_parallel_for(p->outer, grain > 0 ? grain : 1, mn_task, &m);
    if (atomic_load(&m.oom))
        return cti_error(CT_ERR_OOM, "ct_multinomial: out of memory for a row of %lld weights",
                         (long long)p->n);
    c->routine = p->replacement ? "cpu_multinomial_inverse_cdf" : "cpu_multinomial_exp_keys";
    return CT_OK;
}

/* ---- registration ------------------------------------------------------------------------------ */

void cti_cpu_register_seqops(void) {
    for (int d = 0; d < CT_NUM_DTYPES; d++) {
        ct_dtype dt = (ct_dtype)d;
        cti_register_kernel(CT_OP_TRIL, CT_DEVICE_CPU, dt, k_tri, "cpu_tril");
        cti_register_kernel(CT_OP_TRIU, CT_DEVICE_CPU, dt, k_tri, "cpu_triu");
        cti_register_kernel(CT_OP_CUMSUM, CT_DEVICE_CPU, dt, k_cumsum, "cpu_cumsum");
        if (dt != CT_BOOL) cti_register_kernel(CT_OP_TOPK, CT_DEVICE_CPU, dt, k_topk, "cpu_topk");
        if (ct_dtype_is_floating(dt)) {
            cti_register_kernel(CT_OP_TOPK_BACKWARD, CT_DEVICE_CPU, dt, k_topk_backward,
                                "cpu_topk_backward");
            cti_register_kernel(CT_OP_MULTINOMIAL, CT_DEVICE_CPU, dt, k_multinomial,
                                "cpu_multinomial");
        }
    }
}
