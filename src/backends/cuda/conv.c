/* CT_OP_CONV2D and its three backward ops for CUDA tensors, through cuDNN's
 * convolution API (descriptors, cudnnFind*AlgorithmEx, cudnnConvolution*).
 *
 * The call records are the CPU kernels' (src/backends/cpu/conv.c), with
 * cti_conv_params (schema.h gives the math; the bias gradient has none):
 *   conv2d:                 in x, w, bias (or NULL); out y
 *   conv2d_backward_input:  in grad_out, w; out grad_in
 *   conv2d_backward_weight: in grad_out, x; out grad_w
 *   conv2d_backward_bias:   in grad_out; out [Co]
 * Inputs may have any strides (a 3-d input is one image); outputs are
 * contiguous.
 *
 * Each convolution has three operands in fixed roles: the image X (x or
 * grad_in), the filter W (w or grad_w) and the result side Y (y or
 * grad_out). Image operands keep their strides in the tensor descriptor, so
 * a non-contiguous NCHW view reaches cuDNN without a copy; only when cuDNN
 * refuses that layout (or the view overlaps itself, or has stride 0) is it
 * packed first. Filter descriptors have no strides, so a non-contiguous
 * weight is always packed (it is small).
 *
 * The algorithm is chosen once per (direction, geometry, strides, pointer
 * alignment, dtype, math mode) by benchmarking every algorithm with
 * cudnnFind*AlgorithmEx on the call's own buffers, as PyTorch does with
 * torch.backends.cudnn.benchmark, and kept with its ready descriptors in a
 * per-device table, so later calls with the same key only build a workspace
 * and launch. Every algorithm that succeeded is kept, fastest first: when the
 * workspace of one cannot be allocated, the next one with less workspace
 * runs instead.
 *
 * Small convolutions skip cuDNN: each cuDNN call costs 20-35 us of host
 * time, more than a small layer's whole kernel, so the forward and the input
 * gradient of a convolution of at most ct_cuda_conv_direct_limit()
 * multiply-adds (and whose indices fit 32 bits) run the direct kernels of
 * conv_direct.cu, the bias fused into the forward. The default, 2^26,
 * takes every layer of a small CNN at batch 64: such a training step is
 * bound by the host's queueing, and the direct kernels' extra device time
 * (one output per thread, no tiling: a forward of 58M multiply-adds takes
 * 72 us on an H200 against 40 us through cuDNN, host time included) is
 * less than the host time they save. Larger convolutions go to cuDNN, whose
 * kernels win there; so does every convolution of a step replayed from a
 * CUDA graph when the limit is 0 (replay has no host time; the CNN step of
 * bench_cuda_train spent 170 of its 340 us of device time in the direct
 * kernels). The weight gradient always runs on cuDNN.
 *
 * Math: float32 uses CUDNN_FMA_MATH unless ct_allow_tf32() (then
 * CUDNN_DEFAULT_MATH, which lets cuDNN use TF32 tensor cores); float16 and
 * bfloat16 use CUDNN_TENSOR_OP_MATH with float32 compute; float64 computes in
 * float64. After a cuDNN forward the bias is added by the elementwise kernel
 * (in place, broadcast over N, H, W); its gradient is conv_direct.cu's
 * per-channel sum for every size.
 *
 * One cuDNN handle per device, bound to the device's stream; a per-device
 * lock serializes the handle, the table and the descriptors. Workspaces come
 * from the caching allocator and are released after the launch (their reuse
 * is ordered after it on the stream). */
#include <cudnn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_impl.h"
#include "ops_impl.h"

/* Algorithm searches run so far (all devices); the tests read it to see
 * that a repeated shape reuses its choice. */
uint64_t cti_cuda_conv_search_count(void);
/* ct_cuda_conv_direct_limit under the name the tests look up. */
int64_t cti_cuda_conv_direct_limit(int64_t macs);

enum { FWD, BWD_DATA, BWD_FILTER };
enum { ROLE_X, ROLE_W, ROLE_Y };
#define MAX_CHOICES 8
#define NBUCKETS 64
/* The largest workspace offered to the benchmark; halved while it cannot be
 * allocated. */
#define SEARCH_WORKSPACE_CAP ((size_t)2 << 30)

/* The call's cti_conv_params as the direct kernels take them: field for
 * field conv_direct.cu's Geo (ops_impl.h gives the order). */
typedef struct geo {
    int64_t N, C, H, W, Co, kh, kw, sh, sw, ph, pw, dh, dw, G, OH, OW;
} geo;
_Static_assert(sizeof(geo) == 16 * sizeof(int64_t), "geo is 16 packed values");

static geo geo_of(const cti_conv_params *p) {
    return (geo){.N = p->N, .C = p->C, .H = p->H, .W = p->W, .Co = p->Co, .kh = p->kh,
                 .kw = p->kw, .sh = p->stride[0], .sw = p->stride[1], .ph = p->padding[0],
                 .pw = p->padding[1], .dh = p->dilation[0], .dw = p->dilation[1],
                 .G = p->groups, .OH = p->OH, .OW = p->OW};
}

typedef struct conv_key {
    int kind;      /* FWD, BWD_DATA, BWD_FILTER */
    int dtype;
    int math;      /* the requested cudnnMathType_t */
    int align[3];  /* per role: the data pointer's alignment, capped at 16 bytes */
    int64_t g[16];
    int64_t st[3][4]; /* per role: NCHW strides (0 for outputs, always packed) */
} conv_key;

typedef struct choice {
    int algo;
    cudnnMathType_t math;
    size_t ws;
    char routine[2][160]; /* without and with the bias add */
} choice;

typedef struct conv_entry {
    conv_key key;
    struct conv_entry *next;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnMathType_t cur_math; /* the math type cd holds now */
    bool pack[3];             /* input roles copied to a packed NCHW layout first */
    int nchoices;
    choice choices[MAX_CHOICES];
} conv_entry;

typedef struct conv_dev {
    pthread_mutex_t lock;
    cudnnHandle_t handle;
    conv_entry *buckets[NBUCKETS];
    /* [direction][dtype][math type]: a benchmark has run once already, so
     * cuDNN's kernels for it are loaded */
    bool warm[3][CT_NUM_DTYPES][4];
} conv_dev;

