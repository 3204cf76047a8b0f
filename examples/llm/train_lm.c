/* Trains a LLaMA-style (or GPT-2) byte-level language model on the text of
 * Debian's fortunes package, or any text file, then samples from it.
 *
 *   cten-train-lm                       6 layers, width 384, context 256 on the CPU
 *   cten-train-lm --device cuda         the same on a GPU, bf16 autocast
 *   cten-train-lm --model gpt2 --data book.txt --steps 5000 --checkpoint run.st
 *
 * The loop is PyTorch's usual one (examples/reference/train_lm.py is its twin):
 * AdamW with weight decay on the 2-d weights only, linear warmup then cosine
 * decay, gradient clipping, gradient accumulation, validation every N steps,
 * checkpoints with the optimizer state and the data position, --resume,
 * Ctrl-C saves and exits. docs/LM.md describes the flags and the output.
 *
 * Data-parallel over the N processes of an MPI launch (docs/DISTRIBUTED.md):
 *
 *   mpirun -np N cten-train-lm --ddp [--device cuda] ...
 *
 * Each rank trains on its share of every step's windows (--batch-size per
 * rank), the gradients averaged during backward: N ranks take the steps one
 * process takes with N times the batch.
 *
 * On a GPU, --cuda-graph records the whole step (every micro-batch's forward
 * and backward, the clipping and the AdamW update) into a CUDA graph once
 * and replays it, each step's windows copied into the graph's inputs. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "data.h"
#include "model.h"

/* ---- settings -------------------------------------------------------------------------------- */

typedef struct settings {
    lm_config model;
    ct_device device;
    ct_dtype amp; /* CT_BF16: autocast the forward; CT_F32: off */
    bool amp_given;
    const char *data;
    double val_fraction;
    int64_t batch, accum, steps, warmup, stop_after;
    double lr, min_lr, weight_decay, beta1, beta2, eps, clip;
    uint64_t seed;
    int64_t log_every, val_every, val_batches, save_every;
    const char *checkpoint;
    bool resume, steps_given;
    int64_t sample_tokens, top_k;
    double temperature;
    const char *prompt;
    const char *compare; /* directory for --compare, or NULL */
    bool ddp;            /* --ddp: data-parallel over the ranks of an MPI launch */
    bool cuda_graph;     /* --cuda-graph: replay the step from a CUDA graph */
    bool recompute;      /* --recompute: the MLP's activation made again in the backward */
    bool act_ckpt;       /* --activation-checkpointing: each block made again in the backward */
} settings;

static settings defaults(void) {
    settings s = {0};
    s.model = lm_config_default(LM_LLAMA);
    s.device = CT_CPU;
    s.amp = CT_F32;
    s.data = LM_FORTUNES_DIR;
    s.val_fraction = 0.1;
    s.batch = 16;
    s.accum = 1;
    s.steps = 2000;
    s.warmup = 100;
    s.lr = 1e-3;
    s.min_lr = -1; /* lr / 10 */
    s.weight_decay = 0.1;
    s.beta1 = 0.9;
    s.beta2 = 0.95;
    s.eps = 1e-8;
    s.clip = 1.0;
    s.seed = 1337;
    s.log_every = 10;
    s.val_every = 250;
    s.val_batches = 20;
    s.sample_tokens = 300;
    s.top_k = 40;
    s.temperature = 0.8;
    s.prompt = "The ";
    return s;
}

static void usage(const char *prog) {
    settings d = defaults();
    printf("usage: %s [options]\n"
           "Trains a byte-level language model and samples text from it.\n"
           "model:\n"
           "  --model llama|gpt2   llama: RMSNorm, RoPE, grouped-query attention, SwiGLU;\n"
           "                       gpt2: LayerNorm, learned positions, GELU (default llama)\n"
           "  --layers N --width N --heads N --kv-heads N --ffn N --context N\n"
           "                       (defaults %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
           " (llama), width*8/3 or width*4, %" PRId64 ")\n"
           "data:\n"
           "  --data PATH          a text file, or a directory of them (default %s)\n"
           "  --val-fraction X     the text's last part kept for validation (default %g)\n"
           "training:\n"
           "  --device cpu|cuda[:N]  (default cpu)\n"
           "  --amp bf16|off       autocast the forward to bfloat16 (default: bf16 on a GPU)\n"
           "  --batch-size N       sequences per micro-batch (default %" PRId64 ")\n"
           "  --grad-accum N       micro-batches per optimizer step (default 1)\n"
           "  --steps N            optimizer steps (default %" PRId64 ")\n"
           "  --lr X --min-lr X    peak and final learning rate (default %g, lr/10)\n"
           "  --warmup N           linear warmup steps (default %" PRId64 ")\n"
           "  --weight-decay X     AdamW's, on the 2-d weights only (default %g)\n"
           "  --clip X             gradient norm clipping (default %g)\n"
           "  --seed N             initialisation, data and sampling seed (default %" PRIu64 ")\n"
           "  --log-every N        a progress line every N steps (default %" PRId64 ")\n"
           "  --val-every N        validation loss every N steps, 0: only at the end (default %"
           PRId64 ")\n"
           "  --val-batches N      batches of the validation loss (default %" PRId64 ")\n"
           "checkpoints:\n"
           "  --checkpoint PATH    safetensors checkpoint, written at the end, on Ctrl-C and\n"
           "                       every --save-every N steps\n"
           "  --resume             continue from the checkpoint (its model and settings;\n"
           "                       --steps may change)\n"
           "  --stop-after N       stop (and save) after N steps of this run\n"
           "sampling:\n"
           "  --sample N           tokens to sample at the end, 0: none (default %" PRId64 ")\n"
           "  --prompt TEXT --temperature X --top-k N   (default \"%s\", %g, %" PRId64 ")\n"
           "  --compare DIR        write the initial weights, the batches and the losses to DIR\n"
           "                       for examples/reference/train_lm.py --compare DIR\n"
           "  --ddp                data-parallel over the processes of an MPI launch (mpirun -np N):\n"
           "                       --batch-size per rank, rank 0 prints, saves and samples\n"
           "  --cuda-graph         on a GPU: record the step into a CUDA graph once and replay\n"
           "                       it (the progress line then has no gradient norm)\n"
           "  --recompute          recompute GELU's (SwiGLU's) output in the backward instead\n"
           "                       of keeping it: less memory, the same gradients\n"
           "  --activation-checkpointing  keep only each block's input for the backward and\n"
           "                       run the block again there: far less memory, a third more\n"
           "                       compute, the same gradients\n",
           prog, d.model.n_layer, d.model.n_embd, d.model.n_head, d.model.n_kv_head,
           d.model.context, LM_FORTUNES_DIR, d.val_fraction, d.batch, d.steps, d.lr, d.warmup,
           d.weight_decay, d.clip, d.seed, d.log_every, d.val_every, d.val_batches,
           d.sample_tokens, d.prompt, d.temperature, d.top_k);
}

