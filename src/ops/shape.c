/* Front ends of the indexing and shape ops of torch / torch.nn.functional:
 *
 *   kernels of their own   scatter, scatter_reduce (sum, prod, amax, amin; mean is
 *                          the sum over counts), flip / roll / repeat / pad
 *                          (one copy kernel, each with its own row),
 *                          interpolate and its backward op, unfold / fold
 *   made of other ops      index_add (scatter_add), index_put (scatter or
 *                          scatter_add on the leading dims flattened), take
 *                          and masked_select (index_select on the flattened
 *                          tensor), tile (repeat), unbind (select), diag
 *                          (scatter, or a copy of the diagonal view), one_hot
 *                          (scatter of ones)
 * The composite ops get their gradients from the formulas of the ops they
 * are made of; the others record nodes whose formulas are in
 * src/autograd/formulas_shape.c. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "ops_impl.h"
#include "tensor/ops.h"

/* ---- helpers ----------------------------------------------------------------------- */

static ct_device dev(const ct_tensor *t) { return t->storage->device; }

static int nd1(const ct_tensor *t) { return t->ndim > 0 ? t->ndim : 1; }


static void rel(ct_tensor *t) {
    if (t) ct_tensor_release(t);
}

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

static ct_status check_i64(const char *op, const ct_tensor *t, const char *name) {
    if (t->dtype == CT_I64) return CT_OK;
    return cti_error(CT_ERR_DTYPE, "%s: expected an int64 %s, got %s", op, name,
                     ct_dtype_name(t->dtype));
}

/* A host int64 tensor of t's values (contiguous), or NULL. */
static ct_tensor *host_i64(ct_tensor *t) {
    ct_tensor *h = ct_to_device(t, CT_CPU);
    ct_tensor *c = h ? ct_contiguous(h) : NULL;
    rel(h);
    return c;
}

/* Every entry of the int64 tensor idx lies in [lo, size); otherwise an
 * error naming op, the first bad entry in row-major order and the range.
 * On a GPU this waits for the device (one count read back). */
static ct_status check_range(const char *op, ct_tensor *idx, int64_t lo, int64_t size, int dim) {
    if (ct_tensor_numel(idx) == 0) return CT_OK;
    ct_tensor *a = ct_lt_scalar(idx, (double)lo), *b = ct_ge_scalar(idx, (double)size);
    ct_tensor *bad = a && b ? ct_logical_or(a, b) : NULL;
    ct_tensor *cnt = bad ? ct_sum(bad, 0, NULL, false) : NULL;
    double nbad = 0;
    ct_status s = cnt ? ct_tensor_item(cnt, &nbad) : ct_last_status();
    rel(a), rel(b), rel(bad), rel(cnt);
    if (s != CT_OK || nbad == 0) return s;
    ct_tensor *h = host_i64(idx);
    if (!h) return ct_last_status();
    const int64_t *v = (const int64_t *)cti_data(h);
    int64_t n = ct_tensor_numel(h), first = 0;
    for (int64_t k = 0; k < n; k++)
        if (v[k] < lo || v[k] >= size) {
            first = v[k];
            break;
        }
    rel(h);
    if (size <= 0)
        return cti_error(CT_ERR_INDEX,
                         "%s: index %lld is out of range for dim %d of size 0 (no index is valid)",
                         op, (long long)first, dim);
    return cti_error(CT_ERR_INDEX,
                     "%s: index %lld is out of range for dim %d of size %lld (expected %lld..%lld)",
                     op, (long long)first, dim, (long long)size, (long long)lo,
                     (long long)(size - 1));
}

/* idx with size added to its negative entries (a new tensor). */
static ct_tensor *wrap_negative(ct_tensor *idx, int64_t size) {
    ct_tensor *neg = ct_lt_scalar(idx, 0);
    ct_tensor *sz = ct_tensor_scalar((double)size, CT_I64, dev(idx));
    ct_tensor *sum = sz ? ct_add(idx, sz) : NULL;
    ct_tensor *w = neg && sum ? ct_where(neg, sum, idx) : NULL;
    rel(neg), rel(sz), rel(sum);
    return w;
}

/* ---- scatter, scatter_reduce ---------------------------------------------------------- */

/* The checks scatter_add makes: index int64 of x's ndim, fits x but along
 * dim, and fits src (when src is not NULL: src of x's dtype and ndim). */
static int scatter_checks(const char *op, ct_tensor *x, int dim, ct_tensor *index, ct_tensor *src) {
    ct_tensor *req[3] = {x, index, src};
    int n = src ? 3 : 2;
    if (cti_check_not_null(op, n, req) || cti_check_same_device(op, n, req) ||
        check_i64(op, index, "index"))
        return -1;
    if (nd1(index) != nd1(x)) {
        cti_error(CT_ERR_SHAPE, "%s: index %s must have as many dims as x %s", op,
                  cti_desc(index), cti_desc(x));
        return -1;
    }
    if (src && nd1(src) != nd1(x)) {
        cti_error(CT_ERR_SHAPE, "%s: src %s must have as many dims as x %s", op, cti_desc(src),
                  cti_desc(x));
        return -1;
    }
    if (src && src->dtype != x->dtype) {
        cti_error(CT_ERR_DTYPE, "%s: src has dtype %s but x has %s (expected equal dtypes)", op,
                  ct_dtype_name(src->dtype), ct_dtype_name(x->dtype));
        return -1;
    }
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0 || cti_check_index_fits(op, index, x, "x", d) || (src && cti_check_index_fits(op, index, src, "src", -1)))
        return -1;
    return d;
}

/* Dispatches id (SCATTER or SCATTER_REDUCE) into out, which holds x's
 * values: in x, index, src (all viewed 1-d where 0-d). */
static ct_status scatter_dispatch(ct_op id, ct_tensor *x, ct_tensor *index, ct_tensor *src,
                                  ct_tensor *out, const cti_scatter_params *p) {
    ct_tensor *t[4] = {x, index, src, out}, *v[4] = {NULL};
    ct_status s = CT_OK;
    for (int k = 0; k < 4 && s == CT_OK; k++)
        if (!(v[k] = as_1d(t[k]))) s = ct_last_status();
    if (s == CT_OK) {
        ct_call c;
        cti_call_init(&c, id);
        c.in[0] = v[0], c.in[1] = v[1], c.in[2] = v[2];
        c.nin = 3;
        c.out[0] = v[3];
        c.nout = 1;
        cti_call_params(&c, p);
        s = cti_run(&c, dev(x), x->dtype);
    }
    for (int k = 0; k < 4; k++) drop_view(v[k], t[k]);
    return s;
}

/* A 0-d value of x's dtype expanded to index's shape (stride 0). */
static ct_tensor *value_src(ct_tensor *x, ct_tensor *index, double value) {
    ct_tensor *v = ct_tensor_scalar(value, x->dtype, dev(x));
    if (!v) return NULL;
    int64_t st[CT_MAX_DIMS] = {0};
    ct_tensor *e = cti_tensor_view(v, index->ndim, index->shape, st, v->offset);
    rel(v);
    return e;
}

/* A copy of x, then id into it; out or NULL. */
static ct_tensor *scatter_into_copy(const char *op, ct_op id, ct_tensor *x, ct_tensor *index,
                                    ct_tensor *src, const cti_scatter_params *p) {
    ct_tensor *out = cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x));
    if (!out) return NULL;
    /* The copy is part of the op, which its caller records as a whole. */
    bool prev = ct_no_grad_begin();
    ct_status cs = ct_copy_(out, x);
    ct_no_grad_end(prev);
    if (cs != CT_OK || scatter_dispatch(id, x, index, src, out, p) != CT_OK) {
        rel(out);
        return NULL;
    }
    return out;
}

ct_tensor *ct_scatter(ct_tensor *x, int dim, ct_tensor *index, ct_tensor *src) {
    const char *op = "ct_scatter";
    int d = scatter_checks(op, x, dim, index, src ? src : NULL);
    if (!src && d >= 0) return cti_error_null(CT_ERR_INVALID_ARG, "%s: src is NULL", op);
    if (d < 0) return NULL;
    cti_scatter_params p = {.dim = d, .size = x->ndim ? x->shape[d] : 1,
                            .reduce = CTI_SCATTER_ASSIGN};
    ct_tensor *out = scatter_into_copy(op, CT_OP_SCATTER, x, index, src, &p);
    return cti_record_one(&(cti_ag_rec){.name = "ScatterBackward",
                                .backward = cti_bw_scatter,
                                .nin = 2,
                                .in = {x, src},
                                .nout = 1,
                                .out = {out},
                                .nsaved = 1,
                                .saved = {index},
                                CTI_AG_PARAMS(&p)});
}

