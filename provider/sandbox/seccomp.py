"""A syscall filter for sandbox workers, through the system's libseccomp (no extra package).

The filter allows what Python and XLA use and answers ``EPERM`` to the calls a compromised
worker would reach for: debugging or reading other processes, namespaces and mounts, kernel
modules, BPF, keyrings, and IPv4/IPv6/packet sockets. Where libseccomp or the kernel's
seccomp is missing, :func:`install_filter` returns False and the worker runs without one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import socket

_ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP_EQ = 4

DENIED_SYSCALLS: tuple[str, ...] = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "open_by_handle_at",
    "name_to_handle_at",
    "iopl",
    "ioperm",
    "syslog",
    "fanotify_init",
)
DENIED_SOCKET_FAMILIES: tuple[int, ...] = (
    socket.AF_INET,
    socket.AF_INET6,
    getattr(socket, "AF_PACKET", 17),
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


def install_filter() -> bool:
    """Install the worker's syscall filter in this process; return whether one is active."""
    lib = _library()
    if lib is None:
        return False
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        return False
    deny = _ACT_ERRNO | errno.EPERM
    try:
        for name in DENIED_SYSCALLS:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue  # not on this architecture
            if lib.seccomp_rule_add_array(ctx, deny, number, 0, None) != 0:
                return False
        socket_nr = lib.seccomp_syscall_resolve_name(b"socket")
        for family in DENIED_SOCKET_FAMILIES:
            cmp = _ArgCmp(0, _CMP_EQ, family, 0)
            if lib.seccomp_rule_add_array(ctx, deny, socket_nr, 1, ctypes.byref(cmp)) != 0:
                return False
        return bool(lib.seccomp_load(ctx) == 0)
    finally:
        lib.seccomp_release(ctx)
