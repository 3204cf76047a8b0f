/* CPU kernels of SDPA and SDPA_BACKWARD (cti_attention_params; the contract
 * is schema.h's): blocked, online-softmax ("flash") attention.
 *
 * Forward, per (b, h, block of query rows), over the key blocks (causal:
 * those not wholly above the diagonal):
 *   S = scale q_blk k_blk^T (cblas gemm), masked; per row the running max m
 *   and sum l of exp(S - m), the accumulator rescaled by exp(m_old - m_new)
 *   when m grows; acc += drop(P) v_blk (gemm). At the end out = acc / l and
 *   lse = m + log l; a row with every key masked (l = 0) gives out = 0 and
 *   lse = -inf.
 * Backward, from lse (P = exp(S - lse) recomputed per tile) and
 * D_i = rowsum(dO_i * O_i). For f32 and f64 with at least as many (b, kv
 * head) pairs as threads, one pass per pair (it owns dk, dv and its query
 * heads' dq rows; dq += scale dS k in place). Otherwise two passes, so that
 * each output tile has one owner and no thread writes another's:
 *   keys:    per (b, kv head, key block), over the group's query heads and
 *            the query blocks: dV += drop(P)^T dO, dS = P * (drop(dO v^T) - D),
 *            dK += scale dS^T q
 *   queries: per (b, h, query block), over the key blocks: dS as above,
 *            dQ += scale dS k
 * Dropout's factor (keep / (1 - p), keep from the shared Philox rule) is
 * regenerated per tile, so no mask is stored.
 *
 * Buffers are tiles (per task), never T x S. Rows of q, k, v, dO, out are
 * read in place for f32 and f64 when their row stride suits BLAS; halves
 * are converted a tile at a time and computed in f32. Tiles are sized so
 * that each gemm stays under OpenBLAS's threading threshold (m n k <=
 * 262144): it then runs on the calling pool thread and never takes
 * OpenBLAS's own thread server, which would serialize the pool. */
#ifndef NN_T
#if defined(__GNUC__) && !defined(__clang__) /* clang vectorizes them at -O2 and knows no such pragma */
#pragma GCC optimize("O3")
#endif

#include <cblas.h>

#include "nn_impl.h"

/* OpenBLAS 0.3's gemm runs single-threaded for m n k at most this. */
#define AT_GEMM_ST 262144

typedef struct at_ctx {
    ct_call *c;
    const cti_attention_params *p;
    int64_t bq, bk;   /* rows of a query block, of a key block */
    int64_t nqb, nkb; /* blocks along T and S */
    int64_t group;    /* query heads per kv head */
    double drop_scale;
    atomic_bool oom;
} at_ctx;

/* Block sizes: bq = bk, a multiple of 8 up to 128, as large as keeps
 * bq bk max(D, Dv) under AT_GEMM_ST (at least 16). */
static int64_t block_size(int64_t D, int64_t Dv) {
    int64_t d = D > Dv ? D : Dv;
    if (d < 1) d = 1;
    int64_t b = 128;
    while (b > 16 && b * b * d > AT_GEMM_ST) b -= 8;
    return b;
}

/* Dropout's keep bits of row (b, h, i), keys j0..j0+n: the f32 uniform of
 * Philox draw offset + ((b Hq + h) T + i) S + j is >= p. */
static void keep_row(const cti_attention_params *p, int64_t b, int64_t h, int64_t i, int64_t j0,
                     int64_t n, uint8_t *keep) {
    uint64_t first = p->offset + (uint64_t)(((b * p->Hq + h) * p->T + i) * p->S + j0);
    uint32_t blk[4];
    uint64_t cur = UINT64_MAX;
    for (int64_t j = 0; j < n; j++) {
        uint64_t draw = first + (uint64_t)j;
        if ((draw >> 2) != cur) {
            cur = draw >> 2;
            cti_philox_block(p->seed, cur, blk);
        }
        keep[j] = (double)(blk[draw & 3] >> 8) * 0x1p-24 >= p->dropout_p;
    }
}