ct_tensor *ct_scatter_value(ct_tensor *x, int dim, ct_tensor *index, double value) {
    const char *op = "ct_scatter_value";
    int d = scatter_checks(op, x, dim, index, NULL);
    if (d < 0 || cti_check_scalar_fits(op, value, x->dtype)) return NULL;
    cti_scatter_params p = {.dim = d, .size = x->ndim ? x->shape[d] : 1,
                            .reduce = CTI_SCATTER_ASSIGN};
    ct_tensor *src = value_src(x, index, value);
    ct_tensor *out = src ? scatter_into_copy(op, CT_OP_SCATTER, x, index, src, &p) : NULL;
    rel(src);
    return cti_record_one(&(cti_ag_rec){.name = "ScatterBackward",
                                .backward = cti_bw_scatter,
                                .nin = 1,
                                .in = {x},
                                .nout = 1,
                                .out = {out},
                                .nsaved = 1,
                                .saved = {index},
                                CTI_AG_PARAMS(&p)});
}

/* a / b rounded down, for integer a and b >= 1 (b of a's dtype), through
 * float64: trunc, then one less where that overshot. */
static ct_tensor *floor_divide(ct_tensor *a, ct_tensor *b) {
    ct_tensor *af = ct_to_dtype(a, CT_F64), *bf = ct_to_dtype(b, CT_F64);
    ct_tensor *q = af && bf ? ct_div(af, bf) : NULL;
    ct_tensor *t = q ? ct_to_dtype(q, a->dtype) : NULL;
    ct_tensor *tf = t ? ct_to_dtype(t, CT_F64) : NULL;
    ct_tensor *over = tf ? ct_gt(tf, q) : NULL;
    ct_tensor *oi = over ? ct_to_dtype(over, a->dtype) : NULL;
    ct_tensor *r = oi ? ct_sub(t, oi) : NULL;
    rel(af), rel(bf), rel(q), rel(t), rel(tf), rel(over), rel(oi);
    return r;
}

ct_tensor *ct_scatter_reduce(ct_tensor *x, int dim, ct_tensor *index, ct_tensor *src,
                             const char *reduce, bool include_self) {
    const char *op = "ct_scatter_reduce";
    int d = scatter_checks(op, x, dim, index, src);
    if (!src && d >= 0) return cti_error_null(CT_ERR_INVALID_ARG, "%s: src is NULL", op);
    if (d < 0) return NULL;
    int r;
    bool mean = false;
    if (!reduce) return cti_error_null(CT_ERR_INVALID_ARG, "%s: reduce is NULL", op);
    if (!strcmp(reduce, "sum")) r = CTI_SCATTER_SUM;
    else if (!strcmp(reduce, "mean")) r = CTI_SCATTER_SUM, mean = true;
    else if (!strcmp(reduce, "amax")) r = CTI_SCATTER_AMAX;
    else if (!strcmp(reduce, "amin")) r = CTI_SCATTER_AMIN;
    else if (!strcmp(reduce, "prod")) r = CTI_SCATTER_PROD;
    else
        return cti_error_null(
            CT_ERR_INVALID_ARG,
            "%s: reduce must be \"sum\", \"prod\", \"mean\", \"amax\" or \"amin\", got \"%s\"", op,
            reduce);
    if (mean && x->dtype == CT_BOOL)
        return cti_error_null(CT_ERR_DTYPE, "%s: reduce \"mean\" takes no bool tensors", op);
    cti_scatter_params p = {.dim = d, .size = x->ndim ? x->shape[d] : 1, .reduce = r,
                            .from_reduce = true};
    ct_tensor *out = cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x));
    if (!out) return NULL;
    bool prev = ct_no_grad_begin(); /* part of the op, recorded as a whole */
    ct_status s = ct_copy_(out, x);
    ct_no_grad_end(prev);
    if (s == CT_OK && !include_self) {
        /* the positions index reaches start from 0 (sum), 1 (prod) or
         * from one of the values they reduce (amax, amin: src itself
         * assigned first) */
        cti_scatter_params pa = p;
        pa.reduce = CTI_SCATTER_ASSIGN;
        ct_tensor *v = r == CTI_SCATTER_SUM    ? value_src(x, index, 0)
                       : r == CTI_SCATTER_PROD ? value_src(x, index, 1)
                                               : src;
        s = v ? scatter_dispatch(CT_OP_SCATTER, x, index, v, out, &pa) : ct_last_status();
        drop_view(v, src);
    }
    if (s == CT_OK) s = scatter_dispatch(CT_OP_SCATTER_REDUCE, x, index, src, out, &p);
    ct_tensor *count = NULL;
    if (s == CT_OK && mean) {
        /* count in x's dtype, as PyTorch's: how many values each element
         * averages, at least 1 */
        ct_tensor *base = ct_tensor_full(x->ndim, x->shape, include_self ? 1 : 0, x->dtype, dev(x));
        ct_tensor *ones = ct_tensor_full(index->ndim, index->shape, 1, x->dtype, dev(x));
        ct_tensor *c = base && ones ? ct_scatter_add(base, d, index, ones) : NULL;
        count = c ? ct_maximum_scalar(c, 1) : NULL;
        ct_tensor *q = count ? (ct_dtype_is_floating(x->dtype) ? ct_div(out, count)
                                                               : floor_divide(out, count))
                             : NULL;
        rel(base), rel(ones), rel(c);
        rel(out);
        out = q;
        if (!q) s = ct_last_status();
    }
    if (s != CT_OK) {
        rel(out);
        rel(count);
        return NULL;
    }
    cti_scatter_reduce_params rp = {.p = p, .mean = mean, .include_self = include_self};
    ct_tensor *res = cti_record_one(&(cti_ag_rec){.name = "ScatterReduceBackward",
                                          .backward = cti_bw_scatter_reduce,
                                          .nin = 2,
                                          .in = {x, src},
                                          .nout = 1,
                                          .out = {out},
                                          .nsaved = 5,
                                          .saved = {index, x, src, out, count},
                                          CTI_AG_PARAMS(&rp)});
    rel(count);
    return res;
}

/* ---- index_add, index_put, take, masked_select -------------------------------------------------- */

/* index (1-d or 0-d, int64 or int32) as int64 [1, .., n, .., 1] (n at d)
 * expanded to shape (nd dims). */
static ct_tensor *expanded_index(ct_tensor *index, int d, int nd, const int64_t *shape) {
    int64_t vs[CT_MAX_DIMS];
    for (int k = 0; k < nd; k++) vs[k] = k == d ? ct_tensor_numel(index) : 1;
    ct_tensor *i64 = ct_to_dtype(index, CT_I64);
    ct_tensor *iv = i64 ? ct_reshape(i64, nd, vs) : NULL;
    ct_tensor *ie = iv ? ct_expand(iv, nd, shape) : NULL;
    rel(i64), rel(iv);
    return ie;
}

