"""How sandbox workers are walled off from the daemon: namespaces, a scrubbed env, rlimits.

A worker parses and runs programs written by strangers, so it is treated as hostile. It is
started with an environment built from an allowlist (never the daemon's keys), and where the
host allows it inside bubblewrap (``bwrap``): new PID, network, IPC, UTS and mount namespaces,
a read-only view of only what Python and JAX need (``/usr``, the interpreter, the virtualenv,
the project's packages), a read-only ``/proc/sys``, a private ``/tmp``, and at most one
writable directory. The daemon's data dir, journal and keys are not mounted, and the network
namespace has only a loopback interface. Inside, ``setpriv`` makes the worker the
unprivileged :data:`WORKER_UID` on the host (whether or not the daemon runs as root) with no
capability, an empty bounding set and ``no_new_privs``; the worker then installs its syscall
allowlist (:mod:`provider.sandbox.seccomp`) before it reads any program. Without bwrap,
``unshare`` gives the network and PID namespaces (files stay visible); without either, only
the scrubbed environment and the rlimits remain; both fallbacks drop to :data:`WORKER_UID`
the same way, and neither is offered where ``setpriv`` is missing. :func:`isolation_mode`
says which one runs; the worker measures its walls (:mod:`provider.sandbox.walls`) and the
daemon refuses anything short of bwrap and those walls unless the operator allowed it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from services.lifetime import dies_with_parent


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
FORCE_VARIABLE = "TPUMARKET_SANDBOX_ISOLATION"
"""Operators may force a weaker mode with this variable (which also allows it)."""
WORKER_UID = 65534
"""The unprivileged user (and group) a worker runs as (``nobody`` on most systems)."""


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
    if bwrap is not None and _setpriv_prefix() and _probe(_bwrap_prefix(bwrap, (), None, {})):
        return IsolationMode.BWRAP
    unshare = shutil.which("unshare")
    if unshare is not None and _probe(_unshare_prefix(unshare)):
        return IsolationMode.UNSHARE
    return IsolationMode.RLIMITS


def _setpriv_prefix() -> list[str]:
    """Return the command that drops to :data:`WORKER_UID`, no capabilities, no_new_privs.

    Empty where ``setpriv`` is missing: the fallbacks then cannot drop privileges.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return []
    if os.geteuid() != 0:  # already unprivileged: keep no capability, gain none
        return [setpriv, "--inh-caps=-all", "--no-new-privs"]
    return [
        setpriv,
        f"--reuid={WORKER_UID}",
        f"--regid={WORKER_UID}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]


def isolation_mode() -> IsolationMode:
    """Return the strongest isolation this host gives workers (probed once per process).

    ``TPUMARKET_SANDBOX_ISOLATION=unshare|rlimits`` forces a weaker one (never a stronger
    one than the host has).
    """
    found = _detected()
    forced = os.environ.get(FORCE_VARIABLE)
    if forced:
        wanted = IsolationMode(forced)
        order = list(IsolationMode)
        if order.index(wanted) > order.index(found):
            return wanted
    return found


_OUR_PACKAGES = ("provider", "contracts", "programs", "services")
"""The packages of ours a worker imports (each bound read-only where the daemon finds it)."""


def _python_roots() -> list[str]:
    """Return the directories the worker's interpreter imports from."""
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    if sys.prefix != os.path.realpath(sys.prefix):
        roots.add(sys.prefix)
    for package in _OUR_PACKAGES:
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


def _reachable(paths: Sequence[str]) -> bool:
    """Whether :data:`WORKER_UID`, as "others", can enter every directory above ``paths``."""
    for path in paths:
        current = os.path.realpath(path)
        while current not in ("/", ""):
            try:
                mode = os.stat(current).st_mode
            except OSError:
                return False
            if not mode & 0o001:
                return False
            current = os.path.dirname(current)
    return True


def _ancestors(paths: Sequence[str]) -> list[str]:
    """Return the directories above ``paths`` that bwrap would make, parents first."""
    above: set[str] = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in ("/", "") and parent not in (*_SYSTEM_PATHS, "/tmp"):
            above.add(parent)
            parent = os.path.dirname(parent)
    return sorted(above, key=lambda path: (path.count("/"), path))


def _bwrap_prefix(
    bwrap: str, read_only: Sequence[str], writable: Path | None, env: Mapping[str, str]
) -> list[str]:
    """Return bwrap's command line, ending with the drop to :data:`WORKER_UID`.

    bwrap builds the worker's view of the files (as the daemon's user, so it can bind an
    interpreter below a directory only root may enter, such as ``/root``); ``setpriv`` then
    makes the worker :data:`WORKER_UID` on the host itself, with no capability, an empty
    bounding set and ``no_new_privs``: root's files, ``/proc/sys`` and root-only device nodes
    stay closed to it, and it cannot make a user namespace (the syscall filter refuses one).
    """
    # Every namespace but the user one (bwrap makes one itself when the daemon is not root):
    # a user namespace would map only the daemon's own id, and the drop needs WORKER_UID.
    args = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
    # The private /tmp first: binds below it (a checkout or a venv under /tmp) then sit on top of
    # it instead of being hidden by it.
    args += ["--perms", "1777", "--tmpfs", "/tmp"]
    for path in _SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    binds = {*_python_roots(), *read_only, *([] if writable is None else [str(writable)])}
    # bwrap makes the directories above a bind 0700: the worker, not root, must enter them.
    above = _ancestors(sorted({*binds, *_ETC_FILES, *_SYS_PATHS}))
    args += [arg for path in above for arg in ("--perms", "0755", "--dir", path)]
    for path in _ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for path in _SYS_PATHS:
        args += ["--ro-bind-try", path, path]
    for path in sorted({*_python_roots(), *read_only}):
        args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
    for pattern in _ACCELERATOR_GLOBS:
        for device in sorted(Path("/dev").glob(pattern)):
            args += ["--dev-bind", str(device), str(device)]
    if writable is not None:
        args += ["--bind", str(writable), str(writable)]
    for name, value in sorted(env.items()):
        args += ["--setenv", name, value]
    return [*args, "--chdir", "/tmp", "--", *_setpriv_prefix()]


def _unshare_prefix(unshare: str) -> list[str]:
    return [unshare, "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]


@dataclass(frozen=True, slots=True)
class WorkerCommand:
    """How to start a worker: its command line, its environment, and what walls it in."""

    args: list[str]
    env: dict[str, str]
    mode: IsolationMode


def worker_command(
    module: str, argv: Sequence[str], env: Mapping[str, str], writable: Path | None
) -> WorkerCommand:
    """Return what starts ``python -m module argv...`` walled in.

    ``env`` is the worker's whole environment (see :func:`worker_env`); ``writable`` the one
    directory it may write besides its private ``/tmp``.
    """
    mode = isolation_mode()
    python = [sys.executable, "-m", module, *argv]
    env = dict(env)
    root = _module_root(module)
    extra = [] if root is None else [root]
    if root is not None and module.split(".")[0] not in _OUR_PACKAGES:
        env["PYTHONPATH"] = os.path.dirname(root)  # an entry point outside the packages
    if mode is IsolationMode.BWRAP:
        bwrap = shutil.which("bwrap")
        assert bwrap is not None
        return WorkerCommand([*_bwrap_prefix(bwrap, extra, writable, env), *python], env, mode)
    # Without bwrap's --die-with-parent, the launcher gets a parent-death signal: a daemon
    # killed with SIGKILL must not leave a worker running a task (the pool starts every
    # worker from one long-lived thread, which the signal follows).
    # Without bwrap's view the worker sees the host's paths: it can drop to WORKER_UID only
    # where that user can reach the interpreter and the packages (not below /root); else it
    # stays the daemon's user, which its measured walls show (refused unless allowed).
    drop = _setpriv_prefix() if _reachable([*_python_roots(), *extra]) else []
    if mode is IsolationMode.UNSHARE:
        unshare = shutil.which("unshare")
        assert unshare is not None
        command = [*_unshare_prefix(unshare), *drop, *python]
        return WorkerCommand(dies_with_parent(command, long_lived_thread=True), env, mode)
    # The drop comes first: a change of user clears the parent-death signal.
    return WorkerCommand([*drop, *dies_with_parent(python, long_lived_thread=True)], env, mode)


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
