/* The CUDA kernels and composites of sort, argsort, kthvalue, median,
 * cumprod, nonzero, unique, logsumexp, all/any, count_nonzero and amax/amin
 * and mode against the CPU's, which test_sort checks against float64 references:
 * every dtype, random shapes with size-1 dims, non-contiguous inputs, every
 * dim, ties, NaN, +-0 and infinities; sort's paths (the block sort of rows
 * up to 4096 at each of its sizes, the segmented sort of several long rows,
 * the device-wide sort of one long row, and of a few very long rows one by
 * one); gradients through autograd.
 * Sorts, selections, cumprod (the same order of products), nonzero and the
 * logical reductions must match exactly; logsumexp, whose sums the devices
 * add in different orders, within rounding. Skipped without a usable GPU. */
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

/* t on the CPU or the GPU, non-contiguous when nc (same values). */
static ct_tensor *place(ct_tensor *t, bool on_gpu, bool nc) {
    ct_tensor *a = on_gpu ? gpu(t) : ct_tensor_retain(t);
    if (!nc) return a;
    ct_tensor *v = chk(tu_noncontig(a));
    ct_tensor_release(a);
    return v;
}

/* The same dtype and shape, and values within rtol (0: bit for bit up to
 * NaN payloads, the sign of zero included when zero_sign). */
static void check_values(const char *what, ct_tensor *got, ct_tensor *want, double rtol,
                         bool zero_sign) {
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
        bool same = isnan(w[i])  ? isnan(g[i])
                    : rtol == 0 ? g[i] == w[i] && (!zero_sign || signbit(g[i]) == signbit(w[i]))
                                 : g[i] == w[i] || fabs(g[i] - w[i]) <= rtol * (1 + fabs(w[i]));
        if (!same) {
            fprintf(stderr, "%s: element %lld of %lld: cuda %.17g, cpu %.17g\n", what,
                    (long long)i, (long long)n, g[i], w[i]);
            fail();
        }
    }
    free(g);
    free(w);
}

static void check_close(const char *what, ct_tensor *got, ct_tensor *want, double rtol) {
    check_values(what, got, want, rtol, true);
}

static void check_equal(const char *what, ct_tensor *got, ct_tensor *want) {
    check_close(what, got, want, 0);
}

static void rand_shape(int nd, int64_t lo, int64_t hi, int64_t *shape) {
    for (int i = 0; i < nd; i++) shape[i] = tu_randint(lo, hi + 1);
}

/* A random CPU tensor with ties, and NaN, +-0 and infinities when floating. */
static ct_tensor *special(int nd, const int64_t *shape, ct_dtype dt) {
    int64_t n = tu_numel(nd, shape);
    double *v = tu_rand_vals(n, dt, -100, 100);
    for (int64_t i = 0; i < n; i++) {
        int r = (int)tu_randint(0, 10);
        if (r <= 1) v[i] = (double)tu_randint(-3, 4);
        else if (r == 2 && ct_dtype_is_floating(dt)) v[i] = NAN;
        else if (r == 3 && ct_dtype_is_floating(dt)) v[i] = tu_randint(0, 2) ? 0.0 : -0.0;
        else if (r == 4 && ct_dtype_is_floating(dt)) v[i] = tu_randint(0, 2) ? INFINITY : -INFINITY;
        else if (r == 5) v[i] = 0;
        if (dt == CT_BOOL) v[i] = v[i] != 0;
    }
    ct_tensor *t = chk(tu_from_f64(v, nd, shape, dt));
    free(v);
    return t;
}

static void release3(ct_tensor *a, ct_tensor *b, ct_tensor *c) {
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(c);
}

/* ---- sort, argsort ---------------------------------------------------------------------------- */

static void sort_pair(ct_tensor *x, int dim, bool desc, bool nc) {
    ct_tensor *xc = place(x, false, nc), *xg = place(x, true, nc), *ic = NULL, *ig = NULL;
    ct_tensor *want = chk(ct_sort(xc, dim, desc, true, &ic));
    ct_tensor *got = chk(ct_sort(xg, dim, desc, true, &ig));
    check_equal("sort values", got, want);
    check_equal("sort indices", ig, ic);
    ct_tensor *ag = chk(ct_argsort(xg, dim, desc, false));
    check_equal("argsort", ag, ic);
    release3(want, got, ag);
    release3(ic, ig, NULL);
    release3(xc, xg, NULL);
}

