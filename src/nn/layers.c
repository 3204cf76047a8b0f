/* Layers holding parameters, initialised as torch.nn's reset_parameters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "nn_impl.h"

static ct_status check_dtype(const char *op, ct_dtype dtype) {
    if ((unsigned)dtype >= CT_NUM_DTYPES || !ct_dtype_is_floating(dtype))
        return cti_error(CT_ERR_DTYPE, "%s: parameters need a floating dtype, got %s", op,
                         ct_dtype_name(dtype));
    return CT_OK;
}

/* init kinds for new_param */
enum { INIT_UNIFORM, INIT_NORMAL, INIT_FILL };

/* A parameter owned by the layer (taken out of any open scope), filled
 * with U(-a, a), N(0, a) or the value a, then marked as requiring grad. */
static ct_tensor *new_param(const char *op, int ndim, const int64_t *shape, ct_dtype dtype,
                            ct_device device, int init, double a, ct_generator *gen) {
    ct_tensor *t = ct_tensor_empty(ndim, shape, dtype, device);
    if (!t) return cti_error_null(ct_last_status(), "%s: %s", op, ct_last_error());
    cti_scope_forget(t);
    ct_status st;
    if (init == INIT_UNIFORM) st = ct_uniform_(t, -a, a, gen);
    else if (init == INIT_NORMAL) st = ct_normal_(t, 0.0, a, gen);
    else st = ct_fill_(t, a);
    if (st == CT_OK) st = ct_requires_grad_(t, true);
    if (st != CT_OK) {
        cti_error(st, "%s: %s", op, ct_last_error());
        ct_tensor_release(t);
        return NULL;
    }
    return t;
}

/* A weight of shape (ndim, shape) and, with bias, a bias of nbias elements,
 * both U(-bound, bound) drawn from gen in that order (the linear and
 * convolution layers' initialisation); false with the error set. */
static bool weight_and_bias(const char *op, int ndim, const int64_t *shape, int64_t nbias,
                            bool bias, double bound, ct_dtype dtype, ct_device device,
                            ct_generator *gen, ct_tensor **weight, ct_tensor **b) {
    *weight = new_param(op, ndim, shape, dtype, device, INIT_UNIFORM, bound, gen);
    if (*weight && bias)
        *b = new_param(op, CT_SHAPE(nbias), dtype, device, INIT_UNIFORM, bound, gen);
    return *weight && (!bias || *b);
}

/* Appends prefix.suffix (or suffix alone) when t is not NULL. */
static ct_status add_named(const char *op, ct_params *p, const char *prefix, const char *suffix,
                           ct_tensor *t) {
    if (!t) return CT_OK;
    if (!prefix || !*prefix) return ct_params_add(p, suffix, t);
    size_t n = strlen(prefix) + strlen(suffix) + 2;
    char *name = malloc(n);
    if (!name) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    snprintf(name, n, "%s.%s", prefix, suffix);
    ct_status st = ct_params_add(p, name, t);
    free(name);
    return st;
}

/* Appends weight and bias; on failure the list is left as it was. */
static ct_status add_pair(const char *op, ct_params *p, const char *prefix, ct_tensor *w,
                          ct_tensor *b) {
    if (!p) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter list is NULL", op);
    int64_t n0 = p->n;
    ct_status st = add_named(op, p, prefix, "weight", w);
    if (st == CT_OK) st = add_named(op, p, prefix, "bias", b);
    while (st != CT_OK && p->n > n0) cti_params_pop(p);
    return st;
}

/* ---- Linear --------------------------------------------------------------------------------- */
ct_nn_linear *ct_nn_linear_new(int64_t in_features, int64_t out_features, bool bias,
                               ct_dtype dtype, ct_device device, ct_generator *gen) {
    static const char op[] = "ct_nn_linear_new";
    if (in_features <= 0 || out_features <= 0)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: in_features and out_features must be positive, got %lld and "
                              "%lld",
                              op, (long long)in_features, (long long)out_features);
    if (check_dtype(op, dtype) != CT_OK) return NULL;
    ct_nn_linear *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    m->in_features = in_features;
    m->out_features = out_features;
    /* kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound
     * gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in); the bias uses the same. */
    double bound = 1.0 / sqrt((double)in_features);
    if (!weight_and_bias(op, CT_SHAPE(out_features, in_features), out_features, bias, bound,
                         dtype, device, gen, &m->weight, &m->bias)) {
        ct_nn_linear_free(m);
        return NULL;
    }
    return m;
}

