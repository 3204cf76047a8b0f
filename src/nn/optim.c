/* Optimizers (torch.optim.SGD and AdamW) and gradient clipping. A step is
 * one fused update kernel per (device, dtype) of the parameters
 * (CT_OP_SGD_STEP, CT_OP_ADAMW_STEP), in no-grad mode, on whatever device
 * holds them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/optim_impl.h"
#include "nn_impl.h"

typedef enum opt_kind { OPT_SGD, OPT_ADAMW } opt_kind;

#define STATE_NAME_MAX 48
#define MAX_BUFS 2

typedef struct slot {
    ct_tensor *param;          /* retained */
    ct_tensor *step;           /* 0-d float64 CPU: updates received */
    ct_tensor *buf[MAX_BUFS];  /* momentum_buffer | exp_avg, exp_avg_sq */
    char names[1 + MAX_BUFS][STATE_NAME_MAX];
} slot;

struct ct_optimizer {
    opt_kind kind;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;
    bool nesterov;
    int nbuf; /* state buffers per parameter besides the step */
    int64_t n;
    slot *slots;
    /* The fused update's argument arrays, n each, filled at every step. */
    ct_tensor **list_param, **list_grad, **list_state[MAX_BUFS];
    int64_t *list_step;
    bool *list_updated;
};

void ct_optim_free(ct_optimizer *opt) {
    if (!opt) return;
    for (int64_t k = 0; k < opt->n; k++) {
        slot *s = &opt->slots[k];
        cti_unref(s->param);
        ct_tensor_release(s->step);
        for (int b = 0; b < MAX_BUFS; b++) ct_tensor_release(s->buf[b]);
    }
    free(opt->slots);
    free(opt->list_param);
    free(opt->list_step);
    free(opt->list_updated);
    free(opt);
}

/* The optimizer owns its state: handles taken out of any open scope. */
static ct_tensor *owned(ct_tensor *t) {
    if (t) cti_scope_forget(t);
    return t;
}

/* Takes references to params and creates the state tensors (buffer names
 * in bufnames, nbuf of them). */
static ct_optimizer *create(const char *op, const ct_params *params, opt_kind kind, int nbuf,
                            const char *const *bufnames) {
    if (!params) return cti_error_null(CT_ERR_INVALID_ARG, "%s: parameter list is NULL", op);
    if (params->n == 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: got an empty parameter list", op);
    for (int64_t k = 0; k < params->n; k++) {
        ct_tensor *p = params->tensors[k];
        if (!ct_dtype_is_floating(p->dtype))
            return cti_error_null(CT_ERR_DTYPE,
                                  "%s: parameter %lld ('%s', %s) is not floating", op,
                                  (long long)k, params->names[k], cti_desc(p));
        if (!ct_is_leaf(p))
            return cti_error_null(CT_ERR_AUTOGRAD,
                                  "%s: can't optimize a non-leaf tensor: parameter %lld ('%s', "
                                  "%s) was produced by %s",
                                  op, (long long)k, params->names[k], cti_desc(p),
                                  ct_grad_fn_name(p));
    }
    ct_optimizer *opt = calloc(1, sizeof *opt);
    slot *slots = calloc((size_t)params->n, sizeof *slots);
    if (!opt || !slots) {
        free(opt);
        free(slots);
        return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    }
    opt->kind = kind;
    opt->nbuf = nbuf;
    opt->slots = slots;
    size_t n = (size_t)params->n;
    opt->list_param = calloc(n * (2 + MAX_BUFS), sizeof *opt->list_param);
    opt->list_step = calloc(n, sizeof *opt->list_step);
    opt->list_updated = calloc(n, sizeof *opt->list_updated);
    if (!opt->list_param || !opt->list_step || !opt->list_updated) {
        ct_optim_free(opt);
        return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    }
    opt->list_grad = opt->list_param + n;
    for (int b = 0; b < MAX_BUFS; b++) opt->list_state[b] = opt->list_param + (2 + b) * n;
    for (int64_t k = 0; k < params->n; k++) {
        slot *s = &slots[k];
        s->param = cti_ref(params->tensors[k]);
        opt->list_param[k] = s->param;
        opt->n = k + 1;
        snprintf(s->names[0], STATE_NAME_MAX, "%lld.step", (long long)k);
        if (!(s->step = owned(ct_tensor_scalar(0.0, CT_F64, CT_CPU)))) goto fail;
        for (int b = 0; b < nbuf; b++) {
            snprintf(s->names[1 + b], STATE_NAME_MAX, "%lld.%s", (long long)k, bufnames[b]);
            if (!(s->buf[b] = owned(ct_tensor_zeros_like(s->param)))) goto fail;
            opt->list_state[b][k] = s->buf[b];
        }
    }
    return opt;
fail:
    cti_error(ct_last_status(), "%s: creating the state: %s", op, ct_last_error());
    ct_optim_free(opt);
    return NULL;
}

static bool bad_nonneg(double v) { return !(v >= 0) || !isfinite(v); }

ct_optimizer *ct_optim_sgd_new(const ct_params *params, double lr, double momentum,
                               double dampening, double weight_decay, bool nesterov) {
    static const char op[] = "ct_optim_sgd_new";
    if (bad_nonneg(lr))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: invalid learning rate %g (expected >= 0)",
                              op, lr);
    if (bad_nonneg(momentum))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: invalid momentum %g (expected >= 0)", op,
                              momentum);
    if (bad_nonneg(weight_decay))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: invalid weight_decay %g (expected >= 0)", op, weight_decay);
    if (!isfinite(dampening))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: invalid dampening %g (expected finite)",
                              op, dampening);
    if (nesterov && (momentum <= 0 || dampening != 0))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: nesterov momentum requires a momentum > 0 and zero dampening, "
                              "got momentum %g, dampening %g",
                              op, momentum, dampening);
    static const char *const names[] = {"momentum_buffer"};
    ct_optimizer *opt = create(op, params, OPT_SGD, momentum != 0 ? 1 : 0, names);
    if (!opt) return NULL;
    opt->lr = lr;
    opt->momentum = momentum;
    opt->dampening = dampening;
    opt->weight_decay = weight_decay;
    opt->nesterov = nesterov;
    return opt;
}

