/* Front ends of the neural-network ops: normalization, softmax, losses,
 * embedding and dropout. They check arguments, hand contiguous inputs to the
 * kernels (a copy only when an input is not contiguous already) and allocate
 * the outputs. */
#include <math.h>

#include "ops_impl.h"
#include "tensor/ops.h"

/* ---- helpers ----------------------------------------------------------------------- */

/* Temporaries a front end creates (contiguous copies, views), released together. */
typedef struct temps {
    ct_tensor *t[8];
    int n;
} temps;

static void temps_release(temps *tp) {
    for (int i = 0; i < tp->n; i++) ct_tensor_release(tp->t[i]);
    tp->n = 0;
}

/* A contiguous version of t (NULL stays NULL) kept in tp; false on failure. */
static bool contig(temps *tp, ct_tensor *t, ct_tensor **out) {
    *out = NULL;
    if (!t) return true;
    ct_tensor *c = ct_contiguous(t);
    if (!c) return false;
    tp->t[tp->n++] = c;
    *out = c;
    return true;
}

static ct_device dev(const ct_tensor *t) { return t->storage->device; }

/* A second handle on t with t's geometry, for ops that return their input:
 * unlike a bumped reference count it belongs to the caller's scope. */
static ct_tensor *alias(ct_tensor *t) {
    return cti_tensor_view(t, t->ndim, t->shape, t->stride, t->offset);
}

/* The dtype of saved per-row statistics: f64 for f64, f32 otherwise. */
static ct_dtype stat_dtype(ct_dtype dt) { return dt == CT_F64 ? CT_F64 : CT_F32; }

/* The product of sizes s[a..b): 0 with a zero among them, and saturated
 * rather than overflowing for the part of an empty tensor's sizes that lies
 * outside its zero (no kernel reads such a tensor's elements). */
static int64_t prod(const int64_t *s, int a, int b) {
    return b > a ? cti_numel(b - a, s + a) : 1;
}

static bool same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
    if (na != nb) return false;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return false;
    return true;
}

static ct_status check_same_dtype(const char *op, const ct_tensor *t, const char *name,
                                  const ct_tensor *ref, const char *refname) {
    if (t->dtype == ref->dtype) return CT_OK;
    return cti_error(CT_ERR_DTYPE, "%s: %s has dtype %s but %s has %s (expected equal dtypes)", op,
                     name, ct_dtype_name(t->dtype), refname, ct_dtype_name(ref->dtype));
}

static ct_status check_shape_eq(const char *op, const ct_tensor *t, const char *name,
                                int n, const int64_t *shape) {
    if (same_shape(t->ndim, t->shape, n, shape)) return CT_OK;
    return cti_error(CT_ERR_SHAPE, "%s: %s has shape %s, expected %s", op, name,
                     cti_shape_s(t->ndim, t->shape), cti_shape_s(n, shape));
}


/* Dispatches c on t's device with t's dtype; on failure releases the outputs. */
static ct_status run(ct_call *c, const ct_tensor *t) {
    ct_status s = cti_run(c, dev(t), t->dtype);
    if (s != CT_OK) cti_call_release_outputs(c);
    return s;
}

/* ---- normalization ------------------------------------------------------------------ */

/* x's trailing nnorm dims must equal normalized_shape; rows = product of the rest. */
static ct_status norm_split(const char *op, const ct_tensor *x, int nnorm, const int64_t *ns,
                            int64_t *rows, int64_t *d) {
    if (nnorm < 1)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: normalized_shape must hold at least one dim, got %d dims", op, nnorm);
    if (!ns)
        return cti_error(CT_ERR_INVALID_ARG, "%s: normalized_shape is NULL (%d dims)", op, nnorm);
    if (nnorm > x->ndim)
        return cti_error(CT_ERR_SHAPE, "%s: normalized_shape %s has more dims than x %s", op,
                         cti_shape_s(nnorm, ns), cti_desc(x));
    int lead = x->ndim - nnorm;
    for (int i = 0; i < nnorm; i++)
        if (x->shape[lead + i] != ns[i])
            return cti_error(CT_ERR_SHAPE,
                             "%s: normalized_shape %s does not match the last dims of x %s", op,
                             cti_shape_s(nnorm, ns), cti_desc(x));
    *rows = prod(x->shape, 0, lead);
    *d = prod(ns, 0, nnorm);
    return CT_OK;
}

static ct_status check_eps(const char *op, double eps) {
    if (eps >= 0 && isfinite(eps)) return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG, "%s: eps must be finite and >= 0, got %g", op, eps);
}

/* An affine parameter (weight/bias): shape normalized_shape, x's dtype. */
static ct_status check_param(const char *op, const ct_tensor *p, const char *name,
                             const ct_tensor *x, int nnorm, const int64_t *ns) {
    if (!p) return CT_OK;
    if (check_shape_eq(op, p, name, nnorm, ns)) return ct_last_status();
    return check_same_dtype(op, p, name, x, "x");
}

/* A saved statistic: shape = x's leading dims, dtype stat_dtype(x). */
static ct_status check_stat(const char *op, const ct_tensor *s, const char *name,
                            const ct_tensor *x) {
    if (s->ndim >= x->ndim || !same_shape(s->ndim, s->shape, s->ndim, x->shape))
        return cti_error(CT_ERR_SHAPE,
                         "%s: %s %s must have the leading dims of x %s (one dim fewer at least)",
                         op, name, cti_desc(s), cti_desc(x));
    if (s->dtype != stat_dtype(x->dtype))
        return cti_error(CT_ERR_DTYPE, "%s: %s has dtype %s, expected %s for x of dtype %s", op,
                         name, ct_dtype_name(s->dtype), ct_dtype_name(stat_dtype(x->dtype)),
                         ct_dtype_name(x->dtype));
    return CT_OK;
}

ct_tensor *ct_rms_norm(ct_tensor *x, int nnorm, const int64_t *normalized_shape,
                       ct_tensor *weight, double eps, ct_tensor **inv_rms) {
    const char *op = "ct_rms_norm";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_RMS_NORM, 2, (ct_tensor *[]){x, weight}))
        return cti_autocast_end_op(
            &ac, ac.ok ? ct_rms_norm(ac.in[0], nnorm, normalized_shape, ac.in[1], eps, inv_rms)
                       : NULL);
    ct_tensor *all[2] = {x, weight};
    cti_norm_params p = {.eps = eps};
    if (cti_check_not_null(op, 1, &x) || cti_check_same_device(op, 2, all) ||
        cti_check_floating(op, x, "x") ||
        norm_split(op, x, nnorm, normalized_shape, &p.rows, &p.d) ||
        check_param(op, weight, "weight", x, nnorm, normalized_shape) || check_eps(op, eps))
        return NULL;
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_RMS_NORM);
    if (!contig(&tp, x, &c.in[0]) || !contig(&tp, weight, &c.in[1])) goto fail;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x));
    c.out[1] = c.out[0] ? cti_tensor_new(op, x->ndim - nnorm, x->shape, stat_dtype(x->dtype), dev(x))
                        : NULL;
    c.nout = 2;
    if (!c.out[1]) {
        cti_call_release_outputs(&c);
        goto fail;
    }
    cti_call_params(&c, &p);
    if (run(&c, x) != CT_OK) goto fail;
    temps_release(&tp);
    {
        /* The backward needs inv_rms even when the caller does not. */
        ct_tensor *y = cti_record_one(&(cti_ag_rec){.name = "RmsNormBackward",
                                            .backward = cti_bw_rms_norm,
                                            .nin = 2,
                                            .in = {x, weight},
                                            .nout = 1,
                                            .out = {c.out[0]},
                                            .nsaved = 3,
                                            .saved = {x, weight, c.out[1]}});
        if (y && inv_rms) *inv_rms = c.out[1];
        else ct_tensor_release(c.out[1]);
        return y;
    }
