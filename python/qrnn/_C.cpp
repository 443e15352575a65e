// The one binding file: exposes the torch-free core to Python.
//
// Tensors cross as integers: a data pointer and element strides per array; this module
// never links libtorch, so one wheel serves every torch release. std::invalid_argument
// from the core arrives in Python as ValueError, other exceptions as RuntimeError.
//
// The kernel entry points are called on every forward/backward, so they bypass
// pybind11's generic argument conversion (microseconds at 20+ arguments) and take a flat
// list of integers through CPython's METH_FASTCALL protocol. Everything else uses pybind11.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <tuple>

#include "qrnn/build_info.hpp"
#include "qrnn/checkpoint.hpp"
#include "qrnn/forget_mult.hpp"
#include "qrnn/forget_mult_cuda.hpp"
#include "qrnn/qrnn_gates.hpp"
#include "qrnn/qrnn_gates_cuda.hpp"

namespace py = pybind11;

namespace {

// Below this many element-steps a kernel finishes in about a microsecond: keep the GIL
// (re-acquiring it can wait a whole switch interval when other Python threads run).
constexpr int64_t kReleaseGilWork = 1 << 14;

// Reads exactly N integer arguments; false (with a Python error set) otherwise.
template <size_t N>
bool parse_ints(const char* fn, PyObject* const* args, Py_ssize_t nargs, int64_t (&out)[N]) {
    if (nargs != Py_ssize_t(N)) {
        PyErr_Format(PyExc_TypeError, "%s takes %d integer arguments, got %zd", fn, int(N), nargs);
        return false;
    }
    for (size_t i = 0; i < N; ++i) {
        // Python < 3.10 converts a float through __int__ (with a DeprecationWarning) where
        // later versions raise: accept only integers (objects with __index__) on all.
        if (!PyIndex_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "%s: argument %zd must be an integer, got %s", fn, Py_ssize_t(i),
                         Py_TYPE(args[i])->tp_name);
            return false;
        }
        out[i] = PyLong_AsLongLong(args[i]);
        if (out[i] == -1 && PyErr_Occurred()) return false;
    }
    return true;
}

// Argument decoding: a 3-D view is (pointer, stride_t, stride_b, stride_h), a 2-D view
// (pointer, stride_b, stride_h); the reader advances through the argument vector.
struct ArgReader {
    const int64_t* a;
    int64_t next() { return *a++; }
    qrnn::DType dtype() {
        const int64_t code = next();
        if (code < 0 || code > 3) throw std::invalid_argument("dtype code must be 0..3, got " + std::to_string(code));
        return static_cast<qrnn::DType>(code);
    }
    const void* cptr() { return reinterpret_cast<const void*>(static_cast<uintptr_t>(next())); }
    void* mptr() { return reinterpret_cast<void*>(static_cast<uintptr_t>(next())); }
    qrnn::ConstView3 cview3() { auto p = cptr(); auto st = next(), sb = next(), sh = next(); return {p, st, sb, sh}; }
    qrnn::View3 mview3() { auto p = mptr(); auto st = next(), sb = next(), sh = next(); return {p, st, sb, sh}; }
    qrnn::ConstView2 cview2() { auto p = cptr(); auto sb = next(), sh = next(); return {p, sb, sh}; }
    qrnn::View2 mview2() { auto p = mptr(); auto sb = next(), sh = next(); return {p, sb, sh}; }
};

// Adds a null-terminated table of METH_FASTCALL functions to the module.
void add_fastcall_functions(py::module_& m, PyMethodDef* table) {
    for (PyMethodDef* def = table; def->ml_name; ++def)
        m.add_object(def->ml_name, py::reinterpret_steal<py::object>(PyCFunction_NewEx(def, nullptr, m.ptr())));
}

