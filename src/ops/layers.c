/* Front ends of the composite layer and linear-algebra ops: dot, outer,
 * baddbmm, batch/group/instance norm, conv1d, conv_transpose2d and the 1-d
 * pooling ops. Each is built from public ops, so it runs on every device
 * those run on and autograd records the pieces (conv_transpose2d records
 * one node of its own: its forward is conv2d's backward-data op, which
 * records nothing). einsum's planner is in einsum.c.
 *
 * Temporaries are gathered in a bag and released together; a failure of an
 * inner op is reported under the public op's name. */
#include <stdio.h>
#include <string.h>

#include "ops_impl.h"

/* ---- temporaries ---------------------------------------------------------------------- */

enum { BAG_MAX = 32 };
typedef struct bag {
    ct_tensor *t[BAG_MAX];
    int n;
    bool failed;
} bag;

/* Keeps t for release by bag_free; NULL (a failed op) marks the bag failed. */
static ct_tensor *keep(bag *b, ct_tensor *t) {
    if (!t || b->n == BAG_MAX) {
        b->failed = true;
        if (t) ct_tensor_release(t);
        return NULL;
    }
    b->t[b->n++] = t;
    return t;
}

static void bag_free(bag *b) {
    for (int i = 0; i < b->n; i++) ct_tensor_release(b->t[i]);
    b->n = 0;
}

/* Re-reports the last error under op's name (an inner op failed). */
static void *fail_as(const char *op) {
    const char *msg = ct_last_error();
    if (strncmp(msg, op, strlen(op)) == 0 && msg[strlen(op)] == ':')
        return NULL; /* already ours */
    cti_error_wrap(CT_ERR_RUNTIME, op);
    return NULL;
}

/* Releases the bag and returns result, or NULL with op's error when result
 * is NULL or anything in the bag failed. */
static ct_tensor *finish(const char *op, bag *b, ct_tensor *result) {
    bool failed = b->failed || !result;
    if (failed && result) ct_tensor_release(result);
    if (failed) fail_as(op);
    bag_free(b);
    return failed ? NULL : result;
}

static bool is_float(ct_dtype d) {
    return d == CT_F32 || d == CT_F64 || d == CT_F16 || d == CT_BF16;
}

static ct_status check_float(const char *op, const char *name, const ct_tensor *t) {
    if (is_float(t->dtype)) return CT_OK;
    return cti_error(CT_ERR_DTYPE,
                     "%s: expected a float16, bfloat16, float32 or float64 %s, got %s", op, name,
                     cti_desc(t));
}

/* ---- dot, outer, baddbmm ------------------------------------------------------------- */

ct_tensor *ct_dot(ct_tensor *a, ct_tensor *b) {
    static const char op[] = "ct_dot";
    ct_tensor *ts[2] = {a, b};
    if (cti_check_not_null(op, 2, ts) != CT_OK || cti_check_same_device(op, 2, ts) != CT_OK)
        return NULL;
    if (a->ndim != 1 || b->ndim != 1)
        return cti_error_null(CT_ERR_SHAPE, "%s: 1D tensors expected, but got %s and %s", op,
                              cti_desc(a), cti_desc(b));
    if (a->shape[0] != b->shape[0])
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: inconsistent tensor size, expected tensors %s and %s to have "
                              "the same number of elements",
                              op, cti_desc(a), cti_desc(b));
    if (a->dtype != b->dtype)
        return cti_error_null(CT_ERR_DTYPE,
                              "%s: expected both vectors to have the same dtype, got %s and %s",
                              op, ct_dtype_name(a->dtype), ct_dtype_name(b->dtype));
    ct_tensor *r = ct_matmul(a, b);
    return r ? r : fail_as(op);
}

ct_tensor *ct_outer(ct_tensor *a, ct_tensor *b) {
    static const char op[] = "ct_outer";
    ct_tensor *ts[2] = {a, b};
    if (cti_check_not_null(op, 2, ts) != CT_OK || cti_check_same_device(op, 2, ts) != CT_OK)
        return NULL;
    if (a->ndim != 1 || b->ndim != 1)
        return cti_error_null(CT_ERR_SHAPE, "%s: 1D tensors expected, but got %s and %s", op,
                              cti_desc(a), cti_desc(b));
    bag g = {0};
    ct_tensor *col = keep(&g, ct_unsqueeze(a, 1));
    ct_tensor *row = col ? keep(&g, ct_unsqueeze(b, 0)) : NULL;
    return finish(op, &g, row ? ct_mul(col, row) : NULL);
}

