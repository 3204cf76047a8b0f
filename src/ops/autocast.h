/* Private: autocast in the op front ends (the public calls and the user's view
 * are in tensor/ops.h and docs/AMP.md).
 *
 * CTI_AUTOCAST_OPS below is the whole policy: one row per op that autocast
 * changes, with its cast policy. The rows follow PyTorch 2.x's lists
 * (aten/src/ATen/autocast_mode.h: AT_FORALL_LOWER_PRECISION_FP,
 * AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, the fp32_append_dtype norm
 * and AT_FORALL_PROMOTE) restricted to the ops cten has, the same table for
 * every device type, plus the cten rows marked as such. An op that is not in
 * the table runs on its inputs as given.
 *
 * A front end in the table starts with
 *
 *     cti_autocast_call ac;
 *     if (cti_autocast_begin_op(&ac, CTI_AC_MM, 2, (ct_tensor *[]){a, b}))
 *         return cti_autocast_end_op(&ac, ac.ok ? ct_mm(ac.in[0], ac.in[1]) : NULL);
 *
 * and the rest of it is unchanged: when a region is enabled for the
 * inputs' device type, the op runs again on the inputs the policy gives
 * (casts recorded by autograd like any ct_to_dtype), with autocast held off
 * until it returns, so the ops it calls inside run on what they are given
 * (PyTorch's ExcludeDispatchKeyGuard in its autocast wrappers). */
#ifndef CTEN_OPS_AUTOCAST_H
#define CTEN_OPS_AUTOCAST_H

#include "core/tensor_impl.h"

/* How an op's eligible inputs are cast. Eligible: a float32, float16 or
 * bfloat16 tensor on the region's device type (float64, integers and bool
 * never change), as PyTorch's is_eligible. In parentheses PyTorch's
 * CastPolicy. Under every policy, the cast of a float32 leaf that requires
 * grad to the region's dtype is made once for the outermost region and
 * reused (PyTorch's cached_cast). */
typedef enum cti_autocast_policy {
    /* (lower_precision_fp) to the region's dtype */
    CTI_AUTOCAST_LOWER,
    /* (fp32, fp32_set_opt_dtype, fp32_append_dtype) float16 and bfloat16
     * to float32 */
    CTI_AUTOCAST_FP32,
    /* (promote) to the widest of the region's dtype and the inputs' dtypes
     * (float16 with bfloat16 gives float32, ct_promote_types) */
    CTI_AUTOCAST_PROMOTE,
    /* (cten's) to the dtype of the first input, when that one is eligible:
     * for kernels that take one dtype and whose PyTorch counterpart
     * returns its input's dtype */
    CTI_AUTOCAST_FIRST,
    /* (cten's) as FIRST, except that a float32 input after the first stays
     * float32 beside a float16/bfloat16 first input: the kernel reads it so,
     * rounding each value to the first's dtype as the cast would, and the
     * cast's pass (one a call: such inputs are not leaves that require grad,
     * so no cache holds their casts) is saved */
    CTI_AUTOCAST_FIRST_READS_F32,
} cti_autocast_policy;

/* X(id, front end, policy). Which inputs an op hands over is in its front
 * end's call (tensor inputs in the order of its arguments; integer ones,
 * such as class targets and indices, are left out). */
