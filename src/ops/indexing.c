/* Front ends of the indexing ops: gather, scatter_add and index_select
 * (kernels of their own, which read strides, so no input is copied),
 * masked_fill and repeat_interleave (made of where, expand and reshape,
 * whose formulas give their gradients), and split / chunk (narrow views).
 *
 * The kernels see every tensor with at least one dim: a 0-d one (which
 * PyTorch takes as one element along dim 0) reaches them as a [1] view. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"
#include "tensor/ops.h"

/* ---- helpers ----------------------------------------------------------------------- */

static ct_device dev(const ct_tensor *t) { return t->storage->device; }

static int nd1(const ct_tensor *t) { return t->ndim > 0 ? t->ndim : 1; }

/* t itself for ndim >= 1, else a [1] view of it (released by the caller
 * when it is not t). */
static ct_tensor *as_1d(ct_tensor *t) {
    if (t->ndim > 0) return t;
    static const int64_t one = 1;
    return cti_tensor_view(t, 1, &one, &one, t->offset);
}

static void drop_view(ct_tensor *v, ct_tensor *t) {
    if (v && v != t) ct_tensor_release(v);
}


static ct_status check_index_dtype(const char *op, const ct_tensor *idx, bool allow_i32) {
    if (idx->dtype == CT_I64 || (allow_i32 && idx->dtype == CT_I32)) return CT_OK;
    return cti_error(CT_ERR_DTYPE, "%s: expected an int64%s index, got %s", op,
                     allow_i32 ? " or int32" : "", ct_dtype_name(idx->dtype));
}

/* t and x have the same number of dims (0-d counting as 1-d, as PyTorch). */
static ct_status check_same_ndim(const char *op, const ct_tensor *t, const char *name,
                                 const ct_tensor *x) {
    if (nd1(t) == nd1(x)) return CT_OK;
    return cti_error(CT_ERR_SHAPE, "%s: %s %s must have as many dims as x %s", op, name,
                     cti_desc(t), cti_desc(x));
}


/* Dispatches op with in[0..nin) (viewed as 1-d where 0-d) into out. */
static ct_status dispatch(ct_op id, int nin, ct_tensor *const *in, ct_tensor *out,
                          const cti_index_params *p) {
    ct_call c;
    cti_call_init(&c, id);
    ct_tensor *views[4] = {NULL};
    ct_tensor *ov = as_1d(out);
    ct_status s = ov ? CT_OK : ct_last_status();
    for (int k = 0; k < nin && s == CT_OK; k++)
        if (!(views[k] = as_1d(in[k]))) s = ct_last_status();
    if (s == CT_OK) {
        for (int k = 0; k < nin; k++) c.in[k] = views[k];
        c.nin = nin;
        c.out[0] = ov;
        c.nout = 1;
        cti_call_params(&c, p);
        s = cti_run(&c, dev(in[0]), in[0]->dtype);
    }
    for (int k = 0; k < nin; k++) drop_view(views[k], in[k]);
    drop_view(ov, out);
    return s;
}

/* ---- gather ---------------------------------------------------------------------------- */

ct_tensor *ct_gather(ct_tensor *x, int dim, ct_tensor *index) {
    const char *op = "ct_gather";
    ct_tensor *req[2] = {x, index};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req) ||
        check_index_dtype(op, index, false) || check_same_ndim(op, index, "index", x))
        return NULL;
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0 || cti_check_index_fits(op, index, x, "x", d)) return NULL;
    ct_tensor *out = cti_tensor_new(op, index->ndim, index->shape, x->dtype, dev(x));
    if (!out) return NULL;
    cti_index_params p = {.dim = d, .size = x->ndim > 0 ? x->shape[d] : 1};
    if (dispatch(CT_OP_GATHER, 2, req, out, &p) != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return cti_record_one(&(cti_ag_rec){.name = "GatherBackward",
                                .backward = cti_bw_gather,
                                .nin = 1,
                                .in = {x},
                                .nout = 1,
                                .out = {out},
                                .nsaved = 1,
                                .saved = {index},
                                CTI_AG_PARAMS(&p)});
}