fail:
    temps_release(&tp);
    return NULL;
}

ct_status ct_rms_norm_backward(ct_tensor *grad_y, ct_tensor *x, ct_tensor *weight,
                               ct_tensor *inv_rms, ct_tensor **dx, ct_tensor **dweight) {
    const char *op = "ct_rms_norm_backward";
    ct_tensor *req[3] = {grad_y, x, inv_rms};
    ct_tensor *all[4] = {grad_y, x, inv_rms, weight};
    if (cti_check_not_null(op, 3, req) || cti_check_same_device(op, 4, all) ||
        cti_check_floating(op, x, "x") || check_shape_eq(op, grad_y, "grad_y", x->ndim, x->shape) ||
        check_same_dtype(op, grad_y, "grad_y", x, "x") || check_stat(op, inv_rms, "inv_rms", x))
        return ct_last_status();
    int nnorm = x->ndim - inv_rms->ndim;
    const int64_t *ns = x->shape + inv_rms->ndim;
    if (check_param(op, weight, "weight", x, nnorm, ns)) return ct_last_status();
    bool want_dw = weight && dweight;
    if (!dx && !want_dw)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: nothing to compute: dx is NULL and no weight gradient is asked for "
                         "(expected dx, or weight and dweight)",
                         op);
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_RMS_NORM_BACKWARD);
    if (!contig(&tp, grad_y, &c.in[0]) || !contig(&tp, x, &c.in[1]) ||
        !contig(&tp, weight, &c.in[2]) || !contig(&tp, inv_rms, &c.in[3]))
        goto fail;
    c.nin = 4;
    c.nout = 2;
    c.out[0] = dx ? cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x)) : NULL;
    c.out[1] = want_dw ? cti_tensor_new(op, weight->ndim, weight->shape, x->dtype, dev(x)) : NULL;
    if ((dx && !c.out[0]) || (want_dw && !c.out[1])) {
        cti_call_release_outputs(&c);
        goto fail;
    }
    cti_norm_params p = {.rows = prod(x->shape, 0, inv_rms->ndim), .d = prod(ns, 0, nnorm)};
    cti_call_params(&c, &p);
    if (run(&c, x) != CT_OK) goto fail;
    temps_release(&tp);
    if (dx) *dx = c.out[0];
    if (dweight) *dweight = c.out[1]; /* NULL when there is no weight */
    return CT_OK;
fail:
    temps_release(&tp);
    return ct_last_status();
}

ct_tensor *ct_layer_norm(ct_tensor *x, int nnorm, const int64_t *normalized_shape,
                         ct_tensor *weight, ct_tensor *bias, double eps, ct_tensor **mean,
                         ct_tensor **rstd) {
    const char *op = "ct_layer_norm";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_LAYER_NORM, 3, (ct_tensor *[]){x, weight, bias}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_layer_norm(ac.in[0], nnorm, normalized_shape,
                                                              ac.in[1], ac.in[2], eps, mean, rstd)
                                              : NULL);
    ct_tensor *all[3] = {x, weight, bias};
    cti_norm_params p = {.eps = eps};
    if (cti_check_not_null(op, 1, &x) || cti_check_same_device(op, 3, all) ||
        cti_check_floating(op, x, "x") ||
        norm_split(op, x, nnorm, normalized_shape, &p.rows, &p.d) ||
        check_param(op, weight, "weight", x, nnorm, normalized_shape) ||
        check_param(op, bias, "bias", x, nnorm, normalized_shape) || check_eps(op, eps))
        return NULL;
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_LAYER_NORM);
    if (!contig(&tp, x, &c.in[0]) || !contig(&tp, weight, &c.in[1]) || !contig(&tp, bias, &c.in[2]))
        goto fail;
    c.nin = 3;
    c.nout = 3;
    int lead = x->ndim - nnorm;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x));
    c.out[1] = cti_tensor_new(op, lead, x->shape, stat_dtype(x->dtype), dev(x));
    c.out[2] = cti_tensor_new(op, lead, x->shape, stat_dtype(x->dtype), dev(x));
    if (!c.out[0] || !c.out[1] || !c.out[2]) {
        cti_call_release_outputs(&c);
        goto fail;
    }
    cti_call_params(&c, &p);
    if (run(&c, x) != CT_OK) goto fail;
    temps_release(&tp);
    {
        ct_tensor *y = cti_record_one(&(cti_ag_rec){.name = "LayerNormBackward",
                                            .backward = cti_bw_layer_norm,
                                            .nin = 3,
                                            .in = {x, weight, bias},
                                            .nout = 1,
                                            .out = {c.out[0]},
                                            .nsaved = 4,
                                            .saved = {x, weight, c.out[1], c.out[2]}});
        if (y && mean) *mean = c.out[1];
        else ct_tensor_release(c.out[1]);
        if (y && rstd) *rstd = c.out[2];
        else ct_tensor_release(c.out[2]);
        return y;
    }
fail:
    temps_release(&tp);
    return NULL;
}

