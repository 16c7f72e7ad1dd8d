"""The torch_xla environment (``.venv-xla``): found, or built on first use with a progress line.

``make demo`` does not build it (the demo never exports through torch_xla); ``make test`` does,
for the route's tests. ``job export --from torch-xla`` builds it here the first time it is
needed: a venv beside the project's, ``pip install -r requirements-xla.txt`` (about 4 GB of
downloads, 7 GB on disk), then the same stamp file the Makefile writes, so either path sees the
other's work. ``$TPUMARKET_XLA_PYTHON`` names another environment's Python and is never built.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from client.errors import ConverterUnavailableError

XLA_PYTHON_ENV: Final = "TPUMARKET_XLA_PYTHON"
ROOT: Final = Path(__file__).resolve().parents[2]
REQUIREMENTS: Final = ROOT / "requirements-xla.txt"
DEFAULT_ENV: Final = ROOT / ".venv-xla"
STAMP: Final = ".installed"
"""The Makefile's stamp: present once every pin of requirements-xla.txt is installed."""


def xla_python() -> Path:
    """Return the Python of the torch_xla environment (``$TPUMARKET_XLA_PYTHON`` or .venv-xla)."""
    override = os.environ.get(XLA_PYTHON_ENV)
    if override:
        return Path(override)
    return DEFAULT_ENV / "bin" / "python"


def torch_xla_available() -> bool:
    """Return whether the torch_xla environment is complete (its Python and its stamp)."""
    python = xla_python()
    if not (python.is_file() and os.access(python, os.X_OK)):
        return False
    if os.environ.get(XLA_PYTHON_ENV):
        return True
    return (DEFAULT_ENV / STAMP).is_file()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_torch_xla(
    *,
    progress: Callable[[str], None] = _say,
    run: Callable[[list[str]], int] | None = None,
) -> Path:
    """Return the torch_xla environment's Python, building ``.venv-xla`` first if it is missing.

    Raise :class:`ConverterUnavailableError` when ``$TPUMARKET_XLA_PYTHON`` names a missing
    Python (nothing is built for another environment) or when the build fails (the pip step's
    exit status and how to retry are in the message).
    """
    python = xla_python()
    if torch_xla_available():
        return python
    if os.environ.get(XLA_PYTHON_ENV):
        raise ConverterUnavailableError(
            f"the torch_xla environment is missing ({python}, from {XLA_PYTHON_ENV}): point it "
            "at a Python with torch-xla installed, or unset it to build .venv-xla here"
        )
    runner = run if run is not None else _run
    progress(
        f"setting up the torch_xla environment in {DEFAULT_ENV} (first use only): torch 2.9 + "
        "torch-xla 2.9, about 4 GB of downloads and 7 GB on disk; this takes several minutes"
    )
    steps = [
        [sys.executable, "-m", "venv", str(DEFAULT_ENV)],
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
    ]
    for number, step in enumerate(steps, start=1):
        progress(f"  step {number}/{len(steps)}: {' '.join(step)}")
        status = runner(step)
        if status != 0:
            raise ConverterUnavailableError(
                f"setting up the torch_xla environment failed (exit {status} at step {number}: "
                f"{' '.join(step)}); rerun the command to retry, or run `make setup-xla`"
            )
    (DEFAULT_ENV / STAMP).touch()
    progress("the torch_xla environment is ready")
    return python


def _run(command: list[str]) -> int:
    return subprocess.run(command, check=False).returncode
