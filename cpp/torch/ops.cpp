// libqrnn_torch: the qrnn:: PyTorch operators for processes without Python (a C++ program
// running an AOTInductor package or an exported program), on PyTorch's stable C ABI.
//
// It uses only the stable C functions of torch (aoti_torch_*, torch_*; no libtorch C++ API),
// built with TORCH_TARGET_VERSION = 2.9, the first release that has them, so the binary does
// not depend on the torch release it was compiled against; it links the torch-free core
// (libqrnn), and libtorch_cpu by name for those C functions (qrnn.torch_library() builds it).
//
// It serves the forward operators (qrnn::forget_mult, qrnn::qrnn_gates, qrnn::linear_scan):
// what an inference graph holds; the *_backward operators stay in Python. Their schemas are
// not written here: they come from the families' manifests (QRNN_FAMILY_SCHEMAS,
// qrnn/families.hpp), the strings the Python package defines its operators from, so both
// registrations agree character for character. The kernels are the core's, called as the
// Python backends (python/qrnn/ops/<family>/kernels.py) call them.
//
// Registration is once per process: the core's claim_torch_ops says whether the Python
// package (`import qrnn`) or an earlier load already owns the operators; then this library
// registers nothing.
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "qrnn/families.hpp"
#include "qrnn/torch_ops_owner.hpp"
#if defined(QRNN_WITH_CUDA)
#include "qrnn/forget_mult_cuda.hpp"
#include "qrnn/linear_scan_cuda.hpp"
#include "qrnn/qrnn_gates_cuda.hpp"
#endif

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// ---- Tensors to the core's views (python/qrnn/ops/core/kernel_args.py's view2 / view3) -----

qrnn::DType dtype_of(const Tensor& t, const char* op, const char* name) {
    switch (t.scalar_type()) {
        case ScalarType::Float: return qrnn::DType::float32;
        case ScalarType::Double: return qrnn::DType::float64;
        case ScalarType::BFloat16: return qrnn::DType::bfloat16;
        case ScalarType::Half: return qrnn::DType::float16;
        default:
            throw std::invalid_argument(std::string(op) + ": " + name +
                                        " must be float32, float64, bfloat16 or float16");
    }
}

ScalarType scalar_type_of(qrnn::DType d) {
    switch (d) {
        case qrnn::DType::float64: return ScalarType::Double;
        case qrnn::DType::bfloat16: return ScalarType::BFloat16;
        case qrnn::DType::float16: return ScalarType::Half;
        default: return ScalarType::Float;
    }
}

// (data, stride_t, stride_b, stride_h) in the kernels' time-major order; empty: absent.
template <typename View>
View view3(const Tensor& t, bool batch_first) {
    if (t.numel() == 0) return View{};
    const auto s = t.strides();
    View v;
    v.data = t.data_ptr();
    v.stride_t = batch_first ? s[1] : s[0];
    v.stride_b = batch_first ? s[0] : s[1];
    v.stride_h = s[2];
    return v;
}

// view3 walked from the last time step when `reverse`: the kernels read a negative time
// stride as time running backwards, so a reversed scan needs no copy (kernel_args.time_view3).
template <typename View>
View time_view3(const Tensor& t, bool batch_first, bool reverse) {
    View v = view3<View>(t, batch_first);
    if (!reverse || v.data == nullptr) return v;
    const int64_t last = t.size(batch_first ? 1 : 0) - 1;
    v.data = static_cast<char*>(t.data_ptr()) + last * v.stride_t * static_cast<int64_t>(t.element_size());
    v.stride_t = -v.stride_t;
    return v;
}

template <typename View>
View view2(const std::optional<Tensor>& t) {
    if (!t.has_value()) return View{};
    View v;
    v.data = t->data_ptr();
    v.stride_b = t->stride(0);
    v.stride_h = t->stride(1);
    return v;
}

// ---- Argument checks: the kernels take shapes on trust ----------------------------------------

void require(bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(message);
}

