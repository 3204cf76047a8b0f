/* The neural-network ops for CUDA tensors, with the CPU kernels' call records
 * (src/backends/cpu/softmax.c, loss.c, embedding.c and dropout.c; the params
 * structs of schema.h): softmax and log_softmax and their backward,
 * cross_entropy and nll_loss and their backward, mse_loss and its backward,
 * embedding and its backward, dropout and its backward. Inputs arrive
 * contiguous. The C side turns a call into plain pointers and sizes for
 * nn.cu's launchers and queues the work without waiting, except embedding
 * and its backward: they read back the kernel's record of the first bad
 * index before returning, so a bad index fails the call with the CPU's
 * message (during a CUDA graph capture, where the host cannot wait, the
 * kernels report it as a fault instead, like a loss's). A loss's bad target fails the next wait for the device instead
 * (a copy to the host, ct_tensor_item, ct_cuda_synchronize): checking it
 * in the call would make the host wait for every loss. */
#include <limits.h>

#include "ops_impl.h"

/* ---- helpers ------------------------------------------------------------------------------ */
static int dev_of(const ct_tensor *t) { return t->storage->device.index; }

static int64_t numel(const ct_tensor *t) { return cti_numel(t->ndim, t->shape); }

static ct_status finish(const char *op, int dev, ct_op id, cudaError_t e) {
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "a kernel launch", e);
    return cti_cuda_launched(op, dev, ct_op_name(id));
}

/* Device scratch of n bytes (released by the caller once the work is queued:
 * the caching allocator orders its reuse on the stream). */
static ct_tensor *scratch(const char *op, int dev, size_t n) {
    int64_t sz = (int64_t)(n > 0 ? n : 1);
    return cti_tensor_new(op, 1, &sz, CT_BOOL, CT_CUDA(dev));
}

