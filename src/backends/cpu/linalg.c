/* CPU kernels for mm, bmm and addmm: one GEMM loop over OpenBLAS. The fused
 * ops around linear layers (linear_backward_weight, linear_gelu, linear_dgelu)
 * run the composite kernels of src/dispatch/compose.c, which call these.
 *
 * f32 goes to cblas_sgemm and f64 to cblas_dgemm. An operand whose strides
 * BLAS can read directly (row-major with a leading dimension, or its
 * transpose) is passed as it is, through the transpose flag and the leading
 * dimension; only other layouts (element steps in both dims, broadcast rows)
 * are packed into a contiguous scratch matrix first. f16 and bf16 are widened
 * to f32 (products of two such values are exact in f32), multiplied with
 * cblas_sgemm and rounded once into the output.
 *
 * Per batch, with cti_gemm_params' beta and alpha:
 *   out[i][j] = beta * input[i][j] + alpha * sum_l A[i][l] B[l][j]
 * beta == 0 never reads the input; mm and bmm have none (their front ends
 * pass beta 0, alpha 1).
 *
 * All three ops share one shape: in[A] [batch..., n, k], in[B] [batch..., k, m]
 * and out [batch..., n, m] with the same batch dims (broadcast batch dims carry
 * stride 0, so an operand shared by every batch is never copied). The output
 * was allocated contiguous by the front end. addmm adds in[0], the input
 * already broadcast to [n, m] (strides 0 where it broadcasts).
 *
 * BLAS runs on the calling thread only (OpenBLAS has its own threads), never
 * inside a pool task. */
#include <cblas.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

typedef struct {
    char *p;                  /* element [0, 0] of the first matrix */
    int64_t rs, cs;           /* row and column strides, elements */
    int64_t bs[CT_MAX_DIMS];  /* batch strides, elements */
} mat;

typedef struct {
    ct_dtype dt;  /* the operands' */
    bool wide;    /* f16/bf16 operands, an f32 output: the accumulators stored unrounded */
    int64_t n, k, m;
    int nb; /* batch dims */
    int64_t bshape[CT_MAX_DIMS];
    mat a, b, c, in;
    bool has_in;
    double alpha, beta;
} gemm_job;

static mat mat_of(const ct_tensor *t, int nb) {
    mat x = {0};
    x.p = cti_data(t);
    x.rs = t->stride[nb];
    x.cs = t->stride[nb + 1];
    for (int i = 0; i < nb; i++) x.bs[i] = t->stride[i];
    return x;
}

/* How BLAS can read a rows x cols matrix with strides (rs, cs) in place:
 * row-major with leading dimension ld (NoTrans), or as the transpose of a
 * row-major matrix (Trans). A dim of size 1 has no stride to respect. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                        CBLAS_TRANSPOSE *tr, int64_t *ld) {
    int64_t min_nt = cols > 1 ? cols : 1, min_t = rows > 1 ? rows : 1;
    if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= min_nt)) {
        *tr = CblasNoTrans;
        *ld = rows <= 1 ? min_nt : rs;
    } else if ((rows <= 1 || rs == 1) && (cols <= 1 || cs >= min_t)) {
        *tr = CblasTrans;
        *ld = cols <= 1 ? min_t : cs;
    } else {
        return false;
    }
    return *ld <= INT_MAX;
}

/* ---- low-precision conversions (inline: they run once per element) ------- */
#ifdef __FLT16_MAX__
static inline float f16_to_f32(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, sizeof x);
    return (float)x;
}
static inline uint16_t f32_to_f16(float f) {
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, sizeof h);
    return h;
}
#else
static inline float f16_to_f32(uint16_t h) { return cti_f16_to_f32(h); }
static inline uint16_t f32_to_f16(float f) { return cti_f32_to_f16(f); }
#endif

