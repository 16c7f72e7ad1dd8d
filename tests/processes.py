"""Processes the tests start, and the guarantee that none outlives the test run.

However a run ends (its last test, Ctrl-C, SIGTERM from a CI timeout, ``kill -9`` of pytest, a
fixture that fails halfway through its set-up) no anvil, market, daemon, worker or CLI it started
keeps running. Three layers give that:

1. :func:`spawn` starts a child in its own session (so a terminal's Ctrl-C reaches pytest alone,
   whose teardown stops the child) with a parent-death signal: the kernel SIGKILLs the child
   when the pytest process dies, even by SIGKILL. Every child is registered; :func:`stop` sends
   SIGTERM to its process group and SIGKILL to what is left after a grace period.
2. :func:`install` gives the run an id, ``TESTS_RUN_ID`` in ``os.environ``, which every process
   started afterwards inherits, children of children included, also those the project's own
   code starts (``Anvil.start``, the demo's processes, Playwright's browser). :func:`sweep`
   stops what carries the id, and the groups and sessions such processes lead. The session's
   end (``pytest_sessionfinish``) and interpreter exit (``atexit``) reap the registered children
   and sweep. SIGTERM becomes ``KeyboardInterrupt``, so pytest runs every teardown.
3. A watchdog (this module run by ``python -m tests.processes watch``) waits for the pytest
   process to exit, by any means, then sweeps. It is the only layer that works after
   ``kill -9`` for a process that no :func:`spawn` started (``Anvil.start`` sets no
   parent-death signal).

4. In a run of the fast set (``-m "not slow"``), :func:`forbid_components` makes starting a
   process, a listening server or a multiprocessing child raise :class:`ComponentInFastRun`
   naming the test: a test that starts one is slow, and the fast set must not hold it.

A process whose environment its starter scrubs (a sandbox worker: ``--clearenv``) carries no id:
stopping it is the job of whoever started it (the provider daemon, the sandbox pool).

The module imports the standard library only: the watchdog starts in a few milliseconds.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from services.lifetime import dies_with_parent

RUN_ENV = "TESTS_RUN_ID"
"""The environment variable that names the test runs a process belongs to: ``outer:inner``
when a test starts a pytest of its own, so that the outer run's sweep reaches the inner's."""
ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 10.0
"""Default seconds between SIGTERM and SIGKILL."""
SWEEP_GRACE_S = 10.0

_lock = threading.Lock()
_children: dict[int, subprocess.Popen[Any]] = {}
_watchdog: subprocess.Popen[bytes] | None = None
_owner: int | None = None  # the process that installed: a forked copy of it must not sweep

FAST_ENV = "TESTS_FAST_SET"
"""Set to ``1`` by :func:`forbid_components`: a run of the fast set, which starts no component."""
ALLOWED_CALLERS = ("ctypes.util", "platform", "uuid")
"""Standard-library modules that run a short helper process of their own to answer a question
(``ldconfig -p`` for ``find_library``): not a component a test starts."""
_forbidden = False
_current = "(no test yet)"


class ComponentInFastRun(RuntimeError):
    """A test of the fast set (``-m "not slow"``) started a real component."""


def set_current(nodeid: str) -> None:
    """Name the test (or the module being collected) that runs now, for the guard's message."""
    global _current
    _current = nodeid


def refuse_component(what: str) -> None:
    """Raise :class:`ComponentInFastRun` naming the current test if this run is the fast set."""
    if _forbidden:
        raise ComponentInFastRun(
            f'{_current} started {what} in a run of the fast set (-m "not slow"). A test that '
            "starts anvil, the Solidity compiler, a sandbox worker, a server, a subprocess, "
            "PostgreSQL or Chromium is slow: start it from a fixture (tests/conftest.py marks "
            "every test that uses one slow by what it starts), or from the test's own code, "
            "which the same scan reads"
        )


def _caller_module() -> str:
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(
        ("subprocess", "asyncio", "tests.processes")
    ):
        frame = frame.f_back  # type: ignore[assignment]
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


