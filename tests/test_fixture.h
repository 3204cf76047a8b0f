/* The fixture most test files share: every test starts with a clear error
 * channel and grad mode on, and must leave no tensor, storage or CPU byte
 * alive when it ends. Include after cmocka.h and test_util.h. */
#ifndef CTEN_TEST_FIXTURE_H
#define CTEN_TEST_FIXTURE_H

#include "core/tensor_impl.h"

static cti_alloc_stats start_stats;

static bool same_stats(cti_alloc_stats a, cti_alloc_stats b) {
    return a.live_tensors == b.live_tensors && a.live_storages == b.live_storages &&
           a.live_bytes == b.live_bytes;
}

static int setup(void **state) {
    (void)state;
    ct_clear_error();
    ct_set_grad_enabled(true);
    start_stats = cti_get_alloc_stats();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cti_alloc_stats s = cti_get_alloc_stats();
    if (!same_stats(s, start_stats)) {
        fprintf(stderr, "leak: tensors %lld -> %lld, storages %lld -> %lld, bytes %lld -> %lld\n",
                (long long)start_stats.live_tensors, (long long)s.live_tensors,
                (long long)start_stats.live_storages, (long long)s.live_storages,
                (long long)start_stats.live_bytes, (long long)s.live_bytes);
        return -1;
    }
    return 0;
}

/* A scope that must leave the allocation counts where its begin found them:
 * whatever is made inside it is its own, so its end frees all of it. */
typedef struct tu_scope {
    cti_alloc_stats before;
    ct_scope *scope;
} tu_scope;

static inline tu_scope tu_scope_begin(void) {
    tu_scope s = {.before = cti_get_alloc_stats()};
    s.scope = ct_scope_begin();
    assert_non_null(s.scope);
    return s;
}

/* Ends s and fails the test when anything made inside it outlived it. */
static inline void tu_scope_end_clean(tu_scope s) {
    ct_scope_end(s.scope);
    cti_alloc_stats now = cti_get_alloc_stats();
    if (!same_stats(s.before, now))
        fail_msg("the scope's end left tensors %lld -> %lld, storages %lld -> %lld, bytes %lld -> "
                 "%lld", (long long)s.before.live_tensors, (long long)now.live_tensors,
                 (long long)s.before.live_storages, (long long)now.live_storages,
                 (long long)s.before.live_bytes, (long long)now.live_bytes);
}

#endif
