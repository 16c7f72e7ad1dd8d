"""Polling of external processes' state: the one place the tests and scripts wait on it.

Only for readiness and progress of other processes (a daemon up, a claim settled on chain),
never to order events inside one process.

A test's wait is a condition, not a budget: `wait_until` returns the moment the condition
holds, and its limit only stops a hang. That limit is the figure a test names scaled by how
loaded the host is (`hang_ceiling_s`), so a slow, shared machine never turns a slow success
into a failure; `TESTS_WAIT_SCALE` sets the factor outright. `poll_until` keeps its exact
limit: scripts that measure how long something takes use it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

SCALE_ENV = "TESTS_WAIT_SCALE"
"""Set to a number to fix the factor `hang_ceiling_s` applies (e.g. 1 to reproduce a hang fast)."""
MIN_SCALE = 3.0
"""The factor on an idle host: a limit a test names is what it takes there at worst, not more."""
MAX_SCALE = 10.0
"""The factor at a load of `MAX_SCALE / MIN_SCALE` runnable processes per core and above."""


def wait_scale() -> float:
    """Return the factor on a wait's named limit: `TESTS_WAIT_SCALE`, else `MIN_SCALE` times the
    host's one-minute load per core (at least `MIN_SCALE`, at most `MAX_SCALE`)."""
    fixed = os.environ.get(SCALE_ENV)
    if fixed:
        return float(fixed)
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(MAX_SCALE, MIN_SCALE * max(1.0, per_core))


def hang_ceiling_s(timeout_s: float) -> float:
    """Return the hang protection for a wait a test names `timeout_s`: scaled by `wait_scale`."""
    return timeout_s * wait_scale()


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
    """Poll ``done`` until it is true; raise AssertionError naming ``what`` once the hang
    ceiling (``timeout_s`` scaled by the host's load, `hang_ceiling_s`) passes."""
    ceiling = hang_ceiling_s(timeout_s)
    if not poll_until(done, ceiling):
        load = os.getloadavg()[0]
        raise AssertionError(
            f"{what} not reached within {ceiling:.0f} s ({timeout_s:.0f} s named, x"
            f"{ceiling / timeout_s:.1f} for a load of {load:.1f} on {os.cpu_count()} cores)"
        )
