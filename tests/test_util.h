/* Shared helpers for the cmocka tests: fresh random inputs, float64 copies of
 * tensors, closeness and error assertions. Include after cmocka.h. */
#ifndef CTEN_TEST_UTIL_H
#define CTEN_TEST_UTIL_H

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "tensor/tensor.h"

/* Seed: CT_TEST_SEED from the environment, else drawn from the clock; printed
 * once so a failure can be replayed. */
static uint64_t tu_state_;
static inline void tu_seed(void) {
    const char *e = getenv("CT_TEST_SEED");
    uint64_t s = e ? strtoull(e, NULL, 0)
                   : ((uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull) ^ (uint64_t)getpid() ^
                         (uint64_t)clock();
    if (s == 0) s = 1;
    tu_state_ = s;
    fprintf(stderr, "[ seed     ] CT_TEST_SEED=%llu\n", (unsigned long long)s);
}
static inline uint64_t tu_next(void) { /* xorshift64* */
    if (tu_state_ == 0) tu_seed();
    tu_state_ ^= tu_state_ >> 12;
    tu_state_ ^= tu_state_ << 25;
    tu_state_ ^= tu_state_ >> 27;
    return tu_state_ * 2685821657736338717ull;
}
static inline double tu_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((double)(tu_next() >> 11) * (1.0 / 9007199254740992.0));
}
static inline int64_t tu_randint(int64_t lo, int64_t hi) { /* [lo, hi) */
    return lo + (int64_t)(tu_next() % (uint64_t)(hi - lo));
}

static inline int64_t tu_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* Rounds v to what dtype can hold, as the library stores it. */
static inline double tu_round(double v, ct_dtype dt) {
    switch (dt) {
    case CT_F32: return (double)(float)v;
    case CT_F16: return ct_f16_to_f32(ct_f32_to_f16((float)v));
    case CT_BF16: return ct_bf16_to_f32(ct_f32_to_bf16((float)v));
    case CT_I32: case CT_I64: return (double)(int64_t)v;
    case CT_BOOL: return v != 0.0;
    default: return v;
    }
}

/* Writes n doubles into a buffer of dtype. */
static inline void tu_pack(const double *src, int64_t n, ct_dtype dt, void *dst) {
    for (int64_t i = 0; i < n; i++) {
        double v = src[i];
        switch (dt) {
        case CT_F32: ((float *)dst)[i] = (float)v; break;
        case CT_F64: ((double *)dst)[i] = v; break;
        case CT_F16: ((uint16_t *)dst)[i] = ct_f32_to_f16((float)v); break;
        case CT_BF16: ((uint16_t *)dst)[i] = ct_f32_to_bf16((float)v); break;
        case CT_I32: ((int32_t *)dst)[i] = (int32_t)v; break;
        case CT_I64: ((int64_t *)dst)[i] = (int64_t)v; break;
        case CT_BOOL: ((uint8_t *)dst)[i] = v != 0.0; break;
        default: break;
        }
    }
}
static inline void tu_unpack(const void *src, int64_t n, ct_dtype dt, double *dst) {
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case CT_F32: dst[i] = ((const float *)src)[i]; break;
        case CT_F64: dst[i] = ((const double *)src)[i]; break;
        case CT_F16: dst[i] = ct_f16_to_f32(((const uint16_t *)src)[i]); break;
        case CT_BF16: dst[i] = ct_bf16_to_f32(((const uint16_t *)src)[i]); break;
        case CT_I32: dst[i] = ((const int32_t *)src)[i]; break;
        case CT_I64: dst[i] = (double)((const int64_t *)src)[i]; break;
        case CT_BOOL: dst[i] = ((const uint8_t *)src)[i]; break;
        default: dst[i] = NAN; break;
        }
    }
}

/* A CPU tensor of dtype holding vals (n = numel(shape)). */
static inline ct_tensor *tu_from_f64(const double *vals, int ndim, const int64_t *shape,
                                     ct_dtype dt) {
    int64_t n = tu_numel(ndim, shape);
    void *buf = malloc((size_t)(n > 0 ? n : 1) * 8);
    tu_pack(vals, n, dt, buf);
    ct_tensor *t = ct_tensor_from_data(buf, dt, ndim, shape);
    free(buf);
    return t;
}

