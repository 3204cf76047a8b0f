/* Front ends of the ops a decoder and its sampler need: tril/triu, cumsum,
 * topk and multinomial (schema.h, "tril, cumsum, topk, multinomial", holds
 * the kernels' contract). Kernels see contiguous rows: topk moves its dim
 * last (a copy only when it is not last already) and moves it back after. */
#include <math.h>

#include "ops_impl.h"
#include "tensor/ops.h"

static ct_device dev(const ct_tensor *t) { return t->storage->device; }

static int64_t prod(const int64_t *s, int a, int b) { return b > a ? cti_numel(b - a, s + a) : 1; }

/* Dispatches c on device with dtype; on failure releases the outputs. */
static ct_status run(ct_call *c, ct_device device, ct_dtype dt) {
    ct_status s = cti_run(c, device, dt);
    if (s != CT_OK) cti_call_release_outputs(c);
    return s;
}


ct_tensor *cti_dim_last(ct_tensor *t, int dim) {
    int last = t->ndim - 1;
    if (dim == last || t->ndim == 0) return ct_contiguous(t);
    ct_tensor *v = cti_transpose(t, dim, last);
    if (!v) return NULL;
    ct_tensor *c = ct_contiguous(v);
    ct_tensor_release(v);
    return c;
}

ct_tensor *cti_dim_back(ct_tensor *t, int dim) {
    if (!t) return NULL;
    int last = t->ndim - 1;
    if (dim == last || t->ndim == 0) return t;
    ct_tensor *v = cti_transpose(t, dim, last);
    ct_tensor *c = v ? ct_contiguous(v) : NULL;
    ct_tensor_release(v);
    ct_tensor_release(t);
    return c;
}

ct_status cti_select_call(const char *op, ct_op id, ct_tensor *x, int d, int64_t len,
                          ct_call *c, ct_tensor **xl, int64_t *outer) {
    int nd = x->ndim;
    int64_t oshape[CT_MAX_DIMS];
    for (int i = 0; i < nd; i++) oshape[i] = x->shape[i];
    if (nd) {
        oshape[d] = oshape[nd - 1];
        oshape[nd - 1] = len;
    }
    *outer = nd ? cti_numel(nd - 1, oshape) : 1;
    *xl = cti_dim_last(x, d);
    if (!*xl) return ct_last_status();
    cti_call_init(c, id);
    c->in[0] = *xl;
    c->nin = 1;
    c->nout = 2;
    c->out[0] = cti_tensor_new(op, nd, oshape, x->dtype, dev(x));
    c->out[1] = cti_tensor_new(op, nd, oshape, CT_I64, dev(x));
    if (c->out[0] && c->out[1]) return CT_OK;
    ct_status st = ct_last_status();
    cti_call_release_outputs(c);
    ct_tensor_release(*xl);
    *xl = NULL;
    return st;
}

ct_status cti_select_run(ct_call *c, ct_device device, ct_dtype dt, int d, ct_tensor **vals,
                         ct_tensor **idx) {
    *vals = *idx = NULL;
    ct_status st = run(c, device, dt);
    if (st != CT_OK) return st;
    *vals = cti_dim_back(c->out[0], d);
    *idx = cti_dim_back(c->out[1], d);
    if (*vals && *idx) return CT_OK;
    st = ct_last_status();
    ct_tensor_release(*vals);
    ct_tensor_release(*idx);
    *vals = *idx = NULL;
    return st;
}

/* ---- tril / triu ------------------------------------------------------------------------ */

static ct_tensor *triangle(const char *op, ct_op id, ct_tensor *x, int64_t diagonal) {
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (x->ndim < 2)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected a tensor of at least 2 dims, got %s", op,
                              cti_desc(x));
    ct_tensor *xc = ct_contiguous(x);
    if (!xc) return NULL;
    ct_call c;
    cti_call_init(&c, id);
    c.in[0] = xc;
    c.nin = 1;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x));
    c.nout = 1;
    ct_tensor *out = NULL;
    if (!c.out[0]) goto done;
    cti_seq_params p = {.outer = prod(x->shape, 0, x->ndim - 2),
                        .n = x->shape[x->ndim - 2],
                        .inner = x->shape[x->ndim - 1],
                        .diagonal = diagonal};
    cti_call_params(&c, &p);
    if (run(&c, dev(x), x->dtype) != CT_OK) goto done;
    out = cti_record_one(&(cti_ag_rec){.name = id == CT_OP_TRIL ? "TrilBackward" : "TriuBackward",
                               .backward = id == CT_OP_TRIL ? cti_bw_tril : cti_bw_triu,
                               .nin = 1,
                               .in = {x},
                               .nout = 1,
                               .out = {c.out[0]},
                               CTI_AG_PARAMS(&p)});
done:
    ct_tensor_release(xc);
    return out;
}

