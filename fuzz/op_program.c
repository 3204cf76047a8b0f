/* Fuzz target: the input is a program over a small pool of CPU tensors.
 *
 * Each input byte stream is read as a sequence of instructions: create a
 * tensor, take a view with extreme integers (narrow, slice, select, expand,
 * permute, reshape, ... with values near INT64_MAX/MIN), run an elementwise,
 * in-place, reduction, matmul, conv/pool, norm, softmax or loss op (targets
 * out of range included), record and run backward (with recomputation on
 * or off), open and end scopes, retain and release handles, build parameter
 * lists and take optimizer steps.
 * Operands are drawn from the pool, so in-place ops meet their own views and
 * ops meet released-and-replaced handles as a real program would. After the
 * instructions, an epilogue that reads no input backpropagates from every
 * result with history and steps optimizers over the leaves with gradients.
 * OP_PROGRAM_TRACE=1 prints each call and its outcome, to read a finding.
 *
 * What is checked, besides what the sanitizers see:
 * - a call either succeeds or fails with a status (the one it returns, when
 *   it returns one, and the thread's ct_last_status) and a message that
 *   starts with the name of the public function called ("ct_...");
 * - every tensor that comes back stays inside its storage (offset and
 *   strides), has a numel that fits int64, and can be copied to the host;
 * - after the program, once the pool, scopes, parameter lists and optimizers
 *   are released, no tensor or storage is left alive (the library's own
 *   counters): a reference leaked by the library shows up here even when the
 *   memory is still reachable.
 * A violated check aborts, which the fuzzer reports as a crash.
 *
 * The programs run on one thread with the pool size at 1, so an input
 * replays exactly. Large allocations are refused (see __asan_default_options
 * below, and the address-space limit of the regression runner), so a program
 * that asks for a huge but valid tensor gets CT_ERR_OOM rather than slowing
 * the fuzzer down. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor_impl.h"
#include "tensor/tensor.h"

/* The fuzzer's own allocations and the library's both obey this: a request
 * above 64 MiB fails as out of memory instead of being served. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1:max_allocation_size_mb=64";
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NENT 16          /* handles in the pool */
#define MAX_SCOPES 4     /* scopes open at once */
#define MAX_STEPS 96     /* instructions per input */
#define SMALL_NUMEL 4096 /* larger tensors are only viewed, queried or used elementwise */

typedef struct entry {
    ct_tensor *t;
    int refs;   /* references the program holds besides a scope's */
    int sdepth; /* 1 + index of the scope owning the creation reference; 0: none */
} entry;

typedef struct prog {
    const uint8_t *p;
    size_t n, i;
    entry e[NENT];
    ct_scope *scopes[MAX_SCOPES];
    int depth;
    ct_params *params;
    ct_optimizer *opt;
    ct_nn_linear *layer;
    ct_generator *gen;
    const char *call; /* the public function being called, for messages */
} prog;

/* ---- reading the input ------------------------------------------------------------ */
static uint8_t u8(prog *g) { return g->i < g->n ? g->p[g->i++] : 0; }

static uint64_t raw64(prog *g) {
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v = v << 8 | u8(g);
    return v;
}

static const int64_t special_ints[] = {
    0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 100, 255, 256, 65536, 2097152, -1, -2, -3, -100,
    (int64_t)1 << 31, ((int64_t)1 << 31) - 1, -((int64_t)1 << 31), (int64_t)1 << 32,
    ((int64_t)1 << 32) + 1, (int64_t)1 << 40, (int64_t)1 << 62, ((int64_t)1 << 62) + 1,
    3037000499, 3037000500, INT64_MAX, INT64_MAX - 1, INT64_MAX / 2, INT64_MAX / 3,
    INT64_MIN, INT64_MIN + 1, INT64_MIN / 2, -INT64_MAX / 3};

/* Mostly small values, sometimes the edges of int64, sometimes raw bits. */
static int64_t pick_int(prog *g) {
    uint8_t b = u8(g);
    if (b < 0x80) return (int64_t)(b % 12) - 2;
    if (b < 0xF0) return special_ints[b % (sizeof special_ints / sizeof special_ints[0])];
    return (int64_t)raw64(g);
}

/* A dim argument: usually in range, sometimes far outside. */
static int pick_dim(prog *g) {
    uint8_t b = u8(g);
    if (b < 0xE0) return (int)(b % 12) - 6;
    static const int far[] = {INT_MIN, INT_MIN + 1, INT_MAX, INT_MAX - 1, 1 << 30, -(1 << 30),
                              CT_MAX_DIMS, -CT_MAX_DIMS - 1, 64, -65};
    return far[b % (sizeof far / sizeof far[0])];
}

static double pick_double(prog *g) {
    static const double special[] = {0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 0.1, 3.0, 1e-8, 1e-30,
                                     1e30, 1e308, -1e308, DBL_MIN, 4.9e-324, 9.3e18, -9.3e18,
                                     1e5, 0.999999, 1.0 + 1e-15};
    uint8_t b = u8(g);
    if (b < 0xC0) return special[b % (sizeof special / sizeof special[0])];
    if (b < 0xD0) return NAN;
    if (b < 0xE0) return b & 1 ? INFINITY : -INFINITY;
    uint64_t bits = raw64(g);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

static bool pick_bool(prog *g) { return u8(g) & 1; }

/* Any ct_dtype, sometimes one that is not. */
static ct_dtype pick_dtype(prog *g) {
    uint8_t b = u8(g);
    if (b < 0xF0) return (ct_dtype)(b % CT_NUM_DTYPES);
    return b & 1 ? CT_NUM_DTYPES : (ct_dtype)-1;
}

static ct_dtype pick_float_dtype(prog *g) {
    static const ct_dtype f[] = {CT_F32, CT_F64, CT_F32, CT_F16, CT_BF16};
    return f[u8(g) % 5];
}

/* An integer list (shape, dims) of fuzzer-chosen length, usually within
 * CT_MAX_DIMS. *n may come back negative or above CT_MAX_DIMS; the array
 * holds CT_MAX_DIMS + 2 values. Returns NULL (with *n as chosen) sometimes. */
static const int64_t *pick_list(prog *g, int *n, int64_t *buf, bool small_values) {
    uint8_t b = u8(g);
    int len = b < 0xF0 ? b % (CT_MAX_DIMS + 1) : b < 0xF8 ? CT_MAX_DIMS + 1 + (b & 1) : -1;
    if (len < 0) {
        *n = b & 1 ? -1 : INT_MIN;
        return buf;
    }
    for (int k = 0; k < len; k++) buf[k] = small_values ? (int64_t)(u8(g) % 6) : pick_int(g);
    *n = len;
    if (len > 0 && u8(g) == 0xFF) return NULL;
    return buf;
}

/* Two-element geometry arrays (stride, padding, ...), or NULL. */
static const int64_t *pick_pair(prog *g, int64_t *buf) {
    uint8_t b = u8(g);
    if (b >= 0xF0) return NULL;
    if (b < 0x80) {
        buf[0] = b % 4;
        buf[1] = (b >> 2) % 4;
    } else {
        buf[0] = pick_int(g);
        buf[1] = pick_int(g);
    }
    return buf;
}

/* ---- checks ---------------------------------------------------------------------- */
static void fail(prog *g, const char *what) {
    fprintf(stderr, "op_program: %s: %s (last status %s, message \"%s\")\n", g->call, what,
            ct_status_name(ct_last_status()), ct_last_error());
    abort();
}

static int tracing = -1; /* OP_PROGRAM_TRACE, read on first use */

static void begin(prog *g, const char *call) {
    g->call = call;
    ct_clear_error();
    if (tracing < 0) tracing = getenv("OP_PROGRAM_TRACE") != NULL;
    if (tracing) fprintf(stderr, "op_program: %s\n", call);
}

/* A failed call: the thread's status is set, agrees with what was returned
 * (CT_OK when the call returns a pointer), and the message names the call. */
static void check_failure(prog *g, ct_status returned) {
    ct_status s = ct_last_status();
    if (s == CT_OK) fail(g, "failed without setting an error status");
    if (returned != CT_OK && returned != s) fail(g, "returned a status other than the thread's");
    const char *m = ct_last_error();
    if (tracing > 0) fprintf(stderr, "op_program:   -> %s: %s\n", ct_status_name(s), m);
    if (!m || !*m) fail(g, "failed with an empty message");
    if (strncmp(m, "ct_", 3) != 0) fail(g, "message does not start with the function's name");
}

static bool numel_fits(const ct_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0) return true;
    __int128 p = 1;
    for (int d = 0; d < t->ndim; d++) {
        p *= t->shape[d];
        if (p > INT64_MAX) return false;
    }
    return true;
}

