/* Front ends of scaled dot-product attention (SDPA, SDPA_BACKWARD).
 *
 * The kernels take 4-d views [B, H, T, D] whose last dim is contiguous and
 * read the other strides, so q, k and v transposed from [B, T, H, D] reach
 * them without a copy; a 3-d input is viewed as one batch. The mask is
 * handed over expanded to [B, Hq, T, S] (stride 0 where it broadcasts),
 * never materialized. */
#include <math.h>

#include "ops_impl.h"
#include "tensor/ops.h"

#define OP_FWD "ct_scaled_dot_product_attention"
#define OP_BWD "ct_scaled_dot_product_attention_backward"

/* Handles a front end creates (views, contiguous copies), released together:
 * at most a copy and a view of each of 7 inputs and a view of each of 3
 * outputs. */
typedef struct temps {
    ct_tensor *t[24];
    int n;
} temps;

static void temps_release(temps *tp) {
    for (int i = 0; i < tp->n; i++) ct_tensor_release(tp->t[i]);
    tp->n = 0;
}

static ct_tensor *keep(temps *tp, ct_tensor *t) {
    assert(tp->n < (int)(sizeof tp->t / sizeof tp->t[0]));
    if (t) tp->t[tp->n++] = t;
    return t;
}

static ct_device dev(const ct_tensor *t) { return t->storage->device; }

/* t as the kernels read it: 4-d (a 3-d t gets a leading batch of 1) with a
 * contiguous last dim (copied only when it is not). NULL on failure. */
static ct_tensor *as4(temps *tp, ct_tensor *t) {
    int nd = t->ndim;
    if (t->stride[nd - 1] != 1 && t->shape[nd - 1] > 1) {
        t = keep(tp, ct_contiguous(t));
        if (!t) return NULL;
    }
    int64_t shape[4], stride[4];
    int lead = 4 - nd;
    for (int d = 0; d < lead; d++) {
        shape[d] = 1;
        stride[d] = 0;
    }
    for (int d = 0; d < nd; d++) {
        shape[lead + d] = t->shape[d];
        stride[lead + d] = t->stride[d];
    }
    return keep(tp, cti_tensor_view(t, 4, shape, stride, t->offset));
}

/* The sizes of an attention call, from q, k, v; checks them. */
static ct_status check_qkv(const char *op, ct_tensor *q, ct_tensor *k, ct_tensor *v,
                           cti_attention_params *p) {
    if ((q->ndim != 3 && q->ndim != 4) || k->ndim != q->ndim || v->ndim != q->ndim)
        return cti_error(CT_ERR_SHAPE,
                         "%s: q, k and v must all be 4-d [B, H, T, D] or all 3-d [H, T, D], got "
                         "q %s, k %s, v %s",
                         op, cti_desc(q), cti_desc(k), cti_desc(v));
    ct_status st = cti_check_floating(op, q, "q");
    if (st != CT_OK) return st;
    ct_tensor *kv[2] = {k, v};
    const char *kvn[2] = {"k", "v"};
    for (int i = 0; i < 2; i++)
        if (kv[i]->dtype != q->dtype)
            return cti_error(CT_ERR_DTYPE, "%s: %s has dtype %s but q has %s (expected equal dtypes)",
                             op, kvn[i], ct_dtype_name(kv[i]->dtype), ct_dtype_name(q->dtype));
    int o = q->ndim - 3; /* dim of the heads */
    p->B = o ? q->shape[0] : 1;
    p->Hq = q->shape[o];
    p->T = q->shape[o + 1];
    p->D = q->shape[o + 2];
    p->Hkv = k->shape[o];
    p->S = k->shape[o + 1];
    p->Dv = v->shape[o + 2];
    if (o && (k->shape[0] != p->B || v->shape[0] != p->B))
        return cti_error(CT_ERR_SHAPE, "%s: q %s, k %s and v %s must have one batch size", op,
                         cti_desc(q), cti_desc(k), cti_desc(v));
    if (k->shape[o + 2] != p->D)
        return cti_error(CT_ERR_SHAPE, "%s: q %s and k %s have different head dims (%lld != %lld)",
                         op, cti_desc(q), cti_desc(k), (long long)p->D,
                         (long long)k->shape[o + 2]);
    if (v->shape[o + 1] != p->S)
        return cti_error(CT_ERR_SHAPE,
                         "%s: k %s and v %s have different sequence lengths (%lld != %lld)", op,
                         cti_desc(k), cti_desc(v), (long long)p->S, (long long)v->shape[o + 1]);
    if (v->shape[o] != p->Hkv)
        return cti_error(CT_ERR_SHAPE, "%s: k %s and v %s have different numbers of heads", op,
                         cti_desc(k), cti_desc(v));
    if (p->Hkv == 0 ? p->Hq != 0 : p->Hq % p->Hkv != 0)
        return cti_error(CT_ERR_SHAPE,
                         "%s: q's %lld heads must be a multiple of k's and v's %lld heads "
                         "(grouped-query attention)",
                         op, (long long)p->Hq, (long long)p->Hkv);
    return CT_OK;
}

