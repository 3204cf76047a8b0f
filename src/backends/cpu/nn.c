/* CPU kernels for embedding and dropout, each with its backward (norms,
 * softmax and losses are in norm.c, softmax.c and loss.c; the row helpers
 * they all use are in nn_impl.h).
 *
 * Row math runs in f32 for f32/f16/bf16 and in f64 for f64. Halves are
 * converted a row at a time into per-task scratch, so outputs keep the input
 * dtype while no sum ever accumulates in 16 bits. The front ends
 * (src/ops/nn.c) hand over contiguous inputs and contiguous outputs.
 *
 * Sums use NACC independent accumulators so that they vectorize without
 * reassociation flags; -O2 vectorizes only trivial loops, hence -O3 here.
 * 64 of them are four AVX-512 vectors: with one, each add waits for the
 * last (4 cycles), which made softmax over 4096-wide rows (read from L1
 * after the first pass) 1.4x slower. */
#pragma GCC optimize("O3")

#include "nn_impl.h"

/* ======================================================================================
 * embedding: in weight [V, D] (contiguous), indices (int32/int64, contiguous); out [n, D].
 * backward: in grad_out [n, D], indices; out [V, D].
 * cti_embedding_params: num_weights V, d D, n, padding_idx (backward). */

static int64_t index_at(const ct_tensor *idx, int64_t i) {
    return idx->dtype == CT_I32 ? ((const int32_t *)cti_data(idx))[i]
                                : ((const int64_t *)cti_data(idx))[i];
}

static ct_status check_indices(const char *op, const ct_tensor *idx, int64_t n, int64_t v) {
    for (int64_t i = 0; i < n; i++) {
        int64_t t = index_at(idx, i);
        if (t < 0 || t >= v)
            return cti_error(CT_ERR_INDEX,
                             "%s: index %lld is out of range for %lld embeddings (expected 0..%lld)",
                             op, (long long)t, (long long)v, (long long)(v - 1));
    }
    return CT_OK;
}

static void emb_task(int64_t i0, int64_t i1, void *p) {
    ct_call *c = p;
    ct_tensor *w = c->in[0], *idx = c->in[1], *o = c->out[0];
    size_t row = (size_t)CTI_PARAMS(c, cti_embedding_params)->d * ct_dtype_size(w->dtype);
    for (int64_t i = i0; i < i1; i++)
        memcpy(cti_data(o) + (size_t)i * row, cti_data(w) + (size_t)index_at(idx, i) * row, row);
}

static ct_status k_embedding(ct_call *c) {
    const cti_embedding_params *p = CTI_PARAMS(c, cti_embedding_params);
    ct_status s = check_indices("ct_embedding", c->in[1], p->n, p->num_weights);
    if (s != CT_OK) return s;
    if (p->d > 0) cti_parallel_for(p->n, row_grain(p->d), emb_task, c);
    return CT_OK;
}

typedef struct embb_ctx {
    ct_call *c;
    const cti_embedding_params *p;
    atomic_bool oom;
} embb_ctx;

/* Each task owns the weight rows [v0, v1) and scans every index, so rows are
 * summed in index order whatever the thread count. */
