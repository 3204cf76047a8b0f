/* Gradient scaling for float16 training, as torch.amp.GradScaler: the
 * scale, the growth tracker and a found_inf per optimizer are 0-d tensors
 * on the scaler's device, read and written only by kernels
 * (CT_OP_AMP_UNSCALE, CT_OP_AMP_UPDATE_SCALE, and the optimizers' updates,
 * which skip themselves on a found inf), so a scaled step never waits for
 * the device. Each optimizer goes READY -> UNSCALED -> STEPPED between
 * updates, as torch's OptState, and the same misuse is refused. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "ops/optim_impl.h"
#include "nn_impl.h"

enum { READY, UNSCALED, STEPPED };

/* An optimizer this scaler has seen (identified by its address; it holds
 * no reference) and its found_inf, kept for the next steps. */
typedef struct per_opt {
    const ct_optimizer *opt;
    int stage;
    ct_tensor *found_inf; /* 0-d float32 on the scaler's device */
} per_opt;

struct ct_grad_scaler {
    ct_device device;
    bool enabled;
    double growth_factor, backoff_factor;
    int64_t growth_interval;
    ct_tensor *scale;    /* 0-d float32 */
    ct_tensor *tracker;  /* 0-d int32: good steps since the last change */
    ct_tensor *combined; /* 0-d float32: found_inf summed over optimizers, made on need */
    int nopt, cap;
    per_opt *opts;
};

/* The scaler's tensors are its own: handles taken out of any open scope. */
static ct_tensor *owned(ct_tensor *t) {
    if (t) cti_scope_forget(t);
    return t;
}

void ct_grad_scaler_free(ct_grad_scaler *sc) {
    if (!sc) return;
    ct_tensor_release(sc->scale);
    ct_tensor_release(sc->tracker);
    ct_tensor_release(sc->combined);
    for (int i = 0; i < sc->nopt; i++) ct_tensor_release(sc->opts[i].found_inf);
    free(sc->opts);
    free(sc);
}

ct_grad_scaler *ct_grad_scaler_new(ct_device device, double init_scale, double growth_factor,
                                   double backoff_factor, int64_t growth_interval,
                                   bool enabled) {
    static const char op[] = "ct_grad_scaler_new";
    if (!(init_scale > 0) || !isfinite(init_scale))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: init_scale %g (expected finite and > 0)", op, init_scale);
    if (!(growth_factor > 1) || !isfinite(growth_factor))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: growth_factor %g (expected finite and > 1)", op,
                              growth_factor);
    if (!(backoff_factor > 0 && backoff_factor < 1))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: backoff_factor %g (expected in (0, 1))",
                              op, backoff_factor);
    if (growth_interval < 1 || growth_interval > INT32_MAX)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: growth_interval %lld (expected 1 .. 2147483647)", op,
                              (long long)growth_interval);
    ct_grad_scaler *sc = calloc(1, sizeof *sc);
    if (!sc) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    *sc = (ct_grad_scaler){.device = device,
                           .enabled = enabled,
                           .growth_factor = growth_factor,
                           .backoff_factor = backoff_factor,
                           .growth_interval = growth_interval};
    if (!enabled) return sc;
    sc->scale = owned(ct_tensor_scalar(init_scale, CT_F32, device));
    sc->tracker = sc->scale ? owned(ct_tensor_scalar(0, CT_I32, device)) : NULL;
    if (!sc->tracker) {
        cti_error(ct_last_status(), "%s: creating the state: %s", op, ct_last_error());
        ct_grad_scaler_free(sc);
        return NULL;
    }
    return sc;
}

ct_tensor *ct_grad_scaler_scale(ct_grad_scaler *sc, ct_tensor *loss) {
    static const char op[] = "ct_grad_scaler_scale";
    if (!sc) return cti_error_null(CT_ERR_INVALID_ARG, "%s: scaler is NULL", op);
    if (!loss) return cti_error_null(CT_ERR_INVALID_ARG, "%s: loss is NULL", op);
    if (!ct_dtype_is_floating(loss->dtype))
        return cti_error_null(CT_ERR_DTYPE, "%s: loss %s is not floating", op, cti_desc(loss));
    if (!sc->enabled) return ct_to_dtype(loss, loss->dtype); /* an alias */
    char d[32];
    if (!ct_device_eq(ct_tensor_device(loss), sc->device))
        return cti_error_null(CT_ERR_DEVICE, "%s: loss %s is not on the scaler's device %s",
                              op, cti_desc(loss), ct_device_str(sc->device, d, sizeof d));
    return ct_mul(loss, sc->scale);
}

