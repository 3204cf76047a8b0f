/* OpenBLAS setup: makes sure the library runs the best GEMM kernels for this
 * CPU, shares the thread count with the pool, and keeps OpenBLAS's idle
 * workers from taking the pool's cores (shorten_worker_spin below).
 *
 * Why: a DYNAMIC_ARCH OpenBLAS picks its kernels once, when it is loaded, from
 * a table of CPU models it knows. A CPU newer than the OpenBLAS release (e.g.
 * a Xeon Emerald Rapids under Debian 12's 0.3.21) is not in the table and gets
 * the SSE3 "Prescott" kernels: sgemm runs at a fifth of the speed the AVX-512
 * kernels reach on the same cores.
 *
 * What: at init, unless the user chose a core with OPENBLAS_CORETYPE, compare
 * the kernels OpenBLAS chose with what cpuid (and the OS, through XCR0) says
 * the CPU can run. When OpenBLAS chose a kernel family below that, re-run its
 * own selection forced to the better family: gotoblas_dynamic_quit() clears
 * the choice, gotoblas_dynamic_init() makes a new one, reading
 * OPENBLAS_CORETYPE, which is set only for that call and removed right after.
 * These entry points exist only in DYNAMIC_ARCH builds, so they are looked up
 * at run time, never linked: any other OpenBLAS is left as it is.
 *
 * The switch happens once, during cten's init, before cten runs any BLAS
 * call; OpenBLAS's worker threads are idle then and keep working (they read
 * the kernel table at each call). One more reader must be kept out: each
 * worker, when it first runs, initializes OpenBLAS's buffer pool, and the
 * first to do so calls gotoblas_dynamic_init() itself. A worker started at
 * load but scheduled late would run that between our quit and init, reading
 * the environment while we set it, and crash or undo the switch. So the pool
 * is initialized first, from this thread, under OpenBLAS's own lock
 * (blas_memory_alloc/free); after that no worker calls the selection again.
 * A program that calls BLAS from another thread while cten initializes may
 * still race with the switch, as it would with any change of the
 * environment. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>

#include "cpu_impl.h"

/* Linked directly: present in every OpenBLAS build (declared here because a
 * netlib cblas.h lacks it). */
void openblas_set_num_threads(int num_threads);

/* Kernel families in increasing capability; the OpenBLAS core names map to
 * them. A name missing from the table (a newer OpenBLAS's new core) ranks as
 * unknown, and an unknown choice is never overridden. */
enum { RANK_UNKNOWN = -1, RANK_LEGACY = 0, RANK_AVX2 = 1, RANK_AVX512 = 2, RANK_AVX512_BF16 = 3,
       RANK_NEWER = 4 };

static const struct {
    const char *name;
    int rank;
} core_ranks[] = {
    {"Katmai", RANK_LEGACY},       {"Coppermine", RANK_LEGACY},  {"Northwood", RANK_LEGACY},
    {"Prescott", RANK_LEGACY},     {"Banias", RANK_LEGACY},      {"Atom", RANK_LEGACY},
    {"Core2", RANK_LEGACY},        {"Penryn", RANK_LEGACY},      {"Dunnington", RANK_LEGACY},
    {"Nehalem", RANK_LEGACY},      {"Athlon", RANK_LEGACY},      {"Opteron", RANK_LEGACY},
    {"Opteron_SSE3", RANK_LEGACY}, {"Barcelona", RANK_LEGACY},   {"Nano", RANK_LEGACY},
    {"Sandybridge", RANK_LEGACY},  {"Bobcat", RANK_LEGACY},
    /* AMD's AVX families and Haswell are tuned choices: only AVX-512 beats them. */
    {"Bulldozer", RANK_AVX2},      {"Piledriver", RANK_AVX2},    {"Steamroller", RANK_AVX2},
    {"Excavator", RANK_AVX2},      {"Zen", RANK_AVX2},           {"Haswell", RANK_AVX2},
    {"SkylakeX", RANK_AVX512},     {"Cooperlake", RANK_AVX512_BF16},
    {"SapphireRapids", RANK_NEWER},
};

/* The OpenBLAS core name this library asks for at each rank. */
static const char *rank_core[] = {NULL, "Haswell", "SkylakeX", "Cooperlake"};
static const char *rank_why[] = {NULL, "CPU has AVX2+FMA", "CPU has AVX512F/BW/VL/DQ",
                                 "CPU has AVX512F/BW/VL/DQ + AVX512_BF16"};

