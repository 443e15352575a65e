// Links the installed qrnn core and checks ForgetMult (forward and backward) against a
// plain loop. Prints "forget_mult consumer ok" and exits 0 on success.
#include <qrnn/build_info.hpp>
#include <qrnn/forget_mult.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

int main() {
    const int64_t T = 37, B = 3, H = 1029;
    const size_t n = size_t(T * B * H);
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> unit(0.f, 1.f), sym(-1.f, 1.f);
    std::vector<float> f(n), x(n), h0(size_t(B * H)), h(n, NAN);
    for (auto& v : f) v = unit(rng);
    for (auto& v : x) v = sym(rng);
    for (auto& v : h0) v = sym(rng);

    qrnn::cpu::forget_mult(f.data(), x.data(), h0.data(), h.data(), T, B, H);

    double max_err = 0;
    std::vector<double> state(h0.begin(), h0.end());
    for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < B * H; ++i) {
            const size_t k = size_t(t * B * H + i);
            state[size_t(i)] = f[k] * double(x[k]) + (1.0 - f[k]) * state[size_t(i)];
            max_err = std::fmax(max_err, std::fabs(state[size_t(i)] - h[k]));
        }

    // Backward with grad_h = 1 everywhere: grad_h0 must match the loop's running gradient.
    std::vector<float> gh(n, 1.f), gf(n, NAN), gx(n, NAN), gh0(size_t(B * H), NAN);
    qrnn::cpu::forget_mult_backward(f.data(), x.data(), h0.data(), h.data(), gh.data(), gf.data(), gx.data(),
                                    gh0.data(), T, B, H);
    std::vector<double> g(size_t(B * H), 0.0);
    for (int64_t t = T - 1; t >= 0; --t)
        for (int64_t i = 0; i < B * H; ++i) {
            const size_t k = size_t(t * B * H + i);
            g[size_t(i)] += 1.0;
            max_err = std::fmax(max_err, std::fabs(f[k] * g[size_t(i)] - gx[k]));
            g[size_t(i)] -= f[k] * g[size_t(i)];
        }
    for (int64_t i = 0; i < B * H; ++i) max_err = std::fmax(max_err, std::fabs(g[size_t(i)] - gh0[size_t(i)]));

    bool threw = false;
    try {
        qrnn::cpu::forget_mult(f.data(), x.data(), nullptr, h.data(), -1, B, H);
    } catch (const std::invalid_argument&) {
        threw = true;
    }

    const qrnn::BuildInfo info = qrnn::build_info();
    std::printf("qrnn %s (%s), max error %.3g, invalid size %s\n", info.version, info.simd, max_err,
                threw ? "rejected" : "ACCEPTED");
    if (max_err > 1e-4 || !threw) return 1;
    std::printf("forget_mult consumer ok\n");
    return 0;
}
