/* Front ends of convolution and pooling: argument checks with PyTorch's
 * rules, output shapes, dispatch. A 3-d CHW input is one image; its results
 * are 3-d too. Kernels receive the geometry as cti_conv_params or
 * cti_pool_params (src/dispatch/schema.h), and the forward ops' nodes keep
 * the same struct for their backward. The backward ops record nothing (no
 * double backward). */
#include <limits.h>

#include "ops_impl.h"
#include "tensor/ops.h"

static bool is_float(ct_dtype d) {
    return d == CT_F32 || d == CT_F64 || d == CT_F16 || d == CT_BF16;
}

static const char *pair_s(const int64_t v[2]) { return cti_shape_s(2, v); }

/* Copies a 2-element parameter, or its default when p is NULL. */
static void pair_or(const int64_t *p, int64_t def0, int64_t def1, int64_t out[2]) {
    out[0] = p ? p[0] : def0;
    out[1] = p ? p[1] : def1;
}

static ct_status check_pair(const char *op, const char *name, const int64_t v[2], int64_t min) {
    if (v[0] >= min && v[1] >= min) return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG, "%s: %s must be %s, got %s", op, name,
                     min > 0 ? "positive" : "non-negative", pair_s(v));
}

/* N, C, H, W of a 3-d (N = 1) or 4-d tensor's shape. */
static void nchw(const ct_tensor *t, int64_t s[4]) {
    s[0] = t->ndim == 4 ? t->shape[0] : 1;
    for (int d = 0; d < 3; d++) s[d + 1] = t->shape[t->ndim - 3 + d];
}

/* Shape of an NCHW result for an input of ndim 3 or 4. */
static int result_shape(int ndim, int64_t n, int64_t c, int64_t h, int64_t w, int64_t out[4]) {
    int64_t s[4] = {n, c, h, w};
    for (int d = 0; d < ndim; d++) out[d] = s[d + 4 - ndim];
    return ndim;
}

static ct_status check_image(const char *op, const char *name, const ct_tensor *t) {
    if (t->ndim != 3 && t->ndim != 4)
        return cti_error(CT_ERR_SHAPE, "%s: expected a 3-d (CHW) or 4-d (NCHW) %s, got %s", op,
                         name, cti_desc(t));
    return CT_OK;
}

static ct_status check_float(const char *op, const char *name, const ct_tensor *t) {
    if (is_float(t->dtype)) return CT_OK;
    return cti_error(CT_ERR_DTYPE,
                     "%s: expected a float16, bfloat16, float32 or float64 %s, got %s", op, name,
                     cti_desc(t));
}

static ct_status check_same_dtype(const char *op, const char *a_name, const ct_tensor *a,
                                  const char *b_name, const ct_tensor *b) {
    if (a->dtype == b->dtype) return CT_OK;
    return cti_error(CT_ERR_DTYPE, "%s: %s %s and %s %s must have the same dtype", op, a_name,
                     cti_desc(a), b_name, cti_desc(b));
}

/* Runs the call on the device and dtype of `on`; releases the outputs on failure. */
static ct_tensor *dispatch_one(ct_call *c, const ct_tensor *on) {
    if (cti_run(c, on->storage->device, on->dtype) != CT_OK) {
        cti_call_release_outputs(c);
        return NULL;
    }
    return c->out[0];
}

/* ---- convolution ------------------------------------------------------------------- */

/* The shapes a convolution is checked on, and the kernels' parameters
 * conv_geometry derives from them. */
typedef struct conv_args {
    int64_t x[4]; /* input N C H W */
    int64_t w[4]; /* weight Co Cin/groups kh kw */
    cti_conv_params p;
} conv_args;

static ct_status conv_params(const char *op, const int64_t *stride, const int64_t *padding,
                             const int64_t *dilation, int64_t groups, conv_args *a) {
    cti_conv_params *p = &a->p;
    pair_or(stride, 1, 1, p->stride);
    pair_or(padding, 0, 0, p->padding);
    pair_or(dilation, 1, 1, p->dilation);
    p->groups = groups;
    ct_status s = check_pair(op, "stride", p->stride, 1);
    if (s == CT_OK) s = check_pair(op, "padding", p->padding, 0);
    if (s == CT_OK) s = check_pair(op, "dilation", p->dilation, 1);
    if (s == CT_OK && groups < 1)
        s = cti_error(CT_ERR_INVALID_ARG, "%s: groups must be positive, got %lld", op,
                      (long long)groups);
    return s;
}

