/* Private: backward formulas, one per differentiable op, used by the front
 * ends in src/ops/ when they record. Each file of formulas_*.c declares
 * its functions here. */
#ifndef CTEN_FORMULAS_H
#define CTEN_FORMULAS_H

#include "autograd_impl.h"

#define CTI_BW(name) ct_status name(cti_node *n, ct_tensor *const *go, ct_tensor **gi)

/* The formula of every differentiable op, as the schema's grad column
 * names it (src/dispatch/schema.h), is declared from there; the lists
 * below declare the variants front ends record besides (a tensor-scalar
 * form, std, a max along a dim, the composite ops and the views). */
#define CTI_F(fn) CTI_BW(fn);
#define CTI_NODIFF
#define CTI_NOFORMULA
#define CTI_DECLARE_FORMULA_(ID, name, P, grad, bw) grad
CTI_OP_SCHEMA(CTI_DECLARE_FORMULA_)
#undef CTI_DECLARE_FORMULA_
#undef CTI_F
#undef CTI_NODIFF
#undef CTI_NOFORMULA

/* formulas_elementwise.c
 * Binary nodes have inputs (a, b); scalar and unary nodes have input x. A
 * node whose formula reads params holds its call's cti_pointwise_params; the
 * saved tensors and params each one reads are listed in that file. */
CTI_BW(cti_bw_mul_scalar);
CTI_BW(cti_bw_div_scalar);
CTI_BW(cti_bw_pow_scalar);
CTI_BW(cti_bw_maximum_scalar);
CTI_BW(cti_bw_minimum_scalar);

/* formulas_reduce.c
 * One input x; params the forward's cti_reduce_params (the reduced dims as
 * a bitmask, keepdim, the correction or p). The saved tensors and params
 * each one reads are listed in that file. */
CTI_BW(cti_bw_std);
CTI_BW(cti_bw_max_dim);

/* formulas_factory.c: one input per joined tensor, nothing saved; params a
 * cti_join_params. */
/* The dim cat joined along or stack inserted, non-negative. */
typedef struct cti_join_params {
    int dim;
} cti_join_params;
CTI_BW(cti_bw_cat);
CTI_BW(cti_bw_stack);

/* formulas_views.c
 * One input t, nothing saved. Reshape-like views and expand record no
 * params; transpose, permute, slice/narrow and select a cti_view_params. */
/* What a view took of t: enough to map its gradient back onto t's shape. */
typedef struct cti_view_params {
    int dim0, dim1;            /* transpose, t: the swapped dims (-1: nothing moved) */
    int64_t perm[CT_MAX_DIMS]; /* permute: the order, non-negative */
    int dim;                   /* slice, narrow, select: the dim, non-negative */
    int64_t start, end, step;  /* slice, narrow: as ct_slice takes them */
    int64_t index;             /* select: non-negative */
} cti_view_params;
CTI_BW(cti_bw_view);
CTI_BW(cti_bw_transpose);
CTI_BW(cti_bw_permute);
CTI_BW(cti_bw_slice);
CTI_BW(cti_bw_select);
CTI_BW(cti_bw_expand);
/* SplitBackward (ct_split, ct_split_with_sizes, ct_chunk: one node whose
 * outputs are the pieces, each a narrow view of t along dim): params a
 * cti_join_params (dim); the pieces' shapes are the node's outputs'. t's
 * gradient is the cat of the pieces' (zeros for a piece without one), or,
 * when the pieces' gradients already lie side by side in one storage as
 * that cat would place them, a view over them (nothing copied). */
CTI_BW(cti_bw_split);
/* Views and in-place updates through them (graph.c records these nodes).
 * AsStridedBackward, the history of a view whose base was written in
 * place: input the base, output the view. CopySlices, the history of a base
 * after a write through one of its views: inputs the base's old history and
 * the written values (of the view's shape), output the base. Both read the
 * geometry below, the base's shape and the view's being the node's. */
typedef struct cti_strided_params {
    int64_t base_stride[CT_MAX_DIMS];
    int64_t view_stride[CT_MAX_DIMS];
    int64_t view_offset;  /* from the base's first element, in elements */
    ct_device src_device; /* CopySlices: the written values' device */
} cti_strided_params;
CTI_BW(cti_bw_as_strided);
CTI_BW(cti_bw_copy_slices);
/* CopyBackwards, FillBackward, ZeroBackward (a tensor that is no view,
 * overwritten): inputs the old values and (copy) the source; the old values
 * get zeros, the source the gradient, moved to params' src_device (a
 * cti_strided_params of which only src_device is read). */
CTI_BW(cti_bw_overwrite);

/* formulas_linalg.c
 * matmul/mm/bmm have inputs (a, b), addmm (input, m1, m2), linear (x, w,
 * bias); addmm keeps its cti_gemm_params, the others no params. The saved
 * tensors each one reads are listed in that file. */
CTI_BW(cti_bw_matmul);
CTI_BW(cti_bw_linear);
CTI_BW(cti_bw_mlp_gelu);

/* formulas_conv.c
 * Inputs, saved tensors and params of each are listed in that file. */

/* formulas_nn.c
 * Inputs, saved tensors and params of each are listed in that file. */

/* formulas_nn.c: cross_entropy's node saves (logits, target, weight, stats),
 * stats the forward's row statistics (schema.h's CROSS_ENTROPY); its
 * formula runs the backward op with them (src/ops/nn.c; stats NULL: the
 * backward recomputes them from the logits). */
