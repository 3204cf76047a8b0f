/* The Fashion-MNIST examples' shared pieces; see fashion_common.h. */
#include "fashion_common.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- command line ------------------------------------------------------------------------ */

/* Bits of fashion_config.given: settings a resumed run takes from its
 * checkpoint unless the command line names them. */
enum {
    GIVEN_EPOCHS = 1u << 0,
    GIVEN_BATCH = 1u << 1,
    GIVEN_LR = 1u << 2,
    GIVEN_SEED = 1u << 3,
    GIVEN_LIMIT_TRAIN = 1u << 4,
    GIVEN_LIMIT_TEST = 1u << 5,
    GIVEN_OPTIM = 1u << 6,
    GIVEN_MOMENTUM = 1u << 7,
    GIVEN_WD = 1u << 8,
    GIVEN_AMP = 1u << 9,
};

static const char *optim_name(fashion_optim o) { return o == FASHION_SGD ? "sgd" : "adamw"; }

static void usage(FILE *f, const char *prog, const fashion_config *d) {
    char dev[32];
    fprintf(f,
            "usage: %s [options]\n"
            "Trains the %s model on Fashion-MNIST and reports its test accuracy after each epoch.\n"
            "  --device cpu|cuda[:N]|auto  where to train; auto: the first GPU when its\n"
            "                          backend has every op training needs, else the CPU (default %s)\n"
            "  --epochs N              epochs (default %" PRId64 ")\n"
            "  --batch-size N          minibatch size (default %" PRId64 ")\n"
            "  --optimizer sgd|adamw   (default %s)\n"
            "  --lr X                  peak learning rate, cosine decay to 0 (default %g)\n"
            "  --momentum X            SGD momentum (default %g)\n"
            "  --weight-decay X        (default %g)\n"
            "  --seed N                initialisation and shuffling seed (default %" PRIu64 ")\n"
            "  --checkpoint PATH       safetensors checkpoint, written after each epoch and on\n"
            "                          Ctrl-C (default %s)\n"
            "  --no-checkpoint         write none\n"
            "  --resume                continue from the checkpoint; settings not given take\n"
            "                          the checkpoint's values\n"
            "  --data DIR              the gzip IDX files (default %s)\n"
            "  --limit-train N         use the first N training images (default: all)\n"
            "  --limit-test N          use the first N test images (default: all)\n"
            "  --log-every N           a progress line every N steps (default: every ~2 s)\n"
            "  --amp bf16|fp16|off     mixed precision: autocast the forward to bfloat16, or to\n"
            "                          float16 with gradient scaling (default off)\n"
            "  --cuda-graph            capture the training step in a CUDA graph after one eager\n"
            "                          step and replay it (GPU only)\n"
            "  --ddp                   data-parallel training over the processes of an MPI launch\n"
            "                          (mpirun -np N %s --ddp): each trains on its share of\n"
            "                          every epoch with --batch-size per process; rank 0 prints\n",
            prog, d->model, ct_device_str(d->device, dev, sizeof dev), d->epochs,
            d->batch_size, optim_name(d->optim), d->lr, d->momentum, d->weight_decay, d->seed,
            d->checkpoint ? d->checkpoint : "none", d->data_dir, prog);
}

static bool parse_i64(const char *s, int64_t min, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < min) return false;
    *out = v;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (*s == '-') return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

static bool parse_f64(const char *s, double min, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min) return false;
    *out = v;
    return true;
}

static bool parse_device(const char *s, ct_device *out) {
    if (!strcmp(s, "cpu")) {
        *out = CT_CPU;
        return true;
    }
    if (strncmp(s, "cuda", 4)) return false;
    int64_t index = 0;
    if (s[4] == ':' && !parse_i64(s + 5, 0, &index)) return false;
    if (s[4] && s[4] != ':') return false;
    if (index > INT_MAX) return false;
    *out = CT_CUDA((int)index);
    return true;
}

