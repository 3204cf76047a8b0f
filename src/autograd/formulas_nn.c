/* Backward formulas of the neural-network ops (src/ops/nn.c).
 *
 * Each one hands the work to the op's backward front end, so the fused CPU
 * and device kernels do it. Inputs, saved tensors and the params the node
 * keeps (the forward op's struct, schema.h):
 *   rms_norm:      in (x, weight|NULL); saved x, weight, inv_rms; no params
 *   layer_norm:    in (x, weight|NULL, bias|NULL); saved x, weight, mean, rstd;
 *                  no params
 *   add_rms_norm:  in (x, residual, weight|NULL); out (y, sum); saved sum, weight,
 *                  inv_rms; no params
 *   add_layer_norm: in (x, residual, weight|NULL, bias|NULL); out (y, sum); saved
 *                  sum, weight, mean, rstd; no params
 *   softmax,
 *   log_softmax:   in (x); saved the output y; cti_softmax_params (dim)
 *   cross_entropy,
 *   nll_loss:      in (logits | log_probs) only, as PyTorch has no gradient
 *                  for target or class weights; saved input, target, weight;
 *                  cti_loss_params (reduction, ignore_index, label_smoothing)
 *   mse_loss:      in (input, target); saved input, target; cti_loss_params
 *                  (reduction)
 *   embedding:     in (weight) only; saved indices; cti_embedding_params
 *                  (num_weights, padding_idx)
 *   dropout:       in (x); saved the mask (NULL for the identity);
 *                  cti_dropout_params (p)
 * A NULL incoming gradient means zero: the formulas then return no gradient. */
#include "formulas.h"

#define SAVED(var, k)                                                                      \
    ct_status st_##var;                                                                    \
    ct_tensor *var = cti_ag_saved(n, k, &st_##var);                                        \
    if (st_##var != CT_OK) return st_##var

static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

CTI_BW(cti_bw_rms_norm) {
    if (!go[0]) return CT_OK;
    SAVED(x, 0);
    SAVED(w, 1);
    SAVED(inv, 2);
    return ct_rms_norm_backward(go[0], x, w, inv, n->needs[0] ? &gi[0] : NULL,
                                n->needs[1] ? &gi[1] : NULL);
}

CTI_BW(cti_bw_layer_norm) {
    if (!go[0]) return CT_OK;
    SAVED(x, 0);
    SAVED(w, 1);
    SAVED(mean, 2);
    SAVED(rstd, 3);
    return ct_layer_norm_backward(go[0], x, w, mean, rstd, n->needs[0] ? &gi[0] : NULL,
                                  n->needs[1] ? &gi[1] : NULL, n->needs[2] ? &gi[2] : NULL);
}

CTI_BW(cti_bw_add_rms_norm) {
    SAVED(sum, 0);
    SAVED(w, 1);
    SAVED(inv, 2);
    return cti_add_norm_backward(false, go[0], go[1], sum, w, inv, NULL, n->in_dtype[0],
                                 n->in_dtype[1], n->needs, gi);
}

CTI_BW(cti_bw_add_layer_norm) {
    SAVED(sum, 0);
    SAVED(w, 1);
    SAVED(mean, 2);
    SAVED(rstd, 3);
    return cti_add_norm_backward(true, go[0], go[1], sum, w, mean, rstd, n->in_dtype[0],
                                 n->in_dtype[1], n->needs, gi);
}

CTI_BW(cti_bw_softmax) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(y, 0);
    const cti_softmax_params *p = CTI_NODE_PARAMS(n, cti_softmax_params);
    return put(&gi[0], ct_softmax_backward(go[0], y, p->dim));
}

CTI_BW(cti_bw_log_softmax) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(y, 0);
    const cti_softmax_params *p = CTI_NODE_PARAMS(n, cti_softmax_params);
    return put(&gi[0], ct_log_softmax_backward(go[0], y, p->dim));
}

CTI_BW(cti_bw_cross_entropy) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(logits, 0);
    SAVED(target, 1);
    SAVED(w, 2);
    SAVED(stats, 3);
    const cti_loss_params *p = CTI_NODE_PARAMS(n, cti_loss_params);
    return put(&gi[0], cti_cross_entropy_backward_saved(go[0], logits, target, w, stats, p));
}

CTI_BW(cti_bw_nll_loss) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(lp, 0);
    SAVED(target, 1);
    SAVED(w, 2);
    const cti_loss_params *p = CTI_NODE_PARAMS(n, cti_loss_params);
    return put(&gi[0], ct_nll_loss_backward(go[0], lp, target, w, (ct_reduction)p->reduction,
                                            p->ignore_index));
}

CTI_BW(cti_bw_mse_loss) {
    if (!go[0]) return CT_OK;
    SAVED(input, 0);
    SAVED(target, 1);
    ct_reduction r = (ct_reduction)CTI_NODE_PARAMS(n, cti_loss_params)->reduction;
    ct_status st = CT_OK;
    if (n->needs[0]) st = put(&gi[0], ct_mse_loss_backward(go[0], input, target, r));
    /* The loss is symmetric in its two arguments, so the target's gradient
     * (the negative of the input's, summed to the target's shape) is the
     * same backward with their roles swapped. */
    if (st == CT_OK && n->needs[1]) st = put(&gi[1], ct_mse_loss_backward(go[0], target, input, r));
    return st;
}

CTI_BW(cti_bw_embedding) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(indices, 0);
    const cti_embedding_params *p = CTI_NODE_PARAMS(n, cti_embedding_params);
    return put(&gi[0], ct_embedding_backward(go[0], indices, p->num_weights, p->padding_idx));
}

CTI_BW(cti_bw_dropout) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(mask, 0);
    return put(&gi[0], ct_dropout_backward(go[0], mask, CTI_NODE_PARAMS(n, cti_dropout_params)->p));
}