ct_tensor *ct_baddbmm(ct_tensor *input, ct_tensor *batch1, ct_tensor *batch2, double beta,
                      double alpha) {
    static const char op[] = "ct_baddbmm";
    ct_tensor *ts[3] = {input, batch1, batch2};
    if (cti_check_not_null(op, 3, ts) != CT_OK || cti_check_same_device(op, 3, ts) != CT_OK)
        return NULL;
    if (batch1->ndim != 3 || batch2->ndim != 3)
        return cti_error_null(CT_ERR_SHAPE, "%s: batch1 and batch2 must be 3-d, got %s and %s",
                              op, cti_desc(batch1), cti_desc(batch2));
    if (input->dtype != batch1->dtype || batch1->dtype != batch2->dtype)
        return cti_error_null(CT_ERR_DTYPE,
                              "%s: expected input, batch1 and batch2 to have the same dtype, "
                              "got %s, %s and %s",
                              op, ct_dtype_name(input->dtype), ct_dtype_name(batch1->dtype),
                              ct_dtype_name(batch2->dtype));
    int64_t want[3] = {batch1->shape[0], batch1->shape[1], batch2->shape[2]};
    bool ok = input->ndim <= 3;
    for (int d = 0; ok && d < input->ndim; d++) {
        int64_t s = input->shape[input->ndim - 1 - d];
        ok = s == 1 || s == want[2 - d];
    }
    if (!ok)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: input %s does not broadcast to the product's shape %s", op,
                              cti_desc(input), cti_shape_s(3, want));
    bag g = {0};
    if (beta == 0 && alpha == 1) return finish(op, &g, ct_bmm(batch1, batch2));
    ct_tensor *prod = keep(&g, ct_bmm(batch1, batch2));
    if (!prod) return finish(op, &g, NULL);
    if (beta == 0) /* input is not read, its NaNs neither (as PyTorch) */
        return finish(op, &g, ct_mul_scalar(prod, alpha));
    ct_tensor *scaled = beta == 1 ? input : keep(&g, ct_mul_scalar(input, beta));
    return finish(op, &g, scaled ? ct_add_alpha(scaled, prod, alpha) : NULL);
}

/* ---- normalization ----------------------------------------------------------------------- */

/* t [C] viewed as [1, C, 1, ...] for an ndim-d input. */
static ct_tensor *channel_view(ct_tensor *t, int ndim) {
    int64_t shape[CT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) shape[d] = 1;
    shape[1] = t->shape[0];
    return ct_reshape(t, ndim, shape);
}

/* NULL, or a 1-d tensor of C elements of x's dtype and device. */
static ct_status check_channel_vec(const char *op, const char *name, const ct_tensor *t,
                                   const ct_tensor *x, int64_t C, bool any_float) {
    if (!t) return CT_OK;
    if (t->ndim != 1 || t->shape[0] != C)
        return cti_error(CT_ERR_SHAPE, "%s: expected %s of shape [%lld] for input %s, got %s",
                         op, name, (long long)C, cti_desc(x), cti_desc(t));
    if (any_float ? !is_float(t->dtype) : t->dtype != x->dtype)
        return cti_error(CT_ERR_DTYPE, "%s: expected %s of %s, got %s", op, name,
                         any_float ? "a floating dtype" : ct_dtype_name(x->dtype),
                         cti_desc(t));
    if (t->storage->device.type != x->storage->device.type ||
        t->storage->device.index != x->storage->device.index)
        return cti_error(CT_ERR_DEVICE, "%s: %s %s is not on the input's device", op, name,
                         cti_desc(t));
    return CT_OK;
}

/* The dtype statistics are computed in: float32 for the half types. */
static ct_dtype compute_dtype(ct_dtype dt) {
    return dt == CT_F16 || dt == CT_BF16 ? CT_F32 : dt;
}

/* t in dtype dt: a new handle either way (a view of t when it has dt), so
 * the caller releases it like any result without touching t's owner. */
static ct_tensor *as_dtype(ct_tensor *t, ct_dtype dt) {
    return t->dtype == dt ? ct_view(t, t->ndim, t->shape) : ct_to_dtype(t, dt);
}

