/* Private: backward formulas, one per differentiable op, used by the front
 * ends in src/dispatch/ when they record. Each file of formulas_*.c declares
 * its functions here. */
#ifndef CTEN_FORMULAS_H
#define CTEN_FORMULAS_H

#include "autograd_impl.h"

#define CTI_BW(name) ct_status name(cti_node *n, ct_tensor *const *go, ct_tensor **gi)

/* formulas_elementwise.c
 * Binary nodes have inputs (a, b); scalar and unary nodes have input x. The
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
CTI_BW(cti_bw_reciprocal);
CTI_BW(cti_bw_square);
CTI_BW(cti_bw_sign);

/* formulas_reduce.c */

/* formulas_views.c */

/* formulas_linalg.c */

/* formulas_conv.c */

/* formulas_nn.c */

#endif
