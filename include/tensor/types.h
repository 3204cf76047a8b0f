/* cten: dtypes, devices, status codes and the error channel. */
#ifndef CTEN_TYPES_H
#define CTEN_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT_VERSION_MAJOR 0
#define CT_VERSION_MINOR 1
#define CT_VERSION_PATCH 0
#define CT_VERSION_STRING "0.1.0"

/* Most dimensions a tensor may have. */
#define CT_MAX_DIMS 8

/* Element types. The order is the promotion order inside a category
 * (bool < integers < floating); see ct_promote_types. */
typedef enum ct_dtype {
    CT_BOOL = 0,
    CT_I32,
    CT_I64,
    CT_F16,
    CT_BF16,
    CT_F32,
    CT_F64,
    CT_NUM_DTYPES
} ct_dtype;

typedef enum ct_device_type {
    CT_DEVICE_CPU = 0,
    CT_DEVICE_CUDA = 1,
    CT_NUM_DEVICE_TYPES
} ct_device_type;

/* A device: its type and its index among devices of that type. */
typedef struct ct_device {
    ct_device_type type;
    int index;
} ct_device;

#define CT_CPU ((ct_device){CT_DEVICE_CPU, 0})
#define CT_CUDA(i) ((ct_device){CT_DEVICE_CUDA, (i)})

typedef enum ct_status {
    CT_OK = 0,
    CT_ERR_INVALID_ARG,  /* NULL, out-of-range argument, bad option */
    CT_ERR_SHAPE,        /* shapes that do not fit together */
    CT_ERR_DTYPE,        /* dtype not allowed or not convertible */
    CT_ERR_DEVICE,       /* wrong or mixed devices */
    CT_ERR_INDEX,        /* index or dim out of range */
    CT_ERR_OVERFLOW,     /* size arithmetic overflows */
    CT_ERR_OOM,          /* out of memory */
    CT_ERR_UNSUPPORTED,  /* no kernel for (op, device, dtype) */
    CT_ERR_IO,           /* file could not be read or written */
    CT_ERR_FORMAT,       /* file content malformed */
    CT_ERR_AUTOGRAD,     /* autograd misuse */
    CT_ERR_RUNTIME,      /* a backend library reported a failure */
    CT_ERR_CAPTURE       /* not possible during a CUDA graph capture, or a graph used out of order */
} ct_status;

/* The status of the last failed call on this thread (CT_OK if none since
 * ct_clear_error). */
ct_status ct_last_status(void);
/* The message of the last failed call on this thread; "" if none. The
 * pointer stays valid until the next failing call on this thread. */
const char *ct_last_error(void);
void ct_clear_error(void);
/* A short name for a status ("CT_ERR_SHAPE"). Static string. */
const char *ct_status_name(ct_status s);

/* Bytes per element. */
size_t ct_dtype_size(ct_dtype dt);
/* "float32", "bfloat16", ... as PyTorch names them, "invalid" otherwise. */
const char *ct_dtype_name(ct_dtype dt);
bool ct_dtype_is_floating(ct_dtype dt);
bool ct_dtype_is_integral(ct_dtype dt); /* integers and bool */
/* PyTorch's promote_types: the smallest dtype both convert to without
 * leaving their category (f16 with bf16 gives f32). CT_NUM_DTYPES, with an
 * error set, when either is not a dtype. */
ct_dtype ct_promote_types(ct_dtype a, ct_dtype b);

/* "cpu" or "cuda:0"; writes at most n bytes, returns buf. */
char *ct_device_str(ct_device d, char *buf, size_t n);
bool ct_device_eq(ct_device a, ct_device b);

/* Scalar conversions with PyTorch's rounding: float to f16/bf16 rounds to
 * nearest even, NaN and Inf are kept. */
uint16_t ct_f32_to_f16(float f);
float ct_f16_to_f32(uint16_t h);
uint16_t ct_f32_to_bf16(float f);
float ct_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
