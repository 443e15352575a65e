// SaveStatus (a save's outcome, shared by its submitter and the writer threads) and Gate.
#include "checkpoint/status.hpp"

#include <algorithm>

namespace qrnn::checkpoint {

// ---- SaveStatus --------------------------------------------------------------------

void SaveStatus::State::mark_staged() {
    {
        std::lock_guard<std::mutex> lock(mutex);
        staged = true;
        staged_at = Clock::now();
    }
    cv.notify_all();
}

void SaveStatus::State::finish(bool fail, SaveError err, std::vector<std::string> notes) {
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (!staged) {
            staged = true;
            staged_at = Clock::now();
        }
        done = true;
        done_at = Clock::now();
        failed = fail;
        error = std::move(err);
        warnings = std::move(notes);
    }
    cv.notify_all();
}

namespace {
double seconds_between(bool reached, Clock::time_point from, Clock::time_point to) {
    return reached ? std::chrono::duration<double>(to - from).count() : -1.0;
}
}  // namespace

SaveStatus::SaveStatus() : state_(std::make_unique<State>()) {}
SaveStatus::~SaveStatus() = default;

bool SaveStatus::staged() const {
    return state_->locked([&] { return state_->staged; });
}
void SaveStatus::wait_staged() const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->staged; });
}
bool SaveStatus::done() const {
    return state_->locked([&] { return state_->done; });
}
void SaveStatus::wait() const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->done; });
}
bool SaveStatus::wait_for(double seconds) const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    const double capped = std::min(std::max(seconds, 0.0), 1e7);  // no clock overflow
    return state_->cv.wait_for(lock, std::chrono::duration<double>(capped), [&] { return state_->done; });
}
bool SaveStatus::ok() const {
    return state_->locked([&] { return state_->done && !state_->failed; });
}
SaveError SaveStatus::error() const {
    return state_->locked([&] { return state_->error; });
}
std::vector<std::string> SaveStatus::warnings() const {
    return state_->locked([&] { return state_->warnings; });
}
const std::string& SaveStatus::path() const { return state_->path; }
double SaveStatus::staged_seconds() const {
    return state_->locked([&] { return seconds_between(state_->staged, state_->start, state_->staged_at); });
}
double SaveStatus::done_seconds() const {
    return state_->locked([&] { return seconds_between(state_->done, state_->start, state_->done_at); });
}

// ---- Gate --------------------------------------------------------------------------

struct Gate::State {
    mutable std::mutex mutex;
    mutable std::condition_variable cv;
    bool settled = false;
    std::string reason;

    // Settles once: later open()/fail() calls change nothing.
    void settle(std::string why) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            if (settled) return;
            settled = true;
            reason = std::move(why);
        }
        cv.notify_all();
    }
};

Gate::Gate() : state_(std::make_unique<State>()) {}
Gate::~Gate() = default;
void Gate::open() { state_->settle(""); }
void Gate::fail(const std::string& reason) { state_->settle(reason.empty() ? "gate failed" : reason); }
bool Gate::is_open() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->settled && state_->reason.empty();
}
std::string Gate::wait() const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->settled; });
    return state_->reason;
}

}  // namespace qrnn::checkpoint