ct_tensor *ct_index_add(ct_tensor *x, int dim, ct_tensor *index, ct_tensor *source,
                        double alpha) {
    const char *op = "ct_index_add";
    ct_tensor *req[3] = {x, index, source};
    if (cti_check_not_null(op, 3, req) || cti_check_same_device(op, 3, req)) return NULL;
    if (index->dtype != CT_I64 && index->dtype != CT_I32)
        return cti_error_null(CT_ERR_DTYPE, "%s: expected an int64 or int32 index, got %s", op,
                              ct_dtype_name(index->dtype));
    if (index->ndim > 1)
        return cti_error_null(CT_ERR_SHAPE, "%s: index must be 0-d or 1-d, got %s", op,
                              cti_desc(index));
    if (source->dtype != x->dtype)
        return cti_error_null(CT_ERR_DTYPE,
                              "%s: source has dtype %s but x has %s (expected equal dtypes)", op,
                              ct_dtype_name(source->dtype), ct_dtype_name(x->dtype));
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    int nd = nd1(x);
    int64_t n = ct_tensor_numel(index);
    bool ok = nd1(source) == nd;
    for (int k = 0; ok && k < nd; k++) {
        int64_t want = k == d ? n : (x->ndim ? x->shape[k] : 1);
        ok = (source->ndim ? source->shape[k] : 1) == want;
    }
    if (!ok)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: source %s must have x's shape %s with dim %d of the index's "
                              "length %lld",
                              op, cti_desc(source), cti_desc(x), d, (long long)n);
    if (ct_dtype_is_floating(x->dtype) ? cti_check_scalar_fits(op, alpha, x->dtype) != CT_OK
                                       : (alpha != floor(alpha) &&
                                          cti_error(CT_ERR_INVALID_ARG,
                                                    "%s: alpha %g must be an integer for %s", op,
                                                    alpha, ct_dtype_name(x->dtype))))
        return NULL;
    ct_tensor *i64 = ct_to_dtype(index, CT_I64);
    ct_status s = i64 ? check_range(op, i64, 0, x->ndim ? x->shape[d] : 1, d) : ct_last_status();
    rel(i64);
    if (s != CT_OK) return NULL;
    /* x 0-d and source 0-d: [1] views, the result reshaped back */
    ct_tensor *x1 = x->ndim ? x : ct_reshape(x, 1, (int64_t[]){1});
    ct_tensor *s1 = source->ndim ? source : ct_reshape(source, 1, (int64_t[]){1});
    ct_tensor *src = NULL;
    if (x1 && s1) {
        if (alpha == 1) {
            src = s1;
        } else {
            ct_tensor *a = ct_tensor_scalar(alpha, x->dtype, dev(x));
            src = a ? ct_mul(s1, a) : NULL;
            rel(a);
        }
    }
    ct_tensor *ie = src ? expanded_index(index, d, nd, s1->shape) : NULL;
    ct_tensor *r = ie ? ct_scatter_add(x1, d, ie, src) : NULL;
    rel(ie);
    drop_view(src, s1);
    if (s1 && s1 != source) rel(s1);
    if (x1 && x1 != x) rel(x1);
    if (r && x->ndim == 0) {
        ct_tensor *r0 = ct_reshape(r, 0, NULL);
        rel(r);
        r = r0;
    }
    return r;
}

/* index_put over the leading n dims, every index an int64 tensor. */
static ct_tensor *index_put_core(ct_tensor *x, int n, ct_tensor *const *indices,
                                 ct_tensor *values, bool accumulate) {
    const char *op = "ct_index_put";
    if (values->dtype != x->dtype)
        return cti_error_null(CT_ERR_DTYPE,
                              "%s: values have dtype %s but x has %s (expected equal dtypes)", op,
                              ct_dtype_name(values->dtype), ct_dtype_name(x->dtype));
    int bn = 0;
    int64_t bs[CT_MAX_DIMS] = {0};
    for (int j = 0; j < n; j++) {
        ct_tensor *t[2] = {x, indices[j]};
        if (cti_check_same_device(op, 2, t) || check_i64(op, indices[j], "index")) return NULL;
        int nb;
        int64_t nbs[CT_MAX_DIMS];
        if (cti_broadcast_shapes(op, bn, bs, indices[j]->ndim, indices[j]->shape, &nb, nbs))
            return NULL;
        bn = nb;
        memcpy(bs, nbs, sizeof bs);
    }
    int rest = x->ndim - n;
    if (bn + rest > CT_MAX_DIMS)
        return cti_error_null(CT_ERR_SHAPE, "%s: the indexed shape has more than %d dims", op,
                              CT_MAX_DIMS);
    /* the flat position of each index tuple in the leading n dims */
    ct_tensor *lin = NULL;
    int64_t P = 1;
    for (int j = n - 1; j >= 0; j--) {
        int64_t size = x->shape[j];
        if (check_range(op, indices[j], -size, size, j)) {
            rel(lin);
            return NULL;
        }
        ct_tensor *w = wrap_negative(indices[j], size);
        ct_tensor *m = ct_tensor_scalar((double)P, CT_I64, dev(x));
        ct_tensor *wm = w && m ? ct_mul(w, m) : NULL;
        ct_tensor *nl = wm ? (lin ? ct_add(lin, wm) : wm) : NULL;
        rel(w), rel(m), rel(lin);
        if (nl != wm) rel(wm);
        lin = nl;
        if (!lin) return NULL;
        P *= size;
    }
    int64_t M = cti_numel(bn, bs);
    int64_t vshape[CT_MAX_DIMS], fshape[CT_MAX_DIMS], xshape[CT_MAX_DIMS];
    memcpy(vshape, bs, sizeof(int64_t) * (size_t)bn);
    memcpy(vshape + bn, x->shape + n, sizeof(int64_t) * (size_t)rest);
    fshape[0] = M, xshape[0] = P;
    memcpy(fshape + 1, x->shape + n, sizeof(int64_t) * (size_t)rest);
    memcpy(xshape + 1, x->shape + n, sizeof(int64_t) * (size_t)rest);
    /* values broadcast to the indexed shape, which they may not enlarge */
    bool fits = values->ndim <= bn + rest;
    for (int k = 0; fits && k < values->ndim; k++) {
        int64_t vsz = values->shape[values->ndim - 1 - k], want = vshape[bn + rest - 1 - k];
        fits = vsz == want || vsz == 1;
    }
    if (!fits) {
        rel(lin);
        return cti_error_null(CT_ERR_SHAPE, "%s: values %s do not broadcast to the indexed shape %s",
                              op, cti_desc(values), cti_shape_s(bn + rest, vshape));
    }
    ct_tensor *le = ct_expand(lin, bn, bs);
    ct_tensor *lf = le ? ct_reshape(le, 1, &M) : NULL;
    ct_tensor *ve = ct_expand(values, bn + rest, vshape);
    ct_tensor *vf = ve ? ct_reshape(ve, rest + 1, fshape) : NULL;
    ct_tensor *xv = ct_reshape(x, rest + 1, xshape);
    int64_t ls[CT_MAX_DIMS], lst[CT_MAX_DIMS] = {0};
    for (int k = 0; k <= rest; k++) ls[k] = fshape[k];
    ct_tensor *ie = NULL;
    if (lf) {
        lst[0] = lf->stride[0];
        ie = cti_tensor_view(lf, rest + 1, ls, lst, lf->offset);
    }
    ct_tensor *r = NULL;
    if (ie && vf && xv)
        r = accumulate ? ct_scatter_add(xv, 0, ie, vf) : ct_scatter(xv, 0, ie, vf);
    ct_tensor *out = r ? ct_reshape(r, x->ndim, x->shape) : NULL;
    rel(lin), rel(le), rel(lf), rel(ve), rel(vf), rel(xv), rel(ie), rel(r);
    return out;
}

/* PyTorch's indices tuple, made of int64 index tensors only for index_put_core: a NULL
 * entry (a full slice, Python's `:`) becomes an arange over its dim, and a bool mask of m
 * dims becomes the m int64 columns of its nonzero. Advanced indexing lays the result out
 * as broadcast(indices) where the index tensors sit next to each other, with the slices'
 * dims before and after it, and else broadcast(indices) first, then the slices' dims in
 * order; each entry is reshaped to its place in that layout (the slices as
 * [1, .., size, .., 1], the tensors as their broadcast dims), so that the leading dims'
 * index tensors broadcast to exactly the indexed shape. */
