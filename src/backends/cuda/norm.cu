// RMSNorm and LayerNorm, forward and backward, over rows of D contiguous
// elements, with the CPU kernels' formulas (src/backends/cpu/norm.c) and their
// statistics: float for f16/bf16/f32 (which compute in float), double for
// f64.
//
// Most rows fit in registers: TPR threads own a row and each keeps NV
// chunks of VEC elements, chunk j of lane l starting at element
// (j * TPR + l) * VEC, so a warp's loads are contiguous. VEC fills 16 bytes
// when every row pointer is 16-byte aligned and D a multiple of VEC,
// else 1. x is read from memory once; the row's sums are formed by warp
// shuffles (and, past a warp, shared memory in warp order), so every thread
// of a row holds the same bits and results do not change from run to run.
// Rows longer than the largest configuration go through "loop" kernels, one
// block per row, that read the row again for each pass.
//
// The backward's dx needs only the row; dweight and dbias sum over rows. Each
// backward block keeps its own column sums in registers over the rows it
// visits (a grid the size of what the device holds at once), adds its row
// slots together in slot order, and writes one partial row to a scratch
// buffer; a second kernel adds the partial rows per column in a fixed order.
// No atomics, so the grads are the same from run to run on a device.
#include <atomic>
#include <climits>
#include <cstring>
#include <type_traits>

#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

template <int DT> struct acc_of { typedef float A; };
template <> struct acc_of<CT_F64> { typedef double A; };

__device__ __forceinline__ float msqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double msqrt(double v) { return sqrt(v); }

// The register configurations: TPR threads a row, NV chunks a thread (a
// chunk is VEC elements), at most 32 bytes of x a thread and 8 chunks, blocks
// of max(TPR, 256) threads, so up to 32 rows a block (the forward's: see
// fwd_block_of). 32 bytes a thread is
// 64 KiB of loads in flight on a full multiprocessor, what it takes to keep
// HBM busy. The forward of 16-bit rows takes up to 64 bytes a thread: with
// twice the elements a thread, the row's sums, barrier and addressing cost
// half as much per element, and the decode and arithmetic of 16-bit
// elements, twice float32's per byte, kept the 32-byte forward issue-bound
// (bf16 rows of 4096 on the H200: LayerNorm 82 % of the copy rate with 256
// threads a row, 89 % with 128; RMSNorm 93 % and 95 %). A row of nvec
// chunks takes the smallest TPR whose largest NV holds it, then the
// smallest NV that does; so only the (TPR, NV) pairs reachable() says yes
// to are ever launched. Longer rows go to the loop kernels.
constexpr int kNumTpr = 6;
constexpr int kTprs[kNumTpr] = {8, 32, 128, 256, 512, 1024};
constexpr int kNumCfg = kNumTpr * 4; // NV = 1, 2, 4, 8
constexpr int kLoopBlock = 1024;

__host__ __device__ constexpr int block_of(int tpr) { return tpr > 256 ? tpr : 256; }
// The forward's blocks hold one row from 128 threads a row up: its rows are
// independent, and a block's threads then wait only at their own row's
// barrier, not at a neighbour's. bf16 LayerNorm rows of 4096 (128 threads of
// 4 chunks) on the H200: 89 % of the copy rate with two rows a block, 95-97 %
// with one.
__host__ __device__ constexpr int fwd_block_of(int tpr) { return tpr >= 128 ? tpr : 256; }
// Bytes of x a thread: the forward's and the backward's.
constexpr int fwd_bytes(int esize) { return esize == 2 ? 64 : 32; }
constexpr int kBwdBytes = 32;
constexpr int nv_max(int vec, int esize, int bytes) {
    return bytes / (vec * esize) < 8 ? bytes / (vec * esize) : 8;
}
constexpr int64_t cap_below(int t, int vec, int esize, int bytes) {
    return t == 0 ? 0 : (int64_t)kTprs[t - 1] * nv_max(vec, esize, bytes);
}
constexpr bool reachable(int t, int nv, int vec, int esize, int bytes) {
    return nv <= nv_max(vec, esize, bytes) && (int64_t)kTprs[t] * nv > cap_below(t, vec, esize, bytes);
}
constexpr int cfg_tpr(int cfg) { return kTprs[cfg / 4]; }
constexpr int cfg_nv(int cfg) { return 1 << (cfg % 4); }

// A chunk as loaded, before decoding: one 16-byte vector, or one element.
template <int DT, int VEC>
using raw_t = typename std::conditional<(VEC > 1), uint4, typename dtype<DT>::T>::type;

// VEC elements at p, not decoded; VEC > 1 only for 16-byte aligned p. A
// kernel that loads several chunks loads them all this way before decoding
// any: decoding reads the loaded registers, so a decode placed between two
// loads (under different conditions) makes the second wait for the first.
template <int DT, int VEC>
__device__ __forceinline__ void load_raw(const typename dtype<DT>::T *p, raw_t<DT, VEC> &r) {
    if constexpr (VEC > 1) {
        static_assert(VEC * sizeof(typename dtype<DT>::T) == 16, "vector chunks are 16 bytes");
        r = *reinterpret_cast<const uint4 *>(p);
    } else {
        r = p[0];
    }
}

template <int DT, int VEC>
__device__ __forceinline__ void decode(const raw_t<DT, VEC> &r, typename acc_of<DT>::A (&v)[VEC]) {
    typedef typename dtype<DT>::T T;
    T raw[VEC];
    memcpy(raw, &r, sizeof raw);
#pragma unroll
    for (int i = 0; i < VEC; i++) v[i] = dtype<DT>::dec(raw[i]);
}

// VEC elements at p, decoded.
template <int DT, int VEC>
__device__ __forceinline__ void load(const typename dtype<DT>::T *p,
                                     typename acc_of<DT>::A (&v)[VEC]) {
    raw_t<DT, VEC> r;
    load_raw<DT, VEC>(p, r);
    decode<DT, VEC>(r, v);
}

template <int DT, int VEC>
__device__ __forceinline__ void store(typename dtype<DT>::T *p,
                                      const typename acc_of<DT>::A (&v)[VEC]) {
    typedef typename dtype<DT>::T T;
    T raw[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) raw[i] = dtype<DT>::enc(v[i]);
    if constexpr (VEC > 1) {
        uint4 u;
        memcpy(&u, raw, 16);
        *reinterpret_cast<uint4 *>(p) = u;
    } else {
        p[0] = raw[0];
    }
}

// Sums v[0..N) over the TPR threads of each row of the block (rows are
// consecutive groups of TPR threads). Every thread of a row ends with the
// same bits: a butterfly's partners add the same two values, and past a warp
// each thread adds the warps' sums in warp order. Every thread of the block
// must call it; red holds N * blockDim.x / 32 values. reuse: red is written
// again after this call (else the closing barrier is left out; the value
// must be the same in every thread of the block).
template <int TPR, int N, class A>
__device__ __forceinline__ void row_sum(A (&v)[N], A *red, bool reuse = true) {
    constexpr int W = TPR < 32 ? TPR : 32;
#pragma unroll
    for (int off = W / 2; off > 0; off >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
    if constexpr (TPR > 32) {
        constexpr int NW = TPR / 32;
        const int slot = threadIdx.x / TPR, wr = (threadIdx.x % TPR) >> 5;
        A *r = red + slot * N * NW;
        if ((threadIdx.x & 31) == 0)
#pragma unroll
            for (int k = 0; k < N; k++) r[k * NW + wr] = v[k];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < N; k++) {
            A s = r[k * NW];
            for (int w = 1; w < NW; w++) s += r[k * NW + w];
            v[k] = s;
        }
        if (reuse) __syncthreads(); // red is reused by the next call
    }
}

template <class A> __device__ __forceinline__ A stat_at(const void *p, int64_t row) {
    return static_cast<const A *>(p)[row];
}

// ---- forward ----------------------------------------------------------------------------------
// y = x * inv_rms * w, or (x - mean) * rstd * w + b; statistics per row.
// The register kernels' steps; CHECK: chunks may lie past the row's end.

// Decodes the row's NV chunks into v; s gets their sum (LAYER) or sum of
// squares.
template <int DT, bool LAYER, int VEC, int NV, class A>
__device__ __forceinline__ void decode_row(const raw_t<DT, VEC> (&r)[NV], A (&v)[NV][VEC],
                                           A &s) {
#pragma unroll
    for (int j = 0; j < NV; j++) {
        decode<DT, VEC>(r[j], v[j]);
#pragma unroll
        for (int i = 0; i < VEC; i++) s += LAYER ? v[j][i] : v[j][i] * v[j][i];
    }
}

// This thread's share of sum((v - mean)^2) over the row.
template <int VEC, int TPR, int NV, bool CHECK, class A>
__device__ __forceinline__ A centered_squares(const A (&v)[NV][VEC], A mean, int lane, int64_t D) {
    A q = 0;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int e = (j * TPR + lane) * VEC;
        if (!CHECK || e < D)
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                A dv = v[j][i] - mean;
                q += dv * dv;
            }
    }
    return q;
}

