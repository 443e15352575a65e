// ForgetMult on NVIDIA GPUs: the same parameter structs and semantics as the CPU
// entry points in qrnn/forget_mult.hpp, with every pointer in device memory.
//
// This header needs no CUDA headers: a stream is passed as `void*` (a cudaStream_t;
// nullptr is the legacy default stream). Calls are asynchronous and launch on
// `stream`, which must belong to `device`, the device every pointer lives on.
//
// Device: the launchers make `device` current themselves for the launch (cudaGetDevice /
// cudaSetDevice, restored before returning), so the right GPU is used whatever device the
// calling thread had current, or another CUDA runtime (torch's) believed it had. With
// device = -1 (the default) they ask CUDA where the first input lives
// (cudaPointerGetAttributes, a little slower) and use the current device for host memory.
//
// First use: the first launch in a process checks that the driver can run the CUDA
// runtime this library was built with (it links its own), and throws std::runtime_error
// naming both versions if not. The first launch of an op and dtype on each device loads
// all its kernels there (with lazy loading, the default since CUDA 12.2, a kernel is
// otherwise loaded at its first launch); if that first launch is inside a CUDA graph
// capture and the driver is older than CUDA 12.3 (which cannot load kernels during a
// capture), it throws saying so: launch once before capturing, or set
// CUDA_MODULE_LOADING=EAGER.
//
// Nothing is allocated and nothing is synchronised, so the calls can be captured into
// CUDA graphs. Outputs must not overlap inputs (inputs are read through the read-only
// data cache).
//
// Declared only in builds with the CUDA kernels: QRNN_WITH_CUDA is then defined for
// every target linking qrnn::qrnn (qrnn.build_info()["cuda"] says so in Python).
#pragma once

#include "qrnn/cuda_schedule.hpp"
#include "qrnn/forget_mult.hpp"

// forget_mult_forward, forget_mult_backward and their _plan twins in namespace qrnn::cuda
// (Schedule, LaunchPlan and the signatures: qrnn/cuda_schedule.hpp).
QRNN_CUDA_SCAN_LAUNCHERS(forget_mult, ForgetMultForwardParams, ForgetMultBackwardParams)
