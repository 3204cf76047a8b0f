/* The MPI transport: collectives on host buffers, as nonblocking MPI calls
 * on a duplicate of MPI_COMM_WORLD. The group polls them against a deadline
 * (group.c), so a peer that never joins costs a timeout, not a hang; MPI's
 * errors return to the caller (MPI_ERRORS_RETURN) and become cten errors
 * with MPI's text. float16 and bfloat16 travel as 16-bit words with
 * reduction functions of their own (MPI has no such types); bool as bytes
 * reduced by logical or. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "dist_impl.h"

static MPI_Comm comm = MPI_COMM_NULL;
static bool started_mpi; /* cti_mpi_open called MPI_Init_thread */
static MPI_Op half_ops[2][2]; /* [f16, bf16][sum, max] */

struct cti_mpi_work {
    MPI_Request req;
    cti_mpi_work *next;
};
/* Calls that timed out: MPI still owns their requests (a collective cannot
 * be cancelled), so their records are freed only after MPI is finalized. */
static cti_mpi_work *abandoned;

bool cti_mpi_built(void) { return true; }

static ct_status mpi_fail(const char *op, const char *call, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        len = snprintf(msg, sizeof msg, "code %d", rc);
    int rank = -1;
    if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &rank);
    return cti_error(CT_ERR_RUNTIME, "%s: %s failed on rank %d: %.*s", op, call, rank, len, msg);
}

/* ---- float16 and bfloat16 reductions, in float32, rounded once per pair ---------------- */
static float half_get(uint16_t h, bool bf) { return bf ? cti_bf16_to_f32(h) : cti_f16_to_f32(h); }
static uint16_t half_put(float f, bool bf) { return bf ? cti_f32_to_bf16(f) : cti_f32_to_f16(f); }

static void half_reduce(const void *in, void *inout, int n, bool bf, bool max) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < n; i++) {
        float x = half_get(a[i], bf), y = half_get(b[i], bf);
        /* NaN wins a max, as torch's maximum. */
        float r = max ? (x != x || x > y ? x : y) : x + y;
        b[i] = half_put(r, bf);
    }
}

static void f16_sum(void *in, void *inout, int *n, MPI_Datatype *t) {
    half_reduce(in, inout, *n, false, false);
}
static void f16_max(void *in, void *inout, int *n, MPI_Datatype *t) {
    half_reduce(in, inout, *n, false, true);
}
static void bf16_sum(void *in, void *inout, int *n, MPI_Datatype *t) {
    half_reduce(in, inout, *n, true, false);
}
static void bf16_max(void *in, void *inout, int *n, MPI_Datatype *t) {
    half_reduce(in, inout, *n, true, true);
}

static MPI_Datatype mpi_type(ct_dtype dt) {
    switch (dt) {
    case CT_BOOL: return MPI_UINT8_T;
    case CT_I32: return MPI_INT32_T;
    case CT_I64: return MPI_INT64_T;
    case CT_F16:
    case CT_BF16: return MPI_UINT16_T;
    case CT_F32: return MPI_FLOAT;
    case CT_F64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}

/* AVG is a SUM here; the group divides afterwards. */
static MPI_Op mpi_op(ct_dtype dt, int op) {
    bool max = op == CT_DIST_MAX;
    if (dt == CT_F16 || dt == CT_BF16) return half_ops[dt == CT_BF16][max];
    if (dt == CT_BOOL) return max ? MPI_MAX : MPI_LOR;
    return max ? MPI_MAX : MPI_SUM;
}

/* ---- the communicator ------------------------------------------------------------------ */
static ct_status make_ops(const char *op) {
    MPI_User_function *fns[2][2] = {{f16_sum, f16_max}, {bf16_sum, bf16_max}};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            int rc = MPI_Op_create(fns[i][j], 1, &half_ops[i][j]);
            if (rc != MPI_SUCCESS) return mpi_fail(op, "MPI_Op_create", rc);
        }
    return CT_OK;
}

ct_status cti_mpi_open(const char *op, int *rank, int *world, int *local_rank) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: MPI was finalized already; it cannot be started again", op);
    if (!inited) {
        /* SERIALIZED: the group is used from one thread at a time, which
         * need not be the one that started it. */
        int provided = 0, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) return mpi_fail(op, "MPI_Init_thread", rc);
        started_mpi = true;
    }
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc != MPI_SUCCESS) return mpi_fail(op, "MPI_Comm_dup", rc);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm node;
    rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) return mpi_fail(op, "MPI_Comm_split_type", rc);
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_free(&node);
    MPI_Comm_rank(comm, rank);
    MPI_Comm_size(comm, world);
    return make_ops(op);
}

