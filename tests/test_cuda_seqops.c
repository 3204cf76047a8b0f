/* The CUDA kernels of tril/triu, cumsum, topk and multinomial against the
 * CPU's, which test_seqops checks against float64 references: every dtype,
 * random shapes with odd and size-1 dims, non-contiguous inputs, every dim;
 * topk's paths (radix select with an in-shared-memory sort for
 * k <= 2048, one block a row or a long row split over many blocks, a
 * segmented sort beyond) on vocabulary rows of 50304, on long rows of ties
 * and on many short rows, with ties, NaN, +-0 and infinities; multinomial's
 * samples equal to the CPU's for the same generator state; gradients
 * through autograd; bad weights and indices reported by the next wait for
 * the device. Results must match the CPU exactly (same values, same
 * indices): the kernels follow the CPU's order of additions. The program is
 * skipped without a usable GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "cuda_module.h"

#include "test_fixture.h"

static int ngpu;

#define NEED_GPU()             \
    do {                       \
        if (ngpu == 0) skip(); \
    } while (0)

static ct_tensor *chk(ct_tensor *t) {
    if (!t) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(t);
    return t;
}

static ct_tensor *gpu(ct_tensor *t) { return chk(ct_to_device(t, CT_CUDA(0))); }

/* The GPU copy of a CPU tensor made for it, which is released. */
static ct_tensor *gpu_take(ct_tensor *t) {
    ct_tensor *g = gpu(t);
    ct_tensor_release(t);
    return g;
}

/* t on the CPU or the GPU, non-contiguous when nc (same values). */
static ct_tensor *place(ct_tensor *t, bool on_gpu, bool nc) {
    ct_tensor *a = on_gpu ? gpu(t) : ct_tensor_retain(t);
    if (!nc) return a;
    ct_tensor *v = chk(tu_noncontig(a));
    ct_tensor_release(a);
    return v;
}

/* The same dtype, shape and values (bit for bit up to NaN payloads). */
static void check_equal(const char *what, ct_tensor *got, ct_tensor *want) {
    assert_non_null(got);
    assert_non_null(want);
    assert_int_equal(ct_tensor_device(got).type, CT_DEVICE_CUDA);
    assert_int_equal(ct_tensor_dtype(got), ct_tensor_dtype(want));
    assert_int_equal(ct_tensor_ndim(got), ct_tensor_ndim(want));
    for (int d = 0; d < ct_tensor_ndim(want); d++)
        assert_int_equal(ct_tensor_shape(got)[d], ct_tensor_shape(want)[d]);
    int64_t n = ct_tensor_numel(want);
    double *g = tu_values(got), *w = tu_values(want);
    for (int64_t i = 0; i < n; i++) {
        bool same = isnan(w[i]) ? isnan(g[i]) : g[i] == w[i] && signbit(g[i]) == signbit(w[i]);
        if (!same) {
            fprintf(stderr, "%s: element %lld: cuda %.17g, cpu %.17g\n", what, (long long)i, g[i],
                    w[i]);
            fail();
        }
    }
    free(g);
    free(w);
}

static void rand_shape(int nd, int64_t lo, int64_t hi, int64_t *shape) {
    for (int i = 0; i < nd; i++) shape[i] = tu_randint(lo, hi + 1);
}

/* ---- tril / triu ---------------------------------------------------------------------------- */

static void test_tril_triu_parity(void **state) {
    (void)state;
    NEED_GPU();
    static const int64_t diags[] = {0, 1, -1, 3, -4, 100, -100, INT64_MAX, INT64_MIN};
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        ct_dtype dt = tu_all_dtypes[di];
        for (int rep = 0; rep < 8; rep++) {
            int nd = 2 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, rep == 7 ? 130 : 9, shape);
            int64_t diag = diags[tu_randint(0, sizeof diags / sizeof diags[0])];
            ct_tensor *x = chk(tu_rand(nd, shape, dt, -9, 9, NULL));
            bool nc = rep % 2;
            ct_tensor *xc = place(x, false, nc), *xg = place(x, true, nc);
            for (int up = 0; up < 2; up++) {
                ct_tensor *want = chk(up ? ct_triu(xc, diag) : ct_tril(xc, diag));
                ct_tensor *got = chk(up ? ct_triu(xg, diag) : ct_tril(xg, diag));
                check_equal(up ? "triu" : "tril", got, want);
                ct_tensor_release(want);
                ct_tensor_release(got);
            }
            ct_tensor_release(x);
            ct_tensor_release(xc);
            ct_tensor_release(xg);
        }
    }
}

/* ---- cumsum ------------------------------------------------------------------------------------ */

