// A small persistent thread pool for the CPU kernels. We deliberately do not use
// OpenMP: torch already loads its own OpenMP runtime, and a second one in the same
// process oversubscribes cores. The caller says how many threads it may use.
#pragma once

#include <cstdint>
#include <functional>

namespace qrnn::detail {

// Runs fn(begin, end) over [0, n_items) split into contiguous ranges (a few per thread)
// that at most `num_threads` threads, the calling one included, claim as they come free.
// Blocks until all ranges are done.
// The first exception thrown by any range is rethrown here.
void parallel_for(int64_t n_items, int num_threads, const std::function<void(int64_t begin, int64_t end)>& fn);

// Threads to use for `work` element-steps: one below a size where waking threads
// costs more than it saves, at most `requested` (<= 0: hardware cores) above it.
int threads_for_work(int64_t work, int requested);

}  // namespace qrnn::detail
