/* docs/OPS.md from the op schema, the kernel table and the table of
 * functions made of ops below, and the checks that keep both whole:
 *
 *   ops_doc --write FILE TESTS_DIR OPS_H   writes FILE
 *   ops_doc --check FILE TESTS_DIR OPS_H   fails when FILE differs from what
 *                                          --write would write, or a check
 *                                          below fails
 *
 * FILE has two parts. The op table: one row per dispatchable op, from the
 * schema and the kernels the backends register. The section "Functions made
 * of ops": one row per public function of OPS_H (include/tensor/ops.h) that
 * is no op's C function, from the table `composites` below, which holds each
 * function's address (removing or renaming one breaks this file's build) and
 * states by hand its PyTorch name, the ops it runs and whether autograd
 * differentiates it. A few functions of OPS_H run no op at all (the autocast
 * regions' switches): they are listed in `not_ops` and have no row.
 *
 * The checks: every op has a CPU kernel and, when differentiable, its
 * formula; every C function of either table and of `not_ops` is exported
 * and called (or passed as a value) by some test under TESTS_DIR (each one
 * that is not is named); every function OPS_H declares is an op's C
 * function, a row of `composites` or in `not_ops`, and every row of those two
 * names a function OPS_H declares, once.
 *
 * The op table's CUDA column needs the CUDA module loaded: meson runs this
 * with the toolkit's stub driver in front (no GPU needed). Where the module
 * does not load (a build without CUDA), the op table is left as FILE has it:
 * --check compares only the section of functions made of ops, and --write
 * rewrites only that section, keeping FILE's op table byte for byte (all
 * of FILE is taken as the op table when it has no such section yet). The
 * section depends on nothing the module registers. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensor/tensor.h>

#include "../src/dispatch/dispatch_impl.h"

/* The schema's formula column, spelled out: "" where the op has none. */
#define CTI_F(fn) #fn
#define CTI_NODIFF ""
#define CTI_NOFORMULA ""
#define FORMULA_(ID, nm, P, grad, bw) grad,
static const char *const formulas[CT_NUM_OPS] = {CTI_OP_SCHEMA(FORMULA_)};
#undef FORMULA_
#undef CTI_F
#undef CTI_NODIFF
#undef CTI_NOFORMULA

/* An op whose C entry point is not ct_<name>, or whose PyTorch counterpart
 * is not torch.<name>. NULL: the default. */
typedef struct op_names {
    const char *op, *function, *torch;
} op_names;

static const op_names names[] = {
    {"copy", "ct_copy_", "Tensor.copy_"},
    {"fill", "ct_fill_", "Tensor.fill_, torch.full"},
    {"arange", "ct_tensor_arange", "torch.arange, torch.linspace"},
    {"uniform", "ct_tensor_rand", "torch.rand, Tensor.uniform_"},
    {"normal", "ct_tensor_randn", "torch.randn, Tensor.normal_"},
    {"randint", "ct_tensor_randint", NULL},
    {"relu", NULL, "torch.relu, F.relu"},
    {"gelu", NULL, "F.gelu"},
    {"gelu_tanh", "ct_gelu", "F.gelu(approximate='tanh')"},
    {"silu", NULL, "F.silu"},
    {"softplus", NULL, "F.softplus"},
    {"var", NULL, "torch.var, torch.std"},
    {"norm", NULL, "torch.linalg.vector_norm"},
    {"max", NULL, "torch.max, torch.amax"},
    {"min", NULL, "torch.min, torch.amin"},
    {"conv2d", NULL, "F.conv2d"},
    {"max_pool2d", NULL, "F.max_pool2d"},
    {"avg_pool2d", NULL, "F.avg_pool2d"},
    {"adaptive_avg_pool2d", NULL, "F.adaptive_avg_pool2d"},
    {"rms_norm", NULL, "F.rms_norm"},
    {"layer_norm", NULL, "F.layer_norm"},
    {"cross_entropy", NULL, "F.cross_entropy"},
    {"nll_loss", NULL, "F.nll_loss"},
    {"mse_loss", NULL, "F.mse_loss"},
    {"embedding", NULL, "F.embedding"},
    {"dropout", NULL, "F.dropout"},
    {"sgd_step", "ct_optim_sgd_new", "torch.optim.SGD(fused=True)"},
    {"adamw_step", "ct_optim_adamw_new", "torch.optim.AdamW(fused=True)"},
    {"adam_step", "ct_optim_adam_new", "torch.optim.Adam(fused=True)"},
    {"rmsprop_step", "ct_optim_rmsprop_new", "torch.optim.RMSprop"},
    {"adagrad_step", "ct_optim_adagrad_new", "torch.optim.Adagrad"},
    {"amp_non_finite_check_and_unscale", "ct_grad_scaler_unscale",
     "torch._amp_foreach_non_finite_check_and_unscale_"},
    {"amp_update_scale", "ct_grad_scaler_update", "torch._amp_update_scale_"},
    {"rope", NULL, "(LLaMA's apply_rotary_emb)"},
    {"swiglu", NULL, "F.silu(a) * b"},
    {"cross_entropy_fused", "ct_linear_cross_entropy", "(Liger's fused linear cross-entropy)"},
    {"scaled_dot_product_attention", NULL, "F.scaled_dot_product_attention"},
    {"interpolate", NULL, "F.interpolate"},
    {"repeat", NULL, "Tensor.repeat, torch.tile"},
    {"adaptive_max_pool2d", NULL, "F.adaptive_max_pool2d"},
    {"batch_norm", NULL, "F.batch_norm, F.group_norm, F.instance_norm"},
    {"log_sigmoid", "ct_logsigmoid", "F.logsigmoid"},
    {"leaky_relu", NULL, "F.leaky_relu"},
    {"elu", NULL, "F.elu, F.selu, F.celu"},
    {"mish", NULL, "F.mish"},
    {"hardtanh", NULL, "F.hardtanh"},
    {"hardsigmoid", NULL, "F.hardsigmoid"},
    {"hardswish", NULL, "F.hardswish"},
    {"round_decimals", "ct_round_decimals", "torch.round(decimals=)"},
    {"pad", NULL, "F.pad"},
    {"unfold", NULL, "F.unfold"},
    {"fold", NULL, "F.fold"},
    {"interpolate_backward", "ct_interpolate", NULL},
    {"add_rms_norm", NULL, "x + residual, then F.rms_norm (flash-attn's fused add + norm)"},
    {"add_layer_norm", NULL, "x + residual, then F.layer_norm (flash-attn's fused add + norm)"},
    {"add_rms_norm_backward", "ct_add_rms_norm", NULL},
    {"add_layer_norm_backward", "ct_add_layer_norm", NULL},
    {"linear_backward_weight", NULL,
     "(backward of F.linear: the weight's and bias's gradients, Apex's fused dense wgrad)"},
    {"linear_gelu", "ct_mlp_gelu",
     "F.linear, F.gelu, F.linear (Apex's FusedDenseGeluDense; it also runs mm or addmm)"},
    {"linear_dgelu", "ct_mlp_gelu_backward_hidden",
     "(backward of F.gelu after F.linear: Apex's fused dgelu and bias gradient)"},
};

