// Fused QRNN gate kernels (activations + ForgetMult + output gate), templated over the
// storage type and compiled once per instruction set inside namespace QRNN_ISA (qrnn_gates/
// cpu_<isa>.cpp); its end instantiates that set's table (common/isa_table.hpp).
//
// Work is split into items = (batch row, block of hidden units) walked in chunks, like
// ForgetMult (common/cpu_work_items.hpp). Each item walks its sequence's valid steps serially
// (forwards, or backwards for `reverse`), keeping its state in float.
//
// The math of a step runs over rows of the math type M (float, or double for double
// storage): float32/float64 rows are used in place, bfloat16 gates and gate outputs are
// converted inside the math loop, and other 16-bit rows (float16, masks, saved states,
// output gradients) are first widened into small float buffers (and results narrowed back). Each loop then stays
// simple enough to vectorise well (one float per lane, no spills). Absent optional
// inputs (zoneout mask, output gradient) read from a row of ones / zeros. Where the vector
// layer exists (AVX-512, AVX2, NEON: common/cpu_vec.hpp), contiguous float32 and 16-bit rows
// take forward_row / backward_row instead: the same math written once over that layer, one
// pass per step and row.
#pragma once

#include "common/cpu_kernel_common.hpp"
#include "common/cpu_math.hpp"
#include "common/isa_table.hpp"
#include "qrnn/qrnn_gates.hpp"
#include "common/cpu_vec.hpp"

namespace qrnn::cpu::QRNN_ISA {

// ---- Rows ----------------------------------------------------------------------------

template <typename T, typename M>
inline void widen(const T* __restrict__ src, int64_t stride, int64_t n, M* __restrict__ dst) {
    if constexpr (is_16bit<T>) {
        if (stride == 1) return row_to_float(src, dst, n);  // F16C for half where built with it
    }
    for (int64_t j = 0; j < n; ++j) dst[j] = load<T, M>(src, j, stride);
}

template <typename T, typename M>
inline void narrow(const M* __restrict__ src, int64_t n, T* __restrict__ dst, int64_t stride) {
    for (int64_t j = 0; j < n; ++j) store<T, M>(dst, j, stride, src[j]);
}

template <>
inline void narrow<float16, float>(const float* __restrict__ src, int64_t n, float16* __restrict__ dst,
                                   int64_t stride) {
#if defined(__F16C__)
    if (stride == 1) return row_from_float(src, dst, n);
#endif
    for (int64_t j = 0; j < n; ++j) dst[j * stride] = to_half(src[j]);
}

// A row of n values of type M: in place (with its stride) when the storage is M,
// else widened into `buffer` (stride 1).
template <typename M>
struct Row {
    const M* data;
    int64_t stride;
};

template <typename T, typename M>
inline Row<M> read_row(const T* src, int64_t stride, int64_t n, M* buffer) {
    if constexpr (std::is_same_v<T, M>) {
        return {src, stride};
    } else {
        widen(src, stride, n, buffer);
        return {buffer, 1};
    }
}

// ---- The math of one step -----------------------------------------------------------

// bfloat16 converts inside the math loops (its widening is a shift); float16 goes through
// float rows, where F16C converts eight at a time.
template <typename T>
constexpr bool converts_inline = std::is_same_v<T, bfloat16>;

// z = tanh(Z), s = sigmoid(F) and o = sigmoid(O) (1 without the output gate) of unit j.
template <typename TG, typename M, bool OutputGate>
inline void activations(const TG* gz, const TG* gf, const TG* go, int64_t j, int64_t sg, M& z, M& s, M& o) {
    if constexpr (OutputGate) {
        tanh_sigmoid_sigmoid(load<TG, M>(gz, j, sg), load<TG, M>(gf, j, sg), load<TG, M>(go, j, sg), z, s, o);
    } else {
        tanh_sigmoid(load<TG, M>(gz, j, sg), load<TG, M>(gf, j, sg), z, s);
        o = M(1);
    }
}

// c = f z + (1 - f) c; h = o c (or c). Strides are 1 except for strided float storage.
// The gates (TG) and the output (TH) are read and written in their storage type: float
// rows, or bfloat16 converted inside this loop (a shift in, a rounding select out, both
// vectorised); other 16-bit data arrives widened into float rows.
template <typename TG, typename TH, typename M, bool OutputGate>
inline void forward_math(const TG* __restrict__ gz, const TG* __restrict__ gf, const TG* __restrict__ go, int64_t sg,
                         const M* __restrict__ keep, int64_t sk, M scale, M* __restrict__ c, TH* __restrict__ h,
                         int64_t sh, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        M z, s, o;
        activations<TG, M, OutputGate>(gz, gf, go, j, sg, z, s, o);
        const M f = s * keep[j * sk] * scale;
        const M cj = f * z + (M(1) - f) * c[j];
        c[j] = cj;
        store<TH, M>(h, j, sh, OutputGate ? o * cj : cj);
    }
}

