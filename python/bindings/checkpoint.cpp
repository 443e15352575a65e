// qrnn._C's checkpoint writer (qrnn.checkpoint): thin wrappers over <qrnn/checkpoint.hpp>.
// Buffers cross as (address, bytes) integers; every call that can wait or copy releases
// the GIL, and the writer's threads never touch Python objects.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "checkpoint/archive.hpp"
#include "checkpoint/fault_injection.hpp"
#include "qrnn/checkpoint.hpp"

namespace qrnn::bindings {
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
        r.records.push_back({ckpt::detail::storage_record_name(i),
                             reinterpret_cast<const void*>(std::get<0>(sources[i])), std::get<1>(sources[i])});
    return r;
}

// (data.pkl, its sources); a None pickle: a raw part, the sources' bytes one after another.
using Archive = std::tuple<py::object, std::vector<Source>>;

// A request for one archive (`archives` empty) or for several in one file.
ckpt::SaveRequest checkpoint_request(const std::string& path, const py::bytes& pickle,
                                     const std::vector<Source>& sources, const std::vector<Archive>& archives) {
    ckpt::SaveRequest r = checkpoint_request(path, pickle, sources);
    for (const auto& [part_pickle, part_sources] : archives) {
        const bool raw = part_pickle.is_none();
        const ckpt::SaveRequest part =
            checkpoint_request("archive", raw ? py::bytes() : py::bytes(part_pickle), part_sources);
        r.archives.push_back({"archive", part.pickle, part.records, raw});
    }
    return r;
}

// A request's settings other than its contents and staging image.
void set_options(ckpt::SaveRequest& r, int keep_last, const std::string& prefix, const std::string& suffix,
                 int copy_threads, std::shared_ptr<ckpt::CheckpointFolder> folder, unsigned file_mode) {
    r.retention = {keep_last, prefix, suffix};
    r.copy_threads = copy_threads;
    r.folder = std::move(folder);
    r.file_mode = file_mode;
}

ckpt::WriterOptions writer_options(int max_pending, int copy_threads, bool direct_io, bool sync, int writer_nice) {
    ckpt::WriterOptions o;
    o.max_pending = max_pending;
    o.copy_threads = copy_threads;
    o.direct_io = direct_io;
    o.sync = sync;
    o.writer_nice = writer_nice;
    return o;
}

// The zip records verify() checks, as archive.hpp writes them.
py::dict zip_format() {
    namespace d = ckpt::detail;
    py::dict z;
    z["local_header_signature"] = d::kLocalHeaderSig;
    z["descriptor_signature"] = d::kDescriptorSig;
    z["central_header_signature"] = d::kCentralSig;
    z["zip64_end_signature"] = d::kEnd64Sig;
    z["zip64_locator_signature"] = d::kLocator64Sig;
    z["end_signature"] = d::kEndSig;
    z["local_header_size"] = d::kLocalHeaderSize;
    z["central_header_size"] = d::kCentralHeaderSize;
    z["zip64_end_size"] = d::kEnd64Size;
    z["zip64_locator_size"] = d::kLocator64Size;
    z["end_size"] = d::kEndSize;
    z["allowed_flags"] = d::kFlagsWithDescriptor | d::kFlagsNoDescriptor;
    z["zip32_limit"] = d::kZip32Limit;
    return z;
}

// (torch dtype name, storage class name) per ScalarType code, in code order.
py::list storage_types() {
    py::list types;
    for (const ckpt::detail::StorageClass& c : ckpt::detail::kStorageClasses)
        types.append(py::make_tuple(c.dtype, c.name));
    return types;
}

// A folder operation's std::system_error as OSError(errno, its one-sentence message).
template <typename F>
auto folder_call(F&& f) {
    try {
        py::gil_scoped_release release;
        return f();
    } catch (const std::system_error& e) {
        // what() is "<sentence>: <strerror>"; the sentence names the errno already.
        std::string message = e.what();
        const std::string tail = ": " + e.code().message();
        if (message.size() > tail.size() && message.compare(message.size() - tail.size(), tail.size(), tail) == 0)
            message.resize(message.size() - tail.size());
        PyErr_SetObject(PyExc_OSError, py::make_tuple(e.code().value(), message).ptr());
        throw py::error_already_set();
    }
}

py::list listing(const std::vector<ckpt::CommittedFile>& files) {
    py::list out;
    for (const auto& f : files) out.append(py::make_tuple(f.name, f.step, f.commit_ns));
    return out;
}

py::object checkpoint_error(const ckpt::SaveStatus& s) {
    if (!s.done() || s.ok()) return py::none();
    const ckpt::SaveError e = s.error();
    return py::make_tuple(e.error_number, e.operation, e.path, e.message);
}

}  // namespace