static ct_tensor *index_put_general(const char *op, ct_tensor *x, int n,
                                    ct_tensor *const *indices, ct_tensor *values,
                                    bool accumulate) {
    ct_tensor *ent[CT_MAX_DIMS] = {0}, *own[CT_MAX_DIMS] = {0}, *full[CT_MAX_DIMS] = {0};
    ct_tensor *r = NULL;
    int ne = 0, nown = 0;
    for (int j = 0; j < n; j++) {
        ct_tensor *t = indices[j];
        if (!t) {
            if (ne >= x->ndim) goto too_many;
            ent[ne++] = NULL;
            continue;
        }
        ct_tensor *pair[2] = {x, t};
        if (cti_check_same_device(op, 2, pair)) goto done;
        if (t->dtype != CT_BOOL) {
            if (check_i64(op, t, "index or bool mask")) goto done;
            if (ne >= x->ndim) goto too_many;
            ent[ne++] = t;
            continue;
        }
        if (t->ndim == 0) {
            cti_error(CT_ERR_SHAPE, "%s: indices[%d] is a 0-d bool mask; expected a mask of "
                                    "the indexed dims' shape", op, j);
            goto done;
        }
        if (ne + t->ndim > x->ndim) goto too_many;
        for (int k = 0; k < t->ndim; k++)
            if (t->shape[k] != x->shape[ne + k]) {
                cti_error(CT_ERR_SHAPE,
                          "%s: the shape of the mask %s at index %d does not match the shape "
                          "of the indexed tensor %s at index %d",
                          op, cti_desc(t), k, cti_desc(x), ne + k);
                goto done;
            }
        ct_tensor *nz = ct_nonzero(t);
        if (!nz) goto done;
        for (int k = 0; k < t->ndim; k++) {
            ct_tensor *col = ct_select(nz, 1, k);
            if (!col) {
                rel(nz);
                goto done;
            }
            own[nown++] = col;
            ent[ne++] = col;
        }
        rel(nz);
    }
    while (ne > 1 && !ent[ne - 1]) ne--; /* trailing slices are the rest dims */
    if (ne == 0) ne = 1;                 /* x[...] = values: dim 0 sliced */
    int first = -1, last = -1, nslice = 0, bn = 0;
    int64_t bs[CT_MAX_DIMS] = {0};
    for (int p = 0; p < ne; p++) {
        if (!ent[p]) {
            nslice++;
            continue;
        }
        if (first < 0) first = p;
        last = p;
        int nb;
        int64_t nbs[CT_MAX_DIMS];
        if (cti_broadcast_shapes(op, bn, bs, ent[p]->ndim, ent[p]->shape, &nb, nbs)) goto done;
        bn = nb;
        memcpy(bs, nbs, sizeof bs);
    }
    bool together = true;
    for (int p = first; first >= 0 && p <= last; p++) together = together && ent[p];
    const int rank = bn + nslice;
    if (rank + (x->ndim - ne) > CT_MAX_DIMS) {
        cti_error(CT_ERR_SHAPE, "%s: the indexed shape has more than %d dims", op, CT_MAX_DIMS);
        goto done;
    }
    /* where the broadcast dims start in the layout, and each slice's place */
    const int sat = first < 0 ? 0 : together ? first : 0;
    int next = 0;
    for (int p = 0; p < ne; p++) {
        int64_t shape[CT_MAX_DIMS];
        for (int k = 0; k < rank; k++) shape[k] = 1;
        if (!ent[p]) {
            int at = next < sat ? next : next + bn;
            next++;
            shape[at] = x->shape[p];
            ct_tensor *ar = ct_tensor_arange(0, (double)x->shape[p], 1, CT_I64, dev(x));
            full[p] = ar ? ct_reshape(ar, rank, shape) : NULL;
            rel(ar);
        } else {
            /* the caller's tensor is only viewed: a release of it here would take the
             * place of its scope's */
            for (int k = 0; k < ent[p]->ndim; k++)
                shape[sat + bn - ent[p]->ndim + k] = ent[p]->shape[k];
            full[p] = ct_reshape(ent[p], rank, shape);
        }
        if (!full[p]) goto done;
    }
    r = index_put_core(x, ne, full, values, accumulate);
    goto done;
too_many:
    cti_error(CT_ERR_INDEX, "%s: too many indices for x %s (%d dims)", op, cti_desc(x), x->ndim);
done:
    for (int k = 0; k < CT_MAX_DIMS; k++) rel(full[k]);
    for (int k = 0; k < nown; k++) rel(own[k]);
    return r;
}

ct_tensor *ct_index_put(ct_tensor *x, int n, ct_tensor *const *indices, ct_tensor *values,
                        bool accumulate) {
    const char *op = "ct_index_put";
    ct_tensor *req[2] = {x, values};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req)) return NULL;
    /* every entry covers one dim at least */
    if (n < 1 || n > x->ndim || !indices)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: expected 1..%d index tensors (or NULL slices) for x %s, got %d",
                              op, x->ndim, cti_desc(x), n);
    bool plain = true;
    for (int j = 0; plain && j < n; j++) plain = indices[j] && indices[j]->dtype != CT_BOOL;
    if (plain) return index_put_core(x, n, indices, values, accumulate);
    return index_put_general(op, x, n, indices, values, accumulate);
}

/* x flattened, read at the int64 positions idx (checked, wrapped), in
 * idx's shape. */
static ct_tensor *take_flat(const char *op, ct_tensor *x, ct_tensor *idx, bool wrap) {
    int64_t n = ct_tensor_numel(x), m = ct_tensor_numel(idx);
    if (wrap && check_range(op, idx, -n, n, 0)) return NULL;
    ct_tensor *w = wrap ? wrap_negative(idx, n) : idx;
    ct_tensor *wf = w ? ct_reshape(w, 1, &m) : NULL;
    ct_tensor *xf = ct_reshape(x, 1, &n);
    ct_tensor *sel = wf && xf ? ct_index_select(xf, 0, wf) : NULL;
    ct_tensor *out = sel ? ct_reshape(sel, idx->ndim, idx->shape) : NULL;
    drop_view(w, idx);
    rel(wf), rel(xf), rel(sel);
    return out;
}

ct_tensor *ct_take(ct_tensor *x, ct_tensor *index) {
    const char *op = "ct_take";
    ct_tensor *req[2] = {x, index};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req) ||
        check_i64(op, index, "index"))
        return NULL;
    return take_flat(op, x, index, true);
}

ct_tensor *ct_masked_select(ct_tensor *x, ct_tensor *mask) {
    const char *op = "ct_masked_select";
    ct_tensor *req[2] = {x, mask};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req)) return NULL;
    if (mask->dtype != CT_BOOL)
        return cti_error_null(CT_ERR_DTYPE, "%s: expected a bool mask, got %s", op,
                              ct_dtype_name(mask->dtype));
    int bn;
    int64_t bs[CT_MAX_DIMS];
    if (cti_broadcast_shapes(op, x->ndim, x->shape, mask->ndim, mask->shape, &bn, bs)) return NULL;
    ct_tensor *xe = ct_expand(x, bn, bs), *me = ct_expand(mask, bn, bs);
    ct_tensor *mh = me ? ct_to_device(me, CT_CPU) : NULL;
    ct_tensor *mc = mh ? ct_contiguous(mh) : NULL;
    ct_tensor *out = NULL;
    if (xe && mc) {
        int64_t n = ct_tensor_numel(mc), m = 0;
        const uint8_t *mv = (const uint8_t *)cti_data(mc);
        for (int64_t k = 0; k < n; k++) m += mv[k] != 0;
        int64_t *pos = malloc(sizeof(int64_t) * (size_t)(m > 0 ? m : 1));
        if (!pos) {
            cti_error(CT_ERR_OOM, "%s: out of memory for %lld positions", op, (long long)m);
        } else {
            for (int64_t k = 0, j = 0; k < n; k++)
                if (mv[k]) pos[j++] = k;
            ct_tensor *idx = ct_tensor_from_data_on(pos, CT_I64, 1, &m, dev(x));
            free(pos);
            out = idx ? take_flat(op, xe, idx, false) : NULL;
            rel(idx);
        }
    }
    rel(xe), rel(me), rel(mh), rel(mc);
    return out;
}

/* ---- flip, roll, repeat, tile, pad ---------------------------------------------------------------- */

/* Runs id on x into a new contiguous tensor of oshape (x's ndim, or [1] for
 * 0-d x), after merging neighbouring dims that are plain copies (IDENT, lo
 * 0, equal sizes) and contiguous in x, so the kernels see few dims. */
