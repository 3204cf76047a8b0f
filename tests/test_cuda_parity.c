/* GPU against CPU for every (op, dtype) the dispatch table has a CUDA kernel
 * for. The list of pairs comes from the table itself (ct_supports); each op
 * has a case below that builds fresh random inputs, runs the public function
 * on CPU tensors and on the same values moved to the GPU (contiguous,
 * broadcast, non-contiguous, scalar operands), and compares the results with
 * a tolerance per dtype. A kernel registered for CUDA without a case fails
 * the suite, so no kernel skips parity; that check needs the module loaded
 * but no GPU, and meson runs it alone ("cases") with the toolkit's stub
 * driver, so it runs on every machine that builds CUDA. The rest is skipped
 * without a usable GPU. TF32 stays off, so float32 matmuls are compared at
 * float32 precision. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "cuda_module.h"

#include "test_fixture.h"
#include "unary_ops.inc"

#include "dispatch/dispatch_impl.h"

static int ngpu;

/* ---- tolerances ----------------------------------------------------------------------- */
static double rtol_of(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-12;
    case CT_F32: return 1e-5;
    case CT_F16: return 1e-2;
    case CT_BF16: return 2e-2;
    default: return 0;
    }
}

/* ---- cases ------------------------------------------------------------------------------- */
typedef ct_tensor *(*uop_fn)(ct_tensor *);
typedef ct_tensor *(*bop_fn)(ct_tensor *, ct_tensor *);
typedef ct_tensor *(*sop_fn)(ct_tensor *, double);

typedef struct pcase pcase;
struct pcase {
    ct_op op;
    int nvariants;
    /* CPU inputs for variant v (fresh random values); returns their count.
     * *noncontig: make the GPU copies non-contiguous. */
    int (*inputs)(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *noncontig);
    /* Runs the op on in (on dev) into out; returns the number of outputs. */
    int (*run)(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
               ct_tensor **out);
    uop_fn u;
    bop_fn b;
    sop_fn s;
    double lo, hi;   /* floating input range */
    int64_t ilo, ihi; /* integer input range */
    double atol;     /* absolute tolerance, in units of the dtype's rtol */
};

static ct_tensor *rnd(const pcase *pc, ct_dtype dt, int ndim, const int64_t *shape) {
    bool flt = ct_dtype_is_floating(dt);
    return tu_rand(ndim, shape, dt, flt ? pc->lo : (double)pc->ilo, flt ? pc->hi : (double)pc->ihi,
                   NULL);
}

/* ---- elementwise --------------------------------------------------------------------------- */
static int unary_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    *nc = v == 1;
    in[0] = v == 0 ? rnd(pc, dt, CT_SHAPE(257, 33)) : rnd(pc, dt, CT_SHAPE(5, 6, 7));
    return 1;
}
static int unary_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                     ct_tensor **out) {
    (void)dt, (void)v, (void)dev;
    out[0] = pc->u(in[0]);
    return 1;
}

/* The shared unary rows (unary_ops.inc) as functions of x. */
#define UN_FN_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi)                           \
    static ct_tensor *un_##nm(ct_tensor *x) { return call; }
CT_UNARY_OPS(UN_FN_)
CT_UNARY_VARIANTS(UN_FN_)
#undef UN_FN_

static const struct {
    ct_op op;
    uop_fn fn;
} un_rows[] = {
#define UN_ENTRY_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi) {CT_OP_##ID, un_##nm},
    CT_UNARY_OPS(UN_ENTRY_)
    CT_UNARY_VARIANTS(UN_ENTRY_)
#undef UN_ENTRY_
};

/* Every row of the case's op: the variants test its other parameters. */
static int unary_rows_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                          ct_tensor **out) {
    (void)dt, (void)v, (void)dev;
    int n = 0;
    for (size_t k = 0; k < sizeof un_rows / sizeof un_rows[0]; k++)
        if (un_rows[k].op == pc->op) out[n++] = un_rows[k].fn(in[0]);
    return n;
}

static int clamp_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                     ct_tensor **out) {
    (void)pc, (void)dev;
    bool flt = ct_dtype_is_floating(dt);
    out[0] = v == 0 ? ct_clamp(in[0], flt ? -0.75 : -3, flt ? 1.5 : 4)
                    : ct_clamp(in[0], flt ? 0.25 : 1, flt ? -1.0 : -2); /* min > max */
    return 1;
}

/* Variants: 0 same shape, 1 broadcast, 2 non-contiguous, 3 tensor-scalar,
 * 4 scalar-tensor (rsub) or a 0-d tensor operand. */
static int binary_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    *nc = v == 2;
    switch (v) {
    case 0:
        in[0] = rnd(pc, dt, CT_SHAPE(257, 33));
        in[1] = rnd(pc, dt, CT_SHAPE(257, 33));
        return 2;
    case 1:
        in[0] = rnd(pc, dt, CT_SHAPE(6, 1, 35));
        in[1] = rnd(pc, dt, CT_SHAPE(4, 35));
        return 2;
    case 2:
        in[0] = rnd(pc, dt, CT_SHAPE(5, 6, 7));
        in[1] = rnd(pc, dt, CT_SHAPE(5, 6, 7));
        return 2;
    case 3:
        in[0] = rnd(pc, dt, CT_SHAPE(1000, 9));
        return 1;
    default:
        in[0] = rnd(pc, dt, CT_SHAPE(33, 17));
        in[1] = rnd(pc, dt, CT_NONE);
        return 2;
    }
}

