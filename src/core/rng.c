/* Philox-4x32-10 generators (Salmon, Moraes, Dror, Shaw: "Parallel random
 * numbers: as easy as 1, 2, 3", SC'11). Counter-based, so any draw can be
 * computed directly from (seed, index): kernels on any device and any number
 * of threads produce the same values. */
#include <stdlib.h>

#include "tensor_impl.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void cti_philox_block(uint64_t seed, uint64_t block_index, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)block_index, c1 = (uint32_t)(block_index >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint32_t ct_philox(uint64_t seed, uint64_t index) {
    uint32_t b[4];
    cti_philox_block(seed, index >> 2, b);
    return b[index & 3];
}

static ct_generator default_gen = {0, 0};

/* A generator may be drawn from by several threads at once: each draw
 * reserves its range of the stream with an atomic add, and the seed is read
 * and written atomically too, so reseeding while another thread draws is
 * not a data race (which seed such a draw uses is unspecified). */
ct_generator *ct_generator_new(uint64_t seed) {
    ct_generator *g = malloc(sizeof *g);
    if (!g) return cti_error_null(CT_ERR_OOM, "ct_generator_new: out of memory");
    g->seed = seed;
    g->offset = 0;
    return g;
}

void ct_generator_free(ct_generator *g) {
    if (g && g != &default_gen) free(g);
}

static ct_generator *resolve(ct_generator *g) { return g ? g : &default_gen; }

void ct_generator_set_seed(ct_generator *g, uint64_t seed) {
    g = resolve(g);
    __atomic_store_n(&g->seed, seed, __ATOMIC_RELAXED);
    __atomic_store_n(&g->offset, 0, __ATOMIC_RELAXED);
}

uint64_t ct_generator_seed(const ct_generator *g) {
    return __atomic_load_n(g ? &g->seed : &default_gen.seed, __ATOMIC_RELAXED);
}

uint64_t ct_generator_offset(const ct_generator *g) {
    return __atomic_load_n(g ? &g->offset : &default_gen.offset, __ATOMIC_RELAXED);
}

void ct_generator_set_offset(ct_generator *g, uint64_t offset) {
    __atomic_store_n(&resolve(g)->offset, offset, __ATOMIC_RELAXED);
}

ct_generator *ct_generator_default(void) { return &default_gen; }

void ct_manual_seed(uint64_t seed) { ct_generator_set_seed(&default_gen, seed); }

static _Thread_local cti_rng_observer observer;
static _Thread_local void *observer_ctx;

void cti_rng_observe(cti_rng_observer fn, void *ctx) {
    observer = fn;
    observer_ctx = fn ? ctx : NULL;
}

uint64_t ct_generator_reserve(ct_generator *g, uint64_t n) {
    /* Each reservation starts on a fresh Philox block so that a kernel's
     * draws never share a block with the previous call's. */
    uint64_t rounded = (n + 3) & ~(uint64_t)3;
    g = resolve(g);
    uint64_t first = __atomic_fetch_add(&g->offset, rounded, __ATOMIC_RELAXED);
    if (observer) observer(observer_ctx, g, ct_generator_seed(g), first, rounded);
    return first;
}
