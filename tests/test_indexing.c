/* The indexing ops on the CPU: gather, scatter_add, index_select,
 * masked_fill, repeat_interleave, split, split_with_sizes and chunk against
 * float64 reference loops written here, on fresh random inputs (random
 * shapes with odd and size-1 dims, empty ones, 0-d tensors) in every dtype,
 * contiguous and as non-contiguous views, into poisoned memory; float64
 * gradient checks of each; the gradients' values against counts; and every
 * bad input with its status and message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"

/* ---- helpers ------------------------------------------------------------------------- */

/* Fills and frees a block of nbytes so that the CPU cache hands it to the
 * next tensor of that size (blocks of 64 KiB and more), which then starts
 * out as 0xA5 bytes rather than zeros. */
static void poison(int64_t nbytes) {
    if (nbytes < 65536) return;
    int64_t n = nbytes;
    ct_tensor *t = ct_tensor_empty(1, &n, CT_BOOL, CT_CPU);
    assert_non_null(t);
    memset(ct_tensor_data_ptr(t), 0xA5, (size_t)n);
    ct_tensor_release(t);
}

/* A random shape of nd dims, each 1..hi (size 1 often). */
static void rand_shape(int nd, int64_t hi, int64_t *s) {
    for (int k = 0; k < nd; k++) s[k] = tu_next() % 4 == 0 ? 1 : tu_randint(1, hi + 1);
}

/* Row-major offset of coordinate c in shape s (nd dims). */
static int64_t offset_of(int nd, const int64_t *s, const int64_t *c) {
    int64_t o = 0;
    for (int k = 0; k < nd; k++) o = o * s[k] + c[k];
    return o;
}

static void unravel(int64_t p, int nd, const int64_t *s, int64_t *c) {
    for (int k = nd - 1; k >= 0; k--) {
        c[k] = p % s[k];
        p /= s[k];
    }
}

/* t made non-contiguous with the same values (t released). */
static ct_tensor *nc_of(ct_tensor *t) {
    ct_tensor *v = tu_noncontig(t);
    ct_tensor_release(t);
    assert_non_null(v);
    return v;
}

/* An int64/int32 tensor holding vals. */
static ct_tensor *ints(const int64_t *vals, int nd, const int64_t *shape, ct_dtype dt) {
    int64_t n = tu_numel(nd, shape);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)vals[i];
    ct_tensor *t = tu_from_f64(v, nd, shape, dt);
    free(v);
    assert_non_null(t);
    return t;
}

static double lo_of(ct_dtype dt) { return ct_dtype_is_floating(dt) ? -4 : -20; }
static double hi_of(ct_dtype dt) { return ct_dtype_is_floating(dt) ? 4 : 20; }

/* got's values against ref exactly (copies), or within the dtype's
 * tolerance for sums. */
static void expect(const ct_tensor *got, int nd, const int64_t *shape, ct_dtype dt,
                   const double *ref, bool exact) {
    check_shape(got, nd, shape);
    assert_int_equal(ct_tensor_dtype(got), dt);
    int64_t n = tu_numel(nd, shape);
    double *g = tu_values(got);
    tu_assert_close(g, ref, n, exact ? 0 : tu_rtol(dt), exact ? 0 : tu_rtol(dt));
    free(g);
}

/* ---- gather ------------------------------------------------------------------------------ */

static void gather_case(ct_dtype dt, int nd, int variant) {
    int64_t xs[4], is[4];
    rand_shape(nd, 7, xs);
    int dim = (int)tu_randint(0, nd);
    for (int k = 0; k < nd; k++) is[k] = k == dim ? tu_randint(0, 9) : tu_randint(1, xs[k] + 1);
    if (variant == 2) is[dim] = 0; /* empty */
    double *xv;
    ct_tensor *x = tu_rand(nd, xs, dt, lo_of(dt), hi_of(dt), &xv);
    int64_t n = tu_numel(nd, is);
    int64_t *iv = malloc((size_t)(n + 1) * sizeof *iv);
    for (int64_t p = 0; p < n; p++) iv[p] = tu_randint(0, xs[dim]);
    ct_tensor *idx = ints(iv, nd, is, CT_I64);
    if (variant == 1) {
        x = nc_of(x);
        idx = nc_of(idx);
    }
    double *ref = malloc((size_t)(n + 1) * sizeof *ref);
    int64_t c[4];
    for (int64_t p = 0; p < n; p++) {
        unravel(p, nd, is, c);
        c[dim] = iv[p];
        ref[p] = xv[offset_of(nd, xs, c)];
    }
    poison(n * (int64_t)ct_dtype_size(dt));
    ct_tensor *out = ct_gather(x, variant == 3 ? dim - nd : dim, idx);
    if (!out) fprintf(stderr, "gather: %s\n", ct_last_error());
    expect(out, nd, is, dt, ref, true);
    ct_tensor *all[3] = {x, idx, out};
    release_all(3, all);
    free(xv);
    free(iv);
    free(ref);
}

static void test_gather(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int nd = 1; nd <= 4; nd++)
            for (int v = 0; v < 4; v++) gather_case(tu_all_dtypes[t], nd, v);
}

