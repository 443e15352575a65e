// CPU entry points of the fused QRNN gate kernels: validate every field, then split the
// (batch row, hidden block) items over threads on the selected instruction set.
#include "common/cpu_work_items.hpp"
#include "common/isa_table.hpp"
#include "common/parallel.hpp"
#include "qrnn/qrnn_gates.hpp"
#include "qrnn_gates/check.hpp"

namespace qrnn::cpu {

// The gate kernels store bfloat16 with the native conversion where the CPU has it.
template <>
constexpr bool has_avx512_bf16_kernels<QrnnGatesForwardParams, QrnnGatesBackwardParams> = true;

namespace {

const auto& selected() { return selected_table<QrnnGatesForwardParams, QrnnGatesBackwardParams>(); }

// Splits the (batch row, hidden block) items over threads.
template <typename Params, typename Kernel>
void run_items(const Params& p, Kernel kernel, int num_threads) {
    detail::parallel_for(row_items(p.batch, p.hidden),
                         detail::threads_for_work(p.seq_len * p.batch * p.hidden, num_threads),
                         [&](int64_t begin, int64_t end) { kernel(p, begin, end); });
}

}  // namespace

const char* qrnn_gates_rows() { return selected().rows; }

void qrnn_gates_forward(const QrnnGatesForwardParams& p, int num_threads) {
    if (detail::validate_qrnn_gates(p, detail::LengthsMemory::host))
        run_items(p, selected().forward[int(p.dtype)], num_threads);
}

void qrnn_gates_backward(const QrnnGatesBackwardParams& p, int num_threads) {
    if (detail::validate_qrnn_gates(p, detail::LengthsMemory::host))
        run_items(p, selected().backward[int(p.dtype)], num_threads);
}

}  // namespace qrnn::cpu