/* Scratch of n bytes rounded up to 64, from a bump pointer. */
static void *take(char **bump, size_t n) {
    void *r = *bump;
    *bump += (n + 63) & ~(size_t)63;
    return r;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Key blocks a query block [i0, i0 + nq) sees: all, or under is_causal those
 * starting at or before its last row. */
static int64_t key_blocks(const at_ctx *k, int64_t i0, int64_t nq) {
    if (!k->p->is_causal) return k->nkb;
    int64_t last = i0 + nq - 1;
    int64_t n = last / k->bk + 1;
    return min64(n, k->nkb);
}

#define NN_TYPED "attention.c"
#include "nn_types.h"

static void sdpa_task(int64_t w0, int64_t w1, void *pv) {
    at_ctx *k = pv;
    if (k->c->in[0]->dtype == CT_F64) sdpa_fwd_d(k, w0, w1);
    else sdpa_fwd_f(k, w0, w1);
}

static void sdpa_bwd_keys_task(int64_t w0, int64_t w1, void *pv) {
    at_ctx *k = pv;
    if (k->c->in[1]->dtype == CT_F64) sdpa_bwd_keys_d(k, w0, w1);
    else sdpa_bwd_keys_f(k, w0, w1);
}

static void sdpa_bwd_queries_task(int64_t w0, int64_t w1, void *pv) {
    at_ctx *k = pv;
    if (k->c->in[1]->dtype == CT_F64) sdpa_bwd_queries_d(k, w0, w1);
    else sdpa_bwd_queries_f(k, w0, w1);
}

static void sdpa_bwd_fused_task(int64_t w0, int64_t w1, void *pv) {
    at_ctx *k = pv;
    if (k->c->in[1]->dtype == CT_F64) sdpa_bwd_fused_d(k, w0, w1);
    else sdpa_bwd_fused_f(k, w0, w1);
}

static void ctx_init(at_ctx *k, ct_call *c) {
    const cti_attention_params *p = CTI_PARAMS(c, cti_attention_params);
    k->c = c;
    k->p = p;
    k->bq = k->bk = block_size(p->D, p->Dv);
    k->nqb = (p->T + k->bq - 1) / k->bq;
    k->nkb = (p->S + k->bk - 1) / k->bk;
    k->group = p->Hkv > 0 ? p->Hq / p->Hkv : 1;
    k->drop_scale = 1.0 / (1.0 - p->dropout_p);
    atomic_init(&k->oom, false);
}

static ct_status k_sdpa(ct_call *c) {
    at_ctx k;
    ctx_init(&k, c);
    const cti_attention_params *p = k.p;
    cti_parallel_for(p->B * p->Hq * k.nqb, 1, sdpa_task, &k);
    c->routine = c->in[0]->dtype == CT_F64 ? "flash cblas_dgemm" : "flash cblas_sgemm";
    if (atomic_load(&k.oom)) return cti_error(CT_ERR_OOM, "cpu_sdpa: out of memory for tiles");
    return CT_OK;
}

static ct_status k_sdpa_backward(ct_call *c) {
    at_ctx k;
    ctx_init(&k, c);
    const cti_attention_params *p = k.p;
    ct_dtype dt = c->in[1]->dtype;
    /* One pass where dq can accumulate in place and the (b, kv head) pairs
     * keep every thread busy; two otherwise. */
    if ((dt == CT_F32 || dt == CT_F64) && p->B * p->Hkv >= cti_cpu_threads()) {
        cti_parallel_for(p->B * p->Hkv, 1, sdpa_bwd_fused_task, &k);
    } else {
        cti_parallel_for(p->B * p->Hkv * k.nkb, 1, sdpa_bwd_keys_task, &k);
        cti_parallel_for(p->B * p->Hq * k.nqb, 1, sdpa_bwd_queries_task, &k);
    }
    c->routine = c->in[1]->dtype == CT_F64 ? "flash cblas_dgemm" : "flash cblas_sgemm";
    if (atomic_load(&k.oom))
        return cti_error(CT_ERR_OOM, "cpu_sdpa_backward: out of memory for tiles");
    return CT_OK;
}

void cti_cpu_register_attention(void) {
    static const nn_kernel ks[] = {
        {CT_OP_SDPA, k_sdpa, "cpu_sdpa"},
        {CT_OP_SDPA_BACKWARD, k_sdpa_backward, "cpu_sdpa_backward"},
    };
    nn_register_floating(ks, sizeof ks / sizeof ks[0]);
}

#else /* NN_T: the typed tile functions, once per compute type */

#if NN_IS_FLOAT
#define AT_GEMM cblas_sgemm
#define AT_NATIVE CT_F32
#else
#define AT_GEMM cblas_dgemm
#define AT_NATIVE CT_F64
#endif

/* rows x cols of the 4-d tensor t from (b, h, r0, 0): in place (its row
 * stride in *ld) when t is of the compute type with a row stride BLAS takes,
 * else converted into buf (ld = cols). */
static const NN_T *NN_F(tile_in)(const ct_tensor *t, int64_t b, int64_t h, int64_t r0,
                                 int64_t rows, int64_t cols, NN_T *buf, int64_t *ld) {
    ct_dtype dt = t->dtype;
    int64_t es = (int64_t)ct_dtype_size(dt), rs = t->stride[2];
    const char *base = cti_data(t) + (b * t->stride[0] + h * t->stride[1] + r0 * rs) * es;
    int64_t need = cols > 1 ? cols : 1;
    if (dt == AT_NATIVE && (rs >= need || rows == 1)) {
        *ld = rows == 1 ? need : rs;
        return (const NN_T *)base;
    }
    for (int64_t r = 0; r < rows; r++) {
#if NN_IS_FLOAT
        load_f32(base + r * rs * es, dt, cols, 1, buf + r * cols);
#else
        memcpy(buf + r * cols, base + r * rs * es, (size_t)cols * sizeof(double));
#endif
    }
    *ld = need;
    return buf;
}

/* Writes rows x cols of src (ld cols) to the contiguous 4-d tensor t at (b, h, r0). */
static void NN_F(tile_out)(const ct_tensor *t, int64_t b, int64_t h, int64_t r0, int64_t rows,
                           int64_t cols, const NN_T *src) {
    int64_t es = (int64_t)ct_dtype_size(t->dtype);
    char *base =
        cti_data(t) + (b * t->stride[0] + h * t->stride[1] + r0 * t->stride[2]) * es;
    for (int64_t r = 0; r < rows; r++) {
#if NN_IS_FLOAT
        store_f32(src + r * cols, t->dtype, cols, 1, base + r * t->stride[2] * es);
#else
        memcpy(base + r * t->stride[2] * es, src + r * cols, (size_t)cols * sizeof(double));
#endif
    }
}

/* The mask and causality on row (b, h, i), keys j0..j0+n, of scores s. */
static void NN_F(mask_row)(const at_ctx *k, int64_t b, int64_t h, int64_t i, int64_t j0,
                           int64_t n, NN_T *restrict s) {
    const cti_attention_params *p = k->p;
    if (p->is_causal) {
        for (int64_t j = i + 1 - j0 > 0 ? i + 1 - j0 : 0; j < n; j++) s[j] = -INFINITY;
        return;
    }
    if (p->mask_kind == CTI_ATTN_MASK_NONE) return;
    const ct_tensor *m = k->c->in[k->c->op == CT_OP_SDPA ? 3 : 6];
    int64_t es = (int64_t)ct_dtype_size(m->dtype), cs = m->stride[3];
    const char *row = cti_data(m) +
                      (b * m->stride[0] + h * m->stride[1] + i * m->stride[2] + j0 * cs) * es;
    if (p->mask_kind == CTI_ATTN_MASK_BOOL) {
        const uint8_t *mb = (const uint8_t *)row;
        for (int64_t j = 0; j < n; j++)
            if (!mb[j * cs]) s[j] = -INFINITY;
        return;
    }
    switch (m->dtype) {
    case CT_F64:
        for (int64_t j = 0; j < n; j++) s[j] += (NN_T)((const double *)row)[j * cs];
        break;
    case CT_F32:
        for (int64_t j = 0; j < n; j++) s[j] += (NN_T)((const float *)row)[j * cs];
        break;
    case CT_F16:
        for (int64_t j = 0; j < n; j++) s[j] += (NN_T)cti_f16_to_f32(((const uint16_t *)row)[j * cs]);
        break;
    default:
        for (int64_t j = 0; j < n; j++)
            s[j] += (NN_T)cti_bf16_to_f32(((const uint16_t *)row)[j * cs]);
        break;
    }
}

/* S[nq x nk] (ld bk) = scale q k^T, masked, for query rows i0.. of head h and
 * keys j0.. of its kv head. */
static void NN_F(scores)(const at_ctx *k, int64_t b, int64_t h, int64_t i0, int64_t nq,
                         int64_t j0, int64_t nk, const NN_T *q, int64_t ldq, const NN_T *kt,
                         int64_t ldk, NN_T *S) {
    const cti_attention_params *p = k->p;
    if (p->D > 0)
        AT_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)p->D,
                (NN_T)p->scale, q, (int)ldq, kt, (int)ldk, (NN_T)0, S, (int)k->bk);
    else
        for (int64_t r = 0; r < nq; r++)
            for (int64_t j = 0; j < nk; j++) S[r * k->bk + j] = 0;
    if (p->is_causal && j0 + nk - 1 <= i0) return; /* wholly on or below the diagonal */
    for (int64_t r = 0; r < nq; r++) NN_F(mask_row)(k, b, h, i0 + r, j0, nk, S + r * k->bk);
}

