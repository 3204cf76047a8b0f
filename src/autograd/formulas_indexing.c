/* Backward formulas of the indexing ops (src/ops/indexing.c), as PyTorch's:
 *   gather:       in (x); saved index; cti_index_params (dim)
 *                 grad_x = scatter_add(zeros like x, dim, index, g)
 *   scatter_add:  in (x, src); saved index; cti_index_params (dim)
 *                 grad_x = g, grad_src = gather(g, dim, index), zero where
 *                 src reaches beyond index (PyTorch refuses that case)
 *   index_select: in (x); saved index; cti_index_params (dim)
 *                 grad_x = index_add of g into zeros like x: scatter_add
 *                 with the index expanded to g's shape
 * masked_fill, repeat_interleave, split and chunk are made of ops with
 * formulas of their own (where, expand, narrow). A NULL incoming gradient
 * means zero: the formulas then return no gradient. */
#include "formulas.h"

#define SAVED(var, k)                                                                      \
    ct_status st_##var;                                                                    \
    ct_tensor *var = cti_ag_saved(n, k, &st_##var);                                        \
    if (st_##var != CT_OK) return st_##var

static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

/* Zeros of input k's shape with g's dtype and device, src added at index. */
static ct_tensor *scatter_into_zeros(cti_node *n, int k, ct_tensor *g, int dim, ct_tensor *index) {
    ct_tensor *z = ct_tensor_zeros(n->in_ndim[k], n->in_shape[k], ct_tensor_dtype(g),
                                   ct_tensor_device(g));
    if (!z) return NULL;
    ct_tensor *r = ct_scatter_add(z, dim, index, g);
    ct_tensor_release(z);
    return r;
}

CTI_BW(cti_bw_gather) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(index, 0);
    const cti_index_params *p = CTI_NODE_PARAMS(n, cti_index_params);
    return put(&gi[0], scatter_into_zeros(n, 0, go[0], p->dim, index));
}

CTI_BW(cti_bw_scatter_add) {
    if (!go[0]) return CT_OK;
    SAVED(index, 0);
    const cti_index_params *p = CTI_NODE_PARAMS(n, cti_index_params);
    ct_status st = CT_OK;
    if (n->needs[0]) st = put(&gi[0], ct_tensor_retain(go[0]));
    if (st == CT_OK && n->needs[1])
        st = put(&gi[1], cti_grad_into_input(n, 1, ct_gather(go[0], p->dim, index)));
    return st;
}

CTI_BW(cti_bw_index_select) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(index, 0);
    const cti_index_params *p = CTI_NODE_PARAMS(n, cti_index_params);
    ct_tensor *g = go[0];
    int nd = ct_tensor_ndim(g);
    /* index as [1, .., n, .., 1], expanded to g's shape (a 0-d g: a 0-d index) */
    int64_t vs[CT_MAX_DIMS];
    for (int k = 0; k < nd; k++) vs[k] = k == p->dim ? ct_tensor_numel(index) : 1;
    ct_tensor *i64 = ct_to_dtype(index, CT_I64);
    ct_tensor *iv = i64 ? ct_reshape(i64, nd, vs) : NULL;
    ct_tensor *ie = iv ? ct_expand(iv, nd, ct_tensor_shape(g)) : NULL;
    ct_tensor *r = ie ? scatter_into_zeros(n, 0, g, p->dim, ie) : NULL;
    ct_tensor_release(ie);
    ct_tensor_release(iv);
    ct_tensor_release(i64);
    return put(&gi[0], r);
}
