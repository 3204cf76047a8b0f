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
static const cti_backend *const builtin[] = {CTI_BACKEND_LIST(REF_)};
#undef REF_
enum { NUM_BUILTIN = sizeof builtin / sizeof builtin[0] };

/* The built-in backends, then the modules that loaded; written once, by
 * init, and read-only after. */
static const cti_backend *backends[CT_NUM_DEVICE_TYPES + NUM_BUILTIN];
static int num_backends;

const cti_backend *cti_backend_of(ct_device_type device) {
    cti_init();
    for (int k = 0; k < num_backends; k++)
        if (backends[k]->device == device) return backends[k];
    return NULL;
}

/* "cten was built without the cuda backend", per device type; set by init. */
static char not_built[CT_NUM_DEVICE_TYPES][64];

const char *cti_backend_missing(ct_device_type device) {
    if ((unsigned)device >= CT_NUM_DEVICE_TYPES) return "no such device type";
    if (cti_backend_of(device)) return "";
    const char *why = cti_module_missing(device);
    return why ? why : not_built[device];
}

/* ---- trace and profile -------------------------------------------------------- */
static atomic_bool trace_on, profile_on;
/* CT_PROFILE=sync / ct_set_profile_sync: the device waits before and after
 * each timed kernel, so a GPU op's time is its device time rather than its
 * launch's. */
static atomic_bool timing_sync;

/* The trace's filter: the ops shown (every op when trace_every), and the
 * shortest time a successful line needs; failures always show. */
static atomic_bool trace_every = true;
static atomic_bool trace_op[CT_NUM_OPS];
static _Atomic uint64_t trace_min_ns;

/* Dispatches running on this thread: an error raised inside one is shown on
 * its trace line, not again by the error hook. */
static _Thread_local int dispatch_depth;

typedef struct trace_filter {
    bool every;
    bool op[CT_NUM_OPS];
    uint64_t min_ns;
} trace_filter;

static int op_by_name(const char *name, size_t len) {
    if (len > 3 && strncmp(name, "ct_", 3) == 0) name += 3, len -= 3;
    for (int k = 0; k < CT_NUM_OPS; k++)
        if (strlen(cti_schema_rows[k].name) == len && strncmp(cti_schema_rows[k].name, name, len) == 0)
            return k;
    return -1;
}

/* "min=<number><ns|us|ms|s>" into *ns. */
static bool parse_min_time(const char *v, size_t len, uint64_t *ns) {
    char buf[64], *end;
    if (len == 0 || len >= sizeof buf) return false;
    memcpy(buf, v, len);
    buf[len] = '\0';
    double x = strtod(buf, &end);
    double unit = strcmp(end, "ns") == 0 ? 1 : strcmp(end, "us") == 0 ? 1e3
                : strcmp(end, "ms") == 0 ? 1e6 : strcmp(end, "s") == 0 ? 1e9 : -1;
    if (end == buf || unit < 0 || !(x >= 0) || x * unit > 1e18) return false;
    *ns = (uint64_t)(x * unit);
    return true;
}

/* spec: comma-separated op names ("matmul", "ct_conv2d"), "all" (or "1"),
 * and "min=<time>"; NULL or "" means every op. */
static ct_status parse_trace_filter(const char *op, const char *spec, trace_filter *f) {
    memset(f, 0, sizeof *f);
    f->every = true;
    if (!spec) return CT_OK;
    bool named = false, all = false;
    for (const char *p = spec; *p;) {
        while (*p == ',' || *p == ' ') p++;
        size_t len = strcspn(p, ", ");
        if (len == 0) break;
        if ((len == 3 && strncmp(p, "all", 3) == 0) || (len == 1 && *p == '1')) {
            all = true;
        } else if (len > 4 && strncmp(p, "min=", 4) == 0) {
            if (!parse_min_time(p + 4, len - 4, &f->min_ns))
                return cti_error(CT_ERR_INVALID_ARG,
                                 "%s: '%.*s' in \"%s\" is not a time (expected min=<number> with "
                                 "ns, us, ms or s, e.g. min=50us)",
                                 op, (int)len, p, spec);
        } else {
            int k = op_by_name(p, len);
            if (k < 0)
                return cti_error(CT_ERR_INVALID_ARG,
                                 "%s: unknown op '%.*s' in \"%s\" (expected op names such as "
                                 "matmul or conv2d, 'all', or min=<time>)",
                                 op, (int)len, p, spec);
            f->op[k] = true;
            named = true;
        }
        p += len;
    }
    f->every = all || !named;
    return CT_OK;
}

static void apply_trace_filter(const trace_filter *f) {
    for (int k = 0; k < CT_NUM_OPS; k++) atomic_store(&trace_op[k], f->op[k]);
    atomic_store(&trace_min_ns, f->min_ns);
    atomic_store(&trace_every, f->every);
}

