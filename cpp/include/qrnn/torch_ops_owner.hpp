// Who registered the qrnn:: operators with PyTorch's dispatcher in this process: the
// Python package (`import qrnn`, torch.library.custom_op) or the C++ torch library
// (libqrnn_torch, for programs without Python). Both load this one core library, so the
// first to claim the operators owns them and the other leaves them alone, without asking
// the dispatcher (its C API cannot look a schema up).
#pragma once

#include "qrnn/dtype.hpp"

namespace qrnn {

enum class TorchOpsOwner : int { none = 0, python = 1, torch_library = 2 };

// Claims the operators for `owner` when nobody has; returns the owner before the call
// (TorchOpsOwner::none: the caller now owns them and registers them). Thread-safe.
QRNN_API TorchOpsOwner claim_torch_ops(TorchOpsOwner owner);

}  // namespace qrnn