/* An op without a formula that autograd differentiates all the same,
 * through the node its function records. */
static const struct {
    const char *op, *grad;
} grad_notes[] = {
    {"cross_entropy_fused", "yes, by the node its function records (`cti_bw_linear_cross_entropy`)"},
    {"linear_gelu", "yes, by the node its function records (`cti_bw_mlp_gelu`)"},
};

static const op_names *lookup(const char *op) {
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(names[i].op, op)) return &names[i];
    return NULL;
}

static void function_of(const char *op, char *buf, size_t n) {
    const op_names *o = lookup(op);
    if (o && o->function) snprintf(buf, n, "%s", o->function);
    else snprintf(buf, n, "ct_%s", op);
}

/* The PyTorch name; a backward op names its forward's. */
static void torch_of(int k, char *buf, size_t n) {
    const char *op = cti_schema_rows[k].name;
    const op_names *o = lookup(op);
    if (o && o->torch) {
        snprintf(buf, n, "%s", o->torch);
        return;
    }
    for (int f = 0; f < CT_NUM_OPS; f++)
        if (cti_schema_rows[f].backward == k) {
            snprintf(buf, n, "(backward of %s)", cti_schema_rows[f].name);
            return;
        }
    size_t len = strlen(op);
    if (len > 9 && !strcmp(op + len - 9, "_backward")) {
        snprintf(buf, n, "(backward of %.*s)", (int)(len - 9), op);
        return;
    }
    snprintf(buf, n, "torch.%s", op);
}

static const char *short_dtype(int d) {
    static const char *const s[CT_NUM_DTYPES] = {"bool", "i32", "i64", "f16", "bf16", "f32", "f64"};
    return s[d];
}

static void dtypes_of(int k, ct_device_type dev, char *buf, size_t n) {
    buf[0] = '\0';
    size_t used = 0;
    for (int d = 0; d < CT_NUM_DTYPES; d++)
        if (ct_supports((ct_op)k, dev, (ct_dtype)d))
            used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? " " : "", short_dtype(d));
    if (!used) snprintf(buf, n, "-");
}

static void grad_of(int k, char *buf, size_t n) {
    const cti_op_info *r = &cti_schema_rows[k];
    for (size_t i = 0; i < sizeof grad_notes / sizeof grad_notes[0]; i++)
        if (!strcmp(grad_notes[i].op, r->name)) {
            snprintf(buf, n, "%s", grad_notes[i].grad);
            return;
        }
    if (r->grad == CTI_GRAD_FORMULA)
        snprintf(buf, n, "yes (`%s`%s%s)", formulas[k], r->backward >= 0 ? ", " : "",
                 r->backward >= 0 ? cti_schema_rows[r->backward].name : "");
    else if (r->grad == CTI_GRAD_NOFORMULA)
        snprintf(buf, n, "no formula");
    else
        snprintf(buf, n, "no");
}

/* ---- functions made of ops ------------------------------------------------------------ */

/* A public function's address, whatever its type: naming the function here
 * makes the build fail when it is removed or renamed. */
typedef void (*any_fn)(void);
#define FN(f) #f, (any_fn)(f)

