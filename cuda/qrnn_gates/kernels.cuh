// Fused QRNN gate CUDA kernels (activations + ForgetMult + output gate; the math and
// layout of qrnn/qrnn_gates.hpp), templated over the storage type T, the hidden units
// per thread V and the steps of loads a thread keeps in flight U. Math and the carried
// state are float32 (float64 for double); the packs, widening and state helpers are
// the ones ForgetMult's kernels use too (common/device.cuh).
//
// A thread owns one batch row b and V consecutive hidden units and walks that row's
// valid steps k = 0 .. valid - 1, at time t = k, or valid - 1 - k when `reverse`. Like
// the serial ForgetMult kernels it keeps a rolling buffer of U steps of loads, so U
// steps of G (and the mask, and in the backward the saved c[t-1] and the output's
// gradient) are in flight while the state stays in registers. Steps at or after the
// row's end are padding and are written as zeros.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/device.cuh"
#include "common/kernel_family.cuh"
#include "common/launch.hpp"
#include "qrnn/qrnn_gates.hpp"

namespace qrnn::cuda::kernels {

// Threads per block. The kernels declare __launch_bounds__(kGatesThreads, 1): with no
// blocks-per-SM target ptxas never squeezes them into spilling (it did on sm_75-89 for
// some float64 and bfloat16 variants, around 96 registers); the widest use up to ~170.
constexpr int kGatesThreads = 128;
// Packs of at most 8 bytes: a backward step holds six of them per slot in registers.
constexpr int gates_max_width(int elem_size) { return elem_size >= 8 ? 1 : 8 / elem_size; }
// Steps of loads in flight per thread, by pack size: what fits in registers without
// spilling next to the activations' math (CI's resource report checks).
constexpr int gates_forward_steps(int pack_bytes) { return pack_bytes <= 4 ? 8 : 4; }
constexpr int gates_backward_steps(int pack_bytes) { return pack_bytes <= 4 ? 4 : 2; }

__device__ __forceinline__ float tanh_of(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_of(double x) { return tanh(x); }
// sigmoid(x) = (1 + tanh(x / 2)) / 2, as the CPU kernels compute it: no division (a
// float64 division calls a slow path that would spill).
__device__ __forceinline__ float sigmoid_of(float x) { return 0.5f * tanhf(0.5f * x) + 0.5f; }
__device__ __forceinline__ double sigmoid_of(double x) { return 0.5 * tanh(0.5 * x) + 0.5; }

// Valid steps of row b: lengths[b] clamped to 0..seq_len (the host cannot check device
// lengths, so a bad value is clamped here rather than read past the arrays), or seq_len.
template <typename Params>
__device__ __forceinline__ int64_t valid_steps(const Params& p, int64_t b) {
    if (p.lengths == nullptr) return p.seq_len;
    const int64_t len = load_element(p.lengths + b * p.lengths_stride);
    return len < 0 ? 0 : (len > p.seq_len ? p.seq_len : len);
}

__device__ __forceinline__ int64_t step_time(int64_t k, int64_t valid, bool reverse) {
    return reverse ? valid - 1 - k : k;
}

// The column's first element of an optional array (null when the array is absent).
template <typename T, typename ViewT>
__device__ __forceinline__ auto optional_column(const ViewT& v, const Column& c) {
    return v.data ? column_ptr<T>(v, c) : nullptr;
}

template <typename T, int V>
__device__ __forceinline__ void zero_pack(T* p, int n, int64_t stride_h) {
    Pack<T, V> zero;
#pragma unroll
    for (int k = 0; k < V; ++k) zero.v[k] = narrow<T>(Math<T>(0));
    store_pack(p, zero, n, stride_h);
}

// A rolling buffer of U steps of what both directions load for one column: the gates Z,
// F (and O) and the zoneout mask (ones when absent).
template <typename T, int V, int U, bool OutputGate>
struct GateBuffers {
    const T* gates;
    const T* mask;  // null when absent
    int64_t gs;     // gate stride
    Pack<T, V> z[U], f[U], o[U], keep[U];

    template <typename Params>
    __device__ __forceinline__ GateBuffers(const Params& p, const Column& c)
        : gates(column_ptr<T>(p.gates, c)), mask(optional_column<T>(p.forget_mask, c)), gs(p.gate_stride) {}

    // Step t into slot i.
    template <typename Params>
    __device__ __forceinline__ void load(int i, const Params& p, int64_t t, int n) {
        const T* g = gates + t * p.gates.stride_t;
        z[i] = load_pack<T, V>(g, n, p.gates.stride_h);
        f[i] = load_pack<T, V>(g + gs, n, p.gates.stride_h);
        if (OutputGate) o[i] = load_pack<T, V>(g + 2 * gs, n, p.gates.stride_h);
        if (mask) keep[i] = load_pack<T, V>(mask + t * p.forget_mask.stride_t, n, p.forget_mask.stride_h);
    }

    __device__ __forceinline__ void unpack_slot(int i, Math<T> (&zv)[V], Math<T> (&fv)[V], Math<T> (&ov)[V],
                                                Math<T> (&kv)[V]) const {
        unpack(z[i], zv);
        unpack(f[i], fv);
        if (OutputGate) unpack(o[i], ov);
        if (mask) {
            unpack(keep[i], kv);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) kv[k] = Math<T>(1);
        }
    }
};

// ---- Forward ------------------------------------------------------------------------

template <typename T, int V, int U, bool OutputGate>
__global__ void __launch_bounds__(kGatesThreads, 1)
gates_forward(const QrnnGatesForwardParams p, const int64_t vectors_per_row) {
    using M = Math<T>;
    const Column c = thread_column<V>(p, vectors_per_row);
    if (c.n == 0) return;
    GateBuffers<T, V, U, OutputGate> buf(p, c);
    T* out = column_ptr<T>(p.output, c);
    T* states = optional_column<T>(p.states, c);
    const int64_t valid = valid_steps(p, c.b);
    const M scale = M(p.forget_scale);

    M state[V];
    load_state(p.c0, p.c0_dtype, c.b, c.j0, c.n, state);

    auto load_step = [&](int slot, int64_t k) { buf.load(slot, p, step_time(k, valid, p.reverse), c.n); };
#pragma unroll
    for (int i = 0; i < U; ++i)
        if (i < valid) load_step(i, i);
    for (int64_t k0 = 0; k0 < valid; k0 += U) {
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int64_t k = k0 + i;
            if (k >= valid) break;
            M z[V], f[V], o[V], keep[V];
            buf.unpack_slot(i, z, f, o, keep);
            if (k + U < valid) load_step(i, k + U);
            M h[V];
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const M fj = sigmoid_of(f[j]) * keep[j] * scale;
                state[j] = fj * tanh_of(z[j]) + (M(1) - fj) * state[j];
                h[j] = OutputGate ? sigmoid_of(o[j]) * state[j] : state[j];
            }
            const int64_t t = step_time(k, valid, p.reverse);
            store_pack(out + t * p.output.stride_t, pack_of<T, V>(h), c.n, p.output.stride_h);
            if (states) store_pack(states + t * p.states.stride_t, pack_of<T, V>(state), c.n, p.states.stride_h);
        }
    }
    for (int64_t t = valid; t < p.seq_len; ++t) {  // padding, in either direction
        zero_pack<T, V>(out + t * p.output.stride_t, c.n, p.output.stride_h);
        if (states) zero_pack<T, V>(states + t * p.states.stride_t, c.n, p.states.stride_h);
    }
    if (p.c_n.data) store_state(p.c_n, p.c_n_dtype, c.b, c.j0, c.n, state);
}