/* Dropout factors Z[nq x nk] (ld bk) of rows i0.. and keys j0.. */
static void NN_F(drop_tile)(const at_ctx *k, int64_t b, int64_t h, int64_t i0, int64_t nq,
                            int64_t j0, int64_t nk, uint8_t *keep, NN_T *Z) {
    NN_T ds = (NN_T)k->drop_scale;
    for (int64_t r = 0; r < nq; r++) {
        keep_row(k->p, b, h, i0 + r, j0, nk, keep);
        for (int64_t j = 0; j < nk; j++) Z[r * k->bk + j] = keep[j] ? ds : (NN_T)0;
    }
}

/* ---- forward ---------------------------------------------------------------------------- */
static void NN_F(sdpa_fwd)(at_ctx *k, int64_t w0, int64_t w1) {
    const cti_attention_params *p = k->p;
    ct_call *c = k->c;
    const ct_tensor *q = c->in[0], *kt = c->in[1], *v = c->in[2];
    ct_tensor *o = c->out[0], *lse = c->out[1];
    int64_t bq = k->bq, bk = k->bk, D = p->D, Dv = p->Dv;
    size_t es = sizeof(NN_T), sz = 0;
    sz += 64 + (size_t)(bq * D) * es + 64;         /* q tile */
    sz += 64 + (size_t)(bk * D) * es + 64;         /* k tile */
    sz += 64 + (size_t)(bk * Dv) * es + 64;        /* v tile */
    sz += 2 * (64 + (size_t)(bq * bk) * es + 64);  /* S, Z */
    sz += 64 + (size_t)(bq * Dv) * es + 64;        /* acc */
    sz += 2 * (64 + (size_t)bq * es + 64) + (size_t)bk + 64; /* m, l, keep */
    char *mem = malloc(sz), *bump = mem;
    if (!mem) {
        atomic_store(&k->oom, true);
        return;
    }
    NN_T *qb = take(&bump, (size_t)(bq * D) * es), *kb = take(&bump, (size_t)(bk * D) * es);
    NN_T *vb = take(&bump, (size_t)(bk * Dv) * es), *S = take(&bump, (size_t)(bq * bk) * es);
    NN_T *Z = take(&bump, (size_t)(bq * bk) * es), *acc = take(&bump, (size_t)(bq * Dv) * es);
    NN_T *mx = take(&bump, (size_t)bq * es), *l = take(&bump, (size_t)bq * es);
    uint8_t *keep = take(&bump, (size_t)bk);
    bool drop = p->dropout_p > 0;
    for (int64_t w = w0; w < w1; w++) {
        int64_t qblk = w % k->nqb, bh = w / k->nqb, h = bh % p->Hq, b = bh / p->Hq;
        int64_t hk = h / k->group, i0 = qblk * bq, nq = min64(bq, p->T - i0);
        int64_t ldq, ldk, ldv;
        const NN_T *Q = NN_F(tile_in)(q, b, h, i0, nq, D, qb, &ldq);
        for (int64_t r = 0; r < nq; r++) {
            mx[r] = -INFINITY;
            l[r] = 0;
        }
        for (int64_t e = 0; e < nq * Dv; e++) acc[e] = 0;
        int64_t nkb = key_blocks(k, i0, nq);
        for (int64_t kbi = 0; kbi < nkb; kbi++) {
            int64_t j0 = kbi * bk, nk = min64(bk, p->S - j0);
            const NN_T *K = NN_F(tile_in)(kt, b, hk, j0, nk, D, kb, &ldk);
            const NN_T *V = NN_F(tile_in)(v, b, hk, j0, nk, Dv, vb, &ldv);
            NN_F(scores)(k, b, h, i0, nq, j0, nk, Q, ldq, K, ldk, S);
            if (drop) NN_F(drop_tile)(k, b, h, i0, nq, j0, nk, keep, Z);
            for (int64_t r = 0; r < nq; r++) {
                NN_T *s = S + r * bk;
                NN_T m_new = NN_F(max)(s, nk);
                if (mx[r] > m_new) m_new = mx[r];
                if (m_new == -INFINITY) { /* nothing seen yet in this row */
                    for (int64_t j = 0; j < nk; j++) s[j] = 0;
                    continue;
                }
                NN_T alpha = NN_EXP(mx[r] - m_new);
                /* exp apart from the sum, so that it vectorizes */
                for (int64_t j = 0; j < nk; j++) s[j] = NN_EXP(s[j] - m_new);
                l[r] = l[r] * alpha + NN_F(sum)(s, nk);
                mx[r] = m_new;
                if (alpha != 1)
                    for (int64_t d = 0; d < Dv; d++) acc[r * Dv + d] *= alpha;
                if (drop)
                    for (int64_t j = 0; j < nk; j++) s[j] *= Z[r * bk + j];
            }
            if (Dv > 0 && nk > 0)
                AT_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)Dv, (int)nk,
                        (NN_T)1, S, (int)bk, V, (int)ldv, (NN_T)1, acc, (int)Dv);
        }
        /* lse is f32 for every dtype but f64, which matches NN_T */
        NN_T *L = (NN_T *)cti_data(lse) + (b * p->Hq + h) * p->T + i0;
        for (int64_t r = 0; r < nq; r++) {
            NN_T inv = l[r] > 0 ? (NN_T)1 / l[r] : (NN_T)0;
            for (int64_t d = 0; d < Dv; d++) acc[r * Dv + d] *= inv;
            L[r] = l[r] > 0 ? mx[r] + NN_LOG(l[r]) : (NN_T)-INFINITY;
        }
        NN_F(tile_out)(o, b, h, i0, nq, Dv, acc);
    }
    free(mem);
}

