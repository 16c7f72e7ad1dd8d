"""What the test files share when pytest-xdist runs them in parallel (`make test`'s `-n`).

Each xdist worker is a pytest process of its own: its session fixtures (anvil, sandboxes) are its
own, its ports come from the OS and its files from ``tmp_path_factory``. What the workers, and
concurrent runs on one host, still share goes through this module:

- :func:`host_lock`: a lock held across processes while a shared resource is set up (the
  PostgreSQL cluster of ``scripts/postgres-up``, which two workers must not initialize at once).
- :data:`POSTGRES_SCHEMA`: the schema this process's tests use in the shared PostgreSQL
  database, so that one worker's reset does not drop the tables another is using.
- :func:`write_atomically`: a file in a shared cache appears whole or not at all.

The module imports the standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
"""The xdist worker's id (``gw0``, ``gw1``, ...), empty in a run without workers."""

POSTGRES_SCHEMA = f"tests_{os.getpid()}"
"""This process's schema in the shared test database: unique among running processes, so that
neither parallel workers nor concurrent runs on one host drop each other's tables."""


@contextlib.contextmanager
def host_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock named ``name`` across every process of this host's user."""
    path = Path(tempfile.gettempdir()) / f"tpumarket-{name}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file of this process, then rename it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def postgres_url_for_schema(url: str, schema: str = POSTGRES_SCHEMA) -> str:
    """Return ``url`` with its connections' search path set to ``schema`` only."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"