/* A scalar of the tensor's own category, inside the op's input range. */
static double scalar_for(const pcase *pc, ct_dtype dt) {
    if (ct_dtype_is_floating(dt)) return pc->lo + 0.375 * (pc->hi - pc->lo);
    if (dt == CT_BOOL) return 1;
    return (double)(pc->ilo + (pc->ihi - pc->ilo) / 3);
}

static int binary_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                      ct_tensor **out) {
    (void)dev;
    if (v == 3) {
        out[0] = pc->s(in[0], scalar_for(pc, dt));
        return 1;
    }
    out[0] = pc->b(in[0], in[1]);
    return 1;
}

static ct_tensor *add_alpha(ct_tensor *a, ct_tensor *b) {
    ct_dtype dt = ct_tensor_dtype(a);
    return dt == CT_BOOL ? ct_add(a, b) : ct_add_alpha(a, b, ct_dtype_is_floating(dt) ? 0.625 : 3);
}
static ct_tensor *sub_alpha(ct_tensor *a, ct_tensor *b) {
    return ct_sub_alpha(a, b, ct_dtype_is_floating(ct_tensor_dtype(a)) ? -1.25 : -2);
}

/* add: alpha variants besides the plain op. */
static int add_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                   ct_tensor **out) {
    if (v < 3) {
        out[0] = pc->b(in[0], in[1]);
        out[1] = pc->op == CT_OP_ADD ? add_alpha(in[0], in[1]) : sub_alpha(in[0], in[1]);
        return 2;
    }
    if (v == 3 && pc->op == CT_OP_SUB) {
        out[0] = ct_sub_scalar(in[0], scalar_for(pc, dt));
        out[1] = ct_rsub_scalar(in[0], scalar_for(pc, dt));
        return 2;
    }
    return binary_run(pc, dt, v, dev, in, out);
}

static int where_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    *nc = v == 2;
    if (v == 1) {
        in[0] = tu_rand(CT_SHAPE(6, 1), CT_BOOL, 0, 2, NULL);
        in[1] = rnd(pc, dt, CT_SHAPE(1, 35));
        in[2] = rnd(pc, dt, CT_SHAPE(6, 35));
    } else {
        in[0] = tu_rand(CT_SHAPE(65, 67), CT_BOOL, 0, 2, NULL);
        in[1] = rnd(pc, dt, CT_SHAPE(65, 67));
        in[2] = rnd(pc, dt, CT_SHAPE(65, 67));
    }
    return 3;
}
static int where_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                     ct_tensor **out) {
    (void)pc, (void)dt, (void)v, (void)dev;
    out[0] = ct_where(in[0], in[1], in[2]);
    return 1;
}

/* ---- reductions ---------------------------------------------------------------------------------
 * Variants: 0 [5, 6, 7], 1 the same non-contiguous, 2 [4, 20000] (rows split
 * over blocks), 3 [20000, 3] (columns split), 4 [3, 0, 4] (empty reduced dim);
 * sums and means also 5 [20000, 48] (the 16-byte column kernel, split) and 6
 * [3000, 56] seen through column windows of 40: 8 columns in (16-byte
 * aligned rows for 2-byte dtypes) and 1 column in (never aligned). */
static int red_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    *nc = v == 1;
    switch (v) {
    case 0:
    case 1: in[0] = rnd(pc, dt, CT_SHAPE(5, 6, 7)); break;
    case 2: in[0] = rnd(pc, dt, CT_SHAPE(4, 20000)); break;
    case 3: in[0] = rnd(pc, dt, CT_SHAPE(20000, 3)); break;
    case 4: in[0] = rnd(pc, dt, CT_SHAPE(3, 0, 4)); break;
    case 5: in[0] = rnd(pc, dt, CT_SHAPE(20000, 48)); break;
    default: in[0] = rnd(pc, dt, CT_SHAPE(3000, 56)); break;
    }
    return 1;
}

