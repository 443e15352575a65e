// Validation of the fused QRNN gate parameters, shared by the CPU and CUDA entry points:
// sizes, dtypes, pointers, strides, lengths and cu_seqlens. Throws std::invalid_argument naming the
// field. Both return false when the call has nothing to write.
#pragma once

#include <cstdint>
#include <string>

#include "common/check.hpp"
#include "qrnn/qrnn_gates.hpp"

namespace qrnn::detail {

namespace gates_check {

// T steps of `rows` array rows (one for packed sequences); B sequences (the states' rows).
struct Shape { int64_t T, B, H, rows; };

inline Shape shape(int64_t T, int64_t B, int64_t H, const int64_t* cu_seqlens) {
    check_size("seq_len", T);
    check_size("batch", B);
    check_size("hidden", H);
    const int64_t rows = array_rows(cu_seqlens, B);
    checked_numel(T, rows, H, "qrnn_gates");
    return {T, B, H, rows};
}

// G's view covers n_gates blocks of H units, gate_stride apart.
template <typename V>
void gates(const char* name, const V& v, const Shape& s, int64_t gate_stride, bool output_gate) {
    const int64_t n_gates = output_gate ? 3 : 2;
    const int64_t sizes[4] = {s.T, s.rows, n_gates, s.H},
                  strides[4] = {v.stride_t, v.stride_b, gate_stride, v.stride_h};
    checked_numel(s.T * s.rows, n_gates, s.H, name);
    check_pointer(name, v.data, s.T * s.rows * n_gates * s.H);
    check_extent(name, sizes, strides, 4);
}

template <typename V>
void view3(const char* name, const V& v, const Shape& s) {
    check_view3(name, v.data, s.T, s.rows, s.H, v.stride_t, v.stride_b, v.stride_h);
}

template <typename V>
void view2(const char* name, const V& v, const Shape& s) {
    check_view2(name, v.data, s.B, s.H, v.stride_b, v.stride_h);
}

inline void scale(double scale) {
    if (!(scale == scale) || scale < 0.0 || scale > 1.0)
        fail("forget_scale must be in [0, 1], got " + std::to_string(scale));
}

// Shared by both directions: sizes, dtype, G, mask, scale, c0 and lengths.
template <typename Params>
Shape common(const Params& p, bool has_c0_dtype, LengthsMemory memory) {
    const Shape s = shape(p.seq_len, p.batch, p.hidden, p.cu_seqlens);
    check_dtype("dtype", p.dtype);
    gates("gates", p.gates, s, p.gate_stride, p.output_gate);
    if (p.forget_mask.data) view3("forget_mask", p.forget_mask, s);
    scale(p.forget_scale);
    if (has_c0_dtype) check_state_dtype("c0_dtype", p.c0_dtype, p.dtype);
    if (p.c0.data) view2("c0", p.c0, s);
    if (p.cu_seqlens) check_pointer("cu_seqlens", p.cu_seqlens, 1);
    check_sequences(p.lengths, p.lengths_stride, p.cu_seqlens, s.T, s.B, memory);
    return s;
}

}  // namespace gates_check

inline bool validate_qrnn_gates(const QrnnGatesForwardParams& p, LengthsMemory memory) {
    using namespace gates_check;
    const Shape s = common(p, p.c0.data != nullptr, memory);
    view3("output", p.output, s);
    if (p.states.data) view3("states", p.states, s);
    if (p.c_n.data) {
        check_state_dtype("c_n_dtype", p.c_n_dtype, p.dtype);
        view2("c_n", p.c_n, s);
    }
    // An empty sequence only writes c_n (= c0): without it there is nothing to do, and
    // batch * hidden need not even fit in int64 (walking its items would take hours).
    if (s.T == 0 && !p.c_n.data) return false;
    return checked_numel(1, s.B, s.H, "qrnn_gates") != 0;
}

inline bool validate_qrnn_gates(const QrnnGatesBackwardParams& p, LengthsMemory memory) {
    using namespace gates_check;
    const Shape s = common(p, p.c0.data != nullptr || p.grad_c0.data != nullptr, memory);
    view3("states", p.states, s);
    if (p.grad_output.data) view3("grad_output", p.grad_output, s);
    if (p.grad_c_n.data) {
        check_state_dtype("c_n_dtype", p.c_n_dtype, p.dtype);
        view2("grad_c_n", p.grad_c_n, s);
    }
    gates("grad_gates", p.grad_gates, s, p.grad_gate_stride, p.output_gate);
    if (p.grad_c0.data) view2("grad_c0", p.grad_c0, s);
    // An empty sequence only writes grad_c0 (= grad_c_n), as in the forward pass.
    if (s.T == 0 && !p.grad_c0.data) return false;
    return checked_numel(1, s.B, s.H, "qrnn_gates_backward") != 0;
}

}  // namespace qrnn::detail
