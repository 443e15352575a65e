// Strided test arrays shared by the C++ kernel tests: every array in its own exactly
// sized heap buffer, laid out with odd strides (batch-first, hidden-major, gaps, reversed
// time via a negative time stride, broadcast stride-0 inputs), so AddressSanitizer catches
// any access outside the view. Gaps hold a NaN canary: an input gap read by mistake
// poisons the result, an output gap written by mistake no longer holds its bit pattern.
#pragma once

#include <qrnn/dtype.hpp>
#include <qrnn/view.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_check.hpp"

namespace qrnn_test {

using qrnn::bfloat16;
using qrnn::float16;

inline std::mt19937_64 rng;  // seeded by each test's main()
// Set by the non-finite passes: the cases sprinkle NaN and +-Inf into some of their inputs
// (Strided::sprinkle_non_finite), and check_output expects NaN where the reference has it.
inline bool with_non_finite = false;

// ---- element conversions ---------------------------------------------------------------
template <typename T> double get(T v) { return double(qrnn::to_float(v)); }
template <typename T> T put(double v) { return qrnn::from_float<T>(float(v)); }
template <> inline double put<double>(double v) { return v; }

// NaN bit patterns with a payload, so "still the canary" is a bitwise comparison.
template <typename T> T canary();
template <> inline float canary<float>() { return qrnn::bits_to_float(0x7fc0beefu); }
template <> inline double canary<double>() {
    uint64_t u = 0x7ff8dead0000beefull;
    double d;
    std::memcpy(&d, &u, 8);
    return d;
}
template <> inline bfloat16 canary<bfloat16>() { return bfloat16{0x7fc5}; }
template <> inline float16 canary<float16>() { return float16{0x7e05}; }
template <typename T> bool is_canary(const T& v) {
    T c = canary<T>();
    return std::memcmp(&v, &c, sizeof(T)) == 0;
}

template <typename T> const char* name_of() { return qrnn::dtype_name(qrnn::dtype_of<T>::value); }

// (atol, rtol) against the double loop, as tests/conftest.py TOLERANCES.
template <typename T> std::array<double, 2> tolerance();
template <> inline std::array<double, 2> tolerance<double>() { return {1e-12, 1e-12}; }
template <> inline std::array<double, 2> tolerance<float>() { return {2e-5, 2e-5}; }
template <> inline std::array<double, 2> tolerance<bfloat16>() { return {3e-2, 2e-2}; }
template <> inline std::array<double, 2> tolerance<float16>() { return {4e-3, 3e-3}; }

// ---- strided arrays --------------------------------------------------------------------
// How an array of logical shape (time, batch, hidden) is laid out in memory.
struct Layout {
    const char* name;
    std::array<int, 3> order;       // dims from outermost to innermost (0 time, 1 batch, 2 hidden)
    std::array<int64_t, 3> spread;  // stride multiplier per dim: > 1 leaves gaps
    bool reverse_time = false;      // negative time stride, data pointer at the last step
    bool broadcast_batch = false;   // stride 0 over batch (inputs only)
};

inline const Layout kTimeMajor{"time-major", {0, 1, 2}, {1, 1, 1}};
inline const Layout kBatchFirst{"batch-first", {1, 0, 2}, {1, 1, 1}};
inline const Layout kGappy{"gaps", {0, 1, 2}, {2, 3, 2}};
inline const Layout kReversed{"reversed-time", {0, 1, 2}, {1, 1, 1}, true};
inline const Layout kReversedBatchFirstGappy{"reversed-batch-first-gaps", {1, 0, 2}, {1, 2, 3}, true};
inline const Layout kHiddenMajor{"hidden-outermost", {2, 0, 1}, {1, 1, 1}};
inline const Layout kBroadcastBatch{"broadcast-batch", {0, 1, 2}, {1, 1, 1}, false, true};
inline const Layout kOutputLayouts[] = {kTimeMajor,  kBatchFirst, kGappy, kReversed, kReversedBatchFirstGappy,
                                        kHiddenMajor};

template <typename E>
struct Strided {
    int64_t size[3];
    int64_t stride[3] = {0, 0, 0};
    int64_t base = 0;
    std::vector<E> buf;         // exactly as long as the view reaches: ASan sees any overrun
    std::vector<char> in_view;  // which buffer slots belong to the view (the rest are gaps)