ct_optimizer *ct_optim_adamw_new(const ct_params *params, double lr, double beta1,
                                 double beta2, double eps, double weight_decay) {
    static const char op[] = "ct_optim_adamw_new";
    if (bad_nonneg(lr))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: invalid learning rate %g (expected >= 0)",
                              op, lr);
    if (bad_nonneg(eps))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: invalid epsilon %g (expected >= 0)", op,
                              eps);
    if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: invalid betas (%g, %g) (expected each in [0, 1))", op, beta1,
                              beta2);
    if (bad_nonneg(weight_decay))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: invalid weight_decay %g (expected >= 0)", op, weight_decay);
    static const char *const names[] = {"exp_avg", "exp_avg_sq"};
    ct_optimizer *opt = create(op, params, OPT_ADAMW, 2, names);
    if (!opt) return NULL;
    opt->lr = lr;
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->weight_decay = weight_decay;
    return opt;
}

/* ---- updates ----------------------------------------------------------------------------------
 * One fused update per (device, dtype) of the parameters that have a
 * gradient (src/ops/optim.c); the step counts are read and written on
 * the host, so a step waits for nothing. */
static ct_status fused_update(const char *op, ct_optimizer *o) {
    cti_optim_list l = {o->n,
                        o->list_param,
                        o->list_grad,
                        {o->nbuf > 0 ? o->list_state[0] : NULL,
                         o->nbuf > 1 ? o->list_state[1] : NULL},
                        o->list_step,
                        o->list_updated};
    for (int64_t k = 0; k < o->n; k++) {
        slot *s = &o->slots[k];
        o->list_grad[k] = ct_grad(s->param);
        o->list_updated[k] = false;
        if (!o->list_grad[k]) continue;
        /* The count is a float64 like torch's, so a restored one may be any
         * value: the update counts whole steps. */
        double t = *(const double *)cti_data(s->step);
        if (!(t >= 0 && t < 9007199254740992.0))
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: the step count of parameter %lld is %g (expected a count >= "
                             "0; was a bad checkpoint restored?)",
                             op, (long long)k, t);
        o->list_step[k] = (int64_t)t + 1;
    }
    if (o->kind == OPT_SGD) {
        cti_sgd_hparams h = {o->lr, o->momentum, o->dampening, o->weight_decay, o->nesterov};
        return cti_sgd_step(op, &l, &h);
    }
    cti_adamw_hparams h = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay};
    return cti_adamw_step(op, &l, &h);
}

