/* cten-bench: one suite of cases run on every device present (the CPU and
 * each CUDA GPU), each case timed against an anchor called directly in the
 * same process and alternating with it (cblas_sgemm / cublasGemmEx for
 * products and convolutions, memcpy / cudaMemcpy for bandwidth-bound ops),
 * against the device's own ceilings measured at start (a large GEMM, a large
 * copy), and GPU against CPU.
 *
 * Each case: one traced call (the routine the library ran goes into the
 * JSON), warm-up, then repeats that alternate the library and the anchor;
 * a repeat times `inner` back-to-back calls (host clock on the CPU, CUDA
 * events on the library's stream on the GPU) so that short ops are not
 * lost in the timer's resolution. Inputs are random (uniform in [-1, 1)) and
 * rotated among several copies when one copy would fit in the cache.
 *
 * Prints a table on stdout; --json writes one record per case (see
 * docs/BENCH.md for the columns and the fields). A case whose op has no
 * kernel on a device is reported as unsupported. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "bench_common.h"
#include "bench_gpu.h"
#include "tensor/tensor.h"

#define MAX_SETS 8
#define MAX_DEVICES 17
#define MAX_GEMMS 10
#define MAX_SIZES 16

/* ---- options ---------------------------------------------------------------------------- */
typedef struct options {
    bool quick;
    const char *cases;   /* comma-separated families, NULL for all */
    const char *match;   /* substring of the case name */
    const char *devices; /* "cpu,cuda" or "cuda:1", NULL for all present */
    int64_t sizes[MAX_SIZES];
    int nsizes;
    int64_t batches[MAX_SIZES];
    int nbatches;
    int reps;      /* 0: as many as fit the budget */
    int warmup;    /* -1: default */
    double budget; /* seconds per case and device; <= 0: default */
    const char *json;
    int threads;
    bool anchors;
    bool ceilings;
    bool list;
} options;

static options opt = {.warmup = -1, .anchors = true, .ceilings = true};

/* ---- devices and their ceilings -------------------------------------------------------- */
typedef struct devctx {
    ct_device dev;
    char label[16]; /* "cpu", "cuda:0" */
    char name[256];
    bg_gpu *gpu; /* NULL on the CPU */
    size_t cache_bytes;
    size_t rotate_budget; /* bytes the rotated input copies may take */
    double t0;            /* host timer start */
    /* Ceilings: GFLOP/s of a large GEMM per kind, GB/s of a large copy; 0 = not measured. */
    double gemm_f32, gemm_tf32, gemm_bf16, copy_gbs;
    int64_t gemm_n;
    size_t copy_bytes;
    ct_cuda_device_props props;
} devctx;

static devctx devices[MAX_DEVICES];
static int ndevices;

static bool is_gpu(const devctx *d) { return d->dev.type == CT_DEVICE_CUDA; }

/* ---- a case ------------------------------------------------------------------------------- */
typedef enum rate_kind { RATE_FLOP, RATE_BYTES, RATE_CALLS } rate_kind;
typedef enum ceil_kind {
    CEIL_NONE,
    CEIL_GEMM_F32,
    CEIL_GEMM_TF32,
    CEIL_GEMM_BF16,
    CEIL_COPY
} ceil_kind;

typedef struct gemm_shape {
    int64_t M, N, K;
} gemm_shape;

typedef struct bcase bcase;
struct bcase {
    /* what it is */
    const char *family;
    char key[128]; /* pairs a case across devices (sizes may differ per device) */
    char name[128];
    char variant[16];
    ct_dtype dtype;
    bool tf32;
    const char *op; /* the op whose routine the table shows */
    ct_op need[4];  /* ops whose kernels the case needs, checked up front */
    int nneed;
    const char *pnames[6];
    int64_t pvals[6];
    int nparams;
    rate_kind rate;
    double work; /* flop or bytes per call */
    ceil_kind ceil;
    char anchor_name[40];
    double anchor_work; /* in the unit of work */
    devctx *d;
    /* how it runs */
    ct_status (*setup)(bcase *c);
    ct_status (*run)(bcase *c);
    int (*anchor)(bcase *c);
    int64_t p[6]; /* family parameters */
    int nsets, set;
    ct_tensor *in[MAX_SETS][3];
    ct_tensor *aux[6];
    ct_tensor *abuf[6];
    void *host_dst;
    size_t copy_bytes;
    gemm_shape gemms[MAX_GEMMS];
    int ngemms;
    ct_generator *gen;
    ct_nn_linear *fc1, *fc2;
    ct_nn_conv2d *cv1, *cv2;
    ct_params *params;
    ct_optimizer *optim;
    /* what came out */
    char status[16]; /* ok, unsupported, error */
    char note[512];
    int reps, inner, warmup;
    bc_stats t, ta;
    bool has_anchor;
    bc_trace trace;
    double speedup; /* GPU rows: throughput against the CPU row of the same key; 0 = none */
};

static bcase *records;
static int nrecords, caprecords;

/* ---- small helpers ------------------------------------------------------------------------- */
static int next_set(bcase *c) {
    c->set = (c->set + 1) % c->nsets;
    return c->set;
}

static void param(bcase *c, const char *name, int64_t v) {
    if (c->nparams < 6) {
        c->pnames[c->nparams] = name;
        c->pvals[c->nparams++] = v;
    }
}

/* How many copies of an input set of set_bytes to rotate: enough that the
 * rotation spans twice the cache, at most MAX_SETS and within the budget. */
static int sets_for(const devctx *d, size_t set_bytes) {
    if (set_bytes == 0) return 1;
    size_t want = (2 * d->cache_bytes + set_bytes - 1) / set_bytes;
    size_t fit = d->rotate_budget / set_bytes;
    size_t n = want < fit ? want : fit;
    return n < 1 ? 1 : n > MAX_SETS ? MAX_SETS : (int)n;
}

/* A tensor of uniform values in [-1, 1) on the case's device; other dtypes are
 * drawn in float32 and converted. */
static ct_tensor *rnd(bcase *c, int ndim, const int64_t *shape, ct_dtype dt) {
    ct_tensor *t = ct_tensor_empty(ndim, shape, CT_F32, c->d->dev);
    if (!t) return NULL;
    if (ct_uniform_(t, -1.0, 1.0, c->gen) != CT_OK) {
        ct_tensor_release(t);
        return NULL;
    }
    if (dt == CT_F32) return t;
    ct_tensor *u = ct_to_dtype(t, dt);
    ct_tensor_release(t);
    return u;
}

/* int64 class indices in [0, classes) on the case's device. */
static ct_tensor *labels(bcase *c, int64_t n, int64_t classes) {
    ct_tensor *t = ct_tensor_randint(c->gen, 0, classes, 1, &n, CT_I64, c->d->dev);
    if (t || !is_gpu(c->d)) return t;
    /* no random integers on this device: draw them on the CPU */
    ct_tensor *h = ct_tensor_randint(c->gen, 0, classes, 1, &n, CT_I64, CT_CPU);
    t = h ? ct_to_device(h, c->d->dev) : NULL;
    ct_tensor_release(h);
    return t;
}

static ct_status set_error(bcase *c, const char *what) {
    ct_status st = ct_last_status();
    snprintf(c->note, sizeof c->note, "%s: %s", what, ct_last_error());
    return st == CT_OK ? CT_ERR_RUNTIME : st;
}

/* A destination for the copy anchor, bytes long, pages already touched. */
static ct_status copy_dst(bcase *c, size_t bytes) {
    c->copy_bytes = bytes;
    if (is_gpu(c->d)) {
        int64_t n = (int64_t)bytes;
        c->abuf[5] = ct_tensor_empty(1, &n, CT_BOOL, c->d->dev);
        return c->abuf[5] ? CT_OK : set_error(c, "anchor buffer");
    }
    c->host_dst = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!c->host_dst) {
        snprintf(c->note, sizeof c->note, "out of memory for the %zu-byte copy anchor", bytes);
        return CT_ERR_OOM;
    }
    memset(c->host_dst, 1, bytes);
    return CT_OK;
}

static int fail_anchor(bcase *c, const char *msg) {
    snprintf(c->note, sizeof c->note, "anchor %s: %s", c->anchor_name, msg);
    return 1;
}

/* The copy anchor: src (bytes long) into the case's destination. */
static int copy_from(bcase *c, const void *src) {
    if (is_gpu(c->d)) {
        return bg_memcpy(c->d->gpu, ct_tensor_data_ptr(c->abuf[5]), src, c->copy_bytes)
                   ? fail_anchor(c, bg_error(c->d->gpu))
                   : 0;
    }
    bc_par_memcpy(c->host_dst, src, c->copy_bytes, ct_get_num_threads());
    return 0;
}

/* Row-major C[M,N] = A[M,K] B[K,N] through the anchor library. */
static int gemm(bcase *c, ct_dtype dt, bool tf32, const gemm_shape *g, const void *A, const void *B,
                void *C) {
    if (is_gpu(c->d))
        return bg_gemm(c->d->gpu, dt, tf32, g->M, g->N, g->K, A, B, C)
                   ? fail_anchor(c, bg_error(c->d->gpu))
                   : 0;
    if (dt != CT_F32) return fail_anchor(c, "the CPU anchor is float32 only");
    if (g->M > INT_MAX || g->N > INT_MAX || g->K > INT_MAX) return fail_anchor(c, "too large");
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g->M, (int)g->N, (int)g->K, 1.0f, A,
                (int)g->K, B, (int)g->N, 0.0f, C, (int)g->N);
    return 0;
}

/* Buffers for the case's GEMM list: A, B, C big enough for every shape. */
static ct_status gemm_buffers(bcase *c, ct_dtype dt) {
    int64_t a = 1, b = 1, cc = 1;
    for (int i = 0; i < c->ngemms; i++) {
        const gemm_shape *g = &c->gemms[i];
        if (g->M * g->K > a) a = g->M * g->K;
        if (g->K * g->N > b) b = g->K * g->N;
        if (g->M * g->N > cc) cc = g->M * g->N;
    }
    c->abuf[0] = rnd(c, 1, &a, dt);
    c->abuf[1] = rnd(c, 1, &b, dt);
    c->abuf[2] = rnd(c, 1, &cc, dt);
    return c->abuf[0] && c->abuf[1] && c->abuf[2] ? CT_OK : set_error(c, "anchor buffers");
}

static void anchor_label(bcase *c, const char *name) {
    snprintf(c->anchor_name, sizeof c->anchor_name, "%s", name);
}

/* "cblas_sgemm x3": the anchor library and the number of GEMMs in the list. */
static void gemm_anchor_label(bcase *c) {
    const char *lib = is_gpu(c->d) ? "cublasGemmEx" : "cblas_sgemm";
    if (c->ngemms == 1)
        anchor_label(c, lib);
    else
        snprintf(c->anchor_name, sizeof c->anchor_name, "%s x%d", lib, c->ngemms);
}

static double gemm_flop(const bcase *c) {
    double f = 0;
    for (int i = 0; i < c->ngemms; i++)
        f += 2.0 * (double)c->gemms[i].M * (double)c->gemms[i].N * (double)c->gemms[i].K;
    return f;
}