/* running = (1 - momentum) running + momentum * stat (stat [C] in any float
 * dtype), in place and unrecorded. */
static ct_status update_running(ct_tensor *running, ct_tensor *stat, double momentum) {
    bool prev = ct_no_grad_begin();
    ct_tensor *s = as_dtype(stat, running->dtype);
    ct_status st = s ? ct_mul_scalar_(running, 1 - momentum) : ct_last_status();
    if (st == CT_OK) st = ct_add_alpha_(running, s, momentum);
    ct_tensor_release(s);
    ct_no_grad_end(prev);
    return st;
}

/* Checks shared by the norms: x [N, C, *] floating with at least min_nd dims. */
static ct_status check_norm_input(const char *op, const ct_tensor *x, int min_nd) {
    if (check_float(op, "input", x) != CT_OK) return ct_last_status();
    if (x->ndim < min_nd)
        return cti_error(CT_ERR_SHAPE, "%s: expected an input of at least %d dims [N, C%s], got %s",
                         op, min_nd, min_nd > 2 ? ", *" : ", ...", cti_desc(x));
    return CT_OK;
}

static ct_status check_running(const char *op, const ct_tensor *rm, const ct_tensor *rv,
                               const ct_tensor *x, int64_t C, bool required) {
    if ((rm == NULL) != (rv == NULL))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: running_mean and running_var must be given together", op);
    if (!rm && required)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: running_mean and running_var are required when not using the "
                         "input's statistics",
                         op);
    if (check_channel_vec(op, "running_mean", rm, x, C, true) != CT_OK ||
        check_channel_vec(op, "running_var", rv, x, C, true) != CT_OK)
        return ct_last_status();
    return CT_OK;
}

/* A fresh contiguous handle on t's values (a view when t is contiguous),
 * unrecorded: the callers record their own node on t. */
static ct_tensor *contiguous_of(ct_tensor *t) {
    bool prev = ct_no_grad_begin();
    ct_tensor *v = ct_view(t, t->ndim, t->shape);
    if (v && !cti_is_contiguous(v)) {
        ct_tensor *c = ct_contiguous(v);
        ct_tensor_release(v);
        v = c;
    }
    ct_no_grad_end(prev);
    return v;
}

/* t [C] as a contiguous tensor of dtype dt, unrecorded (running statistics). */
static ct_tensor *stats_of(ct_tensor *t, ct_dtype dt) {
    bool prev = ct_no_grad_begin();
    ct_tensor *d = as_dtype(t, dt);
    ct_no_grad_end(prev);
    ct_tensor *c = d ? contiguous_of(d) : NULL;
    ct_tensor_release(d);
    return c;
}

/* BATCH_NORM on x read as [N, C, S] (x's shape otherwise any, numel N C S):
 * the result has x's shape. training: *mean and *var receive the batch's
 * statistics (new tensors); else mean_in and var_in are used. Records the
 * node on (x, weight, bias). */
static ct_tensor *native_batch_norm(const char *op, ct_tensor *x, int64_t N, int64_t C,
                                    int64_t S, ct_tensor *weight, ct_tensor *bias,
                                    ct_tensor *mean_in, ct_tensor *var_in, bool training,
                                    double eps, ct_tensor **mean, ct_tensor **var) {
    cti_batch_norm_params p = {.N = N, .C = C, .S = S, .eps = eps, .training = training};
    ct_dtype sdt = compute_dtype(x->dtype);
    bag g = {0};
    ct_tensor *xc = keep(&g, contiguous_of(x));
    ct_tensor *wc = weight && xc ? keep(&g, contiguous_of(weight)) : NULL;
    ct_tensor *bc = bias && xc ? keep(&g, contiguous_of(bias)) : NULL;
    ct_tensor *mc = !training && xc ? keep(&g, stats_of(mean_in, sdt)) : NULL;
    ct_tensor *vc = !training && xc ? keep(&g, stats_of(var_in, sdt)) : NULL;
    if (g.failed) return finish(op, &g, NULL);
    ct_call c;
    cti_call_init(&c, CT_OP_BATCH_NORM);
    cti_call_params(&c, &p);
    c.in[0] = xc;
    c.in[1] = wc;
    c.in[2] = bc;
    c.in[3] = mc;
    c.in[4] = vc;
    c.nin = 5;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, x->storage->device);
    c.out[1] = training && c.out[0] ? cti_tensor_new(op, 1, &C, sdt, x->storage->device) : NULL;
    c.out[2] = training && c.out[1] ? cti_tensor_new(op, 1, &C, sdt, x->storage->device) : NULL;
    c.nout = training ? 3 : 1;
    if (!c.out[0] || (training && !c.out[2])) {
        cti_call_release_outputs(&c);
        return finish(op, &g, NULL);
    }
    if (cti_run(&c, x->storage->device, x->dtype) != CT_OK) {
        cti_call_release_outputs(&c);
        return finish(op, &g, NULL);
    }
    ct_tensor *sm = training ? c.out[1] : mc, *sv = training ? c.out[2] : vc;
    ct_tensor *ins[3] = {x, weight, bias};
    if (cti_ag_needed(3, ins)) {
        cti_ag_rec r = {.name = "NativeBatchNormBackward", .backward = cti_bw_batch_norm,
                        .nin = 3, .in = {x, weight, bias}, .nout = 1, .out = {c.out[0]},
                        .nsaved = 4, .saved = {x, weight, sm, sv}, CTI_AG_PARAMS(&p)};
        if (cti_ag_record(&r) != CT_OK) {
            cti_call_release_outputs(&c);
            bag_free(&g);
            return NULL;
        }
    }
    if (training) {
        *mean = c.out[1];
        *var = c.out[2];
    }
    bag_free(&g);
    return c.out[0];
}

