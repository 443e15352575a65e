// ForgetMult CUDA kernels, templated over the storage type T (float, double, __half,
// __nv_bfloat16), the hidden units per thread V (one load of V * sizeof(T) bytes, up to
// 16) and the time steps U a thread keeps in flight. Math and the carried state are
// float32 (float64 for double); 16-bit values are widened on load, rounded on store.
//
//   forward:  h[t] = f[t] x[t] + (1 - f[t]) h[t-1],   h[-1] = h0 (or 0)
//   backward: walking t down with the gradient `carry` reaching h[t] from later steps,
//             g = carry + dh[t]; dx[t] = f[t] g; df[t] = (x[t] - h[t-1]) g;
//             carry = g - f[t] g;  and finally dh0 = carry.
//
// Both are first-order linear recurrences s' = a s + b (forward a = 1 - f, b = f x;
// backward a = 1 - f, b = (1 - f) dh), which is what the chunked kernels use to
// summarise a chunk and compose summaries.
//
// Every array is addressed by 64-bit element strides (time, batch, hidden). A thread
// owns one batch row and V consecutive hidden units (a "column"); the vector path
// needs unit hidden strides and aligned pointers/strides (the host checks), and a
// thread at the end of a row owning fewer than V units takes the scalar tail path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/launch.hpp"
#include "qrnn/forget_mult.hpp"

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
struct alignas(sizeof(T) * V) Pack { T v[V]; };

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
__device__ __forceinline__ R load_vector(const R* p) { return __ldg(p); }
template <typename R>
__device__ __forceinline__ void store_vector(R* p, const R& r) { *p = r; }
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

template <typename T, int V>
__device__ __forceinline__ void unpack(const Pack<T, V>& pack, Math<T> (&out)[V]) {
    if constexpr (V % 2 == 0 && std::is_same_v<T, __half>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            __half2 pair;
            memcpy(&pair, &pack.v[k], sizeof(pair));
            const float2 w = __half22float2(pair);
            out[k] = w.x;
            out[k + 1] = w.y;
        }
    } else if constexpr (V % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            __nv_bfloat162 pair;
            memcpy(&pair, &pack.v[k], sizeof(pair));
            const float2 w = __bfloat1622float2(pair);
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
    if constexpr (V % 2 == 0 && std::is_same_v<T, __half>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            const __half2 pair = __floats2half2_rn(in[k], in[k + 1]);
            memcpy(&pack.v[k], &pair, sizeof(pair));
        }
    } else if constexpr (V % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            const __nv_bfloat162 pair = __floats2bfloat162_rn(in[k], in[k + 1]);
            memcpy(&pack.v[k], &pair, sizeof(pair));
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k) pack.v[k] = narrow<T>(in[k]);
    }
    return pack;
}

// ---- h0 / grad_h0: (batch, hidden), read once per column, dtype known at run time ----

template <typename M, int V>
__device__ __forceinline__ void load_state(const ConstView2& v, DType dtype, int64_t b, int64_t j0, int n,
                                           M (&out)[V]) {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = M(0);
    if (v.data == nullptr) return;
    const int64_t base = b * v.stride_b + j0 * v.stride_h;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        if (k >= n) break;
        const int64_t o = base + k * v.stride_h;
        switch (dtype) {
            case DType::float32: out[k] = M(load_element(static_cast<const float*>(v.data) + o)); break;
            case DType::float64: out[k] = M(load_element(static_cast<const double*>(v.data) + o)); break;
            case DType::bfloat16: out[k] = M(widen(load_element(static_cast<const __nv_bfloat16*>(v.data) + o))); break;
            case DType::float16: out[k] = M(widen(load_element(static_cast<const __half*>(v.data) + o))); break;
        }
    }
}

template <typename M, int V>
__device__ __forceinline__ void store_state(const View2& v, DType dtype, int64_t b, int64_t j0, int n,
                                            const M (&in)[V]) {
    const int64_t base = b * v.stride_b + j0 * v.stride_h;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        if (k >= n) break;
        const int64_t o = base + k * v.stride_h;
        switch (dtype) {
            case DType::float32: static_cast<float*>(v.data)[o] = float(in[k]); break;
            case DType::float64: static_cast<double*>(v.data)[o] = double(in[k]); break;
            case DType::bfloat16: static_cast<__nv_bfloat16*>(v.data)[o] = __float2bfloat16_rn(float(in[k])); break;
            case DType::float16: static_cast<__half*>(v.data)[o] = __float2half_rn(float(in[k])); break;
        }
    }
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