static bool traced_op(int op) {
    return atomic_load_explicit(&trace_every, memory_order_relaxed) ||
           ((unsigned)op < CT_NUM_OPS && atomic_load_explicit(&trace_op[op], memory_order_relaxed));
}

/* Errors raised outside a kernel (argument checks, a missing kernel, any
 * other call) get a line of their own; the op is read off the message's
 * "ct_name:" prefix for the filter. */
static void trace_error_hook(ct_status s, const char *msg) {
    if (!atomic_load_explicit(&trace_on, memory_order_relaxed) || dispatch_depth > 0) return;
    if (!atomic_load_explicit(&trace_every, memory_order_relaxed)) {
        size_t len = strcspn(msg, ": ");
        if (!traced_op(op_by_name(msg, len))) return;
    }
    fprintf(stderr, "[cten] FAILED %s: %s\n", ct_status_name(s), msg);
}

ct_status ct_set_trace_filter(const char *spec) {
    trace_filter f;
    ct_status st = parse_trace_filter("ct_set_trace_filter", spec, &f);
    if (st != CT_OK) return st;
    cti_init();
    apply_trace_filter(&f);
    return CT_OK;
}

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
    for (int d = 0; d < CT_NUM_DEVICE_TYPES; d++) {
        char name[16];
        ct_device_str((ct_device){(ct_device_type)d, 0}, name, sizeof name);
        name[strcspn(name, ":")] = '\0';
        snprintf(not_built[d], sizeof not_built[d], "cten was built without the %s backend", name);
    }
    for (int k = 0; k < NUM_BUILTIN; k++) backends[num_backends++] = builtin[k];
    /* A module that does not load is not a failure: the library runs
     * without its devices and says why (cti_backend_missing). */
    num_backends += cti_modules_load(backends + num_backends,
                                     (int)(sizeof backends / sizeof backends[0]) - num_backends);
    registering = true;
    for (int k = 0; k < num_backends; k++) backends[k]->register_kernels();
    registering = false;
    if (first_refusal != CT_OK) return cti_error(first_refusal, "%s", first_refusal_msg);
    return check_backward_kernels();
}

/* Set on the thread running init: what init calls (a module's
 * registration, cti_backend_of) may call cti_init again, which must not
 * wait for itself. */
static _Thread_local bool in_init;

static void init_impl(void) {
    in_init = true;
    /* Init runs inside whatever call came first: keep that call's error
     * state as it was unless init itself fails. */
    ct_status prev = ct_last_status();
    char prev_msg[512];
    snprintf(prev_msg, sizeof prev_msg, "%s", ct_last_error());
    init_status = init_checked();
    if (init_status != CT_OK) snprintf(init_message, sizeof init_message, "%s", ct_last_error());
    else if (prev != CT_OK) cti_error(prev, "%s", prev_msg);
    else ct_clear_error();
    /* CT_TRACE=1 shows every op; otherwise it is a filter (ct_set_trace_filter). */
    const char *tv = getenv("CT_TRACE");
    bool tron = env_flag("CT_TRACE");
    if (tron && strcmp(tv, "1") != 0) {
        trace_filter f;
        ct_status prev_st = ct_last_status();
        char keep[512];
        snprintf(keep, sizeof keep, "%s", ct_last_error());
        if (parse_trace_filter("CT_TRACE", tv, &f) == CT_OK)
            apply_trace_filter(&f);
        else
            fprintf(stderr, "[cten] %s; tracing every op\n", ct_last_error());
        if (prev_st != CT_OK) cti_error(prev_st, "%s", keep);
        else ct_clear_error();
    }
    cti_set_error_hook(trace_error_hook);
    atomic_store(&trace_on, tron);
    atomic_store(&profile_on, env_flag("CT_PROFILE"));
    const char *pv = getenv("CT_PROFILE");
    atomic_store(&timing_sync, pv && !strcmp(pv, "sync"));
    atexit(profile_at_exit);
    in_init = false;
    atomic_store_explicit(&initialized, true, memory_order_release);
}

