/* Learning-rate schedules of torch.optim.lr_scheduler beyond StepLR and the
 * cosine warmup: LinearLR and OneCycleLR as pure functions of the step
 * (their closed forms), ReduceLROnPlateau as an object that watches a
 * metric and lowers an optimizer's learning rate. */
#include <math.h>
#include <stdlib.h>

#include "nn_impl.h"

static double nan_error(const char *op, const char *what, double v) {
    cti_error(CT_ERR_INVALID_ARG, "%s: %s, got %g", op, what, v);
    return NAN;
}

double ct_lr_linear(double base_lr, double start_factor, double end_factor, int64_t total_iters,
                    int64_t step) {
    static const char op[] = "ct_lr_linear";
    if (!(start_factor > 0 && start_factor <= 1))
        return nan_error(op, "expected start_factor in (0, 1]", start_factor);
    if (!(end_factor >= 0 && end_factor <= 1))
        return nan_error(op, "expected end_factor in [0, 1]", end_factor);
    if (total_iters < 1 || step < 0) {
        cti_error(CT_ERR_INVALID_ARG,
                  "%s: expected total_iters >= 1 and step >= 0, got total_iters %lld, step %lld",
                  op, (long long)total_iters, (long long)step);
        return NAN;
    }
    int64_t s = step < total_iters ? step : total_iters;
    return base_lr *
           (start_factor + (end_factor - start_factor) * (double)s / (double)total_iters);
}

/* OneCycleLR's anneal from start to end at pct of a phase. */
static double anneal(bool cos_anneal, double start, double end, double pct) {
    if (cos_anneal) return end + (start - end) / 2.0 * (cos(M_PI * pct) + 1);
    return (end - start) * pct + start;
}

/* The phase of torch's OneCycleLR table that step falls in and how far into
 * it (pct); each phase ends at its end_step (inclusive). CT_OK, or an error
 * naming op. */
static ct_status one_cycle_phase(const char *op, int64_t total_steps, double pct_start,
                                 bool three_phase, int64_t step, int *phase, double *pct) {
    if (total_steps < 1 || step < 0 || step > total_steps)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: expected total_steps >= 1 and 0 <= step <= total_steps, got "
                         "total_steps %lld, step %lld",
                         op, (long long)total_steps, (long long)step);
    if (!(pct_start >= 0 && pct_start <= 1))
        return cti_error(CT_ERR_INVALID_ARG, "%s: expected pct_start in [0, 1], got %g", op,
                         pct_start);
    double t = (double)total_steps, end[3] = {pct_start * t - 1, t - 1, 0};
    int nph = 2;
    if (three_phase) nph = 3, end[1] = 2 * pct_start * t - 2, end[2] = t - 1;
    double s = (double)step, begin = 0;
    for (int i = 0; i < nph; i++) {
        if (s <= end[i] || i == nph - 1) {
            if (end[i] == begin)
                return cti_error(CT_ERR_INVALID_ARG,
                                 "%s: phase %d of the cycle has no length (pct_start %g with "
                                 "total_steps %lld); choose a larger pct_start or total_steps",
                                 op, i, pct_start, (long long)total_steps);
            *phase = i;
            *pct = (s - begin) / (end[i] - begin);
            return CT_OK;
        }
        begin = end[i];
    }
    return cti_error(CT_ERR_INVALID_ARG, "%s: no phase", op); /* not reached */
}

/* The one-cycle value in phase ph at pct of it: a to b, then b to c (three_phase: a to b,
 * b back to a, a to c), the rate's cycle and the momentum's alike. */
static double cycle_value(bool anneal_cos, bool three_phase, int ph, double pct, double a,
                          double b, double c) {
    const double from3[3] = {a, b, a}, to3[3] = {b, a, c};
    const double from2[2] = {a, b}, to2[2] = {b, c};
    return three_phase ? anneal(anneal_cos, from3[ph], to3[ph], pct)
                       : anneal(anneal_cos, from2[ph], to2[ph], pct);
}

double ct_lr_one_cycle(double max_lr, int64_t total_steps, double pct_start, bool anneal_cos,
                       double div_factor, double final_div_factor, bool three_phase,
                       int64_t step) {
    static const char op[] = "ct_lr_one_cycle";
    if (!(div_factor > 0) || !isfinite(div_factor))
        return nan_error(op, "expected a finite div_factor > 0", div_factor);
    if (!(final_div_factor > 0) || !isfinite(final_div_factor))
        return nan_error(op, "expected a finite final_div_factor > 0", final_div_factor);
    int ph = 0;
    double pct = 0;
    if (one_cycle_phase(op, total_steps, pct_start, three_phase, step, &ph, &pct) != CT_OK)
        return NAN;
    double initial = max_lr / div_factor, min_lr = initial / final_div_factor;
    /* torch's phases: up to max_lr, then down to min_lr (three_phase: back
     * to the initial rate first) */
    return cycle_value(anneal_cos, three_phase, ph, pct, initial, max_lr, min_lr);
}

