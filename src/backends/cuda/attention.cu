// Scaled dot-product attention, forward and backward, as flash-attention
// tiles: the [T, S] score matrix is never stored. The math is schema.h's
// (cti_attention_params); it runs in float for f16/bf16/f32 and in double for
// f64, and every element is read through the tensors' strides.
//
// Tiles are 32 query rows by 32 keys, blocks of 128 threads, 4 threads a row:
// thread (r, c4) of a query tile owns score columns c4 + 4k (k < 8) and
// output columns c4 + 4k (k < 32, head dims up to 128), so a row's softmax
// statistics are reduced by two xor shuffles among its 4 threads, which all
// end with the same bits. Tiles of q, k, v and grad_out sit in shared memory
// decoded to the accumulation type, with an odd row pitch (no bank
// conflicts between rows); rows past T or S read as zeros and their scores
// as -inf.
//
//  forward:  one block per (b, h, query tile); K/V tiles stream through
//            shared memory with the online softmax (running max m, sum l,
//            rescaled accumulator); with is_causal the tiles wholly above
//            the diagonal (j0 > i for every row) are never visited.
//  backward: FlashAttention-2's, without atomics so the gradients repeat
//            bit for bit: a pre-pass gives Delta_i = rowsum(dO_i * O_i);
//            a block per (b, kv head, key tile) recomputes P = exp(s - lse)
//            for every query tile of every query head of its group and sums
//            dV += P^T dO, dK += dS^T Q (dS = P (dP - Delta), dP = dO V^T);
//            a block per (b, h, query tile) recomputes the same and sums
//            dQ += dS K. The extra recomputation is the price of no atomics.
//
// For f16 and bf16 the same three kernels also exist on tensor cores
// (mma.sync m16n8k16 with f32 accumulation, 64-row tiles; below), the
// default; CT_CUDA_SDPA_MMA=0 runs the scalar ones (attention.c).
//
// Dropout multiplies p_ij by keep_ij / (1 - p) after the softmax, keep_ij
// from the Philox draw schema.h names (the same words as the CPU's
// cti_philox_block), regenerated in the backward. A row with no finite
// score has l = 0: out 0, lse -inf, and p = 0 in the backward.
#include <math.h>

#include "attention_impl.h"
#include "kernels.cuh"