// Writes this thread's chunks of the row's y, and (lane 0) its statistics.
// FUSE (LayerNorm of 16-bit rows): y = fma(fma(x, inv, -mean inv), w, b),
// two instructions an element fewer than (x - mean) inv w + b; its error
// stays far below a 16-bit result's rounding (float32 rows keep the plain
// form, whose results do not depend on the size of mean inv).
template <int DT, bool LAYER, int VEC, int TPR, int NV, bool CHECK, class A, bool FUSE = false>
__device__ __forceinline__ void write_row(const cti_cuda_norm &a, int64_t row, int64_t D, int lane,
                                          const A (&v)[NV][VEC], A mean, A inv) {
    typedef typename dtype<DT>::T T;
    const T *W = static_cast<const T *>(a.w), *B = static_cast<const T *>(a.b);
    T *yr = static_cast<T *>(a.y) + row * D;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int e = (j * TPR + lane) * VEC;
        if (CHECK && e >= D) continue;
        A o[VEC];
        if constexpr (FUSE && LAYER) {
            const A nmi = -mean * inv;
#pragma unroll
            for (int i = 0; i < VEC; i++) o[i] = fma(v[j][i], inv, nmi);
            if (W && B) {
                A wv[VEC], bv[VEC];
                load<DT, VEC>(W + e, wv);
                load<DT, VEC>(B + e, bv);
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] = fma(o[i], wv[i], bv[i]);
            } else if (W) {
                A wv[VEC];
                load<DT, VEC>(W + e, wv);
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] *= wv[i];
            } else if (B) {
                A bv[VEC];
                load<DT, VEC>(B + e, bv);
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] += bv[i];
            }
        } else {
#pragma unroll
            for (int i = 0; i < VEC; i++) o[i] = LAYER ? (v[j][i] - mean) * inv : v[j][i] * inv;
            if (W) {
                A wv[VEC];
                load<DT, VEC>(W + e, wv);
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] *= wv[i];
            }
            if (LAYER && B) {
                A bv[VEC];
                load<DT, VEC>(B + e, bv);
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] += bv[i];
            }
        }
        store<DT, VEC>(yr + e, o);
    }
    if (lane == 0) {
        if (a.rstd_out) static_cast<A *>(a.rstd_out)[row] = inv;
        if (LAYER && a.mean_out) static_cast<A *>(a.mean_out)[row] = mean;
    }
}

// LayerNorm of 16-bit rows in one fold: the sums of d = x - k and d^2, with k
// the row's first element, give mean = k + sum(d) / D and var = sum(d^2) / D
// - (sum(d) / D)^2. One block-wide sum instead of two: on bf16 rows of 4096
// (256 threads a row, two chunks a thread) the second sum's barrier and
// shuffles cost a tenth of the kernel's time. k is a sample of the row, so
// |mean - k| is of the order of the row's spread and the subtraction loses
// a few float32 bits at most, far below a 16-bit result's rounding; float32
// and float64 rows keep the two folds, whose results keep their digits
// whatever the offset.
template <int DT> __host__ __device__ constexpr bool one_fold() { return DT == CT_BF16 || DT == CT_F16; }

template <int VEC, int TPR, int NV, bool CHECK, class A>
__device__ __forceinline__ void shifted_sums(const A (&v)[NV][VEC], A k, int lane, int64_t D,
                                             A (&s)[2]) {
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int e = (j * TPR + lane) * VEC;
        if (!CHECK || e < D)
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                A d = v[j][i] - k;
                s[0] += d;
                s[1] += d * d;
            }
    }
}

// mean and 1 / sqrt(var + eps) from shifted_sums' row totals.
template <class A>
__device__ __forceinline__ void one_fold_stats(const A (&s)[2], A k, int64_t D, double eps,
                                               A &mean, A &inv) {
    const A m = s[0] / (A)D;
    A var = s[1] / (A)D - m * m;
    var = var > (A)0 ? var : (A)0;
    mean = k + m;
    inv = (A)1 / msqrt(var + (A)eps);
}

// Rows of any length up to the configuration's TPR * NV * VEC, a grid-stride
// loop over groups of RPB rows.
template <int DT, bool LAYER, int VEC, int TPR, int NV>
__global__ void __launch_bounds__(fwd_block_of(TPR)) fwd_reg(const cti_cuda_norm a) {
    typedef typename dtype<DT>::T T;
    typedef typename acc_of<DT>::A A;
    constexpr int BLOCK = fwd_block_of(TPR), RPB = BLOCK / TPR;
    __shared__ A red[2 * BLOCK / 32];
    const int lane = threadIdx.x % TPR, slot = threadIdx.x / TPR;
    const int64_t D = a.d, groups = (a.rows + RPB - 1) / RPB;
    for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        const int64_t row = gi * RPB + slot;
        const bool live = row < a.rows;
        const T *xr = static_cast<const T *>(a.x) + (live ? row : 0) * D;
        // All NV chunks in flight at once (see load_raw); chunks past the row
        // and rows past the end are zeros (all-zero bits: +0 in every dtype).
        raw_t<DT, VEC> r[NV];
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int e = (j * TPR + lane) * VEC;
            if (live && e < D) load_raw<DT, VEC>(xr + e, r[j]);
            else r[j] = raw_t<DT, VEC>{};
        }
        A v[NV][VEC];
        A s[1] = {0};
        decode_row<DT, LAYER>(r, v, s[0]);
        // A block's last row leaves out the barrier that only guards red for
        // a next row (a block of the forward usually has one row).
        const bool more = gi + gridDim.x < groups;
        A mean = 0, inv;
        if constexpr (LAYER && one_fold<DT>()) {
            const A k = dtype<DT>::dec(xr[0]);
            A s2[2] = {0, 0};
            shifted_sums<VEC, TPR, NV, true>(v, k, lane, D, s2);
            row_sum<TPR>(s2, red, more);
            one_fold_stats(s2, k, D, a.eps, mean, inv);
        } else if constexpr (LAYER) {
            row_sum<TPR>(s, red, true);
            mean = s[0] / (A)D;
            A q[1] = {centered_squares<VEC, TPR, NV, true>(v, mean, lane, D)};
            row_sum<TPR>(q, red, more);
            inv = (A)1 / msqrt(q[0] / (A)D + (A)a.eps);
        } else {
            row_sum<TPR>(s, red, more);
            inv = (A)1 / msqrt(s[0] / (A)D + (A)a.eps);
        }
        if (!live) continue;
        write_row<DT, LAYER, VEC, TPR, NV, true, A, one_fold<DT>()>(a, row, D, lane, v, mean, inv);
    }
}

// Rows that fill their chunks exactly (D == TPR * NV * VEC, 16-byte
// chunks), one group of rows a block: fwd_reg without the per-chunk bounds
// tests and the loop over groups, and with D a constant, so every offset is
// folded. On bf16 rows of 4096, fwd_reg executed a fifth more instructions
// than a kernel written for that one shape and ran 10% longer, well short of
// the copy rate; the bytes moved and the occupancy were the same.
template <int DT, bool LAYER, int VEC, int TPR, int NV>
__global__ void __launch_bounds__(fwd_block_of(TPR)) fwd_full(const cti_cuda_norm a) {
    typedef typename dtype<DT>::T T;
    typedef typename acc_of<DT>::A A;
    constexpr int BLOCK = fwd_block_of(TPR), RPB = BLOCK / TPR, D = TPR * NV * VEC;
    __shared__ A red[2 * BLOCK / 32];
    const int lane = threadIdx.x % TPR, slot = threadIdx.x / TPR;
    const int64_t row = (int64_t)blockIdx.x * RPB + slot;
    const bool live = row < a.rows;
    // a row past the end reads row 0 (there is one) and writes nothing
    const T *xr = static_cast<const T *>(a.x) + (live ? row : 0) * D;
    raw_t<DT, VEC> r[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) load_raw<DT, VEC>(xr + (j * TPR + lane) * VEC, r[j]);
    A v[NV][VEC];
    A s[1] = {0};
    decode_row<DT, LAYER>(r, v, s[0]);
    A mean = 0, inv;
    if constexpr (LAYER && one_fold<DT>()) {
        const A k = dtype<DT>::dec(xr[0]);
        A s2[2] = {0, 0};
        shifted_sums<VEC, TPR, NV, false>(v, k, lane, D, s2);
        row_sum<TPR>(s2, red, false);
        one_fold_stats(s2, k, D, a.eps, mean, inv);
    } else if constexpr (LAYER) {
        row_sum<TPR>(s, red, true);
        mean = s[0] / (A)D;
        A q[1] = {centered_squares<VEC, TPR, NV, false>(v, mean, lane, D)};
        row_sum<TPR>(q, red, false);
        inv = (A)1 / msqrt(q[0] / (A)D + (A)a.eps);
    } else {
        row_sum<TPR>(s, red, false);
        inv = (A)1 / msqrt(s[0] / (A)D + (A)a.eps);
    }
    if (!live) return;
    write_row<DT, LAYER, VEC, TPR, NV, false, A, one_fold<DT>()>(a, row, D, lane, v, mean, inv);
}

