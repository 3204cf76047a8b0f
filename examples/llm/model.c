/* The language model; see model.h. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *lm_family_name(lm_family f) { return f == LM_GPT2 ? "gpt2" : "llama"; }

static int64_t default_ffn(lm_family family, int64_t n_embd) {
    if (family == LM_GPT2) return 4 * n_embd;
    int64_t h = (8 * n_embd + 2) / 3; /* 8/3 of the width, as LLaMA, rounded up to 64 */
    return (h + 63) / 64 * 64;
}

lm_config lm_config_default(lm_family family) {
    lm_config c = {family, 6, 384, 6, family == LM_GPT2 ? 6 : 2, 0, 256, 256, 1e-5, 10000.0};
    c.ffn_hidden = default_ffn(family, c.n_embd);
    return c;
}

bool lm_config_check(lm_config *c, char *why, size_t n) {
    if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->context < 1 || c->vocab < 1 ||
        c->ffn_hidden < 0 || c->n_kv_head < 1) {
        snprintf(why, n, "layers, width, heads, kv heads, context and vocab must be >= 1");
        return false;
    }
    if (c->n_embd % c->n_head) {
        snprintf(why, n, "width %lld is not a multiple of the %lld heads", (long long)c->n_embd,
                 (long long)c->n_head);
        return false;
    }
    if (c->family == LM_GPT2 && c->n_kv_head != c->n_head) {
        snprintf(why, n, "gpt2 has as many key/value heads as heads (%lld, not %lld)",
                 (long long)c->n_head, (long long)c->n_kv_head);
        return false;
    }
    if (c->n_head % c->n_kv_head) {
        snprintf(why, n, "%lld heads cannot share %lld key/value heads evenly",
                 (long long)c->n_head, (long long)c->n_kv_head);
        return false;
    }
    if (c->family == LM_LLAMA && (c->n_embd / c->n_head) % 2) {
        snprintf(why, n, "RoPE needs an even head width, got %lld",
                 (long long)(c->n_embd / c->n_head));
        return false;
    }
    if (c->ffn_hidden == 0) c->ffn_hidden = default_ffn(c->family, c->n_embd);
    return true;
}

/* ---- parameters ------------------------------------------------------------------------------ */

typedef enum init_kind { INIT_NORMAL, INIT_RESIDUAL, INIT_ZEROS, INIT_ONES } init_kind;

/* A new parameter named name in m->params, initialised by kind. */
static ct_tensor *param(lm_model *m, ct_generator *gen, const char *name, init_kind kind,
                        int ndim, const int64_t *shape) {
    ct_tensor *t = ct_tensor_empty(ndim, shape, CT_F32, m->device);
    if (!t) return NULL;
    double std = 0.02;
    if (kind == INIT_RESIDUAL) std = 0.02 / sqrt(2.0 * (double)m->cfg.n_layer);
    ct_status st = kind == INIT_ZEROS  ? ct_zero_(t)
                   : kind == INIT_ONES ? ct_fill_(t, 1.0)
                                       : ct_normal_(t, 0.0, std, gen);
    if (st == CT_OK) st = ct_requires_grad_(t, true);
    if (st == CT_OK) st = ct_params_add(m->params, name, t);
    ct_tensor_release(t); /* the list's reference keeps it */
    return st == CT_OK ? t : NULL;
}

