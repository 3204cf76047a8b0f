/* Private: a small hash index from keys to int64 values (positions in an
 * array the owner keeps in insertion order). Keys are borrowed: a string key
 * or pointer key must stay valid, unchanged, while its entry is in the map,
 * which is why owners map their own long-lived copies.
 *
 * Open addressing with linear probing and backward-shift removal (no
 * tombstones); the table doubles when it would pass 3/4 full, with every
 * size computation overflow-checked. String keys hash with FNV-1a, pointer
 * keys with a 64-bit mixer. Not thread-safe: the owner serializes. */
#ifndef CTEN_CORE_HASHMAP_H
#define CTEN_CORE_HASHMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum cti_hmap_kind {
    CTI_HMAP_STR, /* NUL-terminated strings compared by content */
    CTI_HMAP_PTR, /* pointers compared by address */
} cti_hmap_kind;

typedef struct cti_hmap_slot {
    const void *key; /* NULL: empty */
    uint64_t hash;
    int64_t value;
} cti_hmap_slot;

typedef struct cti_hmap {
    cti_hmap_kind kind;
    cti_hmap_slot *slots; /* NULL until the first insertion */
    size_t cap;           /* 0 or a power of two */
    size_t count;
} cti_hmap;

/* An empty map of that kind; allocates nothing. */
void cti_hmap_init(cti_hmap *m, cti_hmap_kind kind);
/* Frees the table (not the keys) and leaves an empty map. */
void cti_hmap_clear(cti_hmap *m);
/* The value of key, or -1 when absent. key must not be NULL. */
int64_t cti_hmap_get(const cti_hmap *m, const void *key);
/* Maps key to value (inserting or replacing). false, the map unchanged,
 * when the table cannot grow (out of memory or size overflow). */
bool cti_hmap_put(cti_hmap *m, const void *key, int64_t value);
/* Inserts key -> value unless key is present. Returns the existing value
 * (map unchanged), -1 after inserting, or -2 when the table cannot grow. */
int64_t cti_hmap_put_new(cti_hmap *m, const void *key, int64_t value);
/* Removes key; whether it was there. */
bool cti_hmap_remove(cti_hmap *m, const void *key);
/* Makes room for n entries in all, so that many insertions cannot fail;
 * false (map unchanged) when it cannot. */
bool cti_hmap_reserve(cti_hmap *m, size_t n);

#endif
