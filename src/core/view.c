/* Views: new handles over the same storage with other shapes and strides. */
#include "tensor_impl.h"

#define CHECK_T(op, t)                                                            \
    do {                                                                          \
        if (!(t)) return cti_error_null(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op); \
    } while (0)

/* The storage offset of element index along dim d of t, into *off. An
 * empty tensor addresses nothing and its strides may be saturated (a zero
 * next to huge sizes), and every view of it is empty too, so its views keep
 * its offset; otherwise the arithmetic is checked. */
static bool offset_at(const char *op, const ct_tensor *t, int d, int64_t index, int64_t *off) {
    int64_t step;
    if (cti_numel(t->ndim, t->shape) == 0) {
        *off = t->offset;
        return true;
    }
    if (__builtin_mul_overflow(index, t->stride[d], &step) ||
        __builtin_add_overflow(t->offset, step, off)) {
        cti_error(CT_ERR_OVERFLOW,
                  "%s: the offset of index %lld along dim %d of %s (stride %lld) overflows int64",
                  op, (long long)index, d, cti_desc(t), (long long)t->stride[d]);
        return false;
    }
    return true;
}

/* Resolves one -1 in shape against numel; writes the result into out. */
static bool infer_shape(const char *op, const ct_tensor *t, int ndim, const int64_t *shape,
                        int64_t *out) {
    if (ndim < 0 || ndim > CT_MAX_DIMS) {
        cti_error(CT_ERR_SHAPE, "%s: %d dims requested, expected 0..%d", op, ndim, CT_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        cti_error(CT_ERR_INVALID_ARG, "%s: shape is NULL", op);
        return false;
    }
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        out[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) {
                cti_error(CT_ERR_SHAPE, "%s: only one dimension can be inferred in %s", op,
                          cti_shape_s(ndim, shape));
                return false;
            }
            infer = i;
        } else if (shape[i] < 0) {
            cti_error(CT_ERR_SHAPE, "%s: invalid size %lld in shape %s", op, (long long)shape[i],
                      cti_shape_s(ndim, shape));
            return false;
        } else {
            if (shape[i] != 0 && known > INT64_MAX / shape[i]) {
                cti_error(CT_ERR_OVERFLOW, "%s: shape %s overflows", op, cti_shape_s(ndim, shape));
                return false;
            }
            known *= shape[i];
        }
    }
    int64_t numel = cti_numel(t->ndim, t->shape);
    if (infer >= 0) {
        if (known == 0 || numel % known != 0) {
            cti_error(CT_ERR_SHAPE, "%s: shape %s is invalid for input of size %lld", op,
                      cti_shape_s(ndim, shape), (long long)numel);
            return false;
        }
        out[infer] = numel / known;
    } else if (known != numel) {
        cti_error(CT_ERR_SHAPE, "%s: shape %s is invalid for input of size %lld", op,
                  cti_shape_s(ndim, shape), (long long)numel);
        return false;
    }
    return true;
}

/* Shared by ct_view and the dispatcher's ct_reshape: resolves -1 and reports
 * whether t's strides allow a view. Returns the view or NULL; *viewable is
 * false when only a copy can produce the shape (no error is set then). */
ct_tensor *cti_try_view(const char *op, ct_tensor *t, int ndim, const int64_t *shape,
                        bool *viewable) {
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    *viewable = true;
    if (!infer_shape(op, t, ndim, shape, sh)) return NULL;
    if (!cti_view_strides(t, ndim, sh, st)) {
        *viewable = false;
        return NULL;
    }
    return cti_tensor_view(t, ndim, sh, st, t->offset);
}

ct_tensor *cti_view(ct_tensor *t, int ndim, const int64_t *shape) {
    CHECK_T("ct_view", t);
    bool viewable;
    ct_tensor *v = cti_try_view("ct_view", t, ndim, shape, &viewable);
    if (!v && !viewable)
        return cti_error_null(CT_ERR_SHAPE,
                              "ct_view: view shape %s is not compatible with input %s and strides "
                              "%s (at least one dim spans two contiguous subspaces); use "
                              "ct_reshape",
                              cti_shape_s(ndim, shape), cti_desc(t),
                              cti_shape_s(t->ndim, t->stride));
    return v;
}

