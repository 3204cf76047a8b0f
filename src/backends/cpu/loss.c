/* CPU kernels of CROSS_ENTROPY, NLL_LOSS, MSE_LOSS and their backward ops
 * (cti_loss_params), every tensor contiguous.
 *
 *   cross_entropy of logits z [n, C, inner] against class indices t
 *   [n * inner], class weights w (1 when absent), label smoothing ls; per
 *   position, with lse = log(sum_c exp(z_c)) and p = softmax(z):
 *     loss = (1 - ls) * w_t * (lse - z_t) + ls / C * sum_c w_c * (lse - z_c)
 *     backward: dz_c = g * ((1 - ls) * w_t * (p_c - [c == t])
 *                           + ls / C * (sum(w) * p_c - w_c))
 *   nll_loss of log-probabilities lp [n, C, inner]: loss = -w_t * lp_t
 *     backward: dlp_t = -w_t * g, 0 for the other classes
 *   A position whose target is ignore_index counts for nothing (loss and
 *   gradient 0). Reductions: none (per position), sum, or mean = sum divided
 *   by the sum of w_t over the counted positions (0 / 0 = NaN when none
 *   counts, as PyTorch).
 *   mse_loss of a and b [n]: loss = (a - b)^2, per element, summed or
 *   averaged; backward: da = 2 * (a - b) * g (g / n for mean).
 *
 * Sums over positions add per-chunk partials (double, at most one chunk per
 * thread) in chunk order. A f32 gradient of NN_STREAM_BYTES or more is
 * written with non-temporal stores. The typed row functions of cross_entropy are
 * compiled per row type (this file includes itself through nn_types.h). */
#ifndef NN_T
#if defined(__GNUC__) && !defined(__clang__) /* clang vectorizes them at -O2 and knows no such pragma */
#pragma GCC optimize("O3")
#endif

#include "nn_impl.h"

