/* Autograd of the linear-algebra ops: gradchecks of matmul in every case of
 * PyTorch's rules (dot, matrix-vector, vector-matrix, matrix, batched with
 * broadcast batch dims), mm, bmm, addmm (broadcast input, beta/alpha values
 * including 0) and linear (1-d to 4-d inputs, with and without bias), on
 * contiguous, transposed and non-contiguous operands, with one or both
 * operands requiring grad; a naive-loop reference of the broadcast batched
 * gradients; f32 gradients against the f64 ones of the same values; a
 * two-layer MLP end to end; the graph rules (accumulation, a tensor used
 * twice, no-grad, saved tensors modified in place, failures) and memory. */
#define _POSIX_C_SOURCE 200809L /* fileno, dup, dup2 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"

/* ---- fixtures: every test must leave no tensor or storage alive ---------------------- */

/* ---- helpers ------------------------------------------------------------------------- */

/* Operand layouts: contiguous, the transpose of a contiguous tensor of the
 * swapped shape (what BLAS reads through its transpose flag), and
 * tu_noncontig's reversed, strided layout (BLAS cannot read it in place). */
typedef enum layout { L_CONTIG, L_TRANS, L_NONCONTIG, L_COUNT } layout;
static const char *const layout_names[] = {"contiguous", "transposed", "non-contiguous"};

/* A tensor of dtype with values vals (row-major in shape s) in layout l. */
static ct_tensor *make_in(const double *vals, shp s, ct_dtype dt, layout l) {
    if (l == L_TRANS && s.nd >= 2) {
        int a = s.nd - 2, b = s.nd - 1;
        shp sw = s;
        sw.s[a] = s.s[b];
        sw.s[b] = s.s[a];
        /* The values of the transpose, so that the view holds vals. */
        int64_t n = tu_numel(s.nd, s.s), inner = s.s[a] * s.s[b];
        double *tv = malloc((size_t)(n > 0 ? n : 1) * sizeof *tv);
        for (int64_t e = 0; e < n; e++) {
            int64_t base = e / inner * inner, r = e % inner / s.s[b], c = e % s.s[b];
            tv[base + c * s.s[a] + r] = vals[e];
        }
        ct_tensor *t = tu_from_f64(tv, sw.nd, sw.s, dt);
        free(tv);
        ct_tensor *v = ct_transpose(t, a, b);
        ct_tensor_release(t);
        assert_non_null(v);
        if (s.s[a] > 1 && s.s[b] > 1) assert_false(ct_tensor_is_contiguous(v));
        return v;
    }
    ct_tensor *t = tu_from_f64(vals, s.nd, s.s, dt);
    assert_non_null(t);
    if (l == L_NONCONTIG) {
        ct_tensor *v = tu_noncontig(t);
        ct_tensor_release(t);
        t = v;
        assert_non_null(t);
        if (s.nd > 0 && tu_numel(s.nd, s.s) > 1) assert_false(ct_tensor_is_contiguous(t));
    }
    return t;
}