/* One spatial dim's padded input, in + 2 p, and dilated kernel, d (k - 1) + 1;
 * false when either overflows int64 (user-given padding, dilation or kernel
 * near the limit). */
static bool spans(int64_t in, int64_t p, int64_t d, int64_t k, int64_t *padded, int64_t *eff) {
    int64_t twop, dk;
    return !__builtin_mul_overflow(p, 2, &twop) && !__builtin_add_overflow(in, twop, padded) &&
           !__builtin_mul_overflow(d, k - 1, &dk) && !__builtin_add_overflow(dk, 1, eff);
}

static ct_status spans_overflow(const char *op, const char *kname, const int64_t *kernel,
                                const int64_t *padding, const int64_t *dilation,
                                const char *input) {
    return cti_error(CT_ERR_OVERFLOW,
                     "%s: %s %s, padding %s and dilation %s with input %s overflow int64", op,
                     kname, pair_s(kernel), pair_s(padding), pair_s(dilation), input);
}

/* Checks a->x against a->w and the parameters; sets the sizes of a->p. */
static ct_status conv_geometry(const char *op, conv_args *a) {
    const int64_t *x = a->x, *w = a->w;
    cti_conv_params *p = &a->p;
    const char *xs = cti_shape_s(4, x), *ws = cti_shape_s(4, w);
    long long g = (long long)p->groups;
    if (w[0] < 1 || w[1] < 1 || w[2] < 1 || w[3] < 1)
        return cti_error(CT_ERR_SHAPE, "%s: weight %s must have non-zero sizes", op, ws);
    if (x[0] < 0 || x[1] < 1 || x[2] < 1 || x[3] < 1)
        return cti_error(CT_ERR_SHAPE,
                         "%s: input %s must have non-zero channels, height and width", op, xs);
    if (w[0] % p->groups != 0)
        return cti_error(CT_ERR_SHAPE,
                         "%s: weight %s has %lld output channels, not divisible by groups %lld",
                         op, ws, (long long)w[0], g);
    if (x[1] % p->groups != 0)
        return cti_error(CT_ERR_SHAPE,
                         "%s: input %s has %lld channels, not divisible by groups %lld", op, xs,
                         (long long)x[1], g);
    if (x[1] != w[1] * p->groups)
        return cti_error(CT_ERR_SHAPE,
                         "%s: expected input %s to have %lld channels (weight %s, groups %lld), "
                         "got %lld",
                         op, xs, (long long)(w[1] * p->groups), ws, g, (long long)x[1]);
    int64_t eh, ew, ph, pw;
    if (!spans(x[2], p->padding[0], p->dilation[0], w[2], &ph, &eh) ||
        !spans(x[3], p->padding[1], p->dilation[1], w[3], &pw, &ew))
        return spans_overflow(op, "weight size", w + 2, p->padding, p->dilation, xs);
    if (eh > ph || ew > pw)
        return cti_error(CT_ERR_SHAPE,
                         "%s: kernel %lldx%lld (dilated %lldx%lld) is larger than the padded "
                         "input %lldx%lld (input %s, padding %s); the output would be empty",
                         op, (long long)w[2], (long long)w[3], (long long)eh, (long long)ew,
                         (long long)ph, (long long)pw, xs, pair_s(p->padding));
    p->OH = (ph - eh) / p->stride[0] + 1;
    p->OW = (pw - ew) / p->stride[1] + 1;
    /* BLAS takes int sizes */
    int64_t plane;
    if (w[1] * w[2] * w[3] > INT_MAX || __builtin_mul_overflow(p->OH, p->OW, &plane) ||
        plane > INT_MAX || w[0] > INT_MAX)
        return cti_error(CT_ERR_OVERFLOW, "%s: input %s with weight %s is too large for BLAS",
                         op, xs, ws);
    p->N = x[0];
    p->C = x[1];
    p->H = x[2];
    p->W = x[3];
    p->Co = w[0];
    p->kh = w[2];
    p->kw = w[3];
    return CT_OK;
}