static int red_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                   ct_tensor **out) {
    (void)dt, (void)dev;
    ct_tensor *x = in[0];
    bool big = v == 2 || v == 3;
    int n = 0;
    switch (pc->op) {
    case CT_OP_SUM:
    case CT_OP_MEAN:
    case CT_OP_PROD: {
        ct_tensor *(*f)(ct_tensor *, int, const int64_t *, bool) =
            pc->op == CT_OP_SUM ? ct_sum : pc->op == CT_OP_MEAN ? ct_mean : ct_prod;
        if (v == 4) {
            out[n++] = f(x, CT_DIMS(1), false);
            return n;
        }
        if (v == 5) {
            out[n++] = f(x, CT_DIMS(0), false);
            out[n++] = f(ct_unsqueeze(x, 0), CT_DIMS(0, 1), true);
            return n;
        }
        if (v == 6) {
            out[n++] = f(ct_narrow(x, 1, 8, 40), CT_DIMS(0), false);
            out[n++] = f(ct_narrow(x, 1, 1, 40), CT_DIMS(0), false);
            return n;
        }
        out[n++] = f(x, CT_NONE, false);
        out[n++] = f(x, CT_DIMS(1), false);
        out[n++] = big ? f(x, CT_DIMS(0), true) : f(x, CT_DIMS(0, 2), true);
        return n;
    }
    case CT_OP_VAR:
        if (v == 4) {
            out[n++] = ct_var(x, CT_DIMS(1), 1, false);
            return n;
        }
        out[n++] = ct_var(x, CT_NONE, 1, false);
        out[n++] = ct_std(x, CT_DIMS(1), 0, false);
        out[n++] = big ? ct_var(x, CT_DIMS(0), 1, true) : ct_std(x, CT_DIMS(2, 0), 1, true);
        return n;
    case CT_OP_NORM:
        if (v == 4) {
            out[n++] = ct_norm(x, 2, CT_DIMS(1), false);
            out[n++] = ct_norm(x, 3, CT_DIMS(1), false);
            return n;
        }
        out[n++] = ct_norm(x, 2, CT_NONE, false);
        out[n++] = ct_norm(x, 1, CT_DIMS(1), false);
        out[n++] = ct_norm(x, INFINITY, CT_DIMS(0), false);
        out[n++] = ct_norm(x, -INFINITY, CT_DIMS(1), true);
        out[n++] = ct_norm(x, 0, CT_DIMS(0), false);
        out[n++] = big ? ct_norm(x, 3, CT_DIMS(0), false) : ct_norm(x, 3, CT_DIMS(0, 2), false);
        return n;
    case CT_OP_MAX:
    case CT_OP_MIN: {
        bool mx = pc->op == CT_OP_MAX;
        ct_tensor *idx = NULL;
        if (v == 4) { /* the zero-size dim is kept: an empty result */
            out[n++] = mx ? ct_max_dim(x, 2, false, &idx) : ct_min_dim(x, 2, false, &idx);
            out[n++] = idx;
            return n;
        }
        out[n++] = mx ? ct_max(x) : ct_min(x);
        out[n++] = mx ? ct_max_dim(x, 1, false, &idx) : ct_min_dim(x, 1, false, &idx);
        out[n++] = idx;
        idx = NULL;
        out[n++] = mx ? ct_max_dim(x, 0, true, &idx) : ct_min_dim(x, 0, true, &idx);
        out[n++] = idx;
        return n;
    }
    default: {
        bool mx = pc->op == CT_OP_ARGMAX;
        if (v == 4) {
            out[n++] = mx ? ct_argmax(x, 2, true) : ct_argmin(x, 2, true);
            return n;
        }
        out[n++] = mx ? ct_argmax_all(x) : ct_argmin_all(x);
        out[n++] = mx ? ct_argmax(x, 1, false) : ct_argmin(x, 1, false);
        out[n++] = mx ? ct_argmax(x, 0, true) : ct_argmin(x, 0, true);
        return n;
    }
    }
}

/* ---- matrix products -------------------------------------------------------------------------------
 * Variants: 0 plain, 1 transposed operands, 2 non-contiguous (packed), 3
 * broadcast / other front ends, 4 k = 0. */
static int mm_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    *nc = v == 2;
    bool bmm = pc->op == CT_OP_BMM;
    int nin = 0;
    if (pc->op == CT_OP_ADDMM) in[nin++] = rnd(pc, dt, CT_SHAPE(29));
    int64_t k = v == 4 ? 0 : 47;
    if (v == 1) { /* stored transposed: the run transposes them back */
        in[nin++] = bmm ? rnd(pc, dt, CT_SHAPE(3, k, 33)) : rnd(pc, dt, CT_SHAPE(k, 33));
        in[nin++] = bmm ? rnd(pc, dt, CT_SHAPE(3, 29, k)) : rnd(pc, dt, CT_SHAPE(29, k));
    } else if (v == 3 && bmm) {
        in[nin++] = rnd(pc, dt, CT_SHAPE(2, 3, 33, k));
        in[nin++] = rnd(pc, dt, CT_SHAPE(3, k, 29));
    } else {
        in[nin++] = bmm ? rnd(pc, dt, CT_SHAPE(3, 33, k)) : rnd(pc, dt, CT_SHAPE(33, k));
        in[nin++] = bmm ? rnd(pc, dt, CT_SHAPE(3, k, 29)) : rnd(pc, dt, CT_SHAPE(k, 29));
    }
    return nin;
}

static int mm_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                  ct_tensor **out) {
    (void)dt, (void)dev;
    int ia = pc->op == CT_OP_ADDMM ? 1 : 0;
    ct_tensor *a = in[ia], *b = in[ia + 1];
    if (v == 1) {
        a = ct_transpose(a, -1, -2);
        b = ct_transpose(b, -1, -2);
    }
    int n = 0;
    switch (pc->op) {
    case CT_OP_MM:
        out[n++] = ct_mm(a, b);
        if (v == 3) {
            out[n++] = ct_linear(a, ct_t(b), NULL);
            out[n++] = ct_matmul(a, ct_select(b, 1, 4)); /* matrix @ vector */
        }
        return n;
    case CT_OP_BMM:
        out[n++] = v == 3 ? ct_matmul(a, b) : ct_bmm(a, b);
        return n;
    default:
        out[n++] = ct_addmm(in[0], a, b, 0.75, -1.5);
        out[n++] = ct_addmm(in[0], a, b, 0, 1);
        if (v == 3) out[n++] = ct_linear(a, ct_t(b), in[0]);
        return n;
    }
}

/* ---- linear's weight and bias gradients -----------------------------------------------------------
 * Variants: 0 [64, 40] and [64, 24] (the operands cuBLASLt's bias-gradient
 * epilogue takes), 1 leading dims [3, 5] and odd widths 33 and 17 (GEMM and
 * column sum), 2 non-contiguous, 3 each gradient alone, 4 no rows; 5 and 6
 * the gradients autograd widens (float32 from float16/bfloat16 operands,
 * src/autograd/formulas.h): 5 both (the epilogue's operands), 6 the weight's
 * alone, then a float32 weight gradient with a bias gradient in the
 * operands' dtype (GEMM and column sum). */
ct_status cti_linear_backward_weight_as(ct_tensor *grad_y, ct_tensor *x, ct_dtype dweight_dtype,
                                        ct_dtype dbias_dtype, ct_tensor **dweight,
                                        ct_tensor **dbias);

