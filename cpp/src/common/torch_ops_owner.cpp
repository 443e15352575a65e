#include "qrnn/torch_ops_owner.hpp"

#include <atomic>

namespace qrnn {

TorchOpsOwner claim_torch_ops(TorchOpsOwner owner) {
    static std::atomic<int> current{static_cast<int>(TorchOpsOwner::none)};
    int expected = static_cast<int>(TorchOpsOwner::none);
    current.compare_exchange_strong(expected, static_cast<int>(owner));
    return static_cast<TorchOpsOwner>(expected);
}

}  // namespace qrnn
