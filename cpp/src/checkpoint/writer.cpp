// CheckpointWriter: bounded queue -> staging thread (+ copy helpers) -> writer thread.
//
// Durability protocol for each save: create "<folder>/.<name>.tmp-<pid>-<random>" and lock
// it, write it, stamp its commit order (modification time), fsync it, rename it over
// "<folder>/<name>", fsync the folder, and only then delete older files (retention). Any
// failure unlinks the temporary file and reaches the submitter through its SaveStatus; the
// previous checkpoint is never touched.
#include "qrnn/checkpoint.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <type_traits>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/syscall.h>
#endif

#include "checkpoint/archive.hpp"

namespace qrnn::checkpoint {

using Clock = std::chrono::steady_clock;

// ---- SaveStatus --------------------------------------------------------------------

struct SaveStatus::State {
    mutable std::mutex mutex;
    mutable std::condition_variable cv;
    bool staged = false;
    bool done = false;
    bool failed = false;
    SaveError error;
    std::vector<std::string> warnings;
    std::string path;
    Clock::time_point start = Clock::now(), staged_at, done_at;

    void mark_staged() {
        {
            std::lock_guard<std::mutex> lock(mutex);
            staged = true;
            staged_at = Clock::now();
        }
        cv.notify_all();
    }
    void finish(bool fail, SaveError err, std::vector<std::string> notes) {
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
};

namespace detail {
struct StatusAccess {
    static SaveStatus::State& of(SaveStatus& status) { return *status.state_; }
};
}  // namespace detail

SaveStatus::SaveStatus() : state_(std::make_unique<State>()) {}
SaveStatus::~SaveStatus() = default;

bool SaveStatus::staged() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->staged;
}
void SaveStatus::wait_staged() const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->staged; });
}
bool SaveStatus::done() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->done;
}
void SaveStatus::wait() const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->done; });
}
bool SaveStatus::wait_for(double seconds) const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    const double capped = std::min(std::max(seconds, 0.0), 1e7);  // no clock overflow
    return state_->cv.wait_for(lock, std::chrono::duration<double>(capped),
                               [&] { return state_->done; });
}
bool SaveStatus::ok() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->done && !state_->failed;
}
SaveError SaveStatus::error() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->error;
}
std::vector<std::string> SaveStatus::warnings() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->warnings;
}
const std::string& SaveStatus::path() const { return state_->path; }  // set before sharing
double SaveStatus::staged_seconds() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->staged ? std::chrono::duration<double>(state_->staged_at - state_->start).count() : -1.0;
}
double SaveStatus::done_seconds() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->done ? std::chrono::duration<double>(state_->done_at - state_->start).count() : -1.0;
}

// ---- Gate --------------------------------------------------------------------------

struct Gate::State {
    mutable std::mutex mutex;
    mutable std::condition_variable cv;
    bool settled = false;
    std::string reason;
};

Gate::Gate() : state_(std::make_unique<State>()) {}
Gate::~Gate() = default;
void Gate::open() {
    {
        std::lock_guard<std::mutex> lock(state_->mutex);
        if (state_->settled) return;
        state_->settled = true;
    }
    state_->cv.notify_all();
}
void Gate::fail(const std::string& reason) {
    {
        std::lock_guard<std::mutex> lock(state_->mutex);
        if (state_->settled) return;
        state_->settled = true;
        state_->reason = reason.empty() ? "gate failed" : reason;
    }
    state_->cv.notify_all();
}
bool Gate::is_open() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->settled && state_->reason.empty();
}
std::string Gate::wait() const {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->settled; });
    return state_->reason;
}

// ---- Internals ---------------------------------------------------------------------

namespace {

constexpr uint64_t kPiece = 8ull << 20;     // CRC and write granularity
constexpr uint64_t kMinWrite = 4ull << 20;  // coalesce small records into one write
constexpr uint64_t kCopyPart = 4ull << 20;  // smallest share of a parallel staging copy

std::string errno_text(int code) {
    char buf[256] = {0};
    // GNU strerror_r returns a pointer, XSI an int: handle both.
    auto pick = [&](auto r) -> std::string {
        if constexpr (std::is_same_v<decltype(r), int>) return r == 0 ? std::string(buf) : "unknown error";
        else return std::string(r ? r : "unknown error");
    };
    return pick(strerror_r(code, buf, sizeof buf));
}

struct IoFailure {
    SaveError error;
};

[[noreturn]] void fail_io(int code, const std::string& operation, const std::string& path,
                          const std::string& final_path) {
    SaveError e;
    e.error_number = code;
    e.operation = operation;
    e.path = path;
    e.message = "checkpoint '" + final_path + "' was not saved: " + operation + " '" + path +
                "' failed: " + errno_text(code) + " (errno " + std::to_string(code) + ")";
    throw IoFailure{std::move(e)};
}

std::string folder_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}
std::string base_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

