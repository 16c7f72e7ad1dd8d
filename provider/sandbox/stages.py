"""A request's stage deadlines on a worker: each stage's limit, cut to the task's budget.

A stage limit that passes while its worker got little CPU (the host was loaded, not the
program slow) does not end the task: its deadline moves to the task's budget, and only a
cut there ends it. The budget ends a second past the task's deadline, so such a task is
late: never claimable, refunded with the penalty, the provider's cost and not a billed
timeout. A worker that spent its stage computing is cut at the stage limit as before.
"""

from __future__ import annotations

import os
from typing import Final

from provider.diagnosis import Stage
from provider.sandbox.limits import SandboxLimits

STARVED_SHARE: Final = 0.25
"""A worker that got less CPU than this share of one core over a stage was starved."""
_TICKS_PER_S: Final = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float | None:
    """Return the CPU time (user + system, all threads) ``pid`` used so far, if readable."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    except (OSError, IndexError, ValueError):
        return None


def bounded(limit: float, cutoff: float | None, now: float) -> tuple[float, float]:
    """A stage's limit and deadline, cut to the task's budget (``cutoff``, same clock)."""
    if cutoff is None or now + limit <= cutoff:
        return limit, now + limit
    return max(0.0, cutoff - now), cutoff


class StageClock:
    """The deadline of the stage a worker is in, for one request."""

    def __init__(
        self,
        limits: SandboxLimits,
        stage: Stage,
        cutoff: float | None,
        now: float,
        pid: int | None,
    ) -> None:
        """Start at ``stage`` at ``now`` (monotonic); ``cutoff`` is the task's budget."""
        self.limits = limits
        self.stage = stage
        self.cutoff = cutoff
        self.pid = pid
        self.stretched = False
        first = limits.execute_timeout_s if stage is Stage.EXECUTE else limits.validate_timeout_s
        self._begin(first, now)

    def _begin(self, limit: float, now: float) -> None:
        self.limit, self.deadline = bounded(limit, self.cutoff, now)
        self._started = now
        # Read only when the stage can be stretched: a budget past the stage's deadline.
        stretchable = self.cutoff is not None and self.deadline < self.cutoff
        self._cpu = cpu_seconds(self.pid) if stretchable else None

    def enter(self, new_stage: Stage, now: float) -> None:
        """The worker reported ``new_stage``: compile and execute start their own limit."""
        limit = None
        if new_stage is Stage.COMPILE and self.stage is not Stage.COMPILE:
            limit = self.limits.compile_timeout_s
        elif new_stage is Stage.EXECUTE and self.stage is not Stage.EXECUTE:
            limit = self.limits.execute_timeout_s
        if limit is not None:
            self._begin(limit, now)
        self.stage = new_stage

    def overrun(self, now: float) -> bool:
        """At the deadline: True ends the task (its stage's timeout); False moved the
        deadline to the task's budget because the worker was starved of CPU."""
        if self.cutoff is None or self._cpu is None or self.deadline >= self.cutoff:
            return True
        used = cpu_seconds(self.pid)
        if used is None or used - self._cpu >= STARVED_SHARE * (now - self._started):
            return True
        self.deadline, self._cpu, self.stretched = self.cutoff, None, True
        self.limit = self.cutoff - self._started
        return False
