// What the writer threads share with a save's submitter: the state behind SaveStatus.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint {

using Clock = std::chrono::steady_clock;

struct SaveStatus::State {
    mutable std::mutex mutex;
    mutable std::condition_variable cv;
    bool staged = false;
    bool done = false;
    bool failed = false;
    SaveError error;
    std::vector<std::string> warnings;
    std::string path;  // set before the status is shared
    Clock::time_point start = Clock::now(), staged_at, done_at;

    // Reads fields under the lock.
    template <typename Read>
    auto locked(Read read) const {
        std::lock_guard<std::mutex> lock(mutex);
        return read();
    }
    void mark_staged();
    void finish(bool fail, SaveError err, std::vector<std::string> notes);
};

namespace detail {
struct StatusAccess {
    static SaveStatus::State& of(SaveStatus& status) { return *status.state_; }
};
}  // namespace detail

}  // namespace qrnn::checkpoint
