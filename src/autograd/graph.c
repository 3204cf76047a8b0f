/* Recording: autograd metadata on tensors, nodes, grad mode. */
#include <pthread.h>
#include <stdlib.h>

#include "formulas.h"

static _Thread_local bool grad_disabled; /* zero-initialized: grad mode on */

bool ct_is_grad_enabled(void) { return !grad_disabled; }

bool ct_set_grad_enabled(bool enabled) {
    bool prev = !grad_disabled;
    grad_disabled = !enabled;
    return prev;
}

bool ct_no_grad_begin(void) { return ct_set_grad_enabled(false); }
void ct_no_grad_end(bool prev) { ct_set_grad_enabled(prev); }

static _Thread_local bool recompute_on;

bool ct_is_recompute_enabled(void) { return recompute_on; }

bool ct_set_recompute_enabled(bool enabled) {
    bool prev = recompute_on;
    recompute_on = enabled;
    return prev;
}

/* ---- nodes ------------------------------------------------------------------------ */
static void node_release_saved(cti_node *n) {
    for (int k = 0; k < n->nsaved; k++) {
        ct_tensor_release(n->saved[k]);
        n->saved[k] = NULL;
    }
}

/* Frees nodes iteratively: a long chain of nodes would overflow the stack
 * if each free recursed into its producers. */
static void node_release(cti_node *n) {
    cti_node **stack = NULL;
    size_t len = 0, cap = 0;
    while (n) {
        if (atomic_fetch_sub_explicit(&n->refcount, 1, memory_order_acq_rel) == 1) {
            node_release_saved(n);
            for (int k = 0; k < CTI_AG_MAX_OUT; k++) ct_tensor_release(n->acc[k]);
            for (int k = 0; k < n->nin + n->nsaved; k++) {
                cti_node *p = k < n->nin ? n->next[k].fn : n->from[k - n->nin];
                if (k < n->nin) cti_unref(n->next[k].leaf);
                if (!p) continue;
                if (len == cap) {
                    size_t nc = cap ? cap * 2 : 16;
                    cti_node **ns = realloc(stack, nc * sizeof *ns);
                    if (!ns) { /* leak the rest rather than crash */
                        continue;
                    }
                    stack = ns;
                    cap = nc;
                }
                stack[len++] = p;
            }
            free(n);
        }
        n = len ? stack[--len] : NULL;
    }
    free(stack);
}

static void meta_free(ct_tensor *t) {
    struct ct_autograd_meta *m = t->autograd;
    t->autograd = NULL;
    if (!m) return;
    ct_tensor_release(m->grad);
    if (m->grad_fn) node_release(m->grad_fn);
    cti_unref(m->base);
    cti_unref(m->amp_copy);
    free(m);
}

static pthread_once_t hook_once = PTHREAD_ONCE_INIT;
static void install_free_hook(void) { cti_set_autograd_free_hook(meta_free); }

static struct ct_autograd_meta *meta_get(ct_tensor *t) {
    if (t->autograd) return t->autograd;
    /* Core frees records through the hook, so it must be in place before
     * the first record exists; once per process, from whichever thread
     * attaches a record first. */
    pthread_once(&hook_once, install_free_hook);
    struct ct_autograd_meta *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    t->autograd = m;
    return m;
}

ct_tensor *cti_ag_amp_copy(const ct_tensor *t, unsigned *src_version, unsigned *copy_version) {
    const struct ct_autograd_meta *m = t->autograd;
    if (!m || !m->amp_copy) return NULL;
    *src_version = m->amp_src_version;
    *copy_version = m->amp_copy_version;
    return m->amp_copy;
}

bool cti_ag_set_amp_copy(ct_tensor *t, ct_tensor *copy, unsigned src_version,
                         unsigned copy_version) {
    struct ct_autograd_meta *m = copy ? meta_get(t) : t->autograd;
    if (!m) return !copy;
    if (copy != m->amp_copy) {
        if (copy) cti_ref(copy);
        cti_unref(m->amp_copy);
        m->amp_copy = copy;
    }
    m->amp_src_version = src_version;
    m->amp_copy_version = copy_version;
    return true;
}

