// Kernels of the indexing and shape ops (shape_impl.h; the contracts are
// schema.h's). Each computes what the CPU kernel (src/backends/cpu/shape.c)
// computes, in the same order where order matters:
//
//   scatter_lines   one thread per line along dim, so each element is
//                   reduced in index order (bit for bit the CPU's); an index
//                   outside [0, size) is recorded with atomicMin and skipped
//   remap_copy      flip / roll / repeat / pad: each thread makes 16 bytes of
//                   consecutive output (one vector store); where a row holds
//                   16 bytes, contiguous runs of x (forward or reversed,
//                   aligned or not) are read with vector loads, the rest
//                   element by element through the per-dim map; rows shorter
//                   than that go element by element, the outer dims' offset
//                   carried from row to row
//   interpolate     one thread per output; the coordinates and weights in the
//                   CPU's float (double for float64) arithmetic with no
//                   contraction into FMA, so results match the CPU's; the
//                   backward scatters with atomicAdd (float32 accumulators for
//                   the halves)
//   unfold / fold   one thread per output; fold gathers each pixel's column
//                   elements in the CPU's order, so no atomics are needed
#include <cstdint>

#include "kernels.cuh"
#include "shape_impl.h"

namespace cti {
namespace {

template <int ES> struct Bits;
template <> struct Bits<1> { typedef uint8_t T; };
template <> struct Bits<2> { typedef uint16_t T; };
template <> struct Bits<4> { typedef uint32_t T; };
template <> struct Bits<8> { typedef unsigned long long T; };

// ---- scatter -------------------------------------------------------------------------

template <int DT>
__device__ __forceinline__ typename dtype<DT>::T reduce_one(int r, typename dtype<DT>::T cur,
                                                            typename dtype<DT>::T s) {
    if (r == CTI_SCATTER_ASSIGN) return s;
    auto c = dtype<DT>::dec(cur), v = dtype<DT>::dec(s);
    if constexpr (DT == CT_I32 || DT == CT_I64 || DT == CT_BOOL) {
        if (r == CTI_SCATTER_SUM) return dtype<DT>::enc((int64_t)((uint64_t)c + (uint64_t)v));
        if (r == CTI_SCATTER_PROD) return dtype<DT>::enc((int64_t)((uint64_t)c * (uint64_t)v));
        if (r == CTI_SCATTER_AMAX) return v > c ? s : cur;
        return v < c ? s : cur;
    } else {
        if (r == CTI_SCATTER_SUM) return dtype<DT>::enc(c + v);
        if (r == CTI_SCATTER_PROD) return dtype<DT>::enc(c * v);
        if (r == CTI_SCATTER_AMAX) return (v != v || v > c) ? s : cur;
        return (v != v || v < c) ? s : cur;
    }
}

template <int DT>
__global__ void __launch_bounds__(kThreads) scatter_kernel(const cti_cuda_scatter a, int64_t lines) {
    typedef typename dtype<DT>::T E;
    const int64_t *idx = (const int64_t *)a.idx;
    const E *src = (const E *)a.src;
    E *out = (E *)a.out;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; l < lines; l += step) {
        int64_t o = 0, i = 0, s = 0, r = 0, p = l;
        for (int k = a.nd - 1; k >= 0; k--) {
            int64_t n = a.shape[k] > 0 ? a.shape[k] : 1, c = p % n;
            p /= n;
            o += c * a.os[k], i += c * a.is[k], s += c * a.ss[k], r += c * a.cs[k];
        }
        for (int64_t j = 0; j < a.len; j++) {
            int64_t v = idx[i + j * a.idim];
            if (v < 0 || v >= a.size) {
                atomicMin(a.bad, (unsigned long long)(r + j * a.cdim));
                continue;
            }
            E *d = out + o + v * a.odim;
            *d = reduce_one<DT>(a.reduce, *d, src[s + j * a.sdim]);
        }
    }
}

template <int DT>
cudaError_t scatter_launch(const cti_cuda_scatter *a, int64_t n, unsigned g, cudaStream_t st) {
    scatter_kernel<DT><<<g, kThreads, 0, st>>>(*a, n);
    return cudaGetLastError();
}

// ---- flip, roll, repeat, pad -----------------------------------------------------------

__device__ __forceinline__ int64_t remap_coord(int mode, int64_t o, int64_t lo, int64_t n) {
    int64_t i = o - lo;
    switch (mode) {
    case CTI_REMAP_FLIP: return n - 1 - o;
    case CTI_REMAP_WRAP: // roll and circular pads stay within one period: no division
        if (i < 0) i = i >= -n ? i + n : i % n + n;
        if (i >= n) i = i < 2 * n ? i - n : i % n;
        return i == n ? 0 : i;
    case CTI_REMAP_REFLECT:
        if (i < 0) i = -i;
        return i >= n ? 2 * (n - 1) - i : i;
    case CTI_REMAP_CLAMP: return i < 0 ? 0 : i >= n ? n - 1 : i;
    default: return i < 0 || i >= n ? -1 : i;
    }
}

// The x offset of the row at outer coordinates c[0..nd-1) (-1: fill).
__device__ __forceinline__ int64_t outer_offset(const cti_cuda_remap &a, const int64_t *c) {
    int64_t off = 0;
    for (int k = 0; k < a.nd - 1; k++) {
        int64_t i = remap_coord(a.mode[k], c[k], a.lo[k], a.xshape[k]);
        if (i < 0) return -1;
        off += i * a.xstride[k];
    }
    return off;
}

// I: the index type of the decode (uint32_t when numel < 2^31).
template <int ES, class I>
__global__ void __launch_bounds__(kThreads) remap_kernel(const cti_cuda_remap a, int64_t chunks) {
    typedef typename Bits<ES>::T E;
    constexpr int V = 16 / ES;
    const E *x = (const E *)a.x;
    E *out = (E *)a.out;
    const int l = a.nd - 1;
    const int64_t on = a.oshape[l], xn = a.xshape[l], xs = a.xstride[l], lo = a.lo[l];
    const int mode = a.mode[l];
    const E fill = (E)a.fill;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; ch < chunks; ch += step) {
        int64_t p0 = ch * V, c[CT_MAX_DIMS];
        I rest = (I)p0;
        for (int k = l; k >= 0; k--) {
            I n = (I)a.oshape[k];
            I q = rest / n;
            c[k] = (int64_t)(rest - q * n);
            rest = q;
        }
        int64_t base = outer_offset(a, c);
        union {
            uint4 v;
            E e[V];
        } u;
#pragma unroll
        for (int v = 0; v < V; v++) {
            if (p0 + v >= a.numel) break;
            int64_t i = base < 0 ? -1 : remap_coord(mode, c[l], lo, xn);
            u.e[v] = i < 0 ? fill : x[base + i * xs];
            if (++c[l] == on && p0 + v + 1 < a.numel) { // next row: carry into the outer dims
                c[l] = 0;
                for (int k = l - 1; k >= 0 && ++c[k] == a.oshape[k]; k--) c[k] = 0;
                base = outer_offset(a, c);
            }
        }
        if (p0 + V <= a.numel) {
            *(uint4 *)(out + p0) = u.v;
        } else {
            for (int v = 0; p0 + v < a.numel; v++) out[p0 + v] = u.e[v];
        }
    }
}

