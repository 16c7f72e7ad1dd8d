# ruff: noqa: E501  (the attacker's code is one string, sent as is)
"""A TEST-ONLY worker entry: an attacker with code execution inside the real sandbox.

Launched only by tests, with the daemon's own launcher (``WorkerPool(module=ATTACKER)``): the
module lives under ``tests/`` and nothing in the daemon's config or HTTP API names a worker
module. It walls itself in exactly as the real worker does (:func:`provider.sandbox.worker.
confine`: rlimits, the syscall allowlist, the measured walls), says ``ready``, then runs the
Python each request carries (``{"op": "exec", "code": ...}``) and answers with the value the
code left in ``result``. :data:`ATTEMPTS` is the code of every escape a test tries; each
attempt reports ``refused: <why>`` or ``ok: <what it got>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ATTACKER = "tests.provider.sandbox_attacker"
SECRET = "0x" + "5e" * 32

ATTEMPTS = r"""
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def attempt(action):
    try:
        return "ok: " + repr(action())[:200]
    except BaseException as exc:
        return f"refused: {type(exc).__name__} {exc}"[:200]

def sys_call(number, *args):
    ret = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if ret < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return ret

AT_FDCWD = -100
OPEN_TREE_CLONE, AT_RECURSIVE = 1, 0x8000
found = {}

# the new mount API, against every read-only mount
ro_mounts = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    if "ro" in fields[5].split(","):
        ro_mounts.append(fields[4])
found["ro_mounts"] = len(ro_mounts)

class MountAttr(ctypes.Structure):
    _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

for path in ro_mounts:
    cpath = path.encode()
    found[f"open_tree {path}"] = attempt(lambda: sys_call(428, AT_FDCWD, cpath, OPEN_TREE_CLONE | AT_RECURSIVE))
    attr = MountAttr(0, 1, 0, 0)  # clear MOUNT_ATTR_RDONLY
    found[f"mount_setattr {path}"] = attempt(lambda: sys_call(442, AT_FDCWD, cpath, AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)))
    found[f"fspick {path}"] = attempt(lambda: sys_call(433, AT_FDCWD, cpath, 0))
    found[f"remount {path}"] = attempt(lambda: sys_call(165, b"none", cpath, b"none", 0x20 | 0x1000, 0))  # MS_REMOUNT|MS_BIND
    def write_into(path=path):
        target = os.path.join(path, ".attacker") if os.path.isdir(path) else path
        with open(target, "a") as handle:
            handle.write("pwned")
        return target
    found[f"write {path}"] = attempt(write_into)
found["fsopen"] = attempt(lambda: sys_call(430, b"tmpfs", 0))
found["fsconfig"] = attempt(lambda: sys_call(431, 3, 6, None, None, 0))
found["fsmount"] = attempt(lambda: sys_call(432, 3, 0, 0))
found["move_mount"] = attempt(lambda: sys_call(429, 3, b"", AT_FDCWD, b"/usr", 4))
found["mount tmpfs"] = attempt(lambda: sys_call(165, b"none", b"/usr", b"tmpfs", 0, 0))
found["umount"] = attempt(lambda: sys_call(166, b"/usr", 2))
found["pivot_root"] = attempt(lambda: sys_call(155, b"/tmp", b"/tmp"))
found["proc_sys"] = attempt(lambda: open("/proc/sys/vm/drop_caches", "w").write("3"))
found["sysrq"] = attempt(lambda: open("/proc/sysrq-trigger", "w").write("h"))

# the daemon's files
for name, path in secret_paths.items():
    found[f"read {name}"] = attempt(lambda: open(path, "rb").read())
found["list data_dir"] = attempt(lambda: os.listdir(data_dir))

