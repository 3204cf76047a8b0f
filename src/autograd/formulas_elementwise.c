/* Backward formulas of the elementwise ops (src/ops/elementwise.c).
 *
 * They follow PyTorch's derivatives.yaml, built from public ops so they run on
 * every device. A gradient may be left in the broadcast shape of the forward
 * (the engine sums it back to each input's shape and casts it to the input's
 * dtype). Masked gradients use where rather than a multiplication by a 0/1
 * mask, so an inf or NaN in the incoming gradient stays out of the zeros.
 *
 * Formulas run inside a scope the engine owns, so an early return on error
 * leaves the temporaries to it; on success they release theirs as soon as
 * they are used, to keep the peak memory of a long backward low. */
#include <math.h>

#include "formulas.h"

/* ---- helpers ----------------------------------------------------------------------- */

/* Returns r after releasing the temporary t (r may be NULL; the error
 * message stays that of the op that failed). */
static ct_tensor *drop(ct_tensor *r, ct_tensor *t) {
    ct_tensor_release(t);
    return r;
}

static ct_tensor *drop2(ct_tensor *r, ct_tensor *t, ct_tensor *u) {
    ct_tensor_release(t);
    ct_tensor_release(u);
    return r;
}

/* Stores g as an input gradient: CT_OK, or the failing op's status. */
static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

/* g where keep is true, 0 elsewhere. */
static ct_tensor *keep_where(ct_tensor *keep, ct_tensor *g) {
    ct_tensor *z = ct_tensor_scalar(0.0, ct_tensor_dtype(g), ct_tensor_device(g));
    if (!z) return NULL;
    return drop(ct_where(keep, g, z), z);
}

/* 0 where zero is true, g elsewhere. */
static ct_tensor *zero_where(ct_tensor *zero, ct_tensor *g) {
    ct_tensor *z = ct_tensor_scalar(0.0, ct_tensor_dtype(g), ct_tensor_device(g));
    if (!z) return NULL;
    return drop(ct_where(zero, z, g), z);
}

/* A new handle on t in float32 when t is float16/bfloat16, else on t itself:
 * formulas of several ops compute in float32 there and round once, as the
 * engine casts the gradient back to the input's dtype. */
static ct_tensor *up(ct_tensor *t) {
    ct_dtype dt = ct_tensor_dtype(t);
    return ct_to_dtype(t, dt == CT_F16 || dt == CT_BF16 ? CT_F32 : dt);
}

/* go[0] * d, releasing the temporary d. */
static ct_status chain(ct_tensor *const *go, ct_tensor *d, ct_tensor **gi) {
    if (!d) return ct_last_status();
    return put(gi, drop(ct_mul(go[0], d), d));
}

/* The node's cti_pointwise_params (alpha, bounds, scalar), as the front end
 * recorded them. */
#define PARAMS(n) CTI_NODE_PARAMS(n, cti_pointwise_params)

#define SAVED(var, k)                                                                      \
    ct_status st_##var;                                                                    \
    ct_tensor *var = cti_ag_saved(n, k, &st_##var);                                        \
    if (st_##var != CT_OK) return st_##var

/* ---- add / sub / neg ----------------------------------------------------------------- */
/* Inputs (a) or (a, b): out = a + alpha * b (sub: alpha negated). Nothing
 * saved. Also add/sub with a scalar (one input, whose coefficient is 1). */
CTI_BW(cti_bw_add) {
    if (!go[0]) return CT_OK;
    if (n->needs[0]) gi[0] = ct_tensor_retain(go[0]);
    if (n->nin > 1 && n->needs[1]) {
        double alpha = PARAMS(n)->alpha;
        ct_tensor *g = alpha == 1.0 ? ct_tensor_retain(go[0]) : ct_mul_scalar(go[0], alpha);
        return put(&gi[1], g);
    }
    return CT_OK;
}

/* out = -x, or s - x (rsub). Nothing saved. */
CTI_BW(cti_bw_neg) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return put(&gi[0], ct_neg(go[0]));
}

/* ---- mul / div ------------------------------------------------------------------------- */
/* Saved: a (when b needs grad), b (when a needs grad). */
CTI_BW(cti_bw_mul) {
    if (!go[0]) return CT_OK;
    SAVED(a, 0);
    SAVED(b, 1);
    ct_status st = CT_OK;
    if (n->needs[0] && (st = put(&gi[0], ct_mul(go[0], b))) != CT_OK) return st;
    if (n->needs[1]) st = put(&gi[1], ct_mul(go[0], a));
    return st;
}

/* out = x * scalar. */
CTI_BW(cti_bw_mul_scalar) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return put(&gi[0], ct_mul_scalar(go[0], PARAMS(n)->scalar));
}