static const int64_t lbw_shapes[7][4] = {{0, 64, 40, 24}, {5, 3, 33, 17}, {0, 20, 16, 8},
                                         {0, 48, 24, 16}, {0, 0, 8, 16},  {0, 64, 40, 24},
                                         {0, 64, 40, 24}};

static int lbw_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    *nc = v == 2;
    const int64_t *s = lbw_shapes[v];
    if (s[0]) {
        in[0] = rnd(pc, dt, CT_SHAPE(s[1], s[0], s[2]));
        in[1] = rnd(pc, dt, CT_SHAPE(s[1], s[0], s[3]));
    } else {
        in[0] = rnd(pc, dt, CT_SHAPE(s[1], s[2]));
        in[1] = rnd(pc, dt, CT_SHAPE(s[1], s[3]));
    }
    return 2;
}

static int lbw_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                   ct_tensor **out) {
    (void)pc, (void)dev;
    ct_tensor *dw = NULL, *db = NULL;
    int n = 0;
    ct_dtype wide = dt == CT_F16 || dt == CT_BF16 ? CT_F32 : dt;
    if (v == 5 || v == 6) {
        bool both = v == 5;
        if (cti_linear_backward_weight_as(in[0], in[1], wide, wide, &dw, both ? &db : NULL) !=
            CT_OK)
            dw = db = NULL;
        out[n++] = dw;
        if (both) {
            out[n++] = db;
            return n;
        }
        if (cti_linear_backward_weight_as(in[0], in[1], wide, dt, &dw, &db) != CT_OK)
            dw = db = NULL;
        out[n++] = dw;
        out[n++] = db;
        return n;
    }
    if (v != 3) {
        if (ct_linear_backward_weight(in[0], in[1], &dw, &db) != CT_OK) dw = db = NULL;
        out[n++] = dw;
        out[n++] = db;
        return n;
    }
    if (ct_linear_backward_weight(in[0], in[1], &dw, NULL) != CT_OK) dw = NULL;
    out[n++] = dw;
    if (ct_linear_backward_weight(in[0], NULL, NULL, &db) != CT_OK) db = NULL;
    out[n++] = db;
    return n;
}

/* ---- the GELU MLP ---------------------------------------------------------------------------------
 * ct_mlp_gelu forward and backward (LINEAR_GELU's case: the output and the five
 * gradients) and ct_mlp_gelu_backward_hidden (LINEAR_DGELU's). Variants: 0 [64, 32] ->
 * 64 -> 24, tanh, biases (aligned operands), 1 the same with the exact form, 2 leading
 * dims [3, 5] and odd widths 33 -> 17 -> 5, 3 non-contiguous, 4 no biases, 5 no rows.
 * LINEAR_GELU's atol: w_in's gradient sums products over the rows that cancel,
 * with entries up to about 200; in variant 3 the CPU's bfloat16 gradient was
 * off float64's by up to 1.3 and float16's by 0.11 over 300 seeds, so two
 * devices may differ by twice that on a small entry. */
static const int64_t mlp_shapes[6][5] = {{0, 64, 32, 64, 24}, {0, 64, 32, 64, 24},
                                         {5, 3, 33, 17, 5},   {0, 20, 16, 32, 8},
                                         {0, 48, 16, 32, 16}, {0, 0, 16, 32, 8}};

static ct_gelu_approx mlp_approx(int v) { return v == 1 ? CT_GELU_NONE : CT_GELU_TANH; }

static ct_tensor *mlp_rows(const pcase *pc, ct_dtype dt, const int64_t *s, int64_t cols) {
    return s[0] ? rnd(pc, dt, CT_SHAPE(s[1], s[0], cols)) : rnd(pc, dt, CT_SHAPE(s[1], cols));
}

static int mlp_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    *nc = v == 3;
    const int64_t *s = mlp_shapes[v];
    in[0] = mlp_rows(pc, dt, s, s[2]);
    in[1] = rnd(pc, dt, CT_SHAPE(s[3], s[2]));
    in[2] = rnd(pc, dt, CT_SHAPE(s[4], s[3]));
    if (v == 4) return 3;
    in[3] = rnd(pc, dt, CT_SHAPE(s[3]));
    in[4] = rnd(pc, dt, CT_SHAPE(s[4]));
    return 5;
}

static int mlp_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                   ct_tensor **out) {
    (void)pc, (void)dt, (void)dev;
    int nin = v == 4 ? 3 : 5;
    for (int k = 0; k < nin; k++) ct_requires_grad_(in[k], true);
    ct_tensor *b1 = v == 4 ? NULL : in[3], *b2 = v == 4 ? NULL : in[4];
    ct_tensor *y = ct_mlp_gelu(in[0], in[1], b1, in[2], b2, mlp_approx(v));
    /* sum(y^2): gradients that differ from element to element (the scope frees the rest) */
    ct_tensor *l = y ? ct_sum(ct_mul(y, y), 0, NULL, false) : NULL;
    if (!l || ct_backward(l, NULL, false) != CT_OK) return 0;
    out[0] = y;
    for (int k = 0; k < nin; k++) out[1 + k] = ct_grad(in[k]);
    return 1 + nin;
}

static int dgelu_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    *nc = v == 3;
    const int64_t *s = mlp_shapes[v];
    in[0] = mlp_rows(pc, dt, s, s[4]);                  /* grad_y */
    in[1] = rnd(pc, dt, CT_SHAPE(s[4], s[3]));         /* w_out */
    in[2] = mlp_rows(pc, dt, s, s[3]);                  /* pre */
    return 3;
}

