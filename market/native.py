"""Which market modules may run as compiled C extensions, and the guard against stale builds.

`scripts/build_engine.py` compiles `COMPILED_MODULES` with mypyc (`make setup` does it). Python
imports an extension module in preference to its source, so an extension built from an older
source would silently run old code: `check_extensions` (run when `market` is imported) refuses
that with an `ImportError` naming the fix. With no extension built, the sources run as they are.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

COMPILED_MODULES = (
    "market.engine.orders",
    "market.engine.ladders",
    "market.engine.book",
    "market.engine.engine",
)
GROUP = "market.engine._native"
_ROOT = Path(__file__).resolve().parent.parent


class StaleExtensionError(ImportError):
    """A compiled extension is older than the source it was built from."""


def built_extensions(root: Path = _ROOT) -> dict[str, Path]:
    """Return the compiled extension found for each of `COMPILED_MODULES`, by module name."""
    found: dict[str, Path] = {}
    for module in COMPILED_MODULES:
        stem = root / module.replace(".", "/")
        for suffix in EXTENSION_SUFFIXES:
            candidate = stem.with_name(stem.name + suffix)
            if candidate.exists():
                found[module] = candidate
                break
    return found


def check_extensions(root: Path = _ROOT) -> None:
    """Raise `StaleExtensionError` if an extension is older than its module's source."""
    for module, extension in built_extensions(root).items():
        source = root / (module.replace(".", "/") + ".py")
        if source.stat().st_mtime > extension.stat().st_mtime:
            raise StaleExtensionError(
                f"{extension.relative_to(root)} was compiled from an older "
                f"{source.relative_to(root)}: run `make setup` (or "
                "`.venv/bin/python scripts/build_engine.py`) to rebuild it, or delete it to run "
                "the source"
            )