ct_tensor *cti_transpose(ct_tensor *t, int dim0, int dim1) {
    CHECK_T("ct_transpose", t);
    int a = cti_wrap_dim("ct_transpose", dim0, t->ndim);
    if (a < 0) return NULL;
    int b = cti_wrap_dim("ct_transpose", dim1, t->ndim);
    if (b < 0) return NULL;
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->stride, sizeof st);
    if (t->ndim > 0) {
        sh[a] = t->shape[b];
        sh[b] = t->shape[a];
        st[a] = t->stride[b];
        st[b] = t->stride[a];
    }
    return cti_tensor_view(t, t->ndim, sh, st, t->offset);
}

ct_tensor *cti_t(ct_tensor *t) {
    CHECK_T("ct_t", t);
    if (t->ndim > 2)
        return cti_error_null(CT_ERR_SHAPE, "ct_t: expects a tensor with <= 2 dims, got %s",
                              cti_desc(t));
    if (t->ndim < 2) return cti_tensor_view(t, t->ndim, t->shape, t->stride, t->offset);
    return cti_transpose(t, 0, 1);
}

ct_tensor *cti_permute(ct_tensor *t, int ndim, const int64_t *dims) {
    CHECK_T("ct_permute", t);
    if (ndim > 0 && !dims)
        return cti_error_null(CT_ERR_INVALID_ARG, "ct_permute: dims is NULL (%d dims for %s)",
                              ndim, cti_desc(t));
    if (ndim != t->ndim)
        return cti_error_null(CT_ERR_SHAPE, "ct_permute: got %d dims for a %d-d tensor %s", ndim,
                              t->ndim, cti_desc(t));
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    bool seen[CT_MAX_DIMS] = {false};
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < -ndim || dims[i] >= ndim)
            return cti_error_null(CT_ERR_INDEX, "ct_permute: dim %lld out of range for %s",
                                  (long long)dims[i], cti_desc(t));
        int d = (int)(dims[i] < 0 ? dims[i] + ndim : dims[i]);
        if (seen[d])
            return cti_error_null(CT_ERR_INDEX, "ct_permute: dim %d repeated in %s", d,
                                  cti_shape_s(ndim, dims));
        seen[d] = true;
        sh[i] = t->shape[d];
        st[i] = t->stride[d];
    }
    return cti_tensor_view(t, ndim, sh, st, t->offset);
}

ct_tensor *cti_squeeze(ct_tensor *t) {
    CHECK_T("ct_squeeze", t);
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 1) continue;
        sh[n] = t->shape[i];
        st[n++] = t->stride[i];
    }
    return cti_tensor_view(t, n, sh, st, t->offset);
}

ct_tensor *cti_squeeze_dim(ct_tensor *t, int dim) {
    CHECK_T("ct_squeeze_dim", t);
    int d = cti_wrap_dim("ct_squeeze_dim", dim, t->ndim);
    if (d < 0) return NULL;
    if (t->ndim == 0 || t->shape[d] != 1)
        return cti_tensor_view(t, t->ndim, t->shape, t->stride, t->offset);
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d) continue;
        sh[n] = t->shape[i];
        st[n++] = t->stride[i];
    }
    return cti_tensor_view(t, n, sh, st, t->offset);
}

ct_tensor *cti_unsqueeze(ct_tensor *t, int dim) {
    CHECK_T("ct_unsqueeze", t);
    if (t->ndim >= CT_MAX_DIMS)
        return cti_error_null(CT_ERR_SHAPE, "ct_unsqueeze: %s already has the maximum of %d dims",
                              cti_desc(t), CT_MAX_DIMS);
    int d = cti_wrap_dim("ct_unsqueeze", dim, t->ndim + 1);
    if (d < 0) return NULL;
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    int n = 0;
    for (int i = 0; i <= t->ndim; i++) {
        if (i == d) {
            sh[n] = 1;
            /* The stride of a size-1 dim is free; this value keeps the view
             * contiguous when t is. */
            if (i == t->ndim) st[n] = 1;
            else if (__builtin_mul_overflow(t->stride[i], t->shape[i], &st[n]))
                st[n] = INT64_MAX; /* only an empty tensor's saturated strides get here */
            n++;
        }
        if (i < t->ndim) {
            sh[n] = t->shape[i];
            st[n++] = t->stride[i];
        }
    }
    return cti_tensor_view(t, n, sh, st, t->offset);
}

