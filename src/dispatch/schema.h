/* Private: the op schema. One row per dispatchable op, and the typed
 * parameter struct of each op family.
 *
 * A row is CTI_OP(ID, name, params, grad, backward):
 *   ID        the op's id suffix: CT_OP_##ID in the public ct_op enum, which
 *             the build generates from this list (tensor/op_ids.h)
 *   name      what ct_op_name, the trace and the profile print
 *   params    the struct its kernels receive as ct_call.params, defined
 *             below once per family (cti_no_params: the op has none)
 *   grad      CTI_F(formula): differentiable, the backward formula
 *             (src/autograd/) autograd records for its tensor form;
 *             CTI_NODIFF: no gradient (integer or bool results, factories,
 *             in-place updates); CTI_NOFORMULA: PyTorch differentiates it
 *             (double backward) but cten has no formula, so a result that
 *             needs grad gets a node that refuses backward with a message
 *   backward  the op whose kernels the formula runs (CONV2D ->
 *             CONV2D_BACKWARD_INPUT), or NONE when the formula is made of
 *             other public ops; init checks that every (device, dtype)
 *             with a forward kernel has a backward one
 *
 * Each layer expands the columns it needs: the dispatcher the ids, names
 * and parameter sizes, autograd the formulas. The file includes only public
 * headers, so the generator of tensor/op_ids.h compiles it alone. */
#ifndef CTEN_SCHEMA_H
#define CTEN_SCHEMA_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "tensor/types.h"

typedef struct ct_tensor ct_tensor;

/* ---- parameter structs, one per op family ---------------------------------------- */

/* Ops that take no parameters (ct_call.params is NULL). */
typedef struct cti_no_params {
    char unused;
} cti_no_params;

/* FILL: every element of out[0] = value, converted to its dtype. */
typedef struct cti_fill_params {
    double value;
} cti_fill_params;

/* ARANGE: arange(start, end, step) or linspace(start, end, steps); steps
 * elements either way, element k = start + k * step (linspace pins the last
 * one to end). */
typedef struct cti_range_params {
    double start, step, end;
    int64_t steps;
    bool linspace;
} cti_range_params;

/* RAND_UNIFORM [a, b), RAND_NORMAL (mean a, std b), RANDINT [low, high):
 * Philox-4x32-10 with key seed, counter blocks from offset on. */
typedef struct cti_random_params {
    double a, b;
    int64_t low, high;
    uint64_t seed, offset;
} cti_random_params;

/* Unary, binary, where and clamp (the ops without parameters pass it
 * zeroed). alpha/ialpha: add and sub compute a + alpha * b (sub passes
 * -alpha); ialpha is alpha for integer results. lo/hi, ilo/ihi: clamp's
 * bounds in floating and integer form (an absent bound is infinite). scalar:
 * the number of a tensor-scalar op (mul, div, pow, maximum, minimum), which
 * its backward formula reads. beta/threshold: softplus computes
 * log(1 + exp(beta x)) / beta, and x where beta x > threshold. */
typedef struct cti_pointwise_params {
    double alpha;
    int64_t ialpha;
    double lo, hi;
    int64_t ilo, ihi;
    double scalar;
    double beta, threshold;
    /* leaky_relu's negative_slope. elu, selu, celu: x > 0 ? scale x :
     * scale alpha (exp(input_scale x) - 1), as PyTorch's elu kernel. hardtanh
     * reads lo/hi. nan_to_num: the replacements of NaN, +inf and -inf.
     * round with decimals: the number of decimal places (negative: tens). */
    double negative_slope;
    double elu_alpha, elu_scale, elu_input_scale;
    double nan_val, posinf_val, neginf_val;
    int64_t decimals;
    /* gelu_backward (in grad_out, x): the forward's approximation, a
     * ct_gelu_approx (0 exact, 1 tanh). threshold_backward (in grad_out,
     * x) reads threshold. */
    int64_t approximate;
} cti_pointwise_params;

/* SUM ... ARGMIN, and the nodes of their formulas. mask: the reduced dims of
 * x as bits (bit d: dim d; 0 for a 0-d x); keepdim: the result keeps them
 * with size 1 (the kernels' output layout is the same either way);
 * correction: VAR's (Bessel's is 1); std: VAR returns its square root; p:
 * NORM's order. Fields an op does not use are 0. */
typedef struct cti_reduce_params {
    uint64_t mask;
    bool keepdim;
    double correction;
    bool std;
    double p;
} cti_reduce_params;

/* MM, BMM, ADDMM: out = beta * input + alpha * (a @ b); mm and bmm have no
 * input and pass beta 0, alpha 1. LINEAR_BACKWARD_WEIGHT (no params): in[0]
 * a [n, k] (the output gradient transposed, a view), in[1] b [k, m] (the
 * input), out[0] = a @ b [n, m] (the weight gradient) and out[1][i] = the
 * sum of a's row i [n] (the bias gradient), both contiguous, each in the
 * inputs' dtype or, for float16/bfloat16 inputs, float32: the float32
 * accumulators unrounded (a gradient autograd widens, formulas.h). Such
 * calls dispatch on the inputs' dtype; so do the MM and SUM calls of its
 * composite, whose outputs are then float32 too.
 *
 * LINEAR_GELU and LINEAR_DGELU (cti_pointwise_params: approximate, a
 * ct_gelu_approx) are the two ends of an MLP's activation, each fused with
 * its GEMM. LINEAR_GELU: in[0] the bias broadcast to [n, m] (stride 0 down
 * the rows) or NULL, in[1] x [n, k], in[2] w^T [k, m]; out[0] = gelu(pre)
 * and out[1] = pre = x @ w^T + bias, both [n, m] contiguous. LINEAR_DGELU:
 * in[0] grad_y [n, k], in[1] w [k, m], in[2] pre [n, m];
 * out[0] = gelu'(pre) * (grad_y @ w), the gradient of pre, [n, m]
 * contiguous, and out[1] (or NULL) its sums over the rows [m]. One dtype,
 * but out[1] may be float32 for float16/bfloat16 operands (a widened
 * gradient, as LINEAR_BACKWARD_WEIGHT's). */
typedef struct cti_gemm_params {
    double beta, alpha;
} cti_gemm_params;

/* CONV2D, CONV2D_BACKWARD_INPUT, CONV2D_BACKWARD_WEIGHT: x [N, C, H, W] *
 * w [Co, C / groups, kh, kw] -> y [N, Co, OH, OW] with
 *   y[n, co, oh, ow] = sum over c < C / groups, i < kh, j < kw of w[co, c, i, j] *
 *     x[n, g * C / groups + c, oh * stride[0] - padding[0] + i * dilation[0],
 *                              ow * stride[1] - padding[1] + j * dilation[1]]
 * where g = co / (Co / groups) is co's group and x is zero outside the
 * image; [0] is the height's, [1] the width's. All three ops get the
 * forward's sizes, and the conv node keeps the forward's struct for its
 * stride, padding, dilation and groups. CONV2D_BACKWARD_BIAS takes none: it
 * sums grad_out over N, OH and OW. */
typedef struct cti_conv_params {
    int64_t N, C, H, W;
    int64_t Co, kh, kw;
    int64_t stride[2], padding[2], dilation[2];
    int64_t groups;
    int64_t OH, OW;
} cti_conv_params;

