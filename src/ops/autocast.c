/* Autocast: this thread's regions, the casts an op's inputs get by the
 * policy table (autocast.h), and the cache of leaf casts.
 *
 * Everything is thread-local, as PyTorch's autocast state and cast cache
 * are: a region, its cached casts and the hold-off while an op runs belong
 * to the thread that made them, so no lock is needed. */
#include <stdlib.h>

#include "autocast.h"
#include "autograd/autograd_impl.h"
#include "core/hashmap.h"
#include "ops_impl.h"

static const struct {
    const char *name;
    cti_autocast_policy policy;
} op_table[CTI_AC_NUM_OPS] = {
#define ROW(id, name, policy) [CTI_AC_##id] = {name, CTI_AUTOCAST_##policy},
    CTI_AUTOCAST_OPS(ROW)
#undef ROW
};

/* ---- the thread's state ---------------------------------------------------------------- */

/* One device type's setting. dtype_set false: the type's default dtype. */
typedef struct dev_state {
    bool enabled, dtype_set;
    ct_dtype dtype;
} dev_state;

/* What a begin changed, for its end to restore. */
typedef struct frame {
    ct_device_type type;
    dev_state prev;
} frame;

/* A leaf's cached casts, one per region dtype (float16, bfloat16), each
 * with the storage version of the leaf it was made from. The cache holds a
 * reference on src too: its address is the key, and a freed handle's address
 * may come back as another tensor's. */
typedef struct entry {
    ct_tensor *src;
    ct_tensor *cast[2];
    unsigned version[2];
} entry;

typedef struct state {
    dev_state dev[CT_NUM_DEVICE_TYPES];
    int live; /* device types enabled now */
    int busy; /* > 0 while an op runs on inputs autocast gave it */
    frame *frames;
    int depth, cap;
    cti_hmap index; /* src -> position in entries */
    entry *entries;
    int64_t n, ncap;
    int64_t casts, hits, kept;
} state;

static _Thread_local state tls;

/* PyTorch's defaults: float16 for CUDA, bfloat16 for the CPU. */
static ct_dtype dtype_of(ct_device_type type) {
    const dev_state *s = &tls.dev[type];
    if (s->dtype_set) return s->dtype;
    return type == CT_DEVICE_CUDA ? CT_F16 : CT_BF16;
}

static bool valid_type(ct_device device) {
    return (unsigned)device.type < CT_NUM_DEVICE_TYPES;
}

static ct_status device_error(const char *op, ct_device device) {
    return cti_error(CT_ERR_DEVICE, "%s: unknown device type %d (expected CT_DEVICE_CPU or "
                     "CT_DEVICE_CUDA)", op, (int)device.type);
}

static void set_dev(ct_device_type type, dev_state s) {
    tls.live += (int)s.enabled - (int)tls.dev[type].enabled;
    tls.dev[type] = s;
}

static ct_status push(const char *op, ct_device_type type, dev_state s) {
    if (tls.depth == tls.cap) {
        int cap = tls.cap ? tls.cap * 2 : 8;
        frame *f = realloc(tls.frames, (size_t)cap * sizeof *f);
        if (!f) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
        tls.frames = f;
        tls.cap = cap;
    }
    tls.frames[tls.depth++] = (frame){.type = type, .prev = tls.dev[type]};
    set_dev(type, s);
    return CT_OK;
}

/* ---- the cache ------------------------------------------------------------------------- */

static void cache_clear(void) {
    for (int64_t i = 0; i < tls.n; i++) {
        cti_unref(tls.entries[i].cast[0]);
        cti_unref(tls.entries[i].cast[1]);
        cti_unref(tls.entries[i].src);
    }
    free(tls.entries);
    cti_hmap_clear(&tls.index);
    tls.entries = NULL;
    tls.n = tls.ncap = 0;
}

/* src's entry, made (empty) when absent; NULL when there is no memory for it. */
static entry *entry_of(ct_tensor *src) {
    if (tls.n == 0 && !tls.entries) cti_hmap_init(&tls.index, CTI_HMAP_PTR);
    int64_t k = cti_hmap_get(&tls.index, src);
    if (k >= 0) return &tls.entries[k];
    if (tls.n == tls.ncap) {
        int64_t cap = tls.ncap ? tls.ncap * 2 : 16;
        entry *e = realloc(tls.entries, (size_t)cap * sizeof *e);
        if (!e) return NULL;
        tls.entries = e;
        tls.ncap = cap;
    }
    if (!cti_hmap_put(&tls.index, src, tls.n)) return NULL;
    tls.entries[tls.n] = (entry){.src = cti_ref(src)};
    return &tls.entries[tls.n++];
}

/* Whether a cast made from src's storage version v may serve again: src not
 * written in place since, and made with autograd recording when recording
 * is on now (a cast made in no-grad mode has no edge to the leaf). */
static bool still_good(const entry *e, int slot, unsigned v) {
    const ct_tensor *c = e->cast[slot];
    return c && e->version[slot] == v && (ct_requires_grad(c) || !ct_is_grad_enabled());
}