ct_tensor *ct_batch_norm(ct_tensor *x, ct_tensor *running_mean, ct_tensor *running_var,
                         ct_tensor *weight, ct_tensor *bias, bool training, double momentum,
                         double eps) {
    static const char op[] = "ct_batch_norm";
    if (cti_check_not_null(op, 1, &x) != CT_OK || check_norm_input(op, x, 2) != CT_OK)
        return NULL;
    int64_t C = x->shape[1];
    if (check_channel_vec(op, "weight", weight, x, C, false) != CT_OK ||
        check_channel_vec(op, "bias", bias, x, C, false) != CT_OK ||
        check_running(op, running_mean, running_var, x, C, !training) != CT_OK)
        return NULL;
    int64_t count = C > 0 ? ct_tensor_numel(x) / C : 0;
    if (training && count <= 1)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: expected more than 1 value per channel when training, got "
                              "input %s",
                              op, cti_desc(x));
    int64_t N = x->shape[0], S = N > 0 ? count / N : 0;
    ct_tensor *mean = NULL, *var = NULL;
    ct_tensor *y = native_batch_norm(op, x, N, C, S, weight, bias, running_mean, running_var,
                                     training, eps, &mean, &var);
    if (!y || !training || !running_mean) {
        ct_tensor_release(mean);
        ct_tensor_release(var);
        return y;
    }
    /* the running variance takes the unbiased estimate */
    bag g = {0};
    keep(&g, mean);
    keep(&g, var);
    bool prev = ct_no_grad_begin();
    ct_tensor *vu = keep(&g, ct_mul_scalar(var, (double)count / (double)(count - 1)));
    ct_no_grad_end(prev);
    if (!vu || update_running(running_mean, mean, momentum) != CT_OK ||
        update_running(running_var, vu, momentum) != CT_OK) {
        ct_tensor_release(y);
        return finish(op, &g, NULL);
    }
    bag_free(&g);
    return y;
}

/* y * weight + bias per channel of an [N, C, *] result (either may be NULL). */
static ct_tensor *channel_affine(const char *op, ct_tensor *y, ct_tensor *weight,
                                 ct_tensor *bias) {
    if (!y || (!weight && !bias)) return y;
    bag g = {0};
    keep(&g, y);
    ct_tensor *z = y;
    if (weight) {
        ct_tensor *w = keep(&g, channel_view(weight, y->ndim));
        z = w ? keep(&g, ct_mul(z, w)) : NULL;
    }
    if (z && bias) {
        ct_tensor *b = keep(&g, channel_view(bias, y->ndim));
        z = b ? keep(&g, ct_add(z, b)) : NULL;
    }
    if (!z) return finish(op, &g, NULL);
    ct_tensor *r = ct_view(z, z->ndim, z->shape);
    return finish(op, &g, r);
}

