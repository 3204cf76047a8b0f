/* CT_OP_SDPA and CT_OP_SDPA_BACKWARD for CUDA tensors: the call records of
 * schema.h (cti_attention_params) into launches of attention.cu's flash
 * kernels, or of cuDNN's fused attention (attention_cudnn.c) where it takes
 * the call.
 *   sdpa:          in q, k, v, mask|NULL;                    out out, lse
 *   sdpa_backward: in grad_out, q, k, v, out, lse, mask|NULL; out dq, dk, dv
 * Every tensor is read and written through its strides (the last dim of the
 * inputs contiguous, as schema.h says). The backward's per-row Delta goes
 * through a scratch buffer from the caching allocator, released as soon as
 * the kernels are queued (its reuse is ordered after them on the stream). */
#include <stdlib.h>
#include <string.h>

#include "attention_impl.h"

/* cuDNN's fused attention (attention_cudnn.c): false when it does not take
 * the call (the flash kernels run then); true when it ran it or failed in a
 * way that must be reported, with the outcome in *st. */
bool cti_cuda_attn_cudnn(ct_call *c, const cti_cuda_attn *a, bool bwd, int dev,
                         cudaStream_t stream, ct_status *st);

static const void *opt_data(const ct_tensor *t) { return t ? cti_data(t) : NULL; }

static void strides_of(const ct_tensor *t, int n, int64_t *st) {
    for (int d = 0; d < n; d++) st[d] = t && d < t->ndim ? t->stride[d] : 0;
}

static ct_tensor *in_at(const ct_call *c, int k) { return k < c->nin ? c->in[k] : NULL; }
static ct_tensor *out_at(const ct_call *c, int k) { return k < c->nout ? c->out[k] : NULL; }

/* The limits of the kernels: head dims up to CTI_CUDA_ATTN_MAX_HEAD, and
 * block counts (one per 32 rows, or per 4 rows in the backward's first pass,
 * of each (b, h)) that fit a grid. */
static ct_status check(const char *op, const cti_attention_params *p) {
    if (p->D > CTI_CUDA_ATTN_MAX_HEAD || p->Dv > CTI_CUDA_ATTN_MAX_HEAD)
        return cti_error(CT_ERR_UNSUPPORTED,
                         "%s: head dims of at most %d are supported on CUDA (got q/k %lld, "
                         "v %lld)",
                         op, CTI_CUDA_ATTN_MAX_HEAD, (long long)p->D, (long long)p->Dv);
    int64_t tiles = ((p->T > p->S ? p->T : p->S) + 31) / 32, quads = (p->T + 3) / 4;
    int64_t most = tiles > quads ? tiles : quads; /* the delta pass: a block per 4 rows */
    if (p->B > 0 && p->Hq > 0 && most > (int64_t)INT32_MAX / p->B / p->Hq)
        return cti_error(CT_ERR_UNSUPPORTED,
                         "%s: B * H * ceil(max(T, S) / 32) and B * H * ceil(T / 4) must fit in 31 bits "
                         "on CUDA (B %lld, "
                         "H %lld, T %lld, S %lld)",
                         op, (long long)p->B, (long long)p->Hq, (long long)p->T,
                         (long long)p->S);
    return CT_OK;
}

/* CT_CUDA_SDPA_MMA=0 in the environment runs the f16/bf16 flash kernels on
 * their scalar versions instead of tensor cores (the tests compare the two). */
static bool tensor_cores(void) {
    const char *e = getenv("CT_CUDA_SDPA_MMA");
    return !(e && strcmp(e, "0") == 0);
}

