/* Backward formula of ct_conv_transpose2d (src/ops/layers.c). Its forward
 * is conv2d's gradient with respect to the input, y = conv2d_backward_input(x, w),
 * so the roles swap: dx = conv2d(dy, w) and dw = conv2d_backward_weight
 * with x as the "gradient" and dy as the "input". The bias is added with
 * ct_add after the node, which records its own gradient. */
#include "formulas.h"

CTI_BW(cti_bw_conv_transpose2d) {
    if (!go[0]) return CT_OK;
    const cti_conv_params *p = CTI_NODE_PARAMS(n, cti_conv_params);
    ct_status st;
    if (n->needs[0]) {
        ct_tensor *w = cti_ag_saved(n, 1, &st);
        if (st != CT_OK) return st;
        gi[0] = ct_conv2d(go[0], w, NULL, p->stride, p->padding, p->dilation, p->groups);
        if (!gi[0]) return ct_last_status();
    }
    if (n->needs[1]) {
        ct_tensor *x = cti_ag_saved(n, 0, &st);
        if (st != CT_OK) return st;
        gi[1] = ct_conv2d_backward_weight(x, go[0], n->in_shape[1], p->stride, p->padding,
                                          p->dilation, p->groups);
        if (!gi[1]) return ct_last_status();
    }
    return CT_OK;
}