ct_tensor *ct_tril(ct_tensor *x, int64_t diagonal) {
    return triangle("ct_tril", CT_OP_TRIL, x, diagonal);
}

ct_tensor *ct_triu(ct_tensor *x, int64_t diagonal) {
    return triangle("ct_triu", CT_OP_TRIU, x, diagonal);
}

/* ---- cumsum -------------------------------------------------------------------------------- */

static ct_tensor *cumsum(const char *op, ct_tensor *x, int dim, bool reverse) {
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (reverse && cti_check_floating(op, x, "grad_y")) return NULL;
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    ct_dtype odt = ct_dtype_is_floating(x->dtype) ? x->dtype : CT_I64;
    ct_tensor *xc = ct_contiguous(x);
    if (!xc) return NULL;
    ct_call c;
    cti_call_init(&c, CT_OP_CUMSUM);
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
                        .dim = d,
                        .reverse = reverse};
    cti_call_params(&c, &p);
    if (run(&c, dev(x), x->dtype) != CT_OK) goto done;
    out = cti_record_one(&(cti_ag_rec){.name = reverse ? "CumsumBackwardBackward" : "CumsumBackward",
                               .backward = cti_bw_cumsum,
                               .nin = 1,
                               .in = {x},
                               .nout = 1,
                               .out = {c.out[0]},
                               CTI_AG_PARAMS(&p)});
done:
    ct_tensor_release(xc);
    return out;
}

ct_tensor *ct_cumsum(ct_tensor *x, int dim) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_CUMSUM, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_cumsum(ac.in[0], dim) : NULL);
    return cumsum("ct_cumsum", x, dim, false);
}

ct_tensor *ct_cumsum_backward(ct_tensor *grad_y, int dim) {
    return cumsum("ct_cumsum_backward", grad_y, dim, true);
}

/* ---- topk ------------------------------------------------------------------------------------- */

ct_tensor *ct_topk(ct_tensor *x, int64_t k, int dim, bool largest, bool sorted,
                   ct_tensor **indices) {
    const char *op = "ct_topk";
    (void)sorted; /* the result is always sorted, which PyTorch allows either way */
    if (cti_check_not_null(op, 1, &x)) return NULL;
    if (x->dtype == CT_BOOL)
        return cti_error_null(CT_ERR_DTYPE, "%s: bool input is not supported (got %s)", op,
                              cti_desc(x));
    int d = cti_wrap_dim(op, dim, x->ndim);
    if (d < 0) return NULL;
    int64_t n = x->ndim ? x->shape[d] : 1;
    if (k < 0 || k > n)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: k %lld is out of range for dim %d of size %lld (expected 0..%lld)",
                              op, (long long)k, d, (long long)n, (long long)n);
    if (x->ndim == 0 && k == 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: k 0 of a 0-d tensor has no shape", op);
    ct_tensor *xl, *vals = NULL, *idx = NULL, *out = NULL;
    int64_t outer;
    ct_call c;
    if (cti_select_call(op, CT_OP_TOPK, x, d, k, &c, &xl, &outer) != CT_OK) return NULL;
    cti_seq_params p = {.outer = outer, .n = n, .inner = 1, .k = k, .dim = d, .largest = largest};
    cti_call_params(&c, &p);
    if (cti_select_run(&c, dev(x), x->dtype, d, &vals, &idx) != CT_OK) goto done;
    out = cti_record_one(&(cti_ag_rec){.name = "TopkBackward",
                               .backward = cti_bw_topk,
                               .nin = 1,
                               .in = {x},
                               .nout = 1,
                               .out = {vals},
                               .nsaved = 1,
                               .saved = {idx},
                               CTI_AG_PARAMS(&p)});
    vals = NULL;
done:
    ct_tensor_release(vals);
    ct_tensor_release(xl);
    if (out && indices) *indices = idx;
    else ct_tensor_release(idx);
    return out;
}