void cti_ag_mark_widening(ct_tensor *cast) {
    if (cast && cast->autograd && cast->autograd->grad_fn) cast->autograd->grad_fn->widen = true;
}

static ct_status view_refresh(ct_tensor *t);

bool cti_ag_needed(int n, ct_tensor *const *ts) {
    if (grad_disabled) return false;
    for (int i = 0; i < n; i++) {
        if (!ts[i] || !ts[i]->autograd) continue;
        view_refresh(ts[i]); /* a failure keeps the old history, reported when recorded */
        if (ts[i]->autograd->requires_grad) return true;
    }
    return false;
}

/* The node whose single output sv is, when a consumer saving sv may leave
 * it to recomputation: sv is that output as it was made (same geometry and
 * dtype, its storage not written since, dense from offset 0) and the node
 * can make it again. NULL otherwise. */
static cti_node *recompute_source(const ct_tensor *sv) {
    const struct ct_autograd_meta *m = sv->autograd;
    cti_node *p = m ? m->grad_fn : NULL;
    if (!p || !p->recompute || p->nout != 1 || m->output_nr != 0 || m->base) return NULL;
    if (sv->dtype != p->out_dtype[0] || sv->ndim != p->out_ndim[0] ||
        memcmp(sv->shape, p->out_shape[0], sizeof(int64_t) * (size_t)sv->ndim) != 0 ||
        sv->offset != 0 || !cti_is_contiguous(sv) ||
        atomic_load(&sv->storage->version) != p->out_version)
        return NULL;
    return p;
}

static ct_tensor *alias(ct_tensor *t) {
    /* A handle of its own, outside any scope and without history, so saving
     * it creates no reference cycle through the graph. */
    ct_tensor *a = cti_tensor_view(t, t->ndim, t->shape, t->stride, t->offset);
    if (a) cti_scope_forget(a);
    return a;
}

ct_status cti_ag_record(const cti_ag_rec *r) {
    const char *name = r->name;
    if (r->params_size > CTI_PARAMS_MAX || r->nin > CTI_AG_MAX_IN || r->nout > CTI_AG_MAX_OUT ||
        r->nsaved > CTI_AG_MAX_SAVED)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: a node takes at most %d inputs, %d outputs, %d saved tensors and %d "
                         "bytes of parameters",
                         name, CTI_AG_MAX_IN, CTI_AG_MAX_OUT, CTI_AG_MAX_SAVED, CTI_PARAMS_MAX);
    cti_node *n = calloc(1, sizeof *n);
    if (!n) return cti_error(CT_ERR_OOM, "%s: out of memory recording the graph", name);
    atomic_init(&n->refcount, 1);
    n->name = name;
    n->backward = r->backward;
    n->nin = r->nin;
    n->nout = r->nout;
    for (int k = 0; k < r->nin; k++) {
        ct_tensor *t = r->in[k];
        if (!t) continue;
        n->in_ndim[k] = t->ndim;
        memcpy(n->in_shape[k], t->shape, sizeof t->shape);
        n->in_dtype[k] = t->dtype;
        ct_status vs = view_refresh(t);
        if (vs != CT_OK) {
            node_release(n);
            return vs;
        }
        struct ct_autograd_meta *m = t->autograd;
        if (!m || !m->requires_grad) continue;
        n->needs[k] = true;
        if (m->grad_fn) {
            atomic_fetch_add(&m->grad_fn->refcount, 1);
            n->next[k].fn = m->grad_fn;
            n->next[k].output_nr = m->output_nr;
        } else {
            n->next[k].leaf = cti_ref(t);
            m->leaf_edges = true;
        }
    }
    for (int k = 0; k < r->nout; k++) {
        n->out_ndim[k] = r->out[k]->ndim;
        memcpy(n->out_shape[k], r->out[k]->shape, sizeof r->out[k]->shape);
        n->out_dtype[k] = r->out[k]->dtype;
    }
    n->nsaved = r->nsaved;
    for (int k = 0; k < r->nsaved; k++) {
        ct_tensor *sv = r->saved[k];
        if (!sv) continue;
        cti_node *src = recompute_on ? recompute_source(sv) : NULL;
        if (src) {
            atomic_fetch_add(&src->refcount, 1);
            n->from[k] = src;
            continue;
        }
        n->saved[k] = alias(sv);
        n->saved_version[k] = atomic_load(&sv->storage->version);
        if (!n->saved[k]) {
            node_release(n);
            return ct_last_status();
        }
    }
    if (r->params_size) memcpy(n->params, r->params, r->params_size);
    n->params_size = r->params_size;
    n->recompute = r->nout == 1 ? r->recompute : NULL;
    n->recompute_ctx = r->recompute_ctx;
    if (n->recompute) n->out_version = atomic_load(&r->out[0]->storage->version);
    /* Outputs: floating ones get history; integer outputs (indices) stay
     * plain, as in PyTorch. */
    for (int k = 0; k < r->nout; k++) {
        ct_tensor *o = r->out[k];
        if (!ct_dtype_is_floating(o->dtype)) continue;
        struct ct_autograd_meta *m = meta_get(o);
        if (!m) {
            node_release(n);
            return cti_error(CT_ERR_OOM, "%s: out of memory recording the graph", name);
        }
        if (m->grad_fn) node_release(m->grad_fn);
        m->requires_grad = true;
        m->grad_fn = n;
        m->output_nr = k;
        atomic_fetch_add(&n->refcount, 1);
    }
    node_release(n); /* the outputs hold it now */
    return CT_OK;
}

