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
/* New tensor: grad_out times d/dx gelu(x) with the forward's approximation (PyTorch's
 * gelu_backward); grad_out and x of one floating dtype, shape and device. */
ct_tensor *ct_gelu_backward(ct_tensor *grad_out, ct_tensor *x, ct_gelu_approx approximate);
/* New tensor: 0 where x <= threshold, else grad_out (PyTorch's threshold_backward; relu's
 * backward with x its output and threshold 0; NaN x passes grad_out); grad_out and x of one
 * floating dtype, shape and device. */
ct_tensor *ct_threshold_backward(ct_tensor *grad_out, ct_tensor *x, double threshold);
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
/* The gradients of ct_linear's weight and bias from grad_y [..., out] and x [..., in] (the
 * same leading dims, one floating dtype, one device): *dweight = grad_y^T @ x over the
 * rows of the leading dims, [out, in], and *dbias = grad_y summed over them, [out], new
 * tensors in that dtype. Either pointer may be NULL (not both; x may be NULL when dweight
 * is). Asked for both, CUDA takes the bias gradient from the weight gradient's GEMM
 * (cuBLASLt's bias-gradient epilogue, which sums grad_y as the GEMM reads it) where
 * cuBLASLt has an algorithm for the shapes, and a GEMM and a column sum elsewhere. On
 * failure both stay NULL. */
ct_status ct_linear_backward_weight(ct_tensor *grad_y, ct_tensor *x, ct_tensor **dweight,
                                    ct_tensor **dbias);
/* ct_linear(ct_gelu(ct_linear(x, w_in, b_in), approximate), w_out, b_out): the MLP of a
 * GPT-2, BERT or ViT block (Apex's FusedDenseGeluDense) as one op. x [..., in], w_in
 * [hidden, in], w_out [out, hidden], b_in [hidden] and b_out [out] or NULL, one floating
 * dtype and one device; the result is [..., out]. Under autocast it runs in the region's
 * dtype, as ct_linear does. It keeps for the backward what the three ops would (x, the
 * pre-activation and the activation; while ct_set_recompute_enabled is on, the activation
 * is made again from the pre-activation in the backward, and the forward makes it with
 * GELU's kernel too, for the same bits), and its gradients are theirs, with one node
 * for the three ops. It runs the GEMMs (the bias in the first one's epilogue on CUDA),
 * GELU's kernels and the row sums in turn; on CUDA the backward applies GELU's derivative
 * and sums b_in's gradient in one pass (ct_mlp_gelu_backward_hidden). */
ct_tensor *ct_mlp_gelu(ct_tensor *x, ct_tensor *w_in, ct_tensor *b_in, ct_tensor *w_out,
                       ct_tensor *b_out, ct_gelu_approx approximate);
/* The gradient of ct_mlp_gelu's pre-activation pre [..., hidden] from grad_y [..., out]
 * (the same leading dims) and w_out [out, hidden]: *dpre = gelu'(pre) * (grad_y @ w_out),
 * new, pre's shape, and when db_in is not NULL *db_in = *dpre summed over the leading
 * dims, [hidden], the gradient of b_in. One floating dtype, one device. On CUDA, for
 * contiguous rows of a width the 16-byte vectors divide, gelu' is applied and the rows are
 * summed in one pass over *dpre after the GEMM. On failure both stay NULL. */
ct_status ct_mlp_gelu_backward_hidden(ct_tensor *grad_y, ct_tensor *w_out, ct_tensor *pre,
                                      ct_gelu_approx approximate, ct_tensor **dpre,
                                      ct_tensor **db_in);

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
/* The residual add of a pre-norm transformer block fused with the next norm:
 * sum = x + residual, y = rms_norm(sum) (or layer_norm(sum)) as above, in one pass over
 * the rows. A block's x + f(norm(x)) then reads its residual stream once for both ops
 * and, under autocast, writes the norm's output once in the dtype the next matmul reads.
 * x and residual have the same shape, any strides and any floating dtypes; the sum is
 * computed and stored in their promoted dtype (at least float32 inside an autocast region
 * of their device, where norms run in float32), which weight and bias must have. y has
 * dtype out_dtype (float16, bfloat16, float32 or float64), or the sum's when out_dtype is
 * CT_NUM_DTYPES; y is the norm of the sum as stored, rounded to out_dtype as ct_to_dtype
 * rounds. *sum, when
 * sum is not NULL, receives the sum (a new tensor, the caller's). Gradients: the sum's
 * and y's incoming gradients give x and residual the same gradient, each in its own dtype,
 * in one pass. On failure returns NULL and leaves *sum unchanged. */
ct_tensor *ct_add_rms_norm(ct_tensor *x, ct_tensor *residual, int nnorm,
                           const int64_t *normalized_shape, ct_tensor *weight, double eps,
                           ct_dtype out_dtype, ct_tensor **sum);
ct_tensor *ct_add_layer_norm(ct_tensor *x, ct_tensor *residual, int nnorm,
                             const int64_t *normalized_shape, ct_tensor *weight,
                             ct_tensor *bias, double eps, ct_dtype out_dtype, ct_tensor **sum);

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

/* ---- rotary position embedding and SwiGLU ------------------------------------------------- */
/* Which elements of a row of D form the pairs rope turns: (k, k + D/2), as
 * LLaMA's and GPT-NeoX's rotate_half, or (2k, 2k + 1), as GPT-J's. */
typedef enum ct_rope_layout { CT_ROPE_HALF = 0, CT_ROPE_INTERLEAVED = 1 } ct_rope_layout;
/* New tensor of x's shape and dtype: x [..., D] (D even, floating) with pair k
 * of each row (a, b) turned by angle k: (a cos - b sin, b cos + a sin). cos and
 * sin: x's device, equal shapes [..., D/2] that broadcast to x's leading dims
 * (x [B, T, H, D] with [T, 1, D/2]; x [B, H, T, D] with [T, D/2]), and x's
 * dtype, or float32 beside a float16/bfloat16 x: then each entry is rounded to
 * x's dtype as it is read, so the result is bit for bit that of tables cast to
 * x's dtype, without the casts (autocast passes float32 tables so).
 * f16/bf16 compute in f32. Differentiable in x only: cos and sin are tables
 * and get no gradient. */