// 16 bytes starting byte off (0..15) into the 32 bytes lo, hi: funnel shifts
// of the words, chosen by selects, so that nothing is indexed at run time
// (a dynamic index into registers would put them in local memory).
__device__ __forceinline__ uint4 bytes_at(const uint4 &lo, const uint4 &hi, int off) {
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const int q = off >> 2, sh = (off & 3) * 8;
    uint32_t r[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t a = q == 0 ? w[j] : q == 1 ? w[j + 1] : q == 2 ? w[j + 2] : w[j + 3];
        const uint32_t b = q == 0 ? w[j + 1] : q == 1 ? w[j + 2] : q == 2 ? w[j + 3] : w[j + 4];
        r[j] = __funnelshift_r(a, b, sh);
    }
    return make_uint4(r[0], r[1], r[2], r[3]);
}

// The ES-byte elements of v in reverse order.
template <int ES> __device__ __forceinline__ uint4 reversed(const uint4 &v) {
    if constexpr (ES == 8) return make_uint4(v.z, v.w, v.x, v.y);
    else if constexpr (ES == 4) return make_uint4(v.w, v.z, v.y, v.x);
    else {
        constexpr unsigned sel = ES == 2 ? 0x1032u : 0x0123u;
        return make_uint4(__byte_perm(v.w, 0, sel), __byte_perm(v.z, 0, sel),
                          __byte_perm(v.y, 0, sel), __byte_perm(v.x, 0, sel));
    }
}

