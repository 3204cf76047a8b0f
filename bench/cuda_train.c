/* One training step on the GPU, the whole of it: forward, cross-entropy,
 * zero_grad, backward and an SGD-momentum step, batch 64, float32 (TF32
 * off), for the two Fashion-MNIST models of examples/: the MLP 784-256-10
 * and the CNN conv(1->16, 3x3, pad 1)-relu-maxpool 2-conv(16->32)-relu-
 * maxpool 2-linear(1568->10). Blocks of STEPS steps are timed with CUDA
 * events on the library's stream, starting from an idle device; the loss is
 * read back once per block, as a training loop printing progress would.
 * Prints the median ms per step and its ratio to the target (PyTorch eager
 * on the same models measured 0.73 and 1.34 ms on an H200;
 * bench/torch_cuda_train.py measures it beside this program). The cases of
 * one model take turns block by block, so each row's ratio to its model's
 * float32 eager step compares blocks run moments apart.
 *
 * The "CUDA graph" rows run the same step captured once (after one eager
 * step) and replayed: per step, the batch copied into the graph's static
 * inputs and one ct_cuda_graph_replay; their last column is the ratio to
 * the float32 eager step of the same run; so are the "bf16 autocast" rows'
 * (the forward and loss in an autocast region, float32 weights).
 *
 *     bench_cuda_train [blocks] [--profile] [--only TEXT]
 *
 * --profile prints the dispatcher's per-op table of one step of each model
 * (what runs, how often, and the host time spent per op). --only runs the
 * cases whose label contains TEXT (a profiler then sees those kernels
 * alone). Skips (exit 0, a line saying why) without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cuda/cuda_impl.h"
#include "tensor/tensor.h"

#define BENCH_NAME "bench_cuda_train"
#include "cuda_bench.h"

#define BATCH 64
#define STEPS 50
#define WARMUP_BLOCKS 2

typedef struct net {
    bool cnn;
    ct_nn_linear *fc1, *fc2;
    ct_nn_conv2d *conv1, *conv2;
    ct_params *params;
} net;

static void net_free(net *m) {
    ct_nn_linear_free(m->fc1);
    ct_nn_linear_free(m->fc2);
    ct_nn_conv2d_free(m->conv1);
    ct_nn_conv2d_free(m->conv2);
    ct_params_free(m->params);
}

static bool net_init(net *m, bool cnn, ct_device dev) {
    memset(m, 0, sizeof *m);
    m->cnn = cnn;
    m->params = ct_params_new();
    if (!m->params) return false;
    if (cnn) {
        const int64_t k3[2] = {3, 3}, pad1[2] = {1, 1};
        m->conv1 = ct_nn_conv2d_new(1, 16, k3, NULL, pad1, NULL, 1, true, CT_F32, dev, NULL);
        m->conv2 = ct_nn_conv2d_new(16, 32, k3, NULL, pad1, NULL, 1, true, CT_F32, dev, NULL);
        m->fc2 = ct_nn_linear_new(32 * 7 * 7, 10, true, CT_F32, dev, NULL);
        return m->conv1 && m->conv2 && m->fc2 &&
               ct_nn_conv2d_params(m->conv1, "conv1", m->params) == CT_OK &&
               ct_nn_conv2d_params(m->conv2, "conv2", m->params) == CT_OK &&
               ct_nn_linear_params(m->fc2, "fc", m->params) == CT_OK;
    }
    m->fc1 = ct_nn_linear_new(28 * 28, 256, true, CT_F32, dev, NULL);
    m->fc2 = ct_nn_linear_new(256, 10, true, CT_F32, dev, NULL);
    return m->fc1 && m->fc2 && ct_nn_linear_params(m->fc1, "fc1", m->params) == CT_OK &&
           ct_nn_linear_params(m->fc2, "fc2", m->params) == CT_OK;
}

static ct_tensor *net_forward(net *m, ct_tensor *x) {
    if (!m->cnn) return ct_nn_linear_forward(m->fc2, ct_relu(ct_nn_linear_forward(m->fc1, x)));
    const int64_t k2[2] = {2, 2};
    x = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(m->conv1, x)), k2, NULL, NULL, NULL, false,
                      NULL);
    x = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(m->conv2, x)), k2, NULL, NULL, NULL, false,
                      NULL);
    return ct_nn_linear_forward(m->fc2, ct_flatten(x, 1, -1));
}

/* One step, the forward and loss autocast to amp unless it is CT_F32;
 * *loss (when not NULL) receives a reference to the loss. */
