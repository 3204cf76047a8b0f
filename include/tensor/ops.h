/* cten: math on tensors, dispatched by (op, device, dtype).
 *
 * Every function returns a new tensor the caller owns, or NULL on error (the
 * message names the op, shapes, dtypes and devices, see ct_last_error). In-place
 * variants end in '_' and return a status. Arguments are borrowed and left
 * unchanged on failure. All inputs of one op must be on one device.
 *
 * Binary ops broadcast (NumPy/PyTorch rules) and promote types as PyTorch's
 * result_type: the category (bool < integer < floating) of the operands
 * decides; within a category, tensors with dims outrank 0-d tensors, which
 * outrank scalars; the widest of the winning group is taken. Integer inputs to
 * ops that need floating values (div, exp, sqrt, mean, ...) give float32.
 * In-place ops never broadcast or promote their destination: the result type
 * must convert to it without leaving its category (as PyTorch checks). */
#ifndef CTEN_OPS_H
#define CTEN_OPS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- unary (floating results for integer inputs where the math needs it) ---- */
ct_tensor *ct_neg(ct_tensor *x);
ct_tensor *ct_abs(ct_tensor *x);
ct_tensor *ct_exp(ct_tensor *x);
ct_tensor *ct_log(ct_tensor *x);
ct_tensor *ct_sqrt(ct_tensor *x);
ct_tensor *ct_rsqrt(ct_tensor *x);
ct_tensor *ct_sin(ct_tensor *x);
ct_tensor *ct_cos(ct_tensor *x);
ct_tensor *ct_tanh(ct_tensor *x);
ct_tensor *ct_sigmoid(ct_tensor *x);
ct_tensor *ct_relu(ct_tensor *x);
typedef enum ct_gelu_approx { CT_GELU_NONE = 0, CT_GELU_TANH = 1 } ct_gelu_approx;
ct_tensor *ct_gelu(ct_tensor *x, ct_gelu_approx approximate);
ct_tensor *ct_silu(ct_tensor *x);
/* New tensor: log(1 + exp(beta x)) / beta, x where beta x > threshold; floating dtypes only. */
ct_tensor *ct_softplus(ct_tensor *x, double beta, double threshold);
ct_tensor *ct_reciprocal(ct_tensor *x);
ct_tensor *ct_square(ct_tensor *x);
ct_tensor *ct_sign(ct_tensor *x);
ct_tensor *ct_logical_not(ct_tensor *x); /* -> bool */

ct_status ct_neg_(ct_tensor *x);
ct_status ct_exp_(ct_tensor *x);
ct_status ct_sqrt_(ct_tensor *x);
ct_status ct_relu_(ct_tensor *x);

