/* Backward formula of ct_linear_cross_entropy (src/ops/linear_ce.c); what
 * its node saves is listed in formulas.h. With mean or sum the forward has
 * computed the gradients already (scaled as for a sum), so the backward only
 * multiplies them by grad_loss (over the count for mean); with reduction
 * none it runs the chunked backward with grad_loss as the rows' scales. */
#include "formulas.h"

#define SAVED(var, k)                                                                      \
    ct_status st_##var;                                                                    \
    ct_tensor *var = cti_ag_saved(n, k, &st_##var);                                        \
    if (st_##var != CT_OK) return st_##var

ct_tensor *cti_linear_ce_factor(ct_tensor *grad_loss, ct_tensor *count, int reduction) {
    ct_tensor *g = ct_to_dtype(grad_loss, grad_loss->dtype == CT_F64 ? CT_F64 : CT_F32);
    if (!g || reduction != CT_REDUCTION_MEAN) return g;
    ct_tensor *c1 = ct_maximum_scalar(count, 1);
    ct_tensor *f = c1 ? ct_div(g, c1) : NULL;
    ct_tensor_release(c1);
    ct_tensor_release(g);
    return f;
}

/* gi = saved * factor, in saved's dtype. */
static ct_status scaled(ct_tensor **gi, ct_tensor *saved, ct_tensor *factor) {
    if (!saved) return CT_OK;
    *gi = ct_mul(saved, factor);
    return *gi ? CT_OK : ct_last_status();
}

static ct_status bw_eager(cti_node *n, ct_tensor *go, ct_tensor **gi, const cti_lce_params *p) {
    SAVED(dx, 0);
    SAVED(dw, 1);
    SAVED(db, 2);
    SAVED(count, 3);
    ct_tensor *f = cti_linear_ce_factor(go, count, p->reduction);
    if (!f) return ct_last_status();
    ct_tensor *sv[3] = {dx, dw, db};
    ct_status st = CT_OK;
    for (int i = 0; i < 3 && st == CT_OK; i++)
        if (n->needs[i]) st = scaled(&gi[i], sv[i], f);
    ct_tensor_release(f);
    return st;
}

CTI_BW(cti_bw_linear_cross_entropy) {
    if (!go[0] || !(n->needs[0] || n->needs[1] || n->needs[2])) return CT_OK;
    const cti_lce_params *p = CTI_NODE_PARAMS(n, cti_lce_params);
    if (p->eager) return bw_eager(n, go[0], gi, p);
    SAVED(x, 0);
    SAVED(w, 1);
    SAVED(b, 2);
    SAVED(t, 3);
    /* an autocast forward returned a float32 loss for x of a narrower dtype */
    ct_tensor *g = ct_to_dtype(go[0], x->dtype);
    if (!g) return ct_last_status();
    ct_status st = ct_linear_cross_entropy_backward(
        g, x, w, b, t, p->ignore_index, p->label_smoothing, (ct_reduction)p->reduction,
        n->needs[0] ? &gi[0] : NULL, n->needs[1] ? &gi[1] : NULL,
        n->needs[2] && b ? &gi[2] : NULL);
    ct_tensor_release(g);
    return st;
}
