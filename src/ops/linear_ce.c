/* Front end of ct_linear_cross_entropy: linear + cross-entropy without the
 * [N, V] logits (Liger Kernel's fused linear cross-entropy).
 *
 * The rows of x go through in chunks of c rows whose logits [c, V] fit a
 * bounded workspace (LCE_WORKSPACE_BYTES, at least one row); per chunk:
 *   logits = x_c @ weight^T (+ bias)            ADDMM / MM into the workspace
 *   loss_c, logits <- dloss/dlogits             CROSS_ENTROPY_FUSED, in place
 *   dx_c = logits @ weight                      MM into dx's rows
 *   dweight (+)= logits^T @ x_c                 ADDMM accumulating in place
 *   dbias (+)= column sums of logits
 * so the extra memory is O(c V) besides the gradients themselves. Every step
 * is a dispatched op, so the loop runs on any device with these kernels.
 *
 * The gradients are computed with the scale of a sum (1 per counted row);
 * the mean's 1 / count and grad_loss are applied afterwards as one device
 * scalar, so nothing is read back to the host and the forward never waits
 * for the device. With mean or sum and a weight, bias or x that requires
 * grad, the forward computes the gradients eagerly (the logits are then
 * made once, as in Liger Kernel) and its node saves them; the backward
 * scales them by grad_loss (divided by max(count, 1) for mean: with no
 * counted row every gradient is 0). With reduction none the per-row
 * grad_loss is unknown in the forward, so the node saves x, weight, bias
 * and target and its backward runs the chunk loop again with grad_loss as
 * each row's gradient scale (two more GEMMs; memory stays O(c V)). */
#include "ops_impl.h"

#include <stdatomic.h>

/* Bytes of one chunk's logits. Each chunk reads and writes all of dweight
 * (its GEMM accumulates in place), so fewer, larger chunks are faster: on
 * the H200, N 16384, d 768, V 50304 bf16, chunks of 256 / 656 / 1312 / 2624
 * rows took 11.96 / 9.18 / 8.40 / 7.87 ms forward + backward with
 * 198 / 196 / 256 / 382 MiB at peak besides the inputs. 96 MiB (968 rows
 * there) stays within 0.25 GiB with the gradients of x and the weight. */
#define LCE_WORKSPACE_BYTES ((int64_t)96 << 20)

static _Atomic int64_t chunk_rows_forced;

/* Test hook: chunks of exactly rows rows (0: the automatic choice). */
void cti_linear_ce_set_chunk_rows(int64_t rows) {
    atomic_store(&chunk_rows_forced, rows > 0 ? rows : 0);
}

/* Rows per chunk: as many as fit the workspace, balanced over the chunks
 * and rounded up to a multiple of 8 (GEMM tiles). */
static int64_t chunk_rows(int64_t n, int64_t v, ct_dtype dt) {
    int64_t forced = atomic_load(&chunk_rows_forced);
    if (n <= 0) return 1;
    if (forced > 0) return forced < n ? forced : n;
    int64_t fit = LCE_WORKSPACE_BYTES / (v * (int64_t)ct_dtype_size(dt));
    if (fit < 1) fit = 1;
    if (fit >= n) return n;
    int64_t nchunk = (n + fit - 1) / fit;
    int64_t c = (n + nchunk - 1) / nchunk;
    if (c >= 8) c = (c + 7) / 8 * 8;
    return c < n ? c : n;
}

static ct_device dev_of(const ct_tensor *t) { return t->storage->device; }

static ct_dtype acc_dtype(ct_dtype dt) { return dt == CT_F64 ? CT_F64 : CT_F32; }

/* ---- checks ------------------------------------------------------------------------------ */

typedef struct lce_in {
    ct_tensor *x, *weight, *bias, *target;
    int64_t n, d, v;
    int reduction;
    int64_t ignore;
    double ls;
    ct_dtype loss_dtype; /* x's, or float32 (float64 for float64) under autocast */
} lce_in;

static ct_status check_dtype_of(const char *op, const ct_tensor *t, const char *name,
                                const ct_tensor *x) {
    if (t->dtype == x->dtype) return CT_OK;
    return cti_error(CT_ERR_DTYPE, "%s: %s has dtype %s, expected x's dtype %s", op, name,
                     ct_dtype_name(t->dtype), ct_dtype_name(x->dtype));
}

