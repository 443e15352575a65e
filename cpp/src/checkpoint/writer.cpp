// CheckpointWriter: bounded queue -> staging thread (copy on the library's thread pool) ->
// writer thread.
//
// Durability protocol for each save: create "<folder>/.<name>.tmp-<pid>-<random>" and lock
// it, write it, stamp its commit order (modification time), fsync it, rename it over
// "<folder>/<name>", fsync the folder, and only then delete older files (retention). Any
// failure unlinks the temporary file and reaches the submitter through its SaveStatus; the
// previous checkpoint is never touched.
#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/syscall.h>
#endif

#include "checkpoint/archive.hpp"
#include "checkpoint/fault_injection.hpp"
#include "checkpoint/posix_file.hpp"
#include "checkpoint/staging.hpp"
#include "checkpoint/status.hpp"
#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint {

namespace {

using detail::IoFailure;

struct Job {
    SaveRequest request;
    detail::FilePlan plan;
    uint8_t* image = nullptr;
    bool aligned = false;
    int pool_slot = -1;
    std::vector<detail::Copy> copies;
    int copy_threads = 1;
    std::shared_ptr<SaveStatus> status;
};

struct PoolBuffer {
    uint8_t* data = nullptr;
    uint64_t capacity = 0;
    bool busy = false;
};

[[noreturn]] void forked_child_misuse(const char* what) {
    throw std::logic_error(std::string("CheckpointWriter::") + what +
                           " in a forked child: the writer was created in the parent and its threads do not "
                           "exist here; create a new CheckpointWriter in the child");
}

// Misuse that submit() reports before queueing anything.
void check_request(const SaveRequest& request, const detail::FilePlan& plan) {
    const uint64_t staging_needed = plan.staging_size;
    for (size_t k = 0; k < plan.plans.size(); ++k)
        for (const Record& r : plan.request(request, k).records)
            if (!r.data && r.size && !request.staging)
                throw std::invalid_argument(
                    "checkpoint record '" + r.name +
                    "' has no data; only a caller-provided staging image can be filled by the caller");
    if (request.staging && request.staging_capacity < staging_needed)
        throw std::invalid_argument("checkpoint staging image holds " + std::to_string(request.staging_capacity) +
                                    " bytes, the archive needs " + std::to_string(staging_needed));
    if (request.retention.keep_last < 0) throw std::invalid_argument("keep_last must be >= 0");
}

SaveError internal_error(const std::string& path, const std::string& what) {
    SaveError error;
    error.operation = "write";
    error.path = path;
    error.message = "checkpoint '" + path + "' was not saved: " + what;
    return error;
}

// Linux: nice values are per thread; never raises priority; best effort.
void lower_thread_priority(int nice) {
#ifdef __linux__
    if (nice <= 0) return;
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    errno = 0;
    const int current = ::getpriority(PRIO_PROCESS, tid);
    if (errno == 0 && current < nice) ::setpriority(PRIO_PROCESS, tid, nice);
#else
    (void)nice;
#endif
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
    // Writer thread only (the fault is set before the first submit):
    std::set<std::string> cleaned_folders;  // stale temporaries already removed there
    testing::FaultInjection fault;
    int faults_fired = 0;

    // -- submit, in steps --

    std::shared_ptr<SaveStatus> submit(SaveRequest request, bool wait) {
        if (::getpid() != owner_pid) forked_child_misuse("submit");
        PlannedSave planned(std::move(request));
        return submit(planned, wait);
    }

    // Takes `planned` over only once the save is queued.
    std::shared_ptr<SaveStatus> submit(PlannedSave& planned, bool wait) {
        if (::getpid() != owner_pid) forked_child_misuse("submit");
        PlannedSave::Impl& contents = detail::PlanAccess::of(planned);
        check_request(contents.request, contents.plan);
        auto job = std::make_shared<Job>();
        if (!reserve_slot(*job, contents.request, wait)) return nullptr;
        try {
            prepare(*job, contents.plan, contents.request);
        } catch (...) {
            release_slot(*job);
            throw;
        }
        job->plan = std::move(contents.plan);
        job->request = std::move(contents.request);
        detail::PlanAccess::consume(planned);
        auto status = job->status;
        enqueue(std::move(job));
        return status;
    }

    // Counts the save as pending (waiting for room if `wait`) and takes a staging buffer
    // unless the caller brings one. False when the queue is full and `wait` is not set.
    bool reserve_slot(Job& job, const SaveRequest& request, bool wait) {
        std::unique_lock<std::mutex> lock(mutex);
        if (closing) throw std::logic_error("CheckpointWriter is closed");
        if (!wait && pending >= options.max_pending) return false;
        space_cv.wait(lock, [&] { return closing || pending < options.max_pending; });
        if (closing) throw std::logic_error("CheckpointWriter is closed");
        ++pending;
        ++submitting;
        if (!request.staging) {
            // A free buffer: the largest, so that growing is rare (pending < max_pending
            // guarantees one).
            int best = -1;
            for (size_t i = 0; i < pool.size(); ++i)
                if (!pool[i].busy && (best < 0 || pool[i].capacity > pool[size_t(best)].capacity))
                    best = static_cast<int>(i);
            job.pool_slot = best;
            pool[size_t(best)].busy = true;
        }
        return true;
    }

    // Undoes reserve_slot after a failed prepare.
    void release_slot(const Job& job) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            --pending;
            --submitting;
            if (job.pool_slot >= 0) pool[size_t(job.pool_slot)].busy = false;
        }
        space_cv.notify_all();
        stage_cv.notify_all();  // a closing stager may be waiting for this submit
    }

    // The staging image with its headers written, the copies to make, the status.
    void prepare(Job& job, const detail::FilePlan& file, const SaveRequest& request) {
        job.image = request.staging ? static_cast<uint8_t*>(request.staging) : pool_image(job, file.staging_size);
        job.aligned = reinterpret_cast<uintptr_t>(job.image) % detail::kIoAlignment == 0;
        for (size_t k = 0; k < file.plans.size(); ++k) {
            const detail::Plan& plan = file.plans[k];
            const SaveRequest& part = file.request(request, k);
            const uint64_t base = file.bases[k];
            if (!plan.raw) detail::write_headers(plan, part, job.image + base);
            for (size_t i = 0; i < part.records.size(); ++i) {
                const Record& r = part.records[i];
                if (r.data && r.size)
                    job.copies.push_back({static_cast<const uint8_t*>(r.data),
                                          base + plan.records[plan.first_user_record + i].payload_offset, r.size});
            }
        }
        job.copy_threads = request.copy_threads > 0 ? request.copy_threads : options.copy_threads;
        job.status = std::make_shared<SaveStatus>();
        detail::StatusAccess::of(*job.status).path = request.path;
    }

    // The job's pool buffer, grown to `need` bytes (ours alone while busy).
    uint8_t* pool_image(const Job& job, uint64_t need) {
        PoolBuffer& buffer = pool[size_t(job.pool_slot)];
        if (buffer.capacity < need) {
            detail::free_staging(buffer.data, buffer.capacity);
            buffer.data = nullptr;
            buffer.capacity = 0;
            const uint64_t grown = staging_capacity(need);
            buffer.data = detail::allocate_staging(grown);
            buffer.capacity = grown;
        }
        return buffer.data;
    }

    void enqueue(std::shared_ptr<Job> job) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            stage_queue.push_back(std::move(job));
            --submitting;
        }
        stage_cv.notify_all();
    }

    // -- the threads --

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
            detail::copy_into(job->copies, job->image, job->copy_threads);
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
        lower_thread_priority(options.writer_nice);
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
        bool failed = true;
        SaveError error;
        std::vector<std::string> warnings;
        try {
            write_and_commit(job, warnings);
            failed = false;
        } catch (const IoFailure& f) {
            error = f.error;
        } catch (const std::exception& e) {
            error = internal_error(job.request.path, std::string("internal error in the writer thread: ") + e.what());
        } catch (...) {
            error = internal_error(job.request.path, "unknown internal error in the writer thread");
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

    // The injected fault for this save, if any is left (test hook).
    const testing::FaultInjection* fault_for_save() {
        if (!fault.active() || (fault.times >= 0 && faults_fired >= fault.times)) return nullptr;
        if (fault.throw_exception && fault.fail_after_bytes == 0) {
            ++faults_fired;
            throw std::runtime_error("injected failure in the checkpoint writer thread");
        }
        return &fault;
    }

    void write_and_commit(Job& job, std::vector<std::string>& warnings) {
        const std::string& final_path = job.request.path;
        wait_for_gate(job);
        const testing::FaultInjection* injected = fault_for_save();
        const std::string folder = detail::folder_of(final_path);
        const std::string name = detail::base_of(final_path);
        // The folder is opened once (by the caller, or here for this save): nothing after
        // follows its name again.
        std::shared_ptr<const CheckpointFolder> opened = job.request.folder;
        if (!opened) {
            try {
                opened = std::make_shared<CheckpointFolder>(folder);
            } catch (const std::system_error& e) {
                detail::fail_io(e.code().value(), "open folder", folder, final_path);
            }
        }
        const int dfd = opened->fd();
        // Before the first save into a folder: temporaries of writers that died there.
        if (cleaned_folders.insert(folder).second) remove_stale_temporaries(dfd);
        detail::OutputFile out(dfd, folder, final_path, job.request.file_mode, options.direct_io && job.aligned,
                               job.image, injected, &faults_fired);
        detail::TempFileGuard guard{dfd, out.name()};
        out.preallocate(job.plan.file_size);
        write_records(job, out);
        out.finish(job.plan.file_size);
        detail::commit_temporary(dfd, folder, out.fd(), out.name(), name, job.request.retention, options.sync, warnings,
                                 injected);
        guard.armed = false;
        out.close();
    }

    static void wait_for_gate(const Job& job) {
        if (!job.request.gate) return;
        const std::string why = job.request.gate->wait();
        if (why.empty()) return;
        SaveError e;
        e.operation = "stage";
        e.path = job.request.path;
        e.message = "checkpoint '" + job.request.path + "' was not saved: staging failed: " + why;
        throw IoFailure{std::move(e)};
    }

    // Archive by archive: CRCs and writes, piece by piece, then descriptors, central
    // directory and the tail.
    static void write_records(Job& job, detail::OutputFile& out) {
        for (size_t k = 0; k < job.plan.plans.size(); ++k) {
            detail::Plan& plan = job.plan.plans[k];
            const uint64_t base = job.plan.bases[k];
            uint8_t* image = job.image + base;
            for (size_t i = 0; i < plan.records.size(); ++i) {
                detail::PlannedRecord& r = plan.records[i];
                if (i == plan.serialization_id_record) detail::write_serialization_id(plan, image);
                uint32_t crc = 0;
                for (uint64_t off = 0; off < r.size; off += detail::kPiece) {
                    const uint64_t n = std::min(detail::kPiece, r.size - off);
                    crc = crc32(image + r.payload_offset + off, static_cast<size_t>(n), crc);
                    out.write_until(base + r.payload_offset + off + n, false);
                }
                r.crc = crc;
                if (!plan.raw) detail::write_descriptor(r, image);
            }
            if (!plan.raw) detail::write_central_directory(plan, image);
            out.write_until(base + plan.file_size, k + 1 == job.plan.plans.size());
        }
    }

    // Stops the threads that started (after a failed start, or at close).
    void stop_threads() {
        {
            std::lock_guard<std::mutex> lock(mutex);
            closing = true;
        }
        stage_cv.notify_all();
        write_cv.notify_all();
        space_cv.notify_all();
        if (stager.joinable()) stager.join();
        if (writer.joinable()) writer.join();
    }
};

