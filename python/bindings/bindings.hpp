// What the binding files of qrnn._C share. The one fast-call helper: the kernel entry points run on every forward and
// backward, so they bypass pybind11's generic argument conversion (microseconds at 20+
// arguments) and take their parameter struct as a flat list of numbers through CPython's
// METH_FASTCALL protocol. The list is defined once (cpp/src/common/kernel_args.hpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "common/kernel_args.hpp"
#include "qrnn/forget_mult_cuda.hpp"

namespace qrnn::bindings {

namespace py = pybind11;
namespace args = qrnn::args;

// Below this many element-steps a kernel finishes in about a microsecond: keep the GIL
// (re-acquiring it can wait a whole switch interval when other Python threads run).
inline constexpr int64_t kReleaseGilWork = 1 << 14;

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

inline PyObject* to_python() { Py_RETURN_NONE; }
#if defined(QRNN_WITH_CUDA)
inline PyObject* to_python(const qrnn::cuda::LaunchPlan& p) { return Py_BuildValue("(ii)", p.vector_width, p.chunks); }
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

// Defines fast call `fn`: Python name "fn", docstring `doc`, the numbers of list `List`
// then `Extra` trailing integers; `...` is its body (params `p`, the parsed `call`).
#define QRNN_FAST_ENTRY(fn, List, Extra, release_gil, doc, ...)                                   \
    struct fn {                                                                                   \
        static constexpr const char* name = #fn;                                                  \
        static constexpr const char* help = doc;                                                  \
        static PyObject* run(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {                \
            return ::qrnn::bindings::fast_call<::qrnn::args::List, Extra>(                        \
                argv, nargs, release_gil, [&](const auto& p, const auto& call) { __VA_ARGS__; }); \
        }                                                                                         \
    };

// Adds the METH_FASTCALL functions of QRNN_FAST_ENTRY `Entries` to the module (each method
// record lives as long as the module: one per function).
template <typename... Entries>
void def_fast(py::module_& m) {
    auto def_one = [&m](auto entry) {
        using Entry = decltype(entry);
        static PyMethodDef def{Entry::name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&Entry::run)),
                               METH_FASTCALL, Entry::help};
        m.add_object(Entry::name, py::reinterpret_steal<py::object>(PyCFunction_NewEx(&def, nullptr, m.ptr())));
    };
    (def_one(Entries{}), ...);
}

// The binders of each subsystem, called once by module.cpp.
void bind_kernels(py::module_& m);     // CPU kernels and their argument lists
void bind_checkpoint(py::module_& m);  // the checkpoint writer (qrnn.checkpoint)
void bind_text(py::module_& m);        // the corpora's tokenizer (qrnn.train.data)
#if defined(QRNN_WITH_CUDA)
void bind_cuda(py::module_& m);        // CUDA launchers (qrnn.ops.core.cuda)
#endif

}  // namespace qrnn::bindings
