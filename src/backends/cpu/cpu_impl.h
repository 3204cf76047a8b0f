/* Private to the CPU backend: instruction-set levels, thread pool,
 * elementwise iteration, and the registration functions of each kernel file. */
#ifndef CTEN_CPU_IMPL_H
#define CTEN_CPU_IMPL_H

#include "../../dispatch/dispatch_impl.h"

/* ---- instruction-set levels (isa.c) ------------------------------------------------
 * The library is built for a baseline (x86-64-v2 on x86-64) so that it loads
 * on any CPU; the kernel files are compiled once more per level above it
 * (meson.build: cpu_isa_levels) and init registers one level's kernels:
 *   baseline  x86-64-v2: SSE4.2, POPCNT
 *   avx2      x86-64-v3: AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE
 *   avx512    x86-64-v4: v3 + AVX-512 F/BW/CD/DQ/VL
 * A level counts as present when cpuid reports its instructions and XCR0
 * says the OS saves its registers (YMM; opmask and ZMM for AVX-512).
 * CT_CPU_ISA=baseline|avx2|avx512 lowers the choice (tests run each level).
 * A -Dnative=true build compiles the kernels once, for the build machine. */
typedef enum cti_isa { CTI_ISA_BASELINE, CTI_ISA_AVX2, CTI_ISA_AVX512, CTI_ISA_COUNT } cti_isa;

/* The level chosen at init: the best present, lowered by CT_CPU_ISA. Kernels
 * with hand-written paths for a level (under __attribute__((target))) take
 * them only when this is at least that level. */
cti_isa cti_cpu_isa(void);
/* The best level this CPU and OS run. */
cti_isa cti_cpu_isa_detected(void);
/* Whether the chosen level is avx512 and the CPU has AVX512_BF16 too. */
bool cti_cpu_has_avx512_bf16(void);
const char *cti_cpu_isa_name(cti_isa level);
/* Decides the level (once, at the CPU backend's registration). */
void cti_cpu_isa_init(void);
/* One line for ct_print_info: the level the kernels run, why, what was built. */
void cti_cpu_isa_describe(char *buf, size_t n);

/* The kernel sets this build compiles, X(suffix): each defines
 * cti_cpu_register_kernels_<suffix> (kernels.c). */
#if defined(CTI_CPU_NATIVE)
#define CTI_CPU_KERNEL_SETS(X) X(native)
#elif defined(__x86_64__)
#define CTI_CPU_KERNEL_SETS(X) X(baseline) X(avx2) X(avx512)
#else
#define CTI_CPU_KERNEL_SETS(X) X(baseline)
#endif
#define CTI_ISA_CAT_(a, b) a##_##b
#define CTI_ISA_CAT(a, b) CTI_ISA_CAT_(a, b)

/* Inside a kernel set (a kernel file compiled with -DCTI_ISA_SFX=<suffix>),
 * every external name of the kernel files gets the set's suffix, so the sets
 * link side by side. */
#ifdef CTI_ISA_SFX
#define cti_cpu_register_kernels CTI_ISA_CAT(cti_cpu_register_kernels, CTI_ISA_SFX)
#define cti_cpu_register_copy CTI_ISA_CAT(cti_cpu_register_copy, CTI_ISA_SFX)
#define cti_cpu_register_elementwise CTI_ISA_CAT(cti_cpu_register_elementwise, CTI_ISA_SFX)
#define cti_cpu_register_reduce CTI_ISA_CAT(cti_cpu_register_reduce, CTI_ISA_SFX)
#define cti_cpu_register_linalg CTI_ISA_CAT(cti_cpu_register_linalg, CTI_ISA_SFX)
#define cti_cpu_register_conv CTI_ISA_CAT(cti_cpu_register_conv, CTI_ISA_SFX)
#define cti_cpu_register_pool2d CTI_ISA_CAT(cti_cpu_register_pool2d, CTI_ISA_SFX)
#define cti_cpu_register_norm CTI_ISA_CAT(cti_cpu_register_norm, CTI_ISA_SFX)
#define cti_cpu_register_softmax CTI_ISA_CAT(cti_cpu_register_softmax, CTI_ISA_SFX)
#define cti_cpu_register_loss CTI_ISA_CAT(cti_cpu_register_loss, CTI_ISA_SFX)
#define cti_cpu_register_embedding CTI_ISA_CAT(cti_cpu_register_embedding, CTI_ISA_SFX)
#define cti_cpu_register_dropout CTI_ISA_CAT(cti_cpu_register_dropout, CTI_ISA_SFX)
#define cti_cpu_register_optim CTI_ISA_CAT(cti_cpu_register_optim, CTI_ISA_SFX)
#define cti_cpu_register_rope CTI_ISA_CAT(cti_cpu_register_rope, CTI_ISA_SFX)
#define cti_cpu_register_seqops CTI_ISA_CAT(cti_cpu_register_seqops, CTI_ISA_SFX)
#define cti_cpu_register_linear_ce CTI_ISA_CAT(cti_cpu_register_linear_ce, CTI_ISA_SFX)
#define cti_cpu_register_attention CTI_ISA_CAT(cti_cpu_register_attention, CTI_ISA_SFX)
#define cti_cpu_register_indexing CTI_ISA_CAT(cti_cpu_register_indexing, CTI_ISA_SFX)
#define cti_cpu_register_sort CTI_ISA_CAT(cti_cpu_register_sort, CTI_ISA_SFX)
#define cti_cpu_register_shape CTI_ISA_CAT(cti_cpu_register_shape, CTI_ISA_SFX)
#define cti_cpu_register_batch_norm CTI_ISA_CAT(cti_cpu_register_batch_norm, CTI_ISA_SFX)
#endif

