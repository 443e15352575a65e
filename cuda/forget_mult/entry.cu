// CUDA ForgetMult entry points: validate like the CPU path, choose the launch plan
// (vector width from the alignment of every array, serial or chunked in time from
// the size), then hand over to the launcher of the dtype's translation unit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/check.hpp"
#include "forget_mult/check.hpp"
#include "common/launch.hpp"
#include "qrnn/forget_mult_cuda.hpp"

namespace qrnn::cuda {
namespace {

using qrnn::detail::fail;

void check_schedule(Schedule s) {
    if (int(s) < 0 || int(s) > 2) fail("schedule: expected 0 (automatic), 1 (serial) or 2 (chunked), got " +
                                       std::to_string(int(s)));
}

int64_t steps_in_flight(bool backward, int vector_width, int64_t elem_size) {
    const int pack_bytes = int(vector_width * elem_size);
    return backward ? detail::backward_steps(pack_bytes) : detail::forward_steps(pack_bytes);
}

// The size rule (cuda/NOTES.md). The serial schedule keeps `steps` time steps of loads in
// flight per thread, B * H * bytes * arrays * steps bytes in all; when that is under
// kBytesInFlight and the sequence is at least 4 * steps long, split time into chunks so
// that chunks * that covers kBytesInFlight (at most kMaxChunks, at most the sequence).
LaunchPlan make_plan(DType dtype, int64_t T, int64_t B, int64_t H, bool backward, Schedule schedule,
                     std::initializer_list<detail::Strided> arrays) {
    const int64_t elem_size = dtype_size(dtype);
    LaunchPlan plan;
    for (int width = int(16 / elem_size); width > 1; width /= 2) {
        if (detail::vectorisable(width, elem_size, T, B, H, arrays)) {
            plan.vector_width = width;
            break;
        }
    }
    const double bytes_per_step = double(B) * double(H) * double(elem_size) * (backward ? 4.0 : 2.0);
    const int64_t steps = steps_in_flight(backward, plan.vector_width, elem_size);
    const bool chunked = T > 0 && (schedule == Schedule::chunked ||
                                   (schedule == Schedule::automatic && T >= 4 * steps &&
                                    bytes_per_step * double(steps) < double(detail::kBytesInFlight)));
    if (!chunked) return plan;

    // A chunk lives in registers: narrower packs (smaller vector alignment still holds).
    LaunchPlan split;
    split.vector_width = std::min(plan.vector_width, detail::chunked_max_width(int(elem_size)));
    const int64_t chunk_len = steps_in_flight(backward, split.vector_width, elem_size);
    int64_t chunks = std::min<int64_t>((T + chunk_len - 1) / chunk_len, detail::kMaxChunks);
    if (schedule == Schedule::automatic) {
        const double wanted = std::ceil(double(detail::kBytesInFlight) / std::max(bytes_per_step * chunk_len, 1.0));
        chunks = std::min<int64_t>(chunks, int64_t(std::min(wanted, double(detail::kMaxChunks))));
        if (chunks < 2) return plan;
    }
    split.chunks = int(std::max<int64_t>(chunks, 2));
    return split;
}

LaunchPlan plan_of(const ForgetMultForwardParams& p, Schedule schedule) {
    return make_plan(p.dtype, p.seq_len, p.batch, p.hidden, false, schedule,
                     {{p.f.data, p.f.stride_t, p.f.stride_b, p.f.stride_h},
                      {p.x.data, p.x.stride_t, p.x.stride_b, p.x.stride_h},
                      {p.h.data, p.h.stride_t, p.h.stride_b, p.h.stride_h}});
}

LaunchPlan plan_of(const ForgetMultBackwardParams& p, Schedule schedule) {
    return make_plan(p.dtype, p.seq_len, p.batch, p.hidden, true, schedule,
                     {{p.f.data, p.f.stride_t, p.f.stride_b, p.f.stride_h},
                      {p.x.data, p.x.stride_t, p.x.stride_b, p.x.stride_h},
                      {p.h.data, p.h.stride_t, p.h.stride_b, p.h.stride_h},
                      {p.grad_h.data, p.grad_h.stride_t, p.grad_h.stride_b, p.grad_h.stride_h},
                      {p.grad_f.data, p.grad_f.stride_t, p.grad_f.stride_b, p.grad_f.stride_h},
                      {p.grad_x.data, p.grad_x.stride_t, p.grad_x.stride_b, p.grad_x.stride_h}});
}

}  // namespace


void forget_mult_forward(const ForgetMultForwardParams& p, void* stream, Schedule schedule, int device) {
    check_schedule(schedule);
    if (qrnn::detail::validate_forget_mult(p) == 0) return;
    const LaunchPlan plan = plan_of(p, schedule);
    const detail::LaunchGuard guard("qrnn::cuda::forget_mult_forward", stream, device, p.f.data,
                                    detail::KernelFamily::forget_mult, p.dtype);
    detail::launch_of_dtype(p, plan, stream);
}

void forget_mult_backward(const ForgetMultBackwardParams& p, void* stream, Schedule schedule, int device) {
    check_schedule(schedule);
    qrnn::detail::validate_forget_mult(p);
    // An empty sequence still owes grad_h0 (zeros): the serial kernel writes it.
    if (p.batch * p.hidden == 0 || (p.seq_len == 0 && p.grad_h0.data == nullptr)) return;
    const LaunchPlan plan = plan_of(p, schedule);
    const detail::LaunchGuard guard("qrnn::cuda::forget_mult_backward", stream, device,
                                    p.seq_len > 0 ? p.f.data : p.grad_h0.data, detail::KernelFamily::forget_mult,
                                    p.dtype);
    detail::launch_of_dtype(p, plan, stream);
}

LaunchPlan forget_mult_forward_plan(const ForgetMultForwardParams& p, Schedule schedule) {
    check_schedule(schedule);
    qrnn::detail::validate_forget_mult(p);
    return plan_of(p, schedule);
}

LaunchPlan forget_mult_backward_plan(const ForgetMultBackwardParams& p, Schedule schedule) {
    check_schedule(schedule);
    qrnn::detail::validate_forget_mult(p);
    return plan_of(p, schedule);
}

}  // namespace qrnn::cuda