// How a chunk of V outputs is read: one aligned vector at p (ONE), the two
// at p and p + V with the run starting byte off into them (TWO), or element
// by element (ELEM).
enum { RUN_ONE, RUN_TWO, RUN_ELEM };
template <class E> struct run_plan {
    const E *p;
    int kind, off;
    bool rev;
    int64_t base, c0, row; // the row's x offset (-1: a fill row), the chunk's first column, the row
};

// Rows of at least V elements: a chunk of V outputs that lies in one row
// finds its sources along the last dim from its first and last. Where those
// are V apart in x (a contiguous run, forward or reversed: every mode's
// steps are +-1 inside a run), the run is read with 16-byte loads: one where
// it is aligned, else the two aligned vectors around it (while both lie in
// the row), whose bytes are shifted into place. Other chunks (fills, wraps,
// reflections, a strided last dim, a chunk across two rows) go element by
// element. The misaligned and reversed runs are what pad, roll and flip
// make. A thread plans kRunUnroll chunks, issues all their loads, then
// assembles and stores them (with 4, the kernel took 94 registers; with 2,
// 64, so twice the threads fit).
constexpr int kRunUnroll = 2;

// The x offset of output row r (the outer dims' coordinates decoded from
// it; -1: a fill row), summed as it is decoded, with no array of
// coordinates (an array indexed in a loop lives in local memory).
template <class I> __device__ __forceinline__ int64_t row_base(const cti_cuda_remap &a, I rest) {
    int64_t base = 0;
    for (int k = a.nd - 2; k >= 0; k--) {
        I n = (I)a.oshape[k];
        I q = rest / n;
        const int64_t i = remap_coord(a.mode[k], (int64_t)(rest - q * n), a.lo[k], a.xshape[k]);
        base = base < 0 || i < 0 ? -1 : base + i * a.xstride[k];
        rest = q;
    }
    return base;
}

// The plan of the chunk of outputs [p0, p0 + V): a run when they lie in one
// row and their sources are V apart in x.
template <int ES, class I>
__device__ __forceinline__ run_plan<typename Bits<ES>::T>
plan_chunk(const cti_cuda_remap &a, int64_t p0, bool xal) {
    typedef typename Bits<ES>::T E;
    constexpr int V = 16 / ES;
    const int l = a.nd - 1;
    const int64_t on = a.oshape[l], xn = a.xshape[l], lo = a.lo[l];
    const I row = (I)p0 / (I)on;
    const int64_t c0 = p0 - (int64_t)row * on;
    const int64_t base = row_base<I>(a, row);
    run_plan<E> r{nullptr, RUN_ELEM, 0, false, base, c0, (int64_t)row};
    if (base < 0 || !xal || c0 + V > on || p0 + V > a.numel) return r;
    const int64_t i0 = remap_coord(a.mode[l], c0, lo, xn);
    const int64_t i1 = remap_coord(a.mode[l], c0 + V - 1, lo, xn);
    const bool fwd = i1 == i0 + (V - 1), rev = i1 == i0 - (V - 1);
    if (i0 < 0 || i1 < 0 || !(fwd || rev)) return r;
    const int64_t g = base + (fwd ? i0 : i1), off = g % V, a0 = g - off;
    if (off == 0) r = run_plan<E>{(const E *)a.x + g, RUN_ONE, 0, rev, base, c0, (int64_t)row};
    else if (a0 >= base && a0 + 2 * V <= base + xn)
        r = run_plan<E>{(const E *)a.x + a0, RUN_TWO, (int)off * ES, rev, base, c0, (int64_t)row};
    return r;
}

