/* One training step of the language model of examples/llm, the whole of
 * it: zero_grad, forward (bf16 autocast on a GPU), the fused linear +
 * cross-entropy with the tied head, backward and an AdamW step (weight
 * decay on the 2-d weights), on random tokens. bench/torch_lm_step.py is
 * its PyTorch twin (eager and torch.compile) and runs it beside itself.
 *
 *   bench_lm_step --shape gpt2-124m|llama-124m|small [--device cuda|cpu]
 *                 [--batch N] [--steps N] [--amp bf16|off] [--recompute 0|1]
 *                 [--activation-checkpointing 0|1] [--cuda-graph 0|1]
 *
 * gpt2-124m: 12 layers, width 768, 12 heads, vocab 50304, context 1024,
 * batch 16, GELU MLP 3072, LayerNorm, learned positions; llama-124m: the
 * same with RMSNorm, RoPE and SwiGLU 2048 (12 heads, all of them key/value
 * heads); small: the CPU comparison's 4 layers, width 128, 4 heads (2
 * key/value), context 128, vocab 256, batch 8. Prints one line: the median
 * ms per step over blocks of --steps steps after 3 warmup steps, tokens/s
 * and the peak memory (the device allocator's on a GPU, the process's
 * resident peak on the CPU). A GPU shape without a GPU prints a line saying
 * so and exits 0. --recompute 1 makes the MLP's activation again in the
 * backward (ct_set_recompute_enabled), --activation-checkpointing 1 each
 * block (ct_activation_checkpoint). --cuda-graph 1 (a GPU only) records
 * one whole step into a CUDA graph after the warmup steps and times its
 * replays, as cten-train-lm --cuda-graph trains. CT_PROFILE=sync adds the
 * per-op table of the timed steps with device times (at exit, on stderr). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "model.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool shape_config(const char *shape, lm_config *c, int64_t *batch) {
    if (!strcmp(shape, "small")) {
        *c = lm_config_default(LM_LLAMA);
        c->n_layer = 4, c->n_embd = 128, c->n_head = 4, c->n_kv_head = 2, c->context = 128;
        c->ffn_hidden = 0;
        *batch = 8;
        return true;
    }
    bool gpt2 = !strcmp(shape, "gpt2-124m");
    if (!gpt2 && strcmp(shape, "llama-124m")) return false;
    *c = lm_config_default(gpt2 ? LM_GPT2 : LM_LLAMA);
    c->n_layer = 12, c->n_embd = 768, c->n_head = 12, c->n_kv_head = 12;
    c->context = 1024, c->vocab = 50304, c->ffn_hidden = gpt2 ? 3072 : 2048;
    *batch = 16;
    return true;
}

static void sync(ct_device d) {
    if (d.type == CT_DEVICE_CUDA) ct_cuda_synchronize(d.index);
}

static double peak_gib(ct_device d) {
    if (d.type == CT_DEVICE_CUDA) {
        ct_cuda_memstats st;
        return ct_cuda_memory_stats(d.index, &st) == CT_OK ? (double)st.peak_allocated / 1073741824.0
                                                           : 0.0;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1048576.0;
}

/* opt.zero_grad(); with autocast: loss = model(x, y); loss.backward(); opt.step() */
static bool step(lm_model *m, ct_optimizer *opt, ct_tensor *x, ct_tensor *y, ct_dtype amp,
                 ct_device dev, bool recompute) {
    ct_scope *s = ct_scope_begin();
    ct_optim_zero_grad(opt);
    bool prev = ct_set_recompute_enabled(recompute);
    if (amp != CT_F32) ct_autocast_begin(dev, amp);
    ct_tensor *loss = lm_model_loss(m, x, y);
    if (amp != CT_F32) ct_autocast_end();
    ct_set_recompute_enabled(prev);
    bool ok = loss && ct_backward(loss, NULL, false) == CT_OK && ct_optim_step(opt) == CT_OK;
    ct_scope_end(s);
    return ok;
}

