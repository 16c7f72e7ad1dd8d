#!/usr/bin/env python3
"""Compile the matching engine's hot modules to C extensions with mypyc, in place, and the
one-call signature recovery `contracts/_recover.c` (see `contracts.signing.native_module`).

The sources stay the reference: `market.engine` runs the same code as plain Python when no
extension is built (a fresh checkout, an install without a C compiler). `make setup` runs this
whenever a compiled source changed; `market.native` refuses to import an extension older than
its source. The generated C goes to `.cache/mypyc`; the extensions land next to their sources
(`market/engine/*.so`, ignored by git), with the shared runtime as `market.engine._native__mypyc`;
the recovery module lands as `contracts/_recover.*.so` and is refused when older than its source.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _native_module() -> ModuleType:
    """Load market/native.py alone: importing `market` would run the guard this script serves."""
    spec = importlib.util.spec_from_file_location("market_native", ROOT / "market" / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    """Build the extensions in place; return the process exit status."""
    from mypyc.build import mypycify
    from setuptools import Extension, setup

    native = _native_module()
    modules: tuple[str, ...] = native.COMPILED_MODULES
    os.chdir(ROOT)
    # Old extensions go first: if this build fails, the sources run, never a stale build.
    for built in [*_extensions(modules, native.GROUP), *_recovery()]:
        built.unlink()
    paths = [module.replace(".", "/") + ".py" for module in modules]
    extensions = mypycify(
        paths, opt_level="3", group_name=native.GROUP, target_dir=".cache/mypyc", verbose=False
    )
    setup(
        name="tpumarket-engine-native",
        ext_modules=[
            *extensions,
            Extension("contracts._recover", ["contracts/_recover.c"], extra_compile_args=["-O2"]),
        ],
        script_args=["--quiet", "build_ext", "--inplace", "--build-temp", ".cache/mypyc/obj"],
    )
    # Copying keeps the compiler's mtimes from the build dir; stamp them now, after the sources.
    for built in [*_extensions(modules, native.GROUP), *_recovery()]:
        built.touch()
    return 0


def _extensions(modules: tuple[str, ...], group: str) -> list[Path]:
    """Return the built extension files of `modules` and of their shared runtime `group`."""
    found: list[Path] = []
    for module in (*modules, group + "__mypyc"):
        package, _, name = module.rpartition(".")
        found.extend((ROOT / package.replace(".", "/")).glob(f"{name}.*.so"))
    return found


def _recovery() -> list[Path]:
    """Return the built recovery extension, if any."""
    return list((ROOT / "contracts").glob("_recover.*.so"))


if __name__ == "__main__":
    sys.exit(main())