/* A tensor handed back by the library: sane geometry inside its storage,
 * and readable from start to end. */
static void check_tensor(prog *g, const ct_tensor *t) {
    if (t->ndim < 0 || t->ndim > CT_MAX_DIMS) fail(g, "result has an invalid ndim");
    if ((unsigned)t->dtype >= CT_NUM_DTYPES) fail(g, "result has an invalid dtype");
    if (t->storage->device.type != CT_DEVICE_CPU) fail(g, "result is not on the CPU");
    bool empty = false;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0) fail(g, "result has a negative size");
        if (t->shape[d] == 0) empty = true;
        if (t->stride[d] < 0) fail(g, "result has a negative stride");
    }
    if (!numel_fits(t)) fail(g, "result has more than INT64_MAX elements");
    int64_t numel = ct_tensor_numel(t);
    if (empty || numel == 0) return;
    __int128 last = t->offset;
    for (int d = 0; d < t->ndim; d++) last += (__int128)(t->shape[d] - 1) * t->stride[d];
    size_t es = ct_dtype_size(t->dtype);
    if (t->offset < 0 || (last + 1) * (__int128)es > (__int128)t->storage->nbytes)
        fail(g, "result reaches outside its storage");
    if (numel > SMALL_NUMEL) return;
    size_t nb = (size_t)numel * es;
    void *buf = malloc(nb);
    if (!buf) return;
    ct_status s = ct_tensor_copy_to_host(t, buf, nb);
    free(buf);
    if (s != CT_OK) fail(g, "a result could not be copied to the host");
}

/* ---- the pool -------------------------------------------------------------------- */
static bool small(const ct_tensor *t) { return !t || ct_tensor_numel(t) <= SMALL_NUMEL; }

static entry *find(prog *g, const ct_tensor *t) {
    for (int k = 0; k < NENT; k++)
        if (g->e[k].t == t) return &g->e[k];
    return NULL;
}

/* Drops one of the program's references to an entry, as the library's rule
 * says: a scope-owned handle gives the scope's reference first. */
static void release_one(prog *g, entry *e) {
    (void)g;
    ct_tensor_release(e->t);
    if (e->sdepth) e->sdepth = 0;
    else e->refs--;
    if (!e->sdepth && e->refs <= 0) memset(e, 0, sizeof *e);
}

static void release_all_refs(prog *g, entry *e) {
    while (e->t) release_one(g, e);
}

/* A handle the program now holds one more reference to: either a new one
 * (owned by the innermost scope when one is open) or, from a borrowed
 * accessor made ours with a retain, possibly one already in the pool. */
static void put(prog *g, ct_tensor *t, bool retained) {
    if (!t) return;
    if (tracing > 0) fprintf(stderr, "op_program:   -> %s offset %lld strides %s\n", cti_desc(t),
                             (long long)t->offset, cti_shape_s(t->ndim, t->stride));
    check_tensor(g, t);
    entry *e = find(g, t);
    if (e) {
        e->refs++;
        return;
    }
    for (int k = 0; k < NENT && !e; k++)
        if (!g->e[k].t) e = &g->e[k];
    if (!e) { /* not reached: run() keeps room for an instruction's results */
        ct_tensor_release(t);
        return;
    }
    e->t = t;
    if (!retained && g->depth > 0) {
        e->sdepth = g->depth;
        e->refs = 0;
    } else {
        e->sdepth = 0;
        e->refs = 1;
    }
}

/* An operand: one of the pool's handles (NULL sometimes, and when the pool
 * is empty). */
static ct_tensor *arg(prog *g) {
    uint8_t b = u8(g);
    if (b >= 0xF8) return NULL;
    for (int k = 0; k < NENT; k++) {
        entry *e = &g->e[(b + k) % NENT];
        if (e->t) return e->t;
    }
    return NULL;
}

static entry *arg_entry(prog *g) {
    ct_tensor *t = arg(g);
    return t ? find(g, t) : NULL;
}

/* Runs a call returning a new tensor; name is the public function. */
#define T_CALL(g, name, expr)                                                                  \
    do {                                                                                       \
        begin(g, name);                                                                        \
        ct_tensor *r_ = (expr);                                                                \
        if (r_) put(g, r_, false);                                                             \
        else check_failure(g, CT_OK);                                                          \
    } while (0)

#define S_CALL(g, name, expr)                                                                  \
    do {                                                                                       \
        begin(g, name);                                                                        \
        ct_status s_ = (expr);                                                                 \
        if (s_ != CT_OK) check_failure(g, s_);                                                 \
    } while (0)

/* Extra outputs (indices, saved statistics) returned through pointers. */
static void put_out(prog *g, ct_tensor *t) {
    if (t) put(g, t, false);
}

