/* The process group and the collectives' front end (tensor/dist.h): how the
 * process was launched, the checks every collective shares, contiguous
 * staging of other layouts, and the route to the transport: MPI for CPU
 * tensors (mpi.c), NCCL inside the CUDA module for CUDA tensors
 * (backends/cuda/nccl.c through cuda_api.h). A group of one process with no
 * MPI does CPU collectives itself (they are copies). */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "autograd/autograd_impl.h"
#include "dist_impl.h"

#define DEFAULT_TIMEOUT_S 300.0

typedef enum launch { LAUNCH_NONE, LAUNCH_MPI, LAUNCH_ENV, LAUNCH_SINGLE } launch;

/* Abandoned tensors: buffers of collectives that timed out, which MPI may
 * still write; released after MPI is finalized. */
typedef struct held {
    ct_tensor *t;
    struct held *next;
} held;

static struct group {
    launch how;
    int rank, world, local_rank;
    double timeout_s;
    /* NCCL: the id every rank builds its communicator from (env launches:
     * from the rendezvous; nccl_why says why there is none), and the
     * communicator, made by the first CUDA collective on its device. */
    bool have_id;
    unsigned char id[CTI_NCCL_ID_BYTES];
    char nccl_why[1024];
    void *nccl;
    int nccl_device;
    /* The first failure that broke the group (a timeout), else CT_OK. */
    ct_status broken;
    char broken_msg[1024];
    held *held;
} g;

/* Broadcast buffer of NCCL's id under MPI: a flag byte and the id. Static:
 * MPI owns it until finalize if the broadcast times out. */
static unsigned char id_msg[1 + CTI_NCCL_ID_BYTES];

double cti_dist_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void cti_dist_backoff(int *spins) {
    int s = (*spins)++;
    if (s < 2000) return;
    if (s < CTI_DIST_SLEEP_SPINS) {
        sched_yield();
        return;
    }
    /* 20 us doubling to 2 ms. */
    s -= CTI_DIST_SLEEP_SPINS;
    long ns = 20000L << (s < 7 ? s : 7);
    struct timespec t = {0, ns};
    nanosleep(&t, NULL);
}

/* ---- the group ----------------------------------------------------------------------------- */
static const char *launch_name(launch l) {
    switch (l) {
    case LAUNCH_MPI: return "mpi";
    case LAUNCH_ENV: return "env";
    case LAUNCH_SINGLE: return "single";
    default: return "none";
    }
}

bool ct_dist_is_initialized(void) { return g.how != LAUNCH_NONE; }
int ct_dist_rank(void) { return g.how ? g.rank : 0; }
int ct_dist_world_size(void) { return g.how ? g.world : 1; }
int ct_dist_local_rank(void) { return g.how ? g.local_rank : 0; }
const char *ct_dist_launch(void) { return launch_name(g.how); }

ct_status ct_dist_set_timeout(double seconds) {
    if (!(seconds > 0) || !isfinite(seconds))
        return cti_error(CT_ERR_INVALID_ARG, "ct_dist_set_timeout: seconds must be > 0, got %g",
                         seconds);
    g.timeout_s = seconds;
    return CT_OK;
}

ct_status cti_dist_ready(const char *op) {
    if (!g.how)
        return cti_error(CT_ERR_INVALID_ARG, "%s: no process group (call ct_dist_init first)", op);
    if (g.broken)
        return cti_error(g.broken, "%s: the process group failed earlier: %s", op, g.broken_msg);
    return CT_OK;
}

/* Keeps the message of the error just set as the group's failure. */
static ct_status break_group(ct_status st) {
    if (!g.broken) {
        g.broken = st;
        snprintf(g.broken_msg, sizeof g.broken_msg, "%s", ct_last_error());
    }
    return st;
}

/* An MPI launcher's environment: Open MPI's mpirun, MPICH/Hydra and Intel
 * MPI (PMI), Slurm's srun with PMIx. */
static bool mpi_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* An integer environment variable in [lo, hi]; false with an error naming
 * it when it is malformed. *out keeps its value when the variable is unset. */
static bool env_int(const char *op, const char *name, long lo, long hi, int *out) {
    const char *s = getenv(name);
    if (!s) return true;
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        cti_error(CT_ERR_INVALID_ARG, "%s: %s=\"%s\" is not an integer in [%ld, %ld]", op, name, s,
                  lo, hi);
        return false;
    }
    *out = (int)v;
    return true;
}

