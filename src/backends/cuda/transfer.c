/* CT_OP_COPY and CT_OP_FILL for CUDA tensors.
 *
 * The dispatcher sends every copy with a CUDA side here: host to device,
 * device to host, and device to device on one GPU or across two. A copy
 * may also convert the dtype and broadcast the source; that work is done on
 * the GPU, and only bytes in the source's or destination's own dtype cross
 * the bus. Copies to the host wait for the device (the caller reads the
 * result next); the others are queued on the device's stream and return.
 *
 * Host memory the driver does not know (pageable) cannot be read or written
 * by the copy engines directly. Large transfers go through two pinned
 * staging buffers per device, one filled or drained by the CPU while the
 * other is on the bus; buffers the caller pinned are used directly. */
#include <pthread.h>
#include <stdlib.h>

#include "cuda_impl.h"

#define STAGE_MIN ((size_t)1 << 20)
#define STAGE_CHUNK ((size_t)4 << 20)

static int dev_index(const ct_tensor *t) { return t->storage->device.index; }
static bool on_cuda(const ct_tensor *t) { return t->storage->device.type == CT_DEVICE_CUDA; }
static int64_t numel(const ct_tensor *t) { return cti_numel(t->ndim, t->shape); }
static size_t nbytes(const ct_tensor *t) { return (size_t)numel(t) * ct_dtype_size(t->dtype); }

/* src's elements in dst's order as one flat run of the same dtype: a plain
 * memory copy does the whole job. */
static bool flat_same(const ct_tensor *dst, const ct_tensor *src) {
    return dst->dtype == src->dtype && numel(dst) == numel(src) && cti_is_contiguous(dst) &&
           cti_is_contiguous(src);
}

/* ---- pinned staging -------------------------------------------------------------------- */

typedef struct staging {
    pthread_mutex_t lock;
    void *buf[2];
    cudaEvent_t done[2]; /* the last transfer from or into buf[i] */
    bool ready, failed;
} staging;

static staging stages[CTI_CUDA_MAX_DEVICES];
static pthread_once_t stages_once = PTHREAD_ONCE_INIT;

static void init_stages(void) {
    for (int i = 0; i < CTI_CUDA_MAX_DEVICES; i++) pthread_mutex_init(&stages[i].lock, NULL);
}

/* The pinned buffers are returned at exit, so leak checkers see none. */
static void free_stages(void) {
    for (int d = 0; d < CTI_CUDA_MAX_DEVICES; d++) {
        staging *s = &stages[d];
        if (!s->ready) continue;
        if (cudaSetDevice(d) != cudaSuccess) continue;
        for (int i = 0; i < 2; i++) {
            cudaEventSynchronize(s->done[i]);
            cudaEventDestroy(s->done[i]);
            cudaFreeHost(s->buf[i]);
        }
        s->ready = false;
    }
    cudaGetLastError();
}

static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static void register_exit(void) { atexit(free_stages); }

/* Locks dev's staging buffers (the caller unlocks) and reports whether they
 * can be used; a machine that refuses pinned memory gets plain copies. The
 * device must be current. */
static bool stage_lock(int dev) {
    pthread_once(&stages_once, init_stages);
    staging *s = &stages[dev];
    pthread_mutex_lock(&s->lock);
    if (s->ready || s->failed) return s->ready;
    bool ok = true;
    for (int i = 0; i < 2 && ok; i++) {
        ok = cudaHostAlloc(&s->buf[i], STAGE_CHUNK, cudaHostAllocDefault) == cudaSuccess;
        if (ok) ok = cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming) == cudaSuccess;
    }
    cudaGetLastError();
    if (ok) {
        s->ready = true;
        pthread_once(&exit_once, register_exit);
        return true;
    }
    s->failed = true;
    for (int i = 0; i < 2; i++)
        if (s->buf[i]) cudaFreeHost(s->buf[i]);
    cudaGetLastError();
    return false;
}

static void stage_unlock(int dev) { pthread_mutex_unlock(&stages[dev].lock); }