static ct_status check_args(const char *op, lce_in *a) {
    ct_tensor *all[4] = {a->x, a->weight, a->target, a->bias};
    if (cti_check_not_null(op, 3, all) || cti_check_same_device(op, 4, all) ||
        cti_check_floating(op, a->x, "x") || check_dtype_of(op, a->weight, "weight", a->x) ||
        (a->bias && check_dtype_of(op, a->bias, "bias", a->x)))
        return ct_last_status();
    const ct_tensor *x = a->x, *w = a->weight, *b = a->bias, *t = a->target;
    if (x->ndim < 1)
        return cti_error(CT_ERR_SHAPE, "%s: x must have a feature dim, got %s", op, cti_desc(x));
    a->d = x->shape[x->ndim - 1];
    if (w->ndim != 2 || w->shape[1] != a->d)
        return cti_error(CT_ERR_SHAPE, "%s: weight %s must be [V, %lld] for x %s", op, cti_desc(w),
                         (long long)a->d, cti_desc(x));
    a->v = w->shape[0];
    if (a->v < 1)
        return cti_error(CT_ERR_SHAPE, "%s: weight %s has no classes (expected V >= 1)", op,
                         cti_desc(w));
    if (b && (b->ndim != 1 || b->shape[0] != a->v))
        return cti_error(CT_ERR_SHAPE, "%s: bias %s must be [%lld] (weight %s)", op, cti_desc(b),
                         (long long)a->v, cti_desc(w));
    if (t->dtype != CT_I64)
        return cti_error(CT_ERR_DTYPE, "%s: expected int64 class indices for target, got %s", op,
                         ct_dtype_name(t->dtype));
    if (t->ndim != x->ndim - 1 || cti_numel(t->ndim, t->shape) != cti_numel(t->ndim, x->shape))
        goto bad_target;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] != x->shape[i]) goto bad_target;
    if (a->reduction != CT_REDUCTION_NONE && a->reduction != CT_REDUCTION_MEAN &&
        a->reduction != CT_REDUCTION_SUM)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: unknown reduction %d (expected none, mean or sum)", op, a->reduction);
    if (!(a->ls >= 0 && a->ls <= 1))
        return cti_error(CT_ERR_INVALID_ARG, "%s: label_smoothing must be in [0, 1], got %g", op,
                         a->ls);
    a->n = cti_numel(t->ndim, t->shape);
    return CT_OK;
bad_target:
    return cti_error(CT_ERR_SHAPE, "%s: target %s does not match x %s (expected target shape %s)",
                     op, cti_desc(t), cti_desc(x), cti_shape_s(x->ndim - 1, x->shape));
}

/* ---- dispatch helpers ------------------------------------------------------------------- */

/* out = beta * input + a @ b (input NULL: out = a @ b), written into out's storage. */
static ct_status gemm_into(ct_tensor *out, ct_tensor *input, ct_tensor *a, ct_tensor *b,
                           double beta) {
    cti_gemm_params p = {.beta = input ? beta : 0, .alpha = 1};
    ct_call c;
    cti_call_init(&c, input ? CT_OP_ADDMM : CT_OP_MM);
    cti_call_params(&c, &p);
    int k = 0;
    if (input) c.in[k++] = input;
    c.in[k++] = a;
    c.in[k++] = b;
    c.nin = k;
    c.out[0] = out;
    c.nout = 1;
    return cti_run(&c, dev_of(out), out->dtype);
}

static ct_status ce_fused(ct_tensor *logits, ct_tensor *target, ct_tensor *row_scale,
                          ct_tensor *loss, const lce_in *a, bool grad) {
    cti_ce_fused_params p = {.rows = logits->shape[0],
                             .c = logits->shape[1],
                             .ignore_index = a->ignore,
                             .label_smoothing = a->ls,
                             .scale = 1,
                             .grad = grad};
    ct_call c;
    cti_call_init(&c, CT_OP_CROSS_ENTROPY_FUSED);
    cti_call_params(&c, &p);
    c.in[0] = logits;
    c.in[1] = target;
    c.in[2] = row_scale;
    c.nin = 3;
    c.out[0] = loss;
    c.nout = 1;
    return cti_run(&c, dev_of(logits), logits->dtype);
}

