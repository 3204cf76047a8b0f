/* Backward formulas of convolution and pooling (src/ops/conv.c), built on
 * the public backward ops so they run on every device. Each node keeps its
 * forward's params struct.
 *
 * Inputs, saved tensors and params read:
 *   conv2d:               inputs (x, w, bias); saved[0] x (only when w needs
 *                         a gradient), saved[1] w (only when x needs one);
 *                         cti_conv_params' stride, padding, dilation, groups
 *   max_pool2d:           input x; saved[0] the int64 argmax indices; no
 *                         params (the indices hold the windows)
 *   avg_pool2d:           input x; nothing saved; cti_pool_params' kernel,
 *                         stride, padding, ceil_mode, count_include_pad
 *   adaptive_avg_pool2d:  input x; nothing saved; no params (the output
 *                         size is the gradient's)
 * The pooling gradients do not depend on x's values, only on its geometry,
 * so x is not saved: the backward ops get a stand-in of x's shape instead,
 * which keeps activations free and x writable in place after the forward. */
#include "formulas.h"

static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

/* x's shape as NCHW (a 3-d CHW input is one image). */
static void input_nchw(const cti_node *n, int64_t s[4]) {
    int nd = n->in_ndim[0];
    s[0] = nd == 4 ? n->in_shape[0][0] : 1;
    for (int d = 0; d < 3; d++) s[d + 1] = n->in_shape[0][nd - 3 + d];
}

/* A tensor with x's shape and g's dtype and device that reads a single
 * element (a broadcast zero): what the pooling backward ops take for x. */
static ct_tensor *shape_of_input(const cti_node *n, ct_tensor *g) {
    ct_tensor *z = ct_tensor_scalar(0.0, ct_tensor_dtype(g), ct_tensor_device(g));
    if (!z) return NULL;
    ct_tensor *x = ct_expand(z, n->in_ndim[0], n->in_shape[0]);
    ct_tensor_release(z);
    return x;
}

CTI_BW(cti_bw_conv2d) {
    if (!go[0]) return CT_OK;
    const cti_conv_params *p = CTI_NODE_PARAMS(n, cti_conv_params);
    ct_status st;
    if (n->needs[0]) {
        ct_tensor *w = cti_ag_saved(n, 1, &st);
        if (st != CT_OK) return st;
        int64_t xs[4];
        input_nchw(n, xs);
        st = put(&gi[0], ct_conv2d_backward_input(go[0], w, xs, p->stride, p->padding,
                                                  p->dilation, p->groups));
        if (st != CT_OK) return st;
    }
    if (n->needs[1]) {
        ct_tensor *x = cti_ag_saved(n, 0, &st);
        if (st != CT_OK) return st;
        st = put(&gi[1], ct_conv2d_backward_weight(go[0], x, n->in_shape[1], p->stride,
                                                   p->padding, p->dilation, p->groups));
        if (st != CT_OK) return st;
    }
    if (n->needs[2]) return put(&gi[2], ct_conv2d_backward_bias(go[0]));
    return CT_OK;
}

CTI_BW(cti_bw_max_pool2d) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    ct_status st;
    ct_tensor *idx = cti_ag_saved(n, 0, &st);
    if (st != CT_OK) return st;
    ct_tensor *x = shape_of_input(n, go[0]);
    if (!x) return ct_last_status();
    st = put(&gi[0], ct_max_pool2d_backward(go[0], x, idx));
    ct_tensor_release(x);
    return st;
}

CTI_BW(cti_bw_avg_pool2d) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    ct_tensor *x = shape_of_input(n, go[0]);
    if (!x) return ct_last_status();
    const cti_pool_params *p = CTI_NODE_PARAMS(n, cti_pool_params);
    ct_status st = put(&gi[0], ct_avg_pool2d_backward(go[0], x, p->kernel, p->stride, p->padding,
                                                      p->ceil_mode, p->count_include_pad));
    ct_tensor_release(x);
    return st;
}

CTI_BW(cti_bw_adaptive_avg_pool2d) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    ct_tensor *x = shape_of_input(n, go[0]);
    if (!x) return ct_last_status();
    ct_status st = put(&gi[0], ct_adaptive_avg_pool2d_backward(go[0], x));
    ct_tensor_release(x);
    return st;
}