int fashion_parse_args(int argc, char **argv, fashion_config *cfg) {
    const char *prog = argc > 0 ? argv[0] : "fashion";
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL;
        char name[64];
        const char *eq = strchr(arg, '=');
        size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
        if (n >= sizeof name) n = sizeof name - 1;
        memcpy(name, arg, n);
        name[n] = '\0';
        if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
            usage(stdout, prog, cfg);
            return 1;
        }
        if (!strcmp(name, "--resume")) {
            cfg->resume = true;
            continue;
        }
        if (!strcmp(name, "--no-checkpoint")) {
            cfg->checkpoint = NULL;
            continue;
        }
        if (!strcmp(name, "--cuda-graph")) {
            cfg->cuda_graph = true;
            continue;
        }
        if (!strcmp(name, "--ddp")) {
            cfg->ddp = true;
            continue;
        }
        if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            fprintf(stderr, "%s: %s needs a value (see --help)\n", prog, name);
            return -1;
        }
        bool ok = true;
        if (!strcmp(name, "--device")) {
            cfg->auto_device = !strcmp(val, "auto");
            ok = cfg->auto_device || parse_device(val, &cfg->device);
        } else if (!strcmp(name, "--epochs")) {
            ok = parse_i64(val, 1, &cfg->epochs);
            cfg->given |= GIVEN_EPOCHS;
        } else if (!strcmp(name, "--batch-size")) {
            ok = parse_i64(val, 1, &cfg->batch_size);
            cfg->given |= GIVEN_BATCH;
        } else if (!strcmp(name, "--optimizer")) {
            ok = !strcmp(val, "sgd") || !strcmp(val, "adamw");
            cfg->optim = !strcmp(val, "sgd") ? FASHION_SGD : FASHION_ADAMW;
            cfg->given |= GIVEN_OPTIM;
        } else if (!strcmp(name, "--lr")) {
            ok = parse_f64(val, 0.0, &cfg->lr);
            cfg->given |= GIVEN_LR;
        } else if (!strcmp(name, "--momentum")) {
            ok = parse_f64(val, 0.0, &cfg->momentum);
            cfg->given |= GIVEN_MOMENTUM;
        } else if (!strcmp(name, "--weight-decay")) {
            ok = parse_f64(val, 0.0, &cfg->weight_decay);
            cfg->given |= GIVEN_WD;
        } else if (!strcmp(name, "--seed")) {
            ok = parse_u64(val, &cfg->seed);
            cfg->given |= GIVEN_SEED;
        } else if (!strcmp(name, "--checkpoint")) {
            ok = *val != '\0';
            cfg->checkpoint = val;
        } else if (!strcmp(name, "--data")) {
            cfg->data_dir = val;
        } else if (!strcmp(name, "--limit-train")) {
            ok = parse_i64(val, 1, &cfg->limit_train);
            cfg->given |= GIVEN_LIMIT_TRAIN;
        } else if (!strcmp(name, "--limit-test")) {
            ok = parse_i64(val, 1, &cfg->limit_test);
            cfg->given |= GIVEN_LIMIT_TEST;
        } else if (!strcmp(name, "--amp")) {
            ok = !strcmp(val, "bf16") || !strcmp(val, "fp16") || !strcmp(val, "off");
            cfg->amp = !strcmp(val, "bf16") ? CT_BF16 : !strcmp(val, "fp16") ? CT_F16 : CT_F32;
            cfg->given |= GIVEN_AMP;
        } else if (!strcmp(name, "--log-every")) {
            ok = parse_i64(val, 0, &cfg->log_every);
        } else {
            fprintf(stderr, "%s: unknown option %s (see --help)\n", prog, arg);
            return -1;
        }
        if (!ok) {
            fprintf(stderr, "%s: bad value '%s' for %s (see --help)\n", prog, val, name);
            return -1;
        }
    }
    if (cfg->resume && !cfg->checkpoint) {
        fprintf(stderr, "%s: --resume needs a checkpoint (--checkpoint PATH)\n", prog);
        return -1;
    }
    return 0;
}

/* ---- checkpoint metadata ---------------------------------------------------------------- */

/* A number the checkpoint must hold, at least min; false with a message. */
static bool meta_i64(const ct_metadata *m, const char *path, const char *key, int64_t min,
                     int64_t *out) {
    if (ct_metadata_get_int(m, key, out) == CT_OK && *out >= min) return true;
    fprintf(stderr, "checkpoint %s: metadata \"%s\" is missing or invalid\n", path, key);
    return false;
}

static bool meta_f64(const ct_metadata *m, const char *path, const char *key, double min,
                     double *out) {
    if (ct_metadata_get_double(m, key, out) == CT_OK && isfinite(*out) && *out >= min) return true;
    fprintf(stderr, "checkpoint %s: metadata \"%s\" is missing or invalid\n", path, key);
    return false;
}

/* A setting the checkpoint fixes (the data order and the optimizer state
 * depend on it): taken from the checkpoint, or refused when the command
 * line asks for another value. */
static bool fixed_i64(const fashion_config *cfg, unsigned bit, const char *flag,
                      int64_t saved, int64_t *value) {
    if ((cfg->given & bit) && *value != saved) {
        fprintf(stderr,
                "--resume: the checkpoint %s was made with %s %" PRId64
                "; resuming with %" PRId64 " is not possible\n",
                cfg->checkpoint, flag, saved, *value);
        return false;
    }
    *value = saved;
    return true;
}

/* Takes the settings of the run that wrote the checkpoint. */
static bool config_from_checkpoint(fashion_config *cfg) {
    ct_metadata *meta = ct_load_safetensors_metadata(cfg->checkpoint);
    if (!meta) {
        fprintf(stderr, "--resume: %s\n", ct_last_error());
        return false;
    }
    const char *path = cfg->checkpoint, *model = ct_metadata_get(meta, "model");
    const char *optim = ct_metadata_get(meta, "optimizer");
    bool ok = true;
    if (!model || strcmp(model, cfg->model)) {
        fprintf(stderr, "--resume: %s is not a checkpoint of the %s example (model: %s)\n", path,
                cfg->model, model ? model : "none");
        ok = false;
    }
    if (ok && (!optim || (strcmp(optim, "sgd") && strcmp(optim, "adamw")))) {
        fprintf(stderr, "checkpoint %s: metadata \"optimizer\" is missing or unknown\n", path);
        ok = false;
    }
    int64_t batch = 0, epochs = 0, limit_train = 0, limit_test = 0, saved_optim = 0;
    uint64_t seed = 0;
    double lr = 0, momentum = 0, wd = 0;
    ok = ok && meta_i64(meta, path, "batch_size", 1, &batch) &&
         meta_i64(meta, path, "epochs", 1, &epochs) &&
         meta_i64(meta, path, "limit_train", 0, &limit_train) &&
         meta_i64(meta, path, "limit_test", 0, &limit_test) &&
         ct_metadata_get_uint(meta, "seed", &seed) == CT_OK &&
         meta_f64(meta, path, "lr", 0.0, &lr) &&
         meta_f64(meta, path, "momentum", 0.0, &momentum) &&
         meta_f64(meta, path, "weight_decay", 0.0, &wd);
    if (ok) {
        int64_t o = cfg->optim;
        saved_optim = strcmp(optim, "sgd") ? FASHION_ADAMW : FASHION_SGD;
        int64_t s = (int64_t)cfg->seed;
        ok = fixed_i64(cfg, GIVEN_BATCH, "--batch-size", batch, &cfg->batch_size) &&
             fixed_i64(cfg, GIVEN_LIMIT_TRAIN, "--limit-train", limit_train,
                       &cfg->limit_train) &&
             fixed_i64(cfg, GIVEN_SEED, "--seed", (int64_t)seed, &s);
        if (ok && (cfg->given & GIVEN_OPTIM) && o != saved_optim) {
            fprintf(stderr, "--resume: the checkpoint %s was made with --optimizer %s\n", path,
                    optim);
            ok = false;
        }
        cfg->seed = (uint64_t)s;
        cfg->optim = (fashion_optim)saved_optim;
    }
    /* Settings a resumed run may change: more epochs (the schedule then
     * stretches over the new total), a learning rate, another test subset. */
    if (ok && !(cfg->given & GIVEN_EPOCHS)) cfg->epochs = epochs;
    if (ok && !(cfg->given & GIVEN_LR)) cfg->lr = lr;
    if (ok && !(cfg->given & GIVEN_MOMENTUM)) cfg->momentum = momentum;
    if (ok && !(cfg->given & GIVEN_WD)) cfg->weight_decay = wd;
    if (ok && !(cfg->given & GIVEN_LIMIT_TEST)) cfg->limit_test = limit_test;
    /* Checkpoints from before --amp existed trained in float32. */
    const char *amp = ct_metadata_get(meta, "amp");
    if (ok && !(cfg->given & GIVEN_AMP) && amp)
        cfg->amp = !strcmp(amp, "bf16") ? CT_BF16 : !strcmp(amp, "fp16") ? CT_F16 : CT_F32;
    ct_metadata_free(meta);
    return ok;
}

