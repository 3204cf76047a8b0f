/* Reductions against float64 (and wrapping int64) loops written here, on
 * random data in several layouts, plus accuracy, NaN, tie, error and
 * thread-count cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "test_fixture.h"
#include "core/tensor_impl.h"

typedef enum tkind {
    T_SUM, T_MEAN, T_PROD, T_VAR, T_STD, T_NORM, T_MAXD, T_MIND, T_ARGMAX, T_ARGMIN,
    T_MAX, T_MIN, T_ARGMAX_ALL, T_ARGMIN_ALL, T_NKINDS
} tkind;

static const char *kind_name[] = {"sum", "mean", "prod", "var", "std", "norm", "max_dim",
                                  "min_dim", "argmax", "argmin", "max", "min", "argmax_all",
                                  "argmin_all"};

static bool kind_float_only(tkind k) { return k == T_MEAN || k == T_VAR || k == T_STD || k == T_NORM; }
static bool kind_single_dim(tkind k) { return k >= T_MAXD && k <= T_ARGMIN; }
static bool kind_all_only(tkind k) { return k >= T_MAX; }
static bool kind_extreme(tkind k) { return k >= T_MAXD; }
static bool kind_is_max(tkind k) { return k == T_MAXD || k == T_ARGMAX || k == T_MAX || k == T_ARGMAX_ALL; }

/* Runs the op; *idx receives max_dim/min_dim's indices. */
static ct_tensor *run_op(tkind k, ct_tensor *x, int ndims, const int64_t *dims, bool keepdim,
                         double param, ct_tensor **idx) {
    int dim = ndims > 0 ? (int)dims[0] : 0;
    switch (k) {
    case T_SUM: return ct_sum(x, ndims, dims, keepdim);
    case T_MEAN: return ct_mean(x, ndims, dims, keepdim);
    case T_PROD: return ct_prod(x, ndims, dims, keepdim);
    case T_VAR: return ct_var(x, ndims, dims, param, keepdim);
    case T_STD: return ct_std(x, ndims, dims, param, keepdim);
    case T_NORM: return ct_norm(x, param, ndims, dims, keepdim);
    case T_MAXD: return ct_max_dim(x, dim, keepdim, idx);
    case T_MIND: return ct_min_dim(x, dim, keepdim, idx);
    case T_ARGMAX: return ct_argmax(x, dim, keepdim);
    case T_ARGMIN: return ct_argmin(x, dim, keepdim);
    case T_MAX: return ct_max(x);
    case T_MIN: return ct_min(x);
    case T_ARGMAX_ALL: return ct_argmax_all(x);
    default: return ct_argmin_all(x);
    }
}

/* ---- reference ---------------------------------------------------------------------- */
static bool ref_better(bool ismax, double v, double best) {
    if (isnan(best)) return false;
    if (isnan(v)) return true;
    return ismax ? v > best : v < best;
}

/* One output from its reduced values v[0..n) (row-major order of the reduced dims). */
static void ref_one(tkind k, double param, bool integral, const double *v, int64_t n,
                    double *out, int64_t *idx) {
    *idx = 0;
    switch (k) {
    case T_SUM:
    case T_MEAN: {
        if (integral) {
            uint64_t s = 0;
            for (int64_t i = 0; i < n; i++) s += (uint64_t)(int64_t)v[i];
            *out = (double)(int64_t)s;
            return;
        }
        long double s = 0;
        for (int64_t i = 0; i < n; i++) s += v[i];
        *out = k == T_MEAN ? (double)(s / n) : (double)s;
        if (k == T_MEAN && n == 0) *out = NAN;
        return;
    }
    case T_PROD: {
        if (integral) {
            uint64_t p = 1;
            for (int64_t i = 0; i < n; i++) p *= (uint64_t)(int64_t)v[i];
            *out = (double)(int64_t)p;
            return;
        }
        long double p = 1;
        for (int64_t i = 0; i < n; i++) p *= v[i];
        *out = (double)p;
        return;
    }
    case T_VAR:
    case T_STD: {
        long double m = 0, m2 = 0;
        for (int64_t i = 0; i < n; i++) m += v[i];
        m = n ? m / n : 0;
        for (int64_t i = 0; i < n; i++) m2 += (v[i] - m) * (v[i] - m);
        double div = (double)n > param ? (double)n - param : 0.0;
        double r = (double)m2 / div;
        *out = k == T_STD ? sqrt(r) : r;
        return;
    }
    case T_NORM: {
        long double s = 0;
        if (param == INFINITY || param == -INFINITY) {
            double e = param > 0 ? 0 : INFINITY;
            for (int64_t i = 0; i < n; i++) {
                double a = fabs(v[i]);
                if (isnan(a) || isnan(e)) e = NAN;
                else e = param > 0 ? fmax(e, a) : fmin(e, a);
            }
            *out = e;
            return;
        }
        for (int64_t i = 0; i < n; i++) {
            if (param == 0) s += v[i] != 0;
            else if (param == 1) s += fabs(v[i]);
            else if (param == 2) s += (long double)v[i] * v[i];
            else s += powl(fabsl(v[i]), param);
        }
        *out = param == 0 || param == 1 ? (double)s : param == 2 ? sqrt((double)s)
                                                                 : (double)powl(s, 1.0L / param);
        return;
    }
    default: {
        bool ismax = kind_is_max(k);
        double best = v[0];
        for (int64_t i = 1; i < n; i++)
            if (ref_better(ismax, v[i], best)) {
                best = v[i];
                *idx = i;
            }
        *out = best;
        return;
    }
    }
}

/* Reference over vals (row-major, shape) with the reduced dims in mask;
 * returns the number of outputs. */