double ct_momentum_one_cycle(double base_momentum, double max_momentum, int64_t total_steps,
                             double pct_start, bool anneal_cos, bool three_phase, int64_t step) {
    static const char op[] = "ct_momentum_one_cycle";
    if (!isfinite(base_momentum))
        return nan_error(op, "expected a finite base_momentum", base_momentum);
    if (!isfinite(max_momentum))
        return nan_error(op, "expected a finite max_momentum", max_momentum);
    int ph = 0;
    double pct = 0;
    if (one_cycle_phase(op, total_steps, pct_start, three_phase, step, &ph, &pct) != CT_OK)
        return NAN;
    /* the rate's phases mirrored: down to base while the rate rises, back up
     * while it falls (three_phase: held at max in the last phase) */
    return cycle_value(anneal_cos, three_phase, ph, pct, max_momentum, base_momentum,
                       max_momentum);
}

/* ---- ReduceLROnPlateau ---------------------------------------------------------------------- */
struct ct_lr_plateau {
    ct_optimizer *opt; /* borrowed */
    bool mode_max, threshold_abs;
    double factor, threshold, min_lr, eps;
    int64_t patience, cooldown;
    ct_lr_plateau_state st;
};

ct_lr_plateau *ct_lr_plateau_new(ct_optimizer *opt, bool mode_max, double factor,
                                 int64_t patience, double threshold, bool threshold_abs,
                                 int64_t cooldown, double min_lr, double eps) {
    static const char op[] = "ct_lr_plateau_new";
    if (!opt) return cti_error_null(CT_ERR_INVALID_ARG, "%s: optimizer is NULL", op);
    if (!(factor < 1.0) || !(factor >= 0))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: factor should be in [0, 1), got %g", op,
                              factor);
    if (patience < 0 || cooldown < 0)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: expected patience >= 0 and cooldown >= 0, got %lld and %lld",
                              op, (long long)patience, (long long)cooldown);
    if (!(threshold >= 0) || !isfinite(threshold) || !(min_lr >= 0) || !isfinite(min_lr) ||
        !(eps >= 0) || !isfinite(eps))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: expected finite threshold, min_lr and eps >= 0, got %g, %g "
                              "and %g",
                              op, threshold, min_lr, eps);
    ct_lr_plateau *s = calloc(1, sizeof *s);
    if (!s) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    *s = (ct_lr_plateau){.opt = opt,
                         .mode_max = mode_max,
                         .threshold_abs = threshold_abs,
                         .factor = factor,
                         .threshold = threshold,
                         .min_lr = min_lr,
                         .eps = eps,
                         .patience = patience,
                         .cooldown = cooldown,
                         .st = {.best = mode_max ? -INFINITY : INFINITY}};
    return s;
}

void ct_lr_plateau_free(ct_lr_plateau *s) { free(s); }

/* torch's is_better: a NaN metric is never better. */
static bool is_better(const ct_lr_plateau *s, double a) {
    double best = s->st.best;
    if (!s->mode_max)
        return s->threshold_abs ? a < best - s->threshold : a < best * (1 - s->threshold);
    return s->threshold_abs ? a > best + s->threshold : a > best * (s->threshold + 1);
}

ct_status ct_lr_plateau_step(ct_lr_plateau *s, double metric) {
    static const char op[] = "ct_lr_plateau_step";
    if (!s) return cti_error(CT_ERR_INVALID_ARG, "%s: scheduler is NULL", op);
    ct_lr_plateau_state n = s->st;
    n.last_epoch++;
    if (is_better(s, metric)) {
        n.best = metric;
        n.num_bad_epochs = 0;
    } else {
        n.num_bad_epochs++;
    }
    if (n.cooldown_counter > 0) {
        n.cooldown_counter--;
        n.num_bad_epochs = 0; /* bad epochs in cooldown are ignored */
    }
    if (n.num_bad_epochs > s->patience) {
        double old = ct_optim_get_lr(s->opt), lr = fmax(old * s->factor, s->min_lr);
        if (old - lr > s->eps) {
            ct_status st = ct_optim_set_lr(s->opt, lr);
            if (st != CT_OK) return cti_error(st, "%s: %s", op, ct_last_error());
        }
        n.cooldown_counter = s->cooldown;
        n.num_bad_epochs = 0;
    }
    s->st = n;
    return CT_OK;
}

ct_status ct_lr_plateau_get_state(const ct_lr_plateau *s, ct_lr_plateau_state *state) {
    if (!s || !state)
        return cti_error(CT_ERR_INVALID_ARG, "ct_lr_plateau_get_state: %s is NULL",
                         s ? "state" : "scheduler");
    *state = s->st;
    return CT_OK;
}

ct_status ct_lr_plateau_set_state(ct_lr_plateau *s, const ct_lr_plateau_state *state) {
    static const char op[] = "ct_lr_plateau_set_state";
    if (!s || !state)
        return cti_error(CT_ERR_INVALID_ARG, "%s: %s is NULL", op, s ? "state" : "scheduler");
    if (state->num_bad_epochs < 0 || state->cooldown_counter < 0 || state->last_epoch < 0 ||
        isnan(state->best))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: expected counters >= 0 and a best metric that is not NaN, got "
                         "num_bad_epochs %lld, cooldown_counter %lld, last_epoch %lld, best %g",
                         op, (long long)state->num_bad_epochs,
                         (long long)state->cooldown_counter, (long long)state->last_epoch,
                         state->best);
    s->st = *state;
    return CT_OK;
}