/* Saved tensor k of n, left to recomputation: made again by its producer
 * (or taken from another slot of n that the same producer's output filled)
 * and kept in the slot, so the formula borrows it as any saved tensor and
 * the backward frees it with the others. */
static ct_tensor *materialize(cti_node *n, int k, ct_status *st) {
    ct_tensor *t = NULL;
    for (int j = 0; j < n->nsaved && !t; j++)
        if (j != k && n->from[j] == n->from[k] && n->saved[j]) t = ct_tensor_retain(n->saved[j]);
    if (!t) t = n->from[k]->recompute(n->from[k]);
    if (!t) {
        *st = ct_last_status();
        return NULL;
    }
    n->saved[k] = t;
    n->saved_version[k] = atomic_load(&t->storage->version);
    return t;
}

ct_tensor *cti_ag_saved(cti_node *n, int k, ct_status *st) {
    *st = CT_OK;
    if (n->released) {
        *st = cti_error(CT_ERR_AUTOGRAD,
                        "ct_backward: trying to backward through the graph a second time (%s's "
                        "saved tensors were freed); pass retain_graph = true to the first call",
                        n->name);
        return NULL;
    }
    ct_tensor *t = n->saved[k];
    if (!t && n->from[k]) return materialize(n, k, st);
    if (!t) return NULL;
    unsigned v = atomic_load(&t->storage->version);
    if (v != n->saved_version[k]) {
        *st = cti_error(CT_ERR_AUTOGRAD,
                        "ct_backward: a tensor saved by %s (saved tensor %d, %s) was modified by "
                        "an in-place operation: it is at version %u, expected version %u",
                        n->name, k, cti_desc(t), v, n->saved_version[k]);
        return NULL;
    }
    return t;
}