static int core_rank(const char *name) {
    if (!name) return RANK_UNKNOWN;
    for (size_t i = 0; i < sizeof core_ranks / sizeof core_ranks[0]; i++)
        if (strcasecmp(name, core_ranks[i].name) == 0) return core_ranks[i].rank;
    return RANK_UNKNOWN;
}

/* The best rank this CPU and OS run, as the kernel level was chosen
 * (isa.c: the instructions present and their register state saved by the
 * OS, as OpenBLAS itself checks), and never above that level, so that
 * CT_CPU_ISA keeps cten from switching OpenBLAS to wider kernels. */
static int cpu_rank(void) {
    switch (cti_cpu_isa()) {
    case CTI_ISA_AVX512: return cti_cpu_has_avx512_bf16() ? RANK_AVX512_BF16 : RANK_AVX512;
    case CTI_ISA_AVX2: return RANK_AVX2;
    default: return RANK_LEGACY;
    }
}

typedef char *(*str_fn)(void);
typedef void (*void_fn)(void);
typedef int (*int_fn)(void);
typedef void *(*balloc_fn)(int);
typedef void (*bfree_fn)(void *);

typedef struct {
    void *handle; /* the OpenBLAS that cblas_sgemm resolves to, or RTLD_DEFAULT */
    bool own_handle;
} blas_lib;

/* Looks symbols up in the very library this one calls cblas_sgemm in (also
 * when cten itself was loaded with RTLD_LOCAL), else in the global scope. */
static blas_lib blas_open(void) {
    blas_lib lib = {RTLD_DEFAULT, false};
    Dl_info info;
    if (dladdr((void *)cblas_sgemm, &info) && info.dli_fname) {
        void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            lib.handle = h;
            lib.own_handle = true;
        }
    }
    return lib;
}

static void *blas_sym(blas_lib *lib, const char *name) {
    void *p = dlsym(lib->handle, name);
    if (!p && lib->handle != RTLD_DEFAULT) p = dlsym(RTLD_DEFAULT, name);
    return p;
}

static char blas_info[256] = "OpenBLAS";

/* "OpenBLAS 0.3.21" from openblas_get_config()'s "OpenBLAS 0.3.21 DYNAMIC_ARCH ...". */
static void version_of(const char *config, char *out, size_t n) {
    snprintf(out, n, "OpenBLAS");
    if (!config) return;
    const char *sp = strchr(config, ' ');
    if (!sp) return;
    size_t len = strcspn(sp + 1, " ");
    snprintf(out, n, "%.*s", (int)(sp + 1 - config + len), config);
}

/* Re-runs OpenBLAS's kernel selection forced to core. The previous table is
 * put back if the new selection leaves none. Returns the core name in use. */
static const char *switch_core(blas_lib *lib, str_fn corename, const char *core) {
    void_fn quit = (void_fn)blas_sym(lib, "gotoblas_dynamic_quit");
    void_fn init = (void_fn)blas_sym(lib, "gotoblas_dynamic_init");
    void **table = (void **)blas_sym(lib, "gotoblas");
    balloc_fn pool_alloc = (balloc_fn)blas_sym(lib, "blas_memory_alloc");
    bfree_fn pool_free = (bfree_fn)blas_sym(lib, "blas_memory_free");
    if (!quit || !init || !table || !*table || !pool_alloc || !pool_free) return NULL;
    void *buffer = pool_alloc(0); /* settles the pool's one-time init now */
    if (!buffer) return NULL;
    pool_free(buffer);
    void *previous = *table;
    quit();
    if (setenv("OPENBLAS_CORETYPE", core, 1) == 0) {
        init();
        unsetenv("OPENBLAS_CORETYPE");
    }
    if (!*table) {
        *table = previous; /* already initialized by OpenBLAS at load */
        return NULL;
    }
    return corename();
}