/* ---- instructions ------------------------------------------------------------------ */
static void op_create(prog *g) {
    int64_t shape[CT_MAX_DIMS + 2];
    int nd = u8(g) % 5;
    for (int k = 0; k < nd; k++) shape[k] = u8(g) % 6;
    ct_dtype dt = (ct_dtype)(u8(g) % CT_NUM_DTYPES);
    int64_t n = 1;
    for (int k = 0; k < nd; k++) n *= shape[k];
    switch (u8(g) % 6) {
    case 0: { /* values from the input, converted to dt by the library */
        double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
        if (!v) return;
        for (int64_t k = 0; k < n; k++) v[k] = u8(g) < 0xE0 ? (double)(int8_t)u8(g) : pick_double(g);
        begin(g, "ct_tensor_from_data");
        ct_tensor *t = ct_tensor_from_data(v, CT_F64, nd, shape);
        free(v);
        if (!t) {
            check_failure(g, CT_OK);
            return;
        }
        put(g, t, false);
        if (dt != CT_F64) T_CALL(g, "ct_to_dtype", ct_to_dtype(t, dt));
        return;
    }
    case 1: T_CALL(g, "ct_tensor_randn", ct_tensor_randn(g->gen, nd, shape, pick_float_dtype(g), CT_CPU)); return;
    case 2: T_CALL(g, "ct_tensor_rand", ct_tensor_rand(g->gen, nd, shape, pick_float_dtype(g), CT_CPU)); return;
    case 3: {
        int64_t lo = pick_int(g), hi = pick_int(g);
        T_CALL(g, "ct_tensor_randint", ct_tensor_randint(g->gen, lo, hi, nd, shape, dt, CT_CPU));
        return;
    }
    case 4: T_CALL(g, "ct_tensor_full", ct_tensor_full(nd, shape, pick_double(g), dt, CT_CPU)); return;
    default: T_CALL(g, "ct_tensor_arange", ct_tensor_arange(0, (double)n, 1, dt, CT_CPU)); return;
    }
}

/* Factories with fuzzer-chosen (extreme) sizes. */
static void op_factory(prog *g) {
    int64_t buf[CT_MAX_DIMS + 2];
    int nd;
    const int64_t *shape;
    ct_dtype dt = pick_dtype(g);
    ct_device dev = CT_CPU;
    if (u8(g) == 0xFF) dev = (ct_device){(ct_device_type)(u8(g) % 4), (int)pick_int(g)};
    switch (u8(g) % 12) {
    case 0: shape = pick_list(g, &nd, buf, false); T_CALL(g, "ct_tensor_empty", ct_tensor_empty(nd, shape, dt, dev)); break;
    case 1: shape = pick_list(g, &nd, buf, false); T_CALL(g, "ct_tensor_zeros", ct_tensor_zeros(nd, shape, dt, dev)); break;
    case 2: shape = pick_list(g, &nd, buf, false); T_CALL(g, "ct_tensor_ones", ct_tensor_ones(nd, shape, dt, dev)); break;
    case 3: T_CALL(g, "ct_tensor_scalar", ct_tensor_scalar(pick_double(g), dt, dev)); break;
    case 4: {
        double a = pick_double(g), b = pick_double(g), s = pick_double(g);
        T_CALL(g, "ct_tensor_arange", ct_tensor_arange(a, b, s, dt, dev));
        break;
    }
    case 5: {
        double a = pick_double(g), b = pick_double(g);
        T_CALL(g, "ct_tensor_linspace", ct_tensor_linspace(a, b, pick_int(g), dt, dev));
        break;
    }
    case 6: {
        int64_t n = pick_int(g), m = pick_int(g);
        T_CALL(g, "ct_tensor_eye", ct_tensor_eye(n, m, dt, dev));
        break;
    }
    case 7: shape = pick_list(g, &nd, buf, false); T_CALL(g, "ct_tensor_rand", ct_tensor_rand(g->gen, nd, shape, dt, dev)); break;
    case 8: {
        int64_t lo = pick_int(g), hi = pick_int(g);
        shape = pick_list(g, &nd, buf, false);
        T_CALL(g, "ct_tensor_randint", ct_tensor_randint(NULL, lo, hi, nd, shape, dt, dev));
        break;
    }
    case 9: {
        ct_tensor *t = arg(g);
        switch (u8(g) % 4) {
        case 0: T_CALL(g, "ct_tensor_empty_like", ct_tensor_empty_like(t)); break;
        case 1: T_CALL(g, "ct_tensor_zeros_like", ct_tensor_zeros_like(t)); break;
        case 2: T_CALL(g, "ct_tensor_ones_like", ct_tensor_ones_like(t)); break;
        default: T_CALL(g, "ct_tensor_full_like", ct_tensor_full_like(t, pick_double(g))); break;
        }
        break;
    }
    case 10: {
        ct_tensor *t = arg(g);
        double a = pick_double(g), b = pick_double(g);
        if (!small(t)) return;
        if (pick_bool(g)) S_CALL(g, "ct_uniform_", ct_uniform_(t, a, b, g->gen));
        else S_CALL(g, "ct_normal_", ct_normal_(t, a, b, NULL));
        break;
    }
    default: {
        shape = pick_list(g, &nd, buf, false);
        T_CALL(g, "ct_tensor_full", ct_tensor_full(nd, shape, pick_double(g), dt, dev));
        break;
    }
    }
}

static void op_view(prog *g) {
    ct_tensor *t = arg(g);
    int64_t buf[CT_MAX_DIMS + 2];
    int nd;
    const int64_t *list;
    switch (u8(g) % 16) {
    case 0: {
        int d = pick_dim(g);
        int64_t s = pick_int(g), l = pick_int(g);
        T_CALL(g, "ct_narrow", ct_narrow(t, d, s, l));
        break;
    }
    case 1: {
        int d = pick_dim(g);
        int64_t a = pick_int(g), b = pick_int(g), s = pick_int(g);
        T_CALL(g, "ct_slice", ct_slice(t, d, a, b, s));
        break;
    }
    case 2: {
        int d = pick_dim(g);
        T_CALL(g, "ct_select", ct_select(t, d, pick_int(g)));
        break;
    }
    case 3: list = pick_list(g, &nd, buf, false); T_CALL(g, "ct_expand", ct_expand(t, nd, list)); break;
    case 4: T_CALL(g, "ct_expand_as", ct_expand_as(t, arg(g))); break;
    case 5: list = pick_list(g, &nd, buf, false); T_CALL(g, "ct_permute", ct_permute(t, nd, list)); break;
    case 6: list = pick_list(g, &nd, buf, false); T_CALL(g, "ct_reshape", ct_reshape(t, nd, list)); break;
    case 7: list = pick_list(g, &nd, buf, false); T_CALL(g, "ct_view", ct_view(t, nd, list)); break;
    case 8: {
        int a = pick_dim(g), b = pick_dim(g);
        T_CALL(g, "ct_transpose", ct_transpose(t, a, b));
        break;
    }
    case 9: T_CALL(g, "ct_t", ct_t(t)); break;
    case 10: T_CALL(g, "ct_squeeze", ct_squeeze(t)); break;
    case 11: T_CALL(g, "ct_squeeze_dim", ct_squeeze_dim(t, pick_dim(g))); break;
    case 12: T_CALL(g, "ct_unsqueeze", ct_unsqueeze(t, pick_dim(g))); break;
    case 13: {
        int a = pick_dim(g), b = pick_dim(g);
        T_CALL(g, "ct_flatten", ct_flatten(t, a, b));
        break;
    }
    case 14: T_CALL(g, "ct_detach", ct_detach(t)); break;
    default: {
        /* A chain: the same view op twice on its own result. */
        int d = pick_dim(g);
        int64_t s = pick_int(g), l = pick_int(g);
        begin(g, "ct_narrow");
        ct_tensor *v = ct_narrow(t, d, s, l);
        if (!v) {
            check_failure(g, CT_OK);
            return;
        }
        put(g, v, false);
        T_CALL(g, "ct_select", ct_select(v, pick_dim(g), pick_int(g)));
        break;
    }
    }
}

