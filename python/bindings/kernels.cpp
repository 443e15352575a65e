// qrnn._C's CPU kernels (every family of <qrnn/families.hpp>) as fast calls, the argument
// lists and dtype codes qrnn.ops builds its calls from, and the ops' schemas.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "qrnn/dtype.hpp"
#include "qrnn/families.hpp"

namespace qrnn::bindings {
namespace {

// Each takes its list's numbers, then num_threads; large work runs without the GIL.
#define QRNN_CPU_ENTRY(kernel, Params, FIELDS)                                                          \
    QRNN_FAST_ENTRY(kernel, kernel, 1, true, #kernel "(<kernel_fields()['" #kernel "']>, num_threads)", \
                    qrnn::cpu::kernel(p, int(call.extra(0))))
QRNN_FAMILY_KERNELS(QRNN_CPU_ENTRY)
#undef QRNN_CPU_ENTRY

// {list name: ((kind, field), ...)}: the argument lists qrnn.ops builds its calls from.
py::dict kernel_fields() {
    py::dict lists;
#define QRNN_EXPORT_LIST(kernel, Params, FIELDS)                                                         \
    {                                                                                                    \
        py::list fields;                                                                                 \
        for (const args::Field& f : args::kernel::fields) fields.append(py::make_tuple(f.kind, f.name)); \
        lists[#kernel] = py::tuple(fields);                                                              \
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

// {op name: schema} of every qrnn:: op, as qrnn.ops defines them.
py::dict op_schemas() {
    py::dict schemas;
#define QRNN_EXPORT_SCHEMA(name, schema) schemas[#name] = schema;
    QRNN_FAMILY_SCHEMAS(QRNN_EXPORT_SCHEMA)
#undef QRNN_EXPORT_SCHEMA
    return schemas;
}

}  // namespace

void bind_kernels(py::module_& m) {
#define QRNN_DEF_CPU_ENTRY(kernel, Params, FIELDS) def_fast<kernel>(m);
    QRNN_FAMILY_KERNELS(QRNN_DEF_CPU_ENTRY)
#undef QRNN_DEF_CPU_ENTRY
    m.def("kernel_fields", &kernel_fields,
          "{kernel: ((kind, field), ...)}: the parameter list each kernel entry point takes, in order");
    m.def("dtype_codes", &dtype_codes, "{dtype name: code} of qrnn::DType");
    // The carried-state rule of qrnn/dtype.hpp, for the test that Python's copy agrees.
    m.def(
        "state_dtype", [](int data) { return static_cast<int>(qrnn::state_dtype(static_cast<qrnn::DType>(data))); },
        "qrnn::state_dtype on DType codes");
    m.def(
        "accepts_state_dtype",
        [](int data, int state) {
            return qrnn::accepts_state_dtype(static_cast<qrnn::DType>(data), static_cast<qrnn::DType>(state));
        },
        "qrnn::accepts_state_dtype on DType codes");
    m.def("op_schemas", &op_schemas, "{op: schema} of every qrnn:: op, from the families' manifests");
}

}  // namespace qrnn::bindings
