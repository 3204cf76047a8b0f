/* What the op-program fuzzer (fuzz/op_program.c) found, each as a direct
 * test; its inputs are replayed too (fuzz/regressions/op_program). Several
 * were undefined behaviour that only the sanitizer builds see fail, so each
 * test also checks the values that come back. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "tensor/tensor.h"

#include "test_fixture.h"

static void assert_error(ct_status want, const char *fragment) {
    assert_int_equal(ct_last_status(), want);
    if (!strstr(ct_last_error(), fragment))
        fail_msg("message \"%s\" lacks \"%s\"", ct_last_error(), fragment);
    ct_clear_error();
}

/* A shape whose sizes overflow before a zero makes them fit stopped being
 * scanned at the overflow, so a negative size after it was accepted. */
static void test_negative_size_after_zero(void **state) {
    (void)state;
    const int64_t shape[] = {4, 4, INT64_C(7941357086885169043), -2, 7, 0, -1};
    assert_null(ct_tensor_zeros(7, shape, CT_F16, CT_CPU));
    assert_error(CT_ERR_SHAPE, "ct_tensor_zeros: negative size -2 in dim 3");
    assert_null(ct_tensor_randint(NULL, 0, 3, 7, shape, CT_F16, CT_CPU));
    assert_error(CT_ERR_SHAPE, "ct_tensor_randint: negative size -2 in dim 3");
}

/* A floating alpha outside int64 was converted to an integer (undefined) for
 * the integer form no floating result reads. */
static void test_alpha_outside_int64(void **state) {
    (void)state;
    ct_scope *s = ct_scope_begin();
    ct_tensor *a = ct_tensor_from_data((const double[]){1, 2}, CT_F64, CT_SHAPE(2));
    ct_tensor *b = ct_tensor_from_data((const double[]){1e-300, 0}, CT_F64, CT_SHAPE(2));
    double *v = tu_values(ct_add_alpha(a, b, -1e308));
    assert_true(v[0] == 1 - 1e8 && v[1] == 2);
    free(v);
    v = tu_values(ct_sub_alpha(a, b, NAN));
    assert_true(isnan(v[0]) && isnan(v[1]));
    free(v);
    ct_scope_end(s);
}

/* [9, 0, 2^62, 4]: empty, with the strides left of the zero saturated at
 * INT64_MAX. Views multiplied an index by them (signed overflow); now an
 * empty tensor's views keep its offset and saturate their free strides. */
static ct_tensor *empty_huge(void) {
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(9, 0, INT64_C(1) << 62, 4), CT_F32, CT_CPU);
    assert_non_null(t);
    assert_true(ct_tensor_strides(t)[0] == INT64_MAX);
    return t;
}

static void assert_empty_view(ct_tensor *v, int ndim, const int64_t *shape) {
    if (!v) fail_msg("%s", ct_last_error());
    assert_int_equal(ct_tensor_ndim(v), ndim);
    assert_memory_equal(ct_tensor_shape(v), shape, (size_t)ndim * sizeof(int64_t));
    assert_int_equal(ct_tensor_numel(v), 0);
    assert_int_equal(ct_tensor_offset(v), 0);
}

static void test_views_of_empty_tensor_with_huge_sizes(void **state) {
    (void)state;
    ct_scope *s = ct_scope_begin();
    ct_tensor *t = empty_huge();
    const int64_t big = INT64_C(1) << 62;
    assert_empty_view(ct_narrow(t, 0, 5, 2), 4, (const int64_t[]){2, 0, big, 4});
    assert_empty_view(ct_select(t, 0, 8), 3, (const int64_t[]){0, big, 4});
    assert_empty_view(ct_slice(t, 0, 3, 9, 2), 4, (const int64_t[]){3, 0, big, 4});
    ct_tensor *u = ct_unsqueeze(t, 0);
    assert_empty_view(u, 5, (const int64_t[]){1, 9, 0, big, 4});
    assert_true(ct_tensor_strides(u)[0] == INT64_MAX);
    /* A non-empty tensor's views: narrowing to the end of a huge expanded dim. */
    ct_tensor *e = ct_expand(ct_tensor_zeros(CT_SHAPE(1), CT_F32, CT_CPU), CT_SHAPE(big / 4));
    assert_non_null(e);
    assert_empty_view(ct_narrow(e, 0, big / 4, 0), 1, (const int64_t[]){0});
    ct_scope_end(s);
}

/* Reductions, pooling, softmax and copies of such a tensor formed products
 * of its sizes and strides (signed overflow); an empty input is now read
 * nowhere. */