ct_status ct_layer_norm_backward(ct_tensor *grad_y, ct_tensor *x, ct_tensor *weight,
                                 ct_tensor *mean, ct_tensor *rstd, ct_tensor **dx,
                                 ct_tensor **dweight, ct_tensor **dbias) {
    const char *op = "ct_layer_norm_backward";
    ct_tensor *req[4] = {grad_y, x, mean, rstd};
    ct_tensor *all[5] = {grad_y, x, mean, rstd, weight};
    if (cti_check_not_null(op, 4, req) || cti_check_same_device(op, 5, all) ||
        cti_check_floating(op, x, "x") || check_shape_eq(op, grad_y, "grad_y", x->ndim, x->shape) ||
        check_same_dtype(op, grad_y, "grad_y", x, "x") || check_stat(op, mean, "mean", x) ||
        check_stat(op, rstd, "rstd", x) ||
        check_shape_eq(op, rstd, "rstd", mean->ndim, mean->shape))
        return ct_last_status();
    int nnorm = x->ndim - mean->ndim;
    const int64_t *ns = x->shape + mean->ndim;
    if (check_param(op, weight, "weight", x, nnorm, ns)) return ct_last_status();
    bool want_dw = weight && dweight;
    if (!dx && !want_dw && !dbias)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: nothing to compute: dx, dbias and the weight gradient are all "
                         "skipped (expected dx, dbias, or weight and dweight)",
                         op);
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_LAYER_NORM_BACKWARD);
    if (!contig(&tp, grad_y, &c.in[0]) || !contig(&tp, x, &c.in[1]) ||
        !contig(&tp, weight, &c.in[2]) || !contig(&tp, mean, &c.in[3]) ||
        !contig(&tp, rstd, &c.in[4]))
        goto fail;
    c.nin = 5;
    c.nout = 3;
    c.out[0] = dx ? cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x)) : NULL;
    c.out[1] = want_dw ? cti_tensor_new(op, nnorm, ns, x->dtype, dev(x)) : NULL;
    c.out[2] = dbias ? cti_tensor_new(op, nnorm, ns, x->dtype, dev(x)) : NULL;
    if ((dx && !c.out[0]) || (want_dw && !c.out[1]) || (dbias && !c.out[2])) {
        cti_call_release_outputs(&c);
        goto fail;
    }
    cti_norm_params p = {.rows = prod(x->shape, 0, mean->ndim), .d = prod(ns, 0, nnorm)};
    cti_call_params(&c, &p);
    if (run(&c, x) != CT_OK) goto fail;
    temps_release(&tp);
    if (dx) *dx = c.out[0];
    if (dweight) *dweight = c.out[1]; /* NULL when there is no weight */
    if (dbias) *dbias = c.out[2];
    return CT_OK;
fail:
    temps_release(&tp);
    return ct_last_status();
}

/* ---- residual add fused with a norm ------------------------------------------------- */

/* The dtype the fused ops compute and store the sum in: x's and residual's
 * promoted dtype, float32 at least inside an autocast region of their device
 * (norms are float32 ops there). */
static ct_dtype add_norm_dtype(const ct_tensor *x, const ct_tensor *residual) {
    ct_dtype dt = ct_promote_types(x->dtype, residual->dtype);
    if ((dt == CT_F16 || dt == CT_BF16) && ct_autocast_enabled(dev(x))) dt = CT_F32;
    return dt;
}

static ct_tensor *add_norm(const char *op, bool layer, ct_tensor *x, ct_tensor *residual,
                           int nnorm, const int64_t *ns, ct_tensor *weight, ct_tensor *bias,
                           double eps, ct_dtype out_dtype, ct_tensor **sum) {
    ct_tensor *req[2] = {x, residual};
    ct_tensor *all[4] = {x, residual, weight, bias};
    cti_norm_params p = {.eps = eps};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, layer ? 4 : 3, all) ||
        cti_check_floating(op, x, "x") || cti_check_floating(op, residual, "residual") ||
        check_shape_eq(op, residual, "residual", x->ndim, x->shape) ||
        norm_split(op, x, nnorm, ns, &p.rows, &p.d) || check_eps(op, eps))
        return NULL;
    if (out_dtype != CT_NUM_DTYPES &&
        ((unsigned)out_dtype >= CT_NUM_DTYPES || !ct_dtype_is_floating(out_dtype))) {
        cti_error(CT_ERR_DTYPE, "%s: out_dtype %d is not a floating dtype (expected float16, "
                  "bfloat16, float32, float64 or CT_NUM_DTYPES for the sum's)", op, (int)out_dtype);
        return NULL;
    }
    ct_dtype sdt = add_norm_dtype(x, residual);
    ct_dtype ydt = out_dtype == CT_NUM_DTYPES ? sdt : out_dtype;
    ct_tensor *params[2] = {weight, bias};
    const char *pname[2] = {"weight", "bias"};
    for (int k = 0; k < 2; k++) {
        ct_tensor *t = params[k];
        if (!t) continue;
        if (check_shape_eq(op, t, pname[k], nnorm, ns)) return NULL;
        if (t->dtype != sdt) {
            cti_error(CT_ERR_DTYPE, "%s: %s has dtype %s, expected the sum's %s (x %s + residual %s)",
                      op, pname[k], ct_dtype_name(t->dtype), ct_dtype_name(sdt),
                      ct_dtype_name(x->dtype), ct_dtype_name(residual->dtype));
            return NULL;
        }
    }
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, layer ? CT_OP_ADD_LAYER_NORM : CT_OP_ADD_RMS_NORM);
    if (!contig(&tp, x, &c.in[0]) || !contig(&tp, residual, &c.in[1]) ||
        !contig(&tp, weight, &c.in[2]) || (layer && !contig(&tp, bias, &c.in[3])))
        goto fail;
    c.nin = layer ? 4 : 3;
    int lead = x->ndim - nnorm;
    c.nout = layer ? 4 : 3;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, ydt, dev(x));
    c.out[1] = cti_tensor_new(op, x->ndim, x->shape, sdt, dev(x));
    for (int k = 2; k < c.nout; k++)
        c.out[k] = cti_tensor_new(op, lead, x->shape, stat_dtype(sdt), dev(x));
    for (int k = 0; k < c.nout; k++)
        if (!c.out[k]) {
            cti_call_release_outputs(&c);
            goto fail;
        }
    cti_call_params(&c, &p);
    if (cti_run(&c, dev(x), sdt) != CT_OK) {
        cti_call_release_outputs(&c);
        goto fail;
    }
    temps_release(&tp);
    ct_tensor *y = c.out[0], *s = c.out[1];
    if (cti_ag_needed(c.nin, (ct_tensor *[]){x, residual, weight, bias})) {
        cti_ag_rec r = {.name = layer ? "AddLayerNormBackward" : "AddRmsNormBackward",
                        .backward = layer ? cti_bw_add_layer_norm : cti_bw_add_rms_norm,
                        .nin = c.nin,
                        .in = {x, residual, weight, bias},
                        .nout = 2,
                        .out = {y, s},
                        .nsaved = layer ? 4 : 3,
                        .saved = {s, weight, c.out[2], layer ? c.out[3] : NULL}};
        if (cti_ag_record(&r) != CT_OK) {
            cti_call_release_outputs(&c);
            return NULL;
        }
    }
    for (int k = 2; k < c.nout; k++) ct_tensor_release(c.out[k]);
    if (sum) *sum = s;
    else ct_tensor_release(s);
    return y;
fail:
    temps_release(&tp);
    return NULL;
}

ct_tensor *ct_add_rms_norm(ct_tensor *x, ct_tensor *residual, int nnorm,
                           const int64_t *normalized_shape, ct_tensor *weight, double eps,
                           ct_dtype out_dtype, ct_tensor **sum) {
    return add_norm("ct_add_rms_norm", false, x, residual, nnorm, normalized_shape, weight, NULL,
                    eps, out_dtype, sum);
}

