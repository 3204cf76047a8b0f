/* What the Fashion-MNIST examples (fashion_mlp.c, fashion_cnn.c) share: the
 * command line, the data set, the training run's bookkeeping (progress
 * lines, evaluation, learning-rate schedule, checkpoints, Ctrl-C). Each
 * example keeps its model and its training loop, which read like the
 * PyTorch scripts in examples/reference/. */
#ifndef FASHION_COMMON_H
#define FASHION_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include <tensor/tensor.h>

/* The normalisation every Fashion-MNIST example uses: pixels scaled to
 * [0, 1], then (x - mean) / std with the training set's statistics. */
#define FASHION_MEAN 0.2860
#define FASHION_STD 0.3530
#define FASHION_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

typedef enum fashion_optim { FASHION_SGD, FASHION_ADAMW } fashion_optim;

/* A run's settings: each example fills the defaults, the command line
 * overrides them, and a resumed run takes those the command line leaves
 * out from the checkpoint. */
typedef struct fashion_config {
    const char *model; /* "mlp" or "cnn": checkpoints of one do not load into the other */
    ct_device device;
    bool auto_device; /* --device auto: resolved by fashion_setup */
    int64_t epochs, batch_size;
    fashion_optim optim;
    double lr;           /* peak learning rate of the cosine schedule */
    double momentum;     /* SGD */
    double weight_decay; /* SGD and AdamW */
    uint64_t seed;
    const char *checkpoint; /* NULL: no checkpoints */
    bool resume;
    const char *data_dir;
    int64_t limit_train, limit_test; /* 0: the whole set */
    int64_t log_every;               /* steps between progress lines; 0: every ~2 s */
    bool cuda_graph; /* --cuda-graph: the whole training step replayed from a CUDA graph */
    ct_dtype amp;    /* --amp: CT_BF16 or CT_F16 autocast of the forward; CT_F32: off */
    /* --ddp: data-parallel over the processes of an MPI launch (mpirun -np N;
     * tensor/dist.h): each trains on its shard of every epoch, rank 0 prints
     * and writes the checkpoint. fashion_setup starts the process group,
     * fashion_finish ends it. */
    bool ddp;
    unsigned given;                  /* the flags the command line set (internal) */
} fashion_config;

/* Parses argv into cfg (which holds the example's defaults). Returns 0 to go
 * on, 1 when the program should exit with status 0 (--help), -1 on a bad
 * command line (the message is printed). */
int fashion_parse_args(int argc, char **argv, fashion_config *cfg);

/* Images [N, 1, 28, 28] float32, normalised; labels [N] int64; CPU. */
typedef struct fashion_data {
    ct_tensor *train_x, *train_y, *test_x, *test_y;
} fashion_data;

/* Everything before the model exists: parses the command line, takes the
 * settings of the checkpoint to resume, checks the device, loads the data.
 * Returns true to go on, else false with *exit_status the status main
 * returns (0 after --help). */
bool fashion_setup(int argc, char **argv, fashion_config *cfg, fashion_data *data,
                   int *exit_status);
void fashion_data_free(fashion_data *data);

/* The optimizer cfg names over params: torch.optim.SGD(lr, momentum,
 * weight_decay) or torch.optim.AdamW(lr, weight_decay) with PyTorch's other
 * defaults. NULL with the message printed on failure. */
ct_optimizer *fashion_optimizer_new(const fashion_config *cfg, const ct_params *params);

/* The model's forward pass: logits [B, 10] from images [B, 1, 28, 28]. */
typedef ct_tensor *(*fashion_forward_fn)(void *model, ct_tensor *x);