/* ---- lasting casts -------------------------------------------------------------------------
 * A leaf's cast outlives the region on the leaf itself (its autograd
 * record, cti_ag_amp_copy): a handle on the cast's storage, valid while
 * neither the leaf's storage nor the copy's has been written since. A later
 * region makes its cast from it without a kernel, and an optimizer writes it
 * with the parameter (cti_autocast_update_copy), so the casts of a training
 * step's weights cost nothing after the first step. */
static atomic_bool lasting_off; /* the default is on */

static unsigned version_of(const ct_tensor *t) {
    return atomic_load_explicit(&t->storage->version, memory_order_relaxed);
}

/* src's lasting copy when it holds src's current values, else NULL. */
static ct_tensor *current_copy(const ct_tensor *src) {
    unsigned sv, cv;
    ct_tensor *c = cti_ag_amp_copy(src, &sv, &cv);
    return c && sv == version_of(src) && cv == version_of(c) ? c : NULL;
}

/* That copy when it is in dtype to. */
static ct_tensor *valid_copy(const ct_tensor *src, ct_dtype to) {
    ct_tensor *c = current_copy(src);
    return c && c->dtype == to ? c : NULL;
}

/* Keeps c (src cast to c's dtype from src's storage version v) as src's
 * lasting copy. Best effort: without memory src simply keeps none. */
static void keep_copy(ct_tensor *src, const ct_tensor *c, unsigned v) {
    ct_tensor *h = cti_tensor_view(c, c->ndim, c->shape, c->stride, c->offset);
    if (!h) {
        ct_clear_error();
        return;
    }
    if (cti_scope_owned_here(h)) cti_scope_forget(h);
    if (!cti_ag_set_amp_copy(src, h, v, version_of(h))) cti_ag_set_amp_copy(src, NULL, 0, 0);
    cti_unref(h);
}

void ct_autocast_set_lasting_casts(bool on) { atomic_store(&lasting_off, !on); }
bool ct_autocast_lasting_casts(void) { return !atomic_load(&lasting_off); }

ct_tensor *cti_autocast_copy_of(const ct_tensor *p) {
    if (atomic_load_explicit(&lasting_off, memory_order_relaxed) || p->dtype != CT_F32)
        return NULL;
    return current_copy(p);
}

void cti_autocast_copy_written(ct_tensor *p, ct_tensor *copy) {
    cti_bump_version(copy);
    cti_ag_set_amp_copy(p, copy, version_of(p), version_of(copy));
}

/* The cast of leaf src to the region dtype to, from the cache or made and
 * cached. Without memory to cache it, the cast serves this call only
 * (*temp). */
static ct_tensor *cached_cast(ct_tensor *src, ct_dtype to, ct_tensor **temp) {
    int slot = to == CT_BF16;
    unsigned v = version_of(src);
    entry *e = entry_of(src);
    if (e && still_good(e, slot, v)) {
        tls.hits++;
        return e->cast[slot];
    }
    bool lasting = !atomic_load_explicit(&lasting_off, memory_order_relaxed);
    ct_tensor *kept = lasting ? valid_copy(src, to) : NULL;
    unsigned sv, cv;
    if (!lasting && cti_ag_amp_copy(src, &sv, &cv)) cti_ag_set_amp_copy(src, NULL, 0, 0);
    ct_tensor *c = kept ? cti_cast_from_copy(src, kept) : ct_to_dtype(src, to);
    if (!c) return NULL;
    if (kept) tls.kept++;
    else tls.casts++;
    if (lasting && !kept) keep_copy(src, c, v);
    if (!e) return *temp = c;
    /* The cache holds the creation reference: no scope may release it. */
    if (cti_scope_owned_here(c)) cti_scope_forget(c);
    cti_unref(e->cast[slot]);
    e->cast[slot] = c;
    e->version[slot] = v;
    return c;
}

/* ---- casting an op's inputs ------------------------------------------------------------- */

static bool eligible(const ct_tensor *t, ct_device_type type) {
    return t && t->storage->device.type == type &&
           (t->dtype == CT_F32 || t->dtype == CT_F16 || t->dtype == CT_BF16);
}

/* The dtype policy casts eligible inputs to; CT_NUM_DTYPES: none. */
static ct_dtype target(cti_autocast_policy policy, ct_dtype lower, ct_device_type type, int n,
                       ct_tensor *const *in) {
    switch (policy) {
    case CTI_AUTOCAST_LOWER: return lower;
    case CTI_AUTOCAST_FP32: return CT_F32;
    case CTI_AUTOCAST_PROMOTE: {
        ct_dtype to = lower;
        for (int i = 0; i < n; i++)
            if (eligible(in[i], type)) to = ct_promote_types(to, in[i]->dtype);
        return to;
    }
    case CTI_AUTOCAST_FIRST:
    case CTI_AUTOCAST_FIRST_READS_F32:
        return eligible(in[0], type) ? in[0]->dtype : CT_NUM_DTYPES;
    }
    return CT_NUM_DTYPES;
}

/* t as the op gets it: t itself, or its cast (cached as PyTorch's
 * cached_cast decides: a float32 leaf that requires grad, cast to the
 * region's dtype). */