/* The mask as the kernels read it: a view expanded to [B, Hq, T, S]. */
static ct_status expand_mask(const char *op, temps *tp, ct_tensor *m, const ct_tensor *q,
                             cti_attention_params *p, ct_tensor **out) {
    *out = NULL;
    p->mask_kind = CTI_ATTN_MASK_NONE;
    if (!m) return CT_OK;
    if (m->dtype == CT_BOOL) p->mask_kind = CTI_ATTN_MASK_BOOL;
    else if (m->dtype == q->dtype) p->mask_kind = CTI_ATTN_MASK_ADD;
    else
        return cti_error(CT_ERR_DTYPE, "%s: attn_mask must be bool or of q's dtype %s, got %s", op,
                         ct_dtype_name(q->dtype), ct_dtype_name(m->dtype));
    const int64_t full[4] = {p->B, p->Hq, p->T, p->S};
    int qd = q->ndim; /* the mask broadcasts to q's rank: [Hq, T, S] for 3-d q */
    bool ok = m->ndim <= qd;
    int64_t stride[4];
    for (int d = 0; d < 4 && ok; d++) {
        int md = d - (4 - m->ndim);
        if (md < 0) stride[d] = 0;
        else if (m->shape[md] == full[d]) stride[d] = full[d] == 1 ? 0 : m->stride[md];
        else if (m->shape[md] == 1) stride[d] = 0;
        else ok = false;
    }
    if (!ok)
        return cti_error(CT_ERR_SHAPE, "%s: attn_mask %s does not broadcast to %s", op,
                         cti_desc(m), cti_shape_s(qd, full + 4 - qd));
    *out = keep(tp, cti_tensor_view(m, 4, full, stride, m->offset));
    return *out ? CT_OK : ct_last_status();
}

/* Checks shared by the forward and the backward; fills p's sizes, mask kind,
 * dropout_p, is_causal and the resolved scale. */
static ct_status check_args(const char *op, ct_tensor *q, ct_tensor *k, ct_tensor *v,
                            ct_tensor *mask, double dropout_p, bool is_causal, double scale,
                            cti_attention_params *p) {
    ct_status st = check_qkv(op, q, k, v, p);
    if (st != CT_OK) return st;
    if (mask && is_causal)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: attn_mask must be NULL when is_causal is set (as PyTorch: pass "
                         "one or the other)",
                         op);
    if (!(dropout_p >= 0 && dropout_p < 1))
        return cti_error(CT_ERR_INVALID_ARG, "%s: dropout_p must be in [0, 1), got %g", op,
                         dropout_p);
    if (isinf(scale))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: scale must be finite (0 or NaN for 1 / sqrt(D)), got %g", op, scale);
    if (scale == 0 || isnan(scale)) scale = p->D > 0 ? 1.0 / sqrt((double)p->D) : 1.0;
    p->scale = scale;
    p->dropout_p = dropout_p;
    p->is_causal = is_causal;
    return CT_OK;
}

static ct_dtype stat_dtype(ct_dtype dt) { return dt == CT_F64 ? CT_F64 : CT_F32; }

/* A new tensor of q's rank: [B, d1, d2, d3] for 4-d q, [d1, d2, d3] for 3-d
 * (d3 < 0: one dim less, for lse). */
static ct_tensor *new_like_q(const char *op, const ct_tensor *q, int64_t B, int64_t d1,
                             int64_t d2, int64_t d3, ct_dtype dt) {
    int64_t s[4] = {B, d1, d2, d3};
    int n = d3 < 0 ? 3 : 4;
    int drop = q->ndim == 3 ? 1 : 0;
    return cti_tensor_new(op, n - drop, s + drop, dt, dev(q));
}

/* The output [B, Hq, T, Dv]. A 4-d q laid out as [B, T, H, D] (the heads of
 * a projection, transposed) gets an output laid out the same way, as
 * PyTorch's fused kernels give it: transposing it back to [B, T, Hq * Dv]
 * is then a view, not a copy, and so is its gradient's way back. */
