/* CT_OP_ARANGE, CT_OP_RAND_UNIFORM, CT_OP_RAND_NORMAL and CT_OP_RANDINT for
 * CUDA tensors, with the CPU kernels' call records and formulas
 * (src/backends/cpu/copy.c): out[0] a contiguous tensor; arange reads a
 * cti_range_params, the random fills a cti_random_params (seed, the first
 * draw the front end reserved as offset, a/b low/high or mean/std, randint's
 * low/high). The values equal the CPU's for the same seed and offset. */
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
    const cti_random_params *p = CTI_PARAMS(c, cti_random_params);
    uint64_t irange = (uint64_t)p->high - (uint64_t)p->low, first = p->offset;
    const uint64_t *state;
    cti_cuda_philox(dev, p->seed, &first, &state);
    cudaError_t e = cti_cuda_random(kind, cti_data(out), out->dtype, n, p->seed, first, state,
                                    p->a, p->b, p->low, irange, cti_cuda_sm_count(dev), stream);
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
    const cti_range_params *p = CTI_PARAMS(c, cti_range_params);
    cudaError_t e = cti_cuda_range(cti_data(out), out->dtype, n, p->start, p->step, p->end,
                                   p->steps, p->linspace, cti_cuda_sm_count(dev), stream);
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
