// The CUDA schedules of the diagonal first-order recurrences (ForgetMult, linear_scan),
// written once: serial in time and chunked in time, forward and backward, templated over
// a family's policy F, the storage type T (float, double, __half, __nv_bfloat16), the
// hidden units per thread V (one load of V * sizeof(T) bytes, up to 16) and the time
// steps U a thread keeps in flight. Math and the carried state are float32 (float64 for
// double); 16-bit values are widened on load, rounded on store.
//
// Every family's recurrence is h[t] = A_t(h[t-1]) with A_t affine, s -> a s + b; its
// backward walks t down with the gradient `carry` reaching h[t] from later steps:
// g = carry + grad_h[t], the step's input gradients from g and h[t-1], carry = a g; and
// finally grad_h0 = carry. The chunked kernels summarise a chunk of steps as one affine
// map and compose the summaries (carry propagation).
//
// A family is a policy struct (cuda/<family>/kernels.cuh):
//
//   a base KernelFamilyOf<Forward params, Backward params, detail::KernelFamily>
//       (common/kernel_family.cuh): its structs, kernel loader set and launchers' names
//   static constexpr int forward_inputs, backward_inputs, backward_outputs;
//   static const ConstView3& input(const Forward&, int j);   the j-th array a step reads
//   static const ConstView3& input(const Backward&, int j);  the same, backward (besides
//       grad_h[t] and h[t-1], which the schedule loads itself)
//   static const View3& output(const Backward&, int q);      the q-th array a step writes
//   template <typename M, int N> static M advance(const M (&in)[N], M s);  A_t(s) = a s + b
//   template <typename M, int N> static M decay(const M (&in)[N], M s);    a s
//   template <typename M, int N, int O>
//   static void adjoint(const M (&in)[N], M g, M h_prev, M (&out)[O]);   the step's outputs
//
// `in` is one hidden unit's inputs of step t, widened. The family writes the map itself
// (advance, decay) rather than handing over (a, b): ForgetMult's a = 1 - f is computed as
// s - f s, whose rounding differs from (1 - f) s, and keeping each family's expressions
// keeps its results what they were. The fields the schedules use by name are common to
// every family: seq_len, batch, hidden, dtype, h0 and h0_dtype (both directions), h (the
// forward's output, the backward's saved h), grad_h and grad_h0 (backward).
//
// Every array is addressed by 64-bit element strides (time, batch, hidden; any sign). A
// thread owns one batch row and V consecutive hidden units (a "column"); the vector path
// needs unit hidden strides and aligned pointers/strides (the host checks), and a thread
// at the end of a row owning fewer than V units takes the scalar tail path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/device.cuh"
#include "common/kernel_family.cuh"
#include "common/launch.hpp"

namespace qrnn::cuda::kernels {

// The arrays a family's step reads (StepArrays) or writes (GradArrays), in its own order:
// references into the kernel's parameters. Copies would be loaded once and held in
// registers all kernel long, where a parameter read at each use costs none.
template <typename F, typename Params>
struct StepArrays {
    static constexpr int count = std::is_same_v<Params, typename F::Forward> ? F::forward_inputs : F::backward_inputs;
    const Params& p;
    __device__ __forceinline__ const ConstView3& operator[](int j) const { return F::input(p, j); }
};
template <typename F>
struct GradArrays {
    static constexpr int count = F::backward_outputs;
    const typename F::Backward& p;
    __device__ __forceinline__ const View3& operator[](int q) const { return F::output(p, q); }
};

// A column's position in N (time, batch, hidden) arrays: its first unit at one step.
template <typename T, int N, typename Arrays, typename Ptr>
struct ColumnAt {
    Ptr at[N];

