/* Front ends of the reductions: argument checks, result dtype and shape, and
 * the call record of src/backends/cpu/reduce.c's kernel interface (the
 * reduced dims as cti_reduce_params' mask, the output contiguous over the
 * kept dims). */
#include <math.h>

#include "ops_impl.h"
#include "tensor/ops.h"

typedef enum rkind {
    RK_SUM, RK_MEAN, RK_PROD, RK_VAR, RK_STD, RK_NORM, RK_MAX, RK_MIN, RK_ARGMAX, RK_ARGMIN
} rkind;

/* Turns a dims list into a bitmask of x's dims (an empty list: all of them).
 * A 0-d tensor accepts dim 0 and -1, as PyTorch, and reduces nothing. */
static ct_status parse_dims(const char *op, const ct_tensor *x, int ndims, const int64_t *dims,
                            uint32_t *mask) {
    int nd = x->ndim;
    if (ndims < 0)
        return cti_error(CT_ERR_INVALID_ARG, "%s: negative number of dims (%d)", op, ndims);
    if (ndims > 0 && !dims)
        return cti_error(CT_ERR_INVALID_ARG, "%s: dims is NULL but ndims is %d", op, ndims);
    if (ndims == 0) {
        *mask = nd ? (uint32_t)((1u << nd) - 1) : 0;
        return CT_OK;
    }
    int span = nd ? nd : 1;
    uint32_t seen = 0;
    for (int k = 0; k < ndims; k++) {
        int64_t d = dims[k];
        if (d < -span || d >= span)
            return cti_error(CT_ERR_INDEX,
                             "%s: dim %lld out of range for a %d-d tensor of shape %s "
                             "(expected %d..%d)",
                             op, (long long)d, nd, cti_shape_s(nd, x->shape), -span, span - 1);
        int w = (int)(d < 0 ? d + span : d);
        if (seen >> w & 1)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: dim %d appears multiple times in the list of dims", op, w);
        seen |= 1u << w;
    }
    *mask = nd ? seen : 0;
    return CT_OK;
}

static bool needs_float(rkind k) {
    return k == RK_MEAN || k == RK_VAR || k == RK_STD || k == RK_NORM;
}

static bool is_extreme(rkind k) {
    return k == RK_MAX || k == RK_MIN || k == RK_ARGMAX || k == RK_ARGMIN;
}

static ct_op kind_op(rkind k) {
    switch (k) {
    case RK_SUM: return CT_OP_SUM;
    case RK_MEAN: return CT_OP_MEAN;
    case RK_PROD: return CT_OP_PROD;
    case RK_VAR:
    case RK_STD: return CT_OP_VAR;
    case RK_NORM: return CT_OP_NORM;
    case RK_MAX: return CT_OP_MAX;
    case RK_MIN: return CT_OP_MIN;
    case RK_ARGMAX: return CT_OP_ARGMAX;
    default: return CT_OP_ARGMIN;
    }
}

/* One node of input x and output out, saving s0 and s1 (the first nsaved
 * of them) and keeping the call's params. */
static ct_status record_node(const char *name, cti_backward_fn bw, ct_tensor *x, ct_tensor *out,
                             int nsaved, ct_tensor *s0, ct_tensor *s1,
                             const cti_reduce_params *p) {
    return cti_ag_record(&(cti_ag_rec){.name = name, .backward = bw, .nin = 1, .in = {x},
                                       .nout = 1, .out = {out}, .nsaved = nsaved,
                                       .saved = {s0, s1}, CTI_AG_PARAMS(p)});
}

/* Records out = kind(x) for autograd. Every node keeps the call's params
 * (the reduced dims, keepdim, the correction or p); the saved tensors and
 * params each formula reads are listed in src/autograd/formulas_reduce.c.
 * idx: the indices of max/min along a dim. */
static ct_status record(rkind kind, ct_tensor *x, ct_tensor *out, ct_tensor *idx,
                        const cti_reduce_params *p) {
    if (!ct_dtype_is_floating(out->dtype) || !cti_ag_needed(1, &x)) return CT_OK;
    switch (kind) {
    case RK_SUM: return record_node("SumBackward", cti_bw_sum, x, out, 0, NULL, NULL, p);
    case RK_MEAN: return record_node("MeanBackward", cti_bw_mean, x, out, 0, NULL, NULL, p);
    case RK_PROD: return record_node("ProdBackward", cti_bw_prod, x, out, 1, x, NULL, p);
    case RK_VAR: return record_node("VarBackward", cti_bw_var, x, out, 1, x, NULL, p);
    case RK_STD: return record_node("StdBackward", cti_bw_std, x, out, 2, x, out, p);
    case RK_NORM: return record_node("NormBackward", cti_bw_norm, x, out, 2, x, out, p);
    case RK_MAX:
    case RK_MIN: {
        bool mx = kind == RK_MAX;
        if (idx)
            return record_node(mx ? "MaxDimBackward" : "MinDimBackward", cti_bw_max_dim, x, out,
                               1, idx, NULL, p);
        return record_node(mx ? "MaxBackward" : "MinBackward", cti_bw_max_all, x, out, 2, x, out,
                           p);
    }
    default: return CT_OK; /* argmax/argmin: integer results, no gradient */
    }
}

