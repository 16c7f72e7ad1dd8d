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

import json
import math
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.amounts import tokens
from client.errors import (
    ClientError,
    DeliveryRejected,
    ProviderRejected,
    ProviderUnavailable,
)
from client.job_files import JobTask
from client.ledger import OPEN_STATES, ChainState, DealLedger, TaskRecord, TaskState
from client.provider_http import TaskView
from client.session import (
    POLL_BACKOFF_S,
    DealSession,
    TaskOutcome,
    TaskSpec,
    settle_by,
)
from client.watch import ClaimWatcher, WatchReport
from contracts.messages import TaskRequest, Voucher, task_bitmap
from contracts.program import (
    ArrayFormat,
    ProgramFormatError,
    decode_arrays,
)

# ---- the cap -------------------------------------------------------------------------------


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


# ---- running -------------------------------------------------------------------------------


@dataclass
class TaskResult:
    """What became of one task of the batch."""

    task: JobTask
    outcome: TaskOutcome | None = None
    error: str | None = None  # submission failed: nothing acked, nothing owed
    skipped: bool = False  # not sent: it could pass the cap
    interrupted: bool = False  # not sent: the run was interrupted first
    resumed: bool = False  # a crashed run's task with the same inputs, taken over

    @property
    def index(self) -> int | None:
        """Return the task's index in the deal, if it was submitted."""
        return self.outcome.index if self.outcome else None

    @property
    def state(self) -> str:
        """Return paid, failed: <category>, refunded, claimed, rejected, undelivered, pending,
        unknown, error, not sent or skipped."""
        o = self.outcome
        if self.skipped:
            return "skipped"
        if self.interrupted:
            return "not sent"
        if o is None:
            return "error"
        if o.refunded is not None:
            return "refunded"
        if o.verified:
            diagnosis = o.view.diagnosis if o.view else None
            return f"failed: {diagnosis.get('category')}" if diagnosis else "paid"
        if o.claimed:
            return "claimed"
        if o.ack is None:
            return "unknown"
        if o.view is not None and o.view.receipt is not None:
            return "rejected"
        if o.abandoned:
            return "pending"
        return "undelivered"

    @property
    def amount(self) -> int:
        """Return what the task costs this client (0 unless verified)."""
        o = self.outcome
        return o.view.receipt.amount if o and o.verified and o.view and o.view.receipt else 0

    def detail(self) -> str:
        """Return one line on the result: outputs, compile figures, diagnosis or reason."""
        o = self.outcome
        if self.skipped:
            return "not sent: it could take the deal past its cap"
        if self.interrupted:
            return "not sent: the run was interrupted"
        if o is None:
            return self.error or ""
        resumed = " (resumed)" if self.resumed else ""
        if o.refunded is not None:
            why = o.rejected or f"no delivery by the deadline {o.request.deadline}"
            return f"refund {o.refunded[0]} + penalty {o.refunded[1]}; {why}"
        if o.ack is None:
            return (o.rejected or "the provider's answer was lost") + "; see `job status`"
        if o.rejected:
            return o.rejected + resumed
        view = o.view
        if view is None or view.receipt is None:
            if o.abandoned:
                return f"awaited until the run stopped; deadline {o.request.deadline}"
            return f"no delivery by the deadline {o.request.deadline}"
        if view.diagnosis:
            return str(view.diagnosis.get("message") or "")[:100] + resumed
        if view.report:
            memory = view.report.get("memory_total_bytes")
            return f"compiled for {view.report.get('device_kind')}, memory {memory} B{resumed}"
        try:
            arrays = decode_arrays(view.outputs or b"", ArrayFormat.SAFETENSORS)
        except ProgramFormatError:
            return "outputs verified" + resumed
        shapes = ", ".join(f"{k}:{tuple(a.shape)}" for k, a in sorted(arrays.items()))
        checked = ", spot-checked" if o.spot_checked else ""
        return f"outputs {shapes}{checked}{resumed}"


Done = Callable[[TaskResult], None]
Say = Callable[[str], None]


def _key(request: TaskRequest) -> tuple[int, bytes, bytes, int]:
    """Return what identifies a task's work: same key, same inputs (a rerun's match)."""
    return (request.kind, request.program_hash, request.input_hash, request.max_price)


def _spec_key(spec: TaskSpec) -> tuple[int, bytes, bytes, int]:
    return (spec.kind, spec.envelope.program_sha256, spec.input_hash(), spec.max_price)