static ct_status run(ct_call *c, cti_cuda_attn *a, bool bwd) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    if (check(op, &a->p) != CT_OK) return ct_last_status();
    const ct_tensor *q = c->in[bwd ? 1 : 0];
    a->tensor_cores = tensor_cores();
    int dev = q->storage->device.index;
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    ct_status st;
    if (cti_cuda_attn_cudnn(c, a, bwd, dev, stream, &st)) return st;
    if (a->p.dropout_p > 0) cti_cuda_philox(dev, a->p.seed, &a->p.offset, &a->philox);
    ct_tensor *work = NULL;
    if (bwd) {
        int64_t n = (int64_t)cti_cuda_attn_work(a);
        if (n < 1) n = 1;
        work = cti_tensor_new(op, 1, &n, CT_BOOL, CT_CUDA(dev));
        if (!work) return ct_last_status();
        a->delta = cti_data(work);
    }
    cudaError_t e = bwd ? cti_cuda_attn_backward(a, stream, &c->routine)
                        : cti_cuda_attn_forward(a, stream, &c->routine);
    if (e != cudaSuccess) st = cti_cuda_fail(op, dev, "an attention kernel launch", e);
    else st = cti_cuda_launched(op, dev, ct_op_name(c->op));
    ct_tensor_release(work);
    return st;
}

static ct_status k_sdpa(ct_call *c) {
    cti_cuda_attn a;
    memset(&a, 0, sizeof a);
    a.p = *CTI_PARAMS(c, cti_attention_params);
    a.dt = c->in[0]->dtype;
    ct_tensor *mask = a.p.mask_kind != CTI_ATTN_MASK_NONE ? in_at(c, 3) : NULL;
    a.q = cti_data(c->in[0]);
    a.k = cti_data(c->in[1]);
    a.v = cti_data(c->in[2]);
    a.mask = opt_data(mask);
    a.out = cti_data(c->out[0]);
    a.lse_out = cti_data(c->out[1]);
    strides_of(c->in[0], 4, a.sq);
    strides_of(c->in[1], 4, a.sk);
    strides_of(c->in[2], 4, a.sv);
    strides_of(mask, 4, a.smask);
    strides_of(c->out[0], 4, a.sout);
    strides_of(c->out[1], 3, a.slse_out);
    if (a.p.mask_kind != CTI_ATTN_MASK_NONE && !mask)
        return cti_error(CT_ERR_INVALID_ARG, "ct_%s: mask_kind %d without a mask tensor",
                         ct_op_name(c->op), a.p.mask_kind);
    return run(c, &a, false);
}

static ct_status k_sdpa_backward(ct_call *c) {
    cti_cuda_attn a;
    memset(&a, 0, sizeof a);
    a.p = *CTI_PARAMS(c, cti_attention_params);
    a.dt = c->in[1]->dtype;
    ct_tensor *mask = a.p.mask_kind != CTI_ATTN_MASK_NONE ? in_at(c, 6) : NULL;
    ct_tensor *dq = out_at(c, 0), *dk = out_at(c, 1), *dv = out_at(c, 2);
    a.go = cti_data(c->in[0]);
    a.q = cti_data(c->in[1]);
    a.k = cti_data(c->in[2]);
    a.v = cti_data(c->in[3]);
    a.o = cti_data(c->in[4]);
    a.lse = cti_data(c->in[5]);
    a.mask = opt_data(mask);
    a.dq = dq ? cti_data(dq) : NULL;
    a.dk = dk ? cti_data(dk) : NULL;
    a.dv = dv ? cti_data(dv) : NULL;
    strides_of(c->in[0], 4, a.sgo);
    strides_of(c->in[1], 4, a.sq);
    strides_of(c->in[2], 4, a.sk);
    strides_of(c->in[3], 4, a.sv);
    strides_of(c->in[4], 4, a.so);
    strides_of(c->in[5], 3, a.slse);
    strides_of(mask, 4, a.smask);
    strides_of(dq, 4, a.sdq);
    strides_of(dk, 4, a.sdk);
    strides_of(dv, 4, a.sdv);
    if (a.p.mask_kind != CTI_ATTN_MASK_NONE && !mask)
        return cti_error(CT_ERR_INVALID_ARG, "ct_%s: mask_kind %d without a mask tensor",
                         ct_op_name(c->op), a.p.mask_kind);
    return run(c, &a, true);
}

void cti_cuda_register_attention(void) {
    static const ct_dtype dts[] = {CT_F16, CT_BF16, CT_F32, CT_F64};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        cti_register_kernel(CT_OP_SDPA, CT_DEVICE_CUDA, dts[k], k_sdpa, "cuda_sdpa");
        cti_register_kernel(CT_OP_SDPA_BACKWARD, CT_DEVICE_CUDA, dts[k], k_sdpa_backward,
                            "cuda_sdpa_backward");
    }
}