// Rows too long for registers: one block per row, a pass over the row for
// each sum and one for the output.
template <int DT, bool LAYER, int VEC>
__global__ void __launch_bounds__(kLoopBlock) fwd_loop(const cti_cuda_norm a) {
    typedef typename dtype<DT>::T T;
    typedef typename acc_of<DT>::A A;
    __shared__ A red[kLoopBlock / 32];
    const int64_t D = a.d, nv = D / VEC;
    const T *W = static_cast<const T *>(a.w), *B = static_cast<const T *>(a.b);
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const T *xr = static_cast<const T *>(a.x) + row * D;
        A s[1] = {0};
        for (int64_t q = threadIdx.x; q < nv; q += kLoopBlock) {
            A v[VEC];
            load<DT, VEC>(xr + q * VEC, v);
#pragma unroll
            for (int i = 0; i < VEC; i++) s[0] += LAYER ? v[i] : v[i] * v[i];
        }
        row_sum<kLoopBlock>(s, red);
        A mean = 0, inv;
        if constexpr (LAYER) {
            mean = s[0] / (A)D;
            A sq[1] = {0};
            for (int64_t q = threadIdx.x; q < nv; q += kLoopBlock) {
                A v[VEC];
                load<DT, VEC>(xr + q * VEC, v);
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    A dv = v[i] - mean;
                    sq[0] += dv * dv;
                }
            }
            row_sum<kLoopBlock>(sq, red);
            inv = (A)1 / msqrt(sq[0] / (A)D + (A)a.eps);
        } else {
            inv = (A)1 / msqrt(s[0] / (A)D + (A)a.eps);
        }
        T *yr = static_cast<T *>(a.y) + row * D;
        for (int64_t q = threadIdx.x; q < nv; q += kLoopBlock) {
            A v[VEC], o[VEC];
            load<DT, VEC>(xr + q * VEC, v);
#pragma unroll
            for (int i = 0; i < VEC; i++) o[i] = LAYER ? (v[i] - mean) * inv : v[i] * inv;
            if (W) {
                A wv[VEC];
                load<DT, VEC>(W + q * VEC, wv);
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] *= wv[i];
            }
            if (LAYER && B) {
                A bv[VEC];
                load<DT, VEC>(B + q * VEC, bv);
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] += bv[i];
            }
            store<DT, VEC>(yr + q * VEC, o);
        }
        if (threadIdx.x == 0) {
            if (a.rstd_out) static_cast<A *>(a.rstd_out)[row] = inv;
            if (LAYER && a.mean_out) static_cast<A *>(a.mean_out)[row] = mean;
        }
    }
}

// ---- backward ---------------------------------------------------------------------------------
// rms:   gw = g * w, c = sum(gw * x) / D, dx = inv * gw - x * (inv^3 * c), dw += g * x * inv
// layer: xh = (x - mean) * rstd, dx = rstd * (gw - sum(gw) / D - xh * rstd * bb) with
//        bb = rstd * (sum(gw * x) - mean * sum(gw)) / D, dw += g * xh, db += g
// The partial sums: dw rows [gridDim.x][D] at work, then db rows likewise.

// Coefficients of dx from the row sums s (rms: s[0] = sum(gw * x); layer:
// s[0] = sum(gw), s[1] = sum(gw * x)).
template <bool LAYER, class A>
__device__ __forceinline__ void dx_coef(const A *s, A D, A rs, A mu, A &c0, A &c1) {
    if constexpr (LAYER) {
        c0 = s[0] / D;
        c1 = rs * (s[1] - mu * s[0]) / D;
    } else {
        c0 = rs * rs * rs * (s[0] / D);
        c1 = 0;
    }
}

template <bool LAYER, class A>
__device__ __forceinline__ A dx_of(A gw, A x, A rs, A mu, A c0, A c1) {
    if constexpr (LAYER) return rs * (gw - c0 - (x - mu) * rs * c1);
    else return rs * gw - x * c0;
}

// Writes a block's column sums acc (one set per row slot) as one partial row:
// with several slots, slot by slot in slot order through shared memory cols.
template <int TPR, int NV, int VEC, int RPB, class A>
__device__ __forceinline__ void write_part(const A (&acc)[NV][VEC], A *part, int64_t D, A *cols) {
    const int lane = threadIdx.x % TPR, slot = threadIdx.x / TPR;
    if constexpr (RPB == 1) {
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int e = (j * TPR + lane) * VEC;
            if (e < D)
#pragma unroll
                for (int i = 0; i < VEC; i++) part[e + i] = acc[j][i];
        }
    } else {
        for (int s = 0; s < RPB; s++) {
            if (slot == s)
#pragma unroll
                for (int j = 0; j < NV; j++) {
                    const int e = (j * TPR + lane) * VEC;
                    if (e < D)
#pragma unroll
                        for (int i = 0; i < VEC; i++)
                            cols[e + i] = s == 0 ? acc[j][i] : cols[e + i] + acc[j][i];
                }
            __syncthreads();
        }
        for (int e = threadIdx.x; e < D; e += TPR * RPB) part[e] = cols[e];
        __syncthreads(); // cols is used again for the next grad
    }
}

template <int DT, bool LAYER, int VEC, int TPR, int NV>
__global__ void __launch_bounds__(block_of(TPR)) bwd_reg(const cti_cuda_norm a) {
    typedef typename dtype<DT>::T T;
    typedef typename acc_of<DT>::A A;
    constexpr int BLOCK = block_of(TPR), RPB = BLOCK / TPR, N = LAYER ? 2 : 1;
    __shared__ A red[N * BLOCK / 32];
    // Where a block's row slots add their column sums (RPB > 1).
    __shared__ A cols[RPB > 1 ? TPR * NV * VEC : 1];
    const int lane = threadIdx.x % TPR, slot = threadIdx.x / TPR;
    const int64_t D = a.d, groups = (a.rows + RPB - 1) / RPB;
    const T *W = static_cast<const T *>(a.w);
    T *DX = static_cast<T *>(a.y);
    const bool want_w = a.dw != nullptr, want_b = LAYER && a.db != nullptr;
    A aw[NV][VEC], ab[NV][VEC];
#pragma unroll
    for (int j = 0; j < NV; j++)
#pragma unroll
        for (int i = 0; i < VEC; i++) aw[j][i] = ab[j][i] = 0;

    for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        const int64_t row = gi * RPB + slot;
        const bool live = row < a.rows;
        const int64_t off = (live ? row : 0) * D;
        const T *xr = static_cast<const T *>(a.x) + off, *gr = static_cast<const T *>(a.g) + off;
        // All chunks of x and dy in flight at once (see load_raw).
        raw_t<DT, VEC> rx[NV], rg[NV];
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int e = (j * TPR + lane) * VEC;
            if (live && e < D) {
                load_raw<DT, VEC>(xr + e, rx[j]);
                load_raw<DT, VEC>(gr + e, rg[j]);
            } else {
                rx[j] = rg[j] = raw_t<DT, VEC>{};
            }
        }
        A xv[NV][VEC], gv[NV][VEC];
#pragma unroll
        for (int j = 0; j < NV; j++) {
            decode<DT, VEC>(rx[j], xv[j]);
            decode<DT, VEC>(rg[j], gv[j]);
        }
        const A rs = live ? stat_at<A>(a.rstd, row) : (A)0;
        const A mu = LAYER && live ? stat_at<A>(a.mean, row) : (A)0;
        if (DX) {
            A s[N];
#pragma unroll
            for (int k = 0; k < N; k++) s[k] = 0;
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int e = (j * TPR + lane) * VEC;
                A wv[VEC];
                if (W && e < D) load<DT, VEC>(W + e, wv);
                else
#pragma unroll
                    for (int i = 0; i < VEC; i++) wv[i] = 1;
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    A gw = W ? gv[j][i] * wv[i] : gv[j][i];
                    if constexpr (LAYER) {
                        s[0] += gw;
                        s[1] += gw * xv[j][i];
                    } else {
                        s[0] += gw * xv[j][i];
                    }
                }
            }
            row_sum<TPR>(s, red);
            A c0, c1;
            dx_coef<LAYER>(s, (A)D, rs, mu, c0, c1);
            if (live) {
                T *dr = DX + row * D;
#pragma unroll
                for (int j = 0; j < NV; j++) {
                    const int e = (j * TPR + lane) * VEC;
                    if (e >= D) continue;
                    A wv[VEC], o[VEC];
                    if (W) load<DT, VEC>(W + e, wv);
#pragma unroll
                    for (int i = 0; i < VEC; i++) {
                        A gw = W ? gv[j][i] * wv[i] : gv[j][i];
                        o[i] = dx_of<LAYER>(gw, xv[j][i], rs, mu, c0, c1);
                    }
                    store<DT, VEC>(dr + e, o);
                }
            }
        }
        // Rows past the end hold zeros, so they add nothing.
#pragma unroll
        for (int j = 0; j < NV; j++)
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                if (want_w)
                    aw[j][i] += LAYER ? gv[j][i] * ((xv[j][i] - mu) * rs) : gv[j][i] * xv[j][i] * rs;
                if (want_b) ab[j][i] += gv[j][i];
            }
    }

    A *part = static_cast<A *>(a.work);
    if (want_w) write_part<TPR, NV, VEC, RPB>(aw, part + (int64_t)blockIdx.x * D, D, cols);
    if (want_b)
        write_part<TPR, NV, VEC, RPB>(
            ab, part + ((want_w ? (int64_t)gridDim.x : 0) + blockIdx.x) * D, D, cols);
}

