/* Front ends of the linear-algebra ops: matmul, mm, bmm, addmm, linear and
 * linear's weight and bias gradients.
 *
 * Every product reaches the kernels as [batch..., n, k] @ [batch..., k, m]
 * views of the caller's tensors: vectors become one row or one column,
 * broadcast batch dims get stride 0, transposes keep their strides (the
 * kernel hands them to BLAS through its transpose flag). No operand is
 * copied here, except a linear() input whose leading dims cannot be merged
 * into rows. Results are allocated contiguous in their final shape and the
 * kernel writes them through a [batch..., n, m] view.
 *
 * Autograd records the call as the user made it (the caller's operands, the
 * final result); the formulas are in src/autograd/formulas_linalg.c. */
#include <stdio.h>

#include "ops_impl.h"

/* ---- argument checks ------------------------------------------------------------ */

/* NULL, device and dtype checks for the operands ts[0..n) (NULL entries past
 * nreq are optional): one device, one floating dtype, or with allow_int
 * int32/int64 on the CPU as PyTorch's CPU matmul allows (CUDA refuses
 * integer products, as PyTorch's does). names lists the operands for the
 * dtype message ("both operands" when NULL). */
static ct_status check_operands_int(const char *op, int nreq, int n, ct_tensor *const *ts,
                                    const char *names, bool allow_int) {
    ct_status s = cti_check_not_null(op, nreq, ts);
    if (s != CT_OK) return s;
    s = cti_check_same_device(op, n, ts);
    if (s != CT_OK) return s;
    ct_dtype dt = ts[0]->dtype;
    bool same = true;
    for (int i = 1; i < n; i++)
        if (ts[i] && ts[i]->dtype != dt) same = false;
    if (!same) {
        char got[128] = "";
        size_t len = 0;
        for (int i = 0; i < n; i++) {
            if (!ts[i]) continue;
            const char *sep = len == 0 ? "" : (i == n - 1 ? " and " : ", ");
            len += (size_t)snprintf(got + len, sizeof got - len, "%s%s", sep,
                                    ct_dtype_name(ts[i]->dtype));
            if (len >= sizeof got) break;
        }
        return cti_error(CT_ERR_DTYPE, "%s: expected %s to have the same dtype, got %s", op,
                         names ? names : "both operands", got);
    }
    if (allow_int && (dt == CT_I32 || dt == CT_I64)) {
        if (ts[0]->storage->device.type == CT_DEVICE_CPU) return CT_OK;
        char dev[32];
        return cti_error(CT_ERR_DTYPE,
                         "%s: integer matmul is supported on the CPU only, got %s on %s (as "
                         "PyTorch's \"addmm_cuda\" not implemented for '%s'; convert to a "
                         "floating dtype)",
                         op, ct_dtype_name(dt), ct_device_str(ts[0]->storage->device, dev, sizeof dev),
                         dt == CT_I32 ? "Int" : "Long");
    }
    if (!ct_dtype_is_floating(dt))
        return cti_error(CT_ERR_DTYPE,
                         "%s: integer and bool dtypes are not supported, got %s (convert to a "
                         "floating dtype)",
                         op, ct_dtype_name(dt));
    return CT_OK;
}

static ct_status check_operands(const char *op, int nreq, int n, ct_tensor *const *ts,
                                const char *names) {
    return check_operands_int(op, nreq, n, ts, names, false);
}

static ct_tensor *view_of(ct_tensor *t, int nd, const int64_t *shape, const int64_t *stride) {
    return cti_tensor_view(t, nd, shape, stride, t->offset);
}

/* A contiguous [nd]-d view of out's storage (out was allocated contiguous with
 * the same elements in the same order). */
static ct_tensor *out_view(ct_tensor *out, int nd, const int64_t *shape) {
    int64_t stride[CT_MAX_DIMS];
    cti_contiguous_strides(nd, shape, stride);
    return view_of(out, nd, shape, stride);
}

/* t as [bshape..., rows, cols]: t's batch dims right-aligned to bshape, the
 * missing and broadcast ones with stride 0; a 1-d t becomes one row
 * (vec_is_row) or one column. */
