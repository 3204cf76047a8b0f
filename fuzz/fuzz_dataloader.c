/* The data loader and its saved state: the input describes a loader over a
 * small data set (samples, row width, batch size, shuffle, drop_last,
 * targets, seed: 18 bytes) and then a program of calls, one byte each
 * (payload after it where noted):
 *   0 next batch        1 reset (next epoch)
 *   2 restore a state read from the input (epoch, position, seed,
 *     generator offset: 32 bytes, little-endian), as a checkpoint would
 *   3 save the state, take up to 3 batches, restore it, take them again:
 *     the same samples must come back
 * Every batch is checked against what the loader promises: batch_size
 * samples (fewer only at the end), each sample whole and at most once per
 * epoch, in order when not shuffling. Refusals must name the function. */
#include <string.h>

#include "fuzz.h"

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static bool take(reader *r, void *out, size_t k) {
    if (r->n < k) return false;
    memcpy(out, r->p, k);
    r->p += k;
    r->n -= k;
    return true;
}

typedef struct world {
    ct_dataloader *dl;
    int64_t n, batch, width, limit;
    bool shuffle, drop_last, targets;
    uint64_t seen; /* samples handed out this epoch (n < 64) */
    int64_t position;
} world;

/* The next batch's sample ids into ids (at most 64), or -1 at the end. */
static int64_t next_batch(world *w, int64_t *ids) {
    /* Poisoned, to see that the loader sets them. */
    ct_tensor *x = (ct_tensor *)1, *y = w->targets ? (ct_tensor *)1 : NULL;
    bool got = ct_dataloader_next(w->dl, &x, w->targets ? &y : NULL);
    if (!got) {
        FZ_CHECK(x == NULL && (!w->targets || y == NULL), "no batch but outputs set");
        FZ_CHECK(ct_dataloader_status(w->dl) == CT_OK, "next failed: %s",
                 ct_status_name(ct_dataloader_status(w->dl)));
        FZ_CHECK(w->position >= w->limit, "epoch ended at %lld of %lld", (long long)w->position,
                 (long long)w->limit);
        return -1;
    }
    int64_t left = w->limit - w->position;
    int64_t b = ct_tensor_shape(x)[0];
    FZ_CHECK(b == (left < w->batch ? left : w->batch) && b > 0,
             "batch of %lld (%lld left, batch size %lld)",
             (long long)b, (long long)left, (long long)w->batch);
    FZ_CHECK(ct_tensor_ndim(x) == (w->width ? 2 : 1), "batch has %d dims", ct_tensor_ndim(x));
    const double *xv = ct_tensor_data_ptr(x);
    for (int64_t i = 0; i < b; i++) {
        double id = w->width ? xv[i * w->width] : xv[i];
        FZ_CHECK(id >= 0 && id < (double)w->n && id == (double)(int64_t)id, "sample id %g", id);
        int64_t k = (int64_t)id;
        for (int64_t c = 1; c < w->width; c++)
            FZ_CHECK(xv[i * w->width + c] == 1000.0 * (double)k + (double)c, "row %lld torn",
                     (long long)k);
        FZ_CHECK(!(w->seen >> k & 1), "sample %lld twice in an epoch", (long long)k);
        if (!w->shuffle)
            FZ_CHECK(k == w->position + i, "sample %lld at position %lld without shuffling",
                     (long long)k, (long long)(w->position + i));
        w->seen |= 1ull << k;
        if (w->targets)
            FZ_CHECK(((const int64_t *)ct_tensor_data_ptr(y))[i] == k, "target of %lld",
                     (long long)k);
        ids[i] = k;
    }
    w->position += b;
    ct_tensor_release(x);
    ct_tensor_release(y);
    return b;
}

static void restored(world *w, const ct_dataloader_state *s) {
    w->position = s->position;
    w->seen = 0;
}

static void restore(world *w, reader *r) {
    ct_dataloader_state s;
    if (!take(r, &s.epoch, 8) || !take(r, &s.position, 8) || !take(r, &s.seed, 8) ||
        !take(r, &s.gen_offset, 8))
        return;
    ct_dataloader_state before = ct_dataloader_get_state(w->dl);
    ct_clear_error();
    ct_status st = ct_dataloader_set_state(w->dl, &s);
    if (st != CT_OK) {
        FZ_CHECK(strstr(ct_last_error(), "ct_dataloader_set_state"), "message lacks the name");
        ct_dataloader_state after = ct_dataloader_get_state(w->dl);
        FZ_CHECK(memcmp(&before, &after, sizeof before) == 0, "a refused state changed the loader");
        return;
    }
    ct_dataloader_state got = ct_dataloader_get_state(w->dl);
    FZ_CHECK(got.epoch == s.epoch && got.position == s.position && got.seed == s.seed,
             "the state read back differs from the one restored");
    restored(w, &s);
}

