// Files in a checkpoint folder, as the writer sees them: fresh temporary names, the commit
// order of a new file, and deleting old checkpoints after a commit. The public folder rules
// (final names, listing, stale temporaries) are declared in <qrnn/checkpoint.hpp>.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qrnn/checkpoint.hpp"

namespace qrnn::checkpoint::detail {

// A fresh temporary name for `final_name`: "." + final_name + ".tmp-" + pid + "-" + 16 hex
// digits of randomness (the same pid recurs after a container restart, and across hosts).
std::string temporary_name(const std::string& final_name);

// Commit order of a new file: after every checkpoint of its naming already in the folder.
int64_t next_commit_ns(int folder_fd, const Retention& naming);

// After `committed` is in place and durable: deletes the checkpoints of the open folder beyond
// the keep_last most recent (`folder` names it in messages). Problems are appended to
// `warnings`, never thrown.
void apply_retention(int folder_fd, const std::string& folder, const std::string& committed, const Retention& keep,
                     std::vector<std::string>& warnings);

}  // namespace qrnn::checkpoint::detail
