/* Front ends of the transformer's fused pointwise ops: rotary position
 * embedding (ct_rope, its backward and its tables) and SwiGLU (ct_swiglu and
 * its backward). They check arguments, give the kernels the layouts of
 * schema.h's contract and allocate the outputs. rope reads x in place when
 * its last dim is contiguous (a transposed [B, T, H, D] -> [B, H, T, D] view
 * costs no copy) and hands the tables over as views expanded to x's leading
 * dims, so no table is ever materialized at x's size. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"
#include "tensor/ops.h"

_Static_assert((int)CT_ROPE_HALF == CTI_ROPE_HALF &&
                   (int)CT_ROPE_INTERLEAVED == CTI_ROPE_INTERLEAVED,
               "ct_rope_layout and the schema's layouts agree");

/* Temporaries (contiguous copies, views), released together. */
typedef struct temps {
    ct_tensor *t[6];
    int n;
} temps;

static void temps_release(temps *tp) {
    for (int i = 0; i < tp->n; i++) ct_tensor_release(tp->t[i]);
    tp->n = 0;
}

static ct_tensor *keep(temps *tp, ct_tensor *t) {
    if (t) tp->t[tp->n++] = t;
    return t;
}

static ct_device dev(const ct_tensor *t) { return t->storage->device; }