void bind_checkpoint(py::module_& m) {
    m.def(
        "checkpoint_crc32",
        [](py::buffer data, uint32_t crc) {
            py::buffer_info info = data.request();
            const auto n = static_cast<size_t>(info.size * info.itemsize);
            py::gil_scoped_release release;
            return ckpt::crc32(info.ptr, n, crc);
        },
        py::arg("data"), py::arg("crc") = 0, "CRC-32 (zip) of a buffer, continuing from crc.");

    // Folder rules (names, commit order, temporaries, staging sizes) live in C++ only.
    m.def("checkpoint_file_name", &ckpt::checkpoint_file_name, py::arg("prefix"), py::arg("step"), py::arg("suffix"));
    m.def(
        "checkpoint_parse_name",
        [](const std::string& name, const std::string& prefix, const std::string& suffix) -> py::object {
            uint64_t step;
            if (!ckpt::parse_checkpoint_name(name, prefix, suffix, &step)) return py::none();
            return py::int_(step);
        },
        py::arg("name"), py::arg("prefix"), py::arg("suffix"), "The step of a final name, or None.");
    m.def("checkpoint_is_temporary", &ckpt::is_temporary_name, py::arg("name"));
    m.def(
        "checkpoint_list",
        [](const std::string& folder, const std::string& prefix, const std::string& suffix, bool by_step) {
            std::vector<ckpt::CommittedFile> files;
            {
                py::gil_scoped_release release;
                try {
                    files = ckpt::list_checkpoints(
                        folder, prefix, suffix, by_step ? ckpt::CheckpointOrder::Step : ckpt::CheckpointOrder::Commit);
                } catch (const std::system_error& e) {
                    py::gil_scoped_acquire acquire;
                    errno = e.code().value();
                    PyErr_SetFromErrnoWithFilename(PyExc_OSError, folder.c_str());
                    throw py::error_already_set();
                }
            }
            return listing(files);
        },
        py::arg("folder"), py::arg("prefix"), py::arg("suffix"), py::arg("by_step") = false,
        "[(name, step, commit_ns)] of committed checkpoints, oldest commit (or step) first.");
    m.def("checkpoint_remove_stale_temporaries",
          static_cast<int (*)(const std::string&)>(&ckpt::remove_stale_temporaries), py::arg("folder"),
          py::call_guard<py::gil_scoped_release>());
    m.def("checkpoint_staging_capacity", &ckpt::staging_capacity, py::arg("bytes"));
    m.attr("checkpoint_staging_alignment") = ckpt::kStagingAlignment;
    m.attr("checkpoint_zip_format") = zip_format();
    m.attr("checkpoint_storage_types") = storage_types();

    using Folder = ckpt::CheckpointFolder;
    py::class_<Folder, std::shared_ptr<Folder>>(m, "CheckpointFolder")
        .def(py::init([](const std::string& path, bool create) {
                 return folder_call([&] { return std::make_shared<Folder>(path, create); });
             }),
             py::arg("path"), py::arg("create") = false)
        .def_property_readonly("fd", &Folder::fd)
        .def_property_readonly("path", &Folder::path)
        .def(
            "lock_writer", [](Folder& f, const std::string& prefix) { folder_call([&] { f.lock_writer(prefix); }); },
            py::arg("prefix"))
        .def("unlock_writer", &Folder::unlock_writer)
        .def(
            "write_file",
            [](const Folder& f, const std::string& name, const py::bytes& data, unsigned mode, bool sync) {
                const std::string bytes = data;
                return folder_call([&] { return f.write_file(name, bytes.data(), bytes.size(), mode, sync); });
            },
            py::arg("name"), py::arg("data"), py::arg("mode") = 0666, py::arg("sync") = true, "The warnings.")
        .def(
            "publish",
            [](const Folder& f, const std::string& source, const std::string& name, unsigned mode, bool sync) {
                return folder_call([&] { return f.publish(source, name, mode, sync); });
            },
            py::arg("source"), py::arg("name"), py::arg("mode") = 0666, py::arg("sync") = true, "The warnings.")
        .def(
            "create_temporary",
            [](const Folder& f, const std::string& name, unsigned mode) {
                std::string temporary;
                const int fd = folder_call([&] { return f.create_temporary(name, mode, &temporary); });
                return py::make_tuple(fd, temporary);
            },
            py::arg("name"), py::arg("mode") = 0666, "(descriptor, name) of a new locked temporary for `name`")
        .def(
            "commit",
            [](const Folder& f, int fd, const std::string& temporary, const std::string& name, int keep_last,
               const std::string& prefix, const std::string& suffix, bool sync) {
                return folder_call([&] { return f.commit(fd, temporary, name, {keep_last, prefix, suffix}, sync); });
            },
            py::arg("fd"), py::arg("temporary"), py::arg("name"), py::arg("keep_last") = 0, py::arg("prefix") = "",
            py::arg("suffix") = "", py::arg("sync") = true, "Commit a filled temporary (closes fd); the warnings.")
        .def(
            "list",
            [](const Folder& f, const std::string& prefix, const std::string& suffix, bool by_step) {
                return listing(folder_call([&] {
                    try {
                        return ckpt::list_checkpoints(
                            f.fd(), prefix, suffix,
                            by_step ? ckpt::CheckpointOrder::Step : ckpt::CheckpointOrder::Commit);
                    } catch (const std::system_error& e) {
                        throw std::system_error(e.code(), "could not list '" + f.path() + "'");
                    }
                }));
            },
            py::arg("prefix"), py::arg("suffix"), py::arg("by_step") = false)
        .def(
            "remove_stale_temporaries", [](const Folder& f) { return ckpt::remove_stale_temporaries(f.fd()); },
            py::call_guard<py::gil_scoped_release>());

    py::class_<ckpt::StagingBuffer>(m, "CheckpointStaging")
        .def(py::init([](uint64_t bytes) {
                 py::gil_scoped_release release;
                 return std::make_unique<ckpt::StagingBuffer>(bytes);
             }),
             py::arg("bytes"))
        .def_property_readonly("address",
                               [](const ckpt::StagingBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
        .def_property_readonly("capacity", &ckpt::StagingBuffer::size)
        .def("populate", &ckpt::StagingBuffer::populate, py::arg("offset") = 0, py::arg("length") = UINT64_MAX,
             py::arg("threads") = 1, py::call_guard<py::gil_scoped_release>(),
             "Fault [offset, offset + length) in without changing it (safe during a staging copy).");

    py::class_<ckpt::SaveStatus, std::shared_ptr<ckpt::SaveStatus>>(m, "CheckpointStatus")
        .def("done", &ckpt::SaveStatus::done)
        .def("staged", &ckpt::SaveStatus::staged)
        .def(
            "wait",
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

    py::class_<ckpt::PlannedSave>(m, "CheckpointPlan",
                                  "A save laid out once (checkpoint_plan); CheckpointWriter.submit writes by it.")
        .def_property_readonly("path", [](const ckpt::PlannedSave& p) { return p.request().path; })
        .def_property_readonly(
            "record_offsets", [](const ckpt::PlannedSave& p) { return p.layout().record_offsets; },
            "payload offset of each source (of every archive, in order) from the file's start")
        .def_property_readonly("archive_offsets", [](const ckpt::PlannedSave& p) { return p.layout().archive_offsets; })
        .def_property_readonly("archive_sizes", [](const ckpt::PlannedSave& p) { return p.layout().archive_sizes; })
        .def_property_readonly("staging_size", [](const ckpt::PlannedSave& p) { return p.layout().staging_size; })
        .def_property_readonly("file_size", [](const ckpt::PlannedSave& p) { return p.layout().file_size; });
    m.def(
        "checkpoint_plan",
        [](const std::string& path, const py::bytes& pickle, const std::vector<Source>& sources,
           const std::vector<Archive>& archives, int keep_last, const std::string& prefix, const std::string& suffix,
           int copy_threads, std::shared_ptr<ckpt::CheckpointFolder> folder, unsigned file_mode) {
            ckpt::SaveRequest r = checkpoint_request(path, pickle, sources, archives);
            set_options(r, keep_last, prefix, suffix, copy_threads, std::move(folder), file_mode);
            return ckpt::PlannedSave(std::move(r));
        },
        py::arg("path"), py::arg("pickle"), py::arg("sources"), py::arg("archives") = std::vector<Archive>(),
        py::arg("keep_last") = 0, py::arg("prefix") = "", py::arg("suffix") = "", py::arg("copy_threads") = 0,
        py::arg("folder") = nullptr, py::arg("file_mode") = 0666,
        "Lay a save out once: sources are (address, bytes), address 0 for bytes the caller stages itself; with "
        "`archives` ([(pickle or None for raw bytes, sources)]; then pickle b'' and no sources) the file is those "
        "archives one after another. The plan's offsets say where to stage; CheckpointWriter.submit(plan) writes it.");

    py::class_<ckpt::CheckpointWriter>(m, "CheckpointWriter")
        .def(py::init([](int max_pending, int copy_threads, bool direct_io, bool sync, int writer_nice) {
                 return std::make_unique<ckpt::CheckpointWriter>(
                     writer_options(max_pending, copy_threads, direct_io, sync, writer_nice));
             }),
             py::arg("max_pending") = 1, py::arg("copy_threads") = 2, py::arg("direct_io") = true,
             py::arg("sync") = true, py::arg("writer_nice") = 10)
        .def(
            "submit",
            [](ckpt::CheckpointWriter& w, ckpt::PlannedSave& plan, uintptr_t staging, uint64_t staging_capacity,
               std::shared_ptr<ckpt::Gate> gate, bool block) {
                plan.stage_into(reinterpret_cast<void*>(staging), staging_capacity, std::move(gate));
                py::gil_scoped_release release;
                return block ? w.submit(std::move(plan)) : w.try_submit(std::move(plan));
            },
            py::arg("plan"), py::arg("staging") = 0, py::arg("staging_capacity") = 0, py::arg("gate") = nullptr,
            py::arg("block") = true,
            "Queue a save planned by checkpoint_plan, written by that plan's layout (the plan is used up once "
            "queued).")
        .def(
            "submit",
            [](ckpt::CheckpointWriter& w, const std::string& path, const py::bytes& pickle,
               const std::vector<Source>& sources, uintptr_t staging, uint64_t staging_capacity,
               std::shared_ptr<ckpt::Gate> gate, int keep_last, const std::string& prefix, const std::string& suffix,
               int copy_threads, bool block, std::shared_ptr<ckpt::CheckpointFolder> folder, unsigned file_mode,
               const std::vector<Archive>& archives) {
                ckpt::SaveRequest r = checkpoint_request(path, pickle, sources, archives);
                set_options(r, keep_last, prefix, suffix, copy_threads, std::move(folder), file_mode);
                r.staging = reinterpret_cast<void*>(staging);
                r.staging_capacity = staging_capacity;
                r.gate = std::move(gate);
                py::gil_scoped_release release;
                return block ? w.submit(std::move(r)) : w.try_submit(std::move(r));
            },
            py::arg("path"), py::arg("pickle"), py::arg("sources"), py::arg("staging") = 0,
            py::arg("staging_capacity") = 0, py::arg("gate") = nullptr, py::arg("keep_last") = 0,
            py::arg("prefix") = "", py::arg("suffix") = "", py::arg("copy_threads") = 0, py::arg("block") = true,
            py::arg("folder") = nullptr, py::arg("file_mode") = 0666, py::arg("archives") = std::vector<Archive>(),
            "Plan and queue a save; with `archives` ([(pickle, sources)]; then pickle b'' and no sources) the file is "
            "those archives one after another.")
        .def(
            "write_tensors",
            [](ckpt::CheckpointWriter& w, const std::string& path,
               const std::vector<std::tuple<std::string, int, std::vector<int64_t>, std::vector<int64_t>, uintptr_t,
                                            int64_t, uint64_t, bool>>& tensors) {
                std::vector<ckpt::TensorRef> refs;
                for (const auto& [name, dtype, shape, strides, ptr, offset, bytes, grad] : tensors) {
                    if (dtype < 0 || dtype > int(ckpt::ScalarType::Bool))
                        throw std::invalid_argument("tensor '" + name + "': unknown dtype code " +
                                                    std::to_string(dtype));
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

    // Test hooks, for the test suite only (qrnn.checkpoint._testing).
    py::module_ testing = m.def_submodule("_testing", "test hooks of qrnn._C; not a public interface");
    testing.def(
        "checkpoint_writer_with_faults",
        [](int max_pending, int copy_threads, bool direct_io, bool sync, int writer_nice, uint64_t fail_after_bytes,
           int fail_errno, bool fail_throw, int fail_times, int fail_folder_sync_errno) {
            ckpt::testing::FaultInjection fault;
            fault.fail_after_bytes = fail_after_bytes;
            fault.error_number = fail_errno;
            fault.throw_exception = fail_throw;
            fault.times = fail_times;
            fault.folder_sync_errno = fail_folder_sync_errno;
            return ckpt::testing::writer_with_faults(
                writer_options(max_pending, copy_threads, direct_io, sync, writer_nice), fault);
        },
        py::arg("max_pending") = 1, py::arg("copy_threads") = 2, py::arg("direct_io") = true, py::arg("sync") = true,
        py::arg("writer_nice") = 10, py::arg("fail_after_bytes") = UINT64_MAX, py::arg("fail_errno") = 0,
        py::arg("fail_throw") = false, py::arg("fail_times") = -1, py::arg("fail_folder_sync_errno") = 0,
        "A CheckpointWriter whose writes fail: the one crossing fail_after_bytes, with errno fail_errno or an "
        "exception in the writer thread (fail_throw), for fail_times saves (-1: all); every folder fsync failing with "
        "fail_folder_sync_errno.");
}

}  // namespace qrnn::bindings