/* ---- scatter_add ----------------------------------------------------------------------- */

ct_tensor *ct_scatter_add(ct_tensor *x, int dim, ct_tensor *index, ct_tensor *src) {
    const char *op = "ct_scatter_add";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_SCATTER_ADD, 2, (ct_tensor *[]){x, src}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_scatter_add(ac.in[0], dim, index, ac.in[1])
                                              : NULL);
    ct_tensor *req[3] = {x, index, src};
    if (cti_check_not_null(op, 3, req) || cti_check_same_device(op, 3, req) ||
        check_index_dtype(op, index, false) || check_same_ndim(op, index, "index", x) ||
        check_same_ndim(op, src, "src", x))
        return NULL;
    if (src->dtype != x->dtype)
        return cti_error_null(CT_ERR_DTYPE,
                              "%s: src has dtype %s but x has %s (expected equal dtypes)", op,
                              ct_dtype_name(src->dtype), ct_dtype_name(x->dtype));
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0 || cti_check_index_fits(op, index, x, "x", d) || cti_check_index_fits(op, index, src, "src", -1))
        return NULL;
    ct_tensor *out = cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x));
    if (!out) return NULL;
    /* The kernels only add: the copy of x is the copy op's. */
    cti_index_params p = {.dim = d, .size = x->ndim > 0 ? x->shape[d] : 1};
    /* The copy is part of the op, recorded below as a whole. */
    bool prev = ct_no_grad_begin();
    ct_status cs = ct_copy_(out, x);
    ct_no_grad_end(prev);
    if (cs != CT_OK || dispatch(CT_OP_SCATTER_ADD, 3, req, out, &p) != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return cti_record_one(&(cti_ag_rec){.name = "ScatterAddBackward",
                                .backward = cti_bw_scatter_add,
                                .nin = 2,
                                .in = {x, src},
                                .nout = 1,
                                .out = {out},
                                .nsaved = 1,
                                .saved = {index},
                                CTI_AG_PARAMS(&p)});
}

/* ---- index_select ---------------------------------------------------------------------- */

ct_tensor *ct_index_select(ct_tensor *x, int dim, ct_tensor *index) {
    const char *op = "ct_index_select";
    ct_tensor *req[2] = {x, index};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req) ||
        check_index_dtype(op, index, true))
        return NULL;
    if (index->ndim > 1)
        return cti_error_null(CT_ERR_SHAPE, "%s: index must be 0-d or 1-d, got %s", op,
                              cti_desc(index));
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    int64_t n = index->ndim ? index->shape[0] : 1;
    if (x->ndim == 0 && n != 1)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: a 0-d x takes an index of one element, got %s", op,
                              cti_desc(index));
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    if (x->ndim > 0) shape[d] = n;
    ct_tensor *out = cti_tensor_new(op, x->ndim, shape, x->dtype, dev(x));
    if (!out) return NULL;
    /* The kernel is gather's, with the index expanded to the result's shape
     * (stride 0 off dim). */
    int kn = nd1(out);
    int64_t ishape[CT_MAX_DIMS], istride[CT_MAX_DIMS] = {0};
    for (int k = 0; k < kn; k++) ishape[k] = out->ndim ? out->shape[k] : 1;
    istride[d] = index->ndim ? index->stride[0] : 0;
    ct_tensor *iv = cti_tensor_view(index, kn, ishape, istride, index->offset);
    cti_index_params p = {.dim = d, .size = x->ndim > 0 ? x->shape[d] : 1};
    ct_tensor *in[2] = {x, iv};
    ct_status s = iv ? dispatch(CT_OP_INDEX_SELECT, 2, in, out, &p) : ct_last_status();
    ct_tensor_release(iv);
    if (s != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return cti_record_one(&(cti_ag_rec){.name = "IndexSelectBackward",
                                .backward = cti_bw_index_select,
                                .nin = 1,
                                .in = {x},
                                .nout = 1,
                                .out = {out},
                                .nsaved = 1,
                                .saved = {index},
                                CTI_AG_PARAMS(&p)});
}

