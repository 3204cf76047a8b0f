/* Autograd of the elementwise ops (gradchecks of every formula with
 * broadcasting, non-contiguous inputs, 0-d and empty tensors, the edge values
 * PyTorch defines, reduced-precision dtypes), the in-place rules of the
 * elementwise front ends, and the engine: backward with and without grad_out,
 * accumulation, retain_graph, the version counter, grad mode, detach, deep
 * graphs, memory and scopes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"
#include "unary_ops.inc"

/* ---- fixtures: every test must leave no tensor or storage alive ---------------------- */

/* ---- helpers ------------------------------------------------------------------------- */

/* The kinks and jumps of the ops checked here (relu and abs at 0, clamp's and
 * hardtanh's bounds, maximum_scalar's 0.25, round's half-integers,
 * round_decimals' multiples of 0.005, ...) all lie on multiples of GRID. A
 * central difference with step 1e-6 across one of them is wrong, so every
 * value is moved into [PHASE, PHASE + 0.001) past a multiple of GRID, 1000
 * steps from any kink. maximum/minimum take their operands from two phases,
 * which keeps a - b, their kink, as far from 0. */
#define GRID 0.005
static double off_kink(double x, double lo, double hi, double phase) {
    double y = GRID * floor(x / GRID) + phase + 0.001 * (x - GRID * floor(x / GRID)) / GRID;
    return y >= hi ? y - GRID : y < lo ? y + GRID : y;
}

/* A random float64 leaf in [lo, hi) (bounds on the grid), values phase past the
 * grid's points, non-contiguous when nc. */
static ct_tensor *rand_leaf_at(shp s, double lo, double hi, bool nc, bool grad, double phase) {
    int64_t n = tu_numel(s.nd, s.s);
    double *vals = tu_rand_vals(n, CT_F64, lo, hi);
    for (int64_t i = 0; i < n; i++) vals[i] = off_kink(vals[i], lo, hi, phase);
    ct_tensor *t = tu_from_f64(vals, s.nd, s.s, CT_F64);
    free(vals);
    assert_non_null(t);
    if (nc) {
        ct_tensor *v = tu_noncontig(t);
        ct_tensor_release(t);
        t = v;
        assert_non_null(t);
        if (s.nd > 0 && tu_numel(s.nd, s.s) > 1) assert_false(ct_tensor_is_contiguous(t));
    }
    if (grad) assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

static ct_tensor *rand_leaf(shp s, double lo, double hi, bool nc, bool grad) {
    return rand_leaf_at(s, lo, hi, nc, grad, 0.001);
}

static unsigned version_of(const ct_tensor *t) { return atomic_load(&t->storage->version); }

/* ---- gradcheck cases ------------------------------------------------------------------ */

typedef struct op_ctx {
    double p0, p1;
    ct_tensor *cond;
} op_ctx;

#define GC1(nm, expr)                                                                     \
    static ct_tensor *gc_##nm(ct_tensor *const *in, void *vctx) {                         \
        op_ctx *c = vctx;                                                                 \
        (void)c;                                                                          \
        ct_tensor *x = in[0];                                                             \
        return expr;                                                                      \
    }
#define GC2(nm, expr)                                                                     \
    static ct_tensor *gc_##nm(ct_tensor *const *in, void *vctx) {                         \
        op_ctx *c = vctx;                                                                 \
        (void)c;                                                                          \
        ct_tensor *a = in[0], *b = in[1];                                                 \
        return expr;                                                                      \
    }

#define GC_UNARY_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi) GC1(nm, call)
CT_UNARY_OPS(GC_UNARY_)
CT_UNARY_VARIANTS(GC_UNARY_)
#undef GC_UNARY_
GC1(add_scalar, ct_add_scalar(x, c->p0))
GC1(sub_scalar, ct_sub_scalar(x, c->p0))
GC1(rsub_scalar, ct_rsub_scalar(x, c->p0))
GC1(mul_scalar, ct_mul_scalar(x, c->p0))
GC1(div_scalar, ct_div_scalar(x, c->p0))
GC1(pow_scalar, ct_pow_scalar(x, c->p0))
GC1(maximum_scalar, ct_maximum_scalar(x, c->p0))
GC1(minimum_scalar, ct_minimum_scalar(x, c->p0))
GC1(clamp, ct_clamp(x, c->p0, c->p1))
GC2(add, ct_add(a, b))
GC2(add_alpha, ct_add_alpha(a, b, c->p0))
GC2(sub, ct_sub(a, b))
GC2(sub_alpha, ct_sub_alpha(a, b, c->p0))
GC2(mul, ct_mul(a, b))
GC2(div, ct_div(a, b))
GC2(pow, ct_pow(a, b))
GC2(maximum, ct_maximum(a, b))
GC2(minimum, ct_minimum(a, b))
GC2(where, ct_where(c->cond, a, b))

typedef struct un_case {
    const char *name;
    ct_gradcheck_fn fn;
    double lo, hi;
    double p0, p1;
} un_case;

static const un_case unary_cases[] = {
#define UN_ROW_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi) {#nm, gc_##nm, glo, ghi, 0, 0},
    CT_UNARY_OPS(UN_ROW_)
    CT_UNARY_VARIANTS(UN_ROW_)
#undef UN_ROW_
    {"add_scalar", gc_add_scalar, -2, 2, 1.5, 0},
    {"sub_scalar", gc_sub_scalar, -2, 2, -0.7, 0},
    {"rsub_scalar", gc_rsub_scalar, -2, 2, 3.25, 0},
    {"mul_scalar", gc_mul_scalar, -2, 2, -2.5, 0},
    {"div_scalar", gc_div_scalar, -2, 2, 0.3, 0},
    {"pow_scalar 2", gc_pow_scalar, -2, 2, 2, 0},
    {"pow_scalar 3", gc_pow_scalar, -2, 2, 3, 0},
    {"pow_scalar 1", gc_pow_scalar, -2, 2, 1, 0},
    {"pow_scalar 0", gc_pow_scalar, -2, 2, 0, 0},
    {"pow_scalar 0.5", gc_pow_scalar, 0.3, 3, 0.5, 0},
    {"pow_scalar -1.5", gc_pow_scalar, 0.3, 3, -1.5, 0},
    {"maximum_scalar", gc_maximum_scalar, -2, 2, 0.25, 0},
    {"minimum_scalar", gc_minimum_scalar, -2, 2, -0.25, 0},
    {"clamp", gc_clamp, -1, 1, -0.5, 0.5},
    {"clamp min only", gc_clamp, -1, 1, -0.2, INFINITY},
    {"clamp max only", gc_clamp, -1, 1, -INFINITY, 0.3},
};
#define N_UNARY (sizeof unary_cases / sizeof unary_cases[0])

static const shp unary_shapes[] = {SHP(3, 4), SHP(2, 1, 3), SHP0, SHP(0, 3), SHP(5)};

static void test_gradcheck_unary(void **state) {
    (void)state;
    for (size_t k = 0; k < N_UNARY; k++) {
        const un_case *uc = &unary_cases[k];
        op_ctx c = {uc->p0, uc->p1, NULL};
        for (size_t s = 0; s < sizeof unary_shapes / sizeof unary_shapes[0]; s++) {
            for (int nc = 0; nc < 2; nc++) {
                ct_tensor *x = rand_leaf(unary_shapes[s], uc->lo, uc->hi, nc, true);
                char what[96];
                snprintf(what, sizeof what, "%s shape#%zu%s", uc->name, s, nc ? " noncontig" : "");
                gradcheck_ok(what, uc->fn, &c, 1, &x);
                ct_tensor_release(x);
            }
        }
    }
}

typedef struct bin_case {
    const char *name;
    ct_gradcheck_fn fn;
    double alo, ahi, blo, bhi;
    double p0;
} bin_case;

static const bin_case binary_cases[] = {
    {"add", gc_add, -2, 2, -2, 2, 0},
    {"add_alpha", gc_add_alpha, -2, 2, -2, 2, 2.5},
    {"sub", gc_sub, -2, 2, -2, 2, 0},
    {"sub_alpha", gc_sub_alpha, -2, 2, -2, 2, -1.75},
    {"mul", gc_mul, -2, 2, -2, 2, 0},
    {"div", gc_div, -2, 2, 0.4, 2, 0},
    {"div negative", gc_div, -2, 2, -2, -0.4, 0},
    {"pow", gc_pow, 0.3, 2, -2, 2, 0},
    {"maximum", gc_maximum, -2, 2, -2, 2, 0},
    {"minimum", gc_minimum, -2, 2, -2, 2, 0},
};
#define N_BINARY (sizeof binary_cases / sizeof binary_cases[0])

/* Shape pairs: equal, [3,1] with [4], with a 0-d, both broadcast, empty. */
static const shp bin_shapes[][2] = {
    {SHP(3, 4), SHP(3, 4)}, {SHP(3, 1), SHP(4)}, {SHP(2, 3), SHP0},
    {SHP0, SHP(2, 3)},      {SHP(1, 4), SHP(3, 1)}, {SHP(2, 1, 3), SHP(4, 1)},
    {SHP(0, 3), SHP(3)},
};