ct_tensor *cti_remap_run(const char *op, ct_op id, ct_tensor *x, const int64_t *oshape,
                         const cti_remap_params *p) {
    ct_tensor *out = cti_tensor_new(op, x->ndim, oshape, x->dtype, dev(x));
    if (!out || ct_tensor_numel(out) == 0) return out;
    int nd = nd1(x);
    int64_t xs[CT_MAX_DIMS], xst[CT_MAX_DIMS], os[CT_MAX_DIMS];
    for (int k = 0; k < nd; k++) {
        xs[k] = x->ndim ? x->shape[k] : 1;
        xst[k] = x->ndim ? x->stride[k] : 1;
        os[k] = x->ndim ? oshape[k] : 1;
    }
    cti_remap_params q = {.value = p->value};
    int64_t cxs[CT_MAX_DIMS], cxst[CT_MAX_DIMS], cos_[CT_MAX_DIMS];
    int cn = 0;
    for (int k = 0; k < nd; k++) {
        bool plain = p->mode[k] == CTI_REMAP_IDENT && p->lo[k] == 0 && xs[k] == os[k];
        bool prev_plain = cn > 0 && q.mode[cn - 1] == CTI_REMAP_IDENT && q.lo[cn - 1] == 0 &&
                          cxs[cn - 1] == cos_[cn - 1];
        if (plain && prev_plain && cxst[cn - 1] == xst[k] * xs[k]) {
            cxs[cn - 1] *= xs[k];
            cos_[cn - 1] *= xs[k];
            cxst[cn - 1] = xst[k];
            continue;
        }
        cxs[cn] = xs[k], cxst[cn] = xst[k], cos_[cn] = os[k];
        q.mode[cn] = p->mode[k], q.lo[cn] = p->lo[k];
        cn++;
    }
    q.nd = cn;
    int64_t ost[CT_MAX_DIMS];
    cti_contiguous_strides(cn, cos_, ost);
    ct_tensor *xv = cti_tensor_view(x, cn, cxs, cxst, x->offset);
    ct_tensor *ov = cti_tensor_view(out, cn, cos_, ost, out->offset);
    ct_status s = xv && ov ? CT_OK : ct_last_status();
    if (s == CT_OK) {
        ct_call c;
        cti_call_init(&c, id);
        c.in[0] = xv;
        c.nin = 1;
        c.out[0] = ov;
        c.nout = 1;
        cti_call_params(&c, &q);
        s = cti_run(&c, dev(x), x->dtype);
    }
    rel(xv), rel(ov);
    if (s != CT_OK) {
        rel(out);
        return NULL;
    }
    return out;
}

static ct_tensor *remap_recorded(const char *op, ct_op id, ct_tensor *x, const int64_t *oshape,
                                 const cti_remap_params *p, const char *node, cti_backward_fn bw) {
    ct_tensor *out = cti_remap_run(op, id, x, oshape, p);
    return cti_record_one(&(cti_ag_rec){.name = node,
                                .backward = bw,
                                .nin = 1,
                                .in = {x},
                                .nout = 1,
                                .out = {out},
                                CTI_AG_PARAMS(p)});
}

/* dims (ndims of them) wrapped into *seen as bits; repeated dims fail
 * unless allow_repeat. */
static ct_status wrap_dims(const char *op, const ct_tensor *x, int ndims, const int64_t *dims,
                           bool allow_repeat, int *wrapped) {
    uint32_t seen = 0;
    for (int k = 0; k < ndims; k++) {
        if (dims[k] < INT_MIN || dims[k] > INT_MAX)
            return cti_error(CT_ERR_INDEX, "%s: dim %lld is out of range for %s", op,
                             (long long)dims[k], cti_desc(x));
        int d = cti_wrap_dim(op, (int)dims[k], x->ndim);
        if (d < 0) return ct_last_status();
        if (!allow_repeat && (seen >> d & 1))
            return cti_error(CT_ERR_INVALID_ARG, "%s: dim %d appears more than once in dims", op,
                             d);
        seen |= 1u << d;
        wrapped[k] = d;
    }
    return CT_OK;
}

ct_tensor *ct_flip(ct_tensor *x, int ndims, const int64_t *dims) {
    const char *op = "ct_flip";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (ndims < 0 || ndims > CT_MAX_DIMS || (ndims > 0 && !dims))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: expected 0..%d dims, got %d%s", op,
                              CT_MAX_DIMS, ndims, ndims > 0 && !dims ? " and NULL dims" : "");
    int w[CT_MAX_DIMS];
    if (wrap_dims(op, x, ndims, dims, false, w)) return NULL;
    cti_remap_params p = {.nd = nd1(x)};
    for (int k = 0; k < ndims; k++)
        if (x->ndim) p.mode[w[k]] = CTI_REMAP_FLIP;
    return remap_recorded(op, CT_OP_FLIP, x, x->shape, &p, "FlipBackward", cti_bw_flip);
}

ct_tensor *ct_roll(ct_tensor *x, int nshifts, const int64_t *shifts, int ndims,
                   const int64_t *dims) {
    const char *op = "ct_roll";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (!shifts || nshifts < 1 || ndims < 0 || ndims > CT_MAX_DIMS || (ndims > 0 && !dims))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: expected shifts and dims, got %d shifts, "
                                                  "%d dims", op, nshifts, ndims);
    if (ndims == 0) {
        if (nshifts != 1)
            return cti_error_null(CT_ERR_INVALID_ARG,
                                  "%s: without dims, expected one shift, got %d", op, nshifts);
        /* the flattened tensor rolled, then given x's shape back */
        int64_t n = ct_tensor_numel(x), zero = 0;
        ct_tensor *f = ct_reshape(x, 1, &n);
        ct_tensor *r = f ? ct_roll(f, 1, shifts, 1, &zero) : NULL;
        ct_tensor *out = r ? ct_reshape(r, x->ndim, x->shape) : NULL;
        rel(f), rel(r);
        return out;
    }
    if (nshifts != ndims)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: shifts and dims must have the same length, got %d and %d", op,
                              nshifts, ndims);
    int w[CT_MAX_DIMS];
    if (wrap_dims(op, x, ndims, dims, true, w)) return NULL;
    cti_remap_params p = {.nd = nd1(x)};
    for (int k = 0; k < ndims; k++) {
        int64_t n = x->ndim ? x->shape[w[k]] : 1;
        if (n == 0) continue;
        p.mode[w[k]] = CTI_REMAP_WRAP;
        p.lo[w[k]] = ((p.lo[w[k]] + shifts[k] % n) % n + n) % n;
    }
    return remap_recorded(op, CT_OP_ROLL, x, x->shape, &p, "RollBackward", cti_bw_roll);
}

ct_tensor *ct_repeat(ct_tensor *x, int n, const int64_t *repeats) {
    const char *op = "ct_repeat";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (!repeats || n < x->ndim || n > CT_MAX_DIMS)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: the number of repeats (%d) must be >= the number of dims of "
                              "%s and <= %d",
                              op, n, cti_desc(x), CT_MAX_DIMS);
    int lead = n - x->ndim;
    int64_t xs[CT_MAX_DIMS], st[CT_MAX_DIMS], os[CT_MAX_DIMS];
    cti_remap_params p = {.nd = n > 0 ? n : 1};
    for (int k = 0; k < n; k++) {
        xs[k] = k < lead ? 1 : x->shape[k - lead];
        st[k] = k < lead ? 0 : x->stride[k - lead];
        if (repeats[k] < 0)
            return cti_error_null(CT_ERR_INVALID_ARG, "%s: repeats must be >= 0, got %lld at %d",
                                  op, (long long)repeats[k], k);
        if (xs[k] > 0 && repeats[k] > INT64_MAX / xs[k])
            return cti_error_null(CT_ERR_OVERFLOW, "%s: %lld repeats of dim %d of %s overflow",
                                  op, (long long)repeats[k], k, cti_desc(x));
        os[k] = xs[k] * repeats[k];
        if (repeats[k] != 1) p.mode[k] = CTI_REMAP_WRAP;
    }
    ct_tensor *xv = n > x->ndim ? cti_tensor_view(x, n, xs, st, x->offset) : x;
    if (!xv) return NULL;
    ct_tensor *out = cti_remap_run(op, CT_OP_REPEAT, xv, os, &p);
    if (xv != x) rel(xv);
    cti_repeat_params rp = {.n = n};
    memcpy(rp.repeats, repeats, sizeof(int64_t) * (size_t)n);
    return cti_record_one(&(cti_ag_rec){.name = "RepeatBackward",
                                .backward = cti_bw_repeat,
                                .nin = 1,
                                .in = {x},
                                .nout = 1,
                                .out = {out},
                                CTI_AG_PARAMS(&rp)});
}