constexpr uint64_t kStagingQuantum = 2ull << 20;
constexpr int64_t kCommitStepNs = 1000;  // commit order survives microsecond timestamps

uint64_t random64() {
    try {
        std::random_device device;  // getrandom() / the CPU's generator
        return (uint64_t(device()) << 32) ^ uint64_t(device());
    } catch (...) {
        static std::atomic<uint64_t> counter{0};
        const auto now = uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count());
        return now * 0x9E3779B97F4A7C15ull ^ (counter.fetch_add(1) << 17) ^ uint64_t(::getpid());
    }
}

// A fresh temporary name: pid for people reading the folder, randomness for uniqueness
// (the same pid recurs after a container restart, and across hosts).
std::string temporary_name(const std::string& base) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(random64()));
    return "." + base + ".tmp-" + std::to_string(::getpid()) + "-" + hex;
}

// Exclusive advisory lock on the whole file; 0 or the errno. Open-file-description locks
// where available (they conflict between two descriptors of one process too, and NFSv4
// carries them to the server), flock() elsewhere.
int lock_file(int fd, bool wait) {
    int r;
#ifdef F_OFD_SETLK
    struct flock range;
    std::memset(&range, 0, sizeof range);
    range.l_type = F_WRLCK;
    range.l_whence = SEEK_SET;
    do {
        r = ::fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &range);
    } while (r != 0 && errno == EINTR);
#else
    do {
        r = ::flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB));
    } while (r != 0 && errno == EINTR);
#endif
    return r == 0 ? 0 : errno;
}

int64_t realtime_ns() {
    struct timespec now;
    ::clock_gettime(CLOCK_REALTIME, &now);
    return int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
}

struct Copy {
    const uint8_t* src;
    uint64_t dst;
    uint64_t size;
};

struct Job {
    SaveRequest request;
    detail::Plan plan;
    uint8_t* image = nullptr;
    bool aligned = false;
    int pool_slot = -1;
    std::vector<Copy> copies;
    int copy_threads = 1;
    std::shared_ptr<SaveStatus> status;
};

// fsync; on macOS fsync leaves data in the drive's cache, F_FULLFSYNC does not.
bool sync_to_disk(int fd) {
#ifdef F_FULLFSYNC
    if (::fcntl(fd, F_FULLFSYNC) == 0) return true;
#endif
    return ::fsync(fd) == 0;
}

// The output file: aligned O_DIRECT writes from the staging image where the file system
// allows them (no page-cache copy, cheap fsync), buffered writes otherwise.
class OutputFile {
public:
    OutputFile(const std::string& folder, const std::string& base, std::string final_path, bool want_direct,
               const uint8_t* image, const FaultInjection& fault, int* faults_fired)
        : final_(std::move(final_path)), image_(image), fault_(fault), fired_(faults_fired) {
        for (int attempt = 0;; ++attempt) {
            path_ = folder + "/" + temporary_name(base);
            do {
                fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
            } while (fd_ < 0 && errno == EINTR);
            if (fd_ < 0 && errno == EEXIST && attempt < 8) continue;
            if (fd_ < 0) fail_io(errno, "create", path_, final_);
            // Held until after the rename: while it is held no cleaner deletes the file. A
            // cleaner may have taken the lock between our create and here (it then unlinks
            // the file): start again under a new name. Without lock support, write unlocked
            // (cleaners then never delete: they cannot lock either).
            lock_file(fd_, true);
            struct stat st;
            if (::fstat(fd_, &st) == 0 && st.st_nlink == 0 && attempt < 8) {
                ::close(fd_);
                fd_ = -1;
                continue;
            }
            break;
        }
#ifdef O_DIRECT
        // Set after open: some kernels create the file and then refuse O_DIRECT at open.
        if (want_direct) {
            const int flags = ::fcntl(fd_, F_GETFL);
            direct_ = flags >= 0 && ::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0;
        }
#else
        (void)want_direct;
#endif
    }
    ~OutputFile() {
        if (fd_ >= 0) ::close(fd_);
    }
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    // Reserve the space up front: a full disk or a file-size limit fails here, before any
    // byte is written.
    void preallocate(uint64_t size) {
#ifdef __linux__
        if (size == 0) return;
        int r;
        do {
            r = ::fallocate(fd_, 0, 0, static_cast<off_t>(size));
        } while (r != 0 && errno == EINTR);
        if (r != 0 && errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL)
            fail_io(errno, "allocate space for", path_, final_);
#else
        (void)size;
#endif
    }

