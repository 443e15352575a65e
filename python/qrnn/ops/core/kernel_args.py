"""How the op families build the argument tuples of ``qrnn._C``'s kernel entry points from
their one definition.

Each kernel entry point (CPU kernels, CUDA launchers, their host-only plans) takes its
parameter struct as a flat list of numbers. Each family's manifest (its public C++ header)
defines each list once (field order and kind) and ``_C.kernel_fields()`` exports it; a
family's ``kernels`` module pairs every field with the Python expression that computes it,
and :func:`generate` builds the function returning them in the C++ order, at import. A field
renamed, added or removed in C++ without its expression there, or an expression yielding the
wrong count of numbers for its kind, fails at import (:class:`KernelArgsError`), not as a
misread pointer at run time. The generated builders are plain tuple expressions: as fast as
hand-written ones.
"""

from typing import Any, Callable

import torch

from ... import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub

__all__ = ["DTYPE_CODES", "HALF_DTYPES", "KernelArgsError", "generate", "probe", "view2", "view3", "time_view3",
           "state_dtype", "accepts_state_dtype", "allowed_state_dtypes", "SEQUENCE_PROLOGUE", "SEQUENCE_FIELDS"]


class KernelArgsError(ImportError):
    """The Python argument builders and qrnn._C disagree about a kernel's parameter list."""


# Codes of qrnn::DType, as the C++ enum defines them.
DTYPE_CODES = {getattr(torch, name): code for name, code in _C.dtype_codes().items()}
HALF_DTYPES = (torch.bfloat16, torch.float16)

# Every kernel's (kind, field) list, read once.
_FIELDS = _C.kernel_fields()

# Numbers per field kind (cpp/src/common/kernel_args.hpp).
_WIDTHS = {"dtype": 1, "integer": 1, "flag": 1, "real": 1, "lengths": 1,
           "cview3": 4, "view3": 4, "cview2": 3, "view2": 3}
_NO_VIEW3 = (0, 0, 0, 0)  # address 0: absent
_NO_VIEW2 = (0, 0, 0)


def view2(t):
    """(address, stride_b, stride_h) of an optional (batch, hidden) tensor."""
    return _NO_VIEW2 if t is None else (t.data_ptr(), *t.stride())


def view3(t, batch_first: bool):
    """(address, stride_t, stride_b, stride_h) of an optional 3-D tensor, in the kernels'
    time-major order (strides reordered: cheaper than a transposed view per call)."""
    if t is None or t.numel() == 0:
        return _NO_VIEW3
    s = t.stride()
    return (t.data_ptr(), s[1], s[0], s[2]) if batch_first else (t.data_ptr(), *s)


def time_view3(t, batch_first: bool, reverse: bool):
    """:func:`view3`, walked from the last time step when ``reverse``: the kernels read a
    negative time stride as time running backwards."""
    if not reverse or t is None or t.numel() == 0:
        return view3(t, batch_first)
    address, stride_t, stride_b, stride_h = view3(t, batch_first)
    steps = t.shape[1 if batch_first else 0]
    return address + (steps - 1) * stride_t * t.element_size(), -stride_t, stride_b, stride_h


# The carried-state rule, the one place Python states it (cpp/include/qrnn/dtype.hpp states it
# for C++; tests/torch_library/test_dtype_rules.py checks they agree).
def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a carried state the kernels write (the gates' ``c_n``) and compute in:
    float32 next to 16-bit data, the data's dtype otherwise."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def accepts_state_dtype(dtype: torch.dtype, state: torch.dtype) -> bool:
    """Whether a state passed in (h0, c0) may have dtype ``state`` next to ``dtype`` data."""
    return state is dtype or state is state_dtype(dtype)


def allowed_state_dtypes(dtype: torch.dtype) -> str:
    """What :func:`accepts_state_dtype` allows, for messages."""
    return f"{dtype} or {state_dtype(dtype)}" if state_dtype(dtype) is not dtype else f"{dtype}"


# The sequence fields every family's kernels take (cpp/include/qrnn/view.hpp, "Sequences"),
# from the builder's `lengths`, `cu_seqlens`, `reverse` and `batch_first` (with `shape`, the
# arrays' shape): whole rows are reversed by a negative time stride (`whole`), sequences by
# the kernels' flag. `batch` counts the states' rows: the sequences of a packed row.
SEQUENCE_PROLOGUE = """
whole = reverse and lengths is None and cu_seqlens is None
"""
SEQUENCE_FIELDS = {
    "batch": "(shape[0] if batch_first else shape[1]) if cu_seqlens is None else cu_seqlens.shape[0] - 1",
    "lengths": "0 if lengths is None else lengths.data_ptr()",
    "lengths_stride": "1 if lengths is None else lengths.stride(0)",
    "cu_seqlens": "0 if cu_seqlens is None else cu_seqlens.data_ptr()",
    "reverse": "int(reverse and not whole)",
}

_NAMESPACE: dict[str, Any] = {"DTYPE_CODES": DTYPE_CODES, "view2": view2, "view3": view3, "time_view3": time_view3,
              "state_dtype": state_dtype, "_NO_VIEW2": _NO_VIEW2}


def generate(kernel: str, signature: str, prologue: str, sources: dict, probes) -> Callable[..., tuple]:
    """Builds ``def kernel(signature): prologue; return (<each field's numbers in C++ order>)``.

    ``sources`` maps each field to a Python expression; for a view kind a bare name is a
    required tensor (its address, then its strides), anything else must evaluate to the
    kind's numbers and is splatted. ``probes`` are argument tuples the result is checked on."""
    fields = _FIELDS[kernel]
    names = [name for _, name in fields]
    missing, unknown = [n for n in names if n not in sources], [n for n in sources if n not in names]
    if missing or unknown:
        raise KernelArgsError(f"{kernel}: qrnn._C's fields {missing} have no Python expression and {unknown} are "
                              "not qrnn._C fields; qrnn._C and qrnn.ops come from different builds or "
                              "cpp/src/common/kernel_args.hpp changed without this module")
    parts = []
    for kind, name in fields:
        expr = sources[name]
        if kind.endswith(("view3", "view2")):
            expr = f"{expr}.data_ptr(), *{expr}.stride()" if expr.isidentifier() else f"*{expr}"
        elif kind == "real":
            expr = f"float({expr})"
        parts.append(expr)
    body = "".join(f"    {line}\n" for line in prologue.strip().splitlines())
    code = f"def {kernel}({signature}):\n{body}    return ({', '.join(parts)},)\n"
    # The same expressions one field per tuple, to check each field's count of numbers.
    check = f"def per_field({signature}):\n{body}    return ({', '.join(f'({p},)' for p in parts)},)\n"
    namespace: dict[str, Any] = dict(_NAMESPACE)
    exec(compile(code + check, f"<qrnn.ops argument builder: {kernel}>", "exec"), namespace)
    for probe in probes:
        for (kind, name), numbers in zip(fields, namespace["per_field"](*probe)):
            if len(numbers) != _WIDTHS[kind] or (kind == "real") != isinstance(numbers[0], float):
                raise KernelArgsError(f"{kernel}: field {name} ({kind}) gave {numbers}, expected {_WIDTHS[kind]} "
                                      f"{'float' if kind == 'real' else 'integer'}(s)")
    builder = namespace[kernel]
    builder.__doc__ = f"The numbers of _C.{kernel} in order (see kernel_fields()), less the trailing arguments."
    return builder


def probe(*shape, dtype=torch.float32):
    return torch.rand(shape, dtype=dtype)