static ct_tensor *batched_view(ct_tensor *t, int nb, const int64_t *bshape, bool vec_is_row) {
    int64_t shape[CT_MAX_DIMS], stride[CT_MAX_DIMS];
    int tb = t->ndim >= 2 ? t->ndim - 2 : 0;
    for (int i = 0; i < nb; i++) {
        int ti = i - (nb - tb);
        shape[i] = bshape[i];
        stride[i] = (ti >= 0 && t->shape[ti] == bshape[i]) ? t->stride[ti] : 0;
    }
    if (t->ndim == 1) {
        int v = vec_is_row ? nb + 1 : nb, one = vec_is_row ? nb : nb + 1;
        shape[v] = t->shape[0];
        stride[v] = t->stride[0];
        shape[one] = 1;
        stride[one] = 0;
    } else {
        for (int i = 0; i < 2; i++) {
            shape[nb + i] = t->shape[t->ndim - 2 + i];
            stride[nb + i] = t->stride[t->ndim - 2 + i];
        }
    }
    return view_of(t, nb + 2, shape, stride);
}

/* ---- dispatch ------------------------------------------------------------------------ */

/* The params of mm and bmm, which have no input to scale. */
static const cti_gemm_params plain_product = {.beta = 0, .alpha = 1};

/* Dispatches op with params p on views made for it (input only for addmm),
 * releases the views, and returns result, or NULL after releasing it on
 * failure. A NULL view means its creation failed and set the error. */
static ct_tensor *finish(ct_op op, ct_tensor *result, ct_tensor *input, ct_tensor *a,
                         ct_tensor *b, ct_tensor *out, const cti_gemm_params *p) {
    ct_status s = CT_ERR_OOM;
    if (a && b && out && (op != CT_OP_ADDMM || input)) {
        ct_call c;
        cti_call_init(&c, op);
        cti_call_params(&c, p);
        int ni = 0;
        if (op == CT_OP_ADDMM) c.in[ni++] = input;
        c.in[ni++] = a;
        c.in[ni++] = b;
        c.nin = ni;
        c.out[0] = out;
        c.nout = 1;
        s = cti_run(&c, result->storage->device, result->dtype);
    }
    ct_tensor_release(input);
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(out);
    if (s != CT_OK) {
        ct_tensor_release(result);
        return NULL;
    }
    return result;
}

/* ---- autograd ---------------------------------------------------------------------------- */

/* t when other requires grad, else NULL: each operand of a product is read
 * only by the gradient of the other, so it is saved only when that one
 * needs it. */
static ct_tensor *saved_for(ct_tensor *t, ct_tensor *other) {
    return ct_requires_grad(other) ? t : NULL;
}

/* Records result = op(ins) when an input requires grad, saving s0 and s1
 * (either may be NULL) and, for addmm, its params p (NULL: none; the other
 * formulas read none). Returns result, or NULL after releasing it when
 * recording fails (result NULL stays NULL). */
static ct_tensor *record(ct_tensor *result, const char *name, cti_backward_fn bw, int nin,
                         ct_tensor *const *ins, ct_tensor *s0, ct_tensor *s1,
                         const cti_gemm_params *p) {
    if (!result || !cti_ag_needed(nin, ins)) return result;
    cti_ag_rec r = {.name = name, .backward = bw, .nin = nin, .nout = 1, .out = {result},
                    .nsaved = 2, .saved = {s0, s1}};
    for (int k = 0; k < nin; k++) r.in[k] = ins[k];
    if (p) {
        r.params = p;
        r.params_size = sizeof *p;
    }
    if (cti_ag_record(&r) != CT_OK) {
        ct_tensor_release(result);
        return NULL;
    }
    return result;
}

/* ---- public functions ------------------------------------------------------------------ */

ct_tensor *ct_mm(ct_tensor *a, ct_tensor *b) {
    static const char op[] = "ct_mm";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_MM, 2, (ct_tensor *[]){a, b}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_mm(ac.in[0], ac.in[1]) : NULL);
    ct_tensor *ts[2] = {a, b};
    if (check_operands_int(op, 2, 2, ts, NULL, true) != CT_OK) return NULL;
    if (a->ndim != 2 || b->ndim != 2)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected 2-d tensors, got %s and %s", op,
                              cti_desc(a), cti_desc(b));
    if (a->shape[1] != b->shape[0])
        return cti_error_null(CT_ERR_SHAPE, "%s: shapes %s and %s do not align (%lld != %lld)",
                              op, cti_shape_s(2, a->shape), cti_shape_s(2, b->shape),
                              (long long)a->shape[1], (long long)b->shape[0]);
    int64_t shape[2] = {a->shape[0], b->shape[1]};
    ct_tensor *result = cti_tensor_new(op, 2, shape, a->dtype, a->storage->device);
    if (!result) return NULL;
    result = finish(CT_OP_MM, result, NULL, batched_view(a, 0, NULL, true),
                    batched_view(b, 0, NULL, false), out_view(result, 2, shape),
                    &plain_product);
    return record(result, "MmBackward", cti_bw_mm, 2, ts, saved_for(a, b), saved_for(b, a),
                  NULL);
}