ct_tensor *ct_nn_linear_forward(ct_nn_linear *m, ct_tensor *x) {
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "ct_nn_linear_forward: layer is NULL");
    return ct_linear(x, m->weight, m->bias);
}

ct_status ct_nn_linear_params(ct_nn_linear *m, const char *prefix, ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_linear_params: layer is NULL");
    return add_pair("ct_nn_linear_params", p, prefix, m->weight, m->bias);
}

void ct_nn_linear_free(ct_nn_linear *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    ct_tensor_release(m->bias);
    free(m);
}

/* ---- Conv2d --------------------------------------------------------------------------------- */
ct_nn_conv2d *ct_nn_conv2d_new(int64_t in_channels, int64_t out_channels,
                               const int64_t kernel[2], const int64_t stride[2],
                               const int64_t padding[2], const int64_t dilation[2],
                               int64_t groups, bool bias, ct_dtype dtype, ct_device device,
                               ct_generator *gen) {
    static const char op[] = "ct_nn_conv2d_new";
    if (!kernel) return cti_error_null(CT_ERR_INVALID_ARG, "%s: kernel is NULL", op);
    if (in_channels <= 0 || out_channels <= 0)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: in_channels and out_channels must be positive, got %lld and "
                              "%lld",
                              op, (long long)in_channels, (long long)out_channels);
    if (groups <= 0 || in_channels % groups || out_channels % groups)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: groups (%lld) must be positive and divide in_channels (%lld) "
                              "and out_channels (%lld)",
                              op, (long long)groups, (long long)in_channels,
                              (long long)out_channels);
    int64_t st[2] = {1, 1}, pad[2] = {0, 0}, dil[2] = {1, 1};
    for (int d = 0; d < 2; d++) {
        if (stride) st[d] = stride[d];
        if (padding) pad[d] = padding[d];
        if (dilation) dil[d] = dilation[d];
        if (kernel[d] <= 0 || st[d] <= 0 || dil[d] <= 0 || pad[d] < 0)
            return cti_error_null(CT_ERR_INVALID_ARG,
                                  "%s: expected kernel, stride, dilation > 0 and padding >= 0, "
                                  "got kernel [%lld, %lld], stride [%lld, %lld], padding [%lld, "
                                  "%lld], dilation [%lld, %lld]",
                                  op, (long long)kernel[0], (long long)kernel[1],
                                  (long long)(stride ? stride[0] : 1),
                                  (long long)(stride ? stride[1] : 1),
                                  (long long)(padding ? padding[0] : 0),
                                  (long long)(padding ? padding[1] : 0),
                                  (long long)(dilation ? dilation[0] : 1),
                                  (long long)(dilation ? dilation[1] : 1));
    }
    if (check_dtype(op, dtype) != CT_OK) return NULL;
    ct_nn_conv2d *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    m->in_channels = in_channels;
    m->out_channels = out_channels;
    m->groups = groups;
    for (int d = 0; d < 2; d++) {
        m->kernel[d] = kernel[d];
        m->stride[d] = st[d];
        m->padding[d] = pad[d];
        m->dilation[d] = dil[d];
    }
    int64_t fan_in = in_channels / groups * kernel[0] * kernel[1];
    double bound = 1.0 / sqrt((double)fan_in);
    if (!weight_and_bias(op, CT_SHAPE(out_channels, in_channels / groups, kernel[0], kernel[1]),
                         out_channels, bias, bound, dtype, device, gen, &m->weight, &m->bias)) {
        ct_nn_conv2d_free(m);
        return NULL;
    }
    return m;
}

ct_tensor *ct_nn_conv2d_forward(ct_nn_conv2d *m, ct_tensor *x) {
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "ct_nn_conv2d_forward: layer is NULL");
    return ct_conv2d(x, m->weight, m->bias, m->stride, m->padding, m->dilation, m->groups);
}

