"""Run acked tasks on the sandbox pool and deliver them: receipts signed, chained, journaled.

Compile tasks run on a thread pool (the sandbox call blocks); inference tasks submitted from
the event loop run on it as loop tasks (the loop talks to the worker itself: no thread hop).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeAlias

from contracts.errors import SignatureError
from contracts.messages import KIND_COMPILE, KIND_INFERENCE, Plan
from contracts.signing import recover_digest
from programs.envelope import ProgramEnvelope
from provider.errors import SandboxClosedError
from provider.journal import AckRecord, Journal, Key, ReceiptRecord
from provider.metrics import ProviderMetrics
from provider.output_memory import OutputMemory
from provider.receipts import build_receipt, delivery
from provider.sandbox import Sandbox
from provider.signing import DomainSigner
from provider.task_checks import KIND_NAMES

# The task service's logger: its lines and the filters on them stay as they were.
log = logging.getLogger("provider.service")
LATE_MARGIN_S = 1.0
"""Seconds past a task's deadline its worker may still run: a receipt finished then is late."""
MIN_BUDGET_S = 1.0
"""The least wall-clock time a task gets on a worker, however close its deadline."""
CLIENTS_REMEMBERED = 65_536
"""How many deals' clients the runner remembers (recovered once per deal)."""
TaskFuture: TypeAlias = Future[ReceiptRecord] | asyncio.Future[ReceiptRecord]
"""A running task: a pool future, or a loop task for inference."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class TaskRunner:
    """Run acked tasks in the sandbox and deliver their signed, journaled receipts."""

    def __init__(
        self,
        *,
        journal: Journal,
        sandbox: Sandbox,
        signer: DomainSigner,
        outputs: OutputMemory,
        metrics: ProviderMetrics,
        workers: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Run at most ``workers`` tasks at once on the pool; keep outputs in ``outputs``."""
        self.journal = journal
        self.sandbox = sandbox
        self.signer = signer
        self.outputs = outputs
        self.metrics = metrics
        self._clock = clock
        self.inflight: dict[Key, TaskFuture] = {}
        """The tasks running now, by key (a task leaves once it delivered)."""
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="task")
        self.closed = False
        self._clients: dict[int, str] = {}

    def client_of(self, record: AckRecord) -> str:
        """The deal's client, who signed the request (checked before the ack; cached per deal).

        Tasks are queued, cached and bounded per client (see :class:`Sandbox`).
        """
        deal = record.request.deal_id
        client = self._clients.get(deal)
        if client is None:
            try:
                digest = self.signer.digest(record.request_hash)
                client = recover_digest(digest, record.request_sig).lower()
            except SignatureError:  # a legacy record: the deal stands for its client
                client = f"deal:{deal}"
            if len(self._clients) >= CLIENTS_REMEMBERED:
                self._clients.clear()
            self._clients[deal] = client
        return client

    def budget_s(self, record: AckRecord) -> float:
        """The task's wall-clock budget on a worker: until a second past its deadline (at least
        a second).

        A worker still busy at the budget is killed and replaced: the overrun costs only
        this task, never another client's turn. The task is late by then: its receipt carries
        the real finish time, past the deadline, so it is never claimable and the client
        refunds it with the penalty (a breach is the provider's cost, not a billed failure).
        """
        late = float(record.request.deadline) + LATE_MARGIN_S
        return max(MIN_BUDGET_S, late - self._clock())

    def start(
        self,
        record: AckRecord,
        plan: Plan,
        envelope: bytes,
        decoded: ProgramEnvelope | None = None,
    ) -> None:
        """Start an acked task (hold the task service's lock)."""
        future: TaskFuture
        loop = _running_loop()
        if loop is not None and record.request.kind == KIND_INFERENCE:
            # On the event loop, which talks to the worker itself: no thread hop.
            future = loop.create_task(self._execute_async(record, plan, envelope, decoded))
        else:
            future = self._executor.submit(self._execute, record, plan, envelope, decoded)
        self.inflight[record.key] = future
        self.metrics.inflight.inc()
        future.add_done_callback(functools.partial(self._done, record.key))

    def _done(self, key: Key, future: TaskFuture) -> None:
        # Runs in the task thread, or at once in the submitting thread (which holds the task
        # service's lock) when the task already finished: so it must not take that lock.
        self.metrics.inflight.dec()
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            self.inflight.pop(key, None)
        elif not isinstance(error, SandboxClosedError):
            log.error(
                "task failed without a receipt", extra={"task": list(key), "error": str(error)}
            )

    def _execute(
        self, record: AckRecord, plan: Plan, envelope: bytes, decoded: ProgramEnvelope | None
    ) -> ReceiptRecord:
        request = record.request
        started = self._clock()
        client, budget = self.client_of(record), self.budget_s(record)
        if request.kind == KIND_COMPILE:
            outcome: Any = self.sandbox.compile(
                envelope, record.target or "local", client=client, budget_s=budget
            )
        else:
            outcome = self.sandbox.run(envelope, decoded=decoded, client=client, budget_s=budget)
        finished = self._clock()
        return self.deliver(record, plan, outcome, started, finished)

    async def _execute_async(
        self, record: AckRecord, plan: Plan, envelope: bytes, decoded: ProgramEnvelope | None
    ) -> ReceiptRecord:
        started = self._clock()
        outcome = await self.sandbox.run_async(
            envelope, decoded=decoded, client=self.client_of(record), budget_s=self.budget_s(record)
        )
        return self.deliver(record, plan, outcome, started, self._clock())

    def deliver(
        self, record: AckRecord, plan: Plan, outcome: Any, started: float, finished: float
    ) -> ReceiptRecord:
        """Sign the receipt of a finished task, chain it and journal it (with a deferred ack)."""
        request = record.request
        outputs, detail, status, device_ms, compile_ms, cache_hit = delivery(outcome)
        with self.journal.lock:
            receipt = build_receipt(
                plan,
                request,
                deadline=request.deadline,
                outputs=outputs,
                status=status,
                device_ms=device_ms,
                compile_ms=compile_ms,
                cache_hit=cache_hit,
                started_at=int(started),
                finished_at=int(finished),
                prev_receipt_hash=self.journal.next_prev_hash(request.deal_id),
            )
            receipt_hash = receipt.struct_hash()
            signature = self.signer.sign(receipt_hash)
            stored = self.journal.record_receipt(
                receipt, signature, outputs, detail, receipt_hash=receipt_hash
            )
        self.outputs.put(stored.key, outputs)
        kind = KIND_NAMES.get(request.kind, "other")
        self.metrics.tasks_delivered.labels(kind, detail["state"]).inc()
        self.metrics.task_seconds.labels(kind).observe(max(0.0, finished - record.acked_at))
        self.metrics.amount_receipted.inc(receipt.amount)
        return stored

    def close(self) -> None:
        """Drop queued tasks (journaled, so re-run on restart) and wait for running ones."""
        self.closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)


__all__ = ["TaskFuture", "TaskRunner"]
