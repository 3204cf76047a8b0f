/* A decoder-only transformer language model on cten's ops, in two families:
 *
 *   llama: token embedding; n_layer blocks of
 *            x = x + wo(attention(rope(q), rope(k), v))    on rms_norm(x)
 *            x = x + w_down(swiglu(w_gate x, w_up x))      on rms_norm(x)
 *          with grouped-query attention (n_kv_head key/value heads shared by
 *          n_head / n_kv_head query heads each), no biases; final rms_norm.
 *   gpt2:  token and learned position embeddings; n_layer blocks of
 *            x = x + c_proj(attention(q, k, v))            on layer_norm(x)
 *            x = x + mlp_proj(gelu_tanh(mlp_fc x))         on layer_norm(x)
 *          with biases; final layer_norm.
 *
 * Both tie the output head to the token embedding and train with the fused
 * linear + cross-entropy (no [B*T, vocab] logits). The PyTorch twin,
 * examples/reference/train_lm.py, is the same model line by line.
 *
 * Ownership: the model owns its parameters (leaves that require grad) and
 * its RoPE tables until lm_model_free; the functions returning tensors
 * return new handles the caller (or the open scope) owns, NULL with
 * ct_last_error() set on failure. Their temporaries are left to the open
 * scope: call them inside one (ct_scope_begin). */
#ifndef LM_MODEL_H
#define LM_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include <tensor/tensor.h>

typedef enum lm_family { LM_LLAMA = 0, LM_GPT2 = 1 } lm_family;

typedef struct lm_config {
    lm_family family;
    int64_t n_layer, n_embd, n_head;
    int64_t n_kv_head; /* llama: divides n_head; gpt2: n_head */
    int64_t ffn_hidden; /* the MLP's hidden width */
    int64_t context;    /* longest sequence (RoPE tables, position embeddings) */
    int64_t vocab;
    double norm_eps;   /* 1e-5 */
    double rope_base;  /* 10000 */
} lm_config;

/* The configuration's defaults for family: 6 layers, width 384, 6 heads (2
 * key/value heads for llama), context 256, vocab 256 (bytes), ffn_hidden
 * 4 * width (gpt2) or 8/3 * width rounded up to a multiple of 64 (llama). */
lm_config lm_config_default(lm_family family);
/* Fills a zero ffn_hidden with the family's default and checks the
 * configuration; false with the reason in why (a message of n bytes). */
bool lm_config_check(lm_config *cfg, char *why, size_t n);
const char *lm_family_name(lm_family f);

typedef struct lm_block {
    const struct lm_model *model; /* the model it belongs to */
    ct_tensor *norm1_w, *norm1_b; /* [C] (b: gpt2 only) */
    ct_tensor *wqkv, *bqkv;       /* [(n_head + 2 n_kv_head) * head_dim, C], bias gpt2 only */
    ct_tensor *wo, *bo;           /* [C, C] */
    ct_tensor *norm2_w, *norm2_b;
    ct_tensor *w_in, *b_in;   /* llama: gate and up stacked [2 * ffn, C]; gpt2: fc [ffn, C] */
    ct_tensor *w_out, *b_out; /* [C, ffn] */
} lm_block;

typedef struct lm_model {
    lm_config cfg;
    ct_device device;
    ct_tensor *wte;          /* [vocab, C], also the output head */
    ct_tensor *wpe;          /* [context, C], gpt2 only */
    lm_block *blocks;        /* n_layer */
    ct_tensor *normf_w, *normf_b;
    ct_tensor *rope_cos, *rope_sin; /* [context, head_dim / 2] float32, llama only */
    ct_params *params;       /* every parameter, named as in checkpoints */
    /* Each block through ct_activation_checkpoint: its activations are made again in
     * the backward instead of kept (false after lm_model_new). */
    bool checkpoint_blocks;
} lm_model;

/* A model on device (float32 parameters) initialised as GPT-2 is: linear
 * weights and embeddings ~ N(0, 0.02), the projections into the residual
 * stream (wo, w_out) ~ N(0, 0.02 / sqrt(2 n_layer)), biases 0, norm gains 1;
 * the draws come from gen in parameter order. cfg must pass lm_config_check.
 * NULL with an error on failure. */
lm_model *lm_model_new(const lm_config *cfg, ct_device device, ct_generator *gen);
void lm_model_free(lm_model *m); /* NULL is a no-op */
int64_t lm_model_num_params(const lm_model *m);

/* The final hidden states [B, T, C] for tokens [B, T] (int64 on the
 * model's device, T <= context). */
ct_tensor *lm_model_hidden(lm_model *m, ct_tensor *tokens);
/* The mean next-token cross-entropy of tokens [B, T] against targets
 * [B, T] (0-d; float32 under autocast too). */
ct_tensor *lm_model_loss(lm_model *m, ct_tensor *tokens, ct_tensor *targets);
/* The logits [B, vocab] of the last position of tokens [B, T]. */
ct_tensor *lm_model_last_logits(lm_model *m, ct_tensor *tokens);

#endif
