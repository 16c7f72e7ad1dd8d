"""A sandbox's workers die with the process that owns it, even when that process is SIGKILLed
while a worker runs a task, in every isolation mode (bwrap's --die-with-parent; a parent-death
signal on the launcher for unshare and rlimits)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.polling import wait_until
from tests.processes import kill, spawn

OWNER = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    from provider.sandbox import Sandbox, SandboxLimits
    from tests.provider.daemon_support import spin_envelope

    box = Sandbox(1, SandboxLimits(), Path(sys.argv[1]), jax_platforms="cpu")
    envelope = spin_envelope(2_000_000_000)  # about half a minute of one core
    threading.Thread(target=box.run, args=(envelope,), daemon=True).start()
    print("running", flush=True)
    time.sleep(600)
    """
)


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    pending = [pid]
    while pending:
        for task in Path(f"/proc/{pending.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found.update(children)
            pending.extend(children)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _busy(pids: set[int]) -> bool:
    """Return whether one of ``pids`` is using the CPU (the worker runs the task)."""
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[11]) + int(fields[12]) > 300:  # utime + stime > 3 s of ticks
            return True
    return False


@pytest.mark.parametrize("mode", ["bwrap", "unshare", "rlimits"])
def test_workers_die_with_a_sigkilled_owner_even_mid_task(mode: str, tmp_path: Path) -> None:
    env = {**os.environ, "TPUMARKET_SANDBOX_ISOLATION": mode, "JAX_PLATFORMS": "cpu"}
    if mode == "bwrap":
        env.pop("TPUMARKET_SANDBOX_ISOLATION")
    owner = spawn(
        [sys.executable, "-c", OWNER, str(tmp_path / "cache")],
        env=env,
        stdout=-1,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == b"running"
        wait_until(lambda: _busy(_descendants(owner.pid)), 120, "a worker running the task")
        workers = _descendants(owner.pid)
        assert workers
    finally:
        kill(owner)  # SIGKILL: no teardown runs in the owner
    wait_until(lambda: not any(_alive(p) for p in workers), 15, "the workers gone")
