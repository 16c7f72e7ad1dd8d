"""Import torchax 0.0.13 on torch 2.13, which removed the named-tensor overloads it names.

torchax builds tables keyed by ATen overloads at import time (``amp.py``,
``decompositions.py``, ``export.py``). torch 2.13 dropped the named-tensor (``Dimname``)
overloads, so lookups such as ``torch.ops.aten.prod.dim_Dimname`` raise ``AttributeError``
and the import fails. 22 lookups are affected (21 distinct overloads; listed in
``docs/models.md``).

The shim is narrow and temporary: while torchax's modules are first imported,
``OpOverloadPacket.__getattr__`` answers a *missing* overload whose name marks it as a
named-tensor overload (``dimname`` or ``names`` in its name) with an inert, hashable
placeholder. torchax only uses these as table keys (its cast-policy dict and the list given to
``torch._decomp.get_decompositions``, which skips keys absent from torch's registry), and no
traced graph can contain an overload torch no longer has, so a placeholder is never called.
Any other missing overload still raises. The original ``__getattr__`` is restored as soon as
the imports are done, and later imports of torchax hit ``sys.modules``.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Final

_NAMED_TENSOR_OVERLOAD: Final = re.compile(r"dimname|names", re.IGNORECASE)
_TORCHAX_MODULES: Final = (
    "torchax",
    "torchax.decompositions",
    "torchax.export",
    "torchax.ops.jaten",
    "torchax.ops.jtorch",
)
_lock = threading.Lock()
skipped: list[str] = []
"""Qualified names of the overloads the shim answered with a placeholder (for diagnostics)."""


class RemovedOverload:
    """Placeholder for an ATen overload that this torch no longer has; never callable."""

    __slots__ = ("qualified_name",)

    def __init__(self, qualified_name: str) -> None:
        """Remember which overload this stands for."""
        self.qualified_name = qualified_name

    def __repr__(self) -> str:
        """Name the missing overload."""
        return f"RemovedOverload({self.qualified_name})"


@contextmanager
def _skip_removed_named_tensor_overloads() -> Iterator[None]:
    import torch._ops

    packet = torch._ops.OpOverloadPacket
    original = packet.__getattr__

    def lookup(self: Any, key: str) -> Any:
        try:
            return original(self, key)
        except AttributeError:
            if key.startswith("__") or not _NAMED_TENSOR_OVERLOAD.search(key):
                raise
            name = f"{self._qualified_op_name}.{key}"
            skipped.append(name)
            return RemovedOverload(name)

    packet.__getattr__ = lookup  # type: ignore[method-assign]
    try:
        yield
    finally:
        packet.__getattr__ = original  # type: ignore[method-assign]


def import_torchax() -> ModuleType:
    """Import torchax and the submodules the converter uses; return the torchax package.

    The shim is applied on every call (not after a failed first try: re-running torchax's
    module code after a partial import could register its torch ops twice); where torch
    still has the overloads it changes nothing.
    """
    with _lock, _skip_removed_named_tensor_overloads():
        for name in _TORCHAX_MODULES:
            importlib.import_module(name)
    return importlib.import_module("torchax")
