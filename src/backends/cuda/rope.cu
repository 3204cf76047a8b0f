// CUDA kernels of ROPE, ROPE_BACKWARD, SWIGLU and SWIGLU_BACKWARD (the
// contract is schema.h's; the launch records ops_impl.h's).
//
// Both ops are memory bound: each thread of a grid-stride loop moves one
// 16-byte vector of every operand per step where the layout allows it, and
// element by element otherwise. rope's unit is the pairs of one such vector:
// its offsets in out, x and the tables come from the launch's cti_cuda_iter
// (multiply-shift division over the leading dims), so tables broadcast over
// heads or batches are read where they are (they stay in L2) and x's leading
// dims may have any strides. The backward is the forward with sin negated.
// swiglu's unit is one vector of a row; every operand's rows sit at its row
// stride (the halves of a chunk are read in place, and the backward may write
// the two halves of one buffer).
// f16/bf16 compute in f32, f32 in f32, f64 in f64. Beside an f16/bf16 x the
// tables may be f32: each entry is rounded to x's dtype as it is read, which
// is what casting the tables first would give, without the cast's pass.
#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

template <int DT> struct Acc { typedef float A; };
template <> struct Acc<CT_F64> { typedef double A; };

template <class T, int N> struct alignas(sizeof(T) * N) Vec {
    T v[N];
};

// N elements at p: one vector access when VEC (p aligned to the vector),
// else N element accesses.
template <bool VEC, class T, int N>
__device__ __forceinline__ void load(const T *__restrict__ p, T (&r)[N]) {
    if constexpr (VEC) {
        Vec<T, N> v = *reinterpret_cast<const Vec<T, N> *>(p);
#pragma unroll
        for (int j = 0; j < N; j++) r[j] = v.v[j];
    } else {
#pragma unroll
        for (int j = 0; j < N; j++) r[j] = p[j];
    }
}

template <bool VEC, class T, int N>
__device__ __forceinline__ void store(T *__restrict__ p, const T (&r)[N]) {
    if constexpr (VEC) {
        Vec<T, N> v;
#pragma unroll
        for (int j = 0; j < N; j++) v.v[j] = r[j];
        *reinterpret_cast<Vec<T, N> *>(p) = v;
    } else {
#pragma unroll
        for (int j = 0; j < N; j++) p[j] = r[j];
    }
}

// ---- rope -----------------------------------------------------------------------------------
// Pairs of a vector unit: the pairs of one 16-byte vector of tables of x's
// dtype (float32 tables beside a 16-bit x take two vectors a unit). In
// the half layout x's two halves are a vector each; in the interleaved one
// x's 2 elements a pair fill two vectors, so each thread moves as many bytes
// a step in both layouts (units of one x vector ran the interleaved forward
// at 78% of a copy, the half layout at 90%).
template <int DT, bool IL> constexpr int vec_pairs() {
    return 16 / (int)sizeof(typename dtype<DT>::T);
}

// A table entry (of dtype TT: DT, or f32 beside a 16-bit x) in the compute type.
template <int DT, int TT>
__device__ __forceinline__ typename Acc<DT>::A entry(typename dtype<TT>::T v) {
    if constexpr (TT == DT) return dtype<DT>::dec(v);
    else return dtype<DT>::dec(dtype<DT>::enc(v));
}

