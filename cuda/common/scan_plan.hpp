// The CUDA entry points of the scan families (ForgetMult, linear_scan; common/scan.cuh):
// validate like the CPU path (common/scan_check.hpp; sequences are refused), choose the
// launch plan (the vector width from the alignment of every array, serial or chunked in
// time from the size), then hand over to the launcher of the dtype's translation unit.
// Plain C++; a family's entry.cu defines its launchers with QRNN_CUDA_SCAN_ENTRY_POINTS.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/check.hpp"
#include "common/launch.hpp"
#include "common/scan_check.hpp"
#include "qrnn/cuda_schedule.hpp"

namespace qrnn::cuda::detail {

inline void check_schedule(Schedule s) {
    if (int(s) < 0 || int(s) > 2)
        qrnn::detail::fail("schedule: expected 0 (automatic), 1 (serial) or 2 (chunked), got " +
                           std::to_string(int(s)));
}

inline int64_t steps_in_flight(bool backward, int vector_width, int64_t elem_size) {
    const int pack_bytes = int(vector_width * elem_size);
    return backward ? backward_steps(pack_bytes) : forward_steps(pack_bytes);
}

// The size rule (cuda/NOTES.md). The serial schedule keeps `steps` time steps of loads in
// flight per thread, B * H * bytes * arrays_per_step * steps bytes in all (arrays_per_step:
// the arrays each step reads); when that is under kBytesInFlight and the sequence is at
// least 4 * steps long, split time into chunks so that chunks * that covers
// kBytesInFlight (at most kMaxChunks, at most the sequence). `arrays`: every array of the
// call, inputs and outputs, for the vector width.
template <typename Arrays = std::initializer_list<Strided>>
LaunchPlan scan_plan(DType dtype, int64_t T, int64_t B, int64_t H, bool backward, int arrays_per_step,
                     Schedule schedule, const Arrays& arrays) {
    const int64_t elem_size = dtype_size(dtype);
    LaunchPlan plan;
    for (int width = int(16 / elem_size); width > 1; width /= 2) {
        if (vectorisable(width, elem_size, T, B, H, arrays)) {
            plan.vector_width = width;
            break;
        }
    }
    const double bytes_per_step = double(B) * double(H) * double(elem_size) * double(arrays_per_step);
    const int64_t steps = steps_in_flight(backward, plan.vector_width, elem_size);
    const bool chunked =
        T > 0 && (schedule == Schedule::chunked || (schedule == Schedule::automatic && T >= 4 * steps &&
                                                    bytes_per_step * double(steps) < double(kBytesInFlight)));
    if (!chunked) return plan;

    // A chunk lives in registers: narrower packs (smaller vector alignment still holds).
    LaunchPlan split;
    split.vector_width = std::min(plan.vector_width, chunked_max_width(int(elem_size)));
    const int64_t chunk_len = steps_in_flight(backward, split.vector_width, elem_size);
    int64_t chunks = std::min<int64_t>((T + chunk_len - 1) / chunk_len, kMaxChunks);
    if (schedule == Schedule::automatic) {
        const double wanted = std::ceil(double(kBytesInFlight) / std::max(bytes_per_step * chunk_len, 1.0));
        chunks = std::min<int64_t>(chunks, int64_t(std::min(wanted, double(kMaxChunks))));
        if (chunks < 2) return plan;
    }
    split.chunks = int(std::max<int64_t>(chunks, 2));
    return split;
}

// A family's call as the plan sees it: every (time, batch, hidden) array of its manifest, and
// how many of them each step loads (the inputs: f, x forward, f, x, h[t-1], grad_h backward
// for ForgetMult; a, b forward, a, h[t-1], grad_h backward for linear_scan).
template <typename Params>
LaunchPlan scan_plan_of(const Params& p, Schedule schedule) {
    Strided arrays[8];  // ForgetMult's backward has 6
    size_t count = 0;
    int inputs = 0;
    qrnn::detail::for_each_view3(p, [&](const char*, const auto& v) {
        if (count == 8) throw std::logic_error("qrnn::cuda: a scan family with more than 8 arrays");
        arrays[count++] = strided(v);
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, ConstView3>) ++inputs;
    });
    return scan_plan(p.dtype, p.seq_len, p.batch, p.hidden, qrnn::detail::has_grad_h0<Params>, inputs, schedule,
                     StridedArrays{arrays, count});
}

