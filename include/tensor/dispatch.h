/* cten: operator ids, the dispatch table query, tracing, profiling, threads
 * and what the library knows about its backends. */
#ifndef CTEN_DISPATCH_H
#define CTEN_DISPATCH_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ct_op enum (CT_OP_ADD, ...) and CT_OP_LIST(X), an X-macro of every
 * dispatchable op's id suffix and trace name, generated from the op schema. */
#include "tensor/op_ids.h"

/* "add", "conv2d", ...; "invalid" for an unknown id. */
const char *ct_op_name(ct_op op);
/* True when a kernel is registered for (op, device type, dtype). */
bool ct_supports(ct_op op, ct_device_type device, ct_dtype dtype);
/* The registered kernel's name, or NULL. */
const char *ct_kernel_name(ct_op op, ct_device_type device, ct_dtype dtype);

/* ---- trace and profile ---------------------------------------------------------
 * CT_TRACE=1 in the environment (read once, at library init) prints one line
 * per dispatched op on stderr: op, device, dtype, input shapes, the kernel or
 * library routine that ran, and its wall time; a failed op's line ends with
 * FAILED, the status and the error message, and a call refused before any
 * kernel ran (a bad argument, a missing kernel) gets a "[cten] FAILED" line
 * of its own. CT_TRACE may instead hold a filter, as ct_set_trace_filter
 * takes: CT_TRACE=matmul,conv2d or CT_TRACE=min=50us (or both). CT_PROFILE=1
 * aggregates per (op, device, dtype) and prints a table at exit; CT_PROFILE=sync
 * also makes the device wait before and after each timed op (trace and
 * profile), so a GPU op's time is the device's, not its launch's (the waits
 * serialize the host and the device: a step is slower, its shares are true).
 * All can be switched here. */
void ct_set_trace(bool on);
bool ct_trace_enabled(void);
/* Which traced lines show: a comma-separated list of op names ("matmul",
 * "ct_conv2d"; every op when none is named, or with "all"), and "min=<time>"
 * (a number with ns, us, ms or s), the shortest successful call shown;
 * failures show whatever their time. NULL or "" shows everything. An
 * unknown name or a bad time is CT_ERR_INVALID_ARG and changes nothing.
 * Does not turn the trace on (ct_set_trace does). */
ct_status ct_set_trace_filter(const char *spec);
void ct_set_profile(bool on);
bool ct_profile_enabled(void);
/* Device waits around each timed op (CT_PROFILE=sync); no effect on the CPU
 * or on a thread capturing a CUDA graph. A wait's error (a fault a kernel
 * found) is the op's. */
void ct_set_profile_sync(bool on);
bool ct_profile_sync_enabled(void);
/* Prints the profile table (count, total, mean per op) to f (a FILE *; NULL
 * means stderr). */
void ct_profile_print(void *file);
void ct_profile_reset(void);

/* ---- threads ---------------------------------------------------------------------
 * One setting for the CPU: the library's own pool and OpenBLAS share it, and
 * one op never runs both at once, so they do not fight over cores (ops of
 * several calling threads may overlap; see "Threads" in tensor.h). The
 * default is the number of cores the process may run on, or CT_NUM_THREADS
 * from the environment. ct_set_num_threads resizes OpenBLAS too: call it
 * while no other thread runs ops. */
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