/* Saved: a (when b needs grad), b. d/da = 1/b, d/db = -a/b^2, the latter
 * formed as -(go/b)*(a/b) so b^2 cannot overflow. */
CTI_BW(cti_bw_div) {
    if (!go[0]) return CT_OK;
    SAVED(a, 0);
    SAVED(b, 1);
    ct_tensor *q = ct_div(go[0], b);
    if (!q) return ct_last_status();
    if (n->needs[1]) {
        ct_tensor *r = ct_div(a, b);
        if (!r) return ct_last_status();
        ct_tensor *p = drop(ct_mul(q, r), r);
        if (!p) return ct_last_status();
        ct_status st = put(&gi[1], drop(ct_neg(p), p));
        if (st != CT_OK) return st;
    }
    if (n->needs[0]) gi[0] = q;
    else ct_tensor_release(q);
    return CT_OK;
}

/* out = x / scalar (divided, not multiplied by the reciprocal, as PyTorch). */
CTI_BW(cti_bw_div_scalar) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return put(&gi[0], ct_div_scalar(go[0], PARAMS(n)->scalar));
}

/* ---- pow ----------------------------------------------------------------------------- */
/* Saved: a, b, out (out only when b needs grad).
 * d/da = b * a^(b-1), 0 where b == 0 (so 0^0 has gradient 0, not NaN);
 * d/db = a^b * log(a), 0 where a == 0 and b >= 0 (the limit, not 0 * -inf). */
CTI_BW(cti_bw_pow) {
    if (!go[0]) return CT_OK;
    SAVED(a, 0);
    SAVED(b, 1);
    SAVED(out, 2);
    if (n->needs[0]) {
        ct_tensor *bm1 = ct_sub_scalar(b, 1.0);
        if (!bm1) return ct_last_status();
        ct_tensor *p = drop(ct_pow(a, bm1), bm1);
        if (!p) return ct_last_status();
        ct_tensor *d = drop(ct_mul(p, b), p);
        if (!d) return ct_last_status();
        ct_tensor *g = drop(ct_mul(go[0], d), d);
        if (!g) return ct_last_status();
        ct_tensor *bz = ct_eq_scalar(b, 0.0);
        if (!bz) return ct_last_status();
        ct_status st = put(&gi[0], drop2(zero_where(bz, g), bz, g));
        if (st != CT_OK) return st;
    }
    if (n->needs[1]) {
        ct_tensor *l = ct_log(a);
        if (!l) return ct_last_status();
        ct_tensor *d = drop(ct_mul(out, l), l);
        if (!d) return ct_last_status();
        ct_tensor *g = drop(ct_mul(go[0], d), d);
        ct_tensor *az = ct_eq_scalar(a, 0.0), *bp = ct_ge_scalar(b, 0.0);
        if (!g || !az || !bp) return ct_last_status();
        ct_tensor *mask = drop2(ct_logical_and(az, bp), az, bp);
        if (!mask) return ct_last_status();
        return put(&gi[1], drop2(zero_where(mask, g), mask, g));
    }
    return CT_OK;
}

