/* cten: exchanging tensors with other libraries through DLPack (PyTorch,
 * NumPy, CuPy, JAX, TensorFlow), without copies. docs/INTEROP.md has the
 * contracts in full.
 *
 * The DLPack structs are only declared here, so a program that does not
 * exchange tensors needs no DLPack header; one that does includes
 * <dlpack/dlpack.h> (Debian: libdlpack-dev) for their fields.
 *
 * Memory is shared, never copied: a write through either side is seen by
 * the other. cten tensors are always writable, so cten exports with no
 * read-only flag and refuses read-only imports. Devices: CPU, CUDA (the
 * device's memory, with the same index) and, on import, CUDA host memory
 * (kDLCUDAHost, used as CPU memory). dtypes: every cten dtype; bool travels
 * as kDLBool where the DLPack header has it, else as uint8 (kDLUInt, 8 bits),
 * which cten takes back only from its own exports (it has no uint8).
 * Errors: NULL with the message in ct_last_error(), naming the function and
 * what was expected. */
#ifndef CTEN_DLPACK_H
#define CTEN_DLPACK_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct DLManagedTensor;
struct DLManagedTensorVersioned;

/* A DLManagedTensor viewing t's elements (its shape, strides in elements
 * and offset; data points at the first element, byte_offset is 0), which
 * keeps t's storage alive until the consumer calls its deleter, exactly
 * once, on any thread. t stays the caller's. A CUDA tensor's pending work
 * is waited for first, so the consumer may read it on any stream. */
struct DLManagedTensor *ct_to_dlpack(ct_tensor *t);
/* A new tensor over m's memory (caller owns it): m's shape, strides (NULL:
 * row-major) and data + byte_offset, which must be aligned to the element
 * size, with strides not negative. cten takes m over: m's deleter (when not
 * NULL) is called exactly once, when the last cten reference to the memory
 * goes (after waiting for cten's work on a CUDA device). On failure m is
 * left untouched and still the caller's. The producer's pending work on a
 * CUDA tensor must be complete (DLPack's contract for C callers). */
ct_tensor *ct_from_dlpack(struct DLManagedTensor *m);

/* Whether this build knows DLManagedTensorVersioned (DLPack >= 1.0 headers
 * at build time). Without it the two functions below fail with
 * CT_ERR_UNSUPPORTED. */
bool ct_dlpack_has_versioned(void);
/* As ct_to_dlpack, in the versioned struct: version is the header's, flags
 * are 0 (writable, not a copy). */
struct DLManagedTensorVersioned *ct_to_dlpack_versioned(ct_tensor *t);
/* As ct_from_dlpack. Refuses (CT_ERR_INVALID_ARG, m untouched) a major
 * version other than the header's and a read-only tensor
 * (DLPACK_FLAG_BITMASK_READ_ONLY): cten would write where the producer
 * forbids it; copy it on the producer's side first. */
ct_tensor *ct_from_dlpack_versioned(struct DLManagedTensorVersioned *m);

#ifdef __cplusplus
}
#endif
#endif
