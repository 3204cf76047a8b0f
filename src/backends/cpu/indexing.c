/* CPU kernels of GATHER, INDEX_SELECT and SCATTER_ADD (cti_index_params;
 * the contract is schema.h's): every tensor is read through its strides, so
 * transposed, sliced and expanded inputs need no copy.
 *
 *   gather:      out[p] = x[p with coordinate dim replaced by index[p]], an
 *                element copy, so every dtype works
 *   scatter_add: out[p with coordinate dim replaced by index[p]] += src[p]
 *
 * Every index is checked against [0, size) before anything is written, so
 * the first bad one in row-major order is the one reported. scatter_add's
 * tasks own lines along dim: the positions of one line write only output
 * elements of that line, so no two tasks write one element and each element
 * sums in index order whatever the thread count (the CUDA kernel sums in the
 * same order, one thread per line). */
#include "cpu_impl.h"

static const char *op_label(ct_op op) {
    return op == CT_OP_GATHER ? "ct_gather"
           : op == CT_OP_INDEX_SELECT ? "ct_index_select"
                                      : "ct_scatter_add";
}

static inline int64_t idx_at(const char *base, bool i32, int64_t off) {
    return i32 ? ((const int32_t *)base)[off] : ((const int64_t *)base)[off];
}

/* An odometer over shape (nd dims) carrying the element offsets of up to
 * three tensors with the given strides. */
typedef struct walk {
    int nd;
    int64_t shape[CT_MAX_DIMS], coord[CT_MAX_DIMS];
    const int64_t *stride[3];
    int64_t off[3];
    int nt;
} walk;

static void walk_init(walk *w, int nd, const int64_t *shape, int nt, const int64_t *const *strides,
                      int64_t start) {
    w->nd = nd;
    w->nt = nt;
    memcpy(w->shape, shape, sizeof(int64_t) * (size_t)nd);
    for (int t = 0; t < nt; t++) {
        w->stride[t] = strides[t];
        w->off[t] = 0;
    }
    for (int k = nd - 1; k >= 0; k--) {
        int64_t s = shape[k] > 0 ? shape[k] : 1;
        w->coord[k] = start % s;
        start /= s;
        for (int t = 0; t < nt; t++) w->off[t] += w->coord[k] * strides[t][k];
    }
}

static inline void walk_next(walk *w) {
    for (int k = w->nd - 1; k >= 0; k--) {
        for (int t = 0; t < w->nt; t++) w->off[t] += w->stride[t][k];
        if (++w->coord[k] < w->shape[k]) return;
        for (int t = 0; t < w->nt; t++) w->off[t] -= w->stride[t][k] * w->shape[k];
        w->coord[k] = 0;
    }
}

/* The first index outside [0, size) in row-major order, as the error. */
static ct_status check_range(const char *op, const ct_tensor *idx, int dim, int64_t size) {
    int64_t n = cti_numel(idx->ndim, idx->shape);
    if (n == 0) return CT_OK;
    bool i32 = idx->dtype == CT_I32;
    const char *base = cti_data(idx);
    walk w;
    const int64_t *st[1] = {idx->stride};
    walk_init(&w, idx->ndim, idx->shape, 1, st, 0);
    for (int64_t p = 0; p < n; p++, walk_next(&w)) {
        int64_t v = idx_at(base, i32, w.off[0]);
        if (v < 0 || v >= size) {
            if (size > 0)
                return cti_error(CT_ERR_INDEX,
                                 "%s: index %lld is out of range for dim %d of size %lld "
                                 "(expected 0..%lld)",
                                 op, (long long)v, dim, (long long)size, (long long)(size - 1));
            return cti_error(CT_ERR_INDEX,
                             "%s: index %lld is out of range for dim %d of size 0 (no index is valid)",
                             op, (long long)v, dim);
        }
    }
    return CT_OK;
}

/* ---- gather ---------------------------------------------------------------------------- */

typedef struct gather_ctx {
    ct_call *c;
    int dim;
    int64_t xstride[CT_MAX_DIMS]; /* x's, 0 along dim (the index gives that coordinate) */
} gather_ctx;

#define GATHER_LOOP(T)                                                                       \
    for (int64_t p = p0; p < p1; p++, walk_next(&w)) {                                       \
        int64_t i = idx_at(ib, i32, w.off[1]);                                               \
        ((T *)ob)[p] = ((const T *)xb)[w.off[0] + i * xd];                                   \
    }

static void gather_task(int64_t p0, int64_t p1, void *ctx) {
    gather_ctx *k = ctx;
    ct_tensor *x = k->c->in[0], *idx = k->c->in[1], *out = k->c->out[0];
    walk w;
    const int64_t *st[2] = {k->xstride, idx->stride};
    walk_init(&w, idx->ndim, idx->shape, 2, st, p0);
    const char *xb = cti_data(x), *ib = cti_data(idx);
    char *ob = cti_data(out);
    bool i32 = idx->dtype == CT_I32;
    int64_t xd = x->stride[k->dim];
    switch (ct_dtype_size(x->dtype)) {
    case 1: GATHER_LOOP(uint8_t) break;
    case 2: GATHER_LOOP(uint16_t) break;
    case 4: GATHER_LOOP(uint32_t) break;
    default: GATHER_LOOP(uint64_t) break;
    }
}