static void emb_bwd_task(int64_t v0, int64_t v1, void *p) {
    embb_ctx *k = p;
    ct_call *c = k->c;
    ct_tensor *g = c->in[0], *idx = c->in[1], *o = c->out[0];
    int64_t d = k->p->d, n = k->p->n, pad = k->p->padding_idx;
    ct_dtype dt = g->dtype;
    if (dt == CT_F64) {
        const double *G = (const double *)cti_data(g);
        double *O = (double *)cti_data(o);
        memset(O + v0 * d, 0, sizeof(double) * (size_t)((v1 - v0) * d));
        for (int64_t i = 0; i < n; i++) {
            int64_t t = index_at(idx, i);
            if (t < v0 || t >= v1 || t == pad) continue;
            double *orow = O + t * d;
            const double *grow = G + i * d;
            for (int64_t j = 0; j < d; j++) orow[j] += grow[j];
        }
        return;
    }
    bool h = is_half(dt);
    float *acc = h ? scratch(sizeof(float) * (size_t)((v1 - v0 + 1) * d)) : (float *)cti_data(o) + v0 * d;
    if (!acc) {
        atomic_store(&k->oom, true);
        return;
    }
    float *grow = h ? acc + (v1 - v0) * d : NULL;
    memset(acc, 0, sizeof(float) * (size_t)((v1 - v0) * d));
    size_t es = ct_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        int64_t t = index_at(idx, i);
        if (t < v0 || t >= v1 || t == pad) continue;
        const float *gr;
        if (h) {
            load_f32(cti_data(g) + i * d * (int64_t)es, dt, d, 1, grow);
            gr = grow;
        } else {
            gr = (const float *)cti_data(g) + i * d;
        }
        float *orow = acc + (t - v0) * d;
        for (int64_t j = 0; j < d; j++) orow[j] += gr[j];
    }
    if (h) {
        store_f32(acc, dt, (v1 - v0) * d, 1, cti_data(o) + v0 * d * (int64_t)es);
        free(acc);
    }
}

static ct_status k_embedding_backward(ct_call *c) {
    const cti_embedding_params *p = CTI_PARAMS(c, cti_embedding_params);
    ct_status s = check_indices("ct_embedding_backward", c->in[1], p->n, p->num_weights);
    if (s != CT_OK) return s;
    embb_ctx k = {.c = c, .p = p};
    atomic_init(&k.oom, false);
    if (p->d > 0) cti_parallel_for(p->num_weights, 1, emb_bwd_task, &k);
    if (atomic_load(&k.oom)) return cti_error(CT_ERR_OOM, "ct_embedding_backward: out of memory");
    return CT_OK;
}

/* ======================================================================================
 * dropout: in x (contiguous); out y, mask|NULL (bool). cti_dropout_params: seed, offset
 * (the first draw), n (numel), p. Element k is kept iff the f32 uniform of draw offset + k
 * is >= p.
 * backward: in grad_y, mask; out dx; n, p. */

typedef struct drop_ctx {
    ct_call *c;
    uint64_t seed, first;
    double p;
    float scale_f;
    double scale_d;
} drop_ctx;

static void drop_task(int64_t e0, int64_t e1, void *pv) {
    drop_ctx *k = pv;
    ct_call *c = k->c;
    ct_tensor *x = c->in[0], *y = c->out[0], *mt = c->out[1];
    uint8_t *M = mt ? (uint8_t *)cti_data(mt) : NULL;
    ct_dtype dt = x->dtype;
    float xs[64];
    uint8_t keep[64];
    for (int64_t s0 = e0; s0 < e1; s0 += 64) {
        int64_t m = e1 - s0 < 64 ? e1 - s0 : 64;
        uint32_t blk[4];
        uint64_t cur = UINT64_MAX;
        for (int64_t i = 0; i < m; i++) {
            uint64_t draw = k->first + (uint64_t)(s0 + i);
            if ((draw >> 2) != cur) {
                cur = draw >> 2;
                cti_philox_block(k->seed, cur, blk);
            }
            double u = (double)(blk[draw & 3] >> 8) * 0x1p-24;
            keep[i] = u >= k->p;
        }
        if (M) memcpy(M + s0, keep, (size_t)m);
        if (dt == CT_F64) {
            const double *X = (const double *)cti_data(x) + s0;
            double *Y = (double *)cti_data(y) + s0;
            for (int64_t i = 0; i < m; i++) Y[i] = keep[i] ? X[i] * k->scale_d : 0.0;
        } else if (dt == CT_F32) {
            const float *X = (const float *)cti_data(x) + s0;
            float *Y = (float *)cti_data(y) + s0;
            for (int64_t i = 0; i < m; i++) Y[i] = keep[i] ? X[i] * k->scale_f : 0.0f;
        } else {
            size_t es = ct_dtype_size(dt);
            load_f32(cti_data(x) + s0 * (int64_t)es, dt, m, 1, xs);
            for (int64_t i = 0; i < m; i++) xs[i] = keep[i] ? xs[i] * k->scale_f : 0.0f;
            store_f32(xs, dt, m, 1, cti_data(y) + s0 * (int64_t)es);
        }
    }
}