static bool same_shape(const ct_tensor *a, const ct_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

static ct_status check_dtype_as(const char *op, const ct_tensor *t, const char *name,
                                const ct_tensor *ref, const char *refname) {
    if (t->dtype == ref->dtype) return CT_OK;
    return cti_error(CT_ERR_DTYPE, "%s: %s has dtype %s but %s has %s (expected equal dtypes)", op,
                     name, ct_dtype_name(t->dtype), refname, ct_dtype_name(ref->dtype));
}

static ct_status check_shape_as(const char *op, const ct_tensor *t, const char *name,
                                const ct_tensor *ref, const char *refname) {
    if (same_shape(t, ref)) return CT_OK;
    return cti_error(CT_ERR_SHAPE, "%s: %s %s must have the shape of %s %s", op, name,
                     cti_desc(t), refname, cti_desc(ref));
}

/* Dispatches c on t's device with t's dtype; on failure releases the outputs. */
static ct_status run(ct_call *c, const ct_tensor *t) {
    ct_status s = cti_run(c, dev(t), t->dtype);
    if (s != CT_OK) cti_call_release_outputs(c);
    return s;
}

/* ---- rope ------------------------------------------------------------------------------- */

static ct_status check_layout(const char *op, ct_rope_layout layout) {
    if (layout == CT_ROPE_HALF || layout == CT_ROPE_INTERLEAVED) return CT_OK;
    return cti_error(CT_ERR_INVALID_ARG,
                     "%s: layout must be CT_ROPE_HALF (0) or CT_ROPE_INTERLEAVED (1), got %d", op,
                     (int)layout);
}

/* Whether tables of dtype t may go with x of dtype x: x's own, or float32
 * beside float16/bfloat16 (read as if cast to x's dtype). */
static bool table_dtype_ok(ct_dtype t, ct_dtype x) {
    return t == x || (t == CT_F32 && (x == CT_F16 || x == CT_BF16));
}

/* x [..., D] with D even; cos and sin of one dtype (table_dtype_ok), one
 * shape [..., D/2] whose leading dims broadcast to x's. */
static ct_status check_rope(const char *op, const ct_tensor *x, const char *xname,
                            const ct_tensor *cs, const ct_tensor *sn, ct_rope_layout layout) {
    if (cti_check_floating(op, x, xname) || check_layout(op, layout)) return ct_last_status();
    if (x->ndim < 1)
        return cti_error(CT_ERR_SHAPE, "%s: %s must have at least one dim [..., D], got %s", op,
                         xname, cti_desc(x));
    int64_t d = x->shape[x->ndim - 1];
    if (d % 2 != 0)
        return cti_error(CT_ERR_SHAPE, "%s: the last dim of %s %s must be even, got %lld", op,
                         xname, cti_desc(x), (long long)d);
    if (check_dtype_as(op, sn, "sin", cs, "cos") || check_shape_as(op, sn, "sin", cs, "cos"))
        return ct_last_status();
    if (!table_dtype_ok(cs->dtype, x->dtype))
        return cti_error(CT_ERR_DTYPE, "%s: cos and sin have dtype %s but %s has %s (expected "
                         "%s's dtype, or float32 beside float16/bfloat16)",
                         op, ct_dtype_name(cs->dtype), xname, ct_dtype_name(x->dtype), xname);
    bool fits = cs->ndim >= 1 && cs->ndim <= x->ndim && cs->shape[cs->ndim - 1] == d / 2;
    for (int i = 0; fits && i < cs->ndim - 1; i++) {
        int64_t t = cs->shape[i], want = x->shape[x->ndim - cs->ndim + i];
        fits = t == want || t == 1;
    }
    if (!fits)
        return cti_error(CT_ERR_SHAPE,
                         "%s: cos and sin %s must be [..., D/2] = [..., %lld] with leading dims "
                         "that broadcast to those of %s %s",
                         op, cti_desc(cs), (long long)(d / 2), xname, cti_desc(x));
    return CT_OK;
}

/* t (contiguous) seen as [x's leading dims..., D/2]: stride 0 where it broadcasts. */
static ct_tensor *expand_table(const ct_tensor *t, const ct_tensor *x) {
    int nd = x->ndim;
    int64_t shape[CT_MAX_DIMS], stride[CT_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        int ti = i - (nd - t->ndim);
        shape[i] = i == nd - 1 ? t->shape[t->ndim - 1] : x->shape[i];
        stride[i] = ti >= 0 && t->shape[ti] != 1 ? t->stride[ti] : 0;
    }
    stride[nd - 1] = 1;
    return cti_tensor_view(t, nd, shape, stride, t->offset);
}

/* A version of t whose last dim is contiguous: t itself, or a contiguous copy. */
static ct_tensor *last_dim_contiguous(temps *tp, ct_tensor *t) {
    if (t->ndim == 0 || t->shape[t->ndim - 1] <= 1 || t->stride[t->ndim - 1] == 1) return t;
    return keep(tp, ct_contiguous(t));
}

/* Runs ROPE or ROPE_BACKWARD of x (already checked); the new result or NULL. */
static ct_tensor *rope_run(const char *op, ct_op id, ct_tensor *x, ct_tensor *cs, ct_tensor *sn,
                           ct_rope_layout layout) {
    temps tp = {.n = 0};
    ct_tensor *out = NULL;
    ct_call c;
    cti_call_init(&c, id);
    ct_tensor *xc = last_dim_contiguous(&tp, x);
    ct_tensor *cc = xc ? keep(&tp, ct_contiguous(cs)) : NULL;
    ct_tensor *sc = cc ? keep(&tp, ct_contiguous(sn)) : NULL;
    if (!sc) goto done;
    c.in[0] = xc;
    c.in[1] = keep(&tp, expand_table(cc, x));
    c.in[2] = keep(&tp, expand_table(sc, x));
    c.nin = 3;
    if (!c.in[1] || !c.in[2]) goto done;
    c.out[0] = cti_tensor_new(op, x->ndim, x->shape, x->dtype, dev(x));
    c.nout = 1;
    if (!c.out[0]) goto done;
    int64_t d = x->shape[x->ndim - 1];
    cti_rope_params p = {.d = d,
                         .rows = x->ndim > 1 ? cti_numel(x->ndim - 1, x->shape) : 1,
                         .layout = (int)layout};
    cti_call_params(&c, &p);
    if (run(&c, x) == CT_OK) out = c.out[0];
done:
    temps_release(&tp);
    return out;
}

ct_tensor *ct_rope(ct_tensor *x, ct_tensor *cs, ct_tensor *sn, ct_rope_layout layout) {
    const char *op = "ct_rope";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_ROPE, 3, (ct_tensor *[]){x, cs, sn}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_rope(ac.in[0], ac.in[1], ac.in[2], layout)
                                              : NULL);
    ct_tensor *req[3] = {x, cs, sn};
    if (cti_check_not_null(op, 3, req) || cti_check_same_device(op, 3, req) ||
        check_rope(op, x, "x", cs, sn, layout))
        return NULL;
    ct_tensor *out = rope_run(op, CT_OP_ROPE, x, cs, sn, layout);
    if (!out || !cti_ag_needed(1, &x)) return out;
    cti_rope_params p = {.layout = (int)layout};
    /* Only x is an input of the node: the tables get no gradient. */
    if (cti_ag_record(&(cti_ag_rec){.name = "RopeBackward",
                                    .backward = cti_bw_rope,
                                    .nin = 1,
                                    .in = {x},
                                    .nout = 1,
                                    .out = {out},
                                    .nsaved = 2,
                                    .saved = {cs, sn},
                                    CTI_AG_PARAMS(&p)}) == CT_OK)
        return out;
    ct_tensor_release(out);
    return NULL;
}