static void test_gradcheck_binary(void **state) {
    (void)state;
    for (size_t k = 0; k < N_BINARY; k++) {
        const bin_case *bc = &binary_cases[k];
        op_ctx c = {bc->p0, 0, NULL};
        for (size_t s = 0; s < sizeof bin_shapes / sizeof bin_shapes[0]; s++) {
            /* which: 3 = both require grad, 1 = only a, 2 = only b (each node
             * saves only what the other input's gradient reads) */
            for (int which = 1; which <= 3; which++) {
                for (int nc = 0; nc < 2; nc++) {
                    ct_tensor *in[2] = {
                        rand_leaf_at(bin_shapes[s][0], bc->alo, bc->ahi, nc, which & 1, 0.001),
                        rand_leaf_at(bin_shapes[s][1], bc->blo, bc->bhi, nc, which & 2, 0.003),
                    };
                    char what[96];
                    snprintf(what, sizeof what, "%s shapes#%zu grads %d%s", bc->name, s, which,
                             nc ? " noncontig" : "");
                    gradcheck_ok(what, bc->fn, &c, 2, in);
                    ct_tensor_release(in[0]);
                    ct_tensor_release(in[1]);
                }
            }
        }
    }
}

static void test_gradcheck_where(void **state) {
    (void)state;
    /* cond, a, b shapes broadcasting together in different ways. */
    static const shp cases[][3] = {
        {SHP(3, 4), SHP(3, 1), SHP(4)},
        {SHP(3, 1), SHP(3, 4), SHP0},
        {SHP(4), SHP0, SHP(2, 1, 4)},
        {SHP(2, 3), SHP(2, 3), SHP(2, 3)},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (int nc = 0; nc < 2; nc++) {
            ct_tensor *cond = tu_rand(cases[k][0].nd, cases[k][0].s, CT_BOOL, 0, 2, NULL);
            op_ctx c = {0, 0, cond};
            for (int which = 1; which <= 3; which++) {
                ct_tensor *in[2] = {rand_leaf(cases[k][1], -2, 2, nc, which & 1),
                                    rand_leaf(cases[k][2], -2, 2, nc, which & 2)};
                char what[64];
                snprintf(what, sizeof what, "where case %zu grads %d%s", k, which,
                         nc ? " noncontig" : "");
                gradcheck_ok(what, gc_where, &c, 2, in);
                ct_tensor_release(in[0]);
                ct_tensor_release(in[1]);
            }
            ct_tensor_release(cond);
        }
    }
}

/* A composite expression: chains of formulas, a diamond and broadcasting. */
static ct_tensor *gc_composite(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    ct_tensor *x = in[0], *w = in[1], *b = in[2];
    ct_scope *s = ct_scope_begin();
    ct_tensor *h = ct_add(ct_mul(x, w), b);                    /* [3,4] */
    ct_tensor *g = ct_gelu(h, CT_GELU_TANH);
    ct_tensor *y = ct_add(ct_mul(ct_tanh(g), ct_sigmoid(h)), ct_div(ct_exp(ct_neg(ct_square(g))),
                                                                    ct_add_scalar(ct_abs(w), 1)));
    ct_tensor *z = ct_maximum(ct_sqrt(ct_add_scalar(ct_square(y), 0.5)), ct_clamp(h, -1, 1));
    ct_keep(z);
    ct_scope_end(s);
    return z;
}

static void test_gradcheck_composite(void **state) {
    (void)state;
    for (int nc = 0; nc < 2; nc++) {
        ct_tensor *in[3] = {rand_leaf((shp)SHP(3, 1), -1.5, 1.5, nc, true),
                            rand_leaf((shp)SHP(4), -1.5, 1.5, nc, true),
                            rand_leaf((shp)SHP(3, 4), -1, 1, nc, true)};
        gradcheck_ok("composite", gc_composite, NULL, 3, in);
        for (int k = 0; k < 3; k++) ct_tensor_release(in[k]);
    }
}

/* gradcheck itself must catch a wrong gradient: x * detach(x) has analytic
 * gradient x, numeric 2x. */
static ct_tensor *gc_wrong(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    ct_tensor *d = ct_detach(in[0]);
    ct_tensor *y = ct_mul(in[0], d);
    ct_tensor_release(d);
    return y;
}

static void test_gradcheck_detects_mismatch(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(3), 0.5, 1.5, false, true);
    ct_status st = ct_gradcheck(gc_wrong, NULL, 1, &x, 1e-6, 1e-5, 1e-4);
    tu_assert_error(st, CT_ERR_AUTOGRAD, "ct_gradcheck", "mismatch", "input 0");
    ct_tensor_release(x);
}

/* ---- edge values PyTorch defines ---------------------------------------------------------- */

/* d(sum(f(x) * go))/dx for a one-input op on float64 values. */
static double *grad1(ct_tensor *(*f)(ct_tensor *, void *), void *ctx, const double *xv,
                     int64_t n) {
    int64_t shape[1] = {n};
    ct_tensor *x = leaf_of(xv, 1, shape, CT_F64);
    ct_tensor *y = f(x, ctx);
    assert_non_null(y);
    assert_true(ct_requires_grad(y));
    backward_ones(y);
    assert_non_null(ct_grad(x));
    double *g = tu_values(ct_grad(x));
    ct_tensor_release(y);
    ct_tensor_release(x);
    return g;
}

static ct_tensor *f_relu(ct_tensor *x, void *c) { (void)c; return ct_relu(x); }
static ct_tensor *f_abs(ct_tensor *x, void *c) { (void)c; return ct_abs(x); }
static ct_tensor *f_sign(ct_tensor *x, void *c) { (void)c; return ct_sign(x); }
static ct_tensor *f_gelu(ct_tensor *x, void *c) { (void)c; return ct_gelu(x, CT_GELU_NONE); }
static ct_tensor *f_gelu_tanh(ct_tensor *x, void *c) { (void)c; return ct_gelu(x, CT_GELU_TANH); }
static ct_tensor *f_clamp(ct_tensor *x, void *c) {
    const double *b = c;
    return ct_clamp(x, b[0], b[1]);
}
static ct_tensor *f_pow0(ct_tensor *x, void *c) { (void)c; return ct_pow_scalar(x, 0.0); }
static ct_tensor *f_max_s(ct_tensor *x, void *c) { return ct_maximum_scalar(x, *(double *)c); }
static ct_tensor *f_min_s(ct_tensor *x, void *c) { return ct_minimum_scalar(x, *(double *)c); }

static void test_edge_unary(void **state) {
    (void)state;
    const double xv[5] = {-1.5, -0.0, 0.0, 0.5, 2.0};
    double *g;
    /* relu and abs: 0 at 0 */
    g = grad1(f_relu, NULL, xv, 5);
    tu_assert_close(g, ((double[]){0, 0, 0, 1, 1}), 5, 0, 0);
    free(g);
    g = grad1(f_abs, NULL, xv, 5);
    tu_assert_close(g, ((double[]){-1, 0, 0, 1, 1}), 5, 0, 0);
    free(g);
    /* sign: a zero gradient, present (not NULL), as PyTorch */
    g = grad1(f_sign, NULL, xv, 5);
    tu_assert_close(g, ((double[]){0, 0, 0, 0, 0}), 5, 0, 0);
    free(g);
    /* x^0: zeros, not NaN at 0 */
    g = grad1(f_pow0, NULL, xv, 5);
    tu_assert_close(g, ((double[]){0, 0, 0, 0, 0}), 5, 0, 0);
    free(g);
    /* gelu at 0 and at tiny (also subnormal) x: Phi(0) = 0.5; far tails: 0 and 1 */
    const double gx[7] = {0.0, 1e-200, -1e-40, -40.0, 40.0, 1.0, 5e-324};
    double phi1 = 0.5 * (1 + erf(M_SQRT1_2)) + exp(-0.5) / sqrt(2 * M_PI);
    g = grad1(f_gelu, NULL, gx, 7);
    tu_assert_close(g, ((double[]){0.5, 0.5, 0.5, 0, 1, phi1, 0.5}), 7, 1e-12, 1e-300);
    free(g);
    const double k = sqrt(2 / M_PI), t1 = tanh(k * 1.044715);
    double tanh1 = 0.5 * (1 + t1) + 0.5 * (1 - t1 * t1) * k * (1 + 3 * 0.044715);
    g = grad1(f_gelu_tanh, NULL, gx, 7);
    tu_assert_close(g, ((double[]){0.5, 0.5, 0.5, 0, 1, tanh1, 0.5}), 7, 1e-12, 1e-300);
    free(g);
    /* clamp: bounds inclusive */
    const double cx[7] = {-1, -0.5, -0.25, 0, 0.5, 0.75, NAN};
    double bounds[2] = {-0.5, 0.5};
    g = grad1(f_clamp, bounds, cx, 7);
    tu_assert_close(g, ((double[]){0, 1, 1, 1, 1, 0, 0}), 7, 0, 0);
    free(g);
    double lower[2] = {-0.25, INFINITY};
    g = grad1(f_clamp, lower, cx, 7);
    tu_assert_close(g, ((double[]){0, 0, 1, 1, 1, 1, 0}), 7, 0, 0);
    free(g);
    /* maximum/minimum with a scalar: ties split half */
    const double mx[4] = {-1, 0.5, 1, 2};
    double s = 1.0;
    g = grad1(f_max_s, &s, mx, 4);
    tu_assert_close(g, ((double[]){0, 0, 0.5, 1}), 4, 0, 0);
    free(g);
    g = grad1(f_min_s, &s, mx, 4);
    tu_assert_close(g, ((double[]){1, 1, 0.5, 0}), 4, 0, 0);
    free(g);
}

