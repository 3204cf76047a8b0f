/* The indexing and shape ops on the CPU: scatter, scatter_reduce, index_add,
 * index_put, take, masked_select, flip, roll, repeat, tile, unbind, diagonal,
 * diag, one_hot, pad, interpolate, unfold and fold against float64 reference
 * loops written here, on fresh random inputs (odd and size-1 dims) in every
 * dtype each op takes, contiguous and as non-contiguous views, into poisoned
 * memory; float64 gradient checks of each differentiable one; and bad input
 * with its status and message. */
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
 * next tensor of that size, which then starts out as 0xA5 bytes. */
static void poison(int64_t nbytes) {
    if (nbytes < 65536) nbytes = 65536;
    ct_tensor *t = ct_tensor_empty(1, &nbytes, CT_BOOL, CT_CPU);
    assert_non_null(t);
    memset(ct_tensor_data_ptr(t), 0xA5, (size_t)nbytes);
    ct_tensor_release(t);
}

static void rand_shape(int nd, int64_t hi, int64_t *s) {
    for (int k = 0; k < nd; k++) s[k] = tu_next() % 4 == 0 ? 1 : tu_randint(1, hi + 1);
}

static int64_t off_of(int nd, const int64_t *s, const int64_t *c) {
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

/* t (owned by the scope) made non-contiguous when nc. */
static ct_tensor *maybe_nc(ct_tensor *t, bool nc) {
    assert_non_null(t);
    return nc ? tu_noncontig(t) : t;
}

static ct_tensor *ints(const int64_t *vals, int nd, const int64_t *shape) {
    int64_t n = tu_numel(nd, shape);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)vals[i];
    ct_tensor *t = tu_from_f64(v, nd, shape, CT_I64);
    free(v);
    assert_non_null(t);
    return t;
}

static double lo_of(ct_dtype dt) { return ct_dtype_is_floating(dt) ? -4 : -20; }
static double hi_of(ct_dtype dt) { return ct_dtype_is_floating(dt) ? 4 : 20; }

/* got's values against ref (exactly for copies, else within the dtype's
 * tolerance, scaled by tol). */
static void expect(const ct_tensor *got, int nd, const int64_t *shape, ct_dtype dt,
                   const double *ref, double tol) {
    if (!got) fprintf(stderr, "call failed: %s\n", ct_last_error());
    check_shape(got, nd, shape);
    assert_int_equal(ct_tensor_dtype(got), dt);
    int64_t n = tu_numel(nd, shape);
    double *g = tu_values(got);
    tu_assert_close(g, ref, n, tol * tu_rtol(dt), tol * tu_rtol(dt));
    free(g);
}

static double round_to(double v, ct_dtype dt) {
    switch (dt) {
    case CT_I32: return (double)(int32_t)(uint32_t)(int64_t)v;
    case CT_BOOL: return v != 0;
    default: return tu_round(v, dt);
    }
}

/* index_put's reference at one position: v written, or added (rounded to dt) with acc. */
static void put_ref(double *o, double v, bool acc, ct_dtype dt) {
    *o = acc ? round_to(*o + v, dt) : v;
}

/* ---- scatter, scatter_reduce ---------------------------------------------------------- */

enum { R_ASSIGN, R_SUM, R_MEAN, R_AMAX, R_AMIN, R_PROD };
static const char *rname[] = {"none", "sum", "mean", "amax", "amin", "prod"};

static void scatter_case(ct_dtype dt, int nd, int r, bool include_self, bool nc, bool value) {
    ct_scope *sc = ct_scope_begin();
    int64_t xs[4], is[4], ss[4];
    rand_shape(nd, 6, xs);
    int dim = (int)tu_randint(0, nd);
    for (int k = 0; k < nd; k++) {
        is[k] = k == dim ? tu_randint(0, 9) : tu_randint(1, xs[k] + 1);
        ss[k] = is[k] + tu_randint(0, 2);
    }
    double *xv, *sv, *iv;
    /* products of up to 9 factors: small floats (float16 would overflow); int32 wraps */
    bool flt = ct_dtype_is_floating(dt);
    double lo = r == R_PROD && flt ? -1.5 : lo_of(dt), hi = r == R_PROD && flt ? 1.5 : hi_of(dt);
    ct_tensor *x = maybe_nc(tu_rand(nd, xs, dt, lo, hi, &xv), nc);
    ct_tensor *src = maybe_nc(tu_rand(nd, ss, dt, lo, hi, &sv), nc);
    ct_tensor *idx = maybe_nc(tu_rand(nd, is, CT_I64, 0, (double)xs[dim], &iv), nc);
    int64_t n = tu_numel(nd, xs), m = tu_numel(nd, is);
    double *ref = malloc(sizeof(double) * (size_t)(n + 1));
    double *cnt = calloc((size_t)(n + 1), sizeof(double));
    bool *hit = calloc((size_t)(n + 1), 1);
    double val = ct_dtype_is_floating(dt) ? -1.5 : dt == CT_BOOL ? 1 : 7;
    memcpy(ref, xv, sizeof(double) * (size_t)n);
    int64_t c[4];
    for (int64_t p = 0; p < m; p++) {
        unravel(p, nd, is, c);
        double s = value ? val : sv[off_of(nd, ss, c)];
        c[dim] = (int64_t)iv[p];
        int64_t o = off_of(nd, xs, c);
        if (r == R_ASSIGN) {
            ref[o] = s;
            continue;
        }
        if (!hit[o] && !include_self) {
            ref[o] = s;
            cnt[o] = 1;
        } else if (r == R_PROD) {
            if (dt == CT_BOOL) ref[o] = ref[o] != 0 && s != 0;
            else if (!flt) { /* two's complement wrap, as the kernels */
                uint64_t q = (uint64_t)(int64_t)ref[o] * (uint64_t)(int64_t)s;
                ref[o] = dt == CT_I32 ? (double)(int32_t)(uint32_t)q : (double)(int64_t)q;
            } else ref[o] = round_to(ref[o] * s, dt);
        } else if (r == R_SUM || r == R_MEAN) {
            ref[o] = round_to(ref[o] + s, r == R_SUM ? dt : CT_F64);
            if (dt == CT_BOOL) ref[o] = ref[o] != 0;
            cnt[o] += !hit[o] ? 2 : 1;
        } else {
            ref[o] = r == R_AMAX ? (s > ref[o] ? s : ref[o]) : (s < ref[o] ? s : ref[o]);
        }
        hit[o] = true;
    }
    if (r == R_MEAN)
        for (int64_t o = 0; o < n; o++) {
            if (!hit[o]) continue;
            double q = ref[o] / cnt[o];
            ref[o] = ct_dtype_is_floating(dt) ? q : floor(q);
        }
    poison(n * 8);
    ct_tensor *out = r == R_ASSIGN ? (value ? ct_scatter_value(x, dim, idx, val)
                                            : ct_scatter(x, dim - (nc ? nd : 0), idx, src))
                                   : ct_scatter_reduce(x, dim, idx, src, rname[r], include_self);
    double tol = r == R_ASSIGN || r == R_AMAX || r == R_AMIN ? 0 : 4;
    expect(out, nd, xs, dt, ref, tol);
    free(xv), free(sv), free(iv), free(ref), free(cnt), free(hit);
    ct_scope_end(sc);
}

static void test_scatter(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int nd = 1; nd <= 3; nd++)
            for (int v = 0; v < 4; v++) scatter_case(tu_all_dtypes[t], nd, R_ASSIGN, true, v & 1, v & 2);
}

static void test_scatter_reduce(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int r = R_SUM; r <= R_PROD; r++) {
            ct_dtype dt = tu_all_dtypes[t];
            if (dt == CT_BOOL && (r == R_SUM || r == R_MEAN)) continue;
            for (int nd = 1; nd <= 3; nd++)
                for (int v = 0; v < 4; v++) scatter_case(dt, nd, r, v & 2, v & 1, false);
        }
}

/* scatter_reduce "prod" where factors are 0, against the float64 products of the other
 * factors: x [2, 4] and src [2, 3] along dim 1 with index rows {1, 1, 3} and {0, 2, 2}:
 * position (0, 1) gets a lone zero of src, (1, 2) two zeros of src, (0, 3) and (1, 0) a
 * zero of x; both include_self settings. */
