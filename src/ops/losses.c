/* The losses of torch.nn.functional beyond cross_entropy, nll_loss and
 * mse_loss, each composed from public ops with PyTorch's numerically stable
 * formula: they run on every device and dtype those ops do, and autograd
 * differentiates them through the ops' own formulas. Each front end checks
 * its arguments, builds the pointwise loss inside a scope of temporaries and
 * hands back only the result, so a failure leaks nothing and changes no
 * argument. */
#include <math.h>

#include "ops_impl.h"
#include "tensor/autograd.h"
#include "tensor/core.h"

/* ---- shared checks -------------------------------------------------------------------------- */
static ct_status check_reduction(const char *op, ct_reduction r, bool batchmean) {
    if (r == CT_REDUCTION_NONE || r == CT_REDUCTION_MEAN || r == CT_REDUCTION_SUM ||
        (batchmean && r == CT_REDUCTION_BATCHMEAN))
        return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG, "%s: unknown reduction %d (expected none, mean%s or sum)",
                     op, (int)r, batchmean ? ", batchmean" : "");
}

/* n arguments (NULL allowed from index required on) on one device, the
 * first required ones present, every one present floating. */
static ct_status check_args(const char *op, int required, int n, ct_tensor *const *ts,
                            const char *const *names) {
    ct_status st = cti_check_not_null(op, required, ts);
    if (st != CT_OK || (st = cti_check_same_device(op, n, ts)) != CT_OK) return st;
    for (int k = 0; k < n; k++)
        if (ts[k] && (st = cti_check_floating(op, ts[k], names[k])) != CT_OK) return st;
    return CT_OK;
}

static ct_status check_same_shape(const char *op, const ct_tensor *a, const char *an,
                                  const ct_tensor *b, const char *bn) {
    if (a->ndim == b->ndim &&
        memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0)
        return CT_OK;
    char sa[128];
    snprintf(sa, sizeof sa, "%s", cti_shape_s(a->ndim, a->shape));
    return cti_error(CT_ERR_SHAPE, "%s: %s size %s must be the same as %s size %s", op, bn,
                     cti_shape_s(b->ndim, b->shape), an, sa);
}

static ct_status check_broadcast(const char *op, int n, ct_tensor *const *ts) {
    int nd = ts[0]->ndim;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, ts[0]->shape, sizeof(int64_t) * (size_t)nd);
    for (int k = 1; k < n; k++) {
        if (!ts[k]) continue;
        int64_t out[CT_MAX_DIMS];
        int no;
        ct_status st = cti_broadcast_shapes(op, nd, shape, ts[k]->ndim, ts[k]->shape, &no, out);
        if (st != CT_OK) return st;
        nd = no;
        memcpy(shape, out, sizeof(int64_t) * (size_t)nd);
    }
    return CT_OK;
}

/* The reduction of a pointwise loss (batchmean: the sum over the first
 * dim's size, as kl_div). */
static ct_tensor *reduce(ct_tensor *loss, ct_reduction r, int64_t batch) {
    switch ((int)r) {
    case CT_REDUCTION_MEAN: return ct_mean(loss, CT_NONE, false);
    case CT_REDUCTION_SUM: return ct_sum(loss, CT_NONE, false);
    case CT_REDUCTION_BATCHMEAN: return ct_div_scalar(ct_sum(loss, CT_NONE, false), (double)batch);
    default: return loss;
    }
}

/* Ends scope s keeping r, a handle made in it (NULL: the error of the
 * failed op, named by op). */
static ct_tensor *finish(const char *op, ct_scope *s, ct_tensor *r) {
    if (r) ct_keep(r);
    else cti_error(ct_last_status(), "%s: %s", op, ct_last_error());
    ct_scope_end(s);
    return r;
}

/* softplus(-x) = -logsigmoid(x) = log1p(exp(-|x|)) + max(-x, 0): below -40
 * the softplus kernel's linear branch gives -x, where log1p(exp(-40)) is
 * under float64's rounding of it, and the derivative is -sigmoid(-x). */
static ct_tensor *neg_logsigmoid(ct_tensor *x) { return ct_softplus(ct_neg(x), 1.0, 40.0); }