static bool parse_i64(const char *s, int64_t min, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < min) return false;
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
    int64_t index = 0;
    if (!strcmp(s, "cpu")) {
        *out = CT_CPU;
        return true;
    }
    if (strncmp(s, "cuda", 4) || (s[4] && (s[4] != ':' || !parse_i64(s + 5, 0, &index))))
        return false;
    *out = CT_CUDA((int)index);
    return true;
}

/* 0: go on; 1: exit 0 (--help); -1: a bad command line (printed). */
static int parse_args(int argc, char **argv, settings *s) {
    bool kv_given = false, ffn_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(argv[0]);
            return 1;
        }
        if (!strcmp(a, "--resume")) {
            s->resume = true;
            continue;
        }
        if (!strcmp(a, "--ddp")) {
            s->ddp = true;
            continue;
        }
        if (!strcmp(a, "--cuda-graph")) {
            s->cuda_graph = true;
            continue;
        }
        if (!strcmp(a, "--recompute")) {
            s->recompute = true;
            continue;
        }
        if (!strcmp(a, "--activation-checkpointing")) {
            s->act_ckpt = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value (see --help)\n", argv[0], a);
            return -1;
        }
        const char *v = argv[++i];
        lm_config *m = &s->model;
        bool ok = true;
        if (!strcmp(a, "--model")) {
            ok = !strcmp(v, "llama") || !strcmp(v, "gpt2");
            m->family = !strcmp(v, "gpt2") ? LM_GPT2 : LM_LLAMA;
        } else if (!strcmp(a, "--layers")) ok = parse_i64(v, 1, &m->n_layer);
        else if (!strcmp(a, "--width")) ok = parse_i64(v, 1, &m->n_embd);
        else if (!strcmp(a, "--heads")) ok = parse_i64(v, 1, &m->n_head);
        else if (!strcmp(a, "--kv-heads")) ok = kv_given = parse_i64(v, 1, &m->n_kv_head);
        else if (!strcmp(a, "--ffn")) ok = ffn_given = parse_i64(v, 1, &m->ffn_hidden);
        else if (!strcmp(a, "--context")) ok = parse_i64(v, 1, &m->context);
        else if (!strcmp(a, "--data")) s->data = v;
        else if (!strcmp(a, "--val-fraction")) ok = parse_f64(v, 0, &s->val_fraction);
        else if (!strcmp(a, "--device")) ok = parse_device(v, &s->device);
        else if (!strcmp(a, "--amp")) {
            ok = !strcmp(v, "bf16") || !strcmp(v, "off");
            s->amp = !strcmp(v, "bf16") ? CT_BF16 : CT_F32;
            s->amp_given = true;
        } else if (!strcmp(a, "--batch-size")) ok = parse_i64(v, 1, &s->batch);
        else if (!strcmp(a, "--grad-accum")) ok = parse_i64(v, 1, &s->accum);
        else if (!strcmp(a, "--steps")) ok = s->steps_given = parse_i64(v, 1, &s->steps);
        else if (!strcmp(a, "--lr")) ok = parse_f64(v, 0, &s->lr);
        else if (!strcmp(a, "--min-lr")) ok = parse_f64(v, 0, &s->min_lr);
        else if (!strcmp(a, "--warmup")) ok = parse_i64(v, 0, &s->warmup);
        else if (!strcmp(a, "--weight-decay")) ok = parse_f64(v, 0, &s->weight_decay);
        else if (!strcmp(a, "--clip")) ok = parse_f64(v, 1e-12, &s->clip);
        else if (!strcmp(a, "--seed")) {
            int64_t seed;
            ok = parse_i64(v, 0, &seed);
            s->seed = (uint64_t)seed;
        } else if (!strcmp(a, "--log-every")) ok = parse_i64(v, 1, &s->log_every);
        else if (!strcmp(a, "--val-every")) ok = parse_i64(v, 0, &s->val_every);
        else if (!strcmp(a, "--val-batches")) ok = parse_i64(v, 1, &s->val_batches);
        else if (!strcmp(a, "--save-every")) ok = parse_i64(v, 0, &s->save_every);
        else if (!strcmp(a, "--checkpoint")) s->checkpoint = v;
        else if (!strcmp(a, "--stop-after")) ok = parse_i64(v, 1, &s->stop_after);
        else if (!strcmp(a, "--sample")) ok = parse_i64(v, 0, &s->sample_tokens);
        else if (!strcmp(a, "--prompt")) s->prompt = v;
        else if (!strcmp(a, "--temperature")) ok = parse_f64(v, 1e-6, &s->temperature);
        else if (!strcmp(a, "--top-k")) ok = parse_i64(v, 0, &s->top_k);
        else if (!strcmp(a, "--compare")) s->compare = v;
        else {
            fprintf(stderr, "%s: unknown option %s (see --help)\n", argv[0], a);
            return -1;
        }
        if (!ok) {
            fprintf(stderr, "%s: bad value '%s' for %s (see --help)\n", argv[0], v, a);
            return -1;
        }
    }
    lm_config *m = &s->model;
    /* llama's default: a third of the heads as key/value heads, when that divides */
    if (!kv_given) {
        m->n_kv_head = m->n_head / 3;
        if (m->family == LM_GPT2 || m->n_kv_head < 1 || m->n_head % m->n_kv_head)
            m->n_kv_head = m->n_head;
    }
    if (!ffn_given) m->ffn_hidden = 0;
    if (!s->amp_given && s->device.type == CT_DEVICE_CUDA) s->amp = CT_BF16;
    if (s->min_lr < 0) s->min_lr = s->lr / 10;
    if (s->resume && !s->checkpoint) {
        fprintf(stderr, "%s: --resume needs --checkpoint PATH\n", argv[0]);
        return -1;
    }
    if (s->ddp && s->compare) {
        fprintf(stderr, "%s: --compare runs one process; leave out --ddp\n", argv[0]);
        return -1;
    }
    if (s->cuda_graph && s->device.type != CT_DEVICE_CUDA) {
        fprintf(stderr, "%s: --cuda-graph needs --device cuda\n", argv[0]);
        return -1;
    }
    if (s->cuda_graph && s->ddp) {
        fprintf(stderr, "%s: --cuda-graph runs one process; leave out --ddp\n", argv[0]);
        return -1;
    }
    return 0;
}

