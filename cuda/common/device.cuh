// Device code both op families' kernels share: the math and storage types per dtype,
// packs of V elements moved as one memory access, widening to the math type and rounding
// back, the (batch, hidden) state arrays read and written once per column, and which
// column a thread works on.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/launch.hpp"

namespace qrnn::cuda::kernels {

template <typename T> struct MathOf { using type = float; };
template <> struct MathOf<double> { using type = double; };
template <typename T> using Math = typename MathOf<T>::type;

// The CUDA storage type of a DType.
template <DType D> struct StorageOf { using type = float; };
template <> struct StorageOf<DType::float64> { using type = double; };
template <> struct StorageOf<DType::bfloat16> { using type = __nv_bfloat16; };
template <> struct StorageOf<DType::float16> { using type = __half; };
template <DType D> using Storage = typename StorageOf<D>::type;

// ---- Packs of V elements, moved as one memory access ----------------------------

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
    T v[V];
};

template <int Bytes> struct RawOf;
template <> struct RawOf<2> { using type = unsigned short; };
template <> struct RawOf<4> { using type = unsigned int; };
template <> struct RawOf<8> { using type = uint2; };
template <> struct RawOf<16> { using type = uint4; };
template <typename T, int V> using Raw = typename RawOf<int(sizeof(T)) * V>::type;

template <typename T>
__device__ __forceinline__ T load_element(const T* p) {
    const Raw<T, 1> r = __ldg(reinterpret_cast<const Raw<T, 1>*>(p));
    T v;
    memcpy(&v, &r, sizeof(T));
    return v;
}

// Every vector access must be aligned to its size: a misaligned one faults on a GPU. The
// host emulator (tests/cuda_emulation, which defines QRNN_EMULATOR) supplies its own
// load_vector / store_vector that check it, since its CPU would not say where.
#if !defined(QRNN_EMULATOR)
template <typename R>
__device__ __forceinline__ R load_vector(const R* p) {
    return __ldg(p);
}
template <typename R>
__device__ __forceinline__ void store_vector(R* p, const R& r) {
    *p = r;
}
#endif

// A thread's V units of one array, at `p` with hidden stride `stride_h`. Each array gets
// its own access: one vector access when it has unit hidden stride (the host then checked
// the alignment for V) and the thread owns a whole pack; one load of the one element when
// it is broadcast along hidden (stride 0, e.g. an expanded gradient); otherwise element
// by element. So a broadcast or strided array never forces the others to scalar accesses.
// n < V: the units a thread at the end of a row owns; n == 0 for an idle thread of a
// chunked block.
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, int n, int64_t stride_h) {
    Pack<T, V> pack;
    if (V > 1 && n == V && stride_h == 1) {
        const Raw<T, V> r = load_vector(reinterpret_cast<const Raw<T, V>*>(p));
        memcpy(&pack, &r, sizeof(pack));
    } else if (stride_h == 0) {  // an idle thread's column start is still inside the array
        const T v = load_element(p);
#pragma unroll
        for (int k = 0; k < V; ++k) pack.v[k] = v;
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k) pack.v[k] = k < n ? load_element(p + k * stride_h) : T{};
    }
    return pack;
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& pack, int n, int64_t stride_h) {
    if (V > 1 && n == V && stride_h == 1) {
        Raw<T, V> r;
        memcpy(&r, &pack, sizeof(r));
        store_vector(reinterpret_cast<Raw<T, V>*>(p), r);
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k)
            if (k < n) p[k * stride_h] = pack.v[k];
    }
}

// ---- Widening to the math type and rounding back (pairs use the 2-wide intrinsics) --

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T narrow(Math<T> v);
template <> __device__ __forceinline__ float narrow<float>(float v) { return v; }
template <> __device__ __forceinline__ double narrow<double>(double v) { return v; }
template <> __device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// 16-bit pairs convert with the 2-wide intrinsics.
template <typename T> struct PairOf { using type = void; };
template <> struct PairOf<__half> { using type = __half2; };
template <> struct PairOf<__nv_bfloat16> { using type = __nv_bfloat162; };
template <typename T, int V>
inline constexpr bool kPairs = V % 2 == 0 && !std::is_void_v<typename PairOf<T>::type>;

__device__ __forceinline__ float2 widen_pair(__half2 p) { return __half22float2(p); }
__device__ __forceinline__ float2 widen_pair(__nv_bfloat162 p) { return __bfloat1622float2(p); }
template <typename P> __device__ __forceinline__ P narrow_pair(float a, float b);
template <> __device__ __forceinline__ __half2 narrow_pair<__half2>(float a, float b) {
    return __floats2half2_rn(a, b);
}
template <> __device__ __forceinline__ __nv_bfloat162 narrow_pair<__nv_bfloat162>(float a, float b) {
    return __floats2bfloat162_rn(a, b);
}

