/* Backward formulas of the transformer's fused pointwise ops (src/ops/rope.c).
 *
 * Each one hands the work to the op's backward front end, so the fused CPU
 * and device kernels do it. Inputs, saved tensors and the params the node
 * keeps:
 *   rope:    in (x) only, as cos and sin are tables and get no gradient;
 *            saved cos, sin; cti_rope_params (layout)
 *   swiglu:  in (gate, up); saved gate, up; no params. When gate and up are
 *            the halves of one chunk, their gradients come back as the
 *            halves of one buffer, which SplitBackward passes on as it is.
 * A NULL incoming gradient means zero: the formulas then return no gradient. */
#include "formulas.h"

#define SAVED(var, k)                                                                      \
    ct_status st_##var;                                                                    \
    ct_tensor *var = cti_ag_saved(n, k, &st_##var);                                        \
    if (st_##var != CT_OK) return st_##var

CTI_BW(cti_bw_rope) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(cs, 0);
    SAVED(sn, 1);
    const cti_rope_params *p = CTI_NODE_PARAMS(n, cti_rope_params);
    gi[0] = ct_rope_backward(go[0], cs, sn, (ct_rope_layout)p->layout);
    return gi[0] ? CT_OK : ct_last_status();
}

CTI_BW(cti_bw_swiglu) {
    if (!go[0] || (!n->needs[0] && !n->needs[1])) return CT_OK;
    SAVED(gate, 0);
    SAVED(up, 1);
    return ct_swiglu_backward(go[0], gate, up, n->needs[0] ? &gi[0] : NULL,
                              n->needs[1] ? &gi[1] : NULL);
}