ct_tensor *ct_group_norm(ct_tensor *x, int64_t num_groups, ct_tensor *weight, ct_tensor *bias,
                         double eps) {
    static const char op[] = "ct_group_norm";
    if (cti_check_not_null(op, 1, &x) != CT_OK || check_norm_input(op, x, 2) != CT_OK)
        return NULL;
    int64_t C = x->shape[1], N = x->shape[0];
    if (num_groups < 1 || C % num_groups != 0)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: expected the number of channels (%lld) of input %s to be "
                              "divisible by num_groups (%lld)",
                              op, (long long)C, cti_desc(x), (long long)num_groups);
    if (check_channel_vec(op, "weight", weight, x, C, false) != CT_OK ||
        check_channel_vec(op, "bias", bias, x, C, false) != CT_OK)
        return NULL;
    /* each (n, group) is one channel of a batch norm over [1, N G, rest] */
    int64_t per = N > 0 ? ct_tensor_numel(x) / N / num_groups : 0;
    ct_tensor *mean = NULL, *var = NULL;
    ct_tensor *y = native_batch_norm(op, x, 1, N * num_groups, per, NULL, NULL, NULL, NULL, true,
                                     eps, &mean, &var);
    ct_tensor_release(mean);
    ct_tensor_release(var);
    return channel_affine(op, y, weight, bias);
}

ct_tensor *ct_instance_norm(ct_tensor *x, ct_tensor *running_mean, ct_tensor *running_var,
                            ct_tensor *weight, ct_tensor *bias, bool use_input_stats,
                            double momentum, double eps) {
    static const char op[] = "ct_instance_norm";
    if (cti_check_not_null(op, 1, &x) != CT_OK || check_norm_input(op, x, 3) != CT_OK)
        return NULL;
    int64_t C = x->shape[1], N = x->shape[0];
    if (check_channel_vec(op, "weight", weight, x, C, false) != CT_OK ||
        check_channel_vec(op, "bias", bias, x, C, false) != CT_OK ||
        check_running(op, running_mean, running_var, x, C, !use_input_stats) != CT_OK)
        return NULL;
    int64_t count = N * C > 0 ? ct_tensor_numel(x) / (N * C) : 0;
    if (use_input_stats && count <= 1)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: expected more than 1 spatial element when training, got "
                              "input %s",
                              op, cti_desc(x));
    if (!use_input_stats) /* the running statistics per channel: batch norm's eval */
        return ct_batch_norm(x, running_mean, running_var, weight, bias, false, momentum, eps);
    /* each (n, c) is one channel of a batch norm over [1, N C, S] */
    ct_tensor *mean = NULL, *var = NULL;
    ct_tensor *y = native_batch_norm(op, x, 1, N * C, count, NULL, NULL, NULL, NULL, true, eps,
                                     &mean, &var);
    if (!y) return NULL;
    bag g = {0};
    keep(&g, mean);
    keep(&g, var);
    if (running_mean) {
        /* the mean over N of the instances' statistics, the variance unbiased */
        bool prev = ct_no_grad_begin();
        int64_t nc[2] = {N, C}, d0 = 0;
        ct_tensor *m2 = keep(&g, ct_reshape(mean, 2, nc));
        ct_tensor *m1 = m2 ? keep(&g, ct_mean(m2, 1, &d0, false)) : NULL;
        ct_tensor *v2 = m1 ? keep(&g, ct_reshape(var, 2, nc)) : NULL;
        ct_tensor *v1 = v2 ? keep(&g, ct_mean(v2, 1, &d0, false)) : NULL;
        ct_tensor *vu =
            v1 ? keep(&g, ct_mul_scalar(v1, (double)count / (double)(count - 1))) : NULL;
        ct_no_grad_end(prev);
        if (!vu || update_running(running_mean, m1, momentum) != CT_OK ||
            update_running(running_var, vu, momentum) != CT_OK) {
            ct_tensor_release(y);
            return finish(op, &g, NULL);
        }
    }
    bag_free(&g);
    return channel_affine(op, y, weight, bias);
}

