// The CPU thread pool (cpp/src/common/parallel.cpp, compiled into this test directly because
// it is internal to the library): every item runs exactly once, exceptions reach the
// caller, the pool survives them, and concurrent or nested callers neither deadlock nor
// race (ThreadSanitizer runs this too).
#include "common/parallel.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_check.hpp"

using qrnn::detail::parallel_for;
using qrnn::detail::threads_for_work;

namespace {

// parallel_for over n items must call fn on disjoint ranges covering [0, n) exactly once.
bool covers_once(int64_t n, int threads) {
    std::unique_ptr<std::atomic<int>[]> hits(new std::atomic<int>[size_t(n > 0 ? n : 1)]);
    for (int64_t i = 0; i < n; ++i) hits[size_t(i)] = 0;
    std::atomic<bool> bad_range{false};
    parallel_for(n, threads, [&](int64_t begin, int64_t end) {
        if (begin < 0 || end > n || begin >= end) bad_range = true;
        for (int64_t i = begin; i < end && i >= 0 && i < n; ++i) ++hits[size_t(i)];
    });
    if (bad_range) return false;
    for (int64_t i = 0; i < n; ++i)
        if (hits[size_t(i)] != 1) return false;
    return true;
}

void coverage() {
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 4097})
        for (int threads : {-1, 0, 1, 2, 3, 4, 8, 33}) {
            qrnn_test::Context ctx("n_items=" + std::to_string(n) + " threads=" + std::to_string(threads));
            CHECK(covers_once(n, threads));
        }
    // Negative item counts run nothing.
    bool called = false;
    parallel_for(-5, 4, [&](int64_t, int64_t) { called = true; });
    CHECK(!called);
}

void thread_counts() {
    CHECK(threads_for_work(0, 8) == 1);
    CHECK(threads_for_work(1, 8) == 1);
    CHECK(threads_for_work(int64_t(1) << 40, 8) == 8);
    CHECK(threads_for_work(int64_t(1) << 40, 0) >= 1);   // 0: hardware cores
    CHECK(threads_for_work(int64_t(1) << 40, -3) >= 1);
    CHECK(threads_for_work(int64_t(1) << 16, 64) == 2);  // bounded by useful work
}

void exceptions_propagate() {
    for (int throwing_range_start : {0, 50, 99}) {
        qrnn_test::Context ctx("throw in the range holding item " + std::to_string(throwing_range_start));
        bool caught = false;
        try {
            parallel_for(100, 4, [&](int64_t begin, int64_t end) {
                if (begin <= throwing_range_start && throwing_range_start < end)
                    throw std::runtime_error("item " + std::to_string(throwing_range_start));
            });
        } catch (const std::runtime_error& e) {
            caught = std::string(e.what()) == "item " + std::to_string(throwing_range_start);
        }
        CHECK(caught);
        CHECK(covers_once(100, 4));  // the pool still works afterwards
    }
    // Every range throwing: exactly one exception arrives, the others are dropped.
    int caught = 0;
    try {
        parallel_for(64, 4, [](int64_t, int64_t) { throw std::invalid_argument("all"); });
    } catch (const std::invalid_argument&) {
        ++caught;
    }
    CHECK(caught == 1);
    CHECK(covers_once(64, 4));
}

// Application threads share one pool: whoever finds it busy runs its items itself.
void concurrent_callers() {
    const int n_callers = 6, calls_each = 40;
    std::atomic<int> failures{0};
    std::vector<std::thread> callers;
    for (int c = 0; c < n_callers; ++c)
        callers.emplace_back([&, c] {
            for (int k = 0; k < calls_each; ++k) {
                if (!covers_once(100 + 37 * c + k, 2 + (c + k) % 4)) ++failures;
                if (k % 10 == c) {  // now and then an exception in the middle of the traffic
                    try {
                        parallel_for(50, 3, [](int64_t begin, int64_t end) {
                            if (begin <= 25 && 25 < end) throw std::runtime_error("boom");
                        });
                        ++failures;  // whichever range holds item 25 throws
                    } catch (const std::runtime_error&) {
                    }
                }
            }
        });
    for (auto& t : callers) t.join();
    CHECK(failures == 0);
}

// A range that itself calls parallel_for (from a pool worker or from the calling thread)
// must complete, not deadlock.
void nested_calls() {
    std::atomic<int64_t> total{0};
    parallel_for(8, 4, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) parallel_for(10, 4, [&](int64_t b, int64_t e) { total += e - b; });
    });
    CHECK(total == 80);
}

// After a call that grew the pool to 7 workers, a call asking for 2 threads runs on at most
// 2 distinct threads (the caller and one worker), however many ranges it is split into.
void thread_limit() {
    parallel_for(1 << 12, 8, [](int64_t, int64_t) { std::this_thread::sleep_for(std::chrono::microseconds(50)); });
    for (int threads : {1, 2, 3}) {
        qrnn_test::Context ctx("threads=" + std::to_string(threads));
        std::mutex mutex;
        std::set<std::thread::id> seen;
        parallel_for(64, threads, [&](int64_t, int64_t) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));  // let every worker try to join
            std::lock_guard<std::mutex> lock(mutex);
            seen.insert(std::this_thread::get_id());
        });
        CHECK(int(seen.size()) <= threads);
    }
}

}  // namespace

int main() {
    coverage();
    thread_counts();
    exceptions_propagate();
    concurrent_callers();
    nested_calls();
    thread_limit();
    return qrnn_test::result("test_parallel");
}