namespace cti {
namespace {

constexpr int kTile = 32;                          // query rows and keys a tile
constexpr int kThr = 128;                          // threads a block, 4 a row
constexpr int kCols = CTI_CUDA_ATTN_MAX_HEAD / 4;  // head columns a thread
constexpr int kPitchP = kTile + 1;                 // row pitch of P and dS tiles

template <int DT> struct Acc { typedef float A; };
template <> struct Acc<CT_F64> { typedef double A; };

__device__ __forceinline__ float ex(float x) { return expf(x); }
__device__ __forceinline__ double ex(double x) { return exp(x); }
__device__ __forceinline__ float ln(float x) { return logf(x); }
__device__ __forceinline__ double ln(double x) { return log(x); }
__device__ __forceinline__ float mx(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double mx(double a, double b) { return fmax(a, b); }

template <class A> __device__ __forceinline__ A ninf() { return (A)(-INFINITY); }

// Odd row pitch of a tile of width w (w == 0 still gives a valid pitch).
__host__ __device__ __forceinline__ int pitch(int64_t w) { return (int)(w | 1); }

// Philox-4x32-10, word for word src/core/rng.c's cti_philox_block.
__device__ __forceinline__ void philox(uint64_t seed, uint64_t block, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

// The dropout factor of (b, h, i, j): keep / (1 - p), keep_ij the f32
// uniform of draw offset + ((b * Hq + h) * T + i) * S + j being >= p. rp is
// 1 / (1 - p) (0 for p == 1). 1 without dropout.
template <class A>
__device__ __forceinline__ A drop_factor(const cti_cuda_attn &a, int64_t b, int64_t h, int64_t i,
                                         int64_t j, A rp) {
    if (!(a.p.dropout_p > 0)) return (A)1;
    const uint64_t seed = a.philox ? a.philox[0] : a.p.seed; // a CUDA graph's replay draws
    const uint64_t first = a.philox ? a.philox[1] + a.p.offset : a.p.offset;
    uint64_t draw = first + (uint64_t)(((b * a.p.Hq + h) * a.p.T + i) * a.p.S + j);
    uint32_t w[4];
    philox(seed, draw >> 2, w);
    unsigned q = (unsigned)(draw & 3);
    uint32_t word = q == 0 ? w[0] : q == 1 ? w[1] : q == 2 ? w[2] : w[3];
    return (double)(word >> 8) * 0x1p-24 >= a.p.dropout_p ? rp : (A)0;
}

// The score of query row i and key j from dot = q_i . k_j: scale * dot plus
// the mask, -inf where masked (bool false, causal j > i) or out of range.
template <int DT, class A>
__device__ __forceinline__ A score(const cti_cuda_attn &a, A dot, int64_t b, int64_t h, int64_t i,
                                   int64_t j) {
    if (i >= a.p.T || j >= a.p.S || (a.p.is_causal && j > i)) return ninf<A>();
    A s = (A)a.p.scale * dot;
    if (a.p.mask_kind != CTI_ATTN_MASK_NONE) {
        int64_t off = b * a.smask[0] + h * a.smask[1] + i * a.smask[2] + j * a.smask[3];
        if (a.p.mask_kind == CTI_ATTN_MASK_BOOL) {
            if (!((const uint8_t *)a.mask)[off]) return ninf<A>();
        } else {
            s += (A)dtype<DT>::dec(((const typename dtype<DT>::T *)a.mask)[off]);
        }
    }
    return s;
}

// p_ij = exp(s - lse), 0 where s or lse is -inf (masked, or a row with no
// finite score).
template <class A> __device__ __forceinline__ A prob(A s, A lse) {
    return (s == ninf<A>() || lse == ninf<A>()) ? (A)0 : ex(s - lse);
}

// dst[r * ld + d] = row r0 + r of base (rows of width w, strides srow, scol)
// for r < kTile, zeros past nrows. Every thread of the block takes part.
template <int DT, class A>
__device__ __forceinline__ void load_tile(A *dst, int ld, const typename dtype<DT>::T *base,
                                          int64_t srow, int64_t scol, int64_t r0, int64_t nrows,
                                          int w) {
    for (int e = threadIdx.x; e < kTile * w; e += kThr) {
        int r = e / w, d = e - r * w;
        int64_t row = r0 + r;
        dst[r * ld + d] = row < nrows ? (A)dtype<DT>::dec(base[row * srow + d * scol]) : (A)0;
    }
}

// Sum of v over the 4 threads of a row (lanes 4n .. 4n + 3); every one of
// them gets the same bits.
template <class A> __device__ __forceinline__ A row_sum(A v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}
template <class A> __device__ __forceinline__ A row_max(A v) {
    v = mx(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = mx(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return v;
}

// ---- forward ----------------------------------------------------------------------------
template <class A> size_t fwd_smem(const cti_cuda_attn &a) {
    return sizeof(A) * ((size_t)kTile * (2 * pitch(a.p.D) + pitch(a.p.Dv)) + kTile * kPitchP);
}

template <int DT>
__global__ void __launch_bounds__(kThr) attn_fwd(const cti_cuda_attn a, int64_t tiles) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    extern __shared__ __align__(16) unsigned char smem[];
    const int D = (int)a.p.D, Dv = (int)a.p.Dv, ldk = pitch(D), ldv = pitch(Dv);
    A *sQ = (A *)smem, *sK = sQ + kTile * ldk, *sV = sK + kTile * ldk, *sP = sV + kTile * ldv;

    const int64_t tile = (int64_t)blockIdx.x % tiles, bh = (int64_t)blockIdx.x / tiles;
    const int64_t b = bh / a.p.Hq, h = bh % a.p.Hq, hk = h / (a.p.Hq / a.p.Hkv);
    const int64_t i0 = tile * kTile;
    const T *q = (const T *)a.q + b * a.sq[0] + h * a.sq[1];
    const T *k = (const T *)a.k + b * a.sk[0] + hk * a.sk[1];
    const T *v = (const T *)a.v + b * a.sv[0] + hk * a.sv[1];
    load_tile<DT, A>(sQ, ldk, q, a.sq[2], a.sq[3], i0, a.p.T, D);

    const int r = threadIdx.x >> 2, c4 = threadIdx.x & 3;
    const int64_t i = i0 + r;
    const A rp = (A)(a.p.dropout_p < 1 ? 1.0 / (1.0 - a.p.dropout_p) : 0.0);
    A acc[kCols];
#pragma unroll
    for (int n = 0; n < kCols; n++) acc[n] = 0;
    A m = ninf<A>(), l = 0;

    const int64_t jend = a.p.is_causal ? min(a.p.S, i0 + kTile) : a.p.S;
    for (int64_t j0 = 0; j0 < jend; j0 += kTile) {
        __syncthreads(); // the previous tile's readers are done
        load_tile<DT, A>(sK, ldk, k, a.sk[2], a.sk[3], j0, a.p.S, D);
        load_tile<DT, A>(sV, ldv, v, a.sv[2], a.sv[3], j0, a.p.S, Dv);
        __syncthreads();

        A s[8];
#pragma unroll
        for (int n = 0; n < 8; n++) s[n] = 0;
        for (int d = 0; d < D; d++) {
            A qd = sQ[r * ldk + d];
#pragma unroll
            for (int n = 0; n < 8; n++) s[n] += qd * sK[(c4 + 4 * n) * ldk + d];
        }
        A tmax = ninf<A>();
#pragma unroll
        for (int n = 0; n < 8; n++) {
            s[n] = score<DT, A>(a, s[n], b, h, i, j0 + c4 + 4 * n);
            tmax = mx(tmax, s[n]);
        }
        const A mnew = mx(m, row_max(tmax));
        // m == -inf: nothing accumulated yet (acc and l are 0)
        const A alpha = m == ninf<A>() ? (A)0 : ex(m - mnew);
        A psum = 0;
#pragma unroll
        for (int n = 0; n < 8; n++) {
            A pe = s[n] == ninf<A>() ? (A)0 : ex(s[n] - mnew);
            psum += pe;
            A f = pe != 0 ? drop_factor(a, b, h, i, j0 + c4 + 4 * n, rp) : (A)1;
            sP[r * kPitchP + c4 + 4 * n] = pe * f;
        }
        l = l * alpha + row_sum(psum);
        m = mnew;
#pragma unroll
        for (int n = 0; n < kCols; n++) acc[n] *= alpha;
        __syncthreads(); // sP complete

        for (int c = 0; c < kTile; c++) {
            A pc = sP[r * kPitchP + c];
#pragma unroll
            for (int n = 0; n < kCols; n++) {
                int d = c4 + 4 * n;
                if (d < Dv) acc[n] += pc * sV[c * ldv + d];
            }
        }
    }

    if (i < a.p.T) {
        T *out = (T *)a.out + b * a.sout[0] + h * a.sout[1] + i * a.sout[2];
#pragma unroll
        for (int n = 0; n < kCols; n++) {
            int d = c4 + 4 * n;
            if (d < Dv) out[d * a.sout[3]] = dtype<DT>::enc(l > 0 ? acc[n] / l : (A)0);
        }
        if (c4 == 0) {
            A *lse = (A *)a.lse_out;
            lse[b * a.slse_out[0] + h * a.slse_out[1] + i * a.slse_out[2]] =
                l > 0 ? m + ln(l) : ninf<A>();
        }
    }
}

// ---- forward on tensor cores (f16, bf16) ---------------------------------------------------
// The same online softmax with both products on mma.sync.m16n8k16 (f32
// accumulation): blocks of 4 warps own 64 query rows, 16 a warp, and stream
// tiles of 64 keys. Tiles sit in shared memory as the io dtype, head dims
// zero-padded to a multiple of 16, with a row pitch 8 elements longer (rows
// land 4 banks apart, so the fragment loads below are conflict-free). A
// thread of a warp holds, per the PTX fragment layouts (g = lane / 4,
// t = lane % 4): score and output columns 2t, 2t + 1 of each 8-wide tile for
// rows g and g + 8 of its warp's 16. P is rounded to the io dtype for the
// second product (as FlashAttention does); the row sums l use it unrounded.
// Masks, causal, dropout and bounds go through score() and drop_factor()
// element by element, as in attn_fwd.
constexpr int kMmaRows = 64, kMmaKeys = 64, kMmaThr = 128;
static_assert(kMmaThr == kThr, "launch() starts every kernel with kThr threads");

__host__ __device__ __forceinline__ int pad16(int64_t w) { return (int)((w + 15) / 16 * 16); }

template <class A> size_t fwd_mma_smem(const cti_cuda_attn &a) {
    return sizeof(uint16_t) * (size_t)((kMmaRows + kMmaKeys) * (pad16(a.p.D) + 8) +
                                       kMmaKeys * (pad16(a.p.Dv) + 8));
}

template <int DT>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    if constexpr (DT == CT_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two values as one register of the io dtype, the first in the low half.
template <int DT> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    return (uint32_t)dtype<DT>::enc(lo) | ((uint32_t)dtype<DT>::enc(hi) << 16);
}

// Elements (r, c) and (r, c + 1) of a tile of pitch ld (c even).
__device__ __forceinline__ uint32_t ld2(const uint16_t *s, int ld, int r, int c) {
    return *reinterpret_cast<const uint32_t *>(s + r * ld + c);
}

// dst[r * ld + d] = element (r0 + r, d) of base, raw, for r < rows and
// d < wp; zeros past nrows and past width w.
__device__ __forceinline__ void load_raw_tile(uint16_t *dst, int ld, const uint16_t *base,
                                              int64_t srow, int64_t scol, int64_t r0,
                                              int64_t nrows, int w, int wp, int rows) {
    for (int e = threadIdx.x; e < rows * wp; e += kMmaThr) {
        int r = e / wp, d = e - r * wp;
        int64_t row = r0 + r;
        dst[r * ld + d] = row < nrows && d < w ? base[row * srow + d * scol] : (uint16_t)0;
    }
}

template <int DT, int NT>
__global__ void __launch_bounds__(kMmaThr) attn_fwd_mma(const cti_cuda_attn a, int64_t tiles) {
    static_assert(DT == CT_F16 || DT == CT_BF16, "tensor-core path: f16 and bf16");
    static_assert(NT == 8 || NT == 16, "head dims up to 8 NT");
    extern __shared__ __align__(16) unsigned char smem[];
    const int D = (int)a.p.D, Dv = (int)a.p.Dv, Dp = pad16(D), Dvp = pad16(Dv);
    const int ldk = Dp + 8, ldv = Dvp + 8;
    uint16_t *sQ = (uint16_t *)smem, *sK = sQ + kMmaRows * ldk, *sV = sK + kMmaKeys * ldk;

    const int64_t tile = (int64_t)blockIdx.x % tiles, bh = (int64_t)blockIdx.x / tiles;
    const int64_t b = bh / a.p.Hq, h = bh % a.p.Hq, hk = h / (a.p.Hq / a.p.Hkv);
    const int64_t i0 = tile * kMmaRows;
    const uint16_t *q = (const uint16_t *)a.q + b * a.sq[0] + h * a.sq[1];
    const uint16_t *k = (const uint16_t *)a.k + b * a.sk[0] + hk * a.sk[1];
    const uint16_t *v = (const uint16_t *)a.v + b * a.sv[0] + hk * a.sv[1];
    load_raw_tile(sQ, ldk, q, a.sq[2], a.sq[3], i0, a.p.T, D, Dp, kMmaRows);
    __syncthreads();

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = warp * 16;
    const int64_t ia = i0 + r0 + g, ib = ia + 8; // the thread's two rows
    const int nk = Dp / 16, nv = Dvp / 8;
    uint32_t qa[NT / 2][4];
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++)
        if (kk < nk) {
            qa[kk][0] = ld2(sQ, ldk, r0 + g, kk * 16 + 2 * t);
            qa[kk][1] = ld2(sQ, ldk, r0 + g + 8, kk * 16 + 2 * t);
            qa[kk][2] = ld2(sQ, ldk, r0 + g, kk * 16 + 2 * t + 8);
            qa[kk][3] = ld2(sQ, ldk, r0 + g + 8, kk * 16 + 2 * t + 8);
        }
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float ma = ninf<float>(), mb = ninf<float>(), la = 0.f, lb = 0.f;
    const float rp = (float)(a.p.dropout_p < 1 ? 1.0 / (1.0 - a.p.dropout_p) : 0.0);

    const int64_t jend = a.p.is_causal ? min(a.p.S, i0 + kMmaRows) : a.p.S;
    for (int64_t j0 = 0; j0 < jend; j0 += kMmaKeys) {
        __syncthreads(); // the previous tile's readers are done
        load_raw_tile(sK, ldk, k, a.sk[2], a.sk[3], j0, a.p.S, D, Dp, kMmaKeys);
        load_raw_tile(sV, ldv, v, a.sv[2], a.sv[3], j0, a.p.S, Dv, Dvp, kMmaKeys);
        __syncthreads();

        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < NT / 2; kk++)
                if (kk < nk)
                    mma16816<DT>(s[n], qa[kk], ld2(sK, ldk, n * 8 + g, kk * 16 + 2 * t),
                                 ld2(sK, ldk, n * 8 + g, kk * 16 + 2 * t + 8));
        }
        float xa = ninf<float>(), xb = ninf<float>();
#pragma unroll
        for (int n = 0; n < 8; n++) {
            const int64_t j = j0 + n * 8 + 2 * t;
            s[n][0] = score<DT, float>(a, s[n][0], b, h, ia, j);
            s[n][1] = score<DT, float>(a, s[n][1], b, h, ia, j + 1);
            s[n][2] = score<DT, float>(a, s[n][2], b, h, ib, j);
            s[n][3] = score<DT, float>(a, s[n][3], b, h, ib, j + 1);
            xa = fmaxf(xa, fmaxf(s[n][0], s[n][1]));
            xb = fmaxf(xb, fmaxf(s[n][2], s[n][3]));
        }
        const float na = fmaxf(ma, row_max(xa)), nb = fmaxf(mb, row_max(xb));
        const float aa = ma == ninf<float>() ? 0.f : expf(ma - na);
        const float ab = mb == ninf<float>() ? 0.f : expf(mb - nb);
        float pa = 0.f, pb = 0.f;
#pragma unroll
        for (int n = 0; n < 8; n++) {
            const int64_t j = j0 + n * 8 + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const bool top = e < 2;
                const float m = top ? na : nb;
                float p = s[n][e] == ninf<float>() ? 0.f : expf(s[n][e] - m);
                if (top) pa += p;
                else pb += p;
                if (p != 0.f) p *= drop_factor(a, b, h, top ? ia : ib, j + (e & 1), rp);
                s[n][e] = p;
            }
        }
        la = la * aa + row_sum(pa);
        lb = lb * ab + row_sum(pb);
        ma = na;
        mb = nb;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            o[n][0] *= aa;
            o[n][1] *= aa;
            o[n][2] *= ab;
            o[n][3] *= ab;
        }
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            const uint32_t pf[4] = {pack2<DT>(s[2 * ks][0], s[2 * ks][1]),
                                    pack2<DT>(s[2 * ks][2], s[2 * ks][3]),
                                    pack2<DT>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                    pack2<DT>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
            const int kr = ks * 16 + 2 * t;
#pragma unroll
            for (int n = 0; n < NT; n++)
                if (n < nv) {
                    const int c = n * 8 + g;
                    uint32_t b0 = (uint32_t)sV[kr * ldv + c] | ((uint32_t)sV[(kr + 1) * ldv + c] << 16);
                    uint32_t b1 = (uint32_t)sV[(kr + 8) * ldv + c] |
                                  ((uint32_t)sV[(kr + 9) * ldv + c] << 16);
                    mma16816<DT>(o[n], pf, b0, b1);
                }
        }
    }

