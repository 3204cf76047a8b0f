/* Data-parallel training (tensor/dist.h: ct_ddp_*), as PyTorch's
 * DistributedDataParallel and, with zero1, ZeroRedundancyOptimizer.
 *
 * The parameters that require grad are laid out, in reverse order of the
 * list, in buckets of one dtype and device, each with a flat buffer holding
 * a view per parameter. A post-accumulate-grad hook on every parameter
 * marks it ready during ct_ddp_backward; when all of a bucket's parameters
 * are, and every bucket before it has started, its gradients are copied
 * into the flat buffer and its reduction starts (an all-reduce, or with
 * zero1 a reduce-scatter into this rank's shard), so every rank starts the
 * same collectives in the same order whatever order its backward produced
 * the gradients in. After the pass the remaining buckets start (gradients
 * backward did not produce count as zeros), all are finished, and the
 * averages go back into the parameters' gradients (zero1: into the shards'). */
#include <stdio.h>
#include <stdlib.h>

#include "dist_impl.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

#define DEFAULT_BUCKET_MB 25.0

typedef struct bucket {
    ct_dtype dtype;
    ct_device device;
    int64_t first, count; /* its slots */
    int64_t numel, padded; /* padded: numel rounded up to a multiple of the world (zero1) */
    ct_tensor *flat;       /* [padded]: gradients in, averaged gradients out (zero1: the
                              gathered parameters after a step) */
    ct_tensor *shard;      /* zero1: this rank's [padded / world] of the parameters, a leaf
                              the optimizer updates */
    ct_tensor *shard_grad; /* zero1: its averaged gradient */
    int64_t ready;         /* slots ready in this pass */
    bool started;
    cti_dist_work *work;
    int64_t early; /* passes that started it during backward */
} bucket;

typedef struct slot {
    struct ct_ddp *ddp;
    ct_tensor *p;    /* the parameter (a reference of the list's) */
    ct_tensor *view; /* its place in the bucket's flat buffer, in its shape */
    int64_t bucket;
    bool ready, had_grad;
    bool hooked; /* the hook on p is this object's */
} slot;

struct ct_ddp {
    ct_params *params; /* the caller's parameters, in a list of this object's */
    ct_params *optim;  /* zero1: the shards; else params */
    slot *slots;
    int64_t nslots;
    bucket *buckets;
    int64_t nbuckets, next; /* next: the bucket to start next in this pass */
    bool zero1, find_unused, sync, in_pass;
    ct_status pass_status;
};

static int world(void) { return ct_dist_world_size(); }

/* ---- building ---------------------------------------------------------------------------- */
static ct_status copy_params(const char *op, const ct_params *src, ct_params *dst) {
    for (int64_t k = 0; k < ct_params_count(src); k++) {
        const char *name;
        ct_tensor *t = ct_params_get(src, k, &name);
        if (!t) return ct_last_status();
        ct_status st = ct_params_add(dst, name, t);
        if (st != CT_OK) return st;
    }
    (void)op;
    return CT_OK;
}

/* Slots: the parameters that require grad, last first. */
static ct_status make_slots(const char *op, ct_ddp *d) {
    int64_t n = ct_params_count(d->params);
    d->slots = calloc((size_t)(n ? n : 1), sizeof *d->slots);
    if (!d->slots) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    for (int64_t k = n - 1; k >= 0; k--) {
        ct_tensor *p = ct_params_get(d->params, k, NULL);
        if (!ct_requires_grad(p)) continue;
        d->slots[d->nslots++] = (slot){.ddp = d, .p = p, .bucket = -1};
    }
    return CT_OK;
}

