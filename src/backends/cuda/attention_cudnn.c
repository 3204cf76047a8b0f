/* Scaled dot-product attention through cuDNN's fused flash attention, built
 * with cuDNN's graph (backend) API: the operation graphs cuDNN's attention
 * engines recognize, with every tensor and node described here.
 *
 *   forward:  S = (Q K^T) * scale; causal: S = row >= col ? S : -inf;
 *             M = rowmax(S), E = exp(S - M), L = rowsum(E);
 *             lse = M + log(L); O = (E / L) V
 *   backward: Delta = rowsum(dO * O) (a float buffer of ours);
 *             P = exp((Q K^T) * scale - lse) (causal: -inf above the diagonal);
 *             dV = P^T dO; dS = P * (dO V^T - Delta) * scale;
 *             dK = dS^T Q; dQ = dS K (through a float accumulator of ours)
 *
 * It takes only what it does exactly as schema.h says and what cuDNN's
 * engines are known to take: f16 and bf16, no mask tensor, no dropout (cuDNN's
 * own generator would draw other elements than the CPU's Philox), Hq == Hkv,
 * D == Dv a multiple of 8 up to 128, T and S multiples of 64 (the backward: S
 * a multiple of 128; older cuDNN releases miscompute other lengths without a
 * padding mask), the last dims contiguous, other strides and every address
 * 16-byte aligned, and a contiguous lse. Anything else, and any graph cuDNN
 * refuses to build, runs the flash kernels of attention.cu; the call's
 * routine names the one that ran. CT_CUDA_SDPA_CUDNN=0 in the environment
 * turns this path off (the benchmarks and tests compare the two).
 *
 * A built plan is kept per device in a table keyed by everything its graph
 * depends on (direction, dtype, causal, sizes, strides); a refused key is
 * kept too, so it is not built again. The scale, being passed by value, is
 * not part of the key. One cuDNN handle per device, bound to the device's
 * stream; a per-device lock serializes the handle and the table. Workspaces
 * come from the caching allocator and are released after the launch. */
#include <cudnn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "attention_impl.h"

bool cti_cuda_attn_cudnn(ct_call *c, const cti_cuda_attn *a, bool bwd, int dev,
                         cudaStream_t stream, ct_status *st);

#define MAX_DESCS 160 /* the backward graph with both heuristic modes takes 91 */
#define MAX_OPS 32
#define NBUCKETS 64

/* Tensor uids (virtual tensors take VIRT + n). */
enum { U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF, U_DO, U_DQ, U_DK, U_DV, U_DELTA,
       U_DQACC, U_ONE, VIRT = 100 };

typedef struct sdpa_key {
    int bwd, dt, causal;
    int64_t B, H, T, S, D;
    int64_t st[9][4]; /* q k v o lse do dq dk dv (forward: the first five) */
} sdpa_key;

typedef struct sdpa_entry {
    sdpa_key key;
    struct sdpa_entry *next;
    cudnnBackendDescriptor_t descs[MAX_DESCS]; /* everything the plan was built from */
    int ndescs;
    cudnnBackendDescriptor_t plan; /* NULL: cuDNN refused this key */
    int64_t workspace;
} sdpa_entry;

typedef struct sdpa_dev {
    pthread_mutex_t lock;
    cudnnHandle_t handle;
    sdpa_entry *buckets[NBUCKETS];
} sdpa_dev;

static sdpa_dev devs[CTI_CUDA_MAX_DEVICES];
static pthread_once_t devs_once = PTHREAD_ONCE_INIT;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static void init_devs(void) {
    for (int i = 0; i < CTI_CUDA_MAX_DEVICES; i++) pthread_mutex_init(&devs[i].lock, NULL);
}