/* A large gather (several tasks) into poisoned memory, with a 0-d case. */
static void test_gather_large_and_0d(void **state) {
    (void)state;
    int64_t xs[2] = {300, 257}, is[2] = {300, 301};
    double *xv;
    ct_tensor *x = tu_rand(2, xs, CT_F32, -1, 1, &xv);
    int64_t n = tu_numel(2, is), *iv = malloc((size_t)n * sizeof *iv);
    double *ref = malloc((size_t)n * sizeof *ref);
    for (int64_t p = 0; p < n; p++) {
        iv[p] = tu_randint(0, 257);
        ref[p] = xv[(p / 301) * 257 + iv[p]];
    }
    ct_tensor *idx = ints(iv, 2, is, CT_I64);
    poison(n * 4);
    ct_tensor *out = ct_gather(x, 1, idx);
    expect(out, 2, is, CT_F32, ref, true);
    ct_tensor *all[3] = {x, idx, out};
    release_all(3, all);
    free(xv);
    free(iv);
    free(ref);
    /* 0-d x and index: one element along dim 0 */
    ct_tensor *x0 = ct_tensor_scalar(2.5, CT_F64, CT_CPU);
    ct_tensor *i0 = ct_tensor_scalar(0, CT_I64, CT_CPU);
    ct_tensor *o0 = ct_gather(x0, -1, i0);
    double r0 = 2.5;
    expect(o0, 0, NULL, CT_F64, &r0, true);
    int64_t one = 1, three = 3, zeros[3] = {0, 0, 0};
    ct_tensor *i1 = ints(zeros, 1, &three, CT_I64); /* 1-d index into a 0-d x */
    ct_tensor *o1 = ct_gather(x0, 0, i1);
    double r1[3] = {2.5, 2.5, 2.5};
    expect(o1, 1, &three, CT_F64, r1, true);
    (void)one;
    ct_tensor *all0[5] = {x0, i0, o0, i1, o1};
    release_all(5, all0);
}

/* ---- scatter_add ------------------------------------------------------------------------- */

static void scatter_case(ct_dtype dt, int nd, int variant) {
    int64_t xs[4], is[4], ss[4];
    rand_shape(nd, 6, xs);
    int dim = (int)tu_randint(0, nd);
    for (int k = 0; k < nd; k++) {
        is[k] = k == dim ? tu_randint(0, 9) : tu_randint(1, xs[k] + 1);
        ss[k] = is[k] + (variant == 2 ? tu_randint(0, 3) : 0); /* src larger than index */
    }
    double *xv, *sv;
    ct_tensor *x = tu_rand(nd, xs, dt, lo_of(dt), hi_of(dt), &xv);
    ct_tensor *src = tu_rand(nd, ss, dt, lo_of(dt), hi_of(dt), &sv);
    int64_t n = tu_numel(nd, is), nx = tu_numel(nd, xs);
    int64_t *iv = malloc((size_t)(n + 1) * sizeof *iv);
    for (int64_t p = 0; p < n; p++) iv[p] = tu_randint(0, xs[dim]);
    ct_tensor *idx = ints(iv, nd, is, CT_I64);
    if (variant == 1) {
        x = nc_of(x);
        idx = nc_of(idx);
        src = nc_of(src);
    }
    /* Adds in row-major order of index, each rounded to the dtype: the
     * order the kernels promise (for one output element, increasing along dim). */
    int64_t c[4];
    for (int64_t p = 0; p < n; p++) {
        unravel(p, nd, is, c);
        double s = sv[offset_of(nd, ss, c)];
        c[dim] = iv[p];
        double *o = &xv[offset_of(nd, xs, c)];
        if (dt == CT_BOOL) *o = (*o != 0) || (s != 0);
        else *o = tu_round(*o + s, dt);
    }
    poison(nx * (int64_t)ct_dtype_size(dt));
    ct_tensor *out = ct_scatter_add(x, dim, idx, src);
    if (!out) fprintf(stderr, "scatter_add: %s\n", ct_last_error());
    expect(out, nd, xs, dt, xv, true);
    ct_tensor *all[4] = {x, idx, src, out};
    release_all(4, all);
    free(xv);
    free(sv);
    free(iv);
}

static void test_scatter_add(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int nd = 1; nd <= 4; nd++)
            for (int v = 0; v < 3; v++) scatter_case(tu_all_dtypes[t], nd, v);
}

/* Many indices onto few elements, across many lines (several tasks): every
 * element's sum in index order, whatever the thread count; x untouched. */
static void test_scatter_add_large(void **state) {
    (void)state;
    int64_t xs[2] = {3, 500}, is[2] = {400, 500};
    double *xv, *sv;
    ct_tensor *x = tu_rand(2, xs, CT_F32, -1, 1, &xv);
    ct_tensor *src = tu_rand(2, is, CT_F32, -1, 1, &sv);
    int64_t n = tu_numel(2, is), *iv = malloc((size_t)n * sizeof *iv);
    double *ref = malloc(sizeof(double) * 1500);
    memcpy(ref, xv, sizeof(double) * 1500);
    for (int64_t p = 0; p < n; p++) {
        iv[p] = tu_randint(0, 3);
        int64_t o = iv[p] * 500 + p % 500;
        ref[o] = (double)(float)(ref[o] + sv[p]);
    }
    ct_tensor *idx = ints(iv, 2, is, CT_I64);
    ct_tensor *out = ct_scatter_add(x, 0, idx, src);
    expect(out, 2, xs, CT_F32, ref, true);
    double *xafter = tu_values(x);
    tu_assert_close(xafter, xv, 1500, 0, 0);
    free(xafter);
    ct_tensor *all[4] = {x, idx, src, out};
    release_all(4, all);
    free(xv);
    free(sv);
    free(iv);
    free(ref);
}

/* ---- index_select ------------------------------------------------------------------------ */

