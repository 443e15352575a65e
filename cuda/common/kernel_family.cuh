// Host code both op families share: which kernel and grid a launch plan runs (run_plan),
// every kernel of a family (for_each_kernel, the loader's walk), and the base of each
// family's kernel table (forget_mult/kernels.cuh's ForgetMultKernels, qrnn_gates/
// kernels.cuh's GateKernels). Used by the launchers (common/launch.cuh) and the host
// emulator (tests/cuda_emulation).
#pragma once

#include "common/launch.hpp"

namespace qrnn::cuda::kernels {

// Calls run(kernel, shape) with the kernel of `Kernels` (ForgetMultKernels or
// GateKernels) and the grid that run `p` with `plan`, storage T.
template <typename Kernels, typename T, typename Params, typename Run>
void run_plan(const Params& p, const LaunchPlan& plan, Run&& runner) {
    detail::dispatch_width<Kernels::template widest<T>>(
        plan.vector_width, [&](auto v) { Kernels::template run<T, decltype(v)::value>(p, plan, runner); });
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

// What names a family's kernels (the base of each family's policy or kernel table): its
// parameter structs, which loader set it is, and its launchers' names (in launch errors).
template <typename ForwardParams, typename BackwardParams, detail::KernelFamily F>
struct KernelFamilyOf {
    using Forward = ForwardParams;
    using Backward = BackwardParams;
    static constexpr detail::KernelFamily family = F;
    static constexpr const char* name(const Forward*) { return detail::kForwardNames[int(F)]; }
    static constexpr const char* name(const Backward*) { return detail::kBackwardNames[int(F)]; }
};

// The kernel table of a parameter struct (TableOf<Params>::type), for code that starts from
// the struct (the host emulator); each family's kernels.cuh names its table with
// QRNN_KERNEL_TABLE.
template <typename Params>
struct TableOf;

}  // namespace qrnn::cuda::kernels

// In namespace qrnn::cuda::kernels: `Table` serves its Forward and Backward structs.
#define QRNN_KERNEL_TABLE(Table)      \
    template <>                       \
    struct TableOf<Table::Forward> {  \
        using type = Table;           \
    };                                \
    template <>                       \
    struct TableOf<Table::Backward> { \
        using type = Table;           \
    };