    typedef typename dtype<DT>::T T;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t i = half ? ib : ia;
        const float l = half ? lb : la, m = half ? mb : ma;
        if (i >= a.p.T) continue;
        T *out = (T *)a.out + b * a.sout[0] + h * a.sout[1] + i * a.sout[2];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = n * 8 + 2 * t + e;
                if (n < nv && d < Dv)
                    out[d * a.sout[3]] = dtype<DT>::enc(l > 0 ? o[n][2 * half + e] / l : 0.f);
            }
        if (t == 0)
            ((float *)a.lse_out)[b * a.slse_out[0] + h * a.slse_out[1] + i * a.slse_out[2]] =
                l > 0 ? m + logf(l) : ninf<float>();
    }
}

// ---- backward on tensor cores (f16, bf16) ---------------------------------------------------
// attn_bwd_kv and attn_bwd_q with every product on mma.sync.m16n8k16, in the
// forward's tile layout (64-row tiles, 4 warps of 16 rows, pitch + 8). P and
// dS are rounded to the io dtype before the products they feed (as
// FlashAttention does). In the key-tile kernel a warp owns 16 keys and forms
// S^T = K Q^T and dP^T = V dO^T, so its score fragments are already the A
// operands of dV += P^T dO and dK += dS^T Q; in the query-tile kernel a warp
// owns 16 query rows as in the forward.
template <class A> size_t kv_mma_smem(const cti_cuda_attn &a) {
    return sizeof(uint16_t) * (size_t)(2 * 64 * (pad16(a.p.D) + 8) + 2 * 64 * (pad16(a.p.Dv) + 8)) +
           2 * 64 * sizeof(float);
}

