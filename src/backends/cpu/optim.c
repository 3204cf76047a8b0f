/* CPU kernels of the fused optimizer updates (CT_OP_SGD_STEP,
 * CT_OP_ADAMW_STEP; contract with cti_optim_params in src/dispatch/schema.h,
 * front end in src/ops/optim.c): one pass over
 * each parameter reading and writing every tensor once, split over the pool
 * for large parameters. float16/bfloat16 convert blocks of elements to
 * float32, update them there and round once. */
#pragma GCC optimize("O3", "no-math-errno")

#include <math.h>

#include "cpu_impl.h"

/* One parameter's update: its buffers and the scalars of the formulas. */
typedef struct job {
    char *p, *g, *s0, *s1;
    ct_dtype dt;
    bool adamw, has_momentum, nesterov, first;
    double lr, momentum, damp_c, wd;          /* SGD: damp_c = 1 - dampening */
    double decay, b1, b1c, b2, b2c, eps, neg_step, bc2s; /* AdamW */
} job;

#define BLK 256

/* The update over n elements in type T (float or double). */
#define UPDATE_FN(T, SQRT)                                                                    \
    static void sgd_##T(T *restrict p, const T *restrict g, T *restrict buf, int64_t n,     \
                        const job *j) {                                                      \
        const T lr = (T)-j->lr, wd = (T)j->wd, mom = (T)j->momentum, dc = (T)j->damp_c;       \
        for (int64_t i = 0; i < n; i++) {                                                    \
            T d = g[i];                                                                      \
            if (j->wd != 0) d += wd * p[i];                                                  \
            if (j->has_momentum) {                                                           \
                T b = j->first ? d : mom * buf[i] + dc * d;                                  \
                buf[i] = b;                                                                  \
                d = j->nesterov ? d + mom * b : b;                                           \
            }                                                                                \
            p[i] += lr * d;                                                                  \
        }                                                                                    \
    }                                                                                        \
    static void adamw_##T(T *restrict p, const T *restrict g, T *restrict m, T *restrict v,  \
                          int64_t n, const job *j) {                                         \
        const T decay = (T)j->decay, b1 = (T)j->b1, b1c = (T)j->b1c, b2 = (T)j->b2,          \
                b2c = (T)j->b2c, eps = (T)j->eps, ns = (T)j->neg_step, bc2s = (T)j->bc2s;    \
        for (int64_t i = 0; i < n; i++) {                                                    \
            T gi = g[i];                                                                     \
            T mi = b1 * m[i] + b1c * gi;                                                     \
            T vi = b2 * v[i] + b2c * (gi * gi);                                              \
            m[i] = mi;                                                                       \
            v[i] = vi;                                                                       \
            p[i] = p[i] * decay + ns * (mi / (SQRT(vi) / bc2s + eps));                       \
        }                                                                                    \
    }

UPDATE_FN(float, sqrtf)
UPDATE_FN(double, sqrt)

static void load(float *dst, const char *src, ct_dtype dt, int64_t m) {
    const uint16_t *s = (const uint16_t *)src;
    if (dt == CT_F16)
        for (int64_t i = 0; i < m; i++) dst[i] = ct_f16_to_f32(s[i]);
    else
        for (int64_t i = 0; i < m; i++) dst[i] = ct_bf16_to_f32(s[i]);
}

static void store(char *dst, const float *src, ct_dtype dt, int64_t m) {
    uint16_t *d = (uint16_t *)dst;
    if (dt == CT_F16)
        for (int64_t i = 0; i < m; i++) d[i] = ct_f32_to_f16(src[i]);
    else
        for (int64_t i = 0; i < m; i++) d[i] = ct_f32_to_bf16(src[i]);
}

