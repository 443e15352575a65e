#include "common/parallel.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <pthread.h>
#endif

namespace qrnn::detail {
namespace {

// Set while this thread runs a range of a pool job. A nested parallel_for then runs
// serially: the caller thread already holds the pool's busy mutex, and try_lock on a
// std::mutex the thread owns is undefined behaviour.
thread_local bool t_in_pool_job = false;

constexpr int64_t kRangesPerThread = 4;

class ThreadPool {
public:
    ~ThreadPool() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        for (auto& t : workers_) t.join();
    }

    // Returns false when another caller is using the pool; the caller then runs alone.
    bool run(int64_t n_items, int num_threads, const std::function<void(int64_t, int64_t)>& fn) {
        std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
        if (!busy.owns_lock()) return false;
        grow(num_threads - 1);

        // Several ranges per thread, claimed as threads come free: when a core is taken
        // (say by torch's OpenMP workers still spinning after a GEMM), the threads that do
        // run take over its share instead of waiting for a fixed half at the end.
        const int64_t n_ranges = std::min<int64_t>(n_items, int64_t(num_threads) * kRangesPerThread);
        const int64_t chunk = (n_items + n_ranges - 1) / n_ranges;
        std::unique_lock<std::mutex> lock(mutex_);
        job_ = &fn;
        n_items_ = n_items;
        chunk_ = chunk;
        n_ranges_ = int((n_items + chunk - 1) / chunk);
        next_range_ = 0;
        pending_ = n_ranges_;
        error_ = nullptr;
        wanted_ = num_threads - 1;  // workers that may join (more may exist from earlier calls)
        joined_ = 0;
        const uint64_t job = ++generation_;
        lock.unlock();
        wake_.notify_all();
        lock.lock();
        claim_ranges(lock, job);  // the caller works too
        done_.wait(lock, [&] { return pending_ == 0; });
        job_ = nullptr;
        if (error_) std::rethrow_exception(error_);
        return true;
    }

private:
    void grow(int n_workers) {
        while (int(workers_.size()) < n_workers) workers_.emplace_back([this] { loop(); });
    }

    void run_range(int r) {
        const int64_t begin = r * chunk_;
        const int64_t end = std::min(n_items_, begin + chunk_);
        t_in_pool_job = true;
        struct Reset {
            ~Reset() { t_in_pool_job = false; }
        } reset;
        try {
            (*job_)(begin, end);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!error_) error_ = std::current_exception();
        }
    }

    // Runs unclaimed ranges of job `job` until none is left; `lock` holds mutex_. (A new
    // job cannot start meanwhile: it waits for every claimed range to finish.)
    void claim_ranges(std::unique_lock<std::mutex>& lock, uint64_t job) {
        while (generation_ == job && next_range_ < n_ranges_) {
            const int r = next_range_++;
            lock.unlock();
            run_range(r);
            lock.lock();
            if (--pending_ == 0) done_.notify_one();
        }
    }

    void loop() {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            wake_.wait(lock, [&] {
                return stopping_ || (generation_ != seen && next_range_ < n_ranges_ && joined_ < wanted_);
            });
            if (stopping_) return;
            seen = generation_;
            ++joined_;
            claim_ranges(lock, seen);
        }
    }

    std::mutex busy_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    std::vector<std::thread> workers_;
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    int64_t n_items_ = 0, chunk_ = 0;
    int n_ranges_ = 0, next_range_ = 0, pending_ = 0;
    int wanted_ = 0, joined_ = 0;  // workers allowed to join the current job, and joined
    uint64_t generation_ = 0;
    bool stopping_ = false;
    std::exception_ptr error_;
};

ThreadPool* g_pool = nullptr;
std::once_flag g_atfork_once;

ThreadPool& pool() {
    // A forked child (e.g. a DataLoader worker) inherits no worker threads: start a
    // fresh pool there and abandon the parent's copy, whose threads do not exist.
    std::call_once(g_atfork_once, [] {
#if !defined(_WIN32)
        pthread_atfork(nullptr, nullptr, [] { g_pool = nullptr; });
#endif
    });
    static std::mutex create_mutex;
    std::lock_guard<std::mutex> lock(create_mutex);
    if (!g_pool) g_pool = new ThreadPool();  // intentionally leaked: safe at exit and after fork
    return *g_pool;
}

}  // namespace

int threads_for_work(int64_t work, int requested) {
    if (requested <= 0) requested = int(std::max(1u, std::thread::hardware_concurrency()));
    constexpr int64_t kWorkPerThread = 1 << 15;  // below this, waking a thread costs more than it saves
    const int64_t useful = std::max<int64_t>(1, work / kWorkPerThread);
    return int(std::min<int64_t>(requested, useful));
}

void parallel_for(int64_t n_items, int num_threads, const std::function<void(int64_t, int64_t)>& fn) {
    if (n_items <= 0) return;
    num_threads = int(std::min<int64_t>(std::max(1, num_threads), n_items));
    if (num_threads == 1 || t_in_pool_job || !pool().run(n_items, num_threads, fn)) fn(0, n_items);
}

}  // namespace qrnn::detail
