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

#include "common/device.cuh"
#include "common/kernel_family.cuh"
#include "common/launch.hpp"
#include "qrnn/forget_mult.hpp"

namespace qrnn::cuda::kernels {

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
