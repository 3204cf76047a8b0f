/* Front ends of the reductions, scans and sorts of issue 20: sort, argsort,
 * kthvalue, median, mode, nonzero, unique and cumprod on their own kernels
 * (schema.h, "sort, cumprod, nonzero"), and logsumexp, all, any and
 * count_nonzero made of public ops (so they run, and differentiate, on
 * every device). kthvalue and median take their values from a stable sort
 * (gather, so the gradient flows through the sort's node); unique is a sort,
 * a flag at each change of value and a running count of the flags. */
#include <math.h>
#include <stdio.h>

#include "ops_impl.h"
#include "tensor/ops.h"

static ct_device dev(const ct_tensor *t) { return t->storage->device; }

static int64_t prod(const int64_t *s, int a, int b) { return b > a ? cti_numel(b - a, s + a) : 1; }

/* Ends scope s keeping out (NULL: nothing) and returns out. */
static ct_tensor *end_keep(ct_scope *s, ct_tensor *out) {
    if (out) ct_keep(out);
    ct_scope_end(s);
    return out;
}

/* ---- sort / argsort -------------------------------------------------------------------------- */

ct_tensor *ct_sort(ct_tensor *x, int dim, bool descending, bool stable, ct_tensor **indices) {
    const char *op = "ct_sort";
    (void)stable; /* always stable, which PyTorch allows either way */
    if (cti_check_not_null(op, 1, &x)) return NULL;
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    int64_t n = x->ndim ? x->shape[d] : 1, outer;
    ct_tensor *xl, *vals = NULL, *idx = NULL, *out = NULL;
    ct_call c;
    if (cti_select_call(op, CT_OP_SORT, x, d, n, &c, &xl, &outer) != CT_OK) return NULL;
    cti_sort_params p = {.outer = outer, .n = n, .dim = d, .descending = descending};
    cti_call_params(&c, &p);
    if (cti_select_run(&c, dev(x), x->dtype, d, &vals, &idx) != CT_OK) goto done;
    if (ct_dtype_is_floating(x->dtype) && cti_ag_needed(1, &x) &&
        cti_ag_record(&(cti_ag_rec){.name = "SortBackward",
                                    .backward = cti_bw_sort,
                                    .nin = 1,
                                    .in = {x},
                                    .nout = 1,
                                    .out = {vals},
                                    .nsaved = 1,
                                    .saved = {idx},
                                    CTI_AG_PARAMS(&p)}) != CT_OK)
        goto done;
    out = vals;
    vals = NULL;
done:
    ct_tensor_release(vals);
    ct_tensor_release(xl);
    if (out && indices) *indices = idx;
    else ct_tensor_release(idx);
    return out;
}

ct_tensor *ct_argsort(ct_tensor *x, int dim, bool descending, bool stable) {
    ct_tensor *idx = NULL;
    bool prev = ct_no_grad_begin(); /* the values are dropped: no node for them */
    ct_tensor *v = ct_sort(x, dim, descending, stable, &idx);
    ct_no_grad_end(prev);
    if (!v) return NULL;
    ct_tensor_release(v);
    return idx;
}

/* ---- kthvalue / median ----------------------------------------------------------------------- */

/* The element at position pos (int64, x's rank with size 1 at dim d) of
 * each slice of x sorted along d, and its index into *indices; keepdim as
 * the reductions'. Runs inside the caller's scope. */
static ct_tensor *sorted_at(ct_tensor *s, ct_tensor *si, int d, ct_tensor *pos, bool keepdim,
                            ct_tensor **indices) {
    ct_tensor *v = ct_gather(s, d, pos);
    ct_tensor *i = v && indices ? ct_gather(si, d, pos) : NULL;
    if (!v || (indices && !i)) return NULL;
    if (!keepdim) {
        v = ct_squeeze_dim(v, d);
        if (indices && i) i = ct_squeeze_dim(i, d);
        if (!v || (indices && !i)) return NULL;
    }
    if (indices) *indices = i;
    return v;
}