typedef ct_tensor *(*unary_fn)(ct_tensor *);
typedef ct_tensor *(*binary_fn)(ct_tensor *, ct_tensor *);
typedef ct_tensor *(*scalar_fn)(ct_tensor *, double);
typedef ct_status (*inplace_fn)(ct_tensor *);
typedef ct_status (*inplace_binary_fn)(ct_tensor *, ct_tensor *);
typedef ct_status (*inplace_scalar_fn)(ct_tensor *, double);

#define F(fn) {fn, #fn}
static const struct { unary_fn f; const char *name; } unary_ops[] = {
    F(ct_neg), F(ct_abs), F(ct_exp), F(ct_log), F(ct_sqrt), F(ct_rsqrt), F(ct_sin),
    F(ct_cos), F(ct_tanh), F(ct_sigmoid), F(ct_relu), F(ct_silu), F(ct_reciprocal),
    F(ct_square), F(ct_sign), F(ct_logical_not), F(ct_clone), F(ct_contiguous)};
static const struct { unary_fn f; const char *name; } reduce_all_ops[] = {
    F(ct_max), F(ct_min), F(ct_argmax_all), F(ct_argmin_all)};
static const struct { binary_fn f; const char *name; } binary_ops[] = {
    F(ct_add), F(ct_sub), F(ct_mul), F(ct_div), F(ct_pow), F(ct_maximum), F(ct_minimum),
    F(ct_eq), F(ct_ne), F(ct_lt), F(ct_le), F(ct_gt), F(ct_ge), F(ct_logical_and),
    F(ct_logical_or)};
static const struct { binary_fn f; const char *name; } matmul_ops[] = {
    F(ct_matmul), F(ct_mm), F(ct_bmm)};
static const struct { scalar_fn f; const char *name; } scalar_ops[] = {
    F(ct_add_scalar), F(ct_sub_scalar), F(ct_rsub_scalar), F(ct_mul_scalar),
    F(ct_div_scalar), F(ct_pow_scalar), F(ct_maximum_scalar), F(ct_minimum_scalar),
    F(ct_eq_scalar), F(ct_ne_scalar), F(ct_lt_scalar), F(ct_le_scalar), F(ct_gt_scalar),
    F(ct_ge_scalar)};
static const struct { inplace_fn f; const char *name; } inplace_ops[] = {
    F(ct_neg_), F(ct_exp_), F(ct_sqrt_), F(ct_relu_), F(ct_zero_)};
static const struct { inplace_binary_fn f; const char *name; } inplace_binary_ops[] = {
    F(ct_add_), F(ct_sub_), F(ct_mul_), F(ct_div_), F(ct_pow_)};
static const struct { inplace_scalar_fn f; const char *name; } inplace_scalar_ops[] = {
    F(ct_add_scalar_), F(ct_sub_scalar_), F(ct_mul_scalar_), F(ct_div_scalar_), F(ct_fill_)};
#undef F
#define N_(a) (sizeof a / sizeof a[0])

/* Elementwise ops take large operands (expanded views with huge sizes
 * must be refused or computed), but a result of millions of elements only
 * slows the fuzzer down: the operands' counts bound the result's. */
static bool cheap(const ct_tensor *a, const ct_tensor *b, const ct_tensor *c) {
    double n = 1;
    const ct_tensor *ts[3] = {a, b, c};
    for (int k = 0; k < 3; k++)
        if (ts[k] && ct_tensor_numel(ts[k]) > 1) n *= (double)ct_tensor_numel(ts[k]);
    return n <= (double)(1 << 20);
}

static void op_elementwise(prog *g) {
    uint8_t k = u8(g);
    switch (u8(g) % 10) {
    case 0: {
        ct_tensor *a = arg(g);
        if (!cheap(a, NULL, NULL)) return;
        T_CALL(g, unary_ops[k % N_(unary_ops)].name, unary_ops[k % N_(unary_ops)].f(a));
        break;
    }
    case 1: {
        ct_tensor *a = arg(g), *b = arg(g);
        if (!cheap(a, b, NULL)) return;
        T_CALL(g, binary_ops[k % N_(binary_ops)].name, binary_ops[k % N_(binary_ops)].f(a, b));
        break;
    }
    case 2: {
        ct_tensor *a = arg(g);
        if (!cheap(a, NULL, NULL)) return;
        T_CALL(g, scalar_ops[k % N_(scalar_ops)].name, scalar_ops[k % N_(scalar_ops)].f(a, pick_double(g)));
        break;
    }
    case 3: {
        ct_tensor *a = arg(g), *b = arg(g);
        double al = pick_double(g);
        if (!cheap(a, b, NULL)) return;
        if (k & 1) T_CALL(g, "ct_add_alpha", ct_add_alpha(a, b, al));
        else T_CALL(g, "ct_sub_alpha", ct_sub_alpha(a, b, al));
        break;
    }
    case 4: {
        ct_tensor *c = arg(g), *a = arg(g), *b = arg(g);
        if (!cheap(a, b, c)) return;
        T_CALL(g, "ct_where", ct_where(c, a, b));
        break;
    }
    case 5: {
        ct_tensor *a = arg(g);
        double lo = pick_double(g), hi = pick_double(g);
        if (!cheap(a, NULL, NULL)) return;
        T_CALL(g, "ct_clamp", ct_clamp(a, lo, hi));
        break;
    }
    case 6: {
        ct_tensor *a = arg(g);
        if (!cheap(a, NULL, NULL)) return;
        T_CALL(g, "ct_gelu", ct_gelu(a, (ct_gelu_approx)(k % 3)));
        break;
    }
    case 7: {
        ct_tensor *a = arg(g);
        double b = pick_double(g), th = pick_double(g);
        if (!cheap(a, NULL, NULL)) return;
        T_CALL(g, "ct_softplus", ct_softplus(a, b, th));
        break;
    }
    case 8: {
        ct_tensor *a = arg(g);
        if (!cheap(a, NULL, NULL)) return;
        T_CALL(g, "ct_to_dtype", ct_to_dtype(a, pick_dtype(g)));
        break;
    }
    default: {
        ct_tensor *a = arg(g);
        ct_device d = {(ct_device_type)(k % 3), (int)pick_int(g)};
        if (!cheap(a, NULL, NULL)) return;
        T_CALL(g, "ct_to_device", ct_to_device(a, d));
        break;
    }
    }
}

