/* Winograd F(2x2, 3x3) convolution in f32 for 3x3 kernels, stride 1,
 * dilation 1, padding 0..2 (winograd.c). The CPU conv kernels (conv.c) route
 * the shapes it suits here and keep im2col + GEMM for the rest. */
#ifndef CTEN_CPU_WINOGRAD_H
#define CTEN_CPU_WINOGRAD_H

#include "cpu_impl.h"

/* The geometry is cti_conv_f32_geo (cpu_impl.h) with kh = kw = 3. */

/* Whether this CPU runs the kernels (they need AVX-512F). */
bool cti_wino_supported(void);

ct_status cti_wino_forward(const cti_conv_f32_geo *g, const float *x, const float *w,
                           const float *bias, float *y);
/* dx [N, G*C, H, W] from dy [N, G*Co, OH, OW]. */
ct_status cti_wino_backward_input(const cti_conv_f32_geo *g, const float *dy, const float *w,
                                  float *dx);
/* dw [G*Co, C, 3, 3] from dy and x. */
ct_status cti_wino_backward_weight(const cti_conv_f32_geo *g, const float *dy, const float *x,
                                   float *dw);

#endif
