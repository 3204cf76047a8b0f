/* docs/OPS.md from the op schema and the kernel table, and the checks that
 * keep the op set whole:
 *
 *   ops_doc --write FILE TESTS_DIR   writes the coverage table to FILE
 *   ops_doc --check FILE TESTS_DIR   fails when FILE differs from what
 *                                    --write would write, or when an op
 *                                    lacks a CPU kernel, a differentiable op
 *                                    lacks its formula, an op's C function
 *                                    is not exported, or no test under
 *                                    TESTS_DIR calls it
 *
 * The CUDA column needs the CUDA module loaded: meson runs this with the
 * toolkit's stub driver in front (no GPU needed). Where the module does not
 * load (a build without CUDA), --check runs the other checks and leaves the
 * file alone; a table is only written with the module. */
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
    if (r->grad == CTI_GRAD_FORMULA)
        snprintf(buf, n, "yes (`%s`%s%s)", formulas[k], r->backward >= 0 ? ", " : "",
                 r->backward >= 0 ? cti_schema_rows[r->backward].name : "");
    else if (r->grad == CTI_GRAD_NOFORMULA)
        snprintf(buf, n, "no formula");
    else
        snprintf(buf, n, "no");
}

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
            if (!more) {
                free(s);
                s = NULL;
            }
            s = more;
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
               "on each device. Ops made of other ops (`ct_linear`, `ct_matmul`, the views, "
               "`ct_std`, ...)\nhave no row of their own.\n\n");
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

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[1], "--write") && strcmp(argv[1], "--check"))) {
        fprintf(stderr, "usage: ops_doc --write|--check FILE TESTS_DIR\n");
        return 2;
    }
    bool write = !strcmp(argv[1], "--write");
    const char *path = argv[2];
    char *tests = read_tests(argv[3]);
    if (!tests) return 1;
    int bad = check_ops(tests);
    free(tests);
    bool cuda = ct_backend_available(CT_DEVICE_CUDA);
    if (!cuda) {
        printf("ops_doc: the CUDA module did not load (%s): %s left alone\n",
               cti_backend_missing(CT_DEVICE_CUDA), path);
        return bad ? 1 : write ? 1 : 0;
    }
    char *want = table();
    if (!want) return 1;
    int status = bad ? 1 : 0;
    if (write) {
        FILE *f = fopen(path, "wb");
        if (!f || fputs(want, f) < 0 || fclose(f) != 0) {
            fprintf(stderr, "ops_doc: cannot write %s\n", path);
            status = 1;
        } else {
            printf("ops_doc: wrote %s (%d ops)\n", path, CT_NUM_OPS);
        }
    } else {
        char *have = read_file(path);
        if (!have || strcmp(have, want)) {
            fprintf(stderr,
                    "ops_doc: %s is not what the schema and the kernels give; rewrite it with "
                    "`ninja -C BUILD ops-doc` (a build with the CUDA module)\n",
                    path);
            status = 1;
        } else {
            printf("ops_doc: %s matches (%d ops)\n", path, CT_NUM_OPS);
        }
        free(have);
    }
    free(want);
    return status;
}
