/* Backward formulas of the copying joins: cat and stack. */
#include "formulas.h"

/* Each input gets the slice of the gradient it filled (i[0] = dim). */
CTI_BW(cti_bw_cat) {
    int dim = (int)LEGACY_I(n)[0];
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

/* Each input gets its index along the new dim (i[0] = dim). */
CTI_BW(cti_bw_stack) {
    int dim = (int)LEGACY_I(n)[0];
    for (int k = 0; k < n->nin; k++)
        if (n->needs[k] && go[0] && !(gi[k] = ct_select(go[0], dim, k))) return ct_last_status();
    return CT_OK;
}
