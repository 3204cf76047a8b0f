/* Private to the CUDA backend: the launch records of the compute kernels
 * (elementwise, reductions, random fills, ranges, pooling, norms, optimizer
 * updates, softmax and losses), the one place their C and CUDA sides share. The C files turn a ct_call
 * into one of these records; the .cu files launch from it. Like cuda_impl.h's
 * first part, nothing here names a ct_tensor, so nvcc can read it. */
#ifndef CTEN_CUDA_OPS_IMPL_H
#define CTEN_CUDA_OPS_IMPL_H

#include "../../dispatch/schema.h"
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
    cti_pointwise_params prm;      /* the call's parameters (alpha, clamp's bounds, ...) */
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
    /* SUM in the vector column kernel only (cti_cuda_reduce_vec_columns):
     * when not NULL, x is a gradient overwritten in place by x * gelu'(gelu_x)
     * (gelu_x laid out as x, 16-byte aligned) and those values are summed:
     * LINEAR_DGELU's gelu_backward and row sums in one pass. */
    const void *gelu_x;
    bool gelu_tanh;
} cti_cuda_red;

/* Bytes of scratch the launch needs (0: none); a pure function of the shapes. */
size_t cti_cuda_reduce_work(const cti_cuda_red *r);
/* Whether r runs in the vector column kernel (sums or means over the rows of
 * a matrix with contiguous, 16-byte aligned rows and at least 32 of them). */
bool cti_cuda_reduce_vec_columns(const cti_cuda_red *r);
cudaError_t cti_cuda_reduce(const cti_cuda_red *r, cudaStream_t stream, const char **routine);

/* ---- random fills and ranges (random.cu) -------------------------------------------------------
 * The CPU backend's draw layout (src/backends/cpu/copy.c): element k of a
 * contiguous output uses Philox draws first + k*D ... (normal: per pair).
 * Every random kernel (these, dropout, multinomial, attention's dropout)
 * also takes state: NULL, or (in a CUDA graph, cti_cuda_philox) a device
 * pair whose [0] replaces seed and whose [1] is added to first, read when
 * the kernel runs. */
enum { CTI_RNG_UNIFORM, CTI_RNG_NORMAL, CTI_RNG_RANDINT };

cudaError_t cti_cuda_random(int kind, void *out, ct_dtype dt, int64_t n, uint64_t seed,
                            uint64_t first, const uint64_t *state, double a, double b,
                            int64_t ilow, uint64_t irange, int sm_count, cudaStream_t stream);
/* out[i] = start + i * step, or linspace's symmetric form when steps > 0
 * (first half from start, second half back from end). */
cudaError_t cti_cuda_range(void *out, ct_dtype dt, int64_t n, double start, double step,
                           double end, int64_t steps, bool linspace, int sm_count,
                           cudaStream_t stream);

/* ---- 2-d pooling (pool.cu) -------------------------------------------------------------------- */
enum { CTI_POOL_MAX_FWD, CTI_POOL_MAX_BWD, CTI_POOL_AVG_FWD, CTI_POOL_AVG_BWD, CTI_POOL_ADA_FWD,
       CTI_POOL_ADA_BWD, CTI_POOL_ADA_MAX_FWD };

/* geo: 15 values (N C H W kh kw sh sw ph pw dh dw OH OW count_include_pad),
 * pool.c's copy of the call's cti_pool_params. in: the source (x, or
 * grad_out for the backward kinds) with in_st its NCHW element strides;
 * idx/idx_st: max backward's indices; out: the contiguous result (max
 * backward: acc, the zeroed f32/f64 accumulation target); out_idx: max
 * forward's indices. *routine: the kernel launched. */
cudaError_t cti_cuda_pool2d(int kind, ct_dtype dt, const int64_t *geo, const void *in,
                            const int64_t *in_st, const int64_t *idx, const int64_t *idx_st,
                            void *out, int64_t *out_idx, void *acc, int sm_count,
                            cudaStream_t stream, const char **routine);