static conv_dev devs[CTI_CUDA_MAX_DEVICES];
static pthread_once_t devs_once = PTHREAD_ONCE_INIT;
static atomic_uint_fast64_t searches;

uint64_t cti_cuda_conv_search_count(void) { return (uint64_t)atomic_load(&searches); }

int64_t cti_cuda_conv_direct_limit(int64_t macs) { return ct_cuda_conv_direct_limit(macs); }

/* Multiply-adds of the convolution (the same in all three directions). */
static int64_t conv_macs(const geo *g) {
    double m = (double)g->N * (double)g->Co * (double)g->OH * (double)g->OW *
               (double)(g->C / g->G) * (double)g->kh * (double)g->kw;
    return m > 9e18 ? INT64_MAX : (int64_t)m;
}

/* Whether every element count and offset of the three roles fits the direct
 * kernels' 32-bit indexing. */
static bool fits32(const int64_t dims[3][4], const int64_t st[3][4]) {
    for (int k = 0; k < 3; k++) {
        double n = 1, reach = 1;
        for (int d = 0; d < 4; d++) {
            n *= (double)dims[k][d];
            reach += (double)(dims[k][d] - 1) * (double)(st[k][d] < 0 ? -st[k][d] : st[k][d]);
        }
        if (n >= 2147483647.0 || reach >= 2147483647.0) return false;
    }
    return true;
}

static void init_devs(void) {
    for (int i = 0; i < CTI_CUDA_MAX_DEVICES; i++) pthread_mutex_init(&devs[i].lock, NULL);
}

static void destroy_entry(conv_entry *e) {
    if (e->xd) cudnnDestroyTensorDescriptor(e->xd);
    if (e->yd) cudnnDestroyTensorDescriptor(e->yd);
    if (e->wd) cudnnDestroyFilterDescriptor(e->wd);
    if (e->cd) cudnnDestroyConvolutionDescriptor(e->cd);
    free(e);
}

/* Handles and tables are destroyed at exit, so leak checkers see nothing of
 * cuDNN's. Registered after the first handle exists, i.e. after the CUDA
 * runtime registered its own exit handler, so this one runs first. */
static void destroy_all(void) {
    for (int i = 0; i < CTI_CUDA_MAX_DEVICES; i++) {
        conv_dev *d = &devs[i];
        for (int b = 0; b < NBUCKETS; b++) {
            while (d->buckets[b]) {
                conv_entry *e = d->buckets[b];
                d->buckets[b] = e->next;
                destroy_entry(e);
            }
        }
        if (d->handle && cudaSetDevice(i) == cudaSuccess) cudnnDestroy(d->handle);
        d->handle = NULL;
    }
    cudaGetLastError();
}

static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static void register_exit(void) { atexit(destroy_all); }

/* ---- names and messages ---------------------------------------------------------------- */

static const char *algo_name(int kind, int algo) {
    static const char *const fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM",
                                      "DIRECT",        "FFT",                   "FFT_TILING",
                                      "WINOGRAD",      "WINOGRAD_NONFUSED"};
    static const char *const data[] = {"ALGO_0",     "ALGO_1",   "FFT",
                                       "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
    static const char *const filter[] = {"ALGO_0",   "ALGO_1",            "FFT",       "ALGO_3",
                                         "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
    if (algo < 0) return "?";
    if (kind == FWD) return algo < 8 ? fwd[algo] : "?";
    if (kind == BWD_DATA) return algo < 6 ? data[algo] : "?";
    return algo < 7 ? filter[algo] : "?";
}

static const char *math_name(cudnnMathType_t m) {
    switch (m) {
    case CUDNN_DEFAULT_MATH: return "DEFAULT_MATH";
    case CUDNN_TENSOR_OP_MATH: return "TENSOR_OP_MATH";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "TENSOR_OP_MATH_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH: return "FMA_MATH";
    default: return "?";
    }
}

static const char *kind_call(int kind) {
    return kind == FWD        ? "cudnnConvolutionForward"
           : kind == BWD_DATA ? "cudnnConvolutionBackwardData"
                              : "cudnnConvolutionBackwardFilter";
}

/* What a message names: the op's operands and parameters. */
typedef struct conv_ctx {
    const char *op;
    int dev;
    ct_dtype dt;
    geo g;
} conv_ctx;

static ct_status cudnn_fail(const conv_ctx *x, const char *call, cudnnStatus_t s) {
    char detail[256] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    cudaGetLastError();
    const geo *g = &x->g;
    int cat = CUDNN_STATUS_CATEGORY((int)s);
    ct_status st = s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
                           s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED
                       ? CT_ERR_OOM
                   : cat == CUDNN_STATUS_NOT_SUPPORTED ? CT_ERR_UNSUPPORTED
                                                       : CT_ERR_RUNTIME;
    return cti_error(st,
                     "%s: %s failed on cuda:%d for input [%lld,%lld,%lld,%lld], weight "
                     "[%lld,%lld,%lld,%lld], output [%lld,%lld,%lld,%lld] (stride [%lld,%lld], "
                     "padding [%lld,%lld], dilation [%lld,%lld], groups %lld, %s): %s%s%s",
                     x->op, call, x->dev, (long long)g->N, (long long)g->C, (long long)g->H,
                     (long long)g->W, (long long)g->Co, (long long)(g->C / g->G),
                     (long long)g->kh, (long long)g->kw, (long long)g->N, (long long)g->Co,
                     (long long)g->OH, (long long)g->OW, (long long)g->sh, (long long)g->sw,
                     (long long)g->ph, (long long)g->pw, (long long)g->dh, (long long)g->dw,
                     (long long)g->G, ct_dtype_name(x->dt), cudnnGetErrorString(s),
                     detail[0] ? ": " : "", detail);
}

/* ---- operands --------------------------------------------------------------------------------- */

static cudnnDataType_t cudnn_type(ct_dtype dt) {
    switch (dt) {
    case CT_F16: return CUDNN_DATA_HALF;
    case CT_BF16: return CUDNN_DATA_BFLOAT16;
    case CT_F64: return CUDNN_DATA_DOUBLE;
    default: return CUDNN_DATA_FLOAT;
    }
}

static cudnnMathType_t requested_math(ct_dtype dt) {
    switch (dt) {
    case CT_F16:
    case CT_BF16: return CUDNN_TENSOR_OP_MATH;
    case CT_F32: return ct_allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    default: return CUDNN_DEFAULT_MATH;
    }
}

/* The NCHW sizes of a role. */
static void role_dims(const geo *g, int role, int64_t d[4]) {
    if (role == ROLE_X) {
        d[0] = g->N, d[1] = g->C, d[2] = g->H, d[3] = g->W;
    } else if (role == ROLE_W) {
        d[0] = g->Co, d[1] = g->C / g->G, d[2] = g->kh, d[3] = g->kw;
    } else {
        d[0] = g->N, d[1] = g->Co, d[2] = g->OH, d[3] = g->OW;
    }
}

/* t's strides as NCHW (a 3-d tensor is one image). Size-1 dims are never
 * stepped over, so they get the stride a packed NCHW layout would give
 * them: a contiguous tensor then reads as packed whatever its strides there. */
static void nchw_strides(const ct_tensor *t, const int64_t d[4], int64_t s[4]) {
    int off = 4 - t->ndim;
    s[0] = 0;
    for (int k = 0; k < t->ndim; k++) s[k + off] = t->stride[k];
    if (d[3] == 1) s[3] = 1;
    for (int k = 2; k >= 0; k--)
        if (d[k] == 1) s[k] = s[k + 1] * d[k + 1];
}

static void packed_strides(const int64_t d[4], int64_t s[4]) {
    s[3] = 1;
    for (int k = 2; k >= 0; k--) s[k] = s[k + 1] * d[k + 1];
}

static bool is_packed(const int64_t d[4], const int64_t s[4]) {
    int64_t p[4];
    packed_strides(d, p);
    for (int k = 0; k < 4; k++)
        if (d[k] > 1 && s[k] != p[k]) return false;
    return true;
}

/* Whether a tensor descriptor can describe the layout: positive strides
 * that fit in int and elements that never share an address (checked on the
 * dims sorted by stride). */
static bool describable(const int64_t d[4], const int64_t s[4]) {
    int idx[4], n = 0;
    for (int k = 0; k < 4; k++) {
        if (d[k] > INT_MAX || s[k] > INT_MAX || s[k] < 1) return false;
        if (d[k] > 1) idx[n++] = k;
    }
    for (int a = 1; a < n; a++) /* insertion sort by stride */
        for (int b = a; b > 0 && s[idx[b]] < s[idx[b - 1]]; b--) {
            int t = idx[b];
            idx[b] = idx[b - 1];
            idx[b - 1] = t;
        }
    for (int k = 0; k + 1 < n; k++)
        if (s[idx[k + 1]] < s[idx[k]] * d[idx[k]]) return false;
    return true;
}

static int align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uintptr_t low = a & (~a + 1);
    return low == 0 || low > 16 ? 16 : (int)low;
}