/* ---- data ------------------------------------------------------------------------------------ */

/* Loads one (images, labels) pair of IDX files, the first limit samples
 * (0: all), images normalised to [N, 1, 28, 28] float32 as the PyTorch
 * scripts do: (x / 255 - mean) / std. */
static bool load_split(const char *dir, const char *split, int64_t limit, ct_tensor **images,
                       ct_tensor **labels) {
    char ipath[4096], lpath[4096];
    snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    ct_scope *s = ct_scope_begin();
    ct_tensor *x = ct_idx_load(ipath, CT_F32);
    ct_tensor *y = x ? ct_idx_load(lpath, CT_I64) : NULL;
    if (!x || !y) {
        fprintf(stderr, "%s\n(the dataset-fashion-mnist package installs the files; --data DIR "
                        "names another directory)\n",
                ct_last_error());
        ct_scope_end(s);
        return false;
    }
    int64_t n = ct_tensor_size(x, 0);
    if (ct_tensor_ndim(x) != 3 || ct_tensor_size(x, 1) != 28 || ct_tensor_size(x, 2) != 28 ||
        ct_tensor_ndim(y) != 1 || ct_tensor_size(y, 0) != n) {
        char xs[64], ys[64];
        fprintf(stderr, "%s and %s: expected [N, 28, 28] images and [N] labels, got %s and %s\n",
                ipath, lpath, ct_shape_str(ct_tensor_ndim(x), ct_tensor_shape(x), xs, sizeof xs),
                ct_shape_str(ct_tensor_ndim(y), ct_tensor_shape(y), ys, sizeof ys));
        ct_scope_end(s);
        return false;
    }
    if (limit > 0 && limit < n) {
        x = ct_narrow(x, 0, 0, limit);
        y = ct_narrow(y, 0, 0, limit);
        n = limit;
    }
    x = ct_div_scalar(ct_sub_scalar(ct_div_scalar(x, 255.0), FASHION_MEAN), FASHION_STD);
    x = ct_reshape(x, CT_SHAPE(n, 1, 28, 28));
    y = ct_contiguous(y);
    if (!x || !y) {
        fprintf(stderr, "preparing %s: %s\n", ipath, ct_last_error());
        ct_scope_end(s);
        return false;
    }
    *images = ct_keep(x);
    *labels = ct_keep(y);
    ct_scope_end(s);
    return true;
}

void fashion_data_free(fashion_data *data) {
    ct_tensor_release(data->train_x);
    ct_tensor_release(data->train_y);
    ct_tensor_release(data->test_x);
    ct_tensor_release(data->test_y);
    memset(data, 0, sizeof *data);
}

/* The device must hold tensors before any time goes into loading data; the
 * library's message says why it cannot. */
static bool check_device(ct_device device) {
    ct_tensor *probe = ct_tensor_zeros(CT_SHAPE(1), CT_F32, device);
    if (!probe) {
        char dev[32];
        fprintf(stderr, "cannot train on %s: %s\n", ct_device_str(device, dev, sizeof dev),
                ct_last_error());
        return false;
    }
    ct_tensor_release(probe);
    return true;
}

/* auto picks the GPU only when its backend has every op a training step of
 * these models dispatches, forward and backward. */
static bool gpu_can_train(void) {
    static const ct_op needed[] = {CT_OP_CONV2D, CT_OP_CONV2D_BACKWARD_INPUT,
                                   CT_OP_CONV2D_BACKWARD_WEIGHT, CT_OP_MAX_POOL2D,
                                   CT_OP_MAX_POOL2D_BACKWARD, CT_OP_CROSS_ENTROPY,
                                   CT_OP_CROSS_ENTROPY_BACKWARD, CT_OP_ADDMM, CT_OP_RELU};
    if (!ct_cuda_available()) return false;
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (!ct_supports(needed[i], CT_DEVICE_CUDA, CT_F32)) return false;
    return true;
}

static bool setup_rest(fashion_config *cfg, fashion_data *data, int *exit_status);

