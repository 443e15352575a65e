// POSIX file operations of a save (see checkpoint/posix_file.hpp).
#include "checkpoint/posix_file.hpp"

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "checkpoint/archive.hpp"
#include "checkpoint/retention.hpp"
#include "checkpoint/system.hpp"

namespace qrnn::checkpoint::detail {

namespace {

constexpr uint64_t kMinWrite = 4ull << 20;  // coalesce small records into one write

uint64_t align_up(uint64_t v) { return (v + kIoAlignment - 1) / kIoAlignment * kIoAlignment; }

// fsync; on macOS fsync leaves data in the drive's cache, F_FULLFSYNC does not.
bool sync_to_disk(int fd) {
#ifdef F_FULLFSYNC
    if (::fcntl(fd, F_FULLFSYNC) == 0) return true;
#endif
    return ::fsync(fd) == 0;
}

}  // namespace

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

// ---- OutputFile --------------------------------------------------------------------

int create_temporary(int folder_fd, const std::string& folder, const std::string& name, unsigned mode,
                     std::string* temporary, const std::string& final_path) {
    for (int attempt = 0;; ++attempt) {
        *temporary = temporary_name(name);
        int fd;
        do {  // O_EXCL: a planted file or link under this name is never opened
            fd = ::openat(folder_fd, temporary->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                          static_cast<mode_t>(mode));
        } while (fd < 0 && errno == EINTR);
        if (fd < 0 && errno == EEXIST && attempt < 8) continue;
        if (fd < 0) fail_io(errno, "create", folder + "/" + *temporary, final_path);
        // Held until after the rename: while it is held no cleaner deletes the file. A
        // cleaner may have taken the lock between our create and here (it then unlinks
        // the file): start again under a new name. Without lock support, write unlocked
        // (cleaners then never delete: they cannot lock either).
        lock_file(fd, true);
        struct stat st;
        if (::fstat(fd, &st) == 0 && st.st_nlink == 0 && attempt < 8) {
            ::close(fd);
            continue;
        }
        return fd;
    }
}

OutputFile::OutputFile(int folder_fd, const std::string& folder, std::string final_path, unsigned mode,
                       bool want_direct, const uint8_t* image, const testing::FaultInjection* fault, int* faults_fired)
    : final_(std::move(final_path)), image_(image), fault_(fault), fired_(faults_fired) {
    fd_ = create_temporary(folder_fd, folder, base_of(final_), mode, &name_, final_);
    path_ = folder + "/" + name_;
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

OutputFile::~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
}

void OutputFile::preallocate(uint64_t size) {
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

void OutputFile::write_until(uint64_t ready, bool final) {
    if (!final && ready - written_ < kMinWrite) return;
    uint64_t end = ready;
    if (direct_) end = final ? align_up(ready) : ready / kIoAlignment * kIoAlignment;
    if (end > written_) write_range(end);
}

void OutputFile::finish(uint64_t size) {
    if (written_ > size) {  // the last aligned write went past the end
        if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) fail_io(errno, "truncate", path_, final_);
    }
}

void OutputFile::close() {
    const int fd = fd_;
    fd_ = -1;
    if (fd >= 0) ::close(fd);
}

void OutputFile::drop_direct() {
#ifdef O_DIRECT
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
#endif
    direct_ = false;
}

void OutputFile::write_range(uint64_t end) {
    while (written_ < end) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(end - written_, kPiece));
        if (fault_ && fault_->fail_after_bytes != UINT64_MAX && written_ + n > fault_->fail_after_bytes) {
            ++*fired_;
            if (fault_->throw_exception) throw std::runtime_error("injected failure in the checkpoint writer thread");
            fail_io(fault_->error_number ? fault_->error_number : EIO, "write", path_, final_);
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
        if (direct_ && written_ % kIoAlignment) drop_direct();  // short write: unaligned now
    }
}

TempFileGuard::~TempFileGuard() {
    if (armed) ::unlinkat(folder_fd, name.c_str(), 0);
}

bool folder_sync_unsupported(int code) {
    return code == EINVAL || code == EROFS || code == ENOTSUP || code == EOPNOTSUPP;
}

int fsync_folder(int folder_fd, const std::string& folder, const std::string& final_path, int injected_errno) {
    int r = ::fsync(folder_fd);
    int code = errno;
    if (injected_errno) {
        r = -1;
        code = injected_errno;
    }
    if (r == 0) return 0;
    if (folder_sync_unsupported(code)) return code;
    fail_io(code, "fsync folder", folder, final_path);
}

namespace {

// True the first time in this process that `folder_fd`'s folder (by device and inode, however
// it was opened) refuses an fsync: a file system that cannot fsync folders refuses every
// time, and one warning says so.
bool first_folder_sync_refusal(int folder_fd) {
    struct stat st;
    if (::fstat(folder_fd, &st) != 0) return true;
    static std::mutex mutex;
    static std::set<std::pair<dev_t, ino_t>> reported;
    std::lock_guard<std::mutex> lock(mutex);
    return reported.emplace(st.st_dev, st.st_ino).second;
}

}  // namespace

void commit_temporary(int folder_fd, const std::string& folder, int fd, const std::string& temporary,
                      const std::string& name, const Retention& retention, bool sync,
                      std::vector<std::string>& warnings, const testing::FaultInjection* fault) {
    const std::string final_path = folder + "/" + name;
    const std::string temporary_path = folder + "/" + temporary;
    if (!retention.prefix.empty() || !retention.suffix.empty()) {
        const int64_t commit_ns = next_commit_ns(folder_fd, retention);
        struct timespec times[2];
        times[0].tv_sec = 0;
        times[0].tv_nsec = UTIME_OMIT;
        times[1].tv_sec = static_cast<time_t>(commit_ns / 1000000000);
        times[1].tv_nsec = static_cast<long>(commit_ns % 1000000000);
        ::futimens(fd, times);  // best effort: a file system that refuses keeps its write time
    }
    if (sync && !sync_to_disk(fd)) fail_io(errno, "fsync", temporary_path, final_path);
    if (::renameat(folder_fd, temporary.c_str(), folder_fd, name.c_str()) != 0)
        fail_io(errno, "rename", temporary_path, final_path);
    if (sync) {
        int refused = 0;
        try {
            refused = fsync_folder(folder_fd, folder, final_path, fault ? fault->folder_sync_errno : 0);
        } catch (IoFailure& f) {  // the file is complete under its name; its entry may not be durable
            f.error.message = "checkpoint '" + final_path + "' was written and renamed into place, but " +
                              f.error.operation + " '" + f.error.path +
                              "' failed: " + errno_text(f.error.error_number) + " (errno " +
                              std::to_string(f.error.error_number) + ")";
            throw;
        }
        // Retention goes on: keeping every old file instead fills the disk of a run that
        // saves often; bounded disk use wins over surviving a crash right after the rename.
        if (refused && first_folder_sync_refusal(folder_fd))
            warnings.push_back("folder '" + folder + "' cannot be fsynced (" + errno_text(refused) + ", errno " +
                               std::to_string(refused) + "): every file is fsynced before its rename and " +
                               "older checkpoints are still deleted, but a crash may lose the latest rename " +
                               "(warned once per folder)");
    }
    apply_retention(folder_fd, folder, name, retention, warnings);
}

}  // namespace qrnn::checkpoint::detail
