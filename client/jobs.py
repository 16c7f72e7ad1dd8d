"""A batch of tasks on one deal, read from files: plan it within the cap, run, pay, refund.

What ``tpumarket job run`` drives, usable from Python too. Tasks come from a program envelope
file (``programs.envelope`` wire form, as ``tpumarket job export`` writes it) and, for
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
)
from client.job_results import TaskResult
from client.job_settle import BatchSettlement
from client.ledger import DealLedger
from client.ledger_records import OPEN_STATES, ChainState, TaskRecord, TaskState
from client.session import POLL_BACKOFF_S, DealSession
from client.tasks import TaskOutcome, TaskSpec
from client.watch import Evidence

HELD_BACK = "held back from vouchers: "
"""How the ledger's reason starts for a task kept out of every voucher (``hold_back``)."""

Done = Callable[[TaskResult], None]
Say = Callable[[str], None]


def held_back(ledger: DealLedger) -> set[int]:
    """Return the tasks of the deal held back from every voucher (``JobRunner.hold_back``)."""
    return {i for i, t in ledger.tasks.items() if (t.reason or "").startswith(HELD_BACK)}


@dataclass
class JobRunner(BatchSettlement):
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
    refunds_failed: dict[int, str] = field(default_factory=dict)  # due, not sent: task -> why
    _labels: dict[int, str] = field(default_factory=dict)
    _runs: dict[int, int] = field(default_factory=dict)
    _in_flight: set[int] = field(default_factory=set)
    _started: set[int] = field(default_factory=set)  # this run's tasks past the stop check
    _gate: threading.Lock = field(default_factory=threading.Lock)  # workers and Ctrl-C only
    _run: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def resume(
        cls, session: DealSession, ledger: DealLedger, *, say: Say | None = None
    ) -> JobRunner:
        """Continue the deal where the ledger left it: same voucher total, fresh indices."""
        held = held_back(ledger)
        session.payments.restore(
            {i: a for i, a in ledger.paid.items() if i not in held},
            ledger.settled_elsewhere | held,
            ledger.last_signed,
            ledger.last_tasks,
            vouched={i for i, t in ledger.tasks.items() if t.chain == ChainState.VOUCHED},
        )
        session.next_index = ledger.next_index
        runner = cls(session, ledger, say=say)
        session.on_update = runner._record
        return runner

    def hold_back(self, index: int, why: str) -> None:
        """Keep a verified task out of every voucher of the deal (say its replicas disagree):
        it leaves the voucher book, and the ledger records why, so a later run of the deal
        leaves it out too. The chain then settles it: the provider's claim, disputed and
        ruled, or the client's refund."""
        self.session.payments.mark_claimed(index)
        if index in self.ledger.tasks:
            self.ledger.update(index, reason=HELD_BACK + why)
            self.ledger.save()

    # ---- interruptions ----------------------------------------------------------------------

    def interrupt(self) -> int:
        """Handle one Ctrl-C: the first stops sending, the second stops waiting; return which.

        The first waits for a worker between its stop check and counting its task (a few
        instructions), so :meth:`in_flight` counts every task that still leaves after it.
        """
        with self._gate:
            if not self.stop_sending.is_set():
                self.stop_sending.set()
                return 1
        self.abandon.set()
        return 2

    def in_flight(self) -> int:
        """Return this run's tasks sent or being sent (resumed ones too), outcome unknown."""
        with self._gate:
            started = set(self._started)
        tasks = self.ledger.tasks
        return sum(1 for i in started if i not in tasks or tasks[i].state in OPEN_STATES)

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
                    with self._gate:
                        self._started.add(record.index)
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
        with self._gate:
            if self.stop_sending.is_set():
                result.interrupted = True
                return
            self._started.add(index)
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
