// linear_scan CUDA kernels: the family's policy on the shared scan schedules
// (common/scan.cuh, which also says what a policy provides).
//
//   forward:  h[t] = a[t] h[t-1] + b[t],   h[-1] = h0 (or 0)
//   backward: walking t down with the gradient `carry` reaching h[t] from later steps,
//             g = carry + dh[t]; db[t] = g; da[t] = h[t-1] g; carry = a[t] g;
//             and finally dh0 = carry.
#pragma once

#include "common/scan.cuh"
#include "qrnn/linear_scan.hpp"

namespace qrnn::cuda::kernels {

struct LinearScan
    : KernelFamilyOf<LinearScanForwardParams, LinearScanBackwardParams, detail::KernelFamily::linear_scan> {
    // The forward reads a and b per step; the backward only a (b does not enter the
    // gradients) and writes grad_a and grad_b.
    static constexpr int forward_inputs = 2, backward_inputs = 1, backward_outputs = 2;
    __device__ __forceinline__ static const ConstView3& input(const Forward& p, int j) { return j == 0 ? p.a : p.b; }
    __device__ __forceinline__ static const ConstView3& input(const Backward& p, int) { return p.a; }
    __device__ __forceinline__ static const View3& output(const Backward& p, int q) {
        return q == 0 ? p.grad_a : p.grad_b;
    }

    // in = {a, b} forward, {a} backward.
    template <typename M, int N>
    __device__ __forceinline__ static M advance(const M (&in)[N], M s) {
        return in[0] * s + in[1];
    }
    template <typename M, int N>
    __device__ __forceinline__ static M decay(const M (&in)[N], M s) {
        return in[0] * s;
    }
    // grad_a = h[t-1] g, grad_b = g.
    template <typename M, int N, int O>
    __device__ __forceinline__ static void adjoint(const M (&)[N], M g, M h_prev, M (&out)[O]) {
        out[0] = h_prev * g;
        out[1] = g;
    }
};

using LinearScanKernels = ScanKernels<LinearScan>;
QRNN_KERNEL_TABLE(LinearScanKernels)

}  // namespace qrnn::cuda::kernels