/* OpenBLAS's thread server: after each threaded call its workers spin (with
 * sched_yield) for 2^OPENBLAS_THREAD_TIMEOUT cycles before they sleep, 2^28
 * by default, about a tenth of a second. cten's pool runs the ops between
 * the GEMMs on the same cores, and a training step calls a GEMM every few
 * milliseconds, so the workers were always spinning while the pool worked:
 * on 2 cores the language model's CPU step ran 1.25x faster with the spin
 * cut. The server reads the setting when it starts its workers, so it is
 * restarted with 2^16 cycles (about as long as the pool's own spin, so back
 * to back GEMMs still find them awake): OPENBLAS_THREAD_TIMEOUT set for the
 * call, OpenBLAS's cached environment read again (openblas_read_env),
 * blas_thread_shutdown_ and blas_thread_init, then the variable removed and
 * the environment read again, as it was. A user's OPENBLAS_THREAD_TIMEOUT
 * (or GOTO_THREAD_TIMEOUT) is left as it is; without these entry points
 * (another BLAS, a build without the thread server) nothing changes. Runs
 * during init, before cten's first BLAS call, as the kernel switch does. */
#define WORKER_SPIN_LOG2 16

static bool shorten_worker_spin(blas_lib *lib) {
    if (getenv("OPENBLAS_THREAD_TIMEOUT") || getenv("GOTO_THREAD_TIMEOUT")) return false;
    void_fn read_env = (void_fn)blas_sym(lib, "openblas_read_env");
    int_fn timeout = (int_fn)blas_sym(lib, "openblas_thread_timeout");
    int_fn shutdown = (int_fn)blas_sym(lib, "blas_thread_shutdown_");
    int_fn start = (int_fn)blas_sym(lib, "blas_thread_init");
    int *running = (int *)blas_sym(lib, "blas_server_avail");
    if (!read_env || !timeout || !shutdown || !start || !running || !*running) return false;
    char v[8];
    snprintf(v, sizeof v, "%d", WORKER_SPIN_LOG2);
    if (setenv("OPENBLAS_THREAD_TIMEOUT", v, 1) != 0) return false;
    read_env();
    bool ok = timeout() == WORKER_SPIN_LOG2;
    if (ok) {
        shutdown();
        start();
        ok = *running != 0;
    }
    unsetenv("OPENBLAS_THREAD_TIMEOUT");
    read_env();
    return ok;
}

static void choose_kernels(void) {
    blas_lib lib = blas_open();
    str_fn corename = (str_fn)blas_sym(&lib, "openblas_get_corename");
    str_fn config = (str_fn)blas_sym(&lib, "openblas_get_config");
    char version[64];
    version_of(config ? config() : NULL, version, sizeof version);
    const char *detected = corename ? corename() : NULL;

    if (!detected) {
        snprintf(blas_info, sizeof blas_info, "%s", version);
    } else if (getenv("OPENBLAS_CORETYPE")) {
        snprintf(blas_info, sizeof blas_info, "%s (%s kernels, OPENBLAS_CORETYPE set by the user)",
                 version, detected);
    } else {
        int have = core_rank(detected), want = cpu_rank();
        if (have == RANK_UNKNOWN || have >= want) {
            snprintf(blas_info, sizeof blas_info, "%s (%s kernels, as detected by OpenBLAS)",
                     version, detected);
        } else {
            char before[32];
            snprintf(before, sizeof before, "%s", detected);
            const char *now = switch_core(&lib, corename, rank_core[want]);
            if (now && strcasecmp(now, rank_core[want]) == 0)
                snprintf(blas_info, sizeof blas_info,
                         "%s (%s kernels; detected %s, switched by cten: %s)", version, now,
                         before, rank_why[want]);
            else
                snprintf(blas_info, sizeof blas_info,
                         "%s (%s kernels; %s would suit this CPU but this OpenBLAS could not "
                         "be switched)",
                         version, now ? now : before, rank_core[want]);
        }
    }
    if (shorten_worker_spin(&lib)) {
        size_t len = strlen(blas_info);
        snprintf(blas_info + len, sizeof blas_info - len,
                 "; idle workers sleep after 2^%d cycles (set by cten)", WORKER_SPIN_LOG2);
    }
    if (lib.own_handle) dlclose(lib.handle);
}

void cti_blas_init(void) {
    choose_kernels();
    cti_blas_set_threads(cti_cpu_threads());
    /* The trace starts with the BLAS choice: it decides every GEMM's speed. */
    const char *trace = getenv("CT_TRACE");
    if (trace && *trace && strcmp(trace, "0") != 0)
        fprintf(stderr, "[cten] blas %s\n", blas_info);
}

void cti_blas_set_threads(int n) {
    if (n >= 1) openblas_set_num_threads(n);
}

const char *cti_cpu_blas_info(void) { return blas_info; }