template <class A> size_t q_mma_smem(const cti_cuda_attn &a) {
    return sizeof(uint16_t) * (size_t)(2 * 64 * (pad16(a.p.D) + 8) + 2 * 64 * (pad16(a.p.Dv) + 8));
}

// The A fragment of rows r0 .. r0 + 15, columns c0 .. c0 + 15 of a tile.
__device__ __forceinline__ void ld_afrag(uint32_t (&f)[4], const uint16_t *s, int ld, int r0,
                                         int c0, int g, int t) {
    f[0] = ld2(s, ld, r0 + g, c0 + 2 * t);
    f[1] = ld2(s, ld, r0 + g + 8, c0 + 2 * t);
    f[2] = ld2(s, ld, r0 + g, c0 + 2 * t + 8);
    f[3] = ld2(s, ld, r0 + g + 8, c0 + 2 * t + 8);
}

// The B fragment of rows k0 .. k0 + 15 (the reduced dim) and column c of a
// row-major tile: two elements of consecutive rows a register.
__device__ __forceinline__ void ld_bcol(uint32_t &b0, uint32_t &b1, const uint16_t *s, int ld,
                                        int k0, int c, int t) {
    const int k = k0 + 2 * t;
    b0 = (uint32_t)s[k * ld + c] | ((uint32_t)s[(k + 1) * ld + c] << 16);
    b1 = (uint32_t)s[(k + 8) * ld + c] | ((uint32_t)s[(k + 9) * ld + c] << 16);
}

// The A fragment of columns 16 ks .. 16 ks + 15 of an [16 x 64] score tile
// held as C fragments (x[n]: columns 8n .. 8n + 7), rounded to the io dtype.
template <int DT>
__device__ __forceinline__ void pack_afrag(uint32_t (&f)[4], const float (&x)[8][4], int ks) {
    f[0] = pack2<DT>(x[2 * ks][0], x[2 * ks][1]);
    f[1] = pack2<DT>(x[2 * ks][2], x[2 * ks][3]);
    f[2] = pack2<DT>(x[2 * ks + 1][0], x[2 * ks + 1][1]);
    f[3] = pack2<DT>(x[2 * ks + 1][2], x[2 * ks + 1][3]);
}

