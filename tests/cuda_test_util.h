/* What the CUDA test programs share: results that must not fail, with the
 * library's message printed when they do. Included after cmocka.h. */
#ifndef CTEN_TESTS_CUDA_TEST_UTIL_H
#define CTEN_TESTS_CUDA_TEST_UTIL_H

#include <stdio.h>

#include "tensor/tensor.h"

static inline ct_tensor *checked(ct_tensor *t) {
    if (!t) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(t);
    return t;
}

static inline void ok(ct_status s) {
    if (s != CT_OK) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_int_equal(s, CT_OK);
}

#endif