# other processes: another worker by its host pid, and whatever this /proc shows
me = os.getpid()
found["other_pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me)
for pid in [other_pid, *found["other_pids"]]:
    found[f"mem {pid}"] = attempt(lambda: open(f"/proc/{pid}/mem", "rb").read(1))
    found[f"environ {pid}"] = attempt(lambda: open(f"/proc/{pid}/environ", "rb").read())
    found[f"files {pid}"] = attempt(lambda: open(f"/proc/{pid}/root/tmp/secret").read())
    found[f"process_vm_readv {pid}"] = attempt(lambda: sys_call(310, pid, 0, 0, 0, 0, 0))
    found[f"ptrace {pid}"] = attempt(lambda: sys_call(101, 16, pid, 0, 0))  # PTRACE_ATTACH
found["other_secret_here"] = attempt(lambda: open("/tmp/secret").read())
found["ptrace traceme"] = attempt(lambda: sys_call(101, 0, 0, 0, 0))

# the network, every family
def tcp():
    with socket.create_connection(("127.0.0.1", port), timeout=3):
        return "connected"
def tcp_host():
    with socket.create_connection((host_ip, port), timeout=3):
        return "connected"
def unix_path():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(unix_socket)
        return "connected"
def unix_abstract():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect("\0" + unix_abstract_name)
        return "connected"
found["tcp loopback"] = attempt(tcp)
found["tcp host"] = attempt(tcp_host)
found["udp"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
found["ipv6"] = attempt(lambda: socket.socket(socket.AF_INET6))
found["unix path"] = attempt(unix_path)
found["unix abstract"] = attempt(unix_abstract)
found["socketpair"] = attempt(lambda: socket.socketpair())
found["netlink"] = attempt(lambda: socket.socket(16, socket.SOCK_RAW, 0))
found["vsock"] = attempt(lambda: socket.socket(40, socket.SOCK_STREAM))
found["packet"] = attempt(lambda: socket.socket(17, socket.SOCK_RAW, 0))
found["raw syscall socket"] = attempt(lambda: sys_call(41, 2, 1, 0))

# the kernel's other doors
found["io_uring_setup"] = attempt(lambda: sys_call(425, 8, ctypes.create_string_buffer(120)))
found["bpf"] = attempt(lambda: sys_call(321, 0, 0, 0))
found["keyctl"] = attempt(lambda: sys_call(250, 0, 0, 0, 0))
found["userfaultfd"] = attempt(lambda: sys_call(323, 0))
found["perf_event_open"] = attempt(lambda: sys_call(298, 0, 0, -1, -1, 0))
found["unshare user"] = attempt(lambda: sys_call(272, 0x10000000))
found["unshare net"] = attempt(lambda: sys_call(272, 0x40000000))
found["clone newuser"] = attempt(lambda: sys_call(56, 0x10000000 | 17, 0, 0, 0, 0))
found["fork"] = attempt(lambda: os.fork())
found["setuid 0"] = attempt(lambda: os.setuid(0))
found["setgid 0"] = attempt(lambda: os.setgid(0))
found["execveat"] = attempt(lambda: sys_call(322, AT_FDCWD, b"/bin/sh", 0, 0, 0))
found["execve /bin/sh"] = attempt(lambda: os.execv("/bin/sh", ["sh", "-c", "exit 0"]))

# descriptors: only stdio and the channel; none is the daemon's log
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    except OSError:
        pass
found["fds"] = fds
found["read stderr"] = attempt(lambda: os.read(2, 100))
result = found
"""
"""Every escape the tests try; ``secret_paths``, ``data_dir``, ``other_pid``, ``port``,
``host_ip``, ``unix_socket`` and ``unix_abstract_name`` come with the request."""


def attacker_main(argv: list[str]) -> None:
    """Wall in as the real worker does, say ready, then run each request's code."""
    from multiprocessing.connection import Connection

    from provider.sandbox.limits import SandboxLimits
    from provider.sandbox.wire import pack, unpack
    from provider.sandbox.worker import confine

    fd, limits_json, _ = argv
    conn = Connection(int(fd))
    walls = confine(conn.fileno(), SandboxLimits(**json.loads(limits_json)))
    ready = {"type": "ready", "pid": os.getpid(), "platform": "cpu"}
    conn.send_bytes(
        pack(
            {
                **ready,
                "device_kind": "cpu",
                "seccomp": walls["seccomp"] == "allowlist",
                "walls": walls,
            }
        )
    )
    while True:
        try:
            header, _ = unpack(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if header.get("op") != "exec":
            return
        namespace: dict[str, Any] = dict(header.get("globals", {}))
        try:
            exec(str(header["code"]), namespace)  # the attacker's code
            reply = {"type": "exec", "result": namespace.get("result")}
        except BaseException:
            reply = {"type": "exec", "error": traceback.format_exc()[-2000:]}
        conn.send_bytes(pack(json.loads(json.dumps(reply, default=repr))))


if __name__ == "__main__":
    attacker_main(sys.argv[1:])


# ---- the host side: a daemon-like world, the attack, and the count ---------------------------

EXPECTED_FDS = 4
"""Descriptors a worker holds: stdin (/dev/null), stdout and stderr (a pipe), its channel."""


@contextlib.contextmanager
def daemon_world(root: Path) -> Iterator[dict[str, Any]]:
    """A daemon's secrets and doors: a key file, a journal, a log on stderr, listeners."""
    data_dir = root / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "provider.key").write_text(SECRET)
    (data_dir / "journal.sqlite").write_bytes(b"journal " + SECRET.encode())
    log = root / "daemon.log"
    log.write_text(f"daemon log {SECRET}\n")
    unix_path = root / "daemon.sock"
    abstract = f"tpumarket-test-{os.getpid()}"
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(socket.create_server(("0.0.0.0", 0)))
        unix = stack.enter_context(socket.socket(socket.AF_UNIX))
        unix.bind(str(unix_path))
        unix.listen()
        hidden = stack.enter_context(socket.socket(socket.AF_UNIX))
        hidden.bind("\0" + abstract)
        hidden.listen()
        try:
            host_ip = socket.gethostbyname(socket.gethostname())
        except OSError:
            host_ip = "127.0.0.1"
        yield {
            "data_dir": data_dir,
            "log": log,
            "server": server,
            "globals": {
                "secret_paths": {
                    "key": str(data_dir / "provider.key"),
                    "journal": str(data_dir / "journal.sqlite"),
                    "log": str(log),
                },
                "data_dir": str(data_dir),
                "port": server.getsockname()[1],
                "host_ip": host_ip,
                "unix_socket": str(unix_path),
                "unix_abstract_name": abstract,
            },
        }


@contextlib.contextmanager
def logging_to(log: Path) -> Iterator[None]:
    """Point this process's stderr at ``log`` and hold an inheritable descriptor on it."""
    handle = log.open("a")
    saved = os.dup(2)
    os.set_inheritable(handle.fileno(), True)
    os.dup2(handle.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        handle.close()


def attacker_pool(limits: Any = None) -> Any:
    """One attacker worker, started by the daemon's own launcher."""
    from provider.sandbox.isolation import worker_env
    from provider.sandbox.limits import SandboxLimits
    from provider.sandbox.pool import WorkerPool

    return WorkerPool(
        1,
        limits or SandboxLimits(start_timeout_s=120),
        None,
        worker_env({"JAX_PLATFORMS": "cpu"}),
        module=ATTACKER,
        spares=0,
    )


def run_code(pool: Any, code: str, variables: dict[str, Any] | None = None) -> Any:
    """Run ``code`` in the attacker worker of ``pool``; return its ``result``."""
    reply = pool.call({"op": "exec", "code": code, "globals": variables or {}}, b"")
    assert isinstance(reply, tuple), reply
    assert "error" not in reply[0], reply[0]["error"]
    return reply[0]["result"]


def attack(root: Path) -> dict[str, Any]:
    """Run :data:`ATTEMPTS` from one worker against a daemon-like world and a second worker."""
    with daemon_world(root) as world:
        with logging_to(world["log"]):
            other, pool = attacker_pool(), attacker_pool()
        try:
            run_code(other, "open('/tmp/secret', 'w').write(s); result = 1", {"s": SECRET})
            found: dict[str, Any] = run_code(
                pool, ATTEMPTS, {**world["globals"], "other_pid": other.worker_infos()[0].pid}
            )
            found["walls"] = pool.worker_infos()[0].walls
            world["server"].settimeout(0.1)
            try:
                world["server"].accept()
                found["listener reached"] = "ok: a connection came in"
            except TimeoutError:
                found["listener reached"] = "refused: nothing came in"
            return found
        finally:
            other.close()
            pool.close()


def escapes(found: dict[str, Any], log: str = "") -> list[str]:
    """Return the attempts in ``found`` that reached anything outside the worker."""
    reached = [
        name
        for name, outcome in found.items()
        if isinstance(outcome, str) and outcome.startswith("ok")
    ]
    fds = found.get("fds", {})
    if len(fds) > EXPECTED_FDS or any(
        "socket" not in target and "pipe" not in target and target != "/dev/null"
        for target in fds.values()
    ):
        reached.append(f"fds {fds}")
    if log and any(target == log for target in fds.values()):
        reached.append("the daemon's log")
    others = [pid for pid in found.get("other_pids", []) if pid != 1]  # 1: the sandbox's init
    if others:
        reached.append(f"sees processes {others}")
    return reached


def worker_escapes(root: Path) -> int:
    """Count the in-sandbox attacker's attempts that reached anything outside (0 is the aim).

    ``root`` is an empty directory for the daemon-like world (key, journal, log, sockets).
    """
    return len(escapes(attack(root), str(root / "daemon.log")))