ct_status ct_nn_conv2d_params(ct_nn_conv2d *m, const char *prefix, ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_conv2d_params: layer is NULL");
    return add_pair("ct_nn_conv2d_params", p, prefix, m->weight, m->bias);
}

void ct_nn_conv2d_free(ct_nn_conv2d *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    ct_tensor_release(m->bias);
    free(m);
}

/* ---- Embedding ------------------------------------------------------------------------------ */
ct_nn_embedding *ct_nn_embedding_new(int64_t num_embeddings, int64_t embedding_dim,
                                     ct_dtype dtype, ct_device device, ct_generator *gen) {
    static const char op[] = "ct_nn_embedding_new";
    if (num_embeddings <= 0 || embedding_dim <= 0)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: num_embeddings and embedding_dim must be positive, got %lld "
                              "and %lld",
                              op, (long long)num_embeddings, (long long)embedding_dim);
    if (check_dtype(op, dtype) != CT_OK) return NULL;
    ct_nn_embedding *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    m->num_embeddings = num_embeddings;
    m->embedding_dim = embedding_dim;
    m->weight = new_param(op, CT_SHAPE(num_embeddings, embedding_dim), dtype, device,
                          INIT_NORMAL, 1.0, gen);
    if (!m->weight) {
        free(m);
        return NULL;
    }
    return m;
}

ct_tensor *ct_nn_embedding_forward(ct_nn_embedding *m, ct_tensor *indices) {
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "ct_nn_embedding_forward: layer is NULL");
    return ct_embedding(m->weight, indices);
}

ct_status ct_nn_embedding_params(ct_nn_embedding *m, const char *prefix, ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_embedding_params: layer is NULL");
    return add_pair("ct_nn_embedding_params", p, prefix, m->weight, NULL);
}

void ct_nn_embedding_free(ct_nn_embedding *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    free(m);
}

/* ---- RMSNorm and LayerNorm ------------------------------------------------------------------ */
static ct_status check_norm(const char *op, int nnorm, const int64_t *shape, double eps,
                            ct_dtype dtype) {
    if (nnorm < 1 || nnorm > CT_MAX_DIMS || !shape)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: normalized_shape needs 1 to %d dims, got %d%s", op, CT_MAX_DIMS,
                         nnorm, shape ? "" : " (NULL)");
    for (int d = 0; d < nnorm; d++)
        if (shape[d] <= 0)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: normalized_shape %s must have positive sizes", op,
                             cti_shape_s(nnorm, shape));
    if (!(eps >= 0) || !isfinite(eps))
        return cti_error(CT_ERR_INVALID_ARG, "%s: eps must be finite and >= 0, got %g", op, eps);
    return check_dtype(op, dtype);
}

ct_nn_rms_norm *ct_nn_rms_norm_new(int nnorm, const int64_t *normalized_shape, double eps,
                                   bool elementwise_affine, ct_dtype dtype, ct_device device) {
    static const char op[] = "ct_nn_rms_norm_new";
    if (check_norm(op, nnorm, normalized_shape, eps, dtype) != CT_OK) return NULL;
    ct_nn_rms_norm *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    m->nnorm = nnorm;
    memcpy(m->normalized_shape, normalized_shape, (size_t)nnorm * sizeof *normalized_shape);
    m->eps = eps;
    if (elementwise_affine &&
        !(m->weight = new_param(op, nnorm, normalized_shape, dtype, device, INIT_FILL, 1.0,
                                NULL))) {
        free(m);
        return NULL;
    }
    return m;
}

ct_tensor *ct_nn_rms_norm_forward(ct_nn_rms_norm *m, ct_tensor *x) {
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "ct_nn_rms_norm_forward: layer is NULL");
    return ct_rms_norm(x, m->nnorm, m->normalized_shape, m->weight, m->eps, NULL);
}

ct_status ct_nn_rms_norm_params(ct_nn_rms_norm *m, const char *prefix, ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_rms_norm_params: layer is NULL");
    return add_pair("ct_nn_rms_norm_params", p, prefix, m->weight, NULL);
}

void ct_nn_rms_norm_free(ct_nn_rms_norm *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    free(m);
}

