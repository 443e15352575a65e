// The scan families (ForgetMult, linear_scan) forward/backward through the public C++ API
// against a double-precision loop.
//
// Every array lives in its own exactly-sized heap buffer, laid out with odd strides
// (batch-first, hidden-major, gaps, reversed time via a negative time stride, broadcast
// stride-0 inputs), so AddressSanitizer catches any read or write outside the view.
// Gaps between elements hold NaN: an input gap read by mistake poisons the result, an
// output gap written by mistake no longer holds its canary bit pattern. Outputs start
// as NaN so every element must be written.
//
// The instruction set comes from QRNN_SIMD (generic|avx2|avx512); ctest runs this binary
// once per path. Exit code 77 (skipped) only when the CPU really lacks a forced path.
#include <qrnn/build_info.hpp>
#include <qrnn/forget_mult.hpp>
#include <qrnn/linear_scan.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_arrays.hpp"
#include "test_check.hpp"
#include "test_kernels.hpp"

using qrnn::DType;
using qrnn::bfloat16;
using qrnn::float16;
using namespace qrnn_test;

namespace {

// ---- the families --------------------------------------------------------------------------
// Each family: its parameter structs and entry points, its two sequence inputs u and v (f and
// x; a and b), one step of the recurrence and its adjoint in double precision.
struct ForgetMultScan {
    using Forward = qrnn::ForgetMultForwardParams;
    using Backward = qrnn::ForgetMultBackwardParams;
    static constexpr const char* name = "forget_mult";
    static constexpr double u_low = 0.05, u_high = 0.95;  // forget gates
    static double step(double f, double x, double state) { return f * x + (1 - f) * state; }
    // From g (the gradient reaching h[t]): {grad of u, grad of v, the gradient reaching h[t-1]}.
    static std::array<double, 3> adjoint(double g, double f, double x, double prev) {
        return {(x - prev) * g, f * g, g - f * g};
    }
    static void inputs(Forward& p, qrnn::ConstView3 f, qrnn::ConstView3 x) { p.f = f, p.x = x; }
    static void inputs(Backward& p, qrnn::ConstView3 f, qrnn::ConstView3 x) { p.f = f, p.x = x; }
    static void grads(Backward& p, qrnn::View3 grad_f, qrnn::View3 grad_x) { p.grad_f = grad_f, p.grad_x = grad_x; }
    static void forward(const Forward& p, int threads) { qrnn::cpu::forget_mult_forward(p, threads); }
    static void backward(const Backward& p, int threads) { qrnn::cpu::forget_mult_backward(p, threads); }
};

struct LinearScan {
    using Forward = qrnn::LinearScanForwardParams;
    using Backward = qrnn::LinearScanBackwardParams;
    static constexpr const char* name = "linear_scan";
    static constexpr double u_low = 0.05, u_high = 0.999;  // decays, some close to 1
    static double step(double a, double b, double state) { return a * state + b; }
    static std::array<double, 3> adjoint(double g, double a, double, double prev) { return {prev * g, g, a * g}; }
    static void inputs(Forward& p, qrnn::ConstView3 a, qrnn::ConstView3 b) { p.a = a, p.b = b; }
    static void inputs(Backward& p, qrnn::ConstView3 a, qrnn::ConstView3) { p.a = a; }  // no b: not needed
    static void grads(Backward& p, qrnn::View3 grad_a, qrnn::View3 grad_b) { p.grad_a = grad_a, p.grad_b = grad_b; }
    static void forward(const Forward& p, int threads) { qrnn::cpu::linear_scan_forward(p, threads); }
    static void backward(const Backward& p, int threads) { qrnn::cpu::linear_scan_backward(p, threads); }
};

// ---- the double-precision reference -------------------------------------------------------
template <typename F, typename T, typename S>
std::vector<double> reference_forward(const Strided<T>& u, const Strided<T>& v, const Strided<S>* h0) {
    const int64_t T_ = u.size[0], B = u.size[1], H = u.size[2];
    std::vector<double> h(size_t(T_ * B * H));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < H; ++j) {
            double state = h0 ? h0->at2(b, j) : 0.0;
            for (int64_t t = 0; t < T_; ++t) {
                state = F::step(u.at(t, b, j), v.at(t, b, j), state);
                h[size_t((t * B + b) * H + j)] = state;
            }
        }
    return h;
}