/* What rank 0 of an environment launch publishes: NCCL's id in hex, or
 * "nccl none <why>" where it cannot make one (no CUDA module, no device, no
 * NCCL: a CPU-only job, whose CUDA collectives then fail saying why). */
static void nccl_blob(const char *op, char *out, size_t n) {
    const cti_nccl_api *api = NULL;
    const char *why = NULL;
    if (ct_device_count(CT_DEVICE_CUDA) <= 0) why = "no usable CUDA device on rank 0";
    else if (!(api = cti_cuda_nccl_api(op))) why = ct_last_error();
    unsigned char id[CTI_NCCL_ID_BYTES];
    if (api && api->unique_id(op, id) != CT_OK) why = ct_last_error();
    if (why) {
        snprintf(out, n, "nccl none %s", why);
        return;
    }
    size_t at = (size_t)snprintf(out, n, "nccl ");
    for (int k = 0; k < CTI_NCCL_ID_BYTES && at + 2 < n; k++)
        at += (size_t)snprintf(out + at, n - at, "%02x", id[k]);
}

static void take_blob(const char *blob) {
    g.have_id = false;
    if (!strncmp(blob, "nccl none ", 10)) {
        snprintf(g.nccl_why, sizeof g.nccl_why, "rank 0 could not make NCCL's id: %s", blob + 10);
        return;
    }
    const char *h = blob + 5;
    if (strncmp(blob, "nccl ", 5) || strlen(h) != 2 * CTI_NCCL_ID_BYTES) {
        snprintf(g.nccl_why, sizeof g.nccl_why, "the rendezvous file held no NCCL id");
        return;
    }
    for (int k = 0; k < CTI_NCCL_ID_BYTES; k++) {
        unsigned v;
        if (sscanf(h + 2 * k, "%2x", &v) != 1) {
            snprintf(g.nccl_why, sizeof g.nccl_why, "the rendezvous file's NCCL id is malformed");
            return;
        }
        g.id[k] = (unsigned char)v;
    }
    g.have_id = true;
}

static ct_status init_env(const char *op, const ct_dist_options *opts) {
    int rank = -1, world = -1;
    if (!env_int(op, "WORLD_SIZE", 1, 1 << 24, &world)) return ct_last_status();
    if (!env_int(op, "RANK", 0, (world > 0 ? world : 1 << 24) - 1, &rank)) return ct_last_status();
    if (rank < 0 || world < 0)
        return cti_error(CT_ERR_INVALID_ARG, "%s: %s is set but %s is not (both or neither)", op,
                         rank < 0 ? "WORLD_SIZE" : "RANK", rank < 0 ? "RANK" : "WORLD_SIZE");
    int local = rank;
    if (!env_int(op, "LOCAL_RANK", 0, 1 << 24, &local)) return ct_last_status();
    const char *path = opts && opts->rendezvous ? opts->rendezvous : getenv("CT_DIST_RENDEZVOUS");
    if (path && !*path) path = NULL;
    if (world > 1 && !path)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: WORLD_SIZE=%d without MPI needs a rendezvous file on a path all "
                         "ranks share (CT_DIST_RENDEZVOUS or ct_dist_options.rendezvous)",
                         op, world);
    char blob[2 * CTI_NCCL_ID_BYTES + 600] = "";
    if (rank == 0) nccl_blob(op, blob, sizeof blob);
    if (world > 1) {
        ct_status st = cti_rendezvous(op, path, rank, world, g.timeout_s, blob, sizeof blob);
        if (st != CT_OK) return st;
    }
    take_blob(blob);
    g.rank = rank;
    g.world = world;
    g.local_rank = local;
    g.how = LAUNCH_ENV;
    return CT_OK;
}

