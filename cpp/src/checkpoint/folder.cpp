// CheckpointFolder: a checkpoint folder opened once, and the run folder's other files
// (metrics, plots, best.pt) written into it by the checkpoints' rules.
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/posix_file.hpp"
#include "checkpoint/retention.hpp"
#include "checkpoint/system.hpp"
#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint {

namespace {

using detail::IoFailure;

[[noreturn]] void throw_system(const SaveError& e) {
    throw std::system_error(e.error_number, std::generic_category(), e.message);
}

[[noreturn]] void throw_errno(int code, const std::string& what) {
    throw std::system_error(code, std::generic_category(),
                            what + ": " + detail::errno_text(code) + " (errno " + std::to_string(code) + ")");
}

int open_folder(const std::string& path) {
    int fd;
    do {
        fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

// mkdir -p, fsyncing the parent of every folder it creates.
void make_folders(const std::string& path) {
    for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
        const std::string part = path.substr(0, end);
        if (!part.empty() && part != "." && part != "..") {
            if (::mkdir(part.c_str(), 0777) == 0) {
                const int parent = open_folder(detail::folder_of(part));
                const int r = parent >= 0 ? ::fsync(parent) : -1;
                const int code = errno;
                if (parent >= 0) ::close(parent);
                if (r != 0 && !detail::folder_sync_unsupported(code))
                    throw_errno(code, "fsync of the folder holding new folder '" + part + "' failed");
            } else if (errno != EEXIST) {
                throw_errno(errno, "could not create folder '" + part + "'");
            }
        }
        if (end == std::string::npos) return;
    }
}

std::string lock_name(const std::string& prefix) { return "." + prefix + "writer.lock"; }

void check_name(const std::string& name) {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos)
        throw std::invalid_argument("'" + name + "' is not a plain file name");
}

bool write_all(int fd, const uint8_t* data, size_t size) {
    while (size > 0) {
        const ssize_t n = ::write(fd, data, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        data += n;
        size -= static_cast<size_t>(n);
    }
    return true;
}

}  // namespace

CheckpointFolder::CheckpointFolder(const std::string& path, bool create) : path_(path) {
    if (create) make_folders(path);
    fd_ = open_folder(path);
    if (fd_ < 0) throw_errno(errno, "could not open checkpoint folder '" + path + "'");
}

CheckpointFolder::~CheckpointFolder() {
    unlock_writer();
    if (fd_ >= 0) ::close(fd_);
}

void CheckpointFolder::lock_writer(const std::string& prefix) {
    if (lock_fd_ >= 0) return;
    const std::string name = lock_name(prefix);
    check_name(name);
    for (int attempt = 0;; ++attempt) {
        int fd;
        do {
            fd = ::openat(fd_, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0) throw_errno(errno, "could not open the writer lock '" + path_ + "/" + name + "'");
        const int code = detail::lock_file(fd, false);
        if (code == EAGAIN || code == EACCES || code == EWOULDBLOCK) {
            char holder[256] = {0};
            const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
            ::close(fd);
            std::string who = n > 0 ? std::string(holder, size_t(n)) : "another writer";
            while (!who.empty() && (who.back() == '\n' || who.back() == '\r')) who.pop_back();
            throw std::system_error(EBUSY, std::generic_category(),
                                    "checkpoint folder '" + path_ + "' already has a writer for prefix '" + prefix +
                                        "': " + who + " holds '" + name +
                                        "'; close it, or use another folder or prefix");
        }
        // The holder unlinks the file before it lets go: a lock on a file no longer under
        // the name is no lock. (Without lock support: unlocked, like the temporaries.)
        struct stat held, named;
        if (attempt < 8 && (::fstat(fd, &held) != 0 || ::fstatat(fd_, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 ||
                            held.st_ino != named.st_ino || held.st_dev != named.st_dev)) {
            ::close(fd);
            continue;
        }
        char host[256] = {0};
        ::gethostname(host, sizeof host - 1);
        const std::string who = "pid " + std::to_string(::getpid()) + " on host " + host + "\n";
        if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, who.data(), who.size(), 0);
        lock_fd_ = fd;
        lock_pid_ = ::getpid();
        lock_name_ = name;
        return;
    }
}

void CheckpointFolder::unlock_writer() {
    if (lock_fd_ < 0) return;
    // Still held: no one else holds this name's lock. A forked child shares the parent's
    // lock and only lets go of its descriptor.
    if (::getpid() == lock_pid_) ::unlinkat(fd_, lock_name_.c_str(), 0);
    ::close(lock_fd_);
    lock_fd_ = -1;
}

int CheckpointFolder::create_temporary(const std::string& name, unsigned mode, std::string* temporary) const {
    check_name(name);
    try {
        return detail::create_temporary(fd_, path_, name, mode, temporary, path_ + "/" + name);
    } catch (const IoFailure& f) {
        throw_system(f.error);
    }
}

std::vector<std::string> CheckpointFolder::commit(int fd, const std::string& temporary, const std::string& name,
                                                  const Retention& retention, bool sync) const {
    std::vector<std::string> warnings;
    detail::TempFileGuard guard{fd_, temporary};
    try {
        check_name(name);
        detail::commit_temporary(fd_, path_, fd, temporary, name, retention, sync, warnings);
        guard.armed = false;
    } catch (const IoFailure& f) {
        ::close(fd);
        throw_system(f.error);
    } catch (...) {
        ::close(fd);
        throw;
    }
    ::close(fd);
    return warnings;
}

std::vector<std::string> CheckpointFolder::write_file(const std::string& name, const void* data, size_t size,
                                                      unsigned mode, bool sync) const {
    std::string temporary;
    const int fd = create_temporary(name, mode, &temporary);
    if (!write_all(fd, static_cast<const uint8_t*>(data), size)) {
        const int code = errno ? errno : EIO;
        ::close(fd);
        ::unlinkat(fd_, temporary.c_str(), 0);
        throw_errno(code, "'" + path_ + "/" + name + "' was not written: write '" + temporary + "' failed");
    }
    return commit(fd, temporary, name, Retention{}, sync);
}

std::vector<std::string> CheckpointFolder::publish(const std::string& source, const std::string& name, unsigned mode,
                                                   bool sync) const {
    check_name(source);
    check_name(name);
    const std::string what = "'" + path_ + "/" + name + "' was not published from '" + source + "'";
    int in;
    do {  // the committed file itself, never what a link planted under its name points at
        in = ::openat(fd_, source.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    } while (in < 0 && errno == EINTR);
    if (in < 0) throw_errno(errno, what + ": open");
    struct stat st;
    if (::fstat(in, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(in);
        throw_errno(EINVAL, what + ": not a regular file");
    }
    // A hard link: a temporary name for the same inode, locked like every temporary.
    for (int attempt = 0; attempt < 8; ++attempt) {
        const std::string temporary = detail::temporary_name(name);
        if (::linkat(fd_, source.c_str(), fd_, temporary.c_str(), 0) != 0) {
            if (errno == EEXIST) continue;
            break;  // no hard links here: copy
        }
        const int fd = ::openat(fd_, temporary.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        struct stat linked;
        if (fd >= 0) detail::lock_file(fd, true);
        if (fd < 0 || ::fstat(fd, &linked) != 0 || linked.st_ino != st.st_ino || linked.st_dev != st.st_dev ||
            linked.st_nlink < 2) {  // replaced or cleaned in between: start over
            if (fd >= 0) ::close(fd);
            ::unlinkat(fd_, temporary.c_str(), 0);
            continue;
        }
        ::close(in);
        return commit(fd, temporary, name, Retention{}, sync);
    }
    std::string temporary;
    const int out = create_temporary(name, mode, &temporary);
    std::vector<uint8_t> buffer(1 << 20);
    for (;;) {
        const ssize_t n = ::read(in, buffer.data(), buffer.size());
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) break;
        if (n < 0 || !write_all(out, buffer.data(), size_t(n))) {
            const int code = errno ? errno : EIO;
            ::close(in);
            ::close(out);
            ::unlinkat(fd_, temporary.c_str(), 0);
            throw_errno(code, what + ": copy");
        }
    }
    ::close(in);
    return commit(out, temporary, name, Retention{}, sync);
}

}  // namespace qrnn::checkpoint
