// The launch plan of the scan families (ForgetMult, linear_scan; common/scan.cuh): the
// vector width from the alignment of every array, serial or chunked in time from the
// size. Plain C++ for their entry points (<family>/entry.cu).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/check.hpp"
#include "common/launch.hpp"

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
inline LaunchPlan scan_plan(DType dtype, int64_t T, int64_t B, int64_t H, bool backward, int arrays_per_step,
                            Schedule schedule, std::initializer_list<Strided> arrays) {
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

inline Strided strided(const ConstView3& v) { return {v.data, v.stride_t, v.stride_b, v.stride_h}; }
inline Strided strided(const View3& v) { return {v.data, v.stride_t, v.stride_b, v.stride_h}; }

// The scan families' launchers, once the family validated `p` (`numel`: its element count)
// and knows its plan (`plan_of`) and the first array a launch reads (`first`: where the
// device is asked, when the caller gave none). `what` names the launcher in errors.
template <typename Params>
void launch_scan_forward(const char* what, KernelFamily family, const Params& p, int64_t numel, const void* first,
                         LaunchPlan (*plan_of)(const Params&, Schedule), void* stream, Schedule schedule, int device) {
    if (numel == 0) return;
    const LaunchPlan plan = plan_of(p, schedule);
    const LaunchGuard guard(what, stream, device, first, family, p.dtype);
    launch_of_dtype(p, plan, stream);
}

template <typename Params>
void launch_scan_backward(const char* what, KernelFamily family, const Params& p, const void* first,
                          LaunchPlan (*plan_of)(const Params&, Schedule), void* stream, Schedule schedule, int device) {
    // An empty sequence still owes grad_h0 (zeros): the serial kernel writes it.
    if (p.batch * p.hidden == 0 || (p.seq_len == 0 && p.grad_h0.data == nullptr)) return;
    const LaunchPlan plan = plan_of(p, schedule);
    const LaunchGuard guard(what, stream, device, p.seq_len > 0 ? first : p.grad_h0.data, family, p.dtype);
    launch_of_dtype(p, plan, stream);
}

}  // namespace qrnn::cuda::detail