/* ---- checkpoint metadata: the model and the run's settings ---------------------------------- */

static bool put_settings(ct_metadata *md, const settings *s) {
    const lm_config *m = &s->model;
    return !ct_metadata_set(md, "format", "cten-lm-1") &&
           !ct_metadata_set(md, "model", lm_family_name(m->family)) &&
           !ct_metadata_set_int(md, "n_layer", m->n_layer) &&
           !ct_metadata_set_int(md, "n_embd", m->n_embd) &&
           !ct_metadata_set_int(md, "n_head", m->n_head) &&
           !ct_metadata_set_int(md, "n_kv_head", m->n_kv_head) &&
           !ct_metadata_set_int(md, "ffn_hidden", m->ffn_hidden) &&
           !ct_metadata_set_int(md, "context", m->context) &&
           !ct_metadata_set_int(md, "vocab", m->vocab) &&
           !ct_metadata_set_double(md, "norm_eps", m->norm_eps) &&
           !ct_metadata_set_double(md, "rope_base", m->rope_base) &&
           !ct_metadata_set_int(md, "batch_size", s->batch) &&
           !ct_metadata_set_int(md, "grad_accum", s->accum) &&
           !ct_metadata_set_int(md, "steps", s->steps) &&
           !ct_metadata_set_int(md, "warmup", s->warmup) &&
           !ct_metadata_set_double(md, "lr", s->lr) &&
           !ct_metadata_set_double(md, "min_lr", s->min_lr) &&
           !ct_metadata_set_double(md, "weight_decay", s->weight_decay) &&
           !ct_metadata_set_double(md, "beta1", s->beta1) &&
           !ct_metadata_set_double(md, "beta2", s->beta2) &&
           !ct_metadata_set_double(md, "eps", s->eps) &&
           !ct_metadata_set_double(md, "clip", s->clip) &&
           !ct_metadata_set_double(md, "val_fraction", s->val_fraction) &&
           !ct_metadata_set_uint(md, "seed", s->seed) &&
           !ct_metadata_set(md, "amp", s->amp == CT_BF16 ? "bf16" : "off");
}