static ct_tensor *new_out(const char *op, const ct_tensor *q, const cti_attention_params *p) {
    if (q->ndim != 4 || p->T < 2 || p->Hq < 2 || q->stride[1] >= q->stride[2])
        return new_like_q(op, q, p->B, p->Hq, p->T, p->Dv, q->dtype);
    const int64_t mem[4] = {p->B, p->T, p->Hq, p->Dv};
    ct_tensor *m = cti_tensor_new(op, 4, mem, q->dtype, dev(q));
    if (!m) return NULL;
    const int64_t sh[4] = {p->B, p->Hq, p->T, p->Dv},
                  st[4] = {p->T * p->Hq * p->Dv, p->Dv, p->Hq * p->Dv, 1};
    ct_tensor *o = cti_tensor_view(m, 4, sh, st, 0);
    ct_tensor_release(m);
    return o;
}

ct_tensor *ct_scaled_dot_product_attention(ct_tensor *q, ct_tensor *k, ct_tensor *v,
                                           ct_tensor *attn_mask, double dropout_p,
                                           bool is_causal, double scale, ct_generator *gen) {
    const char *op = OP_FWD;
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_SDPA, 4, (ct_tensor *[]){q, k, v, attn_mask}))
        return cti_autocast_end_op(
            &ac, ac.ok ? ct_scaled_dot_product_attention(ac.in[0], ac.in[1], ac.in[2], ac.in[3],
                                                         dropout_p, is_causal, scale, gen)
                       : NULL);
    ct_tensor *req[3] = {q, k, v}, *all[4] = {q, k, v, attn_mask};
    cti_attention_params p = {0};
    if (cti_check_not_null(op, 3, req) || cti_check_same_device(op, 4, all) ||
        check_args(op, q, k, v, attn_mask, dropout_p, is_causal, scale, &p))
        return NULL;
    if (attn_mask && cti_ag_needed(1, &attn_mask))
        return cti_error_null(CT_ERR_AUTOGRAD,
                              "%s: attn_mask %s requires grad, but cten computes no gradient for "
                              "the mask (detach it)",
                              op, cti_desc(attn_mask));
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_SDPA);
    ct_tensor *out = NULL, *res = NULL, *lse = NULL;
    ct_tensor *mk = NULL;
    if (expand_mask(op, &tp, attn_mask, q, &p, &mk) != CT_OK) goto done;
    if (!(c.in[0] = as4(&tp, q)) || !(c.in[1] = as4(&tp, k)) || !(c.in[2] = as4(&tp, v)))
        goto done;
    c.in[3] = mk;
    c.nin = 4;
    out = new_out(op, q, &p);
    lse = new_like_q(op, q, p.B, p.Hq, p.T, -1, stat_dtype(q->dtype));
    if (!out || !lse) goto done;
    if (!(c.out[0] = as4(&tp, out))) goto done;
    const int64_t ls[3] = {p.B, p.Hq, p.T}, lst[3] = {p.Hq * p.T, p.T, 1};
    c.out[1] = keep(&tp, cti_tensor_view(lse, 3, ls, lst, 0));
    if (!c.out[1]) goto done;
    c.nout = 2;
    if (p.dropout_p > 0) {
        ct_generator *g = gen ? gen : ct_generator_default();
        p.seed = ct_generator_seed(g);
        p.offset = ct_generator_reserve(g, (uint64_t)(p.B * p.Hq * p.T * p.S));
    }
    cti_call_params(&c, &p);
    if (cti_run(&c, dev(q), q->dtype) != CT_OK) goto done;
    res = out;
    out = NULL;
    if (cti_ag_needed(3, req) &&
        cti_ag_record(&(cti_ag_rec){.name = "ScaledDotProductAttentionBackward",
                                    .backward = cti_bw_sdpa,
                                    .nin = 3,
                                    .in = {q, k, v},
                                    .nout = 1,
                                    .out = {res},
                                    .nsaved = 6,
                                    .saved = {q, k, v, res, lse, attn_mask},
                                    CTI_AG_PARAMS(&p)}) != CT_OK) {
        ct_tensor_release(res);
        res = NULL;
    }
done:
    temps_release(&tp);
    ct_tensor_release(out);
    ct_tensor_release(lse);
    return res;
}

/* The backward op is differentiable in PyTorch (double backward); cten has
 * no formula for it. The kernel gets views without history, so cti_run
 * cannot see that the caller's tensors need grad: gradients that do get a
 * node that refuses backward, as cti_run gives the other backward ops. */