ct_tensor *ct_conv2d(ct_tensor *x, ct_tensor *w, ct_tensor *bias, const int64_t stride[2],
                     const int64_t padding[2], const int64_t dilation[2], int64_t groups) {
    const char *op = "ct_conv2d";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_CONV2D, 3, (ct_tensor *[]){x, w, bias}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_conv2d(ac.in[0], ac.in[1], ac.in[2], stride,
                                                          padding, dilation, groups)
                                              : NULL);
    ct_tensor *ts[3] = {x, w, bias};
    conv_args a;
    if (cti_check_not_null(op, 2, ts) != CT_OK || cti_check_same_device(op, 3, ts) != CT_OK ||
        conv_params(op, stride, padding, dilation, groups, &a) != CT_OK ||
        check_float(op, "input", x) != CT_OK ||
        check_same_dtype(op, "input", x, "weight", w) != CT_OK ||
        (bias && check_same_dtype(op, "input", x, "bias", bias) != CT_OK) ||
        check_image(op, "input", x) != CT_OK)
        return NULL;
    if (w->ndim != 4)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: expected a 4-d weight [out_channels, in_channels/groups, kH, "
                              "kW], got %s",
                              op, cti_desc(w));
    if (bias && (bias->ndim != 1 || bias->shape[0] != w->shape[0]))
        return cti_error_null(CT_ERR_SHAPE, "%s: expected bias of shape [%lld] (weight %s), got %s",
                              op, (long long)w->shape[0], cti_shape_s(4, w->shape),
                              cti_desc(bias));
    nchw(x, a.x);
    for (int d = 0; d < 4; d++) a.w[d] = w->shape[d];
    if (conv_geometry(op, &a) != CT_OK) return NULL;
    int64_t shape[4];
    int nd = result_shape(x->ndim, a.p.N, a.p.Co, a.p.OH, a.p.OW, shape);
    ct_tensor *y = cti_tensor_new(op, nd, shape, x->dtype, x->storage->device);
    if (!y) return NULL;
    ct_call c;
    cti_call_init(&c, CT_OP_CONV2D);
    cti_call_params(&c, &a.p);
    c.in[0] = x;
    c.in[1] = w;
    c.in[2] = bias;
    c.nin = 3;
    c.out[0] = y;
    c.nout = 1;
    if (!dispatch_one(&c, x)) return NULL;
    if (!cti_ag_needed(3, ts)) return y;
    /* x serves only the weight's gradient and w only the input's */
    cti_ag_rec r = {.name = "ConvolutionBackward", .backward = cti_bw_conv2d, .nin = 3,
                    .in = {x, w, bias}, .nout = 1, .out = {y}, .nsaved = 2,
                    .saved = {ct_requires_grad(w) ? x : NULL, ct_requires_grad(x) ? w : NULL},
                    CTI_AG_PARAMS(&a.p)};
    if (cti_ag_record(&r) != CT_OK) {
        ct_tensor_release(y);
        return NULL;
    }
    return y;
}

/* Checks grad_out against the shape the forward produced. */
static ct_status check_grad_out(const char *op, const ct_tensor *dy, int ndim,
                                const conv_args *a) {
    int64_t want[4];
    int nd = result_shape(ndim, a->p.N, a->p.Co, a->p.OH, a->p.OW, want);
    bool ok = dy->ndim == nd;
    for (int d = 0; ok && d < nd; d++) ok = dy->shape[d] == want[d];
    if (ok) return CT_OK;
    return cti_error(CT_ERR_SHAPE, "%s: expected grad_out of shape %s, got %s", op,
                     cti_shape_s(nd, want), cti_desc(dy));
}

static ct_status check_shape_arg(const char *op, const char *name, const int64_t *s) {
    if (s) return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
}