static void test_sort_parity(void **state) {
    NEED_GPU();
    const size_t di = tu_dtype_index(state);
    const ct_dtype dt = tu_dtype_of(state);
    for (int rep = 0; rep < 6; rep++) {
        int nd = 1 + rep % 3;
        int64_t shape[4];
        rand_shape(nd, 1, 9, shape);
        ct_tensor *x = special(nd, shape, dt);
        sort_pair(x, (int)tu_randint(-nd, nd), rep & 1, rep % 3 == 2);
        ct_tensor_release(x);
    }
    /* each block size of the shared-memory sort, the segmented and the device sort */
    static const int64_t lens[] = {1, 100, 129, 500, 1024, 2000, 4096, 4097, 9000, 140000};
    /* Under racecheck, which checks every shared-memory access, the 140000-long rows sorted
     * along dim 0 (140000 block sorts) take minutes; the 1-d sort below still takes the
     * device-wide path there. */
    const size_t nlens = sizeof lens / sizeof lens[0] - (tu_under_tool("racecheck") ? 1 : 0);
    for (size_t li = 0; li < nlens; li++) {
        int64_t shape[2] = {tu_randint(1, 5), lens[li]};
        ct_tensor *x = special(2, shape, dt);
        sort_pair(x, 1, li & 1, false);
        sort_pair(x, 0, !(li & 1), li % 3 == 0);
        ct_tensor_release(x);
    }
    /* 2^17, the shortest row the device-wide sort takes, under racecheck */
    int64_t n1 = tu_under_tool("racecheck") ? (int64_t)1 << 17 : 200000;
    ct_tensor *x = special(1, &n1, dt);
    sort_pair(x, 0, di & 1, false);
    ct_tensor_release(x);
    ct_tensor *s = special(0, NULL, dt);
    sort_pair(s, 0, false, false);
    ct_tensor_release(s);
    /* many short rows, as a batch of logits */
    if (dt != CT_F32) return;
    ct_tensor *rows = special(2, (const int64_t[]){1000, 1024}, CT_F32);
    sort_pair(rows, -1, true, false);
    ct_tensor_release(rows);
}

/* ---- kthvalue, median --------------------------------------------------------------------- */

static void test_kthvalue_median_mode_parity(void **state) {
    NEED_GPU();
    const ct_dtype dt = tu_dtype_of(state);
    for (int rep = 0; rep < 6; rep++) {
        int nd = 1 + rep % 3;
        int64_t shape[4];
        rand_shape(nd, 1, 9, shape);
        int dim = (int)tu_randint(-nd, nd), d = dim < 0 ? dim + nd : dim;
        /* long rows (past one block's shared-memory sort) only along the reduced dim: a cube
         * of long sides would be ~10^8 elements, hours under racecheck */
        if (rep == 5) shape[d] = tu_randint(4097, 5001);
        int64_t k = tu_randint(1, shape[d] + 1);
        ct_tensor *x = special(nd, shape, dt);
        bool nc = rep % 2, keep = rep % 3 == 0;
        ct_tensor *xc = place(x, false, nc), *xg = place(x, true, nc), *ic = NULL, *ig = NULL;
        ct_tensor *w = chk(ct_kthvalue(xc, k, dim, keep, &ic));
        ct_tensor *g = chk(ct_kthvalue(xg, k, dim, keep, &ig));
        check_equal("kthvalue", g, w);
        check_equal("kthvalue indices", ig, ic);
        release3(w, g, ic);
        ct_tensor_release(ig);
        w = chk(ct_median_dim(xc, dim, keep, &ic));
        g = chk(ct_median_dim(xg, dim, keep, &ig));
        check_equal("median_dim", g, w);
        check_equal("median_dim indices", ig, ic);
        release3(w, g, ic);
        ct_tensor_release(ig);
        w = chk(ct_mode(xc, dim, keep, &ic));
        g = chk(ct_mode(xg, dim, keep, &ig));
        check_equal("mode", g, w);
        check_equal("mode indices", ig, ic);
        release3(w, g, ic);
        ct_tensor_release(ig);
        w = chk(ct_median(xc));
        g = chk(ct_median(xg));
        check_equal("median", g, w);
        release3(w, g, NULL);
        release3(x, xc, xg);
    }
}

