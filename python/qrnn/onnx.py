"""ONNX export of models holding qrnn layers (``torch.onnx.export(..., dynamo=True)``).

The exporter meets qrnn's custom ops (``qrnn::qrnn_gates``, ``qrnn::forget_mult``,
``qrnn::linear_scan``) in the graph that ``torch.export`` captures and needs a translation for
each; each op family gives its own (``qrnn.ops.<family>.onnx``: ONNX Script functions over an
ONNX ``Scan`` for the recurrence and plain ONNX ops for activations, masks and layouts), and
this module gathers them::

    onnx_program = torch.onnx.export(model, (x,), dynamo=True,
                                     custom_translation_table=qrnn.onnx.custom_translation_table())

or ``qrnn.onnx.export(model, (x,))``, which passes the table for you. Importing this module
also adds the translations to the exporter's own table where this torch version allows it
(:data:`registered`), so a plain ``torch.onnx.export(model, (x,))`` works too. Every option of the
forward ops is translated (initial state, lengths, packed cu_seqlens, reverse, batch_first, output gate,
zoneout mask and scale; 16-bit inputs compute in float32 as the kernels do). The backward
ops are not (ONNX graphs are for inference): exporting a graph that holds them raises an
error saying so. The legacy TorchScript exporter (``dynamo=False``) is not supported.

Importing this module imports onnxscript; ``import qrnn`` alone never does.
"""

import importlib
from typing import Any, Callable, Optional

import torch

from . import ops as _ops

__all__ = ["custom_translation_table", "export", "registered"]


def _translations() -> dict:
    """{op name: translation} of every family's forward ops (``qrnn.ops.<family>.onnx``)."""
    found: dict = {}
    for family in _ops.FAMILIES:
        found.update(importlib.import_module(f"qrnn.ops.{family}.onnx").TRANSLATIONS)
    return found


_TRANSLATIONS = _translations()


def _untranslated(name: str):
    def translation(*args, **kwargs):
        raise NotImplementedError(
            f"qrnn.onnx: {name} is not translated to ONNX: it is part of a training (backward) graph, and "
            "ONNX export of qrnn models covers inference. Export the model in eval mode without gradients.")
    translation.__name__ = name.replace("::", "_")
    return translation


def custom_translation_table() -> dict:
    """The ONNX translations of qrnn's operators, for ``torch.onnx.export(..., dynamo=True,
    custom_translation_table=...)`` (merge it with your own table if you have one).

    Returns:
        A new dict ``{op overload: translation}``: each forward op's ONNX Script function,
        and for each backward op a function that raises NotImplementedError saying that
        training graphs are not exported.
    """
    return _table()


def _table() -> dict:
    """The forward ops' translations, and for each backward op an error saying it is not translated."""
    qrnn_ops = torch.ops.qrnn
    table: dict = {getattr(qrnn_ops, name).default: fn for name, fn in _TRANSLATIONS.items()}
    for name in _TRANSLATIONS:
        table[getattr(qrnn_ops, f"{name}_backward").default] = _untranslated(f"qrnn::{name}_backward")
    return table


def export(model, args=(), f=None, *, custom_translation_table: Optional[dict] = None, **kwargs):
    """``torch.onnx.export(model, args, f, dynamo=True, ...)`` with qrnn's translations added
    to ``custom_translation_table`` (yours take precedence).

    Args:
        model (torch.nn.Module): the model to export, as for ``torch.onnx.export``.
        args (tuple): its example inputs, as for ``torch.onnx.export``.
        f (str | os.PathLike | None): where to write the ONNX file, or None.
        custom_translation_table: your own translations, merged over qrnn's; or None.
        **kwargs (Any): any other ``torch.onnx.export`` keyword; ``dynamo`` may only be True.

    Returns:
        program (torch.onnx.ONNXProgram): the exported program (also written to ``f`` when
            given).

    Raises:
        ValueError: ``dynamo=False`` (the TorchScript exporter cannot translate qrnn's ops).
        NotImplementedError: the graph holds a backward op (export in eval mode, without
            gradients).
    """
    if kwargs.pop("dynamo", True) is not True:
        raise ValueError("qrnn.onnx.export uses the dynamo exporter; the TorchScript exporter (dynamo=False) "
                         "cannot translate qrnn's custom ops")
    table = {**_table(), **(custom_translation_table or {})}
    return torch.onnx.export(model, args, f, dynamo=True, custom_translation_table=table, **kwargs)


def _register_with_exporter() -> bool:
    """Add the forward translations to the table the dynamo exporter starts from, so plain
    ``torch.onnx.export(model, args)`` (e.g. an unchanged ``--onnx-export`` script) finds them.
    That table is internal to torch (checked with torch 2.13): on any mismatch nothing is
    changed and False is returned; ``custom_translation_table()`` always works."""
    try:
        from torch.onnx._internal.exporter import _registration
        from torch.onnx._internal.exporter._torchlib import _torchlib_registry
        registry = _torchlib_registry._registry
        if not isinstance(registry, list):
            return False
        _torchlib_registry.get_torchlib_ops()  # load torch's own entries first (it checks for them)
        ours: dict[Any, Callable[..., Any]] = {getattr(torch.ops.qrnn, name).default: fn
                                               for name, fn in _TRANSLATIONS.items()}
        present = {id(meta.onnx_function) for meta in registry}
        metas = [_registration.OnnxDecompMeta(onnx_function=fn, fx_target=target, signature=None)
                 for target, fn in ours.items() if id(fn) not in present]
    except Exception:  # a torch without this internal layout: the explicit table still works
        return False
    registry.extend(metas)
    return True


registered = _register_with_exporter()
"""Whether importing this module added qrnn's forward translations to torch's own exporter
table, so that a plain ``torch.onnx.export(model, args, dynamo=True)`` finds them (this
relies on torch internals, checked with torch 2.13; when False, pass
:func:`custom_translation_table` or use :func:`export`)."""