ct_tensor *ct_add_layer_norm(ct_tensor *x, ct_tensor *residual, int nnorm,
                             const int64_t *normalized_shape, ct_tensor *weight,
                             ct_tensor *bias, double eps, ct_dtype out_dtype, ct_tensor **sum) {
    return add_norm("ct_add_layer_norm", true, x, residual, nnorm, normalized_shape, weight, bias,
                    eps, out_dtype, sum);
}

ct_status cti_add_norm_backward(bool layer, ct_tensor *grad_y, ct_tensor *grad_sum,
                                ct_tensor *sum, ct_tensor *weight, ct_tensor *stat0,
                                ct_tensor *stat1, ct_dtype x_dtype, ct_dtype residual_dtype,
                                const bool needs[4], ct_tensor **gi) {
    const char *op = layer ? "ct_add_layer_norm_backward" : "ct_add_rms_norm_backward";
    int nnorm = sum->ndim - stat0->ndim;
    const int64_t *ns = sum->shape + stat0->ndim;
    bool want_x = needs[0], want_r = needs[1], want_w = weight && needs[2];
    bool want_b = layer && needs[3];
    if (!want_x && !want_r && !want_w && !want_b) return CT_OK;
    if (!grad_y && !grad_sum) return CT_OK;
    if (!grad_y) {
        /* Only the sum was used: its gradient passes to x and residual. */
        ct_status st = CT_OK;
        if (want_x) st = (gi[0] = ct_to_dtype(grad_sum, x_dtype)) ? CT_OK : ct_last_status();
        if (st == CT_OK && want_r)
            st = (gi[1] = ct_to_dtype(grad_sum, residual_dtype)) ? CT_OK : ct_last_status();
        return st;
    }
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, layer ? CT_OP_ADD_LAYER_NORM_BACKWARD : CT_OP_ADD_RMS_NORM_BACKWARD);
    if (!contig(&tp, grad_y, &c.in[0]) || !contig(&tp, grad_sum, &c.in[1]) ||
        !contig(&tp, sum, &c.in[2]) || !contig(&tp, weight, &c.in[3]) ||
        !contig(&tp, stat0, &c.in[4]) || (layer && !contig(&tp, stat1, &c.in[5])))
        goto fail;
    c.nin = layer ? 6 : 5;
    c.nout = layer ? 4 : 3;
    c.out[0] = want_x ? cti_tensor_new(op, sum->ndim, sum->shape, x_dtype, dev(sum)) : NULL;
    c.out[1] = want_r ? cti_tensor_new(op, sum->ndim, sum->shape, residual_dtype, dev(sum)) : NULL;
    c.out[2] = want_w ? cti_tensor_new(op, nnorm, ns, sum->dtype, dev(sum)) : NULL;
    if (layer) c.out[3] = want_b ? cti_tensor_new(op, nnorm, ns, sum->dtype, dev(sum)) : NULL;
    if ((want_x && !c.out[0]) || (want_r && !c.out[1]) || (want_w && !c.out[2]) ||
        (want_b && !c.out[3])) {
        cti_call_release_outputs(&c);
        goto fail;
    }
    cti_norm_params p = {.rows = prod(sum->shape, 0, stat0->ndim), .d = prod(ns, 0, nnorm)};
    cti_call_params(&c, &p);
    if (run(&c, sum) != CT_OK) goto fail;
    temps_release(&tp);
    for (int k = 0; k < c.nout; k++) gi[k] = c.out[k];
    return CT_OK;
fail:
    temps_release(&tp);
    return ct_last_status();
}

/* ---- softmax ------------------------------------------------------------------------------- */

/* Splits x's shape around dim into outer * D * inner: p gets them, the wrapped dim and lg. */
static bool softmax_geom(const char *op, const ct_tensor *x, int dim, bool lg,
                         cti_softmax_params *p) {
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return false;
    p->dim = d;
    p->log = lg;
    if (x->ndim == 0) {
        p->outer = p->d = p->inner = 1;
        return true;
    }
    p->outer = prod(x->shape, 0, d);
    p->d = x->shape[d];
    p->inner = prod(x->shape, d + 1, x->ndim);
    return true;
}

static ct_tensor *softmax_fwd(const char *op, ct_op id, ct_tensor *x, int dim, bool lg) {
    cti_softmax_params p;
    if (cti_check_not_null(op, 1, &x) || cti_check_floating(op, x, "x") ||
        !softmax_geom(op, x, dim, lg, &p))
        return NULL;
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, id);
    ct_tensor *out = NULL;
    if (!contig(&tp, x, &c.in[0])) goto done;
    c.nin = 1;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x));
    c.nout = 1;
    if (!c.out[0]) goto done;
    cti_call_params(&c, &p);
    if (run(&c, x) == CT_OK)
        out = cti_record_one(&(cti_ag_rec){.name = lg ? "LogSoftmaxBackward" : "SoftmaxBackward",
                                   .backward = lg ? cti_bw_log_softmax : cti_bw_softmax,
                                   .nin = 1,
                                   .in = {x},
                                   .nout = 1,
                                   .out = {c.out[0]},
                                   .nsaved = 1,
                                   .saved = {c.out[0]},
                                   CTI_AG_PARAMS(&p)});
done:
    temps_release(&tp);
    return out;
}

ct_tensor *ct_softmax(ct_tensor *x, int dim) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_SOFTMAX, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_softmax(ac.in[0], dim) : NULL);
    return softmax_fwd("ct_softmax", CT_OP_SOFTMAX, x, dim, false);
}
ct_tensor *ct_log_softmax(ct_tensor *x, int dim) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_LOG_SOFTMAX, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_log_softmax(ac.in[0], dim) : NULL);
    return softmax_fwd("ct_log_softmax", CT_OP_LOG_SOFTMAX, x, dim, true);
}

static ct_tensor *softmax_bwd(const char *op, ct_op id, ct_tensor *grad_y, ct_tensor *y, int dim,
                              bool lg) {
    ct_tensor *req[2] = {grad_y, y};
    cti_softmax_params p;
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req) ||
        cti_check_floating(op, y, "y") ||
        check_shape_eq(op, grad_y, "grad_y", y->ndim, y->shape) ||
        check_same_dtype(op, grad_y, "grad_y", y, "y") || !softmax_geom(op, y, dim, lg, &p))
        return NULL;
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, id);
    ct_tensor *out = NULL;
    if (!contig(&tp, grad_y, &c.in[0]) || !contig(&tp, y, &c.in[1])) goto done;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, y->ndim, y->shape, y->dtype, dev(y));
    c.nout = 1;
    if (!c.out[0]) goto done;
    cti_call_params(&c, &p);
    if (run(&c, y) == CT_OK) out = c.out[0];
done:
    temps_release(&tp);
    return out;
}

ct_tensor *ct_softmax_backward(ct_tensor *grad_y, ct_tensor *y, int dim) {
    return softmax_bwd("ct_softmax_backward", CT_OP_SOFTMAX_BACKWARD, grad_y, y, dim, false);
}
ct_tensor *ct_log_softmax_backward(ct_tensor *grad_y, ct_tensor *y, int dim) {
    return softmax_bwd("ct_log_softmax_backward", CT_OP_LOG_SOFTMAX_BACKWARD, grad_y, y, dim, true);
}