// ---- Forward, serial in time -------------------------------------------------------
//
// A rolling buffer of U steps: consuming step t issues the loads of step t + U, so U
// steps of f and x are always in flight while the state stays in registers. Pointers
// advance by the time stride (one 64-bit add per step and array). The serial kernels
// declare one block per SM as their minimum so that ptxas never squeezes them into
// spilling (it did, at 72 registers, for the float16 backward with pairs on sm_75-89).
template <typename T, int V, int U>
__global__ void __launch_bounds__(detail::kSerialThreads, 1)
forward_serial(const ForgetMultForwardParams p, const int64_t vectors_per_row) {
    using M = Math<T>;
    const Column c = thread_column<V>(p, vectors_per_row);
    if (c.n == 0) return;
    const T* f_next = column_ptr<T>(p.f, c);  // the next step to load
    const T* x_next = column_ptr<T>(p.x, c);
    T* h_out = column_ptr<T>(p.h, c);
    const int64_t steps = p.seq_len;

    M state[V];
    load_state(p.h0, p.h0_dtype, c.b, c.j0, c.n, state);

    Pack<T, V> fbuf[U], xbuf[U];
    auto load_next = [&](int i) {
        fbuf[i] = load_pack<T, V>(f_next, c.n, p.f.stride_h);
        xbuf[i] = load_pack<T, V>(x_next, c.n, p.x.stride_h);
        f_next += p.f.stride_t;
        x_next += p.x.stride_t;
    };
#pragma unroll
    for (int i = 0; i < U; ++i)
        if (i < steps) load_next(i);
    for (int64_t t0 = 0; t0 < steps; t0 += U) {
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int64_t t = t0 + i;
            if (t < steps) {
                M fv[V], xv[V];
                unpack(fbuf[i], fv);
                unpack(xbuf[i], xv);
                if (t + U < steps) load_next(i);
#pragma unroll
                for (int k = 0; k < V; ++k) state[k] = fv[k] * xv[k] + (M(1) - fv[k]) * state[k];
                store_pack(h_out, pack_of<T, V>(state), c.n, p.h.stride_h);
                h_out += p.h.stride_t;
            }
        }
    }
}

// ---- What the chunked kernels share ---------------------------------------------------
//
// Block = kChunkLanes (or kNarrowChunkLanes) columns (threadIdx.x) x C chunks of U steps
// (threadIdx.y). The block walks the sequence in spans of C * U steps; per span every thread
//   1. loads its chunk (U steps) into registers,
//   2. summarises it as s' = a s + b from a zero state, into shared memory,
//   3. composes the summaries of the earlier chunks onto the span's incoming state,
//   4. replays its chunk from registers with that start state, storing its outputs;
// the last chunk's final state is the next span's incoming state. Inputs are read from
// memory once, outputs written once. Shared memory: a and b per thread, plus the
// incoming state double-buffered by span parity (so one barrier pair per span).
template <typename M, int V>
struct ChunkSummaries {
    int lane, lanes, chunk, chunks;
    M *sum_a, *sum_b, *carry;  // carry: [2][V][lanes]

    __device__ __forceinline__ explicit ChunkSummaries(unsigned char* smem)
        : lane(threadIdx.x), lanes(blockDim.x), chunk(threadIdx.y), chunks(blockDim.y),
          sum_a(reinterpret_cast<M*>(smem)), sum_b(sum_a + chunks * V * lanes), carry(sum_b + chunks * V * lanes) {}

    __device__ __forceinline__ int at(int q, int k) const { return slot(q, k, V, lane, lanes); }

    // The state entering the first span (set by chunk 0 of the column).
    __device__ __forceinline__ void start(const M (&state)[V]) {
#pragma unroll
        for (int k = 0; k < V; ++k) carry[at(0, k)] = state[k];
    }