ct_status ct_optim_step(ct_optimizer *opt) {
    static const char op[] = "ct_optim_step";
    if (!opt) return cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
    bool prev = ct_no_grad_begin();
    ct_status st = fused_update(op, opt);
    ct_no_grad_end(prev);
    for (int64_t k = 0; k < opt->n; k++) {
        if (!opt->list_updated[k]) continue;
        ct_tensor *t = opt->slots[k].step;
        *(double *)cti_data(t) = (double)opt->list_step[k];
        cti_bump_version(t);
    }
    for (int64_t k = 0; k < opt->n; k++) opt->list_grad[k] = NULL; /* borrowed for the call */
    return st;
}

void ct_optim_zero_grad(ct_optimizer *opt) {
    if (!opt) return;
    for (int64_t k = 0; k < opt->n; k++) ct_zero_grad(opt->slots[k].param);
}

ct_status ct_optim_set_lr(ct_optimizer *opt, double lr) {
    if (!opt) return cti_error(CT_ERR_INVALID_ARG, "ct_optim_set_lr: optimizer is NULL");
    if (bad_nonneg(lr))
        return cti_error(CT_ERR_INVALID_ARG,
                         "ct_optim_set_lr: invalid learning rate %g (expected >= 0)", lr);
    opt->lr = lr;
    return CT_OK;
}

double ct_optim_get_lr(const ct_optimizer *opt) { return opt ? opt->lr : NAN; }

int64_t ct_optim_state_count(const ct_optimizer *opt) {
    return opt ? opt->n * (1 + opt->nbuf) : 0;
}

ct_tensor *ct_optim_state_get(const ct_optimizer *opt, int64_t k, const char **name) {
    if (!opt) return cti_error_null(CT_ERR_INVALID_ARG, "ct_optim_state_get: optimizer is NULL");
    int64_t count = ct_optim_state_count(opt);
    if (k < 0 || k >= count)
        return cti_error_null(CT_ERR_INDEX,
                              "ct_optim_state_get: index %lld is out of range for %lld state "
                              "tensors",
                              (long long)k, (long long)count);
    slot *s = &opt->slots[k / (1 + opt->nbuf)];
    int j = (int)(k % (1 + opt->nbuf));
    if (name) *name = s->names[j];
    return j == 0 ? s->step : s->buf[j - 1];
}

/* ---- clip_grad_norm_ ------------------------------------------------------------------------ */
ct_status ct_clip_grad_norm(const ct_params *params, double max_norm, double *total_norm) {
    static const char op[] = "ct_clip_grad_norm";
    if (!params) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter list is NULL", op);
    if (!(max_norm > 0) || !isfinite(max_norm))
        return cti_error(CT_ERR_INVALID_ARG, "%s: max_norm must be finite and > 0, got %g", op,
                         max_norm);
    bool prev = ct_no_grad_begin();
    ct_scope *scope = ct_scope_begin();
    ct_status st = scope ? CT_OK : ct_last_status();
    double sumsq = 0;
    for (int64_t k = 0; k < params->n && st == CT_OK; k++) {
        ct_tensor *g = ct_grad(params->tensors[k]);
        if (!g) continue;
        ct_tensor *nk = ct_norm(g, 2.0, CT_NONE, false);
        double v = 0;
        if (!nk || (st = ct_tensor_item(nk, &v))) st = ct_last_status();
        sumsq += v * v;
    }
    double total = sqrt(sumsq);
    /* As torch: the coefficient clamped to 1, so a non-finite total spreads
     * to the gradients rather than being hidden. */
    double coef = max_norm / (total + 1e-6);
    for (int64_t k = 0; k < params->n && st == CT_OK && !(coef >= 1.0); k++) {
        ct_tensor *g = ct_grad(params->tensors[k]);
        if (g) st = ct_mul_scalar_(g, coef);
    }
    ct_scope_end(scope);
    ct_no_grad_end(prev);
    if (st != CT_OK) return cti_error(st, "%s: %s", op, ct_last_error());
    if (total_norm) *total_norm = total;
    return CT_OK;
}
