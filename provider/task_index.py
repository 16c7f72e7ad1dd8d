"""Which task index a deal may ack next: one the escrow can settle, and only in order.

The escrow settles tasks ``0 .. MAX_TASKS - 1`` of a deal and prices a tiered plan's task by
its index. So the daemon acks an index only below :data:`MAX_TASKS`, and only the next one:
index ``n`` once ``0 .. n-1`` are all acked. The n-th task acked is then the task at index
``n``, priced at the plan's n-th tier by the daemon (:func:`provider.receipts.ack_price`) and
by the escrow alike; no choice of index buys a deeper tier. A refusal before the ack consumes
no index: the client sends its next task at the same index.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Final

from contracts.messages import TaskRequest
from provider.errors import RejectedError

MAX_TASKS: Final = 65_536
"""Task indexes a deal can settle: mirrors ``ComputeEscrow.MAX_TASKS`` (a test reads the
compiled escrow's constant and compares)."""

OUT_OF_RANGE: Final = "task_index_out_of_range"
"""Refusal code: the index is one the escrow can never settle (``>= MAX_TASKS``)."""
OUT_OF_ORDER: Final = "task_index_out_of_order"
"""Refusal code: the deal's next index to ack is another one (the reason names it)."""


def range_problem(request: TaskRequest) -> str | None:
    """Return why the escrow could never settle this request's index (None: it can)."""
    if request.task_index >= MAX_TASKS:
        return (
            f"task index {request.task_index} is past the escrow's last settleable index "
            f"{MAX_TASKS - 1}: a deal holds at most {MAX_TASKS} tasks (open another deal)"
        )
    return None


def out_of_order_reason(request: TaskRequest, expected: int) -> str:
    """Return the refusal's reason; it ends with ``expected <n>``, which the SDK parses."""
    return (
        f"deal {request.deal_id} acks its tasks in order: task {request.task_index} waits for "
        f"task {expected} to be acked first; expected {expected}"
    )


class IndexOrder:
    """Track each deal's next index to ack, from the journal's acked indexes.

    Acks are only ever added, so the next index only grows; each call moves it past the
    indexes acked since (O(1) amortized). Call under the task service's lock, together with
    journaling the ack, so two submissions cannot both take index ``n``.
    """

    def __init__(self, acked: Callable[[int], Collection[int]]) -> None:
        """Read a deal's acked indexes through ``acked(deal_id)``."""
        self._acked = acked
        self._next: dict[int, int] = {}

    def expected(self, deal_id: int) -> int:
        """Return the lowest index of the deal not acked yet: the only one it acks next."""
        acked = self._acked(deal_id)
        n = self._next.get(deal_id, 0)
        while n in acked:
            n += 1
        self._next[deal_id] = n
        return n

    def check(self, request: TaskRequest, reject: Callable[[str, str], RejectedError]) -> None:
        """Raise ``task_index_out_of_order`` unless the request takes the deal's next index."""
        expected = self.expected(request.deal_id)
        if request.task_index != expected:
            raise reject(OUT_OF_ORDER, out_of_order_reason(request, expected))


__all__ = [
    "MAX_TASKS",
    "OUT_OF_ORDER",
    "OUT_OF_RANGE",
    "IndexOrder",
    "out_of_order_reason",
    "range_problem",
]