/* A random float64 tensor in [-1, 1) in layout l, requiring grad when rg. */
static ct_tensor *rand_in(shp s, layout l, bool rg) {
    double *v = tu_rand_vals(tu_numel(s.nd, s.s), CT_F64, -1, 1);
    ct_tensor *t = make_in(v, s, CT_F64, l);
    free(v);
    if (rg) assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

static void backward_with(ct_tensor *out, ct_tensor *go) {
    ct_status st = ct_backward(out, go, false);
    if (st != CT_OK) fprintf(stderr, "backward: %s\n", ct_last_error());
    assert_int_equal(st, CT_OK);
}

/* ---- the functions under test ------------------------------------------------------------ */

typedef enum fk { F_MATMUL, F_MM, F_BMM, F_ADDMM, F_LINEAR } fk;
static const char *const fk_names[] = {"matmul", "mm", "bmm", "addmm", "linear"};

typedef struct fctx {
    fk k;
    double beta, alpha; /* addmm */
    bool bias;          /* linear: in[2] is the bias */
} fctx;

/* addmm: (input, m1, m2); linear: (x, w[, bias]); the others: (a, b). */
static ct_tensor *run_fn(ct_tensor *const *in, const fctx *c) {
    switch (c->k) {
    case F_MATMUL: return ct_matmul(in[0], in[1]);
    case F_MM: return ct_mm(in[0], in[1]);
    case F_BMM: return ct_bmm(in[0], in[1]);
    case F_ADDMM: return ct_addmm(in[0], in[1], in[2], c->beta, c->alpha);
    case F_LINEAR: return ct_linear(in[0], in[1], c->bias ? in[2] : NULL);
    }
    return NULL;
}

static ct_tensor *gc_fn(ct_tensor *const *in, void *v) { return run_fn(in, v); }

static int fn_nin(const fctx *c) {
    return c->k == F_ADDMM ? 3 : c->k == F_LINEAR ? (c->bias ? 3 : 2) : 2;
}

/* Gradchecks c on operands of shapes s[] in every layout combination where
 * every operand shares one layout, plus mixed ones, with the operands
 * requiring grad all together and one at a time. */
static void gradcheck_shapes(const fctx *c, const shp *s, const char *label) {
    int n = fn_nin(c);
    char what[256];
    for (int la = 0; la < L_COUNT; la++)
        for (int lb = 0; lb < L_COUNT; lb++) {
            if (la != lb && la != L_CONTIG && lb != L_CONTIG) continue;
            /* mask of operands requiring grad: all, then each alone */
            for (int m = -1; m < n; m++) {
                if (m >= 0 && (la != L_CONTIG || lb != L_CONTIG)) continue;
                ct_tensor *in[3] = {NULL};
                for (int i = 0; i < n; i++)
                    in[i] = rand_in(s[i], i == 0 ? (layout)la : (layout)lb, m < 0 || m == i);
                snprintf(what, sizeof what, "%s %s: layouts %s/%s, grad %s", fk_names[c->k],
                         label, layout_names[la], layout_names[lb],
                         m < 0 ? "all" : (m == 0 ? "first only" : m == 1 ? "second only"
                                                                           : "third only"));
                gradcheck_ok(what, gc_fn, (void *)c, n, in);
                release_all(n, in);
            }
        }
}

/* ---- matmul: every case of the rules ------------------------------------------------------ */

typedef struct mcase {
    shp a, b;
    const char *label;
} mcase;

static const mcase matmul_cases[] = {
    {SHP(5), SHP(5), "dot 1-d x 1-d"},
    {SHP(3, 4), SHP(4), "matrix x vector"},
    {SHP(4), SHP(4, 3), "vector x matrix"},
    {SHP(3, 4), SHP(4, 5), "matrix x matrix"},
    {SHP(2, 3, 4), SHP(4), "batched x vector"},
    {SHP(2, 2, 3, 4), SHP(4), "4-d x vector"},
    {SHP(4), SHP(2, 4, 3), "vector x batched"},
    {SHP(4), SHP(3, 1, 4, 2), "vector x 4-d"},
    {SHP(2, 3, 4), SHP(4, 5), "batched x matrix"},
    {SHP(2, 2, 3, 4), SHP(4, 2), "4-d x matrix"},
    {SHP(3, 4), SHP(2, 4, 5), "matrix x batched"},
    {SHP(2, 3, 4), SHP(2, 4, 5), "batched x batched"},
    {SHP(2, 1, 3, 4), SHP(5, 4, 2), "broadcast batch [2,1,3,4] @ [5,4,2]"},
    {SHP(1, 3, 4), SHP(2, 4, 5), "broadcast batch [1,3,4] @ [2,4,5]"},
    {SHP(3, 1, 2, 3), SHP(1, 2, 3, 2), "broadcast batch both ways"},
    {SHP(1, 4), SHP(4, 1), "size-1 rows and cols"},
    {SHP(3, 1), SHP(1, 2), "k = 1"},
    {SHP(1, 1, 1), SHP(1, 1), "all ones"},
};
#define NMATMUL (int)(sizeof matmul_cases / sizeof matmul_cases[0])

static void test_matmul_gradcheck(void **state) {
    (void)state;
    fctx c = {F_MATMUL, 0, 0, false};
    for (int i = 0; i < NMATMUL; i++) {
        shp s[2] = {matmul_cases[i].a, matmul_cases[i].b};
        gradcheck_shapes(&c, s, matmul_cases[i].label);
    }
}

/* Names and shapes of the gradients, and each case's grad_fn. */
static void test_matmul_grad_shapes_and_names(void **state) {
    (void)state;
    for (int i = 0; i < NMATMUL; i++) {
        ct_tensor *a = rand_in(matmul_cases[i].a, L_CONTIG, true);
        ct_tensor *b = rand_in(matmul_cases[i].b, L_CONTIG, true);
        ct_tensor *y = ct_matmul(a, b);
        assert_non_null(y);
        assert_string_equal(ct_grad_fn_name(y), "MatmulBackward");
        ct_tensor *go = ct_tensor_ones_like(y);
        backward_with(y, go);
        check_shape(ct_grad(a), matmul_cases[i].a.nd, matmul_cases[i].a.s);
        check_shape(ct_grad(b), matmul_cases[i].b.nd, matmul_cases[i].b.s);
        ct_tensor *all[4] = {a, b, y, go};
        release_all(4, all);
    }
}

/* Size-0 dims: the gradients are empty or zero, in the operands' shapes. */
static void test_matmul_empty(void **state) {
    (void)state;
    static const mcase cases[] = {{SHP(0, 4), SHP(4, 3), "n = 0"},
                                  {SHP(3, 0), SHP(0, 2), "k = 0"},
                                  {SHP(0, 3, 4), SHP(4, 2), "empty batch"},
                                  {SHP(0), SHP(0), "empty dot"}};
    for (int i = 0; i < 4; i++) {
        ct_tensor *a = rand_in(cases[i].a, L_CONTIG, true);
        ct_tensor *b = rand_in(cases[i].b, L_CONTIG, true);
        ct_tensor *y = ct_matmul(a, b);
        assert_non_null(y);
        ct_tensor *go = ct_tensor_ones_like(y);
        backward_with(y, go);
        check_shape(ct_grad(a), cases[i].a.nd, cases[i].a.s);
        check_shape(ct_grad(b), cases[i].b.nd, cases[i].b.s);
        double *gb = tu_values(ct_grad(b));
        for (int64_t e = 0; e < ct_tensor_numel(b); e++) assert_true(gb[e] == 0.0);
        free(gb);
        ct_tensor *all[4] = {a, b, y, go};
        release_all(4, all);
    }
}

/* [2,1,3,4] @ [5,4,2] -> [2,5,3,2] against naive loops: the gradient of a
 * sums over the 5 batches b broadcast into, the one of b over the 2 of a. */
static void test_matmul_broadcast_reference(void **state) {
    (void)state;
    for (int l = 0; l < L_COUNT; l++) {
        double *av = tu_rand_vals(24, CT_F64, -1, 1), *bv = tu_rand_vals(40, CT_F64, -1, 1);
        double *gv = tu_rand_vals(60, CT_F64, -1, 1);
        ct_tensor *a = make_in(av, (shp)SHP(2, 1, 3, 4), CT_F64, (layout)l);
        ct_tensor *b = make_in(bv, (shp)SHP(5, 4, 2), CT_F64, (layout)l);
        assert_int_equal(ct_requires_grad_(a, true), CT_OK);
        assert_int_equal(ct_requires_grad_(b, true), CT_OK);
        ct_tensor *go = tu_from_f64(gv, CT_SHAPE(2, 5, 3, 2), CT_F64);
        ct_tensor *y = ct_matmul(a, b);
        check_shape(y, 4, (const int64_t[]){2, 5, 3, 2});
        backward_with(y, go);
        double ga[24] = {0}, gb[40] = {0};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 5; j++)
                for (int p = 0; p < 3; p++)
                    for (int r = 0; r < 2; r++) {
                        double g = gv[((i * 5 + j) * 3 + p) * 2 + r];
                        for (int q = 0; q < 4; q++) {
                            ga[(i * 3 + p) * 4 + q] += g * bv[(j * 4 + q) * 2 + r];
                            gb[(j * 4 + q) * 2 + r] += av[(i * 3 + p) * 4 + q] * g;
                        }
                    }
        double *got_a = tu_values(ct_grad(a)), *got_b = tu_values(ct_grad(b));
        tu_assert_close(got_a, ga, 24, 1e-12, 1e-12);
        tu_assert_close(got_b, gb, 40, 1e-12, 1e-12);
        free(got_a);
        free(got_b);
        free(av);
        free(bv);
        free(gv);
        ct_tensor *all[4] = {a, b, y, go};
        release_all(4, all);
    }
}