static void test_scatter_reduce_prod_zeros(void **state) {
    (void)state;
    const double xv[8] = {1.5, -2, 3, 0, 0, 0.5, -1.25, 2};
    const double sv[6] = {0, 2.5, -3, 4, 0, 0};
    const int64_t iv[6] = {1, 1, 3, 0, 2, 2}, xs[2] = {2, 4}, ss[2] = {2, 3};
    const double gv[8] = {0.3, -0.7, 1.1, 0.9, -0.2, 0.4, 0.6, -1.3};
    for (int self = 0; self < 2; self++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *x = tu_from_f64(xv, 2, xs, CT_F64), *src = tu_from_f64(sv, 2, ss, CT_F64);
        ct_tensor *idx = ints(iv, 2, ss), *g = tu_from_f64(gv, 2, xs, CT_F64);
        assert_int_equal(ct_requires_grad_(x, true), CT_OK);
        assert_int_equal(ct_requires_grad_(src, true), CT_OK);
        ct_tensor *y = ct_scatter_reduce(x, 1, idx, src, "prod", self);
        assert_non_null(y);
        assert_int_equal(ct_backward(y, g, false), CT_OK);
        /* references: the factors of each position, then each factor's others */
        double wx[8], ws[6];
        for (int p = 0; p < 8; p++) {
            int row = p / 4, col = p % 4;
            bool hit = false;
            for (int k = 0; k < 3; k++) hit |= iv[row * 3 + k] == col;
            if (hit && !self) {
                wx[p] = 0; /* x is not a factor */
                continue;
            }
            double others = 1;
            for (int k = 0; k < 3; k++)
                if (iv[row * 3 + k] == col) others *= sv[row * 3 + k];
            wx[p] = gv[p] * others;
        }
        for (int q = 0; q < 6; q++) {
            int row = q / 3, col = (int)iv[q];
            double others = self ? xv[row * 4 + col] : 1;
            for (int k = 0; k < 3; k++)
                if (k != q % 3 && iv[row * 3 + k] == col) others *= sv[row * 3 + k];
            ws[q] = gv[row * 4 + col] * others;
        }
        double *gx = tu_values(ct_grad(x)), *gs = tu_values(ct_grad(src));
        for (int p = 0; p < 8; p++) assert_true(fabs(gx[p] - wx[p]) <= 1e-12);
        for (int q = 0; q < 6; q++) {
            if (fabs(gs[q] - ws[q]) > 1e-12)
                fprintf(stderr, "include_self %d: src grad %d is %g, expected %g\n", self, q, gs[q],
                        ws[q]);
            assert_true(fabs(gs[q] - ws[q]) <= 1e-12);
        }
        free(gx), free(gs);
        ct_scope_end(sc);
    }
}

/* ---- index_add, index_put, take, masked_select ------------------------------------------ */

static void test_index_add(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++) {
        ct_dtype dt = tu_all_dtypes[t];
        if (dt == CT_BOOL) continue;
        for (int it = 0; it < 6; it++) {
            ct_scope *sc = ct_scope_begin();
            int nd = (int)tu_randint(1, 4);
            int64_t xs[3], ss[3];
            rand_shape(nd, 5, xs);
            int dim = (int)tu_randint(0, nd);
            memcpy(ss, xs, sizeof xs);
            ss[dim] = tu_randint(0, 7);
            double *xv, *sv, *iv;
            ct_tensor *x = maybe_nc(tu_rand(nd, xs, dt, lo_of(dt), hi_of(dt), &xv), it & 1);
            ct_tensor *s = maybe_nc(tu_rand(nd, ss, dt, lo_of(dt), hi_of(dt), &sv), it & 1);
            ct_tensor *idx = tu_rand(1, &ss[dim], CT_I64, 0, (double)xs[dim], &iv);
            double alpha = ct_dtype_is_floating(dt) ? 0.5 : 3;
            int64_t n = tu_numel(nd, xs), m = tu_numel(nd, ss), c[3];
            double *ref = malloc(sizeof(double) * (size_t)n);
            memcpy(ref, xv, sizeof(double) * (size_t)n);
            for (int64_t p = 0; p < m; p++) {
                unravel(p, nd, ss, c);
                double v = sv[p] * alpha;
                c[dim] = (int64_t)iv[c[dim]];
                int64_t o = off_of(nd, xs, c);
                ref[o] = round_to(ref[o] + round_to(v, dt), dt);
            }
            poison(n * 8);
            expect(ct_index_add(x, dim, idx, s, alpha), nd, xs, dt, ref, 4);
            free(xv), free(sv), free(iv), free(ref);
            ct_scope_end(sc);
        }
    }
}

/* x [4, 5, 3] at indices a [2, 1] and b [3] (negatives among them),
 * broadcast to [2, 3]; values [3, 3] broadcast to [2, 3, 3]. */
static void test_index_put(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int acc = 0; acc < 2; acc++) {
            ct_dtype dt = tu_all_dtypes[t];
            if (acc && dt == CT_BOOL) continue;
            ct_scope *sc = ct_scope_begin();
            int64_t xs[3] = {4, 5, 3}, as[2] = {2, 1}, bsz = 3, vs[2] = {3, 3};
            double *xv, *vv;
            ct_tensor *x = maybe_nc(tu_rand(3, xs, dt, lo_of(dt), hi_of(dt), &xv), acc);
            ct_tensor *v = tu_rand(2, vs, dt, lo_of(dt), hi_of(dt), &vv);
            int64_t av[2] = {tu_randint(-4, 4), tu_randint(-4, 4)};
            int64_t bv[3] = {tu_randint(-5, 5), tu_randint(-5, 5), tu_randint(-5, 5)};
            ct_tensor *ind[2] = {ints(av, 2, as), ints(bv, 1, &bsz)};
            double *ref = malloc(sizeof(double) * 60);
            memcpy(ref, xv, sizeof(double) * 60);
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++) {
                    int64_t a = av[i] < 0 ? av[i] + 4 : av[i], b = bv[j] < 0 ? bv[j] + 5 : bv[j];
                    for (int k = 0; k < 3; k++) {
                        put_ref(&ref[(a * 5 + b) * 3 + k], vv[j * 3 + k], acc, dt);
                    }
                }
            poison(60 * 8);
            expect(ct_index_put(x, 2, ind, v, acc), 3, xs, dt, ref, 4);
            free(xv), free(vv), free(ref);
            ct_scope_end(sc);
        }
}

/* index_put with PyTorch's slices (NULL) and bool masks, x [4, 5, 3]:
 *   A (NULL, b [2])          -> indexed [4, 2, 3], values [2, 3]
 *   B (a [2], NULL, c [2])   -> apart: broadcast first, indexed [2, 5], values [2, 5]
 *   C (mask [4, 5])          -> indexed [m, 3], values [3]
 *   D (NULL, mask [5, 3])    -> indexed [4, m], values [4, 1]
 *   E (NULL)                 -> x[:] = values [5, 3]
 * Without accumulate the positions are distinct (the last write would win). */
static void test_index_put_slices_masks(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int acc = 0; acc < 2; acc++) {
            ct_dtype dt = tu_all_dtypes[t];
            if (acc && dt == CT_BOOL) continue;
            ct_scope *sc = ct_scope_begin();
            int64_t xs[3] = {4, 5, 3}, two = 2;
            double *xv, *vv, *mv, ref[60];
            ct_tensor *x = maybe_nc(tu_rand(3, xs, dt, lo_of(dt), hi_of(dt), &xv), acc);
            /* A: b distinct without accumulate, repeated with it */
            int64_t bv[2] = {tu_randint(0, 2), tu_randint(3, 4)};
            if (acc) bv[1] = bv[0] - 5; /* the same column, counted from the end */
            ct_tensor *v = tu_rand(2, (int64_t[]){2, 3}, dt, lo_of(dt), hi_of(dt), &vv);
            ct_tensor *ia[2] = {NULL, ints(bv, 1, &two)};
            memcpy(ref, xv, sizeof ref);
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 2; j++)
                    for (int k = 0; k < 3; k++) {
                        int64_t b = bv[j] < 0 ? bv[j] + 5 : bv[j];
                        put_ref(&ref[(i * 5 + b) * 3 + k], vv[j * 3 + k], acc, dt);
                    }
            poison(60 * 8);
            expect(ct_index_put(x, 2, ia, v, acc), 3, xs, dt, ref, 4);
            free(vv);
            /* B: a and c apart, so the indexed shape is [2, 5] */
            int64_t av[2] = {tu_randint(0, 1), tu_randint(2, 3)}, cv[2] = {tu_randint(0, 2), -1};
            v = tu_rand(2, (int64_t[]){2, 5}, dt, lo_of(dt), hi_of(dt), &vv);
            ct_tensor *ib[3] = {ints(av, 1, &two), NULL, ints(cv, 1, &two)};
            memcpy(ref, xv, sizeof ref);
            for (int p = 0; p < 2; p++)
                for (int j = 0; j < 5; j++) {
                    int64_t c = cv[p] < 0 ? cv[p] + 3 : cv[p];
                    put_ref(&ref[(av[p] * 5 + j) * 3 + c], vv[p * 5 + j], acc, dt);
                }
            poison(60 * 8);
            expect(ct_index_put(x, 3, ib, v, acc), 3, xs, dt, ref, 4);
            free(vv);
            /* C: a mask of the two leading dims */
            ct_tensor *mask = tu_rand(2, (int64_t[]){4, 5}, CT_BOOL, 0, 1, &mv);
            v = tu_rand(1, (int64_t[]){3}, dt, lo_of(dt), hi_of(dt), &vv);
            memcpy(ref, xv, sizeof ref);
            for (int p = 0; p < 20; p++)
                for (int k = 0; k < 3 && mv[p] != 0; k++)
                    put_ref(&ref[p * 3 + k], vv[k], acc, dt);
            poison(60 * 8);
            expect(ct_index_put(x, 1, &mask, v, acc), 3, xs, dt, ref, 4);
            free(vv), free(mv);
            /* D: a slice, then a mask of the last two dims */
            ct_tensor *m2 = tu_rand(2, (int64_t[]){5, 3}, CT_BOOL, 0, 1, &mv);
            v = tu_rand(2, (int64_t[]){4, 1}, dt, lo_of(dt), hi_of(dt), &vv);
            ct_tensor *id[2] = {NULL, m2};
            memcpy(ref, xv, sizeof ref);
            for (int i = 0; i < 4; i++)
                for (int p = 0; p < 15; p++)
                    if (mv[p] != 0) put_ref(&ref[i * 15 + p], vv[i], acc, dt);
            poison(60 * 8);
            expect(ct_index_put(x, 2, id, v, acc), 3, xs, dt, ref, 4);
            free(vv), free(mv);
            /* E: the whole of x */
            v = tu_rand(2, (int64_t[]){5, 3}, dt, lo_of(dt), hi_of(dt), &vv);
            ct_tensor *ie[1] = {NULL};
            memcpy(ref, xv, sizeof ref);
            for (int p = 0; p < 60; p++) put_ref(&ref[p], vv[p % 15], acc, dt);
            poison(60 * 8);
            expect(ct_index_put(x, 1, ie, v, acc), 3, xs, dt, ref, 4);
            free(vv), free(xv);
            ct_scope_end(sc);
        }
}