    // A 2-D (batch, hidden) array is a 3-D one with one time step.
    Strided(int64_t T, int64_t B, int64_t H, const Layout& layout) : size{T, B, H} {
        int64_t running = 1;
        for (int k = 2; k >= 0; --k) {
            const int d = layout.order[k];
            if (d == 1 && layout.broadcast_batch) continue;
            stride[d] = running * layout.spread[d];
            running = stride[d] * std::max<int64_t>(size[d], 1);
        }
        if (layout.reverse_time && T > 0) {
            base = (T - 1) * stride[0];
            stride[0] = -stride[0];
        }
        const bool empty = T == 0 || B == 0 || H == 0;
        const int64_t n = empty ? 0 : 1 + (T - 1) * std::abs(stride[0]) + (B - 1) * stride[1] + (H - 1) * stride[2];
        buf.assign(size_t(n), canary<E>());
        in_view.assign(size_t(n), 0);
        for_each([&](int64_t, int64_t, int64_t, int64_t o) { in_view[size_t(o)] = 1; });
    }

    int64_t offset(int64_t t, int64_t b, int64_t h) const {
        return base + t * stride[0] + b * stride[1] + h * stride[2];
    }
    template <typename F> void for_each(F fn) const {
        for (int64_t t = 0; t < size[0]; ++t)
            for (int64_t b = 0; b < size[1]; ++b)
                for (int64_t h = 0; h < size[2]; ++h) fn(t, b, h, offset(t, b, h));
    }
    double at(int64_t t, int64_t b, int64_t h) const { return get(buf[size_t(offset(t, b, h))]); }
    double at2(int64_t b, int64_t h) const { return at(0, b, h); }

    void fill_random(double lo, double hi) {
        std::uniform_real_distribution<double> dist(lo, hi);
        for_each([&](int64_t, int64_t, int64_t, int64_t o) { buf[size_t(o)] = put<E>(dist(rng)); });
    }
    // Every 7th element of the view becomes NaN, +Inf or -Inf in turn (the non-finite passes).
    void sprinkle_non_finite() {
        const double values[3] = {std::nan(""), HUGE_VAL, -HUGE_VAL};
        int64_t k = 0;
        for_each([&](int64_t, int64_t, int64_t, int64_t o) {
            if (k % 7 == 3) buf[size_t(o)] = put<E>(values[(k / 7) % 3]);
            ++k;
        });
    }
    // Empty views pass a null pointer: the core must not touch it.
    E* ptr() { return buf.empty() ? nullptr : buf.data() + base; }
    qrnn::ConstView3 cview3() { return {ptr(), stride[0], stride[1], stride[2]}; }
    qrnn::View3 view3() { return {ptr(), stride[0], stride[1], stride[2]}; }
    qrnn::ConstView2 cview2() { return {ptr(), stride[1], stride[2]}; }
    qrnn::View2 view2() { return {ptr(), stride[1], stride[2]}; }

    // Every view element written and close to `expected`; every gap left alone.
    template <typename Ref>
    void check_output(const char* what, Ref expected) const {
        const auto tol = tolerance<E>();
        int bad = 0;
        for_each([&](int64_t t, int64_t b, int64_t h, int64_t o) {
            const double got = get(buf[size_t(o)]), want = expected(t, b, h);
            // NaN where the reference has NaN (but not the canary: it was written), the same
            // infinity, or close.
            const bool ok = std::isnan(want) ? std::isnan(got) && !is_canary(buf[size_t(o)])
                                             : got == want || std::abs(got - want) <= tol[0] + tol[1] * std::abs(want);
            if (!ok && bad++ < 3)
                CHECK_MSG(false, std::string(what) + "[t=" + std::to_string(t) + ",b=" + std::to_string(b) +
                                     ",h=" + std::to_string(h) + "] = " + std::to_string(got) + ", expected " +
                                     std::to_string(want));
        });
        for (size_t i = 0; i < buf.size(); ++i)
            if (!in_view[i] && !is_canary(buf[i])) {
                CHECK_MSG(false, std::string(what) + ": gap element " + std::to_string(i) + " was overwritten");
                break;
            }
    }
};

}  // namespace qrnn_test