ct_tensor *ct_bmm(ct_tensor *a, ct_tensor *b) {
    static const char op[] = "ct_bmm";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_BMM, 2, (ct_tensor *[]){a, b}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_bmm(ac.in[0], ac.in[1]) : NULL);
    ct_tensor *ts[2] = {a, b};
    if (check_operands_int(op, 2, 2, ts, NULL, true) != CT_OK) return NULL;
    if (a->ndim != 3 || b->ndim != 3)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected 3-d tensors, got %s and %s", op,
                              cti_desc(a), cti_desc(b));
    if (a->shape[0] != b->shape[0])
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: batch sizes of %s and %s differ (%lld != %lld)", op,
                              cti_shape_s(3, a->shape), cti_shape_s(3, b->shape),
                              (long long)a->shape[0], (long long)b->shape[0]);
    if (a->shape[2] != b->shape[1])
        return cti_error_null(CT_ERR_SHAPE, "%s: shapes %s and %s do not align (%lld != %lld)",
                              op, cti_shape_s(3, a->shape), cti_shape_s(3, b->shape),
                              (long long)a->shape[2], (long long)b->shape[1]);
    int64_t shape[3] = {a->shape[0], a->shape[1], b->shape[2]};
    ct_tensor *result = cti_tensor_new(op, 3, shape, a->dtype, a->storage->device);
    if (!result) return NULL;
    result = finish(CT_OP_BMM, result, NULL, batched_view(a, 1, shape, true),
                    batched_view(b, 1, shape, false), out_view(result, 3, shape),
                    &plain_product);
    return record(result, "BmmBackward", cti_bw_bmm, 2, ts, saved_for(a, b), saved_for(b, a),
                  NULL);
}

/* Product of the batch dims of t (all but the last two; none for <= 2-d). */
static int64_t batch_numel(const ct_tensor *t) {
    return t->ndim > 2 ? cti_numel(t->ndim - 2, t->shape) : 1;
}

ct_tensor *ct_matmul(ct_tensor *a, ct_tensor *b) {
    static const char op[] = "ct_matmul";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_MATMUL, 2, (ct_tensor *[]){a, b}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_matmul(ac.in[0], ac.in[1]) : NULL);
    ct_tensor *ts[2] = {a, b};
    if (check_operands_int(op, 2, 2, ts, NULL, true) != CT_OK) return NULL;
    if (a->ndim == 0 || b->ndim == 0)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: both arguments need at least 1 dim, got %s and %s", op,
                              cti_desc(a), cti_desc(b));
    int64_t k = a->shape[a->ndim - 1];
    int64_t kb = b->shape[b->ndim >= 2 ? b->ndim - 2 : 0];
    if (k != kb)
        return cti_error_null(CT_ERR_SHAPE, "%s: shapes %s and %s do not align (%lld != %lld)",
                              op, cti_shape_s(a->ndim, a->shape), cti_shape_s(b->ndim, b->shape),
                              (long long)k, (long long)kb);

    /* Batch dims broadcast; a vector operand's added dim is dropped from the result. */
    int na = a->ndim >= 2 ? a->ndim - 2 : 0, nbb = b->ndim >= 2 ? b->ndim - 2 : 0;
    int nb = na > nbb ? na : nbb;
    int64_t shape[CT_MAX_DIMS];
    for (int i = 0; i < nb; i++) {
        int ia = i - (nb - na), ib = i - (nb - nbb);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return cti_error_null(CT_ERR_SHAPE,
                                  "%s: batch dims of %s and %s do not broadcast (%lld vs %lld "
                                  "at batch dim %d)",
                                  op, cti_shape_s(a->ndim, a->shape),
                                  cti_shape_s(b->ndim, b->shape), (long long)sa, (long long)sb,
                                  i);
        shape[i] = sa == 1 ? sb : sa;
    }
    int64_t n = a->ndim >= 2 ? a->shape[a->ndim - 2] : 1;
    int64_t m = b->ndim >= 2 ? b->shape[b->ndim - 1] : 1;
    int nd = nb;
    if (a->ndim >= 2) shape[nd++] = n;
    if (b->ndim >= 2) shape[nd++] = m;
    ct_tensor *result = cti_tensor_new(op, nd, shape, a->dtype, a->storage->device);
    if (!result) return NULL;

    /* b shared by every batch: one GEMM over a's batches merged into rows,
     * when a's strides allow the merge. */
    int64_t fstride[2];
    int64_t rows = batch_numel(a) * n;
    if (na > 0 && batch_numel(b) == 1 &&
        cti_view_strides(a, 2, (const int64_t[]){rows, k}, fstride)) {
        int64_t mshape[2] = {rows, m};
        result = finish(CT_OP_MM, result, NULL,
                        view_of(a, 2, (const int64_t[]){rows, k}, fstride),
                        batched_view(b, 0, NULL, false), out_view(result, 2, mshape),
                        &plain_product);
    } else {
        int64_t oshape[CT_MAX_DIMS];
        memcpy(oshape, shape, (size_t)nb * sizeof *shape);
        oshape[nb] = n;
        oshape[nb + 1] = m;
        result = finish(nb > 0 ? CT_OP_BMM : CT_OP_MM, result, NULL,
                        batched_view(a, nb, shape, true), batched_view(b, nb, shape, false),
                        out_view(result, nb + 2, oshape), &plain_product);
    }
    return record(result, "MatmulBackward", cti_bw_matmul, 2, ts, saved_for(a, b),
                  saved_for(b, a), NULL);
}

