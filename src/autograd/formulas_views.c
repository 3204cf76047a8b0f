/* Backward formulas of the views (src/dispatch/views.c).
 *
 * Each node has the one input t; nothing is saved, the input's shape is on
 * the node. Parameters (i[]):
 *   view / squeeze / unsqueeze: none (the gradient is reshaped to t's shape)
 *   transpose / t:  i[0], i[1] the swapped dims (-1, -1 when nothing moved)
 *   permute:        i[0..ndim-1] the permutation, non-negative
 *   slice / narrow: i[0] dim, i[1] start, i[2] end, i[3] step (as ct_slice)
 *   select:         i[0] dim, i[1] index (non-negative)
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
    if (LEGACY_I(n)[0] < 0) return put(&gi[0], ct_tensor_retain(go[0]));
    return put(&gi[0], ct_transpose(go[0], (int)LEGACY_I(n)[0], (int)LEGACY_I(n)[1]));
}

CTI_BW(cti_bw_permute) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    int nd = n->in_ndim[0];
    int64_t inv[CT_MAX_DIMS];
    for (int k = 0; k < nd; k++) inv[LEGACY_I(n)[k]] = k;
    return put(&gi[0], ct_permute(go[0], nd, inv));
}

/* A zero tensor of t's shape with go copied into the part the view took,
 * which view(zeros) gives back. */
typedef ct_tensor *(*part_fn)(ct_tensor *z, const int64_t *iv);

static ct_tensor *slice_part(ct_tensor *z, const int64_t *iv) {
    return ct_slice(z, (int)iv[0], iv[1], iv[2], iv[3]);
}

static ct_tensor *select_part(ct_tensor *z, const int64_t *iv) {
    return ct_select(z, (int)iv[0], iv[1]);
}

static ct_status scatter_into_zeros(cti_node *n, ct_tensor *g, part_fn part, ct_tensor **out) {
    ct_tensor *z = ct_tensor_zeros(n->in_ndim[0], n->in_shape[0], ct_tensor_dtype(g),
                                   ct_tensor_device(g));
    if (!z) return ct_last_status();
    ct_tensor *v = part(z, LEGACY_I(n));
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
