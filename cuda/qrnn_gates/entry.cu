// CUDA entry points of the fused QRNN gates: validate like the CPU path (all but the
// values of the device-resident lengths), pick the vector width from the alignment of
// every array, then hand over to the launcher of the dtype's translation unit.
#include <cstdint>
#include <initializer_list>

#include "common/launch.hpp"
#include "qrnn/qrnn_gates_cuda.hpp"
#include "qrnn_gates/check.hpp"

namespace qrnn::cuda {
namespace {

using detail::Strided;
using detail::strided;

// The gate blocks as separate arrays (Z, F and O start gate_stride elements apart).
struct GateBlocks { Strided z, f, o; };
GateBlocks blocks_of(const void* data, int64_t st, int64_t sb, int64_t sh, int64_t gate_stride, int64_t elem,
                     bool output_gate) {
    const char* base = static_cast<const char*>(data);
    return {{base, st, sb, sh},
            {base + gate_stride * elem, st, sb, sh},
            {output_gate ? base + 2 * gate_stride * elem : nullptr, st, sb, sh}};
}

// The widest pack (8 or 4 bytes, else 1 element) that every array allows.
int width_for(DType dtype, int64_t T, int64_t B, int64_t H, std::initializer_list<Strided> arrays) {
    const int64_t elem = dtype_size(dtype);
    for (int width = int(8 / elem); width > 1; width /= 2)
        if (detail::vectorisable(width, elem, T, B, H, arrays)) return width;
    return 1;
}

// The CUDA kernels walk padded rows (lengths, reverse); packed sequences are refused.
template <typename Params>
bool validate(const Params& p) {
    if (p.cu_seqlens)
        qrnn::detail::fail(
            "qrnn::cuda::qrnn_gates: cu_seqlens runs on the CPU kernels only; on CUDA pass padded rows "
            "with lengths");
    return qrnn::detail::validate_qrnn_gates(p, qrnn::detail::LengthsMemory::device);
}

int width_of(const QrnnGatesForwardParams& p) {
    const int64_t elem = dtype_size(p.dtype);
    const GateBlocks g = blocks_of(p.gates.data, p.gates.stride_t, p.gates.stride_b, p.gates.stride_h, p.gate_stride,
                                   elem, p.output_gate);
    return width_for(p.dtype, p.seq_len, p.batch, p.hidden,
                     {g.z, g.f, g.o, strided(p.forget_mask), strided(p.output), strided(p.states)});
}

int width_of(const QrnnGatesBackwardParams& p) {
    const int64_t elem = dtype_size(p.dtype);
    const GateBlocks g = blocks_of(p.gates.data, p.gates.stride_t, p.gates.stride_b, p.gates.stride_h, p.gate_stride,
                                   elem, p.output_gate);
    const GateBlocks d = blocks_of(p.grad_gates.data, p.grad_gates.stride_t, p.grad_gates.stride_b,
                                   p.grad_gates.stride_h, p.grad_gate_stride, elem, p.output_gate);
    return width_for(p.dtype, p.seq_len, p.batch, p.hidden,
                     {g.z, g.f, g.o, strided(p.forget_mask), strided(p.states), strided(p.grad_output), d.z, d.f, d.o});
}

template <typename Params>
void launch(const Params& p, void* stream, int device, const char* what) {
    if (!validate(p)) return;
    const LaunchPlan plan{width_of(p), 1};
    const detail::LaunchGuard guard(what, stream, device, p.gates.data, detail::KernelFamily::qrnn_gates, p.dtype);
    detail::launch_of_dtype(p, plan, stream);
}

}  // namespace

void qrnn_gates_forward(const QrnnGatesForwardParams& p, void* stream, int device) {
    launch(p, stream, device, "qrnn::cuda::qrnn_gates_forward");
}

void qrnn_gates_backward(const QrnnGatesBackwardParams& p, void* stream, int device) {
    launch(p, stream, device, "qrnn::cuda::qrnn_gates_backward");
}

int qrnn_gates_forward_vector_width(const QrnnGatesForwardParams& p) {
    validate(p);
    return width_of(p);
}

int qrnn_gates_backward_vector_width(const QrnnGatesBackwardParams& p) {
    validate(p);
    return width_of(p);
}

}  // namespace qrnn::cuda
