/* The gradient scaler (torch.amp.GradScaler) on the CPU and its ops:
 *  - a planted inf or NaN skips the step (parameters, states and step
 *    counts unchanged bit for bit) and halves the scale; growth after
 *    growth_interval good steps; a growth to a non-finite scale is kept out;
 *  - good steps with a power-of-two scale equal the unscaled optimizer bit
 *    for bit, in every floating dtype and with master weights;
 *  - unscale, then clip, then step; two optimizers under one scaler;
 *  - the state through a checkpoint; a disabled scaler;
 *  - AMP_UNSCALE over gradients of every floating dtype at once against
 *    float64 references, AMP_UPDATE_SCALE's cases;
 *  - bad inputs (status and message). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
#include <cmocka.h>

#include "test_util.h"

#include "ops/optim_impl.h"
#include "test_fixture.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static unsigned char *bytes_of(const ct_tensor *t, size_t *nb) {
    *nb = (size_t)ct_tensor_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
    unsigned char *b = malloc(*nb ? *nb : 1);
    assert_int_equal(ct_tensor_copy_to_host(t, b, *nb), CT_OK);
    return b;
}

static void assert_same_bytes(const ct_tensor *a, const ct_tensor *b) {
    size_t na, nb;
    unsigned char *x = bytes_of(a, &na), *y = bytes_of(b, &nb);
    assert_int_equal(na, nb);
    assert_int_equal(memcmp(x, y, na), 0);
    free(x);
    free(y);
}

static double item(const ct_tensor *t) {
    double v;
    assert_int_equal(ct_tensor_item(t, &v), CT_OK);
    return v;
}

static void assert_state(const ct_grad_scaler *sc, double scale, int64_t tracker) {
    ct_grad_scaler_state s;
    assert_int_equal(ct_grad_scaler_get_state(sc, &s), CT_OK);
    assert_true(s.scale == scale);
    assert_int_equal(s.growth_tracker, tracker);
    assert_true(ct_grad_scaler_get_scale(sc) == scale);
}

#define NP 3
static const int64_t shapes[NP][2] = {{6, 40}, {300, 200}, {9, 1}};
static const int ndims[NP] = {2, 2, 1};

/* NP leaves of dtype dt (the same values in both lists when b is given). */
static ct_params *leaves(ct_dtype dt, ct_params **b) {
    ct_params *a = ct_params_new();
    if (b) *b = ct_params_new();
    for (int k = 0; k < NP; k++) {
        char nm[8];
        snprintf(nm, sizeof nm, "p%d", k);
        ct_tensor *t = tu_rand(ndims[k], shapes[k], dt, -1, 1, NULL);
        assert_int_equal(ct_requires_grad_(t, true), CT_OK);
        assert_int_equal(ct_params_add(a, nm, t), CT_OK);
        if (b) {
            bool prev = ct_no_grad_begin();
            ct_tensor *c = ct_clone(t);
            ct_no_grad_end(prev);
            assert_int_equal(ct_requires_grad_(c, true), CT_OK);
            assert_int_equal(ct_params_add(*b, nm, c), CT_OK);
            ct_tensor_release(c);
        }
        ct_tensor_release(t);
    }
    return a;
}

static ct_optimizer *make_opt(ct_params *p, bool adamw, bool masters) {
    ct_optimizer *o = adamw ? ct_optim_adamw_new(p, 0.01, 0.9, 0.99, 1e-6, 0.05)
                            : ct_optim_sgd_new(p, 0.05, 0.9, 0.1, 0.01, false);
    assert_non_null(o);
    if (masters) assert_int_equal(ct_optim_set_master_weights(o, true), CT_OK);
    return o;
}

/* Fresh gradients g in [-1, 1): scaled by scale into a (exact for a power
 * of two), as they are into b (when given). */
static void set_grads(ct_params *a, ct_params *b, double scale) {
    for (int k = 0; k < NP; k++) {
        ct_tensor *t = ct_params_get(a, k, NULL);
        ct_dtype dt = ct_tensor_dtype(t);
        ct_tensor *g = tu_rand(ndims[k], shapes[k], dt, -1, 1, NULL);
        ct_tensor *gs = ct_mul_scalar(g, scale);
        assert_int_equal(ct_set_grad(t, gs), CT_OK);
        if (b) assert_int_equal(ct_set_grad(ct_params_get(b, k, NULL), g), CT_OK);
        ct_tensor_release(g);
        ct_tensor_release(gs);
    }
}

