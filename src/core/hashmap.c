/* The hash index behind metadata keys, safetensors tensor names and
 * parameter lists. String keys come from files, which choose them: with an
 * unkeyed hash a hostile header could put every key in one probe chain and
 * bring back the quadratic load time the index exists to remove, so string
 * hashes are SipHash-1-3 under a key drawn once per process. */
#include "hashmap.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ---- keyed string hash ----------------------------------------------------------------------- */

static uint64_t sip_key[2];
static pthread_once_t sip_once = PTHREAD_ONCE_INIT;

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static void sip_init(void) {
    uint64_t k[2];
    if (getrandom(k, sizeof k, GRND_NONBLOCK) != (ssize_t)sizeof k) {
        /* No entropy yet (early boot): what differs between processes still
         * keeps a precomputed file from colliding everywhere. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        k[0] = mix64((uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 32 ^ (uint64_t)getpid());
        k[1] = mix64(k[0] ^ (uint64_t)(uintptr_t)&k);
    }
    sip_key[0] = k[0];
    sip_key[1] = k[1];
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                            \
    do {                                                                                    \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                          \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                              \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                              \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                          \
    } while (0)

static uint64_t siphash13(const unsigned char *p, size_t n) {
    uint64_t v0 = 0x736f6d6570736575ull ^ sip_key[0], v1 = 0x646f72616e646f6dull ^ sip_key[1];
    uint64_t v2 = 0x6c7967656e657261ull ^ sip_key[0], v3 = 0x7465646279746573ull ^ sip_key[1];
    size_t full = n & ~(size_t)7;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t m;
        memcpy(&m, p + i, 8); /* the hosts cten builds for are little-endian */
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)n << 56;
    for (size_t i = 0; i < (n & 7); i++) b |= (uint64_t)p[full + i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static uint64_t hash_key(const cti_hmap *m, const void *key) {
    if (m->kind == CTI_HMAP_PTR) return mix64((uint64_t)(uintptr_t)key);
    pthread_once(&sip_once, sip_init);
    return siphash13(key, strlen(key));
}

static bool same_key(const cti_hmap *m, const cti_hmap_slot *s, const void *key, uint64_t h) {
    if (s->hash != h) return false;
    return m->kind == CTI_HMAP_PTR ? s->key == key : strcmp(s->key, key) == 0;
}

/* ---- the table --------------------------------------------------------------------------------- */

void cti_hmap_init(cti_hmap *m, cti_hmap_kind kind) {
    m->kind = kind;
    m->slots = NULL;
    m->cap = 0;
    m->count = 0;
}

void cti_hmap_clear(cti_hmap *m) {
    free(m->slots);
    cti_hmap_init(m, m->kind);
}

/* The slot holding key, or the empty slot where it would go. */
static size_t probe(const cti_hmap *m, const void *key, uint64_t h) {
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    while (m->slots[i].key && !same_key(m, &m->slots[i], key, h)) i = (i + 1) & mask;
    return i;
}

int64_t cti_hmap_get(const cti_hmap *m, const void *key) {
    if (m->count == 0) return -1;
    size_t i = probe(m, key, hash_key(m, key));
    return m->slots[i].key ? m->slots[i].value : -1;
}

/* Rehashes into a table of new_cap slots (a power of two). */
static bool rehash(cti_hmap *m, size_t new_cap) {
    if (new_cap > SIZE_MAX / sizeof(cti_hmap_slot)) return false;
    cti_hmap_slot *s = calloc(new_cap, sizeof *s);
    if (!s) return false;
    cti_hmap old = *m;
    m->slots = s;
    m->cap = new_cap;
    for (size_t i = 0; i < old.cap; i++) {
        if (!old.slots[i].key) continue;
        size_t mask = new_cap - 1, j = (size_t)old.slots[i].hash & mask;
        while (s[j].key) j = (j + 1) & mask;
        s[j] = old.slots[i];
    }
    free(old.slots);
    return true;
}

bool cti_hmap_reserve(cti_hmap *m, size_t n) {
    /* Keep the load at or below 3/4: cap >= n + n / 3. */
    if (n > SIZE_MAX / 2) return false;
    size_t need = n + n / 3 + 1, cap = m->cap ? m->cap : 16;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return false;
        cap *= 2;
    }
    return cap == m->cap || rehash(m, cap);
}

int64_t cti_hmap_put_new(cti_hmap *m, const void *key, int64_t value) {
    if (m->count == SIZE_MAX || !cti_hmap_reserve(m, m->count + 1)) return -2;
    uint64_t h = hash_key(m, key);
    size_t i = probe(m, key, h);
    if (m->slots[i].key) return m->slots[i].value;
    m->slots[i] = (cti_hmap_slot){.key = key, .hash = h, .value = value};
    m->count++;
    return -1;
}

bool cti_hmap_put(cti_hmap *m, const void *key, int64_t value) {
    if (m->count == SIZE_MAX || !cti_hmap_reserve(m, m->count + 1)) return false;
    uint64_t h = hash_key(m, key);
    size_t i = probe(m, key, h);
    if (!m->slots[i].key) m->count++;
    m->slots[i] = (cti_hmap_slot){.key = key, .hash = h, .value = value};
    return true;
}

bool cti_hmap_remove(cti_hmap *m, const void *key) {
    if (m->count == 0) return false;
    size_t mask = m->cap - 1, i = probe(m, key, hash_key(m, key));
    if (!m->slots[i].key) return false;
    /* Backward shift: pull later members of the chain into the hole when
     * their home slot does not lie strictly between the hole and them. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->slots[j].key) break;
        size_t home = (size_t)m->slots[j].hash & mask;
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        m->slots[i] = m->slots[j];
        i = j;
    }
    m->slots[i].key = NULL;
    m->count--;
    return true;
}