/* ---- public tensor-level API --------------------------------------------------------- */
ct_status ct_requires_grad_(ct_tensor *t, bool requires_grad) {
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "ct_requires_grad_: tensor is NULL");
    ct_status vs = view_refresh(t);
    if (vs != CT_OK) return vs;
    if (requires_grad && !ct_dtype_is_floating(t->dtype))
        return cti_error(CT_ERR_DTYPE,
                         "ct_requires_grad_: only floating tensors can require gradients, got %s",
                         cti_desc(t));
    if (t->autograd && t->autograd->grad_fn) {
        if (!requires_grad)
            return cti_error(CT_ERR_AUTOGRAD,
                             "ct_requires_grad_: %s is not a leaf (produced by %s); use ct_detach",
                             cti_desc(t), t->autograd->grad_fn->name);
        return CT_OK;
    }
    if (!requires_grad && !t->autograd) return CT_OK;
    struct ct_autograd_meta *m = meta_get(t);
    if (!m) return cti_error(CT_ERR_OOM, "ct_requires_grad_: out of memory");
    if (requires_grad && m->base) {
        /* A view becoming a leaf leaves its base: a graph's leaf edges would
         * otherwise reach the base through it, and the base's history may
         * lead to that leaf (a reference cycle). */
        cti_unref(m->base);
        m->base = NULL;
        m->multi_output = NULL;
    }
    m->requires_grad = requires_grad;
    return CT_OK;
}

/* The readers below take const handles; a view's history is rebuilt on
 * read, in its record (not the handle), as PyTorch's grad_fn() does. */
static const ct_tensor *refreshed(const ct_tensor *t) {
    if (t && t->autograd) view_refresh((ct_tensor *)t);
    return t;
}

bool ct_requires_grad(const ct_tensor *t) {
    t = refreshed(t);
    return t && t->autograd && t->autograd->requires_grad;
}

bool ct_is_leaf(const ct_tensor *t) {
    t = refreshed(t);
    return t && !(t->autograd && t->autograd->grad_fn);
}

ct_tensor *ct_grad(const ct_tensor *t) { return t && t->autograd ? t->autograd->grad : NULL; }

void ct_zero_grad(ct_tensor *t) {
    if (!t || !t->autograd) return;
    ct_tensor_release(t->autograd->grad);
    t->autograd->grad = NULL;
}

ct_status ct_set_grad(ct_tensor *t, ct_tensor *g) {
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "ct_set_grad: tensor is NULL");
    if (g && (g->ndim != t->ndim || memcmp(g->shape, t->shape, (size_t)t->ndim * 8) != 0 ||
              g->dtype != t->dtype || !ct_device_eq(g->storage->device, t->storage->device))) {
        ct_status st = g->dtype != t->dtype ? CT_ERR_DTYPE
                       : !ct_device_eq(g->storage->device, t->storage->device) ? CT_ERR_DEVICE
                                                                              : CT_ERR_SHAPE;
        return cti_error(st, "ct_set_grad: gradient %s does not match tensor %s", cti_desc(g),
                         cti_desc(t));
    }
    struct ct_autograd_meta *m = meta_get(t);
    if (!m) return cti_error(CT_ERR_OOM, "ct_set_grad: out of memory");
    /* A handle of its own: retaining g and taking it out of its scope would
     * leave the scope's reference unreleased. */
    ct_tensor *ng = NULL;
    if (g && !(ng = alias(g))) return ct_last_status();
    ct_tensor *old = m->grad;
    m->grad = ng;
    ct_tensor_release(old);
    return CT_OK;
}

ct_status ct_set_post_accumulate_grad_hook(ct_tensor *leaf, ct_grad_hook_fn fn, void *ctx) {
    static const char op[] = "ct_set_post_accumulate_grad_hook";
    if (!leaf) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    if (!fn) {
        if (leaf->autograd) {
            leaf->autograd->hook = NULL;
            leaf->autograd->hook_ctx = NULL;
        }
        return CT_OK;
    }
    if (!ct_requires_grad(leaf) || !ct_is_leaf(leaf))
        return cti_error(CT_ERR_AUTOGRAD, "%s: %s must be a leaf that requires grad%s", op,
                         cti_desc(leaf), ct_is_leaf(leaf) ? "" : " (it is produced by an op)");
    if (leaf->autograd->hook)
        return cti_error(CT_ERR_AUTOGRAD,
                         "%s: %s already has a hook; remove it (fn NULL) before setting another",
                         op, cti_desc(leaf));
    leaf->autograd->hook = fn;
    leaf->autograd->hook_ctx = ctx;
    return CT_OK;
}