/* ---- backward ---------------------------------------------------------------------------- */
/* Per-task scratch of the backward passes. */
typedef struct NN_F(bw_buf) {
    char *mem;
    NN_T *qb, *kb, *vb, *gb, *ob; /* converted tiles: q, k, v, dO, out */
    NN_T *S, *dP, *Z, *acc, *acc2, *Di, *L;
    uint8_t *keep;
} NN_F(bw_buf);

static bool NN_F(bw_alloc)(const at_ctx *k, NN_F(bw_buf) *w) {
    int64_t bq = k->bq, bk = k->bk, D = k->p->D, Dv = k->p->Dv, bm = bq > bk ? bq : bk;
    size_t es = sizeof(NN_T);
    size_t t[] = {(size_t)(bm * D), (size_t)(bm * D), (size_t)(bm * Dv), (size_t)(bm * Dv),
                  (size_t)(bm * Dv), (size_t)(bq * bk), (size_t)(bq * bk), (size_t)(bq * bk),
                  (size_t)(bm * (D > Dv ? D : Dv)), (size_t)(bm * Dv), (size_t)bq,
                  (size_t)bq};
    size_t sz = 64 + (size_t)bk;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) sz += ((t[i] * es + 63) & ~(size_t)63);
    w->mem = malloc(sz);
    if (!w->mem) return false;
    char *bump = w->mem;
    NN_T **dst[] = {&w->qb, &w->kb, &w->vb, &w->gb, &w->ob, &w->S, &w->dP, &w->Z,
                    &w->acc, &w->acc2, &w->Di, &w->L};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) *dst[i] = take(&bump, t[i] * es);
    w->keep = take(&bump, (size_t)bk);
    return true;
}