/* Copies of every state tensor of o and every parameter of p. */
typedef struct snap {
    int64_t n;
    ct_tensor *t[64];
} snap;

static snap take(ct_optimizer *o, ct_params *p) {
    snap s = {0, {0}};
    for (int64_t k = 0; k < ct_optim_state_count(o); k++)
        s.t[s.n++] = ct_clone(ct_optim_state_get(o, k, NULL));
    for (int64_t k = 0; k < ct_params_count(p); k++) {
        bool prev = ct_no_grad_begin();
        s.t[s.n++] = ct_clone(ct_params_get(p, k, NULL));
        ct_no_grad_end(prev);
    }
    return s;
}

static void assert_unchanged(const snap *s, ct_optimizer *o, ct_params *p) {
    int64_t j = 0;
    for (int64_t k = 0; k < ct_optim_state_count(o); k++)
        assert_same_bytes(ct_optim_state_get(o, k, NULL), s->t[j++]);
    for (int64_t k = 0; k < ct_params_count(p); k++)
        assert_same_bytes(ct_params_get(p, k, NULL), s->t[j++]);
}

static void drop(snap *s) {
    for (int64_t k = 0; k < s->n; k++) ct_tensor_release(s->t[k]);
}

/* Element i of parameter k's gradient set to v. */
static void plant(ct_params *p, int k, int64_t i, double v) {
    ct_tensor *g = ct_grad(ct_params_get(p, k, NULL));
    ct_tensor *flat = ct_reshape(g, CT_SHAPE(-1));
    ct_tensor *e = ct_narrow(flat, 0, i, 1);
    assert_int_equal(ct_fill_(e, v), CT_OK);
    ct_tensor_release(e);
    ct_tensor_release(flat);
}

/* ---- the scaler against the plain optimizer -------------------------------------------------- */

/* Good steps under a power-of-two scale equal the plain optimizer's bit for
 * bit; then a planted inf (NaN on odd rounds) skips the step, bit for bit,
 * and halves the scale; then good steps go on equal to the plain ones. */
static void run_scaled(ct_dtype dt, bool adamw, bool masters) {
    ct_params *b;
    ct_params *a = leaves(dt, &b);
    ct_optimizer *oa = make_opt(a, adamw, masters), *ob = make_opt(b, adamw, masters);
    ct_grad_scaler *sc = ct_grad_scaler_new(CT_CPU, 1024, 2, 0.5, 100, true);
    assert_non_null(sc);
    double scale = 1024;
    for (int round = 0; round < 4; round++) {
        for (int step = 0; step < 2; step++) {
            set_grads(a, b, scale);
            assert_int_equal(ct_grad_scaler_step(sc, oa), CT_OK);
            assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
            assert_int_equal(ct_optim_step(ob), CT_OK);
            for (int64_t k = 0; k < ct_optim_state_count(oa); k++)
                assert_same_bytes(ct_optim_state_get(oa, k, NULL), ct_optim_state_get(ob, k, NULL));
            for (int k = 0; k < NP; k++)
                assert_same_bytes(ct_params_get(a, k, NULL), ct_params_get(b, k, NULL));
        }
        assert_state(sc, scale, 2);
        set_grads(a, NULL, scale);
        plant(a, round % NP, 7, round % 2 ? NAN : -INFINITY);
        snap s = take(oa, a);
        assert_int_equal(ct_grad_scaler_step(sc, oa), CT_OK);
        assert_unchanged(&s, oa, a);
        drop(&s);
        assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
        scale /= 2;
        assert_state(sc, scale, 0);
    }
    ct_grad_scaler_free(sc);
    ct_optim_free(oa);
    ct_optim_free(ob);
    ct_params_free(a);
    ct_params_free(b);
}

static void test_scaled_steps(void **state) {
    (void)state;
    for (size_t di = 0; di < 4; di++) {
        run_scaled(tu_float_dtypes[di], true, false);
        run_scaled(tu_float_dtypes[di], false, false);
    }
    run_scaled(CT_BF16, true, true);
    run_scaled(CT_F16, true, true);
    run_scaled(CT_F16, false, true);
}

/* Growth: interval 3 good steps double the scale; an inf resets the
 * tracker; a growth past float32's range is not taken. */