struct BackwardRef { std::vector<double> grad_u, grad_v, grad_h0; };

template <typename F, typename T, typename S>
BackwardRef reference_backward(const Strided<T>& u, const Strided<T>& v, const Strided<T>& h, const Strided<S>* h0,
                               const Strided<T>& grad_h) {
    const int64_t T_ = u.size[0], B = u.size[1], H = u.size[2];
    BackwardRef r{std::vector<double>(size_t(T_ * B * H)), std::vector<double>(size_t(T_ * B * H)),
                  std::vector<double>(size_t(B * H))};
    for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < H; ++j) {
            double g = 0;
            for (int64_t t = T_ - 1; t >= 0; --t) {
                g += grad_h.at(t, b, j);
                const double prev = t > 0 ? h.at(t - 1, b, j) : (h0 ? h0->at2(b, j) : 0.0);
                const auto [grad_u, grad_v, carried] = F::adjoint(g, u.at(t, b, j), v.at(t, b, j), prev);
                r.grad_u[size_t((t * B + b) * H + j)] = grad_u;
                r.grad_v[size_t((t * B + b) * H + j)] = grad_v;
                g = carried;
            }
            r.grad_h0[size_t(b * H + j)] = g;
        }
    return r;
}

// ---- one case ---------------------------------------------------------------------------
struct Shape { int64_t T, B, H; };

std::string describe(const char* family, const char* dir, const char* dtype, const char* state_dtype, Shape s,
                     const Layout& in, const Layout& out, bool has_h0, bool has_grad_h0, int threads) {
    return std::string(family) + " " + dir + " dtype=" + dtype + " T=" + std::to_string(s.T) +
           " B=" + std::to_string(s.B) + " H=" + std::to_string(s.H) + " inputs=" + in.name + " outputs=" + out.name +
           " h0=" + (has_h0 ? state_dtype : "absent") + " grad_h0=" + (has_grad_h0 ? state_dtype : "absent") +
           " threads=" + std::to_string(threads);
}

// The fields forward and backward share: sizes, dtypes, the inputs and h0 (absent unless has_h0).
template <typename F, typename Params, typename T, typename S>
Params params_of(Shape s, Strided<T>& u, Strided<T>& v, Strided<S>& h0, bool has_h0) {
    auto p = sized<Params>(s.T, s.B, s.H);
    p.dtype = qrnn::dtype_of<T>::value;
    F::inputs(p, u.cview3(), v.cview3());
    if (has_h0) p.h0 = h0.cview2();
    p.h0_dtype = qrnn::dtype_of<S>::value;
    return p;
}

// F: the family; T: sequence dtype; S: h0 / grad_h0 dtype (T, or float for a 16-bit T).
template <typename F, typename T, typename S>
void forward_case(Shape s, const Layout& in, const Layout& out, bool has_h0, int threads) {
    qrnn_test::Context ctx(
        describe(F::name, "forward", name_of<T>(), name_of<S>(), s, in, out, has_h0, false, threads));
    Strided<T> u(s.T, s.B, s.H, in), v(s.T, s.B, s.H, in), h(s.T, s.B, s.H, out);
    Strided<S> h0(1, s.B, s.H, in);
    u.fill_random(F::u_low, F::u_high);
    v.fill_random(-2, 2);
    if (with_non_finite) v.sprinkle_non_finite();
    h0.fill_random(-1, 1);
    auto p = params_of<F, typename F::Forward>(s, u, v, h0, has_h0);
    p.h = h.view3();
    CHECK_NOTHROW(F::forward(p, threads));
    const auto ref = reference_forward<F, T, S>(u, v, has_h0 ? &h0 : nullptr);
    h.check_output("h", [&](int64_t t, int64_t b, int64_t j) { return ref[size_t((t * s.B + b) * s.H + j)]; });
}