static void destroy_entry(sdpa_entry *e) {
    if (e->plan) cudnnBackendDestroyDescriptor(e->plan);
    for (int i = e->ndescs - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(e->descs[i]);
    free(e);
}

/* Plans and handles are destroyed at exit, so leak checkers see nothing of
 * cuDNN's (registered after the first handle exists: runs before the CUDA
 * runtime's own exit handler). */
static void destroy_all(void) {
    for (int i = 0; i < CTI_CUDA_MAX_DEVICES; i++) {
        sdpa_dev *d = &devs[i];
        for (int b = 0; b < NBUCKETS; b++) {
            while (d->buckets[b]) {
                sdpa_entry *e = d->buckets[b];
                d->buckets[b] = e->next;
                destroy_entry(e);
            }
        }
        if (d->handle && cudaSetDevice(i) == cudaSuccess) cudnnDestroy(d->handle);
        d->handle = NULL;
    }
    cudaGetLastError();
}

static void register_exit(void) { atexit(destroy_all); }

/* ---- which calls this path takes --------------------------------------------------------- */

static bool enabled(void) {
    const char *e = getenv("CT_CUDA_SDPA_CUDNN");
    return !(e && strcmp(e, "0") == 0);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* A [.., rows, cols] operand: last dim contiguous, the others multiples of
 * 16 bytes (8 elements of 2 bytes), its address 16-byte aligned. */
static bool operand_ok(const void *p, const int64_t *st) {
    return p && aligned16(p) && st[3] == 1 && st[0] % 8 == 0 && st[1] % 8 == 0 && st[2] % 8 == 0;
}

static bool takes(const cti_cuda_attn *a, bool bwd) {
    const cti_attention_params *p = &a->p;
    if (a->dt != CT_F16 && a->dt != CT_BF16) return false;
    if (p->mask_kind != CTI_ATTN_MASK_NONE || p->dropout_p != 0) return false;
    if (p->Hq != p->Hkv || p->D != p->Dv || p->D % 8 != 0 || p->D < 8 || p->D > 128) return false;
    if (p->B < 1 || p->Hq < 1 || p->T < 64 || p->S < 64 || p->T % 64 || p->S % 64) return false;
    if (bwd && p->S % 128) return false;
    if (!operand_ok(a->q, a->sq) || !operand_ok(a->k, a->sk) || !operand_ok(a->v, a->sv))
        return false;
    const int64_t *sl = bwd ? a->slse : a->slse_out;
    const void *lse = bwd ? a->lse : a->lse_out;
    if (!lse || !aligned16(lse) || sl[2] != 1 || sl[1] != p->T || sl[0] != p->Hq * p->T)
        return false;
    if (!bwd) return operand_ok(a->out, a->sout);
    size_t v = cudnnGetVersion();
    if (v < 90000 || v == 91000 || v == 91001) return false; /* known-bad backward releases */
    return a->dq && a->dk && a->dv && operand_ok(a->go, a->sgo) && operand_ok(a->o, a->so) &&
           operand_ok(a->dq, a->sdq) && operand_ok(a->dk, a->sdk) && operand_ok(a->dv, a->sdv);
}

static sdpa_key key_of(const cti_cuda_attn *a, bool bwd) {
    sdpa_key k;
    memset(&k, 0, sizeof k);
    k.bwd = bwd;
    k.dt = (int)a->dt;
    k.causal = a->p.is_causal;
    k.B = a->p.B;
    k.H = a->p.Hq;
    k.T = a->p.T;
    k.S = a->p.S;
    k.D = a->p.D;
    const int64_t *st[9] = {a->sq, a->sk, a->sv, bwd ? a->so : a->sout,
                            bwd ? a->slse : a->slse_out, a->sgo, a->sdq, a->sdk, a->sdv};
    for (int i = 0; i < (bwd ? 9 : 5); i++) memcpy(k.st[i], st[i], (i == 4 ? 3 : 4) * sizeof(int64_t));
    return k;
}

static unsigned hash_key(const sdpa_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return (unsigned)(h % NBUCKETS);
}

/* ---- graph building: every call is a no-op once one failed ------------------------------ */

typedef struct gb {
    sdpa_entry *e;
    cudnnStatus_t st;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int nops;
    int64_t next_virtual;
} gb;

static cudnnBackendDescriptor_t make(gb *g, cudnnBackendDescriptorType_t type) {
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->e->ndescs == MAX_DESCS) {
        g->st = CUDNN_STATUS_NOT_SUPPORTED;
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    g->st = cudnnBackendCreateDescriptor(type, &d);
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    g->e->descs[g->e->ndescs++] = d;
    return d;
}

static void set(gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t n, const void *v) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    g->st = cudnnBackendSetAttribute(d, name, type, n, v);
}

static void fin(gb *g, cudnnBackendDescriptor_t d) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    g->st = cudnnBackendFinalize(d);
}

static void add_op(gb *g, cudnnBackendDescriptor_t op) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    if (g->nops == MAX_OPS) {
        g->st = CUDNN_STATUS_NOT_SUPPORTED;
        return;
    }
    g->ops[g->nops++] = op;
}

