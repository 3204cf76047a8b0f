/* Private: the dispatcher. The kernel table keyed on (op, device type,
 * dtype), the call record kernels receive, the backends that fill the
 * table, and the trace and profile around every call.
 *
 * An op's front end (src/ops/) checks its arguments, computes the result
 * dtype and shape, allocates the outputs, fills a ct_call with the tensors
 * and a pointer to the op's parameter struct (src/dispatch/schema.h) and
 * hands it to cti_dispatch, which finds kernel[op][device][dtype] and runs
 * it. Kernels may assume the front end's checks hold; they never allocate
 * the call's outputs. The dispatcher knows nothing of autograd, which sits
 * above it in the front ends. */
#ifndef CTEN_DISPATCH_IMPL_H
#define CTEN_DISPATCH_IMPL_H

#include <assert.h>
#include <stdio.h>

#include "../core/tensor_impl.h"
#include "schema.h"
#include "tensor/dispatch.h"

#define CTI_CALL_MAX_IN 8 /* SDPA_BACKWARD takes 7 */
#define CTI_CALL_MAX_OUT 4

typedef struct ct_call {
    ct_op op;
    int nin, nout;
    ct_tensor *in[CTI_CALL_MAX_IN];   /* inputs; may be NULL for optional ones */
    ct_tensor *out[CTI_CALL_MAX_OUT]; /* outputs, allocated by the front end */
    /* The op's parameter struct (the schema's params column) and its size,
     * which the dispatcher checks against the schema; NULL and 0 for
     * cti_no_params. Set with cti_call_params. */
    const void *params;
    size_t params_size;
    /* The kernel may set this to the routine it actually ran ("cblas_sgemm",
     * "im2col+cblas_sgemm"); the trace prints it, else the registered name. */
    const char *routine;
} ct_call;

typedef ct_status (*cti_kernel_fn)(ct_call *call);

/* Initializes a call record for op with no tensors and no parameters. */
static inline void cti_call_init(ct_call *c, ct_op op) {
    c->op = op;
    c->nin = 0;
    c->nout = 0;
    c->params = NULL;
    c->params_size = 0;
    c->routine = NULL;
}

/* Points the call at the parameter struct *p (which must outlive the
 * dispatch). */
#define cti_call_params(c, p) ((c)->params = (p), (c)->params_size = sizeof *(p))

/* The call's parameters as the family's struct T. The dispatcher checked
 * the size against the schema's struct for the op; the assertion catches a
 * kernel reading another family's. */
#define CTI_PARAMS(c, T) ((const T *)cti_call_params_(c, sizeof(T)))
static inline const void *cti_call_params_(const ct_call *c, size_t size) {
    assert(c->params_size == size);
    (void)size;
    return c->params;
}

/* ---- the schema as data ---------------------------------------------------------- */
typedef enum cti_grad_kind {
    CTI_GRAD_NONE,      /* CTI_NODIFF */
    CTI_GRAD_FORMULA,   /* CTI_F(formula) */
    CTI_GRAD_NOFORMULA, /* CTI_NOFORMULA */
} cti_grad_kind;

typedef struct cti_op_info {
    ct_op id;
    const char *name;
    const char *params_name; /* "cti_conv_params" */
    size_t params_size;      /* 0 for cti_no_params */
    cti_grad_kind grad;
    int backward; /* the backward op, or -1 */
} cti_op_info;

/* The schema's rows, indexed by op id; cti_op_schema(op) for op < CT_NUM_OPS
 * (inline: cti_run reads it on every call). */
extern const cti_op_info cti_schema_rows[CT_NUM_OPS];
static inline const cti_op_info *cti_op_schema(ct_op op) { return &cti_schema_rows[op]; }

/* Checks n rows as the library's init does: ids 0..n-1 in order, names
 * non-empty and unique, backward ops in range and not the op itself, and a
 * formula for every differentiable op. A failure sets an error naming the
 * row and returns its status. Tests hand it broken tables. */
ct_status cti_schema_validate(const cti_op_info *rows, int n, const bool *has_formula);

/* ---- backends ----------------------------------------------------------------------
 * Each backend is one value of this struct, defined in its own folder. The
 * build lists the backends it compiled (cten_backends.h): those built into
 * the library (CTI_BACKEND_LIST: the CPU) and those built as modules
 * (CTI_MODULE_LIST: CUDA, libcten-cuda.so), which need libraries a machine
 * may lack and are loaded at init when they can run (modules.c). The
 * dispatcher loops over the built-in ones and the modules that loaded. */
typedef struct cti_backend {
    const char *name;      /* "cpu", "cuda" */
    ct_device_type device; /* the column of the table it fills */
    /* Registers its allocator and kernels (cti_register_kernel); init
     * fails on the first refused registration. */
    void (*register_kernels)(void);
    /* Devices present now (CPU: 1); 0 when none is usable. */
    int (*device_count)(void);
    /* Writes the backend's lines of ct_print_info (indented two spaces). */
    void (*print_info)(FILE *f);
    /* Waits for the device's queued work (CPU: returns at once). */
    ct_status (*synchronize)(int device);
    /* The backend's share of the public API, which the library answers
     * whether or not the backend loaded (tensor/cuda.h): a table of the
     * backend's own type (src/backends/cuda/cuda_api.h) that the library's
     * functions forward to; NULL when it has none. */
    const void *api;
} cti_backend;