void cti_init(void) {
    if (atomic_load_explicit(&initialized, memory_order_acquire) || in_init) return;
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
void ct_set_profile_sync(bool on) {
    cti_init();
    atomic_store(&timing_sync, on);
}
bool ct_profile_sync_enabled(void) {
    cti_init();
    return atomic_load(&timing_sync);
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
        snprintf(buf + pos, sizeof buf - (size_t)pos, " kernel=%s %.3f us", kernel, ns / 1e3);
    if (st == CT_OK) fprintf(stderr, "%s\n", buf);
    else fprintf(stderr, "%s FAILED %s: %s\n", buf, ct_status_name(st), ct_last_error());
}

/* The front end passed a parameter struct other than the schema's. */
static ct_status params_mismatch(const ct_call *c) {
    const cti_op_info *r = &cti_schema_rows[c->op];
    return cti_error(CT_ERR_INVALID_ARG,
                     "dispatch: ct_%s was called with %zu bytes of parameters, its schema has "
                     "%s (%zu bytes)",
                     r->name, c->params_size, r->params_name, r->params_size);
}

/* ---- the capture guard ---------------------------------------------------------------- */

static _Thread_local const cti_capture_guard *guard;
/* Threads with a guard installed: a call on any thread reads this one word
 * unless some thread captures. */
static atomic_int guarded_threads;

void cti_dispatch_guard(const cti_capture_guard *g) {
    if (g && !guard) atomic_fetch_add(&guarded_threads, 1);
    if (!g && guard) atomic_fetch_sub(&guarded_threads, 1);
    guard = g;
}

/* The first tensor of c that is not on the guard's device, or NULL. */
static const ct_tensor *off_device(const ct_call *c, ct_device want) {
    for (int i = 0; i < c->nin + c->nout; i++) {
        const ct_tensor *t = i < c->nin ? c->in[i] : c->out[i - c->nin];
        if (t && !ct_device_eq(t->storage->device, want)) return t;
    }
    return NULL;
}

static ct_status guard_refuses(const ct_call *c) {
    const ct_tensor *t = off_device(c, guard->device);
    if (!t) return CT_OK;
    char dev[32];
    ct_device_str(guard->device, dev, sizeof dev);
    ct_status st;
    if (c->op == CT_OP_COPY && t->storage->device.type == CT_DEVICE_CPU)
        st = cti_error(CT_ERR_CAPTURE,
                       "ct_copy_: a copy between the host and %s cannot be captured (this thread "
                       "%s on %s, and a replay does not read or write host memory); copy new "
                       "inputs into the graph's static input tensors before "
                       "ct_cuda_graph_replay and read its outputs after it",
                       dev, guard->what, dev);
    else
        st = cti_error(CT_ERR_CAPTURE,
                       "ct_%s: %s: this thread %s on %s, and work on the host or another "
                       "device would run once, now, and never at replay; keep every tensor of "
                       "the captured work on %s",
                       cti_schema_rows[c->op].name, cti_desc(t), guard->what, dev, dev);
    guard->refused(guard->ctx, st, ct_last_error());
    return st;
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
    if (atomic_load_explicit(&guarded_threads, memory_order_relaxed) && guard &&
        guard_refuses(c) != CT_OK)
        return ct_last_status();
    bool tr = atomic_load_explicit(&trace_on, memory_order_relaxed);
    bool pr = atomic_load_explicit(&profile_on, memory_order_relaxed);
    if (!tr && !pr) return e->fn(c);
    /* A capturing thread cannot wait (the wait would end its capture); an op
     * nested in another is inside the outer one's waits already. */
    const cti_backend *wait_on = NULL;
    if (atomic_load_explicit(&timing_sync, memory_order_relaxed) && device.type != CT_DEVICE_CPU &&
        !guard && dispatch_depth == 0)
        wait_on = cti_backend_of(device.type);
    ct_status st = CT_OK;
    if (wait_on && wait_on->synchronize) st = wait_on->synchronize(device.index);
    if (st != CT_OK) return st;
    uint64_t t0 = now_ns();
    dispatch_depth++;
    st = e->fn(c);
    if (st == CT_OK && wait_on && wait_on->synchronize) st = wait_on->synchronize(device.index);
    dispatch_depth--;
    uint64_t ns = now_ns() - t0;
    if (tr && traced_op(c->op) &&
        (st != CT_OK || ns >= atomic_load_explicit(&trace_min_ns, memory_order_relaxed)))
        trace_line(c, device, dtype, c->routine ? c->routine : e->name, ns, st);
    if (pr) {
        pthread_mutex_lock(&profile_lock);
        profile[c->op][device.type][dtype].count++;
        profile[c->op][device.type][dtype].total_ns += ns;
        pthread_mutex_unlock(&profile_lock);
    }
    return st;
}

ct_status cti_dispatch_one(ct_op op, const void *p, size_t psize, int nin, ct_tensor *const *in,
                           ct_tensor *out, ct_device device, ct_dtype dtype) {
    assert(nin >= 0 && nin <= CTI_CALL_MAX_IN);
    ct_call c;
    cti_call_init(&c, op);
    c.params = p;
    c.params_size = psize;
    for (int i = 0; i < nin; i++) c.in[i] = in[i];
    c.nin = nin;
    c.out[0] = out;
    c.nout = 1;
    return cti_dispatch(&c, device, dtype);
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

