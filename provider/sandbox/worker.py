"""Entry point of a sandbox worker process: ``python -m provider.sandbox.worker FD LIMITS CACHE``.

The parent starts it as a fresh interpreter (never a fork: a forked JAX runtime is unsafe)
inside the isolation of :mod:`provider.sandbox.isolation`, with one end of a socket pair as
file descriptor ``FD``, the limits as JSON and the compile cache dir (or ``-``). This module
must not import JAX at import time. The worker sets its rlimits and syscall filter before
importing JAX, says ``ready``, then serves one task at a time.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from provider.diagnosis import Stage
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.wire import FrameError, pack, unpack


def _cap(kind: int, value: int) -> None:
    """Lower both the soft and the hard limit of ``kind`` to ``value`` (never raise them)."""
    _soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def limit_resources(limits: SandboxLimits) -> None:
    """Cap the worker's memory, files, file sizes, processes and core dumps."""
    _cap(resource.RLIMIT_AS, limits.address_space_bytes)
    _cap(resource.RLIMIT_CORE, 0)
    _cap(resource.RLIMIT_NOFILE, limits.open_files)
    _cap(resource.RLIMIT_FSIZE, limits.file_size_bytes)
    _cap(resource.RLIMIT_NPROC, limits.processes)


def _limit_cpu(limits: SandboxLimits) -> None:
    """Allow the next task ``cpu_seconds_per_task`` of CPU time (SIGXCPU ends it after)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + limits.cpu_seconds_per_task
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def confine(channel_fd: int, limits: SandboxLimits) -> dict[str, Any]:
    """Set the rlimits, priority and syscall allowlist; return the walls measured after.

    The allowlist goes in before JAX is imported, so every thread JAX starts inherits it.
    """
    limit_resources(limits)
    if limits.nice:
        os.nice(limits.nice)
    from provider.sandbox.seccomp import install_filter
    from provider.sandbox.walls import measure

    filtered = install_filter()
    return measure(channel_fd, filtered)


def main(argv: list[str]) -> None:
    """Start a worker from its command line (see the module docstring)."""
    fd, limits_json, cache_root = argv
    limits = SandboxLimits(**json.loads(limits_json))
    worker_main(Connection(int(fd)), limits, None if cache_root == "-" else cache_root, {})


def worker_main(
    conn: Connection, limits: SandboxLimits, cache_root: str | None, env: dict[str, str]
) -> None:
    """Serve tasks from the parent over ``conn`` until told to exit or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)
    started = time.perf_counter()
    walls = confine(conn.fileno(), limits)
    from provider.sandbox.envelope_checks import ranges_to_wire
    from provider.sandbox.runtime import WorkerRuntime

    runtime = WorkerRuntime(limits, None if cache_root is None else Path(cache_root))
    if limits.warm_up:
        runtime.warm_up()
    conn.send_bytes(
        pack(
            {
                "type": "ready",
                "pid": os.getpid(),
                "start_s": time.perf_counter() - started,
                "platform": str(runtime.local_device.platform),
                "device_kind": runtime.local_kind,
                "seccomp": walls["seccomp"] == "allowlist",
                "walls": walls,
                "versions": ranges_to_wire(runtime.ranges),
            }
        )
    )

    def progress(stage: Stage) -> None:
        conn.send_bytes(pack({"type": "stage", "stage": stage.value}))

    while True:
        try:
            header, payload = unpack(conn.recv_bytes())
        except (EOFError, OSError):
            return
        except FrameError:
            conn.send_bytes(pack({"type": "error", "message": "bad request frame"}))
            continue
        op = header.get("op")
        _limit_cpu(limits)
        if op == "exit":
            return
        reply: Mapping[str, object]
        if op == "compile":
            reply, body = runtime.compile(str(header.get("target", "local")), payload, progress)
        elif op == "run":
            reply, body = runtime.run(payload, progress)
        elif op == "validate":
            platform = header.get("platform")
            reply, body = runtime.validate(payload, None if platform is None else str(platform))
        elif op == "run_warm":
            reply, body = runtime.run_warm(header, payload)
        elif op == "capacity":
            from provider.capacity import capacity_to_wire, discover

            reply, body = (
                {
                    "type": "capacity",
                    "capacity": capacity_to_wire(
                        discover(
                            benchmark=bool(header.get("benchmark", True)),
                            aot_targets=tuple(header.get("aot_targets", ())),
                        )
                    ),
                },
                b"",
            )
        else:
            reply, body = {"type": "error", "message": f"unknown op {op!r}"}, b""
        conn.send_bytes(pack(reply, body))


if __name__ == "__main__":
    main(sys.argv[1:])