static ct_status make_buckets(const char *op, ct_ddp *d, double bucket_mb) {
    d->buckets = calloc((size_t)(d->nslots ? d->nslots : 1), sizeof *d->buckets);
    if (!d->buckets) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    double cap = bucket_mb * 1048576.0;
    double bytes = 0;
    for (int64_t k = 0; k < d->nslots; k++) {
        ct_tensor *p = d->slots[k].p;
        double pb = (double)ct_tensor_numel(p) * (double)ct_dtype_size(p->dtype);
        bucket *b = d->nbuckets ? &d->buckets[d->nbuckets - 1] : NULL;
        if (!b || b->dtype != p->dtype || !ct_device_eq(b->device, p->storage->device) ||
            bytes + pb > cap) {
            b = &d->buckets[d->nbuckets++];
            *b = (bucket){.dtype = p->dtype, .device = p->storage->device, .first = k};
            bytes = 0;
        }
        d->slots[k].bucket = d->nbuckets - 1;
        b->count++;
        b->numel += ct_tensor_numel(p);
        bytes += pb;
    }
    return CT_OK;
}

/* A tensor this object owns (outside any scope), or NULL. */
static ct_tensor *owned(ct_tensor *t) {
    if (t) cti_scope_forget(t);
    return t;
}

/* The flat buffer of b, its slots' views into it filled with the
 * parameters' values, and with zero1 this rank's shard of it. */
static ct_status fill_bucket(ct_ddp *d, bucket *b) {
    int w = world();
    b->padded = d->zero1 ? (b->numel + w - 1) / w * w : b->numel;
    if (!(b->flat = owned(ct_tensor_zeros(1, &b->padded, b->dtype, b->device))))
        return ct_last_status();
    int64_t at = 0;
    for (int64_t k = b->first; k < b->first + b->count; k++) {
        slot *s = &d->slots[k];
        int64_t n = ct_tensor_numel(s->p);
        ct_tensor *part = ct_narrow(b->flat, 0, at, n);
        s->view = part ? owned(ct_view(part, s->p->ndim, s->p->shape)) : NULL;
        ct_tensor_release(part);
        /* The buffer carries values for communication, not history. */
        bool prev = ct_no_grad_begin();
        ct_status cs = s->view ? ct_copy_(s->view, s->p) : ct_last_status();
        ct_no_grad_end(prev);
        if (cs != CT_OK) return cs;
        at += n;
    }
    if (!d->zero1) return CT_OK;
    int64_t k = b->padded / w;
    ct_tensor *mine = ct_narrow(b->flat, 0, (int64_t)ct_dist_rank() * k, k);
    b->shard = mine ? owned(ct_clone(mine)) : NULL;
    ct_tensor_release(mine);
    b->shard_grad = owned(ct_tensor_zeros(1, &k, b->dtype, b->device));
    if (!b->shard || !b->shard_grad) return ct_last_status();
    return ct_requires_grad_(b->shard, true);
}

static ct_status hook(ct_tensor *leaf, void *ctx);