ct_tensor *ct_detach(ct_tensor *t) {
    if (!t) return cti_error_null(CT_ERR_INVALID_ARG, "ct_detach: tensor is NULL");
    return cti_tensor_view(t, t->ndim, t->shape, t->stride, t->offset);
}

const char *ct_grad_fn_name(const ct_tensor *t) {
    t = refreshed(t);
    return t && t->autograd && t->autograd->grad_fn ? t->autograd->grad_fn->name : NULL;
}

/* ---- views and in-place updates ------------------------------------------------------
 * PyTorch's scheme. A view made in grad mode knows its base (the tensor,
 * no view itself, whose storage it covers). Writing through a view rewrites
 * the base's history (CopySlices: the base's old history outside the view's
 * region, the written values inside) and makes the view's history a strided
 * view of the base's new one (AsStridedBackward). Other views of that base,
 * made before the write, hold histories that no longer describe their
 * values; like PyTorch, each rebuilds its history from its base's when it
 * is next read (an input recorded, a backward root, ct_requires_grad ...)
 * and the storage's version counter has moved since its history was set.
 * Rebuilding rather than refusing keeps PyTorch's programs working (views of
 * a buffer filled slice by slice are read after the writes), and costs one
 * comparison of two counters per read. Tensors saved for backward keep
 * their own check: their version is compared when backward reads them. */

/* Serializes rebuilding views' histories: several threads may read one view
 * at once (tensor.h), and the first to see a stale history rebuilds it. */
static pthread_mutex_t view_lock = PTHREAD_MUTEX_INITIALIZER;

static bool has_overlap(const ct_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->stride[d] == 0 && t->shape[d] > 1) return true;
    return false;
}

static void strided_params(const ct_tensor *base, const ct_tensor *view, cti_strided_params *p) {
    memset(p, 0, sizeof *p);
    memcpy(p->base_stride, base->stride, sizeof(int64_t) * (size_t)base->ndim);
    memcpy(p->view_stride, view->stride, sizeof(int64_t) * (size_t)view->ndim);
    p->view_offset = view->offset - base->offset;
    p->src_device = view->storage->device;
}

/* t's history as a strided view of its base's present one (none when the
 * base requires no grad). A base whose elements overlap is never rewritten
 * through autograd (its in-place writes are refused), so a view of it keeps
 * the history its view op recorded. */
static ct_status regenerate(ct_tensor *t, struct ct_autograd_meta *m) {
    ct_tensor *b = m->base;
    if (has_overlap(b)) return CT_OK;
    if (!b->autograd || !b->autograd->requires_grad) {
        if (m->grad_fn) node_release(m->grad_fn);
        m->grad_fn = NULL;
        m->requires_grad = false;
        return CT_OK;
    }
    cti_strided_params p;
    strided_params(b, t, &p);
    return cti_ag_record(&(cti_ag_rec){.name = "AsStridedBackward",
                                       .backward = cti_bw_as_strided,
                                       .nin = 1,
                                       .in = {b},
                                       .nout = 1,
                                       .out = {t},
                                       CTI_AG_PARAMS(&p)});
}

/* A view's history made while its base required grad, read after the base
 * stopped (ct_requires_grad_(base, false), a leaf then): it would send
 * gradients to a tensor that no longer takes them, as PyTorch's
 * AccumulateGrad of such a leaf drops them, and a write through the view
 * would give the base a node whose graph holds the base itself (a cycle
 * that is never freed). The view has no history then. */
static bool stale_view(const struct ct_autograd_meta *m) {
    const struct ct_autograd_meta *bm = m->base->autograd;
    return m->grad_fn && !(bm && (bm->requires_grad || bm->grad_fn));
}

