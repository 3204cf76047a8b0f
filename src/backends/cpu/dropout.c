/* CPU kernels of DROPOUT and DROPOUT_BACKWARD (cti_dropout_params),
 * contiguous. forward: in x; out y, mask|NULL (bool). backward: in grad_y,
 * mask; out dx.
 *
 *   dropout:  keep_k = u_k >= p, u_k the f32 uniform (the top 24 bits of the
 *             32-bit word) of Philox-4x32-10 draw offset + k under key seed
 *             y = keep ? x / (1 - p) : 0;  mask = keep
 *   backward: dx = mask ? g / (1 - p) : 0
 *
 * p == 1 drops everything (scale 0). */
#if defined(__GNUC__) && !defined(__clang__) /* clang vectorizes them at -O2 and knows no such pragma */
#pragma GCC optimize("O3")
#endif

#include "nn_impl.h"

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

void cti_cpu_register_dropout(void) {
    static const nn_kernel ks[] = {
        {CT_OP_DROPOUT, k_dropout, "cpu_dropout"},
        {CT_OP_DROPOUT_BACKWARD, k_dropout_backward, "cpu_dropout_backward"},
    };
    nn_register_floating(ks, sizeof ks / sizeof ks[0]);
}