// Runs `kernel` with the GIL released when the work is large, translating exceptions.
template <typename Kernel>
PyObject* run_kernel(int64_t work, Kernel&& kernel) {
    try {
        if (work >= kReleaseGilWork) {
            py::gil_scoped_release release;
            kernel();
        } else {
            kernel();
        }
    } catch (const std::invalid_argument& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
        return nullptr;
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
    Py_RETURN_NONE;
}

int64_t work_of(int64_t T, int64_t B, int64_t H) {
    return (T > 0 && B > 0 && H > 0) ? T * B * H : 0;  // sizes are re-checked by the core
}

// dtype, T, B, H, f[4], x[4], h0[3], h0_dtype, h[4]: the first 20 of
// forget_mult_forward's (a view [n] is a pointer and its strides).
qrnn::ForgetMultForwardParams read_forward(const int64_t* a) {
    qrnn::ForgetMultForwardParams p;
    ArgReader r{a};
    p.dtype = r.dtype();
    p.seq_len = r.next();
    p.batch = r.next();
    p.hidden = r.next();
    p.f = r.cview3();
    p.x = r.cview3();
    p.h0 = r.cview2();
    p.h0_dtype = r.dtype();
    p.h = r.mview3();
    return p;
}

// dtype, T, B, H, f[4], x[4], h[4], h0[3], h0_dtype, grad_h[4], grad_f[4], grad_x[4], grad_h0[3]:
// the first 35 of forget_mult_backward's.
qrnn::ForgetMultBackwardParams read_backward(const int64_t* a) {
    qrnn::ForgetMultBackwardParams p;
    ArgReader r{a};
    p.dtype = r.dtype();
    p.seq_len = r.next();
    p.batch = r.next();
    p.hidden = r.next();
    p.f = r.cview3();
    p.x = r.cview3();
    p.h = r.cview3();
    p.h0 = r.cview2();
    p.h0_dtype = r.dtype();
    p.grad_h = r.cview3();
    p.grad_f = r.mview3();
    p.grad_x = r.mview3();
    p.grad_h0 = r.mview2();
    return p;
}

// forget_mult_forward(<20 forward integers>, num_threads)
PyObject* forget_mult_forward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    int64_t a[21];
    if (!parse_ints("forget_mult_forward", args, nargs, a)) return nullptr;
    return run_kernel(work_of(a[1], a[2], a[3]),
                      [&] { qrnn::cpu::forget_mult_forward(read_forward(a), int(a[20])); });
}

// forget_mult_backward(<35 backward integers>, num_threads)
PyObject* forget_mult_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    int64_t a[36];
    if (!parse_ints("forget_mult_backward", args, nargs, a)) return nullptr;
    return run_kernel(work_of(a[1], a[2], a[3]),
                      [&] { qrnn::cpu::forget_mult_backward(read_backward(a), int(a[35])); });
}