// g (the gradient reaching c[t]) gains the output's gradient, gives the gate
// gradients, and leaves as the gradient reaching c[t-1]. c[t] is recomputed from
// c[t-1] rather than read. Gates (TG) and gate gradients (TO) in their storage type,
// as in forward_math.
template <typename TG, typename TO, typename M, bool OutputGate>
inline void backward_math(const TG* __restrict__ gz, const TG* __restrict__ gf, const TG* __restrict__ go, int64_t sg,
                          const M* __restrict__ keep, int64_t sk, M scale, const M* __restrict__ cprev, int64_t sc,
                          const M* __restrict__ dh, int64_t sd, M* __restrict__ grad, TO* __restrict__ dz,
                          TO* __restrict__ df, TO* __restrict__ dout, int64_t sdg, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        M z, s, o;
        activations<TG, M, OutputGate>(gz, gf, go, j, sg, z, s, o);
        const M kf = keep[j * sk] * scale;
        const M f = s * kf;
        const M cp = cprev[j * sc];
        const M dhv = dh[j * sd];
        M g;
        if constexpr (OutputGate) {
            const M cj = f * z + (M(1) - f) * cp;
            g = grad[j] + dhv * o;
            store<TO, M>(dout, j, sdg, dhv * cj * o * (M(1) - o));
        } else {
            g = grad[j] + dhv;
        }
        store<TO, M>(dz, j, sdg, f * g * (M(1) - z * z));
        store<TO, M>(df, j, sdg, (z - cp) * g * kf * s * (M(1) - s));
        grad[j] = g - f * g;
    }
}

// ---- The same steps a vector at a time (contiguous rows, float32 math) --------------------
//
// Written once over the vector layer (common/cpu_vec.hpp) and instantiated per instruction
// set: AVX-512, AVX2, NEON. One pass per step and row: the gates convert in registers, and
// the forward writes the output and the saved state in the same loop (no widened rows, no
// second pass over c). Contiguous float32 and 16-bit rows take these where the layer exists
// (vectorised<T, Contig>); float64 and strided rows take the loops above.

#if defined(QRNN_HAVE_VEC)
// Z, F and O of lanes j.. (masked by m), activated. `ahead`: the offset of the gate rows
// the next step reads (0: none), asked for into L2 while this step computes.
template <typename T, bool OutputGate>
QRNN_VEC_INLINE void activations(const T* gz, const T* gf, const T* go, int64_t j, vec::Mask m, int64_t ahead,
                                 vec::V& z, vec::V& s, vec::V& o) {
    using namespace vec;
    if (ahead) {
        prefetch(gz + j + ahead);
        prefetch(gf + j + ahead);
        if constexpr (OutputGate) prefetch(go + j + ahead);
    }
    if constexpr (OutputGate) {
        tanh_sigmoid_sigmoid(load(gz + j, m), load(gf + j, m), load(go + j, m), z, s, o);
    } else {
        tanh_sigmoid(load(gz + j, m), load(gf + j, m), z, s);
        o = splat(1.f);
    }
}