/* x viewed as [1] when 0-d (the kernels' rule: a 0-d tensor is a slice of
 * one; a handle of the caller's scope), else x itself. */
static ct_tensor *at_least_1d(ct_tensor *x) {
    int64_t one = 1;
    return x->ndim ? x : ct_reshape(x, 1, &one);
}

/* The result of a 0-d x's dim-reduction: back to 0-d, keepdim or not. */
static ct_tensor *back_to_0d(ct_tensor *t, bool was_0d) {
    return t && was_0d ? ct_reshape(t, 0, NULL) : t;
}

/* The int64 position at (one per slice: s's shape with size 1 at d), in
 * the caller's scope. */
static ct_tensor *position(ct_tensor *s, int d, int64_t at) {
    int64_t shape[CT_MAX_DIMS];
    for (int i = 0; i < s->ndim; i++) shape[i] = i == d ? 1 : s->shape[i];
    return ct_tensor_full(s->ndim, shape, (double)at, CT_I64, dev(s));
}

/* The result of kthvalue, median and mode, which all take an element of
 * each slice of x sorted along d (s, and the sort's indices si): the one at
 * pos, and its index into *indices when asked; keepdim as the reductions',
 * back to 0-d when x was. Ends the caller's scope sc keeping them. */
static ct_tensor *pick_sorted(ct_scope *sc, ct_tensor *s, ct_tensor *si, int d, ct_tensor *pos,
                              bool keepdim, bool was_0d, ct_tensor **indices) {
    ct_tensor *ii = NULL;
    ct_tensor *out = pos ? sorted_at(s, si, d, pos, keepdim, indices ? &ii : NULL) : NULL;
    out = back_to_0d(out, was_0d);
    if (out && indices) {
        ii = back_to_0d(ii, was_0d);
        if (!ii) out = NULL;
        else *indices = ct_keep(ii);
    }
    return end_keep(sc, out);
}

ct_tensor *ct_kthvalue(ct_tensor *x, int64_t k, int dim, bool keepdim, ct_tensor **indices) {
    const char *op = "ct_kthvalue";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    int64_t n = x->ndim ? x->shape[d] : 1;
    if (k < 1 || k > n)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: k %lld is out of range for dim %d of size %lld (expected "
                              "1..%lld)",
                              op, (long long)k, d, (long long)n, (long long)n);
    ct_scope *sc = ct_scope_begin();
    bool was_0d = x->ndim == 0;
    ct_tensor *x1 = at_least_1d(x), *si = NULL;
    ct_tensor *s = x1 ? ct_sort(x1, d, false, true, &si) : NULL;
    ct_tensor *pos = s ? position(s, d, k - 1) : NULL;
    return pick_sorted(sc, s, si, d, pos, keepdim, was_0d, indices);
}

ct_tensor *ct_median_dim(ct_tensor *x, int dim, bool keepdim, ct_tensor **indices) {
    const char *op = "ct_median_dim";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    int64_t n = x->ndim ? x->shape[d] : 1;
    if (n == 0)
        return cti_error_null(CT_ERR_SHAPE, "%s: cannot compute the median over the zero-size "
                              "dim %d of %s", op, d, cti_desc(x));
    ct_scope *sc = ct_scope_begin();
    bool was_0d = x->ndim == 0;
    ct_tensor *x1 = at_least_1d(x), *si = NULL;
    ct_tensor *s = x1 ? ct_sort(x1, d, false, true, &si) : NULL;
    ct_tensor *pos = s ? position(s, d, (n - 1) / 2) : NULL;
    if (pos && ct_dtype_is_floating(x->dtype)) {
        /* A slice with NaN: its first NaN, which the stable sort put at n - nans. */
        int64_t dd = d;
        ct_tensor *isnan_ = ct_ne(x1, x1);
        ct_tensor *nans = isnan_ ? ct_sum(isnan_, 1, &dd, true) : NULL;
        ct_tensor *has = nans ? ct_gt_scalar(nans, 0) : NULL;
        ct_tensor *at = has ? ct_mul_scalar(nans, -1) : NULL;
        at = at ? ct_add_scalar(at, (double)n) : NULL;
        pos = at ? ct_where(has, at, pos) : NULL;
    }
    return pick_sorted(sc, s, si, d, pos, keepdim, was_0d, indices);
}

