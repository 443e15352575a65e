// Crash-safe, non-blocking checkpoint files that plain `torch.load` reads.
//
// A CheckpointWriter owns a staging thread, a writer thread and a bounded queue. submit()
// takes a small serialized header (the `data.pkl` pickle) and named byte buffers; the
// staging thread copies the buffers into a reusable staging image laid out exactly as the
// file (torch.save's zip layout: stored records, 64-byte aligned payloads, ZIP64 end
// records, real CRC-32s), and the writer thread writes that image to a temporary name in
// the target folder, fsyncs it, renames it over the final name and fsyncs the folder.
// A process killed at any moment therefore never leaves a partial file under a final name.
//
// Nothing in a save throws or prints on an I/O failure: every error (errno, operation, path)
// arrives through the SaveStatus the submitter holds (CheckpointFolder's own calls throw
// std::system_error). Only misuse (bad arguments,
// submitting after close) throws std::invalid_argument / std::logic_error from submit().
//
// No torch, no Python: `write_tensors()` builds the pickle for a flat name -> tensor dict
// itself, so a C++ program can write checkpoints that Python loads with
// `torch.load(path, weights_only=True)`.
//
// POSIX (Linux, macOS). The writer's threads block all signals, so a file-size limit makes
// the write fail with EFBIG instead of delivering SIGXFSZ. Buffers passed to submit() must
// stay unchanged until SaveStatus::staged(); a Gate must be opened or failed before close().
//
//   qrnn::checkpoint::CheckpointWriter writer;                  // one per process is enough
//   auto status = qrnn::checkpoint::write_tensors(writer, "run/ckpt-000010.pt",
//       {{"weight", qrnn::checkpoint::ScalarType::Float32, {rows, cols}, {}, w.data()}},
//       {/*keep_last=*/3, "ckpt-", ".pt"});
//   status->wait_staged();                                     // w may change from here on
//   ...
//   status->wait();
//   if (!status->ok()) report(status->error().message);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qrnn/dtype.hpp"  // QRNN_API

namespace qrnn::checkpoint {

// CRC-32 as used by zip (polynomial 0xEDB88320), continuing from `crc` (0 to start).
// Uses carry-less multiply (PCLMULQDQ) on x86-64 CPUs that have it, slicing-by-8 otherwise.
QRNN_API uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

// Element types of tensor storages, as torch names them in a checkpoint.
enum class ScalarType : uint8_t {
    Float32,
    Float64,
    Float16,
    BFloat16,
    Complex64,
    Complex128,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    Bool,
};
QRNN_API size_t element_size(ScalarType type);

namespace detail {
struct StatusAccess;
struct WriterAccess;

// Objects that own threads, locks or memory by address: never copied.
class NonCopyable {
protected:
    NonCopyable() = default;
    ~NonCopyable() = default;

public:
    NonCopyable(const NonCopyable&) = delete;
    NonCopyable& operator=(const NonCopyable&) = delete;
};
}  // namespace detail

// What went wrong with a save. `error_number` is the errno of the failing system call
// (0 when the failure was not one, e.g. an exception inside the writer thread).
struct SaveError {
    int error_number = 0;
    std::string operation;  // e.g. "write", "fsync", "rename", "open"
    std::string path;       // the file or folder the operation was on
    std::string message;    // one readable sentence with all of the above
};

// Shared between the writer threads and whoever submitted the save.
class QRNN_API SaveStatus : detail::NonCopyable {
public:
    SaveStatus();
    ~SaveStatus();

