// Host side of the CUDA kernels: launch the kernel and grid a plan runs (run_plan, in
// common/kernel_family.cuh) on a stream and check the launch; load a family's kernels.
// Included by the per-dtype translation units (<family>/<dtype>.cu), each expanding
// QRNN_DEFINE_CUDA_LAUNCHERS once for its family.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/device.cuh"
#include "common/kernel_family.cuh"
#include "common/launch.hpp"

namespace qrnn::cuda::kernels {

template <typename Kernels, typename T, typename Params>
void launch_plan(const Params& p, const LaunchPlan& plan, cudaStream_t stream) {
    const char* what = Kernels::name(&p);
    run_plan<Kernels, T>(p, plan, [&](auto kernel, const detail::LaunchShape& s) {
        if (s.blocks > 0x7fffffff) throw std::invalid_argument(std::string(what) + ": too many columns for one grid");
        kernel<<<dim3(unsigned(s.blocks)), dim3(s.lanes, s.chunks), size_t(s.shared_bytes), stream>>>(
            p, s.vectors_per_row);
        detail::check_launch(what);
    });
}

template <typename Kernels, typename T>
void load_family() {
    const std::string text = std::string("qrnn::cuda: loading the kernels of ") +
                             Kernels::name(static_cast<const typename Kernels::Forward*>(nullptr));
    const char* what = text.c_str();
    for_each_kernel<Kernels, T>([&](auto a, auto b) {
        cudaFuncAttributes attributes;
        detail::check_cuda(int(cudaFuncGetAttributes(&attributes, a)), what);
        if constexpr (!std::is_null_pointer_v<decltype(b)>)
            detail::check_cuda(int(cudaFuncGetAttributes(&attributes, b)), what);
    });
}

}  // namespace qrnn::cuda::kernels

// Defines the launchers and the loader of one op family (KERNELS: kernels::ForgetMultKernels
// or kernels::GateKernels, whose header the translation unit includes) for one dtype.
#define QRNN_DEFINE_CUDA_LAUNCHERS(DTYPE, KERNELS)                                                                   \
    namespace qrnn::cuda::detail {                                                                                   \
    template <>                                                                                                      \
    void launch<DTYPE>(const kernels::KERNELS::Forward& p, const LaunchPlan& plan, void* stream) {                   \
        kernels::launch_plan<kernels::KERNELS, kernels::Storage<DTYPE>>(p, plan, static_cast<cudaStream_t>(stream)); \
    }                                                                                                                \
    template <>                                                                                                      \
    void launch<DTYPE>(const kernels::KERNELS::Backward& p, const LaunchPlan& plan, void* stream) {                  \
        kernels::launch_plan<kernels::KERNELS, kernels::Storage<DTYPE>>(p, plan, static_cast<cudaStream_t>(stream)); \
    }                                                                                                                \
    template <>                                                                                                      \
    void load_kernels<DTYPE, kernels::KERNELS::family>() {                                                           \
        kernels::load_family<kernels::KERNELS, kernels::Storage<DTYPE>>();                                           \
    }                                                                                                                \
    }
