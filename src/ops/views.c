/* Public views: the core's metadata operations plus autograd recording.
 *
 * A view of a tensor that requires grad carries history of its own even
 * though it shares the storage: its gradient flows back to the viewed
 * tensor through the node recorded here, which keeps what the view took
 * of t in a cti_view_params (src/autograd/formulas.h). Every floating view
 * made in grad mode also knows its base (PyTorch's _base), whatever the base
 * requires: a write through the view rewrites the base's history
 * (src/autograd/graph.c). */
#include "ops_impl.h"

/* Records v = view(t) when t requires grad, with *p (NULL: the formula
 * reads none), and links v to its base (cti_ag_view_link: what an in-place
 * write through v needs); on failure releases v and returns NULL, else
 * returns v (NULL stays NULL). */
static ct_tensor *recorded(ct_tensor *t, ct_tensor *v, const char *name, cti_backward_fn bw,
                           const cti_view_params *p) {
    if (!v) return NULL;
    if (cti_ag_needed(1, &t)) {
        cti_ag_rec r = {.name = name, .backward = bw, .nin = 1, .in = {t}, .nout = 1, .out = {v}};
        if (p) {
            r.params = p;
            r.params_size = sizeof *p;
        }
        if (cti_ag_record(&r) != CT_OK) {
            ct_tensor_release(v);
            return NULL;
        }
    }
    return cti_ag_view_link(t, v);
}

/* A reshape-like view: backward reshapes the gradient to t's shape. */
static ct_tensor *reshaped(ct_tensor *t, ct_tensor *v, const char *name) {
    return recorded(t, v, name, cti_bw_view, NULL);
}

ct_tensor *ct_view(ct_tensor *t, int ndim, const int64_t *shape) {
    return reshaped(t, cti_view(t, ndim, shape), "ViewBackward");
}

ct_tensor *ct_transpose(ct_tensor *t, int dim0, int dim1) {
    ct_tensor *v = cti_transpose(t, dim0, dim1);
    if (!v) return NULL;
    /* cti_transpose accepted both dims, so wrapping them cannot fail. */
    cti_view_params p = {.dim0 = cti_wrap_dim("ct_transpose", dim0, t->ndim),
                         .dim1 = cti_wrap_dim("ct_transpose", dim1, t->ndim)};
    if (t->ndim == 0) p.dim0 = p.dim1 = -1; /* nothing was swapped */
    return recorded(t, v, "TransposeBackward", cti_bw_transpose, &p);
}

ct_tensor *ct_t(ct_tensor *t) {
    ct_tensor *v = cti_t(t);
    if (!v) return NULL;
    cti_view_params p = {.dim0 = 0, .dim1 = 1};
    if (t->ndim < 2) p.dim0 = p.dim1 = -1;
    return recorded(t, v, "TBackward", cti_bw_transpose, &p);
}

ct_tensor *ct_permute(ct_tensor *t, int ndim, const int64_t *dims) {
    ct_tensor *v = cti_permute(t, ndim, dims);
    if (!v) return NULL;
    cti_view_params p = {0};
    for (int k = 0; k < ndim; k++) p.perm[k] = dims[k] < 0 ? dims[k] + ndim : dims[k];
    return recorded(t, v, "PermuteBackward", cti_bw_permute, &p);
}

ct_tensor *ct_squeeze(ct_tensor *t) { return reshaped(t, cti_squeeze(t), "SqueezeBackward"); }

ct_tensor *ct_squeeze_dim(ct_tensor *t, int dim) {
    return reshaped(t, cti_squeeze_dim(t, dim), "SqueezeBackward");
}

ct_tensor *ct_unsqueeze(ct_tensor *t, int dim) {
    return reshaped(t, cti_unsqueeze(t, dim), "UnsqueezeBackward");
}

ct_tensor *ct_slice(ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    ct_tensor *v = cti_slice(t, dim, start, end, step);
    if (!v) return NULL;
    /* The same arguments select the same elements of a tensor of t's shape. */
    cti_view_params p = {.dim = cti_wrap_dim("ct_slice", dim, t->ndim),
                         .start = start, .end = end, .step = step};
    return recorded(t, v, "SliceBackward", cti_bw_slice, &p);
}

ct_tensor *ct_narrow(ct_tensor *t, int dim, int64_t start, int64_t length) {
    ct_tensor *v = cti_narrow(t, dim, start, length);
    if (!v) return NULL;
    int d = cti_wrap_dim("ct_narrow", dim, t->ndim);
    if (start < 0) start += t->shape[d];
    cti_view_params p = {.dim = d, .start = start, .end = start + length, .step = 1};
    return recorded(t, v, "NarrowBackward", cti_bw_slice, &p);
}

ct_tensor *ct_select(ct_tensor *t, int dim, int64_t index) {
    ct_tensor *v = cti_select(t, dim, index);
    if (!v) return NULL;
    int d = cti_wrap_dim("ct_select", dim, t->ndim);
    cti_view_params p = {.dim = d, .index = index < 0 ? index + t->shape[d] : index};
    return recorded(t, v, "SelectBackward", cti_bw_select, &p);
}

/* Backward of expand returns the gradient as it is: the engine sums it over
 * the broadcast dims back to t's shape. */
ct_tensor *ct_expand(ct_tensor *t, int ndim, const int64_t *shape) {
    return recorded(t, cti_expand(t, ndim, shape), "ExpandBackward", cti_bw_expand, NULL);
}

ct_tensor *ct_expand_as(ct_tensor *t, const ct_tensor *other) {
    return recorded(t, cti_expand_as(t, other), "ExpandBackward", cti_bw_expand, NULL);
}

ct_tensor *ct_diagonal(ct_tensor *t, int64_t offset, int dim1, int dim2) {
    ct_tensor *v = cti_diagonal(t, offset, dim1, dim2);
    if (!v) return NULL;
    cti_view_params p = {.dim0 = cti_wrap_dim("ct_diagonal", dim1, t->ndim),
                         .dim1 = cti_wrap_dim("ct_diagonal", dim2, t->ndim),
                         .index = offset};
    return recorded(t, v, "DiagonalBackward", cti_bw_diagonal, &p);
}