def view_of(ledger: DealLedger, record: TaskRecord) -> TaskView | None:
    """Return the provider's answer as the ledger kept it (None before the ack)."""
    if record.ack is None:
        return None
    return TaskView(
        state=record.result_state or "acked",
        ack=record.ack,
        ack_signature=record.ack_signature,
        receipt=record.receipt,
        receipt_signature=record.receipt_signature,
        outputs=ledger.outputs_of(record.index),
        report=record.report,
        diagnosis=record.diagnosis,
    )


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
        session.book.restore(
            ledger.paid, ledger.settled_elsewhere, ledger.last_signed, ledger.last_tasks
        )
        session.next_index = ledger.next_index
        session.confirmed_vouched = {
            i for i, t in ledger.tasks.items() if t.chain == ChainState.VOUCHED
        }
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
        index = outcome.index
        ledger = self.ledger
        with self._lock:
            run, label = self._runs.get(index, self._run), self._labels.get(index, "")
        known = ledger.tasks.get(index)
        if known is None or known.request != outcome.request:
            known = ledger.put(
                TaskRecord(
                    index=index,
                    run=run,
                    label=label or (known.label if known else ""),
                    request=outcome.request,
                    request_signature=outcome.request_signature,
                    target=outcome.spec.target,
                )
            )
        changes: dict[str, Any] = {}
        if outcome.ack is not None and known.ack is None:
            changes.update(
                state=TaskState.ACKED, ack=outcome.ack, ack_signature=outcome.ack_signature
            )
        view = outcome.view
        if outcome.verified and view is not None and known.state != TaskState.VERIFIED:
            changes.update(state=TaskState.VERIFIED, reason=None)
            changes.update(self._view_fields(index, view), spot_checked=outcome.spot_checked)
        elif (
            outcome.rejected
            and view is not None
            and view.receipt is not None
            and known.state != TaskState.VERIFIED
        ):
            changes.update(state=TaskState.REJECTED, reason=outcome.rejected)
            changes.update(self._view_fields(index, view))
        elif outcome.rejected and known.reason != outcome.rejected:
            changes.update(reason=outcome.rejected)
        if changes:
            ledger.update(index, **changes)

    def _view_fields(self, index: int, view: TaskView) -> dict[str, Any]:
        """Save a delivery's outputs (durably, first) and return the fields to record."""
        outputs = self.ledger.save_outputs(index, view.outputs) if view.outputs else None
        return {
            "receipt": view.receipt,
            "receipt_signature": view.receipt_signature,
            "outputs": outputs,
            "result_state": view.state,
            "report": view.report,
            "diagnosis": view.diagnosis,
        }

    def outcome_of(self, record: TaskRecord, spec: TaskSpec) -> TaskOutcome:
        """Rebuild a task's outcome from its ledger record (a resumed task)."""
        outcome = TaskOutcome(
            index=record.index,
            spec=spec,
            request=record.request,
            request_signature=record.request_signature,
            ack=record.ack,
            ack_signature=record.ack_signature,
            view=view_of(self.ledger, record),
            verified=record.state == TaskState.VERIFIED,
            rejected=record.reason,
            refunded=record.refund,
            spot_checked=record.spot_checked,
            claimed=record.chain == ChainState.CLAIMED,
        )
        with self.session._lock:
            self.session.outcomes[record.index] = outcome
        return outcome

    # ---- running ----------------------------------------------------------------------------

    def _resumable(self) -> dict[tuple[int, bytes, bytes, int], list[TaskRecord]]:
        """Return earlier tasks a rerun takes over, by inputs: those never resolved (sent or
        acked) and those a crashed run verified but did not finish."""
        unfinished = set(self.ledger.unfinished_runs()) - {self._run}
        found: dict[tuple[int, bytes, bytes, int], list[TaskRecord]] = {}
        for _, record in sorted(self.ledger.tasks.items()):
            if record.run == self._run or record.chain is not None:
                continue
            if record.state in OPEN_STATES or (
                record.state == TaskState.VERIFIED and record.run in unfinished
            ):
                found.setdefault(_key(record.request), []).append(record)
        return found

    def run(
        self,
        plan: CapPlan,
        *,
        concurrency: int = 4,
        wait_s: float = 30.0,
        on_done: Done | None = None,
    ) -> list[TaskResult]:
        """Submit the plan's tasks (at most ``concurrency`` at once), verify, and record them.

        Tasks whose inputs match unresolved tasks of an earlier, unfinished run are taken
        over instead of sent again. Return once every task is resolved, or at once after a
        second ``interrupt`` (whatever is in flight stays pending in the ledger).
        """
        self._run = self.ledger.start_run()
        earlier = set(self.ledger.unfinished_runs()) - {self._run}
        resumable = self._resumable()
        results = [TaskResult(t) for t in plan.run]
        fresh: list[TaskResult] = []
        adopted: list[tuple[TaskResult, TaskRecord]] = []
        for result in results:
            matches = resumable.get(_spec_key(result.task.spec))
            if matches:
                record = self.ledger.update(matches.pop(0).index, run=self._run)
                result.resumed = True
                adopted.append((result, record))
            else:
                fresh.append(result)
        first = self.ledger.reserve(len(fresh)) if fresh else self.ledger.next_index
        self.session.next_index = self.ledger.next_index
        work: queue.Queue[tuple[TaskResult, int | None, TaskRecord | None]] = queue.Queue()
        with self._lock:
            for offset, result in enumerate(fresh):
                self._labels[first + offset] = result.task.label
                self._runs[first + offset] = self._run
                work.put((result, first + offset, None))
            for result, record in adopted:
                self._labels[record.index] = result.task.label
                self._runs[record.index] = self._run
                work.put((result, None, record))
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
            for run in earlier:
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
                    self.ledger.update(outcome.index, state=TaskState.REFUSED, reason=str(exc))
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
            self._apply_chain(session.reconcile())
            floor = session.account.escrow.get_deal(session.deal_id).vouched
            with session._lock:
                if session.book.has_news(floor):
                    voucher, signature = session.book.sign_next(
                        session.domain, session.account.key, floor
                    )
                elif not ledger.voucher_delivered and session.book.last_signed > floor:
                    voucher = Voucher(
                        session.deal_id,
                        session.book.last_signed,
                        task_bitmap(session.book.last_tasks),
                    )
                    signature = voucher.sign(session.domain, session.account.key)
                else:
                    return None
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
        """Ask the provider once more for a task's result; verify and record it.

        A task never acked as far as the ledger knows gets its ack if the provider has one;
        a task the provider never got (404) is recorded as refused once its request can no
        longer be accepted. Return the task's record as it now stands.
        """
        record = self.ledger.tasks.get(index)
        if record is None or self.ledger.read_only:
            return record
        session = self.session
        try:
            view = session.provider.fetch(session.deal_id, index, wait_s=0)
        except ProviderRejected as exc:
            slo_ms, _ = session.terms()
            too_late = record.request.deadline < self.session.now() + math.ceil(slo_ms / 1000)
            if exc.status == 404 and record.state == TaskState.SENT and too_late:
                return self.ledger.update(
                    index, state=TaskState.REFUSED, reason="never reached the provider"
                )
            return record
        except ClientError:
            return record
        changes: dict[str, Any] = {}
        if record.ack is None:
            try:
                session.check_ack(record.request, view.ack, view.ack_signature)
            except DeliveryRejected as exc:
                return self.ledger.update(index, state=TaskState.REFUSED, reason=exc.reason)
            changes.update(state=TaskState.ACKED, ack=view.ack, ack_signature=view.ack_signature)
            record = self.ledger.update(index, **changes)
        if view.receipt is None or record.ack is None or record.state == TaskState.VERIFIED:
            return record
        try:
            receipt = session.verify_view(record.request, record.ack, view)
        except DeliveryRejected as exc:
            return self.ledger.update(
                index, state=TaskState.REJECTED, reason=exc.reason, **self._view_fields(index, view)
            )
        record = self.ledger.update(
            index, state=TaskState.VERIFIED, reason=None, **self._view_fields(index, view)
        )
        if record.payable and index not in session.book.paid:
            with session._lock:
                if index not in session.book.claimed:
                    session.book.add(receipt)
        outcome = session.outcomes.get(index)
        if outcome is not None and not outcome.verified:
            outcome.view, outcome.verified, outcome.rejected = view, True, None
        return record

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
            result = self.session.settle_breach(
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
                        **self._view_fields(index, result.view),
                    )
                    if outcome is not None:
                        outcome.view, outcome.rejected = result.view, result.detail
                self.ledger.update(index, chain=ChainState.REFUNDED, refund=result.refund)
                with self.session._lock:
                    self.session.book.mark_claimed(index)
                if outcome is not None:
                    outcome.refunded = result.refund
                done.append((index, refund, penalty))
            elif result.kind == "settled" and result.chain is not None:
                self.ledger.update(index, chain=result.chain)
                if result.chain != ChainState.VOUCHED:
                    with self.session._lock:
                        self.session.book.mark_claimed(index)
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
        )
        report = watcher.scan()
        for index, record in self.ledger.tasks.items():
            if record.chain == ChainState.CLAIMED:
                with self.session._lock:
                    self.session.book.mark_claimed(index)
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
        states = self.session.chain_states(indices) if indices else {}
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


def save_outputs(results: Sequence[TaskResult], out_dir: Path) -> list[Path]:
    """Write each verified task's delivery: ``task-<i>.safetensors`` or ``task-<i>.json``."""
    written = []
    for r in results:
        o = r.outcome
        if o is None or not o.verified or o.view is None or not o.view.outputs:
            continue
        written.append(write_output(out_dir, o.index, o.view))
    return written


def write_output(out_dir: Path, index: int, view: TaskView) -> Path:
    """Write one delivery into ``out_dir``; return the file's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    is_json = bool(view.report or view.diagnosis)
    path = out_dir / f"task-{index}.{'json' if is_json else 'safetensors'}"
    if is_json:
        path.write_text(json.dumps(json.loads(view.outputs or b"{}"), indent=1, sort_keys=True))
    else:
        path.write_bytes(view.outputs or b"")
    return path