/* Fresh uniform values in [lo, hi), rounded to dtype (integers: whole
 * numbers in [lo, hi)). Caller frees. */
static inline double *tu_rand_vals(int64_t n, ct_dtype dt, double lo, double hi) {
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        if (dt == CT_BOOL) v[i] = (double)(tu_next() & 1);
        else if (!ct_dtype_is_floating(dt)) v[i] = (double)tu_randint((int64_t)lo, (int64_t)hi);
        else v[i] = tu_round(tu_uniform(lo, hi), dt);
    }
    return v;
}

/* A random CPU tensor; *vals (if not NULL) receives its values in row-major
 * order as doubles (caller frees). */
static inline ct_tensor *tu_rand(int ndim, const int64_t *shape, ct_dtype dt, double lo,
                                 double hi, double **vals) {
    int64_t n = tu_numel(ndim, shape);
    double *v = tu_rand_vals(n, dt, lo, hi);
    ct_tensor *t = tu_from_f64(v, ndim, shape, dt);
    if (vals) *vals = v;
    else free(v);
    return t;
}

/* t's values in row-major order as doubles (caller frees). */
static inline double *tu_values(const ct_tensor *t) {
    int64_t n = ct_tensor_numel(t);
    ct_dtype dt = ct_tensor_dtype(t);
    size_t nb = (size_t)(n > 0 ? n : 1) * ct_dtype_size(dt);
    void *buf = malloc(nb);
    double *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    ct_status s = ct_tensor_copy_to_host(t, buf, nb);
    if (s != CT_OK) {
        fprintf(stderr, "tu_values: %s\n", ct_last_error());
        for (int64_t i = 0; i < n; i++) out[i] = NAN;
    } else {
        tu_unpack(buf, n, dt, out);
    }
    free(buf);
    return out;
}

/* The same values as t in a non-contiguous layout: a transposed view of a
 * larger storage (dims reversed, and every other element of the last dim used),
 * so strides differ from t's in every dim of size > 1. */
static inline ct_tensor *tu_noncontig(ct_tensor *t) {
    int nd = ct_tensor_ndim(t);
    if (nd == 0) return ct_tensor_retain(t);
    const int64_t *sh = ct_tensor_shape(t);
    int64_t rshape[CT_MAX_DIMS], perm[CT_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        rshape[i] = sh[nd - 1 - i];
        perm[i] = nd - 1 - i;
    }
    rshape[nd - 1] *= 2; /* room for a step-2 slice */
    ct_tensor *big = ct_tensor_zeros(nd, rshape, ct_tensor_dtype(t), ct_tensor_device(t));
    ct_tensor *sl = ct_slice(big, nd - 1, 0, rshape[nd - 1], 2);
    ct_tensor *v = ct_permute(sl, nd, perm);
    bool prev = ct_no_grad_begin(); /* the values only: a copy in grad mode would record */
    ct_copy_(v, t);
    ct_no_grad_end(prev);
    ct_tensor_release(sl);
    ct_tensor_release(big);
    return v;
}

/* Asserts |got - ref| <= atol + rtol * |ref| elementwise (NaN matches NaN,
 * infinities must match exactly). */
#define tu_assert_close(got, ref, n, rtol, atol) \
    tu_assert_close_((got), (ref), (n), (rtol), (atol), __FILE__, __LINE__)
static inline void tu_assert_close_(const double *got, const double *ref, int64_t n, double rtol,
                                    double atol, const char *file, int line) {
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        bool ok;
        if (isnan(r)) ok = isnan(g);
        else if (isinf(r)) ok = g == r;
        else ok = fabs(g - r) <= atol + rtol * fabs(r);
        if (!ok) {
            fprintf(stderr, "%s:%d: element %lld: got %.17g, expected %.17g (rtol %g atol %g)\n",
                    file, line, (long long)i, g, r, rtol, atol);
            _fail(file, line);
        }
    }
}

/* Asserts that got and ref have the same dtype and shape and the same bits in every
 * element (compared as the doubles tu_values gives, which hold every dtype exactly, so a
 * zero's sign counts and NaN matches only the same NaN); `what` names the pair. */
#define tu_assert_same_bits(what, got, ref) \
    tu_assert_same_bits_((what), (got), (ref), __FILE__, __LINE__)