ct_ddp *ct_ddp_new(const ct_params *params, const ct_ddp_options *opts) {
    static const char op[] = "ct_ddp_new";
    if (cti_dist_ready(op) != CT_OK) return NULL;
    if (!params) return cti_error_null(CT_ERR_INVALID_ARG, "%s: params is NULL", op);
    ct_ddp_options o = opts ? *opts : (ct_ddp_options){0};
    if (o.bucket_mb == 0) o.bucket_mb = DEFAULT_BUCKET_MB;
    if (!(o.bucket_mb > 0))
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: bucket_mb must be > 0, got %g", op,
                              o.bucket_mb);
    if (o.zero1 && o.find_unused_parameters)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: zero1 updates each shard as a whole, so it cannot leave "
                              "unused parameters without a gradient; turn off "
                              "find_unused_parameters",
                              op);
    ct_ddp *d = calloc(1, sizeof *d);
    if (!d) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    d->zero1 = o.zero1;
    d->find_unused = o.find_unused_parameters;
    d->sync = true;
    bool prev = ct_set_grad_enabled(false);
    ct_status st = (d->params = ct_params_new()) ? copy_params(op, params, d->params)
                                                  : ct_last_status();
    /* Every rank starts from rank 0's values. */
    for (int64_t k = 0; st == CT_OK && k < ct_params_count(d->params); k++)
        st = ct_dist_broadcast(ct_params_get(d->params, k, NULL), 0);
    if (st == CT_OK) st = make_slots(op, d);
    if (st == CT_OK) st = make_buckets(op, d, o.bucket_mb);
    for (int64_t k = 0; st == CT_OK && k < d->nbuckets; k++) st = fill_bucket(d, &d->buckets[k]);
    ct_set_grad_enabled(prev);
    if (st == CT_OK && d->zero1) {
        if (!(d->optim = ct_params_new())) st = ct_last_status();
        for (int64_t k = 0; st == CT_OK && k < d->nbuckets; k++) {
            char name[32];
            snprintf(name, sizeof name, "bucket%lld", (long long)k);
            st = ct_params_add(d->optim, name, d->buckets[k].shard);
        }
    }
    for (int64_t k = 0; st == CT_OK && k < d->nslots; k++) {
        st = ct_set_post_accumulate_grad_hook(d->slots[k].p, hook, &d->slots[k]);
        d->slots[k].hooked = st == CT_OK;
    }
    if (st != CT_OK) {
        ct_ddp_free(d);
        return NULL;
    }
    return d;
}

void ct_ddp_free(ct_ddp *d) {
    if (!d) return;
    for (int64_t k = 0; k < d->nslots; k++) {
        slot *s = &d->slots[k];
        if (s->hooked) ct_set_post_accumulate_grad_hook(s->p, NULL, NULL);
        ct_tensor_release(s->view);
    }
    for (int64_t k = 0; k < d->nbuckets; k++) {
        bucket *b = &d->buckets[k];
        if (b->work) cti_dist_finish(b->work);
        ct_tensor_release(b->flat);
        ct_tensor_release(b->shard);
        ct_tensor_release(b->shard_grad);
    }
    if (d->optim != d->params) ct_params_free(d->optim);
    ct_params_free(d->params);
    free(d->slots);
    free(d->buckets);
    free(d);
}

const ct_params *ct_ddp_optim_params(ct_ddp *d) {
    if (!d) return cti_error_null(CT_ERR_INVALID_ARG, "ct_ddp_optim_params: ddp is NULL");
    return d->zero1 ? d->optim : d->params;
}

bool ct_ddp_set_sync(ct_ddp *d, bool sync) {
    if (!d) return false;
    bool prev = d->sync;
    d->sync = sync;
    return prev;
}

/* ---- the pass ------------------------------------------------------------------------------- */
/* Copies b's gradients into its flat buffer (zeros where a parameter has
 * none) and starts its reduction. */
static ct_status start_bucket(ct_ddp *d, bucket *b, bool early) {
    static const char op[] = "ct_ddp_backward";
    ct_status st = CT_OK;
    for (int64_t k = b->first; st == CT_OK && k < b->first + b->count; k++) {
        slot *s = &d->slots[k];
        ct_tensor *g = ct_grad(s->p);
        s->had_grad = g != NULL;
        st = g ? ct_copy_(s->view, g) : ct_fill_(s->view, 0);
    }
    if (st == CT_OK && b->padded > b->numel) {
        ct_tensor *pad = ct_narrow(b->flat, 0, b->numel, b->padded - b->numel);
        st = pad ? ct_fill_(pad, 0) : ct_last_status();
        ct_tensor_release(pad);
    }
    if (st == CT_OK)
        st = d->zero1 ? cti_dist_start(op, CTI_COLL_REDUCE_SCATTER, b->shard_grad, b->flat,
                                       CT_DIST_AVG, 0, &b->work)
                      : cti_dist_start(op, CTI_COLL_ALL_REDUCE, b->flat, b->flat, CT_DIST_AVG, 0,
                                       &b->work);
    b->started = true;
    if (early) b->early++;
    return st;
}