/* ---- mm / bmm ---------------------------------------------------------------------------- */

static void test_mm_gradcheck(void **state) {
    (void)state;
    fctx c = {F_MM, 0, 0, false};
    static const shp s[][2] = {{SHP(3, 4), SHP(4, 5)}, {SHP(1, 3), SHP(3, 1)},
                               {SHP(4, 1), SHP(1, 3)}, {SHP(6, 2), SHP(2, 6)}};
    for (int i = 0; i < 4; i++) gradcheck_shapes(&c, s[i], "");
    ct_tensor *a = rand_in((shp)SHP(2, 3), L_CONTIG, true), *b = rand_in((shp)SHP(3, 2), 0, true);
    ct_tensor *y = ct_mm(a, b);
    assert_string_equal(ct_grad_fn_name(y), "MmBackward");
    ct_tensor *all[3] = {a, b, y};
    release_all(3, all);
}

static void test_bmm_gradcheck(void **state) {
    (void)state;
    fctx c = {F_BMM, 0, 0, false};
    static const shp s[][2] = {{SHP(2, 3, 4), SHP(2, 4, 5)}, {SHP(1, 3, 2), SHP(1, 2, 3)},
                               {SHP(3, 1, 4), SHP(3, 4, 1)}};
    for (int i = 0; i < 3; i++) gradcheck_shapes(&c, s[i], "");
    ct_tensor *a = rand_in((shp)SHP(2, 2, 3), 0, true), *b = rand_in((shp)SHP(2, 3, 2), 0, true);
    ct_tensor *y = ct_bmm(a, b);
    assert_string_equal(ct_grad_fn_name(y), "BmmBackward");
    ct_tensor *all[3] = {a, b, y};
    release_all(3, all);
}

/* ---- addmm ------------------------------------------------------------------------------- */

static void test_addmm_gradcheck(void **state) {
    (void)state;
    /* The input in every shape that broadcasts to [3, 5]. */
    static const shp inputs[] = {SHP(3, 5), SHP(5), SHP(1, 5), SHP(3, 1), SHP(1, 1), SHP(1),
                                 SHP0};
    static const double ba[][2] = {{1, 1}, {0, 1}, {0.5, 1}, {1, 0.7}, {-2, -1.5}, {0, 0.25},
                                   {1.5, 0}};
    char label[96];
    for (int i = 0; i < 7; i++)
        for (int j = 0; j < 7; j++) {
            if (i > 0 && j > 2) continue; /* every beta/alpha pair on the full input */
            fctx c = {F_ADDMM, ba[j][0], ba[j][1], false};
            shp s[3] = {inputs[i], SHP(3, 4), SHP(4, 5)};
            snprintf(label, sizeof label, "input %d-d #%d, beta %g alpha %g", inputs[i].nd, i,
                     ba[j][0], ba[j][1]);
            /* the layouts of m1 and m2 (the input follows m1's) */
            for (int la = 0; la < L_COUNT; la++)
                for (int m = -1; m < 3; m++) {
                    if (m >= 0 && la != L_CONTIG) continue;
                    ct_tensor *in[3];
                    for (int k = 0; k < 3; k++)
                        in[k] = rand_in(s[k], k == 2 ? (layout)((la + 1) % L_COUNT) : (layout)la,
                                        m < 0 || m == k);
                    char what[200];
                    snprintf(what, sizeof what, "addmm %s: layout %s, grad %d", label,
                             layout_names[la], m);
                    gradcheck_ok(what, gc_fn, &c, 3, in);
                    release_all(3, in);
                }
        }
}

/* beta = 0: the input is never read (NaNs there vanish) and gets a zero
 * gradient; alpha scales the products' gradients. */
static void test_addmm_beta_zero(void **state) {
    (void)state;
    double iv[6] = {NAN, 1, 2, INFINITY, -3, NAN};
    ct_tensor *input = tu_from_f64(iv, CT_SHAPE(2, 3), CT_F64);
    double *m1v, *m2v, *gv;
    ct_tensor *m1 = tu_rand(CT_SHAPE(2, 4), CT_F64, -1, 1, &m1v);
    ct_tensor *m2 = tu_rand(CT_SHAPE(4, 3), CT_F64, -1, 1, &m2v);
    ct_tensor *go = tu_rand(CT_SHAPE(2, 3), CT_F64, -1, 1, &gv);
    ct_tensor *ts[3] = {input, m1, m2};
    for (int i = 0; i < 3; i++) assert_int_equal(ct_requires_grad_(ts[i], true), CT_OK);
    const double alpha = -1.75;
    ct_tensor *y = ct_addmm(input, m1, m2, 0.0, alpha);
    assert_non_null(y);
    assert_string_equal(ct_grad_fn_name(y), "AddmmBackward");
    backward_with(y, go);
    double *gi = tu_values(ct_grad(input)), *g1 = tu_values(ct_grad(m1));
    double *g2 = tu_values(ct_grad(m2));
    double ref1[8] = {0}, ref2[12] = {0};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) {
                ref1[i * 4 + k] += alpha * gv[i * 3 + j] * m2v[k * 3 + j];
                ref2[k * 3 + j] += alpha * m1v[i * 4 + k] * gv[i * 3 + j];
            }
    for (int e = 0; e < 6; e++) assert_true(gi[e] == 0.0);
    tu_assert_close(g1, ref1, 8, 1e-12, 1e-12);
    tu_assert_close(g2, ref2, 12, 1e-12, 1e-12);
    free(gi);
    free(g1);
    free(g2);
    free(m1v);
    free(m2v);
    free(gv);
    ct_tensor *all[5] = {input, m1, m2, go, y};
    release_all(5, all);
}