/* One element of a floating tensor's data as a double. */
static double load_one(const void *p, ct_dtype dt, int64_t i) {
    switch (dt) {
    case CT_F64: return ((const double *)p)[i];
    case CT_F32: return ((const float *)p)[i];
    case CT_F16: return cti_f16_to_f32(((const uint16_t *)p)[i]);
    default: return cti_bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

static void store_one(void *p, ct_dtype dt, int64_t i, double v) {
    switch (dt) {
    case CT_F64: ((double *)p)[i] = v; break;
    case CT_F32: ((float *)p)[i] = (float)v; break;
    case CT_F16: ((uint16_t *)p)[i] = cti_f32_to_f16((float)v); break;
    default: ((uint16_t *)p)[i] = cti_f32_to_bf16((float)v); break;
    }
}

/* ---- cross_entropy / nll_loss -------------------------------------------------------------
 * over logits [N, C, inner] (contiguous); targets int64 [N*inner].
 * forward:  in logits, target, weight|NULL;            out loss, row statistics|absent
 * backward: in grad_loss, logits, target, weight|NULL; out grad
 * The forward writes the row statistics when asked; the backward folds each
 * row anyway (it needs its exponentials), so it leaves them unread. */

/* Checks every target against [0, C) (ignore_index aside) before anything is
 * computed; *wsum gets the sum of the weights of the counted targets. */
static ct_status check_targets(const char *op, const ct_tensor *target, int64_t npos, int64_t nc,
                               int64_t ignore, const double *w, double *wsum) {
    const int64_t *t = (const int64_t *)cti_data(target);
    double s = 0;
    for (int64_t p = 0; p < npos; p++) {
        if (t[p] == ignore) continue;
        if (t[p] < 0 || t[p] >= nc)
            return cti_error(CT_ERR_INDEX,
                             "%s: target %lld is out of bounds for %lld classes (expected 0..%lld "
                             "or ignore_index %lld)",
                             op, (long long)t[p], (long long)nc, (long long)(nc - 1),
                             (long long)ignore);
        s += w ? w[t[p]] : 1.0;
    }
    *wsum = s;
    return CT_OK;
}

/* The class weights as doubles (NULL when there are none); *status on OOM. */
static double *weights_f64(const ct_tensor *w, int64_t nc, const char *op, ct_status *status) {
    *status = CT_OK;
    if (!w) return NULL;
    double *v = scratch(sizeof(double) * (size_t)nc);
    if (!v) {
        *status = cti_error(CT_ERR_OOM, "%s: out of memory", op);
        return NULL;
    }
    for (int64_t i = 0; i < nc; i++) v[i] = load_one(cti_data(w), w->dtype, i);
    return v;
}

typedef struct ce_ctx {
    ct_call *c;
    ct_tensor *logits, *target, *grad, *out;
    const double *w64;
    int64_t npos, nc, inner, ignore, nchunk;
    int reduction;
    double ls, wsum;
    double *part; /* per-chunk loss sums */
    void *stats;  /* forward: the row statistics (schema.h), in the row type, or NULL */
    bool stream;  /* f32 gradient rows larger than the caches: non-temporal stores */
    atomic_bool oom;
} ce_ctx;

/* The scale of position p's gradient: grad_loss per position (none), or the
 * scalar grad_loss, divided by the weight sum for mean. */
static double grad_scale(const ce_ctx *k, int64_t p) {
    ct_dtype dt = k->grad->dtype;
    if (k->reduction == CT_REDUCTION_NONE) return load_one(cti_data(k->grad), dt, p);
    double g = load_one(cti_data(k->grad), dt, 0);
    return k->reduction == CT_REDUCTION_MEAN ? g / k->wsum : g;
}

#define NN_TYPED "loss.c"
#include "nn_types.h"

static void ce_chunks(int64_t c0, int64_t c1, void *p) {
    ce_ctx *k = p;
    bool dbl = k->logits->dtype == CT_F64;
    size_t acc = dbl ? sizeof(double) : sizeof(float);
    int64_t nc = k->nc;
    char *buf = scratch(acc * (size_t)(4 * nc));
    if (!buf) {
        atomic_store(&k->oom, true);
        return;
    }
    /* class weights in the row type, after the three row buffers */
    if (dbl) {
        double *w = k->w64 ? (double *)buf + 3 * nc : NULL;
        if (w) memcpy(w, k->w64, sizeof(double) * (size_t)nc);
        for (int64_t ch = c0; ch < c1; ch++) ce_task_d(k, ch, (double *)buf, w);
    } else {
        float *w = k->w64 ? (float *)buf + 3 * nc : NULL;
        for (int64_t i = 0; w && i < nc; i++) w[i] = (float)k->w64[i];
        for (int64_t ch = c0; ch < c1; ch++) ce_task_f(k, ch, (float *)buf, w);
        if (k->stream) stream_fence();
    }
    free(buf);
}

static ct_status k_ce_any(ct_call *c, bool bwd) {
    const char *op = bwd ? "ct_cross_entropy_backward" : "ct_cross_entropy";
    int off = bwd ? 1 : 0;
    const cti_loss_params *p = CTI_PARAMS(c, cti_loss_params);
    ce_ctx k = {.c = c, .logits = c->in[off], .target = c->in[off + 1], .grad = bwd ? c->in[0] : NULL,
                .out = c->out[0], .stats = !bwd && c->nout > 1 ? cti_data(c->out[1]) : NULL, .nc = p->c, .inner = p->inner, .reduction = p->reduction,
                .ignore = p->ignore_index, .ls = p->label_smoothing};
    k.npos = p->n * k.inner;
    ct_status s;
    double *w64 = weights_f64(c->in[off + 2], k.nc, op, &s);
    if (s != CT_OK) return s;
    k.w64 = w64;
    s = check_targets(op, k.target, k.npos, k.nc, k.ignore, w64, &k.wsum);
    if (s != CT_OK) {
        free(w64);
        return s;
    }
    k.stream = bwd && k.logits->dtype == CT_F32 && k.inner == 1 &&
               (uint64_t)(k.npos * k.nc) * sizeof(float) >= NN_STREAM_BYTES;
    k.nchunk = num_chunks(k.npos, row_grain(k.nc));
    k.part = scratch(sizeof(double) * (size_t)k.nchunk);
    if (!k.part) {
        free(w64);
        return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    }
    atomic_init(&k.oom, false);
    if (k.npos > 0) cti_parallel_for(k.nchunk, 1, ce_chunks, &k);
    else k.part[0] = 0;
    if (k.stats) store_one(k.stats, c->out[1]->dtype, k.npos, k.wsum);
    if (!bwd && k.reduction != CT_REDUCTION_NONE && !atomic_load(&k.oom)) {
        double total = 0;
        for (int64_t ch = 0; ch < k.nchunk; ch++) total += k.part[ch];
        /* mean over no counted target is 0/0 = NaN, as PyTorch */
        if (k.reduction == CT_REDUCTION_MEAN) total /= k.wsum;
        store_one(cti_data(k.out), k.out->dtype, 0, total);
    }
    free(k.part);
    free(w64);
    if (atomic_load(&k.oom)) return cti_error(CT_ERR_OOM, "%s: out of memory for row scratch", op);
    return CT_OK;
}
static ct_status k_cross_entropy(ct_call *c) { return k_ce_any(c, false); }
static ct_status k_cross_entropy_backward(ct_call *c) { return k_ce_any(c, true); }

/* nll_loss: loss_p = -w_t * lp[n, t, j]; the work is one gather per position. */
static ct_status k_nll_loss(ct_call *c) {
    const char *op = "ct_nll_loss";
    const cti_loss_params *prm = CTI_PARAMS(c, cti_loss_params);
    ct_tensor *lp = c->in[0], *target = c->in[1], *out = c->out[0];
    int64_t nc = prm->c, inner = prm->inner, npos = prm->n * inner, ignore = prm->ignore_index;
    int red = prm->reduction;
    ct_status s;
    double wsum = 0, *w = weights_f64(c->in[2], nc, op, &s);
    if (s != CT_OK) return s;
    s = check_targets(op, target, npos, nc, ignore, w, &wsum);
    if (s != CT_OK) {
        free(w);
        return s;
    }
    const int64_t *tg = (const int64_t *)cti_data(target);
    double total = 0;
    for (int64_t p = 0; p < npos; p++) {
        double loss = 0;
        if (tg[p] != ignore) {
            int64_t n = p / inner, j = p % inner;
            loss = -(w ? w[tg[p]] : 1.0) * load_one(cti_data(lp), lp->dtype, (n * nc + tg[p]) * inner + j);
        }
        if (red == CT_REDUCTION_NONE) store_one(cti_data(out), out->dtype, p, loss);
        else total += loss;
    }
    if (red == CT_REDUCTION_MEAN) total /= wsum;
    if (red != CT_REDUCTION_NONE) store_one(cti_data(out), out->dtype, 0, total);
    free(w);
    return CT_OK;
}

/* nll_loss backward: in grad_loss, log_probs, target, weight|NULL; out grad (zeros but
 * -w_t * g at each counted target). */
static ct_status k_nll_loss_backward(ct_call *c) {
    const char *op = "ct_nll_loss_backward";
    const cti_loss_params *prm = CTI_PARAMS(c, cti_loss_params);
    ct_tensor *gl = c->in[0], *target = c->in[2], *out = c->out[0];
    int64_t nc = prm->c, inner = prm->inner, npos = prm->n * inner, ignore = prm->ignore_index;
    int red = prm->reduction;
    ct_status s;
    double wsum = 0, *w = weights_f64(c->in[3], nc, op, &s);
    if (s != CT_OK) return s;
    s = check_targets(op, target, npos, nc, ignore, w, &wsum);
    if (s != CT_OK) {
        free(w);
        return s;
    }
    memset(cti_data(out), 0, (size_t)(npos * nc) * ct_dtype_size(out->dtype));
    const int64_t *tg = (const int64_t *)cti_data(target);
    double g0 = red == CT_REDUCTION_NONE ? 0 : load_one(cti_data(gl), gl->dtype, 0);
    if (red == CT_REDUCTION_MEAN) g0 /= wsum;
    for (int64_t p = 0; p < npos; p++) {
        if (tg[p] == ignore) continue;
        int64_t n = p / inner, j = p % inner;
        double g = red == CT_REDUCTION_NONE ? load_one(cti_data(gl), gl->dtype, p) : g0;
        store_one(cti_data(out), out->dtype, (n * nc + tg[p]) * inner + j, -(w ? w[tg[p]] : 1.0) * g);
    }
    free(w);
    return CT_OK;
}

/* ---- mse_loss ----------------------------------------------------------------------------
 * over equal-shaped contiguous input and target.
 * forward: in input, target; out loss.  backward: in grad_loss, input, target; out grad. */

#define MSE_BLOCK 1024

typedef struct mse_ctx {
    ct_call *c;
    ct_tensor *a, *b, *g, *out;
    int64_t n, nchunk;
    int reduction;
    double gscale; /* backward, mean/sum: 2 * g / n or 2 * g */
    double *part;
    atomic_bool oom;
} mse_ctx;

static void mse_task(int64_t c0, int64_t c1, void *p) {
    mse_ctx *k = p;
    ct_dtype dt = k->a->dtype;
    bool h = is_half(dt);
    float *buf = h ? scratch(sizeof(float) * 4 * MSE_BLOCK) : NULL;
    if (h && !buf) {
        atomic_store(&k->oom, true);
        return;
    }
    size_t es = ct_dtype_size(dt);
    bool none = k->reduction == CT_REDUCTION_NONE;
    for (int64_t ch = c0; ch < c1; ch++) {
        int64_t e0 = chunk_begin(k->n, k->nchunk, ch), e1 = chunk_begin(k->n, k->nchunk, ch + 1);
        double acc = 0;
        for (int64_t s0 = e0; s0 < e1; s0 += MSE_BLOCK) {
            int64_t m = e1 - s0 < MSE_BLOCK ? e1 - s0 : MSE_BLOCK;
            if (dt == CT_F64) {
                const double *A = (const double *)cti_data(k->a) + s0, *B = (const double *)cti_data(k->b) + s0;
                double *O = (double *)cti_data(k->out) + s0;
                if (k->g) {
                    const double *G = none ? (const double *)cti_data(k->g) + s0 : NULL;
                    double gs = k->gscale;
                    if (G) for (int64_t i = 0; i < m; i++) O[i] = 2.0 * (A[i] - B[i]) * G[i];
                    else for (int64_t i = 0; i < m; i++) O[i] = gs * (A[i] - B[i]);
                } else if (none) {
                    for (int64_t i = 0; i < m; i++) O[i] = (A[i] - B[i]) * (A[i] - B[i]);
                } else {
                    double t[NACC] = {0};
                    int64_t i = 0;
                    for (; i + NACC <= m; i += NACC)
                        for (int j = 0; j < NACC; j++) t[j] += (A[i + j] - B[i + j]) * (A[i + j] - B[i + j]);
                    for (; i < m; i++) acc += (A[i] - B[i]) * (A[i] - B[i]);
                    for (int j = 0; j < NACC; j++) acc += t[j];
                }
            } else {
                const float *A, *B, *G = NULL;
                float *O;
                if (h) {
                    float *ab = buf, *bb = buf + MSE_BLOCK, *gb = buf + 2 * MSE_BLOCK;
                    load_f32(cti_data(k->a) + s0 * (int64_t)es, dt, m, 1, ab);
                    load_f32(cti_data(k->b) + s0 * (int64_t)es, dt, m, 1, bb);
                    if (k->g && none) {
                        load_f32(cti_data(k->g) + s0 * (int64_t)es, dt, m, 1, gb);
                        G = gb;
                    }
                    A = ab;
                    B = bb;
                    O = buf + 3 * MSE_BLOCK;
                } else {
                    A = (const float *)cti_data(k->a) + s0;
                    B = (const float *)cti_data(k->b) + s0;
                    O = (float *)cti_data(k->out) + s0;
                    if (k->g && none) G = (const float *)cti_data(k->g) + s0;
                }
                if (k->g) {
                    float gs = (float)k->gscale;
                    if (G) for (int64_t i = 0; i < m; i++) O[i] = 2.0f * (A[i] - B[i]) * G[i];
                    else for (int64_t i = 0; i < m; i++) O[i] = gs * (A[i] - B[i]);
                } else if (none) {
                    for (int64_t i = 0; i < m; i++) O[i] = (A[i] - B[i]) * (A[i] - B[i]);
                } else {
                    float t[NACC] = {0};
                    int64_t i = 0;
                    for (; i + NACC <= m; i += NACC)
                        for (int j = 0; j < NACC; j++) t[j] += (A[i + j] - B[i + j]) * (A[i + j] - B[i + j]);
                    float s = 0;
                    for (int j = 0; j < NACC; j++) s += t[j];
                    for (; i < m; i++) s += (A[i] - B[i]) * (A[i] - B[i]);
                    acc += s;
                }
                if (h && (k->g || none)) store_f32(O, dt, m, 1, cti_data(k->out) + s0 * (int64_t)es);
            }
        }
        k->part[ch] = acc;
    }
    free(buf);
}

static ct_status k_mse_any(ct_call *c, bool bwd) {
    int off = bwd ? 1 : 0;
    const cti_loss_params *p = CTI_PARAMS(c, cti_loss_params);
    mse_ctx k = {.c = c, .a = c->in[off], .b = c->in[off + 1], .g = bwd ? c->in[0] : NULL,
                 .out = c->out[0], .n = p->n, .reduction = p->reduction};
    const char *op = bwd ? "ct_mse_loss_backward" : "ct_mse_loss";
    if (bwd && k.reduction != CT_REDUCTION_NONE) {
        double g = load_one(cti_data(k.g), k.g->dtype, 0);
        k.gscale = k.reduction == CT_REDUCTION_MEAN ? 2.0 * g / (double)k.n : 2.0 * g;
    }
    k.nchunk = num_chunks(k.n, CTI_GRAIN);
    k.part = scratch(sizeof(double) * (size_t)k.nchunk);
    if (!k.part) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    atomic_init(&k.oom, false);
    k.part[0] = 0;
    if (k.n > 0) cti_parallel_for(k.nchunk, 1, mse_task, &k);
    if (!bwd && k.reduction != CT_REDUCTION_NONE) {
        double total = 0;
        for (int64_t ch = 0; ch < k.nchunk; ch++) total += k.part[ch];
        if (k.reduction == CT_REDUCTION_MEAN) total /= (double)k.n; /* empty: NaN, as PyTorch */
        store_one(cti_data(k.out), k.out->dtype, 0, total);
    }
    free(k.part);
    if (atomic_load(&k.oom)) return cti_error(CT_ERR_OOM, "%s: out of memory for scratch", op);
    return CT_OK;
}
static ct_status k_mse_loss(ct_call *c) { return k_mse_any(c, false); }
static ct_status k_mse_loss_backward(ct_call *c) { return k_mse_any(c, true); }

void cti_cpu_register_loss(void) {
    static const nn_kernel ks[] = {
        {CT_OP_CROSS_ENTROPY, k_cross_entropy, "cpu_cross_entropy"},
        {CT_OP_CROSS_ENTROPY_BACKWARD, k_cross_entropy_backward, "cpu_cross_entropy_backward"},
        {CT_OP_NLL_LOSS, k_nll_loss, "cpu_nll_loss"},
        {CT_OP_NLL_LOSS_BACKWARD, k_nll_loss_backward, "cpu_nll_loss_backward"},
        {CT_OP_MSE_LOSS, k_mse_loss, "cpu_mse_loss"},
        {CT_OP_MSE_LOSS_BACKWARD, k_mse_loss_backward, "cpu_mse_loss_backward"},
    };
    nn_register_floating(ks, sizeof ks / sizeof ks[0]);
}

#else /* NN_T: the row math and the per-chunk task, once per row type */

/* log(sum(exp(z))) of a contiguous row; tmp gets exp(z - max(z)) (d elements) and
 * *sum their sum, so that softmax(z) = tmp / sum without another exp. next:
 * the row the caller takes next, or NULL. */
static NN_T NN_F(logsumexp)(const NN_T *restrict z, NN_T *restrict tmp, int64_t d, NN_T *sum,
                            const NN_T *next) {
    NN_T m = NN_F(max)(z, d);
    int64_t i = 0;
    if (next) {
        /* the exps run from L1; meanwhile the next row comes from memory */
        enum { LINE = 64 / sizeof(NN_T) };
        for (; i + LINE <= d; i += LINE) {
            __builtin_prefetch(next + i, 0, 3);
            for (int j = 0; j < LINE; j++) tmp[i + j] = NN_EXP(z[i + j] - m);
        }
    }
    for (; i < d; i++) tmp[i] = NN_EXP(z[i] - m);
    NN_T s = NN_F(sum)(tmp, d);
    *sum = s;
    return m + NN_LOG(s);
}

/* Cross-entropy of one position: (1-ls) * w_t * (lse - z_t)
 *   + ls/C * sum_c w_c * (lse - z_c)   (PyTorch's label smoothing with weights). */
static NN_T NN_F(ce_loss_row)(const NN_T *restrict z, const NN_T *restrict w, int64_t t, NN_T lse,
                              int64_t d, NN_T ls) {
    NN_T wt = w ? w[t] : (NN_T)1;
    NN_T loss = ((NN_T)1 - ls) * wt * (lse - z[t]);
    if (ls > 0) {
        NN_T sm = w ? lse * NN_F(sum)(w, d) - NN_F(dot)(w, z, d) : lse * (NN_T)d - NN_F(sum)(z, d);
        loss += ls / (NN_T)d * sm;
    }
    return loss;
}

/* d loss / d z_c = g * ((1-ls) * w_t * (p_c - [c==t]) + ls/C * (sumw * p_c - w_c)),
 * p = e * inv from logsumexp. */
static void NN_F(ce_grad_row)(const NN_T *restrict e, NN_T inv, const NN_T *restrict w, int64_t t,
                              NN_T sumw, int64_t d, NN_T ls, NN_T g, NN_T *restrict dz) {
    NN_T wt = w ? w[t] : (NN_T)1;
    NN_T a = g * ((NN_T)1 - ls) * wt, b = g * ls / (NN_T)d;
    for (int64_t i = 0; i < d; i++) {
        NN_T p = e[i] * inv;
        dz[i] = a * p + b * (sumw * p - (w ? w[i] : (NN_T)1));
    }
    dz[t] -= a;
}

/* Chunk ch of the positions: the forward's losses (stored per position, or
 * summed into part[ch]) or the backward's gradient rows. buf: three rows of
 * nc scratch; w: the class weights in the row type, or NULL. */
static void NN_F(ce_task)(ce_ctx *k, int64_t ch, NN_T *buf, const NN_T *w) {
    int64_t p0 = chunk_begin(k->npos, k->nchunk, ch);
    int64_t p1 = chunk_begin(k->npos, k->nchunk, ch + 1);
    int64_t nc = k->nc, inner = k->inner;
    ct_dtype dt = k->logits->dtype;
    const int64_t *tg = (const int64_t *)cti_data(k->target);
    size_t es = ct_dtype_size(dt);
    NN_T *z = buf, *tmp = buf + nc, *dz = buf + 2 * nc;
    NN_T sumw = w ? NN_F(sum)(w, nc) : (NN_T)nc;
    double acc = 0;
    for (int64_t p = p0; p < p1; p++) {
        int64_t n = p / inner, j = p % inner;
        int64_t base = n * nc * inner + j;
        const char *src = cti_data(k->logits) + base * (int64_t)es;
        const NN_T *zr = z;
        bool ignored = tg[p] == k->ignore;
        if (ignored && !k->grad) {
            if (k->reduction == CT_REDUCTION_NONE) store_one(cti_data(k->out), k->out->dtype, p, 0);
            if (k->stats) ((NN_T *)k->stats)[p] = 0;
            continue;
        }
        if (ignored) {
            for (int64_t i = 0; i < nc; i++)
                store_one(cti_data(k->out), k->out->dtype, base + i * inner, 0);
            continue;
        }
        if (dt == CT_F64 || (dt == CT_F32 && inner == 1)) {
            if (inner == 1) zr = (const NN_T *)src;
            else
                for (int64_t i = 0; i < nc; i++) z[i] = ((const NN_T *)src)[i * inner];
        } else {
            load_f32(src, dt, nc, inner, (float *)z);
        }
        NN_T sum;
        /* contiguous rows: the next row, to prefetch */
        const NN_T *next = zr == (const NN_T *)src && p + 1 < p1 ? zr + nc : NULL;
        NN_T lse = NN_F(logsumexp)(zr, tmp, nc, &sum, next);
        if (!k->grad) {
            if (k->stats) ((NN_T *)k->stats)[p] = lse;
            NN_T loss = NN_F(ce_loss_row)(zr, w, tg[p], lse, nc, (NN_T)k->ls);
            if (k->reduction == CT_REDUCTION_NONE) store_one(cti_data(k->out), k->out->dtype, p, loss);
            else acc += loss;
            continue;
        }
        NN_T inv = (NN_T)1 / sum, g = (NN_T)grad_scale(k, p);
        char *dst = cti_data(k->out) + base * (int64_t)es;
        if (!w && k->ls == 0) {
            /* dz = g (p - onehot(t)) = (tmp - sum onehot(t)) g / sum: the
             * row is tmp, scaled on its way out */
            tmp[tg[p]] -= sum;
#if NN_IS_FLOAT
            if (dt == CT_F32 && inner == 1) {
                store_affine((float *)dst, tmp, g * inv, 0.0f, nc, k->stream);
                continue;
            }
#endif
            for (int64_t i = 0; i < nc; i++) dz[i] = tmp[i] * (g * inv);
        } else {
            NN_F(ce_grad_row)(tmp, inv, w, tg[p], sumw, nc, (NN_T)k->ls, g, dz);
        }
        if (dt == CT_F64)
            for (int64_t i = 0; i < nc; i++) ((double *)dst)[i * inner] = (double)dz[i];
        else if (k->stream)
            store_affine((float *)dst, (const float *)dz, 1.0f, 0.0f, nc, true);
        else
            store_f32((const float *)dz, dt, nc, inner, dst);
    }
    k->part[ch] = acc;
}

#endif
