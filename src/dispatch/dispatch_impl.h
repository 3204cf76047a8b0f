/* Private: the kernel table and the call record kernels receive.
 *
 * A public op function (the "front end", in src/dispatch/) checks its
 * arguments (NULL, devices, dtypes, shapes), computes the result dtype and
 * shape, allocates the outputs, fills a ct_call and hands it to cti_dispatch,
 * which finds kernel[op][device][dtype] and runs it. Kernels may assume the
 * front end's checks hold; they never allocate the call's outputs. */
#ifndef CTEN_DISPATCH_IMPL_H
#define CTEN_DISPATCH_IMPL_H

#include "../core/tensor_impl.h"
#include "tensor/dispatch.h"

#define CTI_CALL_MAX_IN 6
#define CTI_CALL_MAX_OUT 4

typedef struct ct_call {
    ct_op op;
    int nin, nout;
    ct_tensor *in[CTI_CALL_MAX_IN];   /* inputs; may be NULL for optional ones */
    ct_tensor *out[CTI_CALL_MAX_OUT]; /* outputs, allocated by the front end */
    double f[8];                      /* op-specific float parameters */
    int64_t i[16];                    /* op-specific integer parameters */
    void *ptr;                        /* op-specific pointer (e.g. a generator) */
    /* The kernel may set this to the routine it actually ran ("cblas_sgemm",
     * "im2col+cblas_sgemm"); the trace prints it, else the registered name. */
    const char *routine;
} ct_call;

typedef ct_status (*cti_kernel_fn)(ct_call *call);

/* Called by backends' registration functions at library init. */
void cti_register_kernel(ct_op op, ct_device_type device, ct_dtype dtype, cti_kernel_fn fn,
                         const char *name);

/* Runs the kernel for (call->op, device, dtype). A missing entry is
 * CT_ERR_UNSUPPORTED naming op, device and dtype. Records trace/profile. */
ct_status cti_dispatch(ct_call *call, ct_device device, ct_dtype dtype);

/* Initializes a call record for op with nin inputs and nout outputs
 * (remaining fields zeroed only as far as needed). */
static inline void cti_call_init(ct_call *c, ct_op op) {
    c->op = op;
    c->nin = 0;
    c->nout = 0;
    c->ptr = NULL;
    c->routine = NULL;
}

/* Runs the library's one-time init (kernel registration, env settings).
 * Idempotent and cheap after the first call; every front end's first
 * dispatch triggers it through cti_dispatch. */
void cti_init(void);

/* ---- shared front-end checks (each sets an error naming op) ---------------- */
/* All n tensors non-NULL. */
ct_status cti_check_not_null(const char *op, int n, ct_tensor *const *ts);
/* All non-NULL tensors among n on one device. */
ct_status cti_check_same_device(const char *op, int n, ct_tensor *const *ts);
/* dtype is floating ("op: expected a floating dtype, got int64"). */
ct_status cti_check_floating(const char *op, const ct_tensor *t, const char *argname);

/* Releases the first n outputs of a call (after a failed dispatch). */
void cti_call_release_outputs(ct_call *c);

#endif
