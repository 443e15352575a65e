// Strided views over caller-owned arrays, shared by every kernel's parameter struct.
// Strides are in elements (not bytes) and may be zero or negative; `data == nullptr`
// marks an optional array as absent.
#pragma once

#include <cstdint>

namespace qrnn {

struct ConstView3 {
    const void* data = nullptr;
    int64_t stride_t = 0, stride_b = 0, stride_h = 0;
};
struct View3 {
    void* data = nullptr;
    int64_t stride_t = 0, stride_b = 0, stride_h = 0;
};
struct ConstView2 {
    const void* data = nullptr;
    int64_t stride_b = 0, stride_h = 0;
};
struct View2 {
    void* data = nullptr;
    int64_t stride_b = 0, stride_h = 0;
};

}  // namespace qrnn
