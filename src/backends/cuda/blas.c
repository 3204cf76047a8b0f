/* CT_OP_MM, CT_OP_BMM, CT_OP_ADDMM, CT_OP_LINEAR_BACKWARD_WEIGHT and
 * CT_OP_LINEAR_GELU for CUDA tensors through cuBLAS.
 *
 * The call record is the CPU kernels' (src/backends/cpu/linalg.c): in[A]
 * [batch..., n, k], in[B] [batch..., k, m], out [batch..., n, m] contiguous,
 * broadcast batch dims with stride 0; out = beta * input + alpha * (A @ B)
 * with cti_gemm_params' beta and alpha, where addmm's input is in[0],
 * broadcast to [n, m] (mm and bmm have none).
 *
 * cuBLAS is column-major and cten row-major: a row-major matrix is the
 * column-major view of its transpose, so C = A B is computed as
 * C^T = B^T A^T with the operands swapped. An operand stored row-major with a
 * leading dimension goes in as it is (CUBLAS_OP_N), one stored as the
 * transpose of such a matrix with CUBLAS_OP_T; only other layouts are copied
 * into a contiguous matrix first. Batches with one stride per operand are
 * one cublasGemmStridedBatchedEx call (stride 0 for a broadcast operand).
 *
 * float32 uses CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 when
 * ct_allow_tf32() is on; float16/bfloat16 multiply with float32 accumulation
 * and scaling (CUBLAS_COMPUTE_32F) and round once into the output, or store
 * the accumulators as they are into a float32 output (a widened gradient,
 * cti_ag_grad_dtype); float64 uses CUBLAS_COMPUTE_64F. Each device has one
 * handle, bound to the device's stream, and each call hands cuBLAS a
 * workspace from the caching allocator, released after the call (its reuse
 * is ordered after the GEMM on the stream).
 *
 * addmm with a bias row (the input a contiguous vector broadcast down the
 * rows, beta and alpha 1: what ct_linear records) goes through cuBLASLt
 * with its bias epilogue, which adds the bias to the float32 accumulator
 * before the one rounding: the same sum the beta = 1 GEMM forms, without
 * first copying the bias into every row of the output. The plan (matmul
 * descriptor, layouts, the heuristic's algorithm) is kept per device for
 * each geometry; a geometry cuBLASLt has no algorithm for takes the GEMM
 * path, and so does every other product.
 *
 * linear_backward_weight's weight gradient grad_y^T x goes through cuBLASLt
 * the same way with its bias-gradient epilogue (BGRADB: cuBLASLt's B is
 * grad_y^T, whose sums over k are the bias gradient), so grad_y is read once
 * for both gradients instead of once more by a column sum.
 *
 * LINEAR_GELU runs its composite kernel (src/dispatch/compose.c): the GEMM
 * with the bias epilogue, then GELU; LINEAR_DGELU's kernel (reduce.c) runs
 * the GEMM here, then gelu's backward inside the bias gradient's row sums.
 * cuBLASLt's GELU epilogues were tried: on the H200, DGELU_BGRAD took 4x the
 * plain GEMM, and the MLP's bf16 gradients through GELU_AUX_BIAS and DGELU
 * disagreed with the composite (docs/BENCHMARKS.md, 2026-12-05). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include "cuda_impl.h"
#include "tensor/ops.h"

#define WORKSPACE_BYTES ((int64_t)32 << 20)

/* A cuBLASLt plan for one epilogue geometry (see lt_key). */
#define LT_PLANS 32

/* The epilogues cten asks cuBLASLt for. */
typedef enum lt_epi {
    EPI_BIAS,  /* D = A B + bias */
    EPI_BGRADB /* D = A B, and the bias gradient: the sums of op(A) over k */
} lt_epi;

static cublasLtEpilogue_t epi_lt(lt_epi e) {
    return e == EPI_BGRADB ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BIAS;
}

static const char *epi_routine(lt_epi e, bool tf32) {
    static const char *const names[][2] = {
        {"cublasLtMatmul, bias epilogue", "cublasLtMatmul, bias epilogue (tf32)"},
        {"cublasLtMatmul, bias-gradient epilogue", "cublasLtMatmul, bias-gradient epilogue (tf32)"}};
    return names[e][tf32];
}

