// Host side of the fused gate kernels: launch one dtype's kernel for a vector width on
// a stream. Included by the per-dtype translation units (qrnn_gates/<dtype>.cu), each
// expanding QRNN_DEFINE_CUDA_GATES_LAUNCHERS once.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "forget_mult/launch.cuh"
#include "common/launch.hpp"
#include "qrnn_gates/kernels.cuh"

namespace qrnn::cuda::kernels {

template <typename Params, typename Kernel>
void launch_gates(const Params& p, int width, cudaStream_t stream, Kernel kernel, const char* what) {
    const int64_t vectors_per_row = (p.hidden + width - 1) / width;
    const int64_t blocks = (p.batch * vectors_per_row + kGatesThreads - 1) / kGatesThreads;
    if (blocks > 0x7fffffff) throw std::invalid_argument(std::string(what) + ": too many columns for one grid");
    kernel<<<dim3(unsigned(blocks)), dim3(kGatesThreads), 0, stream>>>(p, vectors_per_row);
    detail::check_launch(what);
}

// Calls fn(std::integral_constant<int, V>) for a width the dtype is compiled for: packs
// of 8 and 4 bytes (where that is more than one element) and 1 element.
template <typename T, typename Fn>
void dispatch_gates_width(int width, Fn&& fn) {
    constexpr int widest = gates_max_width(int(sizeof(T)));
    if (width == widest) return fn(std::integral_constant<int, widest>{});
    if constexpr (widest / 2 > 1) {
        if (width == widest / 2) return fn(std::integral_constant<int, widest / 2>{});
    }
    if (width != 1) throw std::logic_error("qrnn::cuda: no gate kernel for vector width " + std::to_string(width));
    return fn(std::integral_constant<int, 1>{});
}

template <typename T, int V>
void launch_gates_forward_v(const QrnnGatesForwardParams& p, cudaStream_t stream) {
    constexpr int U = gates_forward_steps(int(sizeof(T)) * V);
    constexpr const char* what = "qrnn::cuda::qrnn_gates_forward";
    if (p.output_gate)
        launch_gates(p, V, stream, gates_forward<T, V, U, true>, what);
    else
        launch_gates(p, V, stream, gates_forward<T, V, U, false>, what);
}

template <typename T, int V>
void launch_gates_backward_v(const QrnnGatesBackwardParams& p, cudaStream_t stream) {
    constexpr int U = gates_backward_steps(int(sizeof(T)) * V);
    constexpr const char* what = "qrnn::cuda::qrnn_gates_backward";
    if (p.output_gate)
        launch_gates(p, V, stream, gates_backward<T, V, U, true>, what);
    else
        launch_gates(p, V, stream, gates_backward<T, V, U, false>, what);
}

template <typename T>
void load_qrnn_gates_kernels() {
    constexpr int widest = gates_max_width(int(sizeof(T)));
    auto load = [](auto v) {
        constexpr int V = decltype(v)::value;
        constexpr int UF = gates_forward_steps(int(sizeof(T)) * V);
        constexpr int UB = gates_backward_steps(int(sizeof(T)) * V);
        constexpr const char* what = "qrnn::cuda: loading the fused gate kernels";
        load_kernel(gates_forward<T, V, UF, true>, what);
        load_kernel(gates_forward<T, V, UF, false>, what);
        load_kernel(gates_backward<T, V, UB, true>, what);
        load_kernel(gates_backward<T, V, UB, false>, what);
    };
    load(std::integral_constant<int, widest>{});
    if constexpr (widest / 2 > 1) load(std::integral_constant<int, widest / 2>{});
    if constexpr (widest > 1) load(std::integral_constant<int, 1>{});
}

}  // namespace qrnn::cuda::kernels

// Defines the two gate launchers of one dtype (each qrnn_gates/<dtype>.cu expands this once).
#define QRNN_DEFINE_CUDA_GATES_LAUNCHERS(DTYPE, T)                                                        \
    namespace qrnn::cuda::detail {                                                                        \
    template <>                                                                                           \
    void launch_gates_forward<DTYPE>(const QrnnGatesForwardParams& p, int width, void* stream) {          \
        kernels::dispatch_gates_width<T>(width, [&](auto v) {                                             \
            kernels::launch_gates_forward_v<T, decltype(v)::value>(p, static_cast<cudaStream_t>(stream));  \
        });                                                                                               \
    }                                                                                                     \
    template <>                                                                                           \
    void launch_gates_backward<DTYPE>(const QrnnGatesBackwardParams& p, int width, void* stream) {        \
        kernels::dispatch_gates_width<T>(width, [&](auto v) {                                             \
            kernels::launch_gates_backward_v<T, decltype(v)::value>(p, static_cast<cudaStream_t>(stream)); \
        });                                                                                               \
    }                                                                                                     \
    template <>                                                                                           \
    void load_gates_kernels<DTYPE>() {                                                                    \
        kernels::load_qrnn_gates_kernels<T>();                                                            \
    }                                                                                                     \
    }
