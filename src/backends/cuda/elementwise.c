/* CT_OP_NEG ... CT_OP_CLAMP and CT_OP_LOG1P ... CT_OP_THRESHOLD_BACKWARD for CUDA tensors: the
 * call record into a launch of elementwise.cu.
 *
 * The front ends (src/ops/elementwise.c) are device-agnostic, so these
 * kernels take the CPU kernels' contract: out[0] the result, in[0..nin) the
 * operands broadcast to it, the parameters a cti_pointwise_params (add/sub's
 * alpha, clamp's bounds). A single-element operand is not indexed: a CPU one
 * (a scalar) is read here and passed by value, a device one is read once per
 * GPU thread, in any dtype (float16/bfloat16 kernels take float32 scalars, as
 * PyTorch's opmath).
 * Nothing here waits for the device. */
#include <stdio.h>

#include "ops_impl.h"

static int64_t numel(const ct_tensor *t) { return cti_numel(t->ndim, t->shape); }

/* The value of a one-element CPU tensor, as a double and as an integer. */
static void host_value(const ct_tensor *t, double *d, int64_t *i) {
    const void *p = cti_data(t);
    switch (t->dtype) {
    case CT_BOOL: *i = *(const uint8_t *)p != 0; *d = (double)*i; return;
    case CT_I32: *i = *(const int32_t *)p; *d = (double)*i; return;
    case CT_I64: *i = *(const int64_t *)p; *d = (double)*i; return;
    case CT_F16: *d = ct_f16_to_f32(*(const uint16_t *)p); break;
    case CT_BF16: *d = ct_bf16_to_f32(*(const uint16_t *)p); break;
    case CT_F32: *d = *(const float *)p; break;
    default: *d = *(const double *)p; break;
    }
    *i = *d == *d && *d > -9223372036854775808.0 && *d < 9223372036854775808.0 ? (int64_t)*d : 0;
}

/* The storage dtype in[k] must have to be read as an array. */
static ct_dtype array_dtype(const ct_call *c, int k, ct_dtype dt) {
    return c->op == CT_OP_WHERE && k == 0 ? CT_BOOL : dt;
}

/* A copy of t in dtype dt on device dev (for an operand whose dtype the
 * kernel cannot read; the front ends never send one, other callers may). */
static ct_tensor *converted(const char *op, ct_tensor *t, ct_dtype dt, int dev) {
    ct_tensor *tmp = cti_tensor_new(op, t->ndim, t->shape, dt, CT_CUDA(dev));
    if (!tmp) return NULL;
    if (cti_dispatch_one(CT_OP_COPY, NULL, 0, 1, &t, tmp, CT_CUDA(dev), dt) != CT_OK) {
        ct_tensor_release(tmp);
        return NULL;
    }
    return tmp;
}

/* The dtype the call was dispatched on: the result's, except for bool
 * results (comparisons, logical ops), which take their operands' dtype: that
 * of the largest operand, a tensor rather than a wrapped scalar on ties. */
static ct_dtype kernel_dtype(const ct_call *c) {
    bool to_bool = (c->op >= CT_OP_EQ && c->op <= CT_OP_LOGICAL_OR) || c->op == CT_OP_LOGICAL_NOT ||
                   c->op == CT_OP_ISNAN || c->op == CT_OP_ISINF || c->op == CT_OP_ISFINITE;
    if (!to_bool) return c->out[0]->dtype;
    const ct_tensor *best = c->in[0];
    for (int k = 1; k < c->nin; k++) {
        const ct_tensor *t = c->in[k];
        int64_t a = numel(t), b = numel(best);
        if (a > b || (a == b && best->wrapped_number && !t->wrapped_number)) best = t;
    }
    return best->dtype;
}

