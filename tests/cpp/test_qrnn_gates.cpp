// The fused QRNN gate kernels (qrnn::cpu::qrnn_gates_forward/backward) through the public
// API against a double-precision loop: odd sizes, zero sizes, strided / batch-first /
// reversed-time / broadcast layouts in exactly sized buffers (see test_arrays.hpp),
// every dtype and state dtype, output gate on/off, variable lengths (strided), reverse
// direction, zoneout mask and scale, optional c0 / c_n / grad_output / grad_c_n, several
// threads, invalid arguments. Run once per instruction set (QRNN_SIMD), like ForgetMult.
#include <qrnn/build_info.hpp>
#include <qrnn/forget_mult.hpp>
#include <qrnn/qrnn_gates.hpp>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "test_arrays.hpp"
#include "test_check.hpp"
#include "test_kernels.hpp"

using qrnn::DType;
using namespace qrnn_test;

namespace {

struct Options {
    bool output_gate, lengths, reverse, mask, c0, c_n, grad_output, grad_c_n;
    double scale;
};

// Each option on and off against the others, kept short for the sanitizer runs.
const Options kOptionSets[] = {
    {true, false, false, false, false, false, true, false, 1.0},
    {true, true, true, true, true, true, true, true, 0.75},
    {false, false, true, true, true, false, true, true, 1.0},
    {false, true, false, false, false, true, false, true, 0.5},
    {true, true, false, true, false, true, true, false, 1.0},
    {false, false, false, false, true, true, true, true, 0.9},
    {true, false, true, false, true, false, false, true, 1.0},
};

std::string describe(const char* dir, const char* dtype, const char* state, int64_t T, int64_t B, int64_t H,
                     const Layout& in, const Layout& out, const Options& o, int threads) {
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "%s dtype=%s state=%s T=%lld B=%lld H=%lld inputs=%s outputs=%s output_gate=%d lengths=%d "
                  "reverse=%d mask=%d scale=%g c0=%d c_n=%d grad_output=%d grad_c_n=%d threads=%d",
                  dir, dtype, state, (long long)T, (long long)B, (long long)H, in.name, out.name, o.output_gate,
                  o.lengths, o.reverse, o.mask, o.scale, o.c0, o.c_n, o.grad_output, o.grad_c_n, threads);
    return buf;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

template <typename T, typename S>
struct Case {
    int64_t T_, B, H, n_gates;
    Options o;
    Strided<T> gates, mask;
    Strided<S> c0;
    std::vector<int64_t> lengths_buf;  // lengths at stride 2, gaps hold garbage
    int64_t lengths_stride = 2;

    Case(int64_t steps, int64_t B_, int64_t H_, const Layout& in, const Options& opt)
        : T_(steps), B(B_), H(H_), n_gates(opt.output_gate ? 3 : 2), o(opt),
          gates(steps, B_, (opt.output_gate ? 3 : 2) * H_, in), mask(steps, B_, H_, in), c0(1, B_, H_, in) {
        gates.fill_random(-4, 4);
        if (with_non_finite) gates.sprinkle_non_finite();
        std::uniform_int_distribution<int> bit(0, 3);
        mask.for_each(
            [&](int64_t, int64_t, int64_t, int64_t off) { mask.buf[size_t(off)] = put<T>(bit(rng) ? 1.0 : 0.0); });
        c0.fill_random(-1, 1);
        lengths_buf.assign(size_t(std::max<int64_t>(1, 2 * B)), int64_t(-777));  // gaps: invalid on purpose
        std::uniform_int_distribution<int64_t> len(0, steps);
        for (int64_t b = 0; b < B; ++b) lengths_buf[size_t(b * lengths_stride)] = (b == 0 ? steps : len(rng));
    }
    int64_t length(int64_t b) const { return o.lengths ? lengths_buf[size_t(b * lengths_stride)] : T_; }
    int64_t step(int64_t b, int64_t k) const { return o.reverse ? length(b) - 1 - k : k; }
    const int64_t* lengths_ptr() const { return o.lengths ? lengths_buf.data() : nullptr; }
    double gate(int64_t g, int64_t t, int64_t b, int64_t j) const { return gates.at(t, b, g * H + j); }
    double keep(int64_t t, int64_t b, int64_t j) const { return (o.mask ? mask.at(t, b, j) : 1.0) * o.scale; }
    double c0_at(int64_t b, int64_t j) const { return o.c0 ? c0.at2(b, j) : 0.0; }
    size_t idx(int64_t t, int64_t b, int64_t j) const { return size_t((t * B + b) * H + j); }

