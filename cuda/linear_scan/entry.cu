// CUDA linear_scan entry points: validate like the CPU path (linear_scan/check.hpp), choose
// the launch plan (common/scan_plan.hpp), then hand over to the launcher of the dtype's
// translation unit.
#include "common/launch.hpp"
#include "common/scan_plan.hpp"
#include "linear_scan/check.hpp"
#include "qrnn/linear_scan_cuda.hpp"

namespace qrnn::cuda {
namespace {

// The CUDA schedules walk whole rows: sequences are refused (qrnn/view.hpp).
template <typename Params>
int64_t validate(const Params& p) {
    qrnn::detail::refuse_sequences(p, "qrnn::cuda::linear_scan");
    return qrnn::detail::validate_linear_scan(p);
}

using detail::check_schedule;
using detail::strided;

// Loads per step: a, b forward; a, h[t-1], grad_h backward.
LaunchPlan plan_of(const LinearScanForwardParams& p, Schedule schedule) {
    return detail::scan_plan(p.dtype, p.seq_len, p.batch, p.hidden, false, 2, schedule,
                             {strided(p.a), strided(p.b), strided(p.h)});
}

LaunchPlan plan_of(const LinearScanBackwardParams& p, Schedule schedule) {
    return detail::scan_plan(p.dtype, p.seq_len, p.batch, p.hidden, true, 3, schedule,
                             {strided(p.a), strided(p.h), strided(p.grad_h), strided(p.grad_a), strided(p.grad_b)});
}

}  // namespace

void linear_scan_forward(const LinearScanForwardParams& p, void* stream, Schedule schedule, int device) {
    check_schedule(schedule);
    detail::launch_scan_forward("qrnn::cuda::linear_scan_forward", detail::KernelFamily::linear_scan, p, validate(p),
                                p.a.data, &plan_of, stream, schedule, device);
}

void linear_scan_backward(const LinearScanBackwardParams& p, void* stream, Schedule schedule, int device) {
    check_schedule(schedule);
    validate(p);
    detail::launch_scan_backward("qrnn::cuda::linear_scan_backward", detail::KernelFamily::linear_scan, p, p.a.data,
                                 &plan_of, stream, schedule, device);
}

LaunchPlan linear_scan_forward_plan(const LinearScanForwardParams& p, Schedule schedule) {
    check_schedule(schedule);
    validate(p);
    return plan_of(p, schedule);
}

LaunchPlan linear_scan_backward_plan(const LinearScanBackwardParams& p, Schedule schedule) {
    check_schedule(schedule);
    validate(p);
    return plan_of(p, schedule);
}

}  // namespace qrnn::cuda
