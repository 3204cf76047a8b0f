/* The dispatcher: table queries, missing kernels, trace, profile, error
 * channel, info. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "dispatch/dispatch_impl.h"
#include "test_util.h"

#include "test_fixture.h"

static void test_op_names_unique(void **state) {
    (void)state;
    for (int a = 0; a < CT_NUM_OPS; a++) {
        assert_string_not_equal(ct_op_name((ct_op)a), "invalid");
        for (int b = a + 1; b < CT_NUM_OPS; b++)
            assert_string_not_equal(ct_op_name((ct_op)a), ct_op_name((ct_op)b));
    }
    assert_string_equal(ct_op_name(CT_NUM_OPS), "invalid");
    assert_string_equal(ct_op_name((ct_op)-1), "invalid");
}

static void test_supports(void **state) {
    (void)state;
    assert_true(ct_supports(CT_OP_ADD, CT_DEVICE_CPU, CT_F32));
    assert_true(ct_supports(CT_OP_MM, CT_DEVICE_CPU, CT_F64));
    assert_int_equal(ct_supports(CT_OP_ADD, CT_DEVICE_CUDA, CT_F32), ct_backend_available(CT_DEVICE_CUDA));
    assert_false(ct_supports(CT_NUM_OPS, CT_DEVICE_CPU, CT_F32));
    assert_false(ct_supports(CT_OP_ADD, CT_NUM_DEVICE_TYPES, CT_F32));
    assert_false(ct_supports(CT_OP_ADD, CT_DEVICE_CPU, CT_NUM_DTYPES));
    assert_non_null(ct_kernel_name(CT_OP_ADD, CT_DEVICE_CPU, CT_F32));
    assert_null(ct_kernel_name(CT_OP_ADDMM, CT_DEVICE_CPU, CT_I32));
    /* Every op has at least one CPU kernel. */
    for (int op = 0; op < CT_NUM_OPS; op++) {
        bool any = false;
        for (int dt = 0; dt < CT_NUM_DTYPES; dt++) any |= ct_supports((ct_op)op, CT_DEVICE_CPU, (ct_dtype)dt);
        if (!any) fprintf(stderr, "op %s has no CPU kernel\n", ct_op_name((ct_op)op));
        assert_true(any);
    }
}

static void test_missing_kernel_error(void **state) {
    (void)state;
    ct_tensor *a = ct_tensor_zeros(CT_SHAPE(2, 2), CT_I32, CT_CPU);
    ct_call c;
    cti_call_init(&c, CT_OP_ADDMM); /* integer mm runs on the CPU, integer addmm does not */
    c.in[0] = a;
    c.in[1] = a;
    c.in[2] = a;
    c.nin = 3;
    c.out[0] = a;
    c.nout = 1;
    ct_status s = cti_dispatch(&c, CT_CPU, CT_I32);
    tu_assert_error(s, CT_ERR_UNSUPPORTED, "ct_addmm", "no kernel", "cpu", "int32");
    c.op = CT_NUM_OPS;
    s = cti_dispatch(&c, CT_CPU, CT_F32);
    tu_assert_error(s, CT_ERR_INVALID_ARG, "invalid op");
    ct_tensor_release(a);
}

/* ---- the schema and registration ------------------------------------------------ */
static void test_init_clean(void **state) {
    (void)state;
    const char *msg = NULL;
    assert_int_equal(cti_init_status(&msg), CT_OK);
    assert_string_equal(msg, "");
}

static ct_status fake_kernel(ct_call *c) {
    (void)c;
    return CT_OK;
}

