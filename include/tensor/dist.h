/* cten: data-parallel training over several processes, as torch.distributed
 * and DistributedDataParallel offer it (docs/DISTRIBUTED.md).
 *
 * One process group per process, made by ct_dist_init from how the process
 * was launched:
 *   - by an MPI launcher (mpirun, mpiexec, srun with PMI/PMIx): rank and
 *     world size come from MPI, which also carries the collectives on CPU
 *     tensors and hands NCCL its id;
 *   - from the environment (RANK, WORLD_SIZE, LOCAL_RANK, as torchrun sets
 *     them) with a rendezvous file on a path every rank sees
 *     (CT_DIST_RENDEZVOUS or the options): rank 0 writes NCCL's id there and
 *     the others read it. Without MPI there is no transport for CPU tensors:
 *     their collectives need world size 1 (they fail otherwise, saying so);
 *   - by neither: a group of one process.
 * Collectives on CUDA tensors run through NCCL on cten's stream of the
 * tensor's device (one device per process, the first a collective uses),
 * queued like any op; those on CPU tensors through MPI, and return when
 * done. Every collective must be called by every rank, in the same order,
 * on tensors of the same shape and dtype.
 *
 * Failures: MPI's and NCCL's errors become cten errors (CT_ERR_RUNTIME, the
 * message naming the call, the rank and the library's text). A collective
 * that a peer does not join (it failed, exited, or took another path) ends
 * with CT_ERR_RUNTIME after the group's timeout, never a hang: MPI's are
 * nonblocking calls polled against a deadline; NCCL's are watched by a
 * thread that aborts the communicator at the deadline, which also releases
 * every wait for the device behind it. After a timeout the group is broken:
 * every later collective fails at once with the first error; finalize and
 * exit. A peer process that dies under mpirun makes mpirun end the job.
 *
 * Threads: the group is used by one thread at a time (the one that trains).
 * Errors: a status (or NULL), with the message in ct_last_error(). */
#ifndef CTEN_DIST_H
#define CTEN_DIST_H

#include "core.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_dist_options {
    /* Seconds a collective (and the rendezvous) may wait for its peers;
     * 0 takes CT_DIST_TIMEOUT from the environment, else 300. */
    double timeout_s;
    /* The rendezvous file of an environment launch; NULL takes
     * CT_DIST_RENDEZVOUS. Its directory must be shared by all ranks. */
    const char *rendezvous;
} ct_dist_options;

/* Creates the process group (opts may be NULL for the defaults). Calling it
 * again while a group exists is CT_ERR_INVALID_ARG. An MPI launch starts MPI
 * (MPI_Init_thread) unless the program did; a bad environment (RANK outside
 * [0, WORLD_SIZE), no rendezvous path for WORLD_SIZE > 1, an MPI launch in a
 * build without MPI) is CT_ERR_INVALID_ARG, a rendezvous that does not
 * complete within the timeout CT_ERR_RUNTIME, naming the file and what was
 * found there (a file that is not a rendezvous file: CT_ERR_FORMAT). */
ct_status ct_dist_init(const ct_dist_options *opts);
/* Ends the group: frees NCCL's communicator and finalizes MPI if
 * ct_dist_init started it. Collective under MPI: every rank calls it. No-op
 * without a group. */
ct_status ct_dist_finalize(void);
bool ct_dist_is_initialized(void);
/* This process's rank in [0, world size), the world size, the rank among
 * the group's processes on this machine (LOCAL_RANK, MPI's shared-memory
 * split): 0, 1 and 0 without a group. */
int ct_dist_rank(void);
int ct_dist_world_size(void);
int ct_dist_local_rank(void);
/* How the group was made: "mpi", "env" or "single"; "none" without one. */
const char *ct_dist_launch(void);
/* The timeout of later collectives, seconds > 0. */
ct_status ct_dist_set_timeout(double seconds);

typedef enum ct_dist_op {
    CT_DIST_SUM, /* bool: logical or */
    CT_DIST_AVG, /* floating dtypes only: the sum divided by the world size */
    CT_DIST_MAX,
} ct_dist_op;

/* In place: t becomes the reduction of every rank's t (torch's all_reduce).
 * Any dtype (AVG floating only), any layout: a non-contiguous t is reduced
 * through a contiguous copy. t must not require grad in grad mode. */
ct_status ct_dist_all_reduce(ct_tensor *t, ct_dist_op op);
/* In place: every rank's t becomes root's. */
ct_status ct_dist_broadcast(ct_tensor *t, int root);
/* out = every rank's in concatenated along dim 0, rank order (torch's
 * all_gather_into_tensor): out has in's dtype and device and in's shape with
 * dim 0 times the world size ([world] for a 0-d in). */
ct_status ct_dist_all_gather(ct_tensor *out, ct_tensor *in);
/* out = rank's share of the reduction of every rank's in (torch's
 * reduce_scatter_tensor): in's dim 0 is the world size times out's, the rest
 * equal; dtype and device as in's. */
