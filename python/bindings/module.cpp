// qrnn._C: the torch-free core exposed to Python, one binding file per subsystem
// (kernels.cpp, checkpoint.cpp, text.cpp, cuda.cpp; bindings.hpp has the one fast-call helper).
//
// Tensors cross as integers: a data pointer and element strides per array; this module
// never links libtorch, so one wheel serves every torch release. std::invalid_argument
// from the core arrives in Python as ValueError, other exceptions as RuntimeError.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "qrnn/build_info.hpp"
#include "qrnn/torch_ops_owner.hpp"

PYBIND11_MODULE(_C, m) {
    namespace py = pybind11;
    m.doc() = "torch-free kernels of torch-qrnn (pointers and strides in, nothing allocated)";
    m.def("build_info", [] {
        const qrnn::BuildInfo info = qrnn::build_info();
        py::dict d;
        d["version"] = info.version;
        d["compiler"] = info.compiler;
        d["build_type"] = info.build_type;
        d["simd"] = info.simd;
        d["cuda"] = info.cuda;
        d["cuda_architectures"] = info.cuda_architectures;
        // Per op family, what its contiguous rows run on at that level (qrnn::cpu::simd_rows).
        py::dict rows;
        for (const char* family : {"forget_mult", "qrnn_gates", "linear_scan"})
            rows[family] = qrnn::cpu::simd_rows(family);
        d["simd_rows"] = rows;
        return d;
    });
    // The Python ops claim the qrnn:: operators before defining them (qrnn.ops.core.dispatch):
    // returns the previous owner, "none", "python" or "torch_library".
    m.def("claim_torch_ops", [] {
        static const char* const names[] = {"none", "python", "torch_library"};
        return names[static_cast<int>(qrnn::claim_torch_ops(qrnn::TorchOpsOwner::python))];
    });
    qrnn::bindings::bind_kernels(m);
    qrnn::bindings::bind_checkpoint(m);
    qrnn::bindings::bind_text(m);
#if defined(QRNN_WITH_CUDA)
    qrnn::bindings::bind_cuda(m);
#endif
}
