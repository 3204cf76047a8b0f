/* Collectives on CUDA tensors through NCCL (tensor/dist.h), with a
 * communicator of one rank: the group is made from RANK=0 WORLD_SIZE=1 (no
 * launcher), which makes NCCL's id on rank 0 and passes it through the
 * rendezvous text as a multi-rank launch does. With one rank every
 * reduction is its input, which the results must equal bit for bit, for
 * every dtype, ops, contiguous and not; data-parallel training and ZeRO-1
 * on the GPU must give what plain training gives. The program is skipped
 * without a usable GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "cuda_module.h"
#include "cuda_test_util.h"
#include "test_fixture.h"

static ct_tensor *on_gpu(ct_tensor *t) {
    ct_tensor *g = checked(ct_to_device(t, CT_CUDA(0)));
    ct_tensor_release(t);
    return g;
}

static void random_shape(int *nd, int64_t *shape) {
    *nd = (int)tu_randint(1, 4);
    for (int d = 0; d < *nd; d++) shape[d] = tu_randint(1, 9);
}

/* in (random values of dt on the GPU, contiguous or a strided view) through
 * kind; every result must equal in's values. */
static void one_rank_case(ct_dtype dt, int kind, ct_dist_op op, bool noncontig) {
    int nd;
    int64_t shape[CT_MAX_DIMS];
    random_shape(&nd, shape);
    int64_t n = tu_numel(nd, shape);
    double *v;
    ct_tensor *base = on_gpu(tu_rand(nd, shape, dt, -50, 50, &v));
    ct_tensor *in = noncontig ? checked(tu_noncontig(base)) : ct_tensor_retain(base);
    ct_tensor *out = in;
    ct_tensor *fresh = NULL;
    switch (kind) {
    case 0: ok(ct_dist_all_reduce(in, op)); break;
    case 1: ok(ct_dist_broadcast(in, 0)); break;
    default:
        fresh = checked(ct_tensor_empty(nd, shape, dt, CT_CUDA(0)));
        out = noncontig ? checked(tu_noncontig(fresh)) : ct_tensor_retain(fresh);
        ok(ct_fill_(out, ct_dtype_is_floating(dt) ? NAN : 77));
        if (kind == 2) ok(ct_dist_all_gather(out, in));
        else ok(ct_dist_reduce_scatter(out, in, op));
    }
    double *got = tu_values(out);
    tu_assert_close(got, v, n, 0, 0);
    free(got);
    free(v);
    if (out != in) ct_tensor_release(out);
    ct_tensor_release(fresh);
    ct_tensor_release(in);
    ct_tensor_release(base);
}

static void test_collectives_every_dtype(void **state) {
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof *tu_all_dtypes; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        for (int nc = 0; nc < 2; nc++) {
            ct_dist_op ops[] = {CT_DIST_SUM, CT_DIST_MAX, CT_DIST_AVG};
            for (int o = 0; o < 3; o++) {
                if (ops[o] == CT_DIST_AVG && !ct_dtype_is_floating(dt)) continue;
                one_rank_case(dt, 0, ops[o], nc);
                one_rank_case(dt, 3, ops[o], nc);
            }
            one_rank_case(dt, 1, CT_DIST_SUM, nc);
            one_rank_case(dt, 2, CT_DIST_SUM, nc);
        }
    }
    ok(ct_dist_barrier());
    ok(ct_cuda_synchronize(0));
}

static void test_wrong_device(void **state) {
    if (ct_cuda_device_count() < 2) {
        /* The check needs a second device; the communicator is on cuda:0. */
        return;
    }
    ct_tensor *t = checked(ct_tensor_zeros(1, (int64_t[]){4}, CT_F32, CT_CUDA(1)));
    tu_assert_error(ct_dist_all_reduce(t, CT_DIST_SUM), CT_ERR_DEVICE, "cuda:0", "cuda:1",
                    "one device per process");
    ct_tensor_release(t);
}

/* ---- DDP on the GPU: one rank's averages are its own gradients ------------------------------ */
typedef struct mlp {
    ct_nn_linear *fc1, *fc2;
    ct_params *params;
} mlp;

