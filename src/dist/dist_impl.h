/* Private to the dist layer (tensor/dist.h): the process group, the MPI
 * transport for CPU tensors (mpi.c; mpi_none.c in a build without MPI), the
 * rendezvous file of environment launches (rendezvous.c) and the collectives
 * the data-parallel code starts and finishes itself (group.c). NCCL is
 * reached through the CUDA module's table (backends/cuda/cuda_api.h), so
 * the library never links it. */
#ifndef CTEN_DIST_IMPL_H
#define CTEN_DIST_IMPL_H

#include "backends/cuda/cuda_api.h"
#include "core/tensor_impl.h"
#include "tensor/dist.h"

/* Seconds on a monotonic clock. */
double cti_dist_now(void);
/* Between two polls for a peer: returns at once for the first calls (MPI
 * progresses a nonblocking collective only inside its calls), then yields,
 * then sleeps a little longer each call (to 2 ms), so a long wait neither
 * burns a core nor adds much latency to a short one. *spins counts the
 * calls; starting it at CTI_DIST_SLEEP_SPINS sleeps from the first (polls
 * of a file). */
void cti_dist_backoff(int *spins);
#define CTI_DIST_SLEEP_SPINS 2200

/* ---- MPI (mpi.c) ---------------------------------------------------------------------
 * Collectives on host buffers over a duplicate of MPI_COMM_WORLD whose
 * errors return (MPI_ERRORS_RETURN), started as nonblocking calls. */
typedef struct cti_mpi_work cti_mpi_work;

/* Whether this build has MPI. */
bool cti_mpi_built(void);
/* Starts MPI unless the program did, and gives this process's place. */
ct_status cti_mpi_open(const char *op, int *rank, int *world, int *local_rank);
/* Starts c (a barrier when c is NULL) on host buffers. */
ct_status cti_mpi_start(const char *op, const cti_coll *c, cti_mpi_work **work);
/* Lets MPI progress work, *done when it completed or failed (either way
 * work is freed). */
ct_status cti_mpi_test(const char *op, cti_mpi_work *work, bool *done);
/* Polls work until it completes (CT_OK, work freed) or the deadline on
 * cti_dist_now's clock passes (*timed_out, CT_ERR_RUNTIME with no message
 * set: the caller words it). A timed-out call stays MPI's, which may still
 * write its buffers: they must outlive cti_mpi_close, which frees the
 * record. */
ct_status cti_mpi_wait(const char *op, cti_mpi_work *work, double deadline, bool *timed_out);
/* Broadcasts n bytes from root, blocking up to the deadline (NCCL's id);
 * buf must outlive cti_mpi_close. */
ct_status cti_mpi_bcast_bytes(const char *op, void *buf, size_t n, int root, double deadline);
/* Frees the communicator and finalizes MPI if cti_mpi_open started it. */
ct_status cti_mpi_close(const char *op);

/* ---- the rendezvous file (rendezvous.c) ----------------------------------------------
 * Rank 0 publishes a blob (NCCL's id, or a line saying why there is none)
 * at path; the others read it. See rendezvous.c for the protocol. On
 * ranks > 0 blob gets what rank 0 published, NUL-terminated (at most n - 1
 * bytes). */
ct_status cti_rendezvous(const char *op, const char *path, int rank, int world, double timeout_s,
                         char *blob, size_t n);

/* ---- collectives the dist layer runs itself (group.c) ----------------------------------
 * On contiguous tensors of the group's kind (checked by the caller): a
 * started collective, finished by cti_dist_finish. CUDA collectives are
 * queued on the stream when started and need no waiting; CPU ones run in
 * MPI between start and finish. AVG is applied at finish where the
 * transport has none. */
typedef struct cti_dist_work cti_dist_work;
/* out may equal in (all-reduce, broadcast). Holds references to both until
 * finished. */
ct_status cti_dist_start(const char *op, cti_coll_kind kind, ct_tensor *out, ct_tensor *in,
                         ct_dist_op rop, int root, cti_dist_work **work);
/* Lets started CPU work progress (MPI moves data only inside its calls). */
void cti_dist_progress(cti_dist_work *work);
/* Finishes work (frees it). A timeout breaks the group. */
ct_status cti_dist_finish(cti_dist_work *work);
/* Checks the group is up and not broken; op names the caller. */
ct_status cti_dist_ready(const char *op);

#endif