static int dgelu_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                     ct_tensor **out) {
    (void)pc, (void)dt, (void)dev;
    ct_tensor *d = NULL, *db = NULL;
    bool bias = v != 4;
    if (ct_mlp_gelu_backward_hidden(in[0], in[1], in[2], mlp_approx(v), &d, bias ? &db : NULL) !=
        CT_OK)
        d = db = NULL;
    out[0] = d;
    if (bias) out[1] = db;
    return bias ? 2 : 1;
}

/* ---- factories ---------------------------------------------------------------------------------------- */
static int no_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    (void)pc, (void)dt, (void)v, (void)in;
    *nc = false;
    return 0;
}

/* Every variant draws from a fresh generator with a seed fixed by the
 * variant (the same on both devices); variant 1 starts at an offset that is
 * not a multiple of four. */
static int random_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                      ct_tensor **out) {
    (void)in;
    ct_generator *g = ct_generator_new(0x5eed0000u + (uint64_t)v * 977u);
    if (v == 1) ct_generator_set_offset(g, 3);
    int n = 0;
    switch (pc->op) {
    case CT_OP_RAND_UNIFORM:
        out[n++] = ct_tensor_rand(g, CT_SHAPE(1001), dt, dev);
        out[n] = ct_tensor_zeros(CT_SHAPE(37, 29), dt, dev);
        if (out[n] && ct_uniform_(out[n], -2, 3, g) != CT_OK) out[n] = NULL;
        n++;
        break;
    case CT_OP_RAND_NORMAL:
        out[n++] = ct_tensor_randn(g, CT_SHAPE(1001), dt, dev);
        out[n] = ct_tensor_zeros(CT_SHAPE(37, 29), dt, dev);
        if (out[n] && ct_normal_(out[n], 1, 2, g) != CT_OK) out[n] = NULL;
        n++;
        break;
    default: {
        int64_t lo = dt == CT_BOOL ? 0 : -50, hi = dt == CT_BOOL ? 2 : 200;
        out[n++] = ct_tensor_randint(g, lo, hi, CT_SHAPE(1001), dt, dev);
        if (dt == CT_I64)
            out[n++] = ct_tensor_randint(g, -((int64_t)1 << 40), (int64_t)1 << 41, CT_SHAPE(77), dt, dev);
        break;
    }
    }
    ct_generator_free(g);
    return n;
}

static int arange_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                      ct_tensor **out) {
    (void)pc, (void)v, (void)in;
    int n = 0;
    if (dt == CT_BOOL) {
        out[n++] = ct_tensor_arange(0, 2, 1, dt, dev);
        out[n++] = ct_tensor_linspace(0, 1, 5, dt, dev);
    } else if (ct_dtype_is_floating(dt)) {
        out[n++] = ct_tensor_arange(-3.5, 7.25, 0.37, dt, dev);
        out[n++] = ct_tensor_linspace(-2, 5, 101, dt, dev);
    } else {
        out[n++] = ct_tensor_arange(-7, 4000, 3, dt, dev);
        out[n++] = ct_tensor_linspace(-20, 300, 77, dt, dev);
    }
    return n;
}

/* copy: conversions into dt from float32 and from int64, and a
 * non-contiguous same-dtype copy. */
static int copy_inputs(const pcase *pc, ct_dtype dt, int v, ct_tensor **in, bool *nc) {
    *nc = v == 1;
    in[0] = tu_rand(CT_SHAPE(41, 23), CT_F32, -60, 60, NULL);
    in[1] = tu_rand(CT_SHAPE(41, 23), CT_I64, -300, 300, NULL);
    in[2] = rnd(pc, dt, CT_SHAPE(41, 23));
    return 3;
}
static int copy_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                    ct_tensor **out) {
    (void)pc, (void)v, (void)dev;
    out[0] = ct_to_dtype(in[0], dt);
    out[1] = ct_to_dtype(in[1], dt);
    out[2] = ct_contiguous(in[2]);
    return 3;
}

static int fill_run(const pcase *pc, ct_dtype dt, int v, ct_device dev, ct_tensor **in,
                    ct_tensor **out) {
    (void)pc, (void)v, (void)in;
    out[0] = ct_tensor_full(CT_SHAPE(33, 65), -2.75, dt, dev);
    ct_tensor *z = ct_tensor_zeros(CT_SHAPE(12, 20), dt, dev);
    ct_tensor *col = z ? ct_slice(z, 1, 1, 20, 3) : NULL;
    if (!col || ct_fill_(col, 1.5) != CT_OK) z = NULL;
    out[1] = z;
    return 2;
}