static bool get_settings(const ct_metadata *md, settings *s) {
    lm_config *m = &s->model;
    const char *fmt = ct_metadata_get(md, "format"), *fam = ct_metadata_get(md, "model");
    int64_t steps = s->steps;
    bool ok = fmt && !strcmp(fmt, "cten-lm-1") && fam &&
              !ct_metadata_get_int(md, "n_layer", &m->n_layer) &&
              !ct_metadata_get_int(md, "n_embd", &m->n_embd) &&
              !ct_metadata_get_int(md, "n_head", &m->n_head) &&
              !ct_metadata_get_int(md, "n_kv_head", &m->n_kv_head) &&
              !ct_metadata_get_int(md, "ffn_hidden", &m->ffn_hidden) &&
              !ct_metadata_get_int(md, "context", &m->context) &&
              !ct_metadata_get_int(md, "vocab", &m->vocab) &&
              !ct_metadata_get_double(md, "norm_eps", &m->norm_eps) &&
              !ct_metadata_get_double(md, "rope_base", &m->rope_base) &&
              !ct_metadata_get_int(md, "batch_size", &s->batch) &&
              !ct_metadata_get_int(md, "grad_accum", &s->accum) &&
              !ct_metadata_get_int(md, "steps", &s->steps) &&
              !ct_metadata_get_int(md, "warmup", &s->warmup) &&
              !ct_metadata_get_double(md, "lr", &s->lr) &&
              !ct_metadata_get_double(md, "min_lr", &s->min_lr) &&
              !ct_metadata_get_double(md, "weight_decay", &s->weight_decay) &&
              !ct_metadata_get_double(md, "beta1", &s->beta1) &&
              !ct_metadata_get_double(md, "beta2", &s->beta2) &&
              !ct_metadata_get_double(md, "eps", &s->eps) &&
              !ct_metadata_get_double(md, "clip", &s->clip) &&
              !ct_metadata_get_double(md, "val_fraction", &s->val_fraction) &&
              !ct_metadata_get_uint(md, "seed", &s->seed);
    m->family = fam && !strcmp(fam, "gpt2") ? LM_GPT2 : LM_LLAMA;
    if (s->steps_given) s->steps = steps; /* a resumed run may train longer */
    return ok;
}

/* ---- Ctrl-C ---------------------------------------------------------------------------------- */

static volatile sig_atomic_t g_stop;

static void on_sigint(int sig) {
    (void)sig;
    g_stop = 1;
    static const char msg[] = "\ninterrupted: saving after this step (Ctrl-C again quits)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
}

/* ---- the run --------------------------------------------------------------------------------- */

typedef struct run {
    settings s;
    lm_model *model;
    ct_optimizer *opt;
    lm_text text, train, val;
    ct_generator *data_gen; /* the training windows: its offset is the data position */
    int64_t step;           /* optimizer steps done */
    ct_tensor *loss_sum;    /* the losses since the last progress line, on the device */
    int64_t *starts;        /* a micro-batch's window starts, every rank's */
    ct_ddp *ddp;            /* --ddp */
    bool stop;              /* --ddp: a rank was interrupted (agreed at the progress lines) */
    int rank, world;        /* 0 and 1 without --ddp */
    int64_t *compare_x;     /* --compare: every step's windows, [steps, accum, batch] */
    /* --cuda-graph: the step's inputs and targets [accum, batch, context] on
     * the device, and the graph, captured at the second step */
    ct_tensor *graph_x, *graph_y;
    ct_cuda_graph *graph;
    bool graph_warm; /* the first step ran eagerly on graph_x, graph_y */
} run;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Peak memory in GiB: the device allocator's peak on a GPU, the process's
 * peak resident size on the CPU. */