    // Writes the image up to `ready` (or the aligned part of it) once enough has gathered.
    void write_until(uint64_t ready, bool final) {
        if (!final && ready - written_ < kMinWrite) return;
        uint64_t end = ready;
        if (direct_) end = final ? align_up(ready) : ready / detail::kIoAlignment * detail::kIoAlignment;
        if (end > written_) write_range(end);
    }

    const std::string& path() const { return path_; }

    // Truncates the aligned tail, stamps the commit order (0: leave the time as written)
    // and makes data and time durable. The descriptor (and its lock) stays open.
    void finish(uint64_t size, int64_t commit_ns, bool sync) {
        if (written_ > size) {  // the last aligned write went past the end
            if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) fail_io(errno, "truncate", path_, final_);
        }
        if (commit_ns > 0) {
            struct timespec times[2];
            times[0].tv_sec = 0;
            times[0].tv_nsec = UTIME_OMIT;
            times[1].tv_sec = static_cast<time_t>(commit_ns / 1000000000);
            times[1].tv_nsec = static_cast<long>(commit_ns % 1000000000);
            ::futimens(fd_, times);  // best effort: a file system that refuses keeps its write time
        }
        if (sync && !sync_to_disk(fd_)) fail_io(errno, "fsync", path_, final_);
    }

    // After the rename (the data are durable already): releases the lock.
    void close() {
        const int fd = fd_;
        fd_ = -1;
        if (fd >= 0) ::close(fd);
    }

private:
    static uint64_t align_up(uint64_t v) {
        return (v + detail::kIoAlignment - 1) / detail::kIoAlignment * detail::kIoAlignment;
    }

    void drop_direct() {
#ifdef O_DIRECT
        const int flags = ::fcntl(fd_, F_GETFL);
        if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
#endif
        direct_ = false;
    }

    void write_range(uint64_t end) {
        while (written_ < end) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(end - written_, kPiece));
            if (fault_.fail_after_bytes != UINT64_MAX && written_ + n > fault_.fail_after_bytes) {
                ++*fired_;
                if (fault_.throw_exception) throw std::runtime_error("injected failure in the checkpoint writer thread");
                fail_io(fault_.error_number ? fault_.error_number : EIO, "write", path_, final_);
            }
            const ssize_t r = ::pwrite(fd_, image_ + written_, n, static_cast<off_t>(written_));
            if (r < 0) {
                if (errno == EINTR) continue;
                if (errno == EINVAL && direct_) {  // the file system refused this direct write
                    drop_direct();
                    continue;
                }
                fail_io(errno, "write", path_, final_);
            }
            if (r == 0) fail_io(EIO, "write", path_, final_);
            written_ += static_cast<uint64_t>(r);
            if (direct_ && written_ % detail::kIoAlignment) drop_direct();  // short write: unaligned now
        }
    }

    std::string path_, final_;
    const uint8_t* image_;
    const FaultInjection fault_;
    int* fired_;
    int fd_ = -1;
    bool direct_ = false;
    uint64_t written_ = 0;
};

// Unlinks the temporary file unless the commit succeeded.
struct TempFileGuard {
    std::string path;
    bool armed = true;
    ~TempFileGuard() {
        if (armed) ::unlink(path.c_str());
    }
};

void fsync_folder(const std::string& folder, const std::string& final_path) {
    int fd;
    do {
        fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) fail_io(errno, "open folder", folder, final_path);
    const int r = ::fsync(fd);
    const int code = errno;
    ::close(fd);
    // Some file systems cannot fsync a folder (EINVAL): nothing more can be done there.
    if (r != 0 && code != EINVAL && code != EROFS) fail_io(code, "fsync folder", folder, final_path);
}

void apply_retention(const std::string& folder, const std::string& committed, const Retention& keep,
                     std::vector<std::string>& warnings) {
    if (keep.keep_last <= 0) return;
    std::vector<CommittedFile> found;
    try {
        found = list_checkpoints(folder, keep.prefix, keep.suffix, CheckpointOrder::Commit);
    } catch (const std::system_error& e) {
        warnings.push_back("could not list '" + folder + "' to delete old checkpoints: " + e.code().message());
        return;
    }
    // Oldest commits first: everything before the last keep_last goes.
    const size_t excess = found.size() > size_t(keep.keep_last) ? found.size() - size_t(keep.keep_last) : 0;
    for (size_t i = 0; i < excess; ++i) {
        if (found[i].name == committed) continue;
        const std::string path = folder + "/" + found[i].name;
        if (::unlink(path.c_str()) != 0 && errno != ENOENT)
            warnings.push_back("could not delete old checkpoint '" + path + "': " + errno_text(errno));
    }
}

