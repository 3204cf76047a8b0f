/* Elementwise iteration over broadcast operands.
 *
 * The geometry is reduced before the loop: size-1 dims dropped, dims ordered
 * so the innermost has the output's smallest stride, and neighbours merged
 * when every operand steps through them as one. Contiguous operands of the
 * output's shape skip all of that and give a single call. Everything lives on
 * the stack: tiny tensors pay a few comparisons. */
#include "cpu_impl.h"

/* Element sizes without a call per operand (the small path counts ns). */
static const int64_t k_elsize[CT_NUM_DTYPES] = {
    [CT_BOOL] = 1, [CT_I32] = 4, [CT_I64] = 8, [CT_F16] = 2,
    [CT_BF16] = 2, [CT_F32] = 4, [CT_F64] = 8,
};

static inline char *base_ptr(const ct_tensor *t) {
    return (char *)t->storage->data + t->offset * k_elsize[t->dtype];
}

typedef struct iter_geom {
    int nops;
    int ndim;                                  /* after reduction, >= 1 */
    int64_t shape[CT_MAX_DIMS];                /* [0] is the innermost */
    int64_t stride[CT_MAX_DIMS][CTI_MAX_OPERANDS]; /* bytes, per dim and operand */
    char *base[CTI_MAX_OPERANDS];
    cti_loop_fn fn;
    void *ctx;
} iter_geom;

/* Runs linear indices [begin, end) of the reduced geometry. */
static void run_range(int64_t begin, int64_t end, void *arg) {
    const iter_geom *g = arg;
    const int nops = g->nops, nd = g->ndim;
    int64_t idx[CT_MAX_DIMS];
    char *ptrs[CTI_MAX_OPERANDS];
    int64_t rem = begin;
    for (int k = 0; k < nops; k++) ptrs[k] = g->base[k];
    for (int d = 0; d < nd; d++) {
        idx[d] = rem % g->shape[d];
        rem /= g->shape[d];
        for (int k = 0; k < nops; k++) ptrs[k] += idx[d] * g->stride[d][k];
    }
    int64_t pos = begin;
    while (pos < end) {
        int64_t len = g->shape[0] - idx[0];
        if (len > end - pos) len = end - pos;
        g->fn(ptrs, g->stride[0], len, g->ctx);
        pos += len;
        if (pos >= end) break;
        /* Carry into the outer dims; the inner dim restarts at 0. */
        for (int k = 0; k < nops; k++) ptrs[k] -= idx[0] * g->stride[0][k];
        idx[0] = 0;
        for (int d = 1; d < nd; d++) {
            for (int k = 0; k < nops; k++) ptrs[k] += g->stride[d][k];
            if (++idx[d] < g->shape[d]) break;
            for (int k = 0; k < nops; k++) ptrs[k] -= idx[d] * g->stride[d][k];
            idx[d] = 0;
        }
    }
}

typedef struct flat_job {
    int nops;
    char *base[CTI_MAX_OPERANDS];
    int64_t stride[CTI_MAX_OPERANDS];
    cti_loop_fn fn;
    void *ctx;
} flat_job;

static void run_flat(int64_t begin, int64_t end, void *arg) {
    const flat_job *j = arg;
    char *ptrs[CTI_MAX_OPERANDS];
    for (int k = 0; k < j->nops; k++) ptrs[k] = j->base[k] + begin * j->stride[k];
    j->fn(ptrs, j->stride, end - begin, j->ctx);
}

static inline bool contiguous_like(const ct_tensor *t, int nd, const int64_t *shape) {
    if (t->ndim != nd) return false;
    int64_t expect = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (t->shape[d] != shape[d]) return false;
        if (shape[d] != 1 && t->stride[d] != expect) return false;
        expect *= shape[d];
    }
    return true;
}

ct_status cti_cpu_foreach(int nops, ct_tensor *const *operands, cti_loop_fn fn, void *ctx) {
    const ct_tensor *out = operands[0];
    const int nd = out->ndim;
    /* The count first: an empty output's sizes may multiply past int64
     * (a zero next to huge sizes), and nothing of it is visited. */
    int64_t numel = cti_numel(nd, out->shape);
    if (numel == 0) return CT_OK;

    bool flat = true;
    for (int k = 0; k < nops && flat; k++) flat = contiguous_like(operands[k], nd, out->shape);
    if (flat) {
        flat_job j;
        j.nops = nops;
        j.fn = fn;
        j.ctx = ctx;
        for (int k = 0; k < nops; k++) {
            j.base[k] = base_ptr(operands[k]);
            j.stride[k] = k_elsize[operands[k]->dtype];
        }
        if (numel < CTI_GRAIN) run_flat(0, numel, &j);
        else cti_parallel_for(numel, CTI_GRAIN, run_flat, &j);
        return CT_OK;
    }

    /* Byte strides of every operand in the output's dims (outermost first),
     * size-1 output dims dropped; broadcast dims of an input get stride 0. */
    int64_t shape[CT_MAX_DIMS];
    int64_t stride[CT_MAX_DIMS][CTI_MAX_OPERANDS];
    int m = 0;
    for (int d = 0; d < nd; d++) {
        if (out->shape[d] == 1) continue;
        shape[m] = out->shape[d];
        for (int k = 0; k < nops; k++) {
            const ct_tensor *t = operands[k];
            int td = d - (nd - t->ndim);
            int64_t s = 0;
            if (td >= 0 && t->shape[td] != 1) s = t->stride[td] * k_elsize[t->dtype];
            stride[m][k] = s;
        }
        m++;
    }

    /* Order dims by the output's stride, largest outermost (a stable
     * insertion sort keeps the given order on ties). */
    int order[CT_MAX_DIMS];
    for (int i = 0; i < m; i++) {
        int j = i;
        while (j > 0 && stride[order[j - 1]][0] < stride[i][0]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }

    /* Reduced geometry, innermost first, merging neighbours that step as one. */
    iter_geom g;
    g.nops = nops;
    g.fn = fn;
    g.ctx = ctx;
    g.ndim = 0;
    for (int i = m - 1; i >= 0; i--) {
        int d = order[i];
        if (g.ndim > 0) {
            int in = g.ndim - 1;
            bool merge = true;
            for (int k = 0; k < nops && merge; k++)
                merge = stride[d][k] == g.stride[in][k] * g.shape[in];
            if (merge) {
                g.shape[in] *= shape[d];
                continue;
            }
        }
        g.shape[g.ndim] = shape[d];
        for (int k = 0; k < nops; k++) g.stride[g.ndim][k] = stride[d][k];
        g.ndim++;
    }
    if (g.ndim == 0) { /* every dim had size 1: one element */
        g.ndim = 1;
        g.shape[0] = 1;
        for (int k = 0; k < nops; k++) g.stride[0][k] = 0;
    }
    for (int k = 0; k < nops; k++) g.base[k] = base_ptr(operands[k]);

    if (numel < CTI_GRAIN) run_range(0, numel, &g);
    else cti_parallel_for(numel, CTI_GRAIN, run_range, &g);
    return CT_OK;
}
