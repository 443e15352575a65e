// Row tails for the vector layers without masked loads and stores (cpu_vec256.hpp,
// cpu_vec128_neon.hpp): a Mask is the number of lanes in use, and a partial vector goes
// through a zero-filled stack vector, so lanes past the row read as zero and nothing past
// it is written. Included by those headers after their load_full / store_full, inside
// namespace QRNN_ISA::vec.
#pragma once

#include <cstdint>
#include <cstring>

#ifndef QRNN_ISA
#error "define QRNN_ISA before including common/cpu_vec_tail.hpp"
#endif

namespace qrnn::cpu::QRNN_ISA::vec {

// The first min(n, kLanes) lanes.
QRNN_VEC_INLINE Mask lanes(int64_t n) { return n >= kLanes ? kLanes : n; }

// Lanes past m read as zero.
template <typename T>
QRNN_VEC_INLINE V load(const T* p, Mask m) {
    if (m == kLanes) return load_full(p);
    T tail[kLanes] = {};
    std::memcpy(tail, p, size_t(m) * sizeof(T));
    return load_full(tail);
}

template <typename T>
QRNN_VEC_INLINE void store(T* p, Mask m, V v) {
    if (m == kLanes) return store_full(p, v);
    T tail[kLanes];
    store_full(tail, v);
    std::memcpy(p, tail, size_t(m) * sizeof(T));
}

}  // namespace qrnn::cpu::QRNN_ISA::vec