ct_status ct_dist_init(const ct_dist_options *opts) {
    static const char op[] = "ct_dist_init";
    if (g.how)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: a process group exists (rank %d of %d); ct_dist_finalize it first",
                         op, g.rank, g.world);
    cti_init();
    double timeout = opts && opts->timeout_s != 0 ? opts->timeout_s : 0;
    if (timeout == 0 && getenv("CT_DIST_TIMEOUT")) {
        char *end;
        const char *s = getenv("CT_DIST_TIMEOUT");
        timeout = strtod(s, &end);
        if (!*s || *end || !(timeout > 0))
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: CT_DIST_TIMEOUT=\"%s\" is not a number of seconds > 0", op, s);
    }
    if (timeout == 0) timeout = DEFAULT_TIMEOUT_S;
    if (!(timeout > 0) || !isfinite(timeout))
        return cti_error(CT_ERR_INVALID_ARG, "%s: timeout_s must be > 0, got %g", op, timeout);
    memset(&g, 0, sizeof g);
    g.timeout_s = timeout;
    g.nccl_device = -1;
    ct_status st;
    if (mpi_launched()) {
        if (!cti_mpi_built())
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: launched by an MPI launcher, but cten was built without MPI "
                             "(install libopenmpi-dev and configure with -Ddist=enabled), or "
                             "launch with RANK/WORLD_SIZE and a rendezvous file",
                             op);
        st = cti_mpi_open(op, &g.rank, &g.world, &g.local_rank);
        if (st != CT_OK) {
            cti_mpi_close(op);
            return st;
        }
        g.how = LAUNCH_MPI;
        return CT_OK;
    }
    if (getenv("RANK") || getenv("WORLD_SIZE")) {
        st = init_env(op, opts);
        if (st != CT_OK) memset(&g, 0, sizeof g);
        return st;
    }
    g.rank = 0;
    g.world = 1;
    g.local_rank = 0;
    g.how = LAUNCH_SINGLE;
    return CT_OK;
}

ct_status ct_dist_finalize(void) {
    static const char op[] = "ct_dist_finalize";
    if (!g.how) return CT_OK;
    ct_status st = CT_OK;
    if (g.nccl) {
        const cti_nccl_api *api = cti_cuda_nccl_api(op);
        if (api) api->comm_free(g.nccl);
    }
    if (g.how == LAUNCH_MPI) st = cti_mpi_close(op);
    while (g.held) {
        held *h = g.held;
        g.held = h->next;
        cti_unref(h->t);
        free(h);
    }
    memset(&g, 0, sizeof g);
    return st;
}

/* ---- NCCL ------------------------------------------------------------------------------------ */
/* NCCL's id for the group: made here (one process), broadcast through MPI
 * (rank 0 sends a flag byte first, so the others learn that it failed), or
 * taken from the rendezvous. */
static ct_status nccl_id(const char *op, const cti_nccl_api *api) {
    if (g.have_id) return CT_OK;
    if (g.how == LAUNCH_ENV && g.world > 1)
        return cti_error(CT_ERR_UNSUPPORTED, "%s: no NCCL communicator: %s", op, g.nccl_why);
    ct_status st = CT_OK;
    if (g.rank == 0) {
        st = api->unique_id(op, id_msg + 1);
        id_msg[0] = st == CT_OK;
        if (st != CT_OK) snprintf(g.nccl_why, sizeof g.nccl_why, "%s", ct_last_error());
    }
    if (g.how == LAUNCH_MPI) {
        ct_status bst = cti_mpi_bcast_bytes(op, id_msg, sizeof id_msg, 0,
                                            cti_dist_now() + g.timeout_s);
        if (bst != CT_OK) return break_group(bst);
        if (!id_msg[0])
            return st != CT_OK ? st
                               : cti_error(CT_ERR_RUNTIME,
                                           "%s: rank 0 could not make NCCL's id (its message "
                                           "says why)",
                                           op);
    }
    if (st != CT_OK) return st;
    memcpy(g.id, id_msg + 1, CTI_NCCL_ID_BYTES);
    g.have_id = true;
    return CT_OK;
}

/* The group's communicator on device, made on first use. */
static ct_status nccl_comm(const char *op, int device, const cti_nccl_api **api) {
    if (!(*api = cti_cuda_nccl_api(op))) return ct_last_status();
    if (g.nccl) {
        if (device != g.nccl_device)
            return cti_error(CT_ERR_DEVICE,
                             "%s: this process group's NCCL communicator is on cuda:%d, the "
                             "tensor on cuda:%d (one device per process)",
                             op, g.nccl_device, device);
        return CT_OK;
    }
    ct_status st = nccl_id(op, *api);
    if (st != CT_OK) return st;
    st = (*api)->comm_new(op, g.id, g.world, g.rank, device, g.timeout_s, &g.nccl);
    if (st != CT_OK) return break_group(st);
    g.nccl_device = device;
    return CT_OK;
}

