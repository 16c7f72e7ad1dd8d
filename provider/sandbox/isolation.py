"""How sandbox workers are walled off from the daemon: namespaces, a scrubbed env, rlimits.

A worker parses and runs programs written by strangers, so it is treated as hostile. It is
started with an environment built from an allowlist (never the daemon's keys), and where the
host allows it inside bubblewrap (``bwrap``): new user, PID, network, IPC and UTS namespaces,
a read-only view of only what Python and JAX need (``/usr``, the interpreter, the virtualenv,
the project's packages), a private ``/tmp``, and one writable directory, the compile cache.
The daemon's data dir, journal and keys are not mounted, and the network namespace has only a
loopback interface. Without bwrap, ``unshare`` gives the network and PID namespaces (files
stay visible); without either, only the scrubbed environment and the rlimits remain.
:func:`isolation_mode` says which one runs; the daemon reports it in ``/v1/info``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path

from contracts.lifetime import dies_with_parent


class IsolationMode(StrEnum):
    """What walls a worker in, strongest first."""

    BWRAP = "bwrap"
    UNSHARE = "unshare"
    RLIMITS = "rlimits"


# Environment variables a worker may inherit from the daemon; everything else is dropped.
ENV_ALLOWLIST: frozenset[str] = frozenset(
    {
        "PATH",
        "LANG",
        "LC_ALL",
        "TZ",
        "JAX_PLATFORMS",
        "JAX_ENABLE_X64",
        "ALLOW_MULTIPLE_LIBTPU_LOAD",
        "XLA_FLAGS",
        "TPU_ACCELERATOR_TYPE",
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "TPU_SKIP_MDS_QUERY",
        "CUDA_VISIBLE_DEVICES",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "TF_CPP_MIN_LOG_LEVEL",
    }
)
# Read-only system paths the interpreter and JAX read; missing ones are skipped.
_SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/bin", "/sbin")
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
)
_SYS_PATHS = ("/sys/devices/system/cpu", "/sys/fs/cgroup")
_ACCELERATOR_GLOBS = ("accel*", "vfio", "nvidia*")
_ENV_OVERRIDE = "TPUMARKET_SANDBOX_ISOLATION"  # operators may force a weaker mode


def worker_env(extra: Mapping[str, str], source: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return a worker's environment: the allowlisted daemon variables, then ``extra``."""
    base = os.environ if source is None else source
    env = {name: value for name, value in base.items() if name in ENV_ALLOWLIST}
    env.setdefault("PATH", "/usr/bin:/bin")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["HOME"] = "/tmp"
    env["TMPDIR"] = "/tmp"
    for name, value in extra.items():
        if name not in ENV_ALLOWLIST:
            raise ValueError(f"worker environment variable {name} is not allowed")
        env[name] = value
    return env


def _probe(command: Sequence[str]) -> bool:
    try:
        done = subprocess.run(
            [*command, sys.executable, "-c", "pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def _detected() -> IsolationMode:
    bwrap = shutil.which("bwrap")
    if bwrap is not None and _probe(_bwrap_prefix(bwrap, (), None, {})):
        return IsolationMode.BWRAP
    unshare = shutil.which("unshare")
    if unshare is not None and _probe(_unshare_prefix(unshare)):
        return IsolationMode.UNSHARE
    return IsolationMode.RLIMITS


def isolation_mode() -> IsolationMode:
    """Return the strongest isolation this host gives workers (probed once per process).

    ``TPUMARKET_SANDBOX_ISOLATION=unshare|rlimits`` forces a weaker one (never a stronger
    one than the host has).
    """
    found = _detected()
    forced = os.environ.get(_ENV_OVERRIDE)
    if forced:
        wanted = IsolationMode(forced)
        order = list(IsolationMode)
        if order.index(wanted) > order.index(found):
            return wanted
    return found


def _python_roots() -> list[str]:
    """Return the directories the worker's interpreter imports from."""
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    if sys.prefix != os.path.realpath(sys.prefix):
        roots.add(sys.prefix)
    for package in ("provider", "contracts"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            roots.update(spec.submodule_search_locations)
    return sorted(roots)


def _module_root(module: str) -> str | None:
    """Return the directory of ``module``'s top-level package (to mount it read-only)."""
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(next(iter(spec.submodule_search_locations)))


def _bwrap_prefix(
    bwrap: str, read_only: Sequence[str], writable: Path | None, env: Mapping[str, str]
) -> list[str]:
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    # The private /tmp first: binds below it (a checkout or a venv under /tmp) then sit on top of
    # it instead of being hidden by it.
    args += ["--tmpfs", "/tmp"]
    for path in _SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for path in _SYS_PATHS:
        args += ["--ro-bind-try", path, path]
    for path in sorted({*_python_roots(), *read_only}):
        args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for pattern in _ACCELERATOR_GLOBS:
        for device in sorted(Path("/dev").glob(pattern)):
            args += ["--dev-bind", str(device), str(device)]
    if writable is not None:
        args += ["--bind", str(writable), str(writable)]
    for name, value in sorted(env.items()):
        args += ["--setenv", name, value]
    return [*args, "--chdir", "/tmp", "--"]


def _unshare_prefix(unshare: str) -> list[str]:
    return [unshare, "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]


def worker_command(
    module: str, argv: Sequence[str], env: Mapping[str, str], writable: Path | None
) -> tuple[list[str], dict[str, str], IsolationMode]:
    """Return the command line and environment that start ``python -m module argv...``.

    ``env`` is the worker's whole environment (see :func:`worker_env`); ``writable`` the one
    directory it may write besides its private ``/tmp``.
    """
    mode = isolation_mode()
    python = [sys.executable, "-m", module, *argv]
    env = dict(env)
    root = _module_root(module)
    extra = [] if root is None else [root]
    if root is not None and module.split(".")[0] not in ("provider", "contracts"):
        env["PYTHONPATH"] = os.path.dirname(root)  # an entry point outside the packages
    if mode is IsolationMode.BWRAP:
        bwrap = shutil.which("bwrap")
        assert bwrap is not None
        return [*_bwrap_prefix(bwrap, extra, writable, env), *python], env, mode
    # Without bwrap's --die-with-parent, the launcher gets a parent-death signal: a daemon
    # killed with SIGKILL must not leave a worker running a task (the pool starts every
    # worker from one long-lived thread, which the signal follows).
    if mode is IsolationMode.UNSHARE:
        unshare = shutil.which("unshare")
        assert unshare is not None
        command = [*_unshare_prefix(unshare), *python]
        return dies_with_parent(command, long_lived_thread=True), env, mode
    return dies_with_parent(python, long_lived_thread=True), env, mode


def host_pid(launcher_pid: int, namespace_pid: int) -> int:
    """Return the host pid of the launcher's descendant whose innermost pid is ``namespace_pid``.

    A worker in its own PID namespace knows only its namespace pid; the parent needs the host
    one to signal it. Without a namespace the two are the same.
    """
    if launcher_pid == namespace_pid:
        return launcher_pid
    pending = [launcher_pid]
    while pending:
        pid = pending.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                pids = line.split()[1:]
                if len(pids) > 1 and int(pids[-1]) == namespace_pid:
                    return pid
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                pending += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
    return launcher_pid