static void test_index_put_slices_masks_errors(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    int64_t xs[3] = {4, 5, 3}, two = 2;
    ct_tensor *x = tu_rand(3, xs, CT_F32, -1, 1, NULL);
    ct_tensor *v = tu_rand(1, (int64_t[]){1}, CT_F32, -1, 1, NULL);
    ct_tensor *bad = tu_rand(2, (int64_t[]){4, 4}, CT_BOOL, 0, 1, NULL);
    tu_assert_null_error(ct_index_put(x, 1, &bad, v, false), CT_ERR_SHAPE, "ct_index_put",
                         "shape of the mask", "does not match", "index 1");
    ct_tensor *m2 = tu_rand(2, (int64_t[]){3, 1}, CT_BOOL, 0, 1, NULL);
    ct_tensor *late[3] = {NULL, NULL, m2};
    tu_assert_null_error(ct_index_put(x, 3, late, v, false), CT_ERR_INDEX, "ct_index_put",
                         "too many indices");
    ct_tensor *m0 = ct_tensor_full(0, NULL, 1, CT_BOOL, CT_CPU);
    tu_assert_null_error(ct_index_put(x, 1, &m0, v, false), CT_ERR_SHAPE, "ct_index_put", "0-d");
    ct_tensor *i32[2] = {NULL, ct_to_dtype(ints((int64_t[]){0, 1}, 1, &two), CT_I32)};
    tu_assert_null_error(ct_index_put(x, 2, i32, v, false), CT_ERR_DTYPE, "ct_index_put",
                         "int64", "int32");
    ct_tensor *oob[2] = {NULL, ints((int64_t[]){0, 5}, 1, &two)};
    tu_assert_null_error(ct_index_put(x, 2, oob, v, false), CT_ERR_INDEX, "ct_index_put",
                         "index 5");
    ct_tensor *vbig = tu_rand(2, (int64_t[]){3, 3}, CT_F32, -1, 1, NULL);
    ct_tensor *sl[2] = {NULL, ints((int64_t[]){0, 1}, 1, &two)};
    tu_assert_null_error(ct_index_put(x, 2, sl, vbig, false), CT_ERR_SHAPE, "ct_index_put",
                         "broadcast", "[4, 2, 3]");
    ct_scope_end(sc);
}

static void test_take_masked_select(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int nc = 0; nc < 2; nc++) {
            ct_dtype dt = tu_all_dtypes[t];
            ct_scope *sc = ct_scope_begin();
            int64_t xs[3] = {3, 1, 5}, is[2] = {4, 6}, ms[2] = {4, 5}, bs[3] = {3, 4, 5};
            double *xv, *iv, *mv;
            ct_tensor *x = maybe_nc(tu_rand(3, xs, dt, lo_of(dt), hi_of(dt), &xv), nc);
            ct_tensor *idx = maybe_nc(tu_rand(2, is, CT_I64, -15, 15, &iv), nc);
            double ref[60];
            for (int k = 0; k < 24; k++) ref[k] = xv[(int64_t)iv[k] < 0 ? (int64_t)iv[k] + 15 : (int64_t)iv[k]];
            expect(ct_take(x, idx), 2, is, dt, ref, 0);
            /* masked_select: x [3, 1, 5] and mask [4, 5] broadcast to [3, 4, 5] */
            ct_tensor *mask = maybe_nc(tu_rand(2, ms, CT_BOOL, 0, 1, &mv), nc);
            int64_t m = 0, c[3];
            for (int64_t p = 0; p < 60; p++) {
                unravel(p, 3, bs, c);
                if (mv[c[1] * 5 + c[2]] != 0) ref[m++] = xv[c[0] * 5 + c[2]];
            }
            expect(ct_masked_select(x, mask), 1, &m, dt, ref, 0);
            free(xv), free(iv), free(mv);
            ct_scope_end(sc);
        }
}

/* ---- flip, roll, repeat, tile, pad ----------------------------------------------------- */

/* ref[o] for output shape os = x[src coordinates], or fill where map gives -1. */
typedef int64_t (*coord_fn)(int k, int64_t o, const void *ctx);

static double *remap_ref(int nd, const int64_t *xs, const double *xv, const int64_t *os,
                         coord_fn f, const void *ctx, double fill) {
    int64_t n = tu_numel(nd, os), c[8], ic[8];
    double *ref = malloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t p = 0; p < n; p++) {
        unravel(p, nd, os, c);
        bool in = true;
        for (int k = 0; k < nd; k++) {
            ic[k] = f(k, c[k], ctx);
            in = in && ic[k] >= 0 && ic[k] < xs[k];
        }
        ref[p] = in ? xv[off_of(nd, xs, ic)] : fill;
    }
    return ref;
}

typedef struct rctx {
    const int64_t *xs;
    int64_t a[8];
    bool flip[8];
    int mode;
} rctx;

static int64_t flip_roll_coord(int k, int64_t o, const void *v) {
    const rctx *r = v;
    if (r->flip[k]) return r->xs[k] - 1 - o;
    int64_t n = r->xs[k];
    return ((o - r->a[k]) % n + n) % n;
}

static int64_t repeat_coord(int k, int64_t o, const void *v) {
    const rctx *r = v;
    return o % r->xs[k];
}

static void test_flip_roll_repeat(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int it = 0; it < 8; it++) {
            ct_dtype dt = tu_all_dtypes[t];
            ct_scope *sc = ct_scope_begin();
            int nd = (int)tu_randint(1, 5);
            int64_t xs[4];
            rand_shape(nd, 6, xs);
            double *xv;
            ct_tensor *x = maybe_nc(tu_rand(nd, xs, dt, lo_of(dt), hi_of(dt), &xv), it & 1);
            rctx r = {.xs = xs};
            int64_t dims[4], shifts[4];
            int nf = 0;
            for (int k = 0; k < nd; k++)
                if (tu_next() % 2) {
                    dims[nf++] = k - (it & 2 ? nd : 0);
                    r.flip[k] = true;
                }
            double *ref = remap_ref(nd, xs, xv, xs, flip_roll_coord, &r, 0);
            poison(tu_numel(nd, xs) * 8);
            expect(ct_flip(x, nf, dims), nd, xs, dt, ref, 0);
            free(ref);
            memset(r.flip, 0, sizeof r.flip);
            int nr = 0;
            for (int k = 0; k < nd; k++)
                if (tu_next() % 2) {
                    dims[nr] = k;
                    shifts[nr] = tu_randint(-9, 10);
                    r.a[k] += shifts[nr++];
                }
            ref = remap_ref(nd, xs, xv, xs, flip_roll_coord, &r, 0);
            if (nr > 0) expect(ct_roll(x, nr, shifts, nr, dims), nd, xs, dt, ref, 0);
            free(ref);
            /* roll without dims: the flattened tensor */
            int64_t n = tu_numel(nd, xs), s1 = tu_randint(-20, 20);
            ref = malloc(sizeof(double) * (size_t)n);
            for (int64_t p = 0; p < n; p++) ref[p] = xv[((p - s1) % n + n) % n];
            expect(ct_roll(x, 1, &s1, 0, NULL), nd, xs, dt, ref, 0);
            free(ref);
            /* repeat with one more leading dim, and tile with fewer reps */
            int64_t reps[5], os[5], xs1[5];
            reps[0] = tu_randint(1, 3), os[0] = reps[0], xs1[0] = 1;
            for (int k = 0; k < nd; k++) {
                reps[k + 1] = tu_randint(0, 4);
                xs1[k + 1] = xs[k];
                os[k + 1] = xs[k] * reps[k + 1];
            }
            r.xs = xs1;
            ref = remap_ref(nd + 1, xs1, xv, os, repeat_coord, &r, 0);
            expect(ct_repeat(x, nd + 1, reps), nd + 1, os, dt, ref, 0);
            free(ref);
            for (int k = 0; k < nd; k++) os[k] = k == nd - 1 ? xs[k] * reps[nd] : xs[k];
            r.xs = xs;
            ref = remap_ref(nd, xs, xv, os, repeat_coord, &r, 0);
            expect(ct_tile(x, 1, &reps[nd]), nd, os, dt, ref, 0);
            free(ref);
            free(xv);
            ct_scope_end(sc);
        }
}

