/* Backward formulas of the linear-algebra ops (src/ops/linalg.c).
 *
 * Built from the public products and views, so they run on every device and
 * a transposed operand reaches BLAS as a strided view (its transpose flag),
 * never as a copy. Gradients may be left in the broadcast shape of the
 * forward: the engine sums them over broadcast batch dims back to each
 * input's shape. The saved tensor each gradient reads is saved only when
 * that gradient is needed, so an operand that is not saved is NULL here and
 * is never read.
 *
 * Formulas run inside a scope the engine owns, so an early return on error
 * leaves the temporaries to it; on success they release theirs as soon as
 * they are used, to keep the peak memory of a long backward low. */
#include "formulas.h"

/* ---- helpers ----------------------------------------------------------------------- */

/* Returns r after releasing the temporaries t and u (either may be NULL; the
 * error message stays that of the op that failed). */
static ct_tensor *drop2(ct_tensor *r, ct_tensor *t, ct_tensor *u) {
    ct_tensor_release(t);
    ct_tensor_release(u);
    return r;
}

/* Stores g as an input gradient: CT_OK, or the failing op's status. */
static ct_status put(ct_tensor **slot, ct_tensor *g) {
    *slot = g;
    return g ? CT_OK : ct_last_status();
}

/* The transpose of t's last two dims, a view. */
static ct_tensor *mT(ct_tensor *t) { return ct_transpose(t, t->ndim - 2, t->ndim - 1); }

/* Product of the first nd sizes of shape. */
static int64_t lead_numel(int nd, const int64_t *shape) {
    /* Saturates for an empty tensor's huge sizes: the view to [rows, cols]
     * is then refused with a message instead of overflowing. */
    return cti_numel(nd, shape);
}

/* t as [rows, cols] (a view when its strides allow, else a copy). */
static ct_tensor *as_2d(ct_tensor *t, int64_t rows, int64_t cols) {
    return ct_reshape(t, 2, (const int64_t[]){rows, cols});
}

/* Whether t's strides let [rows, cols] view it without a copy. */
static bool merges_to_2d(const ct_tensor *t, int64_t rows, int64_t cols) {
    int64_t stride[2];
    return cti_view_strides(t, 2, (const int64_t[]){rows, cols}, stride);
}

/* x @ y, optionally with x or y transposed (as views), times alpha: one GEMM
 * with the scale folded in (addmm of a zero 0-d input with beta = 0, which
 * the kernels never read). */
static ct_tensor *mm_scaled(ct_tensor *x, bool tx, ct_tensor *y, bool ty, double alpha) {
    ct_tensor *xv = tx ? ct_t(x) : ct_tensor_retain(x);
    ct_tensor *yv = ty ? ct_t(y) : ct_tensor_retain(y);
    if (!xv || !yv) return drop2(NULL, xv, yv);
    ct_tensor *r;
    if (alpha == 1.0) {
        r = ct_mm(xv, yv);
    } else {
        ct_tensor *z = ct_tensor_scalar(0.0, ct_tensor_dtype(x), ct_tensor_device(x));
        r = z ? ct_addmm(z, xv, yv, 0.0, alpha) : NULL;
        ct_tensor_release(z);
    }
    return drop2(r, xv, yv);
}

