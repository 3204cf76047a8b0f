/* Shape and stride arithmetic shared by every layer. */
#include "tensor_impl.h"

int64_t cti_numel(int ndim, const int64_t *shape) {
    /* A zero anywhere makes the count 0 even when the sizes before it
     * multiply past int64; a real tensor's count never overflows, so the
     * saturation only answers shapes no tensor can have. */
    int64_t n = 1;
    bool over = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) return 0;
        over = over || __builtin_mul_overflow(n, shape[i], &n);
    }
    return over ? INT64_MAX : n;
}

bool cti_is_contiguous(const ct_tensor *t) {
    /* An empty tensor is contiguous, and its sizes' product may not fit in
     * int64 (a zero next to huge sizes): look for the zero first. */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return true;
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != expected) return false;
        expected *= t->shape[i];
    }
    return true;
}

int cti_wrap_dim(const char *op, int dim, int ndim) {
    int n = ndim > 0 ? ndim : 1; /* a 0-d tensor accepts dims 0 and -1, as PyTorch */
    if (dim < -n || dim >= n) {
        cti_error(CT_ERR_INDEX, "%s: dim %d out of range for a %d-d tensor (expected %d..%d)", op,
                  dim, ndim, -n, n - 1);
        return -1;
    }
    return dim < 0 ? dim + n : dim;
}

bool cti_checked_nbytes(const char *op, int ndim, const int64_t *shape, ct_dtype dt,
                        size_t *nbytes) {
    if (ndim < 0 || ndim > CT_MAX_DIMS) {
        cti_error(CT_ERR_SHAPE, "%s: %d dims requested, expected 0..%d", op, ndim, CT_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        cti_error(CT_ERR_INVALID_ARG, "%s: shape is NULL for %d dims", op, ndim);
        return false;
    }
    if ((unsigned)dt >= CT_NUM_DTYPES) {
        cti_error(CT_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
        return false;
    }
    /* Every size is checked before the product: the product stops early
     * when a zero makes it fit, and must not skip a negative size after it. */
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            cti_error(CT_ERR_SHAPE, "%s: negative size %lld in dim %d of shape %s", op,
                      (long long)shape[i], i, cti_shape_s(ndim, shape));
            return false;
        }
    }
    uint64_t n = ct_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] != 0 && n > (uint64_t)INT64_MAX / (uint64_t)shape[i]) {
            /* Keep scanning: a zero size later makes the product fit. */
            bool has_zero = false;
            for (int j = 0; j < ndim; j++) has_zero |= shape[j] == 0;
            if (has_zero) {
                n = 0;
                break;
            }
            cti_error(CT_ERR_OVERFLOW, "%s: shape %s of %s overflows the addressable size", op,
                      cti_shape_s(ndim, shape), ct_dtype_name(dt));
            return false;
        }
        n *= (uint64_t)shape[i];
    }
    *nbytes = (size_t)n;
    return true;
}

void cti_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
    /* Only an empty tensor's product can overflow (a zero next to huge
     * sizes); its strides address nothing, so they saturate there. */
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        if (__builtin_mul_overflow(s, shape[i] > 1 ? shape[i] : 1, &s)) s = INT64_MAX;
    }
}

ct_status cti_broadcast_shapes(const char *op, int na, const int64_t *sa, int nb,
                               const int64_t *sb, int *nout, int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t a = ia >= 0 ? sa[ia] : 1, b = ib >= 0 ? sb[ib] : 1;
        if (a != b && a != 1 && b != 1)
            return cti_error(CT_ERR_SHAPE,
                             "%s: shapes %s and %s cannot be broadcast (dim %d: %lld vs %lld)", op,
                             cti_shape_s(na, sa), cti_shape_s(nb, sb), i - n, (long long)a,
                             (long long)b);
        out[i] = a == 1 ? b : a;
    }
    *nout = n;
    return CT_OK;
}

/* torch's computeStride: walks the old dims in chunks that are contiguous
 * among themselves and checks each chunk maps onto whole new dims. */
bool cti_view_strides(const ct_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    int64_t numel = cti_numel(t->ndim, t->shape);
    if (t->ndim == 0) {
        for (int i = 0; i < ndim; i++) stride[i] = 1;
        return true;
    }
    if (numel == 0) {
        cti_contiguous_strides(ndim, shape, stride);
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_base_stride = t->stride[t->ndim - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tensor_numel *= t->shape[td];
        if (td == 0 ||
            (t->shape[td - 1] != 1 && t->stride[td - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                stride[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base_stride = t->stride[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}
