/* Optimizers (torch.optim.SGD, AdamW, Adam, RMSprop, Adagrad) and gradient
 * clipping. A step is one fused update kernel per (device, dtype) of the
 * parameters (CT_OP_SGD_STEP, CT_OP_ADAMW_STEP, CT_OP_ADAM_STEP,
 * CT_OP_RMSPROP_STEP, CT_OP_ADAGRAD_STEP), in no-grad mode, on whatever
 * device holds them.
 *
 * Step counts: a CPU parameter's is a CPU scalar the host reads and
 * advances; a GPU parameter's lives on its device with the learning rate
 * (a per-device control tensor), and the kernel reads and advances it, as
 * torch.optim's capturable=True: a step records into a CUDA graph, replays
 * right, and skips itself on the device when a gradient scaler found an
 * inf, without the host waiting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/optim_impl.h"
#include "nn_impl.h"

typedef enum opt_kind { OPT_SGD, OPT_ADAMW, OPT_ADAM, OPT_RMSPROP, OPT_ADAGRAD } opt_kind;

#define STATE_NAME_MAX 48
#define MAX_BUFS 3

typedef struct slot {
    ct_tensor *param;          /* retained */
    ct_tensor *step;           /* 0-d float64 on the parameter's device: updates received */
    ct_tensor *buf[MAX_BUFS];  /* the optimizer's buffers, in the order of their names */
    ct_tensor *master;         /* float32 master weights, or NULL */
    ct_tensor *ctl;            /* borrowed: its device's control tensor; NULL on the CPU */
    char names[2 + MAX_BUFS][STATE_NAME_MAX]; /* step, buffers, master */
} slot;

/* A device's control tensor (float64 [2]: the learning rate, and the
 * kernels' block counter) and a view of its learning rate. */
typedef struct devctl {
    ct_tensor *ctl, *lr;
} devctl;

struct ct_optimizer {
    opt_kind kind;
    double lr, momentum, dampening, beta1, beta2, eps;
    double alpha, lr_decay; /* RMSprop, Adagrad */
    bool nesterov;
    bool amsgrad, centered; /* Adam, RMSprop */
    /* The kernels' state index of buffer b (RMSprop without momentum keeps
     * its grad_avg in the contract's state[2]). */
    int slot_of[MAX_BUFS];
    bool masters; /* float32 master weights for float16/bfloat16 parameters */
    int nbuf; /* state buffers per parameter besides the step */
    int64_t n;
    slot *slots;
    int ndev;
    devctl *devs;
    /* The fused update's argument arrays, n each, filled at every step. */
    ct_tensor **list_param, **list_grad, **list_state[MAX_BUFS], **list_master, **list_step_t,
        **list_ctl;
    int64_t *list_step;
    bool *list_updated;
    double *weight_decay; /* per parameter, n: the constructor's unless set */
};

/* Whether t's step count lives on its device (read and advanced by the kernels). */
static bool count_on_device(const ct_tensor *t) {
    return t->storage->device.type != CT_DEVICE_CPU;
}

void ct_optim_free(ct_optimizer *opt) {
    if (!opt) return;
    for (int64_t k = 0; k < opt->n; k++) {
        slot *s = &opt->slots[k];
        cti_unref(s->param);
        ct_tensor_release(s->step);
        ct_tensor_release(s->master);
        for (int b = 0; b < MAX_BUFS; b++) ct_tensor_release(s->buf[b]);
    }
    for (int d = 0; d < opt->ndev; d++) {
        ct_tensor_release(opt->devs[d].lr);
        ct_tensor_release(opt->devs[d].ctl);
    }
    free(opt->devs);
    free(opt->slots);
    free(opt->list_param);
    free(opt->list_step);
    free(opt->list_updated);
    free(opt->weight_decay);
    free(opt);
}

/* The optimizer owns its state: handles taken out of any open scope. */
static ct_tensor *owned(ct_tensor *t) {
    if (t) cti_scope_forget(t);
    return t;
}

/* The control tensor of device dev, made on first use with the learning
 * rate lr; NULL with an error. */