// Every tensor on the first one's device, and a device this build has kernels for.
void check_device(const Tensor& t, const Tensor& first, const char* op, const char* name) {
#if defined(QRNN_WITH_CUDA)
    require(t.is_cpu() || t.is_cuda(), std::string(op) + ": " + name + " must be a CPU or CUDA tensor");
#else
    require(t.is_cpu(), std::string(op) + ": " + name +
                            " must be a CPU tensor (this libqrnn_torch has CPU kernels "
                            "only: its core library was built without CUDA)");
#endif
    require(t.is_cpu() == first.is_cpu() && t.get_device_index() == first.get_device_index(),
            std::string(op) + ": " + name + " must be on the first argument's device");
}

// Functions of the torch that loaded this library, looked up when first needed: those of
// newer releases than the stable ABI targeted here, and CUDA ones, absent from a CPU torch.
void* torch_function(const char* library, const char* name) {
    void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);  // already loaded by the process, or absent
    return handle != nullptr ? dlsym(handle, name) : nullptr;
}

// torch's intra-op thread count (torch >= 2.10; before: one thread per core), as the
// Python backends pass torch.get_num_threads().
int torch_num_threads() {
    using Function = AOTITorchError (*)(uint32_t*);
    static const auto get = reinterpret_cast<Function>(torch_function("libtorch_cpu.so", "torch_get_num_threads"));
    uint32_t threads = 0;
    return (get != nullptr && get(&threads) == AOTI_TORCH_SUCCESS) ? static_cast<int>(threads) : 0;
}

#if defined(QRNN_WITH_CUDA)
// torch's current CUDA stream of `device`: the kernels launch where torch's work is queued.
void* current_cuda_stream(int32_t device) {
    using Function = AOTITorchError (*)(int32_t, void**);
    static const auto get =
        reinterpret_cast<Function>(torch_function("libtorch_cuda.so", "aoti_torch_get_current_cuda_stream"));
    require(get != nullptr, "libqrnn_torch: CUDA tensors, but this torch has no CUDA stream function");
    void* stream = nullptr;
    require(get(device, &stream) == AOTI_TORCH_SUCCESS, "libqrnn_torch: torch's current CUDA stream is unavailable");
    return stream;
}

// A scan family's CUDA launcher (none without the CUDA kernels).
template <typename Params>
using CudaScanEntry = void (*)(const Params&, void*, qrnn::cuda::Schedule, int);
#define QRNN_CUDA_ENTRY(name) &qrnn::cuda::name
#else
template <typename Params>
using CudaScanEntry = std::nullptr_t;
#define QRNN_CUDA_ENTRY(name) nullptr
#endif

void check_state(const std::optional<Tensor>& state, const Tensor& like, int64_t batch, int64_t hidden, const char* op,
                 const char* name) {
    if (!state.has_value()) return;
    check_device(*state, like, op, name);
    require(state->dim() == 2 && state->size(0) == batch && state->size(1) == hidden,
            std::string(op) + ": " + name + " must have shape (batch, hidden) = (" + std::to_string(batch) + ", " +
                std::to_string(hidden) + ")");
    require(qrnn::accepts_state_dtype(dtype_of(like, op, "input"), dtype_of(*state, op, name)),
            std::string(op) + ": " + name + " must have the input's dtype (or float32 next to 16-bit inputs)");
}

// The scan families' two same-shaped 3-D sequences (forget_mult's f and x, linear_scan's a
// and b) on one device; returns their dtype.
qrnn::DType check_sequences(const Tensor& first, const Tensor& second, const char* op, const char* one,
                            const char* two) {
    require(first.dim() == 3, std::string(op) + ": " + one + " must be 3-D");
    check_device(first, first, op, one);
    check_device(second, first, op, two);
    const qrnn::DType dtype = dtype_of(first, op, one);
    require(second.scalar_type() == first.scalar_type(),
            std::string(op) + ": " + two + " must have " + one + "'s dtype");
    require(second.dim() == 3 && second.size(0) == first.size(0) && second.size(1) == first.size(1) &&
                second.size(2) == first.size(2),
            std::string(op) + ": " + two + " must have " + one + "'s shape");
    return dtype;
}

// ---- Sequences (qrnn/view.hpp): lengths or packed cu_seqlens, and reverse -------------------

