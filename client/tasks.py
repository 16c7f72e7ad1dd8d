"""A task from the client's side: what to run (its spec), what became of it (its outcome, a
breach's result), the deadline its request carries, its settlement instant, and how it settled
on chain."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from client.ledger_records import ChainState
from client.provider_http import TaskView
from contracts.binding import TASK_CLAIMED, TASK_REFUNDED, TASK_VOUCHED, Escrow
from contracts.messages import Ack, Receipt, TaskRequest
from contracts.settle_by import settle_by as settle_by  # the one copy, shared with the daemon
from programs.envelope import ProgramEnvelope, request_input_hash

DEADLINE_SLACK_S = 2
"""Seconds a request's deadline adds to the SLO, for transit and clock skew (agreed protocol)."""
CHAIN_STATES: dict[int, ChainState] = {
    TASK_VOUCHED: ChainState.VOUCHED,
    TASK_CLAIMED: ChainState.CLAIMED,
    TASK_REFUNDED: ChainState.REFUNDED,
}


def request_deadline(now: float, slo_ms: int, slack_s: int = DEADLINE_SLACK_S) -> int:
    """Return the deadline a request sent at ``now`` carries: ``now + ceil(slo) + slack``."""
    return int(now) + math.ceil(slo_ms / 1000) + slack_s


def chain_states(
    escrow: Escrow, deal_id: int, indices: Sequence[int], *, batch: int = 500
) -> dict[int, ChainState | None]:
    """Return the escrow's settlement state of each task (one JSON-RPC batch per ``batch``)."""
    out: dict[int, ChainState | None] = {}
    ordered = list(indices)
    for start in range(0, len(ordered), batch):
        chunk = ordered[start : start + batch]
        values = escrow.read_many([("taskStatus", (deal_id, i)) for i in chunk])
        for index, value in zip(chunk, values, strict=True):
            out[index] = CHAIN_STATES.get(int(value))
    return out


@dataclass(frozen=True)
class TaskSpec:
    """One task to run: its kind, program envelope, compile target and price limit."""

    kind: int
    envelope: ProgramEnvelope
    max_price: int
    target: str | None = None

    def input_hash(self) -> bytes:
        """Return the request's inputHash for this task (the target is bound for a compile)."""
        return request_input_hash(self.kind, self.envelope, self.target)


@dataclass
class TaskOutcome:
    """What became of one task: acked, delivered and verified (payable), rejected, refunded."""

    index: int
    spec: TaskSpec
    request: TaskRequest
    request_signature: bytes = b""
    ack: Ack | None = None
    ack_signature: bytes = b""
    view: TaskView | None = None
    verified: bool = False
    rejected: str | None = None
    refunded: tuple[int, int] | None = None  # (refund, penalty)
    spot_checked: bool = False
    claimed: bool = False  # settled on chain by the provider's claim instead
    abandoned: bool = False  # the client stopped waiting before the deadline (2nd Ctrl-C)

    @property
    def succeeded(self) -> bool:
        """Return whether the provider delivered a successful, verified result."""
        return bool(self.verified and self.view and self.view.state == "succeeded")


@dataclass(frozen=True)
class BreachResult:
    """What asking for a breached task's refund came to.

    ``kind``: ``delivered`` (the provider had the result after all, verified: pay it),
    ``refunded`` (with ``refund``), ``settled`` (already settled on chain: ``chain``),
    ``not_due`` (its settlement instant has not passed on chain) or ``failed`` (``detail``).
    A delivery that came but failed verification on the last look is in ``view``, and why in
    ``detail``.
    """

    kind: str
    refund: tuple[int, int] | None = None
    chain: ChainState | None = None
    view: TaskView | None = None
    receipt: Receipt | None = None
    detail: str = ""