/* MAX_POOL2D, AVG_POOL2D, ADAPTIVE_AVG_POOL2D and their backward ops
 * (ADAPTIVE_MAX_POOL2D too: the adaptive windows, with max's indices):
 * x [N, C, H, W] -> [N, C, OH, OW], output (oh, ow) pooling the window of
 * kernel[0] x kernel[1] elements from (oh * stride[0] - padding[0],
 * ow * stride[1] - padding[1]), dilation apart. OH and OW already hold
 * ceil_mode's rounding; ceil_mode is kept for the avg_pool2d node, whose
 * backward passes it back to ct_avg_pool2d_backward. count_include_pad:
 * avg_pool2d divides by the window clipped to the padded input rather than
 * to the input. max_pool2d_backward and the adaptive ops use only the sizes
 * (the indices, or the output size, give the windows). */
typedef struct cti_pool_params {
    int64_t N, C, H, W;
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    int64_t OH, OW;
    bool ceil_mode, count_include_pad;
} cti_pool_params;

/* RMS_NORM, LAYER_NORM, the fused ADD_RMS_NORM and ADD_LAYER_NORM and their
 * backward ops: rows of d elements, each normalized on its own; eps is the
 * forward's (the backward ops leave it 0). The fused ops' records (every
 * tensor contiguous; the dispatch dtype is the sum's, which weight and bias
 * have; x, residual and y may each have another floating dtype):
 *   add_rms_norm:   in x, residual, weight|NULL;        out y, sum, inv_rms
 *   add_layer_norm: in x, residual, weight|NULL, bias|NULL; out y, sum, mean, rstd
 *   add_rms_norm_backward:   in grad_y|NULL, grad_sum|NULL, sum, weight|NULL, inv_rms;
 *                            out dx|NULL, dresidual|NULL, dweight|NULL
 *   add_layer_norm_backward: in grad_y|NULL, grad_sum|NULL, sum, weight|NULL, mean, rstd;
 *                            out dx|NULL, dresidual|NULL, dweight|NULL, dbias|NULL
 * sum = x + residual rounded to its dtype; y = the norm of that stored sum;
 * dx = dresidual = grad_sum + the norm's input gradient from grad_y (a NULL
 * gradient is zero), each written in its own dtype. */
typedef struct cti_norm_params {
    int64_t rows, d;
    double eps;
} cti_norm_params;

/* SOFTMAX, LOG_SOFTMAX and their backward ops: x viewed as [outer, d, inner]
 * with the softmax over d; log: log_softmax. dim is the user's dim wrapped
 * into 0..ndim-1, which the forward's node hands to the backward op. */
typedef struct cti_softmax_params {
    int64_t outer, d, inner;
    int dim;
    bool log;
} cti_softmax_params;

/* CROSS_ENTROPY, NLL_LOSS and their backward ops: input [n, c, inner] (n = 1
 * and inner = 1 for a 1-d input) against n * inner int64 targets; targets
 * equal to ignore_index count for nothing; label_smoothing is cross_entropy's
 * (nll: 0). MSE_LOSS and its backward: n elements, c, inner and the rest
 * unused. reduction is a ct_reduction.
 * CROSS_ENTROPY may have a second output, the row statistics: n * inner + 1
 * elements of f32 (f64 for f64 logits), position p's log-sum-exp at p (any
 * value at an ignored position) and the sum of the counted positions' class
 * weights last. CROSS_ENTROPY_BACKWARD may take them as in[4] (in[3], the
 * weight, may then be NULL); a kernel may read them instead of folding each
 * row again, or ignore them. */
typedef struct cti_loss_params {
    int64_t n, c, inner;
    int reduction;
    int64_t ignore_index;
    double label_smoothing;
} cti_loss_params;

/* EMBEDDING, EMBEDDING_BACKWARD: n indices into num_weights rows of d.
 * padding_idx: the row whose gradient stays zero, -1 for none (the forward
 * passes -1, which its node hands to the backward op). */
typedef struct cti_embedding_params {
    int64_t num_weights, d, n;
    int64_t padding_idx;
} cti_embedding_params;

/* DROPOUT, DROPOUT_BACKWARD: n elements zeroed with probability p, the rest
 * scaled by 1 / (1 - p). The forward keeps element k iff the f32 uniform of
 * Philox draw offset + k under key seed is >= p (the backward ops leave seed
 * and offset 0 and read the saved mask). */
typedef struct cti_dropout_params {
    uint64_t seed, offset;
    int64_t n;
    double p;
} cti_dropout_params;

/* SGD_STEP, ADAMW_STEP, ADAM_STEP, RMSPROP_STEP, ADAGRAD_STEP: n
 * parameters with their gradients and states, all of the dispatch dtype, on
 * the dispatch device and contiguous. state[0] holds SGD's momentum buffers
 * (NULL without momentum), AdamW's and Adam's exp_avg, RMSprop's
 * square_avg or Adagrad's sum; state[1] AdamW's and Adam's exp_avg_sq or
 * RMSprop's momentum_buffer (NULL without momentum); state[2] Adam's
 * max_exp_avg_sq (NULL without amsgrad) or RMSprop's grad_avg (NULL unless
 * centered); the states not named are NULL. updated (NULL: not wanted) receives which
 * parameters the call dispatched.
 *
 * Each parameter's step count comes in one of two forms:
 *  - on the host: step[k], the count including this update (>= 1), which
 *    the caller advances;
 *  - in memory (capturable, as torch.optim's capturable=True): step_t[k],
 *    a 0-d float64 on the parameter's device holding the count before this
 *    update, which the kernel reads and advances by one, and ctl[k], a
 *    float64 [2] on that device: [0] the learning rate (used instead of the
 *    hyperparameters' lr), [1] all zero bits, a block counter the CUDA
 *    kernel uses and leaves zero. The entries of one device share one ctl.
 *    Nothing about the step is read on the host, so a CUDA graph that
 *    recorded the update replays it right, and a changed ctl[0] takes effect.
 * step_t (NULL: every entry on the host) and ctl may be NULL per entry.
 *
 * master (NULL: none; per entry NULL or a tensor): float32 master weights of
 * a float16/bfloat16 parameter: the update reads and writes the master and
 * its float32 states (state[b][k] are float32 then), reads the gradient in
 * the parameter's dtype, and writes the master rounded (to nearest even)
 * into the parameter.
 *
 * found_inf (NULL: none): a 0-d float32 on the dispatch device; when it is
 * not zero the kernel writes nothing (parameters, states, masters and the
 * counts of step_t stay as they were), as torch's fused optimizers do with
 * the found_inf of a GradScaler.
 *
 * weight_decay (NULL: the hyperparameters' for every entry): entry k's
 * weight decay. The front end dispatches the entries of one value together
 * with it in the hyperparameters, so the kernels see NULL here. */
typedef struct cti_optim_list {
    int64_t n;
    ct_tensor *const *param;
    ct_tensor *const *grad;
    ct_tensor *const *state[3];
    const int64_t *step;
    bool *updated;
    ct_tensor *const *step_t;
    ct_tensor *const *ctl;
    ct_tensor *const *master;
    ct_tensor *found_inf;
    const double *weight_decay;
    /* Per entry, NULL or a float16/bfloat16 contiguous tensor of a float32
     * parameter's shape and device (no masters) that receives the updated
     * parameter rounded to its dtype: autocast's lasting cast. Filled by
     * the front end, not by callers. */
    ct_tensor *const *copy;
} cti_optim_list;

/* SGD_STEP's hyperparameters, as ct_optim_sgd_new takes them. */
typedef struct cti_sgd_hparams {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
} cti_sgd_hparams;

/* ADAMW_STEP's hyperparameters, as ct_optim_adamw_new takes them. */
typedef struct cti_adamw_hparams {
    double lr, beta1, beta2, eps, weight_decay;
} cti_adamw_hparams;

