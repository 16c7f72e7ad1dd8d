"""A sandbox worker as the parent sees it: its launcher process, its pipe, its ready report."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Pipe
from pathlib import Path
from typing import IO, Any

from provider.errors import WorkerStartError
from provider.sandbox.isolation import (
    FORCE_VARIABLE,
    IsolationMode,
    host_pid,
    worker_command,
)
from provider.sandbox.limits import SandboxLimits, limits_to_json
from provider.sandbox.walls import shortfalls
from provider.sandbox.wire import FrameError, pack, unpack

WORKER_MODULE = "provider.sandbox.worker"
FRAME_OVERHEAD = 1 << 20
"""Bytes a frame may hold beyond its payload (the header)."""
OUTPUT_LINE_BYTES = 4096
"""A worker's output line is logged up to this many bytes."""
OUTPUT_BYTES = 1 << 20
"""A worker's output is logged up to this many bytes in all (a hostile one cannot flood it)."""
_log = logging.getLogger("provider.sandbox.worker")
QUIET_PREFIXES = (
    "Failed to find host bounds for accelerator type",
    "WARNING: Logging before InitGoogle()",
)
"""Lines libtpu prints whenever it loads on a host without TPU chips (a compiler worker's
start-up, nothing wrong): not logged."""


def _relay(stream: IO[bytes], launcher_pid: int) -> None:
    """Log each line a worker (or its launcher) writes, as that worker's, until it exits.

    A worker never holds the daemon's stdout, stderr or log file: it could read or forge them.
    """
    logged = 0
    with stream:
        for line in stream:  # read to the end even past the cap: a full pipe would stall it
            text = line[:OUTPUT_LINE_BYTES].decode("utf-8", "replace").rstrip()
            if text.startswith(QUIET_PREFIXES):
                continue
            if text and logged < OUTPUT_BYTES:
                logged += len(text)
                _log.info("worker %d: %s", launcher_pid, text)
                if logged >= OUTPUT_BYTES:
                    _log.warning("worker %d: further output not logged", launcher_pid)


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker that came up: its pid, seconds from spawn to ready, and its devices."""

    pid: int
    start_s: float
    platform: str
    device_kind: str
    isolation: str = IsolationMode.RLIMITS.value
    seccomp: bool = False
    walls: dict[str, Any] = field(default_factory=dict)  # measured inside (provider.sandbox.walls)
    versions: dict[str, Any] = field(default_factory=dict)  # its JAX's ranges (envelope_checks)


class Launcher:
    """A worker's launcher process (bwrap, unshare or the interpreter itself).

    ``pid`` is the interpreter's host pid once the worker said ready; ``exitcode`` is
    negative for a death by signal, as :mod:`multiprocessing` reports it.
    """

    def __init__(self, popen: subprocess.Popen[bytes], mode: IsolationMode) -> None:
        """Wrap ``popen``, launched in isolation ``mode``."""
        self.popen = popen
        self.mode = mode
        self.pid = popen.pid

    def is_alive(self) -> bool:
        """Whether the launcher has not exited."""
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        """The exit code (negative: killed by that signal), None while running."""
        code = self.popen.poll()
        if code is not None and self.mode is not IsolationMode.RLIMITS and code > 128:
            return 128 - code  # the launcher reports a signalled worker as 128 + signal
        return code

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the launcher to exit."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL the worker and its launcher."""
        for pid in {self.pid, self.popen.pid}:
            if self.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


class WorkerProcess:
    """One worker process and the parent's end of its socket pair."""

    def __init__(
        self,
        limits: SandboxLimits,
        cache_root: Path | None,
        env: dict[str, str],
        module: str = WORKER_MODULE,
    ) -> None:
        self.conn, child_conn = Pipe(duplex=True)
        fd = child_conn.fileno()
        argv = [str(fd), limits_to_json(limits), "-" if cache_root is None else str(cache_root)]
        if cache_root is not None:
            cache_root.mkdir(parents=True, exist_ok=True)
        launch = worker_command(module, argv, env, cache_root)
        mode = launch.mode
        # A weaker mode the operator forced (TPUMARKET_SANDBOX_ISOLATION) is allowed as well.
        self.weak_isolation = limits.weak_isolation or bool(os.environ.get(FORCE_VARIABLE))
        if mode is not IsolationMode.BWRAP and not self.weak_isolation:
            child_conn.close()
            self.conn.close()
            raise WorkerStartError(
                f"cannot isolate sandbox workers on this host (only {mode.value}: bubblewrap "
                "with a user namespace is needed); the operator may allow weak isolation"
            )
        self._spawned_at = time.perf_counter()
        try:
            popen = subprocess.Popen(
                launch.args,
                env=launch.env,
                pass_fds=(fd,),
                close_fds=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd="/",
                start_new_session=True,
            )
        finally:
            child_conn.close()
        assert popen.stdout is not None
        threading.Thread(
            target=_relay, args=(popen.stdout, popen.pid), name="sandbox-output", daemon=True
        ).start()
        self.process = Launcher(popen, mode)
        self.info: WorkerInfo | None = None
        self._kill_lock = threading.Lock()
        self.tasks = 0
        self.warm: set[bytes] = set()
        self.superseded = False  # a planned recycle's successor is ready: stop when idle

    def wait_ready(self, timeout_s: float) -> WorkerInfo:
        """Wait for the worker's ready report; kill it and raise if none comes in time."""
        if self.info is not None:
            return self.info
        if not self.conn.poll(timeout_s):
            self.kill()
            raise WorkerStartError(f"sandbox worker did not start within {timeout_s:g} s")
        try:
            header, _ = unpack(self.conn.recv_bytes(FRAME_OVERHEAD))
        except (EOFError, OSError, FrameError) as exc:
            self.kill()
            raise WorkerStartError(
                f"sandbox worker died while starting (exit code {self.process.exitcode})"
            ) from exc
        if header.get("type") != "ready":
            self.kill()
            raise WorkerStartError(f"sandbox worker sent {header.get('type')!r} instead of ready")
        walls = dict(header.get("walls") or {})
        lacking = shortfalls(walls)
        if lacking and not self.weak_isolation:
            self.kill()
            raise WorkerStartError(
                f"sandbox worker is not isolated: {'; '.join(lacking)} (the operator may allow "
                "weak isolation)"
            )
        self.process.pid = host_pid(self.process.popen.pid, int(header["pid"]))
        self.info = WorkerInfo(
            pid=self.process.pid,
            start_s=time.perf_counter() - self._spawned_at,
            platform=str(header["platform"]),
            device_kind=str(header["device_kind"]),
            isolation=self.process.mode.value,
            seccomp=bool(header.get("seccomp", False)),
            walls=walls,
            versions=dict(header.get("versions") or {}),
        )
        return self.info

    def kill(self) -> None:
        """Kill the worker now and close the pipe. The pool's threads may stop one worker at
        once (its close and a recycle): one at a time, so the pipe is closed once."""
        with self._kill_lock:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(10)
            self.conn.close()

    def stop(self) -> None:
        """Ask the worker to exit, then make sure it has."""
        try:
            if self.info is not None and self.process.is_alive():
                self.conn.send_bytes(pack({"op": "exit"}))
                self.process.join(5)
        except OSError:
            pass
        self.kill()