/* ---- classification losses ------------------------------------------------------------------ */

/* input [C] / [N,C] / [N,C,d1,...] against int64 target [] / [N] / [N,d1,...], weight [C];
 * p's geometry (n, c, inner) from input, its reduction checked. */
static ct_status cls_check(const char *op, const ct_tensor *in, const char *in_name,
                           const ct_tensor *target, const ct_tensor *weight,
                           cti_loss_params *p) {
    int reduction = p->reduction;
    if (cti_check_floating(op, in, in_name)) return ct_last_status();
    if (target->dtype != CT_I64)
        return cti_error(CT_ERR_DTYPE, "%s: expected int64 class indices, got %s", op,
                         ct_dtype_name(target->dtype));
    if (reduction != CT_REDUCTION_NONE && reduction != CT_REDUCTION_MEAN &&
        reduction != CT_REDUCTION_SUM)
        return cti_error(CT_ERR_INVALID_ARG, "%s: unknown reduction %d (expected none, mean or sum)",
                         op, reduction);
    if (in->ndim < 1)
        return cti_error(CT_ERR_SHAPE, "%s: %s must have a class dim, got %s", op, in_name,
                         cti_desc(in));
    int64_t want[CT_MAX_DIMS];
    int nw = 0;
    if (in->ndim == 1) {
        p->n = 1;
        p->c = in->shape[0];
        p->inner = 1;
    } else {
        p->n = in->shape[0];
        p->c = in->shape[1];
        p->inner = prod(in->shape, 2, in->ndim);
        want[nw++] = in->shape[0];
        for (int i = 2; i < in->ndim; i++) want[nw++] = in->shape[i];
    }
    if (!same_shape(target->ndim, target->shape, nw, want))
        return cti_error(CT_ERR_SHAPE, "%s: target %s does not match %s %s (expected target shape %s)",
                         op, cti_desc(target), in_name, cti_desc(in), cti_shape_s(nw, want));
    if (weight) {
        if (weight->ndim != 1 || weight->shape[0] != p->c)
            return cti_error(CT_ERR_SHAPE, "%s: weight %s must be 1-d with %lld classes", op,
                             cti_desc(weight), (long long)p->c);
        if (check_same_dtype(op, weight, "weight", in, in_name)) return ct_last_status();
    }
    return CT_OK;
}

/* The loss's shape: target's for none, 0-d otherwise. */
static int loss_ndim(const ct_tensor *target, int reduction) {
    return reduction == CT_REDUCTION_NONE ? target->ndim : 0;
}

/* The dtype of a class loss of input: input's, but float32 when f32_loss asks it for a
 * float16/bfloat16 input (autocast's cross_entropy, cti_autocast_reads_as_is). */
static ct_dtype loss_dtype(const ct_tensor *input, bool f32_loss) {
    bool half = input->dtype == CT_F16 || input->dtype == CT_BF16;
    return f32_loss && half ? CT_F32 : input->dtype;
}

static ct_status check_grad_loss(const char *op, const ct_tensor *gl, const ct_tensor *ref,
                                 int nd, const int64_t *shape, bool f32_loss) {
    if (check_shape_eq(op, gl, "grad_loss", nd, shape)) return ct_last_status();
    /* f32_loss: the caller took the float32 of grad_loss for the loss's dtype */
    return f32_loss ? CT_OK : check_same_dtype(op, gl, "grad_loss", ref, "input");
}

static ct_status check_smoothing(const char *op, double ls) {
    if (ls >= 0 && ls <= 1) return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG, "%s: label_smoothing must be in [0, 1], got %g", op, ls);
}

/* Shared body: forward (grad_loss NULL) or backward of cross_entropy / nll_loss. p holds
 * the reduction, ignore_index and label_smoothing; the geometry is filled in here.
 * stats (cross_entropy only; NULL: none): the forward allocates the row statistics
 * (schema.h) into *stats, the backward reads *stats when it is not NULL. f32_loss: the
 * loss (and grad_loss) is float32 for a float16/bfloat16 input, the kernel reading the
 * input as it is (loss_dtype). */
static ct_tensor *cls_loss(const char *op, ct_op id, ct_tensor *grad_loss, ct_tensor *input,
                           const char *in_name, ct_tensor *target, ct_tensor *weight,
                           cti_loss_params *p, ct_tensor **stats, bool f32_loss) {
    bool bwd = grad_loss != NULL;
    ct_tensor *all[4] = {input, target, weight, grad_loss};
    int reduction = p->reduction;
    if (cti_check_not_null(op, 2, all) || cti_check_same_device(op, 4, all) ||
        cls_check(op, input, in_name, target, weight, p) ||
        check_smoothing(op, p->label_smoothing))
        return NULL;
    if (bwd && check_grad_loss(op, grad_loss, input, loss_ndim(target, reduction), target->shape,
                               f32_loss))
        return NULL;
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, id);
    ct_tensor *out = NULL;
    int k = 0;
    if (bwd && !contig(&tp, grad_loss, &c.in[k++])) goto done;
    if (!contig(&tp, input, &c.in[k++]) || !contig(&tp, target, &c.in[k++]) ||
        !contig(&tp, weight, &c.in[k++]))
        goto done;
    if (bwd && stats && *stats) c.in[k++] = *stats;
    c.nin = k;
    if (bwd) c.out[0] = cti_tensor_new(op, input->ndim, input->shape, input->dtype, dev(input));
    else c.out[0] = cti_tensor_new(op, loss_ndim(target, reduction), target->shape,
                                   loss_dtype(input, f32_loss), dev(input));
    c.nout = 1;
    if (!c.out[0]) goto done;
    if (!bwd && stats) {
        int64_t ns = p->n * p->inner + 1;
        ct_dtype acc = input->dtype == CT_F64 ? CT_F64 : CT_F32;
        if (!(c.out[c.nout++] = cti_tensor_new(op, 1, &ns, acc, dev(input)))) {
            cti_call_release_outputs(&c);
            goto done;
        }
    }
    cti_call_params(&c, p);
    if (run(&c, input) == CT_OK) {
        out = c.out[0];
        if (!bwd && stats) *stats = c.out[1];
    }
done:
    temps_release(&tp);
    return out;
}

/* Records a classification loss: a gradient flows to the input only (as in
 * PyTorch, none to the class indices or the class weights). */
static ct_tensor *cls_record(const char *name, cti_backward_fn bw, ct_tensor *out,
                             ct_tensor *input, ct_tensor *target, ct_tensor *weight,
                             const cti_loss_params *p) {
    return cti_record_one(&(cti_ag_rec){.name = name,
                                .backward = bw,
                                .nin = 1,
                                .in = {input},
                                .nout = 1,
                                .out = {out},
                                .nsaved = 3,
                                .saved = {input, target, weight},
                                CTI_AG_PARAMS(p)});
}