static bool host_pinned(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

static size_t chunk_len(size_t n, size_t k) {
    size_t off = k * STAGE_CHUNK;
    return n - off < STAGE_CHUNK ? n - off : STAGE_CHUNK;
}

/* n bytes from host to device, queued on stream. When it returns, the host
 * bytes have been read: the caller may free or change them. */
static ct_status upload(const char *op, int dev, cudaStream_t stream, void *dst, const void *src,
                        size_t n, const char **routine) {
    cudaError_t e;
    bool pinned = n >= STAGE_MIN && host_pinned(src);
    if (n < STAGE_MIN || pinned || !stage_lock(dev)) {
        if (n >= STAGE_MIN && !pinned) stage_unlock(dev);
        *routine = "cudaMemcpyAsync(HostToDevice)";
        e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream);
        if (e != cudaSuccess) return cti_cuda_fail(op, dev, "cudaMemcpyAsync", e);
        /* From pageable memory the runtime has staged the bytes on return;
         * from pinned memory the engine reads them later, so wait. */
        return pinned ? cti_cuda_sync(op, dev) : CT_OK;
    }
    *routine = "pinned staging+cudaMemcpyAsync(HostToDevice)";
    staging *s = &stages[dev];
    ct_status st = CT_OK;
    for (size_t k = 0; k * STAGE_CHUNK < n && st == CT_OK; k++) {
        size_t len = chunk_len(n, k);
        int b = (int)(k & 1);
        if ((e = cudaEventSynchronize(s->done[b])) != cudaSuccess) {
            st = cti_cuda_fail(op, dev, "cudaEventSynchronize", e);
            break;
        }
        memcpy(s->buf[b], (const char *)src + k * STAGE_CHUNK, len);
        e = cudaMemcpyAsync((char *)dst + k * STAGE_CHUNK, s->buf[b], len, cudaMemcpyHostToDevice,
                            stream);
        if (e == cudaSuccess) e = cudaEventRecord(s->done[b], stream);
        if (e != cudaSuccess) st = cti_cuda_fail(op, dev, "cudaMemcpyAsync", e);
    }
    stage_unlock(dev);
    return st;
}

/* n bytes from device to host after the work queued before it; waits. */
static ct_status download(const char *op, int dev, cudaStream_t stream, void *dst, const void *src,
                          size_t n, const char **routine) {
    cudaError_t e;
    bool pinned = n >= STAGE_MIN && host_pinned(dst);
    if (n < STAGE_MIN || pinned || !stage_lock(dev)) {
        if (n >= STAGE_MIN && !pinned) stage_unlock(dev);
        *routine = "cudaMemcpyAsync(DeviceToHost)";
        e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream);
        if (e != cudaSuccess) return cti_cuda_fail(op, dev, "cudaMemcpyAsync", e);
        return cti_cuda_sync(op, dev);
    }
    *routine = "cudaMemcpyAsync(DeviceToHost)+pinned staging";
    staging *s = &stages[dev];
    size_t chunks = (n + STAGE_CHUNK - 1) / STAGE_CHUNK;
    ct_status st = CT_OK;
    /* Two chunks in flight; each is copied out while the next one moves. */
    for (size_t k = 0; k < chunks && k < 2 && st == CT_OK; k++) {
        e = cudaMemcpyAsync(s->buf[k], (const char *)src + k * STAGE_CHUNK, chunk_len(n, k),
                            cudaMemcpyDeviceToHost, stream);
        if (e == cudaSuccess) e = cudaEventRecord(s->done[k], stream);
        if (e != cudaSuccess) st = cti_cuda_fail(op, dev, "cudaMemcpyAsync", e);
    }
    for (size_t k = 0; k < chunks && st == CT_OK; k++) {
        int b = (int)(k & 1);
        if ((e = cudaEventSynchronize(s->done[b])) != cudaSuccess) {
            st = cti_cuda_fail(op, dev, "cudaEventSynchronize", e);
            break;
        }
        memcpy((char *)dst + k * STAGE_CHUNK, s->buf[b], chunk_len(n, k));
        if (k + 2 < chunks) {
            e = cudaMemcpyAsync(s->buf[b], (const char *)src + (k + 2) * STAGE_CHUNK,
                                chunk_len(n, k + 2), cudaMemcpyDeviceToHost, stream);
            if (e == cudaSuccess) e = cudaEventRecord(s->done[b], stream);
            if (e != cudaSuccess) st = cti_cuda_fail(op, dev, "cudaMemcpyAsync", e);
        }
    }
    if (st != CT_OK) cudaStreamSynchronize(stream); /* leave no copy into the buffers */
    cudaGetLastError();
    stage_unlock(dev);
    /* The last chunk's event came after all work queued before the copy. */
    return st == CT_OK ? cti_cuda_take_fault(op, dev) : st;
}