/* In-place ops write through views into shared storage: the operands are
 * often a handle and a view of it. */
static void op_inplace(prog *g) {
    uint8_t k = u8(g);
    ct_tensor *a = arg(g);
    if (!small(a)) return;
    switch (u8(g) % 6) {
    case 0: S_CALL(g, inplace_ops[k % N_(inplace_ops)].name, inplace_ops[k % N_(inplace_ops)].f(a)); break;
    case 1: {
        ct_tensor *b = arg(g);
        S_CALL(g, inplace_binary_ops[k % N_(inplace_binary_ops)].name,
               inplace_binary_ops[k % N_(inplace_binary_ops)].f(a, b));
        break;
    }
    case 2: S_CALL(g, inplace_scalar_ops[k % N_(inplace_scalar_ops)].name,
                   inplace_scalar_ops[k % N_(inplace_scalar_ops)].f(a, pick_double(g)));
        break;
    case 3: {
        ct_tensor *b = arg(g);
        S_CALL(g, "ct_copy_", ct_copy_(a, b));
        break;
    }
    case 4: {
        double lo = pick_double(g), hi = pick_double(g);
        S_CALL(g, "ct_clamp_", ct_clamp_(a, lo, hi));
        break;
    }
    default: {
        ct_tensor *b = arg(g);
        S_CALL(g, "ct_add_alpha_", ct_add_alpha_(a, b, pick_double(g)));
        break;
    }
    }
}

static void op_reduce(prog *g) {
    ct_tensor *x = arg(g);
    if (!small(x)) return;
    int64_t buf[CT_MAX_DIMS + 2];
    int nd = 0;
    uint8_t k = u8(g) % 10;
    const int64_t *dims = k < 6 ? pick_list(g, &nd, buf, false) : NULL;
    bool keep = pick_bool(g);
    switch (k) {
    case 0: T_CALL(g, "ct_sum", ct_sum(x, nd, dims, keep)); break;
    case 1: T_CALL(g, "ct_mean", ct_mean(x, nd, dims, keep)); break;
    case 2: T_CALL(g, "ct_prod", ct_prod(x, nd, dims, keep)); break;
    case 3: T_CALL(g, "ct_var", ct_var(x, nd, dims, pick_double(g), keep)); break;
    case 4: T_CALL(g, "ct_std", ct_std(x, nd, dims, pick_double(g), keep)); break;
    case 5: T_CALL(g, "ct_norm", ct_norm(x, pick_double(g), nd, dims, keep)); break;
    case 6: {
        ct_tensor *idx = NULL;
        bool want = pick_bool(g);
        int d = pick_dim(g);
        T_CALL(g, "ct_max_dim", ct_max_dim(x, d, keep, want ? &idx : NULL));
        put_out(g, idx);
        break;
    }
    case 7: {
        ct_tensor *idx = NULL;
        bool want = pick_bool(g);
        int d = pick_dim(g);
        T_CALL(g, "ct_min_dim", ct_min_dim(x, d, keep, want ? &idx : NULL));
        put_out(g, idx);
        break;
    }
    case 8: {
        int d = pick_dim(g);
        if (pick_bool(g)) T_CALL(g, "ct_argmax", ct_argmax(x, d, keep));
        else T_CALL(g, "ct_argmin", ct_argmin(x, d, keep));
        break;
    }
    default: {
        uint8_t j = u8(g) % N_(reduce_all_ops);
        T_CALL(g, reduce_all_ops[j].name, reduce_all_ops[j].f(x));
        break;
    }
    }
}

static bool all_small(int n, ct_tensor *const *ts) {
    for (int k = 0; k < n; k++)
        if (!small(ts[k])) return false;
    return true;
}

static void op_linalg(prog *g) {
    ct_tensor *a = arg(g), *b = arg(g), *c = arg(g);
    ct_tensor *ts[3] = {a, b, c};
    if (!all_small(3, ts)) return;
    switch (u8(g) % 5) {
    case 0: case 1: {
        uint8_t k = u8(g) % N_(matmul_ops);
        T_CALL(g, matmul_ops[k].name, matmul_ops[k].f(a, b));
        break;
    }
    case 2: {
        double beta = pick_double(g), alpha = pick_double(g);
        T_CALL(g, "ct_addmm", ct_addmm(c, a, b, beta, alpha));
        break;
    }
    case 3: T_CALL(g, "ct_linear", ct_linear(a, b, pick_bool(g) ? c : NULL)); break;
    default: {
        /* A layer whose sizes come from the input. */
        if (g->layer) {
            T_CALL(g, "ct_nn_linear_forward", ct_nn_linear_forward(g->layer, a));
            break;
        }
        int64_t in = pick_int(g), out = pick_int(g);
        begin(g, "ct_nn_linear_new");
        g->layer = ct_nn_linear_new(in, out, pick_bool(g), pick_dtype(g), CT_CPU, g->gen);
        if (!g->layer) check_failure(g, CT_OK);
        break;
    }
    }
}

static void pick_shape4(prog *g, int64_t s[4]) {
    for (int k = 0; k < 4; k++) s[k] = u8(g) < 0xF0 ? u8(g) % 7 : pick_int(g);
}

