// The op families, one line per family in each list. A family's public header is its
// manifest: parameter structs, entry points, kernels' argument fields and op schemas.
#pragma once

#include "qrnn/forget_mult.hpp"
#include "qrnn/linear_scan.hpp"
#include "qrnn/qrnn_gates.hpp"

// F(family) for every family: its folders (cpp/src/<family>/, cuda/<family>/) and its CUDA
// kernels' set.
#define QRNN_FAMILY_NAMES(F) F(forget_mult) F(qrnn_gates) F(linear_scan)

// L(kernel, Params, FIELDS) for every kernel entry point qrnn._C binds.
#define QRNN_FAMILY_KERNELS(L) QRNN_FORGET_MULT_KERNELS(L) QRNN_QRNN_GATES_KERNELS(L) QRNN_LINEAR_SCAN_KERNELS(L)

// S(name, schema) for every qrnn:: op.
#define QRNN_FAMILY_SCHEMAS(S) QRNN_FORGET_MULT_SCHEMAS(S) QRNN_QRNN_GATES_SCHEMAS(S) QRNN_LINEAR_SCAN_SCHEMAS(S)