ct_tensor *ct_rope_backward(ct_tensor *grad_out, ct_tensor *cs, ct_tensor *sn,
                            ct_rope_layout layout) {
    const char *op = "ct_rope_backward";
    ct_tensor *req[3] = {grad_out, cs, sn};
    if (cti_check_not_null(op, 3, req) || cti_check_same_device(op, 3, req) ||
        check_rope(op, grad_out, "grad_out", cs, sn, layout))
        return NULL;
    return rope_run(op, CT_OP_ROPE_BACKWARD, grad_out, cs, sn, layout);
}

ct_status ct_rope_tables(int64_t seq_len, int64_t dim, double base, ct_dtype dtype,
                         ct_device device, ct_tensor **cos_out, ct_tensor **sin_out) {
    const char *op = "ct_rope_tables";
    if (!cos_out || !sin_out)
        return cti_error(CT_ERR_INVALID_ARG, "%s: the output pointer %s is NULL", op,
                         !cos_out ? "cos" : "sin");
    if (seq_len < 0)
        return cti_error(CT_ERR_INVALID_ARG, "%s: seq_len must be >= 0, got %lld", op,
                         (long long)seq_len);
    if (dim <= 0 || dim % 2 != 0)
        return cti_error(CT_ERR_INVALID_ARG, "%s: dim must be even and > 0, got %lld", op,
                         (long long)dim);
    if (!(base > 0) || !isfinite(base))
        return cti_error(CT_ERR_INVALID_ARG, "%s: base must be finite and > 0, got %g", op, base);
    if (!ct_dtype_is_floating(dtype))
        return cti_error(CT_ERR_DTYPE, "%s: expected a floating dtype, got %s", op,
                         ct_dtype_name(dtype));
    int64_t shape[2] = {seq_len, dim / 2};
    size_t nb;
    if (!cti_checked_nbytes(op, 2, shape, CT_F64, &nb)) return ct_last_status();
    int64_t n = seq_len * (dim / 2);
    double *v = malloc(2 * (nb ? nb : 1));
    if (!v) return cti_error(CT_ERR_OOM, "%s: out of memory for %s tables", op, cti_shape_s(2, shape));
    for (int64_t k = 0; k < dim / 2; k++) {
        double f = pow(base, -(double)(2 * k) / (double)dim);
        for (int64_t t = 0; t < seq_len; t++) {
            v[t * (dim / 2) + k] = cos((double)t * f);
            v[n + t * (dim / 2) + k] = sin((double)t * f);
        }
    }
    ct_tensor *r[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        ct_tensor *h = ct_tensor_from_data(v + i * n, CT_F64, 2, shape);
        ct_tensor *t = h ? ct_to_dtype(h, dtype) : NULL;
        ct_tensor_release(h);
        r[i] = t ? ct_to_device(t, device) : NULL;
        ct_tensor_release(t);
        if (!r[i]) break;
    }
    free(v);
    if (!r[0] || !r[1]) {
        ct_tensor_release(r[0]);
        ct_tensor_release(r[1]);
        return ct_last_status();
    }
    *cos_out = r[0];
    *sin_out = r[1];
    return CT_OK;
}

/* ---- swiglu ----------------------------------------------------------------------------- */

