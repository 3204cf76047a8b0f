/* Backward formulas of the indexing and shape ops (src/ops/shape.c), as
 * PyTorch's:
 *   scatter:        grad_x = g with zeros where index wrote, grad_src =
 *                   gather(g, dim, index) (zero where src reaches beyond
 *                   index)
 *   scatter_reduce: sum: grad_x = g, grad_src = gather(g); mean: both over
 *                   the counts; amax / amin: the gradient shared evenly among
 *                   the values equal to the result; prod: g times the
 *                   product of the other factors (prod_grads); include_self
 *                   false zeroes grad_x where index wrote
 *   flip, roll:     the same op undoing it (flip again, roll back)
 *   pad:            constant: the inverse crop (pad by the negated sizes);
 *                   the others, and repeat: per remapped dim, the gradient
 *                   added back onto the input coordinate each output
 *                   coordinate read (scatter_add along that dim)
 *   interpolate:    its backward op
 *   unfold / fold:  fold / unfold with the same geometry
 * A NULL incoming gradient means zero: the formulas then return none. */
#include "formulas.h"
#include <stdlib.h>

#define SAVED(var, k)                                                                      \
    ct_status st_##var;                                                                    \
    ct_tensor *var = cti_ag_saved(n, k, &st_##var);                                        \
    if (st_##var != CT_OK) return st_##var

static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

static void rel(ct_tensor *t) {
    if (t) ct_tensor_release(t);
}

ct_tensor *cti_grad_into_input(cti_node *n, int k, ct_tensor *g) {
    if (!g) return NULL;
    int nd = n->in_ndim[k];
    const int64_t *ss = n->in_shape[k];
    bool same = ct_tensor_ndim(g) == nd;
    for (int j = 0; same && j < nd; j++) same = ct_tensor_shape(g)[j] == ss[j];
    if (same) return g;
    ct_tensor *z = ct_tensor_zeros(nd, ss, ct_tensor_dtype(g), ct_tensor_device(g));
    ct_tensor *part = z ? ct_tensor_retain(z) : NULL;
    for (int j = 0; part && j < nd; j++) {
        ct_tensor *nx = ct_narrow(part, j, 0, ct_tensor_shape(g)[j]);
        rel(part);
        part = nx;
    }
    ct_status s = part ? ct_copy_(part, g) : ct_last_status();
    rel(part);
    rel(g);
    if (s != CT_OK) {
        rel(z);
        return NULL;
    }
    return z;
}

/* Releases t unless it is keep (a handle the caller does not own). */
static void drop(ct_tensor *t, ct_tensor *keep) {
    if (t && t != keep) ct_tensor_release(t);
}

/* t narrowed to index's shape in every dim: t itself when it has that
 * shape, else a new view. */
static ct_tensor *narrow_to(ct_tensor *t, ct_tensor *index) {
    ct_tensor *v = t;
    for (int j = 0; v && j < ct_tensor_ndim(index); j++) {
        if (ct_tensor_shape(v)[j] == ct_tensor_shape(index)[j]) continue;
        ct_tensor *nx = ct_narrow(v, j, 0, ct_tensor_shape(index)[j]);
        drop(v, t);
        v = nx;
    }
    return v;
}

CTI_BW(cti_bw_scatter) {
    if (!go[0]) return CT_OK;
    SAVED(index, 0);
    const cti_scatter_params *p = CTI_NODE_PARAMS(n, cti_scatter_params);
    ct_status st = CT_OK;
    if (n->needs[0]) st = put(&gi[0], ct_scatter_value(go[0], p->dim, index, 0));
    if (st == CT_OK && n->nin > 1 && n->needs[1])
        st = put(&gi[1], cti_grad_into_input(n, 1, ct_gather(go[0], p->dim, index)));
    return st;
}

/* (a == b) in a's dtype. */
static ct_tensor *eq_as(ct_tensor *a, ct_tensor *b) {
    ct_tensor *e = ct_eq(a, b);
    ct_tensor *r = e ? ct_to_dtype(e, ct_tensor_dtype(a)) : NULL;
    rel(e);
    return r;
}

/* prod, as PyTorch's: the product of the other factors of an element is
 * result / factor, except where the factor is 0. grad_x: g times the
 * result of the same reduction with x's zeros made 1, over x (made 1 too).
 * grad_src: where src holds the only 0 of its position, g times the result
 * with that 0 made 1; elsewhere g result / src (src's zeros made 1: a
 * position with two zeros has result 0, hence gradient 0). Built in a
 * scope; *gx and *gs are kept out of it. */
static void prod_grads(ct_tensor *g, ct_tensor *x, ct_tensor *src, ct_tensor *index,
                       ct_tensor *result, const cti_scatter_reduce_params *rp, ct_tensor **gx,
                       ct_tensor **gs) {
    const int dim = rp->p.dim;
    const bool self = rp->include_self;
    ct_scope *sc = ct_scope_begin();
    ct_tensor *sn = narrow_to(src, index);
    ct_tensor *x1 = ct_masked_fill(x, ct_eq_scalar(x, 0), 1);
    ct_tensor *others_x = ct_scatter_reduce(x1, dim, index, sn, "prod", self);
    ct_tensor *a = others_x ? ct_div(ct_mul(g, others_x), x1) : NULL;
    ct_tensor *zero = sn ? ct_eq_scalar(sn, 0) : NULL;
    ct_tensor *zeros_at = zero ? ct_scatter_add(ct_tensor_zeros_like(x), dim, index,
                                                 ct_to_dtype(zero, ct_tensor_dtype(x)))
                               : NULL;
    ct_tensor *single = zeros_at ? ct_logical_and(zero, ct_eq_scalar(ct_gather(zeros_at, dim, index), 1))
                                 : NULL;
    ct_tensor *others_s =
        single ? ct_scatter_reduce(x, dim, index, ct_masked_fill(sn, single, 1), "prod", self) : NULL;
    ct_tensor *b = NULL;
    if (others_s) {
        ct_tensor *at_zero = ct_gather(ct_mul(g, others_s), dim, index);
        ct_tensor *plain = ct_div(ct_gather(ct_mul(g, result), dim, index), ct_masked_fill(sn, zero, 1));
        b = at_zero && plain ? ct_where(single, at_zero, plain) : NULL;
    }
    *gx = a ? ct_keep(a) : NULL;
    *gs = b ? ct_keep(b) : NULL;
    ct_scope_end(sc);
}

CTI_BW(cti_bw_scatter_reduce) {
    if (!go[0]) return CT_OK;
    SAVED(index, 0);
    SAVED(x, 1);
    SAVED(src, 2);
    SAVED(result, 3);
    SAVED(count, 4);
    const cti_scatter_reduce_params *rp = CTI_NODE_PARAMS(n, cti_scatter_reduce_params);
    int dim = rp->p.dim;
    ct_tensor *g = go[0], *gx = NULL, *gs = NULL;
    if (rp->p.reduce == CTI_SCATTER_SUM) {
        gx = rp->mean ? ct_div(g, count) : ct_clone(g);
        gs = gx ? ct_gather(gx, dim, index) : NULL;
    } else if (rp->p.reduce == CTI_SCATTER_PROD) {
        prod_grads(g, x, src, index, result, rp, &gx, &gs);
    } else {
        ct_tensor *value = ct_gather(result, dim, index);
        ct_tensor *sn = narrow_to(src, index);
        ct_tensor *self_is = eq_as(x, result);
        ct_tensor *src_is = value && sn ? eq_as(sn, value) : NULL;
        ct_tensor *cnt = self_is && src_is ? ct_scatter_add(self_is, dim, index, src_is) : NULL;
        ct_tensor *gd = cnt ? ct_div(g, cnt) : NULL;
        ct_tensor *gg = gd ? ct_gather(gd, dim, index) : NULL;
        gx = gd ? ct_mul(self_is, gd) : NULL;
        gs = gg ? ct_mul(src_is, gg) : NULL;
        drop(sn, src);
        rel(value), rel(self_is), rel(src_is), rel(cnt), rel(gd), rel(gg);
    }
    if (gx && !rp->include_self) {
        ct_tensor *z = ct_scatter_value(gx, dim, index, 0);
        rel(gx);
        gx = z;
    }
    ct_status st = gx && gs ? CT_OK : ct_last_status();
    if (st == CT_OK && n->needs[0]) {
        gi[0] = gx;
        gx = NULL;
    }
    if (st == CT_OK && n->needs[1]) {
        st = put(&gi[1], cti_grad_into_input(n, 1, gs));
        gs = NULL;
    }
    rel(gx), rel(gs);
    return st;
}

CTI_BW(cti_bw_flip) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_remap_params *p = CTI_NODE_PARAMS(n, cti_remap_params);
    return put(&gi[0], cti_remap_run("ct_flip", CT_OP_FLIP, go[0], n->in_shape[0], p));
}

CTI_BW(cti_bw_roll) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    cti_remap_params q = *CTI_NODE_PARAMS(n, cti_remap_params);
    for (int k = 0; k < n->in_ndim[0]; k++)
        if (q.mode[k] == CTI_REMAP_WRAP) q.lo[k] = (n->in_shape[0][k] - q.lo[k]) % n->in_shape[0][k];
    return put(&gi[0], cti_remap_run("ct_roll", CT_OP_ROLL, go[0], n->in_shape[0], &q));
}