/* The query side of a tile pair: q, dO, Di = rowsum(dO * out), lse. */
typedef struct NN_F(qside) {
    const NN_T *Q, *G;
    int64_t ldq, ldg;
} NN_F(qside);

static void NN_F(load_qside)(const at_ctx *k, NN_F(bw_buf) *w, int64_t b, int64_t h, int64_t i0,
                             int64_t nq, NN_F(qside) *qs) {
    const cti_attention_params *p = k->p;
    ct_call *c = k->c;
    int64_t ldo;
    qs->Q = NN_F(tile_in)(c->in[1], b, h, i0, nq, p->D, w->qb, &qs->ldq);
    qs->G = NN_F(tile_in)(c->in[0], b, h, i0, nq, p->Dv, w->gb, &qs->ldg);
    const NN_T *O = NN_F(tile_in)(c->in[4], b, h, i0, nq, p->Dv, w->ob, &ldo);
    const NN_T *L = (const NN_T *)cti_data(c->in[5]) + (b * p->Hq + h) * p->T + i0;
    for (int64_t r = 0; r < nq; r++) {
        w->Di[r] = NN_F(dot)(qs->G + r * qs->ldg, O + r * ldo, p->Dv);
        w->L[r] = L[r];
    }
}

/* For one tile pair: S <- P = exp(S - lse) (0 for a fully masked row), and
 * dP <- dS = P * (Z * (dO v^T) - Di); leaves drop(P) in Z's place when
 * dropout is on (the dV product reads it), else P stays in S. */