template <typename F, typename T, typename S>
void backward_case(Shape s, const Layout& in, const Layout& out, bool has_h0, bool has_grad_h0, int threads) {
    qrnn_test::Context ctx(
        describe(F::name, "backward", name_of<T>(), name_of<S>(), s, in, out, has_h0, has_grad_h0, threads));
    Strided<T> u(s.T, s.B, s.H, in), v(s.T, s.B, s.H, in), h(s.T, s.B, s.H, in), grad_h(s.T, s.B, s.H, in);
    Strided<T> grad_u(s.T, s.B, s.H, out), grad_v(s.T, s.B, s.H, out);
    Strided<S> h0(1, s.B, s.H, in), grad_h0(1, s.B, s.H, out);
    u.fill_random(F::u_low, F::u_high);
    v.fill_random(-2, 2);
    h.fill_random(-1, 1);  // any h: the backward formulas hold for whatever forward output is given
    if (with_non_finite) {
        v.sprinkle_non_finite();
        h.sprinkle_non_finite();
    }
    h0.fill_random(-1, 1);
    grad_h.fill_random(-1, 1);
    auto p = params_of<F, typename F::Backward>(s, u, v, h0, has_h0);
    p.h = h.cview3();
    p.grad_h = grad_h.cview3();
    F::grads(p, grad_u.view3(), grad_v.view3());
    if (has_grad_h0) p.grad_h0 = grad_h0.view2();
    CHECK_NOTHROW(F::backward(p, threads));
    const auto ref = reference_backward<F, T, S>(u, v, h, has_h0 ? &h0 : nullptr, grad_h);
    auto idx = [&](int64_t t, int64_t b, int64_t j) { return size_t((t * s.B + b) * s.H + j); };
    grad_u.check_output("grad of the first input",
                        [&](int64_t t, int64_t b, int64_t j) { return ref.grad_u[idx(t, b, j)]; });
    grad_v.check_output("grad of the second input",
                        [&](int64_t t, int64_t b, int64_t j) { return ref.grad_v[idx(t, b, j)]; });
    if (has_grad_h0)
        grad_h0.check_output("grad_h0",
                             [&](int64_t, int64_t b, int64_t j) { return ref.grad_h0[size_t(b * s.H + j)]; });
    else
        CHECK_MSG(std::all_of(grad_h0.buf.begin(), grad_h0.buf.end(), is_canary<S>), "absent grad_h0 was written");
}

// Odd sizes (1, 3, 17 hidden; one step; one row), sizes crossing the 512-unit work block,
// and zero sizes, each through every input layout with a rotating output layout.
const Shape kShapes[] = {
    {1, 1, 1},   {1, 1, 3},    {1, 3, 17}, {5, 1, 17}, {7, 3, 17}, {3, 2, 1}, {13, 5, 64},
    {4, 2, 513}, {3, 1, 1030}, {0, 2, 3},  {3, 0, 3},  {3, 2, 0},  {0, 0, 0},
};
const Layout kInputLayouts[] = {kTimeMajor,   kBatchFirst,    kGappy, kReversed, kReversedBatchFirstGappy,
                                kHiddenMajor, kBroadcastBatch};

// Everything runs through the thread pool when `threaded_only` (the ThreadSanitizer run).
bool threaded_only = false;

template <typename F, typename T, typename S>
void sweep(bool state_modes_with_absent) {
    int k = 0;
    for (const Shape& s : kShapes)
        if (!threaded_only)
            for (const Layout& in : kInputLayouts) {
                const Layout& out = kOutputLayouts[size_t(k++) % std::size(kOutputLayouts)];
                if (state_modes_with_absent) {
                    forward_case<F, T, S>(s, in, out, false, 1);
                    backward_case<F, T, S>(s, in, out, false, false, 1);
                    backward_case<F, T, S>(s, in, out, false, true, 1);  // gradient of an all-zero initial state
                }
                forward_case<F, T, S>(s, in, out, true, 1);
                backward_case<F, T, S>(s, in, out, true, true, 1);
                backward_case<F, T, S>(s, in, out, true, false, 1);
            }
    // Enough work for several threads of the pool (items = batch x hidden blocks).
    for (const Layout& in : {kTimeMajor, kReversedBatchFirstGappy}) {
        forward_case<F, T, S>({16, 8, 1100}, in, kBatchFirst, true, 4);
        backward_case<F, T, S>({16, 8, 1100}, in, kReversed, true, true, 4);
    }
}

template <typename F>
void all_dtypes() {
    sweep<F, float, float>(true);
    sweep<F, double, double>(true);
    sweep<F, bfloat16, bfloat16>(true);
    sweep<F, bfloat16, float>(false);  // float32 carried state with 16-bit sequences
    sweep<F, float16, float16>(true);
    sweep<F, float16, float>(false);
}