static ct_status k_dropout(ct_call *c) {
    const cti_dropout_params *dp = CTI_PARAMS(c, cti_dropout_params);
    double p = dp->p;
    drop_ctx k = {.c = c, .seed = dp->seed, .first = dp->offset, .p = p};
    k.scale_d = p < 1 ? 1.0 / (1.0 - p) : 0.0;
    k.scale_f = (float)k.scale_d;
    cti_parallel_for(dp->n, CTI_GRAIN / 4, drop_task, &k);
    c->routine = "philox4x32";
    return CT_OK;
}

static void drop_bwd_task(int64_t e0, int64_t e1, void *pv) {
    drop_ctx *k = pv;
    ct_call *c = k->c;
    ct_tensor *g = c->in[0], *mt = c->in[1], *o = c->out[0];
    const uint8_t *M = (const uint8_t *)cti_data(mt);
    ct_dtype dt = g->dtype;
    if (dt == CT_F64) {
        const double *G = (const double *)cti_data(g);
        double *O = (double *)cti_data(o);
        for (int64_t i = e0; i < e1; i++) O[i] = M[i] ? G[i] * k->scale_d : 0.0;
    } else if (dt == CT_F32) {
        const float *G = (const float *)cti_data(g);
        float *O = (float *)cti_data(o);
        for (int64_t i = e0; i < e1; i++) O[i] = M[i] ? G[i] * k->scale_f : 0.0f;
    } else {
        float buf[256];
        size_t es = ct_dtype_size(dt);
        for (int64_t s0 = e0; s0 < e1; s0 += 256) {
            int64_t m = e1 - s0 < 256 ? e1 - s0 : 256;
            load_f32(cti_data(g) + s0 * (int64_t)es, dt, m, 1, buf);
            for (int64_t i = 0; i < m; i++) buf[i] = M[s0 + i] ? buf[i] * k->scale_f : 0.0f;
            store_f32(buf, dt, m, 1, cti_data(o) + s0 * (int64_t)es);
        }
    }
}

static ct_status k_dropout_backward(ct_call *c) {
    const cti_dropout_params *dp = CTI_PARAMS(c, cti_dropout_params);
    double p = dp->p;
    drop_ctx k = {.c = c, .p = p};
    k.scale_d = p < 1 ? 1.0 / (1.0 - p) : 0.0;
    k.scale_f = (float)k.scale_d;
    cti_parallel_for(dp->n, CTI_GRAIN, drop_bwd_task, &k);
    return CT_OK;
}

/* ---- registration ------------------------------------------------------------------------ */
void cti_cpu_register_nn(void) {
    static const ct_dtype fl[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    static const struct {
        ct_op op;
        cti_kernel_fn fn;
        const char *name;
    } ks[] = {
        {CT_OP_EMBEDDING_BACKWARD, k_embedding_backward, "cpu_embedding_backward"},
        {CT_OP_DROPOUT, k_dropout, "cpu_dropout"},
        {CT_OP_DROPOUT_BACKWARD, k_dropout_backward, "cpu_dropout_backward"},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (size_t j = 0; j < sizeof fl / sizeof fl[0]; j++)
            cti_register_kernel(ks[i].op, CT_DEVICE_CPU, fl[j], ks[i].fn, ks[i].name);
    /* a gather copies bytes, so every dtype works */
    for (int dt = 0; dt < CT_NUM_DTYPES; dt++)
        cti_register_kernel(CT_OP_EMBEDDING, CT_DEVICE_CPU, (ct_dtype)dt, k_embedding, "cpu_embedding");
}