/* dst <- src with the CUDA copy kernel. */
static ct_status device_copy(ct_tensor *dst, ct_tensor *src) {
    return cti_dispatch_one(CT_OP_COPY, NULL, 0, 1, &src, dst, dst->storage->device, dst->dtype);
}

/* A contiguous copy of t. */
static ct_tensor *packed(const char *op, ct_tensor *t) {
    ct_tensor *p = cti_tensor_new(op, t->ndim, t->shape, t->dtype, t->storage->device);
    if (p && device_copy(p, t) != CT_OK) {
        ct_tensor_release(p);
        return NULL;
    }
    return p;
}

/* ---- one convolution -------------------------------------------------------------------------- */

typedef struct conv_run {
    conv_ctx ctx;
    int kind;
    ct_tensor *t[3];   /* per role: the call's tensor */
    ct_tensor *pk[3];  /* per role: its packed copy, when one was made */
    bool is_out[3];
    int64_t dims[3][4];
    int64_t st[3][4];  /* the strides the descriptors get (the tensor's, or packed) */
} conv_run;

static void *role_ptr(const conv_run *r, int role) {
    return cti_data(r->pk[role] ? r->pk[role] : r->t[role]);
}

/* Packs input role k unless done; sets its descriptor strides. */
static ct_status pack_role(conv_run *r, int k) {
    if (!r->pk[k]) {
        r->pk[k] = packed(r->ctx.op, r->t[k]);
        if (!r->pk[k]) return ct_last_status();
    }
    packed_strides(r->dims[k], r->st[k]);
    return CT_OK;
}

static ct_status set_tensor(const conv_run *r, cudnnTensorDescriptor_t d, int role) {
    const int64_t *n = r->dims[role], *s = r->st[role];
    cudnnStatus_t e = cudnnSetTensor4dDescriptorEx(
        d, cudnn_type(r->ctx.dt), (int)n[0], (int)n[1], (int)n[2], (int)n[3], (int)s[0],
        (int)s[1], (int)s[2], (int)s[3]);
    return e == CUDNN_STATUS_SUCCESS ? CT_OK
                                     : cudnn_fail(&r->ctx, "cudnnSetTensor4dDescriptorEx", e);
}

