/* Tensors as text: the element formats PyTorch's repr picks (fixed, integer
 * floats, scientific, integers, bools, nan/inf), alignment, nesting,
 * elision of large tensors, wrapping, the trailer, non-contiguous views,
 * ct_tensor_str's snprintf contract and bad input. The expected strings
 * are what PyTorch prints for the same values, plus cten's trailer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "test_fixture.h"

static ct_tensor *of(const double *v, int nd, const int64_t *shape, ct_dtype dt) {
    ct_tensor *t = ct_tensor_from_data(v, CT_F64, nd, shape);
    assert_non_null(t);
    ct_tensor *c = ct_to_dtype(t, dt);
    assert_non_null(c);
    ct_tensor_release(t);
    return c;
}

static void expect(const ct_tensor *t, const char *want) {
    char buf[4096];
    memset(buf, 'X', sizeof buf);
    int64_t n = ct_tensor_str(t, buf, sizeof buf);
    if (n < 0 || strcmp(buf, want) != 0) fprintf(stderr, "got:\n%s\nwant:\n%s\n", buf, want);
    assert_int_equal(n, (int64_t)strlen(want));
    assert_string_equal(buf, want);
}

static void test_formats(void **state) {
    (void)state;
    ct_tensor *t = of((const double[]){0.1, -2, 3.5, 4}, CT_SHAPE(2, 2), CT_F32);
    expect(t, "tensor([[ 0.1000, -2.0000],\n"
              "        [ 3.5000,  4.0000]], shape=[2, 2], dtype=float32, device=cpu)");
    ct_tensor_release(t);
    t = of((const double[]){1, 2, 3}, CT_SHAPE(3), CT_F64);
    expect(t, "tensor([1., 2., 3.], shape=[3], dtype=float64, device=cpu)");
    ct_tensor_release(t);
    t = of((const double[]){1e-5, 1}, CT_SHAPE(2), CT_F32);
    expect(t, "tensor([1.0000e-05, 1.0000e+00], shape=[2], dtype=float32, device=cpu)");
    ct_tensor_release(t);
    t = of((const double[]){1, -20, 300}, CT_SHAPE(3), CT_I64);
    expect(t, "tensor([  1, -20, 300], shape=[3], dtype=int64, device=cpu)");
    ct_tensor_release(t);
    t = of((const double[]){1, 0}, CT_SHAPE(2), CT_BOOL);
    expect(t, "tensor([ True, False], shape=[2], dtype=bool, device=cpu)");
    ct_tensor_release(t);
    t = of((const double[]){NAN, INFINITY, -1.5}, CT_SHAPE(3), CT_F32);
    expect(t, "tensor([    nan,     inf, -1.5000], shape=[3], dtype=float32, device=cpu)");
    ct_tensor_release(t);
    t = of((const double[]){3.14159265}, CT_NONE, CT_BF16);
    expect(t, "tensor(3.1406, shape=[], dtype=bfloat16, device=cpu)");
    ct_tensor_release(t);
    t = ct_tensor_zeros(CT_SHAPE(0, 3), CT_F16, CT_CPU);
    expect(t, "tensor([], shape=[0, 3], dtype=float16, device=cpu)");
    ct_tensor_release(t);
}

static void test_nesting_views_and_grad(void **state) {
    (void)state;
    double v[12];
    for (int i = 0; i < 12; i++) v[i] = i;
    ct_tensor *t = of(v, CT_SHAPE(2, 2, 3), CT_I32);
    expect(t, "tensor([[[ 0,  1,  2],\n"
              "         [ 3,  4,  5]],\n"
              "\n"
              "        [[ 6,  7,  8],\n"
              "         [ 9, 10, 11]]], shape=[2, 2, 3], dtype=int32, device=cpu)");
    /* A transposed view prints in its own (logical) order. */
    ct_tensor *p = ct_permute(t, CT_DIMS(2, 1, 0));
    assert_false(ct_tensor_is_contiguous(p));
    expect(p, "tensor([[[ 0,  6],\n"
              "         [ 3,  9]],\n"
              "\n"
              "        [[ 1,  7],\n"
              "         [ 4, 10]],\n"
              "\n"
              "        [[ 2,  8],\n"
              "         [ 5, 11]]], shape=[3, 2, 2], dtype=int32, device=cpu)");
    ct_tensor_release(p);
    ct_tensor_release(t);
    ct_tensor *x = of((const double[]){1, 2}, CT_SHAPE(2), CT_F32);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    expect(x, "tensor([1., 2.], shape=[2], dtype=float32, device=cpu, requires_grad=true)");
    ct_tensor *y = ct_mul(x, x);
    char buf[256];
    assert_true(ct_tensor_str(y, buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, "tensor([1., 4.], shape=[2], dtype=float32, device=cpu, grad_fn=<"));
    assert_non_null(strstr(buf, ct_grad_fn_name(y)));
    ct_tensor_release(y);
    ct_tensor_release(x);
}