// The chunk element by element; it may run past its row into the next (rows
// hold at least V elements) and past the end (those are left out).
template <int ES, class I>
__device__ __forceinline__ uint4 elem_chunk(const cti_cuda_remap &a, int64_t p0,
                                            const run_plan<typename Bits<ES>::T> &pl) {
    typedef typename Bits<ES>::T E;
    constexpr int V = 16 / ES;
    const int l = a.nd - 1;
    const int64_t on = a.oshape[l];
    int64_t base = pl.base, col = pl.c0;
    union {
        uint4 v;
        E e[V];
    } u;
#pragma unroll
    for (int v = 0; v < V; v++) {
        if (p0 + v >= a.numel) {
            u.e[v] = (E)0;
            continue;
        }
        if (col == on) { // into the next row
            col = 0;
            base = row_base<I>(a, (I)(pl.row + 1));
        }
        int64_t i = base < 0 ? -1 : remap_coord(a.mode[l], col, a.lo[l], a.xshape[l]);
        u.e[v] = i < 0 ? (E)a.fill : ((const E *)a.x)[base + i * a.xstride[l]];
        col++;
    }
    return u.v;
}

template <int ES, class I>
__global__ void __launch_bounds__(kThreads) remap_rows_kernel(const cti_cuda_remap a, int64_t chunks) {
    typedef typename Bits<ES>::T E;
    constexpr int V = 16 / ES, RU = kRunUnroll;
    const bool xal = ((uintptr_t)a.x & 15) == 0 && a.xstride[a.nd - 1] == 1;
    E *out = (E *)a.out;
    const int64_t tile = (int64_t)RU * blockDim.x;
    for (int64_t t0 = (int64_t)blockIdx.x * tile; t0 < chunks; t0 += (int64_t)gridDim.x * tile) {
        run_plan<E> pl[RU];
        uint4 w0[RU], w1[RU];
#pragma unroll
        for (int u = 0; u < RU; u++) {
            const int64_t ch = t0 + u * blockDim.x + threadIdx.x;
            pl[u] = run_plan<E>{nullptr, RUN_ELEM, 0, false, 0, 0, 0};
            if (ch >= chunks) continue;
            pl[u] = plan_chunk<ES, I>(a, ch * V, xal);
            if (pl[u].kind == RUN_ELEM) w0[u] = elem_chunk<ES, I>(a, ch * V, pl[u]);
            else w0[u] = *(const uint4 *)pl[u].p;
            if (pl[u].kind == RUN_TWO) w1[u] = *(const uint4 *)(pl[u].p + V);
        }
#pragma unroll
        for (int u = 0; u < RU; u++) {
            const int64_t ch = t0 + u * blockDim.x + threadIdx.x, p0 = ch * V;
            if (ch >= chunks) continue;
            uint4 v = pl[u].kind == RUN_TWO ? bytes_at(w0[u], w1[u], pl[u].off) : w0[u];
            if (pl[u].kind != RUN_ELEM && pl[u].rev) v = reversed<ES>(v);
            if (p0 + V <= a.numel) {
                *(uint4 *)(out + p0) = v;
            } else {
                union {
                    uint4 v;
                    E e[V];
                } t;
                t.v = v;
#pragma unroll
                for (int k = 0; k < V; k++)
                    if (p0 + k < a.numel) out[p0 + k] = t.e[k];
            }
        }
    }
}

// Long rows (kWarpRowChunks chunks or more): a warp per output row, so the
// row's outer coordinates are decoded once per row rather than once per
// chunk, as remap_rows_kernel does (on rows of 4096 float32 that division
// and decode held flip, roll, repeat and pad to 0.51-0.72 of the copy rate;
// a warp per row took them to 0.66-0.91). The warp takes the chunks whose
// first element lies in its row; U of a lane's chunks are planned, each
// one's loads issued as it is planned, before any is assembled and stored.
// A chunk that runs into the next row goes element by element; a chunk
// wholly in a fill (a constant pad's border, or a fill row) is stored
// without a load. (Variants measured slower on the H200: four chunks a lane,
// 80 registers; the element-by-element chunks left to a pass of their own,
// with an unaligned run's second vector taken from the next lane by
// shuffles; a grid of only the resident blocks.)
constexpr int kWarpRowChunks = 64;
constexpr int kWarpRowUnroll = 2;

