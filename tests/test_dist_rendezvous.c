/* Process groups made without MPI (tensor/dist.h): a process on its own,
 * and RANK/WORLD_SIZE launches meeting at a rendezvous file, with the file
 * missing, stale (left by a launch whose rank 0 is gone, or of another
 * size), not a rendezvous file, or joined by a rank 0 that comes later.
 * Ranks are this process and, where two must meet, a child it forks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "test_fixture.h"

static char dir[64], path[128];

static void env(const char *rank, const char *world) {
    if (rank) setenv("RANK", rank, 1);
    else unsetenv("RANK");
    if (world) setenv("WORLD_SIZE", world, 1);
    else unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    unsetenv("CT_DIST_RENDEZVOUS");
    unsetenv("CT_DIST_TIMEOUT");
}

static bool exists(const char *p) { return access(p, F_OK) == 0; }

static void write_file(const char *p, const char *text) {
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *ack_path(int r) {
    static char p[160];
    snprintf(p, sizeof p, "%s.rank%d", path, r);
    return p;
}

static int rdv_setup(void **state) {
    unlink(path);
    unlink(ack_path(1));
    return setup(state);
}

static int rdv_teardown(void **state) {
    ct_dist_finalize();
    env(NULL, NULL);
    unlink(path);
    unlink(ack_path(1));
    return teardown(state);
}

static void ok(ct_status s) {
    if (s != CT_OK) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_int_equal(s, CT_OK);
}

/* ---- one process ---------------------------------------------------------------------- */
static void test_single(void **state) {
    env(NULL, NULL);
    assert_false(ct_dist_is_initialized());
    assert_string_equal(ct_dist_launch(), "none");
    tu_assert_error(ct_dist_all_reduce(NULL, CT_DIST_SUM), CT_ERR_INVALID_ARG,
                    "ct_dist_all_reduce: no process group");
    ok(ct_dist_init(NULL));
    assert_string_equal(ct_dist_launch(), "single");
    assert_int_equal(ct_dist_rank(), 0);
    assert_int_equal(ct_dist_world_size(), 1);
    int64_t shape[] = {3, 4};
    double *v;
    ct_tensor *t = tu_rand(2, shape, CT_F32, -1, 1, &v);
    ok(ct_dist_all_reduce(t, CT_DIST_AVG));
    ok(ct_dist_broadcast(t, 0));
    ct_tensor *out = ct_tensor_empty(2, shape, CT_F32, CT_CPU);
    ok(ct_fill_(out, NAN));
    ok(ct_dist_all_gather(out, t));
    double *got = tu_values(out);
    tu_assert_close(got, v, 12, 0, 0);
    free(got);
    ok(ct_fill_(out, NAN));
    ok(ct_dist_reduce_scatter(out, t, CT_DIST_SUM));
    got = tu_values(out);
    tu_assert_close(got, v, 12, 0, 0);
    free(got);
    ok(ct_dist_barrier());
    tu_assert_error(ct_dist_broadcast(t, 1), CT_ERR_INVALID_ARG, "root 1 is not a rank");
    free(v);
    ct_tensor_release(t);
    ct_tensor_release(out);
    ok(ct_dist_finalize());
    ok(ct_dist_finalize());
    assert_int_equal(ct_dist_world_size(), 1);
}

/* ---- bad environments ------------------------------------------------------------------ */
static void test_bad_env(void **state) {
    env(NULL, "2");
    tu_assert_error(ct_dist_init(NULL), CT_ERR_INVALID_ARG, "WORLD_SIZE is set but RANK is not");
    env("2", "2");
    tu_assert_error(ct_dist_init(NULL), CT_ERR_INVALID_ARG, "RANK=\"2\"", "[0, 1]");
    env("0", "two");
    tu_assert_error(ct_dist_init(NULL), CT_ERR_INVALID_ARG, "WORLD_SIZE=\"two\"");
    env("1", "2");
    tu_assert_error(ct_dist_init(NULL), CT_ERR_INVALID_ARG, "WORLD_SIZE=2 without MPI",
                    "CT_DIST_RENDEZVOUS");
    setenv("CT_DIST_TIMEOUT", "soon", 1);
    tu_assert_error(ct_dist_init(NULL), CT_ERR_INVALID_ARG, "CT_DIST_TIMEOUT=\"soon\"");
    assert_false(ct_dist_is_initialized());
    env(NULL, NULL);
    tu_assert_error(ct_dist_init(&(ct_dist_options){.timeout_s = -1}), CT_ERR_INVALID_ARG,
                    "timeout_s must be > 0");
    tu_assert_error(ct_dist_set_timeout(0), CT_ERR_INVALID_ARG, "seconds must be > 0");
}