/* ---- cumprod ------------------------------------------------------------------------------------ */

static void test_cumprod_parity(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        ct_dtype dt = tu_all_dtypes[di];
        bool fl = ct_dtype_is_floating(dt);
        for (int rep = 0; rep < 6; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, rep == 5 ? 40 : 9, shape);
            ct_tensor *x = chk(tu_rand(nd, shape, dt, fl ? -1.5 : -3, fl ? 1.5 : 4, NULL));
            bool nc = rep % 2;
            int dim = (int)tu_randint(-nd, nd);
            ct_tensor *xc = place(x, false, nc), *xg = place(x, true, nc);
            ct_tensor *w = chk(ct_cumprod(xc, dim)), *g = chk(ct_cumprod(xg, dim));
            check_equal("cumprod", g, w);
            release3(w, g, x);
            release3(xc, xg, NULL);
        }
    }
}

/* ---- nonzero, unique -------------------------------------------------------------------------- */

static void test_nonzero_unique_parity(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        ct_dtype dt = tu_all_dtypes[di];
        for (int rep = 0; rep < 6; rep++) {
            int nd = rep % 5;
            int64_t shape[4];
            rand_shape(nd, rep == 4 ? 0 : 1, rep == 3 ? 60 : 8, shape);
            ct_tensor *x = special(nd, shape, dt);
            bool nc = rep % 2;
            ct_tensor *xc = place(x, false, nc), *xg = place(x, true, nc);
            ct_tensor *w = chk(ct_nonzero(xc)), *g = chk(ct_nonzero(xg));
            check_equal("nonzero", g, w);
            release3(w, g, NULL);
            ct_tensor *iw = NULL, *ig = NULL, *cw = NULL, *cg = NULL;
            w = chk(ct_unique(xc, true, &iw, &cw));
            g = chk(ct_unique(xg, true, &ig, &cg));
            check_equal("unique", g, w);
            check_equal("unique inverse", ig, iw);
            check_equal("unique counts", cg, cw);
            release3(w, g, iw);
            release3(ig, cw, cg);
            release3(x, xc, xg);
        }
    }
}

/* ---- logsumexp, all, any, count_nonzero, amax, amin ----------------------------------------------- */

static void test_reductions_parity(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        ct_dtype dt = tu_all_dtypes[di];
        for (int rep = 0; rep < 6; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4], dims[4];
            rand_shape(nd, 1, rep == 5 ? 300 : 7, shape);
            int k = 0;
            unsigned mask = (unsigned)tu_randint(1, 1 << nd);
            for (int d = 0; d < nd; d++)
                if (mask >> d & 1) dims[k++] = d;
            bool keep = rep & 1, nc = rep % 3 == 1;
            ct_tensor *x = special(nd, shape, dt);
            ct_tensor *xc = place(x, false, nc), *xg = place(x, true, nc);
            /* Of -0 and +0 the larger is either (IEEE leaves it open), and
             * which one a reduction keeps depends on its order, which the
             * devices do not share (nor do PyTorch's). */
            ct_tensor *w = chk(ct_amax(xc, k, dims, keep)), *g = chk(ct_amax(xg, k, dims, keep));
            check_values("amax", g, w, 0, false);
            release3(w, g, NULL);
            w = chk(ct_amin(xc, k, dims, keep)), g = chk(ct_amin(xg, k, dims, keep));
            check_values("amin", g, w, 0, false);
            release3(w, g, NULL);
            w = chk(ct_all(xc, k, dims, keep)), g = chk(ct_all(xg, k, dims, keep));
            check_equal("all", g, w);
            release3(w, g, NULL);
            w = chk(ct_any(xc, k, dims, keep)), g = chk(ct_any(xg, k, dims, keep));
            check_equal("any", g, w);
            release3(w, g, NULL);
            w = chk(ct_count_nonzero(xc, k, dims)), g = chk(ct_count_nonzero(xg, k, dims));
            check_equal("count_nonzero", g, w);
            release3(w, g, NULL);
            ct_tensor *y = chk(tu_rand(nd, shape, dt, -30, 30, NULL));
            ct_tensor *yc = place(y, false, nc), *yg = place(y, true, nc);
            w = chk(ct_logsumexp(yc, k, dims, keep)), g = chk(ct_logsumexp(yg, k, dims, keep));
            double rtol = dt == CT_F64 ? 1e-13 : dt == CT_F16 ? 2e-3 : dt == CT_BF16 ? 1.6e-2 : 2e-6;
            check_close("logsumexp", g, w, rtol);
            release3(w, g, y);
            release3(yc, yg, NULL);
            release3(x, xc, xg);
        }
    }
}