    // The submitted buffers have been copied: the caller may modify or free them.
    bool staged() const;
    void wait_staged() const;
    // Committed (renamed to its final name and the folder fsynced), or failed.
    bool done() const;
    void wait() const;
    // Waits at most `seconds`; returns done().
    bool wait_for(double seconds) const;
    // After done(): true when the file is committed. error() explains a failure.
    bool ok() const;
    SaveError error() const;
    // Problems that did not affect the new checkpoint (e.g. an old file rotation could
    // not delete), one sentence each.
    std::vector<std::string> warnings() const;
    // Final path of the checkpoint file.
    const std::string& path() const;
    // Seconds from submit() to staged and to done (-1 before).
    double staged_seconds() const;
    double done_seconds() const;

private:
    friend struct detail::StatusAccess;
    struct State;
    std::unique_ptr<State> state_;
};

// A latch the writer waits on before reading bytes the caller puts into the staging image
// itself (e.g. an asynchronous GPU->host copy). open() when they are there; fail() with a
// reason when they never will be (the save then fails with that reason).
class QRNN_API Gate : detail::NonCopyable {
public:
    Gate();
    ~Gate();
    void open();
    void fail(const std::string& reason);
    bool is_open() const;
    // Blocks until open() or fail(); returns "" when opened, else the reason.
    std::string wait() const;

private:
    struct State;
    std::unique_ptr<State> state_;
};

// A named byte buffer to store as one record of the archive, e.g. {"data/0", ptr, n}.
// `data` may be null when the caller copies the bytes into the staging image itself
// (see SaveRequest::gate); the record then occupies `size` bytes there.
struct Record {
    std::string name;
    const void* data = nullptr;
    uint64_t size = 0;
};

// Delete older checkpoints after a commit: files in the same folder named
// checkpoint_file_name(prefix, step, suffix), keeping the `keep_last` most recently
// committed ones (commit order, not step order: a run rolled back to an earlier step keeps
// its new saves). The file just committed is never deleted. keep_last == 0 keeps everything.
// With a prefix or suffix set, the commit also orders the file after every checkpoint of
// that naming already in the folder (see list_checkpoints).
struct Retention {
    int keep_last = 0;
    std::string prefix;
    std::string suffix;
};

class CheckpointFolder;

// One archive of a file that holds several (SaveRequest::archives): a complete torch.save
// archive of its own, whose records are named "<prefix>/..." (torch.save to a buffer uses
// "archive"). torch.distributed.checkpoint's file layout: each item is read back by
// torch.load from its byte range of the file.
// A `raw` part is no archive: just its records' bytes one after another (DCP's byte items),
// with no pickle; record names then only need to be unique within the part.
struct ArchivePart {
    std::string prefix = "archive";
    std::string pickle;           // its data.pkl record
    std::vector<Record> records;  // stored after its fixed torch records, in this order
    bool raw = false;
};

struct SaveRequest {
    std::string path;             // final file name; its folder must exist
    std::string pickle;           // the data.pkl record (pickle protocol 2)
    std::vector<Record> records;  // stored after the fixed torch records, in this order
    Retention retention;
    // Optional caller-owned staging image (>= staging_size() of this request, any
    // alignment); by default the writer allocates its own and reuses it for later saves.
    void* staging = nullptr;
    uint64_t staging_capacity = 0;
    // Optional: the writer waits for it before reading records whose data is null.
    std::shared_ptr<Gate> gate;
    // Threads copying this request's buffers (0: the writer's copy_threads).
    int copy_threads = 0;
    // Optional: the folder opened once; every create, rename, fsync, listing and unlink of
    // the save is then relative to it (a folder swapped for a symlink, or a chdir, after it
    // was opened redirects nothing) and `path`'s folder part only names it in messages.
    // Without it the writer opens path's folder by name once per save.
    std::shared_ptr<const CheckpointFolder> folder;
    // Permission bits of the new file before the umask (0600: private to the owner).
    unsigned file_mode = 0666;
    // Optional: the file is these archives one after another (ArchiveLayout gives where each
    // starts), written, fsynced and committed as one file; `pickle` and `records` must then
    // be empty. Empty: the file is the one archive of `pickle` and `records`.
    std::vector<ArchivePart> archives;
};

struct WriterOptions {
    int max_pending = 1;    // saves submitted but not yet committed; submit() waits beyond
    int copy_threads = 2;   // threads for the staging copy (the staging thread included)
    bool direct_io = true;  // write with O_DIRECT where the file system allows it
    // Durability: fsync each file before its rename and the folder after it (see
    // CheckpointFolder::commit). false skips both fsyncs, for files nobody needs after a
    // machine crash (a scratch folder, a tmpfs, a run that will be restarted from scratch).
    // The rename stays atomic, so a reader or a crash of this process still sees a complete
    // old or new file; but after a power loss or kernel crash the new name may hold
    // incomplete data, and retention may already have deleted the older checkpoints.
    bool sync = true;
    // Linux: the writer thread (CRC, write, fsync) runs at this nice value so that training
    // threads win the CPU when both want it; the staging copy keeps normal priority.
    int writer_nice = 10;
};

// Where a request's records land in the file (and in its staging image, which mirrors the
// file byte for byte): offsets of each Record's payload, and the sizes to provide.
struct ArchiveLayout {
    // One per SaveRequest::records entry (or per record of every archive, in order), from
    // the file's start.
    std::vector<uint64_t> record_offsets;
    std::vector<uint64_t> archive_offsets;  // where each archive starts (one: 0)
    std::vector<uint64_t> archive_sizes;    // and its bytes
    uint64_t file_size = 0;
    uint64_t staging_size = 0;              // file_size rounded up for aligned writes
};
QRNN_API ArchiveLayout plan_archive(const SaveRequest& request);

namespace detail {
struct PlanAccess;
}

// A request laid out once: the constructor computes where every record lands (layout()), and
// submitting the PlannedSave writes by that same layout, so a caller that needs the layout
// first (to fill its own staging image) does not have the file laid out twice. Every field
// of the request is set before planning except the staging image and its gate, which
// stage_into() sets once the layout has sized them.
class QRNN_API PlannedSave {
public:
    // Throws std::invalid_argument for what submit() refuses in a layout (record names...).
    explicit PlannedSave(SaveRequest request);
    ~PlannedSave();
    PlannedSave(PlannedSave&&) noexcept;
    PlannedSave& operator=(PlannedSave&&) noexcept;