/* ---- the table ------------------------------------------------------------------------------------------- */
#define F_RANGE(lo, hi) lo, hi, -9, 10
#define UNARY(OP, fn, lo, hi) \
    {CT_OP_##OP, 2, unary_inputs, unary_run, fn, NULL, NULL, F_RANGE(lo, hi), 1}
#define UNARY_ROW_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi)                      \
    {CT_OP_##ID, 2, unary_inputs, unary_rows_run, NULL, NULL, NULL, F_RANGE(vlo, vhi), 1},
#define BINARY(OP, fn, sfn, lo, hi) \
    {CT_OP_##OP, 5, binary_inputs, binary_run, NULL, fn, sfn, F_RANGE(lo, hi), 1}
#define LOGICAL(OP, fn) {CT_OP_##OP, 3, binary_inputs, binary_run, NULL, fn, NULL, F_RANGE(-1, 1), 1}
#define RED(OP, lo, hi, ilo, ihi) {CT_OP_##OP, 5, red_inputs, red_run, NULL, NULL, NULL, lo, hi, ilo, ihi, 100}
#define RED_SUM(OP, lo, hi, ilo, ihi) {CT_OP_##OP, 7, red_inputs, red_run, NULL, NULL, NULL, lo, hi, ilo, ihi, 100}
#define MM(OP) {CT_OP_##OP, 5, mm_inputs, mm_run, NULL, NULL, NULL, F_RANGE(-1, 1), 5}

/* Cases of later kernel files, kept beside them. */
#include "parity_conv.inc"
#include "parity_norm.inc"
#include "parity_nn.inc"
#include "parity_optim.inc"
#include "parity_rope.inc"
#include "parity_linear_ce.inc"
#include "parity_attention.inc"
#include "parity_seqops.inc"
#include "parity_indexing.inc"
#include "parity_sort.inc"
#include "parity_shape.inc"
#include "parity_pointwise.inc"

static const pcase cases[] = {
    PARITY_CONV_CASES
    PARITY_NORM_CASES
    PARITY_NN_CASES
    PARITY_OPTIM_CASES
    PARITY_ROPE_CASES
    PARITY_LINEAR_CE_CASES
    PARITY_ATTENTION_CASES
    PARITY_SEQOPS_CASES
    PARITY_INDEXING_CASES
    PARITY_SORT_CASES
    PARITY_SHAPE_CASES
    PARITY_POINTWISE_CASES
    CT_UNARY_OPS(UNARY_ROW_)
    UNARY(LOGICAL_NOT, ct_logical_not, -1, 1),
    {CT_OP_CLAMP, 2, unary_inputs, clamp_run, NULL, NULL, NULL, -3, 3, -9, 10, 1},
    {CT_OP_ADD, 5, binary_inputs, add_run, NULL, ct_add, ct_add_scalar, F_RANGE(-3, 3), 1},
    {CT_OP_SUB, 5, binary_inputs, add_run, NULL, ct_sub, ct_sub_scalar, F_RANGE(-3, 3), 1},
    BINARY(MUL, ct_mul, ct_mul_scalar, -3, 3),
    BINARY(DIV, ct_div, ct_div_scalar, 0.25, 4),
    {CT_OP_POW, 5, binary_inputs, binary_run, NULL, ct_pow, ct_pow_scalar, 0.5, 2, 0, 6, 1},
    BINARY(MAXIMUM, ct_maximum, ct_maximum_scalar, -3, 3),
    BINARY(MINIMUM, ct_minimum, ct_minimum_scalar, -3, 3),
    BINARY(EQ, ct_eq, ct_eq_scalar, -1.5, 1.5),
    BINARY(NE, ct_ne, ct_ne_scalar, -1.5, 1.5),
    BINARY(LT, ct_lt, ct_lt_scalar, -3, 3),
    BINARY(LE, ct_le, ct_le_scalar, -1.5, 1.5),
    BINARY(GT, ct_gt, ct_gt_scalar, -3, 3),
    BINARY(GE, ct_ge, ct_ge_scalar, -1.5, 1.5),
    LOGICAL(LOGICAL_AND, ct_logical_and),
    LOGICAL(LOGICAL_OR, ct_logical_or),
    {CT_OP_WHERE, 3, where_inputs, where_run, NULL, NULL, NULL, F_RANGE(-3, 3), 1},
    RED_SUM(SUM, -3, 3, -9, 10),
    RED_SUM(MEAN, -3, 3, -9, 10),
    RED(PROD, 0.8, 1.25, -3, 4),
    RED(VAR, -3, 3, -9, 10),
    RED(NORM, -3, 3, -9, 10),
    RED(MAX, -3, 3, -9, 10),
    RED(MIN, -3, 3, -9, 10),
    RED(ARGMAX, -3, 3, -9, 10),
    RED(ARGMIN, -3, 3, -9, 10),
    MM(MM),
    MM(BMM),
    MM(ADDMM),
    {CT_OP_LINEAR_BACKWARD_WEIGHT, 7, lbw_inputs, lbw_run, NULL, NULL, NULL, F_RANGE(-1, 1), 5},
    {CT_OP_LINEAR_GELU, 6, mlp_inputs, mlp_run, NULL, NULL, NULL, F_RANGE(-1, 1), 100},
    {CT_OP_LINEAR_DGELU, 6, dgelu_inputs, dgelu_run, NULL, NULL, NULL, F_RANGE(-1, 1), 10},
    {CT_OP_RAND_UNIFORM, 2, no_inputs, random_run, NULL, NULL, NULL, F_RANGE(0, 1), 1},
    {CT_OP_RAND_NORMAL, 2, no_inputs, random_run, NULL, NULL, NULL, F_RANGE(0, 1), 1},
    {CT_OP_RANDINT, 2, no_inputs, random_run, NULL, NULL, NULL, F_RANGE(0, 1), 1},
    {CT_OP_ARANGE, 1, no_inputs, arange_run, NULL, NULL, NULL, F_RANGE(0, 1), 1},
    {CT_OP_COPY, 2, copy_inputs, copy_run, NULL, NULL, NULL, F_RANGE(-100, 100), 1},
    {CT_OP_FILL, 1, no_inputs, fill_run, NULL, NULL, NULL, F_RANGE(0, 1), 1},
};

static const pcase *case_of(ct_op op) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (cases[i].op == op) return &cases[i];
    return NULL;
}

/* ---- running a case ------------------------------------------------------------------------------------------ */
static int failures;

static void report(const pcase *pc, ct_dtype dt, int v, int k, const char *what) {
    fprintf(stderr, "parity %s/%s variant %d output %d: %s\n", ct_op_name(pc->op),
            ct_dtype_name(dt), v, k, what);
    failures++;
}

/* Compares output k of both runs; false after reporting a mismatch. */
static bool compare(const pcase *pc, ct_dtype dt, int v, int k, ct_tensor *ref, ct_tensor *got) {
    char msg[512];
    if (!ref || !got) {
        snprintf(msg, sizeof msg, "%s run failed: %s", ref ? "GPU" : "CPU", ct_last_error());
        report(pc, dt, v, k, msg);
        return false;
    }
    if (ct_tensor_device(got).type != CT_DEVICE_CUDA && pc->op != CT_OP_COPY) {
        report(pc, dt, v, k, "the GPU run returned a CPU tensor");
        return false;
    }
    int nd = ct_tensor_ndim(ref);
    bool same = nd == ct_tensor_ndim(got) && ct_tensor_dtype(ref) == ct_tensor_dtype(got);
    for (int d = 0; same && d < nd; d++) same = ct_tensor_shape(ref)[d] == ct_tensor_shape(got)[d];
    if (!same) {
        snprintf(msg, sizeof msg, "CPU gives %s %s, GPU %s %s",
                 ct_dtype_name(ct_tensor_dtype(ref)), "(shape or dtype)",
                 ct_dtype_name(ct_tensor_dtype(got)), "differs");
        report(pc, dt, v, k, msg);
        return false;
    }
    int64_t n = ct_tensor_numel(ref);
    double *r = tu_values(ref), *g = tu_values(got);
    ct_dtype odt = ct_tensor_dtype(ref);
    double rtol = ct_dtype_is_floating(odt) ? rtol_of(odt) : 0, atol = rtol * pc->atol;
    bool ok = true;
    for (int64_t i = 0; i < n && ok; i++) {
        bool match;
        if (isnan(r[i])) match = isnan(g[i]);
        else if (isinf(r[i])) match = g[i] == r[i];
        else match = fabs(g[i] - r[i]) <= atol + rtol * fabs(r[i]);
        if (!match) {
            snprintf(msg, sizeof msg, "element %lld of %lld: GPU %.17g, CPU %.17g (rtol %g atol %g)",
                     (long long)i, (long long)n, g[i], r[i], rtol, atol);
            report(pc, dt, v, k, msg);
            ok = false;
        }
    }
    free(r);
    free(g);
    return ok;
}

static void run_case(const pcase *pc, ct_dtype dt) {
    for (int v = 0; v < pc->nvariants; v++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *in[6] = {NULL}, *gin[6] = {NULL};
        ct_tensor *ref[8] = {NULL}, *got[8] = {NULL};
        bool nc = false;
        int nin = pc->inputs(pc, dt, v, in, &nc);
        for (int k = 0; k < nin; k++) {
            assert_non_null(in[k]);
            gin[k] = ct_to_device(in[k], CT_CUDA(0));
            if (gin[k] && nc) gin[k] = tu_noncontig(gin[k]);
            assert_non_null(gin[k]);
        }
        int nr = pc->run(pc, dt, v, CT_CPU, in, ref);
        int ng = pc->run(pc, dt, v, CT_CUDA(0), gin, got);
        assert_int_equal(nr, ng);
        for (int k = 0; k < nr; k++) compare(pc, dt, v, k, ref[k], got[k]);
        ct_scope_end(sc);
    }
    ct_status s = ct_cuda_synchronize(0);
    if (s != CT_OK) {
        fprintf(stderr, "parity %s/%s: %s\n", ct_op_name(pc->op), ct_dtype_name(dt), ct_last_error());
        failures++;
    }
}

/* ---- tests ------------------------------------------------------------------------------------------------------ */
/* Every CUDA kernel in the table has a case (no GPU needed). */
static void test_every_cuda_kernel_has_a_case(void **state) {
    (void)state;
    int missing = 0, registered = 0;
    for (int op = 0; op < CT_NUM_OPS; op++)
        for (int dt = 0; dt < CT_NUM_DTYPES; dt++) {
            if (!ct_supports((ct_op)op, CT_DEVICE_CUDA, (ct_dtype)dt)) continue;
            registered++;
            if (case_of((ct_op)op)) continue;
            fprintf(stderr, "no parity case for CUDA kernel %s/%s\n", ct_op_name((ct_op)op),
                    ct_dtype_name((ct_dtype)dt));
            missing++;
        }
    if (!ct_backend_available(CT_DEVICE_CUDA))
        fprintf(stderr, "the CUDA module did not load: %s\n", cti_backend_missing(CT_DEVICE_CUDA));
    assert_true(registered > 0);
    assert_int_equal(missing, 0);
}

/* Every registered (op, dtype) against the CPU. */
/* The (op, dtype) pairs are checked in PARITY_PARTS tests, the ops of part k
 * being those whose number is k modulo PARITY_PARTS, so that the program can
 * be split over processes (CT_TEST_SHARD) under compute-sanitizer. */
#define PARITY_PARTS 8
static const int parity_part[PARITY_PARTS] = {0, 1, 2, 3, 4, 5, 6, 7};

static void test_parity(void **state) {
    const int part = *(const int *)*state;
    if (ngpu == 0) skip();
    ct_set_allow_tf32(false);
    failures = 0;
    int checked = 0;
    for (int op = part; op < CT_NUM_OPS; op += PARITY_PARTS)
        for (int dt = 0; dt < CT_NUM_DTYPES; dt++) {
            if (!ct_supports((ct_op)op, CT_DEVICE_CUDA, (ct_dtype)dt)) continue;
            const pcase *pc = case_of((ct_op)op);
            if (!pc) continue; /* reported by the test above */
            if (!ct_supports((ct_op)op, CT_DEVICE_CPU, (ct_dtype)dt)) {
                fprintf(stderr, "parity %s/%s: CUDA kernel without a CPU reference\n",
                        ct_op_name((ct_op)op), ct_dtype_name((ct_dtype)dt));
                failures++;
                continue;
            }
            run_case(pc, (ct_dtype)dt);
            checked++;
        }
    fprintf(stderr, "[ parity   ] part %d: %d (op, dtype) pairs checked, %d mismatches\n", part,
            checked, failures);
    assert_int_equal(failures, 0);
}

/* A CPU 0-d operand reaches the CUDA elementwise kernel by value (no copy,
 * no wait); results match the CPU. */
static void test_cpu_scalar_operand(void **state) {
    (void)state;
    if (ngpu == 0) skip();
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16, CT_I32, CT_I64};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        ct_dtype dt = dts[i];
        ct_scope *sc = ct_scope_begin();
        ct_tensor *x = tu_rand(CT_SHAPE(300, 7), dt, -20, 20, NULL);
        ct_tensor *gx = ct_to_device(x, CT_CUDA(0));
        ct_tensor *s = ct_tensor_scalar(-3, ct_dtype_is_floating(dt) ? CT_F32 : dt, CT_CPU);
        /* The reference goes through the CPU front end (which gives its kernel
         * a scalar of the compute dtype); the GPU kernel gets the raw CPU 0-d
         * float32 operand. */
        ct_tensor *outs[2] = {ct_mul_scalar(x, -3.0),
                              ct_tensor_empty(CT_SHAPE(300, 7), dt, CT_CUDA(0))};
        ct_call c;
        cti_call_init(&c, CT_OP_MUL);
        c.in[0] = gx;
        c.in[1] = s;
        c.nin = 2;
        c.out[0] = outs[1];
        c.nout = 1;
        cti_pointwise_params p = {.alpha = 1, .ialpha = 1};
        cti_call_params(&c, &p);
        assert_int_equal(cti_dispatch(&c, CT_CUDA(0), dt), CT_OK);
        pcase pc = {CT_OP_MUL, 1, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 1};
        assert_true(compare(&pc, dt, 0, 0, outs[0], outs[1]));
        ct_scope_end(sc);
    }
}