static void test_register_refuses_duplicates(void **state) {
    (void)state;
    const char *before = ct_kernel_name(CT_OP_ADD, CT_DEVICE_CPU, CT_F32);
    assert_non_null(before);
    ct_status s = cti_register_kernel(CT_OP_ADD, CT_DEVICE_CPU, CT_F32, fake_kernel, "fake_add");
    tu_assert_error(s, CT_ERR_INVALID_ARG, "cti_register_kernel", "add/cpu/float32",
                    "registered twice", before, "fake_add");
    assert_ptr_equal(ct_kernel_name(CT_OP_ADD, CT_DEVICE_CPU, CT_F32), before);
    /* The table still runs the original kernel. */
    ct_scope *sc = ct_scope_begin();
    ct_tensor *a = ct_tensor_full(CT_SHAPE(3), 2.0, CT_F32, CT_CPU);
    double v;
    assert_int_equal(ct_tensor_item(ct_select(ct_add(a, a), 0, 1), &v), CT_OK);
    assert_true(v == 4.0);
    ct_scope_end(sc);
}

static void test_register_refuses_out_of_range(void **state) {
    (void)state;
    ct_status s = cti_register_kernel(CT_NUM_OPS, CT_DEVICE_CPU, CT_F32, fake_kernel, "k");
    tu_assert_error(s, CT_ERR_INVALID_ARG, "cti_register_kernel", "expected an op below");
    s = cti_register_kernel((ct_op)-1, CT_DEVICE_CPU, CT_F32, fake_kernel, "k");
    tu_assert_error(s, CT_ERR_INVALID_ARG, "cti_register_kernel", "op -1");
    s = cti_register_kernel(CT_OP_ADD, CT_NUM_DEVICE_TYPES, CT_F32, fake_kernel, "k");
    tu_assert_error(s, CT_ERR_INVALID_ARG, "cti_register_kernel", "a device below");
    s = cti_register_kernel(CT_OP_ADD, CT_DEVICE_CPU, CT_NUM_DTYPES, fake_kernel, "k");
    tu_assert_error(s, CT_ERR_INVALID_ARG, "cti_register_kernel", "a dtype below");
    s = cti_register_kernel(CT_OP_ADD, CT_DEVICE_CPU, CT_F32, NULL, "nullfn");
    tu_assert_error(s, CT_ERR_INVALID_ARG, "cti_register_kernel", "nullfn", "a function");
    /* An entry no backend filled stays empty after a refused NULL. */
    assert_int_equal(cti_register_kernel(CT_OP_ADDMM, CT_DEVICE_CPU, CT_I32, NULL, "x"),
                     CT_ERR_INVALID_ARG);
    assert_false(ct_supports(CT_OP_ADDMM, CT_DEVICE_CPU, CT_I32));
}

/* The library's own schema passes; each way of breaking a copy of it is
 * refused with a message naming the row. */
static void test_schema_validation(void **state) {
    (void)state;
    static cti_op_info rows[CT_NUM_OPS];
    bool has_formula[CT_NUM_OPS];
    int diff = -1, nodiff = -1;
    for (int k = 0; k < CT_NUM_OPS; k++) {
        rows[k] = *cti_op_schema((ct_op)k);
        has_formula[k] = rows[k].grad == CTI_GRAD_FORMULA;
        if (rows[k].grad == CTI_GRAD_FORMULA && diff < 0) diff = k;
        if (rows[k].grad == CTI_GRAD_NONE && nodiff < 0) nodiff = k;
    }
    assert_true(diff >= 0 && nodiff >= 0);
    assert_int_equal(cti_schema_validate(rows, CT_NUM_OPS, has_formula), CT_OK);

    has_formula[diff] = false;
    tu_assert_error(cti_schema_validate(rows, CT_NUM_OPS, has_formula), CT_ERR_INVALID_ARG,
                    "schema", rows[diff].name, "differentiable but names no backward formula");
    has_formula[diff] = true;

    const char *name = rows[1].name;
    rows[1].name = rows[0].name;
    tu_assert_error(cti_schema_validate(rows, CT_NUM_OPS, has_formula), CT_ERR_INVALID_ARG,
                    "schema: ops 0 and 1 are both named", rows[0].name);
    rows[1].name = name;

    rows[2].id = (ct_op)3;
    tu_assert_error(cti_schema_validate(rows, CT_NUM_OPS, has_formula), CT_ERR_INVALID_ARG,
                    "schema: row 2 has id 3");
    rows[2].id = (ct_op)2;

    int bw = rows[CT_OP_CONV2D].backward;
    assert_int_equal(bw, CT_OP_CONV2D_BACKWARD_INPUT);
    rows[CT_OP_CONV2D].backward = CT_NUM_OPS;
    tu_assert_error(cti_schema_validate(rows, CT_NUM_OPS, has_formula), CT_ERR_INVALID_ARG,
                    "schema: op conv2d names backward op", "expected another op");
    rows[CT_OP_CONV2D].backward = CT_OP_CONV2D;
    tu_assert_error(cti_schema_validate(rows, CT_NUM_OPS, has_formula), CT_ERR_INVALID_ARG,
                    "schema: op conv2d names backward op");
    rows[CT_OP_CONV2D].backward = bw;

    rows[nodiff].backward = CT_OP_CONV2D;
    tu_assert_error(cti_schema_validate(rows, CT_NUM_OPS, has_formula), CT_ERR_INVALID_ARG,
                    rows[nodiff].name, "names backward op conv2d but no backward formula");
    rows[nodiff].backward = -1;
    assert_int_equal(cti_schema_validate(rows, CT_NUM_OPS, has_formula), CT_OK);
}

