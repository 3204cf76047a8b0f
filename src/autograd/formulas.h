/* Private: backward formulas, one per differentiable op, used by the front
 * ends in src/ops/ when they record. Each file of formulas_*.c declares
 * its functions here. */
#ifndef CTEN_FORMULAS_H
#define CTEN_FORMULAS_H

#include "autograd_impl.h"

#define CTI_BW(name) ct_status name(cti_node *n, ct_tensor *const *go, ct_tensor **gi)

/* formulas_elementwise.c
 * Binary nodes have inputs (a, b); scalar and unary nodes have input x. A
 * node whose formula reads params holds its call's cti_pointwise_params; the
 * saved tensors and params each one reads are listed in that file. */
CTI_BW(cti_bw_add);
CTI_BW(cti_bw_neg);
CTI_BW(cti_bw_mul);
CTI_BW(cti_bw_mul_scalar);
CTI_BW(cti_bw_div);
CTI_BW(cti_bw_div_scalar);
CTI_BW(cti_bw_pow);
CTI_BW(cti_bw_pow_scalar);
CTI_BW(cti_bw_maximum);
CTI_BW(cti_bw_minimum);
CTI_BW(cti_bw_maximum_scalar);
CTI_BW(cti_bw_minimum_scalar);
CTI_BW(cti_bw_where);
CTI_BW(cti_bw_clamp);
CTI_BW(cti_bw_abs);
CTI_BW(cti_bw_exp);
CTI_BW(cti_bw_log);
CTI_BW(cti_bw_sqrt);
CTI_BW(cti_bw_rsqrt);
CTI_BW(cti_bw_sin);
CTI_BW(cti_bw_cos);
CTI_BW(cti_bw_tanh);
CTI_BW(cti_bw_sigmoid);
CTI_BW(cti_bw_relu);
CTI_BW(cti_bw_gelu);
CTI_BW(cti_bw_gelu_tanh);
CTI_BW(cti_bw_silu);
CTI_BW(cti_bw_softplus);
CTI_BW(cti_bw_reciprocal);
CTI_BW(cti_bw_square);
CTI_BW(cti_bw_sign);

/* formulas_reduce.c
 * One input x; params the forward's cti_reduce_params (the reduced dims as
 * a bitmask, keepdim, the correction or p). The saved tensors and params
 * each one reads are listed in that file. */
CTI_BW(cti_bw_sum);
CTI_BW(cti_bw_mean);
CTI_BW(cti_bw_prod);
CTI_BW(cti_bw_var);
CTI_BW(cti_bw_std);
CTI_BW(cti_bw_norm);
CTI_BW(cti_bw_max_all);
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

/* formulas_linalg.c
 * matmul/mm/bmm have inputs (a, b), addmm (input, m1, m2), linear (x, w,
 * bias); addmm keeps its cti_gemm_params, the others no params. The saved
 * tensors each one reads are listed in that file. */
CTI_BW(cti_bw_matmul);
CTI_BW(cti_bw_mm);
CTI_BW(cti_bw_bmm);
CTI_BW(cti_bw_addmm);
CTI_BW(cti_bw_linear);

/* formulas_conv.c
 * Inputs, saved tensors and params of each are listed in that file. */
CTI_BW(cti_bw_conv2d);
CTI_BW(cti_bw_max_pool2d);
CTI_BW(cti_bw_avg_pool2d);
CTI_BW(cti_bw_adaptive_avg_pool2d);

/* formulas_nn.c
 * Inputs, saved tensors and params of each are listed in that file. */
CTI_BW(cti_bw_rms_norm);
CTI_BW(cti_bw_layer_norm);
CTI_BW(cti_bw_softmax);
CTI_BW(cti_bw_log_softmax);
CTI_BW(cti_bw_cross_entropy);
CTI_BW(cti_bw_nll_loss);
CTI_BW(cti_bw_mse_loss);
CTI_BW(cti_bw_embedding);
CTI_BW(cti_bw_dropout);

#endif
