/* Learning-rate schedules as pure functions of the step. */
#include <math.h>

#include "nn_impl.h"

double ct_lr_step(double base_lr, int64_t step_size, double gamma, int64_t step) {
    if (step_size < 1 || step < 0) {
        cti_error(CT_ERR_INVALID_ARG, "ct_lr_step: expected step_size >= 1 and step >= 0, got "
                  "step_size %lld, step %lld", (long long)step_size, (long long)step);
        return NAN;
    }
    return base_lr * pow(gamma, (double)(step / step_size));
}

double ct_lr_cosine_warmup(double base_lr, int64_t warmup_steps, int64_t total_steps,
                           double min_lr, int64_t step) {
    if (total_steps < 1 || warmup_steps < 0 || warmup_steps > total_steps || step < 0) {
        cti_error(CT_ERR_INVALID_ARG,
                  "ct_lr_cosine_warmup: expected 0 <= warmup_steps <= total_steps, total_steps "
                  ">= 1 and step >= 0, got warmup_steps %lld, total_steps %lld, step %lld",
                  (long long)warmup_steps, (long long)total_steps, (long long)step);
        return NAN;
    }
    if (step < warmup_steps) return base_lr * (double)step / (double)warmup_steps;
    if (step >= total_steps) return min_lr;
    double p = (double)(step - warmup_steps) / (double)(total_steps - warmup_steps);
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}