/* The schema's view of a few ops, as the front ends and kernels rely on. */
static void test_schema_rows(void **state) {
    (void)state;
    const cti_op_info *conv = cti_op_schema(CT_OP_CONV2D);
    assert_string_equal(conv->name, "conv2d");
    assert_string_equal(conv->params_name, "cti_conv_params");
    assert_int_equal(conv->params_size, sizeof(cti_conv_params));
    assert_int_equal(conv->grad, CTI_GRAD_FORMULA);
    assert_int_equal(cti_op_schema(CT_OP_COPY)->params_size, 0);
    assert_int_equal(cti_op_schema(CT_OP_ARGMAX)->grad, CTI_GRAD_NONE);
    assert_int_equal(cti_op_schema(CT_OP_SOFTMAX_BACKWARD)->grad, CTI_GRAD_NOFORMULA);
    assert_int_equal(cti_op_schema(CT_OP_SOFTMAX)->backward, CT_OP_SOFTMAX_BACKWARD);
    assert_int_equal(cti_op_schema(CT_OP_ADD)->backward, -1);
    for (int k = 0; k < CT_NUM_OPS; k++) {
        assert_int_equal(cti_op_schema((ct_op)k)->id, k);
        assert_string_equal(cti_op_schema((ct_op)k)->name, ct_op_name((ct_op)k));
    }
}

/* A front end passing another family's struct is caught before any kernel
 * runs. */
static void test_params_checked(void **state) {
    (void)state;
    ct_tensor *a = ct_tensor_zeros(CT_SHAPE(2, 2), CT_F32, CT_CPU);
    ct_call c;
    cti_call_init(&c, CT_OP_ADD);
    c.in[0] = a;
    c.in[1] = a;
    c.nin = 2;
    c.out[0] = a;
    c.nout = 1;
    cti_fill_params wrong = {1.0};
    cti_call_params(&c, &wrong);
    ct_status s = cti_dispatch(&c, CT_CPU, CT_F32);
    tu_assert_error(s, CT_ERR_INVALID_ARG, "dispatch: ct_add", "8 bytes of parameters",
                    "cti_pointwise_params");
    ct_tensor_release(a);
}

static void test_backends(void **state) {
    (void)state;
    const cti_backend *cpu = cti_backend_of(CT_DEVICE_CPU);
    assert_non_null(cpu);
    assert_string_equal(cpu->name, "cpu");
    assert_int_equal(cpu->device, CT_DEVICE_CPU);
    assert_int_equal(cpu->device_count(), 1);
    assert_int_equal(cpu->synchronize(0), CT_OK);
    assert_true(ct_backend_available(CT_DEVICE_CPU));
    assert_int_equal(ct_device_count(CT_DEVICE_CPU), 1);
    const cti_backend *cuda = cti_backend_of(CT_DEVICE_CUDA);
    assert_int_equal(cuda != NULL, ct_backend_available(CT_DEVICE_CUDA));
    if (cuda) {
        assert_string_equal(cuda->name, "cuda");
        assert_int_equal(cuda->device_count(), ct_cuda_device_count());
    } else {
        /* Built without it, or its module did not load: the call says why. */
        assert_int_equal(ct_device_count(CT_DEVICE_CUDA), 0);
        assert_true(strlen(cti_backend_missing(CT_DEVICE_CUDA)) > 0);
        tu_assert_error(ct_cuda_synchronize(0), CT_ERR_DEVICE, "ct_cuda_synchronize",
                        "the CUDA backend is not loaded", cti_backend_missing(CT_DEVICE_CUDA));
    }
    assert_null(cti_backend_of(CT_NUM_DEVICE_TYPES));
}

