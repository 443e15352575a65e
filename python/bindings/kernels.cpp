// qrnn._C's CPU kernels (<qrnn/forget_mult.hpp>, <qrnn/qrnn_gates.hpp>) as fast calls,
// and the argument lists and dtype codes qrnn.ops.kernel_args builds its calls from.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "qrnn/dtype.hpp"
#include "qrnn/forget_mult.hpp"
#include "qrnn/qrnn_gates.hpp"

namespace qrnn::bindings {
namespace {

// Each takes its list's numbers, then num_threads; large work runs without the GIL.
#define QRNN_CPU_ENTRY(kernel, what)                                                            \
    QRNN_FAST_ENTRY(kernel, kernel, 1, true,                                                    \
                    #kernel "(<kernel_fields()['" #kernel "']>, num_threads): " what,           \
                    qrnn::cpu::kernel(p, int(call.extra(0))))
QRNN_CPU_ENTRY(forget_mult_forward, "CPU ForgetMult forward")
QRNN_CPU_ENTRY(forget_mult_backward, "CPU ForgetMult backward")
QRNN_CPU_ENTRY(qrnn_gates_forward, "fused QRNN gates forward")
QRNN_CPU_ENTRY(qrnn_gates_backward, "fused QRNN gates backward")
#undef QRNN_CPU_ENTRY

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

void bind_kernels(py::module_& m) {
    def_fast<forget_mult_forward, forget_mult_backward, qrnn_gates_forward, qrnn_gates_backward>(m);
    m.def("kernel_fields", &kernel_fields,
          "{kernel: ((kind, field), ...)}: the parameter list each kernel entry point takes, in order");
    m.def("dtype_codes", &dtype_codes, "{dtype name: code} of qrnn::DType");
}

}  // namespace qrnn::bindings