/* A tensor; uid 0 takes the next virtual uid. */
static cudnnBackendDescriptor_t tensor(gb *g, int64_t uid, cudnnDataType_t dt, const int64_t *dim,
                                       const int64_t *stride, bool is_virtual, bool by_value) {
    cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (uid == 0) uid = g->next_virtual++;
    int64_t align = 16;
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride);
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    fin(g, t);
    return t;
}

/* A virtual float (or dt) tensor [B, H, R, C], packed. */
static cudnnBackendDescriptor_t vtensor(gb *g, cudnnDataType_t dt, int64_t B, int64_t H,
                                        int64_t R, int64_t C) {
    int64_t dim[4] = {B, H, R, C}, st[4] = {H * R * C, R * C, C, 1};
    return tensor(g, 0, dt, dim, st, true, false);
}

/* A 1x1x1x1 float passed by value at execution. */
static cudnnBackendDescriptor_t scalar(gb *g, int64_t uid) {
    int64_t one[4] = {1, 1, 1, 1};
    return tensor(g, uid, CUDNN_DATA_FLOAT, one, one, false, true);
}

/* y = mode(x [, b] [, t]); axis >= 0 for GEN_INDEX. */
static void pointwise(gb *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pd = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(g, pd, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(g, pd, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) set(g, pd, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    fin(g, pd);
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pd);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    fin(g, op);
    add_op(g, op);
}

static void reduction(gb *g, cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y) {
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red);
    set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    fin(g, rd);
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    fin(g, op);
    add_op(g, op);
}

/* c = a b over the last two dims, float accumulation. */
static void matmul(gb *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c) {
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t md = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set(g, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    fin(g, md);
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &md);
    fin(g, op);
    add_op(g, op);
}

/* y: x's elements seen through y's dims and strides (a transpose). */
static void reshape(gb *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    fin(g, op);
    add_op(g, op);
}

/* s with -inf (the by-value neginf) where col > row. */
static cudnnBackendDescriptor_t causal_mask(gb *g, const sdpa_key *k, cudnnBackendDescriptor_t s,
                                            cudnnBackendDescriptor_t neginf) {
    cudnnBackendDescriptor_t row = vtensor(g, CUDNN_DATA_INT32, k->B, k->H, k->T, k->S);
    cudnnBackendDescriptor_t col = vtensor(g, CUDNN_DATA_INT32, k->B, k->H, k->T, k->S);
    cudnnBackendDescriptor_t keep = vtensor(g, CUDNN_DATA_BOOLEAN, k->B, k->H, k->T, k->S);
    cudnnBackendDescriptor_t out = vtensor(g, CUDNN_DATA_FLOAT, k->B, k->H, k->T, k->S);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, s, NULL, NULL, row);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, s, NULL, NULL, col);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neginf, keep, out);
    return out;
}

static void swap23(const int64_t *in, int64_t *out) {
    out[0] = in[0];
    out[1] = in[1];
    out[2] = in[3];
    out[3] = in[2];
}

static void build_forward(gb *g, const sdpa_key *k, cudnnDataType_t io) {
    const int64_t B = k->B, H = k->H, T = k->T, S = k->S, D = k->D;
    int64_t qd[4] = {B, H, T, D}, ktd[4] = {B, H, D, S}, vd[4] = {B, H, S, D};
    int64_t kts[4], rd[4] = {B, H, T, 1}, lses[4] = {k->st[4][0], k->st[4][1], k->st[4][2], 1};
    swap23(k->st[1], kts);
    cudnnBackendDescriptor_t q = tensor(g, U_Q, io, qd, k->st[0], false, false);
    cudnnBackendDescriptor_t kt = tensor(g, U_K, io, ktd, kts, false, false);
    cudnnBackendDescriptor_t v = tensor(g, U_V, io, vd, k->st[2], false, false);
    cudnnBackendDescriptor_t o = tensor(g, U_O, io, qd, k->st[3], false, false);
    cudnnBackendDescriptor_t stats = tensor(g, U_STATS, CUDNN_DATA_FLOAT, rd, lses, false, false);
    cudnnBackendDescriptor_t scale = scalar(g, U_SCALE);
    cudnnBackendDescriptor_t neginf = k->causal ? scalar(g, U_NEGINF) : NULL;

    cudnnBackendDescriptor_t s = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    matmul(g, q, kt, s);
    cudnnBackendDescriptor_t ss = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, s, scale, NULL, ss);
    if (k->causal) ss = causal_mask(g, k, ss, neginf);

    cudnnBackendDescriptor_t mx = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, 1);
    reduction(g, CUDNN_REDUCE_TENSOR_MAX, ss, mx);
    cudnnBackendDescriptor_t sub = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, -1, ss, mx, NULL, sub);
    cudnnBackendDescriptor_t e = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, -1, sub, NULL, NULL, e);
    cudnnBackendDescriptor_t sum = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, 1);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    cudnnBackendDescriptor_t lg = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, 1);
    pointwise(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, -1, sum, NULL, NULL, lg);
    pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, -1, mx, lg, NULL, stats);
    cudnnBackendDescriptor_t p = vtensor(g, io, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, -1, e, sum, NULL, p);
    matmul(g, p, v, o);
}