// The fixed contiguous float32 entry points.
void fixed_entry_points() {
    qrnn_test::Context ctx("fixed float32 entry points");
    const int64_t T = 6, B = 3, H = 19;
    for (bool has_h0 : {false, true}) {
        Strided<float> f(T, B, H, kTimeMajor), x(T, B, H, kTimeMajor), h(T, B, H, kTimeMajor), h0(1, B, H, kTimeMajor);
        Strided<float> grad_h(T, B, H, kTimeMajor), grad_f(T, B, H, kTimeMajor), grad_x(T, B, H, kTimeMajor);
        Strided<float> grad_h0(1, B, H, kTimeMajor);
        f.fill_random(0.05, 0.95);
        x.fill_random(-2, 2);
        h0.fill_random(-1, 1);
        grad_h.fill_random(-1, 1);
        const float* h0p = has_h0 ? h0.ptr() : nullptr;
        qrnn::cpu::forget_mult(f.ptr(), x.ptr(), h0p, h.ptr(), T, B, H);
        const auto ref = reference_forward<ForgetMultScan, float, float>(f, x, has_h0 ? &h0 : nullptr);
        h.check_output("h", [&](int64_t t, int64_t b, int64_t j) { return ref[size_t((t * B + b) * H + j)]; });
        qrnn::cpu::forget_mult_backward(f.ptr(), x.ptr(), h0p, h.ptr(), grad_h.ptr(), grad_f.ptr(), grad_x.ptr(),
                                        has_h0 ? grad_h0.ptr() : nullptr, T, B, H);
        const auto r = reference_backward<ForgetMultScan, float, float>(f, x, h, has_h0 ? &h0 : nullptr, grad_h);
        auto idx = [&](int64_t t, int64_t b, int64_t j) { return size_t((t * B + b) * H + j); };
        grad_f.check_output("grad_f", [&](int64_t t, int64_t b, int64_t j) { return r.grad_u[idx(t, b, j)]; });
        grad_x.check_output("grad_x", [&](int64_t t, int64_t b, int64_t j) { return r.grad_v[idx(t, b, j)]; });
        if (has_h0)
            grad_h0.check_output("grad_h0",
                                 [&](int64_t, int64_t b, int64_t j) { return r.grad_h0[size_t(b * H + j)]; });
    }
    // Zero sizes with null pointers do nothing.
    CHECK_NOTHROW(qrnn::cpu::forget_mult(nullptr, nullptr, nullptr, nullptr, 0, 4, 4));
    CHECK_NOTHROW(qrnn::cpu::forget_mult_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                  nullptr, 4, 0, 4));
}

// Packed sequences (cu_seqlens): each sequence from its own h0, forwards and reversed, an
// empty one included, against the recurrence run per sequence in double; whatever rows the
// instruction set runs, the sequence walk is the scan core's.
void packed_sequences() {
    qrnn_test::Context ctx("packed sequences (cu_seqlens)");
    const int64_t H = 19, N = 4;
    const std::vector<int64_t> cu = {0, 3, 3, 4, 11};
    const int64_t T = cu.back();
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> unit(0.05f, 0.95f), wide(-2.f, 2.f);
    std::vector<float> f(size_t(T * H)), x(size_t(T * H)), h0(size_t(N * H));
    for (auto& v : f) v = unit(gen);
    for (auto& v : x) v = wide(gen);
    for (auto& v : h0) v = wide(gen);
    for (bool reverse : {false, true}) {
        std::vector<float> h(size_t(T * H), std::nanf(""));
        qrnn::ForgetMultForwardParams p;
        p.seq_len = T, p.batch = N, p.hidden = H, p.dtype = qrnn::DType::float32;
        p.f = {f.data(), H, 0, 1}, p.x = {x.data(), H, 0, 1}, p.h0 = {h0.data(), H, 1};
        p.h = {h.data(), H, 0, 1};
        p.cu_seqlens = cu.data(), p.reverse = reverse;
        qrnn::cpu::forget_mult_forward(p, 2);
        for (int64_t n = 0; n < N; ++n)
            for (int64_t j = 0; j < H; ++j) {
                double state = h0[size_t(n * H + j)];
                const int64_t steps = cu[size_t(n + 1)] - cu[size_t(n)];
                for (int64_t k = 0; k < steps; ++k) {
                    const int64_t t = reverse ? cu[size_t(n + 1)] - 1 - k : cu[size_t(n)] + k;
                    const double fv = f[size_t(t * H + j)];
                    state = fv * x[size_t(t * H + j)] + (1 - fv) * state;
                    CHECK(std::fabs(h[size_t(t * H + j)] - state) <= 1e-5 * (1 + std::fabs(state)));
                }
            }
    }
    // Offsets that do not end at the packed length are refused, naming them.
    qrnn::ForgetMultForwardParams bad;
    std::vector<float> h(size_t(T * H));
    const std::vector<int64_t> short_cu = {0, 3, 10};
    bad.seq_len = T, bad.batch = 2, bad.hidden = H, bad.dtype = qrnn::DType::float32;
    bad.f = {f.data(), H, 0, 1}, bad.x = {x.data(), H, 0, 1}, bad.h = {h.data(), H, 0, 1};
    bad.cu_seqlens = short_cu.data();
    bool refused = false;
    try {
        qrnn::cpu::forget_mult_forward(bad, 1);
    } catch (const std::invalid_argument& e) {
        refused = std::string(e.what()).find("cu_seqlens") != std::string::npos;
    }
    CHECK(refused);
}