ct_status ct_batch_norm_backward(ct_tensor *grad_y, ct_tensor *x, ct_tensor *weight,
                                 ct_tensor *save_mean, ct_tensor *save_var, bool training,
                                 double eps, ct_tensor **dx, ct_tensor **dweight,
                                 ct_tensor **dbias) {
    static const char op[] = "ct_batch_norm_backward";
    ct_tensor *ts[5] = {grad_y, x, save_mean, save_var, weight};
    if (cti_check_not_null(op, 4, ts) != CT_OK || cti_check_same_device(op, 5, ts) != CT_OK ||
        check_norm_input(op, x, 2) != CT_OK)
        return ct_last_status();
    bool want_dw = dweight && weight;
    if (dweight) *dweight = NULL;
    if (!dx && !want_dw && !dbias)
        return cti_error(CT_ERR_INVALID_ARG, "%s: no gradient asked for", op);
    bool same = grad_y->ndim == x->ndim && grad_y->dtype == x->dtype;
    for (int d = 0; same && d < x->ndim; d++) same = grad_y->shape[d] == x->shape[d];
    if (!same)
        return cti_error(CT_ERR_SHAPE, "%s: grad_y %s must have the shape and dtype of x %s", op,
                         cti_desc(grad_y), cti_desc(x));
    int64_t N = x->shape[0], C = x->shape[1];
    int64_t S = N * C > 0 ? ct_tensor_numel(x) / (N * C) : 0;
    ct_dtype sdt = compute_dtype(x->dtype);
    if (check_channel_vec(op, "weight", weight, x, C, false) != CT_OK ||
        check_channel_vec(op, "save_mean", save_mean, x, C, true) != CT_OK ||
        check_channel_vec(op, "save_var", save_var, x, C, true) != CT_OK)
        return ct_last_status();
    if (save_mean->dtype != sdt || save_var->dtype != sdt)
        return cti_error(CT_ERR_DTYPE, "%s: expected save_mean and save_var of %s, got %s and %s",
                         op, ct_dtype_name(sdt), cti_desc(save_mean), cti_desc(save_var));
    cti_batch_norm_params p = {.N = N, .C = C, .S = S, .eps = eps, .training = training};
    bag g = {0};
    ct_tensor *gc = keep(&g, contiguous_of(grad_y));
    ct_tensor *xc = gc ? keep(&g, contiguous_of(x)) : NULL;
    ct_tensor *wc = weight && xc ? keep(&g, contiguous_of(weight)) : NULL;
    ct_tensor *mc = xc ? keep(&g, contiguous_of(save_mean)) : NULL;
    ct_tensor *vc = mc ? keep(&g, contiguous_of(save_var)) : NULL;
    if (g.failed) {
        finish(op, &g, NULL);
        return ct_last_status();
    }
    ct_call c;
    cti_call_init(&c, CT_OP_BATCH_NORM_BACKWARD);
    cti_call_params(&c, &p);
    c.in[0] = gc;
    c.in[1] = xc;
    c.in[2] = wc;
    c.in[3] = mc;
    c.in[4] = vc;
    c.nin = 5;
    ct_device dev = x->storage->device;
    c.out[0] = dx ? cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev) : NULL;
    c.out[1] = want_dw ? cti_tensor_new(op, 1, &C, x->dtype, dev) : NULL;
    c.out[2] = dbias ? cti_tensor_new(op, 1, &C, x->dtype, dev) : NULL;
    c.nout = 3;
    ct_status st = (dx && !c.out[0]) || (want_dw && !c.out[1]) || (dbias && !c.out[2])
                       ? ct_last_status()
                       : cti_run(&c, dev, x->dtype);
    bag_free(&g);
    if (st != CT_OK) {
        cti_call_release_outputs(&c);
        return st;
    }
    if (dx) *dx = c.out[0];
    if (want_dw) *dweight = c.out[1];
    if (dbias) *dbias = c.out[2];
    return CT_OK;
}

/* ---- convolution ------------------------------------------------------------------------ */

ct_tensor *ct_conv1d(ct_tensor *x, ct_tensor *w, ct_tensor *bias, int64_t stride,
                     int64_t padding, int64_t dilation, int64_t groups) {
    static const char op[] = "ct_conv1d";
    ct_tensor *ts[2] = {x, w};
    if (cti_check_not_null(op, 2, ts) != CT_OK) return NULL;
    if (x->ndim != 2 && x->ndim != 3)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected a 2-d (C, L) or 3-d (N, C, L) input, got %s",
                              op, cti_desc(x));
    if (w->ndim != 3)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: expected a 3-d weight [out_channels, in_channels/groups, k], "
                              "got %s",
                              op, cti_desc(w));
    const int64_t st[2] = {1, stride}, pad[2] = {0, padding}, dil[2] = {1, dilation};
    bag g = {0};
    ct_tensor *x4 = keep(&g, ct_unsqueeze(x, x->ndim - 1));
    ct_tensor *w4 = x4 ? keep(&g, ct_unsqueeze(w, 2)) : NULL;
    ct_tensor *y4 = w4 ? keep(&g, ct_conv2d(x4, w4, bias, st, pad, dil, groups)) : NULL;
    return finish(op, &g, y4 ? ct_squeeze_dim(y4, y4->ndim - 2) : NULL);
}

