/* Backward formulas of tril/triu, cumsum and topk (src/ops/seqops.c). The
 * node keeps the forward's cti_seq_params:
 *   tril, triu: in (x); nothing saved; diagonal. The gradient is the
 *               incoming one under the same mask.
 *   cumsum:     in (x); nothing saved; dim, reverse. The gradient of a
 *               running sum is the running sum from the other end.
 *   topk:       in (x); saved the int64 indices; dim, n (the size of dim).
 *               The gradient is zero but at the indices.
 * A NULL incoming gradient means zero: the formulas then return none. */
#include "formulas.h"

static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

CTI_BW(cti_bw_tril) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return put(&gi[0], ct_tril(go[0], CTI_NODE_PARAMS(n, cti_seq_params)->diagonal));
}

CTI_BW(cti_bw_triu) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return put(&gi[0], ct_triu(go[0], CTI_NODE_PARAMS(n, cti_seq_params)->diagonal));
}

CTI_BW(cti_bw_cumsum) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_seq_params *p = CTI_NODE_PARAMS(n, cti_seq_params);
    return put(&gi[0], p->reverse ? ct_cumsum(go[0], p->dim) : ct_cumsum_backward(go[0], p->dim));
}

CTI_BW(cti_bw_topk) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_seq_params *p = CTI_NODE_PARAMS(n, cti_seq_params);
    ct_status st;
    ct_tensor *idx = cti_ag_saved(n, 0, &st);
    if (st != CT_OK) return st;
    return put(&gi[0], ct_topk_backward(go[0], idx, p->dim, p->n));
}
