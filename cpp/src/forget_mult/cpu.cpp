// CPU ForgetMult entry points: validate, then run the shared scan entry (pick the
// instruction set once, split the (batch row, hidden block) items over threads).
#include <string>

#include "common/check.hpp"
#include "common/cpu_isa.hpp"
#include "common/cpu_scan_entry.hpp"
#include "qrnn/forget_mult.hpp"

namespace qrnn::cpu {
namespace {

using detail::fail;

// The fixed entry points' float32 parameters: f, x and h0 of contiguous time-major arrays.
// The time stride batch * hidden is computed only once the sizes are known to be valid (a
// product that overflows int64 is undefined behaviour).
template <typename Params>
Params contiguous_params(const float* f, const float* x, const float* h0, int64_t seq_len, int64_t batch,
                         int64_t hidden, const char* what) {
    detail::check_size("seq_len", seq_len);
    detail::check_size("batch", batch);
    detail::check_size("hidden", hidden);
    const int64_t st = detail::checked_numel(1, batch, hidden, what);
    Params p;
    p.seq_len = seq_len;
    p.batch = batch;
    p.hidden = hidden;
    p.dtype = DType::float32;
    p.f = {f, st, hidden, 1};
    p.x = {x, st, hidden, 1};
    p.h0 = {h0, hidden, 1};
    return p;
}

}  // namespace

const char* simd_level() { return isa_name(selected_isa()); }

QRNN_CPU_SCAN_ENTRY_POINTS(forget_mult, ForgetMultForwardParams, ForgetMultBackwardParams)

void forget_mult(const float* f, const float* x, const float* h0, float* h, int64_t seq_len, int64_t batch,
                 int64_t hidden) {
    auto p = contiguous_params<ForgetMultForwardParams>(f, x, h0, seq_len, batch, hidden, "forget_mult");
    p.h = {h, p.f.stride_t, hidden, 1};
    forget_mult_forward(p, 0);
}

void forget_mult_backward(const float* f, const float* x, const float* h0, const float* h, const float* grad_h,
                          float* grad_f, float* grad_x, float* grad_h0, int64_t seq_len, int64_t batch,
                          int64_t hidden) {
    auto p = contiguous_params<ForgetMultBackwardParams>(f, x, h0, seq_len, batch, hidden, "forget_mult_backward");
    const int64_t st = p.f.stride_t;
    p.h = {h, st, hidden, 1};
    p.grad_h = {grad_h, st, hidden, 1};
    p.grad_f = {grad_f, st, hidden, 1};
    p.grad_x = {grad_x, st, hidden, 1};
    p.grad_h0 = {grad_h0, hidden, 1};
    forget_mult_backward(p, 0);
}

}  // namespace qrnn::cpu
