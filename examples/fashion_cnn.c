/* Trains a small convolutional network on Fashion-MNIST, as
 * examples/reference/fashion_cnn.py does with PyTorch (its lines are quoted
 * alongside). fashion_common.c holds the command line, the data, the
 * progress lines, the evaluation and the checkpoints.
 *
 *     fashion_cnn [--device cpu|cuda] [--epochs N] [--batch-size N] [--lr X] [--seed N]
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
 *     mpirun -np N fashion_cnn --ddp [--device cuda] ... */
#include <stdio.h>

#include <tensor/tensor.h>

#include "fashion_common.h"

/* class CNN(nn.Module):
 *     def __init__(self):
 *         super().__init__()
 *         self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
 *         self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
 *         self.fc = nn.Linear(32 * 7 * 7, 10) */
typedef struct cnn {
    ct_nn_conv2d *conv1, *conv2;
    ct_nn_linear *fc;
} cnn;

static bool cnn_init(cnn *m, ct_device device, ct_generator *gen) {
    const int64_t k3[2] = {3, 3}, pad1[2] = {1, 1};
    m->conv1 = ct_nn_conv2d_new(1, 16, k3, NULL, pad1, NULL, 1, true, CT_F32, device, gen);
    m->conv2 = m->conv1 ? ct_nn_conv2d_new(16, 32, k3, NULL, pad1, NULL, 1, true, CT_F32,
                                           device, gen)
                        : NULL;
    m->fc = m->conv2 ? ct_nn_linear_new(32 * 7 * 7, 10, true, CT_F32, device, gen) : NULL;
    return m->fc != NULL;
}

/* dict(model.named_parameters()) */
static bool cnn_params(cnn *m, ct_params *p) {
    return ct_nn_conv2d_params(m->conv1, "conv1", p) == CT_OK &&
           ct_nn_conv2d_params(m->conv2, "conv2", p) == CT_OK &&
           ct_nn_linear_params(m->fc, "fc", p) == CT_OK;
}

static void cnn_free(cnn *m) {
    ct_nn_conv2d_free(m->conv1);
    ct_nn_conv2d_free(m->conv2);
    ct_nn_linear_free(m->fc);
}

/*     def forward(self, x):
 *         x = F.max_pool2d(F.relu(self.conv1(x)), 2)   # [B, 16, 14, 14]
 *         x = F.max_pool2d(F.relu(self.conv2(x)), 2)   # [B, 32, 7, 7]
 *         return self.fc(x.flatten(1))                 # [B, 10] */
static ct_tensor *cnn_forward(cnn *m, ct_tensor *x) {
    const int64_t k2[2] = {2, 2};
    x = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(m->conv1, x)), k2, NULL, NULL, NULL, false,
                      NULL);
    x = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(m->conv2, x)), k2, NULL, NULL, NULL, false,
                      NULL);
    return ct_nn_linear_forward(m->fc, ct_flatten(x, 1, -1));
}

static ct_tensor *cnn_forward_any(void *m, ct_tensor *x) { return cnn_forward(m, x); }

int main(int argc, char **argv) {
    fashion_config cfg = {
        .model = "cnn",
        .device = CT_CPU,
        .epochs = 10,
        .batch_size = 64,
        .optim = FASHION_ADAMW,
        .lr = 2e-3,
        .momentum = 0.9,
        .weight_decay = 1e-2,
        .seed = 0,
        .checkpoint = "fashion_cnn.safetensors",
        .data_dir = FASHION_DEFAULT_DIR,
    };
    fashion_data data;
    int rc;
    if (!fashion_setup(argc, argv, &cfg, &data, &rc)) return rc;

    /* torch.manual_seed(seed); model = CNN().to(device) */
    ct_generator *gen = ct_generator_new(cfg.seed);
    cnn model = {0};
    ct_params *params = ct_params_new();
    ct_optimizer *opt = NULL;
    ct_ddp *ddp = NULL;
    if (!gen || !params || !cnn_init(&model, cfg.device, gen) || !cnn_params(&model, params)) {
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
    if (fashion_run_begin(&run, &cfg, &data, params, opt, cnn_forward_any, &model)) {
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
                ct_tensor *logits = cnn_forward(&model, x);      /* model(x) */
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
    cnn_free(&model);
    ct_generator_free(gen);
    fashion_data_free(&data);
    return rc;
}
