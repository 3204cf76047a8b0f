/* CPU kernels of the indexing and shape ops (schema.h's contracts):
 *
 *   SCATTER, SCATTER_REDUCE   one task walks whole lines along dim, so each
 *                             output element is reduced in index order
 *                             whatever the thread count (the CUDA kernel
 *                             runs one thread per line in the same order)
 *   FLIP, ROLL, REPEAT, PAD   one copy kernel: each output row (every dim but
 *                             the last fixed) is a few runs of the input row
 *                             (forward, reversed, one element repeated, or the
 *                             fill value), contiguous runs by memcpy
 *   INTERPOLATE (+ backward)  nearest and bilinear, PyTorch's coordinates;
 *                             the backward accumulates plane by plane
 *   UNFOLD, FOLD              im2col, and col2im as a gather per pixel (no
 *                             two tasks write one pixel, sums in a fixed order)
 * The front ends hand INTERPOLATE, UNFOLD and FOLD contiguous inputs; the
 * others read strides. */
#include <math.h>
#include <stdlib.h>

#include "cpu_impl.h"

/* ---- element access ------------------------------------------------------------------------ */

static inline double load_f(const char *p, ct_dtype dt) {
    switch (dt) {
    case CT_F32: return *(const float *)p;
    case CT_F64: return *(const double *)p;
    case CT_F16: return cti_f16_to_f32(*(const uint16_t *)p);
    case CT_BF16: return cti_bf16_to_f32(*(const uint16_t *)p);
    default: return 0;
    }
}

static inline void store_f(char *p, ct_dtype dt, double v) {
    switch (dt) {
    case CT_F32: *(float *)p = (float)v; break;
    case CT_F64: *(double *)p = v; break;
    case CT_F16: *(uint16_t *)p = cti_f32_to_f16((float)v); break;
    case CT_BF16: *(uint16_t *)p = cti_f32_to_bf16((float)v); break;
    default: break;
    }
}

/* ---- scatter -------------------------------------------------------------------------------- */

static const char *scatter_label(const cti_scatter_params *p) {
    return p->from_reduce ? "ct_scatter_reduce" : "ct_scatter";
}

/* Element offset of row-major position p of shape (nd dims) with strides st. */
static inline int64_t offset_of(int64_t p, int nd, const int64_t *shape, const int64_t *st) {
    int64_t off = 0;
    for (int k = nd - 1; k >= 0; k--) {
        int64_t n = shape[k] > 0 ? shape[k] : 1;
        off += p % n * st[k];
        p /= n;
    }
    return off;
}

static ct_status scatter_check(const char *op, const ct_tensor *idx, int dim, int64_t size) {
    int64_t n = cti_numel(idx->ndim, idx->shape);
    const int64_t *ib = (const int64_t *)cti_data(idx);
    for (int64_t p = 0; p < n; p++) {
        int64_t v = ib[offset_of(p, idx->ndim, idx->shape, idx->stride)];
        if (v >= 0 && v < size) continue;
        if (size > 0)
            return cti_error(CT_ERR_INDEX,
                             "%s: index %lld is out of range for dim %d of size %lld "
                             "(expected 0..%lld)",
                             op, (long long)v, dim, (long long)size, (long long)(size - 1));
        return cti_error(CT_ERR_INDEX,
                         "%s: index %lld is out of range for dim %d of size 0 (no index is valid)",
                         op, (long long)v, dim);
    }
    return CT_OK;
}

typedef struct scatter_ctx {
    ct_call *c;
    int dim, reduce;
    int64_t lshape[CT_MAX_DIMS]; /* index's shape with 1 along dim */
    int64_t ost[CT_MAX_DIMS];    /* out's strides, 0 along dim */
} scatter_ctx;

/* v = reduce(*dst, s) for the floating dtypes, in the value's precision. */
static inline double reduce_f(int r, double cur, double s) {
    switch (r) {
    case CTI_SCATTER_SUM: return cur + s;
    case CTI_SCATTER_PROD: return cur * s;
    case CTI_SCATTER_AMAX: return (isnan(s) || s > cur) ? s : cur;
    case CTI_SCATTER_AMIN: return (isnan(s) || s < cur) ? s : cur;
    default: return s;
    }
}