static void op_conv(prog *g) {
    int64_t sb[2], pb[2], db[2], kb[2], shape[4];
    ct_tensor *x = arg(g), *w = arg(g), *bias = pick_bool(g) ? arg(g) : NULL;
    ct_tensor *ts[3] = {x, w, bias};
    if (!all_small(3, ts)) return;
    switch (u8(g) % 10) {
    case 0: case 1: {
        const int64_t *s = pick_pair(g, sb), *p = pick_pair(g, pb), *d = pick_pair(g, db);
        T_CALL(g, "ct_conv2d", ct_conv2d(x, w, bias, s, p, d, pick_int(g)));
        break;
    }
    case 2: {
        const int64_t *s = pick_pair(g, sb), *p = pick_pair(g, pb), *d = pick_pair(g, db);
        pick_shape4(g, shape);
        T_CALL(g, "ct_conv2d_backward_input",
               ct_conv2d_backward_input(x, w, shape, s, p, d, pick_int(g)));
        break;
    }
    case 3: {
        const int64_t *s = pick_pair(g, sb), *p = pick_pair(g, pb), *d = pick_pair(g, db);
        pick_shape4(g, shape);
        T_CALL(g, "ct_conv2d_backward_weight",
               ct_conv2d_backward_weight(x, w, shape, s, p, d, pick_int(g)));
        break;
    }
    case 4: T_CALL(g, "ct_conv2d_backward_bias", ct_conv2d_backward_bias(x)); break;
    case 5: {
        const int64_t *k = pick_pair(g, kb), *s = pick_pair(g, sb), *p = pick_pair(g, pb),
                      *d = pick_pair(g, db);
        bool ceil_mode = pick_bool(g), want = pick_bool(g);
        ct_tensor *idx = NULL;
        T_CALL(g, "ct_max_pool2d", ct_max_pool2d(x, k, s, p, d, ceil_mode, want ? &idx : NULL));
        put_out(g, idx);
        break;
    }
    case 6: T_CALL(g, "ct_max_pool2d_backward", ct_max_pool2d_backward(x, w, bias)); break;
    case 7: {
        const int64_t *k = pick_pair(g, kb), *s = pick_pair(g, sb), *p = pick_pair(g, pb);
        bool ceil_mode = pick_bool(g), cip = pick_bool(g);
        if (pick_bool(g)) T_CALL(g, "ct_avg_pool2d", ct_avg_pool2d(x, k, s, p, ceil_mode, cip));
        else
            T_CALL(g, "ct_avg_pool2d_backward",
                   ct_avg_pool2d_backward(x, w, k, s, p, ceil_mode, cip));
        break;
    }
    case 8: {
        int64_t oh = pick_int(g), ow = pick_int(g);
        T_CALL(g, "ct_adaptive_avg_pool2d", ct_adaptive_avg_pool2d(x, oh, ow));
        break;
    }
    default: T_CALL(g, "ct_adaptive_avg_pool2d_backward", ct_adaptive_avg_pool2d_backward(x, w)); break;
    }
}

static void op_norm(prog *g) {
    ct_tensor *x = arg(g), *w = pick_bool(g) ? arg(g) : NULL, *b = pick_bool(g) ? arg(g) : NULL;
    ct_tensor *ts[3] = {x, w, b};
    if (!all_small(3, ts)) return;
    int64_t buf[CT_MAX_DIMS + 2];
    int nn;
    switch (u8(g) % 7) {
    case 0: {
        const int64_t *ns = pick_list(g, &nn, buf, true);
        bool want = pick_bool(g);
        ct_tensor *inv = NULL;
        T_CALL(g, "ct_rms_norm", ct_rms_norm(x, nn, ns, w, pick_double(g), want ? &inv : NULL));
        put_out(g, inv);
        break;
    }
    case 1: {
        ct_tensor *gy = arg(g), *inv = arg(g), *dx = NULL, *dw = NULL;
        bool wx = pick_bool(g), ww = pick_bool(g);
        S_CALL(g, "ct_rms_norm_backward",
               ct_rms_norm_backward(gy, x, w, inv, wx ? &dx : NULL, ww ? &dw : NULL));
        put_out(g, dx);
        put_out(g, dw);
        break;
    }
    case 2: {
        const int64_t *ns = pick_list(g, &nn, buf, true);
        bool want = pick_bool(g);
        ct_tensor *mean = NULL, *rstd = NULL;
        T_CALL(g, "ct_layer_norm", ct_layer_norm(x, nn, ns, w, b, pick_double(g),
                                                 want ? &mean : NULL, want ? &rstd : NULL));
        put_out(g, mean);
        put_out(g, rstd);
        break;
    }
    case 3: {
        ct_tensor *gy = arg(g), *mean = arg(g), *rstd = arg(g), *dx = NULL, *dw = NULL, *db = NULL;
        uint8_t m = u8(g);
        S_CALL(g, "ct_layer_norm_backward",
               ct_layer_norm_backward(gy, x, w, mean, rstd, m & 1 ? &dx : NULL,
                                      m & 2 ? &dw : NULL, m & 4 ? &db : NULL));
        put_out(g, dx);
        put_out(g, dw);
        put_out(g, db);
        break;
    }
    case 4: {
        int d = pick_dim(g);
        if (pick_bool(g)) T_CALL(g, "ct_softmax", ct_softmax(x, d));
        else T_CALL(g, "ct_log_softmax", ct_log_softmax(x, d));
        break;
    }
    case 5: {
        int d = pick_dim(g);
        if (pick_bool(g)) T_CALL(g, "ct_softmax_backward", ct_softmax_backward(x, w, d));
        else T_CALL(g, "ct_log_softmax_backward", ct_log_softmax_backward(x, w, d));
        break;
    }
    default: {
        ct_tensor *mask = NULL;
        double p = pick_double(g);
        bool train = pick_bool(g), want = pick_bool(g);
        if (pick_bool(g)) {
            T_CALL(g, "ct_dropout", ct_dropout(x, p, train, want ? g->gen : NULL, want ? &mask : NULL));
            put_out(g, mask);
        } else {
            T_CALL(g, "ct_dropout_backward", ct_dropout_backward(x, w, p));
        }
        break;
    }
    }
}

/* Class targets: a fresh int64 tensor of fuzzer-chosen values (in and out
 * of range, -100, C) or any handle from the pool. */
static ct_tensor *targets(prog *g) {
    if (pick_bool(g)) return arg(g);
    int64_t v[6], n = u8(g) % 7;
    for (int k = 0; k < n; k++) v[k] = u8(g) < 0xC0 ? (int64_t)(u8(g) % 6) - 1 : pick_int(g);
    begin(g, "ct_tensor_from_data");
    ct_tensor *t = ct_tensor_from_data(v, CT_I64, u8(g) & 1 ? 1 : 0, (const int64_t[]){n});
    if (!t) {
        check_failure(g, CT_OK);
        return NULL;
    }
    put(g, t, false);
    return t;
}

