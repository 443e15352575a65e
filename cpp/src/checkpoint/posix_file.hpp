// POSIX file operations of a save: the output file (create, lock, direct I/O, write,
// truncate, fsync), the folder fsync, and I/O errors as SaveError values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "checkpoint/fault_injection.hpp"
#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint::detail {

constexpr uint64_t kPiece = 8ull << 20;  // CRC and write granularity

std::string errno_text(int code);

// Thrown inside the writer thread; reaches the submitter as its SaveStatus::error().
struct IoFailure {
    SaveError error;
};
[[noreturn]] void fail_io(int code, const std::string& operation, const std::string& path,
                          const std::string& final_path);

std::string folder_of(const std::string& path);
std::string base_of(const std::string& path);

// Exclusive advisory lock on the whole file (blocking or not); 0 or the errno.
int lock_file(int fd, bool wait);
int64_t realtime_ns();

// The output file: aligned O_DIRECT writes from the staging image where the file system
// allows them (no page-cache copy, cheap fsync), buffered writes otherwise. Created under
// a fresh `temporary_path()` and locked until close().
class OutputFile {
public:
    // `fault`: the test hook (null in production); `faults_fired` counts its failures.
    OutputFile(const std::function<std::string()>& temporary_path, std::string final_path, bool want_direct,
               const uint8_t* image, const testing::FaultInjection* fault, int* faults_fired);
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    // Reserves the space up front: a full disk or a file-size limit fails here.
    void preallocate(uint64_t size);
    // Writes the image up to `ready` (or the aligned part of it) once enough has gathered.
    void write_until(uint64_t ready, bool final);
    // Truncates the aligned tail, stamps the commit order (0: leave the time as written)
    // and makes data and time durable. The descriptor (and its lock) stays open.
    void finish(uint64_t size, int64_t commit_ns, bool sync);
    // After the rename (the data are durable already): releases the lock.
    void close();
    const std::string& path() const { return path_; }

private:
    void drop_direct();
    void write_range(uint64_t end);

    std::string path_, final_;
    const uint8_t* image_;
    const testing::FaultInjection* fault_;
    int* fired_;
    int fd_ = -1;
    bool direct_ = false;
    uint64_t written_ = 0;
};

// Unlinks the temporary file unless the commit succeeded.
struct TempFileGuard {
    std::string path;
    bool armed = true;
    ~TempFileGuard();
};

void fsync_folder(const std::string& folder, const std::string& final_path);

}  // namespace qrnn::checkpoint::detail
