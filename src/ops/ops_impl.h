/* Private: what the op front ends share. A front end checks its arguments,
 * computes the result's shape and dtype, allocates the outputs, runs the
 * kernel through cti_run and asks autograd to record; it is the layer above
 * both the dispatcher and autograd. */
#ifndef CTEN_OPS_IMPL_H
#define CTEN_OPS_IMPL_H

#include "autocast.h"
#include "autograd/formulas.h"
#include "dispatch/dispatch_impl.h"
#include "tensor/ops.h"

/* Dispatches c, then, for an op the schema marks CTI_NOFORMULA whose
 * inputs need grad, gives its results a node that refuses backward: a
 * backward that reaches them fails naming the op instead of cutting the
 * graph and leaving a silent zero. */
ct_status cti_run(ct_call *c, ct_device device, ct_dtype dtype);
/* cti_run for a call whose inputs are views made for the kernel: the node
 * that refuses backward records the caller's tensors in[0..nin) instead. */
ct_status cti_run_as(ct_call *c, ct_device device, ct_dtype dtype, int nin,
                     ct_tensor *const *in);

/* ---- shared argument checks (each sets an error naming op) ----------------------- */
/* All n tensors non-NULL. */
ct_status cti_check_not_null(const char *op, int n, ct_tensor *const *ts);
/* All non-NULL tensors among n on one device. */
ct_status cti_check_same_device(const char *op, int n, ct_tensor *const *ts);
/* dtype is floating ("op: expected a floating dtype, got int64"). */
ct_status cti_check_floating(const char *op, const ct_tensor *t, const char *argname);
/* approximate is a ct_gelu_approx: CT_GELU_NONE or CT_GELU_TANH. */
ct_status cti_check_gelu_approx(const char *op, ct_gelu_approx approximate);
/* The scalar v converts to dt without overflow (PyTorch's checked conversion
 * of a fill value; infinities and NaN are floating values). */
ct_status cti_check_scalar_fits(const char *op, double v, ct_dtype dt);

/* ---- ops along one dim (src/ops/seqops.c) ---------------------------------------- */
/* t with dim moved last, contiguous: a new reference (a copy when dim is not
 * last or t is not contiguous). */
ct_tensor *cti_dim_last(ct_tensor *t, int dim);
/* The inverse of cti_dim_last for a result: consumes t. */
ct_tensor *cti_dim_back(ct_tensor *t, int dim);
/* The call of an op that selects along dim d of x (sort, topk): its input x
 * with d moved last (*xl, the caller's to release) and two new outputs of
 * that layout, len elements along d: values in x's dtype, int64 indices.
 * *outer is the count of slices. On failure nothing is left to release. */
ct_status cti_select_call(const char *op, ct_op id, ct_tensor *x, int d, int64_t len,
                          ct_call *c, ct_tensor **xl, int64_t *outer);
/* Runs that call (its params set) and moves d back in place in both
 * outputs: new *vals and *idx, or the error with the outputs released. */
ct_status cti_select_run(ct_call *c, ct_device device, ct_dtype dt, int d, ct_tensor **vals,
                         ct_tensor **idx);

/* src converted to copy's dtype without a kernel: a new handle on copy's
 * storage (copy holds src's values in that dtype, same shape, contiguous),
 * recorded by autograd as ct_to_dtype(src, copy's dtype) would be. For
 * autocast's lasting casts (src/ops/autocast.c). */
ct_tensor *cti_cast_from_copy(ct_tensor *src, const ct_tensor *copy);

/* Releases the outputs of a call (after a failed dispatch). */
void cti_call_release_outputs(ct_call *c);
/* Records r, whose one output is r->out[0], when grad mode is on and an
 * input requires grad: that output, or NULL after releasing it when
 * recording fails (and NULL for a NULL output). */
ct_tensor *cti_record_one(const cti_ag_rec *r);
/* index.size(k) <= t.size(k) for every dim k but skip (none when skip < 0),
 * the rule of gather, scatter and their kin; the error names op, the
 * index and t (called name). */
ct_status cti_check_index_fits(const char *op, const ct_tensor *index, const ct_tensor *t,
                               const char *name, int skip);

/* An in-place op recorded by autograd (src/ops/inplace.c; decide with
 * cti_ag_inplace_mode after the op's own checks): fn(src, ctx) computes
 * the new values out of place, recorded, from src, a copy of a with its
 * history; they are cast to a's dtype, written into a, and a's history
 * becomes theirs. A failure before the write leaves a unchanged; only
 * running out of memory while recording the rebase, after it, leaves a
 * written with its old history (and the error). */
typedef ct_tensor *(*cti_inplace_fn)(ct_tensor *src, const void *ctx);
ct_status cti_inplace_record(const char *op, ct_tensor *a, cti_inplace_fn fn, const void *ctx);

#endif
