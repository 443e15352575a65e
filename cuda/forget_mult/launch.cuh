// Host side of the CUDA kernels: launch the plan's kernel of one dtype and vector width
// on a stream, then check the launch. Included by the per-dtype translation units
// (forget_mult/<dtype>.cu), each expanding QRNN_DEFINE_CUDA_LAUNCHERS once.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "forget_mult/kernels.cuh"
#include "common/launch.hpp"

namespace qrnn::cuda::kernels {

template <typename T, int V, typename Params, typename Serial, typename Chunked>
void launch(const Params& p, int chunks, cudaStream_t stream, Serial serial, Chunked chunked, const char* what) {
    const detail::LaunchShape s = detail::launch_shape(p.batch, p.hidden, V, chunks, sizeof(Math<T>));
    if (s.blocks > 0x7fffffff) throw std::invalid_argument(std::string(what) + ": too many columns for one grid");
    if (s.chunks == 1) {
        serial<<<dim3(unsigned(s.blocks)), dim3(s.lanes), 0, stream>>>(p, s.vectors_per_row);
    } else if constexpr (!std::is_same_v<Chunked, std::nullptr_t>) {
        chunked<<<dim3(unsigned(s.blocks)), dim3(s.lanes, s.chunks), size_t(s.shared_bytes), stream>>>(
            p, s.vectors_per_row);
    } else {
        throw std::logic_error(std::string(what) + ": no chunked kernel for this vector width");
    }
    detail::check_launch(what);
}

// The chunked kernels exist for packs of at most 4 bytes (detail::chunked_max_width).
template <typename T, int V>
constexpr bool has_chunked = V <= detail::chunked_max_width(int(sizeof(T)));

template <typename T, int V>
void launch_forward_v(const ForgetMultForwardParams& p, int chunks, cudaStream_t stream) {
    constexpr int U = detail::forward_steps(int(sizeof(T)) * V);
    constexpr const char* what = "qrnn::cuda::forget_mult_forward";
    if constexpr (has_chunked<T, V>)
        launch<T, V>(p, chunks, stream, forward_serial<T, V, U>, forward_chunked<T, V, U>, what);
    else
        launch<T, V>(p, chunks, stream, forward_serial<T, V, U>, nullptr, what);
}

template <typename T, int V>
void launch_backward_v(const ForgetMultBackwardParams& p, int chunks, cudaStream_t stream) {
    constexpr int U = detail::backward_steps(int(sizeof(T)) * V);
    constexpr const char* what = "qrnn::cuda::forget_mult_backward";
    if constexpr (has_chunked<T, V>)
        launch<T, V>(p, chunks, stream, backward_serial<T, V, U>, backward_chunked<T, V, U>, what);
    else
        launch<T, V>(p, chunks, stream, backward_serial<T, V, U>, nullptr, what);
}

// Calls launch(std::integral_constant<int, V>) for a vector width the dtype is compiled
// for: 16, 8 and 4 bytes per pack (where that is more than one element) and 1 element.
template <typename T, typename Launch>
void dispatch_width(int width, Launch&& launch) {
    constexpr int widest = 16 / int(sizeof(T));
    if (width == widest) return launch(std::integral_constant<int, widest>{});
    if constexpr (widest / 2 > 1) {
        if (width == widest / 2) return launch(std::integral_constant<int, widest / 2>{});
    }
    if constexpr (widest / 4 > 1) {
        if (width == widest / 4) return launch(std::integral_constant<int, widest / 4>{});
    }
    if (width != 1) throw std::logic_error("qrnn::cuda: no kernel for vector width " + std::to_string(width));
    return launch(std::integral_constant<int, 1>{});
}

// Calls fn(std::integral_constant<int, V>) for every width dispatch_width accepts.
template <typename T, typename Fn>
void for_each_width(Fn&& fn) {
    constexpr int widest = 16 / int(sizeof(T));
    fn(std::integral_constant<int, widest>{});
    if constexpr (widest / 2 > 1) fn(std::integral_constant<int, widest / 2>{});
    if constexpr (widest / 4 > 1) fn(std::integral_constant<int, widest / 4>{});
    if constexpr (widest > 1) fn(std::integral_constant<int, 1>{});
}

template <typename Kernel>
void load_kernel(Kernel kernel, const char* what) {
    cudaFuncAttributes attributes;
    detail::check_cuda(int(cudaFuncGetAttributes(&attributes, kernel)), what);
}

template <typename T>
void load_forget_mult_kernels() {
    for_each_width<T>([](auto v) {
        constexpr int V = decltype(v)::value;
        constexpr int UF = detail::forward_steps(int(sizeof(T)) * V);
        constexpr int UB = detail::backward_steps(int(sizeof(T)) * V);
        constexpr const char* what = "qrnn::cuda: loading the ForgetMult kernels";
        load_kernel(forward_serial<T, V, UF>, what);
        load_kernel(backward_serial<T, V, UB>, what);
        if constexpr (has_chunked<T, V>) {
            load_kernel(forward_chunked<T, V, UF>, what);
            load_kernel(backward_chunked<T, V, UB>, what);
        }
    });
}

}  // namespace qrnn::cuda::kernels

// Defines the two launchers of one dtype (each forget_mult/<dtype>.cu expands this once).
#define QRNN_DEFINE_CUDA_LAUNCHERS(DTYPE, T)                                                               \
    namespace qrnn::cuda::detail {                                                                         \
    template <>                                                                                            \
    void launch_forward<DTYPE>(const ForgetMultForwardParams& p, const LaunchPlan& plan, void* stream) {   \
        kernels::dispatch_width<T>(plan.vector_width, [&](auto v) {                                        \
            kernels::launch_forward_v<T, decltype(v)::value>(p, plan.chunks, static_cast<cudaStream_t>(stream)); \
        });                                                                                                \
    }                                                                                                      \
    template <>                                                                                            \
    void launch_backward<DTYPE>(const ForgetMultBackwardParams& p, const LaunchPlan& plan, void* stream) { \
        kernels::dispatch_width<T>(plan.vector_width, [&](auto v) {                                        \
            kernels::launch_backward_v<T, decltype(v)::value>(p, plan.chunks, static_cast<cudaStream_t>(stream)); \
        });                                                                                                \
    }                                                                                                      \
    template <>                                                                                            \
    void load_kernels<DTYPE>() {                                                                           \
        kernels::load_forget_mult_kernels<T>();                                                            \
    }                                                                                                      \
    }
