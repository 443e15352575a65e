// Internal: the texts of the launchers' first-use checks (driver version, kernels not yet
// loaded when a CUDA graph capture begins). Plain C++, no CUDA headers, so they are
// tested without a GPU (tests/packaging/test_gpu_first_contact.py compiles this header alone,
// through tests/cuda_emulation/runtime_messages.cpp).
#pragma once

#include <string>

namespace qrnn::cuda::detail {

// CUDA's version integers are 1000 * major + 10 * minor: 13000 -> "13.0", 12040 -> "12.4".
inline std::string cuda_version_name(int version) {
    return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// The oldest Linux driver of each CUDA major release (NVIDIA's compatibility table). Any
// release of a major runs on it (minor version compatibility), except for PTX JIT.
inline const char* minimum_linux_driver(int runtime_version) {
    switch (runtime_version / 1000) {
        case 11: return "450.80.02";
        case 12: return "525.60.13";
        case 13: return "580.65.06";
        default: return nullptr;
    }
}

// Can a driver that supports CUDA `driver_version` (cudaDriverGetVersion; 0: no driver)
// run kernels built with the CUDA runtime `runtime_version` (CUDART_VERSION)?
inline bool driver_supports(int driver_version, int runtime_version) {
    return driver_version > 0 && driver_version / 1000 >= runtime_version / 1000;
}

// The error when it cannot. qrnn links its own (static) CUDA runtime, so torch can work
// on a driver that is too old for qrnn's kernels: say which versions, and what to do.
inline std::string driver_too_old_message(int driver_version, int runtime_version) {
    const std::string needed = cuda_version_name(runtime_version / 1000 * 1000);
    const char* linux_driver = minimum_linux_driver(runtime_version);
    std::string found = driver_version > 0
                            ? "the NVIDIA driver supports CUDA " + cuda_version_name(driver_version) + " at most"
                            : std::string("no NVIDIA driver was found");
    std::string text = found + " (cudaDriverGetVersion returned " + std::to_string(driver_version) +
                       "), but qrnn's CUDA kernels were built with the CUDA " + cuda_version_name(runtime_version) +
                       " runtime (CUDART_VERSION " + std::to_string(runtime_version) +
                       ", linked into qrnn), which needs a driver for CUDA " + needed + " or newer";
    if (linux_driver != nullptr) text += " (on Linux, driver " + std::string(linux_driver) + " or newer)";
    if (driver_version <= 0) return text + ". Install or update the NVIDIA driver.";
    return text + ". Update the NVIDIA driver, or build qrnn from source with a CUDA toolkit of at most " +
           cuda_version_name(driver_version) +
           " (nvcc on PATH when running pip install). torch may still work: it brings its own CUDA runtime.";
}

// Drivers from CUDA 12.3 on can load a kernel lazily while a CUDA graph is being captured.
constexpr int kDriverLoadsDuringCapture = 12030;

// The error when the first launch on a device is captured by a driver that cannot load
// the kernels then (CUDA_MODULE_LOADING=LAZY is the default since CUDA 12.2).
inline std::string capture_before_load_message(int device, int driver_version) {
    return "the first qrnn CUDA launch on device " + std::to_string(device) +
           " is being captured into a CUDA graph before qrnn's kernels were loaded; CUDA loads kernels lazily "
           "(CUDA_MODULE_LOADING=LAZY, the default), and a driver older than CUDA " +
           cuda_version_name(kDriverLoadsDuringCapture) + " (this one: CUDA " + cuda_version_name(driver_version) +
           ") cannot load them during a capture. Run the op once on this device before capturing (as "
           "torch.cuda.graphs' warm-up on a side stream does), or set CUDA_MODULE_LOADING=EAGER.";
}

}  // namespace qrnn::cuda::detail