/* ADAM_STEP's (torch.optim.Adam: weight decay added to the gradient). */
typedef struct cti_adam_hparams {
    double lr, beta1, beta2, eps, weight_decay;
    bool amsgrad;
} cti_adam_hparams;

/* RMSPROP_STEP's (torch.optim.RMSprop). */
typedef struct cti_rmsprop_hparams {
    double lr, alpha, eps, weight_decay, momentum;
    bool centered;
} cti_rmsprop_hparams;

/* ADAGRAD_STEP's (torch.optim.Adagrad; initial_accumulator_value is the
 * state's first value, not the kernels'). */
typedef struct cti_adagrad_hparams {
    double lr, lr_decay, eps, weight_decay;
} cti_adagrad_hparams;

/* The hyperparameters of the op dispatched: one member of the union. */
typedef struct cti_optim_params {
    cti_optim_list list;
    union {
        cti_sgd_hparams sgd;         /* SGD_STEP */
        cti_adamw_hparams adamw;     /* ADAMW_STEP */
        cti_adam_hparams adam;       /* ADAM_STEP */
        cti_rmsprop_hparams rmsprop; /* RMSPROP_STEP */
        cti_adagrad_hparams adagrad; /* ADAGRAD_STEP */
    };
} cti_optim_params;

/* SDPA, SDPA_BACKWARD: scaled dot-product attention, as PyTorch's
 * scaled_dot_product_attention. q [B, Hq, T, D], k [B, Hkv, S, D],
 * v [B, Hkv, S, Dv], out [B, Hq, T, Dv]; Hq is a multiple of Hkv and query
 * head h reads key/value head h / (Hq / Hkv) (grouped-query attention). The
 * tensors' last dims are contiguous; the other dims may have any strides
 * (the kernels read ct_tensor strides). Per (b, h, i):
 *   s_j = scale * q_i . k_j + mask_ij   (j < S; mask: 0 or -inf for a bool
 *         mask, the value for an additive one; causal: -inf where j > i)
 *   p_j = exp(s_j - lse_i), lse_i = log sum_j exp(s_j)  (the per-row log-sum-exp,
 *         f32 for f16/bf16/f32, f64 for f64, the only thing the backward keeps)
 *   out_i = sum_j drop_ij p_j v_j, drop_ij = keep_ij / (1 - dropout_p)
 * A row whose every s_j is -inf gives out_i = 0 and lse_i = -inf, and no
 * gradient (PyTorch's safe softmax). keep_ij: the f32 uniform (top 24 bits)
 * of Philox-4x32-10 draw offset + ((b * Hq + h) * T + i) * S + j under key
 * seed is >= dropout_p, so every backend drops the same elements and the
 * backward regenerates them. mask_kind: CTI_ATTN_MASK_NONE, _BOOL (bool
 * tensor, true = take part) or _ADD (of q's dtype), always expanded to
 * [B, Hq, T, S] (stride 0 where it broadcasts).
 * SDPA: in q, k, v, mask|NULL; out out, lse [B, Hq, T].
 * SDPA_BACKWARD: in grad_out, q, k, v, out, lse, mask|NULL; out dq, dk, dv. */
enum { CTI_ATTN_MASK_NONE = 0, CTI_ATTN_MASK_BOOL = 1, CTI_ATTN_MASK_ADD = 2 };
typedef struct cti_attention_params {
    int64_t B, Hq, Hkv, T, S, D, Dv;
    double scale;
    double dropout_p;
    bool is_causal;
    int mask_kind;
    uint64_t seed, offset;
} cti_attention_params;

/* rope, swiglu
 * ROPE, ROPE_BACKWARD: rotary position embedding of x [..., d] (d even) in
 * rows of d elements, each row's pairs (a, b) turned by its angles:
 *   out_a = a cos - b sin, out_b = b cos + a sin
 * pair k is (k, k + d/2) for CTI_ROPE_HALF (GPT-NeoX, LLaMA) and (2k, 2k + 1)
 * for CTI_ROPE_INTERLEAVED (GPT-J), and its angle is entry k of the row's
 * d/2 table entries. in: x (ROPE) or grad_out (ROPE_BACKWARD), cos, sin;
 * out: the contiguous result of x's shape. x's last dim is contiguous, its
 * other dims may have any strides; cos and sin are x's dtype, expanded to
 * [..., d/2] with x's leading dims (stride 0 where they broadcast), their
 * last dim contiguous, and with equal strides. ROPE_BACKWARD turns by the
 * opposite angles (the transposed rotation). The kernels read the strides
 * from the tensors.
 * SWIGLU: out = silu(gate) up elementwise. SWIGLU_BACKWARD: in grad_out,
 * gate, up; out dgate|NULL, dup|NULL (s = sigmoid(gate)):
 *   dgate = g up s (1 + gate (1 - s)), dup = g gate s
 * Both in f32 for f16/bf16/f32, f64 for f64. Every operand is seen as
 * [rows, cols] with a contiguous row: input k's element (r, j) is at
 * cti_data(in[k]) + r ld[k] + j (ld in elements, any value, 0 included:
 * inputs are only read), so the halves of ct_chunk(h, 2, -1) are read in
 * place. Output element (r, j) is at cti_data(out[k]) + r ldo + j: ldo is
 * cols for new contiguous outputs, 2 cols when SWIGLU_BACKWARD's dgate and
 * dup are the two halves of one new [rows, 2 cols] buffer (gate and up the
 * halves of one tensor: the gradient of the chunk's input is that buffer).
 * A call on contiguous operands has rows 1 and cols the element count. */
enum { CTI_ROPE_HALF = 0, CTI_ROPE_INTERLEAVED = 1 };
typedef struct cti_rope_params {
    int64_t rows, d;
    int layout;
} cti_rope_params;

typedef struct cti_swiglu_params {
    int64_t rows, cols;
    int64_t ld[3]; /* row stride of in[k] */
    int64_t ldo;   /* row stride of the outputs */
} cti_swiglu_params;

/* tril, cumsum, topk, multinomial ------------------------------------------------------
 * TRIL, TRIU: in x, out y, both contiguous [outer, n, inner] = [batch, rows,
 *   cols]; y(i, j) = x(i, j) where j - i <= diagonal (tril) or
 *   j - i >= diagonal (triu), zero bits elsewhere; every dtype.
 * CUMSUM: in x, out y, contiguous [outer, n, inner], the sum along n:
 *   y(o, i, r) = sum over j <= i (reverse: j >= i) of x(o, j, r), added in
 *   index order (reverse: from the end) so every backend rounds alike. y is
 *   int64 for bool and integer x (accumulated in int64), x's dtype otherwise
 *   (f16/bf16/f32 accumulate in f32, f64 in f64); dispatched on x's dtype.
 *   dim: the user's dim, wrapped (the node's backward runs reverse on it).
 * TOPK: in x [outer, n] contiguous (the front end moves dim last); out
 *   values [outer, k] (x's dtype) and indices [outer, k] int64: the k
 *   elements of each row with the largest (largest) or smallest keys, best
 *   first, ties by lower index. The key orders values as < does, with NaN
 *   above everything (either way, so smallest takes NaN last) and -0 == +0.
 * TOPK_BACKWARD: in grad [outer, k], indices [outer, k] int64 (distinct
 *   per row); out [outer, n] zero but grad at the indices; dim for messages.
 * MULTINOMIAL: in probs [outer, n] contiguous floating, weights >= 0 and
 *   finite with a positive sum per row (a kernel finding otherwise fails
 *   with a message; CUDA records a fault). Uniform number s of row r, U(r, s),
 *   is cti_multinomial_uniform of Philox draws offset + 2 * (r * m + s) and
 *   the one after (m: k with replacement, n without), under key seed.
 *   With replacement: out samples [outer, k] int64. Row r's cumulative
 *   weights are cut into CTI_MULTINOMIAL_CHUNKS chunks of ceil(n / chunks)
 *   elements; P(c) = P(c-1) + (the chunk's sum, added in order from 0),
 *   P(0) = 0; cdf(j) = P(c) + (j's running sum in its chunk), all in f64.
 *   Sample s is the first j with cdf(j) > U(r, s) * P(chunks) (the last
 *   j of positive weight when none). Without replacement: out keys
 *   [outer, n] f64, w / -log(1 - U(r, j)) for w > 0 and -1 for w == 0
 *   (exponential race: the k largest keys are a draw without replacement,
 *   in draw order); a row with fewer than k positive weights fails. */
