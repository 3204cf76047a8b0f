/* cten: operator ids, the dispatch table query, tracing, profiling, threads
 * and what the library knows about its backends. */
#ifndef CTEN_DISPATCH_H
#define CTEN_DISPATCH_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X-macro of every dispatchable op: id suffix and the name the trace prints. */
#define CT_OP_LIST(X)                                                        \
    X(COPY, "copy")                                                          \
    X(FILL, "fill")                                                          \
    X(ARANGE, "arange")                                                      \
    X(RAND_UNIFORM, "uniform")                                               \
    X(RAND_NORMAL, "normal")                                                 \
    X(RANDINT, "randint")                                                    \
    X(NEG, "neg") X(ABS, "abs") X(EXP, "exp") X(LOG, "log") X(SQRT, "sqrt")  \
    X(RSQRT, "rsqrt") X(SIN, "sin") X(COS, "cos") X(TANH, "tanh")            \
    X(SIGMOID, "sigmoid") X(RELU, "relu") X(GELU, "gelu")                    \
    X(GELU_TANH, "gelu_tanh") X(SILU, "silu") X(RECIPROCAL, "reciprocal")    \
    X(SQUARE, "square") X(SIGN, "sign") X(LOGICAL_NOT, "logical_not")        \
    X(ADD, "add") X(SUB, "sub") X(MUL, "mul") X(DIV, "div") X(POW, "pow")    \
    X(MAXIMUM, "maximum") X(MINIMUM, "minimum")                              \
    X(EQ, "eq") X(NE, "ne") X(LT, "lt") X(LE, "le") X(GT, "gt") X(GE, "ge")  \
    X(LOGICAL_AND, "logical_and") X(LOGICAL_OR, "logical_or")                \
    X(WHERE, "where") X(CLAMP, "clamp")                                      \
    X(SUM, "sum") X(MEAN, "mean") X(PROD, "prod") X(VAR, "var")              \
    X(NORM, "norm") X(MAX, "max") X(MIN, "min") X(ARGMAX, "argmax")          \
    X(ARGMIN, "argmin")                                                      \
    X(MM, "mm") X(BMM, "bmm") X(ADDMM, "addmm")                              \
    X(CONV2D, "conv2d") X(CONV2D_BACKWARD_INPUT, "conv2d_backward_input")    \
    X(CONV2D_BACKWARD_WEIGHT, "conv2d_backward_weight")                      \
    X(CONV2D_BACKWARD_BIAS, "conv2d_backward_bias")                          \
    X(MAX_POOL2D, "max_pool2d") X(MAX_POOL2D_BACKWARD, "max_pool2d_backward") \
    X(AVG_POOL2D, "avg_pool2d") X(AVG_POOL2D_BACKWARD, "avg_pool2d_backward") \
    X(ADAPTIVE_AVG_POOL2D, "adaptive_avg_pool2d")                            \
    X(ADAPTIVE_AVG_POOL2D_BACKWARD, "adaptive_avg_pool2d_backward")          \
    X(RMS_NORM, "rms_norm") X(RMS_NORM_BACKWARD, "rms_norm_backward")        \
    X(LAYER_NORM, "layer_norm") X(LAYER_NORM_BACKWARD, "layer_norm_backward") \
    X(SOFTMAX, "softmax") X(LOG_SOFTMAX, "log_softmax")                      \
    X(SOFTMAX_BACKWARD, "softmax_backward")                                  \
    X(LOG_SOFTMAX_BACKWARD, "log_softmax_backward")                          \
    X(CROSS_ENTROPY, "cross_entropy")                                        \
    X(CROSS_ENTROPY_BACKWARD, "cross_entropy_backward")                      \
    X(NLL_LOSS, "nll_loss") X(NLL_LOSS_BACKWARD, "nll_loss_backward")        \
    X(MSE_LOSS, "mse_loss") X(MSE_LOSS_BACKWARD, "mse_loss_backward")        \
    X(EMBEDDING, "embedding") X(EMBEDDING_BACKWARD, "embedding_backward")    \
    X(DROPOUT, "dropout") X(DROPOUT_BACKWARD, "dropout_backward")            \
    X(SGD_STEP, "sgd_step") X(ADAMW_STEP, "adamw_step")

typedef enum ct_op {
#define CT_OP_ENUM_(id, name) CT_OP_##id,
    CT_OP_LIST(CT_OP_ENUM_)
#undef CT_OP_ENUM_
    CT_NUM_OPS
} ct_op;

/* "add", "conv2d", ...; "invalid" for an unknown id. */
const char *ct_op_name(ct_op op);
/* True when a kernel is registered for (op, device type, dtype). */
bool ct_supports(ct_op op, ct_device_type device, ct_dtype dtype);
/* The registered kernel's name, or NULL. */
const char *ct_kernel_name(ct_op op, ct_device_type device, ct_dtype dtype);

/* ---- trace and profile ---------------------------------------------------------
 * CT_TRACE=1 in the environment (read once, at library init) prints one line
 * per dispatched op on stderr: op, device, dtype, input shapes, the kernel or
 * library routine that ran, and its wall time. CT_PROFILE=1 aggregates per
 * (op, device, dtype) and prints a table at exit. Both can be switched here. */
void ct_set_trace(bool on);
bool ct_trace_enabled(void);
void ct_set_profile(bool on);
bool ct_profile_enabled(void);
/* Prints the profile table (count, total, mean per op) to f (a FILE *; NULL
 * means stderr). */
void ct_profile_print(void *file);
void ct_profile_reset(void);

/* ---- threads ---------------------------------------------------------------------
 * One setting for the CPU: the library's own pool and OpenBLAS share it, and
 * never run at once, so they never fight over cores. The default is the
 * number of cores the process may run on, or CT_NUM_THREADS from the
 * environment. */
ct_status ct_set_num_threads(int n);
int ct_get_num_threads(void);

/* ---- what is underneath -------------------------------------------------------------- */
/* The BLAS library and kernel in use, e.g. "OpenBLAS 0.3.21 (Cooperlake kernels,
 * chosen by cten: detected Prescott)". Static string. */
const char *ct_blas_info(void);
/* Writes a description of the whole stack (version, backends, BLAS, devices)
 * to f (a FILE *; NULL means stdout). */
void ct_print_info(void *file);
/* True when the library was built with the backend. */
bool ct_backend_available(ct_device_type device);
/* Number of devices of a type present now (CPU: 1). */
int ct_device_count(ct_device_type device);

#ifdef __cplusplus
}
#endif
#endif
