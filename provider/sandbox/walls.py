"""What walls a worker in, measured from inside it at start, and whether that is enough.

A worker measures its own walls once its limits and syscall filter are in place and reports
them with its ``ready``: its user and group ids, whether it sits in a user namespace of its
own, its capability sets, ``no_new_privs``, its seccomp mode, whether it can make a socket and
which network interfaces it sees, and the file descriptors it holds beyond its standard
streams and its channel. The parent refuses a worker whose walls fall short of
:func:`shortfalls` (unless the operator allowed weak isolation), and ``/v1/info`` shows what
the live workers measured, never what the launcher meant to set.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_FULL_MAP = ("0", "0", "4294967295")


def _status() -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def _user_namespace() -> bool:
    """Whether this process's user ids are mapped (a namespace of its own), not the host's."""
    try:
        rows = Path("/proc/self/uid_map").read_text().split("\n")
    except OSError:
        return False
    return [row.split() for row in rows if row.strip()] != [list(_FULL_MAP)]


def _host_uid(uid: int) -> int | None:
    """Return the host's id for ``uid`` (from this namespace's map), None if unmapped."""
    try:
        rows = [row.split() for row in Path("/proc/self/uid_map").read_text().splitlines()]
    except OSError:
        return None
    for inside, outside, count in (map(int, row) for row in rows if len(row) == 3):
        if inside <= uid < inside + count:
            return outside + uid - inside
    return None


def _network() -> tuple[str, list[str]]:
    """Return ``none`` if no socket can be made, else ``loopback`` or ``host``; the interfaces."""
    try:
        rows = Path("/proc/net/dev").read_text().splitlines()[2:]
        interfaces = sorted(row.split(":")[0].strip() for row in rows)
    except OSError:
        interfaces = []
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return "none", interfaces
    probe.close()
    return ("loopback" if interfaces == ["lo"] else "host"), interfaces


def _extra_fds(channel_fd: int) -> list[int]:
    """Return the descriptors open here beyond stdin, stdout, stderr and the channel.

    The listing's own descriptor shows in the listing and is closed after it: kept out.
    """
    listed = [int(name) for name in os.listdir("/proc/self/fd")]
    still_open = []
    for fd in listed:
        with contextlib.suppress(OSError):
            os.fstat(fd)
            still_open.append(fd)
    return sorted(fd for fd in still_open if fd not in (0, 1, 2, channel_fd))


def measure(channel_fd: int, filtered: bool) -> dict[str, Any]:
    """Return this worker's walls (call it after the syscall filter is installed)."""
    status = _status()
    capabilities = {name: int(status.get(name, "0"), 16) for name in ("CapEff", "CapPrm", "CapBnd")}
    network, interfaces = _network()
    uid = os.getuid()
    seccomp = status.get("Seccomp", "0")
    extra = _extra_fds(channel_fd)
    stdio: list[str] = []
    for fd in (0, 1, 2, *extra):
        with contextlib.suppress(OSError):
            stdio.append(f"{fd}: {os.readlink(f'/proc/self/fd/{fd}')}")
    return {
        "uid": uid,
        "gid": os.getgid(),
        "host_uid": _host_uid(uid),
        "user_namespace": _user_namespace(),
        "capabilities": "none" if not any(capabilities.values()) else "some",
        "no_new_privs": status.get("NoNewPrivs") == "1",
        "seccomp": "allowlist" if filtered and seccomp == "2" else "none",
        "network": network,
        "interfaces": interfaces,
        "inherited_fds": len(extra),
        "descriptors": stdio,
    }


def shortfalls(walls: Mapping[str, Any]) -> list[str]:
    """Return what a worker that reported ``walls`` lacks of full isolation (empty: none)."""
    lacking = []
    if walls.get("uid") == 0 or walls.get("host_uid") in (0, None):
        lacking.append("it is root on the host")
    if walls.get("capabilities") != "none":
        lacking.append("it holds capabilities")
    if not walls.get("no_new_privs"):
        lacking.append("no_new_privs is not set")
    if walls.get("seccomp") != "allowlist":
        lacking.append("no syscall allowlist")
    if walls.get("network") != "none":
        lacking.append("it can open sockets")
    if walls.get("inherited_fds") != 0:
        lacking.append("it inherited file descriptors")
    return lacking


def summary(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Return what holds for every worker in ``reports``: a value all agree on, else ``varies``."""
    if not reports:
        return {}
    merged: dict[str, Any] = {}
    for name in (
        "uid",
        "host_uid",
        "user_namespace",
        "capabilities",
        "no_new_privs",
        "seccomp",
        "network",
    ):
        values = {repr(report.get(name)) for report in reports}
        merged[name] = reports[0].get(name) if len(values) == 1 else "varies"
    merged["inherited_fds"] = max(int(report.get("inherited_fds", 0)) for report in reports)
    merged["shortfalls"] = sorted({item for report in reports for item in shortfalls(report)})
    return merged