/* opt's entry, made on first sight; NULL with an error. */
static per_opt *entry_of(const char *op, ct_grad_scaler *sc, const ct_optimizer *opt) {
    for (int i = 0; i < sc->nopt; i++)
        if (sc->opts[i].opt == opt) return &sc->opts[i];
    if (sc->nopt == sc->cap) {
        int cap = sc->cap ? 2 * sc->cap : 4;
        per_opt *o = realloc(sc->opts, (size_t)cap * sizeof *o);
        if (!o) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
        sc->opts = o;
        sc->cap = cap;
    }
    ct_tensor *f = owned(ct_tensor_scalar(0, CT_F32, sc->device));
    if (!f) return cti_error_null(ct_last_status(), "%s: %s", op, ct_last_error());
    sc->opts[sc->nopt] = (per_opt){opt, READY, f};
    return &sc->opts[sc->nopt++];
}

/* The gradients of opt's parameters (NULL entries where none) into g, all
 * on the scaler's device. */
static ct_status gather_grads(const char *op, const ct_grad_scaler *sc, const ct_optimizer *opt,
                              ct_tensor **g) {
    char d[32];
    for (int64_t k = 0; k < cti_optim_count(opt); k++) {
        g[k] = ct_grad(cti_optim_param(opt, k));
        if (g[k] && !ct_device_eq(ct_tensor_device(g[k]), sc->device))
            return cti_error(CT_ERR_DEVICE,
                             "%s: the gradient of parameter %lld %s is not on the scaler's "
                             "device %s",
                             op, (long long)k, cti_desc(g[k]),
                             ct_device_str(sc->device, d, sizeof d));
    }
    return CT_OK;
}

static ct_status unscale(const char *op, ct_grad_scaler *sc, per_opt *e) {
    const ct_optimizer *opt = e->opt;
    int64_t n = cti_optim_count(opt);
    ct_tensor **g = malloc((size_t)n * sizeof *g);
    if (!g) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    ct_status st = gather_grads(op, sc, opt, g);
    bool prev = ct_no_grad_begin();
    if (st == CT_OK) st = ct_zero_(e->found_inf);
    if (st == CT_OK) st = cti_amp_unscale(op, n, g, e->found_inf, sc->scale);
    ct_no_grad_end(prev);
    free(g);
    if (st != CT_OK) return st;
    e->stage = UNSCALED;
    return CT_OK;
}

/* The checks every optimizer call starts with; *e (NULL when disabled)
 * receives opt's entry. */
static ct_status begin(const char *op, ct_grad_scaler *sc, const ct_optimizer *opt,
                       per_opt **e) {
    *e = NULL;
    if (!sc) return cti_error(CT_ERR_INVALID_ARG, "%s: scaler is NULL", op);
    if (!opt) return cti_error(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
    if (!sc->enabled) return CT_OK;
    return (*e = entry_of(op, sc, opt)) ? CT_OK : ct_last_status();
}

ct_status ct_grad_scaler_unscale(ct_grad_scaler *sc, ct_optimizer *opt) {
    static const char op[] = "ct_grad_scaler_unscale";
    per_opt *e;
    ct_status st = begin(op, sc, opt, &e);
    if (st != CT_OK || !e) return st;
    if (e->stage == UNSCALED)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: already called on this optimizer since the last "
                         "ct_grad_scaler_update (expected once per step)",
                         op);
    if (e->stage == STEPPED)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: called after ct_grad_scaler_step on this optimizer (expected "
                         "before the step, once per ct_grad_scaler_update)",
                         op);
    return unscale(op, sc, e);
}

ct_status ct_grad_scaler_step(ct_grad_scaler *sc, ct_optimizer *opt) {
    static const char op[] = "ct_grad_scaler_step";
    per_opt *e;
    ct_status st = begin(op, sc, opt, &e);
    if (st != CT_OK) return st;
    if (!e) return cti_optim_step_with(op, opt, NULL);
    if (e->stage == STEPPED)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: already called on this optimizer since the last "
                         "ct_grad_scaler_update (expected once per step)",
                         op);
    if (e->stage == READY && (st = unscale(op, sc, e)) != CT_OK) return st;
    if ((st = cti_optim_step_with(op, opt, e->found_inf)) != CT_OK) return st;
    e->stage = STEPPED;
    return CT_OK;
}