    // The fields forward and backward share: sizes, dtypes, gates, mask, c0, lengths, direction.
    template <typename Params>
    Params params() {
        auto p = sized<Params>(T_, B, H);
        p.dtype = qrnn::dtype_of<T>::value;
        p.output_gate = o.output_gate;
        p.gates = gates.cview3();
        p.gate_stride = H * gates.stride[2];
        if (o.mask) p.forget_mask = mask.cview3();
        p.forget_scale = o.scale;
        if (o.c0) p.c0 = c0.cview2();
        p.c0_dtype = qrnn::dtype_of<S>::value;
        p.lengths = lengths_ptr();
        p.lengths_stride = lengths_stride;
        p.reverse = o.reverse;
        return p;
    }

    // Double-precision forward: output, states and the final state.
    void reference_forward(std::vector<double>& out, std::vector<double>& st, std::vector<double>& c_n) const {
        out.assign(size_t(T_ * B * H), 0.0);
        st.assign(size_t(T_ * B * H), 0.0);
        c_n.assign(size_t(B * H), 0.0);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t j = 0; j < H; ++j) {
                double c = c0_at(b, j);
                for (int64_t k = 0; k < length(b); ++k) {
                    const int64_t t = step(b, k);
                    const double z = std::tanh(gate(0, t, b, j)), f = sigmoid(gate(1, t, b, j)) * keep(t, b, j);
                    c = f * z + (1 - f) * c;
                    st[idx(t, b, j)] = c;
                    out[idx(t, b, j)] = o.output_gate ? sigmoid(gate(2, t, b, j)) * c : c;
                }
                c_n[size_t(b * H + j)] = c;
            }
    }
};

template <typename T, typename S>
void forward_case(int64_t T_, int64_t B, int64_t H, const Layout& in, const Layout& out, const Options& o,
                  int threads) {
    qrnn_test::Context ctx(describe("forward", name_of<T>(), name_of<S>(), T_, B, H, in, out, o, threads));
    Case<T, S> c(T_, B, H, in, o);
    Strided<T> output(T_, B, H, out), states(T_, B, H, out);
    Strided<S> c_n(1, B, H, out);
    auto p = c.template params<qrnn::QrnnGatesForwardParams>();
    p.output = output.view3();
    p.states = states.view3();
    if (o.c_n) p.c_n = c_n.view2();
    p.c_n_dtype = qrnn::dtype_of<S>::value;
    CHECK_NOTHROW(qrnn::cpu::qrnn_gates_forward(p, threads));
    std::vector<double> ref_out, ref_states, ref_cn;
    c.reference_forward(ref_out, ref_states, ref_cn);
    output.check_output("output", [&](int64_t t, int64_t b, int64_t j) { return ref_out[c.idx(t, b, j)]; });
    states.check_output("states", [&](int64_t t, int64_t b, int64_t j) { return ref_states[c.idx(t, b, j)]; });
    if (o.c_n) c_n.check_output("c_n", [&](int64_t, int64_t b, int64_t j) { return ref_cn[size_t(b * H + j)]; });
}

