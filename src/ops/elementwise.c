/* Front ends of the elementwise ops: unary, binary (tensor-tensor and
 * tensor-scalar), their in-place forms, where and clamp.
 *
 * A binary op finds the result type (PyTorch's result_type), the compute
 * dtype its kernel runs in (true division and float math take integers to
 * float32; comparisons compute in the promoted dtype and give bool) and the
 * broadcast shape, converts operands whose dtype differs from the compute
 * dtype, and dispatches on the compute dtype. float16/bfloat16 kernels read
 * float32 0-d operands directly, so a scalar keeps float32 precision there as
 * in PyTorch's opmath. The path for same-dtype, same-shape operands makes no
 * calls beyond the result's allocation, the dispatch and autograd's check.
 *
 * Differentiable ops record their backward (src/autograd/formulas_elementwise.c)
 * when an operand requires grad; in-place forms are recorded as PyTorch
 * records them, through a view's base too (src/ops/inplace.c), and refuse
 * what autograd forbids (cti_ag_inplace_mode) before touching data. */
#include <math.h>

#include "ops_impl.h"
#include "tensor/ops.h"

/* How a binary op maps its result type to the compute and output dtypes. */
typedef enum bin_kind {
    BK_ARITH,   /* compute = output = result type */
    BK_DIV,     /* integers compute in float32 */
    BK_COMPARE, /* compute in the result type, output bool */
} bin_kind;

typedef struct bin_spec {
    const char *name;
    ct_op op;
    bin_kind kind;
} bin_spec;

static inline bool is_lowp(ct_dtype dt) { return dt == CT_F16 || dt == CT_BF16; }

static inline ct_device dev_of(const ct_tensor *t) { return t->storage->device; }

static inline bool same_device(const ct_tensor *a, const ct_tensor *b) {
    ct_device x = dev_of(a), y = dev_of(b);
    return x.type == y.type && x.index == y.index;
}

static inline bool same_shape(const ct_tensor *a, const ct_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static ct_status check_two(const char *name, ct_tensor *a, ct_tensor *b) {
    ct_tensor *ts[2] = {a, b};
    if (!a || !b) return cti_check_not_null(name, 2, ts);
    if (!same_device(a, b)) return cti_check_same_device(name, 2, ts);
    return CT_OK;
}

/* Each op's backward formula for its tensor form, as the schema's grad
 * column names it (NULL: no gradient). */
#define CTI_F(fn) fn
#define CTI_NODIFF NULL
#define CTI_NOFORMULA NULL
#define FORMULA_(ID, nm, P, grad, bw) [CT_OP_##ID] = grad,
static const cti_backward_fn formula_of[CT_NUM_OPS] = {CTI_OP_SCHEMA(FORMULA_)};
#undef FORMULA_
#undef CTI_F
#undef CTI_NODIFF
#undef CTI_NOFORMULA

/* The parameters of a call that has none to pass (unary ops, where). */
static const cti_pointwise_params no_params;

/* The compute dtype for a result type. */
static inline ct_dtype compute_dtype(bin_kind kind, ct_dtype rt) {
    if (kind == BK_DIV && !ct_dtype_is_floating(rt)) return CT_F32;
    return rt;
}

/* t as an operand of a kernel computing in cd: t itself (no new reference)
 * when it fits, else a converted copy in *tmp. */
static ct_tensor *prep_operand(ct_tensor *t, ct_dtype cd, ct_tensor **tmp) {
    *tmp = NULL;
    if (t->dtype == cd) return t;
    if (is_lowp(cd)) {
        if (is_lowp(t->dtype) || t->dtype == CT_F32) return t;
        if (t->ndim == 0 && t->dtype == CT_F64) return *tmp = ct_to_dtype(t, CT_F32);
    }
    return *tmp = ct_to_dtype(t, cd);
}

/* Whether alpha suits an integer or bool result (PyTorch refuses a
 * fractional alpha there). alpha is the caller's (sub's front ends pass
 * its negation to the kernel, not to this check). */
static ct_status check_alpha(const char *name, ct_dtype cd, double alpha) {
    if (!ct_dtype_is_floating(cd) && (!isfinite(alpha) || alpha != trunc(alpha) ||
                                      fabs(alpha) >= 9223372036854775808.0))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: alpha must be an integer for a %s result, got %g", name,
                         ct_dtype_name(cd), alpha);
    return CT_OK;
}

static ct_status check_bool_sub(const char *name, ct_dtype da, ct_dtype db) {
    if (da == CT_BOOL || db == CT_BOOL)
        return cti_error(CT_ERR_DTYPE,
                         "%s: subtraction with a bool tensor is not supported; use "
                         "ct_logical_not to invert a mask",
                         name);
    return CT_OK;
}

static bool is_bitwise(ct_op op) {
    return op == CT_OP_BITWISE_AND || op == CT_OP_BITWISE_OR || op == CT_OP_BITWISE_XOR ||
           op == CT_OP_BITWISE_LEFT_SHIFT || op == CT_OP_BITWISE_RIGHT_SHIFT;
}

/* The dtypes PyTorch has kernels for: the bitwise ops take integers (and
 * bool, but for the shifts), fmod and remainder refuse bool. */
static ct_status check_operand_dtype(const bin_spec *sp, ct_dtype cd) {
    bool shift = sp->op == CT_OP_BITWISE_LEFT_SHIFT || sp->op == CT_OP_BITWISE_RIGHT_SHIFT;
    if (is_bitwise(sp->op) && (ct_dtype_is_floating(cd) || (shift && cd == CT_BOOL)))
        return cti_error(CT_ERR_DTYPE, "%s: expected integer%s operands, got %s", sp->name,
                         shift ? "" : " or bool", ct_dtype_name(cd));
    if ((sp->op == CT_OP_FMOD || sp->op == CT_OP_REMAINDER) && cd == CT_BOOL)
        return cti_error(CT_ERR_DTYPE, "%s: not supported for bool tensors", sp->name);
    return CT_OK;
}

/* The parameters of a binary call: add/sub's alpha (sub passes -alpha; the
 * integer form serves integer and bool results, the other ops ignore both)
 * and the number s of a tensor-scalar form, which its formula reads. */
static inline cti_pointwise_params binary_params(double alpha, double s) {
    /* Only integer results read ialpha, and for them alpha was checked to
     * be an integer in range; for the others any double may come, and
     * converting one outside int64 is undefined. */
    int64_t ialpha =
        alpha >= -9223372036854775808.0 && alpha < 9223372036854775808.0 ? (int64_t)alpha : 0;
    return (cti_pointwise_params){.alpha = alpha, .ialpha = ialpha, .scalar = s};
}

/* Runs a kernel into out with inputs (a, b) converted to cd. */
static ct_status run_binary(const bin_spec *sp, ct_tensor *out, ct_tensor *a, ct_tensor *b,
                            ct_dtype cd, const cti_pointwise_params *p) {
    ct_tensor *ta, *tb;
    ct_tensor *ia = prep_operand(a, cd, &ta);
    if (!ia) return ct_last_status();
    ct_tensor *ib = prep_operand(b, cd, &tb);
    if (!ib) {
        ct_tensor_release(ta);
        return ct_last_status();
    }
    ct_call c;
    cti_call_init(&c, sp->op);
    c.nin = 2;
    c.nout = 1;
    c.in[0] = ia;
    c.in[1] = ib;
    c.out[0] = out;
    cti_call_params(&c, p);
    ct_status st = cti_run(&c, dev_of(out), cd);
    ct_tensor_release(ta);
    ct_tensor_release(tb);
    return st;
}

/* Output shape of a binary op into nd/shape. */
static ct_status binary_shape(const char *name, const ct_tensor *a, const ct_tensor *b, int *nd,
                              int64_t *shape) {
    if (same_shape(a, b)) {
        *nd = a->ndim;
        for (int d = 0; d < a->ndim; d++) shape[d] = a->shape[d];
        return CT_OK;
    }
    return cti_broadcast_shapes(name, a->ndim, a->shape, b->ndim, b->shape, nd, shape);
}

/* Records out = a op b for autograd when an operand requires grad, with the
 * call's parameters (add/sub's formula reads alpha). Each operand saves only
 * what the other one's gradient reads. */
static ct_status binary_record(const bin_spec *sp, ct_tensor *a, ct_tensor *b, ct_tensor *out,
                               const cti_pointwise_params *p) {
    cti_backward_fn bw = formula_of[sp->op];
    ct_tensor *ins[2] = {a, b};
    if (!bw || !cti_ag_needed(2, ins)) return CT_OK; /* comparisons, logical ops: bool results */
    bool ga = ct_requires_grad(a), gb = ct_requires_grad(b);
    cti_ag_rec r = {.backward = bw, .nin = 2, .in = {a, b}, .nout = 1, .out = {out},
                    CTI_AG_PARAMS(p)};
    switch (sp->op) {
    case CT_OP_ADD: r.name = "AddBackward"; break;
    case CT_OP_SUB: r.name = "SubBackward"; break;
    case CT_OP_MUL:
        r.name = "MulBackward";
        r.nsaved = 2;
        r.saved[0] = gb ? a : NULL;
        r.saved[1] = ga ? b : NULL;
        break;
    case CT_OP_DIV:
        r.name = "DivBackward";
        r.nsaved = 2;
        r.saved[0] = gb ? a : NULL;
        r.saved[1] = b;
        break;
    case CT_OP_POW:
        r.name = "PowBackward";
        r.nsaved = 3;
        r.saved[0] = a;
        r.saved[1] = b;
        r.saved[2] = gb ? out : NULL;
        break;
    case CT_OP_MAXIMUM:
    case CT_OP_MINIMUM:
        r.name = sp->op == CT_OP_MAXIMUM ? "MaximumBackward" : "MinimumBackward";
        r.nsaved = 2;
        r.saved[0] = a;
        r.saved[1] = b;
        break;
    case CT_OP_ATAN2:
    case CT_OP_FMOD:
    case CT_OP_REMAINDER:
        r.name = sp->op == CT_OP_ATAN2 ? "Atan2Backward"
                 : sp->op == CT_OP_FMOD ? "FmodBackward" : "RemainderBackward";
        r.nsaved = 2;
        r.saved[0] = a;
        r.saved[1] = b;
        break;
    default: return CT_OK; /* no other binary op has a formula */
    }
    return cti_ag_record(&r);
}

