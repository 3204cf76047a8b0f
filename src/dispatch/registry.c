/* The kernel table, library init, the trace and the profile. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "autograd/autograd_impl.h"
#include "backends/cpu/cpu_impl.h"
#include "dispatch_impl.h"

typedef struct entry {
    cti_kernel_fn fn;
    const char *name;
} entry;

static entry table[CT_NUM_OPS][CT_NUM_DEVICE_TYPES][CT_NUM_DTYPES];

static const char *op_names[CT_NUM_OPS] = {
#define CT_OP_NAME_(id, name) name,
    CT_OP_LIST(CT_OP_NAME_)
#undef CT_OP_NAME_
};

const char *ct_op_name(ct_op op) {
    return (unsigned)op < CT_NUM_OPS ? op_names[op] : "invalid";
}

void cti_register_kernel(ct_op op, ct_device_type device, ct_dtype dtype, cti_kernel_fn fn,
                         const char *name) {
    if ((unsigned)op >= CT_NUM_OPS || (unsigned)device >= CT_NUM_DEVICE_TYPES ||
        (unsigned)dtype >= CT_NUM_DTYPES)
        return;
    table[op][device][dtype].fn = fn;
    table[op][device][dtype].name = name;
}

/* ---- trace and profile -------------------------------------------------------- */
static atomic_bool trace_on, profile_on;

typedef struct prof_row {
    uint64_t count;
    uint64_t total_ns;
} prof_row;
static prof_row profile[CT_NUM_OPS][CT_NUM_DEVICE_TYPES][CT_NUM_DTYPES];
static pthread_mutex_t profile_lock = PTHREAD_MUTEX_INITIALIZER;

