/* CPU kernel of CROSS_ENTROPY_FUSED (cti_ce_fused_params, schema.h), the row
 * step of ct_linear_cross_entropy (src/ops/linear_ce.c): per row z of the
 * logits [rows, C] with target t, lse = log(sum(exp(z))),
 *   loss = lse - (1 - ls) z_t - ls / C * sum(z)
 *   grad = scale * s_row * (softmax(z) - (1 - ls) [j == t] - ls / C)
 * written over z in place (with params.grad), where s_row is in[2][row] or 1.
 * A row whose target is ignore_index has loss 0 and gradient 0. The loss
 * (out[0], [rows]) is f32 for f32/f16/bf16 and f64 for f64; the row math runs
 * in the same types (halves are widened a row at a time), as loss.c's.
 * Every target is checked against [0, C) before any row is touched. */
#ifndef NN_T
#if defined(__GNUC__) && !defined(__clang__) /* clang vectorizes them at -O2 and knows no such pragma */
#pragma GCC optimize("O3")
#endif

#include "nn_impl.h"

typedef struct lce_ctx {
    ct_tensor *logits, *target, *rscale, *loss;
    int64_t rows, c, ignore;
    double ls, scale;
    bool grad;
    atomic_bool oom;
} lce_ctx;

/* in[2]'s element r as a double (1 without in[2]). */
static double row_scale(const lce_ctx *k, int64_t r) {
    if (!k->rscale) return 1.0;
    const void *p = cti_data(k->rscale);
    switch (k->rscale->dtype) {
    case CT_F64: return ((const double *)p)[r];
    case CT_F32: return ((const float *)p)[r];
    case CT_F16: return cti_f16_to_f32(((const uint16_t *)p)[r]);
    default: return cti_bf16_to_f32(((const uint16_t *)p)[r]);
    }
}

#define NN_TYPED "linear_ce.c"
#include "nn_types.h"

static void lce_task(int64_t r0, int64_t r1, void *p) {
    lce_ctx *k = p;
    bool dbl = k->logits->dtype == CT_F64;
    size_t es = dbl ? sizeof(double) : sizeof(float);
    void *buf = scratch(es * (size_t)(2 * k->c));
    if (!buf) {
        atomic_store(&k->oom, true);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        if (dbl) lce_row_d(k, r, (double *)buf, (double *)buf + k->c);
        else lce_row_f(k, r, (float *)buf, (float *)buf + k->c);
    }
    free(buf);
}

static ct_status k_ce_fused(ct_call *c) {
    static const char op[] = "ct_linear_cross_entropy";
    const cti_ce_fused_params *p = CTI_PARAMS(c, cti_ce_fused_params);
    lce_ctx k = {.logits = c->in[0], .target = c->in[1], .rscale = c->in[2], .loss = c->out[0],
                 .rows = p->rows, .c = p->c, .ignore = p->ignore_index,
                 .ls = p->label_smoothing, .scale = p->scale, .grad = p->grad};
    const int64_t *t = (const int64_t *)cti_data(k.target);
    for (int64_t r = 0; r < k.rows; r++)
        if (t[r] != k.ignore && (t[r] < 0 || t[r] >= k.c))
            return cti_error(CT_ERR_INDEX,
                             "%s: target %lld is out of bounds for %lld classes (expected 0..%lld "
                             "or ignore_index %lld)",
                             op, (long long)t[r], (long long)k.c, (long long)(k.c - 1),
                             (long long)k.ignore);
    atomic_init(&k.oom, false);
    if (k.rows > 0) cti_parallel_for(k.rows, row_grain(k.c), lce_task, &k);
    if (atomic_load(&k.oom)) return cti_error(CT_ERR_OOM, "%s: out of memory for row scratch", op);
    return CT_OK;
}

void cti_cpu_register_linear_ce(void) {
    static const nn_kernel ks[] = {
        {CT_OP_CROSS_ENTROPY_FUSED, k_ce_fused, "cpu_cross_entropy_fused"},
    };
    nn_register_floating(ks, sizeof ks / sizeof ks[0]);
}

#else /* NN_T: one row, once per row type */

/* Row r: zb receives the widened row (halves), eb exp(z - max) and then the
 * gradient. */
static void NN_F(lce_row)(const lce_ctx *k, int64_t r, NN_T *zb, NN_T *eb) {
    const int64_t C = k->c;
    const ct_dtype dt = k->logits->dtype;
    char *row = (char *)cti_data(k->logits) + (size_t)(r * C) * ct_dtype_size(dt);
    NN_T *loss = (NN_T *)cti_data(k->loss) + r;
    const int64_t t = ((const int64_t *)cti_data(k->target))[r];
    if (t == k->ignore) {
        *loss = 0;
        if (k->grad) memset(row, 0, (size_t)C * ct_dtype_size(dt));
        return;
    }
    const NN_T *z = (const NN_T *)row;
#if NN_IS_FLOAT
    if (dt != CT_F32) {
        load_f32(row, dt, C, 1, zb);
        z = zb;
    }
#else
    (void)zb;
#endif
    const NN_T m = NN_F(max)(z, C);
    for (int64_t j = 0; j < C; j++) eb[j] = NN_EXP(z[j] - m);
    const NN_T s = NN_F(sum)(eb, C);
    const NN_T lse = m + NN_LOG(s);
    const NN_T ls = (NN_T)k->ls, off = (NN_T)(k->ls / (double)C);
    NN_T l = lse - (1 - ls) * z[t];
    if (k->ls > 0) l -= off * NN_F(sum)(z, C);
    *loss = l;
    if (!k->grad) return;
    const NN_T sc = (NN_T)(k->scale * row_scale(k, r)), inv = 1 / s;
    for (int64_t j = 0; j < C; j++) eb[j] = sc * (eb[j] * inv - off);
    eb[t] -= sc * (1 - ls);
#if NN_IS_FLOAT
    if (dt != CT_F32) {
        store_f32(eb, dt, C, 1, row);
        return;
    }
#endif
    memcpy(row, eb, (size_t)C * sizeof(NN_T));
}

#endif