typedef struct pctx {
    int mode, nd, np;
    const int64_t *xs, *pad;
} pctx;

/* An independent reading of F.pad: reflect bounces step by step. */
static int64_t pad_coord(int k, int64_t o, const void *v) {
    const pctx *p = v;
    int j = p->nd - 1 - k;
    if (j >= p->np) return o;
    int64_t n = p->xs[k], i = o - p->pad[2 * j];
    switch (p->mode) {
    case CT_PAD_CONSTANT: return i >= 0 && i < n ? i : -1;
    case CT_PAD_REPLICATE: return i < 0 ? 0 : i >= n ? n - 1 : i;
    case CT_PAD_CIRCULAR: return ((i % n) + n) % n;
    default:
        while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
        return i;
    }
}

static void test_pad(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int mode = 0; mode < 4; mode++)
            for (int it = 0; it < 6; it++) {
                ct_dtype dt = tu_all_dtypes[t];
                ct_scope *sc = ct_scope_begin();
                int np = (int)tu_randint(1, 4), nd = np + (int)tu_randint(1, 3);
                int64_t xs[5], os[5], pad[6];
                for (int k = 0; k < nd; k++) xs[k] = tu_randint(2, 6);
                memcpy(os, xs, sizeof os);
                for (int j = 0; j < np; j++) {
                    int64_t n = xs[nd - 1 - j];
                    for (int e = 0; e < 2; e++)
                        pad[2 * j + e] = mode == CT_PAD_CONSTANT   ? tu_randint(-1, 4)
                                         : mode == CT_PAD_REFLECT  ? tu_randint(0, n)
                                         : mode == CT_PAD_CIRCULAR ? tu_randint(0, n + 1)
                                                                   : tu_randint(0, 5);
                    os[nd - 1 - j] = n + pad[2 * j] + pad[2 * j + 1];
                }
                double *xv;
                ct_tensor *x = maybe_nc(tu_rand(nd, xs, dt, lo_of(dt), hi_of(dt), &xv), it & 1);
                pctx p = {.mode = mode, .nd = nd, .np = np, .xs = xs, .pad = pad};
                double fill = dt == CT_BOOL ? 1 : ct_dtype_is_floating(dt) ? 2.5 : -3;
                double *ref = remap_ref(nd, xs, xv, os, pad_coord, &p, fill);
                poison(tu_numel(nd, os) * 8);
                expect(ct_pad(x, 2 * np, pad, (ct_pad_mode)mode, fill), nd, os, dt, ref, 0);
                free(ref), free(xv);
                ct_scope_end(sc);
            }
}

/* A large contiguous pad, flip and roll (several tasks, the memcpy rows). */
static void test_large_copies(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    int64_t xs[2] = {300, 517}, os[2] = {303, 522}, pad[4] = {2, 3, 1, 2};
    double *xv;
    ct_tensor *x = tu_rand(2, xs, CT_F32, -1, 1, &xv);
    pctx p = {.mode = CT_PAD_CONSTANT, .nd = 2, .np = 2, .xs = xs, .pad = pad};
    double *ref = remap_ref(2, xs, xv, os, pad_coord, &p, 0);
    expect(ct_pad(x, 4, pad, CT_PAD_CONSTANT, 0), 2, os, CT_F32, ref, 0);
    free(ref);
    rctx r = {.xs = xs, .a = {7, -100}, .flip = {false, false}};
    ref = remap_ref(2, xs, xv, xs, flip_roll_coord, &r, 0);
    expect(ct_roll(x, 2, (int64_t[]){7, -100}, 2, (int64_t[]){0, 1}), 2, xs, CT_F32, ref, 0);
    free(ref);
    r = (rctx){.xs = xs, .flip = {false, true}};
    ref = remap_ref(2, xs, xv, xs, flip_roll_coord, &r, 0);
    expect(ct_flip(x, 1, (int64_t[]){1}), 2, xs, CT_F32, ref, 0);
    free(ref), free(xv);
    ct_scope_end(sc);
}

/* ---- unbind, diagonal, diag, one_hot ----------------------------------------------------- */

static void test_diag_unbind_one_hot(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++) {
        ct_dtype dt = tu_all_dtypes[t];
        ct_scope *sc = ct_scope_begin();
        int64_t xs[3] = {3, 4, 5};
        double *xv;
        ct_tensor *x = tu_rand(3, xs, dt, lo_of(dt), hi_of(dt), &xv);
        for (int64_t off = -4; off <= 5; off++) {
            /* diagonal of dims 2 and 0: [4, len], element (j, k) = x[b, j, a] with
             * (a, b) = (k, k + off), or (k - off, k) for a negative offset */
            double ref[20];
            int64_t shape[2] = {4, 0};
            /* dims (2, 0): i along dim 2, i + off along dim 0 */
            int64_t k = 0;
            for (int64_t j = 0; j < 4; j++)
                for (int64_t i = 0; i < 5; i++) {
                    int64_t a = off >= 0 ? i : i - off, b = off >= 0 ? i + off : i;
                    if (a < 5 && b < 3) ref[k++] = xv[(b * 4 + j) * 5 + a];
                }
            shape[1] = k / 4;
            ct_tensor *d = ct_diagonal(x, off, 2, 0);
            expect(d, 2, shape, dt, ref, 0);
        }
        /* diag of 1-d and of 2-d */
        int64_t n = 4;
        double *vv;
        ct_tensor *v = tu_rand(1, &n, dt, lo_of(dt), hi_of(dt), &vv);
        for (int64_t off = -2; off <= 2; off++) {
            int64_t m = 4 + (off < 0 ? -off : off), sq[2] = {m, m};
            double *ref = calloc((size_t)(m * m), sizeof(double));
            for (int64_t i = 0; i < 4; i++) ref[off >= 0 ? i * m + i + off : (i - off) * m + i] = vv[i];
            ct_tensor *D = ct_diag(v, off);
            expect(D, 2, sq, dt, ref, 0);
            free(ref);
            expect(ct_diag(D, off), 1, &n, dt, vv, 0);
        }
        /* unbind along dim 1 */
        ct_tensor *pieces[4];
        int np = 0;
        assert_int_equal(ct_unbind(x, -2, 4, pieces, &np), CT_OK);
        assert_int_equal(np, 4);
        for (int j = 0; j < 4; j++) {
            double ref[15];
            for (int i = 0; i < 3; i++)
                for (int l = 0; l < 5; l++) ref[i * 5 + l] = xv[(i * 4 + j) * 5 + l];
            expect(pieces[j], 2, (int64_t[]){3, 5}, dt, ref, 0);
        }
        free(xv), free(vv);
        ct_scope_end(sc);
    }
    ct_scope *sc = ct_scope_begin();
    int64_t is[2] = {2, 3}, cls[6] = {0, 4, 2, 2, 1, 0};
    ct_tensor *c = ints(cls, 2, is);
    for (int64_t C = -1; C <= 6; C += 7) {
        int64_t nc = C < 0 ? 5 : C, os[3] = {2, 3, nc};
        double ref[36] = {0};
        for (int k = 0; k < 6; k++) ref[k * nc + cls[k]] = 1;
        expect(ct_one_hot(c, C), 3, os, CT_I64, ref, 0);
    }
    ct_scope_end(sc);
}

/* ---- interpolate -------------------------------------------------------------------------- */

/* PyTorch's source coordinate arithmetic, in double for float64 and float
 * otherwise (written out again here). */
static void ref_taps(bool bilinear, bool align, int64_t o, int64_t in, int64_t out, double sf,
                     bool f64, int64_t *i0, int64_t *i1, double *l0, double *l1) {
    if (!bilinear) {
        if (out == in) *i0 = o;
        else if (out == 2 * in) *i0 = o / 2;
        else {
            float sc = sf > 0 ? (float)(1.0 / sf) : (float)in / (float)out;
            int64_t i = (int64_t)floorf((float)o * sc);
            *i0 = i < in - 1 ? i : in - 1;
        }
        *i1 = *i0, *l0 = 1, *l1 = 0;
        return;
    }
    double src;
    if (f64) {
        double sc = align ? (out > 1 ? (double)(in - 1) / (double)(out - 1) : 0)
                          : (sf > 0 ? 1.0 / sf : (double)in / (double)out);
        src = align ? sc * (double)o : fmax(sc * ((double)o + 0.5) - 0.5, 0);
    } else {
        float sc = align ? (out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.f)
                         : (sf > 0 ? (float)(1.0 / sf) : (float)in / (float)out);
        float s = align ? sc * (float)o : sc * ((float)o + 0.5f) - 0.5f;
        src = s < 0 ? 0 : s;
    }
    int64_t a = (int64_t)floor(src);
    if (a > in - 1) a = in - 1;
    double l = fmin(fmax(src - (double)a, 0), 1);
    *i0 = a, *i1 = a < in - 1 ? a + 1 : a, *l1 = l, *l0 = 1 - l;
}