    __device__ __forceinline__ ColumnAt(const Arrays& a, const Column& c, int64_t t) {
#pragma unroll
        for (int j = 0; j < N; ++j) at[j] = column_ptr<T>(a[j], c) + t * a[j].stride_t;
    }
    __device__ __forceinline__ void forward(const Arrays& a) {
#pragma unroll
        for (int j = 0; j < N; ++j) at[j] += a[j].stride_t;
    }
    __device__ __forceinline__ void back(const Arrays& a) {
#pragma unroll
        for (int j = 0; j < N; ++j) at[j] -= a[j].stride_t;
    }
};
template <typename T, typename Arrays>
using ReadsAt = ColumnAt<T, Arrays::count, Arrays, const T*>;
template <typename T, typename Arrays>
using WritesAt = ColumnAt<T, Arrays::count, Arrays, T*>;

// One step's packs of N arrays at `r`, and their widened values.
template <typename T, int V, typename Arrays, int N = Arrays::count>
__device__ __forceinline__ void load_step(const Arrays& a, const ReadsAt<T, Arrays>& r, int n, Pack<T, V> (&out)[N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = load_pack<T, V>(r.at[j], n, a[j].stride_h);
}

template <typename T, int V, int N>
__device__ __forceinline__ void unpack_step(const Pack<T, V> (&packs)[N], Math<T> (&out)[N][V]) {
#pragma unroll
    for (int j = 0; j < N; ++j) unpack(packs[j], out[j]);
}

// Hidden unit k's inputs of a widened step.
template <typename M, int N, int V>
__device__ __forceinline__ void unit_of(const M (&v)[N][V], int k, M (&out)[N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = v[j][k];
}

// ---- Forward, serial in time -------------------------------------------------------
//
// A rolling buffer of U steps: consuming step t issues the loads of step t + U, so U
// steps of every input are always in flight while the state stays in registers. Pointers
// advance by the time stride (one 64-bit add per step and array). The serial kernels
// declare one block per SM as their minimum so that ptxas never squeezes them into
// spilling (it did, at 72 registers, for the float16 backward with pairs on sm_75-89).
template <typename F, typename T, int V, int U>
__global__ void __launch_bounds__(detail::kSerialThreads, 1)
scan_forward_serial(const typename F::Forward p, const int64_t vectors_per_row) {
    using M = Math<T>;
    constexpr int N = F::forward_inputs;
    const Column c = thread_column<V>(p, vectors_per_row);
    if (c.n == 0) return;
    using In = StepArrays<F, typename F::Forward>;
    const In in{p};
    ReadsAt<T, In> next(in, c, 0);  // the next step to load
    T* h_out = column_ptr<T>(p.h, c);
    const int64_t steps = p.seq_len;

    M state[V];
    load_state(p.h0, p.h0_dtype, c.b, c.j0, c.n, state);

    Pack<T, V> buf[U][N];
    auto load_next = [&](int i) {
        load_step<T, V>(in, next, c.n, buf[i]);
        next.forward(in);
    };
#pragma unroll
    for (int i = 0; i < U; ++i)
        if (i < steps) load_next(i);
    for (int64_t t0 = 0; t0 < steps; t0 += U) {
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int64_t t = t0 + i;
            if (t < steps) {
                M v[N][V];
                unpack_step(buf[i], v);
                if (t + U < steps) load_next(i);
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    M u[N];
                    unit_of(v, k, u);
                    state[k] = F::advance(u, state[k]);
                }
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

// The summary s' = a s + b of a chunk's first `steps` steps, from a = 1, b = 0: each step
// maps a to decay(a) and b to next_b(unit inputs, b).
template <typename F, typename T, int V, int U, int N, typename NextB>
__device__ __forceinline__ void summarise(int steps, const Pack<T, V> (&buf)[U][N], NextB next_b, Math<T> (&a)[V],
                                          Math<T> (&b)[V]) {
    using M = Math<T>;
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = M(1), b[k] = M(0);
#pragma unroll
    for (int i = 0; i < U; ++i) {
        if (i < steps) {
            M v[N][V];
            unpack_step(buf[i], v);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                M u[N];
                unit_of(v, k, u);
                b[k] = next_b(u, k, i, b[k]);
                a[k] = F::decay(u, a[k]);
            }
        }
    }
}

// ---- Forward, chunked in time --------------------------------------------------------

template <typename F, typename T, int V, int U>
__global__ void __launch_bounds__(detail::kChunkLanes * detail::kMaxChunks, 1)
scan_forward_chunked(const typename F::Forward p, const int64_t vectors_per_row) {
    using M = Math<T>;
    constexpr int N = F::forward_inputs;
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    ChunkSummaries<M, V> sums(smem_bytes);
    const Column c = column_of<V>(int64_t(blockIdx.x) * sums.lanes + sums.lane, p.batch, p.hidden, vectors_per_row);
    using In = StepArrays<F, typename F::Forward>;
    const In in{p};
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

        Pack<T, V> buf[U][N];
        {
            ReadsAt<T, In> next(in, c, t_begin);
#pragma unroll
            for (int i = 0; i < U; ++i) {
                if (i < steps) {
                    load_step<T, V>(in, next, c.n, buf[i]);
                    next.forward(in);
                }
            }
        }
        M a[V], b[V];
        summarise<F, T, V, U>(steps, buf, [](const M(&u)[N], int, int, M bv) { return F::advance(u, bv); }, a, b);
        M state[V];
        sums.enter(t_span > 0, parity, a, b, state);
        T* h_out = h + t_begin * p.h.stride_t;
#pragma unroll
        for (int i = 0; i < U; ++i) {
            if (i < steps) {
                M v[N][V];
                unpack_step(buf[i], v);
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    M u[N];
                    unit_of(v, k, u);
                    state[k] = F::advance(u, state[k]);
                }
                store_pack(h_out, pack_of<T, V>(state), c.n, p.h.stride_h);
                h_out += p.h.stride_t;
            }
        }
        sums.pass_on(parity, state);
    }
}

// ---- Backward ------------------------------------------------------------------------

// A backward rolling buffer: slot i holds one step's family inputs, grad_h and h[t-1] packs.
template <typename T, int V, int U, int N>
struct BackwardSlots {
    Pack<T, V> in[U][N], g[U], h[U];

    // Slot i widened; h[t-1] from its pack, or h0 at t = 0 (`has_prev` false).
    __device__ __forceinline__ void unpack_slot(int i, bool has_prev, const Math<T> (&h0)[V], Math<T> (&iv)[N][V],
                                                Math<T> (&gv)[V], Math<T> (&hv)[V]) const {
        unpack_step(in[i], iv);
        unpack(g[i], gv);
        if (has_prev) {
            unpack(h[i], hv);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) hv[k] = h0[k];
        }
    }
};

// One backward step of a column: with g = carry + grad_h, the family's adjoint gives the
// step's outputs and the carry leaves as decay(g). Stores the outputs, then moves them
// one step back.
template <typename F, typename T, int V, int N>
__device__ __forceinline__ void backward_step(const GradArrays<F>& out, int n, const Math<T> (&iv)[N][V],
                                              const Math<T> (&gv)[V], const Math<T> (&hv)[V], Math<T> (&carry)[V],
                                              WritesAt<T, GradArrays<F>>& grads) {
    using M = Math<T>;
    constexpr int O = F::backward_outputs;
    M res[O][V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        M u[N], o[O];
        unit_of(iv, k, u);
        const M g = carry[k] + gv[k];
        F::adjoint(u, g, hv[k], o);
#pragma unroll
        for (int q = 0; q < O; ++q) res[q][k] = o[q];
        carry[k] = F::decay(u, g);
    }
#pragma unroll
    for (int q = 0; q < O; ++q) store_pack(grads.at[q], pack_of<T, V>(res[q]), n, out[q].stride_h);
    grads.back(out);
}

// ---- Backward, serial in time ------------------------------------------------------
//
// The same rolling buffer walking time down: slot i holds step t's inputs, grad_h and
// h[t - 1] (h0 at t = 0, kept in registers from the start).
template <typename F, typename T, int V, int U>
__global__ void __launch_bounds__(detail::kSerialThreads, 1)
scan_backward_serial(const typename F::Backward p, const int64_t vectors_per_row) {
    using M = Math<T>;
    constexpr int N = F::backward_inputs;
    const Column c = thread_column<V>(p, vectors_per_row);
    if (c.n == 0) return;
    const int64_t last = p.seq_len - 1;
    using In = StepArrays<F, typename F::Backward>;
    const In in{p};
    const GradArrays<F> out{p};
    ReadsAt<T, In> next(in, c, last);                                     // the next step to load
    const T* g_next = column_ptr<T>(p.grad_h, c) + last * p.grad_h.stride_t;
    const T* h_next = column_ptr<T>(p.h, c) + (last - 1) * p.h.stride_t;  // h[t - 1]
    WritesAt<T, GradArrays<F>> grads(out, c, last);

    M h0[V], carry[V];
    load_state(p.h0, p.h0_dtype, c.b, c.j0, c.n, h0);
#pragma unroll
    for (int k = 0; k < V; ++k) carry[k] = M(0);

    BackwardSlots<T, V, U, N> buf;
    auto load_next = [&](int i, int64_t t) {  // step t into slot i
        load_step<T, V>(in, next, c.n, buf.in[i]);
        buf.g[i] = load_pack<T, V>(g_next, c.n, p.grad_h.stride_h);
        next.back(in);
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
                M iv[N][V], gv[V], hv[V];
                buf.unpack_slot(i, t >= 1, h0, iv, gv, hv);
                if (t - U >= 0) load_next(i, t - U);
                backward_step<F, T, V>(out, c.n, iv, gv, hv, carry, grads);
            }
        }
    }
    if (p.grad_h0.data != nullptr) store_state(p.grad_h0, p.h0_dtype, c.b, c.j0, c.n, carry);
}