    // Publishes this chunk's summary and sets `state` to what enters the chunk. `later`:
    // not the first span, whose summaries others may still be reading.
    __device__ __forceinline__ void enter(bool later, int parity, const M (&a)[V], const M (&b)[V], M (&state)[V]) {
        if (later) __syncthreads();
#pragma unroll
        for (int k = 0; k < V; ++k) {
            sum_a[at(chunk, k)] = a[k];
            sum_b[at(chunk, k)] = b[k];
        }
        __syncthreads();  // summaries (and the incoming state) are visible
#pragma unroll
        for (int k = 0; k < V; ++k) state[k] = carry[at(parity, k)];
        for (int q = 0; q < chunk; ++q) {
#pragma unroll
            for (int k = 0; k < V; ++k) state[k] = sum_a[at(q, k)] * state[k] + sum_b[at(q, k)];
        }
    }

    // The last chunk's final state enters the next span.
    __device__ __forceinline__ void pass_on(int parity, const M (&state)[V]) {
        if (chunk != chunks - 1) return;
#pragma unroll
        for (int k = 0; k < V; ++k) carry[at(parity ^ 1, k)] = state[k];
    }
};

// ---- Forward, chunked in time --------------------------------------------------------

template <typename T, int V, int U>
__global__ void __launch_bounds__(detail::kChunkLanes * detail::kMaxChunks, 1)
forward_chunked(const ForgetMultForwardParams p, const int64_t vectors_per_row) {
    using M = Math<T>;
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    ChunkSummaries<M, V> sums(smem_bytes);
    const Column c = column_of<V>(int64_t(blockIdx.x) * sums.lanes + sums.lane, p.batch, p.hidden, vectors_per_row);
    const T* f = column_ptr<T>(p.f, c);
    const T* x = column_ptr<T>(p.x, c);
    T* h = column_ptr<T>(p.h, c);
    const int64_t seq_len = p.seq_len;

    if (sums.chunk == 0) {
        M h0[V];
        load_state(p.h0, p.h0_dtype, c.b, c.j0, c.n, h0);
        sums.start(h0);
    }
    const int64_t span = int64_t(sums.chunks) * U;
    int parity = 0;
    for (int64_t t_span = 0; t_span < seq_len; t_span += span, parity ^= 1) {
        const int64_t t_begin = t_span + int64_t(sums.chunk) * U;
        const int64_t left = seq_len - t_begin;
        const int steps = left <= 0 ? 0 : (left < U ? int(left) : U);

        Pack<T, V> fbuf[U], xbuf[U];
        {
            const T* f_next = f + t_begin * p.f.stride_t;
            const T* x_next = x + t_begin * p.x.stride_t;
#pragma unroll
            for (int i = 0; i < U; ++i) {
                if (i < steps) {
                    fbuf[i] = load_pack<T, V>(f_next, c.n, p.f.stride_h);
                    xbuf[i] = load_pack<T, V>(x_next, c.n, p.x.stride_h);
                    f_next += p.f.stride_t;
                    x_next += p.x.stride_t;
                }
            }
        }
        M a[V], b[V];
        summarise(steps, fbuf, xbuf, [](M fv, M xv, M bv) { return fv * xv + (M(1) - fv) * bv; }, a, b);
        M state[V];
        sums.enter(t_span > 0, parity, a, b, state);
        T* h_out = h + t_begin * p.h.stride_t;
#pragma unroll
        for (int i = 0; i < U; ++i) {
            if (i < steps) {
                M fv[V], xv[V];
                unpack(fbuf[i], fv);
                unpack(xbuf[i], xv);
#pragma unroll
                for (int k = 0; k < V; ++k) state[k] = fv[k] * xv[k] + (M(1) - fv[k]) * state[k];
                store_pack(h_out, pack_of<T, V>(state), c.n, p.h.stride_h);
                h_out += p.h.stride_t;
            }
        }
        sums.pass_on(parity, state);
    }
}

// ---- Backward ------------------------------------------------------------------------

// A backward rolling buffer: slot i holds one step's f, x, grad_h and h[t-1] packs.
template <typename T, int V, int U>
struct BackwardSlots {
    Pack<T, V> f[U], x[U], g[U], h[U];

