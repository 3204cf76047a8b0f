/* The backward pass: reverse topological walk over the recorded graph. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "autograd_impl.h"

ct_tensor *cti_sum_to_shape(ct_tensor *g, int ndim, const int64_t *shape) {
    if (g->ndim == ndim && memcmp(g->shape, shape, (size_t)ndim * sizeof(int64_t)) == 0)
        return ct_tensor_retain(g);
    /* Leading dims the input lacked, and dims where it had size 1. */
    int64_t dims[CT_MAX_DIMS];
    int nd = 0, lead = g->ndim - ndim;
    for (int d = 0; d < g->ndim; d++) {
        if (d < lead || (shape[d - lead] == 1 && g->shape[d] != 1)) dims[nd++] = d;
    }
    ct_tensor *s = nd ? ct_sum(g, nd, dims, true) : ct_tensor_retain(g);
    if (!s) return NULL;
    ct_tensor *r = ct_reshape(s, ndim, shape);
    ct_tensor_release(s);
    return r;
}

typedef struct vec {
    cti_node **v;
    size_t n, cap;
} vec;

static bool vec_push(vec *a, cti_node *n) {
    if (a->n == a->cap) {
        size_t c = a->cap ? a->cap * 2 : 64;
        cti_node **v = realloc(a->v, c * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = c;
    }
    a->v[a->n++] = n;
    return true;
}

/* Backward passes since start: names a pass in the leaves' hook counts. */
static atomic_uint_fast64_t passes;

/* The leaf that edge k of n delivers a gradient to and that has a hook, or
 * NULL. */
static ct_tensor *hooked_leaf(const cti_node *n, int k) {
    ct_tensor *l = n->next[k].leaf;
    return l && n->needs[k] && l->autograd && l->autograd->hook ? l : NULL;
}

/* Counts a hooked leaf's incoming edge for pass. */
static void count_hook_edge(ct_tensor *leaf, uint64_t pass) {
    struct ct_autograd_meta *m = leaf->autograd;
    if (m->hook_pass != pass) {
        m->hook_pass = pass;
        m->hook_pending = 0;
    }
    m->hook_pending++;
}

/* After an edge of pass delivered (or not) its gradient to leaf: runs the
 * hook when that was the leaf's last edge of the pass. */
static ct_status edge_done(ct_tensor *leaf, uint64_t pass) {
    struct ct_autograd_meta *m = leaf->autograd;
    if (m->hook_pass != pass || --m->hook_pending > 0 || !m->hook) return CT_OK;
    return m->hook(leaf, m->hook_ctx);
}

/* Collects every node reachable from root and counts, for each, the edges
 * that reach it from other collected nodes, and for each leaf with a hook
 * the edges that reach it. */
static ct_status collect(cti_node *root, vec *all, uint64_t pass) {
    vec stack = {0};
    root->deps = 0;
    root->queued = true;
    if (!vec_push(all, root) || !vec_push(&stack, root)) goto oom;
    while (stack.n) {
        cti_node *n = stack.v[--stack.n];
        for (int k = 0; k < n->nin; k++) {
            ct_tensor *hooked = hooked_leaf(n, k);
            if (hooked) count_hook_edge(hooked, pass);
            cti_node *p = n->next[k].fn;
            if (!p) continue;
            if (!p->queued) {
                p->queued = true;
                p->deps = 0;
                if (!vec_push(all, p) || !vec_push(&stack, p)) goto oom;
            }
            p->deps++;
        }
    }
    free(stack.v);
    return CT_OK;
oom:
    free(stack.v);
    return cti_error(CT_ERR_OOM, "ct_backward: out of memory walking the graph");
}

/* acc += g, replacing *acc (both owned). */
static ct_status accumulate(ct_tensor **acc, ct_tensor *g) {
    if (!*acc) {
        *acc = g;
        return CT_OK;
    }
    ct_tensor *s = ct_add(*acc, g);
    ct_tensor_release(g);
    if (!s) return ct_last_status();
    ct_tensor_release(*acc);
    *acc = s;
    return CT_OK;
}

ct_dtype cti_ag_grad_dtype(const cti_node *n, int k) {
    const cti_edge *e = &n->next[k];
    const cti_node *c = e->fn;
    /* deps still counts n's edge: 1 means no other producer is left, and an
     * empty acc that none came before. Summing a wide and a narrow gradient
     * would need a conversion, which is what this saves. */
    if (!c || !c->widen || c->deps != 1 || c->acc[e->output_nr]) return n->in_dtype[k];
    return c->in_dtype[0];
}

/* Brings a formula's gradient for input k of n to the input's shape and
 * dtype (or the wider dtype cti_ag_grad_dtype allowed, when it is in it). */
static ct_tensor *fit(const cti_node *n, int k, ct_tensor *g) {
    ct_tensor *s = cti_sum_to_shape(g, n->in_ndim[k], n->in_shape[k]);
    ct_tensor_release(g);
    if (!s || s->dtype == n->in_dtype[k] || s->dtype == cti_ag_grad_dtype(n, k)) return s;
    ct_tensor *c = ct_to_dtype(s, n->in_dtype[k]);
    ct_tensor_release(s);
    return c;
}

/* Leaf gradients outlive the backward call and must never alias a tensor the
 * caller or a formula still holds, so the first one is cloned. */
/* True when g's handle and storage are held only by this reference (a scope
 * listing g does not add one) and g covers its whole storage densely:
 * nothing else can see its data, so it can become a leaf's .grad as it is,
 * as PyTorch steals such a gradient. */
static bool sole_owner(const ct_tensor *g) {
    return atomic_load(&g->refcount) == 1 && !g->autograd &&
           atomic_load(&g->storage->refcount) == 1 && g->offset == 0 && cti_is_contiguous(g) &&
           g->storage->nbytes == (size_t)cti_numel(g->ndim, g->shape) * ct_dtype_size(g->dtype);
}

static ct_status leaf_accumulate(ct_tensor *leaf, ct_tensor *g) {
    struct ct_autograd_meta *m = leaf->autograd;
    if (!m->grad && sole_owner(g)) {
        /* A scope open around backward lists g, but the reference is this
         * one: the leaf takes it over, as it does a clone below. */
        cti_scope_forget(g);
        m->grad = g;
        return CT_OK;
    }
    ct_tensor *s = m->grad ? ct_add(m->grad, g) : ct_clone(g);
    ct_tensor_release(g);
    if (!s) return ct_last_status();
    cti_scope_forget(s);
    ct_tensor_release(m->grad);
    m->grad = s;
    return CT_OK;
}

/* Frees n's saved tensors: its formula will not run again. */
static void release_saved(cti_node *n) {
    for (int j = 0; j < n->nsaved; j++) {
        ct_tensor_release(n->saved[j]);
        n->saved[j] = NULL;
    }
    n->released = true;
}

static ct_status run_node(cti_node *n, vec *ready, uint64_t pass, bool retain_graph) {
    ct_tensor *gin[CTI_AG_MAX_IN] = {NULL};
    ct_status st = n->backward(n, n->acc, gin);
    for (int k = 0; k < CTI_AG_MAX_OUT; k++) {
        ct_tensor_release(n->acc[k]);
        n->acc[k] = NULL;
    }
    /* As soon as the formula has run, as PyTorch frees a node's saved
     * variables: the activations go one by one while the gradients come,
     * instead of all of them staying to the end of the backward. */
    if (st == CT_OK && !retain_graph) release_saved(n);
    for (int k = 0; k < n->nin; k++) {
        ct_tensor *g = gin[k];
        cti_edge *e = &n->next[k];
        if (st == CT_OK && g && n->needs[k]) {
            g = fit(n, k, g);
            if (!g) st = ct_last_status();
            else if (e->fn) {
                st = accumulate(&e->fn->acc[e->output_nr], g);
            } else if (e->leaf) {
                st = leaf_accumulate(e->leaf, g);
            } else {
                ct_tensor_release(g);
            }
        } else {
            ct_tensor_release(g);
        }
        ct_tensor *hooked = hooked_leaf(n, k);
        if (hooked && st == CT_OK) st = edge_done(hooked, pass);
        if (e->fn && --e->fn->deps == 0 && !vec_push(ready, e->fn))
            st = st ? st : cti_error(CT_ERR_OOM, "ct_backward: out of memory");
    }
    return st;
}

/* Formulas are made of public ops: with an autocast region open they would
 * be cast again, so the engine closes every enabled device type for its
 * run (a region of its own, ended on return). Each gradient then runs in
 * the dtype its forward recorded, as PyTorch's backward ops do. Returns
 * how many regions it opened, or -1 with the error set. */
static int autocast_off(void) {
    int opened = 0;
    for (int t = 0; t < CT_NUM_DEVICE_TYPES; t++) {
        ct_device d = {(ct_device_type)t, 0};
        if (!ct_autocast_enabled(d)) continue;
        if (ct_autocast_begin_disabled(d) != CT_OK) {
            while (opened--) ct_autocast_end();
            return -1;
        }
        opened++;
    }
    return opened;
}

static ct_status backward(ct_tensor *out, ct_tensor *grad_out, bool retain_graph);

ct_status ct_backward(ct_tensor *out, ct_tensor *grad_out, bool retain_graph) {
    int opened = autocast_off();
    if (opened < 0) return ct_last_status();
    ct_status st = backward(out, grad_out, retain_graph);
    while (opened--) ct_autocast_end();
    return st;
}

static ct_status backward(ct_tensor *out, ct_tensor *grad_out, bool retain_graph) {
    if (!out) return cti_error(CT_ERR_INVALID_ARG, "ct_backward: tensor is NULL");
    if (!ct_requires_grad(out))
        return cti_error(CT_ERR_AUTOGRAD,
                         "ct_backward: %s does not require grad and has no grad_fn (mark a leaf "
                         "with ct_requires_grad_)",
                         cti_desc(out));
    bool prev = ct_set_grad_enabled(false);
    ct_scope *scope = ct_scope_begin(); /* the engine's temporaries */
    ct_status st = CT_OK;
    ct_tensor *g;
    if (!grad_out) {
        if (cti_numel(out->ndim, out->shape) != 1) {
            st = cti_error(CT_ERR_SHAPE,
                           "ct_backward: grad can be implicitly created only for one-element "
                           "outputs, got %s; pass grad_out",
                           cti_desc(out));
            goto done;
        }
        g = ct_tensor_ones_like(out);
    } else {
        if (!ct_dtype_is_floating(grad_out->dtype)) {
            /* PyTorch refuses it too: an integer gradient is a caller's slip,
             * and converting it would hide the slip. */
            st = cti_error(CT_ERR_DTYPE,
                           "ct_backward: grad_out must have a floating dtype, got %s (output %s)",
                           cti_desc(grad_out), cti_desc(out));
            goto done;
        }
        if (grad_out->ndim != out->ndim ||
            memcmp(grad_out->shape, out->shape, (size_t)out->ndim * 8) != 0 ||
            !ct_device_eq(grad_out->storage->device, out->storage->device)) {
            st = cti_error(CT_ERR_SHAPE, "ct_backward: grad_out %s does not match output %s",
                           cti_desc(grad_out), cti_desc(out));
            goto done;
        }
        /* A handle of the engine's own either way: the caller's handle may
         * belong to the caller's scope, and the engine's releases must not
         * stand for that scope's. */
        g = grad_out->dtype == out->dtype
                ? cti_tensor_view(grad_out, grad_out->ndim, grad_out->shape, grad_out->stride,
                                  grad_out->offset)
                : ct_to_dtype(grad_out, out->dtype);
    }
    if (!g) {
        st = ct_last_status();
        goto done;
    }
    struct ct_autograd_meta *m = out->autograd;
    uint64_t pass = atomic_fetch_add_explicit(&passes, 1, memory_order_relaxed) + 1;
    if (!m->grad_fn) { /* out is a leaf */
        st = leaf_accumulate(out, ct_tensor_retain(g));
        ct_tensor_release(g);
        if (st == CT_OK && m->hook) {
            count_hook_edge(out, pass);
            st = edge_done(out, pass);
        }
        goto done;
    }
    cti_node *root = m->grad_fn;
    if (root->released) {
        ct_tensor_release(g);
        st = cti_error(CT_ERR_AUTOGRAD,
                       "ct_backward: trying to backward through the graph a second time (%s's "
                       "saved tensors were freed); pass retain_graph = true to the first call",
                       root->name);
        goto done;
    }
    vec all = {0}, ready = {0};
    st = collect(root, &all, pass);
    if (st == CT_OK) {
        root->acc[m->output_nr] = ct_tensor_retain(g);
        if (!vec_push(&ready, root)) st = cti_error(CT_ERR_OOM, "ct_backward: out of memory");
    }
    ct_tensor_release(g);
    while (st == CT_OK && ready.n) {
        cti_node *n = ready.v[--ready.n];
        st = run_node(n, &ready, pass, retain_graph);
    }
    for (size_t k = 0; k < all.n; k++) {
        cti_node *n = all.v[k];
        n->queued = false;
        for (int j = 0; j < CTI_AG_MAX_OUT; j++) {
            ct_tensor_release(n->acc[j]);
            n->acc[j] = NULL;
        }
        if (!retain_graph && st == CT_OK) release_saved(n);
    }
    free(all.v);
    free(ready.v);
done:
    ct_scope_end(scope);
    ct_set_grad_enabled(prev);
    return st;
}

/* ---- gradcheck ------------------------------------------------------------------------ */
static ct_status eval_proj(ct_gradcheck_fn fn, void *ctx, ct_tensor *const *inputs,
                           const double *r, int64_t nr, double *out) {
    ct_tensor *y = fn(inputs, ctx);
    if (!y) return ct_last_status();
    ct_tensor *y64 = ct_to_dtype(y, CT_F64);
    ct_tensor_release(y);
    if (!y64) return ct_last_status();
    if (ct_tensor_numel(y64) != nr) {
        ct_tensor_release(y64);
        return cti_error(CT_ERR_SHAPE, "ct_gradcheck: fn changed its output size");
    }
    double *buf = malloc((size_t)(nr ? nr : 1) * sizeof *buf);
    if (!buf) {
        ct_tensor_release(y64);
        return cti_error(CT_ERR_OOM, "ct_gradcheck: out of memory");
    }
    ct_status st = ct_tensor_copy_to_host(y64, buf, (size_t)nr * sizeof *buf);
    double s = 0;
    for (int64_t k = 0; k < nr; k++) s += buf[k] * r[k];
    *out = s;
    free(buf);
    ct_tensor_release(y64);
    return st;
}

/* Reads/writes element k (row-major) of a contiguous-or-not f64 CPU tensor. */
static double *elem_ptr(ct_tensor *t, int64_t k) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t idx = k % t->shape[d];
        k /= t->shape[d];
        off += idx * t->stride[d];
    }
    return (double *)cti_data(t) + off;
}

