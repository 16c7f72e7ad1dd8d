"""Child processes that die with their parent, even when the parent is killed with SIGKILL.

A process we start (anvil, a demo's market and daemons, a sandbox worker's launcher) must not
outlive us: an orphaned anvil holds its port, an orphaned worker keeps burning CPU on a task no
one will collect. Linux's parent-death signal does this; `setpriv --pdeathsig KILL` (util-linux)
sets it in the child before it executes, without a `preexec_fn` (which forces `fork()` in a
threaded process). The kernel sends the signal when the *thread* that started the child exits,
so it is used only from a thread that lives as long as the child should: the main thread, or a
long-lived thread the caller names (the sandbox's spawner).

The signal is armed only once `setpriv` runs, a moment after the fork: a parent that dies in
that moment would leave the child adopted and unarmed. So a shell checks, after arming, that
its parent is still the process that started it, and kills itself if not; then it becomes the
command (`exec`: the same pid).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence

ARMED_CHECK = '[ "$PPID" = "$0" ] || kill -KILL $$; exec "$@"'
"""Run by ``sh -c`` after the signal is armed; ``$0`` is the pid of the expected parent."""


def dies_with_parent(
    args: Sequence[str], *, long_lived_thread: bool = False, parent: int | None = None
) -> list[str]:
    """Return ``args`` prefixed so the child is killed when its parent dies.

    ``parent`` is the pid the child must find as its parent once armed (this process when
    None); a child that finds another was orphaned before it was armed and kills itself.
    Unchanged when `setpriv` is missing, or when called from a thread other than the main one
    without ``long_lived_thread`` (the signal would fire when that thread ends).
    """
    setpriv = shutil.which("setpriv")
    shell = shutil.which("sh")
    on_main = threading.current_thread() is threading.main_thread()
    if setpriv is None or shell is None or not (on_main or long_lived_thread):
        return list(args)
    expected = os.getpid() if parent is None else parent
    return [setpriv, "--pdeathsig", "KILL", "--", shell, "-c", ARMED_CHECK, str(expected), *args]