template <typename T, bool OutputGate>
inline void forward_row(const T* __restrict__ gz, const T* __restrict__ gf, const T* __restrict__ go, int64_t ahead,
                        const float* __restrict__ keep, float scale, float* __restrict__ c, T* __restrict__ h,
                        T* __restrict__ state, int64_t n) {
    using namespace vec;
    const V vscale = splat(scale);
    for_each_vector(n, [&](int64_t j, Mask m) QRNN_VEC_BODY {
        V z, s, o;
        activations<T, OutputGate>(gz, gf, go, j, m, ahead, z, s, o);
        const V f = mul(mul(s, load(keep + j, m)), vscale);
        const V cp = load(c + j, m);
        const V cj = fmadd(f, sub(z, cp), cp);  // f z + (1 - f) c
        store(c + j, m, cj);
        store(h + j, m, OutputGate ? mul(o, cj) : cj);
        if (state) store(state + j, m, cj);
    });
}

// backward_math for contiguous rows: c[t-1] (TC) is the saved state of type T, or c0 (float)
// before the first step. cprev_next and dh_next: the next step's rows, asked for into L2
// (null: none).
template <typename T, typename TC, bool OutputGate>
inline void backward_row(const T* __restrict__ gz, const T* __restrict__ gf, const T* __restrict__ go, int64_t ahead,
                         const float* __restrict__ keep, float scale, const TC* __restrict__ cprev,
                         const T* __restrict__ dh, const T* cprev_next, const T* dh_next, float* __restrict__ grad,
                         T* __restrict__ dz, T* __restrict__ df, T* __restrict__ dout, int64_t n) {
    using namespace vec;
    const V vscale = splat(scale), one = splat(1.f);
    for_each_vector(n, [&](int64_t j, Mask m) QRNN_VEC_BODY {
        V z, s, o;
        activations<T, OutputGate>(gz, gf, go, j, m, ahead, z, s, o);
        if (cprev_next) prefetch(cprev_next + j);
        if (dh_next) prefetch(dh_next + j);
        const V kf = mul(load(keep + j, m), vscale);
        const V f = mul(s, kf);
        const V cp = load(cprev + j, m);
        const V dhv = load(dh + j, m);
        const V zc = sub(z, cp);
        V g;
        if constexpr (OutputGate) {
            const V cj = fmadd(f, zc, cp);
            g = fmadd(dhv, o, load(grad + j, m));
            store(dout + j, m, mul(mul(dhv, cj), mul(o, sub(one, o))));
        } else {
            g = add(load(grad + j, m), dhv);
        }
        const V fg = mul(f, g);
        store(dz + j, m, mul(fg, fnmadd(z, z, one)));
        store(df + j, m, mul(mul(zc, g), mul(kf, mul(s, sub(one, s)))));
        store(grad + j, m, sub(g, fg));
    });
}
#else
// Declared for the discarded `if constexpr` branches; never instantiated without the layer.
template <typename T, bool OutputGate, typename... Args>
void forward_row(Args...);
template <typename T, typename TC, bool OutputGate, typename... Args>
void backward_row(Args...);
#endif

// ---- Work items ---------------------------------------------------------------------

// Fills items[0, count) for items first, first + 1, ... (common/cpu_kernel_common.hpp) and
// loads each one's c0 (zeros when absent) into its row of `c0_rows`; returns their longest
// walk.
template <typename Params, typename M>
inline int64_t start_items(const Params& p, int64_t block, int64_t first, int64_t count, RowItem* items, M* c0_rows) {
    describe_items(p, block, first, count, items);
    for (int64_t i = 0; i < count; ++i)
        load_state(p.c0, p.c0_dtype, items[i].b, items[i].j0, items[i].n, &c0_rows[i * block]);
    return most_steps(items, count);
}

