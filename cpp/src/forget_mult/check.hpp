// Validation of ForgetMult parameters, shared by the CPU and CUDA entry points: sizes,
// dtypes, pointers and strides. Throws std::invalid_argument naming the argument.
#pragma once

#include <cstdint>
#include <string>

#include "common/check.hpp"
#include "common/scan_check.hpp"
#include "qrnn/forget_mult.hpp"

namespace qrnn::detail {

#define QRNN_CHECK_FM_VIEW3(p, v) \
    check_view3(#v, (p).v.data, (p).seq_len, (p).batch, (p).hidden, (p).v.stride_t, (p).v.stride_b, (p).v.stride_h)

// Returns seq_len * batch * hidden.
inline int64_t validate_forget_mult(const ForgetMultForwardParams& p) {
    const int64_t numel = check_scan_sizes_and_state(p, "forget_mult");
    QRNN_CHECK_FM_VIEW3(p, f);
    QRNN_CHECK_FM_VIEW3(p, x);
    QRNN_CHECK_FM_VIEW3(p, h);
    return numel;
}

// Returns seq_len * batch * hidden.
inline int64_t validate_forget_mult(const ForgetMultBackwardParams& p) {
    const int64_t numel = check_scan_sizes_and_state(p, "forget_mult_backward");
    QRNN_CHECK_FM_VIEW3(p, f);
    QRNN_CHECK_FM_VIEW3(p, x);
    QRNN_CHECK_FM_VIEW3(p, h);
    QRNN_CHECK_FM_VIEW3(p, grad_h);
    QRNN_CHECK_FM_VIEW3(p, grad_f);
    QRNN_CHECK_FM_VIEW3(p, grad_x);
    return numel;
}

#undef QRNN_CHECK_FM_VIEW3

}  // namespace qrnn::detail