ct_tensor *ct_median(ct_tensor *x) {
    const char *op = "ct_median";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    int64_t numel = cti_numel(x->ndim, x->shape);
    if (numel == 0)
        return cti_error_null(CT_ERR_SHAPE, "%s: cannot compute the median of the empty tensor %s",
                              op, cti_desc(x));
    ct_tensor *flat = ct_reshape(x, 1, &numel);
    if (!flat) return NULL;
    ct_tensor *out = ct_median_dim(flat, 0, false, NULL);
    ct_tensor_release(flat);
    return out;
}

/* The most frequent value of each slice: a stable sort, the runs of equal
 * values numbered along dim (a running count of where a run starts), each
 * run's length (a scatter_add of ones), the first longest run (argmax: the
 * smallest value among the most frequent, as PyTorch) and its last element
 * (the running sum of the lengths). Its index is that element's, one of
 * the value's positions, as PyTorch's (which does not say which). */
ct_tensor *ct_mode(ct_tensor *x, int dim, bool keepdim, ct_tensor **indices) {
    const char *op = "ct_mode";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    int64_t n = x->ndim ? x->shape[d] : 1;
    if (n == 0)
        return cti_error_null(CT_ERR_SHAPE, "%s: cannot compute the mode over the zero-size dim "
                              "%d of %s", op, d, cti_desc(x));
    ct_scope *sc = ct_scope_begin();
    bool was_0d = x->ndim == 0;
    ct_tensor *x1 = at_least_1d(x), *si = NULL, *pos = NULL;
    ct_tensor *s = x1 ? ct_sort(x1, d, false, true, &si) : NULL;
    if (s) {
        bool prev = ct_no_grad_begin();
        int64_t shape[CT_MAX_DIMS];
        for (int i = 0; i < s->ndim; i++) shape[i] = i == d ? 1 : s->shape[i];
        ct_tensor *head = ct_tensor_full(s->ndim, shape, 1, CT_BOOL, dev(x));
        ct_tensor *a = head ? ct_narrow(s, d, 1, n - 1) : NULL;
        ct_tensor *b = a ? ct_narrow(s, d, 0, n - 1) : NULL;
        ct_tensor *ch = b ? ct_ne(a, b) : NULL;
        ct_tensor *parts[2] = {head, ch};
        ct_tensor *start = ch ? ct_cat(2, parts, d) : NULL;
        ct_tensor *gid = start ? ct_cumsum(start, d) : NULL;
        ct_tensor *g0 = gid ? ct_sub_scalar(gid, 1) : NULL;
        ct_tensor *zeros = g0 ? ct_tensor_zeros(s->ndim, s->shape, CT_I64, dev(x)) : NULL;
        ct_tensor *ones = zeros ? ct_tensor_full(s->ndim, s->shape, 1, CT_I64, dev(x)) : NULL;
        ct_tensor *len = ones ? ct_scatter_add(zeros, d, g0, ones) : NULL;
        ct_tensor *best = len ? ct_argmax(len, d, true) : NULL;
        ct_tensor *ends = best ? ct_cumsum(len, d) : NULL;
        ct_tensor *end = ends ? ct_gather(ends, d, best) : NULL;
        pos = end ? ct_sub_scalar(end, 1) : NULL;
        ct_no_grad_end(prev);
    }
    return pick_sorted(sc, s, si, d, pos, keepdim, was_0d, indices);
}