/* dist.init_process_group(); ranks other than 0 print nothing. */
static bool start_ddp(void) {
    if (ct_dist_init(NULL) != CT_OK) {
        fprintf(stderr, "--ddp: %s\n", ct_last_error());
        return false;
    }
    if (ct_dist_rank() != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "--ddp: rank %d cannot silence its output\n", ct_dist_rank());
        return false;
    }
    return true;
}

bool fashion_setup(int argc, char **argv, fashion_config *cfg, fashion_data *data,
                   int *exit_status) {
    memset(data, 0, sizeof *data);
    int r = fashion_parse_args(argc, argv, cfg);
    *exit_status = r > 0 ? 0 : r < 0 ? 2 : 1;
    if (r) return false;
    if (cfg->ddp && cfg->cuda_graph) {
        fprintf(stderr, "--cuda-graph cannot be combined with --ddp: the gradients' all-reduce is "
                        "started from autograd hooks on the host, which a replay does not run\n");
        *exit_status = 2;
        return false;
    }
    if (cfg->ddp && !start_ddp()) return false;
    if (!setup_rest(cfg, data, exit_status)) {
        ct_dist_finalize();
        return false;
    }
    *exit_status = 0;
    return true;
}

/* fashion_setup after the command line and the process group. */
static bool setup_rest(fashion_config *cfg, fashion_data *data, int *exit_status) {
    if (cfg->resume && !config_from_checkpoint(cfg)) return false;
    if (cfg->auto_device) cfg->device = gpu_can_train() ? CT_CUDA(0) : CT_CPU;
    if (cfg->cuda_graph && cfg->device.type != CT_DEVICE_CUDA) {
        fprintf(stderr, "--cuda-graph needs a CUDA device (--device cuda): a CUDA graph replays "
                        "GPU work\n");
        *exit_status = 2;
        return false;
    }
    /* One GPU per process on each machine: LOCAL_RANK's. */
    if (cfg->ddp && cfg->device.type == CT_DEVICE_CUDA && ct_cuda_device_count() > 0)
        cfg->device.index = ct_dist_local_rank() % ct_cuda_device_count();
    if (!check_device(cfg->device)) return false;
    if (!load_split(cfg->data_dir, "train", cfg->limit_train, &data->train_x, &data->train_y) ||
        !load_split(cfg->data_dir, "t10k", cfg->limit_test, &data->test_x, &data->test_y)) {
        fashion_data_free(data);
        return false;
    }
    return true;
}

ct_optimizer *fashion_optimizer_new(const fashion_config *cfg, const ct_params *params) {
    ct_optimizer *opt =
        cfg->optim == FASHION_SGD
            ? ct_optim_sgd_new(params, cfg->lr, cfg->momentum, 0.0, cfg->weight_decay, false)
            : ct_optim_adamw_new(params, cfg->lr, 0.9, 0.999, 1e-8, cfg->weight_decay);
    if (!opt) fprintf(stderr, "creating the optimizer: %s\n", ct_last_error());
    return opt;
}

/* ---- Ctrl-C ------------------------------------------------------------------------------ */

static volatile sig_atomic_t g_sigint;

static void on_sigint(int sig) {
    (void)sig;
    g_sigint = 1;
    static const char msg[] =
        "\ninterrupted: stopping after this step (Ctrl-C again quits at once)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
}

/* The first Ctrl-C asks the loop to stop; the handler then resets itself
 * (SA_RESETHAND) so that a second one ends the process. */
static void install_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, NULL);
}

static void remove_sigint(void) { signal(SIGINT, SIG_DFL); }

/* ---- the run ----------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *fmt_duration(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e8) s = 0;
    long t = lround(s);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm%02lds", t / 3600, t / 60 % 60, t % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%.1fs", s);
    return buf;
}

/* Ends device work so that the clock measures it. */
static void sync_device(ct_device d) {
    if (d.type == CT_DEVICE_CUDA) ct_cuda_synchronize(d.index);
}

static const char *amp_name(ct_dtype amp) {
    return amp == CT_BF16 ? "bf16" : amp == CT_F16 ? "fp16" : "off";
}

/* The gradient scaler's scale and growth tracker, as torch saves
 * scaler.state_dict() beside the optimizer's. */
static bool save_scaler(const fashion_run *run, ct_metadata *m) {
    ct_grad_scaler_state st;
    if (run->cfg->amp != CT_F16) return true;
    return ct_grad_scaler_get_state(run->scaler, &st) == CT_OK &&
           !ct_metadata_set_double(m, "grad_scale", st.scale) &&
           !ct_metadata_set_int(m, "grad_growth_tracker", st.growth_tracker);
}

/* A float16 run resumed from a float16 checkpoint continues with its scale;
 * from any other, the scaler starts afresh. */
static bool restore_scaler(fashion_run *run, const ct_metadata *meta) {
    ct_grad_scaler_state st;
    const char *amp = ct_metadata_get(meta, "amp");
    if (run->cfg->amp != CT_F16 || !amp || strcmp(amp, "fp16")) return true;
    if (!meta_f64(meta, run->cfg->checkpoint, "grad_scale", 0.0, &st.scale) ||
        !meta_i64(meta, run->cfg->checkpoint, "grad_growth_tracker", 0, &st.growth_tracker))
        return false;
    if (ct_grad_scaler_set_state(run->scaler, &st) == CT_OK) return true;
    fprintf(stderr, "--resume: %s\n", ct_last_error());
    return false;
}