ct_nn_layer_norm *ct_nn_layer_norm_new(int nnorm, const int64_t *normalized_shape, double eps,
                                       bool elementwise_affine, bool bias, ct_dtype dtype,
                                       ct_device device) {
    static const char op[] = "ct_nn_layer_norm_new";
    if (check_norm(op, nnorm, normalized_shape, eps, dtype) != CT_OK) return NULL;
    ct_nn_layer_norm *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    m->nnorm = nnorm;
    memcpy(m->normalized_shape, normalized_shape, (size_t)nnorm * sizeof *normalized_shape);
    m->eps = eps;
    if (elementwise_affine) {
        m->weight = new_param(op, nnorm, normalized_shape, dtype, device, INIT_FILL, 1.0, NULL);
        if (m->weight && bias)
            m->bias = new_param(op, nnorm, normalized_shape, dtype, device, INIT_FILL, 0.0, NULL);
        if (!m->weight || (bias && !m->bias)) {
            ct_nn_layer_norm_free(m);
            return NULL;
        }
    }
    return m;
}

ct_tensor *ct_nn_layer_norm_forward(ct_nn_layer_norm *m, ct_tensor *x) {
    if (!m)
        return cti_error_null(CT_ERR_INVALID_ARG, "ct_nn_layer_norm_forward: layer is NULL");
    return ct_layer_norm(x, m->nnorm, m->normalized_shape, m->weight, m->bias, m->eps, NULL,
                         NULL);
}

ct_status ct_nn_layer_norm_params(ct_nn_layer_norm *m, const char *prefix, ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_layer_norm_params: layer is NULL");
    return add_pair("ct_nn_layer_norm_params", p, prefix, m->weight, m->bias);
}

void ct_nn_layer_norm_free(ct_nn_layer_norm *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    ct_tensor_release(m->bias);
    free(m);
}

/* ---- norms with running statistics, conv1d, conv_transpose2d ------------------------------ */

/* A buffer owned by the layer: a tensor filled with value, no gradient. */
static ct_tensor *new_buffer(const char *op, int64_t n, ct_dtype dtype, ct_device device,
                             double value) {
    ct_tensor *t = ct_tensor_empty(CT_SHAPE(n), dtype, device);
    if (!t) return cti_error_null(ct_last_status(), "%s: %s", op, ct_last_error());
    cti_scope_forget(t);
    if (ct_fill_(t, value) != CT_OK) {
        cti_error(ct_last_status(), "%s: %s", op, ct_last_error());
        ct_tensor_release(t);
        return NULL;
    }
    return t;
}

/* The running statistics' dtype: float32 for the half types (as cuDNN's). */
static ct_dtype stats_dtype(ct_dtype dt) {
    return dt == CT_F16 || dt == CT_BF16 ? CT_F32 : dt;
}

static ct_status check_features(const char *op, int64_t n) {
    if (n > 0) return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG, "%s: num_features must be positive, got %lld", op,
                     (long long)n);
}

/* The optional affine pair and running statistics of a norm layer. */
static bool norm_tensors(const char *op, int64_t c, bool affine, bool track, ct_dtype dtype,
                         ct_device device, ct_tensor **w, ct_tensor **b, ct_tensor **rm,
                         ct_tensor **rv) {
    if (affine) {
        *w = new_param(op, CT_SHAPE(c), dtype, device, INIT_FILL, 1.0, NULL);
        *b = *w ? new_param(op, CT_SHAPE(c), dtype, device, INIT_FILL, 0.0, NULL) : NULL;
        if (!*b) return false;
    }
    if (track && rm) {
        *rm = new_buffer(op, c, stats_dtype(dtype), device, 0.0);
        *rv = *rm ? new_buffer(op, c, stats_dtype(dtype), device, 1.0) : NULL;
        if (!*rv) return false;
    }
    return true;
}

static ct_status add_buffers(const char *op, ct_params *p, const char *prefix, ct_tensor *rm,
                             ct_tensor *rv) {
    if (!p) return cti_error(CT_ERR_INVALID_ARG, "%s: list is NULL", op);
    int64_t n0 = p->n;
    ct_status st = add_named(op, p, prefix, "running_mean", rm);
    if (st == CT_OK) st = add_named(op, p, prefix, "running_var", rv);
    while (st != CT_OK && p->n > n0) cti_params_pop(p);
    return st;
}