typedef struct lt_key {
    ct_dtype dt, odt;
    bool tf32;
    lt_epi epi;
    uint32_t vec_align; /* the vector's alignment: 256 or 16 bytes */
    cublasOperation_t ta, tb;
    int64_t n, k, m, lda, ldb, ldc;
} lt_key;

typedef struct lt_plan {
    bool used, ok; /* ok: cuBLASLt returned an algorithm */
    lt_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

typedef struct blas_dev {
    pthread_mutex_t lock;
    cublasHandle_t handle;
    cublasLtHandle_t lt;
    lt_plan plans[LT_PLANS];
    int next_plan; /* the slot the next new geometry takes, round robin */
} blas_dev;

static blas_dev devs[CTI_CUDA_MAX_DEVICES];
static pthread_once_t devs_once = PTHREAD_ONCE_INIT;

static void init_devs(void) {
    for (int i = 0; i < CTI_CUDA_MAX_DEVICES; i++) pthread_mutex_init(&devs[i].lock, NULL);
}

static ct_status blas_fail(const char *op, int dev, const char *call, cublasStatus_t s) {
    cudaGetLastError();
    return cti_error(s == CUBLAS_STATUS_ALLOC_FAILED ? CT_ERR_OOM : CT_ERR_RUNTIME,
                     "%s: %s failed on cuda:%d: %s (%s)", op, call, dev, cublasGetStatusString(s),
                     cublasGetStatusName(s));
}

/* Handles are destroyed at exit (with the workspace cuBLAS allocates inside
 * them), so tools that look for leaked device memory see none. Registered
 * after the first handle exists, i.e. after the CUDA runtime registered its
 * own exit handler, so this one runs first. */
static void plan_clear(lt_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

static void destroy_handles(void) {
    for (int i = 0; i < CTI_CUDA_MAX_DEVICES; i++) {
        for (int j = 0; j < LT_PLANS; j++) plan_clear(&devs[i].plans[j]);
        if (!devs[i].handle) continue;
        if (cudaSetDevice(i) == cudaSuccess) {
            cublasDestroy(devs[i].handle);
            if (devs[i].lt) cublasLtDestroy(devs[i].lt);
        }
        devs[i].handle = NULL;
        devs[i].lt = NULL;
    }
    cudaGetLastError();
}

static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static void register_exit(void) { atexit(destroy_handles); }

/* dev's handle, created on first use; the caller holds devs[dev].lock and
 * has made dev current. */
static ct_status handle_of(const char *op, int dev, cudaStream_t stream, cublasHandle_t *out) {
    blas_dev *d = &devs[dev];
    if (!d->handle && cti_cuda_capturing(dev))
        return cti_cuda_capture_refuse(op, dev, "creating the cuBLAS handle (it allocates)");
    if (!d->handle) {
        cublasHandle_t h;
        cublasStatus_t s = cublasCreate(&h);
        if (s != CUBLAS_STATUS_SUCCESS) return blas_fail(op, dev, "cublasCreate", s);
        if ((s = cublasSetStream(h, stream)) != CUBLAS_STATUS_SUCCESS) {
            cublasDestroy(h);
            return blas_fail(op, dev, "cublasSetStream", s);
        }
        /* cuBLASLt's handle is made with cuBLAS's, so that a capture
         * never meets a first use of either */
        cublasLtHandle_t lt;
        if ((s = cublasLtCreate(&lt)) != CUBLAS_STATUS_SUCCESS) {
            cublasDestroy(h);
            return blas_fail(op, dev, "cublasLtCreate", s);
        }
        d->handle = h;
        d->lt = lt;
        pthread_once(&exit_once, register_exit);
    }
    *out = d->handle;
    return CT_OK;
}

/* ---- operands ------------------------------------------------------------------------- */

typedef struct mat {
    const ct_tensor *t;
    char *p;                 /* element [0, 0] of the first matrix */
    int64_t rs, cs;          /* row and column strides, elements */
    int64_t bs[CT_MAX_DIMS]; /* batch strides, elements */
} mat;

static mat mat_of(const ct_tensor *t, int nb) {
    mat x;
    memset(&x, 0, sizeof x);
    x.t = t;
    x.p = cti_data(t);
    x.rs = t->stride[nb];
    x.cs = t->stride[nb + 1];
    for (int i = 0; i < nb; i++) x.bs[i] = t->stride[i];
    return x;
}

/* How cuBLAS can read a row-major rows x cols matrix with strides (rs, cs):
 * CUBLAS_OP_N with leading dimension rs when rows are contiguous, CUBLAS_OP_T
 * with cs when columns are. A dim of size 1 has no stride to respect. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, cublasOperation_t *op,
                        int64_t *ld) {
    int64_t min_n = cols > 1 ? cols : 1, min_t = rows > 1 ? rows : 1;
    if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= min_n)) {
        *op = CUBLAS_OP_N;
        *ld = rows <= 1 ? min_n : rs;
    } else if ((rows <= 1 || rs == 1) && (cols <= 1 || cs >= min_t)) {
        *op = CUBLAS_OP_T;
        *ld = cols <= 1 ? min_t : cs;
    } else {
        return false;
    }
    return *ld <= INT_MAX;
}

/* dst <- src (broadcast to dst's shape) with the CUDA copy kernel. */
static ct_status device_copy(ct_tensor *dst, ct_tensor *src) {
    return cti_dispatch_one(CT_OP_COPY, NULL, 0, 1, &src, dst, dst->storage->device, dst->dtype);
}

/* A contiguous copy of t (for a layout cuBLAS cannot read). */
static ct_tensor *packed(const char *op, ct_tensor *t) {
    ct_tensor *p = cti_tensor_new(op, t->ndim, t->shape, t->dtype, t->storage->device);
    if (p && device_copy(p, t) != CT_OK) {
        ct_tensor_release(p);
        return NULL;
    }
    return p;
}

/* ---- the product ------------------------------------------------------------------------ */

typedef struct gemm {
    const char *op;
    int dev;
    ct_dtype dt, odt; /* the operands', the output's (float32 for a widened gradient) */
    int64_t n, k, m;
    int nb;
    int64_t bshape[CT_MAX_DIMS];
    mat a, b, c;
    cublasOperation_t ta, tb;
    int64_t lda, ldb, ldc;
    double alpha, beta;
} gemm;

/* Merges batch dims whose strides chain in all three operands and drops
 * size-1 ones, so most batches need one strided call. */
static void merge_batch(gemm *g) {
    int m = 0;
    for (int d = 0; d < g->nb; d++) {
        if (g->bshape[d] == 1) continue;
        if (m > 0 && g->a.bs[m - 1] == g->a.bs[d] * g->bshape[d] &&
            g->b.bs[m - 1] == g->b.bs[d] * g->bshape[d] &&
            g->c.bs[m - 1] == g->c.bs[d] * g->bshape[d]) {
            g->bshape[m - 1] *= g->bshape[d];
            g->a.bs[m - 1] = g->a.bs[d];
            g->b.bs[m - 1] = g->b.bs[d];
            g->c.bs[m - 1] = g->c.bs[d];
            continue;
        }
        g->bshape[m] = g->bshape[d];
        g->a.bs[m] = g->a.bs[d];
        g->b.bs[m] = g->b.bs[d];
        g->c.bs[m] = g->c.bs[d];
        m++;
    }
    g->nb = m;
}

static cudaDataType_t cuda_type(ct_dtype dt) {
    switch (dt) {
    case CT_F16: return CUDA_R_16F;
    case CT_BF16: return CUDA_R_16BF;
    case CT_F64: return CUDA_R_64F;
    default: return CUDA_R_32F;
    }
}

/* g's sizes for a [batch..., n, k] @ b [batch..., k, m] into o [batch..., n, m] with nb
 * batch dims (o's), alpha 1 and beta 0; the layouts are the caller's. */
static void gemm_sizes(gemm *g, const char *op, const ct_tensor *a, const ct_tensor *b,
                       const ct_tensor *o, int nb) {
    memset(g, 0, sizeof *g);
    g->op = op;
    g->dev = o->storage->device.index;
    g->dt = a->dtype;
    g->odt = o->dtype;
    g->nb = nb;
    for (int d = 0; d < nb; d++) g->bshape[d] = o->shape[d];
    g->n = a->shape[nb];
    g->k = a->shape[nb + 1];
    g->m = b->shape[nb + 1];
    g->alpha = 1;
}

/* A cuBLAS workspace for one call on g's device, from the caching allocator:
 * released after the call, its reuse is ordered after the call on the stream. */
static ct_tensor *workspace(const gemm *g) {
    int64_t wb = WORKSPACE_BYTES;
    return cti_tensor_new(g->op, 1, &wb, CT_BOOL, CT_CUDA(g->dev));
}

/* g's device record, its lock taken, and in *h its handle bound to stream (the
 * device current); *st a failure to make the handle. The caller unlocks. */
static blas_dev *blas_lock(const gemm *g, cudaStream_t stream, cublasHandle_t *h, ct_status *st) {
    pthread_once(&devs_once, init_devs);
    blas_dev *d = &devs[g->dev];
    pthread_mutex_lock(&d->lock);
    *st = handle_of(g->op, g->dev, stream, h);
    return d;
}

/* Queues the products of g on h (the device current, its lock held). */
static ct_status run_gemm(const gemm *g, cublasHandle_t h, bool tf32, const char **routine) {
    cudaDataType_t ty = cuda_type(g->dt), oty = cuda_type(g->odt);
    cublasComputeType_t ct = g->dt == CT_F64 ? CUBLAS_COMPUTE_64F
                             : tf32         ? CUBLAS_COMPUTE_32F_FAST_TF32
                                            : CUBLAS_COMPUTE_32F;
    float fa = (float)g->alpha, fb = (float)g->beta;
    const void *alpha = g->dt == CT_F64 ? (const void *)&g->alpha : (const void *)&fa;
    const void *beta = g->dt == CT_F64 ? (const void *)&g->beta : (const void *)&fb;
    int64_t es = (int64_t)ct_dtype_size(g->dt), oes = (int64_t)ct_dtype_size(g->odt);
    int n = (int)g->n, k = (int)g->k, m = (int)g->m;
    if (g->nb == 0) {
        *routine = tf32 ? "cublasGemmEx (tf32)" : "cublasGemmEx";
        cublasStatus_t s = cublasGemmEx(h, g->tb, g->ta, m, n, k, alpha, g->b.p, ty, (int)g->ldb,
                                        g->a.p, ty, (int)g->lda, beta, g->c.p, oty, (int)g->ldc, ct,
                                        CUBLAS_GEMM_DEFAULT);
        return s == CUBLAS_STATUS_SUCCESS ? CT_OK : blas_fail(g->op, g->dev, "cublasGemmEx", s);
    }
    *routine = tf32 ? "cublasGemmStridedBatchedEx (tf32)" : "cublasGemmStridedBatchedEx";
    int last = g->nb - 1;
    int64_t count = g->bshape[last], outer = 1;
    for (int d = 0; d < last; d++) outer *= g->bshape[d];
    if (count > INT_MAX)
        return cti_error(CT_ERR_OVERFLOW, "%s: %lld batches exceed cuBLAS's 32-bit count", g->op,
                         (long long)count);
    int64_t idx[CT_MAX_DIMS] = {0};
    int64_t oa = 0, ob = 0, oc = 0;
    for (int64_t t = 0; t < outer; t++) {
        cublasStatus_t s = cublasGemmStridedBatchedEx(
            h, g->tb, g->ta, m, n, k, alpha, g->b.p + ob * es, ty, (int)g->ldb, g->b.bs[last],
            g->a.p + oa * es, ty, (int)g->lda, g->a.bs[last], beta, g->c.p + oc * oes, oty,
            (int)g->ldc, g->c.bs[last], (int)count, ct, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS)
            return blas_fail(g->op, g->dev, "cublasGemmStridedBatchedEx", s);
        for (int d = last - 1; d >= 0; d--) {
            oa += g->a.bs[d];
            ob += g->b.bs[d];
            oc += g->c.bs[d];
            if (++idx[d] < g->bshape[d]) break;
            oa -= g->a.bs[d] * g->bshape[d];
            ob -= g->b.bs[d] * g->bshape[d];
            oc -= g->c.bs[d] * g->bshape[d];
            idx[d] = 0;
        }
    }
    return CT_OK;
}

/* ---- the bias epilogue (cuBLASLt) ------------------------------------------------------- */

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* The 16-byte alignment the plans ask cuBLASLt for (operands, vector and
 * leading dimensions). */
static bool lt_operands(const gemm *g, const void *vec) {
    int64_t es = (int64_t)ct_dtype_size(g->dt), oes = (int64_t)ct_dtype_size(g->odt);
    return aligned16(vec) && aligned16(g->a.p) && aligned16(g->b.p) && aligned16(g->c.p) &&
           (g->lda * es) % 16 == 0 && (g->ldb * es) % 16 == 0 && (g->ldc * oes) % 16 == 0;
}

/* Whether t, as [n, m], is one contiguous row broadcast down g's rows. */
static bool row_vector(const gemm *g, const ct_tensor *t) {
    return t->ndim == 2 && (g->n <= 1 || t->stride[0] == 0) && (g->m <= 1 || t->stride[1] == 1);
}

/* Whether input (addmm's, as [n, m]) is a contiguous bias row broadcast
 * down the rows of a 2-d product that cuBLASLt's bias epilogue can add. */
static bool bias_row(const gemm *g, const ct_tensor *input) {
    if (g->nb != 0 || g->beta != 1 || g->alpha != 1 || g->odt != g->dt || !row_vector(g, input))
        return false;
    if (g->dt != CT_F32 && g->dt != CT_F16 && g->dt != CT_BF16) return false;
    return lt_operands(g, cti_data(input));
}

/* A layout of a rows x cols column-major matrix with leading dim ld,
 * stored transposed when op is CUBLAS_OP_T. */
static cublasStatus_t layout(cublasLtMatrixLayout_t *l, cudaDataType_t ty, cublasOperation_t op,
                             int64_t rows, int64_t cols, int64_t ld) {
    return op == CUBLAS_OP_N ? cublasLtMatrixLayoutCreate(l, ty, (uint64_t)rows, (uint64_t)cols, ld)
                             : cublasLtMatrixLayoutCreate(l, ty, (uint64_t)cols, (uint64_t)rows, ld);
}

/* Builds p for key (column-major: D [m, n] = op(B) [m, k] op(A) [k, n]
 * with key->epi's epilogue, whose bias vector is [m], but BGRADB's [n], the
 * sums of op(A) over k, in D's dtype); p->ok false when cuBLASLt has no
 * algorithm for it. */
static cublasStatus_t plan_build(blas_dev *d, lt_plan *p, const lt_key *key) {
    memset(p, 0, sizeof *p);
    p->used = true;
    p->key = *key;
    cudaDataType_t ty = cuda_type(key->dt), oty = cuda_type(key->odt);
    cublasComputeType_t ct = key->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtEpilogue_t epi = epi_lt(key->epi);
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &key->tb,
                                           sizeof key->tb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &key->ta,
                                           sizeof key->ta);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &oty,
                                           sizeof oty);
    /* The heuristic reads the vector's alignment from its pointer: an address
     * aligned as the key says and no more, so the algorithm chosen serves
     * every call of the key (run_lt_gemm sets the call's own pointer). */
    void *probe = (void *)(uintptr_t)key->vec_align;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &probe,
                                           sizeof probe);
    if (s == CUBLAS_STATUS_SUCCESS) s = layout(&p->la, ty, key->tb, key->m, key->k, key->ldb);
    if (s == CUBLAS_STATUS_SUCCESS) s = layout(&p->lb, ty, key->ta, key->k, key->n, key->lda);
    if (s == CUBLAS_STATUS_SUCCESS) s = layout(&p->lc, oty, CUBLAS_OP_N, key->m, key->n, key->ldc);
    cublasLtMatmulPreference_t pref = NULL;
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
    uint64_t ws = (uint64_t)WORKSPACE_BYTES;
    uint32_t align = 16;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws);
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0] && s == CUBLAS_STATUS_SUCCESS; i++)
        s = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align);
    if (s == CUBLAS_STATUS_SUCCESS) {
        cublasLtMatmulHeuristicResult_t r;
        int found = 0;
        cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(d->lt, p->desc, p->la, p->lb, p->lc,
                                                          p->lc, pref, 1, &r, &found);
        if (h == CUBLAS_STATUS_SUCCESS && found > 0 && r.state == CUBLAS_STATUS_SUCCESS) {
            p->algo = r.algo;
            p->ok = true;
        }
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return s;
}

