// ForgetMult CUDA kernels: the family's policy on the shared scan schedules
// (common/scan.cuh, which also says what a policy provides).
//
//   forward:  h[t] = f[t] x[t] + (1 - f[t]) h[t-1],   h[-1] = h0 (or 0)
//   backward: walking t down with the gradient `carry` reaching h[t] from later steps,
//             g = carry + dh[t]; dx[t] = f[t] g; df[t] = (x[t] - h[t-1]) g;
//             carry = g - f[t] g;  and finally dh0 = carry.
//
// Both are first-order linear recurrences s' = a s + b (forward a = 1 - f, b = f x;
// backward a = 1 - f, b = (1 - f) dh), which is what the chunked kernels use to
// summarise a chunk and compose summaries.
#pragma once

#include "common/scan.cuh"
#include "qrnn/forget_mult.hpp"

namespace qrnn::cuda::kernels {

struct ForgetMultScan
    : KernelFamilyOf<ForgetMultForwardParams, ForgetMultBackwardParams, detail::KernelFamily::forget_mult> {
    // Each step reads f and x in both directions (the backward's df needs x); it writes
    // grad_x and grad_f.
    static constexpr int forward_inputs = 2, backward_inputs = 2, backward_outputs = 2;
    __device__ __forceinline__ static const ConstView3& input(const Forward& p, int j) { return j == 0 ? p.f : p.x; }
    __device__ __forceinline__ static const ConstView3& input(const Backward& p, int j) { return j == 0 ? p.f : p.x; }
    __device__ __forceinline__ static const View3& output(const Backward& p, int q) {
        return q == 0 ? p.grad_x : p.grad_f;
    }

    // in = {f, x}. The expressions are the ones these kernels always computed (so the
    // results are bit for bit what they were): a s as s - f s, not (1 - f) s.
    template <typename M, int N>
    __device__ __forceinline__ static M advance(const M (&in)[N], M s) {
        return in[0] * in[1] + (M(1) - in[0]) * s;
    }
    template <typename M, int N>
    __device__ __forceinline__ static M decay(const M (&in)[N], M s) {
        return s - in[0] * s;
    }
    // grad_x = f g, grad_f = (x - h[t-1]) g.
    template <typename M, int N, int O>
    __device__ __forceinline__ static void adjoint(const M (&in)[N], M g, M h_prev, M (&out)[O]) {
        out[0] = in[0] * g;
        out[1] = (in[1] - h_prev) * g;
    }
};

using ForgetMultKernels = ScanKernels<ForgetMultScan>;
QRNN_KERNEL_TABLE(ForgetMultKernels)

}  // namespace qrnn::cuda::kernels
