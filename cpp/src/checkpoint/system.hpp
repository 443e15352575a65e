// The few system calls that the file code (posix_file) and the folder rules (retention) both
// need, kept here so that posix_file depends on retention and retention on this, never back.
#pragma once

#include <cstdint>
#include <string>

namespace qrnn::checkpoint::detail {

// strerror_r's text for `code`, whichever variant (GNU or XSI) the C library has.
std::string errno_text(int code);

// Exclusive advisory lock on the whole file (blocking or not); 0 or the errno.
int lock_file(int fd, bool wait);

// CLOCK_REALTIME in ns since the epoch: the commit order's clock.
int64_t realtime_ns();

}  // namespace qrnn::checkpoint::detail