static ct_tensor *device_ctl(ct_optimizer *opt, ct_device dev, double lr) {
    for (int d = 0; d < opt->ndev; d++)
        if (ct_device_eq(ct_tensor_device(opt->devs[d].ctl), dev)) return opt->devs[d].ctl;
    devctl *c = &opt->devs[opt->ndev];
    if (!(c->ctl = owned(ct_tensor_zeros(CT_SHAPE(2), CT_F64, dev)))) return NULL;
    opt->ndev++;
    if (!(c->lr = owned(ct_narrow(c->ctl, 0, 0, 1))) || ct_fill_(c->lr, lr) != CT_OK) return NULL;
    return c->ctl;
}

/* Takes references to params and creates the state tensors (buffer names
 * in bufnames, nbuf of them, buffer b in the kernels' state slot[b]; NULL:
 * slot b). */
static ct_optimizer *create_in(const char *op, const ct_params *params, opt_kind kind,
                               int nbuf, const char *const *bufnames, const int *state_of,
                               double lr) {
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
    devctl *devs = calloc((size_t)params->n, sizeof *devs);
    if (!opt || !slots || !devs) {
        free(opt);
        free(slots);
        free(devs);
        return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    }
    opt->kind = kind;
    opt->nbuf = nbuf;
    for (int b = 0; b < MAX_BUFS; b++)
        opt->slot_of[b] = state_of && b < nbuf ? state_of[b] : b;
    opt->slots = slots;
    opt->devs = devs;
    opt->lr = lr;
    size_t n = (size_t)params->n;
    opt->list_param = calloc(n * (5 + MAX_BUFS), sizeof *opt->list_param);
    opt->list_step = calloc(n, sizeof *opt->list_step);
    opt->list_updated = calloc(n, sizeof *opt->list_updated);
    opt->weight_decay = calloc(n, sizeof *opt->weight_decay);
    if (!opt->list_param || !opt->list_step || !opt->list_updated || !opt->weight_decay) {
        ct_optim_free(opt);
        return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    }
    opt->list_grad = opt->list_param + n;
    opt->list_master = opt->list_param + 2 * n;
    opt->list_step_t = opt->list_param + 3 * n;
    opt->list_ctl = opt->list_param + 4 * n;
    for (int b = 0; b < MAX_BUFS; b++) opt->list_state[b] = opt->list_param + (5 + b) * n;
    for (int64_t k = 0; k < params->n; k++) {
        slot *s = &slots[k];
        s->param = cti_ref(params->tensors[k]);
        opt->list_param[k] = s->param;
        opt->n = k + 1;
        snprintf(s->names[0], STATE_NAME_MAX, "%lld.step", (long long)k);
        snprintf(s->names[1 + nbuf], STATE_NAME_MAX, "%lld.master_param", (long long)k);
        ct_device dev = ct_tensor_device(s->param);
        if (!(s->step = owned(ct_tensor_scalar(0.0, CT_F64, dev)))) goto fail;
        if (count_on_device(s->param) && !(s->ctl = device_ctl(opt, dev, lr))) goto fail;
        for (int b = 0; b < nbuf; b++) {
            snprintf(s->names[1 + b], STATE_NAME_MAX, "%lld.%s", (long long)k, bufnames[b]);
            if (!(s->buf[b] = owned(ct_tensor_zeros_like(s->param)))) goto fail;
            opt->list_state[opt->slot_of[b]][k] = s->buf[b];
        }
    }
    return opt;
fail:
    cti_error(ct_last_status(), "%s: creating the state: %s", op, ct_last_error());
    ct_optim_free(opt);
    return NULL;
}

static ct_optimizer *create(const char *op, const ct_params *params, opt_kind kind, int nbuf,
                            const char *const *bufnames, double lr) {
    return create_in(op, params, kind, nbuf, bufnames, NULL, lr);
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
    ct_optimizer *opt = create(op, params, OPT_SGD, momentum != 0 ? 1 : 0, names, lr);
    if (!opt) return NULL;
    opt->momentum = momentum;
    opt->dampening = dampening;
    for (int64_t k = 0; k < opt->n; k++) opt->weight_decay[k] = weight_decay;
    opt->nesterov = nesterov;
    return opt;
}

/* Adam's and AdamW's hyperparameters, as PyTorch checks them; false with
 * the error set naming op. */