#define CTI_AUTOCAST_OPS(X)                                                                      \
    /* PyTorch's lower_precision_fp list */                                                    \
    X(MATMUL, "ct_matmul", LOWER)                                                               \
    X(MM, "ct_mm", LOWER)                                                                       \
    X(BMM, "ct_bmm", LOWER)                                                                     \
    X(ADDMM, "ct_addmm", LOWER)                                                                 \
    X(LINEAR, "ct_linear", LOWER)                                                               \
    X(CONV2D, "ct_conv2d", LOWER)                                                               \
    X(SDPA, "ct_scaled_dot_product_attention", LOWER) /* a float mask too */                    \
    /* cten's: linear + cross_entropy fused; its GEMMs in the region's dtype, the loss in       \
     * float32 as PyTorch's fp32 cross_entropy after a lower-precision linear gives it */       \
    X(LINEAR_CROSS_ENTROPY, "ct_linear_cross_entropy", LOWER)                                   \
    /* cten's: linear, GELU, linear fused; GELU follows its input, as outside the fusion */     \
    X(MLP_GELU, "ct_mlp_gelu", LOWER)                                                           \
    /* PyTorch's fp32 list */                                                                   \
    X(EXP, "ct_exp", FP32)                                                                      \
    X(LOG, "ct_log", FP32)                                                                      \
    X(RSQRT, "ct_rsqrt", FP32)                                                                  \
    X(RECIPROCAL, "ct_reciprocal", FP32)                                                        \
    X(POW, "ct_pow", FP32)                                                                      \
    X(POW_SCALAR, "ct_pow_scalar", FP32)                                                        \
    X(SOFTPLUS, "ct_softplus", FP32)                                                            \
    X(LAYER_NORM, "ct_layer_norm", FP32)                                                        \
    X(NLL_LOSS, "ct_nll_loss", FP32)                                                            \
    X(MSE_LOSS, "ct_mse_loss", FP32)                                                            \
    /* PyTorch's cross_entropy is log_softmax + nll_loss, both float32 there (without class   \
     * weights cten's kernel takes 16-bit logits as they are: cti_autocast_reads_as_is) */     \
    X(CROSS_ENTROPY, "ct_cross_entropy", FP32)                                                  \
    /* PyTorch's fp32_set_opt_dtype list */                                                     \
    X(SOFTMAX, "ct_softmax", FP32)                                                              \
    X(LOG_SOFTMAX, "ct_log_softmax", FP32)                                                      \
    X(SUM, "ct_sum", FP32)                                                                      \
    X(PROD, "ct_prod", FP32)                                                                    \
    X(CUMSUM, "ct_cumsum", FP32)                                                                \
    /* PyTorch's fp32_append_dtype norm */                                                      \
    X(NORM, "ct_norm", FP32)                                                                    \
    /* PyTorch's promote list */                                                                \
    X(SCATTER_ADD, "ct_scatter_add", PROMOTE)                                                   \
    /* cten's: PyTorch's rms_norm computes in float32 and returns its input's dtype; a rope     \
     * is written there as products with tables cast to x's dtype (LLaMA's), which cten's       \
     * kernels do as they read float32 tables */                                                \
    X(RMS_NORM, "ct_rms_norm", FIRST)                                                           \
    X(ROPE, "ct_rope", FIRST_READS_F32)                                                         \
    /* reductions and scans: PyTorch's fp32 list, then its fp32_set_opt_dtype list */         \
    X(LOGSUMEXP, "ct_logsumexp", FP32)                                                          \
    X(CUMPROD, "ct_cumprod", FP32)

typedef enum cti_autocast_op {
#define CTI_AUTOCAST_ENUM_(id, name, policy) CTI_AC_##id,
    CTI_AUTOCAST_OPS(CTI_AUTOCAST_ENUM_)
#undef CTI_AUTOCAST_ENUM_
    CTI_AC_NUM_OPS
} cti_autocast_op;

#define CTI_AUTOCAST_MAX_IN 5

/* One op call under autocast. */
typedef struct cti_autocast_call {
    int n;
    ct_tensor *in[CTI_AUTOCAST_MAX_IN];   /* what the op runs on: a cast, or the caller's */
    ct_tensor *temp[CTI_AUTOCAST_MAX_IN]; /* the casts made for this call only */
    ct_dtype dtype;                       /* the region's dtype */
    bool ok;                              /* false: a cast failed, with the error set */
} cti_autocast_call;

/* When a region of this thread is enabled for the device type of the first
 * non-NULL of in[0..n) and no autocast op of this thread is running: fills
 * ac with in cast by op's policy (NULL entries stay NULL), holds autocast
 * off, and returns true; the caller runs the op on ac->in (when ac->ok) and
 * passes its result to cti_autocast_end_op. Returns false otherwise, having
 * done nothing: with no region open that is one thread-local read. */
bool cti_autocast_begin_op(cti_autocast_call *ac, cti_autocast_op op, int n,
                           ct_tensor *const *in);
/* Releases the casts made for the call, lets autocast on again, and returns
 * result. */
ct_tensor *cti_autocast_end_op(cti_autocast_call *ac, ct_tensor *result);

/* Whether an op of the FP32 policy whose kernel reads float16/bfloat16 inputs as they are
 * and computes and returns float32 (cross_entropy without class weights) should take t so:
 * a region of this thread is enabled for t's device type, no autocast op of this thread is
 * running, and t is float16 or bfloat16. One thread-local read with no region open. */
bool cti_autocast_reads_as_is(const ct_tensor *t);

/* Hold autocast off on this thread until the matching cti_autocast_resume,
 * for a front end outside the table that runs ops of the table inside it
 * (they then run on what they are given, as inside a table op). */
void cti_autocast_hold(void);
void cti_autocast_resume(void);

/* Test hook: the casts autocast made on this thread (cached or not) and the
 * times a cached cast was reused, since the thread began. */
void cti_autocast_counts(int64_t *casts, int64_t *hits);
/* Test hook: the casts this thread took from lasting copies (no kernel). */
int64_t cti_autocast_kept_count(void);

/* For the optimizers: p's lasting autocast copy (borrowed), when lasting
 * casts are on, p is float32 and the copy holds p's current values; else
 * NULL. After writing p's updated values into it (rounded to its dtype),
 * the optimizer calls cti_autocast_copy_written, which counts the write and
 * makes the copy valid for p's new version. */
ct_tensor *cti_autocast_copy_of(const ct_tensor *p);
void cti_autocast_copy_written(ct_tensor *p, ct_tensor *copy);

#endif