/* Creates and fills the entry's descriptors for r's current layout. */
static ct_status make_descriptors(const conv_run *r, conv_entry *e) {
    const conv_ctx *x = &r->ctx;
    const geo *g = &x->g;
    cudnnStatus_t s;
    if ((s = cudnnCreateTensorDescriptor(&e->xd)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnCreateTensorDescriptor(&e->yd)) != CUDNN_STATUS_SUCCESS)
        return cudnn_fail(x, "cudnnCreateTensorDescriptor", s);
    if ((s = cudnnCreateFilterDescriptor(&e->wd)) != CUDNN_STATUS_SUCCESS)
        return cudnn_fail(x, "cudnnCreateFilterDescriptor", s);
    if ((s = cudnnCreateConvolutionDescriptor(&e->cd)) != CUDNN_STATUS_SUCCESS)
        return cudnn_fail(x, "cudnnCreateConvolutionDescriptor", s);
    if (set_tensor(r, e->xd, ROLE_X) != CT_OK || set_tensor(r, e->yd, ROLE_Y) != CT_OK)
        return ct_last_status();
    const int64_t *w = r->dims[ROLE_W];
    s = cudnnSetFilter4dDescriptor(e->wd, cudnn_type(x->dt), CUDNN_TENSOR_NCHW, (int)w[0],
                                   (int)w[1], (int)w[2], (int)w[3]);
    if (s != CUDNN_STATUS_SUCCESS) return cudnn_fail(x, "cudnnSetFilter4dDescriptor", s);
    cudnnDataType_t compute = x->dt == CT_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    s = cudnnSetConvolution2dDescriptor(e->cd, (int)g->ph, (int)g->pw, (int)g->sh, (int)g->sw,
                                        (int)g->dh, (int)g->dw, CUDNN_CROSS_CORRELATION, compute);
    if (s != CUDNN_STATUS_SUCCESS) return cudnn_fail(x, "cudnnSetConvolution2dDescriptor", s);
    if ((s = cudnnSetConvolutionGroupCount(e->cd, (int)g->G)) != CUDNN_STATUS_SUCCESS)
        return cudnn_fail(x, "cudnnSetConvolutionGroupCount", s);
    if ((s = cudnnSetConvolutionMathType(e->cd, (cudnnMathType_t)e->key.math)) !=
        CUDNN_STATUS_SUCCESS)
        return cudnn_fail(x, "cudnnSetConvolutionMathType", s);
    e->cur_math = (cudnnMathType_t)e->key.math;
    return CT_OK;
}

static void release_descriptors(conv_entry *e) {
    if (e->xd) cudnnDestroyTensorDescriptor(e->xd);
    if (e->yd) cudnnDestroyTensorDescriptor(e->yd);
    if (e->wd) cudnnDestroyFilterDescriptor(e->wd);
    if (e->cd) cudnnDestroyConvolutionDescriptor(e->cd);
    e->xd = e->yd = NULL;
    e->wd = NULL;
    e->cd = NULL;
}

static cudnnStatus_t set_math(conv_entry *e, cudnnMathType_t m) {
    if (e->cur_math == m) return CUDNN_STATUS_SUCCESS;
    cudnnStatus_t s = cudnnSetConvolutionMathType(e->cd, m);
    if (s == CUDNN_STATUS_SUCCESS) e->cur_math = m;
    return s;
}

static int algo_count(int kind) {
    return kind == FWD        ? CUDNN_CONVOLUTION_FWD_ALGO_COUNT
           : kind == BWD_DATA ? CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT
                              : CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
}

