"""A syscall allowlist for sandbox workers, through the system's libseccomp (no extra package).

Every call not named in :data:`ALLOWED_SYSCALLS` answers ``EPERM``: among them every way to make
or use a socket (``socket``, ``socketpair``, ``connect``, ``bind``: the worker's one channel is
a socket the parent made), ``execve``/``execveat``, the old and the new mount calls
(``mount``, ``open_tree``, ``move_mount``, ``fsopen``, ``fsmount``, ``fspick``, ``fsconfig``,
``mount_setattr``), namespaces (``unshare``, ``setns``), ``io_uring_*``, ``ptrace``,
``process_vm_readv``/``writev``, ``bpf``, the keyring, ``userfaultfd`` and
``perf_event_open``. ``clone`` is allowed for threads only (``CLONE_THREAD`` and no namespace
flag); ``clone3``, whose flags sit behind a pointer, answers ``ENOSYS`` so that the C library
falls back to ``clone``.

The list is what Python, JAX and XLA's CPU runtime (compile, execute, the capacity benchmark,
ahead-of-time TPU compiles through libtpu) were traced calling, plus the calls of their error
paths (signals, ``abort``). Installing the filter sets ``no_new_privs``. Where libseccomp or
the kernel's seccomp is missing, :func:`install_filter` returns False (the daemon then refuses
such workers unless the operator allowed weak isolation).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno

_ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP_MASKED_EQ = 7

ALLOWED_SYSCALLS: tuple[str, ...] = (
    # memory
    *("brk", "mmap", "munmap", "mprotect", "mremap", "madvise", "mincore", "msync"),
    *("mlock", "munlock", "mlock2", "mbind", "get_mempolicy", "set_mempolicy", "membarrier"),
    *("pkey_alloc", "pkey_free", "pkey_mprotect"),
    # files, within the mounts the sandbox gives
    *("read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev"),
    *("preadv2", "pwritev2", "open", "openat", "close", "close_range", "lseek"),
    *("stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access"),
    *("faccessat", "faccessat2", "readlink", "readlinkat", "getdents", "getdents64"),
    *("getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat"),
    *("rename", "renameat", "renameat2", "symlink", "symlinkat", "link", "linkat"),
    *("ftruncate", "fallocate", "fsync", "fdatasync", "flock", "fcntl", "fchmod", "umask"),
    *("utimensat", "sendfile", "copy_file_range", "dup", "dup2", "dup3", "pipe", "pipe2"),
    *("getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr"),
    *("ioctl", "eventfd2", "memfd_create"),
    # waiting on descriptors (the channel), and reading from an inherited socket
    *("poll", "ppoll", "select", "pselect6", "epoll_create1", "epoll_ctl", "epoll_wait"),
    *("epoll_pwait", "epoll_pwait2", "recvfrom", "recvmsg", "sendto", "sendmsg"),
    *("getsockopt", "shutdown"),
    # threads, time, signals
    *("clone", "set_robust_list", "rseq", "futex", "futex_waitv", "set_tid_address"),
    *("gettid", "getpid", "getppid", "sched_yield", "sched_getaffinity", "sched_setaffinity"),
    *("sched_getparam", "sched_getscheduler", "sched_get_priority_max"),
    *("sched_get_priority_min", "getcpu", "nanosleep", "clock_nanosleep", "clock_gettime"),
    *("clock_getres", "gettimeofday", "time", "alarm", "getitimer", "setitimer"),
    *("timer_create", "timer_settime", "timer_gettime", "timer_delete", "timer_getoverrun"),
    *("rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigsuspend", "rt_sigpending"),
    *("rt_sigtimedwait", "sigaltstack", "kill", "tgkill", "tkill", "restart_syscall"),
    *("exit", "exit_group", "wait4", "waitid"),
    # identity and limits (read, or lowered)
    *("getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups"),
    *("uname", "sysinfo", "getrandom", "getrlimit", "setrlimit", "prlimit64", "getrusage"),
    *("times", "getpriority", "setpriority", "prctl", "arch_prctl", "capget"),
)
DENIED_EXAMPLES: tuple[str, ...] = (
    *("socket", "socketpair", "connect", "bind", "execve", "execveat", "mount", "umount2"),
    *("pivot_root", "open_tree", "move_mount", "fsopen", "fsmount", "fspick", "fsconfig"),
    *("mount_setattr", "unshare", "setns", "io_uring_setup", "io_uring_enter"),
    *("io_uring_register", "ptrace", "process_vm_readv", "process_vm_writev", "bpf"),
    *("keyctl", "add_key", "request_key", "userfaultfd", "perf_event_open", "setuid"),
)
"""Calls the allowlist leaves out that a compromised worker would reach for (tests check them)."""

CLONE_THREAD = 0x00010000
NAMESPACE_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x00000080  # CLONE_NEWTIME
)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _library() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_load.restype = ctypes.c_int
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def _add(lib: ctypes.CDLL, ctx: int, action: int, name: str, cmp: _ArgCmp | None = None) -> bool:
    """Add one rule; a call this architecture lacks is skipped. Return False on a failure."""
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number < 0:
        return True
    if cmp is None:
        return bool(lib.seccomp_rule_add_array(ctx, action, number, 0, None) == 0)
    return bool(lib.seccomp_rule_add_array(ctx, action, number, 1, ctypes.byref(cmp)) == 0)


def install_filter() -> bool:
    """Install the worker's syscall allowlist in this process; return whether one is active.

    Call it before any thread starts: threads made later inherit it.
    """
    lib = _library()
    if lib is None:
        return False
    ctx = lib.seccomp_init(_ACT_ERRNO | errno.EPERM)
    if not ctx:
        return False
    try:
        for name in ALLOWED_SYSCALLS:
            if name == "clone":
                threads_only = _ArgCmp(
                    0, _CMP_MASKED_EQ, CLONE_THREAD | NAMESPACE_FLAGS, CLONE_THREAD
                )
                ok = _add(lib, ctx, _ACT_ALLOW, name, threads_only)
            else:
                ok = _add(lib, ctx, _ACT_ALLOW, name)
            if not ok:
                return False
        if not _add(lib, ctx, _ACT_ERRNO | errno.ENOSYS, "clone3"):
            return False
        return bool(lib.seccomp_load(ctx) == 0)
    finally:
        lib.seccomp_release(ctx)