// Sets the params' sequence fields and returns the number of sequences (the states' rows):
// `rows` batch rows, or the packed row's sequences. Values are checked by the core (CPU).
template <typename Params>
int64_t set_sequences(Params& p, const std::optional<Tensor>& lengths, const std::optional<Tensor>& cu_seqlens,
                      const Tensor& like, int64_t rows, const char* op) {
    require(!(lengths.has_value() && cu_seqlens.has_value()),
            std::string(op) + ": give lengths or cu_seqlens, not both");
    if (lengths.has_value()) {
        check_device(*lengths, like, op, "lengths");
        require(lengths->dim() == 1 && lengths->size(0) == rows && lengths->scalar_type() == ScalarType::Long,
                std::string(op) + ": lengths must be a 1-D int64 tensor of batch size");
        p.lengths = static_cast<const int64_t*>(lengths->data_ptr());
        p.lengths_stride = lengths->stride(0);
    }
    if (!cu_seqlens.has_value()) return rows;
    check_device(*cu_seqlens, like, op, "cu_seqlens");
    require(cu_seqlens->dim() == 1 && cu_seqlens->size(0) >= 1 && cu_seqlens->scalar_type() == ScalarType::Long &&
                (cu_seqlens->size(0) == 1 || cu_seqlens->stride(0) == 1),
            std::string(op) + ": cu_seqlens must be a contiguous 1-D int64 tensor");
    require(rows == 1, std::string(op) + ": with cu_seqlens the input must be one packed row (batch 1)");
    p.cu_seqlens = static_cast<const int64_t*>(cu_seqlens->data_ptr());
    return cu_seqlens->size(0) - 1;
}

// ---- The scan families: qrnn::forget_mult, qrnn::linear_scan -----------------------------------

// A scan family's forward: its two sequences `first` and `second` (named `one` and `two`) in
// Params::*First and ::*Second, the state h0, and its CPU and CUDA entry points.
template <typename Params, qrnn::ConstView3 Params::* First, qrnn::ConstView3 Params::* Second>
Tensor scan_forward(const char* op, const char* one, const char* two, const Tensor& first, const Tensor& second,
                    const std::optional<Tensor>& h0, bool reverse, bool batch_first,
                    const std::optional<Tensor>& lengths, const std::optional<Tensor>& cu_seqlens,
                    void (*cpu_entry)(const Params&, int), CudaScanEntry<Params> cuda_entry) {
    const qrnn::DType dtype = check_sequences(first, second, op, one, two);
    Params p;
    p.seq_len = first.size(batch_first ? 1 : 0);
    p.batch = set_sequences(p, lengths, cu_seqlens, first, first.size(batch_first ? 0 : 1), op);
    p.hidden = first.size(2);
    check_state(h0, first, p.batch, p.hidden, op, "h0");
    // A whole row reversed is a negative time stride; sequences reverse by the core's flag.
    const bool whole = reverse && !lengths.has_value() && !cu_seqlens.has_value();
    p.reverse = reverse && !whole;
    Tensor h = torch::stable::new_empty(first, first.sizes());
    p.dtype = dtype;
    p.*First = time_view3<qrnn::ConstView3>(first, batch_first, whole);
    p.*Second = time_view3<qrnn::ConstView3>(second, batch_first, whole);
    p.h0 = view2<qrnn::ConstView2>(h0);
    p.h0_dtype = h0.has_value() ? dtype_of(*h0, op, "h0") : dtype;
    p.h = time_view3<qrnn::View3>(h, batch_first, whole);
#if defined(QRNN_WITH_CUDA)
    if (first.is_cuda()) {
        const int32_t device = first.get_device_index();
        cuda_entry(p, current_cuda_stream(device), qrnn::cuda::Schedule::automatic, device);
        return h;
    }
#else
    (void)cuda_entry;
#endif
    cpu_entry(p, torch_num_threads());
    return h;
}

