/* CT_OP_SUM ... CT_OP_ARGMIN for CUDA tensors: the CPU reductions' call
 * record (src/backends/cpu/reduce.c's header, with the math: in[0] x with
 * any strides, out[0] contiguous over the kept dims, out[1] the int64
 * indices of max/min when nout == 2, cti_reduce_params with the reduced dims
 * as a bitmask, std instead of var, the correction or p) into a launch of
 * reduce.cu.
 *
 * The geometry is simplified here: size-1 dims dropped, neighbours merged
 * where their strides chain, and for value reductions the reduced dims put
 * in decreasing stride order so the innermost one walks memory most densely
 * (index reductions keep the dims' order, which defines the index). */
#include "ops_impl.h"
#include "tensor/ops.h"

/* Drops size-1 dims and merges neighbours whose strides chain. */
static int coalesce(int n, int64_t *sh, int64_t *st) {
    int m = 0;
    for (int d = 0; d < n; d++) {
        if (sh[d] == 1) continue;
        if (m > 0 && st[m - 1] == st[d] * sh[d]) {
            sh[m - 1] *= sh[d];
            st[m - 1] = st[d];
        } else {
            sh[m] = sh[d];
            st[m] = st[d];
            m++;
        }
    }
    return m;
}

static int64_t mag(int64_t v) { return v < 0 ? -v : v; }

/* Stable sort of the reduced dims by decreasing |stride|. */
static void sort_reduced(cti_cuda_red *r) {
    for (int a = 1; a < r->nr; a++) {
        int64_t sh = r->rsh[a], st = r->rst[a];
        int b = a - 1;
        while (b >= 0 && mag(r->rst[b]) < mag(st)) {
            r->rsh[b + 1] = r->rsh[b];
            r->rst[b + 1] = r->rst[b];
            b--;
        }
        r->rsh[b + 1] = sh;
        r->rst[b + 1] = st;
    }
}

static int kind_of(const ct_call *c) {
    switch (c->op) {
    case CT_OP_SUM: return CTI_RED_SUM;
    case CT_OP_MEAN: return CTI_RED_MEAN;
    case CT_OP_PROD: return CTI_RED_PROD;
    case CT_OP_VAR: return CTI_RED_VAR;
    case CT_OP_NORM: return CTI_RED_NORM;
    case CT_OP_MAX: return c->nout > 1 && c->out[1] ? CTI_RED_ARGMAX : CTI_RED_MAX;
    case CT_OP_MIN: return c->nout > 1 && c->out[1] ? CTI_RED_ARGMIN : CTI_RED_MIN;
    case CT_OP_ARGMAX: return CTI_RED_ARGMAX;
    default: return CTI_RED_ARGMIN;
    }
}

/* Launches r on device dev's stream for call c, with the scratch its split
 * needs from the caching allocator. */
static ct_status launch(const ct_call *c, const char *op, int dev, cti_cuda_red *r,
                        const char **routine) {
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    ct_tensor *work = NULL;
    size_t wb = cti_cuda_reduce_work(r);
    if (wb > 0) {
        int64_t n = (int64_t)wb;
        work = cti_tensor_new(op, 1, &n, CT_BOOL, CT_CUDA(dev));
        if (!work) return ct_last_status();
        r->work = cti_data(work);
    }
    cudaError_t e = cti_cuda_reduce(r, stream, routine);
    ct_status st;
    if (e != cudaSuccess) st = cti_cuda_fail(op, dev, "a reduction kernel launch", e);
    else st = cti_cuda_launched(op, dev, ct_op_name(c->op));
    ct_tensor_release(work); /* reuse is ordered after the kernels on the stream */
    return st;
}

static ct_status k_reduce(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    const ct_tensor *x = c->in[0];
    int dev = x->storage->device.index;
    cti_cuda_red r;
    memset(&r, 0, sizeof r);
    r.kind = kind_of(c);
    r.dt = x->dtype;
    r.odt = c->out[0]->dtype;
    r.x = cti_data(x);
    bool arg_only = c->op == CT_OP_ARGMAX || c->op == CT_OP_ARGMIN;
    r.out = arg_only ? NULL : cti_data(c->out[0]);
    if (arg_only) r.idx = (int64_t *)cti_data(c->out[0]);
    else if (r.kind == CTI_RED_ARGMAX || r.kind == CTI_RED_ARGMIN)
        r.idx = (int64_t *)cti_data(c->out[1]);
    const cti_reduce_params *rp = CTI_PARAMS(c, cti_reduce_params);
    r.p = c->op == CT_OP_VAR ? rp->correction : rp->p;
    r.want_std = c->op == CT_OP_VAR && rp->std;

    uint64_t mask = rp->mask;
    r.O = 1;
    r.R = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (mask >> d & 1) {
            r.rsh[r.nr] = x->shape[d];
            r.rst[r.nr++] = x->stride[d];
            r.R *= x->shape[d];
        } else {
            r.ksh[r.nk] = x->shape[d];
            r.kst[r.nk++] = x->stride[d];
            r.O *= x->shape[d];
        }
    }
    if (r.O == 0) return CT_OK;
    r.nk = coalesce(r.nk, r.ksh, r.kst);
    if (r.R == 0) {
        r.nr = 0; /* nothing to read: every output is the empty reduction */
    } else {
        bool by_position = r.kind == CTI_RED_ARGMAX || r.kind == CTI_RED_ARGMIN;
        if (!by_position) {
            r.nr = coalesce(r.nr, r.rsh, r.rst);
            sort_reduced(&r);
        }
        r.nr = coalesce(r.nr, r.rsh, r.rst);
    }

    return launch(c, op, dev, &r, &c->routine);
}