static bool adam_args_ok(const char *op, double lr, double beta1, double beta2, double eps,
                         double weight_decay) {
    if (bad_nonneg(lr))
        cti_error(CT_ERR_INVALID_ARG, "%s: invalid learning rate %g (expected >= 0)", op, lr);
    else if (bad_nonneg(eps))
        cti_error(CT_ERR_INVALID_ARG, "%s: invalid epsilon %g (expected >= 0)", op, eps);
    else if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
        cti_error(CT_ERR_INVALID_ARG, "%s: invalid betas (%g, %g) (expected each in [0, 1))", op,
                  beta1, beta2);
    else if (bad_nonneg(weight_decay))
        cti_error(CT_ERR_INVALID_ARG, "%s: invalid weight_decay %g (expected >= 0)", op,
                  weight_decay);
    else
        return true;
    return false;
}

ct_optimizer *ct_optim_adamw_new(const ct_params *params, double lr, double beta1,
                                 double beta2, double eps, double weight_decay) {
    static const char op[] = "ct_optim_adamw_new";
    if (!adam_args_ok(op, lr, beta1, beta2, eps, weight_decay)) return NULL;
    static const char *const names[] = {"exp_avg", "exp_avg_sq"};
    ct_optimizer *opt = create(op, params, OPT_ADAMW, 2, names, lr);
    if (!opt) return NULL;
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    for (int64_t k = 0; k < opt->n; k++) opt->weight_decay[k] = weight_decay;
    return opt;
}

ct_optimizer *ct_optim_adam_new(const ct_params *params, double lr, double beta1, double beta2,
                                double eps, double weight_decay, bool amsgrad) {
    static const char op[] = "ct_optim_adam_new";
    if (!adam_args_ok(op, lr, beta1, beta2, eps, weight_decay)) return NULL;
    static const char *const names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    ct_optimizer *opt = create(op, params, OPT_ADAM, amsgrad ? 3 : 2, names, lr);
    if (!opt) return NULL;
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->amsgrad = amsgrad;
    for (int64_t k = 0; k < opt->n; k++) opt->weight_decay[k] = weight_decay;
    return opt;
}

ct_optimizer *ct_optim_rmsprop_new(const ct_params *params, double lr, double alpha, double eps,
                                   double weight_decay, double momentum, bool centered) {
    static const char op[] = "ct_optim_rmsprop_new";
    struct {
        const char *what;
        double v;
    } chk[] = {{"learning rate", lr}, {"alpha", alpha},       {"epsilon", eps},
               {"momentum", momentum}, {"weight_decay", weight_decay}};
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++)
        if (bad_nonneg(chk[i].v))
            return cti_error_null(CT_ERR_INVALID_ARG, "%s: invalid %s %g (expected >= 0)", op,
                                  chk[i].what, chk[i].v);
    /* square_avg, then momentum_buffer and grad_avg where used, as torch's
     * state dict orders them; grad_avg stays in the kernels' state[2]. */
    const char *names[3] = {"square_avg"};
    int state_of[3] = {0}, nbuf = 1;
    if (momentum > 0) names[nbuf] = "momentum_buffer", state_of[nbuf++] = 1;
    if (centered) names[nbuf] = "grad_avg", state_of[nbuf++] = 2;
    ct_optimizer *opt = create_in(op, params, OPT_RMSPROP, nbuf, names, state_of, lr);
    if (!opt) return NULL;
    opt->alpha = alpha;
    opt->eps = eps;
    opt->momentum = momentum;
    opt->centered = centered;
    for (int64_t k = 0; k < opt->n; k++) opt->weight_decay[k] = weight_decay;
    return opt;
}