/* ---- the rendezvous file ---------------------------------------------------------------- */
static ct_dist_options opts(double timeout) {
    return (ct_dist_options){.timeout_s = timeout, .rendezvous = path};
}

static void test_missing_file(void **state) {
    env("1", "2");
    ct_dist_options o = opts(0.3);
    tu_assert_error(ct_dist_init(&o), CT_ERR_RUNTIME, "rank 1", path,
                    "did not appear within 0.3 s", "rank 0 writes it");
    assert_false(ct_dist_is_initialized());
}

static const char stale_text[] =
    "cten-rendezvous 1\nrun 00000000deadbeef\nworld 2\nnccl none no usable CUDA device\n";

static void test_stale_file(void **state) {
    write_file(path, stale_text);
    env("1", "2");
    ct_dist_options o = opts(0.3);
    tu_assert_error(ct_dist_init(&o), CT_ERR_RUNTIME, "00000000deadbeef",
                    "was not confirmed by its rank 0", "stale");
    /* It takes back its acknowledgement of the dead run. */
    assert_false(exists(ack_path(1)));
}

static void test_other_world_size(void **state) {
    write_file(path, "cten-rendezvous 1\nrun 0000000000000001\nworld 3\nnccl none x\n");
    env("1", "2");
    ct_dist_options o = opts(0.3);
    tu_assert_error(ct_dist_init(&o), CT_ERR_RUNTIME, "is for world size 3, not 2");
}

static void test_not_a_rendezvous_file(void **state) {
    write_file(path, "hello\n");
    env("1", "2");
    ct_dist_options o = opts(5);
    tu_assert_error(ct_dist_init(&o), CT_ERR_FORMAT, "is not a cten rendezvous file");
}

static void test_rank0_alone(void **state) {
    write_file(path, stale_text);
    env("0", "2");
    ct_dist_options o = opts(0.3);
    tu_assert_error(ct_dist_init(&o), CT_ERR_RUNTIME, "1 of 1 ranks did not join within 0.3 s",
                    "missing: 1");
    /* Its own file is gone too, so it cannot hold the next launch. */
    assert_false(exists(path));
}

/* Rank 0 in a child that starts late, over a stale file: rank 1 first
 * acknowledges the stale run, then follows the new one. */
static void test_meet(void **state) {
    write_file(path, stale_text);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        usleep(300000);
        env("0", "2");
        ct_dist_options o = opts(20);
        ct_status st = ct_dist_init(&o);
        if (st != CT_OK) fprintf(stderr, "rank 0: %s\n", ct_last_error());
        _exit(st == CT_OK && ct_dist_rank() == 0 && ct_dist_finalize() == CT_OK ? 0 : 1);
    }
    env("1", "2");
    setenv("LOCAL_RANK", "1", 1);
    ct_dist_options o = opts(20);
    ct_status st = ct_dist_init(&o);
    int wst = 0;
    waitpid(child, &wst, 0);
    ok(st);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    assert_string_equal(ct_dist_launch(), "env");
    assert_int_equal(ct_dist_rank(), 1);
    assert_int_equal(ct_dist_world_size(), 2);
    assert_int_equal(ct_dist_local_rank(), 1);
    assert_false(exists(path));
    assert_false(exists(ack_path(1)));
    /* No MPI here: CPU tensors have no transport, and say so. */
    ct_tensor *t = ct_tensor_zeros(1, (int64_t[]){2}, CT_F32, CT_CPU);
    tu_assert_error(ct_dist_all_reduce(t, CT_DIST_SUM), CT_ERR_UNSUPPORTED,
                    "CPU tensors travel through MPI", "launch with mpirun");
    ct_tensor_release(t);
    ok(ct_dist_finalize());
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/cten-rdv-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/rendezvous", dir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_single, rdv_setup, rdv_teardown),
        cmocka_unit_test_setup_teardown(test_bad_env, rdv_setup, rdv_teardown),
        cmocka_unit_test_setup_teardown(test_missing_file, rdv_setup, rdv_teardown),
        cmocka_unit_test_setup_teardown(test_stale_file, rdv_setup, rdv_teardown),
        cmocka_unit_test_setup_teardown(test_other_world_size, rdv_setup, rdv_teardown),
        cmocka_unit_test_setup_teardown(test_not_a_rendezvous_file, rdv_setup, rdv_teardown),
        cmocka_unit_test_setup_teardown(test_rank0_alone, rdv_setup, rdv_teardown),
        cmocka_unit_test_setup_teardown(test_meet, rdv_setup, rdv_teardown),
    };
    int rc = tu_run_tests(tests);
    rmdir(dir);
    return rc;
}
