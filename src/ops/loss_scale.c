/* Front ends of a gradient scaler's ops (CT_OP_AMP_UNSCALE,
 * CT_OP_AMP_UPDATE_SCALE; contract in optim_impl.h and
 * src/dispatch/schema.h). Nothing here reads device memory: the scale and
 * found_inf stay where they are, so a scaled training step needs no host
 * wait and can be recorded in a CUDA graph. */
#include <stdlib.h>

#include "optim_impl.h"

static inline ct_device dev_of(const ct_tensor *t) { return t->storage->device; }

static ct_status check_scalar(const char *op, const char *what, const ct_tensor *t,
                              ct_dtype dt, ct_device dev) {
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "%s: %s is NULL", op, what);
    char d[32];
    if (t->ndim != 0 || t->dtype != dt || !ct_device_eq(dev_of(t), dev))
        return cti_error(CT_ERR_INVALID_ARG, "%s: %s %s is not a 0-d %s tensor on %s", op, what,
                         cti_desc(t), ct_dtype_name(dt), ct_device_str(dev, d, sizeof d));
    return CT_OK;
}

static int by_address(const void *a, const void *b) {
    uintptr_t u = (uintptr_t)*(void *const *)a, v = (uintptr_t)*(void *const *)b;
    return u < v ? -1 : u > v;
}

/* The gradients' checks: floating, on dev, not expanded, no two on one
 * storage (one kernel writes them all). m receives the live count. */
static ct_status check_grads(const char *op, int64_t n, ct_tensor *const *grad, ct_device dev,
                             int64_t *m) {
    char ds[32];
    *m = 0;
    for (int64_t k = 0; k < n; k++) {
        ct_tensor *g = grad[k];
        if (!g) continue;
        if (!ct_dtype_is_floating(g->dtype) || !ct_device_eq(dev_of(g), dev))
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: gradient %lld %s: expected a floating tensor on %s", op,
                             (long long)k, cti_desc(g), ct_device_str(dev, ds, sizeof ds));
        for (int d = 0; d < g->ndim; d++)
            if (g->shape[d] > 1 && g->stride[d] == 0)
                return cti_error(CT_ERR_INVALID_ARG,
                                 "%s: gradient %lld %s has elements that share memory (an "
                                 "expanded view)",
                                 op, (long long)k, cti_desc(g));
        (*m)++;
    }
    cti_storage **w = malloc((size_t)(*m > 0 ? *m : 1) * sizeof *w);
    if (!w) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    int64_t j = 0;
    for (int64_t k = 0; k < n; k++)
        if (grad[k]) w[j++] = grad[k]->storage;
    qsort(w, (size_t)j, sizeof *w, by_address);
    ct_status st = CT_OK;
    for (int64_t i = 1; i < j && st == CT_OK; i++)
        if (w[i] == w[i - 1])
            st = cti_error(CT_ERR_INVALID_ARG,
                           "%s: two gradients share memory (expected distinct tensors)", op);
    free(w);
    return st;
}

ct_status cti_amp_unscale(const char *op, int64_t n, ct_tensor *const *grad,
                          ct_tensor *found_inf, ct_tensor *scale) {
    if (n < 0 || (n > 0 && !grad))
        return cti_error(CT_ERR_INVALID_ARG, "%s: malformed gradient list of %lld entries", op,
                         (long long)n);
    if (!found_inf) return cti_error(CT_ERR_INVALID_ARG, "%s: found_inf is NULL", op);
    ct_device dev = dev_of(found_inf);
    ct_status st = check_scalar(op, "found_inf", found_inf, CT_F32, dev);
    if (st == CT_OK) st = check_scalar(op, "scale", scale, CT_F32, dev);
    int64_t m = 0;
    if (st == CT_OK) st = check_grads(op, n, grad, dev, &m);
    if (st != CT_OK || m == 0) return st;
    ct_tensor **kv = malloc((size_t)m * 2 * sizeof *kv); /* kernel tensors, their copies */
    if (!kv) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    ct_tensor **tmp = kv + m;
    int64_t j = 0;
    for (int64_t k = 0; k < n && st == CT_OK; k++) {
        if (!grad[k]) continue;
        tmp[j] = cti_is_contiguous(grad[k]) ? NULL : ct_clone(grad[k]);
        kv[j] = tmp[j] ? tmp[j] : grad[k];
        if (!cti_is_contiguous(grad[k]) && !tmp[j]) st = ct_last_status();
        j++;
    }
    int64_t made = j;
    if (st == CT_OK) {
        cti_amp_unscale_params p = {m, kv, found_inf, scale};
        ct_call c;
        cti_call_init(&c, CT_OP_AMP_UNSCALE);
        c.in[c.nin++] = kv[0];
        c.in[c.nin++] = found_inf;
        c.in[c.nin++] = scale;
        cti_call_params(&c, &p);
        st = cti_run(&c, dev, kv[0]->dtype);
    }
    if (st == CT_OK) cti_bump_version(found_inf);
    j = 0;
    for (int64_t k = 0; k < n && j < made; k++) {
        if (!grad[k]) continue;
        if (st == CT_OK && tmp[j]) st = ct_copy_(grad[k], tmp[j]);
        else if (st == CT_OK) cti_bump_version(grad[k]);
        ct_tensor_release(tmp[j]);
        j++;
    }
    free(kv);
    return st;
}

ct_status cti_amp_update_scale(const char *op, ct_tensor *scale, ct_tensor *growth_tracker,
                               ct_tensor *found_inf, const cti_amp_update_params *p) {
    if (!scale) return cti_error(CT_ERR_INVALID_ARG, "%s: scale is NULL", op);
    if (!p) return cti_error(CT_ERR_INVALID_ARG, "%s: parameters are NULL", op);
    ct_device dev = dev_of(scale);
    ct_status st = check_scalar(op, "scale", scale, CT_F32, dev);
    if (st == CT_OK) st = check_scalar(op, "growth_tracker", growth_tracker, CT_I32, dev);
    if (st == CT_OK) st = check_scalar(op, "found_inf", found_inf, CT_F32, dev);
    if (st == CT_OK && p->growth_interval < 1)
        st = cti_error(CT_ERR_INVALID_ARG, "%s: growth_interval %lld (expected >= 1)", op,
                       (long long)p->growth_interval);
    if (st != CT_OK) return st;
    ct_call c;
    cti_call_init(&c, CT_OP_AMP_UPDATE_SCALE);
    c.in[c.nin++] = scale;
    c.in[c.nin++] = growth_tracker;
    c.in[c.nin++] = found_inf;
    cti_call_params(&c, p);
    st = cti_run(&c, dev, CT_F32);
    if (st == CT_OK) {
        cti_bump_version(scale);
        cti_bump_version(growth_tracker);
    }
    return st;
}