static void pair_or(const int64_t *p, int64_t def, int64_t out[2]) {
    out[0] = p ? p[0] : def;
    out[1] = p ? p[1] : def;
}

ct_tensor *ct_conv_transpose2d(ct_tensor *x, ct_tensor *w, ct_tensor *bias,
                               const int64_t stride[2], const int64_t padding[2],
                               const int64_t output_padding[2], int64_t groups,
                               const int64_t dilation[2]) {
    static const char op[] = "ct_conv_transpose2d";
    ct_tensor *ts[3] = {x, w, bias};
    if (cti_check_not_null(op, 2, ts) != CT_OK || cti_check_same_device(op, 3, ts) != CT_OK ||
        check_float(op, "input", x) != CT_OK)
        return NULL;
    if (x->ndim != 3 && x->ndim != 4)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected a 3-d (CHW) or 4-d (NCHW) input, got %s",
                              op, cti_desc(x));
    if (w->ndim != 4)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: expected a 4-d weight [in_channels, out_channels/groups, kH, "
                              "kW], got %s",
                              op, cti_desc(w));
    if (x->dtype != w->dtype || (bias && bias->dtype != x->dtype))
        return cti_error_null(CT_ERR_DTYPE,
                              "%s: input %s, weight %s and bias must have the same dtype", op,
                              cti_desc(x), cti_desc(w));
    if (groups < 1)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: groups must be positive, got %lld", op,
                              (long long)groups);
    int64_t cin = x->shape[x->ndim - 3];
    if (w->shape[0] != cin)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: weight %s expects %lld input channels, input %s has %lld", op,
                              cti_desc(w), (long long)w->shape[0], cti_desc(x), (long long)cin);
    cti_conv_params p = {0};
    int64_t opad[2];
    pair_or(stride, 1, p.stride);
    pair_or(padding, 0, p.padding);
    pair_or(dilation, 1, p.dilation);
    pair_or(output_padding, 0, opad);
    p.groups = groups;
    for (int d = 0; d < 2; d++) {
        if (p.stride[d] < 1 || p.dilation[d] < 1 || p.padding[d] < 0 || opad[d] < 0)
            return cti_error_null(CT_ERR_INVALID_ARG,
                                  "%s: expected stride and dilation > 0, padding and "
                                  "output_padding >= 0, got stride %s, padding %s, "
                                  "output_padding %s, dilation %s",
                                  op, cti_shape_s(2, p.stride), cti_shape_s(2, p.padding),
                                  cti_shape_s(2, opad), cti_shape_s(2, p.dilation));
        if (opad[d] >= p.stride[d])
            return cti_error_null(CT_ERR_INVALID_ARG,
                                  "%s: output_padding %s must be smaller than stride %s", op,
                                  cti_shape_s(2, opad), cti_shape_s(2, p.stride));
    }
    int64_t out[4] = {x->ndim == 4 ? x->shape[0] : 1, w->shape[1] * groups, 0, 0};
    for (int d = 0; d < 2; d++) {
        int64_t in = x->shape[x->ndim - 2 + d], k = w->shape[2 + d];
        __int128 o = (__int128)(in - 1) * p.stride[d] - 2 * (__int128)p.padding[d] +
                     (__int128)p.dilation[d] * (k - 1) + opad[d] + 1;
        if (o < 1 || o > INT64_MAX)
            return cti_error_null(CT_ERR_SHAPE,
                                  "%s: input %s with weight %s, stride %s, padding %s and "
                                  "dilation %s gives output size %s%lld (must be positive)",
                                  op, cti_desc(x), cti_desc(w), cti_shape_s(2, p.stride),
                                  cti_shape_s(2, p.padding), cti_shape_s(2, p.dilation),
                                  o > INT64_MAX ? "above " : "", (long long)(o > INT64_MAX ? INT64_MAX : o));
        out[2 + d] = (int64_t)o;
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != out[1]))
        return cti_error_null(CT_ERR_SHAPE, "%s: expected bias of shape [%lld], got %s", op,
                              (long long)out[1], cti_desc(bias));
    ct_tensor *y;
    {
        bool prev = ct_no_grad_begin();
        y = ct_conv2d_backward_input(x, w, out, p.stride, p.padding, p.dilation, groups);
        ct_no_grad_end(prev);
    }
    if (!y) return fail_as(op);
    if (cti_ag_needed(2, ts)) {
        cti_ag_rec r = {.name = "ConvolutionBackward", .backward = cti_bw_conv_transpose2d,
                        .nin = 2, .in = {x, w}, .nout = 1, .out = {y}, .nsaved = 2,
                        .saved = {ct_requires_grad(w) ? x : NULL, ct_requires_grad(x) ? w : NULL},
                        CTI_AG_PARAMS(&p)};
        if (cti_ag_record(&r) != CT_OK) {
            ct_tensor_release(y);
            return NULL;
        }
    }
    if (!bias) return y;
    bag g = {0};
    keep(&g, y);
    int64_t bshape[4] = {1, out[1], 1, 1};
    ct_tensor *b = keep(&g, ct_reshape(bias, x->ndim, bshape + (4 - x->ndim)));
    return finish(op, &g, b ? ct_add(y, b) : NULL);
}