static bool env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static void profile_at_exit(void) {
    if (atomic_load(&profile_on)) ct_profile_print(NULL);
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static atomic_bool initialized;

#ifdef CTEN_HAVE_CUDA
void cti_cuda_register(void); /* src/backends/cuda/register.c */
#endif

static void init_impl(void) {
    cti_cpu_register();
#ifdef CTEN_HAVE_CUDA
    cti_cuda_register();
#endif
    atomic_store(&trace_on, env_flag("CT_TRACE"));
    atomic_store(&profile_on, env_flag("CT_PROFILE"));
    atexit(profile_at_exit);
    atomic_store_explicit(&initialized, true, memory_order_release);
}

void cti_init(void) {
    if (atomic_load_explicit(&initialized, memory_order_acquire)) return;
    pthread_once(&init_once, init_impl);
}

void ct_set_trace(bool on) {
    cti_init();
    atomic_store(&trace_on, on);
}
bool ct_trace_enabled(void) {
    cti_init();
    return atomic_load(&trace_on);
}
void ct_set_profile(bool on) {
    cti_init();
    atomic_store(&profile_on, on);
}
bool ct_profile_enabled(void) {
    cti_init();
    return atomic_load(&profile_on);
}

void ct_profile_reset(void) {
    pthread_mutex_lock(&profile_lock);
    memset(profile, 0, sizeof profile);
    pthread_mutex_unlock(&profile_lock);
}

typedef struct prof_line {
    int op, dev, dt;
    prof_row row;
} prof_line;

static int by_total_desc(const void *a, const void *b) {
    uint64_t x = ((const prof_line *)a)->row.total_ns, y = ((const prof_line *)b)->row.total_ns;
    return x < y ? 1 : x > y ? -1 : 0;
}

void ct_profile_print(void *file) {
    FILE *f = file ? (FILE *)file : stderr;
    static prof_line lines[CT_NUM_OPS * CT_NUM_DEVICE_TYPES * CT_NUM_DTYPES];
    int n = 0;
    uint64_t total = 0;
    pthread_mutex_lock(&profile_lock);
    for (int o = 0; o < CT_NUM_OPS; o++)
        for (int d = 0; d < CT_NUM_DEVICE_TYPES; d++)
            for (int t = 0; t < CT_NUM_DTYPES; t++)
                if (profile[o][d][t].count) {
                    lines[n++] = (prof_line){o, d, t, profile[o][d][t]};
                    total += profile[o][d][t].total_ns;
                }
    pthread_mutex_unlock(&profile_lock);
    qsort(lines, (size_t)n, sizeof lines[0], by_total_desc);
    fprintf(f, "cten profile: %-26s %-6s %-9s %10s %12s %12s %6s\n", "op", "device", "dtype",
            "calls", "total ms", "mean us", "%");
    for (int i = 0; i < n; i++) {
        prof_line *l = &lines[i];
        char dev[16];
        ct_device_str((ct_device){(ct_device_type)l->dev, 0}, dev, sizeof dev);
        if (l->dev == CT_DEVICE_CPU) snprintf(dev, sizeof dev, "cpu");
        fprintf(f, "cten profile: %-26s %-6s %-9s %10llu %12.3f %12.3f %6.1f\n",
                op_names[l->op], l->dev == CT_DEVICE_CPU ? "cpu" : "cuda",
                ct_dtype_name((ct_dtype)l->dt), (unsigned long long)l->row.count,
                l->row.total_ns / 1e6, l->row.total_ns / 1e3 / (double)l->row.count,
                total ? 100.0 * (double)l->row.total_ns / (double)total : 0.0);
    }
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void trace_line(const ct_call *c, ct_device device, ct_dtype dtype, const char *kernel,
                       uint64_t ns, ct_status st) {
    char buf[1024], dev[32];
    int pos = snprintf(buf, sizeof buf, "[cten] %-22s %-7s %-8s", op_names[c->op],
                       ct_device_str(device, dev, sizeof dev), ct_dtype_name(dtype));
    for (int i = 0; i < c->nin && pos < (int)sizeof buf; i++) {
        const ct_tensor *t = c->in[i];
        pos += snprintf(buf + pos, sizeof buf - (size_t)pos, "%s%s", i ? " " : " in=",
                        t ? cti_shape_s(t->ndim, t->shape) : "-");
    }
    for (int i = 0; i < c->nout && pos < (int)sizeof buf; i++) {
        const ct_tensor *t = c->out[i];
        pos += snprintf(buf + pos, sizeof buf - (size_t)pos, "%s%s", i ? " " : " out=",
                        t ? cti_shape_s(t->ndim, t->shape) : "-");
    }
    if (pos < (int)sizeof buf)
        snprintf(buf + pos, sizeof buf - (size_t)pos, " kernel=%s %.3f us%s", kernel, ns / 1e3,
                 st == CT_OK ? "" : " FAILED");
    fprintf(stderr, "%s\n", buf);
}

/* ---- ops without a backward formula ------------------------------------------------
 * The backward ops are differentiable in PyTorch (double backward); cten has
 * no formulas for them. Their results still get a graph node when an input
 * requires grad, so a backward that reaches them fails naming the op instead
 * of cutting the graph and leaving a silent zero. */
static bool no_formula[CT_NUM_OPS] = {
    [CT_OP_CONV2D_BACKWARD_INPUT] = true,   [CT_OP_CONV2D_BACKWARD_WEIGHT] = true,
    [CT_OP_CONV2D_BACKWARD_BIAS] = true,    [CT_OP_MAX_POOL2D_BACKWARD] = true,
    [CT_OP_AVG_POOL2D_BACKWARD] = true,     [CT_OP_ADAPTIVE_AVG_POOL2D_BACKWARD] = true,
    [CT_OP_RMS_NORM_BACKWARD] = true,       [CT_OP_LAYER_NORM_BACKWARD] = true,
    [CT_OP_SOFTMAX_BACKWARD] = true,        [CT_OP_LOG_SOFTMAX_BACKWARD] = true,
    [CT_OP_CROSS_ENTROPY_BACKWARD] = true,  [CT_OP_NLL_LOSS_BACKWARD] = true,
    [CT_OP_MSE_LOSS_BACKWARD] = true,       [CT_OP_EMBEDDING_BACKWARD] = true,
    [CT_OP_DROPOUT_BACKWARD] = true,
};

static ct_status refuse_backward(cti_node *n, ct_tensor *const *go, ct_tensor **gi) {
    (void)go;
    (void)gi;
    return cti_error(CT_ERR_AUTOGRAD,
                     "ct_backward: ct_%s has no backward formula (double backward is not "
                     "supported); compute its input without requires_grad or detach it",
                     n->name);
}

static ct_status record_without_formula(ct_call *c) {
    int nout = 0;
    ct_tensor *outs[CTI_CALL_MAX_OUT];
    for (int k = 0; k < c->nout; k++)
        if (c->out[k]) outs[nout++] = c->out[k];
    return cti_ag_record(op_names[c->op], refuse_backward, c->nin, c->in, nout, outs, 0, NULL,
                         NULL, 0, NULL, 0);
}

static ct_status run_kernel(const entry *e, ct_call *c) {
    ct_status st = e->fn(c);
    if (st == CT_OK && no_formula[c->op] && cti_ag_needed(c->nin, c->in))
        st = record_without_formula(c);
    return st;
}

ct_status cti_dispatch(ct_call *c, ct_device device, ct_dtype dtype) {
    cti_init();
    if ((unsigned)c->op >= CT_NUM_OPS || (unsigned)device.type >= CT_NUM_DEVICE_TYPES ||
        (unsigned)dtype >= CT_NUM_DTYPES)
        return cti_error(CT_ERR_INVALID_ARG, "dispatch: invalid op %d, device %d or dtype %d",
                         (int)c->op, (int)device.type, (int)dtype);
    const entry *e = &table[c->op][device.type][dtype];
    if (!e->fn) {
        char dev[32];
        return cti_error(CT_ERR_UNSUPPORTED, "ct_%s: no kernel for device %s and dtype %s",
                         op_names[c->op], ct_device_str(device, dev, sizeof dev),
                         ct_dtype_name(dtype));
    }
    bool tr = atomic_load_explicit(&trace_on, memory_order_relaxed);
    bool pr = atomic_load_explicit(&profile_on, memory_order_relaxed);
    if (!tr && !pr) return run_kernel(e, c);
    uint64_t t0 = now_ns();
    ct_status st = run_kernel(e, c);
    uint64_t ns = now_ns() - t0;
    if (tr) trace_line(c, device, dtype, c->routine ? c->routine : e->name, ns, st);
    if (pr) {
        pthread_mutex_lock(&profile_lock);
        profile[c->op][device.type][dtype].count++;
        profile[c->op][device.type][dtype].total_ns += ns;
        pthread_mutex_unlock(&profile_lock);
    }
    return st;
}

bool ct_supports(ct_op op, ct_device_type device, ct_dtype dtype) {
    return ct_kernel_name(op, device, dtype) != NULL;
}

const char *ct_kernel_name(ct_op op, ct_device_type device, ct_dtype dtype) {
    cti_init();
    if ((unsigned)op >= CT_NUM_OPS || (unsigned)device >= CT_NUM_DEVICE_TYPES ||
        (unsigned)dtype >= CT_NUM_DTYPES)
        return NULL;
    return table[op][device][dtype].fn ? table[op][device][dtype].name : NULL;
}

/* ---- shared front-end checks ----------------------------------------------------- */
ct_status cti_check_not_null(const char *op, int n, ct_tensor *const *ts) {
    for (int i = 0; i < n; i++) {
        if (ts[i]) continue;
        /* A NULL argument is usually the result of a failed call nested in
         * this one: keep that call's message, it names the cause. */
        if (ct_last_status() != CT_OK)
            return cti_error(CT_ERR_INVALID_ARG, "%s: argument %d is NULL (last error: %s)", op,
                             i + 1, ct_last_error());
        return cti_error(CT_ERR_INVALID_ARG, "%s: argument %d is NULL", op, i + 1);
    }
    return CT_OK;
}

ct_status cti_check_same_device(const char *op, int n, ct_tensor *const *ts) {
    const ct_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        if (!first) {
            first = ts[i];
            continue;
        }
        if (!ct_device_eq(first->storage->device, ts[i]->storage->device)) {
            char a[32], b[32];
            return cti_error(CT_ERR_DEVICE,
                             "%s: expected all tensors on one device, got %s and %s (%s and %s)",
                             op, ct_device_str(first->storage->device, a, sizeof a),
                             ct_device_str(ts[i]->storage->device, b, sizeof b), cti_desc(first),
                             cti_desc(ts[i]));
        }
    }
    return CT_OK;
}

ct_status cti_check_floating(const char *op, const ct_tensor *t, const char *argname) {
    if (ct_dtype_is_floating(t->dtype)) return CT_OK;
    return cti_error(CT_ERR_DTYPE, "%s: expected a floating dtype for %s, got %s", op, argname,
                     ct_dtype_name(t->dtype));
}

void cti_call_release_outputs(ct_call *c) {
    for (int i = 0; i < c->nout; i++) {
        ct_tensor_release(c->out[i]);
        c->out[i] = NULL;
    }
}