static void test_growth(void **state) {
    (void)state;
    ct_params *p = leaves(CT_F32, NULL);
    ct_optimizer *o = make_opt(p, true, false);
    ct_grad_scaler *sc = ct_grad_scaler_new(CT_CPU, 8, 2, 0.25, 3, true);
    assert_state(sc, 8, 0);
    const double want_scale[] = {8, 8, 16, 16, 16, 32, 32, 8, 8, 8, 16};
    const int64_t want_tracker[] = {1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 0};
    for (int i = 0; i < 11; i++) {
        set_grads(p, NULL, 1);
        if (i == 7) plant(p, 1, 0, INFINITY);
        assert_int_equal(ct_grad_scaler_step(sc, o), CT_OK);
        assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
        assert_state(sc, want_scale[i], want_tracker[i]);
    }
    ct_grad_scaler_free(sc);
    /* 2^127 * 2 overflows float32: the scale stays. */
    sc = ct_grad_scaler_new(CT_CPU, ldexp(1, 127), 2, 0.5, 1, true);
    set_grads(p, NULL, 1);
    assert_int_equal(ct_grad_scaler_unscale(sc, o), CT_OK); /* unscale alone counts */
    assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
    assert_state(sc, ldexp(1, 127), 0);
    ct_grad_scaler_free(sc);
    /* A growth factor that is not a power of two, in float: 3 * 1.5. */
    sc = ct_grad_scaler_new(CT_CPU, 3, 1.5, 0.1, 1, true);
    assert_int_equal(ct_grad_scaler_unscale(sc, o), CT_OK);
    assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
    assert_state(sc, 4.5, 0);
    plant(p, 0, 0, NAN);
    assert_int_equal(ct_grad_scaler_unscale(sc, o), CT_OK);
    assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
    assert_state(sc, (float)(4.5 * 0.1), 0);
    ct_grad_scaler_free(sc);
    ct_optim_free(o);
    ct_params_free(p);
}

/* unscale, then clip, then step: the gradients after unscale are the
 * unscaled ones (exactly), clipping sees them, the step equals the plain
 * optimizer's after the same clipping. */
static void test_unscale_clip_step(void **state) {
    (void)state;
    for (int adamw = 0; adamw < 2; adamw++) {
        ct_params *b;
        ct_params *a = leaves(CT_F32, &b);
        ct_optimizer *oa = make_opt(a, adamw, false), *ob = make_opt(b, adamw, false);
        ct_grad_scaler *sc = ct_grad_scaler_new(CT_CPU, 65536, 2, 0.5, 2000, true);
        for (int step = 0; step < 3; step++) {
            set_grads(a, b, 65536);
            assert_int_equal(ct_grad_scaler_unscale(sc, oa), CT_OK);
            for (int k = 0; k < NP; k++)
                assert_same_bytes(ct_grad(ct_params_get(a, k, NULL)),
                                  ct_grad(ct_params_get(b, k, NULL)));
            double na, nb;
            assert_int_equal(ct_clip_grad_norm(a, 3.0, &na), CT_OK);
            assert_int_equal(ct_clip_grad_norm(b, 3.0, &nb), CT_OK);
            assert_true(na == nb && na > 3.0); /* clipped */
            assert_int_equal(ct_grad_scaler_step(sc, oa), CT_OK);
            assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
            assert_int_equal(ct_optim_step(ob), CT_OK);
            for (int k = 0; k < NP; k++)
                assert_same_bytes(ct_params_get(a, k, NULL), ct_params_get(b, k, NULL));
        }
        /* An inf after unscale: clipping does not fail, the step skips. */
        set_grads(a, NULL, 65536);
        plant(a, 2, 3, INFINITY);
        assert_int_equal(ct_grad_scaler_unscale(sc, oa), CT_OK);
        double n;
        assert_int_equal(ct_clip_grad_norm(a, 3.0, &n), CT_OK);
        assert_true(isinf(n));
        snap s = take(oa, a);
        assert_int_equal(ct_grad_scaler_step(sc, oa), CT_OK);
        assert_unchanged(&s, oa, a);
        drop(&s);
        assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
        assert_state(sc, 32768, 0);
        ct_grad_scaler_free(sc);
        ct_optim_free(oa);
        ct_optim_free(ob);
        ct_params_free(a);
        ct_params_free(b);
    }
}

/* Two optimizers under one scaler: an inf in the second's gradients skips
 * only its step; the update backs off once (found_inf summed). */