/* ---- the chunk loop ---------------------------------------------------------------------- */

/* What one pass over the chunks produces; a NULL slot is not wanted. */
typedef struct lce_out {
    ct_tensor *loss; /* [N] per-row losses, f32 (f64 for f64) */
    ct_tensor *dx;   /* [N, d] */
    ct_tensor *dw;   /* [V, d] */
    ct_tensor *db;   /* [V] */
} lce_out;

typedef struct lce_chunk {
    ct_tensor *xc, *tc, *sc, *logits, *lossc, *dxc, *lt, *colsum;
} lce_chunk;

static void chunk_release(lce_chunk *k) {
    ct_tensor *ts[] = {k->xc, k->tc, k->sc, k->logits, k->lossc, k->dxc, k->lt, k->colsum};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
    memset(k, 0, sizeof *k);
}

/* Rows [s, s + r) of one pass: w the weight (wt its transpose), x2 [N, d], t1 [N]
 * contiguous, scale1 [N] or NULL, ws the [c, V] workspace, bias_e the bias expanded to
 * [c, V] (NULL without bias). */
static ct_status one_chunk(const lce_in *a, ct_tensor *w, ct_tensor *x2, ct_tensor *t1,
                           ct_tensor *scale1, ct_tensor *ws, ct_tensor *wt, ct_tensor *bias_e,
                           int64_t s, int64_t r, bool want_grad, lce_out *o) {
    lce_chunk k = {0};
    ct_status st = CT_ERR_OOM;
    bool first = s == 0;
    ct_tensor *be = NULL;
    if (!(k.xc = ct_narrow(x2, 0, s, r)) || !(k.tc = ct_narrow(t1, 0, s, r)) ||
        (scale1 && !(k.sc = ct_narrow(scale1, 0, s, r))) ||
        !(k.logits = ct_narrow(ws, 0, 0, r)) || !(k.lossc = ct_narrow(o->loss, 0, s, r)))
        goto done;
    if (bias_e && !(be = ct_narrow(bias_e, 0, 0, r))) goto done;
    st = gemm_into(k.logits, be, k.xc, wt, 1.0);
    ct_tensor_release(be);
    if (st != CT_OK) goto done;
    if ((st = ce_fused(k.logits, k.tc, k.sc, k.lossc, a, want_grad)) != CT_OK) goto done;
    if (!want_grad) goto done;
    st = CT_ERR_OOM;
    if (o->dx) {
        if (!(k.dxc = ct_narrow(o->dx, 0, s, r))) goto done;
        if ((st = gemm_into(k.dxc, NULL, k.logits, w, 0)) != CT_OK) goto done;
    }
    if (o->dw) {
        if (!(k.lt = ct_t(k.logits))) goto done;
        /* the first chunk writes dweight, the others add to it in place */
        st = first ? gemm_into(o->dw, NULL, k.lt, k.xc, 0) : gemm_into(o->dw, o->dw, k.lt, k.xc, 1);
        if (st != CT_OK) goto done;
    }
    if (o->db) {
        int64_t d0 = 0;
        if (!(k.colsum = ct_sum(k.logits, 1, &d0, false))) goto done;
        st = first ? ct_copy_(o->db, k.colsum) : ct_add_(o->db, k.colsum);
        if (st != CT_OK) goto done;
    }
    st = CT_OK;
done:
    if (st != CT_OK && ct_last_status() != CT_OK) st = ct_last_status();
    chunk_release(&k);
    return st;
}

/* Allocates o's slots (the per-row losses, and each gradient its flag asks
 * for) and runs every chunk; x2 [N, d] and t1 [N] as one_chunk. */