ct_optimizer *ct_optim_adagrad_new(const ct_params *params, double lr, double lr_decay,
                                   double weight_decay, double initial_accumulator_value,
                                   double eps) {
    static const char op[] = "ct_optim_adagrad_new";
    struct {
        const char *what;
        double v;
    } chk[] = {{"learning rate", lr},
               {"lr_decay", lr_decay},
               {"weight_decay", weight_decay},
               {"initial_accumulator_value", initial_accumulator_value},
               {"epsilon", eps}};
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++)
        if (bad_nonneg(chk[i].v))
            return cti_error_null(CT_ERR_INVALID_ARG, "%s: invalid %s %g (expected >= 0)", op,
                                  chk[i].what, chk[i].v);
    static const char *const names[] = {"sum"};
    ct_optimizer *opt = create(op, params, OPT_ADAGRAD, 1, names, lr);
    if (!opt) return NULL;
    opt->lr_decay = lr_decay;
    opt->eps = eps;
    for (int64_t k = 0; k < opt->n; k++) opt->weight_decay[k] = weight_decay;
    if (initial_accumulator_value != 0) {
        bool prev = ct_no_grad_begin();
        ct_status st = CT_OK;
        for (int64_t k = 0; k < opt->n && st == CT_OK; k++)
            st = ct_fill_(opt->slots[k].buf[0], initial_accumulator_value);
        ct_no_grad_end(prev);
        if (st != CT_OK) {
            cti_error(st, "%s: creating the state: %s", op, ct_last_error());
            ct_optim_free(opt);
            return NULL;
        }
    }
    return opt;
}

/* ---- master weights ------------------------------------------------------------------------ */
static bool low_precision(const ct_tensor *t) {
    return t->dtype == CT_F16 || t->dtype == CT_BF16;
}

ct_status ct_optim_set_master_weights(ct_optimizer *opt, bool enable) {
    static const char op[] = "ct_optim_set_master_weights";
    if (!opt) return cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
    if (opt->masters == enable) return CT_OK;
    /* Every new tensor first, so that a failure changes nothing. */
    ct_tensor *(*made)[1 + MAX_BUFS] = calloc((size_t)opt->n, sizeof *made);
    if (!made) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    bool prev = ct_no_grad_begin();
    ct_status st = CT_OK;
    for (int64_t k = 0; k < opt->n && st == CT_OK; k++) {
        slot *s = &opt->slots[k];
        if (!low_precision(s->param)) continue;
        ct_dtype sdt = enable ? CT_F32 : s->param->dtype;
        if (enable && !(made[k][0] = owned(ct_to_dtype(s->param, CT_F32)))) st = ct_last_status();
        for (int b = 0; b < opt->nbuf && st == CT_OK; b++)
            if (!(made[k][1 + b] = owned(ct_to_dtype(s->buf[b], sdt)))) st = ct_last_status();
    }
    ct_no_grad_end(prev);
    for (int64_t k = 0; k < opt->n; k++) {
        slot *s = &opt->slots[k];
        if (!low_precision(s->param)) continue;
        if (st != CT_OK) {
            for (int j = 0; j < 1 + MAX_BUFS; j++) ct_tensor_release(made[k][j]);
            continue;
        }
        ct_tensor_release(s->master);
        s->master = made[k][0];
        for (int b = 0; b < opt->nbuf; b++) {
            ct_tensor_release(s->buf[b]);
            s->buf[b] = opt->list_state[opt->slot_of[b]][k] = made[k][1 + b];
        }
    }
    free(made);
    if (st != CT_OK) return cti_error(st, "%s: %s", op, ct_last_error());
    opt->masters = enable;
    return CT_OK;
}

/* ---- updates ----------------------------------------------------------------------------------
 * One fused update per (device, dtype) of the parameters that have a
 * gradient (src/ops/optim.c). CPU counts are read and written on the host;
 * device counts and the learning rate are read by the kernels, so a step
 * waits for nothing. */