static void test_two_optimizers(void **state) {
    (void)state;
    ct_params *p1 = leaves(CT_F32, NULL), *p2 = leaves(CT_F32, NULL);
    ct_optimizer *o1 = make_opt(p1, true, false), *o2 = make_opt(p2, false, false);
    ct_grad_scaler *sc = ct_grad_scaler_new(CT_CPU, 4, 2, 0.5, 2, true);
    set_grads(p1, NULL, 4);
    set_grads(p2, NULL, 4);
    plant(p2, 0, 0, INFINITY);
    snap s1 = take(o1, p1), s2 = take(o2, p2);
    assert_int_equal(ct_grad_scaler_step(sc, o1), CT_OK);
    assert_int_equal(ct_grad_scaler_step(sc, o2), CT_OK);
    assert_unchanged(&s2, o2, p2);
    assert_true(item(ct_optim_state_get(o1, 0, NULL)) == 1); /* o1 stepped */
    assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
    assert_state(sc, 2, 0);
    /* Both good twice: growth once. */
    for (int i = 0; i < 2; i++) {
        set_grads(p1, NULL, 2);
        set_grads(p2, NULL, 2);
        assert_int_equal(ct_grad_scaler_step(sc, o1), CT_OK);
        assert_int_equal(ct_grad_scaler_step(sc, o2), CT_OK);
        assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
    }
    assert_state(sc, 4, 0);
    drop(&s1);
    drop(&s2);
    ct_grad_scaler_free(sc);
    ct_optim_free(o1);
    ct_optim_free(o2);
    ct_params_free(p1);
    ct_params_free(p2);
}

/* scale(loss): loss * scale, recorded: the backward gives the gradients
 * times the scale. A float16 0-d loss gives a float32 result. */
