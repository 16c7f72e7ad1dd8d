"""A batch of tasks fitted under the deal's spending cap at each task's maximum price."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from client.amounts import tokens
from client.job_files import JobTask


@dataclass(frozen=True)
class CapPlan:
    """The batch fitted under a cap at each task's maximum price."""

    cap: int
    owed: int  # already vouched in this deal (earlier runs included)
    run: tuple[JobTask, ...]
    skipped: tuple[JobTask, ...]
    warn_at: float = 0.8

    @property
    def projected(self) -> int:
        """Return the bill if every task sent costs its maximum price."""
        return self.owed + sum(t.spec.max_price for t in self.run)

    @property
    def warning(self) -> str | None:
        """Return a warning when the projected bill nears or would pass the cap."""
        wanted = self.projected + sum(t.spec.max_price for t in self.skipped)
        if self.skipped:
            return (
                f"the batch could cost {tokens(wanted)}, past the cap {tokens(self.cap)} "
                f"({tokens(self.owed)} already owed): {len(self.skipped)} task(s) not sent"
            )
        if self.cap and self.projected >= self.warn_at * self.cap:
            return (
                f"projected bill {tokens(self.projected)} is {self.projected / self.cap:.0%} "
                f"of the cap {tokens(self.cap)}"
            )
        return None


def fit_under_cap(
    tasks: Sequence[JobTask], *, owed: int, cap: int, warn_at: float = 0.8
) -> CapPlan:
    """Keep tasks, in order, while their maximum prices fit under ``cap``; skip the rest."""
    run: list[JobTask] = []
    skipped: list[JobTask] = []
    total = owed
    for task in tasks:
        if not skipped and total + task.spec.max_price <= cap:
            run.append(task)
            total += task.spec.max_price
        else:
            skipped.append(task)
    return CapPlan(cap=cap, owed=owed, run=tuple(run), skipped=tuple(skipped), warn_at=warn_at)