static inline float load_f32(ct_dtype dt, const char *base, int64_t i) {
    switch (dt) {
    case CT_F16: return f16_to_f32(((const uint16_t *)base)[i]);
    case CT_BF16: return cti_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

/* ---- packing: strided matrix -> contiguous rows x cols ------------------- */
static void pack_f32(const float *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols,
                     float *restrict dst) {
    for (int64_t i = 0; i < rows; i++) {
        const float *r = src + i * rs;
        float *restrict o = dst + i * cols;
        if (cs == 1) memcpy(o, r, (size_t)cols * sizeof *o);
        else for (int64_t j = 0; j < cols; j++) o[j] = r[j * cs];
    }
}
static void pack_f64(const double *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols,
                     double *restrict dst) {
    for (int64_t i = 0; i < rows; i++) {
        const double *r = src + i * rs;
        double *restrict o = dst + i * cols;
        if (cs == 1) memcpy(o, r, (size_t)cols * sizeof *o);
        else for (int64_t j = 0; j < cols; j++) o[j] = r[j * cs];
    }
}
/* f16/bf16 widened to f32. */
static void pack_widen(ct_dtype dt, const uint16_t *src, int64_t rs, int64_t cs, int64_t rows,
                       int64_t cols, float *restrict dst) {
    for (int64_t i = 0; i < rows; i++) {
        const uint16_t *r = src + i * rs;
        float *restrict o = dst + i * cols;
        if (dt == CT_BF16)
            for (int64_t j = 0; j < cols; j++) o[j] = cti_bf16_to_f32(r[j * cs]);
        else
            for (int64_t j = 0; j < cols; j++) o[j] = f16_to_f32(r[j * cs]);
    }
}
static void pack(ct_dtype dt, const char *src, int64_t rs, int64_t cs, int64_t rows,
                 int64_t cols, void *dst) {
    switch (dt) {
    case CT_F32: pack_f32((const float *)src, rs, cs, rows, cols, dst); break;
    case CT_F64: pack_f64((const double *)src, rs, cs, rows, cols, dst); break;
    default: pack_widen(dt, (const uint16_t *)src, rs, cs, rows, cols, dst); break;
    }
}

/* C (n x m, leading dimension ldc, f64 when dt is f64, else f32) =
 * beta * input; beta == 0 never reads the input, so NaNs there vanish as in
 * PyTorch. */
static void prefill(ct_dtype dt, const char *in, int64_t rs, int64_t cs, int64_t n, int64_t m,
                    double beta, void *c, int64_t ldc) {
    size_t es = dt == CT_F64 ? sizeof(double) : sizeof(float);
    if (beta == 0) {
        for (int64_t i = 0; i < n; i++)
            memset((char *)c + i * ldc * (int64_t)es, 0, (size_t)m * es);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *r = in + i * rs * (int64_t)ct_dtype_size(dt);
        if (dt == CT_F64) {
            double *restrict o = (double *)c + i * ldc;
            const double *x = (const double *)r;
            for (int64_t j = 0; j < m; j++) o[j] = beta * x[j * cs];
        } else {
            float *restrict o = (float *)c + i * ldc;
            float fb = (float)beta;
            if (dt == CT_F32)
                for (int64_t j = 0; j < m; j++) o[j] = fb * ((const float *)r)[j * cs];
            else
                for (int64_t j = 0; j < m; j++) o[j] = fb * load_f32(dt, r, j * cs);
        }
    }
}

/* Rounds an f32 n x m block into the f16/bf16 output rows. */
static void store_narrow(ct_dtype dt, const float *src, int64_t n, int64_t m, uint16_t *out,
                         int64_t ldo) {
    for (int64_t i = 0; i < n; i++) {
        const float *s = src + i * m;
        uint16_t *restrict o = out + i * ldo;
        if (dt == CT_BF16)
            for (int64_t j = 0; j < m; j++) o[j] = cti_f32_to_bf16(s[j]);
        else
            for (int64_t j = 0; j < m; j++) o[j] = f32_to_f16(s[j]);
    }
}

/* ---- the batched product ----------------------------------------------------- */
typedef struct {
    CBLAS_TRANSPOSE ta, tb;
    int64_t lda, ldb, ldc;
    bool pack_a, pack_b;
    void *abuf, *bbuf; /* packed operands (when pack_*) */
    float *cbuf;       /* f32 result for f16/bf16 */
} gemm_plan;

static void gemm_call(ct_dtype dt, const gemm_job *j, const gemm_plan *pl, const void *a,
                      const void *b, void *c, int64_t ldc, double beta) {
    int n = (int)j->n, k = (int)j->k, m = (int)j->m;
    if (dt == CT_F64)
        cblas_dgemm(CblasRowMajor, pl->ta, pl->tb, n, m, k, j->alpha, a, (int)pl->lda, b,
                    (int)pl->ldb, beta, c, (int)ldc);
    else
        cblas_sgemm(CblasRowMajor, pl->ta, pl->tb, n, m, k, (float)j->alpha, a, (int)pl->lda, b,
                    (int)pl->ldb, (float)beta, c, (int)ldc);
}

/* One product of the batch; a, b, c, in point at this batch's matrices. */
static void gemm_one(const gemm_job *j, gemm_plan *pl, const char *a, const char *b, char *c,
                     const char *in, const char **last_a, const char **last_b) {
    ct_dtype dt = j->dt;
    /* f16/bf16 products are f32 ones, rounded into the output unless it is f32 */
    bool narrow = (dt == CT_F16 || dt == CT_BF16) && !j->wide;
    int64_t n = j->n, k = j->k, m = j->m;
    /* A broadcast operand repeats its pointer: pack it once. */
    if (pl->pack_a && k > 0 && a != *last_a) pack(dt, a, j->a.rs, j->a.cs, n, k, pl->abuf);
    if (pl->pack_b && k > 0 && b != *last_b) pack(dt, b, j->b.rs, j->b.cs, k, m, pl->bbuf);
    *last_a = a;
    *last_b = b;

    void *cw = narrow ? (void *)pl->cbuf : (void *)c;
    int64_t ldw = narrow ? m : pl->ldc;
    bool with_input = j->has_in && j->beta != 0;
    if (with_input || k == 0)
        prefill(dt, in, j->in.rs, j->in.cs, n, m, with_input ? j->beta : 0.0, cw, ldw);
    if (k > 0)
        gemm_call(dt == CT_F64 ? dt : CT_F32, j, pl, pl->pack_a ? pl->abuf : a,
                  pl->pack_b ? pl->bbuf : b, cw, ldw, with_input ? 1.0 : 0.0);
    if (narrow) store_narrow(dt, pl->cbuf, n, m, (uint16_t *)c, pl->ldc);
}

static const char *routine_name(ct_dtype dt, bool pack_a, bool pack_b) {
    static const char *f32[] = {"cblas_sgemm", "copy A + cblas_sgemm", "copy B + cblas_sgemm",
                                "copy A, B + cblas_sgemm"};
    static const char *f64[] = {"cblas_dgemm", "copy A + cblas_dgemm", "copy B + cblas_dgemm",
                                "copy A, B + cblas_dgemm"};
    int i = (pack_a ? 1 : 0) | (pack_b ? 2 : 0);
    switch (dt) {
    case CT_F32: return f32[i];
    case CT_F64: return f64[i];
    case CT_F16: return "f16->f32 cblas_sgemm";
    default: return "bf16->f32 cblas_sgemm";
    }
}

static ct_status run_job(ct_call *call, const gemm_job *j) {
    ct_dtype dt = j->dt;
    bool narrow = dt == CT_F16 || dt == CT_BF16; /* operands packed into f32 */
    /* cti_numel: an empty result's batch sizes may multiply past int64. */
    int64_t n = j->n, k = j->k, m = j->m, nbatch = cti_numel(j->nb, j->bshape);
    if (n == 0 || m == 0 || nbatch == 0) {
        call->routine = "none (empty result)";
        return CT_OK;
    }
    if (n > INT_MAX || k > INT_MAX || m > INT_MAX)
        return cti_error(CT_ERR_OVERFLOW,
                         "ct_%s: sizes n=%lld, k=%lld, m=%lld exceed BLAS's 32-bit int",
                         ct_op_name(call->op), (long long)n, (long long)k, (long long)m);

    gemm_plan pl = {0};
    pl.ldc = n <= 1 ? m : j->c.rs;
    pl.pack_a = narrow || !blas_layout(n, k, j->a.rs, j->a.cs, &pl.ta, &pl.lda);
    pl.pack_b = narrow || !blas_layout(k, m, j->b.rs, j->b.cs, &pl.tb, &pl.ldb);
    if (pl.pack_a) {
        pl.ta = CblasNoTrans;
        pl.lda = k > 1 ? k : 1;
    }
    if (pl.pack_b) {
        pl.tb = CblasNoTrans;
        pl.ldb = m;
    }
    size_t ws = narrow ? sizeof(float) : ct_dtype_size(dt);
    bool ok = true;
    if (pl.pack_a && k > 0) ok = ok && (pl.abuf = malloc((size_t)(n * k) * ws));
    if (pl.pack_b && k > 0) ok = ok && (pl.bbuf = malloc((size_t)(k * m) * ws));
    if (narrow && !j->wide) ok = ok && (pl.cbuf = malloc((size_t)(n * m) * sizeof(float)));
    if (!ok) {
        free(pl.abuf);
        free(pl.bbuf);
        free(pl.cbuf);
        return cti_error(CT_ERR_OOM, "ct_%s: out of memory for %lld x %lld scratch matrices",
                         ct_op_name(call->op), (long long)n, (long long)(k > m ? k : m));
    }
    call->routine = k == 0 ? "fill (k = 0)" : routine_name(dt, pl.pack_a, pl.pack_b);

    int64_t es = (int64_t)ct_dtype_size(dt), oes = j->wide ? (int64_t)sizeof(float) : es;
    int64_t idx[CT_MAX_DIMS] = {0};
    int64_t oa = 0, ob = 0, oc = 0;
    const char *last_a = NULL, *last_b = NULL;
    for (int64_t t = 0; t < nbatch; t++) {
        gemm_one(j, &pl, j->a.p + oa * es, j->b.p + ob * es, j->c.p + oc * oes,
                 j->in.p, &last_a, &last_b);
        for (int d = j->nb - 1; d >= 0; d--) {
            oa += j->a.bs[d];
            ob += j->b.bs[d];
            oc += j->c.bs[d];
            if (++idx[d] < j->bshape[d]) break;
            oa -= j->a.bs[d] * j->bshape[d];
            ob -= j->b.bs[d] * j->bshape[d];
            oc -= j->c.bs[d] * j->bshape[d];
            idx[d] = 0;
        }
    }
    free(pl.abuf);
    free(pl.bbuf);
    free(pl.cbuf);
    return CT_OK;
}

/* in[ia] [batch..., n, k], in[ia + 1] [batch..., k, m], out[0] [batch..., n, m]. */
static gemm_job job_of(const ct_call *c, int ia) {
    const cti_gemm_params *p = CTI_PARAMS(c, cti_gemm_params);
    const ct_tensor *a = c->in[ia], *b = c->in[ia + 1], *o = c->out[0];
    gemm_job j;
    memset(&j, 0, sizeof j);
    j.dt = a->dtype;
    j.wide = o->dtype == CT_F32 && (a->dtype == CT_F16 || a->dtype == CT_BF16);
    j.nb = o->ndim - 2;
    for (int d = 0; d < j.nb; d++) j.bshape[d] = o->shape[d];
    j.n = a->shape[j.nb];
    j.k = a->shape[j.nb + 1];
    j.m = b->shape[j.nb + 1];
    j.a = mat_of(a, j.nb);
    j.b = mat_of(b, j.nb);
    j.c = mat_of(o, j.nb);
    j.beta = p->beta;
    j.alpha = p->alpha;
    return j;
}

/* mm: in[0] [n, k], in[1] [k, m]; bmm: the same with batch dims. */
static ct_status k_gemm(ct_call *c) {
    gemm_job j = job_of(c, 0);
    return run_job(c, &j);
}

/* addmm: in[0] the input broadcast to [n, m], in[1] [n, k], in[2] [k, m]. */
static ct_status k_addmm(ct_call *c) {
    gemm_job j = job_of(c, 1);
    j.has_in = true;
    j.in = mat_of(c->in[0], 0);
    return run_job(c, &j);
}

/* ---- integer products (int32, int64: PyTorch's CPU mm/bmm/matmul) ---------------------
 * BLAS has no integer GEMM, so this is a blocked kernel of its own: tasks take
 * blocks of IB rows of one batch's product, and walk k in KB steps and the
 * columns in JB steps, copying each KB x JB block of B into a contiguous tile
 * (so any strides, broadcasts included, read as rows), then for each row and
 * each k of the block add a * B-row into the output row: the innermost loop
 * is a contiguous multiply-add over JB columns that the compiler
 * vectorizes. Arithmetic is in the unsigned type of the element's width, so
 * an overflow wraps as PyTorch's (two's complement) without undefined
 * behaviour. */
enum { INT_IB = 32, INT_KB = 128, INT_JB = 256 };

typedef struct {
    const gemm_job *j;
    int64_t nblk; /* row blocks per batch */
    atomic_int failed;
} int_gemm_ctx;

/* Element offsets of batch t's matrices. */
static void batch_offsets(const gemm_job *j, int64_t t, int64_t *oa, int64_t *ob, int64_t *oc) {
    *oa = *ob = *oc = 0;
    for (int d = j->nb - 1; d >= 0; d--) {
        int64_t i = t % j->bshape[d];
        t /= j->bshape[d];
        *oa += i * j->a.bs[d];
        *ob += i * j->b.bs[d];
        *oc += i * j->c.bs[d];
    }
}

#define INT_GEMM_BLOCK(NAME, U)                                                              \
    static void NAME(const gemm_job *j, const U *a, const U *b, U *c, int64_t r0, int64_t r1, \
                     U *tile) {                                                               \
        for (int64_t i = r0; i < r1; i++)                                                    \
            memset(c + i * j->c.rs, 0, (size_t)j->m * sizeof(U));                            \
        for (int64_t l0 = 0; l0 < j->k; l0 += INT_KB) {                                      \
            int64_t kb = j->k - l0 < INT_KB ? j->k - l0 : INT_KB;                            \
            for (int64_t c0 = 0; c0 < j->m; c0 += INT_JB) {                                  \
                int64_t jb = j->m - c0 < INT_JB ? j->m - c0 : INT_JB;                        \
                for (int64_t l = 0; l < kb; l++) {                                           \
                    const U *br = b + (l0 + l) * j->b.rs + c0 * j->b.cs;                     \
                    for (int64_t q = 0; q < jb; q++) tile[l * jb + q] = br[q * j->b.cs];     \
                }                                                                            \
                for (int64_t i = r0; i < r1; i++) {                                          \
                    U *restrict cr = c + i * j->c.rs + c0;                                   \
                    const U *ar = a + i * j->a.rs + l0 * j->a.cs;                            \
                    for (int64_t l = 0; l < kb; l++) {                                       \
                        const U av = ar[l * j->a.cs];                                        \
                        const U *restrict tr = tile + l * jb;                                \
                        for (int64_t q = 0; q < jb; q++) cr[q] += av * tr[q];                \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }
INT_GEMM_BLOCK(int_gemm_block_u32, uint32_t)
INT_GEMM_BLOCK(int_gemm_block_u64, uint64_t)
#undef INT_GEMM_BLOCK

static void int_gemm_task(int64_t begin, int64_t end, void *vctx) {
    int_gemm_ctx *x = vctx;
    const gemm_job *j = x->j;
    size_t es = ct_dtype_size(j->dt);
    void *tile = malloc((size_t)INT_KB * INT_JB * es);
    if (!tile) {
        atomic_store(&x->failed, 1);
        return;
    }
    for (int64_t t = begin; t < end; t++) {
        int64_t batch = t / x->nblk, r0 = t % x->nblk * INT_IB;
        int64_t r1 = r0 + INT_IB < j->n ? r0 + INT_IB : j->n;
        int64_t oa, ob, oc;
        batch_offsets(j, batch, &oa, &ob, &oc);
        if (j->dt == CT_I32)
            int_gemm_block_u32(j, (const uint32_t *)j->a.p + oa, (const uint32_t *)j->b.p + ob,
                               (uint32_t *)j->c.p + oc, r0, r1, tile);
        else
            int_gemm_block_u64(j, (const uint64_t *)j->a.p + oa, (const uint64_t *)j->b.p + ob,
                               (uint64_t *)j->c.p + oc, r0, r1, tile);
    }
    free(tile);
}

/* mm, bmm of int32/int64 (the output is contiguous, its rows m apart). */
static ct_status k_gemm_int(ct_call *c) {
    gemm_job j = job_of(c, 0);
    int64_t nbatch = cti_numel(j.nb, j.bshape);
    if (j.n == 0 || j.m == 0 || nbatch == 0) {
        c->routine = "none (empty result)";
        return CT_OK;
    }
    int_gemm_ctx x = {.j = &j, .nblk = (j.n + INT_IB - 1) / INT_IB};
    atomic_init(&x.failed, 0);
    c->routine = "blocked integer gemm";
    /* a task of about 2^16 multiply-adds at least */
    int64_t work = INT_IB * (j.k > 0 ? j.k : 1) * j.m;
    cti_parallel_for(nbatch * x.nblk, work >= 65536 ? 1 : 65536 / work, int_gemm_task, &x);
    if (atomic_load(&x.failed))
        return cti_error(CT_ERR_OOM, "ct_%s: out of memory for a %d x %d tile",
                         ct_op_name(c->op), INT_KB, INT_JB);
    return CT_OK;
}

void cti_cpu_register_linalg(void) {
    cti_register_kernel(CT_OP_MM, CT_DEVICE_CPU, CT_I32, k_gemm_int, "blocked integer gemm");
    cti_register_kernel(CT_OP_MM, CT_DEVICE_CPU, CT_I64, k_gemm_int, "blocked integer gemm");
    cti_register_kernel(CT_OP_BMM, CT_DEVICE_CPU, CT_I32, k_gemm_int, "blocked integer gemm");
    cti_register_kernel(CT_OP_BMM, CT_DEVICE_CPU, CT_I64, k_gemm_int, "blocked integer gemm");
    static const struct {
        ct_dtype dt;
        const char *name;
    } kinds[] = {{CT_F32, "cblas_sgemm"},
                 {CT_F64, "cblas_dgemm"},
                 {CT_F16, "f16->f32 cblas_sgemm"},
                 {CT_BF16, "bf16->f32 cblas_sgemm"}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        cti_register_kernel(CT_OP_MM, CT_DEVICE_CPU, kinds[i].dt, k_gemm, kinds[i].name);
        cti_register_kernel(CT_OP_BMM, CT_DEVICE_CPU, kinds[i].dt, k_gemm, kinds[i].name);
        cti_register_kernel(CT_OP_ADDMM, CT_DEVICE_CPU, kinds[i].dt, k_addmm, kinds[i].name);
        /* no fused kernels: the GEMM's, GELU's and the row sum's in turn (the
         * reduction kernel accumulates halves in float32, as the GEMM does) */
        cti_register_kernel(CT_OP_LINEAR_BACKWARD_WEIGHT, CT_DEVICE_CPU, kinds[i].dt,
                            cti_compose_linear_backward_weight, "composite: gemm, sum");
        cti_register_kernel(CT_OP_LINEAR_GELU, CT_DEVICE_CPU, kinds[i].dt,
                            cti_compose_linear_gelu, "composite: gemm, gelu");
        cti_register_kernel(CT_OP_LINEAR_DGELU, CT_DEVICE_CPU, kinds[i].dt,
                            cti_compose_linear_dgelu, "composite: gemm, gelu_backward, sum");
    }
}
