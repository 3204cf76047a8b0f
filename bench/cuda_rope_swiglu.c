/* The fused CUDA rotary position embedding and SwiGLU against the device's
 * copy bandwidth, on a transformer's shapes:
 *   - rope of q [16, 1024, 12, 64] ([B, T, H, D]) with cos/sin tables
 *     [1024, 1, 32] (ct_rope_tables), half and interleaved layouts;
 *   - swiglu of gate and up [16384, 2048];
 * each in bfloat16 and float32:
 *   - forward alternating with a device-to-device cudaMemcpyAsync of x's
 *     (gate's) bytes on the same stream, each timed with CUDA events; median
 *     time, GB/s counting the inputs read once and the output written once
 *     (the tables, which stay in L2, not counted), and that as a share of the
 *     copy's GB/s (read + write). Once with one op between the events (the
 *     host's time to queue it counts), once with BURST ops queued back to back
 *     (the device's rate);
 *   - forward + backward: the op then its backward op (rope: dx; swiglu:
 *     dgate and dup in one pass), and the same through autograd (the inputs
 *     require grad, ct_backward with a given grad).
 * bench/torch_cuda_rope_swiglu.py prints the same cases for PyTorch. Skips
 * (exit 0, a line saying why) without a GPU. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/cuda/cuda_impl.h"
#include "tensor/tensor.h"

#define BENCH_NAME "bench_cuda_rope_swiglu"
#include "cuda_bench.h"

#define B 16
#define T 1024
#define H 12
#define D 64
#define ROWS 16384
#define FFN 2048
#define REPS 25
#define WARMUP 3
#define BURST 10

static cudaStream_t stream;
static cudaEvent_t ev_start, ev_stop;

enum { K_COPY, K_FWD, K_FWD_BWD, K_AUTOGRAD };

/* rope: a = x, b = cos, c = sin; swiglu: a = gate, b = up. g: the output's gradient. */
typedef struct bench_in {
    bool swiglu;
    ct_rope_layout layout;
    ct_tensor *a, *b, *c, *g, *copy_dst;
    ct_tensor *aa, *ba; /* leaves that require grad (autograd case) */
} bench_in;

static ct_tensor *forward(const bench_in *in, ct_tensor *a, ct_tensor *b) {
    return in->swiglu ? ct_swiglu(a, b) : ct_rope(a, in->b, in->c, in->layout);
}

static int run_once(const bench_in *in, int kind) {
    switch (kind) {
    case K_COPY:
        CUDA_OK(cudaMemcpyAsync(ct_tensor_data_ptr(in->copy_dst), ct_tensor_data_ptr(in->a),
                                (size_t)ct_tensor_numel(in->a) * ct_dtype_size(ct_tensor_dtype(in->a)),
                                cudaMemcpyDeviceToDevice, stream));
        return 0;
    case K_FWD: {
        ct_tensor *y = forward(in, in->a, in->b);
        if (!y) return die("forward", ct_last_error());
        ct_tensor_release(y);
        return 0;
    }
    case K_FWD_BWD: {
        ct_tensor *y = forward(in, in->a, in->b), *d0 = NULL, *d1 = NULL;
        if (!y) return die("forward", ct_last_error());
        if (in->swiglu) {
            if (ct_swiglu_backward(in->g, in->a, in->b, &d0, &d1) != CT_OK)
                return die("ct_swiglu_backward", ct_last_error());
        } else if (!(d0 = ct_rope_backward(in->g, in->b, in->c, in->layout))) {
            return die("ct_rope_backward", ct_last_error());
        }
        ct_tensor_release(y);
        ct_tensor_release(d0);
        ct_tensor_release(d1);
        return 0;
    }
    default: {
        ct_zero_grad(in->aa);
        if (in->ba) ct_zero_grad(in->ba);
        ct_tensor *y = forward(in, in->aa, in->ba);
        if (!y) return die("forward (autograd)", ct_last_error());
        if (ct_backward(y, in->g, false) != CT_OK) return die("ct_backward", ct_last_error());
        ct_tensor_release(y);
        return 0;
    }
    }
}

/* Median milliseconds of one run of each of the nk kinds, timed in
 * alternation, burst runs queued back to back per interval. */
