/* CPU kernels of the fused optimizer updates (CT_OP_SGD_STEP,
 * CT_OP_ADAMW_STEP, CT_OP_ADAM_STEP, CT_OP_RMSPROP_STEP, CT_OP_ADAGRAD_STEP;
 * contract with cti_optim_params in src/dispatch/schema.h,
 * front end in src/ops/optim.c) and of a gradient scaler's ops
 * (CT_OP_AMP_UNSCALE, CT_OP_AMP_UPDATE_SCALE; src/ops/loss_scale.c): one
 * pass over each parameter reading and writing every tensor once, split
 * over the pool for large parameters. float16/bfloat16 (and a float32
 * master's low-precision gradient and parameter) convert blocks of elements
 * to float32, update them there and round once. */
#if defined(__GNUC__) && !defined(__clang__) /* clang knows no such pragma */
#pragma GCC optimize("O3", "no-math-errno")
#endif

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_impl.h"

/* One parameter's update: its buffers and the scalars of the formulas. p
 * and the states have dtype pdt (the master's float32 with masters), the
 * gradient gdt; model (NULL if none) receives p rounded to mdt: the
 * parameter of a master, or autocast's lasting cast of a float32 one. */
typedef enum alg { ALG_SGD, ALG_ADAMW, ALG_ADAM, ALG_RMSPROP, ALG_ADAGRAD } alg;