ct_tensor *ct_rope(ct_tensor *x, ct_tensor *cos, ct_tensor *sin, ct_rope_layout layout);
/* New tensor: ct_rope's gradient w.r.t. x from grad_out (x's shape), the
 * inverse rotation (angle -k); cos, sin and layout as the forward's. */
ct_tensor *ct_rope_backward(ct_tensor *grad_out, ct_tensor *cos, ct_tensor *sin,
                            ct_rope_layout layout);
/* Fills *cos and *sin (new tensors the caller owns) with [seq_len, dim/2]
 * tables of angle t * base^(-2k/dim), computed in f64 and converted to dtype
 * (floating) on device, as LLaMA's precompute_freqs_cis (base 10000). dim even
 * and > 0, seq_len >= 0, base > 0. On failure both stay untouched. */
ct_status ct_rope_tables(int64_t seq_len, int64_t dim, double base, ct_dtype dtype,
                         ct_device device, ct_tensor **cos, ct_tensor **sin);
/* New tensor: silu(gate) * up, fused (one read of each, one write); gate and
 * up of one shape, floating dtype and device; f16/bf16 compute in f32.
 * Inputs whose last dim is contiguous and whose leading dims fold into rows
 * of one stride (the halves of ct_chunk(h, 2, -1), narrow views) are read in
 * place, here and in ct_swiglu_backward; other layouts are copied first. */
ct_tensor *ct_swiglu(ct_tensor *gate, ct_tensor *up);
/* The gradients of ct_swiglu from grad_out (gate's shape) in one pass: *dgate
 * and *dup receive new tensors; either pointer may be NULL (not wanted), not
 * both. With s = sigmoid(gate): dgate = g up s (1 + gate (1 - s)),
 * dup = g silu(gate). When gate and up are the halves of ct_chunk(h, 2, -1)
 * and both are wanted, *dgate and *dup are the halves of one new tensor of
 * h's shape (the chunk's backward hands it to h without a copy). */
ct_status ct_swiglu_backward(ct_tensor *grad_out, ct_tensor *gate, ct_tensor *up,
                             ct_tensor **dgate, ct_tensor **dup);

/* ---- triangles, cumulative sums, top-k, sampling ---------------------------------------- */
/* New tensor: x (at least 2-d, any dtype) with the elements above the diagonal-th diagonal
 * of its last two dims zeroed (tril: kept where col - row <= diagonal; 0 is the main one). */
ct_tensor *ct_tril(ct_tensor *x, int64_t diagonal);
/* New tensor: x with the elements below the diagonal-th diagonal zeroed (col - row >= diagonal). */
ct_tensor *ct_triu(ct_tensor *x, int64_t diagonal);
/* New tensor: running sums of x along dim (negative counts from the end; a 0-d x takes 0 or
 * -1); int64 for bool and integer x, x's dtype otherwise (f16/bf16 accumulate in f32). */
ct_tensor *ct_cumsum(ct_tensor *x, int dim);
/* New tensor: sums from the end along dim (y_i = sum over j >= i of grad_y_j), the gradient
 * of ct_cumsum; floating grad_y. */
ct_tensor *ct_cumsum_backward(ct_tensor *grad_y, int dim);
/* New tensor: the k largest (largest) or smallest elements of x along dim, best first (sorted
 * is accepted; the result is always sorted, ties by lower index); NaN counts as larger than
 * every number. *indices (when not NULL) receives their int64 positions. 0 <= k <= size of
 * dim; bool x is refused, as PyTorch does. */
ct_tensor *ct_topk(ct_tensor *x, int64_t k, int dim, bool largest, bool sorted,
                   ct_tensor **indices);
/* New tensor: the gradient of ct_topk: zeros shaped as grad_values with dim of size `size`,
 * holding grad_values at indices (int64, distinct along dim, in 0..size-1). */
ct_tensor *ct_topk_backward(ct_tensor *grad_values, ct_tensor *indices, int dim, int64_t size);
/* New int64 tensor: num_samples category indices per row of probs (1-d [n] -> [num_samples],
 * 2-d [rows, n] -> [rows, num_samples]), drawn with probability proportional to the
 * floating, finite, non-negative weights (each row with a positive sum); without
 * replacement num_samples must not exceed a row's non-zero weights. Philox draws from gen
 * (NULL: the default generator), so a generator state gives the same samples on every
 * device. */
ct_tensor *ct_multinomial(ct_tensor *probs, int64_t num_samples, bool replacement,
                          ct_generator *gen);
/* ---- fused linear + cross-entropy ---------------------------------------------------------- */
/* ct_cross_entropy(ct_linear(x, weight, bias), target, NULL, reduction,
 * ignore_index, label_smoothing) without the [N, V] logits (as Liger Kernel's
 * fused linear cross-entropy): x [..., d], weight [V, d], bias [V] or NULL,
 * all of one floating dtype; target int64 of x's leading dims (N in all).
 * New tensor: the loss, target's shape for none, 0-d otherwise; of x's dtype
 * (float32 in an autocast region, see the end of this file). Extra memory
 * O(chunk * V) for a chunk of rows; gradients of x, weight and bias. */
ct_tensor *ct_linear_cross_entropy(ct_tensor *x, ct_tensor *weight, ct_tensor *bias,
                                   ct_tensor *target, int64_t ignore_index,
                                   double label_smoothing, ct_reduction reduction);
/* Its gradients for grad_loss (the loss's shape and x's dtype), recomputed
 * chunk by chunk: new tensors into each of *dx, *dweight, *dbias that is not
 * NULL (dbias needs a bias); asking for none is an error. */
ct_status ct_linear_cross_entropy_backward(ct_tensor *grad_loss, ct_tensor *x, ct_tensor *weight,
                                           ct_tensor *bias, ct_tensor *target,
                                           int64_t ignore_index, double label_smoothing,
                                           ct_reduction reduction, ct_tensor **dx,
                                           ct_tensor **dweight, ct_tensor **dbias);