/* ---- nonzero / count_nonzero ----------------------------------------------------------------- */

/* The count of x's non-zero elements and their inclusive running count
 * (int64 [numel]) into *running; runs inside the caller's scope. */
static ct_status running_count(ct_tensor *x, int64_t numel, ct_tensor **running, int64_t *count) {
    ct_tensor *nz = ct_ne_scalar(x, 0);
    ct_tensor *flat = nz ? ct_reshape(nz, 1, &numel) : NULL;
    ct_tensor *cs = flat ? ct_cumsum(flat, 0) : NULL;
    ct_tensor *last = cs ? ct_select(cs, 0, numel - 1) : NULL;
    double v = 0;
    if (!last || ct_tensor_item(last, &v) != CT_OK) return ct_last_status();
    *running = cs;
    *count = (int64_t)v;
    return CT_OK;
}

ct_tensor *ct_nonzero(ct_tensor *x) {
    const char *op = "ct_nonzero";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    int nd = x->ndim;
    int64_t numel = cti_numel(nd, x->shape), count = 0;
    int64_t oshape[2] = {0, nd};
    if (numel == 0) return ct_tensor_empty(2, oshape, CT_I64, dev(x));
    ct_scope *sc = ct_scope_begin();
    ct_tensor *cs = NULL, *xc = NULL, *out = NULL;
    if (running_count(x, numel, &cs, &count) != CT_OK || !(xc = ct_contiguous(x)))
        return end_keep(sc, NULL);
    oshape[0] = count;
    ct_call c;
    cti_call_init(&c, CT_OP_NONZERO);
    c.in[0] = xc;
    c.in[1] = cs;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, 2, oshape, CT_I64, dev(x));
    c.nout = 1;
    if (!c.out[0]) return end_keep(sc, NULL);
    cti_sort_params p = {.outer = count, .n = numel, .ndim = nd};
    for (int i = 0; i < nd; i++) p.shape[i] = x->shape[i];
    cti_call_params(&c, &p);
    if (cti_run(&c, dev(x), x->dtype) == CT_OK) out = c.out[0];
    return end_keep(sc, out);
}

ct_tensor *ct_count_nonzero(ct_tensor *x, int ndims, const int64_t *dims) {
    if (cti_check_not_null("ct_count_nonzero", 1, &x)) return NULL;
    ct_tensor *nz = ct_ne_scalar(x, 0);
    if (!nz) return NULL;
    ct_tensor *out = ct_sum(nz, ndims, dims, false);
    ct_tensor_release(nz);
    if (!out) cti_error_wrap(CT_ERR_RUNTIME, "ct_count_nonzero");
    return out;
}

/* ---- all / any --------------------------------------------------------------------------------- */

/* all: no zero among the elements; any: some non-zero one. Counted with sum
 * of bools, which has an identity, so empty slices give PyTorch's true and
 * false. */
static ct_tensor *all_any(const char *op, bool all, ct_tensor *x, int ndims, const int64_t *dims,
                          bool keepdim) {
    if (cti_check_not_null(op, 1, &x)) return NULL;
    ct_scope *sc = ct_scope_begin();
    ct_tensor *hit = all ? ct_eq_scalar(x, 0) : ct_ne_scalar(x, 0);
    ct_tensor *n = hit ? ct_sum(hit, ndims, dims, keepdim) : NULL;
    ct_tensor *out = n ? (all ? ct_eq_scalar(n, 0) : ct_gt_scalar(n, 0)) : NULL;
    if (!out) cti_error_wrap(CT_ERR_RUNTIME, op);
    return end_keep(sc, out);
}

ct_tensor *ct_all(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return all_any("ct_all", true, x, ndims, dims, keepdim);
}

ct_tensor *ct_any(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return all_any("ct_any", false, x, ndims, dims, keepdim);
}