PyMethodDef kernel_methods[] = {
    {"forget_mult_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(forget_mult_forward)),
     METH_FASTCALL,
     "forget_mult_forward(dtype, T, B, H, f_ptr, f_st, f_sb, f_sh, x_ptr, x_st, x_sb, x_sh, h0_ptr, h0_sb, h0_sh, "
     "h0_dtype, h_ptr, h_st, h_sb, h_sh, num_threads): CPU ForgetMult forward (h0_ptr 0: no h0)"},
    {"forget_mult_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(forget_mult_backward)),
     METH_FASTCALL,
     "forget_mult_backward(dtype, T, B, H, f[4], x[4], h[4], h0[3], h0_dtype, grad_h[4], grad_f[4], grad_x[4], "
     "grad_h0[3], num_threads): CPU ForgetMult backward; each [n] is a pointer and its strides"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

// ==== Checkpoint writer (qrnn.checkpoint) ===========================================
// Thin wrappers over <qrnn/checkpoint.hpp>. Buffers cross as (address, bytes) integers;
// every call that can wait or copy releases the GIL, and the writer's threads never touch
// Python objects.

namespace {
namespace ckpt = qrnn::checkpoint;
using Source = std::tuple<uintptr_t, uint64_t>;  // address (0: filled by the caller), bytes

ckpt::SaveRequest checkpoint_request(const std::string& path, const py::bytes& pickle,
                                     const std::vector<Source>& sources) {
    ckpt::SaveRequest r;
    r.path = path;
    r.pickle = pickle;
    r.records.reserve(sources.size());
    for (size_t i = 0; i < sources.size(); ++i)
        r.records.push_back({"data/" + std::to_string(i), reinterpret_cast<const void*>(std::get<0>(sources[i])),
                             std::get<1>(sources[i])});
    return r;
}

py::object checkpoint_error(const ckpt::SaveStatus& s) {
    if (!s.done() || s.ok()) return py::none();
    const ckpt::SaveError e = s.error();
    return py::make_tuple(e.error_number, e.operation, e.path, e.message);
}

void bind_checkpoint(py::module_& m) {
    m.def("checkpoint_crc32",
          [](py::buffer data, uint32_t crc) {
              py::buffer_info info = data.request();
              const auto n = static_cast<size_t>(info.size * info.itemsize);
              py::gil_scoped_release release;
              return ckpt::crc32(info.ptr, n, crc);
          },
          py::arg("data"), py::arg("crc") = 0, "CRC-32 (zip) of a buffer, continuing from crc.");

    py::class_<ckpt::SaveStatus, std::shared_ptr<ckpt::SaveStatus>>(m, "CheckpointStatus")
        .def("done", &ckpt::SaveStatus::done)
        .def("staged", &ckpt::SaveStatus::staged)
        .def("wait",
             [](const ckpt::SaveStatus& s, std::optional<double> timeout) {
                 py::gil_scoped_release release;
                 if (!timeout) {
                     s.wait();
                     return true;
                 }
                 return s.wait_for(*timeout);
             },
             py::arg("timeout") = py::none())
        .def("wait_staged", &ckpt::SaveStatus::wait_staged, py::call_guard<py::gil_scoped_release>())
        .def("ok", &ckpt::SaveStatus::ok)
        .def("error", &checkpoint_error, "None, or (errno, operation, path, message) of a failed save")
        .def("warnings", &ckpt::SaveStatus::warnings)
        .def_property_readonly("path", &ckpt::SaveStatus::path)
        .def_property_readonly("staged_seconds", &ckpt::SaveStatus::staged_seconds)
        .def_property_readonly("done_seconds", &ckpt::SaveStatus::done_seconds);

    py::class_<ckpt::Gate, std::shared_ptr<ckpt::Gate>>(m, "CheckpointGate")
        .def(py::init<>())
        .def("open", &ckpt::Gate::open)
        .def("fail", &ckpt::Gate::fail, py::arg("reason"))
        .def("is_open", &ckpt::Gate::is_open);

    py::class_<ckpt::CheckpointWriter>(m, "CheckpointWriter")
        .def(py::init([](int max_pending, int copy_threads, bool direct_io, bool sync, uint64_t fail_after_bytes,
                         int fail_errno, bool fail_throw, int writer_nice) {
                 ckpt::WriterOptions o;
                 o.writer_nice = writer_nice;
                 o.max_pending = max_pending;
                 o.copy_threads = copy_threads;
                 o.direct_io = direct_io;
                 o.sync = sync;
                 o.fault.fail_after_bytes = fail_after_bytes;
                 o.fault.error_number = fail_errno;
                 o.fault.throw_exception = fail_throw;
                 return std::make_unique<ckpt::CheckpointWriter>(o);
             }),
             py::arg("max_pending") = 1, py::arg("copy_threads") = 2, py::arg("direct_io") = true,
             py::arg("sync") = true, py::arg("fail_after_bytes") = UINT64_MAX, py::arg("fail_errno") = 0,
             py::arg("fail_throw") = false, py::arg("writer_nice") = 10)
        .def("plan",
             [](ckpt::CheckpointWriter&, const std::string& path, const py::bytes& pickle,
                const std::vector<Source>& sources) {
                 const ckpt::ArchiveLayout l = ckpt::plan_archive(checkpoint_request(path, pickle, sources));
                 return py::make_tuple(l.record_offsets, l.staging_size, l.file_size);
             },
             py::arg("path"), py::arg("pickle"), py::arg("sources"),
             "(payload offset of each source, staging bytes needed, file bytes)")
        .def("submit",
             [](ckpt::CheckpointWriter& w, const std::string& path, const py::bytes& pickle,
                const std::vector<Source>& sources, uintptr_t staging, uint64_t staging_capacity,
                std::shared_ptr<ckpt::Gate> gate, int keep_last, const std::string& prefix,
                const std::string& suffix, int copy_threads, bool block) {
                 ckpt::SaveRequest r = checkpoint_request(path, pickle, sources);
                 r.staging = reinterpret_cast<void*>(staging);
                 r.staging_capacity = staging_capacity;
                 r.gate = std::move(gate);
                 r.retention = {keep_last, prefix, suffix};
                 r.copy_threads = copy_threads;
                 py::gil_scoped_release release;
                 return block ? w.submit(std::move(r)) : w.try_submit(std::move(r));
             },
             py::arg("path"), py::arg("pickle"), py::arg("sources"), py::arg("staging") = 0,
             py::arg("staging_capacity") = 0, py::arg("gate") = nullptr, py::arg("keep_last") = 0,
             py::arg("prefix") = "", py::arg("suffix") = "", py::arg("copy_threads") = 0, py::arg("block") = true)
        .def("write_tensors",
             [](ckpt::CheckpointWriter& w, const std::string& path,
                const std::vector<std::tuple<std::string, int, std::vector<int64_t>, std::vector<int64_t>, uintptr_t,
                                             int64_t, uint64_t, bool>>& tensors) {
                 std::vector<ckpt::TensorRef> refs;
                 for (const auto& [name, dtype, shape, strides, ptr, offset, bytes, grad] : tensors) {
                     if (dtype < 0 || dtype > int(ckpt::ScalarType::Bool))
                         throw std::invalid_argument("tensor '" + name + "': unknown dtype code " + std::to_string(dtype));
                     refs.push_back({name, static_cast<ckpt::ScalarType>(dtype), shape, strides,
                                     reinterpret_cast<const void*>(ptr), offset, bytes, grad});
                 }
                 py::gil_scoped_release release;
                 return ckpt::write_tensors(w, path, refs);
             },
             py::arg("path"), py::arg("tensors"),
             "Queue {name: tensor} from (name, dtype code, shape, strides, storage address, storage offset, "
             "storage bytes, requires_grad) tuples; the C++ tensor-dict writer.")
        .def("wait_all", &ckpt::CheckpointWriter::wait_all, py::call_guard<py::gil_scoped_release>())
        .def("close", &ckpt::CheckpointWriter::close, py::call_guard<py::gil_scoped_release>());
}
}  // namespace
// ==== end of checkpoint writer ======================================================

// ==== Fused QRNN gates (layers): see <qrnn/qrnn_gates.hpp> =============================
// Fast-call entry points like ForgetMult's: forget_scale (a float) first, then integers.

namespace {

// Reads a float then exactly N integers; false (with a Python error set) otherwise.
template <size_t N>
bool parse_scale_and_ints(const char* fn, PyObject* const* args, Py_ssize_t nargs, double& scale,
                          int64_t (&out)[N]) {
    if (nargs != Py_ssize_t(N + 1)) {
        PyErr_Format(PyExc_TypeError, "%s takes a float and %d integer arguments, got %zd arguments", fn, int(N),
                     nargs);
        return false;
    }
    scale = PyFloat_AsDouble(args[0]);
    if (scale == -1.0 && PyErr_Occurred()) return false;
    return parse_ints(fn, args + 1, nargs - 1, out);
}

// The fields both directions share, in argument order:
// dtype, T, B, H, output_gate, gates[4], gate_stride, mask[4], c0[3], c0_dtype, lengths[2], reverse
template <typename Params>
void read_gates_common(ArgReader& r, double scale, Params& p) {
    p.dtype = r.dtype();
    p.seq_len = r.next();
    p.batch = r.next();
    p.hidden = r.next();
    p.output_gate = r.next() != 0;
    p.gates = r.cview3();
    p.gate_stride = r.next();
    p.forget_mask = r.cview3();
    p.forget_scale = scale;
    p.c0 = r.cview2();
    p.c0_dtype = r.dtype();
    p.lengths = static_cast<const int64_t*>(r.cptr());
    p.lengths_stride = r.next();
    p.reverse = r.next() != 0;
}

// <common>, output[4], states[4], c_n[3], c_n_dtype: the first 33 integers of qrnn_gates_forward's.
qrnn::QrnnGatesForwardParams read_gates_forward(const int64_t* a, double scale) {
    qrnn::QrnnGatesForwardParams p;
    ArgReader r{a};
    read_gates_common(r, scale, p);
    p.output = r.mview3();
    p.states = r.mview3();
    p.c_n = r.mview2();
    p.c_n_dtype = r.dtype();
    return p;
}

// <common>, states[4], grad_output[4], grad_c_n[3], c_n_dtype, grad_gates[4], grad_gate_stride,
// grad_c0[3]: the first 41 integers of qrnn_gates_backward's.
qrnn::QrnnGatesBackwardParams read_gates_backward(const int64_t* a, double scale) {
    qrnn::QrnnGatesBackwardParams p;
    ArgReader r{a};
    read_gates_common(r, scale, p);
    p.states = r.cview3();
    p.grad_output = r.cview3();
    p.grad_c_n = r.cview2();
    p.c_n_dtype = r.dtype();
    p.grad_gates = r.mview3();
    p.grad_gate_stride = r.next();
    p.grad_c0 = r.mview2();
    return p;
}

// qrnn_gates_forward(forget_scale, <common>, output[4], states[4], c_n[3], c_n_dtype, num_threads)
PyObject* qrnn_gates_forward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    double scale;
    int64_t a[34];
    if (!parse_scale_and_ints("qrnn_gates_forward", args, nargs, scale, a)) return nullptr;
    return run_kernel(work_of(a[1], a[2], a[3]),
                      [&] { qrnn::cpu::qrnn_gates_forward(read_gates_forward(a, scale), int(a[33])); });
}

// qrnn_gates_backward(forget_scale, <common>, states[4], grad_output[4], grad_c_n[3], c_n_dtype,
//                     grad_gates[4], grad_gate_stride, grad_c0[3], num_threads)
PyObject* qrnn_gates_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    double scale;
    int64_t a[42];
    if (!parse_scale_and_ints("qrnn_gates_backward", args, nargs, scale, a)) return nullptr;
    return run_kernel(work_of(a[1], a[2], a[3]),
                      [&] { qrnn::cpu::qrnn_gates_backward(read_gates_backward(a, scale), int(a[41])); });
}

PyMethodDef gates_methods[] = {
    {"qrnn_gates_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(qrnn_gates_forward)),
     METH_FASTCALL,
     "qrnn_gates_forward(forget_scale, dtype, T, B, H, output_gate, gates[4], gate_stride, mask[4], c0[3], "
     "c0_dtype, lengths_ptr, lengths_stride, reverse, output[4], states[4], c_n[3], c_n_dtype, num_threads): "
     "fused QRNN gates forward on the CPU; each [n] is a pointer (0: absent) and its strides"},
    {"qrnn_gates_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(qrnn_gates_backward)),
     METH_FASTCALL,
     "qrnn_gates_backward(forget_scale, dtype, T, B, H, output_gate, gates[4], gate_stride, mask[4], c0[3], "
     "c0_dtype, lengths_ptr, lengths_stride, reverse, states[4], grad_output[4], grad_c_n[3], c_n_dtype, "
     "grad_gates[4], grad_gate_stride, grad_c0[3], num_threads): fused QRNN gates backward on the CPU"},
    {nullptr, nullptr, 0, nullptr},
};

void bind_qrnn_gates(py::module_& m) {
    add_fastcall_functions(m, gates_methods);
}

}  // namespace
// ==== end of fused QRNN gates =======================================================