static void index_select_case(ct_dtype dt, int nd, int variant, ct_dtype idt) {
    int64_t xs[4];
    rand_shape(nd, 7, xs);
    int dim = (int)tu_randint(0, nd);
    int64_t n = variant == 2 ? 0 : tu_randint(1, 12);
    bool idx0d = variant == 3;
    if (idx0d) n = 1;
    double *xv;
    ct_tensor *x = tu_rand(nd, xs, dt, lo_of(dt), hi_of(dt), &xv);
    int64_t iv[16];
    for (int64_t k = 0; k < n; k++) iv[k] = tu_randint(0, xs[dim]);
    ct_tensor *idx = ints(iv, idx0d ? 0 : 1, &n, idt);
    if (variant == 1) {
        x = nc_of(x);
        idx = nc_of(idx);
    }
    int64_t os[4];
    memcpy(os, xs, sizeof os);
    os[dim] = n;
    int64_t no = tu_numel(nd, os), c[4];
    double *ref = malloc((size_t)(no + 1) * sizeof *ref);
    for (int64_t p = 0; p < no; p++) {
        unravel(p, nd, os, c);
        c[dim] = iv[c[dim]];
        ref[p] = xv[offset_of(nd, xs, c)];
    }
    poison(no * (int64_t)ct_dtype_size(dt));
    ct_tensor *out = ct_index_select(x, variant == 0 ? dim - nd : dim, idx);
    if (!out) fprintf(stderr, "index_select: %s\n", ct_last_error());
    expect(out, nd, os, dt, ref, true);
    ct_tensor *all[3] = {x, idx, out};
    release_all(3, all);
    free(xv);
    free(ref);
}

static void test_index_select(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int nd = 1; nd <= 4; nd++)
            for (int v = 0; v < 4; v++)
                for (int i = 0; i < 2; i++)
                    index_select_case(tu_all_dtypes[t], nd, v, i ? CT_I32 : CT_I64);
    /* a 0-d x takes a one-element index and stays 0-d */
    ct_tensor *x = ct_tensor_scalar(-3, CT_I32, CT_CPU);
    int64_t one = 1, zero = 0;
    ct_tensor *idx = ints(&zero, 1, &one, CT_I64);
    ct_tensor *out = ct_index_select(x, 0, idx);
    double r = -3;
    expect(out, 0, NULL, CT_I32, &r, true);
    ct_tensor *all[3] = {x, idx, out};
    release_all(3, all);
}

/* ---- masked_fill ------------------------------------------------------------------------- */

static void masked_fill_case(ct_dtype dt, int variant) {
    int64_t xs[3], ms[3];
    rand_shape(3, 6, xs);
    int mnd = 3;
    memcpy(ms, xs, sizeof ms);
    if (variant == 1) ms[0] = ms[2] = 1;     /* mask broadcasts to x */
    if (variant == 2) { mnd = 1; ms[0] = xs[2]; } /* fewer dims */
    if (variant == 3) { xs[1] = 1; ms[1] = 4; }   /* x broadcasts to the mask */
    int64_t bs[3];
    for (int k = 0; k < 3; k++) bs[k] = xs[k] > 1 ? xs[k] : (mnd == 3 ? ms[k] : (k == 2 ? ms[0] : 1));
    double *xv, *mv;
    ct_tensor *x = tu_rand(3, xs, dt, lo_of(dt), hi_of(dt), &xv);
    ct_tensor *m = tu_rand(mnd, ms, CT_BOOL, 0, 1, &mv);
    if (variant == 4) {
        x = nc_of(x);
        m = nc_of(m);
    }
    double value = ct_dtype_is_floating(dt) ? (variant == 4 ? -INFINITY : -1.5) : 7;
    if (dt == CT_BOOL) value = 1;
    int64_t n = tu_numel(3, bs), c[3], cx[3], cm[3];
    double *ref = malloc((size_t)n * sizeof *ref);
    for (int64_t p = 0; p < n; p++) {
        unravel(p, 3, bs, c);
        for (int k = 0; k < 3; k++) cx[k] = xs[k] == 1 ? 0 : c[k];
        if (mnd == 3) {
            for (int k = 0; k < 3; k++) cm[k] = ms[k] == 1 ? 0 : c[k];
        } else {
            cm[0] = ms[0] == 1 ? 0 : c[2];
        }
        bool on = mv[offset_of(mnd, ms, cm)] != 0;
        ref[p] = on ? tu_round(value, dt) : xv[offset_of(3, xs, cx)];
    }
    ct_tensor *out = ct_masked_fill(x, m, value);
    if (!out) fprintf(stderr, "masked_fill: %s\n", ct_last_error());
    expect(out, 3, bs, dt, ref, true);
    ct_tensor *all[3] = {x, m, out};
    release_all(3, all);
    free(xv);
    free(mv);
    free(ref);
}

static void test_masked_fill(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int v = 0; v < 5; v++) masked_fill_case(tu_all_dtypes[t], v);
}

/* ---- repeat_interleave ------------------------------------------------------------------- */

static void repeat_case(ct_dtype dt, int nd, int64_t r, int variant) {
    int64_t xs[4];
    rand_shape(nd, 5, xs);
    int dim = (int)tu_randint(0, nd);
    if (variant == 2) xs[dim] = 1; /* the reshape could be a view */
    double *xv;
    ct_tensor *x = tu_rand(nd, xs, dt, lo_of(dt), hi_of(dt), &xv);
    if (variant == 1) x = nc_of(x);
    int64_t os[4], c[4];
    memcpy(os, xs, sizeof os);
    os[dim] = xs[dim] * r;
    int64_t n = tu_numel(nd, os);
    double *ref = malloc((size_t)(n + 1) * sizeof *ref);
    for (int64_t p = 0; p < n; p++) {
        unravel(p, nd, os, c);
        c[dim] /= r;
        ref[p] = xv[offset_of(nd, xs, c)];
    }
    ct_tensor *out = ct_repeat_interleave(x, r, variant == 3 ? dim - nd : dim);
    if (!out) fprintf(stderr, "repeat_interleave: %s\n", ct_last_error());
    expect(out, nd, os, dt, ref, true);
    /* the result owns its memory: writing it leaves x alone */
    if (n > 0) {
        assert_int_equal(ct_fill_(out, 1), CT_OK);
        double *after = tu_values(x);
        tu_assert_close(after, xv, tu_numel(nd, xs), 0, 0);
        free(after);
    }
    ct_tensor *all[2] = {x, out};
    release_all(2, all);
    free(xv);
    free(ref);
}