/* ---- logsumexp ----------------------------------------------------------------------------------- */

/* m + log(sum(exp(x - m))), m the slice's max (0 where it is infinite, so a
 * slice of -inf gives -inf and one with +inf gives +inf, not NaN). m is taken
 * without grad: the gradient of the whole is softmax(x) g either way, and
 * this way no tie split runs. */
ct_tensor *ct_logsumexp(ct_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    const char *op = "ct_logsumexp";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_LOGSUMEXP, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_logsumexp(ac.in[0], ndims, dims, keepdim) : NULL);
    ct_scope *sc = ct_scope_begin();
    ct_tensor *xf = ct_dtype_is_floating(x->dtype) ? x : ct_to_dtype(x, CT_F32);
    ct_tensor *out = NULL;
    if (!xf) return end_keep(sc, NULL);
    bool empty = cti_numel(x->ndim, x->shape) == 0;
    ct_tensor *m = NULL;
    if (!empty) {
        bool prev = ct_no_grad_begin();
        ct_tensor *mx = ct_amax(xf, ndims, dims, true);
        ct_tensor *inf = mx ? ct_abs(mx) : NULL;
        ct_tensor *isinf_ = inf ? ct_eq_scalar(inf, INFINITY) : NULL;
        ct_tensor *zero = isinf_ ? ct_tensor_scalar(0, mx->dtype, dev(mx)) : NULL;
        m = zero ? ct_where(isinf_, zero, mx) : NULL;
        ct_no_grad_end(prev);
        if (!m) {
            cti_error_wrap(CT_ERR_RUNTIME, op);
            return end_keep(sc, NULL);
        }
    }
    ct_tensor *sh = m ? ct_sub(xf, m) : xf;
    ct_tensor *e = sh ? ct_exp(sh) : NULL;
    ct_tensor *s = e ? ct_sum(e, ndims, dims, keepdim) : NULL;
    ct_tensor *l = s ? ct_log(s) : NULL;
    if (l && m) {
        ct_tensor *mr = ct_reshape(m, l->ndim, l->shape);
        out = mr ? ct_add(l, mr) : NULL;
    } else {
        out = l;
    }
    if (!out) cti_error_wrap(CT_ERR_RUNTIME, op);
    return end_keep(sc, out);
}

/* ---- cumprod ------------------------------------------------------------------------------------- */

ct_tensor *ct_cumprod(ct_tensor *x, int dim) {
    const char *op = "ct_cumprod";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_CUMPROD, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_cumprod(ac.in[0], dim) : NULL);
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    ct_dtype odt = ct_dtype_is_floating(x->dtype) ? x->dtype : CT_I64;
    ct_tensor *xc = ct_contiguous(x);
    if (!xc) return NULL;
    ct_call c;
    cti_call_init(&c, CT_OP_CUMPROD);
    c.in[0] = xc;
    c.nin = 1;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, odt, dev(x));
    c.nout = 1;
    ct_tensor *out = NULL;
    if (!c.out[0]) goto done;
    bool scalar = x->ndim == 0;
    cti_seq_params p = {.outer = scalar ? 1 : prod(x->shape, 0, d),
                        .n = scalar ? 1 : x->shape[d],
                        .inner = scalar ? 1 : prod(x->shape, d + 1, x->ndim),
                        .dim = d};
    cti_call_params(&c, &p);
    if (cti_run(&c, dev(x), x->dtype) != CT_OK) {
        cti_call_release_outputs(&c);
        goto done;
    }
    out = c.out[0];
    if (ct_dtype_is_floating(odt) && cti_ag_needed(1, &x) &&
        cti_ag_record(&(cti_ag_rec){.name = "CumprodBackward",
                                    .backward = cti_bw_cumprod,
                                    .nin = 1,
                                    .in = {x},
                                    .nout = 1,
                                    .out = {out},
                                    .nsaved = 2,
                                    .saved = {x, out},
                                    CTI_AG_PARAMS(&p)}) != CT_OK) {
        ct_tensor_release(out);
        out = NULL;
    }
