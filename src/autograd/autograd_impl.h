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

/* Recomputes a node's single output from the node's own saved tensors and
 * parameters (cti_ag_saved, CTI_NODE_PARAMS), as its forward computed it,
 * bit for bit: a new tensor outside any scope, or NULL with the error set.
 * Runs inside a formula (no-grad mode). */
typedef ct_tensor *(*cti_recompute_fn)(cti_node *n);

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
    /* Saved tensor k left to be recomputed (ct_set_recompute_enabled): the
     * producer whose single output it is (retained); saved[k] holds it once
     * a formula has asked for it. */
    cti_node *from[CTI_AG_MAX_SAVED];
    bool released; /* saved tensors freed by a backward without retain_graph */
    /* A cast autocast made from a wider float dtype (cti_ag_mark_widening):
     * its one producer may hand it the gradient in that dtype. */
    bool widen;
    /* How this node's output can be made again (NULL: it cannot), and the
     * output's storage version when it was recorded: a consumer that saves
     * the output later leaves it to recomputation only while the version is
     * unchanged (nothing wrote it since). */
    cti_recompute_fn recompute;
    const void *recompute_ctx;
    unsigned out_version;
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
    /* A view's base (PyTorch's is_view/_base): the tensor, itself no view,
     * whose storage a view op made this handle over, retained, or NULL.
     * Set on floating views made in grad mode, whatever the base requires;
     * the view's geometry is its own handle's (shape, strides, offset in
     * the shared storage). The base holds nothing back: no cycle. A leaf
     * that requires grad has no base (ct_requires_grad_ drops it), so a
     * graph's leaf edges never reach one. */
    ct_tensor *base;
    /* The storage version when this view's grad_fn was last set: when the
     * storage moved on (the base or another view was written), the grad_fn
     * is rebuilt from the base's history before it is read (view_refresh
     * in graph.c). */
    atomic_uint view_version;
    /* The op that returned this view among several (ct_split, ct_chunk,
     * ct_unbind), which PyTorch does not let be written in place; or NULL. */
    const char *multi_output;
    /* A node holds this tensor as a leaf edge (it required grad when the node
     * was recorded): an in-place write that would give it a graph reaching
     * such a node is refused (cti_ag_inplace_mode), also after it has got a
     * history of its own. */
    bool leaf_edges;
    /* Autocast's lasting cast of this float32 leaf (src/ops/autocast.c):
     * a float16/bfloat16 tensor of its values, valid while this tensor's
     * storage version is amp_src_version and the copy's own is
     * amp_copy_version. Optimizers write it with the parameter. */
    ct_tensor *amp_copy;
    unsigned amp_src_version, amp_copy_version;
};

/* A leaf's lasting autocast copy (the handle is borrowed) with the versions
 * it is valid for; NULL when it has none. Setting one retains copy (NULL
 * drops it) and makes the record when t has none; false without memory. */
ct_tensor *cti_ag_amp_copy(const ct_tensor *t, unsigned *src_version, unsigned *copy_version);
bool cti_ag_set_amp_copy(ct_tensor *t, ct_tensor *copy, unsigned src_version,
                         unsigned copy_version);

/* Marks cast, autocast's cast of a wider float tensor (float32 to float16
 * or bfloat16), as one whose gradient may arrive in its source's dtype: a
 * formula that can compute that gradient in the wider dtype as cheaply
 * (a GEMM's float32 output) then hands it over unrounded, and the cast's
 * backward converts nothing (cti_ag_grad_dtype). Nothing for a cast
 * without history. */
void cti_ag_mark_widening(ct_tensor *cast);

/* The dtype a formula may give input k's gradient of node n in: the wider
 * dtype of the tensor autocast cast to n's input k, when that cast is
 * marked widening and n is the one node left to give it a gradient, none
 * having arrived yet; else n's input dtype (which a formula may always
 * give). For a formula whose gradient in the wider dtype is more accurate
 * and costs no extra pass; the engine converts any other dtype to the
 * input's. */
ct_dtype cti_ag_grad_dtype(const cti_node *n, int k);

/* Grad mode on and any of the n tensors (NULLs skipped) requires grad. */
bool cti_ag_needed(int n, ct_tensor *const *ts);

