"""A compromised sandbox worker (test-only entry point): it hunts for cache entries and plants some.

Started by the pool exactly as the real worker (``python -m tests.provider.cache_attacker FD
LIMITS CACHE``), it answers like a worker, but as an attacker with code execution:

- ``compile`` for ``local``: lists and reads every file under the cache directory it was
  handed (if any), notes the entries the daemon sent with the request, tries to write into
  that directory, and answers a ``failed`` reply whose message is what it found (JSON);
- ``compile`` for a TPU topology: answers forged figures (``FORGED_TEMP_BYTES``) as a fresh
  compile, and plants a forged cache entry through the channel and a forged report file in
  the cache directory where the old daemon read reports from.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from programs.envelope import decode_envelope
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.wire import pack, unpack

FORGED_TEMP_BYTES = 7_777
FORGED_KEY = "jit_flat_call-" + "ab" * 32


def _section(payload: bytes) -> tuple[list[str], bytes]:
    try:
        from provider.sandbox.cache_wire import unpack_request
    except ImportError:  # a daemon that sends no cache section
        return [], payload
    section, envelope = unpack_request(payload)
    return ([] if section is None else sorted(section.entries)), envelope


def _hunt(root: Path | None) -> dict[str, Any]:
    found: dict[str, Any] = {"listed": [], "read_bytes": 0, "planted": "no directory"}
    if root is None:
        return found
    for path in sorted(root.rglob("*")):
        if path.is_file():
            found["listed"].append(str(path.relative_to(root)))
            with contextlib.suppress(OSError):
                found["read_bytes"] += len(path.read_bytes())
    try:
        (root / "planted-by-attacker").write_text("x")
        found["planted"] = "ok"
    except OSError as exc:
        found["planted"] = f"refused: {type(exc).__name__}"
    return found


def _forged_reports(root: Path | None, figures: dict[str, Any]) -> None:
    """Overwrite every report file the old layout kept in the shared directory."""
    if root is None:
        return
    for path in root.rglob("aot-reports/*.json"):
        path.write_text(json.dumps(figures))


def main(argv: list[str]) -> None:
    """Serve as a worker would, as an attacker."""
    fd, limits_json, cache = argv
    root = None if cache == "-" else Path(cache)
    conn = Connection(int(fd))
    walls: dict[str, Any] = {}
    try:  # walled in as the real worker is (the attack starts from inside its walls)
        from provider.sandbox.worker import confine  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        pass
    else:
        walls = confine(conn.fileno(), SandboxLimits(**json.loads(limits_json)))
    ready = {"type": "ready", "pid": os.getpid(), "platform": "cpu", "device_kind": "cpu"}
    seccomp = walls.get("seccomp") == "allowlist"
    conn.send_bytes(pack({**ready, "start_s": 0.0, "seccomp": seccomp, "walls": walls}))
    while True:
        try:
            header, payload = unpack(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if header.get("op") == "exit":
            return
        received, envelope_bytes = _section(payload)
        sha = decode_envelope(envelope_bytes).program_sha256.hex()
        if header.get("target", "local") == "local":
            found = {**_hunt(root), "received": received}
            message = json.dumps(found)
            diagnosis: dict[str, Any] = {"category": "worker_crash", "message": message}
            diagnosis["stage"] = "compile"
            diagnosis |= {"op": None, "required_bytes": None, "available_bytes": None}
            reply: dict[str, Any] = {"type": "failed", "diagnosis": diagnosis}
            conn.send_bytes(pack({**reply, "program_sha256": sha, "elapsed_s": 0.0}))
            continue
        memory = {
            "argument_bytes": 1,
            "output_bytes": 1,
            "temp_bytes": FORGED_TEMP_BYTES,
            "alias_bytes": 0,
            "generated_code_bytes": 1,
        }
        figures = {"memory": memory, "cost": None, "available_bytes": 1 << 40}
        _forged_reports(root, {**figures, "platform": "tpu", "device_kind": "TPU v5 lite"})
        forged = b"forged executable"
        compiled = {
            "type": "compiled",
            "program_sha256": sha,
            "target": str(header.get("target")),
            "platform": "tpu",
            "device_kind": "TPU v5 lite",
            "compile_time_s": 0.5,
            "cache_hit": False,
            **figures,
            "cache_put": [[FORGED_KEY, len(forged)]],
        }
        conn.send_bytes(pack(compiled, forged))


if __name__ == "__main__":
    main(sys.argv[1:])
