// libqrnn_torch: the qrnn:: PyTorch operators for processes without Python (a C++ program
// running an AOTInductor package or an exported program), on PyTorch's stable C ABI.
//
// It uses only the stable C functions of torch (aoti_torch_*, torch_*; no libtorch C++ API),
// built with TORCH_TARGET_VERSION = 2.9, the first release that has them, so the binary does
// not depend on the torch release it was compiled against; it links the torch-free core
// (libqrnn), and libtorch_cpu by name for those C functions (qrnn.torch_library() builds it). The schemas are character for character those of python/qrnn/ops/*.py; the kernels
// are the core's, called as the Python backends (python/qrnn/ops/cpu.py) call them.
//
// Registration is once per process: the core's claim_torch_ops says whether the Python
// package (`import qrnn`) or an earlier load already owns the operators; then this library
// registers nothing.
#include <dlfcn.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "qrnn/forget_mult.hpp"
#include "qrnn/qrnn_gates.hpp"
#include "qrnn/torch_ops_owner.hpp"
#if defined(QRNN_WITH_CUDA)
#include "qrnn/forget_mult_cuda.hpp"
#include "qrnn/qrnn_gates_cuda.hpp"
#endif

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// ---- Tensors to the core's views (python/qrnn/ops/kernel_args.py's view2 / view3) ----------

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