/* The plan for g's geometry, built on first use; NULL when none can be
 * made (then g takes the GEMM path). */
static lt_plan *plan_for(blas_dev *d, const gemm *g, bool tf32, lt_epi epi, uint32_t vec_align) {
    lt_key key;
    memset(&key, 0, sizeof key);
    key.dt = g->dt;
    key.odt = g->odt;
    key.tf32 = tf32;
    key.epi = epi;
    key.vec_align = vec_align;
    key.ta = g->ta;
    key.tb = g->tb;
    key.n = g->n, key.k = g->k, key.m = g->m;
    key.lda = g->lda, key.ldb = g->ldb, key.ldc = g->ldc;
    for (int i = 0; i < LT_PLANS; i++)
        if (d->plans[i].used && !memcmp(&d->plans[i].key, &key, sizeof key))
            return d->plans[i].ok ? &d->plans[i] : NULL;
    lt_plan *p = &d->plans[d->next_plan];
    d->next_plan = (d->next_plan + 1) % LT_PLANS;
    plan_clear(p);
    if (plan_build(d, p, &key) != CUBLAS_STATUS_SUCCESS) {
        plan_clear(p); /* a failure to describe is not remembered: the next call tries again */
        return NULL;
    }
    return p->ok ? p : NULL;
}

