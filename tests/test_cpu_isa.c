/* The CPU kernels' instruction-set level: what init chose against what the
 * CPU reports and what CT_CPU_ISA asked for, and that the info lines say so.
 * meson runs this program (and the kernel tests) once per level with
 * CT_CPU_ISA set; every other test program runs the level chosen here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backends/cpu/cpu_impl.h"
#include "test_util.h"

#include "test_fixture.h"

static char *info_text(void) {
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    ct_print_info(tmp);
    long n = ftell(tmp);
    rewind(tmp);
    char *buf = calloc((size_t)n + 1, 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    return buf;
}

/* The level CT_CPU_ISA names, or -1 when unset or not a level. */
static int forced_level(void) {
    const char *e = getenv("CT_CPU_ISA");
    if (!e) return -1;
    for (int k = 0; k < CTI_ISA_COUNT; k++)
        if (strcmp(e, cti_cpu_isa_name((cti_isa)k)) == 0) return k;
    return -1;
}

static void test_level_chosen(void **state) {
    (void)state;
    cti_init();
    cti_isa det = cti_cpu_isa_detected(), got = cti_cpu_isa();
    int f = forced_level();
    cti_isa want = f >= 0 && (cti_isa)f < det ? (cti_isa)f : det;
    fprintf(stderr, "[ isa      ] detected %s, CT_CPU_ISA=%s, running %s\n", cti_cpu_isa_name(det),
            getenv("CT_CPU_ISA") ? getenv("CT_CPU_ISA") : "(unset)", cti_cpu_isa_name(got));
    assert_int_equal(got, want);

    char *info = info_text();
    char line[64];
    snprintf(line, sizeof line, "kernels: %s", cti_cpu_isa_name(got));
#ifdef CTI_CPU_NATIVE
    snprintf(line, sizeof line, "level %s", cti_cpu_isa_name(got));
    assert_non_null(strstr(info, "kernels: native"));
#endif
    assert_non_null(strstr(info, line));
    if (getenv("CT_CPU_ISA") && *getenv("CT_CPU_ISA") && f < 0)
        assert_non_null(strstr(info, "is not a level"));
    free(info);
}

/* Detection agrees with the compiler runtime's own, which also checks that
 * the OS saves the registers (XCR0). */
static void test_detection_matches_cpu(void **state) {
    (void)state;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx512vl");
    cti_isa det = cti_cpu_isa_detected();
    if (det >= CTI_ISA_AVX2) assert_true(v3);
    if (det >= CTI_ISA_AVX512) assert_true(v4);
    if (v4) assert_int_equal(det, CTI_ISA_AVX512);
#else
    assert_int_equal(cti_cpu_isa_detected(), CTI_ISA_BASELINE);
#endif
}

/* A forced lower level also keeps the hand-written AVX-512 convolution off:
 * the routine a 3x3 convolution reports says which path ran. */
static void test_conv_path_follows_level(void **state) {
    (void)state;
    cti_conv_params p = {.N = 2, .C = 32, .H = 12, .W = 12, .Co = 32, .kh = 3, .kw = 3,
                         .stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1,
                         .OH = 12, .OW = 12};
    ct_tensor *x = ct_tensor_ones(CT_SHAPE(2, 32, 12, 12), CT_F32, CT_CPU);
    ct_tensor *w = ct_tensor_ones(CT_SHAPE(32, 32, 3, 3), CT_F32, CT_CPU);
    ct_tensor *y = ct_tensor_empty(CT_SHAPE(2, 32, 12, 12), CT_F32, CT_CPU);
    assert_non_null(x);
    assert_non_null(w);
    assert_non_null(y);
    ct_call c;
    cti_call_init(&c, CT_OP_CONV2D);
    cti_call_params(&c, &p);
    c.in[0] = x;
    c.in[1] = w;
    c.in[2] = NULL;
    c.nin = 3;
    c.out[0] = y;
    c.nout = 1;
    assert_int_equal(cti_dispatch(&c, CT_CPU, CT_F32), CT_OK);
    assert_non_null(c.routine);
    fprintf(stderr, "[ routine  ] %s\n", c.routine);
    assert_true((strstr(c.routine, "avx512") != NULL) == (cti_cpu_isa() >= CTI_ISA_AVX512));
    /* ones: a corner output sums 32 channels x 2 x 2 taps, an inner one 32 x 3 x 3 */
    const float *v = ct_tensor_data_ptr(y);
    assert_float_equal(v[0], 32 * 4, 0);
    assert_float_equal(v[12 + 1], 32 * 9, 0);
    ct_tensor_release(y);
    ct_tensor_release(w);
    ct_tensor_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_level_chosen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_detection_matches_cpu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv_path_follows_level, setup, teardown),
    };
    return tu_run_tests(tests);
}
