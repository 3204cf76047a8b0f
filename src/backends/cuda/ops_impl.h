/* Private to the CUDA backend: the launch records of the compute kernels
 * (elementwise, reductions, random fills, ranges). The C files turn a ct_call
 * into one of these records; the .cu files launch from it. Like cuda_impl.h's
 * first part, nothing here names a ct_tensor, so nvcc can read it. */
#ifndef CTEN_CUDA_OPS_IMPL_H
#define CTEN_CUDA_OPS_IMPL_H

#include "cuda_impl.h"
#include "tensor/dispatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise (elementwise.cu) ----------------------------------------------------------- */
#define CTI_EW_MAX_IN 3

/* How an input reaches the kernel: an array of the kernel's dtype, one value
 * passed by value (a CPU 0-d tensor read on the host), or one element in
 * device memory of any dtype (a 0-d or broadcast single-element tensor). */
enum { CTI_EW_ARRAY = 0, CTI_EW_VALUE = 1, CTI_EW_DEVSCALAR = 2 };

typedef struct cti_cuda_ew {
    int op;         /* ct_op */
    ct_dtype dtype; /* the dispatch dtype: the storage of ARRAY inputs (WHERE: of in[1], in[2]) */
    int nin;
    void *out;
    const void *in[CTI_EW_MAX_IN];
    int mode[CTI_EW_MAX_IN];
    int sdt[CTI_EW_MAX_IN];        /* DEVSCALAR: the element's ct_dtype */
    double dval[CTI_EW_MAX_IN];    /* VALUE: the value, and as an integer */
    int64_t ival[CTI_EW_MAX_IN];
    double f0, f1;                 /* the call's f[0], f[1] (alpha or min, max) */
    int64_t i0, i1;                /* the call's i[0], i[1] */
    int64_t n;                     /* output elements */
    bool contiguous;               /* out and every ARRAY input contiguous, n elements */
    const cti_cuda_iter *it;       /* otherwise: operand 0 out, operand k+1 in[k] */
} cti_cuda_ew;

/* Whether a kernel exists for (op, dtype): the same pairs the CPU backend
 * registers. */
bool cti_cuda_ew_supported(int op, ct_dtype dtype);
/* Queues the op; *routine receives the variant launched (static string). */
cudaError_t cti_cuda_elementwise(const cti_cuda_ew *a, int sm_count, cudaStream_t stream,
                                 const char **routine);

/* ---- reductions (reduce.cu) ---------------------------------------------------------------- */
enum { CTI_RED_SUM, CTI_RED_MEAN, CTI_RED_PROD, CTI_RED_VAR, CTI_RED_NORM, CTI_RED_MAX,
       CTI_RED_MIN, CTI_RED_ARGMAX, CTI_RED_ARGMIN };

typedef struct cti_cuda_red {
    int kind;       /* CTI_RED_* (ARGMAX/ARGMIN also for max/min with indices) */
    ct_dtype dt;    /* x's dtype */
    ct_dtype odt;   /* the values' dtype (unused for argmax/argmin) */
    const void *x;
    void *out;      /* values, contiguous over the outputs (NULL: none) */
    int64_t *idx;   /* indices, same layout (NULL: none) */
    int nk, nr;     /* kept and reduced dims, outermost first */
    int64_t ksh[CT_MAX_DIMS], kst[CT_MAX_DIMS]; /* strides in elements */
    int64_t rsh[CT_MAX_DIMS], rst[CT_MAX_DIMS];
    int64_t O, R;   /* outputs, elements per output */
    double p;       /* NORM: p; VAR: the correction */
    bool want_std;
    void *work;     /* partial results when split (cti_cuda_reduce_plan's bytes) */
} cti_cuda_red;

/* Bytes of scratch the launch needs (0: none); a pure function of the shapes. */
size_t cti_cuda_reduce_work(const cti_cuda_red *r);
cudaError_t cti_cuda_reduce(const cti_cuda_red *r, cudaStream_t stream, const char **routine);

/* ---- random fills and ranges (random.cu) -------------------------------------------------------
 * The CPU backend's draw layout (src/backends/cpu/copy.c): element k of a
 * contiguous output uses Philox draws first + k*D ... (normal: per pair). */
enum { CTI_RNG_UNIFORM, CTI_RNG_NORMAL, CTI_RNG_RANDINT };

cudaError_t cti_cuda_random(int kind, void *out, ct_dtype dt, int64_t n, uint64_t seed,
                            uint64_t first, double a, double b, int64_t ilow, uint64_t irange,
                            int sm_count, cudaStream_t stream);
/* out[i] = start + i * step, or linspace's symmetric form when steps > 0
 * (first half from start, second half back from end). */
cudaError_t cti_cuda_range(void *out, ct_dtype dt, int64_t n, double start, double step,
                           double end, int64_t steps, bool linspace, int sm_count,
                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