/* out = x^scalar. Saved: x. */
CTI_BW(cti_bw_pow_scalar) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    double e = PARAMS(n)->scalar;
    if (e == 0.0) return put(&gi[0], ct_tensor_zeros_like(go[0]));
    SAVED(x, 0);
    ct_tensor *p = ct_pow_scalar(x, e - 1.0);
    if (!p) return ct_last_status();
    ct_tensor *d = drop(ct_mul_scalar(p, e), p);
    return chain(go, d, &gi[0]);
}

/* ---- maximum / minimum ------------------------------------------------------------------ */
/* The larger (smaller) operand gets the gradient; ties split it in halves, as
 * PyTorch. Where one operand is NaN both get it, as there. Saved: a, b. */
static ct_status extremum_bw(cti_node *n, ct_tensor *const *go, ct_tensor **gi, bool is_max) {
    if (!go[0]) return CT_OK;
    SAVED(a, 0);
    SAVED(b, 1);
    ct_tensor *eq = ct_eq(a, b);
    ct_tensor *half = ct_mul_scalar(go[0], 0.5);
    if (!eq || !half) return ct_last_status();
    ct_tensor *t = drop2(ct_where(eq, half, go[0]), eq, half);
    if (!t) return ct_last_status();
    for (int k = 0; k < 2; k++) {
        if (!n->needs[k]) continue;
        /* Input k loses where the other one wins. */
        ct_tensor *lose = (k == 0) == is_max ? ct_lt(a, b) : ct_gt(a, b);
        if (!lose) return ct_last_status();
        ct_status st = put(&gi[k], drop(zero_where(lose, t), lose));
        if (st != CT_OK) return st;
    }
    ct_tensor_release(t);
    return CT_OK;
}

CTI_BW(cti_bw_maximum) { return extremum_bw(n, go, gi, true); }
CTI_BW(cti_bw_minimum) { return extremum_bw(n, go, gi, false); }

/* Against the node's scalar; ties split as for two tensors (the scalar's half
 * goes nowhere). Saved: x. */
static ct_status extremum_scalar_bw(cti_node *n, ct_tensor *const *go, ct_tensor **gi,
                                    bool is_max) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    double s = PARAMS(n)->scalar;
    ct_tensor *eq = ct_eq_scalar(x, s);
    ct_tensor *half = ct_mul_scalar(go[0], 0.5);
    if (!eq || !half) return ct_last_status();
    ct_tensor *t = drop2(ct_where(eq, half, go[0]), eq, half);
    if (!t) return ct_last_status();
    ct_tensor *lose = is_max ? ct_lt_scalar(x, s) : ct_gt_scalar(x, s);
    if (!lose) return ct_last_status();
    return put(&gi[0], drop2(zero_where(lose, t), lose, t));
}

CTI_BW(cti_bw_maximum_scalar) { return extremum_scalar_bw(n, go, gi, true); }
CTI_BW(cti_bw_minimum_scalar) { return extremum_scalar_bw(n, go, gi, false); }

/* ---- where / clamp ----------------------------------------------------------------------- */
/* Inputs (a, b); saved: cond. a gets the gradient where cond, b elsewhere. */
CTI_BW(cti_bw_where) {
    if (!go[0]) return CT_OK;
    SAVED(cond, 0);
    ct_status st = CT_OK;
    if (n->needs[0] && (st = put(&gi[0], keep_where(cond, go[0]))) != CT_OK) return st;
    if (n->needs[1]) st = put(&gi[1], zero_where(cond, go[0]));
    return st;
}

/* Saved: x; params lo, hi (min, max; an absent bound is infinite). Gradient
 * where min <= x <= max (inclusive, as PyTorch, so a value on a bound keeps
 * it; NaN gets none). */
CTI_BW(cti_bw_clamp) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    const cti_pointwise_params *p = PARAMS(n);
    ct_tensor *lo = ct_ge_scalar(x, p->lo), *hi = ct_le_scalar(x, p->hi);
    if (!lo || !hi) return ct_last_status();
    ct_tensor *in = drop2(ct_logical_and(lo, hi), lo, hi);
    if (!in) return ct_last_status();
    return put(&gi[0], drop(keep_where(in, go[0]), in));
}

