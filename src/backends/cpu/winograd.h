/* Winograd F(2x2, 3x3) convolution in f32 for 3x3 kernels, stride 1,
 * dilation 1, padding 0..2 (winograd.c). The CPU conv kernels (conv.c) route
 * the shapes it suits here and keep im2col + GEMM for the rest. */
#ifndef CTEN_CPU_WINOGRAD_H
#define CTEN_CPU_WINOGRAD_H

#include "cpu_impl.h"

/* One convolution in forward terms: x [N, G*C, H, W] * w [G*Co, C, 3, 3]
 * -> y [N, G*Co, OH, OW], padding ph/pw, all arrays contiguous. */
typedef struct cti_wino_geo {
    int64_t N, G;
    int64_t C, Co; /* channels per group, in and out */
    int64_t H, W, OH, OW, ph, pw;
} cti_wino_geo;

/* Whether this CPU runs the kernels (they need AVX-512F). */
bool cti_wino_supported(void);

ct_status cti_wino_forward(const cti_wino_geo *g, const float *x, const float *w,
                           const float *bias, float *y);
/* dx [N, G*C, H, W] from dy [N, G*Co, OH, OW]. */
ct_status cti_wino_backward_input(const cti_wino_geo *g, const float *dy, const float *w,
                                  float *dx);
/* dw [G*Co, C, 3, 3] from dy and x. */
ct_status cti_wino_backward_weight(const cti_wino_geo *g, const float *dy, const float *x,
                                   float *dw);

#endif