static ct_status k_gather(ct_call *c) {
    const cti_index_params *p = CTI_PARAMS(c, cti_index_params);
    ct_tensor *x = c->in[0], *idx = c->in[1];
    ct_status s = check_range(op_label(c->op), idx, p->dim, p->size);
    if (s != CT_OK) return s;
    gather_ctx k = {.c = c, .dim = p->dim};
    memcpy(k.xstride, x->stride, sizeof(int64_t) * (size_t)x->ndim);
    k.xstride[p->dim] = 0;
    int64_t n = cti_numel(idx->ndim, idx->shape);
    if (n > 0) cti_parallel_for(n, CTI_GRAIN / 4, gather_task, &k);
    return CT_OK;
}

/* ---- scatter_add ----------------------------------------------------------------------- */

typedef struct scatter_ctx {
    ct_call *c;
    int dim;
    int64_t lshape[CT_MAX_DIMS]; /* index's shape with 1 along dim: one position per line */
} scatter_ctx;

/* One line: out[o + index[j] * od] += src[s + j * sd] for j along dim. */
#define SCATTER_LINE(T, ADD)                                                                 \
    for (int64_t j = 0; j < len; j++) {                                                      \
        T *dst = (T *)ob + w.off[0] + idx_at(ib, i32, w.off[1] + j * idd) * od;              \
        T v = ((const T *)sb)[w.off[2] + j * sd];                                            \
        *dst = ADD(*dst, v);                                                                 \
    }

#define ADD_PLAIN(a, b) ((a) + (b))
#define ADD_BOOL(a, b) ((uint8_t)((a) | (b)))
#define ADD_I32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define ADD_I64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define ADD_F16(a, b) ct_f32_to_f16(ct_f16_to_f32(a) + ct_f16_to_f32(b))
#define ADD_BF16(a, b) cti_f32_to_bf16(cti_bf16_to_f32(a) + cti_bf16_to_f32(b))

static void scatter_task(int64_t l0, int64_t l1, void *ctx) {
    scatter_ctx *k = ctx;
    ct_tensor *idx = k->c->in[1], *src = k->c->in[2], *out = k->c->out[0];
    int d = k->dim;
    walk w;
    const int64_t *st[3] = {out->stride, idx->stride, src->stride};
    walk_init(&w, idx->ndim, k->lshape, 3, st, l0);
    const char *ib = cti_data(idx), *sb = cti_data(src);
    char *ob = cti_data(out);
    bool i32 = idx->dtype == CT_I32;
    int64_t len = idx->shape[d], od = out->stride[d], idd = idx->stride[d], sd = src->stride[d];
    for (int64_t l = l0; l < l1; l++, walk_next(&w)) {
        switch (out->dtype) {
        case CT_F32: SCATTER_LINE(float, ADD_PLAIN) break;
        case CT_F64: SCATTER_LINE(double, ADD_PLAIN) break;
        case CT_F16: SCATTER_LINE(uint16_t, ADD_F16) break;
        case CT_BF16: SCATTER_LINE(uint16_t, ADD_BF16) break;
        case CT_I32: SCATTER_LINE(int32_t, ADD_I32) break;
        case CT_I64: SCATTER_LINE(int64_t, ADD_I64) break;
        default: SCATTER_LINE(uint8_t, ADD_BOOL) break;
        }
    }
}

static ct_status k_scatter_add(ct_call *c) {
    const cti_index_params *p = CTI_PARAMS(c, cti_index_params);
    ct_tensor *idx = c->in[1];
    ct_status s = check_range(op_label(c->op), idx, p->dim, p->size);
    if (s != CT_OK) return s;
    scatter_ctx k = {.c = c, .dim = p->dim};
    memcpy(k.lshape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    int64_t len = idx->shape[p->dim];
    k.lshape[p->dim] = 1;
    int64_t lines = cti_numel(idx->ndim, k.lshape);
    if (len > 0 && lines > 0) {
        int64_t grain = CTI_GRAIN / 4 / len;
        cti_parallel_for(lines, grain > 0 ? grain : 1, scatter_task, &k);
    }
    return CT_OK;
}

void cti_cpu_register_indexing(void) {
    for (int dt = 0; dt < CT_NUM_DTYPES; dt++) {
        cti_register_kernel(CT_OP_GATHER, CT_DEVICE_CPU, (ct_dtype)dt, k_gather, "cpu_gather");
        cti_register_kernel(CT_OP_INDEX_SELECT, CT_DEVICE_CPU, (ct_dtype)dt, k_gather,
                            "cpu_index_select");
        cti_register_kernel(CT_OP_SCATTER_ADD, CT_DEVICE_CPU, (ct_dtype)dt, k_scatter_add,
                            "cpu_scatter_add");
    }
}