// The chunk's items and states, and rows for widened 16-bit data, in per-thread scratch.
template <typename M>
struct Scratch {
    RowItem* items;
    M *state, *state2;  // forward: c; backward: running gradient and c0
    M* rows;            // 11 rows of one block: gates, mask, c[t-1], dh, results
    M *ones, *zeros;
    int64_t block;
    Scratch(int64_t block_, int64_t n_items)
        : items(scratch<RowItem, 0>(size_t(n_items))), state(scratch<M, 1>(size_t(n_items * block_))),
          state2(scratch<M, 2>(size_t(n_items * block_))), rows(scratch<M, 3>(size_t(11 * block_))),
          ones(scratch<M, 4>(size_t(block_))), zeros(scratch<M, 5>(size_t(block_))), block(block_) {
        std::fill(ones, ones + block, M(1));
        std::fill(zeros, zeros + block, M(0));
    }
    M* row(int k) { return rows + k * block; }
};

// What the forward and the backward read alike at a step: the gate rows and the zoneout
// mask (a row of ones when absent), in place or widened into the scratch rows 0 to 3.
template <typename T, typename M, bool Contig, bool OutputGate>
struct StepInputs {
    int64_t gs, sg, sk;
    M scale;
    template <typename Params>
    explicit StepInputs(const Params& p)
        : gs(p.gate_stride), sg(Contig ? 1 : p.gates.stride_h), sk(Contig ? 1 : p.forget_mask.stride_h),
          scale(M(p.forget_scale)) {}

    template <typename Params>
    Row<M> keep(const Params& p, int64_t t, const RowItem& it, Scratch<M>& s) const {
        return p.forget_mask.data ? read_row<T, M>(row_at<T>(p.forget_mask, t, it), sk, it.n, s.row(3))
                                  : Row<M>{s.ones, 1};
    }

    // Z, F and O of gate row g, widened (O is Z's row without the output gate).
    struct Widened { Row<M> z, f, o; };
    Widened widened(const T* g, int64_t n, Scratch<M>& s) const {
        const Row<M> z = read_row<T, M>(g, sg, n, s.row(0));
        const Row<M> f = read_row<T, M>(g + gs, sg, n, s.row(1));
        return {z, f, OutputGate ? read_row<T, M>(g + 2 * gs, sg, n, s.row(2)) : z};
    }
};

// ---- Forward ------------------------------------------------------------------------

template <typename T, bool Contig, bool OutputGate>
void gates_forward_items(const QrnnGatesForwardParams& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    constexpr bool in_place = std::is_same_v<T, M>;
    const ItemChunks chunks(p.hidden, begin, end);
    const int64_t block = chunks.block;
    const StepInputs<T, M, Contig, OutputGate> in(p);
    const int64_t so = Contig ? 1 : p.output.stride_h;
    const int64_t ss = Contig ? 1 : p.states.stride_h;
    Scratch<M> s(block, chunks.most);
    for (int64_t first = begin; first < end; first += chunks.per_chunk) {
        const int64_t count = chunks.count(first, end);
        const int64_t most = start_items(p, block, first, count, s.items, s.state);  // c: c0
        for (int64_t k = 0; k < most; ++k) {
            for (int64_t i = 0; i < count; ++i) {
                const RowItem& it = s.items[i];
                if (k >= it.steps) continue;
                const int64_t t = step_time(k, it, p.reverse), n = it.n;
                const T* g = row_at<T>(p.gates, t, it);
                const Row<M> keep = in.keep(p, t, it, s);
                M* c = &s.state[i * block];
                T* out = row_at<T>(p.output, t, it);
                T* state = p.states.data ? row_at<T>(p.states, t, it) : nullptr;
                if constexpr (vectorised<T, Contig>) {
                    const int64_t ahead =
                        k + 1 < it.steps ? (step_time(k + 1, it, p.reverse) - t) * p.gates.stride_t : 0;
                    forward_row<T, OutputGate>(g, g + in.gs, g + 2 * in.gs, ahead, keep.data, in.scale, c, out, state,
                                               n);
                    continue;
                } else if constexpr (in_place || converts_inline<T>) {
                    forward_math<T, T, M, OutputGate>(g, g + in.gs, g + 2 * in.gs, in.sg, keep.data, keep.stride,
                                                      in.scale, c, out, so, n);
                } else {
                    const auto w = in.widened(g, n, s);
                    forward_math<M, M, M, OutputGate>(w.z.data, w.f.data, w.o.data, 1, keep.data, 1, in.scale, c,
                                                      s.row(4), 1, n);
                    narrow(s.row(4), n, out, so);
                }
                if (state) narrow(c, n, state, ss);
            }
        }
        for (int64_t i = 0; i < count; ++i) {
            const RowItem& it = s.items[i];
            if (p.c_n.data) store_state(p.c_n, p.c_n_dtype, it.b, it.j0, it.n, &s.state[i * block]);
            // Padding steps of a dense row (at or after its end, either direction): zeros.
            if (pads(p, it))
                for (int64_t t = it.steps; t < p.seq_len; ++t) {
                    zero_row(row_at<T>(p.output, t, it), it.n, so);
                    if (p.states.data) zero_row(row_at<T>(p.states, t, it), it.n, ss);
                }
        }
    }
}