template <int ES, int U>
__global__ void __launch_bounds__(kThreads) remap_warp_rows_kernel(const cti_cuda_remap a,
                                                                   int64_t rows, int64_t chunks) {
    typedef typename Bits<ES>::T E;
    constexpr int V = 16 / ES;
    const int l = a.nd - 1;
    const int64_t on = a.oshape[l], xn = a.xshape[l], lo = a.lo[l];
    const int mode = a.mode[l];
    const bool xal = ((uintptr_t)a.x & 15) == 0 && a.xstride[l] == 1;
    const int lane = threadIdx.x & 31;
    const int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    E *out = (E *)a.out;
    uint4 fillv;
    {
        union {
            uint4 v;
            E e[V];
        } f;
#pragma unroll
        for (int k = 0; k < V; k++) f.e[k] = (E)a.fill;
        fillv = f.v;
    }
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const int64_t base = row_base<uint64_t>(a, (uint64_t)r), ps = r * on;
        const int64_t c_hi = min((ps + on + V - 1) / V, chunks);
        for (int64_t c = (ps + V - 1) / V + lane; c < c_hi; c += 32 * U) {
            run_plan<E> pl[U];
            uint4 w0[U], w1[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t ch = c + 32 * u, p0 = ch * V, c0 = p0 - ps;
                pl[u] = run_plan<E>{nullptr, RUN_ELEM, 0, false, base, c0, r};
                w0[u] = fillv;
                if (ch >= c_hi) continue;
                if (c0 + V > on || p0 + V > a.numel) {
                    w0[u] = elem_chunk<ES, uint64_t>(a, p0, pl[u]);
                    continue;
                }
                if (base < 0) {
                    pl[u].kind = RUN_ONE; // the fill row
                    continue;
                }
                const int64_t i0 = remap_coord(mode, c0, lo, xn);
                const int64_t i1 = remap_coord(mode, c0 + V - 1, lo, xn);
                const bool fwd = i1 == i0 + (V - 1), rev = i1 == i0 - (V - 1);
                if (mode == CTI_REMAP_IDENT && (c0 + V - 1 < lo || c0 >= lo + xn)) {
                    pl[u].kind = RUN_ONE; // wholly in the border
                    continue;
                }
                if (!xal || i0 < 0 || i1 < 0 || !(fwd || rev)) {
                    w0[u] = elem_chunk<ES, uint64_t>(a, p0, pl[u]);
                    continue;
                }
                const int64_t g = base + (fwd ? i0 : i1), off = g % V, a0 = g - off;
                const E *src = (const E *)a.x;
                if (off == 0) {
                    pl[u] = run_plan<E>{src + g, RUN_ONE, 0, rev, base, c0, r};
                    w0[u] = *(const uint4 *)(src + g);
                } else if (a0 >= base && a0 + 2 * V <= base + xn) {
                    pl[u] = run_plan<E>{src + a0, RUN_TWO, (int)off * ES, rev, base, c0, r};
                    w0[u] = *(const uint4 *)(src + a0);
                    w1[u] = *(const uint4 *)(src + a0 + V);
                } else {
                    w0[u] = elem_chunk<ES, uint64_t>(a, p0, pl[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t ch = c + 32 * u, p0 = ch * V;
                if (ch >= c_hi) continue;
                uint4 v = pl[u].kind == RUN_TWO ? bytes_at(w0[u], w1[u], pl[u].off) : w0[u];
                if (pl[u].kind != RUN_ELEM && pl[u].rev) v = reversed<ES>(v);
                if (p0 + V <= a.numel) {
                    *(uint4 *)(out + p0) = v;
                } else {
                    union {
                        uint4 v;
                        E e[V];
                    } t;
                    t.v = v;
#pragma unroll
                    for (int k = 0; k < V; k++)
                        if (p0 + k < a.numel) out[p0 + k] = t.e[k];
                }
            }
        }
    }
}

// 64 warps a multiprocessor, each taking every nw-th row.
template <int ES>
cudaError_t remap_warp_rows_launch(const cti_cuda_remap *a, int sm_count, cudaStream_t st) {
    constexpr int V = 16 / ES;
    const int64_t chunks = (a->numel + V - 1) / V, rows = a->numel / a->oshape[a->nd - 1];
    const int64_t warps = (int64_t)(sm_count > 0 ? sm_count : 1) * 64;
    const int64_t blocks = ((rows < warps ? rows : warps) * 32 + kThreads - 1) / kThreads;
    remap_warp_rows_kernel<ES, kWarpRowUnroll><<<(unsigned)blocks, kThreads, 0, st>>>(*a, rows, chunks);
    return cudaGetLastError();
}

template <int ES>
cudaError_t remap_launch(const cti_cuda_remap *a, int sm_count, cudaStream_t st) {
    constexpr int V = 16 / ES;
    int64_t chunks = (a->numel + V - 1) / V;
    unsigned g = grid_for(chunks, sm_count);
    if (a->nd >= 1 && a->oshape[a->nd - 1] >= kWarpRowChunks * V && ((uintptr_t)a->out & 15) == 0)
        return remap_warp_rows_launch<ES>(a, sm_count, st);
    if (a->nd >= 1 && a->oshape[a->nd - 1] >= V && ((uintptr_t)a->out & 15) == 0) {
        g = grid_for((chunks + kRunUnroll - 1) / kRunUnroll, sm_count);
        if (a->numel < ((int64_t)1 << 31)) remap_rows_kernel<ES, uint32_t><<<g, kThreads, 0, st>>>(*a, chunks);
        else remap_rows_kernel<ES, uint64_t><<<g, kThreads, 0, st>>>(*a, chunks);
        return cudaGetLastError();
    }
    if (a->numel < ((int64_t)1 << 31)) remap_kernel<ES, uint32_t><<<g, kThreads, 0, st>>>(*a, chunks);
    else remap_kernel<ES, uint64_t><<<g, kThreads, 0, st>>>(*a, chunks);
    return cudaGetLastError();
}

// ---- interpolate -----------------------------------------------------------------------------

struct Tap {
    int64_t i0, i1;
    double l0, l1; // float values for the non-float64 dtypes
};

// tap_of of the CPU kernel, with every rounding spelled out.
template <bool F64>
__device__ __forceinline__ Tap tap_of(const cti_interp_params &p, int64_t o, int64_t in,
                                      int64_t out, double sf) {
    Tap t = {0, 0, 1, 0};
    if (p.mode == CTI_INTERP_NEAREST) {
        if (out == in) t.i0 = o;
        else if (out == 2 * in) t.i0 = o >> 1;
        else {
            float sc = sf > 0 ? (float)(1.0 / sf) : __fdiv_rn((float)in, (float)out);
            int64_t i = (int64_t)floorf(__fmul_rn((float)o, sc));
            t.i0 = i < in - 1 ? i : in - 1;
        }
        t.i1 = t.i0;
        return t;
    }
    double src;
    if (F64) {
        double sc = p.align_corners ? (out > 1 ? __ddiv_rn((double)(in - 1), (double)(out - 1)) : 0)
                    : sf > 0        ? __ddiv_rn(1.0, sf)
                                    : __ddiv_rn((double)in, (double)out);
        src = p.align_corners ? __dmul_rn(sc, (double)o)
                              : __dadd_rn(__dmul_rn(sc, __dadd_rn((double)o, 0.5)), -0.5);
        if (!p.align_corners && src < 0) src = 0;
    } else {
        float sc = p.align_corners ? (out > 1 ? __fdiv_rn((float)(in - 1), (float)(out - 1)) : 0.f)
                   : sf > 0        ? (float)(1.0 / sf)
                                   : __fdiv_rn((float)in, (float)out);
        float s = p.align_corners ? __fmul_rn(sc, (float)o)
                                  : __fadd_rn(__fmul_rn(sc, __fadd_rn((float)o, 0.5f)), -0.5f);
        if (!p.align_corners && s < 0) s = 0;
        src = s;
    }
    int64_t i0 = (int64_t)floor(src);
    if (i0 > in - 1) i0 = in - 1;
    double l1 = F64 ? __dadd_rn(src, -(double)i0) : (double)__fadd_rn((float)src, -(float)i0);
    l1 = l1 < 0 ? 0 : l1 > 1 ? 1 : l1;
    t.i0 = i0;
    t.i1 = i0 + (i0 < in - 1 ? 1 : 0);
    t.l1 = l1;
    t.l0 = F64 ? __dadd_rn(1.0, -l1) : (double)__fadd_rn(1.0f, -(float)l1);
    return t;
}

template <int DT>
__global__ void __launch_bounds__(kThreads) interp_kernel(const cti_cuda_resample a, int64_t n) {
    typedef typename dtype<DT>::T E;
    constexpr bool F64 = DT == CT_F64;
    const cti_interp_params &p = a.ip;
    const E *x = (const E *)a.in;
    E *y = (E *)a.out;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n; q += step) {
        int64_t ow = q % p.OW, oh = q / p.OW % p.OH, plane = q / (p.OW * p.OH);
        Tap h = tap_of<F64>(p, oh, p.H, p.OH, p.scale_h);
        Tap w = tap_of<F64>(p, ow, p.W, p.OW, p.scale_w);
        const E *x0 = x + (plane * p.H + h.i0) * p.W, *x1 = x + (plane * p.H + h.i1) * p.W;
        if (p.mode == CTI_INTERP_NEAREST) {
            y[q] = x0[w.i0];
        } else if (F64) {
            double a0 = __dadd_rn(__dmul_rn(w.l0, (double)dtype<DT>::dec(x0[w.i0])),
                                  __dmul_rn(w.l1, (double)dtype<DT>::dec(x0[w.i1])));
            double a1 = __dadd_rn(__dmul_rn(w.l0, (double)dtype<DT>::dec(x1[w.i0])),
                                  __dmul_rn(w.l1, (double)dtype<DT>::dec(x1[w.i1])));
            y[q] = dtype<DT>::enc(__dadd_rn(__dmul_rn(h.l0, a0), __dmul_rn(h.l1, a1)));
        } else {
            float w0 = (float)w.l0, w1 = (float)w.l1;
            float a0 = __fadd_rn(__fmul_rn(w0, (float)dtype<DT>::dec(x0[w.i0])),
                                 __fmul_rn(w1, (float)dtype<DT>::dec(x0[w.i1])));
            float a1 = __fadd_rn(__fmul_rn(w0, (float)dtype<DT>::dec(x1[w.i0])),
                                 __fmul_rn(w1, (float)dtype<DT>::dec(x1[w.i1])));
            y[q] = dtype<DT>::enc(__fadd_rn(__fmul_rn((float)h.l0, a0), __fmul_rn((float)h.l1, a1)));
        }
    }
}

// A: the accumulator type (float, or double for float64).
template <int DT, class A>
__global__ void __launch_bounds__(kThreads) interp_bw_kernel(const cti_cuda_resample a, int64_t n) {
    typedef typename dtype<DT>::T E;
    constexpr bool F64 = DT == CT_F64;
    const cti_interp_params &p = a.ip;
    const E *g = (const E *)a.in;
    A *acc = (A *)a.acc;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n; q += step) {
        int64_t ow = q % p.OW, oh = q / p.OW % p.OH, plane = q / (p.OW * p.OH);
        Tap h = tap_of<F64>(p, oh, p.H, p.OH, p.scale_h);
        Tap w = tap_of<F64>(p, ow, p.W, p.OW, p.scale_w);
        A v = (A)dtype<DT>::dec(g[q]);
        A *r0 = acc + (plane * p.H + h.i0) * p.W, *r1 = acc + (plane * p.H + h.i1) * p.W;
        if (p.mode == CTI_INTERP_NEAREST) {
            atomicAdd(r0 + w.i0, v);
            continue;
        }
        A h0 = (A)h.l0, h1 = (A)h.l1, w0 = (A)w.l0, w1 = (A)w.l1;
        atomicAdd(r0 + w.i0, h0 * w0 * v);
        atomicAdd(r0 + w.i1, h0 * w1 * v);
        atomicAdd(r1 + w.i0, h1 * w0 * v);
        atomicAdd(r1 + w.i1, h1 * w1 * v);
    }
}

