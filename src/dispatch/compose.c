/* Composite kernels: a fused op's kernel made of other ops' calls through
 * cti_dispatch. A backend without a fused kernel for such an op registers
 * the composite as its kernel (the CPU); one whose fused path does not apply
 * to a call (a library without an algorithm for its geometry, say) calls it
 * from its own kernel. Either way the op computes the same thing on every
 * device, written once. */
#include "dispatch_impl.h"
#include "tensor/ops.h"

/* Dispatches op on (in, out) with params p on out's device and in[0]'s dtype
 * (out may be float32 for float16/bfloat16 inputs: a widened gradient). */
static ct_status run(ct_op op, const void *p, size_t psize, int nin, ct_tensor *const *in,
                     ct_tensor *out) {
    return cti_dispatch_one(op, p, psize, nin, in, out, out->storage->device, in[0]->dtype);
}

ct_status cti_compose_linear_gelu(ct_call *c) {
    const cti_pointwise_params *p = CTI_PARAMS(c, cti_pointwise_params);
    static const cti_gemm_params plus_bias = {.beta = 1, .alpha = 1};
    static const cti_gemm_params product = {.beta = 0, .alpha = 1};
    static const cti_pointwise_params none;
    ct_tensor *pre = c->out[1];
    ct_status st = c->in[0] ? run(CT_OP_ADDMM, &plus_bias, sizeof plus_bias, 3, c->in, pre)
                            : run(CT_OP_MM, &product, sizeof product, 2, c->in + 1, pre);
    if (st != CT_OK) return st;
    st = run(p->approximate == CT_GELU_TANH ? CT_OP_GELU_TANH : CT_OP_GELU, &none, sizeof none, 1,
             &pre, c->out[0]);
    if (st == CT_OK) c->routine = c->in[0] ? "addmm, then gelu" : "mm, then gelu";
    return st;
}

ct_status cti_compose_linear_dgelu(ct_call *c) {
    const cti_pointwise_params *p = CTI_PARAMS(c, cti_pointwise_params);
    static const cti_gemm_params product = {.beta = 0, .alpha = 1};
    const cti_pointwise_params bw = {.approximate = p->approximate};
    ct_tensor *dpre = c->out[0];
    ct_status st = run(CT_OP_MM, &product, sizeof product, 2, c->in, dpre);
    /* gelu_backward in place: each element reads its own grad and pre */
    if (st == CT_OK)
        st = run(CT_OP_GELU_BACKWARD, &bw, sizeof bw, 2, (ct_tensor *[]){dpre, c->in[2]}, dpre);
    if (st == CT_OK && c->out[1]) {
        const cti_reduce_params rows = {.mask = 1};
        st = run(CT_OP_SUM, &rows, sizeof rows, 1, &dpre, c->out[1]);
    }
    if (st == CT_OK)
        c->routine = c->out[1] ? "mm, gelu_backward, then row sums" : "mm, then gelu_backward";
    return st;
}

ct_status cti_compose_linear_backward_weight(ct_call *c) {
    static const cti_gemm_params product = {.beta = 0, .alpha = 1};
    /* dim 1: the rows of in[0] (grad_y transposed) are the bias's entries */
    static const cti_reduce_params rows = {.mask = 2};
    ct_status st = CT_OK;
    if (c->out[0]) st = run(CT_OP_MM, &product, sizeof product, 2, c->in, c->out[0]);
    if (st == CT_OK && c->out[1]) st = run(CT_OP_SUM, &rows, sizeof rows, 1, c->in, c->out[1]);
    if (st == CT_OK)
        c->routine = !c->out[1] ? "mm" : c->out[0] ? "mm, then row sums" : "row sums";
    return st;
}