ct_status cti_mpi_close(const char *op) {
    ct_status st = CT_OK;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (half_ops[i][j] != MPI_OP_NULL && half_ops[i][j] != 0) MPI_Op_free(&half_ops[i][j]);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    comm = MPI_COMM_NULL;
    if (started_mpi) {
        int rc = MPI_Finalize();
        if (rc != MPI_SUCCESS) st = mpi_fail(op, "MPI_Finalize", rc);
        started_mpi = false;
    }
    while (abandoned) {
        cti_mpi_work *w = abandoned;
        abandoned = w->next;
        free(w);
    }
    return st;
}

/* ---- collectives ------------------------------------------------------------------------- */
static int start(const cti_coll *c, MPI_Request *req) {
    MPI_Datatype t = mpi_type(c->dtype);
    int n = (int)c->count;
    switch (c->kind) {
    case CTI_COLL_ALL_REDUCE:
        return MPI_Iallreduce(c->send == c->recv ? MPI_IN_PLACE : c->send, c->recv, n, t,
                              mpi_op(c->dtype, c->op), comm, req);
    case CTI_COLL_BROADCAST: return MPI_Ibcast(c->recv, n, t, c->root, comm, req);
    case CTI_COLL_ALL_GATHER: return MPI_Iallgather(c->send, n, t, c->recv, n, t, comm, req);
    case CTI_COLL_REDUCE_SCATTER:
        return MPI_Ireduce_scatter_block(c->send, c->recv, n, t, mpi_op(c->dtype, c->op), comm,
                                         req);
    }
    return MPI_ERR_OP;
}

static const char *call_name(const cti_coll *c) {
    if (!c) return "MPI_Ibarrier";
    switch (c->kind) {
    case CTI_COLL_ALL_REDUCE: return "MPI_Iallreduce";
    case CTI_COLL_BROADCAST: return "MPI_Ibcast";
    case CTI_COLL_ALL_GATHER: return "MPI_Iallgather";
    case CTI_COLL_REDUCE_SCATTER: return "MPI_Ireduce_scatter_block";
    }
    return "MPI";
}

ct_status cti_mpi_start(const char *op, const cti_coll *c, cti_mpi_work **work) {
    *work = NULL;
    if (comm == MPI_COMM_NULL)
        return cti_error(CT_ERR_INVALID_ARG, "%s: MPI is not started in this process group", op);
    /* MPI counts are ints; a gathered or scattered whole must fit as well. */
    int world = 1;
    MPI_Comm_size(comm, &world);
    if (c && (c->count > INT_MAX || c->count * (size_t)world > (size_t)INT_MAX * 8))
        return cti_error(CT_ERR_OVERFLOW,
                         "%s: %zu elements per rank is more than MPI's int counts take (%d); "
                         "split the tensor",
                         op, c->count, INT_MAX);
    cti_mpi_work *w = malloc(sizeof *w);
    if (!w) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    int rc = c ? start(c, &w->req) : MPI_Ibarrier(comm, &w->req);
    if (rc != MPI_SUCCESS) {
        free(w);
        return mpi_fail(op, call_name(c), rc);
    }
    *work = w;
    return CT_OK;
}

ct_status cti_mpi_test(const char *op, cti_mpi_work *work, bool *done) {
    int flag = 0;
    MPI_Status status;
    int rc = MPI_Test(&work->req, &flag, &status);
    *done = false;
    if (rc != MPI_SUCCESS) {
        /* A failed request is complete (MPI frees it). */
        free(work);
        *done = true;
        return mpi_fail(op, "MPI_Test", rc);
    }
    if (flag) {
        free(work);
        *done = true;
    }
    return CT_OK;
}

ct_status cti_mpi_wait(const char *op, cti_mpi_work *work, double deadline, bool *timed_out) {
    *timed_out = false;
    int spins = 0;
    for (;;) {
        bool done;
        ct_status st = cti_mpi_test(op, work, &done);
        if (st != CT_OK || done) return st;
        if (cti_dist_now() > deadline) {
            *timed_out = true;
            work->next = abandoned;
            abandoned = work;
            return CT_ERR_RUNTIME;
        }
        cti_dist_backoff(&spins);
    }
}

ct_status cti_mpi_bcast_bytes(const char *op, void *buf, size_t n, int root, double deadline) {
    cti_mpi_work *w;
    cti_coll c = {.kind = CTI_COLL_BROADCAST, .root = root, .send = buf, .recv = buf,
                  .count = n, .dtype = CT_BOOL, .name = op};
    ct_status st = cti_mpi_start(op, &c, &w);
    if (st != CT_OK) return st;
    bool timed_out;
    st = cti_mpi_wait(op, w, deadline, &timed_out);
    if (timed_out)
        st = cti_error(CT_ERR_RUNTIME,
                       "%s: broadcast of NCCL's id from rank %d did not complete in time (a peer "
                       "did not join)",
                       op, root);
    return st;
}
