// Staging images: anonymous memory laid out exactly as the file, and the parallel copy
// of a save's buffers into it.
#pragma once

#include <cstdint>
#include <vector>

namespace qrnn::checkpoint::detail {

// Page-aligned, huge pages advised, not touched (the staging copy faults the pages in).
// Throws std::bad_alloc; release with free_staging.
uint8_t* allocate_staging(uint64_t bytes);
void free_staging(uint8_t* data, uint64_t bytes);

// One buffer to copy to image offset `dst`.
struct Copy {
    const uint8_t* src;
    uint64_t dst;
    uint64_t size;
};

// Copies every buffer into `image` on up to `threads` threads (the caller's included).
void copy_into(const std::vector<Copy>& copies, uint8_t* image, int threads);

}  // namespace qrnn::checkpoint::detail