static int64_t ref_reduce(tkind k, double param, ct_dtype dt, const double *vals, int nd,
                          const int64_t *shape, unsigned mask, double *out, int64_t *idx) {
    int64_t O = 1, R = 1;
    for (int d = 0; d < nd; d++) {
        if (mask >> d & 1) R *= shape[d];
        else O *= shape[d];
    }
    double *v = malloc((size_t)(R > 0 ? R : 1) * sizeof *v);
    bool integral = !ct_dtype_is_floating(dt);
    for (int64_t o = 0; o < O; o++) {
        for (int64_t r = 0; r < R; r++) {
            /* Builds the input index from the kept coords (o) and reduced ones (r). */
            int64_t oo = o, rr = r, lin = 0, mul = 1;
            for (int d = nd - 1; d >= 0; d--) {
                int64_t c;
                if (mask >> d & 1) {
                    c = rr % shape[d];
                    rr /= shape[d];
                } else {
                    c = oo % shape[d];
                    oo /= shape[d];
                }
                lin += c * mul;
                mul *= shape[d];
            }
            v[r] = vals[lin];
        }
        ref_one(k, param, integral, v, R, &out[o], &idx[o]);
    }
    free(v);
    return O;
}

/* ---- inputs in several layouts -------------------------------------------------------- */
enum { L_CONTIG, L_NONCONTIG, L_TRANSPOSED, L_EXPANDED, L_COUNT };
static const char *layout_name[] = {"contiguous", "noncontig", "transposed", "expanded"};

/* A tensor of shape holding vals in layout (vals may be rewritten to fit an
 * expanded layout); NULL when the layout does not apply to the shape. */
static ct_tensor *make_input(double *vals, int nd, const int64_t *shape, ct_dtype dt, int layout) {
    int64_t n = tu_numel(nd, shape);
    if (layout == L_CONTIG) return tu_from_f64(vals, nd, shape, dt);
    if (layout == L_NONCONTIG) {
        ct_tensor *t = tu_from_f64(vals, nd, shape, dt);
        ct_tensor *v = tu_noncontig(t);
        ct_tensor_release(t);
        return v;
    }
    if (layout == L_TRANSPOSED) {
        if (nd < 2) return NULL;
        int64_t ts[CT_MAX_DIMS];
        memcpy(ts, shape, (size_t)nd * sizeof *ts);
        ts[0] = shape[nd - 1];
        ts[nd - 1] = shape[0];
        double *b = malloc((size_t)(n > 0 ? n : 1) * sizeof *b);
        for (int64_t i = 0; i < n; i++) {
            /* i indexes b (shape ts); swap coords 0 and nd-1 to index vals. */
            int64_t c[CT_MAX_DIMS], r = i;
            for (int d = nd - 1; d >= 0; d--) {
                c[d] = r % ts[d];
                r /= ts[d];
            }
            int64_t t = c[0];
            c[0] = c[nd - 1];
            c[nd - 1] = t;
            int64_t lin = 0;
            for (int d = 0; d < nd; d++) lin = lin * shape[d] + c[d];
            b[i] = vals[lin];
        }
        ct_tensor *bt = tu_from_f64(b, nd, ts, dt);
        free(b);
        ct_tensor *v = ct_transpose(bt, 0, nd - 1);
        ct_tensor_release(bt);
        return v;
    }
    /* expanded along dim 0 from a size-1 dim */
    if (nd < 1 || shape[0] < 2) return NULL;
    int64_t inner = n / shape[0];
    for (int64_t i = inner; i < n; i++) vals[i] = vals[i % inner];
    int64_t ss[CT_MAX_DIMS];
    memcpy(ss, shape, (size_t)nd * sizeof *ss);
    ss[0] = 1;
    ct_tensor *s = tu_from_f64(vals, nd, ss, dt);
    ct_tensor *v = ct_expand(s, nd, shape);
    ct_tensor_release(s);
    return v;
}

/* ---- the sweep ------------------------------------------------------------------------------- */
static const int64_t shapes[][CT_MAX_DIMS + 1] = {
    /* ndim, sizes... */
    {0}, {1, 1}, {1, 7}, {1, 0}, {2, 3, 4}, {2, 1, 5}, {2, 2, 0}, {3, 2, 1, 5}, {3, 4, 3, 6},
    {4, 3, 2, 4, 3}, {2, 37, 19}, {2, 5, 300}, {2, 300, 5}, {3, 2, 0, 3},
};

static double tol_rtol(ct_dtype dt) { return tu_rtol(dt); }
static double tol_atol(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-12;
    case CT_F32: return 1e-6;
    case CT_F16: return 1e-3;
    case CT_BF16: return 1e-2;
    default: return 0;
    }
}

typedef struct sweep_stats {
    int64_t checked;
} sweep_stats;

/* Checks one call against the reference; returns false (after printing the
 * case) on a mismatch. */