// Commit order of a new file: after every checkpoint of its naming already in the folder.
int64_t next_commit_ns(const std::string& folder, const Retention& naming) {
    int64_t t = realtime_ns();
    if (naming.prefix.empty() && naming.suffix.empty()) return t;
    try {
        for (const CommittedFile& f : list_checkpoints(folder, naming.prefix, naming.suffix))
            t = std::max(t, f.commit_ns + kCommitStepNs);
    } catch (const std::system_error&) {
    }
    return t;
}

// Splits a staging copy across the staging thread and a few helper threads.
class CopyTeam {
public:
    void start(int helpers) {
        for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { loop(); });
    }
    void stop() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        for (auto& t : threads_) t.join();
        threads_.clear();
    }
    int helpers() const { return static_cast<int>(threads_.size()); }

    void run(const std::vector<Copy>& copies, uint8_t* image, int threads) {
        uint64_t total = 0;
        std::vector<uint64_t> starts;
        starts.reserve(copies.size() + 1);
        for (const Copy& c : copies) {
            starts.push_back(total);
            total += c.size;
        }
        starts.push_back(total);
        const int parts = static_cast<int>(std::max<uint64_t>(
            1, std::min<uint64_t>(uint64_t(std::min(threads, helpers() + 1)), total / kCopyPart)));
        if (parts <= 1) {
            for (const Copy& c : copies) std::memcpy(image + c.dst, c.src, c.size);
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            copies_ = &copies;
            starts_ = &starts;
            image_ = image;
            total_ = total;
            parts_ = parts;
            next_ = 0;
            remaining_ = parts;
        }
        wake_.notify_all();
        std::unique_lock<std::mutex> lock(mutex_);
        while (next_ < parts_) {
            const int part = next_++;
            lock.unlock();
            copy_part(part);
            lock.lock();
            --remaining_;
        }
        done_.wait(lock, [&] { return remaining_ == 0; });
        copies_ = nullptr;
        starts_ = nullptr;
    }

private:
    // Copies bytes [part * total / parts, (part + 1) * total / parts) of the concatenation.
    void copy_part(int part) const {
        const uint64_t lo = total_ * uint64_t(part) / uint64_t(parts_);
        const uint64_t hi = total_ * uint64_t(part + 1) / uint64_t(parts_);
        const auto& starts = *starts_;
        size_t i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), lo) - starts.begin()) - 1;
        for (; i < copies_->size() && starts[i] < hi; ++i) {
            const Copy& c = (*copies_)[i];
            const uint64_t from = std::max(lo, starts[i]) - starts[i];
            const uint64_t to = std::min(hi, starts[i] + c.size) - starts[i];
            if (to > from) std::memcpy(image_ + c.dst + from, c.src + from, to - from);
        }
    }

    void loop() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            wake_.wait(lock, [&] { return stopping_ || next_ < parts_; });
            if (stopping_) return;
            const int part = next_++;
            lock.unlock();
            copy_part(part);
            lock.lock();
            if (--remaining_ == 0) done_.notify_all();
        }
    }

    std::mutex mutex_;
    std::condition_variable wake_, done_;
    std::vector<std::thread> threads_;
    const std::vector<Copy>* copies_ = nullptr;
    const std::vector<uint64_t>* starts_ = nullptr;
    uint8_t* image_ = nullptr;
    uint64_t total_ = 0;
    int parts_ = 0, next_ = 0, remaining_ = 0;
    bool stopping_ = false;
};

struct PoolBuffer {
    uint8_t* data = nullptr;
    uint64_t capacity = 0;
    bool busy = false;
};

uint8_t* allocate_staging(uint64_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    ::madvise(p, bytes, MADV_HUGEPAGE);  // fewer TLB misses in the staging copy
#endif
    // Not touched here: the parallel staging copy faults the pages in, one pass instead of two.
    return static_cast<uint8_t*>(p);
}

}  // namespace

// ---- CheckpointWriter --------------------------------------------------------------

struct CheckpointWriter::Impl {
    WriterOptions options;
    pid_t owner_pid = ::getpid();

    std::mutex mutex;
    std::condition_variable space_cv, stage_cv, write_cv;
    std::deque<std::shared_ptr<Job>> stage_queue, write_queue;
    int pending = 0;
    int submitting = 0;  // accepted by submit() but not yet queued for staging
    bool closing = false;
    bool stager_finished = false;
    std::vector<PoolBuffer> pool;

    std::mutex close_mutex;
    bool closed = false;
    std::thread stager, writer;
    CopyTeam team;
    // Writer thread only:
    std::set<std::string> cleaned_folders;  // stale temporaries already removed there
    int faults_fired = 0;