/* g's product through cuBLASLt with epilogue epi, reading or writing vec
 * (the bias or its gradient). False (nothing queued) when g has no plan; *st
 * a launch's failure. */
static bool run_lt_gemm(blas_dev *d, const gemm *g, bool tf32, lt_epi epi, void *vec, void *work,
                        cudaStream_t stream, const char **routine, ct_status *st) {
    /* the caching allocator's blocks are 256-byte aligned; a view may be 16 */
    lt_plan *p = plan_for(d, g, tf32, epi, (uintptr_t)vec % 256 == 0 ? 256 : 16);
    if (!p) return false;
    cublasStatus_t s =
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec);
    float one = 1, zero = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(d->lt, p->desc, &one, g->b.p, p->la, g->a.p, p->lb, &zero, g->c.p,
                           p->lc, g->c.p, p->lc, &p->algo, work, (size_t)WORKSPACE_BYTES, stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
        /* nothing was queued: the geometry is remembered as one without a
         * plan, and this call takes the other path */
        p->ok = false;
        return false;
    }
    *routine = epi_routine(epi, tf32);
    *st = s == CUBLAS_STATUS_SUCCESS ? CT_OK : blas_fail(g->op, g->dev, "cublasLtMatmul", s);
    return true;
}

/* Whether a and b are the same elements in the same layout. */
static bool same_view(const ct_tensor *a, const ct_tensor *b) {
    if (cti_data(a) != cti_data(b) || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d]))
            return false;
    return true;
}

