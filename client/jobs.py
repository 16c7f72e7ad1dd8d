"""A batch of tasks on one deal, read from files: plan it within the cap, run, pay, refund.

What ``tpumarket job run`` drives, usable from Python too. Tasks come from a program envelope
file (``contracts.program`` wire form, as ``tpumarket job export`` writes it) and, for
inference, one array file per task (safetensors or ``.npz``, tensors named by the program's
flat argument index). Before anything is sent, the batch is fitted under the spending cap at
each task's maximum price: the projected bill is known, a warning is given as it nears the
cap, and tasks that could take the deal past it are not sent. Every delivery is verified by
the :class:`~client.session.DealSession`; verified ones are paid by one cumulative voucher;
tasks acked but not verified are refunded on chain (with the penalty) once their settlement
instant has passed, after the provider is asked once more for the result. Everything reaches
the :class:`~client.ledger.DealLedger` as it happens: a rerun after a crash resumes the crashed
run's tasks (same inputs, same indices) instead of paying for them again, and the claims the
provider makes on chain are judged and disputed by the :class:`~client.watch.ClaimWatcher`.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from client.deal_refunds import settle_breach
from client.errors import (
    ClientError,
    DeliveryRejected,
    ProviderRejected,
    ProviderUnavailable,
)
from client.job_cap import CapPlan
from client.job_records import (
    free_indices,
    outcome_from,
    record_outcome,
    resumable_records,
    spec_key,
    view_fields,
)
from client.job_refresh import refresh_task
from client.job_results import TaskResult
from client.ledger import DealLedger
from client.ledger_records import OPEN_STATES, ChainState, TaskRecord, TaskState
from client.session import POLL_BACKOFF_S, DealSession
from client.tasks import TaskOutcome, TaskSpec, settle_by
from client.watch import ClaimWatcher, Evidence, WatchReport
from contracts.messages import Voucher

Done = Callable[[TaskResult], None]
Say = Callable[[str], None]


@dataclass
class JobRunner:
    """Run batches on one deal through its session, recording everything in its ledger.

    Every change of a task reaches the ledger as it happens (signed, acked, delivered), so a
    process killed at any point leaves a ledger a rerun can resume: a task with the same
    inputs that the crashed run had sent is collected (or resent, if the provider never got
    it), not paid for twice. ``interrupt`` implements Ctrl-C: the first stops sending and
    lets the tasks in flight finish (until each deadline plus the grace), the second stops
    waiting and leaves the rest pending in the ledger.
    """

    session: DealSession
    ledger: DealLedger
    results: list[TaskResult] = field(default_factory=list)
    say: Say | None = None
    lowest_block: int = 0
    evidence: Evidence | None = None  # hands disputed tasks' programs to the deal's arbiter
    stop_sending: threading.Event = field(default_factory=threading.Event)
    abandon: threading.Event = field(default_factory=threading.Event)
    voucher_error: str | None = None
    _labels: dict[int, str] = field(default_factory=dict)
    _runs: dict[int, int] = field(default_factory=dict)
    _in_flight: set[int] = field(default_factory=set)
    _run: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def resume(
        cls, session: DealSession, ledger: DealLedger, *, say: Say | None = None
    ) -> JobRunner:
        """Continue the deal where the ledger left it: same voucher total, fresh indices."""
        session.payments.restore(
            ledger.paid,
            ledger.settled_elsewhere,
            ledger.last_signed,
            ledger.last_tasks,
            vouched={i for i, t in ledger.tasks.items() if t.chain == ChainState.VOUCHED},
        )
        session.next_index = ledger.next_index
        runner = cls(session, ledger, say=say)
        session.on_update = runner._record
        return runner

    def _say(self, text: str) -> None:
        if self.say is not None:
            self.say(text)

    # ---- interruptions ----------------------------------------------------------------------

    def interrupt(self) -> int:
        """Handle one Ctrl-C: the first stops sending, the second stops waiting; return which."""
        if not self.stop_sending.is_set():
            self.stop_sending.set()
            return 1
        self.abandon.set()
        return 2

    # ---- recording --------------------------------------------------------------------------

    def _record(self, outcome: TaskOutcome) -> None:
        """Write a task's new state to the ledger (called by the session at each change)."""
        with self._lock:
            run, label = (
                self._runs.get(outcome.index, self._run),
                self._labels.get(outcome.index, ""),
            )
        record_outcome(self.ledger, outcome, run, label)

    def outcome_of(self, record: TaskRecord, spec: TaskSpec) -> TaskOutcome:
        """Rebuild a task's outcome from its ledger record (a resumed task)."""
        outcome = outcome_from(self.ledger, record, spec)
        self.session.track(outcome)
        return outcome

    # ---- running ----------------------------------------------------------------------------

    def run(
        self,
        plan: CapPlan,
        *,
        concurrency: int = 4,
        wait_s: float = 30.0,
        on_done: Done | None = None,
    ) -> list[TaskResult]:
        """Submit the plan's tasks (at most ``concurrency`` at once), verify, and record them.

        Tasks whose inputs match an earlier task that can still be delivered, paid or
        refunded (``client.job_records.resumable_records``) are taken over instead of sent
        again: the same inputs are never paid twice. Return once every task is resolved, or
        at once after a second ``interrupt`` (whatever is in flight stays pending).
        """
        self._run = self.ledger.start_run()
        earlier = set(self.ledger.unfinished_runs()) - {self._run}
        resumable = resumable_records(self.ledger, self._run)
        results = [TaskResult(t) for t in plan.run]
        fresh: list[TaskResult] = []
        adopted: list[tuple[TaskResult, TaskRecord]] = []
        for result in results:
            matches = resumable.get(spec_key(result.task.spec))
            if matches:
                record = self.ledger.update(matches.pop(0).index, run=self._run)
                result.resumed = True
                adopted.append((result, record))
            else:
                fresh.append(result)
        # Indices no provider acked come first (acks go in order, with no gap), then new ones.
        indices = free_indices(self.ledger)[: len(fresh)]
        if len(indices) < len(fresh):
            first = self.ledger.reserve(len(fresh) - len(indices))
            indices += range(first, self.ledger.next_index)
        self.session.next_index = self.ledger.next_index
        items: list[tuple[int, TaskResult, int | None, TaskRecord | None]]
        items = [(i, r, i, None) for i, r in zip(indices, fresh, strict=True)]
        items += [(rec.index, r, None, rec) for r, rec in adopted]
        work: queue.Queue[tuple[TaskResult, int | None, TaskRecord | None]] = queue.Queue()
        with self._lock:
            for index, result, new, held in sorted(items, key=lambda item: item[0]):
                self._labels[index] = result.task.label
                self._runs[index] = self._run
                work.put((result, new, held))
        left = [len(results)]
        finished = threading.Event()
        if not results:
            finished.set()

        def one(result: TaskResult, index: int | None, record: TaskRecord | None) -> None:
            try:
                if record is not None:
                    self._resume_task(result, record, wait_s)
                else:
                    assert index is not None
                    self._new_task(result, index, wait_s)
            except Exception as exc:  # a worker never dies silently: the task says why
                result.error = f"{type(exc).__name__}: {exc}"
            if on_done:
                on_done(result)

        def worker() -> None:
            while True:
                try:
                    item = work.get_nowait()
                except queue.Empty:
                    return
                if self.abandon.is_set():
                    return
                one(*item)
                with self._lock:
                    left[0] -= 1
                    if left[0] == 0:
                        finished.set()

        threads = [
            threading.Thread(target=worker, name=f"job-{i}", daemon=True)
            for i in range(max(1, min(concurrency, len(results))))
        ]
        for thread in threads:
            thread.start()
        while not finished.is_set() and not self.abandon.is_set():
            finished.wait(0.5)  # wakes for Ctrl-C handlers too
        self.ledger.save()
        skipped = [TaskResult(t, skipped=True) for t in plan.skipped]
        self.results += results + skipped
        if not self.abandon.is_set():
            for run in earlier:  # crashed runs whose tasks this run took over
                if not any(
                    t.run == run and t.state in OPEN_STATES for t in self.ledger.tasks.values()
                ):
                    self.ledger.finish_run(run)
        return results + skipped

    def finish(self) -> None:
        """Record that this run reached its report (a rerun will not take its tasks over)."""
        if self._run and not self.abandon.is_set():
            self.ledger.finish_run(self._run)

    def _new_task(self, result: TaskResult, index: int, wait_s: float) -> None:
        if self.stop_sending.is_set():
            result.interrupted = True
            return
        try:
            outcome = self.session.sign_request(index, result.task.spec)
        except ClientError as exc:
            result.error = f"not sent: {exc}"
            return
        result.outcome = outcome
        self._record(outcome)  # signed and stored before it leaves: a crash can resume it
        self._send(result, outcome)
        if outcome.ack is not None:
            self._await(outcome, wait_s)

    def _send(self, result: TaskResult, outcome: TaskOutcome) -> None:
        """Send a stored request; a lost answer is asked for again until the deadline."""
        pause = POLL_BACKOFF_S[0]
        while True:
            try:
                self.session.send(outcome)
                return
            except DeliveryRejected as exc:
                self.ledger.update(outcome.index, state=TaskState.REFUSED, reason=exc.reason)
                outcome.rejected = f"bad ack: {exc.reason}"
                result.error = outcome.rejected
                return
            except ProviderRejected as exc:
                if exc.status < 500:
                    self.ledger.update(
                        outcome.index, state=TaskState.REFUSED, reason=f"not accepted: {exc}"
                    )
                    result.error = f"not accepted: {exc}"
                    result.outcome = None
                    return
                problem = str(exc)
            except ProviderUnavailable as exc:
                problem = str(exc)
            # Unreachable: it may have acked before the connection broke. Ask until the
            # request can no longer be accepted (its deadline minus the SLO).
            slo_ms, _ = self.session.terms()
            if (
                self.session.now() > outcome.request.deadline - slo_ms / 1000
                or self.abandon.is_set()
            ):
                outcome.rejected = f"provider unreachable: {problem}"
                self.ledger.update(outcome.index, reason=outcome.rejected)
                return
            self.abandon.wait(pause)
            pause = min(pause * 2, POLL_BACKOFF_S[1])

    def _await(self, outcome: TaskOutcome, wait_s: float) -> None:
        with self._lock:
            self._in_flight.add(outcome.index)
        try:
            self.session.await_delivery(outcome, wait_s=wait_s, abandon=self.abandon)
        finally:
            with self._lock:
                self._in_flight.discard(outcome.index)
        record = self.ledger.tasks.get(outcome.index)
        if (
            not outcome.abandoned
            and record is not None
            and record.state == TaskState.ACKED
            and not outcome.verified
        ):
            self.ledger.update(outcome.index, state=TaskState.UNDELIVERED)

    def _resume_task(self, result: TaskResult, record: TaskRecord, wait_s: float) -> None:
        if record.state != TaskState.VERIFIED and record.chain in (
            ChainState.CLAIMED,
            ChainState.VOUCHED,
        ):
            # Paid on chain for these inputs (the provider claimed it): its result is fetched
            # and verified, never sent again nor paid by a voucher.
            record = self.refresh(record.index) or record
            result.outcome = self.outcome_of(record, result.task.spec)
            return
        outcome = self.outcome_of(record, result.task.spec)
        result.outcome = outcome
        if record.state == TaskState.VERIFIED:
            return
        if record.state == TaskState.SENT and not self._recover_sent(result, outcome):
            return
        self._await(outcome, wait_s)

    def _recover_sent(self, result: TaskResult, outcome: TaskOutcome) -> bool:
        """Find out whether the provider got a stored request; send it if not. Return acked?"""
        try:
            view = self.session.provider.fetch(self.session.deal_id, outcome.index, wait_s=0)
        except ProviderRejected as exc:
            if exc.status != 404:
                outcome.rejected = str(exc)
                return False
            view = None
        except ProviderUnavailable as exc:
            outcome.rejected = f"provider unreachable: {exc}"
            return False
        if view is not None:
            try:
                self.session.accept_ack(outcome, view)
            except DeliveryRejected as exc:
                outcome.rejected = exc.reason
                return False
            return True
        if self.stop_sending.is_set():
            result.interrupted = True
            self.ledger.update(outcome.index, state=TaskState.REFUSED, reason="never sent")
            return False
        slo_ms, _ = self.session.terms()
        if outcome.request.deadline < self.session.now() + math.ceil(slo_ms / 1000):
            # Too late for the stored request: the provider never had it, so a new request
            # (fresh deadline) at the same index replaces it.
            self.session.resign(outcome)
            self._record(outcome)
        self._send(result, outcome)
        return outcome.ack is not None

    # ---- after the batch --------------------------------------------------------------------

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
                self.session.payments.mark_claimed(index)
                if outcome is not None:
                    outcome.refunded = result.refund
                done.append((index, refund, penalty))
            elif result.kind == "settled" and result.chain is not None:
                self.ledger.update(index, chain=result.chain)
                if result.chain != ChainState.VOUCHED:
                    self.session.payments.mark_claimed(index)
                if outcome is not None:
                    outcome.claimed = True
            elif result.kind == "failed":
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