typedef struct cti_seq_params {
    int64_t outer, n, inner;
    int64_t diagonal; /* tril, triu */
    int64_t k;        /* topk's k, multinomial's num_samples */
    int dim;          /* cumsum, topk: the user's dim, wrapped */
    bool reverse;     /* cumsum */
    bool largest;     /* topk */
    bool replacement; /* multinomial */
    uint64_t seed, offset;
} cti_seq_params;

#define CTI_MULTINOMIAL_CHUNKS 256

/* A uniform in [0, 1) of 53 bits from two 32-bit Philox words. */
static inline double cti_multinomial_uniform(uint32_t a, uint32_t b) {
    return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * 0x1p-53;
}
/* indexing */
/* GATHER, INDEX_SELECT: in x, index; out out (index's shape, x's dtype,
 * contiguous). out[p] = x[p with coordinate dim replaced by index[p]].
 * SCATTER_ADD: in x, index, src; out out (x's shape, contiguous), which
 * holds a copy of x already (the front end's): out[p with coordinate dim
 * replaced by index[p]] += src[p] for every p of index's shape, in
 * increasing order along dim, each add rounded to the dtype (so every
 * backend sums in the same order; bool adds as or, integers wrap). index is int64 or int32; every tensor
 * has at least one dim (front ends view 0-d ones as [1]) and the same
 * ndim, and the kernels read their shapes and strides (index may have
 * stride 0: index_select expands a 1-d index). dim is non-negative;
 * indices must lie in [0, size), size = x.size(dim): a kernel finding one
 * outside fails with CT_ERR_INDEX naming the op, the first such index in
 * row-major order and the range, and touches no memory out of bounds. */
typedef struct cti_index_params {
    int dim;
    int64_t size;
} cti_index_params;

/* ---- the kernels' contract ------------------------------------------------------
 * in[] holds the first parameter's tensors for the trace only.
 * Per element, in double for float64 and float otherwise (p the master
 * where there is one), with t the count including this update and lr the
 * hyperparameters' or ctl[0]:
 *   SGD:   d = g + wd * p; momentum != 0: buf = t == 1 ? d : momentum * buf +
 *          (1 - dampening) * d, d = nesterov ? d + momentum * buf : buf;
 *          p = p - lr * d.
 *   AdamW: p = p * (1 - lr * wd); m = beta1 * m + (1 - beta1) * g;
 *          v = beta2 * v + (1 - beta2) * g * g;
 *          p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
 *          with cti_adamw_scalars' per-parameter step_size and bc2_sqrt
 *          (computed in double and rounded to the compute type). */
static inline void cti_adamw_scalars(double lr, double beta1, double beta2, double step,
                                     double *step_size, double *bc2_sqrt) {
    double bc1 = 1 - pow(beta1, step), bc2 = 1 - pow(beta2, step);
    *step_size = lr / bc1;
    *bc2_sqrt = sqrt(bc2);
}

/* The new optimizers' contract, as above (g the gradient, wd, t, lr):
 *   Adam:    g = g + wd * p; m = beta1 * m + (1 - beta1) * g;
 *            v = beta2 * v + (1 - beta2) * g * g; amsgrad: vmax = max(vmax, v),
 *            read as v below; p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
 *            (cti_adamw_scalars' step_size and bc2_sqrt).
 *   RMSprop: g = g + wd * p; sq = alpha * sq + (1 - alpha) * g * g;
 *            centered: ga = alpha * ga + (1 - alpha) * g, avg = sqrt(sq - ga * ga),
 *            else avg = sqrt(sq); avg = avg + eps; momentum > 0:
 *            buf = momentum * buf + g / avg, p = p - lr * buf; else
 *            p = p - lr * g / avg.
 *   Adagrad: g = g + wd * p; sum = sum + g * g;
 *            p = p - clr * g / (sqrt(sum) + eps), clr = lr / (1 + (t - 1) * lr_decay)
 *            (in double, rounded to the compute type). */
static inline double cti_adagrad_clr(double lr, double lr_decay, double step) {
    return lr / (1 + (step - 1) * lr_decay);
}

/* AMP_UNSCALE (torch's _amp_foreach_non_finite_check_and_unscale_): n
 * contiguous gradients, of any floating dtypes (the dispatch dtype is
 * grad[0]'s; one call takes them all), on the dispatch device, in place:
 * where an element is not finite, *found_inf = 1 (never reset here);
 * every element is multiplied by inv = (float)(1.0 / (double)*scale) in its
 * compute type (float for float16/bfloat16/float32, double for float64;
 * unchanged when inv is 1). found_inf and scale: 0-d float32 on the device.
 * in[0]: grad[0] for the trace. */
typedef struct cti_amp_unscale_params {
    int64_t n;
    ct_tensor *const *grad;
    ct_tensor *found_inf, *scale;
} cti_amp_unscale_params;

/* AMP_UPDATE_SCALE (torch's _amp_update_scale_): in[0] scale (0-d float32),
 * in[1] growth_tracker (0-d int32), in[2] found_inf (0-d float32), one
 * device, updated in place: found_inf != 0: scale *= backoff_factor,
 * tracker = 0; else tracker + 1 == growth_interval: scale *= growth_factor
 * (kept when the product is not finite), tracker = 0; else tracker += 1.
 * The products are taken in double and rounded to float. */
typedef struct cti_amp_update_params {
    double growth_factor, backoff_factor;
    int64_t growth_interval;
} cti_amp_update_params;

/* CROSS_ENTROPY_FUSED (the row kernel of ct_linear_cross_entropy): in[0]
 * logits [rows, c] contiguous, in[1] int64 targets [rows], in[2] NULL or a
 * [rows] tensor of the logits' dtype scaling each row's gradient; out[0]
 * each row's loss, lse - (1 - ls) z_t - ls / c * sum(z), in f32 (f64 for
 * f64 logits), 0 where the target is ignore_index. With grad, the logits
 * are overwritten IN PLACE with the gradient
 *   scale * in[2][row] * (softmax(z) - (1 - ls) [j == t] - ls / c)
 * (0 on ignored rows). A target outside [0, c) is an error (CPU) or a
 * recorded fault (CUDA). */
typedef struct cti_ce_fused_params {
    int64_t rows, c;
    int64_t ignore_index;
    double label_smoothing, scale;
    bool grad;
} cti_ce_fused_params;