/* What fn writes to stderr (the caller frees it); the trace is off unless fn
 * turns it on. */
static char *capture_stderr(void (*fn)(void)) {
    tu_trace t = tu_trace_begin();
    ct_set_trace(false);
    fn();
    return tu_trace_end(&t);
}

static void run_traced_add(void) {
    ct_set_trace(true);
    ct_tensor *a = ct_tensor_ones(CT_SHAPE(2, 3), CT_F32, CT_CPU);
    ct_tensor *b = ct_tensor_ones(CT_SHAPE(3), CT_F32, CT_CPU);
    ct_tensor *c = ct_add(a, b);
    ct_tensor *d = ct_mm(a, ct_t(a));
    ct_set_trace(false);
    ct_tensor *e = ct_add(a, b); /* not traced */
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(c);
    ct_tensor_release(d);
    ct_tensor_release(e);
}

static void test_trace(void **state) {
    (void)state;
    ct_scope *s = ct_scope_begin();
    char *out = capture_stderr(run_traced_add);
    ct_scope_end(s);
    /* One line for the add: op, device, dtype, shapes, kernel, time. */
    char *line = strstr(out, "[cten] add ");
    assert_non_null(line);
    char *eol = strchr(line, '\n');
    assert_non_null(eol);
    *eol = '\0';
    assert_non_null(strstr(line, "cpu"));
    assert_non_null(strstr(line, "float32"));
    assert_non_null(strstr(line, "in=[2, 3] [3]"));
    assert_non_null(strstr(line, "out=[2, 3]"));
    assert_non_null(strstr(line, "kernel="));
    assert_non_null(strstr(line, " us"));
    /* The matmul names the BLAS routine that ran. */
    assert_non_null(strstr(eol + 1, "[cten] mm "));
    assert_non_null(strstr(eol + 1, "cblas_sgemm"));
    /* The untraced add printed nothing more. */
    assert_null(strstr(eol + 1, "[cten] add "));
    free(out);
}

/* A filter by op name and by time; failures: a kernel's (a target out of
 * range, found by the CPU loss kernel) on its dispatch line with the
 * message, an argument check's (matmul shapes) on a line of its own. */
static void run_traced_filters(void) {
    ct_tensor *a = ct_tensor_ones(CT_SHAPE(2, 3), CT_F32, CT_CPU);
    ct_tensor *lp = ct_tensor_zeros(CT_SHAPE(2, 3), CT_F32, CT_CPU);
    ct_tensor *tg = ct_tensor_full(1, (const int64_t[]){2}, 7, CT_I64, CT_CPU);
    ct_set_trace(true);
    assert_int_equal(ct_set_trace_filter("mm, ct_nll_loss"), CT_OK);
    ct_tensor *c = ct_add(a, a);                             /* filtered out */
    ct_tensor *d = ct_mm(a, ct_t(a));                         /* shown */
    assert_null(ct_mm(a, a));                                 /* shown: argument check */
    assert_null(ct_add(a, ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU))); /* filtered out */
    assert_null(ct_nll_loss(lp, tg, NULL, CT_REDUCTION_MEAN, -100));   /* shown: kernel */
    assert_int_equal(ct_set_trace_filter("min=10s"), CT_OK);
    ct_tensor *e = ct_mul(a, a);                              /* too fast to show */
    assert_null(ct_nll_loss(lp, tg, NULL, CT_REDUCTION_SUM, -100)); /* failures always show */
    /* A bad filter changes nothing. */
    tu_assert_error(ct_set_trace_filter("mm,matmull"), CT_ERR_INVALID_ARG, "ct_set_trace_filter",
                    "unknown op 'matmull'");
    tu_assert_error(ct_set_trace_filter("min=5 parsecs"), CT_ERR_INVALID_ARG, "not a time");
    ct_tensor *f = ct_div(a, a);                              /* still too fast */
    ct_set_trace(false);
    assert_int_equal(ct_set_trace_filter(NULL), CT_OK);
    ct_tensor_release(a), ct_tensor_release(lp), ct_tensor_release(tg);
    ct_tensor_release(c), ct_tensor_release(d), ct_tensor_release(e), ct_tensor_release(f);
}