/* Rebuilds view t's history when its storage was written since it was set,
 * or its base stopped requiring grad. */
static ct_status view_refresh(ct_tensor *t) {
    struct ct_autograd_meta *m = t->autograd;
    if (!m || !m->base) return CT_OK;
    unsigned v = atomic_load(&t->storage->version);
    if (atomic_load(&m->view_version) == v && !stale_view(m)) return CT_OK;
    pthread_mutex_lock(&view_lock);
    ct_status st = CT_OK;
    if (atomic_load(&m->view_version) != v || stale_view(m)) {
        st = regenerate(t, m);
        if (st == CT_OK) atomic_store(&m->view_version, v);
    }
    pthread_mutex_unlock(&view_lock);
    return st;
}

ct_tensor *cti_ag_view_link(ct_tensor *t, ct_tensor *v) {
    if (!v || !ct_dtype_is_floating(v->dtype)) return v;
    if (grad_disabled || t->nograd_view) {
        v->nograd_view = true;
        return v;
    }
    struct ct_autograd_meta *tm = t->autograd;
    ct_tensor *root = tm && tm->base ? tm->base : t;
    struct ct_autograd_meta *m = meta_get(v);
    if (!m) {
        ct_tensor_release(v);
        return cti_error_null(CT_ERR_OOM, "out of memory recording a view");
    }
    m->base = cti_ref(root);
    m->multi_output = tm ? tm->multi_output : NULL;
    atomic_store(&m->view_version, atomic_load(&v->storage->version));
    return v;
}

void cti_ag_mark_multi_output(ct_tensor *v, const char *op) {
    if (v && v->autograd && v->autograd->base) v->autograd->multi_output = op;
}

bool cti_ag_is_view(const ct_tensor *t) { return t && t->autograd && t->autograd->base; }

/* Whether leaf (held by a graph's edge) holds target: is it, or has it as
 * its gradient. */
static bool leaf_holds(const ct_tensor *leaf, const ct_tensor *target) {
    return leaf == target || (leaf->autograd && leaf->autograd->grad == target);
}

/* Whether the graph from node root has a leaf edge that holds target: a walk
 * over every node once (a set of the nodes seen, open addressing). */
static bool graph_holds(cti_node *root, const ct_tensor *target, bool *oom) {
    size_t cap = 64, len = 0, nstack = 1, stack_cap = 64;
    cti_node **seen = calloc(cap, sizeof *seen), **stack = malloc(sizeof *stack * stack_cap);
    bool found = false;
    *oom = !seen || !stack;
    if (!*oom) stack[0] = root;
    while (!*oom && !found && nstack) {
        cti_node *n = stack[--nstack];
        size_t h = ((uintptr_t)n >> 4) & (cap - 1);
        while (seen[h] && seen[h] != n) h = (h + 1) & (cap - 1);
        if (seen[h]) continue;
        seen[h] = n;
        if (++len * 2 > cap) { /* grow the set and rehash */
            cti_node **ns = calloc(cap * 2, sizeof *ns);
            if (!ns) {
                *oom = true;
                break;
            }
            for (size_t i = 0; i < cap; i++) {
                if (!seen[i]) continue;
                size_t g = ((uintptr_t)seen[i] >> 4) & (cap * 2 - 1);
                while (ns[g]) g = (g + 1) & (cap * 2 - 1);
                ns[g] = seen[i];
            }
            free(seen);
            seen = ns;
            cap *= 2;
        }
        for (int k = 0; k < n->nin && !found && !*oom; k++) {
            if (n->next[k].leaf && leaf_holds(n->next[k].leaf, target)) found = true;
            if (!n->next[k].fn) continue;
            if (nstack == stack_cap) {
                cti_node **st = realloc(stack, sizeof *st * stack_cap * 2);
                if (!st) {
                    *oom = true;
                    break;
                }
                stack = st;
                stack_cap *= 2;
            }
            stack[nstack++] = n->next[k].fn;
        }
    }
    free(seen);
    free(stack);
    return found;
}