template <int DT, int NT>
__global__ void __launch_bounds__(kMmaThr) attn_bwd_kv_mma(const cti_cuda_attn a, int64_t tiles) {
    typedef typename dtype<DT>::T T;
    extern __shared__ __align__(16) unsigned char smem[];
    const int D = (int)a.p.D, Dv = (int)a.p.Dv, Dp = pad16(D), Dvp = pad16(Dv);
    const int ldk = Dp + 8, ldv = Dvp + 8;
    uint16_t *sK = (uint16_t *)smem, *sQ = sK + 64 * ldk, *sV = sQ + 64 * ldk, *sO = sV + 64 * ldv;
    float *sL = (float *)(sO + 64 * ldv), *sD = sL + 64;

    const int64_t tile = (int64_t)blockIdx.x % tiles, bh = (int64_t)blockIdx.x / tiles;
    const int64_t G = a.p.Hq / a.p.Hkv, b = bh / a.p.Hkv, hk = bh % a.p.Hkv;
    const int64_t j0 = tile * 64;
    load_raw_tile(sK, ldk, (const uint16_t *)a.k + b * a.sk[0] + hk * a.sk[1], a.sk[2], a.sk[3],
                  j0, a.p.S, D, Dp, 64);
    load_raw_tile(sV, ldv, (const uint16_t *)a.v + b * a.sv[0] + hk * a.sv[1], a.sv[2], a.sv[3],
                  j0, a.p.S, Dv, Dvp, 64);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int kw = warp * 16; // the warp's keys in the tile
    const int nk = Dp / 16, nkv = Dvp / 16, ndk = Dp / 8, ndv = Dvp / 8;
    const float rp = (float)(a.p.dropout_p < 1 ? 1.0 / (1.0 - a.p.dropout_p) : 0.0);
    float dk[NT][4], dv[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.f;

    const int64_t ibeg = a.p.is_causal ? j0 : 0; // rows i < j0 see none of the tile's keys
    for (int64_t gi = 0; gi < G; gi++) {
        const int64_t h = hk * G + gi;
        const uint16_t *q = (const uint16_t *)a.q + b * a.sq[0] + h * a.sq[1];
        const uint16_t *go = (const uint16_t *)a.go + b * a.sgo[0] + h * a.sgo[1];
        const float *lse = (const float *)a.lse + b * a.slse[0] + h * a.slse[1];
        const float *delta = (const float *)a.delta + (b * a.p.Hq + h) * a.p.T;
        for (int64_t i0 = ibeg; i0 < a.p.T; i0 += 64) {
            __syncthreads(); // the previous tile's readers are done
            load_raw_tile(sQ, ldk, q, a.sq[2], a.sq[3], i0, a.p.T, D, Dp, 64);
            load_raw_tile(sO, ldv, go, a.sgo[2], a.sgo[3], i0, a.p.T, Dv, Dvp, 64);
            for (int e = threadIdx.x; e < 64; e += kMmaThr) {
                const bool in = i0 + e < a.p.T;
                sL[e] = in ? lse[(i0 + e) * a.slse[2]] : ninf<float>();
                sD[e] = in ? delta[i0 + e] : 0.f;
            }
            __syncthreads();

            float st[8][4], dpt[8][4]; // [key][query] tiles: rows kw + g (+8), query columns
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[n][e] = dpt[n][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < NT / 2; kk++)
                if (kk < nk) {
                    uint32_t af[4];
                    ld_afrag(af, sK, ldk, kw, kk * 16, g, t);
#pragma unroll
                    for (int n = 0; n < 8; n++)
                        mma16816<DT>(st[n], af, ld2(sQ, ldk, n * 8 + g, kk * 16 + 2 * t),
                                     ld2(sQ, ldk, n * 8 + g, kk * 16 + 2 * t + 8));
                }
#pragma unroll
            for (int kk = 0; kk < NT / 2; kk++)
                if (kk < nkv) {
                    uint32_t af[4];
                    ld_afrag(af, sV, ldv, kw, kk * 16, g, t);
#pragma unroll
                    for (int n = 0; n < 8; n++)
                        mma16816<DT>(dpt[n], af, ld2(sO, ldv, n * 8 + g, kk * 16 + 2 * t),
                                     ld2(sO, ldv, n * 8 + g, kk * 16 + 2 * t + 8));
                }
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qc = n * 8 + 2 * t + (e & 1);
                    const int64_t i = i0 + qc, j = j0 + kw + g + (e >= 2 ? 8 : 0);
                    const float p = prob(score<DT, float>(a, st[n][e], b, h, i, j), sL[qc]);
                    const float f = p != 0.f ? drop_factor(a, b, h, i, j, rp) : 1.f;
                    st[n][e] = p * f;
                    dpt[n][e] = p * (dpt[n][e] * f - sD[qc]);
                }
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint32_t pf[4], sf[4];
                pack_afrag<DT>(pf, st, ks);
                pack_afrag<DT>(sf, dpt, ks);
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    uint32_t b0, b1;
                    if (n < ndv) {
                        ld_bcol(b0, b1, sO, ldv, ks * 16, n * 8 + g, t);
                        mma16816<DT>(dv[n], pf, b0, b1);
                    }
                    if (n < ndk) {
                        ld_bcol(b0, b1, sQ, ldk, ks * 16, n * 8 + g, t);
                        mma16816<DT>(dk[n], sf, b0, b1);
                    }
                }
            }
        }
    }

    const float sc = (float)a.p.scale;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t j = j0 + kw + g + 8 * half;
        if (j >= a.p.S) continue;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = n * 8 + 2 * t + e;
                if (a.dk && n < ndk && d < D)
                    ((T *)a.dk)[b * a.sdk[0] + hk * a.sdk[1] + j * a.sdk[2] + d * a.sdk[3]] =
                        dtype<DT>::enc(dk[n][2 * half + e] * sc);
                if (a.dv && n < ndv && d < Dv)
                    ((T *)a.dv)[b * a.sdv[0] + hk * a.sdv[1] + j * a.sdv[2] + d * a.sdv[3]] =
                        dtype<DT>::enc(dv[n][2 * half + e]);
            }
    }
}

