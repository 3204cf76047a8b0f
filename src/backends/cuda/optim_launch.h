/* Private to the CUDA backend: the launch record of the fused optimizer
 * updates (optim.c fills it from a ct_call, optim.cu launches it). Like
 * cuda_impl.h's first part, nothing here names a ct_tensor, so nvcc can
 * read it. */
#ifndef CTEN_CUDA_OPTIM_LAUNCH_H
#define CTEN_CUDA_OPTIM_LAUNCH_H

#include "cuda_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parameters per launch: the kernel receives every address as a launch
 * argument (no copy of a table to the device), which bounds the count. */
#define CTI_CUDA_OPTIM_MAX 32

/* One launch over n parameters of one dtype, each contiguous with numel[k]
 * > 0 elements: param p[k], gradient g[k], states s0[k] (SGD's momentum
 * buffer when momentum != 0; AdamW's exp_avg) and s1[k] (exp_avg_sq), and
 * its per-step scalars: SGD: a0[k] 1 on the first step (the buffer starts
 * as the update), else 0; AdamW: a0[k] -step_size, a1[k] bc2_sqrt
 * (cti_adamw_scalars). f[] and nesterov are the call's parameters
 * (src/dispatch/optim_impl.h). */
typedef struct cti_cuda_optim {
    bool adamw;
    ct_dtype dt;
    int n;
    void *p[CTI_CUDA_OPTIM_MAX];
    const void *g[CTI_CUDA_OPTIM_MAX];
    void *s0[CTI_CUDA_OPTIM_MAX];
    void *s1[CTI_CUDA_OPTIM_MAX];
    int64_t numel[CTI_CUDA_OPTIM_MAX];
    double a0[CTI_CUDA_OPTIM_MAX], a1[CTI_CUDA_OPTIM_MAX];
    double f[5];
    bool nesterov;
} cti_cuda_optim;

/* Whether a kernel exists for dt (f32, f64, f16, bf16). */
bool cti_cuda_optim_supported(ct_dtype dt);
/* Queues one kernel; *routine receives its name (static string). */
cudaError_t cti_cuda_optim_step(const cti_cuda_optim *o, int sm_count, cudaStream_t stream,
                                const char **routine);

#ifdef __cplusplus
}
#endif
#endif