static void op_loss(prog *g) {
    ct_tensor *x = arg(g), *t = targets(g), *w = pick_bool(g) ? arg(g) : NULL;
    ct_tensor *ts[3] = {x, t, w};
    if (!all_small(3, ts)) return;
    ct_reduction red = (ct_reduction)(u8(g) < 0xF0 ? u8(g) % 3 : pick_int(g));
    int64_t ignore = u8(g) < 0x80 ? -100 : pick_int(g);
    switch (u8(g) % 7) {
    case 0: T_CALL(g, "ct_cross_entropy", ct_cross_entropy(x, t, w, red, ignore, pick_double(g))); break;
    case 1: {
        ct_tensor *gl = arg(g);
        T_CALL(g, "ct_cross_entropy_backward",
               ct_cross_entropy_backward(gl, x, t, w, red, ignore, pick_double(g)));
        break;
    }
    case 2: T_CALL(g, "ct_nll_loss", ct_nll_loss(x, t, w, red, ignore)); break;
    case 3: {
        ct_tensor *gl = arg(g);
        T_CALL(g, "ct_nll_loss_backward", ct_nll_loss_backward(gl, x, t, w, red, ignore));
        break;
    }
    case 4: T_CALL(g, "ct_mse_loss", ct_mse_loss(x, w, red)); break;
    case 5: {
        ct_tensor *gl = arg(g);
        T_CALL(g, "ct_mse_loss_backward", ct_mse_loss_backward(gl, x, w, red));
        break;
    }
    default: {
        if (pick_bool(g)) {
            T_CALL(g, "ct_embedding", ct_embedding(x, t));
        } else {
            int64_t nw = u8(g) < 0xC0 ? u8(g) % 8 : pick_int(g), pad = pick_int(g);
            T_CALL(g, "ct_embedding_backward", ct_embedding_backward(x, t, nw, pad));
        }
        break;
    }
    }
}

static void op_join(prog *g) {
    ct_tensor *ts[5];
    int n = u8(g) % 6;
    for (int k = 0; k < n; k++) ts[k] = arg(g);
    if (!all_small(n, ts)) return;
    int d = pick_dim(g);
    int cnt = u8(g) == 0xFF ? -1 : n;
    if (pick_bool(g)) T_CALL(g, "ct_cat", ct_cat(cnt, n ? ts : NULL, d));
    else T_CALL(g, "ct_stack", ct_stack(cnt, n ? ts : NULL, d));
}

static void op_read(prog *g) {
    ct_tensor *t = arg(g);
    switch (u8(g) % 4) {
    case 0: {
        double v;
        S_CALL(g, "ct_tensor_item", ct_tensor_item(t, &v));
        break;
    }
    case 1: {
        if (!small(t)) return;
        size_t need = t ? (size_t)ct_tensor_numel(t) * ct_dtype_size(ct_tensor_dtype(t)) : 0;
        size_t nb = u8(g) & 1 ? need : need / 2;
        void *buf = malloc(nb ? nb : 1);
        if (!buf) return;
        S_CALL(g, "ct_tensor_copy_to_host", ct_tensor_copy_to_host(t, buf, nb));
        free(buf);
        break;
    }
    case 2: {
        begin(g, "ct_tensor_size");
        if (ct_tensor_size(t, pick_dim(g)) < 0) check_failure(g, CT_OK);
        break;
    }
    default: {
        /* Properties of any handle, NULL included, must not crash. */
        (void)ct_tensor_ndim(t);
        (void)ct_tensor_shape(t);
        (void)ct_tensor_strides(t);
        (void)ct_tensor_numel(t);
        (void)ct_tensor_offset(t);
        (void)ct_tensor_dtype(t);
        (void)ct_tensor_is_contiguous(t);
        (void)ct_tensor_shares_storage(t, arg(g));
        (void)ct_requires_grad(t);
        (void)ct_is_leaf(t);
        (void)ct_grad_fn_name(t);
        break;
    }
    }
}

static void op_autograd(prog *g) {
    ct_tensor *t = arg(g);
    switch (u8(g) % 8) {
    case 0: case 1: S_CALL(g, "ct_requires_grad_", ct_requires_grad_(t, u8(g) < 0xE0)); break;
    case 2: case 3: {
        ct_tensor *go = pick_bool(g) ? arg(g) : NULL;
        if (!small(t)) return;
        S_CALL(g, "ct_backward", ct_backward(t, go, pick_bool(g)));
        break;
    }
    case 4: {
        ct_tensor *gr = ct_grad(t);
        if (gr) put(g, ct_tensor_retain(gr), true);
        break;
    }
    case 5: ct_zero_grad(t); break;
    case 6: S_CALL(g, "ct_set_grad", ct_set_grad(t, pick_bool(g) ? arg(g) : NULL)); break;
    default:
        /* Recomputation changes what the backward reads (a note in place of
         * a saved output), so programs run with it on as well as off. */
        if (pick_bool(g)) ct_set_grad_enabled(pick_bool(g));
        else ct_set_recompute_enabled(pick_bool(g));
        break;
    }
}

static void op_scope(prog *g) {
    switch (u8(g) % 4) {
    case 0: {
        if (g->depth == MAX_SCOPES) return;
        begin(g, "ct_scope_begin");
        ct_scope *s = ct_scope_begin();
        if (!s) {
            check_failure(g, CT_OK);
            return;
        }
        g->scopes[g->depth++] = s;
        break;
    }
    case 1: {
        if (g->depth == 0) return;
        int k = u8(g) % g->depth;
        ct_scope_end(g->scopes[k]);
        for (int j = 0; j < NENT; j++) {
            entry *e = &g->e[j];
            if (e->t && e->sdepth > k) {
                e->sdepth = 0;
                if (e->refs <= 0) memset(e, 0, sizeof *e);
            }
        }
        g->depth = k;
        break;
    }
    case 2: {
        entry *e = arg_entry(g);
        if (!e) return;
        ct_keep(e->t);
        if (e->sdepth > 0 && --e->sdepth == 0) e->refs++;
        break;
    }
    default: ct_scope_end(NULL); break;
    }
}

static void op_refs(prog *g) {
    entry *e = arg_entry(g);
    if (!e) return;
    if (pick_bool(g)) {
        ct_tensor_retain(e->t);
        e->refs++;
    } else {
        release_one(g, e);
    }
}

static void op_optim(prog *g) {
    switch (u8(g) % 7) {
    case 0: {
        ct_tensor *t = arg(g);
        if (!small(t)) return; /* an optimizer step over millions of halves takes seconds */
        if (!g->params) g->params = ct_params_new();
        if (!g->params) return;
        char name[16];
        snprintf(name, sizeof name, "p%u", u8(g) % 4);
        S_CALL(g, "ct_params_add", ct_params_add(g->params, name, t));
        break;
    }
    case 1: {
        ct_optim_free(g->opt);
        g->opt = NULL;
        double lr = pick_double(g), a = pick_double(g), b = pick_double(g), c = pick_double(g);
        if (pick_bool(g)) {
            begin(g, "ct_optim_sgd_new");
            g->opt = ct_optim_sgd_new(g->params, lr, a, b, c, pick_bool(g));
        } else {
            begin(g, "ct_optim_adamw_new");
            g->opt = ct_optim_adamw_new(g->params, lr, a, b, c, pick_double(g));
        }
        if (!g->opt) check_failure(g, CT_OK);
        break;
    }
    case 2: S_CALL(g, "ct_optim_step", ct_optim_step(g->opt)); break;
    case 3: ct_optim_zero_grad(g->opt); break;
    case 4: {
        begin(g, "ct_optim_state_get");
        ct_tensor *s = ct_optim_state_get(g->opt, pick_int(g), NULL);
        if (s) put(g, ct_tensor_retain(s), true);
        else check_failure(g, CT_OK);
        break;
    }
    case 5: {
        double total;
        S_CALL(g, "ct_clip_grad_norm", ct_clip_grad_norm(g->params, pick_double(g), &total));
        break;
    }
    default: {
        begin(g, "ct_params_get");
        ct_tensor *p = ct_params_get(g->params, pick_int(g), NULL);
        if (p) put(g, ct_tensor_retain(p), true);
        else check_failure(g, CT_OK);
        break;
    }
    }
}