static void cumsum_pair(ct_tensor *x, int dim, bool nc) {
    ct_tensor *xc = place(x, false, nc), *xg = place(x, true, nc);
    ct_tensor *want = chk(ct_cumsum(xc, dim)), *got = chk(ct_cumsum(xg, dim));
    check_equal("cumsum", got, want);
    if (ct_dtype_is_floating(ct_tensor_dtype(x))) {
        ct_tensor *wb = chk(ct_cumsum_backward(xc, dim)), *gb = chk(ct_cumsum_backward(xg, dim));
        check_equal("cumsum_backward", gb, wb);
        ct_tensor_release(wb);
        ct_tensor_release(gb);
    }
    ct_tensor_release(want);
    ct_tensor_release(got);
    ct_tensor_release(xc);
    ct_tensor_release(xg);
}

static void test_cumsum_parity(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        ct_dtype dt = tu_all_dtypes[di];
        for (int rep = 0; rep < 8; rep++) {
            int nd = 1 + rep % 4;
            int64_t shape[4];
            rand_shape(nd, 1, 11, shape);
            ct_tensor *x = chk(tu_rand(nd, shape, dt, -100, 100, NULL));
            cumsum_pair(x, (int)tu_randint(-nd, nd), rep % 2);
            ct_tensor_release(x);
        }
        /* long lines, wide inner, 0-d */
        ct_tensor *x = chk(tu_rand(2, (const int64_t[]){3, 5000}, dt, -100, 100, NULL));
        cumsum_pair(x, 1, false);
        cumsum_pair(x, 0, true);
        ct_tensor_release(x);
        x = chk(tu_rand(0, NULL, dt, -100, 100, NULL));
        cumsum_pair(x, 0, false);
        ct_tensor_release(x);
    }
}

/* ---- topk ------------------------------------------------------------------------------------------ */

/* Values with ties, NaN, +-0 and infinities where special. */
static ct_tensor *topk_input(int nd, const int64_t *shape, ct_dtype dt, bool special) {
    int64_t n = tu_numel(nd, shape);
    double *v = tu_rand_vals(n, dt, -1000, 1000);
    for (int64_t i = 0; special && i < n; i++) {
        int r = (int)tu_randint(0, 12);
        bool fl = ct_dtype_is_floating(dt);
        if (r == 0) v[i] = (double)tu_randint(-2, 3);
        else if (r == 1 && fl) v[i] = NAN;
        else if (r == 2 && fl) v[i] = tu_randint(0, 2) ? 0.0 : -0.0;
        else if (r == 3 && fl) v[i] = tu_randint(0, 2) ? INFINITY : -INFINITY;
    }
    ct_tensor *t = chk(tu_from_f64(v, nd, shape, dt));
    free(v);
    return t;
}

/* One row of n values from {-2, ..., 2}: every selection ends inside a run of
 * ties spread over the whole row. */
static ct_tensor *tie_input(int64_t n, ct_dtype dt) {
    double *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)tu_randint(-2, 3);
    ct_tensor *t = chk(tu_from_f64(v, 1, &n, dt));
    free(v);
    return t;
}

static void topk_pair(ct_tensor *x, int64_t k, int dim, bool largest, bool nc) {
    ct_tensor *xc = place(x, false, nc), *xg = place(x, true, nc);
    ct_tensor *wi = NULL, *gi = NULL;
    ct_tensor *want = chk(ct_topk(xc, k, dim, largest, true, &wi));
    ct_tensor *got = chk(ct_topk(xg, k, dim, largest, true, &gi));
    check_equal("topk values", got, want);
    check_equal("topk indices", gi, wi);
    ct_tensor_release(want);
    ct_tensor_release(got);
    ct_tensor_release(wi);
    ct_tensor_release(gi);
    ct_tensor_release(xc);
    ct_tensor_release(xg);
}

/* n, or under racecheck (which takes minutes a pass over long rows) the
 * shorter small that still takes the same path. */
static int64_t long_len(int64_t n, int64_t small) {
    return tu_under_tool("racecheck") ? small : n;
}