// ==== CUDA kernels (qrnn.ops_cuda) ==================================================
// Built when the library has them. The launchers take the CPU entry points' integers
// with the stream (a cudaStream_t as an integer, read by Python on every call) and the
// schedule in place of num_threads. A launch only queues work, so the GIL stays held.
#if defined(QRNN_WITH_CUDA)
namespace {

qrnn::cuda::Schedule schedule_of(int64_t code) {
    if (code < 0 || code > 2) throw std::invalid_argument("schedule must be 0..2, got " + std::to_string(code));
    return static_cast<qrnn::cuda::Schedule>(code);
}

void* stream_of(int64_t handle) { return reinterpret_cast<void*>(static_cast<uintptr_t>(handle)); }
const void* cptr(uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* mptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

// cuda_forget_mult_forward(<20 forward integers>, stream, schedule)
PyObject* cuda_forget_mult_forward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    int64_t a[22];
    if (!parse_ints("cuda_forget_mult_forward", args, nargs, a)) return nullptr;
    return run_kernel(0, [&] { qrnn::cuda::forget_mult_forward(read_forward(a), stream_of(a[20]), schedule_of(a[21])); });
}

// cuda_forget_mult_backward(<35 backward integers>, stream, schedule)
PyObject* cuda_forget_mult_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    int64_t a[37];
    if (!parse_ints("cuda_forget_mult_backward", args, nargs, a)) return nullptr;
    return run_kernel(0, [&] {
        qrnn::cuda::forget_mult_backward(read_backward(a), stream_of(a[35]), schedule_of(a[36]));
    });
}