/* ---- the program ---------------------------------------------------------------------- */
static void seed_pool(prog *g) {
    /* A few tensors every program starts from, so short inputs reach ops. */
    T_CALL(g, "ct_tensor_randn", ct_tensor_randn(g->gen, CT_SHAPE(2, 3, 4), CT_F32, CT_CPU));
    T_CALL(g, "ct_tensor_randn", ct_tensor_randn(g->gen, CT_SHAPE(4), CT_F32, CT_CPU));
    T_CALL(g, "ct_tensor_from_data",
           ct_tensor_from_data((const int64_t[]){0, 3}, CT_I64, CT_SHAPE(2)));
    T_CALL(g, "ct_tensor_randn", ct_tensor_randn(g->gen, CT_SHAPE(1, 2, 5, 5), CT_F32, CT_CPU));
    T_CALL(g, "ct_tensor_randn", ct_tensor_randn(g->gen, CT_SHAPE(3, 2, 3, 3), CT_F32, CT_CPU));
    T_CALL(g, "ct_tensor_randn", ct_tensor_randn(g->gen, CT_SHAPE(3, 3), CT_F64, CT_CPU));
    T_CALL(g, "ct_tensor_randint", ct_tensor_randint(g->gen, 0, 4, CT_SHAPE(2, 5, 5), CT_I64, CT_CPU));
}

/* Frees entries chosen by the input until an instruction's results (three
 * at most) fit, so that no operand is released while an instruction runs. */
static void make_room(prog *g) {
    for (;;) {
        int free_entries = 0;
        for (int k = 0; k < NENT; k++) free_entries += !g->e[k].t;
        if (free_entries >= 4) return;
        int k = u8(g) % NENT;
        while (!g->e[k].t) k = (k + 1) % NENT;
        release_all_refs(g, &g->e[k]);
    }
}

static void run(prog *g) {
    for (int step = 0; step < MAX_STEPS && g->i < g->n; step++) {
        make_room(g);
        switch (u8(g) % 20) {
        case 0: op_create(g); break;
        case 1: op_factory(g); break;
        case 2: case 3: case 4: op_view(g); break;
        case 5: case 6: op_elementwise(g); break;
        case 7: op_inplace(g); break;
        case 8: op_reduce(g); break;
        case 9: op_linalg(g); break;
        case 10: op_conv(g); break;
        case 11: op_norm(g); break;
        case 12: op_loss(g); break;
        case 13: op_join(g); break;
        case 14: op_read(g); break;
        case 15: case 16: op_autograd(g); break;
        case 17: op_scope(g); break;
        case 18: op_refs(g); break;
        default: op_optim(g); break;
        }
    }
}

/* Runs after the instructions and reads no input, so it changes nothing
 * the instructions did (an input that found a bug there still finds it):
 * backpropagates from every result with history, keeping the graphs so
 * that shared ones are walked again, then steps optimizers over the leaves
 * that ended up with gradients. Programs rarely reach these on their own. */
static void epilogue(prog *g) {
    for (int k = 0; k < NENT; k++) {
        ct_tensor *t = g->e[k].t;
        if (!t || !small(t) || !ct_grad_fn_name(t)) continue;
        begin(g, "ct_sum");
        ct_tensor *loss = ct_sum(t, CT_NONE, false);
        if (!loss) {
            check_failure(g, CT_OK);
            continue;
        }
        check_tensor(g, loss);
        S_CALL(g, "ct_backward", ct_backward(loss, NULL, true));
        ct_tensor_release(loss);
    }
    ct_params *leaves = ct_params_new();
    if (!leaves) return;
    for (int k = 0; k < NENT; k++) {
        ct_tensor *t = g->e[k].t;
        if (!t || !small(t) || !ct_is_leaf(t) || !ct_grad(t)) continue;
        char name[16];
        snprintf(name, sizeof name, "leaf%d", k);
        S_CALL(g, "ct_params_add", ct_params_add(leaves, name, t));
    }
    if (ct_params_count(leaves) > 0) {
        double total;
        S_CALL(g, "ct_clip_grad_norm", ct_clip_grad_norm(leaves, 1.0, &total));
        for (int k = 0; k < 2; k++) {
            begin(g, k ? "ct_optim_adamw_new" : "ct_optim_sgd_new");
            ct_optimizer *o = k ? ct_optim_adamw_new(leaves, 1e-3, 0.9, 0.999, 1e-8, 1e-2)
                                : ct_optim_sgd_new(leaves, 0.1, 0.9, 0.0, 1e-4, true);
            if (!o) {
                check_failure(g, CT_OK);
                continue;
            }
            S_CALL(g, "ct_optim_step", ct_optim_step(o));
            S_CALL(g, "ct_optim_step", ct_optim_step(o));
            ct_optim_free(o);
        }
    }
    ct_params_free(leaves);
}

static void teardown(prog *g) {
    g->call = "teardown";
    ct_optim_free(g->opt);
    ct_params_free(g->params);
    ct_nn_linear_free(g->layer);
    if (g->depth > 0) ct_scope_end(g->scopes[0]);
    for (int k = 0; k < NENT; k++) {
        g->e[k].sdepth = 0;
        while (g->e[k].t && g->e[k].refs > 0) release_one(g, &g->e[k]);
    }
    ct_generator_free(g->gen);
    ct_set_grad_enabled(true);
    ct_set_recompute_enabled(false);
    ct_clear_error();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool ready;
    if (!ready) {
        /* One thread: every input replays exactly, whatever ran before. */
        ct_set_num_threads(1);
        ready = true;
    }
    cti_alloc_stats before = cti_get_alloc_stats();
    prog g = {.p = data, .n = size};
    ct_manual_seed(0);
    g.gen = ct_generator_new(1);
    if (!g.gen) return 0;
    seed_pool(&g);
    run(&g);
    epilogue(&g);
    teardown(&g);
    cti_alloc_stats after = cti_get_alloc_stats();
    if (after.live_tensors != before.live_tensors || after.live_storages != before.live_storages) {
        fprintf(stderr, "op_program: %lld tensors and %lld storages left alive after the program\n",
                (long long)(after.live_tensors - before.live_tensors),
                (long long)(after.live_storages - before.live_storages));
        abort();
    }
    return 0;
}
