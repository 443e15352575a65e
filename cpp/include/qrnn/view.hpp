// Strided views over caller-owned arrays, shared by every kernel's parameter struct.
// Strides are in elements (not bytes) and may be zero or negative; `data == nullptr`
// marks an optional array as absent.
//
// Sequences. Every family's parameters say which steps of the (time, batch, hidden)
// arrays are real with the same fields:
//   lengths, lengths_stride  dense rows: row b has lengths[b] real steps (0..seq_len);
//                            its later steps are padding, written as zeros
//   cu_seqlens               packed sequences (flash-linear-attention's layout): the
//                            arrays have one batch row of seq_len steps holding `batch`
//                            sequences end to end, sequence b being steps
//                            [cu_seqlens[b], cu_seqlens[b + 1]) (batch + 1 offsets from 0
//                            to seq_len, nondecreasing); the states (initial, final and
//                            their gradients) have one row per sequence
//   reverse                  each sequence runs from its last real step back to its first
// (without lengths or cu_seqlens a whole row reversed is also a negative time stride).
#pragma once

#include <cstdint>

namespace qrnn {

struct ConstView3 {
    const void* data = nullptr;
    int64_t stride_t = 0, stride_b = 0, stride_h = 0;
};
struct View3 {
    void* data = nullptr;
    int64_t stride_t = 0, stride_b = 0, stride_h = 0;
};
struct ConstView2 {
    const void* data = nullptr;
    int64_t stride_b = 0, stride_h = 0;
};
struct View2 {
    void* data = nullptr;
    int64_t stride_b = 0, stride_h = 0;
};

}  // namespace qrnn