/* Integer fmod and remainder by zero fail on the CPU, as PyTorch's
 * ZeroDivisionError: a pass over b once the operands are known good (so a
 * shape or dtype error is reported first), before the kernel divides. A CUDA b is not read (that would wait
 * for the device; PyTorch's CUDA kernels do not check either): its zero
 * divisors give 0. */
static bool int_operands(const ct_tensor *a, const ct_tensor *b) {
    return a && b && !ct_dtype_is_floating(a->dtype) && !ct_dtype_is_floating(b->dtype) &&
           a->dtype != CT_BOOL && b->dtype != CT_BOOL;
}

static ct_status zero_divisor(const char *op, ct_tensor *a, ct_tensor *b) {
    if (!int_operands(a, b) || b->storage->device.type != CT_DEVICE_CPU) return CT_OK;
    ct_tensor *z = ct_eq_scalar(b, 0);
    ct_tensor *any = z ? ct_any(z, 0, NULL, false) : NULL;
    ct_tensor_release(z);
    double v = 0;
    ct_status st = any ? ct_tensor_item(any, &v) : ct_last_status();
    ct_tensor_release(any);
    if (st != CT_OK) return st;
    if (v != 0)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: ZeroDivisionError: integer division by zero (b %s holds a 0)", op,
                         cti_desc(b));
    return CT_OK;
}

static ct_tensor *binary(const bin_spec *sp, ct_tensor *a, ct_tensor *b, double alpha) {
    if (check_two(sp->name, a, b) != CT_OK) return NULL;
    ct_dtype rt = a->dtype;
    if (b->dtype != rt) {
        ct_tensor *ts[2] = {a, b};
        rt = cti_result_type(2, ts);
    }
    ct_dtype cd = compute_dtype(sp->kind, rt);
    ct_dtype od = sp->kind == BK_COMPARE ? CT_BOOL : cd;
    if (sp->op == CT_OP_SUB && check_bool_sub(sp->name, a->dtype, b->dtype) != CT_OK) return NULL;
    if (check_operand_dtype(sp, cd) != CT_OK) return NULL;
    if ((sp->op == CT_OP_ADD || sp->op == CT_OP_SUB) && check_alpha(sp->name, cd, sp->op == CT_OP_SUB ? -alpha : alpha) != CT_OK)
        return NULL;
    int nd;
    int64_t shape[CT_MAX_DIMS];
    if (binary_shape(sp->name, a, b, &nd, shape) != CT_OK) return NULL;
    if ((sp->op == CT_OP_FMOD || sp->op == CT_OP_REMAINDER) &&
        zero_divisor(sp->name, a, b) != CT_OK)
        return NULL;
    ct_tensor *out = cti_tensor_new(sp->name, nd, shape, od, dev_of(a));
    if (!out) return NULL;
    cti_pointwise_params p = binary_params(alpha, 0);
    if (run_binary(sp, out, a, b, cd, &p) != CT_OK || binary_record(sp, a, b, out, &p) != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return out;
}

/* ---- scalars ------------------------------------------------------------------------ */
#define INT64_LIMIT 9223372036854775808.0 /* 2^63 */

/* The dtype a Python number would get: integral finite values are int64,
 * others float64. */
static inline ct_dtype scalar_dtype(double s) {
    return (isfinite(s) && s == trunc(s) && fabs(s) < INT64_LIMIT) ? CT_I64 : CT_F64;
}

/* result_type(t, wrapped scalar): the scalar only matters when it brings a
 * higher category, and then as int64 or float32. */
static inline ct_dtype scalar_result_type(ct_dtype t, ct_dtype sd) {
    if (sd == CT_F64) return ct_dtype_is_floating(t) ? t : CT_F32;
    return t == CT_BOOL ? CT_I64 : t;
}

/* A 0-d wrapped-number tensor holding s for a kernel computing in cd
 * (float32 for reduced-precision kernels). */
static ct_tensor *make_scalar(const char *name, double s, ct_dtype cd, ct_device dev) {
    ct_dtype dt = is_lowp(cd) ? CT_F32 : cd;
    if (dt == CT_I32 && !(s >= -2147483648.0 && s <= 2147483647.0))
        return cti_error_null(CT_ERR_OVERFLOW,
                              "%s: value %.17g cannot be converted to int32 without overflow",
                              name, s);
    if (dt == CT_I64 && !(fabs(s) < INT64_LIMIT || s == -INT64_LIMIT))
        return cti_error_null(CT_ERR_OVERFLOW,
                              "%s: value %.17g cannot be converted to int64 without overflow",
                              name, s);
    ct_tensor *t;
    if (dev.type != CT_DEVICE_CPU) {
        t = ct_tensor_scalar(s, dt, dev);
    } else {
        t = cti_tensor_new(name, 0, NULL, dt, dev);
        if (t) {
            void *p = cti_data(t);
            switch (dt) {
            case CT_BOOL: *(uint8_t *)p = s != 0; break;
            case CT_I32: *(int32_t *)p = (int32_t)s; break;
            case CT_I64: *(int64_t *)p = (int64_t)s; break;
            case CT_F32: *(float *)p = (float)s; break;
            case CT_F64: *(double *)p = s; break;
            default: break; /* reduced precision never reaches here */
            }
        }
    }
    if (t) t->wrapped_number = true;
    return t;
}

/* Records out = a op s (s op a when reverse) for autograd when a requires
 * grad. The node has the one input a and the call's parameters, whose
 * scalar the formulas of mul, div, pow, maximum and minimum read. */
static ct_status scalar_record(const bin_spec *sp, ct_tensor *a, bool reverse, ct_tensor *out,
                               const cti_pointwise_params *p) {
    if (!formula_of[sp->op] || !cti_ag_needed(1, &a)) return CT_OK; /* comparisons */
    cti_ag_rec r = {.nin = 1, .in = {a}, .nout = 1, .out = {out}, CTI_AG_PARAMS(p)};
    switch (sp->op) {
    case CT_OP_ADD:
    case CT_OP_SUB:
        if (reverse) { /* s - a */
            r.name = "RsubBackward";
            r.backward = cti_bw_neg;
        } else {
            r.name = sp->op == CT_OP_ADD ? "AddBackward" : "SubBackward";
            r.backward = cti_bw_add;
        }
        break;
    case CT_OP_MUL: r.name = "MulBackward", r.backward = cti_bw_mul_scalar; break;
    case CT_OP_DIV: r.name = "DivBackward", r.backward = cti_bw_div_scalar; break;
    case CT_OP_POW: r.name = "PowBackward", r.backward = cti_bw_pow_scalar; break;
    case CT_OP_MAXIMUM: r.name = "MaximumBackward", r.backward = cti_bw_maximum_scalar; break;
    case CT_OP_MINIMUM: r.name = "MinimumBackward", r.backward = cti_bw_minimum_scalar; break;
    case CT_OP_FMOD: /* a - k s with k piecewise constant: the identity's gradient */
    case CT_OP_REMAINDER:
        r.name = sp->op == CT_OP_FMOD ? "FmodBackward" : "RemainderBackward";
        r.backward = cti_bw_add;
        break;
    default: return CT_OK; /* no other scalar form has a formula */
    }
    if (sp->op == CT_OP_POW || sp->op == CT_OP_MAXIMUM || sp->op == CT_OP_MINIMUM) {
        r.nsaved = 1;
        r.saved[0] = a;
    }
    return cti_ag_record(&r);
}

/* a op s, or s op a when reverse (alpha as for add/sub). */
static ct_tensor *binary_scalar(const bin_spec *sp, ct_tensor *a, double s, bool reverse,
                                double alpha) {
    if (!a) return (cti_check_not_null(sp->name, 1, &a), NULL);
    ct_dtype rt = scalar_result_type(a->dtype, scalar_dtype(s));
    ct_dtype cd = compute_dtype(sp->kind, rt);
    ct_dtype od = sp->kind == BK_COMPARE ? CT_BOOL : cd;
    if (sp->op == CT_OP_SUB && check_bool_sub(sp->name, a->dtype, a->dtype) != CT_OK) return NULL;
    if (check_operand_dtype(sp, cd) != CT_OK) return NULL; /* a float s makes cd floating */
    if (sp->op == CT_OP_POW && !ct_dtype_is_floating(cd) && s < 0)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: integers to negative integer powers are not allowed "
                              "(%s tensor, exponent %g)",
                              sp->name, ct_dtype_name(a->dtype), s);
    ct_tensor *sc = make_scalar(sp->name, s, cd, dev_of(a));
    if (!sc) return NULL;
    ct_tensor *out = cti_tensor_new(sp->name, a->ndim, a->shape, od, dev_of(a));
    cti_pointwise_params p = binary_params(alpha, s);
    ct_status st = CT_OK;
    if (!out) st = ct_last_status();
    else if (reverse) st = run_binary(sp, out, sc, a, cd, &p);
    else st = run_binary(sp, out, a, sc, cd, &p);
    ct_tensor_release(sc);
    if (st == CT_OK) st = scalar_record(sp, a, reverse, out, &p);
    if (st != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return out;
}

/* ---- binary, tensor-tensor ------------------------------------------------------------ */
#define SPEC(var, nm, OP, kind) static const bin_spec var = {nm, CT_OP_##OP, kind}
SPEC(s_add, "ct_add", ADD, BK_ARITH);
SPEC(s_add_alpha, "ct_add_alpha", ADD, BK_ARITH);
SPEC(s_sub, "ct_sub", SUB, BK_ARITH);
SPEC(s_sub_alpha, "ct_sub_alpha", SUB, BK_ARITH);
SPEC(s_mul, "ct_mul", MUL, BK_ARITH);
SPEC(s_div, "ct_div", DIV, BK_DIV);
SPEC(s_pow, "ct_pow", POW, BK_ARITH);
SPEC(s_maximum, "ct_maximum", MAXIMUM, BK_ARITH);
SPEC(s_minimum, "ct_minimum", MINIMUM, BK_ARITH);
SPEC(s_eq, "ct_eq", EQ, BK_COMPARE);
SPEC(s_ne, "ct_ne", NE, BK_COMPARE);
SPEC(s_lt, "ct_lt", LT, BK_COMPARE);
SPEC(s_le, "ct_le", LE, BK_COMPARE);
SPEC(s_gt, "ct_gt", GT, BK_COMPARE);
SPEC(s_ge, "ct_ge", GE, BK_COMPARE);
SPEC(s_logical_and, "ct_logical_and", LOGICAL_AND, BK_COMPARE);
SPEC(s_logical_or, "ct_logical_or", LOGICAL_OR, BK_COMPARE);

ct_tensor *ct_add(ct_tensor *a, ct_tensor *b) { return binary(&s_add, a, b, 1.0); }
ct_tensor *ct_add_alpha(ct_tensor *a, ct_tensor *b, double alpha) {
    return binary(&s_add_alpha, a, b, alpha);
}
ct_tensor *ct_sub(ct_tensor *a, ct_tensor *b) { return binary(&s_sub, a, b, -1.0); }
ct_tensor *ct_sub_alpha(ct_tensor *a, ct_tensor *b, double alpha) {
    return binary(&s_sub_alpha, a, b, -alpha);
}
ct_tensor *ct_mul(ct_tensor *a, ct_tensor *b) { return binary(&s_mul, a, b, 1.0); }
ct_tensor *ct_div(ct_tensor *a, ct_tensor *b) { return binary(&s_div, a, b, 1.0); }
ct_tensor *ct_pow(ct_tensor *a, ct_tensor *b) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_POW, 2, (ct_tensor *[]){a, b}))
        return cti_autocast_end_op(&ac, ac.ok ? ct_pow(ac.in[0], ac.in[1]) : NULL);
    return binary(&s_pow, a, b, 1.0);
}
ct_tensor *ct_maximum(ct_tensor *a, ct_tensor *b) { return binary(&s_maximum, a, b, 1.0); }
ct_tensor *ct_minimum(ct_tensor *a, ct_tensor *b) { return binary(&s_minimum, a, b, 1.0); }
ct_tensor *ct_eq(ct_tensor *a, ct_tensor *b) { return binary(&s_eq, a, b, 1.0); }
ct_tensor *ct_ne(ct_tensor *a, ct_tensor *b) { return binary(&s_ne, a, b, 1.0); }
ct_tensor *ct_lt(ct_tensor *a, ct_tensor *b) { return binary(&s_lt, a, b, 1.0); }
ct_tensor *ct_le(ct_tensor *a, ct_tensor *b) { return binary(&s_le, a, b, 1.0); }
ct_tensor *ct_gt(ct_tensor *a, ct_tensor *b) { return binary(&s_gt, a, b, 1.0); }
ct_tensor *ct_ge(ct_tensor *a, ct_tensor *b) { return binary(&s_ge, a, b, 1.0); }
ct_tensor *ct_logical_and(ct_tensor *a, ct_tensor *b) {
    return binary(&s_logical_and, a, b, 1.0);
}
ct_tensor *ct_logical_or(ct_tensor *a, ct_tensor *b) { return binary(&s_logical_or, a, b, 1.0); }