ct_tensor *ct_conv2d_backward_input(ct_tensor *grad_out, ct_tensor *w,
                                    const int64_t input_shape[4], const int64_t stride[2],
                                    const int64_t padding[2], const int64_t dilation[2],
                                    int64_t groups) {
    const char *op = "ct_conv2d_backward_input";
    ct_tensor *ts[2] = {grad_out, w};
    conv_args a;
    if (cti_check_not_null(op, 2, ts) != CT_OK || cti_check_same_device(op, 2, ts) != CT_OK ||
        check_shape_arg(op, "input_shape", input_shape) != CT_OK ||
        conv_params(op, stride, padding, dilation, groups, &a) != CT_OK ||
        check_float(op, "grad_out", grad_out) != CT_OK ||
        check_same_dtype(op, "grad_out", grad_out, "weight", w) != CT_OK ||
        check_image(op, "grad_out", grad_out) != CT_OK)
        return NULL;
    if (w->ndim != 4)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected a 4-d weight, got %s", op, cti_desc(w));
    if (grad_out->ndim == 3 && input_shape[0] != 1)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: a 3-d grad_out %s needs input_shape with N = 1, got %s", op,
                              cti_desc(grad_out), cti_shape_s(4, input_shape));
    for (int d = 0; d < 4; d++) {
        a.x[d] = input_shape[d];
        a.w[d] = w->shape[d];
    }
    if (conv_geometry(op, &a) != CT_OK || check_grad_out(op, grad_out, grad_out->ndim, &a) != CT_OK)
        return NULL;
    int64_t shape[4];
    int nd = result_shape(grad_out->ndim, a.x[0], a.x[1], a.x[2], a.x[3], shape);
    ct_tensor *dx = cti_tensor_new(op, nd, shape, w->dtype, w->storage->device);
    if (!dx) return NULL;
    ct_call c;
    cti_call_init(&c, CT_OP_CONV2D_BACKWARD_INPUT);
    cti_call_params(&c, &a.p);
    c.in[0] = grad_out;
    c.in[1] = w;
    c.nin = 2;
    c.out[0] = dx;
    c.nout = 1;
    return dispatch_one(&c, w);
}

ct_tensor *ct_conv2d_backward_weight(ct_tensor *grad_out, ct_tensor *x,
                                     const int64_t weight_shape[4], const int64_t stride[2],
                                     const int64_t padding[2], const int64_t dilation[2],
                                     int64_t groups) {
    const char *op = "ct_conv2d_backward_weight";
    ct_tensor *ts[2] = {grad_out, x};
    conv_args a;
    if (cti_check_not_null(op, 2, ts) != CT_OK || cti_check_same_device(op, 2, ts) != CT_OK ||
        check_shape_arg(op, "weight_shape", weight_shape) != CT_OK ||
        conv_params(op, stride, padding, dilation, groups, &a) != CT_OK ||
        check_float(op, "input", x) != CT_OK ||
        check_same_dtype(op, "grad_out", grad_out, "input", x) != CT_OK ||
        check_image(op, "input", x) != CT_OK)
        return NULL;
    nchw(x, a.x);
    for (int d = 0; d < 4; d++) a.w[d] = weight_shape[d];
    if (conv_geometry(op, &a) != CT_OK || check_grad_out(op, grad_out, x->ndim, &a) != CT_OK)
        return NULL;
    ct_tensor *dw = cti_tensor_new(op, 4, weight_shape, x->dtype, x->storage->device);
    if (!dw) return NULL;
    ct_call c;
    cti_call_init(&c, CT_OP_CONV2D_BACKWARD_WEIGHT);
    cti_call_params(&c, &a.p);
    c.in[0] = grad_out;
    c.in[1] = x;
    c.nin = 2;
    c.out[0] = dw;
    c.nout = 1;
    return dispatch_one(&c, x);
}