/* input as [n, m]: broadcast dims with stride 0. False when it does not broadcast. */
static bool broadcast_2d(const ct_tensor *t, int64_t n, int64_t m, int64_t stride[2]) {
    if (t->ndim > 2) return false;
    int64_t want[2] = {n, m};
    for (int i = 0; i < 2; i++) {
        int ti = i - (2 - t->ndim);
        int64_t size = ti >= 0 ? t->shape[ti] : 1;
        if (size != want[i] && size != 1) return false;
        stride[i] = (ti >= 0 && size == want[i]) ? t->stride[ti] : 0;
    }
    return true;
}

ct_tensor *ct_addmm(ct_tensor *input, ct_tensor *m1, ct_tensor *m2, double beta, double alpha) {
    static const char op[] = "ct_addmm";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_ADDMM, 3, (ct_tensor *[]){input, m1, m2}))
        return cti_autocast_end_op(
            &ac, ac.ok ? ct_addmm(ac.in[0], ac.in[1], ac.in[2], beta, alpha) : NULL);
    ct_tensor *ts[3] = {input, m1, m2};
    if (check_operands(op, 3, 3, ts, "input, mat1 and mat2") != CT_OK) return NULL;
    if (m1->ndim != 2 || m2->ndim != 2)
        return cti_error_null(CT_ERR_SHAPE, "%s: expected 2-d mat1 and mat2, got %s and %s", op,
                              cti_desc(m1), cti_desc(m2));
    if (m1->shape[1] != m2->shape[0])
        return cti_error_null(CT_ERR_SHAPE, "%s: shapes %s and %s do not align (%lld != %lld)",
                              op, cti_shape_s(2, m1->shape), cti_shape_s(2, m2->shape),
                              (long long)m1->shape[1], (long long)m2->shape[0]);
    int64_t shape[2] = {m1->shape[0], m2->shape[1]}, istride[2];
    if (!broadcast_2d(input, shape[0], shape[1], istride))
        return cti_error_null(CT_ERR_SHAPE, "%s: input %s does not broadcast to the product's %s",
                              op, cti_shape_s(input->ndim, input->shape), cti_shape_s(2, shape));
    ct_tensor *result = cti_tensor_new(op, 2, shape, m1->dtype, m1->storage->device);
    if (!result) return NULL;
    cti_gemm_params p = {.beta = beta, .alpha = alpha};
    result = finish(CT_OP_ADDMM, result, view_of(input, 2, shape, istride),
                    batched_view(m1, 0, NULL, true), batched_view(m2, 0, NULL, false),
                    out_view(result, 2, shape), &p);
    return record(result, "AddmmBackward", cti_bw_addmm, 3, ts, saved_for(m1, m2),
                  saved_for(m2, m1), &p);
}

/* t [..., cols] as a [rows, cols] view, of a contiguous copy when t's
 * strides do not merge its leading dims. */
static ct_tensor *rows_view(ct_tensor *t, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols}, stride[2];
    if (cti_view_strides(t, 2, shape, stride)) return view_of(t, 2, shape, stride);
    ct_tensor *c = ct_contiguous(t);
    ct_tensor *v = c ? out_view(c, 2, shape) : NULL;
    ct_tensor_release(c); /* the view holds the storage */
    return v;
}

/* result [..., out] (new, contiguous) <- x2 [rows, in] @ w^T + bias, w^T a
 * view BLAS reads through its transpose flag and the bias a row broadcast
 * down the rows. Consumes x2 (NULL: its creation failed, with the error);
 * returns result, or NULL after releasing it. */
