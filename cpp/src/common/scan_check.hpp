// Validation of the scan families' (ForgetMult, linear_scan) parameters, shared by the CPU and
// CUDA entry points: sizes, dtypes, pointers and strides, the same checks for every family
// (its arrays are the views its manifest lists). Throws std::invalid_argument naming the
// argument.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "common/check.hpp"
#include "common/kernel_args.hpp"
#include "qrnn/dtype.hpp"
#include "qrnn/view.hpp"

namespace qrnn::detail {

// The state (h0, grad_h0) has a dtype accepts_state_dtype allows (qrnn/dtype.hpp).
inline void check_state_dtypes(DType dtype, DType h0_dtype, bool has_h0) {
    check_dtype("dtype", dtype);
    if (has_h0) check_state_dtype("h0_dtype", h0_dtype, dtype);
}

// Whether Params is a backward's (it has a grad_h0 output).
template <typename Params, typename = void>
struct HasGradH0 : std::false_type {};
template <typename Params>
struct HasGradH0<Params, std::void_t<decltype(std::declval<const Params&>().grad_h0)>> : std::true_type {};
template <typename Params>
constexpr bool has_grad_h0 = HasGradH0<Params>::value;

// Sizes, the element count of the arrays (returned), which steps are real, the state's
// dtype and its views (h0, and grad_h0 in a backward's parameters); `what` names the call
// in the overflow message.
template <typename Params>
int64_t check_scan_sizes_and_state(const Params& p, const char* what, LengthsMemory memory) {
    check_size("seq_len", p.seq_len);
    check_size("batch", p.batch);
    check_size("hidden", p.hidden);
    const int64_t numel = checked_numel(p.seq_len, array_rows(p.cu_seqlens, p.batch), p.hidden, what);
    if (p.cu_seqlens) check_pointer("cu_seqlens", p.cu_seqlens, 1);
    check_sequences(p.lengths, p.lengths_stride, p.cu_seqlens, p.seq_len, p.batch, memory);
    bool has_state = p.h0.data != nullptr;
    if constexpr (has_grad_h0<Params>) has_state = has_state || p.grad_h0.data != nullptr;
    check_state_dtypes(p.dtype, p.h0_dtype, has_state);
    if (p.h0.data) check_view2("h0", p.h0.data, p.batch, p.hidden, p.h0.stride_b, p.h0.stride_h);
    if constexpr (has_grad_h0<Params>)
        if (p.grad_h0.data)
            check_view2("grad_h0", p.grad_h0.data, p.batch, p.hidden, p.grad_h0.stride_b, p.grad_h0.stride_h);
    return numel;
}

// A (time, batch, hidden) array of the call: seq_len steps of its batch rows (one row for
// packed sequences).
template <typename Params, typename V>
void check_scan_view3(const char* name, const V& v, const Params& p) {
    check_view3(name, v.data, p.seq_len, array_rows(p.cu_seqlens, p.batch), p.hidden, v.stride_t, v.stride_b,
                v.stride_h);
}

// Every (time, batch, hidden) view of the parameters, in their manifest's order.
template <typename Params, typename Use>
void for_each_view3(const Params& p, Use&& use) {
    args::for_each_field(p, [&](const char* name, const auto& field) {
        using Field = std::decay_t<decltype(field)>;
        if constexpr (std::is_same_v<Field, ConstView3> || std::is_same_v<Field, View3>) use(name, field);
    });
}

// The whole check of a scan family's call; returns the element count of the arrays. `what`
// names the op in the overflow message; `memory`: where lengths and cu_seqlens live.
template <typename Params>
int64_t validate_scan(const Params& p, const char* what, LengthsMemory memory = LengthsMemory::host) {
    const int64_t numel = check_scan_sizes_and_state(p, what, memory);
    for_each_view3(p, [&](const char* name, const auto& v) { check_scan_view3(name, v, p); });
    return numel;
}

// For kernels that walk whole rows only (the CUDA schedules of the scan families): lengths,
// packed sequences and reverse-within-sequences are refused (a whole row reversed is a
// negative time stride there). qrnn's Python layer runs such calls as dense scans.
template <typename Params>
void refuse_sequences(const Params& p, const char* what) {
    if (p.lengths || p.cu_seqlens || p.reverse)
        fail(std::string(what) +
             ": lengths, cu_seqlens and reverse run on the CPU kernels only; on CUDA pass "
             "whole rows (reverse them with a negative time stride)");
}

}  // namespace qrnn::detail