/* out <- beta * input, for a product with k = 0 (or beta's share of addmm). */
static ct_status scaled_input(const char *op, ct_tensor *out, ct_tensor *input, double beta) {
    ct_status st = device_copy(out, input);
    if (st != CT_OK || beta == 1) return st;
    ct_tensor *s = cti_tensor_new(op, 0, NULL, CT_F64, CT_CPU);
    if (!s) return ct_last_status();
    *(double *)cti_data(s) = beta;
    cti_pointwise_params p = {.alpha = 1, .ialpha = 1}; /* what ct_mul passes */
    /* s is a CPU scalar: the elementwise kernel takes it by value */
    st = cti_dispatch_one(CT_OP_MUL, &p, sizeof p, 2, (ct_tensor *[]){out, s}, out,
                          out->storage->device, out->dtype);
    ct_tensor_release(s);
    return st;
}

static ct_status zero(const char *op, ct_tensor *out, int dev, cudaStream_t stream) {
    int64_t n = cti_numel(out->ndim, out->shape);
    cudaError_t e = cudaMemsetAsync(cti_data(out), 0, (size_t)n * ct_dtype_size(out->dtype), stream);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "cudaMemsetAsync", e);
    return cti_cuda_launched(op, dev, "zero");
}

/* in[ia] [batch..., n, k] times in[ia + 1] [batch..., k, m] into out[0];
 * input (addmm) scaled by beta is added. */