// Rows too long for registers: one block per row, a pass for the sums and
// one for dx and this block's partial sums (which the block alone touches,
// each element always by the same thread).
template <int DT, bool LAYER, int VEC>
__global__ void __launch_bounds__(kLoopBlock) bwd_loop(const cti_cuda_norm a) {
    typedef typename dtype<DT>::T T;
    typedef typename acc_of<DT>::A A;
    constexpr int N = LAYER ? 2 : 1;
    __shared__ A red[N * kLoopBlock / 32];
    const int64_t D = a.d, nv = D / VEC;
    const T *W = static_cast<const T *>(a.w);
    T *DX = static_cast<T *>(a.y);
    const bool want_w = a.dw != nullptr, want_b = LAYER && a.db != nullptr;
    A *pw = want_w ? static_cast<A *>(a.work) + (int64_t)blockIdx.x * D : nullptr;
    A *pb = want_b ? static_cast<A *>(a.work) +
                         ((want_w ? (int64_t)gridDim.x : 0) + blockIdx.x) * D
                   : nullptr;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const T *xr = static_cast<const T *>(a.x) + row * D;
        const T *gr = static_cast<const T *>(a.g) + row * D;
        const A rs = stat_at<A>(a.rstd, row);
        const A mu = LAYER ? stat_at<A>(a.mean, row) : (A)0;
        A c0 = 0, c1 = 0;
        if (DX) {
            A s[N];
#pragma unroll
            for (int k = 0; k < N; k++) s[k] = 0;
            for (int64_t q = threadIdx.x; q < nv; q += kLoopBlock) {
                A xv[VEC], gv[VEC], wv[VEC];
                load<DT, VEC>(xr + q * VEC, xv);
                load<DT, VEC>(gr + q * VEC, gv);
                if (W) load<DT, VEC>(W + q * VEC, wv);
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    A gw = W ? gv[i] * wv[i] : gv[i];
                    if constexpr (LAYER) {
                        s[0] += gw;
                        s[1] += gw * xv[i];
                    } else {
                        s[0] += gw * xv[i];
                    }
                }
            }
            row_sum<kLoopBlock>(s, red);
            dx_coef<LAYER>(s, (A)D, rs, mu, c0, c1);
        }
        const bool first = row == blockIdx.x;
        T *dr = DX ? DX + row * D : nullptr;
        for (int64_t q = threadIdx.x; q < nv; q += kLoopBlock) {
            A xv[VEC], gv[VEC];
            load<DT, VEC>(xr + q * VEC, xv);
            load<DT, VEC>(gr + q * VEC, gv);
            if (dr) {
                A wv[VEC], o[VEC];
                if (W) load<DT, VEC>(W + q * VEC, wv);
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    A gw = W ? gv[i] * wv[i] : gv[i];
                    o[i] = dx_of<LAYER>(gw, xv[i], rs, mu, c0, c1);
                }
                store<DT, VEC>(dr + q * VEC, o);
            }
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const int64_t e = q * VEC + i;
                if (pw) {
                    A t = LAYER ? gv[i] * ((xv[i] - mu) * rs) : gv[i] * xv[i] * rs;
                    pw[e] = first ? t : pw[e] + t;
                }
                if (pb) pb[e] = first ? gv[i] : pb[e] + gv[i];
            }
        }
    }
}

// Adds the P partial rows of each column in row order into out (dw for
// blockIdx.y == 0 when both are wanted, then db). 32 columns a block; the 16
// thread rows take partial rows ty, ty + 16, ... and are added in order.
struct ParamSum {
    const void *part[2];
    void *out[2];
    int64_t P, D;
};

constexpr int kSumX = 32, kSumY = 16;

template <int DT> __global__ void __launch_bounds__(kSumX *kSumY) param_sum(const ParamSum p) {
    typedef typename acc_of<DT>::A A;
    __shared__ A sh[kSumY][kSumX + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t col = (int64_t)blockIdx.x * kSumX + tx;
    const A *src = static_cast<const A *>(blockIdx.y ? p.part[1] : p.part[0]);
    A s = 0;
    if (col < p.D)
        for (int64_t r = ty; r < p.P; r += kSumY) s += src[r * p.D + col];
    sh[ty][tx] = s;
    __syncthreads();
    if (ty != 0 || col >= p.D) return;
    A t = sh[0][tx];
    for (int k = 1; k < kSumY; k++) t += sh[k][tx];
    static_cast<typename dtype<DT>::T *>(blockIdx.y ? p.out[1] : p.out[0])[col] = dtype<DT>::enc(t);
}

// ---- host side --------------------------------------------------------------------------------
typedef void (*norm_kernel)(const cti_cuda_norm);

#define CTI_NORM_CASES(KERNEL, B)                                                              \
    CTI_NORM_CASE(KERNEL, 0, B) CTI_NORM_CASE(KERNEL, 1, B) CTI_NORM_CASE(KERNEL, 2, B)        \
    CTI_NORM_CASE(KERNEL, 3, B) CTI_NORM_CASE(KERNEL, 4, B) CTI_NORM_CASE(KERNEL, 5, B)        \
    CTI_NORM_CASE(KERNEL, 6, B) CTI_NORM_CASE(KERNEL, 7, B) CTI_NORM_CASE(KERNEL, 8, B)        \
    CTI_NORM_CASE(KERNEL, 9, B) CTI_NORM_CASE(KERNEL, 10, B) CTI_NORM_CASE(KERNEL, 11, B)      \
    CTI_NORM_CASE(KERNEL, 12, B) CTI_NORM_CASE(KERNEL, 13, B) CTI_NORM_CASE(KERNEL, 14, B)     \
    CTI_NORM_CASE(KERNEL, 15, B) CTI_NORM_CASE(KERNEL, 16, B) CTI_NORM_CASE(KERNEL, 17, B)     \
    CTI_NORM_CASE(KERNEL, 18, B) CTI_NORM_CASE(KERNEL, 19, B) CTI_NORM_CASE(KERNEL, 20, B)     \
    CTI_NORM_CASE(KERNEL, 21, B) CTI_NORM_CASE(KERNEL, 22, B) CTI_NORM_CASE(KERNEL, 23, B)
#define CTI_NORM_CASE(KERNEL, k, B)                                                            \
    case k:                                                                                    \
        if constexpr (reachable(k / 4, cfg_nv(k), VEC, (int)sizeof(typename dtype<DT>::T), B)) \
            return KERNEL<DT, LAYER, VEC, cfg_tpr(k), cfg_nv(k)>;                              \
        else                                                                                   \
            return nullptr;

// The kernel of configuration cfg (-1: the loop kernel); nullptr for a
// configuration the plan never picks, which is not compiled.
template <int DT, bool LAYER, int VEC> norm_kernel fwd_kernel(int cfg) {
    switch (cfg) {
        CTI_NORM_CASES(fwd_reg, fwd_bytes((int)sizeof(typename dtype<DT>::T)))
    default: return fwd_loop<DT, LAYER, VEC>;
    }
}

// fwd_full's kernel of configuration cfg (VEC > 1 only).
template <int DT, bool LAYER, int VEC> norm_kernel full_kernel(int cfg) {
    switch (cfg) {
        CTI_NORM_CASES(fwd_full, fwd_bytes((int)sizeof(typename dtype<DT>::T)))
    default: return nullptr;
    }
}

template <int DT, bool LAYER, int VEC> norm_kernel bwd_kernel(int cfg) {
    switch (cfg) {
        CTI_NORM_CASES(bwd_reg, kBwdBytes)
    default: return bwd_loop<DT, LAYER, VEC>;
    }
}
#undef CTI_NORM_CASE
#undef CTI_NORM_CASES

// Resident blocks per multiprocessor of a backward kernel, asked once per
// kernel and kept (a failed query counts 1), so the scratch size and the
// launch always agree on the grid.
template <int DT, bool LAYER, int VEC> int bwd_occupancy(int cfg) {
    static std::atomic<int> cache[kNumCfg + 1];
    const int slot = cfg < 0 ? kNumCfg : cfg;
    int n = cache[slot].load(std::memory_order_relaxed);
    if (n > 0) return n;
    const int block = cfg < 0 ? kLoopBlock : block_of(cfg_tpr(cfg));
    norm_kernel k = bwd_kernel<DT, LAYER, VEC>(cfg);
    if (!k || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, block, 0) != cudaSuccess) {
        cudaGetLastError();
        n = 1;
    }
    if (n < 1) n = 1;
    int expected = 0;
    cache[slot].compare_exchange_strong(expected, n, std::memory_order_relaxed);
    return cache[slot].load(std::memory_order_relaxed);
}

struct Plan {
    int vec;        // elements per chunk: 16 bytes' worth, or 1
    int cfg;        // register configuration, -1: loop kernels
    int block, rpb; // threads a block, rows a block
    int64_t grid;   // blocks
};