static double peak_gib(ct_device d) {
    if (d.type == CT_DEVICE_CUDA) {
        ct_cuda_memstats st;
        return ct_cuda_memory_stats(d.index, &st) == CT_OK ? (double)st.peak_allocated / 1073741824.0
                                                           : 0.0;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1048576.0; /* KiB */
}

static double lr_at(const settings *s, int64_t step) {
    /* step + 1: the first step already trains at lr / warmup, as llm.c's */
    int64_t warmup = s->warmup < s->steps ? s->warmup : s->steps;
    return ct_lr_cosine_warmup(s->lr, warmup, s->steps, s->min_lr, step + 1);
}

static void autocast_begin(const settings *s) {
    if (s->amp != CT_F32) ct_autocast_begin(s->device, s->amp);
}

static void autocast_end(const settings *s) {
    if (s->amp != CT_F32) ct_autocast_end();
}

/* Micro-batch micro's windows (every rank draws every rank's and takes its
 * own: the batches of one process with world times the batch size) as
 * inputs and targets on the device; recorded for --compare. */
static bool next_batch(run *r, int64_t micro, ct_tensor **x, ct_tensor **y) {
    const settings *s = &r->s;
    lm_draw_starts(&r->train, s->model.context, s->batch * r->world, r->data_gen, r->starts);
    const int64_t *mine = r->starts + (int64_t)r->rank * s->batch;
    if (r->compare_x)
        memcpy(r->compare_x + (r->step * s->accum + micro) * s->batch, mine,
               (size_t)s->batch * sizeof *r->starts);
    return lm_batch_at(&r->train, mine, s->batch, s->model.context, s->device, x, y);
}

/* Forward and backward of micro-batch micro of accum:
 *   with autocast: loss = model(x, y) / accum
 *   loss.backward()
 * its loss added to r->loss_sum on the device. */
static bool micro_step(run *r, int64_t micro, ct_tensor *x, ct_tensor *y) {
    const settings *s = &r->s;
    bool prev = ct_set_recompute_enabled(s->recompute);
    autocast_begin(s);
    ct_tensor *loss = lm_model_loss(r->model, x, y);
    autocast_end(s);
    ct_set_recompute_enabled(prev);
    ct_tensor *scaled = ct_div_scalar(loss, (double)s->accum);
    prev = ct_no_grad_begin();
    bool ok = scaled && ct_add_(r->loss_sum, scaled) == CT_OK;
    ct_no_grad_end(prev);
    if (!ok) return false;
    if (r->ddp) {
        /* model.no_sync() but for the last micro-batch: one all-reduce of
         * the accumulated gradients per step */
        ct_ddp_set_sync(r->ddp, micro == s->accum - 1);
        return ct_ddp_backward(r->ddp, scaled, NULL) == CT_OK;
    }
    return ct_backward(scaled, NULL, false) == CT_OK;
}

/* clip_grad_norm_(params, clip); opt.step(); opt.zero_grad() */
static bool update(run *r, double *grad_norm) {
    return ct_clip_grad_norm(r->model->params, r->s.clip, grad_norm) == CT_OK &&
           (r->ddp ? ct_ddp_step(r->ddp, r->opt) : ct_optim_step(r->opt)) == CT_OK &&
           (ct_optim_zero_grad(r->opt), true);
}

/* One optimizer step over accum micro-batches. */
static bool train_step(run *r, double *grad_norm) {
    for (int64_t micro = 0; micro < r->s.accum; micro++) {
        ct_scope *scope = ct_scope_begin();
        ct_tensor *x, *y;
        bool ok = next_batch(r, micro, &x, &y) && micro_step(r, micro, x, y);
        ct_scope_end(scope);
        if (!ok) return false;
    }
    return ct_optim_set_lr(r->opt, lr_at(&r->s, r->step)) == CT_OK && update(r, grad_norm);
}

/* The step's micro-batches on the graph's inputs, then the update (no norm
 * read back: the host cannot wait inside a capture). */
static bool graph_body(run *r, double *grad_norm) {
    for (int64_t micro = 0; micro < r->s.accum; micro++) {
        ct_scope *scope = ct_scope_begin();
        bool ok = micro_step(r, micro, ct_select(r->graph_x, 0, micro),
                             ct_select(r->graph_y, 0, micro));
        ct_scope_end(scope);
        if (!ok) return false;
    }
    return update(r, grad_norm);
}

/* --cuda-graph: the step's windows into the graph's inputs; the first step
 * runs eagerly on them (it fills the allocator's cache the capture draws on,
 * and makes the first uses a capture refuses: cuBLAS handles, cuDNN plans),
 * the second is captured, and every step replays the graph. The learning
 * rate is the optimizer's device copy, set before the replay. */
static bool graph_step(run *r, double *grad_norm) {
    const settings *s = &r->s;
    int64_t shape[3] = {s->accum, s->batch, s->model.context};
    if (!r->graph_x) {
        ct_tensor *gx = ct_tensor_zeros(3, shape, CT_I64, s->device);
        ct_tensor *gy = ct_tensor_zeros(3, shape, CT_I64, s->device);
        r->graph_x = gx ? ct_keep(gx) : NULL; /* the run's (run_free releases them) */
        r->graph_y = gy ? ct_keep(gy) : NULL;
        if (!r->graph_x || !r->graph_y) return false;
    }
    for (int64_t micro = 0; micro < s->accum; micro++) {
        ct_scope *scope = ct_scope_begin();
        ct_tensor *x, *y;
        bool ok = next_batch(r, micro, &x, &y) &&
                  ct_copy_(ct_select(r->graph_x, 0, micro), x) == CT_OK &&
                  ct_copy_(ct_select(r->graph_y, 0, micro), y) == CT_OK;
        ct_scope_end(scope);
        if (!ok) return false;
    }
    if (ct_optim_set_lr(r->opt, lr_at(s, r->step)) != CT_OK) return false;
    if (!r->graph_warm) {
        r->graph_warm = true;
        return graph_body(r, grad_norm);
    }
    if (!r->graph) {
        r->graph = ct_cuda_graph_capture_begin(s->device.index);
        if (!r->graph) return false;
        bool ok = graph_body(r, NULL);
        ct_status st = ct_cuda_graph_capture_end(r->graph);
        if (!ok || st != CT_OK) return false;
    }
    return ct_cuda_graph_replay(r->graph) == CT_OK;
}

/* The mean loss over the validation text's first val_batches batches of
 * windows, the same windows at every evaluation (a generator of their own). */
static bool evaluate(run *r, double *loss) {
    const settings *s = &r->s;
    ct_generator *g = ct_generator_new(s->seed ^ 0x5eed5eedULL);
    ct_tensor *sum = ct_tensor_zeros(CT_NONE, CT_F64, s->device);
    bool ok = g && sum;
    bool prev = ct_no_grad_begin();
    for (int64_t i = 0; ok && i < s->val_batches; i++) {
        ct_scope *scope = ct_scope_begin();
        ct_tensor *x, *y;
        lm_draw_starts(&r->val, s->model.context, s->batch, g, r->starts);
        ok = lm_batch_at(&r->val, r->starts, s->batch, s->model.context, s->device, &x, &y);
        autocast_begin(s);
        ct_tensor *l = ok ? lm_model_loss(r->model, x, y) : NULL;
        autocast_end(s);
        ok = l && ct_add_(sum, l) == CT_OK;
        ct_scope_end(scope);
    }
    ct_no_grad_end(prev);
    double total = 0;
    ok = ok && ct_tensor_item(sum, &total) == CT_OK;
    *loss = total / (double)s->val_batches;
    ct_tensor_release(sum);
    ct_generator_free(g);
    return ok;
}

static bool save_checkpoint(run *r) {
    if (r->rank != 0) return true; /* every rank holds the same state */
    ct_metadata *md = ct_metadata_new();
    bool ok = md && put_settings(md, &r->s) && !ct_metadata_set_int(md, "step", r->step) &&
              !ct_metadata_set_uint(md, "data_offset", ct_generator_offset(r->data_gen)) &&
              ct_checkpoint_save(r->s.checkpoint, r->model->params, r->opt, NULL, md) == CT_OK;
    if (!ok) fprintf(stderr, "saving the checkpoint %s: %s\n", r->s.checkpoint, ct_last_error());
    else printf("checkpoint %s saved at step %" PRId64 "\n", r->s.checkpoint, r->step);
    ct_metadata_free(md);
    return ok;
}

static bool restore_checkpoint(run *r) {
    ct_metadata *md = NULL;
    uint64_t offset = 0;
    bool ok = ct_checkpoint_load(r->s.checkpoint, r->model->params, r->opt, NULL, &md) == CT_OK &&
              !ct_metadata_get_int(md, "step", &r->step) &&
              !ct_metadata_get_uint(md, "data_offset", &offset);
    if (ok) ct_generator_set_offset(r->data_gen, offset);
    else fprintf(stderr, "--resume: %s: %s\n", r->s.checkpoint, ct_last_error());
    ct_metadata_free(md);
    return ok;
}

/* Prints the prompt and n sampled tokens: softmax(logits / temperature)
 * over the top_k most likely (0: all), from the last context tokens. */
static bool sample_text(run *r) {
    const settings *s = &r->s;
    int64_t np = (int64_t)strlen(s->prompt), n = np + s->sample_tokens;
    int64_t *seq = malloc((size_t)(n > 0 ? n : 1) * sizeof *seq);
    ct_generator *g = ct_generator_new(s->seed);
    if (!seq || !g || np == 0) {
        free(seq);
        ct_generator_free(g);
        fprintf(stderr, "sampling needs a non-empty --prompt\n");
        return false;
    }
    for (int64_t i = 0; i < np; i++) seq[i] = (uint8_t)s->prompt[i];
    printf("---- sample (temperature %g, top-k %" PRId64 ") ----\n%s", s->temperature, s->top_k,
           s->prompt);
    bool prev = ct_no_grad_begin(), ok = true;
    for (int64_t i = np; ok && i < n; i++) {
        ct_scope *scope = ct_scope_begin();
        int64_t t = i < s->model.context ? i : s->model.context, from = i - t;
        ct_tensor *x = ct_tensor_from_data_on(seq + from, CT_I64, CT_SHAPE(1, t), s->device);
        autocast_begin(s);
        ct_tensor *logits = x ? lm_model_last_logits(r->model, x) : NULL;
        autocast_end(s);
        logits = ct_div_scalar(ct_to_dtype(logits, CT_F32), s->temperature);
        ct_tensor *idx = NULL;
        if (s->top_k > 0 && s->top_k < s->model.vocab)
            logits = ct_topk(logits, s->top_k, -1, true, true, &idx);
        ct_tensor *pick = ct_multinomial(ct_softmax(logits, -1), 1, false, g);
        if (idx) pick = ct_gather(idx, -1, pick);
        double tok = 0;
        ok = pick && ct_tensor_item(pick, &tok) == CT_OK;
        seq[i] = (int64_t)tok;
        if (ok) putchar((int)seq[i]);
        ct_scope_end(scope);
    }
    ct_no_grad_end(prev);
    printf("\n----\n");
    if (!ok) fprintf(stderr, "sampling: %s\n", ct_last_error());
    free(seq);
    ct_generator_free(g);
    return ok;
}

/* --compare: the initial weights with the run's settings, for the twin. */
static bool compare_write_init(run *r) {
    char path[4096];
    snprintf(path, sizeof path, "%s/init.safetensors", r->s.compare);
    ct_metadata *md = ct_metadata_new();
    bool ok = md && put_settings(md, &r->s) &&
              ct_save_safetensors(path, r->model->params, md) == CT_OK;
    ct_metadata_free(md);
    if (!ok) fprintf(stderr, "--compare: writing %s: %s\n", path, ct_last_error());
    return ok;
}

/* --compare: the tokens of every micro-batch, "x" and "y" [steps, accum,
 * batch, context] int64, for the twin. */
static bool compare_write_batches(run *r) {
    const settings *s = &r->s;
    int64_t micro = r->step * s->accum, T = s->model.context;
    char path[4096];
    snprintf(path, sizeof path, "%s/batches.safetensors", s->compare);
    ct_scope *scope = ct_scope_begin();
    ct_tensor *x = NULL, *y = NULL;
    bool ok = lm_batch_at(&r->train, r->compare_x, micro * s->batch, T, CT_CPU, &x, &y);
    ct_params *p = ct_params_new();
    ok = ok && p && !ct_params_add(p, "x", ct_view(x, CT_SHAPE(r->step, s->accum, s->batch, T))) &&
         !ct_params_add(p, "y", ct_view(y, CT_SHAPE(r->step, s->accum, s->batch, T))) &&
         ct_save_safetensors(path, p, NULL) == CT_OK;
    ct_params_free(p);
    ct_scope_end(scope);
    if (!ok) fprintf(stderr, "--compare: writing %s: %s\n", path, ct_last_error());
    return ok;
}

static bool setup(run *r, int argc, char **argv, int *status) {
    settings *s = &r->s;
    *s = defaults();
    int pr = parse_args(argc, argv, s);
    *status = pr > 0 ? 0 : 2;
    if (pr) return false;
    *status = 1;
    r->world = 1;
    if (s->ddp) {
        if (ct_dist_init(NULL) != CT_OK) {
            fprintf(stderr, "--ddp: %s\n", ct_last_error());
            return false;
        }
        r->rank = ct_dist_rank();
        r->world = ct_dist_world_size();
        if (r->rank != 0 && !freopen("/dev/null", "w", stdout)) {
            fprintf(stderr, "--ddp: rank %d cannot silence its output\n", r->rank);
            return false;
        }
        /* one GPU per process on each machine: LOCAL_RANK's */
        if (s->device.type == CT_DEVICE_CUDA && ct_cuda_device_count() > 0)
            s->device.index = ct_dist_local_rank() % ct_cuda_device_count();
    }
    if (s->resume) {
        ct_metadata *md = ct_load_safetensors_metadata(s->checkpoint);
        bool ok = md && get_settings(md, s);
        if (!ok) fprintf(stderr, "--resume: %s is not a cten-train-lm checkpoint%s%s\n",
                         s->checkpoint, md ? "" : ": ", md ? "" : ct_last_error());
        ct_metadata_free(md);
        if (!ok) return false;
    }
    char why[256];
    if (!lm_config_check(&s->model, why, sizeof why)) {
        fprintf(stderr, "bad model configuration: %s\n", why);
        *status = 2;
        return false;
    }
    if (!lm_text_load(s->data, &r->text, why, sizeof why)) {
        fprintf(stderr, "%s\n%s", why,
                strcmp(s->data, LM_FORTUNES_DIR) ? ""
                                                 : "(the fortunes package installs the text; "
                                                   "--data PATH names another)\n");
        return false;
    }
    if (!lm_split(&r->text, s->val_fraction, s->model.context, &r->train, &r->val, why,
                  sizeof why)) {
        fprintf(stderr, "%s: %s\n", s->data, why);
        return false;
    }
    ct_generator *init = ct_generator_new(s->seed);
    r->model = init ? lm_model_new(&s->model, s->device, init) : NULL;
    if (r->model) r->model->checkpoint_blocks = s->act_ckpt;
    ct_generator_free(init);
    r->data_gen = ct_generator_new(s->seed + 1);
    r->starts = malloc((size_t)(s->batch * r->world) * sizeof *r->starts);
    r->loss_sum = ct_tensor_zeros(CT_NONE, CT_F32, s->device);
    if (!r->model || !r->data_gen || !r->starts || !r->loss_sum) {
        fprintf(stderr, "creating the model: %s\n", ct_last_error());
        return false;
    }
    /* model = DistributedDataParallel(model): rank 0's values everywhere */
    if (s->ddp && !(r->ddp = ct_ddp_new(r->model->params, NULL))) {
        fprintf(stderr, "--ddp: %s\n", ct_last_error());
        return false;
    }
    /* AdamW; weight decay on the matrices (and embeddings), not on norm gains and biases */
    r->opt = ct_optim_adamw_new(r->ddp ? ct_ddp_optim_params(r->ddp) : r->model->params, s->lr,
                                s->beta1, s->beta2, s->eps, s->weight_decay);
    bool ok = r->opt != NULL;
    for (int64_t k = 0; ok && k < ct_params_count(r->model->params); k++)
        if (ct_tensor_ndim(ct_params_get(r->model->params, k, NULL)) < 2)
            ok = ct_optim_set_weight_decay(r->opt, k, 0.0) == CT_OK;
    if (!ok) {
        fprintf(stderr, "creating the optimizer: %s\n", ct_last_error());
        return false;
    }
    if (s->resume && !restore_checkpoint(r)) return false;
    if (s->compare) {
        r->compare_x = malloc((size_t)(s->steps * s->accum * s->batch) * sizeof *r->compare_x);
        if (!r->compare_x || !compare_write_init(r)) return false;
    }
    return true;
}

/* With --ddp, Ctrl-C reaches the ranks at different moments: they agree at
 * each progress line (where the loop waits for the device anyway) and stop
 * together after it once any of them was interrupted, so no rank waits in a
 * collective the others left. */
static bool agree_on_stop(run *r) {
    ct_tensor *flag = ct_tensor_full(CT_NONE, g_stop ? 1.0 : 0.0, CT_F32, r->s.device);
    double any = 0;
    bool ok = flag && ct_dist_all_reduce(flag, CT_DIST_MAX) == CT_OK &&
              ct_tensor_item(flag, &any) == CT_OK;
    ct_tensor_release(flag);
    if (!ok) fprintf(stderr, "--ddp: %s\n", ct_last_error());
    else r->stop = any != 0;
    return ok;
}

static void print_header(const run *r) {
    const settings *s = &r->s;
    const lm_config *m = &s->model;
    char dev[32];
    printf("model %s: %" PRId64 " layers, width %" PRId64 ", %" PRId64 " heads (%" PRId64
           " key/value), mlp %" PRId64 ", context %" PRId64 ", vocab %" PRId64 ": %.2fM parameters\n",
           lm_family_name(m->family), m->n_layer, m->n_embd, m->n_head, m->n_kv_head,
           m->ffn_hidden, m->context, m->vocab, (double)lm_model_num_params(r->model) / 1e6);
    printf("data %s: %" PRId64 " bytes, %" PRId64 " for training, %" PRId64 " for validation\n",
           s->data, r->text.n, r->train.n, r->val.n);
    if (r->ddp)
        printf("data-parallel over %d processes: --batch-size %" PRId64 " each, %" PRId64
               " windows a micro-batch in all; losses are the ranks' mean\n",
               r->world, s->batch, s->batch * r->world);
    printf("training on %s%s: batch %" PRId64 " x %" PRId64 " x %" PRId64
           " tokens per step, %" PRId64 " steps, AdamW lr %g (warmup %" PRId64
           ", cosine to %g), weight decay %g, clip %g\n",
           ct_device_str(s->device, dev, sizeof dev), s->amp == CT_BF16 ? ", bf16 autocast" : "",
           s->accum, s->batch, m->context, s->steps, s->lr, s->warmup, s->min_lr,
           s->weight_decay, s->clip);
    if (s->resume) printf("resumed from %s at step %" PRId64 "\n", s->checkpoint, r->step);
    fflush(stdout);
}

static void run_free(run *r) {
    ct_ddp_free(r->ddp);
    lm_model_free(r->model);
    ct_optim_free(r->opt);
    lm_text_free(&r->text);
    ct_generator_free(r->data_gen);
    ct_tensor_release(r->loss_sum);
    free(r->starts);
    free(r->compare_x);
    ct_cuda_graph_free(r->graph);
    ct_tensor_release(r->graph_x);
    ct_tensor_release(r->graph_y);
}

int main(int argc, char **argv) {
    run r = {0};
    int status;
    if (!setup(&r, argc, argv, &status)) {
        run_free(&r);
        return status;
    }
    const settings *s = &r.s;
    print_header(&r);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, NULL);
    FILE *losses = NULL;
    if (s->compare) {
        char path[4096];
        snprintf(path, sizeof path, "%s/losses.txt", s->compare);
        losses = fopen(path, "w");
    }
    int64_t first = r.step, tokens_per_step = s->accum * s->batch * r.world * s->model.context;
    int64_t since = 0;
    double t_log = now_s();
    bool ok = true;
    while (ok && r.step < s->steps && !(r.ddp ? r.stop : g_stop) &&
           !(s->stop_after && r.step - first >= s->stop_after)) {
        bool log = (r.step + 1) % s->log_every == 0 || r.step + 1 == s->steps || losses;
        double norm = NAN;
        ok = s->cuda_graph ? graph_step(&r, log && !r.graph_warm ? &norm : NULL)
                           : train_step(&r, log ? &norm : NULL);
        if (!ok) {
            fprintf(stderr, "step %" PRId64 " failed: %s\n", r.step + 1, ct_last_error());
            break;
        }
        r.step++;
        since++;
        if (log) {
            double sum = 0;
            /* the ranks' mean: every rank logs at the same steps */
            ok = (!r.ddp || ct_dist_all_reduce(r.loss_sum, CT_DIST_AVG) == CT_OK) &&
                 ct_tensor_item(r.loss_sum, &sum) == CT_OK && ct_zero_(r.loss_sum) == CT_OK;
            double t = now_s(), dt = (t - t_log) / (double)since; /* item() waited for the device */
            char norm_s[32] = "-"; /* a replayed step does not read it back */
            if (!isnan(norm)) snprintf(norm_s, sizeof norm_s, "%.3f", norm);
            printf("step %5" PRId64 "/%" PRId64 "  loss %.4f  lr %.2e  norm %s  %6.0f tok/s  "
                   "%7.1f ms/step  mem %.2f GiB\n",
                   r.step, s->steps, sum / (double)since, lr_at(s, r.step - 1), norm_s,
                   (double)tokens_per_step / dt, 1e3 * dt, peak_gib(s->device));
            if (losses) fprintf(losses, "%.9g\n", sum);
            fflush(stdout);
            since = 0;
            t_log = now_s();
        }
        if (ok && !losses && ((s->val_every && r.step % s->val_every == 0) || r.step == s->steps)) {
            double vl;
            ok = evaluate(&r, &vl);
            if (ok) printf("step %5" PRId64 "/%" PRId64 "  validation loss %.4f\n", r.step, s->steps, vl);
            t_log = now_s(); /* evaluation is not training time */
        }
        if (ok && s->checkpoint && s->save_every && r.step % s->save_every == 0)
            ok = save_checkpoint(&r);
        if (ok && r.ddp && log) ok = agree_on_stop(&r);
    }
    signal(SIGINT, SIG_DFL);
    if (losses) fclose(losses);
    if (ok && s->compare) ok = compare_write_batches(&r);
    if (ok && s->checkpoint && !(s->save_every && r.step % s->save_every == 0))
        ok = save_checkpoint(&r);
    bool stopped = r.ddp ? r.stop : g_stop != 0;
    if (ok && stopped && s->checkpoint) printf("continue with --resume\n");
    if (ok && !stopped && !s->compare && s->sample_tokens > 0 && r.rank == 0) ok = sample_text(&r);
    bool ddp = r.ddp != NULL;
    run_free(&r);
    if (ddp && ct_dist_finalize() != CT_OK) {
        fprintf(stderr, "--ddp: %s\n", ct_last_error());
        ok = false;
    }
    return !ok ? 1 : stopped ? 130 : 0;
}