/* ---- unary --------------------------------------------------------------------------------- */
/* Saved: x. sign(x), so 0 at 0. */
CTI_BW(cti_bw_abs) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    return chain(go, ct_sign(x), &gi[0]);
}

/* Saved: out. */
CTI_BW(cti_bw_exp) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    return put(&gi[0], ct_mul(go[0], out));
}

/* Saved: x. */
CTI_BW(cti_bw_log) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    return put(&gi[0], ct_div(go[0], x));
}

/* Saved: out. go / (2 sqrt(x)). */
CTI_BW(cti_bw_sqrt) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    ct_tensor *d = ct_mul_scalar(out, 2.0);
    if (!d) return ct_last_status();
    return put(&gi[0], drop(ct_div(go[0], d), d));
}

/* Saved: out. -0.5 * out^3. */
CTI_BW(cti_bw_rsqrt) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    ct_tensor *c = ct_pow_scalar(out, 3.0);
    if (!c) return ct_last_status();
    return chain(go, drop(ct_mul_scalar(c, -0.5), c), &gi[0]);
}

/* Saved: x. */
CTI_BW(cti_bw_sin) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    return chain(go, ct_cos(x), &gi[0]);
}

/* Saved: x. */
CTI_BW(cti_bw_cos) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    ct_tensor *s = ct_sin(x);
    if (!s) return ct_last_status();
    return chain(go, drop(ct_neg(s), s), &gi[0]);
}

/* Saved: out. 1 - out^2. */
CTI_BW(cti_bw_tanh) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    ct_tensor *y = up(out);
    if (!y) return ct_last_status();
    ct_tensor *sq = drop(ct_square(y), y);
    if (!sq) return ct_last_status();
    return chain(go, drop(ct_rsub_scalar(sq, 1.0), sq), &gi[0]);
}

/* Saved: out. out * (1 - out). */
CTI_BW(cti_bw_sigmoid) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    ct_tensor *y = up(out);
    if (!y) return ct_last_status();
    ct_tensor *c = ct_rsub_scalar(y, 1.0);
    if (!c) return ct_last_status();
    return chain(go, drop2(ct_mul(y, c), y, c), &gi[0]);
}

/* The operands of a backward pointwise op (grad_out g and the saved t), which
 * take one dtype: new references in *gc and *tc, each itself or, when their
 * dtypes differ, cast to the promoted dtype (rather than losing digits). */
static ct_status same_dtype_pair(ct_tensor *g, ct_tensor *t, ct_tensor **gc, ct_tensor **tc) {
    ct_dtype dg = ct_tensor_dtype(g), dt0 = ct_tensor_dtype(t);
    ct_dtype dt = dg == dt0 ? dg : ct_promote_types(dg, dt0);
    *gc = dg == dt ? ct_tensor_retain(g) : ct_to_dtype(g, dt);
    *tc = dt0 == dt ? ct_tensor_retain(t) : ct_to_dtype(t, dt);
    if (*gc && *tc) return CT_OK;
    ct_status st = ct_last_status();
    ct_tensor_release(*gc);
    ct_tensor_release(*tc);
    return st;
}

/* Saved: out. 0 where out <= 0 (so 0 at 0): PyTorch's threshold_backward, one
 * kernel. */
CTI_BW(cti_bw_relu) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    ct_tensor *g, *yc;
    ct_status st = same_dtype_pair(go[0], out, &g, &yc);
    if (st != CT_OK) return st;
    return put(&gi[0], drop2(ct_threshold_backward(g, yc, 0.0), g, yc));
}

/* Saved: x. grad_out times d/dx gelu(x) in one kernel, PyTorch's gelu_backward
 * (the derivative of each approximation is written at its kernels). grad_out
 * comes in the output's dtype, which is x's; one of another dtype meets x in
 * their promoted dtype rather than losing digits. */
