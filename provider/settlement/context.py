"""What every settlement job shares: the chain, the journal, one lock, and the steps they all take.

Each job (:mod:`~provider.settlement.discovery`, :mod:`~provider.settlement.watch`,
:mod:`~provider.settlement.redeem`, :mod:`~provider.settlement.claim`,
:mod:`~provider.settlement.finalize`, :mod:`~provider.settlement.close`) holds one
:class:`SettlementContext` and reads deals, journals its steps and counts its failures through
it, so every job journals and counts the same way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterator
from typing import Any, Final

from contracts.binding import DealState, DealStatus, Escrow
from contracts.errors import CallRevertedError, ContractRevert
from contracts.messages import Plan, address_of
from provider.clock import ChainClock
from provider.config import SettlementConfig
from provider.deals import DealCache
from provider.errors import RejectedError
from provider.journal import DealBook, Journal, SettlementRecord
from provider.lifecycle import SettlementAction, SettlementStep
from provider.metrics import ProviderMetrics
from provider.receipts import settle_by
from provider.task_index import MAX_TASKS

log = logging.getLogger("provider.settlement")

READ_CHUNK: Final = 500
"""View calls per JSON-RPC batch."""

SET_ASIDE: Final = "task_set_aside"
"""``tpumarket_provider_settlement_failures{action}`` label of a task a job sets aside (its
status read or its claim reverts) so the deal's other tasks settle."""

OpenDeal = tuple[int, DealBook, DealState, Plan]
"""A deal the jobs may settle: its id, its journal book, its state on chain, its plan."""


class SettlementContext:
    """The provider's key, chain, journal, deal cache, config, metrics and clock, with the lock
    that makes the jobs run one at a time (re-entrant: the close job runs the others)."""

    def __init__(
        self,
        *,
        private_key: str,
        escrow: Escrow,
        journal: Journal,
        deals: DealCache,
        config: SettlementConfig,
        metrics: ProviderMetrics,
        clock: ChainClock | None = None,
    ) -> None:
        """Hold the parts; ``clock`` is the daemon's (by default, one reading this chain)."""
        self.private_key = private_key
        self.address = address_of(private_key)
        self.escrow = escrow
        self.journal = journal
        self.deals = deals
        self.config = config
        self.metrics = metrics
        self.clock = clock or ChainClock(self.latest_block_time)
        self.lock = threading.RLock()
        self._warned: set[tuple[str, int, int]] = set()

    def latest_block_time(self) -> int:
        """Return the latest block's timestamp."""
        return int(self.escrow.tx.w3.eth.get_block("latest")["timestamp"])

    # ---- reading deals -----------------------------------------------------------------

    def books(self, only: Collection[int] | None = None) -> Iterator[tuple[int, DealBook]]:
        """Yield the deals the journal does not hold closed (only ``only``, when given)."""
        for deal_id, book in self.journal.iter_books():
            if not book.closed() and (only is None or deal_id in only):
                yield deal_id, book

    def state(self, deal_id: int, *, fresh: bool = False) -> DealState | None:
        """Return a deal's state on chain (None, logged, where it cannot be read)."""
        try:
            return self.deals.get(deal_id, fresh=fresh)
        except RejectedError as exc:
            log.warning("cannot read deal", extra={"deal": deal_id, "error": exc.reason})
            return None

    def open_deals(self, only: Collection[int] | None = None) -> list[OpenDeal]:
        """Return the deals open on chain with a task or a voucher in the journal."""
        out = []
        for deal_id, book in self.books(only):
            if not book.receipts and not book.vouchers:
                continue
            state = self.state(deal_id)
            if state is None or state.status != DealStatus.OPEN:
                continue
            plan = self.deals.plan_of(state)
            if plan is not None:
                out.append((deal_id, book, state, plan))
        return out

    def task_statuses(self, deal_id: int, indexes: list[int]) -> list[int | None]:
        """Return the chain's settlement state of tasks, in batched reads (each a value of
        :class:`~contracts.states.TaskStatus`), or None for a task whose read reverts.

        One task's read never fails the others: an index the escrow cannot hold is not read,
        and a batch with a reverting read is read again task by task; such a task is set aside
        (:meth:`set_aside`). A transport failure still raises.
        """
        out: dict[int, int | None] = {}
        readable = []
        for index in indexes:
            if index >= MAX_TASKS:
                self.set_aside(deal_id, index, f"task index {index} is past MAX_TASKS {MAX_TASKS}")
                out[index] = None
            else:
                readable.append(index)
        for start in range(0, len(readable), READ_CHUNK):
            chunk = readable[start : start + READ_CHUNK]
            try:
                out.update(zip(chunk, self._statuses(deal_id, chunk), strict=True))
            except (ContractRevert, CallRevertedError):
                out.update((i, self._status(deal_id, i)) for i in chunk)
        return [out[i] for i in indexes]

    def _statuses(self, deal_id: int, chunk: list[int]) -> list[int]:
        calls = [("taskStatus", (deal_id, i)) for i in chunk]
        return [int(s) for s in self.escrow.read_many(calls)]

    def _status(self, deal_id: int, index: int) -> int | None:
        try:
            return self._statuses(deal_id, [index])[0]
        except (ContractRevert, CallRevertedError) as exc:
            self.set_aside(deal_id, index, f"its status read reverts: {exc}")
            return None

    def set_aside(self, deal_id: int, index: int, why: str) -> None:
        """Count and log (once per task) a task left out so the deal's other tasks settle."""
        if ("set_aside", deal_id, index) not in self._warned:
            self.metrics.settlement_failures.labels(SET_ASIDE).inc()
        self.warn_once(
            "set_aside", deal_id, index, f"task set aside: the others settle without it ({why})"
        )

    # ---- timing ------------------------------------------------------------------------

    def settle_by_of(self, book: DealBook, index: int, state: DealState) -> int | None:
        """Return a task's settlement instant (None for a task the journal has no ack of)."""
        ack = book.acks.get(index)
        if ack is None:
            return None
        return settle_by(ack.request.deadline, state.expiry, state.challenge_window)

    def act_by(self, settle: int, state: DealState) -> float:
        """Return when the jobs put a task settling at ``settle`` on chain at the latest."""
        return settle - self.config.margin_s(state.challenge_window)

    # ---- journaling, counting, logging -------------------------------------------------

    def record(
        self,
        deal_id: int,
        action: SettlementAction,
        data: dict[str, Any],
        tx_hash: str | None,
    ) -> SettlementRecord:
        """Journal a settlement step, forget the cached deal, count it and the money it moved."""
        record = self.journal.record_settlement(deal_id, action, data, tx_hash)
        self.deals.invalidate(deal_id)
        self.metrics.settlements.labels(action).inc()
        self.metrics.money(action, data)
        return record

    def failed(self, step: SettlementStep, deal_id: int, exc: Exception) -> None:
        """Count and log a step that failed (the job moves on to the next deal)."""
        self.metrics.settlement_failures.labels(step).inc()
        log.error(f"{step} failed", extra={"deal": deal_id, "error": str(exc)})

    def warn_once(self, what: str, deal_id: int, index: int, message: str) -> None:
        """Log ``message`` about a task the first time only (per ``what``)."""
        if (what, deal_id, index) not in self._warned:
            self._warned.add((what, deal_id, index))
            log.error(message, extra={"deal": deal_id, "task": index})