template <int DT, int NT>
__global__ void __launch_bounds__(kMmaThr) attn_bwd_q_mma(const cti_cuda_attn a, int64_t tiles) {
    typedef typename dtype<DT>::T T;
    extern __shared__ __align__(16) unsigned char smem[];
    const int D = (int)a.p.D, Dv = (int)a.p.Dv, Dp = pad16(D), Dvp = pad16(Dv);
    const int ldk = Dp + 8, ldv = Dvp + 8;
    uint16_t *sQ = (uint16_t *)smem, *sK = sQ + 64 * ldk, *sO = sK + 64 * ldk, *sV = sO + 64 * ldv;

    const int64_t tile = (int64_t)blockIdx.x % tiles, bh = (int64_t)blockIdx.x / tiles;
    const int64_t b = bh / a.p.Hq, h = bh % a.p.Hq, hk = h / (a.p.Hq / a.p.Hkv);
    const int64_t i0 = tile * 64;
    load_raw_tile(sQ, ldk, (const uint16_t *)a.q + b * a.sq[0] + h * a.sq[1], a.sq[2], a.sq[3],
                  i0, a.p.T, D, Dp, 64);
    load_raw_tile(sO, ldv, (const uint16_t *)a.go + b * a.sgo[0] + h * a.sgo[1], a.sgo[2],
                  a.sgo[3], i0, a.p.T, Dv, Dvp, 64);
    const uint16_t *k = (const uint16_t *)a.k + b * a.sk[0] + hk * a.sk[1];
    const uint16_t *v = (const uint16_t *)a.v + b * a.sv[0] + hk * a.sv[1];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = warp * 16;
    const int64_t ia = i0 + r0 + g, ib = ia + 8;
    const int nk = Dp / 16, nkv = Dvp / 16, ndk = Dp / 8;
    const float *lse = (const float *)a.lse + b * a.slse[0] + h * a.slse[1];
    const float *delta = (const float *)a.delta + (b * a.p.Hq + h) * a.p.T;
    const float La = ia < a.p.T ? lse[ia * a.slse[2]] : ninf<float>();
    const float Lb = ib < a.p.T ? lse[ib * a.slse[2]] : ninf<float>();
    const float Da = ia < a.p.T ? delta[ia] : 0.f, Db = ib < a.p.T ? delta[ib] : 0.f;
    const float rp = (float)(a.p.dropout_p < 1 ? 1.0 / (1.0 - a.p.dropout_p) : 0.0);
    float dq[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;

    const int64_t jend = a.p.is_causal ? min(a.p.S, i0 + 64) : a.p.S;
    for (int64_t j0 = 0; j0 < jend; j0 += 64) {
        __syncthreads(); // the previous tile's readers are done (and sQ, sO written)
        load_raw_tile(sK, ldk, k, a.sk[2], a.sk[3], j0, a.p.S, D, Dp, 64);
        load_raw_tile(sV, ldv, v, a.sv[2], a.sv[3], j0, a.p.S, Dv, Dvp, 64);
        __syncthreads();

        float s[8][4], dp[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < NT / 2; kk++)
            if (kk < nk) {
                uint32_t af[4];
                ld_afrag(af, sQ, ldk, r0, kk * 16, g, t);
#pragma unroll
                for (int n = 0; n < 8; n++)
                    mma16816<DT>(s[n], af, ld2(sK, ldk, n * 8 + g, kk * 16 + 2 * t),
                                 ld2(sK, ldk, n * 8 + g, kk * 16 + 2 * t + 8));
            }
#pragma unroll
        for (int kk = 0; kk < NT / 2; kk++)
            if (kk < nkv) {
                uint32_t af[4];
                ld_afrag(af, sO, ldv, r0, kk * 16, g, t);
#pragma unroll
                for (int n = 0; n < 8; n++)
                    mma16816<DT>(dp[n], af, ld2(sV, ldv, n * 8 + g, kk * 16 + 2 * t),
                                 ld2(sV, ldv, n * 8 + g, kk * 16 + 2 * t + 8));
            }
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const bool top = e < 2;
                const int64_t i = top ? ia : ib, j = j0 + n * 8 + 2 * t + (e & 1);
                const float p = prob(score<DT, float>(a, s[n][e], b, h, i, j), top ? La : Lb);
                const float f = p != 0.f ? drop_factor(a, b, h, i, j, rp) : 1.f;
                s[n][e] = p * (dp[n][e] * f - (top ? Da : Db));
            }
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            uint32_t sf[4];
            pack_afrag<DT>(sf, s, ks);
#pragma unroll
            for (int n = 0; n < NT; n++)
                if (n < ndk) {
                    uint32_t b0, b1;
                    ld_bcol(b0, b1, sK, ldk, ks * 16, n * 8 + g, t);
                    mma16816<DT>(dq[n], sf, b0, b1);
                }
        }
    }

    const float sc = (float)a.p.scale;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t i = half ? ib : ia;
        if (i >= a.p.T) continue;
        T *dqp = (T *)a.dq + b * a.sdq[0] + h * a.sdq[1] + i * a.sdq[2];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = n * 8 + 2 * t + e;
                if (n < ndk && d < D) dqp[d * a.sdq[3]] = dtype<DT>::enc(dq[n][2 * half + e] * sc);
            }
    }
}

// ---- backward: Delta_i = sum_d dO_id * O_id, one warp a row ---------------------------------
template <int DT>
__global__ void __launch_bounds__(kThr) attn_delta(const cti_cuda_attn a, int64_t rows) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    const int64_t row = (int64_t)blockIdx.x * (kThr / 32) + (threadIdx.x >> 5);
    if (row >= rows) return; // whole warps leave together
    const int lane = threadIdx.x & 31;
    const int64_t i = row % a.p.T, bh = row / a.p.T, b = bh / a.p.Hq, h = bh % a.p.Hq;
    const T *go = (const T *)a.go + b * a.sgo[0] + h * a.sgo[1] + i * a.sgo[2];
    const T *o = (const T *)a.o + b * a.so[0] + h * a.so[1] + i * a.so[2];
    A sum = 0;
    for (int64_t d = lane; d < a.p.Dv; d += 32)
        sum += (A)dtype<DT>::dec(go[d * a.sgo[3]]) * (A)dtype<DT>::dec(o[d * a.so[3]]);
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, w);
    if (lane == 0) ((A *)a.delta)[row] = sum;
}

// ---- backward: dK and dV, a block per (b, kv head, key tile) --------------------------------
template <class A> size_t kv_smem(const cti_cuda_attn &a) {
    return sizeof(A) * ((size_t)kTile * (2 * pitch(a.p.D) + 2 * pitch(a.p.Dv)) +
                        2 * kTile * kPitchP + 2 * kTile);
}

template <int DT>
__global__ void __launch_bounds__(kThr) attn_bwd_kv(const cti_cuda_attn a, int64_t tiles) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    extern __shared__ __align__(16) unsigned char smem[];
    const int D = (int)a.p.D, Dv = (int)a.p.Dv, ldk = pitch(D), ldv = pitch(Dv);
    A *sK = (A *)smem, *sQ = sK + kTile * ldk, *sV = sQ + kTile * ldk, *sO = sV + kTile * ldv;
    A *sP = sO + kTile * ldv, *sS = sP + kTile * kPitchP, *sL = sS + kTile * kPitchP;
    A *sD = sL + kTile;

    const int64_t tile = (int64_t)blockIdx.x % tiles, bh = (int64_t)blockIdx.x / tiles;
    const int64_t G = a.p.Hq / a.p.Hkv, b = bh / a.p.Hkv, hk = bh % a.p.Hkv;
    const int64_t j0 = tile * kTile;
    load_tile<DT, A>(sK, ldk, (const T *)a.k + b * a.sk[0] + hk * a.sk[1], a.sk[2], a.sk[3], j0,
                     a.p.S, D);
    load_tile<DT, A>(sV, ldv, (const T *)a.v + b * a.sv[0] + hk * a.sv[1], a.sv[2], a.sv[3], j0,
                     a.p.S, Dv);

    const int c = threadIdx.x >> 2, q4 = threadIdx.x & 3;
    const int64_t j = j0 + c;
    const A rp = (A)(a.p.dropout_p < 1 ? 1.0 / (1.0 - a.p.dropout_p) : 0.0);
    A dk[kCols], dv[kCols];