static void build_backward(gb *g, const sdpa_key *k, cudnnDataType_t io) {
    const int64_t B = k->B, H = k->H, T = k->T, S = k->S, D = k->D;
    int64_t qd[4] = {B, H, T, D}, kd[4] = {B, H, S, D}, ktd[4] = {B, H, D, S};
    int64_t kts[4], vts[4], rd[4] = {B, H, T, 1};
    int64_t lses[4] = {k->st[4][0], k->st[4][1], k->st[4][2], 1};
    int64_t rs[4] = {H * T, T, 1, 1}, accs[4] = {H * T * D, T * D, D, 1};
    int64_t tsd[4] = {B, H, S, T}, tss[4] = {H * T * S, T * S, 1, S};
    swap23(k->st[1], kts);
    swap23(k->st[2], vts);
    cudnnBackendDescriptor_t q = tensor(g, U_Q, io, qd, k->st[0], false, false);
    cudnnBackendDescriptor_t kt = tensor(g, U_K, io, ktd, kts, false, false);
    cudnnBackendDescriptor_t vt = tensor(g, U_V, io, ktd, vts, false, false);
    cudnnBackendDescriptor_t o = tensor(g, U_O, io, qd, k->st[3], false, false);
    cudnnBackendDescriptor_t stats = tensor(g, U_STATS, CUDNN_DATA_FLOAT, rd, lses, false, false);
    cudnnBackendDescriptor_t dO = tensor(g, U_DO, io, qd, k->st[5], false, false);
    cudnnBackendDescriptor_t dq = tensor(g, U_DQ, io, qd, k->st[6], false, false);
    cudnnBackendDescriptor_t dk = tensor(g, U_DK, io, kd, k->st[7], false, false);
    cudnnBackendDescriptor_t dv = tensor(g, U_DV, io, kd, k->st[8], false, false);
    cudnnBackendDescriptor_t delta = tensor(g, U_DELTA, CUDNN_DATA_FLOAT, rd, rs, false, false);
    cudnnBackendDescriptor_t dqacc = tensor(g, U_DQACC, CUDNN_DATA_FLOAT, qd, accs, false, false);
    cudnnBackendDescriptor_t scale = scalar(g, U_SCALE);
    cudnnBackendDescriptor_t one = scalar(g, U_ONE);
    cudnnBackendDescriptor_t neginf = k->causal ? scalar(g, U_NEGINF) : NULL;

    /* Delta = rowsum(dO * O); the product's strides as cuDNN's own frontend
     * describes this virtual tensor */
    int64_t dood[4] = {B, H, T, D}, doos[4] = {H * T * D, T * D, H * D, 1};
    cudnnBackendDescriptor_t dOO = tensor(g, 0, CUDNN_DATA_FLOAT, dood, doos, true, false);
    pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, dO, o, NULL, dOO);
    cudnnBackendDescriptor_t rsum = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, 1);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, dOO, rsum);
    pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, rsum, one, NULL, delta);

    /* P = exp(S * scale - lse), masked */
    cudnnBackendDescriptor_t s = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    matmul(g, q, kt, s);
    cudnnBackendDescriptor_t ss = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, s, scale, NULL, ss);
    cudnnBackendDescriptor_t sl = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, -1, ss, stats, NULL, sl);
    if (k->causal) sl = causal_mask(g, k, sl, neginf);
    cudnnBackendDescriptor_t p = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, -1, sl, NULL, NULL, p);

    /* dV = P^T dO */
    cudnnBackendDescriptor_t pt = tensor(g, 0, io, tsd, tss, true, false);
    reshape(g, p, pt);
    matmul(g, pt, dO, dv);

    /* dS = P * (dO V^T - Delta) * scale */
    cudnnBackendDescriptor_t dp = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    matmul(g, dO, vt, dp);
    cudnnBackendDescriptor_t d1 = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, -1, dp, delta, NULL, d1);
    cudnnBackendDescriptor_t d2 = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, d1, p, NULL, d2);
    cudnnBackendDescriptor_t ds = vtensor(g, CUDNN_DATA_FLOAT, B, H, T, S);
    pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, d2, scale, NULL, ds);

    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = tensor(g, 0, io, tsd, tss, true, false);
    reshape(g, ds, dst);
    matmul(g, dst, q, dk);

    /* dQ = dS K, accumulated in float */
    cudnnBackendDescriptor_t kk = tensor(g, 0, io, kd, k->st[1], true, false);
    reshape(g, kt, kk);
    matmul(g, ds, kk, dqacc);
    pointwise(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, -1, dqacc, NULL, NULL, dq);
}