ct_tensor *ct_tile(ct_tensor *x, int n, const int64_t *reps) {
    const char *op = "ct_tile";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (!reps || n < 0 || n > CT_MAX_DIMS)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: expected 0..%d reps, got %d%s", op,
                              CT_MAX_DIMS, n, reps ? "" : " (NULL)");
    int64_t r[CT_MAX_DIMS];
    int m = n >= x->ndim ? n : x->ndim;
    for (int k = 0; k < m; k++) r[k] = k < m - n ? 1 : reps[k - (m - n)];
    return ct_repeat(x, m, r);
}

ct_tensor *ct_pad(ct_tensor *x, int npad, const int64_t *pad, ct_pad_mode mode, double value) {
    const char *op = "ct_pad";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (!pad || npad < 0 || npad % 2 || npad / 2 > x->ndim)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: expected an even number of pad sizes, at most 2 per dim of %s, "
                              "got %d",
                              op, cti_desc(x), npad);
    int np = npad / 2;
    static const char *names[] = {"constant", "reflect", "replicate", "circular"};
    if ((unsigned)mode > CT_PAD_CIRCULAR)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: unknown mode %d", op, (int)mode);
    if (mode == CT_PAD_CONSTANT) {
        if (cti_check_scalar_fits(op, value, x->dtype)) return NULL;
    } else if (np < 1 || np > 3 || (x->ndim != np + 1 && x->ndim != np + 2)) {
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: %s padding of %d dims expects a %d-d or %d-d input, got %s "
                              "(1 to 3 padded dims)",
                              op, names[mode], np, np + 1, np + 2, cti_desc(x));
    }
    int64_t os[CT_MAX_DIMS];
    cti_remap_params p = {.nd = nd1(x), .value = mode == CT_PAD_CONSTANT ? value : 0};
    memcpy(os, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    for (int j = 0; j < np; j++) {
        int d = x->ndim - 1 - j;
        int64_t l = pad[2 * j], r = pad[2 * j + 1], n = x->shape[d];
        if (mode != CT_PAD_CONSTANT) {
            bool bad = l < 0 || r < 0;
            if (mode == CT_PAD_REFLECT) bad = bad || l >= n || r >= n;
            if (mode == CT_PAD_CIRCULAR) bad = bad || l > n || r > n;
            if (mode == CT_PAD_REPLICATE) bad = bad || n == 0;
            if (bad)
                return cti_error_null(CT_ERR_INVALID_ARG,
                                      "%s: %s padding (%lld, %lld) of dim %d of %s is out of range "
                                      "(expected %s)",
                                      op, names[mode], (long long)l, (long long)r, d, cti_desc(x),
                                      mode == CT_PAD_REFLECT    ? "0 <= pad < the dim's size"
                                      : mode == CT_PAD_CIRCULAR ? "0 <= pad <= the dim's size"
                                                                : "pad >= 0 and a non-empty dim");
        }
        if ((l > 0 && n > INT64_MAX - l) || (r > 0 && n + l > INT64_MAX - r))
            return cti_error_null(CT_ERR_OVERFLOW, "%s: padding of dim %d of %s overflows", op, d,
                                  cti_desc(x));
        os[d] = n + l + r;
        if (os[d] < 0)
            return cti_error_null(CT_ERR_SHAPE,
                                  "%s: padding (%lld, %lld) leaves dim %d of %s with size %lld "
                                  "(expected >= 0)",
                                  op, (long long)l, (long long)r, d, cti_desc(x),
                                  (long long)os[d]);
        p.lo[d] = l;
        p.mode[d] = mode == CT_PAD_CONSTANT    ? CTI_REMAP_IDENT
                    : mode == CT_PAD_REFLECT   ? CTI_REMAP_REFLECT
                    : mode == CT_PAD_REPLICATE ? CTI_REMAP_CLAMP
                                               : CTI_REMAP_WRAP;
    }
    return remap_recorded(op, CT_OP_PAD, x, os, &p, "PadBackward", cti_bw_pad);
}

/* ---- unbind, diag, one_hot ------------------------------------------------------------------------ */

ct_status ct_unbind(ct_tensor *x, int dim, int max_out, ct_tensor **out, int *n_out) {
    const char *op = "ct_unbind";
    if (!x) return cti_error(CT_ERR_INVALID_ARG, "%s: x is NULL", op);
    if (!n_out) return cti_error(CT_ERR_INVALID_ARG, "%s: n_out is NULL", op);
    if (x->ndim == 0)
        return cti_error(CT_ERR_SHAPE, "%s: expected at least a 1-d tensor, got %s", op,
                         cti_desc(x));
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return ct_last_status();
    int64_t n = x->shape[d];
    if (n > INT_MAX)
        return cti_error(CT_ERR_OVERFLOW, "%s: %lld pieces of %s exceed INT_MAX", op,
                         (long long)n, cti_desc(x));
    if (out) {
        if (max_out < n)
            return cti_error(CT_ERR_INVALID_ARG, "%s: %lld pieces of %s do not fit in max_out %d",
                             op, (long long)n, cti_desc(x), max_out);
        for (int64_t k = 0; k < n; k++) {
            if (!(out[k] = ct_select(x, d, k))) {
                for (int64_t j = 0; j < k; j++) {
                    ct_tensor_release(out[j]);
                    out[j] = NULL;
                }
                return ct_last_status();
            }
            cti_ag_mark_multi_output(out[k], op); /* not written in place, as in PyTorch */
        }
    }
    *n_out = (int)n;
    return CT_OK;
}

ct_tensor *ct_diag(ct_tensor *x, int64_t diagonal) {
    const char *op = "ct_diag";
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (x->ndim == 2) {
        ct_tensor *v = ct_diagonal(x, diagonal, 0, 1);
        ct_tensor *c = v ? ct_clone(v) : NULL;
        rel(v);
        return c;
    }
    if (x->ndim != 1)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected a 1-d or 2-d tensor, got %s", op,
                              cti_desc(x));
    int64_t n = x->shape[0], k = diagonal < 0 ? -diagonal : diagonal;
    if (diagonal == INT64_MIN || n > (int64_t)3037000499 - k)
        return cti_error_null(CT_ERR_OVERFLOW, "%s: diagonal %lld of %s overflows", op,
                              (long long)diagonal, cti_desc(x));
    int64_t m = n + k, mm = m * m;
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (!pos) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    for (int64_t i = 0; i < n; i++)
        pos[i] = diagonal >= 0 ? i * m + i + diagonal : (i - diagonal) * m + i;
    ct_tensor *idx = ct_tensor_from_data_on(pos, CT_I64, 1, &n, dev(x));
    free(pos);
    ct_tensor *z = idx ? ct_tensor_zeros(1, &mm, x->dtype, dev(x)) : NULL;
    ct_tensor *s = z ? ct_scatter(z, 0, idx, x) : NULL;
    int64_t sq[2] = {m, m};
    ct_tensor *out = s ? ct_reshape(s, 2, sq) : NULL;
    rel(idx), rel(z), rel(s);
    return out;
}

ct_tensor *ct_one_hot(ct_tensor *x, int64_t num_classes) {
    const char *op = "ct_one_hot";
    if (cti_check_not_null(op, 1, &x) || check_i64(op, x, "tensor")) return NULL;
    if (x->ndim == CT_MAX_DIMS)
        return cti_error_null(CT_ERR_SHAPE, "%s: %s has no room for the class dim", op,
                              cti_desc(x));
    if (num_classes < -1)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: num_classes must be >= -1, got %lld", op,
                              (long long)num_classes);
    int64_t n = ct_tensor_numel(x);
    if (num_classes == -1) {
        if (n == 0)
            return cti_error_null(CT_ERR_INVALID_ARG,
                                  "%s: cannot infer the number of classes of an empty tensor", op);
        ct_tensor *mx = ct_max(x);
        double v = 0;
        ct_status s = mx ? ct_tensor_item(mx, &v) : ct_last_status();
        rel(mx);
        if (s != CT_OK) return NULL;
        num_classes = (int64_t)v + 1;
    }
    if (check_range(op, x, 0, num_classes, x->ndim)) return NULL;
    int64_t os[CT_MAX_DIMS];
    memcpy(os, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    os[x->ndim] = num_classes;
    ct_tensor *z = ct_tensor_zeros(x->ndim + 1, os, CT_I64, dev(x));
    ct_tensor *u = ct_unsqueeze(x, x->ndim);
    ct_tensor *out = z && u ? ct_scatter_value(z, x->ndim, u, 1) : NULL;
    rel(z), rel(u);
    return out;
}