    // Slot i widened; h[t-1] from its pack, or h0 at t = 0 (`has_prev` false).
    __device__ __forceinline__ void unpack_slot(int i, bool has_prev, const Math<T> (&h0)[V], Math<T> (&fv)[V],
                                                Math<T> (&xv)[V], Math<T> (&gv)[V], Math<T> (&hv)[V]) const {
        unpack(f[i], fv);
        unpack(x[i], xv);
        unpack(g[i], gv);
        if (has_prev) {
            unpack(h[i], hv);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) hv[k] = h0[k];
        }
    }
};

// One backward step of a column: with g = carry + dh, dx = f g, df = (x - h[t-1]) g, and
// the carry leaves as g - f g. Stores dx and df, then moves both outputs one step back.
template <typename T, int V>
__device__ __forceinline__ void backward_step(const ForgetMultBackwardParams& p, int n, const Math<T> (&fv)[V],
                                              const Math<T> (&xv)[V], const Math<T> (&gv)[V],
                                              const Math<T> (&hv)[V], Math<T> (&carry)[V], T*& dx_out,
                                              T*& df_out) {
    Math<T> dxv[V], dfv[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const Math<T> g = carry[k] + gv[k];
        dxv[k] = fv[k] * g;
        dfv[k] = (xv[k] - hv[k]) * g;
        carry[k] = g - fv[k] * g;
    }
    store_pack(dx_out, pack_of<T, V>(dxv), n, p.grad_x.stride_h);
    store_pack(df_out, pack_of<T, V>(dfv), n, p.grad_f.stride_h);
    dx_out -= p.grad_x.stride_t;
    df_out -= p.grad_f.stride_t;
}

// The summary s' = a s + b of a chunk's first `steps` slots, from a = 1, b = 0: each step
// maps s to (1 - f) s + ..., b by step(f, y, b) with y the slot's other input.
template <typename T, int V, int U, typename Step>
__device__ __forceinline__ void summarise(int steps, const Pack<T, V> (&fbuf)[U], const Pack<T, V> (&ybuf)[U],
                                          Step step, Math<T> (&a)[V], Math<T> (&b)[V]) {
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = Math<T>(1), b[k] = Math<T>(0);
#pragma unroll
    for (int i = 0; i < U; ++i) {
        if (i < steps) {
            Math<T> fv[V], yv[V];
            unpack(fbuf[i], fv);
            unpack(ybuf[i], yv);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                b[k] = step(fv[k], yv[k], b[k]);
                a[k] = a[k] - fv[k] * a[k];
            }
        }
    }
}

// ---- Backward, serial in time ------------------------------------------------------
//
// The same rolling buffer walking time down: slot i holds step t's f, x, grad_h and
// h[t - 1] (h0 at t = 0, kept in registers from the start).
template <typename T, int V, int U>
__global__ void __launch_bounds__(detail::kSerialThreads, 1)
backward_serial(const ForgetMultBackwardParams p, const int64_t vectors_per_row) {
    using M = Math<T>;
    const Column c = thread_column<V>(p, vectors_per_row);
    if (c.n == 0) return;
    const int64_t last = p.seq_len - 1;
    const T* f_next = column_ptr<T>(p.f, c) + last * p.f.stride_t;  // the next step to load
    const T* x_next = column_ptr<T>(p.x, c) + last * p.x.stride_t;
    const T* g_next = column_ptr<T>(p.grad_h, c) + last * p.grad_h.stride_t;
    const T* h_next = column_ptr<T>(p.h, c) + (last - 1) * p.h.stride_t;  // h[t - 1]
    T* dx_out = column_ptr<T>(p.grad_x, c) + last * p.grad_x.stride_t;
    T* df_out = column_ptr<T>(p.grad_f, c) + last * p.grad_f.stride_t;

    M h0[V], carry[V];
    load_state(p.h0, p.h0_dtype, c.b, c.j0, c.n, h0);
#pragma unroll
    for (int k = 0; k < V; ++k) carry[k] = M(0);

    BackwardSlots<T, V, U> buf;
    auto load_next = [&](int i, int64_t t) {  // step t into slot i
        buf.f[i] = load_pack<T, V>(f_next, c.n, p.f.stride_h);
        buf.x[i] = load_pack<T, V>(x_next, c.n, p.x.stride_h);
        buf.g[i] = load_pack<T, V>(g_next, c.n, p.grad_h.stride_h);
        f_next -= p.f.stride_t;
        x_next -= p.x.stride_t;
        g_next -= p.grad_h.stride_t;
        if (t >= 1) {
            buf.h[i] = load_pack<T, V>(h_next, c.n, p.h.stride_h);
            h_next -= p.h.stride_t;
        }
    };
#pragma unroll
    for (int i = 0; i < U; ++i)
        if (last - i >= 0) load_next(i, last - i);
    for (int64_t t0 = last; t0 >= 0; t0 -= U) {
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int64_t t = t0 - i;
            if (t >= 0) {
                M fv[V], xv[V], gv[V], hv[V];
                buf.unpack_slot(i, t >= 1, h0, fv, xv, gv, hv);
                if (t - U >= 0) load_next(i, t - U);
                backward_step(p, c.n, fv, xv, gv, hv, carry, dx_out, df_out);
            }
        }
    }
    if (p.grad_h0.data != nullptr) store_state(p.grad_h0, p.h0_dtype, c.b, c.j0, c.n, carry);
}