static ct_status refuse_double_backward(cti_node *n, ct_tensor *const *go, ct_tensor **gi) {
    (void)n, (void)go, (void)gi;
    return cti_error(CT_ERR_AUTOGRAD,
                     "ct_backward: ct_scaled_dot_product_attention_backward has no backward "
                     "formula (double backward is not supported); compute its input without "
                     "requires_grad or detach it");
}

static ct_status mark_no_double_backward(ct_tensor *const *in, ct_tensor **g) {
    if (!cti_ag_needed(5, in)) return CT_OK;
    cti_ag_rec r = {.name = "scaled_dot_product_attention_backward",
                    .backward = refuse_double_backward,
                    .nin = 5};
    for (int i = 0; i < 5; i++) r.in[i] = in[i];
    for (int i = 0; i < 3; i++)
        if (g[i]) r.out[r.nout++] = g[i];
    return cti_ag_record(&r);
}

/* t has exactly shape (n, s) and dtype dt. */
static ct_status check_tensor(const char *op, const ct_tensor *t, const char *name, int n,
                              const int64_t *s, ct_dtype dt) {
    bool same = t->ndim == n;
    for (int d = 0; same && d < n; d++) same = t->shape[d] == s[d];
    if (!same)
        return cti_error(CT_ERR_SHAPE, "%s: %s has shape %s, expected %s", op, name, cti_desc(t),
                         cti_shape_s(n, s));
    if (t->dtype != dt)
        return cti_error(CT_ERR_DTYPE, "%s: %s has dtype %s, expected %s", op, name,
                         ct_dtype_name(t->dtype), ct_dtype_name(dt));
    return CT_OK;
}

/* A new tensor of t's shape whose dims lie in memory in the order of t's
 * strides (largest outermost, ties in dim order), densely, as PyTorch's
 * empty_like keeps a layout: a gradient laid out like its input goes back
 * through the input's transposes and views without a copy. Contiguous when
 * that order would not leave the last dim innermost (the kernels need it). */