/* ---- binary, tensor-scalar ---------------------------------------------------------------- */
SPEC(s_add_scalar, "ct_add_scalar", ADD, BK_ARITH);
SPEC(s_sub_scalar, "ct_sub_scalar", SUB, BK_ARITH);
SPEC(s_rsub_scalar, "ct_rsub_scalar", SUB, BK_ARITH);
SPEC(s_mul_scalar, "ct_mul_scalar", MUL, BK_ARITH);
SPEC(s_div_scalar, "ct_div_scalar", DIV, BK_DIV);
SPEC(s_pow_scalar, "ct_pow_scalar", POW, BK_ARITH);
SPEC(s_maximum_scalar, "ct_maximum_scalar", MAXIMUM, BK_ARITH);
SPEC(s_minimum_scalar, "ct_minimum_scalar", MINIMUM, BK_ARITH);
SPEC(s_eq_scalar, "ct_eq_scalar", EQ, BK_COMPARE);
SPEC(s_ne_scalar, "ct_ne_scalar", NE, BK_COMPARE);
SPEC(s_lt_scalar, "ct_lt_scalar", LT, BK_COMPARE);
SPEC(s_le_scalar, "ct_le_scalar", LE, BK_COMPARE);
SPEC(s_gt_scalar, "ct_gt_scalar", GT, BK_COMPARE);
SPEC(s_ge_scalar, "ct_ge_scalar", GE, BK_COMPARE);

/* Binary ops other than add/sub pass alpha = 1, which their kernels ignore. */
#define SCALAR_OP(fn, spec)                                                                   \
    ct_tensor *fn(ct_tensor *a, double s) { return binary_scalar(&spec, a, s, false, 1.0); }

SCALAR_OP(ct_add_scalar, s_add_scalar)
/* a - s is a + (-1) * s, and s - a is s + (-1) * a. */
ct_tensor *ct_sub_scalar(ct_tensor *a, double s) {
    return binary_scalar(&s_sub_scalar, a, s, false, -1.0);
}
ct_tensor *ct_rsub_scalar(ct_tensor *a, double s) {
    return binary_scalar(&s_rsub_scalar, a, s, true, -1.0);
}
SCALAR_OP(ct_mul_scalar, s_mul_scalar)
SCALAR_OP(ct_div_scalar, s_div_scalar)
ct_tensor *ct_pow_scalar(ct_tensor *a, double exponent) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_POW_SCALAR, 1, &a))
        return cti_autocast_end_op(&ac, ac.ok ? ct_pow_scalar(ac.in[0], exponent) : NULL);
    return binary_scalar(&s_pow_scalar, a, exponent, false, 1.0);
}
SCALAR_OP(ct_maximum_scalar, s_maximum_scalar)
SCALAR_OP(ct_minimum_scalar, s_minimum_scalar)
SCALAR_OP(ct_eq_scalar, s_eq_scalar)
SCALAR_OP(ct_ne_scalar, s_ne_scalar)
SCALAR_OP(ct_lt_scalar, s_lt_scalar)
SCALAR_OP(ct_le_scalar, s_le_scalar)
SCALAR_OP(ct_gt_scalar, s_gt_scalar)
SCALAR_OP(ct_ge_scalar, s_ge_scalar)

/* ---- in place -------------------------------------------------------------------------------- */
/* Autograd's rules for updating a in place from b (NULL for none)
 * (cti_ag_inplace_mode): *record tells whether the update must be recorded
 * (src/ops/inplace.c) rather than run plainly. */
static ct_status check_autograd(const char *name, ct_tensor *a, ct_tensor *b,
                                bool *record) {
    int mode = cti_ag_inplace_mode(name, a, b);
    *record = mode > 0;
    return mode < 0 ? ct_last_status() : CT_OK;
}

/* The out-of-place form of an in-place op, for its recorded path. */
typedef struct redo_ctx {
    ct_op op;
    bool scalar, unary, clamp;
    ct_tensor *b;
    double s, alpha, min, max;
} redo_ctx;

static ct_tensor *redo(ct_tensor *src, const void *ctx) {
    const redo_ctx *r = ctx;
    if (r->clamp) return ct_clamp(src, r->min, r->max);
    if (r->unary) switch (r->op) {
        case CT_OP_NEG: return ct_neg(src);
        case CT_OP_EXP: return ct_exp(src);
        case CT_OP_SQRT: return ct_sqrt(src);
        default: return ct_relu(src);
        }
    if (r->scalar) switch (r->op) {
        case CT_OP_ADD: return ct_add_scalar(src, r->s);
        case CT_OP_SUB: return ct_sub_scalar(src, r->s);
        case CT_OP_MUL: return ct_mul_scalar(src, r->s);
        default: return ct_div_scalar(src, r->s);
        }
    switch (r->op) { /* alpha in the kernels' sign: a + alpha b */
    case CT_OP_ADD: return ct_add_alpha(src, r->b, r->alpha);
    case CT_OP_SUB: return ct_sub_alpha(src, r->b, -r->alpha);
    case CT_OP_MUL: return ct_mul(src, r->b);
    case CT_OP_DIV: return ct_div(src, r->b);
    default: return ct_pow(src, r->b);
    }
}

/* A destination that repeats memory (a stride-0 dim) would be written twice. */
static ct_status check_no_overlap(const char *name, const ct_tensor *a) {
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] > 1 && a->stride[d] == 0)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: the destination %s has elements that share memory (an "
                             "expanded view); clone it first",
                             name, cti_desc(a));
    return CT_OK;
}

static ct_status check_cast(const char *name, ct_dtype result, ct_dtype dst) {
    if (!cti_can_cast(result, dst))
        return cti_error(CT_ERR_DTYPE,
                         "%s: result type %s can't be cast to the desired output type %s", name,
                         ct_dtype_name(result), ct_dtype_name(dst));
    return CT_OK;
}

static bool same_layout(const ct_tensor *a, const ct_tensor *b) {
    if (a->offset != b->offset || !same_shape(a, b)) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] > 1 && a->stride[d] != b->stride[d]) return false;
    return true;
}

