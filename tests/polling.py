"""Polling of external processes' state: the one place the tests and scripts wait on it.

Only for readiness and progress of other processes (a daemon up, a claim settled on chain),
never to order events inside one process.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(
    done: Callable[[], bool],
    timeout_s: float,
    *,
    first_delay_s: float = 0.02,
    max_delay_s: float = 0.5,
) -> bool:
    """Poll ``done``, doubling the delay, until true (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    delay = first_delay_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, max_delay_s)
    return True


def wait_until(done: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    """Poll ``done`` until it is true; raise AssertionError naming ``what`` after ``timeout_s``."""
    if not poll_until(done, timeout_s):
        raise AssertionError(f"{what} not reached within {timeout_s:.0f} s")