/* A class loss's parameters as its caller gives them; cls_loss adds the geometry. */
static cti_loss_params cls_params(ct_reduction reduction, int64_t ignore_index, double ls) {
    return (cti_loss_params){
        .reduction = (int)reduction, .ignore_index = ignore_index, .label_smoothing = ls};
}

/* With autograd on, the forward also keeps each position's log-sum-exp and
 * the mean's weight sum (the row statistics, schema.h; PyTorch keeps the
 * whole log_softmax), so the backward is one pass over the logits with no
 * reduction left in it. */
ct_tensor *ct_cross_entropy(ct_tensor *logits, ct_tensor *target, ct_tensor *weight,
                            ct_reduction reduction, int64_t ignore_index, double label_smoothing) {
    /* Class probabilities where PyTorch takes them: a floating target of the
     * logits' shape (another shape is refused below as indices of the wrong
     * dtype, as PyTorch does). */
    if (logits && target && ct_dtype_is_floating(target->dtype) && logits->ndim == target->ndim &&
        memcmp(logits->shape, target->shape, sizeof(int64_t) * (size_t)logits->ndim) == 0) {
        if (ignore_index >= 0)
            return cti_error_null(CT_ERR_INVALID_ARG,
                                  "ct_cross_entropy: ignore_index is not supported for floating "
                                  "point target, got %lld",
                                  (long long)ignore_index);
        return ct_cross_entropy_prob(logits, target, weight, reduction, label_smoothing);
    }
    /* In a region, float16/bfloat16 logits without class weights go to the kernel as they
     * are: it computes in float32 and returns the float32 loss the policy's cast would give,
     * and its backward writes their gradient in their dtype, rounded once: what the cast
     * and the cast of the gradient back give, without the two passes. */
    bool f32_loss = !weight && cti_autocast_reads_as_is(logits);
    cti_autocast_call ac;
    if (!f32_loss &&
        cti_autocast_begin_op(&ac, CTI_AC_CROSS_ENTROPY, 2, (ct_tensor *[]){logits, weight}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_cross_entropy(ac.in[0], target, ac.in[1],
                                                                 reduction, ignore_index,
                                                                 label_smoothing)
                                              : NULL);
    cti_loss_params p = cls_params(reduction, ignore_index, label_smoothing);
    ct_tensor *ins[1] = {logits}, *stats = NULL;
    bool keep = logits && cti_ag_needed(1, ins);
    ct_tensor *out = cls_loss("ct_cross_entropy", CT_OP_CROSS_ENTROPY, NULL, logits, "logits",
                              target, weight, &p, keep ? &stats : NULL, f32_loss);
    if (!out || !keep) return out;
    out = cti_record_one(&(cti_ag_rec){.name = "CrossEntropyBackward",
                               .backward = cti_bw_cross_entropy,
                               .nin = 1,
                               .in = {logits},
                               .nout = 1,
                               .out = {out},
                               .nsaved = 4,
                               .saved = {logits, target, weight, stats},
                               CTI_AG_PARAMS(&p)});
    ct_tensor_release(stats);
    return out;
}

ct_tensor *cti_cross_entropy_backward_saved(ct_tensor *grad_loss, ct_tensor *logits,
                                            ct_tensor *target, ct_tensor *weight,
                                            ct_tensor *stats, const cti_loss_params *lp) {
    const char *op = "ct_cross_entropy_backward";
    if (cti_check_not_null(op, 1, &grad_loss)) return NULL;
    cti_loss_params p = cls_params((ct_reduction)lp->reduction, lp->ignore_index,
                                   lp->label_smoothing);
    /* a float32 gradient for float16/bfloat16 logits: the loss was autocast's float32 one */
    bool f32_loss = logits && grad_loss->dtype == CT_F32 && loss_dtype(logits, true) == CT_F32;
    return cls_loss(op, CT_OP_CROSS_ENTROPY_BACKWARD, grad_loss, logits, "logits", target,
                    weight, &p, &stats, f32_loss);
}

ct_tensor *ct_cross_entropy_backward(ct_tensor *grad_loss, ct_tensor *logits, ct_tensor *target,
                                     ct_tensor *weight, ct_reduction reduction,
                                     int64_t ignore_index, double label_smoothing) {
    const char *op = "ct_cross_entropy_backward";
    if (cti_check_not_null(op, 1, &grad_loss)) return NULL;
    cti_loss_params p = cls_params(reduction, ignore_index, label_smoothing);
    return cls_loss(op, CT_OP_CROSS_ENTROPY_BACKWARD, grad_loss, logits, "logits", target,
                    weight, &p, NULL, false);
}

ct_tensor *ct_nll_loss(ct_tensor *log_probs, ct_tensor *target, ct_tensor *weight,
                       ct_reduction reduction, int64_t ignore_index) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_NLL_LOSS, 2, (ct_tensor *[]){log_probs, weight}))
        return cti_autocast_end_op(
            &ac, ac.ok ? ct_nll_loss(ac.in[0], target, ac.in[1], reduction, ignore_index) : NULL);
    cti_loss_params p = cls_params(reduction, ignore_index, 0.0);
    ct_tensor *out = cls_loss("ct_nll_loss", CT_OP_NLL_LOSS, NULL, log_probs, "log_probs", target,
                              weight, &p, NULL, false);
    return cls_record("NllLossBackward", cti_bw_nll_loss, out, log_probs, target, weight, &p);
}

ct_tensor *ct_nll_loss_backward(ct_tensor *grad_loss, ct_tensor *log_probs, ct_tensor *target,
                                ct_tensor *weight, ct_reduction reduction, int64_t ignore_index) {
    const char *op = "ct_nll_loss_backward";
    if (cti_check_not_null(op, 1, &grad_loss)) return NULL;
    cti_loss_params p = cls_params(reduction, ignore_index, 0.0);
    return cls_loss(op, CT_OP_NLL_LOSS_BACKWARD, grad_loss, log_probs, "log_probs", target, weight,
                    &p, NULL, false);
}

/* ---- mse -------------------------------------------------------------------------------------- */

/* input and target broadcast together (PyTorch warns there; here it is the rule). */
static ct_status mse_check(const char *op, ct_tensor *input, ct_tensor *target, int reduction,
                           int *nb, int64_t *bshape) {
    if (cti_check_floating(op, input, "input") ||
        check_same_dtype(op, target, "target", input, "input"))
        return ct_last_status();
    if (reduction != CT_REDUCTION_NONE && reduction != CT_REDUCTION_MEAN &&
        reduction != CT_REDUCTION_SUM)
        return cti_error(CT_ERR_INVALID_ARG, "%s: unknown reduction %d (expected none, mean or sum)",
                         op, reduction);
    return cti_broadcast_shapes(op, input->ndim, input->shape, target->ndim, target->shape, nb,
                                bshape);
}