static bool make_block(lm_model *m, ct_generator *gen, int64_t i) {
    const lm_config *c = &m->cfg;
    lm_block *b = &m->blocks[i];
    b->model = m;
    bool gpt2 = c->family == LM_GPT2;
    int64_t C = c->n_embd, hd = C / c->n_head, qkv = (c->n_head + 2 * c->n_kv_head) * hd;
    int64_t ffn_in = gpt2 ? c->ffn_hidden : 2 * c->ffn_hidden;
    char name[64];
#define P(field, suffix, kind, ...)                                                      \
    do {                                                                                 \
        snprintf(name, sizeof name, "h.%lld.%s", (long long)i, suffix);                  \
        if (!(b->field = param(m, gen, name, kind, CT_SHAPE(__VA_ARGS__)))) return false; \
    } while (0)
    P(norm1_w, "norm1.weight", INIT_ONES, C);
    if (gpt2) P(norm1_b, "norm1.bias", INIT_ZEROS, C);
    P(wqkv, "attn.wqkv.weight", INIT_NORMAL, qkv, C);
    if (gpt2) P(bqkv, "attn.wqkv.bias", INIT_ZEROS, qkv);
    P(wo, "attn.wo.weight", INIT_RESIDUAL, C, C);
    if (gpt2) P(bo, "attn.wo.bias", INIT_ZEROS, C);
    P(norm2_w, "norm2.weight", INIT_ONES, C);
    if (gpt2) P(norm2_b, "norm2.bias", INIT_ZEROS, C);
    P(w_in, "mlp.w_in.weight", INIT_NORMAL, ffn_in, C);
    if (gpt2) P(b_in, "mlp.w_in.bias", INIT_ZEROS, ffn_in);
    P(w_out, "mlp.w_out.weight", INIT_RESIDUAL, C, c->ffn_hidden);
    if (gpt2) P(b_out, "mlp.w_out.bias", INIT_ZEROS, C);
#undef P
    return true;
}

lm_model *lm_model_new(const lm_config *cfg, ct_device device, ct_generator *gen) {
    lm_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->device = device;
    m->params = ct_params_new();
    m->blocks = calloc((size_t)cfg->n_layer, sizeof *m->blocks);
    bool gpt2 = cfg->family == LM_GPT2;
    int64_t C = cfg->n_embd;
    bool ok = m->params && m->blocks &&
              (m->wte = param(m, gen, "wte.weight", INIT_NORMAL, CT_SHAPE(cfg->vocab, C)));
    if (ok && gpt2)
        ok = (m->wpe = param(m, gen, "wpe.weight", INIT_NORMAL, CT_SHAPE(cfg->context, C)));
    for (int64_t i = 0; ok && i < cfg->n_layer; i++) ok = make_block(m, gen, i);
    ok = ok && (m->normf_w = param(m, gen, "normf.weight", INIT_ONES, CT_SHAPE(C)));
    if (ok && gpt2) ok = (m->normf_b = param(m, gen, "normf.bias", INIT_ZEROS, CT_SHAPE(C)));
    if (ok && !gpt2)
        ok = ct_rope_tables(cfg->context, C / cfg->n_head, cfg->rope_base, CT_F32, device,
                            &m->rope_cos, &m->rope_sin) == CT_OK;
    if (!ok) {
        lm_model_free(m);
        return NULL;
    }
    return m;
}

void lm_model_free(lm_model *m) {
    if (!m) return;
    ct_params_free(m->params); /* the parameters' last references */
    ct_tensor_release(m->rope_cos);
    ct_tensor_release(m->rope_sin);
    free(m->blocks);
    free(m);
}

int64_t lm_model_num_params(const lm_model *m) {
    int64_t n = 0;
    for (int64_t k = 0; k < ct_params_count(m->params); k++)
        n += ct_tensor_numel(ct_params_get(m->params, k, NULL));
    return n;
}

/* ---- forward --------------------------------------------------------------------------------- */

static ct_tensor *norm(const lm_model *m, ct_tensor *x, ct_tensor *w, ct_tensor *b) {
    const int64_t shape[1] = {m->cfg.n_embd};
    if (m->cfg.family == LM_GPT2)
        return ct_layer_norm(x, 1, shape, w, b, m->cfg.norm_eps, NULL, NULL);
    return ct_rms_norm(x, 1, shape, w, m->cfg.norm_eps, NULL);
}

