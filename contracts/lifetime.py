"""Child processes that die with their parent, even when the parent is killed with SIGKILL.

A process we start (anvil, a demo's market and daemons, a sandbox worker's launcher) must not
outlive us: an orphaned anvil holds its port, an orphaned worker keeps burning CPU on a task no
one will collect. Linux's parent-death signal does this; `setpriv --pdeathsig KILL` (util-linux)
sets it in the child before it executes, without a `preexec_fn` (which forces `fork()` in a
threaded process). The kernel sends the signal when the *thread* that started the child exits,
so it is used only from a thread that lives as long as the child should: the main thread, or a
long-lived thread the caller names (the sandbox's spawner).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence


def dies_with_parent(args: Sequence[str], *, long_lived_thread: bool = False) -> list[str]:
    """Return ``args`` prefixed so the child is killed when its parent dies.

    Unchanged when `setpriv` is missing, or when called from a thread other than the main one
    without ``long_lived_thread`` (the signal would fire when that thread ends).
    """
    setpriv = shutil.which("setpriv")
    on_main = threading.current_thread() is threading.main_thread()
    if setpriv is None or not (on_main or long_lived_thread):
        return list(args)
    return [setpriv, "--pdeathsig", "KILL", "--", *args]