static void test_trace_filter_and_failures(void **state) {
    (void)state;
    ct_scope *s = ct_scope_begin();
    char *out = capture_stderr(run_traced_filters);
    ct_scope_end(s);
    assert_null(strstr(out, "[cten] add "));
    assert_null(strstr(out, "ct_add"));
    assert_null(strstr(out, "[cten] mul "));
    assert_null(strstr(out, "[cten] div "));
    assert_non_null(strstr(out, "[cten] mm "));
    char *arg = strstr(out, "[cten] FAILED CT_ERR_SHAPE: ct_mm: ");
    assert_non_null(arg);
    /* The kernel's failures: on the dispatch line, with the message; the
     * second one although it is filtered by time. */
    char *k1 = strstr(out, "[cten] nll_loss ");
    assert_non_null(k1);
    char *eol = strchr(k1, '\n');
    assert_non_null(eol);
    *eol = '\0';
    assert_non_null(strstr(k1, "FAILED CT_ERR_INDEX: ct_nll_loss: target 7 is out of bounds"));
    assert_non_null(strstr(eol + 1, "[cten] nll_loss "));
    /* The kernel's error is not shown a second time on a line of its own. */
    assert_null(strstr(eol + 1, "[cten] FAILED CT_ERR_INDEX"));
    assert_null(strstr(out, "matmull"));
    free(out);
}