/* ---- 1-d pooling ------------------------------------------------------------------------ */

static ct_status check_pool1d(const char *op, const ct_tensor *x, int64_t kernel,
                              int64_t stride) {
    if (x->ndim != 2 && x->ndim != 3)
        return cti_error(CT_ERR_SHAPE, "%s: expected a 2-d (C, L) or 3-d (N, C, L) input, got %s",
                         op, cti_desc(x));
    if (kernel < 1 || stride < 0)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: kernel_size must be positive and stride non-negative (0: "
                         "kernel_size), got %lld and %lld",
                         op, (long long)kernel, (long long)stride);
    return CT_OK;
}

ct_tensor *ct_max_pool1d(ct_tensor *x, int64_t kernel_size, int64_t stride, int64_t padding,
                         int64_t dilation, bool ceil_mode, ct_tensor **indices) {
    static const char op[] = "ct_max_pool1d";
    if (cti_check_not_null(op, 1, &x) != CT_OK ||
        check_pool1d(op, x, kernel_size, stride) != CT_OK)
        return NULL;
    const int64_t k[2] = {1, kernel_size}, st[2] = {1, stride ? stride : kernel_size},
                  pad[2] = {0, padding}, dil[2] = {1, dilation};
    bag g = {0};
    ct_tensor *x4 = keep(&g, ct_unsqueeze(x, x->ndim - 1));
    ct_tensor *i4 = NULL;
    ct_tensor *y4 = x4 ? keep(&g, ct_max_pool2d(x4, k, st, pad, dil, ceil_mode,
                                                indices ? &i4 : NULL))
                       : NULL;
    if (i4) keep(&g, i4);
    ct_tensor *idx = y4 && indices ? ct_squeeze_dim(i4, i4->ndim - 2) : NULL;
    ct_tensor *y = y4 && (!indices || idx) ? ct_squeeze_dim(y4, y4->ndim - 2) : NULL;
    if (!y || g.failed) {
        ct_tensor_release(idx);
        return finish(op, &g, y);
    }
    if (indices) *indices = idx;
    return finish(op, &g, y);
}

ct_tensor *ct_avg_pool1d(ct_tensor *x, int64_t kernel_size, int64_t stride, int64_t padding,
                         bool ceil_mode, bool count_include_pad) {
    static const char op[] = "ct_avg_pool1d";
    if (cti_check_not_null(op, 1, &x) != CT_OK ||
        check_pool1d(op, x, kernel_size, stride) != CT_OK)
        return NULL;
    const int64_t k[2] = {1, kernel_size}, st[2] = {1, stride ? stride : kernel_size},
                  pad[2] = {0, padding};
    bag g = {0};
    ct_tensor *x4 = keep(&g, ct_unsqueeze(x, x->ndim - 1));
    ct_tensor *y4 =
        x4 ? keep(&g, ct_avg_pool2d(x4, k, st, pad, ceil_mode, count_include_pad)) : NULL;
    return finish(op, &g, y4 ? ct_squeeze_dim(y4, y4->ndim - 2) : NULL);
}