done:
    ct_tensor_release(xc);
    return out;
}

/* ---- unique -------------------------------------------------------------------------------------- */

ct_tensor *ct_unique(ct_tensor *x, bool sorted, ct_tensor **inverse, ct_tensor **counts) {
    const char *op = "ct_unique";
    (void)sorted; /* the values always come out sorted, which sorted = false allows */
    if (cti_check_not_null(op, 1, &x)) return NULL;
    int64_t N = cti_numel(x->ndim, x->shape), zero = 0;
    ct_scope *sc = ct_scope_begin();
    bool prev = ct_no_grad_begin();
    ct_tensor *vals = NULL, *inv = NULL, *cnt = NULL;
    if (N == 0) {
        vals = ct_tensor_empty(1, &zero, x->dtype, dev(x));
        inv = ct_tensor_zeros(x->ndim, x->shape, CT_I64, dev(x));
        cnt = ct_tensor_empty(1, &zero, CT_I64, dev(x));
        goto done;
    }
    ct_tensor *flat = ct_reshape(x, 1, &N), *perm = NULL;
    ct_tensor *s = flat ? ct_sort(flat, 0, false, true, &perm) : NULL;
    /* start[i]: sorted element i begins a new value (NaN != NaN: each NaN does) */
    ct_tensor *start = NULL;
    if (s) {
        int64_t one = 1;
        ct_tensor *head = ct_tensor_full(1, &one, 1, CT_BOOL, dev(x));
        ct_tensor *a = head ? ct_narrow(s, 0, 1, N - 1) : NULL;
        ct_tensor *b = a ? ct_narrow(s, 0, 0, N - 1) : NULL;
        ct_tensor *ch = b ? ct_ne(a, b) : NULL;
        ct_tensor *parts[2] = {head, ch};
        start = ch ? ct_cat(2, parts, 0) : NULL;
    }
    ct_tensor *gid = start ? ct_cumsum(start, 0) : NULL; /* 1-based value number */
    ct_tensor *last = gid ? ct_select(gid, 0, N - 1) : NULL;
    double u = 0;
    if (!last || ct_tensor_item(last, &u) != CT_OK) goto done;
    int64_t U = (int64_t)u;
    ct_tensor *pos = ct_nonzero(start);
    ct_tensor *pos1 = pos ? ct_reshape(pos, 1, &U) : NULL;
    vals = pos1 ? ct_index_select(s, 0, pos1) : NULL;
    ct_tensor *g0 = vals ? ct_sub_scalar(gid, 1) : NULL;
    if (g0 && inverse) {
        ct_tensor *z = ct_tensor_zeros(1, &N, CT_I64, dev(x));
        ct_tensor *scat = z ? ct_scatter_add(z, 0, perm, g0) : NULL;
        inv = scat ? ct_reshape(scat, x->ndim, x->shape) : NULL;
        if (!inv) vals = NULL;
    }
    if (vals && counts) {
        ct_tensor *z = ct_tensor_zeros(1, &U, CT_I64, dev(x));
        ct_tensor *ones = z ? ct_tensor_full(1, &N, 1, CT_I64, dev(x)) : NULL;
        cnt = ones ? ct_scatter_add(z, 0, g0, ones) : NULL;
        if (!cnt) vals = NULL;
    }
done:
    ct_no_grad_end(prev);
    if (vals && inverse && !inv) vals = NULL;
    if (vals && counts && !cnt) vals = NULL;
    if (!vals) {
        cti_error_wrap(CT_ERR_RUNTIME, op);
        return end_keep(sc, NULL);
    }
    if (inverse) *inverse = ct_keep(inv);
    if (counts) *counts = ct_keep(cnt);
    return end_keep(sc, vals);
}