static bool check_case(tkind k, double param, ct_dtype dt, double *vals, int nd,
                       const int64_t *shape, int ndims, const int64_t *dims, bool keepdim,
                       int layout) {
    ct_tensor *x = make_input(vals, nd, shape, dt, layout);
    if (!x) return true;
    unsigned mask = 0;
    if (ndims == 0) mask = nd ? (1u << nd) - 1 : 0;
    for (int i = 0; i < ndims; i++)
        if (nd) mask |= 1u << (dims[i] < 0 ? dims[i] + nd : dims[i]);

    int64_t O = 1;
    for (int d = 0; d < nd; d++)
        if (!(mask >> d & 1)) O *= shape[d];
    double *ref = malloc((size_t)(O > 0 ? O : 1) * sizeof *ref);
    int64_t *ridx = malloc((size_t)(O > 0 ? O : 1) * sizeof *ridx);
    ref_reduce(k, param, dt, vals, nd, shape, mask, ref, ridx);

    ct_tensor *idx = NULL;
    bool want_idx = (k == T_MAXD || k == T_MIND) && (tu_next() & 1);
    ct_tensor *y = run_op(k, x, ndims, dims, keepdim, param, want_idx ? &idx : NULL);
    bool ok = y != NULL;
    char why[160] = "";
    if (!ok) snprintf(why, sizeof why, "error: %s", ct_last_error());

    /* shape and dtype */
    bool kd = keepdim && !kind_all_only(k);
    int end = 0;
    int64_t es[CT_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        if (!(mask >> d & 1)) es[end++] = shape[d];
        else if (kd) es[end++] = 1;
    }
    ct_dtype edt = dt;
    if ((k == T_SUM || k == T_PROD) && !ct_dtype_is_floating(dt)) edt = CT_I64;
    if (k == T_ARGMAX || k == T_ARGMIN || k == T_ARGMAX_ALL || k == T_ARGMIN_ALL) edt = CT_I64;
    if (ok && (ct_tensor_ndim(y) != end || ct_tensor_dtype(y) != edt ||
               memcmp(ct_tensor_shape(y), es, (size_t)end * sizeof *es) != 0)) {
        ok = false;
        snprintf(why, sizeof why, "result is %s %s, expected %s %s",
                 cti_shape_s(ct_tensor_ndim(y), ct_tensor_shape(y)),
                 ct_dtype_name(ct_tensor_dtype(y)), cti_shape_s(end, es), ct_dtype_name(edt));
    }
    if (ok && want_idx && (!idx || ct_tensor_dtype(idx) != CT_I64 || ct_tensor_ndim(idx) != end)) {
        ok = false;
        snprintf(why, sizeof why, "indices missing or wrong");
    }
    if (ok) {
        double *got = tu_values(y);
        bool index_out = k == T_ARGMAX || k == T_ARGMIN || k == T_ARGMAX_ALL || k == T_ARGMIN_ALL;
        for (int64_t o = 0; o < O && ok; o++) {
            double r = index_out ? (double)ridx[o] : ref[o];
            double g = got[o];
            if (!index_out && ct_dtype_is_floating(edt)) r = tu_round(r, edt);
            double rt = kind_extreme(k) ? 0 : tol_rtol(edt), at = kind_extreme(k) ? 0 : tol_atol(edt);
            bool good = isnan(r) ? isnan(g) : isinf(r) ? g == r : fabs(g - r) <= at + rt * fabs(r);
            if (!good) {
                ok = false;
                snprintf(why, sizeof why, "output %lld: got %.17g, expected %.17g", (long long)o,
                         g, r);
            }
        }
        free(got);
        if (ok && want_idx) {
            double *gi = tu_values(idx);
            for (int64_t o = 0; o < O && ok; o++)
                if (gi[o] != (double)ridx[o]) {
                    ok = false;
                    snprintf(why, sizeof why, "index %lld: got %g, expected %lld", (long long)o,
                             gi[o], (long long)ridx[o]);
                }
            free(gi);
        }
    }
    if (!ok) {
        char dl[64] = "";
        int p = 0;
        for (int i = 0; i < ndims; i++)
            p += snprintf(dl + p, sizeof dl - (size_t)p, "%lld ", (long long)dims[i]);
        fprintf(stderr, "case %s(p=%g) %s shape %s dims {%s} keepdim %d %s: %s\n", kind_name[k],
                param, ct_dtype_name(dt), cti_shape_s(nd, shape), dl, keepdim,
                layout_name[layout], why);
    }
    ct_tensor_release(idx);
    ct_tensor_release(y);
    ct_tensor_release(x);
    free(ref);
    free(ridx);
    return ok;
}

/* Fresh values for kind k: products stay near 1 so they neither overflow nor
 * vanish; integer products wrap the same way here and in the library. */
static double *values_for(tkind k, ct_dtype dt, int64_t n) {
    if (k == T_PROD) return ct_dtype_is_floating(dt) ? tu_rand_vals(n, dt, 0.8, 1.25)
                                                     : tu_rand_vals(n, dt, -2, 3);
    if (ct_dtype_is_floating(dt)) return tu_rand_vals(n, dt, -2, 2);
    return tu_rand_vals(n, dt, -50, 50);
}

static int dim_lists(int nd, int64_t lists[][3], int *lens) {
    int m = 0;
    lens[m++] = 0; /* all dims */
    if (nd == 0) {
        lists[m][0] = 0, lens[m++] = 1;
        lists[m][0] = -1, lens[m++] = 1;
        return m;
    }
    for (int d = 0; d < nd; d++) {
        lists[m][0] = d, lens[m++] = 1;
        lists[m][0] = d - nd, lens[m++] = 1;
    }
    if (nd >= 2) {
        lists[m][0] = -1, lists[m][1] = 0, lens[m++] = 2;
        lists[m][0] = 0, lists[m][1] = nd - 1, lens[m++] = 2;
    }
    if (nd >= 3) {
        lists[m][0] = 0, lists[m][1] = 2, lens[m++] = 2;
        lists[m][0] = 2, lists[m][1] = -nd + 1, lens[m++] = 2;
        lists[m][0] = 0, lists[m][1] = 1, lists[m][2] = nd - 1, lens[m++] = 3;
    }
    return m;
}