static void replay(world *w) {
    ct_dataloader_state s = ct_dataloader_get_state(w->dl);
    world saved = *w;
    int64_t a[3][64], b[3][64], na[3], nb[3];
    for (int k = 0; k < 3; k++) na[k] = next_batch(w, a[k]);
    FZ_CHECK(ct_dataloader_set_state(w->dl, &s) == CT_OK, "restoring a state the loader gave");
    *w = saved;
    for (int k = 0; k < 3; k++) nb[k] = next_batch(w, b[k]);
    for (int k = 0; k < 3; k++) {
        FZ_CHECK(na[k] == nb[k], "batch %d: %lld samples, then %lld", k, (long long)na[k],
                 (long long)nb[k]);
        if (na[k] > 0)
            FZ_CHECK(memcmp(a[k], b[k], sizeof(int64_t) * (size_t)na[k]) == 0,
                     "batch %d differs after restoring", k);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size};
    uint8_t n8, flags;
    int64_t batch;
    uint64_t seed;
    if (!take(&r, &n8, 1) || !take(&r, &flags, 1) || !take(&r, &batch, 8) || !take(&r, &seed, 8))
        return 0;
    world w = {.n = n8 % 64, .batch = batch, .width = flags >> 3 & 7,
               .shuffle = flags & 1, .drop_last = flags >> 1 & 1, .targets = flags >> 2 & 1};
    int64_t shape[2] = {w.n, w.width};
    double *xv = malloc(sizeof(double) * (size_t)(w.n * (w.width ? w.width : 1) + 1));
    int64_t *yv = malloc(sizeof(int64_t) * (size_t)(w.n + 1));
    for (int64_t i = 0; i < w.n; i++) {
        yv[i] = i;
        if (!w.width) xv[i] = (double)i;
        for (int64_t c = 0; c < w.width; c++)
            xv[i * w.width + c] = c ? 1000.0 * (double)i + (double)c : (double)i;
    }
    ct_tensor *x = ct_tensor_from_data(xv, CT_F64, w.width ? 2 : 1, shape);
    ct_tensor *y = ct_tensor_from_data(yv, CT_I64, 1, shape);
    free(xv);
    free(yv);
    FZ_CHECK(x && y, "cannot make the data set");
    ct_clear_error();
    w.dl = ct_dataloader_new(x, w.targets ? y : NULL, batch, w.shuffle, w.drop_last, seed);
    if (!w.dl) {
        FZ_CHECK(batch < 1 && ct_last_status() == CT_ERR_INVALID_ARG &&
                     strstr(ct_last_error(), "ct_dataloader_new"),
                 "refused batch size %lld", (long long)batch);
    } else {
        FZ_CHECK(ct_dataloader_num_samples(w.dl) == w.n, "sample count");
        int64_t nb = ct_dataloader_num_batches(w.dl);
        w.limit = w.drop_last ? w.n / batch * batch : w.n;
        FZ_CHECK(nb == w.n / batch + (!w.drop_last && w.n % batch != 0),
                 "%lld batches of %lld over %lld", (long long)nb, (long long)batch,
                 (long long)w.n);
        uint8_t opc;
        int64_t ids[64];
        for (int steps = 0; steps < 256 && take(&r, &opc, 1); steps++) {
            switch (opc % 4) {
            case 0: next_batch(&w, ids); break;
            case 1: {
                ct_status st = ct_dataloader_reset(w.dl);
                if (st == CT_OK) {
                    w.position = 0;
                    w.seen = 0;
                } else {
                    FZ_CHECK(st == CT_ERR_OVERFLOW, "reset gave %s", ct_status_name(st));
                }
                break;
            }
            case 2: restore(&w, &r); break;
            default: replay(&w); break;
            }
        }
        ct_dataloader_free(w.dl);
    }
    ct_tensor_release(x);
    ct_tensor_release(y);
    return 0;
}