// ---- Backward -----------------------------------------------------------------------
//
// The forward's steps in reverse order, with `carry` the gradient reaching c[t] from
// later steps (grad_c_n at the start). Activations are recomputed from G, and c[t] from
// the saved c[t-1] (c0 before the first step), as the CPU kernel does.
template <typename T, int V, int U, bool OutputGate>
__global__ void __launch_bounds__(kGatesThreads, 1)
gates_backward(const QrnnGatesBackwardParams p, const int64_t vectors_per_row) {
    using M = Math<T>;
    const Column c = thread_column<V>(p, vectors_per_row);
    if (c.n == 0) return;
    GateBuffers<T, V, U, OutputGate> buf(p, c);
    const T* states = column_ptr<T>(p.states, c);
    const T* dout = optional_column<T>(p.grad_output, c);
    T* dgates = column_ptr<T>(p.grad_gates, c);
    const int64_t dgs = p.grad_gate_stride, valid = valid_steps(p, c.b);
    const M scale = M(p.forget_scale);

    for (int64_t t = valid; t < p.seq_len; ++t) {  // padding steps have zero gradients
        T* row = dgates + t * p.grad_gates.stride_t;
        zero_pack<T, V>(row, c.n, p.grad_gates.stride_h);
        zero_pack<T, V>(row + dgs, c.n, p.grad_gates.stride_h);
        if (OutputGate) zero_pack<T, V>(row + 2 * dgs, c.n, p.grad_gates.stride_h);
    }
    M carry[V], c0[V];
    load_state(p.grad_c_n, p.c_n_dtype, c.b, c.j0, c.n, carry);
    load_state(p.c0, p.c0_dtype, c.b, c.j0, c.n, c0);

    Pack<T, V> dbuf[U], cbuf[U];
    auto load_step = [&](int slot, int64_t k) {  // step k's G, mask and output gradient, and c[k - 1]
        const int64_t t = step_time(k, valid, p.reverse);
        buf.load(slot, p, t, c.n);
        if (dout) dbuf[slot] = load_pack<T, V>(dout + t * p.grad_output.stride_t, c.n, p.grad_output.stride_h);
        if (k >= 1)
            cbuf[slot] = load_pack<T, V>(states + step_time(k - 1, valid, p.reverse) * p.states.stride_t, c.n,
                                         p.states.stride_h);
    };
#pragma unroll
    for (int i = 0; i < U; ++i)
        if (valid - 1 - i >= 0) load_step(i, valid - 1 - i);
    for (int64_t k0 = valid - 1; k0 >= 0; k0 -= U) {
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int64_t k = k0 - i;
            if (k < 0) break;
            M z[V], f[V], o[V], keep[V], dh[V], cp[V];
            buf.unpack_slot(i, z, f, o, keep);
            if (dout) {
                unpack(dbuf[i], dh);
            } else {
#pragma unroll
                for (int j = 0; j < V; ++j) dh[j] = M(0);
            }
            if (k >= 1) {
                unpack(cbuf[i], cp);
            } else {
#pragma unroll
                for (int j = 0; j < V; ++j) cp[j] = c0[j];
            }
            if (k - U >= 0) load_step(i, k - U);
            M dz[V], df[V], dov[V];
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const M zt = tanh_of(z[j]), s = sigmoid_of(f[j]);
                const M kf = keep[j] * scale, fj = s * kf;
                M g;
                if (OutputGate) {
                    const M ot = sigmoid_of(o[j]);
                    const M cj = fj * zt + (M(1) - fj) * cp[j];
                    g = carry[j] + dh[j] * ot;
                    dov[j] = dh[j] * cj * ot * (M(1) - ot);
                } else {
                    g = carry[j] + dh[j];
                    dov[j] = M(0);
                }
                dz[j] = fj * g * (M(1) - zt * zt);
                df[j] = (zt - cp[j]) * g * kf * s * (M(1) - s);
                carry[j] = g - fj * g;
            }
            T* row = dgates + step_time(k, valid, p.reverse) * p.grad_gates.stride_t;
            store_pack(row, pack_of<T, V>(dz), c.n, p.grad_gates.stride_h);
            store_pack(row + dgs, pack_of<T, V>(df), c.n, p.grad_gates.stride_h);
            if (OutputGate) store_pack(row + 2 * dgs, pack_of<T, V>(dov), c.n, p.grad_gates.stride_h);
        }
    }
    if (p.grad_c0.data) store_state(p.grad_c0, p.c0_dtype, c.b, c.j0, c.n, carry);
}