static ct_status k_elementwise(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    ct_tensor *out = c->out[0];
    int64_t n = numel(out);
    if (n == 0) return CT_OK;
    int dev = out->storage->device.index;
    ct_dtype dt = kernel_dtype(c);

    cti_cuda_ew e;
    memset(&e, 0, sizeof e);
    e.op = c->op;
    e.nin = c->nin;
    e.out = cti_data(out);
    e.prm = *CTI_PARAMS(c, cti_pointwise_params);
    e.n = n;
    e.contiguous = cti_is_contiguous(out);

    ct_tensor *ops[1 + CTI_EW_MAX_IN] = {out};
    ct_tensor *tmp[CTI_EW_MAX_IN] = {NULL};
    ct_status st = CT_OK;
    for (int k = 0; k < c->nin && st == CT_OK; k++) {
        ct_tensor *t = c->in[k];
        ct_device d = t->storage->device;
        ct_dtype want = array_dtype(c, k, dt);
        ops[k + 1] = t;
        if (d.type == CT_DEVICE_CPU && numel(t) == 1 && c->op != CT_OP_WHERE) {
            e.mode[k] = CTI_EW_VALUE;
            host_value(t, &e.dval[k], &e.ival[k]);
        } else if (d.type != CT_DEVICE_CUDA || d.index != dev) {
            char a[32], b[32];
            st = cti_error(CT_ERR_DEVICE, "%s: operand %s is on %s, the result on %s", op,
                           cti_desc(t), ct_device_str(d, a, sizeof a),
                           ct_device_str(out->storage->device, b, sizeof b));
        } else if (numel(t) == 1 && c->op != CT_OP_WHERE) {
            e.mode[k] = CTI_EW_DEVSCALAR;
            e.sdt[k] = t->dtype;
            e.in[k] = cti_data(t);
        } else {
            if (t->dtype != want) {
                ops[k + 1] = tmp[k] = converted(op, t, want, dev);
                if (!tmp[k]) {
                    st = ct_last_status();
                    break;
                }
            }
            e.mode[k] = CTI_EW_ARRAY;
            e.in[k] = cti_data(ops[k + 1]);
            e.contiguous = e.contiguous && numel(ops[k + 1]) == n && cti_is_contiguous(ops[k + 1]);
        }
    }
    cudaStream_t stream;
    if (st == CT_OK) st = cti_cuda_begin(op, dev, &stream);
    if (st == CT_OK) {
        cti_cuda_iter it;
        if (!e.contiguous) {
            cti_cuda_iter_init(&it, 1 + c->nin, ops);
            e.it = &it;
        }
        e.dtype = dt;
        cudaError_t err = cti_cuda_elementwise(&e, cti_cuda_sm_count(dev), stream, &c->routine);
        if (err == cudaErrorInvalidValue && !cti_cuda_ew_supported(c->op, dt))
            st = cti_error(CT_ERR_UNSUPPORTED, "%s: no CUDA kernel for dtype %s", op,
                           ct_dtype_name(dt));
        else if (err != cudaSuccess)
            st = cti_cuda_fail(op, dev, "an elementwise kernel launch", err);
        else
            st = cti_cuda_launched(op, dev, ct_op_name(c->op));
    }
    for (int k = 0; k < CTI_EW_MAX_IN; k++) ct_tensor_release(tmp[k]);
    return st;
}

/* The schema's two blocks of elementwise ops: NEG .. CLAMP, and LOG1P .. THRESHOLD_BACKWARD. */
static void register_range(int first, int last) {
    for (int op = first; op <= last; op++)
        for (int d = 0; d < CT_NUM_DTYPES; d++)
            if (cti_cuda_ew_supported(op, (ct_dtype)d))
                cti_register_kernel((ct_op)op, CT_DEVICE_CUDA, (ct_dtype)d, k_elementwise,
                                    "cuda_elementwise");
}

void cti_cuda_register_elementwise(void) {
    register_range(CT_OP_NEG, CT_OP_CLAMP);
    register_range(CT_OP_LOG1P, CT_OP_THRESHOLD_BACKWARD);
}