/* ---- attention ------------------------------------------------------------------------------
 * As torch.nn.functional.scaled_dot_product_attention (PyTorch 2.5, with
 * enable_gqa): q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv] (or all
 * 3-d [H, T, D], one batch), one floating dtype and device; Hq a multiple of
 * Hkv (query head h reads key/value head h / (Hq / Hkv)). Returns a new
 * [B, Hq, T, Dv] (or [Hq, T, Dv]) tensor:
 *   softmax(q k^T * scale + mask) v, dropout applied to the softmax.
 * attn_mask (NULL: none): bool (true = take part) or additive of q's dtype,
 * broadcastable to [B, Hq, T, S] ([Hq, T, S] for 3-d inputs); it gets no
 * gradient (one that requires grad is refused). is_causal: top-left causal (key j > query i masked); an error
 * together with attn_mask. dropout_p in [0, 1): elements of the softmax are
 * dropped with Philox draws from gen (NULL: the default generator; only drawn
 * from when dropout_p > 0), the kept ones scaled by 1 / (1 - dropout_p).
 * scale 0 or NaN means 1 / sqrt(D). A row with every key masked gives 0 (and
 * no gradient), as PyTorch's safe softmax. The autograd node keeps q, k, v,
 * the output and the per-row log-sum-exp, never a T x S matrix. */
ct_tensor *ct_scaled_dot_product_attention(ct_tensor *q, ct_tensor *k, ct_tensor *v,
                                           ct_tensor *attn_mask, double dropout_p,
                                           bool is_causal, double scale, ct_generator *gen);
/* The gradients of the above from the forward's output out and its per-row
 * log-sum-exp lse ([B, Hq, T], float32, float64 for float64; -inf for a row
 * with every key masked), dropout's seed and offset (the Philox draws the
 * forward used) and its other arguments as it received them (scale already
 * resolved or 0). Sets each of *dq, *dk, *dv that is not NULL to a new tensor
 * of q's, k's and v's shape, laid out as that input is (its dims in the order
 * of the input's strides, densely; contiguous when that would not leave the
 * last dim innermost); q, k and v that are consecutive pieces along the heads
 * dim of one dense buffer (a fused projection split and transposed) get three
 * views of one new buffer laid out as theirs. Asking for none is an error. */
ct_status ct_scaled_dot_product_attention_backward(ct_tensor *grad_out, ct_tensor *q,
                                                   ct_tensor *k, ct_tensor *v, ct_tensor *out,
                                                   ct_tensor *lse, ct_tensor *attn_mask,
                                                   double dropout_p, bool is_causal, double scale,
                                                   uint64_t seed, uint64_t offset, ct_tensor **dq,
                                                   ct_tensor **dk, ct_tensor **dv);
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

/* ---- autocast: mixed precision regions, as torch.autocast ----------------------------------
 * Inside a region opened on this thread for a device type, the ops on tensors of that type
 * pick their compute dtype as torch.autocast does (PyTorch 2.x's op lists, one table for
 * every device type; docs/AMP.md):
 *   - matmul, mm, bmm, addmm, linear, conv2d, scaled_dot_product_attention and
 *     linear_cross_entropy cast their inputs to the region's dtype and run in it
 *     (linear_cross_entropy returns a float32 loss, as cross_entropy after a linear does);
 *   - exp, log, rsqrt, reciprocal, pow, pow_scalar, softplus, layer_norm, softmax,
 *     log_softmax, cross_entropy, nll_loss, mse_loss, sum, prod, cumsum and norm cast
 *     float16 and bfloat16 inputs to float32 and run in float32 (cross_entropy without
 *     class weights reads them as they are, computes in float32 and returns a float32
 *     loss: the same values without the casts);
 *   - scatter_add runs in the widest of its inputs' dtypes and the region's;
 *   - rms_norm and rope cast their weight / cos and sin to x's dtype (rope reads float32
 *     cos and sin beside a float16/bfloat16 x as they are, rounding as the cast would);
 *   - add_rms_norm and add_layer_norm add and normalize in float32 (or wider), reading
 *     16-bit inputs as they are, and write y in the out_dtype they are given;
 *   - every other op, and every in-place op, runs on its inputs as given.
 * Only float32, float16 and bfloat16 tensors on the region's device type are cast; float64,
 * integer and bool tensors never are. A cast is the recorded op ct_to_dtype, so gradients
 * flow back through it: leaves keep their dtype and get their gradients in it. Within the
 * outermost region the cast of a float32 leaf that requires grad is made once and reused
 * (made again after the leaf is written in place); the outermost end releases those casts.
 * ct_backward runs outside every region: each gradient runs in its forward's dtype, but
 * for the weight and bias gradients of ct_linear and ct_mlp_gelu through a region's cast of
 * a float32 leaf that no other op read, which leave the GEMM in float32 unrounded
 * (docs/AMP.md).
 *
 * Regions nest like `with torch.autocast(...)` blocks: each begin saves the setting of its
 * device type and the matching ct_autocast_end restores it. End every region on the thread
 * that began it, before that thread exits. No tensors change hands in these calls. */
/* Opens a region in which ops on every device of device's type (its index is not read)
 * autocast to dtype, float16 or bfloat16 (on the CPU as on CUDA). Fails, changing
 * nothing, for another dtype (CT_ERR_DTYPE) or an unknown device type (CT_ERR_DEVICE). */
ct_status ct_autocast_begin(ct_device device, ct_dtype dtype);
/* Opens a region in which device's type does not autocast
 * (torch.autocast(enabled=False)); its dtype stays. Errors as ct_autocast_begin. */
ct_status ct_autocast_begin_disabled(ct_device device);
/* Closes the latest region this thread opened, restoring the setting its begin changed.
 * CT_ERR_INVALID_ARG when none is open. */
ct_status ct_autocast_end(void);
/* Whether ops on device's type autocast now on this thread (false for an unknown type). */
bool ct_autocast_enabled(ct_device device);
/* The dtype device's type autocasts to: the innermost region's, else PyTorch's default
 * (float16 for CUDA, bfloat16 for the CPU); CT_NUM_DTYPES for an unknown type. */
ct_dtype ct_autocast_dtype(ct_device device);
/* Lasting casts, on by default (process-wide): the cast of a float32 leaf that requires
 * grad also stays with the leaf after the outermost region ends (2 bytes an element), and a
 * later region takes it without a kernel while neither the leaf nor the cast has been
 * written since. The optimizers (ct_optim_step) write it with the parameter, rounding the
 * updated float32 value to nearest even as ct_to_dtype does, in the same pass: a training
 * step casts its weights only in its first step, and inference with fixed weights casts
 * them once. The values are those of a fresh cast, so results do not change. Off: casts end
 * with the outermost region, as PyTorch's do, and a leaf's kept cast is dropped when autocast
 * next meets the leaf (or with the leaf). */