static inline void tu_assert_same_bits_(const char *what, const ct_tensor *got, const ct_tensor *ref,
                                        const char *file, int line) {
    if (!got || !ref) {
        fprintf(stderr, "%s:%d: %s: %s is NULL (%s)\n", file, line, what, got ? "ref" : "got",
                ct_last_error());
        _fail(file, line);
    }
    if (ct_tensor_dtype(got) != ct_tensor_dtype(ref) || ct_tensor_ndim(got) != ct_tensor_ndim(ref) ||
        memcmp(ct_tensor_shape(got), ct_tensor_shape(ref),
               (size_t)ct_tensor_ndim(ref) * sizeof(int64_t)) != 0) {
        fprintf(stderr, "%s:%d: %s: dtype or shape differs\n", file, line, what);
        _fail(file, line);
    }
    int64_t n = ct_tensor_numel(ref);
    double *g = tu_values(got), *r = tu_values(ref);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&g[i], &r[i], sizeof(double)) != 0) {
            fprintf(stderr, "%s:%d: %s: element %lld: %.17g, expected %.17g\n", file, line, what,
                    (long long)i, g[i], r[i]);
            free(g);
            free(r);
            _fail(file, line);
        }
    free(g);
    free(r);
}

/* The library's trace (ct_set_trace) of the calls made between
 * tu_trace_begin and tu_trace_end, which returns it (the caller frees it):
 * stderr goes to a temporary file meanwhile. One capture at a time. */
typedef struct tu_trace {
    FILE *file;
    int saved_stderr;
    bool was_on;
} tu_trace;

static inline tu_trace tu_trace_begin(void) {
    tu_trace t;
    fflush(stderr);
    t.file = tmpfile();
    if (!t.file) _fail(__FILE__, __LINE__);
    t.saved_stderr = dup(fileno(stderr));
    if (t.saved_stderr < 0 || dup2(fileno(t.file), fileno(stderr)) < 0) _fail(__FILE__, __LINE__);
    t.was_on = ct_trace_enabled();
    ct_set_trace(true);
    return t;
}

static inline char *tu_trace_end(tu_trace *t) {
    ct_set_trace(t->was_on);
    fflush(stderr);
    dup2(t->saved_stderr, fileno(stderr));
    close(t->saved_stderr);
    long len = ftell(t->file);
    char *buf = calloc((size_t)(len > 0 ? len : 0) + 1, 1);
    rewind(t->file);
    if (!buf || (len > 0 && fread(buf, 1, (size_t)len, t->file) != (size_t)len))
        _fail(__FILE__, __LINE__);
    fclose(t->file);
    return buf;
}

/* Whether s occurs in the line of a trace that starts at l and ends at e (NULL: the end). */
static inline bool tu_line_has(const char *l, const char *e, const char *s) {
    const char *p = strstr(l, s);
    return p && (!e || p + strlen(s) <= e);
}

/* The number of lines of a trace that hold a, and b too unless b is NULL. */
static inline int tu_trace_lines(const char *log, const char *a, const char *b) {
    int n = 0;
    for (const char *l = log; l && *l;) {
        const char *e = strchr(l, '\n');
        if (tu_line_has(l, e, a) && (!b || tu_line_has(l, e, b))) n++;
        l = e ? e + 1 : NULL;
    }
    return n;
}

/* The unit roundoff of dt: half the distance from 1 to the next value. */
static inline double tu_unit_roundoff(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 0x1p-53;
    case CT_F32: return 0x1p-24;
    case CT_F16: return 0x1p-11;
    case CT_BF16: return 0x1p-8;
    default: return 0;
    }
}

/* Default tolerances per dtype for results of a few roundings. */
static inline double tu_rtol(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-12;
    case CT_F32: return 1e-5;
    case CT_F16: return 2e-3;
    case CT_BF16: return 1.6e-2;
    default: return 0;
    }
}

/* Asserts a failed call: status s equals expected and the message contains
 * every one of the given words. */
#define tu_assert_error(s, expected, ...)                                           \
    do {                                                                            \
        const char *tu_words_[] = {__VA_ARGS__, NULL};                              \
        assert_int_equal((int)(s), (int)(expected));                                \
        for (int tu_i_ = 0; tu_words_[tu_i_]; tu_i_++) {                            \
            if (!strstr(ct_last_error(), tu_words_[tu_i_])) {                       \
                fprintf(stderr, "message \"%s\" lacks \"%s\"\n", ct_last_error(),   \
                        tu_words_[tu_i_]);                                          \
                fail();                                                             \
            }                                                                       \
        }                                                                           \
    } while (0)