ct_tensor *ct_conv2d_backward_bias(ct_tensor *grad_out) {
    const char *op = "ct_conv2d_backward_bias";
    if (cti_check_not_null(op, 1, &grad_out) != CT_OK ||
        check_float(op, "grad_out", grad_out) != CT_OK ||
        check_image(op, "grad_out", grad_out) != CT_OK)
        return NULL;
    int64_t co = grad_out->shape[grad_out->ndim - 3];
    ct_tensor *db = cti_tensor_new(op, 1, &co, grad_out->dtype, grad_out->storage->device);
    if (!db) return NULL;
    /* An empty grad_out may still have sizes near INT64_MAX; no kernel needs
     * to walk them to learn that every channel sums nothing. */
    if (cti_numel(grad_out->ndim, grad_out->shape) == 0) {
        if (ct_zero_(db) == CT_OK) return db;
        ct_tensor_release(db);
        return NULL;
    }
    ct_call c;
    cti_call_init(&c, CT_OP_CONV2D_BACKWARD_BIAS);
    c.in[0] = grad_out;
    c.nin = 1;
    c.out[0] = db;
    c.nout = 1;
    return dispatch_one(&c, grad_out);
}

/* ---- pooling ------------------------------------------------------------------------ */

/* Sets p's input sizes from a 3-d (N = 1) or 4-d tensor. */
static void pool_input(const ct_tensor *t, cti_pool_params *p) {
    int64_t s[4];
    nchw(t, s);
    p->N = s[0];
    p->C = s[1];
    p->H = s[2];
    p->W = s[3];
}

/* PyTorch's pooling_output_shape: with ceil_mode the last window must start
 * inside the input or its left padding. */
/* The output size of one dim; spans() has checked in + 2 p and d (k - 1) + 1,
 * and the ceil-mode term is added only where it cannot overflow (a result
 * above INT64_MAX / 2 is refused by the caller's size checks anyway). */
static int64_t pool_out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d,
                             bool ceil_mode) {
    int64_t num = in + 2 * p - (d * (k - 1) + 1);
    if (ceil_mode && __builtin_add_overflow(num, s - 1, &num)) num = INT64_MAX;
    int64_t q = num / s;
    if (num % s != 0 && num < 0) q--; /* floor division */
    int64_t out = q + 1;
    if (ceil_mode && (out - 1) * s >= in + p) out--;
    return out;
}

static ct_status pool_setup(const char *op, const ct_tensor *x, const int64_t *kernel,
                            const int64_t *stride, const int64_t *padding,
                            const int64_t *dilation, bool ceil_mode, cti_pool_params *a) {
    if (check_float(op, "input", x) != CT_OK || check_image(op, "input", x) != CT_OK)
        return ct_last_status();
    if (!kernel) return cti_error(CT_ERR_INVALID_ARG, "%s: kernel is NULL", op);
    pair_or(kernel, 0, 0, a->kernel);
    pair_or(stride, kernel[0], kernel[1], a->stride);
    pair_or(padding, 0, 0, a->padding);
    pair_or(dilation, 1, 1, a->dilation);
    a->ceil_mode = ceil_mode;
    ct_status s = check_pair(op, "kernel size", a->kernel, 1);
    if (s == CT_OK) s = check_pair(op, "stride", a->stride, 1);
    if (s == CT_OK) s = check_pair(op, "padding", a->padding, 0);
    if (s == CT_OK) s = check_pair(op, "dilation", a->dilation, 1);
    if (s != CT_OK) return s;
    if (a->padding[0] > a->kernel[0] / 2 || a->padding[1] > a->kernel[1] / 2)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: padding %s must be at most half the kernel size %s", op,
                         pair_s(a->padding), pair_s(a->kernel));
    pool_input(x, a);
    if (a->C < 1 || a->H < 1 || a->W < 1)
        return cti_error(CT_ERR_SHAPE,
                         "%s: input %s must have non-zero channels, height and width", op,
                         cti_desc(x));
    int64_t padded, eff;
    if (!spans(a->H, a->padding[0], a->dilation[0], a->kernel[0], &padded, &eff) ||
        !spans(a->W, a->padding[1], a->dilation[1], a->kernel[1], &padded, &eff))
        return spans_overflow(op, "kernel", a->kernel, a->padding, a->dilation, cti_desc(x));
    a->OH = pool_out_size(a->H, a->kernel[0], a->stride[0], a->padding[0], a->dilation[0],
                          ceil_mode);
    a->OW = pool_out_size(a->W, a->kernel[1], a->stride[1], a->padding[1], a->dilation[1],
                          ceil_mode);
    if (a->OH < 1 || a->OW < 1)
        return cti_error(CT_ERR_SHAPE,
                         "%s: output size %lldx%lld is too small for input %s (kernel %s, "
                         "stride %s, padding %s, dilation %s)",
                         op, (long long)a->OH, (long long)a->OW, cti_desc(x), pair_s(a->kernel),
                         pair_s(a->stride), pair_s(a->padding), pair_s(a->dilation));
    return CT_OK;
}