/* Runs the case's GEMM list once. */
static int anchor_gemms(bcase *c) {
    void *A = ct_tensor_data_ptr(c->abuf[0]), *B = ct_tensor_data_ptr(c->abuf[1]);
    void *C = ct_tensor_data_ptr(c->abuf[2]);
    for (int i = 0; i < c->ngemms; i++)
        if (gemm(c, c->dtype, c->tf32, &c->gemms[i], A, B, C)) return 1;
    return 0;
}

static void release_case(bcase *c) {
    for (int s = 0; s < MAX_SETS; s++)
        for (int k = 0; k < 3; k++) ct_tensor_release(c->in[s][k]), c->in[s][k] = NULL;
    for (int k = 0; k < 6; k++) {
        ct_tensor_release(c->aux[k]), c->aux[k] = NULL;
        ct_tensor_release(c->abuf[k]), c->abuf[k] = NULL;
    }
    ct_optim_free(c->optim), c->optim = NULL;
    ct_params_free(c->params), c->params = NULL;
    ct_nn_linear_free(c->fc1), c->fc1 = NULL;
    ct_nn_linear_free(c->fc2), c->fc2 = NULL;
    ct_nn_conv2d_free(c->cv1), c->cv1 = NULL;
    ct_nn_conv2d_free(c->cv2), c->cv2 = NULL;
    ct_generator_free(c->gen), c->gen = NULL;
    free(c->host_dst), c->host_dst = NULL;
}

/* ==== matmul =================================================================================
 * p[0] = n. Square products; float32 on every device, TF32 and bfloat16 on GPUs. */
static ct_status matmul_setup(bcase *c) {
    int64_t n = c->p[0];
    size_t es = ct_dtype_size(c->dtype);
    c->nsets = sets_for(c->d, (size_t)(2 * n * n) * es);
    for (int s = 0; s < c->nsets; s++) {
        c->in[s][0] = s ? ct_clone(c->in[0][0]) : rnd(c, CT_SHAPE(n, n), c->dtype);
        c->in[s][1] = s ? ct_clone(c->in[0][1]) : rnd(c, CT_SHAPE(n, n), c->dtype);
        if (!c->in[s][0] || !c->in[s][1]) return set_error(c, "inputs");
    }
    c->aux[0] = ct_tensor_empty(CT_SHAPE(n, n), c->dtype, c->d->dev);
    return c->aux[0] ? CT_OK : set_error(c, "anchor output");
}

static ct_status matmul_run(bcase *c) {
    int s = next_set(c);
    ct_tensor *y = ct_matmul(c->in[s][0], c->in[s][1]);
    if (!y) return ct_last_status();
    ct_tensor_release(y);
    return CT_OK;
}

static int matmul_anchor(bcase *c) {
    int s = next_set(c);
    gemm_shape g = {c->p[0], c->p[0], c->p[0]};
    return gemm(c, c->dtype, c->tf32, &g, ct_tensor_data_ptr(c->in[s][0]),
                ct_tensor_data_ptr(c->in[s][1]), ct_tensor_data_ptr(c->aux[0]));
}

static const int64_t default_sizes[] = {256, 1024, 2048, 8192};
static const char *const mm_modes[] = {"f32", "tf32", "bf16"};

static bool matmul_describe(bcase *c, int i) {
    int nsizes = opt.nsizes ? opt.nsizes : 4;
    if (i >= nsizes * 3) return false;
    int64_t n = opt.nsizes ? opt.sizes[i / 3] : default_sizes[i / 3];
    int mode = i % 3;
    /* 8192 and the tensor-core modes on GPUs only, unless asked for by size */
    if (!is_gpu(c->d) && (mode != 0 || (!opt.nsizes && n > 2048))) return true;
    c->p[0] = n;
    c->dtype = mode == 2 ? CT_BF16 : CT_F32;
    c->tf32 = mode == 1;
    snprintf(c->variant, sizeof c->variant, "%s", mm_modes[mode]);
    snprintf(c->name, sizeof c->name, "matmul %lld %s", (long long)n, mm_modes[mode]);
    snprintf(c->key, sizeof c->key, "%s", c->name);
    param(c, "n", n);
    c->op = "mm";
    c->need[c->nneed++] = CT_OP_MM;
    c->rate = RATE_FLOP;
    c->work = c->anchor_work = 2.0 * (double)n * (double)n * (double)n;
    c->ceil = mode == 0 ? CEIL_GEMM_F32 : mode == 1 ? CEIL_GEMM_TF32 : CEIL_GEMM_BF16;
    anchor_label(c, is_gpu(c->d) ? "cublasGemmEx" : "cblas_sgemm");
    c->setup = matmul_setup;
    c->run = matmul_run;
    c->anchor = matmul_anchor;
    return true;
}

/* ==== conv2d =================================================================================
 * p = N, C, H, W, Cout, backward; 3x3, stride 1, padding 1, float32. The
 * anchor is the GEMM of the same shape as the convolution lowered to a
 * matrix product (M = N*H*W, N = Cout, K = C*9), and for the backward the
 * two GEMMs of the input and weight gradients. */
typedef struct conv_layer {
    const char *tag;
    int64_t N, C, H, W, Co;
} conv_layer;

static const conv_layer conv_layers[] = {
    {"resnet", 32, 64, 56, 56, 64},
    {"fmnist1", 64, 1, 28, 28, 16},
    {"fmnist2", 64, 16, 14, 14, 32},
};

static ct_status conv_setup(bcase *c) {
    int64_t N = c->p[0], C = c->p[1], H = c->p[2], W = c->p[3], Co = c->p[4];
    bool bwd = c->p[5] != 0;
    size_t set = (size_t)(N * C * H * W + (bwd ? N * Co * H * W : 0)) * sizeof(float);
    c->nsets = sets_for(c->d, set);
    for (int s = 0; s < c->nsets; s++) {
        c->in[s][0] = s ? ct_clone(c->in[0][0]) : rnd(c, CT_SHAPE(N, C, H, W), CT_F32);
        if (bwd) c->in[s][1] = s ? ct_clone(c->in[0][1]) : rnd(c, CT_SHAPE(N, Co, H, W), CT_F32);
        if (!c->in[s][0] || (bwd && !c->in[s][1])) return set_error(c, "inputs");
    }
    c->aux[0] = rnd(c, CT_SHAPE(Co, C, 3, 3), CT_F32);
    c->aux[1] = rnd(c, CT_SHAPE(Co), CT_F32);
    if (!c->aux[0] || !c->aux[1]) return set_error(c, "weights");
    return gemm_buffers(c, CT_F32);
}

static ct_status conv_run(bcase *c) {
    static const int64_t one[2] = {1, 1}, pad[2] = {1, 1};
    int s = next_set(c);
    ct_tensor *x = c->in[s][0], *w = c->aux[0];
    ct_scope *sc = ct_scope_begin();
    ct_status st = CT_OK;
    if (!ct_conv2d(x, w, c->aux[1], one, pad, one, 1)) {
        st = ct_last_status();
    } else if (c->p[5]) {
        int64_t xs[4] = {c->p[0], c->p[1], c->p[2], c->p[3]}, ws[4] = {c->p[4], c->p[1], 3, 3};
        ct_tensor *g = c->in[s][1];
        if (!ct_conv2d_backward_input(g, w, xs, one, pad, one, 1) ||
            !ct_conv2d_backward_weight(g, x, ws, one, pad, one, 1) || !ct_conv2d_backward_bias(g))
            st = ct_last_status();
    }
    ct_scope_end(sc);
    return st;
}

static bool conv_describe(bcase *c, int i) {
    int nl = (int)(sizeof conv_layers / sizeof conv_layers[0]);
    if (i >= nl * 2) return false;
    const conv_layer *L = &conv_layers[i / 2];
    bool bwd = i % 2;
    int64_t v[6] = {L->N, L->C, L->H, L->W, L->Co, bwd};
    memcpy(c->p, v, sizeof v);
    c->dtype = CT_F32;
    snprintf(c->variant, sizeof c->variant, "%s", bwd ? "fwd+bwd" : "fwd");
    snprintf(c->name, sizeof c->name, "conv2d %s %lldx%lldx%lldx%lld->%lld %s", L->tag,
             (long long)L->N, (long long)L->C, (long long)L->H, (long long)L->W, (long long)L->Co,
             c->variant);
    snprintf(c->key, sizeof c->key, "%s", c->name);
    param(c, "N", L->N), param(c, "C", L->C), param(c, "H", L->H), param(c, "W", L->W);
    param(c, "Cout", L->Co), param(c, "k", 3);
    c->op = "conv2d";
    c->need[c->nneed++] = CT_OP_CONV2D;
    if (bwd) {
        c->need[c->nneed++] = CT_OP_CONV2D_BACKWARD_INPUT;
        c->need[c->nneed++] = CT_OP_CONV2D_BACKWARD_WEIGHT;
        c->need[c->nneed++] = CT_OP_CONV2D_BACKWARD_BIAS;
    }
    int64_t M = L->N * L->H * L->W, K = L->C * 9;
    c->gemms[c->ngemms++] = (gemm_shape){M, L->Co, K};
    if (bwd) {
        c->gemms[c->ngemms++] = (gemm_shape){M, K, L->Co}; /* dX columns = dY W */
        c->gemms[c->ngemms++] = (gemm_shape){L->Co, K, M}; /* dW = dY^T X columns */
    }
    c->rate = RATE_FLOP;
    c->work = c->anchor_work = gemm_flop(c);
    c->ceil = CEIL_GEMM_F32;
    gemm_anchor_label(c);
    c->setup = conv_setup;
    c->run = conv_run;
    c->anchor = anchor_gemms;
    return true;
}

/* ==== bandwidth-bound ops: rms_norm, add, softmax, cross_entropy =============================
 * The anchor copies one input tensor (read + write); rates are bytes moved
 * per second, counting each tensor read or written once. */
static int copy_anchor(bcase *c) {
    int s = next_set(c);
    return copy_from(c, ct_tensor_data_ptr(c->in[s][0]));
}

/* rows x cols for the row-wise ops: 4096 x 4096 on the CPU, 16384 x 4096 on GPUs. */
static int64_t rows_for(const devctx *d) { return is_gpu(d) ? 16384 : 4096; }

/* p = rows, cols, backward */
static ct_status rms_setup(bcase *c) {
    int64_t R = c->p[0], D = c->p[1];
    bool bwd = c->p[2] != 0;
    size_t es = ct_dtype_size(c->dtype);
    c->nsets = sets_for(c->d, (size_t)(R * D) * es * (bwd ? 2 : 1));
    for (int s = 0; s < c->nsets; s++) {
        c->in[s][0] = s ? ct_clone(c->in[0][0]) : rnd(c, CT_SHAPE(R, D), c->dtype);
        if (bwd) c->in[s][1] = s ? ct_clone(c->in[0][1]) : rnd(c, CT_SHAPE(R, D), c->dtype);
        if (!c->in[s][0] || (bwd && !c->in[s][1])) return set_error(c, "inputs");
    }
    c->aux[0] = rnd(c, CT_SHAPE(D), c->dtype);
    if (!c->aux[0]) return set_error(c, "weight");
    return copy_dst(c, (size_t)(R * D) * es);
}