static ct_status gelu_grad(cti_node *n, ct_tensor *const *go, ct_tensor **gi,
                           ct_gelu_approx approximate) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    ct_tensor *g, *xc;
    ct_status st = same_dtype_pair(go[0], x, &g, &xc);
    if (st != CT_OK) return st;
    return put(&gi[0], drop2(ct_gelu_backward(g, xc, approximate), g, xc));
}

CTI_BW(cti_bw_gelu) { return gelu_grad(n, go, gi, CT_GELU_NONE); }
CTI_BW(cti_bw_gelu_tanh) { return gelu_grad(n, go, gi, CT_GELU_TANH); }

/* Saved: x. d/dx x s(x) = s (1 + x (1 - s)), s = sigmoid(x). */
CTI_BW(cti_bw_silu) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    ct_tensor *x = up(x0);
    if (!x) return ct_last_status();
    ct_tensor *s = ct_sigmoid(x);
    if (!s) return ct_last_status();
    ct_tensor *c = ct_rsub_scalar(s, 1.0);
    if (!c) return ct_last_status();
    ct_tensor *xc = drop2(ct_mul(x, c), x, c);
    if (!xc) return ct_last_status();
    ct_tensor *one = drop(ct_add_scalar(xc, 1.0), xc);
    if (!one) return ct_last_status();
    return chain(go, drop2(ct_mul(s, one), s, one), &gi[0]);
}

/* Saved: x; params beta, threshold. dy/dx = sigmoid(beta x), and 1 where
 * beta x > threshold (the forward's linear branch), as PyTorch's
 * softplus_backward; beta x is formed as the forward forms it (in float32
 * for float16/bfloat16), so both take the same branch. */
CTI_BW(cti_bw_softplus) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_pointwise_params *p = PARAMS(n);
    SAVED(x0, 0);
    ct_tensor *x = up(x0);
    if (!x) return ct_last_status();
    ct_tensor *bx = drop(ct_mul_scalar(x, p->beta), x);
    if (!bx) return ct_last_status();
    ct_tensor *linear = ct_gt_scalar(bx, p->threshold);
    ct_tensor *s = drop(ct_sigmoid(bx), bx);
    if (!linear || !s) return ct_last_status();
    ct_tensor *gs = drop(ct_mul(go[0], s), s);
    if (!gs) return ct_last_status();
    return put(&gi[0], drop2(ct_where(linear, go[0], gs), linear, gs));
}

/* Saved: out. -out^2. */
CTI_BW(cti_bw_reciprocal) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    ct_tensor *sq = ct_square(out);
    if (!sq) return ct_last_status();
    return chain(go, drop(ct_neg(sq), sq), &gi[0]);
}

/* Saved: x. 2x. */
CTI_BW(cti_bw_square) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    return chain(go, ct_mul_scalar(x, 2.0), &gi[0]);
}

/* Zero almost everywhere (and taken as 0 at 0), as PyTorch: the input gets a
 * zero gradient rather than none. */
CTI_BW(cti_bw_sign) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return put(&gi[0], ct_tensor_zeros_like(go[0]));
}

/* ---- math, activations, rounding, binary, lerp ----------------------------------------------
 * As derivatives.yaml. Each derivative is formed in float32 for float16/bfloat16 inputs (up)
 * and multiplies the incoming gradient once. TRY names a temporary and returns the failing
 * op's status (the engine's scope frees what is left). */
#define TRY(var, expr)                                                                     \
    ct_tensor *var = (expr);                                                               \
    if (!var) return ct_last_status()

/* Saved: x. 1 / (1 + x). */
CTI_BW(cti_bw_log1p) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    TRY(x, up(x0));
    TRY(d, drop(ct_add_scalar(x, 1.0), x));
    return put(&gi[0], drop(ct_div(go[0], d), d));
}

/* Saved: out. out + 1. */
CTI_BW(cti_bw_expm1) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    TRY(y, up(out));
    return chain(go, drop(ct_add_scalar(y, 1.0), y), &gi[0]);
}