static void test_edge_maximum_minimum(void **state) {
    (void)state;
    const double av[5] = {1, 2, 3, -1, NAN}, bv[5] = {1, 0, 5, -1, 0};
    int64_t shape[1] = {5};
    for (int mx = 0; mx < 2; mx++) {
        ct_tensor *a = leaf_of(av, 1, shape, CT_F64), *b = leaf_of(bv, 1, shape, CT_F64);
        ct_tensor *y = mx ? ct_maximum(a, b) : ct_minimum(a, b);
        assert_string_equal(ct_grad_fn_name(y), mx ? "MaximumBackward" : "MinimumBackward");
        const double gov[5] = {2, 3, 4, 6, 8};
        ct_tensor *go = tu_from_f64(gov, 1, shape, CT_F64);
        assert_int_equal(ct_backward(y, go, false), CT_OK);
        /* ties: half each; NaN: both get it, as PyTorch */
        if (mx) {
            check_values(ct_grad(a), (double[]){1, 3, 0, 3, 8}, 5, 0, 0);
            check_values(ct_grad(b), (double[]){1, 0, 4, 3, 8}, 5, 0, 0);
        } else {
            check_values(ct_grad(a), (double[]){1, 0, 4, 3, 8}, 5, 0, 0);
            check_values(ct_grad(b), (double[]){1, 3, 0, 3, 8}, 5, 0, 0);
        }
        ct_tensor_release(go);
        ct_tensor_release(y);
        ct_tensor_release(a);
        ct_tensor_release(b);
    }
}

