/* Activation checkpointing (ct_activation_checkpoint, torch.utils.checkpoint's
 * reentrant form): the forward runs the function without recording and the
 * node keeps only its inputs; the node's formula runs the function again,
 * recording, on detached copies of the inputs, in the autocast state of the
 * forward, and backpropagates the node's gradient through that graph with a
 * backward of its own. The parameters the function reads are leaves of the
 * inner graph, so their gradients accumulate as without checkpointing; the
 * inputs' gradients are the node's. */
#include "formulas.h"

typedef struct ckpt_params {
    ct_activation_checkpoint_fn fn;
    void *ctx;
    /* the autocast state of the forward, per device type */
    bool autocast[CT_NUM_DEVICE_TYPES];
    ct_dtype autocast_dtype[CT_NUM_DEVICE_TYPES];
} ckpt_params;

/* fn(ctx, inputs) inside a scope of its own, which frees fn's temporaries
 * and keeps its result (a new reference, or NULL with the error set). */
static ct_tensor *run_fn(const ckpt_params *p, int n, ct_tensor *const *inputs) {
    ct_scope *sc = ct_scope_begin();
    ct_tensor *out = p->fn(p->ctx, n, inputs);
    if (out) ct_keep(out);
    ct_scope_end(sc);
    return out;
}

/* Reopens the forward's autocast regions (the engine closed them for the
 * backward); returns how many it opened, or -1 with the error set and none
 * left open. */
static int autocast_reopen(const ckpt_params *p) {
    int opened = 0;
    for (int t = 0; t < CT_NUM_DEVICE_TYPES; t++) {
        if (!p->autocast[t]) continue;
        if (ct_autocast_begin((ct_device){(ct_device_type)t, 0}, p->autocast_dtype[t]) != CT_OK) {
            while (opened--) ct_autocast_end();
            return -1;
        }
        opened++;
    }
    return opened;
}

/* The function's result again, on leaves that stand for the inputs: xs[k]
 * a detached alias of saved input k, requiring grad where the node needs
 * its gradient. Runs in grad mode and the forward's autocast state. */
static ct_tensor *rerun(cti_node *n, const ckpt_params *p, ct_tensor **xs, ct_status *st) {
    for (int k = 0; k < n->nsaved; k++) {
        ct_tensor *t = cti_ag_saved(n, k, st);
        if (*st != CT_OK) return NULL;
        xs[k] = ct_detach(t);
        if (!xs[k] || (n->needs[k] && (*st = ct_requires_grad_(xs[k], true)) != CT_OK)) {
            *st = ct_last_status();
            return NULL;
        }
    }
    bool prev = ct_set_grad_enabled(true);
    int opened = autocast_reopen(p);
    ct_tensor *y = opened < 0 ? NULL : run_fn(p, n->nsaved, xs);
    while (opened-- > 0) ct_autocast_end();
    ct_set_grad_enabled(prev);
    if (!y) {
        *st = cti_error_wrap(CT_ERR_AUTOGRAD,
                             "ct_backward: ct_activation_checkpoint's function failed when run "
                             "again");
        return NULL;
    }
    bool same = y->dtype == n->out_dtype[0] && y->ndim == n->out_ndim[0];
    for (int d = 0; same && d < y->ndim; d++) same = y->shape[d] == n->out_shape[0][d];
    if (!same) {
        *st = cti_error(CT_ERR_AUTOGRAD,
                        "ct_backward: ct_activation_checkpoint's function gave %s when run "
                        "again, a %s tensor of %s the first time (it must compute the same each "
                        "time)",
                        cti_desc(y), ct_dtype_name(n->out_dtype[0]),
                        cti_shape_s(n->out_ndim[0], n->out_shape[0]));
        ct_tensor_release(y);
        return NULL;
    }
    return y;
}

static CTI_BW(bw_checkpoint) {
    if (!go[0]) return CT_OK;
    const ckpt_params *p = CTI_NODE_PARAMS(n, ckpt_params);
    ct_tensor *xs[CTI_AG_MAX_SAVED] = {NULL};
    ct_status st = CT_OK;
    ct_tensor *y = rerun(n, p, xs, &st);
    /* y without history: nothing the node needs reached it (the inputs that
     * need gradients were not used), so their gradients are zero (NULL) */
    if (y && ct_requires_grad(y)) st = ct_backward(y, go[0], false);
    for (int k = 0; st == CT_OK && k < n->nsaved; k++) {
        ct_tensor *g = n->needs[k] && xs[k] ? ct_grad(xs[k]) : NULL;
        gi[k] = g ? ct_tensor_retain(g) : NULL;
    }
    ct_tensor_release(y);
    for (int k = 0; k < n->nsaved; k++) ct_tensor_release(xs[k]);
    return st;
}

ct_tensor *ct_activation_checkpoint(ct_activation_checkpoint_fn fn, void *ctx, int n,
                                    ct_tensor *const *inputs) {
    static const char op[] = "ct_activation_checkpoint";
    if (!fn) return cti_error_null(CT_ERR_INVALID_ARG, "%s: fn is NULL", op);
    if (n < 0 || n > CTI_AG_MAX_SAVED)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: takes 0 to %d inputs, got %d", op,
                              CTI_AG_MAX_SAVED, n);
    if (n && !inputs) return cti_error_null(CT_ERR_INVALID_ARG, "%s: inputs is NULL", op);
    for (int k = 0; k < n; k++)
        if (!inputs[k])
            return cti_error_null(CT_ERR_INVALID_ARG, "%s: input %d is NULL", op, k);
    ckpt_params p = {.fn = fn, .ctx = ctx};
    /* Nothing to save the memory of: fn records as any code does. */
    if (!cti_ag_needed(n, inputs)) return run_fn(&p, n, inputs);
    for (int t = 0; t < CT_NUM_DEVICE_TYPES; t++) {
        ct_device d = {(ct_device_type)t, 0};
        p.autocast[t] = ct_autocast_enabled(d);
        p.autocast_dtype[t] = ct_autocast_dtype(d);
    }
    bool prev = ct_set_grad_enabled(false);
    ct_tensor *res = run_fn(&p, n, inputs);
    ct_set_grad_enabled(prev);
    if (!res) return NULL;
    /* A handle of its own: the node's output must not be one of the inputs
     * (fn may return an input's view, or the input itself retained). */
    ct_tensor *out = cti_tensor_view(res, res->ndim, res->shape, res->stride, res->offset);
    ct_tensor_release(res);
    if (!out) return NULL;
    cti_ag_rec r = {.name = "CheckpointBackward", .backward = bw_checkpoint, .nin = n,
                    .nout = 1, .out = {out}, .nsaved = n, CTI_AG_PARAMS(&p)};
    for (int k = 0; k < n; k++) r.in[k] = r.saved[k] = inputs[k];
    if (cti_ag_record(&r) != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return out;
}
