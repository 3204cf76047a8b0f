/* The thread-local last-error channel. */
#include <stdatomic.h>
#include <stdio.h>

#include "tensor_impl.h"

#define CTI_ERRBUF 1024

static _Thread_local ct_status last_status = CT_OK;
static _Thread_local char last_msg[CTI_ERRBUF];

ct_status ct_last_status(void) { return last_status; }
const char *ct_last_error(void) { return last_msg; }

void ct_clear_error(void) {
    last_status = CT_OK;
    last_msg[0] = '\0';
}

static _Atomic(cti_error_hook_fn) error_hook;

void cti_set_error_hook(cti_error_hook_fn fn) { atomic_store(&error_hook, fn); }

static void set_error(ct_status s, const char *fmt, va_list ap) {
    /* Messages may be built from the previous message (cti_desc strings live
     * elsewhere), so format into a scratch buffer first. */
    char tmp[CTI_ERRBUF];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(last_msg, tmp, sizeof tmp);
    last_status = s;
    cti_error_hook_fn hook = atomic_load_explicit(&error_hook, memory_order_relaxed);
    if (hook) hook(s, last_msg);
}

ct_status cti_error(ct_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error(s, fmt, ap);
    va_end(ap);
    return s;
}

ct_status cti_error_wrap(ct_status fallback, const char *prefix) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ct_last_error());
    ct_status s = ct_last_status();
    return cti_error(s != CT_OK ? s : fallback, "%s: %s", prefix, msg);
}

void *cti_error_null(ct_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error(s, fmt, ap);
    va_end(ap);
    return NULL;
}

const char *ct_status_name(ct_status s) {
    switch (s) {
    case CT_OK: return "CT_OK";
    case CT_ERR_INVALID_ARG: return "CT_ERR_INVALID_ARG";
    case CT_ERR_SHAPE: return "CT_ERR_SHAPE";
    case CT_ERR_DTYPE: return "CT_ERR_DTYPE";
    case CT_ERR_DEVICE: return "CT_ERR_DEVICE";
    case CT_ERR_INDEX: return "CT_ERR_INDEX";
    case CT_ERR_OVERFLOW: return "CT_ERR_OVERFLOW";
    case CT_ERR_OOM: return "CT_ERR_OOM";
    case CT_ERR_UNSUPPORTED: return "CT_ERR_UNSUPPORTED";
    case CT_ERR_IO: return "CT_ERR_IO";
    case CT_ERR_FORMAT: return "CT_ERR_FORMAT";
    case CT_ERR_AUTOGRAD: return "CT_ERR_AUTOGRAD";
    case CT_ERR_RUNTIME: return "CT_ERR_RUNTIME";
    case CT_ERR_CAPTURE: return "CT_ERR_CAPTURE";
    }
    return "CT_ERR_UNKNOWN";
}

/* A ring of buffers so one message can describe several tensors. */
#define CTI_RING 8
static _Thread_local char ring[CTI_RING][192];
static _Thread_local int ring_next;

static char *ring_buf(void) {
    char *b = ring[ring_next];
    ring_next = (ring_next + 1) % CTI_RING;
    return b;
}

const char *cti_shape_s(int ndim, const int64_t *shape) {
    char *b = ring_buf();
    return ct_shape_str(ndim, shape, b, sizeof ring[0]);
}

const char *cti_desc(const ct_tensor *t) {
    char *b = ring_buf();
    if (!t) {
        snprintf(b, sizeof ring[0], "NULL");
        return b;
    }
    char shape[128], dev[32];
    ct_shape_str(t->ndim, t->shape, shape, sizeof shape);
    ct_device_str(t->storage->device, dev, sizeof dev);
    snprintf(b, sizeof ring[0], "%s %s %s", shape, ct_dtype_name(t->dtype), dev);
    return b;
}

char *ct_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    size_t pos = 0;
    int w = snprintf(buf, n, "[");
    pos = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < ndim && pos < n; i++) {
        w = snprintf(buf + pos, n - pos, i ? ", %lld" : "%lld", (long long)shape[i]);
        if (w < 0) break;
        pos += (size_t)w;
    }
    if (pos < n) snprintf(buf + pos, n - pos, "]");
    return buf;
}
