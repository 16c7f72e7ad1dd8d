"""The daemon's compile cache: per client, written only by the daemon, read by no worker.

Layout under the root (a directory no worker mounts)::

    clients/<client id>/xla/<program sha256>/<JAX cache key>   # executables, owner-tagged
    clients/<client id>/aot-reports/<digest>.json               # TPU compile reports

``client id`` is a hash of the client's address. The entries a worker compiled for a client
are stored under that client and program and sent back only to that client's later tasks of
the same program: a worker never sees another client's entries, and an entry one client's
(possibly compromised) worker planted is never loaded for another client. Each entry file
starts with its owner's id; an entry whose owner is not the requester is neither served nor
trusted, and counted in :attr:`CompileStore.cross_reads` (0 unless the store's files were
tampered with from outside).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

from provider.sandbox.aot_reports import AotReport, parse_report
from provider.sandbox.cache_wire import ENTRY_KEY

ANONYMOUS = "-"
"""The tenant of tasks that name no client (direct users of the sandbox)."""
MAX_ENTRIES_PER_PROGRAM = 16
MAX_ENTRY_BYTES = 64 << 20
MAX_SERVED_BYTES = 128 << 20
"""At most this many bytes of entries travel with one request."""
CLIENT_BYTES = 2 << 30
"""Default bound on one client's entries on disk: its least recently stored programs go."""
_OWNER_BYTES = 16


def client_id(client: str | None) -> str:
    """The directory name of ``client``'s store (a hash of its lower-cased address)."""
    name = (client or ANONYMOUS).lower()
    return hashlib.sha256(b"tpumarket.compile-store.v1" + name.encode()).hexdigest()[:32]


class CompileStore:
    """Per-client compile cache entries and AOT reports kept by the daemon. Thread-safe."""

    def __init__(self, root: Path, client_bytes: int = CLIENT_BYTES) -> None:
        """Keep the store under ``root`` (created, owner-only), ``client_bytes`` per client."""
        self.root = root
        self.client_bytes = client_bytes
        self.evicted = 0
        self._stamp = 0  # the last store time given to a program folder (ns, increasing)
        (root / "clients").mkdir(parents=True, exist_ok=True, mode=0o700)
        self.cross_reads = 0
        self.stored = 0
        self.served = 0
        self._lock = threading.Lock()

    def _client_dir(self, client: str | None) -> Path:
        return self.root / "clients" / client_id(client)

    def _program_dir(self, client: str | None, program: bytes) -> Path:
        return self._client_dir(client) / "xla" / program.hex()

    def entries(self, client: str | None, program: bytes) -> dict[str, bytes]:
        """The entries stored for ``client``'s program ``program`` (within the served cap)."""
        folder = self._program_dir(client, program)
        owner = bytes.fromhex(client_id(client))[:_OWNER_BYTES]
        found: dict[str, bytes] = {}
        total = 0
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return found
        for name in names:
            if not ENTRY_KEY.match(name):
                continue
            try:
                data = (folder / name).read_bytes()
            except OSError:
                continue
            if data[:_OWNER_BYTES] != owner:
                with self._lock:
                    self.cross_reads += 1
                continue
            if total + len(data) > MAX_SERVED_BYTES:
                break
            found[name] = data[_OWNER_BYTES:]
            total += len(data)
        with self._lock:
            self.served += len(found)
        return found

    def put_entries(self, client: str | None, program: bytes, entries: dict[str, bytes]) -> int:
        """Store what ``client``'s worker compiled for ``program``; return how many were kept."""
        if not entries:
            return 0
        folder = self._program_dir(client, program)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        owner = bytes.fromhex(client_id(client))[:_OWNER_BYTES]
        kept = 0
        present = len(os.listdir(folder))
        for key, value in entries.items():
            if not ENTRY_KEY.match(key) or not 0 < len(value) <= MAX_ENTRY_BYTES:
                continue
            path = folder / key
            existed = path.exists()
            if not existed and present >= MAX_ENTRIES_PER_PROGRAM:
                break
            _write(path, owner + value)
            present += 0 if existed else 1
            kept += 1
        with self._lock:
            self.stored += kept
            self._stamp = max(self._stamp + 1, time.time_ns())
            stamp = self._stamp
        os.utime(folder, ns=(stamp, stamp))  # when it was last stored: the eviction order
        self._bound(client)
        return kept

    def _bound(self, client: str | None) -> None:
        """Drop ``client``'s least recently stored programs until its entries fit its bound."""
        folders = []
        total = 0
        for folder in (self._client_dir(client) / "xla").iterdir():
            try:
                size = sum(f.stat().st_size for f in folder.iterdir())
                stored_at = folder.stat().st_mtime_ns
            except OSError:
                continue
            folders.append((stored_at, size, folder))
            total += size
        for _, size, folder in sorted(folders, key=lambda item: item[0]):
            if total <= self.client_bytes:
                break
            for path in folder.iterdir():
                path.unlink(missing_ok=True)
            folder.rmdir()
            total -= size
            with self._lock:
                self.evicted += 1

    def report(self, client: str | None, digest: str) -> AotReport | None:
        """The AOT report stored for ``client`` under ``digest``, or None."""
        path = self._client_dir(client) / "aot-reports" / f"{digest}.json"
        try:
            return parse_report(path.read_text())
        except OSError:
            return None

    def put_report(self, client: str | None, digest: str, report: AotReport) -> None:
        """Store the report ``client``'s worker produced."""
        folder = self._client_dir(client) / "aot-reports"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write(folder / f"{digest}.json", json.dumps(report).encode())


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` at ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


__all__ = ["ANONYMOUS", "CompileStore", "client_id"]
