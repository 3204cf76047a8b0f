/* cten's cuDNN convolution against the same cuDNN calls made directly, on
 * the ResNet layer N=32, 64 -> 64 channels, 56x56, 3x3, padding 1, float32
 * with a bias:
 *   - forward: ct_conv2d against cudnnConvolutionForward + cudnnAddTensor;
 *   - forward+backward: ct_conv2d and ct_backward (gradients of input,
 *     weight and bias through autograd) against cudnnConvolutionForward,
 *     cudnnAddTensor, cudnnConvolutionBackwardData,
 *     cudnnConvolutionBackwardFilter and cudnnConvolutionBackwardBias;
 * with TF32 off (CUDNN_FMA_MATH) and on (CUDNN_DEFAULT_MATH). The direct
 * calls use the algorithms cudnnFind*AlgorithmEx ranks first, as cten does,
 * on cten's stream with their own handle and workspace. Each repetition
 * times one cten step and one direct step with CUDA events, alternating;
 * the medians and their ratio are printed (bench/torch_cuda_conv.py prints
 * PyTorch's for the same cases). Skips (exit 0, a line saying why) without
 * a GPU. */
#include <cudnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_impl.h"
#include "tensor/tensor.h"

#define BENCH_NAME "bench_cuda_conv"
#include "cuda_bench.h"

#define N 32
#define C 64
#define HW 56
#define K 3
#define REPS 30
#define WARMUP 5
#define WS_CAP ((size_t)2 << 30)

#define DNN_OK(call)                                                           \
    do {                                                                       \
        cudnnStatus_t s_ = (call);                                             \
        if (s_ != CUDNN_STATUS_SUCCESS) return die(#call, cudnnGetErrorString(s_)); \
    } while (0)

/* The direct cuDNN side: descriptors, the chosen algorithms, a workspace. */
typedef struct direct {
    cudnnHandle_t h;
    cudnnTensorDescriptor_t xd, yd, bd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnConvolutionFwdAlgoPerf_t fwd;
    cudnnConvolutionBwdDataAlgoPerf_t data;
    cudnnConvolutionBwdFilterAlgoPerf_t filter;
    void *ws;
    size_t ws_bytes;
    /* buffers: x, w, b, y, gy, gx, gw, gb */
    void *x, *w, *b, *y, *gy, *gx, *gw, *gb;
} direct;

static size_t max_workspace(direct *d) {
    size_t m = 0, b;
    for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; a++)
        if (cudnnGetConvolutionForwardWorkspaceSize(d->h, d->xd, d->wd, d->cd, d->yd,
                                                    (cudnnConvolutionFwdAlgo_t)a, &b) ==
                CUDNN_STATUS_SUCCESS && b > m)
            m = b;
    for (int a = 0; a < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT; a++)
        if (cudnnGetConvolutionBackwardDataWorkspaceSize(d->h, d->wd, d->yd, d->cd, d->xd,
                                                         (cudnnConvolutionBwdDataAlgo_t)a, &b) ==
                CUDNN_STATUS_SUCCESS && b > m)
            m = b;
    for (int a = 0; a < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT; a++)
        if (cudnnGetConvolutionBackwardFilterWorkspaceSize(
                d->h, d->xd, d->yd, d->cd, d->wd, (cudnnConvolutionBwdFilterAlgo_t)a, &b) ==
                CUDNN_STATUS_SUCCESS && b > m)
            m = b;
    return m < WS_CAP ? m : WS_CAP;
}

/* Benchmarks the three directions and keeps the first successful result of
 * each (cuDNN ranks them by time). */
static int direct_setup(direct *d, bool tf32) {
    cudnnMathType_t math = tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    DNN_OK(cudnnSetConvolutionMathType(d->cd, math));
    d->ws_bytes = max_workspace(d);
    if (d->ws) cudaFree(d->ws);
    d->ws = NULL;
    if (d->ws_bytes) CUDA_OK(cudaMalloc(&d->ws, d->ws_bytes));
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t pf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    DNN_OK(cudnnFindConvolutionForwardAlgorithmEx(d->h, d->xd, d->x, d->wd, d->w, d->cd, d->yd,
                                                  d->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got,
                                                  pf, d->ws, d->ws_bytes));
    int i = 0;
    while (i < got && (pf[i].status != CUDNN_STATUS_SUCCESS || pf[i].memory > d->ws_bytes)) i++;
    if (i == got) return die("forward", "no algorithm");
    d->fwd = pf[i];
    cudnnConvolutionBwdDataAlgoPerf_t pd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    DNN_OK(cudnnFindConvolutionBackwardDataAlgorithmEx(
        d->h, d->wd, d->w, d->yd, d->gy, d->cd, d->xd, d->gx,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, pd, d->ws, d->ws_bytes));
    i = 0;
    while (i < got && (pd[i].status != CUDNN_STATUS_SUCCESS || pd[i].memory > d->ws_bytes)) i++;
    if (i == got) return die("backward data", "no algorithm");
    d->data = pd[i];
    cudnnConvolutionBwdFilterAlgoPerf_t pw[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    DNN_OK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        d->h, d->xd, d->x, d->yd, d->gy, d->cd, d->wd, d->gw,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, pw, d->ws, d->ws_bytes));
    i = 0;
    while (i < got && (pw[i].status != CUDNN_STATUS_SUCCESS || pw[i].memory > d->ws_bytes)) i++;
    if (i == got) return die("backward filter", "no algorithm");
    d->filter = pw[i];
    if (!tf32) d->fwd.mathType = d->data.mathType = d->filter.mathType = CUDNN_FMA_MATH;
    return 0;
}