/* ---- masked_fill ----------------------------------------------------------------------- */

ct_status cti_check_scalar_fits(const char *op, double v, ct_dtype dt) {
    bool ok = true;
    switch (dt) {
    case CT_I32: ok = v >= (double)INT32_MIN && v < 2147483648.0; break;
    case CT_I64: ok = v >= -9223372036854775808.0 && v < 9223372036854775808.0; break;
    case CT_F16: ok = !isfinite(v) || fabs(v) <= 65504.0; break;
    case CT_F32:
    case CT_BF16: ok = !isfinite(v) || fabs(v) <= FLT_MAX; break;
    default: break;
    }
    if (ok) return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG, "%s: value %g cannot be converted to %s without overflow",
                     op, v, ct_dtype_name(dt));
}

ct_tensor *ct_masked_fill(ct_tensor *x, ct_tensor *mask, double value) {
    const char *op = "ct_masked_fill";
    ct_tensor *req[2] = {x, mask};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req)) return NULL;
    if (mask->dtype != CT_BOOL)
        return cti_error_null(CT_ERR_DTYPE, "%s: expected a bool mask, got %s", op,
                              ct_dtype_name(mask->dtype));
    int bn;
    int64_t bs[CT_MAX_DIMS];
    if (cti_check_scalar_fits(op, value, x->dtype) ||
        cti_broadcast_shapes(op, x->ndim, x->shape, mask->ndim, mask->shape, &bn, bs))
        return NULL;
    /* where(mask, value, x): a 0-d operand of x's dtype keeps x's dtype, and
     * where's formula gives x the gradient where mask is false. */
    ct_tensor *v = ct_tensor_scalar(value, x->dtype, dev(x));
    if (!v) return NULL;
    ct_tensor *out = ct_where(mask, v, x);
    ct_tensor_release(v);
    return out;
}

/* ---- repeat_interleave ----------------------------------------------------------------- */

/* An x with the most dims leaves none to expand along: index_select with
 * the index 0, .., 0, 1, .., 1, .. (each of the s entries repeats times). */
static ct_tensor *repeat_by_index(ct_tensor *x, int64_t repeats, int d, int64_t s) {
    const char *op = "ct_repeat_interleave";
    int64_t n = s * repeats;
    if (n > (int64_t)(SIZE_MAX / sizeof(int64_t)) - 1)
        return cti_error_null(CT_ERR_OVERFLOW, "%s: %lld repeats of %s overflow", op,
                              (long long)repeats, cti_desc(x));
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (!v) return cti_error_null(CT_ERR_OOM, "%s: out of memory for %lld indices", op, (long long)n);
    for (int64_t k = 0; k < n; k++) v[k] = k / repeats;
    ct_tensor *idx = ct_tensor_from_data_on(v, CT_I64, 1, &n, dev(x));
    free(v);
    if (!idx) return NULL;
    ct_tensor *out = ct_index_select(x, d, idx);
    ct_tensor_release(idx);
    return out;
}