/* Saved: x. 1 / (x ln b), b the base. */
static ct_status log_base_bw(cti_node *n, ct_tensor *const *go, ct_tensor **gi, double ln_b) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    TRY(x, up(x0));
    TRY(d, drop(ct_mul_scalar(x, ln_b), x));
    return put(&gi[0], drop(ct_div(go[0], d), d));
}
CTI_BW(cti_bw_log2) { return log_base_bw(n, go, gi, M_LN2); }
CTI_BW(cti_bw_log10) { return log_base_bw(n, go, gi, M_LN10); }

/* Saved: out. out ln 2. */
CTI_BW(cti_bw_exp2) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    TRY(y, up(out));
    return chain(go, drop(ct_mul_scalar(y, M_LN2), y), &gi[0]);
}

/* exp(-x^2) * c, in float32 for the halves. */
static ct_tensor *gauss(ct_tensor *x0, double c) {
    ct_tensor *x = up(x0);
    if (!x) return NULL;
    ct_tensor *sq = drop(ct_square(x), x);
    if (!sq) return NULL;
    ct_tensor *e = drop(ct_mul_scalar(sq, -1.0), sq);
    if (!e) return NULL;
    ct_tensor *g = drop(ct_exp(e), e);
    if (!g) return NULL;
    return drop(ct_mul_scalar(g, c), g);
}

/* Saved: x. erf: 2 / sqrt(pi) exp(-x^2); erfc: its negation. */
CTI_BW(cti_bw_erf) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    return chain(go, gauss(x, M_2_SQRTPI), &gi[0]);
}
CTI_BW(cti_bw_erfc) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    return chain(go, gauss(x, -M_2_SQRTPI), &gi[0]);
}

/* Saved: out. sqrt(pi) / 2 exp(out^2). */
CTI_BW(cti_bw_erfinv) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    TRY(y, up(out));
    TRY(sq, drop(ct_square(y), y));
    TRY(e, drop(ct_exp(sq), sq));
    return chain(go, drop(ct_mul_scalar(e, 1.0 / M_2_SQRTPI), e), &gi[0]);
}

/* Saved: out. 1 + out^2. */
CTI_BW(cti_bw_tan) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(out, 0);
    TRY(y, up(out));
    TRY(sq, drop(ct_square(y), y));
    return chain(go, drop(ct_add_scalar(sq, 1.0), sq), &gi[0]);
}

/* go / sqrt(s x^2 + c) (s, c = -1, 1: asin; 1, 1: asinh; 1, -1: acosh), negated for acos. */
static ct_status rsqrt_bw(cti_node *n, ct_tensor *const *go, ct_tensor **gi, double s, double c,
                          bool negate) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    TRY(x, up(x0));
    TRY(sq, drop(ct_square(x), x));
    TRY(a, drop(ct_mul_scalar(sq, s), sq));
    TRY(b, drop(ct_add_scalar(a, c), a));
    TRY(r, drop(ct_rsqrt(b), b));
    if (negate) {
        TRY(nr, drop(ct_neg(r), r));
        return chain(go, nr, &gi[0]);
    }
    return chain(go, r, &gi[0]);
}
/* Saved: x. */
CTI_BW(cti_bw_asin) { return rsqrt_bw(n, go, gi, -1, 1, false); }
CTI_BW(cti_bw_acos) { return rsqrt_bw(n, go, gi, -1, 1, true); }
CTI_BW(cti_bw_asinh) { return rsqrt_bw(n, go, gi, 1, 1, false); }
CTI_BW(cti_bw_acosh) { return rsqrt_bw(n, go, gi, 1, -1, false); }

/* go / (s x^2 + 1): atan (s = 1), atanh (s = -1). */
static ct_status recip_bw(cti_node *n, ct_tensor *const *go, ct_tensor **gi, double s) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    TRY(x, up(x0));
    TRY(sq, drop(ct_square(x), x));
    TRY(a, drop(ct_mul_scalar(sq, s), sq));
    TRY(b, drop(ct_add_scalar(a, 1.0), a));
    return put(&gi[0], drop(ct_div(go[0], b), b));
}
/* Saved: x. */
CTI_BW(cti_bw_atan) { return recip_bw(n, go, gi, 1); }
CTI_BW(cti_bw_atanh) { return recip_bw(n, go, gi, -1); }