static ct_tensor *new_in_order(const char *op, const ct_tensor *t) {
    int nd = t->ndim, order[CT_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) order[d] = d;
    for (int i = 1; i < nd; i++)
        for (int j = i; j > 0 && t->stride[order[j - 1]] < t->stride[order[j]]; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    if (order[nd - 1] != nd - 1) return cti_tensor_new(op, nd, t->shape, t->dtype, dev(t));
    int64_t mem[CT_MAX_DIMS], stride[CT_MAX_DIMS], step = 1;
    for (int i = nd - 1; i >= 0; i--) {
        mem[i] = t->shape[order[i]];
        stride[order[i]] = step;
        step *= t->shape[order[i]];
    }
    ct_tensor *m = cti_tensor_new(op, nd, mem, t->dtype, dev(t));
    if (!m) return NULL;
    ct_tensor *r = cti_tensor_view(m, nd, t->shape, stride, 0);
    ct_tensor_release(m);
    return r;
}

/* Whether q, k and v are consecutive pieces along the heads dim of one
 * dense buffer (a fused projection split into q, k and v, each transposed
 * to [B, H, T, D]): one storage, dtype and set of strides, k starting where
 * q's heads end and v where k's do, and the whole, [B, Hq + 2 Hkv, T, D] at
 * q's offset, covering its elements once. */
static bool packed_qkv(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v) {
    if (q->ndim != 4 || k->storage != q->storage || v->storage != q->storage ||
        k->dtype != q->dtype || v->dtype != q->dtype)
        return false;
    for (int d = 0; d < 4; d++) {
        if (k->stride[d] != q->stride[d] || v->stride[d] != q->stride[d]) return false;
        if (d != 1 && (k->shape[d] != q->shape[d] || v->shape[d] != q->shape[d])) return false;
    }
    int64_t sh = q->stride[1];
    if (k->offset != q->offset + q->shape[1] * sh || v->offset != k->offset + k->shape[1] * sh ||
        v->shape[1] != k->shape[1])
        return false;
    int64_t shape[4] = {q->shape[0], q->shape[1] + 2 * k->shape[1], q->shape[2], q->shape[3]};
    /* dense: sorted by stride, each dim steps over the ones inside it exactly */
    bool used[4] = {false, false, false, false};
    int64_t step = 1;
    for (int i = 0; i < 4; i++) {
        int best = -1;
        for (int d = 0; d < 4; d++)
            if (!used[d] && shape[d] > 1 && (best < 0 || q->stride[d] < q->stride[best])) best = d;
        if (best < 0) break;
        if (q->stride[best] != step) return false;
        used[best] = true;
        step *= shape[best];
    }
    return true;
}

/* The gradients of q, k and v: laid out as their inputs are, so that they
 * go back through the inputs' views without copies; for packed q, k and v,
 * three views of one buffer laid out as theirs, which the split that made
 * them passes on without a cat. */
static ct_status new_grads(const char *op, ct_tensor *q, ct_tensor *k, ct_tensor *v,
                           ct_tensor *g[3]) {
    const ct_tensor *src[3] = {q, k, v};
    if (packed_qkv(q, k, v)) {
        int64_t n = cti_numel(4, q->shape) + 2 * cti_numel(4, k->shape);
        ct_tensor *buf = cti_tensor_new(op, 1, &n, q->dtype, dev(q));
        if (!buf) return ct_last_status();
        for (int i = 0; i < 3; i++)
            g[i] = cti_tensor_view(buf, 4, src[i]->shape, src[i]->stride,
                                   src[i]->offset - q->offset);
        ct_tensor_release(buf);
    } else {
        for (int i = 0; i < 3; i++) g[i] = new_in_order(op, src[i]);
    }
    return g[0] && g[1] && g[2] ? CT_OK : ct_last_status();
}

ct_status ct_scaled_dot_product_attention_backward(ct_tensor *grad_out, ct_tensor *q,
                                                   ct_tensor *k, ct_tensor *v, ct_tensor *out,
                                                   ct_tensor *lse, ct_tensor *attn_mask,
                                                   double dropout_p, bool is_causal, double scale,
                                                   uint64_t seed, uint64_t offset, ct_tensor **dq,
                                                   ct_tensor **dk, ct_tensor **dv) {
    const char *op = OP_BWD;
    ct_tensor *req[6] = {grad_out, q, k, v, out, lse};
    ct_tensor *all[7] = {grad_out, q, k, v, out, lse, attn_mask};
    cti_attention_params p = {0};
    ct_status st;
    if ((st = cti_check_not_null(op, 6, req)) || (st = cti_check_same_device(op, 7, all)) ||
        (st = check_args(op, q, k, v, attn_mask, dropout_p, is_causal, scale, &p)))
        return st;
    if (!dq && !dk && !dv)
        return cti_error(CT_ERR_INVALID_ARG, "%s: dq, dk and dv are all NULL (nothing to compute)",
                         op);
    int o = 4 - q->ndim;
    const int64_t os[4] = {p.B, p.Hq, p.T, p.Dv};
    if ((st = check_tensor(op, grad_out, "grad_out", 4 - o, os + o, q->dtype)) ||
        (st = check_tensor(op, out, "out", 4 - o, os + o, q->dtype)) ||
        (st = check_tensor(op, lse, "lse", 3 - o, os + o, stat_dtype(q->dtype))))
        return st;
    p.seed = seed;
    p.offset = offset;
    temps tp = {.n = 0};
    ct_call c;
    cti_call_init(&c, CT_OP_SDPA_BACKWARD);
    ct_tensor *g[3] = {NULL, NULL, NULL};
    ct_tensor *mk = NULL;
    /* Until the dispatch, a failure is that of the call that returned NULL. */
    st = CT_ERR_OOM;
    if (expand_mask(op, &tp, attn_mask, q, &p, &mk) != CT_OK) goto fail;
    ct_tensor *src[5] = {grad_out, q, k, v, out};
    for (int i = 0; i < 5; i++)
        if (!(c.in[i] = as4(&tp, src[i]))) goto fail;
    ct_tensor *lc = keep(&tp, ct_contiguous(lse));
    if (!lc) goto fail;
    const int64_t ls[3] = {p.B, p.Hq, p.T}, lst[3] = {p.Hq * p.T, p.T, 1};
    if (!(c.in[5] = keep(&tp, cti_tensor_view(lc, 3, ls, lst, lc->offset)))) goto fail;
    c.in[6] = mk;
    c.nin = 7;
    if (new_grads(op, q, k, v, g) != CT_OK) goto fail;
    for (int i = 0; i < 3; i++)
        if (!(c.out[i] = as4(&tp, g[i]))) goto fail;
    c.nout = 3;
    cti_call_params(&c, &p);
    st = cti_run(&c, dev(q), q->dtype);
    if (st == CT_OK) st = mark_no_double_backward(req, g);
    goto done;
fail:
    if (ct_last_status() != CT_OK) st = ct_last_status();
done:
    temps_release(&tp);
    ct_tensor **want[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++) {
        if (st == CT_OK && want[i]) *want[i] = g[i];
        else ct_tensor_release(g[i]);
    }
    return st;
}