/* The GELU MLP's paths: the trace of a bf16 GELU MLP of aligned widths names, for either
 * form, the forward's composite, the hidden gradient's pass that folds gelu's backward into
 * b_in's row sums, and cuBLASLt's bias-gradient epilogue for the output projection's weight
 * and bias gradients. */
static void test_mlp_paths_taken(void **state) {
    (void)state;
    if (ngpu == 0) skip();
    for (int exact = 0; exact < 2; exact++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *in[5];
        const int64_t shapes[5][2] = {{64, 32}, {64, 32}, {64, 0}, {24, 64}, {24, 0}};
        for (int k = 0; k < 5; k++) {
            in[k] = ct_to_device(tu_rand(shapes[k][1] ? 2 : 1, shapes[k], CT_BF16, -1, 1, NULL),
                                 CT_CUDA(0));
            assert_non_null(in[k]);
            assert_int_equal(ct_requires_grad_(in[k], true), CT_OK);
        }
        tu_trace t = tu_trace_begin();
        ct_tensor *y = ct_mlp_gelu(in[0], in[1], in[2], in[3], in[4],
                                   exact ? CT_GELU_NONE : CT_GELU_TANH);
        /* sum(y^2), not sum(y), whose gradient is one value broadcast (stride 0), a layout
         * the epilogue does not take */
        ct_status st = y ? ct_backward(ct_sum(ct_mul(y, y), 0, NULL, false), NULL, false)
                         : ct_last_status();
        ct_cuda_synchronize(0);
        char *log = tu_trace_end(&t);
        assert_int_equal(st, CT_OK);
        assert_non_null(strstr(log, "addmm, then gelu"));
        assert_non_null(strstr(log, "mm, then gelu_backward folded into the row sums"));
        /* the output projection's weight and bias gradients from one GEMM either way */
        assert_non_null(strstr(log, "cublasLtMatmul, bias-gradient epilogue"));
        free(log);
        ct_scope_end(sc);
    }
}