// ---- Backward, chunked in time -------------------------------------------------------
//
// As forward_chunked, walking spans from the end of the sequence: chunk 0 of a span is
// its latest, and the carried gradient flows from chunk q to chunk q + 1.
template <typename T, int V, int U>
__global__ void __launch_bounds__(detail::kChunkLanes * detail::kMaxChunks, 1)
backward_chunked(const ForgetMultBackwardParams p, const int64_t vectors_per_row) {
    using M = Math<T>;
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    ChunkSummaries<M, V> sums(smem_bytes);
    const Column c = column_of<V>(int64_t(blockIdx.x) * sums.lanes + sums.lane, p.batch, p.hidden, vectors_per_row);
    const T* f = column_ptr<T>(p.f, c);
    const T* x = column_ptr<T>(p.x, c);
    const T* h = column_ptr<T>(p.h, c);
    const T* dh = column_ptr<T>(p.grad_h, c);
    T* df = column_ptr<T>(p.grad_f, c);
    T* dx = column_ptr<T>(p.grad_x, c);

    if (sums.chunk == 0) {
        M zero[V];
#pragma unroll
        for (int k = 0; k < V; ++k) zero[k] = M(0);
        sums.start(zero);
    }
    const int64_t span = int64_t(sums.chunks) * U;
    int parity = 0;
    for (int64_t t_end = p.seq_len; t_end > 0; t_end -= span, parity ^= 1) {
        const int64_t top = t_end - 1 - int64_t(sums.chunk) * U;  // this chunk's latest step
        const int steps = top < 0 ? 0 : (top + 1 < U ? int(top + 1) : U);
        const bool has_first_step = steps > 0 && top - steps + 1 == 0;

        BackwardSlots<T, V, U> buf;
        {
            const T* f_next = f + top * p.f.stride_t;
            const T* x_next = x + top * p.x.stride_t;
            const T* g_next = dh + top * p.grad_h.stride_t;
            const T* h_next = h + (top - 1) * p.h.stride_t;
#pragma unroll
            for (int i = 0; i < U; ++i) {
                if (i < steps) {
                    buf.f[i] = load_pack<T, V>(f_next, c.n, p.f.stride_h);
                    buf.g[i] = load_pack<T, V>(g_next, c.n, p.grad_h.stride_h);
                    buf.x[i] = load_pack<T, V>(x_next, c.n, p.x.stride_h);
                    if (top - i >= 1) buf.h[i] = load_pack<T, V>(h_next, c.n, p.h.stride_h);
                    f_next -= p.f.stride_t;
                    g_next -= p.grad_h.stride_t;
                    x_next -= p.x.stride_t;
                    h_next -= p.h.stride_t;
                }
            }
        }
        M a[V], b[V];
        summarise(steps, buf.f, buf.g, [](M fv, M gv, M bv) {
            const M g = bv + gv;
            return g - fv * g;
        }, a, b);
        M carry[V];
        sums.enter(t_end < p.seq_len, parity, a, b, carry);
        M h0[V];
        if (has_first_step) {
            load_state(p.h0, p.h0_dtype, c.b, c.j0, c.n, h0);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) h0[k] = M(0);
        }
        T* dx_out = dx + top * p.grad_x.stride_t;
        T* df_out = df + top * p.grad_f.stride_t;
#pragma unroll
        for (int i = 0; i < U; ++i) {
            if (i < steps) {
                M fv[V], xv[V], gv[V], hv[V];
                buf.unpack_slot(i, top - i >= 1, h0, fv, xv, gv, hv);
                backward_step(p, c.n, fv, xv, gv, hv, carry, dx_out, df_out);
            }
        }
        sums.pass_on(parity, carry);
        if (has_first_step && p.grad_h0.data != nullptr)
            store_state(p.grad_h0, p.h0_dtype, c.b, c.j0, c.n, carry);
    }
}

