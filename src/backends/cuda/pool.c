/* CT_OP_MAX_POOL2D ... CT_OP_ADAPTIVE_AVG_POOL2D_BACKWARD for CUDA tensors:
 * the CPU kernels' call records (src/backends/cpu/pool2d.c) into launches of
 * pool.cu.
 *
 * The params are cti_pool_params.
 *   max_pool2d, adaptive_max_pool2d: in x; out y, int64 indices (h * W + w in the plane)
 *   max_pool2d_backward:   in grad_out, x (its shape only), indices; out grad_in
 *   avg_pool2d(_backward), adaptive_avg_pool2d(_backward): in x, or grad_out
 *                          and x (shape only); out the result
 * Inputs may have any strides (3-d ones are one image); outputs are
 * contiguous. The max backward adds into a zeroed buffer with atomics: the
 * output itself for float32/float64, a float32 buffer for the half types,
 * converted into the output afterwards. */
#include "ops_impl.h"

/* The call's cti_pool_params as pool.cu takes them: field for field its
 * PoolGeo (ops_impl.h gives the order). */
typedef struct pool_geo {
    int64_t N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, count_include_pad;
} pool_geo;
_Static_assert(sizeof(pool_geo) == 15 * sizeof(int64_t), "pool_geo is 15 packed values");

static pool_geo geo_of(const ct_call *c) {
    const cti_pool_params *p = CTI_PARAMS(c, cti_pool_params);
    return (pool_geo){.N = p->N, .C = p->C, .H = p->H, .W = p->W, .kh = p->kernel[0],
                      .kw = p->kernel[1], .sh = p->stride[0], .sw = p->stride[1],
                      .ph = p->padding[0], .pw = p->padding[1], .dh = p->dilation[0],
                      .dw = p->dilation[1], .OH = p->OH, .OW = p->OW,
                      .count_include_pad = p->count_include_pad};
}

/* A 3-d (CHW) or 4-d tensor's element strides as NCHW. */
static void strides4(const ct_tensor *t, int64_t st[4]) {
    int off = 4 - t->ndim;
    st[0] = 0;
    for (int d = 0; d < t->ndim; d++) st[d + off] = t->stride[d];
}

static int kind_of(ct_op op) {
    switch (op) {
    case CT_OP_MAX_POOL2D: return CTI_POOL_MAX_FWD;
    case CT_OP_MAX_POOL2D_BACKWARD: return CTI_POOL_MAX_BWD;
    case CT_OP_AVG_POOL2D: return CTI_POOL_AVG_FWD;
    case CT_OP_AVG_POOL2D_BACKWARD: return CTI_POOL_AVG_BWD;
    case CT_OP_ADAPTIVE_AVG_POOL2D: return CTI_POOL_ADA_FWD;
    case CT_OP_ADAPTIVE_MAX_POOL2D: return CTI_POOL_ADA_MAX_FWD;
    default: return CTI_POOL_ADA_BWD;
    }
}

static ct_status finish(const char *op, int dev, ct_op id, cudaError_t e, const char *call) {
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, call, e);
    return cti_cuda_launched(op, dev, ct_op_name(id));
}

/* The max backward: zero the accumulation target, scatter, convert. */
static ct_status max_backward(ct_call *c, const pool_geo *g, const char *op, int dev,
                              cudaStream_t stream, int64_t st[4], int64_t ist[4]) {
    ct_tensor *dy = c->in[0], *idx = c->in[2], *dx = c->out[0];
    int64_t n = cti_numel(dx->ndim, dx->shape);
    bool half = dx->dtype == CT_F16 || dx->dtype == CT_BF16;
    ct_tensor *acc = NULL;
    void *target = cti_data(dx);
    if (half) {
        acc = cti_tensor_new(op, 1, &n, CT_F32, CT_CUDA(dev));
        if (!acc) return ct_last_status();
        target = cti_data(acc);
    }
    size_t bytes = (size_t)n * (half ? sizeof(float) : ct_dtype_size(dx->dtype));
    cudaError_t e = cudaMemsetAsync(target, 0, bytes, stream);
    const char *call = "cudaMemsetAsync";
    if (e == cudaSuccess) {
        call = "the max_pool2d_backward kernel launch";
        e = cti_cuda_pool2d(CTI_POOL_MAX_BWD, dx->dtype, (const int64_t *)g, cti_data(dy), st,
                            (const int64_t *)cti_data(idx), ist, NULL, NULL, target,
                            cti_cuda_sm_count(dev), stream, &c->routine);
    }
    if (e == cudaSuccess && half) {
        call = "the float32 to output conversion launch";
        e = cti_cuda_convert_contiguous(cti_data(dx), dx->dtype, target, CT_F32, n,
                                        cti_cuda_sm_count(dev), stream);
    }
    ct_status s = finish(op, dev, c->op, e, call);
    ct_tensor_release(acc); /* reuse is ordered after the kernels on the stream */
    return s;
}

static ct_status k_pool(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    ct_tensor *src = c->in[0], *out = c->out[0];
    int dev = out->storage->device.index;
    int kind = kind_of(c->op);
    if (cti_numel(out->ndim, out->shape) == 0) {
        c->routine = "none (empty)";
        return CT_OK;
    }
    for (int k = 0; k < c->nin; k++) {
        const ct_tensor *t = c->in[k];
        if (t && (t->storage->device.type != CT_DEVICE_CUDA || t->storage->device.index != dev)) {
            char a[32], b[32];
            return cti_error(CT_ERR_DEVICE, "%s: operand %s is on %s, the result on %s", op,
                             cti_desc(t), ct_device_str(t->storage->device, a, sizeof a),
                             ct_device_str(out->storage->device, b, sizeof b));
        }
    }
    pool_geo g = geo_of(c);
    int64_t st[4], ist[4];
    strides4(src, st);
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    if (kind == CTI_POOL_MAX_BWD) {
        strides4(c->in[2], ist);
        return max_backward(c, &g, op, dev, stream, st, ist);
    }
    int64_t *out_idx = kind == CTI_POOL_MAX_FWD || kind == CTI_POOL_ADA_MAX_FWD
                           ? (int64_t *)cti_data(c->out[1])
                           : NULL;
    cudaError_t e = cti_cuda_pool2d(kind, out->dtype, (const int64_t *)&g, cti_data(src), st,
                                    NULL, NULL, cti_data(out), out_idx, NULL,
                                    cti_cuda_sm_count(dev), stream, &c->routine);
    return finish(op, dev, c->op, e, "a pooling kernel launch");
}

void cti_cuda_register_pool(void) {
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    static const struct {
        ct_op op;
        const char *name;
    } ops[] = {
        {CT_OP_MAX_POOL2D, "cuda_max_pool2d"},
        {CT_OP_MAX_POOL2D_BACKWARD, "cuda_max_pool2d_backward"},
        {CT_OP_AVG_POOL2D, "cuda_avg_pool2d"},
        {CT_OP_AVG_POOL2D_BACKWARD, "cuda_avg_pool2d_backward"},
        {CT_OP_ADAPTIVE_AVG_POOL2D, "cuda_adaptive_avg_pool2d"},
        {CT_OP_ADAPTIVE_AVG_POOL2D_BACKWARD, "cuda_adaptive_avg_pool2d_backward"},
        {CT_OP_ADAPTIVE_MAX_POOL2D, "cuda_adaptive_max_pool2d"},
    };
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++)
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
            cti_register_kernel(ops[k].op, CT_DEVICE_CUDA, dts[i], k_pool, ops[k].name);
}
