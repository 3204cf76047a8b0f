/* Private: the autograd graph. A node is the backward of one recorded op
 * call: edges to the nodes (or leaves) that produced its inputs, the input
 * geometry, the tensors its formula needs (saved as detached aliases with
 * their storage version) and the op's parameters. */
#ifndef CTEN_AUTOGRAD_IMPL_H
#define CTEN_AUTOGRAD_IMPL_H

#include "dispatch/dispatch_impl.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

#define CTI_AG_MAX_IN 6
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
    double f[8];
    int64_t i[16];
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
};

/* Grad mode on and any of the n tensors (NULLs skipped) requires grad. */
bool cti_ag_needed(int n, ct_tensor *const *ts);

/* Records outputs as computed from inputs by a backward formula bw named name.
 * Saves nsaved tensors (detached aliases; NULL entries allowed), copies nf
 * float and ni integer parameters. Inputs that do not require grad get no
 * edge. On failure (out of memory) returns the error; the outputs are left
 * without history and the caller releases them. */
ct_status cti_ag_record(const char *name, cti_backward_fn bw, int nin, ct_tensor *const *inputs,
                        int nout, ct_tensor *const *outputs, int nsaved,
                        ct_tensor *const *saved, const double *f, int nf, const int64_t *i,
                        int ni);

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

#endif
