// Argument checks shared by the torch-free entry points. They throw
// std::invalid_argument with a message naming the argument; the core never trusts
// its caller, even though the Python layer checks the same things first.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "qrnn/dtype.hpp"

namespace qrnn::detail {

[[noreturn]] inline void fail(const std::string& what) { throw std::invalid_argument(what); }

inline void check_dtype(const char* name, DType d) {
    if (int(d) < 0 || int(d) > 3) fail(std::string(name) + ": unknown dtype value " + std::to_string(int(d)));
}

// A carried state's dtype (h0, c0, a final state): what accepts_state_dtype allows.
inline void check_state_dtype(const char* name, DType state, DType data) {
    check_dtype(name, state);
    if (!accepts_state_dtype(data, state))
        fail(std::string(name) + ": expected " + dtype_name(data) + (is_sixteen_bit(data) ? " or float32" : "") +
             ", got " + dtype_name(state));
}

inline void check_size(const char* name, int64_t v) {
    if (v < 0) fail(std::string(name) + " must be >= 0, got " + std::to_string(v));
}

// |a * b| without overflow, or -1 when it would not fit in int64.
inline int64_t checked_mul(int64_t a, int64_t b) {
    if (a == 0 || b == 0) return 0;
    const int64_t max = std::numeric_limits<int64_t>::max();
    // |INT64_MIN| does not fit: reject it before negating (negating it is undefined).
    if (a == std::numeric_limits<int64_t>::min() || b == std::numeric_limits<int64_t>::min()) return -1;
    const int64_t ua = a < 0 ? -a : a, ub = b < 0 ? -b : b;
    if (ua > max / ub) return -1;
    return ua * ub;
}

inline int64_t checked_numel(int64_t a, int64_t b, int64_t c, const char* what) {
    const int64_t ab = checked_mul(a, b);
    const int64_t abc = ab < 0 ? -1 : checked_mul(ab, c);
    if (abc < 0) fail(std::string(what) + ": element count overflows int64");
    return abc;
}

// The farthest element a strided view reaches must be addressable in int64.
inline void check_extent(const char* name, const int64_t* sizes, const int64_t* strides, int ndim) {
    int64_t reach = 0;
    for (int d = 0; d < ndim; ++d) {
        if (sizes[d] == 0) return;  // empty: nothing is read
        const int64_t r = checked_mul(sizes[d] - 1, strides[d]);
        if (r < 0 || reach > std::numeric_limits<int64_t>::max() - r)
            fail(std::string(name) + ": strides reach beyond int64 offsets");
        reach += r;
    }
}

inline void check_pointer(const char* name, const void* p, int64_t numel) {
    if (numel > 0 && p == nullptr) fail(std::string(name) + " is a null pointer but has elements");
}

// A (time, batch, hidden) or (batch, hidden) strided view: non-null when it has
// elements, and every element it reaches addressable.
inline void check_view3(const char* name, const void* data, int64_t T, int64_t B, int64_t H, int64_t st, int64_t sb,
                        int64_t sh) {
    const int64_t sizes[3] = {T, B, H}, strides[3] = {st, sb, sh};
    check_pointer(name, data, T * B * H);
    check_extent(name, sizes, strides, 3);
}

inline void check_view2(const char* name, const void* data, int64_t B, int64_t H, int64_t sb, int64_t sh) {
    const int64_t sizes[2] = {B, H}, strides[2] = {sb, sh};
    check_pointer(name, data, checked_numel(1, B, H, name));  // B * H may overflow when seq_len is 0
    check_extent(name, sizes, strides, 2);
}

// Where `lengths` and `cu_seqlens` live decides whether their values can be checked here:
// host memory is read; device memory is not (that would synchronise), and the CUDA kernels
// clamp each value into range instead, so no access leaves the arrays.
enum class LengthsMemory { host, device };

// Which steps are real (qrnn/view.hpp, "Sequences"): lengths (T steps, B rows) or
// cu_seqlens (B sequences in one row of T steps), not both.
inline void check_sequences(const int64_t* lengths, int64_t lengths_stride, const int64_t* cu_seqlens, int64_t T,
                            int64_t B, LengthsMemory memory) {
    if (lengths && cu_seqlens) fail("lengths and cu_seqlens: give one or the other, not both");
    if (lengths) {
        check_pointer("lengths", lengths, B);
        const int64_t sizes[1] = {B}, strides[1] = {lengths_stride};
        check_extent("lengths", sizes, strides, 1);
        if (memory == LengthsMemory::device) return;
        for (int64_t b = 0; b < B; ++b) {
            const int64_t len = lengths[b * lengths_stride];
            if (len < 0 || len > T)
                fail("lengths[" + std::to_string(b) + "] = " + std::to_string(len) + " is outside 0..seq_len (" +
                     std::to_string(T) + ")");
        }
    }
    if (cu_seqlens && memory == LengthsMemory::host) {
        if (cu_seqlens[0] != 0) fail("cu_seqlens[0] must be 0, got " + std::to_string(cu_seqlens[0]));
        for (int64_t b = 0; b < B; ++b)
            if (cu_seqlens[b + 1] < cu_seqlens[b])
                fail("cu_seqlens must be nondecreasing: cu_seqlens[" + std::to_string(b + 1) +
                     "] = " + std::to_string(cu_seqlens[b + 1]) + " < cu_seqlens[" + std::to_string(b) +
                     "] = " + std::to_string(cu_seqlens[b]));
        if (cu_seqlens[B] != T)
            fail("cu_seqlens[-1] must be the packed length seq_len (" + std::to_string(T) + "), got " +
                 std::to_string(cu_seqlens[B]));
    }
}

// Batch rows of the (time, batch, hidden) arrays: one for packed sequences.
inline int64_t array_rows(const int64_t* cu_seqlens, int64_t batch) { return cu_seqlens ? 1 : batch; }

}  // namespace qrnn::detail