    // Both throw std::logic_error once the save was submitted (its contents moved on).
    const SaveRequest& request() const;
    const ArchiveLayout& layout() const;
    // SaveRequest::staging, staging_capacity and gate.
    void stage_into(void* staging, uint64_t capacity, std::shared_ptr<Gate> gate = nullptr);

    struct Impl;

private:
    friend struct detail::PlanAccess;
    std::unique_ptr<Impl> impl_;
};

// A forked child inherits a CheckpointWriter but none of its threads: there submit() and
// wait_all() throw std::logic_error at once (create a new writer in the child), close() and
// the destructor return without waiting, and the parent's SaveStatus objects never finish.
class QRNN_API CheckpointWriter : detail::NonCopyable {
public:
    explicit CheckpointWriter(WriterOptions options = {});
    // Finishes every submitted save, then joins its threads.
    ~CheckpointWriter();

    // Queues a save; blocks while max_pending saves are in flight.
    std::shared_ptr<SaveStatus> submit(SaveRequest request);
    // Same, but returns nullptr instead of waiting when the queue is full.
    std::shared_ptr<SaveStatus> try_submit(SaveRequest request);
    // A save planned already: written by its layout. `planned` is consumed once queued, and
    // left as it was when these throw or try_submit returns nullptr.
    std::shared_ptr<SaveStatus> submit(PlannedSave&& planned);
    std::shared_ptr<SaveStatus> try_submit(PlannedSave&& planned);
    // Blocks until every submitted save is done (committed or failed).
    void wait_all();
    // wait_all(), then stops the threads. Later submits throw std::logic_error.
    void close();
    const WriterOptions& options() const;