static ct_status run_chunks(const char *op, const lce_in *a, ct_tensor *x2, ct_tensor *t1,
                            ct_tensor *scale1, bool want_dx, bool want_dw, bool want_db,
                            lce_out *o) {
    ct_dtype dt = a->x->dtype;
    ct_device dv = dev_of(a->x);
    bool want_grad = want_dx || want_dw || want_db;
    int64_t c = chunk_rows(a->n, a->v, dt);
    int64_t nshape[1] = {a->n}, dxs[2] = {a->n, a->d}, wss[2] = {c, a->v};
    ct_tensor *ws = NULL, *wt = NULL, *wc = NULL, *bias_e = NULL;
    ct_status st = CT_ERR_OOM;
    memset(o, 0, sizeof *o);
    if (!(o->loss = cti_tensor_new(op, 1, nshape, acc_dtype(dt), dv))) goto fail;
    if (want_dx && !(o->dx = cti_tensor_new(op, 2, dxs, dt, dv))) goto fail;
    if (want_dw && !(o->dw = cti_tensor_new(op, 2, a->weight->shape, dt, dv))) goto fail;
    if (want_db && !(o->db = cti_tensor_new(op, 1, &a->v, dt, dv))) goto fail;
    if (want_dw && a->n == 0 && ct_zero_(o->dw) != CT_OK) goto fail;
    if (want_db && a->n == 0 && ct_zero_(o->db) != CT_OK) goto fail;
    /* a weight BLAS cannot read in place would be packed by every GEMM of every chunk */
    if (!(wc = ct_contiguous(a->weight))) goto fail;
    if (!(ws = cti_tensor_new(op, 2, wss, dt, dv)) || !(wt = ct_t(wc))) goto fail;
    if (a->bias && !(bias_e = ct_expand(a->bias, 2, wss))) goto fail;
    for (int64_t s = 0; s < a->n; s += c) {
        int64_t r = a->n - s < c ? a->n - s : c;
        if ((st = one_chunk(a, wc, x2, t1, scale1, ws, wt, bias_e, s, r, want_grad, o)) != CT_OK)
            goto fail;
    }
    ct_tensor_release(wc);
    ct_tensor_release(ws);
    ct_tensor_release(wt);
    ct_tensor_release(bias_e);
    return CT_OK;
fail:
    if (ct_last_status() != CT_OK) st = ct_last_status();
    ct_tensor_release(wc);
    ct_tensor_release(ws);
    ct_tensor_release(wt);
    ct_tensor_release(bias_e);
    ct_tensor_release(o->loss);
    ct_tensor_release(o->dx);
    ct_tensor_release(o->dw);
    ct_tensor_release(o->db);
    memset(o, 0, sizeof *o);
    return st;
}

/* x as [N, d] and target as contiguous [N] (new references). */
static ct_status flat_inputs(const lce_in *a, ct_tensor **x2, ct_tensor **t1) {
    int64_t xs[2] = {a->n, a->d}, ts[1] = {a->n};
    ct_tensor *tf = NULL;
    *x2 = ct_reshape(a->x, 2, xs);
    if (*x2 && (tf = ct_reshape(a->target, 1, ts))) *t1 = ct_contiguous(tf);
    ct_tensor_release(tf);
    if (*x2 && *t1) return CT_OK;
    ct_tensor_release(*x2);
    *x2 = *t1 = NULL;
    return ct_last_status();
}

/* The number of counted targets (int64, 0-d). */
static ct_tensor *count_targets(ct_tensor *t1, int64_t ignore) {
    ct_tensor *ne = ct_ne_scalar(t1, (double)ignore);
    ct_tensor *cnt = ne ? ct_sum(ne, 0, NULL, false) : NULL;
    ct_tensor_release(ne);
    return cnt;
}

/* The loss from the per-row losses: none keeps them (target's shape), sum
 * adds them, mean divides the sum by count (0 counted: 0 / 0 = NaN, as
 * PyTorch); in a->loss_dtype. */
static ct_tensor *reduce_loss(const lce_in *a, ct_tensor *rows, ct_tensor *count) {
    ct_tensor *r = NULL, *tmp = NULL, *out = NULL;
    if (a->reduction == CT_REDUCTION_NONE) {
        r = ct_view(rows, a->target->ndim, a->target->shape);
    } else {
        tmp = ct_sum(rows, 0, NULL, false);
        if (tmp) r = a->reduction == CT_REDUCTION_MEAN ? ct_div(tmp, count) : ct_tensor_retain(tmp);
    }
    if (r) out = ct_to_dtype(r, a->loss_dtype);
    ct_tensor_release(tmp);
    ct_tensor_release(r);
    return out;
}