/* ---- direct convolution (conv_direct.cu) -------------------------------------------------- */
enum { CTI_CONV_DIRECT_FWD, CTI_CONV_DIRECT_BWD_DATA, CTI_CONV_DIRECT_BWD_BIAS };

/* geo: 16 values (N C H W Co kh kw sh sw ph pw dh dw groups OH OW), conv.c's
 * copy of the call's cti_conv_params (the bias kind: grad_out's sizes).
 * ptr[0..3]: the image X (x or grad_in), the filter W, the result side Y (y
 * or grad_out), the bias (forward: may be NULL; bias kind: the [Co]
 * result); strides[0..2]: the NCHW element strides of X, W, Y. The written
 * operand is contiguous. The forward and input-gradient kinds index in 32
 * bits: every count and offset must fit. Queues one kernel; never waits. */
cudaError_t cti_cuda_conv_direct(int kind, ct_dtype dt, const int64_t *geo,
                                 const void *const *ptr, const int64_t *const *strides,
                                 int64_t bias_stride, int sm_count, cudaStream_t stream);

/* ---- RMSNorm and LayerNorm (norm.cu) ------------------------------------------------------- */
/* Rows of d contiguous elements of dtype dt. Statistics (inv_rms, mean,
 * rstd) are float for f16/bf16/f32 and double for f64, one per row. Every
 * pointer may be NULL where the op allows it (weight, bias, outputs the caller
 * did not ask for). */
typedef struct cti_cuda_norm {
    ct_dtype dt;
    bool layer;          /* layer_norm, else rms_norm */
    int64_t rows, d;
    double eps;          /* forward only */
    const void *x, *w;
    const void *b;       /* forward: the bias (layer_norm) */
    const void *g;       /* backward: grad_y */
    const void *mean;    /* backward: saved mean (layer_norm) */
    const void *rstd;    /* backward: saved inv_rms / rstd */
    void *y;             /* forward: y; backward: dx */
    void *mean_out;      /* forward: mean (layer_norm) */
    void *rstd_out;      /* forward: inv_rms / rstd */
    void *dw, *db;       /* backward: grads of weight and bias */
    void *work;          /* backward: cti_cuda_norm_work bytes when that is > 0 */
    /* add_rms_norm / add_layer_norm (add): the forward reads x (dtype xdt) and res
     * (rdt), writes their sum (dt) to sum and the norm of it to y (ydt); the
     * backward reads g (ydt), gsum (dt, NULL: zero) and the saved sum as x, and
     * writes dx to y (xdt) and the same values to dres (rdt), either NULL. */
    bool add;
    ct_dtype xdt, rdt, ydt;
    const void *res, *gsum;
    void *sum, *dres;
} cti_cuda_norm;

/* Scratch bytes the backward needs for the per-block partial sums of dw and
 * db (0: none); a pure function of the record's shapes, pointers and sm_count. */
size_t cti_cuda_norm_work(const cti_cuda_norm *a, int sm_count);
/* Queue the forward / backward on stream; *routine receives the kernel(s)
 * launched (a static string). They never wait. */
cudaError_t cti_cuda_norm_forward(const cti_cuda_norm *a, int sm_count, cudaStream_t stream,
                                  const char **routine);
cudaError_t cti_cuda_norm_backward(const cti_cuda_norm *a, int sm_count, cudaStream_t stream,
                                   const char **routine);

/* ---- fused optimizer updates and loss scaling (optim.cu) ------------------------------------ */
/* Parameters per launch: the kernel receives every address as a launch
 * argument (no table copied to the device, so a launch records into a CUDA
 * graph as it is), which bounds the count by the 4 KB of kernel arguments. */
#define CTI_CUDA_OPTIM_MAX 48