/* One row of "Functions made of ops": the C function, the PyTorch name(s)
 * it mirrors, the schema ops it runs (their schema names), and whether
 * autograd differentiates it: "yes" when it records the nodes of the ops it
 * runs, "yes (`formula`)" when it records one node of its own with that
 * formula, "no" otherwise. Rows in the order of include/tensor/ops.h. */
typedef struct composite {
    const char *function;
    any_fn address;
    const char *torch, *runs, *grad;
} composite;

#define INPLACE_GRAD "yes (the out-of-place form's node, rebased as PyTorch)"

static const composite composites[] = {
    /* unary, in place */
    {FN(ct_neg_), "Tensor.neg_", "neg, in place", INPLACE_GRAD},
    {FN(ct_exp_), "Tensor.exp_", "exp, in place", INPLACE_GRAD},
    {FN(ct_sqrt_), "Tensor.sqrt_", "sqrt, in place", INPLACE_GRAD},
    {FN(ct_relu_), "Tensor.relu_, F.relu(inplace=True)", "relu, in place", INPLACE_GRAD},
    /* binary with alpha */
    {FN(ct_add_alpha), "torch.add(alpha=)", "add (a + alpha b)", "yes (`cti_bw_add`)"},
    {FN(ct_sub_alpha), "torch.sub(alpha=)", "sub (a - alpha b)", "yes (`cti_bw_add`)"},
    /* tensor-scalar */
    {FN(ct_add_scalar), "torch.add(x, s)", "add with a 0-d operand", "yes (`cti_bw_add`)"},
    {FN(ct_sub_scalar), "torch.sub(x, s)", "sub with a 0-d operand", "yes (`cti_bw_add`)"},
    {FN(ct_rsub_scalar), "torch.rsub(x, s)", "sub with a 0-d operand (s - x)",
     "yes (`cti_bw_neg`)"},
    {FN(ct_mul_scalar), "torch.mul(x, s)", "mul with a 0-d operand", "yes (`cti_bw_mul_scalar`)"},
    {FN(ct_div_scalar), "torch.div(x, s)", "div with a 0-d operand", "yes (`cti_bw_div_scalar`)"},
    {FN(ct_pow_scalar), "torch.pow(x, s)", "pow with a 0-d operand", "yes (`cti_bw_pow_scalar`)"},
    {FN(ct_maximum_scalar), "torch.maximum(x, torch.tensor(s))", "maximum with a 0-d operand",
     "yes (`cti_bw_maximum_scalar`)"},
    {FN(ct_minimum_scalar), "torch.minimum(x, torch.tensor(s))", "minimum with a 0-d operand",
     "yes (`cti_bw_minimum_scalar`)"},
    {FN(ct_eq_scalar), "torch.eq(x, s)", "eq with a 0-d operand", "no"},
    {FN(ct_ne_scalar), "torch.ne(x, s)", "ne with a 0-d operand", "no"},
    {FN(ct_lt_scalar), "torch.lt(x, s)", "lt with a 0-d operand", "no"},
    {FN(ct_le_scalar), "torch.le(x, s)", "le with a 0-d operand", "no"},
    {FN(ct_gt_scalar), "torch.gt(x, s)", "gt with a 0-d operand", "no"},
    {FN(ct_ge_scalar), "torch.ge(x, s)", "ge with a 0-d operand", "no"},
    /* binary, in place */
    {FN(ct_add_), "Tensor.add_", "add, in place", INPLACE_GRAD},
    {FN(ct_add_alpha_), "Tensor.add_(alpha=)", "add (a + alpha b), in place", INPLACE_GRAD},
    {FN(ct_sub_), "Tensor.sub_", "sub, in place", INPLACE_GRAD},
    {FN(ct_mul_), "Tensor.mul_", "mul, in place", INPLACE_GRAD},
    {FN(ct_div_), "Tensor.div_", "div, in place", INPLACE_GRAD},
    {FN(ct_pow_), "Tensor.pow_", "pow, in place", INPLACE_GRAD},
    {FN(ct_add_scalar_), "Tensor.add_(s)", "add with a 0-d operand, in place", INPLACE_GRAD},
    {FN(ct_sub_scalar_), "Tensor.sub_(s)", "sub with a 0-d operand, in place", INPLACE_GRAD},
    {FN(ct_mul_scalar_), "Tensor.mul_(s)", "mul with a 0-d operand, in place", INPLACE_GRAD},
    {FN(ct_div_scalar_), "Tensor.div_(s)", "div with a 0-d operand, in place", INPLACE_GRAD},
    {FN(ct_clamp_), "Tensor.clamp_", "clamp, in place", INPLACE_GRAD},
    /* reductions */
    {FN(ct_std), "torch.std", "var (its std form)", "yes (`cti_bw_std`)"},
    {FN(ct_max_dim), "torch.max(x, dim)", "max along dim, with int64 indices",
     "yes (`cti_bw_max_dim`)"},
    {FN(ct_min_dim), "torch.min(x, dim)", "min along dim, with int64 indices",
     "yes (`cti_bw_max_dim`)"},
    {FN(ct_argmax_all), "torch.argmax(x)", "argmax over every dim", "no"},
    {FN(ct_argmin_all), "torch.argmin(x)", "argmin over every dim", "no"},
    /* linear algebra */
    {FN(ct_matmul), "torch.matmul", "mm or bmm on strided views (batch dims broadcast)",
     "yes (`cti_bw_matmul`)"},
    {FN(ct_linear), "F.linear", "addmm (with bias) or mm on views of x and w^T",
     "yes (`cti_bw_linear`)"},
    /* rope, cumsum, fused linear cross-entropy */
    {FN(ct_rope_tables), "(LLaMA's precompute_freqs_cis)",
     "copy (tables computed in float64 on the host, converted to dtype and moved to the device)",
     "no"},
    {FN(ct_cumsum_backward), "(backward of cumsum)", "cumsum, from the end",
     "yes (`cti_bw_cumsum`)"},
    {FN(ct_linear_cross_entropy_backward), "(backward of Liger's fused linear cross-entropy)",
     "per chunk of rows: addmm or mm, cross_entropy_fused, mm, addmm, sum; then mul in place by "
     "the scale",
     "no"},
    /* indexing */
    {FN(ct_masked_fill), "torch.masked_fill", "where with a 0-d value", "yes"},
    {FN(ct_repeat_interleave), "torch.repeat_interleave (int repeats)",
     "copy (an expanded view reshaped); index_select for a tensor of the most dims", "yes"},
    {FN(ct_split), "torch.split (int split_size)", "none: narrow views",
     "yes (`cti_bw_split`; narrow's past 4 pieces)"},
    {FN(ct_split_with_sizes), "torch.split_with_sizes, torch.split (a list of sizes)",
     "none: narrow views", "yes (`cti_bw_split`; narrow's past 4 pieces)"},
    {FN(ct_chunk), "torch.chunk", "none: narrow views",
     "yes (`cti_bw_split`; narrow's past 4 pieces)"},
    /* reductions, scans and sorting */
    {FN(ct_logsumexp), "torch.logsumexp",
     "max, abs, eq, where (the shift, without grad); sub, exp, sum, log, add", "yes"},
    {FN(ct_all), "torch.all", "eq with a 0-d operand, sum, eq", "no"},
    {FN(ct_any), "torch.any", "ne with a 0-d operand, sum, gt", "no"},
    {FN(ct_amax), "torch.amax", "max over dims (without grad)", "yes (`cti_bw_amax`)"},
    {FN(ct_amin), "torch.amin", "min over dims (without grad)", "yes (`cti_bw_amax`)"},
    {FN(ct_count_nonzero), "torch.count_nonzero", "ne with a 0-d operand, sum", "no"},
    {FN(ct_argsort), "torch.argsort", "sort (its indices)", "no"},
    {FN(ct_kthvalue), "torch.kthvalue", "sort, fill, gather", "yes"},
    {FN(ct_median), "torch.median(x)", "as ct_median_dim over the flattened x", "yes"},
    {FN(ct_median_dim), "torch.median(x, dim)",
     "sort, fill, gather; ne, sum, gt, mul, add, where (a slice's first NaN)", "yes"},
    {FN(ct_mode), "torch.mode",
     "sort, gather; without grad: fill, ne, copy (cat), cumsum, sub, scatter_add, argmax", "yes"},
    {FN(ct_unique), "torch.unique (return_inverse, return_counts)",
     "sort, ne, copy (cat), cumsum, nonzero, index_select, sub, scatter_add", "no"},
    /* indexing and shape */
    {FN(ct_scatter_value), "torch.scatter(value=)", "copy, scatter (of an expanded 0-d value)",
     "yes (`cti_bw_scatter`)"},
    {FN(ct_index_add), "torch.index_add",
     "scatter_add (of source, times alpha by mul); lt, ge, logical_or, sum check the indices",
     "yes"},
    {FN(ct_index_put), "torch.index_put",
     "scatter, or scatter_add to accumulate, at flat positions (mul, add); nonzero for a mask, "
     "arange for a slice; lt, ge, logical_or, sum, where check and wrap the indices",
     "yes"},
    {FN(ct_masked_select), "torch.masked_select",
     "copy (the mask to the host, which counts it), index_select", "yes"},
    {FN(ct_take), "torch.take",
     "index_select of the flattened x; lt, ge, logical_or, sum, where check and wrap the indices",
     "yes"},
    {FN(ct_tile), "torch.tile", "repeat", "yes"},
    {FN(ct_unbind), "torch.unbind", "none: select views", "yes (`cti_bw_select`)"},
    {FN(ct_diagonal), "torch.diagonal", "none: a view", "yes (`cti_bw_diagonal`)"},
    {FN(ct_diag), "torch.diag", "1-d x: fill, scatter; 2-d x: copy of the diagonal", "yes"},
    {FN(ct_one_hot), "F.one_hot",
     "fill, scatter (of 1); lt, ge, logical_or, sum check the classes; max for num_classes -1",
     "no"},
    /* elementwise */
    {FN(ct_selu), "F.selu", "elu with SELU's alpha and scale", "yes (`cti_bw_elu`)"},
    {FN(ct_celu), "F.celu", "elu with alpha and input scale 1 / alpha", "yes (`cti_bw_elu`)"},
    {FN(ct_fmod_scalar), "torch.fmod(x, s)", "fmod with a 0-d operand", "yes (`cti_bw_add`)"},
    {FN(ct_remainder_scalar), "torch.remainder(x, s)", "remainder with a 0-d operand",
     "yes (`cti_bw_add`)"},
    {FN(ct_bitwise_and_scalar), "torch.bitwise_and(x, s)", "bitwise_and with a 0-d operand",
     "no"},
    {FN(ct_bitwise_or_scalar), "torch.bitwise_or(x, s)", "bitwise_or with a 0-d operand", "no"},
    {FN(ct_bitwise_xor_scalar), "torch.bitwise_xor(x, s)", "bitwise_xor with a 0-d operand",
     "no"},
    {FN(ct_bitwise_left_shift_scalar), "torch.bitwise_left_shift(x, s)",
     "bitwise_left_shift with a 0-d operand", "no"},
    {FN(ct_bitwise_right_shift_scalar), "torch.bitwise_right_shift(x, s)",
     "bitwise_right_shift with a 0-d operand", "no"},
    {FN(ct_lerp_scalar), "torch.lerp (a number weight)", "lerp with a 0-d weight",
     "yes (`cti_bw_lerp`)"},
    {FN(ct_clamp_tensor), "torch.clamp (tensor min, max)", "maximum, minimum", "yes"},
    /* losses */
    {FN(ct_binary_cross_entropy), "F.binary_cross_entropy",
     "log, sub, clamp, mul, add, neg; mul (weight); mean or sum", "yes"},
    {FN(ct_binary_cross_entropy_with_logits), "F.binary_cross_entropy_with_logits",
     "neg, softplus, sub, mul, add; pos_weight: sub, mul, add, mul; weight: mul; mean or sum",
     "yes"},
    {FN(ct_l1_loss), "F.l1_loss", "sub, abs; mean or sum", "yes"},
    {FN(ct_smooth_l1_loss), "F.smooth_l1_loss",
     "sub, abs, mul, lt, where (beta 0: as ct_l1_loss); mean or sum", "yes"},
    {FN(ct_huber_loss), "F.huber_loss", "sub, abs, mul, lt, where; mean or sum", "yes"},
    {FN(ct_kl_div), "F.kl_div",
     "log_target: exp, sub, mul; else eq, fill, where, log, mul, sub; mean, sum, or sum and div "
     "(batchmean)",
     "yes"},
    {FN(ct_cosine_similarity), "F.cosine_similarity",
     "norm, clamp and sub (without grad), add, div, mul, sum", "yes"},
    {FN(ct_cosine_embedding_loss), "F.cosine_embedding_loss",
     "mul, sum, add, sqrt, div, eq, sub, clamp, where; mean or sum", "yes"},
    {FN(ct_margin_ranking_loss), "F.margin_ranking_loss", "sub, mul, neg, add, clamp; mean or sum",
     "yes"},
    {FN(ct_cross_entropy_prob), "F.cross_entropy (class probabilities)",
     "log_softmax; mul, add (label smoothing); mul (weight); mul, sum, neg; sum and div (mean) "
     "or sum",
     "yes"},
    /* linear algebra and layers */
    {FN(ct_dot), "torch.dot", "mm (as ct_matmul)", "yes (`cti_bw_matmul`)"},
    {FN(ct_outer), "torch.outer", "mul of unsqueezed views", "yes"},
    {FN(ct_einsum), "torch.einsum",
     "bmm after permutes and reshapes (copy where the strides need it); mul by an eye (fill) "
     "for a repeated label; sum for a label summed out",
     "yes"},
    {FN(ct_baddbmm), "torch.baddbmm", "bmm, mul, add", "yes"},
    {FN(ct_group_norm), "F.group_norm",
     "batch_norm over [1, N groups, *], mul and add (weight, bias)", "yes"},
    {FN(ct_instance_norm), "F.instance_norm",
     "batch_norm over [1, N C, *], mul and add (weight, bias); the running statistics: mean, "
     "mul, then mul and add in place; eval: as ct_batch_norm",
     "yes"},
    {FN(ct_conv1d), "F.conv1d", "conv2d on unsqueezed views", "yes"},
    {FN(ct_conv_transpose2d), "F.conv_transpose2d", "conv2d_backward_input, add (bias)",
     "yes (`cti_bw_conv_transpose2d`, then add's)"},
    {FN(ct_max_pool1d), "F.max_pool1d", "max_pool2d on unsqueezed views", "yes"},
    {FN(ct_avg_pool1d), "F.avg_pool1d", "avg_pool2d on unsqueezed views", "yes"},
};