/* q, k or v of the fused projection: [B, T, heads, hd] viewed as
 * [B, heads, T, hd], rotated by RoPE first for llama's q and k. */
static ct_tensor *heads(const lm_model *m, ct_tensor *part, int64_t B, int64_t T,
                        int64_t nheads, bool rope) {
    int64_t hd = m->cfg.n_embd / m->cfg.n_head;
    ct_tensor *x = ct_view(part, CT_SHAPE(B, T, nheads, hd));
    if (rope) {
        /* tables [T, 1, hd/2] broadcast over batch and heads; float32 ones are read as
         * they are beside a bfloat16 or float16 x (autocast's q and k) */
        ct_tensor *cos = ct_unsqueeze(ct_narrow(m->rope_cos, 0, 0, T), 1);
        ct_tensor *sin = ct_unsqueeze(ct_narrow(m->rope_sin, 0, 0, T), 1);
        x = ct_rope(x, cos, sin, CT_ROPE_HALF);
    }
    return ct_transpose(x, 1, 2);
}

static ct_tensor *attention(const lm_model *m, const lm_block *b, ct_tensor *x) {
    const lm_config *c = &m->cfg;
    int64_t B = ct_tensor_size(x, 0), T = ct_tensor_size(x, 1);
    int64_t hd = c->n_embd / c->n_head;
    bool rope = c->family == LM_LLAMA;
    ct_tensor *qkv = ct_linear(x, b->wqkv, b->bqkv);
    ct_tensor *part[3] = {NULL, NULL, NULL};
    const int64_t sizes[3] = {c->n_head * hd, c->n_kv_head * hd, c->n_kv_head * hd};
    if (!qkv || ct_split_with_sizes(qkv, 3, sizes, 2, part) != CT_OK) return NULL;
    ct_tensor *q = heads(m, part[0], B, T, c->n_head, rope);
    ct_tensor *k = heads(m, part[1], B, T, c->n_kv_head, rope);
    ct_tensor *v = heads(m, part[2], B, T, c->n_kv_head, false);
    /* causal, grouped-query: head h reads key/value head h / (n_head / n_kv_head) */
    ct_tensor *y = ct_scaled_dot_product_attention(q, k, v, NULL, 0.0, true, 0.0, NULL);
    y = ct_reshape(ct_transpose(y, 1, 2), CT_SHAPE(B, T, c->n_embd));
    return ct_linear(y, b->wo, b->bo);
}

/* GPT-2: linear, GELU (tanh form), linear as one op, whose GEMMs apply GELU and
 * its gradient on the GPU. LLaMA: SwiGLU of the two halves of one projection. */
static ct_tensor *mlp(const lm_model *m, const lm_block *b, ct_tensor *x) {
    if (m->cfg.family == LM_GPT2)
        return ct_mlp_gelu(x, b->w_in, b->b_in, b->w_out, b->b_out, CT_GELU_TANH);
    ct_tensor *h = ct_linear(x, b->w_in, b->b_in);
    ct_tensor *gu[2] = {NULL, NULL};
    int n = 0;
    if (!h || ct_chunk(h, 2, -1, 2, gu, &n) != CT_OK) return NULL;
    return ct_linear(ct_swiglu(gu[0], gu[1]), b->w_out, b->b_out);
}

/* norm(*x + branch), with *x becoming the sum: the residual add and the next
 * norm in one pass (ct_add_rms_norm, ct_add_layer_norm), whose output has the
 * dtype the next matmul reads under autocast. A NULL branch: norm(*x). */