def forbid_components() -> None:
    """From now on, starting a process, a listening socket or a multiprocessing child raises
    :class:`ComponentInFastRun` (the fast set's guard). Idempotent."""
    global _forbidden
    if _forbidden:
        return
    import multiprocessing.process
    import socket

    _forbidden = True
    os.environ[FAST_ENV] = "1"
    popen_init = subprocess.Popen.__init__
    listen = socket.socket.listen
    mp_start = multiprocessing.process.BaseProcess.start

    def guarded_popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        if not _caller_module().startswith(ALLOWED_CALLERS):
            shown = args if isinstance(args, str) else " ".join(map(str, args))
            refuse_component(f"a subprocess ({shown[:120]})")
        popen_init(self, args, *rest, **kw)

    def guarded_listen(self: socket.socket, *args: Any) -> None:
        refuse_component(f"a server (listening on {self.getsockname()})")
        listen(self, *args)

    def guarded_start(self: multiprocessing.process.BaseProcess) -> None:
        refuse_component(f"a multiprocessing child ({self.name})")
        mp_start(self)

    subprocess.Popen.__init__ = guarded_popen  # type: ignore[method-assign]
    socket.socket.listen = guarded_listen  # type: ignore[method-assign,assignment]
    multiprocessing.process.BaseProcess.start = guarded_start  # type: ignore[method-assign]


def run_id() -> str | None:
    """Return this run's id (None before :func:`install`)."""
    if _watchdog is None:
        return None
    return os.environ[RUN_ENV].rsplit(":", 1)[-1]


def spawn(args: Sequence[str | os.PathLike[str]], **options: Any) -> subprocess.Popen[Any]:
    """Start ``args`` like :class:`subprocess.Popen` (same keyword options) so that it dies
    with this process.

    The child leads a new session (and process group), gets SIGKILL when this process dies
    (by ``setpriv --pdeathsig``; only when called from the main thread: the kernel ties the
    signal to the thread that forked, and other threads end before the process does; the
    watchdog covers the rest, and the moment between fork and the signal being armed), and
    inherits the run's id even when ``env`` is given. ``args`` is a command line, not a shell
    string. Stop it with :func:`stop`.
    """
    for own in ("start_new_session", "process_group", "shell", "executable"):
        if own in options:
            raise TypeError(f"spawn sets {own} itself")
    runs = os.environ.get(RUN_ENV)
    if runs is not None and options.get("env") is not None:
        options["env"] = {RUN_ENV: runs, **options["env"]}
    command = dies_with_parent([os.fspath(arg) for arg in args])  # exec'd: same pid
    process: subprocess.Popen[Any] = subprocess.Popen(command, start_new_session=True, **options)
    with _lock:
        for pid in [pid for pid, child in _children.items() if child.poll() is not None]:
            del _children[pid]
        _children[process.pid] = process
    return process


def _signal_group(process: subprocess.Popen[Any], sig: signal.Signals) -> None:
    """Send ``sig`` to the child's process group (it leads one: :func:`spawn` made it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def stop(process: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> int:
    """SIGTERM a spawned child's group; SIGKILL the group after ``grace_s``; return the exit code.

    What the child started in its own group (a shell's command, a daemon's helpers) goes with
    it; what it started in a session of its own is its to stop.
    """
    _signal_group(process, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(grace_s)
    # Stragglers of the group, the leader too if it ignored SIGTERM. A group id is not reused
    # while a member lives, and pids are handed out in a cycle: this reaches no stranger.
    _signal_group(process, signal.SIGKILL)
    code = process.wait()
    with _lock:
        _children.pop(process.pid, None)
    return code


def kill(process: subprocess.Popen[Any]) -> int:
    """SIGKILL a spawned child's process group (no cleanup of any kind); return the exit code."""
    _signal_group(process, signal.SIGKILL)
    code = process.wait()
    with _lock:
        _children.pop(process.pid, None)
    return code


def unmarked_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return ``env`` (default: ``os.environ``) without the run's id.

    For a process meant to outlive the run (a shared PostgreSQL cluster), which the sweep
    would otherwise stop.
    """
    return {k: v for k, v in (os.environ if env is None else env).items() if k != RUN_ENV}


@dataclass(frozen=True, slots=True)
class Found:
    """A process of the run: pid, process group, session and command line."""

    pid: int
    pgid: int
    sid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command[:200]})"


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """Return (state, ppid, pgid, sid) of a process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def find(
    marker: str, *, variable: str = RUN_ENV, exclude: frozenset[int] = frozenset()
) -> list[Found]:
    """Return the live processes whose environment holds ``variable=marker`` (or a ``:``
    separated list that names it), with every member of a process group or session that one
    of them leads."""
    prefix = f"{variable}=".encode()
    live: dict[int, tuple[int, int]] = {}
    marked: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        pid = int(name)
        stat = _stat(pid)
        if stat is None or stat[0] in "ZX":
            continue
        live[pid] = (stat[2], stat[3])
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for entry in environ.split(b"\0"):
            if entry.startswith(prefix) and marker.encode() in entry[len(prefix) :].split(b":"):
                marked.add(pid)
    return [
        Found(pid, pgid, sid, _command(pid))
        for pid, (pgid, sid) in sorted(live.items())
        if pid in marked or pgid in marked or sid in marked
    ]


