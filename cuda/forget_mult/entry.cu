// CUDA ForgetMult entry points: validate like the CPU path, choose the launch plan
// (common/scan_plan.hpp: vector width from the alignment of every array, serial or chunked
// in time from the size), then hand over to the launcher of the dtype's translation unit.
#include "common/launch.hpp"
#include "common/scan_plan.hpp"
#include "forget_mult/check.hpp"
#include "qrnn/forget_mult_cuda.hpp"

namespace qrnn::cuda {
namespace {

// The CUDA schedules walk whole rows: sequences are refused (qrnn/view.hpp).
template <typename Params>
int64_t validate(const Params& p) {
    qrnn::detail::refuse_sequences(p, "qrnn::cuda::forget_mult");
    return qrnn::detail::validate_forget_mult(p);
}

using detail::check_schedule;
using detail::strided;

// Loads per step: f, x forward; f, x, h[t-1], grad_h backward.
LaunchPlan plan_of(const ForgetMultForwardParams& p, Schedule schedule) {
    return detail::scan_plan(p.dtype, p.seq_len, p.batch, p.hidden, false, 2, schedule,
                             {strided(p.f), strided(p.x), strided(p.h)});
}

LaunchPlan plan_of(const ForgetMultBackwardParams& p, Schedule schedule) {
    return detail::scan_plan(
        p.dtype, p.seq_len, p.batch, p.hidden, true, 4, schedule,
        {strided(p.f), strided(p.x), strided(p.h), strided(p.grad_h), strided(p.grad_f), strided(p.grad_x)});
}

}  // namespace

void forget_mult_forward(const ForgetMultForwardParams& p, void* stream, Schedule schedule, int device) {
    check_schedule(schedule);
    detail::launch_scan_forward("qrnn::cuda::forget_mult_forward", detail::KernelFamily::forget_mult, p, validate(p),
                                p.f.data, &plan_of, stream, schedule, device);
}

void forget_mult_backward(const ForgetMultBackwardParams& p, void* stream, Schedule schedule, int device) {
    check_schedule(schedule);
    validate(p);
    detail::launch_scan_backward("qrnn::cuda::forget_mult_backward", detail::KernelFamily::forget_mult, p, p.f.data,
                                 &plan_of, stream, schedule, device);
}

LaunchPlan forget_mult_forward_plan(const ForgetMultForwardParams& p, Schedule schedule) {
    check_schedule(schedule);
    validate(p);
    return plan_of(p, schedule);
}

LaunchPlan forget_mult_backward_plan(const ForgetMultBackwardParams& p, Schedule schedule) {
    check_schedule(schedule);
    validate(p);
    return plan_of(p, schedule);
}

}  // namespace qrnn::cuda