/* For calls returning a tensor: asserts NULL, then the status and words. */
#define tu_assert_null_error(t, expected, ...)                                      \
    do {                                                                            \
        assert_null(t);                                                             \
        tu_assert_error(ct_last_status(), expected, __VA_ARGS__);                   \
    } while (0)

static const ct_dtype tu_float_dtypes[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
static const ct_dtype tu_all_dtypes[] = {CT_F32, CT_F64, CT_F16, CT_BF16, CT_I32, CT_I64, CT_BOOL};

/* A test over dtypes as one cmocka test per dtype (so CT_TEST_SHARD can put
 * them in processes of their own): TU_EACH_DTYPE(f) is the group entries of
 * f for every dtype of tu_all_dtypes, TU_EACH_NUMERIC_DTYPE(f) for all but
 * bool, TU_EACH_FLOAT_DTYPE(f) for the floating ones, with the file's setup
 * and teardown; f reads its dtype with tu_dtype_of(state) and its position
 * in tu_all_dtypes with tu_dtype_index. */
#define TU_DTYPE_ENTRY_(f, k, nm) {#f " " nm, f, setup, teardown, (void *)&tu_all_dtypes[k]}
#define TU_EACH_FLOAT_DTYPE(f)                                                      \
    TU_DTYPE_ENTRY_(f, 0, "float32"), TU_DTYPE_ENTRY_(f, 1, "float64"),             \
        TU_DTYPE_ENTRY_(f, 2, "float16"), TU_DTYPE_ENTRY_(f, 3, "bfloat16")
#define TU_EACH_NUMERIC_DTYPE(f)                                                    \
    TU_EACH_FLOAT_DTYPE(f), TU_DTYPE_ENTRY_(f, 4, "int32"), TU_DTYPE_ENTRY_(f, 5, "int64")
#define TU_EACH_DTYPE(f) TU_EACH_NUMERIC_DTYPE(f), TU_DTYPE_ENTRY_(f, 6, "bool")
static inline ct_dtype tu_dtype_of(void **state) { return *(const ct_dtype *)*state; }
static inline size_t tu_dtype_index(void **state) {
    return (size_t)((const ct_dtype *)*state - tu_all_dtypes);
}

/* Removes dir and the files in it (a test's temporary folder; no subfolders). */
static inline void tu_rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Whether the program runs under compute-sanitizer's tool (memcheck,
 * racecheck), as scripts/gpu.sh says through CT_TEST_SANITIZER. */
static inline bool tu_under_tool(const char *tool) {
    const char *e = getenv("CT_TEST_SANITIZER");
    return e && !strcmp(e, tool);
}

/* Runs a program's group of tests, or one shard of it: CT_TEST_SHARD="i/n"
 * (0 <= i < n) runs the tests whose index in the group is i modulo n. A
 * program too slow to run whole under a tool (compute-sanitizer slows
 * kernels 10-100x) is split over n processes that run at once
 * (scripts/gpu.sh). A malformed value fails the program. */
static inline int tu_run_group(const char *name, const struct CMUnitTest *tests, size_t count) {
    const char *e = getenv("CT_TEST_SHARD");
    if (!e || !*e) return _cmocka_run_group_tests(name, tests, count, NULL, NULL);
    unsigned i, n;
    char tail;
    if (sscanf(e, "%u/%u%c", &i, &n, &tail) != 2 || n == 0 || i >= n) {
        fprintf(stderr, "CT_TEST_SHARD=%s: expected i/n with 0 <= i < n\n", e);
        return 1;
    }
    struct CMUnitTest *mine = malloc((count / n + 1) * sizeof *mine);
    if (!mine) return 1;
    size_t k = 0;
    for (size_t j = i; j < count; j += n) mine[k++] = tests[j];
    int rc = 0;
    if (k == 0)
        printf("[ shard    ] %s %u/%u: no tests (the group has %zu)\n", name, i, n, count);
    else
        rc = _cmocka_run_group_tests(name, mine, k, NULL, NULL);
    free(mine);
    return rc;
}
#define tu_run_tests(tests) tu_run_group(#tests, tests, sizeof(tests) / sizeof((tests)[0]))

#endif
