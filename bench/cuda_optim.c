/* The fused AdamW step over the parameters of GPT-2 124M (wte 50304 x 768,
 * wpe 1024 x 768, 12 blocks of ln_1, attn.c_attn 768 x 2304 + bias,
 * attn.c_proj 768 x 768 + bias, ln_2, mlp.c_fc 768 x 3072 + bias,
 * mlp.c_proj 3072 x 768 + bias, and ln_f: 148 tensors, 124.5M elements),
 * float32 parameters, gradients and moments, against the device's copy
 * bandwidth: ct_optim_step alternating with a device-to-device
 * cudaMemcpyAsync of the same bytes on the same stream, each timed with CUDA
 * events; the median time per step with BURST steps queued between the
 * events (the device's rate) and with one (the host's time to queue it
 * counts), and the share of the copy's rate. The bytes an
 * update must move: parameters read and written, gradients read, both
 * moments read and written, 7 x 4 bytes per element; the copy moves the
 * same total (half of it read, half written).
 *
 * Also: the same step recorded once in a CUDA graph (stream capture) and
 * replayed; bfloat16 parameters and gradients with float32 master weights
 * and moments (15 x 2 bytes per element); a gradient scaler's
 * non-finite check and unscale of the float32 gradients (2 x 4 bytes per
 * element); SGD with momentum (5 x 4 bytes).
 *
 * bench/torch_cuda_optim.py times torch.optim.AdamW(fused=True) and
 * (capturable=True) over the same shapes. Skips (exit 0, a line saying why)
 * without a GPU. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/cuda/cuda_impl.h"
#include "tensor/tensor.h"

#define BENCH_NAME "bench_cuda_optim"
#include "cuda_bench.h"

#define REPS 20
#define WARMUP 3
#define BURST 5 /* steps a timed interval holds in the queued rows */
#define D 768
#define LAYERS 12

