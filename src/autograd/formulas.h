/* Private: backward formulas, one per differentiable op, used by the front
 * ends in src/dispatch/ when they record. Each file of formulas_*.c declares
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
 * One input x; i[0] the reduced dims as a bitmask, i[1] keepdim. The saved
 * tensors and params each one reads are listed in that file. */
CTI_BW(cti_bw_sum);
CTI_BW(cti_bw_mean);
CTI_BW(cti_bw_prod);
CTI_BW(cti_bw_var);
CTI_BW(cti_bw_std);
CTI_BW(cti_bw_norm);
CTI_BW(cti_bw_max_all);
CTI_BW(cti_bw_max_dim);

/* formulas_factory.c: one input per joined tensor, params i[0] = dim. */
CTI_BW(cti_bw_cat);
CTI_BW(cti_bw_stack);

/* formulas_views.c
 * One input t, nothing saved; the params of each are listed in that file. */
CTI_BW(cti_bw_view);
CTI_BW(cti_bw_transpose);
CTI_BW(cti_bw_permute);
CTI_BW(cti_bw_slice);
CTI_BW(cti_bw_select);
CTI_BW(cti_bw_expand);

/* formulas_linalg.c
 * matmul/mm/bmm have inputs (a, b), addmm (input, m1, m2), linear (x, w,
 * bias); the saved tensors and params each one reads are listed in that file. */
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