// NaN and Inf inputs propagate as they do in the plain formula; nothing traps.
void non_finite_inputs() {
    qrnn_test::Context ctx("NaN/Inf inputs");
    const int64_t T = 3, B = 1, H = 5;
    std::vector<float> f(T * B * H, 0.5f), x(T * B * H, 1.0f), h(T * B * H, 0.0f);
    const float inf = std::numeric_limits<float>::infinity();
    x[0] = std::nanf("");  // h[0,0,0] and every later step of unit 0 is NaN
    x[1] = inf;            // unit 1 is +Inf from t=0 on
    qrnn::cpu::forget_mult(f.data(), x.data(), nullptr, h.data(), T, B, H);
    for (int64_t t = 0; t < T; ++t) {
        CHECK(std::isnan(h[size_t(t * H)]));
        CHECK(std::isinf(h[size_t(t * H + 1)]) && h[size_t(t * H + 1)] > 0);
        CHECK(std::isfinite(h[size_t(t * H + 2)]));
    }
}

// NaN and +-Inf among x (b) and h through every dtype's rows, at sizes with a row tail on
// every vector width (4, 8, 16 lanes) and a single unit: NaN exactly where the float64 loop
// has NaN, the same infinities, every element still written.
template <typename F>
void non_finite_rows() {
    qrnn_test::with_non_finite = true;
    for (const Shape& s : {Shape{4, 2, 21}, Shape{3, 1, 1}, Shape{3, 2, 300}})
        for (const Layout& in : {kTimeMajor, kGappy}) {
            forward_case<F, float, float>(s, in, kTimeMajor, true, 1);
            backward_case<F, float, float>(s, in, kTimeMajor, true, true, 1);
            forward_case<F, bfloat16, float>(s, in, kBatchFirst, true, 1);
            backward_case<F, bfloat16, float>(s, in, kTimeMajor, true, true, 1);
            forward_case<F, float16, float16>(s, in, kTimeMajor, true, 1);
            backward_case<F, float16, float16>(s, in, kTimeMajor, true, true, 1);
            forward_case<F, double, double>(s, in, kTimeMajor, true, 1);
        }
    qrnn_test::with_non_finite = false;
}