/* a = a op b, computing in cd. */
static ct_status inplace_run(const bin_spec *sp, ct_tensor *a, ct_tensor *b, ct_dtype cd,
                             const cti_pointwise_params *p) {
    ct_status st;
    if (cd != a->dtype) {
        /* Compute in the wider type, then convert into the destination. */
        ct_tensor *tmp = cti_tensor_new(sp->name, a->ndim, a->shape, cd, dev_of(a));
        if (!tmp) return ct_last_status();
        st = run_binary(sp, tmp, a, b, cd, p);
        if (st == CT_OK) st = ct_copy_(a, tmp);
        ct_tensor_release(tmp);
    } else {
        ct_tensor *src = b, *clone = NULL;
        if (b->storage == a->storage && b->dtype == cd && !same_layout(a, b)) {
            /* b would read elements a already overwrote. */
            clone = ct_clone(b);
            if (!clone) return ct_last_status();
            src = clone;
        }
        st = run_binary(sp, a, a, src, cd, p);
        ct_tensor_release(clone);
    }
    if (st == CT_OK) cti_bump_version(a);
    return st;
}

static ct_status inplace(const bin_spec *sp, ct_tensor *a, ct_tensor *b, double alpha) {
    ct_status st = check_two(sp->name, a, b);
    if (st != CT_OK) return st;
    bool record;
    if ((st = check_autograd(sp->name, a, b, &record)) != CT_OK) return st;
    ct_tensor *ts[2] = {a, b};
    ct_dtype rt = a->dtype == b->dtype ? a->dtype : cti_result_type(2, ts);
    ct_dtype cd = compute_dtype(sp->kind, rt);
    if ((st = check_cast(sp->name, cd, a->dtype)) != CT_OK) return st;
    if (sp->op == CT_OP_SUB && (st = check_bool_sub(sp->name, a->dtype, b->dtype)) != CT_OK)
        return st;
    if ((sp->op == CT_OP_ADD || sp->op == CT_OP_SUB) &&
        (st = check_alpha(sp->name, cd, sp->op == CT_OP_SUB ? -alpha : alpha)) != CT_OK)
        return st;
    int nd;
    int64_t shape[CT_MAX_DIMS];
    if ((st = binary_shape(sp->name, a, b, &nd, shape)) != CT_OK) return st;
    if (nd != a->ndim || memcmp(shape, a->shape, sizeof(int64_t) * (size_t)nd) != 0)
        return cti_error(CT_ERR_SHAPE,
                         "%s: output with shape %s doesn't match the broadcast shape %s",
                         sp->name, cti_shape_s(a->ndim, a->shape), cti_shape_s(nd, shape));
    if ((st = check_no_overlap(sp->name, a)) != CT_OK) return st;
    if (record) {
        redo_ctx r = {.op = sp->op, .b = b, .alpha = alpha};
        return cti_inplace_record(sp->name, a, redo, &r);
    }
    cti_pointwise_params p = binary_params(alpha, 0);
    return inplace_run(sp, a, b, cd, &p);
}

static ct_status inplace_scalar(const bin_spec *sp, ct_tensor *a, double s, double alpha) {
    if (!a) return cti_check_not_null(sp->name, 1, &a);
    bool record;
    ct_status st = check_autograd(sp->name, a, NULL, &record);
    if (st != CT_OK) return st;
    ct_dtype rt = scalar_result_type(a->dtype, scalar_dtype(s));
    ct_dtype cd = compute_dtype(sp->kind, rt);
    if ((st = check_cast(sp->name, cd, a->dtype)) != CT_OK) return st;
    if (sp->op == CT_OP_SUB && (st = check_bool_sub(sp->name, a->dtype, a->dtype)) != CT_OK)
        return st;
    if ((st = check_no_overlap(sp->name, a)) != CT_OK) return st;
    if (record) {
        redo_ctx r = {.op = sp->op, .scalar = true, .s = s};
        return cti_inplace_record(sp->name, a, redo, &r);
    }
    ct_tensor *sc = make_scalar(sp->name, s, cd, dev_of(a));
    if (!sc) return ct_last_status();
    cti_pointwise_params p = binary_params(alpha, s);
    st = inplace_run(sp, a, sc, cd, &p);
    ct_tensor_release(sc);
    return st;
}

SPEC(s_add_, "ct_add_", ADD, BK_ARITH);
SPEC(s_add_alpha_, "ct_add_alpha_", ADD, BK_ARITH);
SPEC(s_sub_, "ct_sub_", SUB, BK_ARITH);
SPEC(s_mul_, "ct_mul_", MUL, BK_ARITH);
SPEC(s_div_, "ct_div_", DIV, BK_DIV);
SPEC(s_pow_, "ct_pow_", POW, BK_ARITH);
SPEC(s_add_scalar_, "ct_add_scalar_", ADD, BK_ARITH);
SPEC(s_sub_scalar_, "ct_sub_scalar_", SUB, BK_ARITH);
SPEC(s_mul_scalar_, "ct_mul_scalar_", MUL, BK_ARITH);
SPEC(s_div_scalar_, "ct_div_scalar_", DIV, BK_DIV);

ct_status ct_add_(ct_tensor *a, ct_tensor *b) { return inplace(&s_add_, a, b, 1.0); }
ct_status ct_add_alpha_(ct_tensor *a, ct_tensor *b, double alpha) {
    return inplace(&s_add_alpha_, a, b, alpha);
}
ct_status ct_sub_(ct_tensor *a, ct_tensor *b) { return inplace(&s_sub_, a, b, -1.0); }
ct_status ct_mul_(ct_tensor *a, ct_tensor *b) { return inplace(&s_mul_, a, b, 1.0); }
ct_status ct_div_(ct_tensor *a, ct_tensor *b) { return inplace(&s_div_, a, b, 1.0); }
ct_status ct_pow_(ct_tensor *a, ct_tensor *b) { return inplace(&s_pow_, a, b, 1.0); }
ct_status ct_add_scalar_(ct_tensor *a, double s) {
    return inplace_scalar(&s_add_scalar_, a, s, 1.0);
}
ct_status ct_sub_scalar_(ct_tensor *a, double s) {
    return inplace_scalar(&s_sub_scalar_, a, s, -1.0);
}
ct_status ct_mul_scalar_(ct_tensor *a, double s) {
    return inplace_scalar(&s_mul_scalar_, a, s, 1.0);
}
ct_status ct_div_scalar_(ct_tensor *a, double s) {
    return inplace_scalar(&s_div_scalar_, a, s, 1.0);
}

/* ---- unary ---------------------------------------------------------------------------------- */
typedef enum un_kind {
    UK_FLOAT,      /* float math: integers and bool compute in float32 */
    UK_KEEP,       /* keeps the dtype (integers too) */
    UK_LOGICAL,    /* any dtype in, bool out */
    UK_FLOAT_ONLY, /* floating dtypes only: integers and bool refused, as PyTorch does */
    UK_INTEGRAL,   /* integers and bool only (bitwise_not): floating refused */
} un_kind;

/* What a unary node saves for its formula: x, out (where the derivative is
 * cheaper from the result) or nothing. */
typedef enum un_save { SAVE_NONE, SAVE_X, SAVE_OUT } un_save;

typedef struct un_spec {
    const char *name;
    ct_op op;
    un_kind kind;
    const char *node; /* the autograd node's name; the schema names its formula */
    un_save save;
} un_spec;

/* Compute dtype for x, or an error where PyTorch refuses x's dtype. */
static ct_status unary_dtype(const un_spec *sp, const ct_tensor *x, ct_dtype *cd) {
    ct_dtype dt = x->dtype;
    if (sp->kind == UK_FLOAT_ONLY) {
        *cd = dt;
        return cti_check_floating(sp->name, x, "x");
    }
    if (sp->kind == UK_FLOAT) {
        *cd = ct_dtype_is_floating(dt) ? dt : CT_F32;
        return CT_OK;
    }
    *cd = dt;
    if (sp->kind == UK_INTEGRAL && ct_dtype_is_floating(dt))
        return cti_error(CT_ERR_DTYPE, "%s: expected an integer or bool tensor, got %s", sp->name,
                         ct_dtype_name(dt));
    if (sp->kind == UK_LOGICAL || sp->kind == UK_INTEGRAL || dt != CT_BOOL) return CT_OK;
    switch (sp->op) {
    case CT_OP_SIGN:
    case CT_OP_NAN_TO_NUM: return CT_OK; /* bool stays bool, as in PyTorch */
    case CT_OP_SQUARE: *cd = CT_I64; return CT_OK; /* square is pow(x, 2): int64 */
    case CT_OP_NEG:
        return cti_error(CT_ERR_DTYPE,
                         "%s: negation of a bool tensor is not supported; use ct_logical_not",
                         sp->name);
    default:
        return cti_error(CT_ERR_DTYPE, "%s: not supported for bool tensors", sp->name);
    }
}

static ct_status run_unary(const un_spec *sp, ct_tensor *out, ct_tensor *x, ct_dtype cd,
                           const cti_pointwise_params *p) {
    ct_tensor *tx = NULL, *ix = x;
    if (x->dtype != cd) {
        ix = tx = ct_to_dtype(x, cd);
        if (!tx) return ct_last_status();
    }
    ct_call c;
    cti_call_init(&c, sp->op);
    c.nin = 1;
    c.nout = 1;
    c.in[0] = ix;
    c.out[0] = out;
    cti_call_params(&c, p);
    ct_status st = cti_run(&c, dev_of(out), cd);
    ct_tensor_release(tx);
    return st;
}

/* out = op(x) again for a node that saved x (ct_set_recompute_enabled):
 * the same kernel on the same input, so the same bits. */