template <typename T, typename S>
void backward_case(int64_t T_, int64_t B, int64_t H, const Layout& in, const Layout& out, const Options& o,
                   int threads) {
    qrnn_test::Context ctx(describe("backward", name_of<T>(), name_of<S>(), T_, B, H, in, out, o, threads));
    Case<T, S> c(T_, B, H, in, o);
    // The forward's states, as stored (rounded to T), are what the backward reads.
    std::vector<double> ref_out, ref_states, ref_cn;
    c.reference_forward(ref_out, ref_states, ref_cn);
    // states must be what the forward wrote for every row: never a broadcast view.
    Strided<T> states(T_, B, H, in.broadcast_batch ? kTimeMajor : in), grad_output(T_, B, H, in);
    states.for_each([&](int64_t t, int64_t b, int64_t j, int64_t off) {
        states.buf[size_t(off)] = put<T>(ref_states[c.idx(t, b, j)]);
    });
    grad_output.fill_random(-1, 1);
    Strided<S> grad_c_n(1, B, H, in), grad_c0(1, B, H, out);
    grad_c_n.fill_random(-1, 1);
    Strided<T> grad_gates(T_, B, c.n_gates * H, out);

    auto p = c.template params<qrnn::QrnnGatesBackwardParams>();
    p.states = states.cview3();
    if (o.grad_output) p.grad_output = grad_output.cview3();
    if (o.grad_c_n) p.grad_c_n = grad_c_n.cview2();
    p.c_n_dtype = qrnn::dtype_of<S>::value;
    p.grad_gates = grad_gates.view3();
    p.grad_gate_stride = H * grad_gates.stride[2];
    if (o.c0) p.grad_c0 = grad_c0.view2();
    CHECK_NOTHROW(qrnn::cpu::qrnn_gates_backward(p, threads));

    // Double-precision backward over the stored states.
    std::vector<double> ref_dg(size_t(T_ * B * c.n_gates * H), 0.0), ref_dc0(size_t(B * H), 0.0);
    auto dg = [&](int64_t g, int64_t t, int64_t b, int64_t j) -> double& {
        return ref_dg[size_t((t * B + b) * c.n_gates * H + g * H + j)];
    };
    for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < H; ++j) {
            double gc = o.grad_c_n ? grad_c_n.at2(b, j) : 0.0;
            for (int64_t k = c.length(b) - 1; k >= 0; --k) {
                const int64_t t = c.step(b, k);
                const double c_t = states.at(t, b, j);
                const double c_prev = k > 0 ? states.at(c.step(b, k - 1), b, j) : c.c0_at(b, j);
                const double z = std::tanh(c.gate(0, t, b, j)), fr = sigmoid(c.gate(1, t, b, j));
                const double f = fr * c.keep(t, b, j);
                const double go = o.grad_output ? grad_output.at(t, b, j) : 0.0;
                if (o.output_gate) {
                    const double og = sigmoid(c.gate(2, t, b, j));
                    dg(2, t, b, j) = go * c_t * og * (1 - og);
                    gc += go * og;
                } else {
                    gc += go;
                }
                dg(0, t, b, j) = gc * f * (1 - z * z);
                dg(1, t, b, j) = gc * (z - c_prev) * c.keep(t, b, j) * fr * (1 - fr);
                gc *= 1 - f;
            }
            ref_dc0[size_t(b * H + j)] = gc;
        }
    grad_gates.check_output("grad_gates", [&](int64_t t, int64_t b, int64_t jj) {
        return ref_dg[size_t((t * B + b) * c.n_gates * H + jj)];
    });
    if (o.c0)
        grad_c0.check_output("grad_c0", [&](int64_t, int64_t b, int64_t j) { return ref_dc0[size_t(b * H + j)]; });
}

struct Shape { int64_t T, B, H; };
const Shape kShapes[] = {{1, 1, 1},   {1, 1, 3}, {5, 1, 17}, {7, 3, 17}, {4, 2, 33},
                         {3, 2, 300}, {0, 2, 3}, {3, 0, 3},  {3, 2, 0}};
const Layout kInputs[] = {kTimeMajor, kBatchFirst, kGappy, kReversed, kReversedBatchFirstGappy, kHiddenMajor};

template <typename T, typename S>
void sweep() {
    int k = 0;
    for (const Shape& s : kShapes)
        for (const Layout& in : kInputs) {
            const Options& o = kOptionSets[size_t(k) % std::size(kOptionSets)];
            const Layout& out = kOutputLayouts[size_t(k / 2) % std::size(kOutputLayouts)];
            ++k;
            forward_case<T, S>(s.T, s.B, s.H, in, out, o, 1);
            backward_case<T, S>(s.T, s.B, s.H, in, out, o, 1);
        }
    for (const Options& o : kOptionSets) {  // several threads, every option set
        forward_case<T, S>(9, 6, 700, kBatchFirst, kTimeMajor, o, 4);
        backward_case<T, S>(9, 6, 700, kReversedBatchFirstGappy, kGappy, o, 4);
    }
}