static void test_repeat_interleave(void **state) {
    (void)state;
    static const int64_t reps[] = {0, 1, 2, 3};
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int nd = 1; nd <= 4; nd++)
            for (int v = 0; v < 4; v++)
                for (int r = 0; r < 4; r++) repeat_case(tu_all_dtypes[t], nd, reps[r], v);
}

/* The grouped-query attention shape, an 8-d x (no dim left to expand
 * along) and a 0-d x. */
static void test_repeat_interleave_shapes(void **state) {
    (void)state;
    int64_t s[4] = {2, 3, 5, 4}, os[4] = {2, 6, 5, 4};
    double *xv;
    ct_tensor *x = tu_rand(4, s, CT_BF16, -2, 2, &xv);
    ct_tensor *out = ct_repeat_interleave(x, 2, 1);
    double ref[240];
    int64_t c[8];
    for (int64_t p = 0; p < 240; p++) {
        unravel(p, 4, os, c);
        c[1] /= 2;
        ref[p] = xv[offset_of(4, s, c)];
    }
    expect(out, 4, os, CT_BF16, ref, true);
    ct_tensor_release(out);
    ct_tensor_release(x);
    free(xv);

    int64_t s8[8] = {1, 2, 1, 1, 3, 1, 2, 1}, o8[8] = {1, 2, 1, 1, 3, 1, 2, 3};
    ct_tensor *x8 = tu_rand(8, s8, CT_F64, -2, 2, &xv);
    ct_tensor *out8 = ct_repeat_interleave(x8, 3, -1);
    double ref8[36];
    for (int64_t p = 0; p < 36; p++) ref8[p] = xv[p / 3];
    expect(out8, 8, o8, CT_F64, ref8, true);
    ct_tensor_release(out8);
    ct_tensor_release(x8);
    free(xv);

    ct_tensor *x0 = ct_tensor_scalar(4, CT_I64, CT_CPU);
    ct_tensor *o0 = ct_repeat_interleave(x0, 3, 0);
    int64_t three = 3;
    double r0[3] = {4, 4, 4};
    expect(o0, 1, &three, CT_I64, r0, true);
    ct_tensor_release(o0);
    ct_tensor_release(x0);
}

/* ---- split / chunk ----------------------------------------------------------------------- */

/* pieces[k] are views of x along dim with the given sizes: same values and
 * storage as x's slices. */
static void check_pieces(ct_tensor *x, int dim, int n, ct_tensor **pieces, const int64_t *sizes) {
    int64_t start = 0;
    for (int k = 0; k < n; k++) {
        assert_non_null(pieces[k]);
        assert_int_equal(ct_tensor_shape(pieces[k])[dim], sizes[k]);
        ct_tensor *ref = ct_narrow(x, dim, start, sizes[k]);
        assert_non_null(ref);
        assert_true(ct_tensor_data_ptr(ref) == ct_tensor_data_ptr(pieces[k]));
        int64_t m = ct_tensor_numel(ref);
        double *a = tu_values(ref), *b = tu_values(pieces[k]);
        tu_assert_close(b, a, m, 0, 0);
        free(a);
        free(b);
        ct_tensor_release(ref);
        start += sizes[k];
    }
    assert_int_equal(start, ct_tensor_shape(x)[dim]);
}

static void test_split_chunk(void **state) {
    (void)state;
    for (int it = 0; it < 30; it++) {
        ct_dtype dt = tu_all_dtypes[tu_randint(0, 7)];
        int nd = (int)tu_randint(1, 4);
        int64_t xs[3];
        rand_shape(nd, 9, xs);
        int dim = (int)tu_randint(0, nd);
        if (it % 7 == 0) xs[dim] = 0;
        ct_tensor *x = tu_rand(nd, xs, dt, -3, 3, NULL);
        if (it % 2) x = nc_of(x);
        int64_t size = xs[dim];
        ct_tensor *out[16];
        int64_t sizes[16];
        int n = -1;
        /* split */
        int64_t ss = size == 0 ? tu_randint(0, 3) : tu_randint(1, size + 2);
        int64_t want = size == 0 ? 1 : (size + ss - 1) / ss;
        assert_int_equal(ct_split(x, ss, dim, 0, NULL, &n), CT_OK);
        assert_int_equal(n, want);
        n = -1;
        assert_int_equal(ct_split(x, ss, dim - (it % 3 == 0 ? nd : 0), 16, out, &n), CT_OK);
        assert_int_equal(n, want);
        for (int k = 0; k < n; k++) sizes[k] = size - k * ss < ss ? size - k * ss : ss;
        check_pieces(x, dim, n, out, sizes);
        release_all(n, out);
        /* chunk, PyTorch's sizes: ceil(size / chunks) each */
        int64_t chunks = tu_randint(1, 8);
        assert_int_equal(ct_chunk(x, chunks, dim, 16, out, &n), CT_OK);
        if (size == 0) {
            assert_int_equal(n, chunks);
            for (int k = 0; k < n; k++) sizes[k] = 0;
        } else {
            int64_t each = (size + chunks - 1) / chunks;
            assert_int_equal(n, (size + each - 1) / each);
            for (int k = 0; k < n; k++) sizes[k] = size - k * each < each ? size - k * each : each;
        }
        check_pieces(x, dim, n, out, sizes);
        release_all(n, out);
        /* split_with_sizes: random sizes summing to size */
        int m = (int)tu_randint(1, 5);
        int64_t left = size;
        for (int k = 0; k < m; k++) {
            sizes[k] = k == m - 1 ? left : tu_randint(0, left + 1);
            left -= sizes[k];
        }
        assert_int_equal(ct_split_with_sizes(x, m, sizes, dim, out), CT_OK);
        check_pieces(x, dim, m, out, sizes);
        release_all(m, out);
        ct_tensor_release(x);
    }
    /* 6 in 4 chunks gives 3 of 2 (PyTorch), 5 in 4 gives 2, 2, 1 */
    int64_t six = 6, five = 5;
    ct_tensor *x6 = ct_tensor_arange(0, 6, 1, CT_F32, CT_CPU), *x5 = ct_tensor_zeros(1, &five, CT_F32, CT_CPU);
    ct_tensor *out[4];
    int n;
    assert_int_equal(ct_chunk(x6, 4, 0, 4, out, &n), CT_OK);
    assert_int_equal(n, 3);
    release_all(n, out);
    assert_int_equal(ct_chunk(x5, 4, 0, 4, out, &n), CT_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ct_tensor_shape(out[2])[0], 1);
    release_all(n, out);
    /* the pieces are views: a write through one reaches x */
    assert_int_equal(ct_split(x6, 4, 0, 4, out, &n), CT_OK);
    assert_int_equal(ct_fill_(out[1], -1), CT_OK);
    double *v = tu_values(x6);
    double want[6] = {0, 1, 2, 3, -1, -1};
    tu_assert_close(v, want, six, 0, 0);
    free(v);
    release_all(n, out);
    ct_tensor_release(x6);
    ct_tensor_release(x5);
}