static int direct_forward(direct *d) {
    const float one = 1, zero = 0;
    DNN_OK(cudnnSetConvolutionMathType(d->cd, d->fwd.mathType));
    DNN_OK(cudnnConvolutionForward(d->h, &one, d->xd, d->x, d->wd, d->w, d->cd, d->fwd.algo,
                                   d->ws, d->ws_bytes, &zero, d->yd, d->y));
    DNN_OK(cudnnAddTensor(d->h, &one, d->bd, d->b, &one, d->yd, d->y));
    return 0;
}

static int direct_backward(direct *d) {
    const float one = 1, zero = 0;
    DNN_OK(cudnnSetConvolutionMathType(d->cd, d->data.mathType));
    DNN_OK(cudnnConvolutionBackwardData(d->h, &one, d->wd, d->w, d->yd, d->gy, d->cd,
                                        d->data.algo, d->ws, d->ws_bytes, &zero, d->xd, d->gx));
    DNN_OK(cudnnSetConvolutionMathType(d->cd, d->filter.mathType));
    DNN_OK(cudnnConvolutionBackwardFilter(d->h, &one, d->xd, d->x, d->yd, d->gy, d->cd,
                                          d->filter.algo, d->ws, d->ws_bytes, &zero, d->wd,
                                          d->gw));
    DNN_OK(cudnnConvolutionBackwardBias(d->h, &one, d->yd, d->gy, &zero, d->bd, d->gb));
    return 0;
}

typedef struct result {
    double cten_ms, direct_ms;
} result;

/* One configuration: forward and forward+backward, cten and direct alternating. */
static int bench(timer *t, direct *d, ct_tensor *x, ct_tensor *w, ct_tensor *b, ct_tensor *gy,
                 bool tf32, result *fwd, result *both) {
    ct_set_allow_tf32(tf32);
    /* twice: the first benchmark also times cuDNN's lazy kernel loading */
    if (direct_setup(d, tf32) || direct_setup(d, tf32)) return 1;
    const int64_t pad[2] = {1, 1};
    double cf[REPS], df[REPS], cb[REPS], db[REPS];
    for (int r = -WARMUP; r < REPS; r++) {
        double ms;
        /* forward */
        CUDA_OK(cudaEventRecord(t->start, t->stream));
        ct_tensor *y = ct_conv2d(x, w, b, NULL, pad, NULL, 1);
        if (!y) return die("ct_conv2d", ct_last_error());
        CUDA_OK(cudaEventRecord(t->stop, t->stream));
        if (elapsed(t, &ms)) return 1;
        ct_tensor_release(y);
        if (r >= 0) cf[r] = ms;

        CUDA_OK(cudaEventRecord(t->start, t->stream));
        if (direct_forward(d)) return 1;
        CUDA_OK(cudaEventRecord(t->stop, t->stream));
        if (elapsed(t, &ms)) return 1;
        if (r >= 0) df[r] = ms;

        /* forward + backward */
        CUDA_OK(cudaEventRecord(t->start, t->stream));
        y = ct_conv2d(x, w, b, NULL, pad, NULL, 1);
        if (!y) return die("ct_conv2d", ct_last_error());
        if (ct_backward(y, gy, false) != CT_OK) return die("ct_backward", ct_last_error());
        CUDA_OK(cudaEventRecord(t->stop, t->stream));
        if (elapsed(t, &ms)) return 1;
        if (!ct_grad(x) || !ct_grad(w) || !ct_grad(b)) return die("ct_backward", "no gradient");
        ct_tensor_release(y);
        ct_zero_grad(x);
        ct_zero_grad(w);
        ct_zero_grad(b);
        if (r >= 0) cb[r] = ms;

        CUDA_OK(cudaEventRecord(t->start, t->stream));
        if (direct_forward(d) || direct_backward(d)) return 1;
        CUDA_OK(cudaEventRecord(t->stop, t->stream));
        if (elapsed(t, &ms)) return 1;
        if (r >= 0) db[r] = ms;
    }
    fwd->cten_ms = median(cf, REPS);
    fwd->direct_ms = median(df, REPS);
    both->cten_ms = median(cb, REPS);
    both->direct_ms = median(db, REPS);
    ct_set_allow_tf32(false);
    return 0;
}