static int time_kinds(const bench_in *in, int nk, const int *kinds, int burst, double *ms) {
    double t[4][REPS];
    for (int r = -WARMUP; r < REPS; r++)
        for (int k = 0; k < nk; k++) {
            CUDA_OK(cudaEventRecord(ev_start, stream));
            for (int i = 0; i < burst; i++)
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

static ct_tensor *leaf(ct_tensor *t) {
    ct_tensor *l = ct_detach(t);
    if (l && ct_requires_grad_(l, true) != CT_OK) {
        ct_tensor_release(l);
        return NULL;
    }
    return l;
}

static int bench_one(bool swiglu, ct_rope_layout layout, ct_dtype dt) {
    bench_in in = {.swiglu = swiglu, .layout = layout};
    const char *name = swiglu ? "swiglu" : layout == CT_ROPE_HALF ? "rope half" : "rope interleaved";
    int64_t xs[4] = {B, T, H, D}, ss[2] = {ROWS, FFN};
    int nd = swiglu ? 2 : 4;
    const int64_t *shape = swiglu ? ss : xs;
    in.a = ct_tensor_randn(NULL, nd, shape, dt, CT_CUDA(0));
    in.g = ct_tensor_randn(NULL, nd, shape, dt, CT_CUDA(0));
    in.copy_dst = ct_tensor_empty(nd, shape, dt, CT_CUDA(0));
    if (swiglu) {
        in.b = ct_tensor_randn(NULL, nd, shape, dt, CT_CUDA(0));
    } else {
        ct_tensor *c2 = NULL, *s2 = NULL;
        if (ct_rope_tables(T, D, 10000, dt, CT_CUDA(0), &c2, &s2) != CT_OK)
            return die("ct_rope_tables", ct_last_error());
        in.b = ct_reshape(c2, 3, (int64_t[]){T, 1, D / 2});
        in.c = ct_reshape(s2, 3, (int64_t[]){T, 1, D / 2});
        ct_tensor_release(c2);
        ct_tensor_release(s2);
    }
    if (!in.a || !in.b || (!swiglu && !in.c) || !in.g || !in.copy_dst)
        return die("allocating the inputs", ct_last_error());
    in.aa = leaf(in.a);
    in.ba = swiglu ? leaf(in.b) : NULL;
    if (!in.aa || (swiglu && !in.ba)) return die("leaves", ct_last_error());

    int kinds[4] = {K_COPY, K_FWD, K_FWD_BWD, K_AUTOGRAD};
    double ms[4], msb[2];
    if (time_kinds(&in, 4, kinds, 1, ms) || time_kinds(&in, 2, kinds, BURST, msb)) return 1;
    double nbytes = (double)ct_tensor_numel(in.a) * (double)ct_dtype_size(dt);
    double traffic = (swiglu ? 3 : 2) * nbytes; /* inputs read once, the output written once */
    double copy_gbs = 2 * nbytes / (ms[0] * 1e-3) / 1e9, gbs = traffic / (ms[1] * 1e-3) / 1e9;
    double copy_gbs_b = 2 * nbytes / (msb[0] * 1e-3) / 1e9, gbs_b = traffic / (msb[1] * 1e-3) / 1e9;
    const char *dn = ct_dtype_name(dt);
    printf("%-16s %-8s forward             %8.3f ms %8.0f GB/s  %5.1f%% of copy (%.3f ms, %.0f GB/s)\n",
           name, dn, ms[1], gbs, 100 * gbs / copy_gbs, ms[0], copy_gbs);
    printf("%-16s %-8s forward, %d queued  %8.3f ms %8.0f GB/s  %5.1f%% of copy (%.3f ms, %.0f GB/s)\n",
           name, dn, BURST, msb[1], gbs_b, 100 * gbs_b / copy_gbs_b, msb[0], copy_gbs_b);
    printf("%-16s %-8s forward+backward    %8.3f ms\n", name, dn, ms[2]);
    printf("%-16s %-8s fwd+bwd (autograd)  %8.3f ms\n", name, dn, ms[3]);

    ct_tensor *all[] = {in.a, in.b, in.c, in.g, in.copy_dst, in.aa, in.ba};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
    return 0;
}

int main(void) {
    if (ct_device_count(CT_DEVICE_CUDA) == 0) {
        printf(BENCH_NAME ": skipped, no usable GPU\n");
        return 0;
    }
    ct_cuda_device_props p;
    if (ct_cuda_get_device_properties(0, &p) != CT_OK) return die("properties", ct_last_error());
    printf(BENCH_NAME " on %s (%d SMs): rope x [%d, %d, %d, %d] with tables [%d, 1, %d]; "
           "swiglu [%d, %d]; median of %d after %d warm-up\n",
           p.name, p.multiprocessors, B, T, H, D, T, D / 2, ROWS, FFN, REPS, WARMUP);
    if (cti_cuda_begin(BENCH_NAME, 0, &stream) != CT_OK) return die("stream", ct_last_error());
    CUDA_OK(cudaEventCreate(&ev_start));
    CUDA_OK(cudaEventCreate(&ev_stop));
    static const ct_dtype dts[] = {CT_BF16, CT_F32};
    for (int i = 0; i < 2; i++) {
        if (bench_one(false, CT_ROPE_HALF, dts[i]) || bench_one(false, CT_ROPE_INTERLEAVED, dts[i]) ||
            bench_one(true, CT_ROPE_HALF, dts[i]))
            return 1;
    }
    printf("\nanchor: cudaMemcpyAsync device to device of x's (gate's) bytes, alternating on the "
           "same stream; targets (H200): rope and swiglu forward >= 85%% of copy in bfloat16\n");
    cudaEventDestroy(ev_start);
    cudaEventDestroy(ev_stop);
    return 0;
}