static ct_status check_swiglu(const char *op, const ct_tensor *gate, const ct_tensor *up) {
    if (cti_check_floating(op, gate, "gate") || check_dtype_as(op, up, "up", gate, "gate") ||
        check_shape_as(op, up, "up", gate, "gate"))
        return ct_last_status();
    return CT_OK;
}

/* The row stride of t seen as [rows, cols] (cols its last dim) with a
 * contiguous row, or false when t has no such form: its last dim strided, or
 * leading dims that do not fold into one (size-1 dims fold anywhere). */
static bool row_stride(const ct_tensor *t, int64_t *ld) {
    int nd = t->ndim;
    int64_t cols = nd > 0 ? t->shape[nd - 1] : 1;
    if (nd > 0 && cols > 1 && t->stride[nd - 1] != 1) return false;
    int64_t s = cols, next = 0;
    bool seen = false;
    for (int k = nd - 2; k >= 0; k--) {
        if (t->shape[k] == 1) continue;
        if (!seen) {
            s = t->stride[k];
            seen = true;
        } else if (t->stride[k] != next) {
            return false;
        }
        next = t->stride[k] * t->shape[k];
    }
    *ld = s;
    return true;
}

/* Inputs in[0..n) for c as rows of gate's last dim: each read in place when
 * it has a row stride, else through a contiguous copy kept in tp. Fills p;
 * a call whose inputs are all contiguous becomes one row. */
static ct_status swiglu_inputs(ct_call *c, temps *tp, int n, ct_tensor *const *in,
                               const ct_tensor *gate, cti_swiglu_params *p) {
    int nd = gate->ndim;
    int64_t numel = cti_numel(nd, gate->shape);
    p->cols = nd > 0 ? gate->shape[nd - 1] : 1;
    p->rows = p->cols > 0 ? numel / p->cols : 0;
    bool packed = true;
    for (int k = 0; k < n; k++) {
        c->in[k] = in[k];
        if (!row_stride(in[k], &p->ld[k])) {
            if (!(c->in[k] = keep(tp, ct_contiguous(in[k])))) return ct_last_status();
            p->ld[k] = p->cols;
        }
        packed = packed && (p->ld[k] == p->cols || p->rows <= 1);
    }
    if (packed) {
        p->rows = numel > 0 ? 1 : 0;
        p->cols = numel;
        for (int k = 0; k < n; k++) p->ld[k] = numel;
    }
    p->ldo = p->cols;
    return CT_OK;
}

/* Whether gate and up are the two halves of one tensor's last dim, as
 * ct_chunk(h, 2, -1) gives them: rows of cols at row stride 2 cols, up
 * cols elements after gate. */
static bool chunk_halves(const ct_tensor *gate, const ct_tensor *up) {
    int nd = gate->ndim;
    int64_t ld, cols = nd > 0 ? gate->shape[nd - 1] : 1;
    if (nd == 0 || cols == 0 || gate->storage != up->storage ||
        up->offset != gate->offset + cols || !row_stride(gate, &ld))
        return false;
    if (cti_numel(nd - 1, gate->shape) > 1 && ld != 2 * cols) return false;
    for (int k = 0; k < nd; k++)
        if (gate->stride[k] != up->stride[k] && gate->shape[k] > 1) return false;
    return true;
}

/* dgate and dup for c as the halves of one new buffer of h's shape (gate's
 * with its last dim doubled), which the chunk's backward then passes to h
 * as it is. */
static ct_status halves_out(const char *op, ct_call *c, const ct_tensor *gate,
                            cti_swiglu_params *p) {
    int nd = gate->ndim;
    int64_t hs[CT_MAX_DIMS], cols = gate->shape[nd - 1];
    memcpy(hs, gate->shape, sizeof(int64_t) * (size_t)nd);
    hs[nd - 1] = 2 * cols;
    ct_tensor *h = cti_tensor_new(op, nd, hs, gate->dtype, dev(gate));
    if (!h) return ct_last_status();
    c->out[0] = ct_narrow(h, nd - 1, 0, cols);
    c->out[1] = c->out[0] ? ct_narrow(h, nd - 1, cols, cols) : NULL;
    ct_tensor_release(h);
    if (!c->out[1]) {
        cti_call_release_outputs(c);
        return ct_last_status();
    }
    if (p->rows > 1) p->ldo = 2 * cols; /* one row (packed) has no row stride */
    return CT_OK;
}

