"""Whether a daemon is running on a data dir: a probe of the lock it holds while it runs."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from provider.config import LOCK_FILE


def daemon_pid(data_dir: Path) -> int | None:
    """Return the PID of the daemon holding ``data_dir``'s lock, or None when none does."""
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            # a shared probe: it fails only while a daemon holds the exclusive lock
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