/* Starts, in order, every bucket from the next one on that is ready. */
static ct_status start_ready(ct_ddp *d, bool early) {
    ct_status st = CT_OK;
    while (st == CT_OK && d->next < d->nbuckets) {
        bucket *b = &d->buckets[d->next];
        if (b->ready < b->count) break;
        st = start_bucket(d, b, early);
        d->next++;
    }
    return st;
}

static ct_status hook(ct_tensor *leaf, void *ctx) {
    slot *s = ctx;
    ct_ddp *d = s->ddp;
    if (!d->in_pass || !d->sync || s->ready) return CT_OK;
    s->ready = true;
    d->buckets[s->bucket].ready++;
    bool prev = ct_set_grad_enabled(false);
    ct_status st = start_ready(d, true);
    ct_set_grad_enabled(prev);
    for (int64_t k = 0; k < d->next; k++) cti_dist_progress(d->buckets[k].work);
    if (st != CT_OK) d->pass_status = st;
    return st;
}

/* Which slots got a gradient on any rank (find_unused_parameters). */
static ct_status agree_used(ct_ddp *d, bool *used) {
    int64_t n = d->nslots;
    ct_tensor *mask = ct_tensor_zeros(1, &n, CT_I32, d->buckets[0].device);
    ct_tensor *host = NULL;
    ct_status st = mask ? CT_OK : ct_last_status();
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (st == CT_OK && !v) st = cti_error(CT_ERR_OOM, "ct_ddp_backward: out of memory");
    if (st == CT_OK) {
        for (int64_t k = 0; k < n; k++) v[k] = d->slots[k].had_grad;
        ct_tensor *src = ct_tensor_from_data(v, CT_I32, 1, &n);
        st = src ? ct_copy_(mask, src) : ct_last_status();
        ct_tensor_release(src);
    }
    if (st == CT_OK) st = ct_dist_all_reduce(mask, CT_DIST_MAX);
    if (st == CT_OK) st = (host = ct_to_device(mask, CT_CPU)) ? CT_OK : ct_last_status();
    if (st == CT_OK) st = ct_tensor_copy_to_host(host, v, (size_t)n * sizeof *v);
    for (int64_t k = 0; st == CT_OK && k < n; k++) used[k] = v[k] != 0;
    free(v);
    ct_tensor_release(host);
    ct_tensor_release(mask);
    return st;
}

/* The averages back into the parameters' gradients (zero1: the shards'). */
static ct_status write_back(ct_ddp *d, const bool *used) {
    ct_status st = CT_OK;
    if (d->zero1) {
        for (int64_t k = 0; st == CT_OK && k < d->nbuckets; k++)
            st = ct_set_grad(d->buckets[k].shard, d->buckets[k].shard_grad);
        for (int64_t k = 0; k < d->nslots; k++) ct_zero_grad(d->slots[k].p);
        return st;
    }
    for (int64_t k = 0; st == CT_OK && k < d->nslots; k++) {
        slot *s = &d->slots[k];
        if (used && !used[k]) continue;
        ct_tensor *g = ct_grad(s->p);
        if (g) {
            st = ct_copy_(g, s->view);
        } else {
            ct_tensor *c = ct_clone(s->view);
            st = c ? ct_set_grad(s->p, c) : ct_last_status();
            ct_tensor_release(c);
        }
    }
    return st;
}