// ---- invalid arguments -------------------------------------------------------------------
void invalid_arguments() {
    qrnn_test::Context ctx("invalid arguments");
    using qrnn::cpu::forget_mult_forward;
    using qrnn::cpu::forget_mult_backward;
    float buf[64] = {};
    const int64_t big = int64_t(1) << 22, max = std::numeric_limits<int64_t>::max();

    auto fwd = [&] {
        auto p = sized<qrnn::ForgetMultForwardParams>(2, 2, 2);
        p.f = {buf, 4, 2, 1};
        p.x = {buf, 4, 2, 1};
        p.h = {buf + 8, 4, 2, 1};
        return p;
    };
    auto bwd = [&] {
        auto p = sized<qrnn::ForgetMultBackwardParams>(2, 2, 2);
        p.f = {buf, 4, 2, 1};
        p.x = {buf, 4, 2, 1};
        p.h = {buf, 4, 2, 1};
        p.grad_h = {buf, 4, 2, 1};
        p.grad_f = {buf + 8, 4, 2, 1};
        p.grad_x = {buf + 16, 4, 2, 1};
        return p;
    };
    check_size_arguments(fwd, [](const qrnn::ForgetMultForwardParams& p) { forget_mult_forward(p); }, -3);
    CHECK_NOTHROW(forget_mult_backward(bwd()));

    CHECK_REJECTS(fwd, forget_mult_forward, "f", p.f.data = nullptr);
    CHECK_REJECTS(fwd, forget_mult_forward, "x", p.x.data = nullptr);
    CHECK_REJECTS(fwd, forget_mult_forward, "h", p.h.data = nullptr);
    CHECK_REJECTS(fwd, forget_mult_forward, "overflow", p.seq_len = big; p.batch = big; p.hidden = big);
    CHECK_REJECTS(fwd, forget_mult_forward, "overflow", p.seq_len = max; p.batch = 2);
    CHECK_REJECTS(fwd, forget_mult_forward, "f", p.seq_len = 3; p.f.stride_t = max / 2 + 1);
    CHECK_REJECTS(fwd, forget_mult_forward, "x", p.x.stride_b = std::numeric_limits<int64_t>::min());
    CHECK_REJECTS(fwd, forget_mult_forward, "h", p.h.stride_h = -max; p.h.stride_t = -max);
    CHECK_REJECTS(fwd, forget_mult_forward, "h0", p.h0 = {buf, max, 1});
    CHECK_REJECTS(fwd, forget_mult_forward, "dtype", p.dtype = DType(7));
    CHECK_REJECTS(fwd, forget_mult_forward, "dtype", p.dtype = DType(-1));
    CHECK_REJECTS(fwd, forget_mult_forward, "h0_dtype", p.h0 = {buf, 2, 1}; p.h0_dtype = DType::float64);
    CHECK_REJECTS(fwd, forget_mult_forward, "h0_dtype", p.dtype = DType::float64; p.h0 = {buf, 2, 1};
                  p.h0_dtype = DType::float32);
    CHECK_REJECTS(fwd, forget_mult_forward, "h0_dtype", p.dtype = DType::bfloat16; p.h0 = {buf, 2, 1};
                  p.h0_dtype = DType::float16);
    CHECK_REJECTS(fwd, forget_mult_forward, "h0_dtype", p.h0 = {buf, 2, 1}; p.h0_dtype = DType(42));
    // Zero elements: null pointers and any strides are fine, nothing is touched.
    {
        auto p = fwd();
        p.seq_len = 0;
        p.f = {};
        p.x = {};
        p.h = {nullptr, max, max, max};
        CHECK_NOTHROW(forget_mult_forward(p));
    }

    CHECK_REJECTS(bwd, forget_mult_backward, "seq_len", p.seq_len = -1);
    CHECK_REJECTS(bwd, forget_mult_backward, "hidden", p.hidden = -1);
    CHECK_REJECTS(bwd, forget_mult_backward, "h", p.h.data = nullptr);
    CHECK_REJECTS(bwd, forget_mult_backward, "grad_h", p.grad_h.data = nullptr);
    CHECK_REJECTS(bwd, forget_mult_backward, "grad_f", p.grad_f.data = nullptr);
    CHECK_REJECTS(bwd, forget_mult_backward, "grad_x", p.grad_x.data = nullptr);
    CHECK_REJECTS(bwd, forget_mult_backward, "grad_f", p.grad_f.stride_t = max);
    CHECK_REJECTS(bwd, forget_mult_backward, "grad_h0", p.grad_h0 = {buf + 32, max, 1});
    CHECK_REJECTS(bwd, forget_mult_backward, "overflow", p.seq_len = big; p.batch = big; p.hidden = big);
    CHECK_REJECTS(bwd, forget_mult_backward, "h0_dtype", p.dtype = DType::float64; p.grad_h0 = {buf + 32, 2, 1};
                  p.h0_dtype = DType::float32);

    // An empty sequence over a huge (batch, hidden) must return at once: nothing to write.
    {
        auto p = bwd();
        p.seq_len = 0;
        p.batch = int64_t(1) << 31;
        p.hidden = int64_t(1) << 31;
        p.f = {};
        p.x = {};
        p.h = {};
        p.grad_h = {};
        p.grad_f = {};
        p.grad_x = {};
        CHECK_NOTHROW(forget_mult_backward(p));
        p.batch = p.hidden = int64_t(1) << 32;  // batch * hidden overflows int64: still nothing to do
        CHECK_NOTHROW(forget_mult_backward(p));
        p.grad_h0 = {buf + 32, 1, 1};           // ...unless grad_h0 must be written
        CHECK_THROWS(forget_mult_backward(p), std::invalid_argument, "overflow");
    }

    // The fixed entry points check the same way, including sizes whose products overflow.
    CHECK_THROWS(qrnn::cpu::forget_mult(buf, buf, nullptr, buf + 8, -1, 2, 2), std::invalid_argument, "seq_len");
    CHECK_THROWS(qrnn::cpu::forget_mult(nullptr, buf, nullptr, buf + 8, 2, 2, 2), std::invalid_argument, "f");
    CHECK_THROWS(qrnn::cpu::forget_mult(buf, buf, nullptr, buf + 8, 1, int64_t(1) << 40, int64_t(1) << 40),
                 std::invalid_argument, "overflow");
    CHECK_THROWS(qrnn::cpu::forget_mult_backward(buf, buf, nullptr, buf, buf, buf + 8, buf + 16, nullptr, 1,
                                                 int64_t(1) << 40, int64_t(1) << 40),
                 std::invalid_argument, "overflow");
}