static ct_status rms_run(bcase *c) {
    int s = next_set(c);
    int64_t D = c->p[1];
    ct_tensor *inv = NULL, *dx = NULL, *dw = NULL;
    bool bwd = c->p[2] != 0;
    ct_tensor *y = ct_rms_norm(c->in[s][0], 1, &D, c->aux[0], 1e-6, bwd ? &inv : NULL);
    ct_status st = y ? CT_OK : ct_last_status();
    if (st == CT_OK && bwd)
        st = ct_rms_norm_backward(c->in[s][1], c->in[s][0], c->aux[0], inv, &dx, &dw);
    ct_tensor_release(y), ct_tensor_release(inv), ct_tensor_release(dx), ct_tensor_release(dw);
    return st;
}

static bool rms_describe(bcase *c, int i) {
    if (i >= 4) return false;
    c->dtype = i / 2 ? CT_BF16 : CT_F32;
    bool bwd = i % 2;
    int64_t R = rows_for(c->d), D = 4096;
    c->p[0] = R, c->p[1] = D, c->p[2] = bwd;
    const char *dt = c->dtype == CT_BF16 ? "bf16" : "f32";
    snprintf(c->variant, sizeof c->variant, "%s", bwd ? "fwd+bwd" : "fwd");
    snprintf(c->name, sizeof c->name, "rms_norm %lldx%lld %s %s", (long long)R, (long long)D, dt,
             c->variant);
    snprintf(c->key, sizeof c->key, "rms_norm %s %s", dt, c->variant);
    param(c, "rows", R), param(c, "cols", D);
    c->op = "rms_norm";
    c->need[c->nneed++] = CT_OP_RMS_NORM;
    if (bwd) c->need[c->nneed++] = CT_OP_RMS_NORM_BACKWARD;
    double tensor = (double)(R * D) * (double)ct_dtype_size(c->dtype);
    c->rate = RATE_BYTES;
    /* forward: x read, y written; backward: dy and x read, dx written */
    c->work = (bwd ? 5 : 2) * tensor;
    c->anchor_work = 2 * tensor;
    c->ceil = CEIL_COPY;
    anchor_label(c, is_gpu(c->d) ? "cudaMemcpy D2D" : "memcpy");
    c->setup = rms_setup;
    c->run = rms_run;
    c->anchor = copy_anchor;
    return true;
}

/* p[0] = elements */
static ct_status add_setup(bcase *c) {
    int64_t n = c->p[0];
    c->nsets = sets_for(c->d, (size_t)n * 2 * sizeof(float));
    for (int s = 0; s < c->nsets; s++) {
        c->in[s][0] = s ? ct_clone(c->in[0][0]) : rnd(c, 1, &n, CT_F32);
        c->in[s][1] = s ? ct_clone(c->in[0][1]) : rnd(c, 1, &n, CT_F32);
        if (!c->in[s][0] || !c->in[s][1]) return set_error(c, "inputs");
    }
    return copy_dst(c, (size_t)n * sizeof(float));
}

static ct_status add_run(bcase *c) {
    int s = next_set(c);
    ct_tensor *y = ct_add(c->in[s][0], c->in[s][1]);
    if (!y) return ct_last_status();
    ct_tensor_release(y);
    return CT_OK;
}

static bool add_describe(bcase *c, int i) {
    if (i >= 1) return false;
    int64_t n = is_gpu(c->d) ? (int64_t)256 << 20 : (int64_t)16 << 20;
    c->p[0] = n;
    c->dtype = CT_F32;
    snprintf(c->variant, sizeof c->variant, "f32");
    snprintf(c->name, sizeof c->name, "add %lldM f32", (long long)(n >> 20));
    snprintf(c->key, sizeof c->key, "add f32");
    param(c, "numel", n);
    c->op = "add";
    c->need[c->nneed++] = CT_OP_ADD;
    c->rate = RATE_BYTES;
    c->work = 3.0 * (double)n * 4; /* two reads, one write */
    c->anchor_work = 2.0 * (double)n * 4;
    c->ceil = CEIL_COPY;
    anchor_label(c, is_gpu(c->d) ? "cudaMemcpy D2D" : "memcpy");
    c->setup = add_setup;
    c->run = add_run;
    c->anchor = copy_anchor;
    return true;
}

/* p = rows, classes; softmax forward, or cross-entropy forward + backward */
static ct_status rowwise_setup(bcase *c) {
    int64_t N = c->p[0], C = c->p[1];
    c->nsets = sets_for(c->d, (size_t)(N * C) * sizeof(float));
    for (int s = 0; s < c->nsets; s++) {
        c->in[s][0] = s ? ct_clone(c->in[0][0]) : rnd(c, CT_SHAPE(N, C), CT_F32);
        if (!c->in[s][0]) return set_error(c, "inputs");
        if (!strcmp(c->family, "cross_entropy") &&
            !(c->in[s][1] = s ? ct_clone(c->in[0][1]) : labels(c, N, C)))
            return set_error(c, "targets");
    }
    if (!strcmp(c->family, "cross_entropy")) {
        /* leaves for autograd, once every clone is made */
        for (int s = 0; s < c->nsets; s++)
            if (ct_requires_grad_(c->in[s][0], true) != CT_OK) return set_error(c, "inputs");
        c->aux[0] = ct_tensor_scalar(1.0, CT_F32, c->d->dev);
        if (!c->aux[0]) return set_error(c, "grad_loss");
    }
    return copy_dst(c, (size_t)(N * C) * sizeof(float));
}

static ct_status softmax_run(bcase *c) {
    int s = next_set(c);
    ct_tensor *y = ct_softmax(c->in[s][0], -1);
    if (!y) return ct_last_status();
    ct_tensor_release(y);
    return CT_OK;
}

/* As a training step runs it: the loss through autograd, whose backward
 * reads the forward's per-row log-sum-exp, and the gradient dropped again. */
static ct_status xent_run(bcase *c) {
    int s = next_set(c);
    ct_tensor *x = c->in[s][0], *t = c->in[s][1];
    ct_tensor *loss = ct_cross_entropy(x, t, NULL, CT_REDUCTION_MEAN, -100, 0.0);
    ct_status st = loss ? ct_backward(loss, c->aux[0], false) : CT_ERR_RUNTIME;
    if (st != CT_OK) st = set_error(c, loss ? "backward" : "forward");
    else if (!ct_grad(x)) st = set_error(c, "no gradient");
    ct_zero_grad(x);
    ct_tensor_release(loss);
    return st;
}

static bool rowwise_describe(bcase *c, int i, bool xent) {
    if (i >= 1) return false;
    int64_t N = rows_for(c->d), C = 4096;
    c->p[0] = N, c->p[1] = C;
    c->dtype = CT_F32;
    snprintf(c->variant, sizeof c->variant, "%s", xent ? "fwd+bwd" : "fwd");
    snprintf(c->name, sizeof c->name, "%s %lldx%lld f32 %s", c->family, (long long)N, (long long)C,
             c->variant);
    snprintf(c->key, sizeof c->key, "%s f32 %s", c->family, c->variant);
    param(c, "rows", N), param(c, "cols", C);
    c->op = c->family;
    if (xent) {
        c->need[c->nneed++] = CT_OP_CROSS_ENTROPY;
        c->need[c->nneed++] = CT_OP_CROSS_ENTROPY_BACKWARD;
    } else {
        c->need[c->nneed++] = CT_OP_SOFTMAX;
    }
    double tensor = (double)(N * C) * 4;
    c->rate = RATE_BYTES;
    /* softmax: x read, y written; cross-entropy: logits read by the forward,
     * read again and the gradient written by the backward */
    c->work = (xent ? 3 : 2) * tensor;
    c->anchor_work = 2 * tensor;
    c->ceil = CEIL_COPY;
    anchor_label(c, is_gpu(c->d) ? "cudaMemcpy D2D" : "memcpy");
    c->setup = rowwise_setup;
    c->run = xent ? xent_run : softmax_run;
    c->anchor = copy_anchor;
    return true;
}

static bool softmax_describe(bcase *c, int i) { return rowwise_describe(c, i, false); }
static bool xent_describe(bcase *c, int i) { return rowwise_describe(c, i, true); }

/* ==== unary elementwise ops, forward and forward + backward =================================
 * p = elements, op index, backward. The forward reads x and writes y; with
 * the backward (through autograd, x requiring grad, the gradient dropped
 * after each call so none accumulates) a fused kernel would read x (or y)
 * and dy and write dx: 5 tensors in all, what the rate counts. The anchor
 * copies one tensor. */
typedef struct unary_op {
    const char *name;
    ct_op id;
    bool bwd; /* also run a forward + backward case */
    double shift; /* added to the inputs, for the op's domain: log's (0, 2) */
} unary_op;

static const unary_op unary_ops[] = {
    {"exp", CT_OP_EXP, false, 0},   {"log", CT_OP_LOG, false, 1},
    {"sin", CT_OP_SIN, false, 0},   {"cos", CT_OP_COS, false, 0},
    {"tanh", CT_OP_TANH, true, 0},
    {"sigmoid", CT_OP_SIGMOID, true, 0}, {"silu", CT_OP_SILU, true, 0},
    {"softplus", CT_OP_SOFTPLUS, false, 0}, {"gelu", CT_OP_GELU, true, 0},
    {"gelu_tanh", CT_OP_GELU_TANH, true, 0},
    /* issue 20's elementwise ops (bench/torch_ref.py has the same rows) */
    {"log1p", CT_OP_LOG1P, false, 0}, {"expm1", CT_OP_EXPM1, false, 0},
    {"log2", CT_OP_LOG2, false, 1}, {"exp2", CT_OP_EXP2, false, 0},
    {"erf", CT_OP_ERF, false, 0}, {"erfc", CT_OP_ERFC, false, 0},
    {"erfinv", CT_OP_ERFINV, false, 0}, {"tan", CT_OP_TAN, false, 0},
    {"asin", CT_OP_ASIN, false, 0}, {"atan", CT_OP_ATAN, false, 0},
    {"sinh", CT_OP_SINH, false, 0}, {"asinh", CT_OP_ASINH, false, 0},
    {"atanh", CT_OP_ATANH, false, 0}, {"floor", CT_OP_FLOOR, false, 0},
    {"round", CT_OP_ROUND, false, 0}, {"leaky_relu", CT_OP_LEAKY_RELU, false, 0},
    {"elu", CT_OP_ELU, false, 0}, {"mish", CT_OP_MISH, false, 0},
    {"hardswish", CT_OP_HARDSWISH, false, 0}, {"logsigmoid", CT_OP_LOGSIGMOID, false, 0},
};
#define N_UNARY ((int)(sizeof unary_ops / sizeof unary_ops[0]))