static void test_topk_parity(void **state) {
    NEED_GPU();
    const ct_dtype dt = tu_dtype_of(state);
    for (int rep = 0; rep < 8; rep++) {
        int nd = 1 + rep % 3;
        int64_t shape[4];
        rand_shape(nd, 1, 40, shape);
        int dim = (int)tu_randint(-nd, nd);
        int64_t len = shape[dim < 0 ? dim + nd : dim];
        int64_t k = rep == 0 ? 0 : rep == 1 ? len : tu_randint(0, len + 1);
        ct_tensor *x = topk_input(nd, shape, dt, rep % 3 != 0);
        topk_pair(x, k, dim, rep % 2 == 0, rep % 4 == 1);
        ct_tensor_release(x);
    }
    /* vocabulary rows, the sampler's k (rows of more than 8192: the split
     * select below kSelectMax, the sorts above) */
    ct_tensor *x = topk_input(2, (const int64_t[]){8, long_len(50304, 12000)}, dt, dt == CT_BF16);
    topk_pair(x, 50, -1, true, false);
    topk_pair(x, 1, -1, false, false);
    topk_pair(x, 2048, -1, true, false);  /* the largest in-shared sort */
    topk_pair(x, 2049, -1, false, false); /* the segmented sort */
    ct_tensor_release(x);
    /* few long rows, each split over many blocks: ties across the blocks'
     * boundaries (a handful of distinct values), and the specials */
    x = tie_input(long_len(200000, 20000), dt);
    topk_pair(x, 100, -1, true, false);
    topk_pair(x, 37, -1, false, false);
    ct_tensor_release(x);
    x = topk_input(2, (const int64_t[]){3, long_len(100000, 20000)}, dt, true);
    topk_pair(x, 64, 1, true, false);
    topk_pair(x, 2048, 1, false, true);
    ct_tensor_release(x);
    /* many short rows, along a leading dim */
    x = topk_input(2, (const int64_t[]){7, 3000}, dt, true);
    topk_pair(x, 5, 0, true, true);
    topk_pair(x, 7, 0, false, false);
    ct_tensor_release(x);
    /* a whole row sorted */
    x = topk_input(2, (const int64_t[]){3, 4100}, dt, true);
    topk_pair(x, 4100, 1, true, false);
    topk_pair(x, 3000, 1, false, true);
    ct_tensor_release(x);
}

static void test_topk_grad_parity(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        ct_tensor *x = topk_input(3, (const int64_t[]){3, 37, 5}, dt, false);
        ct_tensor *xc = chk(ct_clone(x)), *xg = gpu(x);
        assert_int_equal(ct_requires_grad_(xc, true), CT_OK);
        assert_int_equal(ct_requires_grad_(xg, true), CT_OK);
        ct_tensor *g = chk(tu_rand(3, (const int64_t[]){3, 6, 5}, dt, -1, 1, NULL));
        ct_tensor *gg = gpu(g);
        ct_tensor *yc = chk(ct_topk(xc, 6, 1, true, true, NULL));
        ct_tensor *yg = chk(ct_topk(xg, 6, 1, true, true, NULL));
        assert_int_equal(ct_backward(yc, g, false), CT_OK);
        assert_int_equal(ct_backward(yg, gg, false), CT_OK);
        check_equal("topk grad", ct_grad(xg), ct_grad(xc));
        /* tril and cumsum through autograd too */
        ct_tensor *c1 = chk(ct_cumsum(xc, 2)), *c2 = chk(ct_cumsum(xg, 2));
        ct_tensor *t1 = chk(ct_tril(c1, 1)), *t2 = chk(ct_tril(c2, 1));
        ct_zero_grad(xc);
        ct_zero_grad(xg);
        ct_tensor *o1 = chk(ct_tensor_ones_like(t1)), *o2 = chk(ct_tensor_ones_like(t2));
        assert_int_equal(ct_backward(t1, o1, false), CT_OK);
        assert_int_equal(ct_backward(t2, o2, false), CT_OK);
        check_equal("cumsum+tril grad", ct_grad(xg), ct_grad(xc));
        ct_tensor *all[] = {x, xc, xg, g, gg, yc, yg, c1, c2, t1, t2, o1, o2};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
    }
}

static void test_topk_backward_bad_index(void **state) {
    (void)state;
    NEED_GPU();
    ct_tensor *g = gpu_take(chk(ct_tensor_ones(2, (const int64_t[]){2, 2}, CT_F32, CT_CPU)));
    int64_t bad[4] = {0, 1, 9, 2};
    ct_tensor *ic = chk(ct_tensor_from_data(bad, CT_I64, 2, (const int64_t[]){2, 2}));
    ct_tensor *ig = gpu(ic);
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    tu_assert_null_error(ct_topk_backward(g, ic, 1, 5), CT_ERR_DEVICE, "ct_topk_backward");
    ct_tensor *dx = ct_topk_backward(g, ig, 1, 5); /* queued; the kernel finds index 9 */
    ct_status s = ct_cuda_synchronize(0);
    tu_assert_error(s, CT_ERR_INDEX, "topk_backward", "index 9 is out of range for dim 1 of size 5",
                    "ct_cuda_synchronize");
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_tensor_release(dx);
    ct_tensor_release(g);
    ct_tensor_release(ic);
    ct_tensor_release(ig);
}

/* ---- multinomial ---------------------------------------------------------------------------------- */