/* ---- copies on one device -------------------------------------------------------------- */

/* dst <- src, both on device dev (current), queued on stream. */
static ct_status device_copy(const char *op, int dev, cudaStream_t stream, ct_tensor *dst,
                             const ct_tensor *src, const char **routine) {
    cudaError_t e;
    if (flat_same(dst, src)) {
        *routine = "cudaMemcpyAsync(DeviceToDevice)";
        e = cudaMemcpyAsync(cti_data(dst), cti_data(src), nbytes(dst), cudaMemcpyDeviceToDevice,
                            stream);
    } else if (numel(dst) == numel(src) && cti_is_contiguous(dst) && cti_is_contiguous(src)) {
        *routine = "cuda_convert_contiguous";
        e = cti_cuda_convert_contiguous(cti_data(dst), dst->dtype, cti_data(src), src->dtype,
                                        numel(dst), cti_cuda_sm_count(dev), stream);
    } else {
        *routine = "cuda_copy_strided";
        cti_cuda_iter it;
        ct_tensor *ops[2] = {dst, (ct_tensor *)src};
        cti_cuda_iter_init(&it, 2, ops);
        if (dst->dtype == src->dtype) {
            int es = (int)ct_dtype_size(dst->dtype);
            int unit = cti_cuda_iter_widen(&it, es, cti_data(dst), cti_data(src));
            e = cti_cuda_move_strided(cti_data(dst), cti_data(src), unit, &it,
                                      cti_cuda_sm_count(dev), stream);
        } else {
            e = cti_cuda_copy_strided(cti_data(dst), dst->dtype, cti_data(src), src->dtype, &it,
                                      cti_cuda_sm_count(dev), stream);
        }
    }
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, *routine, e);
    return cti_cuda_launched(op, dev, "copy");
}

/* A contiguous temporary on CUDA device dev. */
static ct_tensor *device_temp(const char *op, int ndim, const int64_t *shape, ct_dtype dt,
                              int dev) {
    return cti_tensor_new(op, ndim, shape, dt, CT_CUDA(dev));
}

/* dst <- src on the CPU, through the CPU backend's kernel. */
static ct_status cpu_copy(ct_tensor *dst, const ct_tensor *src) {
    ct_tensor *in = (ct_tensor *)src;
    return cti_dispatch_one(CT_OP_COPY, NULL, 0, 1, &in, dst, CT_CPU, dst->dtype);
}

/* ---- the four directions ------------------------------------------------------------------- */

static ct_status host_to_device(const char *op, ct_tensor *dst, const ct_tensor *src,
                                const char **routine) {
    int dev = dev_index(dst);
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    /* Only src's own elements cross the bus, contiguous, in src's dtype;
     * broadcasting and conversion happen on the device. */
    ct_tensor *hold = NULL;
    const ct_tensor *from = src;
    if (!cti_is_contiguous(src)) {
        hold = cti_tensor_new(op, src->ndim, src->shape, src->dtype, CT_CPU);
        if (!hold) return ct_last_status();
        if (cpu_copy(hold, src) != CT_OK) {
            ct_tensor_release(hold);
            return ct_last_status();
        }
        from = hold;
    }
    ct_status st;
    if (flat_same(dst, from)) {
        st = upload(op, dev, stream, cti_data(dst), cti_data(from), nbytes(dst), routine);
    } else {
        ct_tensor *tmp = device_temp(op, from->ndim, from->shape, from->dtype, dev);
        st = tmp ? upload(op, dev, stream, cti_data(tmp), cti_data(from), nbytes(from), routine)
                 : ct_last_status();
        const char *r2;
        if (st == CT_OK) st = device_copy(op, dev, stream, dst, tmp, &r2);
        ct_tensor_release(tmp); /* reuse is ordered after the copy on the stream */
    }
    ct_tensor_release(hold);
    return st;
}

