/* The fused linear + cross-entropy (ct_linear_cross_entropy) at the shape of a
 * GPT-2 language-model head: N = 16384 tokens, d = 768, V = 50304, bfloat16
 * and float32, against the unfused ct_linear + ct_cross_entropy:
 *   - forward + backward through autograd (x and weight require grad, mean
 *     reduction, ct_backward), each timed with CUDA events: median ms;
 *   - forward alone (no grad);
 *   - the peak device memory of one forward + backward above what was
 *     allocated before it (ct_cuda_reset_peak_memory_stats /
 *     ct_cuda_memory_stats), the gradients included.
 * bench/torch_cuda_linear_ce.py prints the same cases for PyTorch (eager, and
 * Liger Kernel's chunked algorithm). TF32 stays off for float32. Skips (exit
 * 0, a line saying why) without a GPU. Optional arguments: N d V; the
 * environment variable CT_BENCH_LCE_CHUNK_ROWS forces the rows of a chunk,
 * CT_BENCH_LCE_DTYPE=bfloat16|float32 runs that dtype alone. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_impl.h"
#include "tensor/tensor.h"

#define BENCH_NAME "bench_cuda_linear_ce"
#include "cuda_bench.h"

#define REPS 15
#define WARMUP 3

static int64_t N = 16384, D = 768, V = 50304;

/* Private hook (src/ops/linear_ce.c): chunks of rows rows, 0 for automatic;
 * CT_BENCH_LCE_CHUNK_ROWS sets it, to weigh chunk sizes. */
void cti_linear_ce_set_chunk_rows(int64_t rows);

