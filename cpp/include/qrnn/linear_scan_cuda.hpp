// linear_scan on NVIDIA GPUs: the same parameter structs and semantics as the CPU entry
// points in qrnn/linear_scan.hpp (any strides, a negative time stride for a reversed
// scan), with every pointer in device memory.
//
// As for ForgetMult on CUDA (qrnn/forget_mult_cuda.hpp, which describes streams, devices,
// first use and graph capture): the stream is a `void*` (a cudaStream_t; nullptr is the
// legacy default stream), calls are asynchronous on `stream` of `device` (-1: the device
// the first input lives on), nothing is allocated or synchronised, outputs must not
// overlap inputs. Both schedules of qrnn/cuda_schedule.hpp exist, with the same size rule.
//
// Declared only in builds with the CUDA kernels (QRNN_WITH_CUDA).
#pragma once

#include <cstdint>

#include "qrnn/cuda_schedule.hpp"
#include "qrnn/linear_scan.hpp"

#if defined(QRNN_WITH_CUDA)

namespace qrnn::cuda {

// Invalid sizes, strides, dtypes or null pointers throw std::invalid_argument (as the
// CPU path does); a failed launch throws std::runtime_error with CUDA's message.
QRNN_API void linear_scan_forward(const LinearScanForwardParams& params, void* stream,
                                  Schedule schedule = Schedule::automatic, int device = -1);
QRNN_API void linear_scan_backward(const LinearScanBackwardParams& params, void* stream,
                                   Schedule schedule = Schedule::automatic, int device = -1);

// The plan a call with these arguments would launch; host-only, touches no device.
QRNN_API LaunchPlan linear_scan_forward_plan(const LinearScanForwardParams& params,
                                             Schedule schedule = Schedule::automatic);
QRNN_API LaunchPlan linear_scan_backward_plan(const LinearScanBackwardParams& params,
                                              Schedule schedule = Schedule::automatic);

}  // namespace qrnn::cuda

#endif  // QRNN_WITH_CUDA
