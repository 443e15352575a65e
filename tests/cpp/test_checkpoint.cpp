// The checkpoint writer under concurrency, for ThreadSanitizer and AddressSanitizer:
// several threads submitting to one writer, buffers changed right after staging, close()
// racing submit() and close(), wait_all() racing submits, injected write failures, and a
// forked child destroying a writer it inherited. Every file that reports ok must hold
// exactly the bytes that were submitted (the snapshot), at the offsets the plan gives.
#include <qrnn/checkpoint.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/fault_injection.hpp"  // private: the test hook
#include "test_check.hpp"

namespace ckpt = qrnn::checkpoint;

namespace {

std::string g_folder;

std::string make_folder() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/qrnn-test-checkpoint-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) {
        std::perror("mkdtemp");
        std::exit(1);
    }
    return buf.data();
}

std::vector<std::string> list_folder() {
    std::vector<std::string> names;
    if (DIR* dir = ::opendir(g_folder.c_str())) {
        while (const dirent* e = ::readdir(dir))
            if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.push_back(e->d_name);
        ::closedir(dir);
    }
    return names;
}

void remove_folder() {
    for (const auto& name : list_folder()) ::unlink((g_folder + "/" + name).c_str());
    ::rmdir(g_folder.c_str());
}

size_t temporaries() {
    size_t n = 0;
    for (const auto& name : list_folder()) n += name.find(".tmp-") != std::string::npos;
    return n;
}

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// A save of a few float32 tensors with recognisable contents (seeded by `tag`).
struct Payload {
    std::vector<std::vector<float>> tensors;
    std::vector<ckpt::TensorRef> refs;

    Payload(uint32_t tag, const std::vector<int64_t>& sizes) {
        for (size_t i = 0; i < sizes.size(); ++i) {
            std::vector<float> t(size_t(sizes[i]));
            for (size_t k = 0; k < t.size(); ++k) t[k] = float(tag) * 1000.0f + float(i) + float(k % 977) * 1e-3f;
            tensors.push_back(std::move(t));
        }
        for (size_t i = 0; i < sizes.size(); ++i) {
            ckpt::TensorRef r;
            r.name = "t" + std::to_string(i);
            r.dtype = ckpt::ScalarType::Float32;
            r.shape = {sizes[i]};
            r.storage = tensors[i].data();
            r.storage_bytes = uint64_t(sizes[i]) * 4;
            refs.push_back(r);
        }
    }
    void scribble() {  // the caller reuses its buffers once the save is staged
        for (auto& t : tensors) std::fill(t.begin(), t.end(), -1.0f);
    }
};

// The file at `path` holds `expected` record payloads at the offsets the plan gives.
bool file_matches(const std::string& path, const ckpt::SaveRequest& request,
                  const std::vector<std::vector<uint8_t>>& expected) {
    const ckpt::ArchiveLayout layout = ckpt::plan_archive(request);
    const std::vector<uint8_t> bytes = read_file(path);
    if (bytes.size() != layout.file_size) return false;
    if (bytes.size() < 4 || std::memcmp(bytes.data(), "PK\x03\x04", 4) != 0) return false;
    for (size_t i = 0; i < expected.size(); ++i) {
        const uint64_t off = layout.record_offsets[i];
        if (off + expected[i].size() > bytes.size()) return false;
        if (std::memcmp(bytes.data() + off, expected[i].data(), expected[i].size()) != 0) return false;
    }
    return true;
}

std::vector<std::vector<uint8_t>> snapshot(const ckpt::SaveRequest& request) {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& r : request.records) {
        const auto* p = static_cast<const uint8_t*>(r.data);
        out.emplace_back(p, p + r.size);
    }
    return out;
}

// Runs body(0) ... body(n - 1) on n threads at once; returns when all are done.
template <typename Body>
void on_threads(int n, const Body& body) {
    std::vector<std::thread> threads;
    for (int t = 0; t < n; ++t) threads.emplace_back([&body, t] { body(t); });
    for (auto& th : threads) th.join();
}

ckpt::WriterOptions test_options(int max_pending, int copy_threads) {
    ckpt::WriterOptions o;
    o.max_pending = max_pending;
    o.copy_threads = copy_threads;
    o.sync = false;  // durability is not under test here; speed is
    return o;
}

