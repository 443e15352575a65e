// The system calls posix_file and retention share (see checkpoint/system.hpp).
#include "checkpoint/system.hpp"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <type_traits>

#include <fcntl.h>
#include <sys/file.h>

namespace qrnn::checkpoint::detail {

std::string errno_text(int code) {
    char buf[256] = {0};
    // GNU strerror_r returns a pointer, XSI an int: handle both.
    auto pick = [&](auto r) -> std::string {
        if constexpr (std::is_same_v<decltype(r), int>)
            return r == 0 ? std::string(buf) : "unknown error";
        else
            return std::string(r ? r : "unknown error");
    };
    return pick(strerror_r(code, buf, sizeof buf));
}

// Open-file-description locks where available (they conflict between two descriptors of
// one process too, and NFSv4 carries them to the server), flock() elsewhere.
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

}  // namespace qrnn::checkpoint::detail
