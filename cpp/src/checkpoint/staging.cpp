// Staging images (see checkpoint/staging.hpp) and StagingBuffer. Parallel work goes through
// the library's one thread pool (common/parallel.hpp).
#include "checkpoint/staging.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <system_error>

#include <sys/mman.h>

#include "common/parallel.hpp"
#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint {

namespace {

constexpr uint64_t kStagingQuantum = 2ull << 20;
constexpr uint64_t kCopyPart = 4ull << 20;       // smallest share of a parallel staging copy
constexpr uint64_t kPopulatePart = 64ull << 20;  // smallest share of a parallel fault-in
constexpr uint64_t kPage = 4096;

// Splits [0, total) into `parts` near-equal shares and runs share(lo, hi) for each on up to
// `parts` threads.
template <typename Share>
void split_across_threads(uint64_t total, uint64_t parts, const Share& share) {
    if (parts <= 1) return share(0, total);
    try {
        qrnn::detail::parallel_for(int64_t(parts), int(parts), [&](int64_t begin, int64_t end) {
            for (int64_t part = begin; part < end; ++part)
                share(total * uint64_t(part) / parts, total * uint64_t(part + 1) / parts);
        });
    } catch (const std::system_error&) {  // no thread to spare (before any share ran): all here
        share(0, total);
    }
}

}  // namespace

namespace detail {

uint8_t* allocate_staging(uint64_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    ::madvise(p, bytes, MADV_HUGEPAGE);  // fewer TLB misses in the staging copy
#endif
    return static_cast<uint8_t*>(p);
}

void free_staging(uint8_t* data, uint64_t bytes) {
    if (data) ::munmap(data, bytes);
}

void copy_into(const std::vector<Copy>& copies, uint8_t* image, int threads) {
    // Each thread copies one share of the buffers' concatenation.
    std::vector<uint64_t> starts;
    starts.reserve(copies.size() + 1);
    uint64_t total = 0;
    for (const Copy& c : copies) {
        starts.push_back(total);
        total += c.size;
    }
    starts.push_back(total);
    const uint64_t parts = std::max<uint64_t>(1, std::min<uint64_t>(uint64_t(std::max(threads, 1)), total / kCopyPart));
    split_across_threads(total, parts, [&](uint64_t lo, uint64_t hi) {
        size_t i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), lo) - starts.begin()) - 1;
        for (; i < copies.size() && starts[i] < hi; ++i) {
            const Copy& c = copies[i];
            const uint64_t from = std::max(lo, starts[i]) - starts[i];
            const uint64_t to = std::min(hi, starts[i] + c.size) - starts[i];
            if (to > from) std::memcpy(image + c.dst + from, c.src + from, to - from);
        }
    });
}

}  // namespace detail

uint64_t staging_capacity(uint64_t bytes) {
    const uint64_t want = bytes + bytes / 8;
    return std::max<uint64_t>(kStagingQuantum, (want + kStagingQuantum - 1) / kStagingQuantum * kStagingQuantum);
}

StagingBuffer::StagingBuffer(uint64_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    data_ = detail::allocate_staging(bytes);
}

StagingBuffer::~StagingBuffer() { detail::free_staging(data_, size_); }

void StagingBuffer::populate(uint64_t offset, uint64_t length, int threads) const {
    if (!data_ || offset >= size_) return;
    const uint64_t begin = offset / kPage * kPage;
    const uint64_t end = std::min(size_, length > size_ - offset ? size_ : offset + length);
    const uint64_t parts =
        std::max<uint64_t>(1, std::min<uint64_t>(uint64_t(std::max(threads, 1)), (end - begin) / kPopulatePart));
    split_across_threads(end - begin, parts, [&](uint64_t lo, uint64_t hi) {
        // Page-aligned shares: no page is touched by two threads.
        const uint64_t from = begin + lo / kPage * kPage;
        const uint64_t to = hi == end - begin ? end : begin + hi / kPage * kPage;
        if (to <= from) return;
#ifdef MADV_POPULATE_WRITE
        if (::madvise(data_ + from, to - from, MADV_POPULATE_WRITE) == 0) return;  // Linux >= 5.14
#endif
        for (uint64_t off = from; off < to; off += kPage) __atomic_fetch_or(data_ + off, uint8_t(0), __ATOMIC_RELAXED);
    });
}

}  // namespace qrnn::checkpoint