ct_tensor *cti_cross_entropy_backward_saved(ct_tensor *grad_loss, ct_tensor *logits,
                                            ct_tensor *target, ct_tensor *weight,
                                            ct_tensor *stats, const cti_loss_params *p);

/* formulas_linalg.c: ct_linear_backward_weight with the gradients in dtypes of
 * their own (src/ops/linalg.c): dweight_dtype and dbias_dtype are each
 * grad_y's dtype or, when that is float16 or bfloat16, float32 (the
 * float32 accumulators stored without the rounding to grad_y's dtype, for
 * a gradient cti_ag_grad_dtype lets pass wide). */
ct_status cti_linear_backward_weight_as(ct_tensor *grad_y, ct_tensor *x, ct_dtype dweight_dtype,
                                        ct_dtype dbias_dtype, ct_tensor **dweight,
                                        ct_tensor **dbias);
/* ct_mlp_gelu_backward_hidden with db_in in db_dtype: pre's dtype or, when
 * that is float16 or bfloat16, float32 (the row sums' float32 accumulators,
 * unrounded), as above. */
ct_status cti_mlp_gelu_backward_hidden_as(ct_tensor *grad_y, ct_tensor *w_out, ct_tensor *pre,
                                          ct_gelu_approx approximate, ct_dtype db_dtype,
                                          ct_tensor **dpre, ct_tensor **db_in);

/* formulas_nn.c: add_rms_norm's and add_layer_norm's nodes run their backward op
 * (src/ops/nn.c) from the saved sum and statistics (stat1: rstd, layer_norm's only)
 * and the gradients of y and of the sum (either NULL: zero). gi[0..3]: the
 * gradients of x and residual (in x_dtype and residual_dtype), weight and bias,
 * each only where needs[k]. */
ct_status cti_add_norm_backward(bool layer, ct_tensor *grad_y, ct_tensor *grad_sum,
                                ct_tensor *sum, ct_tensor *weight, ct_tensor *stat0,
                                ct_tensor *stat1, ct_dtype x_dtype, ct_dtype residual_dtype,
                                const bool needs[4], ct_tensor **gi);

/* formulas_linear_ce.c: ct_linear_cross_entropy. Inputs (x, weight,
 * bias|NULL); params a cti_lce_params. eager: saved the gradients the
 * forward computed with a sum's scale (dx in x's shape, dweight, dbias, each
 * NULL when its input needs none) and the count of counted targets (mean;
 * else NULL); otherwise (reduction none) saved x, weight, bias, target. */
typedef struct cti_lce_params {
    int reduction;
    int64_t ignore_index;
    double label_smoothing;
    bool eager;
} cti_lce_params;
CTI_BW(cti_bw_linear_cross_entropy);
/* grad_loss (0-d) / max(count, 1) for mean, grad_loss for sum: the factor
 * of a sum-scaled gradient, 0-d in f32 (f64 for f64) so that it is not
 * rounded to a half; with no counted target every gradient is 0. */
ct_tensor *cti_linear_ce_factor(ct_tensor *grad_loss, ct_tensor *count, int reduction);

/* formulas_sort.c
 * amax/amin: one input x; saved x and the result; params the forward's
 * cti_reduce_params (the reduced dims, keepdim). */
CTI_BW(cti_bw_amax);

/* formulas_shape.c: the indexing and shape ops of src/ops/shape.c.
 *   scatter:        in (x[, src]); saved index; cti_scatter_params
 *   scatter_reduce: in (x, src); saved index, x, src, result, count (mean);
 *                   cti_scatter_reduce_params
 *   flip, roll, pad: in x; the forward's cti_remap_params
 *   repeat:         in x; cti_repeat_params
 *   interpolate:    in x; cti_interp_params
 *   unfold, fold:   in x; cti_fold_params */
typedef struct cti_scatter_reduce_params {
    cti_scatter_params p; /* reduce: SUM for sum and mean */
    bool mean, include_self;
} cti_scatter_reduce_params;
typedef struct cti_repeat_params {
    int n;
    int64_t repeats[CT_MAX_DIMS];
} cti_repeat_params;
/* What FLIP / ROLL / REPEAT / PAD (id) make of x with p: a new contiguous
 * tensor of oshape (x's ndim), not recorded. */
ct_tensor *cti_remap_run(const char *op, ct_op id, ct_tensor *x, const int64_t *oshape,
                         const cti_remap_params *p);
/* INTERPOLATE_BACKWARD of grad_out [N, C, OH, OW] with the forward's p. */
ct_tensor *cti_interpolate_backward(ct_tensor *grad_out, const cti_interp_params *p);
/* g (of an index's shape or smaller, as scatter's and scatter_add's src
 * gradients) placed in zeros of input k's shape when that is larger: the
 * elements the index does not reach get none. Takes g's reference; NULL
 * for a NULL g or on error. */
ct_tensor *cti_grad_into_input(cti_node *n, int k, ct_tensor *g);
CTI_BW(cti_bw_diagonal);
/* formulas_layers.c: ct_conv_transpose2d. Inputs (x, w); saved[0] x (only
 * when w needs a gradient), saved[1] w (only when x needs one); params the
 * cti_conv_params of the conv2d whose input gradient the forward is
 * (stride, padding, dilation, groups). */
CTI_BW(cti_bw_conv_transpose2d);
/* batch_norm (BATCH_NORM's row): inputs (x, weight|NULL, bias|NULL); saved
 * x, weight, mean, var; params the forward's cti_batch_norm_params. */

#endif
