"""The daemon's start, phase by phase: what is still warming, and how long each phase took.

``tpumarket provider run`` serves its API as soon as the journal is open and its unfinished
tasks are recovered; the slow parts (the sandbox's workers importing JAX, the capacity
benchmark, the heartbeat and the ask on the market) warm up behind it. ``GET /v1/health``
lists what is still warming: it answers 503 (with ``Retry-After``) while the sandbox's
workers start, and 200 once tasks can run, the market's phases still warming or not.
Each phase ends with one ``start phase`` log line (``phase``, ``seconds``), which
``scripts/bench-provider-start`` reads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("provider.start")
TASK_PHASES = ("sandbox",)
"""Phases without which no task can run: ``/v1/health`` answers 503 while one warms."""


def since_process_start() -> float | None:
    """Seconds since this process started (Linux ``/proc``), None where unknown."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as uptime:
            up = float(uptime.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, up - int(fields[19]) / ticks)  # field 22 of stat: starttime in ticks


class Warmup:
    """The start phases still running (what ``/v1/health`` lists as ``warming``)."""

    def __init__(self) -> None:
        """Start with nothing warming."""
        self._lock = threading.Lock()
        self._held: list[tuple[str, float, str | None]] | None = []
        """Phases ended before :meth:`log_from_now`: logged then (a config error stays one line)."""
        self._running: dict[str, float] = {}
        self.failures: dict[str, str] = {}
        """Phases that failed, with their error (the daemon serves on without them)."""

    def warming(self) -> list[str]:
        """Return the phases still running, in the order they began."""
        with self._lock:
            return list(self._running)

    def serving(self) -> bool:
        """Whether tasks can run: no phase of :data:`TASK_PHASES` is warming or failed."""
        with self._lock:
            return not any(n in self._running or n in self.failures for n in TASK_PHASES)

    def begin(self, name: str) -> None:
        """Mark ``name`` as warming."""
        with self._lock:
            self._running.setdefault(name, time.monotonic())

    def abandon(self, names: tuple[str, ...], error: str) -> None:
        """End those of ``names`` still warming as failed with ``error``."""
        for name in self.warming():
            if name in names:
                self.end(name, error)

    def end(self, name: str, error: str | None = None) -> None:
        """Mark ``name`` as done (or failed with ``error``) and log how long it took."""
        with self._lock:
            began = self._running.pop(name, None)
            if error is not None:
                self.failures[name] = error
        if began is not None:
            self.record(name, time.monotonic() - began, error)

    def record(self, name: str, seconds: float, error: str | None = None) -> None:
        """Log a phase's ``start phase`` line (held until :meth:`log_from_now`)."""
        with self._lock:
            if self._held is not None:
                self._held.append((name, seconds, error))
                return
        report(name, seconds, error)

    def log_from_now(self) -> None:
        """Log the phases held so far, and every later one as it ends."""
        with self._lock:
            held, self._held = self._held or [], None
        for name, seconds, error in held:
            report(name, seconds, error)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run a block as phase ``name`` (an exception ends it as failed, and propagates);
        its seconds count from the block's start, not from an earlier :meth:`begin`."""
        with self._lock:
            self._running[name] = time.monotonic()
        try:
            yield
        except BaseException as exc:
            self.end(name, str(exc) or type(exc).__name__)
            raise
        self.end(name)


def report(name: str, seconds: float, error: str | None = None) -> None:
    """Log one ``start phase`` line."""
    extra: dict[str, object] = {"phase": name, "seconds": round(seconds, 3)}
    if error is not None:
        extra["error"] = error
    log.info("start phase", extra=extra)