ct_status ct_gradcheck(ct_gradcheck_fn fn, void *ctx, int n, ct_tensor *const *inputs,
                       double eps, double atol, double rtol) {
    if (!fn) return cti_error(CT_ERR_INVALID_ARG, "ct_gradcheck: fn is NULL");
    if (n < 0)
        return cti_error(CT_ERR_INVALID_ARG, "ct_gradcheck: n must be >= 0, got %d", n);
    if (n > 0 && !inputs)
        return cti_error(CT_ERR_INVALID_ARG, "ct_gradcheck: inputs is NULL for %d inputs", n);
    for (int k = 0; k < n; k++) {
        if (!inputs[k]) return cti_error(CT_ERR_INVALID_ARG, "ct_gradcheck: input %d is NULL", k);
        if (ct_requires_grad(inputs[k]) &&
            (inputs[k]->dtype != CT_F64 || inputs[k]->storage->device.type != CT_DEVICE_CPU))
            return cti_error(CT_ERR_DTYPE,
                             "ct_gradcheck: input %d is %s; gradcheck needs float64 CPU inputs", k,
                             cti_desc(inputs[k]));
    }
    ct_scope *scope = ct_scope_begin();
    ct_status st = CT_OK;
    double *r = NULL;
    /* A NULL result is judged by what fn itself reported, not by an error
     * left from before the call. */
    ct_clear_error();
    ct_tensor *y = fn(inputs, ctx);
    if (!y) {
        st = ct_last_status();
        if (st == CT_OK)
            st = cti_error(CT_ERR_INVALID_ARG,
                           "ct_gradcheck: fn returned NULL without reporting an error");
        goto done;
    }
    int64_t nr = ct_tensor_numel(y);
    r = malloc((size_t)(nr ? nr : 1) * sizeof *r);
    if (!r) {
        st = cti_error(CT_ERR_OOM, "ct_gradcheck: out of memory");
        goto done;
    }
    /* A fixed pseudo-random projection with no symmetry to hide errors. */
    for (int64_t k = 0; k < nr; k++) r[k] = 0.5 + (double)ct_philox(0x5eed, (uint64_t)k) / 4294967296.0;
    ct_tensor *rt = ct_tensor_from_data(r, CT_F64, y->ndim, y->shape);
    ct_tensor *go = rt && y->dtype != CT_F64 ? ct_to_dtype(rt, y->dtype) : rt;
    for (int k = 0; k < n; k++) ct_zero_grad(inputs[k]);
    if (!go || (st = ct_backward(y, go, false)) != CT_OK) {
        st = st ? st : ct_last_status();
        goto done;
    }
    bool prev = ct_set_grad_enabled(false);
    for (int k = 0; k < n && st == CT_OK; k++) {
        ct_tensor *x = inputs[k];
        if (!ct_requires_grad(x)) continue;
        ct_tensor *gx = ct_grad(x);
        ct_tensor *g64 = gx ? ct_contiguous(gx) : NULL;
        int64_t m = ct_tensor_numel(x);
        for (int64_t e = 0; e < m && st == CT_OK; e++) {
            double *p = elem_ptr(x, e);
            double orig = *p, fp, fm;
            *p = orig + eps;
            st = eval_proj(fn, ctx, inputs, r, nr, &fp);
            *p = orig - eps;
            if (st == CT_OK) st = eval_proj(fn, ctx, inputs, r, nr, &fm);
            *p = orig;
            if (st != CT_OK) break;
            double num = (fp - fm) / (2 * eps);
            double ana = g64 ? ((double *)cti_data(g64))[e] : 0.0;
            if (!(fabs(ana - num) <= atol + rtol * fabs(num)))
                st = cti_error(CT_ERR_AUTOGRAD,
                               "ct_gradcheck: gradient mismatch for input %d %s element %lld: "
                               "analytic %.10g, numeric %.10g",
                               k, cti_desc(x), (long long)e, ana, num);
        }
    }
    ct_set_grad_enabled(prev);
done:
    free(r);
    ct_scope_end(scope);
    return st;
}
