/* Running a call from a front end, and the argument checks front ends
 * share. */
#include "ops_impl.h"

/* ---- ops without a backward formula ------------------------------------------------
 * The backward ops are differentiable in PyTorch (double backward); cten has
 * no formulas for them. */
static ct_status refuse_backward(cti_node *n, ct_tensor *const *go, ct_tensor **gi) {
    (void)go;
    (void)gi;
    return cti_error(CT_ERR_AUTOGRAD,
                     "ct_backward: ct_%s has no backward formula (double backward is not "
                     "supported); compute its input without requires_grad or detach it",
                     n->name);
}

static ct_status record_without_formula(const ct_call *c, int nin, ct_tensor *const *in) {
    cti_ag_rec r = {.name = ct_op_name(c->op), .backward = refuse_backward, .nin = nin};
    for (int k = 0; k < nin; k++) r.in[k] = in[k];
    for (int k = 0; k < c->nout; k++)
        if (c->out[k]) r.out[r.nout++] = c->out[k];
    return cti_ag_record(&r);
}

ct_tensor *cti_record_one(const cti_ag_rec *r) {
    ct_tensor *out = r->out[0];
    if (!out || !cti_ag_needed(r->nin, r->in)) return out;
    if (cti_ag_record(r) == CT_OK) return out;
    ct_tensor_release(out);
    return NULL;
}

ct_status cti_run_as(ct_call *c, ct_device device, ct_dtype dtype, int nin,
                     ct_tensor *const *in) {
    ct_status st = cti_dispatch(c, device, dtype);
    if (st == CT_OK && cti_op_schema(c->op)->grad == CTI_GRAD_NOFORMULA && cti_ag_needed(nin, in))
        st = record_without_formula(c, nin, in);
    return st;
}

ct_status cti_run(ct_call *c, ct_device device, ct_dtype dtype) {
    return cti_run_as(c, device, dtype, c->nin, c->in);
}

ct_status cti_check_not_null(const char *op, int n, ct_tensor *const *ts) {
    for (int i = 0; i < n; i++) {
        if (ts[i]) continue;
        /* A NULL argument is usually the result of a failed call nested in
         * this one: keep that call's message, it names the cause. */
        if (ct_last_status() != CT_OK)
            return cti_error(CT_ERR_INVALID_ARG, "%s: argument %d is NULL (last error: %s)", op,
                             i + 1, ct_last_error());
        return cti_error(CT_ERR_INVALID_ARG, "%s: argument %d is NULL", op, i + 1);
    }
    return CT_OK;
}

ct_status cti_check_same_device(const char *op, int n, ct_tensor *const *ts) {
    const ct_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        if (!first) {
            first = ts[i];
            continue;
        }
        if (!ct_device_eq(first->storage->device, ts[i]->storage->device)) {
            char a[32], b[32];
            return cti_error(CT_ERR_DEVICE,
                             "%s: expected all tensors on one device, got %s and %s (%s and %s)",
                             op, ct_device_str(first->storage->device, a, sizeof a),
                             ct_device_str(ts[i]->storage->device, b, sizeof b), cti_desc(first),
                             cti_desc(ts[i]));
        }
    }
    return CT_OK;
}

ct_status cti_check_floating(const char *op, const ct_tensor *t, const char *argname) {
    if (ct_dtype_is_floating(t->dtype)) return CT_OK;
    return cti_error(CT_ERR_DTYPE, "%s: expected a floating dtype for %s, got %s", op, argname,
                     ct_dtype_name(t->dtype));
}

void cti_call_release_outputs(ct_call *c) {
    for (int i = 0; i < c->nout; i++) {
        ct_tensor_release(c->out[i]);
        c->out[i] = NULL;
    }
}

ct_status cti_check_index_fits(const char *op, const ct_tensor *index, const ct_tensor *t,
                               const char *name, int skip) {
    for (int k = 0; k < index->ndim && k < t->ndim; k++) {
        if (k == skip || index->shape[k] <= t->shape[k]) continue;
        char but[32] = "";
        if (skip >= 0) snprintf(but, sizeof but, " but %d", skip);
        return cti_error(CT_ERR_SHAPE,
                         "%s: index %s is larger than %s %s in dim %d (expected index.size(d) <= "
                         "%s.size(d) for every dim d%s)",
                         op, cti_desc(index), name, cti_desc(t), k, name, but);
    }
    return CT_OK;
}

ct_status cti_check_gelu_approx(const char *op, ct_gelu_approx approximate) {
    if (approximate == CT_GELU_NONE || approximate == CT_GELU_TANH) return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG,
                     "%s: approximate must be CT_GELU_NONE or CT_GELU_TANH, got %d", op,
                     (int)approximate);
}