// ---- concurrency -------------------------------------------------------------------------
// Several application threads call the kernels at once, each asking for a few pool threads;
// every result must still be right (and ThreadSanitizer must see no race).
void concurrent_callers() {
    qrnn_test::Context ctx("concurrent callers");
    const int64_t T = 12, B = 8, H = 1030;
    const int n_callers = 4, calls_each = 3;
    std::vector<Strided<float>> fs, xs;
    std::vector<std::vector<double>> refs;
    for (int c = 0; c < n_callers; ++c) {
        fs.emplace_back(T, B, H, kTimeMajor);
        xs.emplace_back(T, B, H, c % 2 ? kReversedBatchFirstGappy : kTimeMajor);
        fs.back().fill_random(0.05, 0.95);
        xs.back().fill_random(-2, 2);
        refs.push_back(reference_forward<ForgetMultScan, float, float>(fs.back(), xs.back(), nullptr));
    }
    std::atomic<int> wrong{0}, thrown{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < n_callers; ++c)
        threads.emplace_back([&, c] {
            for (int k = 0; k < calls_each; ++k) {
                std::vector<float> h(size_t(T * B * H), std::nanf(""));
                auto p = sized<qrnn::ForgetMultForwardParams>(T, B, H);
                p.f = fs[size_t(c)].cview3();
                p.x = xs[size_t(c)].cview3();
                p.h = {h.data(), B * H, H, 1};
                try {
                    qrnn::cpu::forget_mult_forward(p, 3);
                } catch (...) {
                    ++thrown;
                }
                for (size_t i = 0; i < h.size(); ++i)
                    if (!(std::abs(h[i] - refs[size_t(c)][i]) <= 2e-5 + 2e-5 * std::abs(refs[size_t(c)][i]))) {
                        ++wrong;
                        break;
                    }
            }
        });
    for (auto& t : threads) t.join();
    CHECK(thrown == 0);
    CHECK(wrong == 0);
}

}  // namespace

int main(int argc, char** argv) {
    threaded_only = argc > 1 && std::string(argv[1]) == "--threaded-only";
    CHECK(std::string(qrnn::build_info().simd) == qrnn::cpu::simd_level());
    if (start_kernel_test("test_scan") == 77) return 77;

    all_dtypes<ForgetMultScan>();
    all_dtypes<LinearScan>();
    if (!threaded_only) {
        fixed_entry_points();
        packed_sequences();
        non_finite_inputs();
        non_finite_rows<ForgetMultScan>();
        non_finite_rows<LinearScan>();
        invalid_arguments();
    }
    concurrent_callers();
    return qrnn_test::result("test_scan");
}