Tensor forget_mult(Tensor f, Tensor x, std::optional<Tensor> h0, bool batch_first, std::optional<Tensor> lengths,
                   std::optional<Tensor> cu_seqlens, bool reverse) {
    return scan_forward<qrnn::ForgetMultForwardParams, &qrnn::ForgetMultForwardParams::f,
                        &qrnn::ForgetMultForwardParams::x>("forget_mult", "f", "x", f, x, h0, reverse, batch_first,
                                                           lengths, cu_seqlens, &qrnn::cpu::forget_mult_forward,
                                                           QRNN_CUDA_ENTRY(forget_mult_forward));
}

Tensor linear_scan(Tensor a, Tensor b, std::optional<Tensor> h0, bool reverse, bool batch_first,
                   std::optional<Tensor> lengths, std::optional<Tensor> cu_seqlens) {
    return scan_forward<qrnn::LinearScanForwardParams, &qrnn::LinearScanForwardParams::a,
                        &qrnn::LinearScanForwardParams::b>("linear_scan", "a", "b", a, b, h0, reverse, batch_first,
                                                           lengths, cu_seqlens, &qrnn::cpu::linear_scan_forward,
                                                           QRNN_CUDA_ENTRY(linear_scan_forward));
}

// ---- qrnn::qrnn_gates -------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> qrnn_gates(Tensor gates, std::optional<Tensor> c0, std::optional<Tensor> forget_mask,
                                              std::optional<Tensor> lengths, double forget_scale, bool output_gate,
                                              bool batch_first, bool reverse, std::optional<Tensor> cu_seqlens) {
    constexpr const char* op = "qrnn_gates";
    const int64_t n_gates = output_gate ? 3 : 2;
    check_device(gates, gates, op, "gates");
    const qrnn::DType dtype = dtype_of(gates, op, "gates");
    require(gates.dim() == 3 && gates.size(2) % n_gates == 0,
            "qrnn_gates: gates must be 3-D with the last size a multiple of " + std::to_string(n_gates));
    require(forget_scale >= 0.0 && forget_scale <= 1.0, "qrnn_gates: forget_scale must be in [0, 1]");
    const int64_t hidden = gates.size(2) / n_gates;
    const int64_t seq_len = gates.size(batch_first ? 1 : 0);
    qrnn::QrnnGatesForwardParams p;
    const int64_t batch = set_sequences(p, lengths, cu_seqlens, gates, gates.size(batch_first ? 0 : 1), op);
    check_state(c0, gates, batch, hidden, op, "c0");
    const std::vector<int64_t> out_shape{gates.size(0), gates.size(1), hidden};
    if (forget_mask.has_value()) {
        check_device(*forget_mask, gates, op, "forget_mask");
        require(forget_mask->dim() == 3 && forget_mask->size(0) == out_shape[0] &&
                    forget_mask->size(1) == out_shape[1] && forget_mask->size(2) == hidden,
                "qrnn_gates: forget_mask must have the output's shape");
        require(forget_mask->scalar_type() == gates.scalar_type(), "qrnn_gates: forget_mask must have gates' dtype");
    }

    Tensor output = torch::stable::new_empty(gates, out_shape);
    // The backward needs every c[t]; without an output gate that is the output itself.
    Tensor states = torch::stable::new_empty(gates, output_gate ? out_shape : std::vector<int64_t>{0});
    Tensor c_n = torch::stable::new_empty(gates, {batch, hidden}, scalar_type_of(qrnn::state_dtype(dtype)));

    p.seq_len = seq_len;
    p.batch = batch;
    p.hidden = hidden;
    p.dtype = dtype;
    p.output_gate = output_gate;
    p.gates = view3<qrnn::ConstView3>(gates, batch_first);
    p.gate_stride = hidden * gates.stride(2);
    if (forget_mask.has_value()) p.forget_mask = view3<qrnn::ConstView3>(*forget_mask, batch_first);
    p.forget_scale = forget_scale;
    p.c0 = view2<qrnn::ConstView2>(c0);
    p.c0_dtype = c0.has_value() ? dtype_of(*c0, op, "c0") : dtype;
    p.reverse = reverse;
    p.output = view3<qrnn::View3>(output, batch_first);
    if (output_gate) p.states = view3<qrnn::View3>(states, batch_first);
    p.c_n = view2<qrnn::View2>(std::optional<Tensor>(c_n));
    p.c_n_dtype = qrnn::state_dtype(dtype);
#if defined(QRNN_WITH_CUDA)
    if (gates.is_cuda()) {
        const int32_t device = gates.get_device_index();
        qrnn::cuda::qrnn_gates_forward(p, current_cuda_stream(device), device);
        return {output, c_n, states};
    }
#endif
    qrnn::cpu::qrnn_gates_forward(p, torch_num_threads());
    return {output, c_n, states};
}

