"""An attacker running code inside a real worker reaches nothing outside it.

The worker is the test-only entry of :mod:`tests.provider.sandbox_attacker`, started by the
daemon's own launcher and walled in as the real worker is; it tries every escape in
``ATTEMPTS`` against a daemon-like world (a key file, a journal, a log on the daemon's stderr,
TCP, unix and abstract listeners) and a second worker holding a secret in its ``/tmp``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from provider.errors import WorkerStartError
from provider.sandbox import isolation
from provider.sandbox.isolation import IsolationMode, isolation_mode
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.walls import shortfalls
from tests.polling import wait_until
from tests.provider.sandbox_attacker import attack, attacker_pool, escapes, run_code

pytestmark = pytest.mark.skipif(
    isolation_mode() is not IsolationMode.BWRAP, reason="bwrap is not installed"
)


def test_attacker_in_a_worker_reaches_nothing_outside(tmp_path: Path) -> None:
    found = attack(tmp_path)
    print(json.dumps(found, indent=1, default=str))
    assert escapes(found, str(tmp_path / "daemon.log")) == []
    walls = found["walls"]
    assert walls["uid"] == walls["host_uid"] == 65534 and walls["capabilities"] == "none"
    assert walls["no_new_privs"] and walls["seccomp"] == "allowlist"
    assert walls["network"] == "none" and walls["inherited_fds"] == 0
    assert found["ro_mounts"] >= 5  # /usr, the interpreter, the venv, the project's code
    for name in ("open_tree /usr", "mount_setattr /usr", "remount /usr", "fsopen", "execveat"):
        assert found[name].startswith("refused: PermissionError"), (name, found[name])
    assert found["execve /bin/sh"].startswith("refused: PermissionError")
    assert found["io_uring_setup"].startswith("refused: PermissionError")
    assert found["setuid 0"].startswith("refused: PermissionError")
    assert found["tcp loopback"] == found["vsock"] == found["netlink"]
    assert found["tcp loopback"].startswith("refused: PermissionError")
    assert found["read key"].startswith("refused: FileNotFoundError")
    fds = sorted(int(fd) for fd in found["fds"])
    assert fds[:3] == [0, 1, 2] and len(fds) == 4  # stdio and the channel
    assert str(tmp_path / "daemon.log") not in found["fds"].values()
    assert "daemon log" not in found["read stderr"]


def test_daemon_refuses_a_worker_it_cannot_isolate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strict by default: a host without bwrap gets no worker unless the operator allows it."""
    monkeypatch.setattr(isolation, "isolation_mode", lambda: IsolationMode.RLIMITS)
    with pytest.raises(WorkerStartError, match="cannot isolate"):
        attacker_pool()
    pool = attacker_pool(SandboxLimits(start_timeout_s=120, weak_isolation=True))
    try:
        walls = pool.worker_infos()[0].walls
        assert walls["seccomp"] == "allowlist" and walls["network"] == "none"
        assert walls["interfaces"] != ["lo"]  # no network namespace: measured, not claimed
        assert shortfalls(walls)  # /v1/info lists what it lacks
    finally:
        pool.close()


def test_worker_reads_what_the_runtime_needs() -> None:
    """The unprivileged worker can still read what XLA and libtpu read (CPU count, loader)."""
    pool = attacker_pool()
    try:
        code = (
            "result = [len(open(p, 'rb').read(4)) for p in ('/sys/devices/system/cpu/possible', "
            "'/sys/devices/system/cpu/online', '/etc/ld.so.cache', '/etc/passwd')]"
        )
        assert all(run_code(pool, code))
    finally:
        pool.close()


def test_worker_output_is_logged_as_the_worker_s(caplog: pytest.LogCaptureFixture) -> None:
    """What a worker writes reaches the daemon's log only as its own lines, never raw."""
    caplog.set_level(logging.INFO, logger="provider.sandbox.worker")
    pool = attacker_pool()
    try:
        code = "import sys; sys.stderr.write('daemon: key accepted\\n'); sys.stderr.flush()"
        run_code(pool, code + "; result = 1")
        wait_until(
            lambda: any("key accepted" in r.getMessage() for r in caplog.records),
            30,
            "the worker's line in the log",
        )
        (line,) = [r.getMessage() for r in caplog.records if "key accepted" in r.getMessage()]
        assert line.startswith("worker ") and line.endswith(": daemon: key accepted")
    finally:
        pool.close()