ct_tensor *ct_repeat_interleave(ct_tensor *x, int64_t repeats, int dim) {
    const char *op = "ct_repeat_interleave";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (repeats < 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: repeats must be >= 0, got %lld", op,
                              (long long)repeats);
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    int nd = nd1(x);
    int64_t shape[CT_MAX_DIMS + 1];
    for (int k = 0; k < nd; k++) shape[k] = x->ndim ? x->shape[k] : 1;
    if (shape[d] > 0 && repeats > INT64_MAX / shape[d])
        return cti_error_null(CT_ERR_OVERFLOW, "%s: %lld repeats of dim %d of %s overflow int64",
                              op, (long long)repeats, d, cti_desc(x));
    if (nd == CT_MAX_DIMS) return repeat_by_index(x, repeats, d, shape[d]);
    /* x viewed [.., s, 1, ..], expanded to [.., s, r, ..] and reshaped to
     * [.., s * r, ..]: the reshape copies, and expand's gradient sums each
     * group of r back. */
    /* x itself, not a retain of it: releasing a retain of a handle the
     * caller's scope owns would take it out of the scope */
    ct_tensor *x1 = x->ndim ? x : ct_reshape(x, 1, shape);
    if (!x1) return NULL;
    ct_tensor *u = ct_unsqueeze(x1, d + 1);
    int64_t eshape[CT_MAX_DIMS + 1];
    for (int k = 0, j = 0; k < nd; k++) {
        eshape[j++] = shape[k];
        if (k == d) eshape[j++] = repeats;
    }
    ct_tensor *e = u ? ct_expand(u, nd + 1, eshape) : NULL;
    shape[d] *= repeats;
    ct_tensor *out = e ? ct_reshape(e, nd, shape) : NULL;
    if (out && out->storage == x->storage) {
        /* a view (size 1 along dim, or repeats 1): the result owns its memory, as PyTorch's */
        ct_tensor *c = ct_clone(out);
        ct_tensor_release(out);
        out = c;
    }
    ct_tensor_release(e);
    ct_tensor_release(u);
    if (x1 != x) ct_tensor_release(x1);
    return out;
}

/* ---- split and chunk ------------------------------------------------------------------- */

static const char *sizes_name(const char *op) {
    return strcmp(op, "ct_split_with_sizes") == 0 ? "SplitWithSizesBackward" : "SplitBackward";
}

/* The pieces out[0..n) of x (plain narrow views, no history yet) recorded as
 * the outputs of one SplitBackward node, as PyTorch records a split: their
 * gradients meet in one cat (or none, when they already lie side by side)
 * instead of each zero-filling a tensor of x's shape that the engine then
 * adds up. Then linked to x as views. On failure releases the pieces. */
static ct_status record_split(const char *op, ct_tensor *x, int d, int n, ct_tensor **out) {
    cti_join_params p = {.dim = d};
    cti_ag_rec r = {.name = sizes_name(op), .backward = cti_bw_split, .nin = 1, .in = {x},
                    .nout = n, CTI_AG_PARAMS(&p)};
    for (int k = 0; k < n; k++) r.out[k] = out[k];
    ct_status st = cti_ag_record(&r);
    for (int k = 0; k < n && st == CT_OK; k++) {
        if (!(out[k] = cti_ag_view_link(x, out[k]))) st = ct_last_status(); /* released */
        else cti_ag_mark_multi_output(out[k], op);
    }
    if (st != CT_OK)
        for (int k = 0; k < n; k++) {
            ct_tensor_release(out[k]);
            out[k] = NULL;
        }
    return st;
}

/* out[0..n) = narrow views of x along d of sizes[k] (or all of size each but
 * the last, when sizes is NULL: then n pieces of `each` cover the dim). */
static ct_status narrow_pieces(const char *op, ct_tensor *x, int d, int n,
                               const int64_t *sizes, int64_t each, ct_tensor **out) {
    int64_t start = 0, total = x->shape[d];
    /* more pieces than a node has outputs keep a NarrowBackward node each */
    bool one_node = n <= CTI_AG_MAX_OUT && cti_ag_needed(1, &x);
    for (int k = 0; k < n; k++) {
        int64_t len = sizes ? sizes[k] : (total - start < each ? total - start : each);
        out[k] = one_node ? cti_narrow(x, d, start, len) : ct_narrow(x, d, start, len);
        if (!out[k]) {
            for (int j = 0; j < k; j++) ct_tensor_release(out[j]);
            for (int j = 0; j < k; j++) out[j] = NULL;
            return ct_last_status();
        }
        /* PyTorch refuses in-place writes to the pieces of a split. */
        if (!one_node) cti_ag_mark_multi_output(out[k], op);
        start += len;
    }
    return one_node ? record_split(op, x, d, n, out) : CT_OK;
}

static ct_status check_split_args(const char *op, ct_tensor *x, int dim, int *n_out, int *d) {
    if (!x) return cti_error(CT_ERR_INVALID_ARG, "%s: x is NULL", op);
    if (!n_out) return cti_error(CT_ERR_INVALID_ARG, "%s: n_out is NULL", op);
    if (x->ndim == 0)
        return cti_error(CT_ERR_SHAPE, "%s: expected at least a 1-d tensor, got %s", op,
                         cti_desc(x));
    *d = cti_wrap_dim(op, dim, x->ndim);
    return *d < 0 ? ct_last_status() : CT_OK;
}