static void test_interpolate(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_float_dtypes / sizeof tu_float_dtypes[0]; t++)
        for (int it = 0; it < 12; it++) {
            ct_dtype dt = tu_float_dtypes[t];
            ct_scope *sc = ct_scope_begin();
            bool bil = it % 2, align = bil && it % 4 == 3, by_scale = it % 3 == 0;
            int64_t xs[4] = {2, 3, tu_randint(1, 7), tu_randint(1, 7)};
            double sf[2] = {tu_uniform(0.5, 3), tu_uniform(0.5, 3)};
            int64_t size[2] = {tu_randint(1, 11), tu_randint(1, 11)};
            if (by_scale) {
                size[0] = (int64_t)floor((double)xs[2] * sf[0]);
                size[1] = (int64_t)floor((double)xs[3] * sf[1]);
                if (size[0] < 1 || size[1] < 1) {
                    ct_scope_end(sc);
                    continue;
                }
            }
            double *xv;
            ct_tensor *x = maybe_nc(tu_rand(4, xs, dt, -2, 2, &xv), it & 4);
            int64_t os[4] = {2, 3, size[0], size[1]};
            double *ref = malloc(sizeof(double) * (size_t)tu_numel(4, os));
            for (int64_t pl = 0; pl < 6; pl++)
                for (int64_t oh = 0; oh < size[0]; oh++)
                    for (int64_t ow = 0; ow < size[1]; ow++) {
                        int64_t h0, h1, w0, w1;
                        double a0, a1, b0, b1;
                        ref_taps(bil, align, oh, xs[2], size[0], by_scale ? sf[0] : 0, dt == CT_F64,
                                 &h0, &h1, &a0, &a1);
                        ref_taps(bil, align, ow, xs[3], size[1], by_scale ? sf[1] : 0, dt == CT_F64,
                                 &w0, &w1, &b0, &b1);
                        const double *p = xv + pl * xs[2] * xs[3];
                        ref[(pl * size[0] + oh) * size[1] + ow] =
                            a0 * (b0 * p[h0 * xs[3] + w0] + b1 * p[h0 * xs[3] + w1]) +
                            a1 * (b0 * p[h1 * xs[3] + w0] + b1 * p[h1 * xs[3] + w1]);
                    }
            poison(tu_numel(4, os) * 8);
            ct_tensor *y = ct_interpolate(x, by_scale ? NULL : size, by_scale ? sf : NULL,
                                          bil ? CT_INTERP_BILINEAR : CT_INTERP_NEAREST, align);
            expect(y, 4, os, dt, ref, bil ? 4 : 0);
            free(ref), free(xv);
            ct_scope_end(sc);
        }
}

/* ---- unfold, fold ---------------------------------------------------------------------------- */

static void test_unfold_fold(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_float_dtypes / sizeof tu_float_dtypes[0]; t++)
        for (int it = 0; it < 8; it++) {
            ct_dtype dt = tu_float_dtypes[t];
            ct_scope *sc = ct_scope_begin();
            int64_t N = 2, C = tu_randint(1, 4), H = tu_randint(3, 8), W = tu_randint(3, 8);
            int64_t k[2] = {tu_randint(1, 4), tu_randint(1, 4)}, d[2] = {tu_randint(1, 3), 1};
            int64_t pd[2] = {tu_randint(0, 2), tu_randint(0, 3)}, s[2] = {tu_randint(1, 3), tu_randint(1, 3)};
            int64_t rh = H + 2 * pd[0] - d[0] * (k[0] - 1) - 1;
            int64_t rw = W + 2 * pd[1] - d[1] * (k[1] - 1) - 1;
            int64_t OH = rh / s[0] + 1, OW = rw / s[1] + 1;
            if (rh < 0 || rw < 0) {
                ct_scope_end(sc);
                continue;
            }
            int64_t xs[4] = {N, C, H, W}, cs[3] = {N, C * k[0] * k[1], OH * OW};
            double *xv, *cv;
            ct_tensor *x = maybe_nc(tu_rand(4, xs, dt, -2, 2, &xv), it & 1);
            ct_tensor *cols = maybe_nc(tu_rand(3, cs, dt, -2, 2, &cv), it & 1);
            double *ru = calloc((size_t)tu_numel(3, cs), sizeof(double));
            double *rf = calloc((size_t)tu_numel(4, xs), sizeof(double));
            for (int64_t n = 0; n < N; n++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t i = 0; i < k[0]; i++)
                        for (int64_t j = 0; j < k[1]; j++)
                            for (int64_t oh = 0; oh < OH; oh++)
                                for (int64_t ow = 0; ow < OW; ow++) {
                                    int64_t h = oh * s[0] - pd[0] + i * d[0];
                                    int64_t w = ow * s[1] - pd[1] + j * d[1];
                                    int64_t r = ((n * C + c) * k[0] + i) * k[1] + j;
                                    int64_t co = r * OH * OW + oh * OW + ow;
                                    if (h < 0 || h >= H || w < 0 || w >= W) continue;
                                    int64_t xo = ((n * C + c) * H + h) * W + w;
                                    ru[co] = xv[xo];
                                    rf[xo] += cv[co];
                                }
            poison(tu_numel(3, cs) * 8);
            expect(ct_unfold(x, k, d, pd, s), 3, cs, dt, ru, 0);
            int64_t osz[2] = {H, W};
            expect(ct_fold(cols, osz, k, d, pd, s), 4, xs, dt, rf, 8);
            /* unbatched */
            ct_tensor *x0 = ct_select(x, 0, 1);
            expect(ct_unfold(x0, k, d, pd, s), 2, cs + 1, dt, ru + tu_numel(2, cs + 1), 0);
            free(xv), free(cv), free(ru), free(rf);
            ct_scope_end(sc);
        }
}