/* ---- binary, tensor-tensor ----------------------------------------------------- */
ct_tensor *ct_add(ct_tensor *a, ct_tensor *b);
/* a + alpha * b */
ct_tensor *ct_add_alpha(ct_tensor *a, ct_tensor *b, double alpha);
ct_tensor *ct_sub(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_sub_alpha(ct_tensor *a, ct_tensor *b, double alpha);
ct_tensor *ct_mul(ct_tensor *a, ct_tensor *b);
/* True division: integer inputs give float32. */
ct_tensor *ct_div(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_pow(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_maximum(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_minimum(ct_tensor *a, ct_tensor *b);
/* Comparisons and logical ops give bool. */
ct_tensor *ct_eq(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_ne(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_lt(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_le(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_gt(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_ge(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_logical_and(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_logical_or(ct_tensor *a, ct_tensor *b);

/* ---- binary, tensor-scalar (the scalar does not raise the dtype within a category) */
ct_tensor *ct_add_scalar(ct_tensor *a, double s);
ct_tensor *ct_sub_scalar(ct_tensor *a, double s);
/* s - a */
ct_tensor *ct_rsub_scalar(ct_tensor *a, double s);
ct_tensor *ct_mul_scalar(ct_tensor *a, double s);
ct_tensor *ct_div_scalar(ct_tensor *a, double s);
ct_tensor *ct_pow_scalar(ct_tensor *a, double exponent);
ct_tensor *ct_maximum_scalar(ct_tensor *a, double s);
ct_tensor *ct_minimum_scalar(ct_tensor *a, double s);
ct_tensor *ct_eq_scalar(ct_tensor *a, double s);
ct_tensor *ct_ne_scalar(ct_tensor *a, double s);
ct_tensor *ct_lt_scalar(ct_tensor *a, double s);
ct_tensor *ct_le_scalar(ct_tensor *a, double s);
ct_tensor *ct_gt_scalar(ct_tensor *a, double s);
ct_tensor *ct_ge_scalar(ct_tensor *a, double s);

/* ---- in place: a op= b; b broadcasts to a, a never broadcasts ------------------- */
ct_status ct_add_(ct_tensor *a, ct_tensor *b);
ct_status ct_add_alpha_(ct_tensor *a, ct_tensor *b, double alpha);
ct_status ct_sub_(ct_tensor *a, ct_tensor *b);
ct_status ct_mul_(ct_tensor *a, ct_tensor *b);
ct_status ct_div_(ct_tensor *a, ct_tensor *b);
ct_status ct_pow_(ct_tensor *a, ct_tensor *b);
ct_status ct_add_scalar_(ct_tensor *a, double s);
ct_status ct_sub_scalar_(ct_tensor *a, double s);
ct_status ct_mul_scalar_(ct_tensor *a, double s);
ct_status ct_div_scalar_(ct_tensor *a, double s);
ct_status ct_clamp_(ct_tensor *a, double min, double max);

/* ---- selection ------------------------------------------------------------------ */
/* cond (bool) ? a : b, all three broadcast together. */
ct_tensor *ct_where(ct_tensor *cond, ct_tensor *a, ct_tensor *b);
/* Clamps to [min, max]; pass -INFINITY / INFINITY for no bound. NaN stays NaN.
 * An integer tensor with a bound that has a fraction (0.5, not 2.0) gives a
 * float32 result, as PyTorch's Python-float bounds do; ct_clamp_ refuses
 * that case (CT_ERR_DTYPE) as PyTorch does. */
ct_tensor *ct_clamp(ct_tensor *x, double min, double max);

/* ---- reductions ---------------------------------------------------------------------
 * dims: a list of dims (negatives count from the end, no repeats); an empty list
 * (CT_NONE) reduces over all dims to a 0-d tensor (keepdim keeps size-1 dims).
 * sum/prod of bool and integer inputs give int64; mean/var/std/norm need
 * floating inputs. Floating reductions accumulate in f64 for f64 and in f32
 * (at least) for the others. */
ct_tensor *ct_sum(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim);
ct_tensor *ct_mean(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim);
ct_tensor *ct_prod(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim);
/* Variance with correction (1 = unbiased, 0 = population). */
ct_tensor *ct_var(ct_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim);
ct_tensor *ct_std(ct_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim);
/* p-norm (p = INFINITY for max-abs, p = 0 counts non-zeros). */
ct_tensor *ct_norm(ct_tensor *x, double p, int ndims, const int64_t *dims, bool keepdim);
/* Max/min over all elements (0-d). NaN propagates. */
ct_tensor *ct_max(ct_tensor *x);
ct_tensor *ct_min(ct_tensor *x);
/* Max/min along dim: values returned, int64 indices into *indices when not
 * NULL (first occurrence on ties, as PyTorch on CPU). */
ct_tensor *ct_max_dim(ct_tensor *x, int dim, bool keepdim, ct_tensor **indices);
ct_tensor *ct_min_dim(ct_tensor *x, int dim, bool keepdim, ct_tensor **indices);
/* int64 index of the max/min along dim. */
ct_tensor *ct_argmax(ct_tensor *x, int dim, bool keepdim);
ct_tensor *ct_argmin(ct_tensor *x, int dim, bool keepdim);
/* Over the flattened tensor (0-d int64). */
ct_tensor *ct_argmax_all(ct_tensor *x);
ct_tensor *ct_argmin_all(ct_tensor *x);

/* ---- linear algebra (f32 and f64 through BLAS; f16/bf16 computed in f32) ---------- */
/* torch.matmul: 1-d/2-d/batched with broadcast batch dims. */
ct_tensor *ct_matmul(ct_tensor *a, ct_tensor *b);
/* [n,k] x [k,m] */
ct_tensor *ct_mm(ct_tensor *a, ct_tensor *b);
/* [B,n,k] x [B,k,m] */
ct_tensor *ct_bmm(ct_tensor *a, ct_tensor *b);
/* beta * input + alpha * (m1 @ m2); input broadcasts to [n,m]. */
ct_tensor *ct_addmm(ct_tensor *input, ct_tensor *m1, ct_tensor *m2, double beta, double alpha);
/* x @ w^T + bias; x [..., in], w [out, in], bias [out] or NULL. */
ct_tensor *ct_linear(ct_tensor *x, ct_tensor *w, ct_tensor *bias);

/* ---- convolution and pooling (NCHW; a 3-d CHW input is taken as N = 1) ------------- */
/* x [N,Cin,H,W], w [Cout,Cin/groups,kH,kW], bias [Cout] or NULL. stride,
 * padding and dilation are {height, width} pairs; NULL means PyTorch's
 * default: stride {1, 1}, padding {0, 0}, dilation {1, 1}. The same holds for
 * the two backward functions below. */
ct_tensor *ct_conv2d(ct_tensor *x, ct_tensor *w, ct_tensor *bias, const int64_t stride[2],
                     const int64_t padding[2], const int64_t dilation[2], int64_t groups);
/* Gradient wrt the input of the conv2d above; input_shape is x's 4-d shape. */
ct_tensor *ct_conv2d_backward_input(ct_tensor *grad_out, ct_tensor *w,
                                    const int64_t input_shape[4], const int64_t stride[2],
                                    const int64_t padding[2], const int64_t dilation[2],
                                    int64_t groups);
/* Gradient wrt the weight; weight_shape is w's 4-d shape. */
ct_tensor *ct_conv2d_backward_weight(ct_tensor *grad_out, ct_tensor *x,
                                     const int64_t weight_shape[4], const int64_t stride[2],
                                     const int64_t padding[2], const int64_t dilation[2],
                                     int64_t groups);
/* Gradient wrt the bias: grad_out summed over N, H, W. */
ct_tensor *ct_conv2d_backward_bias(ct_tensor *grad_out);

/* Max pooling with int64 argmax indices (flat h*W+w within each plane) into
 * *indices when not NULL. padding <= kernel/2; NULL means PyTorch's default:
 * stride the kernel size, padding {0, 0}, dilation {1, 1} (avg_pool2d too). */
ct_tensor *ct_max_pool2d(ct_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                         const int64_t padding[2], const int64_t dilation[2], bool ceil_mode,
                         ct_tensor **indices);
ct_tensor *ct_max_pool2d_backward(ct_tensor *grad_out, ct_tensor *x, ct_tensor *indices);
ct_tensor *ct_avg_pool2d(ct_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                         const int64_t padding[2], bool ceil_mode, bool count_include_pad);
ct_tensor *ct_avg_pool2d_backward(ct_tensor *grad_out, ct_tensor *x, const int64_t kernel[2],
                                  const int64_t stride[2], const int64_t padding[2],
                                  bool ceil_mode, bool count_include_pad);
ct_tensor *ct_adaptive_avg_pool2d(ct_tensor *x, int64_t out_h, int64_t out_w);
ct_tensor *ct_adaptive_avg_pool2d_backward(ct_tensor *grad_out, ct_tensor *x);

/* ---- normalization -------------------------------------------------------------------
 * Over the trailing dims given by normalized_shape (x's last dims must equal it).
 * rms_norm: y = x * rsqrt(mean(x^2) + eps) * weight; saves only the per-row
 * inverse RMS (shape: x's leading dims, f32 for f16/bf16/f32, f64 for f64) into
 * *inv_rms when not NULL. weight may be NULL. */
ct_tensor *ct_rms_norm(ct_tensor *x, int nnorm, const int64_t *normalized_shape,
                       ct_tensor *weight, double eps, ct_tensor **inv_rms);
/* Returns grads of x (*dx, skipped when dx is NULL) and weight (*dweight, set to
 * NULL when weight is NULL; skipped when dweight is NULL). Asking for nothing
 * (no dx and no weight gradient) is an error. */
ct_status ct_rms_norm_backward(ct_tensor *grad_y, ct_tensor *x, ct_tensor *weight,
                               ct_tensor *inv_rms, ct_tensor **dx, ct_tensor **dweight);
/* layer_norm: (x - mean) * rstd * weight + bias; saves mean and rstd per row.
 * Its backward fills each of dx, dweight and dbias that is not NULL (*dweight
 * is NULL when weight is); asking for none of them is an error. */
ct_tensor *ct_layer_norm(ct_tensor *x, int nnorm, const int64_t *normalized_shape,
                         ct_tensor *weight, ct_tensor *bias, double eps, ct_tensor **mean,
                         ct_tensor **rstd);
ct_status ct_layer_norm_backward(ct_tensor *grad_y, ct_tensor *x, ct_tensor *weight,
                                 ct_tensor *mean, ct_tensor *rstd, ct_tensor **dx,
                                 ct_tensor **dweight, ct_tensor **dbias);

/* ---- softmax and losses ----------------------------------------------------------------- */
ct_tensor *ct_softmax(ct_tensor *x, int dim);
ct_tensor *ct_log_softmax(ct_tensor *x, int dim);
/* From the forward's output y. */
ct_tensor *ct_softmax_backward(ct_tensor *grad_y, ct_tensor *y, int dim);
ct_tensor *ct_log_softmax_backward(ct_tensor *grad_y, ct_tensor *y, int dim);

typedef enum ct_reduction {
    CT_REDUCTION_NONE = 0,
    CT_REDUCTION_MEAN = 1,
    CT_REDUCTION_SUM = 2
} ct_reduction;

/* logits [N,C] or [C] or [N,C,d1,...]; target int64 class indices [N] / [] /
 * [N,d1,...]; weight [C] or NULL. As torch.nn.functional.cross_entropy. */
ct_tensor *ct_cross_entropy(ct_tensor *logits, ct_tensor *target, ct_tensor *weight,
                            ct_reduction reduction, int64_t ignore_index,
                            double label_smoothing);
/* grad of the loss wrt logits; grad_loss has the loss's shape. */
ct_tensor *ct_cross_entropy_backward(ct_tensor *grad_loss, ct_tensor *logits,
                                     ct_tensor *target, ct_tensor *weight,
                                     ct_reduction reduction, int64_t ignore_index,
                                     double label_smoothing);
/* log-probabilities in, as torch.nn.functional.nll_loss. */
ct_tensor *ct_nll_loss(ct_tensor *log_probs, ct_tensor *target, ct_tensor *weight,
                       ct_reduction reduction, int64_t ignore_index);
ct_tensor *ct_nll_loss_backward(ct_tensor *grad_loss, ct_tensor *log_probs, ct_tensor *target,
                                ct_tensor *weight, ct_reduction reduction,
                                int64_t ignore_index);
/* input floating; target of any numeric dtype, broadcast with input. Mixed
 * dtypes compute in their promoted dtype (ct_promote_types), which is the
 * result's, as PyTorch does; gradients return in each input's own dtype. */
ct_tensor *ct_mse_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction);
/* Returns the grad wrt input, in input's dtype (the grad wrt target is its
 * negative). */
ct_tensor *ct_mse_loss_backward(ct_tensor *grad_loss, ct_tensor *input, ct_tensor *target,
                                ct_reduction reduction);

/* ---- embedding and dropout ---------------------------------------------------------------- */
/* weight [V,D], indices int64 (or int32) of any shape -> [..., D]. */
ct_tensor *ct_embedding(ct_tensor *weight, ct_tensor *indices);
/* Scatter-adds grad_out rows into a [num_weights, D] zero tensor; rows equal to
 * padding_idx get no gradient (pass -1 for none). */
ct_tensor *ct_embedding_backward(ct_tensor *grad_out, ct_tensor *indices, int64_t num_weights,
                                 int64_t padding_idx);
/* Zeroes each element with probability p and scales the rest by 1/(1-p) when
 * train; the identity (a new reference to x) otherwise. *mask (bool) when not
 * NULL records the kept elements. */
ct_tensor *ct_dropout(ct_tensor *x, double p, bool train, ct_generator *gen, ct_tensor **mask);
ct_tensor *ct_dropout_backward(ct_tensor *grad_y, ct_tensor *mask, double p);

/* ---- indexing ------------------------------------------------------------------------------
 * As PyTorch's. dim < 0 counts from the end; a 0-d tensor takes dim 0 or -1.
 * Indices must lie in [0, x.size(dim)) (negative ones are refused, as
 * PyTorch's gather and index_select do): one outside gives CT_ERR_INDEX, on
 * the GPU too. Every dtype works for x and src; gradients flow to the
 * floating ones. */
/* New tensor of index's shape and x's dtype: out[i][j] = x[i][index[i][j]] for
 * dim 1 (torch.gather). index int64, x's ndim, index.size(d) <= x.size(d) for
 * d != dim. */
ct_tensor *ct_gather(ct_tensor *x, int dim, ct_tensor *index);
/* New tensor: a copy of x with src[p] added at x[p with dim replaced by
 * index[p]] for every position p of index (out-of-place
 * torch.scatter_add). index int64; x, index, src of one ndim;
 * index.size(d) <= src.size(d) for every d and <= x.size(d) for d != dim;
 * src has x's dtype (bool adds as logical or, integers wrap). */
ct_tensor *ct_scatter_add(ct_tensor *x, int dim, ct_tensor *index, ct_tensor *src);
/* New tensor: the entries index[k] of x along dim (torch.index_select);
 * index 0-d or 1-d, int64 or int32. */
ct_tensor *ct_index_select(ct_tensor *x, int dim, ct_tensor *index);
/* New tensor of x's dtype and the broadcast shape of x and mask: value where
 * mask (bool, broadcast) is true, x elsewhere (torch.masked_fill). value must
 * fit an integer x's dtype. */
ct_tensor *ct_masked_fill(ct_tensor *x, ct_tensor *mask, double value);
/* New tensor: each slice of x along dim repeated repeats (>= 0) times in a
 * row, [B, H, T, D] -> [B, H * r, T, D] for dim 1
 * (torch.repeat_interleave with an int repeats). */
ct_tensor *ct_repeat_interleave(ct_tensor *x, int64_t repeats, int dim);
/* Views of x (torch.split): pieces of split_size along dim, the last one
 * smaller when split_size does not divide the size (split_size 0 only for
 * an empty dim: one empty piece). Writes *n_out pieces to out[0..], each a
 * new handle the caller owns; out NULL only counts them (*n_out). Fails
 * (CT_ERR_INVALID_ARG, nothing written) when more than max_out pieces. */
ct_status ct_split(ct_tensor *x, int64_t split_size, int dim, int max_out, ct_tensor **out,
                   int *n_out);
/* Views of x of the n sizes (>= 0, summing to x.size(dim)) along dim
 * (torch.split with a list); out as ct_split, which it fills n of. */
ct_status ct_split_with_sizes(ct_tensor *x, int n, const int64_t *sizes, int dim,
                              ct_tensor **out);
/* Views of x (torch.chunk): split with split_size ceil(size / chunks), so
 * fewer than chunks pieces when the sizes allow no more (6 in 4 chunks gives
 * 3 of 2); chunks empty pieces of an empty dim. chunks >= 1; out, max_out,
 * n_out as ct_split. */
ct_status ct_chunk(ct_tensor *x, int64_t chunks, int dim, int max_out, ct_tensor **out,
                   int *n_out);

#ifdef __cplusplus
}
#endif
#endif