/* ---- public ------------------------------------------------------------------------------ */

/* The forward; autocast: the loss in float32, as PyTorch's cross_entropy (an fp32 op of
 * autocast) returns it after a lower-precision linear. */
static ct_tensor *linear_ce(ct_tensor *x, ct_tensor *weight, ct_tensor *bias, ct_tensor *target,
                            int64_t ignore_index, double label_smoothing, ct_reduction reduction,
                            bool autocast) {
    static const char op[] = "ct_linear_cross_entropy";
    lce_in a = {.x = x, .weight = weight, .bias = bias, .target = target,
                .reduction = (int)reduction, .ignore = ignore_index, .ls = label_smoothing};
    if (check_args(op, &a) != CT_OK) return NULL;
    a.loss_dtype = autocast ? acc_dtype(x->dtype) : x->dtype;
    ct_tensor *ins[3] = {x, weight, bias};
    bool record = cti_ag_needed(3, ins);
    bool need[3];
    for (int i = 0; i < 3; i++) need[i] = record && ins[i] && ct_requires_grad(ins[i]);
    bool eager = record && reduction != CT_REDUCTION_NONE;

    bool prev = ct_no_grad_begin();
    ct_tensor *x2 = NULL, *t1 = NULL, *count = NULL, *loss = NULL, *dx = NULL;
    lce_out o = {0};
    if (flat_inputs(&a, &x2, &t1) != CT_OK) goto done;
    if (reduction == CT_REDUCTION_MEAN && !(count = count_targets(t1, ignore_index))) goto done;
    if (run_chunks(op, &a, x2, t1, NULL, eager && need[0], eager && need[1], eager && need[2],
                   &o) != CT_OK)
        goto done;
    if (!(loss = reduce_loss(&a, o.loss, count))) goto done;
    if (o.dx && !(dx = ct_view(o.dx, x->ndim, x->shape))) {
        ct_tensor_release(loss);
        loss = NULL;
        goto done;
    }
done:
    ct_no_grad_end(prev);
    if (loss && record) {
        cti_lce_params p = {.reduction = (int)reduction, .ignore_index = ignore_index,
                            .label_smoothing = label_smoothing, .eager = eager};
        cti_ag_rec r = {.name = "LinearCrossEntropyBackward",
                        .backward = cti_bw_linear_cross_entropy,
                        .nin = 3, .in = {x, weight, bias}, .nout = 1, .out = {loss},
                        .nsaved = 4, CTI_AG_PARAMS(&p)};
        if (eager) {
            r.saved[0] = dx;
            r.saved[1] = o.dw;
            r.saved[2] = o.db;
            r.saved[3] = count;
        } else {
            r.saved[0] = x;
            r.saved[1] = weight;
            r.saved[2] = bias;
            r.saved[3] = target;
        }
        if (cti_ag_record(&r) != CT_OK) {
            ct_tensor_release(loss);
            loss = NULL;
        }
    }
    ct_tensor_release(x2);
    ct_tensor_release(t1);
    ct_tensor_release(count);
    ct_tensor_release(dx);
    ct_tensor_release(o.loss);
    ct_tensor_release(o.dx);
    ct_tensor_release(o.dw);
    ct_tensor_release(o.db);
    return loss;
}

ct_tensor *ct_linear_cross_entropy(ct_tensor *x, ct_tensor *weight, ct_tensor *bias,
                                   ct_tensor *target, int64_t ignore_index,
                                   double label_smoothing, ct_reduction reduction) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_LINEAR_CROSS_ENTROPY, 3,
                              (ct_tensor *[]){x, weight, bias}))
        return cti_autocast_end_op(&ac, ac.ok ? linear_ce(ac.in[0], ac.in[1], ac.in[2], target,
                                                          ignore_index, label_smoothing,
                                                          reduction, true)
                                              : NULL);
    return linear_ce(x, weight, bias, target, ignore_index, label_smoothing, reduction, false);
}

/* Multiplies each non-NULL gradient in place by factor (a 0-d tensor). */
static ct_status scale_all(ct_tensor *factor, ct_tensor *dx, ct_tensor *dw, ct_tensor *db) {
    ct_tensor *gs[3] = {dx, dw, db};
    for (int i = 0; i < 3; i++)
        if (gs[i] && ct_mul_(gs[i], factor) != CT_OK) return ct_last_status();
    return CT_OK;
}

