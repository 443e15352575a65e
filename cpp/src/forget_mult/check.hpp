// Validation of ForgetMult parameters, shared by the CPU and CUDA entry points: sizes,
// dtypes, pointers and strides. Throws std::invalid_argument naming the argument.
#pragma once

#include <cstdint>
#include <string>

#include "common/check.hpp"
#include "qrnn/forget_mult.hpp"

namespace qrnn::detail {

inline void check_forget_mult_dtypes(DType dtype, DType h0_dtype, bool has_h0) {
    if (int(dtype) < 0 || int(dtype) > 3) fail("dtype: unknown value " + std::to_string(int(dtype)));
    if (!has_h0) return;
    const bool sixteen_bit = dtype == DType::bfloat16 || dtype == DType::float16;
    if (h0_dtype != dtype && !(sixteen_bit && h0_dtype == DType::float32))
        fail(std::string("h0_dtype: expected ") + dtype_name(dtype) + (sixteen_bit ? " or float32" : "") +
             ", got " + dtype_name(h0_dtype));
}

#define QRNN_CHECK_FM_VIEW3(p, v) \
    check_view3(#v, (p).v.data, (p).seq_len, (p).batch, (p).hidden, (p).v.stride_t, (p).v.stride_b, (p).v.stride_h)

// Returns seq_len * batch * hidden.
inline int64_t validate_forget_mult(const ForgetMultForwardParams& p) {
    check_size("seq_len", p.seq_len);
    check_size("batch", p.batch);
    check_size("hidden", p.hidden);
    const int64_t numel = checked_numel(p.seq_len, p.batch, p.hidden, "forget_mult");
    check_forget_mult_dtypes(p.dtype, p.h0_dtype, p.h0.data != nullptr);
    QRNN_CHECK_FM_VIEW3(p, f);
    QRNN_CHECK_FM_VIEW3(p, x);
    QRNN_CHECK_FM_VIEW3(p, h);
    if (p.h0.data) check_view2("h0", p.h0.data, p.batch, p.hidden, p.h0.stride_b, p.h0.stride_h);
    return numel;
}

// Returns seq_len * batch * hidden.
inline int64_t validate_forget_mult(const ForgetMultBackwardParams& p) {
    check_size("seq_len", p.seq_len);
    check_size("batch", p.batch);
    check_size("hidden", p.hidden);
    const int64_t numel = checked_numel(p.seq_len, p.batch, p.hidden, "forget_mult_backward");
    check_forget_mult_dtypes(p.dtype, p.h0_dtype, p.h0.data != nullptr || p.grad_h0.data != nullptr);
    QRNN_CHECK_FM_VIEW3(p, f);
    QRNN_CHECK_FM_VIEW3(p, x);
    QRNN_CHECK_FM_VIEW3(p, h);
    QRNN_CHECK_FM_VIEW3(p, grad_h);
    QRNN_CHECK_FM_VIEW3(p, grad_f);
    QRNN_CHECK_FM_VIEW3(p, grad_x);
    if (p.h0.data) check_view2("h0", p.h0.data, p.batch, p.hidden, p.h0.stride_b, p.h0.stride_h);
    if (p.grad_h0.data)
        check_view2("grad_h0", p.grad_h0.data, p.batch, p.hidden, p.grad_h0.stride_b, p.grad_h0.stride_h);
    return numel;
}

#undef QRNN_CHECK_FM_VIEW3

}  // namespace qrnn::detail
