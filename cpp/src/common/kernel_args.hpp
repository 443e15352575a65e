// The flat argument lists of the kernel entry points that Python calls, defined once.
//
// qrnn._C's kernel entry points take their parameter struct as a flat list of numbers
// (converting Python objects per field would cost microseconds per call). This header is
// how those lists are read: each family's manifest (its public header) gives its structs'
// fields in order, with a kind saying how many numbers a field takes and how it is read. qrnn._C reads with it and
// exports it (`_C.kernel_fields()`), qrnn.ops generates its argument builders from that export, and the test emulator
// of the CUDA kernels reads with it too: a renamed, reordered or re-kinded field changes all three at once or fails
// loudly at import.
//
// Kinds and the numbers each takes:
//   dtype   1  a qrnn::DType code (checked)
//   integer 1
//   flag    1  0 or 1
//   real    1  the only kind passed as a float (forget_scale)
//   lengths 1  address of int64 values (0: absent)
//   cview3 / view3  4  address, stride_t, stride_b, stride_h (address 0: absent)
//   cview2 / view2  3  address, stride_b, stride_h
// Strides count elements, not bytes; views are time-major whatever the caller's layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "qrnn/dtype.hpp"
#include "qrnn/families.hpp"

// Every kernel's list, by the name Python knows it under: the families' manifests
// (qrnn/families.hpp).
#define QRNN_KERNEL_ARG_LISTS(L) QRNN_FAMILY_KERNELS(L)

namespace qrnn::args {

// Numbers per kind, as the header comment lists them.
constexpr int width(const char* kind) {
    return (kind[0] == 'c' || kind[0] == 'v') ? (kind[std::char_traits<char>::length(kind) - 1] == '3' ? 4 : 3) : 1;
}

constexpr bool is_real(const char* kind) { return kind[0] == 'r'; }

struct Field {
    const char* kind;
    const char* name;
};

// Fills a parameter struct from the numbers of its list: integers in order, and the
// `real` fields from their own array (Python passes those as floats).
class Reader {
public:
    Reader(const int64_t* ints, const double* reals) : ints_(ints), reals_(reals) {}

    void dtype(DType& out) {
        const int64_t code = *ints_++;
        if (code < 0 || code > 3) throw std::invalid_argument("dtype code must be 0..3, got " + std::to_string(code));
        out = static_cast<DType>(code);
    }
    void integer(int64_t& out) { out = *ints_++; }
    void flag(bool& out) { out = *ints_++ != 0; }
    void real(double& out) { out = *reals_++; }
    void lengths(const int64_t*& out) { out = static_cast<const int64_t*>(address()); }
    void cview3(ConstView3& v) {
        v.data = address(), v.stride_t = *ints_++, v.stride_b = *ints_++, v.stride_h = *ints_++;
    }
    void view3(View3& v) { v.data = address(), v.stride_t = *ints_++, v.stride_b = *ints_++, v.stride_h = *ints_++; }
    void cview2(ConstView2& v) { v.data = address(), v.stride_b = *ints_++, v.stride_h = *ints_++; }
    void view2(View2& v) { v.data = address(), v.stride_b = *ints_++, v.stride_h = *ints_++; }

private:
    void* address() { return reinterpret_cast<void*>(static_cast<uintptr_t>(*ints_++)); }
    const int64_t* ints_;
    const double* reals_;
};

#define QRNN_ARGS_FIELD(kind, name) Field{#kind, #name},
#define QRNN_ARGS_SLOTS(kind, name) (is_real(#kind) ? 0 : width(#kind)),
#define QRNN_ARGS_INTS(kind, name) +(is_real(#kind) ? 0 : width(#kind))
#define QRNN_ARGS_REALS(kind, name) +(is_real(#kind) ? 1 : 0)
#define QRNN_ARGS_READ(kind, name) r.kind(p.name);

// One type per list: `args::forget_mult_forward::fields`, `::ints`, `::reals`, `::read(...)`.
#define QRNN_ARGS_LIST(kernel, Params, FIELDS)                                            \
    struct kernel {                                                                       \
        using params = Params;                                                            \
        static constexpr const char* name = #kernel;                                      \
        static constexpr Field fields[] = {FIELDS(QRNN_ARGS_FIELD)};                      \
        /* integers each field takes, 0 for the float of a `real`: what a parser walks */ \
        static constexpr int slots[] = {FIELDS(QRNN_ARGS_SLOTS)};                         \
        static constexpr int ints = 0 FIELDS(QRNN_ARGS_INTS);                             \
        static constexpr int reals = 0 FIELDS(QRNN_ARGS_REALS);                           \
        static Params read(const int64_t* int_args, const double* real_args) {            \
            Params p;                                                                     \
            Reader r(int_args, real_args);                                                \
            FIELDS(QRNN_ARGS_READ)                                                        \
            return p;                                                                     \
        }                                                                                 \
    };
QRNN_KERNEL_ARG_LISTS(QRNN_ARGS_LIST)
#undef QRNN_ARGS_LIST

// for_each_field(p, visit): visit(name, p.<field>) for every field of a kernel's parameter
// struct, in its list's order (what the scan families' checks and CUDA plans walk).
#define QRNN_ARGS_VISIT(kind, name) visit(#name, p.name);
#define QRNN_ARGS_FOR_EACH(kernel, Params, FIELDS)        \
    template <typename Visit>                             \
    void for_each_field(const Params& p, Visit&& visit) { \
        FIELDS(QRNN_ARGS_VISIT)                           \
    }
QRNN_KERNEL_ARG_LISTS(QRNN_ARGS_FOR_EACH)
#undef QRNN_ARGS_FOR_EACH
#undef QRNN_ARGS_VISIT
#undef QRNN_ARGS_READ
#undef QRNN_ARGS_REALS
#undef QRNN_ARGS_INTS
#undef QRNN_ARGS_SLOTS
#undef QRNN_ARGS_FIELD

}  // namespace qrnn::args
