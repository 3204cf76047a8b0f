/* Backward formulas of the views (src/ops/views.c).
 *
 * Each node has the one input t; nothing is saved, the input's shape is on
 * the node. Parameters (cti_view_params):
 *   view / squeeze / unsqueeze: none (the gradient is reshaped to t's shape)
 *   transpose / t:  dim0, dim1 the swapped dims (-1, -1 when nothing moved)
 *   permute:        perm[0..ndim-1] the permutation, non-negative
 *   slice / narrow: dim, start, end, step (as ct_slice)
 *   select:         dim, index (non-negative)
 *   expand:         none (the engine sums the gradient back to t's shape)
 *   split / chunk:  a cti_join_params, one node for all the pieces (below)
 * and, for writes through views (nodes graph.c records, at the end of this
 * file): AsStridedBackward, CopySlices and the overwrite nodes of ct_copy_,
 * ct_fill_ and ct_zero_, with a cti_strided_params.
 * The incoming gradient may have any strides (itself a view or an expanded
 * tensor), so the formulas use ops that accept every layout. */
#include "formulas.h"

static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

CTI_BW(cti_bw_view) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return put(&gi[0], ct_reshape(go[0], n->in_ndim[0], n->in_shape[0]));
}

CTI_BW(cti_bw_transpose) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_view_params *p = CTI_NODE_PARAMS(n, cti_view_params);
    if (p->dim0 < 0) return put(&gi[0], ct_tensor_retain(go[0]));
    return put(&gi[0], ct_transpose(go[0], p->dim0, p->dim1));
}

CTI_BW(cti_bw_permute) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_view_params *p = CTI_NODE_PARAMS(n, cti_view_params);
    int nd = n->in_ndim[0];
    int64_t inv[CT_MAX_DIMS];
    for (int k = 0; k < nd; k++) inv[p->perm[k]] = k;
    return put(&gi[0], ct_permute(go[0], nd, inv));
}

/* A zero tensor of t's shape with go copied into the part the view took,
 * which view(zeros) gives back. */
typedef ct_tensor *(*part_fn)(ct_tensor *z, const cti_view_params *p);

static ct_tensor *slice_part(ct_tensor *z, const cti_view_params *p) {
    return ct_slice(z, p->dim, p->start, p->end, p->step);
}

static ct_tensor *select_part(ct_tensor *z, const cti_view_params *p) {
    return ct_select(z, p->dim, p->index);
}

static ct_status scatter_into_zeros(cti_node *n, ct_tensor *g, part_fn part, ct_tensor **out) {
    ct_tensor *z = ct_tensor_zeros(n->in_ndim[0], n->in_shape[0], ct_tensor_dtype(g),
                                   ct_tensor_device(g));
    if (!z) return ct_last_status();
    ct_tensor *v = part(z, CTI_NODE_PARAMS(n, cti_view_params));
    ct_status st = v ? ct_copy_(v, g) : ct_last_status();
    ct_tensor_release(v);
    if (st != CT_OK) {
        ct_tensor_release(z);
        return st;
    }
    *out = z;
    return CT_OK;
}

CTI_BW(cti_bw_slice) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return scatter_into_zeros(n, go[0], slice_part, &gi[0]);
}

CTI_BW(cti_bw_select) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return scatter_into_zeros(n, go[0], select_part, &gi[0]);
}

CTI_BW(cti_bw_expand) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    gi[0] = ct_tensor_retain(go[0]);
    return CT_OK;
}

/* A view of go[0]'s storage of t's shape when go[0..nout) lie there as the
 * cat of the pieces along dim would place them (one storage, dtype and
 * strides; each piece's offset its start along dim further on), else NULL.
 * Its elements are the pieces' gradients element for element. */
static ct_tensor *adjacent_grads(cti_node *n, int dim, ct_tensor *const *go) {
    const ct_tensor *g0 = go[0];
    if (!g0) return NULL;
    int64_t start = 0;
    for (int k = 0; k < n->nout; k++) {
        const ct_tensor *g = go[k];
        if (!g || g->storage != g0->storage || g->dtype != g0->dtype || g->ndim != g0->ndim ||
            g->offset != g0->offset + start * g0->stride[dim])
            return NULL;
        for (int d = 0; d < g->ndim; d++)
            if (g->stride[d] != g0->stride[d] || g->shape[d] != n->out_shape[k][d]) return NULL;
        start += n->out_shape[k][dim];
    }
    return cti_tensor_view(g0, n->in_ndim[0], n->in_shape[0], g0->stride, g0->offset);
}

CTI_BW(cti_bw_split) {
    if (!n->needs[0]) return CT_OK;
    int dim = CTI_NODE_PARAMS(n, cti_join_params)->dim;
    const ct_tensor *some = NULL;
    for (int k = 0; k < n->nout && !some; k++) some = go[k];
    if (!some) return CT_OK;
    ct_tensor *w = adjacent_grads(n, dim, go);
    if (w) return put(&gi[0], w);
    ct_tensor *parts[CTI_AG_MAX_OUT], *zeros[CTI_AG_MAX_OUT] = {NULL};
    ct_status st = CT_OK;
    for (int k = 0; k < n->nout && st == CT_OK; k++) {
        if (go[k]) {
            parts[k] = go[k];
            continue;
        }
        zeros[k] = parts[k] = ct_tensor_zeros(n->out_ndim[k], n->out_shape[k], n->out_dtype[k],
                                              ct_tensor_device(some));
        if (!zeros[k]) st = ct_last_status();
    }
    if (st == CT_OK) st = put(&gi[0], ct_cat(n->nout, parts, dim));
    for (int k = 0; k < n->nout; k++) ct_tensor_release(zeros[k]);
    return st;
}