static bool train_step(net *m, ct_optimizer *opt, ct_tensor *x, ct_tensor *y, ct_dtype amp,
                       ct_tensor **loss) {
    ct_scope *s = ct_scope_begin();
    if (amp != CT_F32) ct_autocast_begin(ct_tensor_device(x), amp);
    ct_tensor *l = ct_cross_entropy(net_forward(m, x), y, NULL, CT_REDUCTION_MEAN, -100, 0.0);
    if (amp != CT_F32) ct_autocast_end();
    bool ok = l != NULL;
    if (ok) {
        ct_optim_zero_grad(opt);
        ok = ct_backward(l, NULL, false) == CT_OK && ct_optim_step(opt) == CT_OK;
    }
    if (ok && loss) *loss = ct_tensor_retain(l);
    ct_scope_end(s);
    return ok;
}

typedef struct bcase {
    const char *label;
    bool cnn, graph;
    ct_dtype amp;               /* CT_BF16: autocast; CT_F32: none */
    double target_ms, torch_ms; /* the goal; PyTorch eager measured on an H200 */
} bcase;

/* --graph cases: the static inputs, the captured step and its loss. */
typedef struct graphed {
    ct_tensor *sx, *sy, *loss;
    ct_cuda_graph *g;
} graphed;

/* One eager step on the static inputs (the warmup), then the capture. */
static int capture_steps(net *m, ct_optimizer *opt, ct_tensor *x, ct_tensor *y, ct_dtype amp,
                         graphed *gr) {
    gr->sx = ct_tensor_zeros_like(x);
    gr->sy = ct_tensor_zeros_like(y);
    if (!gr->sx || !gr->sy || ct_copy_(gr->sx, x) != CT_OK || ct_copy_(gr->sy, y) != CT_OK ||
        !train_step(m, opt, gr->sx, gr->sy, amp, NULL))
        return die("the warmup step", ct_last_error());
    if (!(gr->g = ct_cuda_graph_capture_begin(0))) return die("capture", ct_last_error());
    bool ok = train_step(m, opt, gr->sx, gr->sy, amp, &gr->loss);
    if (ct_cuda_graph_capture_end(gr->g) != CT_OK || !ok) return die("capture", ct_last_error());
    return 0;
}

static int capture_step(net *m, ct_optimizer *opt, ct_tensor *x, ct_tensor *y, ct_dtype amp,
                        graphed *gr) {
    /* the replayed step runs its convolutions on cuDNN (tensor/cuda.h) */
    const int64_t limit = ct_cuda_conv_direct_limit(0);
    int rc = capture_steps(m, opt, x, y, amp, gr);
    ct_cuda_conv_direct_limit(limit);
    return rc;
}

/* A step through the graph: the batch into its inputs, one replay. */
static bool graph_step(graphed *gr, ct_tensor *x, ct_tensor *y) {
    return ct_copy_(gr->sx, x) == CT_OK && ct_copy_(gr->sy, y) == CT_OK &&
           ct_cuda_graph_replay(gr->g) == CT_OK;
}