static void sweep(tkind k, const double *params, int nparams) {
    int failures = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int nd = (int)shapes[s][0];
        const int64_t *shape = &shapes[s][1];
        int64_t n = tu_numel(nd, shape);
        int64_t lists[32][3];
        int lens[32];
        int nl = dim_lists(nd, lists, lens);
        for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++) {
            ct_dtype dt = tu_all_dtypes[t];
            if (kind_float_only(k) && !ct_dtype_is_floating(dt)) continue;
            for (int pi = 0; pi < nparams; pi++) {
                double param = params[pi];
                for (int li = 0; li < nl; li++) {
                    if (kind_single_dim(k) && lens[li] != 1) continue;
                    if (kind_all_only(k) && lens[li] != 0) continue;
                    /* Reductions over nothing are errors for max/min and some norms. */
                    unsigned mask = 0;
                    if (lens[li] == 0) mask = nd ? (1u << nd) - 1 : 0;
                    for (int i = 0; i < lens[li]; i++)
                        if (nd) mask |= 1u << (lists[li][i] < 0 ? lists[li][i] + nd : lists[li][i]);
                    bool empty = false;
                    for (int d = 0; d < nd; d++)
                        if ((mask >> d & 1) && shape[d] == 0) empty = true;
                    if (empty && kind_extreme(k)) continue;
                    if (empty && k == T_NORM && (param < 0 || param == INFINITY)) continue;
                    for (int keep = 0; keep < 2; keep++) {
                        if (keep && kind_all_only(k)) continue;
                        for (int layout = 0; layout < L_COUNT; layout++) {
                            double *vals = values_for(k, dt, n);
                            if (!check_case(k, param, dt, vals, nd, shape, lens[li], lists[li],
                                            keep, layout))
                                failures++;
                            free(vals);
                        }
                    }
                }
            }
        }
    }
    assert_int_equal(failures, 0);
}

static const double no_param[] = {0};

static void test_sum(void **st) { (void)st; sweep(T_SUM, no_param, 1); }
static void test_mean(void **st) { (void)st; sweep(T_MEAN, no_param, 1); }
static void test_prod(void **st) { (void)st; sweep(T_PROD, no_param, 1); }
static void test_var(void **st) {
    (void)st;
    const double corr[] = {1, 0, 2.5};
    sweep(T_VAR, corr, 3);
}
static void test_std(void **st) {
    (void)st;
    const double corr[] = {1, 0};
    sweep(T_STD, corr, 2);
}
static void test_norm(void **st) {
    (void)st;
    const double p[] = {2, 1, INFINITY, -INFINITY, 0, 3, 0.5, -1.5};
    sweep(T_NORM, p, 8);
}
static void test_max_min_dim(void **st) {
    (void)st;
    sweep(T_MAXD, no_param, 1);
    sweep(T_MIND, no_param, 1);
}
static void test_argmax_argmin(void **st) {
    (void)st;
    sweep(T_ARGMAX, no_param, 1);
    sweep(T_ARGMIN, no_param, 1);
}
static void test_all_extremes(void **st) {
    (void)st;
    sweep(T_MAX, no_param, 1);
    sweep(T_MIN, no_param, 1);
    sweep(T_ARGMAX_ALL, no_param, 1);
    sweep(T_ARGMIN_ALL, no_param, 1);
}

/* Large inputs take the chunked and column paths; checked against the
 * reference in every layout for a few ops. */
static void test_large_paths(void **st) {
    (void)st;
    static const int64_t big[][3] = {{2, 3, 70001}, {2, 70001, 3}, {2, 9000, 40}, {2, 40, 9000},
                                     {1, 200003, 0}};
    const tkind kinds[] = {T_SUM, T_VAR, T_NORM, T_MAXD, T_ARGMIN, T_ARGMAX_ALL, T_PROD};
    int failures = 0;
    for (size_t s = 0; s < sizeof big / sizeof big[0]; s++) {
        int nd = (int)big[s][0];
        const int64_t *shape = &big[s][1];
        int64_t n = tu_numel(nd, shape);
        for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
            tkind k = kinds[ki];
            ct_dtype dt = (s + ki) % 2 ? CT_F32 : CT_BF16;
            if (k == T_ARGMIN) dt = CT_I32; /* many ties */
            if (k == T_PROD) dt = CT_F64;
            for (int d = -1; d < nd; d++) {
                int64_t dims[1] = {d < 0 ? 0 : d};
                int ndims = d < 0 ? 0 : 1;
                if (kind_single_dim(k) && ndims == 0) continue;
                if (kind_all_only(k) && ndims != 0) continue;
                for (int layout = 0; layout < L_COUNT; layout += (layout == 0 ? 1 : 2)) {
                    double *vals = values_for(k, dt, n);
                    if (k == T_ARGMIN)
                        for (int64_t i = 0; i < n; i++) vals[i] = (double)(int64_t)(vals[i] / 10);
                    /* Long products stay finite only very near 1 (the order of the
                     * factors decides where a double overflows). */
                    if (k == T_PROD)
                        for (int64_t i = 0; i < n; i++) vals[i] = tu_round(1 + (vals[i] - 1) / 64, dt);
                    if (!check_case(k, k == T_NORM ? 2 : 1, dt, vals, nd, shape, ndims, dims,
                                    d == 0, layout))
                        failures++;
                    free(vals);
                }
            }
        }
    }
    assert_int_equal(failures, 0);
}

/* ---- accuracy ----------------------------------------------------------------------------- */
static double item(ct_tensor *t) {
    double v = NAN;
    assert_non_null(t);
    assert_int_equal(ct_tensor_item(t, &v), CT_OK);
    return v;
}

static void test_sum_accuracy_f32(void **st) {
    (void)st;
    const int64_t n = 10000000;
    float *buf = malloc((size_t)n * sizeof *buf);
    assert_non_null(buf);
    long double exact = 0;
    for (int64_t i = 0; i < n; i++) {
        buf[i] = (float)(1.0 + tu_uniform(-1e-3, 1e-3));
        exact += buf[i];
    }
    ct_tensor *x = ct_tensor_from_data(buf, CT_F32, 1, &n);
    free(buf);
    assert_non_null(x);
    ct_tensor *s = ct_sum(x, CT_NONE, false);
    double got = item(s);
    assert_true(fabs(got - (double)exact) <= 1e-6 * (double)exact);
    ct_tensor *m = ct_mean(x, CT_NONE, false);
    assert_true(fabs(item(m) - (double)(exact / n)) <= 1e-6);
    /* The same data as [1000, 10000] summed over the first dim (column path). */
    ct_tensor *v = ct_view(x, CT_SHAPE(1000, 10000));
    ct_tensor *cs = ct_sum(v, CT_DIMS(0), false);
    ct_tensor *total = ct_sum(cs, CT_NONE, false);
    assert_true(fabs(item(total) - (double)exact) <= 1e-6 * (double)exact);
    ct_tensor_release(total);
    ct_tensor_release(cs);
    ct_tensor_release(v);
    ct_tensor_release(m);
    ct_tensor_release(s);
    ct_tensor_release(x);
}