ct_status ct_linear_cross_entropy_backward(ct_tensor *grad_loss, ct_tensor *x, ct_tensor *weight,
                                           ct_tensor *bias, ct_tensor *target,
                                           int64_t ignore_index, double label_smoothing,
                                           ct_reduction reduction, ct_tensor **dx,
                                           ct_tensor **dweight, ct_tensor **dbias) {
    static const char op[] = "ct_linear_cross_entropy_backward";
    if (dx) *dx = NULL;
    if (dweight) *dweight = NULL;
    if (dbias) *dbias = NULL;
    lce_in a = {.x = x, .weight = weight, .bias = bias, .target = target,
                .reduction = (int)reduction, .ignore = ignore_index, .ls = label_smoothing};
    if (cti_check_not_null(op, 1, &grad_loss) != CT_OK || check_args(op, &a) != CT_OK)
        return ct_last_status();
    if (!dx && !dweight && !dbias)
        return cti_error(CT_ERR_INVALID_ARG, "%s: no gradient asked for (dx, dweight and dbias "
                         "are all NULL)", op);
    if (dbias && !bias)
        return cti_error(CT_ERR_INVALID_ARG, "%s: dbias asked for without a bias", op);
    bool none = reduction == CT_REDUCTION_NONE;
    int gnd = none ? target->ndim : 0;
    bool gshape = grad_loss->ndim == gnd;
    for (int i = 0; gshape && i < gnd; i++) gshape = grad_loss->shape[i] == target->shape[i];
    if (!gshape)
        return cti_error(CT_ERR_SHAPE, "%s: grad_loss %s must have the loss's shape %s", op,
                         cti_desc(grad_loss), cti_shape_s(gnd, target->shape));
    if (check_dtype_of(op, grad_loss, "grad_loss", x) != CT_OK ||
        cti_check_same_device(op, 2, (ct_tensor *[]){x, grad_loss}) != CT_OK)
        return ct_last_status();

    bool prev = ct_no_grad_begin();
    ct_status st = CT_OK;
    ct_tensor *x2 = NULL, *t1 = NULL, *g1 = NULL, *gf = NULL, *count = NULL, *factor = NULL;
    lce_out o = {0};
    if ((st = flat_inputs(&a, &x2, &t1)) != CT_OK) goto done;
    if (none) {
        int64_t ns[1] = {a.n};
        ct_tensor *gv = ct_reshape(grad_loss, 1, ns);
        g1 = gv ? ct_contiguous(gv) : NULL;
        ct_tensor_release(gv);
        if (!g1) goto fail;
    }
    if ((st = run_chunks(op, &a, x2, t1, g1, dx != NULL, dweight != NULL, dbias != NULL, &o)) !=
        CT_OK)
        goto done;
    if (!none) {
        if (reduction == CT_REDUCTION_MEAN && !(count = count_targets(t1, ignore_index)))
            goto fail;
        if (!(factor = cti_linear_ce_factor(grad_loss, count, (int)reduction))) goto fail;
        if ((st = scale_all(factor, o.dx, o.dw, o.db)) != CT_OK) goto done;
    }
    if (dx && !(gf = ct_view(o.dx, x->ndim, x->shape))) goto fail;
    if (dx) *dx = gf;
    /* handed over, not retained: a retain released below would take the
     * handle out of the caller's scope (ct_tensor_release's contract) */
    if (dweight) {
        *dweight = o.dw;
        o.dw = NULL;
    }
    if (dbias) {
        *dbias = o.db;
        o.db = NULL;
    }
    goto done;
fail:
    st = ct_last_status() != CT_OK ? ct_last_status() : CT_ERR_OOM;
done:
    ct_no_grad_end(prev);
    ct_tensor_release(x2);
    ct_tensor_release(t1);
    ct_tensor_release(g1);
    ct_tensor_release(count);
    ct_tensor_release(factor);
    ct_tensor_release(o.loss);
    ct_tensor_release(o.dx);
    ct_tensor_release(o.dw);
    ct_tensor_release(o.db);
    return st;
}