/* What cti_ag_record records, by name:
 *   cti_ag_record(&(cti_ag_rec){.name = "MulBackward", .backward = cti_bw_mul,
 *                               .nin = 2, .in = {a, b}, .nout = 1, .out = {out},
 *                               .nsaved = 2, .saved = {sa, sb}, CTI_AG_PARAMS(&p)});
 * in: the op's inputs (NULL for an absent optional one); inputs that do not
 * require grad get no edge. saved: what the formula reads (detached aliases
 * are kept with their storage version; NULL entries allowed). params: the
 * parameter struct the formula reads with CTI_NODE_PARAMS, copied.
 * recompute (optional, with its recompute_ctx): for an op of one output,
 * cheap to run again, that saves what it needs to run again (a pointwise op
 * that saves its inputs). */
typedef struct cti_ag_rec {
    const char *name;
    cti_backward_fn backward;
    cti_recompute_fn recompute;
    const void *recompute_ctx;
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
 * forward (error naming the node and the versions), or recomputed by its
 * producer when it was left to recomputation. NULL if it was saved as NULL
 * or on error (status in *st). */
ct_tensor *cti_ag_saved(cti_node *n, int k, ct_status *st);

/* Sums g over the dims it was broadcast along so it has shape (ndim, shape).
 * New tensor (a new reference to g when already that shape). */
ct_tensor *cti_sum_to_shape(ct_tensor *g, int ndim, const int64_t *shape);

/* Refuses an in-place op on t when autograd forbids it (a leaf that requires
 * grad, or a tensor with history, a view of one included) in grad mode; op
 * names the caller. For the writes autograd does not record (random fills,
 * optimizer steps, collectives). */
ct_status cti_ag_check_inplace(const char *op, const ct_tensor *t);

/* In-place updates recorded by autograd (src/ops/inplace.c, ct_copy_,
 * ct_fill_, ct_zero_). What updating t in place from an operand other (NULL
 * for none) needs in grad mode: 0 a plain update (nothing requires grad, or
 * t is not floating), 1 a recorded one (t, its base or other requires
 * grad), -1 refused with an error naming op, as PyTorch refuses: t a leaf
 * that requires grad or a view of one, a view made in no-grad mode, a view
 * among several outputs (ct_split, ct_chunk, ct_unbind), a view of a base
 * whose elements overlap. */
int cti_ag_inplace_mode(const char *op, ct_tensor *t, ct_tensor *other);
/* Whether t is a view that autograd tracks (it has a base); refreshes
 * nothing. */
bool cti_ag_is_view(const ct_tensor *t);
/* PyTorch's rebase for a tensor that is not a view: t's history becomes
 * src's (src computed t's new values out of place, from a copy of t that
 * carries t's old history). */
ct_status cti_ag_rebase(ct_tensor *t, const ct_tensor *src);
/* PyTorch's CopySlices, after src's values were written into the view t
 * (src broadcast to t's shape and converted to its dtype; NULL for a
 * constant): t's base gets a node over its old history and src, the region
 * t covers taking src's gradient and the rest the old history's; t's
 * history becomes a strided view of the base's new one. */
ct_status cti_ag_rebase_view(ct_tensor *t, ct_tensor *src);
/* After t was overwritten by src (ct_copy_; NULL for ct_fill_/ct_zero_):
 * records it as PyTorch does, through t's base when t is a view (above),
 * else with node `name` over t's old history (which gets a zero gradient)
 * and src (which gets t's, summed and converted back to src's shape, dtype
 * and device). */
ct_status cti_ag_record_overwrite(const char *name, ct_tensor *t, ct_tensor *src);

/* Views (src/ops/views.c and the ops that return their input's storage):
 * after v was made from t (and recorded, when t requires grad), links v to
 * its base as PyTorch's as_view does: v's base is t's when t is a view, else
 * t. In no-grad mode, or from a view made there, v is marked instead
 * (ct_tensor.nograd_view). Only floating views; a failure (out of memory)
 * releases v and returns NULL. */
ct_tensor *cti_ag_view_link(ct_tensor *t, ct_tensor *v);
/* Marks a linked view as one of several that op returned (see
 * ct_autograd_meta.multi_output); nothing for another tensor. */
void cti_ag_mark_multi_output(ct_tensor *v, const char *op);

#endif