static void mlp_init(mlp *m) {
    ct_generator *gen = ct_generator_new(7);
    m->fc1 = ct_nn_linear_new(64, 32, true, CT_F32, CT_CUDA(0), gen);
    m->fc2 = ct_nn_linear_new(32, 10, true, CT_F32, CT_CUDA(0), gen);
    ct_generator_free(gen);
    assert_non_null(m->fc2);
    m->params = ct_params_new();
    ok(ct_nn_linear_params(m->fc1, "fc1", m->params));
    ok(ct_nn_linear_params(m->fc2, "fc2", m->params));
}

static void mlp_free(mlp *m) {
    ct_nn_linear_free(m->fc1);
    ct_nn_linear_free(m->fc2);
    ct_params_free(m->params);
}

static void train(mlp *m, int mode /* 0 plain, 1 DDP, 2 ZeRO-1 */) {
    ct_ddp *d = NULL;
    const ct_params *p = m->params;
    if (mode) {
        d = ct_ddp_new(m->params, &(ct_ddp_options){.bucket_mb = 0.004, .zero1 = mode == 2});
        assert_non_null(d);
        p = ct_ddp_optim_params(d);
    }
    ct_optimizer *opt = ct_optim_adamw_new(p, 1e-2, 0.9, 0.999, 1e-8, 1e-2);
    assert_non_null(opt);
    ct_generator *gen = ct_generator_new(11);
    for (int s = 0; s < 3; s++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *x = checked(ct_tensor_randn(gen, 2, (int64_t[]){16, 64}, CT_F32, CT_CUDA(0)));
        ct_tensor *y =
            checked(ct_tensor_randint(gen, 0, 10, 1, (int64_t[]){16}, CT_I64, CT_CUDA(0)));
        ct_tensor *h = ct_relu(ct_nn_linear_forward(m->fc1, x));
        ct_tensor *loss = checked(ct_cross_entropy(ct_nn_linear_forward(m->fc2, h), y, NULL,
                                                   CT_REDUCTION_MEAN, -100, 0.0));
        ct_optim_zero_grad(opt);
        if (mode) {
            ok(ct_ddp_backward(d, loss, NULL));
            ok(ct_ddp_step(d, opt));
        } else {
            ok(ct_backward(loss, NULL, false));
            ok(ct_optim_step(opt));
        }
        ct_scope_end(sc);
    }
    ct_generator_free(gen);
    ct_optim_free(opt);
    ct_ddp_free(d);
}

static void test_ddp_and_zero1(void **state) {
    mlp plain, ddp, zero;
    mlp_init(&plain);
    mlp_init(&ddp);
    mlp_init(&zero);
    train(&plain, 0);
    train(&ddp, 1);
    train(&zero, 2);
    for (int64_t k = 0; k < ct_params_count(plain.params); k++) {
        ct_tensor *a = ct_params_get(plain.params, k, NULL);
        double *va = tu_values(a), *vb = tu_values(ct_params_get(ddp.params, k, NULL));
        double *vz = tu_values(ct_params_get(zero.params, k, NULL));
        tu_assert_close(vb, va, ct_tensor_numel(a), 1e-6, 1e-7);
        tu_assert_close(vz, va, ct_tensor_numel(a), 1e-6, 1e-7);
        free(va);
        free(vb);
        free(vz);
    }
    mlp_free(&plain);
    mlp_free(&ddp);
    mlp_free(&zero);
}

int main(void) {
    tu_cuda_devices_or_skip("test_cuda_dist");
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("LOCAL_RANK", "0", 1);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_SIZE");
    unsetenv("PMIX_RANK");
    /* The library's bound (CT_DIST_TIMEOUT, else 300 s): NCCL's first
     * communicator takes over a minute under compute-sanitizer on a busy
     * machine, and one rank has no peer to wait for. */
    if (ct_dist_init(NULL) != CT_OK) {
        fprintf(stderr, "ct_dist_init: %s\n", ct_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_collectives_every_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ddp_and_zero1, setup, teardown),
    };
    int failed = tu_run_tests(tests);
    ct_status st = ct_dist_finalize();
    if (st != CT_OK) fprintf(stderr, "ct_dist_finalize: %s\n", ct_last_error());
    return failed || st != CT_OK;
}