template <int DT, int TT, int P, bool IL, bool VEC, class I>
__global__ void __launch_bounds__(kThreads)
rope_k(const cti_cuda_iter it, typename dtype<DT>::T *__restrict__ out,
       const typename dtype<DT>::T *__restrict__ x, const typename dtype<TT>::T *__restrict__ cs,
       const typename dtype<TT>::T *__restrict__ sn, int64_t half, typename Acc<DT>::A sign) {
    typedef typename dtype<DT>::T T;
    typedef typename dtype<TT>::T TabT;
    typedef typename Acc<DT>::A A;
    const I n = (I)it.numel, step = (I)gridDim.x * blockDim.x;
    for (I u = (I)blockIdx.x * blockDim.x + threadIdx.x; u < n; u += step) {
        int64_t off[3];
        offsets<3, I>(it, u, off);
        TabT c[P], s[P];
        load<VEC>(cs + off[2], c);
        load<VEC>(sn + off[2], s);
        if constexpr (IL) {
            // x's 2P elements as two vectors of P (each 16-byte aligned)
            T v[2][P], o[2][P];
            load<VEC>(x + off[1], v[0]);
            load<VEC>(x + off[1] + P, v[1]);
#pragma unroll
            for (int j = 0; j < P; j++) {
                const int h = (2 * j) / P, i = (2 * j) % P;
                A a = dtype<DT>::dec(v[h][i]), b = dtype<DT>::dec(v[h][i + 1]);
                A ck = entry<DT, TT>(c[j]), sk = sign * entry<DT, TT>(s[j]);
                o[h][i] = dtype<DT>::enc(a * ck - b * sk);
                o[h][i + 1] = dtype<DT>::enc(b * ck + a * sk);
            }
            store<VEC>(out + off[0], o[0]);
            store<VEC>(out + off[0] + P, o[1]);
        } else {
            T va[P], vb[P], oa[P], ob[P];
            load<VEC>(x + off[1], va);
            load<VEC>(x + off[1] + half, vb);
#pragma unroll
            for (int j = 0; j < P; j++) {
                A a = dtype<DT>::dec(va[j]), b = dtype<DT>::dec(vb[j]);
                A ck = entry<DT, TT>(c[j]), sk = sign * entry<DT, TT>(s[j]);
                oa[j] = dtype<DT>::enc(a * ck - b * sk);
                ob[j] = dtype<DT>::enc(b * ck + a * sk);
            }
            store<VEC>(out + off[0], oa);
            store<VEC>(out + off[0] + half, ob);
        }
    }
}

template <int DT, int TT, int P, bool IL, bool VEC>
cudaError_t rope_launch(const cti_cuda_rope_args *a, int sms, cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    typedef typename dtype<TT>::T TabT;
    typedef typename Acc<DT>::A A;
    const A sign = a->backward ? (A)-1 : (A)1;
    const unsigned grid = grid_for(a->it.numel, sms);
    if (a->it.use32)
        rope_k<DT, TT, P, IL, VEC, uint32_t><<<grid, kThreads, 0, st>>>(
            a->it, (T *)a->out, (const T *)a->x, (const TabT *)a->cos, (const TabT *)a->sin,
            a->half, sign);
    else
        rope_k<DT, TT, P, IL, VEC, int64_t><<<grid, kThreads, 0, st>>>(
            a->it, (T *)a->out, (const T *)a->x, (const TabT *)a->cos, (const TabT *)a->sin,
            a->half, sign);
    return cudaGetLastError();
}

template <int DT, int TT>
cudaError_t rope_tables(const cti_cuda_rope_args *a, int sms, cudaStream_t st,
                        const char **routine) {
    const bool wide = TT != DT;
    if (a->interleaved) {
        *routine = a->vec ? (wide ? "cten_rope_interleaved_vec16_f32_tables"
                                  : "cten_rope_interleaved_vec16")
                          : (wide ? "cten_rope_interleaved_f32_tables" : "cten_rope_interleaved");
        return a->vec ? rope_launch<DT, TT, vec_pairs<DT, true>(), true, true>(a, sms, st)
                      : rope_launch<DT, TT, 1, true, false>(a, sms, st);
    }
    *routine = a->vec ? (wide ? "cten_rope_half_vec16_f32_tables" : "cten_rope_half_vec16")
                      : (wide ? "cten_rope_half_f32_tables" : "cten_rope_half");
    return a->vec ? rope_launch<DT, TT, vec_pairs<DT, false>(), false, true>(a, sms, st)
                  : rope_launch<DT, TT, 1, false, false>(a, sms, st);
}

template <int DT>
cudaError_t rope_dt(const cti_cuda_rope_args *a, int sms, cudaStream_t st, const char **routine) {
    if constexpr (DT == CT_F16 || DT == CT_BF16)
        if (a->table_dt == CT_F32) return rope_tables<DT, CT_F32>(a, sms, st, routine);
    if (a->table_dt != (ct_dtype)DT) return cudaErrorInvalidValue;
    return rope_tables<DT, DT>(a, sms, st, routine);
}