/* ---- linear ------------------------------------------------------------------------------ */

static void test_linear_gradcheck(void **state) {
    (void)state;
    static const shp xs[] = {SHP(4), SHP(3, 4), SHP(2, 3, 4), SHP(2, 1, 2, 4), SHP(1, 4)};
    char label[96];
    for (int bias = 0; bias < 2; bias++) {
        fctx c = {F_LINEAR, 0, 0, bias};
        for (int i = 0; i < 5; i++) {
            shp s[3] = {xs[i], SHP(5, 4), SHP(5)};
            snprintf(label, sizeof label, "x %d-d #%d, bias %d", xs[i].nd, i, bias);
            gradcheck_shapes(&c, s, label);
        }
    }
    ct_tensor *x = rand_in((shp)SHP(2, 3), 0, true), *w = rand_in((shp)SHP(4, 3), 0, true);
    ct_tensor *y = ct_linear(x, w, NULL);
    assert_string_equal(ct_grad_fn_name(y), "LinearBackward");
    ct_tensor *all[3] = {x, w, y};
    release_all(3, all);
}

/* Only the bias requires grad: its gradient is grad_out summed over every
 * leading dim of x. */
static void test_linear_bias_only(void **state) {
    (void)state;
    ct_tensor *x = rand_in((shp)SHP(2, 3, 4), L_NONCONTIG, false);
    ct_tensor *w = rand_in((shp)SHP(5, 4), L_TRANS, false);
    ct_tensor *bias = rand_in((shp)SHP(5), L_CONTIG, true);
    double *gv;
    ct_tensor *go = tu_rand(CT_SHAPE(2, 3, 5), CT_F64, -1, 1, &gv);
    ct_tensor *y = ct_linear(x, w, bias);
    backward_with(y, go);
    assert_null(ct_grad(x));
    assert_null(ct_grad(w));
    double ref[5] = {0};
    for (int r = 0; r < 6; r++)
        for (int o = 0; o < 5; o++) ref[o] += gv[r * 5 + o];
    double *got = tu_values(ct_grad(bias));
    tu_assert_close(got, ref, 5, 1e-12, 1e-12);
    free(got);
    free(gv);
    ct_tensor *all[5] = {x, w, bias, go, y};
    release_all(5, all);
}

/* ---- f32 against f64 on the same values --------------------------------------------------- */

/* Runs c on operands of shapes s[] holding the same f32-representable
 * values in f32 (layout l) and f64, backpropagates one grad_out, and
 * compares the f32 gradients (which must be f32) with the f64 ones. */
static void compare_f32_f64(const fctx *c, const shp *s, layout l, const char *label) {
    int n = fn_nin(c);
    double *vals[3] = {NULL};
    ct_tensor *x32[3] = {NULL}, *x64[3] = {NULL};
    for (int i = 0; i < n; i++) {
        vals[i] = tu_rand_vals(tu_numel(s[i].nd, s[i].s), CT_F32, -1, 1);
        x32[i] = make_in(vals[i], s[i], CT_F32, l);
        x64[i] = make_in(vals[i], s[i], CT_F64, L_CONTIG);
        assert_int_equal(ct_requires_grad_(x32[i], true), CT_OK);
        assert_int_equal(ct_requires_grad_(x64[i], true), CT_OK);
    }
    ct_tensor *y32 = run_fn(x32, c), *y64 = run_fn(x64, c);
    assert_non_null(y32);
    assert_non_null(y64);
    assert_int_equal(ct_tensor_dtype(y32), CT_F32);
    double *gv = tu_rand_vals(ct_tensor_numel(y64), CT_F32, -1, 1);
    ct_tensor *g32 = tu_from_f64(gv, ct_tensor_ndim(y32), ct_tensor_shape(y32), CT_F32);
    ct_tensor *g64 = tu_from_f64(gv, ct_tensor_ndim(y64), ct_tensor_shape(y64), CT_F64);
    backward_with(y32, g32);
    backward_with(y64, g64);
    for (int i = 0; i < n; i++) {
        ct_tensor *a = ct_grad(x32[i]), *b = ct_grad(x64[i]);
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(ct_tensor_dtype(a), CT_F32);
        check_shape(a, s[i].nd, s[i].s);
        double *va = tu_values(a), *vb = tu_values(b);
        for (int64_t e = 0; e < ct_tensor_numel(b); e++) {
            /* sums of up to a few dozen products of values in [-1, 1) */
            if (fabs(va[e] - vb[e]) > 1e-5 + 1e-5 * fabs(vb[e])) {
                fprintf(stderr, "%s %s operand %d element %lld: f32 %.9g, f64 %.9g\n",
                        fk_names[c->k], label, i, (long long)e, va[e], vb[e]);
                fail();
            }
        }
        free(va);
        free(vb);
        free(vals[i]);
    }
    free(gv);
    release_all(n, x32);
    release_all(n, x64);
    ct_tensor *all[4] = {y32, y64, g32, g64};
    release_all(4, all);
}

static void test_f32_matches_f64(void **state) {
    (void)state;
    fctx mc = {F_MATMUL, 0, 0, false};
    for (int i = 0; i < NMATMUL; i++)
        for (int l = 0; l < L_COUNT; l++) {
            shp s[2] = {matmul_cases[i].a, matmul_cases[i].b};
            compare_f32_f64(&mc, s, (layout)l, matmul_cases[i].label);
        }
    fctx mm = {F_MM, 0, 0, false}, bmm = {F_BMM, 0, 0, false};
    fctx am = {F_ADDMM, 0.5, -1.25, false}, am0 = {F_ADDMM, 0, 2, false};
    fctx lin = {F_LINEAR, 0, 0, true}, lin0 = {F_LINEAR, 0, 0, false};
    for (int l = 0; l < L_COUNT; l++) {
        compare_f32_f64(&mm, (const shp[]){SHP(7, 9), SHP(9, 6)}, (layout)l, "");
        compare_f32_f64(&bmm, (const shp[]){SHP(3, 7, 9), SHP(3, 9, 6)}, (layout)l, "");
        compare_f32_f64(&am, (const shp[]){SHP(6), SHP(7, 9), SHP(9, 6)}, (layout)l, "");
        compare_f32_f64(&am0, (const shp[]){SHP(7, 1), SHP(7, 9), SHP(9, 6)}, (layout)l, "");
        compare_f32_f64(&lin, (const shp[]){SHP(2, 5, 9), SHP(6, 9), SHP(6)}, (layout)l, "");
        compare_f32_f64(&lin0, (const shp[]){SHP(9), SHP(6, 9)}, (layout)l, "");
    }
}