/* ---- gradients ----------------------------------------------------------------------------- */

typedef struct gctx {
    int dim;
    int k; /* split/chunk: which piece */
    double value;
    int64_t r;
} gctx;

static ct_tensor *gc_gather(ct_tensor *const *in, void *v) {
    return ct_gather(in[0], ((gctx *)v)->dim, in[1]);
}
static ct_tensor *gc_scatter(ct_tensor *const *in, void *v) {
    return ct_scatter_add(in[0], ((gctx *)v)->dim, in[1], in[2]);
}
static ct_tensor *gc_index_select(ct_tensor *const *in, void *v) {
    return ct_index_select(in[0], ((gctx *)v)->dim, in[1]);
}
static ct_tensor *gc_masked_fill(ct_tensor *const *in, void *v) {
    return ct_masked_fill(in[0], in[1], ((gctx *)v)->value);
}
static ct_tensor *gc_repeat(ct_tensor *const *in, void *v) {
    return ct_repeat_interleave(in[0], ((gctx *)v)->r, ((gctx *)v)->dim);
}
/* piece k of chunk(x, 3, dim), times piece 0 summed (so two pieces carry gradient) */
static ct_tensor *gc_chunk(ct_tensor *const *in, void *v) {
    gctx *g = v;
    ct_tensor *out[3] = {NULL};
    int n = 0;
    if (ct_chunk(in[0], 3, g->dim, 3, out, &n) != CT_OK) return NULL;
    ct_tensor *s = ct_sum(out[0], 0, NULL, false);
    ct_tensor *r = ct_mul(out[g->k < n ? g->k : n - 1], s);
    ct_tensor_release(s);
    release_all(n, out);
    return r;
}