// Broadcast (stride-0) inputs for the mask, c0 and grad_output only: gates keep real strides.
void broadcast_inputs() {
    for (const Options& o : kOptionSets) {
        forward_case<float, float>(4, 3, 9, kBroadcastBatch, kTimeMajor, o, 1);
        backward_case<float, float>(4, 3, 9, kBroadcastBatch, kTimeMajor, o, 1);
    }
}

// NaN and +-Inf among the gates, every dtype, sizes with a row tail on every vector width
// (4, 8, 16 lanes) and a single unit: NaN where the float64 loop has NaN, saturated gates
// (+-1, 0 or 1) where it has them, and every element still written.
void non_finite_gates() {
    with_non_finite = true;
    const Shape shapes[] = {{3, 2, 21}, {2, 1, 1}, {4, 2, 300}};
    for (const Options& o : kOptionSets)
        for (const Shape& s : shapes) {
            forward_case<float, float>(s.T, s.B, s.H, kTimeMajor, kTimeMajor, o, 1);
            backward_case<float, float>(s.T, s.B, s.H, kTimeMajor, kTimeMajor, o, 1);
            forward_case<bfloat16, float>(s.T, s.B, s.H, kBatchFirst, kTimeMajor, o, 1);
            backward_case<bfloat16, float>(s.T, s.B, s.H, kTimeMajor, kBatchFirst, o, 1);
            forward_case<float16, float16>(s.T, s.B, s.H, kTimeMajor, kTimeMajor, o, 1);
            backward_case<float16, float16>(s.T, s.B, s.H, kTimeMajor, kTimeMajor, o, 1);
            forward_case<double, double>(s.T, s.B, s.H, kGappy, kTimeMajor, o, 1);
        }
    with_non_finite = false;
}