static void NN_F(tile_grads)(const at_ctx *k, NN_F(bw_buf) *w, const NN_F(qside) *qs, int64_t b,
                             int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t nk,
                             const NN_T *K, int64_t ldk, const NN_T *V, int64_t ldv) {
    const cti_attention_params *p = k->p;
    int64_t bk = k->bk;
    bool drop = p->dropout_p > 0;
    NN_F(scores)(k, b, h, i0, nq, j0, nk, qs->Q, qs->ldq, K, ldk, w->S);
    if (drop) NN_F(drop_tile)(k, b, h, i0, nq, j0, nk, w->keep, w->Z);
    if (p->Dv > 0)
        AT_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)p->Dv, (NN_T)1,
                qs->G, (int)qs->ldg, V, (int)ldv, (NN_T)0, w->dP, (int)bk);
    else
        for (int64_t r = 0; r < nq; r++)
            for (int64_t j = 0; j < nk; j++) w->dP[r * bk + j] = 0;
    for (int64_t r = 0; r < nq; r++) {
        NN_T *s = w->S + r * bk, *dp = w->dP + r * bk, *z = w->Z + r * bk;
        NN_T lse = w->L[r], di = w->Di[r];
        if (lse == -INFINITY) {
            for (int64_t j = 0; j < nk; j++) s[j] = dp[j] = z[j] = 0;
            continue;
        }
        for (int64_t j = 0; j < nk; j++) s[j] = NN_EXP(s[j] - lse);
        if (drop) {
            for (int64_t j = 0; j < nk; j++) {
                dp[j] = s[j] * (z[j] * dp[j] - di);
                z[j] *= s[j];
            }
        } else {
            for (int64_t j = 0; j < nk; j++) dp[j] = s[j] * (dp[j] - di);
        }
    }
}

