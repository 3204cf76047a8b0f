/* Private to the CPU kernels of the neural-network ops: compiles the file
 * that NN_TYPED names (a string) once per row type, with
 *   NN_T      the row type: float (for f32, f16 and bf16), then double (f64)
 *   NN_F(x)   a typed function's name: x_f, then x_d
 *   NN_IS_FLOAT  1 for float, 0 for double (for #if)
 *   NN_EXP, NN_LOG, NN_SQRT   the row type's exp, log and sqrt; float's exp
 *             is vmath.h's (flushing results below FLT_MIN to 0), which GCC
 *             can vectorize
 * A file includes itself this way for its typed part (the conv.c pattern),
 * which it keeps under #ifdef NN_T. No include guard: it runs once per
 * instantiated file, and undefines NN_TYPED when done. */
#ifndef NN_F
#define NN_CAT_(a, b) a##_##b
#define NN_CAT(a, b) NN_CAT_(a, b)
#define NN_F(name) NN_CAT(name, NN_S)
#endif

#define NN_T float
#define NN_S f
#define NN_IS_FLOAT 1
#define NN_EXP(x) vm_exp_ftz(x, 0.0f, 0)
#define NN_LOG logf
#define NN_SQRT sqrtf
#include NN_TYPED
#undef NN_T
#undef NN_S
#undef NN_IS_FLOAT
#undef NN_EXP
#undef NN_LOG
#undef NN_SQRT

#define NN_T double
#define NN_S d
#define NN_IS_FLOAT 0
#define NN_EXP exp
#define NN_LOG log
#define NN_SQRT sqrt
#include NN_TYPED
#undef NN_T
#undef NN_S
#undef NN_IS_FLOAT
#undef NN_EXP
#undef NN_LOG
#undef NN_SQRT

#undef NN_TYPED