void invalid_arguments() {
    qrnn_test::Context ctx("invalid arguments");
    using qrnn::cpu::qrnn_gates_backward;
    using qrnn::cpu::qrnn_gates_forward;
    float g[2 * 2 * 6] = {}, out[2 * 2 * 2] = {}, st[2 * 2 * 2] = {}, dg[2 * 2 * 6] = {};
    int64_t lengths[2] = {2, 1};
    const int64_t max = std::numeric_limits<int64_t>::max();
    // Both directions read the same (2, 2, 3 x 2) gates and (2, 2, 2) states.
    auto with_gates = [&](auto p) {
        p.gates = {g, 12, 6, 1};
        p.gate_stride = 2;
        p.states = {st, 4, 2, 1};
        return p;
    };
    auto fwd = [&] {
        auto p = with_gates(sized<qrnn::QrnnGatesForwardParams>(2, 2, 2));
        p.output = {out, 4, 2, 1};
        return p;
    };
    auto bwd = [&] {
        auto p = with_gates(sized<qrnn::QrnnGatesBackwardParams>(2, 2, 2));
        p.grad_output = {out, 4, 2, 1};
        p.grad_gates = {dg, 12, 6, 1};
        p.grad_gate_stride = 2;
        return p;
    };
    check_size_arguments(fwd, [](const qrnn::QrnnGatesForwardParams& p) { qrnn_gates_forward(p); }, -1);
    CHECK_NOTHROW(qrnn_gates_backward(bwd()));
    CHECK_REJECTS(fwd, qrnn_gates_forward, "gates", p.gates.data = nullptr);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "output", p.output.data = nullptr);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "gates", p.gate_stride = max);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "gates", p.gate_stride = std::numeric_limits<int64_t>::min());
    CHECK_REJECTS(fwd, qrnn_gates_forward, "states", p.states.stride_t = max);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "overflow", p.seq_len = p.batch = p.hidden = int64_t(1) << 22);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "dtype", p.dtype = DType(9));
    CHECK_REJECTS(fwd, qrnn_gates_forward, "forget_scale", p.forget_scale = std::nan(""));
    CHECK_REJECTS(fwd, qrnn_gates_forward, "forget_scale", p.forget_scale = -0.1);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "forget_scale", p.forget_scale = 1.5);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "forget_scale", p.forget_scale = std::numeric_limits<double>::infinity());
    CHECK_REJECTS(fwd, qrnn_gates_forward, "lengths[1]", p.lengths = lengths; lengths[1] = 3);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "lengths[1]", p.lengths = lengths; lengths[1] = -1);
    lengths[1] = 1;
    CHECK_REJECTS(fwd, qrnn_gates_forward, "lengths", p.batch = 3; p.lengths = lengths; p.lengths_stride = max / 2 + 1);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "c0_dtype", p.c0 = {out, 2, 1}; p.c0_dtype = DType::float64);
    CHECK_REJECTS(fwd, qrnn_gates_forward, "c_n_dtype", p.c_n = {out, 2, 1}; p.c_n_dtype = DType(5));
    CHECK_REJECTS(fwd, qrnn_gates_forward, "c0_dtype", p.dtype = DType::bfloat16; p.c0 = {out, 2, 1};
                  p.c0_dtype = DType::float16);
    CHECK_REJECTS(bwd, qrnn_gates_backward, "states", p.states.data = nullptr);
    CHECK_REJECTS(bwd, qrnn_gates_backward, "grad_gates", p.grad_gates.data = nullptr);
    CHECK_REJECTS(bwd, qrnn_gates_backward, "grad_gates", p.grad_gate_stride = max);
    CHECK_REJECTS(bwd, qrnn_gates_backward, "grad_c0", p.grad_c0 = {out, max, 1}; p.c0_dtype = DType::float32);
    CHECK_REJECTS(bwd, qrnn_gates_backward, "lengths[0]", p.lengths = lengths; lengths[0] = 5);
    lengths[0] = 2;
    // Zero elements: null pointers are fine.
    {
        auto p = fwd();
        p.batch = 0;
        p.gates = {};
        p.output = {};
        p.states = {};
        CHECK_NOTHROW(qrnn_gates_forward(p));
    }
}

// An empty sequence over a huge (batch, hidden) has nothing to compute: it must return at
// once (and batch * hidden, which does not fit in int64 here, must not be evaluated).
void empty_sequence_huge_batch() {
    qrnn_test::Context ctx("seq_len 0 with huge batch and hidden");
    ::alarm(60);  // a hang fails the test (SIGALRM) instead of stalling CI
    for (int64_t size : {int64_t(1) << 31, int64_t(1) << 32}) {
        qrnn::QrnnGatesForwardParams f;
        f.seq_len = 0;
        f.batch = f.hidden = size;
        CHECK_NOTHROW(qrnn::cpu::qrnn_gates_forward(f));
        qrnn::QrnnGatesBackwardParams b;
        b.seq_len = 0;
        b.batch = b.hidden = size;
        CHECK_NOTHROW(qrnn::cpu::qrnn_gates_backward(b));
    }
    ::alarm(0);
}

}  // namespace

int main(int argc, char** argv) {
    const bool threaded_only = argc > 1 && std::string(argv[1]) == "--threaded-only";
    if (start_kernel_test("test_qrnn_gates") == 77) return 77;
    if (threaded_only) {
        for (const Options& o : kOptionSets) {
            forward_case<float, float>(9, 6, 700, kBatchFirst, kTimeMajor, o, 4);
            backward_case<bfloat16, float>(9, 6, 700, kReversedBatchFirstGappy, kGappy, o, 4);
        }
        return qrnn_test::result("test_qrnn_gates");
    }
    sweep<float, float>();
    sweep<double, double>();
    sweep<bfloat16, bfloat16>();
    sweep<bfloat16, float>();
    sweep<float16, float16>();
    sweep<float16, float>();
    broadcast_inputs();
    non_finite_gates();
    invalid_arguments();
    empty_sequence_huge_batch();
    return qrnn_test::result("test_qrnn_gates");
}