/* Saved: x. sinh' = cosh, cosh' = sinh. */
CTI_BW(cti_bw_sinh) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    return chain(go, ct_cosh(x), &gi[0]);
}
CTI_BW(cti_bw_cosh) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    return chain(go, ct_sinh(x), &gi[0]);
}

/* Saved: x; params negative_slope. go where x > 0, slope go elsewhere. */
CTI_BW(cti_bw_leaky_relu) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    TRY(pos, ct_gt_scalar(x, 0.0));
    TRY(neg, ct_mul_scalar(go[0], PARAMS(n)->negative_slope));
    return put(&gi[0], drop2(ct_where(pos, go[0], neg), pos, neg));
}

/* Saved: x; params alpha, scale, input_scale. scale where x > 0, input_scale scale alpha
 * exp(input_scale x) elsewhere (PyTorch's elu_backward on the input). */
CTI_BW(cti_bw_elu) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_pointwise_params *p = PARAMS(n);
    SAVED(x0, 0);
    TRY(x, up(x0));
    TRY(pos, ct_gt_scalar(x, 0.0));
    TRY(xs, drop(ct_mul_scalar(x, p->elu_input_scale), x));
    TRY(e, drop(ct_exp(xs), xs));
    TRY(neg, drop(ct_mul_scalar(e, p->elu_input_scale * p->elu_scale * p->elu_alpha), e));
    TRY(sc, ct_tensor_scalar(p->elu_scale, ct_tensor_dtype(neg), ct_tensor_device(neg)));
    TRY(d, drop(drop2(ct_where(pos, sc, neg), sc, neg), pos));
    return chain(go, d, &gi[0]);
}

/* Saved: x. t + x sigmoid(x) (1 - t^2), t = tanh(softplus(x)). */
CTI_BW(cti_bw_mish) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    TRY(x, up(x0));
    TRY(sp, ct_softplus(x, 1.0, 20.0));
    TRY(t, drop(ct_tanh(sp), sp));
    TRY(s, ct_sigmoid(x));
    TRY(t2, ct_square(t));
    TRY(u, drop(ct_rsub_scalar(t2, 1.0), t2));
    TRY(xs, drop2(ct_mul(x, s), x, s));
    TRY(v, drop2(ct_mul(xs, u), xs, u));
    return chain(go, drop2(ct_add(t, v), t, v), &gi[0]);
}

/* Saved: x; params lo, hi. 0 where x <= min or x >= max (strictly inside keeps it, and NaN),
 * as PyTorch's hardtanh_backward. */
CTI_BW(cti_bw_hardtanh) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_pointwise_params *p = PARAMS(n);
    SAVED(x, 0);
    TRY(lo, ct_le_scalar(x, p->lo));
    TRY(hi, ct_ge_scalar(x, p->hi));
    TRY(off, drop2(ct_logical_or(lo, hi), lo, hi));
    return put(&gi[0], drop(zero_where(off, go[0]), off));
}

/* Saved: x. go / 6 strictly inside (-3, 3), 0 elsewhere. */
CTI_BW(cti_bw_hardsigmoid) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    TRY(lo, ct_gt_scalar(x, -3.0));
    TRY(hi, ct_lt_scalar(x, 3.0));
    TRY(in, drop2(ct_logical_and(lo, hi), lo, hi));
    TRY(g, ct_div_scalar(go[0], 6.0));
    return put(&gi[0], drop2(keep_where(in, g), in, g));
}