ct_tensor *cti_slice(ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    CHECK_T("ct_slice", t);
    if (t->ndim == 0)
        return cti_error_null(CT_ERR_SHAPE, "ct_slice: cannot slice a 0-d tensor");
    int d = cti_wrap_dim("ct_slice", dim, t->ndim);
    if (d < 0) return NULL;
    if (step <= 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "ct_slice: step must be positive, got %lld",
                              (long long)step);
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (start < 0) start = 0;
    if (start > n) start = n;
    if (end < start) end = start;
    if (end > n) end = n;
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->stride, sizeof st);
    /* Written so that no step, however large, overflows: the count rounds
     * up without adding step, and a dim of at most one element keeps its
     * stride (no element is ever reached through it). */
    sh[d] = (end - start) / step + ((end - start) % step != 0);
    bool empty = cti_numel(t->ndim, t->shape) == 0;
    if (sh[d] > 1 && __builtin_mul_overflow(t->stride[d], step, &st[d])) {
        if (!empty)
            return cti_error_null(CT_ERR_OVERFLOW,
                                  "ct_slice: step %lld times the stride %lld of dim %d of %s "
                                  "overflows int64",
                                  (long long)step, (long long)t->stride[d], d, cti_desc(t));
        st[d] = INT64_MAX; /* addresses nothing */
    }
    int64_t offset;
    if (!offset_at("ct_slice", t, d, start, &offset)) return NULL;
    return cti_tensor_view(t, t->ndim, sh, st, offset);
}

ct_tensor *cti_narrow(ct_tensor *t, int dim, int64_t start, int64_t length) {
    CHECK_T("ct_narrow", t);
    if (t->ndim == 0)
        return cti_error_null(CT_ERR_SHAPE, "ct_narrow: cannot narrow a 0-d tensor");
    int d = cti_wrap_dim("ct_narrow", dim, t->ndim);
    if (d < 0) return NULL;
    int64_t n = t->shape[d];
    if (start < -n || start > n)
        return cti_error_null(CT_ERR_INDEX, "ct_narrow: start %lld out of range for dim %d of %s",
                              (long long)start, d, cti_desc(t));
    if (start < 0) start += n;
    if (length < 0)
        return cti_error_null(CT_ERR_INDEX, "ct_narrow: length must be non-negative, got %lld",
                              (long long)length);
    /* length > n - start, not start + length > n: the sum can overflow. */
    if (length > n - start)
        return cti_error_null(CT_ERR_INDEX,
                              "ct_narrow: start %lld + length %lld exceeds dim %d of size %lld",
                              (long long)start, (long long)length, d, (long long)n);
    int64_t sh[CT_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    sh[d] = length;
    int64_t offset;
    if (!offset_at("ct_narrow", t, d, start, &offset)) return NULL;
    return cti_tensor_view(t, t->ndim, sh, t->stride, offset);
}

ct_tensor *cti_select(ct_tensor *t, int dim, int64_t index) {
    CHECK_T("ct_select", t);
    if (t->ndim == 0)
        return cti_error_null(CT_ERR_SHAPE, "ct_select: cannot select from a 0-d tensor");
    int d = cti_wrap_dim("ct_select", dim, t->ndim);
    if (d < 0) return NULL;
    int64_t n = t->shape[d];
    if (index < -n || index >= n)
        return cti_error_null(CT_ERR_INDEX, "ct_select: index %lld out of range for dim %d of %s",
                              (long long)index, d, cti_desc(t));
    if (index < 0) index += n;
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d) continue;
        sh[k] = t->shape[i];
        st[k++] = t->stride[i];
    }
    int64_t offset;
    if (!offset_at("ct_select", t, d, index, &offset)) return NULL;
    return cti_tensor_view(t, k, sh, st, offset);
}