bool aligned16(const void *p) { return p == nullptr || (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <int DT> int full_vec() { return 16 / (int)sizeof(typename dtype<DT>::T); }

// The occupancy of the backward kernel the plan picked.
template <int DT, int VEC> int occupancy_of(bool layer, int cfg) {
    return layer ? bwd_occupancy<DT, true, VEC>(cfg) : bwd_occupancy<DT, false, VEC>(cfg);
}

template <int DT> Plan make_plan(const cti_cuda_norm *a, int sm_count, bool bwd) {
    Plan p;
    const int64_t D = a->d;
    const int fv = full_vec<DT>();
    const bool vec = D % fv == 0 && aligned16(a->x) && aligned16(a->y) && aligned16(a->w) &&
                     (bwd ? aligned16(a->g) : aligned16(a->b));
    p.vec = vec ? fv : 1;
    const int64_t nvec = D / p.vec;
    const int esize = (int)sizeof(typename dtype<DT>::T);
    const int nvm = nv_max(p.vec, esize, bwd ? kBwdBytes : fwd_bytes(esize));
    p.cfg = -1;
    for (int t = 0; t < kNumTpr && p.cfg < 0; t++) {
        if ((int64_t)kTprs[t] * nvm < nvec) continue;
        int n = 0;
        while ((int64_t)kTprs[t] << n < nvec) n++;
        p.cfg = t * 4 + n;
    }
    p.block = p.cfg < 0 ? kLoopBlock : bwd ? block_of(cfg_tpr(p.cfg)) : fwd_block_of(cfg_tpr(p.cfg));
    p.rpb = p.cfg < 0 ? 1 : p.block / cfg_tpr(p.cfg);
    const int64_t groups = (a->rows + p.rpb - 1) / p.rpb;
    int64_t grid = groups;
    if (bwd) {
        // As many blocks as the device holds at once: each writes one row of
        // partial sums, so fewer blocks mean less scratch.
        constexpr int FV = 16 / sizeof(typename dtype<DT>::T);
        int occ = vec ? occupancy_of<DT, FV>(a->layer, p.cfg) : occupancy_of<DT, 1>(a->layer, p.cfg);
        int64_t resident = (int64_t)(sm_count > 0 ? sm_count : 1) * occ;
        if (grid > resident) grid = resident;
        // Very long rows: keep the partial rows to about 16M elements.
        if (p.cfg < 0) {
            int64_t cap = ((int64_t)1 << 24) / (D > 0 ? D : 1);
            if (grid > cap) grid = cap;
        }
    }
    if (grid > INT_MAX) grid = INT_MAX;
    p.grid = grid > 0 ? grid : 1;
    return p;
}

template <int DT> size_t work_bytes(const cti_cuda_norm *a, int sm_count) {
    const int ngrad = (a->dw ? 1 : 0) + (a->layer && a->db ? 1 : 0);
    if (ngrad == 0 || a->rows == 0 || a->d == 0) return 0;
    Plan p = make_plan<DT>(a, sm_count, true);
    return (size_t)ngrad * (size_t)p.grid * (size_t)a->d * sizeof(typename acc_of<DT>::A);
}

const char *routine_name(bool layer, bool bwd, bool loop, bool vec, bool params) {
    // [layer][bwd][loop][vec]; the backward names add the partial-sum kernel.
    static const char *const names[2][3][2][2] = {
        {{{"cten_rms_norm_fwd", "cten_rms_norm_fwd_vec16"},
          {"cten_rms_norm_fwd_loop", "cten_rms_norm_fwd_loop_vec16"}},
         {{"cten_rms_norm_bwd", "cten_rms_norm_bwd_vec16"},
          {"cten_rms_norm_bwd_loop", "cten_rms_norm_bwd_loop_vec16"}},
         {{"cten_rms_norm_bwd+cten_norm_param_sum", "cten_rms_norm_bwd_vec16+cten_norm_param_sum"},
          {"cten_rms_norm_bwd_loop+cten_norm_param_sum",
           "cten_rms_norm_bwd_loop_vec16+cten_norm_param_sum"}}},
        {{{"cten_layer_norm_fwd", "cten_layer_norm_fwd_vec16"},
          {"cten_layer_norm_fwd_loop", "cten_layer_norm_fwd_loop_vec16"}},
         {{"cten_layer_norm_bwd", "cten_layer_norm_bwd_vec16"},
          {"cten_layer_norm_bwd_loop", "cten_layer_norm_bwd_loop_vec16"}},
         {{"cten_layer_norm_bwd+cten_norm_param_sum",
           "cten_layer_norm_bwd_vec16+cten_norm_param_sum"},
          {"cten_layer_norm_bwd_loop+cten_norm_param_sum",
           "cten_layer_norm_bwd_loop_vec16+cten_norm_param_sum"}}}};
    return names[layer][bwd ? (params ? 2 : 1) : 0][loop][vec];
}

template <int DT>
cudaError_t forward(const cti_cuda_norm *a, int sm_count, cudaStream_t st, const char **routine) {
    Plan p = make_plan<DT>(a, sm_count, false);
    const bool vec = p.vec > 1;
    *routine = routine_name(a->layer, false, p.cfg < 0, vec, false);
    if (a->rows == 0) return cudaSuccess;
    constexpr int FV = 16 / sizeof(typename dtype<DT>::T);
    // rows that fill their chunks exactly, and a grid of every group: fwd_full
    const bool full = vec && p.cfg >= 0 && a->d == (int64_t)cfg_tpr(p.cfg) * cfg_nv(p.cfg) * FV &&
                      p.grid * p.rpb >= a->rows;
    norm_kernel k = full ? (a->layer ? full_kernel<DT, true, FV>(p.cfg)
                                     : full_kernel<DT, false, FV>(p.cfg))
                    : a->layer ? (vec ? fwd_kernel<DT, true, FV>(p.cfg) : fwd_kernel<DT, true, 1>(p.cfg))
                               : (vec ? fwd_kernel<DT, false, FV>(p.cfg) : fwd_kernel<DT, false, 1>(p.cfg));
    if (!k) return cudaErrorInvalidValue;
    k<<<(unsigned)p.grid, p.block, 0, st>>>(*a);
    return cudaGetLastError();
}

template <int DT>
cudaError_t backward(const cti_cuda_norm *a, int sm_count, cudaStream_t st, const char **routine) {
    typedef typename acc_of<DT>::A A;
    const bool want_w = a->dw != nullptr, want_b = a->layer && a->db != nullptr;
    const int ngrad = (want_w ? 1 : 0) + (want_b ? 1 : 0);
    Plan p = make_plan<DT>(a, sm_count, true);
    const bool vec = p.vec > 1;
    *routine = routine_name(a->layer, true, p.cfg < 0, vec, ngrad > 0);
    if (!a->y && ngrad == 0) return cudaSuccess;
    if (a->d == 0) return cudaSuccess; // nothing to write
    const size_t esize = sizeof(typename dtype<DT>::T);
    if (a->rows == 0) { // the sums over no rows
        cudaError_t e = cudaSuccess;
        if (want_w) e = cudaMemsetAsync(a->dw, 0, (size_t)a->d * esize, st);
        if (e == cudaSuccess && want_b) e = cudaMemsetAsync(a->db, 0, (size_t)a->d * esize, st);
        return e;
    }
    if (ngrad > 0 && !a->work) return cudaErrorInvalidValue;
    constexpr int FV = 16 / sizeof(typename dtype<DT>::T);
    norm_kernel k = a->layer ? (vec ? bwd_kernel<DT, true, FV>(p.cfg) : bwd_kernel<DT, true, 1>(p.cfg))
                             : (vec ? bwd_kernel<DT, false, FV>(p.cfg) : bwd_kernel<DT, false, 1>(p.cfg));
    if (!k) return cudaErrorInvalidValue;
    k<<<(unsigned)p.grid, p.block, 0, st>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || ngrad == 0) return e;
    ParamSum ps = {{nullptr, nullptr}, {nullptr, nullptr}, 0, 0};
    const A *base = static_cast<const A *>(a->work);
    int n = 0;
    if (want_w) {
        ps.part[n] = base;
        ps.out[n++] = a->dw;
    }
    if (want_b) {
        ps.part[n] = base + (want_w ? p.grid * a->d : 0);
        ps.out[n++] = a->db;
    }
    ps.P = p.grid;
    ps.D = a->d;
    const int64_t bx = (a->d + kSumX - 1) / kSumX;
    if (bx > INT_MAX) return cudaErrorInvalidValue;
    param_sum<DT><<<dim3((unsigned)bx, (unsigned)n), dim3(kSumX, kSumY), 0, st>>>(ps);
    return cudaGetLastError();
}

// ---- residual add fused with the norm ---------------------------------------------------
// add_rms_norm / add_layer_norm: sum = x + res rounded to the sum's dtype S
// and stored, y = the norm of the stored sum in the dtype y asks for; the
// backward's dx = grad_sum + the norm's input gradient, stored twice (dx and
// dres, each in its own dtype). x, res, y, g and the outputs each have a
// dtype of their own, known only at run time: a warp-uniform switch per
// access picks it (the kernels are bound by memory, and one kernel per
// dtype combination would multiply their number by 64). Rows whose every
// tensor takes 4-element vectors go through register kernels like fwd_reg
// and bwd_reg (TPR threads a row, NV chunks of 4 a thread, the row read
// once); float64 sums, other rows and rows longer than 8192 through loop
// kernels, a block a row, that read the stored sum again for each pass.

// A row of nvec chunks takes the smallest TPR that holds it in two chunks a
// thread, rows past 1024 chunks up to eight a thread at 512 threads a row:
// more threads a row beat more chunks a thread here. float32 sums of 768
// (GPT-2's LayerNorm, bf16 residual and output) on the H200, forward and
// backward: 74 and 95 us with 32 threads of six chunks, 68 and 84 with 64 of
// three, 61 and 75 with 128 of two.
constexpr int kAddNumTpr = 4;
constexpr int kAddTprs[kAddNumTpr] = {32, 64, 128, 512};
constexpr int kAddMaxNv = 8;
constexpr int kAddNumCfg = kAddNumTpr * kAddMaxNv;
__host__ __device__ constexpr int add_block(int tpr) { return tpr > 128 ? tpr : 128; }
__host__ __device__ constexpr int add_nv_max(int t) { return t == kAddNumTpr - 1 ? kAddMaxNv : 2; }

template <int DT, int VEC, class A>
__device__ __forceinline__ void ld_typed(const void *base, int64_t i, A (&v)[VEC]) {
    typedef typename dtype<DT>::T T;
    const T *p = static_cast<const T *>(base) + i;
    if constexpr (VEC == 4 && sizeof(T) <= 4) {
        struct alignas(4 * sizeof(T)) V4 { T e[4]; };
        const V4 r = *reinterpret_cast<const V4 *>(p);
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = (A)dtype<DT>::dec(r.e[k]);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = (A)dtype<DT>::dec(p[k]);
    }
}

template <int DT, int VEC, class A>
__device__ __forceinline__ void st_typed(void *base, int64_t i, const A (&v)[VEC]) {
    typedef typename dtype<DT>::T T;
    T *p = static_cast<T *>(base) + i;
    if constexpr (VEC == 4 && sizeof(T) <= 4) {
        struct alignas(4 * sizeof(T)) V4 { T e[4]; };
        V4 r;
#pragma unroll
        for (int k = 0; k < 4; k++) r.e[k] = dtype<DT>::enc(v[k]);
        *reinterpret_cast<V4 *>(p) = r;
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) p[k] = dtype<DT>::enc(v[k]);
    }
}