static ct_tensor *linear_rows(ct_tensor *result, ct_tensor *x2, ct_tensor *w, ct_tensor *bias) {
    int64_t in = w->shape[1], out = w->shape[0];
    int64_t oshape[2] = {cti_numel(result->ndim - 1, result->shape), out};
    ct_tensor *wt = view_of(w, 2, (const int64_t[]){in, out},
                            (const int64_t[]){w->stride[1], w->stride[0]});
    if (!bias)
        return finish(CT_OP_MM, result, NULL, x2, wt, out_view(result, 2, oshape), &plain_product);
    static const cti_gemm_params plus_bias = {.beta = 1, .alpha = 1};
    return finish(CT_OP_ADDMM, result,
                  view_of(bias, 2, oshape, (const int64_t[]){0, bias->stride[0]}), x2, wt,
                  out_view(result, 2, oshape), &plus_bias);
}

ct_tensor *ct_linear(ct_tensor *x, ct_tensor *w, ct_tensor *bias) {
    static const char op[] = "ct_linear";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_LINEAR, 3, (ct_tensor *[]){x, w, bias}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_linear(ac.in[0], ac.in[1], ac.in[2]) : NULL);
    ct_tensor *ts[3] = {x, w, bias};
    if (check_operands(op, 2, bias ? 3 : 2, ts,
                       bias ? "input, weight and bias" : "input and weight") != CT_OK)
        return NULL;
    if (x->ndim == 0 || w->ndim != 2)
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: expected an input of at least 1 dim and a 2-d weight, got %s "
                              "and %s",
                              op, cti_desc(x), cti_desc(w));
    int64_t in = x->shape[x->ndim - 1], out = w->shape[0];
    if (in != w->shape[1])
        return cti_error_null(CT_ERR_SHAPE,
                              "%s: input %s and weight %s do not align (%lld != %lld in-features)",
                              op, cti_shape_s(x->ndim, x->shape), cti_shape_s(2, w->shape),
                              (long long)in, (long long)w->shape[1]);
    if (bias && (bias->ndim != 1 || bias->shape[0] != out))
        return cti_error_null(CT_ERR_SHAPE, "%s: bias must be [%lld] for weight %s, got %s", op,
                              (long long)out, cti_shape_s(2, w->shape),
                              cti_shape_s(bias->ndim, bias->shape));

    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, (size_t)(x->ndim - 1) * sizeof *shape);
    shape[x->ndim - 1] = out;
    ct_tensor *result = cti_tensor_new(op, x->ndim, shape, x->dtype, x->storage->device);
    if (!result) return NULL;

    /* x's leading dims become rows: a view when its strides allow, else a
     * contiguous copy */
    ct_tensor *r = linear_rows(result, rows_view(x, cti_numel(x->ndim - 1, x->shape), in), w, bias);
    return record(r, "LinearBackward", cti_bw_linear, 3, ts, saved_for(x, w), saved_for(w, x),
                  NULL);
}

static ct_status check_linear_grads(const char *op, ct_tensor *grad_y, ct_tensor *x,
                                    bool want_w) {
    ct_tensor *ts[2] = {grad_y, x};
    int n = want_w ? 2 : 1;
    ct_status st = check_operands(op, n, n, ts, "grad_y and input");
    if (st != CT_OK) return st;
    if (grad_y->ndim == 0)
        return cti_error(CT_ERR_SHAPE, "%s: expected grad_y of at least 1 dim, got %s", op,
                         cti_desc(grad_y));
    if (want_w && (x->ndim != grad_y->ndim ||
                   memcmp(x->shape, grad_y->shape, (size_t)(x->ndim - 1) * sizeof(int64_t))))
        return cti_error(CT_ERR_SHAPE,
                         "%s: expected grad_y %s and input %s to have the same leading dims", op,
                         cti_shape_s(grad_y->ndim, grad_y->shape), cti_shape_s(x->ndim, x->shape));
    return CT_OK;
}

ct_status ct_linear_backward_weight(ct_tensor *grad_y, ct_tensor *x, ct_tensor **dweight,
                                    ct_tensor **dbias) {
    ct_dtype dt = grad_y ? grad_y->dtype : CT_F32;
    return cti_linear_backward_weight_as(grad_y, x, dt, dt, dweight, dbias);
}