/* The shared front end. param: correction (var/std) or p (norm). indices:
 * where max/min along a dim return their indices, or NULL. by_dim: max/min
 * along a dim (their backward needs the indices even when the caller does
 * not). */
static ct_tensor *reduce(const char *op, rkind kind, ct_tensor *x, int ndims, const int64_t *dims,
                         bool keepdim, double param, ct_tensor **indices, bool by_dim) {
    if (cti_check_not_null(op, 1, &x) != CT_OK) return NULL;
    if (needs_float(kind) && !ct_dtype_is_floating(x->dtype))
        return cti_error_null(CT_ERR_DTYPE, "%s: expected a floating dtype, got %s (input %s)", op,
                              ct_dtype_name(x->dtype), cti_desc(x));
    uint32_t mask = 0;
    if (parse_dims(op, x, ndims, dims, &mask) != CT_OK) return NULL;

    bool empty = false;
    int zdim = -1;
    for (int d = 0; d < x->ndim; d++)
        if ((mask >> d & 1) && x->shape[d] == 0) {
            empty = true;
            if (zdim < 0) zdim = d;
        }
    if (empty && is_extreme(kind))
        return cti_error_null(CT_ERR_SHAPE, "%s: cannot reduce over a zero-size dim %d of %s", op,
                              zdim, cti_shape_s(x->ndim, x->shape));
    if (kind == RK_NORM) {
        if (isnan(param))
            return cti_error_null(CT_ERR_INVALID_ARG, "%s: p is NaN", op);
        if (empty && (param < 0 || param == INFINITY))
            return cti_error_null(CT_ERR_SHAPE,
                                  "%s: cannot compute the %g-norm over the zero-size dim %d of %s "
                                  "(the reduction has no identity)",
                                  op, param, zdim, cti_shape_s(x->ndim, x->shape));
    }

    ct_dtype odt = x->dtype;
    if ((kind == RK_SUM || kind == RK_PROD) && !ct_dtype_is_floating(x->dtype)) odt = CT_I64;
    if (kind == RK_ARGMAX || kind == RK_ARGMIN) odt = CT_I64;

    int ond = 0;
    int64_t oshape[CT_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) {
        if (!(mask >> d & 1)) oshape[ond++] = x->shape[d];
        else if (keepdim) oshape[ond++] = 1;
    }

    bool var = kind == RK_VAR || kind == RK_STD;
    cti_reduce_params p = {.mask = mask,
                           .keepdim = keepdim,
                           .correction = var ? param : 0,
                           .std = kind == RK_STD,
                           .p = kind == RK_NORM ? param : 0};
    ct_call c;
    cti_call_init(&c, kind_op(kind));
    cti_call_params(&c, &p);
    c.in[0] = x;
    c.nin = 1;
    c.out[0] = cti_tensor_new(op, ond, oshape, odt, x->storage->device);
    if (!c.out[0]) return NULL;
    c.nout = 1;
    bool grad_idx = by_dim && ct_dtype_is_floating(x->dtype) && cti_ag_needed(1, &x);
    if ((indices || grad_idx) && (kind == RK_MAX || kind == RK_MIN)) {
        c.out[1] = cti_tensor_new(op, ond, oshape, CT_I64, x->storage->device);
        if (!c.out[1]) {
            cti_call_release_outputs(&c);
            return NULL;
        }
        c.nout = 2;
    }
    if (cti_run(&c, x->storage->device, x->dtype) != CT_OK) {
        cti_call_release_outputs(&c);
        return NULL;
    }
    if (record(kind, x, c.out[0], c.nout == 2 ? c.out[1] : NULL, &p) != CT_OK) {
        cti_call_release_outputs(&c);
        return NULL;
    }
    if (c.nout == 2) {
        if (indices) *indices = c.out[1];
        else ct_tensor_release(c.out[1]); /* the graph keeps its own alias */
    }
    return c.out[0];
}