/* One key block [j0, j0 + nk) of kv head hk in batch b: its dk and dv from
 * every query head of the group and every query block that sees it, written
 * out; with dqt, each tile's dq share is added into dqt in place as well
 * (the fused pass). */
static void NN_F(key_block)(at_ctx *k, NN_F(bw_buf) *w, int64_t b, int64_t hk, int64_t j0,
                            int64_t nk, const ct_tensor *dqt) {
    const cti_attention_params *p = k->p;
    ct_call *c = k->c;
    int64_t bq = k->bq, bk = k->bk, D = p->D, Dv = p->Dv, ldk, ldv;
    bool drop = p->dropout_p > 0;
    NN_T *dK = w->acc, *dV = w->acc2;
    const NN_T *K = NN_F(tile_in)(c->in[2], b, hk, j0, nk, D, w->kb, &ldk);
    const NN_T *V = NN_F(tile_in)(c->in[3], b, hk, j0, nk, Dv, w->vb, &ldv);
    for (int64_t e = 0; e < nk * D; e++) dK[e] = 0;
    for (int64_t e = 0; e < nk * Dv; e++) dV[e] = 0;
    /* causal: query rows before j0 see none of these keys */
    int64_t qb0 = p->is_causal ? j0 / bq : 0;
    for (int64_t h = hk * k->group; h < (hk + 1) * k->group; h++) {
        for (int64_t qblk = qb0; qblk < k->nqb; qblk++) {
            int64_t i0 = qblk * bq, nq = min64(bq, p->T - i0);
            NN_F(qside) qs;
            NN_F(load_qside)(k, w, b, h, i0, nq, &qs);
            NN_F(tile_grads)(k, w, &qs, b, h, i0, nq, j0, nk, K, ldk, V, ldv);
            if (Dv > 0)
                AT_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)Dv, (int)nq,
                        (NN_T)1, drop ? w->Z : w->S, (int)bk, qs.G, (int)qs.ldg, (NN_T)1, dV,
                        (int)Dv);
            if (D > 0) {
                AT_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)D, (int)nq,
                        (NN_T)p->scale, w->dP, (int)bk, qs.Q, (int)qs.ldq, (NN_T)1, dK, (int)D);
                if (dqt) {
                    NN_T *dq = (NN_T *)cti_data(dqt) + b * dqt->stride[0] + h * dqt->stride[1] +
                               i0 * dqt->stride[2];
                    AT_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)D, (int)nk,
                            (NN_T)p->scale, w->dP, (int)bk, K, (int)ldk, (NN_T)1, dq,
                            (int)dqt->stride[2]);
                }
            }
        }
    }
    NN_F(tile_out)(c->out[1], b, hk, j0, nk, D, dK);
    NN_F(tile_out)(c->out[2], b, hk, j0, nk, Dv, dV);
}

