/* Backward formulas of the reductions (src/ops/reduce.c).
 *
 * Every node has the one input x and keeps the forward call's
 * cti_reduce_params, whose mask holds the reduced dims of x. Saved tensors
 * and the other params read:
 *   sum, mean:      nothing
 *   prod:           saved[0] x
 *   var:            saved[0] x; correction
 *   std:            saved[0] x, saved[1] the result; correction
 *   norm:           saved[0] x, saved[1] the result; p
 *   max/min (all):  saved[0] x, saved[1] the result
 *   max/min (dim):  saved[0] the int64 indices
 * They follow PyTorch's derivatives (prod with zeros, the subgradient 0 of
 * the norms at 0, the even split of max/min among ties), built from public
 * ops so they run on every device. The gradient and the result are first
 * brought to x's rank (size 1 at the reduced dims) so they broadcast against
 * x. float16/bfloat16 are computed in float32 (the engine casts back). */
#include <math.h>

#include "formulas.h"

/* ---- helpers ----------------------------------------------------------------------- */

static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

#define SAVED(var, k)                                                                      \
    ct_status st_##var;                                                                    \
    ct_tensor *var = cti_ag_saved(n, k, &st_##var);                                        \
    if (st_##var != CT_OK) return st_##var

static const cti_reduce_params *params_of(const cti_node *n) {
    return CTI_NODE_PARAMS(n, cti_reduce_params);
}

/* Whether the forward reduced dim d of x. */
static bool is_reduced(const cti_node *n, int d) { return params_of(n)->mask >> d & 1; }

/* The reduced dims of x as a list; returns their count. */
static int reduced_dims(const cti_node *n, int64_t *dims) {
    int k = 0;
    for (int d = 0; d < n->in_ndim[0]; d++)
        if (is_reduced(n, d)) dims[k++] = d;
    return k;
}

/* Number of elements each output element reduced. */
static int64_t reduced_count(const cti_node *n) {
    /* cti_numel: 0 with a zero among them, saturated past int64 (an empty
     * input's other sizes may be huge; its gradient is empty then). */
    int64_t sizes[CT_MAX_DIMS];
    int k = 0;
    for (int d = 0; d < n->in_ndim[0]; d++)
        if (is_reduced(n, d)) sizes[k++] = n->in_shape[0][d];
    return cti_numel(k, sizes);
}

/* t (in the output's shape) with x's rank: size 1 at the reduced dims. A
 * new handle (a view) even with keepdim, so the engine's scope owns it. */
static ct_tensor *kept(const cti_node *n, ct_tensor *t) {
    int64_t shape[CT_MAX_DIMS];
    for (int d = 0; d < n->in_ndim[0]; d++) shape[d] = is_reduced(n, d) ? 1 : n->in_shape[0][d];
    return ct_reshape(t, n->in_ndim[0], shape);
}

/* A new handle on t in float32 when t is float16/bfloat16, else on t. */
static ct_tensor *up(ct_tensor *t) {
    ct_dtype dt = ct_tensor_dtype(t);
    return ct_to_dtype(t, dt == CT_F16 || dt == CT_BF16 ? CT_F32 : dt);
}

/* up(kept(t)). */
static ct_tensor *kept_up(const cti_node *n, ct_tensor *t) {
    ct_tensor *k = kept(n, t);
    if (!k) return NULL;
    ct_tensor *u = up(k);
    ct_tensor_release(k);
    return u;
}

static ct_tensor *scalar_like(ct_tensor *t, double v) {
    return ct_tensor_scalar(v, ct_tensor_dtype(t), ct_tensor_device(t));
}

/* g where zero is false, 0 where it is true (where, not a product, so an
 * inf or NaN in g stays out of the zeros). */
static ct_tensor *zero_where(ct_tensor *zero, ct_tensor *g) {
    ct_tensor *z = scalar_like(g, 0.0);
    if (!z) return NULL;
    return ct_where(zero, z, g);
}

/* ---- sum / mean ---------------------------------------------------------------------- */

CTI_BW(cti_bw_sum) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    ct_tensor *g = kept(n, go[0]);
    if (!g) return ct_last_status();
    return put(&gi[0], ct_expand(g, n->in_ndim[0], n->in_shape[0]));
}

CTI_BW(cti_bw_mean) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    ct_tensor *g = kept(n, go[0]);
    if (!g) return ct_last_status();
    g = ct_div_scalar(g, (double)reduced_count(n));
    if (!g) return ct_last_status();
    return put(&gi[0], ct_expand(g, n->in_ndim[0], n->in_shape[0]));
}

/* ---- prod ------------------------------------------------------------------------------
 * The gradient of each element is the product of the others. With p the
 * product of the non-zero elements and z the number of zeros (per output):
 * z == 0: p / x; z == 1: p at the zero, 0 elsewhere; z >= 2: 0. */