ct_tensor *ct_sum(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_SUM, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_sum(ac.in[0], ndims, dims, keepdim) : NULL);
    return reduce("ct_sum", RK_SUM, x, ndims, dims, keepdim, 0, NULL, false);
}

ct_tensor *ct_mean(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return reduce("ct_mean", RK_MEAN, x, ndims, dims, keepdim, 0, NULL, false);
}

ct_tensor *ct_prod(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_PROD, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_prod(ac.in[0], ndims, dims, keepdim) : NULL);
    return reduce("ct_prod", RK_PROD, x, ndims, dims, keepdim, 0, NULL, false);
}

ct_tensor *ct_var(ct_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim) {
    return reduce("ct_var", RK_VAR, x, ndims, dims, keepdim, correction, NULL, false);
}

ct_tensor *ct_std(ct_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim) {
    return reduce("ct_std", RK_STD, x, ndims, dims, keepdim, correction, NULL, false);
}

ct_tensor *ct_norm(ct_tensor *x, double p, int ndims, const int64_t *dims, bool keepdim) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_NORM, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_norm(ac.in[0], p, ndims, dims, keepdim) : NULL);
    return reduce("ct_norm", RK_NORM, x, ndims, dims, keepdim, p, NULL, false);
}

ct_tensor *ct_max(ct_tensor *x) {
    return reduce("ct_max", RK_MAX, x, 0, NULL, false, 0, NULL, false);
}

ct_tensor *ct_min(ct_tensor *x) {
    return reduce("ct_min", RK_MIN, x, 0, NULL, false, 0, NULL, false);
}

ct_tensor *ct_max_dim(ct_tensor *x, int dim, bool keepdim, ct_tensor **indices) {
    int64_t d = dim;
    return reduce("ct_max_dim", RK_MAX, x, 1, &d, keepdim, 0, indices, true);
}

ct_tensor *ct_min_dim(ct_tensor *x, int dim, bool keepdim, ct_tensor **indices) {
    int64_t d = dim;
    return reduce("ct_min_dim", RK_MIN, x, 1, &d, keepdim, 0, indices, true);
}

ct_tensor *ct_argmax(ct_tensor *x, int dim, bool keepdim) {
    int64_t d = dim;
    return reduce("ct_argmax", RK_ARGMAX, x, 1, &d, keepdim, 0, NULL, false);
}

ct_tensor *ct_argmin(ct_tensor *x, int dim, bool keepdim) {
    int64_t d = dim;
    return reduce("ct_argmin", RK_ARGMIN, x, 1, &d, keepdim, 0, NULL, false);
}

ct_tensor *ct_argmax_all(ct_tensor *x) {
    return reduce("ct_argmax_all", RK_ARGMAX, x, 0, NULL, false, 0, NULL, false);
}

ct_tensor *ct_argmin_all(ct_tensor *x) {
    return reduce("ct_argmin_all", RK_ARGMIN, x, 0, NULL, false, 0, NULL, false);
}

/* ---- amax / amin ------------------------------------------------------------------------
 * The MAX/MIN kernels over any dims, run without grad, and a node of their
 * own: the gradient is split among the ties of each slice (max()'s formula
 * splits among the ties of the whole tensor). */
static ct_tensor *amax_amin(const char *op, bool mx, ct_tensor *x, int ndims, const int64_t *dims,
                            bool keepdim) {
    if (cti_check_not_null(op, 1, &x) != CT_OK) return NULL;
    uint32_t mask = 0;
    if (parse_dims(op, x, ndims, dims, &mask) != CT_OK) return NULL;
    bool prev = ct_no_grad_begin();
    ct_tensor *out = reduce(op, mx ? RK_MAX : RK_MIN, x, ndims, dims, keepdim, 0, NULL, false);
    ct_no_grad_end(prev);
    if (!out || !ct_dtype_is_floating(x->dtype) || !cti_ag_needed(1, &x)) return out;
    cti_reduce_params p = {.mask = mask, .keepdim = keepdim};
    if (record_node(mx ? "AmaxBackward" : "AminBackward", cti_bw_amax, x, out, 2, x, out, &p) ==
        CT_OK)
        return out;
    ct_tensor_release(out);
    return NULL;
}

ct_tensor *ct_amax(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return amax_amin("ct_amax", true, x, ndims, dims, keepdim);
}

ct_tensor *ct_amin(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return amax_amin("ct_amin", false, x, ndims, dims, keepdim);
}