static void test_edge_pow(void **state) {
    (void)state;
    /* a^b at a = 0: d/da is 0 for b = 0; d/db is 0 where a == 0 and b >= 0. */
    const double av[4] = {0, 0, 2, 0}, bv[4] = {0, 2, 3, 0.5};
    int64_t shape[1] = {4};
    ct_tensor *a = leaf_of(av, 1, shape, CT_F64), *b = leaf_of(bv, 1, shape, CT_F64);
    ct_tensor *y = ct_pow(a, b);
    backward_ones(y);
    check_values(ct_grad(a), (double[]){0, 0, 12, INFINITY}, 4, 1e-14, 0);
    check_values(ct_grad(b), (double[]){0, 0, 8 * log(2.0), 0}, 4, 1e-14, 0);
    ct_tensor_release(y);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

static void test_where_grads(void **state) {
    (void)state;
    const double cv[4] = {1, 0, 0, 1}, av[4] = {1, 2, 3, 4}, bv[1] = {7};
    ct_tensor *cond = tu_from_f64(cv, CT_SHAPE(4), CT_BOOL);
    ct_tensor *a = leaf_of(av, CT_SHAPE(4), CT_F32), *b = leaf_of(bv, CT_NONE, CT_F32);
    ct_tensor *y = ct_where(cond, a, b);
    assert_string_equal(ct_grad_fn_name(y), "WhereBackward");
    const double gov[4] = {10, 20, 30, 40};
    ct_tensor *go = tu_from_f64(gov, CT_SHAPE(4), CT_F32);
    assert_int_equal(ct_backward(y, go, false), CT_OK);
    check_values(ct_grad(a), (double[]){10, 0, 0, 40}, 4, 0, 0);
    check_values(ct_grad(b), (double[]){50}, 1, 0, 0); /* summed to the 0-d shape */
    assert_int_equal(ct_tensor_ndim(ct_grad(b)), 0);
    assert_int_equal(ct_tensor_dtype(ct_grad(a)), CT_F32);
    assert_false(ct_requires_grad(cond));
    assert_null(ct_grad(cond));
    ct_tensor_release(go);
    ct_tensor_release(y);
    ct_tensor_release(cond);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

/* ---- dtypes ------------------------------------------------------------------------------- */

typedef ct_tensor *(*un_op)(ct_tensor *);
#define UN_FN_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi)                           \
    static ct_tensor *u_##nm(ct_tensor *x) { return call; }                                 \
    static double d_##nm(double x) { return (dref); }
CT_UNARY_OPS(UN_FN_)
CT_UNARY_VARIANTS(UN_FN_)
#undef UN_FN_
static ct_tensor *u_pow(ct_tensor *x) { return ct_pow_scalar(x, 1.5); }
static ct_tensor *u_clamp(ct_tensor *x) { return ct_clamp(x, -0.4, 0.6); }
static ct_tensor *u_div(ct_tensor *x) { return ct_div_scalar(x, 3.0); }

static const struct {
    const char *name;
    un_op fn;
    double lo, hi;
} dt_unary[] = {
#define UN_ROW_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi) {#nm, u_##nm, glo, ghi},
    CT_UNARY_OPS(UN_ROW_)
    CT_UNARY_VARIANTS(UN_ROW_)
#undef UN_ROW_
    {"pow_scalar", u_pow, 0.5, 2},   {"clamp", u_clamp, -1, 1},
    {"div_scalar", u_div, -2, 2},
};

/* Gradients in f32/f16/bf16 keep the input's dtype and match the float64
 * gradient at the same (rounded) values. */
static void test_dtypes_unary(void **state) {
    (void)state;
    const ct_dtype dts[3] = {CT_F32, CT_F16, CT_BF16};
    int64_t shape[2] = {4, 5};
    for (size_t k = 0; k < sizeof dt_unary / sizeof dt_unary[0]; k++) {
        for (int d = 0; d < 3; d++) {
            ct_dtype dt = dts[d];
            double *xv = tu_rand_vals(20, dt, dt_unary[k].lo, dt_unary[k].hi);
            double *gv = tu_rand_vals(20, dt, 0.5, 1.5);
            ct_tensor *x = leaf_of(xv, 2, shape, dt), *x64 = leaf_of(xv, 2, shape, CT_F64);
            ct_tensor *go = tu_from_f64(gv, 2, shape, dt);
            ct_tensor *go64 = tu_from_f64(gv, 2, shape, CT_F64);
            ct_tensor *y = dt_unary[k].fn(x), *y64 = dt_unary[k].fn(x64);
            assert_int_equal(ct_backward(y, go, false), CT_OK);
            assert_int_equal(ct_backward(y64, go64, false), CT_OK);
            assert_int_equal(ct_tensor_dtype(ct_grad(x)), dt);
            double *ref = tu_values(ct_grad(x64));
            /* each of a few ops rounds once to dt */
            double tol = 4 * tu_rtol(dt);
            double *got = tu_values(ct_grad(x));
            for (int64_t i = 0; i < 20; i++) {
                if (!(fabs(got[i] - ref[i]) <= tol + tol * fabs(ref[i]))) {
                    fprintf(stderr, "%s %s element %lld: got %g, expected %g\n",
                            dt_unary[k].name, ct_dtype_name(dt), (long long)i, got[i], ref[i]);
                    fail();
                }
            }
            free(got);
            free(ref);
            free(xv);
            free(gv);
            ct_tensor *ts[6] = {x, x64, go, go64, y, y64};
            for (int i = 0; i < 6; i++) ct_tensor_release(ts[i]);
        }
    }
}

/* The shared unary rows with their float64 derivatives (unary_ops.inc). */
static const struct {
    const char *name;
    un_op fn;
    double (*dref)(double);
    double lo, hi;
} un_rows[] = {
#define UN_DROW_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi) {#nm, u_##nm, d_##nm, glo, ghi},
    CT_UNARY_OPS(UN_DROW_)
    CT_UNARY_VARIANTS(UN_DROW_)
#undef UN_DROW_
};
#define N_UN_ROWS (sizeof un_rows / sizeof un_rows[0])

/* The float64 gradient of row's op at xv (n values, non-contiguous when nc). */
static double *unary_grad(size_t row, const double *xv, int64_t n, bool nc) {
    int64_t shape[1] = {n};
    ct_tensor *x = tu_from_f64(xv, 1, shape, CT_F64);
    if (nc) {
        ct_tensor *v = tu_noncontig(x);
        ct_tensor_release(x);
        x = v;
    }
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *y = un_rows[row].fn(x);
    assert_non_null(y);
    backward_ones(y);
    assert_non_null(ct_grad(x));
    double *g = tu_values(ct_grad(x));
    ct_tensor_release(y);
    ct_tensor_release(x);
    return g;
}

/* g against ref, naming the row on a mismatch. */
static void check_grads(const char *name, const double *g, const double *ref, int64_t n,
                        double rtol, double atol) {
    for (int64_t i = 0; i < n; i++) {
        bool ok = isnan(ref[i]) ? isnan(g[i])
                  : isinf(ref[i]) ? g[i] == ref[i]
                                  : fabs(g[i] - ref[i]) <= atol + rtol * fabs(ref[i]);
        if (!ok) fprintf(stderr, "%s: gradient %.17g, derivative %.17g\n", name, g[i], ref[i]);
    }
    tu_assert_close(g, ref, n, rtol, atol);
}

/* Float64 gradients of every row on fresh random inputs against its
 * derivative (gradcheck compares with finite differences; this with the
 * closed form). */
static void test_unary_derivatives(void **state) {
    (void)state;
    for (size_t k = 0; k < N_UN_ROWS; k++) {
        for (int nc = 0; nc < 2; nc++) {
            double *xv = tu_rand_vals(37, CT_F64, un_rows[k].lo, un_rows[k].hi), ref[37];
            for (int i = 0; i < 37; i++) ref[i] = un_rows[k].dref(xv[i]);
            double *g = unary_grad(k, xv, 37, nc);
            check_grads(un_rows[k].name, g, ref, 37, 1e-10, 1e-12);
            free(g);
            free(xv);
        }
    }
}

/* The rows' pinned points (unary_ops.inc): the float64 gradient against the
 * derivative, relatively, in the tails and on each side of a branch. */
static void test_unary_points_grad(void **state) {
    (void)state;
    static const struct {
        const char *name;
        double x;
    } points[] = {
#define UN_POINT_(nm, px) {#nm, px},
        CT_UNARY_POINTS(UN_POINT_)
#undef UN_POINT_
    };
    for (size_t k = 0; k < sizeof points / sizeof points[0]; k++) {
        size_t row = 0;
        while (row < N_UN_ROWS && strcmp(un_rows[row].name, points[k].name) != 0) row++;
        assert_true(row < N_UN_ROWS);
        double ref = un_rows[row].dref(points[k].x);
        double *g = unary_grad(row, &points[k].x, 1, false);
        check_grads(points[k].name, g, &ref, 1, 1e-10, 0);
        free(g);
    }
}

typedef ct_tensor *(*bin_op)(ct_tensor *, ct_tensor *);
static ct_tensor *b_add_alpha(ct_tensor *a, ct_tensor *b) { return ct_add_alpha(a, b, -0.5); }

static const struct {
    const char *name;
    bin_op fn;
    double lo, hi;
} dt_binary[] = {
    {"add_alpha", b_add_alpha, -2, 2}, {"mul", ct_mul, -2, 2},
    {"div", ct_div, 0.5, 2},           {"pow", ct_pow, 0.5, 2},
    {"maximum", ct_maximum, -2, 2},    {"minimum", ct_minimum, -2, 2},
};

/* The same for binary ops, with broadcasting ([4,1] with [5]). */
static void test_dtypes_binary(void **state) {
    (void)state;
    const ct_dtype dts[3] = {CT_F32, CT_F16, CT_BF16};
    int64_t sa[2] = {4, 1}, sb[1] = {5}, so[2] = {4, 5};
    for (size_t k = 0; k < sizeof dt_binary / sizeof dt_binary[0]; k++) {
        for (int d = 0; d < 3; d++) {
            ct_dtype dt = dts[d];
            double *av = tu_rand_vals(4, dt, dt_binary[k].lo, dt_binary[k].hi);
            double *bv = tu_rand_vals(5, dt, dt_binary[k].lo, dt_binary[k].hi);
            double *gv = tu_rand_vals(20, dt, 0.5, 1.5);
            ct_tensor *a = leaf_of(av, 2, sa, dt), *a64 = leaf_of(av, 2, sa, CT_F64);
            ct_tensor *b = leaf_of(bv, 1, sb, dt), *b64 = leaf_of(bv, 1, sb, CT_F64);
            ct_tensor *go = tu_from_f64(gv, 2, so, dt), *go64 = tu_from_f64(gv, 2, so, CT_F64);
            ct_tensor *y = dt_binary[k].fn(a, b), *y64 = dt_binary[k].fn(a64, b64);
            assert_int_equal(ct_backward(y, go, false), CT_OK);
            assert_int_equal(ct_backward(y64, go64, false), CT_OK);
            /* sums of 5 (a) or 4 (b) products, each rounded a few times */
            double tol = 16 * tu_rtol(dt);
            ct_tensor *pairs[2][2] = {{a, a64}, {b, b64}};
            for (int p = 0; p < 2; p++) {
                assert_int_equal(ct_tensor_dtype(ct_grad(pairs[p][0])), dt);
                double *got = tu_values(ct_grad(pairs[p][0]));
                double *ref = tu_values(ct_grad(pairs[p][1]));
                int64_t n = ct_tensor_numel(pairs[p][0]);
                for (int64_t i = 0; i < n; i++) {
                    if (!(fabs(got[i] - ref[i]) <= tol + tol * fabs(ref[i]))) {
                        fprintf(stderr, "%s %s input %d element %lld: got %g, expected %g\n",
                                dt_binary[k].name, ct_dtype_name(dt), p, (long long)i, got[i],
                                ref[i]);
                        fail();
                    }
                }
                free(got);
                free(ref);
            }
            free(av);
            free(bv);
            free(gv);
            ct_tensor *ts[8] = {a, a64, b, b64, go, go64, y, y64};
            for (int i = 0; i < 8; i++) ct_tensor_release(ts[i]);
        }
    }
}

/* Mixed dtypes: each input's gradient comes back in its own dtype; an
 * integer operand takes part without a gradient. */
static void test_dtypes_mixed(void **state) {
    (void)state;
    double *av = NULL, *bv = NULL;
    ct_tensor *a = tu_rand(CT_SHAPE(2, 3), CT_F32, -2, 2, &av);
    ct_tensor *b = tu_rand(CT_SHAPE(3), CT_F64, 0.5, 2, &bv);
    ct_tensor *i = tu_rand(CT_SHAPE(2, 3), CT_I32, -5, 5, NULL);
    assert_int_equal(ct_requires_grad_(a, true), CT_OK);
    assert_int_equal(ct_requires_grad_(b, true), CT_OK);
    ct_tensor *ai = ct_mul(a, i);
    ct_tensor *y = ct_div(ai, b); /* f64 [2,3] */
    ct_tensor_release(ai);
    assert_int_equal(ct_tensor_dtype(y), CT_F64);
    backward_ones(y);
    assert_int_equal(ct_tensor_dtype(ct_grad(a)), CT_F32);
    assert_int_equal(ct_tensor_dtype(ct_grad(b)), CT_F64);
    assert_null(ct_grad(i));
    double *iv = tu_values(i);
    double ga[6], gb[3] = {0, 0, 0};
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++) {
            ga[r * 3 + c] = iv[r * 3 + c] / bv[c];
            gb[c] += -av[r * 3 + c] * iv[r * 3 + c] / (bv[c] * bv[c]);
        }
    check_values(ct_grad(a), ga, 6, 1e-6, 1e-6);
    check_values(ct_grad(b), gb, 3, 1e-6, 1e-6);
    free(iv);
    free(av);
    free(bv);
    ct_tensor_release(y);
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(i);
}

/* x used twice: both uses send their gradient to x. */
static void test_same_input_twice(void **state) {
    (void)state;
    double *xv = NULL;
    ct_tensor *x = tu_rand(CT_SHAPE(5), CT_F64, 0.5, 2, &xv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    double ref[5];
    struct {
        ct_tensor *(*op)(ct_tensor *, ct_tensor *);
    } ops[] = {{ct_mul}, {ct_add}, {ct_sub}, {ct_div}, {ct_pow}, {ct_maximum}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        ct_tensor *y = ops[k].op(x, x);
        backward_ones(y);
        for (int i = 0; i < 5; i++) {
            double v = xv[i];
            switch (k) {
            case 0: ref[i] = 2 * v; break;
            case 1: ref[i] = 2; break;
            case 2: ref[i] = 0; break;
            case 3: ref[i] = 0; break;
            case 4: ref[i] = pow(v, v) * (log(v) + 1); break;
            default: ref[i] = 1; break; /* the two halves of the tie */
            }
        }
        check_values(ct_grad(x), ref, 5, 1e-12, 1e-12);
        ct_zero_grad(x);
        ct_tensor_release(y);
    }
    free(xv);
    ct_tensor_release(x);
}

/* Comparisons give bool results with no history; only the differentiable
 * path carries a gradient. */
static void test_non_differentiable(void **state) {
    (void)state;
    const double xv[4] = {-1, 2, -3, 4};
    ct_tensor *x = leaf_of(xv, CT_SHAPE(4), CT_F64);
    ct_tensor *m = ct_gt_scalar(x, 0);
    ct_tensor *m2 = ct_lt(x, x);
    ct_tensor *m3 = ct_logical_not(m);
    assert_false(ct_requires_grad(m));
    assert_false(ct_requires_grad(m2));
    assert_false(ct_requires_grad(m3));
    assert_null(ct_grad_fn_name(m));
    tu_assert_error(ct_backward(m, NULL, false), CT_ERR_AUTOGRAD, "does not require grad");
    ct_tensor *z = ct_tensor_zeros(CT_SHAPE(4), CT_F64, ct_tensor_device(x));
    ct_tensor *y = ct_where(m, x, z);
    backward_ones(y);
    check_values(ct_grad(x), (double[]){0, 1, 0, 1}, 4, 0, 0);
    assert_null(ct_grad(z));
    ct_tensor *ts[6] = {x, m, m2, m3, z, y};
    for (int i = 0; i < 6; i++) ct_tensor_release(ts[i]);
}

/* A failing op records nothing and leaks nothing; its inputs keep their state. */
static void test_failure_no_graph(void **state) {
    (void)state;
    ct_tensor *a = rand_leaf((shp)SHP(3), -1, 1, false, true);
    ct_tensor *b = rand_leaf((shp)SHP(4), -1, 1, false, true);
    cti_alloc_stats before = cti_get_alloc_stats();
    tu_assert_null_error(ct_add(a, b), CT_ERR_SHAPE, "ct_add", "[3]", "[4]");
    tu_assert_null_error(ct_mul(a, NULL), CT_ERR_INVALID_ARG, "ct_mul");
    ct_tensor *i = ct_tensor_zeros(CT_SHAPE(3), CT_I64, ct_tensor_device(a));
    cti_alloc_stats mid = cti_get_alloc_stats();
    tu_assert_null_error(ct_where(i, a, a), CT_ERR_DTYPE, "ct_where", "bool");
    tu_assert_null_error(ct_gelu(a, (ct_gelu_approx)7), CT_ERR_INVALID_ARG, "ct_gelu");
    assert_true(same_stats(mid, cti_get_alloc_stats()));
    ct_tensor_release(i);
    assert_true(same_stats(before, cti_get_alloc_stats()));
    assert_true(ct_is_leaf(a));
    assert_null(ct_grad(a));
    ct_tensor_release(a);
    ct_tensor_release(b);
}

static void test_grad_fn_names(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(2), 0.5, 1, false, true);
    ct_tensor *w = rand_leaf((shp)SHP(2), 0.5, 1, false, false);
    assert_true(ct_is_leaf(x));
    assert_null(ct_grad_fn_name(x));
    static const struct {
        const char *name;
        int op;
    } want[] = {{"AddBackward", 0}, {"SubBackward", 1}, {"MulBackward", 2}, {"DivBackward", 3},
                {"PowBackward", 4}, {"RsubBackward", 5}, {"ExpBackward", 6}, {"ReluBackward", 7},
                {"ClampBackward", 8}, {"GeluBackward", 9}, {"SignBackward", 10},
                {"AddBackward", 11}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        ct_tensor *y = NULL;
        switch (want[k].op) {
        case 0: y = ct_add(w, x); break;
        case 1: y = ct_sub_scalar(x, 1); break;
        case 2: y = ct_mul_scalar(x, 2); break;
        case 3: y = ct_div(w, x); break;
        case 4: y = ct_pow(w, x); break;
        case 5: y = ct_rsub_scalar(x, 1); break;
        case 6: y = ct_exp(x); break;
        case 7: y = ct_relu(x); break;
        case 8: y = ct_clamp(x, 0, 1); break;
        case 9: y = ct_gelu(x, CT_GELU_TANH); break;
        case 10: y = ct_sign(x); break;
        default: y = ct_add_alpha(x, w, 3); break;
        }
        assert_non_null(y);
        assert_true(ct_requires_grad(y));
        assert_false(ct_is_leaf(y));
        assert_string_equal(ct_grad_fn_name(y), want[k].name);
        ct_tensor_release(y);
    }
    /* no operand requires grad: nothing recorded */
    ct_tensor *p = ct_mul(w, w);
    assert_false(ct_requires_grad(p));
    assert_true(ct_is_leaf(p));
    ct_tensor_release(p);
    ct_tensor_release(x);
    ct_tensor_release(w);
}

/* ---- in-place rules ------------------------------------------------------------------------ */

typedef struct ip_case {
    const char *name;
    ct_status (*fn)(ct_tensor *a, ct_tensor *b);
    bool binary; /* b is an operand */
} ip_case;

static ct_status ip_add(ct_tensor *a, ct_tensor *b) { return ct_add_(a, b); }
static ct_status ip_add_alpha(ct_tensor *a, ct_tensor *b) { return ct_add_alpha_(a, b, 0.5); }
static ct_status ip_sub(ct_tensor *a, ct_tensor *b) { return ct_sub_(a, b); }
static ct_status ip_mul(ct_tensor *a, ct_tensor *b) { return ct_mul_(a, b); }
static ct_status ip_div(ct_tensor *a, ct_tensor *b) { return ct_div_(a, b); }
static ct_status ip_pow(ct_tensor *a, ct_tensor *b) { return ct_pow_(a, b); }
static ct_status ip_add_s(ct_tensor *a, ct_tensor *b) { (void)b; return ct_add_scalar_(a, 1.5); }
static ct_status ip_sub_s(ct_tensor *a, ct_tensor *b) { (void)b; return ct_sub_scalar_(a, 1.5); }
static ct_status ip_mul_s(ct_tensor *a, ct_tensor *b) { (void)b; return ct_mul_scalar_(a, 1.5); }
static ct_status ip_div_s(ct_tensor *a, ct_tensor *b) { (void)b; return ct_div_scalar_(a, 1.5); }
static ct_status ip_clamp(ct_tensor *a, ct_tensor *b) { (void)b; return ct_clamp_(a, 0.7, 0.9); }
static ct_status ip_neg(ct_tensor *a, ct_tensor *b) { (void)b; return ct_neg_(a); }
static ct_status ip_exp(ct_tensor *a, ct_tensor *b) { (void)b; return ct_exp_(a); }
static ct_status ip_sqrt(ct_tensor *a, ct_tensor *b) { (void)b; return ct_sqrt_(a); }
static ct_status ip_relu(ct_tensor *a, ct_tensor *b) { (void)b; return ct_relu_(a); }

static const ip_case ip_cases[] = {
    {"ct_add_", ip_add, true},          {"ct_add_alpha_", ip_add_alpha, true},
    {"ct_sub_", ip_sub, true},          {"ct_mul_", ip_mul, true},
    {"ct_div_", ip_div, true},          {"ct_pow_", ip_pow, true},
    {"ct_add_scalar_", ip_add_s, false}, {"ct_sub_scalar_", ip_sub_s, false},
    {"ct_mul_scalar_", ip_mul_s, false}, {"ct_div_scalar_", ip_div_s, false},
    {"ct_clamp_", ip_clamp, false},      {"ct_neg_", ip_neg, false},
    {"ct_exp_", ip_exp, false},          {"ct_sqrt_", ip_sqrt, false},
    {"ct_relu_", ip_relu, false},
};

static void assert_unchanged(const ct_tensor *t, const double *vals, unsigned version) {
    check_values(t, vals, 6, 0, 0);
    assert_int_equal(version_of(t), version);
}

static void test_inplace_rules(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof ip_cases / sizeof ip_cases[0]; k++) {
        const ip_case *ic = &ip_cases[k];
        double *av = NULL, *bv = NULL;
        ct_tensor *a = tu_rand(CT_SHAPE(2, 3), CT_F64, 0.5, 1.5, &av);
        ct_tensor *b = tu_rand(CT_SHAPE(3), CT_F64, 0.5, 1.5, &bv);
        unsigned v0 = version_of(a);

        /* a leaf that requires grad */
        assert_int_equal(ct_requires_grad_(a, true), CT_OK);
        tu_assert_error(ic->fn(a, b), CT_ERR_AUTOGRAD, ic->name, "leaf", "requires grad",
                        "[2, 3] float64 cpu");
        assert_unchanged(a, av, v0);

        /* a tensor with history is updated and recorded, a view of it living
         * or not, and so is a view of it (test_autograd_inplace checks the
         * gradients); the view of a leaf that requires grad is refused */
        ct_tensor *h = ct_mul_scalar(a, 1.0);
        unsigned vh = version_of(h);
        ct_tensor *hv = ct_narrow(h, 0, 0, 1);
        ct_tensor *av0 = ct_narrow(a, 0, 0, 1);
        tu_assert_error(ic->fn(av0, b), CT_ERR_AUTOGRAD, ic->name, "a view of a leaf Variable",
                        "NarrowBackward");
        assert_unchanged(a, av, v0);
        ct_tensor_release(av0);
        assert_int_equal(ic->fn(h, b), CT_OK);
        assert_int_equal(version_of(h), vh + 1);
        assert_non_null(ct_grad_fn_name(h));
        assert_string_equal(ct_grad_fn_name(hv), "AsStridedBackward");
        assert_int_equal(ic->fn(hv, b), CT_OK);
        assert_int_equal(version_of(h), vh + 2);
        assert_string_equal(ct_grad_fn_name(h), "CopySlices");
        ct_tensor_release(hv);

        /* a plain tensor updated from an operand that requires grad joins the
         * graph (a detached alias of it, which has no history, does not
         * matter), and so does the base of a plain view updated that way */
        ct_tensor *p = tu_from_f64(av, CT_SHAPE(2, 3), CT_F64);
        unsigned vp = version_of(p);
        if (ic->binary) {
            assert_int_equal(ct_requires_grad_(b, true), CT_OK);
            ct_tensor *q = tu_from_f64(av, CT_SHAPE(2, 3), CT_F64);
            ct_tensor *qd = ct_detach(q);
            assert_int_equal(ic->fn(q, b), CT_OK);
            assert_true(ct_requires_grad(q) && !ct_is_leaf(q));
            assert_false(ct_requires_grad(qd));
            ct_tensor *r = tu_from_f64(av, CT_SHAPE(2, 3), CT_F64);
            ct_tensor *rv = ct_select(r, 0, 1);
            assert_int_equal(ic->fn(rv, b), CT_OK);
            assert_true(ct_requires_grad(r) && !ct_is_leaf(r));
            release_all(4, (ct_tensor *[]){q, qd, r, rv});
            assert_int_equal(ct_requires_grad_(b, false), CT_OK);
        }

        /* plain tensors in grad mode, and the leaf in no-grad mode, are updated */
        assert_int_equal(ic->fn(p, b), CT_OK);
        assert_int_equal(version_of(p), vp + 1);
        bool prev = ct_no_grad_begin();
        assert_true(prev);
        if (ic->binary) assert_int_equal(ct_requires_grad_(b, true), CT_OK);
        assert_int_equal(ic->fn(a, b), CT_OK);
        ct_no_grad_end(prev);
        assert_true(ct_is_grad_enabled());
        assert_int_equal(version_of(a), v0 + 1);
        double *pv = tu_values(p);
        check_values(a, pv, 6, 0, 0);
        assert_true(ct_requires_grad(a));
        assert_true(ct_is_leaf(a));
        free(pv);

        free(av);
        free(bv);
        ct_tensor_release(h);
        ct_tensor_release(p);
        ct_tensor_release(a);
        ct_tensor_release(b);
    }
}