// ---- unfold, fold --------------------------------------------------------------------------------

template <int DT>
__global__ void __launch_bounds__(kThreads) unfold_kernel(const cti_cuda_resample a, int64_t n) {
    typedef typename dtype<DT>::T E;
    const cti_fold_params &p = a.fp;
    const E *x = (const E *)a.in;
    E *out = (E *)a.out;
    const int64_t L = p.OH * p.OW, kk = p.kernel[0] * p.kernel[1];
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n; q += step) {
        int64_t l = q % L, r = q / L, k = r % kk, plane = r / kk;
        int64_t i = k / p.kernel[1], j = k % p.kernel[1];
        int64_t h = l / p.OW * p.stride[0] - p.padding[0] + i * p.dilation[0];
        int64_t w = l % p.OW * p.stride[1] - p.padding[1] + j * p.dilation[1];
        bool in = h >= 0 && h < p.H && w >= 0 && w < p.W;
        out[q] = in ? x[(plane * p.H + h) * p.W + w] : dtype<DT>::enc(0.0f);
    }
}

template <int DT>
__global__ void __launch_bounds__(kThreads) fold_kernel(const cti_cuda_resample a, int64_t n) {
    typedef typename dtype<DT>::T E;
    typedef typename std::conditional<DT == CT_F64, double, float>::type A;
    const cti_fold_params &p = a.fp;
    const E *cols = (const E *)a.in;
    E *out = (E *)a.out;
    const int64_t L = p.OH * p.OW, kk = p.kernel[0] * p.kernel[1];
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n; q += step) {
        int64_t w = q % p.W, h = q / p.W % p.H, plane = q / (p.W * p.H);
        A acc = 0;
        for (int64_t i = 0; i < p.kernel[0]; i++) {
            int64_t th = h + p.padding[0] - i * p.dilation[0];
            if (th < 0 || th % p.stride[0]) continue;
            int64_t oh = th / p.stride[0];
            if (oh >= p.OH) continue;
            for (int64_t j = 0; j < p.kernel[1]; j++) {
                int64_t tw = w + p.padding[1] - j * p.dilation[1];
                if (tw < 0 || tw % p.stride[1]) continue;
                int64_t ow = tw / p.stride[1];
                if (ow >= p.OW) continue;
                acc += (A)dtype<DT>::dec(cols[(plane * kk + i * p.kernel[1] + j) * L + oh * p.OW + ow]);
            }
        }
        out[q] = dtype<DT>::enc(acc);
    }
}