/* ---- LINEAR_DGELU ------------------------------------------------------------------------
 * The hidden gradient of the GELU MLP (schema.h): dpre = (grad_y @ w_out) *
 * gelu'(pre), and the bias gradient db = its sums over the rows. The product
 * goes to the GEMM's kernel; gelu's backward then runs inside the vector
 * column kernel's pass over dpre, which stores each element and sums it as
 * stored, so the [rows, hidden] matrix is read once for both instead of
 * twice. db may be float32 for float16/bfloat16 operands (a widened
 * gradient). Layouts that kernel does not take (and calls without db) run
 * the composite. */
static bool dgelu_fits(const ct_tensor *dpre, const ct_tensor *pre, const ct_tensor *db,
                       cti_cuda_red *r) {
    if (!db || dpre->ndim != 2 || pre->ndim != 2 || db->ndim != 1) return false;
    int64_t rows = dpre->shape[0], hidden = dpre->shape[1];
    if (dpre->stride[1] != 1 || pre->stride[1] != 1 || pre->stride[0] != dpre->stride[0] ||
        (hidden > 1 && db->stride[0] != 1))
        return false;
    memset(r, 0, sizeof *r);
    r->kind = CTI_RED_SUM;
    r->dt = dpre->dtype;
    r->odt = db->dtype;
    r->x = cti_data(dpre);
    r->out = cti_data(db);
    r->nk = r->nr = 1;
    r->ksh[0] = r->O = hidden;
    r->kst[0] = 1;
    r->rsh[0] = r->R = rows;
    r->rst[0] = dpre->stride[0];
    r->gelu_x = cti_data(pre);
    return cti_cuda_reduce_vec_columns(r) && ((uintptr_t)r->gelu_x & 15) == 0;
}

static ct_status k_linear_dgelu(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    ct_tensor *dpre = c->out[0], *pre = c->in[2];
    cti_cuda_red r;
    if (!dgelu_fits(dpre, pre, c->out[1], &r)) return cti_compose_linear_dgelu(c);
    r.gelu_tanh = CTI_PARAMS(c, cti_pointwise_params)->approximate == CT_GELU_TANH;
    static const cti_gemm_params product = {.beta = 0, .alpha = 1};
    ct_status st = cti_dispatch_one(CT_OP_MM, &product, sizeof product, 2, c->in, dpre,
                                    dpre->storage->device, c->in[0]->dtype);
    if (st != CT_OK) return st;
    const char *routine = NULL;
    st = launch(c, op, dpre->storage->device.index, &r, &routine);
    if (st == CT_OK) c->routine = "mm, then gelu_backward folded into the row sums";
    return st;
}

void cti_cuda_register_reduce(void) {
    static const ct_dtype all[] = {CT_BOOL, CT_I32, CT_I64, CT_F16, CT_BF16, CT_F32, CT_F64};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        ct_dtype dt = all[k];
        cti_register_kernel(CT_OP_SUM, CT_DEVICE_CUDA, dt, k_reduce, "cuda_sum");
        cti_register_kernel(CT_OP_PROD, CT_DEVICE_CUDA, dt, k_reduce, "cuda_prod");
        cti_register_kernel(CT_OP_MAX, CT_DEVICE_CUDA, dt, k_reduce, "cuda_max");
        cti_register_kernel(CT_OP_MIN, CT_DEVICE_CUDA, dt, k_reduce, "cuda_min");
        cti_register_kernel(CT_OP_ARGMAX, CT_DEVICE_CUDA, dt, k_reduce, "cuda_argmax");
        cti_register_kernel(CT_OP_ARGMIN, CT_DEVICE_CUDA, dt, k_reduce, "cuda_argmin");
        if (ct_dtype_is_floating(dt)) {
            cti_register_kernel(CT_OP_MEAN, CT_DEVICE_CUDA, dt, k_reduce, "cuda_mean");
            cti_register_kernel(CT_OP_VAR, CT_DEVICE_CUDA, dt, k_reduce, "cuda_var");
            cti_register_kernel(CT_OP_NORM, CT_DEVICE_CUDA, dt, k_reduce, "cuda_norm");
            cti_register_kernel(CT_OP_LINEAR_DGELU, CT_DEVICE_CUDA, dt, k_linear_dgelu,
                                "gemm, then gelu_backward folded into the row sums");
        }
    }
}
