/* Direct convolution in f32 for layers with few input channels per group
 * (the first layer of an image network), stride 1, dilation 1: the forward
 * and the weight gradient (conv_direct.c). The CPU conv kernels (conv.c)
 * route the shapes it suits here. */
#ifndef CTEN_CPU_CONV_DIRECT_H
#define CTEN_CPU_CONV_DIRECT_H

#include "cpu_impl.h"

/* The geometry is cti_conv_f32_geo (cpu_impl.h): OH = H + 2 ph - kh + 1,
 * OW = W + 2 pw - kw + 1. */

/* Whether this CPU runs the kernels (they need AVX-512F). */
bool cti_direct_supported(void);

ct_status cti_direct_forward(const cti_conv_f32_geo *g, const float *x, const float *w,
                             const float *bias, float *y);
/* dw [G*Co, C, kh, kw] from dy [N, G*Co, OH, OW] and x. */
ct_status cti_direct_backward_weight(const cti_conv_f32_geo *g, const float *dy, const float *x,
                                     float *dw);

#endif