namespace detail {
struct WriterAccess {
    static CheckpointWriter::Impl& of(CheckpointWriter& writer) { return *writer.impl_; }
};
}  // namespace detail

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
        impl_->stager = std::thread([impl = impl_.get()] { impl->stage_loop(); });
        impl_->writer = std::thread([impl = impl_.get()] { impl->write_loop(); });
    } catch (...) {
        // Out of threads: stop those that started, so that the error reaches the caller
        // instead of std::terminate on a joinable std::thread.
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
        impl_->stop_threads();
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

std::shared_ptr<SaveStatus> CheckpointWriter::submit(PlannedSave&& planned) { return impl_->submit(planned, true); }

std::shared_ptr<SaveStatus> CheckpointWriter::try_submit(PlannedSave&& planned) {
    return impl_->submit(planned, false);
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
    impl_->stop_threads();
    for (PoolBuffer& b : impl_->pool) detail::free_staging(b.data, b.capacity);
    impl_->pool.clear();
}

std::shared_ptr<SaveStatus> write_tensors(CheckpointWriter& writer, const std::string& path,
                                          const std::vector<TensorRef>& tensors, Retention retention) {
    SaveRequest request = tensor_dict_request(path, tensors);
    request.retention = std::move(retention);
    return writer.submit(std::move(request));
}

std::unique_ptr<CheckpointWriter> testing::writer_with_faults(WriterOptions options, const FaultInjection& fault) {
    auto writer = std::make_unique<CheckpointWriter>(options);
    CheckpointWriter::Impl& impl = detail::WriterAccess::of(*writer);
    std::lock_guard<std::mutex> lock(impl.mutex);  // published to the writer thread with the first job
    impl.fault = fault;
    return writer;
}

}  // namespace qrnn::checkpoint