/* ---- binary cross-entropy ------------------------------------------------------------------- */
ct_tensor *ct_binary_cross_entropy(ct_tensor *input, ct_tensor *target, ct_tensor *weight,
                                   ct_reduction reduction) {
    static const char op[] = "ct_binary_cross_entropy";
    static const char *const names[] = {"input", "target", "weight"};
    ct_tensor *ts[3] = {input, target, weight};
    if (check_args(op, 2, 3, ts, names) || check_reduction(op, reduction, false) ||
        check_same_shape(op, input, "input", target, "target") || check_broadcast(op, 3, ts))
        return NULL;
    ct_scope *s = ct_scope_begin();
    if (!s) return NULL;
    /* -(t log x + (1 - t) log(1 - x)), each log clamped to >= -100 as PyTorch */
    ct_tensor *lx = ct_clamp(ct_log(input), -100.0, INFINITY);
    ct_tensor *l1x = ct_clamp(ct_log(ct_rsub_scalar(input, 1.0)), -100.0, INFINITY);
    ct_tensor *l = ct_neg(ct_add(ct_mul(target, lx), ct_mul(ct_rsub_scalar(target, 1.0), l1x)));
    if (weight) l = ct_mul(l, weight);
    return finish(op, s, l ? reduce(l, reduction, 0) : NULL);
}

ct_tensor *ct_binary_cross_entropy_with_logits(ct_tensor *input, ct_tensor *target,
                                               ct_tensor *weight, ct_tensor *pos_weight,
                                               ct_reduction reduction) {
    static const char op[] = "ct_binary_cross_entropy_with_logits";
    static const char *const names[] = {"input", "target", "weight", "pos_weight"};
    ct_tensor *ts[4] = {input, target, weight, pos_weight};
    if (check_args(op, 2, 4, ts, names) || check_reduction(op, reduction, false) ||
        check_same_shape(op, input, "input", target, "target") || check_broadcast(op, 4, ts))
        return NULL;
    ct_scope *s = ct_scope_begin();
    if (!s) return NULL;
    /* (1 - t) x + lw softplus(-x), lw = 1 + (pos_weight - 1) t */
    ct_tensor *sp = neg_logsigmoid(input);
    if (pos_weight) sp = ct_mul(ct_add_scalar(ct_mul(ct_sub_scalar(pos_weight, 1.0), target), 1.0), sp);
    ct_tensor *l = ct_add(ct_mul(ct_rsub_scalar(target, 1.0), input), sp);
    if (weight) l = ct_mul(l, weight);
    return finish(op, s, l ? reduce(l, reduction, 0) : NULL);
}

/* ---- regression losses ---------------------------------------------------------------------- */
/* input - target after the checks the three share; NULL on error. */
static ct_tensor *diff_of(const char *op, ct_tensor *input, ct_tensor *target,
                          ct_reduction reduction) {
    static const char *const names[] = {"input", "target"};
    ct_tensor *ts[2] = {input, target};
    if (check_args(op, 2, 2, ts, names) || check_reduction(op, reduction, false) ||
        check_broadcast(op, 2, ts))
        return NULL;
    return ct_sub(input, target);
}

static ct_tensor *l1_of(const char *op, ct_tensor *input, ct_tensor *target,
                        ct_reduction reduction) {
    ct_scope *s = ct_scope_begin();
    if (!s) return NULL;
    ct_tensor *d = diff_of(op, input, target, reduction);
    if (!d) {
        ct_scope_end(s);
        return NULL;
    }
    ct_tensor *l = ct_abs(d);
    return finish(op, s, l ? reduce(l, reduction, 0) : NULL);
}

ct_tensor *ct_l1_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction) {
    return l1_of("ct_l1_loss", input, target, reduction);
}

/* where(z < beta, 0.5 z^2 * quad, z - lin), z = |input - target|. */
static ct_tensor *piecewise(const char *op, ct_tensor *input, ct_tensor *target,
                            ct_reduction reduction, double beta, double quad, double lin_scale,
                            double lin) {
    ct_scope *s = ct_scope_begin();
    if (!s) return NULL;
    ct_tensor *d = diff_of(op, input, target, reduction);
    if (!d) {
        ct_scope_end(s);
        return NULL;
    }
    ct_tensor *l = NULL;
    {
        ct_tensor *z = ct_abs(d);
        ct_tensor *q = ct_mul_scalar(ct_mul(d, d), 0.5 * quad);
        ct_tensor *li = ct_sub_scalar(ct_mul_scalar(z, lin_scale), lin);
        l = ct_where(ct_lt_scalar(z, beta), q, li);
    }
    return finish(op, s, l ? reduce(l, reduction, 0) : NULL);
}

ct_tensor *ct_smooth_l1_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction,
                             double beta) {
    static const char op[] = "ct_smooth_l1_loss";
    if (!(beta >= 0))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: smooth_l1_loss does not support negative values for beta, got "
                              "%g",
                              op, beta);
    if (beta == 0) /* PyTorch's l1_loss; 0.5 z^2 / beta would divide by zero */
        return l1_of(op, input, target, reduction);
    return piecewise(op, input, target, reduction, beta, 1.0 / beta, 1.0, 0.5 * beta);
}

ct_tensor *ct_huber_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction,
                         double delta) {
    static const char op[] = "ct_huber_loss";
    if (!(delta > 0))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: huber_loss does not support non-positive values for delta, "
                              "got %g",
                              op, delta);
    return piecewise(op, input, target, reduction, delta, 1.0, delta, 0.5 * delta * delta);
}