/* f16/bf16 accumulate in at least f32: a plain f16 accumulator stalls at 2048. */
static void test_sum_accuracy_half(void **st) {
    (void)st;
    const ct_dtype dts[] = {CT_F16, CT_BF16};
    for (int t = 0; t < 2; t++) {
        int64_t n = 6000;
        double *vals = tu_rand_vals(n, dts[t], 0.5, 1.5);
        double exact = 0;
        for (int64_t i = 0; i < n; i++) exact += vals[i];
        ct_tensor *x = tu_from_f64(vals, 1, &n, dts[t]);
        ct_tensor *s = ct_sum(x, CT_NONE, false);
        assert_int_equal(ct_tensor_dtype(s), dts[t]);
        assert_true(fabs(item(s) - exact) <= tu_rtol(dts[t]) * exact);
        ct_tensor *m = ct_mean(x, CT_NONE, false);
        assert_int_equal(ct_tensor_dtype(m), dts[t]);
        assert_true(fabs(item(m) - exact / n) <= tu_rtol(dts[t]));
        ct_tensor_release(m);
        ct_tensor_release(s);
        ct_tensor_release(x);
        free(vals);
    }
}

static void test_var_stability(void **st) {
    (void)st;
    struct { ct_dtype dt; double mean; } cases[] = {{CT_F32, 1e4}, {CT_F64, 1e4}, {CT_F64, 1e9}};
    for (int c = 0; c < 3; c++) {
        int64_t n = 100000;
        double *vals = malloc((size_t)n * sizeof *vals);
        for (int64_t i = 0; i < n; i++) {
            /* mean + N(0,1) by Box-Muller */
            double u1 = tu_uniform(1e-12, 1), u2 = tu_uniform(0, 1);
            vals[i] = tu_round(cases[c].mean + sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2),
                               cases[c].dt);
        }
        long double m = 0, m2 = 0;
        for (int64_t i = 0; i < n; i++) m += vals[i];
        m /= n;
        for (int64_t i = 0; i < n; i++) m2 += (vals[i] - m) * (vals[i] - m);
        double ref = (double)(m2 / (n - 1));
        assert_true(ref > 0.5 && ref < 2);
        ct_tensor *x = tu_from_f64(vals, 1, &n, cases[c].dt);
        double tol = cases[c].dt == CT_F32 ? 1e-5 : cases[c].mean > 1e6 ? 1e-6 : 1e-9;
        ct_tensor *v = ct_var(x, CT_NONE, 1, false);
        assert_true(fabs(item(v) - ref) <= tol * ref);
        ct_tensor *s = ct_std(x, CT_NONE, 1, false);
        assert_true(fabs(item(s) - sqrt(ref)) <= tol * sqrt(ref));
        /* Column layout ([n/10, 10] over dim 0) against its own reference. */
        ct_tensor *x2 = ct_view(x, CT_SHAPE(n / 10, 10));
        ct_tensor *vc = ct_var(x2, CT_DIMS(0), 0, false);
        double *got = tu_values(vc);
        for (int j = 0; j < 10; j++) {
            long double cm = 0, cm2 = 0;
            for (int64_t i = 0; i < n / 10; i++) cm += vals[i * 10 + j];
            cm /= n / 10;
            for (int64_t i = 0; i < n / 10; i++)
                cm2 += (vals[i * 10 + j] - cm) * (vals[i * 10 + j] - cm);
            double r = (double)(cm2 / (n / 10));
            assert_true(fabs(got[j] - r) <= tol * r);
        }
        free(got);
        ct_tensor_release(vc);
        ct_tensor_release(x2);
        ct_tensor_release(s);
        ct_tensor_release(v);
        ct_tensor_release(x);
        free(vals);
    }
}

/* ---- special values ---------------------------------------------------------------------------- */
static ct_tensor *f64_tensor(const double *v, int nd, const int64_t *shape, ct_dtype dt) {
    ct_tensor *t = tu_from_f64(v, nd, shape, dt);
    assert_non_null(t);
    return t;
}

static int64_t item_i(ct_tensor *t) { return (int64_t)item(t); }

