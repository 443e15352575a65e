// Validation of linear_scan parameters, shared by the CPU and CUDA entry points: sizes,
// dtypes, pointers and strides. Throws std::invalid_argument naming the argument.
#pragma once

#include <cstdint>

#include "common/check.hpp"
#include "common/scan_check.hpp"
#include "qrnn/linear_scan.hpp"

namespace qrnn::detail {

// Returns the element count of the arrays. `memory`: where lengths and cu_seqlens live.
inline int64_t validate_linear_scan(const LinearScanForwardParams& p, LengthsMemory memory = LengthsMemory::host) {
    const int64_t numel = check_scan_sizes_and_state(p, "linear_scan", memory);
    check_scan_view3("a", p.a, p);
    check_scan_view3("b", p.b, p);
    check_scan_view3("h", p.h, p);
    return numel;
}

inline int64_t validate_linear_scan(const LinearScanBackwardParams& p, LengthsMemory memory = LengthsMemory::host) {
    const int64_t numel = check_scan_sizes_and_state(p, "linear_scan_backward", memory);
    check_scan_view3("a", p.a, p);
    check_scan_view3("h", p.h, p);
    check_scan_view3("grad_h", p.grad_h, p);
    check_scan_view3("grad_a", p.grad_a, p);
    check_scan_view3("grad_b", p.grad_b, p);
    return numel;
}

}  // namespace qrnn::detail