template <int DT>
cudaError_t resample_launch(const cti_cuda_resample *a, int which, int64_t n, unsigned g,
                            cudaStream_t st) {
    switch (which) {
    case 0: interp_kernel<DT><<<g, kThreads, 0, st>>>(*a, n); break;
    case 1:
        if constexpr (DT == CT_F64) interp_bw_kernel<DT, double><<<g, kThreads, 0, st>>>(*a, n);
        else interp_bw_kernel<DT, float><<<g, kThreads, 0, st>>>(*a, n);
        break;
    case 2: unfold_kernel<DT><<<g, kThreads, 0, st>>>(*a, n); break;
    default: fold_kernel<DT><<<g, kThreads, 0, st>>>(*a, n); break;
    }
    return cudaGetLastError();
}

} // namespace
} // namespace cti

using namespace cti;

extern "C" cudaError_t cti_cuda_scatter_lines(const cti_cuda_scatter *a, int64_t lines,
                                              int sm_count, cudaStream_t st,
                                              const char **routine) {
    *routine = "cten_scatter_lines";
    unsigned g = grid_for(lines, sm_count);
    switch (a->dt) {
    case CT_BOOL: return scatter_launch<CT_BOOL>(a, lines, g, st);
    case CT_I32: return scatter_launch<CT_I32>(a, lines, g, st);
    case CT_I64: return scatter_launch<CT_I64>(a, lines, g, st);
    case CT_F16: return scatter_launch<CT_F16>(a, lines, g, st);
    case CT_BF16: return scatter_launch<CT_BF16>(a, lines, g, st);
    case CT_F32: return scatter_launch<CT_F32>(a, lines, g, st);
    case CT_F64: return scatter_launch<CT_F64>(a, lines, g, st);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t cti_cuda_remap_copy(const cti_cuda_remap *a, int sm_count, cudaStream_t st,
                                           const char **routine) {
    *routine = "cten_remap_copy_vec16";
    switch (a->es) {
    case 1: return remap_launch<1>(a, sm_count, st);
    case 2: return remap_launch<2>(a, sm_count, st);
    case 4: return remap_launch<4>(a, sm_count, st);
    case 8: return remap_launch<8>(a, sm_count, st);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t cti_cuda_resample_run(const cti_cuda_resample *a, int which, int64_t n,
                                             int sm_count, cudaStream_t st, const char **routine) {
    static const char *names[] = {"cten_interpolate", "cten_interpolate_backward_atomic",
                                  "cten_im2col", "cten_col2im_gather"};
    *routine = names[which & 3];
    unsigned g = grid_for(n, sm_count);
    switch (a->dt) {
    case CT_F16: return resample_launch<CT_F16>(a, which, n, g, st);
    case CT_BF16: return resample_launch<CT_BF16>(a, which, n, g, st);
    case CT_F32: return resample_launch<CT_F32>(a, which, n, g, st);
    case CT_F64: return resample_launch<CT_F64>(a, which, n, g, st);
    default: return cudaErrorInvalidValue;
    }
}