static void test_nan(void **st) {
    (void)st;
    for (size_t t = 0; t < 4; t++) {
        ct_dtype dt = tu_float_dtypes[t];
        const double v[] = {1, NAN, 5, NAN, -3, 7};
        ct_tensor *x = f64_tensor(v, 1, (int64_t[]){6}, dt);
        ct_tensor *r;
        r = ct_max(x); assert_true(isnan(item(r))); ct_tensor_release(r);
        r = ct_min(x); assert_true(isnan(item(r))); ct_tensor_release(r);
        r = ct_sum(x, CT_NONE, false); assert_true(isnan(item(r))); ct_tensor_release(r);
        r = ct_norm(x, INFINITY, CT_NONE, false); assert_true(isnan(item(r))); ct_tensor_release(r);
        r = ct_argmax_all(x); assert_int_equal(item_i(r), 1); ct_tensor_release(r);
        r = ct_argmin_all(x); assert_int_equal(item_i(r), 1); ct_tensor_release(r);
        ct_tensor *idx = NULL;
        r = ct_max_dim(x, 0, false, &idx);
        assert_true(isnan(item(r)));
        assert_int_equal(item_i(idx), 1);
        ct_tensor_release(idx);
        ct_tensor_release(r);
        ct_tensor_release(x);

        /* Along each dim of a matrix, and with the NaN late in a long row. */
        const double m[] = {3, 9, 2, NAN, 4, 8, 1, 1, NAN, 0, 5, NAN};
        ct_tensor *xm = f64_tensor(m, 2, (int64_t[]){3, 4}, dt);
        ct_tensor *a0 = ct_argmax(xm, 0, false), *a1 = ct_argmin(xm, 1, false);
        ct_tensor *m0 = ct_max_dim(xm, 0, false, NULL);
        double *g0 = tu_values(a0), *g1 = tu_values(a1), *gm = tu_values(m0);
        const double e0[] = {2, 0, 2, 0}, e1[] = {3, 2, 0};
        tu_assert_close(g0, e0, 4, 0, 0);
        tu_assert_close(g1, e1, 3, 0, 0);
        assert_true(isnan(gm[0]) && gm[1] == 9 && gm[2] == 5 && isnan(gm[3]));
        free(g0), free(g1), free(gm);
        ct_tensor_release(a0), ct_tensor_release(a1), ct_tensor_release(m0), ct_tensor_release(xm);

        int64_t n = 100000;
        double *big = tu_rand_vals(n, dt, -1, 1);
        big[77777] = NAN;
        big[88888] = NAN;
        big[5] = 100;
        ct_tensor *xb = f64_tensor(big, 1, &n, dt);
        r = ct_argmax_all(xb); assert_int_equal(item_i(r), 77777); ct_tensor_release(r);
        r = ct_max(xb); assert_true(isnan(item(r))); ct_tensor_release(r);
        r = ct_min(xb); assert_true(isnan(item(r))); ct_tensor_release(r);
        ct_tensor_release(xb);
        free(big);
    }
    /* Infinities are ordinary values. */
    const double v[] = {-INFINITY, -INFINITY, -INFINITY};
    ct_tensor *x = f64_tensor(v, 1, (int64_t[]){3}, CT_F32);
    ct_tensor *r = ct_max(x);
    assert_true(isinf(item(r)) && item(r) < 0);
    ct_tensor_release(r);
    r = ct_argmax_all(x); assert_int_equal(item_i(r), 0); ct_tensor_release(r);
    ct_tensor_release(x);
}

static void test_ties(void **st) {
    (void)st;
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++) {
        ct_dtype dt = tu_all_dtypes[t];
        const double v[] = {0, 1, 1, 0, 1, 0};
        ct_tensor *x = f64_tensor(v, 1, (int64_t[]){6}, dt);
        ct_tensor *r;
        r = ct_argmax_all(x); assert_int_equal(item_i(r), 1); ct_tensor_release(r);
        r = ct_argmin_all(x); assert_int_equal(item_i(r), 0); ct_tensor_release(r);
        ct_tensor_release(x);
        /* [[1, 0], [1, 1], [0, 1]]: columns tie at different rows. */
        const double m[] = {1, 0, 1, 1, 0, 1};
        ct_tensor *xm = f64_tensor(m, 2, (int64_t[]){3, 2}, dt);
        ct_tensor *idx = NULL;
        ct_tensor *mx = ct_max_dim(xm, 0, true, &idx);
        double *gi = tu_values(idx);
        assert_true(gi[0] == 0 && gi[1] == 1);
        free(gi);
        ct_tensor_release(idx);
        ct_tensor_release(mx);
        ct_tensor *mn = ct_argmin(xm, -2, false);
        gi = tu_values(mn);
        assert_true(gi[0] == 2 && gi[1] == 0);
        free(gi);
        ct_tensor_release(mn);
        ct_tensor_release(xm);
    }
    /* Ties across chunk boundaries of long rows and long columns. */
    int64_t n = 300000;
    double *z = calloc((size_t)n, sizeof *z);
    z[150001] = 2;
    z[70000] = 2;
    z[299999] = 2;
    ct_tensor *x = f64_tensor(z, 1, &n, CT_I64);
    ct_tensor *r = ct_argmax_all(x);
    assert_int_equal(item_i(r), 70000);
    ct_tensor_release(r);
    ct_tensor *xc = ct_view(x, CT_SHAPE(100000, 3));
    r = ct_argmax(xc, 0, false);
    double *g = tu_values(r);
    /* 70000 = row 23333 col 1; 150001 = row 50000 col 1; 299999 = row 99999 col 2 */
    assert_true(g[0] == 0 && g[1] == 23333 && g[2] == 99999);
    free(g);
    ct_tensor_release(r);
    ct_tensor_release(xc);
    /* 70000 = row 17500 col 0; 150001 = row 37500 col 1; 299999 = row 74999 col 3 */
    xc = ct_view(x, CT_SHAPE(75000, 4));
    ct_tensor *idx = NULL;
    r = ct_max_dim(xc, 0, false, &idx);
    g = tu_values(idx);
    assert_true(g[0] == 17500 && g[1] == 37500 && g[2] == 0 && g[3] == 74999);
    free(g);
    ct_tensor_release(idx);
    ct_tensor_release(r);
    ct_tensor_release(xc);
    ct_tensor_release(x);
    free(z);
}

