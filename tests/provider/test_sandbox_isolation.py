"""A compromised worker can read neither the key, nor the data dir or journal, nor the network.

The worker entry point is replaced by :func:`compromised_main` (this module run as
``python -m``), which stands for a worker whose parser or kernel an attacker took over: it
walls itself in as a real worker does (rlimits, the syscall allowlist), then tries to steal
the provider's key from its environment and from the daemon's ``/proc/<pid>/environ``, to read
the journal and list the data dir, to see the host's ``/tmp``, to write into the project's
code, and to connect to a TCP port the daemon's host listens on. It reports what it got; the
test asserts it got nothing. (:mod:`tests.provider.test_sandbox_escapes` tries the rest.)
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provider.sandbox.isolation import IsolationMode, isolation_mode, worker_env
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.pool import WorkerPool

SECRET = "0x" + "5e" * 32
KEY_VAR = "TPUMARKET_PROVIDER_PRIVATE_KEY"


def _attempt(action: Any) -> str:
    try:
        return f"ok: {action()!r}"[:200]
    except Exception as exc:
        return f"refused: {type(exc).__name__}"


def _connect(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=3):
        return "connected"


def _scan_environs() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if SECRET.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _probe(request: dict[str, Any]) -> dict[str, Any]:
    data_dir = Path(request["data_dir"])
    return {
        "env_key": os.environ.get(KEY_VAR),
        "env_names": sorted(os.environ),
        "secret_in_env": any(SECRET in v for v in os.environ.values()),
        "daemon_environ": _attempt(
            lambda: SECRET.encode() in Path(f"/proc/{request['daemon_pid']}/environ").read_bytes()
        ),
        "environs_with_key": _scan_environs(),
        "journal": _attempt(lambda: (data_dir / "journal.sqlite").read_bytes()),
        "key_file": _attempt(lambda: (data_dir / "provider.key").read_text()),
        "data_dir": _attempt(lambda: os.listdir(data_dir)),
        "host_tmp": _attempt(lambda: Path(request["host_tmp_file"]).read_text()),
        "write_code": _attempt(lambda: Path(request["code_dir"], "planted.py").write_text("pwned")),
        "tcp": _attempt(lambda: _connect(int(request["port"]))),
        "scratch": _attempt(lambda: Path("/tmp/scratch").write_text("mine")),
        "seccomp": [
            line.split()[1]
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("Seccomp:")
        ],
    }


def compromised_main(argv: list[str]) -> None:
    """A worker entry point taken over by an attacker (see the module docstring)."""
    from multiprocessing.connection import Connection

    from provider.sandbox.wire import pack, unpack
    from provider.sandbox.worker import confine

    fd, limits_json, _ = argv
    conn = Connection(int(fd))
    walls = confine(conn.fileno(), SandboxLimits(**json.loads(limits_json)))
    ready = {"type": "ready", "pid": os.getpid(), "platform": "cpu", "device_kind": "cpu"}
    conn.send_bytes(pack({**ready, "seccomp": walls["seccomp"] == "allowlist", "walls": walls}))
    header, _ = unpack(conn.recv_bytes())
    if header.get("op") != "probe":
        return
    conn.send_bytes(pack({"type": "probe", "found": _probe(header)}))


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A daemon-like process: its key in the env, a data dir with a journal, a TCP listener."""
    monkeypatch.setenv(KEY_VAR, SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "journal.sqlite").write_bytes(b"journal " + SECRET.encode())
    (data_dir / "provider.key").write_text(SECRET)
    host_tmp = tmp_path / "host-tmp-file"
    host_tmp.write_text(SECRET)
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield {
            "data_dir": data_dir,
            "port": server.getsockname()[1],
            "host_tmp_file": str(host_tmp),
            "server": server,
        }