static ct_tensor *unary_recompute(cti_node *n) {
    const un_spec *sp = n->recompute_ctx;
    ct_status st;
    ct_tensor *x = cti_ag_saved(n, 0, &st);
    if (!x) return NULL;
    ct_tensor *out = cti_tensor_new(sp->name, x->ndim, x->shape, x->dtype, dev_of(x));
    if (!out) return NULL;
    cti_scope_forget(out);
    if (run_unary(sp, out, x, x->dtype, CTI_NODE_PARAMS(n, cti_pointwise_params)) != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return out;
}

/* Records out = op(x) for autograd when x requires grad: the schema's
 * formula, the spec's node name and saved tensor, the call's parameters.
 * An op that saves x can make out again (recomputation). */
static ct_status unary_record(const un_spec *sp, ct_tensor *x, ct_tensor *out,
                              const cti_pointwise_params *p) {
    cti_backward_fn bw = formula_of[sp->op];
    if (!bw || !cti_ag_needed(1, &x)) return CT_OK; /* logical_not: a bool result */
    ct_tensor *saved = sp->save == SAVE_X ? x : sp->save == SAVE_OUT ? out : NULL;
    bool again = sp->save == SAVE_X && x->dtype == out->dtype;
    return cti_ag_record(&(cti_ag_rec){.name = sp->node, .backward = bw,
                                       .recompute = again ? unary_recompute : NULL,
                                       .recompute_ctx = sp, .nin = 1, .in = {x}, .nout = 1,
                                       .out = {out}, .nsaved = saved ? 1 : 0, .saved = {saved},
                                       CTI_AG_PARAMS(p)});
}

/* out = op(x), the op taking the parameters p (unary: no_params). */
static ct_tensor *unary_p(const un_spec *sp, ct_tensor *x, const cti_pointwise_params *p) {
    if (!x) return (cti_check_not_null(sp->name, 1, &x), NULL);
    ct_dtype cd;
    if (unary_dtype(sp, x, &cd) != CT_OK) return NULL;
    ct_dtype od = sp->kind == UK_LOGICAL ? CT_BOOL : cd;
    ct_tensor *out = cti_tensor_new(sp->name, x->ndim, x->shape, od, dev_of(x));
    if (!out) return NULL;
    if (run_unary(sp, out, x, cd, p) != CT_OK || unary_record(sp, x, out, p) != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return out;
}

static ct_tensor *unary(const un_spec *sp, ct_tensor *x) { return unary_p(sp, x, &no_params); }

static ct_status unary_inplace(const un_spec *sp, ct_tensor *x) {
    if (!x) return cti_check_not_null(sp->name, 1, &x);
    bool record;
    ct_status st = check_autograd(sp->name, x, NULL, &record);
    if (st != CT_OK) return st;
    ct_dtype cd;
    if ((st = unary_dtype(sp, x, &cd)) != CT_OK) return st;
    if ((st = check_cast(sp->name, cd, x->dtype)) != CT_OK) return st;
    if ((st = check_no_overlap(sp->name, x)) != CT_OK) return st;
    if (record) {
        redo_ctx r = {.op = sp->op, .unary = true};
        return cti_inplace_record(sp->name, x, redo, &r);
    }
    if (cd != x->dtype) {
        ct_tensor *tmp = cti_tensor_new(sp->name, x->ndim, x->shape, cd, dev_of(x));
        if (!tmp) return ct_last_status();
        st = run_unary(sp, tmp, x, cd, &no_params);
        if (st == CT_OK) st = ct_copy_(x, tmp);
        ct_tensor_release(tmp);
    } else {
        st = run_unary(sp, x, x, cd, &no_params);
    }
    if (st == CT_OK) cti_bump_version(x);
    return st;
}

#define USPEC(var, nm, OP, kind, node, save)                                                  \
    static const un_spec var = {nm, CT_OP_##OP, kind, node, save}
USPEC(u_neg, "ct_neg", NEG, UK_KEEP, "NegBackward", SAVE_NONE);
USPEC(u_abs, "ct_abs", ABS, UK_KEEP, "AbsBackward", SAVE_X);
USPEC(u_exp, "ct_exp", EXP, UK_FLOAT, "ExpBackward", SAVE_OUT);
USPEC(u_log, "ct_log", LOG, UK_FLOAT, "LogBackward", SAVE_X);
USPEC(u_sqrt, "ct_sqrt", SQRT, UK_FLOAT, "SqrtBackward", SAVE_OUT);
USPEC(u_rsqrt, "ct_rsqrt", RSQRT, UK_FLOAT, "RsqrtBackward", SAVE_OUT);
USPEC(u_sin, "ct_sin", SIN, UK_FLOAT, "SinBackward", SAVE_X);
USPEC(u_cos, "ct_cos", COS, UK_FLOAT, "CosBackward", SAVE_X);
USPEC(u_tanh, "ct_tanh", TANH, UK_FLOAT, "TanhBackward", SAVE_OUT);
USPEC(u_sigmoid, "ct_sigmoid", SIGMOID, UK_FLOAT, "SigmoidBackward", SAVE_OUT);
USPEC(u_relu, "ct_relu", RELU, UK_KEEP, "ReluBackward", SAVE_OUT);
USPEC(u_gelu, "ct_gelu", GELU, UK_FLOAT, "GeluBackward", SAVE_X);
USPEC(u_gelu_tanh, "ct_gelu", GELU_TANH, UK_FLOAT, "GeluBackward", SAVE_X);
USPEC(u_silu, "ct_silu", SILU, UK_FLOAT, "SiluBackward", SAVE_X);
USPEC(u_softplus, "ct_softplus", SOFTPLUS, UK_FLOAT_ONLY, "SoftplusBackward", SAVE_X);
USPEC(u_reciprocal, "ct_reciprocal", RECIPROCAL, UK_FLOAT, "ReciprocalBackward", SAVE_OUT);
USPEC(u_square, "ct_square", SQUARE, UK_KEEP, "SquareBackward", SAVE_X);
USPEC(u_sign, "ct_sign", SIGN, UK_KEEP, "SignBackward", SAVE_NONE);
USPEC(u_logical_not, "ct_logical_not", LOGICAL_NOT, UK_LOGICAL, NULL, SAVE_NONE);
/* In-place forms are not recorded. */
USPEC(u_neg_, "ct_neg_", NEG, UK_KEEP, NULL, SAVE_NONE);
USPEC(u_exp_, "ct_exp_", EXP, UK_FLOAT, NULL, SAVE_NONE);
USPEC(u_sqrt_, "ct_sqrt_", SQRT, UK_FLOAT, NULL, SAVE_NONE);
USPEC(u_relu_, "ct_relu_", RELU, UK_KEEP, NULL, SAVE_NONE);

ct_tensor *ct_neg(ct_tensor *x) { return unary(&u_neg, x); }
ct_tensor *ct_abs(ct_tensor *x) { return unary(&u_abs, x); }
ct_tensor *ct_exp(ct_tensor *x) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_EXP, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_exp(ac.in[0]) : NULL);
    return unary(&u_exp, x);
}
ct_tensor *ct_log(ct_tensor *x) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_LOG, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_log(ac.in[0]) : NULL);
    return unary(&u_log, x);
}
ct_tensor *ct_sqrt(ct_tensor *x) { return unary(&u_sqrt, x); }
ct_tensor *ct_rsqrt(ct_tensor *x) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_RSQRT, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_rsqrt(ac.in[0]) : NULL);
    return unary(&u_rsqrt, x);
}
ct_tensor *ct_sin(ct_tensor *x) { return unary(&u_sin, x); }
ct_tensor *ct_cos(ct_tensor *x) { return unary(&u_cos, x); }
ct_tensor *ct_tanh(ct_tensor *x) { return unary(&u_tanh, x); }
ct_tensor *ct_sigmoid(ct_tensor *x) { return unary(&u_sigmoid, x); }
ct_tensor *ct_relu(ct_tensor *x) { return unary(&u_relu, x); }
ct_tensor *ct_gelu(ct_tensor *x, ct_gelu_approx approximate) {
    if (cti_check_gelu_approx("ct_gelu", approximate) != CT_OK) return NULL;
    return unary(approximate == CT_GELU_TANH ? &u_gelu_tanh : &u_gelu, x);
}
ct_tensor *ct_silu(ct_tensor *x) { return unary(&u_silu, x); }
/* The checks of a backward pointwise op's operands: grad_out and x of one
 * floating dtype, one shape and one device, as autograd passes them. */
static ct_status check_backward_pair(const char *name, ct_tensor *grad_out, ct_tensor *x) {
    if (check_two(name, grad_out, x) != CT_OK) return ct_last_status();
    if (!ct_dtype_is_floating(x->dtype))
        return cti_error(CT_ERR_DTYPE, "%s: expected a floating dtype for x, got %s", name,
                         ct_dtype_name(x->dtype));
    if (grad_out->dtype != x->dtype)
        return cti_error(CT_ERR_DTYPE, "%s: expected grad_out of x's dtype %s, got %s", name,
                         ct_dtype_name(x->dtype), ct_dtype_name(grad_out->dtype));
    if (!same_shape(grad_out, x))
        return cti_error(CT_ERR_SHAPE, "%s: expected grad_out of x's shape, got %s and %s",
                         name, cti_desc(grad_out), cti_desc(x));
    return CT_OK;
}

/* A backward pointwise op on a checked pair: a new contiguous result of x's
 * geometry, or NULL with the error. */