def _wait_gone(marker: str, exclude: frozenset[int], timeout_s: float) -> list[Found]:
    """Poll until no process of the run is left or ``timeout_s`` passes; return what is left."""
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        left = find(marker, exclude=exclude)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(delay)  # polling other processes' exit
        delay = min(delay * 2, 0.25)


def sweep(marker: str, grace_s: float = SWEEP_GRACE_S) -> list[Found]:
    """Stop every process of the run ``marker``: SIGTERM, then SIGKILL after ``grace_s``.

    Return what was found running. The calling process (and its watchdog) are spared.
    """
    exclude = frozenset({os.getpid()} | ({_watchdog.pid} if _watchdog is not None else set()))
    found = find(marker, exclude=exclude)
    if not found:
        return []
    for process in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGTERM)
    for process in _wait_gone(marker, exclude, grace_s):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGKILL)
    _wait_gone(marker, exclude, 10.0)
    return found


def reap(grace_s: float = STOP_GRACE_S) -> list[Found]:
    """Stop every registered child still running, then sweep the run; return what was left."""
    with _lock:
        children = list(_children.values())
    left: list[Found] = []
    for child in children:
        if child.poll() is None:
            left.append(Found(child.pid, child.pid, child.pid, _command(child.pid)))
            stop(child, grace_s)
    marker = run_id()
    if marker is not None:
        left += sweep(marker, grace_s)
    return left


def _terminate(signum: int, frame: FrameType | None) -> None:
    """Turn the first SIGTERM into KeyboardInterrupt (pytest then runs every teardown)."""
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    if os.getpid() != _owner:  # a forked copy of pytest: die of it, as without this handler
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _reap_at_exit() -> None:
    if os.getpid() == _owner:
        reap()


def install() -> str:
    """Give this process's run an id, start its watchdog, hook SIGTERM and exit; return the id.

    Call once, from the main thread, before any child starts. A nested run (a pytest started
    by a test) adds an id of its own to the outer run's: both runs' sweeps reach its processes.
    """
    global _watchdog, _owner
    if _watchdog is not None:  # installed already (a second configure in this process)
        return os.environ[RUN_ENV].rsplit(":", 1)[-1]
    marker = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    outer = os.environ.get(RUN_ENV)
    _watchdog = subprocess.Popen(
        [sys.executable, "-m", "tests.processes", "watch", str(os.getpid()), marker],
        cwd=ROOT,
        env=unmarked_env() if outer is None else {**unmarked_env(), RUN_ENV: outer},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a signal to pytest's group (Ctrl-C) leaves it running
    )
    os.environ[RUN_ENV] = marker if outer is None else f"{outer}:{marker}"
    _owner = os.getpid()
    atexit.register(_reap_at_exit)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # not if the caller ignores it
        signal.signal(signal.SIGTERM, _terminate)
    return marker


def watch(parent: int, marker: str) -> list[Found]:
    """Wait for ``parent`` to exit, then sweep its run; return what was found."""
    try:
        pidfd: int | None = os.pidfd_open(parent)
    except ProcessLookupError:
        pidfd = None
    if pidfd is not None:
        if os.getppid() == parent:  # else it had died already: the descriptor is a stranger's
            select.select([pidfd], [], [])  # readable once the process has exited
        os.close(pidfd)
    return sweep(marker)


def main(argv: Sequence[str]) -> int:
    """``watch PARENT_PID RUN_ID``: the watchdog of one test run."""
    if len(argv) != 3 or argv[0] != "watch":
        print("usage: python -m tests.processes watch PARENT_PID RUN_ID", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for process in watch(int(argv[1]), argv[2]):
        print(f"tests.processes: run {argv[2]} ended; stopped {process}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