static ct_status fused_update(const char *op, ct_optimizer *o, ct_tensor *found_inf) {
    bool used[MAX_BUFS] = {false};
    for (int b = 0; b < o->nbuf; b++) used[o->slot_of[b]] = true;
    cti_optim_list l = {o->n,
                        o->list_param,
                        o->list_grad,
                        {used[0] ? o->list_state[0] : NULL, used[1] ? o->list_state[1] : NULL,
                         used[2] ? o->list_state[2] : NULL},
                        o->list_step,
                        o->list_updated,
                        o->list_step_t,
                        o->list_ctl,
                        o->masters ? o->list_master : NULL,
                        found_inf,
                        o->weight_decay,
                        NULL}; /* the front end finds autocast's lasting casts */
    for (int64_t k = 0; k < o->n; k++) {
        slot *s = &o->slots[k];
        o->list_grad[k] = ct_grad(s->param);
        o->list_updated[k] = false;
        o->list_master[k] = s->master;
        o->list_step_t[k] = s->ctl ? s->step : NULL;
        o->list_ctl[k] = s->ctl;
        o->list_step[k] = 0;
        if (!o->list_grad[k] || s->ctl) continue;
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
    /* the list's per-parameter weight decays replace the hyperparameters' */
    switch (o->kind) {
    case OPT_SGD: {
        cti_sgd_hparams h = {o->lr, o->momentum, o->dampening, 0.0, o->nesterov};
        return cti_sgd_step(op, &l, &h);
    }
    case OPT_ADAM: {
        cti_adam_hparams h = {o->lr, o->beta1, o->beta2, o->eps, 0.0, o->amsgrad};
        return cti_adam_step(op, &l, &h);
    }
    case OPT_RMSPROP: {
        cti_rmsprop_hparams h = {o->lr, o->alpha, o->eps, 0.0, o->momentum, o->centered};
        return cti_rmsprop_step(op, &l, &h);
    }
    case OPT_ADAGRAD: {
        cti_adagrad_hparams h = {o->lr, o->lr_decay, o->eps, 0.0};
        return cti_adagrad_step(op, &l, &h);
    }
    default: {
        cti_adamw_hparams h = {o->lr, o->beta1, o->beta2, o->eps, 0.0};
        return cti_adamw_step(op, &l, &h);
    }
    }
}

ct_status cti_optim_step_with(const char *op, ct_optimizer *opt, ct_tensor *found_inf) {
    if (!opt) return cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
    bool prev = ct_no_grad_begin();
    ct_status st = fused_update(op, opt, found_inf);
    ct_no_grad_end(prev);
    for (int64_t k = 0; k < opt->n; k++) {
        slot *s = &opt->slots[k];
        if (!opt->list_updated[k] || s->ctl) continue;
        *(double *)cti_data(s->step) = (double)opt->list_step[k];
        cti_bump_version(s->step);
    }
    for (int64_t k = 0; k < opt->n; k++) opt->list_grad[k] = NULL; /* borrowed for the call */
    return st;
}

ct_status ct_optim_step(ct_optimizer *opt) {
    return cti_optim_step_with("ct_optim_step", opt, NULL);
}

void ct_optim_zero_grad(ct_optimizer *opt) {
    if (!opt) return;
    for (int64_t k = 0; k < opt->n; k++) ct_zero_grad(opt->slots[k].param);
}

ct_status ct_optim_set_lr(ct_optimizer *opt, double lr) {
    static const char op[] = "ct_optim_set_lr";
    if (!opt) return cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
    if (bad_nonneg(lr))
        return cti_error(CT_ERR_INVALID_ARG, "%s: invalid learning rate %g (expected >= 0)", op,
                         lr);
    /* The devices' copies are queued writes, ordered before the next step
     * (and a graph's next replay) on each device's stream. */
    for (int d = 0; d < opt->ndev && lr != opt->lr; d++) {
        ct_status st = ct_fill_(opt->devs[d].lr, lr);
        if (st != CT_OK) return cti_error(st, "%s: %s", op, ct_last_error());
    }
    opt->lr = lr;
    return CT_OK;
}

double ct_optim_get_lr(const ct_optimizer *opt) { return opt ? opt->lr : NAN; }

ct_status ct_optim_set_momentum(ct_optimizer *opt, double momentum) {
    static const char op[] = "ct_optim_set_momentum";
    if (!opt) return cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
    switch (opt->kind) {
    case OPT_ADAM:
    case OPT_ADAMW:
        if (!(momentum >= 0 && momentum < 1))
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: invalid beta1 %g for Adam/AdamW (expected in [0, 1))", op,
                             momentum);
        opt->beta1 = momentum;
        return CT_OK;
    case OPT_SGD:
    case OPT_RMSPROP:
        /* the buffer exists when the optimizer was made with momentum > 0;
         * 0 would turn it off in the kernels (and back on later), so
         * scheduled values stay > 0 */
        if (opt->momentum == 0)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: the optimizer was created with momentum 0 and keeps no "
                             "momentum buffer; create it with a momentum > 0 to schedule one",
                             op);
        if (!(momentum > 0) || !isfinite(momentum))
            return cti_error(CT_ERR_INVALID_ARG, "%s: invalid momentum %g (expected > 0)", op,
                             momentum);
        opt->momentum = momentum;
        return CT_OK;
    default:
        return cti_error(CT_ERR_INVALID_ARG, "%s: Adagrad has no momentum", op);
    }
}

