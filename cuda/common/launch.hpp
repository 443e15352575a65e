// Internal: what the CUDA entry points (<family>/entry.cu) and the per-dtype translation
// units (<family>/<dtype>.cu) of every family share.
// Plain C++, no CUDA types, so the plan logic is ordinary host code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "qrnn/cuda_schedule.hpp"
#include "qrnn/dtype.hpp"
#include "qrnn/families.hpp"
#include "qrnn/view.hpp"

namespace qrnn::cuda::detail {

// Time steps of loads each thread keeps in flight (serial schedule), which is also the
// chunk length of the chunked schedule. Every step of a thread loads one pack of
// vector_width elements from each input array (2 forward, 4 backward); the numbers
// keep the packs of all in-flight steps in registers without spilling (the resource
// report in CI checks that).
constexpr int forward_steps(int pack_bytes) { return pack_bytes <= 4 ? 16 : 8; }
constexpr int backward_steps(int pack_bytes) { return pack_bytes >= 16 ? 4 : 8; }

constexpr int kSerialThreads = 128;  // threads per block of the serial kernels
// The chunked kernels hold a whole chunk in registers, so they move at most 4 bytes
// per array and step (a half2 / bfloat162 pair or one float); their blocks are
// kChunkLanes columns wide (a 128-byte row per warp), or kNarrowChunkLanes (one
// 32-byte sector) when that leaves fewer than kMinChunkedBlocks blocks.
constexpr int kChunkLanes = 32;
constexpr int kNarrowChunkLanes = 8;
constexpr int64_t kMinChunkedBlocks = 128;
constexpr int kMaxChunks = 16;  // so a chunked block has at most 512 threads
constexpr int chunked_max_width(int elem_size) { return elem_size >= 4 ? 1 : 4 / elem_size; }
// Bytes of loads that must be outstanding across the GPU to keep HBM busy (Little's
// law: ~4.8 TB/s x ~0.8 us on an H200). Below it, time is split into chunks.
constexpr int64_t kBytesInFlight = int64_t(4) << 20;

// The grid of a plan: `blocks` blocks of lanes x chunks threads (chunks == 1: the serial
// kernel) and the chunked kernels' dynamic shared memory (per chunk and thread the
// summary a, b; per column the incoming state, double-buffered).
struct LaunchShape {
    int64_t vectors_per_row = 0;
    int64_t blocks = 0;
    int lanes = 0;
    int chunks = 1;
    int64_t shared_bytes = 0;
};

inline LaunchShape launch_shape(int64_t batch, int64_t hidden, int vector_width, int chunks, int64_t math_size,
                                int serial_threads = kSerialThreads) {
    LaunchShape s;
    s.vectors_per_row = (hidden + vector_width - 1) / vector_width;
    const int64_t columns = batch * s.vectors_per_row;
    if (chunks <= 1) {
        s.lanes = serial_threads;
    } else {
        const int64_t wide_blocks = (columns + kChunkLanes - 1) / kChunkLanes;
        s.lanes = wide_blocks < kMinChunkedBlocks ? kNarrowChunkLanes : kChunkLanes;
        s.chunks = chunks;
        s.shared_bytes = int64_t(2 * chunks + 2) * vector_width * s.lanes * math_size;
    }
    s.blocks = (columns + s.lanes - 1) / s.lanes;
    return s;
}

// A strided (time, batch, hidden) array as a launch plan sees it.
struct Strided {
    const void* data;
    int64_t stride_t, stride_b, stride_h;
};

inline Strided strided(const ConstView3& v) { return {v.data, v.stride_t, v.stride_b, v.stride_h}; }
inline Strided strided(const View3& v) { return {v.data, v.stride_t, v.stride_b, v.stride_h}; }

// `count` arrays from `first`, where a braced list of them is not written out.
struct StridedArrays {
    const Strided* first;
    size_t count;
    const Strided* begin() const { return first; }
    const Strided* end() const { return first + count; }
};

// Can the arrays be read and written `width` elements at a time? Each array with unit
// hidden stride moves whole packs, so wherever a thread's pack starts its address must be
// aligned to the pack size; the others (broadcast along hidden, stride 0, or strided) are
// moved element by element by the kernels and set no condition, so they never force the
// rest to scalar accesses. Needs at least one unit-stride array (otherwise packs buy
// nothing). Absent optional arrays (null data) are skipped.
// `arrays`: a braced list of them, or StridedArrays.
template <typename Arrays = std::initializer_list<Strided>>
bool vectorisable(int width, int64_t elem_size, int64_t T, int64_t B, int64_t H, const Arrays& arrays) {
    if (width > H) return false;
    const int64_t bytes = width * elem_size;
    bool any_unit_stride = false;
    for (const Strided& a : arrays) {
        if (a.data == nullptr || a.stride_h != 1) continue;
        any_unit_stride = true;
        if (reinterpret_cast<uintptr_t>(a.data) % uintptr_t(bytes) != 0) return false;
        if (T > 1 && (a.stride_t * elem_size) % bytes != 0) return false;
        if (B > 1 && (a.stride_b * elem_size) % bytes != 0) return false;
    }
    return any_unit_stride;
}

// Calls fn(std::integral_constant<int, V>{}) for `width`, one of the vector widths the
// kernels are compiled for: every power of two from `Widest` down to 1.
template <int Widest, typename Fn>
void dispatch_width(int width, Fn&& fn) {
    if (width == Widest) return fn(std::integral_constant<int, Widest>{});
    if constexpr (Widest > 1) {
        return dispatch_width<Widest / 2>(width, fn);
    } else {
        throw std::logic_error("qrnn::cuda: no kernel for vector width " + std::to_string(width));
    }
}

// Calls fn(std::integral_constant<int, V>{}) for every width dispatch_width<Widest> accepts.
template <int Widest, typename Fn>
void for_each_width(Fn&& fn) {
    fn(std::integral_constant<int, Widest>{});
    if constexpr (Widest > 1) for_each_width<Widest / 2>(fn);
}

// Calls fn(std::integral_constant<DType, D>{}) for a valid `dtype`.
template <typename Fn>
decltype(auto) by_dtype(DType dtype, Fn&& fn) {
    switch (dtype) {
        case DType::float64: return fn(std::integral_constant<DType, DType::float64>{});
        case DType::bfloat16: return fn(std::integral_constant<DType, DType::bfloat16>{});
        case DType::float16: return fn(std::integral_constant<DType, DType::float16>{});
        case DType::float32: break;
    }
    return fn(std::integral_constant<DType, DType::float32>{});
}

// One launcher per op (its parameter struct), direction and storage dtype, the dtypes each
// in their own translation unit (<family>/<dtype>.cu, QRNN_DEFINE_CUDA_LAUNCHERS defines
// them); they launch the plan's kernel on `stream` and throw std::runtime_error if the
// launch fails. The gate kernels have no chunked schedule.
template <DType D, typename Params> void launch(const Params& p, const LaunchPlan& plan, void* stream);

// Launches `p` with `plan` on the launcher of its dtype.
template <typename Params>
void launch_of_dtype(const Params& p, const LaunchPlan& plan, void* stream) {
    by_dtype(p.dtype, [&](auto dtype) { launch<decltype(dtype)::value>(p, plan, stream); });
}

// Throws std::runtime_error naming `what` if the last launch failed (common/launch.cu, which
// owns the CUDA runtime error handling).
void check_launch(const char* what);
// Throws std::runtime_error naming `what` unless `error` (a cudaError_t) is cudaSuccess;
// driver-version errors name the driver found and the one needed.
void check_cuda(int error, const char* what);

// The families of CUDA kernels: every op family (qrnn/families.hpp), F(name) the name of its
// KernelFamily and of its launchers qrnn::cuda::<name>_forward / _backward.
#define QRNN_CUDA_KERNEL_FAMILIES(F) QRNN_FAMILY_NAMES(F)

// Which kernels a launch needs loaded: one family's of one dtype, or none.
#define QRNN_CUDA_FAMILY_ENUMERATOR(name) name,
enum class KernelFamily : int { none = -1, QRNN_CUDA_KERNEL_FAMILIES(QRNN_CUDA_FAMILY_ENUMERATOR) };
#undef QRNN_CUDA_FAMILY_ENUMERATOR
#define QRNN_CUDA_FAMILY_COUNT(name) +1
constexpr int kKernelFamilies = 0 QRNN_CUDA_KERNEL_FAMILIES(QRNN_CUDA_FAMILY_COUNT);
#undef QRNN_CUDA_FAMILY_COUNT

// Each family's launchers by name, as launch errors give them.
#define QRNN_CUDA_FAMILY_FORWARD(name) "qrnn::cuda::" #name "_forward",
#define QRNN_CUDA_FAMILY_BACKWARD(name) "qrnn::cuda::" #name "_backward",
constexpr const char* kForwardNames[] = {QRNN_CUDA_KERNEL_FAMILIES(QRNN_CUDA_FAMILY_FORWARD)};
constexpr const char* kBackwardNames[] = {QRNN_CUDA_KERNEL_FAMILIES(QRNN_CUDA_FAMILY_BACKWARD)};
#undef QRNN_CUDA_FAMILY_BACKWARD
#undef QRNN_CUDA_FAMILY_FORWARD

// Loads every kernel of one family and dtype (cudaFuncGetAttributes on each: with lazy
// loading, the CUDA >= 12.2 default, a kernel is otherwise loaded at its first launch,
// which drivers older than 12.3 cannot do during a CUDA graph capture). Per-dtype
// translation units.
template <DType D, KernelFamily F> void load_kernels();

// What every launching entry point (`what`) does first (common/launch.cu): once per
// process, check that the driver can run this build's CUDA runtime; make `device` current
// (-1: the device `data` lives on, or the current one for host memory) until the guard
// goes; and once per device, load the family's kernels of `dtype` (all their widths and
// schedules, a few milliseconds; only those, so a GPU that runs PTX JIT-compiles no more
// than it uses), or if `stream` is being captured by a driver that cannot load kernels
// then, throw saying so.
class LaunchGuard {
public:
    LaunchGuard(const char* what, void* stream, int device, const void* data, KernelFamily family, DType dtype);
    ~LaunchGuard();
    LaunchGuard(const LaunchGuard&) = delete;
    LaunchGuard& operator=(const LaunchGuard&) = delete;

private:
    int previous_ = -1;  // the device to restore, or -1
};

}  // namespace qrnn::cuda::detail