static ct_status device_to_host(const char *op, ct_tensor *dst, const ct_tensor *src,
                                const char **routine) {
    int dev = dev_index(src);
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    /* Convert and broadcast on the device, so what crosses the bus is dst's
     * elements in dst's dtype, contiguous. */
    ct_tensor *packed = NULL, *host = NULL;
    const ct_tensor *from = src;
    ct_status st = CT_OK;
    const char *r2;
    if (!(src->dtype == dst->dtype && numel(src) == numel(dst) && cti_is_contiguous(src))) {
        packed = device_temp(op, dst->ndim, dst->shape, dst->dtype, dev);
        st = packed ? device_copy(op, dev, stream, packed, src, &r2) : ct_last_status();
        from = packed;
    }
    if (st == CT_OK && cti_is_contiguous(dst)) {
        st = download(op, dev, stream, cti_data(dst), cti_data(from), nbytes(dst), routine);
    } else if (st == CT_OK) {
        host = cti_tensor_new(op, dst->ndim, dst->shape, dst->dtype, CT_CPU);
        st = host ? download(op, dev, stream, cti_data(host), cti_data(from), nbytes(dst), routine)
                  : ct_last_status();
        if (st == CT_OK) st = cpu_copy(dst, host);
    }
    ct_tensor_release(host);
    ct_tensor_release(packed);
    return st;
}

static ct_status same_device(const char *op, ct_tensor *dst, const ct_tensor *src,
                             const char **routine) {
    int dev = dev_index(dst);
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    return device_copy(op, dev, stream, dst, src, routine);
}

/* Between two GPUs: made compact in dst's dtype on the source GPU, moved
 * with a peer copy ordered after both devices' queued work, placed on the
 * destination GPU. Waits at the end, since either side's stream may reuse
 * the memory involved right after. */
static ct_status cross_device(const char *op, ct_tensor *dst, const ct_tensor *src,
                              const char **routine) {
    int sd = dev_index(src), dd = dev_index(dst);
    cudaStream_t ss, ds;
    const char *r2;
    if (cti_cuda_begin(op, sd, &ss) != CT_OK) return ct_last_status();
    ct_tensor *packed = NULL, *landed = NULL;
    const ct_tensor *from = src;
    ct_status st = CT_OK;
    if (!(src->dtype == dst->dtype && numel(src) == numel(dst) && cti_is_contiguous(src))) {
        packed = device_temp(op, dst->ndim, dst->shape, dst->dtype, sd);
        st = packed ? device_copy(op, sd, ss, packed, src, &r2) : ct_last_status();
        from = packed;
    }
    cudaEvent_t ready = NULL;
    cudaError_t e = cudaSuccess;
    if (st == CT_OK) {
        e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventRecord(ready, ss);
        if (e != cudaSuccess) st = cti_cuda_fail(op, sd, "cudaEventRecord", e);
    }
    if (st == CT_OK) st = cti_cuda_begin(op, dd, &ds);
    if (st == CT_OK && (e = cudaStreamWaitEvent(ds, ready, 0)) != cudaSuccess)
        st = cti_cuda_fail(op, dd, "cudaStreamWaitEvent", e);
    if (st == CT_OK) {
        ct_tensor *target = dst;
        if (!cti_is_contiguous(dst)) {
            landed = device_temp(op, dst->ndim, dst->shape, dst->dtype, dd);
            target = landed;
            if (!landed) st = ct_last_status();
        }
        *routine = "cudaMemcpyPeerAsync";
        if (st == CT_OK &&
            (e = cudaMemcpyPeerAsync(cti_data(target), dd, cti_data(from), sd, nbytes(dst), ds)) !=
                cudaSuccess)
            st = cti_cuda_fail(op, dd, "cudaMemcpyPeerAsync", e);
        if (st == CT_OK && landed) st = device_copy(op, dd, ds, dst, landed, &r2);
        if (st == CT_OK) st = cti_cuda_sync(op, dd);
    }
    if (ready) cudaEventDestroy(ready);
    ct_tensor_release(packed);
    ct_tensor_release(landed);
    return st;
}