#pragma unroll
    for (int n = 0; n < kCols; n++) dk[n] = dv[n] = 0;

    // with is_causal, rows i < j0 see none of the tile's keys
    const int64_t ibeg = a.p.is_causal ? j0 : 0;
    for (int64_t g = 0; g < G; g++) {
        const int64_t h = hk * G + g;
        const T *q = (const T *)a.q + b * a.sq[0] + h * a.sq[1];
        const T *go = (const T *)a.go + b * a.sgo[0] + h * a.sgo[1];
        const A *lse = (const A *)a.lse + b * a.slse[0] + h * a.slse[1];
        const A *delta = (const A *)a.delta + (b * a.p.Hq + h) * a.p.T;
        for (int64_t i0 = ibeg; i0 < a.p.T; i0 += kTile) {
            __syncthreads(); // the previous tile's readers are done
            load_tile<DT, A>(sQ, ldk, q, a.sq[2], a.sq[3], i0, a.p.T, D);
            load_tile<DT, A>(sO, ldv, go, a.sgo[2], a.sgo[3], i0, a.p.T, Dv);
            for (int e = threadIdx.x; e < kTile; e += kThr) {
                bool in = i0 + e < a.p.T;
                sL[e] = in ? lse[(i0 + e) * a.slse[2]] : ninf<A>();
                sD[e] = in ? delta[i0 + e] : (A)0;
            }
            __syncthreads();

            A s[8], dp[8];
#pragma unroll
            for (int n = 0; n < 8; n++) s[n] = dp[n] = 0;
            for (int d = 0; d < D; d++) {
                A kd = sK[c * ldk + d];
#pragma unroll
                for (int n = 0; n < 8; n++) s[n] += sQ[(q4 + 4 * n) * ldk + d] * kd;
            }
            for (int d = 0; d < Dv; d++) {
                A vd = sV[c * ldv + d];
#pragma unroll
                for (int n = 0; n < 8; n++) dp[n] += sO[(q4 + 4 * n) * ldv + d] * vd;
            }
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const int r = q4 + 4 * n;
                const int64_t i = i0 + r;
                A p = prob(score<DT, A>(a, s[n], b, h, i, j), sL[r]);
                A f = p != 0 ? drop_factor(a, b, h, i, j, rp) : (A)1;
                sP[c * kPitchP + r] = p * f;
                sS[c * kPitchP + r] = p * (dp[n] * f - sD[r]);
            }
            __syncthreads(); // sP, sS complete

            for (int rr = 0; rr < kTile; rr++) {
                A pc = sP[c * kPitchP + rr], dsc = sS[c * kPitchP + rr];
#pragma unroll
                for (int n = 0; n < kCols; n++) {
                    int d = q4 + 4 * n;
                    if (d < Dv) dv[n] += pc * sO[rr * ldv + d];
                    if (d < D) dk[n] += dsc * sQ[rr * ldk + d];
                }
            }
        }
    }

    if (j < a.p.S) { // a NULL output is a grad the caller did not ask for
        const A sc = (A)a.p.scale;
        if (a.dk) {
            T *dkp = (T *)a.dk + b * a.sdk[0] + hk * a.sdk[1] + j * a.sdk[2];
#pragma unroll
            for (int n = 0; n < kCols; n++) {
                int d = q4 + 4 * n;
                if (d < D) dkp[d * a.sdk[3]] = dtype<DT>::enc(dk[n] * sc);
            }
        }
        if (a.dv) {
            T *dvp = (T *)a.dv + b * a.sdv[0] + hk * a.sdv[1] + j * a.sdv[2];
#pragma unroll
            for (int n = 0; n < kCols; n++) {
                int d = q4 + 4 * n;
                if (d < Dv) dvp[d * a.sdv[3]] = dtype<DT>::enc(dv[n]);
            }
        }
    }
}

// ---- backward: dQ, a block per (b, h, query tile) ------------------------------------------
template <class A> size_t q_smem(const cti_cuda_attn &a) {
    return sizeof(A) * ((size_t)kTile * (2 * pitch(a.p.D) + 2 * pitch(a.p.Dv)) +
                        kTile * kPitchP);
}

template <int DT>
__global__ void __launch_bounds__(kThr) attn_bwd_q(const cti_cuda_attn a, int64_t tiles) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    extern __shared__ __align__(16) unsigned char smem[];
    const int D = (int)a.p.D, Dv = (int)a.p.Dv, ldk = pitch(D), ldv = pitch(Dv);
    A *sQ = (A *)smem, *sK = sQ + kTile * ldk, *sO = sK + kTile * ldk, *sV = sO + kTile * ldv;
    A *sS = sV + kTile * ldv;

    const int64_t tile = (int64_t)blockIdx.x % tiles, bh = (int64_t)blockIdx.x / tiles;
    const int64_t b = bh / a.p.Hq, h = bh % a.p.Hq, hk = h / (a.p.Hq / a.p.Hkv);
    const int64_t i0 = tile * kTile;
    load_tile<DT, A>(sQ, ldk, (const T *)a.q + b * a.sq[0] + h * a.sq[1], a.sq[2], a.sq[3], i0,
                     a.p.T, D);
    load_tile<DT, A>(sO, ldv, (const T *)a.go + b * a.sgo[0] + h * a.sgo[1], a.sgo[2], a.sgo[3],
                     i0, a.p.T, Dv);
    const T *k = (const T *)a.k + b * a.sk[0] + hk * a.sk[1];
    const T *v = (const T *)a.v + b * a.sv[0] + hk * a.sv[1];

    const int r = threadIdx.x >> 2, c4 = threadIdx.x & 3;
    const int64_t i = i0 + r;
    const bool in = i < a.p.T;
    const A L = in ? ((const A *)a.lse)[b * a.slse[0] + h * a.slse[1] + i * a.slse[2]]
                   : ninf<A>();
    const A Dl = in ? ((const A *)a.delta)[(b * a.p.Hq + h) * a.p.T + i] : (A)0;
    const A rp = (A)(a.p.dropout_p < 1 ? 1.0 / (1.0 - a.p.dropout_p) : 0.0);
    A dq[kCols];