/* ---- the engine ---------------------------------------------------------------------------- */

static void test_backward_nonscalar(void **state) {
    (void)state;
    double *xv = NULL;
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3), CT_F64, -1, 1, &xv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *y = ct_mul(x, x);
    /* no grad_out for a non-scalar */
    tu_assert_error(ct_backward(y, NULL, false), CT_ERR_SHAPE, "ct_backward", "one-element",
                    "[2, 3]", "grad_out");
    assert_null(ct_grad(x));
    /* a grad_out of the wrong shape */
    ct_tensor *bad = ct_tensor_ones(CT_SHAPE(3, 2), CT_F64, ct_tensor_device(x));
    tu_assert_error(ct_backward(y, bad, false), CT_ERR_SHAPE, "ct_backward", "grad_out",
                    "[3, 2]", "[2, 3]");
    assert_null(ct_grad(x));
    /* grad_out in another dtype is converted */
    double *gv = NULL;
    ct_tensor *go = tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, &gv);
    assert_int_equal(ct_backward(y, go, false), CT_OK);
    double ref[6];
    for (int i = 0; i < 6; i++) ref[i] = 2 * xv[i] * gv[i];
    check_values(ct_grad(x), ref, 6, 1e-12, 1e-12);
    assert_int_equal(ct_tensor_dtype(ct_grad(x)), CT_F64);

    /* a one-element output needs no grad_out */
    ct_tensor *s2 = ct_tensor_from_data((double[]){xv[5]}, CT_F64, CT_SHAPE(1, 1));
    assert_int_equal(ct_requires_grad_(s2, true), CT_OK);
    ct_tensor *z = ct_exp(s2);
    assert_int_equal(ct_backward(z, NULL, false), CT_OK);
    check_values(ct_grad(s2), (double[]){exp(xv[5])}, 1, 1e-14, 0);
    /* backward on a leaf: grad_out lands in its grad */
    assert_int_equal(ct_backward(s2, NULL, false), CT_OK);
    check_values(ct_grad(s2), (double[]){exp(xv[5]) + 1}, 1, 1e-14, 0);
    free(xv);
    free(gv);
    ct_tensor *ts[6] = {x, y, bad, go, s2, z};
    for (int i = 0; i < 6; i++) ct_tensor_release(ts[i]);
}

