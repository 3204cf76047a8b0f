/* Private to the CPU backend: thread pool, elementwise iteration, and the
 * registration functions of each kernel file. */
#ifndef CTEN_CPU_IMPL_H
#define CTEN_CPU_IMPL_H

#include "../../dispatch/dispatch_impl.h"

/* ---- threads ------------------------------------------------------------------- */
typedef void (*cti_range_fn)(int64_t begin, int64_t end, void *ctx);
/* Runs fn over [0, n) in contiguous chunks of at least grain indices on the
 * pool's threads (the caller's thread takes one chunk). Runs inline when
 * n <= grain, with one thread, or when called from inside a pool task. */
void cti_parallel_for(int64_t n, int64_t grain, cti_range_fn fn, void *ctx);
int cti_cpu_threads(void);
ct_status cti_cpu_set_threads(int n);
/* Elements below which elementwise work stays on one thread. */
#define CTI_GRAIN 32768

/* ---- elementwise iteration --------------------------------------------------------- */
#define CTI_MAX_OPERANDS 6
/* Inner loop over n elements; ptrs[k] is operand k's first element, strides[k]
 * its step in bytes (equal to the element size for contiguous rows). */
typedef void (*cti_loop_fn)(char **ptrs, const int64_t *strides, int64_t n, void *ctx);
/* operands[0] is the output and sets the iteration shape; the others
 * broadcast to it (missing leading dims and size-1 dims get stride 0).
 * Dims are coalesced so contiguous operands give one call of n = numel, and
 * large work is split over the pool. */
ct_status cti_cpu_foreach(int nops, ct_tensor *const *operands, cti_loop_fn fn, void *ctx);

/* ---- BLAS (blas.c) ----------------------------------------------------------------------
 * cti_blas_init runs first at registration: it makes sure OpenBLAS runs its
 * best kernels for this CPU (without overriding OPENBLAS_CORETYPE when the
 * user set it) and aligns its thread count with the pool's. */
void cti_blas_init(void);
void cti_blas_set_threads(int n);
const char *cti_cpu_blas_info(void);

/* ---- f32 convolution kernels (winograd.c, conv_direct.c) ----------------------------
 * One convolution in forward terms: x [N, G*C, H, W] * w [G*Co, C, kh, kw]
 * -> y [N, G*Co, OH, OW] with padding ph/pw, stride and dilation 1, all
 * arrays contiguous. conv.c routes the shapes each kernel suits to it. */
typedef struct cti_conv_f32_geo {
    int64_t N, G;
    int64_t C, Co; /* channels per group, in and out */
    int64_t H, W, OH, OW, kh, kw, ph, pw;
} cti_conv_f32_geo;

/* ---- registration, one per kernel file ---------------------------------------------- */

void cti_cpu_register_copy(void);        /* copy/convert, fill, arange, linspace, eye, random */
void cti_cpu_register_elementwise(void); /* unary, binary, where, clamp */
void cti_cpu_register_reduce(void);
void cti_cpu_register_linalg(void);
void cti_cpu_register_conv(void);        /* conv2d and pooling */
void cti_cpu_register_norm(void);        /* rms_norm, layer_norm (the nn files share nn_impl.h) */
void cti_cpu_register_softmax(void);     /* softmax, log_softmax */
void cti_cpu_register_loss(void);        /* cross_entropy, nll_loss, mse_loss */
void cti_cpu_register_embedding(void);
void cti_cpu_register_dropout(void);
void cti_cpu_register_optim(void);       /* fused optimizer updates */

#endif