/* Public functions of include/tensor/ops.h that run no op: the autocast
 * regions' switches (they change or read this thread's autocast setting).
 * Neither table has a row for them. */
static const struct {
    const char *function;
    any_fn address;
} not_ops[] = {
    {FN(ct_autocast_begin)},   {FN(ct_autocast_begin_disabled)}, {FN(ct_autocast_end)},
    {FN(ct_autocast_enabled)}, {FN(ct_autocast_dtype)},       {FN(ct_autocast_set_lasting_casts)},
    {FN(ct_autocast_lasting_casts)},
};

#define N_COMPOSITES ((int)(sizeof composites / sizeof composites[0]))
#define N_NOT_OPS ((int)(sizeof not_ops / sizeof not_ops[0]))

/* ---- the checks ----------------------------------------------------------------------- */

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0, got;
    char *s = malloc(cap);
    while (s && (got = fread(s + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) {
            char *more = realloc(s, cap *= 2);
            if (!more) free(s);
            s = more; /* NULL ends the loop and the read */
        }
    }
    fclose(f);
    if (s) s[len] = '\0';
    return s;
}

/* The text of every .c and .inc file in dir, concatenated (NULL on error). */
static char *read_tests(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "ops_doc: cannot open %s\n", dir);
        return NULL;
    }
    char *all = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&all, &size);
    struct dirent *e;
    while (out && (e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        bool src = (nl > 2 && !strcmp(e->d_name + nl - 2, ".c")) ||
                   (nl > 4 && !strcmp(e->d_name + nl - 4, ".inc"));
        if (!src || !strcmp(e->d_name, "ops_doc.c")) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *text = read_file(path);
        if (text) fputs(text, out);
        free(text);
    }
    closedir(d);
    if (out) fclose(out);
    return all;
}

