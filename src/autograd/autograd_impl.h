/* Private: the autograd graph. A node is the backward of one recorded op
 * call: edges to the nodes (or leaves) that produced its inputs, the input
 * geometry, the tensors its formula needs (saved as detached aliases with
 * their storage version) and the op's parameters. */
#ifndef CTEN_AUTOGRAD_IMPL_H
#define CTEN_AUTOGRAD_IMPL_H

#include <stddef.h>

#include "dispatch/dispatch_impl.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

#define CTI_AG_MAX_IN 8 /* at least CTI_CALL_MAX_IN: cti_run records a call's inputs */
#define CTI_AG_MAX_OUT 4
#define CTI_AG_MAX_SAVED 6

typedef struct cti_node cti_node;

/* A backward formula. grads_out[k] is the gradient wrt output k, or NULL when
 * none flowed there. The formula sets grads_in[k] (a new tensor, or NULL for
 * zero) for each input k with n->needs[k]; it may leave a gradient in the
 * broadcast shape of the forward, the engine sums it back to the input's
 * shape and converts it to the input's dtype. Runs in no-grad mode. */
typedef ct_status (*cti_backward_fn)(cti_node *n, ct_tensor *const *grads_out,
                                     ct_tensor **grads_in);

typedef struct cti_edge {
    cti_node *fn;    /* the producer's node (retained), or NULL */
    ct_tensor *leaf; /* or the leaf to accumulate into (retained), or NULL */
    int output_nr;   /* which output of fn */
} cti_edge;

struct cti_node {
    atomic_int refcount;
    const char *name;
    cti_backward_fn backward;
    int nin, nout, nsaved;
    cti_edge next[CTI_AG_MAX_IN];
    bool needs[CTI_AG_MAX_IN];
    int in_ndim[CTI_AG_MAX_IN];
    int64_t in_shape[CTI_AG_MAX_IN][CT_MAX_DIMS];
    ct_dtype in_dtype[CTI_AG_MAX_IN];
    int out_ndim[CTI_AG_MAX_OUT];
    int64_t out_shape[CTI_AG_MAX_OUT][CT_MAX_DIMS];
    ct_dtype out_dtype[CTI_AG_MAX_OUT];
    ct_tensor *saved[CTI_AG_MAX_SAVED];
    unsigned saved_version[CTI_AG_MAX_SAVED];
    bool released; /* saved tensors freed by a backward without retain_graph */
    /* A copy of the op's parameter struct, read with CTI_NODE_PARAMS. */
    _Alignas(max_align_t) unsigned char params[CTI_PARAMS_MAX];
    size_t params_size;
    /* engine scratch */
    int deps;
    bool queued;
    ct_tensor *acc[CTI_AG_MAX_OUT];
};

struct ct_autograd_meta {
    bool requires_grad;
    ct_tensor *grad;
    cti_node *grad_fn;
    int output_nr;
    /* A leaf's post-accumulate-grad hook (ct_set_post_accumulate_grad_hook)
     * and, for the backward under way, how many of its edges are still to
     * deliver a gradient: the engine counts them when it collects the graph
     * (hook_pass names that backward, so counts of an earlier backward that
     * failed midway are not taken over) and calls the hook when the last
     * one has been accumulated. */
    ct_grad_hook_fn hook;
    void *hook_ctx;
    uint64_t hook_pass;
    int64_t hook_pending;
};

/* Grad mode on and any of the n tensors (NULLs skipped) requires grad. */
bool cti_ag_needed(int n, ct_tensor *const *ts);

/* What cti_ag_record records, by name:
 *   cti_ag_record(&(cti_ag_rec){.name = "MulBackward", .backward = cti_bw_mul,
 *                               .nin = 2, .in = {a, b}, .nout = 1, .out = {out},
 *                               .nsaved = 2, .saved = {sa, sb}, CTI_AG_PARAMS(&p)});
 * in: the op's inputs (NULL for an absent optional one); inputs that do not
 * require grad get no edge. saved: what the formula reads (detached aliases
 * are kept with their storage version; NULL entries allowed). params: the
 * parameter struct the formula reads with CTI_NODE_PARAMS, copied. */
typedef struct cti_ag_rec {
    const char *name;
    cti_backward_fn backward;
    int nin, nout, nsaved;
    ct_tensor *in[CTI_AG_MAX_IN];
    ct_tensor *out[CTI_AG_MAX_OUT];
    ct_tensor *saved[CTI_AG_MAX_SAVED];
    const void *params;
    size_t params_size;
} cti_ag_rec;

#define CTI_AG_PARAMS(p) .params = (p), .params_size = sizeof *(p)

/* Records r's outputs as computed from its inputs. On failure (out of
 * memory) returns the error; the outputs are left without history and the
 * caller releases them. */
ct_status cti_ag_record(const cti_ag_rec *r);

/* The node's parameters as the struct T its front end recorded. */
#define CTI_NODE_PARAMS(n, T) ((const T *)cti_node_params_(n, sizeof(T)))
static inline const void *cti_node_params_(const cti_node *n, size_t size) {
    assert(n->params_size == size);
    (void)size;
    return n->params;
}

/* Saved tensor k of n, checked against in-place modification since the
 * forward (error naming the node and the versions). NULL if it was saved as
 * NULL or on error (status in *st). */
ct_tensor *cti_ag_saved(cti_node *n, int k, ct_status *st);

/* Sums g over the dims it was broadcast along so it has shape (ndim, shape).
 * New tensor (a new reference to g when already that shape). */
ct_tensor *cti_sum_to_shape(ct_tensor *g, int ndim, const int64_t *shape);

/* Refuses an in-place op on t when autograd forbids it (a leaf that requires
 * grad, or a tensor with history) in grad mode; op names the caller. */
ct_status cti_ag_check_inplace(const char *op, const ct_tensor *t);

/* In-place ops recorded by autograd (src/ops/inplace.c). What updating t in
 * place with an operand other (NULL for none) needs in grad mode: 0 a plain
 * update (nothing requires grad), 1 a recorded one (t or other requires
 * grad), -1 refused with an error naming op: t a leaf that requires grad
 * (PyTorch's message), or t's memory held by another tensor handle too (a
 * view of t, t's base, or a tensor an earlier node saved for backward):
 * that tensor's history would not see the update, which PyTorch tracks
 * through views (CopySlices) and cten does not. */
int cti_ag_inplace_mode(const char *op, const ct_tensor *t, ct_tensor *other);
/* PyTorch's rebase: t's history becomes src's (src computed t's new values
 * out of place, from a copy of t that carries t's old history). */
ct_status cti_ag_rebase(ct_tensor *t, const ct_tensor *src);

#endif