static ct_tensor *add_norm(const lm_model *m, ct_tensor **x, ct_tensor *branch, ct_tensor *w,
                           ct_tensor *b) {
    if (!*x) return NULL;
    if (!branch) return norm(m, *x, w, b);
    const int64_t shape[1] = {m->cfg.n_embd};
    ct_dtype out = ct_autocast_enabled(m->device) ? ct_autocast_dtype(m->device) : CT_NUM_DTYPES;
    ct_tensor *sum = NULL, *y;
    if (m->cfg.family == LM_GPT2)
        y = ct_add_layer_norm(*x, branch, 1, shape, w, b, m->cfg.norm_eps, out, &sum);
    else
        y = ct_add_rms_norm(*x, branch, 1, shape, w, m->cfg.norm_eps, out, &sum);
    *x = y ? sum : NULL;
    return y;
}

/* One block: *x + attention(norm(*x)), then + mlp(norm(.)), where the
 * incoming *x still lacks the previous block's MLP output, *branch (NULL
 * before the first block): each residual add is fused with the norm that
 * reads its sum. On return *x lacks this block's MLP output, the new
 * *branch. */
static bool block_step(const lm_model *m, const lm_block *b, ct_tensor **x, ct_tensor **branch) {
    ct_tensor *a = attention(m, b, add_norm(m, x, *branch, b->norm1_w, b->norm1_b));
    *branch = mlp(m, b, add_norm(m, x, a, b->norm2_w, b->norm2_b));
    return *x && *branch;
}

/* One whole block (ctx: its lm_block) for ct_activation_checkpoint, which
 * takes a function of one tensor: x + attention(norm(x)), then + mlp(norm(.)). */
static ct_tensor *block(void *ctx, int n, ct_tensor *const *in) {
    const lm_block *b = ctx;
    (void)n;
    ct_tensor *x = in[0], *branch = NULL;
    if (!block_step(b->model, b, &x, &branch)) return NULL;
    return ct_add(x, branch);
}

ct_tensor *lm_model_hidden(lm_model *m, ct_tensor *tokens) {
    const lm_config *c = &m->cfg;
    int64_t T = ct_tensor_size(tokens, 1);
    ct_tensor *x = ct_embedding(m->wte, tokens);
    if (c->family == LM_GPT2) x = ct_add(x, ct_narrow(m->wpe, 0, 0, T));
    ct_tensor *branch = NULL; /* the last block's MLP output, not yet added to x */
    for (int64_t i = 0; x && i < c->n_layer; i++) {
        lm_block *b = &m->blocks[i];
        if (m->checkpoint_blocks) {
            /* ct_activation_checkpoint runs the block in a scope of its own;
             * the block (ctx) lives as long as the model */
            x = ct_activation_checkpoint(block, b, 1, &x);
            continue;
        }
        /* The block's own scope frees what the backward does not read (the
         * projections' results, the norms' outputs) at the block's end, as
         * Python frees a temporary when its last reference goes: the tensors
         * autograd saved stay alive, the rest of the step's activations do
         * not wait for the step's end. */
        ct_scope *scope = ct_scope_begin();
        bool ok = block_step(m, b, &x, &branch);
        x = ok ? ct_keep(x) : NULL;
        branch = ok ? ct_keep(branch) : NULL;
        ct_scope_end(scope);
    }
    return add_norm(m, &x, branch, m->normf_w, m->normf_b);
}

ct_tensor *lm_model_loss(lm_model *m, ct_tensor *tokens, ct_tensor *targets) {
    ct_tensor *h = lm_model_hidden(m, tokens);
    /* the tied head: logits = h @ wte^T, fused with the loss chunk by chunk */
    ct_tensor *flat = ct_reshape(h, CT_SHAPE(-1, m->cfg.n_embd));
    ct_tensor *y = ct_reshape(targets, CT_SHAPE(-1));
    return ct_linear_cross_entropy(flat, m->wte, NULL, y, -100, 0.0, CT_REDUCTION_MEAN);
}

ct_tensor *lm_model_last_logits(lm_model *m, ct_tensor *tokens) {
    ct_tensor *h = lm_model_hidden(m, tokens);
    ct_tensor *last = ct_select(h, 1, -1);
    return ct_linear(last, m->wte, NULL);
}