void ct_autocast_set_lasting_casts(bool on);
bool ct_autocast_lasting_casts(void);

/* ---- reductions, scans and sorting (issue 20) -----------------------------------------------
 * As PyTorch's. dims lists follow the reductions' rule above (CT_NONE: every dim); dim < 0
 * counts from the end; a 0-d tensor takes dim 0 or -1. Values are ordered as < orders them,
 * with NaN above everything (sort puts NaN last ascending, first descending; kthvalue counts
 * it as the largest) and -0 equal to +0. Every dtype works unless a line says otherwise. */
/* New tensor: log(sum(exp(x))) over dims, computed stably (the max is taken out first; a slice
 * of -inf gives -inf). Integer and bool x give float32, as PyTorch. */
ct_tensor *ct_logsumexp(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim);
/* New bool tensor: whether every element over dims is non-zero (NaN is non-zero); true over
 * an empty slice (torch.all with a dim tuple; CT_NONE: the whole tensor). */
ct_tensor *ct_all(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim);
/* New bool tensor: whether any element over dims is non-zero; false over an empty slice. */
ct_tensor *ct_any(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim);
/* New tensor of x's dtype: the max (amax) or min (amin) over dims; NaN propagates; the
 * gradient is split evenly among the elements equal to the result, per slice. A zero-size
 * reduced dim is an error (no identity). */
ct_tensor *ct_amax(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim);
ct_tensor *ct_amin(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim);
/* New int64 tensor: the number of non-zero elements over dims (no keepdim, as PyTorch). */
ct_tensor *ct_count_nonzero(ct_tensor *x, int ndims, const int64_t *dims);
/* New tensor: the running product along dim (torch.cumprod); int64 for bool and integer x
 * (wrapping), x's dtype otherwise. The gradient is PyTorch's, zeros included. */
ct_tensor *ct_cumprod(ct_tensor *x, int dim);
/* New tensor of x's shape and dtype: x sorted along dim, ascending (descending), and the
 * int64 positions the values came from into *indices when not NULL. The sort is always
 * stable (equal values keep their order), which stable = false allows too. Differentiable
 * for floating x. */
ct_tensor *ct_sort(ct_tensor *x, int dim, bool descending, bool stable, ct_tensor **indices);
/* New int64 tensor: the indices ct_sort returns (torch.argsort). */
ct_tensor *ct_argsort(ct_tensor *x, int dim, bool descending, bool stable);
/* New tensor: the k-th smallest element (1-based, 1 <= k <= size) along dim, its int64 index
 * (the first such in a stable sort) into *indices when not NULL. */
ct_tensor *ct_kthvalue(ct_tensor *x, int64_t k, int dim, bool keepdim, ct_tensor **indices);
/* New 0-d tensor: the lower median of all elements (the ((n - 1) / 2)-th smallest); NaN when
 * any element is NaN. An empty x is an error. */
ct_tensor *ct_median(ct_tensor *x);
/* New tensor: the lower median along dim and its int64 index into *indices when not NULL;
 * a slice holding NaN gives its first NaN and that NaN's index, as PyTorch. */
ct_tensor *ct_median_dim(ct_tensor *x, int dim, bool keepdim, ct_tensor **indices);
/* New tensor: the most frequent value along dim (the smallest among equally frequent ones;
 * each NaN counts apart) and the int64 index of one of its places into *indices when not
 * NULL (torch.mode). Differentiable for floating x, to that place. */
ct_tensor *ct_mode(ct_tensor *x, int dim, bool keepdim, ct_tensor **indices);
/* New int64 tensor [count, ndim]: the coordinates of x's non-zero elements in row-major
 * order (torch.nonzero). On the GPU the count is read back to the host (a sync), as PyTorch. */
ct_tensor *ct_nonzero(ct_tensor *x);
/* New 1-d tensor: the distinct values of x (flattened, as dim=None), ascending (sorted =
 * false is allowed and sorts too). *inverse (x's shape, int64: where each element of x went)
 * and *counts (int64, the number of each value) are set when not NULL. NaNs are each their
 * own value. Syncs with the host on the GPU (the count sizes the result). */
ct_tensor *ct_unique(ct_tensor *x, bool sorted, ct_tensor **inverse, ct_tensor **counts);
/* ---- indexing and shape ops (torch and torch.nn.functional names) ------------------------
 * Every result is a new tensor the caller owns (ct_diagonal and ct_unbind's pieces are
 * views of x). index tensors are int64 unless stated; an index out of range fails with
 * CT_ERR_INDEX on every device (the GPU kernels check on the device, then the host reads
 * the check back). */
/* x with src[p] written at x[p with dim replaced by index[p]] (torch.scatter, reduce none;
 * duplicate positions take the last in index order). Shapes as ct_scatter_add; src has
 * x's dtype. */
ct_tensor *ct_scatter(ct_tensor *x, int dim, ct_tensor *index, ct_tensor *src);
/* torch.scatter with a scalar value (which must fit x's dtype). */
ct_tensor *ct_scatter_value(ct_tensor *x, int dim, ct_tensor *index, double value);
/* torch.scatter_reduce: reduce "sum", "prod", "mean", "amax" or "amin" of src into x at
 * index; include_self false leaves x's own value out of the positions index reaches. mean
 * of integers rounds down (floor division); integer sums and products wrap. bool only with
 * "amax"/"amin"/"sum"/"prod" (or, and). */
ct_tensor *ct_scatter_reduce(ct_tensor *x, int dim, ct_tensor *index, ct_tensor *src,
                             const char *reduce, bool include_self);
/* torch.index_add: x with alpha * source[.., k, ..] added at x[.., index[k], ..] along dim;
 * index 1-d (int64 or int32), source x's shape but index's length along dim. */
ct_tensor *ct_index_add(ct_tensor *x, int dim, ct_tensor *index, ct_tensor *source,
                        double alpha);
