/* Front ends of the fused optimizer updates (CT_OP_SGD_STEP,
 * CT_OP_ADAMW_STEP; the contract is in optim_impl.h).
 *
 * The kernels see contiguous tensors only: a non-contiguous gradient (or one
 * sharing memory with its parameter) is read through a contiguous copy, and
 * a non-contiguous parameter or state is updated in a contiguous copy that is
 * written back. Parameters normally need none of this, so a step costs one
 * dispatch per (device, dtype) and no allocation beyond this file's index
 * arrays. */
#include <stdlib.h>

#include "autograd/autograd_impl.h"
#include "optim_impl.h"
#include "tensor/autograd.h"

/* One update's op, its state count and its hyperparameters (p.list is
 * filled per dispatch). */
typedef struct opt_kind {
    ct_op op;
    int nstate;
    cti_optim_params p;
} opt_kind;

static inline ct_device dev_of(const ct_tensor *t) { return t->storage->device; }

static bool same_geometry(const ct_tensor *a, const ct_tensor *b) {
    if (a->ndim != b->ndim || a->dtype != b->dtype || !ct_device_eq(dev_of(a), dev_of(b)))
        return false;
    return memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

/* A destination with a stride-0 dim would be written twice per element. */
static bool expanded(const ct_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1 && t->stride[d] == 0) return true;
    return false;
}

static const char *const state_names[2][2] = {{"momentum buffer", ""},
                                               {"exp_avg", "exp_avg_sq"}};

/* Parameter k's arguments against the contract; an error names op and k. */
static ct_status check_one(const char *op, const cti_optim_list *l, const opt_kind *kd,
                           int64_t k) {
    ct_tensor *p = l->param[k], *g = l->grad[k];
    int kind = kd->op == CT_OP_ADAMW_STEP;
    if (!p) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter %lld is NULL", op, (long long)k);
    if (!ct_dtype_is_floating(p->dtype))
        return cti_error(CT_ERR_DTYPE, "%s: parameter %lld (%s) is not floating", op,
                         (long long)k, cti_desc(p));
    if (!same_geometry(p, g))
        return cti_error(CT_ERR_SHAPE,
                         "%s: parameter %lld: gradient %s does not match the parameter %s "
                         "(expected the same shape, dtype and device)",
                         op, (long long)k, cti_desc(g), cti_desc(p));
    if (l->step[k] < 1)
        return cti_error(CT_ERR_INVALID_ARG, "%s: parameter %lld: step %lld (expected >= 1)",
                         op, (long long)k, (long long)l->step[k]);
    if (expanded(p))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: parameter %lld %s has elements that share memory (an expanded "
                         "view)",
                         op, (long long)k, cti_desc(p));
    ct_status st = cti_ag_check_inplace(op, p);
    if (st != CT_OK) return st;
    if (cti_ag_needed(1, &g))
        return cti_error(CT_ERR_AUTOGRAD,
                         "%s: parameter %lld: the gradient %s requires grad; run the update in "
                         "no-grad mode",
                         op, (long long)k, cti_desc(g));
    for (int b = 0; b < kd->nstate; b++) {
        ct_tensor *s = l->state[b][k];
        const char *what = state_names[kind][b];
        if (!s)
            return cti_error(CT_ERR_INVALID_ARG, "%s: parameter %lld: the %s is NULL", op,
                             (long long)k, what);
        if (!same_geometry(p, s) || expanded(s))
            return cti_error(CT_ERR_SHAPE,
                             "%s: parameter %lld: the %s %s does not match the parameter %s "
                             "(expected the same shape, dtype and device, no expanded view)",
                             op, (long long)k, what, cti_desc(s), cti_desc(p));
        if ((st = cti_ag_check_inplace(op, s)) != CT_OK) return st;
    }
    return CT_OK;
}