/* The input coordinate output coordinate o reads along a dim (schema.h's
 * PAD contract; never the fill value here). */
static int64_t source_of(int mode, int64_t o, int64_t lo, int64_t size) {
    int64_t i = o - lo;
    switch (mode) {
    case CTI_REMAP_FLIP: return size - 1 - o;
    case CTI_REMAP_WRAP: i %= size; return i < 0 ? i + size : i;
    case CTI_REMAP_REFLECT:
        if (i < 0) i = -i;
        return i >= size ? 2 * (size - 1) - i : i;
    case CTI_REMAP_CLAMP: return i < 0 ? 0 : i >= size ? size - 1 : i;
    default: return i;
    }
}

/* g (nd dims) with dim k's coordinates added back onto the size input
 * coordinates they were read from (mode, lo): a new tensor. */
static ct_tensor *fold_dim(ct_tensor *g, int k, int mode, int64_t lo, int64_t size) {
    int nd = ct_tensor_ndim(g);
    int64_t on = ct_tensor_shape(g)[k];
    int64_t *src = malloc(sizeof(int64_t) * (size_t)(on > 0 ? on : 1));
    if (!src) {
        cti_error(CT_ERR_OOM, "backward of a pad or repeat: out of memory");
        return NULL;
    }
    for (int64_t o = 0; o < on; o++) src[o] = source_of(mode, o, lo, size);
    int64_t vs[CT_MAX_DIMS], zs[CT_MAX_DIMS];
    for (int j = 0; j < nd; j++) {
        vs[j] = j == k ? on : 1;
        zs[j] = j == k ? size : ct_tensor_shape(g)[j];
    }
    ct_tensor *idx = ct_tensor_from_data_on(src, CT_I64, nd, vs, ct_tensor_device(g));
    free(src);
    ct_tensor *ie = idx ? ct_expand(idx, nd, ct_tensor_shape(g)) : NULL;
    ct_tensor *z = ie ? ct_tensor_zeros(nd, zs, ct_tensor_dtype(g), ct_tensor_device(g)) : NULL;
    ct_tensor *r = z ? ct_scatter_add(z, k, ie, g) : NULL;
    rel(idx), rel(ie), rel(z);
    return r;
}