// ---- tests -------------------------------------------------------------------------------

void crc32_known_values() {
    CHECK(ckpt::crc32("", 0) == 0);
    CHECK(ckpt::crc32("123456789", 9) == 0xCBF43926u);  // the standard check value
    std::vector<uint8_t> big(100003);
    for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 7 + 3);
    const uint32_t whole = ckpt::crc32(big.data(), big.size());
    const uint32_t parts = ckpt::crc32(big.data() + 5000, big.size() - 5000, ckpt::crc32(big.data(), 5000));
    CHECK(whole == parts);
}

// Several threads share one writer; each waits for staging, then overwrites its buffers.
void concurrent_saves() {
    qrnn_test::Context ctx("concurrent saves");
    ckpt::CheckpointWriter writer(test_options(2, 3));
    const int n_threads = 4, saves_each = 4;
    std::atomic<int> bad{0};
    on_threads(n_threads, [&](int t) {
        for (int s = 0; s < saves_each; ++s) {
            // One large tensor (> the 4 MiB parallel-copy share) now and then.
            Payload p(uint32_t(t * 100 + s),
                      s == 1 ? std::vector<int64_t>{3, (5 << 20) / 4, 17} : std::vector<int64_t>{1, 1000, 33});
            const std::string path = g_folder + "/c" + std::to_string(t) + "-" + std::to_string(s) + ".pt";
            ckpt::SaveRequest req = ckpt::tensor_dict_request(path, p.refs);
            const auto expected = snapshot(req);
            auto status = writer.submit(req);
            status->wait_staged();
            p.scribble();
            if (!status->wait_for(120) || !status->ok() || !file_matches(path, req, expected)) ++bad;
        }
    });
    writer.close();
    CHECK(bad == 0);
    CHECK(temporaries() == 0);
}

// Many saves to the same final name from several threads: the last rename wins, and
// whatever is there is one complete, consistent file.
void same_path_overwrites() {
    qrnn_test::Context ctx("saves to one path");
    ckpt::CheckpointWriter writer(test_options(3, 2));
    const std::string path = g_folder + "/same.pt";
    std::atomic<int> failed{0};
    on_threads(3, [&](int t) {
        for (int s = 0; s < 3; ++s) {
            Payload p(uint32_t(t * 10 + s), {64, 5});
            auto status = writer.submit(ckpt::tensor_dict_request(path, p.refs));
            if (!status->wait_for(120) || !status->ok()) ++failed;
        }
    });
    writer.wait_all();
    CHECK(failed == 0);
    const auto bytes = read_file(path);
    CHECK(bytes.size() > 4 && std::memcmp(bytes.data(), "PK\x03\x04", 4) == 0);
    CHECK(temporaries() == 0);
}

// close() while other threads keep submitting: each submit either returns a status that
// finishes (ok, with the right bytes) or throws std::logic_error. Nothing hangs.
void close_races_submit() {
    for (int round = 0; round < 6; ++round) {
        qrnn_test::Context ctx("close racing submit, round " + std::to_string(round));
        auto writer = std::make_unique<ckpt::CheckpointWriter>(test_options(2, 2));
        std::atomic<int> lost{0}, wrong{0}, refused{0}, other_error{0};
        std::atomic<bool> go{false};
        std::vector<std::thread> threads;
        for (int t = 0; t < 3; ++t)
            threads.emplace_back([&, t] {
                while (!go) std::this_thread::yield();
                for (int s = 0; s < 20; ++s) {
                    Payload p(uint32_t(round * 1000 + t * 100 + s), {256, 3});
                    const std::string path = g_folder + "/r" + std::to_string(round) + "-" + std::to_string(t) + "-" +
                                             std::to_string(s) + ".pt";
                    ckpt::SaveRequest req = ckpt::tensor_dict_request(path, p.refs);
                    const auto expected = snapshot(req);
                    std::shared_ptr<ckpt::SaveStatus> status;
                    try {
                        status = writer->submit(req);
                    } catch (const std::logic_error&) {
                        ++refused;
                        return;
                    } catch (...) {
                        ++other_error;
                        return;
                    }
                    if (!status->wait_for(60)) {
                        ++lost;  // accepted but never finished: the submitter would hang
                        return;
                    }
                    if (!status->ok() || !file_matches(path, req, expected)) ++wrong;
                }
            });
        std::thread closer([&] {
            while (!go) std::this_thread::yield();
            std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
            writer->close();
        });
        go = true;
        closer.join();
        for (auto& th : threads) th.join();
        writer->close();  // idempotent
        writer.reset();
        CHECK(lost == 0);
        CHECK(wrong == 0);
        CHECK(other_error == 0);
        CHECK(temporaries() == 0);
    }
}

