"""The argument tuples of ``qrnn._C``'s kernel entry points, built from their one definition.

Each kernel entry point (CPU kernels, CUDA launchers, their host-only plans) takes its
parameter struct as a flat list of numbers. ``cpp/src/common/kernel_args.hpp`` defines each list
once (field order and kind) and ``_C.kernel_fields()`` exports it; this module pairs every
field with the Python expression that computes it and generates each builder in the C++
order at import. A field renamed, added or removed in C++ without its expression here,
or an expression yielding the wrong count of numbers for its kind, fails at import
(:class:`KernelArgsError`), not as a misread pointer at run time. The generated builders
are plain tuple expressions: as fast as hand-written ones.
"""

from typing import Any, Callable

import torch

from .. import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub

__all__ = ["DTYPE_CODES", "KernelArgsError", "generate", "probe", "view2", "view3", "time_view3", "state_dtype",
           "forget_mult_forward", "forget_mult_backward", "qrnn_gates_forward", "qrnn_gates_backward"]


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


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Carried state dtype: float32 next to 16-bit data, the data's dtype otherwise."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


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
                              "not qrnn._C fields; qrnn._C and qrnn.ops.kernel_args come from different builds or "
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
    exec(compile(code + check, f"<qrnn.ops.kernel_args: {kernel}>", "exec"), namespace)
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


# ---- ForgetMult: the prologue makes every array time-major --------------------------------

_FORGET_MULT_COMMON = {
    "dtype": "code", "seq_len": "T", "batch": "B", "hidden": "H",
    "f": "f", "x": "x", "h0": "(_NO_VIEW2 if h0 is None else (h0.data_ptr(), *h0.stride()))",
    "h0_dtype": "code if h0 is None else DTYPE_CODES[h0.dtype]",
}
_TIME_MAJOR = """
code = DTYPE_CODES[f.dtype]
if batch_first:
    {names} = {transposed}
T, B, H = f.shape
"""


def _time_major(*names):
    return _TIME_MAJOR.format(names=", ".join(names), transposed=", ".join(f"{n}.transpose(0, 1)" for n in names))


_fm = probe(2, 3, 4)
forget_mult_forward: Callable[..., tuple] = generate(
    "forget_mult_forward", "h, f, x, h0, batch_first", _time_major("h", "f", "x"),
    {**_FORGET_MULT_COMMON, "h": "h"},
    [(_fm, _fm, _fm, None, False), (_fm, _fm, _fm, probe(2, 4), True)])
forget_mult_backward: Callable[..., tuple] = generate(
    "forget_mult_backward", "grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first",
    _time_major("grad_f", "grad_x", "grad_h", "f", "x", "h"),
    {**_FORGET_MULT_COMMON, "h": "h", "grad_h": "grad_h", "grad_f": "grad_f", "grad_x": "grad_x",
     "grad_h0": "view2(grad_h0)"},
    [(_fm, _fm, None, _fm, _fm, _fm, _fm, None, False)])


# ---- Fused QRNN gates: views reorder their strides to time-major ---------------------------

_GATES_PROLOGUE = """
code = DTYPE_CODES[gates.dtype]
shape = gates.shape
"""
_GATES_COMMON = {
    "forget_scale": "forget_scale", "dtype": "code",
    "seq_len": "shape[1] if batch_first else shape[0]", "batch": "shape[0] if batch_first else shape[1]",
    "hidden": "hidden", "output_gate": "int(output_gate)", "gates": "view3(gates, batch_first)",
    "gate_stride": "hidden * gates.stride(2)", "forget_mask": "view3(forget_mask, batch_first)",
    "c0": "view2(c0)", "c0_dtype": "code if c0 is None else DTYPE_CODES[c0.dtype]",
    "lengths": "0 if lengths is None else lengths.data_ptr()",
    "lengths_stride": "1 if lengths is None else lengths.stride(0)", "reverse": "int(reverse)",
    "c_n_dtype": "DTYPE_CODES[state_dtype(gates.dtype)]",
}
_gates = probe(2, 3, 12)
_out = probe(2, 3, 4)
qrnn_gates_forward: Callable[..., tuple] = generate(
    "qrnn_gates_forward",
    "output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse",
    _GATES_PROLOGUE + "hidden = output.shape[2]",
    {**_GATES_COMMON, "output": "view3(output, batch_first)", "states": "view3(states, batch_first)",
     "c_n": "view2(c_n)"},
    [(_out, _out, probe(3, 4), _gates, None, None, None, 1.0, True, False, False)])
qrnn_gates_backward: Callable[..., tuple] = generate(
    "qrnn_gates_backward",
    "grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, "
    "output_gate, batch_first, reverse",
    _GATES_PROLOGUE + "hidden = shape[2] // (3 if output_gate else 2)",
    {**_GATES_COMMON, "states": "view3(states, batch_first)", "grad_output": "view3(grad_output, batch_first)",
     "grad_c_n": "view2(grad_c_n)", "grad_gates": "view3(grad_gates, batch_first)",
     "grad_gate_stride": "hidden * grad_gates.stride(2)", "grad_c0": "view2(grad_c0)"},
    [(_gates, None, _out, None, _gates, _out, None, None, torch.tensor([1, 2, 2]), 0.5, True, False, True)])
del _fm, _gates, _out
