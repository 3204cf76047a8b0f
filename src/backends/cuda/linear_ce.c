/* CROSS_ENTROPY_FUSED for CUDA tensors (cti_ce_fused_params; the call record
 * of the CPU kernel, src/backends/cpu/linear_ce.c): in[0] logits [rows, C]
 * contiguous, overwritten with the gradient when params.grad; in[1] int64
 * targets; in[2] the rows' gradient scales or NULL; out[0] the rows' losses.
 * The work is queued without waiting: a bad target is recorded by the kernel
 * and fails the next wait for the device (cuda_impl.h, "faults"), as
 * cross_entropy's does. */
#include "linear_ce_impl.h"

static ct_status k_ce_fused(ct_call *c) {
    const cti_ce_fused_params *p = CTI_PARAMS(c, cti_ce_fused_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    if (p->rows == 0) return CT_OK;
    cti_lce_rows r = {
        .dt = c->in[0]->dtype,
        .logits = cti_data(c->in[0]),
        .target = (const int64_t *)cti_data(c->in[1]),
        .rscale = c->in[2] ? cti_data(c->in[2]) : NULL,
        .loss = cti_data(c->out[0]),
        .rows = p->rows,
        .c = p->c,
        .ignore = p->ignore_index,
        .ls = p->label_smoothing,
        .scale = p->scale,
        .grad = p->grad,
        .op = (int)c->op,
    };
    int dev = c->out[0]->storage->device.index;
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK ||
        cti_cuda_fault_slot_get(op, dev, &r.fault) != CT_OK)
        return ct_last_status();
    cudaError_t e = cti_lce_rows_launch(&r, st, &c->routine);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "a kernel launch", e);
    return cti_cuda_launched(op, dev, ct_op_name(c->op));
}

void cti_cuda_register_linear_ce(void) {
    static const ct_dtype fl[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (size_t j = 0; j < sizeof fl / sizeof fl[0]; j++)
        cti_register_kernel(CT_OP_CROSS_ENTROPY_FUSED, CT_DEVICE_CUDA, fl[j], k_ce_fused,
                            "cuda_cross_entropy_fused");
}
