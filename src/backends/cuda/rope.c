/* rope and swiglu for CUDA tensors, with the CPU kernels' call records
 * (src/backends/cpu/rope.c; schema.h's contract): ROPE and ROPE_BACKWARD
 * (in x or grad_out, cos, sin expanded to x's leading dims; out the
 * contiguous result), SWIGLU (in gate, up; out y) and SWIGLU_BACKWARD (in
 * grad_out, gate, up; out dgate|NULL, dup|NULL). The C side turns a call
 * into rope.cu's launch records and queues the work without waiting. */
#include "ops_impl.h"

static int dev_of(const ct_tensor *t) { return t->storage->device.index; }

static ct_status finish(const char *op, int dev, ct_op id, cudaError_t e) {
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "a kernel launch", e);
    return cti_cuda_launched(op, dev, ct_op_name(id));
}

/* Whether t's data is aligned to bytes and each of its first lead strides is
 * a multiple of m elements, so every unit offset keeps that alignment. */
static bool unit_aligned(const ct_tensor *t, int lead, int64_t m, size_t bytes) {
    if ((uintptr_t)cti_data(t) % bytes != 0) return false;
    for (int i = 0; i < lead; i++)
        if (t->shape[i] > 1 && t->stride[i] % m != 0) return false;
    return true;
}

/* ---- rope: in x, cos, sin ([..., d/2], expanded); out the contiguous result. -------------- */
static ct_status k_rope(ct_call *c) {
    const cti_rope_params *p = CTI_PARAMS(c, cti_rope_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    ct_tensor *x = c->in[0], *tc = c->in[1], *ts = c->in[2], *out = c->out[0];
    if (p->rows == 0 || p->d == 0) return CT_OK;
    const int lead = x->ndim - 1;
    const int64_t half = p->d / 2;
    const bool il = p->layout == CTI_ROPE_INTERLEAVED;
    const size_t es = ct_dtype_size(x->dtype), tes = ct_dtype_size(tc->dtype);
    /* A unit is pp pairs: 16 bytes of each table (32 for float32 tables beside a 16-bit
     * x), and of x (and out) 16 bytes a half (half layout) or 32 bytes (interleaved), in
     * 16-byte vectors. */
    int64_t pp = cti_cuda_rope_vec_pairs(x->dtype, il), xm = (int64_t)(16 / es);
    bool vec = half % pp == 0 && unit_aligned(x, lead, xm, 16) && unit_aligned(out, lead, xm, 16) &&
               unit_aligned(tc, lead, pp, (size_t)pp * tes) &&
               unit_aligned(ts, lead, pp, (size_t)pp * tes);
    if (!vec) pp = 1;
    /* The three operands as [leading dims..., units]: the offset of each unit's first pair. */
    int64_t shape[CT_MAX_DIMS], st[3][CT_MAX_DIMS];
    const ct_tensor *src[3] = {out, x, tc};
    for (int i = 0; i < lead; i++) {
        shape[i] = x->shape[i];
        for (int k = 0; k < 3; k++) st[k][i] = src[k]->stride[i];
    }
    shape[lead] = half / pp;
    st[0][lead] = st[1][lead] = il ? 2 * pp : pp;
    st[2][lead] = pp;
    ct_tensor *views[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++)
        if (!(views[k] = cti_tensor_view(src[k], lead + 1, shape, st[k], src[k]->offset))) {
            for (int j = 0; j < k; j++) ct_tensor_release(views[j]);
            return ct_last_status();
        }
    cti_cuda_rope_args a = {.dt = x->dtype,
                       .table_dt = tc->dtype,
                       .interleaved = il,
                       .vec = vec,
                       .backward = c->op == CT_OP_ROPE_BACKWARD,
                       .half = half,
                       .out = cti_data(out),
                       .x = cti_data(x),
                       .cos = cti_data(tc),
                       .sin = cti_data(ts)};
    cti_cuda_iter_init(&a.it, 3, views);
    for (int k = 0; k < 3; k++) ct_tensor_release(views[k]);
    int dev = dev_of(out);
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    cudaError_t e = cti_cuda_rope(&a, cti_cuda_sm_count(dev), stream, &c->routine);
    return finish(op, dev, c->op, e);
}

/* ---- swiglu: in gate, up; out y. backward: in grad_out, gate, up; out dgate|NULL, dup|NULL. */
static ct_status k_swiglu(ct_call *c) {
    const cti_swiglu_params *p = CTI_PARAMS(c, cti_swiglu_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    if (p->rows == 0 || p->cols == 0) return CT_OK;
    bool bwd = c->op == CT_OP_SWIGLU_BACKWARD;
    int kg = bwd ? 1 : 0, ku = bwd ? 2 : 1;
    ct_tensor *gate = c->in[kg], *up = c->in[ku];
    ct_tensor *o1 = bwd && c->nout > 1 ? c->out[1] : NULL;
    cti_cuda_swiglu_args a = {.dt = gate->dtype,
                         .backward = bwd,
                         .rows = p->rows,
                         .cols = p->cols,
                         .ld_gate = p->ld[kg],
                         .ld_up = p->ld[ku],
                         .ld_grad = bwd ? p->ld[0] : 0,
                         .ld_out = p->ldo,
                         .gate = cti_data(gate),
                         .up = cti_data(up),
                         .grad = bwd ? cti_data(c->in[0]) : NULL,
                         .y = bwd ? NULL : cti_data(c->out[0]),
                         .dgate = bwd && c->out[0] ? cti_data(c->out[0]) : NULL,
                         .dup = o1 ? cti_data(o1) : NULL};
    int dev = dev_of(gate);
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    cudaError_t e = cti_cuda_swiglu(&a, cti_cuda_sm_count(dev), stream, &c->routine);
    return finish(op, dev, c->op, e);
}

void cti_cuda_register_rope(void) {
    static const ct_dtype fl[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    static const struct {
        ct_op op;
        cti_kernel_fn fn;
        const char *name;
    } ks[] = {
        {CT_OP_ROPE, k_rope, "cuda_rope"},
        {CT_OP_ROPE_BACKWARD, k_rope, "cuda_rope_backward"},
        {CT_OP_SWIGLU, k_swiglu, "cuda_swiglu"},
        {CT_OP_SWIGLU_BACKWARD, k_swiglu, "cuda_swiglu_backward"},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (size_t j = 0; j < sizeof fl / sizeof fl[0]; j++)
            cti_register_kernel(ks[i].op, CT_DEVICE_CUDA, fl[j], ks[i].fn, ks[i].name);
}