static inline int64_t reduce_i(int r, int64_t cur, int64_t s, ct_dtype dt) {
    switch (r) {
    case CTI_SCATTER_SUM:
        if (dt == CT_BOOL) return cur | s;
        if (dt == CT_I32) return (int32_t)((uint32_t)cur + (uint32_t)s);
        return (int64_t)((uint64_t)cur + (uint64_t)s);
    case CTI_SCATTER_PROD:
        if (dt == CT_BOOL) return cur & s;
        if (dt == CT_I32) return (int32_t)((uint32_t)cur * (uint32_t)s);
        return (int64_t)((uint64_t)cur * (uint64_t)s);
    case CTI_SCATTER_AMAX: return s > cur ? s : cur;
    case CTI_SCATTER_AMIN: return s < cur ? s : cur;
    default: return s;
    }
}

static inline int64_t load_i(const char *p, ct_dtype dt) {
    return dt == CT_I64 ? *(const int64_t *)p : dt == CT_I32 ? *(const int32_t *)p : *(const uint8_t *)p;
}

static inline void store_i(char *p, ct_dtype dt, int64_t v) {
    if (dt == CT_I64) *(int64_t *)p = v;
    else if (dt == CT_I32) *(int32_t *)p = (int32_t)v;
    else *(uint8_t *)p = (uint8_t)(v != 0);
}

static void scatter_task(int64_t l0, int64_t l1, void *ctx) {
    scatter_ctx *g = ctx;
    ct_tensor *idx = g->c->in[1], *src = g->c->in[2], *out = g->c->out[0];
    ct_dtype dt = out->dtype;
    size_t es = ct_dtype_size(dt);
    int nd = idx->ndim, d = g->dim;
    int64_t len = idx->shape[d], od = out->stride[d], id = idx->stride[d], sd = src->stride[d];
    const int64_t *ib = (const int64_t *)cti_data(idx);
    const char *sb = cti_data(src);
    char *ob = cti_data(out);
    bool fl = ct_dtype_is_floating(dt);
    for (int64_t l = l0; l < l1; l++) {
        int64_t oo = offset_of(l, nd, g->lshape, g->ost);
        int64_t io = offset_of(l, nd, g->lshape, idx->stride);
        int64_t so = offset_of(l, nd, g->lshape, src->stride);
        for (int64_t j = 0; j < len; j++) {
            char *dst = ob + (oo + ib[io + j * id] * od) * (int64_t)es;
            const char *s = sb + (so + j * sd) * (int64_t)es;
            if (g->reduce == CTI_SCATTER_ASSIGN) memcpy(dst, s, es);
            else if (fl) store_f(dst, dt, reduce_f(g->reduce, load_f(dst, dt), load_f(s, dt)));
            else store_i(dst, dt, reduce_i(g->reduce, load_i(dst, dt), load_i(s, dt), dt));
        }
    }
}