// ---- Which kernel runs a plan: host code shared by the launchers and the host emulator ----

// Calls run(kernel, shape) with the kernel of `Kernels` (ForgetMultKernels below, or
// GateKernels) and the grid that run `p` with `plan`, storage T.
template <typename Kernels, typename T, typename Params, typename Run>
void run_plan(const Params& p, const LaunchPlan& plan, Run&& runner) {
    detail::dispatch_width<Kernels::template widest<T>>(plan.vector_width, [&](auto v) {
        Kernels::template run<T, decltype(v)::value>(p, plan, runner);
    });
}

// Calls use(kernel, kernel or nullptr) for every kernel of `Kernels` for storage T: each
// direction and width.
template <typename Kernels, typename T, typename Use>
void for_each_kernel(Use&& use) {
    detail::for_each_width<Kernels::template widest<T>>([&](auto v) {
        Kernels::template of<T, decltype(v)::value>(static_cast<const typename Kernels::Forward*>(nullptr), use);
        Kernels::template of<T, decltype(v)::value>(static_cast<const typename Kernels::Backward*>(nullptr), use);
    });
}

// What names a family's kernels (the base of ForgetMultKernels and GateKernels): its
// parameter structs and which loader set it is.
template <typename ForwardParams, typename BackwardParams, detail::KernelFamily F>
struct KernelFamilyOf {
    using Forward = ForwardParams;
    using Backward = BackwardParams;
    static constexpr detail::KernelFamily family = F;
};

struct ForgetMultKernels
    : KernelFamilyOf<ForgetMultForwardParams, ForgetMultBackwardParams, detail::KernelFamily::forget_mult> {
    static constexpr const char* name(const Forward*) { return "qrnn::cuda::forget_mult_forward"; }
    static constexpr const char* name(const Backward*) { return "qrnn::cuda::forget_mult_backward"; }
    template <typename T>
    static constexpr int widest = 16 / int(sizeof(T));  // packs of 16 bytes

    // use(serial, chunked) of one direction; chunked is nullptr for packs over 4 bytes.
    template <typename T, int V, typename Use>
    static void of(const Forward*, Use&& use) {
        constexpr int U = detail::forward_steps(int(sizeof(T)) * V);
        if constexpr (V <= detail::chunked_max_width(int(sizeof(T)))) use(forward_serial<T, V, U>, forward_chunked<T, V, U>);
        else use(forward_serial<T, V, U>, nullptr);
    }
    template <typename T, int V, typename Use>
    static void of(const Backward*, Use&& use) {
        constexpr int U = detail::backward_steps(int(sizeof(T)) * V);
        if constexpr (V <= detail::chunked_max_width(int(sizeof(T)))) use(backward_serial<T, V, U>, backward_chunked<T, V, U>);
        else use(backward_serial<T, V, U>, nullptr);
    }

    // The serial kernel for one chunk, else the chunked one.
    template <typename T, int V, typename Params, typename Run>
    static void run(const Params& p, const LaunchPlan& plan, Run&& runner) {
        const detail::LaunchShape s = detail::launch_shape(p.batch, p.hidden, V, plan.chunks, sizeof(Math<T>));
        of<T, V>(&p, [&](auto serial, auto chunked) {
            if (s.chunks == 1) return runner(serial, s);
            if constexpr (!std::is_null_pointer_v<decltype(chunked)>) return runner(chunked, s);
            throw std::logic_error("qrnn::cuda: no chunked ForgetMult kernel for vector width " + std::to_string(V));
        });
    }
};

}  // namespace qrnn::cuda::kernels