double ct_optim_get_momentum(const ct_optimizer *opt) {
    static const char op[] = "ct_optim_get_momentum";
    if (!opt) {
        cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
        return NAN;
    }
    switch (opt->kind) {
    case OPT_ADAM:
    case OPT_ADAMW: return opt->beta1;
    case OPT_SGD:
    case OPT_RMSPROP: return opt->momentum;
    default: cti_error(CT_ERR_INVALID_ARG, "%s: Adagrad has no momentum", op); return NAN;
    }
}

ct_status ct_optim_set_weight_decay(ct_optimizer *opt, int64_t k, double weight_decay) {
    static const char op[] = "ct_optim_set_weight_decay";
    if (!opt) return cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
    if (k < 0 || k >= opt->n)
        return cti_error(CT_ERR_INDEX, "%s: index %lld is out of range for %lld parameters", op,
                         (long long)k, (long long)opt->n);
    if (bad_nonneg(weight_decay))
        return cti_error(CT_ERR_INVALID_ARG, "%s: invalid weight_decay %g (expected >= 0)", op,
                         weight_decay);
    opt->weight_decay[k] = weight_decay;
    return CT_OK;
}

double ct_optim_get_weight_decay(const ct_optimizer *opt, int64_t k) {
    static const char op[] = "ct_optim_get_weight_decay";
    if (!opt) {
        cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
        return NAN;
    }
    if (k < 0 || k >= opt->n) {
        cti_error(CT_ERR_INDEX, "%s: index %lld is out of range for %lld parameters", op,
                  (long long)k, (long long)opt->n);
        return NAN;
    }
    return opt->weight_decay[k];
}

/* Parameter k's state tensors besides its count. */
static int slot_states(const ct_optimizer *opt, const slot *s) {
    return 1 + opt->nbuf + (s->master ? 1 : 0);
}

int64_t ct_optim_state_count(const ct_optimizer *opt) {
    if (!opt) return 0;
    if (!opt->masters) return opt->n * (1 + opt->nbuf);
    int64_t c = 0;
    for (int64_t k = 0; k < opt->n; k++) c += slot_states(opt, &opt->slots[k]);
    return c;
}

ct_tensor *ct_optim_state_get(const ct_optimizer *opt, int64_t k, const char **name) {
    if (!opt) return cti_error_null(CT_ERR_INVALID_ARG, "ct_optim_state_get: optimizer is NULL");
    int64_t count = ct_optim_state_count(opt);
    if (k < 0 || k >= count)
        return cti_error_null(CT_ERR_INDEX,
                              "ct_optim_state_get: index %lld is out of range for %lld state "
                              "tensors",
                              (long long)k, (long long)count);
    const slot *s = opt->slots;
    if (!opt->masters) {
        s += k / (1 + opt->nbuf);
        k %= 1 + opt->nbuf;
    } else {
        while (k >= slot_states(opt, s)) k -= slot_states(opt, s++);
    }
    int j = (int)k;
    if (name) *name = s->names[j];
    return j == 0 ? s->step : j <= opt->nbuf ? s->buf[j - 1] : s->master;
}

int64_t cti_optim_count(const ct_optimizer *opt) { return opt ? opt->n : 0; }

ct_tensor *cti_optim_param(const ct_optimizer *opt, int64_t k) { return opt->slots[k].param; }

/* ---- clip_grad_norm_ ------------------------------------------------------------------------
 * Gradients on the CPU: the norms are read on the host (no wait) and the
 * coefficient applied when below 1. Gradients on one GPU: as torch's, all
 * on the device (the per-gradient norms stacked, their norm, the clamped
 * coefficient multiplied into every gradient), so the host waits only to
 * hand back total_norm. Mixed devices: the host path, one wait per
 * gradient. */