static ct_tensor *run_backward_pair(const bin_spec *sp, ct_tensor *grad_out, ct_tensor *x,
                                    const cti_pointwise_params *p) {
    ct_tensor *out = cti_tensor_new(sp->name, x->ndim, x->shape, x->dtype, dev_of(x));
    if (out && run_binary(sp, out, grad_out, x, x->dtype, p) != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return out;
}

/* grad_out times gelu's derivative at x, in one kernel: what the formulas of
 * both approximations run. The operands agree in dtype (floating), shape and
 * device, as autograd passes them; the result is new and contiguous. */
ct_tensor *ct_gelu_backward(ct_tensor *grad_out, ct_tensor *x, ct_gelu_approx approximate) {
    static const bin_spec sp = {"ct_gelu_backward", CT_OP_GELU_BACKWARD, BK_ARITH};
    if (check_backward_pair(sp.name, grad_out, x) != CT_OK) return NULL;
    if (cti_check_gelu_approx(sp.name, approximate) != CT_OK) return NULL;
    const cti_pointwise_params p = {.approximate = approximate};
    return run_backward_pair(&sp, grad_out, x, &p);
}

/* relu's backward in one kernel, where the compare, the zero and the select
 * were three (a host-bound step pays for each launch). */
ct_tensor *ct_threshold_backward(ct_tensor *grad_out, ct_tensor *x, double threshold) {
    static const bin_spec sp = {"ct_threshold_backward", CT_OP_THRESHOLD_BACKWARD, BK_ARITH};
    if (check_backward_pair(sp.name, grad_out, x) != CT_OK) return NULL;
    const cti_pointwise_params p = {.threshold = threshold};
    return run_backward_pair(&sp, grad_out, x, &p);
}
ct_tensor *ct_softplus(ct_tensor *x, double beta, double threshold) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_SOFTPLUS, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_softplus(ac.in[0], beta, threshold) : NULL);
    cti_pointwise_params p = {.beta = beta, .threshold = threshold};
    return unary_p(&u_softplus, x, &p);
}
ct_tensor *ct_reciprocal(ct_tensor *x) {
    cti_autocast_call ac;
    if (cti_autocast_begin_op(&ac, CTI_AC_RECIPROCAL, 1, &x))
        return cti_autocast_end_op(&ac, ac.ok ? ct_reciprocal(ac.in[0]) : NULL);
    return unary(&u_reciprocal, x);
}
ct_tensor *ct_square(ct_tensor *x) { return unary(&u_square, x); }
ct_tensor *ct_sign(ct_tensor *x) { return unary(&u_sign, x); }
ct_tensor *ct_logical_not(ct_tensor *x) { return unary(&u_logical_not, x); }

ct_status ct_neg_(ct_tensor *x) { return unary_inplace(&u_neg_, x); }
ct_status ct_exp_(ct_tensor *x) { return unary_inplace(&u_exp_, x); }
ct_status ct_sqrt_(ct_tensor *x) { return unary_inplace(&u_sqrt_, x); }
ct_status ct_relu_(ct_tensor *x) { return unary_inplace(&u_relu_, x); }

/* ---- selection ---------------------------------------------------------------------------- */
ct_tensor *ct_where(ct_tensor *cond, ct_tensor *a, ct_tensor *b) {
    static const char *name = "ct_where";
    ct_tensor *ts[3] = {cond, a, b};
    if (cti_check_not_null(name, 3, ts) != CT_OK) return NULL;
    if (cti_check_same_device(name, 3, ts) != CT_OK) return NULL;
    if (cond->dtype != CT_BOOL)
        return cti_error_null(CT_ERR_DTYPE, "%s: expected a bool condition, got %s (%s)", name,
                              ct_dtype_name(cond->dtype), cti_desc(cond));
    ct_tensor *ab[2] = {a, b};
    ct_dtype rt = a->dtype == b->dtype ? a->dtype : cti_result_type(2, ab);
    int n1, nd;
    int64_t s1[CT_MAX_DIMS], shape[CT_MAX_DIMS];
    if (cti_broadcast_shapes(name, cond->ndim, cond->shape, a->ndim, a->shape, &n1, s1) != CT_OK)
        return NULL;
    if (cti_broadcast_shapes(name, n1, s1, b->ndim, b->shape, &nd, shape) != CT_OK) return NULL;
    ct_tensor *ta = NULL, *tb = NULL, *out = NULL;
    ct_tensor *ia = a, *ib = b;
    if (a->dtype != rt && !(ia = ta = ct_to_dtype(a, rt))) goto fail;
    if (b->dtype != rt && !(ib = tb = ct_to_dtype(b, rt))) goto fail;
    if (!(out = cti_tensor_new(name, nd, shape, rt, dev_of(cond)))) goto fail;
    ct_call c;
    cti_call_init(&c, CT_OP_WHERE);
    c.nin = 3;
    c.nout = 1;
    c.in[0] = cond;
    c.in[1] = ia;
    c.in[2] = ib;
    c.out[0] = out;
    cti_call_params(&c, &no_params);
    if (cti_run(&c, dev_of(cond), rt) != CT_OK) goto fail;
    /* The node's inputs are a and b; the condition is saved, not an input. */
    if (cti_ag_needed(2, ab) &&
        cti_ag_record(&(cti_ag_rec){.name = "WhereBackward",
                                    .backward = formula_of[CT_OP_WHERE], .nin = 2, .in = {a, b},
                                    .nout = 1, .out = {out}, .nsaved = 1, .saved = {cond}}) !=
            CT_OK)
        goto fail;
    ct_tensor_release(ta);
    ct_tensor_release(tb);
    return out;
fail:
    ct_tensor_release(ta);
    ct_tensor_release(tb);
    ct_tensor_release(out);
    return NULL;
}

/* Integer bounds: results must lie in [min, max], so min rounds up and max
 * down, and both saturate to the dtype's range. */
static int64_t int_bound(double v, bool is_min, ct_dtype dt) {
    double lo = dt == CT_I32 ? -2147483648.0 : -INT64_LIMIT;
    double hi = dt == CT_I32 ? 2147483647.0 : 9223372036854774784.0; /* largest double < 2^63 */
    double r = is_min ? ceil(v) : floor(v);
    if (r <= lo) return dt == CT_I32 ? INT32_MIN : INT64_MIN;
    if (r >= hi && dt == CT_I32) return INT32_MAX;
    if (r >= INT64_LIMIT) return INT64_MAX;
    return (int64_t)r;
}

/* Checks clamp's arguments and fills the call on x with its bounds in *p
 * (which must outlive the dispatch): as given, and for integer tensors also
 * in integer form. ClampBackward reads the floating ones. */
static ct_status clamp_check(const char *name, const ct_tensor *x, double min, double max,
                             ct_call *c, cti_pointwise_params *p) {
    if (x->dtype == CT_BOOL)
        return cti_error(CT_ERR_DTYPE, "%s: not supported for bool tensors", name);
    if (!ct_dtype_is_floating(x->dtype) && (isnan(min) || isnan(max)))
        return cti_error(CT_ERR_INVALID_ARG, "%s: NaN bound (min %g, max %g) for a %s tensor",
                         name, min, max, ct_dtype_name(x->dtype));
    cti_call_init(c, CT_OP_CLAMP);
    c->nin = 1;
    c->nout = 1;
    c->in[0] = (ct_tensor *)x;
    *p = (cti_pointwise_params){.lo = min, .hi = max};
    if (!ct_dtype_is_floating(x->dtype)) {
        p->ilo = int_bound(min, true, x->dtype);
        p->ihi = int_bound(max, false, x->dtype);
    }
    cti_call_params(c, p);
    return CT_OK;
}

/* A finite bound with a fraction: PyTorch's Python float, which makes an
 * integer tensor's clamp a float32 one. */
static bool fractional(double v) { return isfinite(v) && v != floor(v); }

ct_tensor *ct_clamp(ct_tensor *x, double min, double max) {
    static const char *name = "ct_clamp";
    if (!x) return (cti_check_not_null(name, 1, &x), NULL);
    if (x->dtype != CT_BOOL && !ct_dtype_is_floating(x->dtype) && (fractional(min) || fractional(max))) {
        ct_tensor *xf = ct_to_dtype(x, CT_F32);
        if (!xf) return NULL;
        ct_tensor *r = ct_clamp(xf, min, max);
        ct_tensor_release(xf);
        return r;
    }
    ct_call c;
    cti_pointwise_params p;
    if (clamp_check(name, x, min, max, &c, &p) != CT_OK) return NULL;
    ct_tensor *out = cti_tensor_new(name, x->ndim, x->shape, x->dtype, dev_of(x));
    if (!out) return NULL;
    c.out[0] = out;
    if (cti_run(&c, dev_of(x), x->dtype) != CT_OK ||
        (cti_ag_needed(1, &x) &&
         cti_ag_record(&(cti_ag_rec){.name = "ClampBackward",
                                     .backward = formula_of[CT_OP_CLAMP], .nin = 1, .in = {x},
                                     .nout = 1, .out = {out}, .nsaved = 1, .saved = {x},
                                     CTI_AG_PARAMS(&p)}) != CT_OK)) {
        ct_tensor_release(out);
        return NULL;
    }
    return out;
}

ct_status ct_clamp_(ct_tensor *a, double min, double max) {
    static const char *name = "ct_clamp_";
    if (!a) return cti_check_not_null(name, 1, &a);
    bool record;
    ct_status st = check_autograd(name, a, NULL, &record);
    if (st != CT_OK) return st;
    ct_call c;
    cti_pointwise_params p;
    if (a->dtype != CT_BOOL && !ct_dtype_is_floating(a->dtype) && (fractional(min) || fractional(max)))
        return cti_error(CT_ERR_DTYPE,
                         "%s: the bounds (min %g, max %g) make the result float32, which an "
                         "in-place clamp cannot write into a %s tensor; use ct_clamp",
                         name, min, max, ct_dtype_name(a->dtype));
    if ((st = clamp_check(name, a, min, max, &c, &p)) != CT_OK) return st;
    if ((st = check_no_overlap(name, a)) != CT_OK) return st;
    if (record) {
        redo_ctx r = {.clamp = true, .min = min, .max = max};
        return cti_inplace_record(name, a, redo, &r);
    }
    c.out[0] = a;
    st = cti_run(&c, dev_of(a), a->dtype);
    if (st == CT_OK) cti_bump_version(a);
    return st;
}