static void pool_call(ct_call *c, ct_op op, const cti_pool_params *p) {
    cti_call_init(c, op);
    cti_call_params(c, p);
}

/* Records a finished pooling forward c (one input; output 0 differentiable)
 * with its params p and the tensor its formula keeps, if any. Returns
 * output 0, or NULL (outputs released) when recording failed. */
static ct_tensor *record_pool(ct_call *c, const cti_pool_params *p, const char *name,
                              cti_backward_fn bw, ct_tensor *saved) {
    if (!cti_ag_needed(1, c->in)) return c->out[0];
    cti_ag_rec r = {.name = name, .backward = bw, .nin = 1, .in = {c->in[0]}, .nout = 1,
                    .out = {c->out[0]}, .nsaved = saved ? 1 : 0, .saved = {saved},
                    CTI_AG_PARAMS(p)};
    if (cti_ag_record(&r) != CT_OK) {
        cti_call_release_outputs(c);
        return NULL;
    }
    return c->out[0];
}

/* The max pools' common end, their geometry in a: the values and the
 * argmax indices (int64, into *indices when asked), recorded for autograd
 * under node; the kernel computes the indices either way and the backward
 * keeps them. */
static ct_tensor *max_pool_run(const char *op, ct_op id, const char *node, ct_tensor *x,
                               const cti_pool_params *a, ct_tensor **indices) {
    int64_t shape[4];
    int nd = result_shape(x->ndim, a->N, a->C, a->OH, a->OW, shape);
    ct_call c;
    pool_call(&c, id, a);
    c.in[0] = x;
    c.nin = 1;
    c.out[0] = cti_tensor_new(op, nd, shape, x->dtype, x->storage->device);
    c.out[1] = c.out[0] ? cti_tensor_new(op, nd, shape, CT_I64, x->storage->device) : NULL;
    c.nout = 2;
    if (!c.out[1]) {
        cti_call_release_outputs(&c);
        return NULL;
    }
    if (!dispatch_one(&c, x)) return NULL;
    if (!record_pool(&c, a, node, cti_bw_max_pool2d, c.out[1])) return NULL;
    if (indices) *indices = c.out[1];
    else ct_tensor_release(c.out[1]);
    return c.out[0];
}

ct_tensor *ct_max_pool2d(ct_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                         const int64_t padding[2], const int64_t dilation[2], bool ceil_mode,
                         ct_tensor **indices) {
    const char *op = "ct_max_pool2d";
    cti_pool_params a = {0};
    if (cti_check_not_null(op, 1, &x) != CT_OK ||
        pool_setup(op, x, kernel, stride, padding, dilation, ceil_mode, &a) != CT_OK)
        return NULL;
    return max_pool_run(op, CT_OP_MAX_POOL2D, "MaxPool2DWithIndicesBackward", x, &a, indices);
}