/* f16/bf16 operands get gradients of their own dtype, close to the f32 ones. */
static void test_half_grads(void **state) {
    (void)state;
    const ct_dtype dts[2] = {CT_F16, CT_BF16};
    for (int d = 0; d < 2; d++) {
        double *av = tu_rand_vals(12, dts[d], -1, 1), *bv = tu_rand_vals(20, dts[d], -1, 1);
        ct_tensor *a = tu_from_f64(av, CT_SHAPE(3, 4), dts[d]);
        ct_tensor *b = tu_from_f64(bv, CT_SHAPE(4, 5), dts[d]);
        assert_int_equal(ct_requires_grad_(a, true), CT_OK);
        assert_int_equal(ct_requires_grad_(b, true), CT_OK);
        ct_tensor *y = ct_matmul(a, b);
        ct_tensor *go = ct_tensor_ones_like(y);
        backward_with(y, go);
        assert_int_equal(ct_tensor_dtype(ct_grad(a)), dts[d]);
        assert_int_equal(ct_tensor_dtype(ct_grad(b)), dts[d]);
        double ga[12] = {0}, gb[20] = {0};
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < 4; k++)
                for (int j = 0; j < 5; j++) {
                    ga[i * 4 + k] += bv[k * 5 + j];
                    gb[k * 5 + j] += av[i * 4 + k];
                }
        double *got_a = tu_values(ct_grad(a)), *got_b = tu_values(ct_grad(b));
        tu_assert_close(got_a, ga, 12, 2 * tu_rtol(dts[d]), 1e-2);
        tu_assert_close(got_b, gb, 20, 2 * tu_rtol(dts[d]), 1e-2);
        free(got_a);
        free(got_b);
        free(av);
        free(bv);
        ct_tensor *all[4] = {a, b, y, go};
        release_all(4, all);
    }
}

/* ---- a two-layer MLP end to end ------------------------------------------------------------- */

typedef struct mlp_ctx {
    ct_tensor *target;
    bool ce; /* cross-entropy loss, else a sum of the logits */
} mlp_ctx;

/* in: x, w1, b1, w2, b2. linear -> relu -> linear -> loss. */
static ct_tensor *gc_mlp(ct_tensor *const *in, void *v) {
    const mlp_ctx *c = v;
    ct_tensor *h = ct_linear(in[0], in[1], in[2]);
    ct_tensor *r = h ? ct_relu(h) : NULL;
    ct_tensor *o = r ? ct_linear(r, in[3], in[4]) : NULL;
    ct_tensor *loss = NULL;
    if (o)
        loss = c->ce ? ct_cross_entropy(o, c->target, NULL, CT_REDUCTION_MEAN, -100, 0.0)
                     : ct_sum(o, CT_NONE, false);
    ct_tensor_release(h);
    ct_tensor_release(r);
    ct_tensor_release(o);
    return loss;
}

static void test_mlp_gradcheck(void **state) {
    (void)state;
    int64_t tv[6];
    for (int i = 0; i < 6; i++) tv[i] = tu_randint(0, 3);
    for (int ce = 0; ce < 2; ce++)
        for (int l = 0; l < L_COUNT; l++) {
            mlp_ctx c = {NULL, ce};
            /* CE takes [N, C] logits, the sum any leading dims of x. */
            shp xs = ce ? (shp)SHP(6, 5) : (shp)SHP(2, 3, 5);
            if (ce) c.target = ct_tensor_from_data(tv, CT_I64, CT_SHAPE(6));
            ct_tensor *in[5] = {rand_in(xs, (layout)l, true), rand_in((shp)SHP(7, 5), l, true),
                                rand_in((shp)SHP(7), L_CONTIG, true),
                                rand_in((shp)SHP(3, 7), l, true),
                                rand_in((shp)SHP(3), L_CONTIG, true)};
            char what[96];
            snprintf(what, sizeof what, "MLP with %s, layout %s", ce ? "cross-entropy" : "sum",
                     layout_names[l]);
            gradcheck_ok(what, gc_mlp, &c, 5, in);
            release_all(5, in);
            ct_tensor_release(c.target);
        }
}

/* ---- graph rules ------------------------------------------------------------------------------ */

/* Two backward calls accumulate; ct_zero_grad starts over. */
static void test_accumulation(void **state) {
    (void)state;
    double *av, *bv;
    ct_tensor *a = tu_rand(CT_SHAPE(3, 4), CT_F64, -1, 1, &av);
    ct_tensor *b = tu_rand(CT_SHAPE(4, 2), CT_F64, -1, 1, &bv);
    assert_int_equal(ct_requires_grad_(a, true), CT_OK);
    double ref[12];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) ref[i * 4 + k] = bv[k * 2] + bv[k * 2 + 1];
    for (int round = 1; round <= 2; round++) {
        ct_tensor *y = ct_mm(a, b);
        ct_tensor *go = ct_tensor_ones_like(y);
        backward_with(y, go);
        ct_tensor_release(y);
        ct_tensor_release(go);
        double want[12];
        for (int e = 0; e < 12; e++) want[e] = round * ref[e];
        double *g = tu_values(ct_grad(a));
        tu_assert_close(g, want, 12, 1e-12, 1e-12);
        free(g);
    }
    assert_null(ct_grad(b));
    ct_zero_grad(a);
    assert_null(ct_grad(a));
    free(av);
    free(bv);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