ct_status cti_linear_backward_weight_as(ct_tensor *grad_y, ct_tensor *x, ct_dtype dweight_dtype,
                                        ct_dtype dbias_dtype, ct_tensor **dweight,
                                        ct_tensor **dbias) {
    static const char op[] = "ct_linear_backward_weight";
    if (dweight) *dweight = NULL;
    if (dbias) *dbias = NULL;
    if (!dweight && !dbias)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: no gradient asked for (dweight and dbias are NULL)", op);
    ct_status st = check_linear_grads(op, grad_y, x, dweight != NULL);
    if (st != CT_OK) return st;
    int nd = grad_y->ndim;
    int64_t out = grad_y->shape[nd - 1], rows = cti_numel(nd - 1, grad_y->shape);
    int64_t in = dweight ? x->shape[nd - 1] : 0;
    ct_device dev = grad_y->storage->device;
    ct_tensor *g2 = rows_view(grad_y, rows, out);
    ct_tensor *gt = g2 ? view_of(g2, 2, (const int64_t[]){out, rows},
                                 (const int64_t[]){g2->stride[1], g2->stride[0]})
                       : NULL;
    ct_tensor *x2 = dweight ? rows_view(x, rows, in) : NULL;
    ct_tensor *dw = dweight ? cti_tensor_new(op, 2, (const int64_t[]){out, in}, dweight_dtype, dev)
                            : NULL;
    ct_tensor *db = dbias ? cti_tensor_new(op, 1, &out, dbias_dtype, dev) : NULL;
    if (!gt || (dweight && (!x2 || !dw)) || (dbias && !db)) {
        st = ct_last_status();
    } else {
        ct_call c;
        cti_call_init(&c, CT_OP_LINEAR_BACKWARD_WEIGHT);
        c.in[0] = gt;
        c.in[1] = x2;
        c.nin = 2;
        c.out[0] = dw;
        c.out[1] = db;
        c.nout = 2;
        st = cti_run_as(&c, dev, grad_y->dtype, 2, (ct_tensor *[]){grad_y, x2 ? x : NULL});
    }
    ct_tensor_release(g2);
    ct_tensor_release(gt);
    ct_tensor_release(x2);
    if (st != CT_OK) {
        ct_tensor_release(dw);
        ct_tensor_release(db);
        return st;
    }
    if (dweight) *dweight = dw;
    if (dbias) *dbias = db;
    return CT_OK;
}

/* ---- the GELU MLP ------------------------------------------------------------------------ */

/* What ct_mlp_gelu's shapes must satisfy: x [..., in], w_in [hidden, in],
 * b_in [hidden], w_out [out, hidden], b_out [out]. */
static ct_status check_mlp_shapes(const char *op, ct_tensor *x, ct_tensor *w_in, ct_tensor *b_in,
                                  ct_tensor *w_out, ct_tensor *b_out) {
    if (x->ndim == 0 || w_in->ndim != 2 || w_out->ndim != 2)
        return cti_error(CT_ERR_SHAPE,
                         "%s: expected an input of at least 1 dim and 2-d weights, got %s, %s "
                         "and %s",
                         op, cti_desc(x), cti_desc(w_in), cti_desc(w_out));
    int64_t in = x->shape[x->ndim - 1], hidden = w_in->shape[0], out = w_out->shape[0];
    if (w_in->shape[1] != in)
        return cti_error(CT_ERR_SHAPE,
                         "%s: input %s and w_in %s do not align (%lld != %lld in-features)", op,
                         cti_shape_s(x->ndim, x->shape), cti_shape_s(2, w_in->shape),
                         (long long)in, (long long)w_in->shape[1]);
    if (w_out->shape[1] != hidden)
        return cti_error(CT_ERR_SHAPE,
                         "%s: w_in %s and w_out %s do not align (w_out must be [out, %lld])", op,
                         cti_shape_s(2, w_in->shape), cti_shape_s(2, w_out->shape),
                         (long long)hidden);
    if (b_in && (b_in->ndim != 1 || b_in->shape[0] != hidden))
        return cti_error(CT_ERR_SHAPE, "%s: b_in must be [%lld] for w_in %s, got %s", op,
                         (long long)hidden, cti_shape_s(2, w_in->shape),
                         cti_shape_s(b_in->ndim, b_in->shape));
    if (b_out && (b_out->ndim != 1 || b_out->shape[0] != out))
        return cti_error(CT_ERR_SHAPE, "%s: b_out must be [%lld] for w_out %s, got %s", op,
                         (long long)out, cti_shape_s(2, w_out->shape),
                         cti_shape_s(b_out->ndim, b_out->shape));
    return CT_OK;
}

/* act = gelu(pre), pre = x2 @ w_in^T + b_in, both new [rows, hidden]. With
 * recompute, act is GELU's kernel on the stored pre (the composite kernel,
 * whatever the device), the bits the backward's recomputation gives; a fused
 * epilogue would make act from the unrounded sum. */