ct_tensor *ct_max_pool2d_backward(ct_tensor *grad_out, ct_tensor *x, ct_tensor *indices) {
    const char *op = "ct_max_pool2d_backward";
    ct_tensor *ts[3] = {grad_out, x, indices};
    if (cti_check_not_null(op, 3, ts) != CT_OK || cti_check_same_device(op, 3, ts) != CT_OK ||
        check_float(op, "input", x) != CT_OK ||
        check_same_dtype(op, "grad_out", grad_out, "input", x) != CT_OK ||
        check_image(op, "input", x) != CT_OK)
        return NULL;
    if (indices->dtype != CT_I64)
        return cti_error_null(CT_ERR_DTYPE, "%s: expected int64 indices, got %s", op,
                              cti_desc(indices));
    bool ok = grad_out->ndim == x->ndim && indices->ndim == x->ndim;
    for (int d = 0; ok && d < x->ndim; d++) ok = grad_out->shape[d] == indices->shape[d];
    for (int d = 0; ok && d < x->ndim - 2; d++) ok = grad_out->shape[d] == x->shape[d];
    if (!ok)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: grad_out %s and indices %s must have one shape, with the "
                              "leading (N, C) dims of input %s",
                              op, cti_desc(grad_out), cti_desc(indices), cti_desc(x));
    /* the indices carry the windows: only the sizes */
    cti_pool_params a = {0};
    pool_input(x, &a);
    a.OH = grad_out->shape[x->ndim - 2];
    a.OW = grad_out->shape[x->ndim - 1];
    ct_call c;
    pool_call(&c, CT_OP_MAX_POOL2D_BACKWARD, &a);
    c.in[0] = grad_out;
    c.in[1] = x;
    c.in[2] = indices;
    c.nin = 3;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, x->storage->device);
    c.nout = 1;
    if (!c.out[0]) return NULL;
    return dispatch_one(&c, x);
}

ct_tensor *ct_avg_pool2d(ct_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                         const int64_t padding[2], bool ceil_mode, bool count_include_pad) {
    const char *op = "ct_avg_pool2d";
    cti_pool_params a = {0};
    if (cti_check_not_null(op, 1, &x) != CT_OK ||
        pool_setup(op, x, kernel, stride, padding, NULL, ceil_mode, &a) != CT_OK)
        return NULL;
    a.count_include_pad = count_include_pad;
    int64_t shape[4];
    int nd = result_shape(x->ndim, a.N, a.C, a.OH, a.OW, shape);
    ct_call c;
    pool_call(&c, CT_OP_AVG_POOL2D, &a);
    c.in[0] = x;
    c.nin = 1;
    c.out[0] = cti_tensor_new(op, nd, shape, x->dtype, x->storage->device);
    c.nout = 1;
    if (!c.out[0] || !dispatch_one(&c, x)) return NULL;
    return record_pool(&c, &a, "AvgPool2DBackward", cti_bw_avg_pool2d, NULL);
}

/* grad_out must have ndim of x, x's N and C, and the given spatial size. */
static ct_status check_pool_grad(const char *op, const ct_tensor *dy, const ct_tensor *x,
                                 int64_t oh, int64_t ow) {
    int64_t want[4];
    int64_t s[4];
    nchw(x, s);
    int nd = result_shape(x->ndim, s[0], s[1], oh, ow, want);
    bool ok = dy->ndim == nd;
    for (int d = 0; ok && d < nd; d++) ok = dy->shape[d] == want[d];
    if (ok) return CT_OK;
    return cti_error(CT_ERR_SHAPE, "%s: expected grad_out of shape %s for input %s, got %s", op,
                     cti_shape_s(nd, want), cti_desc(x), cti_desc(dy));
}

ct_tensor *ct_avg_pool2d_backward(ct_tensor *grad_out, ct_tensor *x, const int64_t kernel[2],
                                  const int64_t stride[2], const int64_t padding[2],
                                  bool ceil_mode, bool count_include_pad) {
    const char *op = "ct_avg_pool2d_backward";
    ct_tensor *ts[2] = {grad_out, x};
    cti_pool_params a = {0};
    if (cti_check_not_null(op, 2, ts) != CT_OK || cti_check_same_device(op, 2, ts) != CT_OK ||
        pool_setup(op, x, kernel, stride, padding, NULL, ceil_mode, &a) != CT_OK ||
        check_same_dtype(op, "grad_out", grad_out, "input", x) != CT_OK ||
        check_pool_grad(op, grad_out, x, a.OH, a.OW) != CT_OK)
        return NULL;
    a.count_include_pad = count_include_pad;
    ct_call c;
    pool_call(&c, CT_OP_AVG_POOL2D_BACKWARD, &a);
    c.in[0] = grad_out;
    c.in[1] = x;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, x->storage->device);
    c.nout = 1;
    if (!c.out[0]) return NULL;
    return dispatch_one(&c, x);
}