def _run_compromised(
    world: dict[str, Any], code_dir: Path = Path(__file__).parent
) -> dict[str, Any]:
    limits = SandboxLimits(start_timeout_s=60)
    env = worker_env({"JAX_PLATFORMS": "cpu"})
    pool = WorkerPool(
        1, limits, world["data_dir"] / "compile-cache", env, module=__name__, spares=0
    )
    try:
        reply = pool.call(
            {
                "op": "probe",
                "daemon_pid": os.getpid(),
                "data_dir": str(world["data_dir"]),
                "host_tmp_file": world["host_tmp_file"],
                "code_dir": str(code_dir),
                "port": world["port"],
            },
            b"",
        )
        assert isinstance(reply, tuple), reply
        found: dict[str, Any] = reply[0]["found"]
        found["info"] = pool.worker_infos()[0]
        return found
    finally:
        pool.close()


def test_worker_environment_is_an_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, SECRET)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    env = worker_env({"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
    assert KEY_VAR not in env and SECRET not in env.values()
    assert env["JAX_PLATFORMS"] == "cpu" and env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    with pytest.raises(ValueError, match=KEY_VAR):
        worker_env({KEY_VAR: SECRET})


@pytest.mark.skipif(isolation_mode() is not IsolationMode.BWRAP, reason="bwrap is not installed")
def test_compromised_worker_reaches_no_key_file_or_network(world: dict[str, Any]) -> None:
    found = _run_compromised(world)
    print(json.dumps({k: v for k, v in found.items() if k != "info"}, indent=1))
    assert found["info"].isolation == "bwrap"
    assert found["env_key"] is None and not found["secret_in_env"]
    assert KEY_VAR not in found["env_names"]
    assert not found["daemon_environ"].startswith("ok: True")
    assert found["environs_with_key"] == []
    for name in ("journal", "key_file", "host_tmp", "write_code", "tcp"):
        assert found[name].startswith("refused"), (name, found[name])
    assert found["tcp"] == "refused: PermissionError"  # the syscall filter
    assert found["data_dir"] == "ok: ['compile-cache']"  # only the cache is mounted there
    assert found["scratch"].startswith("ok")  # its own /tmp is writable
    assert not (Path(__file__).parent / "planted.py").exists()
    assert found["seccomp"] == ["2"] and found["info"].seccomp
    world["server"].settimeout(0.1)
    with pytest.raises(TimeoutError):
        world["server"].accept()  # nothing reached the host's listener


def test_real_worker_runs_under_bwrap_with_the_filter(world: dict[str, Any]) -> None:
    """The real worker (not the compromised one) comes up walled in and answers."""
    limits = SandboxLimits(start_timeout_s=60)
    pool = WorkerPool(
        1,
        limits,
        world["data_dir"] / "compile-cache",
        worker_env({"JAX_PLATFORMS": "cpu"}),
        spares=0,
    )
    try:
        (info,) = pool.worker_infos()
        assert info.isolation == isolation_mode().value
        assert info.seccomp
        status = Path(f"/proc/{info.pid}/status").read_text()
        assert "Seccomp:\t2" in status
        assert KEY_VAR.encode() not in Path(f"/proc/{info.pid}/environ").read_bytes()
    finally:
        pool.close()


@pytest.mark.skipif(isolation_mode() is IsolationMode.RLIMITS, reason="no unshare on this host")
def test_unshare_fallback_still_hides_the_key_and_the_network(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without bwrap the key stays out and the network is cut; files stay visible (documented)."""
    monkeypatch.setenv("TPUMARKET_SANDBOX_ISOLATION", "unshare")
    found = _run_compromised(world, code_dir=world["data_dir"])  # files are writable there
    assert found["info"].isolation == "unshare"
    assert found["env_key"] is None and not found["secret_in_env"]
    assert found["tcp"] == "refused: PermissionError"
    assert found["environs_with_key"] == []  # its /proc shows only its own PID namespace


if __name__ == "__main__":
    compromised_main(sys.argv[1:])