static ct_status hidden_forward(const char *op, ct_tensor *x2, ct_tensor *w_in, ct_tensor *b_in,
                                ct_gelu_approx approximate, bool recompute, ct_tensor **act,
                                ct_tensor **pre) {
    int64_t rows = x2->shape[0], in = x2->shape[1], hidden = w_in->shape[0];
    const int64_t hshape[2] = {rows, hidden};
    ct_device dev = x2->storage->device;
    *act = cti_tensor_new(op, 2, hshape, x2->dtype, dev);
    *pre = *act ? cti_tensor_new(op, 2, hshape, x2->dtype, dev) : NULL;
    ct_tensor *wt = view_of(w_in, 2, (const int64_t[]){in, hidden},
                            (const int64_t[]){w_in->stride[1], w_in->stride[0]});
    ct_tensor *bv = b_in ? view_of(b_in, 2, hshape, (const int64_t[]){0, b_in->stride[0]}) : NULL;
    ct_status st;
    if (!*pre || !wt || (b_in && !bv)) {
        st = ct_last_status();
    } else {
        const cti_pointwise_params p = {.approximate = approximate};
        ct_call c;
        cti_call_init(&c, CT_OP_LINEAR_GELU);
        cti_call_params(&c, &p);
        c.in[0] = bv;
        c.in[1] = x2;
        c.in[2] = wt;
        c.nin = 3;
        c.out[0] = *act;
        c.out[1] = *pre;
        c.nout = 2;
        /* the MLP's node, recorded on its result, is these outputs' only history */
        st = recompute ? cti_compose_linear_gelu(&c) : cti_run_as(&c, dev, x2->dtype, 0, NULL);
    }
    ct_tensor_release(wt);
    ct_tensor_release(bv);
    if (st != CT_OK) {
        ct_tensor_release(*act);
        ct_tensor_release(*pre);
        *act = *pre = NULL;
    }
    return st;
}

/* y = act @ w_out^T + b_out in x's leading shape: new, or NULL. */
static ct_tensor *output_forward(const char *op, ct_tensor *x, ct_tensor *act, ct_tensor *w_out,
                                 ct_tensor *b_out) {
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->shape, (size_t)(x->ndim - 1) * sizeof *shape);
    shape[x->ndim - 1] = w_out->shape[0];
    ct_tensor *y = cti_tensor_new(op, x->ndim, shape, act->dtype, act->storage->device);
    return y ? linear_rows(y, ct_tensor_retain(act), w_out, b_out) : NULL;
}

ct_tensor *ct_mlp_gelu(ct_tensor *x, ct_tensor *w_in, ct_tensor *b_in, ct_tensor *w_out,
                       ct_tensor *b_out, ct_gelu_approx approximate) {
    static const char op[] = "ct_mlp_gelu";
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_MLP_GELU, 5,
                              (ct_tensor *[]){x, w_in, b_in, w_out, b_out}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_mlp_gelu(ac.in[0], ac.in[1], ac.in[2], ac.in[3],
                                                            ac.in[4], approximate)
                                              : NULL);
    ct_tensor *ts[5] = {x, w_in, w_out, b_in, b_out};
    if (check_operands(op, 3, 5, ts, "input, weights and biases") != CT_OK ||
        cti_check_gelu_approx(op, approximate) != CT_OK ||
        check_mlp_shapes(op, x, w_in, b_in, w_out, b_out) != CT_OK)
        return NULL;
    int64_t in = x->shape[x->ndim - 1], rows = cti_numel(x->ndim - 1, x->shape);
    ct_tensor *in_ts[5] = {x, w_in, b_in, w_out, b_out};
    bool grad = cti_ag_needed(5, in_ts);
    /* With recomputation on, the activation is made again from pre in the
     * backward rather than kept (pre is kept either way). */
    bool keep_act = grad && ct_requires_grad(w_out) && !ct_is_recompute_enabled();
    bool remade = grad && ct_requires_grad(w_out) && !keep_act;
    ct_tensor *x2 = rows_view(x, rows, in), *act = NULL, *pre = NULL;
    if (!x2 || hidden_forward(op, x2, w_in, b_in, approximate, remade, &act, &pre) != CT_OK) {
        ct_tensor_release(x2);
        return NULL;
    }
    ct_tensor *y = output_forward(op, x, act, w_out, b_out);
    if (y && grad) {
        bool hidden_grads = ct_requires_grad(x) || ct_requires_grad(w_in) ||
                            (b_in && ct_requires_grad(b_in));
        const cti_pointwise_params p = {.approximate = approximate};
        cti_ag_rec r = {.name = "MlpGeluBackward",
                        .backward = cti_bw_mlp_gelu,
                        .nin = 5,
                        .in = {x, w_in, b_in, w_out, b_out},
                        .nout = 1,
                        .out = {y},
                        .nsaved = 5,
                        .saved = {ct_requires_grad(w_in) ? x2 : NULL,
                                  ct_requires_grad(x) ? w_in : NULL,
                                  hidden_grads || remade ? pre : NULL,
                                  keep_act ? act : NULL, hidden_grads ? w_out : NULL},
                        CTI_AG_PARAMS(&p)};
        if (cti_ag_record(&r) != CT_OK) {
            ct_tensor_release(y);
            y = NULL;
        }
    }
    ct_tensor_release(x2);
    ct_tensor_release(act);
    ct_tensor_release(pre);
    return y;
}