/* 0-d and empty tensors: PyTorch's shapes and values. */
static void test_zero_d_and_empty(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    double v = 2.5;
    ct_tensor *x0 = tu_from_f64(&v, 0, NULL, CT_F64);
    expect(ct_flip(x0, 0, NULL), 0, NULL, CT_F64, &v, 0);
    int64_t s1 = 3, zero = 0;
    expect(ct_roll(x0, 1, &s1, 0, NULL), 0, NULL, CT_F64, &v, 0);
    double six[6] = {v, v, v, v, v, v};
    expect(ct_repeat(x0, 2, (int64_t[]){2, 3}), 2, (int64_t[]){2, 3}, CT_F64, six, 0);
    expect(ct_pad(x0, 0, (int64_t[]){0}, CT_PAD_CONSTANT, 1), 0, NULL, CT_F64, &v, 0);
    ct_tensor *i0 = ints(&zero, 0, NULL);
    double w = -1;
    ct_tensor *s0 = tu_from_f64(&w, 0, NULL, CT_F64);
    expect(ct_scatter(x0, 0, i0, s0), 0, NULL, CT_F64, &w, 0);
    expect(ct_take(x0, i0), 0, NULL, CT_F64, &v, 0);
    int64_t three[1] = {3};
    double oh[3] = {1, 0, 0};
    expect(ct_one_hot(i0, 3), 1, three, CT_I64, oh, 0);
    /* empty: a padded empty dim is all fill; zero repeats; an empty roll */
    ct_tensor *e = ct_tensor_zeros(2, (int64_t[]){2, 0}, CT_F32, CT_CPU);
    double fill[10] = {7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
    expect(ct_pad(e, 2, (int64_t[]){2, 3}, CT_PAD_CONSTANT, 7), 2, (int64_t[]){2, 5}, CT_F32, fill, 0);
    ct_tensor *x = tu_rand(2, (int64_t[]){2, 3}, CT_F32, -1, 1, NULL);
    expect(ct_repeat(x, 2, (int64_t[]){0, 2}), 2, (int64_t[]){0, 6}, CT_F32, NULL, 0);
    expect(ct_roll(e, 1, &s1, 1, (int64_t[]){1}), 2, (int64_t[]){2, 0}, CT_F32, NULL, 0);
    expect(ct_flip(e, 1, (int64_t[]){1}), 2, (int64_t[]){2, 0}, CT_F32, NULL, 0);
    expect(ct_masked_select(x, ct_gt_scalar(x, 5)), 1, &zero, CT_F32, NULL, 0);
    ct_scope_end(sc);
}

/* ---- gradients --------------------------------------------------------------------------------- */

typedef struct gctx {
    int dim, reduce;
    bool flag;
    int64_t a[6], b[6];
    int n;
    ct_tensor *extra[3];
} gctx;

static ct_tensor *g_scatter(ct_tensor *const *in, void *v) {
    return ct_scatter(in[0], ((gctx *)v)->dim, in[1], in[2]);
}
static ct_tensor *g_scatter_value(ct_tensor *const *in, void *v) {
    return ct_scatter_value(in[0], ((gctx *)v)->dim, in[1], 2.5);
}
static ct_tensor *g_scatter_reduce(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_scatter_reduce(in[0], g->dim, in[1], in[2], rname[g->reduce], g->flag);
}
static ct_tensor *g_index_add(ct_tensor *const *in, void *v) {
    return ct_index_add(in[0], ((gctx *)v)->dim, in[1], in[2], -1.5);
}
static ct_tensor *g_index_put(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_index_put(in[0], 2, g->extra, in[1], g->flag);
}
static ct_tensor *g_index_put_n(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_index_put(in[0], g->n, g->extra, in[1], g->flag);
}
static ct_tensor *g_take(ct_tensor *const *in, void *v) {
    (void)v;
    return ct_take(in[0], in[1]);
}
static ct_tensor *g_masked_select(ct_tensor *const *in, void *v) {
    (void)v;
    return ct_masked_select(in[0], in[1]);
}
static ct_tensor *g_flip(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_flip(in[0], g->n, g->a);
}
static ct_tensor *g_roll(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_roll(in[0], g->n, g->b, g->n, g->a);
}
static ct_tensor *g_repeat(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_repeat(in[0], g->n, g->a);
}
static ct_tensor *g_tile(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_tile(in[0], g->n, g->a);
}
static ct_tensor *g_pad(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_pad(in[0], g->n, g->a, (ct_pad_mode)g->reduce, 0.5);
}
static ct_tensor *g_diagonal(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_diagonal(in[0], g->a[0], (int)g->a[1], (int)g->a[2]);
}
static ct_tensor *g_diag(ct_tensor *const *in, void *v) {
    return ct_diag(in[0], ((gctx *)v)->a[0]);
}
static ct_tensor *g_unbind(ct_tensor *const *in, void *v) {
    (void)v;
    ct_tensor *p[8];
    int n = 0;
    if (ct_unbind(in[0], 0, 8, p, &n) != CT_OK) return NULL;
    ct_tensor *r = ct_mul(p[0], p[n - 1]);
    release_all(n, p);
    return r;
}
static ct_tensor *g_interp(ct_tensor *const *in, void *v) {
    gctx *g = v;
    double sf[2] = {1.7, 0.8};
    return ct_interpolate(in[0], g->flag ? NULL : g->b, g->flag ? sf : NULL,
                          (ct_interp_mode)(g->reduce & 1), g->reduce == 3);
}
static ct_tensor *g_unfold(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_unfold(in[0], g->a, g->a + 2, g->a + 4, g->b);
}
static ct_tensor *g_fold(ct_tensor *const *in, void *v) {
    gctx *g = v;
    return ct_fold(in[0], g->b + 2, g->a, g->a + 2, g->a + 4, g->b);
}

static ct_tensor *leaf64(int nd, const int64_t *s, bool nc) {
    ct_tensor *t = tu_rand(nd, s, CT_F64, -1, 1, NULL);
    if (nc) {
        ct_tensor *v = tu_noncontig(t);
        ct_tensor_release(t);
        t = v;
    }
    assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

/* interpolate of 3-d (n 1: linear) or 5-d (n 3: trilinear) input; flag: by scale_factor;
 * reduce: align_corners. */
static ct_tensor *g_interp_n(ct_tensor *const *in, void *v) {
    gctx *g = v;
    static const int64_t size[3] = {5, 3, 4};
    static const double sf[3] = {1.7, 0.8, 1.4};
    const int64_t *sz = g->n == 1 ? size + 2 : size;
    const double *f = g->n == 1 ? sf + 2 : sf;
    return ct_interpolate(in[0], g->flag ? NULL : sz, g->flag ? f : NULL,
                          g->n == 1 ? CT_INTERP_LINEAR : CT_INTERP_TRILINEAR, g->reduce);
}

/* 1-d (nearest, linear) and 3-d (nearest, trilinear) interpolation: x [2, 3, L] and
 * [2, 2, D, H, W], the references the products of ref_taps' per-dim weights. 16-bit
 * results round the 5-d case's intermediate (H and W first, then D) once more. */
static void test_interpolate_1d_3d(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tu_float_dtypes / sizeof tu_float_dtypes[0]; t++)
        for (int it = 0; it < 12; it++) {
            ct_dtype dt = tu_float_dtypes[t];
            ct_scope *sc = ct_scope_begin();
            bool lin = it % 2, align = lin && it % 4 == 3, by_scale = it % 3 == 0;
            bool f64 = dt == CT_F64;
            /* 1-d */
            int64_t L = tu_randint(1, 7), OL = tu_randint(1, 11);
            double sfl = tu_uniform(0.5, 3);
            if (by_scale) OL = (int64_t)floor((double)L * sfl);
            if (OL >= 1) {
                double *xv;
                ct_tensor *x = maybe_nc(tu_rand(3, (int64_t[]){2, 3, L}, dt, -2, 2, &xv), it & 4);
                double *ref = malloc(sizeof(double) * (size_t)(6 * OL));
                for (int64_t pl = 0; pl < 6; pl++)
                    for (int64_t o = 0; o < OL; o++) {
                        int64_t i0, i1;
                        double l0, l1;
                        ref_taps(lin, align, o, L, OL, by_scale ? sfl : 0, f64, &i0, &i1, &l0, &l1);
                        ref[pl * OL + o] = l0 * xv[pl * L + i0] + l1 * xv[pl * L + i1];
                    }
                poison(6 * OL * 8);
                ct_tensor *y = ct_interpolate(x, by_scale ? NULL : &OL, by_scale ? &sfl : NULL,
                                              lin ? CT_INTERP_LINEAR : CT_INTERP_NEAREST, align);
                expect(y, 3, (int64_t[]){2, 3, OL}, dt, ref, lin ? 4 : 0);
                free(ref), free(xv);
            }
            /* 3-d */
            int64_t in[3] = {tu_randint(1, 4), tu_randint(1, 4), tu_randint(1, 4)};
            int64_t out[3] = {tu_randint(1, 6), tu_randint(1, 6), tu_randint(1, 6)};
            double sf[3] = {tu_uniform(0.5, 2.5), tu_uniform(0.5, 2.5), tu_uniform(0.5, 2.5)};
            bool ok = true;
            for (int k = 0; k < 3 && by_scale; k++) {
                out[k] = (int64_t)floor((double)in[k] * sf[k]);
                ok = ok && out[k] >= 1;
            }
            if (ok) {
                int64_t xs[5] = {2, 2, in[0], in[1], in[2]}, os[5] = {2, 2, out[0], out[1], out[2]};
                double *xv;
                ct_tensor *x = maybe_nc(tu_rand(5, xs, dt, -2, 2, &xv), it & 4);
                int64_t n = tu_numel(5, os), plane = in[0] * in[1] * in[2];
                double *ref = malloc(sizeof(double) * (size_t)n);
                int64_t q = 0;
                for (int64_t pl = 0; pl < 4; pl++)
                    for (int64_t a = 0; a < out[0]; a++)
                        for (int64_t b = 0; b < out[1]; b++)
                            for (int64_t c = 0; c < out[2]; c++) {
                                int64_t i[3][2];
                                double w[3][2];
                                int64_t o[3] = {a, b, c};
                                for (int k = 0; k < 3; k++)
                                    ref_taps(lin, align, o[k], in[k], out[k], by_scale ? sf[k] : 0,
                                             f64, &i[k][0], &i[k][1], &w[k][0], &w[k][1]);
                                double v = 0;
                                for (int u = 0; u < 8; u++) {
                                    int du = u >> 2, hu = (u >> 1) & 1, wu = u & 1;
                                    v += w[0][du] * w[1][hu] * w[2][wu] *
                                         xv[pl * plane + (i[0][du] * in[1] + i[1][hu]) * in[2] + i[2][wu]];
                                }
                                ref[q++] = v;
                            }
                poison(n * 8);
                ct_tensor *y = ct_interpolate(x, by_scale ? NULL : out, by_scale ? sf : NULL,
                                              lin ? CT_INTERP_TRILINEAR : CT_INTERP_NEAREST, align);
                expect(y, 5, os, dt, ref, lin ? 8 : 0);
                free(ref), free(xv);
            }
            ct_scope_end(sc);
        }
    /* gradients, float64 */
    for (int it = 0; it < 4; it++) {
        ct_scope *sc = ct_scope_begin();
        bool align = it & 1, by_scale = it & 2;
        ct_tensor *x1 = tu_rand(3, (int64_t[]){2, 2, 4}, CT_F64, -1, 1, NULL);
        ct_tensor *x3 = tu_rand(5, (int64_t[]){1, 2, 3, 2, 3}, CT_F64, -1, 1, NULL);
        assert_int_equal(ct_requires_grad_(x1, true), CT_OK);
        assert_int_equal(ct_requires_grad_(x3, true), CT_OK);
        gctx g = {.flag = by_scale, .reduce = align, .n = 1};
        gradcheck_ok("interpolate linear", g_interp_n, &g, 1, &x1);
        g.n = 3;
        gradcheck_ok("interpolate trilinear", g_interp_n, &g, 1, &x3);
        ct_scope_end(sc);
    }
}

static void test_gradcheck(void **state) {
    (void)state;
    char what[96];
    for (int it = 0; it < 6; it++) {
        ct_scope *sc = ct_scope_begin();
        bool nc = it & 1;
        int64_t xs[3] = {3, 4, 5}, is[3] = {2, 3, 4}, ss[3] = {3, 3, 5};
        gctx g = {.dim = it % 3};
        is[g.dim] = 5;
        ss[g.dim] = 6;
        ct_tensor *x = leaf64(3, xs, nc), *src = leaf64(3, ss, nc);
        ct_tensor *idx = tu_rand(3, is, CT_I64, 0, (double)xs[g.dim], NULL);
        ct_tensor *in3[3] = {x, idx, src};
        {
            /* distinct positions along dim per line: an assignment's gradient is
             * defined only without duplicates */
            int64_t us[3] = {2, 3, 4}, c[3], uv[60];
            us[g.dim] = xs[g.dim] - 1;
            for (int64_t p = 0; p < tu_numel(3, us); p++) {
                unravel(p, 3, us, c);
                uv[p] = (c[g.dim] + c[(g.dim + 1) % 3] + 2 * c[(g.dim + 2) % 3]) % xs[g.dim];
            }
            ct_tensor *uin[3] = {x, ints(uv, 3, us), src};
            snprintf(what, sizeof what, "scatter %d", it);
            gradcheck_ok(what, g_scatter, &g, 3, uin);
            gradcheck_ok("scatter_value", g_scatter_value, &g, 2, uin);
        }
        for (g.reduce = R_SUM; g.reduce <= R_PROD; g.reduce++)
            for (int s = 0; s < 2; s++) {
                g.flag = s;
                snprintf(what, sizeof what, "scatter_reduce %s include_self %d it %d",
                         rname[g.reduce], s, it);
                gradcheck_ok(what, g_scatter_reduce, &g, 3, in3);
            }
        int64_t m = 4, iv[4] = {0, 2, 0, 1};
        int64_t as[3] = {3, 4, 5};
        as[g.dim] = m;
        ct_tensor *src2 = leaf64(3, as, nc), *i1 = ints(iv, 1, &m);
        ct_tensor *ia[3] = {x, i1, src2};
        gradcheck_ok("index_add", g_index_add, &g, 3, ia);
        int64_t a2[2] = {2, 1}, b3 = 3, av[2] = {0, -1}, bv[3] = {1, 3, 2};
        g.extra[0] = ints(av, 2, a2);
        g.extra[1] = ints(bv, 1, &b3);
        int64_t vsz[1] = {5};
        ct_tensor *vals = leaf64(1, vsz, false);
        ct_tensor *ip[2] = {x, vals};
        for (int acc = 0; acc < 2; acc++) {
            g.flag = acc;
            gradcheck_ok("index_put", g_index_put, &g, 2, ip);
        }
        /* a slice (x[:, b] = values) and a mask (x[:, mask] = values) */
        {
            int64_t b2 = 2, bvv[2] = {0, -1}, v25[2] = {2, 5};
            gctx gs = {.n = 3, .extra = {NULL, ints(bvv, 1, &b2), NULL}};
            ct_tensor *vs = leaf64(2, v25, nc);
            ct_tensor *in2[2] = {x, vs};
            for (int acc = 0; acc < 2; acc++) {
                gs.flag = acc;
                gradcheck_ok("index_put slice", g_index_put_n, &gs, 2, in2);
            }
            ct_tensor *mk = tu_rand(2, (int64_t[]){4, 5}, CT_BOOL, 0, 1, NULL);
            gctx gm = {.n = 2, .extra = {NULL, mk}};
            ct_tensor *v1 = leaf64(1, (int64_t[]){1}, false);
            ct_tensor *in3m[2] = {x, v1};
            for (int acc = 0; acc < 2; acc++) {
                gm.flag = acc;
                gradcheck_ok("index_put mask", g_index_put_n, &gm, 2, in3m);
            }
        }
        int64_t ts[2] = {2, 3}, tv[6] = {0, -1, 5, 5, 59, 7};
        ct_tensor *ti[2] = {x, ints(tv, 2, ts)};
        gradcheck_ok("take", g_take, &g, 2, ti);
        int64_t ms[2] = {4, 1};
        ct_tensor *mk[2] = {x, tu_rand(2, ms, CT_BOOL, 0, 1, NULL)};
        gradcheck_ok("masked_select", g_masked_select, &g, 2, mk);
        g.n = 2, g.a[0] = 0, g.a[1] = -1, g.b[0] = 2, g.b[1] = -7;
        ct_tensor *x1[1] = {x};
        gradcheck_ok("flip", g_flip, &g, 1, x1);
        gradcheck_ok("roll", g_roll, &g, 1, x1);
        g.n = 4, g.a[0] = 2, g.a[1] = 1, g.a[2] = 3, g.a[3] = 2;
        gradcheck_ok("repeat", g_repeat, &g, 1, x1);
        g.n = 1, g.a[0] = 3;
        gradcheck_ok("tile", g_tile, &g, 1, x1);
        for (int mode = 0; mode < 4; mode++) {
            g.reduce = mode;
            g.n = 4;
            int64_t pads[4][4] = {{1, -1, 2, 0}, {2, 3, 1, 2}, {3, 0, 4, 1}, {4, 5, 2, 3}};
            memcpy(g.a, pads[mode], sizeof pads[mode]);
            snprintf(what, sizeof what, "pad mode %d", mode);
            gradcheck_ok(what, g_pad, &g, 1, x1);
        }
        g.a[0] = it - 2, g.a[1] = 2, g.a[2] = 0;
        gradcheck_ok("diagonal", g_diagonal, &g, 1, x1);
        g.a[0] = it - 3;
        int64_t four = 4;
        ct_tensor *v1[1] = {leaf64(1, &four, nc)};
        gradcheck_ok("diag 1-d", g_diag, &g, 1, v1);
        ct_tensor *m2[1] = {leaf64(2, xs, nc)};
        gradcheck_ok("diag 2-d", g_diag, &g, 1, m2);
        gradcheck_ok("unbind", g_unbind, &g, 1, x1);
        int64_t is4[4] = {2, 2, 3, 4};
        ct_tensor *im[1] = {leaf64(4, is4, nc)};
        for (g.reduce = 0; g.reduce < 4; g.reduce++)
            for (int s = 0; s < 2; s++) {
                g.flag = s;
                g.b[0] = 5, g.b[1] = 3;
                snprintf(what, sizeof what, "interpolate mode %d scale %d", g.reduce, s);
                gradcheck_ok(what, g_interp, &g, 1, im);
            }
        int64_t fa[6] = {2, 2, 1, 2, 1, 0}, fb[4] = {1, 2, 3, 4};
        memcpy(g.a, fa, sizeof fa);
        memcpy(g.b, fb, sizeof fb);
        gradcheck_ok("unfold", g_unfold, &g, 1, im);
        /* fold to (3, 4): blocks (3 + 2 - 2) / 1 + 1 = 4 by (4 + 0 - 3) / 2 + 1 = 1 */
        int64_t fs[3] = {2, 12, 4};
        ct_tensor *fc[1] = {leaf64(3, fs, nc)};
        gradcheck_ok("fold", g_fold, &g, 1, fc);
        ct_scope_end(sc);
    }
}

/* ---- bad inputs --------------------------------------------------------------------------------- */

static void test_bad_inputs(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    int64_t xs[2] = {3, 5}, is[2] = {2, 2};
    ct_tensor *x = tu_rand(2, xs, CT_F32, -1, 1, NULL);
    ct_tensor *bad = ints((int64_t[]){0, 7, 1, 2}, 2, is), *ok = ints((int64_t[]){0, 1, 2, 4}, 2, is);
    ct_tensor *src = tu_rand(2, is, CT_F32, -1, 1, NULL), *s64 = tu_rand(2, is, CT_F64, -1, 1, NULL);
    ct_tensor *i32 = tu_rand(2, is, CT_I32, 0, 2, NULL);
    tu_assert_null_error(ct_scatter(x, 1, bad, src), CT_ERR_INDEX, "ct_scatter", "index 7", "dim 1",
                         "size 5");
    tu_assert_null_error(ct_scatter(x, 1, ok, NULL), CT_ERR_INVALID_ARG, "ct_scatter", "src");
    tu_assert_null_error(ct_scatter(x, 1, ok, s64), CT_ERR_DTYPE, "ct_scatter", "float64");
    tu_assert_null_error(ct_scatter(x, 1, i32, src), CT_ERR_DTYPE, "ct_scatter", "int64", "int32");
    tu_assert_null_error(ct_scatter(x, 3, ok, src), CT_ERR_INDEX, "ct_scatter", "dim 3");
    tu_assert_null_error(ct_scatter_value(x, 0, ok, 1), CT_ERR_INDEX, "ct_scatter", "index 4");
    tu_assert_null_error(ct_scatter_reduce(x, 1, ok, src, "median", true), CT_ERR_INVALID_ARG,
                         "ct_scatter_reduce", "\"median\"", "\"prod\"");
    tu_assert_null_error(ct_scatter_reduce(x, 1, bad, src, "amax", false), CT_ERR_INDEX,
                         "ct_scatter_reduce", "index 7");
    ct_tensor *xi = tu_rand(2, xs, CT_I32, 0, 5, NULL);
    tu_assert_null_error(ct_scatter_value(xi, 1, ok, 1e10), CT_ERR_INVALID_ARG, "ct_scatter_value",
                         "int32");
    int64_t three = 3;
    ct_tensor *i1 = ints((int64_t[]){0, 5, 1}, 1, &three);
    ct_tensor *s35 = tu_rand(2, (int64_t[]){3, 3}, CT_F32, -1, 1, NULL);
    tu_assert_null_error(ct_index_add(x, 1, i1, s35, 1), CT_ERR_INDEX, "ct_index_add", "index 5",
                         "size 5");
    tu_assert_null_error(ct_index_add(x, 0, i1, s35, 1), CT_ERR_SHAPE, "ct_index_add", "source");
    ct_tensor *ind[1] = {i1};
    tu_assert_null_error(ct_index_put(x, 1, ind, src, false), CT_ERR_INDEX, "ct_index_put",
                         "index 5", "dim 0", "size 3", "-3..2");
    tu_assert_null_error(ct_index_put(x, 3, ind, src, false), CT_ERR_INVALID_ARG, "ct_index_put");
    ct_tensor *i0[1] = {ints((int64_t[]){0, 1, 2}, 1, &three)};
    tu_assert_null_error(ct_index_put(x, 1, i0, src, false), CT_ERR_SHAPE, "ct_index_put",
                         "broadcast");
    tu_assert_null_error(ct_take(x, ints((int64_t[]){15}, 1, (int64_t[]){1})), CT_ERR_INDEX,
                         "ct_take", "index 15", "size 15");
    tu_assert_null_error(ct_masked_select(x, src), CT_ERR_DTYPE, "ct_masked_select", "bool");
    tu_assert_null_error(ct_flip(x, 2, (int64_t[]){1, -1}), CT_ERR_INVALID_ARG, "ct_flip",
                         "more than once");
    tu_assert_null_error(ct_roll(x, 2, (int64_t[]){1, 2}, 1, (int64_t[]){0}), CT_ERR_INVALID_ARG,
                         "ct_roll", "same length");
    tu_assert_null_error(ct_repeat(x, 1, (int64_t[]){2}), CT_ERR_INVALID_ARG, "ct_repeat",
                         "number of repeats");
    tu_assert_null_error(ct_repeat(x, 2, (int64_t[]){2, -1}), CT_ERR_INVALID_ARG, "ct_repeat",
                         ">= 0");
    tu_assert_null_error(ct_pad(x, 3, (int64_t[]){1, 1, 1}, CT_PAD_CONSTANT, 0), CT_ERR_INVALID_ARG,
                         "ct_pad", "even");
    tu_assert_null_error(ct_pad(x, 2, (int64_t[]){5, 0}, CT_PAD_REFLECT, 0), CT_ERR_INVALID_ARG,
                         "ct_pad", "reflect", "out of range");
    tu_assert_null_error(ct_pad(x, 4, (int64_t[]){1, 1, 1, 1}, CT_PAD_REPLICATE, 0), CT_ERR_SHAPE,
                         "ct_pad", "replicate", "3-d or 4-d");
    tu_assert_null_error(ct_pad(x, 2, (int64_t[]){-3, -3}, CT_PAD_CONSTANT, 0), CT_ERR_SHAPE,
                         "ct_pad", "size -1");
    tu_assert_null_error(ct_diagonal(x, 0, 1, -1), CT_ERR_INVALID_ARG, "ct_diagonal", "dim 1");
    tu_assert_null_error(ct_diag(tu_rand(3, (int64_t[]){2, 2, 2}, CT_F32, 0, 1, NULL), 0),
                         CT_ERR_SHAPE, "ct_diag", "1-d or 2-d");
    tu_assert_null_error(ct_one_hot(ok, 3), CT_ERR_INDEX, "ct_one_hot", "index 4");
    tu_assert_null_error(ct_one_hot(x, 3), CT_ERR_DTYPE, "ct_one_hot", "int64");
    ct_tensor *x4 = tu_rand(4, (int64_t[]){1, 1, 3, 3}, CT_F32, 0, 1, NULL);
    tu_assert_null_error(ct_interpolate(x4, (int64_t[]){2, 2}, (double[]){2, 2}, CT_INTERP_NEAREST,
                                        false),
                         CT_ERR_INVALID_ARG, "ct_interpolate", "exactly one");
    tu_assert_null_error(ct_interpolate(x4, (int64_t[]){2, 2}, NULL, CT_INTERP_NEAREST, true),
                         CT_ERR_INVALID_ARG, "ct_interpolate", "align_corners");
    tu_assert_null_error(ct_interpolate(x, (int64_t[]){2, 2}, NULL, CT_INTERP_BILINEAR, false),
                         CT_ERR_SHAPE, "ct_interpolate", "4-d");
    tu_assert_null_error(ct_interpolate(xi, (int64_t[]){2, 2}, NULL, CT_INTERP_BILINEAR, false),
                         CT_ERR_DTYPE, "ct_interpolate");
    tu_assert_null_error(ct_interpolate(x4, (int64_t[]){2, 2}, NULL, CT_INTERP_LINEAR, false),
                         CT_ERR_SHAPE, "ct_interpolate", "mode linear needs a 3-d input");
    ct_tensor *x3 = tu_rand(3, (int64_t[]){1, 2, 3}, CT_F32, 0, 1, NULL);
    tu_assert_null_error(ct_interpolate(x3, (int64_t[]){2}, NULL, CT_INTERP_TRILINEAR, false),
                         CT_ERR_SHAPE, "ct_interpolate", "mode trilinear needs a 5-d input");
    ct_tensor *x6 = tu_rand(6, (int64_t[]){1, 1, 1, 1, 1, 2}, CT_F32, 0, 1, NULL);
    tu_assert_null_error(ct_interpolate(x6, (int64_t[]){2, 2, 2, 2}, NULL, CT_INTERP_NEAREST,
                                        false),
                         CT_ERR_SHAPE, "ct_interpolate", "5-d [N, C, D, H, W]");
    ct_tensor *x5 = tu_rand(5, (int64_t[]){1, 1, 2, 2, 2}, CT_F32, 0, 1, NULL);
    tu_assert_null_error(ct_interpolate(x5, NULL, (double[]){-1, 2, 2}, CT_INTERP_TRILINEAR,
                                        false),
                         CT_ERR_INVALID_ARG, "ct_interpolate", "positive");
    tu_assert_null_error(ct_interpolate(x5, NULL, (double[]){2, 0, 2}, CT_INTERP_NEAREST, false),
                         CT_ERR_INVALID_ARG, "ct_interpolate", "positive");
    tu_assert_null_error(ct_interpolate(x3, (int64_t[]){0}, NULL, CT_INTERP_LINEAR, false),
                         CT_ERR_SHAPE, "ct_interpolate", "non-empty");
    int64_t k4[2] = {4, 4}, one[2] = {1, 1}, zero[2] = {0, 0};
    tu_assert_null_error(ct_unfold(x4, k4, one, zero, one), CT_ERR_SHAPE, "ct_unfold", "no block");
    tu_assert_null_error(ct_unfold(x4, zero, one, zero, one), CT_ERR_INVALID_ARG, "ct_unfold",
                         "kernel");
    ct_tensor *cols = tu_rand(3, (int64_t[]){1, 4, 5}, CT_F32, 0, 1, NULL);
    tu_assert_null_error(ct_fold(cols, (int64_t[]){3, 3}, (int64_t[]){2, 2}, one, zero, one),
                         CT_ERR_SHAPE, "ct_fold", "blocks");
    int np = 0;
    ct_tensor *pieces[2];
    tu_assert_error(ct_unbind(x, 0, 2, pieces, &np), CT_ERR_INVALID_ARG, "ct_unbind", "max_out");
    ct_scope_end(sc);
}

int main(void) {
    tu_seed();
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_scatter),           T(test_scatter_reduce), T(test_scatter_reduce_prod_zeros), T(test_index_add),
        T(test_index_put), T(test_index_put_slices_masks), T(test_index_put_slices_masks_errors),         T(test_take_masked_select), T(test_flip_roll_repeat),
        T(test_pad),               T(test_large_copies),   T(test_diag_unbind_one_hot),
        T(test_interpolate), T(test_interpolate_1d_3d),       T(test_unfold_fold),    T(test_gradcheck),
        T(test_bad_inputs),        T(test_zero_d_and_empty),
    };
#undef T
    return tu_run_tests(tests);
}