static void multinomial_pair(int64_t rows, int64_t n, ct_dtype dt, int64_t S, bool repl,
                             double zero_frac, bool nc) {
    int64_t shape[2] = {rows, n};
    double *w = tu_rand_vals(rows * n, dt, 0, 4);
    for (int64_t i = 0; i < rows * n; i++)
        if (tu_uniform(0, 1) < zero_frac) w[i] = 0;
    for (int64_t r = 0; r < rows; r++) /* enough positive weights for S without replacement */
        for (int64_t j = 0; j < (repl ? 1 : S); j++) w[r * n + j] = 1 + (double)j;
    ct_tensor *p = chk(tu_from_f64(w, rows == 1 ? 1 : 2, rows == 1 ? shape + 1 : shape, dt));
    free(w);
    ct_tensor *pc = place(p, false, nc), *pg = place(p, true, nc);
    uint64_t seed = tu_next();
    ct_generator *gc = ct_generator_new(seed), *gg = ct_generator_new(seed);
    uint64_t off = (uint64_t)tu_randint(0, 16); /* odd ones too: pairs across Philox blocks */
    ct_generator_set_offset(gc, off);
    ct_generator_set_offset(gg, off);
    ct_tensor *want = chk(ct_multinomial(pc, S, repl, gc));
    ct_tensor *got = chk(ct_multinomial(pg, S, repl, gg));
    check_equal(repl ? "multinomial with replacement" : "multinomial without replacement", got,
                want);
    assert_int_equal(ct_generator_offset(gg), ct_generator_offset(gc));
    ct_generator_free(gc);
    ct_generator_free(gg);
    ct_tensor_release(want);
    ct_tensor_release(got);
    ct_tensor_release(p);
    ct_tensor_release(pc);
    ct_tensor_release(pg);
}

static void test_multinomial_parity(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        for (int repl = 0; repl < 2; repl++) {
            multinomial_pair(1, 7, dt, 5, repl, 0.3, false);
            multinomial_pair(5, 1, dt, 1, repl, 0, false);
            multinomial_pair(13, 300, dt, 17, repl, 0.5, true);
            multinomial_pair(3, 50304, dt, repl ? 1000 : 40, repl, 0.9, false);
            multinomial_pair(300, 1000, dt, 3, repl, 0.2, false);
            multinomial_pair(2, 600, dt, 600, repl, 0, false); /* every category */
        }
    }
}

static void expect_multinomial_fault(ct_tensor *p, int64_t S, bool repl, const char *a,
                                     const char *b) {
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_tensor *s = ct_multinomial(p, S, repl, NULL); /* queued; the kernel finds it */
    ct_status st = ct_cuda_synchronize(0);
    tu_assert_error(st, CT_ERR_INVALID_ARG, "ct_multinomial", a, b, "ct_cuda_synchronize");
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_tensor_release(s);
}

static void test_multinomial_bad_weights(void **state) {
    (void)state;
    NEED_GPU();
    static const double bad[] = {-1, NAN, INFINITY};
    for (int k = 0; k < 3; k++) {
        double w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        w[6] = bad[k];
        ct_tensor *p = gpu_take(chk(tu_from_f64(w, 2, (const int64_t[]){2, 4}, CT_F32)));
        expect_multinomial_fault(p, 2, k != 0, "finite and non-negative", "row 1, element 2");
        ct_tensor_release(p);
    }
    double z[6] = {1, 2, 3, 0, 0, 0};
    ct_tensor *p = gpu_take(chk(tu_from_f64(z, 2, (const int64_t[]){2, 3}, CT_F64)));
    expect_multinomial_fault(p, 1, true, "row 1 of the probabilities sums to 0", "positive");
    ct_tensor_release(p);
    double f[6] = {1, 0, 3, 0, 0, 2};
    p = gpu_take(chk(tu_from_f64(f, 2, (const int64_t[]){2, 3}, CT_BF16)));
    expect_multinomial_fault(p, 2, false, "cannot draw 2 samples without replacement from row 1",
                             "which has 1 non-zero");
    ct_tensor_release(p);
    /* good weights after a fault: no error left behind */
    double ok[3] = {1, 1, 1};
    p = gpu_take(chk(tu_from_f64(ok, 1, (const int64_t[]){3}, CT_F32)));
    ct_tensor *s = chk(ct_multinomial(p, 4, true, NULL));
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_tensor_release(s);
    ct_tensor_release(p);
}

int main(void) {
    tu_seed();
    ngpu = tu_cuda_devices_or_skip("cuda_seqops");
    if (!ct_supports(CT_OP_TOPK, CT_DEVICE_CUDA, CT_F32))
        fprintf(stderr, "[ cuda_seqops ] no CUDA topk kernel registered\n");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_tril_triu_parity),       T(test_cumsum_parity),
        TU_EACH_NUMERIC_DTYPE(test_topk_parity), T(test_topk_grad_parity),
        T(test_topk_backward_bad_index), T(test_multinomial_parity),
        T(test_multinomial_bad_weights),
    };
    return tu_run_tests(tests);
}