static void test_empty_and_scalars(void **st) {
    (void)st;
    ct_tensor *e = ct_tensor_zeros(CT_SHAPE(2, 0), CT_F32, CT_CPU);
    ct_tensor *r;
    r = ct_sum(e, CT_DIMS(1), false);
    double *g = tu_values(r);
    assert_int_equal(ct_tensor_numel(r), 2);
    assert_true(g[0] == 0 && g[1] == 0);
    free(g);
    ct_tensor_release(r);
    r = ct_prod(e, CT_NONE, false); assert_true(item(r) == 1); ct_tensor_release(r);
    r = ct_mean(e, CT_NONE, false); assert_true(isnan(item(r))); ct_tensor_release(r);
    r = ct_var(e, CT_NONE, 0, false); assert_true(isnan(item(r))); ct_tensor_release(r);
    r = ct_norm(e, 2, CT_NONE, false); assert_true(item(r) == 0); ct_tensor_release(r);
    /* A reduction over a non-empty dim of an empty tensor is empty, not an error. */
    r = ct_max_dim(e, 0, false, NULL);
    assert_non_null(r);
    assert_int_equal(ct_tensor_numel(r), 0);
    ct_tensor_release(r);
    ct_tensor_release(e);

    /* var with too few elements: m2 / max(0, n - correction) */
    const double one[] = {4};
    ct_tensor *x1 = f64_tensor(one, 1, (int64_t[]){1}, CT_F64);
    r = ct_var(x1, CT_NONE, 1, false); assert_true(isnan(item(r))); ct_tensor_release(r);
    r = ct_var(x1, CT_NONE, 0, false); assert_true(item(r) == 0); ct_tensor_release(r);
    ct_tensor_release(x1);
    const double two[] = {1, 2};
    ct_tensor *x2 = f64_tensor(two, 1, (int64_t[]){2}, CT_F64);
    r = ct_var(x2, CT_NONE, 2, false); assert_true(isinf(item(r))); ct_tensor_release(r);
    r = ct_var(x2, CT_NONE, 0, false); assert_true(item(r) == 0.25); ct_tensor_release(r);
    r = ct_std(x2, CT_NONE, 1, false); assert_true(fabs(item(r) - sqrt(0.5)) < 1e-15); ct_tensor_release(r);
    ct_tensor_release(x2);

    /* 0-d inputs: dims 0 and -1 are accepted and reduce nothing. */
    ct_tensor *s = ct_tensor_scalar(-2.5, CT_F32, CT_CPU);
    r = ct_sum(s, CT_DIMS(-1), true);
    assert_int_equal(ct_tensor_ndim(r), 0);
    assert_true(item(r) == -2.5);
    ct_tensor_release(r);
    ct_tensor *idx = NULL;
    r = ct_max_dim(s, 0, false, &idx);
    assert_true(item(r) == -2.5 && item_i(idx) == 0);
    ct_tensor_release(idx);
    ct_tensor_release(r);
    r = ct_argmin_all(s); assert_int_equal(item_i(r), 0); ct_tensor_release(r);
    r = ct_norm(s, 1, CT_NONE, false); assert_true(item(r) == 2.5); ct_tensor_release(r);
    ct_tensor_release(s);

    /* bool: sum counts, max is any, min is all. */
    const double b[] = {0, 1, 1, 0, 1};
    ct_tensor *xb = f64_tensor(b, 1, (int64_t[]){5}, CT_BOOL);
    r = ct_sum(xb, CT_NONE, false);
    assert_int_equal(ct_tensor_dtype(r), CT_I64);
    assert_int_equal(item_i(r), 3);
    ct_tensor_release(r);
    r = ct_max(xb); assert_int_equal(ct_tensor_dtype(r), CT_BOOL); assert_true(item(r) == 1); ct_tensor_release(r);
    r = ct_min(xb); assert_true(item(r) == 0); ct_tensor_release(r);
    ct_tensor_release(xb);

    /* int64 sums are exact beyond 2^53 and wrap like PyTorch's. */
    int64_t iv[] = {(int64_t)1 << 60, 3, (int64_t)1 << 60, INT64_MAX};
    ct_tensor *xi = ct_tensor_from_data(iv, CT_I64, 1, (int64_t[]){3});
    r = ct_sum(xi, CT_NONE, false);
    int64_t got;
    assert_int_equal(ct_tensor_copy_to_host(r, &got, sizeof got), CT_OK);
    assert_true(got == ((int64_t)1 << 61) + 3);
    ct_tensor_release(r);
    ct_tensor_release(xi);
    xi = ct_tensor_from_data(iv + 3, CT_I64, 1, (int64_t[]){1});
    ct_tensor *xe = ct_expand(xi, 1, (int64_t[]){2});
    r = ct_sum(xe, CT_NONE, false);
    assert_int_equal(ct_tensor_copy_to_host(r, &got, sizeof got), CT_OK);
    assert_true(got == -2);
    ct_tensor_release(r);
    ct_tensor_release(xe);
    ct_tensor_release(xi);
}