/* sort, cumprod, nonzero ----------------------------------------------------------------
 * SORT: in x [outer, n] contiguous (the front end moves dim last); out
 *   values [outer, n] (x's dtype) and indices [outer, n] int64: each row in
 *   ascending order of its keys (descending: descending), always stable
 *   (equal keys keep their index order, either way). The key orders values
 *   as < does, NaN above everything and -0 == +0 (so ascending puts NaN
 *   last and descending first, as PyTorch). dim: the user's dim, wrapped
 *   (messages and the backward).
 * NONZERO: in[0] x contiguous (any dtype; an element counts when it is not
 *   zero, NaN counting), in[1] int64 [numel], the inclusive running count of
 *   x's non-zero elements in row-major order (the front end's cumsum; its
 *   last entry, synced to the host, sized the result); out [count, ndim]
 *   int64: row r the coordinates (in shape[0..ndim)) of the r-th non-zero
 *   element. ndim 0 gives out [count, 0], which needs no kernel.
 * CUMPROD: cti_seq_params as CUMSUM (outer, n, inner, dim), the running
 *   product along n in index order: int64 for bool and integer x (wrapping
 *   as two's complement), x's dtype otherwise (f16/bf16 multiply in f32, f32
 *   in f32, f64 in f64). */
typedef struct cti_sort_params {
    int64_t outer, n;
    int dim;
    bool descending;
    int ndim;                      /* nonzero */
    int64_t shape[CT_MAX_DIMS];    /* nonzero */
} cti_sort_params;
/* indexing and shape ops ----------------------------------------------------------------
 * SCATTER, SCATTER_REDUCE: in x (for the trace), index, src; out out (x's
 *   shape, contiguous), which holds a copy of x already (the front end's).
 *   For every p of index's shape, in increasing order along dim, out[p with
 *   coordinate dim replaced by index[p]] = reduce(that element, src[p]):
 *   CTI_SCATTER_ASSIGN stores src[p] (the last in order wins), _SUM adds
 *   (rounded to the dtype each time, integers wrap, bool is or), _PROD
 *   multiplies (likewise; bool is and), _AMAX / _AMIN keep the larger /
 *   smaller (NaN wins, as PyTorch's). src may be an
 *   expanded 0-d value (stride 0). index is int64; the tensors have the same
 *   ndim >= 1 and the kernels read their strides; indices outside [0, size)
 *   fail with CT_ERR_INDEX as GATHER's do. scatter_reduce's mean is the sum
 *   divided by counts by the front end.
 * FLIP, ROLL, REPEAT, PAD: one gather-style copy kernel. in x; out out
 *   (contiguous, ndim dims as x, or 1-d views of both for 0-d). Along dim k,
 *   output coordinate o reads input coordinate i = f(o - lo[k]) of x's size
 *   n there: CTI_REMAP_IDENT i = o - lo, the fill value where i is outside
 *   [0, n) (constant pad, and lo = 0 with equal sizes: a plain copy);
 *   _FLIP i = n - 1 - o; _WRAP i = (o - lo) mod n (roll, repeat, circular
 *   pad); _REFLECT reflect about the ends without repeating them; _CLAMP the
 *   nearest end (replicate). value is the fill value.
 * INTERPOLATE, INTERPOLATE_BACKWARD: x [N, C, H, W] -> [N, C, OH, OW] as
 *   PyTorch's upsample_nearest2d / upsample_bilinear2d; scale_h, scale_w
 *   the source-per-destination ratios (1 / scale_factor when the user gave
 *   one, else in / out; align_corners' (in - 1) / (out - 1) is the kernels'),
 *   the coordinates computed in double for float64 and float otherwise. The
 *   backward op: in grad_out; out grad_x (N, C, H, W), accumulated.
 * UNFOLD (im2col), FOLD (col2im): x [N, C, H, W] <-> cols [N, C kh kw, L],
 *   L = OH OW blocks; block (oh, ow), kernel element (i, j) reads pixel
 *   (oh stride0 - pad0 + i dil0, ow stride1 - pad1 + j dil1), zero outside.
 *   FOLD sums every column element into its pixel (in the order of c kh kw,
 *   then blocks, so every backend sums alike). */
enum {
    CTI_SCATTER_ASSIGN = 0,
    CTI_SCATTER_SUM = 1,
    CTI_SCATTER_AMAX = 2,
    CTI_SCATTER_AMIN = 3,
    CTI_SCATTER_PROD = 4,
};
typedef struct cti_scatter_params {
    int dim;
    int64_t size;
    int reduce;
    bool from_reduce; /* messages name ct_scatter_reduce (its include_self pass runs SCATTER) */
} cti_scatter_params;

enum {
    CTI_REMAP_IDENT = 0,
    CTI_REMAP_FLIP = 1,
    CTI_REMAP_WRAP = 2,
    CTI_REMAP_REFLECT = 3,
    CTI_REMAP_CLAMP = 4,
};
typedef struct cti_remap_params {
    int nd;
    int mode[CT_MAX_DIMS];
    int64_t lo[CT_MAX_DIMS];
    double value;
} cti_remap_params;

enum { CTI_INTERP_NEAREST = 0, CTI_INTERP_BILINEAR = 1 };
typedef struct cti_interp_params {
    int64_t N, C, H, W, OH, OW;
    int mode;
    bool align_corners;
    double scale_h, scale_w;
} cti_interp_params;

typedef struct cti_fold_params {
    int64_t N, C, H, W;
    int64_t kernel[2], dilation[2], padding[2], stride[2];
    int64_t OH, OW;
} cti_fold_params;
/* layers: batch norm ------------------------------------------------------------------
 * BATCH_NORM, BATCH_NORM_BACKWARD: x contiguous [N, C, S], each channel c
 * normalized over its N * S elements:
 *   y = (x - mean_c) * invstd_c * w_c + b_c,  invstd_c = 1 / sqrt(var_c + eps)
 * (w 1 and b 0 when absent). Statistics are [C] of f32 (f64 for f64 x).
 * BATCH_NORM: in x, weight|NULL, bias|NULL, mean|NULL, var|NULL; out y
 *   [N, C, S] contiguous, and with training out[1] mean and out[2] var (the
 *   batch's, var biased), computed in double; without training in[3] and
 *   in[4] (the running statistics) are the ones used.
 * BATCH_NORM_BACKWARD: in grad_y [N, C, S] contiguous, x, weight|NULL, mean,
 *   var (those the forward used); out dx|NULL, dweight|NULL, dbias|NULL with
 *   xhat = (x - mean) invstd, sums over N and S:
 *   training: dx = w invstd (dy - sum(dy) / (N S) - xhat sum(dy xhat) / (N S))
 *   else:     dx = w invstd dy
 *   dweight = sum(dy xhat), dbias = sum(dy). */
typedef struct cti_batch_norm_params {
    int64_t N, C, S;
    double eps;
    bool training;
} cti_batch_norm_params;

