/* The CPU thread pool: persistent workers that split index ranges with the
 * caller's thread.
 *
 * One job runs at a time. A job is published by bumping a generation counter;
 * every worker takes part in every job (it grabs chunks from a shared counter
 * until none are left) and then reports done, so the caller knows no worker
 * still touches the job when it returns. Workers spin briefly after a job (ops
 * often come back to back) and then sleep on a condition variable, so they use
 * no CPU while OpenBLAS runs its own threads. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "cpu_impl.h"

#define POOL_MAX_THREADS 512
/* How long an idle worker (or a waiting caller) spins before it sleeps. */
#define SPIN_NS 20000

typedef struct pool {
    pthread_mutex_t lock; /* guards the sleeping side: gen, stop, done_cv */
    pthread_cond_t wake_cv;
    pthread_cond_t done_cv;
    atomic_uint_fast64_t gen; /* job generation; workers wait for a change */
    atomic_bool stop;
    atomic_int nthreads; /* the setting, caller included */
    int nworkers;  /* threads started (nthreads - 1 once started) */
    pthread_t *workers;
    /* The generation when the workers started: a job published before a new
     * worker first runs must still count as new to it. */
    uint_fast64_t start_gen;
    /* The current job. */
    cti_range_fn fn;
    void *ctx;
    int64_t n;
    int64_t nchunks;
    atomic_int_fast64_t next_chunk;
    atomic_int pending; /* workers that have not finished the job */
} pool;

static pool g_pool = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake_cv = PTHREAD_COND_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
};
/* Held by the thread that owns the pool for a job or a resize; a second user
 * thread finding it taken runs its work inline instead of waiting. */
static pthread_mutex_t g_owner = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_atexit_registered;
/* Set on worker threads and on a caller while it runs a job, so nested
 * parallel_for calls run inline. */
static _Thread_local bool tl_in_pool;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int env_threads(const char *name) {
    const char *e = getenv(name);
    if (!e || !*e) return 0;
    char *end;
    long v = strtol(e, &end, 10);
    if (*end != '\0' || v < 1) return 0;
    return v > POOL_MAX_THREADS ? POOL_MAX_THREADS : (int)v;
}

/* CT_NUM_THREADS decides; without it a count the user gave OpenBLAS or
 * OpenMP is kept for both, since cten applies its count to OpenBLAS too. */
static int default_threads(void) {
    static const char *vars[] = {"CT_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        int v = env_threads(vars[i]);
        if (v) return v;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c >= 1) return c > POOL_MAX_THREADS ? POOL_MAX_THREADS : c;
    }
    return 1;
}

/* After fork() the child has only the forking thread: the workers are gone,
 * and a lock another thread held stays held. The child forgets both, so
 * its next parallel job starts workers of its own instead of waiting
 * forever for ones that do not exist (as OpenBLAS and PyTorch do). */
static void after_fork_child(void) {
    pool *p = &g_pool;
    free(p->workers);
    p->workers = NULL;
    p->nworkers = 0;
    atomic_store_explicit(&p->stop, false, memory_order_relaxed);
    atomic_store_explicit(&p->pending, 0, memory_order_relaxed);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    pthread_mutex_init(&g_owner, NULL);
}

static void init_once(void) {
    g_pool.nthreads = default_threads();
    /* Registration fails only for lack of memory; a forked child could then
     * hang as before, which is accepted rather than failing init. */
    (void)pthread_atfork(NULL, NULL, after_fork_child);
}

/* Takes chunks of the current job until none are left. */
static void run_chunks(pool *p) {
    for (;;) {
        int64_t k = atomic_fetch_add_explicit(&p->next_chunk, 1, memory_order_relaxed);
        if (k >= p->nchunks) return;
        int64_t begin = p->n * k / p->nchunks;
        int64_t end = p->n * (k + 1) / p->nchunks;
        p->fn(begin, end, p->ctx);
    }
}

static void *worker_main(void *arg) {
    pool *p = arg;
    tl_in_pool = true;
    uint_fast64_t seen = p->start_gen;
    for (;;) {
        int64_t t0 = now_ns();
        int spins = 0;
        while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_acquire)) {
            cpu_relax();
            if ((++spins & 63) == 0 && now_ns() - t0 > SPIN_NS) {
                pthread_mutex_lock(&p->lock);
                while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
                       !atomic_load_explicit(&p->stop, memory_order_acquire))
                    pthread_cond_wait(&p->wake_cv, &p->lock);
                pthread_mutex_unlock(&p->lock);
                break;
            }
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        run_chunks(p);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