/* ---- kl_div --------------------------------------------------------------------------------- */
ct_tensor *ct_kl_div(ct_tensor *input, ct_tensor *target, ct_reduction reduction,
                     bool log_target) {
    static const char op[] = "ct_kl_div";
    static const char *const names[] = {"input", "target"};
    ct_tensor *ts[2] = {input, target};
    if (check_args(op, 2, 2, ts, names) || check_reduction(op, reduction, true) ||
        check_broadcast(op, 2, ts))
        return NULL;
    ct_scope *s = ct_scope_begin();
    if (!s) return NULL;
    ct_tensor *l;
    if (log_target) {
        l = ct_mul(ct_exp(target), ct_sub(target, input));
    } else {
        /* xlogy(t, t) - t * input: t log t is 0 where t is 0 (log read at 1
         * there, so the derivative stays finite), NaN for t < 0 as PyTorch. */
        ct_tensor *safe = ct_where(ct_eq_scalar(target, 0.0), ct_tensor_full_like(target, 1.0),
                                   target);
        l = ct_sub(ct_mul(target, ct_log(safe)), ct_mul(target, input));
    }
    int64_t batch = input->ndim > 0 ? input->shape[0] : 1;
    return finish(op, s, l ? reduce(l, reduction, batch) : NULL);
}

/* ---- cosine similarity and the losses on it ------------------------------------------------- */
ct_tensor *ct_cosine_similarity(ct_tensor *x1, ct_tensor *x2, int dim, double eps) {
    static const char op[] = "ct_cosine_similarity";
    static const char *const names[] = {"x1", "x2"};
    ct_tensor *ts[2] = {x1, x2};
    if (check_args(op, 2, 2, ts, names)) return NULL;
    int nd;
    int64_t bs[CT_MAX_DIMS];
    if (cti_broadcast_shapes(op, x1->ndim, x1->shape, x2->ndim, x2->shape, &nd, bs) != CT_OK)
        return NULL;
    if (nd < 1)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected inputs of at least 1 dim, got %s", op,
                              cti_desc(x1));
    int d = cti_wrap_dim(op, dim, nd);
    if (d < 0) return NULL;
    if (!(eps >= 0))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: eps must be >= 0, got %g", op, eps);
    ct_scope *s = ct_scope_begin();
    if (!s) return NULL;
    int64_t dd = d;
    /* As PyTorch: each input over its own norm, the norms clamped to eps
     * in value only (the clamp is made without grad there), then the sum
     * of the products. */
    ct_tensor *a = ct_expand(x1, nd, bs), *b = ct_expand(x2, nd, bs), *q[2] = {NULL, NULL};
    ct_tensor *src[2] = {a, b};
    for (int k = 0; k < 2 && src[k]; k++) {
        ct_tensor *n = ct_norm(src[k], 2.0, 1, &dd, true);
        bool prev = ct_no_grad_begin();
        ct_tensor *lift = n ? ct_sub(ct_clamp(n, eps, INFINITY), n) : NULL;
        ct_no_grad_end(prev);
        q[k] = lift ? ct_div(src[k], ct_add(n, lift)) : NULL;
    }
    ct_tensor *r = q[0] && q[1] ? ct_sum(ct_mul(q[0], q[1]), 1, &dd, false) : NULL;
    return finish(op, s, r);
}