// VEC elements of a floating tensor of run-time dtype dt from element i.
template <int VEC, class A>
__device__ __forceinline__ void ld_any(int dt, const void *base, int64_t i, A (&v)[VEC]) {
    switch (dt) {
    case CT_F16: ld_typed<CT_F16, VEC>(base, i, v); break;
    case CT_BF16: ld_typed<CT_BF16, VEC>(base, i, v); break;
    case CT_F32: ld_typed<CT_F32, VEC>(base, i, v); break;
    default: ld_typed<CT_F64, VEC>(base, i, v); break;
    }
}

template <int VEC, class A>
__device__ __forceinline__ void st_any(int dt, void *base, int64_t i, const A (&v)[VEC]) {
    switch (dt) {
    case CT_F16: st_typed<CT_F16, VEC>(base, i, v); break;
    case CT_BF16: st_typed<CT_BF16, VEC>(base, i, v); break;
    case CT_F32: st_typed<CT_F32, VEC>(base, i, v); break;
    default: st_typed<CT_F64, VEC>(base, i, v); break;
    }
}

// v rounded to dtype dt and back: the value the stored sum holds.
template <class A> __device__ __forceinline__ A round_to(int dt, A v) {
    if (dt == CT_F16) return (A)dec_f16(enc_f16((float)v));
    if (dt == CT_BF16) return (A)dec_bf16(enc_bf16((float)v));
    if (dt == CT_F32) return (A)(float)v;
    return v;
}

// The register kernels (float sums; every pointer takes 4-element vectors).
template <bool LAYER, int TPR, int NV>
__global__ void __launch_bounds__(add_block(TPR)) add_fwd_reg(const cti_cuda_norm a) {
    constexpr int BLOCK = add_block(TPR), RPB = BLOCK / TPR, VEC = 4;
    __shared__ float red[BLOCK / 32];
    const int lane = threadIdx.x % TPR, slot = threadIdx.x / TPR;
    const int64_t D = a.d, groups = (a.rows + RPB - 1) / RPB;
    const int sdt = a.dt;
    for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        const int64_t row = gi * RPB + slot;
        const bool live = row < a.rows;
        const int64_t off = (live ? row : 0) * D;
        float v[NV][VEC];
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int e = (j * TPR + lane) * VEC;
            if (live && e < D) {
                float xv[VEC], rv[VEC];
                ld_any<VEC>(a.xdt, a.x, off + e, xv);
                ld_any<VEC>(a.rdt, a.res, off + e, rv);
#pragma unroll
                for (int i = 0; i < VEC; i++) v[j][i] = round_to(sdt, xv[i] + rv[i]);
                st_any<VEC>(sdt, a.sum, off + e, v[j]);
            } else {
#pragma unroll
                for (int i = 0; i < VEC; i++) v[j][i] = 0;
            }
        }
        float s[1] = {0};
#pragma unroll
        for (int j = 0; j < NV; j++)
#pragma unroll
            for (int i = 0; i < VEC; i++) s[0] += LAYER ? v[j][i] : v[j][i] * v[j][i];
        row_sum<TPR>(s, red);
        float mean = 0, inv;
        if constexpr (LAYER) {
            mean = s[0] / (float)D;
            float q[1] = {centered_squares<VEC, TPR, NV, true>(v, mean, lane, D)};
            row_sum<TPR>(q, red);
            inv = 1.0f / sqrtf(q[0] / (float)D + (float)a.eps);
        } else {
            inv = 1.0f / sqrtf(s[0] / (float)D + (float)a.eps);
        }
        if (!live) continue;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int e = (j * TPR + lane) * VEC;
            if (e >= D) continue;
            float o[VEC];
#pragma unroll
            for (int i = 0; i < VEC; i++) o[i] = LAYER ? (v[j][i] - mean) * inv : v[j][i] * inv;
            if (a.w) {
                float wv[VEC];
                ld_any<VEC>(sdt, a.w, e, wv);
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] *= wv[i];
            }
            if (LAYER && a.b) {
                float bv[VEC];
                ld_any<VEC>(sdt, a.b, e, bv);
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] += bv[i];
            }
            st_any<VEC>(a.ydt, a.y, off + e, o);
        }
        if (lane == 0) {
            if (a.rstd_out) static_cast<float *>(a.rstd_out)[row] = inv;
            if (LAYER && a.mean_out) static_cast<float *>(a.mean_out)[row] = mean;
        }
    }
}

template <bool LAYER, int TPR, int NV>
__global__ void __launch_bounds__(add_block(TPR)) add_bwd_reg(const cti_cuda_norm a) {
    constexpr int BLOCK = add_block(TPR), RPB = BLOCK / TPR, VEC = 4, N = LAYER ? 2 : 1;
    __shared__ float red[N * BLOCK / 32];
    __shared__ float cols[RPB > 1 ? TPR * NV * VEC : 1];
    const int lane = threadIdx.x % TPR, slot = threadIdx.x / TPR;
    const int64_t D = a.d, groups = (a.rows + RPB - 1) / RPB;
    const int sdt = a.dt;
    const bool want_dx = a.y || a.dres, want_w = a.dw != nullptr, want_b = LAYER && a.db != nullptr;
    float aw[NV][VEC], ab[NV][VEC];
#pragma unroll
    for (int j = 0; j < NV; j++)
#pragma unroll
        for (int i = 0; i < VEC; i++) aw[j][i] = ab[j][i] = 0;
    for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        const int64_t row = gi * RPB + slot;
        const bool live = row < a.rows;
        const int64_t off = (live ? row : 0) * D;
        float xv[NV][VEC], gv[NV][VEC];
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int e = (j * TPR + lane) * VEC;
            if (live && e < D) {
                ld_any<VEC>(sdt, a.x, off + e, xv[j]);
                ld_any<VEC>(a.ydt, a.g, off + e, gv[j]);
            } else {
#pragma unroll
                for (int i = 0; i < VEC; i++) xv[j][i] = gv[j][i] = 0;
            }
        }
        const float rs = live ? static_cast<const float *>(a.rstd)[row] : 0.0f;
        const float mu = LAYER && live ? static_cast<const float *>(a.mean)[row] : 0.0f;
        if (want_dx) {
            float s[N];
#pragma unroll
            for (int k = 0; k < N; k++) s[k] = 0;
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int e = (j * TPR + lane) * VEC;
                float wv[VEC] = {1, 1, 1, 1};
                if (a.w && e < D) ld_any<VEC>(sdt, a.w, e, wv);
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    const float gw = gv[j][i] * wv[i];
                    if constexpr (LAYER) {
                        s[0] += gw;
                        s[1] += gw * xv[j][i];
                    } else {
                        s[0] += gw * xv[j][i];
                    }
                }
            }
            row_sum<TPR>(s, red);
            float c0, c1;
            dx_coef<LAYER>(s, (float)D, rs, mu, c0, c1);
            if (live)
#pragma unroll
                for (int j = 0; j < NV; j++) {
                    const int e = (j * TPR + lane) * VEC;
                    if (e >= D) continue;
                    float wv[VEC] = {1, 1, 1, 1}, o[VEC], hv[VEC] = {0, 0, 0, 0};
                    if (a.w) ld_any<VEC>(sdt, a.w, e, wv);
                    if (a.gsum) ld_any<VEC>(sdt, a.gsum, off + e, hv);
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        o[i] = hv[i] + dx_of<LAYER>(gv[j][i] * wv[i], xv[j][i], rs, mu, c0, c1);
                    if (a.y) st_any<VEC>(a.xdt, a.y, off + e, o);
                    if (a.dres) st_any<VEC>(a.rdt, a.dres, off + e, o);
                }
        }
#pragma unroll
        for (int j = 0; j < NV; j++)
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                if (want_w)
                    aw[j][i] += LAYER ? gv[j][i] * ((xv[j][i] - mu) * rs) : gv[j][i] * xv[j][i] * rs;
                if (want_b) ab[j][i] += gv[j][i];
            }
    }
    float *part = static_cast<float *>(a.work);
    if (want_w) write_part<TPR, NV, VEC, RPB>(aw, part + (int64_t)blockIdx.x * D, D, cols);
    if (want_b)
        write_part<TPR, NV, VEC, RPB>(
            ab, part + ((want_w ? (int64_t)gridDim.x : 0) + blockIdx.x) * D, D, cols);
}

