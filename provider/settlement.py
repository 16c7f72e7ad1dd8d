"""Settlement jobs: redeem vouchers, claim from silent clients, finalize claims, watch expiry.

Each job is a plain method taking ``now`` (wall-clock seconds) so tests trigger it directly;
:meth:`SettlementJobs.start` runs :meth:`SettlementJobs.run_all` on an apscheduler
``BackgroundScheduler``. Every step journals what it did; a revert is logged and counted, and
the job moves on to the next deal.

Rules (thresholds from :class:`provider.config.SettlementConfig`):

- **redeem** the latest voucher when what it adds over the last redeemed one reaches
  ``redeem_threshold`` (one transaction pays every task it covers, so waiting makes gas per
  task fall), or when the oldest unredeemed voucher is ``redeem_max_age_s`` old, or when the
  deal nears expiry;
- **claim** delivered, unvouched, on-time receipts whose task finished ``silent_after_s`` ago
  with no voucher covering it (or at once when the deal nears expiry), in one batch per deal;
- **finalize** claimed batches once the chain's clock passes their challenge deadline;
- **watch** deals: journal claim batches the chain holds but the journal lost (a claim mined
  just before the daemon died), record deals closed on chain, and bring settlement forward
  when ``expiry - expiry_margin_s`` is reached (claims are refused after expiry + window);
- **close** deals the client agreed to close (``CloseAgreed``, seen as the deal's
  ``clientAgreedClose``) once every acked task is delivered, and deals past expiry plus the
  challenge window: first redeem the latest voucher, claim (early close only) and finalize
  what no voucher pays, then ``closeDeal``, so nothing owed is left behind.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from contracts.binding import (
    BATCH_PAID,
    BATCH_REJECTED,
    DEAL_CLOSED,
    DEAL_OPEN,
    TASK_NONE,
    TASK_REFUNDED,
    DealState,
    Escrow,
)
from contracts.errors import ChainError, ContractRevert
from contracts.hashing import keccak_text
from contracts.messages import Plan, Receipt
from contracts.reverts import EscrowStaleVoucher
from provider.config import SettlementConfig
from provider.deals import DealCache
from provider.errors import RejectedError
from provider.journal import DealBook, Journal, SettlementRecord
from provider.metrics import ProviderMetrics

log = logging.getLogger("provider.settlement")


@dataclass(frozen=True, slots=True)
class JobReport:
    """What one pass of the jobs did."""

    redeemed: tuple[SettlementRecord, ...] = ()
    claimed: tuple[SettlementRecord, ...] = ()
    finalized: tuple[SettlementRecord, ...] = ()
    closed: tuple[int, ...] = ()


_CLAIMED_TOPIC = keccak_text("ReceiptsClaimed(uint256,uint32,uint256,uint256,uint64)")
_TASK_INDEX_FIELD = [name for name, _ in Receipt.TYPES].index("taskIndex")


class SettlementJobs:
    """The provider's on-chain settlement, driven by the journal."""

    def __init__(
        self,
        *,
        private_key: str,
        escrow: Escrow,
        journal: Journal,
        deals: DealCache,
        config: SettlementConfig,
        metrics: ProviderMetrics,
        chain_time: Callable[[], int] | None = None,
    ) -> None:
        """Wire the jobs; ``chain_time`` returns the latest block's timestamp."""
        self._key = private_key
        self.escrow = escrow
        self.journal = journal
        self.deals = deals
        self.config = config
        self.metrics = metrics
        self._chain_time = chain_time or self._latest_block_time
        self._lock = threading.Lock()
        self._scheduler: BackgroundScheduler | None = None

    def _latest_block_time(self) -> int:
        return int(self.escrow.tx.w3.eth.get_block("latest")["timestamp"])

    # ---- helpers -----------------------------------------------------------------------

    def _unclosed(self) -> Iterator[tuple[int, DealBook, DealState]]:
        """Yield each deal the journal does not hold closed, with its state read afresh."""
        for deal_id, book in self.journal.iter_books():
            if book.closed():
                continue
            try:
                state = self.deals.get(deal_id, fresh=True)
            except RejectedError:
                continue
            yield deal_id, book, state

    def _open_deals(
        self, only: Collection[int] | None = None
    ) -> list[tuple[int, DealBook, DealState, Plan]]:
        out = []
        for deal_id, book in self.journal.iter_books():
            if book.closed() or not book.receipts or (only is not None and deal_id not in only):
                continue
            try:
                state = self.deals.get(deal_id)
            except RejectedError as exc:
                log.warning("cannot read deal", extra={"deal": deal_id, "error": exc.reason})
                continue
            plan = self.deals.plan_of(state)
            if plan is not None:
                out.append((deal_id, book, state, plan))
        return out

    def _near_expiry(self, state: DealState, chain_now: int) -> bool:
        return chain_now >= state.expiry - self.config.expiry_margin_s

    def _failed(self, action: str, deal_id: int, exc: Exception) -> None:
        self.metrics.settlement_failures.labels(action).inc()
        log.error(f"{action} failed", extra={"deal": deal_id, "error": str(exc)})

    # ---- jobs --------------------------------------------------------------------------

    def redeem_due(
        self,
        now: float | None = None,
        *,
        force: bool = False,
        deals: Collection[int] | None = None,
    ) -> list[SettlementRecord]:
        """Redeem each deal's latest voucher where the threshold or the age limit is reached.

        ``force`` redeems any increase; ``deals`` limits the pass to those deals.
        """
        now = time.time() if now is None else now
        done = []
        with self._lock:
            chain_now = self._chain_time()
            for deal_id, book, state, _ in self._open_deals(deals):
                latest = book.latest_voucher
                if latest is None:
                    continue
                redeemed = book.redeemed()
                base = 0 if redeemed is None else redeemed.voucher.cumulative_amount
                increase = latest.voucher.cumulative_amount - base
                if increase <= 0:
                    continue
                oldest = next(
                    v.received_at for v in book.vouchers if redeemed is None or v.seq > redeemed.seq
                )
                due = (
                    force
                    or increase >= self.config.redeem_threshold
                    or now - oldest >= self.config.redeem_max_age_s
                    or self._near_expiry(state, chain_now)
                )
                if not due:
                    continue
                try:
                    tx = self.escrow.redeem_voucher(self._key, latest.voucher, latest.signature)
                    paid = int(tx.event("VoucherRedeemed").args["paid"])
                    tx_hash: str | None = tx.tx_hash
                except EscrowStaleVoucher:
                    # Already redeemed (e.g. the daemon died after sending): the chain says so.
                    fresh = self.deals.get(deal_id, fresh=True)
                    if fresh.vouched < latest.voucher.cumulative_amount:
                        continue
                    paid, tx_hash = increase, None
                except (ContractRevert, ChainError) as exc:
                    self._failed("redeem", deal_id, exc)
                    continue
                record = self.journal.record_settlement(
                    deal_id,
                    "redeem",
                    {
                        "voucher_seq": latest.seq,
                        "cumulative": str(latest.voucher.cumulative_amount),
                        "paid": str(paid),
                    },
                    tx_hash,
                )
                self.deals.invalidate(deal_id)
                self.metrics.settlements.labels("redeem").inc()
                self.metrics.paid.inc(paid)
                log.info("voucher redeemed", extra={"deal": deal_id, "paid": paid})
                done.append(record)
        return done

    def claim_silent(
        self,
        now: float | None = None,
        *,
        force: bool = False,
        deals: Collection[int] | None = None,
    ) -> list[SettlementRecord]:
        """Claim delivered receipts that no voucher covered within ``silent_after_s``.

        ``force`` claims them at once; ``deals`` limits the pass to those deals.
        """
        now = time.time() if now is None else now
        done = []
        with self._lock:
            chain_now = self._chain_time()
            for deal_id, book, state, plan in self._open_deals(deals):
                if chain_now >= state.expiry + state.challenge_window:
                    continue  # the claim period is over
                urgent = force or self._near_expiry(state, chain_now)
                latest = book.latest_voucher
                claimed = book.claimed_tasks()
                candidates = [
                    r
                    for i, r in sorted(book.receipts.items())
                    if i not in claimed
                    and not (latest is not None and latest.voucher.covers(i))
                    and r.receipt.finished_at <= r.receipt.deadline
                    and r.receipt.amount > 0
                    and (urgent or now - r.receipt.finished_at >= self.config.silent_after_s)
                ][: self.config.claim_batch_max]
                if not candidates:
                    continue
                try:
                    statuses = self.escrow.read_many(
                        [("taskStatus", (deal_id, r.receipt.task_index)) for r in candidates]
                    )
                    candidates = [
                        r for r, s in zip(candidates, statuses, strict=True) if int(s) == TASK_NONE
                    ]
                    if not candidates:
                        continue
                    tx = self.escrow.claim_receipts(
                        self._key,
                        deal_id,
                        plan,
                        [r.receipt for r in candidates],
                        [r.signature for r in candidates],
                    )
                except (ContractRevert, ChainError) as exc:
                    self._failed("claim", deal_id, exc)
                    continue
                event = tx.event("ReceiptsClaimed").args
                record = self.journal.record_settlement(
                    deal_id,
                    "claim",
                    {
                        "batch_id": int(event["batchId"]),
                        "deadline": int(event["deadline"]),
                        "amount": str(int(event["amount"])),
                        "tasks": [r.receipt.task_index for r in candidates],
                    },
                    tx.tx_hash,
                )
                self.deals.invalidate(deal_id)
                self.metrics.settlements.labels("claim").inc()
                log.info("receipts claimed", extra={"deal": deal_id, "tasks": len(candidates)})
                done.append(record)
        return done

    def finalize_claims(self) -> list[SettlementRecord]:
        """Finalize every claimed batch whose challenge window has passed on chain."""
        done = []
        with self._lock:
            chain_now = self._chain_time()
            for deal_id, book in self.journal.iter_books():
                ended = {
                    int(s.data["batch_id"])
                    for s in book.settlements
                    if s.action in ("finalize", "rejected")
                }
                for claim in [s for s in book.settlements if s.action == "claim"]:
                    batch_id = int(claim.data["batch_id"])
                    if batch_id in ended or chain_now < int(claim.data["deadline"]):
                        continue
                    try:
                        tx = self.escrow.finalize_claim(self._key, deal_id, batch_id)
                        action, tx_hash = "finalize", tx.tx_hash
                    except (ContractRevert, ChainError) as exc:
                        try:
                            status = self.escrow.get_batch(deal_id, batch_id).status
                        except (ContractRevert, ChainError):
                            status = -1
                        if status == BATCH_PAID:
                            action, tx_hash = "finalize", None
                        elif status == BATCH_REJECTED:
                            action, tx_hash = "rejected", None
                        else:  # disputed: the arbiter rules; try again later
                            self._failed("finalize", deal_id, exc)
                            continue
                    record = self.journal.record_settlement(
                        deal_id,
                        action,
                        {"batch_id": batch_id, "amount": claim.data["amount"]},
                        tx_hash,
                    )
                    self.deals.invalidate(deal_id)
                    self.metrics.settlements.labels(action).inc()
                    if action == "finalize":
                        self.metrics.paid.inc(int(claim.data["amount"]))
                    done.append(record)
        return done

    def watch_deals(self) -> list[int]:
        """Journal claims lost before journaling; record deals closed on chain; return those."""
        closed = []
        with self._lock:
            for deal_id, book, state in self._unclosed():
                self._reconcile(deal_id, book, state)
                if state.status == DEAL_CLOSED:
                    self.journal.record_settlement(deal_id, "closed", {}, None)
                    self.metrics.settlements.labels("closed").inc()
                    closed.append(deal_id)
        return closed

    def reconcile_claims(self) -> list[SettlementRecord]:
        """Journal every claim batch the chain holds and the journal lacks (run at start)."""
        done = []
        with self._lock:
            for deal_id, book in self.journal.iter_books():
                if book.closed() or not book.receipts:
                    continue
                try:
                    state = self.deals.get(deal_id, fresh=True)
                except RejectedError:
                    continue
                done.extend(self._reconcile(deal_id, book, state))
        return done

    def _reconcile(self, deal_id: int, book: DealBook, state: DealState) -> list[SettlementRecord]:
        """Journal the deal's claim batches that exist on chain but not in the journal.

        A claim transaction mined just before the daemon died has no journal row: its tasks
        show as claimed on chain and its batch would never be finalized. The batch's
        ``ReceiptsClaimed`` event and its transaction's receipts say what it claimed.
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
        w3 = self.escrow.tx.w3
        logs = w3.eth.get_logs(
            {
                "address": self.escrow.address,
                "fromBlock": 0,
                "toBlock": "latest",
                "topics": [
                    "0x" + _CLAIMED_TOPIC.hex(),
                    "0x" + deal_id.to_bytes(32, "big").hex(),
                    "0x" + batch_id.to_bytes(32, "big").hex(),
                ],
            }
        )
        if not logs:
            return None
        log_entry = logs[0]
        event = self.escrow.decode_events([log_entry])[0].args
        tx = w3.eth.get_transaction(log_entry["transactionHash"])
        _, args = self.escrow.contract.decode_function_input(tx["input"])
        tasks = [
            int(r["taskIndex"] if isinstance(r, dict) else r[_TASK_INDEX_FIELD])
            for r in args["receipts"]
        ]
        data = {
            "batch_id": batch_id,
            "deadline": int(event["deadline"]),
            "amount": str(int(event["amount"])),
            "tasks": tasks,
            "reconciled": True,
        }
        return data, "0x" + bytes(log_entry["transactionHash"]).hex()

    def close_deals(self, now: float | None = None) -> list[int]:
        """Close deals the client agreed to close, and deals past expiry plus the window.

        Before closing: redeem the latest voucher; on an early close also claim what no
        voucher pays (the close then waits for those claims to finalize); finalize claims
        whose window passed. A deal with tasks still running, claims still pending or a
        voucher not yet redeemed is left for the next pass. Return the deals closed.
        """
        now = time.time() if now is None else now
        chain_now = self._chain_time()
        due: dict[int, bool] = {}  # deal -> past expiry + challenge window
        for deal_id, _, state in self._unclosed():
            ended = chain_now >= state.expiry + state.challenge_window
            if state.status == DEAL_OPEN and (state.client_agreed_close or ended):
                due[deal_id] = ended
        if not due:
            return []
        self.redeem_due(now, force=True, deals=due)
        self.claim_silent(now, force=True, deals=[d for d, ended in due.items() if not ended])
        self.finalize_claims()
        closed = []
        with self._lock:
            for deal_id, ended in due.items():
                if self._close(deal_id, ended):
                    closed.append(deal_id)
        return closed

    def _close(self, deal_id: int, ended: bool) -> bool:
        book = self.journal.deal(deal_id)
        if book is None or book.closed():
            return False
        if not ended and any(
            i not in book.receipts and self.escrow.task_status(deal_id, i) != TASK_REFUNDED
            for i in book.acks
        ):
            return False  # tasks still running (not refunded): their receipts may still be paid
        try:
            state = self.deals.get(deal_id, fresh=True)
        except RejectedError:
            return False
        latest = book.latest_voucher
        if state.pending or (
            latest is not None and state.vouched < latest.voucher.cumulative_amount
        ):
            return False  # claims in their window, or a voucher left to redeem: not yet
        try:
            tx = self.escrow.close_deal(self._key, deal_id)
            event = tx.event("DealClosed").args
        except (ContractRevert, ChainError, KeyError) as exc:
            self._failed("close", deal_id, exc)
            return False
        self.journal.record_settlement(
            deal_id,
            "closed",
            {
                "by": "provider",
                "returned_to_client": str(int(event["returnedToClient"])),
                "stake_returned": str(int(event["stakeReturned"])),
            },
            tx.tx_hash,
        )
        self.deals.invalidate(deal_id)
        self.metrics.settlements.labels("closed").inc()
        log.info("deal closed", extra={"deal": deal_id, "expired": ended})
        return True

    def run_all(self, now: float | None = None) -> JobReport:
        """Run every job once, in order: watch, redeem, claim, finalize, close."""
        closed = self.watch_deals()
        report = JobReport(
            redeemed=tuple(self.redeem_due(now)),
            claimed=tuple(self.claim_silent(now)),
            finalized=tuple(self.finalize_claims()),
        )
        return JobReport(
            redeemed=report.redeemed,
            claimed=report.claimed,
            finalized=report.finalized,
            closed=(*closed, *self.close_deals(now)),
        )

    # ---- scheduling --------------------------------------------------------------------

    def start(self, extra: Sequence[tuple[Callable[[], object], float]] = ()) -> None:
        """Run :meth:`run_all` every ``interval_s`` (plus ``extra`` jobs) in the background."""
        scheduler = BackgroundScheduler(daemon=True)
        scheduler.add_job(
            self._safe_run_all,
            "interval",
            seconds=self.config.interval_s,
            max_instances=1,
            coalesce=True,
            id="settlement",
        )
        for i, (job, seconds) in enumerate(extra):
            scheduler.add_job(
                job, "interval", seconds=seconds, max_instances=1, coalesce=True, id=f"extra-{i}"
            )
        scheduler.start()
        self._scheduler = scheduler

    def _safe_run_all(self) -> None:
        try:
            self.run_all()
        except Exception:  # a job must never kill the scheduler thread
            log.exception("settlement pass failed")

    def stop(self) -> None:
        """Stop the scheduler (jobs in progress finish)."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
