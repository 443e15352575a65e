// POSIX file operations of a save: the output file (create, lock, direct I/O, write,
// truncate, fsync), the folder fsync, and I/O errors as SaveError values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/fault_injection.hpp"
#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint::detail {

constexpr uint64_t kPiece = 8ull << 20;  // CRC and write granularity

// Thrown inside the writer thread; reaches the submitter as its SaveStatus::error().
struct IoFailure { SaveError error; };
[[noreturn]] void fail_io(int code, const std::string& operation, const std::string& path,
                          const std::string& final_path);

std::string folder_of(const std::string& path);
std::string base_of(const std::string& path);

// Creates a fresh temporary for final name `name` in the open folder (exclusive, following
// no link, with `mode` before the umask) and locks it: its descriptor, its name in
// `*temporary`. Throws IoFailure ("create", naming `final_path`).
int create_temporary(int folder_fd, const std::string& folder, const std::string& name, unsigned mode,
                     std::string* temporary, const std::string& final_path);

// The output file: aligned O_DIRECT writes from the staging image where the file system
// allows them (no page-cache copy, cheap fsync), buffered writes otherwise. Created as a
// fresh temporary of `final_path`'s name in the open folder, locked until close().
class OutputFile {
public:
    // `fault`: the test hook (null in production); `faults_fired` counts its failures.
    OutputFile(int folder_fd, const std::string& folder, std::string final_path, unsigned mode, bool want_direct,
               const uint8_t* image, const testing::FaultInjection* fault, int* faults_fired);
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    // Reserves the space up front: a full disk or a file-size limit fails here.
    void preallocate(uint64_t size);
    // Writes the image up to `ready` (or the aligned part of it) once enough has gathered.
    void write_until(uint64_t ready, bool final);
    // Truncates the aligned tail; the descriptor (and its lock) stays open for the commit.
    void finish(uint64_t size);
    // After the rename (the data are durable already): releases the lock.
    void close();
    int fd() const { return fd_; }
    const std::string& name() const { return name_; }  // in the folder
    const std::string& path() const { return path_; }  // for messages

private:
    void drop_direct();
    void write_range(uint64_t end);

    std::string name_, path_, final_;
    const uint8_t* image_;
    const testing::FaultInjection* fault_;
    int* fired_;
    int fd_ = -1;
    bool direct_ = false;
    uint64_t written_ = 0;
};

// Unlinks the temporary file unless the commit succeeded.
struct TempFileGuard {
    int folder_fd;
    std::string name;
    bool armed = true;
    ~TempFileGuard();
};

// True for the errors of a file system that cannot fsync a folder at all (several network and
// FUSE file systems, read-only mounts), as opposed to a folder fsync that failed.
bool folder_sync_unsupported(int code);

// fsync of the open folder: 0, or the errno when the file system cannot fsync a folder
// (folder_sync_unsupported: the caller decides); any other failure throws IoFailure naming
// `final_path`.
int fsync_folder(int folder_fd, const std::string& folder, const std::string& final_path, int injected_errno = 0);

// Stamps the commit order (retention with a naming), fsyncs `fd`, renames `temporary` over
// `name` in the open folder, fsyncs the folder, then applies retention. A folder the file
// system cannot fsync still gets retention (each file was fsynced before its rename, so disk
// use stays bounded), and one warning per folder in this process. Throws IoFailure; the
// caller keeps `fd` open (its lock) and removes the temporary on failure.
// `fault`: the test hook (null in production).
void commit_temporary(int folder_fd, const std::string& folder, int fd, const std::string& temporary,
                      const std::string& name, const Retention& retention, bool sync,
                      std::vector<std::string>& warnings, const testing::FaultInjection* fault = nullptr);

}  // namespace qrnn::checkpoint::detail