// close() from several threads at once, and wait_all() racing submits.
void concurrent_close_and_wait_all() {
    qrnn_test::Context ctx("concurrent close / wait_all");
    ckpt::CheckpointWriter writer(test_options(2, 2));
    std::vector<std::shared_ptr<ckpt::SaveStatus>> statuses;
    std::vector<Payload> payloads;
    for (int s = 0; s < 4; ++s) payloads.emplace_back(uint32_t(s), std::vector<int64_t>{512});
    std::thread submitter([&] {
        for (int s = 0; s < 4; ++s)
            statuses.push_back(writer.submit(
                ckpt::tensor_dict_request(g_folder + "/w" + std::to_string(s) + ".pt", payloads[size_t(s)].refs)));
    });
    std::thread waiter([&] {
        for (int i = 0; i < 20; ++i) writer.wait_all();
    });
    submitter.join();
    waiter.join();
    std::vector<std::thread> closers;
    for (int c = 0; c < 3; ++c) closers.emplace_back([&] { writer.close(); });
    for (auto& th : closers) th.join();
    for (const auto& s : statuses) CHECK(s->done() && s->ok());
    bool refused = false;
    try {
        writer.submit(ckpt::tensor_dict_request(g_folder + "/late.pt", payloads[0].refs));
    } catch (const std::logic_error&) {
        refused = true;
    }
    CHECK(refused);
}

// A failing disk (injected) fails that save through its status, leaves no temporary file,
// and the writer keeps working for the next one... of a healthy writer.
void injected_failures() {
    for (bool throw_exception : {false, true}) {
        qrnn_test::Context ctx(throw_exception ? "exception in the writer thread" : "ENOSPC on write");
        ckpt::testing::FaultInjection fault;
        fault.fail_after_bytes = 1000;
        fault.error_number = ENOSPC;
        fault.throw_exception = throw_exception;
        const auto faulty = ckpt::testing::writer_with_faults(test_options(1, 2), fault);
        ckpt::CheckpointWriter& writer = *faulty;
        Payload p(7, {100000});
        const std::string path = g_folder + "/fail.pt";
        std::vector<std::shared_ptr<ckpt::SaveStatus>> statuses;
        std::mutex m;
        on_threads(2, [&](int) {
            auto s = writer.submit(ckpt::tensor_dict_request(path, p.refs));
            std::lock_guard<std::mutex> lock(m);
            statuses.push_back(s);
        });
        writer.close();
        for (const auto& s : statuses) {
            CHECK(s->done() && !s->ok());
            const ckpt::SaveError e = s->error();
            CHECK(!e.message.empty());
            if (!throw_exception) CHECK(e.error_number == ENOSPC);
        }
        CHECK(::access(path.c_str(), F_OK) != 0);
        CHECK(temporaries() == 0);
    }
}

// Bad requests throw std::invalid_argument from submit() and leave the writer usable.
void invalid_requests() {
    qrnn_test::Context ctx("invalid requests");
    ckpt::CheckpointWriter writer(test_options(1, 1));
    ckpt::SaveRequest no_data;
    no_data.path = g_folder + "/bad.pt";
    no_data.records.push_back({"data/0", nullptr, 16});
    CHECK_THROWS(writer.submit(no_data), std::invalid_argument, "data/0");
    ckpt::SaveRequest bad_keep = ckpt::tensor_dict_request(g_folder + "/bad.pt", Payload(1, {4}).refs);
    bad_keep.retention.keep_last = -1;
    CHECK_THROWS(writer.submit(bad_keep), std::invalid_argument, "keep_last");
    CHECK_THROWS(ckpt::CheckpointWriter(test_options(0, 1)), std::invalid_argument, "max_pending");
    CHECK_THROWS(ckpt::CheckpointWriter(test_options(1, 0)), std::invalid_argument, "copy_threads");
    // Still usable: the refused requests did not take a queue slot.
    Payload p(3, {10});
    auto status = writer.submit(ckpt::tensor_dict_request(g_folder + "/after-bad.pt", p.refs));
    CHECK(status->wait_for(60) && status->ok());
}

