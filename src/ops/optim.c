/* Front ends of the fused optimizer updates (CT_OP_SGD_STEP,
 * CT_OP_ADAMW_STEP, CT_OP_ADAM_STEP, CT_OP_RMSPROP_STEP,
 * CT_OP_ADAGRAD_STEP; the contract is in optim_impl.h).
 *
 * The kernels see contiguous tensors only: a non-contiguous gradient (or one
 * sharing memory with its parameter) is read through a contiguous copy, and
 * a non-contiguous parameter, state or master is updated in a contiguous
 * copy that is written back. Parameters normally need none of this, so a
 * step costs one dispatch per (device, dtype, with or without masters) and
 * no allocation beyond this file's index arrays. Nothing here reads device
 * memory: a found_inf on a device and the step counts in memory go to the
 * kernels. */
#include <math.h>
#include <stdlib.h>

#include "autocast.h"
#include "autograd/autograd_impl.h"
#include "optim_impl.h"
#include "tensor/autograd.h"

#define NSTATE 3

/* One update's op, the states it uses (by the contract's index, with their
 * names) and its hyperparameters (p.list is filled per dispatch). */
typedef struct opt_kind {
    ct_op op;
    bool uses[NSTATE];
    const char *names[NSTATE];
    cti_optim_params p;
} opt_kind;

static inline ct_device dev_of(const ct_tensor *t) { return t->storage->device; }

/* a has b's shape and device, and dtype dt. */
static bool same_geometry_as(const ct_tensor *a, const ct_tensor *b, ct_dtype dt) {
    if (a->ndim != b->ndim || a->dtype != dt || !ct_device_eq(dev_of(a), dev_of(b)))
        return false;
    return memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

static bool same_geometry(const ct_tensor *a, const ct_tensor *b) {
    return same_geometry_as(a, b, b->dtype);
}

/* A destination with a stride-0 dim would be written twice per element. */
static bool expanded(const ct_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1 && t->stride[d] == 0) return true;
    return false;
}

static ct_tensor *entry(ct_tensor *const *a, int64_t k) { return a ? a[k] : NULL; }

/* Parameter k's step count in memory and its control tensor, against the
 * contract (p is the parameter). */
static ct_status check_counts(const char *op, const cti_optim_list *l, int64_t k,
                              const ct_tensor *p) {
    ct_tensor *st = entry(l->step_t, k), *ctl = entry(l->ctl, k);
    if (!st) {
        if (!l->step)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: parameter %lld has no step count (neither on the host nor "
                             "in memory)",
                             op, (long long)k);
        if (l->step[k] < 1)
            return cti_error(CT_ERR_INVALID_ARG, "%s: parameter %lld: step %lld (expected >= 1)",
                             op, (long long)k, (long long)l->step[k]);
        return CT_OK;
    }
    if (st->ndim != 0 || st->dtype != CT_F64 || !ct_device_eq(dev_of(st), dev_of(p)))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: parameter %lld: the step count %s is not a 0-d float64 tensor on "
                         "the parameter's device %s",
                         op, (long long)k, cti_desc(st), cti_desc(p));
    if (!ctl || ctl->ndim != 1 || ctl->shape[0] != 2 || ctl->dtype != CT_F64 ||
        !cti_is_contiguous(ctl) || !ct_device_eq(dev_of(ctl), dev_of(p)))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: parameter %lld: a step count in memory needs a contiguous "
                         "float64 [2] control tensor on the parameter's device, got %s",
                         op, (long long)k, ctl ? cti_desc(ctl) : "none");
    return CT_OK;
}

/* Parameter k's master weights (when it has them) against the contract. */
static ct_status check_master(const char *op, const cti_optim_list *l, int64_t k,
                              const ct_tensor *p) {
    ct_tensor *m = entry(l->master, k);
    if (!m) return CT_OK;
    if (p->dtype != CT_F16 && p->dtype != CT_BF16)
        return cti_error(CT_ERR_DTYPE,
                         "%s: parameter %lld %s: master weights are for float16 and bfloat16 "
                         "parameters",
                         op, (long long)k, cti_desc(p));
    if (!same_geometry_as(m, p, CT_F32) || expanded(m))
        return cti_error(CT_ERR_SHAPE,
                         "%s: parameter %lld: the master weights %s do not match the parameter "
                         "%s (expected float32 of its shape and device, no expanded view)",
                         op, (long long)k, cti_desc(m), cti_desc(p));
    return cti_ag_check_inplace(op, m);
}