static ct_tensor *unary_call(int k, ct_tensor *x) {
    switch (unary_ops[k].id) {
    case CT_OP_EXP: return ct_exp(x);
    case CT_OP_LOG: return ct_log(x);
    case CT_OP_SIN: return ct_sin(x);
    case CT_OP_COS: return ct_cos(x);
    case CT_OP_TANH: return ct_tanh(x);
    case CT_OP_SIGMOID: return ct_sigmoid(x);
    case CT_OP_SILU: return ct_silu(x);
    case CT_OP_SOFTPLUS: return ct_softplus(x, 1.0, 20.0);
    case CT_OP_GELU: return ct_gelu(x, CT_GELU_NONE);
    case CT_OP_LOG1P: return ct_log1p(x);
    case CT_OP_EXPM1: return ct_expm1(x);
    case CT_OP_LOG2: return ct_log2(x);
    case CT_OP_EXP2: return ct_exp2(x);
    case CT_OP_ERF: return ct_erf(x);
    case CT_OP_ERFC: return ct_erfc(x);
    case CT_OP_ERFINV: return ct_erfinv(x);
    case CT_OP_TAN: return ct_tan(x);
    case CT_OP_ASIN: return ct_asin(x);
    case CT_OP_ATAN: return ct_atan(x);
    case CT_OP_SINH: return ct_sinh(x);
    case CT_OP_ASINH: return ct_asinh(x);
    case CT_OP_ATANH: return ct_atanh(x);
    case CT_OP_FLOOR: return ct_floor(x);
    case CT_OP_ROUND: return ct_round(x);
    case CT_OP_LEAKY_RELU: return ct_leaky_relu(x, 0.01);
    case CT_OP_ELU: return ct_elu(x, 1.0);
    case CT_OP_MISH: return ct_mish(x);
    case CT_OP_HARDSWISH: return ct_hardswish(x);
    case CT_OP_LOGSIGMOID: return ct_logsigmoid(x);
    default: return ct_gelu(x, CT_GELU_TANH);
    }
}

static ct_status unary_setup(bcase *c) {
    int64_t n = c->p[0];
    bool bwd = c->p[2] != 0;
    c->nsets = sets_for(c->d, (size_t)n * sizeof(float) * (bwd ? 2 : 1));
    for (int s = 0; s < c->nsets; s++) {
        /* the op's domain: log's (0, 2) instead of [-1, 1) */
        ct_tensor *x = s ? ct_clone(c->in[0][0]) : rnd(c, 1, &n, CT_F32);
        if (x && !s && unary_ops[c->p[1]].shift != 0) {
            ct_tensor *y = ct_add_scalar(x, unary_ops[c->p[1]].shift);
            ct_tensor_release(x);
            x = y;
        }
        if (!x) return set_error(c, "inputs");
        c->in[s][0] = x;
        if (bwd) {
            if (ct_requires_grad_(x, true) != CT_OK) return set_error(c, "requires_grad");
            if (!(c->in[s][1] = s ? ct_clone(c->in[0][1]) : rnd(c, 1, &n, CT_F32)))
                return set_error(c, "grad");
        }
    }
    return copy_dst(c, (size_t)n * sizeof(float));
}

static ct_status unary_run(bcase *c) {
    int s = next_set(c);
    ct_tensor *x = c->in[s][0];
    ct_tensor *y = unary_call((int)c->p[1], x);
    if (!y) return ct_last_status();
    ct_status st = CT_OK;
    if (c->p[2]) {
        st = ct_backward(y, c->in[s][1], false);
        ct_zero_grad(x);
    }
    ct_tensor_release(y);
    return st;
}

static bool unary_describe(bcase *c, int i) {
    /* the forward cases, then the forward + backward ones */
    int k = i, bwd = 0;
    if (k >= N_UNARY) {
        bwd = 1;
        int j = k - N_UNARY;
        for (k = 0; k < N_UNARY; k++)
            if (unary_ops[k].bwd && j-- == 0) break;
    }
    if (k >= N_UNARY) return false;
    int64_t n = (int64_t)16 << 20;
    c->p[0] = n, c->p[1] = k, c->p[2] = bwd;
    c->dtype = CT_F32;
    snprintf(c->variant, sizeof c->variant, "%s", bwd ? "fwd+bwd" : "fwd");
    snprintf(c->name, sizeof c->name, "%s 16M f32 %s", unary_ops[k].name, c->variant);
    snprintf(c->key, sizeof c->key, "%s f32 %s", unary_ops[k].name, c->variant);
    param(c, "numel", n);
    c->op = unary_ops[k].name;
    c->need[c->nneed++] = unary_ops[k].id;
    c->rate = RATE_BYTES;
    c->work = (bwd ? 5.0 : 2.0) * (double)n * 4;
    c->anchor_work = 2.0 * (double)n * 4;
    c->ceil = CEIL_COPY;
    anchor_label(c, is_gpu(c->d) ? "cudaMemcpy D2D" : "memcpy");
    c->setup = unary_setup;
    c->run = unary_run;
    c->anchor = copy_anchor;
    return true;
}

/* ==== per-op overhead: add of two 1-element float32 tensors ===================================
 * On GPUs the anchor is the smallest thing a stream runs, a 4-byte
 * cudaMemsetAsync; the CPU has no anchor for it. */
static ct_status overhead_setup(bcase *c) {
    c->nsets = 1;
    c->in[0][0] = ct_tensor_full(CT_SHAPE(1), 1.5, CT_F32, c->d->dev);
    c->in[0][1] = ct_tensor_full(CT_SHAPE(1), 2.25, CT_F32, c->d->dev);
    c->aux[0] = ct_tensor_empty(CT_SHAPE(1), CT_F32, c->d->dev);
    return c->in[0][0] && c->in[0][1] && c->aux[0] ? CT_OK : set_error(c, "inputs");
}

static int overhead_anchor(bcase *c) {
    return bg_memset(c->d->gpu, ct_tensor_data_ptr(c->aux[0]), 4)
               ? fail_anchor(c, bg_error(c->d->gpu))
               : 0;
}

static bool overhead_describe(bcase *c, int i) {
    if (i >= 1) return false;
    c->dtype = CT_F32;
    snprintf(c->variant, sizeof c->variant, "f32");
    snprintf(c->name, sizeof c->name, "overhead add 1-element f32");
    snprintf(c->key, sizeof c->key, "%s", c->name);
    param(c, "numel", 1);
    c->op = "add";
    c->need[c->nneed++] = CT_OP_ADD;
    c->rate = RATE_CALLS;
    c->work = c->anchor_work = 1;
    c->ceil = CEIL_NONE;
    c->setup = overhead_setup;
    c->run = add_run;
    if (is_gpu(c->d)) {
        anchor_label(c, "cudaMemsetAsync 4 B");
        c->anchor = overhead_anchor;
    }
    return true;
}

/* ==== a training step on Fashion-MNIST-shaped data ===========================================
 * p = model (0 MLP 784-256-10, 1 CNN), batch. AdamW (lr 1e-3, weight decay
 * 1e-2), cross-entropy, zero_grad + backward + step, temporaries in a scope.
 * The anchor is the GEMMs the step's layers lower to (forward, input and
 * weight gradients; none for the input image); its flop are the step's. */
