// The one binding file: exposes the torch-free core to Python.
//
// Tensors cross as integers: a data pointer and element strides per array; this module
// never links libtorch, so one wheel serves every torch release. std::invalid_argument
// from the core arrives in Python as ValueError, other exceptions as RuntimeError.
//
// The kernel entry points are called on every forward/backward, so they bypass
// pybind11's generic argument conversion (microseconds at 20+ arguments) and take their
// parameter struct as a flat list of numbers through CPython's METH_FASTCALL protocol.
// That list is defined once, in kernel_args.hpp, and exported as kernel_fields(), from
// which qrnn.ops builds its arguments. Everything else uses pybind11.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <type_traits>

#include "kernel_args.hpp"
#include "qrnn/build_info.hpp"
#include "qrnn/checkpoint.hpp"
#include "qrnn/forget_mult.hpp"
#include "qrnn/forget_mult_cuda.hpp"
#include "qrnn/qrnn_gates.hpp"
#include "qrnn/qrnn_gates_cuda.hpp"

namespace py = pybind11;

namespace {

namespace args = qrnn::args;

// Below this many element-steps a kernel finishes in about a microsecond: keep the GIL
// (re-acquiring it can wait a whole switch interval when other Python threads run).
constexpr int64_t kReleaseGilWork = 1 << 14;

// The numbers of one fast call: the parameter list of `List`, then `Extra` trailing
// integers (num_threads on the CPU; stream and schedule for CUDA launches).
template <typename List, int Extra>
struct FastCall {
    int64_t ints[List::ints + Extra];
    double reals[List::reals + 1];