static bool save_checkpoint(fashion_run *run) {
    const fashion_config *cfg = run->cfg;
    /* Every rank holds the same parameters and optimizer state; rank 0
     * writes them. */
    if (cfg->ddp && ct_dist_rank() != 0) return true;
    double epoch_loss = 0;
    ct_metadata *m = ct_metadata_new();
    bool ok = m && ct_tensor_item(run->epoch_loss_sum, &epoch_loss) == CT_OK &&
              ct_metadata_set(m, "format", "cten-fashion-2") == CT_OK &&
              ct_metadata_set(m, "model", cfg->model) == CT_OK &&
              ct_metadata_set(m, "optimizer", optim_name(cfg->optim)) == CT_OK &&
              !ct_metadata_set_int(m, "epochs", cfg->epochs) &&
              !ct_metadata_set_int(m, "batch_size", cfg->batch_size) &&
              !ct_metadata_set_double(m, "lr", cfg->lr) &&
              !ct_metadata_set_double(m, "momentum", cfg->momentum) &&
              !ct_metadata_set_double(m, "weight_decay", cfg->weight_decay) &&
              !ct_metadata_set_uint(m, "seed", cfg->seed) &&
              !ct_metadata_set_int(m, "limit_train", cfg->limit_train) &&
              !ct_metadata_set_int(m, "limit_test", cfg->limit_test) &&
              !ct_metadata_set_int(m, "epoch", run->epoch) &&
              !ct_metadata_set_int(m, "step", run->step) &&
              !ct_metadata_set_double(m, "best_accuracy", run->best_accuracy) &&
              !ct_metadata_set_int(m, "best_epoch", run->best_epoch) &&
              !ct_metadata_set_double(m, "train_seconds", run->train_seconds) &&
              !ct_metadata_set_double(m, "epoch_loss_sum", epoch_loss) &&
              !ct_metadata_set_int(m, "epoch_steps", run->epoch_steps) &&
              ct_metadata_set(m, "amp", amp_name(cfg->amp)) == CT_OK && save_scaler(run, m) &&
              ct_checkpoint_save(cfg->checkpoint, run->params, run->opt, run->train, m) == CT_OK;
    if (!ok) fprintf(stderr, "saving the checkpoint %s: %s\n", cfg->checkpoint, ct_last_error());
    ct_metadata_free(m);
    return ok;
}

/* Restores the model, the optimizer, the counters and the data order. */
static bool restore_checkpoint(fashion_run *run) {
    const char *path = run->cfg->checkpoint;
    ct_metadata *meta = NULL;
    if (ct_checkpoint_load(path, run->params, run->opt, run->train, &meta) != CT_OK) {
        fprintf(stderr, "--resume: %s\n", ct_last_error());
        return false;
    }
    int64_t best_epoch;
    double epoch_loss;
    /* The epoch's loss so far, so that its mean covers every step of it. */
    bool ok = meta_f64(meta, path, "epoch_loss_sum", 0.0, &epoch_loss) &&
              meta_i64(meta, path, "epoch_steps", 0, &run->epoch_steps) &&
              ct_fill_(run->epoch_loss_sum, epoch_loss) == CT_OK &&
              meta_i64(meta, path, "epoch", 0, &run->epoch) &&
              meta_i64(meta, path, "step", 0, &run->step) &&
              meta_f64(meta, path, "best_accuracy", -1.0, &run->best_accuracy) &&
              meta_i64(meta, path, "best_epoch", -1, &best_epoch) &&
              meta_f64(meta, path, "train_seconds", 0.0, &run->train_seconds) &&
              restore_scaler(run, meta);
    ct_metadata_free(meta);
    if (!ok) return false;
    run->best_epoch = best_epoch;
    ct_dataloader_state ls = ct_dataloader_get_state(run->train);
    if (ls.epoch != run->epoch ||
        run->step != run->epoch * run->steps_per_epoch +
                         (ls.position + run->cfg->batch_size - 1) / run->cfg->batch_size) {
        fprintf(stderr, "checkpoint %s: epoch %" PRId64 ", step %" PRId64
                        " and the data loader's position disagree\n",
                path, run->epoch, run->step);
        return false;
    }
    return true;
}

static int64_t count_params(const ct_params *p) {
    int64_t n = 0;
    for (int64_t i = 0; i < ct_params_count(p); i++)
        n += ct_tensor_numel(ct_params_get(p, i, NULL));
    return n;
}

static void print_header(const fashion_run *run) {
    const fashion_config *cfg = run->cfg;
    char dev[32];
    printf("fashion-%s: %" PRId64 " training / %" PRId64 " test images, %" PRId64
           " parameters\n",
           cfg->model, ct_dataloader_num_samples(run->train),
           ct_dataloader_num_samples(run->test), count_params(run->params));
    printf("  %" PRId64 " epoch%s of %" PRId64 " steps, batch %" PRId64 ", %s lr %g", cfg->epochs,
           cfg->epochs == 1 ? "" : "s", run->steps_per_epoch, cfg->batch_size, cfg->optim == FASHION_SGD ? "SGD" : "AdamW",
           cfg->lr);
    if (cfg->optim == FASHION_SGD) printf(" momentum %g", cfg->momentum);
    printf(" weight decay %g, cosine schedule, seed %" PRIu64 "\n", cfg->weight_decay,
           cfg->seed);
    printf("  device %s", ct_device_str(cfg->device, dev, sizeof dev));
    if (cfg->device.type == CT_DEVICE_CPU) printf(" (%d threads)", ct_get_num_threads());
    if (cfg->ddp)
        printf(", data-parallel over %d processes (%s launch; losses are rank 0's)",
               ct_dist_world_size(), ct_dist_launch());
    if (cfg->checkpoint)
        printf(", checkpoint %s (after each epoch and on Ctrl-C)", cfg->checkpoint);
    printf("\n");
    if (cfg->amp != CT_F32)
        printf("  mixed precision: forward autocast to %s%s\n", ct_dtype_name(cfg->amp),
               cfg->amp == CT_F16 ? ", gradients scaled" : "");
    if (cfg->cuda_graph)
        printf("  CUDA graph: the training step captured at the second step and replayed\n");
    if (cfg->resume && run->epoch < cfg->epochs)
        printf("resumed from %s at epoch %" PRId64 ", step %" PRId64 "/%" PRId64 "\n",
               cfg->checkpoint, run->epoch + 1, run->step, cfg->epochs * run->steps_per_epoch);
    else if (cfg->resume)
        printf("resumed from %s: all %" PRId64 " epochs are done (--epochs N trains more)\n",
               cfg->checkpoint, cfg->epochs);
    fflush(stdout);
}