static int by_address(const void *a, const void *b) {
    uintptr_t u = (uintptr_t)*(void *const *)a, v = (uintptr_t)*(void *const *)b;
    return u < v ? -1 : u > v;
}

/* Sorts the storages of every tensor the call writes into w (*m of them);
 * two on one storage would be written at once by one kernel. */
static ct_status written_storages(const char *op, const cti_optim_list *l, const opt_kind *kd,
                                  const bool *skip, cti_storage **w, int64_t *m) {
    *m = 0;
    for (int64_t k = 0; k < l->n; k++) {
        if (skip[k]) continue;
        w[(*m)++] = l->param[k]->storage;
        for (int b = 0; b < kd->nstate; b++) w[(*m)++] = l->state[b][k]->storage;
    }
    qsort(w, (size_t)*m, sizeof *w, by_address);
    for (int64_t j = 1; j < *m; j++)
        if (w[j] == w[j - 1])
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: two of the parameters and states to update share memory "
                             "(expected distinct tensors)",
                             op);
    return CT_OK;
}

static bool is_written(const cti_storage *s, cti_storage *const *w, int64_t m) {
    return bsearch(&s, w, (size_t)m, sizeof *w, by_address) != NULL;
}

/* The working arrays of one dispatch: m entries of one (device, dtype). */
typedef struct group {
    int64_t m;
    ct_tensor **param, **grad, **state[2];
    int64_t *step;
    int64_t *index; /* entry -> position in the caller's list */
    cti_storage **written; /* sorted, nwritten of them */
    int64_t nwritten;
} group;

/* t itself when the kernel can use it, else a contiguous copy (new
 * reference in *tmp). */
static ct_tensor *kernel_view(ct_tensor *t, bool must_copy, ct_tensor **tmp) {
    *tmp = NULL;
    if (!must_copy && cti_is_contiguous(t)) return t;
    *tmp = ct_clone(t); /* ct_clone's result is contiguous */
    return *tmp;
}

/* Runs one dispatch over g; substitutes are made, used and released here. */
static ct_status run_group(const char *op, const cti_optim_list *l, const opt_kind *kd,
                           group *g) {
    ct_status st = CT_OK;
    int64_t made = 0; /* entries whose substitutes exist */
    ct_tensor *(*tmp)[4] = calloc((size_t)g->m, sizeof *tmp);
    if (!tmp) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    for (int64_t e = 0; e < g->m && st == CT_OK; e++, made++) {
        int64_t k = g->index[e];
        ct_tensor *p = l->param[k], *gr = l->grad[k];
        g->param[e] = kernel_view(p, false, &tmp[e][0]);
        /* A gradient on memory the kernel writes could be read after its
         * elements were overwritten. */
        bool alias = is_written(gr->storage, g->written, g->nwritten);
        g->grad[e] = g->param[e] ? kernel_view(gr, alias, &tmp[e][1]) : NULL;
        bool ok = g->param[e] && g->grad[e];
        for (int b = 0; b < kd->nstate && ok; b++) {
            g->state[b][e] = kernel_view(l->state[b][k], false, &tmp[e][2 + b]);
            ok = g->state[b][e] != NULL;
        }
        g->step[e] = l->step[k];
        if (!ok) st = ct_last_status();
    }
    if (st == CT_OK) {
        cti_optim_params p = kd->p;
        p.list = (cti_optim_list){g->m, g->param, g->grad, {g->state[0], g->state[1]}, g->step,
                                  NULL};
        ct_call c;
        cti_call_init(&c, kd->op);
        c.in[c.nin++] = g->param[0];
        c.in[c.nin++] = g->grad[0];
        for (int b = 0; b < kd->nstate; b++) c.in[c.nin++] = g->state[b][0];
        cti_call_params(&c, &p);
        ct_tensor *p0 = g->param[0];
        st = cti_run(&c, dev_of(p0), p0->dtype);
    }
    /* Count every write: ct_copy_ counts the updated copies it writes back. */
    bool ok = st == CT_OK;
    for (int64_t e = 0; e < made; e++) {
        int64_t k = g->index[e];
        for (int j = 0; j < 1 + kd->nstate && ok; j++) {
            ct_tensor *t = j == 0 ? l->param[k] : l->state[j - 1][k], *src = tmp[e][j ? 1 + j : 0];
            if (!src) cti_bump_version(t);
            else if ((st = ct_copy_(t, src)) != CT_OK) ok = false;
        }
        for (int j = 0; j < 4; j++) ct_tensor_release(tmp[e][j]);
    }
    free(tmp);
    return st;
}