template <typename Plan>
PyObject* plan_tuple(Plan&& plan) {
    try {
        const qrnn::cuda::LaunchPlan p = plan();
        return Py_BuildValue("(ii)", p.vector_width, p.chunks);
    } catch (const std::invalid_argument& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return nullptr;
}

// cuda_forget_mult_forward_plan(<20 forward integers>, schedule) -> (vector_width, chunks)
PyObject* cuda_forget_mult_forward_plan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    int64_t a[21];
    if (!parse_ints("cuda_forget_mult_forward_plan", args, nargs, a)) return nullptr;
    return plan_tuple([&] { return qrnn::cuda::forget_mult_forward_plan(read_forward(a), schedule_of(a[20])); });
}

// cuda_forget_mult_backward_plan(<35 backward integers>, schedule) -> (vector_width, chunks)
PyObject* cuda_forget_mult_backward_plan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    int64_t a[36];
    if (!parse_ints("cuda_forget_mult_backward_plan", args, nargs, a)) return nullptr;
    return plan_tuple([&] { return qrnn::cuda::forget_mult_backward_plan(read_backward(a), schedule_of(a[35])); });
}

// cuda_qrnn_gates_forward(forget_scale, <33 forward integers>, stream)
PyObject* cuda_qrnn_gates_forward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    double scale;
    int64_t a[34];
    if (!parse_scale_and_ints("cuda_qrnn_gates_forward", args, nargs, scale, a)) return nullptr;
    return run_kernel(0, [&] { qrnn::cuda::qrnn_gates_forward(read_gates_forward(a, scale), stream_of(a[33])); });
}