/* ---- the rows ------------------------------------------------------------------------ */
#define CTI_OP_SCHEMA(X)                                                                     \
    X(COPY, "copy", cti_no_params, CTI_NODIFF, NONE)                                         \
    X(FILL, "fill", cti_fill_params, CTI_NODIFF, NONE)                                       \
    X(ARANGE, "arange", cti_range_params, CTI_NODIFF, NONE)                                  \
    X(RAND_UNIFORM, "uniform", cti_random_params, CTI_NODIFF, NONE)                          \
    X(RAND_NORMAL, "normal", cti_random_params, CTI_NODIFF, NONE)                            \
    X(RANDINT, "randint", cti_random_params, CTI_NODIFF, NONE)                               \
    X(NEG, "neg", cti_pointwise_params, CTI_F(cti_bw_neg), NONE)                             \
    X(ABS, "abs", cti_pointwise_params, CTI_F(cti_bw_abs), NONE)                             \
    X(EXP, "exp", cti_pointwise_params, CTI_F(cti_bw_exp), NONE)                             \
    X(LOG, "log", cti_pointwise_params, CTI_F(cti_bw_log), NONE)                             \
    X(SQRT, "sqrt", cti_pointwise_params, CTI_F(cti_bw_sqrt), NONE)                          \
    X(RSQRT, "rsqrt", cti_pointwise_params, CTI_F(cti_bw_rsqrt), NONE)                       \
    X(SIN, "sin", cti_pointwise_params, CTI_F(cti_bw_sin), NONE)                             \
    X(COS, "cos", cti_pointwise_params, CTI_F(cti_bw_cos), NONE)                             \
    X(TANH, "tanh", cti_pointwise_params, CTI_F(cti_bw_tanh), NONE)                          \
    X(SIGMOID, "sigmoid", cti_pointwise_params, CTI_F(cti_bw_sigmoid), NONE)                 \
    X(RELU, "relu", cti_pointwise_params, CTI_F(cti_bw_relu), THRESHOLD_BACKWARD)            \
    X(GELU, "gelu", cti_pointwise_params, CTI_F(cti_bw_gelu), GELU_BACKWARD)                 \
    X(GELU_TANH, "gelu_tanh", cti_pointwise_params, CTI_F(cti_bw_gelu_tanh), GELU_BACKWARD)  \
    X(SILU, "silu", cti_pointwise_params, CTI_F(cti_bw_silu), NONE)                          \
    X(SOFTPLUS, "softplus", cti_pointwise_params, CTI_F(cti_bw_softplus), NONE)              \
    X(RECIPROCAL, "reciprocal", cti_pointwise_params, CTI_F(cti_bw_reciprocal), NONE)        \
    X(SQUARE, "square", cti_pointwise_params, CTI_F(cti_bw_square), NONE)                    \
    X(SIGN, "sign", cti_pointwise_params, CTI_F(cti_bw_sign), NONE)                          \
    X(LOGICAL_NOT, "logical_not", cti_pointwise_params, CTI_NODIFF, NONE)                    \
    X(ADD, "add", cti_pointwise_params, CTI_F(cti_bw_add), NONE)                             \
    X(SUB, "sub", cti_pointwise_params, CTI_F(cti_bw_add), NONE)                             \
    X(MUL, "mul", cti_pointwise_params, CTI_F(cti_bw_mul), NONE)                             \
    X(DIV, "div", cti_pointwise_params, CTI_F(cti_bw_div), NONE)                             \
    X(POW, "pow", cti_pointwise_params, CTI_F(cti_bw_pow), NONE)                             \
    X(MAXIMUM, "maximum", cti_pointwise_params, CTI_F(cti_bw_maximum), NONE)                 \
    X(MINIMUM, "minimum", cti_pointwise_params, CTI_F(cti_bw_minimum), NONE)                 \
    X(EQ, "eq", cti_pointwise_params, CTI_NODIFF, NONE)                                      \
    X(NE, "ne", cti_pointwise_params, CTI_NODIFF, NONE)                                      \
    X(LT, "lt", cti_pointwise_params, CTI_NODIFF, NONE)                                      \
    X(LE, "le", cti_pointwise_params, CTI_NODIFF, NONE)                                      \
    X(GT, "gt", cti_pointwise_params, CTI_NODIFF, NONE)                                      \
    X(GE, "ge", cti_pointwise_params, CTI_NODIFF, NONE)                                      \
    X(LOGICAL_AND, "logical_and", cti_pointwise_params, CTI_NODIFF, NONE)                    \
    X(LOGICAL_OR, "logical_or", cti_pointwise_params, CTI_NODIFF, NONE)                      \
    X(WHERE, "where", cti_pointwise_params, CTI_F(cti_bw_where), NONE)                       \
    X(CLAMP, "clamp", cti_pointwise_params, CTI_F(cti_bw_clamp), NONE)                       \
    X(SUM, "sum", cti_reduce_params, CTI_F(cti_bw_sum), NONE)                                \
    X(MEAN, "mean", cti_reduce_params, CTI_F(cti_bw_mean), NONE)                             \
    X(PROD, "prod", cti_reduce_params, CTI_F(cti_bw_prod), NONE)                             \
    X(VAR, "var", cti_reduce_params, CTI_F(cti_bw_var), NONE)                                \
    X(NORM, "norm", cti_reduce_params, CTI_F(cti_bw_norm), NONE)                             \
    X(MAX, "max", cti_reduce_params, CTI_F(cti_bw_max_all), NONE)                            \
    X(MIN, "min", cti_reduce_params, CTI_F(cti_bw_max_all), NONE)                            \
    X(ARGMAX, "argmax", cti_reduce_params, CTI_NODIFF, NONE)                                 \
    X(ARGMIN, "argmin", cti_reduce_params, CTI_NODIFF, NONE)                                 \
    X(MM, "mm", cti_gemm_params, CTI_F(cti_bw_mm), NONE)                                     \
    X(BMM, "bmm", cti_gemm_params, CTI_F(cti_bw_bmm), NONE)                                  \
    X(ADDMM, "addmm", cti_gemm_params, CTI_F(cti_bw_addmm), NONE)                            \
    X(LINEAR_BACKWARD_WEIGHT, "linear_backward_weight", cti_no_params, CTI_NOFORMULA, NONE)  \
    X(LINEAR_GELU, "linear_gelu", cti_pointwise_params, CTI_NOFORMULA, NONE)                \
    X(LINEAR_DGELU, "linear_dgelu", cti_pointwise_params, CTI_NOFORMULA, NONE)              \
    X(CONV2D, "conv2d", cti_conv_params, CTI_F(cti_bw_conv2d), CONV2D_BACKWARD_INPUT)        \
    X(CONV2D_BACKWARD_INPUT, "conv2d_backward_input", cti_conv_params, CTI_NOFORMULA, NONE)  \
    X(CONV2D_BACKWARD_WEIGHT, "conv2d_backward_weight", cti_conv_params, CTI_NOFORMULA,      \
      NONE)                                                                                  \
    X(CONV2D_BACKWARD_BIAS, "conv2d_backward_bias", cti_no_params, CTI_NOFORMULA, NONE)      \
    X(MAX_POOL2D, "max_pool2d", cti_pool_params, CTI_F(cti_bw_max_pool2d),                   \
      MAX_POOL2D_BACKWARD)                                                                   \
    X(MAX_POOL2D_BACKWARD, "max_pool2d_backward", cti_pool_params, CTI_NOFORMULA, NONE)      \
    X(AVG_POOL2D, "avg_pool2d", cti_pool_params, CTI_F(cti_bw_avg_pool2d),                   \
      AVG_POOL2D_BACKWARD)                                                                   \
    X(AVG_POOL2D_BACKWARD, "avg_pool2d_backward", cti_pool_params, CTI_NOFORMULA, NONE)      \
    X(ADAPTIVE_AVG_POOL2D, "adaptive_avg_pool2d", cti_pool_params,                           \
      CTI_F(cti_bw_adaptive_avg_pool2d), ADAPTIVE_AVG_POOL2D_BACKWARD)                       \
    X(ADAPTIVE_AVG_POOL2D_BACKWARD, "adaptive_avg_pool2d_backward", cti_pool_params,         \
      CTI_NOFORMULA, NONE)                                                                   \
    X(RMS_NORM, "rms_norm", cti_norm_params, CTI_F(cti_bw_rms_norm), RMS_NORM_BACKWARD)      \
    X(RMS_NORM_BACKWARD, "rms_norm_backward", cti_norm_params, CTI_NOFORMULA, NONE)          \
    X(LAYER_NORM, "layer_norm", cti_norm_params, CTI_F(cti_bw_layer_norm),                   \
      LAYER_NORM_BACKWARD)                                                                   \
    X(LAYER_NORM_BACKWARD, "layer_norm_backward", cti_norm_params, CTI_NOFORMULA, NONE)      \
    X(ADD_RMS_NORM, "add_rms_norm", cti_norm_params, CTI_F(cti_bw_add_rms_norm),             \
      ADD_RMS_NORM_BACKWARD)                                                                 \
    X(ADD_RMS_NORM_BACKWARD, "add_rms_norm_backward", cti_norm_params, CTI_NOFORMULA, NONE)  \
    X(ADD_LAYER_NORM, "add_layer_norm", cti_norm_params, CTI_F(cti_bw_add_layer_norm),       \
      ADD_LAYER_NORM_BACKWARD)                                                               \
    X(ADD_LAYER_NORM_BACKWARD, "add_layer_norm_backward", cti_norm_params, CTI_NOFORMULA,    \
      NONE)                                                                                  \
    X(SOFTMAX, "softmax", cti_softmax_params, CTI_F(cti_bw_softmax), SOFTMAX_BACKWARD)       \
    X(LOG_SOFTMAX, "log_softmax", cti_softmax_params, CTI_F(cti_bw_log_softmax),             \
      LOG_SOFTMAX_BACKWARD)                                                                  \
    X(SOFTMAX_BACKWARD, "softmax_backward", cti_softmax_params, CTI_NOFORMULA, NONE)         \
    X(LOG_SOFTMAX_BACKWARD, "log_softmax_backward", cti_softmax_params, CTI_NOFORMULA, NONE) \
    X(CROSS_ENTROPY, "cross_entropy", cti_loss_params, CTI_F(cti_bw_cross_entropy),          \
      CROSS_ENTROPY_BACKWARD)                                                                \
    X(CROSS_ENTROPY_BACKWARD, "cross_entropy_backward", cti_loss_params, CTI_NOFORMULA,      \
      NONE)                                                                                  \
    X(NLL_LOSS, "nll_loss", cti_loss_params, CTI_F(cti_bw_nll_loss), NLL_LOSS_BACKWARD)      \
    X(NLL_LOSS_BACKWARD, "nll_loss_backward", cti_loss_params, CTI_NOFORMULA, NONE)          \
    X(MSE_LOSS, "mse_loss", cti_loss_params, CTI_F(cti_bw_mse_loss), MSE_LOSS_BACKWARD)      \
    X(MSE_LOSS_BACKWARD, "mse_loss_backward", cti_loss_params, CTI_NOFORMULA, NONE)          \
    X(EMBEDDING, "embedding", cti_embedding_params, CTI_F(cti_bw_embedding),                 \
      EMBEDDING_BACKWARD)                                                                    \
    X(EMBEDDING_BACKWARD, "embedding_backward", cti_embedding_params, CTI_NOFORMULA, NONE)   \
    X(DROPOUT, "dropout", cti_dropout_params, CTI_F(cti_bw_dropout), DROPOUT_BACKWARD)       \
    X(DROPOUT_BACKWARD, "dropout_backward", cti_dropout_params, CTI_NOFORMULA, NONE)         \
    X(SGD_STEP, "sgd_step", cti_optim_params, CTI_NODIFF, NONE)                              \
    X(ADAMW_STEP, "adamw_step", cti_optim_params, CTI_NODIFF, NONE)                          \
    X(AMP_UNSCALE, "amp_non_finite_check_and_unscale", cti_amp_unscale_params, CTI_NODIFF,   \
      NONE)                                                                                  \
    X(AMP_UPDATE_SCALE, "amp_update_scale", cti_amp_update_params, CTI_NODIFF, NONE)         \
    /* rope, swiglu */                                                                       \
    X(ROPE, "rope", cti_rope_params, CTI_F(cti_bw_rope), ROPE_BACKWARD)                      \
    X(ROPE_BACKWARD, "rope_backward", cti_rope_params, CTI_NOFORMULA, NONE)                  \
    X(SWIGLU, "swiglu", cti_swiglu_params, CTI_F(cti_bw_swiglu), SWIGLU_BACKWARD)            \
    X(SWIGLU_BACKWARD, "swiglu_backward", cti_swiglu_params, CTI_NOFORMULA, NONE)            \
    /* tril, cumsum, topk, multinomial */                                                    \
    X(TRIL, "tril", cti_seq_params, CTI_F(cti_bw_tril), NONE)                                \
    X(TRIU, "triu", cti_seq_params, CTI_F(cti_bw_triu), NONE)                                \
    X(CUMSUM, "cumsum", cti_seq_params, CTI_F(cti_bw_cumsum), NONE)                          \
    X(TOPK, "topk", cti_seq_params, CTI_F(cti_bw_topk), TOPK_BACKWARD)                       \
    X(TOPK_BACKWARD, "topk_backward", cti_seq_params, CTI_NOFORMULA, NONE)                   \
    X(MULTINOMIAL, "multinomial", cti_seq_params, CTI_NODIFF, NONE)                          \
    X(CROSS_ENTROPY_FUSED, "cross_entropy_fused", cti_ce_fused_params, CTI_NODIFF, NONE)  \
    X(SDPA, "scaled_dot_product_attention", cti_attention_params, CTI_F(cti_bw_sdpa),         \
      SDPA_BACKWARD)                                                                         \
    X(SDPA_BACKWARD, "scaled_dot_product_attention_backward", cti_attention_params,           \
      CTI_NOFORMULA, NONE)                                                                   \
    /* indexing */                                                                           \
    X(GATHER, "gather", cti_index_params, CTI_F(cti_bw_gather), NONE)                        \
    X(INDEX_SELECT, "index_select", cti_index_params, CTI_F(cti_bw_index_select), NONE)      \
    X(SCATTER_ADD, "scatter_add", cti_index_params, CTI_F(cti_bw_scatter_add), NONE)      \
    /* sort, cumprod, nonzero */                                                             \
    X(SORT, "sort", cti_sort_params, CTI_F(cti_bw_sort), NONE)                               \
    X(CUMPROD, "cumprod", cti_seq_params, CTI_F(cti_bw_cumprod), NONE)                       \
    X(NONZERO, "nonzero", cti_sort_params, CTI_NODIFF, NONE)                                 \
    /* indexing and shape ops */                                                             \
    X(SCATTER, "scatter", cti_scatter_params, CTI_F(cti_bw_scatter), NONE)                   \
    X(SCATTER_REDUCE, "scatter_reduce", cti_scatter_params, CTI_F(cti_bw_scatter_reduce),    \
      NONE)                                                                                  \
    X(FLIP, "flip", cti_remap_params, CTI_F(cti_bw_flip), NONE)                              \
    X(ROLL, "roll", cti_remap_params, CTI_F(cti_bw_roll), NONE)                              \
    X(REPEAT, "repeat", cti_remap_params, CTI_F(cti_bw_repeat), NONE)                        \
    X(PAD, "pad", cti_remap_params, CTI_F(cti_bw_pad), NONE)                                 \
    X(INTERPOLATE, "interpolate", cti_interp_params, CTI_F(cti_bw_interpolate),              \
      INTERPOLATE_BACKWARD)                                                                  \
    X(INTERPOLATE_BACKWARD, "interpolate_backward", cti_interp_params, CTI_NOFORMULA, NONE)  \
    X(UNFOLD, "unfold", cti_fold_params, CTI_F(cti_bw_unfold), NONE)                         \
    X(FOLD, "fold", cti_fold_params, CTI_F(cti_bw_fold), NONE)                               \
    /* elementwise: unary math, activations, rounding, binary, bitwise, lerp */              \
    X(LOG1P, "log1p", cti_pointwise_params, CTI_F(cti_bw_log1p), NONE)                       \
    X(EXPM1, "expm1", cti_pointwise_params, CTI_F(cti_bw_expm1), NONE)                       \
    X(LOG2, "log2", cti_pointwise_params, CTI_F(cti_bw_log2), NONE)                          \
    X(LOG10, "log10", cti_pointwise_params, CTI_F(cti_bw_log10), NONE)                       \
    X(EXP2, "exp2", cti_pointwise_params, CTI_F(cti_bw_exp2), NONE)                          \
    X(FLOOR, "floor", cti_pointwise_params, CTI_F(cti_bw_sign), NONE)                        \
    X(CEIL, "ceil", cti_pointwise_params, CTI_F(cti_bw_sign), NONE)                          \
    X(ROUND, "round", cti_pointwise_params, CTI_F(cti_bw_sign), NONE)                        \
    X(ROUND_DECIMALS, "round_decimals", cti_pointwise_params, CTI_F(cti_bw_sign), NONE)      \
    X(TRUNC, "trunc", cti_pointwise_params, CTI_F(cti_bw_sign), NONE)                        \
    X(FRAC, "frac", cti_pointwise_params, CTI_F(cti_bw_add), NONE)                           \
    X(ERF, "erf", cti_pointwise_params, CTI_F(cti_bw_erf), NONE)                             \
    X(ERFC, "erfc", cti_pointwise_params, CTI_F(cti_bw_erfc), NONE)                          \
    X(ERFINV, "erfinv", cti_pointwise_params, CTI_F(cti_bw_erfinv), NONE)                    \
    X(TAN, "tan", cti_pointwise_params, CTI_F(cti_bw_tan), NONE)                             \
    X(ASIN, "asin", cti_pointwise_params, CTI_F(cti_bw_asin), NONE)                          \
    X(ACOS, "acos", cti_pointwise_params, CTI_F(cti_bw_acos), NONE)                          \
    X(ATAN, "atan", cti_pointwise_params, CTI_F(cti_bw_atan), NONE)                          \
    X(SINH, "sinh", cti_pointwise_params, CTI_F(cti_bw_sinh), NONE)                          \
    X(COSH, "cosh", cti_pointwise_params, CTI_F(cti_bw_cosh), NONE)                          \
    X(ASINH, "asinh", cti_pointwise_params, CTI_F(cti_bw_asinh), NONE)                       \
    X(ACOSH, "acosh", cti_pointwise_params, CTI_F(cti_bw_acosh), NONE)                       \
    X(ATANH, "atanh", cti_pointwise_params, CTI_F(cti_bw_atanh), NONE)                       \
    X(LEAKY_RELU, "leaky_relu", cti_pointwise_params, CTI_F(cti_bw_leaky_relu), NONE)        \
    X(ELU, "elu", cti_pointwise_params, CTI_F(cti_bw_elu), NONE)                             \
    X(MISH, "mish", cti_pointwise_params, CTI_F(cti_bw_mish), NONE)                          \
    X(HARDTANH, "hardtanh", cti_pointwise_params, CTI_F(cti_bw_hardtanh), NONE)              \
    X(HARDSIGMOID, "hardsigmoid", cti_pointwise_params, CTI_F(cti_bw_hardsigmoid), NONE)     \
    X(HARDSWISH, "hardswish", cti_pointwise_params, CTI_F(cti_bw_hardswish), NONE)           \
    X(LOGSIGMOID, "log_sigmoid", cti_pointwise_params, CTI_F(cti_bw_logsigmoid), NONE)       \
    X(NAN_TO_NUM, "nan_to_num", cti_pointwise_params, CTI_F(cti_bw_nan_to_num), NONE)        \
    X(ISNAN, "isnan", cti_pointwise_params, CTI_NODIFF, NONE)                                \
    X(ISINF, "isinf", cti_pointwise_params, CTI_NODIFF, NONE)                                \
    X(ISFINITE, "isfinite", cti_pointwise_params, CTI_NODIFF, NONE)                          \
    X(BITWISE_NOT, "bitwise_not", cti_pointwise_params, CTI_NODIFF, NONE)                    \
    X(ATAN2, "atan2", cti_pointwise_params, CTI_F(cti_bw_atan2), NONE)                       \
    X(FMOD, "fmod", cti_pointwise_params, CTI_F(cti_bw_fmod), NONE)                          \
    X(REMAINDER, "remainder", cti_pointwise_params, CTI_F(cti_bw_remainder), NONE)           \
    X(BITWISE_AND, "bitwise_and", cti_pointwise_params, CTI_NODIFF, NONE)                    \
    X(BITWISE_OR, "bitwise_or", cti_pointwise_params, CTI_NODIFF, NONE)                      \
    X(BITWISE_XOR, "bitwise_xor", cti_pointwise_params, CTI_NODIFF, NONE)                    \
    X(BITWISE_LEFT_SHIFT, "bitwise_left_shift", cti_pointwise_params, CTI_NODIFF, NONE)      \
    X(BITWISE_RIGHT_SHIFT, "bitwise_right_shift", cti_pointwise_params, CTI_NODIFF, NONE)    \
    X(LERP, "lerp", cti_pointwise_params, CTI_F(cti_bw_lerp), NONE)                          \
    X(GELU_BACKWARD, "gelu_backward", cti_pointwise_params, CTI_NOFORMULA, NONE)             \
    X(THRESHOLD_BACKWARD, "threshold_backward", cti_pointwise_params, CTI_NOFORMULA, NONE)   \
    /* optimizers: Adam, RMSprop, Adagrad */                                                 \
    X(ADAM_STEP, "adam_step", cti_optim_params, CTI_NODIFF, NONE)                            \
    X(RMSPROP_STEP, "rmsprop_step", cti_optim_params, CTI_NODIFF, NONE)                      \
    X(ADAGRAD_STEP, "adagrad_step", cti_optim_params, CTI_NODIFF, NONE)                      \
    /* layers: adaptive max pooling (its backward is max_pool2d's, from the indices) */     \
    X(ADAPTIVE_MAX_POOL2D, "adaptive_max_pool2d", cti_pool_params,                           \
      CTI_F(cti_bw_max_pool2d), MAX_POOL2D_BACKWARD)                                         \
    X(BATCH_NORM, "batch_norm", cti_batch_norm_params, CTI_F(cti_bw_batch_norm),             \
      BATCH_NORM_BACKWARD)                                                                   \
    X(BATCH_NORM_BACKWARD, "batch_norm_backward", cti_batch_norm_params, CTI_NOFORMULA,      \
      NONE)

/* What the table's shape assumes of the parameter structs: autograd nodes
 * keep a copy of their op's parameters in CTI_PARAMS_MAX bytes. (The CUDA
 * backend's .cu files read the structs too, as C++.) */
#define CTI_PARAMS_MAX 192
#ifdef __cplusplus
#define CTI_STATIC_ASSERT_ static_assert
#else
#define CTI_STATIC_ASSERT_ _Static_assert
#endif
#define CTI_PARAMS_FIT_(ID, name, P, grad, bw)                                               \
    CTI_STATIC_ASSERT_(sizeof(P) <= CTI_PARAMS_MAX, "params of " name " exceed CTI_PARAMS_MAX");
CTI_OP_SCHEMA(CTI_PARAMS_FIT_)
#undef CTI_PARAMS_FIT_

#endif