/* Stops and joins the workers. Caller holds g_owner. */
static void stop_workers(pool *p) {
    if (p->nworkers == 0) return;
    pthread_mutex_lock(&p->lock);
    atomic_store_explicit(&p->stop, true, memory_order_release);
    pthread_cond_broadcast(&p->wake_cv);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nworkers; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    p->workers = NULL;
    p->nworkers = 0;
    atomic_store_explicit(&p->stop, false, memory_order_release);
}

static void shutdown_pool(void) {
    pthread_mutex_lock(&g_owner);
    stop_workers(&g_pool);
    pthread_mutex_unlock(&g_owner);
}

/* Starts nthreads - 1 workers; false when none could be started (the pool
 * then runs work inline). Caller holds g_owner. */
static bool start_workers(pool *p) {
    int want = p->nthreads - 1;
    if (want <= 0) return false;
    p->workers = malloc(sizeof(pthread_t) * (size_t)want);
    if (!p->workers) return false;
    if (!g_atexit_registered) {
        if (atexit(shutdown_pool) != 0) {
            free(p->workers);
            p->workers = NULL;
            return false;
        }
        g_atexit_registered = true;
    }
    p->start_gen = atomic_load_explicit(&p->gen, memory_order_relaxed);
    int started = 0;
    for (; started < want; started++)
        if (pthread_create(&p->workers[started], NULL, worker_main, p) != 0) break;
    p->nworkers = started;
    if (started == 0) {
        free(p->workers);
        p->workers = NULL;
        return false;
    }
    return true;
}

void cti_parallel_for(int64_t n, int64_t grain, cti_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (n <= grain || tl_in_pool) {
        fn(0, n, ctx);
        return;
    }
    pthread_once(&g_once, init_once);
    pool *p = &g_pool;
    if (p->nthreads <= 1 || pthread_mutex_trylock(&g_owner) != 0) {
        fn(0, n, ctx);
        return;
    }
    if (p->nworkers == 0 && !start_workers(p)) {
        pthread_mutex_unlock(&g_owner);
        fn(0, n, ctx);
        return;
    }
    int64_t nchunks = n / grain;
    int64_t maxchunks = p->nworkers + 1;
    if (nchunks > maxchunks) nchunks = maxchunks;
    if (nchunks < 2) {
        pthread_mutex_unlock(&g_owner);
        fn(0, n, ctx);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->nchunks = nchunks;
    atomic_store_explicit(&p->next_chunk, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->nworkers, memory_order_relaxed);
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake_cv);
    pthread_mutex_unlock(&p->lock);

    tl_in_pool = true;
    run_chunks(p);
    tl_in_pool = false;

    int64_t t0 = now_ns();
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) {
        cpu_relax();
        if ((++spins & 63) == 0 && now_ns() - t0 > SPIN_NS) {
            pthread_mutex_lock(&p->lock);
            while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
                pthread_cond_wait(&p->done_cv, &p->lock);
            pthread_mutex_unlock(&p->lock);
            break;
        }
    }
    pthread_mutex_unlock(&g_owner);
}

int cti_cpu_threads(void) {
    pthread_once(&g_once, init_once);
    return atomic_load_explicit(&g_pool.nthreads, memory_order_relaxed);
}

ct_status cti_cpu_set_threads(int n) {
    if (n < 1)
        return cti_error(CT_ERR_INVALID_ARG, "ct_set_num_threads: expected n >= 1, got %d", n);
    if (n > POOL_MAX_THREADS)
        return cti_error(CT_ERR_INVALID_ARG, "ct_set_num_threads: expected n <= %d, got %d",
                         POOL_MAX_THREADS, n);
    if (tl_in_pool)
        return cti_error(CT_ERR_INVALID_ARG,
                         "ct_set_num_threads: cannot be called from inside a parallel task");
    pthread_once(&g_once, init_once);
    pthread_mutex_lock(&g_owner);
    if (n != g_pool.nthreads) {
        stop_workers(&g_pool);
        g_pool.nthreads = n; /* workers start lazily with the next parallel job */
    }
    pthread_mutex_unlock(&g_owner);
    cti_blas_set_threads(n);
    return CT_OK;
}

ct_status ct_set_num_threads(int n) { return cti_cpu_set_threads(n); }

int ct_get_num_threads(void) { return cti_cpu_threads(); }
