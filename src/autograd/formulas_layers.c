/* Backward formulas of ct_conv_transpose2d and batch norm (src/ops/layers.c).
 *
 * conv_transpose2d: Its forward
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

CTI_BW(cti_bw_batch_norm) {
    if (!go[0]) return CT_OK;
    const cti_batch_norm_params *p = CTI_NODE_PARAMS(n, cti_batch_norm_params);
    ct_status st;
    ct_tensor *saved[4];
    for (int k = 0; k < 4; k++) {
        saved[k] = cti_ag_saved(n, k, &st);
        if (st != CT_OK) return st;
    }
    if (!n->needs[0] && !n->needs[1] && !n->needs[2]) return CT_OK;
    /* the op saw x as [N, C, S] (group and instance norm fold N into C) */
    const int64_t s3[3] = {p->N, p->C, p->S};
    ct_tensor *g3 = ct_reshape(go[0], 3, s3);
    ct_tensor *x3 = g3 ? ct_reshape(saved[0], 3, s3) : NULL;
    ct_tensor *dx3 = NULL;
    st = x3 ? ct_batch_norm_backward(g3, x3, saved[1], saved[2], saved[3], p->training, p->eps,
                                     n->needs[0] ? &dx3 : NULL, n->needs[1] ? &gi[1] : NULL,
                                     n->needs[2] ? &gi[2] : NULL)
            : ct_last_status();
    ct_tensor_release(g3);
    ct_tensor_release(x3);
    if (st == CT_OK && dx3) {
        gi[0] = ct_reshape(dx3, n->in_ndim[0], n->in_shape[0]);
        if (!gi[0]) st = ct_last_status();
    }
    ct_tensor_release(dx3);
    return st;
}
