/* CPU kernels of EMBEDDING and EMBEDDING_BACKWARD (cti_embedding_params):
 * weight [V, D] (num_weights, d) and n int32 or int64 indices, contiguous.
 *
 *   embedding: out[i] = weight[idx[i]], a row copy, so every dtype works
 *   backward:  dweight[v] = sum of grad_out[i] over the i with idx[i] == v;
 *              the padding_idx row stays zero
 *
 * Every index is checked against [0, V) first. The backward's tasks own
 * ranges of weight rows and scan all the indices, so that each row sums in
 * index order whatever the thread count. */
#if defined(__GNUC__) && !defined(__clang__) /* clang vectorizes them at -O2 and knows no such pragma */
#pragma GCC optimize("O3")
#endif

#include "nn_impl.h"

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

void cti_cpu_register_embedding(void) {
    static const nn_kernel ks[] = {
        {CT_OP_EMBEDDING_BACKWARD, k_embedding_backward, "cpu_embedding_backward"},
    };
    nn_register_floating(ks, sizeof ks / sizeof ks[0]);
    /* a gather copies bytes, so every dtype works */
    for (int dt = 0; dt < CT_NUM_DTYPES; dt++)
        cti_register_kernel(CT_OP_EMBEDDING, CT_DEVICE_CPU, (ct_dtype)dt, k_embedding,
                            "cpu_embedding");
}