/* in[0] = src, out[0] = dst; src broadcasts to dst (checked by the front end). */
static ct_status k_copy(ct_call *c) {
    ct_tensor *dst = c->out[0];
    const ct_tensor *src = c->in[0];
    static const char op[] = "ct_copy_";
    if (numel(dst) == 0) return CT_OK;
    const char *routine = NULL;
    ct_status st;
    if (on_cuda(dst) && on_cuda(src))
        st = dev_index(dst) == dev_index(src) ? same_device(op, dst, src, &routine)
                                              : cross_device(op, dst, src, &routine);
    else if (on_cuda(dst))
        st = host_to_device(op, dst, src, &routine);
    else
        st = device_to_host(op, dst, src, &routine);
    c->routine = routine;
    return st;
}

/* ---- fill ------------------------------------------------------------------------------------ */

static int32_t f2i32(double v) {
    if (v != v) return 0;
    if (v >= 2147483648.0) return INT32_MAX;
    if (v <= -2147483649.0) return INT32_MIN;
    return (int32_t)v;
}

static int64_t f2i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

/* v as dtype's bytes, converted as the CPU backend converts. */
static void encode_value(double v, ct_dtype dt, void *out) {
    switch (dt) {
    case CT_BOOL: *(uint8_t *)out = v != 0; break;
    case CT_I32: *(int32_t *)out = f2i32(v); break;
    case CT_I64: *(int64_t *)out = f2i64(v); break;
    case CT_F16: *(uint16_t *)out = ct_f32_to_f16((float)v); break;
    case CT_BF16: *(uint16_t *)out = ct_f32_to_bf16((float)v); break;
    case CT_F32: *(float *)out = (float)v; break;
    default: *(double *)out = v; break;
    }
}

/* out[0] = dst <- value, every element. */
static ct_status k_fill(ct_call *c) {
    static const char op[] = "ct_fill_";
    const cti_fill_params *p = CTI_PARAMS(c, cti_fill_params);
    ct_tensor *dst = c->out[0];
    if (numel(dst) == 0) return CT_OK;
    int dev = dev_index(dst);
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    unsigned char bytes[8];
    size_t es = ct_dtype_size(dst->dtype);
    encode_value(p->value, dst->dtype, bytes);
    bool uniform = true;
    for (size_t k = 1; k < es; k++) uniform &= bytes[k] == bytes[0];
    cudaError_t e;
    if (uniform && cti_is_contiguous(dst)) {
        c->routine = "cudaMemsetAsync";
        e = cudaMemsetAsync(cti_data(dst), bytes[0], nbytes(dst), stream);
    } else {
        c->routine = "cuda_fill";
        cti_cuda_iter it;
        cti_cuda_iter_init(&it, 1, &dst);
        e = cti_cuda_fill(cti_data(dst), (int)es, bytes, &it, cti_cuda_sm_count(dev), stream);
    }
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, c->routine, e);
    return cti_cuda_launched(op, dev, "fill");
}

void cti_cuda_register_copy(void) {
    for (int d = 0; d < CT_NUM_DTYPES; d++) {
        cti_register_kernel(CT_OP_COPY, CT_DEVICE_CUDA, (ct_dtype)d, k_copy, "cuda_copy");
        cti_register_kernel(CT_OP_FILL, CT_DEVICE_CUDA, (ct_dtype)d, k_fill, "cuda_fill");
    }
}