// ---- Registration, once per process ------------------------------------------------------------

using BoxedKernel = void (*)(StableIValue*, uint64_t, uint64_t);

struct Operator {
    const char* name;
    const char* schema;  // from the manifest
    BoxedKernel kernel;  // nullptr: a backward operator, not served here
};

// Each forward operator's kernel, by name; the backward operators have none.
constexpr BoxedKernel kernel_of(std::string_view name) {
    if (name == "forget_mult") return TORCH_BOX(&forget_mult);
    if (name == "qrnn_gates") return TORCH_BOX(&qrnn_gates);
    if (name == "linear_scan") return TORCH_BOX(&linear_scan);
    return nullptr;
}

constexpr bool is_backward(std::string_view name) {
    constexpr std::string_view suffix = "_backward";
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
}

// Every op of every family's manifest, schema text and all: written once, in the headers.
#define QRNN_TORCH_OPERATOR(name, schema) Operator{#name, schema, kernel_of(#name)},
constexpr Operator kOperators[] = {QRNN_FAMILY_SCHEMAS(QRNN_TORCH_OPERATOR)};
#undef QRNN_TORCH_OPERATOR

// A family added to the manifests must get its forward kernel here (and nothing else may).
constexpr bool every_forward_has_a_kernel() {
    for (const Operator& op : kOperators) {
        if (is_backward(op.name) == (op.kernel != nullptr)) return false;
    }
    return true;
}
static_assert(every_forward_has_a_kernel(),
              "libqrnn_torch: every forward op of QRNN_FAMILY_SCHEMAS needs its kernel in kernel_of, and only those");

void check(AOTITorchError error, const char* what, const char* name) {
    if (error != AOTI_TORCH_SUCCESS) {
        throw std::runtime_error(std::string("libqrnn_torch: ") + what + " " + name + " failed");
    }
}

// The registrations live as long as the library; the handles unregister when deleted.
class Registration {
public:
    Registration() {
        if (qrnn::claim_torch_ops(qrnn::TorchOpsOwner::torch_library) != qrnn::TorchOpsOwner::none) {
            return;  // `import qrnn` or an earlier load of this library registered them
        }
        check(aoti_torch_library_init_fragment("qrnn", __FILE__, __LINE__, &definitions_), "init_fragment", "qrnn");
        check(aoti_torch_library_init_impl("qrnn", "CPU", __FILE__, __LINE__, &cpu_), "init_impl", "CPU");
#if defined(QRNN_WITH_CUDA)
        check(aoti_torch_library_init_impl("qrnn", "CUDA", __FILE__, __LINE__, &cuda_), "init_impl", "CUDA");
#endif
        for (const Operator& op : kOperators) {
            if (op.kernel == nullptr) continue;
            check(aoti_torch_library_def(definitions_, op.schema), "def", op.name);
            check(aoti_torch_library_impl(cpu_, op.name, op.kernel), "CPU impl", op.name);
#if defined(QRNN_WITH_CUDA)
            check(aoti_torch_library_impl(cuda_, op.name, op.kernel), "CUDA impl", op.name);
#endif
        }
    }
    ~Registration() {
        if (cuda_ != nullptr) aoti_torch_delete_library_object(cuda_);
        if (cpu_ != nullptr) aoti_torch_delete_library_object(cpu_);
        if (definitions_ != nullptr) aoti_torch_delete_library_object(definitions_);
    }
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

private:
    TorchLibraryHandle definitions_ = nullptr;
    TorchLibraryHandle cpu_ = nullptr;
    TorchLibraryHandle cuda_ = nullptr;  // CUDA builds of the core only
};

const Registration registration;

}  // namespace
