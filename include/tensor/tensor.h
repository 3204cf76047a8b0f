/* cten: a tensor library in C in the spirit of PyTorch's ATen. Include this.
 *
 * Threads. The library may be used from several threads at once:
 * - Tensors are not synchronized objects. Different tensors, views of one
 *   storage included, may be used from different threads at the same time,
 *   as long as no thread writes elements that another thread reads or writes
 *   then. One tensor may be read by several threads at once (as an op's
 *   input, through views, properties, retain and release). A call that
 *   changes a tensor needs it to itself for its duration: in-place ops,
 *   ct_copy_, ct_fill_, ct_uniform_/ct_normal_, ct_requires_grad_,
 *   ct_set_grad, ct_zero_grad, optimizer steps, and ct_backward, which
 *   accumulates into the leaves' gradients and frees the graph it walks:
 *   results of recorded ops share graph nodes with their inputs, so one
 *   graph is backpropagated by one thread at a time.
 * - Reference counts are atomic: a handle may be retained on one thread and
 *   released on another; the last release frees it, on whichever thread.
 * - Per thread: the last error (ct_last_status, ct_last_error), grad mode
 *   (ct_set_grad_enabled, no-grad regions) and scopes. A scope owns only
 *   handles its own thread creates; ending another thread's scope does
 *   nothing, and a release on a thread whose scopes do not own the handle
 *   drops one of that thread's references (see ct_tensor_release).
 * - Generators may be shared: each draw reserves its own range of the stream
 *   atomically, so draws on several threads never overlap, but which thread
 *   gets which values depends on timing (the default generator, gen == NULL,
 *   is one such shared generator). Reseeding while another thread draws is
 *   allowed; which seed that draw uses is not specified. Give each thread its
 *   own generator for reproducible results.
 * - Parameter lists, layers, optimizers and data loaders are used by one
 *   thread at a time.
 * - Library state: initialization runs once, on whichever thread calls first,
 *   and concurrent first calls wait for it. The trace, profile and TF32
 *   switches are atomic, the profile table and the CPU block cache are locked.
 *   The CPU thread pool runs one op at a time: an op that finds it busy with
 *   another thread's op runs on its own thread instead, and since kernels
 *   split work the same way whatever the thread count, results do not depend
 *   on which thread got the pool. ct_set_num_threads may be called from any
 *   thread but also resizes OpenBLAS's threads, which is not safe during
 *   another thread's BLAS call: call it while no other thread runs ops. The
 *   CUDA backend's shared state (device discovery, the caching allocator,
 *   library handles, streams) is set up once and locked where it is shared.
 * tests/test_threads.c checks these rules under ThreadSanitizer. */
#ifndef CTEN_TENSOR_H
#define CTEN_TENSOR_H

#include "types.h"
#include "core.h"
#include "ops.h"
#include "dispatch.h"
#include "autograd.h"
#include "nn.h"
#include "io.h"
#include "dlpack.h"
#include "cuda.h"
#include "dist.h"

#endif