static void NN_F(sdpa_bwd_keys)(at_ctx *k, int64_t w0, int64_t w1) {
    const cti_attention_params *p = k->p;
    NN_F(bw_buf) w;
    if (!NN_F(bw_alloc)(k, &w)) {
        atomic_store(&k->oom, true);
        return;
    }
    for (int64_t it = w0; it < w1; it++) {
        int64_t kblk = it % k->nkb, bh = it / k->nkb, hk = bh % p->Hkv, b = bh / p->Hkv;
        int64_t j0 = kblk * k->bk;
        NN_F(key_block)(k, &w, b, hk, j0, min64(k->bk, p->S - j0), NULL);
    }
    free(w.mem);
}

static void NN_F(sdpa_bwd_queries)(at_ctx *k, int64_t w0, int64_t w1) {
    const cti_attention_params *p = k->p;
    ct_call *c = k->c;
    NN_F(bw_buf) w;
    if (!NN_F(bw_alloc)(k, &w)) {
        atomic_store(&k->oom, true);
        return;
    }
    int64_t bq = k->bq, bk = k->bk, D = p->D, Dv = p->Dv;
    NN_T *dQ = w.acc;
    for (int64_t it = w0; it < w1; it++) {
        int64_t qblk = it % k->nqb, bh = it / k->nqb, h = bh % p->Hq, b = bh / p->Hq;
        int64_t hk = h / k->group, i0 = qblk * bq, nq = min64(bq, p->T - i0);
        NN_F(qside) qs;
        NN_F(load_qside)(k, &w, b, h, i0, nq, &qs);
        for (int64_t e = 0; e < nq * D; e++) dQ[e] = 0;
        int64_t nkb = key_blocks(k, i0, nq);
        for (int64_t kbi = 0; kbi < nkb; kbi++) {
            int64_t j0 = kbi * bk, nk = min64(bk, p->S - j0), ldk, ldv;
            const NN_T *K = NN_F(tile_in)(c->in[2], b, hk, j0, nk, D, w.kb, &ldk);
            const NN_T *V = NN_F(tile_in)(c->in[3], b, hk, j0, nk, Dv, w.vb, &ldv);
            NN_F(tile_grads)(k, &w, &qs, b, h, i0, nq, j0, nk, K, ldk, V, ldv);
            if (D > 0 && nk > 0)
                AT_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)D, (int)nk,
                        (NN_T)p->scale, w.dP, (int)bk, K, (int)ldk, (NN_T)1, dQ, (int)D);
        }
        NN_F(tile_out)(c->out[0], b, h, i0, nq, D, dQ);
    }
    free(w.mem);
}

/* Both passes in one, for f32 and f64 (dq accumulates in the output, in
 * place): per (b, kv head), which owns dk, dv and the dq rows of its query
 * heads, so no two tasks write one element and the sums keep a fixed order.
 * Saves the queries pass's recomputation of S and dO v^T. */
static void NN_F(sdpa_bwd_fused)(at_ctx *k, int64_t w0, int64_t w1) {
    const cti_attention_params *p = k->p;
    ct_call *c = k->c;
    NN_F(bw_buf) w;
    if (!NN_F(bw_alloc)(k, &w)) {
        atomic_store(&k->oom, true);
        return;
    }
    const ct_tensor *dqt = c->out[0];
    for (int64_t it = w0; it < w1; it++) {
        int64_t hk = it % p->Hkv, b = it / p->Hkv;
        for (int64_t h = hk * k->group; h < (hk + 1) * k->group; h++)
            for (int64_t i = 0; i < p->T; i++)
                memset((NN_T *)cti_data(dqt) + b * dqt->stride[0] + h * dqt->stride[1] +
                           i * dqt->stride[2],
                       0, (size_t)p->D * sizeof(NN_T));
        for (int64_t kblk = 0; kblk < k->nkb; kblk++) {
            int64_t j0 = kblk * k->bk;
            NN_F(key_block)(k, &w, b, hk, j0, min64(k->bk, p->S - j0), dqt);
        }
    }
    free(w.mem);
}

#undef AT_GEMM
#undef AT_NATIVE
#endif