#pragma unroll
    for (int n = 0; n < kCols; n++) dq[n] = 0;

    const int64_t jend = a.p.is_causal ? min(a.p.S, i0 + kTile) : a.p.S;
    for (int64_t j0 = 0; j0 < jend; j0 += kTile) {
        __syncthreads(); // the previous tile's readers are done
        load_tile<DT, A>(sK, ldk, k, a.sk[2], a.sk[3], j0, a.p.S, D);
        load_tile<DT, A>(sV, ldv, v, a.sv[2], a.sv[3], j0, a.p.S, Dv);
        __syncthreads();

        A s[8], dp[8];
#pragma unroll
        for (int n = 0; n < 8; n++) s[n] = dp[n] = 0;
        for (int d = 0; d < D; d++) {
            A qd = sQ[r * ldk + d];
#pragma unroll
            for (int n = 0; n < 8; n++) s[n] += qd * sK[(c4 + 4 * n) * ldk + d];
        }
        for (int d = 0; d < Dv; d++) {
            A od = sO[r * ldv + d];
#pragma unroll
            for (int n = 0; n < 8; n++) dp[n] += od * sV[(c4 + 4 * n) * ldv + d];
        }
#pragma unroll
        for (int n = 0; n < 8; n++) {
            const int64_t j = j0 + c4 + 4 * n;
            A p = prob(score<DT, A>(a, s[n], b, h, i, j), L);
            A f = p != 0 ? drop_factor(a, b, h, i, j, rp) : (A)1;
            sS[r * kPitchP + c4 + 4 * n] = p * (dp[n] * f - Dl);
        }
        __syncthreads(); // sS complete

        for (int c = 0; c < kTile; c++) {
            A ds = sS[r * kPitchP + c];
#pragma unroll
            for (int n = 0; n < kCols; n++) {
                int d = c4 + 4 * n;
                if (d < D) dq[n] += ds * sK[c * ldk + d];
            }
        }
    }

    if (in) {
        const A sc = (A)a.p.scale;
        T *dqp = (T *)a.dq + b * a.sdq[0] + h * a.sdq[1] + i * a.sdq[2];
#pragma unroll
        for (int n = 0; n < kCols; n++) {
            int d = c4 + 4 * n;
            if (d < D) dqp[d * a.sdq[3]] = dtype<DT>::enc(dq[n] * sc);
        }
    }
}

// ---- launchers ------------------------------------------------------------------------------
int64_t ceil_tiles(int64_t n) { return (n + kTile - 1) / kTile; }

// The tensor-core kernels' register tiles: head dims up to 64 take the
// narrow instance (8 column tiles of 8), up to 128 the wide one.
bool mma_narrow(const cti_cuda_attn &a) { return pad16(a.p.D) <= 64 && pad16(a.p.Dv) <= 64; }

// Launches kern over blocks (none when 0) with smem bytes of dynamic shared
// memory, raising the kernel's limit past the default 48 KiB when needed.
template <class K>
cudaError_t launch(K kern, int64_t blocks, size_t smem, cudaStream_t st, const cti_cuda_attn &a,
                   int64_t arg) {
    if (blocks <= 0) return cudaSuccess;
    if (smem > 48 * 1024) {
        cudaError_t e =
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    kern<<<(unsigned)blocks, kThr, smem, st>>>(a, arg);
    return cudaGetLastError();
}

template <int DT> cudaError_t forward(const cti_cuda_attn &a, cudaStream_t st) {
    typedef typename Acc<DT>::A A;
    if constexpr (DT == CT_F16 || DT == CT_BF16) {
        if (a.tensor_cores) {
            int64_t tiles = (a.p.T + kMmaRows - 1) / kMmaRows;
            return launch(mma_narrow(a) ? attn_fwd_mma<DT, 8> : attn_fwd_mma<DT, 16>,
                          a.p.B * a.p.Hq * tiles, fwd_mma_smem<A>(a), st, a, tiles);
        }
    }
    int64_t tiles = ceil_tiles(a.p.T);
    return launch(attn_fwd<DT>, a.p.B * a.p.Hq * tiles, fwd_smem<A>(a), st, a, tiles);
}

template <int DT> cudaError_t backward(const cti_cuda_attn &a, cudaStream_t st) {
    typedef typename Acc<DT>::A A;
    int64_t rows = a.p.B * a.p.Hq * a.p.T;
    cudaError_t e = launch(attn_delta<DT>, (rows + kThr / 32 - 1) / (kThr / 32), 0, st, a, rows);
    if (e != cudaSuccess) return e;
    if constexpr (DT == CT_F16 || DT == CT_BF16) {
        if (a.tensor_cores) {
            int64_t kt = (a.p.S + 63) / 64, qt = (a.p.T + 63) / 64;
            if (a.dk || a.dv) {
                e = launch(mma_narrow(a) ? attn_bwd_kv_mma<DT, 8> : attn_bwd_kv_mma<DT, 16>,
                           a.p.B * a.p.Hkv * kt, kv_mma_smem<A>(a), st, a, kt);
                if (e != cudaSuccess) return e;
            }
            if (!a.dq) return cudaSuccess;
            return launch(mma_narrow(a) ? attn_bwd_q_mma<DT, 8> : attn_bwd_q_mma<DT, 16>,
                          a.p.B * a.p.Hq * qt, q_mma_smem<A>(a), st, a, qt);
        }
    }
    int64_t ktiles = ceil_tiles(a.p.S), qtiles = ceil_tiles(a.p.T);
    if (a.dk || a.dv) {
        e = launch(attn_bwd_kv<DT>, a.p.B * a.p.Hkv * ktiles, kv_smem<A>(a), st, a, ktiles);
        if (e != cudaSuccess) return e;
    }
    if (!a.dq) return cudaSuccess;
    return launch(attn_bwd_q<DT>, a.p.B * a.p.Hq * qtiles, q_smem<A>(a), st, a, qtiles);
}

} // namespace
} // namespace cti

extern "C" size_t cti_cuda_attn_work(const cti_cuda_attn *a) {
    size_t es = a->dt == CT_F64 ? sizeof(double) : sizeof(float);
    return (size_t)(a->p.B * a->p.Hq * a->p.T) * es;
}

extern "C" cudaError_t cti_cuda_attn_forward(const cti_cuda_attn *a, cudaStream_t stream,
                                             const char **routine) {
    *routine = a->tensor_cores && (a->dt == CT_F16 || a->dt == CT_BF16) ? "flash_fwd_mma_tile64"
                                                                         : "flash_fwd_tile32";
    switch (a->dt) {
    case CT_F16: return cti::forward<CT_F16>(*a, stream);
    case CT_BF16: return cti::forward<CT_BF16>(*a, stream);
    case CT_F32: return cti::forward<CT_F32>(*a, stream);
    case CT_F64: return cti::forward<CT_F64>(*a, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t cti_cuda_attn_backward(const cti_cuda_attn *a, cudaStream_t stream,
                                              const char **routine) {
    *routine = a->tensor_cores && (a->dt == CT_F16 || a->dt == CT_BF16)
                   ? "flash_bwd_mma_delta+dkdv+dq_tile64"
                   : "flash_bwd_delta+dkdv+dq_tile32";
    switch (a->dt) {
    case CT_F16: return cti::backward<CT_F16>(*a, stream);
    case CT_BF16: return cti::backward<CT_BF16>(*a, stream);
    case CT_F32: return cti::backward<CT_F32>(*a, stream);
    case CT_F64: return cti::backward<CT_F64>(*a, stream);
    default: return cudaErrorInvalidValue;
    }
}