/* The operation graph of g's ops, and a plan from the first engine
 * configuration the heuristics give that cuDNN finalizes. */
static void make_plan(gb *g, cudnnHandle_t handle) {
    cudnnBackendDescriptor_t graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
    set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    fin(g, graph);
    static const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2 && g->st == CUDNN_STATUS_SUCCESS && !g->e->plan; m++) {
        cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
            &graph);
        set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
        fin(g, heur);
        enum { NCFG = 8 };
        cudnnBackendDescriptor_t cfg[NCFG];
        int ncfg = 0;
        for (; ncfg < NCFG && g->st == CUDNN_STATUS_SUCCESS; ncfg++)
            cfg[ncfg] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (g->st != CUDNN_STATUS_SUCCESS) return;
        int64_t got = 0;
        cudnnStatus_t s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, NCFG, &got, cfg);
        if (s != CUDNN_STATUS_SUCCESS) continue; /* try the next mode */
        for (int64_t i = 0; i < got && i < NCFG; i++) {
            cudnnBackendDescriptor_t plan = NULL;
            if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
                CUDNN_STATUS_SUCCESS)
                break;
            int64_t ws = 0, n = 0;
            if (cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                         1, &handle) == CUDNN_STATUS_SUCCESS &&
                cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                         &cfg[i]) == CUDNN_STATUS_SUCCESS &&
                cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
                cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &n, &ws) == CUDNN_STATUS_SUCCESS &&
                ws >= 0) {
                g->e->plan = plan;
                g->e->workspace = ws;
                return;
            }
            cudnnBackendDestroyDescriptor(plan);
        }
    }
}

/* The entry for k when one was built, else NULL. */
static sdpa_entry *find(sdpa_dev *d, const sdpa_key *k) {
    for (sdpa_entry *e = d->buckets[hash_key(k)]; e; e = e->next)
        if (memcmp(&e->key, k, sizeof *k) == 0) return e;
    return NULL;
}

/* The entry for k, built on first use (its plan NULL when cuDNN refused). */
static sdpa_entry *lookup(sdpa_dev *d, const sdpa_key *k) {
    sdpa_entry *e = find(d, k);
    if (e) return e;
    unsigned h = hash_key(k);
    e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->key = *k;
    gb g = {.e = e, .st = CUDNN_STATUS_SUCCESS, .next_virtual = VIRT};
    cudnnDataType_t io = k->dt == CT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    if (k->bwd) build_backward(&g, k, io);
    else build_forward(&g, k, io);
    if (g.st == CUDNN_STATUS_SUCCESS) make_plan(&g, d->handle);
    cudnnGetLastErrorString((char[256]){0}, 256); /* a refusal is not the next call's error */
    cudaGetLastError();
    e->next = d->buckets[h];
    d->buckets[h] = e;
    return e;
}

/* ---- execution ---------------------------------------------------------------------------- */

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