// ---- swiglu ---------------------------------------------------------------------------------
// sigmoid in the compute type. f16/bf16 take the fast exp and division (a
// few ulps of f32 where |x| <= 8, far below their own rounding of 2^-11 and
// 2^-8), which keeps the bf16 kernels at the memory's pace; f32 and f64 take
// the accurate ones. Large |x| gives exactly 0 or 1 either way.
template <int DT> __device__ __forceinline__ typename Acc<DT>::A sigm(typename Acc<DT>::A x) {
    if constexpr (DT == CT_F64) return 1.0 / (1.0 + exp(-x));
    else if constexpr (DT == CT_F32) return 1.0f / (1.0f + expf(-x));
    else return __fdividef(1.0f, 1.0f + __expf(-x));
}

// One unit: V elements of row r from column c0 (one 16-byte vector of each
// operand when VEC); a row's last unit may be partial and goes element by
// element. gate, up, g point at row r; o0, o1 (contiguous) at the unit.
template <int DT, bool VEC, bool BWD>
__device__ __forceinline__ void swiglu_unit(int64_t c0, int64_t cols,
                                            const typename dtype<DT>::T *__restrict__ gate,
                                            const typename dtype<DT>::T *__restrict__ up,
                                            const typename dtype<DT>::T *__restrict__ g,
                                            typename dtype<DT>::T *__restrict__ o0,
                                            typename dtype<DT>::T *__restrict__ o1) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    constexpr int V = VEC ? 16 / (int)sizeof(T) : 1;
    if (c0 + V > cols) { // the partial tail of the row
        for (int64_t i = 0; i < cols - c0; i++) {
            A x = dtype<DT>::dec(gate[c0 + i]), y = dtype<DT>::dec(up[c0 + i]), s = sigm<DT>(x);
            if constexpr (!BWD) {
                o0[i] = dtype<DT>::enc(x * s * y);
            } else {
                A go = dtype<DT>::dec(g[c0 + i]);
                if (o0) o0[i] = dtype<DT>::enc(go * y * s * ((A)1 + x * ((A)1 - s)));
                if (o1) o1[i] = dtype<DT>::enc(go * x * s);
            }
        }
        return;
    }
    T gv[V], uv[V], r0[V], r1[V];
    load<VEC>(gate + c0, gv);
    load<VEC>(up + c0, uv);
    if constexpr (!BWD) {
#pragma unroll
        for (int j = 0; j < V; j++) {
            A x = dtype<DT>::dec(gv[j]);
            r0[j] = dtype<DT>::enc(x * sigm<DT>(x) * dtype<DT>::dec(uv[j]));
        }
        store<VEC>(o0, r0);
    } else {
        T ov[V];
        load<VEC>(g + c0, ov);
#pragma unroll
        for (int j = 0; j < V; j++) {
            A x = dtype<DT>::dec(gv[j]), y = dtype<DT>::dec(uv[j]), s = sigm<DT>(x);
            A go = dtype<DT>::dec(ov[j]);
            r0[j] = dtype<DT>::enc(go * y * s * ((A)1 + x * ((A)1 - s)));
            r1[j] = dtype<DT>::enc(go * x * s);
        }
        if (o0) store<VEC>(o0, r0);
        if (o1) store<VEC>(o1, r1);
    }
}

// A grid-stride loop over the rows x ceil(cols / V) units. Each thread keeps
// its unit's (row, unit in row) and steps both by the grid's stride, so no
// unit costs a 64-bit division.
template <int DT, bool VEC, bool BWD>
__global__ void __launch_bounds__(kThreads)
swiglu_k(int64_t rows, int64_t cols, int64_t ldg, int64_t ldu, int64_t ldgo, int64_t ldy,
         const typename dtype<DT>::T *__restrict__ gate,
         const typename dtype<DT>::T *__restrict__ up, const typename dtype<DT>::T *__restrict__ g,
         typename dtype<DT>::T *__restrict__ o0, typename dtype<DT>::T *__restrict__ o1) {
    typedef typename dtype<DT>::T T;
    constexpr int V = VEC ? 16 / (int)sizeof(T) : 1;
    const int64_t upr = (cols + V - 1) / V, step = (int64_t)gridDim.x * blockDim.x;
    const int64_t sr = step / upr, sk = step - sr * upr;
    const int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t r = u / upr, k = u - r * upr;
    while (r < rows) {
        const int64_t c0 = k * V, out = r * ldy + c0;
        const T *go = nullptr;
        if constexpr (BWD) go = g + r * ldgo;
        swiglu_unit<DT, VEC, BWD>(c0, cols, gate + r * ldg, up + r * ldu, go,
                                  o0 ? o0 + out : nullptr, o1 ? o1 + out : nullptr);
        r += sr;
        k += sk;
        if (k >= upr) {
            k -= upr;
            r++;
        }
    }
}