ct_tensor *ct_topk_backward(ct_tensor *grad_values, ct_tensor *indices, int dim, int64_t size) {
    const char *op = "ct_topk_backward";
    ct_tensor *req[2] = {grad_values, indices};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req) ||
        cti_check_floating(op, grad_values, "grad_values"))
        return NULL;
    if (indices->dtype != CT_I64)
        return cti_error_null(CT_ERR_DTYPE, "%s: expected int64 indices, got %s", op,
                              ct_dtype_name(indices->dtype));
    bool same = indices->ndim == grad_values->ndim;
    for (int i = 0; same && i < indices->ndim; i++) same = indices->shape[i] == grad_values->shape[i];
    if (!same)
        return cti_error_null(CT_ERR_SHAPE, "%s: indices %s must have grad_values' shape %s", op,
                              cti_desc(indices), cti_desc(grad_values));
    int d = cti_wrap_dim(op, dim, grad_values->ndim);
    if (d < 0) return NULL;
    int nd = grad_values->ndim;
    int64_t k = nd ? grad_values->shape[d] : 1;
    if (size < k)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: size %lld is smaller than the %lld gradients along dim %d", op,
                              (long long)size, (long long)k, d);
    int64_t oshape[CT_MAX_DIMS];
    for (int i = 0; i < nd; i++) oshape[i] = grad_values->shape[i];
    if (nd) {
        oshape[d] = oshape[nd - 1];
        oshape[nd - 1] = size;
    } else if (size != 1) {
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: a 0-d gradient needs size 1, got %lld",
                              op, (long long)size);
    }
    ct_tensor *gl = cti_dim_last(grad_values, d), *il = gl ? cti_dim_last(indices, d) : NULL;
    ct_tensor *out = NULL;
    if (!gl || !il) goto done;
    ct_call c;
    cti_call_init(&c, CT_OP_TOPK_BACKWARD);
    c.in[0] = gl;
    c.in[1] = il;
    c.nin = 2;
    c.out[0] = cti_tensor_new(op, nd, oshape, grad_values->dtype, dev(grad_values));
    c.nout = 1;
    if (!c.out[0]) goto done;
    cti_seq_params p = {.outer = nd ? prod(oshape, 0, nd - 1) : 1, .n = size, .k = k, .dim = d};
    cti_call_params(&c, &p);
    if (run(&c, dev(grad_values), grad_values->dtype) != CT_OK) goto done;
    out = cti_dim_back(c.out[0], d);
done:
    ct_tensor_release(gl);
    ct_tensor_release(il);
    return out;
}

/* ---- multinomial ------------------------------------------------------------------------------ */

ct_tensor *ct_multinomial(ct_tensor *probs, int64_t num_samples, bool replacement,
                          ct_generator *gen) {
    const char *op = "ct_multinomial";
    if (cti_check_not_null(op, 1, &probs) || cti_check_floating(op, probs, "probs")) return NULL;
    if (probs->ndim != 1 && probs->ndim != 2)
        return cti_error_null(CT_ERR_SHAPE, "%s: probs must be 1-d or 2-d, got %s", op,
                              cti_desc(probs));
    int64_t rows = probs->ndim == 2 ? probs->shape[0] : 1, n = probs->shape[probs->ndim - 1];
    if (n == 0)
        return cti_error_null(CT_ERR_SHAPE, "%s: probs %s has no categories", op, cti_desc(probs));
    if (num_samples <= 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: num_samples must be positive, got %lld", op,
                              (long long)num_samples);
    if (!replacement && num_samples > n)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: cannot draw %lld samples without replacement from %lld "
                              "categories",
                              op, (long long)num_samples, (long long)n);
    if (rows > 0 && (uint64_t)num_samples > (UINT64_MAX / 4) / (uint64_t)rows / (uint64_t)n)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: %lld x %lld samples overflow the generator",
                              op, (long long)rows, (long long)num_samples);
    int64_t oshape[2] = {rows, num_samples};
    int ond = probs->ndim;
    const int64_t *os = ond == 2 ? oshape : oshape + 1;
    if (rows == 0) return ct_tensor_empty(ond, os, CT_I64, dev(probs));
    ct_tensor *pc = ct_contiguous(probs);
    if (!pc) return NULL;
    ct_call c;
    cti_call_init(&c, CT_OP_MULTINOMIAL);
    c.in[0] = pc;
    c.nin = 1;
    int64_t kshape[2] = {rows, n};
    c.out[0] = replacement ? cti_tensor_new(op, ond, os, CT_I64, dev(probs))
                           : cti_tensor_new(op, 2, kshape, CT_F64, dev(probs));
    c.nout = 1;
    ct_tensor *out = NULL;
    if (!c.out[0]) goto done;
    ct_generator *g = gen ? gen : ct_generator_default();
    uint64_t per_row = (uint64_t)(replacement ? num_samples : n);
    cti_seq_params p = {.outer = rows,
                        .n = n,
                        .inner = 1,
                        .k = num_samples,
                        .replacement = replacement,
                        .seed = ct_generator_seed(g)};
    p.offset = ct_generator_reserve(g, 2 * per_row * (uint64_t)rows);
    cti_call_params(&c, &p);
    if (run(&c, dev(probs), probs->dtype) != CT_OK) goto done;
    if (replacement) {
        out = c.out[0];
    } else {
        ct_tensor *idx = NULL;
        ct_tensor *top = ct_topk(c.out[0], num_samples, 1, true, true, &idx);
        ct_tensor_release(top);
        ct_tensor_release(c.out[0]);
        if (!idx) goto done;
        if (ond == 1) {
            out = ct_reshape(idx, 1, os);
            ct_tensor_release(idx);
        } else {
            out = idx;
        }
    }
done:
    ct_tensor_release(pc);
    return out;
}