/* t broadcast to shape and made contiguous, kept in tp. */
static bool expanded(temps *tp, ct_tensor *t, int nb, const int64_t *bshape, ct_tensor **out) {
    if (same_shape(t->ndim, t->shape, nb, bshape)) return contig(tp, t, out);
    ct_tensor *e = ct_expand(t, nb, bshape);
    if (!e) return false;
    tp->t[tp->n++] = e;
    return contig(tp, e, out);
}

/* A floating input with a target of another numeric dtype: both in their
 * promoted dtype (PyTorch's result type), as new handles in *pi and *pt;
 * false when no promotion applies or a cast failed (*pi NULL then too). */
static bool mse_promoted(ct_tensor *input, ct_tensor *target, ct_tensor **pi, ct_tensor **pt) {
    *pi = *pt = NULL;
    if (!ct_dtype_is_floating(input->dtype) || target->dtype == input->dtype ||
        target->dtype == CT_BOOL)
        return false;
    ct_dtype dt = ct_promote_types(input->dtype, target->dtype);
    *pi = ct_to_dtype(input, dt);
    *pt = *pi ? ct_to_dtype(target, dt) : NULL;
    if (*pt) return true;
    ct_tensor_release(*pi);
    *pi = NULL;
    return true;
}

ct_tensor *ct_mse_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction) {
    const char *op = "ct_mse_loss";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_MSE_LOSS, 2, (ct_tensor *[]){input, target}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_mse_loss(ac.in[0], ac.in[1], reduction) : NULL);
    ct_tensor *req[2] = {input, target};
    int nb;
    int64_t bs[CT_MAX_DIMS];
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req)) return NULL;
    ct_tensor *pi, *pt;
    if (mse_promoted(input, target, &pi, &pt)) {
        ct_tensor *r = pi ? ct_mse_loss(pi, pt, reduction) : NULL;
        ct_tensor_release(pi);
        ct_tensor_release(pt);
        return r;
    }
    if (mse_check(op, input, target, (int)reduction, &nb, bs)) return NULL;
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_MSE_LOSS);
    ct_tensor *out = NULL;
    if (!expanded(&tp, input, nb, bs, &c.in[0]) || !expanded(&tp, target, nb, bs, &c.in[1]))
        goto done;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, reduction == CT_REDUCTION_NONE ? nb : 0, bs, input->dtype, dev(input));
    c.nout = 1;
    if (!c.out[0]) goto done;
    cti_loss_params p = {.n = prod(bs, 0, nb), .reduction = (int)reduction};
    cti_call_params(&c, &p);
    if (run(&c, input) == CT_OK)
        out = cti_record_one(&(cti_ag_rec){.name = "MseLossBackward",
                                   .backward = cti_bw_mse_loss,
                                   .nin = 2,
                                   .in = {input, target},
                                   .nout = 1,
                                   .out = {c.out[0]},
                                   .nsaved = 2,
                                   .saved = {input, target},
                                   CTI_AG_PARAMS(&p)});
done:
    temps_release(&tp);
    return out;
}

/* Sums g [nb dims] over the dims where input's shape broadcast, giving input's shape. */
static ct_tensor *sum_to_shape(ct_tensor *g, const ct_tensor *input) {
    int nb = g->ndim, lead = nb - input->ndim;
    int64_t dims[CT_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < nb; i++)
        if (i < lead || (input->shape[i - lead] == 1 && g->shape[i] != 1)) dims[nd++] = i;
    if (nd == 0) return ct_reshape(g, input->ndim, input->shape);
    cti_autocast_hold(); /* the gradient keeps g's dtype in a region too */
    ct_tensor *s = ct_sum(g, nd, dims, true);
    cti_autocast_resume();
    if (!s) return NULL;
    ct_tensor *r = ct_reshape(s, input->ndim, input->shape);
    ct_tensor_release(s);
    return r;
}

ct_tensor *ct_mse_loss_backward(ct_tensor *grad_loss, ct_tensor *input, ct_tensor *target,
                                ct_reduction reduction) {
    const char *op = "ct_mse_loss_backward";
    ct_tensor *req[3] = {grad_loss, input, target};
    int nb;
    int64_t bs[CT_MAX_DIMS];
    if (cti_check_not_null(op, 3, req) || cti_check_same_device(op, 3, req)) return NULL;
    ct_tensor *pi, *pt;
    if (mse_promoted(input, target, &pi, &pt)) {
        /* The gradient of input comes back in input's dtype. */
        ct_tensor *g = pi ? ct_to_dtype(grad_loss, pi->dtype) : NULL;
        ct_tensor *r = g ? ct_mse_loss_backward(g, pi, pt, reduction) : NULL;
        ct_tensor *out = r ? ct_to_dtype(r, input->dtype) : NULL;
        ct_tensor_release(r);
        ct_tensor_release(g);
        ct_tensor_release(pi);
        ct_tensor_release(pt);
        return out;
    }
    if (mse_check(op, input, target, (int)reduction, &nb, bs) ||
        check_grad_loss(op, grad_loss, input, reduction == CT_REDUCTION_NONE ? nb : 0, bs, false))
        return NULL;
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_MSE_LOSS_BACKWARD);
    ct_tensor *out = NULL;
    if (!contig(&tp, grad_loss, &c.in[0]) || !expanded(&tp, input, nb, bs, &c.in[1]) ||
        !expanded(&tp, target, nb, bs, &c.in[2]))
        goto done;
    c.nin = 3;
    c.out[0] = cti_tensor_new(op, nb, bs, input->dtype, dev(input));
    c.nout = 1;
    if (!c.out[0]) goto done;
    cti_loss_params p = {.n = prod(bs, 0, nb), .reduction = (int)reduction};
    cti_call_params(&c, &p);
    if (run(&c, input) != CT_OK) goto done;
    if (same_shape(nb, bs, input->ndim, input->shape)) {
        out = c.out[0];
    } else {
        out = sum_to_shape(c.out[0], input);
        ct_tensor_release(c.out[0]);
    }
done:
    temps_release(&tp);
    return out;
}

/* ---- embedding ------------------------------------------------------------------------------- */

static ct_status check_indices_dtype(const char *op, const ct_tensor *idx) {
    if (idx->dtype == CT_I64 || idx->dtype == CT_I32) return CT_OK;
    return cti_error(CT_ERR_DTYPE, "%s: expected int64 or int32 indices, got %s", op,
                     ct_dtype_name(idx->dtype));
}