/* Refuses (true, error set) an in-place write from other into target that
 * would give target a history reaching target itself: other's graph holds
 * as a leaf target, or a leaf whose gradient target is (a tensor that was a
 * leaf before ct_requires_grad_(t, false), a leaf's .grad written with a
 * function of the leaf). Such a cycle of references is never freed
 * (PyTorch warns of the same one for create_graph). */
static bool would_hold_itself(const char *op, const ct_tensor *target, ct_tensor *other) {
    const struct ct_autograd_meta *om = other ? other->autograd : NULL;
    if (!om || !om->requires_grad) return false;
    /* Only a tensor that some edge holds as a leaf, or a leaf's gradient
     * (which never has a history: the engine and ct_set_grad store plain
     * tensors, and the first write that would give it one is refused here),
     * can close such a cycle; a tensor with a history of its own that was
     * never a leaf needs no walk (a residual stream written in place). */
    const struct ct_autograd_meta *tm = target->autograd;
    if (tm && tm->grad_fn && !tm->leaf_edges) return false;
    bool oom = false;
    bool found = om->grad_fn ? graph_holds(om->grad_fn, target, &oom) : leaf_holds(other, target);
    if (oom) {
        cti_error(CT_ERR_OOM, "%s: out of memory walking the graph", op);
        return true;
    }
    if (found)
        cti_error(CT_ERR_AUTOGRAD,
                  "%s: the graph of the operand %s holds %s (as a leaf that required grad "
                  "then, or as a leaf's gradient); writing the operand into it in place would "
                  "make a cycle of references that is never freed: use the out-of-place op, "
                  "or ct_detach the operand",
                  op, cti_desc(other), cti_desc(target));
    return found;
}

int cti_ag_inplace_mode(const char *op, ct_tensor *t, ct_tensor *other) {
    if (grad_disabled || !ct_dtype_is_floating(t->dtype)) return 0;
    if (view_refresh(t) != CT_OK) return -1;
    struct ct_autograd_meta *m = t->autograd;
    bool has_grad = m && m->requires_grad;
    ct_tensor *b = m ? m->base : NULL;
    if (has_grad && !m->grad_fn && !b) {
        cti_error(CT_ERR_AUTOGRAD,
                  "%s: a leaf Variable that requires grad (%s) is being used in an in-place "
                  "operation; wrap the update in ct_no_grad_begin/ct_no_grad_end",
                  op, cti_desc(t));
        return -1;
    }
    if (!has_grad && (!other || !cti_ag_needed(1, &other))) return 0;
    if (t->nograd_view) {
        cti_error(CT_ERR_AUTOGRAD,
                  "%s: %s is a view created in no-grad mode and is being modified in place with "
                  "grad mode enabled; this is ambiguous and refused (as PyTorch does): make "
                  "both the view and the in-place update in no-grad mode (not recorded) or "
                  "both in grad mode (recorded)",
                  op, cti_desc(t));
        return -1;
    }
    if (!b) return would_hold_itself(op, t, other) ? -1 : 1;
    if (m->multi_output) {
        cti_error(CT_ERR_AUTOGRAD,
                  "%s: %s is a view returned by %s, which returns several views; such views "
                  "cannot be modified in place (as in PyTorch); use the out-of-place op, or "
                  "make the view with ct_narrow/ct_select",
                  op, cti_desc(t), m->multi_output);
        return -1;
    }
    if (b->autograd && b->autograd->requires_grad && !b->autograd->grad_fn) {
        cti_error(CT_ERR_AUTOGRAD,
                  "%s: a view of a leaf Variable that requires grad is being used in an "
                  "in-place operation (%s, produced by %s, views the leaf %s); wrap the update "
                  "in ct_no_grad_begin/ct_no_grad_end",
                  op, cti_desc(t), m->grad_fn ? m->grad_fn->name : "a view op", cti_desc(b));
        return -1;
    }
    if (has_overlap(b)) {
        cti_error(CT_ERR_AUTOGRAD,
                  "%s: %s views %s, whose elements share memory locations (strides %s); "
                  "autograd cannot record a write through it: clone the base first",
                  op, cti_desc(t), cti_desc(b), cti_shape_s(b->ndim, b->stride));
        return -1;
    }
    return would_hold_itself(op, b, other) ? -1 : 1;
}

