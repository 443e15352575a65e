// CUDA ForgetMult entry points: validate like the CPU path, choose the launch plan
// (vector width from the alignment of every array, serial or chunked in time from
// the size), then hand over to the launcher of the dtype's translation unit.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <stdexcept>
#include <string>

#include "common/check.hpp"
#include "forget_mult/check.hpp"
#include "common/launch.hpp"
#include "qrnn/forget_mult_cuda.hpp"
#include "common/runtime_checks.hpp"

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

namespace detail {

namespace {

int driver_version() {
    int version = 0;
    if (cudaDriverGetVersion(&version) != cudaSuccess) version = 0;
    return version;
}

// Once per process: can the driver run the CUDA runtime linked into this library?
void check_driver(const char* what) {
    static const int driver = driver_version();  // thread-safe, computed once
    if (!driver_supports(driver, CUDART_VERSION))
        throw std::runtime_error(std::string(what) + ": " + driver_too_old_message(driver, CUDART_VERSION));
}

// Which kernel sets (family x dtype) are loaded on which device (kMaxDevices covers any
// machine; beyond it, a set is loaded at every launch).
constexpr int kMaxDevices = 256;
constexpr int kKernelSets = 8;
std::atomic<bool> kernels_loaded[kMaxDevices][kKernelSets];
std::mutex loading;

using Loader = void (*)();

Loader loader_of(KernelFamily family, DType dtype) {
    return by_dtype(dtype, [&](auto d) -> Loader {
        constexpr DType D = decltype(d)::value;
        return family == KernelFamily::forget_mult ? load_kernels<D, KernelFamily::forget_mult>
                                                   : load_kernels<D, KernelFamily::gates>;
    });
}

// Once per device and kernel set: load the set's kernels while no capture is running.
void ensure_loaded(const char* what, int device, void* stream, KernelFamily family, DType dtype) {
    if (family == KernelFamily::none) return;
    const int set = int(family) * 4 + int(dtype);
    const bool tracked = device >= 0 && device < kMaxDevices && set >= 0 && set < kKernelSets;
    if (tracked && kernels_loaded[device][set].load(std::memory_order_acquire)) return;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it, or check_launch would report it
        return;              // unknown: leave the kernels to the launch
    }
    if (status != cudaStreamCaptureStatusNone) {
        const int driver = driver_version();
        if (driver < kDriverLoadsDuringCapture)
            throw std::runtime_error(std::string(what) + ": " + capture_before_load_message(device, driver));
        return;  // this driver loads them during the capture
    }
    std::lock_guard<std::mutex> lock(loading);
    if (tracked && kernels_loaded[device][set].load(std::memory_order_relaxed)) return;
    if (const Loader load = loader_of(family, dtype)) load();
    if (tracked) kernels_loaded[device][set].store(true, std::memory_order_release);
}

// The device of `data` (device or managed memory), or -1 (host memory, unknown).
int device_of(const void* data) {
    cudaPointerAttributes attributes{};
    if (data == nullptr || cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged ? attributes.device
                                                                                               : -1;
}

}  // namespace

void check_cuda(int error, const char* what) {
    const cudaError_t err = static_cast<cudaError_t>(error);
    if (err == cudaSuccess) return;
    cudaGetLastError();  // the error is reported here, not again by the next check
    std::string text = std::string(what) + ": CUDA error " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
    if (err == cudaErrorInsufficientDriver || err == cudaErrorCallRequiresNewerDriver ||
        err == cudaErrorUnsupportedPtxVersion || err == cudaErrorNoKernelImageForDevice) {
        const int driver = driver_version();
        text += " (driver supports CUDA " + cuda_version_name(driver) + ", qrnn built with CUDA " +
                cuda_version_name(CUDART_VERSION) + ")";
    }
    throw std::runtime_error(text);
}

void check_launch(const char* what) { check_cuda(int(cudaGetLastError()), what); }

LaunchGuard::LaunchGuard(const char* what, void* stream, int device, const void* data, KernelFamily family,
                         DType dtype) {
    check_driver(what);
    if (device < 0) device = device_of(data);
    int current = -1;
    check_cuda(int(cudaGetDevice(&current)), "qrnn::cuda: cudaGetDevice");
    if (device >= 0 && device != current) {
        check_cuda(int(cudaSetDevice(device)), "qrnn::cuda: cudaSetDevice");
        previous_ = current;
    }
    try {
        ensure_loaded(what, device >= 0 ? device : current, stream, family, dtype);
    } catch (...) {
        if (previous_ >= 0) cudaSetDevice(previous_);
        throw;
    }
}

LaunchGuard::~LaunchGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace detail

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