bool fashion_run_begin(fashion_run *run, const fashion_config *cfg, const fashion_data *data,
                       ct_params *params, ct_optimizer *opt, fashion_forward_fn forward,
                       void *model) {
    memset(run, 0, sizeof *run);
    run->cfg = cfg;
    run->params = params;
    run->opt = opt;
    run->forward = forward;
    run->model = model;
    run->best_accuracy = -1.0;
    run->best_epoch = -1;
    run->t_start = now_s();
    /* train_loader = DataLoader(train, batch_size, shuffle=True, generator=seeded) */
    run->train = ct_dataloader_new(data->train_x, data->train_y, cfg->batch_size, true, false,
                                   cfg->seed);
    run->test = ct_dataloader_new(data->test_x, data->test_y, 1000, false, false, 0);
    run->loss_sum = ct_tensor_zeros(CT_NONE, CT_F32, cfg->device);
    run->epoch_loss_sum = ct_tensor_zeros(CT_NONE, CT_F32, cfg->device);
    /* scaler = torch.amp.GradScaler(enabled=amp == torch.float16) */
    run->scaler = ct_grad_scaler_new(cfg->device, 65536.0, 2.0, 0.5, 2000, cfg->amp == CT_F16);
    if (!run->train || !run->test || !run->loss_sum || !run->epoch_loss_sum || !run->scaler) {
        fprintf(stderr, "starting the run: %s\n", ct_last_error());
        run->failed = true;
        return false;
    }
    /* sampler = DistributedSampler(train, num_replicas, rank, seed=seed) */
    if (cfg->ddp &&
        ct_dataloader_shard(run->train, ct_dist_rank(), ct_dist_world_size()) != CT_OK) {
        fprintf(stderr, "sharding the data: %s\n", ct_last_error());
        run->failed = true;
        return false;
    }
    run->steps_per_epoch = ct_dataloader_num_batches(run->train);
    if (cfg->resume && !restore_checkpoint(run)) {
        run->failed = true;
        return false;
    }
    run->first_step = run->step;
    g_sigint = 0;
    install_sigint();
    print_header(run);
    run->t_print = run->t_epoch_start = now_s();
    return true;
}

static void fail(fashion_run *run, const char *what) {
    fprintf(stderr, "%s failed at epoch %" PRId64 ", step %" PRId64 ": %s\n", what,
            run->epoch + 1, run->step, ct_last_error());
    run->failed = true;
}

bool fashion_next_batch(fashion_run *run, ct_tensor **x, ct_tensor **y) {
    *x = *y = NULL;
    if (run->scope) ct_scope_end(run->scope);
    run->scope = NULL;
    if (g_sigint) run->interrupted = true;
    if (run->failed || run->interrupted) return false;
    run->scope = ct_scope_begin();
    ct_tensor *cx, *cy;
    if (!ct_dataloader_next(run->train, &cx, &cy)) {
        if (ct_dataloader_status(run->train) != CT_OK) fail(run, "the data loader");
        ct_scope_end(run->scope);
        run->scope = NULL;
        return false;
    }
    /* x, y = x.to(device), y.to(device) */
    *x = ct_to_device(cx, run->cfg->device);
    *y = *x ? ct_to_device(cy, run->cfg->device) : NULL;
    if (!*x || !*y) {
        fail(run, "copying the batch to the device");
        return false;
    }
    return true;
}

/* ---- --cuda-graph ------------------------------------------------------------------------ */

void fashion_autocast_begin(const fashion_run *run) {
    if (run->cfg->amp != CT_F32) ct_autocast_begin(run->cfg->device, run->cfg->amp);
}

void fashion_autocast_end(const fashion_run *run) {
    if (run->cfg->amp != CT_F32) ct_autocast_end();
}

/* The training step the graph records, as the examples' loops run it. */
static ct_tensor *train_step(fashion_run *run, ct_tensor *x, ct_tensor *y) {
    ct_optim_zero_grad(run->opt);
    fashion_autocast_begin(run);
    ct_tensor *loss = ct_cross_entropy(run->forward(run->model, x), y, NULL, CT_REDUCTION_MEAN,
                                       -100, 0.0);
    fashion_autocast_end(run);
    bool ok = loss && ct_backward(ct_grad_scaler_scale(run->scaler, loss), NULL, false) == CT_OK &&
              ct_grad_scaler_step(run->scaler, run->opt) == CT_OK &&
              ct_grad_scaler_update(run->scaler) == CT_OK;
    return ok ? loss : NULL;
}

/* The batch into the graph's static inputs. A smaller batch (the epoch's
 * last) fills the first rows; the rest get zero images and the target -100,
 * which the loss ignores, so the mean loss and the gradients are the
 * batch's own. */
static bool graph_inputs(fashion_run *run, ct_tensor *x, ct_tensor *y) {
    int64_t b = ct_tensor_size(x, 0), full = run->cfg->batch_size;
    if (b == full) return ct_copy_(run->graph_x, x) == CT_OK && ct_copy_(run->graph_y, y) == CT_OK;
    ct_scope *s = ct_scope_begin();
    ct_tensor *xs = ct_narrow(run->graph_x, 0, 0, b), *xr = ct_narrow(run->graph_x, 0, b, full - b);
    ct_tensor *ys = ct_narrow(run->graph_y, 0, 0, b), *yr = ct_narrow(run->graph_y, 0, b, full - b);
    bool ok = xs && xr && ys && yr && ct_copy_(xs, x) == CT_OK && ct_fill_(xr, 0.0) == CT_OK &&
              ct_copy_(ys, y) == CT_OK && ct_fill_(yr, -100.0) == CT_OK;
    ct_scope_end(s);
    return ok;
}

