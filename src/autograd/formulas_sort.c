/* Backward formulas of sort, cumprod (src/ops/sort.c) and amax/amin
 * (src/ops/reduce.c). The nodes keep their forward's params:
 *   sort:      in (x); saved the int64 indices; cti_sort_params dim, n. The
 *              gradient goes back to where each value came from.
 *   cumprod:   in (x); saved x and the result; cti_seq_params dim. PyTorch's
 *              derivative, zeros included (below).
 *   amax/amin: in (x); saved x and the result; cti_reduce_params mask,
 *              keepdim. The gradient is split evenly among the elements of
 *              each slice equal to its result (its NaNs when that is NaN).
 * Made of public ops, so they run on every device; float16/bfloat16 work in
 * float32 (the engine casts the gradient back). */
#include <math.h>

#include "formulas.h"

static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

#define SAVED(var, k)                                                                      \
    ct_status st_##var;                                                                    \
    ct_tensor *var = cti_ag_saved(n, k, &st_##var);                                        \
    if (st_##var != CT_OK) return st_##var

/* A new handle on t in float32 when t is float16/bfloat16, else on t. */
static ct_tensor *up(ct_tensor *t) {
    ct_dtype dt = ct_tensor_dtype(t);
    return ct_to_dtype(t, dt == CT_F16 || dt == CT_BF16 ? CT_F32 : dt);
}

static ct_tensor *scalar_like(ct_tensor *t, double v) {
    return t ? ct_tensor_scalar(v, ct_tensor_dtype(t), ct_tensor_device(t)) : NULL;
}

CTI_BW(cti_bw_sort) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_sort_params *p = CTI_NODE_PARAMS(n, cti_sort_params);
    SAVED(idx, 0);
    return put(&gi[0], ct_topk_backward(go[0], idx, p->dim, p->n));
}

/* y_i = prod_{j <= i} x_j, so dL/dx_k = sum_{i >= k} g_i prod_{j <= i, j != k} x_j.
 * Before the first zero of a line (x_k != 0 there): sum_{i >= k} g_i y_i / x_k,
 * a running sum from the end. At the first zero z: the same sum with x_z
 * taken as 1, i.e. sum_{i >= z} g_i cumprod(x with x_z = 1)_i. After it:
 * every term holds x_z = 0, so 0. */
CTI_BW(cti_bw_cumprod) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    int d = CTI_NODE_PARAMS(n, cti_seq_params)->dim;
    SAVED(x0, 0);
    SAVED(y0, 1);
    ct_tensor *x = up(x0), *y = x ? up(y0) : NULL, *g = y ? up(go[0]) : NULL;
    ct_tensor *one = scalar_like(g, 1.0), *zero = scalar_like(g, 0.0);
    ct_tensor *is0 = zero ? ct_eq_scalar(x, 0.0) : NULL;
    ct_tensor *zeros = is0 ? ct_cumsum(is0, d) : NULL; /* zeros up to and at each position */
    ct_tensor *before = zeros ? ct_eq_scalar(zeros, 0.0) : NULL;
    ct_tensor *at1 = before ? ct_eq_scalar(zeros, 1.0) : NULL;
    ct_tensor *first = at1 ? ct_logical_and(is0, at1) : NULL;
    ct_tensor *xs = first ? ct_where(before, x, one) : NULL;
    ct_tensor *gy = xs ? ct_mul(g, y) : NULL;
    ct_tensor *ry = gy ? ct_cumsum_backward(gy, d) : NULL;
    ct_tensor *a = ry ? ct_div(ry, xs) : NULL;
    ct_tensor *x1 = a ? ct_where(first, one, x) : NULL;
    ct_tensor *c1 = x1 ? ct_cumprod(x1, d) : NULL;
    ct_tensor *gc = c1 ? ct_mul(g, c1) : NULL;
    ct_tensor *b = gc ? ct_cumsum_backward(gc, d) : NULL;
    ct_tensor *at_first = b ? ct_where(first, b, zero) : NULL;
    return put(&gi[0], at_first ? ct_where(before, a, at_first) : NULL);
}

CTI_BW(cti_bw_amax) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_reduce_params *p = CTI_NODE_PARAMS(n, cti_reduce_params);
    SAVED(x, 0);
    SAVED(out, 1);
    int nd = n->in_ndim[0], nr = 0;
    int64_t shape[CT_MAX_DIMS], dims[CT_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        bool red = p->mask >> d & 1;
        shape[d] = red ? 1 : n->in_shape[0][d];
        if (red) dims[nr++] = d;
    }
    ct_tensor *gk = ct_reshape(go[0], nd, shape);
    ct_tensor *g = gk ? up(gk) : NULL;
    ct_tensor *ok = g ? ct_reshape(out, nd, shape) : NULL;
    ct_tensor *hit = ok ? ct_eq(x, ok) : NULL;
    ct_tensor *xnan = hit ? ct_ne(x, x) : NULL;
    ct_tensor *onan = xnan ? ct_ne(ok, ok) : NULL;
    ct_tensor *both = onan ? ct_logical_and(xnan, onan) : NULL;
    ct_tensor *mask = both ? ct_logical_or(hit, both) : NULL;
    ct_tensor *cnt = mask ? ct_sum(mask, nr, dims, true) : NULL;
    ct_tensor *share = cnt ? ct_div(g, cnt) : NULL;
    ct_tensor *zero = share ? scalar_like(share, 0.0) : NULL;
    return put(&gi[0], zero ? ct_where(mask, share, zero) : NULL);
}