CTI_BW(cti_bw_pad) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_remap_params *p = CTI_NODE_PARAMS(n, cti_remap_params);
    int nd = n->in_ndim[0];
    bool constant = true;
    for (int k = 0; k < nd; k++) constant = constant && p->mode[k] == CTI_REMAP_IDENT;
    if (constant) {
        cti_remap_params q = {.nd = p->nd};
        for (int k = 0; k < nd; k++) q.lo[k] = -p->lo[k];
        return put(&gi[0], cti_remap_run("ct_pad", CT_OP_PAD, go[0], n->in_shape[0], &q));
    }
    ct_tensor *g = go[0];
    for (int k = nd - 1; g && k >= 0; k--) {
        if (p->mode[k] == CTI_REMAP_IDENT) continue;
        ct_tensor *f = fold_dim(g, k, p->mode[k], p->lo[k], n->in_shape[0][k]);
        drop(g, go[0]);
        g = f;
    }
    return put(&gi[0], g);
}

CTI_BW(cti_bw_repeat) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_repeat_params *p = CTI_NODE_PARAMS(n, cti_repeat_params);
    int lead = p->n - n->in_ndim[0];
    ct_tensor *g = go[0];
    for (int k = p->n - 1; g && k >= 0; k--) {
        if (p->repeats[k] == 1) continue;
        int64_t size = k < lead ? 1 : n->in_shape[0][k - lead];
        if (p->repeats[k] == 0 || size == 0) { /* nothing was read: zeros of the input size */
            int64_t zs[CT_MAX_DIMS];
            memcpy(zs, ct_tensor_shape(g), sizeof(int64_t) * (size_t)p->n);
            zs[k] = size;
            ct_tensor *z = ct_tensor_zeros(p->n, zs, ct_tensor_dtype(g), ct_tensor_device(g));
            drop(g, go[0]);
            g = z;
            continue;
        }
        ct_tensor *f = fold_dim(g, k, CTI_REMAP_WRAP, 0, size);
        drop(g, go[0]);
        g = f;
    }
    ct_tensor *r = g ? ct_reshape(g, n->in_ndim[0], n->in_shape[0]) : NULL;
    drop(g, go[0]);
    return put(&gi[0], r);
}

CTI_BW(cti_bw_interpolate) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    return put(&gi[0], cti_interpolate_backward(go[0], CTI_NODE_PARAMS(n, cti_interp_params)));
}

CTI_BW(cti_bw_unfold) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_fold_params *p = CTI_NODE_PARAMS(n, cti_fold_params);
    int64_t size[2] = {p->H, p->W};
    return put(&gi[0], ct_fold(go[0], size, p->kernel, p->dilation, p->padding, p->stride));
}

CTI_BW(cti_bw_fold) {
    if (!go[0] || !n->needs[0]) return CT_OK;
    const cti_fold_params *p = CTI_NODE_PARAMS(n, cti_fold_params);
    return put(&gi[0], ct_unfold(go[0], p->kernel, p->dilation, p->padding, p->stride));
}
