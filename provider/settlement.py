"""Settlement jobs: every delivered task on chain before its settlement instant, with a margin.

Each task of a deal settles at ``settleBy = min(request.deadline, expiry) + challengeWindow``
(the escrow's one settlement instant): until then the provider may claim it, after it the
client may refund it. So every delivered task must be on chain (vouched by a redeemed
voucher, or claimed with the client's signed request) by ``settleBy``. The jobs act at the
latest at ``settleBy - margin``, ``margin = margin_fraction x challengeWindow``, which covers
one job interval plus one transaction (:class:`provider.config.SettlementConfig`; shorter
windows are refused when a task or a quote arrives). Until then the client has time to vouch,
and the jobs wait, so one voucher pays many tasks and one claim carries many.

Each job is a method callable directly (tests trigger them after moving the chain's clock);
:meth:`SettlementJobs.start` runs :meth:`SettlementJobs.run_all` every ``interval_s`` on an
apscheduler ``BackgroundScheduler``, the first pass at once (after a restart, whatever came due
while the daemon was down is settled then). Every step is journaled; a revert is logged and
counted, and the job moves on to the next deal.

- **discover** the deals opened with this provider (``DealOpened`` logs by provider topic,
  from a cursor kept in the journal), so deals without tasks are closed too;
- **watch** deals: journal claim batches the chain holds but the journal lost (a claim mined
  just before the daemon died), refunds of overdue tasks, and deals closed on chain;
- **redeem** the latest acceptable voucher once a task it newly pays reaches its
  ``settleBy - margin``, or once its increase reaches ``redeem_threshold``. A voucher the
  escrow refuses is journaled ``voucher_unusable``: the tasks it covered are claimed instead;
  so is one that would leave the deal's cap short of the other acked tasks (the task service
  refuses those; a journal of an older daemon may hold one);
- **claim** delivered, on-time tasks that no acceptable voucher covers once they reach
  ``settleBy - margin``, up to ``claim_batch_max`` per transaction, each with the client's
  signed request; a task the chain refuses is dropped from the batch, which is sent again;
- **finalize** claimed batches once their challenge window has passed; a dispute the arbiter
  left past its period is lapsed (the client wins it), so the deal can close;
- **close** deals the client agreed to close (every task on chain or past its settlement
  instant, no claim pending) and deals past ``expiry + 2 x challengeWindow``: first redeem
  the latest voucher and, on an early close, claim what no voucher pays.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from contracts.binding import (
    BATCH_DISPUTED,
    BATCH_PAID,
    BATCH_REJECTED,
    DEAL_CLOSED,
    DEAL_OPEN,
    TASK_CLAIMED,
    TASK_NONE,
    TASK_REFUNDED,
    TASK_VOUCHED,
    DealState,
    Escrow,
)
from contracts.errors import ChainError, ContractRevert
from contracts.messages import Claim, Plan, address_of
from contracts.reverts import EscrowDealNotOpen, EscrowStaleVoucher
from provider.clock import ChainClock
from provider.config import SettlementConfig
from provider.deals import DealCache
from provider.errors import RejectedError
from provider.journal import DealBook, Journal, ReceiptRecord, SettlementRecord, VoucherRecord
from provider.metrics import ProviderMetrics
from provider.receipts import cap_free, settle_by, voucher_tasks

log = logging.getLogger("provider.settlement")

DEAL_SCAN_CURSOR = "deal_scan_block"
"""Journal meta key: the last block whose ``DealOpened`` logs were scanned."""
_SCAN_CHUNK = 10_000  # blocks per eth_getLogs call
_READ_CHUNK = 500  # view calls per JSON-RPC batch
_CLAIM_ATTEMPTS = 4  # a batch is sent again without each task the chain refused


@dataclass(frozen=True, slots=True)
class JobReport:
    """What one pass of the jobs did."""

    redeemed: tuple[SettlementRecord, ...] = ()
    claimed: tuple[SettlementRecord, ...] = ()
    finalized: tuple[SettlementRecord, ...] = ()
    closed: tuple[int, ...] = ()
    discovered: tuple[int, ...] = ()


class SettlementJobs:
    """The provider's on-chain settlement, driven by the journal and each deal's windows."""

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
        """Wire the jobs; ``clock`` is the daemon's (by default, one reading this chain)."""
        self._key = private_key
        self.address = address_of(private_key)
        self.escrow = escrow
        self.journal = journal
        self.deals = deals
        self.config = config
        self.metrics = metrics
        self.clock = clock or ChainClock(self._latest_block_time)
        self._lock = threading.RLock()
        self._scheduler: BackgroundScheduler | None = None
        self._warned: set[tuple[str, int, int]] = set()
        self._disputed: set[tuple[int, int]] = set()  # (deal, batch) disputes logged
        self._pass_started: float | None = None

    def _latest_block_time(self) -> int:
        return int(self.escrow.tx.w3.eth.get_block("latest")["timestamp"])

    # ---- helpers -----------------------------------------------------------------------

    def _books(self, only: Collection[int] | None = None) -> Iterator[tuple[int, DealBook]]:
        """Yield the deals the journal does not hold closed (only ``only``, when given)."""
        for deal_id, book in self.journal.iter_books():
            if not book.closed() and (only is None or deal_id in only):
                yield deal_id, book

    def _state(self, deal_id: int, *, fresh: bool = False) -> DealState | None:
        try:
            return self.deals.get(deal_id, fresh=fresh)
        except RejectedError as exc:
            log.warning("cannot read deal", extra={"deal": deal_id, "error": exc.reason})
            return None

    def _open_deals(
        self, only: Collection[int] | None = None
    ) -> list[tuple[int, DealBook, DealState, Plan]]:
        out = []
        for deal_id, book in self._books(only):
            if not book.receipts and not book.vouchers:
                continue
            state = self._state(deal_id)
            if state is None or state.status != DEAL_OPEN:
                continue
            plan = self.deals.plan_of(state)
            if plan is not None:
                out.append((deal_id, book, state, plan))
        return out

    def settle_by_of(self, book: DealBook, index: int, state: DealState) -> int | None:
        """Return a task's settlement instant (None for a task the journal has no ack of)."""
        ack = book.acks.get(index)
        if ack is None:
            return None
        return settle_by(ack.request.deadline, state.expiry, state.challenge_window)

    def act_by(self, settle: int, state: DealState) -> float:
        """Return when the jobs put a task settling at ``settle`` on chain at the latest."""
        return settle - self.config.margin_s(state.challenge_window)

    def _failed(self, action: str, deal_id: int, exc: Exception) -> None:
        self.metrics.settlement_failures.labels(action).inc()
        log.error(f"{action} failed", extra={"deal": deal_id, "error": str(exc)})

    def _warn_once(self, what: str, deal_id: int, index: int, message: str) -> None:
        if (what, deal_id, index) not in self._warned:
            self._warned.add((what, deal_id, index))
            log.error(message, extra={"deal": deal_id, "task": index})

    def _record(
        self, deal_id: int, action: str, data: dict[str, Any], tx_hash: str | None
    ) -> SettlementRecord:
        record = self.journal.record_settlement(deal_id, action, data, tx_hash)
        self.deals.invalidate(deal_id)
        self.metrics.settlements.labels(action).inc()
        self.metrics.money(action, data)
        return record

    def _statuses(self, deal_id: int, indexes: list[int]) -> list[int]:
        """Return the chain's settlement state of tasks (TASK_*), in batched reads."""
        out: list[int] = []
        for start in range(0, len(indexes), _READ_CHUNK):
            chunk = indexes[start : start + _READ_CHUNK]
            out += [
                int(s) for s in self.escrow.read_many([("taskStatus", (deal_id, i)) for i in chunk])
            ]
        return out

    # ---- discover ----------------------------------------------------------------------

    def discover_deals(self) -> list[int]:
        """Journal every deal opened with this provider since the last scan; return them.

        Reads ``DealOpened`` logs filtered by the provider topic, from the journal's cursor
        (``settlement.start_block`` at first) to the latest block.
        """
        with self._lock:
            w3 = self.escrow.tx.w3
            stored = self.journal.meta(DEAL_SCAN_CURSOR)
            start = self.config.start_block if stored is None else int(stored) + 1
            latest = int(w3.eth.block_number)
            topic = self.escrow.contract.events.DealOpened.topic
            provider_topic = "0x" + bytes.fromhex(self.address[2:]).rjust(32, b"\0").hex()
            found = []
            while start <= latest:
                end = min(latest, start + _SCAN_CHUNK - 1)
                logs = w3.eth.get_logs(
                    {
                        "address": self.escrow.address,
                        "fromBlock": start,
                        "toBlock": end,
                        "topics": [topic, None, None, provider_topic],
                    }
                )
                for log_entry, event in zip(logs, self.escrow.decode_events(logs), strict=True):
                    deal_id = int(event.args["dealId"])
                    book = self.journal.deal(deal_id)
                    if book is not None and book.opened() is not None:
                        continue
                    self._record(
                        deal_id,
                        "opened",
                        {
                            "client": str(event.args["client"]),
                            "expiry": int(event.args["expiry"]),
                            "challenge_window": int(event.args["challengeWindow"]),
                            "max_spend": str(int(event.args["maxSpend"])),
                            "stake": str(int(event.args["stake"])),
                            "block": int(log_entry["blockNumber"]),
                        },
                        "0x" + bytes(log_entry["transactionHash"]).hex(),
                    )
                    found.append(deal_id)
                self.journal.set_meta(DEAL_SCAN_CURSOR, str(end))
                start = end + 1
        if found:
            log.info("deals discovered on chain", extra={"deals": found})
        return found

    def window_problems(self) -> list[str]:
        """Return why this config cannot settle some deal it still has to settle (empty: none).

        A deal whose last settlement instant (``expiry + challengeWindow``) has passed needs
        nothing more from the jobs' timing and is not checked.
        """
        chain_now = self.clock.chain_now()
        problems = []
        for deal_id, book in self._books():
            opened = book.opened()
            if opened is not None:
                window, expiry = int(opened["challenge_window"]), int(opened["expiry"])
            else:
                state = self._state(deal_id)
                if state is None:
                    continue
                window, expiry = state.challenge_window, state.expiry
            if chain_now > expiry + window:
                continue
            problem = self.config.window_problem(window)
            if problem is not None:
                problems.append(f"deal {deal_id}: {problem}")
        return problems

    # ---- watch -------------------------------------------------------------------------

    def watch_deals(self, deals: Collection[int] | None = None) -> list[int]:
        """Journal lost claims and refunds of overdue tasks; record closed deals; return those."""
        closed = []
        with self._lock:
            chain_now = self.clock.chain_now()
            for deal_id, book in self._books(deals):
                state = self._state(deal_id, fresh=True)
                if state is None:
                    continue
                self._reconcile(deal_id, book, state)
                if state.status == DEAL_CLOSED:
                    self._record(deal_id, "closed", {}, None)
                    log.info("deal found closed on chain", extra={"deal": deal_id})
                    closed.append(deal_id)
                    continue
                self._sync_overdue(deal_id, book, state, chain_now)
        return closed

    def sync_overdue(self, deal_id: int) -> None:
        """Read the chain's state of a deal's tasks past their settlement instant; journal
        refunds (the task service calls this before refusing a task for budget)."""
        book = self.journal.deal(deal_id)  # no job lock: a pass in progress may hold it long
        state = self._state(deal_id)
        if book is not None and state is not None:
            self._sync_overdue(deal_id, book, state, self.clock.chain_now())

    def _sync_overdue(self, deal_id: int, book: DealBook, state: DealState, now: int) -> None:
        overdue = []
        for index in sorted(book.acks):
            settle = self.settle_by_of(book, index, state)
            if settle is not None and settle < now and not book.on_chain(index):
                overdue.append(index)
        if not overdue:
            return
        try:
            statuses = self._statuses(deal_id, overdue)
        except (ChainError, ContractRevert, ValueError) as exc:
            self._failed("watch", deal_id, exc)
            return
        refunded = [i for i, s in zip(overdue, statuses, strict=True) if s == TASK_REFUNDED]
        if refunded:
            refund = sum(book.acks[i].ack.price for i in refunded)
            penalty = state.penalty * len(refunded)
            self._record(
                deal_id,
                "refunded",
                {"tasks": refunded, "refund": str(refund), "penalty": str(penalty)},
                None,
            )
            log.warning(
                "tasks refunded to the client, with the deal's penalty",
                extra={"deal": deal_id, "tasks": refunded, "refund": refund, "penalty": penalty},
            )
        for index, status in zip(overdue, statuses, strict=True):
            record = book.receipts.get(index)
            if status == TASK_NONE and record is not None and record.on_time:
                self._warn_once(
                    "missed",
                    deal_id,
                    index,
                    "a delivered task passed its settlement instant off chain: the client may "
                    "refund it (only its voucher can still pay it)",
                )
            elif status in (TASK_VOUCHED, TASK_CLAIMED) and not book.on_chain(index):
                self._warn_once(
                    "unjournaled",
                    deal_id,
                    index,
                    "a task is settled on chain but not in the journal (reconciled by the "
                    "next redeem or claim reconciliation)",
                )

    def reconcile_claims(self) -> list[SettlementRecord]:
        """Journal every claim batch the chain holds and the journal lacks (run at start)."""
        done = []
        with self._lock:
            for deal_id, book in self._books():
                if not book.receipts:
                    continue
                state = self._state(deal_id, fresh=True)
                if state is not None:
                    done.extend(self._reconcile(deal_id, book, state))
        return done

    def _reconcile(self, deal_id: int, book: DealBook, state: DealState) -> list[SettlementRecord]:
        """Journal the deal's claim batches that exist on chain but not in the journal.

        A claim transaction mined just before the daemon died has no journal row: its tasks
        show as claimed on chain and its batch would never be finalized. The batch's
        ``ReceiptsClaimed`` event says what it claimed.
        """
        known = {int(s.data["batch_id"]) for s in book.settlements if s.action == "claim"}
        done = []
        for batch_id in range(state.batch_count):
            if batch_id in known:
                continue
            try:
                found = self._claim_on_chain(deal_id, batch_id)
            except (ChainError, ContractRevert, ValueError, KeyError) as exc:
                self._failed("reconcile", deal_id, exc)
                continue
            if found is None:
                continue
            data, tx_hash = found
            record = self.journal.record_settlement(deal_id, "claim", data, tx_hash)
            self.deals.invalidate(deal_id)
            self.metrics.settlements.labels("reconciled").inc()
            log.warning("claim found on chain, journaled", extra={"deal": deal_id, **data})
            done.append(record)
        return done

    def _claim_on_chain(self, deal_id: int, batch_id: int) -> tuple[dict[str, Any], str] | None:
        logs = self.escrow.tx.w3.eth.get_logs(
            {
                "address": self.escrow.address,
                "fromBlock": self.config.start_block,
                "toBlock": "latest",
                "topics": [
                    self.escrow.contract.events.ReceiptsClaimed.topic,
                    "0x" + deal_id.to_bytes(32, "big").hex(),
                    "0x" + batch_id.to_bytes(32, "big").hex(),
                ],
            }
        )
        if not logs:
            return None
        event = self.escrow.decode_events(logs[:1])[0].args
        data = {
            "batch_id": batch_id,
            "deadline": int(event["deadline"]),
            "amount": str(int(event["amount"])),
            "tasks": [int(i) for i in event["taskIndexes"]],
            "reconciled": True,
        }
        return data, "0x" + bytes(logs[0]["transactionHash"]).hex()

    # ---- redeem ------------------------------------------------------------------------

    def redeem_due(
        self, *, force: bool = False, deals: Collection[int] | None = None
    ) -> list[SettlementRecord]:
        """Redeem each deal's latest acceptable voucher where it is due.

        Due: a task it newly pays reaches ``settleBy - margin``, or its increase over the
        last redeemed voucher reaches ``redeem_threshold``; ``force`` redeems any increase.
        """
        done = []
        with self._lock:
            self.clock.chain_now()
            now = self.clock.now()
            for deal_id, book, state, plan in self._open_deals(deals):
                latest = book.latest_voucher
                if latest is None:
                    continue
                if self._leaves_cap_short(deal_id, book, state, plan, latest):
                    latest = book.latest_voucher  # the one before: its tasks are claimed
                    if latest is None:
                        continue
                redeemed = book.redeemed()
                base = 0 if redeemed is None else redeemed.voucher.cumulative_amount
                increase = latest.voucher.cumulative_amount - base
                if increase <= 0:
                    continue
                if not (
                    force
                    or increase >= self.config.redeem_threshold
                    or self._voucher_due(book, latest, state, now)
                ):
                    continue
                record = self._redeem(deal_id, latest, increase)
                if record is not None:
                    done.append(record)
        return done

    def _leaves_cap_short(
        self, deal_id: int, book: DealBook, state: DealState, plan: Plan, latest: VoucherRecord
    ) -> bool:
        """Journal ``latest`` unusable if redeeming it would leave the deal's cap short of the
        other acked tasks while the voucher before it would not, and every task it newly
        covers can still be claimed; return whether it did.

        The task service refuses such a voucher (``voucher_leaves_cap_short``); this guards a
        journal written by a daemon that accepted one. Its tasks are claimed instead, so every
        delivered task is paid its receipt.
        """
        fee = plan.reservation_fee
        if cap_free(book, latest.voucher, max_spend=state.max_spend, reservation_fee=fee) >= 0:
            return False
        unusable = book.unusable_vouchers()
        before = next(
            (v for v in reversed(book.vouchers) if v.seq < latest.seq and v.seq not in unusable),
            None,
        )
        fallback = None if before is None else before.voucher
        if cap_free(book, fallback, max_spend=state.max_spend, reservation_fee=fee) < 0:
            return False  # short either way: the voucher pays more now
        chain_now = self.clock.chain_now()
        for index in voucher_tasks(latest.voucher):
            if book.on_chain(index) or (fallback is not None and fallback.covers(index)):
                continue
            ack, record = book.acks.get(index), book.receipts.get(index)
            if (
                ack is None
                or record is None
                or not (record.on_time and ack.claimable)
                or record.receipt.amount > ack.request.max_price
                or settle_by(ack.request.deadline, state.expiry, state.challenge_window) < chain_now
            ):
                return False  # only this voucher can still pay that task
        self._record(
            deal_id,
            "voucher_unusable",
            {
                "voucher_seq": latest.seq,
                "error": "cap_short",
                "reason": "redeemed, it would leave the cap short of the other acked tasks",
            },
            None,
        )
        log.warning(
            "voucher not redeemed: it pays more than its tasks and would leave the cap short "
            "of the other acked tasks; its tasks are claimed instead",
            extra={"deal": deal_id, "cumulative": latest.voucher.cumulative_amount},
        )
        return True

    def _voucher_due(
        self, book: DealBook, voucher: VoucherRecord, state: DealState, now: float
    ) -> bool:
        for index in voucher_tasks(voucher.voucher):
            if book.on_chain(index):
                continue
            settle = self.settle_by_of(book, index, state)
            if settle is not None and self.act_by(settle, state) <= now:
                return True
        return False

    def _redeem(
        self, deal_id: int, latest: VoucherRecord, increase: int
    ) -> SettlementRecord | None:
        voucher = latest.voucher
        try:
            tx = self.escrow.redeem_voucher(self._key, voucher, latest.signature)
            paid = int(tx.event("VoucherRedeemed").args["paid"])
            tx_hash: str | None = tx.tx_hash
        except EscrowStaleVoucher as exc:
            # Redeemed already (the daemon died after sending): the chain says so.
            fresh = self._state(deal_id, fresh=True)
            if fresh is None or fresh.vouched < voucher.cumulative_amount:
                self._failed("redeem", deal_id, exc)
                return None
            paid, tx_hash = increase, None
        except EscrowDealNotOpen:
            return None  # closed: the watch job records it
        except ContractRevert as exc:
            # The escrow refuses this voucher for good (a task it covers was settled
            # otherwise, the cap is spent...): its tasks fall back to claims.
            self._record(
                deal_id,
                "voucher_unusable",
                {"voucher_seq": latest.seq, "error": exc.error_name, "reason": str(exc)},
                None,
            )
            self._failed("redeem", deal_id, exc)
            return None
        except ChainError as exc:
            self._failed("redeem", deal_id, exc)
            return None
        record = self._record(
            deal_id,
            "redeem",
            {
                "voucher_seq": latest.seq,
                "cumulative": str(voucher.cumulative_amount),
                "paid": str(paid),
            },
            tx_hash,
        )
        log.info(
            "voucher redeemed",
            extra={
                "deal": deal_id,
                "paid": paid,
                "cumulative": voucher.cumulative_amount,
                "tx": tx_hash,
            },
        )
        return record

    # ---- claim -------------------------------------------------------------------------

    def claim_due(
        self, *, force: bool = False, deals: Collection[int] | None = None
    ) -> list[SettlementRecord]:
        """Claim delivered, on-time tasks no acceptable voucher covers, once they are due.

        Due: the task reaches ``settleBy - margin``; ``force`` claims every claimable task.
        """
        done = []
        with self._lock:
            chain_now = self.clock.chain_now()
            now = self.clock.now()
            for deal_id, book, state, plan in self._open_deals(deals):
                candidates = self._claimable(deal_id, book, state, now, chain_now, force=force)
                size = self.config.claim_batch_max
                for start in range(0, len(candidates), size):
                    record = self._claim(deal_id, book, plan, candidates[start : start + size])
                    if record is not None:
                        done.append(record)
        return done

    def _claimable(
        self,
        deal_id: int,
        book: DealBook,
        state: DealState,
        now: float,
        chain_now: int,
        *,
        force: bool,
    ) -> list[ReceiptRecord]:
        latest = book.latest_voucher
        out = []
        for index, record in sorted(book.receipts.items()):
            ack = book.acks.get(index)
            if ack is None or index in book.claiming or book.on_chain(index):
                continue
            if latest is not None and latest.voucher.covers(index):
                continue  # the voucher pays it: redeem_due puts it on chain
            if not record.on_time:
                continue  # only a voucher can pay a late delivery
            settle = settle_by(ack.request.deadline, state.expiry, state.challenge_window)
            # Past its settlement instant by the chain's clock or by ours (ours is never behind
            # the chain's; the last block's time may be, on an idle chain), a claim would revert.
            if settle < max(chain_now, int(now)) or not (
                force or self.act_by(settle, state) <= now
            ):
                continue
            if not ack.claimable:
                self._warn_once(
                    "v1",
                    deal_id,
                    index,
                    "a task acked under settlement protocol v1 cannot be claimed under v2: "
                    "only a voucher pays it",
                )
                continue
            if record.receipt.amount > ack.request.max_price:
                self._warn_once(
                    "price",
                    deal_id,
                    index,
                    "a receipt's amount is above the request's maxPrice: it cannot be claimed",
                )
                continue
            out.append(record)
        return out

    def _claim(
        self, deal_id: int, book: DealBook, plan: Plan, batch: list[ReceiptRecord]
    ) -> SettlementRecord | None:
        """Claim one batch; the tasks stay marked ``claiming`` until the claim is journaled."""
        with self.journal.lock:  # vouchers are accepted under this lock: none covers these
            latest = book.latest_voucher
            batch = [
                r
                for r in batch
                if r.receipt.task_index not in book.claiming
                and not book.on_chain(r.receipt.task_index)
                and not (latest is not None and latest.voucher.covers(r.receipt.task_index))
            ]
            marked = {r.receipt.task_index for r in batch}
            book.claiming |= marked
        try:
            return self._send_claim(deal_id, book, plan, batch)
        finally:
            with self.journal.lock:
                book.claiming -= marked

    def _send_claim(
        self, deal_id: int, book: DealBook, plan: Plan, batch: list[ReceiptRecord]
    ) -> SettlementRecord | None:
        if not batch:
            return None
        try:
            statuses = self._statuses(deal_id, [r.receipt.task_index for r in batch])
        except (ChainError, ContractRevert, ValueError) as exc:
            self._failed("claim", deal_id, exc)
            return None
        batch = [r for r, s in zip(batch, statuses, strict=True) if s == TASK_NONE]
        for attempt in range(_CLAIM_ATTEMPTS):
            if not batch:
                return None
            claims = []
            for record in batch:
                ack = book.acks[record.receipt.task_index]
                claims.append(Claim(record.receipt, ack.request.max_price, ack.request_sig))
            try:
                tx = self.escrow.claim_receipts(self._key, deal_id, plan, claims)
                break
            except ContractRevert as exc:
                refused = exc.error_args.get("taskIndex")
                if refused is None or attempt == _CLAIM_ATTEMPTS - 1:
                    self._failed("claim", deal_id, exc)
                    return None
                batch = [r for r in batch if r.receipt.task_index != int(str(refused))]
                log.warning(
                    "claim refused a task: sent again without it",
                    extra={"deal": deal_id, "task": int(str(refused)), "error": str(exc)},
                )
            except ChainError as exc:
                self._failed("claim", deal_id, exc)
                return None
        else:  # every attempt either breaks or returns: this is never reached
            return None
        event = tx.event("ReceiptsClaimed").args
        claimed = self._record(
            deal_id,
            "claim",
            {
                "batch_id": int(event["batchId"]),
                "deadline": int(event["deadline"]),
                "amount": str(int(event["amount"])),
                "tasks": [int(i) for i in event["taskIndexes"]],
            },
            tx.tx_hash,
        )
        log.info(
            "tasks claimed",
            extra={
                "deal": deal_id,
                "batch": int(event["batchId"]),
                "tasks": len(batch),
                "amount": int(event["amount"]),
                "payable_at": int(event["deadline"]),
                "tx": tx.tx_hash,
            },
        )
        return claimed

    def settle_due(self, *, force: bool = False, deals: Collection[int] | None = None) -> JobReport:
        """Redeem, then claim what is due (see :meth:`redeem_due` and :meth:`claim_due`)."""
        redeemed = self.redeem_due(force=force, deals=deals)
        return JobReport(
            redeemed=tuple(redeemed), claimed=tuple(self.claim_due(force=force, deals=deals))
        )

    # ---- finalize ----------------------------------------------------------------------

    def finalize_claims(self, deals: Collection[int] | None = None) -> list[SettlementRecord]:
        """Finalize every claimed batch whose challenge window has passed; lapse disputes the
        arbiter left past its period (the client wins them: recorded ``rejected``)."""
        done = []
        with self._lock:
            chain_now = max(self.clock.chain_now(), int(self.clock.now()) - 1)
            for deal_id, book in self._books(deals):
                ended = {
                    int(s.data["batch_id"])
                    for s in book.settlements
                    if s.action in ("finalize", "rejected")
                }
                for claim in [s for s in book.settlements if s.action == "claim"]:
                    batch_id = int(claim.data["batch_id"])
                    if batch_id in ended or chain_now < int(claim.data["deadline"]):
                        continue
                    record = self._finalize(deal_id, batch_id, claim, chain_now)
                    if record is not None:
                        done.append(record)
        return done

    def _finalize(
        self, deal_id: int, batch_id: int, claim: SettlementRecord, chain_now: int
    ) -> SettlementRecord | None:
        try:
            tx = self.escrow.finalize_claim(self._key, deal_id, batch_id)
            action, tx_hash = "finalize", tx.tx_hash
        except (ContractRevert, ChainError) as exc:
            try:
                batch = self.escrow.get_batch(deal_id, batch_id)
            except (ContractRevert, ChainError):
                self._failed("finalize", deal_id, exc)
                return None
            if batch.status == BATCH_PAID:
                action, tx_hash = "finalize", None
            elif batch.status == BATCH_REJECTED:
                action, tx_hash = "rejected", None
            elif batch.status == BATCH_DISPUTED and chain_now >= batch.deadline:
                try:
                    tx_hash = self.escrow.lapse_dispute(self._key, deal_id, batch_id).tx_hash
                except (ContractRevert, ChainError) as lapse:
                    self._failed("lapse", deal_id, lapse)
                    return None
                action = "rejected"
            else:  # disputed: the arbiter rules; try again later
                if batch.status != BATCH_DISPUTED:
                    self._failed("finalize", deal_id, exc)
                elif (deal_id, batch_id) not in self._disputed:
                    self._disputed.add((deal_id, batch_id))
                    self.metrics.money("disputed", {})
                    log.warning(
                        "claim disputed by the client: the arbiter rules by the deadline",
                        extra={
                            "deal": deal_id,
                            "batch": batch_id,
                            "amount": int(claim.data["amount"]),
                            "arbitration_deadline": batch.deadline,
                        },
                    )
                return None
        finished = self._record(
            deal_id, action, {"batch_id": batch_id, "amount": claim.data["amount"]}, tx_hash
        )
        if action == "finalize":
            log.info(
                "claim finalized: paid",
                extra={
                    "deal": deal_id,
                    "batch": batch_id,
                    "paid": int(claim.data["amount"]),
                    "tx": tx_hash,
                },
            )
        else:
            log.warning(
                "claim rejected: the dispute went to the client",
                extra={"deal": deal_id, "batch": batch_id, "lost": int(claim.data["amount"])},
            )
        return finished

    # ---- close -------------------------------------------------------------------------

    def close_deals(self, deals: Collection[int] | None = None) -> list[int]:
        """Close deals the client agreed to close, and deals past expiry + 2 windows.

        Before closing: redeem the latest voucher; on an early close also claim what no
        voucher pays (the close then waits for those claims to finalize); finalize claims
        whose window passed. A deal with a task still running (before its settlement
        instant), claims pending or a voucher not yet redeemed is left for the next pass.
        Deals without any task (discovered on chain) close the same way; ``deals`` limits the
        pass to those deals. Return the deals closed.
        """
        with self._lock:
            chain_now = self.clock.chain_now()
            now = max(float(chain_now), self.clock.now())
            due: dict[int, bool] = {}  # deal -> past expiry + 2 windows (a unilateral close)
            for deal_id, _ in self._books(deals):
                state = self._state(deal_id, fresh=True)
                if state is None or state.status != DEAL_OPEN:
                    continue
                alone = now >= state.expiry + 2 * state.challenge_window
                if state.client_agreed_close or alone:
                    due[deal_id] = alone
            if not due:
                return []
            self.redeem_due(force=True, deals=due)
            self.claim_due(force=True, deals=[d for d, alone in due.items() if not alone])
            self.finalize_claims(deals=due)
            return [d for d, alone in due.items() if self._close(d, alone, chain_now)]

    def _close(self, deal_id: int, alone: bool, chain_now: int) -> bool:
        book = self.journal.deal(deal_id)
        state = self._state(deal_id, fresh=True)
        if book is None or book.closed() or state is None or state.status != DEAL_OPEN:
            return False
        latest = book.latest_voucher
        if state.pending or (
            latest is not None and state.vouched < latest.voucher.cumulative_amount
        ):
            return False  # claims in their window, or a voucher left to redeem: not yet
        if not alone and self._work_left(book, state, chain_now):
            return False
        try:
            tx = self.escrow.close_deal(self._key, deal_id)
            event = tx.event("DealClosed").args
        except (ContractRevert, ChainError, KeyError) as exc:
            self._failed("close", deal_id, exc)
            return False
        self._record(
            deal_id,
            "closed",
            {
                "by": "provider",
                "returned_to_client": str(int(event["returnedToClient"])),
                "stake_returned": str(int(event["stakeReturned"])),
            },
            tx.tx_hash,
        )
        log.info(
            "deal closed",
            extra={
                "deal": deal_id,
                "expired": alone,
                "returned_to_client": int(event["returnedToClient"]),
                "stake_returned": int(event["stakeReturned"]),
                "tx": tx.tx_hash,
            },
        )
        return True

    def _work_left(self, book: DealBook, state: DealState, chain_now: int) -> bool:
        """Return whether a task not on chain can still be delivered or claimed."""
        for index, ack in book.acks.items():
            if book.on_chain(index):
                continue
            settle = settle_by(ack.request.deadline, state.expiry, state.challenge_window)
            if settle < chain_now:
                continue  # its settlement instant passed: nothing more to do for it
            record = book.receipts.get(index)
            if record is None or (record.on_time and ack.claimable):
                return True  # still running, or delivered and claimable (a claim failed)
        return False

    # ---- all ---------------------------------------------------------------------------

    def run_all(self, deals: Collection[int] | None = None) -> JobReport:
        """Run every job once, in order: discover, watch, redeem, claim, finalize, close.

        ``deals`` limits every job but the discovery to those deals.
        """
        with self._lock:
            try:
                discovered = self.discover_deals()
            except (ChainError, ValueError) as exc:
                self._failed("discover", 0, exc)
                discovered = []
            closed = self.watch_deals(deals)
            settled = self.settle_due(deals=deals)
            finalized = self.finalize_claims(deals)
            return JobReport(
                redeemed=settled.redeemed,
                claimed=settled.claimed,
                finalized=tuple(finalized),
                closed=(*closed, *self.close_deals(deals)),
                discovered=tuple(discovered),
            )

    # ---- scheduling --------------------------------------------------------------------

    def start(self, extra: Sequence[tuple[Callable[[], object], float]] = ()) -> None:
        """Run :meth:`run_all` every ``interval_s``, the first pass at once (plus ``extra``)."""
        scheduler = BackgroundScheduler(daemon=True)
        scheduler.add_job(
            self._safe_run_all,
            "interval",
            seconds=self.config.interval_s,
            max_instances=1,
            coalesce=True,
            id="settlement",
            next_run_time=datetime.datetime.now(datetime.UTC),
        )
        for i, (job, seconds) in enumerate(extra):
            scheduler.add_job(
                job, "interval", seconds=seconds, max_instances=1, coalesce=True, id=f"extra-{i}"
            )
        scheduler.add_listener(self._still_running, EVENT_JOB_MAX_INSTANCES)
        scheduler.start()
        self._scheduler = scheduler

    def _still_running(self, event: JobSubmissionEvent) -> None:
        """Say why a job was skipped: its previous run still waits on the chain."""
        if event.job_id != "settlement":
            return
        self.metrics.chain_stalls.inc()
        started = self._pass_started
        running = 0.0 if started is None else time.monotonic() - started
        log.warning(
            "settlement pass still running when the next was due: the chain answers slowly "
            "or not at all (stalled)",
            extra={
                "running_s": round(running, 1),
                "interval_s": self.config.interval_s,
                "rpc_url": self.escrow.tx.w3.provider.endpoint_uri,  # type: ignore[attr-defined]
            },
        )

    def _safe_run_all(self) -> None:
        self._pass_started = time.monotonic()
        try:
            self.run_all()
        except Exception:  # a job must never kill the scheduler thread
            log.exception("settlement pass failed")
        finally:
            took = time.monotonic() - self._pass_started
            self._pass_started = None
            self.metrics.settlement_pass_seconds.set(took)

    def stop(self) -> None:
        """Stop the scheduler (jobs in progress finish)."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