#define CT_OK_(call)                                             \
    do {                                                         \
        if ((call) != CT_OK) return die(#call, ct_last_error()); \
    } while (0)

static cudaStream_t stream;
static cudaEvent_t ev_start, ev_stop;

enum { K_FUSED_FB, K_UNFUSED_FB, K_FUSED_FWD, K_UNFUSED_FWD, K_COUNT };
static const char *kind_names[] = {"fused fwd+bwd", "unfused fwd+bwd", "fused fwd (no grad)",
                                   "unfused fwd (no grad)"};

typedef struct bench_in {
    ct_tensor *x, *w, *t; /* x and w require grad */
} bench_in;

static int run_once(const bench_in *in, int kind) {
    bool fused = kind == K_FUSED_FB || kind == K_FUSED_FWD;
    bool bwd = kind == K_FUSED_FB || kind == K_UNFUSED_FB;
    ct_zero_grad(in->x);
    ct_zero_grad(in->w);
    bool prev = bwd ? ct_is_grad_enabled() : ct_no_grad_begin();
    ct_tensor *logits = NULL, *loss;
    if (fused) {
        loss = ct_linear_cross_entropy(in->x, in->w, NULL, in->t, -100, 0, CT_REDUCTION_MEAN);
    } else {
        logits = ct_linear(in->x, in->w, NULL);
        loss = logits ? ct_cross_entropy(logits, in->t, NULL, CT_REDUCTION_MEAN, -100, 0) : NULL;
    }
    if (!bwd) ct_no_grad_end(prev);
    ct_tensor_release(logits);
    if (!loss) return die(kind_names[kind], ct_last_error());
    if (bwd && ct_backward(loss, NULL, false) != CT_OK) return die("ct_backward", ct_last_error());
    ct_tensor_release(loss);
    return 0;
}

/* Median milliseconds of one run of each kind, timed in alternation. */
static int time_kinds(const bench_in *in, int nk, const int *kinds, double *ms) {
    double t[K_COUNT][REPS];
    for (int r = -WARMUP; r < REPS; r++)
        for (int k = 0; k < nk; k++) {
            CUDA_OK(cudaEventRecord(ev_start, stream));
            if (run_once(in, kinds[k])) return 1;
            CUDA_OK(cudaEventRecord(ev_stop, stream));
            CUDA_OK(cudaEventSynchronize(ev_stop));
            float f = 0;
            CUDA_OK(cudaEventElapsedTime(&f, ev_start, ev_stop));
            if (r >= 0) t[k][r] = f;
        }
    for (int k = 0; k < nk; k++) ms[k] = median(t[k], REPS);
    return 0;
}

/* MiB the caching allocator's peak rose above what was allocated before one
 * run of kind (its gradients freed first, so they count in the peak). */
static int peak_extra(const bench_in *in, int kind, double *mib) {
    ct_zero_grad(in->x);
    ct_zero_grad(in->w);
    CT_OK_(ct_cuda_synchronize(0));
    ct_cuda_memstats m;
    CT_OK_(ct_cuda_memory_stats(0, &m));
    uint64_t base = m.allocated;
    CT_OK_(ct_cuda_reset_peak_memory_stats(0));
    if (run_once(in, kind)) return 1;
    CT_OK_(ct_cuda_synchronize(0));
    CT_OK_(ct_cuda_memory_stats(0, &m));
    *mib = (double)(m.peak_allocated - base) / (1 << 20);
    return 0;
}

static ct_tensor *leaf(ct_tensor *t, double scale) {
    ct_tensor *s = t ? ct_mul_scalar(t, scale) : NULL;
    if (s && ct_requires_grad_(s, true) != CT_OK) {
        ct_tensor_release(s);
        s = NULL;
    }
    ct_tensor_release(t);
    return s;
}

static int bench_one(ct_dtype dt) {
    bench_in in;
    in.x = leaf(ct_tensor_randn(NULL, CT_SHAPE(N, D), dt, CT_CUDA(0)), 1.0);
    in.w = leaf(ct_tensor_randn(NULL, CT_SHAPE(V, D), dt, CT_CUDA(0)), 0.02);
    in.t = ct_tensor_randint(NULL, 0, V, 1, &N, CT_I64, CT_CUDA(0));
    if (!in.x || !in.w || !in.t) return die("allocating the inputs", ct_last_error());
    int kinds[K_COUNT] = {K_FUSED_FB, K_UNFUSED_FB, K_FUSED_FWD, K_UNFUSED_FWD};
    double ms[K_COUNT], mib[2];
    if (time_kinds(&in, K_COUNT, kinds, ms)) return 1;
    if (peak_extra(&in, K_FUSED_FB, &mib[0]) || peak_extra(&in, K_UNFUSED_FB, &mib[1])) return 1;
    /* one loss value of each, for a glance at agreement */
    ct_tensor *lf = ct_linear_cross_entropy(in.x, in.w, NULL, in.t, -100, 0, CT_REDUCTION_MEAN);
    ct_tensor *lg = ct_linear(in.x, in.w, NULL);
    ct_tensor *lu = lg ? ct_cross_entropy(lg, in.t, NULL, CT_REDUCTION_MEAN, -100, 0) : NULL;
    double vf = NAN, vu = NAN;
    if (!lf || !lu || ct_tensor_item(lf, &vf) != CT_OK || ct_tensor_item(lu, &vu) != CT_OK)
        return die("loss values", ct_last_error());
    const char *dn = ct_dtype_name(dt);
    double flop = 3 * 2.0 * (double)N * (double)D * (double)V;
    for (int k = 0; k < K_COUNT; k++) {
        double f = k < 2 ? flop : flop / 3;
        printf("linear_ce %-8s N=%lld d=%lld V=%lld %-22s %8.3f ms  %6.1f TFLOP/s (GEMMs)",
               dn, (long long)N, (long long)D, (long long)V, kind_names[k], ms[k],
               f / (ms[k] * 1e-3) / 1e12);
        if (k < 2) printf("  peak extra %8.1f MiB", mib[k]);
        printf("\n");
    }
    printf("linear_ce %-8s fused/unfused fwd+bwd time %.2fx, memory %.3fx; loss fused %.6f "
           "unfused %.6f\n",
           dn, ms[0] / ms[1], mib[0] / mib[1], vf, vu);
    ct_tensor *all[] = {lf, lg, lu, in.x, in.w, in.t};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
    CT_OK_(ct_cuda_empty_cache(0));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4) {
        N = atoll(argv[1]);
        D = atoll(argv[2]);
        V = atoll(argv[3]);
    }
    if (ct_device_count(CT_DEVICE_CUDA) == 0) {
        printf(BENCH_NAME ": no usable GPU, skipped\n");
        return 0;
    }
    stream = (cudaStream_t)ct_cuda_stream(0);
    CUDA_OK(cudaEventCreate(&ev_start));
    CUDA_OK(cudaEventCreate(&ev_stop));
    ct_set_allow_tf32(false);
    const char *rows = getenv("CT_BENCH_LCE_CHUNK_ROWS");
    if (rows) {
        cti_linear_ce_set_chunk_rows(atoll(rows));
        printf("chunks of %lld rows\n", atoll(rows));
    }
    ct_cuda_device_props p;
    if (ct_cuda_get_device_properties(0, &p) == CT_OK) printf("device: %s\n", p.name);
    const char *only = getenv("CT_BENCH_LCE_DTYPE"); /* bfloat16 or float32: that one alone */
    if ((!only || !strcmp(only, "bfloat16")) && bench_one(CT_BF16)) return 1;
    if ((!only || !strcmp(only, "float32")) && bench_one(CT_F32)) return 1;
    return 0;
}