static void test_kernels_on_empty_tensor_with_huge_sizes(void **state) {
    (void)state;
    ct_scope *s = ct_scope_begin();
    ct_tensor *t = empty_huge();
    const int64_t big = INT64_C(1) << 62;
    assert_empty_view(ct_sum(t, CT_DIMS(0), false), 3, (const int64_t[]){0, big, 4});
    assert_empty_view(ct_argmin(t, 2, true), 4, (const int64_t[]){9, 0, 1, 4});
    /* Reducing over the zero: every result is the empty reduction's. */
    double *v = tu_values(ct_sum(ct_tensor_zeros(CT_SHAPE(3, 0), CT_F32, CT_CPU), CT_DIMS(1),
                                 false));
    assert_true(v[0] == 0 && v[1] == 0 && v[2] == 0);
    free(v);
    /* The sizes overflow before the zero comes: elementwise ops counted the
     * result's elements, matmul its batches, by multiplying them. */
    ct_tensor *w = ct_tensor_zeros(CT_SHAPE(big, 4, 0), CT_F32, CT_CPU);
    assert_empty_view(ct_neg(w), 3, (const int64_t[]){big, 4, 0});
    ct_tensor *a = ct_tensor_zeros(CT_SHAPE(INT64_C(1) << 31, INT64_C(1) << 33, 0, 2, 3), CT_F32,
                                   CT_CPU);
    assert_empty_view(ct_matmul(a, ct_tensor_ones(CT_SHAPE(3, 4), CT_F32, CT_CPU)), 5,
                      (const int64_t[]){INT64_C(1) << 31, INT64_C(1) << 33, 0, 2, 4});
    assert_empty_view(ct_log_softmax(w, 2), 3, (const int64_t[]){big, 4, 0});
    assert_empty_view(ct_softmax(w, 0), 3, (const int64_t[]){big, 4, 0});
    /* ct_cat placed each part at its offset along dim 0 of the result. */
    ct_tensor *parts[2] = {t, t};
    assert_empty_view(ct_cat(2, parts, 0), 4, (const int64_t[]){18, 0, big, 4});
    /* ct_copy_ measured the bytes both sides span, dim by dim, before
     * seeing the zero. */
    assert_int_equal(ct_copy_(t, empty_huge()), CT_OK);
    ct_tensor *x = ct_tensor_zeros(CT_SHAPE(0, 2, big, 4), CT_F32, CT_CPU);
    assert_non_null(x);
    assert_empty_view(ct_adaptive_avg_pool2d(x, 3, 3), 4, (const int64_t[]){0, 2, 3, 3});
    assert_empty_view(ct_max_pool2d(x, (const int64_t[]){2, 2}, NULL, NULL, NULL, false, NULL),
                      4, (const int64_t[]){0, 2, big / 2, 2});
    ct_scope_end(s);
}

/* The same family, found by reading the code the fuzzer pointed at: flatten
 * multiplied the merged sizes, conv2d's bias gradient and operand loads
 * their sizes. */
static void test_more_of_empty_tensor_with_huge_sizes(void **state) {
    (void)state;
    ct_scope *s = ct_scope_begin();
    const int64_t big = INT64_C(1) << 62;
    ct_tensor *w = ct_tensor_zeros(CT_SHAPE(big, 4, 0), CT_F32, CT_CPU);
    assert_null(ct_flatten(w, 0, 1));
    assert_error(CT_ERR_OVERFLOW, "ct_flatten: merging dims 0..1");
    assert_empty_view(ct_flatten(w, 1, 2), 2, (const int64_t[]){big, 0});
    ct_tensor *dy = ct_tensor_zeros(CT_SHAPE(INT64_C(1) << 40, 0, INT64_C(1) << 40, 4), CT_F32,
                                    CT_CPU);
    assert_empty_view(ct_conv2d_backward_bias(dy), 1, (const int64_t[]){0});
    double *v = tu_values(ct_conv2d_backward_bias(ct_tensor_zeros(CT_SHAPE(0, 3, big, 4),
                                                                  CT_F32, CT_CPU)));
    assert_true(v[0] == 0 && v[1] == 0 && v[2] == 0);
    free(v);
    /* The plane is empty but the batch, or the rows, nearly INT64_MAX: the
     * CPU kernel walked them (a fuzzer timeout, in a dtype off its fast
     * path and in a strided view). */
    const ct_dtype dts[] = {CT_F32, CT_F64, CT_BF16};
    for (int k = 0; k < 3; k++) {
        ct_tensor *e[3] = {ct_tensor_zeros(CT_SHAPE(big, 3, 4, 0), dts[k], CT_CPU),
                           ct_tensor_zeros(CT_SHAPE(1, 3, big, 0), dts[k], CT_CPU),
                           ct_transpose(ct_tensor_zeros(CT_SHAPE(big, 0, 3), dts[k], CT_CPU), 0, 2)};
        for (int j = 0; j < 3; j++) {
            double *z = tu_values(ct_conv2d_backward_bias(e[j]));
            assert_true(z[0] == 0 && z[1] == 0 && z[2] == 0);
            free(z);
        }
    }
    ct_scope_end(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_negative_size_after_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alpha_outside_int64, setup, teardown),
        cmocka_unit_test_setup_teardown(test_views_of_empty_tensor_with_huge_sizes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_kernels_on_empty_tensor_with_huge_sizes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_more_of_empty_tensor_with_huge_sizes, setup,
                                        teardown),
    };
    return tu_run_tests(tests);
}