/* More than 1000 elements: 3 at each end of every dim longer than 6. */
static void test_summarized(void **state) {
    (void)state;
    double *v = malloc(sizeof(double) * 2000);
    for (int i = 0; i < 2000; i++) v[i] = i;
    ct_tensor *t = of(v, CT_SHAPE(2, 1000), CT_I64);
    expect(t, "tensor([[   0,    1,    2,  ...,  997,  998,  999],\n"
              "        [1000, 1001, 1002,  ..., 1997, 1998, 1999]], shape=[2, 1000], "
              "dtype=int64, device=cpu)");
    ct_tensor_release(t);
    t = of(v, CT_SHAPE(1000, 2), CT_I64);
    expect(t, "tensor([[   0,    1],\n"
              "        [   2,    3],\n"
              "        [   4,    5],\n"
              "        ...,\n"
              "        [1994, 1995],\n"
              "        [1996, 1997],\n"
              "        [1998, 1999]], shape=[1000, 2], dtype=int64, device=cpu)");
    ct_tensor_release(t);
    free(v);
    /* At the threshold nothing is elided. */
    t = ct_tensor_zeros(CT_SHAPE(1000), CT_F32, CT_CPU);
    int64_t n = ct_tensor_str(t, NULL, 0);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(ct_tensor_str(t, buf, (size_t)n + 1), n);
    assert_null(strstr(buf, "..."));
    /* Lines wrap within 80 columns, continuation lines aligned. */
    int col = 0, lines = 1;
    for (char *c = buf; *c; c++) {
        if (*c == '\n') {
            assert_true(col <= 80);
            col = 0;
            lines++;
            assert_memory_equal(c + 1, "        0.", 10);
        } else {
            col++;
        }
    }
    assert_true(lines > 10);
    free(buf);
    ct_tensor_release(t);
}

static void test_str_contract_and_errors(void **state) {
    (void)state;
    ct_tensor *t = of((const double[]){1, 2, 3}, CT_SHAPE(3), CT_I32);
    const char *want = "tensor([1, 2, 3], shape=[3], dtype=int32, device=cpu)";
    char small[10];
    memset(small, 'X', sizeof small);
    assert_int_equal(ct_tensor_str(t, small, sizeof small), (int64_t)strlen(want));
    assert_string_equal(small, "tensor([1");
    assert_int_equal(ct_tensor_str(t, NULL, 0), (int64_t)strlen(want));
    char one = 'X';
    assert_int_equal(ct_tensor_str(t, &one, 1), (int64_t)strlen(want));
    assert_int_equal(one, '\0');
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(ct_fprint(t, f), CT_OK);
    rewind(f);
    char line[128] = {0};
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_int_equal(strlen(line), strlen(want) + 1);
    assert_memory_equal(line, want, strlen(want));
    ct_tensor_release(t);
    assert_int_equal(ct_tensor_str(NULL, small, sizeof small), -1);
    assert_int_equal(ct_last_status(), CT_ERR_INVALID_ARG);
    assert_non_null(strstr(ct_last_error(), "ct_tensor_str: tensor is NULL"));
    tu_assert_error(ct_print(NULL), CT_ERR_INVALID_ARG, "ct_print", "NULL");
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_formats),
        T(test_nesting_views_and_grad),
        T(test_summarized),
        T(test_str_contract_and_errors),
    };
#undef T
    return tu_run_tests(tests);
}