int main(int argc, char **argv) {
    const char *shape = "small";
    ct_device dev = CT_CPU;
    int64_t batch = 0, steps = 10, blocks = 3;
    int amp_opt = -1; /* -1: bf16 on a GPU, off on the CPU */
    bool recompute = false, act_ckpt = false, use_graph = false;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shape")) shape = argv[i + 1];
        else if (!strcmp(argv[i], "--device"))
            dev = !strncmp(argv[i + 1], "cuda", 4) ? CT_CUDA(argv[i + 1][4] == ':' ? atoi(argv[i + 1] + 5) : 0) : CT_CPU;
        else if (!strcmp(argv[i], "--batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--blocks")) blocks = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--amp")) amp_opt = !strcmp(argv[i + 1], "bf16");
        else if (!strcmp(argv[i], "--recompute")) recompute = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "--activation-checkpointing")) act_ckpt = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "--cuda-graph")) use_graph = atoi(argv[i + 1]) != 0;
        else {
            fprintf(stderr, "bench_lm_step: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    lm_config cfg;
    int64_t default_batch;
    char why[256];
    if (!shape_config(shape, &cfg, &default_batch) || !lm_config_check(&cfg, why, sizeof why)) {
        fprintf(stderr, "bench_lm_step: unknown shape %s (gpt2-124m, llama-124m, small)\n", shape);
        return 2;
    }
    if (batch < 1) batch = default_batch;
    if (steps < 1 || blocks < 1) return 2;
    if (dev.type == CT_DEVICE_CUDA && !ct_cuda_available()) {
        printf("bench_lm_step %s: skipped, no GPU\n", shape);
        return 0;
    }
    if (use_graph && dev.type != CT_DEVICE_CUDA) {
        fprintf(stderr, "bench_lm_step: --cuda-graph needs --device cuda\n");
        return 2;
    }
    ct_dtype amp = amp_opt < 0 ? (dev.type == CT_DEVICE_CUDA ? CT_BF16 : CT_F32)
                               : amp_opt ? CT_BF16 : CT_F32;
    ct_generator *gen = ct_generator_new(1);
    lm_model *m = lm_model_new(&cfg, dev, gen);
    if (m) m->checkpoint_blocks = act_ckpt;
    ct_optimizer *opt =
        m ? ct_optim_adamw_new(m->params, 6e-4, 0.9, 0.95, 1e-8, 0.1) : NULL;
    for (int64_t k = 0; opt && k < ct_params_count(m->params); k++)
        if (ct_tensor_ndim(ct_params_get(m->params, k, NULL)) < 2)
            ct_optim_set_weight_decay(opt, k, 0.0);
    ct_tensor *x = ct_tensor_randint(gen, 0, cfg.vocab, CT_SHAPE(batch, cfg.context), CT_I64, dev);
    ct_tensor *y = ct_tensor_randint(gen, 0, cfg.vocab, CT_SHAPE(batch, cfg.context), CT_I64, dev);
    bool ok = m && opt && x && y;
    for (int i = 0; ok && i < 3; i++) ok = step(m, opt, x, y, amp, dev, recompute);
    /* the warmup steps made what a capture cannot (cuBLAS and cuDNN plans,
     * the allocator's blocks); the graph then replays a fifth step */
    ct_cuda_graph *graph = NULL;
    if (ok && use_graph) {
        graph = ct_cuda_graph_capture_begin(dev.index);
        ok = graph && step(m, opt, x, y, amp, dev, recompute);
        ok = graph && ct_cuda_graph_capture_end(graph) == CT_OK && ok;
    }
    sync(dev);
    /* CT_PROFILE's table then covers the timed steps alone, not the first
     * calls' plan building and autotuning */
    ct_profile_reset();
    double *ms = calloc((size_t)blocks, sizeof *ms);
    for (int64_t b = 0; ok && ms && b < blocks; b++) {
        double t0 = now_s();
        for (int64_t i = 0; ok && i < steps; i++)
            ok = graph ? ct_cuda_graph_replay(graph) == CT_OK
                       : step(m, opt, x, y, amp, dev, recompute);
        sync(dev);
        ms[b] = 1e3 * (now_s() - t0) / (double)steps;
    }
    if (!ok || !ms) {
        fprintf(stderr, "bench_lm_step: %s\n", ct_last_error());
    } else {
        qsort(ms, (size_t)blocks, sizeof *ms, cmp_double);
        double med = ms[blocks / 2];
        printf("cten %s %s%s%s%s%s B%" PRId64 " T%" PRId64
               ": %.2f ms/step  %.0f tok/s  peak %.2f GiB\n",
               shape, dev.type == CT_DEVICE_CUDA ? "cuda" : "cpu",
               amp == CT_BF16 ? " bf16" : " f32", recompute ? " recompute" : "",
               act_ckpt ? " checkpointed" : "", graph ? " graph" : "", batch, cfg.context, med,
               (double)(batch * cfg.context) / (med / 1e3), peak_gib(dev));
    }
    free(ms);
    ct_cuda_graph_free(graph);
    ct_tensor_release(x);
    ct_tensor_release(y);
    ct_optim_free(opt);
    lm_model_free(m);
    ct_generator_free(gen);
    return ok ? 0 : 1;
}