// The loop kernels: any dtypes, any alignment, any length; A is double for a
// float64 sum.
template <class A, bool LAYER>
__global__ void __launch_bounds__(kLoopBlock) add_fwd_loop(const cti_cuda_norm a) {
    __shared__ A red[kLoopBlock / 32];
    const int64_t D = a.d;
    const int sdt = a.dt;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const int64_t off = row * D;
        A s[1] = {0};
        for (int64_t e = threadIdx.x; e < D; e += kLoopBlock) {
            A xv[1], rv[1];
            ld_any<1>(a.xdt, a.x, off + e, xv);
            ld_any<1>(a.rdt, a.res, off + e, rv);
            A v[1] = {round_to(sdt, xv[0] + rv[0])};
            st_any<1>(sdt, a.sum, off + e, v);
            s[0] += LAYER ? v[0] : v[0] * v[0];
        }
        row_sum<kLoopBlock>(s, red);
        A mean = 0, inv;
        if constexpr (LAYER) {
            mean = s[0] / (A)D;
            A q[1] = {0};
            // each thread reads back the elements it stored itself
            for (int64_t e = threadIdx.x; e < D; e += kLoopBlock) {
                A v[1];
                ld_any<1>(sdt, a.sum, off + e, v);
                q[0] += (v[0] - mean) * (v[0] - mean);
            }
            row_sum<kLoopBlock>(q, red);
            inv = (A)1 / msqrt(q[0] / (A)D + (A)a.eps);
        } else {
            inv = (A)1 / msqrt(s[0] / (A)D + (A)a.eps);
        }
        for (int64_t e = threadIdx.x; e < D; e += kLoopBlock) {
            A v[1];
            ld_any<1>(sdt, a.sum, off + e, v);
            A o[1] = {LAYER ? (v[0] - mean) * inv : v[0] * inv};
            if (a.w) {
                A wv[1];
                ld_any<1>(sdt, a.w, e, wv);
                o[0] *= wv[0];
            }
            if (LAYER && a.b) {
                A bv[1];
                ld_any<1>(sdt, a.b, e, bv);
                o[0] += bv[0];
            }
            st_any<1>(a.ydt, a.y, off + e, o);
        }
        if (threadIdx.x == 0) {
            if (a.rstd_out) static_cast<A *>(a.rstd_out)[row] = inv;
            if (LAYER && a.mean_out) static_cast<A *>(a.mean_out)[row] = mean;
        }
    }
}

template <class A, bool LAYER>
__global__ void __launch_bounds__(kLoopBlock) add_bwd_loop(const cti_cuda_norm a) {
    constexpr int N = LAYER ? 2 : 1;
    __shared__ A red[N * kLoopBlock / 32];
    const int64_t D = a.d;
    const int sdt = a.dt;
    const bool want_dx = a.y || a.dres, want_w = a.dw != nullptr, want_b = LAYER && a.db != nullptr;
    A *pw = want_w ? static_cast<A *>(a.work) + (int64_t)blockIdx.x * D : nullptr;
    A *pb = want_b ? static_cast<A *>(a.work) + ((want_w ? (int64_t)gridDim.x : 0) + blockIdx.x) * D
                   : nullptr;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const int64_t off = row * D;
        const A rs = static_cast<const A *>(a.rstd)[row];
        const A mu = LAYER ? static_cast<const A *>(a.mean)[row] : (A)0;
        A c0 = 0, c1 = 0;
        if (want_dx) {
            A s[N];
#pragma unroll
            for (int k = 0; k < N; k++) s[k] = 0;
            for (int64_t e = threadIdx.x; e < D; e += kLoopBlock) {
                A xv[1], gv[1], wv[1] = {1};
                ld_any<1>(sdt, a.x, off + e, xv);
                ld_any<1>(a.ydt, a.g, off + e, gv);
                if (a.w) ld_any<1>(sdt, a.w, e, wv);
                const A gw = gv[0] * wv[0];
                if constexpr (LAYER) {
                    s[0] += gw;
                    s[1] += gw * xv[0];
                } else {
                    s[0] += gw * xv[0];
                }
            }
            row_sum<kLoopBlock>(s, red);
            dx_coef<LAYER>(s, (A)D, rs, mu, c0, c1);
        }
        const bool first = row == blockIdx.x;
        for (int64_t e = threadIdx.x; e < D; e += kLoopBlock) {
            A xv[1], gv[1];
            ld_any<1>(sdt, a.x, off + e, xv);
            ld_any<1>(a.ydt, a.g, off + e, gv);
            if (want_dx) {
                A wv[1] = {1}, hv[1] = {0};
                if (a.w) ld_any<1>(sdt, a.w, e, wv);
                if (a.gsum) ld_any<1>(sdt, a.gsum, off + e, hv);
                A o[1] = {hv[0] + dx_of<LAYER>(gv[0] * wv[0], xv[0], rs, mu, c0, c1)};
                if (a.y) st_any<1>(a.xdt, a.y, off + e, o);
                if (a.dres) st_any<1>(a.rdt, a.dres, off + e, o);
            }
            if (pw) {
                A t = LAYER ? gv[0] * ((xv[0] - mu) * rs) : gv[0] * xv[0] * rs;
                pw[e] = first ? t : pw[e] + t;
            }
            if (pb) pb[e] = first ? gv[0] : pb[e] + gv[0];
        }
    }
}

#define CTI_ADD_CASES(KERNEL, L)                                                               \
    CTI_ADD_CASE(KERNEL, L, 0) CTI_ADD_CASE(KERNEL, L, 1) CTI_ADD_CASE(KERNEL, L, 2)           \
    CTI_ADD_CASE(KERNEL, L, 3) CTI_ADD_CASE(KERNEL, L, 4) CTI_ADD_CASE(KERNEL, L, 5)           \
    CTI_ADD_CASE(KERNEL, L, 6) CTI_ADD_CASE(KERNEL, L, 7) CTI_ADD_CASE(KERNEL, L, 8)           \
    CTI_ADD_CASE(KERNEL, L, 9) CTI_ADD_CASE(KERNEL, L, 10) CTI_ADD_CASE(KERNEL, L, 11)         \
    CTI_ADD_CASE(KERNEL, L, 12) CTI_ADD_CASE(KERNEL, L, 13) CTI_ADD_CASE(KERNEL, L, 14)        \
    CTI_ADD_CASE(KERNEL, L, 15) CTI_ADD_CASE(KERNEL, L, 16) CTI_ADD_CASE(KERNEL, L, 17)        \
    CTI_ADD_CASE(KERNEL, L, 18) CTI_ADD_CASE(KERNEL, L, 19) CTI_ADD_CASE(KERNEL, L, 20)        \
    CTI_ADD_CASE(KERNEL, L, 21) CTI_ADD_CASE(KERNEL, L, 22) CTI_ADD_CASE(KERNEL, L, 23)        \
    CTI_ADD_CASE(KERNEL, L, 24) CTI_ADD_CASE(KERNEL, L, 25) CTI_ADD_CASE(KERNEL, L, 26)        \
    CTI_ADD_CASE(KERNEL, L, 27) CTI_ADD_CASE(KERNEL, L, 28) CTI_ADD_CASE(KERNEL, L, 29)        \
    CTI_ADD_CASE(KERNEL, L, 30) CTI_ADD_CASE(KERNEL, L, 31)
#define CTI_ADD_CASE(KERNEL, L, k)                                                             \
    case k:                                                                                    \
        if constexpr (k % kAddMaxNv < add_nv_max(k / kAddMaxNv))                               \
            return KERNEL<L, kAddTprs[k / kAddMaxNv], k % kAddMaxNv + 1>;                      \
        else                                                                                   \
            return nullptr;

// Configuration cfg = tpr index * kAddMaxNv + (NV - 1); -1 is the loop kernel;
// nullptr for a configuration the plan never picks, which is not compiled.
template <bool LAYER> norm_kernel add_fwd_kernel(int cfg, bool dbl) {
    switch (cfg) {
        CTI_ADD_CASES(add_fwd_reg, LAYER)
    default: return dbl ? add_fwd_loop<double, LAYER> : add_fwd_loop<float, LAYER>;
    }
}

template <bool LAYER> norm_kernel add_bwd_kernel(int cfg, bool dbl) {
    switch (cfg) {
        CTI_ADD_CASES(add_bwd_reg, LAYER)
    default: return dbl ? add_bwd_loop<double, LAYER> : add_bwd_loop<float, LAYER>;
    }
}
#undef CTI_ADD_CASE
#undef CTI_ADD_CASES

size_t esize_of(int dt) { return dt == CT_F64 ? 8 : dt == CT_F32 ? 4 : 2; }

// p takes loads of 4 elements of dtype dt at every multiple of 4 elements.
bool aligned4(const void *p, int dt) {
    return p == nullptr || (reinterpret_cast<uintptr_t>(p) % (4 * esize_of(dt))) == 0;
}

struct AddPlan {
    int cfg;      // register configuration, -1: the loop kernels
    int block;
    int64_t grid;
};

int add_occupancy(bool layer, int cfg, bool dbl) {
    // [layer][cfg + 1 or the double loop kernel]
    static std::atomic<int> cache[2][kAddNumCfg + 2];
    const int slot = cfg < 0 ? (dbl ? kAddNumCfg + 1 : 0) : cfg + 1;
    std::atomic<int> &c = cache[layer][slot];
    int n = c.load(std::memory_order_relaxed);
    if (n > 0) return n;
    const int block = cfg < 0 ? kLoopBlock : add_block(kAddTprs[cfg / kAddMaxNv]);
    norm_kernel k = layer ? add_bwd_kernel<true>(cfg, dbl) : add_bwd_kernel<false>(cfg, dbl);
    if (!k || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, block, 0) != cudaSuccess) {
        cudaGetLastError();
        n = 1;
    }
    if (n < 1) n = 1;
    int expected = 0;
    c.compare_exchange_strong(expected, n, std::memory_order_relaxed);
    return c.load(std::memory_order_relaxed);
}