/* Whether text calls fn or passes it as a value (a test table's row):
 * fn as a whole identifier followed by "(", ",", ")" or "}". */
static bool calls(const char *text, const char *fn) {
    size_t n = strlen(fn);
    for (const char *p = strstr(text, fn); p; p = strstr(p + 1, fn)) {
        char before = p == text ? ' ' : p[-1];
        bool ident = (before >= 'a' && before <= 'z') || (before >= 'A' && before <= 'Z') ||
                     (before >= '0' && before <= '9') || before == '_';
        if (!ident && p[n] && strchr("(,)}", p[n])) return true;
    }
    return false;
}

static int check_ops(const char *tests) {
    int bad = 0;
    for (int k = 0; k < CT_NUM_OPS; k++) {
        const cti_op_info *r = &cti_schema_rows[k];
        char fn[128];
        function_of(r->name, fn, sizeof fn);
        bool cpu = false;
        for (int d = 0; d < CT_NUM_DTYPES; d++) cpu |= ct_supports((ct_op)k, CT_DEVICE_CPU, d);
        if (!cpu) {
            fprintf(stderr, "ops_doc: op %s has no CPU kernel\n", r->name);
            bad++;
        }
        if (r->grad == CTI_GRAD_FORMULA && !formulas[k][0]) {
            fprintf(stderr, "ops_doc: op %s is differentiable but has no formula\n", r->name);
            bad++;
        }
        if (!dlsym(RTLD_DEFAULT, fn)) {
            fprintf(stderr,
                    "ops_doc: op %s: its C function %s is not exported (name it in "
                    "tests/ops_doc.c's table)\n",
                    r->name, fn);
            bad++;
        } else if (!calls(tests, fn)) {
            fprintf(stderr, "ops_doc: op %s: no test calls %s\n", r->name, fn);
            bad++;
        }
    }
    return bad;
}