// ---- Backward -----------------------------------------------------------------------

template <typename T, bool Contig, bool OutputGate>
void gates_backward_items(const QrnnGatesBackwardParams& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    constexpr bool in_place = std::is_same_v<T, M>;
    const ItemChunks chunks(p.hidden, begin, end);
    const int64_t block = chunks.block;
    const StepInputs<T, M, Contig, OutputGate> in(p);
    const int64_t dgs = p.grad_gate_stride;
    const int n_gates = OutputGate ? 3 : 2;
    const bool has_dh = p.grad_output.data != nullptr;
    const int64_t sc = Contig ? 1 : p.states.stride_h;
    const int64_t sd = Contig ? 1 : p.grad_output.stride_h;
    const int64_t sdg = Contig ? 1 : p.grad_gates.stride_h;
    Scratch<M> s(block, chunks.most);
    for (int64_t first = begin; first < end; first += chunks.per_chunk) {
        const int64_t count = chunks.count(first, end);
        const int64_t most = start_items(p, block, first, count, s.items, s.state2);
        for (int64_t i = 0; i < count; ++i) {
            const RowItem& it = s.items[i];
            load_state(p.grad_c_n, p.c_n_dtype, it.b, it.j0, it.n, &s.state[i * block]);  // the running gradient
            if (pads(p, it))
                for (int64_t t = it.steps; t < p.seq_len; ++t) {
                    T* row = row_at<T>(p.grad_gates, t, it);
                    for (int k = 0; k < n_gates; ++k) zero_row(row + k * dgs, it.n, sdg);
                }
        }
        // The forward's steps in reverse order: each item joins once k reaches its last step.
        for (int64_t k = most - 1; k >= 0; --k) {
            for (int64_t i = 0; i < count; ++i) {
                const RowItem& it = s.items[i];
                if (k >= it.steps) continue;
                const int64_t t = step_time(k, it, p.reverse), n = it.n;
                const T* g = row_at<T>(p.gates, t, it);
                const Row<M> keep = in.keep(p, t, it, s);
                T* dg = row_at<T>(p.grad_gates, t, it);
                M* grad = &s.state[i * block];
                if constexpr (vectorised<T, Contig>) {
                    if (has_dh) {
                        // What the next step (k - 1) reads is asked for ahead: its gates,
                        // output gradient and c[t-1] (none before its first step).
                        const auto time_of = [&](int64_t step) { return step_time(step, it, p.reverse); };
                        const int64_t ahead = k > 0 ? (time_of(k - 1) - t) * p.gates.stride_t : 0;
                        const T* dh_row = row_at<T>(p.grad_output, t, it);
                        const T* dh_next = k > 0 ? row_at<T>(p.grad_output, time_of(k - 1), it) : nullptr;
                        const T* c_next = k > 1 ? row_at<T>(p.states, time_of(k - 2), it) : nullptr;
                        const T *g1 = g + in.gs, *g2 = g + 2 * in.gs;
                        T *d1 = dg + dgs, *d2 = dg + 2 * dgs;
                        if (k > 0)
                            backward_row<T, T, OutputGate>(g, g1, g2, ahead, keep.data, in.scale,
                                                           row_at<T>(p.states, time_of(k - 1), it), dh_row, c_next,
                                                           dh_next, grad, dg, d1, d2, n);
                        else
                            backward_row<T, float, OutputGate>(g, g1, g2, ahead, keep.data, in.scale,
                                                               &s.state2[i * block], dh_row, c_next, dh_next, grad, dg,
                                                               d1, d2, n);
                        continue;
                    }
                }
                // c[t-1]: the saved state of the previous step, or c0 before the first.
                const Row<M> cprev =
                    k > 0 ? read_row<T, M>(row_at<T>(p.states, step_time(k - 1, it, p.reverse), it), sc, n, s.row(4))
                          : Row<M>{&s.state2[i * block], 1};
                const Row<M> dh =
                    has_dh ? read_row<T, M>(row_at<T>(p.grad_output, t, it), sd, n, s.row(5)) : Row<M>{s.zeros, 1};
                if constexpr (in_place || converts_inline<T>) {
                    backward_math<T, T, M, OutputGate>(g, g + in.gs, g + 2 * in.gs, in.sg, keep.data, keep.stride,
                                                       in.scale, cprev.data, cprev.stride, dh.data, dh.stride, grad, dg,
                                                       dg + dgs, dg + 2 * dgs, sdg, n);
                } else {
                    const auto w = in.widened(g, n, s);
                    backward_math<M, M, M, OutputGate>(w.z.data, w.f.data, w.o.data, 1, keep.data, 1, in.scale,
                                                       cprev.data, 1, dh.data, 1, grad, s.row(6), s.row(7), s.row(8), 1,
                                                       n);
                    // One call per gate, not a loop: GCC would try the gate loop as the
                    // vectorised one and leave the conversions scalar.
                    narrow(s.row(6), n, dg, sdg);
                    narrow(s.row(7), n, dg + dgs, sdg);
                    if constexpr (OutputGate) narrow(s.row(8), n, dg + 2 * dgs, sdg);
                }
            }
        }
        if (p.grad_c0.data)
            for (int64_t i = 0; i < count; ++i) {
                const RowItem& it = s.items[i];
                store_state(p.grad_c0, p.c0_dtype, it.b, it.j0, it.n, &s.state[i * block]);
            }
    }
}

