// Prints the texts of the CUDA launchers' first-use checks (cuda/common/runtime_checks.hpp) for
// the versions given on the command line, so tests check them without a GPU:
//   runtime_messages driver DRIVER_VERSION RUNTIME_VERSION   -> supported (0/1), message
//   runtime_messages capture DEVICE DRIVER_VERSION           -> message
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/runtime_checks.hpp"

int main(int argc, char** argv) {
    using namespace qrnn::cuda::detail;
    if (argc != 4) return 2;
    const int a = std::atoi(argv[2]), b = std::atoi(argv[3]);
    if (std::strcmp(argv[1], "driver") == 0) {
        std::printf("%d\n%s\n", int(driver_supports(a, b)), driver_too_old_message(a, b).c_str());
        return 0;
    }
    if (std::strcmp(argv[1], "capture") == 0) {
        std::printf("%s\n", capture_before_load_message(a, b).c_str());
        return 0;
    }
    return 2;
}