template <int DT, bool VEC>
cudaError_t swiglu_launch(const cti_cuda_swiglu_args *a, int sms, cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    constexpr int V = VEC ? 16 / (int)sizeof(T) : 1;
    const unsigned grid = grid_for(a->rows * ((a->cols + V - 1) / V), sms);
    if (a->backward)
        swiglu_k<DT, VEC, true><<<grid, kThreads, 0, st>>>(
            a->rows, a->cols, a->ld_gate, a->ld_up, a->ld_grad, a->ld_out, (const T *)a->gate,
            (const T *)a->up, (const T *)a->grad, (T *)a->dgate, (T *)a->dup);
    else
        swiglu_k<DT, VEC, false><<<grid, kThreads, 0, st>>>(
            a->rows, a->cols, a->ld_gate, a->ld_up, 0, a->ld_out, (const T *)a->gate,
            (const T *)a->up,
            nullptr, (T *)a->y, nullptr);
    return cudaGetLastError();
}

bool aligned16(const void *p) { return p == nullptr || ((uintptr_t)p & 15u) == 0; }

// Whether every row start of every operand keeps 16-byte alignment: the
// pointers aligned and, beyond one row, every row stride a whole number of
// vectors.
bool swiglu_vec_ok(const cti_cuda_swiglu_args *a, int64_t es) {
    if (!(aligned16(a->gate) && aligned16(a->up) && aligned16(a->grad) && aligned16(a->y) &&
          aligned16(a->dgate) && aligned16(a->dup)))
        return false;
    if (a->rows <= 1) return true;
    return (a->ld_out * es) % 16 == 0 && (a->ld_gate * es) % 16 == 0 &&
           (a->ld_up * es) % 16 == 0 && (!a->backward || (a->ld_grad * es) % 16 == 0);
}

template <int DT>
cudaError_t swiglu_dt(const cti_cuda_swiglu_args *a, int sms, cudaStream_t st, const char **routine) {
    bool vec = swiglu_vec_ok(a, (int64_t)sizeof(typename dtype<DT>::T));
    if (a->backward) *routine = vec ? "cten_swiglu_bwd_vec16" : "cten_swiglu_bwd";
    else *routine = vec ? "cten_swiglu_fwd_vec16" : "cten_swiglu_fwd";
    return vec ? swiglu_launch<DT, true>(a, sms, st) : swiglu_launch<DT, false>(a, sms, st);
}

} // namespace
} // namespace cti

#define CTI_ROPE_FLOAT_SWITCH(dt, CALL)                                                \
    switch (dt) {                                                                      \
    case CT_F32: { constexpr int DTV = CT_F32; return CALL; }                          \
    case CT_F64: { constexpr int DTV = CT_F64; return CALL; }                          \
    case CT_F16: { constexpr int DTV = CT_F16; return CALL; }                          \
    case CT_BF16: { constexpr int DTV = CT_BF16; return CALL; }                        \
    default: return cudaErrorInvalidValue;                                             \
    }

extern "C" {

int cti_cuda_rope_vec_pairs(ct_dtype dt, bool interleaved) {
    int es = dt == CT_F64 ? 8 : dt == CT_F32 ? 4 : 2;
    (void)interleaved;
    return 16 / es;
}

cudaError_t cti_cuda_rope(const cti_cuda_rope_args *a, int sm_count, cudaStream_t stream,
                          const char **routine) {
    CTI_ROPE_FLOAT_SWITCH(a->dt, cti::rope_dt<DTV>(a, sm_count, stream, routine))
}

cudaError_t cti_cuda_swiglu(const cti_cuda_swiglu_args *a, int sm_count, cudaStream_t stream,
                            const char **routine) {
    CTI_ROPE_FLOAT_SWITCH(a->dt, cti::swiglu_dt<DTV>(a, sm_count, stream, routine))
}

} // extern "C"