AddPlan add_plan(const cti_cuda_norm *a, int sm_count, bool bwd) {
    AddPlan p;
    const int64_t D = a->d;
    const bool dbl = a->dt == CT_F64;
    bool vec = !dbl && D % 4 == 0 && aligned4(a->x, a->dt) && aligned4(a->w, a->dt) &&
               aligned4(a->b, a->dt);
    if (bwd)
        vec = vec && aligned4(a->g, a->ydt) && aligned4(a->gsum, a->dt) &&
              aligned4(a->y, a->xdt) && aligned4(a->dres, a->rdt);
    else
        vec = vec && aligned4(a->res, a->rdt) && aligned4(a->sum, a->dt) && aligned4(a->y, a->ydt);
    p.cfg = -1;
    const int64_t nvec = D / 4;
    for (int t = 0; vec && t < kAddNumTpr && p.cfg < 0; t++)
        if ((int64_t)kAddTprs[t] * add_nv_max(t) >= nvec) {
            const int64_t nv = (nvec + kAddTprs[t] - 1) / kAddTprs[t];
            p.cfg = t * kAddMaxNv + (int)(nv > 0 ? nv - 1 : 0);
        }
    p.block = p.cfg < 0 ? kLoopBlock : add_block(kAddTprs[p.cfg / kAddMaxNv]);
    const int rpb = p.cfg < 0 ? 1 : p.block / kAddTprs[p.cfg / kAddMaxNv];
    int64_t grid = (a->rows + rpb - 1) / rpb;
    // The backward: as many blocks as the device holds at once, each writing
    // one row of partial sums. The forward: a block a group of rows, as the
    // norm's forward, so that the device keeps the forward's own occupancy
    // of blocks loading while others reduce (capped at the backward's
    // resident blocks, GPT-2's fused LayerNorm took 60 us a call, 2.5 TB/s).
    if (bwd) {
        const int64_t resident =
            (int64_t)(sm_count > 0 ? sm_count : 1) * add_occupancy(a->layer, p.cfg, dbl);
        if (grid > resident) grid = resident;
    }
    if (bwd && p.cfg < 0) {
        const int64_t cap = ((int64_t)1 << 24) / (D > 0 ? D : 1);
        if (grid > cap) grid = cap;
    }
    if (grid > INT_MAX) grid = INT_MAX;
    p.grid = grid > 0 ? grid : 1;
    return p;
}

size_t add_work_bytes(const cti_cuda_norm *a, int sm_count) {
    const int ngrad = (a->dw ? 1 : 0) + (a->layer && a->db ? 1 : 0);
    if (ngrad == 0 || a->rows == 0 || a->d == 0) return 0;
    AddPlan p = add_plan(a, sm_count, true);
    return (size_t)ngrad * (size_t)p.grid * (size_t)a->d * (a->dt == CT_F64 ? 8 : 4);
}

const char *add_routine(bool layer, bool bwd, bool loop, bool params) {
    static const char *const names[2][3][2] = {
        {{"cten_add_rms_norm_fwd_vec", "cten_add_rms_norm_fwd_loop"},
         {"cten_add_rms_norm_bwd_vec", "cten_add_rms_norm_bwd_loop"},
         {"cten_add_rms_norm_bwd_vec+cten_norm_param_sum",
          "cten_add_rms_norm_bwd_loop+cten_norm_param_sum"}},
        {{"cten_add_layer_norm_fwd_vec", "cten_add_layer_norm_fwd_loop"},
         {"cten_add_layer_norm_bwd_vec", "cten_add_layer_norm_bwd_loop"},
         {"cten_add_layer_norm_bwd_vec+cten_norm_param_sum",
          "cten_add_layer_norm_bwd_loop+cten_norm_param_sum"}}};
    return names[layer][bwd ? (params ? 2 : 1) : 0][loop];
}

cudaError_t add_forward(const cti_cuda_norm *a, int sm_count, cudaStream_t st,
                        const char **routine) {
    AddPlan p = add_plan(a, sm_count, false);
    *routine = add_routine(a->layer, false, p.cfg < 0, false);
    if (a->rows == 0) return cudaSuccess;
    const bool dbl = a->dt == CT_F64;
    norm_kernel k = a->layer ? add_fwd_kernel<true>(p.cfg, dbl) : add_fwd_kernel<false>(p.cfg, dbl);
    if (!k) return cudaErrorInvalidValue;
    k<<<(unsigned)p.grid, p.block, 0, st>>>(*a);
    return cudaGetLastError();
}

template <int DT> void param_sum_launch(const ParamSum &ps, unsigned bx, unsigned n, cudaStream_t st) {
    param_sum<DT><<<dim3(bx, n), dim3(kSumX, kSumY), 0, st>>>(ps);
}

cudaError_t add_backward(const cti_cuda_norm *a, int sm_count, cudaStream_t st,
                         const char **routine) {
    const bool want_w = a->dw != nullptr, want_b = a->layer && a->db != nullptr;
    const int ngrad = (want_w ? 1 : 0) + (want_b ? 1 : 0);
    AddPlan p = add_plan(a, sm_count, true);
    *routine = add_routine(a->layer, true, p.cfg < 0, ngrad > 0);
    if (!a->y && !a->dres && ngrad == 0) return cudaSuccess;
    if (a->d == 0) return cudaSuccess;
    const size_t es = esize_of(a->dt);
    if (a->rows == 0) {
        cudaError_t e = cudaSuccess;
        if (want_w) e = cudaMemsetAsync(a->dw, 0, (size_t)a->d * es, st);
        if (e == cudaSuccess && want_b) e = cudaMemsetAsync(a->db, 0, (size_t)a->d * es, st);
        return e;
    }
    if (ngrad > 0 && !a->work) return cudaErrorInvalidValue;
    const bool dbl = a->dt == CT_F64;
    norm_kernel k = a->layer ? add_bwd_kernel<true>(p.cfg, dbl) : add_bwd_kernel<false>(p.cfg, dbl);
    if (!k) return cudaErrorInvalidValue;
    k<<<(unsigned)p.grid, p.block, 0, st>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || ngrad == 0) return e;
    ParamSum ps = {{nullptr, nullptr}, {nullptr, nullptr}, 0, 0};
    const size_t acc = dbl ? 8 : 4;
    const char *base = static_cast<const char *>(a->work);
    int n = 0;
    if (want_w) {
        ps.part[n] = base;
        ps.out[n++] = a->dw;
    }
    if (want_b) {
        ps.part[n] = base + (want_w ? (size_t)p.grid * (size_t)a->d * acc : 0);
        ps.out[n++] = a->db;
    }
    ps.P = p.grid;
    ps.D = a->d;
    const int64_t bx = (a->d + kSumX - 1) / kSumX;
    if (bx > INT_MAX) return cudaErrorInvalidValue;
    switch (a->dt) {
    case CT_F16: param_sum_launch<CT_F16>(ps, (unsigned)bx, (unsigned)n, st); break;
    case CT_BF16: param_sum_launch<CT_BF16>(ps, (unsigned)bx, (unsigned)n, st); break;
    case CT_F32: param_sum_launch<CT_F32>(ps, (unsigned)bx, (unsigned)n, st); break;
    default: param_sum_launch<CT_F64>(ps, (unsigned)bx, (unsigned)n, st); break;
    }
    return cudaGetLastError();
}

} // namespace
} // namespace cti

extern "C" {

size_t cti_cuda_norm_work(const cti_cuda_norm *a, int sm_count) {
    if (a->add) return cti::add_work_bytes(a, sm_count);
    switch (a->dt) {
    case CT_F16: return cti::work_bytes<CT_F16>(a, sm_count);
    case CT_BF16: return cti::work_bytes<CT_BF16>(a, sm_count);
    case CT_F32: return cti::work_bytes<CT_F32>(a, sm_count);
    case CT_F64: return cti::work_bytes<CT_F64>(a, sm_count);
    default: return 0;
    }
}

cudaError_t cti_cuda_norm_forward(const cti_cuda_norm *a, int sm_count, cudaStream_t stream,
                                  const char **routine) {
    if (a->add) return cti::add_forward(a, sm_count, stream, routine);
    switch (a->dt) {
    case CT_F16: return cti::forward<CT_F16>(a, sm_count, stream, routine);
    case CT_BF16: return cti::forward<CT_BF16>(a, sm_count, stream, routine);
    case CT_F32: return cti::forward<CT_F32>(a, sm_count, stream, routine);
    case CT_F64: return cti::forward<CT_F64>(a, sm_count, stream, routine);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t cti_cuda_norm_backward(const cti_cuda_norm *a, int sm_count, cudaStream_t stream,
                                   const char **routine) {
    if (a->add) return cti::add_backward(a, sm_count, stream, routine);
    switch (a->dt) {
    case CT_F16: return cti::backward<CT_F16>(a, sm_count, stream, routine);
    case CT_BF16: return cti::backward<CT_BF16>(a, sm_count, stream, routine);
    case CT_F32: return cti::backward<CT_F32>(a, sm_count, stream, routine);
    case CT_F64: return cti::backward<CT_F64>(a, sm_count, stream, routine);
    default: return cudaErrorInvalidValue;
    }
}

} // extern "C"
