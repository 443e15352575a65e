// CPU linear_scan entry points: validate, then split the (batch row, hidden block) items
// over threads on the selected instruction set (common/cpu_scan_entry.hpp).
#include "common/cpu_isa.hpp"
#include "common/cpu_scan_entry.hpp"
#include "qrnn/linear_scan.hpp"

namespace qrnn::cpu {

QRNN_CPU_SCAN_ENTRY_POINTS(linear_scan, LinearScanForwardParams, LinearScanBackwardParams)

}  // namespace qrnn::cpu
