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

static ct_tensor *diagonal_part(ct_tensor *z, const cti_view_params *p) {
    return ct_diagonal(z, p->index, p->dim0, p->dim1);
}

CTI_BW(cti_bw_diagonal) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return scatter_into_zeros(n, go[0], diagonal_part, &gi[0]);
}