/* in x, index, src; out out (holding x). */
static ct_status k_scatter(ct_call *c) {
    const cti_scatter_params *p = CTI_PARAMS(c, cti_scatter_params);
    ct_tensor *idx = c->in[1];
    ct_status s = scatter_check(scatter_label(p), idx, p->dim, p->size);
    if (s != CT_OK) return s;
    int64_t n = cti_numel(idx->ndim, idx->shape), len = idx->shape[p->dim];
    if (n == 0) return CT_OK;
    scatter_ctx g = {.c = c, .dim = p->dim, .reduce = p->reduce};
    memcpy(g.lshape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    memcpy(g.ost, c->out[0]->stride, sizeof(int64_t) * (size_t)idx->ndim);
    g.lshape[p->dim] = 1;
    g.ost[p->dim] = 0;
    int64_t grain = CTI_GRAIN / 8 / (len > 0 ? len : 1);
    cti_parallel_for(n / len, grain > 0 ? grain : 1, scatter_task, &g);
    return CT_OK;
}

/* ---- flip, roll, repeat, pad ------------------------------------------------------------------ */

/* Input coordinate of output coordinate o along a dim (mode, lo, input size
 * n), -1 for the fill value. */
static inline int64_t remap(int mode, int64_t o, int64_t lo, int64_t n) {
    int64_t i = o - lo;
    switch (mode) {
    case CTI_REMAP_FLIP: return n - 1 - o;
    case CTI_REMAP_WRAP: i %= n; return i < 0 ? i + n : i;
    case CTI_REMAP_REFLECT:
        if (i < 0) i = -i;
        return i >= n ? 2 * (n - 1) - i : i;
    case CTI_REMAP_CLAMP: return i < 0 ? 0 : i >= n ? n - 1 : i;
    default: return i < 0 || i >= n ? -1 : i;
    }
}

typedef struct remap_ctx {
    ct_call *c;
    const cti_remap_params *p;
    size_t es;
    char fill[8]; /* the fill value in the dtype's bits */
} remap_ctx;

/* dst[0..n) = the element at src, repeated. */
static void splat(char *dst, const char *src, int64_t n, size_t es) {
    switch (es) {
    case 1: memset(dst, *src, (size_t)n); break;
    case 2: for (int64_t k = 0; k < n; k++) memcpy(dst + 2 * k, src, 2); break;
    case 4: {
        uint32_t v;
        memcpy(&v, src, 4);
        for (int64_t k = 0; k < n; k++) ((uint32_t *)dst)[k] = v;
        break;
    }
    default: {
        uint64_t v;
        memcpy(&v, src, 8);
        for (int64_t k = 0; k < n; k++) ((uint64_t *)dst)[k] = v;
        break;
    }
    }
}

/* dst[k] = src[k * st] for k < n (st in elements, may be negative). */
#define STRIDED(T)                                                                           \
    for (int64_t k = 0; k < n; k++) ((T *)dst)[k] = ((const T *)src)[k * st];
#define REVERSED(T)                                                                          \
    for (int64_t k = 0; k < n; k++) ((T *)dst)[k] = ((const T *)src)[-k];
static void copy_run(char *dst, const char *src, int64_t n, int64_t st, size_t es) {
    if (n <= 0) return;
    if (st == 1) {
        memcpy(dst, src, (size_t)n * es);
        return;
    }
    if (st == -1) { /* flip's rows: a loop the compiler vectorizes with shuffles */
        switch (es) {
        case 1: REVERSED(uint8_t) return;
        case 2: REVERSED(uint16_t) return;
        case 4: REVERSED(uint32_t) return;
        default: REVERSED(uint64_t) return;
        }
    }
    switch (es) {
    case 1: STRIDED(uint8_t) break;
    case 2: STRIDED(uint16_t) break;
    case 4: STRIDED(uint32_t) break;
    default: STRIDED(uint64_t) break;
    }
}

/* One output row of on elements from the input row at xr (n elements, stride
 * st), along the last dim's mode. */
static void remap_row(const remap_ctx *g, char *dst, const char *xr, int64_t n, int64_t st,
                      int64_t on, int mode, int64_t lo) {
    size_t es = g->es;
    int64_t bst = st * (int64_t)es;
    switch (mode) {
    case CTI_REMAP_FLIP: copy_run(dst, xr + (n - 1) * bst, on, -st, es); return;
    case CTI_REMAP_WRAP:
        for (int64_t o = 0; o < on;) {
            int64_t i = remap(mode, o, lo, n), run = n - i < on - o ? n - i : on - o;
            copy_run(dst + o * (int64_t)es, xr + i * bst, run, st, es);
            o += run;
        }
        return;
    default: break;
    }
    /* ident, reflect, clamp: [0, a) left of the input, [a, b) inside, [b, on) right */
    int64_t a = lo < 0 ? 0 : lo > on ? on : lo;
    int64_t b = lo + n < a ? a : lo + n > on ? on : lo + n;
    /* (each source address is formed only for a run that reads it) */
    if (b > a) copy_run(dst + a * (int64_t)es, xr + (a - lo) * bst, b - a, st, es);
    if (mode == CTI_REMAP_IDENT) {
        splat(dst, g->fill, a, es);
        splat(dst + b * (int64_t)es, g->fill, on - b, es);
    } else if (mode == CTI_REMAP_CLAMP) {
        splat(dst, xr, a, es);
        if (on > b) splat(dst + b * (int64_t)es, xr + (n - 1) * bst, on - b, es);
    } else { /* reflect: o < lo reads lo - o, o >= lo + n reads 2 (n - 1) - (o - lo) */
        if (a > 0) copy_run(dst, xr + lo * bst, a, -st, es);
        if (on > b)
            copy_run(dst + b * (int64_t)es, xr + (2 * (n - 1) - (b - lo)) * bst, on - b, -st, es);
    }
}

static void remap_task(int64_t r0, int64_t r1, void *ctx) {
    remap_ctx *g = ctx;
    ct_tensor *x = g->c->in[0], *out = g->c->out[0];
    const cti_remap_params *p = g->p;
    int nd = out->ndim, l = nd - 1;
    int64_t on = out->shape[l];
    const char *xb = cti_data(x);
    char *ob = cti_data(out);
    for (int64_t r = r0; r < r1; r++) {
        char *dst = ob + r * on * (int64_t)g->es;
        int64_t rest = r, off = 0;
        bool fill = false;
        for (int k = l - 1; k >= 0; k--) {
            int64_t o = rest % out->shape[k];
            rest /= out->shape[k];
            int64_t i = remap(p->mode[k], o, p->lo[k], x->shape[k]);
            if (i < 0) fill = true;
            else off += i * x->stride[k];
        }
        if (fill) splat(dst, g->fill, on, g->es);
        else
            remap_row(g, dst, xb + off * (int64_t)g->es, x->shape[l], x->stride[l], on, p->mode[l],
                      p->lo[l]);
    }
}

static void fill_bits(ct_dtype dt, double v, char *bits) {
    memset(bits, 0, 8);
    switch (dt) {
    case CT_BOOL: bits[0] = v != 0; break;
    case CT_I32: {
        int32_t i = (int32_t)v;
        memcpy(bits, &i, 4);
        break;
    }
    case CT_I64: {
        int64_t i = (int64_t)v;
        memcpy(bits, &i, 8);
        break;
    }
    default: store_f(bits, dt, v); break;
    }
}

/* in x; out out (contiguous, x's ndim >= 1). */
static ct_status k_remap(ct_call *c) {
    ct_tensor *out = c->out[0];
    int64_t n = cti_numel(out->ndim, out->shape);
    if (n == 0) return CT_OK;
    remap_ctx g = {.c = c, .p = CTI_PARAMS(c, cti_remap_params), .es = ct_dtype_size(out->dtype)};
    fill_bits(out->dtype, g.p->value, g.fill);
    int64_t on = out->shape[out->ndim - 1];
    int64_t grain = CTI_GRAIN / (on > 0 ? on : 1);
    cti_parallel_for(n / on, grain > 0 ? grain : 1, remap_task, &g);
    return CT_OK;
}

/* ---- interpolate ------------------------------------------------------------------------------- */

/* Source coordinates of one output coordinate: in0/in1 the two taps, l0/l1
 * their weights (nearest: one tap, weight 1). As PyTorch's
 * area_pixel_compute_source_index and nearest_idx, in double for float64
 * (f64) and float otherwise. */
typedef struct tap {
    int64_t i0, i1;
    double l0, l1;
} tap;

static tap tap_of(const cti_interp_params *p, int64_t o, int64_t in, int64_t out, double sf,
                  bool f64) {
    tap t = {0, 0, 1, 0};
    if (p->mode == CTI_INTERP_NEAREST) {
        if (out == in) t.i0 = o;
        else if (out == 2 * in) t.i0 = o >> 1;
        else {
            float sc = sf > 0 ? (float)(1.0 / sf) : (float)in / (float)out;
            int64_t i = (int64_t)floorf((float)o * sc);
            t.i0 = i < in - 1 ? i : in - 1;
        }
        t.i1 = t.i0;
        return t;
    }
    double src;
    if (f64) {
        double sc = p->align_corners ? (out > 1 ? (double)(in - 1) / (double)(out - 1) : 0)
                    : sf > 0         ? 1.0 / sf
                                     : (double)in / (double)out;
        src = p->align_corners ? sc * (double)o : sc * ((double)o + 0.5) - 0.5;
        if (!p->align_corners && src < 0) src = 0;
    } else {
        float sc = p->align_corners ? (out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.f)
                   : sf > 0         ? (float)(1.0 / sf)
                                    : (float)in / (float)out;
        float s = p->align_corners ? sc * (float)o : sc * ((float)o + 0.5f) - 0.5f;
        if (!p->align_corners && s < 0) s = 0;
        src = s;
    }
    int64_t i0 = (int64_t)floor(src);
    if (i0 > in - 1) i0 = in - 1;
    double l1 = src - (double)i0;
    if (!f64) l1 = (float)src - (float)i0;
    l1 = l1 < 0 ? 0 : l1 > 1 ? 1 : l1;
    t.i0 = i0;
    t.i1 = i0 + (i0 < in - 1 ? 1 : 0);
    t.l1 = l1;
    t.l0 = f64 ? 1.0 - l1 : (double)(1.0f - (float)l1);
    return t;
}

typedef struct interp_ctx {
    ct_call *c;
    const cti_interp_params *p;
    tap *th, *tw;
    float *scratch;
} interp_ctx;

/* One output row per index (plane * OH + oh). */
static void interp_task(int64_t r0, int64_t r1, void *ctx) {
    interp_ctx *g = ctx;
    const cti_interp_params *p = g->p;
    ct_tensor *x = g->c->in[0], *out = g->c->out[0];
    ct_dtype dt = x->dtype;
    size_t es = ct_dtype_size(dt);
    bool f64 = dt == CT_F64;
    const char *xb = cti_data(x);
    char *ob = cti_data(out);
    for (int64_t r = r0; r < r1; r++) {
        int64_t plane = r / p->OH, oh = r % p->OH;
        tap h = g->th[oh];
        const char *x0 = xb + (plane * p->H + h.i0) * p->W * (int64_t)es;
        const char *x1 = xb + (plane * p->H + h.i1) * p->W * (int64_t)es;
        char *dst = ob + r * p->OW * (int64_t)es;
        for (int64_t ow = 0; ow < p->OW; ow++) {
            tap w = g->tw[ow];
            double v;
            if (p->mode == CTI_INTERP_NEAREST) {
                v = load_f(x0 + w.i0 * (int64_t)es, dt);
            } else if (f64) {
                v = h.l0 * (w.l0 * load_f(x0 + w.i0 * 8, dt) + w.l1 * load_f(x0 + w.i1 * 8, dt)) +
                    h.l1 * (w.l0 * load_f(x1 + w.i0 * 8, dt) + w.l1 * load_f(x1 + w.i1 * 8, dt));
            } else {
                float a = (float)w.l0 * (float)load_f(x0 + w.i0 * (int64_t)es, dt) +
                          (float)w.l1 * (float)load_f(x0 + w.i1 * (int64_t)es, dt);
                float b = (float)w.l0 * (float)load_f(x1 + w.i0 * (int64_t)es, dt) +
                          (float)w.l1 * (float)load_f(x1 + w.i1 * (int64_t)es, dt);
                v = (float)h.l0 * a + (float)h.l1 * b;
            }
            store_f(dst + ow * (int64_t)es, dt, v);
        }
    }
}

/* One plane per index: grad_out's plane accumulated into grad_x's, in
 * double for float64 and float otherwise (float32 in grad_x itself, the
 * halves in g->scratch, converted at the end). */
static void interp_bw_task(int64_t q0, int64_t q1, void *ctx) {
    interp_ctx *g = ctx;
    const cti_interp_params *p = g->p;
    ct_tensor *go = g->c->in[0], *gx = g->c->out[0];
    ct_dtype dt = go->dtype;
    size_t es = ct_dtype_size(dt);
    bool f64 = dt == CT_F64;
    int64_t hw = p->H * p->W;
    const char *gb = cti_data(go);
    char *xb = cti_data(gx);
    for (int64_t q = q0; q < q1; q++) {
        double *acc = (double *)xb + q * hw;
        float *accf = dt == CT_F32 ? (float *)xb + q * hw : g->scratch + q * hw;
        if (f64) memset(acc, 0, sizeof(double) * (size_t)hw);
        else memset(accf, 0, sizeof(float) * (size_t)hw);
        for (int64_t oh = 0; oh < p->OH; oh++) {
            tap h = g->th[oh];
            for (int64_t ow = 0; ow < p->OW; ow++) {
                tap w = g->tw[ow];
                double v = load_f(gb + ((q * p->OH + oh) * p->OW + ow) * (int64_t)es, dt);
                int64_t a = h.i0 * p->W, b = h.i1 * p->W;
                if (f64) {
                    acc[a + w.i0] += h.l0 * w.l0 * v;
                    if (p->mode == CTI_INTERP_NEAREST) continue;
                    acc[a + w.i1] += h.l0 * w.l1 * v;
                    acc[b + w.i0] += h.l1 * w.l0 * v;
                    acc[b + w.i1] += h.l1 * w.l1 * v;
                } else {
                    float f = (float)v, h0 = (float)h.l0, h1 = (float)h.l1;
                    float w0 = (float)w.l0, w1 = (float)w.l1;
                    accf[a + w.i0] += h0 * w0 * f;
                    if (p->mode == CTI_INTERP_NEAREST) continue;
                    accf[a + w.i1] += h0 * w1 * f;
                    accf[b + w.i0] += h1 * w0 * f;
                    accf[b + w.i1] += h1 * w1 * f;
                }
            }
        }
        if (dt == CT_F16 || dt == CT_BF16)
            for (int64_t k = 0; k < hw; k++)
                store_f(xb + (q * hw + k) * (int64_t)es, dt, accf[k]);
    }
}

static ct_status interp_run(ct_call *c, bool backward) {
    const cti_interp_params *p = CTI_PARAMS(c, cti_interp_params);
    const char *op = backward ? "ct_interpolate_backward" : "ct_interpolate";
    ct_dtype dt = c->out[0]->dtype;
    bool f64 = dt == CT_F64;
    int64_t planes = p->N * p->C;
    if (planes == 0 || p->H * p->W == 0) return CT_OK;
    if (p->OH * p->OW == 0) {
        if (backward)
            memset(cti_data(c->out[0]), 0, (size_t)(planes * p->H * p->W) * ct_dtype_size(dt));
        return CT_OK;
    }
    bool half = backward && (dt == CT_F16 || dt == CT_BF16);
    tap *th = malloc(sizeof(tap) * (size_t)p->OH), *tw = malloc(sizeof(tap) * (size_t)p->OW);
    float *scratch = half ? malloc(sizeof(float) * (size_t)(planes * p->H * p->W)) : NULL;
    if (!th || !tw || (half && !scratch)) {
        free(th);
        free(tw);
        free(scratch);
        return cti_error(CT_ERR_OOM, "%s: out of memory for the coordinate tables", op);
    }
    for (int64_t o = 0; o < p->OH; o++) th[o] = tap_of(p, o, p->H, p->OH, p->scale_h, f64);
    for (int64_t o = 0; o < p->OW; o++) tw[o] = tap_of(p, o, p->W, p->OW, p->scale_w, f64);
    interp_ctx g = {.c = c, .p = p, .th = th, .tw = tw, .scratch = scratch};
    if (backward) {
        int64_t grain = CTI_GRAIN / 4 / (p->OH * p->OW);
        cti_parallel_for(planes, grain > 0 ? grain : 1, interp_bw_task, &g);
    } else {
        int64_t grain = CTI_GRAIN / 4 / p->OW;
        cti_parallel_for(planes * p->OH, grain > 0 ? grain : 1, interp_task, &g);
    }
    free(th);
    free(tw);
    free(scratch);
    return CT_OK;
}

/* in x (contiguous); out y. */
static ct_status k_interp(ct_call *c) { return interp_run(c, false); }
/* in grad_out (contiguous); out grad_x (contiguous, every element written). */
static ct_status k_interp_bw(ct_call *c) { return interp_run(c, true); }

/* ---- unfold, fold ---------------------------------------------------------------------------------- */

typedef struct fold_ctx {
    ct_call *c;
    const cti_fold_params *p;
} fold_ctx;

/* One row (n, c kh kw) of the columns per index: each block's element. */
static void unfold_task(int64_t r0, int64_t r1, void *ctx) {
    fold_ctx *g = ctx;
    const cti_fold_params *p = g->p;
    ct_dtype dt = g->c->in[0]->dtype;
    size_t es = ct_dtype_size(dt);
    const char *xb = cti_data(g->c->in[0]);
    char *ob = cti_data(g->c->out[0]);
    int64_t kk = p->kernel[0] * p->kernel[1], L = p->OH * p->OW;
    for (int64_t r = r0; r < r1; r++) {
        int64_t plane = r / kk, k = r % kk, i = k / p->kernel[1], j = k % p->kernel[1];
        const char *xp = xb + plane * p->H * p->W * (int64_t)es;
        char *dst = ob + r * L * (int64_t)es;
        for (int64_t oh = 0; oh < p->OH; oh++) {
            int64_t h = oh * p->stride[0] - p->padding[0] + i * p->dilation[0];
            for (int64_t ow = 0; ow < p->OW; ow++) {
                int64_t w = ow * p->stride[1] - p->padding[1] + j * p->dilation[1];
                char *d = dst + (oh * p->OW + ow) * (int64_t)es;
                if (h < 0 || h >= p->H || w < 0 || w >= p->W) memset(d, 0, es);
                else memcpy(d, xp + (h * p->W + w) * (int64_t)es, es);
            }
        }
    }
}

/* One pixel (n, c, h, w) per index: the sum of the column elements that read it,
 * kernel element by kernel element. */
static void fold_task(int64_t q0, int64_t q1, void *ctx) {
    fold_ctx *g = ctx;
    const cti_fold_params *p = g->p;
    ct_dtype dt = g->c->in[0]->dtype;
    size_t es = ct_dtype_size(dt);
    bool f64 = dt == CT_F64;
    const char *cb = cti_data(g->c->in[0]);
    char *ob = cti_data(g->c->out[0]);
    int64_t kk = p->kernel[0] * p->kernel[1], L = p->OH * p->OW;
    for (int64_t q = q0; q < q1; q++) {
        int64_t w = q % p->W, h = q / p->W % p->H, plane = q / (p->W * p->H);
        double acc = 0;
        float accf = 0;
        for (int64_t i = 0; i < p->kernel[0]; i++) {
            int64_t th = h + p->padding[0] - i * p->dilation[0];
            if (th < 0 || th % p->stride[0]) continue;
            int64_t oh = th / p->stride[0];
            if (oh >= p->OH) continue;
            for (int64_t j = 0; j < p->kernel[1]; j++) {
                int64_t tw = w + p->padding[1] - j * p->dilation[1];
                if (tw < 0 || tw % p->stride[1]) continue;
                int64_t ow = tw / p->stride[1];
                if (ow >= p->OW) continue;
                double v =
                    load_f(cb + ((plane * kk + i * p->kernel[1] + j) * L + oh * p->OW + ow) *
                                    (int64_t)es,
                           dt);
                if (f64) acc += v;
                else accf += (float)v;
            }
        }
        store_f(ob + q * (int64_t)es, dt, f64 ? acc : accf);
    }
}

/* in x [N, C, H, W] contiguous; out cols [N, C kh kw, L]. */
static ct_status k_unfold(ct_call *c) {
    fold_ctx g = {.c = c, .p = CTI_PARAMS(c, cti_fold_params)};
    int64_t rows = g.p->N * g.p->C * g.p->kernel[0] * g.p->kernel[1], L = g.p->OH * g.p->OW;
    if (rows == 0 || L == 0) return CT_OK;
    int64_t grain = CTI_GRAIN / 4 / L;
    cti_parallel_for(rows, grain > 0 ? grain : 1, unfold_task, &g);
    return CT_OK;
}

/* in cols [N, C kh kw, L] contiguous; out x [N, C, H, W]. */
static ct_status k_fold(ct_call *c) {
    fold_ctx g = {.c = c, .p = CTI_PARAMS(c, cti_fold_params)};
    int64_t n = g.p->N * g.p->C * g.p->H * g.p->W;
    if (n == 0) return CT_OK;
    int64_t grain = CTI_GRAIN / 4 / (g.p->kernel[0] * g.p->kernel[1] + 1);
    cti_parallel_for(n, grain > 0 ? grain : 1, fold_task, &g);
    return CT_OK;
}

void cti_cpu_register_shape(void) {
    for (int dt = 0; dt < CT_NUM_DTYPES; dt++) {
        ct_dtype d = (ct_dtype)dt;
        cti_register_kernel(CT_OP_SCATTER, CT_DEVICE_CPU, d, k_scatter, "cpu_scatter");
        cti_register_kernel(CT_OP_SCATTER_REDUCE, CT_DEVICE_CPU, d, k_scatter,
                            "cpu_scatter_reduce");
        cti_register_kernel(CT_OP_FLIP, CT_DEVICE_CPU, d, k_remap, "cpu_remap");
        cti_register_kernel(CT_OP_ROLL, CT_DEVICE_CPU, d, k_remap, "cpu_remap");
        cti_register_kernel(CT_OP_REPEAT, CT_DEVICE_CPU, d, k_remap, "cpu_remap");
        cti_register_kernel(CT_OP_PAD, CT_DEVICE_CPU, d, k_remap, "cpu_remap");
        if (!ct_dtype_is_floating(d)) continue;
        cti_register_kernel(CT_OP_INTERPOLATE, CT_DEVICE_CPU, d, k_interp, "cpu_interpolate");
        cti_register_kernel(CT_OP_INTERPOLATE_BACKWARD, CT_DEVICE_CPU, d, k_interp_bw,
                            "cpu_interpolate_backward");
        cti_register_kernel(CT_OP_UNFOLD, CT_DEVICE_CPU, d, k_unfold, "cpu_im2col");
        cti_register_kernel(CT_OP_FOLD, CT_DEVICE_CPU, d, k_fold, "cpu_col2im");
    }
}