/* torch.index_put (out of place): x[indices[0], .., indices[n-1]] = values (+= with
 * accumulate), PyTorch's advanced indexing. Each entry is an int64 index tensor (one dim;
 * negative entries count from the end), a bool mask (as many dims as it has, of x's
 * sizes there: its true positions, through ct_nonzero, so a sync on the GPU) or NULL (a
 * full slice, Python's `:`); the entries cover the leading dims, n <= x.ndim. The index
 * tensors broadcast together; the indexed shape is that broadcast shape with the sliced
 * dims before and after it where the index tensors are next to each other, else the
 * broadcast shape then the sliced dims, then x.shape past the covered dims. values
 * broadcast to it and have x's dtype. Duplicates without accumulate take the last. */
ct_tensor *ct_index_put(ct_tensor *x, int n, ct_tensor *const *indices, ct_tensor *values,
                        bool accumulate);
/* torch.masked_select: 1-d, the elements of x where mask (bool) is true, x and mask
 * broadcast together; waits for the device to learn the count. */
ct_tensor *ct_masked_select(ct_tensor *x, ct_tensor *mask);
/* torch.take: x read as 1-d at index (any shape; negatives count from the end), index's
 * shape. */
ct_tensor *ct_take(ct_tensor *x, ct_tensor *index);
/* torch.flip: x reversed along the ndims dims (distinct). */
ct_tensor *ct_flip(ct_tensor *x, int ndims, const int64_t *dims);
/* torch.roll: x shifted by shifts[k] along dims[k] (elements wrap round); ndims 0 rolls
 * the flattened x by shifts[0] (nshifts 1) and keeps its shape. */
ct_tensor *ct_roll(ct_tensor *x, int nshifts, const int64_t *shifts, int ndims,
                   const int64_t *dims);
/* torch.Tensor.repeat: x tiled repeats[k] (>= 0) times along dim k; n >= x.ndim, leading
 * dims added. */
ct_tensor *ct_repeat(ct_tensor *x, int n, const int64_t *repeats);
/* torch.tile: ct_repeat with reps padded with leading ones to x.ndim. */
ct_tensor *ct_tile(ct_tensor *x, int n, const int64_t *reps);
/* torch.unbind: views of x with dim removed, one per index along dim (*n_out of them,
 * each a new handle); out NULL only counts; fails when more than max_out. */
ct_status ct_unbind(ct_tensor *x, int dim, int max_out, ct_tensor **out, int *n_out);
/* torch.diagonal (a view): the elements (i, i + offset) of dims dim1 and dim2, which go
 * and a last dim of the diagonal's length comes. */
ct_tensor *ct_diagonal(ct_tensor *x, int64_t offset, int dim1, int dim2);
/* torch.diag: a 1-d x gives the square matrix with x on diagonal `diagonal`, a 2-d x
 * gives a copy of that diagonal (1-d). */
ct_tensor *ct_diag(ct_tensor *x, int64_t diagonal);
/* torch.nn.functional.one_hot: int64 x -> int64 [..., num_classes]; num_classes -1 takes
 * max(x) + 1 (waits for the device). Entries outside [0, num_classes) fail. */
ct_tensor *ct_one_hot(ct_tensor *x, int64_t num_classes);

typedef enum ct_pad_mode {
    CT_PAD_CONSTANT = 0,
    CT_PAD_REFLECT = 1,
    CT_PAD_REPLICATE = 2,
    CT_PAD_CIRCULAR = 3,
} ct_pad_mode;
/* torch.nn.functional.pad: npad (even) sizes, last dim first: (left, right) of the last
 * dim, then of the one before. Constant pads with value (negative sizes crop); reflect,
 * replicate and circular pad the last 1, 2 or 3 dims of a batched tensor (npad/2 + 1 or
 * npad/2 + 2 dims), reflect needing pad < size, circular pad <= size. */
ct_tensor *ct_pad(ct_tensor *x, int npad, const int64_t *pad, ct_pad_mode mode, double value);

typedef enum ct_interp_mode {
    CT_INTERP_NEAREST = 0,
    CT_INTERP_BILINEAR = 1,  /* 4-d input */
    CT_INTERP_LINEAR = 2,    /* 3-d input */
    CT_INTERP_TRILINEAR = 3, /* 5-d input */
} ct_interp_mode;
/* torch.nn.functional.interpolate of x [N, C, L], [N, C, H, W] or [N, C, D, H, W]
 * (floating): size or scale_factor with one entry per spatial dim (L; H, W; D, H, W),
 * exactly one non-NULL; nearest for any of them, linear / bilinear / trilinear for 3-d /
 * 4-d / 5-d input as PyTorch's; align_corners only with the interpolating modes. 5-d input
 * is interpolated over H and W, then over D (the same weights, products of one per dim). */
ct_tensor *ct_interpolate(ct_tensor *x, const int64_t *size, const double *scale_factor,
                          ct_interp_mode mode, bool align_corners);
/* torch.nn.functional.unfold (im2col): x [N, C, H, W] or [C, H, W] (floating) ->
 * [N, C kh kw, L] (or [C kh kw, L]), L the number of blocks. */
ct_tensor *ct_unfold(ct_tensor *x, const int64_t kernel_size[2], const int64_t dilation[2],
                     const int64_t padding[2], const int64_t stride[2]);
/* torch.nn.functional.fold (col2im): x [N, C kh kw, L] or [C kh kw, L] -> [N, C, H, W]
 * (or [C, H, W]) with output_size (H, W), overlapping blocks summed. */
ct_tensor *ct_fold(ct_tensor *x, const int64_t output_size[2], const int64_t kernel_size[2],
                   const int64_t dilation[2], const int64_t padding[2], const int64_t stride[2]);
/* ---- elementwise: math, activations, rounding, binary, bitwise, lerp ----------------------
 * PyTorch's names, defaults and dtype rules. Unary float math (log1p .. atanh) takes integer
 * and bool input to float32; the activations and frac take floating dtypes only; the
 * rounding ops keep integer input as it is. Every function returns a new tensor, or NULL
 * with the error set. */