    void stage_loop() {
        for (;;) {
            std::shared_ptr<Job> job;
            {
                std::unique_lock<std::mutex> lock(mutex);
                // On close, saves that submit() already accepted are still staged and written.
                stage_cv.wait(lock, [&] { return (closing && submitting == 0) || !stage_queue.empty(); });
                if (stage_queue.empty()) {
                    stager_finished = true;
                    break;
                }
                job = std::move(stage_queue.front());
                stage_queue.pop_front();
            }
            team.run(job->copies, job->image, job->copy_threads);
            detail::StatusAccess::of(*job->status).mark_staged();
            {
                std::lock_guard<std::mutex> lock(mutex);
                write_queue.push_back(std::move(job));
            }
            write_cv.notify_one();
        }
        write_cv.notify_all();
    }

    void write_loop() {
#ifdef __linux__
        if (options.writer_nice > 0) {  // per-thread on Linux; never raises priority; best effort
            const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
            errno = 0;
            const int current = ::getpriority(PRIO_PROCESS, tid);
            if (errno == 0 && current < options.writer_nice) ::setpriority(PRIO_PROCESS, tid, options.writer_nice);
        }
#endif
        for (;;) {
            std::shared_ptr<Job> job;
            {
                std::unique_lock<std::mutex> lock(mutex);
                write_cv.wait(lock, [&] { return stager_finished || !write_queue.empty(); });
                if (write_queue.empty()) return;
                job = std::move(write_queue.front());
                write_queue.pop_front();
            }
            run_job(*job);
        }
    }

    void run_job(Job& job) {
        bool failed = false;
        SaveError error;
        std::vector<std::string> warnings;
        try {
            write_and_commit(job, warnings);
        } catch (const IoFailure& f) {
            failed = true;
            error = f.error;
        } catch (const std::exception& e) {
            failed = true;
            error.operation = "write";
            error.path = job.request.path;
            error.message = "checkpoint '" + job.request.path +
                            "' was not saved: internal error in the writer thread: " + e.what();
        } catch (...) {
            failed = true;
            error.operation = "write";
            error.path = job.request.path;
            error.message = "checkpoint '" + job.request.path +
                            "' was not saved: unknown internal error in the writer thread";
        }
        {
            // Free the slot before announcing completion: whoever sees done() may submit.
            std::lock_guard<std::mutex> lock(mutex);
            --pending;
            if (job.pool_slot >= 0) pool[static_cast<size_t>(job.pool_slot)].busy = false;
            detail::StatusAccess::of(*job.status).finish(failed, std::move(error), std::move(warnings));
        }
        space_cv.notify_all();
    }

    std::shared_ptr<SaveStatus> submit(SaveRequest request, bool wait);

    void write_and_commit(Job& job, std::vector<std::string>& warnings) {
        const std::string& final_path = job.request.path;
        if (job.request.gate) {
            const std::string why = job.request.gate->wait();
            if (!why.empty()) {
                SaveError e;
                e.operation = "stage";
                e.path = final_path;
                e.message = "checkpoint '" + final_path + "' was not saved: staging failed: " + why;
                throw IoFailure{std::move(e)};
            }
        }
        const FaultInjection fault =
            options.fault.times < 0 || faults_fired < options.fault.times ? options.fault : FaultInjection{};
        if (fault.throw_exception && fault.fail_after_bytes == 0) {
            ++faults_fired;
            throw std::runtime_error("injected failure in the checkpoint writer thread");
        }
        const std::string folder = folder_of(final_path);
        const std::string name = base_of(final_path);
        // Before the first save into a folder: temporaries of writers that died there.
        if (cleaned_folders.insert(folder).second) remove_stale_temporaries(folder);
        detail::Plan& plan = job.plan;
        uint8_t* image = job.image;
        {
            OutputFile out(folder, name, final_path, options.direct_io && job.aligned, image, fault, &faults_fired);
            const std::string& temp = out.path();
            TempFileGuard guard{temp};
            out.preallocate(plan.file_size);
            for (size_t i = 0; i < plan.records.size(); ++i) {
                detail::PlannedRecord& r = plan.records[i];
                if (i == plan.serialization_id_record) detail::write_serialization_id(plan, image);
                uint32_t crc = 0;
                for (uint64_t off = 0; off < r.size; off += kPiece) {
                    const uint64_t n = std::min(kPiece, r.size - off);
                    crc = crc32(image + r.payload_offset + off, static_cast<size_t>(n), crc);
                    out.write_until(r.payload_offset + off + n, false);
                }
                r.crc = crc;
                detail::write_descriptor(r, image);
            }
            detail::write_central_directory(plan, image);
            out.write_until(plan.file_size, true);
            out.finish(plan.file_size, next_commit_ns(folder, job.request.retention), options.sync);
            if (::rename(temp.c_str(), final_path.c_str()) != 0) fail_io(errno, "rename", temp, final_path);
            guard.armed = false;
            out.close();
        }
        if (options.sync) {
            try {
                fsync_folder(folder, final_path);
            } catch (IoFailure& f) {  // the file is complete under its name; its entry may not be durable
                f.error.message = "checkpoint '" + final_path + "' was written and renamed into place, but " +
                                  f.error.operation + " '" + f.error.path + "' failed: " +
                                  errno_text(f.error.error_number) + " (errno " +
                                  std::to_string(f.error.error_number) + ")";
                throw;
            }
        }
        apply_retention(folder, name, job.request.retention, warnings);
    }
};