static void test_accumulate_and_retain(void **state) {
    (void)state;
    double *xv = NULL;
    ct_tensor *x = tu_rand(CT_SHAPE(4), CT_F64, -1, 1, &xv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *x2 = ct_mul_scalar(x, 2);
    ct_tensor *y = ct_sin(x2);
    ct_tensor_release(x2); /* the graph keeps what backward needs */
    double ref[4];
    for (int i = 0; i < 4; i++) ref[i] = 2 * cos(2 * xv[i]);
    backward_ones_retain(y, true);
    check_values(ct_grad(x), ref, 4, 1e-14, 0);
    /* the second backward accumulates */
    backward_ones(y);
    for (int i = 0; i < 4; i++) ref[i] *= 2;
    check_values(ct_grad(x), ref, 4, 1e-14, 0);
    /* the graph is freed now */
    ct_tensor *g = ct_tensor_ones_like(y);
    tu_assert_error(ct_backward(y, g, false), CT_ERR_AUTOGRAD, "ct_backward", "second time",
                    "retain_graph", "SinBackward");
    check_values(ct_grad(x), ref, 4, 1e-14, 0); /* unchanged by the failure */
    /* a fresh graph accumulates into the same grad */
    ct_tensor *y2 = ct_mul_scalar(x, 3);
    backward_ones_retain(y2, true);
    for (int i = 0; i < 4; i++) ref[i] += 3;
    check_values(ct_grad(x), ref, 4, 1e-14, 0);
    /* zero_grad drops it; set_grad replaces it */
    ct_zero_grad(x);
    assert_null(ct_grad(x));
    ct_tensor *r = ct_tensor_full(CT_SHAPE(4), 0.25, CT_F64, ct_tensor_device(x));
    assert_int_equal(ct_set_grad(x, r), CT_OK);
    backward_ones_retain(y2, true);
    check_values(ct_grad(x), (double[]){3.25, 3.25, 3.25, 3.25}, 4, 0, 0);
    check_values(r, (double[]){0.25, 0.25, 0.25, 0.25}, 4, 0, 0); /* not written through */
    free(xv);
    ct_tensor *ts[5] = {x, y, g, y2, r};
    for (int i = 0; i < 5; i++) ct_tensor_release(ts[i]);
}

/* A second output sharing a freed subgraph fails too; retain keeps it. */
static void test_shared_subgraph_freed(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(3), 0.5, 1, false, true);
    ct_tensor *w = rand_leaf((shp)SHP(3), 0.5, 1, false, false);
    ct_tensor *h = ct_mul(x, w);
    ct_tensor *z1 = ct_exp(h), *z2 = ct_sin(h);
    backward_ones(z1);
    ct_tensor *g = ct_tensor_ones_like(z2);
    tu_assert_error(ct_backward(z2, g, false), CT_ERR_AUTOGRAD, "second time", "retain_graph");
    ct_tensor *h2 = ct_mul(x, w);
    ct_tensor *z3 = ct_exp(h2), *z4 = ct_sin(h2);
    backward_ones_retain(z3, true);
    backward_ones(z4);
    ct_tensor *ts[9] = {x, w, h, z1, z2, g, h2, z3, z4};
    for (int i = 0; i < 9; i++) ct_tensor_release(ts[i]);
}

