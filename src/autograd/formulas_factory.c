/* Backward formulas of the copying joins (src/ops/factory.c), with the
 * joined dim in a cti_join_params:
 *   out = cat(t_0 .. t_n-1, dim):   dt_k = narrow(dout, dim, pos_k, len_k),
 *                                   pos_k the total length of t_0 .. t_k-1
 *   out = stack(t_0 .. t_n-1, dim): dt_k = select(dout, dim, k) */
#include "formulas.h"

/* Each input gets the slice of the gradient it filled. */
CTI_BW(cti_bw_cat) {
    int dim = CTI_NODE_PARAMS(n, cti_join_params)->dim;
    int64_t pos = 0;
    for (int k = 0; k < n->nin; k++) {
        bool skipped = n->in_ndim[k] == 1 && n->in_shape[k][0] == 0;
        if (skipped) continue;
        int64_t len = n->in_shape[k][dim];
        if (n->needs[k] && go[0] && !(gi[k] = ct_narrow(go[0], dim, pos, len)))
            return ct_last_status();
        pos += len;
    }
    return CT_OK;
}

/* Each input gets its index along the new dim. */
CTI_BW(cti_bw_stack) {
    int dim = CTI_NODE_PARAMS(n, cti_join_params)->dim;
    for (int k = 0; k < n->nin; k++)
        if (n->needs[k] && go[0] && !(gi[k] = ct_select(go[0], dim, k))) return ct_last_status();
    return CT_OK;
}
