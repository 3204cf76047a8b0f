/* Tensors as text, the way PyTorch's repr shows them: nested brackets,
 * one format for every element (fixed with 4 decimals, integers as "3.",
 * or scientific when the magnitudes span more than 1000 or leave
 * [1e-4, 1e8)), right-aligned to a common width, rows wrapped at 80
 * columns, and the middle of any dim longer than 6 elided with "..." once
 * the tensor has more than 1000 elements. A trailer gives what PyTorch
 * leaves implicit: shape, dtype and device, then requires_grad or the
 * grad_fn. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io_impl.h"
#include "tensor/autograd.h"

enum { EDGE = 3, THRESHOLD = 1000, LINE_WIDTH = 80, PRECISION = 4 };

/* A growing text; on allocation failure it stops growing and says so. */
typedef struct text {
    char *s;
    size_t len, cap;
    bool oom;
} text;

static void put(text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
        va_start(ap, fmt);
        vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

/* A CPU tensor whose elements are read through its strides. */
typedef struct view {
    const char *base;
    ct_dtype dt;
    size_t esize;
    int nd;
    const int64_t *shape, *strides;
    bool summarize;
} view;

static double read_f(const view *v, int64_t off) {
    const char *p = v->base + off * (int64_t)v->esize;
    switch (v->dt) {
    case CT_F64: return *(const double *)p;
    case CT_F32: return *(const float *)p;
    case CT_F16: return ct_f16_to_f32(*(const uint16_t *)p);
    case CT_BF16: return ct_bf16_to_f32(*(const uint16_t *)p);
    default: return 0;
    }
}

static int64_t read_i(const view *v, int64_t off) {
    const char *p = v->base + off * (int64_t)v->esize;
    switch (v->dt) {
    case CT_I64: return *(const int64_t *)p;
    case CT_I32: return *(const int32_t *)p;
    case CT_BOOL: return *(const uint8_t *)p != 0;
    default: return 0;
    }
}

/* Whether index i of dim d is shown, and whether "..." comes before it. */
static bool shown(const view *v, int d, int64_t i) {
    return !v->summarize || v->shape[d] <= 2 * EDGE || i < EDGE || i >= v->shape[d] - EDGE;
}

/* Calls fn on every shown element's offset. */
typedef void (*elem_fn)(const view *v, int64_t off, void *ctx);
static void each_shown(const view *v, int d, int64_t off, elem_fn fn, void *ctx) {
    if (d == v->nd) {
        fn(v, off, ctx);
        return;
    }
    for (int64_t i = 0; i < v->shape[d]; i++)
        if (shown(v, d, i)) each_shown(v, d + 1, off + i * v->strides[d], fn, ctx);
}

/* How every element is written. */
typedef struct format {
    enum { F_FIXED, F_INT_FLOAT, F_SCI, F_INT, F_BOOL } kind;
    int width;
} format;

typedef struct float_stats {
    double max, min; /* of |x| over the finite nonzero elements */
    bool any, all_int;
} float_stats;

static void gather_float(const view *v, int64_t off, void *ctx) {
    float_stats *s = ctx;
    double x = read_f(v, off);
    if (!isfinite(x)) return;
    if (x != floor(x)) s->all_int = false;
    double a = fabs(x);
    if (a == 0) return;
    if (!s->any || a > s->max) s->max = a;
    if (!s->any || a < s->min) s->min = a;
    s->any = true;
}

static int write_elem(const view *v, int64_t off, const format *f, char *buf, size_t n) {
    if (f->kind == F_BOOL) return snprintf(buf, n, "%s", read_i(v, off) ? "True" : "False");
    if (f->kind == F_INT) return snprintf(buf, n, "%" PRId64, read_i(v, off));
    double x = read_f(v, off);
    if (isnan(x)) return snprintf(buf, n, "nan");
    if (isinf(x)) return snprintf(buf, n, x > 0 ? "inf" : "-inf");
    if (f->kind == F_INT_FLOAT) return snprintf(buf, n, "%.0f.", x);
    if (f->kind == F_SCI) return snprintf(buf, n, "%.*e", PRECISION, x);
    return snprintf(buf, n, "%.*f", PRECISION, x);
}

typedef struct width_ctx {
    const format *f;
    int width;
} width_ctx;

static void gather_width(const view *v, int64_t off, void *ctx) {
    width_ctx *w = ctx;
    char buf[64];
    int n = write_elem(v, off, w->f, buf, sizeof buf);
    if (n > w->width) w->width = n;
}

static format choose_format(const view *v) {
    format f = {.kind = F_FIXED};
    if (v->dt == CT_BOOL) f.kind = F_BOOL;
    else if (!ct_dtype_is_floating(v->dt)) f.kind = F_INT;
    else {
        float_stats s = {.all_int = true};
        each_shown(v, 0, 0, gather_float, &s);
        if (s.any && s.all_int) f.kind = s.max > 1e8 ? F_SCI : F_INT_FLOAT;
        else if (s.any && (s.max / s.min > 1000 || s.max > 1e8 || s.min < 1e-4)) f.kind = F_SCI;
    }
    width_ctx w = {.f = &f};
    each_shown(v, 0, 0, gather_width, &w);
    f.width = w.width;
    return f;
}

/* Dim d at offset off; indent is the column the dim's '[' sits at. */
static void write_dim(text *b, const view *v, const format *f, int d, int64_t off, int indent) {
    put(b, "[");
    int64_t n = v->shape[d];
    bool first = true;
    if (d == v->nd - 1) {
        /* Elements per line so a line stays within LINE_WIDTH. */
        int per = (LINE_WIDTH - indent - 1) / (f->width + 2);
        if (per < 1) per = 1;
        int on_line = 0;
        for (int64_t i = 0; i < n; i++) {
            if (!shown(v, d, i)) {
                if (i == EDGE) {
                    put(b, ",  ...");
                    on_line++;
                }
                continue;
            }
            if (!first) {
                if (on_line >= per) {
                    put(b, ",\n%*s", indent + 1, "");
                    on_line = 0;
                } else {
                    put(b, ", ");
                }
            }
            char buf[64];
            write_elem(v, off + i * v->strides[d], f, buf, sizeof buf);
            put(b, "%*s", f->width, buf);
            on_line++;
            first = false;
        }
    } else {
        /* Between sub-blocks: one newline per dim below, as PyTorch. */
        int gap = v->nd - d - 1;
        for (int64_t i = 0; i < n; i++) {
            if (!shown(v, d, i)) {
                if (i == EDGE) {
                    put(b, ",");
                    for (int k = 0; k < gap; k++) put(b, "\n");
                    put(b, "%*s...", indent + 1, "");
                }
                continue;
            }
            if (!first) {
                put(b, ",");
                for (int k = 0; k < gap; k++) put(b, "\n");
                put(b, "%*s", indent + 1, "");
            }
            write_dim(b, v, f, d + 1, off + i * v->strides[d], indent + 1);
            first = false;
        }
    }
    put(b, "]");
}

static void write_trailer(text *b, const ct_tensor *t) {
    char shape[256], dev[32];
    ct_shape_str(ct_tensor_ndim(t), ct_tensor_shape(t), shape, sizeof shape);
    put(b, ", shape=%s, dtype=%s, device=%s", shape, ct_dtype_name(ct_tensor_dtype(t)),
        ct_device_str(ct_tensor_device(t), dev, sizeof dev));
    const char *fn = ct_grad_fn_name(t);
    if (fn) put(b, ", grad_fn=<%s>", fn);
    else if (ct_requires_grad(t)) put(b, ", requires_grad=true");
    put(b, ")");
}

/* The whole text, malloc'ed, or NULL with the error set. */
static char *format_tensor(const char *op, const ct_tensor *t) {
    if (!t) return cti_error_null(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    ct_tensor *cpu = NULL;
    if (ct_tensor_device(t).type != CT_DEVICE_CPU) {
        cpu = ct_to_device((ct_tensor *)t, CT_CPU);
        if (!cpu) return cti_error_null(ct_last_status(), "%s: %s", op, ct_last_error());
    }
    const ct_tensor *c = cpu ? cpu : t;
    view v = {
        .base = ct_tensor_data_ptr(c),
        .dt = ct_tensor_dtype(c),
        .esize = ct_dtype_size(ct_tensor_dtype(c)),
        .nd = ct_tensor_ndim(c),
        .shape = ct_tensor_shape(c),
        .strides = ct_tensor_strides(c),
        .summarize = ct_tensor_numel(c) > THRESHOLD,
    };
    text b = {0};
    put(&b, "tensor(");
    if (ct_tensor_numel(c) == 0) {
        put(&b, "[]");
    } else if (v.nd == 0) {
        format f = choose_format(&v);
        char buf[64];
        write_elem(&v, 0, &f, buf, sizeof buf);
        put(&b, "%s", buf);
    } else {
        format f = choose_format(&v);
        write_dim(&b, &v, &f, 0, 0, (int)strlen("tensor("));
    }
    write_trailer(&b, t);
    ct_tensor_release(cpu);
    if (b.oom) {
        free(b.s);
        return cti_error_null(CT_ERR_OOM, "%s: out of memory formatting a tensor", op);
    }
    return b.s;
}

int64_t ct_tensor_str(const ct_tensor *t, char *buf, size_t n) {
    char *s = format_tensor("ct_tensor_str", t);
    if (!s) return -1;
    size_t len = strlen(s);
    if (buf && n > 0) {
        size_t k = len < n - 1 ? len : n - 1;
        memcpy(buf, s, k);
        buf[k] = '\0';
    }
    free(s);
    return (int64_t)len;
}

ct_status ct_print(const ct_tensor *t) { return ct_fprint(t, stdout); }

ct_status ct_fprint(const ct_tensor *t, void *file) {
    char *s = format_tensor("ct_print", t);
    if (!s) return ct_last_status();
    FILE *f = file ? (FILE *)file : stdout;
    int r = fprintf(f, "%s\n", s);
    free(s);
    if (r < 0) return cti_error(CT_ERR_IO, "ct_print: writing the text failed");
    return CT_OK;
}