/* float16/bfloat16: blocks through float32. */
static void lowp_range(const job *j, int64_t b, int64_t e) {
    float p[BLK], g[BLK], s0[BLK], s1[BLK];
    bool with0 = j->adamw || j->has_momentum;
    for (int64_t i = b; i < e; i += BLK) {
        int64_t m = e - i < BLK ? e - i : BLK, off = 2 * i;
        load(p, j->p + off, j->dt, m);
        load(g, j->g + off, j->dt, m);
        /* The first SGD step overwrites the buffer without reading it. */
        if (with0 && !(j->first && !j->adamw)) load(s0, j->s0 + off, j->dt, m);
        if (j->adamw) {
            load(s1, j->s1 + off, j->dt, m);
            adamw_float(p, g, s0, s1, m, j);
            store(j->s1 + off, s1, j->dt, m);
        } else {
            sgd_float(p, g, s0, m, j);
        }
        if (with0) store(j->s0 + off, s0, j->dt, m);
        store(j->p + off, p, j->dt, m);
    }
}

static void range(int64_t b, int64_t e, void *ctx) {
    const job *j = ctx;
    size_t es = ct_dtype_size(j->dt);
    size_t o = (size_t)b * es;
    int64_t n = e - b;
    switch (j->dt) {
    case CT_F32:
        if (j->adamw)
            adamw_float((float *)(j->p + o), (const float *)(j->g + o), (float *)(j->s0 + o),
                        (float *)(j->s1 + o), n, j);
        else
            sgd_float((float *)(j->p + o), (const float *)(j->g + o),
                      j->s0 ? (float *)(j->s0 + o) : NULL, n, j);
        break;
    case CT_F64:
        if (j->adamw)
            adamw_double((double *)(j->p + o), (const double *)(j->g + o),
                         (double *)(j->s0 + o), (double *)(j->s1 + o), n, j);
        else
            sgd_double((double *)(j->p + o), (const double *)(j->g + o),
                       j->s0 ? (double *)(j->s0 + o) : NULL, n, j);
        break;
    default: lowp_range(j, b, e); break;
    }
}

/* The scalars of one parameter's AdamW update at step `step` (the
 * contract's formulas, decay = 1 - lr * wd). */
static void adamw_job(job *j, const cti_adamw_hparams *h, int64_t step) {
    double step_size;
    j->decay = 1 - h->lr * h->weight_decay;
    j->b1 = h->beta1;
    j->b1c = 1 - h->beta1;
    j->b2 = h->beta2;
    j->b2c = 1 - h->beta2;
    j->eps = h->eps;
    cti_adamw_scalars(h->lr, h->beta1, h->beta2, step, &step_size, &j->bc2s);
    j->neg_step = -step_size;
}

/* The scalars of one parameter's SGD update at step `step`. */
static void sgd_job(job *j, const cti_sgd_hparams *h, int64_t step) {
    j->lr = h->lr;
    j->momentum = h->momentum;
    j->damp_c = 1 - h->dampening;
    j->wd = h->weight_decay;
    j->nesterov = h->nesterov;
    j->has_momentum = h->momentum != 0;
    j->first = step == 1;
}

static ct_status k_optim(ct_call *c) {
    const cti_optim_params *prm = CTI_PARAMS(c, cti_optim_params);
    const cti_optim_list *l = &prm->list;
    bool adamw = c->op == CT_OP_ADAMW_STEP;
    for (int64_t k = 0; k < l->n; k++) {
        ct_tensor *p = l->param[k];
        int64_t n = cti_numel(p->ndim, p->shape);
        if (n == 0) continue;
        job j = {.p = cti_data(p), .g = cti_data(l->grad[k]), .dt = p->dtype, .adamw = adamw};
        if (adamw) {
            adamw_job(&j, &prm->adamw, l->step[k]);
            j.s0 = cti_data(l->state[0][k]);
            j.s1 = cti_data(l->state[1][k]);
        } else {
            sgd_job(&j, &prm->sgd, l->step[k]);
            if (j.has_momentum) j.s0 = cti_data(l->state[0][k]);
        }
        cti_parallel_for(n, CTI_GRAIN, range, &j);
    }
    c->routine = adamw ? "cpu_adamw_step" : "cpu_sgd_step";
    return CT_OK;
}

void cti_cpu_register_optim(void) {
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        cti_register_kernel(CT_OP_SGD_STEP, CT_DEVICE_CPU, dts[k], k_optim, "cpu_sgd_step");
        cti_register_kernel(CT_OP_ADAMW_STEP, CT_DEVICE_CPU, dts[k], k_optim, "cpu_adamw_step");
    }
}