/* The device every gradient is on, when that is one GPU. */
static bool one_gpu(const ct_params *params, ct_device *dev, bool *f64) {
    bool any = false;
    *f64 = false;
    for (int64_t k = 0; k < params->n; k++) {
        ct_tensor *g = ct_grad(params->tensors[k]);
        if (!g) continue;
        ct_device d = ct_tensor_device(g);
        if (d.type == CT_DEVICE_CPU || (any && !ct_device_eq(d, *dev))) return false;
        *dev = d;
        *f64 |= g->dtype == CT_F64;
        any = true;
    }
    return any;
}

/* Inside a scope and no-grad mode. */
static ct_status clip_on_device(const ct_params *params, double max_norm, ct_device dev,
                                bool f64, double *total_norm) {
    ct_dtype acc = f64 ? CT_F64 : CT_F32;
    ct_tensor **norms = malloc((size_t)params->n * sizeof *norms);
    if (!norms) return cti_error(CT_ERR_OOM, "out of memory");
    int m = 0;
    for (int64_t k = 0; k < params->n; k++) {
        ct_tensor *g = ct_grad(params->tensors[k]);
        if (g && !(norms[m++] = ct_to_dtype(ct_norm(g, 2.0, CT_NONE, false), acc))) {
            free(norms);
            return ct_last_status();
        }
    }
    ct_tensor *total = ct_norm(ct_stack(m, norms, 0), 2.0, CT_NONE, false);
    free(norms);
    /* clamp(max_norm / (total + 1e-6), max=1): NaN stays NaN. */
    ct_tensor *coef = ct_clamp(ct_div(ct_tensor_scalar(max_norm, acc, dev),
                                      ct_add_scalar(total, 1e-6)),
                               -INFINITY, 1.0);
    if (!coef) return ct_last_status();
    for (int64_t k = 0; k < params->n; k++) {
        ct_tensor *g = ct_grad(params->tensors[k]);
        ct_status st = g ? ct_mul_(g, coef) : CT_OK;
        if (st != CT_OK) return st;
    }
    return total_norm ? ct_tensor_item(total, total_norm) : CT_OK;
}

static ct_status clip_on_host(const ct_params *params, double max_norm, double *total_norm) {
    double sumsq = 0;
    for (int64_t k = 0; k < params->n; k++) {
        ct_tensor *g = ct_grad(params->tensors[k]);
        if (!g) continue;
        ct_tensor *nk = ct_norm(g, 2.0, CT_NONE, false);
        double v = 0;
        if (!nk || ct_tensor_item(nk, &v) != CT_OK) return ct_last_status();
        sumsq += v * v;
    }
    double total = sqrt(sumsq);
    /* As torch: the coefficient clamped to 1, so a non-finite total spreads
     * to the gradients rather than being hidden. */
    double coef = max_norm / (total + 1e-6);
    for (int64_t k = 0; k < params->n && !(coef >= 1.0); k++) {
        ct_tensor *g = ct_grad(params->tensors[k]);
        ct_status st = g ? ct_mul_scalar_(g, coef) : CT_OK;
        if (st != CT_OK) return st;
    }
    if (total_norm) *total_norm = total;
    return CT_OK;
}

ct_status ct_clip_grad_norm(const ct_params *params, double max_norm, double *total_norm) {
    static const char op[] = "ct_clip_grad_norm";
    if (!params) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter list is NULL", op);
    if (!(max_norm > 0) || !isfinite(max_norm))
        return cti_error(CT_ERR_INVALID_ARG, "%s: max_norm must be finite and > 0, got %g", op,
                         max_norm);
    bool prev = ct_no_grad_begin();
    ct_scope *scope = ct_scope_begin();
    ct_device dev;
    bool f64;
    ct_status st = !scope                        ? ct_last_status()
                   : one_gpu(params, &dev, &f64) ? clip_on_device(params, max_norm, dev, f64,
                                                                  total_norm)
                                                 : clip_on_host(params, max_norm, total_norm);
    ct_scope_end(scope);
    ct_no_grad_end(prev);
    if (st != CT_OK) return cti_error(st, "%s: %s", op, ct_last_error());
    return CT_OK;
}