static bool same_target(const ct_tensor *a, const ct_tensor *b) {
    return a->dtype == b->dtype && ct_device_eq(dev_of(a), dev_of(b));
}

static ct_status run(const char *op, const cti_optim_list *l, const opt_kind *kd) {
    if (!l) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter list is NULL", op);
    if (l->n < 0 || (l->n > 0 && (!l->param || !l->grad || !l->step ||
                                  (kd->nstate > 0 && !l->state[0]) ||
                                  (kd->nstate > 1 && !l->state[1]))))
        return cti_error(CT_ERR_INVALID_ARG, "%s: malformed parameter list of %lld entries", op,
                         (long long)l->n);
    if (l->updated)
        for (int64_t k = 0; k < l->n; k++) l->updated[k] = false;
    int64_t live = 0; /* entries with a gradient */
    for (int64_t k = 0; k < l->n; k++) {
        if (!l->grad[k]) continue;
        ct_status st = check_one(op, l, kd, k);
        if (st != CT_OK) return st;
        live++;
    }
    if (live == 0) return CT_OK;
    size_t n = (size_t)l->n;
    ct_tensor **tv = malloc(4 * n * sizeof *tv);       /* param, grad, 2 states */
    int64_t *iv = malloc(2 * n * sizeof *iv);          /* step, index */
    cti_storage **wv = malloc(3 * n * sizeof *wv);     /* written storages */
    bool *done = calloc(n, sizeof *done);
    if (!tv || !iv || !wv || !done) {
        free(tv);
        free(iv);
        free(wv);
        free(done);
        return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    }
    group g = {0, tv, tv + n, {tv + 2 * n, tv + 3 * n}, iv, iv + n, wv, 0};
    for (int64_t k = 0; k < l->n; k++) done[k] = !l->grad[k];
    ct_status st = written_storages(op, l, kd, done, wv, &g.nwritten);
    bool prev = ct_no_grad_begin();
    for (int64_t k = 0; k < l->n && st == CT_OK; k++) {
        if (done[k]) continue;
        g.m = 0;
        for (int64_t j = k; j < l->n; j++)
            if (!done[j] && same_target(l->param[j], l->param[k])) {
                done[j] = true;
                g.index[g.m++] = j;
            }
        st = run_group(op, l, kd, &g);
        if (st == CT_OK && l->updated)
            for (int64_t e = 0; e < g.m; e++) l->updated[g.index[e]] = true;
    }
    ct_no_grad_end(prev);
    free(tv);
    free(iv);
    free(wv);
    free(done);
    return st;
}

ct_status cti_sgd_step(const char *op, const cti_optim_list *l, const cti_sgd_hparams *h) {
    if (!h) return cti_error(CT_ERR_INVALID_ARG, "%s: hyperparameters are NULL", op);
    opt_kind kd = {CT_OP_SGD_STEP, h->momentum != 0 ? 1 : 0, {.sgd = *h}};
    return run(op, l, &kd);
}

ct_status cti_adamw_step(const char *op, const cti_optim_list *l, const cti_adamw_hparams *h) {
    if (!h) return cti_error(CT_ERR_INVALID_ARG, "%s: hyperparameters are NULL", op);
    opt_kind kd = {CT_OP_ADAMW_STEP, 2, {.adamw = *h}};
    return run(op, l, &kd);
}