static cudnnStatus_t workspace_size(cudnnHandle_t h, const conv_entry *e, int kind, int algo,
                                    size_t *bytes) {
    *bytes = 0;
    if (kind == FWD)
        return cudnnGetConvolutionForwardWorkspaceSize(h, e->xd, e->wd, e->cd, e->yd,
                                                       (cudnnConvolutionFwdAlgo_t)algo, bytes);
    if (kind == BWD_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, e->wd, e->yd, e->cd, e->xd, (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, e->xd, e->yd, e->cd, e->wd, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
}

/* A normalized benchmark result. */
typedef struct perf {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnMathType_t math;
} perf;

/* Runs cudnnFind*AlgorithmEx for e's descriptors on r's buffers. */
static cudnnStatus_t find(cudnnHandle_t h, const conv_run *r, const conv_entry *e, void *ws,
                          size_t ws_bytes, perf *out, int *n, const char **call) {
    int want = algo_count(r->kind), got = 0;
    void *x = role_ptr(r, ROLE_X), *w = role_ptr(r, ROLE_W), *y = role_ptr(r, ROLE_Y);
    cudnnStatus_t s;
    if (r->kind == FWD) {
        cudnnConvolutionFwdAlgoPerf_t p[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        *call = "cudnnFindConvolutionForwardAlgorithmEx";
        s = cudnnFindConvolutionForwardAlgorithmEx(h, e->xd, x, e->wd, w, e->cd, e->yd, y, want,
                                                   &got, p, ws, ws_bytes);
        for (int i = 0; s == CUDNN_STATUS_SUCCESS && i < got; i++)
            out[i] = (perf){(int)p[i].algo, p[i].status, p[i].memory, p[i].mathType};
    } else if (r->kind == BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        *call = "cudnnFindConvolutionBackwardDataAlgorithmEx";
        s = cudnnFindConvolutionBackwardDataAlgorithmEx(h, e->wd, w, e->yd, y, e->cd, e->xd, x,
                                                        want, &got, p, ws, ws_bytes);
        for (int i = 0; s == CUDNN_STATUS_SUCCESS && i < got; i++)
            out[i] = (perf){(int)p[i].algo, p[i].status, p[i].memory, p[i].mathType};
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        *call = "cudnnFindConvolutionBackwardFilterAlgorithmEx";
        s = cudnnFindConvolutionBackwardFilterAlgorithmEx(h, e->xd, x, e->yd, y, e->cd, e->wd, w,
                                                          want, &got, p, ws, ws_bytes);
        for (int i = 0; s == CUDNN_STATUS_SUCCESS && i < got; i++)
            out[i] = (perf){(int)p[i].algo, p[i].status, p[i].memory, p[i].mathType};
    }
    *n = s == CUDNN_STATUS_SUCCESS ? got : 0;
    return s;
}

/* The workspace for the benchmark: the largest any algorithm asks for (up to
 * the cap), halved while the allocator cannot provide it. NULL with *bytes 0
 * when nothing could be had. */
static ct_tensor *search_workspace(cudnnHandle_t h, const conv_run *r, const conv_entry *e,
                                   size_t *bytes) {
    size_t want = 0;
    for (int a = 0; a < algo_count(r->kind); a++) {
        size_t b;
        if (workspace_size(h, e, r->kind, a, &b) == CUDNN_STATUS_SUCCESS && b > want) want = b;
    }
    if (want > SEARCH_WORKSPACE_CAP) want = SEARCH_WORKSPACE_CAP;
    while (want > 0) {
        int64_t n = (int64_t)want;
        ct_tensor *t = cti_tensor_new(r->ctx.op, 1, &n, CT_BOOL, CT_CUDA(r->ctx.dev));
        if (t) {
            *bytes = want;
            return t;
        }
        want = want < ((size_t)1 << 20) ? 0 : want / 2;
    }
    ct_clear_error();
    *bytes = 0;
    return NULL;
}

/* The routine names of a choice. */
static void name_choice(const conv_run *r, const conv_entry *e, choice *c) {
    char prefix[48] = "";
    static const char *const role_names[3][3] = {
        {"x", "w", "?"}, {"?", "w", "grad_out"}, {"x", "?", "grad_out"}};
    int n = 0;
    for (int k = 0; k < 3; k++)
        if (e->pack[k])
            n += snprintf(prefix + n, sizeof prefix - (size_t)n, "%s%s", n ? ", " : "copy ",
                          role_names[r->kind][k]);
    if (n) snprintf(prefix + n, sizeof prefix - (size_t)n, " + ");
    for (int b = 0; b < 2; b++)
        snprintf(c->routine[b], sizeof c->routine[b], "%s%s(%s, %s)%s", prefix,
                 kind_call(r->kind), algo_name(r->kind, c->algo), math_name(c->math),
                 b ? " + bias add" : "");
}

/* Whether s says cuDNN refuses the layout or problem (not a failure of the run). */
static bool refused(cudnnStatus_t s) {
    int cat = CUDNN_STATUS_CATEGORY((int)s);
    return cat == CUDNN_STATUS_NOT_SUPPORTED || cat == CUDNN_STATUS_BAD_PARAM;
}

enum { BENCH_ERROR = -1, BENCH_REFUSED = 0, BENCH_OK = 1 };

/* Benchmarks e's current layout and fills e->choices. BENCH_REFUSED (no
 * error set) when cuDNN has no algorithm for it; BENCH_ERROR with the error
 * set on a failure. */
static int benchmark(cudnnHandle_t h, const conv_run *r, conv_entry *e) {
    size_t ws_bytes = 0;
    ct_tensor *ws = search_workspace(h, r, e, &ws_bytes);
    perf p[MAX_CHOICES];
    int n = 0;
    const char *call = "";
    /* cuDNN loads its kernels lazily, and the first benchmark of a kind in a
     * process times the loading too, which can rank a slow algorithm first:
     * that one runs twice and keeps the second ranking. */
    bool *warm = &devs[r->ctx.dev].warm[r->kind][r->ctx.dt][e->key.math & 3];
    cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
    if (!*warm) s = find(h, r, e, ws ? cti_data(ws) : NULL, ws_bytes, p, &n, &call);
    if (s == CUDNN_STATUS_SUCCESS) {
        s = find(h, r, e, ws ? cti_data(ws) : NULL, ws_bytes, p, &n, &call);
        if (s == CUDNN_STATUS_SUCCESS) *warm = true;
    }
    ct_tensor_release(ws); /* the search waited for its kernels */
    atomic_fetch_add(&searches, 1);
    if (refused(s)) return BENCH_REFUSED;
    if (s != CUDNN_STATUS_SUCCESS) {
        cudnn_fail(&r->ctx, call, s);
        return BENCH_ERROR;
    }
    cudnnMathType_t req = (cudnnMathType_t)e->key.math;
    e->nchoices = 0;
    for (int i = 0; i < n && e->nchoices < MAX_CHOICES; i++) {
        if (p[i].status != CUDNN_STATUS_SUCCESS || p[i].memory > ws_bytes) continue;
        choice *c = &e->choices[e->nchoices];
        c->algo = p[i].algo;
        /* cuDNN reports the math the timed run used; with TF32 off it stays FMA */
        c->math = req == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : p[i].math;
        if (set_math(e, c->math) != CUDNN_STATUS_SUCCESS) continue;
        size_t b = 0;
        if (workspace_size(h, e, r->kind, c->algo, &b) != CUDNN_STATUS_SUCCESS) continue;
        c->ws = b > p[i].memory ? b : p[i].memory;
        name_choice(r, e, c);
        e->nchoices++;
    }
    return e->nchoices > 0 ? BENCH_OK : BENCH_REFUSED;
}

/* dev's handle, created on first use; the caller holds the device lock and
 * has made dev current. */
static ct_status handle_of(const conv_ctx *x, cudaStream_t stream, cudnnHandle_t *out) {
    conv_dev *d = &devs[x->dev];
    if (!d->handle && cti_cuda_capturing(x->dev))
        return cti_cuda_capture_refuse(x->op, x->dev,
                                       "creating the cuDNN handle (it loads cuDNN and allocates)");
    if (!d->handle) {
        cudnnHandle_t h;
        cudnnStatus_t s = cudnnCreate(&h);
        if (s != CUDNN_STATUS_SUCCESS) return cudnn_fail(x, "cudnnCreate", s);
        if ((s = cudnnSetStream(h, stream)) != CUDNN_STATUS_SUCCESS) {
            cudnnDestroy(h);
            return cudnn_fail(x, "cudnnSetStream", s);
        }
        d->handle = h;
        pthread_once(&exit_once, register_exit);
    }
    *out = d->handle;
    return CT_OK;
}

static uint64_t key_hash(const conv_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void make_key(const conv_run *r, cudnnMathType_t math, conv_key *k) {
    memset(k, 0, sizeof *k);
    k->kind = r->kind;
    k->dtype = (int)r->ctx.dt;
    k->math = (int)math;
    memcpy(k->g, &r->ctx.g, sizeof k->g);
    for (int role = 0; role < 3; role++) {
        k->align[role] = align_of(cti_data(r->t[role]));
        if (!r->is_out[role]) memcpy(k->st[role], r->st[role], sizeof k->st[role]);
    }
}

/* True when some input role would reach cuDNN with a non-packed layout. */
static bool any_strided(const conv_run *r, const conv_entry *e) {
    for (int k = 0; k < 3; k++)
        if (!r->is_out[k] && !e->pack[k] && !is_packed(r->dims[k], r->st[k])) return true;
    return false;
}

/* Builds the entry for r: descriptors on the operands' own layouts when
 * cuDNN takes them, else on packed copies. */
static ct_status search(cudnnHandle_t h, conv_run *r, const conv_key *key, conv_entry **out) {
    conv_entry *e = calloc(1, sizeof *e);
    if (!e) return cti_error(CT_ERR_OOM, "%s: out of memory for a cuDNN plan", r->ctx.op);
    e->key = *key;
    ct_status st = CT_OK;
    /* Filter descriptors have no strides; layouts no descriptor can express
     * (overlapping, stride 0, beyond int) are packed from the start. */
    for (int k = 0; k < 3 && st == CT_OK; k++) {
        if (r->is_out[k]) continue;
        bool ok = k == ROLE_W ? is_packed(r->dims[k], r->st[k])
                              : describable(r->dims[k], r->st[k]);
        if (!ok) {
            e->pack[k] = true;
            st = pack_role(r, k);
        }
    }
    int result = st == CT_OK ? BENCH_REFUSED : BENCH_ERROR;
    for (int attempt = 0; attempt < 2 && st == CT_OK; attempt++) {
        if (attempt == 1) {
            /* cuDNN refused the strided layout: the same on packed copies */
            if (!any_strided(r, e)) break;
            release_descriptors(e);
            ct_clear_error();
            for (int k = 0; k < 3 && st == CT_OK; k++) {
                if (r->is_out[k] || is_packed(r->dims[k], r->st[k])) continue;
                e->pack[k] = true;
                st = pack_role(r, k);
            }
            if (st != CT_OK) {
                result = BENCH_ERROR;
                break;
            }
        }
        st = make_descriptors(r, e);
        if (st != CT_OK) {
            /* a descriptor that refuses the strides gets the packed layout */
            result = BENCH_ERROR;
            if (attempt == 0 && any_strided(r, e)) st = CT_OK;
            continue;
        }
        result = benchmark(h, r, e);
        if (result != BENCH_REFUSED) break;
    }
    if (result == BENCH_REFUSED) {
        const geo *g = &r->ctx.g;
        cti_error(CT_ERR_UNSUPPORTED,
                  "%s: cuDNN has no algorithm for input [%lld,%lld,%lld,%lld], weight "
                  "[%lld,%lld,%lld,%lld] (stride [%lld,%lld], padding [%lld,%lld], dilation "
                  "[%lld,%lld], groups %lld, %s) on cuda:%d",
                  r->ctx.op, (long long)g->N, (long long)g->C, (long long)g->H, (long long)g->W,
                  (long long)g->Co, (long long)(g->C / g->G), (long long)g->kh, (long long)g->kw,
                  (long long)g->sh, (long long)g->sw, (long long)g->ph, (long long)g->pw,
                  (long long)g->dh, (long long)g->dw, (long long)g->G, ct_dtype_name(r->ctx.dt),
                  r->ctx.dev);
    }
    if (result != BENCH_OK) {
        destroy_entry(e);
        return ct_last_status();
    }
    *out = e;
    return CT_OK;
}

static cudnnStatus_t launch(cudnnHandle_t h, const conv_run *r, const conv_entry *e,
                            const choice *c, void *ws) {
    double one64 = 1, zero64 = 0;
    float one32 = 1, zero32 = 0;
    const void *one = r->ctx.dt == CT_F64 ? (const void *)&one64 : (const void *)&one32;
    const void *zero = r->ctx.dt == CT_F64 ? (const void *)&zero64 : (const void *)&zero32;
    void *x = role_ptr(r, ROLE_X), *w = role_ptr(r, ROLE_W), *y = role_ptr(r, ROLE_Y);
    if (r->kind == FWD)
        return cudnnConvolutionForward(h, one, e->xd, x, e->wd, w, e->cd,
                                       (cudnnConvolutionFwdAlgo_t)c->algo, ws, c->ws, zero, e->yd,
                                       y);
    if (r->kind == BWD_DATA)
        return cudnnConvolutionBackwardData(h, one, e->wd, w, e->yd, y, e->cd,
                                            (cudnnConvolutionBwdDataAlgo_t)c->algo, ws, c->ws,
                                            zero, e->xd, x);
    return cudnnConvolutionBackwardFilter(h, one, e->xd, x, e->yd, y, e->cd,
                                          (cudnnConvolutionBwdFilterAlgo_t)c->algo, ws, c->ws,
                                          zero, e->wd, w);
}

/* Runs the fastest choice whose workspace can be allocated. */
static ct_status execute(cudnnHandle_t h, const conv_run *r, conv_entry *e, bool bias,
                         const char **routine) {
    bool short_of_memory = false;
    for (int i = 0; i < e->nchoices; i++) {
        const choice *c = &e->choices[i];
        ct_tensor *ws = NULL;
        if (c->ws > 0) {
            int64_t n = (int64_t)c->ws;
            ws = cti_tensor_new(r->ctx.op, 1, &n, CT_BOOL, CT_CUDA(r->ctx.dev));
            if (!ws) {
                if (ct_last_status() != CT_ERR_OOM) return ct_last_status();
                short_of_memory = true;
                continue; /* the next choice needs less, or is slower */
            }
        }
        if (short_of_memory) ct_clear_error();
        cudnnStatus_t s = set_math(e, c->math);
        const char *call = "cudnnSetConvolutionMathType";
        if (s == CUDNN_STATUS_SUCCESS) {
            call = kind_call(r->kind);
            s = launch(h, r, e, c, ws ? cti_data(ws) : NULL);
        }
        ct_tensor_release(ws); /* reuse is ordered after the launch on the stream */
        if (s != CUDNN_STATUS_SUCCESS) return cudnn_fail(&r->ctx, call, s);
        *routine = c->routine[bias ? 1 : 0];
        return CT_OK;
    }
    const choice *least = &e->choices[0];
    for (int i = 1; i < e->nchoices; i++)
        if (e->choices[i].ws < least->ws) least = &e->choices[i];
    return cti_error(CT_ERR_OOM,
                     "%s: out of memory for the cuDNN workspace on cuda:%d: none of the %d "
                     "algorithms that work here could get its workspace (the smallest, %s "
                     "with %s, needs %zu bytes)",
                     r->ctx.op, r->ctx.dev, e->nchoices, kind_call(r->kind),
                     algo_name(r->kind, least->algo), least->ws);
}

/* The direct kernel of r's direction, with the bias fused into a forward. */
static ct_status run_direct(const conv_run *r, const ct_tensor *bias, cudaStream_t stream,
                            const char **routine) {
    static const int kinds[2] = {CTI_CONV_DIRECT_FWD, CTI_CONV_DIRECT_BWD_DATA};
    static const char *const names[2][2] = {
        {"cuda_conv2d_direct", "cuda_conv2d_direct+bias"},
        {"cuda_conv2d_backward_input_direct", "cuda_conv2d_backward_input_direct"}};
    const void *p[4] = {cti_data(r->t[ROLE_X]), cti_data(r->t[ROLE_W]), cti_data(r->t[ROLE_Y]),
                        bias ? cti_data(bias) : NULL};
    const int64_t *st[3] = {r->st[ROLE_X], r->st[ROLE_W], r->st[ROLE_Y]};
    cudaError_t e = cti_cuda_conv_direct(kinds[r->kind], r->ctx.dt, (const int64_t *)&r->ctx.g, p,
                                         st, bias ? bias->stride[0] : 0,
                                         cti_cuda_sm_count(r->ctx.dev), stream);
    if (e != cudaSuccess) return cti_cuda_fail(r->ctx.op, r->ctx.dev, "conv kernel launch", e);
    *routine = names[r->kind][bias ? 1 : 0];
    return cti_cuda_launched(r->ctx.op, r->ctx.dev, names[r->kind][0]);
}

/* Runs r: a forward or input gradient of small work on the direct kernels
 * (the bias fused; *bias_done), else the cuDNN plan, looked up or searched. */
static ct_status run_conv(conv_run *r, const ct_tensor *bias, bool *bias_done,
                          const char **routine) {
    const conv_ctx *x = &r->ctx;
    for (int k = 0; k < 3; k++) {
        role_dims(&x->g, k, r->dims[k]);
        for (int d = 0; d < 4; d++)
            if (r->dims[k][d] > INT_MAX)
                return cti_error(CT_ERR_OVERFLOW,
                                 "%s: size %lld exceeds cuDNN's 32-bit descriptors", x->op,
                                 (long long)r->dims[k][d]);
        if (r->is_out[k]) packed_strides(r->dims[k], r->st[k]);
        else nchw_strides(r->t[k], r->dims[k], r->st[k]);
        int64_t p[4];
        packed_strides(r->dims[k], p);
        if (p[0] > INT_MAX)
            return cti_error(CT_ERR_OVERFLOW,
                             "%s: %s exceeds cuDNN's 32-bit strides (%lld elements per image)",
                             x->op, cti_desc(r->t[k]), (long long)p[0]);
    }
    cudaStream_t stream;
    if (cti_cuda_begin(x->op, x->dev, &stream) != CT_OK) return ct_last_status();
    if (r->kind != BWD_FILTER && conv_macs(&x->g) <= ct_cuda_conv_direct_limit(-1) &&
        fits32(r->dims, r->st)) {
        if (bias_done) *bias_done = true;
        return run_direct(r, bias, stream, routine);
    }
    const bool has_bias = bias != NULL;
    conv_key key;
    make_key(r, requested_math(x->dt), &key);
    uint64_t hv = key_hash(&key);
    pthread_once(&devs_once, init_devs);
    conv_dev *d = &devs[x->dev];
    pthread_mutex_lock(&d->lock);
    cudnnHandle_t h = NULL;
    ct_status st = handle_of(x, stream, &h);
    conv_entry *e = NULL;
    if (st == CT_OK) {
        for (e = d->buckets[hv % NBUCKETS]; e; e = e->next)
            if (memcmp(&e->key, &key, sizeof key) == 0) break;
        if (!e && cti_cuda_capturing(x->dev)) {
            st = cti_cuda_capture_refuse(x->op, x->dev,
                                         "choosing the cuDNN algorithm for a new convolution "
                                         "(by timing each one)");
        } else if (!e) {
            st = search(h, r, &key, &e);
            if (st == CT_OK) {
                e->next = d->buckets[hv % NBUCKETS];
                d->buckets[hv % NBUCKETS] = e;
            }
        }
    }
    for (int k = 0; st == CT_OK && k < 3; k++)
        if (e->pack[k] && !r->pk[k]) st = pack_role(r, k);
    if (st == CT_OK) st = execute(h, r, e, has_bias, routine);
    pthread_mutex_unlock(&d->lock);
    if (st == CT_OK) st = cti_cuda_launched(x->op, x->dev, kind_call(r->kind));
    return st;
}

/* ---- kernels ------------------------------------------------------------------------------------ */

static void init_run(conv_run *r, ct_call *c, const char *op, int kind) {
    memset(r, 0, sizeof *r);
    r->ctx.op = op;
    r->kind = kind;
    r->ctx.dt = c->out[0]->dtype;
    r->ctx.dev = c->out[0]->storage->device.index;
    r->ctx.g = geo_of(CTI_PARAMS(c, cti_conv_params));
}

static void finish_run(conv_run *r) {
    for (int k = 0; k < 3; k++) ct_tensor_release(r->pk[k]);
}

/* Checks that the operands are on the result's device. */
static ct_status same_device(const char *op, const ct_call *c) {
    ct_device want = c->out[0]->storage->device;
    for (int k = 0; k < c->nin; k++) {
        const ct_tensor *t = c->in[k];
        if (!t) continue;
        ct_device d = t->storage->device;
        if (d.type != want.type || d.index != want.index) {
            char a[32], b[32];
            return cti_error(CT_ERR_DEVICE, "%s: operand %s is on %s, the result on %s", op,
                             cti_desc(t), ct_device_str(d, a, sizeof a),
                             ct_device_str(want, b, sizeof b));
        }
    }
    return CT_OK;
}

/* y += bias broadcast over N, H, W, by the elementwise kernel. */
static ct_status add_bias(ct_tensor *y, ct_tensor *bias) {
    int64_t shape[3] = {bias->shape[0], 1, 1}, stride[3] = {bias->stride[0], 0, 0};
    ct_tensor *b = cti_tensor_view(bias, 3, shape, stride, bias->offset);
    if (!b) return ct_last_status();
    cti_pointwise_params p = {.alpha = 1, .ialpha = 1};
    ct_status st = cti_dispatch_one(CT_OP_ADD, &p, sizeof p, 2, (ct_tensor *[]){y, b}, y,
                                    y->storage->device, y->dtype);
    ct_tensor_release(b);
    return st;
}

static ct_status k_conv2d(ct_call *c) {
    const char *op = "ct_conv2d";
    ct_tensor *x = c->in[0], *w = c->in[1], *bias = c->in[2], *y = c->out[0];
    if (same_device(op, c) != CT_OK) return ct_last_status();
    if (cti_numel(y->ndim, y->shape) == 0) {
        c->routine = "none (empty batch)";
        return CT_OK;
    }
    conv_run r;
    init_run(&r, c, op, FWD);
    r.t[ROLE_X] = x;
    r.t[ROLE_W] = w;
    r.t[ROLE_Y] = y;
    r.is_out[ROLE_Y] = true;
    bool bias_done = false;
    ct_status st = run_conv(&r, bias, &bias_done, &c->routine);
    finish_run(&r);
    if (st == CT_OK && bias && !bias_done) st = add_bias(y, bias);
    return st;
}

static ct_status k_conv2d_backward_input(ct_call *c) {
    const char *op = "ct_conv2d_backward_input";
    ct_tensor *dy = c->in[0], *w = c->in[1], *dx = c->out[0];
    if (same_device(op, c) != CT_OK) return ct_last_status();
    if (cti_numel(dx->ndim, dx->shape) == 0) {
        c->routine = "none (empty batch)";
        return CT_OK;
    }
    conv_run r;
    init_run(&r, c, op, BWD_DATA);
    r.t[ROLE_X] = dx;
    r.t[ROLE_W] = w;
    r.t[ROLE_Y] = dy;
    r.is_out[ROLE_X] = true;
    ct_status st = run_conv(&r, NULL, NULL, &c->routine);
    finish_run(&r);
    return st;
}

static ct_status k_conv2d_backward_weight(ct_call *c) {
    const char *op = "ct_conv2d_backward_weight";
    ct_tensor *dy = c->in[0], *x = c->in[1], *dw = c->out[0];
    if (same_device(op, c) != CT_OK) return ct_last_status();
    int dev = dw->storage->device.index;
    if (CTI_PARAMS(c, cti_conv_params)->N == 0) { /* no images: the gradient is zero */
        cudaStream_t stream;
        if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
        size_t bytes = (size_t)cti_numel(dw->ndim, dw->shape) * ct_dtype_size(dw->dtype);
        cudaError_t e = cudaMemsetAsync(cti_data(dw), 0, bytes, stream);
        if (e != cudaSuccess) return cti_cuda_fail(op, dev, "cudaMemsetAsync", e);
        c->routine = "cudaMemsetAsync (empty batch)";
        return cti_cuda_launched(op, dev, "conv2d_backward_weight");
    }
    conv_run r;
    init_run(&r, c, op, BWD_FILTER);
    r.t[ROLE_X] = x;
    r.t[ROLE_W] = dw;
    r.t[ROLE_Y] = dy;
    r.is_out[ROLE_W] = true;
    ct_status st = run_conv(&r, NULL, NULL, &c->routine);
    finish_run(&r);
    return st;
}

/* The sum of grad_out over N, H, W: one block per channel. */
static ct_status k_conv2d_backward_bias(ct_call *c) {
    const char *op = "ct_conv2d_backward_bias";
    ct_tensor *dy = c->in[0], *db = c->out[0];
    if (same_device(op, c) != CT_OK) return ct_last_status();
    int dev = db->storage->device.index;
    /* the call carries no geometry: grad_out's [N,] Co, OH, OW give it */
    geo g = {.N = 1, .C = 1, .H = 1, .W = 1, .kh = 1, .kw = 1, .sh = 1, .sw = 1, .dh = 1,
             .dw = 1, .G = 1};
    int64_t d[4] = {1, 1, 1, 1}, st[4];
    for (int k = 0; k < dy->ndim; k++) d[k + 4 - dy->ndim] = dy->shape[k];
    g.N = d[0], g.Co = d[1], g.OH = d[2], g.OW = d[3];
    nchw_strides(dy, d, st);
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    const void *p[4] = {NULL, NULL, cti_data(dy), cti_data(db)};
    const int64_t *sts[3] = {st, st, st};
    cudaError_t e =
        cti_cuda_conv_direct(CTI_CONV_DIRECT_BWD_BIAS, db->dtype, (const int64_t *)&g, p, sts, 1,
                             cti_cuda_sm_count(dev), stream);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "conv kernel launch", e);
    c->routine = "cuda_conv2d_backward_bias";
    return cti_cuda_launched(op, dev, "conv2d_backward_bias");
}

void cti_cuda_register_conv(void) {
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        cti_register_kernel(CT_OP_CONV2D, CT_DEVICE_CUDA, dts[i], k_conv2d,
                            "cudnnConvolutionForward");
        cti_register_kernel(CT_OP_CONV2D_BACKWARD_INPUT, CT_DEVICE_CUDA, dts[i],
                            k_conv2d_backward_input, "cudnnConvolutionBackwardData");
        cti_register_kernel(CT_OP_CONV2D_BACKWARD_WEIGHT, CT_DEVICE_CUDA, dts[i],
                            k_conv2d_backward_weight, "cudnnConvolutionBackwardFilter");
        cti_register_kernel(CT_OP_CONV2D_BACKWARD_BIAS, CT_DEVICE_CUDA, dts[i],
                            k_conv2d_backward_bias, "cuda_conv2d_backward_bias");
    }
}