// The first array a launch reads (where the device is asked, when the caller gave none).
template <typename Params>
const void* first_input(const Params& p) {
    const void* first = nullptr;
    bool seen = false;
    qrnn::detail::for_each_view3(p, [&](const char*, const auto& v) {
        if (!seen) first = v.data, seen = true;
    });
    return first;
}

// The checks of a call (`family`: "qrnn::cuda::<family>" in the refusal of sequences; `op`:
// the op in the overflow message); returns the element count. The CUDA schedules walk whole
// rows: sequences are refused (qrnn/view.hpp).
template <typename Params>
int64_t check_scan_call(const Params& p, const char* family, const char* op, Schedule schedule) {
    check_schedule(schedule);
    qrnn::detail::refuse_sequences(p, family);
    return qrnn::detail::validate_scan(p, op);
}

// The scan families' launchers, once the family validated `p` (`numel`: its element count).
// `what` names the launcher in errors.
template <typename Params>
void launch_scan_forward(const char* what, KernelFamily family, const Params& p, int64_t numel, void* stream,
                         Schedule schedule, int device) {
    if (numel == 0) return;
    const LaunchPlan plan = scan_plan_of(p, schedule);
    const LaunchGuard guard(what, stream, device, first_input(p), family, p.dtype);
    launch_of_dtype(p, plan, stream);
}

template <typename Params>
void launch_scan_backward(const char* what, KernelFamily family, const Params& p, void* stream, Schedule schedule,
                          int device) {
    // An empty sequence still owes grad_h0 (zeros): the serial kernel writes it.
    if (p.batch * p.hidden == 0 || (p.seq_len == 0 && p.grad_h0.data == nullptr)) return;
    const LaunchPlan plan = scan_plan_of(p, schedule);
    const LaunchGuard guard(what, stream, device, p.seq_len > 0 ? first_input(p) : p.grad_h0.data, family, p.dtype);
    launch_of_dtype(p, plan, stream);
}

}  // namespace qrnn::cuda::detail

// Defines, in namespace qrnn::cuda, a scan family's launchers (QRNN_CUDA_SCAN_LAUNCHERS,
// qrnn/cuda_schedule.hpp); `family` also names its detail::KernelFamily.
#define QRNN_CUDA_SCAN_ENTRY_POINTS(family, Forward, Backward)                                                         \
    namespace qrnn::cuda {                                                                                             \
    void family##_forward(const Forward& p, void* stream, Schedule schedule, int device) {                             \
        const int64_t numel = detail::check_scan_call(p, "qrnn::cuda::" #family, #family, schedule);                   \
        detail::launch_scan_forward("qrnn::cuda::" #family "_forward", detail::KernelFamily::family, p, numel, stream, \
                                    schedule, device);                                                                 \
    }                                                                                                                  \
    void family##_backward(const Backward& p, void* stream, Schedule schedule, int device) {                           \
        detail::check_scan_call(p, "qrnn::cuda::" #family, #family "_backward", schedule);                             \
        detail::launch_scan_backward("qrnn::cuda::" #family "_backward", detail::KernelFamily::family, p, stream,      \
                                     schedule, device);                                                                \
    }                                                                                                                  \
    LaunchPlan family##_forward_plan(const Forward& p, Schedule schedule) {                                            \
        detail::check_scan_call(p, "qrnn::cuda::" #family, #family, schedule);                                         \
        return detail::scan_plan_of(p, schedule);                                                                      \
    }                                                                                                                  \
    LaunchPlan family##_backward_plan(const Backward& p, Schedule schedule) {                                          \
        detail::check_scan_call(p, "qrnn::cuda::" #family, #family "_backward", schedule);                             \
        return detail::scan_plan_of(p, schedule);                                                                      \
    }                                                                                                                  \
    }