static void graphed_free(graphed *gr) {
    ct_cuda_graph_free(gr->g);
    ct_tensor_release(gr->sx);
    ct_tensor_release(gr->sy);
    ct_tensor_release(gr->loss);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* One case of the run: its model, optimizer, batch, captured step (graph
 * cases) and the times of its blocks. */
typedef struct runner {
    const bcase *bc;
    net m;
    ct_optimizer *opt;
    ct_tensor *x, *y;
    graphed gr;
    double *per, *host; /* ms per step of each block: device (events), host (queueing) */
} runner;

static int runner_init(runner *r, const bcase *bc, int blocks) {
    const ct_device dev = CT_CUDA(0);
    memset(r, 0, sizeof *r);
    r->bc = bc;
    if (!net_init(&r->m, bc->cnn, dev)) return die("building the model", ct_last_error());
    r->opt = ct_optim_sgd_new(r->m.params, 0.01, 0.9, 0, 0, false);
    r->x = bc->cnn ? ct_tensor_randn(NULL, CT_SHAPE(BATCH, 1, 28, 28), CT_F32, dev)
                   : ct_tensor_randn(NULL, CT_SHAPE(BATCH, 28 * 28), CT_F32, dev);
    r->y = ct_tensor_randint(NULL, 0, 10, CT_SHAPE(BATCH), CT_I64, dev);
    if (!r->opt || !r->x || !r->y) return die("setting up", ct_last_error());
    r->per = malloc(sizeof(double) * (size_t)blocks);
    r->host = malloc(sizeof(double) * (size_t)blocks);
    if (!r->per || !r->host) return die("malloc", "out of memory");
    return bc->graph ? capture_step(&r->m, r->opt, r->x, r->y, bc->amp, &r->gr) : 0;
}

static void runner_free(runner *r) {
    graphed_free(&r->gr);
    free(r->per);
    free(r->host);
    ct_tensor_release(r->x);
    ct_tensor_release(r->y);
    ct_optim_free(r->opt);
    net_free(&r->m);
}

/* One block of STEPS steps from an idle device, timed on the device (events
 * on the library's stream) and on the host (the time to queue the steps):
 * when the two agree the step is bound by the host's queueing. Block b < 0
 * is a warmup and keeps no times. */
static int run_block(runner *r, int b, cudaStream_t stream, cudaEvent_t t0, cudaEvent_t t1) {
    const bcase *bc = r->bc;
    if (ct_cuda_synchronize(0) != CT_OK) return die("synchronize", ct_last_error());
    CUDA_OK(cudaEventRecord(t0, stream));
    const double h0 = now_ms();
    ct_tensor *loss = NULL;
    for (int s = 0; s < STEPS; s++) {
        bool ok = bc->graph ? graph_step(&r->gr, r->x, r->y)
                            : train_step(&r->m, r->opt, r->x, r->y, bc->amp,
                                         s == STEPS - 1 ? &loss : NULL);
        if (!ok) return die(bc->label, ct_last_error());
    }
    if (bc->graph) loss = ct_tensor_retain(r->gr.loss);
    const double h1 = now_ms();
    CUDA_OK(cudaEventRecord(t1, stream));
    double lv;
    if (ct_tensor_item(loss, &lv) != CT_OK) return die("reading the loss", ct_last_error());
    ct_tensor_release(loss);
    if (!(lv == lv)) return die(bc->label, "the loss is NaN");
    float ms = 0;
    CUDA_OK(cudaEventSynchronize(t1));
    CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
    if (b >= 0) {
        r->per[b] = ms / STEPS;
        r->host[b] = (h1 - h0) / STEPS;
    }
    return 0;
}

/* The dispatcher's per-op table of one eager step. */
static int runner_profile(runner *r) {
    ct_profile_reset();
    ct_set_profile(true);
    bool ok = train_step(&r->m, r->opt, r->x, r->y, r->bc->amp, NULL);
    ct_set_profile(false);
    if (!ok) return die(r->bc->label, ct_last_error());
    fprintf(stderr, "\none step of %s:\n", r->bc->label);
    ct_profile_print(stderr);
    return 0;
}

/* The cases of one model (an eager float32 anchor and the rows compared with
 * it), their blocks taken in turn: block b of every case, then block b + 1,
 * so a slowdown of the shared machine falls on all of them alike. Each row
 * prints the median of its blocks and, for the rows after the anchor, the
 * median of its blocks' ratios to the anchor's block of the same turn. */
static int run_group(const bcase *cases, int n, const char *only, int blocks, bool profile,
                     cudaStream_t stream) {
    runner rs[8];
    int nr = 0, anchor = -1, rc = 0;
    for (int i = 0; i < n && nr < 8; i++) {
        if (only && !strstr(cases[i].label, only)) continue;
        if (cases[i].torch_ms > 0) anchor = nr;
        if ((rc = runner_init(&rs[nr++], &cases[i], blocks))) goto done;
    }
    cudaEvent_t t0, t1;
    CUDA_OK(cudaEventCreate(&t0));
    CUDA_OK(cudaEventCreate(&t1));
    for (int b = -WARMUP_BLOCKS; b < blocks && !rc; b++)
        for (int k = 0; k < nr && !rc; k++) rc = run_block(&rs[k], b, stream, t0, t1);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    /* the ratios first: median() sorts the blocks' times in place */
    double vs[8];
    for (int k = 0; k < nr && !rc; k++) {
        vs[k] = -1;
        if (k == anchor || anchor < 0) continue;
        double *ratio = malloc(sizeof(double) * (size_t)blocks);
        if (!ratio) {
            rc = die("malloc", "out of memory");
            break;
        }
        for (int b = 0; b < blocks; b++) ratio[b] = rs[k].per[b] / rs[anchor].per[b];
        vs[k] = median(ratio, blocks);
        free(ratio);
    }
    for (int k = 0; k < nr && !rc; k++) {
        const bcase *c = rs[k].bc;
        double ms = median(rs[k].per, blocks), host_ms = median(rs[k].host, blocks);
        if (k == anchor) vs[k] = ms / c->torch_ms;
        printf("%-30s %10.3f %10.3f %10.2f %11.2fx", c->label, ms, host_ms, c->target_ms,
               ms / c->target_ms);
        if (vs[k] >= 0) printf(" %13.2fx\n", vs[k]);
        else printf(" %14s\n", "-");
    }
    for (int k = 0; k < nr && profile && !rc; k++)
        if (!rs[k].bc->graph) rc = runner_profile(&rs[k]);
done:
    for (int k = 0; k < nr; k++) runner_free(&rs[k]);
    return rc;
}

int main(int argc, char **argv) {
    int blocks = 15;
    bool profile = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--profile")) profile = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (atoi(argv[i]) > 0) blocks = atoi(argv[i]);
        else return die("usage", "bench_cuda_train [blocks] [--profile] [--only TEXT]");
    }
    if (ct_device_count(CT_DEVICE_CUDA) == 0) {
        printf("bench_cuda_train: skipped, no usable GPU\n");
        return 0;
    }
    ct_cuda_device_props p;
    if (ct_cuda_get_device_properties(0, &p) != CT_OK) return die("properties", ct_last_error());
    ct_set_allow_tf32(false);
    cudaStream_t stream;
    if (cti_cuda_begin("bench_cuda_train", 0, &stream) != CT_OK)
        return die("stream", ct_last_error());
    printf("bench_cuda_train on %s (%d SMs): batch %d, float32, TF32 off, SGD momentum; "
           "median of %d blocks of %d steps, the cases of a model taking turns block by block, "
           "loss read once per block\n",
           p.name, p.multiprocessors, BATCH, blocks, STEPS);

    /* Each model's float32 eager step first: the anchor of the rows after it.
     * The bf16 autocast rows are held to it too: the goal is that autocast
     * costs nothing at this size. */
    static const bcase mlp[] = {
        {"train step mlp 784-256-10", false, false, CT_F32, 0.25, 0.73},
        {"  mlp, CUDA graph", false, true, CT_F32, 0.08, 0},
        {"  mlp, bf16 autocast", false, false, CT_BF16, 0.25, 0},
        {"  mlp, bf16 autocast, graph", false, true, CT_BF16, 0.08, 0},
    };
    static const bcase cnn[] = {
        {"train step cnn 2conv+fc", true, false, CT_F32, 0.50, 1.34},
        {"  cnn, CUDA graph", true, true, CT_F32, 0.20, 0},
        {"  cnn, bf16 autocast", true, false, CT_BF16, 0.50, 0},
    };
    printf("%-30s %10s %10s %10s %12s %14s\n", "case", "ms/step", "host ms", "target", "ratio",
           "vs anchor");
    if (run_group(mlp, 4, only, blocks, profile, stream) ||
        run_group(cnn, 3, only, blocks, profile, stream))
        return 1;
    printf("ratio: ms/step over the target (<= 1 meets it); host ms: the host's time to queue a "
           "step; vs anchor: eager rows over PyTorch eager's 0.73 / 1.34 ms on an H200 "
           "(bench/torch_cuda_train.py measures it in the same run), the other rows the median "
           "over blocks of their block over the float32 eager step's block of the same turn "
           "(\"-\": that step was left out by --only)\n");
    return 0;
}
