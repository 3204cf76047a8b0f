/* Optimizers (torch.optim.SGD and AdamW, single-tensor form) and gradient
 * clipping. Updates are in-place public ops in no-grad mode, so they run on
 * whatever device holds the parameter; per-parameter temporaries live in a
 * scope of their own. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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
};

void ct_optim_free(ct_optimizer *opt) {
    if (!opt) return;
    for (int64_t k = 0; k < opt->n; k++) {
        slot *s = &opt->slots[k];
        ct_tensor_release(s->param);
        ct_tensor_release(s->step);
        for (int b = 0; b < MAX_BUFS; b++) ct_tensor_release(s->buf[b]);
    }
    free(opt->slots);
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
    for (int64_t k = 0; k < params->n; k++) {
        slot *s = &slots[k];
        s->param = ct_tensor_retain(params->tensors[k]);
        opt->n = k + 1;
        snprintf(s->names[0], STATE_NAME_MAX, "%lld.step", (long long)k);
        if (!(s->step = owned(ct_tensor_scalar(0.0, CT_F64, CT_CPU)))) goto fail;
        for (int b = 0; b < nbuf; b++) {
            snprintf(s->names[1 + b], STATE_NAME_MAX, "%lld.%s", (long long)k, bufnames[b]);
            if (!(s->buf[b] = owned(ct_tensor_zeros_like(s->param)))) goto fail;
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
 * Each returns the status of the first failing op; t is the parameter's
 * step count including this update. */
static ct_status sgd_update(const ct_optimizer *o, slot *s, ct_tensor *g, double t) {
    ct_tensor *p = s->param, *d = g;
    if (o->weight_decay != 0 && !(d = ct_add_alpha(g, p, o->weight_decay)))
        return ct_last_status();
    if (o->momentum != 0) {
        ct_tensor *buf = s->buf[0];
        ct_status st = t == 1 ? ct_copy_(buf, d) : ct_mul_scalar_(buf, o->momentum);
        if (st == CT_OK && t != 1) st = ct_add_alpha_(buf, d, 1 - o->dampening);
        if (st != CT_OK) return st;
        if (!o->nesterov) d = buf;
        else if (!(d = ct_add_alpha(d, buf, o->momentum))) return ct_last_status();
    }
    return ct_add_alpha_(p, d, -o->lr);
}

static ct_status adamw_update(const ct_optimizer *o, slot *s, ct_tensor *g, double t) {
    ct_tensor *p = s->param, *m = s->buf[0], *v = s->buf[1];
    ct_status st = CT_OK;
    if (o->weight_decay != 0) st = ct_mul_scalar_(p, 1 - o->lr * o->weight_decay);
    if (st == CT_OK) st = ct_mul_scalar_(m, o->beta1);
    if (st == CT_OK) st = ct_add_alpha_(m, g, 1 - o->beta1);
    if (st == CT_OK) st = ct_mul_scalar_(v, o->beta2);
    if (st != CT_OK) return st;
    ct_tensor *g2 = ct_mul(g, g);
    if (!g2 || (st = ct_add_alpha_(v, g2, 1 - o->beta2))) return ct_last_status();
    double bc1 = 1 - pow(o->beta1, t), bc2 = 1 - pow(o->beta2, t);
    ct_tensor *denom = ct_sqrt(v);
    if (!denom) return ct_last_status();
    if ((st = ct_div_scalar_(denom, sqrt(bc2))) || (st = ct_add_scalar_(denom, o->eps)))
        return st;
    ct_tensor *q = ct_div(m, denom);
    if (!q) return ct_last_status();
    return ct_add_alpha_(p, q, -o->lr / bc1);
}

ct_status ct_optim_step(ct_optimizer *opt) {
    static const char op[] = "ct_optim_step";
    if (!opt) return cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
    bool prev = ct_no_grad_begin();
    ct_status st = CT_OK;
    for (int64_t k = 0; k < opt->n && st == CT_OK; k++) {
        slot *s = &opt->slots[k];
        ct_tensor *g = ct_grad(s->param);
        if (!g) continue;
        double t;
        if ((st = ct_tensor_item(s->step, &t))) break;
        t += 1;
        ct_scope *scope = ct_scope_begin();
        if (!scope) {
            st = ct_last_status();
            break;
        }
        st = opt->kind == OPT_SGD ? sgd_update(opt, s, g, t) : adamw_update(opt, s, g, t);
        ct_scope_end(scope);
        if (st == CT_OK) st = ct_fill_(s->step, t);
        if (st != CT_OK)
            cti_error(st, "%s: updating parameter %lld (%s): %s", op, (long long)k,
                      cti_desc(s->param), ct_last_error());
    }
    ct_no_grad_end(prev);
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