/* One launch over n parameters of one dtype dt, each contiguous with
 * numel[k] >= 0 elements: param p[k], gradient g[k] (dtype dt), states
 * s0[k] (SGD's momentum buffer when momentum != 0; AdamW's exp_avg) and
 * s1[k] (exp_avg_sq). With master, p[k], s0[k] and s1[k] are float32 (the
 * master weights and their states) and model[k] (dtype dt) receives p[k]
 * rounded. The count including this update is *step[k] + 1 when step[k] is
 * not NULL (read from device memory and advanced there, with the learning
 * rate ctl[0]), else cnt[k] (with lr). The scalars of the formulas
 * (src/dispatch/schema.h) are computed in the kernel, in double. found_inf
 * (NULL: none) not zero: the kernel writes nothing. ctl[1] (all zero bits)
 * is the kernel's block counter: the last block to finish advances the
 * counts and zeroes it; ctl is needed when any step[k] is given. */
/* kind: which update (CTI_CUDA_OPT_*; adamw mirrors kind == ADAMW). Adam
 * also reads s2[k] (max_exp_avg_sq, amsgrad), RMSprop s0 (square_avg), s1
 * (momentum_buffer, momentum > 0) and s2 (grad_avg, centered), Adagrad s0
 * (sum); beta1 carries RMSprop's alpha. */
enum { CTI_CUDA_OPT_SGD, CTI_CUDA_OPT_ADAMW, CTI_CUDA_OPT_ADAM, CTI_CUDA_OPT_RMSPROP,
       CTI_CUDA_OPT_ADAGRAD };
typedef struct cti_cuda_optim {
    bool adamw;
    int kind;
    void *s2[CTI_CUDA_OPTIM_MAX];
    bool amsgrad, centered;     /* Adam, RMSprop */
    double lr_decay;            /* Adagrad */
    ct_dtype dt;
    bool master;
    /* Without masters: model[k] (NULL if none) receives the updated float32
     * parameter rounded to copy_dt (float16 or bfloat16; CT_NUM_DTYPES:
     * none), autocast's lasting cast. */
    ct_dtype copy_dt;
    int n;
    void *p[CTI_CUDA_OPTIM_MAX];
    const void *g[CTI_CUDA_OPTIM_MAX];
    void *s0[CTI_CUDA_OPTIM_MAX];
    void *s1[CTI_CUDA_OPTIM_MAX];
    void *model[CTI_CUDA_OPTIM_MAX];
    double *step[CTI_CUDA_OPTIM_MAX];
    int64_t numel[CTI_CUDA_OPTIM_MAX];
    double cnt[CTI_CUDA_OPTIM_MAX];
    double *ctl;
    const float *found_inf;
    double lr, weight_decay;
    double momentum, dampening; /* SGD */
    bool nesterov;              /* SGD */
    double beta1, beta2, eps;   /* AdamW */
} cti_cuda_optim;

/* Whether a kernel exists for dt (f32, f64, f16, bf16; masters: f16, bf16). */
bool cti_cuda_optim_supported(ct_dtype dt);
/* Queues one kernel; *routine receives its name (static string). */
cudaError_t cti_cuda_optim_step(const cti_cuda_optim *o, int sm_count, cudaStream_t stream,
                                const char **routine);

/* Gradients per launch of the non-finite check and unscale. */
#define CTI_CUDA_AMP_MAX 96

/* AMP_UNSCALE over n contiguous tensors x[k] of numel[k] elements and dtype
 * dt[k] (any floating dtypes): in place, x *= (float)(1 / (double)*scale),
 * and *found_inf = 1 where an element was not finite. */
typedef struct cti_cuda_unscale {
    int n;
    void *x[CTI_CUDA_AMP_MAX];
    int64_t numel[CTI_CUDA_AMP_MAX];
    ct_dtype dt[CTI_CUDA_AMP_MAX];
    float *found_inf;
    const float *scale;
} cti_cuda_unscale;