/* gelu_backward refuses operands on two devices, naming itself and the devices. */
static void test_gelu_backward_devices(void **state) {
    (void)state;
    if (ngpu == 0) skip();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = tu_rand(CT_SHAPE(4, 5), CT_F32, -3, 3, NULL);
    ct_tensor *g = ct_to_device(tu_rand(CT_SHAPE(4, 5), CT_F32, -2, 2, NULL), CT_CUDA(0));
    assert_non_null(g);
    tu_assert_null_error(ct_gelu_backward(g, x, CT_GELU_TANH), CT_ERR_DEVICE, "ct_gelu_backward",
                         "one device", "cuda:0", "cpu");
    ct_scope_end(sc);
}

int main(int argc, char **argv) {
    tu_seed();
    if (argc > 1 && !strcmp(argv[1], "cases")) {
        const struct CMUnitTest only[] = {cmocka_unit_test(test_every_cuda_kernel_has_a_case)};
        return cmocka_run_group_tests_name("parity cases", only, NULL, NULL);
    }
    ngpu = tu_cuda_devices_or_skip("parity");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_every_cuda_kernel_has_a_case),
        T(test_mlp_paths_taken),
#define P(k) {"test_parity part " #k, test_parity, setup, teardown, (void *)&parity_part[k]}
        P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7),
#undef P
        T(test_cpu_scalar_operand),
        T(test_gelu_backward_devices),
    };
#undef T
    return tu_run_tests(tests);
}