// ---- Backward, chunked in time -------------------------------------------------------
//
// As scan_forward_chunked, walking spans from the end of the sequence: chunk 0 of a span
// is its latest, and the carried gradient flows from chunk q to chunk q + 1.
template <typename F, typename T, int V, int U>
__global__ void __launch_bounds__(detail::kChunkLanes * detail::kMaxChunks, 1)
scan_backward_chunked(const typename F::Backward p, const int64_t vectors_per_row) {
    using M = Math<T>;
    constexpr int N = F::backward_inputs;
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    ChunkSummaries<M, V> sums(smem_bytes);
    const Column c = column_of<V>(int64_t(blockIdx.x) * sums.lanes + sums.lane, p.batch, p.hidden, vectors_per_row);
    using In = StepArrays<F, typename F::Backward>;
    const In in{p};
    const GradArrays<F> out{p};
    const T* h = column_ptr<T>(p.h, c);
    const T* dh = column_ptr<T>(p.grad_h, c);

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

        BackwardSlots<T, V, U, N> buf;
        {
            ReadsAt<T, In> next(in, c, top);
            const T* g_next = dh + top * p.grad_h.stride_t;
            const T* h_next = h + (top - 1) * p.h.stride_t;
#pragma unroll
            for (int i = 0; i < U; ++i) {
                if (i < steps) {
                    load_step<T, V>(in, next, c.n, buf.in[i]);
                    buf.g[i] = load_pack<T, V>(g_next, c.n, p.grad_h.stride_h);
                    if (top - i >= 1) buf.h[i] = load_pack<T, V>(h_next, c.n, p.h.stride_h);
                    next.back(in);
                    g_next -= p.grad_h.stride_t;
                    h_next -= p.h.stride_t;
                }
            }
        }
        // The carried gradient's map over the chunk: g -> decay(g + grad_h) per step.
        M a[V], b[V];
        summarise<F, T, V, U>(
            steps, buf.in,
            [&](const M(&u)[N], int k, int i, M bv) {
                M gv[V];
                unpack(buf.g[i], gv);
                return F::decay(u, bv + gv[k]);
            },
            a, b);
        M carry[V];
        sums.enter(t_end < p.seq_len, parity, a, b, carry);
        M h0[V];
        if (has_first_step) {
            load_state(p.h0, p.h0_dtype, c.b, c.j0, c.n, h0);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) h0[k] = M(0);
        }
        WritesAt<T, GradArrays<F>> grads(out, c, top);