ct_tensor *ct_embedding(ct_tensor *weight, ct_tensor *indices) {
    const char *op = "ct_embedding";
    ct_tensor *req[2] = {weight, indices};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req) ||
        check_indices_dtype(op, indices))
        return NULL;
    if (weight->ndim != 2)
        return cti_error_null(CT_ERR_SHAPE, "%s: weight must be 2-d [num_embeddings, dim], got %s",
                              op, cti_desc(weight));
    if (indices->ndim + 1 > CT_MAX_DIMS)
        return cti_error_null(CT_ERR_SHAPE, "%s: indices %s leave no room for the embedding dim",
                              op, cti_desc(indices));
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
    shape[indices->ndim] = weight->shape[1];
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_EMBEDDING);
    ct_tensor *out = NULL;
    if (!contig(&tp, weight, &c.in[0]) || !contig(&tp, indices, &c.in[1])) goto done;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, indices->ndim + 1, shape, weight->dtype, dev(weight));
    c.nout = 1;
    if (!c.out[0]) goto done;
    /* The formula reads num_weights and padding_idx (none: the forward has no padding). */
    cti_embedding_params p = {.num_weights = weight->shape[0],
                              .d = weight->shape[1],
                              .n = cti_numel(indices->ndim, indices->shape),
                              .padding_idx = -1};
    cti_call_params(&c, &p);
    if (run(&c, weight) == CT_OK)
        out = cti_record_one(&(cti_ag_rec){.name = "EmbeddingBackward",
                                   .backward = cti_bw_embedding,
                                   .nin = 1,
                                   .in = {weight},
                                   .nout = 1,
                                   .out = {c.out[0]},
                                   .nsaved = 1,
                                   .saved = {indices},
                                   CTI_AG_PARAMS(&p)});
done:
    temps_release(&tp);
    return out;
}

ct_tensor *ct_embedding_backward(ct_tensor *grad_out, ct_tensor *indices, int64_t num_weights,
                                 int64_t padding_idx) {
    const char *op = "ct_embedding_backward";
    ct_tensor *req[2] = {grad_out, indices};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req) ||
        check_indices_dtype(op, indices) || cti_check_floating(op, grad_out, "grad_out"))
        return NULL;
    if (num_weights < 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: num_weights must be >= 0, got %lld", op,
                              (long long)num_weights);
    if (padding_idx < -1 || padding_idx >= num_weights)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: padding_idx %lld out of range (expected -1 for none or 0..%lld)",
                              op, (long long)padding_idx, (long long)(num_weights - 1));
    if (grad_out->ndim != indices->ndim + 1 ||
        !same_shape(indices->ndim, indices->shape, indices->ndim, grad_out->shape))
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: grad_out %s must have the indices' shape %s plus the embedding dim",
                              op, cti_desc(grad_out), cti_shape_s(indices->ndim, indices->shape));
    int64_t d = grad_out->shape[grad_out->ndim - 1];
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_EMBEDDING_BACKWARD);
    ct_tensor *out = NULL;
    if (!contig(&tp, grad_out, &c.in[0]) || !contig(&tp, indices, &c.in[1])) goto done;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, 2, (const int64_t[]){num_weights, d}, grad_out->dtype, dev(grad_out));
    c.nout = 1;
    if (!c.out[0]) goto done;
    cti_embedding_params p = {.num_weights = num_weights,
                              .d = d,
                              .n = cti_numel(indices->ndim, indices->shape),
                              .padding_idx = padding_idx};
    cti_call_params(&c, &p);
    if (run(&c, grad_out) == CT_OK) out = c.out[0];
done:
    temps_release(&tp);
    return out;
}

/* ---- dropout ------------------------------------------------------------------------------ */

static ct_status check_p(const char *op, double p) {
    if (p >= 0 && p <= 1) return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG, "%s: dropout probability p must be in [0, 1], got %g", op, p);
}

ct_tensor *ct_dropout(ct_tensor *x, double p, bool train, ct_generator *gen, ct_tensor **mask) {
    const char *op = "ct_dropout";
    if (cti_check_not_null(op, 1, &x) || cti_check_floating(op, x, "x") || check_p(op, p))
        return NULL;
    int64_t n = cti_numel(x->ndim, x->shape);
    cti_dropout_params dp = {.n = n, .p = p};
    /* Identity: no mask (ct_dropout_backward takes NULL). */
    if (!train || p == 0) {
        /* x itself, as PyTorch returns it: a view of x for in-place writes. */
        ct_tensor *y = cti_ag_view_link(x, cti_record_one(&(cti_ag_rec){.name = "DropoutBackward",
                                            .backward = cti_bw_dropout,
                                            .nin = 1,
                                            .in = {x},
                                            .nout = 1,
                                            .out = {alias(x)},
                                            .nsaved = 1,
                                            .saved = {NULL},
                                            CTI_AG_PARAMS(&dp)}));
        if (y && mask) *mask = NULL;
        return y;
    }
    /* The backward needs the mask even when the caller does not. */
    bool want_mask = mask || cti_ag_needed(1, &x);
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_DROPOUT);
    ct_tensor *out = NULL;
    if (!contig(&tp, x, &c.in[0])) goto done;
    c.nin = 1;
    c.nout = 2;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x));
    c.out[1] = want_mask ? cti_tensor_new(op, x->ndim, x->shape, CT_BOOL, dev(x)) : NULL;
    if (!c.out[0] || (want_mask && !c.out[1])) {
        cti_call_release_outputs(&c);
        goto done;
    }
    ct_generator *g = gen ? gen : ct_generator_default();
    dp.seed = ct_generator_seed(g);
    dp.offset = ct_generator_reserve(g, (uint64_t)n);
    cti_call_params(&c, &dp);
    if (run(&c, x) != CT_OK) goto done;
    out = cti_record_one(&(cti_ag_rec){.name = "DropoutBackward",
                               .backward = cti_bw_dropout,
                               .nin = 1,
                               .in = {x},
                               .nout = 1,
                               .out = {c.out[0]},
                               .nsaved = 1,
                               .saved = {c.out[1]},
                               CTI_AG_PARAMS(&dp)});
    if (out && mask) *mask = c.out[1];
    else ct_tensor_release(c.out[1]);
done:
    temps_release(&tp);
    return out;
}

ct_tensor *ct_dropout_backward(ct_tensor *grad_y, ct_tensor *mask, double p) {
    const char *op = "ct_dropout_backward";
    if (cti_check_not_null(op, 1, &grad_y) || cti_check_floating(op, grad_y, "grad_y") ||
        check_p(op, p))
        return NULL;
    /* The forward was the identity (eval mode or p == 0). */
    if (!mask) return alias(grad_y);
    ct_tensor *req[2] = {grad_y, mask};
    if (cti_check_same_device(op, 2, req) ||
        check_shape_eq(op, mask, "mask", grad_y->ndim, grad_y->shape))
        return NULL;
    if (mask->dtype != CT_BOOL)
        return cti_error_null(CT_ERR_DTYPE, "%s: mask must be bool, got %s", op,
                              ct_dtype_name(mask->dtype));
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_DROPOUT_BACKWARD);
    ct_tensor *out = NULL;
    if (!contig(&tp, grad_y, &c.in[0]) || !contig(&tp, mask, &c.in[1])) goto done;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, grad_y->ndim, grad_y->shape, grad_y->dtype, dev(grad_y));
    c.nout = 1;
    if (!c.out[0]) goto done;
    cti_dropout_params dp = {.n = cti_numel(grad_y->ndim, grad_y->shape), .p = p};
    cti_call_params(&c, &dp);
    if (run(&c, grad_y) == CT_OK) out = c.out[0];
done:
    temps_release(&tp);
    return out;
}