// ---- The kernels as the launchers and the emulator pick them (run_plan) ----------------

struct GateKernels : KernelFamilyOf<QrnnGatesForwardParams, QrnnGatesBackwardParams, detail::KernelFamily::qrnn_gates> {
    template <typename T>
    static constexpr int widest = gates_max_width(int(sizeof(T)));

    // use(with the output gate, without) of one direction.
    template <typename T, int V, typename Use>
    static void of(const Forward*, Use&& use) {
        constexpr int U = gates_forward_steps(int(sizeof(T)) * V);
        use(gates_forward<T, V, U, true>, gates_forward<T, V, U, false>);
    }
    template <typename T, int V, typename Use>
    static void of(const Backward*, Use&& use) {
        constexpr int U = gates_backward_steps(int(sizeof(T)) * V);
        use(gates_backward<T, V, U, true>, gates_backward<T, V, U, false>);
    }

    // One thread per (batch row, vector of hidden units), kGatesThreads per block.
    template <typename T, int V, typename Params, typename Run>
    static void run(const Params& p, const LaunchPlan&, Run&& runner) {
        const detail::LaunchShape s = detail::launch_shape(p.batch, p.hidden, V, 1, 0, kGatesThreads);
        of<T, V>(&p, [&](auto with_gate, auto without_gate) {
            p.output_gate ? runner(with_gate, s) : runner(without_gate, s);
        });
    }
};
QRNN_KERNEL_TABLE(GateKernels)

}  // namespace qrnn::cuda::kernels