/* log(1 + x), accurate for small x. */
ct_tensor *ct_log1p(ct_tensor *x);
/* exp(x) - 1, accurate for small x. */
ct_tensor *ct_expm1(ct_tensor *x);
/* Base-2 logarithm. */
ct_tensor *ct_log2(ct_tensor *x);
/* Base-10 logarithm. */
ct_tensor *ct_log10(ct_tensor *x);
/* 2^x. */
ct_tensor *ct_exp2(ct_tensor *x);
/* Rounds down; integer input is returned as a copy, bool refused. */
ct_tensor *ct_floor(ct_tensor *x);
/* Rounds up; integer input is returned as a copy, bool refused. */
ct_tensor *ct_ceil(ct_tensor *x);
/* Rounds half to even; integer input is returned as a copy, bool refused. */
ct_tensor *ct_round(ct_tensor *x);
/* torch.round(x, decimals=d): nearbyint(x * 10^d) / 10^d (d < 0: nearbyint(x / 10^-d) *
 * 10^-d), half to even; floating dtypes only. */
ct_tensor *ct_round_decimals(ct_tensor *x, int64_t decimals);
/* Rounds toward zero; integer input is returned as a copy, bool refused. */
ct_tensor *ct_trunc(ct_tensor *x);
/* x - trunc(x), with x's sign; floating dtypes only. */
ct_tensor *ct_frac(ct_tensor *x);
/* Error function, complementary error function, and the inverse error function (erfinv(+-1)
 * is +-inf, NaN outside [-1, 1]). */
ct_tensor *ct_erf(ct_tensor *x);
ct_tensor *ct_erfc(ct_tensor *x);
ct_tensor *ct_erfinv(ct_tensor *x);
/* Trigonometric and hyperbolic functions and their inverses (NaN outside the domain:
 * asin/acos beyond [-1, 1], acosh below 1, atanh beyond [-1, 1]). */
ct_tensor *ct_tan(ct_tensor *x);
ct_tensor *ct_asin(ct_tensor *x);
ct_tensor *ct_acos(ct_tensor *x);
ct_tensor *ct_atan(ct_tensor *x);
ct_tensor *ct_sinh(ct_tensor *x);
ct_tensor *ct_cosh(ct_tensor *x);
ct_tensor *ct_asinh(ct_tensor *x);
ct_tensor *ct_acosh(ct_tensor *x);
ct_tensor *ct_atanh(ct_tensor *x);
/* x where x > 0, negative_slope * x elsewhere (F.leaky_relu, default slope 0.01). */
ct_tensor *ct_leaky_relu(ct_tensor *x, double negative_slope);
/* x where x > 0, alpha (exp(x) - 1) elsewhere (F.elu, default alpha 1). */
ct_tensor *ct_elu(ct_tensor *x, double alpha);
/* scale * elu(x, alpha) with PyTorch's constants alpha = 1.6732632423543772,
 * scale = 1.0507009873554805 (F.selu). */
ct_tensor *ct_selu(ct_tensor *x);
/* max(0, x) + min(0, alpha (exp(x / alpha) - 1)) (F.celu, default alpha 1); alpha must not
 * be 0. */
ct_tensor *ct_celu(ct_tensor *x, double alpha);
/* x tanh(softplus(x)). */
ct_tensor *ct_mish(ct_tensor *x);
/* min(max(x, min_val), max_val) with gradient only strictly inside (F.hardtanh, defaults
 * -1 and 1). */
ct_tensor *ct_hardtanh(ct_tensor *x, double min_val, double max_val);
/* relu6(x + 3) / 6. */
ct_tensor *ct_hardsigmoid(ct_tensor *x);
/* x relu6(x + 3) / 6. */
ct_tensor *ct_hardswish(ct_tensor *x);
/* log(sigmoid(x)) = -softplus(-x), without overflow. */
ct_tensor *ct_logsigmoid(ct_tensor *x);
/* NaN, +inf and -inf replaced by nan, posinf and neginf; pass NAN for posinf/neginf to get
 * PyTorch's defaults (the dtype's largest and lowest finite values; nan defaults to 0).
 * Integer and bool input is returned as a copy. */
ct_tensor *ct_nan_to_num(ct_tensor *x, double nan, double posinf, double neginf);
/* Bool tensors: which elements are NaN, +-inf, finite (integers: false, false, true). */
ct_tensor *ct_isnan(ct_tensor *x);
ct_tensor *ct_isinf(ct_tensor *x);
ct_tensor *ct_isfinite(ct_tensor *x);
/* atan2(a, b), the angle of (b, a), broadcasting; integers give float32. */
ct_tensor *ct_atan2(ct_tensor *a, ct_tensor *b);
/* a - trunc(a / b) b: C's fmod, the result takes a's sign. Integer division by zero is
 * CT_ERR_INVALID_ARG ("ZeroDivisionError", as PyTorch raises) for a CPU b and a scalar 0; a
 * CUDA b is not read for it (that would wait for the device), and its zeros give 0. */