CheckpointWriter::CheckpointWriter(WriterOptions options) : impl_(std::make_unique<Impl>()) {
    if (options.max_pending < 1)
        throw std::invalid_argument("max_pending must be >= 1, got " + std::to_string(options.max_pending));
    if (options.copy_threads < 1)
        throw std::invalid_argument("copy_threads must be >= 1, got " + std::to_string(options.copy_threads));
    impl_->options = options;
    impl_->pool.resize(static_cast<size_t>(options.max_pending));
    // Our threads block every signal: asynchronous ones go to the application's threads,
    // and a file-size limit makes write() fail with EFBIG instead of killing the process.
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    try {
        impl_->team.start(options.copy_threads - 1);
        impl_->stager = std::thread([impl = impl_.get()] { impl->stage_loop(); });
        impl_->writer = std::thread([impl = impl_.get()] { impl->write_loop(); });
    } catch (...) {
        // Out of threads (e.g. a huge copy_threads): stop those that started, so that the
        // error reaches the caller instead of std::terminate on a joinable std::thread.
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
        {
            std::lock_guard<std::mutex> lock(impl_->mutex);
            impl_->closing = true;
        }
        impl_->stage_cv.notify_all();
        if (impl_->stager.joinable()) impl_->stager.join();
        if (impl_->writer.joinable()) impl_->writer.join();
        impl_->team.stop();
        throw;
    }
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

CheckpointWriter::~CheckpointWriter() {
    // A forked child inherited this object but none of its threads: leak it there, since
    // destroying joinable std::thread objects calls std::terminate.
    if (impl_ && ::getpid() != impl_->owner_pid) {
        (void)impl_.release();
        return;
    }
    try {
        close();
    } catch (...) {
    }
}

const WriterOptions& CheckpointWriter::options() const { return impl_->options; }

std::shared_ptr<SaveStatus> CheckpointWriter::submit(SaveRequest request) {
    return impl_->submit(std::move(request), true);
}

std::shared_ptr<SaveStatus> CheckpointWriter::try_submit(SaveRequest request) {
    return impl_->submit(std::move(request), false);
}

[[noreturn]] void forked_child_misuse(const char* what) {
    throw std::logic_error(std::string("CheckpointWriter::") + what +
                           " in a forked child: the writer was created in the parent and its threads do not "
                           "exist here; create a new CheckpointWriter in the child");
}

std::shared_ptr<SaveStatus> CheckpointWriter::Impl::submit(SaveRequest request, bool wait) {
    Impl& impl = *this;
    if (::getpid() != owner_pid) forked_child_misuse("submit");
    auto job = std::make_shared<Job>();
    job->plan = detail::make_plan(request);
    const uint64_t need = job->plan.staging_size;
    for (const Record& r : request.records)
        if (!r.data && r.size && !request.staging)
            throw std::invalid_argument("checkpoint record '" + r.name +
                                        "' has no data; only a caller-provided staging image can be filled by the caller");
    if (request.staging && request.staging_capacity < need)
        throw std::invalid_argument("checkpoint staging image holds " + std::to_string(request.staging_capacity) +
                                    " bytes, the archive needs " + std::to_string(need));
    if (request.retention.keep_last < 0) throw std::invalid_argument("keep_last must be >= 0");
    {
        std::unique_lock<std::mutex> lock(impl.mutex);
        if (impl.closing) throw std::logic_error("CheckpointWriter is closed");
        if (!wait && impl.pending >= impl.options.max_pending) return nullptr;
        impl.space_cv.wait(lock, [&] { return impl.closing || impl.pending < impl.options.max_pending; });
        if (impl.closing) throw std::logic_error("CheckpointWriter is closed");
        ++impl.pending;
        ++impl.submitting;
        if (!request.staging) {
            // A free buffer: the largest, so that growing is rare.
            int best = -1;
            for (size_t i = 0; i < impl.pool.size(); ++i)
                if (!impl.pool[i].busy && (best < 0 || impl.pool[i].capacity > impl.pool[size_t(best)].capacity))
                    best = static_cast<int>(i);
            job->pool_slot = best;  // pending < max_pending guarantees one
            impl.pool[size_t(best)].busy = true;
        }
    }
    try {
        if (request.staging) {
            job->image = static_cast<uint8_t*>(request.staging);
        } else {
            PoolBuffer& buffer = impl.pool[size_t(job->pool_slot)];  // ours while busy
            if (buffer.capacity < need) {
                if (buffer.data) ::munmap(buffer.data, buffer.capacity);
                buffer.data = nullptr;
                buffer.capacity = 0;
                const uint64_t grown = staging_capacity(need);
                buffer.data = allocate_staging(grown);
                buffer.capacity = grown;
            }
            job->image = buffer.data;
        }
        job->aligned = reinterpret_cast<uintptr_t>(job->image) % detail::kIoAlignment == 0;
        detail::write_headers(job->plan, request, job->image);
        for (size_t i = 0; i < request.records.size(); ++i) {
            const Record& r = request.records[i];
            if (r.data && r.size)
                job->copies.push_back({static_cast<const uint8_t*>(r.data),
                                       job->plan.records[job->plan.first_user_record + i].payload_offset, r.size});
        }
        job->copy_threads = request.copy_threads > 0 ? request.copy_threads : impl.options.copy_threads;
        job->status = std::make_shared<SaveStatus>();
        detail::StatusAccess::of(*job->status).path = request.path;
        job->request = std::move(request);
    } catch (...) {
        {
            std::lock_guard<std::mutex> lock(impl.mutex);
            --impl.pending;
            --impl.submitting;
            if (job->pool_slot >= 0) impl.pool[size_t(job->pool_slot)].busy = false;
        }
        impl.space_cv.notify_all();
        impl.stage_cv.notify_all();  // a closing stager may be waiting for this submit
        throw;
    }
    auto status = job->status;
    {
        std::lock_guard<std::mutex> lock(impl.mutex);
        impl.stage_queue.push_back(std::move(job));
        --impl.submitting;
    }
    impl.stage_cv.notify_all();
    return status;
}

void CheckpointWriter::wait_all() {
    if (::getpid() != impl_->owner_pid) forked_child_misuse("wait_all");
    std::unique_lock<std::mutex> lock(impl_->mutex);
    impl_->space_cv.wait(lock, [&] { return impl_->pending == 0; });
}

void CheckpointWriter::close() {
    // A forked child has none of our threads (and a mutex may have been copied locked).
    if (::getpid() != impl_->owner_pid) return;
    std::lock_guard<std::mutex> closing(impl_->close_mutex);
    if (impl_->closed) return;
    impl_->closed = true;
    {
        std::lock_guard<std::mutex> lock(impl_->mutex);
        impl_->closing = true;
    }
    impl_->stage_cv.notify_all();
    impl_->write_cv.notify_all();
    impl_->space_cv.notify_all();
    impl_->stager.join();
    impl_->writer.join();
    impl_->team.stop();
    for (PoolBuffer& b : impl_->pool)
        if (b.data) ::munmap(b.data, b.capacity);
    impl_->pool.clear();
}

std::shared_ptr<SaveStatus> write_tensors(CheckpointWriter& writer, const std::string& path,
                                          const std::vector<TensorRef>& tensors, Retention retention) {
    SaveRequest request = tensor_dict_request(path, tensors);
    request.retention = std::move(retention);
    return writer.submit(std::move(request));
}

// ---- Files in a checkpoint folder -------------------------------------------------

std::string checkpoint_file_name(const std::string& prefix, uint64_t step, const std::string& suffix) {
    char digits[24];
    std::snprintf(digits, sizeof digits, "%012llu", static_cast<unsigned long long>(step));
    return prefix + digits + suffix;
}

bool parse_checkpoint_name(const std::string& name, const std::string& prefix, const std::string& suffix,
                           uint64_t* step) {
    if (name.size() <= prefix.size() + suffix.size()) return false;
    if (name.compare(0, prefix.size(), prefix) != 0) return false;
    if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
    uint64_t v = 0;
    for (size_t i = prefix.size(); i < name.size() - suffix.size(); ++i) {
        const char c = name[i];
        if (c < '0' || c > '9') return false;
        if (v > (UINT64_MAX - 9) / 10) return false;
        v = v * 10 + uint64_t(c - '0');
    }
    *step = v;
    return true;
}

bool is_temporary_name(const std::string& name) {
    const size_t mark = name.rfind(".tmp-");
    if (name.size() < 2 || name[0] != '.' || mark == std::string::npos || mark < 2) return false;
    size_t i = mark + 5, digits = 0;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) ++digits;
    if (digits == 0 || i >= name.size() || name[i] != '-') return false;
    const std::string hex = name.substr(i + 1);
    if (hex.size() != 16) return false;
    for (const char c : hex)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    return true;
}