static ct_status train_setup(bcase *c) {
    int64_t B = c->p[1];
    c->nsets = sets_for(c->d, (size_t)B * (28 * 28 * 4 + 8));
    for (int s = 0; s < c->nsets; s++) {
        c->in[s][0] = s ? ct_clone(c->in[0][0]) : rnd(c, CT_SHAPE(B, 1, 28, 28), CT_F32);
        c->in[s][1] = s ? ct_clone(c->in[0][1]) : labels(c, B, 10);
        if (!c->in[s][0] || !c->in[s][1]) return set_error(c, "inputs");
    }
    const int64_t k3[2] = {3, 3}, pad1[2] = {1, 1};
    ct_device dev = c->d->dev;
    c->params = ct_params_new();
    if (!c->params) return set_error(c, "parameters");
    if (c->p[0] == 0) {
        c->fc1 = ct_nn_linear_new(784, 256, true, CT_F32, dev, c->gen);
        c->fc2 = c->fc1 ? ct_nn_linear_new(256, 10, true, CT_F32, dev, c->gen) : NULL;
        if (!c->fc2 || ct_nn_linear_params(c->fc1, "fc1", c->params) != CT_OK ||
            ct_nn_linear_params(c->fc2, "fc2", c->params) != CT_OK)
            return set_error(c, "model");
    } else {
        c->cv1 = ct_nn_conv2d_new(1, 16, k3, NULL, pad1, NULL, 1, true, CT_F32, dev, c->gen);
        c->cv2 = c->cv1
                     ? ct_nn_conv2d_new(16, 32, k3, NULL, pad1, NULL, 1, true, CT_F32, dev, c->gen)
                     : NULL;
        c->fc1 = c->cv2 ? ct_nn_linear_new(32 * 7 * 7, 10, true, CT_F32, dev, c->gen) : NULL;
        if (!c->fc1 || ct_nn_conv2d_params(c->cv1, "conv1", c->params) != CT_OK ||
            ct_nn_conv2d_params(c->cv2, "conv2", c->params) != CT_OK ||
            ct_nn_linear_params(c->fc1, "fc", c->params) != CT_OK)
            return set_error(c, "model");
    }
    c->optim = ct_optim_adamw_new(c->params, 1e-3, 0.9, 0.999, 1e-8, 1e-2);
    if (!c->optim) return set_error(c, "optimizer");
    return gemm_buffers(c, CT_F32);
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        if (!(expr)) {                                                                             \
            st = ct_last_status();                                                                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static ct_status train_run(bcase *c) {
    static const int64_t k2[2] = {2, 2};
    int s = next_set(c);
    ct_status st = CT_OK;
    ct_tensor *h, *logits, *loss;
    ct_scope *sc = ct_scope_begin();
    if (c->p[0] == 0) {
        TRY(h = ct_flatten(c->in[s][0], 1, -1));
        TRY(h = ct_nn_linear_forward(c->fc1, h));
        TRY(h = ct_relu(h));
        TRY(logits = ct_nn_linear_forward(c->fc2, h));
    } else {
        TRY(h = ct_nn_conv2d_forward(c->cv1, c->in[s][0]));
        TRY(h = ct_relu(h));
        TRY(h = ct_max_pool2d(h, k2, NULL, NULL, NULL, false, NULL));
        TRY(h = ct_nn_conv2d_forward(c->cv2, h));
        TRY(h = ct_relu(h));
        TRY(h = ct_max_pool2d(h, k2, NULL, NULL, NULL, false, NULL));
        TRY(h = ct_flatten(h, 1, -1));
        TRY(logits = ct_nn_linear_forward(c->fc1, h));
    }
    TRY(loss = ct_cross_entropy(logits, c->in[s][1], NULL, CT_REDUCTION_MEAN, -100, 0.0));
    ct_optim_zero_grad(c->optim);
    if ((st = ct_backward(loss, NULL, false)) == CT_OK) st = ct_optim_step(c->optim);
out:
    ct_scope_end(sc);
    return st;
}

static bool train_describe(bcase *c, int i) {
    static const int64_t default_batches[] = {64, 1024};
    int nb = opt.nbatches ? opt.nbatches : 2;
    if (i >= 2 * nb) return false;
    int model = i / nb;
    int64_t B = opt.nbatches ? opt.batches[i % nb] : default_batches[i % nb];
    c->p[0] = model, c->p[1] = B;
    c->dtype = CT_F32;
    snprintf(c->variant, sizeof c->variant, "%s", model ? "cnn" : "mlp");
    snprintf(c->name, sizeof c->name, "train %s b%lld", c->variant, (long long)B);
    snprintf(c->key, sizeof c->key, "%s", c->name);
    param(c, "batch", B);
    c->op = model ? "conv2d" : "addmm";
    if (model == 0) {
        c->gemms[c->ngemms++] = (gemm_shape){B, 256, 784}; /* fc1 */
        c->gemms[c->ngemms++] = (gemm_shape){B, 10, 256};  /* fc2 */
        c->gemms[c->ngemms++] = (gemm_shape){B, 256, 10};  /* fc2 dX */
        c->gemms[c->ngemms++] = (gemm_shape){10, 256, B};  /* fc2 dW */
        c->gemms[c->ngemms++] = (gemm_shape){256, 784, B}; /* fc1 dW */
    } else {
        int64_t m1 = B * 28 * 28, m2 = B * 14 * 14;
        c->gemms[c->ngemms++] = (gemm_shape){m1, 16, 9};   /* conv1 */
        c->gemms[c->ngemms++] = (gemm_shape){16, 9, m1};   /* conv1 dW */
        c->gemms[c->ngemms++] = (gemm_shape){m2, 32, 144}; /* conv2 */
        c->gemms[c->ngemms++] = (gemm_shape){m2, 144, 32}; /* conv2 dX */
        c->gemms[c->ngemms++] = (gemm_shape){32, 144, m2}; /* conv2 dW */
        c->gemms[c->ngemms++] = (gemm_shape){B, 10, 1568}; /* fc */
        c->gemms[c->ngemms++] = (gemm_shape){B, 1568, 10}; /* fc dX */
        c->gemms[c->ngemms++] = (gemm_shape){10, 1568, B}; /* fc dW */
    }
    c->rate = RATE_FLOP;
    c->work = c->anchor_work = gemm_flop(c);
    c->ceil = CEIL_GEMM_F32;
    gemm_anchor_label(c);
    c->setup = train_setup;
    c->run = train_run;
    c->anchor = anchor_gemms;
    return true;
}

/* ==== sort, topk, cumsum, logsumexp (rows of the last dim) ===================================
 * p = rows, cols, which (0 sort, 1 topk of 50, 2 cumsum, 3 logsumexp). Rates
 * are bytes moved, each tensor read or written once (sort: x read, values
 * and int64 indices written); the anchor copies the input. */
enum { SQ_SORT, SQ_TOPK, SQ_CUMSUM, SQ_LSE, SQ_COUNT };
static const char *const sq_names[SQ_COUNT] = {"sort", "topk", "cumsum", "logsumexp"};
#define SQ_TOPK_K 50

static ct_status seqred_setup(bcase *c) {
    int64_t R = c->p[0], C = c->p[1];
    c->nsets = sets_for(c->d, (size_t)(R * C) * sizeof(float));
    for (int s = 0; s < c->nsets; s++) {
        c->in[s][0] = s ? ct_clone(c->in[0][0]) : rnd(c, CT_SHAPE(R, C), CT_F32);
        if (!c->in[s][0]) return set_error(c, "inputs");
    }
    return copy_dst(c, (size_t)(R * C) * sizeof(float));
}

static ct_status seqred_run(bcase *c) {
    int s = next_set(c);
    ct_tensor *x = c->in[s][0], *idx = NULL, *y = NULL;
    switch (c->p[2]) {
    case SQ_SORT: y = ct_sort(x, -1, false, false, &idx); break;
    case SQ_TOPK: y = ct_topk(x, SQ_TOPK_K, -1, true, true, &idx); break;
    case SQ_CUMSUM: y = ct_cumsum(x, -1); break;
    default: y = ct_logsumexp(x, 1, (const int64_t[]){-1}, false); break;
    }
    if (!y) return ct_last_status();
    ct_tensor_release(y);
    ct_tensor_release(idx);
    return CT_OK;
}

static bool seqred_describe(bcase *c, int i) {
    if (i >= SQ_COUNT) return false;
    bool gpu = is_gpu(c->d);
    /* sort and topk: many rows of a vocabulary-like width; scans: rows_for x 4096 */
    int64_t R = i <= SQ_TOPK ? (gpu ? 4096 : 1024) : rows_for(c->d);
    int64_t C = i == SQ_SORT ? 1024 : 4096;
    c->p[0] = R, c->p[1] = C, c->p[2] = i;
    c->dtype = CT_F32;
    snprintf(c->variant, sizeof c->variant, "%s", sq_names[i]);
    snprintf(c->name, sizeof c->name, "%s %lldx%lld f32", sq_names[i], (long long)R, (long long)C);
    snprintf(c->key, sizeof c->key, "%s f32", sq_names[i]);
    param(c, "rows", R), param(c, "cols", C);
    c->op = sq_names[i];
    static const ct_op needs[SQ_COUNT] = {CT_OP_SORT, CT_OP_TOPK, CT_OP_CUMSUM, CT_OP_SUM};
    c->need[c->nneed++] = needs[i];
    double in = (double)(R * C) * 4;
    double out = i == SQ_SORT ? (double)(R * C) * 12
                 : i == SQ_TOPK ? (double)(R * SQ_TOPK_K) * 12
                 : i == SQ_CUMSUM ? in : (double)R * 4;
    c->rate = RATE_BYTES;
    c->work = in + out;
    c->anchor_work = 2 * in;
    c->ceil = CEIL_COPY;
    anchor_label(c, gpu ? "cudaMemcpy D2D" : "memcpy");
    c->setup = seqred_setup;
    c->run = seqred_run;
    return true;
}

/* p[0] = rows, p[1] = cols, p[2] = which (0 flip, 1 roll, 2 repeat, 3 pad): the
 * indexing and shape ops that are pure copies, against the copy. */
static ct_status shape_setup(bcase *c) {
    int64_t shape[2] = {c->p[0], c->p[1]};
    c->nsets = sets_for(c->d, (size_t)(shape[0] * shape[1]) * 3 * sizeof(float));
    for (int s = 0; s < c->nsets; s++) {
        c->in[s][0] = s ? ct_clone(c->in[0][0]) : rnd(c, 2, shape, CT_F32);
        if (!c->in[s][0]) return set_error(c, "inputs");
    }
    return copy_dst(c, (size_t)(shape[0] * shape[1]) * sizeof(float));
}

static ct_status shape_run(bcase *c) {
    int s = next_set(c);
    ct_tensor *x = c->in[s][0], *y = NULL;
    int64_t d1 = 1, shifts[2] = {3, 1000}, dims[2] = {0, 1}, reps[2] = {1, 2}, pad[4] = {1, 1, 1, 1};
    switch (c->p[2]) {
    case 0: y = ct_flip(x, 1, &d1); break;
    case 1: y = ct_roll(x, 2, shifts, 2, dims); break;
    case 2: y = ct_repeat(x, 2, reps); break;
    default: y = ct_pad(x, 4, pad, CT_PAD_CONSTANT, 0); break;
    }
    if (!y) return ct_last_status();
    ct_tensor_release(y);
    return CT_OK;
}

static bool shape_describe(bcase *c, int i) {
    static const char *names[4] = {"flip", "roll", "repeat", "pad"};
    static const ct_op ops[4] = {CT_OP_FLIP, CT_OP_ROLL, CT_OP_REPEAT, CT_OP_PAD};
    if (i >= 4) return false;
    int64_t n = is_gpu(c->d) ? (int64_t)256 << 20 : (int64_t)16 << 20, cols = 4096;
    c->p[0] = n / cols, c->p[1] = cols, c->p[2] = i;
    c->dtype = CT_F32;
    snprintf(c->variant, sizeof c->variant, "%s", names[i]);
    snprintf(c->name, sizeof c->name, "%s %lldx%lld f32", names[i], (long long)c->p[0],
             (long long)cols);
    snprintf(c->key, sizeof c->key, "%s f32", names[i]);
    param(c, "rows", c->p[0]), param(c, "cols", cols);
    c->op = names[i];
    c->need[c->nneed++] = ops[i];
    c->rate = RATE_BYTES;
    /* one read and one write of each output element (repeat writes twice what it reads) */
    c->work = (i == 2 ? 3.0 : 2.0) * (double)n * 4;
    c->anchor_work = 2.0 * (double)n * 4;
    c->ceil = CEIL_COPY;
    anchor_label(c, is_gpu(c->d) ? "cudaMemcpy D2D" : "memcpy");
    c->setup = shape_setup;
    c->run = shape_run;
    c->anchor = copy_anchor;
    return true;
}

/* ==== the families, in the order they run ===================================================== */
typedef struct family {
    const char *name;
    bool (*describe)(bcase *c, int i);
    const char *what;
} family;

static const family families[] = {
    {"matmul", matmul_describe, "square matmul, f32 (and TF32, bf16 on GPUs)"},
    {"conv2d", conv_describe, "3x3 conv: ResNet 64->64 56x56 N=32, Fashion-MNIST layers N=64"},
    {"rms_norm", rms_describe, "RMSNorm over 4096 columns, f32 and bf16, fwd and fwd+bwd"},
    {"add", add_describe, "elementwise add, f32 (bandwidth)"},
    {"unary", unary_describe, "unary ops (exp, tanh, gelu, ...), f32, fwd and fwd+bwd"},
    {"softmax", softmax_describe, "row softmax, f32"},
    {"cross_entropy", xent_describe, "cross-entropy forward + backward, f32"},
    {"overhead", overhead_describe, "per-op overhead: add of 1-element tensors"},
    {"train", train_describe, "Fashion-MNIST training step: MLP and CNN, AdamW"},
    {"sort", seqred_describe, "sort, topk (k 50), cumsum, logsumexp along rows, f32"},
    {"shape", shape_describe, "flip, roll, repeat, constant pad: pure copies, f32 (bandwidth)"},
};
#define NFAMILIES ((int)(sizeof families / sizeof families[0]))

/* ---- timing ---------------------------------------------------------------------------------- */
static int timer_start(devctx *d) {
    if (d->gpu) return bg_timer_start(d->gpu);
    d->t0 = bc_now_s();
    return 0;
}

static int timer_stop(devctx *d, double *s) {
    if (d->gpu) return bg_timer_stop(d->gpu, s);
    *s = bc_now_s() - d->t0;
    return 0;
}

/* Seconds per call of inner back-to-back calls of the library (or the anchor). */
static int sample(bcase *c, bool anchor, int inner, double *per_call) {
    if (timer_start(c->d)) {
        snprintf(c->note, sizeof c->note, "timing: %s", bg_error(c->d->gpu));
        return 1;
    }
    for (int i = 0; i < inner; i++) {
        if (anchor) {
            if (c->anchor(c)) return 1;
        } else {
            ct_status st = c->run(c);
            if (st != CT_OK) {
                snprintf(c->note, sizeof c->note, "%s: %s", ct_status_name(st), ct_last_error());
                return 1;
            }
        }
    }
    double t;
    if (timer_stop(c->d, &t)) {
        snprintf(c->note, sizeof c->note, "timing: %s", bg_error(c->d->gpu));
        return 1;
    }
    *per_call = t / inner;
    return 0;
}

static ct_status run_once(void *ctx) { return ((bcase *)ctx)->run(ctx); }

static void mark(bcase *c, const char *status) {
    snprintf(c->status, sizeof c->status, "%s", status);
}

/* Runs a described case on its device; fills status, note, times and trace. */
static void run_case(bcase *c) {
    mark(c, "error");
    /* Unsupported up front when a needed kernel is missing: the message names them. */
    char missing[256] = "";
    for (int k = 0; k < c->nneed; k++) {
        if (ct_supports(c->need[k], c->d->dev.type, c->dtype)) continue;
        size_t len = strlen(missing);
        snprintf(missing + len, sizeof missing - len, "%s%s", len ? ", " : "",
                 ct_op_name(c->need[k]));
    }
    if (missing[0]) {
        mark(c, "unsupported");
        snprintf(c->note, sizeof c->note, "no %s kernel for %s on %s",
                 c->d->dev.type == CT_DEVICE_CUDA ? "CUDA" : "CPU", missing,
                 ct_dtype_name(c->dtype));
        return;
    }
    bool tf32_before = ct_allow_tf32();
    ct_set_allow_tf32(c->tf32);
    c->gen = ct_generator_new(0x5eed);
    ct_status st = c->gen ? c->setup(c) : set_error(c, "generator");
    if (st == CT_OK) {
        /* the first call, traced; also the first warm-up */
        st = bc_traced_call(run_once, c, &c->trace);
        if (st != CT_OK) {
            mark(c, st == CT_ERR_UNSUPPORTED ? "unsupported" : "error");
            snprintf(c->note, sizeof c->note, "%s", ct_last_error());
        }
    } else if (st == CT_ERR_UNSUPPORTED) {
        mark(c, "unsupported");
    }
    bool anchor = opt.anchors && c->anchor;
    c->has_anchor = anchor;
    int warm = opt.warmup >= 0 ? opt.warmup : opt.quick ? 1 : 3;
    c->warmup = warm + 1;
    double t1 = 0, ta1 = 0;
    bool ok = st == CT_OK;
    for (int w = 0; ok && w < warm; w++)
        ok = !sample(c, false, 1, &t1) && (!anchor || !sample(c, true, 1, &ta1));
    /* Calls per timed repeat: enough for a few milliseconds, so that short
     * ops are above the timer's resolution. */
    ok = ok && !sample(c, false, 1, &t1) && (!anchor || !sample(c, true, 1, &ta1));
    if (ok) {
        double target = opt.quick ? 1e-3 : 4e-3;
        double inner = t1 > 0 ? ceil(target / t1) : 1;
        c->inner = inner < 1 ? 1 : inner > 1e6 ? 1000000 : (int)inner;
        double budget = opt.budget > 0 ? opt.budget : opt.quick ? 0.35 : 2.5;
        double per = c->inner * (t1 + (anchor ? ta1 : 0));
        /* quick mode keeps its minute with 3 repeats of the slowest cases */
        int lo = opt.quick ? (per > 0.25 ? 3 : 5) : 11, hi = opt.quick ? 31 : 201;
        double reps = per > 0 ? floor(budget / per) : hi;
        c->reps = opt.reps > 0 ? opt.reps : reps < lo ? lo : reps > hi ? hi : (int)reps;
        double *tl = malloc(sizeof(double) * (size_t)c->reps);
        double *ta = malloc(sizeof(double) * (size_t)c->reps);
        if (!tl || !ta) {
            snprintf(c->note, sizeof c->note, "out of memory for %d repeats", c->reps);
            ok = false;
        }
        for (int r = 0; ok && r < c->reps; r++) {
            ok = !sample(c, false, c->inner, &tl[r]) &&
                 (!anchor || !sample(c, true, c->inner, &ta[r]));
        }
        if (ok) {
            c->t = bc_summarize(tl, c->reps);
            if (anchor) c->ta = bc_summarize(ta, c->reps);
            mark(c, "ok");
        }
        free(tl);
        free(ta);
    }
    if (is_gpu(c->d) && bg_sync(c->d->gpu) && !strcmp(c->status, "ok")) {
        mark(c, "error");
        snprintf(c->note, sizeof c->note, "%s", bg_error(c->d->gpu));
    }
    release_case(c);
    /* Hands the case's blocks back, so that device memory does not grow with
     * the number of cases run. */
    if (is_gpu(c->d)) ct_cuda_empty_cache(c->d->dev.index);
    ct_set_allow_tf32(tf32_before);
}

/* ---- derived numbers ------------------------------------------------------------------------- */
static double rate_of(const bcase *c, double seconds, double work) {
    return seconds > 0 ? work / seconds : 0;
}

/* GFLOP/s, GB/s or calls/s of the library. */
static double lib_rate(const bcase *c) { return rate_of(c, c->t.median, c->work); }
static double anchor_rate(const bcase *c) { return rate_of(c, c->ta.median, c->anchor_work); }

static double ceiling_of(const bcase *c) {
    const devctx *d = c->d;
    switch (c->ceil) {
    case CEIL_GEMM_F32: return d->gemm_f32 * 1e9;
    case CEIL_GEMM_TF32: return d->gemm_tf32 * 1e9;
    case CEIL_GEMM_BF16: return d->gemm_bf16 * 1e9;
    case CEIL_COPY: return d->copy_gbs * 1e9;
    default: return 0;
    }
}

static const char *ceil_name(ceil_kind k) {
    switch (k) {
    case CEIL_GEMM_F32: return "gemm_f32";
    case CEIL_GEMM_TF32: return "gemm_tf32";
    case CEIL_GEMM_BF16: return "gemm_bf16";
    case CEIL_COPY: return "copy";
    default: return NULL;
    }
}

static double pct_ceiling(const bcase *c) {
    double ceil_v = ceiling_of(c);
    return ceil_v > 0 && !strcmp(c->status, "ok") ? 100.0 * lib_rate(c) / ceil_v : NAN;
}

static double anchor_ratio(const bcase *c) {
    if (!c->has_anchor || strcmp(c->status, "ok") || anchor_rate(c) <= 0) return NAN;
    return lib_rate(c) / anchor_rate(c);
}

/* ---- the table ------------------------------------------------------------------------------- */
static void fmt_time(char *buf, size_t n, double s) {
    if (s < 1e-6)
        snprintf(buf, n, "%.1f ns", s * 1e9);
    else if (s < 1e-3)
        snprintf(buf, n, "%.2f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, n, "%.2f ms", s * 1e3);
    else
        snprintf(buf, n, "%.3f s", s);
}

static void fmt_rate(char *buf, size_t n, const bcase *c, double r) {
    switch (c->rate) {
    case RATE_FLOP: snprintf(buf, n, r >= 1e12 ? "%.0f GFLOP/s" : "%.1f GFLOP/s", r / 1e9); break;
    case RATE_BYTES: snprintf(buf, n, "%.1f GB/s", r / 1e9); break;
    default: snprintf(buf, n, "%.2f Mop/s", r / 1e6); break;
    }
}

#define ROW_FMT "%-40s %-7s %10s %5s %15s %6s  %-20s %10s %7s %7s  %s\n"

static void table_header(void) {
    printf(ROW_FMT, "case", "device", "time", "+-%", "rate", "%peak", "anchor", "its time",
           "xanchor", "GPU/CPU", "routine");
}

static void table_row(const bcase *c) {
    if (strcmp(c->status, "ok") != 0) {
        printf("%-40s %-7s %s: %s\n", c->name, c->d->label, c->status, c->note);
        fflush(stdout);
        return;
    }
    char tm[32], sp[16], rate[32], pct[16] = "-", ratio[16] = "-", su[16] = "-";
    fmt_time(tm, sizeof tm, c->t.median);
    snprintf(sp, sizeof sp, "%.0f", bc_spread_pct(&c->t));
    if (c->rate == RATE_CALLS)
        snprintf(rate, sizeof rate, "-");
    else
        fmt_rate(rate, sizeof rate, c, lib_rate(c));
    double p = pct_ceiling(c), r = anchor_ratio(c);
    if (isfinite(p)) snprintf(pct, sizeof pct, "%.0f%%", p);
    if (isfinite(r)) snprintf(ratio, sizeof ratio, "%.2f", r);
    if (c->speedup > 0) snprintf(su, sizeof su, "%.1fx", c->speedup);
    char anchor[24] = "-", at[32] = "-";
    if (c->has_anchor) {
        snprintf(anchor, sizeof anchor, "%.20s", c->anchor_name);
        fmt_time(at, sizeof at, c->ta.median);
    }
    char routine[48];
    snprintf(routine, sizeof routine, "%s", bc_trace_routine(&c->trace, c->op));
    printf(ROW_FMT, c->name, c->d->label, tm, sp, rate, pct, anchor, at, ratio, su, routine);
    fflush(stdout);
}

/* ---- ceilings -------------------------------------------------------------------------------- */
/* A ceiling is what the device can do: the fastest of the repeats. */
static double best_of(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

/* GFLOP/s of an n^3 GEMM through the anchor library, best of reps. */
static double ceiling_gemm(devctx *d, ct_dtype dt, bool tf32, int64_t n, int reps) {
    bcase c = {.d = d};
    c.gen = ct_generator_new(7);
    ct_tensor *a = rnd(&c, CT_SHAPE(n, n), dt), *b = rnd(&c, CT_SHAPE(n, n), dt);
    ct_tensor *out = ct_tensor_empty(CT_SHAPE(n, n), dt, d->dev);
    double t[16], res = 0;
    if (reps > 16) reps = 16;
    gemm_shape g = {n, n, n};
    bool ok = a && b && out;
    if (!ok) fprintf(stderr, "cten-bench: %s: ceiling: %s\n", d->label, ct_last_error());
    for (int r = -1; ok && r < reps; r++) {
        ok = !timer_start(d) && !gemm(&c, dt, tf32, &g, ct_tensor_data_ptr(a),
                                      ct_tensor_data_ptr(b), ct_tensor_data_ptr(out));
        double s = 0;
        ok = ok && !timer_stop(d, &s);
        if (ok && r >= 0) t[r] = s;
    }
    if (ok)
        res = 2.0 * (double)n * (double)n * (double)n / best_of(t, reps) / 1e9;
    else if (c.note[0])
        fprintf(stderr, "cten-bench: %s: ceiling: %s\n", d->label, c.note);
    ct_tensor_release(a), ct_tensor_release(b), ct_tensor_release(out);
    ct_generator_free(c.gen);
    return res;
}

/* GB/s (read + write) of a large copy, best of reps. */
static double ceiling_copy(devctx *d, size_t bytes, int reps) {
    double t[16], res = 0;
    if (reps > 16) reps = 16;
    bool ok = true;
    if (d->gpu) {
        int64_t n = (int64_t)(bytes / sizeof(float));
        ct_tensor *src = ct_tensor_full(1, &n, 1.0, CT_F32, d->dev);
        ct_tensor *dst = ct_tensor_empty(1, &n, CT_F32, d->dev);
        ok = src && dst;
        for (int r = -1; ok && r < reps; r++) {
            double s = 0;
            ok = !bg_timer_start(d->gpu) &&
                 !bg_memcpy(d->gpu, ct_tensor_data_ptr(dst), ct_tensor_data_ptr(src), bytes) &&
                 !bg_timer_stop(d->gpu, &s);
            if (ok && r >= 0) t[r] = s;
        }
        if (!ok)
            fprintf(stderr, "cten-bench: %s: copy ceiling: %s %s\n", d->label, ct_last_error(),
                    bg_error(d->gpu));
        ct_tensor_release(src), ct_tensor_release(dst);
    } else {
        char *src = malloc(bytes), *dst = malloc(bytes);
        ok = src && dst;
        if (ok) {
            memset(src, 1, bytes);
            memset(dst, 0, bytes);
        }
        for (int r = -1; ok && r < reps; r++) {
            double t0 = bc_now_s();
            bc_par_memcpy(dst, src, bytes, ct_get_num_threads());
            if (r >= 0) t[r] = bc_now_s() - t0;
        }
        if (!ok) fprintf(stderr, "cten-bench: cpu: copy ceiling: out of memory\n");
        free(src), free(dst);
    }
    if (ok) res = 2.0 * (double)bytes / best_of(t, reps) / 1e9;
    return res;
}

static void measure_ceilings(devctx *d) {
    int reps = opt.quick ? 3 : 7;
    if (d->gpu) {
        d->gemm_n = 8192;
        d->gemm_f32 = ceiling_gemm(d, CT_F32, false, d->gemm_n, reps);
        d->gemm_tf32 = ceiling_gemm(d, CT_F32, true, d->gemm_n, reps);
        d->gemm_bf16 = ceiling_gemm(d, CT_BF16, false, d->gemm_n, reps);
        d->copy_bytes = (size_t)1 << 30;
        d->copy_gbs = ceiling_copy(d, d->copy_bytes, opt.quick ? 5 : 11);
        ct_cuda_empty_cache(d->dev.index);
    } else {
        d->gemm_n = 2048;
        d->gemm_f32 = ceiling_gemm(d, CT_F32, false, d->gemm_n, reps);
        d->copy_bytes = (size_t)(opt.quick ? 256 : 512) << 20;
        d->copy_gbs = ceiling_copy(d, d->copy_bytes, reps);
    }
}

/* ---- devices --------------------------------------------------------------------------------- */
/* True when the --devices list selects d (every device when there is no list). */
static bool device_selected(ct_device dev) {
    if (!opt.devices) return true;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", opt.devices);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (dev.type == CT_DEVICE_CPU && !strcmp(tok, "cpu")) return true;
        if (dev.type == CT_DEVICE_CUDA) {
            if (!strcmp(tok, "cuda") || !strcmp(tok, "gpu")) return true;
            int idx;
            if (sscanf(tok, "cuda:%d", &idx) == 1 && idx == dev.index) return true;
        }
    }
    return false;
}

static void setup_devices(void) {
    size_t cpu_cache = bc_cpu_cache_bytes();
    if (device_selected(CT_CPU)) {
        devctx *d = &devices[ndevices++];
        d->dev = CT_CPU;
        snprintf(d->label, sizeof d->label, "cpu");
        bc_cpu_model(d->name, sizeof d->name);
        d->cache_bytes = cpu_cache;
        d->rotate_budget = (size_t)(opt.quick ? 256 : 1024) << 20;
    }
    int ngpu = ct_device_count(CT_DEVICE_CUDA);
    for (int i = 0; i < ngpu && ndevices < MAX_DEVICES; i++) {
        if (!device_selected(CT_CUDA(i))) continue;
        char err[512];
        devctx *d = &devices[ndevices];
        memset(d, 0, sizeof *d);
        d->dev = CT_CUDA(i);
        snprintf(d->label, sizeof d->label, "cuda:%d", i);
        if (ct_cuda_get_device_properties(i, &d->props) != CT_OK) {
            fprintf(stderr, "cten-bench: cuda:%d: %s\n", i, ct_last_error());
            continue;
        }
        memcpy(d->name, d->props.name, sizeof d->name);
        d->name[sizeof d->name - 1] = '\0';
        d->gpu = bg_open(i, err, sizeof err);
        if (!d->gpu) {
            fprintf(stderr, "cten-bench: cuda:%d left out: %s\n", i, err);
            continue;
        }
        d->cache_bytes = d->props.l2_cache_bytes ? d->props.l2_cache_bytes : (size_t)50 << 20;
        d->rotate_budget = (size_t)4 << 30;
        ndevices++;
    }
    if (opt.devices && strstr(opt.devices, "cuda") && ngpu == 0)
        fprintf(stderr, "cten-bench: no usable CUDA device (%s; cten-info says why)\n",
                ct_backend_available(CT_DEVICE_CUDA) ? "none present"
                                                     : "the CUDA backend is not loaded");
}

/* ---- JSON ------------------------------------------------------------------------------------ */
static void json_stats(bc_json *j, const char *key, const bc_stats *s) {
    bc_json_begin_obj(j, key);
    bc_json_num(j, "median", s->median);
    bc_json_num(j, "min", s->min);
    bc_json_num(j, "p10", s->p10);
    bc_json_num(j, "p90", s->p90);
    bc_json_num(j, "max", s->max);
    bc_json_end_obj(j);
}

static void json_rate(bc_json *j, const bcase *c, double rate) {
    bc_json_num(j, "gflops", c->rate == RATE_FLOP ? rate / 1e9 : NAN);
    bc_json_num(j, "gbs", c->rate == RATE_BYTES ? rate / 1e9 : NAN);
    bc_json_num(j, "calls_per_s", c->rate == RATE_CALLS ? rate : NAN);
}

static void json_record(bc_json *j, const bcase *c) {
    bool ok = !strcmp(c->status, "ok");
    bc_json_begin_obj(j, NULL);
    bc_json_str(j, "suite", "cten");
    bc_json_str(j, "case", c->family);
    bc_json_str(j, "name", c->name);
    bc_json_str(j, "key", c->key);
    bc_json_str(j, "variant", c->variant);
    bc_json_str(j, "device", c->d->label);
    bc_json_str(j, "device_type", is_gpu(c->d) ? "cuda" : "cpu");
    bc_json_str(j, "device_name", c->d->name);
    bc_json_str(j, "dtype", ct_dtype_name(c->dtype));
    bc_json_bool(j, "tf32", c->tf32);
    bc_json_begin_obj(j, "params");
    for (int k = 0; k < c->nparams; k++) bc_json_int(j, c->pnames[k], (long long)c->pvals[k]);
    bc_json_end_obj(j);
    bc_json_str(j, "status", c->status);
    bc_json_str(j, "note", c->note[0] ? c->note : NULL);
    bc_json_num(j, "flop", c->rate == RATE_FLOP ? c->work : NAN);
    bc_json_num(j, "bytes", c->rate == RATE_BYTES ? c->work : NAN);
    if (ok) {
        bc_json_int(j, "reps", c->reps);
        bc_json_int(j, "inner", c->inner);
        bc_json_int(j, "warmup", c->warmup);
        bc_json_int(j, "input_sets", c->nsets);
        json_stats(j, "time_s", &c->t);
        bc_json_num(j, "spread_pct", bc_spread_pct(&c->t));
        json_rate(j, c, lib_rate(c));
    }
    bc_json_begin_obj(j, "ceiling");
    bc_json_str(j, "kind", ceil_name(c->ceil));
    double cv = ceiling_of(c);
    bc_json_num(j, "value", cv > 0 ? cv / 1e9 : NAN);
    bc_json_str(j, "unit", c->ceil == CEIL_COPY ? "GB/s" : c->ceil == CEIL_NONE ? NULL : "GFLOP/s");
    bc_json_end_obj(j);
    bc_json_num(j, "pct_ceiling", pct_ceiling(c));
    if (c->has_anchor && ok) {
        bc_json_begin_obj(j, "anchor");
        bc_json_str(j, "name", c->anchor_name);
        bc_json_num(j, "flop", c->rate == RATE_FLOP ? c->anchor_work : NAN);
        bc_json_num(j, "bytes", c->rate == RATE_BYTES ? c->anchor_work : NAN);
        json_stats(j, "time_s", &c->ta);
        json_rate(j, c, anchor_rate(c));
        bc_json_end_obj(j);
    } else {
        bc_json_null(j, "anchor");
    }
    bc_json_num(j, "ratio_anchor", anchor_ratio(c));
    bc_json_num(j, "speedup_vs_cpu", c->speedup > 0 ? c->speedup : NAN);
    bc_json_str(j, "kernel_registered",
                c->nneed ? ct_kernel_name(c->need[0], c->d->dev.type, c->dtype) : NULL);
    bc_json_str(j, "routine", c->trace.n ? bc_trace_routine(&c->trace, c->op) : NULL);
    bc_json_begin_arr(j, "trace");
    for (int k = 0; k < c->trace.n; k++) {
        const bc_trace_entry *e = &c->trace.e[k];
        bc_json_begin_obj(j, NULL);
        bc_json_str(j, "op", e->op);
        bc_json_str(j, "device", e->device);
        bc_json_str(j, "dtype", e->dtype);
        bc_json_str(j, "routine", e->routine);
        bc_json_int(j, "calls", e->calls);
        bc_json_end_obj(j);
    }
    bc_json_end_arr(j);
    if (c->trace.dropped) bc_json_int(j, "trace_dropped", c->trace.dropped);
    bc_json_end_obj(j);
}

static void json_ceilings(bc_json *j, const devctx *d) {
    bc_json_begin_obj(j, NULL);
    bc_json_str(j, "device", d->label);
    bc_json_str(j, "device_name", d->name);
    bc_json_int(j, "gemm_n", (long long)d->gemm_n);
    bc_json_num(j, "gemm_f32_gflops", d->gemm_f32 > 0 ? d->gemm_f32 : NAN);
    bc_json_num(j, "gemm_tf32_gflops", d->gemm_tf32 > 0 ? d->gemm_tf32 : NAN);
    bc_json_num(j, "gemm_bf16_gflops", d->gemm_bf16 > 0 ? d->gemm_bf16 : NAN);
    bc_json_str(j, "gemm_routine", d->gpu ? "cublasGemmEx" : "cblas_sgemm");
    bc_json_num(j, "copy_gbs", d->copy_gbs > 0 ? d->copy_gbs : NAN);
    bc_json_num(j, "copy_bytes", (double)d->copy_bytes);
    bc_json_str(j, "copy_routine", d->gpu ? "cudaMemcpyAsync D2D" : "memcpy (threads)");
    bc_json_end_obj(j);
}

static int write_json(const char *path, double elapsed) {
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "cten-bench: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    bc_json j;
    bc_json_init(&j, f);
    bc_json_begin_obj(&j, NULL);
    bc_json_str(&j, "schema", "cten-bench/1");
    bc_json_str(&j, "suite", "cten");
    char date[64];
    time_t now = time(NULL);
    struct tm tmv;
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
    bc_json_str(&j, "date", date);
    bc_json_str(&j, "mode", opt.quick ? "quick" : "full");
    bc_json_num(&j, "elapsed_s", elapsed);
    bc_json_begin_obj(&j, "machine");
    char host[256] = "unknown", cpu[256];
    gethostname(host, sizeof host - 1);
    bc_cpu_model(cpu, sizeof cpu);
    bc_json_str(&j, "hostname", host);
    bc_json_str(&j, "cpu", cpu);
    bc_json_int(&j, "cpu_cores_online", sysconf(_SC_NPROCESSORS_ONLN));
    bc_json_int(&j, "threads", ct_get_num_threads());
    bc_json_num(&j, "memory_bytes", (double)bc_total_memory());
    bc_json_num(&j, "cpu_cache_bytes", (double)bc_cpu_cache_bytes());
    bc_json_begin_arr(&j, "gpus");
    for (int i = 0; i < ndevices; i++) {
        const devctx *d = &devices[i];
        if (!d->gpu) continue;
        const ct_cuda_device_props *p = &d->props;
        bc_json_begin_obj(&j, NULL);
        bc_json_str(&j, "device", d->label);
        bc_json_str(&j, "name", p->name);
        bc_json_int(&j, "compute_capability", p->major * 10 + p->minor);
        bc_json_int(&j, "multiprocessors", p->multiprocessors);
        bc_json_num(&j, "memory_bytes", (double)p->total_memory);
        bc_json_num(&j, "l2_cache_bytes", (double)p->l2_cache_bytes);
        bc_json_int(&j, "clock_khz", p->clock_khz);
        bc_json_end_obj(&j);
    }
    bc_json_end_arr(&j);
    bc_json_end_obj(&j);
    bc_json_begin_obj(&j, "versions");
    bc_json_str(&j, "cten", CT_VERSION_STRING);
    bc_json_str(&j, "blas", ct_blas_info());
    bc_json_str(&j, "compiler", __VERSION__);
    for (int i = 0; i < ndevices; i++) {
        const ct_cuda_device_props *p = &devices[i].props;
        if (!devices[i].gpu) continue;
        bc_json_int(&j, "cuda_driver", p->driver_version);
        bc_json_int(&j, "cuda_runtime", p->runtime_version);
        bc_json_int(&j, "cublas", p->cublas_version);
        bc_json_int(&j, "cudnn", p->cudnn_version);
        break;
    }
    bc_json_end_obj(&j);
    bc_json_begin_arr(&j, "ceilings");
    for (int i = 0; i < ndevices; i++) json_ceilings(&j, &devices[i]);
    bc_json_end_arr(&j);
    bc_json_begin_arr(&j, "records");
    for (int i = 0; i < nrecords; i++) json_record(&j, &records[i]);
    bc_json_end_arr(&j);
    bc_json_end_obj(&j);
    if (f != stdout && fclose(f) != 0) {
        fprintf(stderr, "cten-bench: writing %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

/* ---- command line ---------------------------------------------------------------------------- */
static void usage(FILE *f) {
    fprintf(f,
            "usage: cten-bench [options]\n"
            "Runs one suite of cases on every device present, each against an anchor called\n"
            "directly (cblas_sgemm/cublasGemmEx, memcpy/cudaMemcpy), and prints a table.\n\n"
            "  --quick            fewer warm-ups and repeats (under a minute on a CPU)\n"
            "  --cases LIST       families to run (default all):");
    for (int i = 0; i < NFAMILIES; i++) fprintf(f, "%s%s", i ? "," : " ", families[i].name);
    fprintf(
        f,
        "\n"
        "  --match TEXT       only cases whose name contains TEXT\n"
        "  --devices LIST     cpu, cuda, cuda:N (default every device present)\n"
        "  --sizes LIST       matmul sizes (default 256,1024,2048, and 8192 on GPUs)\n"
        "  --batches LIST     training-step batch sizes (default 64,1024)\n"
        "  --reps N           timed repeats per case (default: as many as fit --budget)\n"
        "  --warmup N         warm-up repeats after the traced first call\n"
        "  --budget SECONDS   time per case and device for the repeats (default 2.5, quick 0.35)\n"
        "  --threads N        CPU threads (default: the library's)\n"
        "  --json PATH        write the records as JSON (- for stdout)\n"
        "  --no-anchor        do not run the anchors\n"
        "  --no-ceiling       do not measure the devices' ceilings\n"
        "  --list             list the cases and exit\n");
}

static int parse_list(const char *s, int64_t *out, int max) {
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long long v = strtoll(tok, &end, 10);
        if (*end || v < 1 || n == max) return -1;
        out[n++] = v;
    }
    return n;
}

static int parse_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDS_VALUE                                                                                \
    if (!v) {                                                                                      \
        fprintf(stderr, "cten-bench: %s needs a value\n", a);                                      \
        return 2;                                                                                  \
    }                                                                                              \
    i++
        if (!strcmp(a, "--quick")) {
            opt.quick = true;
        } else if (!strcmp(a, "--cases")) {
            NEEDS_VALUE;
            opt.cases = v;
        } else if (!strcmp(a, "--match")) {
            NEEDS_VALUE;
            opt.match = v;
        } else if (!strcmp(a, "--devices")) {
            NEEDS_VALUE;
            opt.devices = v;
        } else if (!strcmp(a, "--sizes") || !strcmp(a, "--batches")) {
            NEEDS_VALUE;
            bool sizes = !strcmp(a, "--sizes");
            int n = parse_list(v, sizes ? opt.sizes : opt.batches, MAX_SIZES);
            if (n <= 0) {
                fprintf(stderr, "cten-bench: %s: expected up to %d positive integers, got '%s'\n",
                        a, MAX_SIZES, v);
                return 2;
            }
            *(sizes ? &opt.nsizes : &opt.nbatches) = n;
        } else if (!strcmp(a, "--reps") || !strcmp(a, "--warmup") || !strcmp(a, "--threads")) {
            NEEDS_VALUE;
            char *end;
            long x = strtol(v, &end, 10);
            if (*end || x < (strcmp(a, "--warmup") ? 1 : 0) || x > 1000000) {
                fprintf(stderr, "cten-bench: %s: bad value '%s'\n", a, v);
                return 2;
            }
            *(!strcmp(a, "--reps")     ? &opt.reps
              : !strcmp(a, "--warmup") ? &opt.warmup
                                       : &opt.threads) = (int)x;
        } else if (!strcmp(a, "--budget")) {
            NEEDS_VALUE;
            char *end;
            opt.budget = strtod(v, &end);
            if (*end || !(opt.budget > 0)) {
                fprintf(stderr, "cten-bench: --budget: bad value '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--json")) {
            NEEDS_VALUE;
            opt.json = v;
        } else if (!strcmp(a, "--no-anchor")) {
            opt.anchors = false;
        } else if (!strcmp(a, "--no-ceiling")) {
            opt.ceilings = false;
        } else if (!strcmp(a, "--list")) {
            opt.list = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else {
            fprintf(stderr, "cten-bench: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef NEEDS_VALUE
    }
    if (opt.cases) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", opt.cases);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            bool known = !strcmp(tok, "all");
            for (int f = 0; f < NFAMILIES; f++) known |= !strcmp(tok, families[f].name);
            if (!known) {
                fprintf(stderr, "cten-bench: unknown case family '%s'\n", tok);
                return 2;
            }
        }
    }
    return 0;
}

static bool family_selected(const char *name) {
    if (!opt.cases) return true;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", opt.cases);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (!strcmp(tok, "all") || !strcmp(tok, name)) return true;
    return false;
}

static bcase *new_record(void) {
    if (nrecords == caprecords) {
        int cap = caprecords ? 2 * caprecords : 64;
        bcase *r = realloc(records, sizeof *r * (size_t)cap);
        if (!r) return NULL;
        records = r;
        caprecords = cap;
    }
    return &records[nrecords++];
}

/* The throughput of the last successful CPU row with c's key, or 0. */
static double cpu_rate_for(const bcase *c) {
    for (int i = nrecords - 1; i >= 0; i--) {
        const bcase *r = &records[i];
        if (!is_gpu(r->d) && !strcmp(r->key, c->key) && !strcmp(r->status, "ok"))
            return lib_rate(r);
    }
    return 0;
}

static void print_header(void) {
    char cpu[256];
    bc_cpu_model(cpu, sizeof cpu);
    printf("cten-bench %s (%s mode)\n", CT_VERSION_STRING, opt.quick ? "quick" : "full");
    printf("CPU: %s, %d threads; BLAS: %s\n", cpu, ct_get_num_threads(), ct_blas_info());
    for (int i = 0; i < ndevices; i++) {
        const devctx *d = &devices[i];
        if (d->gpu)
            printf("%s: %s, %d SMs, %.0f GiB; CUDA runtime %d, cuBLAS %d, cuDNN %d\n", d->label,
                   d->name, d->props.multiprocessors, (double)d->props.total_memory / (1 << 30),
                   d->props.runtime_version, d->props.cublas_version, d->props.cudnn_version);
    }
    if (!opt.ceilings) return;
    printf("ceilings measured now (100%% in the %%peak column):\n");
    for (int i = 0; i < ndevices; i++) {
        const devctx *d = &devices[i];
        printf("  %-7s %s %lld^3 f32 %.1f GFLOP/s", d->label,
               d->gpu ? "cublasGemmEx" : "cblas_sgemm", (long long)d->gemm_n, d->gemm_f32);
        if (d->gpu) printf(", tf32 %.1f GFLOP/s, bf16 %.1f GFLOP/s", d->gemm_tf32, d->gemm_bf16);
        printf("; copy %.0f MiB %.1f GB/s (read + write)\n", (double)d->copy_bytes / (1 << 20),
               d->copy_gbs);
    }
}

int main(int argc, char **argv) {
    int rc = parse_args(argc, argv);
    if (rc) return rc == 1 ? 0 : rc;
    if (opt.threads > 0 && ct_set_num_threads(opt.threads) != CT_OK) {
        fprintf(stderr, "cten-bench: %s\n", ct_last_error());
        return 2;
    }
    double t_start = bc_now_s();
    /* Initializes the library first: it picks OpenBLAS's kernels, which the
     * anchors then share. */
    (void)ct_blas_info();
    setup_devices();
    if (ndevices == 0) {
        fprintf(stderr, "cten-bench: no device selected\n");
        return 2;
    }
    if (opt.list) {
        for (int f = 0; f < NFAMILIES; f++) {
            if (!family_selected(families[f].name)) continue;
            printf("%s: %s\n", families[f].name, families[f].what);
            for (int i = 0;; i++) {
                bool more = false;
                for (int k = 0; k < ndevices; k++) {
                    bcase c = {.family = families[f].name, .d = &devices[k]};
                    if (!families[f].describe(&c, i)) continue;
                    more = true;
                    if (c.name[0] && (!opt.match || strstr(c.name, opt.match)))
                        printf("  %-44s %s\n", c.name, devices[k].label);
                }
                if (!more) break;
            }
        }
        return 0;
    }
    if (opt.ceilings)
        for (int i = 0; i < ndevices; i++) measure_ceilings(&devices[i]);
    print_header();
    printf("\n");
    table_header();
    int failures = 0;
    for (int f = 0; f < NFAMILIES; f++) {
        if (!family_selected(families[f].name)) continue;
        for (int i = 0;; i++) {
            bool more = false;
            for (int k = 0; k < ndevices; k++) {
                bcase *c = new_record();
                if (!c) {
                    fprintf(stderr, "cten-bench: out of memory\n");
                    return 1;
                }
                memset(c, 0, sizeof *c);
                c->family = families[f].name;
                c->d = &devices[k];
                if (!families[f].describe(c, i)) {
                    nrecords--;
                    continue;
                }
                more = true;
                if (!c->name[0] || (opt.match && !strstr(c->name, opt.match))) {
                    nrecords--; /* not for this device, or filtered out */
                    continue;
                }
                run_case(c);
                if (is_gpu(c->d) && !strcmp(c->status, "ok")) {
                    double cpu = cpu_rate_for(c);
                    if (cpu > 0) c->speedup = lib_rate(c) / cpu;
                }
                failures += !strcmp(c->status, "error");
                table_row(c);
            }
            if (!more) break;
        }
    }
    double elapsed = bc_now_s() - t_start;
    printf(
        "\n%d cases in %.1f s; time = median per call, +-%% = spread of the middle 80%% of "
        "repeats;\nxanchor = rate / anchor's rate (1.00 = as fast as the anchor); GPU/CPU = "
        "throughput against the CPU row of the same case.\n",
        nrecords, elapsed);
    if (opt.json && write_json(opt.json, elapsed)) rc = 1;
    for (int i = 0; i < ndevices; i++) bg_close(devices[i].gpu);
    free(records);
    return rc ? rc : failures ? 1 : 0;
}