/* ---- interpolate ----------------------------------------------------------------------------------- */

ct_tensor *cti_interpolate_backward(ct_tensor *grad_out, const cti_interp_params *p) {
    const char *op = "ct_interpolate_backward";
    ct_tensor *g = ct_contiguous(grad_out);
    if (!g) return NULL;
    int64_t shape[4] = {p->N, p->C, p->H, p->W};
    ct_tensor *out = cti_tensor_new(op, 4, shape, g->dtype, dev(g));
    ct_call c;
    cti_call_init(&c, CT_OP_INTERPOLATE_BACKWARD);
    c.in[0] = g;
    c.nin = 1;
    c.out[0] = out;
    c.nout = 1;
    cti_call_params(&c, p);
    if (out && cti_run(&c, dev(g), g->dtype) != CT_OK) {
        rel(out);
        out = NULL;
    }
    rel(g);
    return out;
}

/* The kernel's op: x [N, C, H, W], mode NEAREST or BILINEAR (size / scale_factor of
 * H and W, one of them non-NULL, checked by the caller). */
static ct_tensor *interpolate_2d(const char *op, ct_tensor *x, const int64_t *size,
                                 const double *scale_factor, ct_interp_mode mode,
                                 bool align_corners) {
    cti_interp_params p = {.N = x->shape[0], .C = x->shape[1], .H = x->shape[2],
                           .W = x->shape[3], .mode = (int)mode, .align_corners = align_corners};
    if (size) {
        p.OH = size[0], p.OW = size[1];
    } else {
        for (int k = 0; k < 2; k++)
            if (!(scale_factor[k] > 0) || !isfinite(scale_factor[k]))
                return cti_error_null(CT_ERR_INVALID_ARG,
                                      "%s: scale_factor must be positive and finite, got %g", op,
                                      scale_factor[k]);
        double oh = floor((double)p.H * scale_factor[0]), ow = floor((double)p.W * scale_factor[1]);
        if (oh > 9.2e18 || ow > 9.2e18)
            return cti_error_null(CT_ERR_OVERFLOW, "%s: scale_factor %g, %g overflows the size",
                                  op, scale_factor[0], scale_factor[1]);
        p.OH = (int64_t)oh, p.OW = (int64_t)ow;
        p.scale_h = scale_factor[0], p.scale_w = scale_factor[1];
    }
    if (p.OH <= 0 || p.OW <= 0 || p.H <= 0 || p.W <= 0)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: input %s and output size [%lld, %lld] must be non-empty in H "
                              "and W",
                              op, cti_desc(x), (long long)p.OH, (long long)p.OW);
    ct_tensor *xc = ct_contiguous(x);
    if (!xc) return NULL;
    int64_t shape[4] = {p.N, p.C, p.OH, p.OW};
    ct_tensor *out = cti_tensor_new(op, 4, shape, x->dtype, dev(x));
    ct_call c;
    cti_call_init(&c, CT_OP_INTERPOLATE);
    c.in[0] = xc;
    c.nin = 1;
    c.out[0] = out;
    c.nout = 1;
    cti_call_params(&c, &p);
    if (out && cti_run(&c, dev(x), x->dtype) != CT_OK) {
        rel(out);
        out = NULL;
    }
    rel(xc);
    return cti_record_one(&(cti_ag_rec){.name = mode == CT_INTERP_NEAREST ? "UpsampleNearest2DBackward"
                                                                  : "UpsampleBilinear2DBackward",
                                .backward = cti_bw_interpolate,
                                .nin = 1,
                                .in = {x},
                                .nout = 1,
                                .out = {out},
                                CTI_AG_PARAMS(&p)});
}

static const char *const interp_names[4] = {"nearest", "bilinear", "linear", "trilinear"};

/* x [N, C, D, H, W] interpolated along D alone: D made the last dim, the rest folded into
 * the channels, and each [1, D] plane interpolated by the 2-d kernel along its W (its H of
 * one maps to itself exactly, where a large H or W would not: the kernel computes source
 * coordinates in float); sf_d > 0 is the user's scale factor for D. */
static ct_tensor *interpolate_depth(const char *op, ct_tensor *x, int64_t od, double sf_d,
                                    ct_interp_mode kmode, bool align) {
    const int64_t N = x->shape[0], C = x->shape[1], D = x->shape[2], H = x->shape[3],
                  W = x->shape[4];
    ct_tensor *pt = ct_permute(x, 5, (int64_t[]){0, 1, 3, 4, 2});
    ct_tensor *v = pt ? ct_reshape(pt, 4, (int64_t[]){N, C * H * W, 1, D}) : NULL;
    ct_tensor *y = v ? interpolate_2d(op, v, sf_d > 0 ? NULL : (int64_t[]){1, od},
                                      sf_d > 0 ? (double[]){1, sf_d} : NULL, kmode, align)
                     : NULL;
    ct_tensor *y5 = y ? ct_reshape(y, 5, (int64_t[]){N, C, H, W, y->shape[3]}) : NULL;
    ct_tensor *back = y5 ? ct_permute(y5, 5, (int64_t[]){0, 1, 4, 2, 3}) : NULL;
    ct_tensor *r = back ? ct_contiguous(back) : NULL;
    rel(pt), rel(v), rel(y), rel(y5), rel(back);
    return r;
}

ct_tensor *ct_interpolate(ct_tensor *x, const int64_t *size, const double *scale_factor,
                          ct_interp_mode mode, bool align_corners) {
    const char *op = "ct_interpolate";
    if (cti_check_not_null(op, 1, &x) || cti_check_floating(op, x, "x")) return NULL;
    if (x->ndim < 3 || x->ndim > 5)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: expected a 3-d [N, C, L], 4-d [N, C, H, W] or 5-d [N, C, D, H, "
                              "W] input, got %s",
                              op, cti_desc(x));
    if ((unsigned)mode > CT_INTERP_TRILINEAR)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: unknown mode %d", op, (int)mode);
    const int sd = x->ndim - 2;                  /* spatial dims */
    static const int dims_of[4] = {0, 2, 1, 3}; /* spatial dims, by mode */
    if (mode != CT_INTERP_NEAREST && dims_of[mode] != sd)
        return cti_error_null(CT_ERR_SHAPE, "%s: got a %d-d input %s, but mode %s needs a %d-d input",
                              op, x->ndim, cti_desc(x), interp_names[mode], dims_of[mode] + 2);
    if (!size == !scale_factor)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: expected exactly one of size and scale_factor", op);
    if (mode == CT_INTERP_NEAREST && align_corners)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: align_corners can only be set with the interpolating modes "
                              "linear, bilinear and trilinear",
                              op);
    const ct_interp_mode kmode = mode == CT_INTERP_NEAREST ? CT_INTERP_NEAREST : CT_INTERP_BILINEAR;
    if (sd == 2) return interpolate_2d(op, x, size, scale_factor, kmode, align_corners);
    if (sd == 1) { /* [N, C, L] as [N, C, 1, L] */
        const int64_t N = x->shape[0], C = x->shape[1], L = x->shape[2];
        ct_tensor *v = ct_reshape(x, 4, (int64_t[]){N, C, 1, L});
        ct_tensor *y = v ? interpolate_2d(op, v, size ? (int64_t[]){1, size[0]} : NULL,
                                          scale_factor ? (double[]){1, scale_factor[0]} : NULL,
                                          kmode, align_corners)
                         : NULL;
        ct_tensor *r = y ? ct_reshape(y, 3, (int64_t[]){N, C, y->shape[3]}) : NULL;
        rel(v), rel(y);
        return r;
    }
    /* [N, C, D, H, W]: the weights of trilinear (and nearest) are products of one weight
     * per dim, so H and W go first (D folded into the channels), then D. */
    const int64_t N = x->shape[0], C = x->shape[1], D = x->shape[2], H = x->shape[3],
                  W = x->shape[4];
    if (scale_factor && (!(scale_factor[0] > 0) || !isfinite(scale_factor[0])))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: scale_factor must be positive and finite, got %g", op,
                              scale_factor[0]);
    int64_t od = size ? size[0] : (int64_t)fmin(floor((double)D * scale_factor[0]), 9.2e18);
    if (od <= 0 || D <= 0)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: input %s and output size %lld must be non-empty in D", op,
                              cti_desc(x), (long long)od);
    ct_tensor *v = ct_reshape(x, 4, (int64_t[]){N, C * D, H, W});
    ct_tensor *y = v ? interpolate_2d(op, v, size ? size + 1 : NULL,
                                      scale_factor ? scale_factor + 1 : NULL, kmode, align_corners)
                     : NULL;
    ct_tensor *y5 = y ? ct_reshape(y, 5, (int64_t[]){N, C, D, y->shape[2], y->shape[3]}) : NULL;
    ct_tensor *r = y5 ? interpolate_depth(op, y5, od, scale_factor ? scale_factor[0] : 0, kmode,
                                          align_corners)
                      : NULL;
    rel(v), rel(y), rel(y5);
    return r;
}