static void test_scale_loss(void **state) {
    (void)state;
    ct_grad_scaler *sc = ct_grad_scaler_new(CT_CPU, 256, 2, 0.5, 10, true);
    ct_tensor *w = tu_rand(CT_SHAPE(5), CT_F32, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    ct_scope *s = ct_scope_begin();
    ct_tensor *loss = ct_sum(ct_square(w), CT_NONE, false);
    ct_tensor *scaled = ct_grad_scaler_scale(sc, loss);
    assert_non_null(scaled);
    assert_true(item(scaled) == item(loss) * 256);
    assert_int_equal(ct_backward(scaled, NULL, false), CT_OK);
    double *gv = tu_values(ct_grad(w)), *wv = tu_values(w);
    for (int i = 0; i < 5; i++) assert_true(gv[i] == (double)(float)(2 * wv[i]) * 256);
    free(gv);
    free(wv);
    ct_tensor *h = ct_tensor_scalar(3, CT_F16, CT_CPU);
    ct_tensor *hs = ct_grad_scaler_scale(sc, h);
    assert_int_equal(ct_tensor_dtype(hs), CT_F32);
    assert_true(item(hs) == 768);
    ct_tensor *i = ct_tensor_scalar(3, CT_I64, CT_CPU);
    tu_assert_null_error(ct_grad_scaler_scale(sc, i), CT_ERR_DTYPE, "ct_grad_scaler_scale",
                         "int64", "not floating");
    tu_assert_null_error(ct_grad_scaler_scale(sc, NULL), CT_ERR_INVALID_ARG,
                         "ct_grad_scaler_scale", "loss is NULL");
    tu_assert_null_error(ct_grad_scaler_scale(NULL, loss), CT_ERR_INVALID_ARG,
                         "ct_grad_scaler_scale", "scaler is NULL");
    ct_scope_end(s);
    ct_tensor_release(w);
    ct_grad_scaler_free(sc);
}

/* The state through a checkpoint's metadata: a fresh scaler given the saved
 * state goes on as the first. */
static void test_state_round_trip(void **state) {
    (void)state;
    ct_params *p = leaves(CT_F32, NULL);
    ct_optimizer *o = make_opt(p, true, false);
    ct_grad_scaler *a = ct_grad_scaler_new(CT_CPU, 64, 2, 0.5, 4, true);
    for (int i = 0; i < 6; i++) {
        set_grads(p, NULL, 1);
        if (i == 1) plant(p, 0, 0, INFINITY);
        assert_int_equal(ct_grad_scaler_step(a, o), CT_OK);
        assert_int_equal(ct_grad_scaler_update(a), CT_OK);
    }
    assert_state(a, 64, 0); /* 64 -> 32, four good: 64 */
    set_grads(p, NULL, 1);
    assert_int_equal(ct_grad_scaler_step(a, o), CT_OK);
    assert_int_equal(ct_grad_scaler_update(a), CT_OK);
    ct_grad_scaler_state st;
    assert_int_equal(ct_grad_scaler_get_state(a, &st), CT_OK);
    ct_metadata *m = ct_metadata_new();
    assert_int_equal(ct_metadata_set_double(m, "grad_scaler.scale", st.scale), CT_OK);
    assert_int_equal(ct_metadata_set_int(m, "grad_scaler.growth_tracker", st.growth_tracker),
                     CT_OK);
    char path[256];
    snprintf(path, sizeof path, "%s/cten_scaler_%d.safetensors",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    assert_int_equal(ct_checkpoint_save(path, p, o, NULL, m), CT_OK);
    ct_metadata_free(m);
    ct_grad_scaler *b = ct_grad_scaler_new(CT_CPU, 65536, 2, 0.5, 4, true);
    assert_int_equal(ct_checkpoint_load(path, p, o, NULL, &m), CT_OK);
    remove(path);
    ct_grad_scaler_state got;
    assert_int_equal(ct_metadata_get_double(m, "grad_scaler.scale", &got.scale), CT_OK);
    assert_int_equal(ct_metadata_get_int(m, "grad_scaler.growth_tracker", &got.growth_tracker),
                     CT_OK);
    ct_metadata_free(m);
    assert_int_equal(ct_grad_scaler_set_state(b, &got), CT_OK);
    assert_state(b, 64, 1);
    for (int i = 0; i < 4; i++) {
        set_grads(p, NULL, 1);
        assert_int_equal(ct_grad_scaler_unscale(a, o), CT_OK);
        assert_int_equal(ct_grad_scaler_update(a), CT_OK);
        assert_int_equal(ct_grad_scaler_unscale(b, o), CT_OK);
        assert_int_equal(ct_grad_scaler_update(b), CT_OK);
        ct_grad_scaler_state sa, sb;
        assert_int_equal(ct_grad_scaler_get_state(a, &sa), CT_OK);
        assert_int_equal(ct_grad_scaler_get_state(b, &sb), CT_OK);
        assert_true(sa.scale == sb.scale && sa.growth_tracker == sb.growth_tracker);
    }
    assert_state(b, 128, 1);
    ct_grad_scaler_free(a);
    ct_grad_scaler_free(b);
    ct_optim_free(o);
    ct_params_free(p);
}

/* Disabled: a pass-through. */
static void test_disabled(void **state) {
    (void)state;
    ct_params *b;
    ct_params *a = leaves(CT_F32, &b);
    ct_optimizer *oa = make_opt(a, true, false), *ob = make_opt(b, true, false);
    ct_grad_scaler *sc = ct_grad_scaler_new(CT_CPU, 1024, 2, 0.5, 10, false);
    assert_non_null(sc);
    assert_true(ct_grad_scaler_get_scale(sc) == 1);
    ct_tensor *l = ct_tensor_scalar(2.5, CT_F32, CT_CPU);
    ct_tensor *ls = ct_grad_scaler_scale(sc, l);
    assert_true(item(ls) == 2.5);
    set_grads(a, b, 1);
    assert_int_equal(ct_grad_scaler_unscale(sc, oa), CT_OK);
    assert_int_equal(ct_grad_scaler_unscale(sc, oa), CT_OK); /* nothing is tracked */
    assert_int_equal(ct_grad_scaler_step(sc, oa), CT_OK);
    assert_int_equal(ct_optim_step(ob), CT_OK);
    assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
    assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
    for (int k = 0; k < NP; k++)
        assert_same_bytes(ct_params_get(a, k, NULL), ct_params_get(b, k, NULL));
    ct_grad_scaler_state st = {4, 0};
    assert_int_equal(ct_grad_scaler_set_state(sc, &st), CT_OK);
    tu_assert_error(ct_grad_scaler_get_state(sc, &st), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_get_state", "disabled");
    ct_tensor_release(l);
    ct_tensor_release(ls);
    ct_grad_scaler_free(sc);
    ct_optim_free(oa);
    ct_optim_free(ob);
    ct_params_free(a);
    ct_params_free(b);
}

/* Bad inputs: a status and a message, nothing changed. */
static void test_bad_args(void **state) {
    (void)state;
    tu_assert_null_error(ct_grad_scaler_new(CT_CPU, 0, 2, 0.5, 10, true), CT_ERR_INVALID_ARG,
                         "ct_grad_scaler_new", "init_scale", "0");
    tu_assert_null_error(ct_grad_scaler_new(CT_CPU, INFINITY, 2, 0.5, 10, true),
                         CT_ERR_INVALID_ARG, "ct_grad_scaler_new", "init_scale");
    tu_assert_null_error(ct_grad_scaler_new(CT_CPU, 1, 1, 0.5, 10, true), CT_ERR_INVALID_ARG,
                         "ct_grad_scaler_new", "growth_factor", "> 1");
    tu_assert_null_error(ct_grad_scaler_new(CT_CPU, 1, 2, 1, 10, true), CT_ERR_INVALID_ARG,
                         "ct_grad_scaler_new", "backoff_factor", "(0, 1)");
    tu_assert_null_error(ct_grad_scaler_new(CT_CPU, 1, 2, 0, 10, true), CT_ERR_INVALID_ARG,
                         "ct_grad_scaler_new", "backoff_factor");
    tu_assert_null_error(ct_grad_scaler_new(CT_CPU, 1, 2, 0.5, 0, true), CT_ERR_INVALID_ARG,
                         "ct_grad_scaler_new", "growth_interval", "0");
    tu_assert_null_error(ct_grad_scaler_new(CT_CPU, 1, 2, 0.5, (int64_t)1 << 31, true),
                         CT_ERR_INVALID_ARG, "ct_grad_scaler_new", "growth_interval");
    if (ct_device_count(CT_DEVICE_CUDA) == 0)
        tu_assert_null_error(ct_grad_scaler_new(CT_CUDA(0), 1, 2, 0.5, 10, true),
                             CT_ERR_DEVICE, "ct_grad_scaler_new", "cuda");

    ct_params *p = leaves(CT_F32, NULL);
    ct_optimizer *o = make_opt(p, true, false);
    ct_grad_scaler *sc = ct_grad_scaler_new(CT_CPU, 16, 2, 0.5, 10, true);
    tu_assert_error(ct_grad_scaler_unscale(NULL, o), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_unscale", "scaler is NULL");
    tu_assert_error(ct_grad_scaler_unscale(sc, NULL), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_unscale", "optimizer is NULL");
    tu_assert_error(ct_grad_scaler_step(NULL, o), CT_ERR_INVALID_ARG, "ct_grad_scaler_step",
                    "scaler is NULL");
    tu_assert_error(ct_grad_scaler_step(sc, NULL), CT_ERR_INVALID_ARG, "ct_grad_scaler_step",
                    "optimizer is NULL");
    tu_assert_error(ct_grad_scaler_update(NULL), CT_ERR_INVALID_ARG, "ct_grad_scaler_update",
                    "NULL");
    assert_true(isnan(ct_grad_scaler_get_scale(NULL)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_grad_scaler_get_scale", "NULL");
    ct_grad_scaler_state st;
    tu_assert_error(ct_grad_scaler_get_state(NULL, &st), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_get_state", "NULL");
    tu_assert_error(ct_grad_scaler_get_state(sc, NULL), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_get_state", "state is NULL");
    tu_assert_error(ct_grad_scaler_set_state(NULL, &st), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_set_state", "NULL");
    tu_assert_error(ct_grad_scaler_set_state(sc, NULL), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_set_state", "state is NULL");
    st = (ct_grad_scaler_state){-1, 0};
    tu_assert_error(ct_grad_scaler_set_state(sc, &st), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_set_state", "scale", "-1");
    st = (ct_grad_scaler_state){1e39, 0}; /* not finite in float32 */
    tu_assert_error(ct_grad_scaler_set_state(sc, &st), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_set_state", "scale");
    st = (ct_grad_scaler_state){2, 10};
    tu_assert_error(ct_grad_scaler_set_state(sc, &st), CT_ERR_INVALID_ARG,
                    "ct_grad_scaler_set_state", "growth_tracker", "10", "9");
    assert_state(sc, 16, 0);

    /* update before any check; unscale twice; unscale after step; step
     * twice: refused, and the scaler usable afterwards. */
    tu_assert_error(ct_grad_scaler_update(sc), CT_ERR_INVALID_ARG, "ct_grad_scaler_update",
                    "no inf checks");
    set_grads(p, NULL, 16);
    assert_int_equal(ct_grad_scaler_unscale(sc, o), CT_OK);
    tu_assert_error(ct_grad_scaler_unscale(sc, o), CT_ERR_INVALID_ARG, "ct_grad_scaler_unscale",
                    "already called");
    assert_int_equal(ct_grad_scaler_step(sc, o), CT_OK);
    tu_assert_error(ct_grad_scaler_unscale(sc, o), CT_ERR_INVALID_ARG, "ct_grad_scaler_unscale",
                    "after ct_grad_scaler_step");
    tu_assert_error(ct_grad_scaler_step(sc, o), CT_ERR_INVALID_ARG, "ct_grad_scaler_step",
                    "already called");
    assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
    tu_assert_error(ct_grad_scaler_update(sc), CT_ERR_INVALID_ARG, "ct_grad_scaler_update",
                    "no inf checks");
    assert_state(sc, 16, 1);
    assert_int_equal(ct_grad_scaler_step(sc, o), CT_OK);
    assert_int_equal(ct_grad_scaler_update(sc), CT_OK);
    assert_state(sc, 16, 2);
    ct_grad_scaler_free(sc);
    ct_grad_scaler_free(NULL);
    ct_optim_free(o);
    ct_params_free(p);
}

/* ---- the ops
 * -------------------------------------------------------------------------------------- */

/* AMP_UNSCALE over float32, float64, float16, bfloat16 gradients (one of
 * them non-contiguous, one empty, a NULL entry) in one call with scale 3:
 * each element times (float)(1/3) in its compute type; found_inf 0 while
 * all are finite and 1 after an inf or NaN; never reset. */
static void test_unscale_op(void **state) {
    (void)state;
    enum { NG = 6 };
    const ct_dtype dts[NG] = {CT_F32, CT_F64, CT_F16, CT_BF16, CT_F32, CT_BF16};
    ct_tensor *g[NG];
    double *ref[NG];
    ct_tensor *found = ct_tensor_scalar(0, CT_F32, CT_CPU),
              *scale = ct_tensor_scalar(3, CT_F32, CT_CPU);
    float inv = (float)(1.0 / 3.0);
    for (int k = 0; k < NG; k++) {
        int64_t n = k == 4 ? 0 : 70000 + 13 * k; /* several threads' ranges */
        if (k == 3) {
            ct_tensor *c = tu_rand(CT_SHAPE(n / 2, 2), dts[k], -100, 100, NULL);
            g[k] = tu_noncontig(c);
            ct_tensor_release(c);
        } else {
            g[k] = tu_rand(CT_SHAPE(n), dts[k], -100, 100, NULL);
        }
        double *v = tu_values(g[k]);
        n = ct_tensor_numel(g[k]);
        ref[k] = malloc((size_t)(n ? n : 1) * sizeof(double));
        for (int64_t i = 0; i < n; i++)
            ref[k][i] = dts[k] == CT_F64 ? v[i] * (double)inv : tu_round((float)v[i] * inv, dts[k]);
        free(v);
    }
    ct_tensor *list[NG + 1] = {g[0], g[1], NULL, g[2], g[3], g[4], g[5]};
    assert_int_equal(cti_amp_unscale("t", NG + 1, list, found, scale), CT_OK);
    assert_true(item(found) == 0);
    for (int k = 0; k < NG; k++) {
        double *v = tu_values(g[k]);
        tu_assert_close(v, ref[k], ct_tensor_numel(g[k]), 0, 0);
        free(v);
        free(ref[k]);
    }
    /* Scale 1: nothing written. Then an inf in the float16 one, a NaN in the
     * bfloat16 one: found. */
    ct_tensor *before = ct_clone(g[2]);
    ct_fill_(scale, 1);
    assert_int_equal(cti_amp_unscale("t", NG + 1, list, found, scale), CT_OK);
    assert_same_bytes(g[2], before);
    for (int k = 2; k < 4; k++) {
        ct_scope *sc = ct_scope_begin();
        /* g[3] is a non-contiguous [n, 2]: its element (617, 1). */
        ct_tensor *e = k == 2 ? ct_select(g[k], 0, 1234) : ct_select(ct_select(g[k], 0, 617), 0, 1);
        assert_int_equal(ct_fill_(found, 0), CT_OK);
        assert_int_equal(ct_fill_(e, k == 2 ? -INFINITY : NAN), CT_OK);
        assert_int_equal(cti_amp_unscale("t", NG + 1, list, found, scale), CT_OK);
        assert_true(item(found) == 1);
        assert_int_equal(ct_fill_(e, 0), CT_OK);
        ct_scope_end(sc);
    }
    /* found_inf stays 1 over finite gradients. */
    assert_int_equal(cti_amp_unscale("t", NG + 1, list, found, scale), CT_OK);
    assert_true(item(found) == 1);

    /* Bad inputs. */
    ct_tensor *f64 = ct_tensor_scalar(0, CT_F64, CT_CPU),
              *i32 = ct_tensor_zeros(CT_SHAPE(3), CT_I32, CT_CPU);
    tu_assert_error(cti_amp_unscale("t", NG + 1, list, f64, scale), CT_ERR_INVALID_ARG, "t",
                    "found_inf", "0-d float32");
    tu_assert_error(cti_amp_unscale("t", NG + 1, list, found, f64), CT_ERR_INVALID_ARG, "t",
                    "scale", "0-d float32");
    tu_assert_error(cti_amp_unscale("t", NG + 1, list, NULL, scale), CT_ERR_INVALID_ARG, "t",
                    "found_inf is NULL");
    list[2] = i32;
    tu_assert_error(cti_amp_unscale("t", NG + 1, list, found, scale), CT_ERR_INVALID_ARG, "t",
                    "gradient 2", "int32", "floating");
    list[2] = g[0];
    tu_assert_error(cti_amp_unscale("t", NG + 1, list, found, scale), CT_ERR_INVALID_ARG, "t",
                    "share memory");
    ct_tensor *row = ct_tensor_ones(CT_SHAPE(1, 4), CT_F32, CT_CPU);
    ct_tensor *ex = ct_expand(row, CT_SHAPE(3, 4));
    list[2] = ex;
    tu_assert_error(cti_amp_unscale("t", NG + 1, list, found, scale), CT_ERR_INVALID_ARG, "t",
                    "gradient 2", "expanded");
    tu_assert_error(cti_amp_unscale("t", -1, list, found, scale), CT_ERR_INVALID_ARG, "t",
                    "malformed");
    ct_tensor *all[] = {found, scale, before, f64, i32, row, ex};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
    for (int k = 0; k < NG; k++) ct_tensor_release(g[k]);
}

/* AMP_UPDATE_SCALE's cases, against torch's _amp_update_scale_. */
static void test_update_op(void **state) {
    (void)state;
    const struct {
        double scale, found;
        int tracker;
        int64_t interval;
        double growth, backoff, want_scale;
        int want_tracker;
    } rows[] = {
        {1024, 1, 5, 10, 2, 0.5, 512, 0},        /* backoff */
        {1024, INFINITY, 9, 10, 2, 0.5, 512, 0}, /* any non-zero found_inf */
        {1024, 0, 5, 10, 2, 0.5, 1024, 6},       /* one more good step */
        {1024, 0, 9, 10, 2, 0.5, 2048, 0},       /* the interval's last: growth */
        {3e38, 0, 0, 1, 2, 0.5, 3e38, 0},        /* growth to inf not taken */
        {3, 0, 0, 1, 1.1, 0.5, (float)(3 * 1.1), 0},
        {3, 1, 0, 1, 1.1, 0.3, (float)(3 * 0.3), 0},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        ct_tensor *s = ct_tensor_scalar(rows[r].scale, CT_F32, CT_CPU);
        ct_tensor *t = ct_tensor_scalar(rows[r].tracker, CT_I32, CT_CPU);
        ct_tensor *f = ct_tensor_scalar(rows[r].found, CT_F32, CT_CPU);
        cti_amp_update_params p = {rows[r].growth, rows[r].backoff, rows[r].interval};
        assert_int_equal(cti_amp_update_scale("t", s, t, f, &p), CT_OK);
        assert_true(item(s) == (double)(float)rows[r].want_scale);
        assert_true(item(t) == rows[r].want_tracker);
        if (r == 0) {
            ct_tensor *t64 = ct_tensor_scalar(0, CT_I64, CT_CPU);
            tu_assert_error(cti_amp_update_scale("t", s, t64, f, &p), CT_ERR_INVALID_ARG, "t",
                            "growth_tracker", "0-d int32");
            tu_assert_error(cti_amp_update_scale("t", s, t, t, &p), CT_ERR_INVALID_ARG, "t",
                            "found_inf", "0-d float32");
            tu_assert_error(cti_amp_update_scale("t", NULL, t, f, &p), CT_ERR_INVALID_ARG, "t",
                            "scale is NULL");
            cti_amp_update_params bad = {2, 0.5, 0};
            tu_assert_error(cti_amp_update_scale("t", s, t, f, &bad), CT_ERR_INVALID_ARG, "t",
                            "growth_interval");
            ct_tensor_release(t64);
        }
        ct_tensor_release(s);
        ct_tensor_release(t);
        ct_tensor_release(f);
    }
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scaled_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_growth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unscale_clip_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_optimizers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scale_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disabled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unscale_op, setup, teardown),
        cmocka_unit_test_setup_teardown(test_update_op, setup, teardown),
    };
    return tu_run_tests(tests);
}