/* ---- started collectives --------------------------------------------------------------------- */
struct cti_dist_work {
    const char *op;
    cti_coll c;
    ct_tensor *out, *in;
    cti_mpi_work *mpi; /* CPU under MPI */
    ct_status failed;  /* an error progress met, with its message */
    char *failed_msg;
    bool cuda;
    double deadline;
};

static size_t numel_of(const ct_tensor *t) { return (size_t)cti_numel(t->ndim, t->shape); }

/* A group of one with no MPI: the collectives are copies. */
static void run_local(const cti_coll *c) {
    size_t bytes = c->count * ct_dtype_size(c->dtype);
    if (c->send != c->recv && bytes) memcpy(c->recv, c->send, bytes);
}

ct_status cti_dist_start(const char *op, cti_coll_kind kind, ct_tensor *out, ct_tensor *in,
                         ct_dist_op rop, int root, cti_dist_work **work) {
    *work = NULL;
    cti_dist_work *w = calloc(1, sizeof *w);
    if (!w) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    w->op = op;
    w->c = (cti_coll){.kind = kind, .op = (int)rop, .root = root, .send = cti_data(in),
                      .recv = cti_data(out), .dtype = out->dtype, .name = op};
    w->c.count = kind == CTI_COLL_ALL_GATHER ? numel_of(in) : numel_of(out);
    w->deadline = cti_dist_now() + g.timeout_s;
    ct_device dev = out->storage->device;
    ct_status st = CT_OK;
    /* Every rank has the same shapes, so all skip an empty collective. */
    if (dev.type == CT_DEVICE_CUDA) {
        const cti_nccl_api *api;
        st = nccl_comm(op, dev.index, &api);
        if (st == CT_OK && w->c.count) st = api->run(g.nccl, &w->c, g.timeout_s);
        w->cuda = true;
    } else if (g.how == LAUNCH_MPI) {
        if (w->c.count) st = cti_mpi_start(op, &w->c, &w->mpi);
    } else if (g.world == 1) {
        run_local(&w->c);
    } else {
        st = cti_error(CT_ERR_UNSUPPORTED,
                       "%s: CPU tensors travel through MPI, and this process group of %d was "
                       "made from RANK/WORLD_SIZE without it; launch with mpirun (or srun), or "
                       "move the tensor to CUDA",
                       op, g.world);
    }
    if (st != CT_OK) {
        free(w);
        return st;
    }
    w->out = cti_ref(out);
    w->in = cti_ref(in);
    *work = w;
    return CT_OK;
}

void cti_dist_progress(cti_dist_work *w) {
    if (!w || !w->mpi) return;
    bool done;
    ct_status st = cti_mpi_test(w->op, w->mpi, &done);
    if (done) w->mpi = NULL;
    /* Kept for cti_dist_finish to report. */
    if (st != CT_OK) {
        w->failed = st;
        w->failed_msg = strdup(ct_last_error());
    }
}

static void hold(ct_tensor *t) {
    held *h = malloc(sizeof *h);
    if (!h) return; /* then the buffer is left unreleased, which is safe */
    h->t = t;
    h->next = g.held;
    g.held = h;
}

static void work_free(cti_dist_work *w) {
    cti_unref(w->out);
    cti_unref(w->in);
    free(w->failed_msg);
    free(w);
}

ct_status cti_dist_finish(cti_dist_work *w) {
    ct_status st = CT_OK;
    if (w->failed) {
        st = break_group(cti_error(w->failed, "%s", w->failed_msg ? w->failed_msg : w->op));
    } else if (w->mpi) {
        bool timed_out;
        st = cti_mpi_wait(w->op, w->mpi, w->deadline, &timed_out);
        if (timed_out) {
            st = break_group(cti_error(
                CT_ERR_RUNTIME,
                "%s: rank %d of %d: the collective did not complete within %g s: a peer failed, "
                "exited or did not call it",
                w->op, g.rank, g.world, g.timeout_s));
            hold(w->out);
            hold(w->in);
            free(w->failed_msg);
            free(w);
            return st;
        }
        if (st != CT_OK) break_group(st);
    } else if (w->cuda && g.nccl) {
        const cti_nccl_api *api = cti_cuda_nccl_api(w->op);
        st = api ? api->check(g.nccl, w->op) : ct_last_status();
        if (st != CT_OK) break_group(st);
    }
    /* MPI sums; NCCL averages itself. */
    if (st == CT_OK && w->c.op == CT_DIST_AVG && !w->cuda && g.world > 1 &&
        w->c.kind != CTI_COLL_BROADCAST && w->c.kind != CTI_COLL_ALL_GATHER) {
        bool prev = ct_set_grad_enabled(false);
        st = ct_div_scalar_(w->out, (double)g.world);
        ct_set_grad_enabled(prev);
    }
    cti_bump_version(w->out);
    work_free(w);
    return st;
}

