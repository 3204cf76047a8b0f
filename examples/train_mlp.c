/* Trains a small MLP on a synthetic three-class spiral with AdamW and a
 * cosine learning-rate schedule, as this PyTorch program would (its lines
 * are quoted alongside):
 *
 *     import math, torch, torch.nn as nn, torch.nn.functional as F
 *     torch.manual_seed(0)
 *
 * Build: cc train_mlp.c $(pkg-config --cflags --libs cten) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <tensor/tensor.h>

#define CLASSES 3
#define PER_CLASS 100
#define N (CLASSES * PER_CLASS)
#define HIDDEN 64
#define STEPS 2000

/* Prints the last error and returns 1 when a call failed. */
static int check(bool ok, const char *what) {
    if (ok) return 0;
    fprintf(stderr, "%s failed: %s\n", what, ct_last_error());
    return 1;
}

/* The CS231n spiral: class c's points at radius r in [0, 1] and angle
 * 4c + 4r plus noise. */
static int make_spiral(ct_generator *gen, ct_tensor **x, ct_tensor **y) {
    /* noise = torch.randn(N) * 0.2 */
    ct_tensor *noise = ct_tensor_randn(gen, CT_SHAPE(N), CT_F32, CT_CPU);
    if (check(noise != NULL, "randn")) return 1;
    float nv[N], xv[N * 2];
    int64_t yv[N];
    ct_status st = ct_tensor_copy_to_host(noise, nv, sizeof nv);
    ct_tensor_release(noise);
    if (check(st == CT_OK, "copy_to_host")) return 1;
    for (int c = 0; c < CLASSES; c++) {
        for (int i = 0; i < PER_CLASS; i++) {
            int k = c * PER_CLASS + i;
            double r = (double)i / (PER_CLASS - 1);
            double t = 4.0 * c + 4.0 * r + 0.2 * nv[k];
            xv[2 * k] = (float)(r * sin(t));
            xv[2 * k + 1] = (float)(r * cos(t));
            yv[k] = c;
        }
    }
    *x = ct_tensor_from_data(xv, CT_F32, CT_SHAPE(N, 2));
    *y = ct_tensor_from_data(yv, CT_I64, CT_SHAPE(N));
    return check(*x && *y, "from_data");
}

/* class MLP(nn.Module):
 *     def __init__(self):
 *         super().__init__()
 *         self.fc1 = nn.Linear(2, HIDDEN)
 *         self.fc2 = nn.Linear(HIDDEN, CLASSES)
 *     def forward(self, x):
 *         return self.fc2(F.relu(self.fc1(x))) */
typedef struct mlp {
    ct_nn_linear *fc1, *fc2;
} mlp;

static ct_tensor *mlp_forward(mlp *m, ct_tensor *x) {
    return ct_nn_linear_forward(m->fc2, ct_relu(ct_nn_linear_forward(m->fc1, x)));
}

int main(void) {
    ct_generator *gen = ct_generator_new(0);
    ct_tensor *x = NULL, *y = NULL;
    if (!gen || make_spiral(gen, &x, &y)) return 1;

    /* model = MLP() */
    mlp model = {
        ct_nn_linear_new(2, HIDDEN, true, CT_F32, CT_CPU, gen),
        ct_nn_linear_new(HIDDEN, CLASSES, true, CT_F32, CT_CPU, gen),
    };
    if (check(model.fc1 && model.fc2, "nn_linear_new")) return 1;
    /* params = dict(model.named_parameters()) */
    ct_params *params = ct_params_new();
    if (check(params && ct_nn_linear_params(model.fc1, "fc1", params) == CT_OK &&
                  ct_nn_linear_params(model.fc2, "fc2", params) == CT_OK,
              "params"))
        return 1;
    /* opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4) */
    const double base_lr = 1e-2;
    ct_optimizer *opt = ct_optim_adamw_new(params, base_lr, 0.9, 0.999, 1e-8, 1e-4);
    if (check(opt != NULL, "optim_adamw_new")) return 1;

    int rc = 0;
    for (int step = 0; step <= STEPS && !rc; step++) {   /* for step in range(STEPS + 1): */
        /* Everything this iteration creates is released at ct_scope_end,
         * as Python's garbage collector would. */
        ct_scope *scope = ct_scope_begin();
        /* for g in opt.param_groups:
         *     g["lr"] = cosine_with_warmup(step)  # 100 warmup steps, to 1e-4 */
        ct_optim_set_lr(opt, ct_lr_cosine_warmup(base_lr, 100, STEPS, 1e-4, step));
        ct_tensor *logits = mlp_forward(&model, x);     /* logits = model(x) */
        ct_tensor *loss =                              /* loss = F.cross_entropy(logits, y) */
            ct_cross_entropy(logits, y, NULL, CT_REDUCTION_MEAN, -100, 0.0);
        rc = check(loss != NULL, "forward");            /* the message names the first failure */
        ct_optim_zero_grad(opt);                        /* opt.zero_grad() */
        if (!rc) /* loss.backward() */
            rc = check(ct_backward(loss, NULL, false) == CT_OK, "backward");
        /* nn.utils.clip_grad_norm_(model.parameters(), 1.0) */
        if (!rc) rc = check(ct_clip_grad_norm(params, 1.0, NULL) == CT_OK, "clip_grad_norm");
        if (!rc) rc = check(ct_optim_step(opt) == CT_OK, "step"); /* opt.step() */

        if (!rc && step % 200 == 0) {
            /* acc = (logits.argmax(1) == y).float().mean().item() */
            double l = 0, hits = 0;
            ct_tensor *correct = ct_sum(ct_eq(ct_argmax(logits, 1, false), y), CT_NONE, false);
            rc = check(ct_tensor_item(loss, &l) == CT_OK &&
                           ct_tensor_item(correct, &hits) == CT_OK,
                       "item");
            /* print(f"step {step:5d}  lr {lr:.5f}  loss {loss.item():.4f}  accuracy {acc:.3f}") */
            printf("step %5d  lr %.5f  loss %.4f  accuracy %.3f\n", step, ct_optim_get_lr(opt),
                   l, hits / N);
        }
        ct_scope_end(scope);
    }

    ct_optim_free(opt);
    ct_params_free(params);
    ct_nn_linear_free(model.fc1);
    ct_nn_linear_free(model.fc2);
    ct_tensor_release(x);
    ct_tensor_release(y);
    ct_generator_free(gen);
    return rc;
}