// ---- The table's entry points: contiguous or strided, with or without the output gate ----

template <>
struct Kernels<QrnnGatesForwardParams, QrnnGatesBackwardParams> {
    static constexpr const char* rows = kRowsName;

    template <typename T>
    static void forward(const QrnnGatesForwardParams& p, int64_t begin, int64_t end) {
        const bool contig = p.gates.stride_h == 1 && p.output.stride_h == 1 &&
                            (!p.forget_mask.data || p.forget_mask.stride_h == 1) &&
                            (!p.states.data || p.states.stride_h == 1);
        if (p.output_gate)
            contig ? gates_forward_items<T, true, true>(p, begin, end)
                   : gates_forward_items<T, false, true>(p, begin, end);
        else
            contig ? gates_forward_items<T, true, false>(p, begin, end)
                   : gates_forward_items<T, false, false>(p, begin, end);
    }

    template <typename T>
    static void backward(const QrnnGatesBackwardParams& p, int64_t begin, int64_t end) {
        const bool contig = p.gates.stride_h == 1 && p.states.stride_h == 1 && p.grad_gates.stride_h == 1 &&
                            (!p.forget_mask.data || p.forget_mask.stride_h == 1) &&
                            (!p.grad_output.data || p.grad_output.stride_h == 1);
        if (p.output_gate)
            contig ? gates_backward_items<T, true, true>(p, begin, end)
                   : gates_backward_items<T, false, true>(p, begin, end);
        else
            contig ? gates_backward_items<T, true, false>(p, begin, end)
                   : gates_backward_items<T, false, false>(p, begin, end);
    }
};

template const KernelTable<QrnnGatesForwardParams, QrnnGatesBackwardParams>&
kernel_table<QrnnGatesForwardParams, QrnnGatesBackwardParams>();

}  // namespace qrnn::cpu::QRNN_ISA