static ct_tensor *cast_input(ct_tensor *t, ct_dtype to, ct_dtype lower, ct_tensor **temp) {
    ct_tensor *c;
    if (t->dtype == CT_F32 && to == lower && ct_is_leaf(t) && ct_requires_grad(t)) {
        c = cached_cast(t, to, temp);
    } else {
        c = *temp = ct_to_dtype(t, to);
        if (c) tls.casts++;
    }
    /* Nobody but the op sees a cast made here, so its gradient may come
     * back in t's dtype, unrounded (cti_ag_mark_widening). */
    if (c && ct_dtype_size(to) < ct_dtype_size(t->dtype)) cti_ag_mark_widening(c);
    return c;
}

bool cti_autocast_reads_as_is(const ct_tensor *t) {
    if (!tls.live || tls.busy || !t || (t->dtype != CT_F16 && t->dtype != CT_BF16)) return false;
    ct_device_type type = t->storage->device.type;
    return valid_type(t->storage->device) && tls.dev[type].enabled;
}

bool cti_autocast_begin_op(cti_autocast_call *ac, cti_autocast_op op, int n,
                           ct_tensor *const *in) {
    if (!tls.live || tls.busy) return false;
    assert(n <= CTI_AUTOCAST_MAX_IN);
    const ct_tensor *first = NULL;
    for (int i = 0; i < n && !first; i++) first = in[i];
    if (!first) return false;
    ct_device_type type = first->storage->device.type;
    if (!tls.dev[type].enabled) return false;

    ac->n = n;
    ac->ok = true;
    ac->dtype = dtype_of(type);
    cti_autocast_policy policy = op_table[op].policy;
    ct_dtype to = target(policy, ac->dtype, type, n, in);
    bool keep32 = policy == CTI_AUTOCAST_FIRST_READS_F32 && (to == CT_F16 || to == CT_BF16);
    for (int i = 0; i < n; i++) {
        ac->temp[i] = NULL;
        ac->in[i] = in[i];
        if (!ac->ok || to == CT_NUM_DTYPES || !eligible(in[i], type) || in[i]->dtype == to ||
            (keep32 && i > 0 && in[i]->dtype == CT_F32))
            continue;
        ac->in[i] = cast_input(in[i], to, ac->dtype, &ac->temp[i]);
        if (!ac->in[i]) {
            ac->ok = false;
            cti_error(ct_last_status(), "%s: autocast of %s to %s failed: %s",
                      op_table[op].name, cti_desc(in[i]), ct_dtype_name(to), ct_last_error());
        }
    }
    tls.busy++;
    return true;
}

ct_tensor *cti_autocast_end_op(cti_autocast_call *ac, ct_tensor *result) {
    for (int i = 0; i < ac->n; i++) ct_tensor_release(ac->temp[i]);
    tls.busy--;
    return result;
}

void cti_autocast_hold(void) { tls.busy++; }
void cti_autocast_resume(void) { tls.busy--; }

void cti_autocast_counts(int64_t *casts, int64_t *hits) {
    *casts = tls.casts;
    *hits = tls.hits;
}

int64_t cti_autocast_kept_count(void) { return tls.kept; }

/* ---- public ----------------------------------------------------------------------------- */

ct_status ct_autocast_begin(ct_device device, ct_dtype dtype) {
    static const char op[] = "ct_autocast_begin";
    if (!valid_type(device)) return device_error(op, device);
    if (dtype != CT_F16 && dtype != CT_BF16) {
        char d[32];
        return cti_error(CT_ERR_DTYPE, "%s: dtype %s is not supported for %s (expected float16 "
                         "or bfloat16)", op, ct_dtype_name(dtype),
                         ct_device_str(device, d, sizeof d));
    }
    return push(op, device.type, (dev_state){.enabled = true, .dtype_set = true, .dtype = dtype});
}

ct_status ct_autocast_begin_disabled(ct_device device) {
    static const char op[] = "ct_autocast_begin_disabled";
    if (!valid_type(device)) return device_error(op, device);
    dev_state s = tls.dev[device.type];
    s.enabled = false;
    return push(op, device.type, s);
}

ct_status ct_autocast_end(void) {
    if (tls.depth == 0)
        return cti_error(CT_ERR_INVALID_ARG, "ct_autocast_end: no autocast region is open on this "
                         "thread (an end without its ct_autocast_begin)");
    frame f = tls.frames[--tls.depth];
    set_dev(f.type, f.prev);
    if (tls.depth == 0) {
        /* the outermost region: its casts go, as PyTorch clears its cache
         * when the last autocast context exits */
        cache_clear();
        free(tls.frames);
        tls.frames = NULL;
        tls.cap = 0;
    }
    return CT_OK;
}

bool ct_autocast_enabled(ct_device device) {
    return valid_type(device) && tls.dev[device.type].enabled;
}

ct_dtype ct_autocast_dtype(ct_device device) {
    if (!valid_type(device)) {
        device_error("ct_autocast_dtype", device);
        return CT_NUM_DTYPES;
    }
    return dtype_of(device.type);
}