/* x @ x: both uses send their gradient to x, g x^T + x^T g. */
static void test_same_tensor_twice(void **state) {
    (void)state;
    double *xv, *gv;
    ct_tensor *x = tu_rand(CT_SHAPE(3, 3), CT_F64, -1, 1, &xv);
    ct_tensor *go = tu_rand(CT_SHAPE(3, 3), CT_F64, -1, 1, &gv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *y = ct_matmul(x, x);
    backward_with(y, go);
    double ref[9] = {0};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 3; k++) {
                ref[i * 3 + k] += gv[i * 3 + j] * xv[k * 3 + j]; /* g x^T */
                ref[k * 3 + j] += xv[i * 3 + k] * gv[i * 3 + j]; /* x^T g */
            }
    double *g = tu_values(ct_grad(x));
    tu_assert_close(g, ref, 9, 1e-12, 1e-12);
    free(g);
    free(xv);
    free(gv);
    ct_tensor *all[3] = {x, go, y};
    release_all(3, all);
    /* and under gradcheck, for every op that takes two operands */
    fctx c = {F_MATMUL, 0, 0, false};
    ct_tensor *s = rand_in((shp)SHP(2, 4, 4), L_TRANS, true);
    ct_tensor *in2[2] = {s, s};
    gradcheck_ok("matmul(x, x)", gc_fn, &c, 2, in2);
    c.k = F_BMM;
    gradcheck_ok("bmm(x, x)", gc_fn, &c, 2, in2);
    ct_tensor_release(s);
    ct_tensor *w = rand_in((shp)SHP(4, 4), L_NONCONTIG, true);
    ct_tensor *in3[3] = {w, w, w};
    fctx am = {F_ADDMM, 0.5, 2, false}, lin = {F_LINEAR, 0, 0, false};
    gradcheck_ok("addmm(w, w, w)", gc_fn, &am, 3, in3);
    gradcheck_ok("linear(w, w)", gc_fn, &lin, 2, in3);
    ct_tensor_release(w);
}

/* No history without an input that requires grad, or in no-grad mode. */
static void test_no_grad_paths(void **state) {
    (void)state;
    ct_tensor *a = rand_in((shp)SHP(2, 3), L_CONTIG, false);
    ct_tensor *b = rand_in((shp)SHP(3, 2), L_CONTIG, false);
    ct_tensor *bias = rand_in((shp)SHP(2), L_CONTIG, false);
    ct_tensor *bt = ct_t(b);
    ct_tensor *y[5] = {ct_matmul(a, b), ct_mm(a, b), ct_addmm(bias, a, b, 1, 1),
                       ct_linear(a, bt, bias), bt};
    for (int i = 0; i < 4; i++) {
        assert_non_null(y[i]);
        assert_false(ct_requires_grad(y[i]));
        assert_null(ct_grad_fn_name(y[i]));
    }
    release_all(5, y);
    assert_int_equal(ct_requires_grad_(a, true), CT_OK);
    bool prev = ct_no_grad_begin();
    ct_tensor *z = ct_matmul(a, b);
    ct_no_grad_end(prev);
    assert_false(ct_requires_grad(z));
    tu_assert_error(ct_backward(z, NULL, false), CT_ERR_AUTOGRAD, "does not require grad");
    ct_tensor_release(z);
    /* a path through a constant operand only reaches the leaf that requires grad */
    ct_tensor *w = ct_matmul(b, a); /* [3,2] @ [2,3]: only a requires grad */
    ct_tensor *go = ct_tensor_ones_like(w);
    backward_with(w, go);
    assert_non_null(ct_grad(a));
    assert_null(ct_grad(b));
    ct_tensor *all[5] = {a, b, bias, w, go};
    release_all(5, all);
}

/* A saved operand modified in place before backward is an error naming the
 * node; an operand that was not saved (its partner needs no grad) may be
 * modified freely. */
static void test_saved_modified(void **state) {
    (void)state;
    ct_tensor *a = rand_in((shp)SHP(2, 3), L_CONTIG, true);
    ct_tensor *b = rand_in((shp)SHP(3, 2), L_CONTIG, false);
    ct_tensor *y = ct_mm(a, b);
    assert_int_equal(ct_mul_scalar_(b, 2.0), CT_OK);
    ct_tensor *go = ct_tensor_ones_like(y);
    tu_assert_error(ct_backward(y, go, false), CT_ERR_AUTOGRAD, "MmBackward",
                    "modified by an in-place");
    assert_null(ct_grad(a));
    ct_tensor_release(y);

    /* only m2 needs grad now: m1 is saved; the input and m2 are not, so
     * modifying them (m2 in no-grad mode, as an optimizer step does) is fine */
    ct_tensor *c = rand_in((shp)SHP(2, 3), L_CONTIG, false);
    ct_tensor *d = rand_in((shp)SHP(3, 2), L_CONTIG, true);
    ct_tensor *x = rand_in((shp)SHP(2, 2), L_CONTIG, false);
    ct_tensor *z = ct_addmm(x, c, d, 1, 1);
    assert_int_equal(ct_mul_scalar_(x, 3.0), CT_OK);
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_mul_scalar_(d, 3.0), CT_OK);
    ct_no_grad_end(prev);
    backward_with(z, go);
    assert_non_null(ct_grad(d));
    ct_tensor *all[7] = {a, b, go, c, d, x, z};
    release_all(7, all);
}

/* An operand is saved only for the other operand's gradient: the graph of
 * a product with a constant keeps the constant, not the intermediate that
 * requires grad, alive. */