/* n pieces of size `each` (the last smaller) into out, or only counted. */
static ct_status emit(const char *op, ct_tensor *x, int d, int64_t n, int64_t each, int max_out,
                      ct_tensor **out, int *n_out) {
    if (n > INT_MAX)
        return cti_error(CT_ERR_OVERFLOW, "%s: %lld pieces of %s exceed INT_MAX", op,
                         (long long)n, cti_desc(x));
    if (out) {
        if (max_out < n)
            return cti_error(CT_ERR_INVALID_ARG, "%s: %lld pieces of %s do not fit in max_out %d",
                             op, (long long)n, cti_desc(x), max_out);
        ct_status s = narrow_pieces(op, x, d, (int)n, NULL, each, out);
        if (s != CT_OK) return s;
    }
    *n_out = (int)n;
    return CT_OK;
}

ct_status ct_split(ct_tensor *x, int64_t split_size, int dim, int max_out, ct_tensor **out,
                   int *n_out) {
    const char *op = "ct_split";
    int d = 0;
    if (check_split_args(op, x, dim, n_out, &d)) return ct_last_status();
    int64_t size = x->shape[d];
    if (split_size < 0)
        return cti_error(CT_ERR_INVALID_ARG, "%s: split_size must be >= 0, got %lld", op,
                         (long long)split_size);
    if (split_size == 0 && size > 0)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: split_size 0 is only allowed for an empty dim, got size %lld in dim %d",
                         op, (long long)size, d);
    int64_t n = size == 0 ? 1 : size / split_size + (size % split_size != 0);
    return emit(op, x, d, n, split_size, max_out, out, n_out);
}

ct_status ct_split_with_sizes(ct_tensor *x, int n, const int64_t *sizes, int dim,
                              ct_tensor **out) {
    const char *op = "ct_split_with_sizes";
    int d = 0, unused;
    if (check_split_args(op, x, dim, &unused, &d)) return ct_last_status();
    if (n < 1 || !sizes || !out)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: expected n >= 1 sizes and an out array, got n %d, sizes %s, out %s",
                         op, n, sizes ? "set" : "NULL", out ? "set" : "NULL");
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        if (sizes[k] < 0 || sizes[k] > x->shape[d] - total)
            return cti_error(CT_ERR_SHAPE,
                             "%s: sizes %s do not sum to the size %lld of dim %d of %s", op,
                             cti_shape_s(n < CT_MAX_DIMS ? n : CT_MAX_DIMS, sizes),
                             (long long)x->shape[d], d, cti_desc(x));
        total += sizes[k];
    }
    if (total != x->shape[d])
        return cti_error(CT_ERR_SHAPE, "%s: sizes %s do not sum to the size %lld of dim %d of %s",
                         op, cti_shape_s(n < CT_MAX_DIMS ? n : CT_MAX_DIMS, sizes),
                         (long long)x->shape[d], d, cti_desc(x));
    return narrow_pieces(op, x, d, n, sizes, 0, out);
}

ct_status ct_chunk(ct_tensor *x, int64_t chunks, int dim, int max_out, ct_tensor **out,
                   int *n_out) {
    const char *op = "ct_chunk";
    int d = 0;
    if (check_split_args(op, x, dim, n_out, &d)) return ct_last_status();
    if (chunks < 1)
        return cti_error(CT_ERR_INVALID_ARG, "%s: chunks must be >= 1, got %lld", op,
                         (long long)chunks);
    int64_t size = x->shape[d];
    if (size == 0) /* chunks empty pieces, as PyTorch */
        return emit(op, x, d, chunks, 0, max_out, out, n_out);
    int64_t each = size / chunks + (size % chunks != 0);
    return emit(op, x, d, size / each + (size % each != 0), each, max_out, out, n_out);
}
