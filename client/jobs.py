"""A batch of tasks on one deal, read from files: plan it within the cap, run, pay, refund.

What ``tpumarket job run`` drives, usable from Python too. Tasks come from a program envelope
file (``contracts.program`` wire form, as ``tpumarket job export`` writes it) and, for
inference, one array file per task (safetensors or ``.npz``, tensors named by the program's
flat argument index). Before anything is sent, the batch is fitted under the spending cap at
each task's maximum price: the projected bill is known, a warning is given as it nears the
cap, and tasks that could take the deal past it are not sent. Every delivery is verified by
the :class:`~client.session.DealSession`; verified ones are paid by one cumulative voucher;
tasks acked but not verified are kept in the :class:`~client.ledger.DealLedger` and refunded
on chain (with the penalty) once their deadline and the challenge window have passed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from client.errors import ClientError, ProgramInputsError
from client.ledger import DealLedger, PendingAck
from client.session import DealSession, TaskOutcome, TaskSpec
from contracts.errors import ChainError, ContractRevert
from contracts.messages import KIND_COMPILE, KIND_INFERENCE, Plan, Voucher
from contracts.program import (
    Array,
    ArrayFormat,
    ProgramEnvelope,
    ProgramFormatError,
    decode_arrays,
    decode_envelope,
    encode_arrays,
)
from contracts.reverts import EscrowTaskAlreadySettled

LATE_GRACE_S = 5.0  # how long past its deadline a task's delivery is still awaited


class JobFileError(ClientError, ValueError):
    """A program or inputs file cannot be read or does not fit the program."""


@dataclass(frozen=True)
class JobTask:
    """One task of a batch: a label for the tables and what to submit."""

    label: str
    spec: TaskSpec


# ---- files ---------------------------------------------------------------------------------


def read_envelope(path: Path) -> ProgramEnvelope:
    """Read a program envelope file and check its hashes and sizes."""
    try:
        return decode_envelope(path.read_bytes())
    except (OSError, ProgramFormatError) as exc:
        raise JobFileError(f"{path}: not a readable program envelope: {exc}") from exc


def read_arrays(path: Path) -> dict[str, Array]:
    """Read a safetensors or ``.npz`` file (told apart by content, never unpickled)."""
    try:
        data = path.read_bytes()
        fmt = ArrayFormat.NPZ if data[:4] == b"PK\x03\x04" else ArrayFormat.SAFETENSORS
        return dict(decode_arrays(data, fmt))
    except (OSError, ProgramFormatError, ValueError) as exc:
        raise JobFileError(f"{path}: not a safetensors or npz file: {exc}") from exc


def inference_tasks(
    envelope: ProgramEnvelope, inputs: Sequence[Path], max_price: int
) -> list[JobTask]:
    """Return one inference task per inputs file (none given: the envelope's own inputs).

    Each file's tensors replace the envelope's inputs section; the weights section is kept
    byte for byte. Names must be flat argument indices not already given by the weights.
    """
    if not inputs:
        return [
            JobTask("inference (envelope inputs)", TaskSpec(KIND_INFERENCE, envelope, max_price))
        ]
    weight_names = (
        set(decode_arrays(envelope.weights, envelope.array_format)) if envelope.weights else set()
    )
    tasks = []
    for path in inputs:
        arrays = read_arrays(path)
        bad = sorted(n for n in arrays if not n.isdigit() or n in weight_names)
        if bad:
            raise JobFileError(
                f"{path}: tensors {bad} are not flat argument indices of program inputs "
                f"(weights hold {sorted(weight_names, key=int) or 'none'})"
            )
        try:
            encoded = encode_arrays(arrays, envelope.array_format)
            task_envelope = ProgramEnvelope.create(
                program=envelope.program,
                inputs=encoded,
                producer=envelope.producer,
                platforms=envelope.platforms,
                array_format=envelope.array_format,
                weights=envelope.weights,
            )
        except (ProgramFormatError, ValueError) as exc:
            raise ProgramInputsError(f"{path}: {exc}") from exc
        tasks.append(
            JobTask(f"inference {path.name}", TaskSpec(KIND_INFERENCE, task_envelope, max_price))
        )
    return tasks


def compile_tasks(
    envelope: ProgramEnvelope, targets: Sequence[str], max_price: int
) -> list[JobTask]:
    """Return one compile task per target (``local``, ``v5e:1x1`` ...)."""
    return [
        JobTask(f"compile for {t}", TaskSpec(KIND_COMPILE, envelope, max_price, t)) for t in targets
    ]


def default_max_price(plan: Plan, kind: int) -> int | None:
    """Return the most a task of ``kind`` can cost under ``plan``, or None if usage decides.

    Flat and outcome-based prices are known before the task runs (discounts only lower
    them); a metered plan charges by device time, so the caller must name a maximum.
    """
    if plan.price_per_device_ms:
        return None
    return plan.compile_price if kind == KIND_COMPILE else plan.inference_price


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
                f"the batch could cost {wanted}, past the cap {self.cap} "
                f"({self.owed} already owed): {len(self.skipped)} task(s) not sent"
            )
        if self.cap and self.projected >= self.warn_at * self.cap:
            return (
                f"projected bill {self.projected} is {self.projected / self.cap:.0%} "
                f"of the cap {self.cap}"
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
    skipped: bool = False

    @property
    def index(self) -> int | None:
        """Return the task's index in the deal, if it was submitted."""
        return self.outcome.index if self.outcome else None

    @property
    def state(self) -> str:
        """Return paid, failed: <category>, refunded, rejected, undelivered, error or skipped."""
        o = self.outcome
        if self.skipped:
            return "skipped"
        if o is None:
            return "error"
        if o.refunded is not None:
            return "refunded"
        if o.verified:
            diagnosis = o.view.diagnosis if o.view else None
            return f"failed: {diagnosis.get('category')}" if diagnosis else "paid"
        if o.view is not None and o.view.receipt is not None:
            return "rejected"
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
        if o is None:
            return self.error or ""
        if o.refunded is not None:
            return (
                f"refund {o.refunded[0]} + penalty {o.refunded[1]}; {o.rejected or 'no delivery'}"
            )
        if o.rejected:
            return o.rejected
        view = o.view
        if view is None or view.receipt is None:
            return "no delivery by the deadline"
        if view.diagnosis:
            return str(view.diagnosis.get("message") or "")[:100]
        if view.report:
            memory = view.report.get("memory_total_bytes")
            return f"compiled for {view.report.get('device_kind')}, memory {memory} B"
        try:
            arrays = decode_arrays(view.outputs or b"", ArrayFormat.SAFETENSORS)
        except ProgramFormatError:
            return "outputs verified"
        shapes = ", ".join(f"{k}:{tuple(a.shape)}" for k, a in sorted(arrays.items()))
        checked = ", spot-checked" if o.spot_checked else ""
        return f"outputs {shapes}{checked}"


Done = Callable[[TaskResult], None]


@dataclass
class JobRunner:
    """Run batches on one deal through its session, recording everything in its ledger."""

    session: DealSession
    ledger: DealLedger
    results: list[TaskResult] = field(default_factory=list)

    @classmethod
    def resume(cls, session: DealSession, ledger: DealLedger) -> JobRunner:
        """Continue the deal where the ledger left it: same voucher total, fresh indices."""
        session.book.restore(dict(ledger.paid), set(ledger.claimed), ledger.last_signed)
        session.next_index = ledger.next_index
        return cls(session, ledger)

    def run(
        self,
        plan: CapPlan,
        *,
        concurrency: int = 4,
        wait_s: float = 30.0,
        on_done: Done | None = None,
    ) -> list[TaskResult]:
        """Submit the plan's tasks (at most ``concurrency`` at once), verify, and record them."""
        first = self.ledger.reserve(len(plan.run))
        self.session.next_index = first
        results = [TaskResult(t) for t in plan.run]

        def one(result: TaskResult) -> TaskResult:
            try:
                result.outcome = self.session.submit(result.task.spec)
            except ClientError as exc:
                result.error = f"not accepted: {exc}"
            else:
                self._collect(result.outcome, wait_s)
            if on_done:
                on_done(result)
            return result

        try:
            with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
                list(pool.map(one, results))
        finally:
            self._record(results)
        skipped = [TaskResult(t, skipped=True) for t in plan.skipped]
        self.results += results + skipped
        return results + skipped

    def _collect(self, outcome: TaskOutcome, wait_s: float) -> None:
        """Long-poll for the delivery until it comes or its deadline (plus grace) is past."""
        assert outcome.ack is not None
        while True:
            try:
                self.session.collect(outcome, wait_s=wait_s)
            except ClientError as exc:  # unreachable provider, or paying it would pass the cap
                outcome.rejected = f"not paid: {exc}"
                return
            if outcome.view is not None and outcome.view.receipt is not None:
                return
            if time.time() > outcome.ack.deadline + LATE_GRACE_S:
                return

    def _record(self, results: Sequence[TaskResult]) -> None:
        book = self.session.book
        for r in results:
            o = r.outcome
            if o is not None and o.ack is not None and not o.verified:
                reason = o.rejected or "no delivery"
                self.ledger.pending[o.index] = PendingAck(o.ack, o.ack_signature, reason)
        self.ledger.paid = book.paid
        self.ledger.save()

    def pay(self) -> Voucher | None:
        """Sign the cumulative voucher for every verified task and hand it to the provider."""
        try:
            return self.session.pay()
        finally:
            self.ledger.last_signed = self.session.book.last_signed
            self.ledger.paid = self.session.book.paid
            self.ledger.save()

    def refund_due(self, chain_now: int) -> list[tuple[int, int, int]]:
        """Refund every pending task whose deadline and challenge window have passed.

        Return ``(task index, refund, penalty)`` for each refund. A task the provider
        already settled on chain (claimed) leaves the pending list as claimed; one the chain
        does not yet consider breached stays pending.
        """
        window = self.session.challenge_window
        done = []
        for index, pending in sorted(self.ledger.pending.items()):
            if chain_now <= pending.ack.deadline + window:
                continue
            try:
                refund, penalty = self.session.account.refund_breach(pending.ack, pending.signature)
            except EscrowTaskAlreadySettled:
                self.ledger.claimed.add(index)
                del self.ledger.pending[index]
                self.session.book.mark_claimed(index)
                continue
            except (ContractRevert, ChainError):
                continue  # not breached on chain yet (its clock is behind ours): try later
            del self.ledger.pending[index]
            self.ledger.refunded[index] = (refund, penalty)
            self.ledger.claimed.add(index)
            self.session.book.mark_claimed(index)
            for r in self.results:
                if r.outcome is not None and r.outcome.index == index:
                    r.outcome.refunded = (refund, penalty)
            done.append((index, refund, penalty))
            self.ledger.save()
        return done

    def next_refund_at(self) -> int | None:
        """Return the chain time after which the next pending task becomes refundable."""
        if not self.ledger.pending:
            return None
        window = self.session.challenge_window
        return min(p.ack.deadline for p in self.ledger.pending.values()) + window + 1


def save_outputs(results: Sequence[TaskResult], out_dir: Path) -> list[Path]:
    """Write each verified task's delivery: ``task-<i>.safetensors`` or ``task-<i>.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        o = r.outcome
        if o is None or not o.verified or o.view is None or not o.view.outputs:
            continue
        is_json = bool(o.view.report or o.view.diagnosis)
        path = out_dir / f"task-{o.index}.{'json' if is_json else 'safetensors'}"
        if is_json:
            path.write_text(json.dumps(json.loads(o.view.outputs), indent=1, sort_keys=True))
        else:
            path.write_bytes(o.view.outputs)
        written.append(path)
    return written