CTI_BW(cti_bw_prod) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    int64_t dims[CT_MAX_DIMS];
    int nd = reduced_dims(n, dims);
    ct_tensor *x = up(x0);
    ct_tensor *g = x ? kept_up(n, go[0]) : NULL;
    ct_tensor *is0 = g ? ct_eq_scalar(x, 0.0) : NULL;
    ct_tensor *one = is0 ? scalar_like(x, 1.0) : NULL;
    ct_tensor *zero = one ? scalar_like(x, 0.0) : NULL;
    ct_tensor *xnz = zero ? ct_where(is0, one, x) : NULL;
    ct_tensor *p = xnz ? ct_prod(xnz, nd, dims, true) : NULL;
    ct_tensor *nz = p ? ct_sum(is0, nd, dims, true) : NULL;
    ct_tensor *nz0 = nz ? ct_eq_scalar(nz, 0.0) : NULL;
    ct_tensor *nz1 = nz0 ? ct_eq_scalar(nz, 1.0) : NULL;
    ct_tensor *others = nz1 ? ct_div(p, x) : NULL;
    ct_tensor *at_nonzero = others ? ct_where(nz0, others, zero) : NULL;
    ct_tensor *at_zero = at_nonzero ? ct_where(nz1, p, zero) : NULL;
    ct_tensor *d = at_zero ? ct_where(is0, at_zero, at_nonzero) : NULL;
    return put(&gi[0], d ? ct_mul(d, g) : NULL);
}

/* ---- var / std ---------------------------------------------------------------------------
 * d var / dx = 2 (x - mean) / (N - correction). */
static ct_tensor *var_grad(cti_node *n, ct_tensor *x0, ct_tensor *g) {
    int64_t dims[CT_MAX_DIMS];
    int nd = reduced_dims(n, dims);
    double dof = fmax(0.0, (double)reduced_count(n) - params_of(n)->correction);
    ct_tensor *x = up(x0);
    /* Deviations are taken from x minus its first element along the reduced
     * dims: for a constant x they are exactly 0, as the forward's variance is,
     * where x - mean(x) would leave the mean's rounding error. */
    ct_tensor *first = x;
    if (first && ct_tensor_numel(x) > 0)
        for (int k = 0; k < nd && first; k++) first = ct_narrow(first, (int)dims[k], 0, 1);
    ct_tensor *xs = first ? (first == x ? x : ct_sub(x, first)) : NULL;
    ct_tensor *m = xs ? ct_mean(xs, nd, dims, true) : NULL;
    ct_tensor *c = m ? ct_sub(xs, m) : NULL;
    ct_tensor *s = c ? ct_mul_scalar(g, 2.0 / dof) : NULL;
    return s ? ct_mul(c, s) : NULL;
}

CTI_BW(cti_bw_var) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    ct_tensor *g = kept_up(n, go[0]);
    return put(&gi[0], g ? var_grad(n, x, g) : NULL);
}

/* std = sqrt(var): the var gradient of go / (2 std), 0 where std is 0. */
CTI_BW(cti_bw_std) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    SAVED(out, 1);
    ct_tensor *g = kept_up(n, go[0]);
    ct_tensor *o = g ? kept_up(n, out) : NULL;
    ct_tensor *o2 = o ? ct_mul_scalar(o, 2.0) : NULL;
    ct_tensor *q = o2 ? ct_div(g, o2) : NULL;
    ct_tensor *is0 = q ? ct_eq_scalar(o, 0.0) : NULL;
    ct_tensor *gv = is0 ? zero_where(is0, q) : NULL;
    return put(&gi[0], gv ? var_grad(n, x, gv) : NULL);
}

/* ---- norm -------------------------------------------------------------------------------- */

/* g / norm^(p-1), 0 where the norm is 0. */
static ct_tensor *scaled_by_norm(ct_tensor *g, ct_tensor *norm, double p) {
    ct_tensor *np = ct_pow_scalar(norm, p - 1);
    ct_tensor *q = np ? ct_div(g, np) : NULL;
    ct_tensor *is0 = q ? ct_eq_scalar(norm, 0.0) : NULL;
    return is0 ? zero_where(is0, q) : NULL;
}

/* p = +-inf: the gradient is split evenly among the elements whose |x|
 * equals the norm (or is NaN), with x's sign. */
static ct_tensor *norm_inf_grad(cti_node *n, ct_tensor *x, ct_tensor *ax, ct_tensor *norm,
                                ct_tensor *g) {
    int64_t dims[CT_MAX_DIMS];
    int nd = reduced_dims(n, dims);
    ct_tensor *hit = ct_eq(ax, norm);
    ct_tensor *nan = hit ? ct_ne(ax, ax) : NULL;
    ct_tensor *mask = nan ? ct_logical_or(hit, nan) : NULL;
    ct_tensor *cnt = mask ? ct_sum(mask, nd, dims, true) : NULL;
    ct_tensor *share = cnt ? ct_div(g, cnt) : NULL;
    ct_tensor *miss = share ? ct_logical_not(mask) : NULL;
    ct_tensor *m = miss ? zero_where(miss, share) : NULL;
    ct_tensor *s = m ? ct_sign(x) : NULL;
    return s ? ct_mul(s, m) : NULL;
}