static void test_saves_only_needed(void **state) {
    (void)state;
    for (int k = 0; k < 5; k++) {
        ct_tensor *a0 = rand_in((shp)SHP(3, 4), L_CONTIG, true);
        ct_tensor *a = ct_add(a0, a0); /* has history, saves nothing */
        ct_tensor *b = rand_in((shp)SHP(4, 4), L_CONTIG, false);
        ct_tensor *b3 = rand_in((shp)SHP(2, 4, 4), L_CONTIG, false);
        ct_tensor *a3 = ct_expand(a, CT_SHAPE(2, 3, 4)), *at = ct_t(a);
        ct_tensor *ib = rand_in((shp)SHP(3), L_CONTIG, false);
        ct_tensor *y = NULL;
        switch (k) {
        case 0: y = ct_matmul(a, b); break;
        case 1: y = ct_mm(a, b); break;
        case 2: y = ct_bmm(a3, b3); break;
        case 3: y = ct_addmm(ib, b, at, 0.5, 2); break;
        case 4: y = ct_linear(b, a, NULL); break;
        }
        assert_non_null(y);
        ct_tensor_release(a3);
        ct_tensor_release(at);
        int64_t before = cti_get_alloc_stats().live_storages;
        ct_tensor_release(a); /* its storage has no other holder unless y's node saved it */
        assert_int_equal(cti_get_alloc_stats().live_storages, before - 1);
        ct_tensor *go = ct_tensor_ones_like(y);
        backward_with(y, go);
        assert_non_null(ct_grad(a0));
        ct_tensor *all[6] = {a0, b, b3, ib, y, go};
        release_all(6, all);
    }
}

/* Bad inputs fail with no result, no graph and no leak (teardown checks). */
static void test_failures_leave_nothing(void **state) {
    (void)state;
    ct_tensor *a = rand_in((shp)SHP(2, 3), L_CONTIG, true);
    ct_tensor *b = rand_in((shp)SHP(4, 2), L_CONTIG, true);
    ct_tensor *v = rand_in((shp)SHP(5), L_CONTIG, true);
    ct_tensor *w = rand_in((shp)SHP(2, 2, 5), L_CONTIG, true);
    tu_assert_null_error(ct_matmul(a, b), CT_ERR_SHAPE, "ct_matmul", "[2, 3]", "[4, 2]");
    tu_assert_null_error(ct_mm(a, v), CT_ERR_SHAPE, "ct_mm", "2-d");
    tu_assert_null_error(ct_bmm(a, b), CT_ERR_SHAPE, "ct_bmm", "3-d");
    tu_assert_null_error(ct_addmm(v, a, b, 1, 1), CT_ERR_SHAPE, "ct_addmm");
    tu_assert_null_error(ct_linear(a, b, NULL), CT_ERR_SHAPE, "ct_linear");
    tu_assert_null_error(ct_linear(w, b, v), CT_ERR_SHAPE, "ct_linear");
    ct_tensor *f = ct_tensor_zeros(CT_SHAPE(3, 2), CT_F32, CT_CPU);
    tu_assert_null_error(ct_matmul(a, f), CT_ERR_DTYPE, "ct_matmul", "float64", "float32");
    ct_tensor_release(f);
    /* the leaves hold no gradient and no history from the failed calls */
    ct_tensor *ts[4] = {a, b, v, w};
    for (int i = 0; i < 4; i++) {
        assert_true(ct_is_leaf(ts[i]));
        assert_null(ct_grad(ts[i]));
    }
    release_all(4, ts);
}

/* A chain of products through views of a result: history flows through the
 * transpose the next product reads. */
static ct_tensor *gc_chain(ct_tensor *const *in, void *v) {
    (void)v;
    ct_tensor *p = ct_matmul(in[0], in[1]);           /* [2,3,4] @ [4,3] -> [2,3,3] */
    ct_tensor *pt = p ? ct_transpose(p, 1, 2) : NULL; /* a transposed view of it */
    ct_tensor *q = pt ? ct_bmm(pt, in[2]) : NULL;     /* [2,3,3] @ [2,3,2] */
    ct_tensor *r = q ? ct_linear(q, in[3], NULL) : NULL;
    ct_tensor_release(p);
    ct_tensor_release(pt);
    ct_tensor_release(q);
    return r;
}

static void test_chain_gradcheck(void **state) {
    (void)state;
    ct_tensor *in[4] = {rand_in((shp)SHP(2, 3, 4), L_NONCONTIG, true),
                        rand_in((shp)SHP(4, 3), L_TRANS, true),
                        rand_in((shp)SHP(2, 3, 2), L_TRANS, true),
                        rand_in((shp)SHP(5, 2), L_CONTIG, true)};
    gradcheck_ok("matmul -> transpose -> bmm -> linear", gc_chain, NULL, 4, in);
    release_all(4, in);
}

/* ---- no copies of transposed operands -------------------------------------------------- */

/* Runs backward of y with grad_out go while the trace writes to a temporary
 * file; returns the trace (caller frees). */
static char *traced_backward(ct_tensor *y, ct_tensor *go) {
    tu_trace tr = tu_trace_begin();
    ct_status st = ct_backward(y, go, false);
    char *buf = tu_trace_end(&tr);
    assert_int_equal(st, CT_OK);
    assert_true(buf[0] != '\0');
    return buf;
}

/* Asserts the trace ran n GEMMs, copied no operand for any of them, and
 * ran at most max_copies copy ops (the engine's copies of leaf gradients). */
static void assert_gemms_without_copies(const char *trace, int n, int max_copies,
                                        const char *what) {
    int count = 0, copies = 0;
    for (const char *l = trace; *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)len, l);
        if (strstr(line, "gemm")) {
            count++;
            if (strstr(line, "copy")) {
                fprintf(stderr, "%s: an operand was copied: %s\n", what, line);
                fail();
            }
        }
        if (strstr(line, "] copy ")) copies++;
        l += len + (e ? 1 : 0);
    }
    if (copies > max_copies) {
        fprintf(stderr, "%s: %d copies in the trace, expected at most %d:\n%s", what, copies,
                max_copies, trace);
        fail();
    }
    if (count != n) {
        fprintf(stderr, "%s: %d GEMMs in the trace, expected %d:\n%s", what, count, n, trace);
        fail();
    }
}

/* With a contiguous grad_out and contiguous or transposed operands, every
 * gradient product hands the transposes to BLAS as views. */