#pragma unroll
        for (int i = 0; i < U; ++i) {
            if (i < steps) {
                M iv[N][V], gv[V], hv[V];
                buf.unpack_slot(i, top - i >= 1, h0, iv, gv, hv);
                backward_step<F, T, V>(out, c.n, iv, gv, hv, carry, grads);
            }
        }
        sums.pass_on(parity, carry);
        if (has_first_step && p.grad_h0.data != nullptr) store_state(p.grad_h0, p.h0_dtype, c.b, c.j0, c.n, carry);
    }
}

// ---- A scan family's kernel table, for run_plan (common/kernel_family.cuh) -------------

template <typename F>
struct ScanKernels : KernelFamilyOf<typename F::Forward, typename F::Backward, F::family> {
    using Forward = typename F::Forward;
    using Backward = typename F::Backward;
    using KernelFamilyOf<Forward, Backward, F::family>::name;
    template <typename T>
    static constexpr int widest = 16 / int(sizeof(T));  // packs of 16 bytes

    // use(serial, chunked) of one direction; chunked is nullptr for packs over 4 bytes.
    template <typename T, int V, typename Use>
    static void of(const Forward*, Use&& use) {
        constexpr int U = detail::forward_steps(int(sizeof(T)) * V);
        if constexpr (V <= detail::chunked_max_width(int(sizeof(T))))
            use(scan_forward_serial<F, T, V, U>, scan_forward_chunked<F, T, V, U>);
        else
            use(scan_forward_serial<F, T, V, U>, nullptr);
    }
    template <typename T, int V, typename Use>
    static void of(const Backward*, Use&& use) {
        constexpr int U = detail::backward_steps(int(sizeof(T)) * V);
        if constexpr (V <= detail::chunked_max_width(int(sizeof(T))))
            use(scan_backward_serial<F, T, V, U>, scan_backward_chunked<F, T, V, U>);
        else
            use(scan_backward_serial<F, T, V, U>, nullptr);
    }

    // The serial kernel for one chunk, else the chunked one.
    template <typename T, int V, typename Params, typename Run>
    static void run(const Params& p, const LaunchPlan& plan, Run&& runner) {
        const detail::LaunchShape s = detail::launch_shape(p.batch, p.hidden, V, plan.chunks, sizeof(Math<T>));
        of<T, V>(&p, [&](auto serial, auto chunked) {
            if (s.chunks == 1) return runner(serial, s);
            if constexpr (!std::is_null_pointer_v<decltype(chunked)>) return runner(chunked, s);
            throw std::logic_error(std::string(name(&p)) + ": no chunked kernel for vector width " + std::to_string(V));
        });
    }
};

}  // namespace qrnn::cuda::kernels
