// The one binding file: exposes the torch-free core to Python with pybind11.
// Tensors cross as (data pointer, strides) integers; this module never links libtorch,
// so one wheel serves every torch release. Every kernel call releases the GIL.
// std::invalid_argument from the core arrives in Python as ValueError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>

#include "qrnn/build_info.hpp"
#include "qrnn/checkpoint.hpp"
#include "qrnn/forget_mult.hpp"

namespace py = pybind11;
using Strides3 = std::array<int64_t, 3>;  // element strides in (time, batch, hidden) order
using Strides2 = std::array<int64_t, 2>;  // (batch, hidden)

namespace {

const void* cptr(uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* mptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
qrnn::ConstView3 cview(uintptr_t p, const Strides3& s) { return {cptr(p), s[0], s[1], s[2]}; }
qrnn::View3 mview(uintptr_t p, const Strides3& s) { return {mptr(p), s[0], s[1], s[2]}; }

qrnn::DType to_dtype(int code) {
    if (code < 0 || code > 3) throw std::invalid_argument("dtype code must be 0..3, got " + std::to_string(code));
    return static_cast<qrnn::DType>(code);
}

qrnn::ForgetMultForwardParams forward_params(int dtype, int64_t T, int64_t B, int64_t H,
                                             uintptr_t f, const Strides3& sf, uintptr_t x, const Strides3& sx,
                                             uintptr_t h0, const Strides2& sh0, int h0_dtype,
                                             uintptr_t h, const Strides3& sh) {
    qrnn::ForgetMultForwardParams p;
    p.seq_len = T;
    p.batch = B;
    p.hidden = H;
    p.dtype = to_dtype(dtype);
    p.f = cview(f, sf);
    p.x = cview(x, sx);
    p.h0 = {cptr(h0), sh0[0], sh0[1]};
    p.h0_dtype = to_dtype(h0_dtype);
    p.h = mview(h, sh);
    return p;
}

}  // namespace

// ==== Checkpoint writer (qrnn.checkpoint) ===========================================
// Thin wrappers over <qrnn/checkpoint.hpp>. Buffers cross as (address, bytes) integers;
// every call that can wait or copy releases the GIL, and the writer's threads never touch
// Python objects.
#include <optional>
#include <tuple>

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

PYBIND11_MODULE(_C, m) {
    m.doc() = "torch-free kernels of torch-qrnn (pointers and strides in, nothing allocated)";

    m.def("forget_mult_forward",
          [](int dtype, int64_t T, int64_t B, int64_t H, uintptr_t f, const Strides3& sf, uintptr_t x,
             const Strides3& sx, uintptr_t h0, const Strides2& sh0, int h0_dtype, uintptr_t h,
             const Strides3& sh, int num_threads) {
              const auto p = forward_params(dtype, T, B, H, f, sf, x, sx, h0, sh0, h0_dtype, h, sh);
              py::gil_scoped_release release;
              qrnn::cpu::forget_mult_forward(p, num_threads);
          });

    m.def("forget_mult_backward",
          [](int dtype, int64_t T, int64_t B, int64_t H, uintptr_t f, const Strides3& sf, uintptr_t x,
             const Strides3& sx, uintptr_t h, const Strides3& sh, uintptr_t h0, const Strides2& sh0,
             int h0_dtype, uintptr_t grad_h, const Strides3& sgh, uintptr_t grad_f, const Strides3& sgf,
             uintptr_t grad_x, const Strides3& sgx, uintptr_t grad_h0, const Strides2& sgh0, int num_threads) {
              qrnn::ForgetMultBackwardParams p;
              p.seq_len = T;
              p.batch = B;
              p.hidden = H;
              p.dtype = to_dtype(dtype);
              p.f = cview(f, sf);
              p.x = cview(x, sx);
              p.h = cview(h, sh);
              p.h0 = {cptr(h0), sh0[0], sh0[1]};
              p.h0_dtype = to_dtype(h0_dtype);
              p.grad_h = cview(grad_h, sgh);
              p.grad_f = mview(grad_f, sgf);
              p.grad_x = mview(grad_x, sgx);
              p.grad_h0 = {mptr(grad_h0), sgh0[0], sgh0[1]};
              py::gil_scoped_release release;
              qrnn::cpu::forget_mult_backward(p, num_threads);
          });

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
}