/* ---- softmax / log_softmax: cti_softmax_params outer, d, inner, log -------------------------- */
static ct_status k_softmax(ct_call *c) {
    const cti_softmax_params *p = CTI_PARAMS(c, cti_softmax_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    bool bwd = c->op == CT_OP_SOFTMAX_BACKWARD || c->op == CT_OP_LOG_SOFTMAX_BACKWARD;
    ct_tensor *out = c->out[0];
    if (numel(out) == 0) return CT_OK;
    int dev = dev_of(out);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    cudaError_t e = cti_nn_softmax((int)out->dtype, bwd, p->log, cti_data(c->in[0]),
                                   bwd ? cti_data(c->in[1]) : NULL, cti_data(out), p->outer, p->d,
                                   p->inner, st, &c->routine);
    return finish(op, dev, c->op, e);
}

/* ---- cross_entropy / nll_loss: cti_loss_params n, c, inner, reduction, ignore_index,
 * label_smoothing. forward: in input, target, weight|NULL; backward: in grad_loss, input,
 * target, weight|NULL. A target out of range is recorded by the kernel and returned by the
 * next wait for the device (cuda_impl.h, "faults"). ------------------------------------------- */
static ct_status k_cls(ct_call *c) {
    const cti_loss_params *p = CTI_PARAMS(c, cti_loss_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    bool bwd = c->op == CT_OP_CROSS_ENTROPY_BACKWARD || c->op == CT_OP_NLL_LOSS_BACKWARD;
    bool ce = c->op == CT_OP_CROSS_ENTROPY || c->op == CT_OP_CROSS_ENTROPY_BACKWARD;
    int off = bwd ? 1 : 0;
    ct_tensor *out = c->out[0], *w = c->in[off + 2], *x = c->in[off];
    if (numel(out) == 0) return CT_OK;
    ct_dtype loss_dt = bwd ? c->in[0]->dtype : out->dtype;
    cti_nn_cls r = {
        .kind = ce ? (bwd ? CTI_NN_CE_BWD : CTI_NN_CE) : (bwd ? CTI_NN_NLL_BWD : CTI_NN_NLL),
        .dt = x->dtype,
        .lossf = ce && loss_dt == CT_F32 && (x->dtype == CT_F16 || x->dtype == CT_BF16),
        .input = cti_data(c->in[off]),
        .target = (const int64_t *)cti_data(c->in[off + 1]),
        .weight = w ? cti_data(w) : NULL,
        .grad = bwd ? cti_data(c->in[0]) : NULL,
        .out = cti_data(out),
        .work = NULL,
        .stats = !ce ? NULL
                 : bwd ? (c->nin > 4 && c->in[4] ? cti_data(c->in[4]) : NULL)
                       : (c->nout > 1 && c->out[1] ? cti_data(c->out[1]) : NULL),
        .n = p->n,
        .c = p->c,
        .inner = p->inner,
        .reduction = p->reduction,
        .ignore = p->ignore_index,
        .ls = p->label_smoothing,
        .op = (int)c->op,
    };
    int dev = dev_of(out);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK ||
        cti_cuda_fault_slot_get(op, dev, &r.fault) != CT_OK)
        return ct_last_status();
    r.sms = cti_cuda_sm_count(dev);
    ct_tensor *work = NULL;
    size_t wb = cti_nn_cls_work(&r);
    if (wb > 0) {
        if (!(work = scratch(op, dev, wb))) return ct_last_status();
        r.work = cti_data(work);
    }
    ct_status s = finish(op, dev, c->op, cti_nn_cls_launch(&r, st, &c->routine));
    ct_tensor_release(work);
    return s;
}

/* ---- mse_loss: cti_loss_params n (numel), reduction. forward: in input, target; backward: in
 * grad_loss, input, target. ------------------------------------------------------------------- */
static ct_status k_mse(ct_call *c) {
    const cti_loss_params *p = CTI_PARAMS(c, cti_loss_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    bool bwd = c->op == CT_OP_MSE_LOSS_BACKWARD;
    int off = bwd ? 1 : 0, red = p->reduction;
    int64_t n = p->n;
    ct_tensor *out = c->out[0];
    if (numel(out) == 0) return CT_OK;
    int dev = dev_of(out);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    ct_tensor *work = NULL;
    size_t wb = bwd ? 0 : cti_nn_mse_work(n, red);
    if (wb > 0 && !(work = scratch(op, dev, wb))) return ct_last_status();
    cudaError_t e = cti_nn_mse((int)out->dtype, bwd, cti_data(c->in[off]), cti_data(c->in[off + 1]),
                               bwd ? cti_data(c->in[0]) : NULL, cti_data(out), n, red,
                               work ? cti_data(work) : NULL, st, &c->routine);
    ct_status s = finish(op, dev, c->op, e);
    ct_tensor_release(work);
    return s;
}

/* ---- embedding ----------------------------------------------------------------------------------
 * forward: in weight [V, D], indices; out [n, D]; cti_embedding_params num_weights V, d D, n.
 * backward: in grad_out [n, D], indices; out [V, D]; and padding_idx.
 * The kernels record the smallest position holding an index outside [0, V)
 * in *bad (all ones: none). */

/* Waits for the queued work, then turns a recorded bad position into the
 * CPU kernel's error. */
static ct_status check_bad(const char *op, int dev, cudaStream_t st,
                           const unsigned long long *bad, const ct_tensor *idx, int64_t v) {
    unsigned long long pos = 0;
    if (cti_cuda_capture_check_wait(op, dev, "checks its indices on the host after the kernel (a "
                                             "host sync)") != CT_OK)
        return ct_last_status();
    cudaError_t e = cudaMemcpyAsync(&pos, bad, sizeof pos, cudaMemcpyDeviceToHost, st);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "cudaMemcpyAsync", e);
    if (cti_cuda_sync(op, dev) != CT_OK) return ct_last_status();
    if (pos == ULLONG_MAX) return CT_OK;
    size_t es = ct_dtype_size(idx->dtype);
    int64_t t64 = 0;
    int32_t t32 = 0;
    void *dst = idx->dtype == CT_I32 ? (void *)&t32 : (void *)&t64;
    e = cudaMemcpyAsync(dst, cti_data(idx) + pos * es, es, cudaMemcpyDeviceToHost, st);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "cudaMemcpyAsync", e);
    if (cti_cuda_sync(op, dev) != CT_OK) return ct_last_status();
    int64_t t = idx->dtype == CT_I32 ? t32 : t64;
    return cti_error(CT_ERR_INDEX,
                     "%s: index %lld is out of range for %lld embeddings (expected 0..%lld)", op,
                     (long long)t, (long long)v, (long long)(v - 1));
}