ct_tensor *cti_expand(ct_tensor *t, int ndim, const int64_t *shape) {
    CHECK_T("ct_expand", t);
    if (ndim < t->ndim || ndim > CT_MAX_DIMS || (ndim > 0 && !shape))
        return cti_error_null(CT_ERR_SHAPE,
                              "ct_expand: the number of sizes (%d) must be >= the number of dims "
                              "of %s and <= %d",
                              ndim, cti_desc(t), CT_MAX_DIMS);
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        if (j < 0) {
            if (shape[i] < 0)
                return cti_error_null(CT_ERR_SHAPE,
                                      "ct_expand: size -1 not allowed in new leading dim %d", i);
            sh[i] = shape[i];
            st[i] = 0;
            continue;
        }
        int64_t want = shape[i] == -1 ? t->shape[j] : shape[i];
        if (want < 0)
            return cti_error_null(CT_ERR_SHAPE,
                                  "ct_expand: size %lld at dim %d is negative (only -1, which "
                                  "keeps the size, is allowed; %s to %s)",
                                  (long long)shape[i], i, cti_desc(t), cti_shape_s(ndim, shape));
        if (want == t->shape[j]) {
            sh[i] = want;
            st[i] = t->stride[j];
        } else if (t->shape[j] == 1 && want >= 0) {
            sh[i] = want;
            st[i] = 0;
        } else {
            return cti_error_null(CT_ERR_SHAPE,
                                  "ct_expand: the expanded size %lld must match the existing size "
                                  "%lld at non-singleton dim %d (%s to %s)",
                                  (long long)shape[i], (long long)t->shape[j], i, cti_desc(t),
                                  cti_shape_s(ndim, shape));
        }
    }
    size_t nbytes;
    if (!cti_checked_nbytes("ct_expand", ndim, sh, t->dtype, &nbytes)) return NULL;
    return cti_tensor_view(t, ndim, sh, st, t->offset);
}

ct_tensor *cti_expand_as(ct_tensor *t, const ct_tensor *other) {
    if (!other) return cti_error_null(CT_ERR_INVALID_ARG, "ct_expand_as: other is NULL");
    return cti_expand(t, other->ndim, other->shape);
}

/* The diagonal (i, i + offset) of dims d1 and d2: both dims go, a last dim
 * of the diagonal's length comes, stepping both strides at once. */
ct_tensor *cti_diagonal(ct_tensor *t, int64_t offset, int dim1, int dim2) {
    const char *op = "ct_diagonal";
    CHECK_T(op, t);
    if (t->ndim < 2)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected at least a 2-d tensor, got %s", op,
                              cti_desc(t));
    int d1 = cti_wrap_dim(op, dim1, t->ndim), d2 = d1 < 0 ? -1 : cti_wrap_dim(op, dim2, t->ndim);
    if (d1 < 0 || d2 < 0) return NULL;
    if (d1 == d2)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: dim1 and dim2 are both dim %d of %s", op,
                              d1, cti_desc(t));
    int64_t n1 = t->shape[d1], n2 = t->shape[d2], len;
    if (offset >= 0) len = offset >= n2 ? 0 : (n1 < n2 - offset ? n1 : n2 - offset);
    else len = -offset >= n1 ? 0 : (n1 + offset < n2 ? n1 + offset : n2);
    int64_t off = t->offset;
    if (len > 0 && !offset_at(op, t, offset >= 0 ? d2 : d1, offset >= 0 ? offset : -offset, &off))
        return NULL;
    int64_t sh[CT_MAX_DIMS], st[CT_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d1 || i == d2) continue;
        sh[k] = t->shape[i];
        st[k++] = t->stride[i];
    }
    sh[k] = len;
    st[k++] = len > 0 ? t->stride[d1] + t->stride[d2] : 1;
    return cti_tensor_view(t, k, sh, st, off);
}