std::vector<CommittedFile> list_checkpoints(const std::string& folder, const std::string& prefix,
                                            const std::string& suffix, CheckpointOrder order) {
    std::vector<CommittedFile> found;
    DIR* dir = ::opendir(folder.c_str());
    if (!dir) {
        if (errno == ENOENT) return found;
        throw std::system_error(errno, std::generic_category(), "list checkpoints in '" + folder + "'");
    }
    while (const dirent* entry = ::readdir(dir)) {
        CommittedFile f;
        f.name = entry->d_name;
        if (!parse_checkpoint_name(f.name, prefix, suffix, &f.step)) continue;
        struct stat st;
        if (::fstatat(::dirfd(dir), entry->d_name, &st, 0) != 0 || !S_ISREG(st.st_mode)) continue;  // just deleted
#ifdef __APPLE__
        f.commit_ns = int64_t(st.st_mtimespec.tv_sec) * 1000000000 + st.st_mtimespec.tv_nsec;
#else
        f.commit_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
#endif
        found.push_back(std::move(f));
    }
    ::closedir(dir);
    if (order == CheckpointOrder::Commit)
        std::sort(found.begin(), found.end(), [](const CommittedFile& a, const CommittedFile& b) {
            return a.commit_ns != b.commit_ns ? a.commit_ns < b.commit_ns : a.step < b.step;
        });
    else
        std::sort(found.begin(), found.end(), [](const CommittedFile& a, const CommittedFile& b) {
            return a.step != b.step ? a.step < b.step : a.commit_ns < b.commit_ns;
        });
    return found;
}