ct_nn_batch_norm2d *ct_nn_batch_norm2d_new(int64_t num_features, double eps, double momentum,
                                           bool affine, bool track_running_stats,
                                           ct_dtype dtype, ct_device device) {
    static const char op[] = "ct_nn_batch_norm2d_new";
    if (check_features(op, num_features) != CT_OK || check_dtype(op, dtype) != CT_OK)
        return NULL;
    ct_nn_batch_norm2d *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    *m = (ct_nn_batch_norm2d){.num_features = num_features, .eps = eps, .momentum = momentum,
                              .training = true};
    if (!norm_tensors(op, num_features, affine, track_running_stats, dtype, device, &m->weight,
                      &m->bias, &m->running_mean, &m->running_var)) {
        ct_nn_batch_norm2d_free(m);
        return NULL;
    }
    return m;
}

static ct_status check_4d(const char *op, const ct_tensor *x, int64_t c) {
    if (!x) return cti_error(CT_ERR_INVALID_ARG, "%s: input is NULL", op);
    int nd = ct_tensor_ndim(x);
    const int64_t *s = ct_tensor_shape(x);
    if (nd == 4 && s[1] == c) return CT_OK;
    return cti_error(CT_ERR_SHAPE, "%s: expected a 4-d input [N, %lld, H, W], got %s", op,
                     (long long)c, cti_desc(x));
}

ct_tensor *ct_nn_batch_norm2d_forward(ct_nn_batch_norm2d *m, ct_tensor *x) {
    static const char op[] = "ct_nn_batch_norm2d_forward";
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "%s: layer is NULL", op);
    if (check_4d(op, x, m->num_features) != CT_OK) return NULL;
    /* without running statistics, eval normalizes with the batch's (as torch) */
    bool batch_stats = m->training || !m->running_mean;
    return ct_batch_norm(x, batch_stats && !m->training ? NULL : m->running_mean,
                         batch_stats && !m->training ? NULL : m->running_var, m->weight, m->bias,
                         batch_stats, m->momentum, m->eps);
}

ct_status ct_nn_batch_norm2d_params(ct_nn_batch_norm2d *m, const char *prefix, ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_batch_norm2d_params: layer is NULL");
    return add_pair("ct_nn_batch_norm2d_params", p, prefix, m->weight, m->bias);
}

ct_status ct_nn_batch_norm2d_buffers(ct_nn_batch_norm2d *m, const char *prefix, ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_batch_norm2d_buffers: layer is NULL");
    return add_buffers("ct_nn_batch_norm2d_buffers", p, prefix, m->running_mean,
                       m->running_var);
}

void ct_nn_batch_norm2d_free(ct_nn_batch_norm2d *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    ct_tensor_release(m->bias);
    ct_tensor_release(m->running_mean);
    ct_tensor_release(m->running_var);
    free(m);
}

ct_nn_group_norm *ct_nn_group_norm_new(int64_t num_groups, int64_t num_channels, double eps,
                                       bool affine, ct_dtype dtype, ct_device device) {
    static const char op[] = "ct_nn_group_norm_new";
    if (num_groups <= 0 || num_channels <= 0 || num_channels % num_groups)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: num_channels (%lld) must be divisible by num_groups (%lld), "
                              "both positive",
                              op, (long long)num_channels, (long long)num_groups);
    if (check_dtype(op, dtype) != CT_OK) return NULL;
    ct_nn_group_norm *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    *m = (ct_nn_group_norm){.num_groups = num_groups, .num_channels = num_channels, .eps = eps};
    if (!norm_tensors(op, num_channels, affine, false, dtype, device, &m->weight, &m->bias, NULL,
                      NULL)) {
        ct_nn_group_norm_free(m);
        return NULL;
    }
    return m;
}

ct_tensor *ct_nn_group_norm_forward(ct_nn_group_norm *m, ct_tensor *x) {
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "ct_nn_group_norm_forward: layer is NULL");
    return ct_group_norm(x, m->num_groups, m->weight, m->bias, m->eps);
}

