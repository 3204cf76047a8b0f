/* Backward formula of scaled dot-product attention (src/ops/attention.c).
 *
 *   sdpa:  in (q, k, v) (the mask gets no gradient); saved q, k, v, the
 *          output, the per-row log-sum-exp and the mask (or NULL); params the
 *          forward's cti_attention_params (scale resolved, dropout's seed and
 *          offset, is_causal)
 * The backward op recomputes the softmax from q, k and the log-sum-exp tile
 * by tile and regenerates the dropout mask from seed and offset, so nothing
 * of size T x S is kept between the passes. */
#include "formulas.h"

CTI_BW(cti_bw_sdpa) {
    if (!go[0] || !(n->needs[0] || n->needs[1] || n->needs[2])) return CT_OK;
    ct_tensor *s[6];
    for (int i = 0; i < 6; i++) {
        ct_status st;
        s[i] = cti_ag_saved(n, i, &st);
        if (st != CT_OK) return st;
    }
    const cti_attention_params *p = CTI_NODE_PARAMS(n, cti_attention_params);
    return ct_scaled_dot_product_attention_backward(
        go[0], s[0], s[1], s[2], s[3], s[4], s[5], p->dropout_p, p->is_causal, p->scale, p->seed,
        p->offset, n->needs[0] ? &gi[0] : NULL, n->needs[1] ? &gi[1] : NULL,
        n->needs[2] ? &gi[2] : NULL);
}