static void test_version_counter(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(2, 3), 0.5, 1, false, true);
    ct_tensor *w = rand_leaf((shp)SHP(2, 3), 0.5, 1, false, false);
    /* w is saved by mul for x's gradient; modifying it is detected */
    ct_tensor *y = ct_mul(x, w);
    unsigned v0 = version_of(w);
    assert_int_equal(ct_add_scalar_(w, 1.0), CT_OK);
    char now[32], was[48];
    snprintf(now, sizeof now, "version %u", v0 + 1);
    snprintf(was, sizeof was, "expected version %u", v0);
    ct_tensor *g = ct_tensor_ones_like(y);
    tu_assert_error(ct_backward(y, g, false), CT_ERR_AUTOGRAD, "ct_backward", "MulBackward",
                    "modified by an in-place operation", now, was);
    assert_null(ct_grad(x));
    /* through a view of the saved tensor's storage */
    ct_tensor *y2 = ct_mul(x, w);
    ct_tensor *row = ct_select(w, 0, 1);
    assert_int_equal(ct_mul_scalar_(row, 2.0), CT_OK);
    tu_assert_error(ct_backward(y2, g, false), CT_ERR_AUTOGRAD, "modified by an in-place");
    /* a saved output, modified through a detached alias */
    ct_tensor *e = ct_exp(x);
    ct_tensor *d = ct_detach(e);
    assert_false(ct_requires_grad(d));
    assert_true(ct_is_leaf(d));
    assert_true(ct_tensor_shares_storage(d, e));
    assert_int_equal(ct_mul_scalar_(d, 2.0), CT_OK);
    tu_assert_error(ct_backward(e, g, false), CT_ERR_AUTOGRAD, "ExpBackward", "modified");
    /* an unrelated tensor's change is fine */
    ct_tensor *y3 = ct_mul(x, w);
    ct_tensor *other = ct_clone(w);
    assert_int_equal(ct_add_scalar_(other, 1.0), CT_OK);
    assert_int_equal(ct_backward(y3, g, false), CT_OK);
    double *wv = tu_values(w);
    check_values(ct_grad(x), wv, 6, 0, 0);
    free(wv);
    ct_tensor *ts[10] = {x, w, y, g, y2, row, e, d, y3, other};
    for (int i = 0; i < 10; i++) ct_tensor_release(ts[i]);
}

static void test_grad_mode_and_detach(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(3), 0.5, 1, false, true);
    assert_true(ct_is_grad_enabled());
    bool prev = ct_no_grad_begin();
    assert_true(prev);
    assert_false(ct_is_grad_enabled());
    bool inner = ct_no_grad_begin();
    assert_false(inner);
    ct_tensor *xx = ct_mul(x, x);
    ct_tensor *a = ct_exp(xx);
    ct_no_grad_end(inner);
    assert_false(ct_is_grad_enabled());
    ct_tensor *m = ct_gt_scalar(x, 0);
    ct_tensor *b = ct_where(m, x, x);
    ct_tensor *c = ct_clamp(x, 0, 1);
    ct_no_grad_end(prev);
    assert_true(ct_is_grad_enabled());
    assert_false(ct_requires_grad(a));
    assert_false(ct_requires_grad(b));
    assert_false(ct_requires_grad(c));
    assert_null(ct_grad_fn_name(a));
    tu_assert_error(ct_backward(a, NULL, false), CT_ERR_AUTOGRAD, "does not require grad");
    assert_true(ct_set_grad_enabled(true));
    assert_true(ct_set_grad_enabled(false));
    assert_false(ct_set_grad_enabled(false));
    ct_tensor *d0 = ct_add(x, x);
    assert_false(ct_set_grad_enabled(true));
    assert_false(ct_requires_grad(d0));

    /* detach: same storage, no history, no recording from it */
    ct_tensor *y = ct_mul_scalar(x, 2);
    ct_tensor *dy = ct_detach(y);
    assert_false(ct_requires_grad(dy));
    assert_null(ct_grad_fn_name(dy));
    assert_true(ct_tensor_shares_storage(dy, y));
    ct_tensor *z = ct_exp(dy);
    assert_false(ct_requires_grad(z));
    /* y's history is untouched */
    assert_string_equal(ct_grad_fn_name(y), "MulBackward");
    backward_ones(y);
    check_values(ct_grad(x), (double[]){2, 2, 2}, 3, 0, 0);

    /* requires_grad_ rules */
    ct_tensor *it = ct_tensor_zeros(CT_SHAPE(3), CT_I64, ct_tensor_device(x));
    tu_assert_error(ct_requires_grad_(it, true), CT_ERR_DTYPE, "ct_requires_grad_", "floating",
                    "int64");
    assert_false(ct_requires_grad(it));
    assert_int_equal(ct_requires_grad_(it, false), CT_OK);
    ct_tensor *y2 = ct_mul_scalar(x, 3);
    tu_assert_error(ct_requires_grad_(y2, false), CT_ERR_AUTOGRAD, "not a leaf", "MulBackward",
                    "ct_detach");
    assert_true(ct_requires_grad(y2));
    ct_tensor *ts[12] = {x, a, b, c, d0, y, dy, z, it, y2, xx, m};
    for (int i = 0; i < 12; i++) ct_tensor_release(ts[i]);
}

/* Thousands of nodes: backward and freeing are iterative. */
static void test_deep_chain(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(4), -1, 1, false, true);
    ct_tensor *y = ct_tensor_retain(x);
    for (int k = 0; k < 2000; k++) {
        ct_tensor *n = k % 2 ? ct_mul_scalar(y, 1.001) : ct_add_scalar(y, 0.01);
        assert_non_null(n);
        ct_tensor_release(y);
        y = n;
    }
    backward_ones(y);
    double ref = pow(1.001, 1000);
    check_values(ct_grad(x), (double[]){ref, ref, ref, ref}, 4, 1e-10, 0);
    ct_tensor_release(y);
    /* a longer graph freed without backward */
    y = ct_tensor_retain(x);
    for (int k = 0; k < 50000; k++) {
        ct_tensor *n = ct_neg(y);
        ct_tensor_release(y);
        y = n;
    }
    assert_string_equal(ct_grad_fn_name(y), "NegBackward");
    ct_tensor_release(y);
    ct_tensor_release(x);
}

/* A training-like loop: no growth of live tensors, storages or bytes. */
static void test_memory_loop(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(3, 4), -1, 1, false, true);
    ct_tensor *w = rand_leaf((shp)SHP(4), -1, 1, false, true);
    ct_tensor *t = rand_leaf((shp)SHP(3, 1), -1, 1, false, false);
    cti_alloc_stats after_first = {0, 0, 0};
    for (int step = 0; step < 1000; step++) {
        ct_scope *s = ct_scope_begin();
        ct_tensor *h = ct_add(ct_mul(x, w), t);
        ct_tensor *d = ct_tanh(ct_div(h, ct_add_scalar(ct_square(w), 1)));
        ct_tensor *y = ct_sub(ct_gelu(h, CT_GELU_NONE), d);
        ct_tensor *loss = ct_mul(ct_maximum(y, ct_relu(h)), ct_sigmoid(x));
        ct_tensor *g = ct_tensor_ones_like(loss);
        assert_int_equal(ct_backward(loss, g, false), CT_OK);
        ct_scope_end(s);
        if (step % 2) { /* alternate: accumulate, then drop */
            ct_zero_grad(x);
            ct_zero_grad(w);
        }
        if (step == 1) after_first = cti_get_alloc_stats();
    }
    assert_true(same_stats(after_first, cti_get_alloc_stats()));
    /* the same without scopes, releasing by hand */
    for (int step = 0; step < 1000; step++) {
        ct_tensor *h = ct_mul(x, w);
        ct_tensor *y = ct_exp(h);
        ct_tensor *g = ct_tensor_ones_like(y);
        assert_int_equal(ct_backward(y, g, step % 2 == 0), CT_OK);
        ct_tensor_release(g);
        ct_tensor_release(y);
        ct_tensor_release(h);
        ct_zero_grad(x);
        ct_zero_grad(w);
        if (step == 1) after_first = cti_get_alloc_stats();
    }
    assert_true(same_stats(after_first, cti_get_alloc_stats()));
    ct_tensor_release(x);
    ct_tensor_release(w);
    ct_tensor_release(t);
}