/* Starts what the pass left, finishes everything, writes the averages. */
static ct_status finish_pass(ct_ddp *d, ct_status st) {
    for (int64_t k = d->next; st == CT_OK && k < d->nbuckets; k++)
        d->buckets[k].ready = d->buckets[k].count;
    if (st == CT_OK) st = start_ready(d, false);
    bool *used = NULL;
    if (st == CT_OK && d->find_unused && d->nslots) {
        used = malloc((size_t)d->nslots * sizeof *used);
        if (used) st = agree_used(d, used);
        else st = cti_error(CT_ERR_OOM, "ct_ddp_backward: out of memory");
    }
    /* Every started collective is finished, failed pass or not: its
     * buffers are in use until then. */
    for (int64_t k = 0; k < d->nbuckets; k++) {
        bucket *b = &d->buckets[k];
        if (!b->work) continue;
        ct_status fst = cti_dist_finish(b->work);
        b->work = NULL;
        if (st == CT_OK) st = fst;
    }
    if (st == CT_OK) st = write_back(d, used);
    free(used);
    return st;
}

ct_status ct_ddp_backward(ct_ddp *d, ct_tensor *loss, ct_tensor *grad_out) {
    static const char op[] = "ct_ddp_backward";
    if (!d) return cti_error(CT_ERR_INVALID_ARG, "%s: ddp is NULL", op);
    if (d->sync) {
        ct_status st = cti_dist_ready(op);
        if (st != CT_OK) return st;
    }
    for (int64_t k = 0; k < d->nslots; k++) d->slots[k].ready = false;
    for (int64_t k = 0; k < d->nbuckets; k++) {
        d->buckets[k].ready = 0;
        d->buckets[k].started = false;
    }
    d->next = 0;
    d->pass_status = CT_OK;
    d->in_pass = true;
    ct_status st = ct_backward(loss, grad_out, false);
    d->in_pass = false;
    if (!d->sync) return st;
    bool prev = ct_set_grad_enabled(false);
    ct_scope *scope = ct_scope_begin();
    st = finish_pass(d, st);
    ct_scope_end(scope);
    ct_set_grad_enabled(prev);
    return st;
}

ct_status ct_ddp_step(ct_ddp *d, ct_optimizer *opt) {
    static const char op[] = "ct_ddp_step";
    if (!d || !opt)
        return cti_error(CT_ERR_INVALID_ARG, "%s: %s is NULL", op, d ? "opt" : "ddp");
    ct_status st = ct_optim_step(opt);
    if (st != CT_OK || !d->zero1) return st;
    if ((st = cti_dist_ready(op)) != CT_OK) return st;
    bool prev = ct_set_grad_enabled(false);
    for (int64_t k = 0; k < d->nbuckets; k++) {
        bucket *b = &d->buckets[k];
        ct_status s2 = st == CT_OK ? cti_dist_start(op, CTI_COLL_ALL_GATHER, b->flat, b->shard,
                                                    CT_DIST_SUM, 0, &b->work)
                                   : CT_OK;
        if (st == CT_OK) st = s2;
    }
    for (int64_t k = 0; k < d->nbuckets; k++) {
        bucket *b = &d->buckets[k];
        if (!b->work) continue;
        ct_status fst = cti_dist_finish(b->work);
        b->work = NULL;
        if (st == CT_OK) st = fst;
    }
    for (int64_t k = 0; st == CT_OK && k < d->nslots; k++)
        st = ct_copy_(d->slots[k].p, d->slots[k].view);
    ct_set_grad_enabled(prev);
    return st;
}

/* ---- what the buckets are ----------------------------------------------------------------- */
static const bucket *bucket_at(const ct_ddp *d, int64_t k) {
    return d && k >= 0 && k < d->nbuckets ? &d->buckets[k] : NULL;
}

int64_t ct_ddp_num_buckets(const ct_ddp *d) { return d ? d->nbuckets : 0; }
int64_t ct_ddp_bucket_params(const ct_ddp *d, int64_t k) {
    const bucket *b = bucket_at(d, k);
    return b ? b->count : -1;
}
int64_t ct_ddp_bucket_numel(const ct_ddp *d, int64_t k) {
    const bucket *b = bucket_at(d, k);
    return b ? b->numel : -1;
}
int64_t ct_ddp_bucket_early_starts(const ct_ddp *d, int64_t k) {
    const bucket *b = bucket_at(d, k);
    return b ? b->early : -1;
}
