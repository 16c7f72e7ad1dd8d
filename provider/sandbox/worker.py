"""Entry point of a spawned sandbox worker process.

The parent starts it with the ``spawn`` context (never ``fork``: a forked JAX runtime is
unsafe), so this module must not import JAX at import time. The worker limits its own
address space before importing JAX, says ``ready``, then serves one task at a time.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path

from provider.diagnosis import Stage
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.wire import FrameError, pack, unpack


def _limit_resources(limits: SandboxLimits) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limits.address_space_bytes, limits.address_space_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def worker_main(
    conn: Connection, limits: SandboxLimits, cache_root: str | None, env: dict[str, str]
) -> None:
    """Serve tasks from the parent over ``conn`` until told to exit or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)
    started = time.perf_counter()
    _limit_resources(limits)
    from provider.sandbox.runtime import WorkerRuntime

    runtime = WorkerRuntime(limits, None if cache_root is None else Path(cache_root))
    runtime.warm_up()
    conn.send_bytes(
        pack(
            {
                "type": "ready",
                "pid": os.getpid(),
                "start_s": time.perf_counter() - started,
                "platform": str(runtime.local_device.platform),
                "device_kind": runtime.local_kind,
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
        if op == "exit":
            return
        if op == "compile":
            reply, body = runtime.compile(str(header.get("target", "local")), payload, progress)
        elif op == "run":
            reply, body = runtime.run(payload, progress)
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
