/* Backend modules: where libcten.so finds the CUDA module, when it loads it,
 * and what the library says when it does not: the reason, in ct_print_info
 * and in every public call that needs the backend, with the CPU unaffected.
 *
 * A process loads its modules once, at init, so each case is a run of this
 * program in a fresh process (tests/meson.build), named by its argument:
 *   default       whatever this machine gives, checked for consistency
 *   static        linked with the static library, which loads no module
 *   off           CT_CUDA_MODULE=none
 *   no_file       CT_CUDA_MODULE names a file that does not exist
 *   dlopen_error  CT_CUDA_MODULE names a file that is not a library, with
 *                 the toolkit's stub driver in front, so dlopen is reached
 *   not_module    CT_CUDA_MODULE names a library that is not a cten module
 *                 (the stub driver itself)
 *   stub_driver   the stub driver in front: the module loads and finds no
 *                 usable device, as on a machine with a driver and no GPU */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <limits.h>

#include "test_util.h"
#include "test_fixture.h"

#include "dispatch/dispatch_impl.h"

static const char *scenario;

static ct_tensor *checked(ct_tensor *t) {
    if (!t) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(t);
    return t;
}

/* ct_print_info's text. */
static char *info_text(void) {
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    ct_print_info(tmp);
    long n = ftell(tmp);
    char *buf = calloc((size_t)n + 1, 1);
    rewind(tmp);
    assert_int_equal(fread(buf, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    return buf;
}

static void assert_contains(const char *text, const char *word) {
    if (!strstr(text, word)) {
        fprintf(stderr, "\"%s\" lacks \"%s\"\n", text, word);
        fail();
    }
}

/* The CPU is unaffected by whatever happened to the CUDA module. */
static void cpu_still_works(void) {
    ct_tensor *c = checked(tu_rand(CT_SHAPE(4), CT_F32, -1, 1, NULL));
    ct_tensor *d = checked(ct_add(c, c));
    double *vc = tu_values(c), *vd = tu_values(d);
    for (int i = 0; i < 4; i++) assert_true(vd[i] == 2 * vc[i]);
    free(vc);
    free(vd);
    ct_tensor_release(d);
    ct_tensor_release(c);
}

/* The CUDA backend is absent; its reason contains each of words. Every
 * public call that needs it fails, naming itself and carrying the reason. */
static void check_absent(const char *const *words) {
    assert_null(cti_backend_of(CT_DEVICE_CUDA));
    assert_false(ct_backend_available(CT_DEVICE_CUDA));
    assert_int_equal(ct_device_count(CT_DEVICE_CUDA), 0);
    assert_false(ct_cuda_available());
    assert_int_equal(ct_cuda_device_count(), 0);
    assert_false(ct_supports(CT_OP_ADD, CT_DEVICE_CUDA, CT_F32));
    assert_null(cti_module_path(CT_DEVICE_CUDA));
    assert_null(cti_module_symbol(CT_DEVICE_CUDA, "cti_cuda_host_waits"));
    const char *why = cti_backend_missing(CT_DEVICE_CUDA);
    fprintf(stderr, "[ module   ] cuda not loaded: %s\n", why);
    assert_true(strlen(why) > 0);
    for (int k = 0; words[k]; k++) assert_contains(why, words[k]);

    ct_cuda_device_props p;
    tu_assert_error(ct_cuda_get_device_properties(0, &p), CT_ERR_DEVICE,
                    "ct_cuda_get_device_properties", why);
    tu_assert_error(ct_cuda_synchronize(0), CT_ERR_DEVICE, "ct_cuda_synchronize", why);
    tu_assert_null_error(ct_cuda_stream(0), CT_ERR_DEVICE, "ct_cuda_stream", why);
    ct_cuda_memstats m;
    tu_assert_error(ct_cuda_memory_stats(0, &m), CT_ERR_DEVICE, "ct_cuda_memory_stats", why);
    tu_assert_error(ct_cuda_reset_peak_memory_stats(0), CT_ERR_DEVICE,
                    "ct_cuda_reset_peak_memory_stats", why);
    tu_assert_error(ct_cuda_empty_cache(-1), CT_ERR_DEVICE, "ct_cuda_empty_cache", why);
    tu_assert_null_error(ct_tensor_empty(CT_SHAPE(2, 3), CT_F32, CT_CUDA(0)), CT_ERR_DEVICE,
                         "ct_tensor_empty", "cuda:0", why);
    tu_assert_null_error(ct_cuda_graph_capture_begin(0), CT_ERR_DEVICE,
                         "ct_cuda_graph_capture_begin", "the CUDA backend is not loaded", why);
    tu_assert_error(ct_cuda_graph_capture_end(NULL), CT_ERR_DEVICE, "ct_cuda_graph_capture_end",
                    "the CUDA backend is not loaded", why);
    tu_assert_error(ct_cuda_graph_replay(NULL), CT_ERR_DEVICE, "ct_cuda_graph_replay",
                    "the CUDA backend is not loaded", why);
    ct_cuda_graph_free(NULL);

    char *info = info_text();
    char line[2048];
    snprintf(line, sizeof line, "  cuda: not loaded: %s\n", why);
    assert_contains(info, line);
    free(info);
    cpu_still_works();
}

/* The directory of the libcten.so this program runs with, resolved. */
static void library_dir(char *buf) {
    Dl_info self;
    assert_true(dladdr((void *)&ct_print_info, &self));
    assert_non_null(realpath(self.dli_fname, buf));
    *strrchr(buf, '/') = '\0';
}

/* The module loaded (from beside libcten.so: the build tree's layout) and
 * finds no usable device; the public calls reach it through the library
 * and fail with its reason, naming the device. */
static void check_loaded_without_device(void) {
    const cti_backend *b = cti_backend_of(CT_DEVICE_CUDA);
    assert_non_null(b);
    assert_string_equal(b->name, "cuda");
    assert_true(ct_backend_available(CT_DEVICE_CUDA));
    assert_string_equal(cti_backend_missing(CT_DEVICE_CUDA), "");
    assert_null(cti_module_missing(CT_DEVICE_CUDA));
    char dir[PATH_MAX], expected[PATH_MAX + 32];
    library_dir(dir);
    snprintf(expected, sizeof expected, "%s/libcten-cuda.so", dir);
    assert_string_equal(cti_module_path(CT_DEVICE_CUDA), expected);
    /* Its kernels are registered: there is just no device to run them. */
    assert_true(ct_supports(CT_OP_ADD, CT_DEVICE_CUDA, CT_F32));
    /* The module's internals and the CUDA runtime it links can be looked up. */
    assert_non_null(cti_module_symbol(CT_DEVICE_CUDA, "cti_cuda_host_waits"));
    assert_non_null(cti_module_symbol(CT_DEVICE_CUDA, "cudaStreamSynchronize"));
    assert_null(cti_module_symbol(CT_DEVICE_CUDA, "no_such_symbol"));

    assert_false(ct_cuda_available());
    assert_int_equal(ct_cuda_device_count(), 0);
    assert_int_equal(ct_device_count(CT_DEVICE_CUDA), 0);
    ct_cuda_device_props p;
    tu_assert_error(ct_cuda_get_device_properties(0, &p), CT_ERR_DEVICE,
                    "ct_cuda_get_device_properties", "cuda:0", "not available", "stub");
    fprintf(stderr, "[ module   ] loaded, no device: %s\n", ct_last_error());
    tu_assert_null_error(ct_tensor_empty(CT_SHAPE(2, 3), CT_F32, CT_CUDA(0)), CT_ERR_DEVICE,
                         "ct_tensor_empty", "cuda:0", "not available");
    ct_tensor *c = checked(tu_rand(CT_SHAPE(4), CT_F32, -1, 1, NULL));
    tu_assert_null_error(ct_to_device(c, CT_CUDA(0)), CT_ERR_DEVICE, "ct_to_device", "cuda:0");
    ct_tensor_release(c);
    ct_cuda_memstats m;
    tu_assert_error(ct_cuda_memory_stats(0, &m), CT_ERR_DEVICE, "ct_cuda_memory_stats", "cuda:0");
    tu_assert_error(ct_cuda_synchronize(0), CT_ERR_DEVICE, "ct_cuda_synchronize", "cuda:0");
    tu_assert_null_error(ct_cuda_stream(0), CT_ERR_DEVICE, "ct_cuda_stream", "cuda:0");
    tu_assert_null_error(ct_cuda_graph_capture_begin(0), CT_ERR_DEVICE,
                         "ct_cuda_graph_capture_begin", "cuda:0", "not available");
    tu_assert_error(ct_cuda_graph_capture_end(NULL), CT_ERR_INVALID_ARG,
                    "ct_cuda_graph_capture_end", "graph is NULL");
    tu_assert_error(ct_cuda_graph_replay(NULL), CT_ERR_INVALID_ARG, "ct_cuda_graph_replay",
                    "graph is NULL");
    ct_cuda_graph_free(NULL);

    char *info = info_text();
    char line[4300];
    snprintf(line, sizeof line, "  cuda: loaded from %s\n", expected);
    assert_contains(info, line);
    assert_contains(info, "  cuda: no device usable: ");
    free(info);
    cpu_still_works();
}

static void test_module(void **state) {
    (void)state;
    ct_clear_error();
    if (!strcmp(scenario, "default")) {
#ifdef CT_TEST_CUDA_MODULE
        if (cti_backend_of(CT_DEVICE_CUDA)) {
            assert_non_null(cti_module_path(CT_DEVICE_CUDA));
            assert_string_equal(cti_backend_missing(CT_DEVICE_CUDA), "");
            fprintf(stderr, "[ module   ] cuda loaded from %s, %d device(s)\n",
                    cti_module_path(CT_DEVICE_CUDA), ct_cuda_device_count());
            cpu_still_works();
        } else {
            check_absent((const char *const[]){NULL});
        }
#else
        check_absent((const char *const[]){"cten was built without the cuda backend", NULL});
#endif
    } else if (!strcmp(scenario, "static")) {
#ifdef CT_TEST_CUDA_MODULE
        check_absent((const char *const[]){"links cten statically", "libcten.so", NULL});
#else
        check_absent((const char *const[]){"cten was built without the cuda backend", NULL});
#endif
    } else if (!strcmp(scenario, "off")) {
        check_absent((const char *const[]){"turned off", "CT_CUDA_MODULE=none", NULL});
    } else if (!strcmp(scenario, "no_file")) {
        check_absent((const char *const[]){"CT_CUDA_MODULE=", "no-such-module.so",
                                           "No such file", NULL});
    } else if (!strcmp(scenario, "dlopen_error")) {
        /* dlopen's own words, which name the file. */
        check_absent((const char *const[]){"test_module.c", NULL});
        assert_null(strstr(cti_backend_missing(CT_DEVICE_CUDA), "no driver"));
    } else if (!strcmp(scenario, "not_module")) {
        check_absent((const char *const[]){"libcuda.so", "is not a cten backend module",
                                           "cti_module_abi", NULL});
    } else if (!strcmp(scenario, "stub_driver")) {
        /* On a machine with a GPU the CUDA runtime can reach the real driver
         * past the stub; the case is about machines without one. */
        if (ct_cuda_available()) skip();
        check_loaded_without_device();
    } else {
        fprintf(stderr, "unknown case %s\n", scenario);
        fail();
    }
}

int main(int argc, char **argv) {
    scenario = argc > 1 ? argv[1] : "default";
    const struct CMUnitTest tests[] = {cmocka_unit_test_setup_teardown(test_module, setup, teardown)};
    return cmocka_run_group_tests_name(scenario, tests, NULL, NULL);
}
