// Validation of linear_scan parameters, shared by the CPU and CUDA entry points: sizes,
// dtypes, pointers and strides. Throws std::invalid_argument naming the argument.
#pragma once

#include <cstdint>

#include "common/check.hpp"
#include "forget_mult/check.hpp"
#include "qrnn/linear_scan.hpp"

namespace qrnn::detail {

#define QRNN_CHECK_LS_VIEW3(p, v) \
    check_view3(#v, (p).v.data, (p).seq_len, (p).batch, (p).hidden, (p).v.stride_t, (p).v.stride_b, (p).v.stride_h)

// Returns seq_len * batch * hidden.
inline int64_t validate_linear_scan(const LinearScanForwardParams& p) {
    check_size("seq_len", p.seq_len);
    check_size("batch", p.batch);
    check_size("hidden", p.hidden);
    const int64_t numel = checked_numel(p.seq_len, p.batch, p.hidden, "linear_scan");
    check_forget_mult_dtypes(p.dtype, p.h0_dtype, p.h0.data != nullptr);  // the same state rule
    QRNN_CHECK_LS_VIEW3(p, a);
    QRNN_CHECK_LS_VIEW3(p, b);
    QRNN_CHECK_LS_VIEW3(p, h);
    if (p.h0.data) check_view2("h0", p.h0.data, p.batch, p.hidden, p.h0.stride_b, p.h0.stride_h);
    return numel;
}

// Returns seq_len * batch * hidden.
inline int64_t validate_linear_scan(const LinearScanBackwardParams& p) {
    check_size("seq_len", p.seq_len);
    check_size("batch", p.batch);
    check_size("hidden", p.hidden);
    const int64_t numel = checked_numel(p.seq_len, p.batch, p.hidden, "linear_scan_backward");
    check_forget_mult_dtypes(p.dtype, p.h0_dtype, p.h0.data != nullptr || p.grad_h0.data != nullptr);
    QRNN_CHECK_LS_VIEW3(p, a);
    QRNN_CHECK_LS_VIEW3(p, h);
    QRNN_CHECK_LS_VIEW3(p, grad_h);
    QRNN_CHECK_LS_VIEW3(p, grad_a);
    QRNN_CHECK_LS_VIEW3(p, grad_b);
    if (p.h0.data) check_view2("h0", p.h0.data, p.batch, p.hidden, p.h0.stride_b, p.h0.stride_h);
    if (p.grad_h0.data)
        check_view2("grad_h0", p.grad_h0.data, p.batch, p.hidden, p.grad_h0.stride_b, p.grad_h0.stride_h);
    return numel;
}

#undef QRNN_CHECK_LS_VIEW3

}  // namespace qrnn::detail