/* ---- the public collectives ----------------------------------------------------------------- */
static ct_status check_tensor(const char *op, const char *what, const ct_tensor *t) {
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "%s: %s is NULL", op, what);
    ct_device_type d = t->storage->device.type;
    if (d != CT_DEVICE_CPU && d != CT_DEVICE_CUDA)
        return cti_error(CT_ERR_DEVICE, "%s: %s %s is on a device the group cannot reach", op,
                         what, cti_desc(t));
    return CT_OK;
}

static ct_status check_op(const char *op, const ct_tensor *t, ct_dist_op rop) {
    if (rop != CT_DIST_SUM && rop != CT_DIST_AVG && rop != CT_DIST_MAX)
        return cti_error(CT_ERR_INVALID_ARG, "%s: reduction %d is not a ct_dist_op", op, (int)rop);
    if (rop == CT_DIST_AVG && !ct_dtype_is_floating(t->dtype))
        return cti_error(CT_ERR_DTYPE, "%s: CT_DIST_AVG needs a floating dtype, got %s", op,
                         cti_desc(t));
    return CT_OK;
}

static ct_status check_pair(const char *op, const ct_tensor *out, const ct_tensor *in) {
    if (out->dtype != in->dtype)
        return cti_error(CT_ERR_DTYPE, "%s: out %s and in %s must have one dtype", op,
                         cti_desc(out), cti_desc(in));
    if (!ct_device_eq(out->storage->device, in->storage->device))
        return cti_error(CT_ERR_DEVICE, "%s: out %s and in %s must be on one device", op,
                         cti_desc(out), cti_desc(in));
    return CT_OK;
}

/* A reference of this layer's own to a contiguous tensor holding t's values:
 * t itself when contiguous, else a copy (outside any scope); NULL on error. */
static ct_tensor *staged(ct_tensor *t) {
    if (cti_is_contiguous(t)) return cti_ref(t);
    ct_tensor *c = ct_contiguous(t);
    if (c) cti_scope_forget(c);
    return c;
}

/* Runs one collective to completion: out is written (through a contiguous
 * copy when it is not contiguous), in read. */
static ct_status run(const char *op, cti_coll_kind kind, ct_tensor *out, ct_tensor *in,
                     ct_dist_op rop, int root) {
    ct_status st = cti_ag_check_inplace(op, out);
    if (st != CT_OK) return st;
    bool prev = ct_set_grad_enabled(false);
    ct_tensor *sout = staged(out);
    ct_tensor *sin = !sout ? NULL : in == out ? cti_ref(sout) : staged(in);
    cti_dist_work *w = NULL;
    if (!sout || !sin) st = ct_last_status();
    else st = cti_dist_start(op, kind, sout, sin, rop, root, &w);
    if (st == CT_OK) st = cti_dist_finish(w);
    if (st == CT_OK && sout != out) st = ct_copy_(out, sout);
    cti_unref(sout);
    cti_unref(sin);
    ct_set_grad_enabled(prev);
    return st;
}

ct_status ct_dist_all_reduce(ct_tensor *t, ct_dist_op op) {
    static const char name[] = "ct_dist_all_reduce";
    ct_status st = cti_dist_ready(name);
    if (st == CT_OK) st = check_tensor(name, "tensor", t);
    if (st == CT_OK) st = check_op(name, t, op);
    return st != CT_OK ? st : run(name, CTI_COLL_ALL_REDUCE, t, t, op, 0);
}