/* Parameter k's arguments against the contract; an error names op and k. */
static ct_status check_one(const char *op, const cti_optim_list *l, const opt_kind *kd,
                           int64_t k) {
    ct_tensor *p = l->param[k], *g = l->grad[k];
    if (!p) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter %lld is NULL", op, (long long)k);
    if (l->weight_decay && !(l->weight_decay[k] >= 0 && isfinite(l->weight_decay[k])))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: parameter %lld: invalid weight_decay %g (expected >= 0)", op,
                         (long long)k, l->weight_decay[k]);
    if (!ct_dtype_is_floating(p->dtype))
        return cti_error(CT_ERR_DTYPE, "%s: parameter %lld (%s) is not floating", op,
                         (long long)k, cti_desc(p));
    if (!same_geometry(g, p))
        return cti_error(CT_ERR_SHAPE,
                         "%s: parameter %lld: gradient %s does not match the parameter %s "
                         "(expected the same shape, dtype and device)",
                         op, (long long)k, cti_desc(g), cti_desc(p));
    ct_status st = check_counts(op, l, k, p);
    if (st != CT_OK) return st;
    if (expanded(p))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: parameter %lld %s has elements that share memory (an expanded "
                         "view)",
                         op, (long long)k, cti_desc(p));
    if ((st = cti_ag_check_inplace(op, p)) != CT_OK) return st;
    if (cti_ag_needed(1, &g))
        return cti_error(CT_ERR_AUTOGRAD,
                         "%s: parameter %lld: the gradient %s requires grad; run the update in "
                         "no-grad mode",
                         op, (long long)k, cti_desc(g));
    if ((st = check_master(op, l, k, p)) != CT_OK) return st;
    /* With master weights the states are float32. */
    ct_dtype sdt = entry(l->master, k) ? CT_F32 : p->dtype;
    for (int b = 0; b < NSTATE; b++) {
        if (!kd->uses[b]) continue;
        ct_tensor *s = l->state[b][k];
        const char *what = kd->names[b];
        if (!s)
            return cti_error(CT_ERR_INVALID_ARG, "%s: parameter %lld: the %s is NULL", op,
                             (long long)k, what);
        if (!same_geometry_as(s, p, sdt) || expanded(s))
            return cti_error(CT_ERR_SHAPE,
                             "%s: parameter %lld: the %s %s does not match the parameter %s "
                             "(expected %s of its shape and device, no expanded view)",
                             op, (long long)k, what, cti_desc(s), cti_desc(p),
                             ct_dtype_name(sdt));
        if ((st = cti_ag_check_inplace(op, s)) != CT_OK) return st;
    }
    return CT_OK;
}

/* found_inf against the contract and the live entries: on the host it is
 * read here (*skip: it is not zero); on a device every live entry must keep
 * its count in memory on that device, since the host cannot know whether
 * the kernel skipped. */
static ct_status check_found_inf(const char *op, const cti_optim_list *l, bool *skip) {
    ct_tensor *f = l->found_inf;
    *skip = false;
    if (!f) return CT_OK;
    if (f->ndim != 0 || f->dtype != CT_F32)
        return cti_error(CT_ERR_INVALID_ARG, "%s: found_inf %s is not a 0-d float32 tensor", op,
                         cti_desc(f));
    if (dev_of(f).type == CT_DEVICE_CPU) {
        *skip = *(const float *)cti_data(f) != 0;
        return CT_OK;
    }
    for (int64_t k = 0; k < l->n; k++) {
        if (!l->grad[k]) continue;
        ct_tensor *p = l->param[k];
        if (!ct_device_eq(dev_of(p), dev_of(f)) || !entry(l->step_t, k))
            return cti_error(CT_ERR_DEVICE,
                             "%s: found_inf %s: parameter %lld %s must be on its device with "
                             "its step count in memory",
                             op, cti_desc(f), (long long)k, cti_desc(p));
    }
    return CT_OK;
}

static int by_address(const void *a, const void *b) {
    uintptr_t u = (uintptr_t)*(void *const *)a, v = (uintptr_t)*(void *const *)b;
    return u < v ? -1 : u > v;
}

/* Every tensor the call writes for entry k: parameter, states, master,
 * count in memory, autocast's lasting cast (NULL where absent; the cast
 * last, as its record follows the parameter's version). */