static ct_status execute(const char *op, int dev, sdpa_dev *d, sdpa_entry *e,
                         const cti_cuda_attn *a, bool bwd, cudaStream_t stream) {
    const cti_attention_params *p = &a->p;
    float scale = (float)p->scale, one = 1.0f;
    float neginf = cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY;
    size_t ws = round256((size_t)e->workspace);
    size_t delta_bytes = round256((size_t)(p->B * p->Hq * p->T) * sizeof(float));
    size_t acc_bytes = (size_t)(p->B * p->Hq * p->T * p->D) * sizeof(float);
    int64_t total = (int64_t)(ws + (bwd ? delta_bytes + acc_bytes : 0));
    if (total < 1) total = 1;
    ct_tensor *work = cti_tensor_new(op, 1, &total, CT_BOOL, CT_CUDA(dev));
    if (!work) return ct_last_status();
    char *base = cti_data(work);
    int64_t uids[14];
    void *ptrs[14];
    int n = 0;
#define ARG(u, ptr) (uids[n] = (u), ptrs[n] = (void *)(ptr), n++)
    ARG(U_Q, a->q);
    ARG(U_K, a->k);
    ARG(U_V, a->v);
    ARG(U_SCALE, &scale);
    if (p->is_causal) ARG(U_NEGINF, &neginf);
    if (!bwd) {
        ARG(U_O, a->out);
        ARG(U_STATS, a->lse_out);
    } else {
        ARG(U_O, a->o);
        ARG(U_STATS, a->lse);
        ARG(U_DO, a->go);
        ARG(U_DQ, a->dq);
        ARG(U_DK, a->dk);
        ARG(U_DV, a->dv);
        ARG(U_DELTA, base + ws);
        ARG(U_DQACC, base + ws + delta_bytes);
        ARG(U_ONE, &one);
    }
#undef ARG
    ct_status st = CT_OK;
    cudaError_t ce = cudaSuccess;
    if (bwd && cudnnGetVersion() < 90600) /* older releases expect a zeroed accumulator */
        ce = cudaMemsetAsync(base + ws + delta_bytes, 0, acc_bytes, stream);
    if (ce != cudaSuccess) {
        st = cti_cuda_fail(op, dev, "cudaMemsetAsync", ce);
    } else {
        void *wsp = base;
        cudnnBackendDescriptor_t vp = NULL;
        cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                         n, uids);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                         CUDNN_TYPE_VOID_PTR, n, ptrs);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                         CUDNN_TYPE_VOID_PTR, 1, &wsp);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(vp);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnSetStream(d->handle, stream);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(d->handle, e->plan, vp);
        if (vp) cudnnBackendDestroyDescriptor(vp);
        if (s != CUDNN_STATUS_SUCCESS) {
            char detail[256] = "";
            cudnnGetLastErrorString(detail, sizeof detail);
            cudaGetLastError();
            st = cti_error(CT_ERR_RUNTIME, "%s: cudnnBackendExecute failed on cuda:%d: %s%s%s", op,
                           dev, cudnnGetErrorString(s), detail[0] ? ": " : "", detail);
        } else {
            st = cti_cuda_launched(op, dev, bwd ? "cudnn_sdpa_backward" : "cudnn_sdpa");
        }
    }
    ct_tensor_release(work);
    return st;
}

bool cti_cuda_attn_cudnn(ct_call *c, const cti_cuda_attn *a, bool bwd, int dev,
                         cudaStream_t stream, ct_status *st) {
    if (!enabled() || !takes(a, bwd) || dev < 0 || dev >= CTI_CUDA_MAX_DEVICES) return false;
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    pthread_once(&devs_once, init_devs);
    sdpa_dev *d = &devs[dev];
    pthread_mutex_lock(&d->lock);
    sdpa_key k = key_of(a, bwd);
    if (cti_cuda_capturing(dev) && (!d->handle || !find(d, &k))) {
        pthread_mutex_unlock(&d->lock);
        *st = cti_cuda_capture_refuse(op, dev,
                                      d->handle ? "building the cuDNN attention plan for a new "
                                                  "shape"
                                                : "creating the cuDNN handle (it loads cuDNN "
                                                  "and allocates)");
        return true;
    }
    if (!d->handle) {
        if (cudnnCreate(&d->handle) != CUDNN_STATUS_SUCCESS) {
            d->handle = NULL;
            cudaGetLastError();
            pthread_mutex_unlock(&d->lock);
            return false;
        }
        pthread_once(&exit_once, register_exit);
    }
    sdpa_entry *e = lookup(d, &k);
    if (!e || !e->plan) {
        pthread_mutex_unlock(&d->lock);
        return false;
    }
    *st = execute(op, dev, d, e, a, bwd, stream);
    pthread_mutex_unlock(&d->lock);
    if (*st == CT_OK) c->routine = bwd ? "cudnn_sdpa_backward (fused flash attention)"
                                       : "cudnn_sdpa (fused flash attention)";
    return true;
}