// A forked child (e.g. a data-loader worker) that destroys the writer it inherited must
// neither hang nor abort: the writer's threads exist only in the parent.
void fork_child_destroys_writer() {
    qrnn_test::Context ctx("fork");
    auto writer = std::make_unique<ckpt::CheckpointWriter>(test_options(1, 2));
    Payload p(5, {100});
    writer->submit(ckpt::tensor_dict_request(g_folder + "/before-fork.pt", p.refs))->wait();
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
        int code = 0;
        try {  // no threads here: a submit must refuse at once, not queue forever
            writer->submit(ckpt::tensor_dict_request(g_folder + "/in-child.pt", p.refs));
            code = 3;
        } catch (const std::logic_error&) {
        }
        writer.reset();
        std::_Exit(code);
    }
    int status = 0;
    bool exited = false;
    for (int i = 0; i < 600 && !exited; ++i) {  // at most 60 s
        if (::waitpid(pid, &status, WNOHANG) == pid)
            exited = true;
        else
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!exited) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
    }
    CHECK_MSG(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "child destroying an inherited writer: " + std::string(exited ? "" : "hung, ") +
                  (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                       : "exit status " + std::to_string(WEXITSTATUS(status))));
    // The parent's writer still works.
    auto again = writer->submit(ckpt::tensor_dict_request(g_folder + "/after-fork.pt", p.refs));
    CHECK(again->wait_for(60) && again->ok());
}

// Names, temporaries and staging sizes: the rules Python takes from here.
void folder_rules() {
    qrnn_test::Context ctx("folder rules");
    CHECK(ckpt::checkpoint_file_name("ckpt-", 42, ".pt") == "ckpt-000000000042.pt");
    CHECK(ckpt::checkpoint_file_name("s", 1234567890123456ull, "") == "s1234567890123456");
    uint64_t step = 0;
    CHECK(ckpt::parse_checkpoint_name("ckpt-000000000042.pt", "ckpt-", ".pt", &step) && step == 42);
    CHECK(!ckpt::parse_checkpoint_name("ckpt-.pt", "ckpt-", ".pt", &step));
    CHECK(!ckpt::parse_checkpoint_name("ckpt-12a.pt", "ckpt-", ".pt", &step));
    CHECK(ckpt::is_temporary_name(".ckpt-000000000001.pt.tmp-1-0123456789abcdef"));
    CHECK(!ckpt::is_temporary_name("ckpt-000000000001.pt"));
    CHECK(!ckpt::is_temporary_name(".ckpt-000000000001.pt.tmp-1-0123"));
    CHECK(!ckpt::is_temporary_name(".x.tmp--0123456789abcdef"));
    CHECK(ckpt::staging_capacity(0) == (2u << 20));
    CHECK(ckpt::staging_capacity(100u << 20) >= (112u << 20) && ckpt::staging_capacity(100u << 20) % (2u << 20) == 0);
    ckpt::StagingBuffer buffer(4u << 20);
    CHECK(reinterpret_cast<uintptr_t>(buffer.data()) % ckpt::kStagingAlignment == 0 && buffer.size() == (4u << 20));
    buffer.data()[buffer.size() - 1] = 1;
    buffer.data()[12345] = 7;
    std::thread copier([&] { std::memset(buffer.data() + (1u << 20), 3, 1u << 20); });
    buffer.populate();  // changes no byte, even beside a writer
    copier.join();
    CHECK(buffer.data()[12345] == 7 && buffer.data()[buffer.size() - 1] == 1 && buffer.data()[0] == 0);
    CHECK(buffer.data()[(1u << 20) + 5] == 3 && buffer.data()[(2u << 20) + 5] == 0);
}