/* The functions a header declares: every identifier ct_... followed by "("
 * outside comments (the header declares no function pointers and calls no
 * function). out[] gets pointers into text, which is rewritten in place;
 * returns the count, or -1 when there are more than max. */
static int declared_functions(char *text, const char **out, int max) {
    /* comments become spaces, so nothing in them is read */
    for (char *p = text; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            char *end = strstr(p + 2, "*/");
            char *stop = end ? end + 2 : p + strlen(p);
            memset(p, ' ', (size_t)(stop - p));
            p = stop - 1;
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n') *p++ = ' ';
            if (!*p) break;
        }
    }
    int n = 0;
    for (char *p = strstr(text, "ct_"); p; p = strstr(p, "ct_")) {
        char before = p == text ? ' ' : p[-1];
        size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        char *after = p + len;
        while (*after == ' ' || *after == '\t' || *after == '\n') after++;
        bool ident = (before >= 'a' && before <= 'z') || (before >= 'A' && before <= 'Z') ||
                     (before >= '0' && before <= '9') || before == '_';
        bool cut = false;
        if (!ident && *after == '(') {
            if (n == max) return -1;
            p[len] = '\0'; /* the name ends the string; its "(" is past it */
            out[n++] = p;
            cut = true;
        }
        p += len + cut;
    }
    return n;
}

static bool is_op_function(const char *fn) {
    for (int k = 0; k < CT_NUM_OPS; k++) {
        char own[128];
        function_of(cti_schema_rows[k].name, own, sizeof own);
        if (!strcmp(own, fn)) return true;
    }
    return false;
}

static int composite_row(const char *fn) {
    for (int i = 0; i < N_COMPOSITES; i++)
        if (!strcmp(composites[i].function, fn)) return i;
    return -1;
}

static int not_op_row(const char *fn) {
    for (int i = 0; i < N_NOT_OPS; i++)
        if (!strcmp(not_ops[i].function, fn)) return i;
    return -1;
}