static ct_status k_gemm_call(ct_call *call, int ia, ct_tensor *input, double beta, double alpha) {
    char label[48];
    const char *op = cti_cuda_op_label(call->op, label, sizeof label);
    ct_tensor *a = call->in[ia], *b = call->in[ia + 1], *o = call->out[0];
    gemm g;
    gemm_sizes(&g, op, a, b, o, o->ndim - 2);
    g.alpha = alpha;
    g.beta = input ? beta : 0;
    int64_t nbatch = 1;
    for (int d = 0; d < g.nb; d++) nbatch *= g.bshape[d];
    if (g.n == 0 || g.m == 0 || nbatch == 0) {
        call->routine = "none (empty result)";
        return CT_OK;
    }
    if (g.n > INT_MAX || g.k > INT_MAX || g.m > INT_MAX)
        return cti_error(CT_ERR_OVERFLOW,
                         "%s: sizes n=%lld, k=%lld, m=%lld exceed cuBLAS's 32-bit int", op,
                         (long long)g.n, (long long)g.k, (long long)g.m);
    cudaStream_t stream;
    if (cti_cuda_begin(op, g.dev, &stream) != CT_OK) return ct_last_status();
    bool with_input = input && g.beta != 0;
    if (g.k == 0) {
        call->routine = with_input ? "copy+scale (k = 0)" : "cudaMemsetAsync (k = 0)";
        return with_input ? scaled_input(op, o, input, g.beta) : zero(op, o, g.dev, stream);
    }

    ct_tensor *pa = NULL, *pb = NULL, *work = NULL;
    ct_status st = CT_OK;
    if (!blas_layout(g.n, g.k, a->stride[g.nb], a->stride[g.nb + 1], &g.ta, &g.lda)) {
        if (!(pa = packed(op, a))) return ct_last_status();
        a = pa;
        blas_layout(g.n, g.k, a->stride[g.nb], a->stride[g.nb + 1], &g.ta, &g.lda);
    }
    if (!blas_layout(g.k, g.m, b->stride[g.nb], b->stride[g.nb + 1], &g.tb, &g.ldb)) {
        if (!(pb = packed(op, b))) st = ct_last_status();
        else {
            b = pb;
            blas_layout(g.k, g.m, b->stride[g.nb], b->stride[g.nb + 1], &g.tb, &g.ldb);
        }
    }
    g.a = mat_of(a, g.nb);
    g.b = mat_of(b, g.nb);
    g.c = mat_of(o, g.nb);
    g.ldc = g.n <= 1 ? g.m : g.c.rs;
    merge_batch(&g);
    bool bias = st == CT_OK && with_input && bias_row(&g, input);
    if (st == CT_OK && !(work = workspace(&g))) st = ct_last_status();
    if (st == CT_OK) {
        cublasHandle_t h = NULL;
        blas_dev *d = blas_lock(&g, stream, &h, &st);
        bool tf32 = g.dt == CT_F32 && ct_allow_tf32();
        bool done = false;
        if (st == CT_OK && bias)
            done = run_lt_gemm(d, &g, tf32, EPI_BIAS, cti_data(input), cti_data(work), stream,
                               &call->routine, &st);
        /* an input that is the output itself (an accumulation in place) needs no copy */
        if (st == CT_OK && !done && with_input && !same_view(input, o)) st = device_copy(o, input);
        if (st == CT_OK && !done) {
            cublasStatus_t s = cublasSetWorkspace(h, cti_data(work), (size_t)WORKSPACE_BYTES);
            if (s != CUBLAS_STATUS_SUCCESS) st = blas_fail(op, g.dev, "cublasSetWorkspace", s);
        }
        if (st == CT_OK && !done) st = run_gemm(&g, h, tf32, &call->routine);
        pthread_mutex_unlock(&d->lock);
        if (st == CT_OK) st = cti_cuda_launched(op, g.dev, ct_op_name(call->op));
    }
    if (st == CT_OK && (pa || pb))
        call->routine = pa && pb ? "copy A, B + cuBLAS" : pa ? "copy A + cuBLAS" : "copy B + cuBLAS";
    ct_tensor_release(work); /* its reuse is ordered after the GEMM on the stream */
    ct_tensor_release(pa);
    ct_tensor_release(pb);
    return st;
}

