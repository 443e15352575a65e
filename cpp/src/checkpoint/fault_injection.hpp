// Test hook, not installed: a CheckpointWriter whose disk fails on purpose. Used by the C++
// tests and by qrnn._C._testing; nothing else builds a writer this way.
#pragma once

#include <cstdint>
#include <memory>

#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint::testing {

struct FaultInjection {
    uint64_t fail_after_bytes = UINT64_MAX;  // the write crossing this many bytes fails
    int error_number = 0;                    // with this errno (e.g. ENOSPC)...
    bool throw_exception = false;            // ...or by throwing inside the writer thread
    int times = -1;                          // saves that fail, then the disk heals (-1: all)
    int folder_sync_errno = 0;               // every folder fsync fails with this errno

    bool active() const { return fail_after_bytes != UINT64_MAX || throw_exception || folder_sync_errno; }
};

QRNN_API std::unique_ptr<CheckpointWriter> writer_with_faults(WriterOptions options, const FaultInjection& fault);

}  // namespace qrnn::checkpoint::testing