static ct_tensor *diagonal_part(ct_tensor *z, const cti_view_params *p) {
    return ct_diagonal(z, p->index, p->dim0, p->dim1);
}

CTI_BW(cti_bw_diagonal) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return scatter_into_zeros(n, go[0], diagonal_part, &gi[0]);
}

/* ---- views written in place (graph.c records these) ------------------------------------
 * The base's gradient is laid out as the base lies in its storage: a new
 * buffer spanning the base's elements holds *whole (the base's shape and
 * strides) and, inside it, *region (the view's shape and strides at its
 * offset from the base), so the view's elements are found where the view
 * found them. Only core views and ct_copy_/ct_zero_/ct_clone: every device
 * runs these with the kernels it has. */
static ct_status base_layout(cti_node *n, const cti_strided_params *p, int vnd,
                             const int64_t *vshape, const ct_tensor *like, ct_tensor **whole,
                             ct_tensor **region) {
    int bnd = n->in_ndim[0];
    const int64_t *bshape = n->in_shape[0];
    int64_t lo = 0, hi = 0, len = 0;
    if (cti_numel(bnd, bshape) > 0) {
        for (int d = 0; d < bnd; d++) {
            int64_t span = (bshape[d] - 1) * p->base_stride[d];
            if (span < 0) lo += span;
            else hi += span;
        }
        len = hi - lo + 1;
    }
    *whole = *region = NULL;
    ct_tensor *buf = cti_tensor_new(n->name, 1, &len, like->dtype, like->storage->device);
    if (!buf) return ct_last_status();
    *whole = cti_tensor_view(buf, bnd, bshape, p->base_stride, -lo);
    *region = *whole ? cti_tensor_view(buf, vnd, vshape, p->view_stride, p->view_offset - lo)
                     : NULL;
    ct_tensor_release(buf); /* the views keep the storage */
    if (*region) return CT_OK;
    ct_tensor_release(*whole);
    *whole = NULL;
    return ct_last_status();
}

/* g on device dev (a new reference). */
static ct_tensor *on_device(ct_tensor *g, ct_device dev) {
    if (ct_device_eq(ct_tensor_device(g), dev)) return ct_tensor_retain(g);
    return ct_to_device(g, dev);
}

/* A view of the base: zeros of the base's layout, the view's gradient in
 * its region. */
CTI_BW(cti_bw_as_strided) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_strided_params *p = CTI_NODE_PARAMS(n, cti_strided_params);
    ct_tensor *whole, *region;
    ct_status st = base_layout(n, p, n->out_ndim[0], n->out_shape[0], go[0], &whole, &region);
    if (st == CT_OK) st = ct_zero_(whole);
    if (st == CT_OK) st = ct_copy_(region, go[0]);
    ct_tensor_release(region);
    if (st != CT_OK) {
        ct_tensor_release(whole);
        return st;
    }
    gi[0] = whole;
    return CT_OK;
}

/* The base after a write through a view: the written values take the
 * region's gradient, the old history the rest (zero in the region, which
 * the write replaced). */
CTI_BW(cti_bw_copy_slices) {
    if (!go[0]) return CT_OK;
    const cti_strided_params *p = CTI_NODE_PARAMS(n, cti_strided_params);
    ct_tensor *whole, *region, *gv = NULL;
    ct_status st = base_layout(n, p, n->in_ndim[1], n->in_shape[1], go[0], &whole, &region);
    if (st != CT_OK) return st;
    st = ct_copy_(whole, go[0]);
    if (st == CT_OK && n->needs[1]) {
        ct_tensor *c = ct_clone(region);
        gv = c ? on_device(c, p->src_device) : NULL;
        ct_tensor_release(c);
        if (!gv) st = ct_last_status();
    }
    if (st == CT_OK && n->needs[0]) st = ct_zero_(region);
    ct_tensor_release(region);
    if (st != CT_OK) {
        ct_tensor_release(whole);
        ct_tensor_release(gv);
        return st;
    }
    gi[1] = gv;
    if (n->needs[0]) gi[0] = whole;
    else ct_tensor_release(whole);
    return CT_OK;
}

CTI_BW(cti_bw_overwrite) {
    if (!go[0]) return CT_OK;
    const cti_strided_params *p = CTI_NODE_PARAMS(n, cti_strided_params);
    if (n->needs[0]) {
        gi[0] = ct_tensor_zeros(go[0]->ndim, go[0]->shape, go[0]->dtype, ct_tensor_device(go[0]));
        if (!gi[0]) return ct_last_status();
    }
    if (n->nin > 1 && n->needs[1]) return put(&gi[1], on_device(go[0], p->src_device));
    return CT_OK;
}
