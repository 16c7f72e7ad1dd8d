"""The task service: accept signed tasks, ack them, run them in the sandbox, sign receipts.

A task's life: ``acked`` (journaled with its envelope, ack signed) → ``delivered`` (receipt
signed and journaled with the outputs, chained to the deal's previous receipt) → settled by a
voucher or a claim (see :mod:`provider.settlement`). The service raises
:class:`provider.errors.RejectedError` with a stable code for every refusal; the API maps codes
to HTTP statuses.

The service wires its parts and holds the deal lock under which an ack is priced against the
deal's budget and journaled: the checks before an ack (:mod:`provider.task_checks`), the
budget (:mod:`provider.deal_budget`), running and delivery (:mod:`provider.task_runner`), the
outputs kept in memory (:mod:`provider.output_memory`), vouchers
(:mod:`provider.voucher_desk`) and the signer (:mod:`provider.signing`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from contracts.messages import Ack, Domain, Plan, TaskRequest
from provider.config import ProviderConfig
from provider.counterparty import CounterpartyCode, chain_code
from provider.deal_budget import DealBudget
from provider.deals import DealCache
from provider.errors import NotFoundError
from provider.journal import AckRecord, Journal, Key, ReceiptRecord, VoucherRecord
from provider.lifecycle import TaskState
from provider.metrics import ProviderMetrics
from provider.output_memory import OutputMemory, output_memory_budget
from provider.receipts import ack_price
from provider.sandbox import Sandbox
from provider.signing import DomainSigner
from provider.task_checks import KIND_NAMES, CheckedRequest, TaskChecks
from provider.task_index import IndexOrder
from provider.task_runner import TaskFuture, TaskRunner
from provider.voucher_desk import VoucherDesk

log = logging.getLogger("provider.service")


@dataclass(frozen=True, slots=True)
class Submission:
    """The answer to a submission: the ack, and whether this call created it."""

    record: AckRecord
    created: bool


@dataclass(frozen=True, slots=True)
class TaskView:
    """Everything the API returns about one task."""

    ack: AckRecord
    receipt: ReceiptRecord | None
    outputs: bytes | None = None  # the delivered bytes, when still in memory

    @property
    def state(self) -> str:
        """Return ``acked`` until delivered, then ``succeeded`` or ``failed``."""
        if self.receipt is None:
            return TaskState.ACKED
        return str(self.receipt.detail.get("state", TaskState.FAILED))


class TaskService:
    """Accept, run and account for tasks of this provider's deals."""

    check_request: Callable[[str, str], CheckedRequest]
    """Parse a signed TaskRequest and check it is the deal's client's, for this provider
    (:meth:`provider.task_checks.TaskChecks.check_request`, bound: no call layer)."""

    def __init__(
        self,
        config: ProviderConfig,
        *,
        domain: Domain,
        journal: Journal,
        deals: DealCache,
        sandbox: Sandbox,
        metrics: ProviderMetrics,
        clock: Callable[[], float] = time.time,
        refresh_settled: Callable[[int], None] | None = None,
        counterparty: CounterpartyCode | None = None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        """Wire the service; :meth:`recover` re-runs what a previous process left unfinished.

        ``config`` is the provider's settings, read where each is used: the key, the SLO, the
        worker pool, the envelope cap, the output memory (``output_memory_bytes``, default
        :func:`provider.output_memory.output_memory_budget`) and ``settlement`` (which challenge
        windows the settlement jobs can meet). The rest are the parts it runs with: ``clock``
        is the daemon's time (:class:`provider.clock.ChainClock`); ``refresh_settled(deal)``
        reads the chain's settlement of a deal's overdue tasks before a budget refusal;
        ``counterparty`` judges the code of deals' clients (by default read through the deals'
        escrow, contract wallets refused). ``ready()`` says whether tasks can run now (the
        workers are up): before, a valid task is refused as ``overloaded`` rather than acked,
        since waiting for the workers could take it past its deadline.
        """
        self.config = config
        self._ready = ready
        self.address = config.address
        self.domain = domain
        self.journal = journal
        self.deals = deals
        self.sandbox = sandbox
        self.metrics = metrics
        self._clock = clock
        self._signer = DomainSigner(config.private_key, domain)
        self._acked = {k: metrics.tasks_acked.labels(name) for k, name in KIND_NAMES.items()}
        self._lock = threading.Lock()
        memory = config.output_memory_bytes
        self.outputs = OutputMemory(output_memory_budget() if memory is None else memory)
        journal.on_prune(self.outputs.discard)  # settled outputs leave memory with the journal
        self.checks = TaskChecks(
            address=self.address,
            domain=domain,
            deals=deals,
            sandbox=sandbox,
            signer=self._signer,
            slo_s=config.slo_s,
            settlement=config.settlement,
            max_envelope_bytes=config.max_envelope_bytes,
            metrics=metrics,
            counterparty=counterparty or CounterpartyCode(chain_code(deals.escrow.tx.w3)),
        )
        self.check_request = self.checks.check_request
        self.order = IndexOrder(self._acked_indexes)
        self.budget = DealBudget(
            journal=journal,
            deals=deals,
            reject=self.checks.reject,
            refresh_settled=refresh_settled,
        )
        self.runner = TaskRunner(
            journal=journal,
            sandbox=sandbox,
            signer=self._signer,
            outputs=self.outputs,
            metrics=metrics,
            workers=config.pool_size,
            clock=clock,
        )
        self.vouchers = VoucherDesk(
            address=self.address,
            domain=domain,
            journal=journal,
            deals=deals,
            budget=self.budget,
            task_lock=self._lock,
            metrics=metrics,
        )

    # ---- submission --------------------------------------------------------------------

    def submit(
        self,
        request_json: str,
        signature: str,
        target: str | None,
        envelope: bytes,
        *,
        defer_ack: bool = False,
        checked: CheckedRequest | None = None,
    ) -> Submission:
        """Check a signed task and its envelope; journal and sign an ack; start the task.

        Idempotent on (deal, task index), once the request is proven to be the deal client's:
        the same signed request gets the same ack back and never runs twice; a different
        request for a used index is refused (``task_index_used``). ``checked`` is what
        :meth:`check_request` returned for these headers (else it runs here).
        With ``defer_ack`` (the caller waits for the result before answering) the ack commits
        together with the receipt, unless :meth:`view` is called first: the caller must answer
        only from :meth:`view`, which makes the ack durable when the receipt is not there.
        """
        checks = self.checks
        if checked is None:
            checked = checks.check_request(request_json, signature)
        request, request_hash = checked.request, checked.request_hash
        sig, deal = checked.signature, checked.deal
        key = (request.deal_id, request.task_index)
        # Only now, the request proven to be the deal's client's: a repeat of it gets its
        # ack (and result) back; a stranger gets the same refusal for used and unused indexes.
        existing = self.journal.ack(key)
        if existing is not None:
            return self._existing(existing, request_hash)
        now = self._clock()
        plan = checks.check_terms(request, deal, now)
        decoded = checks.check_envelope(request, target, envelope)
        price = ack_price(plan, request)
        if price > request.max_price:
            raise checks.reject(
                "price_above_max", f"the plan charges {price}, above maxPrice {request.max_price}"
            )
        if not self._ready():
            raise checks.reject(
                "overloaded", "the daemon's workers are still starting: retry after Retry-After"
            )
        for attempt in (0, 1):
            with self._lock:
                existing = self.journal.ack(key)
                if existing is not None:
                    return self._existing(existing, request_hash)
                self.order.check(request, checks.reject)  # index n only once 0..n-1 are acked
                short = self.budget.short(request, deal, price, final=attempt == 1)
                if not short:
                    record = self._ack(request, sig, request_hash, target, price, now)
                    self.journal.record_ack(record, envelope, defer=defer_ack)
                    self.runner.start(record, plan, envelope, decoded)
                    break
            # Refunds the journal has not seen are in `committed` already: read the chain's
            # settlement of the deal's overdue tasks (outside the lock), then check again.
            self.budget.refresh(request.deal_id)
        self._acked[request.kind].inc()
        return Submission(record, created=True)

    def _acked_indexes(self, deal_id: int) -> dict[int, AckRecord]:
        book = self.journal.deal(deal_id)
        return {} if book is None else book.acks

    def _ack(
        self,
        request: TaskRequest,
        sig: bytes,
        request_hash: bytes,
        target: str | None,
        price: int,
        now: float,
    ) -> AckRecord:
        """Return the signed ack of an accepted request, as the journal records it."""
        ack = Ack(
            deal_id=request.deal_id,
            task_index=request.task_index,
            request_hash=request_hash,
            price=price,
        )
        return AckRecord(
            request=request,
            request_sig=sig,
            request_hash=request_hash,
            target=target,
            ack=ack,
            ack_sig=self._signer.sign(ack.struct_hash()),
            acked_at=now,
        )

    def _existing(self, existing: AckRecord, request_hash: bytes) -> Submission:
        if existing.request_hash != request_hash:
            raise self.checks.reject(
                "task_index_used",
                f"task {existing.ack.task_index} of deal {existing.ack.deal_id} was acked for "
                "another request",
            )
        self.metrics.tasks_retried.inc()
        return Submission(existing, created=False)

    # ---- running and results -----------------------------------------------------------

    def recover(self, plans: Callable[[int], Plan | None]) -> list[Key]:
        """Re-run every acked task without a receipt (after a crash); return their keys.

        ``plans`` gives a deal's plan. A re-run whose deadline passed still gets an honest
        receipt (``finishedAt`` after ``deadline``): the client may refuse it and ask for a
        breach refund, and the contract would refuse to pay a claim of it.
        """
        keys = []
        for record in self.journal.unfinished():
            plan = plans(record.ack.deal_id)
            if plan is None:
                log.error("no plan for an unfinished task", extra={"task": list(record.key)})
                continue
            with self._lock:
                self.runner.start(record, plan, self.journal.envelope(record.key))
            keys.append(record.key)
        if keys:
            log.info("re-running unfinished tasks", extra={"tasks": [list(k) for k in keys]})
        return keys

    def future(self, key: Key) -> TaskFuture | None:
        """Return the running task's future (a loop task for inference), if in flight."""
        return self.runner.inflight.get(key)

    def view(self, key: Key) -> TaskView:
        """Return the ack and (once delivered) the receipt of a task, to send to a client.

        An ack deferred by :meth:`submit` is committed here when the receipt is not there
        yet: an ack binds the provider once a client has it, so it is durable before.
        """
        ack = self.journal.ack(key)
        if ack is None:
            raise NotFoundError(f"no task {key[1]} in deal {key[0]}")
        receipt = self.journal.receipt(key)
        if receipt is None:
            self.journal.make_durable(key)
            receipt = self.journal.receipt(key)
        return TaskView(ack, receipt, None if receipt is None else self.outputs.get(key))

    def close(self) -> None:
        """Stop: drop queued tasks (journaled, so re-run on restart) and wait for running ones.

        Closing the sandbox first would turn running tasks into ``worker_crash`` receipts.
        """
        self.runner.close()

    # ---- vouchers ----------------------------------------------------------------------

    def accept_voucher(self, voucher_json: str, signature: str) -> tuple[VoucherRecord, bool]:
        """Verify and store a client's cumulative voucher; return it and whether it is new
        (:meth:`provider.voucher_desk.VoucherDesk.accept`)."""
        return self.vouchers.accept(voucher_json, signature)


__all__ = ["Submission", "TaskService", "TaskView"]
