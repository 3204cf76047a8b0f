/* The kernel table, the schema as data, the backends, library init, the
 * trace and the profile. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cten_backends.h"
#include "dispatch_impl.h"

typedef struct entry {
    cti_kernel_fn fn;
    const char *name;
} entry;

static entry table[CT_NUM_OPS][CT_NUM_DEVICE_TYPES][CT_NUM_DTYPES];

/* ---- the schema ------------------------------------------------------------------ */
#define CTI_F(fn) CTI_GRAD_FORMULA
#define CTI_NODIFF CTI_GRAD_NONE
#define CTI_NOFORMULA CTI_GRAD_NOFORMULA
/* A row's backward column is an op id suffix or NONE. */
#define CT_OP_NONE (-1)
#define ROW_(ID, nm, P, grad, bw)                                                            \
    {CT_OP_##ID, nm, #P,                                                                     \
     _Generic(*(P *)0, cti_no_params: (size_t)0, default: sizeof(P)), grad, (int)CT_OP_##bw},
const cti_op_info cti_schema_rows[CT_NUM_OPS] = {CTI_OP_SCHEMA(ROW_)};
#undef ROW_
#undef CT_OP_NONE
#undef CTI_F
#undef CTI_NODIFF
#undef CTI_NOFORMULA

/* Formula names as the schema spells them: an empty one is a differentiable
 * op without a formula, which the validation refuses. */
#define CTI_F(fn) #fn
#define CTI_NODIFF ""
#define CTI_NOFORMULA ""
#define FNAME_(ID, nm, P, grad, bw) grad,
static const char *const formula_names[CT_NUM_OPS] = {CTI_OP_SCHEMA(FNAME_)};
#undef FNAME_
#undef CTI_F
#undef CTI_NODIFF
#undef CTI_NOFORMULA

const char *ct_op_name(ct_op op) {
    return (unsigned)op < CT_NUM_OPS ? cti_schema_rows[op].name : "invalid";
}

ct_status cti_schema_validate(const cti_op_info *rows, int n, const bool *has_formula) {
    for (int k = 0; k < n; k++) {
        const cti_op_info *r = &rows[k];
        if ((int)r->id != k)
            return cti_error(CT_ERR_INVALID_ARG, "schema: row %d has id %d (rows must be in id order)",
                             k, (int)r->id);
        if (!r->name || !*r->name)
            return cti_error(CT_ERR_INVALID_ARG, "schema: op %d has no name", k);
        for (int j = 0; j < k; j++)
            if (strcmp(rows[j].name, r->name) == 0)
                return cti_error(CT_ERR_INVALID_ARG, "schema: ops %d and %d are both named %s", j,
                                 k, r->name);
        if (r->backward != -1 && (r->backward < 0 || r->backward >= n || r->backward == k))
            return cti_error(CT_ERR_INVALID_ARG,
                             "schema: op %s names backward op %d, expected another op of the %d",
                             r->name, r->backward, n);
        if (r->backward != -1 && r->grad != CTI_GRAD_FORMULA)
            return cti_error(CT_ERR_INVALID_ARG,
                             "schema: op %s names backward op %s but no backward formula",
                             r->name, rows[r->backward].name);
        if (r->grad == CTI_GRAD_FORMULA && !has_formula[k])
            return cti_error(CT_ERR_INVALID_ARG,
                             "schema: op %s is differentiable but names no backward formula",
                             r->name);
    }
    return CT_OK;
}

/* ---- registration ---------------------------------------------------------------- */
/* The first registration refused during init, which fails init. */
static bool registering;
static ct_status first_refusal = CT_OK;
static char first_refusal_msg[512];

static ct_status refuse(ct_status st) {
    if (registering && first_refusal == CT_OK) {
        first_refusal = st;
        snprintf(first_refusal_msg, sizeof first_refusal_msg, "%s", ct_last_error());
    }
    return st;
}

ct_status cti_register_kernel(ct_op op, ct_device_type device, ct_dtype dtype, cti_kernel_fn fn,
                              const char *name) {
    if ((unsigned)op >= CT_NUM_OPS || (unsigned)device >= CT_NUM_DEVICE_TYPES ||
        (unsigned)dtype >= CT_NUM_DTYPES || !fn)
        return refuse(cti_error(
            CT_ERR_INVALID_ARG,
            "cti_register_kernel: %s for op %d, device %d, dtype %d: expected an op below %d, a "
            "device below %d, a dtype below %d and a function",
            name ? name : "(unnamed)", (int)op, (int)device, (int)dtype, (int)CT_NUM_OPS,
            (int)CT_NUM_DEVICE_TYPES, (int)CT_NUM_DTYPES));
    entry *e = &table[op][device][dtype];
    if (e->fn) {
        char dev[32];
        return refuse(cti_error(CT_ERR_INVALID_ARG,
                                "cti_register_kernel: %s/%s/%s registered twice (%s, then %s)",
                                cti_schema_rows[op].name,
                                ct_device_str((ct_device){device, 0}, dev, sizeof dev),
                                ct_dtype_name(dtype), e->name, name ? name : "(unnamed)"));
    }
    e->fn = fn;
    e->name = name ? name : cti_schema_rows[op].name;
    return CT_OK;
}

/* Every (device, floating dtype) with a kernel for a differentiable op needs
 * one for its backward op, or backward would fail where forward worked. */
static ct_status check_backward_kernels(void) {
    for (int op = 0; op < CT_NUM_OPS; op++) {
        int bw = cti_schema_rows[op].backward;
        if (bw < 0) continue;
        for (int d = 0; d < CT_NUM_DEVICE_TYPES; d++)
            for (int t = 0; t < CT_NUM_DTYPES; t++)
                if (ct_dtype_is_floating((ct_dtype)t) && table[op][d][t].fn &&
                    !table[bw][d][t].fn) {
                    char dev[32];
                    return cti_error(CT_ERR_INVALID_ARG,
                                     "init: %s has a %s %s kernel but its backward op %s has none",
                                     cti_schema_rows[op].name,
                                     ct_device_str((ct_device){(ct_device_type)d, 0}, dev, sizeof dev),
                                     ct_dtype_name((ct_dtype)t), cti_schema_rows[bw].name);
                }
    }
    return CT_OK;
}

/* ---- backends ----------------------------------------------------------------------- */
#define DECLARE_(b) extern const cti_backend cti_backend_##b;
CTI_BACKEND_LIST(DECLARE_)
#undef DECLARE_
#define REF_(b) &cti_backend_##b,
static const cti_backend *const backends[] = {CTI_BACKEND_LIST(REF_)};
#undef REF_
enum { NUM_BACKENDS = sizeof backends / sizeof backends[0] };

const cti_backend *cti_backend_of(ct_device_type device) {
    for (int k = 0; k < NUM_BACKENDS; k++)
        if (backends[k]->device == device) return backends[k];
    return NULL;
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
static ct_status init_status = CT_OK;
static char init_message[512];

static ct_status init_checked(void) {
    bool has_formula[CT_NUM_OPS];
    for (int k = 0; k < CT_NUM_OPS; k++)
        has_formula[k] = formula_names[k][0] && strcmp(formula_names[k], "NULL") != 0;
    ct_status st = cti_schema_validate(cti_schema_rows, CT_NUM_OPS, has_formula);
    if (st != CT_OK) return st;
    registering = true;
    for (int k = 0; k < NUM_BACKENDS; k++) backends[k]->register_kernels();
    registering = false;
    if (first_refusal != CT_OK) return cti_error(first_refusal, "%s", first_refusal_msg);
    return check_backward_kernels();
}

static void init_impl(void) {
    /* Init runs inside whatever call came first: keep that call's error
     * state as it was unless init itself fails. */
    ct_status prev = ct_last_status();
    char prev_msg[512];
    snprintf(prev_msg, sizeof prev_msg, "%s", ct_last_error());
    init_status = init_checked();
    if (init_status != CT_OK) snprintf(init_message, sizeof init_message, "%s", ct_last_error());
    else if (prev != CT_OK) cti_error(prev, "%s", prev_msg);
    else ct_clear_error();
    atomic_store(&trace_on, env_flag("CT_TRACE"));
    atomic_store(&profile_on, env_flag("CT_PROFILE"));
    atexit(profile_at_exit);
    atomic_store_explicit(&initialized, true, memory_order_release);
}

void cti_init(void) {
    if (atomic_load_explicit(&initialized, memory_order_acquire)) return;
    pthread_once(&init_once, init_impl);
}

ct_status cti_init_status(const char **msg) {
    cti_init();
    if (msg) *msg = init_message;
    return init_status;
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

/* The snapshot buffer is too large for a thread's stack, so it is static
 * and printing is serialized by its own lock, leaving profile_lock (which
 * every profiled op takes) free while lines are written out. */
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

void ct_profile_print(void *file) {
    FILE *f = file ? (FILE *)file : stderr;
    static prof_line lines[CT_NUM_OPS * CT_NUM_DEVICE_TYPES * CT_NUM_DTYPES];
    pthread_mutex_lock(&print_lock);
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
                cti_schema_rows[l->op].name, l->dev == CT_DEVICE_CPU ? "cpu" : "cuda",
                ct_dtype_name((ct_dtype)l->dt), (unsigned long long)l->row.count,
                l->row.total_ns / 1e6, l->row.total_ns / 1e3 / (double)l->row.count,
                total ? 100.0 * (double)l->row.total_ns / (double)total : 0.0);
    }
    pthread_mutex_unlock(&print_lock);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void trace_line(const ct_call *c, ct_device device, ct_dtype dtype, const char *kernel,
                       uint64_t ns, ct_status st) {
    char buf[1024], dev[32];
    int pos = snprintf(buf, sizeof buf, "[cten] %-22s %-7s %-8s", cti_schema_rows[c->op].name,
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

/* The front end passed a parameter struct other than the schema's. */
static ct_status params_mismatch(const ct_call *c) {
    const cti_op_info *r = &cti_schema_rows[c->op];
    return cti_error(CT_ERR_INVALID_ARG,
                     "dispatch: ct_%s was called with %zu bytes of parameters, its schema has "
                     "%s (%zu bytes)",
                     r->name, c->params_size, r->params_name, r->params_size);
}

ct_status cti_dispatch(ct_call *c, ct_device device, ct_dtype dtype) {
    cti_init();
    if ((unsigned)c->op >= CT_NUM_OPS || (unsigned)device.type >= CT_NUM_DEVICE_TYPES ||
        (unsigned)dtype >= CT_NUM_DTYPES)
        return cti_error(CT_ERR_INVALID_ARG, "dispatch: invalid op %d, device %d or dtype %d",
                         (int)c->op, (int)device.type, (int)dtype);
    if (init_status != CT_OK)
        return cti_error(init_status, "ct_%s: cten failed to initialize: %s", cti_schema_rows[c->op].name,
                         init_message);
    const entry *e = &table[c->op][device.type][dtype];
    if (!e->fn) {
        char dev[32];
        return cti_error(CT_ERR_UNSUPPORTED, "ct_%s: no kernel for device %s and dtype %s",
                         cti_schema_rows[c->op].name, ct_device_str(device, dev, sizeof dev),
                         ct_dtype_name(dtype));
    }
    if (c->params_size != cti_schema_rows[c->op].params_size) return params_mismatch(c);
    bool tr = atomic_load_explicit(&trace_on, memory_order_relaxed);
    bool pr = atomic_load_explicit(&profile_on, memory_order_relaxed);
    if (!tr && !pr) return e->fn(c);
    uint64_t t0 = now_ns();
    ct_status st = e->fn(c);
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