static bool is_declared(const char *fn, const char *const *decl, int ndecl) {
    for (int i = 0; i < ndecl; i++)
        if (!strcmp(decl[i], fn)) return true;
    return false;
}

/* A C function of a row: declared in the header once, in one table only,
 * exported, called by a test. */
static int check_row(const char *fn, const char *const *decl, int ndecl, const char *header,
                     const char *tests) {
    int bad = 0;
    if (!is_declared(fn, decl, ndecl)) {
        fprintf(stderr, "ops_doc: %s has a row in tests/ops_doc.c but %s does not declare it\n",
                fn, header);
        bad++;
    }
    if (is_op_function(fn)) {
        fprintf(stderr,
                "ops_doc: %s is an op's C function (the op table has its row) and has a row "
                "in tests/ops_doc.c too\n",
                fn);
        bad++;
    }
    if (!dlsym(RTLD_DEFAULT, fn)) {
        fprintf(stderr, "ops_doc: %s is not exported\n", fn);
        bad++;
    } else if (!calls(tests, fn)) {
        fprintf(stderr, "ops_doc: no test calls %s\n", fn);
        bad++;
    }
    return bad;
}

/* The functions of header against the op table, composites and not_ops. */
static int check_functions(const char *header, const char *tests) {
    char *text = read_file(header);
    if (!text) {
        fprintf(stderr, "ops_doc: cannot read %s\n", header);
        return 1;
    }
    enum { MAX_DECL = 1024 };
    static const char *decl[MAX_DECL];
    int ndecl = declared_functions(text, decl, MAX_DECL), bad = 0;
    if (ndecl < 0) {
        fprintf(stderr, "ops_doc: %s declares more than %d functions\n", header, MAX_DECL);
        free(text);
        return 1;
    }
    for (int i = 0; i < ndecl; i++) {
        const char *fn = decl[i];
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(decl[j], fn);
        if (seen || is_op_function(fn) || composite_row(fn) >= 0 || not_op_row(fn) >= 0) continue;
        fprintf(stderr,
                "ops_doc: %s is declared in %s but has no row: give it one in the table of "
                "functions made of ops (`composites` in tests/ops_doc.c), or list it in "
                "`not_ops` when it runs no op\n",
                fn, header);
        bad++;
    }
    for (int i = 0; i < N_COMPOSITES; i++) {
        const composite *c = &composites[i];
        if (composite_row(c->function) != i) {
            fprintf(stderr, "ops_doc: %s has two rows in tests/ops_doc.c\n", c->function);
            bad++;
        }
        const char *cells[3] = {c->torch, c->runs, c->grad};
        for (int k = 0; k < 3; k++)
            if (!cells[k][0] || strchr(cells[k], '|') || strchr(cells[k], '\n')) {
                fprintf(stderr, "ops_doc: the row of %s has an empty cell or one with '|' or a "
                                "line break\n",
                        c->function);
                bad++;
            }
        bad += check_row(c->function, decl, ndecl, header, tests);
    }
    for (int i = 0; i < N_NOT_OPS; i++) {
        if (not_op_row(not_ops[i].function) != i || composite_row(not_ops[i].function) >= 0) {
            fprintf(stderr, "ops_doc: %s has two rows in tests/ops_doc.c\n", not_ops[i].function);
            bad++;
        }
        bad += check_row(not_ops[i].function, decl, ndecl, header, tests);
    }
    free(text);
    return bad;
}

/* ---- the table ------------------------------------------------------------------------ */

static char *table(void) {
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    if (!f) return NULL;
    fprintf(f, "# The op set\n\n"
               "Generated by `tests/ops_doc.c` from the op schema (`src/dispatch/schema.h`) and "
               "the kernels the CPU\nbackend and the CUDA module register; `meson test ops_doc` "
               "fails when this file differs\nfrom what it generates (`ninja -C build ops-doc` "
               "rewrites it). One row per dispatchable op:\nthe C function that runs it, the "
               "PyTorch name it mirrors, whether autograd differentiates it\n(its formula and "
               "the backward op whose kernels the formula runs), and the dtypes with a kernel\n"
               "on each device. Functions made of other ops (`ct_linear`, `ct_matmul`, `ct_std`, "
               "the losses\nof several ops, ...) are in the second table, below this one.\n\n");
    fprintf(f, "| op | C | PyTorch | differentiable | CPU | CUDA |\n");
    fprintf(f, "| --- | --- | --- | --- | --- | --- |\n");
    for (int k = 0; k < CT_NUM_OPS; k++) {
        char fn[128], torch[160], grad[160], cpu[64], cuda[64];
        function_of(cti_schema_rows[k].name, fn, sizeof fn);
        torch_of(k, torch, sizeof torch);
        grad_of(k, grad, sizeof grad);
        dtypes_of(k, CT_DEVICE_CPU, cpu, sizeof cpu);
        dtypes_of(k, CT_DEVICE_CUDA, cuda, sizeof cuda);
        fprintf(f, "| %s | `%s` | %s | %s | %s | %s |\n", cti_schema_rows[k].name, fn, torch,
                grad, cpu, cuda);
    }
    fprintf(f, "\n%d ops.\n", CT_NUM_OPS);
    fclose(f);
    return text;
}

