// Files in a checkpoint folder: names, listing in commit order, deleting old checkpoints,
// and removing the temporaries of writers that are gone.
#include "checkpoint/retention.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <random>
#include <system_error>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/system.hpp"

namespace qrnn::checkpoint {

namespace {

constexpr int64_t kCommitStepNs = 1000;  // commit order survives microsecond timestamps
const char* const kTemporaryMark = ".tmp-";

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

int64_t modification_ns(const struct stat& st) {
#ifdef __APPLE__
    return int64_t(st.st_mtimespec.tv_sec) * 1000000000 + st.st_mtimespec.tv_nsec;
#else
    return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
#endif
}

}  // namespace

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
        const uint64_t digit = uint64_t(c - '0');
        if (v > (UINT64_MAX - digit) / 10) return false;  // exact: every uint64_t step parses
        v = v * 10 + digit;
    }
    *step = v;
    return true;
}

bool is_temporary_name(const std::string& name) {
    const size_t mark = name.rfind(kTemporaryMark);
    if (name.size() < 2 || name[0] != '.' || mark == std::string::npos || mark < 2) return false;
    size_t i = mark + std::char_traits<char>::length(kTemporaryMark), digits = 0;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) ++digits;
    if (digits == 0 || i >= name.size() || name[i] != '-') return false;
    const std::string hex = name.substr(i + 1);
    if (hex.size() != 16) return false;
    for (const char c : hex)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    return true;
}

namespace {

// A fresh open file description of the folder: its own directory offset, so that listings on
// several threads never share one.
DIR* open_listing(int folder_fd) {
    int fd;
    do {
        fd = ::openat(folder_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return nullptr;
    DIR* dir = ::fdopendir(fd);
    if (!dir) ::close(fd);
    return dir;
}

}  // namespace

std::vector<CommittedFile> list_checkpoints(const std::string& folder, const std::string& prefix,
                                            const std::string& suffix, CheckpointOrder order) {
    const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return {};
        throw std::system_error(errno, std::generic_category(), "list checkpoints in '" + folder + "'");
    }
    try {
        auto found = list_checkpoints(fd, prefix, suffix, order);
        ::close(fd);
        return found;
    } catch (const std::system_error& e) {
        ::close(fd);
        throw std::system_error(e.code(), "list checkpoints in '" + folder + "'");
    }
}

namespace {

// One pass over the folder: the checkpoints of this naming, unsorted. `*raced` is set when a
// name the pass read was gone before it could be examined (a writer's retention deleted it).
std::vector<CommittedFile> scan_checkpoints(int folder_fd, const std::string& prefix, const std::string& suffix,
                                            bool* raced) {
    std::vector<CommittedFile> found;
    DIR* dir = open_listing(folder_fd);
    if (!dir) throw std::system_error(errno, std::generic_category(), "list checkpoints");
    while (const dirent* entry = ::readdir(dir)) {
        CommittedFile f;
        f.name = entry->d_name;
        if (!parse_checkpoint_name(f.name, prefix, suffix, &f.step)) continue;
        struct stat st;  // a symlink under a checkpoint's name is no checkpoint
        if (::fstatat(folder_fd, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) *raced = true;
            continue;
        }
        if (!S_ISREG(st.st_mode)) continue;
        f.commit_ns = modification_ns(st);
        found.push_back(std::move(f));
    }
    ::closedir(dir);
    return found;
}

}  // namespace

std::vector<CommittedFile> list_checkpoints(int folder_fd, const std::string& prefix, const std::string& suffix,
                                            CheckpointOrder order) {
    // A writer commits by renaming the new file in, then deleting the oldest. A pass that
    // read the old name but not the new one (renamed in after readdir returned, or where
    // readdir had already been) and examined the old one after its delete saw neither: with
    // keep_last=1, an empty folder. Such a pass is repeated: the next one starts after the
    // rename, so only another commit racing it can fool it too. An empty result always gets
    // a second pass, since a pass can also miss both files without noticing (the old name
    // deleted before readdir reached it).
    constexpr int kPasses = 8;
    std::vector<CommittedFile> found;
    for (int pass = 1; pass <= kPasses; ++pass) {
        bool raced = false;
        found = scan_checkpoints(folder_fd, prefix, suffix, &raced);
        if (!raced && (!found.empty() || pass >= 2)) break;
    }
    const bool by_commit = order == CheckpointOrder::Commit;
    std::sort(found.begin(), found.end(), [by_commit](const CommittedFile& a, const CommittedFile& b) {
        if (by_commit) return a.commit_ns != b.commit_ns ? a.commit_ns < b.commit_ns : a.step < b.step;
        return a.step != b.step ? a.step < b.step : a.commit_ns < b.commit_ns;
    });
    return found;
}

int remove_stale_temporaries(const std::string& folder) {
    const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return 0;
    const int removed = remove_stale_temporaries(fd);
    ::close(fd);
    return removed;
}

int remove_stale_temporaries(int dfd) {
    DIR* dir = open_listing(dfd);
    if (!dir) return 0;
    std::vector<std::string> names;
    while (const dirent* entry = ::readdir(dir))
        if (is_temporary_name(entry->d_name)) names.emplace_back(entry->d_name);
    ::closedir(dir);
    int removed = 0;
    for (const std::string& name : names) {
        const int fd = ::openat(dfd, name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        // The lock is free only when its writer is gone (or has not locked yet: it then sees
        // the file unlinked and starts over). Any doubt (no lock support): keep the file.
        struct stat held, named;
        if (detail::lock_file(fd, false) == 0 && ::fstat(fd, &held) == 0 && S_ISREG(held.st_mode) &&
            held.st_nlink > 0 && ::fstatat(dfd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
            named.st_ino == held.st_ino && named.st_dev == held.st_dev && ::unlinkat(dfd, name.c_str(), 0) == 0)
            ++removed;
        ::close(fd);
    }
    return removed;
}

namespace detail {

std::string temporary_name(const std::string& final_name) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(random64()));
    return "." + final_name + kTemporaryMark + std::to_string(::getpid()) + "-" + hex;
}

int64_t next_commit_ns(int folder_fd, const Retention& naming) {
    int64_t t = realtime_ns();
    if (naming.prefix.empty() && naming.suffix.empty()) return t;
    try {
        for (const CommittedFile& f : list_checkpoints(folder_fd, naming.prefix, naming.suffix))
            t = std::max(t, f.commit_ns + kCommitStepNs);
    } catch (const std::system_error&) {
    }
    return t;
}

void apply_retention(int folder_fd, const std::string& folder, const std::string& committed, const Retention& keep,
                     std::vector<std::string>& warnings) {
    if (keep.keep_last <= 0) return;
    std::vector<CommittedFile> found;
    try {
        found = list_checkpoints(folder_fd, keep.prefix, keep.suffix, CheckpointOrder::Commit);
    } catch (const std::system_error& e) {
        warnings.push_back("could not list '" + folder + "' to delete old checkpoints: " + e.code().message());
        return;
    }
    // Oldest commits first: everything before the last keep_last goes.
    const size_t excess = found.size() > size_t(keep.keep_last) ? found.size() - size_t(keep.keep_last) : 0;
    for (size_t i = 0; i < excess; ++i) {
        if (found[i].name == committed) continue;
        const std::string path = folder + "/" + found[i].name;
        if (::unlinkat(folder_fd, found[i].name.c_str(), 0) != 0 && errno != ENOENT)
            warnings.push_back("could not delete old checkpoint '" + path + "': " + errno_text(errno));
    }
}

}  // namespace detail
}  // namespace qrnn::checkpoint