ct_status cti_ag_rebase(ct_tensor *t, const ct_tensor *src) {
    struct ct_autograd_meta *s = src->autograd;
    if (!s || !s->grad_fn) return CT_OK;
    struct ct_autograd_meta *m = meta_get(t);
    if (!m) return cti_error(CT_ERR_OOM, "out of memory recording the graph");
    atomic_fetch_add(&s->grad_fn->refcount, 1);
    if (m->grad_fn) node_release(m->grad_fn);
    m->grad_fn = s->grad_fn;
    m->output_nr = s->output_nr;
    m->requires_grad = true;
    return CT_OK;
}

ct_status cti_ag_rebase_view(ct_tensor *t, ct_tensor *src) {
    struct ct_autograd_meta *m = t->autograd;
    ct_tensor *b = m->base;
    cti_strided_params p;
    strided_params(b, t, &p);
    /* A constant's node still needs the view's shape: a handle of t's
     * geometry without history carries it, and no edge. */
    ct_tensor *vals = src ? src : cti_tensor_view(t, t->ndim, t->shape, t->stride, t->offset);
    if (!vals) return ct_last_status();
    p.src_device = vals->storage->device;
    ct_status st = cti_ag_record(&(cti_ag_rec){.name = "CopySlices",
                                               .backward = cti_bw_copy_slices,
                                               .nin = 2,
                                               .in = {b, vals},
                                               .nout = 1,
                                               .out = {b},
                                               CTI_AG_PARAMS(&p)});
    if (!src) ct_tensor_release(vals);
    if (st != CT_OK) return st;
    pthread_mutex_lock(&view_lock);
    st = regenerate(t, m);
    if (st == CT_OK) atomic_store(&m->view_version, atomic_load(&t->storage->version));
    pthread_mutex_unlock(&view_lock);
    return st;
}

ct_status cti_ag_record_overwrite(const char *name, ct_tensor *t, ct_tensor *src) {
    ct_status st = view_refresh(t);
    if (st != CT_OK) return st;
    if (cti_ag_is_view(t)) {
        if (!src) return cti_ag_rebase_view(t, NULL);
        /* The region's gradient, summed back over src's broadcast dims by
         * expand's own backward. */
        ct_tensor *e = ct_expand(src, t->ndim, t->shape);
        st = e ? cti_ag_rebase_view(t, e) : ct_last_status();
        ct_tensor_release(e);
        return st;
    }
    cti_strided_params p = {.src_device = (src ? src : t)->storage->device};
    return cti_ag_record(&(cti_ag_rec){.name = name,
                                       .backward = cti_bw_overwrite,
                                       .nin = src ? 2 : 1,
                                       .in = {t, src},
                                       .nout = 1,
                                       .out = {t},
                                       CTI_AG_PARAMS(&p)});
}

ct_status cti_ag_check_inplace(const char *op, const ct_tensor *t) {
    t = refreshed(t);
    if (grad_disabled || !t->autograd || !t->autograd->requires_grad) return CT_OK;
    if (!t->autograd->grad_fn)
        return cti_error(CT_ERR_AUTOGRAD,
                         "%s: a leaf tensor that requires grad (%s) is being used in an in-place "
                         "operation; wrap the update in ct_no_grad_begin/ct_no_grad_end",
                         op, cti_desc(t));
    return cti_error(CT_ERR_AUTOGRAD,
                     "%s: in-place operations on tensors with history (%s, produced by %s) are "
                     "not supported; use the out-of-place op",
                     op, cti_desc(t), t->autograd->grad_fn->name);
}