/* ---- math, activations, rounding, bitwise, lerp ------------------------------------------------ */
USPEC(u_log1p, "ct_log1p", LOG1P, UK_FLOAT, "Log1PBackward", SAVE_X);
USPEC(u_expm1, "ct_expm1", EXPM1, UK_FLOAT, "Expm1Backward", SAVE_OUT);
USPEC(u_log2, "ct_log2", LOG2, UK_FLOAT, "Log2Backward", SAVE_X);
USPEC(u_log10, "ct_log10", LOG10, UK_FLOAT, "Log10Backward", SAVE_X);
USPEC(u_exp2, "ct_exp2", EXP2, UK_FLOAT, "Exp2Backward", SAVE_OUT);
USPEC(u_floor, "ct_floor", FLOOR, UK_KEEP, "FloorBackward", SAVE_NONE);
USPEC(u_ceil, "ct_ceil", CEIL, UK_KEEP, "CeilBackward", SAVE_NONE);
USPEC(u_round, "ct_round", ROUND, UK_KEEP, "RoundBackward", SAVE_NONE);
USPEC(u_round_decimals, "ct_round_decimals", ROUND_DECIMALS, UK_FLOAT_ONLY, "RoundBackward",
      SAVE_NONE);
USPEC(u_trunc, "ct_trunc", TRUNC, UK_KEEP, "TruncBackward", SAVE_NONE);
USPEC(u_frac, "ct_frac", FRAC, UK_FLOAT_ONLY, "FracBackward", SAVE_NONE);
USPEC(u_erf, "ct_erf", ERF, UK_FLOAT, "ErfBackward", SAVE_X);
USPEC(u_erfc, "ct_erfc", ERFC, UK_FLOAT, "ErfcBackward", SAVE_X);
USPEC(u_erfinv, "ct_erfinv", ERFINV, UK_FLOAT, "ErfinvBackward", SAVE_OUT);
USPEC(u_tan, "ct_tan", TAN, UK_FLOAT, "TanBackward", SAVE_OUT);
USPEC(u_asin, "ct_asin", ASIN, UK_FLOAT, "AsinBackward", SAVE_X);
USPEC(u_acos, "ct_acos", ACOS, UK_FLOAT, "AcosBackward", SAVE_X);
USPEC(u_atan, "ct_atan", ATAN, UK_FLOAT, "AtanBackward", SAVE_X);
USPEC(u_sinh, "ct_sinh", SINH, UK_FLOAT, "SinhBackward", SAVE_X);
USPEC(u_cosh, "ct_cosh", COSH, UK_FLOAT, "CoshBackward", SAVE_X);
USPEC(u_asinh, "ct_asinh", ASINH, UK_FLOAT, "AsinhBackward", SAVE_X);
USPEC(u_acosh, "ct_acosh", ACOSH, UK_FLOAT, "AcoshBackward", SAVE_X);
USPEC(u_atanh, "ct_atanh", ATANH, UK_FLOAT, "AtanhBackward", SAVE_X);
USPEC(u_leaky_relu, "ct_leaky_relu", LEAKY_RELU, UK_FLOAT_ONLY, "LeakyReluBackward", SAVE_X);
USPEC(u_elu, "ct_elu", ELU, UK_FLOAT_ONLY, "EluBackward", SAVE_X);
USPEC(u_selu, "ct_selu", ELU, UK_FLOAT_ONLY, "EluBackward", SAVE_X);
USPEC(u_celu, "ct_celu", ELU, UK_FLOAT_ONLY, "EluBackward", SAVE_X);
USPEC(u_mish, "ct_mish", MISH, UK_FLOAT_ONLY, "MishBackward", SAVE_X);
USPEC(u_hardtanh, "ct_hardtanh", HARDTANH, UK_FLOAT_ONLY, "HardtanhBackward", SAVE_X);
USPEC(u_hardsigmoid, "ct_hardsigmoid", HARDSIGMOID, UK_FLOAT_ONLY, "HardsigmoidBackward",
      SAVE_X);
USPEC(u_hardswish, "ct_hardswish", HARDSWISH, UK_FLOAT_ONLY, "HardswishBackward", SAVE_X);
USPEC(u_logsigmoid, "ct_logsigmoid", LOGSIGMOID, UK_FLOAT_ONLY, "LogSigmoidBackward", SAVE_X);
USPEC(u_nan_to_num, "ct_nan_to_num", NAN_TO_NUM, UK_KEEP, "NanToNumBackward", SAVE_X);
USPEC(u_isnan, "ct_isnan", ISNAN, UK_LOGICAL, NULL, SAVE_NONE);
USPEC(u_isinf, "ct_isinf", ISINF, UK_LOGICAL, NULL, SAVE_NONE);
USPEC(u_isfinite, "ct_isfinite", ISFINITE, UK_LOGICAL, NULL, SAVE_NONE);
USPEC(u_bitwise_not, "ct_bitwise_not", BITWISE_NOT, UK_INTEGRAL, NULL, SAVE_NONE);

ct_tensor *ct_log1p(ct_tensor *x) { return unary(&u_log1p, x); }
ct_tensor *ct_expm1(ct_tensor *x) { return unary(&u_expm1, x); }
ct_tensor *ct_log2(ct_tensor *x) { return unary(&u_log2, x); }
ct_tensor *ct_log10(ct_tensor *x) { return unary(&u_log10, x); }
ct_tensor *ct_exp2(ct_tensor *x) { return unary(&u_exp2, x); }
ct_tensor *ct_floor(ct_tensor *x) { return unary(&u_floor, x); }
ct_tensor *ct_ceil(ct_tensor *x) { return unary(&u_ceil, x); }
ct_tensor *ct_round(ct_tensor *x) { return unary(&u_round, x); }
ct_tensor *ct_round_decimals(ct_tensor *x, int64_t decimals) {
    if (decimals == 0) {
        if (x && !ct_dtype_is_floating(x->dtype))
            return cti_error_null(CT_ERR_DTYPE, "ct_round_decimals: expected a floating dtype "
                                                "for x, got %s", ct_dtype_name(x->dtype));
        return ct_round(x);
    }
    /* 10^d is inf in float64 past 308 (PyTorch's too); keep |d| in a range pow takes */
    if (decimals > 400 || decimals < -400)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "ct_round_decimals: decimals must be within [-400, 400], got %lld",
                              (long long)decimals);
    cti_pointwise_params p = {.decimals = decimals};
    return unary_p(&u_round_decimals, x, &p);
}
ct_tensor *ct_trunc(ct_tensor *x) { return unary(&u_trunc, x); }
ct_tensor *ct_frac(ct_tensor *x) { return unary(&u_frac, x); }
ct_tensor *ct_erf(ct_tensor *x) { return unary(&u_erf, x); }
ct_tensor *ct_erfc(ct_tensor *x) { return unary(&u_erfc, x); }
ct_tensor *ct_erfinv(ct_tensor *x) { return unary(&u_erfinv, x); }
ct_tensor *ct_tan(ct_tensor *x) { return unary(&u_tan, x); }
ct_tensor *ct_asin(ct_tensor *x) { return unary(&u_asin, x); }
ct_tensor *ct_acos(ct_tensor *x) { return unary(&u_acos, x); }
ct_tensor *ct_atan(ct_tensor *x) { return unary(&u_atan, x); }
ct_tensor *ct_sinh(ct_tensor *x) { return unary(&u_sinh, x); }
ct_tensor *ct_cosh(ct_tensor *x) { return unary(&u_cosh, x); }
ct_tensor *ct_asinh(ct_tensor *x) { return unary(&u_asinh, x); }
ct_tensor *ct_acosh(ct_tensor *x) { return unary(&u_acosh, x); }
ct_tensor *ct_atanh(ct_tensor *x) { return unary(&u_atanh, x); }
ct_tensor *ct_leaky_relu(ct_tensor *x, double negative_slope) {
    cti_pointwise_params p = {.negative_slope = negative_slope};
    return unary_p(&u_leaky_relu, x, &p);
}
ct_tensor *ct_elu(ct_tensor *x, double alpha) {
    cti_pointwise_params p = {.elu_alpha = alpha, .elu_scale = 1, .elu_input_scale = 1};
    return unary_p(&u_elu, x, &p);
}
ct_tensor *ct_selu(ct_tensor *x) {
    cti_pointwise_params p = {.elu_alpha = 1.6732632423543772848170429916717,
                              .elu_scale = 1.0507009873554804934193349852946,
                              .elu_input_scale = 1};
    return unary_p(&u_selu, x, &p);
}
ct_tensor *ct_celu(ct_tensor *x, double alpha) {
    if (alpha == 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "ct_celu: alpha must not be 0 (it divides x)");
    cti_pointwise_params p = {.elu_alpha = alpha, .elu_scale = 1, .elu_input_scale = 1 / alpha};
    return unary_p(&u_celu, x, &p);
}
ct_tensor *ct_mish(ct_tensor *x) { return unary(&u_mish, x); }
ct_tensor *ct_hardtanh(ct_tensor *x, double min_val, double max_val) {
    if (min_val > max_val)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "ct_hardtanh: min_val (%g) cannot be greater than max_val (%g)",
                              min_val, max_val);
    cti_pointwise_params p = {.lo = min_val, .hi = max_val};
    return unary_p(&u_hardtanh, x, &p);
}
ct_tensor *ct_hardsigmoid(ct_tensor *x) { return unary(&u_hardsigmoid, x); }
ct_tensor *ct_hardswish(ct_tensor *x) { return unary(&u_hardswish, x); }
ct_tensor *ct_logsigmoid(ct_tensor *x) { return unary(&u_logsigmoid, x); }

/* The largest finite value of a floating dtype (nan_to_num's default for +inf). */
static double dtype_max(ct_dtype dt) {
    switch (dt) {
    case CT_F16: return 65504.0;
    case CT_BF16: return 3.3895313892515355e38;
    case CT_F32: return 3.4028234663852886e38;
    default: return 1.7976931348623157e308;
    }
}