typedef struct job {
    char *p, *g, *s0, *s1, *s2, *model;
    ct_dtype pdt, gdt, mdt;
    alg a;
    bool adamw, has_momentum, nesterov, first;
    bool amsgrad, centered;                   /* Adam, RMSprop */
    double lr, momentum, damp_c, wd;          /* SGD (damp_c = 1 - dampening), RMSprop */
    double decay, b1, b1c, b2, b2c, eps, neg_step, bc2s; /* AdamW, Adam; RMSprop: b1 = alpha */
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

/* Adam, RMSprop and Adagrad (the contract's formulas; Adagrad's neg_step is
 * -clr). */
#define UPDATE_FN2(T, SQRT)                                                                   \
    static void adam_##T(T *restrict p, const T *restrict g, T *restrict m, T *restrict v,   \
                         T *restrict vmax, int64_t n, const job *j) {                        \
        const T wd = (T)j->wd, b1 = (T)j->b1, b1c = (T)j->b1c, b2 = (T)j->b2,                \
                b2c = (T)j->b2c, eps = (T)j->eps, ns = (T)j->neg_step, bc2s = (T)j->bc2s;    \
        for (int64_t i = 0; i < n; i++) {                                                    \
            T gi = g[i];                                                                     \
            if (j->wd != 0) gi += wd * p[i];                                                 \
            T mi = b1 * m[i] + b1c * gi;                                                     \
            T vi = b2 * v[i] + b2c * (gi * gi);                                              \
            m[i] = mi;                                                                       \
            v[i] = vi;                                                                       \
            if (j->amsgrad) {                                                                \
                vi = vi > vmax[i] ? vi : vmax[i];                                            \
                vmax[i] = vi;                                                                \
            }                                                                                \
            p[i] += ns * (mi / (SQRT(vi) / bc2s + eps));                                     \
        }                                                                                    \
    }                                                                                        \
    static void rmsprop_##T(T *restrict p, const T *restrict g, T *restrict sq,              \
                            T *restrict buf, T *restrict ga, int64_t n, const job *j) {      \
        const T wd = (T)j->wd, al = (T)j->b1, alc = (T)j->b1c, eps = (T)j->eps,              \
                mom = (T)j->momentum, nlr = (T)-j->lr;                                       \
        for (int64_t i = 0; i < n; i++) {                                                    \
            T gi = g[i];                                                                     \
            if (j->wd != 0) gi += wd * p[i];                                                 \
            T s = al * sq[i] + alc * (gi * gi);                                              \
            sq[i] = s;                                                                       \
            if (j->centered) {                                                               \
                T a = al * ga[i] + alc * gi;                                                 \
                ga[i] = a;                                                                   \
                s = s - a * a;                                                               \
            }                                                                                \
            T avg = SQRT(s) + eps;                                                           \
            if (j->has_momentum) {                                                           \
                T b = mom * buf[i] + gi / avg;                                               \
                buf[i] = b;                                                                  \
                p[i] += nlr * b;                                                             \
            } else {                                                                         \
                p[i] += nlr * (gi / avg);                                                    \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    static void adagrad_##T(T *restrict p, const T *restrict g, T *restrict sum, int64_t n, \
                            const job *j) {                                                  \
        const T wd = (T)j->wd, eps = (T)j->eps, ns = (T)j->neg_step;                         \
        for (int64_t i = 0; i < n; i++) {                                                    \
            T gi = g[i];                                                                     \
            if (j->wd != 0) gi += wd * p[i];                                                 \
            T s = sum[i] + gi * gi;                                                          \
            sum[i] = s;                                                                      \
            p[i] += ns * (gi / (SQRT(s) + eps));                                             \
        }                                                                                    \
    }

UPDATE_FN(float, sqrtf)
UPDATE_FN(double, sqrt)
UPDATE_FN2(float, sqrtf)
UPDATE_FN2(double, sqrt)

/* The update of one run of n elements in type T, states s0..s2 (NULL where
 * unused). */
#define DISPATCH_FN(T)                                                                        \
    static void update_##T(T *p, const T *g, T *s0, T *s1, T *s2, int64_t n, const job *j) {  \
        switch (j->a) {                                                                      \
        case ALG_SGD: sgd_##T(p, g, s0, n, j); break;                                        \
        case ALG_ADAMW: adamw_##T(p, g, s0, s1, n, j); break;                                \
        case ALG_ADAM: adam_##T(p, g, s0, s1, s2, n, j); break;                              \
        case ALG_RMSPROP: rmsprop_##T(p, g, s0, s1, s2, n, j); break;                        \
        default: adagrad_##T(p, g, s0, n, j); break;                                         \
        }                                                                                    \
    }
DISPATCH_FN(float)
DISPATCH_FN(double)

/* m elements of dtype dt (float32, float16 or bfloat16) to float32 and back. */
static void load(float *dst, const char *src, ct_dtype dt, int64_t m) {
    const uint16_t *s = (const uint16_t *)src;
    if (dt == CT_F32) memcpy(dst, src, (size_t)m * sizeof *dst);
    else if (dt == CT_F16)
        for (int64_t i = 0; i < m; i++) dst[i] = cti_f16_to_f32(s[i]);
    else
        for (int64_t i = 0; i < m; i++) dst[i] = cti_bf16_to_f32(s[i]);
}

static void store(char *dst, const float *src, ct_dtype dt, int64_t m) {
    uint16_t *d = (uint16_t *)dst;
    if (dt == CT_F32) memcpy(dst, src, (size_t)m * sizeof *src);
    else if (dt == CT_F16)
        for (int64_t i = 0; i < m; i++) d[i] = cti_f32_to_f16(src[i]);
    else
        for (int64_t i = 0; i < m; i++) d[i] = cti_f32_to_bf16(src[i]);
}

/* Blocks through float32: low-precision parameters, and masters. */
static void block_range(const job *j, int64_t b, int64_t e) {
    float p[BLK], g[BLK], s[3][BLK];
    char *const sp[3] = {j->s0, j->s1, j->s2};
    size_t ps = ct_dtype_size(j->pdt), gs = ct_dtype_size(j->gdt);
    for (int64_t i = b; i < e; i += BLK) {
        int64_t m = e - i < BLK ? e - i : BLK;
        size_t off = (size_t)i * ps;
        load(p, j->p + off, j->pdt, m);
        load(g, j->g + (size_t)i * gs, j->gdt, m);
        /* The first SGD step overwrites the buffer without reading it. */
        bool skip0 = j->a == ALG_SGD && j->first;
        for (int k = 0; k < 3; k++)
            if (sp[k] && !(k == 0 && skip0)) load(s[k], sp[k] + off, j->pdt, m);
        update_float(p, g, sp[0] ? s[0] : NULL, sp[1] ? s[1] : NULL, sp[2] ? s[2] : NULL, m,
                     j);
        for (int k = 0; k < 3; k++)
            if (sp[k]) store(sp[k] + off, s[k], j->pdt, m);
        store(j->p + off, p, j->pdt, m);
        if (j->model) store(j->model + (size_t)i * ct_dtype_size(j->mdt), p, j->mdt, m);
    }
}

static char *at(char *base, size_t o) { return base ? base + o : NULL; }

static void range(int64_t b, int64_t e, void *ctx) {
    const job *j = ctx;
    size_t o = (size_t)b * ct_dtype_size(j->pdt);
    int64_t n = e - b;
    if (j->pdt == CT_F64) {
        update_double((double *)(j->p + o), (const double *)(j->g + o),
                      (double *)at(j->s0, o), (double *)at(j->s1, o), (double *)at(j->s2, o), n,
                      j);
    } else if (j->pdt == CT_F32 && j->gdt == CT_F32 && !j->model) {
        update_float((float *)(j->p + o), (const float *)(j->g + o), (float *)at(j->s0, o),
                     (float *)at(j->s1, o), (float *)at(j->s2, o), n, j);
    } else {
        block_range(j, b, e);
    }
}

/* The scalars of one parameter's AdamW update at count t with rate lr
 * (the contract's formulas, decay = 1 - lr * wd). */
static void adamw_job(job *j, const cti_adamw_hparams *h, double lr, double t) {
    double step_size;
    j->decay = 1 - lr * h->weight_decay;
    j->b1 = h->beta1;
    j->b1c = 1 - h->beta1;
    j->b2 = h->beta2;
    j->b2c = 1 - h->beta2;
    j->eps = h->eps;
    cti_adamw_scalars(lr, h->beta1, h->beta2, t, &step_size, &j->bc2s);
    j->neg_step = -step_size;
}

/* The scalars of one parameter's SGD update at count t with rate lr. */
static void sgd_job(job *j, const cti_sgd_hparams *h, double lr, double t) {
    j->lr = lr;
    j->momentum = h->momentum;
    j->damp_c = 1 - h->dampening;
    j->wd = h->weight_decay;
    j->nesterov = h->nesterov;
    j->has_momentum = h->momentum != 0;
    j->first = t == 1;
}

/* Adam's scalars: AdamW's without the decoupled decay. */
static void adam_job(job *j, const cti_adam_hparams *h, double lr, double t) {
    cti_adamw_hparams w = {lr, h->beta1, h->beta2, h->eps, 0.0};
    adamw_job(j, &w, lr, t);
    j->wd = h->weight_decay;
    j->amsgrad = h->amsgrad;
}

static void rmsprop_job(job *j, const cti_rmsprop_hparams *h, double lr) {
    j->lr = lr;
    j->b1 = h->alpha;
    j->b1c = 1 - h->alpha;
    j->eps = h->eps;
    j->wd = h->weight_decay;
    j->momentum = h->momentum;
    j->has_momentum = h->momentum > 0;
    j->centered = h->centered;
}

static void adagrad_job(job *j, const cti_adagrad_hparams *h, double lr, double t) {
    j->neg_step = -cti_adagrad_clr(lr, h->lr_decay, t);
    j->eps = h->eps;
    j->wd = h->weight_decay;
}

static ct_tensor *entry(ct_tensor *const *a, int64_t k) { return a ? a[k] : NULL; }

static alg alg_of(ct_op op) {
    switch (op) {
    case CT_OP_ADAMW_STEP: return ALG_ADAMW;
    case CT_OP_ADAM_STEP: return ALG_ADAM;
    case CT_OP_RMSPROP_STEP: return ALG_RMSPROP;
    case CT_OP_ADAGRAD_STEP: return ALG_ADAGRAD;
    default: return ALG_SGD;
    }
}

static double lr_of(const cti_optim_params *prm, alg a) {
    switch (a) {
    case ALG_ADAMW: return prm->adamw.lr;
    case ALG_ADAM: return prm->adam.lr;
    case ALG_RMSPROP: return prm->rmsprop.lr;
    case ALG_ADAGRAD: return prm->adagrad.lr;
    default: return prm->sgd.lr;
    }
}

static const char *const routines[] = {"cpu_sgd_step", "cpu_adamw_step", "cpu_adam_step",
                                       "cpu_rmsprop_step", "cpu_adagrad_step"};

static ct_status k_optim(ct_call *c) {
    const cti_optim_params *prm = CTI_PARAMS(c, cti_optim_params);
    const cti_optim_list *l = &prm->list;
    alg a = alg_of(c->op);
    bool adamw = a == ALG_ADAMW;
    c->routine = routines[a];
    if (l->found_inf && *(const float *)cti_data(l->found_inf) != 0) return CT_OK;
    for (int64_t k = 0; k < l->n; k++) {
        ct_tensor *p = l->param[k], *st = entry(l->step_t, k), *ctl = entry(l->ctl, k);
        ct_tensor *ms = entry(l->master, k), *cp = ms ? NULL : entry(l->copy, k);
        double t = st ? *(const double *)cti_data(st) + 1 : (double)l->step[k];
        double lr = ctl ? *(const double *)cti_data(ctl) : lr_of(prm, a);
        int64_t n = cti_numel(p->ndim, p->shape);
        /* the rounded copy: the parameter of a master, autocast's cast of
         * a float32 parameter */
        job j = {.p = cti_data(ms ? ms : p),
                 .g = cti_data(l->grad[k]),
                 .model = ms ? cti_data(p) : cp ? cti_data(cp) : NULL,
                 .pdt = ms ? CT_F32 : p->dtype,
                 .gdt = p->dtype,
                 .mdt = cp ? cp->dtype : p->dtype,
                 .a = a,
                 .adamw = adamw};
        switch (a) {
        case ALG_ADAMW: adamw_job(&j, &prm->adamw, lr, t); break;
        case ALG_ADAM: adam_job(&j, &prm->adam, lr, t); break;
        case ALG_RMSPROP: rmsprop_job(&j, &prm->rmsprop, lr); break;
        case ALG_ADAGRAD: adagrad_job(&j, &prm->adagrad, lr, t); break;
        default: sgd_job(&j, &prm->sgd, lr, t); break;
        }
        char **sp[3] = {&j.s0, &j.s1, &j.s2};
        for (int b = 0; b < 3; b++) {
            ct_tensor *s = l->state[b] ? l->state[b][k] : NULL;
            *sp[b] = s ? cti_data(s) : NULL;
        }
        if (n > 0) cti_parallel_for(n, CTI_GRAIN, range, &j);
        if (st) *(double *)cti_data(st) = t;
    }
    return CT_OK;
}

/* ---- loss scaling --------------------------------------------------------------------------- */
/* One gradient's share of AMP_UNSCALE: found is set where an element is not
 * finite (before scaling), as torch checks the scaled gradient. */
typedef struct unscale_job {
    char *g;
    ct_dtype dt;
    float inv;
    atomic_int found;
} unscale_job;

static void unscale_range(int64_t b, int64_t e, void *ctx) {
    unscale_job *j = ctx;
    bool bad = false;
    int64_t n = e - b;
    if (j->dt == CT_F64) {
        double *x = (double *)j->g + b, inv = j->inv;
        for (int64_t i = 0; i < n; i++) {
            bad |= !isfinite(x[i]);
            if (inv != 1) x[i] *= inv;
        }
    } else if (j->dt == CT_F32) {
        float *x = (float *)j->g + b, inv = j->inv;
        for (int64_t i = 0; i < n; i++) {
            bad |= !isfinite(x[i]);
            if (inv != 1) x[i] *= inv;
        }
    } else {
        float v[BLK];
        for (int64_t i = 0; i < n; i += BLK) {
            int64_t m = n - i < BLK ? n - i : BLK;
            char *at = j->g + (size_t)(b + i) * 2;
            load(v, at, j->dt, m);
            for (int64_t q = 0; q < m; q++) {
                bad |= !isfinite(v[q]);
                v[q] *= j->inv;
            }
            if (j->inv != 1) store(at, v, j->dt, m);
        }
    }
    if (bad) atomic_store_explicit(&j->found, 1, memory_order_relaxed);
}

static ct_status k_amp_unscale(ct_call *c) {
    const cti_amp_unscale_params *prm = CTI_PARAMS(c, cti_amp_unscale_params);
    float inv = (float)(1.0 / (double)*(const float *)cti_data(prm->scale));
    bool found = false;
    for (int64_t k = 0; k < prm->n; k++) {
        ct_tensor *g = prm->grad[k];
        unscale_job j = {cti_data(g), g->dtype, inv, 0};
        int64_t n = cti_numel(g->ndim, g->shape);
        if (n > 0) cti_parallel_for(n, CTI_GRAIN, unscale_range, &j);
        found |= atomic_load(&j.found) != 0;
    }
    if (found) *(float *)cti_data(prm->found_inf) = 1.0f;
    c->routine = "cpu_amp_non_finite_check_and_unscale";
    return CT_OK;
}

static ct_status k_amp_update(ct_call *c) {
    const cti_amp_update_params *p = CTI_PARAMS(c, cti_amp_update_params);
    float *scale = (float *)cti_data(c->in[0]);
    int32_t *tracker = (int32_t *)cti_data(c->in[1]);
    if (*(const float *)cti_data(c->in[2]) != 0) {
        *scale = (float)(*scale * p->backoff_factor);
        *tracker = 0;
    } else if ((int64_t)*tracker + 1 == p->growth_interval) {
        float grown = (float)(*scale * p->growth_factor);
        if (isfinite(grown)) *scale = grown;
        *tracker = 0;
    } else {
        *tracker += 1;
    }
    c->routine = "cpu_amp_update_scale";
    return CT_OK;
}

void cti_cpu_register_optim(void) {
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        cti_register_kernel(CT_OP_SGD_STEP, CT_DEVICE_CPU, dts[k], k_optim, "cpu_sgd_step");
        cti_register_kernel(CT_OP_ADAMW_STEP, CT_DEVICE_CPU, dts[k], k_optim, "cpu_adamw_step");
        cti_register_kernel(CT_OP_ADAM_STEP, CT_DEVICE_CPU, dts[k], k_optim, "cpu_adam_step");
        cti_register_kernel(CT_OP_RMSPROP_STEP, CT_DEVICE_CPU, dts[k], k_optim,
                            "cpu_rmsprop_step");
        cti_register_kernel(CT_OP_ADAGRAD_STEP, CT_DEVICE_CPU, dts[k], k_optim,
                            "cpu_adagrad_step");
        cti_register_kernel(CT_OP_AMP_UNSCALE, CT_DEVICE_CPU, dts[k], k_amp_unscale,
                            "cpu_amp_non_finite_check_and_unscale");
    }
    cti_register_kernel(CT_OP_AMP_UPDATE_SCALE, CT_DEVICE_CPU, CT_F32, k_amp_update,
                        "cpu_amp_update_scale");
}
