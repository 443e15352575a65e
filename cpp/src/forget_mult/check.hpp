// Validation of ForgetMult parameters, shared by the CPU and CUDA entry points: sizes,
// dtypes, pointers and strides. Throws std::invalid_argument naming the argument.
#pragma once

#include <cstdint>

#include "common/check.hpp"
#include "common/scan_check.hpp"
#include "qrnn/forget_mult.hpp"

namespace qrnn::detail {

// Returns the element count of the arrays. `memory`: where lengths and cu_seqlens live.
inline int64_t validate_forget_mult(const ForgetMultForwardParams& p, LengthsMemory memory = LengthsMemory::host) {
    const int64_t numel = check_scan_sizes_and_state(p, "forget_mult", memory);
    check_scan_view3("f", p.f, p);
    check_scan_view3("x", p.x, p);
    check_scan_view3("h", p.h, p);
    return numel;
}

inline int64_t validate_forget_mult(const ForgetMultBackwardParams& p, LengthsMemory memory = LengthsMemory::host) {
    const int64_t numel = check_scan_sizes_and_state(p, "forget_mult_backward", memory);
    check_scan_view3("f", p.f, p);
    check_scan_view3("x", p.x, p);
    check_scan_view3("h", p.h, p);
    check_scan_view3("grad_h", p.grad_h, p);
    check_scan_view3("grad_f", p.grad_f, p);
    check_scan_view3("grad_x", p.grad_x, p);
    return numel;
}

}  // namespace qrnn::detail