/* ---- errors ------------------------------------------------------------------------------------------ */
static void test_errors(void **st) {
    (void)st;
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, NULL);
    ct_tensor *xi = tu_rand(CT_SHAPE(2, 3), CT_I64, -5, 5, NULL);
    cti_alloc_stats before = cti_get_alloc_stats();
    ct_tensor *sentinel = (ct_tensor *)&before;
    ct_tensor *idx = sentinel;

    tu_assert_null_error(ct_sum(NULL, CT_NONE, false), CT_ERR_INVALID_ARG, "ct_sum", "NULL");
    tu_assert_null_error(ct_argmax_all(NULL), CT_ERR_INVALID_ARG, "ct_argmax_all");
    tu_assert_null_error(ct_sum(x, CT_DIMS(1, 1), false), CT_ERR_INVALID_ARG,
                         "ct_sum: dim 1 appears multiple times in the list of dims");
    tu_assert_null_error(ct_mean(x, CT_DIMS(-1, 1), false), CT_ERR_INVALID_ARG, "ct_mean",
                         "dim 1 appears multiple times");
    tu_assert_null_error(ct_sum(x, CT_DIMS(2), false), CT_ERR_INDEX, "ct_sum", "dim 2", "2-d",
                         "[2, 3]");
    tu_assert_null_error(ct_var(x, CT_DIMS(0, -3), 1, false), CT_ERR_INDEX, "ct_var", "dim -3",
                         "2-d");
    tu_assert_null_error(ct_argmax(x, 5, false), CT_ERR_INDEX, "ct_argmax", "dim 5");
    tu_assert_null_error(ct_max_dim(x, -3, false, &idx), CT_ERR_INDEX, "ct_max_dim", "dim -3");
    assert_ptr_equal(idx, sentinel);
    tu_assert_null_error(ct_sum(x, -1, NULL, false), CT_ERR_INVALID_ARG, "ct_sum", "dims");
    tu_assert_null_error(ct_sum(x, 1, NULL, false), CT_ERR_INVALID_ARG, "ct_sum", "NULL");

    tu_assert_null_error(ct_mean(xi, CT_NONE, false), CT_ERR_DTYPE,
                         "ct_mean: expected a floating dtype, got int64");
    tu_assert_null_error(ct_var(xi, CT_NONE, 1, false), CT_ERR_DTYPE, "ct_var", "int64");
    tu_assert_null_error(ct_std(xi, CT_NONE, 1, false), CT_ERR_DTYPE, "ct_std", "floating");
    tu_assert_null_error(ct_norm(xi, 2, CT_NONE, false), CT_ERR_DTYPE, "ct_norm", "int64");
    ct_tensor *xb = ct_tensor_zeros(CT_SHAPE(3), CT_BOOL, CT_CPU);
    tu_assert_null_error(ct_mean(xb, CT_NONE, false), CT_ERR_DTYPE, "ct_mean", "bool");
    ct_tensor_release(xb);

    ct_tensor *e = ct_tensor_zeros(CT_SHAPE(2, 0), CT_F32, CT_CPU);
    before = cti_get_alloc_stats();
    tu_assert_null_error(ct_max(e), CT_ERR_SHAPE, "ct_max: cannot reduce over a zero-size dim 1 of [2, 0]");
    tu_assert_null_error(ct_min(e), CT_ERR_SHAPE, "ct_min", "zero-size dim 1");
    tu_assert_null_error(ct_max_dim(e, 1, false, &idx), CT_ERR_SHAPE, "ct_max_dim", "dim 1", "[2, 0]");
    assert_ptr_equal(idx, sentinel);
    tu_assert_null_error(ct_min_dim(e, -1, true, NULL), CT_ERR_SHAPE, "ct_min_dim", "zero-size");
    tu_assert_null_error(ct_argmax(e, 1, false), CT_ERR_SHAPE, "ct_argmax", "zero-size");
    tu_assert_null_error(ct_argmin(e, 1, true), CT_ERR_SHAPE, "ct_argmin", "zero-size");
    tu_assert_null_error(ct_argmax_all(e), CT_ERR_SHAPE, "ct_argmax_all", "zero-size");
    tu_assert_null_error(ct_argmin_all(e), CT_ERR_SHAPE, "ct_argmin_all", "zero-size");
    tu_assert_null_error(ct_norm(e, INFINITY, CT_NONE, false), CT_ERR_SHAPE, "ct_norm",
                         "zero-size", "[2, 0]");
    tu_assert_null_error(ct_norm(e, -1, CT_DIMS(1), false), CT_ERR_SHAPE, "ct_norm", "dim 1");
    tu_assert_null_error(ct_norm(x, NAN, CT_NONE, false), CT_ERR_INVALID_ARG, "ct_norm", "NaN");
    /* Failed calls allocate nothing that outlives them. */
    cti_alloc_stats after = cti_get_alloc_stats();
    assert_int_equal(after.live_tensors, before.live_tensors);
    assert_int_equal(after.live_storages, before.live_storages);
    ct_tensor_release(e);
    ct_tensor_release(xi);
    ct_tensor_release(x);
}

/* ---- threads ---------------------------------------------------------------------------------------------- */
static void same_bytes(ct_tensor *a, ct_tensor *b) {
    assert_non_null(a);
    assert_non_null(b);
    int64_t n = ct_tensor_numel(a);
    assert_int_equal(n, ct_tensor_numel(b));
    size_t nb = (size_t)n * ct_dtype_size(ct_tensor_dtype(a));
    assert_memory_equal(ct_tensor_data_ptr(a), ct_tensor_data_ptr(b), nb);
}

static void test_thread_count_independence(void **st) {
    (void)st;
    int saved = ct_get_num_threads();
    ct_tensor *x = tu_rand(CT_SHAPE(1500, 2001), CT_F32, -1, 1, NULL);
    ct_tensor *xt = ct_transpose(x, 0, 1);
    ct_tensor *xh = tu_rand(CT_SHAPE(3000000), CT_F16, -1, 1, NULL);
    ct_tensor *res[2][10];
    for (int t = 0; t < 2; t++) {
        assert_int_equal(ct_set_num_threads(t + 1), CT_OK);
        res[t][0] = ct_sum(x, CT_NONE, false);
        res[t][1] = ct_sum(x, CT_DIMS(0), false);
        res[t][2] = ct_sum(x, CT_DIMS(1), false);
        res[t][3] = ct_var(xt, CT_DIMS(1), 1, false);
        res[t][4] = ct_norm(x, 2, CT_NONE, false);
        res[t][5] = ct_argmax_all(xt);
        res[t][6] = ct_mean(xh, CT_NONE, false);
        res[t][7] = ct_var(x, CT_NONE, 1, false);
        res[t][8] = ct_std(x, CT_DIMS(0), 0, true);
        res[t][9] = ct_min_dim(x, 1, false, NULL);
    }
    assert_int_equal(ct_set_num_threads(saved), CT_OK);
    for (int i = 0; i < 10; i++) {
        same_bytes(res[0][i], res[1][i]);
        ct_tensor_release(res[0][i]);
        ct_tensor_release(res[1][i]);
    }
    ct_tensor_release(xh);
    ct_tensor_release(xt);
    ct_tensor_release(x);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mean, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prod, setup, teardown),
        cmocka_unit_test_setup_teardown(test_var, setup, teardown),
        cmocka_unit_test_setup_teardown(test_std, setup, teardown),
        cmocka_unit_test_setup_teardown(test_norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_min_dim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_argmax_argmin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_extremes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sum_accuracy_f32, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sum_accuracy_half, setup, teardown),
        cmocka_unit_test_setup_teardown(test_var_stability, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ties, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_and_scalars, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_thread_count_independence, setup, teardown),
    };
    return tu_run_tests(tests);
}