/* mm: in[0] [n, k], in[1] [k, m]; bmm: the same with batch dims. */
static ct_status k_gemm(ct_call *c) {
    const cti_gemm_params *p = CTI_PARAMS(c, cti_gemm_params);
    return k_gemm_call(c, 0, NULL, p->beta, p->alpha);
}

/* addmm: in[0] the input broadcast to [n, m], in[1] [n, k], in[2] [k, m]. */
static ct_status k_addmm(ct_call *c) {
    const cti_gemm_params *p = CTI_PARAMS(c, cti_gemm_params);
    return k_gemm_call(c, 1, c->in[0], p->beta, p->alpha);
}

/* ---- linear's weight and bias gradients ------------------------------------------------- */

/* g for the 2-d product a [n, k] @ b [k, m] into o ([n, m], rows
 * contiguous) when an epilogue can run on it as it lies: a float dtype of
 * cuBLASLt's epilogues, no empty dim, 32-bit sizes, operands cuBLAS reads
 * without a copy. False: the call takes the composite path. */
static bool epilogue_gemm(const char *op, ct_tensor *a, ct_tensor *b, ct_tensor *o, gemm *g) {
    gemm_sizes(g, op, a, b, o, 0);
    if (g->dt != CT_F32 && g->dt != CT_F16 && g->dt != CT_BF16) return false;
    if (g->n == 0 || g->k == 0 || g->m == 0 || g->n > INT_MAX || g->k > INT_MAX || g->m > INT_MAX)
        return false;
    if (!blas_layout(g->n, g->k, a->stride[0], a->stride[1], &g->ta, &g->lda) ||
        !blas_layout(g->k, g->m, b->stride[0], b->stride[1], &g->tb, &g->ldb))
        return false;
    g->a = mat_of(a, 0);
    g->b = mat_of(b, 0);
    g->c = mat_of(o, 0);
    g->ldc = g->n <= 1 ? g->m : g->c.rs;
    return g->m <= 1 || o->stride[1] == 1;
}