/* silu(gate) * up again for a node that saved gate and up
 * (ct_set_recompute_enabled): the same call, so the same bits. */
static ct_tensor *swiglu_recompute(cti_node *n) {
    ct_status st;
    ct_tensor *gate = cti_ag_saved(n, 0, &st);
    ct_tensor *up = gate ? cti_ag_saved(n, 1, &st) : NULL;
    if (!up) return NULL;
    bool prev = ct_set_grad_enabled(false);
    ct_tensor *out = ct_swiglu(gate, up);
    ct_set_grad_enabled(prev);
    if (out) cti_scope_forget(out);
    return out;
}

ct_tensor *ct_swiglu(ct_tensor *gate, ct_tensor *up) {
    const char *op = "ct_swiglu";
    ct_tensor *req[2] = {gate, up};
    if (cti_check_not_null(op, 2, req) || cti_check_same_device(op, 2, req) ||
        check_swiglu(op, gate, up))
        return NULL;
    temps tp = {.n = 0};
    ct_tensor *out = NULL;
    ct_call c;
    cti_call_init(&c, CT_OP_SWIGLU);
    c.nin = 2;
    cti_swiglu_params p = {0};
    if (swiglu_inputs(&c, &tp, 2, req, gate, &p) != CT_OK) goto done;
    c.out[0] = cti_tensor_new(op, gate->ndim, gate->shape, gate->dtype, dev(gate));
    c.nout = 1;
    if (!c.out[0]) goto done;
    cti_call_params(&c, &p);
    if (run(&c, gate) != CT_OK) goto done;
    out = c.out[0];
    if (cti_ag_needed(2, req) &&
        cti_ag_record(&(cti_ag_rec){.name = "SwigluBackward",
                                    .backward = cti_bw_swiglu,
                                    .recompute = swiglu_recompute,
                                    .nin = 2,
                                    .in = {gate, up},
                                    .nout = 1,
                                    .out = {out},
                                    .nsaved = 2,
                                    .saved = {gate, up}}) != CT_OK) {
        ct_tensor_release(out);
        out = NULL;
    }
done:
    temps_release(&tp);
    return out;
}

ct_status ct_swiglu_backward(ct_tensor *grad_out, ct_tensor *gate, ct_tensor *up,
                             ct_tensor **dgate, ct_tensor **dup) {
    const char *op = "ct_swiglu_backward";
    ct_tensor *req[3] = {grad_out, gate, up};
    if (cti_check_not_null(op, 3, req) || cti_check_same_device(op, 3, req) ||
        check_swiglu(op, gate, up) || check_dtype_as(op, grad_out, "grad_out", gate, "gate") ||
        check_shape_as(op, grad_out, "grad_out", gate, "gate"))
        return ct_last_status();
    if (!dgate && !dup)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: nothing to compute: dgate and dup are both NULL (expected one at least)",
                         op);
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_SWIGLU_BACKWARD);
    c.nin = 3;
    c.nout = 2;
    cti_swiglu_params p = {0};
    if (swiglu_inputs(&c, &tp, 3, req, gate, &p) != CT_OK) goto fail;
    if (dgate && dup && chunk_halves(gate, up) && cti_numel(gate->ndim, gate->shape) > 0) {
        if (halves_out(op, &c, gate, &p) != CT_OK) goto fail;
    } else {
        c.out[0] = dgate ? cti_tensor_new(op, gate->ndim, gate->shape, gate->dtype, dev(gate))
                         : NULL;
        c.out[1] = dup ? cti_tensor_new(op, gate->ndim, gate->shape, gate->dtype, dev(gate)) : NULL;
        if ((dgate && !c.out[0]) || (dup && !c.out[1])) {
            cti_call_release_outputs(&c);
            goto fail;
        }
    }
    cti_call_params(&c, &p);
    if (run(&c, gate) != CT_OK) goto fail;
    temps_release(&tp);
    if (dgate) *dgate = c.out[0];
    if (dup) *dup = c.out[1];
    return CT_OK;
fail:
    temps_release(&tp);
    return ct_last_status();
}