#define CT_OK_(call)                                             \
    do {                                                         \
        if ((call) != CT_OK) return die(#call, ct_last_error()); \
    } while (0)

static cudaStream_t stream;
static cudaEvent_t ev_start, ev_stop;

/* GPT-2 124M's parameter shapes, in nn.Module order. */
typedef struct shape {
    int ndim;
    int64_t s[2];
} shape;

static int gpt2_shapes(shape *out) {
    int n = 0;
    out[n++] = (shape){2, {50304, D}};
    out[n++] = (shape){2, {1024, D}};
    for (int l = 0; l < LAYERS; l++) {
        out[n++] = (shape){1, {D, 0}};         /* ln_1.weight */
        out[n++] = (shape){1, {D, 0}};         /* ln_1.bias */
        out[n++] = (shape){2, {3 * D, D}};     /* attn.c_attn.weight */
        out[n++] = (shape){1, {3 * D, 0}};     /* attn.c_attn.bias */
        out[n++] = (shape){2, {D, D}};         /* attn.c_proj.weight */
        out[n++] = (shape){1, {D, 0}};         /* attn.c_proj.bias */
        out[n++] = (shape){1, {D, 0}};         /* ln_2.weight */
        out[n++] = (shape){1, {D, 0}};         /* ln_2.bias */
        out[n++] = (shape){2, {4 * D, D}};     /* mlp.c_fc.weight */
        out[n++] = (shape){1, {4 * D, 0}};     /* mlp.c_fc.bias */
        out[n++] = (shape){2, {D, 4 * D}};     /* mlp.c_proj.weight */
        out[n++] = (shape){1, {D, 0}};         /* mlp.c_proj.bias */
    }
    out[n++] = (shape){1, {D, 0}}; /* ln_f.weight */
    out[n++] = (shape){1, {D, 0}}; /* ln_f.bias */
    return n;
}

/* What one timed round runs. */
enum { K_COPY, K_STEP, K_REPLAY, K_UNSCALE };

typedef struct bench_in {
    ct_optimizer *opt;
    ct_grad_scaler *scaler;
    cudaGraphExec_t graph;
    void *src, *dst;
    size_t copy_bytes;
} bench_in;

static int run_once(const bench_in *in, int kind) {
    switch (kind) {
    case K_COPY:
        CUDA_OK(cudaMemcpyAsync(in->dst, in->src, in->copy_bytes, cudaMemcpyDeviceToDevice,
                                stream));
        return 0;
    case K_STEP: CT_OK_(ct_optim_step(in->opt)); return 0;
    case K_REPLAY: CUDA_OK(cudaGraphLaunch(in->graph, stream)); return 0;
    default:
        CT_OK_(ct_grad_scaler_unscale(in->scaler, in->opt));
        CT_OK_(ct_grad_scaler_update(in->scaler));
        return 0;
    }
}

/* Median milliseconds of one run of each kind, timed in alternation. A
 * timed interval holds burst runs queued back to back: with burst 1 it also
 * holds the host's time to queue the step (the device waits for the first
 * launch), with more the device runs one step after another, as in a
 * training loop whose host runs ahead. */
static int time_kinds(const bench_in *in, int nk, const int *kinds, int burst, double *ms) {
    double t[4][REPS];
    for (int r = -WARMUP; r < REPS; r++)
        for (int k = 0; k < nk; k++) {
            CUDA_OK(cudaEventRecord(ev_start, stream));
            for (int b = 0; b < burst; b++)
                if (run_once(in, kinds[k])) return 1;
            CUDA_OK(cudaEventRecord(ev_stop, stream));
            CUDA_OK(cudaEventSynchronize(ev_stop));
            float f = 0;
            CUDA_OK(cudaEventElapsedTime(&f, ev_start, ev_stop));
            if (r >= 0) t[k][r] = f / burst;
        }
    for (int k = 0; k < nk; k++) ms[k] = median(t[k], REPS);
    return 0;
}

/* Parameters of dtype dt on the GPU with random gradients. */
static ct_params *make_params(const shape *sh, int n, ct_dtype dt, int64_t *numel) {
    ct_params *p = ct_params_new();
    *numel = 0;
    for (int k = 0; k < n && p; k++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", k);
        ct_tensor *t = ct_tensor_randn(NULL, sh[k].ndim, sh[k].s, dt, CT_CUDA(0));
        ct_tensor *g = ct_tensor_randn(NULL, sh[k].ndim, sh[k].s, dt, CT_CUDA(0));
        if (!t || !g || ct_requires_grad_(t, true) != CT_OK || ct_set_grad(t, g) != CT_OK ||
            ct_params_add(p, name, t) != CT_OK) {
            ct_params_free(p);
            p = NULL;
        } else {
            *numel += ct_tensor_numel(t);
        }
        ct_tensor_release(t);
        ct_tensor_release(g);
    }
    return p;
}

static void report(const char *what, double ms, double copy_ms, double bytes) {
    double gbs = bytes / (ms * 1e-3) / 1e9, copy_gbs = bytes / (copy_ms * 1e-3) / 1e9;
    printf("%-40s %8.3f ms %7.0f GB/s %6.1f%% of copy (%.3f ms, %.0f GB/s)\n", what, ms, gbs,
           100 * gbs / copy_gbs, copy_ms, copy_gbs);
}

/* Captures one ct_optim_step into in->graph; 1 when the capture failed
 * (reported, the bench goes on without the replay rows). */
static int capture_step(bench_in *in) {
    cudaGraph_t g;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) return 1;
    ct_status st = ct_optim_step(in->opt);
    cudaError_t e = cudaStreamEndCapture(stream, &g);
    if (st != CT_OK || e != cudaSuccess) {
        fprintf(stderr, BENCH_NAME ": capture failed: %s\n",
                st != CT_OK ? ct_last_error() : cudaGetErrorString(e));
        cudaGetLastError();
        return 1;
    }
    e = cudaGraphInstantiateWithFlags(&in->graph, g, 0);
    cudaGraphDestroy(g);
    return e != cudaSuccess;
}

/* One optimizer over the GPT-2 shapes in dtype dt (masters: float32 master
 * weights), timed against the copy of the same bytes; bpe: bytes an update
 * moves per element. */
