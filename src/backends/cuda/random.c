/* CT_OP_ARANGE, CT_OP_RAND_UNIFORM, CT_OP_RAND_NORMAL and CT_OP_RANDINT for
 * CUDA tensors, with the CPU kernels' call records (src/backends/cpu/copy.c):
 * out[0] a contiguous tensor; arange f[0] start, f[1] step, i[0] 1 for
 * linspace with f[2] end and i[1] steps; random i[0] the seed's bits, i[1]
 * the first draw the front end reserved, f[0]/f[1] low/high or mean/std,
 * i[2]/i[3] randint's low/high. The values equal the CPU's for the same seed
 * and offset. */
#include "ops_impl.h"

static int64_t numel(const ct_tensor *t) { return cti_numel(t->ndim, t->shape); }

static ct_status finish_launch(const char *op, int dev, ct_op id, cudaError_t e,
                               const char *call) {
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, call, e);
    return cti_cuda_launched(op, dev, ct_op_name(id));
}

static ct_status k_random(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    ct_tensor *out = c->out[0];
    int64_t n = numel(out);
    if (n == 0) return CT_OK;
    int dev = out->storage->device.index;
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    int kind = c->op == CT_OP_RAND_UNIFORM ? CTI_RNG_UNIFORM
               : c->op == CT_OP_RAND_NORMAL ? CTI_RNG_NORMAL
                                            : CTI_RNG_RANDINT;
    uint64_t irange = (uint64_t)c->i[3] - (uint64_t)c->i[2];
    cudaError_t e = cti_cuda_random(kind, cti_data(out), out->dtype, n, (uint64_t)c->i[0],
                                    (uint64_t)c->i[1], c->f[0], c->f[1], c->i[2], irange,
                                    cti_cuda_sm_count(dev), stream);
    c->routine = kind == CTI_RNG_UNIFORM  ? "cuda_uniform_philox"
                 : kind == CTI_RNG_NORMAL ? "cuda_normal_philox_box_muller"
                                          : "cuda_randint_philox";
    return finish_launch(op, dev, c->op, e, c->routine);
}

static ct_status k_arange(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    ct_tensor *out = c->out[0];
    int64_t n = numel(out);
    if (n == 0) return CT_OK;
    int dev = out->storage->device.index;
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    cudaError_t e = cti_cuda_range(cti_data(out), out->dtype, n, c->f[0], c->f[1], c->f[2],
                                   c->i[1], c->i[0] == 1, cti_cuda_sm_count(dev), stream);
    c->routine = "cuda_arange";
    return finish_launch(op, dev, c->op, e, c->routine);
}

void cti_cuda_register_random(void) {
    for (int d = 0; d < CT_NUM_DTYPES; d++) {
        ct_dtype dt = (ct_dtype)d;
        cti_register_kernel(CT_OP_ARANGE, CT_DEVICE_CUDA, dt, k_arange, "cuda_arange");
        cti_register_kernel(CT_OP_RANDINT, CT_DEVICE_CUDA, dt, k_random, "cuda_randint_philox");
        if (ct_dtype_is_floating(dt)) {
            cti_register_kernel(CT_OP_RAND_UNIFORM, CT_DEVICE_CUDA, dt, k_random,
                                "cuda_uniform_philox");
            cti_register_kernel(CT_OP_RAND_NORMAL, CT_DEVICE_CUDA, dt, k_random,
                                "cuda_normal_philox_box_muller");
        }
    }
}