/* ---- gradients ------------------------------------------------------------------------------------ */

typedef ct_tensor *(*op_fn)(ct_tensor *x);
static ct_tensor *f_sort(ct_tensor *x) { return ct_sort(x, 1, true, true, NULL); }
static ct_tensor *f_kth(ct_tensor *x) { return ct_kthvalue(x, 3, 0, false, NULL); }
static ct_tensor *f_median(ct_tensor *x) { return ct_median_dim(x, -1, true, NULL); }
static ct_tensor *f_cumprod(ct_tensor *x) { return ct_cumprod(x, 1); }
static ct_tensor *f_amax(ct_tensor *x) { return ct_amax(x, 1, (const int64_t[]){1}, false); }
static ct_tensor *f_amin(ct_tensor *x) { return ct_amin(x, CT_NONE, false); }
static ct_tensor *f_lse(ct_tensor *x) { return ct_logsumexp(x, 1, (const int64_t[]){0}, true); }

/* The gradient of sum(f(x) * w) for a fixed random w, on both devices. */
static void grad_pair(const char *what, op_fn f, ct_tensor *x, ct_dtype dt, double rtol) {
    ct_tensor *xc = chk(ct_to_dtype(x, dt)), *xg = gpu(xc);
    assert_int_equal(ct_requires_grad_(xc, true), CT_OK);
    assert_int_equal(ct_requires_grad_(xg, true), CT_OK);
    ct_tensor *yc = chk(f(xc)), *yg = chk(f(xg));
    ct_tensor *w = chk(tu_rand(ct_tensor_ndim(yc), ct_tensor_shape(yc), dt, -1, 1, NULL));
    ct_tensor *wg = gpu(w);
    assert_int_equal(ct_backward(yc, w, false), CT_OK);
    assert_int_equal(ct_backward(yg, wg, false), CT_OK);
    check_close(what, ct_grad(xg), ct_grad(xc), rtol);
    release3(xc, xg, yc);
    release3(yg, w, wg);
}

static void test_grad_parity(void **state) {
    (void)state;
    NEED_GPU();
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_BF16};
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
        ct_dtype dt = dts[di];
        double v[48];
        for (int i = 0; i < 48; i++) v[i] = (double)((i * 7) % 48) / 8 - 3; /* distinct */
        v[5] = v[17] = 0;                                                   /* cumprod's zeros */
        v[40] = v[41];                                                      /* a tie of amax */
        ct_tensor *x = chk(tu_from_f64(v, 2, (const int64_t[]){6, 8}, CT_F64));
        grad_pair("sort grad", f_sort, x, dt, 0);
        grad_pair("kthvalue grad", f_kth, x, dt, 0);
        grad_pair("median grad", f_median, x, dt, 0);
        grad_pair("cumprod grad", f_cumprod, x, dt, dt == CT_F64 ? 1e-13 : dt == CT_BF16 ? 1e-2 : 1e-5);
        grad_pair("amax grad", f_amax, x, dt, 0);
        grad_pair("amin grad", f_amin, x, dt, 0);
        grad_pair("logsumexp grad", f_lse, x, dt, dt == CT_F64 ? 1e-13 : dt == CT_BF16 ? 1e-2 : 1e-5);
        ct_tensor_release(x);
    }
}

int main(void) {
    tu_seed();
    ngpu = tu_cuda_devices_or_skip("cuda_sort");
    if (!ct_supports(CT_OP_SORT, CT_DEVICE_CUDA, CT_F32))
        fprintf(stderr, "[ cuda_sort ] no CUDA sort kernel registered\n");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        TU_EACH_DTYPE(test_sort_parity), TU_EACH_DTYPE(test_kthvalue_median_mode_parity),
        T(test_cumprod_parity),        T(test_nonzero_unique_parity),
        T(test_reductions_parity),     T(test_grad_parity),
    };
    return tu_run_tests(tests);
}