/* ---- threads ------------------------------------------------------------------- */
typedef void (*cti_range_fn)(int64_t begin, int64_t end, void *ctx);
/* Runs fn over [0, n) in contiguous chunks of at least grain indices on the
 * pool's threads (the caller's thread takes one chunk). Runs inline when
 * n <= grain, with one thread, or when called from inside a pool task. */
void cti_parallel_for(int64_t n, int64_t grain, cti_range_fn fn, void *ctx);
int cti_cpu_threads(void);
ct_status cti_cpu_set_threads(int n);
/* Elements below which elementwise work stays on one thread. */
#define CTI_GRAIN 32768

/* ---- elementwise iteration --------------------------------------------------------- */
#define CTI_MAX_OPERANDS 6
/* Inner loop over n elements; ptrs[k] is operand k's first element, strides[k]
 * its step in bytes (equal to the element size for contiguous rows). */
typedef void (*cti_loop_fn)(char **ptrs, const int64_t *strides, int64_t n, void *ctx);
/* operands[0] is the output and sets the iteration shape; the others
 * broadcast to it (missing leading dims and size-1 dims get stride 0).
 * Dims are coalesced so contiguous operands give one call of n = numel, and
 * large work is split over the pool. */
ct_status cti_cpu_foreach(int nops, ct_tensor *const *operands, cti_loop_fn fn, void *ctx);

/* ---- BLAS (blas.c) ----------------------------------------------------------------------
 * cti_blas_init runs first at registration: it makes sure OpenBLAS runs its
 * best kernels for this CPU (without overriding OPENBLAS_CORETYPE when the
 * user set it) and aligns its thread count with the pool's. */
void cti_blas_init(void);
void cti_blas_set_threads(int n);
const char *cti_cpu_blas_info(void);

/* ---- f32 convolution kernels (winograd.c, conv_direct.c) ----------------------------
 * One convolution in forward terms: x [N, G*C, H, W] * w [G*Co, C, kh, kw]
 * -> y [N, G*Co, OH, OW] with padding ph/pw, stride and dilation 1, all
 * arrays contiguous. conv.c routes the shapes each kernel suits to it. */
typedef struct cti_conv_f32_geo {
    int64_t N, G;
    int64_t C, Co; /* channels per group, in and out */
    int64_t H, W, OH, OW, kh, kw, ph, pw;
} cti_conv_f32_geo;

/* ---- registration, one per kernel file ----------------------------------------------
 * Each kernel set's cti_cpu_register_kernels (kernels.c) calls them all. */
void cti_cpu_register_kernels(void);

void cti_cpu_register_copy(void);        /* copy/convert, fill, arange, linspace, eye, random */
void cti_cpu_register_elementwise(void); /* unary, binary, where, clamp */
void cti_cpu_register_reduce(void);
void cti_cpu_register_linalg(void);
void cti_cpu_register_conv(void);        /* conv2d and pooling */
void cti_cpu_register_norm(void);        /* rms_norm, layer_norm (the nn files share nn_impl.h) */
void cti_cpu_register_softmax(void);     /* softmax, log_softmax */
void cti_cpu_register_loss(void);        /* cross_entropy, nll_loss, mse_loss */
void cti_cpu_register_embedding(void);
void cti_cpu_register_dropout(void);
void cti_cpu_register_optim(void);       /* fused optimizer updates */
void cti_cpu_register_rope(void);        /* rope, swiglu and their backward ops */
void cti_cpu_register_seqops(void);      /* tril, triu, cumsum, topk, multinomial */
void cti_cpu_register_linear_ce(void);   /* cross_entropy_fused (ct_linear_cross_entropy) */
void cti_cpu_register_attention(void);   /* scaled dot-product attention */
void cti_cpu_register_indexing(void);    /* gather, index_select, scatter_add */
void cti_cpu_register_sort(void);        /* sort, cumprod, nonzero */
void cti_cpu_register_shape(void);       /* scatter(_reduce), flip/roll/repeat/pad, interpolate, fold */
void cti_cpu_register_batch_norm(void);  /* batch_norm and its backward (layers) */

#endif