CTI_BW(cti_bw_norm) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    SAVED(out, 1);
    double p = params_of(n)->p;
    if (p == 0.0) return put(&gi[0], ct_tensor_zeros_like(x0));
    ct_tensor *x = up(x0);
    ct_tensor *g = x ? kept_up(n, go[0]) : NULL;
    ct_tensor *norm = g ? kept_up(n, out) : NULL;
    if (!norm) return ct_last_status();
    if (p == 1.0) {
        ct_tensor *s = ct_sign(x);
        return put(&gi[0], s ? ct_mul(s, g) : NULL);
    }
    if (p == 2.0) {
        ct_tensor *q = scaled_by_norm(g, norm, p);
        return put(&gi[0], q ? ct_mul(x, q) : NULL);
    }
    ct_tensor *ax = ct_abs(x);
    if (!ax) return ct_last_status();
    if (isinf(p)) return put(&gi[0], norm_inf_grad(n, x, ax, norm, g));
    if (p < 1.0) {
        /* sign(x) |x|^(p-1), 0 at x == 0, times g norm^(1-p) */
        ct_tensor *s = ct_sign(x);
        ct_tensor *a = s ? ct_pow_scalar(ax, p - 1) : NULL;
        ct_tensor *sa = a ? ct_mul(s, a) : NULL;
        ct_tensor *is0 = sa ? ct_eq_scalar(x, 0.0) : NULL;
        ct_tensor *xs = is0 ? zero_where(is0, sa) : NULL;
        ct_tensor *np = xs ? ct_pow_scalar(norm, 1 - p) : NULL;
        ct_tensor *gn = np ? ct_mul(g, np) : NULL;
        return put(&gi[0], gn ? ct_mul(xs, gn) : NULL);
    }
    /* sign(x) |x|^(p-1) as x |x|^(p-2) where that is finite at 0 (p >= 2) */
    ct_tensor *xs;
    if (p < 2.0) {
        ct_tensor *s = ct_sign(x);
        ct_tensor *a = s ? ct_pow_scalar(ax, p - 1) : NULL;
        xs = a ? ct_mul(s, a) : NULL;
    } else {
        ct_tensor *a = ct_pow_scalar(ax, p - 2);
        xs = a ? ct_mul(x, a) : NULL;
    }
    ct_tensor *q = xs ? scaled_by_norm(g, norm, p) : NULL;
    return put(&gi[0], q ? ct_mul(xs, q) : NULL);
}

/* ---- max / min -------------------------------------------------------------------------- */

/* Over all elements: the gradient is split evenly among the elements equal
 * to the result (the NaNs when the result is NaN), as PyTorch's max(). */
CTI_BW(cti_bw_max_all) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    SAVED(out, 1);
    ct_tensor *g = kept_up(n, go[0]);
    ct_tensor *hit = g ? ct_eq(x, out) : NULL;
    ct_tensor *xnan = hit ? ct_ne(x, x) : NULL;
    ct_tensor *onan = xnan ? ct_ne(out, out) : NULL;
    ct_tensor *both = onan ? ct_logical_and(xnan, onan) : NULL;
    ct_tensor *mask = both ? ct_logical_or(hit, both) : NULL;
    ct_tensor *cnt = mask ? ct_sum(mask, CT_NONE, false) : NULL;
    ct_tensor *share = cnt ? ct_div(g, cnt) : NULL;
    ct_tensor *miss = share ? ct_logical_not(mask) : NULL;
    return put(&gi[0], miss ? zero_where(miss, share) : NULL);
}

/* Along a dim: the gradient goes to the selected index. The positions along
 * the dim are compared with the indices, which broadcast against them. */
CTI_BW(cti_bw_max_dim) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(idx, 0);
    int nd = n->in_ndim[0];
    if (nd == 0) return put(&gi[0], ct_tensor_retain(go[0]));
    int d = 0;
    while (d < nd - 1 && !is_reduced(n, d)) d++;
    int64_t len = n->in_shape[0][d];
    int64_t shape[CT_MAX_DIMS];
    for (int k = 0; k < nd; k++) shape[k] = k == d ? len : 1;
    ct_tensor *g = kept(n, go[0]);
    ct_tensor *ki = g ? kept(n, idx) : NULL;
    ct_tensor *ar = ki ? ct_tensor_arange(0, (double)len, 1, CT_I64, ct_tensor_device(g)) : NULL;
    ct_tensor *pos = ar ? ct_reshape(ar, nd, shape) : NULL;
    ct_tensor *miss = pos ? ct_ne(pos, ki) : NULL;
    return put(&gi[0], miss ? zero_where(miss, g) : NULL);
}