/* The index check of a launch: during a capture the kernels also claim the
 * fault record (the host cannot wait for them there; the first wait after a
 * replay reports a bad index), else the host reads *bad after them. */
static ct_status emb_check(const char *op, int dev, ct_op id, unsigned long long *bad,
                           cti_nn_emb_check *chk) {
    *chk = (cti_nn_emb_check){.bad = bad, .op = (int)id};
    if (!cti_cuda_capturing(dev)) return CT_OK;
    return cti_cuda_fault_slot_get(op, dev, &chk->fault);
}

static ct_status k_embedding(ct_call *c) {
    const char *op = "ct_embedding";
    const cti_embedding_params *p = CTI_PARAMS(c, cti_embedding_params);
    ct_tensor *w = c->in[0], *idx = c->in[1], *out = c->out[0];
    int64_t v = p->num_weights, d = p->d, n = p->n;
    if (n == 0) return CT_OK;
    int dev = dev_of(out);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    ct_tensor *flag = scratch(op, dev, sizeof(unsigned long long));
    if (!flag) return ct_last_status();
    unsigned long long *bad = (unsigned long long *)cti_data(flag);
    cti_nn_emb_check chk;
    ct_status s = emb_check(op, dev, c->op, bad, &chk);
    cudaError_t e;
    if (s == CT_OK && (e = cudaMemsetAsync(bad, 0xFF, sizeof *bad, st)) != cudaSuccess)
        s = cti_cuda_fail(op, dev, "cudaMemsetAsync", e);
    if (s == CT_OK) {
        e = cti_nn_embedding((int)ct_dtype_size(w->dtype), idx->dtype == CT_I32, cti_data(w),
                             cti_data(idx), cti_data(out), v, d, n, chk, st);
        c->routine = "cten_embedding_gather";
        s = finish(op, dev, c->op, e);
        if (s == CT_OK && !chk.fault.record) s = check_bad(op, dev, st, bad, idx, v);
    }
    ct_tensor_release(flag);
    return s;
}

static ct_status k_embedding_backward(ct_call *c) {
    const char *op = "ct_embedding_backward";
    const cti_embedding_params *p = CTI_PARAMS(c, cti_embedding_params);
    ct_tensor *g = c->in[0], *idx = c->in[1], *out = c->out[0];
    int64_t v = p->num_weights, d = p->d, n = p->n, pad = p->padding_idx;
    if (n > INT_MAX)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: %lld indices on %s exceed the CUDA kernel's limit of %d", op,
                         (long long)n, cti_desc(idx), INT_MAX);
    if (n == 0 && v * d == 0) return CT_OK;
    int dev = dev_of(out);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    size_t wb = 0;
    cudaError_t e = cti_nn_embedding_bwd_work(n, v, &wb);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "cub::DeviceRadixSort::SortPairs", e);
    /* the bad-index record, then the sort's buffers, 256-byte aligned */
    ct_tensor *work = scratch(op, dev, 256 + wb);
    if (!work) return ct_last_status();
    unsigned long long *bad = (unsigned long long *)cti_data(work);
    cti_nn_emb_check chk;
    ct_status s = emb_check(op, dev, c->op, bad, &chk);
    if (s == CT_OK && (e = cudaMemsetAsync(bad, 0xFF, sizeof *bad, st)) != cudaSuccess)
        s = cti_cuda_fail(op, dev, "cudaMemsetAsync", e);
    if (s == CT_OK) {
        e = cti_nn_embedding_bwd((int)out->dtype, idx->dtype == CT_I32, cti_data(g), cti_data(idx),
                                 cti_data(out), v, d, n, pad, cti_data(work) + 256, chk, st);
        c->routine = "cub::DeviceRadixSort::SortPairs+cten_embedding_bwd_segments";
        s = finish(op, dev, c->op, e);
        if (s == CT_OK && n > 0 && !chk.fault.record) s = check_bad(op, dev, st, bad, idx, v);
    }
    ct_tensor_release(work);
    return s;
}