int remove_stale_temporaries(const std::string& folder) {
    DIR* dir = ::opendir(folder.c_str());
    if (!dir) return 0;
    std::vector<std::string> names;
    while (const dirent* entry = ::readdir(dir))
        if (is_temporary_name(entry->d_name)) names.emplace_back(entry->d_name);
    const int dfd = ::dirfd(dir);
    int removed = 0;
    for (const std::string& name : names) {
        const int fd = ::openat(dfd, name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        // The lock is free only when its writer is gone (or has not locked yet: it then sees
        // the file unlinked and starts over). Any doubt (no lock support): keep the file.
        struct stat held, named;
        if (lock_file(fd, false) == 0 && ::fstat(fd, &held) == 0 && S_ISREG(held.st_mode) && held.st_nlink > 0 &&
            ::fstatat(dfd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 && named.st_ino == held.st_ino &&
            named.st_dev == held.st_dev && ::unlinkat(dfd, name.c_str(), 0) == 0)
            ++removed;
        ::close(fd);
    }
    ::closedir(dir);
    return removed;
}

uint64_t staging_capacity(uint64_t bytes) {
    const uint64_t want = bytes + bytes / 8;
    return std::max<uint64_t>(kStagingQuantum, (want + kStagingQuantum - 1) / kStagingQuantum * kStagingQuantum);
}

StagingBuffer::StagingBuffer(uint64_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    data_ = allocate_staging(bytes);
}

void StagingBuffer::populate(uint64_t offset, uint64_t length, int threads) const {
    if (!data_ || offset >= size_) return;
    const uint64_t page = 4096;
    uint64_t begin = offset / page * page;
    const uint64_t end = std::min(size_, length > size_ - offset ? size_ : offset + length);
    auto fault_in = [this](uint64_t from, uint64_t to) {
        if (to <= from) return;
#ifdef MADV_POPULATE_WRITE
        if (::madvise(data_ + from, to - from, MADV_POPULATE_WRITE) == 0) return;  // Linux >= 5.14
#endif
        for (uint64_t off = from; off < to; off += 4096) __atomic_fetch_or(data_ + off, uint8_t(0), __ATOMIC_RELAXED);
    };
    const uint64_t parts = std::max<uint64_t>(1, std::min<uint64_t>(uint64_t(std::max(threads, 1)),
                                                                     (end - begin) / (64ull << 20)));
    const uint64_t share = ((end - begin) / parts + page - 1) / page * page;
    std::vector<std::thread> helpers;
    try {
        for (uint64_t i = 1; i < parts; ++i)
            helpers.emplace_back(fault_in, begin + i * share, std::min(end, begin + (i + 1) * share));
    } catch (...) {  // no threads to spare: the rest on this one
        for (uint64_t i = helpers.size() + 1; i < parts; ++i) fault_in(begin + i * share, std::min(end, begin + (i + 1) * share));
    }
    fault_in(begin, std::min(end, begin + share));
    for (auto& t : helpers) t.join();
}

StagingBuffer::~StagingBuffer() {
    if (data_) ::munmap(data_, size_);
}

}  // namespace qrnn::checkpoint