    // False (with a Python error set) unless `argv` holds exactly those numbers.
    bool parse(PyObject* const* argv, Py_ssize_t nargs) {
        constexpr Py_ssize_t expected = List::ints + List::reals + Extra;
        if (nargs != expected) {
            PyErr_Format(PyExc_TypeError,
                         "%s takes %zd arguments (the fields of _C.kernel_fields()['%s'] and %d more), got %zd",
                         List::name, expected, List::name, Extra, nargs);
            return false;
        }
        int64_t* next_int = ints;
        double* next_real = reals;
        Py_ssize_t i = 0;
        for (const int slots : List::slots) {
            if (slots == 0) {  // a `real` field: one float
                *next_real = PyFloat_AsDouble(argv[i++]);
                if (*next_real++ == -1.0 && PyErr_Occurred()) return false;
                continue;
            }
            for (int k = 0; k < slots; ++k)
                if (!read_int(argv[i++], *next_int++)) return false;
        }
        for (int k = 0; k < Extra; ++k)
            if (!read_int(argv[i++], *next_int++)) return false;
        return true;
    }
    typename List::params params() const { return List::read(ints, reals); }
    int64_t extra(int k) const { return ints[List::ints + k]; }

private:
    static bool read_int(PyObject* o, int64_t& out) {
        // Python < 3.10 converts a float through __int__ (with a DeprecationWarning) where
        // later versions raise: accept only integers (objects with __index__) on all.
        if (!PyIndex_Check(o)) {
            PyErr_Format(PyExc_TypeError, "%s: an integer argument got %s", List::name, Py_TYPE(o)->tp_name);
            return false;
        }
        out = PyLong_AsLongLong(o);
        return !(out == -1 && PyErr_Occurred());
    }
};

PyObject* to_python() { Py_RETURN_NONE; }
#if defined(QRNN_WITH_CUDA)
PyObject* to_python(const qrnn::cuda::LaunchPlan& p) { return Py_BuildValue("(ii)", p.vector_width, p.chunks); }
#endif

// Parses a fast call of `List` and runs `body(params, call)` with exceptions translated,
// releasing the GIL around large work when `may_release_gil` (CPU kernels; a CUDA launch
// only queues work). Returns body's result as a Python object (None for void).
template <typename List, int Extra, typename Body>
PyObject* fast_call(PyObject* const* argv, Py_ssize_t nargs, bool may_release_gil, Body&& body) {
    FastCall<List, Extra> call;
    if (!call.parse(argv, nargs)) return nullptr;
    try {
        const typename List::params p = call.params();
        if constexpr (std::is_void_v<decltype(body(p, call))>) {
            const bool sized = p.seq_len > 0 && p.batch > 0 && p.hidden > 0;  // sizes are re-checked by the core
            if (may_release_gil && sized && p.seq_len * p.batch * p.hidden >= kReleaseGilWork) {
                py::gil_scoped_release release;
                body(p, call);
            } else {
                body(p, call);
            }
            return to_python();
        } else {
            return to_python(body(p, call));
        }
    } catch (const std::invalid_argument& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return nullptr;
}

// Defines `fn(PyObject*, argv, nargs)` as a fast call of list `List` with `Extra` trailing integers.
#define QRNN_FAST_ENTRY(fn, List, Extra, release_gil, ...)                                          \
    PyObject* fn(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {                               \
        return fast_call<args::List, Extra>(argv, nargs, release_gil,                                \
                                            [&](const auto& p, const auto& call) { __VA_ARGS__; }); \
    }
#define QRNN_FASTCALL(fn) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn)), METH_FASTCALL

// Adds a null-terminated table of METH_FASTCALL functions to the module.
void add_fastcall_functions(py::module_& m, PyMethodDef* table) {
    for (PyMethodDef* def = table; def->ml_name; ++def)
        m.add_object(def->ml_name, py::reinterpret_steal<py::object>(PyCFunction_NewEx(def, nullptr, m.ptr())));
}

// ==== CPU kernels: <qrnn/forget_mult.hpp>, <qrnn/qrnn_gates.hpp> =======================
// Each takes its list's numbers, then num_threads.

QRNN_FAST_ENTRY(forget_mult_forward, forget_mult_forward, 1, true,
                qrnn::cpu::forget_mult_forward(p, int(call.extra(0))))
QRNN_FAST_ENTRY(forget_mult_backward, forget_mult_backward, 1, true,
                qrnn::cpu::forget_mult_backward(p, int(call.extra(0))))
QRNN_FAST_ENTRY(qrnn_gates_forward, qrnn_gates_forward, 1, true,
                qrnn::cpu::qrnn_gates_forward(p, int(call.extra(0))))
QRNN_FAST_ENTRY(qrnn_gates_backward, qrnn_gates_backward, 1, true,
                qrnn::cpu::qrnn_gates_backward(p, int(call.extra(0))))

PyMethodDef cpu_kernel_methods[] = {
    {"forget_mult_forward", QRNN_FASTCALL(forget_mult_forward),
     "forget_mult_forward(<kernel_fields()['forget_mult_forward']>, num_threads): CPU ForgetMult forward"},
    {"forget_mult_backward", QRNN_FASTCALL(forget_mult_backward),
     "forget_mult_backward(<kernel_fields()['forget_mult_backward']>, num_threads): CPU ForgetMult backward"},
    {"qrnn_gates_forward", QRNN_FASTCALL(qrnn_gates_forward),
     "qrnn_gates_forward(<kernel_fields()['qrnn_gates_forward']>, num_threads): fused QRNN gates forward"},
    {"qrnn_gates_backward", QRNN_FASTCALL(qrnn_gates_backward),
     "qrnn_gates_backward(<kernel_fields()['qrnn_gates_backward']>, num_threads): fused QRNN gates backward"},
    {nullptr, nullptr, 0, nullptr},
};

// {list name: ((kind, field), ...)}: the argument lists qrnn.ops builds its calls from.
py::dict kernel_fields() {
    py::dict lists;
#define QRNN_EXPORT_LIST(kernel, Params, FIELDS)                                               \
    {                                                                                          \
        py::list fields;                                                                       \
        for (const args::Field& f : args::kernel::fields) fields.append(py::make_tuple(f.kind, f.name)); \
        lists[#kernel] = py::tuple(fields);                                                    \
    }
    QRNN_KERNEL_ARG_LISTS(QRNN_EXPORT_LIST)
#undef QRNN_EXPORT_LIST
    return lists;
}

// {torch dtype name: qrnn::DType code}
py::dict dtype_codes() {
    py::dict codes;
    for (auto d : {qrnn::DType::float32, qrnn::DType::float64, qrnn::DType::bfloat16, qrnn::DType::float16})
        codes[qrnn::dtype_name(d)] = static_cast<int>(d);
    return codes;
}

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

    // Folder rules (names, commit order, temporaries, staging sizes) live in C++ only.
    m.def("checkpoint_file_name", &ckpt::checkpoint_file_name, py::arg("prefix"), py::arg("step"), py::arg("suffix"));
    m.def("checkpoint_parse_name",
          [](const std::string& name, const std::string& prefix, const std::string& suffix) -> py::object {
              uint64_t step;
              if (!ckpt::parse_checkpoint_name(name, prefix, suffix, &step)) return py::none();
              return py::int_(step);
          },
          py::arg("name"), py::arg("prefix"), py::arg("suffix"), "The step of a final name, or None.");
    m.def("checkpoint_is_temporary", &ckpt::is_temporary_name, py::arg("name"));
    m.def("checkpoint_list",
          [](const std::string& folder, const std::string& prefix, const std::string& suffix, bool by_step) {
              std::vector<ckpt::CommittedFile> files;
              {
                  py::gil_scoped_release release;
                  try {
                      files = ckpt::list_checkpoints(folder, prefix, suffix,
                                                     by_step ? ckpt::CheckpointOrder::Step : ckpt::CheckpointOrder::Commit);
                  } catch (const std::system_error& e) {
                      py::gil_scoped_acquire acquire;
                      errno = e.code().value();
                      PyErr_SetFromErrnoWithFilename(PyExc_OSError, folder.c_str());
                      throw py::error_already_set();
                  }
              }
              py::list out;
              for (const auto& f : files) out.append(py::make_tuple(f.name, f.step, f.commit_ns));
              return out;
          },
          py::arg("folder"), py::arg("prefix"), py::arg("suffix"), py::arg("by_step") = false,
          "[(name, step, commit_ns)] of committed checkpoints, oldest commit (or step) first.");
    m.def("checkpoint_remove_stale_temporaries", &ckpt::remove_stale_temporaries, py::arg("folder"),
          py::call_guard<py::gil_scoped_release>());
    m.def("checkpoint_staging_capacity", &ckpt::staging_capacity, py::arg("bytes"));
    m.attr("checkpoint_staging_alignment") = ckpt::kStagingAlignment;

    py::class_<ckpt::StagingBuffer>(m, "CheckpointStaging")
        .def(py::init([](uint64_t bytes) {
                 py::gil_scoped_release release;
                 return std::make_unique<ckpt::StagingBuffer>(bytes);
             }),
             py::arg("bytes"))
        .def_property_readonly("address", [](const ckpt::StagingBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
        .def_property_readonly("capacity", &ckpt::StagingBuffer::size)
        .def("populate", &ckpt::StagingBuffer::populate, py::arg("offset") = 0, py::arg("length") = UINT64_MAX,
             py::arg("threads") = 1, py::call_guard<py::gil_scoped_release>(),
             "Fault [offset, offset + length) in without changing it (safe during a staging copy).");

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
                         int fail_errno, bool fail_throw, int writer_nice, int fail_times) {
                 ckpt::WriterOptions o;
                 o.fault.times = fail_times;
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
             py::arg("fail_throw") = false, py::arg("writer_nice") = 10, py::arg("fail_times") = -1)
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

// ==== CUDA kernels (qrnn.ops_cuda) ==================================================
// Built when the library has them. The launchers take the CPU entry points' numbers with
// the stream (a cudaStream_t as an integer, read by Python on every call), the schedule
// (ForgetMult) and the device index in place of num_threads. A launch only queues work,
// so the GIL stays held.
#if defined(QRNN_WITH_CUDA)
namespace {

namespace cuda = qrnn::cuda;

cuda::Schedule schedule_of(int64_t code) {
    if (code < 0 || code > 2) throw std::invalid_argument("schedule must be 0..2, got " + std::to_string(code));
    return static_cast<cuda::Schedule>(code);
}

void* stream_of(int64_t handle) { return reinterpret_cast<void*>(static_cast<uintptr_t>(handle)); }

QRNN_FAST_ENTRY(cuda_forget_mult_forward, forget_mult_forward, 3, false,
                cuda::forget_mult_forward(p, stream_of(call.extra(0)), schedule_of(call.extra(1)),
                                          int(call.extra(2))))
QRNN_FAST_ENTRY(cuda_forget_mult_backward, forget_mult_backward, 3, false,
                cuda::forget_mult_backward(p, stream_of(call.extra(0)), schedule_of(call.extra(1)),
                                           int(call.extra(2))))
QRNN_FAST_ENTRY(cuda_qrnn_gates_forward, qrnn_gates_forward, 2, false,
                cuda::qrnn_gates_forward(p, stream_of(call.extra(0)), int(call.extra(1))))
QRNN_FAST_ENTRY(cuda_qrnn_gates_backward, qrnn_gates_backward, 2, false,
                cuda::qrnn_gates_backward(p, stream_of(call.extra(0)), int(call.extra(1))))
// Host-only: what a launch would use, for tests and the emulator.
QRNN_FAST_ENTRY(cuda_forget_mult_forward_plan, forget_mult_forward, 1, false,
                return cuda::forget_mult_forward_plan(p, schedule_of(call.extra(0))))
QRNN_FAST_ENTRY(cuda_forget_mult_backward_plan, forget_mult_backward, 1, false,
                return cuda::forget_mult_backward_plan(p, schedule_of(call.extra(0))))
QRNN_FAST_ENTRY(cuda_qrnn_gates_forward_width, qrnn_gates_forward, 0, false,
                return cuda::LaunchPlan{cuda::qrnn_gates_forward_vector_width(p), 1})
QRNN_FAST_ENTRY(cuda_qrnn_gates_backward_width, qrnn_gates_backward, 0, false,
                return cuda::LaunchPlan{cuda::qrnn_gates_backward_vector_width(p), 1})

PyMethodDef cuda_kernel_methods[] = {
    {"cuda_forget_mult_forward", QRNN_FASTCALL(cuda_forget_mult_forward),
     "cuda_forget_mult_forward(<forget_mult_forward's fields>, stream, schedule, device): launch on stream "
     "(a cudaStream_t) of device (made current for the launch); schedule: a code of cuda_schedules()"},
    {"cuda_forget_mult_backward", QRNN_FASTCALL(cuda_forget_mult_backward),
     "cuda_forget_mult_backward(<forget_mult_backward's fields>, stream, schedule, device)"},
    {"cuda_qrnn_gates_forward", QRNN_FASTCALL(cuda_qrnn_gates_forward),
     "cuda_qrnn_gates_forward(<qrnn_gates_forward's fields>, stream, device): lengths in device memory"},
    {"cuda_qrnn_gates_backward", QRNN_FASTCALL(cuda_qrnn_gates_backward),
     "cuda_qrnn_gates_backward(<qrnn_gates_backward's fields>, stream, device)"},
    {"cuda_forget_mult_forward_plan", QRNN_FASTCALL(cuda_forget_mult_forward_plan),
     "cuda_forget_mult_forward_plan(<fields>, schedule) -> (vector_width, chunks), host-only"},
    {"cuda_forget_mult_backward_plan", QRNN_FASTCALL(cuda_forget_mult_backward_plan),
     "cuda_forget_mult_backward_plan(<fields>, schedule) -> (vector_width, chunks), host-only"},
    {"cuda_qrnn_gates_forward_width", QRNN_FASTCALL(cuda_qrnn_gates_forward_width),
     "cuda_qrnn_gates_forward_width(<fields>) -> (vector_width, 1), host-only"},
    {"cuda_qrnn_gates_backward_width", QRNN_FASTCALL(cuda_qrnn_gates_backward_width),
     "cuda_qrnn_gates_backward_width(<fields>) -> (vector_width, 1), host-only"},
    {nullptr, nullptr, 0, nullptr},
};

const void* cptr(uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* mptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

void bind_cuda(py::module_& m) {
    add_fastcall_functions(m, cuda_kernel_methods);
    m.def("cuda_schedules", [] {
        py::dict d;
        d["auto"] = int(cuda::Schedule::automatic);
        d["serial"] = int(cuda::Schedule::serial);
        d["chunked"] = int(cuda::Schedule::chunked);
        return d;
    }, "{name: code} of qrnn::cuda::Schedule, the last argument of the ForgetMult launchers");
    // The original one-thread-per-column float32 design, for the GPU benchmark only.
    m.def("cuda_baseline_forget_mult_forward",
          [](uintptr_t f, uintptr_t x, uintptr_t h_with_h0, int64_t T, int64_t B, int64_t H, uintptr_t stream) {
              cuda::bench::baseline_forget_mult_forward(
                  static_cast<const float*>(cptr(f)), static_cast<const float*>(cptr(x)),
                  static_cast<float*>(mptr(h_with_h0)), T, B, H, mptr(stream));
          });
    m.def("cuda_baseline_forget_mult_backward",
          [](uintptr_t f, uintptr_t x, uintptr_t h_with_h0, uintptr_t grad_h, uintptr_t grad_f, uintptr_t grad_x,
             uintptr_t grad_h0, int64_t T, int64_t B, int64_t H, uintptr_t stream) {
              cuda::bench::baseline_forget_mult_backward(
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

    add_fastcall_functions(m, cpu_kernel_methods);
    m.def("kernel_fields", &kernel_fields,
          "{kernel: ((kind, field), ...)}: the parameter list each kernel entry point takes, in order");
    m.def("dtype_codes", &dtype_codes, "{dtype name: code} of qrnn::DType");

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
#if defined(QRNN_WITH_CUDA)
    bind_cuda(m);  // qrnn.ops_cuda
#endif
}