static void test_profile(void **state) {
    (void)state;
    ct_profile_reset();
    ct_set_profile(true);
    ct_tensor *a = ct_tensor_ones(CT_SHAPE(4, 4), CT_F64, CT_CPU);
    for (int i = 0; i < 7; i++) {
        ct_tensor *b = ct_mul(a, a);
        ct_tensor_release(b);
    }
    /* the device waits change nothing on the CPU: the calls count the same */
    ct_set_profile_sync(true);
    assert_true(ct_profile_sync_enabled());
    for (int i = 0; i < 7; i++) {
        ct_tensor *b = ct_mul(a, a);
        assert_non_null(b);
        ct_tensor_release(b);
    }
    ct_set_profile_sync(false);
    assert_false(ct_profile_sync_enabled());
    ct_set_profile(false);
    FILE *tmp = tmpfile();
    ct_profile_print(tmp);
    long n = ftell(tmp);
    rewind(tmp);
    char *buf = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(buf, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    char *row = strstr(buf, "cten profile: mul ");
    assert_non_null(row);
    assert_non_null(strstr(row, "float64"));
    int calls = 0;
    char name[32], dev[16], dt[16];
    assert_int_equal(sscanf(row, "cten profile: %31s %15s %15s %d", name, dev, dt, &calls), 4);
    assert_int_equal(calls, 14);
    free(buf);
    ct_profile_reset();
    ct_tensor_release(a);
}

static void test_error_channel(void **state) {
    (void)state;
    ct_clear_error();
    assert_int_equal(ct_last_status(), CT_OK);
    assert_string_equal(ct_last_error(), "");
    ct_tensor *a = ct_tensor_zeros(CT_SHAPE(3, 4), CT_F32, CT_CPU);
    ct_tensor *b = ct_tensor_zeros(CT_SHAPE(5, 6), CT_F32, CT_CPU);
    ct_tensor *c = ct_matmul(a, b);
    tu_assert_null_error(c, CT_ERR_SHAPE, "ct_matmul", "[3, 4]", "[5, 6]");
    /* A failing call nested in another keeps the cause in the message. */
    ct_tensor *d = ct_relu(ct_matmul(a, b));
    tu_assert_null_error(d, CT_ERR_INVALID_ARG, "ct_relu", "NULL", "ct_matmul", "[5, 6]");
    /* Success does not clear the channel; ct_clear_error does. */
    ct_tensor *e = ct_relu(a);
    assert_non_null(e);
    assert_int_equal(ct_last_status(), CT_ERR_INVALID_ARG);
    ct_clear_error();
    assert_int_equal(ct_last_status(), CT_OK);
    assert_string_equal(ct_status_name(CT_ERR_SHAPE), "CT_ERR_SHAPE");
    assert_string_equal(ct_status_name(CT_OK), "CT_OK");
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(e);
}

static void *thread_error(void *arg) {
    (void)arg;
    /* Each thread has its own channel. */
    ct_clear_error();
    ct_tensor *x = ct_tensor_zeros(-1, NULL, CT_F32, CT_CPU);
    return (void *)(intptr_t)(x == NULL && ct_last_status() == CT_ERR_SHAPE);
}

static void test_error_thread_local(void **state) {
    (void)state;
    ct_clear_error();
    pthread_t th;
    void *ok = NULL;
    assert_int_equal(pthread_create(&th, NULL, thread_error, NULL), 0);
    pthread_join(th, &ok);
    assert_true(ok != NULL);
    assert_int_equal(ct_last_status(), CT_OK);
}

static void test_info(void **state) {
    (void)state;
    FILE *tmp = tmpfile();
    ct_print_info(tmp);
    long n = ftell(tmp);
    rewind(tmp);
    char *buf = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(buf, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    assert_non_null(strstr(buf, "cten " CT_VERSION_STRING));
    assert_non_null(strstr(buf, "BLAS"));
    assert_non_null(strstr(buf, "OpenBLAS"));
    assert_non_null(strstr(buf, "threads"));
    free(buf);
    assert_true(ct_backend_available(CT_DEVICE_CPU));
    assert_int_equal(ct_device_count(CT_DEVICE_CPU), 1);
    assert_non_null(strstr(ct_blas_info(), "OpenBLAS"));
}

static void test_device_strings(void **state) {
    (void)state;
    char buf[32];
    assert_string_equal(ct_device_str(CT_CPU, buf, sizeof buf), "cpu");
    assert_string_equal(ct_device_str(CT_CUDA(1), buf, sizeof buf), "cuda:1");
    assert_true(ct_device_eq(CT_CPU, CT_CPU));
    assert_false(ct_device_eq(CT_CPU, CT_CUDA(0)));
    assert_false(ct_device_eq(CT_CUDA(0), CT_CUDA(1)));
    /* Tensors on a device whose backend is not built cannot be made. */
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(2), CT_F32, CT_CUDA(0));
    if (!ct_backend_available(CT_DEVICE_CUDA)) tu_assert_null_error(t, CT_ERR_DEVICE, "cuda:0");
    ct_tensor_release(t);
}

static void test_cpu_block_cache(void **state) {
    (void)state;
    ct_cpu_empty_cache();
    assert_int_equal(ct_cpu_cached_bytes(), 0);
    /* A large block comes back from the cache for the next tensor of its size. */
    ct_tensor *a = ct_tensor_empty(CT_SHAPE(1024, 1024), CT_F32, CT_CPU);
    void *pa = ct_tensor_data_ptr(a);
    ct_tensor_release(a);
    assert_true(ct_cpu_cached_bytes() >= 4u << 20);
    ct_tensor *b = ct_tensor_full(CT_SHAPE(1024, 1024), 3.0, CT_F32, CT_CPU);
    assert_ptr_equal(ct_tensor_data_ptr(b), pa);
    assert_int_equal(ct_cpu_cached_bytes(), 0);
    /* Reused memory holds what the new tensor wrote, not the old data. */
    double v = 0;
    ct_scope *s = ct_scope_begin();
    assert_int_equal(ct_tensor_item(ct_select(ct_select(b, 0, -1), 0, -1), &v), CT_OK);
    ct_scope_end(s);
    assert_true(v == 3.0);
    ct_tensor_release(b);
    ct_cpu_empty_cache();
    assert_int_equal(ct_cpu_cached_bytes(), 0);
    /* Small tensors never enter the cache. */
    ct_tensor *c = ct_tensor_zeros(CT_SHAPE(16), CT_F32, CT_CPU);
    ct_tensor_release(c);
    assert_int_equal(ct_cpu_cached_bytes(), 0);
}

/* ---- the capture guard (dispatch_impl.h), which a CUDA graph capture installs ---------- */

typedef struct refusal {
    int calls;
    ct_status status;
    char message[1024];
} refusal;

static void note_refusal(void *ctx, ct_status st, const char *message) {
    refusal *r = ctx;
    r->calls++;
    r->status = st;
    snprintf(r->message, sizeof r->message, "%s", message);
}

/* Another thread's calls are not guarded. */
static void *unguarded_add(void *arg) {
    ct_tensor *a = arg, *b = ct_add(a, a);
    bool ok = b != NULL;
    ct_tensor_release(b);
    return (void *)(intptr_t)ok;
}

static void test_capture_guard(void **state) {
    (void)state;
    ct_tensor *a = ct_tensor_ones(CT_SHAPE(3), CT_F32, CT_CPU);
    ct_tensor *d = ct_tensor_zeros(CT_SHAPE(3), CT_F32, CT_CPU);
    assert_non_null(a);
    assert_non_null(d);
    refusal r = {0};
    cti_capture_guard g = {CT_CUDA(0), "captures a CUDA graph", note_refusal, &r};
    cti_dispatch_guard(&g);
    /* A CPU kernel would run once, at capture: refused, and the guard told. */
    tu_assert_null_error(ct_add(a, a), CT_ERR_CAPTURE, "ct_add: [3] float32 cpu:",
                         "this thread captures a CUDA graph on cuda:0", "never at replay");
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.status, CT_ERR_CAPTURE);
    assert_string_equal(r.message, ct_last_error());
    /* A copy with the host has its own words. */
    tu_assert_error(ct_copy_(d, a), CT_ERR_CAPTURE, "ct_copy_",
                    "a copy between the host and cuda:0 cannot be captured", "static input",
                    "after it");
    assert_int_equal(r.calls, 2);
    float v[3] = {-1, -1, -1};
    assert_int_equal(ct_tensor_copy_to_host(d, v, sizeof v), CT_OK); /* host memory only */
    assert_true(v[0] == 0.0f && v[2] == 0.0f);
    pthread_t th;
    void *ok = NULL;
    assert_int_equal(pthread_create(&th, NULL, unguarded_add, a), 0);
    pthread_join(th, &ok);
    assert_true(ok != NULL);
    assert_int_equal(r.calls, 2);
    /* A guard for the device the tensors are on lets them through. */
    cti_capture_guard cpu = {CT_CPU, "captures a CUDA graph", note_refusal, &r};
    cti_dispatch_guard(&cpu);
    ct_tensor *b = ct_add(a, a);
    assert_non_null(b);
    ct_tensor_release(b);
    cti_dispatch_guard(NULL);
    b = ct_add(a, a);
    assert_non_null(b);
    assert_int_equal(r.calls, 2);
    ct_tensor_release(b);
    ct_tensor_release(a);
    ct_tensor_release(d);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_op_names_unique, setup, teardown),
        cmocka_unit_test_setup_teardown(test_supports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_kernel_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_clean, setup, teardown),
        cmocka_unit_test_setup_teardown(test_register_refuses_duplicates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_register_refuses_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schema_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schema_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_params_checked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_filter_and_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_profile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_channel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_thread_local, setup, teardown),
        cmocka_unit_test_setup_teardown(test_info, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_strings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cpu_block_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capture_guard, setup, teardown),
    };
    return tu_run_tests(tests);
}