ct_tensor *ct_nan_to_num(ct_tensor *x, double nan, double posinf, double neginf) {
    if (!x) return (cti_check_not_null("ct_nan_to_num", 1, &x), NULL);
    double top = dtype_max(x->dtype);
    cti_pointwise_params p = {.nan_val = nan, .posinf_val = isnan(posinf) ? top : posinf,
                              .neginf_val = isnan(neginf) ? -top : neginf};
    return unary_p(&u_nan_to_num, x, &p);
}
ct_tensor *ct_isnan(ct_tensor *x) { return unary(&u_isnan, x); }
ct_tensor *ct_isinf(ct_tensor *x) { return unary(&u_isinf, x); }
ct_tensor *ct_isfinite(ct_tensor *x) { return unary(&u_isfinite, x); }
ct_tensor *ct_bitwise_not(ct_tensor *x) { return unary(&u_bitwise_not, x); }

SPEC(s_atan2, "ct_atan2", ATAN2, BK_DIV);
SPEC(s_fmod, "ct_fmod", FMOD, BK_ARITH);
SPEC(s_remainder, "ct_remainder", REMAINDER, BK_ARITH);
SPEC(s_bitwise_and, "ct_bitwise_and", BITWISE_AND, BK_ARITH);
SPEC(s_bitwise_or, "ct_bitwise_or", BITWISE_OR, BK_ARITH);
SPEC(s_bitwise_xor, "ct_bitwise_xor", BITWISE_XOR, BK_ARITH);
SPEC(s_bitwise_left_shift, "ct_bitwise_left_shift", BITWISE_LEFT_SHIFT, BK_ARITH);
SPEC(s_bitwise_right_shift, "ct_bitwise_right_shift", BITWISE_RIGHT_SHIFT, BK_ARITH);
SPEC(s_fmod_scalar, "ct_fmod_scalar", FMOD, BK_ARITH);
SPEC(s_remainder_scalar, "ct_remainder_scalar", REMAINDER, BK_ARITH);
SPEC(s_bitwise_and_scalar, "ct_bitwise_and_scalar", BITWISE_AND, BK_ARITH);
SPEC(s_bitwise_or_scalar, "ct_bitwise_or_scalar", BITWISE_OR, BK_ARITH);
SPEC(s_bitwise_xor_scalar, "ct_bitwise_xor_scalar", BITWISE_XOR, BK_ARITH);
SPEC(s_bitwise_left_shift_scalar, "ct_bitwise_left_shift_scalar", BITWISE_LEFT_SHIFT, BK_ARITH);
SPEC(s_bitwise_right_shift_scalar, "ct_bitwise_right_shift_scalar", BITWISE_RIGHT_SHIFT,
     BK_ARITH);

ct_tensor *ct_atan2(ct_tensor *a, ct_tensor *b) { return binary(&s_atan2, a, b, 1.0); }
ct_tensor *ct_fmod(ct_tensor *a, ct_tensor *b) { return binary(&s_fmod, a, b, 1.0); }
ct_tensor *ct_remainder(ct_tensor *a, ct_tensor *b) { return binary(&s_remainder, a, b, 1.0); }
ct_tensor *ct_bitwise_and(ct_tensor *a, ct_tensor *b) { return binary(&s_bitwise_and, a, b, 1.0); }
ct_tensor *ct_bitwise_or(ct_tensor *a, ct_tensor *b) { return binary(&s_bitwise_or, a, b, 1.0); }
ct_tensor *ct_bitwise_xor(ct_tensor *a, ct_tensor *b) { return binary(&s_bitwise_xor, a, b, 1.0); }
ct_tensor *ct_bitwise_left_shift(ct_tensor *a, ct_tensor *b) {
    return binary(&s_bitwise_left_shift, a, b, 1.0);
}
ct_tensor *ct_bitwise_right_shift(ct_tensor *a, ct_tensor *b) {
    return binary(&s_bitwise_right_shift, a, b, 1.0);
}
/* An integer a by a scalar 0 fails on every device (nothing to read). */
static bool int_by_zero(const char *op, const ct_tensor *a, double s) {
    if (!a || s != 0 || ct_dtype_is_floating(a->dtype) || a->dtype == CT_BOOL) return false;
    cti_error(CT_ERR_INVALID_ARG, "%s: ZeroDivisionError: integer division by zero (s is 0, a %s)",
              op, cti_desc(a));
    return true;
}
ct_tensor *ct_fmod_scalar(ct_tensor *a, double s) {
    return int_by_zero("ct_fmod_scalar", a, s) ? NULL : binary_scalar(&s_fmod_scalar, a, s, false, 1.0);
}
ct_tensor *ct_remainder_scalar(ct_tensor *a, double s) {
    return int_by_zero("ct_remainder_scalar", a, s) ? NULL
                                                     : binary_scalar(&s_remainder_scalar, a, s, false, 1.0);
}
SCALAR_OP(ct_bitwise_and_scalar, s_bitwise_and_scalar)
SCALAR_OP(ct_bitwise_or_scalar, s_bitwise_or_scalar)
SCALAR_OP(ct_bitwise_xor_scalar, s_bitwise_xor_scalar)
SCALAR_OP(ct_bitwise_left_shift_scalar, s_bitwise_left_shift_scalar)
SCALAR_OP(ct_bitwise_right_shift_scalar, s_bitwise_right_shift_scalar)

/* ---- lerp -------------------------------------------------------------------------------------- */
/* start + weight (end - start) into a new tensor; w is a tensor, or NULL with
 * the number ws (held in a 0-d tensor of the dtype, the node reading ws from
 * the parameters). PyTorch requires one floating dtype of all three. */
static ct_tensor *lerp_impl(const char *name, ct_tensor *start, ct_tensor *end, ct_tensor *w,
                            double ws) {
    ct_tensor *ts[3] = {start, end, w};
    int nt = w ? 3 : 2;
    if (cti_check_not_null(name, nt, ts) != CT_OK) return NULL;
    if (cti_check_same_device(name, nt, ts) != CT_OK) return NULL;
    if (cti_check_floating(name, start, "start") != CT_OK) return NULL;
    static const char *const what[3] = {"start", "end", "weight"};
    for (int k = 1; k < nt; k++)
        if (ts[k]->dtype != start->dtype)
            return cti_error_null(CT_ERR_DTYPE, "%s: expected dtype %s for %s, got %s", name,
                                  ct_dtype_name(start->dtype), what[k],
                                  ct_dtype_name(ts[k]->dtype));
    int n1, nd = 0;
    int64_t s1[CT_MAX_DIMS], shape[CT_MAX_DIMS];
    if (cti_broadcast_shapes(name, start->ndim, start->shape, end->ndim, end->shape, &n1, s1) !=
        CT_OK)
        return NULL;
    if (w) {
        if (cti_broadcast_shapes(name, n1, s1, w->ndim, w->shape, &nd, shape) != CT_OK)
            return NULL;
    } else {
        nd = n1;
        memcpy(shape, s1, sizeof(int64_t) * (size_t)n1);
    }
    ct_tensor *sc = NULL;
    if (!w && !(sc = make_scalar(name, ws, start->dtype, dev_of(start)))) return NULL;
    ct_tensor *out = cti_tensor_new(name, nd, shape, start->dtype, dev_of(start));
    if (!out) {
        ct_tensor_release(sc);
        return NULL;
    }
    cti_pointwise_params p = {.scalar = ws};
    ct_call c;
    cti_call_init(&c, CT_OP_LERP);
    c.nin = 3;
    c.nout = 1;
    c.in[0] = start;
    c.in[1] = end;
    c.in[2] = w ? w : sc;
    c.out[0] = out;
    cti_call_params(&c, &p);
    ct_status st = cti_run(&c, dev_of(out), start->dtype);
    ct_tensor_release(sc);
    if (st == CT_OK && cti_ag_needed(nt, ts))
        st = cti_ag_record(&(cti_ag_rec){.name = "LerpBackward", .backward = cti_bw_lerp,
                                         .nin = nt, .in = {start, end, w}, .nout = 1,
                                         .out = {out}, .nsaved = 3, .saved = {start, end, w},
                                         CTI_AG_PARAMS(&p)});
    if (st != CT_OK) {
        ct_tensor_release(out);
        return NULL;
    }
    return out;
}

ct_tensor *ct_lerp(ct_tensor *start, ct_tensor *end, ct_tensor *weight) {
    if (!weight) {
        ct_tensor *ts[3] = {start, end, weight};
        return (cti_check_not_null("ct_lerp", 3, ts), NULL);
    }
    return lerp_impl("ct_lerp", start, end, weight, 0);
}
ct_tensor *ct_lerp_scalar(ct_tensor *start, ct_tensor *end, double weight) {
    return lerp_impl("ct_lerp_scalar", start, end, NULL, weight);
}

/* ---- clamp with tensor bounds ------------------------------------------------------------------- */
/* maximum, then minimum: PyTorch's promotion of the three (result_type is
 * associative over these categories), broadcasting, and NaN from any of them
 * (as PyTorch's kernel, which gives NaN for a NaN bound). The gradient is
 * that of maximum and minimum: where x equals a bound, the two share it. */
ct_tensor *ct_clamp_tensor(ct_tensor *x, ct_tensor *min, ct_tensor *max) {
    static const char *name = "ct_clamp_tensor";
    if (!x) return (cti_check_not_null(name, 1, &x), NULL);
    if (!min && !max)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: at least one of min and max must be given (not NULL)", name);
    ct_tensor *ts[3] = {x, min ? min : x, max ? max : x};
    if (cti_check_same_device(name, 3, ts) != CT_OK) return NULL;
    ct_tensor *all[3] = {x, min ? min : x, max ? max : x};
    if (cti_result_type(3, all) == CT_BOOL)
        return cti_error_null(CT_ERR_DTYPE, "%s: not supported for bool tensors", name);
    /* without min, x goes to minimum as it is: a retain and release of it
     * would take it out of the caller's scope */
    if (!min) return ct_minimum(x, max);
    ct_tensor *lo = ct_maximum(x, min);
    if (!lo || !max) return lo;
    ct_tensor *r = ct_minimum(lo, max);
    ct_tensor_release(lo);
    return r;
}
