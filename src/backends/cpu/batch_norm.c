/* CPU kernels of BATCH_NORM and BATCH_NORM_BACKWARD (cti_batch_norm_params,
 * src/dispatch/schema.h): x contiguous [N, C, S], one task per run of
 * channels; a channel's N rows of S elements are read into a float64 row
 * (exact for every input dtype), so the statistics and the sums of the
 * backward are float64 whatever the dtype, and each result is rounded once.
 * Statistics are two-pass (the mean, then the squared deviations from it),
 * which keeps the variance of data far from zero accurate. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

static void load_row(ct_dtype dt, const char *base, int64_t off, int64_t n, double *restrict d) {
    switch (dt) {
    case CT_F64: memcpy(d, (const double *)base + off, (size_t)n * sizeof(double)); break;
    case CT_F32: {
        const float *s = (const float *)base + off;
        for (int64_t i = 0; i < n; i++) d[i] = s[i];
        break;
    }
    case CT_F16: {
        const uint16_t *s = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++) d[i] = cti_f16_to_f32(s[i]);
        break;
    }
    default: {
        const uint16_t *s = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++) d[i] = cti_bf16_to_f32(s[i]);
        break;
    }
    }
}

static void store_row(ct_dtype dt, char *base, int64_t off, int64_t n, const double *restrict s) {
    switch (dt) {
    case CT_F64: memcpy((double *)base + off, s, (size_t)n * sizeof(double)); break;
    case CT_F32: {
        float *d = (float *)base + off;
        for (int64_t i = 0; i < n; i++) d[i] = (float)s[i];
        break;
    }
    case CT_F16: {
        uint16_t *d = (uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++) d[i] = cti_f32_to_f16((float)s[i]);
        break;
    }
    default: {
        uint16_t *d = (uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++) d[i] = cti_f32_to_bf16((float)s[i]);
        break;
    }
    }
}

/* Element c of an optional [C] tensor of dtype dt (def when t is NULL). */
static double elem(const ct_tensor *t, int64_t c, double def) {
    if (!t) return def;
    double v;
    load_row(t->dtype, cti_data(t), c, 1, &v);
    return v;
}

static void put_elem(ct_tensor *t, int64_t c, double v) {
    if (t) store_row(t->dtype, cti_data(t), c, 1, &v);
}

typedef struct bn_ctx {
    const ct_call *c;
    cti_batch_norm_params p;
    atomic_int failed;
} bn_ctx;

/* Sum of a channel's elements (or of their squared deviations from mean). */
static double channel_sum(const bn_ctx *k, const ct_tensor *t, int64_t ch, double *row,
                          bool deviations, double mean) {
    const cti_batch_norm_params *p = &k->p;
    double s = 0;
    for (int64_t n = 0; n < p->N; n++) {
        load_row(t->dtype, cti_data(t), (n * p->C + ch) * p->S, p->S, row);
        if (deviations)
            for (int64_t i = 0; i < p->S; i++) s += (row[i] - mean) * (row[i] - mean);
        else
            for (int64_t i = 0; i < p->S; i++) s += row[i];
    }
    return s;
}

static void fwd_task(int64_t begin, int64_t end, void *vctx) {
    bn_ctx *k = vctx;
    const ct_call *c = k->c;
    const cti_batch_norm_params *p = &k->p;
    const ct_tensor *x = c->in[0];
    double *row = malloc((size_t)(p->S > 0 ? p->S : 1) * sizeof(double));
    if (!row) {
        atomic_store(&k->failed, 1);
        return;
    }
    double count = (double)(p->N * p->S);
    for (int64_t ch = begin; ch < end; ch++) {
        double mean, var;
        if (p->training) {
            mean = channel_sum(k, x, ch, row, false, 0) / count;
            var = channel_sum(k, x, ch, row, true, mean) / count;
            put_elem(c->out[1], ch, mean);
            put_elem(c->out[2], ch, var);
        } else {
            mean = elem(c->in[3], ch, 0);
            var = elem(c->in[4], ch, 1);
        }
        double scale = elem(c->in[1], ch, 1) / sqrt(var + p->eps);
        double shift = elem(c->in[2], ch, 0) - mean * scale;
        for (int64_t n = 0; n < p->N; n++) {
            int64_t off = (n * p->C + ch) * p->S;
            load_row(x->dtype, cti_data(x), off, p->S, row);
            for (int64_t i = 0; i < p->S; i++) row[i] = row[i] * scale + shift;
            store_row(x->dtype, cti_data(c->out[0]), off, p->S, row);
        }
    }
    free(row);
}

