"""Entries of torch's weights-only allowlist (``torch.load(weights_only=True)``) that stay:
what :mod:`qrnn.modules` and :mod:`qrnn.pytorch_qrnn` add at import for their classes."""

from __future__ import annotations

import torch


def named_entries_supported() -> bool:
    """Whether this torch's weights-only allowlist takes ``(object, "module.qualname")``
    entries (torch >= 2.6). Read from the code that resolves the entries, not from a version
    number: torch 2.4 and 2.5 take bare objects only, and a pair there would break every
    weights-only load (they read ``entry.__module__``)."""
    from torch import _weights_only_unpickler as unpickler

    code = getattr(getattr(unpickler, "_get_user_allowed_globals", None), "__code__", None)
    return code is not None and "tuple" in code.co_names  # isinstance(entry, tuple)


def allow_weights_only(objects: list) -> None:
    """Add `objects` to torch's weights-only allowlist so that they stay there.

    A user's ``with torch.serialization.safe_globals([..., nn.Linear, set]):`` removes, on
    exit, every entry equal to one it lists, including those qrnn added at import, and
    pickled qrnn models would stop loading with ``torch.load(..., weights_only=True)`` for
    the rest of the process. Each object is therefore also added as the pair
    ``(object, "module.qualname")``, under the name pickle records for it: a separate entry
    that such a block does not list and so never removes. On torch 2.4 and 2.5, whose
    allowlist has no pairs, the bare objects are all there is (the best available there):
    after such a block, add them again with ``torch.serialization.add_safe_globals``."""
    entries: list = list(objects)
    if named_entries_supported():
        entries += [(obj, f"{obj.__module__}.{obj.__qualname__}") for obj in objects]
    torch.serialization.add_safe_globals(entries)