static void test_backward_passes_transposes_to_blas(void **state) {
    (void)state;
    for (int l = 0; l < 2; l++) {
        layout lay = l ? L_TRANS : L_CONTIG;
        fctx cs[] = {{F_MM, 0, 0, false},    {F_BMM, 0, 0, false},
                     {F_MATMUL, 0, 0, false}, {F_MATMUL, 0, 0, false},
                     {F_ADDMM, 0.5, 2, false}, {F_LINEAR, 0, 0, true},
                     {F_MATMUL, 0, 0, false}};
        shp s[][3] = {{SHP(3, 4), SHP(4, 5)},
                            {SHP(2, 3, 4), SHP(2, 4, 5)},
                            {SHP(2, 3, 4), SHP(4, 5)},
                            {SHP(2, 1, 3, 4), SHP(5, 4, 2)},
                            {SHP(5), SHP(3, 4), SHP(4, 5)},
                            {SHP(2, 3, 4), SHP(5, 4), SHP(5)},
                            {SHP(2, 3, 4), SHP(4)}};
        /* the gradient of a matrix times a vector wrt the matrix is an outer
         * product, computed elementwise */
        const int gemms[] = {2, 2, 2, 2, 2, 2, 1};
        for (int i = 0; i < 7; i++) {
            int n = fn_nin(&cs[i]);
            ct_tensor *in[3] = {NULL};
            for (int k = 0; k < n; k++) in[k] = rand_in(s[i][k], lay, true);
            ct_tensor *y = run_fn(in, &cs[i]);
            assert_non_null(y);
            ct_tensor *go = ct_tensor_randn(NULL, ct_tensor_ndim(y), ct_tensor_shape(y), CT_F64,
                                            CT_CPU);
            char *trace = traced_backward(y, go);
            char what[64];
            snprintf(what, sizeof what, "%s #%d, %s operands", fk_names[cs[i].k], i,
                     layout_names[lay]);
            assert_gemms_without_copies(trace, gemms[i], n, what);
            free(trace);
            release_all(n, in);
            ct_tensor_release(y);
            ct_tensor_release(go);
        }
    }
}

/* ---- leaf gradients taken over ----------------------------------------------------------- */

/* Counts the copy ops in a trace. */
static int trace_copies(const char *trace) {
    int n = 0;
    for (const char *l = trace; (l = strstr(l, "] copy ")) != NULL; l++) n++;
    return n;
}

/* A gradient nothing else holds becomes the leaf's .grad as it is, also when
 * a scope around the step lists it (as a training loop's does): no copy op
 * runs, and the grads outlive the scope with the right values. */
static void test_leaf_grads_taken_without_copy(void **state) {
    (void)state;
    ct_tensor *x = rand_in((shp)SHP(4, 5), L_CONTIG, true);
    ct_tensor *w = rand_in((shp)SHP(3, 5), L_CONTIG, true);
    ct_tensor *b = rand_in((shp)SHP(3), L_CONTIG, true);
    double *xv = tu_values(x), *wv = tu_values(w);
    ct_scope *sc = ct_scope_begin();
    ct_tensor *y = ct_sum(ct_linear(x, w, b), CT_NONE, false);
    assert_non_null(y);
    char *trace = traced_backward(y, NULL);
    if (trace_copies(trace) != 0) fprintf(stderr, "copies in the backward:\n%s", trace);
    assert_int_equal(trace_copies(trace), 0);
    free(trace);
    ct_scope_end(sc);
    /* d sum(x w^T + b) / dx[i][k] = sum_j w[j][k]; / dw[j][k] = sum_i x[i][k]; / db = 4 */
    double gx[20], gw[15], gb[3];
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 5; k++) {
            gx[i * 5 + k] = 0;
            for (int j = 0; j < 3; j++) gx[i * 5 + k] += wv[j * 5 + k];
        }
    for (int j = 0; j < 3; j++) {
        gb[j] = 4;
        for (int k = 0; k < 5; k++) {
            gw[j * 5 + k] = 0;
            for (int i = 0; i < 4; i++) gw[j * 5 + k] += xv[i * 5 + k];
        }
    }
    double *got[3] = {tu_values(ct_grad(x)), tu_values(ct_grad(w)), tu_values(ct_grad(b))};
    tu_assert_close(got[0], gx, 20, 1e-12, 1e-12);
    tu_assert_close(got[1], gw, 15, 1e-12, 1e-12);
    tu_assert_close(got[2], gb, 3, 1e-12, 1e-12);
    for (int k = 0; k < 3; k++) free(got[k]);
    free(xv);
    free(wv);
    ct_tensor *in[3] = {x, w, b};
    release_all(3, in);
}

/* A gradient the caller still holds (here the grad_out itself, passed
 * through by an add) is copied: x.grad must not change when the caller
 * writes to its tensor afterwards. */
static void test_held_grad_is_copied(void **state) {
    (void)state;
    ct_tensor *x = rand_in((shp)SHP(6), L_CONTIG, true);
    ct_tensor *c = rand_in((shp)SHP(6), L_CONTIG, false);
    ct_tensor *go = rand_in((shp)SHP(6), L_CONTIG, false);
    ct_scope *sc = ct_scope_begin();
    ct_tensor *y = ct_add(x, c);
    assert_non_null(y);
    backward_with(y, go);
    ct_scope_end(sc);
    assert_false(ct_tensor_shares_storage(ct_grad(x), go));
    double *want = tu_values(go);
    assert_int_equal(ct_fill_(go, 7.0), CT_OK);
    double *got = tu_values(ct_grad(x));
    tu_assert_close(got, want, 6, 0, 0);
    free(got);
    free(want);
    ct_tensor *in[3] = {x, c, go};
    release_all(3, in);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_matmul_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_grad_shapes_and_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_broadcast_reference, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mm_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bmm_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_addmm_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_addmm_beta_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_bias_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_f32_matches_f64, setup, teardown),
        cmocka_unit_test_setup_teardown(test_half_grads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mlp_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accumulation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_tensor_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_grad_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_saved_modified, setup, teardown),
        cmocka_unit_test_setup_teardown(test_saves_only_needed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failures_leave_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chain_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backward_passes_transposes_to_blas, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leaf_grads_taken_without_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_grad_is_copied, setup, teardown),
    };
    return tu_run_tests(tests);
}