ct_tensor *ct_cosine_embedding_loss(ct_tensor *input1, ct_tensor *input2, ct_tensor *target,
                                    double margin, ct_reduction reduction) {
    static const char op[] = "ct_cosine_embedding_loss";
    static const char *const names[] = {"input1", "input2"};
    ct_tensor *ts[3] = {input1, input2, target};
    if (cti_check_not_null(op, 3, ts) || cti_check_same_device(op, 3, ts) ||
        check_args(op, 2, 2, ts, names) || check_reduction(op, reduction, false))
        return NULL;
    if (input1->ndim < 1 || input1->ndim > 2 ||
        check_same_shape(op, input1, "input1", input2, "input2"))
        return input1->ndim < 1 || input1->ndim > 2
                   ? cti_error_null(CT_ERR_SHAPE,
                                    "%s: expected 1-d or 2-d inputs, got input1 %s", op,
                                    cti_desc(input1))
                   : NULL;
    if (target->ndim != input1->ndim - 1 ||
        (target->ndim == 1 && target->shape[0] != input1->shape[0]))
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: expected a %s target of %lld entries for inputs %s, got %s",
                              op, input1->ndim == 1 ? "0-d" : "1-d",
                              (long long)(input1->ndim == 2 ? input1->shape[0] : 1),
                              cti_desc(input1), cti_desc(target));
    ct_scope *s = ct_scope_begin();
    if (!s) return NULL;
    int64_t last = input1->ndim - 1;
    /* PyTorch's: cos = sum(x1 x2) / sqrt((|x1|^2 + 1e-12)(|x2|^2 + 1e-12)) */
    ct_tensor *prod = ct_sum(ct_mul(input1, input2), 1, &last, false);
    ct_tensor *m1 = ct_add_scalar(ct_sum(ct_mul(input1, input1), 1, &last, false), 1e-12);
    ct_tensor *m2 = ct_add_scalar(ct_sum(ct_mul(input2, input2), 1, &last, false), 1e-12);
    ct_tensor *cosv = ct_div(prod, ct_sqrt(ct_mul(m1, m2)));
    ct_tensor *l = NULL;
    if (cosv) {
        ct_tensor *zeros = ct_tensor_zeros_like(cosv);
        ct_tensor *pos = ct_where(ct_eq_scalar(target, 1.0), ct_rsub_scalar(cosv, 1.0), zeros);
        ct_tensor *neg = ct_where(ct_eq_scalar(target, -1.0),
                                  ct_clamp(ct_sub_scalar(cosv, margin), 0.0, INFINITY), zeros);
        l = ct_add(pos, neg);
    }
    return finish(op, s, l ? reduce(l, reduction, 0) : NULL);
}

ct_tensor *ct_margin_ranking_loss(ct_tensor *input1, ct_tensor *input2, ct_tensor *target,
                                  double margin, ct_reduction reduction) {
    static const char op[] = "ct_margin_ranking_loss";
    static const char *const names[] = {"input1", "input2", "target"};
    ct_tensor *ts[3] = {input1, input2, target};
    if (check_args(op, 3, 3, ts, names) || check_reduction(op, reduction, false) ||
        check_broadcast(op, 3, ts))
        return NULL;
    ct_scope *s = ct_scope_begin();
    if (!s) return NULL;
    /* max(0, -target (input1 - input2) + margin) */
    ct_tensor *l = ct_clamp(ct_add_scalar(ct_neg(ct_mul(target, ct_sub(input1, input2))), margin),
                            0.0, INFINITY);
    return finish(op, s, l ? reduce(l, reduction, 0) : NULL);
}

/* ---- cross-entropy with class probabilities ------------------------------------------------- */
ct_tensor *ct_cross_entropy_prob(ct_tensor *logits, ct_tensor *target, ct_tensor *weight,
                                 ct_reduction reduction, double label_smoothing) {
    static const char op[] = "ct_cross_entropy_prob";
    static const char *const names[] = {"logits", "target", "weight"};
    ct_tensor *ts[3] = {logits, target, weight};
    if (check_args(op, 2, 3, ts, names) || check_reduction(op, reduction, false)) return NULL;
    if (logits->ndim < 1)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected logits of at least 1 dim, got %s", op,
                              cti_desc(logits));
    if (check_same_shape(op, logits, "logits", target, "target")) return NULL;
    if (!(label_smoothing >= 0 && label_smoothing <= 1))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: label_smoothing must be between 0.0 and 1.0, got %g", op,
                              label_smoothing);
    int64_t cdim = logits->ndim == 1 ? 0 : 1, c = logits->shape[cdim];
    if (weight && (weight->ndim != 1 || weight->shape[0] != c))
        return cti_error_null(CT_ERR_SHAPE, "%s: expected a weight of [%lld] for %s, got %s", op,
                              (long long)c, cti_desc(logits), cti_desc(weight));
    ct_scope *s = ct_scope_begin();
    if (!s) return NULL;
    ct_tensor *lsm = ct_log_softmax(logits, (int)cdim), *t = target;
    if (label_smoothing > 0)
        t = ct_add_scalar(ct_mul_scalar(target, 1 - label_smoothing), label_smoothing / (double)c);
    if (weight && lsm) {
        /* weight along the class dim: [C] viewed as [C, 1, ...] */
        int64_t shape[CT_MAX_DIMS];
        int nd = logits->ndim - (int)cdim;
        shape[0] = c;
        for (int k = 1; k < nd; k++) shape[k] = 1;
        lsm = ct_mul(lsm, ct_reshape(weight, nd, shape));
    }
    ct_tensor *l = lsm && t ? ct_neg(ct_sum(ct_mul(lsm, t), 1, &cdim, false)) : NULL;
    ct_tensor *r = NULL;
    if (l && reduction == CT_REDUCTION_MEAN) /* over the positions, not the weights */
        r = ct_div_scalar(ct_sum(l, CT_NONE, false),
                          (double)(c > 0 ? cti_numel(logits->ndim, logits->shape) / c : 0));
    else if (l)
        r = reduce(l, reduction, 0);
    return finish(op, s, r);
}
