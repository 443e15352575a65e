// CPU entry points of the fused QRNN gate kernels: validate every field, then split the
// (batch row, hidden block) items over threads on the selected instruction set.
#include <string>

#include "check.hpp"
#include "cpu_isa.hpp"
#include "parallel.hpp"
#include "qrnn/qrnn_gates.hpp"
#include "qrnn_gates_table.hpp"

namespace qrnn::cpu {
namespace {

using detail::fail;

const GatesKernelTable& selected() {
#if defined(QRNN_HAVE_X86_KERNELS)
    static const GatesKernelTable& table = select_table(generic::gates_table, &avx2::gates_table, &avx512::gates_table);
#else
    static const GatesKernelTable& table = generic::gates_table;
#endif
    return table;
}

bool sixteen_bit(DType d) { return d == DType::bfloat16 || d == DType::float16; }

void check_dtype(DType d) {
    if (int(d) < 0 || int(d) > 3) fail("dtype: unknown value " + std::to_string(int(d)));
}

// A carried state is stored in the sequence dtype, or in float32 next to 16-bit data.
void check_state_dtype(const char* name, DType state, DType dtype) {
    if (int(state) < 0 || int(state) > 3) fail(std::string(name) + ": unknown dtype value " + std::to_string(int(state)));
    if (state != dtype && !(sixteen_bit(dtype) && state == DType::float32))
        fail(std::string(name) + ": expected " + dtype_name(dtype) + (sixteen_bit(dtype) ? " or float32" : "") +
             ", got " + dtype_name(state));
}

struct Shape {
    int64_t T, B, H;
};

Shape check_shape(int64_t T, int64_t B, int64_t H) {
    detail::check_size("seq_len", T);
    detail::check_size("batch", B);
    detail::check_size("hidden", H);
    detail::checked_numel(T, B, H, "qrnn_gates");
    return {T, B, H};
}

// G's view covers n_gates blocks of H units, gate_stride apart.
void check_gates(const char* name, const void* data, const Shape& s, int64_t st, int64_t sb, int64_t sh,
                 int64_t gate_stride, bool output_gate) {
    const int64_t n_gates = output_gate ? 3 : 2;
    const int64_t sizes[4] = {s.T, s.B, n_gates, s.H}, strides[4] = {st, sb, gate_stride, sh};
    detail::checked_numel(s.T * s.B, n_gates, s.H, name);
    detail::check_pointer(name, data, s.T * s.B * n_gates * s.H);
    detail::check_extent(name, sizes, strides, 4);
}

template <typename V>
void check_view3(const char* name, const V& v, const Shape& s) {
    detail::check_view3(name, v.data, s.T, s.B, s.H, v.stride_t, v.stride_b, v.stride_h);
}

template <typename V>
void check_view2(const char* name, const V& v, const Shape& s) {
    detail::check_view2(name, v.data, s.B, s.H, v.stride_b, v.stride_h);
}

void check_lengths(const int64_t* lengths, int64_t stride, const Shape& s) {
    if (!lengths) return;
    detail::check_pointer("lengths", lengths, s.B);
    const int64_t sizes[1] = {s.B}, strides[1] = {stride};
    detail::check_extent("lengths", sizes, strides, 1);
    for (int64_t b = 0; b < s.B; ++b) {
        const int64_t len = lengths[b * stride];
        if (len < 0 || len > s.T)
            fail("lengths[" + std::to_string(b) + "] = " + std::to_string(len) + " is outside 0..seq_len (" +
                 std::to_string(s.T) + ")");
    }
}

void check_scale(double scale) {
    if (!(scale == scale) || scale < 0.0 || scale > 1.0)
        fail("forget_scale must be in [0, 1], got " + std::to_string(scale));
}

int64_t n_items(const Shape& s) {
    const int64_t block = gates_block(s.H);
    return s.B * ((s.H + block - 1) / block);
}

}  // namespace

void qrnn_gates_forward(const QrnnGatesForwardParams& p, int num_threads) {
    const Shape s = check_shape(p.seq_len, p.batch, p.hidden);
    check_dtype(p.dtype);
    check_gates("gates", p.gates.data, s, p.gates.stride_t, p.gates.stride_b, p.gates.stride_h, p.gate_stride,
                p.output_gate);
    if (p.forget_mask.data) check_view3("forget_mask", p.forget_mask, s);
    check_scale(p.forget_scale);
    if (p.c0.data) {
        check_state_dtype("c0_dtype", p.c0_dtype, p.dtype);
        check_view2("c0", p.c0, s);
    }
    check_lengths(p.lengths, p.lengths_stride, s);
    check_view3("output", p.output, s);
    if (p.states.data) check_view3("states", p.states, s);
    if (p.c_n.data) {
        check_state_dtype("c_n_dtype", p.c_n_dtype, p.dtype);
        check_view2("c_n", p.c_n, s);
    }
    // An empty sequence only writes c_n (= c0): without it there is nothing to do, and
    // batch * hidden need not even fit in int64 (walking its items would take hours).
    if (s.T == 0 && !p.c_n.data) return;
    if (detail::checked_numel(1, s.B, s.H, "qrnn_gates") == 0) return;
    const auto kernel = selected().forward[int(p.dtype)];
    detail::parallel_for(n_items(s), detail::threads_for_work(s.T * s.B * s.H, num_threads),
                         [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
}

void qrnn_gates_backward(const QrnnGatesBackwardParams& p, int num_threads) {
    const Shape s = check_shape(p.seq_len, p.batch, p.hidden);
    check_dtype(p.dtype);
    check_gates("gates", p.gates.data, s, p.gates.stride_t, p.gates.stride_b, p.gates.stride_h, p.gate_stride,
                p.output_gate);
    if (p.forget_mask.data) check_view3("forget_mask", p.forget_mask, s);
    check_scale(p.forget_scale);
    if (p.c0.data || p.grad_c0.data) check_state_dtype("c0_dtype", p.c0_dtype, p.dtype);
    if (p.c0.data) check_view2("c0", p.c0, s);
    check_lengths(p.lengths, p.lengths_stride, s);
    check_view3("states", p.states, s);
    if (p.grad_output.data) check_view3("grad_output", p.grad_output, s);
    if (p.grad_c_n.data) {
        check_state_dtype("c_n_dtype", p.c_n_dtype, p.dtype);
        check_view2("grad_c_n", p.grad_c_n, s);
    }
    check_gates("grad_gates", p.grad_gates.data, s, p.grad_gates.stride_t, p.grad_gates.stride_b,
                p.grad_gates.stride_h, p.grad_gate_stride, p.output_gate);
    if (p.grad_c0.data) check_view2("grad_c0", p.grad_c0, s);
    // An empty sequence only writes grad_c0 (= grad_c_n), as in the forward pass.
    if (s.T == 0 && !p.grad_c0.data) return;
    if (detail::checked_numel(1, s.B, s.H, "qrnn_gates_backward") == 0) return;
    const auto kernel = selected().backward[int(p.dtype)];
    detail::parallel_for(n_items(s), detail::threads_for_work(s.T * s.B * s.H, num_threads),
                         [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
}

}  // namespace qrnn::cpu