ct_tensor *ct_adaptive_avg_pool2d(ct_tensor *x, int64_t out_h, int64_t out_w) {
    const char *op = "ct_adaptive_avg_pool2d";
    if (cti_check_not_null(op, 1, &x) != CT_OK || check_float(op, "input", x) != CT_OK ||
        check_image(op, "input", x) != CT_OK)
        return NULL;
    cti_pool_params a = {0};
    pool_input(x, &a);
    if (a.C < 1 || a.H < 1 || a.W < 1)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: input %s must have non-zero channels, height and width", op,
                              cti_desc(x));
    if (out_h < 1 || out_w < 1)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: output size must be positive, got %lldx%lld",
                              op, (long long)out_h, (long long)out_w);
    a.OH = out_h;
    a.OW = out_w;
    int64_t shape[4];
    int nd = result_shape(x->ndim, a.N, a.C, a.OH, a.OW, shape);
    ct_call c;
    pool_call(&c, CT_OP_ADAPTIVE_AVG_POOL2D, &a);
    c.in[0] = x;
    c.nin = 1;
    c.out[0] = cti_tensor_new(op, nd, shape, x->dtype, x->storage->device);
    c.nout = 1;
    if (!c.out[0] || !dispatch_one(&c, x)) return NULL;
    return record_pool(&c, &a, "AdaptiveAvgPool2DBackward", cti_bw_adaptive_avg_pool2d,
                       NULL);
}

ct_tensor *ct_adaptive_avg_pool2d_backward(ct_tensor *grad_out, ct_tensor *x) {
    const char *op = "ct_adaptive_avg_pool2d_backward";
    ct_tensor *ts[2] = {grad_out, x};
    if (cti_check_not_null(op, 2, ts) != CT_OK || cti_check_same_device(op, 2, ts) != CT_OK ||
        check_float(op, "input", x) != CT_OK || check_image(op, "input", x) != CT_OK ||
        check_same_dtype(op, "grad_out", grad_out, "input", x) != CT_OK)
        return NULL;
    if (grad_out->ndim != x->ndim || grad_out->shape[x->ndim - 2] < 1 ||
        grad_out->shape[x->ndim - 1] < 1)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: expected a grad_out with the input's ndim and a non-empty "
                              "output size, got grad_out %s for input %s",
                              op, cti_desc(grad_out), cti_desc(x));
    cti_pool_params a = {0};
    pool_input(x, &a);
    a.OH = grad_out->shape[x->ndim - 2];
    a.OW = grad_out->shape[x->ndim - 1];
    if (check_pool_grad(op, grad_out, x, a.OH, a.OW) != CT_OK) return NULL;
    ct_call c;
    pool_call(&c, CT_OP_ADAPTIVE_AVG_POOL2D_BACKWARD, &a);
    c.in[0] = grad_out;
    c.in[1] = x;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, x->storage->device);
    c.nout = 1;
    if (!c.out[0]) return NULL;
    return dispatch_one(&c, x);
}

/* ---- adaptive max pooling ------------------------------------------------------------- */

ct_tensor *ct_adaptive_max_pool2d(ct_tensor *x, int64_t out_h, int64_t out_w,
                                  ct_tensor **indices) {
    const char *op = "ct_adaptive_max_pool2d";
    if (cti_check_not_null(op, 1, &x) != CT_OK || check_float(op, "input", x) != CT_OK ||
        check_image(op, "input", x) != CT_OK)
        return NULL;
    cti_pool_params a = {0};
    pool_input(x, &a);
    if (a.C < 1 || a.H < 1 || a.W < 1)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: input %s must have non-zero channels, height and width", op,
                              cti_desc(x));
    if (out_h < 1 || out_w < 1)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: output size must be positive, got %lldx%lld", op,
                              (long long)out_h, (long long)out_w);
    a.OH = out_h;
    a.OW = out_w;
    return max_pool_run(op, CT_OP_ADAPTIVE_MAX_POOL2D, "AdaptiveMaxPool2DBackward", x, &a,
                        indices);
}