ct_status ct_grad_scaler_update(ct_grad_scaler *sc) {
    static const char op[] = "ct_grad_scaler_update";
    if (!sc) return cti_error(CT_ERR_INVALID_ARG, "%s: scaler is NULL", op);
    if (!sc->enabled) return CT_OK;
    per_opt *first = NULL;
    int active = 0;
    for (int i = 0; i < sc->nopt; i++)
        if (sc->opts[i].stage != READY) {
            if (!first) first = &sc->opts[i];
            active++;
        }
    if (!first)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: no inf checks were recorded since the last update (expected "
                         "ct_grad_scaler_unscale or ct_grad_scaler_step first)",
                         op);
    ct_tensor *found = first->found_inf;
    ct_status st = CT_OK;
    bool prev = ct_no_grad_begin();
    if (active > 1) { /* torch sums the optimizers' found_inf */
        if (!sc->combined && !(sc->combined = owned(ct_tensor_scalar(0, CT_F32, sc->device))))
            st = ct_last_status();
        if (st == CT_OK) st = ct_copy_(sc->combined, found);
        for (int i = 0; i < sc->nopt && st == CT_OK; i++)
            if (sc->opts[i].stage != READY && &sc->opts[i] != first)
                st = ct_add_(sc->combined, sc->opts[i].found_inf);
        found = sc->combined;
    }
    cti_amp_update_params p = {sc->growth_factor, sc->backoff_factor, sc->growth_interval};
    if (st == CT_OK) st = cti_amp_update_scale(op, sc->scale, sc->tracker, found, &p);
    ct_no_grad_end(prev);
    if (st != CT_OK) return cti_error(st, "%s: %s", op, ct_last_error());
    for (int i = 0; i < sc->nopt; i++) sc->opts[i].stage = READY;
    return CT_OK;
}

double ct_grad_scaler_get_scale(const ct_grad_scaler *sc) {
    if (!sc) {
        cti_error(CT_ERR_INVALID_ARG, "ct_grad_scaler_get_scale: scaler is NULL");
        return NAN;
    }
    if (!sc->enabled) return 1.0;
    double v;
    return ct_tensor_item(sc->scale, &v) == CT_OK ? v : NAN;
}

ct_status ct_grad_scaler_get_state(const ct_grad_scaler *sc, ct_grad_scaler_state *state) {
    static const char op[] = "ct_grad_scaler_get_state";
    if (!sc) return cti_error(CT_ERR_INVALID_ARG, "%s: scaler is NULL", op);
    if (!state) return cti_error(CT_ERR_INVALID_ARG, "%s: state is NULL", op);
    if (!sc->enabled)
        return cti_error(CT_ERR_INVALID_ARG, "%s: the scaler is disabled and has no state", op);
    double scale, tracker;
    ct_status st = ct_tensor_item(sc->scale, &scale);
    if (st == CT_OK) st = ct_tensor_item(sc->tracker, &tracker);
    if (st != CT_OK) return cti_error(st, "%s: %s", op, ct_last_error());
    *state = (ct_grad_scaler_state){scale, (int64_t)tracker};
    return CT_OK;
}

ct_status ct_grad_scaler_set_state(ct_grad_scaler *sc, const ct_grad_scaler_state *state) {
    static const char op[] = "ct_grad_scaler_set_state";
    if (!sc) return cti_error(CT_ERR_INVALID_ARG, "%s: scaler is NULL", op);
    if (!state) return cti_error(CT_ERR_INVALID_ARG, "%s: state is NULL", op);
    if (!sc->enabled) return CT_OK;
    if (!(state->scale > 0) || !isfinite(state->scale) || !isfinite((float)state->scale))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: scale %g (expected finite in float32 and > 0)", op, state->scale);
    if (state->growth_tracker < 0 || state->growth_tracker >= sc->growth_interval)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: growth_tracker %lld (expected 0 .. growth_interval - 1 = %lld)",
                         op, (long long)state->growth_tracker,
                         (long long)(sc->growth_interval - 1));
    ct_status st = ct_fill_(sc->scale, state->scale);
    if (st == CT_OK) st = ct_fill_(sc->tracker, (double)state->growth_tracker);
    if (st != CT_OK) return cti_error(st, "%s: %s", op, ct_last_error());
    return CT_OK;
}
