"""Where the writer's outcomes go: a thread's `Future`, or an event loop's future, set in one
wake-up of its loop per group (`market.writer`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from market.placement import Placed


class Answer(Protocol):
    """Where a request's outcome goes: a thread's `Future`, or a `LoopAnswer`."""

    def done(self) -> bool: ...
    def set_result(self, result: list[Placed]) -> None: ...
    def set_exception(self, exception: BaseException) -> None: ...


Outbox = dict[asyncio.AbstractEventLoop, list[tuple["asyncio.Future[list[Placed]]", object]]]


class LoopAnswer:
    """A request's outcome for an event loop: kept in the writer's outbox until the group is
    done, then handed to the loop with the group's other outcomes in one wake-up."""

    __slots__ = ("_done", "future", "loop", "outbox")

    def __init__(
        self,
        future: asyncio.Future[list[Placed]],
        loop: asyncio.AbstractEventLoop,
        outbox: Outbox,
    ) -> None:
        self.future = future
        self.loop = loop
        self.outbox = outbox
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: list[Placed]) -> None:
        self._post(result)

    def set_exception(self, exception: BaseException) -> None:
        self._post(exception)

    def _post(self, outcome: object) -> None:
        if self._done:
            raise RuntimeError("a request's outcome was set twice")
        self._done = True
        self.outbox.setdefault(self.loop, []).append((self.future, outcome))


def deliver(outcomes: list[tuple[asyncio.Future[list[Placed]], object]]) -> None:
    """Set each future's outcome (on its loop); one its caller stopped awaiting is skipped."""
    for future, outcome in outcomes:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)  # type: ignore[arg-type]  # a result, not an error