ct_status ct_mlp_gelu_backward_hidden(ct_tensor *grad_y, ct_tensor *w_out, ct_tensor *pre,
                                      ct_gelu_approx approximate, ct_tensor **dpre,
                                      ct_tensor **db_in) {
    ct_dtype dt = pre ? pre->dtype : CT_F32;
    return cti_mlp_gelu_backward_hidden_as(grad_y, w_out, pre, approximate, dt, dpre, db_in);
}

ct_status cti_mlp_gelu_backward_hidden_as(ct_tensor *grad_y, ct_tensor *w_out, ct_tensor *pre,
                                          ct_gelu_approx approximate, ct_dtype db_dtype,
                                          ct_tensor **dpre, ct_tensor **db_in) {
    static const char op[] = "ct_mlp_gelu_backward_hidden";
    if (dpre) *dpre = NULL;
    if (db_in) *db_in = NULL;
    if (!dpre)
        return cti_error(CT_ERR_INVALID_ARG, "%s: dpre is NULL (the gradient is its result)", op);
    ct_tensor *ts[3] = {grad_y, w_out, pre};
    ct_status st = check_operands(op, 3, 3, ts, "grad_y, w_out and pre");
    if (st == CT_OK) st = cti_check_gelu_approx(op, approximate);
    if (st != CT_OK) return st;
    if (grad_y->ndim == 0 || w_out->ndim != 2 || pre->ndim != grad_y->ndim)
        return cti_error(CT_ERR_SHAPE,
                         "%s: expected grad_y [..., out], w_out [out, hidden] and pre [..., "
                         "hidden], got %s, %s and %s",
                         op, cti_desc(grad_y), cti_desc(w_out), cti_desc(pre));
    int nd = grad_y->ndim;
    int64_t out = w_out->shape[0], hidden = w_out->shape[1];
    if (grad_y->shape[nd - 1] != out || pre->shape[nd - 1] != hidden ||
        memcmp(grad_y->shape, pre->shape, (size_t)(nd - 1) * sizeof(int64_t)))
        return cti_error(CT_ERR_SHAPE,
                         "%s: expected grad_y [..., %lld] and pre [..., %lld] with the same "
                         "leading dims for w_out %s, got %s and %s",
                         op, (long long)out, (long long)hidden, cti_shape_s(2, w_out->shape),
                         cti_shape_s(nd, grad_y->shape), cti_shape_s(nd, pre->shape));
    int64_t rows = cti_numel(nd - 1, grad_y->shape);
    ct_device dev = grad_y->storage->device;
    ct_tensor *g2 = rows_view(grad_y, rows, out);
    ct_tensor *p2 = rows_view(pre, rows, hidden);
    ct_tensor *d2 = cti_tensor_new(op, 2, (const int64_t[]){rows, hidden}, pre->dtype, dev);
    ct_tensor *db = db_in ? cti_tensor_new(op, 1, &hidden, db_dtype, dev) : NULL;
    if (!g2 || !p2 || !d2 || (db_in && !db)) {
        st = ct_last_status();
    } else {
        const cti_pointwise_params p = {.approximate = approximate};
        ct_call c;
        cti_call_init(&c, CT_OP_LINEAR_DGELU);
        cti_call_params(&c, &p);
        c.in[0] = g2;
        c.in[1] = w_out;
        c.in[2] = p2;
        c.nin = 3;
        c.out[0] = d2;
        c.out[1] = db;
        c.nout = 2;
        st = cti_run_as(&c, dev, pre->dtype, 3, ts);
    }
    ct_tensor_release(g2);
    ct_tensor_release(p2);
    /* pre's shape: a view of the rows, through which the node that refuses
     * a double backward is still reached. d2 itself when it has that shape:
     * a retain and release of it would take it out of the caller's scope. */
    ct_tensor *d = st != CT_OK || nd == 2 ? d2 : ct_reshape(d2, nd, pre->shape);
    if (d != d2) ct_tensor_release(d2);
    if (st != CT_OK || !d) {
        st = st != CT_OK ? st : ct_last_status();
        ct_tensor_release(d);
        ct_tensor_release(db);
        return st;
    }
    *dpre = d;
    if (db_in) *db_in = db;
    return CT_OK;
}
