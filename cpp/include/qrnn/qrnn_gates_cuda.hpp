// Fused QRNN gates on NVIDIA GPUs: the parameter structs and semantics of the CPU entry
// points in qrnn/qrnn_gates.hpp, with every pointer (lengths included) in device memory.
//
// As for ForgetMult on CUDA (qrnn/forget_mult_cuda.hpp): the stream is a `void*`
// cudaStream_t of `device`, which the launchers make current for the launch (-1: the
// device the gates live on), the first launch checks the driver and loads the kernels,
// calls are asynchronous, nothing is allocated or synchronised (CUDA-graph safe), and
// outputs must not overlap inputs. One difference:
// `lengths` is not read on the host (that would synchronise), so its values are not
// checked here; the kernels clamp each length to 0..seq_len, so a bad value cannot make
// them touch memory outside the arrays. (qrnn.QRNN checks lengths before calling.)
//
// One thread owns one batch row and `vector_width` consecutive hidden units and walks
// its sequence, keeping several steps of loads in flight; 16-bit storage moves in
// half2 / bfloat162 pairs (or 4-element packs) where every array's alignment allows.
//
// Declared only in builds with the CUDA kernels (QRNN_WITH_CUDA).
#pragma once

#include "qrnn/qrnn_gates.hpp"

#if defined(QRNN_WITH_CUDA)

namespace qrnn::cuda {

// Invalid sizes, strides, dtypes or null pointers throw std::invalid_argument; a failed
// launch throws std::runtime_error with CUDA's message.
QRNN_API void qrnn_gates_forward(const QrnnGatesForwardParams& params, void* stream, int device = -1);
QRNN_API void qrnn_gates_backward(const QrnnGatesBackwardParams& params, void* stream, int device = -1);

// Hidden units per thread that a call with these arguments would launch (host-only).
QRNN_API int qrnn_gates_forward_vector_width(const QrnnGatesForwardParams& params);
QRNN_API int qrnn_gates_backward_vector_width(const QrnnGatesBackwardParams& params);

}  // namespace qrnn::cuda

#endif  // QRNN_WITH_CUDA