typedef struct fashion_run {
    const fashion_config *cfg;
    ct_params *params; /* the model's named parameters (borrowed) */
    ct_optimizer *opt; /* (borrowed) */
    fashion_forward_fn forward;
    void *model;
    ct_dataloader *train, *test;
    int64_t epoch;           /* the epoch under way, from 0 */
    int64_t step;            /* optimizer steps taken, all epochs */
    int64_t steps_per_epoch; /* batches per epoch */
    int64_t first_step;      /* step this process started at */
    double best_accuracy;    /* best test accuracy so far, in [0, 1]; -1 before any */
    int64_t best_epoch;
    double train_seconds; /* training time of all runs, evaluation excluded */
    bool failed, interrupted;
    /* the step under way and the progress line */
    ct_scope *scope;
    ct_tensor *loss_sum; /* losses since the last progress line, on the device */
    ct_tensor *epoch_loss_sum;
    int64_t since_print, epoch_steps;
    double t_start, t_print, t_epoch_start;
    double eval_seconds; /* this process's time outside training steps */
    /* --cuda-graph: the graph, its static inputs [batch, 1, 28, 28] and
     * [batch] and its static output, the loss */
    ct_cuda_graph *graph;
    ct_tensor *graph_x, *graph_y, *graph_loss;
    int64_t conv_direct_limit; /* ct_cuda_conv_direct_limit's before the capture's warmup */
    /* scaler = torch.amp.GradScaler(enabled=amp == float16): a pass-through
     * unless the run autocasts to float16 */
    ct_grad_scaler *scaler;
} fashion_run;

/* Starts the run: makes the data loaders, restores the checkpoint's
 * parameters, optimizer state, epoch, step and loader state when resuming,
 * and installs the Ctrl-C handler. Returns false (with the message printed)
 * on failure. */
bool fashion_run_begin(fashion_run *run, const fashion_config *cfg, const fashion_data *data,
                       ct_params *params, ct_optimizer *opt, fashion_forward_fn forward,
                       void *model);
/* The next training batch on the run's device, in a scope of its own that
 * holds the step's temporaries until the next call. False at the epoch's
 * end, after Ctrl-C or on failure. */
bool fashion_next_batch(fashion_run *run, ct_tensor **x, ct_tensor **y);
/* --amp: opens the autocast region of the forward pass and the loss,
 *     with torch.autocast(device, dtype=amp):
 * and closes it; neither does anything when the run does not autocast. */
void fashion_autocast_begin(const fashion_run *run);
void fashion_autocast_end(const fashion_run *run);
/* --cuda-graph: the whole training step on the batch (x, y),
 *     opt.zero_grad(); with autocast: loss = cross_entropy(forward(x), y)
 *     scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
 * replayed from a CUDA graph: the batch is copied into the graph's static
 * input tensors (a smaller last batch padded with targets the loss
 * ignores) and the graph replayed. The first step runs eagerly (the warmup
 * the capture needs); the second captures the graph. The optimizer reads
 * its learning rate and step counts from device memory, so the schedule's
 * ct_optim_set_lr before each replay takes effect. Returns the loss (the
 * run's, or the step's scope's) or NULL with ct_last_error() set. */
ct_tensor *fashion_graph_step(fashion_run *run, ct_tensor *x, ct_tensor *y);
/* The learning rate of the step under way: cosine decay from cfg->lr to 0
 * over all the run's steps. */
double fashion_lr(const fashion_run *run);
/* Records the step's loss after a successful optimizer step (or a failure
 * when loss is NULL or ok is false, printing ct_last_error()) and prints the
 * progress line when it is due. */
void fashion_step_done(fashion_run *run, ct_tensor *loss, bool ok);
/* Closes the epoch: on Ctrl-C or failure saves the checkpoint (Ctrl-C only)
 * and returns false; else evaluates on the test set, prints the epoch line,
 * saves the checkpoint, starts the next epoch and returns true. */
bool fashion_end_epoch(fashion_run *run);
/* Prints the summary, frees the run; returns main's exit status. */
int fashion_finish(fashion_run *run);

/* Fraction of correct predictions and mean cross-entropy of the model on
 * loader's batches (no-grad mode). */
ct_status fashion_evaluate(fashion_forward_fn forward, void *model, ct_dataloader *loader,
                           ct_device device, double *accuracy, double *loss);

#endif