/* Records the step into run->graph; the step's temporaries of the warmup
 * are back in the allocator's cache, where the capture takes its memory. */
static bool graph_capture(fashion_run *run) {
    run->graph = ct_cuda_graph_capture_begin(run->cfg->device.index);
    if (!run->graph) {
        ct_cuda_conv_direct_limit(run->conv_direct_limit);
        return false;
    }
    ct_scope *s = ct_scope_begin();
    ct_tensor *loss = train_step(run, run->graph_x, run->graph_y);
    /* out of the capture's scope and of the step's: the run's own */
    run->graph_loss = loss ? ct_keep(ct_keep(loss)) : NULL;
    ct_scope_end(s);
    ct_status st = ct_cuda_graph_capture_end(run->graph);
    ct_cuda_conv_direct_limit(run->conv_direct_limit);
    return loss && st == CT_OK;
}

ct_tensor *fashion_graph_step(fashion_run *run, ct_tensor *x, ct_tensor *y) {
    const fashion_config *cfg = run->cfg;
    if (!run->graph_x) {
        /* The first step: the static inputs, then an eager step on them.
         * The warmup and the capture run every convolution on cuDNN: its
         * kernels are faster on the device, and a replay has no host time
         * for the direct kernels to save. */
        run->conv_direct_limit = ct_cuda_conv_direct_limit(0);
        ct_tensor *gx = ct_tensor_zeros(CT_SHAPE(cfg->batch_size, 1, 28, 28), CT_F32, cfg->device);
        ct_tensor *gy = ct_tensor_zeros(CT_SHAPE(cfg->batch_size), CT_I64, cfg->device);
        run->graph_x = gx ? ct_keep(gx) : NULL; /* the run's, not the step's scope's */
        run->graph_y = gy ? ct_keep(gy) : NULL;
        if (!gx || !gy) return NULL;
        return graph_inputs(run, x, y) ? train_step(run, run->graph_x, run->graph_y) : NULL;
    }
    if (!graph_inputs(run, x, y)) return NULL;
    if (!run->graph && !graph_capture(run)) return NULL;
    return ct_cuda_graph_replay(run->graph) == CT_OK ? run->graph_loss : NULL;
}

double fashion_lr(const fashion_run *run) {
    int64_t total = run->cfg->epochs * run->steps_per_epoch;
    return ct_lr_cosine_warmup(run->cfg->lr, 0, total > 0 ? total : 1, 0.0, run->step);
}

static void print_progress(fashion_run *run) {
    const fashion_config *cfg = run->cfg;
    double sum = 0;
    if (ct_tensor_item(run->loss_sum, &sum) != CT_OK || ct_zero_(run->loss_sum) != CT_OK) {
        fail(run, "reading the loss");
        return;
    }
    double t = now_s(); /* after item(), which waited for the device */
    double dt = t - run->t_print;
    int64_t done = run->step - run->first_step, total = cfg->epochs * run->steps_per_epoch;
    double train_time = t - run->t_start - run->eval_seconds; /* this process's */
    double eta = done > 0 ? train_time / (double)done * (double)(total - run->step) : 0;
    char eta_s[32];
    printf("epoch %" PRId64 "/%" PRId64 "  step %*" PRId64 "/%" PRId64
           "  loss %.4f  lr %.2e  %6.0f samples/s  ETA %s\n",
           run->epoch + 1, cfg->epochs, run->steps_per_epoch >= 1000 ? 4 : 3,
           run->step - run->epoch * run->steps_per_epoch, run->steps_per_epoch,
           sum / (double)run->since_print, fashion_lr(run),
           dt > 0 ? (double)(run->since_print * cfg->batch_size * ct_dist_world_size()) / dt
                  : 0.0,
           fmt_duration(eta, eta_s, sizeof eta_s));
    fflush(stdout);
    run->since_print = 0;
    run->t_print = t;
}

void fashion_step_done(fashion_run *run, ct_tensor *loss, bool ok) {
    if (!loss || !ok) {
        fail(run, "the training step");
        return;
    }
    /* running_loss += loss.item(), without waiting for the device */
    bool prev = ct_no_grad_begin();
    ok = ct_add_(run->loss_sum, loss) == CT_OK && ct_add_(run->epoch_loss_sum, loss) == CT_OK;
    ct_no_grad_end(prev);
    if (!ok) {
        fail(run, "adding up the loss");
        return;
    }
    run->step++;
    run->since_print++;
    run->epoch_steps++;
    int64_t every = run->cfg->log_every;
    if (every > 0 ? run->step % every == 0 : now_s() - run->t_print >= 2.0) print_progress(run);
}