cudaError_t cti_cuda_amp_unscale(const cti_cuda_unscale *u, int sm_count, cudaStream_t stream,
                                 const char **routine);
/* AMP_UPDATE_SCALE on one thread (src/dispatch/schema.h). */
cudaError_t cti_cuda_amp_update_scale(float *scale, int32_t *growth_tracker,
                                      const float *found_inf, double growth_factor,
                                      double backoff_factor, int64_t growth_interval,
                                      cudaStream_t stream);

/* ---- softmax, losses, embedding, dropout (nn.cu) --------------------------------------------- */
enum { CTI_NN_CE = 0, CTI_NN_CE_BWD = 1, CTI_NN_NLL = 2, CTI_NN_NLL_BWD = 3 };

/* The classification losses' launch record. */
typedef struct cti_nn_cls {
    int64_t kind;          /* CTI_NN_* */
    int64_t dt;            /* the input's */
    int lossf;             /* cross-entropy of float16/bfloat16 logits: the loss (forward out)
                              and grad_loss are float32 (autocast's), else dt */
    const void *input;     /* logits or log-probabilities [n, c, inner] */
    const int64_t *target; /* [n * inner] */
    const void *weight;    /* [c] or NULL */
    const void *grad;      /* backward: grad_loss, [n * inner] for none, else one element */
    void *out;
    void *work;            /* cti_nn_cls_work bytes (NULL when that is 0) */
    void *stats;           /* cross-entropy's row statistics (schema.h) or NULL: forward
                              out[1], backward in[4] */
    int64_t n, c, inner, reduction, ignore;
    double ls;
    int op;                    /* ct_op, for the fault record */
    int sms;                   /* the device's multiprocessors, to size grids */
    cti_cuda_fault_slot fault; /* where a bad target is recorded */
} cti_nn_cls;

cudaError_t cti_nn_softmax(int dt, int bwd, int lg, const void *a, const void *b, void *out,
                           int64_t outer, int64_t d, int64_t inner, cudaStream_t st,
                           const char **routine);
size_t cti_nn_cls_work(const cti_nn_cls *r);
cudaError_t cti_nn_cls_launch(const cti_nn_cls *r, cudaStream_t st, const char **routine);
size_t cti_nn_mse_work(int64_t n, int reduction);
cudaError_t cti_nn_mse(int dt, int bwd, const void *a, const void *b, const void *g, void *out,
                       int64_t n, int reduction, void *work, cudaStream_t st, const char **routine);
/* Embedding's index check: the kernels record the smallest position of an
 * index outside [0, v) in *bad (all ones: none), which the host reads after
 * them; during a CUDA graph capture, where the host cannot wait, they also
 * claim the device's fault record (fault.record non-NULL) with op, for the
 * first wait after a replay to report. */
typedef struct cti_nn_emb_check {
    unsigned long long *bad;
    cti_cuda_fault_slot fault;
    int op;
} cti_nn_emb_check;
cudaError_t cti_nn_embedding(int esize, int idx_i32, const void *w, const void *idx, void *out,
                             int64_t v, int64_t d, int64_t n, cti_nn_emb_check chk,
                             cudaStream_t st);
cudaError_t cti_nn_embedding_bwd_work(int64_t n, int64_t v, size_t *bytes);
cudaError_t cti_nn_embedding_bwd(int dt, int idx_i32, const void *g, const void *idx, void *out,
                                 int64_t v, int64_t d, int64_t n, int64_t pad, void *work,
                                 cti_nn_emb_check chk, cudaStream_t st);
cudaError_t cti_nn_dropout(int dt, int bwd, const void *x, void *y, const uint8_t *mask_in,
                           uint8_t *mask_out, int64_t n, uint64_t seed, uint64_t first,
                           const uint64_t *state, double p, cudaStream_t st);