    struct Impl;

private:
    friend struct detail::WriterAccess;
    std::unique_ptr<Impl> impl_;
};

// ---- Files in a checkpoint folder: one definition for the writer and its readers ----
//
// Final names: prefix + step (12 digits, zero-padded, more when larger) + suffix.
// Commit order: a commit sets the file's modification time to max(now, newest checkpoint of
// the same naming in the folder + 1 us) before its fsync and rename, so the order survives
// across processes, containers and hosts sharing the folder (times come from the writer's
// clock, never go back within a folder, and need a file system with sub-second times).
// Temporaries: "." + final name + ".tmp-" + pid + "-" + 16 hex digits of fresh randomness,
// unique per save even for a process that always has the same pid (PID 1 in a container).
// The writer holds an advisory lock (an open-file-description lock where the system has
// them, which NFSv4 honours) on its temporary until the rename, so a temporary whose lock
// can be taken belongs to nobody: remove_stale_temporaries deletes exactly those.

QRNN_API std::string checkpoint_file_name(const std::string& prefix, uint64_t step, const std::string& suffix);
// True and the step when `name` is a final name of this naming.
QRNN_API bool parse_checkpoint_name(const std::string& name, const std::string& prefix, const std::string& suffix,
                                    uint64_t* step);
QRNN_API bool is_temporary_name(const std::string& name);

struct CommittedFile {
    std::string name;       // file name in the folder
    uint64_t step = 0;
    int64_t commit_ns = 0;  // commit order key (modification time, ns since the epoch)
};
enum class CheckpointOrder { Commit, Step };
// Committed checkpoints of this naming in `folder`, oldest first (by commit, ties by step;
// or by step). A missing folder gives an empty list; other listing errors throw
// std::system_error. Reads only.
QRNN_API std::vector<CommittedFile> list_checkpoints(const std::string& folder, const std::string& prefix,
                                                     const std::string& suffix,
                                                     CheckpointOrder order = CheckpointOrder::Commit);
// The same in an open folder (e.g. CheckpointFolder::fd()).
QRNN_API std::vector<CommittedFile> list_checkpoints(int folder_fd, const std::string& prefix,
                                                     const std::string& suffix,
                                                     CheckpointOrder order = CheckpointOrder::Commit);
// Deletes the temporaries in `folder` whose writer is gone (their lock is free); returns how
// many. Never touches a temporary being written, by any process on any host. The writer
// calls it before its first save into a folder.
QRNN_API int remove_stale_temporaries(const std::string& folder);
QRNN_API int remove_stale_temporaries(int folder_fd);

// A folder opened once, by name: every later operation is relative to its descriptor and
// follows no symbolic link inside it. Final names are plain names (no '/'), never "." or
// "..". Errors throw std::system_error whose what() is one sentence naming the file.
class QRNN_API CheckpointFolder : detail::NonCopyable {
public:
    // Opens `path` (a symlink at `path` itself is followed, this once). With `create`, the
    // missing folders of `path` are made first (mode 0777 before the umask) and the parent
    // of each new one fsynced, so that they survive a crash with the files put there.
    explicit CheckpointFolder(const std::string& path, bool create = false);
    ~CheckpointFolder();
    int fd() const { return fd_; }
    const std::string& path() const { return path_; }

    // One writer per folder and prefix: takes the lock file "." + prefix + "writer.lock"
    // (an open-file-description lock, honoured across PID namespaces, containers and NFSv4
    // hosts) and writes the holder ("pid P on host H") into it. Held until unlock_writer()
    // or destruction, which delete the file; a second call is a no-op. Throws
    // std::system_error (EBUSY) naming the holder.
    void lock_writer(const std::string& prefix);
    void unlock_writer();