static void bwd_task(int64_t begin, int64_t end, void *vctx) {
    bn_ctx *k = vctx;
    const ct_call *c = k->c;
    const cti_batch_norm_params *p = &k->p;
    const ct_tensor *dy = c->in[0], *x = c->in[1];
    ct_dtype dt = x->dtype;
    size_t n = (size_t)(p->S > 0 ? p->S : 1);
    double *g = malloc(2 * n * sizeof(double));
    if (!g) {
        atomic_store(&k->failed, 1);
        return;
    }
    double *xr = g + n, count = (double)(p->N * p->S);
    for (int64_t ch = begin; ch < end; ch++) {
        double mean = elem(c->in[3], ch, 0), invstd = 1 / sqrt(elem(c->in[4], ch, 1) + p->eps);
        double w = elem(c->in[2], ch, 1), sg = 0, sgx = 0;
        for (int64_t r = 0; r < p->N; r++) {
            int64_t off = (r * p->C + ch) * p->S;
            load_row(dt, cti_data(dy), off, p->S, g);
            load_row(dt, cti_data(x), off, p->S, xr);
            for (int64_t i = 0; i < p->S; i++) {
                sg += g[i];
                sgx += g[i] * (xr[i] - mean) * invstd;
            }
        }
        put_elem(c->out[1], ch, sgx);
        put_elem(c->out[2], ch, sg);
        if (!c->out[0]) continue;
        double a = w * invstd, mg = p->training ? sg / count : 0, mgx = p->training ? sgx / count : 0;
        for (int64_t r = 0; r < p->N; r++) {
            int64_t off = (r * p->C + ch) * p->S;
            load_row(dt, cti_data(dy), off, p->S, g);
            load_row(dt, cti_data(x), off, p->S, xr);
            for (int64_t i = 0; i < p->S; i++)
                g[i] = a * (g[i] - mg - (xr[i] - mean) * invstd * mgx);
            store_row(dt, cti_data(c->out[0]), off, p->S, g);
        }
    }
    free(g);
}

static ct_status run(ct_call *c, cti_range_fn fn, const char *routine) {
    bn_ctx k = {.c = c, .p = *CTI_PARAMS(c, cti_batch_norm_params)};
    atomic_init(&k.failed, 0);
    c->routine = routine;
    if (k.p.C == 0) return CT_OK;
    /* channels per task: about 2^15 elements each */
    int64_t per = k.p.N * k.p.S;
    cti_parallel_for(k.p.C, per >= 32768 ? 1 : 32768 / (per > 0 ? per : 1), fn, &k);
    if (atomic_load(&k.failed))
        return cti_error(CT_ERR_OOM, "ct_%s: out of memory for a row of %lld elements",
                         ct_op_name(c->op), (long long)k.p.S);
    return CT_OK;
}

static ct_status k_batch_norm(ct_call *c) { return run(c, fwd_task, "batch_norm_two_pass"); }

/* in: grad_y, x, weight|NULL, mean, var; out: dx|NULL, dweight|NULL, dbias|NULL. */
static ct_status k_batch_norm_backward(ct_call *c) {
    return run(c, bwd_task, "batch_norm_backward");
}

void cti_cpu_register_batch_norm(void) {
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (int i = 0; i < 4; i++) {
        cti_register_kernel(CT_OP_BATCH_NORM, CT_DEVICE_CPU, dts[i], k_batch_norm,
                            "batch_norm_two_pass");
        cti_register_kernel(CT_OP_BATCH_NORM_BACKWARD, CT_DEVICE_CPU, dts[i],
                            k_batch_norm_backward, "batch_norm_backward");
    }
}