static int make_direct(direct *d, cudaStream_t stream, ct_tensor *x, ct_tensor *w, ct_tensor *b,
                       ct_tensor *gy) {
    memset(d, 0, sizeof *d);
    DNN_OK(cudnnCreate(&d->h));
    DNN_OK(cudnnSetStream(d->h, stream));
    DNN_OK(cudnnCreateTensorDescriptor(&d->xd));
    DNN_OK(cudnnCreateTensorDescriptor(&d->yd));
    DNN_OK(cudnnCreateTensorDescriptor(&d->bd));
    DNN_OK(cudnnCreateFilterDescriptor(&d->wd));
    DNN_OK(cudnnCreateConvolutionDescriptor(&d->cd));
    DNN_OK(cudnnSetTensor4dDescriptor(d->xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, HW, HW));
    DNN_OK(cudnnSetTensor4dDescriptor(d->yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, HW, HW));
    DNN_OK(cudnnSetTensor4dDescriptor(d->bd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, C, 1, 1));
    DNN_OK(cudnnSetFilter4dDescriptor(d->wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, C, C, K, K));
    DNN_OK(cudnnSetConvolution2dDescriptor(d->cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                           CUDNN_DATA_FLOAT));
    d->x = ct_tensor_data_ptr(x);
    d->w = ct_tensor_data_ptr(w);
    d->b = ct_tensor_data_ptr(b);
    d->gy = ct_tensor_data_ptr(gy);
    size_t img = (size_t)N * C * HW * HW * sizeof(float);
    CUDA_OK(cudaMalloc(&d->y, img));
    CUDA_OK(cudaMalloc(&d->gx, img));
    CUDA_OK(cudaMalloc(&d->gw, (size_t)C * C * K * K * sizeof(float)));
    CUDA_OK(cudaMalloc(&d->gb, (size_t)C * sizeof(float)));
    return 0;
}

static void free_direct(direct *d) {
    cudaFree(d->ws);
    cudaFree(d->y);
    cudaFree(d->gx);
    cudaFree(d->gw);
    cudaFree(d->gb);
    cudnnDestroyTensorDescriptor(d->xd);
    cudnnDestroyTensorDescriptor(d->yd);
    cudnnDestroyTensorDescriptor(d->bd);
    cudnnDestroyFilterDescriptor(d->wd);
    cudnnDestroyConvolutionDescriptor(d->cd);
    cudnnDestroy(d->h);
}

int main(void) {
    if (ct_device_count(CT_DEVICE_CUDA) == 0) {
        printf("bench_cuda_conv: skipped, no usable GPU\n");
        return 0;
    }
    ct_cuda_device_props p;
    if (ct_cuda_get_device_properties(0, &p) != CT_OK) return die("properties", ct_last_error());
    printf("bench_cuda_conv on %s (%d SMs), cuDNN %d\n", p.name, p.multiprocessors,
           p.cudnn_version);

    timer t;
    if (cti_cuda_begin("bench_cuda_conv", 0, &t.stream) != CT_OK)
        return die("stream", ct_last_error());
    CUDA_OK(cudaEventCreate(&t.start));
    CUDA_OK(cudaEventCreate(&t.stop));

    ct_tensor *x = ct_tensor_randn(NULL, CT_SHAPE(N, C, HW, HW), CT_F32, CT_CUDA(0));
    ct_tensor *w = ct_tensor_randn(NULL, CT_SHAPE(C, C, K, K), CT_F32, CT_CUDA(0));
    ct_tensor *b = ct_tensor_randn(NULL, CT_SHAPE(C), CT_F32, CT_CUDA(0));
    ct_tensor *gy = ct_tensor_randn(NULL, CT_SHAPE(N, C, HW, HW), CT_F32, CT_CUDA(0));
    if (!x || !w || !b || !gy) return die("inputs", ct_last_error());
    if (ct_requires_grad_(x, true) != CT_OK || ct_requires_grad_(w, true) != CT_OK ||
        ct_requires_grad_(b, true) != CT_OK)
        return die("requires_grad", ct_last_error());
    direct d;
    if (make_direct(&d, t.stream, x, w, b, gy)) return 1;

    result r[2][2]; /* [tf32][forward, forward+backward] */
    for (int tf = 0; tf < 2; tf++)
        if (bench(&t, &d, x, w, b, gy, tf == 1, &r[tf][0], &r[tf][1])) return 1;

    printf("\n%-58s %10s %10s %8s\n", "case (median of 30, CUDA events)", "cten ms", "cuDNN ms",
           "ratio");
    static const char *const what[2] = {"forward", "forward+backward"};
    for (int tf = 0; tf < 2; tf++)
        for (int k = 0; k < 2; k++) {
            char name[96];
            snprintf(name, sizeof name, "conv 32x64x56x56 3x3 pad 1 f32 %s, TF32 %s", what[k],
                     tf ? "on" : "off");
            printf("%-58s %10.3f %10.3f %7.3fx\n", name, r[tf][k].cten_ms, r[tf][k].direct_ms,
                   r[tf][k].cten_ms / r[tf][k].direct_ms);
        }
    printf("\nreference: the same cuDNN calls made directly (cudnnFind*AlgorithmEx's first "
           "choice, own handle, same stream); ratio = cten / reference\n");

    free_direct(&d);
    ct_tensor_release(x);
    ct_tensor_release(w);
    ct_tensor_release(b);
    ct_tensor_release(gy);
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.stop);
    return 0;
}