ct_tensor *ct_fmod(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_fmod_scalar(ct_tensor *a, double s);
/* a - floor(a / b) b: Python's %, the result takes b's sign. Integer division by zero as
 * ct_fmod. */
ct_tensor *ct_remainder(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_remainder_scalar(ct_tensor *a, double s);
/* Bitwise ops on integer and bool tensors (floating refused), broadcasting and promoting as
 * PyTorch; shifts on integers only: a left shift by a count outside [0, bits) gives 0, a
 * right shift by one gives the sign fill (0 or -1). The _scalar forms take an integral s. */
ct_tensor *ct_bitwise_and(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_bitwise_or(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_bitwise_xor(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_bitwise_left_shift(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_bitwise_right_shift(ct_tensor *a, ct_tensor *b);
ct_tensor *ct_bitwise_and_scalar(ct_tensor *a, double s);
ct_tensor *ct_bitwise_or_scalar(ct_tensor *a, double s);
ct_tensor *ct_bitwise_xor_scalar(ct_tensor *a, double s);
ct_tensor *ct_bitwise_left_shift_scalar(ct_tensor *a, double s);
ct_tensor *ct_bitwise_right_shift_scalar(ct_tensor *a, double s);
/* ~x on integer and bool (logical not) tensors. */
ct_tensor *ct_bitwise_not(ct_tensor *x);
/* start + weight (end - start), broadcasting the three; start, end and weight must share one
 * floating dtype (as PyTorch, no promotion). */
ct_tensor *ct_lerp(ct_tensor *start, ct_tensor *end, ct_tensor *weight);
ct_tensor *ct_lerp_scalar(ct_tensor *start, ct_tensor *end, double weight);
/* clamp with tensor bounds, min and/or max NULL when absent (not both): min(max(x, min),
 * max), broadcasting the three and promoting as PyTorch; NaN in any gives NaN. */
ct_tensor *ct_clamp_tensor(ct_tensor *x, ct_tensor *min, ct_tensor *max);
/* ---- in-place ops and autograd --------------------------------------------------------------
 * The in-place ops above (ct_add_ ... ct_clamp_, ct_neg_ ... ct_relu_), in
 * grad mode, when the destination has history or an operand requires grad,
 * are recorded as PyTorch records them, its dtype staying:
 * - a destination that is no view: its grad_fn becomes the op's node over
 *   its old history;
 * - a view (ct_narrow, ct_select, ct_slice, ct_transpose, ct_view, ...,
 *   views of views, made in grad mode), of a tensor with history or of a
 *   plain one: the base's grad_fn becomes CopySlices (the view's region
 *   takes the op's gradient, the rest the base's old history's) and the
 *   view's AsStridedBackward, a view of the base's new history. Other views
 *   of the base made before rebuild their history from the base's when next
 *   used (the storage's version tells them).
 * A tensor saved for backward may be written: that backward then fails
 * ("modified by an in-place operation"). Refused (status CT_ERR_AUTOGRAD,
 * nothing written), as PyTorch refuses them: a leaf that requires grad and
 * a view of one, a view made in no-grad mode (when the write would be
 * recorded), a piece returned by ct_split / ct_split_with_sizes / ct_chunk /
 * ct_unbind; an expanded (stride-0) destination is refused in every mode
 * (CT_ERR_INVALID_ARG). In no-grad mode they write plainly. */

/* ---- losses (torch.nn.functional), composed from the ops above ----------------------------
 * Floating inputs on one device; reduction none / mean / sum as PyTorch's
 * (kl_div also batchmean); results are new tensors: the pointwise loss
 * (broadcast shape) for none, 0-d otherwise. Differentiable in every
 * floating argument. NULL with an error naming the op. */
/* kl_div only: the sum over input.size(0) (the sum for a 0-d input). */
#define CT_REDUCTION_BATCHMEAN ((ct_reduction)3)
/* -w (t max(log x, -100) + (1 - t) max(log(1 - x), -100)); target of input's
 * shape, weight (or NULL) broadcast to it; x in [0, 1] is not checked (the
 * check would wait for the device): outside it the loss is NaN. */
ct_tensor *ct_binary_cross_entropy(ct_tensor *input, ct_tensor *target, ct_tensor *weight,
                                   ct_reduction reduction);
/* w ((1 - t) x + (1 + (pos_weight - 1) t) softplus(-x)), softplus(-x) =
 * log1p(exp(-|x|)) + max(-x, 0); target of input's shape; weight and
 * pos_weight (NULL for none) broadcast, pos_weight [C] over the last (class)
 * dim. */
ct_tensor *ct_binary_cross_entropy_with_logits(ct_tensor *input, ct_tensor *target,
                                               ct_tensor *weight, ct_tensor *pos_weight,
                                               ct_reduction reduction);
/* |input - target|, the two broadcast. */
ct_tensor *ct_l1_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction);
/* z = |input - target|: z < beta ? 0.5 z^2 / beta : z - 0.5 beta; beta >= 0
 * (0: l1_loss; PyTorch's default 1). */
ct_tensor *ct_smooth_l1_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction,
                             double beta);
/* z < delta ? 0.5 z^2 : delta (z - 0.5 delta); delta > 0 (default 1). */
ct_tensor *ct_huber_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction,
                         double delta);
/* input: log-probabilities. log_target: exp(t) (t - input), else
 * xlogy(t, t) - t input (0 where t is 0); reduction also
 * CT_REDUCTION_BATCHMEAN (PyTorch's "mean" averages over every element). */
ct_tensor *ct_kl_div(ct_tensor *input, ct_tensor *target, ct_reduction reduction,
                     bool log_target);
/* sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps)) along dim of the two
 * broadcast (eps 1e-8, dim 1 in PyTorch); the norms' clamp is not
 * differentiated, as PyTorch's. New tensor without dim. */
ct_tensor *ct_cosine_similarity(ct_tensor *x1, ct_tensor *x2, int dim, double eps);
/* input1, input2 [N, D] (or [D]), target [N] (or 0-d) of 1 / -1 (any dtype):
 * 1 - cos for 1, max(0, cos - margin) for -1, 0 otherwise, cos over D with
 * PyTorch's 1e-12 in each squared norm. */
ct_tensor *ct_cosine_embedding_loss(ct_tensor *input1, ct_tensor *input2, ct_tensor *target,
                                    double margin, ct_reduction reduction);
/* max(0, -target (input1 - input2) + margin), the three broadcast. */
ct_tensor *ct_margin_ranking_loss(ct_tensor *input1, ct_tensor *input2, ct_tensor *target,
                                  double margin, ct_reduction reduction);
/* cross_entropy with class probabilities: target floating, of logits'
 * shape ([C] or [N, C, d1, ...]); loss = -sum_c w_c log_softmax(x)_c t'_c,
 * t' = t (1 - label_smoothing) + label_smoothing / C; mean divides by the
 * number of positions (N d1 ...), not by the weights. ct_cross_entropy
 * takes this path for a floating target of the logits' shape
 * (ignore_index must be < 0 then, as PyTorch's -100). */
ct_tensor *ct_cross_entropy_prob(ct_tensor *logits, ct_tensor *target, ct_tensor *weight,
                                 ct_reduction reduction, double label_smoothing);
/* ---- linear algebra and layers: dot, outer, einsum, baddbmm, norms, conv1d,
 * conv_transpose2d, 1-d and adaptive pooling ---------------------------------------------
 * PyTorch's names, argument order and defaults (torch / torch.nn.functional). Results are
 * new tensors the caller owns, NULL with a message on error. */

/* New 0-d tensor: sum a[i] b[i] of two 1-d tensors of one length and dtype (floating, or
 * int32/int64 on the CPU), as torch.dot. */
ct_tensor *ct_dot(ct_tensor *a, ct_tensor *b);
/* New [n, m] tensor: a[i] b[j] of 1-d a [n] and b [m] (dtypes promote), as torch.outer. */
ct_tensor *ct_outer(ct_tensor *a, ct_tensor *b);
/* New tensor: torch.einsum(equation, operands...) for n operands of one dtype: letters
 * a-z/A-Z, "..." for broadcast dims, a letter repeated in one operand takes the diagonal,
 * "->out" optional (implicit: letters seen once, sorted, after the "..." dims). Planned
 * through bmm: each pair of operands is permuted and reshaped into one batched product,
 * letters used by one operand only are summed out of it first. */
ct_tensor *ct_einsum(const char *equation, int n, ct_tensor *const *operands);
/* New [B, n, m] tensor: beta * input + alpha * (b1 @ b2) for b1 [B, n, k], b2 [B, k, m],
 * input broadcast to [B, n, m] (beta 0 ignores input, NaNs too), as torch.baddbmm. */
ct_tensor *ct_baddbmm(ct_tensor *input, ct_tensor *batch1, ct_tensor *batch2, double beta,
                      double alpha);

/* New tensor of x [N, C, *]'s shape: torch.nn.functional.batch_norm. training: normalize
 * with the batch's mean and biased variance over every dim but C and, when running_mean
 * and running_var are given (both or neither; [C], float dtype), update them in place
 * (no autograd): r = (1 - momentum) r + momentum * batch statistic, the variance's
 * unbiased. Eval (training false): normalize with the running statistics (required).
 * weight and bias [C] are optional. float16/bfloat16 compute in float32. Differentiable in
 * x, weight and bias. */
ct_tensor *ct_batch_norm(ct_tensor *x, ct_tensor *running_mean, ct_tensor *running_var,
                         ct_tensor *weight, ct_tensor *bias, bool training, double momentum,
                         double eps);
/* The gradients of ct_batch_norm (torch's native_batch_norm_backward) for x [N, C, *]:
 * save_mean and save_var [C] (float32, float64 for float64 x) are the statistics the
 * forward normalized with (the batch's mean and biased variance when training, else the
 * running ones), eps the forward's. Fills each of dx, dweight, dbias that is not NULL
 * (*dweight NULL when weight is NULL); asking for nothing is an error. */
ct_status ct_batch_norm_backward(ct_tensor *grad_y, ct_tensor *x, ct_tensor *weight,
                                 ct_tensor *save_mean, ct_tensor *save_var, bool training,
                                 double eps, ct_tensor **dx, ct_tensor **dweight,
                                 ct_tensor **dbias);
/* New tensor of x [N, C, *]'s shape: torch.nn.functional.group_norm: the C channels in
 * num_groups groups (dividing C), each (n, group) normalized with its mean and biased
 * variance, then weight[c] * y + bias[c] (both optional, [C]). */
ct_tensor *ct_group_norm(ct_tensor *x, int64_t num_groups, ct_tensor *weight, ct_tensor *bias,
                         double eps);
/* New tensor of x [N, C, *]'s shape: torch.nn.functional.instance_norm: each (n, c)
 * normalized over its spatial dims. use_input_stats: with the instance's statistics, and
 * running_mean/running_var [C] (optional) updated in place with the mean over N of them
 * (the variance unbiased); else with the running statistics (required). */
ct_tensor *ct_instance_norm(ct_tensor *x, ct_tensor *running_mean, ct_tensor *running_var,
                            ct_tensor *weight, ct_tensor *bias, bool use_input_stats,
                            double momentum, double eps);

/* New [N, Co, L_out] tensor (or [Co, L_out] for a 2-d input): torch.nn.functional.conv1d
 * of x [N, C, L] with w [Co, C / groups, k] and optional bias [Co], through conv2d. */
ct_tensor *ct_conv1d(ct_tensor *x, ct_tensor *w, ct_tensor *bias, int64_t stride,
                     int64_t padding, int64_t dilation, int64_t groups);
/* New [N, Co, OH, OW] tensor: torch.nn.functional.conv_transpose2d of x [N, Ci, H, W] (or
 * [Ci, H, W]) with w [Ci, Co / groups, kh, kw] and optional bias [Co]:
 * OH = (H - 1) stride - 2 padding + dilation (kh - 1) + output_padding + 1, likewise OW.
 * The gradient of conv2d with respect to its input (cuDNN's backward-data on the GPU).
 * stride, padding, output_padding, dilation may be NULL for 1, 0, 0, 1; output_padding
 * must be smaller than stride. */
ct_tensor *ct_conv_transpose2d(ct_tensor *x, ct_tensor *w, ct_tensor *bias,
                               const int64_t stride[2], const int64_t padding[2],
                               const int64_t output_padding[2], int64_t groups,
                               const int64_t dilation[2]);
/* New [N, C, L_out] (or [C, L_out]) tensor: torch.nn.functional.max_pool1d through
 * max_pool2d; stride 0 means kernel_size (PyTorch's None). *indices (when not NULL)
 * receives the int64 argmax positions along L. */
ct_tensor *ct_max_pool1d(ct_tensor *x, int64_t kernel_size, int64_t stride, int64_t padding,
                         int64_t dilation, bool ceil_mode, ct_tensor **indices);
/* New [N, C, L_out] (or [C, L_out]) tensor: torch.nn.functional.avg_pool1d through
 * avg_pool2d; stride 0 means kernel_size. */
ct_tensor *ct_avg_pool1d(ct_tensor *x, int64_t kernel_size, int64_t stride, int64_t padding,
                         bool ceil_mode, bool count_include_pad);
/* New [N, C, out_h, out_w] (or 3-d) tensor: torch.nn.functional.adaptive_max_pool2d, the
 * largest x of the window rows [floor(i H / out_h), ceil((i + 1) H / out_h)), columns
 * likewise; *indices (when not NULL) receives the int64 argmax h * W + w of each. */
ct_tensor *ct_adaptive_max_pool2d(ct_tensor *x, int64_t out_h, int64_t out_w,
                                  ct_tensor **indices);

#ifdef __cplusplus
}
#endif
#endif
