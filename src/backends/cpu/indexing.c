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
 * tasks own whole lines along dim (a block of neighbouring lines, walked
 * position by position along dim): the positions of one line write only
 * output elements of that line, so no two tasks write one element and each
 * element sums in index order whatever the thread count (the CUDA kernel
 * sums in the same order, one thread per line). */
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

/* ---- blocks ------------------------------------------------------------------------------
 * Both kernels walk index's shape in blocks: a row (every dim but the last
 * fixed, and for scatter_add along another dim, dim too) and a chunk of at
 * most CHUNK elements of the last dim, so the inner loops step through
 * memory by fixed strides and the tasks split long rows. */
#define CHUNK 256

typedef struct blocks {
    int nd;
    int64_t rshape[CT_MAX_DIMS]; /* index's shape with 1 at the fixed dims of a block's walk */
    int64_t nchunk;              /* chunks per row */
    int64_t last;                /* the last dim's size */
} blocks;

static void blocks_init(blocks *b, const ct_tensor *idx, int also_one) {
    b->nd = idx->ndim;
    memcpy(b->rshape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    b->last = idx->shape[idx->ndim - 1];
    b->rshape[idx->ndim - 1] = 1;
    if (also_one >= 0) b->rshape[also_one] = 1;
    b->nchunk = (b->last + CHUNK - 1) / CHUNK;
}

static int64_t blocks_count(const blocks *b) {
    return cti_numel(b->nd, b->rshape) * b->nchunk;
}

/* Block t: its row's element offsets along up to three stride sets, its row
 * number, and its range [k0, k1) of the last dim. */
static void block_at(const blocks *b, int64_t t, int nt, const int64_t *const *strides,
                     int64_t *off, int64_t *row, int64_t *k0, int64_t *k1) {
    int64_t r = t / b->nchunk, c = t % b->nchunk;
    *row = r;
    *k0 = c * CHUNK;
    *k1 = *k0 + CHUNK < b->last ? *k0 + CHUNK : b->last;
    for (int j = 0; j < nt; j++) off[j] = 0;
    for (int k = b->nd - 1; k >= 0; k--) {
        int64_t n = b->rshape[k], q = r % n;
        r /= n;
        for (int j = 0; j < nt; j++) off[j] += q * strides[j][k];
    }
}

/* ---- gather ---------------------------------------------------------------------------- */

typedef struct gather_ctx {
    ct_call *c;
    int dim;
    blocks b;
    int64_t xstride[CT_MAX_DIMS]; /* x's, 0 along dim (the index gives that coordinate) */
} gather_ctx;

#define GATHER_LOOP(T)                                                                       \
    for (int64_t k = k0; k < k1; k++)                                                        \
        ((T *)ob)[row * len + k] = ((const T *)xb)[off[0] + k * xl + idx_at(ib, i32, off[1] + k * il) * xd];

static void gather_task(int64_t t0, int64_t t1, void *ctx) {
    gather_ctx *g = ctx;
    ct_tensor *x = g->c->in[0], *idx = g->c->in[1], *out = g->c->out[0];
    const int64_t *st[2] = {g->xstride, idx->stride};
    const char *xb = cti_data(x), *ib = cti_data(idx);
    char *ob = cti_data(out);
    bool i32 = idx->dtype == CT_I32;
    int l = idx->ndim - 1;
    int64_t xd = x->stride[g->dim], xl = g->xstride[l], il = idx->stride[l], len = g->b.last;
    size_t es = ct_dtype_size(x->dtype);
    for (int64_t t = t0; t < t1; t++) {
        int64_t off[2], row, k0, k1;
        block_at(&g->b, t, 2, st, off, &row, &k0, &k1);
        switch (es) {
        case 1: GATHER_LOOP(uint8_t) break;
        case 2: GATHER_LOOP(uint16_t) break;
        case 4: GATHER_LOOP(uint32_t) break;
        default: GATHER_LOOP(uint64_t) break;
        }
    }
}

static ct_status k_gather(ct_call *c) {
    const cti_index_params *p = CTI_PARAMS(c, cti_index_params);
    ct_tensor *x = c->in[0], *idx = c->in[1];
    ct_status s = check_range(op_label(c->op), idx, p->dim, p->size);
    if (s != CT_OK) return s;
    if (cti_numel(idx->ndim, idx->shape) == 0) return CT_OK;
    gather_ctx g = {.c = c, .dim = p->dim};
    memcpy(g.xstride, x->stride, sizeof(int64_t) * (size_t)x->ndim);
    g.xstride[p->dim] = 0;
    blocks_init(&g.b, idx, -1);
    cti_parallel_for(blocks_count(&g.b), CTI_GRAIN / 4 / CHUNK, gather_task, &g);
    return CT_OK;
}

/* ---- scatter_add ----------------------------------------------------------------------- */

typedef struct scatter_ctx {
    ct_call *c;
    int dim;
    blocks b;
    int64_t ostride[CT_MAX_DIMS]; /* out's, 0 along dim */
} scatter_ctx;

/* A block: for j along dim, for k of the chunk (distinct output elements
 * for distinct k), out[o + index * od + k * ol] += src[s + j * sd + k * sl]:
 * each element sums in increasing j. With dim the last dim, the block is
 * one line and k is j. */
#define SCATTER_BLOCK(T, ADD)                                                                \
    for (int64_t j = 0; j < len; j++)                                                        \
        for (int64_t k = k0; k < k1; k++) {                                                  \
            int64_t v = idx_at(ib, i32, off[1] + j * idd + k * il);                          \
            T *dst = (T *)ob + off[0] + v * od + k * ol;                                     \
            *dst = ADD(*dst, ((const T *)sb)[off[2] + j * sd + k * sl]);                     \
        }

#define ADD_PLAIN(a, b) ((a) + (b))
#define ADD_BOOL(a, b) ((uint8_t)((a) | (b)))
#define ADD_I32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define ADD_I64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define ADD_F16(a, b) cti_f32_to_f16(cti_f16_to_f32(a) + cti_f16_to_f32(b))
#define ADD_BF16(a, b) cti_f32_to_bf16(cti_bf16_to_f32(a) + cti_bf16_to_f32(b))

static void scatter_task(int64_t t0, int64_t t1, void *ctx) {
    scatter_ctx *g = ctx;
    ct_tensor *idx = g->c->in[1], *src = g->c->in[2], *out = g->c->out[0];
    int d = g->dim, l = idx->ndim - 1;
    const int64_t *st[3] = {g->ostride, idx->stride, src->stride};
    const char *ib = cti_data(idx), *sb = cti_data(src);
    char *ob = cti_data(out);
    bool i32 = idx->dtype == CT_I32;
    /* along dim the last dim: one line per row, walked by k alone */
    bool line = d == l;
    int64_t len = line ? 1 : idx->shape[d], od = out->stride[d];
    int64_t idd = line ? 0 : idx->stride[d], sd = line ? 0 : src->stride[d];
    int64_t ol = line ? 0 : out->stride[l], il = idx->stride[l], sl = src->stride[l];
    for (int64_t t = t0; t < t1; t++) {
        int64_t off[3], row, k0, k1;
        if (line) {
            /* a whole line in one block, so its adds stay in order */
            block_at(&g->b, t * g->b.nchunk, 3, st, off, &row, &k0, &k1);
            k1 = g->b.last;
        } else {
            block_at(&g->b, t, 3, st, off, &row, &k0, &k1);
        }
        switch (out->dtype) {
        case CT_F32: SCATTER_BLOCK(float, ADD_PLAIN) break;
        case CT_F64: SCATTER_BLOCK(double, ADD_PLAIN) break;
        case CT_F16: SCATTER_BLOCK(uint16_t, ADD_F16) break;
        case CT_BF16: SCATTER_BLOCK(uint16_t, ADD_BF16) break;
        case CT_I32: SCATTER_BLOCK(int32_t, ADD_I32) break;
        case CT_I64: SCATTER_BLOCK(int64_t, ADD_I64) break;
        default: SCATTER_BLOCK(uint8_t, ADD_BOOL) break;
        }
    }
}

static ct_status k_scatter_add(ct_call *c) {
    const cti_index_params *p = CTI_PARAMS(c, cti_index_params);
    ct_tensor *idx = c->in[1], *out = c->out[0];
    ct_status s = check_range(op_label(c->op), idx, p->dim, p->size);
    if (s != CT_OK) return s;
    if (cti_numel(idx->ndim, idx->shape) == 0) return CT_OK;
    scatter_ctx g = {.c = c, .dim = p->dim};
    memcpy(g.ostride, out->stride, sizeof(int64_t) * (size_t)out->ndim);
    g.ostride[p->dim] = 0;
    blocks_init(&g.b, idx, p->dim);
    bool line = p->dim == idx->ndim - 1;
    /* lines along the last dim are not split: one task adds a line in order */
    int64_t n = line ? cti_numel(idx->ndim, g.b.rshape) : blocks_count(&g.b);
    int64_t per = line ? g.b.last : CHUNK * idx->shape[p->dim];
    int64_t grain = CTI_GRAIN / 4 / (per > 0 ? per : 1);
    cti_parallel_for(n, grain > 0 ? grain : 1, scatter_task, &g);
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