/* The backend of a device type: a built-in one, or a module that loaded.
 * NULL when the build has none or its module did not load. */
const cti_backend *cti_backend_of(ct_device_type device);

/* Why device's backend is absent ("" when it is present): built without
 * it, or its module did not load and why (no module file, no driver, the
 * dlopen error, a module built for another cten, the static library). A
 * string that lives as long as the process. */
const char *cti_backend_missing(ct_device_type device);

/* ---- backend modules (modules.c) ----------------------------------------------------
 * A module is a shared object linked against libcten.so that exports
 * cti_module_abi and its backend value cti_backend_<name>. It calls the
 * library's internals by name: libcten.so exports the cti_* functions in a
 * private version node (src/cten.map) that is not API. cti_module_abi lets
 * the loader refuse a module built from other sources, whose layouts of
 * the structs both sides share would differ. */
typedef struct cti_abi {
    const char *version; /* CT_VERSION_STRING */
    int ops, dtypes, device_types, max_dims, params_max;
    size_t tensor, storage, call, backend, allocator;
} cti_abi;

#define CTI_ABI_HERE                                                                          \
    {                                                                                         \
        CT_VERSION_STRING, CT_NUM_OPS, CT_NUM_DTYPES, CT_NUM_DEVICE_TYPES, CT_MAX_DIMS,       \
            CTI_PARAMS_MAX, sizeof(ct_tensor), sizeof(cti_storage), sizeof(ct_call),          \
            sizeof(cti_backend), sizeof(cti_allocator)                                        \
    }

/* Tries every module of the build (CTI_MODULE_LIST) once, at init: appends
 * the ones that loaded to out[0..max), returns their number, and keeps each
 * one's path or the reason it did not load. */
int cti_modules_load(const cti_backend **out, int max);
/* The file device's module was loaded from, or NULL. */
const char *cti_module_path(ct_device_type device);
/* Looks name up in device's loaded module and the libraries it links (the
 * CUDA runtime for the CUDA module); NULL when the module is not loaded or
 * has no such symbol. Tests reach the module's internals through it. */
void *cti_module_symbol(ct_device_type device, const char *name);
/* Why device's module did not load, NULL when it did or the build has no
 * module for it. */
const char *cti_module_missing(ct_device_type device);

/* Called by backends' register_kernels at init. A second kernel for one
 * (op, device, dtype), an op, device or dtype out of range, or a NULL
 * function is refused (CT_ERR_INVALID_ARG, naming the entry and both
 * kernels for a duplicate) and leaves the table as it was. */
ct_status cti_register_kernel(ct_op op, ct_device_type device, ct_dtype dtype, cti_kernel_fn fn,
                              const char *name);

/* Composite kernels (compose.c): LINEAR_GELU, LINEAR_DGELU and
 * LINEAR_BACKWARD_WEIGHT made of the GEMM, GELU and SUM ops' kernels,
 * dispatched on the call's device. A backend registers them where it has no
 * fused kernel, or calls them from its kernel for a call its fused path does
 * not take. Each sets c->routine. */
ct_status cti_compose_linear_gelu(ct_call *c);
ct_status cti_compose_linear_dgelu(ct_call *c);
ct_status cti_compose_linear_backward_weight(ct_call *c);

/* Runs the kernel for (call->op, device, dtype). A missing entry is
 * CT_ERR_UNSUPPORTED naming op, device and dtype. Records trace/profile.
 * Under a capture guard (below) a call with a tensor on another device is
 * refused. */
ct_status cti_dispatch(ct_call *call, ct_device device, ct_dtype dtype);

/* One kernel's call made and dispatched in one step, for a kernel or a
 * composite that runs another op's kernel on tensors it already has: op on
 * in[0..nin) (NULL entries allowed where op takes them) into out, with the
 * parameter struct p of psize bytes (NULL and 0 for none), on (device,
 * dtype). The routine the inner kernel reports is not passed up. */
ct_status cti_dispatch_one(ct_op op, const void *p, size_t psize, int nin, ct_tensor *const *in,
                           ct_tensor *out, ct_device device, ct_dtype dtype);

/* ---- the capture guard ----------------------------------------------------------------
 * While a thread records a device's work for later replay (a CUDA graph
 * capture), a call it makes on the host or another device would run once,
 * at capture, and never at replay: a CPU kernel, a copy between the host and
 * the device, an elementwise op reading a CPU scalar's value. The capturing
 * backend installs a guard on that thread; cti_dispatch then refuses every
 * call with a tensor not on guard->device (CT_ERR_CAPTURE, naming the op and
 * the tensor) and passes the error to guard->refused, which fails the
 * capture. Other threads are not affected. */
typedef struct cti_capture_guard {
    ct_device device;
    const char *what; /* the messages' "this thread <what>": "captures a CUDA graph" */
    void (*refused)(void *ctx, ct_status status, const char *message);
    void *ctx;
} cti_capture_guard;

/* Installs g on this thread (NULL removes it); g must stay valid while it
 * is installed. */
void cti_dispatch_guard(const cti_capture_guard *g);

/* Runs the library's one-time init (schema check, kernel registration, env
 * settings). Idempotent and cheap after the first call; every front end's
 * first dispatch triggers it through cti_dispatch. */
void cti_init(void);
/* CT_OK, or the first failure init met (its message in *msg when msg is
 * non-NULL). A failed init makes every dispatch fail with that message. */
ct_status cti_init_status(const char **msg);

#endif