ct_status fashion_evaluate(fashion_forward_fn forward, void *model, ct_dataloader *loader,
                           ct_device device, double *accuracy, double *loss) {
    bool prev = ct_no_grad_begin(); /* with torch.no_grad(): */
    /* The sums stay on the device and are read once at the end, so the
     * batches queue without waiting for one another. */
    ct_tensor *loss_acc = ct_tensor_zeros(CT_NONE, CT_F64, device);
    ct_tensor *correct_acc = ct_tensor_zeros(CT_NONE, CT_F64, device);
    ct_status st = loss_acc && correct_acc ? CT_OK : ct_last_status();
    ct_tensor *cx, *cy;
    while (st == CT_OK) {
        ct_scope *s = ct_scope_begin();
        if (!ct_dataloader_next(loader, &cx, &cy)) {
            st = ct_dataloader_status(loader);
            ct_scope_end(s);
            break;
        }
        ct_tensor *x = ct_to_device(cx, device), *y = ct_to_device(cy, device);
        ct_tensor *logits = x && y ? forward(model, x) : NULL;
        /* loss_sum += F.cross_entropy(logits, y, reduction="sum")
         * correct += (logits.argmax(1) == y).sum() */
        ct_tensor *l = ct_cross_entropy(logits, y, NULL, CT_REDUCTION_SUM, -100, 0.0);
        ct_tensor *c = ct_sum(ct_eq(ct_argmax(logits, 1, false), y), CT_NONE, false);
        if (!l || !c || ct_add_(loss_acc, l) != CT_OK || ct_add_(correct_acc, c) != CT_OK)
            st = ct_last_status();
        ct_scope_end(s);
    }
    double loss_sum = 0, correct = 0;
    if (st == CT_OK && (ct_tensor_item(loss_acc, &loss_sum) != CT_OK ||
                        ct_tensor_item(correct_acc, &correct) != CT_OK))
        st = ct_last_status();
    ct_tensor_release(loss_acc);
    ct_tensor_release(correct_acc);
    ct_no_grad_end(prev);
    if (st == CT_OK) st = ct_dataloader_reset(loader);
    int64_t n = ct_dataloader_num_samples(loader);
    *accuracy = n > 0 ? correct / (double)n : 0.0;
    *loss = n > 0 ? loss_sum / (double)n : 0.0;
    return st;
}

bool fashion_end_epoch(fashion_run *run) {
    const fashion_config *cfg = run->cfg;
    if (run->scope) ct_scope_end(run->scope);
    run->scope = NULL;
    if (run->failed) return false;
    sync_device(cfg->device);
    double t = now_s(), epoch_time = t - run->t_epoch_start;
    run->train_seconds += t - run->t_epoch_start;
    if (run->interrupted) {
        if (cfg->checkpoint && save_checkpoint(run))
            printf("checkpoint saved to %s at epoch %" PRId64 ", step %" PRId64
                   "; continue with --resume\n",
                   cfg->checkpoint, run->epoch + 1, run->step);
        return false;
    }
    double train_loss = 0;
    if (ct_tensor_item(run->epoch_loss_sum, &train_loss) != CT_OK) {
        fail(run, "reading the loss");
        return false;
    }
    double acc, test_loss;
    fashion_autocast_begin(run); /* evaluated in the precision it trains in */
    ct_status est =
        fashion_evaluate(run->forward, run->model, run->test, cfg->device, &acc, &test_loss);
    fashion_autocast_end(run);
    if (est != CT_OK) {
        fail(run, "evaluation");
        return false;
    }
    double eval_time = now_s() - t;
    run->eval_seconds += eval_time;
    int64_t samples = ct_dataloader_num_samples(run->train);
    if (acc > run->best_accuracy) {
        run->best_accuracy = acc;
        run->best_epoch = run->epoch;
    }
    printf("epoch %" PRId64 "/%" PRId64 " done: train loss %.6f  test loss %.6f  "
           "test accuracy %.2f%%  (train %.1f s, %.0f samples/s; test %.1f s)\n",
           run->epoch + 1, cfg->epochs,
           run->epoch_steps ? train_loss / (double)run->epoch_steps : 0.0, test_loss,
           100.0 * acc, epoch_time, epoch_time > 0 ? (double)samples / epoch_time : 0.0,
           eval_time);
    fflush(stdout);
    /* the next epoch */
    run->epoch++;
    run->epoch_steps = 0;
    run->since_print = 0;
    if (ct_zero_(run->epoch_loss_sum) != CT_OK || ct_zero_(run->loss_sum) != CT_OK ||
        ct_dataloader_reset(run->train) != CT_OK) {
        fail(run, "starting the next epoch");
        return false;
    }
    if (cfg->checkpoint && !save_checkpoint(run)) {
        run->failed = true;
        return false;
    }
    double t_next = now_s();
    run->eval_seconds += t_next - t - eval_time; /* the checkpoint's time too */
    run->t_print = run->t_epoch_start = t_next;
    return true;
}

int fashion_finish(fashion_run *run) {
    if (run->scope) ct_scope_end(run->scope);
    run->scope = NULL;
    remove_sigint();
    char total[32], train[32];
    fmt_duration(now_s() - run->t_start, total, sizeof total);
    fmt_duration(run->train_seconds, train, sizeof train);
    if (!run->failed && run->best_epoch >= 0)
        printf("best test accuracy %.2f%% (epoch %" PRId64 "), total time %s "
               "(training %s over all runs)\n",
               100.0 * run->best_accuracy, run->best_epoch + 1, total, train);
    else if (!run->failed)
        printf("no epoch finished, total time %s\n", total);
    fflush(stdout);
    ct_dataloader_free(run->train);
    ct_dataloader_free(run->test);
    ct_tensor_release(run->loss_sum);
    ct_tensor_release(run->epoch_loss_sum);
    ct_cuda_graph_free(run->graph);
    ct_grad_scaler_free(run->scaler);
    ct_tensor_release(run->graph_x);
    ct_tensor_release(run->graph_y);
    ct_tensor_release(run->graph_loss);
    int rc = run->failed ? 1 : run->interrupted ? 130 : 0;
    if (run->cfg && run->cfg->ddp && ct_dist_finalize() != CT_OK) {
        fprintf(stderr, "ending the process group: %s\n", ct_last_error());
        rc = rc ? rc : 1;
    }
    memset(run, 0, sizeof *run);
    return rc;
}
