/* Trains a multilayer perceptron (784-256-10, ReLU) on Fashion-MNIST, as
 * examples/reference/fashion_mlp.py does with PyTorch (its lines are quoted
 * alongside). fashion_common.c holds the command line, the data, the
 * progress lines, the evaluation and the checkpoints.
 *
 *     fashion_mlp [--device cpu|cuda] [--epochs N] [--batch-size N] [--lr X] [--seed N]
 *                 [--checkpoint PATH] [--resume] [--data DIR] ...   (--help lists all)
 *
 * Ctrl-C stops after the step under way and saves a checkpoint; --resume
 * continues from it exactly where the run stopped. --amp bf16|fp16 trains in
 * mixed precision (docs/AMP.md); on a GPU, --cuda-graph replays the whole
 * step from a CUDA graph (docs/CUDA_GRAPHS.md).
 *
 * Data-parallel over N processes (docs/DISTRIBUTED.md), each with its share
 * of every epoch, gradients averaged during backward:
 *
 *     mpirun -np N fashion_mlp --ddp [--device cuda] ... */
#include <stdio.h>

#include <tensor/tensor.h>

#include "fashion_common.h"

/* class MLP(nn.Module):
 *     def __init__(self):
 *         super().__init__()
 *         self.fc1 = nn.Linear(28 * 28, 256)
 *         self.fc2 = nn.Linear(256, 10) */
typedef struct mlp {
    ct_nn_linear *fc1, *fc2;
} mlp;

static bool mlp_init(mlp *m, ct_device device, ct_generator *gen) {
    m->fc1 = ct_nn_linear_new(28 * 28, 256, true, CT_F32, device, gen);
    m->fc2 = m->fc1 ? ct_nn_linear_new(256, 10, true, CT_F32, device, gen) : NULL;
    return m->fc2 != NULL;
}

/* dict(model.named_parameters()) */
static bool mlp_params(mlp *m, ct_params *p) {
    return ct_nn_linear_params(m->fc1, "fc1", p) == CT_OK &&
           ct_nn_linear_params(m->fc2, "fc2", p) == CT_OK;
}

static void mlp_free(mlp *m) {
    ct_nn_linear_free(m->fc1);
    ct_nn_linear_free(m->fc2);
}

/*     def forward(self, x):
 *         return self.fc2(F.relu(self.fc1(x.flatten(1)))) */
static ct_tensor *mlp_forward(mlp *m, ct_tensor *x) {
    return ct_nn_linear_forward(m->fc2, ct_relu(ct_nn_linear_forward(m->fc1, ct_flatten(x, 1, -1))));
}

static ct_tensor *mlp_forward_any(void *m, ct_tensor *x) { return mlp_forward(m, x); }

int main(int argc, char **argv) {
    fashion_config cfg = {
        .model = "mlp",
        .device = CT_CPU,
        .epochs = 10,
        .batch_size = 64,
        .optim = FASHION_ADAMW,
        .lr = 1e-3,
        .momentum = 0.9,
        .weight_decay = 1e-2,
        .seed = 0,
        .checkpoint = "fashion_mlp.safetensors",
        .data_dir = FASHION_DEFAULT_DIR,
    };
    fashion_data data;
    int rc;
    if (!fashion_setup(argc, argv, &cfg, &data, &rc)) return rc;

    /* torch.manual_seed(seed); model = MLP().to(device) */
    ct_generator *gen = ct_generator_new(cfg.seed);
    mlp model = {0};
    ct_params *params = ct_params_new();
    ct_optimizer *opt = NULL;
    ct_ddp *ddp = NULL;
    if (!gen || !params || !mlp_init(&model, cfg.device, gen) || !mlp_params(&model, params)) {
        fprintf(stderr, "building the model: %s\n", ct_last_error());
        rc = 1;
        goto done;
    }
    /* opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay) */
    /* model = DistributedDataParallel(model): rank 0's initial values everywhere */
    if (cfg.ddp && !(ddp = ct_ddp_new(params, NULL))) {
        fprintf(stderr, "wrapping the model: %s\n", ct_last_error());
        rc = 1;
        goto done;
    }
    opt = fashion_optimizer_new(&cfg, ddp ? ct_ddp_optim_params(ddp) : params);
    if (!opt) {
        rc = 1;
        goto done;
    }

    fashion_run run;
    if (fashion_run_begin(&run, &cfg, &data, params, opt, mlp_forward_any, &model)) {
        while (run.epoch < cfg.epochs) { /* for epoch in range(start_epoch, epochs): */
            ct_tensor *x, *y;
            while (fashion_next_batch(&run, &x, &y)) { /* for x, y in train_loader: */
                /* for g in opt.param_groups: g["lr"] = cosine(step) */
                ct_optim_set_lr(opt, fashion_lr(&run));
                if (cfg.cuda_graph) { /* the whole step, replayed from a CUDA graph */
                    ct_tensor *loss = fashion_graph_step(&run, x, y);
                    fashion_step_done(&run, loss, loss != NULL);
                    continue;
                }
                fashion_autocast_begin(&run);                    /* with torch.autocast(): */
                ct_tensor *logits = mlp_forward(&model, x);      /* model(x) */
                ct_tensor *loss =                                /* F.cross_entropy */
                    ct_cross_entropy(logits, y, NULL, CT_REDUCTION_MEAN, -100, 0.0);
                fashion_autocast_end(&run);
                ct_optim_zero_grad(opt);                         /* opt.zero_grad() */
                /* scaler.scale(loss).backward(), the gradients averaged over
                 * the ranks with --ddp; scaler.step(opt) is opt.step() for an
                 * unscaled run, and ct_ddp_step's all-gather is only ZeRO-1's,
                 * which the examples do not use. */
                ct_tensor *scaled = loss ? ct_grad_scaler_scale(run.scaler, loss) : NULL;
                bool ok = scaled &&
                          (ddp ? ct_ddp_backward(ddp, scaled, NULL)
                               : ct_backward(scaled, NULL, false)) == CT_OK &&
                          ct_grad_scaler_step(run.scaler, opt) == CT_OK &&
                          ct_grad_scaler_update(run.scaler) == CT_OK;
                fashion_step_done(&run, loss, ok);
            }
            /* test accuracy, checkpoint; false after Ctrl-C or a failure */
            if (!fashion_end_epoch(&run)) break;
        }
    }
    rc = fashion_finish(&run);

done:
    ct_optim_free(opt);
    ct_ddp_free(ddp);
    ct_dist_finalize(); /* no-op without --ddp, or after fashion_finish */
    ct_params_free(params);
    mlp_free(&model);
    ct_generator_free(gen);
    fashion_data_free(&data);
    return rc;
}
