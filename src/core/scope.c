/* Scopes: per-thread arenas of tensor handles released together. */
#include <stdlib.h>

#include "tensor_impl.h"

struct ct_scope {
    struct ct_scope *parent;
    ct_tensor **items;
    int64_t n, cap;
};

static _Thread_local ct_scope *current;

ct_scope *ct_scope_begin(void) {
    ct_scope *s = calloc(1, sizeof *s);
    if (!s) return cti_error_null(CT_ERR_OOM, "ct_scope_begin: out of memory");
    s->parent = current;
    current = s;
    return s;
}

static bool push(ct_scope *s, ct_tensor *t) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 64;
        ct_tensor **items = realloc(s->items, (size_t)cap * sizeof *items);
        if (!items) return false;
        s->items = items;
        s->cap = cap;
    }
    atomic_store_explicit(&t->scope, s, memory_order_relaxed);
    t->scope_slot = s->n;
    s->items[s->n++] = t;
    return true;
}

void cti_scope_adopt(ct_tensor *t) {
    /* Without memory to record it, the handle stays the caller's to release:
     * a leak at worst, never a double free. */
    if (current) push(current, t);
}

void cti_scope_forget(ct_tensor *t) {
    ct_scope *s = atomic_load_explicit(&t->scope, memory_order_relaxed);
    if (s && t->scope_slot >= 0 && t->scope_slot < s->n && s->items[t->scope_slot] == t)
        s->items[t->scope_slot] = NULL;
    atomic_store_explicit(&t->scope, NULL, memory_order_relaxed);
    t->scope_slot = -1;
}

/* Compares addresses only: another thread's scope may end meanwhile, and a
 * handle of an ended scope no longer points at it. */
bool cti_scope_owned_here(const ct_tensor *t) {
    ct_scope *s = atomic_load_explicit(&t->scope, memory_order_relaxed);
    if (!s) return false;
    for (ct_scope *c = current; c; c = c->parent)
        if (c == s) return true;
    return false;
}

ct_tensor *ct_keep(ct_tensor *t) {
    if (!t || !cti_scope_owned_here(t)) return t;
    ct_scope *parent = atomic_load_explicit(&t->scope, memory_order_relaxed)->parent;
    cti_scope_forget(t);
    if (parent) push(parent, t);
    return t;
}

static void release_all(ct_scope *s) {
    for (int64_t i = 0; i < s->n; i++) {
        ct_tensor *t = s->items[i];
        if (!t) continue;
        atomic_store_explicit(&t->scope, NULL, memory_order_relaxed);
        t->scope_slot = -1;
        cti_unref(t);
    }
    free(s->items);
    free(s);
}

void ct_scope_end(ct_scope *s) {
    if (!s) return;
    bool found = false;
    for (ct_scope *c = current; c; c = c->parent) found |= c == s;
    if (!found) return; /* already ended, or another thread's */
    while (current != s) {
        ct_scope *inner = current;
        current = inner->parent;
        release_all(inner);
    }
    current = s->parent;
    release_all(s);
}
