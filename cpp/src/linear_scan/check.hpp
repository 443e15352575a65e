// Validation of linear_scan parameters, shared by the CPU and CUDA entry points: sizes,
// dtypes, pointers and strides. Throws std::invalid_argument naming the argument.
#pragma once

#include <cstdint>

#include "common/check.hpp"
#include "common/scan_check.hpp"
#include "qrnn/linear_scan.hpp"

namespace qrnn::detail {

#define QRNN_CHECK_LS_VIEW3(p, v) \
    check_view3(#v, (p).v.data, (p).seq_len, (p).batch, (p).hidden, (p).v.stride_t, (p).v.stride_b, (p).v.stride_h)

// Returns seq_len * batch * hidden.
inline int64_t validate_linear_scan(const LinearScanForwardParams& p) {
    const int64_t numel = check_scan_sizes_and_state(p, "linear_scan");
    QRNN_CHECK_LS_VIEW3(p, a);
    QRNN_CHECK_LS_VIEW3(p, b);
    QRNN_CHECK_LS_VIEW3(p, h);
    return numel;
}

// Returns seq_len * batch * hidden.
inline int64_t validate_linear_scan(const LinearScanBackwardParams& p) {
    const int64_t numel = check_scan_sizes_and_state(p, "linear_scan_backward");
    QRNN_CHECK_LS_VIEW3(p, a);
    QRNN_CHECK_LS_VIEW3(p, h);
    QRNN_CHECK_LS_VIEW3(p, grad_h);
    QRNN_CHECK_LS_VIEW3(p, grad_a);
    QRNN_CHECK_LS_VIEW3(p, grad_b);
    return numel;
}

#undef QRNN_CHECK_LS_VIEW3

}  // namespace qrnn::detail
