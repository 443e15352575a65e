// How the CPU kernels split (batch, hidden) into work items, shared by ForgetMult and the
// fused gates. An item is one batch row's block of hidden units; it walks time serially
// with its state in a float row. A thread walks a chunk of consecutive items step by step
// together: in the time-major layout their rows of one step are adjacent in memory, so
// each step streams one contiguous stretch that the hardware prefetchers follow, instead
// of every item hopping a whole time stride (a new page) per step.
#pragma once

#include <algorithm>
#include <cstdint>

namespace qrnn::cpu {

// The largest block: one item's state, gradient and row buffers (a few KB) stay in L1.
constexpr int64_t kMaxRowBlock = 512;
// Hidden units a thread walks together (their float state, 64 KB, stays in L2).
constexpr int64_t kChunkUnits = 16384;

// Equal blocks of at most kMaxRowBlock units, a multiple of 16 (one AVX-512 register of
// floats), so that H = 1550 gives 4 items of 400 per batch row rather than three of 512
// and one of 14.
inline int64_t row_block(int64_t hidden) {
    const int64_t n_blocks = std::max<int64_t>(1, (hidden + kMaxRowBlock - 1) / kMaxRowBlock);
    const int64_t even = (hidden + n_blocks - 1) / n_blocks;
    return std::min(kMaxRowBlock, (even + 15) / 16 * 16);
}

inline int64_t row_items(int64_t batch, int64_t hidden) {
    const int64_t block = row_block(hidden);
    return batch * ((hidden + block - 1) / block);
}

// How a thread walks its items [begin, end): chunks of consecutive items, together at most
// kChunkUnits hidden units; `most` items in the largest (what its scratch must hold).
struct ItemChunks {
    int64_t block, per_chunk, most;
    ItemChunks(int64_t hidden, int64_t begin, int64_t end)
        : block(row_block(hidden)), per_chunk(std::max<int64_t>(1, kChunkUnits / block)),
          most(std::min(per_chunk, end - begin)) {}
    // Items in the chunk starting at item `first`.
    int64_t count(int64_t first, int64_t end) const { return std::min(per_chunk, end - first); }
};

}  // namespace qrnn::cpu
