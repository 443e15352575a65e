// CPU linear_scan entry points: validate, then split the (batch row, hidden block) items
// over threads on the selected instruction set (common/cpu_scan_entry.hpp).
#include "common/cpu_scan_entry.hpp"
#include "linear_scan/check.hpp"
#include "qrnn/linear_scan.hpp"

namespace qrnn::cpu {

const char* linear_scan_rows() { return selected_table<LinearScanForwardParams, LinearScanBackwardParams>().rows; }

void linear_scan_forward(const LinearScanForwardParams& p, int num_threads) {
    run_scan_forward<LinearScanForwardParams, LinearScanBackwardParams>(p, detail::validate_linear_scan(p),
                                                                        num_threads);
}

void linear_scan_backward(const LinearScanBackwardParams& p, int num_threads) {
    run_scan_backward<LinearScanForwardParams, LinearScanBackwardParams>(p, detail::validate_linear_scan(p),
                                                                         num_threads);
}

}  // namespace qrnn::cpu