/* Runs g through cuBLASLt with epilogue epi for call c: *done false, and
 * nothing queued, when cuBLASLt has no algorithm for it. */
static ct_status run_epilogue(ct_call *c, gemm *g, lt_epi epi, void *vec, bool *done) {
    *done = false;
    cudaStream_t stream;
    if (cti_cuda_begin(g->op, g->dev, &stream) != CT_OK) return ct_last_status();
    ct_tensor *work = workspace(g);
    if (!work) return ct_last_status();
    cublasHandle_t h = NULL;
    ct_status st;
    blas_dev *d = blas_lock(g, stream, &h, &st);
    bool tf32 = g->dt == CT_F32 && ct_allow_tf32();
    if (st == CT_OK)
        *done = run_lt_gemm(d, g, tf32, epi, vec, cti_data(work), stream, &c->routine, &st);
    pthread_mutex_unlock(&d->lock);
    if (st == CT_OK && *done) st = cti_cuda_launched(g->op, g->dev, ct_op_name(c->op));
    ct_tensor_release(work); /* its reuse is ordered after the GEMM on the stream */
    return st;
}

/* LINEAR_BACKWARD_WEIGHT: in[0] a [n, k] (grad_y^T), in[1] [k, m]. Both
 * gradients asked, in one dtype (float32 from float16/bfloat16 operands when
 * both are widened), a packed bias gradient: one GEMM whose bias-gradient
 * epilogue sums a's rows as it reads them (cuBLASLt's B, summed over k: the
 * operands go in swapped). Else, or without an algorithm, the composite. */
static ct_status k_linear_backward_weight(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    ct_tensor *db = c->out[1];
    gemm g;
    if (c->out[0] && db && db->dtype == c->out[0]->dtype &&
        (db->shape[0] <= 1 || db->stride[0] == 1) &&
        epilogue_gemm(op, c->in[0], c->in[1], c->out[0], &g) && lt_operands(&g, cti_data(db))) {
        bool done;
        ct_status st = run_epilogue(c, &g, EPI_BGRADB, cti_data(db), &done);
        if (st != CT_OK || done) return st;
    }
    return cti_compose_linear_backward_weight(c);
}

void cti_cuda_register_blas(void) {
    static const struct {
        ct_dtype dt;
        const char *name;
    } kinds[] = {{CT_F32, "cublasGemmEx"},
                 {CT_F64, "cublasGemmEx"},
                 {CT_F16, "cublasGemmEx"},
                 {CT_BF16, "cublasGemmEx"}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        cti_register_kernel(CT_OP_MM, CT_DEVICE_CUDA, kinds[i].dt, k_gemm, kinds[i].name);
        cti_register_kernel(CT_OP_BMM, CT_DEVICE_CUDA, kinds[i].dt, k_gemm, kinds[i].name);
        cti_register_kernel(CT_OP_ADDMM, CT_DEVICE_CUDA, kinds[i].dt, k_addmm, kinds[i].name);
        cti_register_kernel(CT_OP_LINEAR_BACKWARD_WEIGHT, CT_DEVICE_CUDA, kinds[i].dt,
                            k_linear_backward_weight, kinds[i].name);
        cti_register_kernel(CT_OP_LINEAR_GELU, CT_DEVICE_CUDA, kinds[i].dt,
                            cti_compose_linear_gelu, "composite: gemm, gelu");
    }
}