// cuda_qrnn_gates_backward(forget_scale, <41 backward integers>, stream)
PyObject* cuda_qrnn_gates_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    double scale;
    int64_t a[42];
    if (!parse_scale_and_ints("cuda_qrnn_gates_backward", args, nargs, scale, a)) return nullptr;
    return run_kernel(0, [&] { qrnn::cuda::qrnn_gates_backward(read_gates_backward(a, scale), stream_of(a[41])); });
}

// cuda_qrnn_gates_{forward,backward}_width(forget_scale, <integers>) -> (hidden units per thread, 1), host-only
PyObject* cuda_qrnn_gates_forward_width(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    double scale;
    int64_t a[33];
    if (!parse_scale_and_ints("cuda_qrnn_gates_forward_width", args, nargs, scale, a)) return nullptr;
    return plan_tuple([&] {
        return qrnn::cuda::LaunchPlan{qrnn::cuda::qrnn_gates_forward_vector_width(read_gates_forward(a, scale)), 1};
    });
}

PyObject* cuda_qrnn_gates_backward_width(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    double scale;
    int64_t a[41];
    if (!parse_scale_and_ints("cuda_qrnn_gates_backward_width", args, nargs, scale, a)) return nullptr;
    return plan_tuple([&] {
        return qrnn::cuda::LaunchPlan{qrnn::cuda::qrnn_gates_backward_vector_width(read_gates_backward(a, scale)), 1};
    });
}

