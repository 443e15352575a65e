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

#include "qrnn/cuda_schedule.hpp"
#include "qrnn/linear_scan.hpp"

// linear_scan_forward, linear_scan_backward and their _plan twins in namespace qrnn::cuda
// (Schedule, LaunchPlan and the signatures: qrnn/cuda_schedule.hpp).
QRNN_CUDA_SCAN_LAUNCHERS(linear_scan, LinearScanForwardParams, LinearScanBackwardParams)