/* Saved: x. 0 below -3, x / 3 + 1/2 up to 3, 1 above (PyTorch's hardswish_backward). */
CTI_BW(cti_bw_hardswish) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    TRY(x, up(x0));
    TRY(lo, ct_lt_scalar(x, -3.0));
    TRY(hi, ct_gt_scalar(x, 3.0));
    TRY(a, drop(ct_div_scalar(x, 3.0), x));
    TRY(mid, drop(ct_add_scalar(a, 0.5), a));
    TRY(one, ct_tensor_scalar(1.0, ct_tensor_dtype(mid), ct_tensor_device(mid)));
    TRY(d1, drop(drop2(ct_where(hi, one, mid), one, mid), hi));
    TRY(d, drop(zero_where(lo, d1), d1));
    ct_tensor_release(lo);
    return chain(go, d, &gi[0]);
}

/* Saved: x. sigmoid(-x). */
CTI_BW(cti_bw_logsigmoid) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x0, 0);
    TRY(x, up(x0));
    TRY(nx, drop(ct_neg(x), x));
    return chain(go, drop(ct_sigmoid(nx), nx), &gi[0]);
}

/* Saved: x. go where x is finite, 0 where it was replaced. */
CTI_BW(cti_bw_nan_to_num) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    SAVED(x, 0);
    TRY(fin, ct_isfinite(x));
    return put(&gi[0], drop(keep_where(fin, go[0]), fin));
}

/* Inputs (a, b); saved a, b. d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2). */
CTI_BW(cti_bw_atan2) {
    if (!go[0]) return CT_OK;
    SAVED(a, 0);
    SAVED(b, 1);
    TRY(a2, ct_square(a));
    TRY(b2, ct_square(b));
    TRY(r2, drop2(ct_add(a2, b2), a2, b2));
    TRY(q, drop(ct_div(go[0], r2), r2));
    ct_status st = CT_OK;
    if (n->needs[0] && (st = put(&gi[0], ct_mul(q, b))) != CT_OK) return st;
    if (n->needs[1]) {
        TRY(qa, ct_mul(q, a));
        st = put(&gi[1], drop(ct_neg(qa), qa));
    }
    ct_tensor_release(q);
    return st;
}

/* Inputs (a, b); saved a, b. a - k b with k = trunc(a / b) (fmod) or floor(a / b)
 * (remainder): go for a, -k go for b. */
static ct_status mod_bw(cti_node *n, ct_tensor *const *go, ct_tensor **gi, bool floor_div) {
    if (!go[0]) return CT_OK;
    SAVED(a, 0);
    SAVED(b, 1);
    if (n->needs[0]) gi[0] = ct_tensor_retain(go[0]);
    if (!n->needs[1]) return CT_OK;
    TRY(q, ct_div(a, b));
    TRY(k, drop(floor_div ? ct_floor(q) : ct_trunc(q), q));
    TRY(nk, drop(ct_neg(k), k));
    return chain(go, nk, &gi[1]);
}
CTI_BW(cti_bw_fmod) { return mod_bw(n, go, gi, false); }
CTI_BW(cti_bw_remainder) { return mod_bw(n, go, gi, true); }

/* Inputs (start, end, weight) or (start, end) with the weight in params' scalar; saved
 * start, end, weight (NULL for the number). d/dstart = 1 - w, d/dend = w,
 * d/dweight = end - start. */
CTI_BW(cti_bw_lerp) {
    if (!go[0]) return CT_OK;
    SAVED(start, 0);
    SAVED(end, 1);
    SAVED(w, 2);
    double ws = PARAMS(n)->scalar;
    ct_status st = CT_OK;
    if (n->needs[0]) {
        TRY(c, w ? ct_rsub_scalar(w, 1.0) : ct_mul_scalar(go[0], 1.0 - ws));
        if (w) st = chain(go, c, &gi[0]);
        else st = put(&gi[0], c);
        if (st != CT_OK) return st;
    }
    if (n->needs[1]) {
        st = put(&gi[1], w ? ct_mul(go[0], w) : ct_mul_scalar(go[0], ws));
        if (st != CT_OK) return st;
    }
    if (n->nin > 2 && n->needs[2]) {
        TRY(d, ct_sub(end, start));
        st = chain(go, d, &gi[2]);
    }
    return st;
}
#undef TRY