/* Leaf gradients outlive the scopes the backward runs in. */
static void test_scopes_around_backward(void **state) {
    (void)state;
    double *xv = NULL;
    ct_tensor *x = tu_rand(CT_SHAPE(3), CT_F64, -1, 1, &xv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_scope *outer = ct_scope_begin();
    ct_tensor *y = ct_cos(x);
    ct_scope *inner = ct_scope_begin();
    ct_tensor *g = ct_tensor_ones_like(y);
    assert_int_equal(ct_backward(y, g, true), CT_OK);
    ct_scope_end(inner);
    assert_non_null(ct_grad(x));
    tu_assert_error(ct_backward(y, NULL, false), CT_ERR_SHAPE, "one-element");
    ct_scope_end(outer);
    double ref[3];
    for (int i = 0; i < 3; i++) ref[i] = -sin(xv[i]);
    check_values(ct_grad(x), ref, 3, 1e-14, 0);
    /* a leaf created inside a scope, kept out of it */
    ct_scope *s = ct_scope_begin();
    ct_tensor *l = ct_keep(ct_tensor_full(CT_SHAPE(2), 3.0, CT_F64, ct_tensor_device(x)));
    assert_int_equal(ct_requires_grad_(l, true), CT_OK);
    ct_tensor *q = ct_square(l);
    assert_int_equal(ct_backward(q, ct_tensor_ones_like(q), false), CT_OK);
    ct_scope_end(s);
    check_values(ct_grad(l), (double[]){6, 6}, 2, 0, 0);
    /* a gradient set from inside a scope: the scope still drops its own
     * reference, the leaf keeps the gradient */
    ct_zero_grad(l);
    cti_alloc_stats before = cti_get_alloc_stats();
    s = ct_scope_begin();
    ct_tensor *r = ct_tensor_full(CT_SHAPE(2), -1.0, CT_F64, ct_tensor_device(x));
    assert_int_equal(ct_set_grad(l, r), CT_OK);
    ct_scope_end(s);
    check_values(ct_grad(l), (double[]){-1, -1}, 2, 0, 0);
    ct_zero_grad(l);
    assert_true(same_stats(before, cti_get_alloc_stats()));
    /* backward inside a no-grad region still computes gradients */
    ct_tensor *q2 = ct_square(l);
    bool prev = ct_no_grad_begin();
    backward_ones(q2);
    ct_no_grad_end(prev);
    check_values(ct_grad(l), (double[]){6, 6}, 2, 0, 0);
    assert_true(ct_is_grad_enabled());
    ct_tensor_release(q2);
    free(xv);
    ct_tensor_release(l);
    ct_tensor_release(x);
}

/* ---- post-accumulate-grad hooks ------------------------------------------------------ */
typedef struct hook_log {
    int calls;
    double grad_sum; /* the sum of ct_grad(leaf) when the hook ran */
    bool had_grad;
    ct_status fail_with;
} hook_log;

static ct_status log_hook(ct_tensor *leaf, void *ctx) {
    hook_log *h = ctx;
    h->calls++;
    ct_tensor *g = ct_grad(leaf);
    h->had_grad = g != NULL;
    h->grad_sum = 0;
    if (g) {
        double *v = tu_values(g);
        for (int64_t i = 0; i < ct_tensor_numel(g); i++) h->grad_sum += v[i];
        free(v);
    }
    if (h->fail_with) return cti_error(h->fail_with, "log_hook: asked to fail");
    return CT_OK;
}

static void test_post_accumulate_grad_hook(void **state) {
    int64_t shape[] = {3};
    double *xv;
    ct_tensor *x = tu_rand(1, shape, CT_F64, -1, 1, &xv);
    ct_tensor *w = tu_rand(1, shape, CT_F64, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    hook_log hx = {0}, hw = {0};
    assert_int_equal(ct_set_post_accumulate_grad_hook(x, log_hook, &hx), CT_OK);
    assert_int_equal(ct_set_post_accumulate_grad_hook(w, log_hook, &hw), CT_OK);
    /* x reaches the loss along three edges: sum(x * w) + sum(x * x). The
     * hook runs once, when d/dx = w + 2x is complete. */
    ct_scope *s = ct_scope_begin();
    ct_tensor *loss = ct_add(ct_sum(ct_mul(x, w), 0, NULL, false),
                             ct_sum(ct_mul(x, x), 0, NULL, false));
    assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
    ct_scope_end(s);
    double *wv = tu_values(w), want = 0;
    for (int i = 0; i < 3; i++) want += wv[i] + 2 * xv[i];
    assert_int_equal(hx.calls, 1);
    assert_true(fabs(hx.grad_sum - want) < 1e-12);
    assert_int_equal(hw.calls, 1);
    /* A second pass accumulates onto the first; the hook sees the total. */
    s = ct_scope_begin();
    assert_int_equal(ct_backward(ct_sum(ct_mul(x, w), 0, NULL, false), NULL, false), CT_OK);
    ct_scope_end(s);
    double want2 = want;
    for (int i = 0; i < 3; i++) want2 += wv[i];
    assert_int_equal(hx.calls, 2);
    assert_true(fabs(hx.grad_sum - want2) < 1e-12);
    /* Backward from the leaf itself. */
    ct_tensor *ones = ct_tensor_ones_like(x);
    assert_int_equal(ct_backward(x, ones, false), CT_OK);
    ct_tensor_release(ones);
    assert_int_equal(hx.calls, 3);
    /* A failing hook stops the backward with its error. */
    hw.fail_with = CT_ERR_RUNTIME;
    s = ct_scope_begin();
    tu_assert_error(ct_backward(ct_sum(ct_mul(x, w), 0, NULL, false), NULL, false),
                    CT_ERR_RUNTIME, "log_hook: asked to fail");
    ct_scope_end(s);
    /* One hook per leaf; NULL removes it; leaves that require grad only. */
    tu_assert_error(ct_set_post_accumulate_grad_hook(x, log_hook, &hw), CT_ERR_AUTOGRAD,
                    "ct_set_post_accumulate_grad_hook", "already has a hook");
    assert_int_equal(ct_set_post_accumulate_grad_hook(x, NULL, NULL), CT_OK);
    assert_int_equal(ct_set_post_accumulate_grad_hook(w, NULL, NULL), CT_OK);
    int before = hx.calls;
    s = ct_scope_begin();
    assert_int_equal(ct_backward(ct_sum(ct_mul(x, w), 0, NULL, false), NULL, false), CT_OK);
    ct_tensor *y = ct_mul(x, w);
    tu_assert_error(ct_set_post_accumulate_grad_hook(y, log_hook, &hx), CT_ERR_AUTOGRAD,
                    "must be a leaf that requires grad", "produced by an op");
    ct_scope_end(s);
    assert_int_equal(hx.calls, before);
    ct_tensor *plain = ct_tensor_zeros(1, shape, CT_F64, CT_CPU);
    tu_assert_error(ct_set_post_accumulate_grad_hook(plain, log_hook, &hx), CT_ERR_AUTOGRAD,
                    "must be a leaf that requires grad");
    tu_assert_error(ct_set_post_accumulate_grad_hook(NULL, log_hook, &hx), CT_ERR_INVALID_ARG,
                    "tensor is NULL");
    ct_tensor_release(plain);
    free(xv);
    free(wv);
    ct_tensor_release(x);
    ct_tensor_release(w);
}

/* Unless retain_graph, a node's saved tensors go as soon as its formula has run, before the
 * nodes below it run: w's hook, which runs when MulBackward's gradient reaches w, finds s
 * (saved by MulBackward alone) held by the caller's handle only. With retain_graph, the
 * node's alias of s holds its storage too. */
typedef struct storage_probe {
    const ct_tensor *watched;
    int refs; /* the watched storage's references when the hook ran */
} storage_probe;

static ct_status probe_hook(ct_tensor *leaf, void *ctx) {
    (void)leaf;
    storage_probe *p = ctx;
    p->refs = atomic_load(&p->watched->storage->refcount);
    return CT_OK;
}

static void test_saved_freed_as_nodes_run(void **state) {
    (void)state;
    double *xv, *wv;
    ct_tensor *x = tu_rand(CT_SHAPE(5), CT_F64, -1, 1, &xv);
    ct_tensor *w = tu_rand(CT_SHAPE(5), CT_F64, -1, 1, &wv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    ct_tensor *s = ct_sin(x);
    storage_probe probe = {.watched = s, .refs = -1};
    assert_int_equal(ct_set_post_accumulate_grad_hook(w, probe_hook, &probe), CT_OK);
    ct_scope *sc = ct_scope_begin();
    ct_tensor *loss = ct_sum(ct_mul(s, w), 0, NULL, false);
    assert_int_equal(ct_backward(loss, NULL, true), CT_OK);
    assert_int_equal(probe.refs, 2);
    assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
    assert_int_equal(probe.refs, 1);
    ct_scope_end(sc);
    /* both passes' gradients: 2 w cos(x) and 2 sin(x) */
    double gx[5], gw[5];
    for (int i = 0; i < 5; i++) {
        gx[i] = 2 * wv[i] * cos(xv[i]);
        gw[i] = 2 * sin(xv[i]);
    }
    check_values(ct_grad(x), gx, 5, 1e-14, 0);
    check_values(ct_grad(w), gw, 5, 1e-14, 0);
    assert_int_equal(ct_set_post_accumulate_grad_hook(w, NULL, NULL), CT_OK);
    free(xv);
    free(wv);
    ct_tensor *ts[3] = {x, w, s};
    for (int i = 0; i < 3; i++) ct_tensor_release(ts[i]);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gradcheck_unary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_binary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_where, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_composite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_detects_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_edge_unary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_edge_maximum_minimum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_edge_pow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_where_grads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dtypes_unary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unary_derivatives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unary_points_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dtypes_binary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dtypes_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_input_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_differentiable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_no_graph, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grad_fn_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inplace_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backward_nonscalar, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accumulate_and_retain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_subgraph_freed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_counter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grad_mode_and_detach, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deep_chain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scopes_around_backward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_accumulate_grad_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(test_saved_freed_as_nodes_run, setup, teardown),
    };
    return tu_run_tests(tests);
}
