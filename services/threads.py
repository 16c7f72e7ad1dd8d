"""Threads named in the operating system, so that a process's CPU can be read thread by thread.

Python's thread names live in the interpreter only: `top -H`, `ps -L` and
``/proc/<pid>/task/<tid>/comm`` show every thread of a market as its program's name. A
long-lived thread that does a distinct job (the market's writer, its checkpointer) calls
`name_os_thread` first, and `os_thread_names` reads the names back (the market's benchmark
splits the server's CPU by thread with them).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

PR_SET_NAME = 15
"""The `prctl` option that names the calling thread (Linux)."""

MAX_NAME_BYTES = 15
"""Longest name the kernel keeps (16 bytes with the terminating zero)."""


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` (cut to `MAX_NAME_BYTES`) in the operating system; do
    nothing where that cannot be done (not Linux, no `prctl`)."""
    if not sys.platform.startswith("linux"):
        return
    process = ctypes.CDLL(None)  # the symbols already loaded: the C library's among them
    prctl = getattr(process, "prctl", None)
    if prctl is not None:
        prctl(PR_SET_NAME, name.encode()[:MAX_NAME_BYTES], 0, 0, 0)


def os_thread_names(pid: int) -> dict[int, str]:
    """Return the name of each thread of process `pid` by thread id (Linux ``/proc``); raise
    `OSError` if the process is gone."""
    names: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[int(task.name)] = (task / "comm").read_text().rstrip("\n")
        except FileNotFoundError:  # the thread ended while it was read
            continue
    return names