#define NWRITE (4 + NSTATE)
#define COPY_SLOT (3 + NSTATE)
static void written_of(const cti_optim_list *l, const opt_kind *kd, int64_t k,
                       ct_tensor *w[NWRITE]) {
    w[0] = l->param[k];
    for (int b = 0; b < NSTATE; b++) w[1 + b] = kd->uses[b] ? l->state[b][k] : NULL;
    w[1 + NSTATE] = entry(l->master, k);
    w[2 + NSTATE] = entry(l->step_t, k);
    w[COPY_SLOT] = entry(l->copy, k);
}

/* Sorts the storages of every tensor the call writes into w (*m of them);
 * two on one storage would be written at once by one kernel. */
static ct_status written_storages(const char *op, const cti_optim_list *l, const opt_kind *kd,
                                  const bool *skip, cti_storage **w, int64_t *m) {
    *m = 0;
    for (int64_t k = 0; k < l->n; k++) {
        if (skip[k]) continue;
        ct_tensor *t[NWRITE];
        written_of(l, kd, k, t);
        for (int j = 0; j < NWRITE; j++)
            if (t[j]) w[(*m)++] = t[j]->storage;
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

/* The working arrays of one dispatch: m entries of one (device, dtype,
 * masters or not, weight decay). */
typedef struct group {
    int64_t m;
    ct_tensor **param, **grad, **state[NSTATE], **master, **step_t, **ctl, **copy;
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

/* The entries of one device that keep their counts in memory share one
 * control tensor (its counter word serves one launch at a time). */
static ct_status check_shared_ctl(const char *op, const cti_optim_list *l, const group *g) {
    ct_tensor *first = NULL;
    int64_t fk = 0;
    for (int64_t e = 0; e < g->m; e++) {
        int64_t k = g->index[e];
        ct_tensor *c = entry(l->step_t, k) ? l->ctl[k] : NULL;
        if (!c) continue;
        if (!first) first = c, fk = k;
        else if (c->storage != first->storage || c->offset != first->offset)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: parameters %lld and %lld on one device have different "
                             "control tensors (expected one per device)",
                             op, (long long)fk, (long long)k);
    }
    return CT_OK;
}

/* Slots of an entry's substitutes: param, grad, the states, master. */
#define NTMP (3 + NSTATE)

/* Runs one dispatch over g; substitutes are made, used and released here. */
static ct_status run_group(const char *op, const cti_optim_list *l, const opt_kind *kd,
                           group *g) {
    ct_status st = check_shared_ctl(op, l, g);
    if (st != CT_OK || g->m < 1) return st;
    int64_t made = 0; /* entries whose substitutes exist */
    ct_tensor *(*tmp)[NTMP] = calloc((size_t)g->m, sizeof *tmp);
    if (!tmp) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    for (int64_t e = 0; e < g->m && st == CT_OK; e++, made++) {
        int64_t k = g->index[e];
        ct_tensor *p = l->param[k], *gr = l->grad[k], *ms = entry(l->master, k);
        g->param[e] = kernel_view(p, false, &tmp[e][0]);
        /* A gradient on memory the kernel writes could be read after its
         * elements were overwritten. */
        bool alias = is_written(gr->storage, g->written, g->nwritten);
        g->grad[e] = g->param[e] ? kernel_view(gr, alias, &tmp[e][1]) : NULL;
        bool ok = g->param[e] && g->grad[e];
        for (int b = 0; b < NSTATE && ok; b++) {
            g->state[b][e] = NULL;
            if (!kd->uses[b]) continue;
            g->state[b][e] = kernel_view(l->state[b][k], false, &tmp[e][2 + b]);
            ok = g->state[b][e] != NULL;
        }
        g->master[e] = ms && ok ? kernel_view(ms, false, &tmp[e][2 + NSTATE]) : NULL;
        if (ms && !g->master[e]) ok = false;
        g->copy[e] = entry(l->copy, k);
        g->step[e] = l->step && !entry(l->step_t, k) ? l->step[k] : 0;
        g->step_t[e] = entry(l->step_t, k);
        g->ctl[e] = g->step_t[e] ? l->ctl[k] : NULL;
        if (!ok) st = ct_last_status();
    }
    ct_tensor *p0 = g->param[0];
    if (st == CT_OK) {
        cti_optim_params p = kd->p;
        ct_tensor *f = l->found_inf;
        p.list = (cti_optim_list){g->m,
                                  g->param,
                                  g->grad,
                                  {kd->uses[0] ? g->state[0] : NULL,
                                   kd->uses[1] ? g->state[1] : NULL,
                                   kd->uses[2] ? g->state[2] : NULL},
                                  g->step,
                                  NULL,
                                  g->step_t,
                                  g->ctl,
                                  g->master[0] ? g->master : NULL,
                                  f && ct_device_eq(dev_of(f), dev_of(p0)) ? f : NULL,
                                  NULL, /* one group's weight decay: in p, set below */
                                  g->copy[0] ? g->copy : NULL};
        ct_call c;
        cti_call_init(&c, kd->op);
        c.in[c.nin++] = p0;
        c.in[c.nin++] = g->grad[0];
        for (int b = 0; b < NSTATE; b++)
            if (kd->uses[b]) c.in[c.nin++] = g->state[b][0];
        if (l->weight_decay) {
            /* same_target grouped the entries of one weight decay */
            double wd = l->weight_decay[g->index[0]];
            switch (kd->op) {
            case CT_OP_SGD_STEP: p.sgd.weight_decay = wd; break;
            case CT_OP_ADAMW_STEP: p.adamw.weight_decay = wd; break;
            case CT_OP_ADAM_STEP: p.adam.weight_decay = wd; break;
            case CT_OP_RMSPROP_STEP: p.rmsprop.weight_decay = wd; break;
            default: p.adagrad.weight_decay = wd; break;
            }
        }
        cti_call_params(&c, &p);
        st = cti_run(&c, dev_of(p0), p0->dtype);
    }
    /* Count every write: ct_copy_ counts the updated copies it writes back. */
    bool ok = st == CT_OK;
    for (int64_t e = 0; e < made; e++) {
        int64_t k = g->index[e];
        ct_tensor *w[NWRITE];
        written_of(l, kd, k, w);
        static const int tmp_of[NWRITE] = {0, 2, 3, 4, 2 + NSTATE, -1, -1};
        for (int j = 0; j < NWRITE && ok; j++) {
            if (!w[j]) continue;
            if (j == COPY_SLOT) {
                cti_autocast_copy_written(w[0], w[j]);
                continue;
            }
            ct_tensor *src = tmp_of[j] < 0 ? NULL : tmp[e][tmp_of[j]];
            if (!src) cti_bump_version(w[j]);
            else if ((st = ct_copy_(w[j], src)) != CT_OK) ok = false;
        }
        for (int j = 0; j < NTMP; j++) ct_tensor_release(tmp[e][j]);
    }
    free(tmp);
    return st;
}

static bool same_target(const cti_optim_list *l, int64_t a, int64_t b) {
    const ct_tensor *x = l->param[a], *y = l->param[b];
    const ct_tensor *cx = entry(l->copy, a), *cy = entry(l->copy, b);
    return x->dtype == y->dtype && ct_device_eq(dev_of(x), dev_of(y)) &&
           (entry(l->master, a) != NULL) == (entry(l->master, b) != NULL) &&
           (cx ? (int)cx->dtype : -1) == (cy ? (int)cy->dtype : -1) &&
           (!l->weight_decay || l->weight_decay[a] == l->weight_decay[b]);
}

/* The list's shape: arrays present for the entries that need them. */
static bool malformed(const cti_optim_list *l, const opt_kind *kd) {
    if (l->n < 0) return true;
    if (l->n == 0) return false;
    if (!l->param || !l->grad || (!l->step && !l->step_t)) return true;
    for (int b = 0; b < NSTATE; b++)
        if (kd->uses[b] && !l->state[b]) return true;
    return false;
}

static ct_status run_list(const char *op, const cti_optim_list *l, const opt_kind *kd);

/* Each float32 parameter's lasting autocast cast (cti_autocast_copy_of) is
 * written with it: the list the front end dispatches names them. */
static ct_status run(const char *op, const cti_optim_list *l, const opt_kind *kd) {
    if (!l || l->n < 1 || !l->param || !l->grad) return run_list(op, l, kd);
    ct_tensor **copy = NULL;
    for (int64_t k = 0; k < l->n; k++) {
        ct_tensor *p = l->param[k];
        ct_tensor *c = p && l->grad[k] && !entry(l->master, k) ? cti_autocast_copy_of(p) : NULL;
        if (!c) continue;
        if (!copy && !(copy = calloc((size_t)l->n, sizeof *copy)))
            return cti_error(CT_ERR_OOM, "%s: out of memory", op);
        /* a copy of another shape or device than the parameter's (its
         * storage was set afresh) is not written: autocast casts again */
        copy[k] = same_geometry_as(c, p, c->dtype) && cti_is_contiguous(c) ? c : NULL;
    }
    if (!copy) return run_list(op, l, kd);
    cti_optim_list with = *l;
    with.copy = copy;
    ct_status st = run_list(op, &with, kd);
    free(copy);
    return st;
}

static ct_status run_list(const char *op, const cti_optim_list *l, const opt_kind *kd) {
    if (!l) return cti_error(CT_ERR_INVALID_ARG, "%s: parameter list is NULL", op);
    if (malformed(l, kd))
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
    bool skip;
    ct_status st = check_found_inf(op, l, &skip);
    if (st != CT_OK || live == 0 || skip) return st;
    size_t n = (size_t)l->n;
    /* param, grad, the states, master, step_t, ctl, copy; step, index; written storages */
    ct_tensor **tv = malloc((6 + NSTATE) * n * sizeof *tv);
    int64_t *iv = malloc(2 * n * sizeof *iv);
    cti_storage **wv = malloc(NWRITE * n * sizeof *wv);
    bool *done = calloc(n, sizeof *done);
    if (!tv || !iv || !wv || !done) {
        free(tv);
        free(iv);
        free(wv);
        free(done);
        return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    }
    group g = {.param = tv,
               .grad = tv + n,
               .state = {tv + 2 * n, tv + 3 * n, tv + 4 * n},
               .master = tv + (2 + NSTATE) * n,
               .step_t = tv + (3 + NSTATE) * n,
               .ctl = tv + (4 + NSTATE) * n,
               .copy = tv + (5 + NSTATE) * n,
               .step = iv,
               .index = iv + n,
               .written = wv};
    for (int64_t k = 0; k < l->n; k++) done[k] = !l->grad[k];
    st = written_storages(op, l, kd, done, wv, &g.nwritten);
    bool prev = ct_no_grad_begin();
    for (int64_t k = 0; k < l->n && st == CT_OK; k++) {
        if (done[k]) continue;
        g.m = 0;
        for (int64_t j = k; j < l->n; j++)
            if (!done[j] && same_target(l, j, k)) {
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
    opt_kind kd = {CT_OP_SGD_STEP, {h->momentum != 0}, {"momentum buffer"}, {.sgd = *h}};
    return run(op, l, &kd);
}

ct_status cti_adamw_step(const char *op, const cti_optim_list *l, const cti_adamw_hparams *h) {
    if (!h) return cti_error(CT_ERR_INVALID_ARG, "%s: hyperparameters are NULL", op);
    opt_kind kd = {CT_OP_ADAMW_STEP, {true, true}, {"exp_avg", "exp_avg_sq"}, {.adamw = *h}};
    return run(op, l, &kd);
}

ct_status cti_adam_step(const char *op, const cti_optim_list *l, const cti_adam_hparams *h) {
    if (!h) return cti_error(CT_ERR_INVALID_ARG, "%s: hyperparameters are NULL", op);
    opt_kind kd = {CT_OP_ADAM_STEP,
                   {true, true, h->amsgrad},
                   {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
                   {.adam = *h}};
    return run(op, l, &kd);
}

ct_status cti_rmsprop_step(const char *op, const cti_optim_list *l,
                           const cti_rmsprop_hparams *h) {
    if (!h) return cti_error(CT_ERR_INVALID_ARG, "%s: hyperparameters are NULL", op);
    opt_kind kd = {CT_OP_RMSPROP_STEP,
                   {true, h->momentum > 0, h->centered},
                   {"square_avg", "momentum_buffer", "grad_avg"},
                   {.rmsprop = *h}};
    return run(op, l, &kd);
}

ct_status cti_adagrad_step(const char *op, const cti_optim_list *l,
                           const cti_adagrad_hparams *h) {
    if (!h) return cti_error(CT_ERR_INVALID_ARG, "%s: hyperparameters are NULL", op);
    opt_kind kd = {CT_OP_ADAGRAD_STEP, {true}, {"sum"}, {.adagrad = *h}};
    return run(op, l, &kd);
}