ct_status ct_dist_broadcast(ct_tensor *t, int root) {
    static const char name[] = "ct_dist_broadcast";
    ct_status st = cti_dist_ready(name);
    if (st == CT_OK) st = check_tensor(name, "tensor", t);
    if (st == CT_OK && (root < 0 || root >= g.world))
        st = cti_error(CT_ERR_INVALID_ARG, "%s: root %d is not a rank of a group of %d", name,
                       root, g.world);
    return st != CT_OK ? st : run(name, CTI_COLL_BROADCAST, t, t, CT_DIST_SUM, root);
}

/* out's shape must be in's with dim 0 scaled by the world size ([world] for
 * a 0-d in); big is the tensor with the scaled dim. */
static ct_status check_scaled(const char *op, const ct_tensor *big, const ct_tensor *small,
                              const char *big_name, const char *small_name) {
    int64_t want[CT_MAX_DIMS];
    int nd = small->ndim ? small->ndim : 1;
    if (small->ndim) memcpy(want, small->shape, sizeof want);
    else want[0] = 1;
    want[0] *= g.world;
    if (big->ndim != nd || memcmp(big->shape, want, (size_t)nd * sizeof *want) != 0)
        return cti_error(CT_ERR_SHAPE,
                         "%s: %s %s must be %s %s with dim 0 times the world size %d, i.e. %s", op,
                         big_name, cti_desc(big), small_name, cti_desc(small), g.world,
                         cti_shape_s(nd, want));
    return CT_OK;
}

ct_status ct_dist_all_gather(ct_tensor *out, ct_tensor *in) {
    static const char name[] = "ct_dist_all_gather";
    ct_status st = cti_dist_ready(name);
    if (st == CT_OK) st = check_tensor(name, "out", out);
    if (st == CT_OK) st = check_tensor(name, "in", in);
    if (st == CT_OK) st = check_pair(name, out, in);
    if (st == CT_OK) st = check_scaled(name, out, in, "out", "in");
    return st != CT_OK ? st : run(name, CTI_COLL_ALL_GATHER, out, in, CT_DIST_SUM, 0);
}

ct_status ct_dist_reduce_scatter(ct_tensor *out, ct_tensor *in, ct_dist_op op) {
    static const char name[] = "ct_dist_reduce_scatter";
    ct_status st = cti_dist_ready(name);
    if (st == CT_OK) st = check_tensor(name, "out", out);
    if (st == CT_OK) st = check_tensor(name, "in", in);
    if (st == CT_OK) st = check_pair(name, out, in);
    if (st == CT_OK) st = check_op(name, in, op);
    if (st == CT_OK) st = check_scaled(name, in, out, "in", "out");
    return st != CT_OK ? st : run(name, CTI_COLL_REDUCE_SCATTER, out, in, op, 0);
}

ct_status ct_dist_barrier(void) {
    static const char name[] = "ct_dist_barrier";
    ct_status st = cti_dist_ready(name);
    if (st != CT_OK || g.world == 1) return st;
    if (g.how == LAUNCH_MPI) {
        cti_mpi_work *w;
        if ((st = cti_mpi_start(name, NULL, &w)) != CT_OK) return break_group(st);
        bool timed_out;
        st = cti_mpi_wait(name, w, cti_dist_now() + g.timeout_s, &timed_out);
        if (timed_out)
            st = cti_error(CT_ERR_RUNTIME,
                           "%s: rank %d of %d: not every rank reached the barrier within %g s",
                           name, g.rank, g.world, g.timeout_s);
        return st != CT_OK ? break_group(st) : CT_OK;
    }
    /* No MPI: a one-element all-reduce through NCCL, waited for. */
    int n = ct_device_count(CT_DEVICE_CUDA);
    if (n <= 0)
        return cti_error(CT_ERR_UNSUPPORTED,
                         "%s: a group made from RANK/WORLD_SIZE without MPI meets through NCCL, "
                         "and this process has no usable CUDA device",
                         name);
    int device = g.nccl ? g.nccl_device : g.local_rank % n;
    ct_tensor *one = ct_tensor_zeros(1, (int64_t[]){1}, CT_F32, CT_CUDA(device));
    if (!one) return ct_last_status();
    st = run(name, CTI_COLL_ALL_REDUCE, one, one, CT_DIST_SUM, 0);
    ct_tensor_release(one);
    if (st != CT_OK) return st;
    const cti_nccl_api *api = cti_cuda_nccl_api(name);
    st = api ? api->wait(g.nccl, name, g.timeout_s) : ct_last_status();
    return st != CT_OK ? break_group(st) : CT_OK;
}