#define SAVED(var, k)                                                                      \
    ct_status st_##var;                                                                    \
    ct_tensor *var = cti_ag_saved(n, k, &st_##var);                                        \
    if (st_##var != CT_OK) return st_##var

/* ---- matmul ------------------------------------------------------------------------ */

/* d/da of sum(g * matmul(a, b)) for the forward's operand dims (da, db);
 * g has the output's shape. The result is in a's shape or in the broadcast
 * shape [batch..., n, k] (or [batch..., 1, k] for a vector a). */
static ct_tensor *matmul_grad_a(ct_tensor *g, ct_tensor *b, int da, int db) {
    if (da == 1 && db == 1) return ct_mul(g, b); /* dot: g is 0-d */
    if (db == 1) {                               /* [..., n] x [k]: outer product */
        ct_tensor *gu = ct_unsqueeze(g, g->ndim);
        return gu ? drop2(ct_mul(gu, b), gu, NULL) : NULL;
    }
    if (da == 1 && db == 2) return ct_matmul(b, g); /* [k, m] @ [m] */
    /* [..., n or 1, m] @ [..., m, k] */
    ct_tensor *gu = da == 1 ? ct_unsqueeze(g, g->ndim - 1) : ct_tensor_retain(g);
    ct_tensor *bt = mT(b);
    if (!gu || !bt) return drop2(NULL, gu, bt);
    return drop2(ct_matmul(gu, bt), gu, bt);
}

/* d/db, in b's shape or in the broadcast shape [batch..., k, m]. */
static ct_tensor *matmul_grad_b(ct_tensor *g, ct_tensor *a, int da, int db) {
    if (da == 1 && db == 1) return ct_mul(g, a);
    if (da == 1) { /* [k] x [..., k, m]: outer product [k, 1] * [..., 1, m] */
        ct_tensor *au = ct_unsqueeze(a, 1), *gu = ct_unsqueeze(g, g->ndim - 1);
        if (!au || !gu) return drop2(NULL, au, gu);
        return drop2(ct_mul(au, gu), au, gu);
    }
    /* b is shared by every row of a: one product over a's rows merged,
     * g^T a ([rows] @ [rows, k]) or a^T g ([k, rows] @ [rows, m]). A batched
     * a whose rows do not merge takes a batched product instead (summed over
     * the batch by the engine) rather than a copy. */
    int64_t k = a->shape[da - 1], rows = lead_numel(da - 1, a->shape);
    bool merged = da == 2 || merges_to_2d(a, rows, k);
    if (db == 1 && !merged) { /* [..., 1, n] @ [..., n, k] */
        ct_tensor *gu = ct_unsqueeze(g, g->ndim - 1);
        return gu ? drop2(ct_matmul(gu, a), gu, NULL) : NULL;
    }
    if (db == 1 || (db == 2 && da > 2 && merged)) {
        ct_tensor *a2 = as_2d(a, rows, k);
        ct_tensor *g2 = db == 1 ? ct_reshape(g, 1, &rows) : as_2d(g, rows, g->shape[g->ndim - 1]);
        if (!a2 || !g2) return drop2(NULL, a2, g2);
        ct_tensor *r = db == 1 ? ct_matmul(g2, a2) : mm_scaled(a2, true, g2, false, 1.0);
        return drop2(r, a2, g2);
    }
    ct_tensor *at = mT(a);
    if (!at) return NULL;
    return drop2(ct_matmul(at, g), at, NULL);
}

/* Inputs (a, b). Saved: a (when b needs grad), b (when a needs grad). */
CTI_BW(cti_bw_matmul) {
    if (!go[0]) return CT_OK;
    int da = n->in_ndim[0], db = n->in_ndim[1];
    if (n->needs[0]) {
        SAVED(b, 1);
        ct_status st = put(&gi[0], matmul_grad_a(go[0], b, da, db));
        if (st != CT_OK) return st;
    }
    if (n->needs[1]) {
        SAVED(a, 0);
        return put(&gi[1], matmul_grad_b(go[0], a, da, db));
    }
    return CT_OK;
}

/* ---- mm / bmm ---------------------------------------------------------------------- */

/* Inputs (a, b). Saved: a (when b needs grad), b (when a needs grad). */
CTI_BW(cti_bw_mm) {
    if (!go[0]) return CT_OK;
    if (n->needs[0]) {
        SAVED(b, 1);
        ct_status st = put(&gi[0], mm_scaled(go[0], false, b, true, 1.0));
        if (st != CT_OK) return st;
    }
    if (n->needs[1]) {
        SAVED(a, 0);
        return put(&gi[1], mm_scaled(a, true, go[0], false, 1.0));
    }
    return CT_OK;
}

/* Inputs (a, b). Saved: a (when b needs grad), b (when a needs grad). */
CTI_BW(cti_bw_bmm) {
    if (!go[0]) return CT_OK;
    if (n->needs[0]) {
        SAVED(b, 1);
        ct_tensor *bt = mT(b);
        if (!bt) return ct_last_status();
        ct_status st = put(&gi[0], drop2(ct_bmm(go[0], bt), bt, NULL));
        if (st != CT_OK) return st;
    }
    if (n->needs[1]) {
        SAVED(a, 0);
        ct_tensor *at = mT(a);
        if (!at) return ct_last_status();
        return put(&gi[1], drop2(ct_bmm(at, go[0]), at, NULL));
    }
    return CT_OK;
}

/* ---- addmm ------------------------------------------------------------------------- */

/* Inputs (input, m1, m2); params the forward's cti_gemm_params (beta,
 * alpha). Saved: m1 (when m2 needs grad), m2 (when m1 needs grad). The
 * input's gradient is left in the product's shape for the engine to sum to
 * the input's broadcast shape. */
CTI_BW(cti_bw_addmm) {
    if (!go[0]) return CT_OK;
    const cti_gemm_params *p = CTI_NODE_PARAMS(n, cti_gemm_params);
    double beta = p->beta, alpha = p->alpha;
    ct_status st;
    if (n->needs[0]) {
        ct_tensor *g = beta == 1.0 ? ct_tensor_retain(go[0]) : ct_mul_scalar(go[0], beta);
        if ((st = put(&gi[0], g)) != CT_OK) return st;
    }
    if (n->needs[1]) {
        SAVED(m2, 1);
        if ((st = put(&gi[1], mm_scaled(go[0], false, m2, true, alpha))) != CT_OK) return st;
    }
    if (n->needs[2]) {
        SAVED(m1, 0);
        return put(&gi[2], mm_scaled(m1, true, go[0], false, alpha));
    }
    return CT_OK;
}

/* ---- linear ------------------------------------------------------------------------ */

/* The dtype to give input k's gradient in when it comes from a GEMM or row sum over g:
 * float32 where the engine lets it pass wide (an autocast cast of a float32
 * weight, cti_ag_grad_dtype) and g is float16/bfloat16, so the GEMM's
 * float32 accumulators are stored as they are, unrounded, with no cast
 * after; else g's dtype. */
static ct_dtype grad_dtype(const cti_node *n, int k, const ct_tensor *g) {
    bool half = g->dtype == CT_F16 || g->dtype == CT_BF16;
    return half && cti_ag_grad_dtype(n, k) == CT_F32 ? CT_F32 : g->dtype;
}

/* d/dw of sum(g * (x @ w^T)) for x [..., in] and g [..., out]: g^T x. */
static ct_tensor *linear_grad_w(ct_tensor *g, ct_tensor *x, int64_t rows, int64_t in,
                                int64_t out) {
    if (!merges_to_2d(x, rows, in)) {
        /* g^T x per leading index, summed by the engine: no copy of x. */
        ct_tensor *gt = mT(g);
        return gt ? drop2(ct_matmul(gt, x), gt, NULL) : NULL;
    }
    /* x's leading dims merged into rows: one GEMM. */
    ct_tensor *g2 = as_2d(g, rows, out), *x2 = as_2d(x, rows, in);
    if (!g2 || !x2) return drop2(NULL, g2, x2);
    return drop2(mm_scaled(g2, true, x2, false, 1.0), g2, x2);
}

/* Inputs (x, w, bias or NULL): y = x @ w^T + bias. Saved: x (when w needs
 * grad), w (when x needs grad). The bias gradient is g summed over x's
 * leading dims: with the weight's, where x merges into rows, both come from
 * one call (on CUDA one GEMM that sums g as it reads it), each in the dtype
 * grad_dtype gives; alone it is g itself, which the engine sums. */
CTI_BW(cti_bw_linear) {
    ct_tensor *g = go[0];
    if (!g) return CT_OK;
    ct_status st;
    if (n->needs[0]) {
        SAVED(w, 1);
        if ((st = put(&gi[0], ct_matmul(g, w))) != CT_OK) return st; /* [..., out] @ [out, in] */
    }
    bool bias = n->nin > 2 && n->needs[2];
    if (n->needs[1]) {
        SAVED(x, 0);
        int64_t in = n->in_shape[1][1], out = n->in_shape[1][0];
        int64_t rows = lead_numel(n->in_ndim[0] - 1, n->in_shape[0]);
        if (merges_to_2d(x, rows, in))
            return cti_linear_backward_weight_as(g, x, grad_dtype(n, 1, g),
                                                 bias ? grad_dtype(n, 2, g) : g->dtype, &gi[1],
                                                 bias ? &gi[2] : NULL);
        if ((st = put(&gi[1], linear_grad_w(g, x, rows, in, out))) != CT_OK) return st;
    }
    if (bias) gi[2] = ct_tensor_retain(g);
    return CT_OK;
}

/* ---- the GELU MLP ------------------------------------------------------------------ */

/* Inputs (x, w_in, b_in, w_out, b_out; either bias NULL): y = act @ w_out^T + b_out with
 * act = gelu(pre), pre = x @ w_in^T + b_in over x's rows. Saved: x as rows [rows, in]
 * (when w_in needs grad), w_in (when x does), pre (when the hidden gradient or a
 * recomputed act is needed), act (when w_out needs grad and recomputation is off), w_out
 * (for the hidden gradient). The hidden gradient dpre = gelu'(pre) * (g @ w_out) and b_in's
 * gradient, its row sums (float32 when widened), come from one call (on CUDA the GEMM, then
 * one pass that applies gelu' and sums). */
CTI_BW(cti_bw_mlp_gelu) {
    ct_tensor *g = go[0];
    if (!g) return CT_OK;
    ct_gelu_approx approx = (ct_gelu_approx)CTI_NODE_PARAMS(n, cti_pointwise_params)->approximate;
    int nd = n->in_ndim[0];
    int64_t rows = lead_numel(nd - 1, n->in_shape[0]);
    int64_t out = n->in_shape[3][0];
    ct_tensor *g2 = as_2d(g, rows, out);
    if (!g2) return ct_last_status();
    ct_status st = CT_OK;
    if (n->needs[3] || n->needs[4]) {
        SAVED(act, 3);
        ct_tensor *made = NULL;
        if (!act && n->needs[3]) {
            SAVED(pre, 2);
            if (!(act = made = ct_gelu(pre, approx))) return ct_last_status();
        }
        st = cti_linear_backward_weight_as(g2, act, grad_dtype(n, 3, g2), grad_dtype(n, 4, g2),
                                           n->needs[3] ? &gi[3] : NULL,
                                           n->needs[4] ? &gi[4] : NULL);
        ct_tensor_release(made);
        if (st != CT_OK) return st;
    }
    if (!n->needs[0] && !n->needs[1] && !n->needs[2]) {
        ct_tensor_release(g2);
        return CT_OK;
    }
    SAVED(w_out, 4);
    SAVED(pre, 2);
    ct_tensor *dpre = NULL;
    st = cti_mlp_gelu_backward_hidden_as(g2, w_out, pre, approx, grad_dtype(n, 2, pre), &dpre,
                                         n->needs[2] ? &gi[2] : NULL);
    ct_tensor_release(g2);
    if (st != CT_OK) return st;
    if (n->needs[1]) {
        SAVED(x2, 0);
        if ((st = cti_linear_backward_weight_as(dpre, x2, grad_dtype(n, 1, dpre), dpre->dtype,
                                                &gi[1], NULL)) != CT_OK)
            return st;
    }
    if (n->needs[0]) {
        SAVED(w_in, 1);
        ct_tensor *dx = ct_mm(dpre, w_in);
        ct_tensor_release(dpre);
        dpre = NULL;
        if (!dx) return ct_last_status();
        st = put(&gi[0], drop2(ct_reshape(dx, nd, n->in_shape[0]), dx, NULL));
    }
    ct_tensor_release(dpre);
    return st;
}
