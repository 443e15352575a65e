// The CPU entry points of the scan families (common/cpu_scan.hpp): validate the parameters
// (common/scan_check.hpp), pick the instruction set's kernel once and split the (batch row,
// hidden block) items over threads. A family's cpu.cpp defines its entry points with
// QRNN_CPU_SCAN_ENTRY_POINTS.
#pragma once

#include <cstdint>

#include "common/check.hpp"
#include "common/cpu_work_items.hpp"
#include "common/isa_table.hpp"
#include "common/parallel.hpp"
#include "common/scan_check.hpp"

namespace qrnn::cpu {

// `numel`: seq_len * batch * hidden, as the family's validation returned it.
template <typename Forward, typename Backward>
void run_scan_forward(const Forward& p, int64_t numel, int num_threads) {
    if (numel == 0) return;
    const auto kernel = selected_table<Forward, Backward>().forward[int(p.dtype)];
    detail::parallel_for(row_items(p.batch, p.hidden), detail::threads_for_work(numel, num_threads),
                         [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
}

template <typename Forward, typename Backward>
void run_scan_backward(const Backward& p, int64_t numel, int num_threads) {
    // An empty sequence still writes grad_h0 (zeros), if asked for: batch * hidden items of
    // nothing else. Without grad_h0 there is nothing to do (and batch * hidden may not even
    // fit in int64 when seq_len is 0).
    if (numel == 0 && !p.grad_h0.data) return;
    if (detail::checked_numel(1, p.batch, p.hidden, "grad_h0") == 0) return;
    const auto kernel = selected_table<Forward, Backward>().backward[int(p.dtype)];
    detail::parallel_for(row_items(p.batch, p.hidden), detail::threads_for_work(numel, num_threads),
                         [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
}

}  // namespace qrnn::cpu

// Defines, in namespace qrnn::cpu, a scan family's entry points <family>_forward and
// <family>_backward (qrnn/<family>.hpp) and <family>_rows (common/cpu_isa.hpp); errors name
// the ops `<family>` and `<family>_backward`.
#define QRNN_CPU_SCAN_ENTRY_POINTS(family, Forward, Backward)                                                \
    const char* family##_rows() { return selected_table<Forward, Backward>().rows; }                         \
    void family##_forward(const Forward& p, int num_threads) {                                               \
        run_scan_forward<Forward, Backward>(p, detail::validate_scan(p, #family), num_threads);              \
    }                                                                                                        \
    void family##_backward(const Backward& p, int num_threads) {                                             \
        run_scan_backward<Forward, Backward>(p, detail::validate_scan(p, #family "_backward"), num_threads); \
    }