// A temporary is removed only once nobody holds its lock; other files are never touched.
void stale_temporaries() {
    qrnn_test::Context ctx("stale temporaries");
    const std::string name = ".owned.pt.tmp-999999-0123456789abcdef";
    const std::string path = g_folder + "/" + name;
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
#ifdef F_OFD_SETLK
    struct flock range;
    std::memset(&range, 0, sizeof range);
    range.l_type = F_WRLCK;
    CHECK(::fcntl(fd, F_OFD_SETLK, &range) == 0);
    CHECK(ckpt::remove_stale_temporaries(g_folder) == 0);  // its writer (this descriptor) is alive
    CHECK(::access(path.c_str(), F_OK) == 0);
#endif
    ::close(fd);
    const std::string other = g_folder + "/.not-a-temporary.tmp-1-xyz";
    ::close(::open(other.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    CHECK(ckpt::remove_stale_temporaries(g_folder) == 1);
    CHECK(::access(path.c_str(), F_OK) != 0 && ::access(other.c_str(), F_OK) == 0);
    ::unlink(other.c_str());
}

// Retention and listing follow the commit order, not the step.
void commit_order() {
    qrnn_test::Context ctx("commit order");
    const std::string folder = g_folder + "/order";
    ::mkdir(folder.c_str(), 0755);
    ckpt::CheckpointWriter writer(test_options(1, 1));
    Payload p(9, {64});
    for (const uint64_t step : {9u, 5u, 3u}) {
        auto status = ckpt::write_tensors(writer, folder + "/" + ckpt::checkpoint_file_name("c-", step, ".pt"), p.refs,
                                          {2, "c-", ".pt"});
        CHECK(status->wait_for(60) && status->ok());
    }
    auto by_commit = ckpt::list_checkpoints(folder, "c-", ".pt");
    auto by_step = ckpt::list_checkpoints(folder, "c-", ".pt", ckpt::CheckpointOrder::Step);
    CHECK(by_commit.size() == 2 && by_commit[0].step == 5 && by_commit[1].step == 3);
    CHECK(by_commit.size() == 2 && by_commit[0].commit_ns < by_commit[1].commit_ns);
    CHECK(by_step.size() == 2 && by_step[0].step == 3 && by_step[1].step == 5);
    CHECK(ckpt::list_checkpoints(folder + "/missing", "c-", ".pt").empty());
    for (const auto& f : by_commit) ::unlink((folder + "/" + f.name).c_str());
    ::rmdir(folder.c_str());
}

// A folder opened once: saves through it land there after the name is swapped for a
// link; the writer lock names its holder; write_file and publish replace planted links;
// a folder fsync the file system refuses still deletes old checkpoints, and warns once.
void opened_folder() {
    qrnn_test::Context ctx("opened folder");
    const std::string folder = g_folder + "/opened/run", moved = g_folder + "/opened/moved";
    const std::string other = g_folder + "/opened/other", target = g_folder + "/opened/target";
    auto opened = std::make_shared<ckpt::CheckpointFolder>(folder, true);  // parents made too
    CHECK(::mkdir(other.c_str(), 0755) == 0);
    ::close(::open((other + "/c-000000000100.pt").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    CHECK(::rename(folder.c_str(), moved.c_str()) == 0 && ::symlink(other.c_str(), folder.c_str()) == 0);
    ckpt::CheckpointWriter writer(test_options(1, 1));
    Payload p(3, {64});
    for (const uint64_t step : {1u, 2u}) {
        ckpt::SaveRequest request =
            ckpt::tensor_dict_request(folder + "/" + ckpt::checkpoint_file_name("c-", step, ".pt"), p.refs);
        request.retention = {1, "c-", ".pt"};
        request.folder = opened;
        request.file_mode = 0600;
        auto status = writer.submit(std::move(request));
        CHECK(status->wait_for(60) && status->ok());
    }
    auto mine = ckpt::list_checkpoints(opened->fd(), "c-", ".pt");
    CHECK(mine.size() == 1 && mine[0].step == 2);
    CHECK(ckpt::list_checkpoints(other, "c-", ".pt").size() == 1);  // retention stayed out of it
    struct stat st;
    CHECK(::stat((moved + "/c-000000000002.pt").c_str(), &st) == 0 && (st.st_mode & 0077) == 0);

    opened->lock_writer("c-");
    bool refused = false;
    try {
        ckpt::CheckpointFolder(moved).lock_writer("c-");
    } catch (const std::system_error& e) {
        refused = e.code().value() == EBUSY &&
                  std::string(e.what()).find("pid " + std::to_string(::getpid())) != std::string::npos;
    }
    CHECK(refused);
    ckpt::CheckpointFolder(moved).lock_writer("d-");  // another prefix: another writer

    ::close(::open(target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    CHECK(::symlink(target.c_str(), (moved + "/metrics.jsonl").c_str()) == 0);
    CHECK(::symlink(target.c_str(), (moved + "/best.pt").c_str()) == 0);
    opened->write_file("metrics.jsonl", "{}\n", 3);
    opened->publish("c-000000000002.pt", "best.pt");
    CHECK(::lstat((moved + "/metrics.jsonl").c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 3);
    CHECK(::lstat((moved + "/best.pt").c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 2);
    CHECK(::stat(target.c_str(), &st) == 0 && st.st_size == 0);
    opened->unlock_writer();
    CHECK(::access((moved + "/.c-writer.lock").c_str(), F_OK) != 0);

    ckpt::testing::FaultInjection refuse;
    refuse.folder_sync_errno = EINVAL;
    ckpt::WriterOptions durable = test_options(1, 1);
    durable.sync = true;  // the folder fsync is what is under test
    auto faulty = ckpt::testing::writer_with_faults(durable, refuse);
    for (const uint64_t step : {3u, 4u}) {
        ckpt::SaveRequest request =
            ckpt::tensor_dict_request(moved + "/" + ckpt::checkpoint_file_name("c-", step, ".pt"), p.refs);
        request.retention = {1, "c-", ".pt"};
        auto status = faulty->submit(std::move(request));
        CHECK(status->wait_for(60) && status->ok() && status->warnings().size() == (step == 3 ? 1u : 0u));
        auto kept = ckpt::list_checkpoints(moved, "c-", ".pt");
        CHECK(kept.size() == 1 && kept[0].step == step);  // retention goes on
    }
    faulty->close();
    for (const char* name : {"c-000000000004.pt", "metrics.jsonl", "best.pt"}) ::unlink((moved + "/" + name).c_str());
    ::unlink((other + "/c-000000000100.pt").c_str());
    ::unlink(folder.c_str());
    ::unlink(target.c_str());
    ::rmdir(moved.c_str());
    ::rmdir(other.c_str());
    ::rmdir((g_folder + "/opened").c_str());
}

// A file of several archives and a raw part (torch.distributed.checkpoint's layout): each
// archive complete at its offset, the raw part's bytes one after another, one commit; the
// caller's buffers may change once staged.
void multi_archive_files() {
    qrnn_test::Context ctx("multi-archive files");
    ckpt::CheckpointWriter writer(test_options(1, 2));
    Payload a(1, {10}), b(2, {7});
    std::vector<uint8_t> raw1 = {1, 2, 3}, raw2 = {9, 8, 7, 6, 5};
    ckpt::SaveRequest request;
    request.path = g_folder + "/__0_0.distcp";
    const ckpt::SaveRequest first = ckpt::tensor_dict_request("archive", a.refs);
    const ckpt::SaveRequest second = ckpt::tensor_dict_request("archive", b.refs);
    request.archives.push_back({"archive", first.pickle, first.records, false});
    request.archives.push_back({"archive", second.pickle, second.records, false});
    request.archives.push_back(
        {"archive", "", {{"a", raw1.data(), raw1.size()}, {"b", raw2.data(), raw2.size()}}, true});
    std::vector<std::vector<uint8_t>> expected;
    for (const auto& part : request.archives)
        for (const auto& r : part.records)
            expected.emplace_back(static_cast<const uint8_t*>(r.data), static_cast<const uint8_t*>(r.data) + r.size);
    const ckpt::ArchiveLayout layout = ckpt::plan_archive(request);
    CHECK(layout.archive_offsets.size() == 3 && layout.archive_sizes.size() == 3);
    CHECK(layout.archive_offsets[0] == 0);
    for (size_t k = 1; k < 3; ++k)
        CHECK(layout.archive_offsets[k] == layout.archive_offsets[k - 1] + layout.archive_sizes[k - 1]);
    CHECK(layout.archive_sizes[2] == raw1.size() + raw2.size());
    CHECK(layout.file_size == layout.archive_offsets[2] + layout.archive_sizes[2]);
    CHECK(layout.record_offsets.size() == expected.size());
    auto status = writer.submit(request);
    status->wait_staged();
    a.scribble();
    b.scribble();
    std::fill(raw1.begin(), raw1.end(), 0);
    CHECK(status->wait_for(60) && status->ok());
    const std::vector<uint8_t> bytes = read_file(request.path);
    CHECK(bytes.size() == layout.file_size);
    for (size_t i = 0; i < expected.size() && bytes.size() == layout.file_size; ++i)
        CHECK(std::memcmp(bytes.data() + layout.record_offsets[i], expected[i].data(), expected[i].size()) == 0);
    for (size_t k = 0; k < 2 && bytes.size() == layout.file_size; ++k) {  // each archive starts and ends as a zip
        const uint8_t* start = bytes.data() + layout.archive_offsets[k];
        CHECK(std::memcmp(start, "PK\x03\x04", 4) == 0);
        CHECK(std::memcmp(start + layout.archive_sizes[k] - 22, "PK\x05\x06", 4) == 0);
    }
    ckpt::SaveRequest both = request;
    both.pickle = "x";
    CHECK_THROWS(writer.submit(both), std::invalid_argument, "no pickle or records");
    ckpt::SaveRequest raw_pickle = request;
    raw_pickle.archives[2].pickle = "x";
    CHECK_THROWS(writer.submit(raw_pickle), std::invalid_argument, "raw");
    ::unlink(request.path.c_str());
}

// A PlannedSave is laid out once and written by that layout: the same bytes as submit(request),
// also when the caller stages a record itself at the planned offset; a refused or failed
// submit leaves the plan usable, a queued one uses it up.
void planned_saves() {
    qrnn_test::Context ctx("planned saves");
    ckpt::CheckpointWriter writer(test_options(1, 2));
    Payload p(3, {100, 33});
    const ckpt::SaveRequest request = ckpt::tensor_dict_request(g_folder + "/planned.pt", p.refs);
    auto direct = writer.submit(request);
    CHECK(direct->wait_for(60) && direct->ok());
    const std::vector<uint8_t> expected = read_file(request.path);

    ckpt::PlannedSave planned(request);
    CHECK(planned.layout().file_size == expected.size());
    CHECK(planned.layout().record_offsets == ckpt::plan_archive(request).record_offsets);
    auto status = writer.submit(std::move(planned));
    CHECK(status->wait_for(60) && status->ok());
    CHECK(read_file(request.path) == expected);
    CHECK_THROWS(planned.layout(), std::logic_error, "submitted already");

    // The second record's bytes staged by the caller, behind a gate.
    ckpt::SaveRequest staged = request;
    staged.records[1].data = nullptr;
    ckpt::PlannedSave by_caller(staged);
    CHECK_THROWS(writer.submit(std::move(by_caller)), std::invalid_argument, "has no data");
    const ckpt::ArchiveLayout layout = by_caller.layout();  // still planned
    std::vector<uint8_t> image(layout.staging_size + ckpt::kStagingAlignment);
    auto gate = std::make_shared<ckpt::Gate>();
    by_caller.stage_into(image.data(), image.size(), gate);
    auto gated = writer.submit(std::move(by_caller));
    ckpt::PlannedSave next(request);
    CHECK(writer.try_submit(std::move(next)) == nullptr);  // the gated save holds the only slot
    CHECK(next.layout().file_size == expected.size());
    std::memcpy(image.data() + layout.record_offsets[1], p.tensors[1].data(), p.tensors[1].size() * 4);
    gate->open();
    CHECK(gated->wait_for(60) && gated->ok());
    CHECK(read_file(request.path) == expected);
    auto last = writer.submit(std::move(next));
    CHECK(last->wait_for(60) && last->ok());
    CHECK(read_file(request.path) == expected);
    ::unlink(request.path.c_str());
}

}  // namespace

int main() {
    g_folder = make_folder();
    crc32_known_values();
    concurrent_saves();
    same_path_overwrites();
    close_races_submit();
    concurrent_close_and_wait_all();
    injected_failures();
    invalid_requests();
    fork_child_destroys_writer();
    folder_rules();
    stale_temporaries();
    commit_order();
    opened_folder();
    multi_archive_files();
    planned_saves();
    remove_folder();
    return qrnn_test::result("test_checkpoint");
}