ScalarType state_scalar_type(ScalarType t) {
    return (t == ScalarType::BFloat16 || t == ScalarType::Half) ? ScalarType::Float : t;
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
    require(t.is_cpu(), std::string(op) + ": " + name + " must be a CPU tensor (this libqrnn_torch has CPU kernels "
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
#endif

void check_state(const std::optional<Tensor>& state, const Tensor& like, int64_t batch, int64_t hidden,
                 const char* op, const char* name) {
    if (!state.has_value()) return;
    check_device(*state, like, op, name);
    require(state->dim() == 2 && state->size(0) == batch && state->size(1) == hidden,
            std::string(op) + ": " + name + " must have shape (batch, hidden) = (" + std::to_string(batch) + ", " +
                std::to_string(hidden) + ")");
    const ScalarType dtype = state->scalar_type();
    require(dtype == like.scalar_type() || dtype == state_scalar_type(like.scalar_type()),
            std::string(op) + ": " + name + " must have the input's dtype (or float32 next to 16-bit inputs)");
}

// ---- qrnn::forget_mult ------------------------------------------------------------------------

Tensor forget_mult(Tensor f, Tensor x, std::optional<Tensor> h0, bool batch_first) {
    constexpr const char* op = "forget_mult";
    require(f.dim() == 3, "forget_mult: f must be 3-D");
    check_device(f, f, op, "f");
    check_device(x, f, op, "x");
    const qrnn::DType dtype = dtype_of(f, op, "f");
    require(x.scalar_type() == f.scalar_type(), "forget_mult: x must have f's dtype");
    require(x.dim() == 3 && x.size(0) == f.size(0) && x.size(1) == f.size(1) && x.size(2) == f.size(2),
            "forget_mult: x must have f's shape");
    qrnn::ForgetMultForwardParams p;
    p.seq_len = f.size(batch_first ? 1 : 0);
    p.batch = f.size(batch_first ? 0 : 1);
    p.hidden = f.size(2);
    check_state(h0, f, p.batch, p.hidden, op, "h0");
    Tensor h = torch::stable::new_empty(f, f.sizes());
    p.dtype = dtype;
    p.f = view3<qrnn::ConstView3>(f, batch_first);
    p.x = view3<qrnn::ConstView3>(x, batch_first);
    p.h0 = view2<qrnn::ConstView2>(h0);
    p.h0_dtype = h0.has_value() ? dtype_of(*h0, op, "h0") : dtype;
    p.h = view3<qrnn::View3>(h, batch_first);
#if defined(QRNN_WITH_CUDA)
    if (f.is_cuda()) {
        const int32_t device = f.get_device_index();
        qrnn::cuda::forget_mult_forward(p, current_cuda_stream(device), qrnn::cuda::Schedule::automatic, device);
        return h;
    }
#endif
    qrnn::cpu::forget_mult_forward(p, torch_num_threads());
    return h;
}

// ---- qrnn::qrnn_gates -------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> qrnn_gates(Tensor gates, std::optional<Tensor> c0,
                                              std::optional<Tensor> forget_mask, std::optional<Tensor> lengths,
                                              double forget_scale, bool output_gate, bool batch_first,
                                              bool reverse) {
    constexpr const char* op = "qrnn_gates";
    const int64_t n_gates = output_gate ? 3 : 2;
    check_device(gates, gates, op, "gates");
    const qrnn::DType dtype = dtype_of(gates, op, "gates");
    require(gates.dim() == 3 && gates.size(2) % n_gates == 0,
            "qrnn_gates: gates must be 3-D with the last size a multiple of " + std::to_string(n_gates));
    require(forget_scale >= 0.0 && forget_scale <= 1.0, "qrnn_gates: forget_scale must be in [0, 1]");
    const int64_t hidden = gates.size(2) / n_gates;
    const int64_t batch = gates.size(batch_first ? 0 : 1);
    const int64_t seq_len = gates.size(batch_first ? 1 : 0);
    check_state(c0, gates, batch, hidden, op, "c0");
    const std::vector<int64_t> out_shape{gates.size(0), gates.size(1), hidden};
    if (forget_mask.has_value()) {
        check_device(*forget_mask, gates, op, "forget_mask");
        require(forget_mask->dim() == 3 && forget_mask->size(0) == out_shape[0] &&
                    forget_mask->size(1) == out_shape[1] && forget_mask->size(2) == hidden,
                "qrnn_gates: forget_mask must have the output's shape");
        require(forget_mask->scalar_type() == gates.scalar_type(), "qrnn_gates: forget_mask must have gates' dtype");
    }
    if (lengths.has_value()) {
        check_device(*lengths, gates, op, "lengths");
        require(lengths->dim() == 1 && lengths->size(0) == batch && lengths->scalar_type() == ScalarType::Long,
                "qrnn_gates: lengths must be a 1-D int64 tensor of batch size");
    }

    Tensor output = torch::stable::new_empty(gates, out_shape);
    // The backward needs every c[t]; without an output gate that is the output itself.
    Tensor states = torch::stable::new_empty(gates, output_gate ? out_shape : std::vector<int64_t>{0});
    Tensor c_n = torch::stable::new_empty(gates, {batch, hidden}, state_scalar_type(gates.scalar_type()));

    qrnn::QrnnGatesForwardParams p;
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
    if (lengths.has_value()) {
        p.lengths = static_cast<const int64_t*>(lengths->data_ptr());
        p.lengths_stride = lengths->stride(0);
    }
    p.reverse = reverse;
    p.output = view3<qrnn::View3>(output, batch_first);
    if (output_gate) p.states = view3<qrnn::View3>(states, batch_first);
    p.c_n = view2<qrnn::View2>(std::optional<Tensor>(c_n));
    p.c_n_dtype = state_scalar_type(gates.scalar_type()) == ScalarType::Float ? qrnn::DType::float32 : dtype;
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

// Python's torch.library.custom_op schemas (python/qrnn/ops/forget_mult.py, qrnn_gates.py).
constexpr const char* kForgetMultSchema =
    "forget_mult(Tensor f, Tensor x, Tensor? h0, bool batch_first) -> Tensor";
constexpr const char* kQrnnGatesSchema =
    "qrnn_gates(Tensor gates, Tensor? c0, Tensor? forget_mask, Tensor? lengths, float forget_scale, "
    "bool output_gate, bool batch_first, bool reverse) -> (Tensor, Tensor, Tensor)";

void check(AOTITorchError error, const char* what) {
    if (error != AOTI_TORCH_SUCCESS) throw std::runtime_error(std::string("libqrnn_torch: ") + what + " failed");
}

// The registrations live as long as the library; the handles unregister when deleted.
class Registration {
public:
    Registration() {
        if (qrnn::claim_torch_ops(qrnn::TorchOpsOwner::torch_library) != qrnn::TorchOpsOwner::none) {
            return;  // `import qrnn` or an earlier load of this library registered them
        }
        check(aoti_torch_library_init_fragment("qrnn", __FILE__, __LINE__, &definitions_), "init_fragment");
        check(aoti_torch_library_def(definitions_, kForgetMultSchema), "def forget_mult");
        check(aoti_torch_library_def(definitions_, kQrnnGatesSchema), "def qrnn_gates");
        check(aoti_torch_library_init_impl("qrnn", "CPU", __FILE__, __LINE__, &cpu_), "init_impl CPU");
        check(aoti_torch_library_impl(cpu_, "forget_mult", TORCH_BOX(&forget_mult)), "impl forget_mult");
        check(aoti_torch_library_impl(cpu_, "qrnn_gates", TORCH_BOX(&qrnn_gates)), "impl qrnn_gates");
#if defined(QRNN_WITH_CUDA)
        check(aoti_torch_library_init_impl("qrnn", "CUDA", __FILE__, __LINE__, &cuda_), "init_impl CUDA");
        check(aoti_torch_library_impl(cuda_, "forget_mult", TORCH_BOX(&forget_mult)), "impl forget_mult");
        check(aoti_torch_library_impl(cuda_, "qrnn_gates", TORCH_BOX(&qrnn_gates)), "impl qrnn_gates");
#endif
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