/* ---- unfold, fold ----------------------------------------------------------------------------------- */

static ct_status fold_args(const char *op, const int64_t *k, const int64_t *d, const int64_t *pd,
                           const int64_t *s, cti_fold_params *p) {
    if (!k || !d || !pd || !s)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: kernel_size, dilation, padding and stride must not be NULL", op);
    for (int j = 0; j < 2; j++) {
        if (k[j] <= 0 || d[j] <= 0 || s[j] <= 0 || pd[j] < 0 || k[j] > INT32_MAX ||
            d[j] > INT32_MAX || s[j] > INT32_MAX || pd[j] > INT32_MAX)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: expected kernel_size, dilation, stride > 0 and padding >= 0 (each "
                             "below 2^31), got kernel (%lld, %lld), dilation (%lld, %lld), padding "
                             "(%lld, %lld), stride (%lld, %lld)",
                             op, (long long)k[0], (long long)k[1], (long long)d[0],
                             (long long)d[1], (long long)pd[0], (long long)pd[1], (long long)s[0],
                             (long long)s[1]);
        p->kernel[j] = k[j], p->dilation[j] = d[j], p->padding[j] = pd[j], p->stride[j] = s[j];
    }
    return CT_OK;
}

/* The blocks along H and W of p's image size; false (error) when none. */
static bool blocks_of(const char *op, cti_fold_params *p) {
    int64_t size[2] = {p->H, p->W}, nb[2];
    for (int j = 0; j < 2; j++) {
        int64_t span = p->dilation[j] * (p->kernel[j] - 1) + 1;
        int64_t room = size[j] + 2 * p->padding[j] - span;
        nb[j] = room < 0 ? 0 : room / p->stride[j] + 1;
    }
    p->OH = nb[0], p->OW = nb[1];
    if (nb[0] > 0 && nb[1] > 0) return true;
    cti_error(CT_ERR_SHAPE,
              "%s: the image [%lld, %lld] padded by (%lld, %lld) holds no block of kernel (%lld, "
              "%lld) with dilation (%lld, %lld)",
              op, (long long)p->H, (long long)p->W, (long long)p->padding[0],
              (long long)p->padding[1], (long long)p->kernel[0], (long long)p->kernel[1],
              (long long)p->dilation[0], (long long)p->dilation[1]);
    return false;
}

/* Runs id on x (made contiguous) into a new tensor of shape. */
static ct_tensor *fold_run(const char *op, ct_op id, ct_tensor *x, int nd, const int64_t *shape,
                           const cti_fold_params *p) {
    ct_tensor *xc = ct_contiguous(x);
    if (!xc) return NULL;
    ct_tensor *out = cti_tensor_new(op, nd, shape, x->dtype, dev(x));
    ct_call c;
    cti_call_init(&c, id);
    c.in[0] = xc;
    c.nin = 1;
    c.out[0] = out;
    c.nout = 1;
    cti_call_params(&c, p);
    if (out && cti_run(&c, dev(x), x->dtype) != CT_OK) {
        rel(out);
        out = NULL;
    }
    rel(xc);
    return out;
}

ct_tensor *ct_unfold(ct_tensor *x, const int64_t kernel_size[2], const int64_t dilation[2],
                     const int64_t padding[2], const int64_t stride[2]) {
    const char *op = "ct_unfold";
    if (cti_check_not_null(op, 1, &x) || cti_check_floating(op, x, "x")) return NULL;
    if (x->ndim != 3 && x->ndim != 4)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected a 3-d or 4-d input, got %s", op,
                              cti_desc(x));
    cti_fold_params p = {0};
    if (fold_args(op, kernel_size, dilation, padding, stride, &p)) return NULL;
    bool batched = x->ndim == 4;
    p.N = batched ? x->shape[0] : 1;
    p.C = x->shape[x->ndim - 3], p.H = x->shape[x->ndim - 2], p.W = x->shape[x->ndim - 1];
    if (!blocks_of(op, &p)) return NULL;
    int64_t kk = p.kernel[0] * p.kernel[1];
    if (p.C > INT64_MAX / kk)
        return cti_error_null(CT_ERR_OVERFLOW, "%s: %s with kernel (%lld, %lld) overflows", op,
                              cti_desc(x), (long long)p.kernel[0], (long long)p.kernel[1]);
    int64_t shape[3] = {p.N, p.C * kk, p.OH * p.OW};
    ct_tensor *out = fold_run(op, CT_OP_UNFOLD, x, batched ? 3 : 2, batched ? shape : shape + 1, &p);
    return cti_record_one(&(cti_ag_rec){.name = "Im2ColBackward",
                                .backward = cti_bw_unfold,
                                .nin = 1,
                                .in = {x},
                                .nout = 1,
                                .out = {out},
                                CTI_AG_PARAMS(&p)});
}

ct_tensor *ct_fold(ct_tensor *x, const int64_t output_size[2], const int64_t kernel_size[2],
                   const int64_t dilation[2], const int64_t padding[2], const int64_t stride[2]) {
    const char *op = "ct_fold";
    if (cti_check_not_null(op, 1, &x) || cti_check_floating(op, x, "x")) return NULL;
    if (x->ndim != 2 && x->ndim != 3)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected a 2-d or 3-d input, got %s", op,
                              cti_desc(x));
    cti_fold_params p = {0};
    if (fold_args(op, kernel_size, dilation, padding, stride, &p)) return NULL;
    if (!output_size || output_size[0] <= 0 || output_size[1] <= 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: output_size must be two sizes > 0", op);
    bool batched = x->ndim == 3;
    int64_t kk = p.kernel[0] * p.kernel[1], ck = x->shape[x->ndim - 2];
    p.N = batched ? x->shape[0] : 1;
    p.H = output_size[0], p.W = output_size[1];
    if (ck % kk)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: dim %d of %s must be a multiple of kernel_size's product %lld",
                              op, x->ndim - 2, cti_desc(x), (long long)kk);
    p.C = ck / kk;
    if (!blocks_of(op, &p)) return NULL;
    if (p.OH * p.OW != x->shape[x->ndim - 1])
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: %s holds %lld blocks, but output_size (%lld, %lld) gives %lld "
                              "(%lld x %lld)",
                              op, cti_desc(x), (long long)x->shape[x->ndim - 1],
                              (long long)p.H, (long long)p.W, (long long)(p.OH * p.OW),
                              (long long)p.OH, (long long)p.OW);
    int64_t shape[4] = {p.N, p.C, p.H, p.W};
    ct_tensor *out = fold_run(op, CT_OP_FOLD, x, batched ? 4 : 3, batched ? shape : shape + 1, &p);
    return cti_record_one(&(cti_ag_rec){.name = "Col2ImBackward",
                                .backward = cti_bw_fold,
                                .nin = 1,
                                .in = {x},
                                .nout = 1,
                                .out = {out},
                                CTI_AG_PARAMS(&p)});
}