/* ---- rope, swiglu (rope.cu) ------------------------------------------------------------------ */
/* One launch of ROPE or ROPE_BACKWARD (schema.h), over units of p pairs: it
 * holds three operands, the contiguous out (0), x (1) and the tables (2; cos
 * and sin share its strides), each seen as [x's leading dims..., d/2 / p]
 * with the element offset of a unit's first pair; the kernel adds d/2 for the
 * second elements of the half layout. vec: p pairs are one 16-byte vector of
 * x (interleaved: of 2p elements) and every unit offset is aligned for it;
 * otherwise p is 1 and the kernel reads elements. */
typedef struct cti_cuda_rope_args {
    ct_dtype dt;
    ct_dtype table_dt; /* dt, or CT_F32 beside an f16/bf16 x (entries rounded to dt) */
    bool interleaved, vec, backward;
    int64_t half; /* d / 2 */
    void *out;
    const void *x, *cos, *sin;
    cti_cuda_iter it;
} cti_cuda_rope_args;

/* Pairs of a vector unit for dt (16 bytes of each table of dt, 32 of a float32 table
 * beside a 16-bit x; 2 or more), either layout. */
int cti_cuda_rope_vec_pairs(ct_dtype dt, bool interleaved);
cudaError_t cti_cuda_rope(const cti_cuda_rope_args *a, int sm_count, cudaStream_t stream,
                          const char **routine);

/* SWIGLU (out = y) and SWIGLU_BACKWARD (out = dgate|NULL, dup|NULL) over
 * rows x cols elements, every operand's rows at its row stride (elements,
 * cti_swiglu_params; ld_out the outputs'). 16-byte vectors where every
 * row start of every operand is aligned for them; elements otherwise. */
typedef struct cti_cuda_swiglu_args {
    ct_dtype dt;
    bool backward;
    int64_t rows, cols;
    int64_t ld_gate, ld_up, ld_grad, ld_out;
    const void *gate, *up, *grad;
    void *y, *dgate, *dup;
} cti_cuda_swiglu_args;

cudaError_t cti_cuda_swiglu(const cti_cuda_swiglu_args *a, int sm_count, cudaStream_t stream,
                            const char **routine);
/* ---- indexing (indexing.cu) ------------------------------------------------------------------ */
/* GATHER / INDEX_SELECT and SCATTER_ADD (cti_index_params; schema.h's
 * contract). The kernels walk shape (nd dims): gather index's shape, one
 * thread per element; scatter_add index's shape with 1 along dim, one
 * thread per line of len positions. Strides in elements: ts the indexed
 * tensor's (gather: x, read; scatter_add: out, written) with 0 along dim and
 * tdim its stride along dim, is index's, ss src's (scatter_add), cs the
 * row-major strides of index's shape (positions for *bad). The kernels
 * record the smallest row-major position of index holding a value outside
 * [0, size) in *bad (all ones: none) and never address memory with it. */
typedef struct cti_cuda_index {
    int dt;      /* ct_dtype of x, src and out */
    int idx_i32; /* index int32 (else int64) */
    int nd, dim;
    int64_t size, tdim, len;
    int64_t shape[CT_MAX_DIMS], ts[CT_MAX_DIMS], is[CT_MAX_DIMS], ss[CT_MAX_DIMS],
        cs[CT_MAX_DIMS];
    const void *x, *idx, *src;
    void *out; /* gather: contiguous, index's shape */
    unsigned long long *bad;
} cti_cuda_index;

/* n threads (output elements); *routine receives the kernel's name. */
cudaError_t cti_cuda_gather(const cti_cuda_index *a, int64_t n, int sm_count, cudaStream_t st,
                            const char **routine);
/* n threads (lines along dim), adding in index order (the CPU's). */
cudaError_t cti_cuda_scatter_add(const cti_cuda_index *a, int64_t n, int sm_count,
                                 cudaStream_t st, const char **routine);

#ifdef __cplusplus
}
#endif
#endif