/* The heading that begins the section of functions made of ops; what
 * precedes it is the op table. */
static const char section_mark[] = "\n## Functions made of ops\n";

static char *section(void) {
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    if (!f) return NULL;
    fprintf(f, "%s\n", section_mark);
    fprintf(f, "The public functions of `include/tensor/ops.h` that are no op's C function: "
               "each runs ops of the\ntable above (or only makes views), so it has no kernel of "
               "its own and runs on the devices\nand dtypes those ops have kernels for. One row "
               "per function: the PyTorch name it mirrors,\nthe ops it runs (by their schema "
               "names), and whether autograd differentiates it: yes\nwhen it records the nodes "
               "of the ops it runs, yes with a formula when it records one node\nof its own "
               "with that formula. The rows are `composites` in `tests/ops_doc.c`, which holds\n"
               "each function's address; `meson test ops_doc` fails when a function declared "
               "in\n`include/tensor/ops.h` has a row in neither table, when a row names a "
               "function not declared\nthere, or when no test calls one. This section needs no "
               "CUDA module: a build without\nCUDA checks and rewrites it alone.\n\n");
    fprintf(f, "| C | PyTorch | runs | differentiable |\n");
    fprintf(f, "| --- | --- | --- | --- |\n");
    for (int i = 0; i < N_COMPOSITES; i++)
        fprintf(f, "| `%s` | %s | %s | %s |\n", composites[i].function, composites[i].torch,
                composites[i].runs, composites[i].grad);
    fprintf(f, "\n%d functions.\n\nNot ops, in neither table (they open, close and read this "
               "thread's autocast regions,\nas `torch.autocast`, and run nothing):",
            N_COMPOSITES);
    for (int i = 0; i < N_NOT_OPS; i++)
        fprintf(f, "%s`%s`", i ? ", " : " ", not_ops[i].function);
    fprintf(f, ".\n");
    fclose(f);
    return text;
}

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "ops_doc: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

/* Without the CUDA module: FILE's op table stays as it is and only the
 * section is checked or rewritten. */
static int section_only(bool write, const char *path, const char *sec) {
    char *have = read_file(path);
    if (!have) {
        fprintf(stderr, "ops_doc: cannot read %s (its op table needs the CUDA module)\n", path);
        return 1;
    }
    char *mark = strstr(have, section_mark);
    int status = 0;
    if (write) {
        if (mark) *mark = '\0';
        char *text = NULL;
        if (asprintf(&text, "%s%s", have, sec) < 0) text = NULL;
        status = text ? write_file(path, text) : 1;
        if (!status)
            printf("ops_doc: wrote the %d functions made of ops into %s; its op table left "
                   "alone\n",
                   N_COMPOSITES, path);
        free(text);
    } else if (!mark || strcmp(mark, sec)) {
        fprintf(stderr,
                "ops_doc: the section \"Functions made of ops\" of %s is not what "
                "tests/ops_doc.c's table gives; rewrite it with `ninja -C BUILD ops-doc`\n",
                path);
        status = 1;
    } else {
        printf("ops_doc: the %d functions made of ops in %s match; its op table not compared\n",
               N_COMPOSITES, path);
    }
    free(have);
    return status;
}

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[1], "--write") && strcmp(argv[1], "--check"))) {
        fprintf(stderr, "usage: ops_doc --write|--check FILE TESTS_DIR OPS_H\n");
        return 2;
    }
    bool write = !strcmp(argv[1], "--write");
    const char *path = argv[2];
    char *tests = read_tests(argv[3]);
    if (!tests) return 1;
    int bad = check_ops(tests) + check_functions(argv[4], tests);
    free(tests);
    char *sec = section();
    if (!sec) return 1;
    if (!ct_backend_available(CT_DEVICE_CUDA)) {
        printf("ops_doc: the CUDA module did not load (%s)\n", cti_backend_missing(CT_DEVICE_CUDA));
        int st = section_only(write, path, sec);
        free(sec);
        return bad || st ? 1 : 0;
    }
    char *ops = table();
    char *want = NULL;
    if (!ops || asprintf(&want, "%s%s", ops, sec) < 0) want = NULL;
    free(ops);
    free(sec);
    if (!want) return 1;
    int status = bad ? 1 : 0;
    if (write) {
        if (write_file(path, want)) status = 1;
        else printf("ops_doc: wrote %s (%d ops, %d functions made of ops)\n", path, CT_NUM_OPS,
                    N_COMPOSITES);
    } else {
        char *have = read_file(path);
        if (!have || strcmp(have, want)) {
            fprintf(stderr,
                    "ops_doc: %s is not what the schema, the kernels and tests/ops_doc.c's table "
                    "give; rewrite it with `ninja -C BUILD ops-doc` (a build with the CUDA "
                    "module)\n",
                    path);
            status = 1;
        } else {
            printf("ops_doc: %s matches (%d ops, %d functions made of ops)\n", path, CT_NUM_OPS,
                   N_COMPOSITES);
        }
        free(have);
    }
    free(want);
    return status;
}