#define QRNN_FASTCALL(fn) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn)), METH_FASTCALL
PyMethodDef cuda_kernel_methods[] = {
    {"cuda_forget_mult_forward", QRNN_FASTCALL(cuda_forget_mult_forward),
     "cuda_forget_mult_forward(<forget_mult_forward's integers but num_threads>, stream, schedule): launch the "
     "CUDA forward on stream (a cudaStream_t) of the current device; schedule 0 auto, 1 serial, 2 chunked"},
    {"cuda_forget_mult_backward", QRNN_FASTCALL(cuda_forget_mult_backward),
     "cuda_forget_mult_backward(<forget_mult_backward's integers but num_threads>, stream, schedule)"},
    {"cuda_forget_mult_forward_plan", QRNN_FASTCALL(cuda_forget_mult_forward_plan),
     "cuda_forget_mult_forward_plan(<forward integers>, schedule) -> (vector_width, chunks), host-only"},
    {"cuda_forget_mult_backward_plan", QRNN_FASTCALL(cuda_forget_mult_backward_plan),
     "cuda_forget_mult_backward_plan(<backward integers>, schedule) -> (vector_width, chunks), host-only"},
    {"cuda_qrnn_gates_forward", QRNN_FASTCALL(cuda_qrnn_gates_forward),
     "cuda_qrnn_gates_forward(<qrnn_gates_forward's arguments but num_threads>, stream): fused gates forward on "
     "stream (a cudaStream_t) of the current device; lengths in device memory"},
    {"cuda_qrnn_gates_backward", QRNN_FASTCALL(cuda_qrnn_gates_backward),
     "cuda_qrnn_gates_backward(<qrnn_gates_backward's arguments but num_threads>, stream)"},
    {"cuda_qrnn_gates_forward_width", QRNN_FASTCALL(cuda_qrnn_gates_forward_width),
     "cuda_qrnn_gates_forward_width(<forward arguments but num_threads>) -> (vector_width, 1), host-only"},
    {"cuda_qrnn_gates_backward_width", QRNN_FASTCALL(cuda_qrnn_gates_backward_width),
     "cuda_qrnn_gates_backward_width(<backward arguments but num_threads>) -> (vector_width, 1), host-only"},
    {nullptr, nullptr, 0, nullptr},
};
#undef QRNN_FASTCALL

void bind_cuda(py::module_& m) {
    add_fastcall_functions(m, cuda_kernel_methods);
    // The original one-thread-per-column float32 design, for the GPU benchmark only.
    m.def("cuda_baseline_forget_mult_forward",
          [](uintptr_t f, uintptr_t x, uintptr_t h_with_h0, int64_t T, int64_t B, int64_t H, uintptr_t stream) {
              qrnn::cuda::bench::baseline_forget_mult_forward(
                  static_cast<const float*>(cptr(f)), static_cast<const float*>(cptr(x)),
                  static_cast<float*>(mptr(h_with_h0)), T, B, H, mptr(stream));
          });
    m.def("cuda_baseline_forget_mult_backward",
          [](uintptr_t f, uintptr_t x, uintptr_t h_with_h0, uintptr_t grad_h, uintptr_t grad_f, uintptr_t grad_x,
             uintptr_t grad_h0, int64_t T, int64_t B, int64_t H, uintptr_t stream) {
              qrnn::cuda::bench::baseline_forget_mult_backward(
                  static_cast<const float*>(cptr(f)), static_cast<const float*>(cptr(x)),
                  static_cast<const float*>(cptr(h_with_h0)), static_cast<const float*>(cptr(grad_h)),
                  static_cast<float*>(mptr(grad_f)), static_cast<float*>(mptr(grad_x)),
                  static_cast<float*>(mptr(grad_h0)), T, B, H, mptr(stream));
          });
}

}  // namespace
#endif  // QRNN_WITH_CUDA
// ==== end of CUDA kernels ===========================================================

PYBIND11_MODULE(_C, m) {
    m.doc() = "torch-free kernels of torch-qrnn (pointers and strides in, nothing allocated)";

    add_fastcall_functions(m, kernel_methods);

    m.def("build_info", [] {
        const qrnn::BuildInfo info = qrnn::build_info();
        py::dict d;
        d["version"] = info.version;
        d["compiler"] = info.compiler;
        d["build_type"] = info.build_type;
        d["simd"] = info.simd;
        d["cuda"] = info.cuda;
        d["cuda_architectures"] = info.cuda_architectures;
        return d;
    });

    bind_checkpoint(m);  // qrnn.checkpoint
    bind_qrnn_gates(m);  // qrnn.qrnn_gates (layers)
#if defined(QRNN_WITH_CUDA)
    bind_cuda(m);  // qrnn.ops_cuda
#endif
}