/* ---- dropout: in x; out y, mask|NULL; cti_dropout_params seed, offset (the first draw), p.
 * backward: in grad_y, mask; out dx; p. -------------------------------------------------------- */
static ct_status k_dropout(ct_call *c) {
    const cti_dropout_params *p = CTI_PARAMS(c, cti_dropout_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    bool bwd = c->op == CT_OP_DROPOUT_BACKWARD;
    ct_tensor *out = c->out[0];
    int64_t n = numel(out);
    if (n == 0) return CT_OK;
    int dev = dev_of(out);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    const uint8_t *mask_in = bwd ? (const uint8_t *)cti_data(c->in[1]) : NULL;
    uint8_t *mask_out = !bwd && c->nout > 1 && c->out[1] ? (uint8_t *)cti_data(c->out[1]) : NULL;
    uint64_t first = bwd ? 0 : p->offset;
    const uint64_t *state = NULL;
    if (!bwd) cti_cuda_philox(dev, p->seed, &first, &state);
    cudaError_t e = cti_nn_dropout((int)out->dtype, bwd, cti_data(c->in[0]), cti_data(out), mask_in,
                                   mask_out, n, bwd ? 0 : p->seed, first, state, p->p, st);
    c->routine = bwd ? "cten_dropout_bwd" : "cten_dropout_philox4x32";
    return finish(op, dev, c->op, e);
}

void cti_cuda_register_nn(void) {
    static const ct_dtype fl[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    static const struct {
        ct_op op;
        cti_kernel_fn fn;
        const char *name;
    } ks[] = {
        {CT_OP_SOFTMAX, k_softmax, "cuda_softmax"},
        {CT_OP_LOG_SOFTMAX, k_softmax, "cuda_log_softmax"},
        {CT_OP_SOFTMAX_BACKWARD, k_softmax, "cuda_softmax_backward"},
        {CT_OP_LOG_SOFTMAX_BACKWARD, k_softmax, "cuda_log_softmax_backward"},
        {CT_OP_CROSS_ENTROPY, k_cls, "cuda_cross_entropy"},
        {CT_OP_CROSS_ENTROPY_BACKWARD, k_cls, "cuda_cross_entropy_backward"},
        {CT_OP_NLL_LOSS, k_cls, "cuda_nll_loss"},
        {CT_OP_NLL_LOSS_BACKWARD, k_cls, "cuda_nll_loss_backward"},
        {CT_OP_MSE_LOSS, k_mse, "cuda_mse_loss"},
        {CT_OP_MSE_LOSS_BACKWARD, k_mse, "cuda_mse_loss_backward"},
        {CT_OP_EMBEDDING_BACKWARD, k_embedding_backward, "cuda_embedding_backward"},
        {CT_OP_DROPOUT, k_dropout, "cuda_dropout"},
        {CT_OP_DROPOUT_BACKWARD, k_dropout, "cuda_dropout_backward"},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (size_t j = 0; j < sizeof fl / sizeof fl[0]; j++)
            cti_register_kernel(ks[i].op, CT_DEVICE_CUDA, fl[j], ks[i].fn, ks[i].name);
    /* a gather copies bits, so every dtype works, as on the CPU */
    for (int dt = 0; dt < CT_NUM_DTYPES; dt++)
        cti_register_kernel(CT_OP_EMBEDDING, CT_DEVICE_CUDA, (ct_dtype)dt, k_embedding,
                            "cuda_embedding");
}