ct_status ct_nn_group_norm_params(ct_nn_group_norm *m, const char *prefix, ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_group_norm_params: layer is NULL");
    return add_pair("ct_nn_group_norm_params", p, prefix, m->weight, m->bias);
}

void ct_nn_group_norm_free(ct_nn_group_norm *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    ct_tensor_release(m->bias);
    free(m);
}

ct_nn_instance_norm2d *ct_nn_instance_norm2d_new(int64_t num_features, double eps,
                                                 double momentum, bool affine,
                                                 bool track_running_stats, ct_dtype dtype,
                                                 ct_device device) {
    static const char op[] = "ct_nn_instance_norm2d_new";
    if (check_features(op, num_features) != CT_OK || check_dtype(op, dtype) != CT_OK)
        return NULL;
    ct_nn_instance_norm2d *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    *m = (ct_nn_instance_norm2d){.num_features = num_features, .eps = eps,
                                 .momentum = momentum, .training = true};
    if (!norm_tensors(op, num_features, affine, track_running_stats, dtype, device, &m->weight,
                      &m->bias, &m->running_mean, &m->running_var)) {
        ct_nn_instance_norm2d_free(m);
        return NULL;
    }
    return m;
}

ct_tensor *ct_nn_instance_norm2d_forward(ct_nn_instance_norm2d *m, ct_tensor *x) {
    static const char op[] = "ct_nn_instance_norm2d_forward";
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "%s: layer is NULL", op);
    if (check_4d(op, x, m->num_features) != CT_OK) return NULL;
    bool input_stats = m->training || !m->running_mean;
    return ct_instance_norm(x, m->running_mean, m->running_var, m->weight, m->bias, input_stats,
                            m->momentum, m->eps);
}

ct_status ct_nn_instance_norm2d_params(ct_nn_instance_norm2d *m, const char *prefix,
                                       ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_instance_norm2d_params: layer is NULL");
    return add_pair("ct_nn_instance_norm2d_params", p, prefix, m->weight, m->bias);
}

ct_status ct_nn_instance_norm2d_buffers(ct_nn_instance_norm2d *m, const char *prefix,
                                        ct_params *p) {
    if (!m)
        return cti_error(CT_ERR_INVALID_ARG, "ct_nn_instance_norm2d_buffers: layer is NULL");
    return add_buffers("ct_nn_instance_norm2d_buffers", p, prefix, m->running_mean,
                       m->running_var);
}

void ct_nn_instance_norm2d_free(ct_nn_instance_norm2d *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    ct_tensor_release(m->bias);
    ct_tensor_release(m->running_mean);
    ct_tensor_release(m->running_var);
    free(m);
}

static ct_status check_conv_sizes(const char *op, int64_t in, int64_t out, int64_t groups) {
    if (in <= 0 || out <= 0 || groups <= 0 || in % groups || out % groups)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: in_channels (%lld) and out_channels (%lld) must be positive and "
                         "divisible by groups (%lld)",
                         op, (long long)in, (long long)out, (long long)groups);
    return CT_OK;
}

ct_nn_conv1d *ct_nn_conv1d_new(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                               int64_t stride, int64_t padding, int64_t dilation, int64_t groups,
                               bool bias, ct_dtype dtype, ct_device device, ct_generator *gen) {
    static const char op[] = "ct_nn_conv1d_new";
    if (check_conv_sizes(op, in_channels, out_channels, groups) != CT_OK ||
        check_dtype(op, dtype) != CT_OK)
        return NULL;
    if (kernel_size <= 0 || stride <= 0 || dilation <= 0 || padding < 0)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: expected kernel_size, stride, dilation > 0 and padding >= 0, "
                              "got %lld, %lld, %lld and %lld",
                              op, (long long)kernel_size, (long long)stride, (long long)dilation,
                              (long long)padding);
    ct_nn_conv1d *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    *m = (ct_nn_conv1d){.in_channels = in_channels, .out_channels = out_channels,
                        .kernel_size = kernel_size, .stride = stride, .padding = padding,
                        .dilation = dilation, .groups = groups};
    double bound = 1.0 / sqrt((double)(in_channels / groups * kernel_size));
    if (!weight_and_bias(op, CT_SHAPE(out_channels, in_channels / groups, kernel_size),
                         out_channels, bias, bound, dtype, device, gen, &m->weight, &m->bias)) {
        ct_nn_conv1d_free(m);
        return NULL;
    }
    return m;
}