    // Writes `name` crash-safely: an exclusive temporary that follows no link, fsync,
    // rename over `name`, folder fsync. `sync` false skips the two fsyncs, with the
    // consequences given at WriterOptions::sync. Returns the warnings, as commit() does.
    std::vector<std::string> write_file(const std::string& name, const void* data, size_t size, unsigned mode = 0666,
                                        bool sync = true) const;
    // Makes `name` a second name of the committed file `source` (a hard link, or a copy
    // where the file system has none), by the same rules as write_file.
    std::vector<std::string> publish(const std::string& source, const std::string& name, unsigned mode = 0666,
                                     bool sync = true) const;

    // A new locked temporary for final name `name` (see the folder rules above): its
    // descriptor (the caller's to fill, then to pass to commit) and file name.
    int create_temporary(const std::string& name, unsigned mode, std::string* temporary) const;
    // Commits a filled temporary: stamps its commit order (for a Retention with a prefix or
    // suffix), fsyncs it, renames it over `name`, fsyncs the folder, then applies
    // `retention`. On a file system that cannot fsync a folder (EINVAL, EROFS, ENOTSUP)
    // retention still applies and the first such commit into the folder in this process
    // warns. `sync` false skips both fsyncs (and so that warning), as WriterOptions::sync
    // says. Closes `fd`; removes the temporary on failure. Returns the warnings.
    std::vector<std::string> commit(int fd, const std::string& temporary, const std::string& name,
                                    const Retention& retention, bool sync = true) const;

private:
    int fd_ = -1;
    int lock_fd_ = -1;
    long lock_pid_ = 0;
    std::string path_, lock_name_;
};

// Staging images: capacity allocated for an archive of `bytes` staging bytes (1/8 headroom,
// whole 2 MiB units, so a slowly growing state reallocates rarely), and the alignment
// direct I/O needs of the image's start.
QRNN_API uint64_t staging_capacity(uint64_t bytes);
constexpr uint64_t kStagingAlignment = 4096;

// Anonymous memory for a staging image: page-aligned, huge pages advised, not touched
// here, so its pages are faulted in by the (parallel) staging copy rather than zeroed first
// by the caller's thread.
class QRNN_API StagingBuffer : detail::NonCopyable {
public:
    explicit StagingBuffer(uint64_t bytes);  // throws std::bad_alloc
    ~StagingBuffer();
    uint8_t* data() const { return data_; }
    uint64_t size() const { return size_; }
    // Faults in the pages of [offset, offset + length) without changing a byte
    // (MADV_POPULATE_WRITE, or an atomic read-modify-write of each page), on `threads`
    // threads: safe while a staging copy writes into the buffer, so it can run ahead of the
    // first save on another thread. Cheaper than faulting the pages in by the copy itself.
    void populate(uint64_t offset = 0, uint64_t length = UINT64_MAX, int threads = 1) const;

private:
    uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
};

// ---- Tensors -----------------------------------------------------------------------

// A tensor to save. `storage` points at the start of its storage; the whole storage
// (`storage_bytes`, or just what the view reaches when 0) is written. Tensors with the
// same storage pointer share one stored storage, as torch.save does for views.
struct TensorRef {
    std::string name;
    ScalarType dtype = ScalarType::Float32;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;  // in elements; empty means contiguous
    const void* storage = nullptr;
    int64_t storage_offset = 0;    // in elements
    uint64_t storage_bytes = 0;
    bool requires_grad = false;
};

// The data.pkl pickle and records of a flat {name: tensor} dict as torch.save writes them.
// Throws std::invalid_argument naming the tensor on inconsistent input.
QRNN_API SaveRequest tensor_dict_request(const std::string& path, const std::vector<TensorRef>& tensors);

// Convenience: queue a {name: tensor} checkpoint on `writer`.
QRNN_API std::shared_ptr<SaveStatus> write_tensors(CheckpointWriter& writer, const std::string& path,
                                                   const std::vector<TensorRef>& tensors, Retention retention = {});

}  // namespace qrnn::checkpoint