static int bench_opt(const char *name, ct_dtype dt, bool adamw, bool masters, double bpe,
                     bool extras) {
    shape sh[2 + LAYERS * 12 + 2];
    int n = gpt2_shapes(sh);
    int64_t numel;
    ct_params *p = make_params(sh, n, dt, &numel);
    if (!p) return die("parameters", ct_last_error());
    bench_in in = {0};
    in.opt = adamw ? ct_optim_adamw_new(p, 6e-4, 0.9, 0.95, 1e-8, 0.1)
                   : ct_optim_sgd_new(p, 0.01, 0.9, 0, 0, false);
    if (!in.opt) return die("optimizer", ct_last_error());
    if (masters) CT_OK_(ct_optim_set_master_weights(in.opt, true));
    double bytes = bpe * (double)numel;
    /* The copy moves the same bytes: bytes / 2 read and bytes / 2 written. */
    in.copy_bytes = (size_t)(bytes / 2);
    CUDA_OK(cudaMalloc(&in.src, in.copy_bytes));
    CUDA_OK(cudaMalloc(&in.dst, in.copy_bytes));
    CUDA_OK(cudaMemsetAsync(in.src, 0, in.copy_bytes, stream));
    CT_OK_(ct_optim_step(in.opt)); /* the state exists; lr small, values stay finite */

    int kinds[2] = {K_COPY, K_STEP};
    double ms[2];
    char what[96];
    snprintf(what, sizeof what, "%s, %d tensors, %.1fM elements", name, n, numel / 1e6);
    printf("%s\n", what);
    if (time_kinds(&in, 2, kinds, BURST, ms)) return 1;
    snprintf(what, sizeof what, "  step, %d queued (device rate)", BURST);
    report(what, ms[1], ms[0], bytes);
    if (time_kinds(&in, 2, kinds, 1, ms)) return 1;
    report("  one step (with the host's queueing)", ms[1], ms[0], bytes);
    if (extras) {
        CT_OK_(ct_cuda_synchronize(0));
        if (capture_step(&in) == 0) {
            kinds[1] = K_REPLAY;
            if (time_kinds(&in, 2, kinds, 1, ms)) return 1;
            report("  one CUDA graph replay of the step", ms[1], ms[0], bytes);
            cudaGraphExecDestroy(in.graph);
        } else {
            printf("  CUDA graph replay: capture failed (see stderr)\n");
        }
        /* Scale 2: the unscale writes every gradient (halving it each round). */
        in.scaler = ct_grad_scaler_new(CT_CUDA(0), 2, 2, 0.5, 1 << 30, true);
        if (!in.scaler) return die("scaler", ct_last_error());
        kinds[1] = K_UNSCALE;
        /* Against a copy of the gradients' bytes: read and written once. */
        in.copy_bytes = (size_t)(4 * numel);
        if (time_kinds(&in, 2, kinds, 1, ms)) return 1;
        report("  grad scaler unscale + update (8 B/elem)", ms[1], ms[0], 8.0 * numel);
        ct_grad_scaler_free(in.scaler);
    }
    CUDA_OK(cudaFree(in.src));
    CUDA_OK(cudaFree(in.dst));
    ct_optim_free(in.opt);
    ct_params_free(p);
    CT_OK_(ct_cuda_empty_cache(0));
    return 0;
}

int main(void) {
    if (ct_device_count(CT_DEVICE_CUDA) == 0) {
        printf("bench_cuda_optim: skipped, no usable GPU\n");
        return 0;
    }
    ct_cuda_device_props p;
    if (ct_cuda_get_device_properties(0, &p) != CT_OK) return die("properties", ct_last_error());
    printf("bench_cuda_optim on %s (%d SMs): GPT-2 124M parameter shapes, median of %d after %d "
           "warm-up, alternating with a device-to-device copy of the same bytes\n",
           p.name, p.multiprocessors, REPS, WARMUP);
    if (cti_cuda_begin(BENCH_NAME, 0, &stream) != CT_OK) return die("stream", ct_last_error());
    CUDA_OK(cudaEventCreate(&ev_start));
    CUDA_OK(cudaEventCreate(&ev_stop));
    if (bench_opt("adamw f32 (28 B/elem)", CT_F32, true, false, 28, true)) return 1;
    if (bench_opt("adamw bf16 + f32 masters (30 B/elem)", CT_BF16, true, true, 30, false))
        return 1;
    if (bench_opt("sgd momentum f32 (20 B/elem)", CT_F32, false, false, 20, false)) return 1;
    printf("\nGB/s counts the bytes an update must move (params r+w, grads r, states r+w); the "
           "copy moves the same total. Target (H200): adamw f32 >= 80%% of copy\n");
    cudaEventDestroy(ev_start);
    cudaEventDestroy(ev_stop);
    return 0;
}
