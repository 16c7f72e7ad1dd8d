"""What a job runner does after a batch: pay, refresh, refund, watch claims, report status.

:class:`BatchSettlement` is the part of :class:`client.jobs.JobRunner` that acts on the deal
once tasks are resolved; the runner holds the session, the ledger and the lock it uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from client.deal_refunds import settle_breach
from client.errors import ProviderRejected, ProviderUnavailable
from client.job_records import view_fields
from client.job_refresh import refresh_task
from client.ledger import DealLedger
from client.ledger_records import ChainState, TaskRecord, TaskState
from client.session import DealSession
from client.tasks import settle_by
from client.watch import ClaimWatcher, Evidence, WatchReport
from contracts.messages import Voucher


class BatchSettlement:
    """Pay, refund and watch a deal's tasks as the ledger records them."""

    session: DealSession
    ledger: DealLedger
    say: Callable[[str], None] | None
    lowest_block: int
    evidence: Evidence | None
    voucher_error: str | None
    refunds_failed: dict[int, str]
    _in_flight: set[int]
    _lock: threading.Lock

    def _say(self, text: str) -> None:
        if self.say is not None:
            self.say(text)

    def _apply_chain(self, found: dict[int, ChainState]) -> None:
        for index, state in found.items():
            if index in self.ledger.tasks and self.ledger.tasks[index].chain != state:
                self.ledger.update(index, chain=state)

    def pay(self) -> Voucher | None:
        """Sign the cumulative voucher for every verified task and hand it to the provider.

        The book is reconciled with the chain first (tasks the provider claimed leave it);
        the voucher is recorded before it is handed over; a refused hand-over is retried once
        after reconciling again, and a failure is kept in ``voucher_error`` (the next run
        hands the voucher over again).
        """
        session, ledger = self.session, self.ledger
        self.voucher_error = None
        for attempt in (0, 1):
            self._apply_chain(session.payments.reconcile())
            floor = session.account.escrow.get_deal(session.deal_id).vouched
            signed = session.payments.sign_voucher(floor, resend=not ledger.voucher_delivered)
            if signed is None:
                return None
            voucher, signature = signed
            ledger.last_signed = voucher.cumulative_amount
            ledger.last_tasks = frozenset(session.book.last_tasks)
            ledger.voucher_delivered = False
            ledger.save()  # what was signed is on disk before it leaves
            try:
                session.provider.send_voucher(voucher, signature)
            except ProviderRejected as exc:
                self.voucher_error = f"voucher refused: {exc}"
                if exc.status >= 500 or attempt:
                    break
                continue  # reconcile with the chain and sign again
            except ProviderUnavailable as exc:
                self.voucher_error = f"voucher not handed over: {exc}"
                break
            ledger.voucher_delivered = True
            ledger.save()
            return voucher
        if self.voucher_error:
            self._say(self.voucher_error)
        return None

    def refresh(self, index: int) -> TaskRecord | None:
        """Ask the provider once more for a task's result; verify and record it (see
        ``client.job_refresh``). Return the task's record as it now stands."""
        return refresh_task(self.session, self.ledger, index)

    def refund_due(self, chain_now: int) -> list[tuple[int, int, int]]:
        """Refund every pending task whose settlement instant has passed on chain.

        Each is asked for once more first: a result that verifies is paid instead (by the
        next voucher). Return ``(task index, refund, penalty)`` for each refund. A task
        already settled on chain (claimed by the provider) leaves the pending list, and the
        ledger records it at once.
        """
        done = []
        with self._lock:
            in_flight = set(self._in_flight)
        for index, record in sorted(self.ledger.pending.items()):
            if index in in_flight or record.ack is None:
                continue
            outcome = self.session.outcomes.get(index)
            result = settle_breach(
                self.session,
                record.request,
                record.ack,
                record.ack_signature,
                chain_now,
                spec=outcome.spec if outcome else None,
            )
            if result.kind == "delivered" and result.view is not None:
                self.refresh(index)
            elif result.kind == "refunded" and result.refund is not None:
                refund, penalty = result.refund
                if result.view is not None:  # delivered, but it did not verify: say why
                    self.ledger.update(
                        index,
                        state=TaskState.REJECTED,
                        reason=result.detail,
                        **view_fields(self.ledger, index, result.view),
                    )
                    if outcome is not None:
                        outcome.view, outcome.rejected = result.view, result.detail
                self.ledger.update(index, chain=ChainState.REFUNDED, refund=result.refund)
                self.refunds_failed.pop(index, None)
                self.session.payments.mark_claimed(index)
                if outcome is not None:
                    outcome.refunded = result.refund
                done.append((index, refund, penalty))
            elif result.kind == "settled" and result.chain is not None:
                self.refunds_failed.pop(index, None)
                self.ledger.update(index, chain=result.chain)
                if result.chain != ChainState.VOUCHED:
                    self.session.payments.mark_claimed(index)
                if outcome is not None:
                    outcome.claimed = True
            elif result.kind == "failed":
                self.refunds_failed[index] = str(result.detail)
                self._say(f"task {index}: refund not sent yet ({result.detail})")
        self.ledger.save()
        return done

    def next_refund_at(self) -> int | None:
        """Return the chain time after which the next pending task becomes refundable."""
        pending = self.ledger.pending
        if not pending:
            return None
        _, expiry = self.session.terms()
        window = self.session.challenge_window
        return min(settle_by(p.request.deadline, expiry, window) for p in pending.values()) + 1

    def watch(self) -> WatchReport:
        """Read the deal's claims on chain; dispute those of work not delivered and verified."""
        watcher = ClaimWatcher(
            self.session.account,
            self.ledger,
            recheck=self.refresh,
            say=self.say,
            lowest_block=self.lowest_block,
            evidence=self.evidence,
        )
        report = watcher.scan()
        for index, record in self.ledger.tasks.items():
            if record.chain == ChainState.CLAIMED:
                self.session.payments.mark_claimed(index)
                outcome = self.session.outcomes.get(index)
                if outcome is not None and not outcome.verified:
                    outcome.claimed = True
        return report

    def status(self, *, fetch: bool = False) -> list[TaskRecord]:
        """Return every task of the deal with its on-chain state read afresh.

        With ``fetch``, the provider is asked for the results of tasks not yet verified
        (each is verified and recorded; payable ones join the voucher book).
        """
        indices = sorted(self.ledger.tasks)
        states = self.session.payments.chain_states(indices) if indices else {}
        if not self.ledger.read_only:
            self._apply_chain({i: s for i, s in states.items() if s is not None})
            if fetch:
                for index in indices:
                    record = self.ledger.tasks[index]
                    settled = record.chain in (ChainState.REFUNDED, ChainState.VOUCHED)
                    if record.state not in (TaskState.VERIFIED, TaskState.REFUSED) and not settled:
                        self.refresh(index)
            self.ledger.save()
        return [self.ledger.tasks[i] for i in indices]
