// What every CUDA entry point of both op families does around its launch (common/launch.hpp):
// CUDA runtime errors as exceptions naming the entry point, the driver check once per
// process, the device switch and the kernel loading once per device (LaunchGuard).
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>

#include "common/launch.hpp"
#include "common/runtime_checks.hpp"

namespace qrnn::cuda {

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
constexpr int kKernelSets = kKernelFamilies * 4;  // x dtypes
std::atomic<bool> kernels_loaded[kMaxDevices][kKernelSets];
std::mutex loading;

using Loader = void (*)();

Loader loader_of(KernelFamily family, DType dtype) {
    return by_dtype(dtype, [&](auto d) -> Loader {
        constexpr DType D = decltype(d)::value;
        switch (family) {
#define QRNN_CUDA_FAMILY_LOADER(name) \
    case KernelFamily::name: return load_kernels<D, KernelFamily::name>;
            QRNN_CUDA_KERNEL_FAMILIES(QRNN_CUDA_FAMILY_LOADER)
#undef QRNN_CUDA_FAMILY_LOADER
            case KernelFamily::none: break;
        }
        return nullptr;
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
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged ? attributes.device : -1;
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

}  // namespace qrnn::cuda
