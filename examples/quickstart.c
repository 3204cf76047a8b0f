/* Linear regression by gradient descent, gradients written by hand:
 * the shortest complete tour of cten (creation, matmul, elementwise ops,
 * reductions, in-place updates, scopes, errors). */
#include <stdio.h>
#include <string.h>

#include <tensor/tensor.h>

static int fail(const char *what) {
    fprintf(stderr, "quickstart: %s failed: %s\n", what, ct_last_error());
    return 1;
}

int main(int argc, char **argv) {
    int quiet = argc > 1 && strcmp(argv[1], "--quiet") == 0;
    ct_generator *gen = ct_generator_new(42);
    /* Data: y = X w* + noise. The setup's temporaries die with its scope;
     * ct_keep hands the tensors that outlive it to the caller. */
    ct_scope *setup = ct_scope_begin();
    ct_tensor *X = ct_keep(ct_tensor_randn(gen, CT_SHAPE(512, 8), CT_F32, CT_CPU));
    ct_tensor *w_true = ct_keep(ct_tensor_randn(gen, CT_SHAPE(8, 1), CT_F32, CT_CPU));
    ct_tensor *noise = ct_tensor_randn(gen, CT_SHAPE(512, 1), CT_F32, CT_CPU);
    ct_tensor *y = ct_keep(ct_add_alpha(ct_matmul(X, w_true), noise, 0.01));
    ct_tensor *w = ct_keep(ct_tensor_zeros(CT_SHAPE(8, 1), CT_F32, CT_CPU));
    ct_scope_end(setup);
    if (!y || !w) return fail("setup");

    double loss_v = 0;
    for (int step = 0; step <= 200; step++) {
        ct_scope *s = ct_scope_begin(); /* every tensor made in the body dies at scope end */
        ct_tensor *err = ct_sub(ct_matmul(X, w), y);
        ct_tensor *loss = ct_mean(ct_square(err), CT_NONE, false);
        ct_tensor *grad = ct_mul_scalar(ct_matmul(ct_t(X), err), 2.0 / 512);
        if (!loss || !grad || ct_add_alpha_(w, grad, -0.2) != CT_OK ||
            ct_tensor_item(loss, &loss_v) != CT_OK)
            return fail("training step");
        if (!quiet && step % 40 == 0) printf("step %3d  loss %.6f\n", step, loss_v);
        ct_scope_end(s);
    }
    ct_scope *s = ct_scope_begin();
    double d = 1;
    if (ct_tensor_item(ct_norm(ct_sub(w, w_true), 2.0, CT_NONE, false), &d) != CT_OK)
        return fail("norm");
    ct_scope_end(s);
    printf("quickstart: final loss %.6f, |w - w*| = %.5f %s\n", loss_v, d,
           d < 0.01 ? "(recovered)" : "(NOT recovered)");

    /* Bad input is an error with a message, never an abort. */
    ct_tensor *bad = ct_matmul(X, X);
    if (!quiet && !bad) printf("expected error: %s\n", ct_last_error());

    ct_tensor *all[] = {X, w_true, y, w, bad};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
    ct_generator_free(gen);
    return d < 0.01 ? 0 : 1;
}
