/* Public views: the core's metadata operations plus autograd recording. */
#include "dispatch_impl.h"

ct_tensor *ct_view(ct_tensor *t, int ndim, const int64_t *shape) {
    return cti_view(t, ndim, shape);
}
ct_tensor *ct_transpose(ct_tensor *t, int dim0, int dim1) { return cti_transpose(t, dim0, dim1); }
ct_tensor *ct_t(ct_tensor *t) { return cti_t(t); }
ct_tensor *ct_permute(ct_tensor *t, int ndim, const int64_t *dims) {
    return cti_permute(t, ndim, dims);
}
ct_tensor *ct_squeeze(ct_tensor *t) { return cti_squeeze(t); }
ct_tensor *ct_squeeze_dim(ct_tensor *t, int dim) { return cti_squeeze_dim(t, dim); }
ct_tensor *ct_unsqueeze(ct_tensor *t, int dim) { return cti_unsqueeze(t, dim); }
ct_tensor *ct_slice(ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    return cti_slice(t, dim, start, end, step);
}
ct_tensor *ct_narrow(ct_tensor *t, int dim, int64_t start, int64_t length) {
    return cti_narrow(t, dim, start, length);
}
ct_tensor *ct_select(ct_tensor *t, int dim, int64_t index) { return cti_select(t, dim, index); }
ct_tensor *ct_expand(ct_tensor *t, int ndim, const int64_t *shape) {
    return cti_expand(t, ndim, shape);
}
ct_tensor *ct_expand_as(ct_tensor *t, const ct_tensor *other) { return cti_expand_as(t, other); }