static ct_tensor *leaf64(int nd, const int64_t *s, bool nc) {
    ct_tensor *t = tu_rand(nd, s, CT_F64, -1, 1, NULL);
    if (nc) t = nc_of(t);
    assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

/* split_with_sizes(x, sizes, dim) put back together by cat, squared: in
 * order the pieces' gradients (cat's backward gives views of one tensor) lie
 * side by side and SplitBackward passes them on as one view; reversed they
 * do not and it cats them. */
typedef struct split_ctx {
    int n, dim;
    int64_t sizes[8];
    bool reversed;
} split_ctx;

static ct_tensor *gc_split_cat(ct_tensor *const *in, void *v) {
    split_ctx *c = v;
    ct_tensor *p[8] = {NULL}, *q[8] = {NULL};
    if (ct_split_with_sizes(in[0], c->n, c->sizes, c->dim, p) != CT_OK) return NULL;
    for (int k = 0; k < c->n; k++) q[k] = p[c->reversed ? c->n - 1 - k : k];
    ct_tensor *y = ct_cat(c->n, q, c->dim);
    ct_tensor *r = y ? ct_mul(y, y) : NULL;
    ct_tensor_release(y);
    release_all(c->n, p);
    return r;
}

/* Up to 4 pieces share one SplitBackward node, more keep a NarrowBackward
 * each; both give the gradient gradcheck finds. */
static void test_split_gradcheck(void **state) {
    (void)state;
    for (int n = 1; n <= 6; n++)
        for (int rev = 0; rev < 2; rev++) {
            int64_t xs[2] = {3, 0};
            split_ctx c = {.n = n, .dim = 1, .reversed = rev};
            for (int k = 0; k < n; k++) xs[1] += c.sizes[k] = tu_randint(rev ? 1 : 0, 3);
            ct_tensor *x = leaf64(2, xs, false);
            ct_tensor *p[8];
            assert_int_equal(ct_split_with_sizes(x, n, c.sizes, 1, p), CT_OK);
            assert_string_equal(ct_grad_fn_name(p[0]),
                                n <= 4 ? "SplitWithSizesBackward" : "NarrowBackward");
            release_all(n, p);
            char what[64];
            snprintf(what, sizeof what, "split %d pieces -> cat%s", n, rev ? " reversed" : "");
            gradcheck_ok(what, gc_split_cat, &c, 1, &x);
            ct_tensor_release(x);
        }
}

static void test_gradcheck(void **state) {
    (void)state;
    char what[128];
    for (int it = 0; it < 12; it++) {
        bool nc = it % 2;
        int nd = (int)tu_randint(1, 4);
        int64_t xs[3], is[3], ss[3];
        rand_shape(nd, 4, xs);
        gctx g = {.dim = (int)tu_randint(0, nd)};
        for (int k = 0; k < nd; k++) {
            is[k] = k == g.dim ? tu_randint(1, 6) : tu_randint(1, xs[k] + 1);
            ss[k] = is[k] + tu_randint(0, 2);
        }
        int64_t n = tu_numel(nd, is), iv[5 * 4 * 4]; /* dim up to 5, others up to 4 */
        for (int64_t p = 0; p < n; p++) iv[p] = tu_randint(0, xs[g.dim]); /* repeats likely */
        ct_tensor *idx = ints(iv, nd, is, CT_I64);
        if (nc) idx = nc_of(idx);

        ct_tensor *in[3] = {leaf64(nd, xs, nc), idx, NULL};
        snprintf(what, sizeof what, "gather it %d", it);
        gradcheck_ok(what, gc_gather, &g, 2, in);
        in[2] = leaf64(nd, ss, nc);
        snprintf(what, sizeof what, "scatter_add it %d", it);
        gradcheck_ok(what, gc_scatter, &g, 3, in);
        ct_tensor_release(in[2]);

        int64_t m = tu_randint(1, 7), sel[8];
        for (int64_t k = 0; k < m; k++) sel[k] = tu_randint(0, xs[g.dim]);
        ct_tensor *i1 = ints(sel, 1, &m, it % 3 ? CT_I64 : CT_I32);
        ct_tensor *in2[2] = {in[0], i1};
        snprintf(what, sizeof what, "index_select it %d", it);
        gradcheck_ok(what, gc_index_select, &g, 2, in2);
        ct_tensor_release(i1);

        ct_tensor *mask = tu_rand(1, &xs[nd - 1], CT_BOOL, 0, 1, NULL);
        ct_tensor *in3[2] = {in[0], mask};
        g.value = -2;
        snprintf(what, sizeof what, "masked_fill it %d", it);
        gradcheck_ok(what, gc_masked_fill, &g, 2, in3);
        ct_tensor_release(mask);

        g.r = tu_randint(1, 4);
        snprintf(what, sizeof what, "repeat_interleave it %d r %lld", it, (long long)g.r);
        gradcheck_ok(what, gc_repeat, &g, 1, in);

        g.k = (int)tu_randint(0, 3);
        snprintf(what, sizeof what, "chunk it %d piece %d", it, g.k);
        gradcheck_ok(what, gc_chunk, &g, 1, in);
        ct_tensor_release(in[0]);
        ct_tensor_release(idx);
    }
    /* 0-d x: one element along dim 0 */
    {
        ct_tensor *x0 = leaf64(0, NULL, false);
        int64_t three = 3, one = 1, zeros[3] = {0, 0, 0};
        ct_tensor *i3 = ints(zeros, 1, &three, CT_I64), *i1 = ints(zeros, 1, &one, CT_I32);
        gctx g0 = {.dim = 0};
        ct_tensor *a[2] = {x0, i3}, *b[2] = {x0, i1};
        gradcheck_ok("gather 0-d x", gc_gather, &g0, 2, a);
        gradcheck_ok("index_select 0-d x", gc_index_select, &g0, 2, b);
        g0.r = 2;
        gradcheck_ok("repeat_interleave 0-d x", gc_repeat, &g0, 1, a);
        ct_tensor *all[3] = {x0, i3, i1};
        release_all(3, all);
    }
    /* x broadcast by masked_fill: its gradient is summed back */
    int64_t xs[2] = {1, 4}, ms[2] = {3, 4};
    ct_tensor *x = leaf64(2, xs, false);
    ct_tensor *mask = tu_rand(2, ms, CT_BOOL, 0, 1, NULL);
    ct_tensor *in[2] = {x, mask};
    gctx g = {.value = 3};
    gradcheck_ok("masked_fill broadcast x", gc_masked_fill, &g, 2, in);
    release_all(2, in);
}

/* With a ones gradient, gather's and index_select's input gradients count
 * how often each element was taken; scatter_add's src gradient is the
 * gathered output gradient, zero where src reaches beyond index. */
static void test_grad_values(void **state) {
    (void)state;
    int64_t xs[2] = {2, 4}, is[2] = {2, 3};
    ct_tensor *x = leaf64(2, xs, false);
    int64_t iv[6] = {3, 3, 0, 1, 1, 1};
    ct_tensor *idx = ints(iv, 2, is, CT_I64);
    ct_tensor *y = ct_gather(x, 1, idx);
    backward_ones(y);
    double want[8] = {1, 0, 0, 2, 0, 3, 0, 0};
    check_values(ct_grad(x), want, 8, 0, 0);
    ct_tensor_release(y);

    ct_zero_grad(x);
    int64_t three = 3, sel[3] = {2, 0, 2};
    ct_tensor *i1 = ints(sel, 1, &three, CT_I32);
    y = ct_index_select(x, 1, i1);
    backward_ones(y);
    double want2[8] = {1, 0, 2, 0, 1, 0, 2, 0};
    check_values(ct_grad(x), want2, 8, 0, 0);
    ct_tensor_release(y);

    int64_t ss[2] = {3, 3};
    ct_tensor *src = leaf64(2, ss, false);
    ct_tensor *z = ct_scatter_add(x, 1, idx, src);
    double gv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ct_tensor *g = tu_from_f64(gv, 2, xs, CT_F64);
    assert_int_equal(ct_backward(z, g, false), CT_OK);
    double want3[9] = {4, 4, 1, 6, 6, 6, 0, 0, 0};
    check_values(ct_grad(src), want3, 9, 0, 0);
    ct_tensor *all[6] = {x, idx, i1, src, z, g};
    release_all(6, all);
}

/* ---- bad inputs ----------------------------------------------------------------------------- */

static void test_bad_inputs(void **state) {
    (void)state;
    int64_t xs[2] = {3, 5}, is[2] = {2, 2}, big[2] = {4, 2};
    ct_tensor *x = tu_rand(2, xs, CT_F32, -1, 1, NULL);
    int64_t iv[8] = {0, 7, 1, 2, 0, 0, 0, 0}, neg[4] = {0, 1, -1, 2};
    ct_tensor *bad = ints(iv, 2, is, CT_I64), *bneg = ints(neg, 2, is, CT_I64);
    ct_tensor *ok = ints((int64_t[]){0, 1, 2, 4}, 2, is, CT_I64);
    ct_tensor *i32 = ints(iv + 4, 2, is, CT_I32), *f = tu_rand(2, is, CT_F32, 0, 1, NULL);
    ct_tensor *tall = ints(iv, 2, big, CT_I64), *one = ints(iv, 1, is, CT_I64);

    /* gather */
    tu_assert_null_error(ct_gather(NULL, 1, ok), CT_ERR_INVALID_ARG, "ct_gather");
    tu_assert_null_error(ct_gather(x, 1, NULL), CT_ERR_INVALID_ARG, "ct_gather");
    tu_assert_null_error(ct_gather(x, 1, bad), CT_ERR_INDEX, "ct_gather", "index 7",
                         "dim 1", "size 5");
    tu_assert_null_error(ct_gather(x, 0, bneg), CT_ERR_INDEX, "ct_gather", "index -1",
                         "dim 0", "size 3");
    tu_assert_null_error(ct_gather(x, 1, i32), CT_ERR_DTYPE, "ct_gather", "int64", "int32");
    tu_assert_null_error(ct_gather(x, 1, f), CT_ERR_DTYPE, "ct_gather", "float32");
    tu_assert_null_error(ct_gather(x, 2, ok), CT_ERR_INDEX, "ct_gather", "dim 2");
    tu_assert_null_error(ct_gather(x, 1, tall), CT_ERR_SHAPE, "ct_gather", "[4, 2]", "dim 0",
                         "for every dim d but 1");
    tu_assert_null_error(ct_gather(x, 1, one), CT_ERR_SHAPE, "ct_gather", "as many dims");

    /* scatter_add */
    ct_tensor *src = tu_rand(2, is, CT_F32, -1, 1, NULL), *src64 = tu_rand(2, is, CT_F64, -1, 1, NULL);
    int64_t sm[2] = {2, 1};
    ct_tensor *small = tu_rand(2, sm, CT_F32, -1, 1, NULL);
    tu_assert_null_error(ct_scatter_add(x, 1, ok, NULL), CT_ERR_INVALID_ARG, "ct_scatter_add");
    tu_assert_null_error(ct_scatter_add(x, 1, bad, src), CT_ERR_INDEX, "ct_scatter_add",
                         "index 7", "dim 1", "size 5");
    tu_assert_null_error(ct_scatter_add(x, 1, ok, src64), CT_ERR_DTYPE, "ct_scatter_add",
                         "float64", "float32");
    tu_assert_null_error(ct_scatter_add(x, 1, ok, small), CT_ERR_SHAPE, "ct_scatter_add", "src",
                         "dim 1");
    tu_assert_null_error(ct_scatter_add(x, 1, i32, src), CT_ERR_DTYPE, "ct_scatter_add", "int64");
    tu_assert_null_error(ct_scatter_add(x, -3, ok, src), CT_ERR_INDEX, "ct_scatter_add", "dim -3");

    /* index_select */
    int64_t four = 4, sel[4] = {0, 2, 5, 1};
    ct_tensor *s1 = ints(sel, 1, &four, CT_I32);
    tu_assert_null_error(ct_index_select(x, 1, s1), CT_ERR_INDEX, "ct_index_select", "index 5",
                         "dim 1", "size 5");
    tu_assert_null_error(ct_index_select(x, 0, s1), CT_ERR_INDEX, "ct_index_select", "index 5",
                         "dim 0", "size 3", "0..2");
    tu_assert_null_error(ct_index_select(x, 1, ok), CT_ERR_SHAPE, "ct_index_select", "0-d or 1-d");
    tu_assert_null_error(ct_index_select(x, 1, f), CT_ERR_DTYPE, "ct_index_select", "float32");
    ct_tensor *x0 = ct_tensor_scalar(1, CT_F32, CT_CPU);
    tu_assert_null_error(ct_index_select(x0, 0, s1), CT_ERR_SHAPE, "ct_index_select", "one element");

    /* masked_fill */
    ct_tensor *mf = tu_rand(2, xs, CT_F32, 0, 1, NULL), *mb = tu_rand(2, is, CT_BOOL, 0, 1, NULL);
    ct_tensor *xi = tu_rand(2, xs, CT_I32, 0, 5, NULL);
    ct_tensor *mx = tu_rand(2, xs, CT_BOOL, 0, 1, NULL);
    tu_assert_null_error(ct_masked_fill(x, mf, 0), CT_ERR_DTYPE, "ct_masked_fill", "bool", "float32");
    tu_assert_null_error(ct_masked_fill(x, mb, 0), CT_ERR_SHAPE, "ct_masked_fill");
    tu_assert_null_error(ct_masked_fill(xi, mx, 1e10), CT_ERR_INVALID_ARG, "ct_masked_fill",
                         "int32", "overflow");
    tu_assert_null_error(ct_masked_fill(xi, mx, -INFINITY), CT_ERR_INVALID_ARG, "ct_masked_fill",
                         "int32");
    tu_assert_null_error(ct_masked_fill(NULL, mx, 0), CT_ERR_INVALID_ARG, "ct_masked_fill");

    /* repeat_interleave */
    tu_assert_null_error(ct_repeat_interleave(x, -1, 0), CT_ERR_INVALID_ARG,
                         "ct_repeat_interleave", "repeats", "-1");
    tu_assert_null_error(ct_repeat_interleave(x, 2, 2), CT_ERR_INDEX, "ct_repeat_interleave",
                         "dim 2");
    tu_assert_null_error(ct_repeat_interleave(x, INT64_MAX / 2, 1), CT_ERR_OVERFLOW,
                         "ct_repeat_interleave");
    tu_assert_null_error(ct_repeat_interleave(NULL, 2, 0), CT_ERR_INVALID_ARG,
                         "ct_repeat_interleave");

    /* split / chunk: failures write nothing */
    ct_tensor *out[2] = {NULL, NULL};
    int n = -7;
    tu_assert_error(ct_split(x, -1, 0, 2, out, &n), CT_ERR_INVALID_ARG, "ct_split", "split_size",
                    "-1");
    tu_assert_error(ct_split(x, 0, 0, 2, out, &n), CT_ERR_INVALID_ARG, "ct_split", "size 3");
    tu_assert_error(ct_split(x, 2, 1, 2, out, &n), CT_ERR_INVALID_ARG, "ct_split", "3 pieces",
                    "max_out 2");
    tu_assert_error(ct_split(x, 2, 1, 2, out, NULL), CT_ERR_INVALID_ARG, "ct_split", "n_out");
    tu_assert_error(ct_split(x0, 1, 0, 2, out, &n), CT_ERR_SHAPE, "ct_split", "1-d");
    tu_assert_error(ct_split(x, 1, 2, 2, out, &n), CT_ERR_INDEX, "ct_split", "dim 2");
    tu_assert_error(ct_chunk(x, 0, 0, 2, out, &n), CT_ERR_INVALID_ARG, "ct_chunk", "chunks", "0");
    tu_assert_error(ct_chunk(x, 5, 1, 2, out, &n), CT_ERR_INVALID_ARG, "ct_chunk", "max_out 2");
    tu_assert_error(ct_chunk(NULL, 5, 1, 2, out, &n), CT_ERR_INVALID_ARG, "ct_chunk", "NULL");
    tu_assert_error(ct_split_with_sizes(x, 2, (int64_t[]){2, 2}, 0, out), CT_ERR_SHAPE,
                    "ct_split_with_sizes", "[2, 2]", "size 3");
    tu_assert_error(ct_split_with_sizes(x, 2, (int64_t[]){4, -1}, 0, out), CT_ERR_SHAPE,
                    "ct_split_with_sizes", "size 3");
    tu_assert_error(ct_split_with_sizes(x, 0, (int64_t[]){3}, 0, out), CT_ERR_INVALID_ARG,
                    "ct_split_with_sizes", "n 0");
    assert_int_equal(n, -7);
    assert_null(out[0]);
    assert_null(out[1]);

    ct_tensor *all[19] = {x, bad, bneg, ok, i32, f, tall, one, src, src64, small, s1, x0, mf, mb,
                          xi, mx, NULL, NULL};
    release_all(17, all);
}

/* Every op's results belong to the scope open around it: ending the scope
 * leaves nothing alive (the fixture counts), whatever the op made inside. */
static void test_results_in_scope(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = tu_rand(CT_SHAPE(5, 6), CT_F32, -2, 2, NULL);
    ct_tensor *x0 = tu_rand(0, NULL, CT_F32, -2, 2, NULL);
    ct_tensor *idx = tu_rand(CT_SHAPE(3, 6), CT_I64, 0, 5, NULL);
    ct_tensor *src = tu_rand(CT_SHAPE(3, 6), CT_F32, -2, 2, NULL);
    ct_tensor *sel = tu_rand(CT_SHAPE(4), CT_I64, 0, 5, NULL);
    ct_tensor *mask = tu_rand(CT_SHAPE(6), CT_BOOL, 0, 1, NULL);
    ct_tensor *pieces[8];
    int n = 0;
    assert_non_null(ct_gather(x, 0, idx));
    assert_non_null(ct_scatter_add(x, 0, idx, src));
    assert_non_null(ct_index_select(x, 1, sel));
    assert_non_null(ct_masked_fill(x, mask, 3));
    assert_non_null(ct_repeat_interleave(x, 2, 0));
    assert_non_null(ct_repeat_interleave(x, 1, 1));
    assert_non_null(ct_repeat_interleave(x0, 3, 0));
    assert_int_equal(ct_chunk(x, 3, 1, 8, pieces, &n), CT_OK);
    assert_int_equal(ct_split(x, 2, 0, 8, pieces, &n), CT_OK);
    ct_scope_end(sc);
}

int main(void) {
    tu_seed();
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_gather),
        T(test_gather_large_and_0d),
        T(test_scatter_add),
        T(test_scatter_add_large),
        T(test_index_select),
        T(test_masked_fill),
        T(test_repeat_interleave),
        T(test_repeat_interleave_shapes),
        T(test_split_chunk),
        T(test_gradcheck),
        T(test_split_gradcheck),
        T(test_grad_values),
        T(test_bad_inputs),
        T(test_results_in_scope),
    };
#undef T
    return tu_run_tests(tests);
}