ct_tensor *ct_nn_conv1d_forward(ct_nn_conv1d *m, ct_tensor *x) {
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "ct_nn_conv1d_forward: layer is NULL");
    return ct_conv1d(x, m->weight, m->bias, m->stride, m->padding, m->dilation, m->groups);
}

ct_status ct_nn_conv1d_params(ct_nn_conv1d *m, const char *prefix, ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_conv1d_params: layer is NULL");
    return add_pair("ct_nn_conv1d_params", p, prefix, m->weight, m->bias);
}

void ct_nn_conv1d_free(ct_nn_conv1d *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    ct_tensor_release(m->bias);
    free(m);
}

ct_nn_conv_transpose2d *ct_nn_conv_transpose2d_new(
    int64_t in_channels, int64_t out_channels, const int64_t kernel[2], const int64_t stride[2],
    const int64_t padding[2], const int64_t output_padding[2], int64_t groups, bool bias,
    const int64_t dilation[2], ct_dtype dtype, ct_device device, ct_generator *gen) {
    static const char op[] = "ct_nn_conv_transpose2d_new";
    if (!kernel) return cti_error_null(CT_ERR_INVALID_ARG, "%s: kernel is NULL", op);
    if (check_conv_sizes(op, in_channels, out_channels, groups) != CT_OK ||
        check_dtype(op, dtype) != CT_OK)
        return NULL;
    ct_nn_conv_transpose2d *m = calloc(1, sizeof *m);
    if (!m) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    *m = (ct_nn_conv_transpose2d){.in_channels = in_channels, .out_channels = out_channels,
                                  .groups = groups};
    for (int d = 0; d < 2; d++) {
        m->kernel[d] = kernel[d];
        m->stride[d] = stride ? stride[d] : 1;
        m->padding[d] = padding ? padding[d] : 0;
        m->output_padding[d] = output_padding ? output_padding[d] : 0;
        m->dilation[d] = dilation ? dilation[d] : 1;
        if (m->kernel[d] <= 0 || m->stride[d] <= 0 || m->dilation[d] <= 0 ||
            m->padding[d] < 0 || m->output_padding[d] < 0 ||
            m->output_padding[d] >= m->stride[d]) {
            ct_nn_conv_transpose2d_free(m);
            return cti_error_null(CT_ERR_INVALID_ARG,
                                  "%s: expected kernel, stride, dilation > 0, padding >= 0 and "
                                  "0 <= output_padding < stride",
                                  op);
        }
    }
    double bound = 1.0 / sqrt((double)(out_channels / groups * kernel[0] * kernel[1]));
    if (!weight_and_bias(op, CT_SHAPE(in_channels, out_channels / groups, kernel[0], kernel[1]),
                         out_channels, bias, bound, dtype, device, gen, &m->weight, &m->bias)) {
        ct_nn_conv_transpose2d_free(m);
        return NULL;
    }
    return m;
}

ct_tensor *ct_nn_conv_transpose2d_forward(ct_nn_conv_transpose2d *m, ct_tensor *x) {
    if (!m)
        return cti_error_null(CT_ERR_INVALID_ARG, "ct_nn_conv_transpose2d_forward: layer is NULL");
    return ct_conv_transpose2d(x, m->weight, m->bias, m->stride, m->padding, m->output_padding,
                               m->groups, m->dilation);
}

ct_status ct_nn_conv_transpose2d_params(ct_nn_conv_transpose2d *m, const char *prefix,
                                        ct_params *p) {
    if (!m) return cti_error(CT_ERR_INVALID_ARG, "ct_nn_conv_transpose2d_params: layer is NULL");
    return add_pair("ct_nn_conv_transpose2d_params", p, prefix, m->weight, m->bias);
}

void ct_nn_conv_transpose2d_free(ct_nn_conv_transpose2d *m) {
    if (!m) return;
    ct_tensor_release(m->weight);
    ct_tensor_release(m->bias);
    free(m);
}