template <typename T, int V>
__device__ __forceinline__ void unpack(const Pack<T, V>& pack, Math<T> (&out)[V]) {
    if constexpr (kPairs<T, V>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            typename PairOf<T>::type pair;
            memcpy(&pair, &pack.v[k], sizeof(pair));
            const float2 w = widen_pair(pair);
            out[k] = w.x;
            out[k + 1] = w.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] = widen(pack.v[k]);
    }
}

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> pack_of(const Math<T> (&in)[V]) {
    Pack<T, V> pack;
    if constexpr (kPairs<T, V>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            const auto pair = narrow_pair<typename PairOf<T>::type>(in[k], in[k + 1]);
            memcpy(&pack.v[k], &pair, sizeof(pair));
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k) pack.v[k] = narrow<T>(in[k]);
    }
    return pack;
}

// ---- h0 / grad_h0: (batch, hidden), read once per column, dtype known at run time ----

// Calls fn(k, element offset) for unit k < n of a column in a (batch, hidden) state array.
template <int V, typename ViewT, typename Fn>
__device__ __forceinline__ void for_state_units(const ViewT& v, int64_t b, int64_t j0, int n, Fn&& fn) {
    const int64_t base = b * v.stride_b + j0 * v.stride_h;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        if (k >= n) break;
        fn(k, base + k * v.stride_h);
    }
}

template <typename M, int V>
__device__ __forceinline__ void load_state(const ConstView2& v, DType dtype, int64_t b, int64_t j0, int n,
                                           M (&out)[V]) {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = M(0);
    if (v.data == nullptr) return;
    for_state_units<V>(v, b, j0, n, [&](int k, int64_t o) {
        switch (dtype) {
            case DType::float32: out[k] = M(load_element(static_cast<const float*>(v.data) + o)); break;
            case DType::float64: out[k] = M(load_element(static_cast<const double*>(v.data) + o)); break;
            case DType::bfloat16: out[k] = M(widen(load_element(static_cast<const __nv_bfloat16*>(v.data) + o))); break;
            case DType::float16: out[k] = M(widen(load_element(static_cast<const __half*>(v.data) + o))); break;
        }
    });
}

template <typename M, int V>
__device__ __forceinline__ void store_state(const View2& v, DType dtype, int64_t b, int64_t j0, int n,
                                            const M (&in)[V]) {
    for_state_units<V>(v, b, j0, n, [&](int k, int64_t o) {
        switch (dtype) {
            case DType::float32: static_cast<float*>(v.data)[o] = float(in[k]); break;
            case DType::float64: static_cast<double*>(v.data)[o] = double(in[k]); break;
            case DType::bfloat16: static_cast<__nv_bfloat16*>(v.data)[o] = __float2bfloat16_rn(float(in[k])); break;
            case DType::float16: static_cast<__half*>(v.data)[o] = __float2half_rn(float(in[k])); break;
        }
    });
}

// ---- Where a thread works ----------------------------------------------------------

// Column `col` of batch * vectors_per_row: batch row b, hidden units [j0, j0 + n).
// n == 0 marks a thread past the end (only the chunked kernels keep those: they must
// reach every barrier).
struct Column {
    int64_t b = 0, j0 = 0;
    int n = 0;
};

template <int V>
__device__ __forceinline__ Column column_of(int64_t col, int64_t batch, int64_t hidden, int64_t vectors_per_row) {
    Column c;
    if (col >= batch * vectors_per_row) return c;
    c.b = col / vectors_per_row;
    c.j0 = (col - c.b * vectors_per_row) * V;
    c.n = int(hidden - c.j0 < V ? hidden - c.j0 : V);
    return c;
}

// The column of a thread of a one-dimensional grid (the serial and the gate kernels).
template <int V, typename Params>
__device__ __forceinline__ Column thread_column(const Params& p, int64_t vectors_per_row) {
    return column_of<V>(int64_t(blockIdx.x) * blockDim.x + threadIdx.x, p.batch, p.hidden, vectors_per_row);
}

template <typename T, typename ViewT>
__device__ __forceinline__ auto column_ptr(const ViewT& v, const Column& c) {
    using P = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(v.data)>>, const T*, T*>;
    return static_cast<P>(v.data) + c.b * v.stride_b + c.j0 * v.stride_h;
}

// Shared-memory slot of (chunk, unit k, column lane): lanes are contiguous, so a warp
// reading one (chunk, k) touches 32 consecutive words (no bank conflicts).
__device__ __forceinline__ int slot(int chunk, int k, int V, int lane, int lanes) {
    return (chunk * V + k) * lanes + lane;
}

}  // namespace qrnn::cuda::kernels