ct_status ct_dist_reduce_scatter(ct_tensor *out, ct_tensor *in, ct_dist_op op);
/* Returns when every rank has called it (through MPI, or through NCCL on
 * the group's device when the group has no MPI). */
ct_status ct_dist_barrier(void);

/* ---- data-parallel training ------------------------------------------------------------
 * DistributedDataParallel over a parameter list: every rank builds the same
 * model, wraps its parameters, and runs the same steps on its own share of
 * the data; the gradients are averaged across ranks during backward, so each
 * rank's optimizer takes the same step:
 *
 *     ct_ddp *ddp = ct_ddp_new(params, NULL);       // broadcasts rank 0's values
 *     ct_optimizer *opt = ct_optim_adamw_new(ct_ddp_optim_params(ddp), ...);
 *     ct_dataloader_shard(loader, ct_dist_rank(), ct_dist_world_size());
 *     for each batch:
 *         ct_optim_zero_grad(opt);
 *         ct_ddp_backward(ddp, loss, NULL);           // loss.backward(), reduced
 *         ct_ddp_step(ddp, opt);                      // opt.step()
 *
 * Gradients are reduced in buckets (about bucket_mb each, parameters taken
 * in reverse order of the list, as backward tends to produce them, one
 * dtype and device per bucket): a post-accumulate-grad hook on each
 * parameter (tensor/autograd.h) marks it ready, and a bucket whose
 * parameters are all ready starts its all-reduce at once, in bucket order
 * on every rank, while backward goes on. Parameters backward gives no
 * gradient count as zeros; after the pass every parameter that requires
 * grad holds the average (find_unused_parameters: those no rank gave a
 * gradient keep none). */
typedef struct ct_ddp ct_ddp;

typedef struct ct_ddp_options {
    double bucket_mb; /* bucket size in MiB (2^20 bytes); 0: 25 */
    /* ZeRO-1: each rank keeps the optimizer state of 1 / world of the
     * parameters. Gradients are reduce-scattered (each rank gets the average
     * of its shard of every bucket), the optimizer given
     * ct_ddp_optim_params updates that shard, and ct_ddp_step all-gathers the
     * updated values into every rank's parameters. The parameters' own
     * gradients are dropped once reduced; gradient clipping over them is not
     * available in this mode. Optimizers whose update is elementwise (SGD,
     * AdamW) give the same parameters as without it. */
    bool zero1;
    /* Agree across ranks, after each synchronizing backward, on which
     * parameters received a gradient anywhere, so those that none did keep
     * no gradient (one more small all-reduce per step). */
    bool find_unused_parameters;
} ct_ddp_options;

/* Wraps params (the list the optimizer would get; every rank passes the same
 * names, shapes, dtypes and devices, in the same order) and broadcasts every
 * parameter's values from rank 0. Needs a process group. Sets a hook on each
 * parameter that requires grad (refused when one has a hook). Keeps its own
 * references; opts may be NULL. NULL with an error on failure. */
ct_ddp *ct_ddp_new(const ct_params *params, const ct_ddp_options *opts);
/* Removes the hooks and releases the references (NULL is a no-op). */
void ct_ddp_free(ct_ddp *ddp);
/* What the optimizer updates: the parameters (borrowed list), or with zero1
 * this rank's shards, one float tensor per bucket named "bucket<k>". */
const ct_params *ct_ddp_optim_params(ct_ddp *ddp);
/* Runs ct_backward(loss, grad_out, false) and, when syncing, reduces the
 * gradients (started during the pass, finished before returning). */
ct_status ct_ddp_backward(ct_ddp *ddp, ct_tensor *loss, ct_tensor *grad_out);
/* Gradient accumulation (torch's no_sync): with sync false, backward
 * accumulates local gradients and communicates nothing; the next backward
 * with sync true reduces the accumulated sums. Returns the previous
 * setting. */
bool ct_ddp_set_sync(ct_ddp *ddp, bool sync);
/* ct_optim_step(opt), then, with zero1, the all-gather of the updated
 * shards into the parameters. opt must be over ct_ddp_optim_params. */
ct_status ct_ddp_step(ct_ddp *ddp, ct_optimizer *opt);
/* The buckets: their number, and bucket k's parameter count, element
 * count and the number of backward passes that started its reduction
 * during the pass (the rest were started after it, for parameters without
 * a gradient). -1 when k is out of range. */
int64_t ct_ddp_num_buckets(const ct_ddp *ddp);
int64_t ct_ddp_bucket_params(const ct_ddp *ddp, int64_t k);
int64_t ct_ddp_bucket_numel(const ct_ddp *ddp, int64_t k);
int64_t ct_ddp_bucket_early_starts(const ct_ddp *ddp, int64_t k);

#ifdef __cplusplus
}
#endif
#endif
