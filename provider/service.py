"""The task service: accept signed tasks, ack them, run them in the sandbox, sign receipts.

A task's life: ``acked`` (journaled with its envelope, ack signed) → ``delivered`` (receipt
signed and journaled with the outputs, chained to the deal's previous receipt) → settled by a
voucher or a claim (see :mod:`provider.settlement`). The service raises
:class:`provider.errors.RejectedError` with a stable code for every refusal; the API maps codes
to HTTP statuses.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import coincurve

from contracts.binding import DEAL_OPEN, DealState
from contracts.errors import SignatureError
from contracts.hashing import keccak256
from contracts.messages import (
    KIND_COMPILE,
    KIND_INFERENCE,
    Ack,
    Domain,
    Plan,
    TaskRequest,
    Voucher,
    recover_digest,
)
from contracts.program import (
    ProgramEnvelope,
    ProgramFormatError,
    decode_envelope,
    request_input_hash,
)
from provider.config import SettlementConfig
from provider.deals import DealCache
from provider.errors import (
    ConfigError,
    NotFoundError,
    ProviderError,
    RejectedError,
    SandboxClosedError,
)
from provider.journal import AckRecord, DealBook, Journal, Key, ReceiptRecord, VoucherRecord
from provider.metrics import ProviderMetrics
from provider.receipts import (
    ack_price,
    build_receipt,
    cap_spent,
    delivery,
    voucher_reserve,
    voucher_tasks,
)
from provider.sandbox import Sandbox

log = logging.getLogger("provider.service")
_KIND_NAMES = {KIND_COMPILE: "compile", KIND_INFERENCE: "inference"}
OUTPUT_MEMORY_BYTES = 256 * 1024 * 1024
"""The default byte budget of delivered outputs kept in memory (see :class:`OutputMemory`)."""
OUTPUT_MEMORY_ENV = "TPUMARKET_PROVIDER_OUTPUT_MEMORY_BYTES"
"""Environment variable that sets the budget in bytes (0 keeps none in memory)."""
MAX_JSON_DEPTH = 16
"""The deepest JSON nesting a request header or voucher may have (they need 2)."""
MAX_VOUCHER_WORDS = 256
"""The most uint256 words of a voucher's task bitmap (65,536 task indexes)."""
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


@dataclass(frozen=True, slots=True)
class Submission:
    """The answer to a submission: the ack, and whether this call created it."""

    record: AckRecord
    created: bool


@dataclass(frozen=True, slots=True)
class CheckedRequest:
    """A TaskRequest proven to be its deal client's (:meth:`TaskService.check_request`)."""

    request: TaskRequest
    request_hash: bytes
    signature: bytes
    deal: DealState


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
            return "acked"
        return str(self.receipt.detail.get("state", "failed"))


class OutputMemory:
    """Delivered outputs kept in memory for the answers that follow, within a byte budget.

    Every delivered output is journaled (on disk, in the data dir) with its receipt; this keeps
    the most recent ones in memory so the answer to ``wait=`` and the first fetch skip the
    journal. Oldest first out once the budget (or ``max_items``) is full; an output larger than
    a quarter of the budget is never kept (it is read back from the journal). Thread-safe.
    """

    def __init__(self, budget_bytes: int, max_items: int = 4096) -> None:
        """Keep at most ``budget_bytes`` of outputs (0: none) of at most ``max_items`` tasks."""
        if budget_bytes < 0:
            raise ValueError(f"the output memory budget must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.max_items = max_items
        self.held_bytes = 0
        self.evicted = 0
        self.not_kept = 0
        self._items: OrderedDict[Key, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: Key, outputs: bytes) -> bool:
        """Keep ``outputs`` of task ``key`` if they fit; return whether they are kept."""
        size = len(outputs)
        with self._lock:
            if size * 4 > self.budget_bytes:
                self.not_kept += 1
                return False
            old = self._items.pop(key, None)
            self.held_bytes -= 0 if old is None else len(old)
            self._items[key] = outputs
            self.held_bytes += size
            while self.held_bytes > self.budget_bytes or len(self._items) > self.max_items:
                _, dropped = self._items.popitem(last=False)
                self.held_bytes -= len(dropped)
                self.evicted += 1
            return True

    def get(self, key: Key) -> bytes | None:
        """Return the outputs of task ``key`` if they are in memory."""
        with self._lock:
            return self._items.get(key)

    def __len__(self) -> int:
        """Return how many outputs are in memory."""
        return len(self._items)


def output_memory_budget(default: int = OUTPUT_MEMORY_BYTES) -> int:
    """Return the output memory budget: :data:`OUTPUT_MEMORY_ENV` when set, else ``default``."""
    text = os.environ.get(OUTPUT_MEMORY_ENV, "").strip()
    if not text:
        return default
    try:
        budget = int(text)
    except ValueError as exc:
        raise ConfigError(f"{OUTPUT_MEMORY_ENV} must be a number of bytes, got {text!r}") from exc
    if budget < 0:
        raise ConfigError(f"{OUTPUT_MEMORY_ENV} must be >= 0, got {budget}")
    return budget


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def parse_signature(text: str) -> bytes:
    """Parse a 0x-hex 65-byte signature; raise RejectedError(bad_request) otherwise."""
    try:
        raw = bytes.fromhex(text.strip().removeprefix("0x"))
    except ValueError as exc:
        raise RejectedError("bad_request", "signature is not hex") from exc
    if len(raw) != 65:
        raise RejectedError("bad_request", f"signature must be 65 bytes, got {len(raw)}")
    return raw


class TaskService:
    """Accept, run and account for tasks of this provider's deals."""

    def __init__(
        self,
        *,
        private_key: str,
        address: str,
        domain: Domain,
        journal: Journal,
        deals: DealCache,
        sandbox: Sandbox,
        slo_s: int,
        workers: int,
        metrics: ProviderMetrics,
        settlement: SettlementConfig | None = None,
        max_envelope_bytes: int = 256 * 1024 * 1024,
        clock: Callable[[], float] = time.time,
        refresh_settled: Callable[[int], None] | None = None,
        output_memory_bytes: int | None = None,
    ) -> None:
        """Wire the service; :meth:`recover` re-runs what a previous process left unfinished.

        ``clock`` is the daemon's time (:class:`provider.clock.ChainClock`); ``settlement``
        says which challenge windows the settlement jobs can meet; ``refresh_settled(deal)``
        reads the chain's settlement of a deal's overdue tasks before a budget refusal.
        ``output_memory_bytes`` bounds the delivered outputs kept in memory (default:
        :func:`output_memory_budget`).
        """
        self._signer = coincurve.PrivateKey(bytes.fromhex(private_key.removeprefix("0x")))
        self.address = address
        self.domain = domain
        self.journal = journal
        self.deals = deals
        self.sandbox = sandbox
        self.slo_s = slo_s
        self.metrics = metrics
        self.settlement = settlement or SettlementConfig()
        self._refresh_settled = refresh_settled
        self.max_envelope_bytes = max_envelope_bytes
        self._clock = clock
        self._separator = domain.separator()
        self._acked = {k: metrics.tasks_acked.labels(name) for k, name in _KIND_NAMES.items()}
        self._lock = threading.Lock()
        self._inflight: dict[Key, Future[ReceiptRecord] | asyncio.Future[ReceiptRecord]] = {}
        # deal -> ((settlement rows, voucher rows), spent + voucher reserve): see _cap_free
        self._cap_cache: dict[int, tuple[tuple[int, int], int]] = {}
        self.outputs = OutputMemory(
            output_memory_budget() if output_memory_bytes is None else output_memory_bytes
        )
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="task")
        self._closed = False

    # ---- submission --------------------------------------------------------------------

    def check_request(self, request_json: str, signature: str) -> CheckedRequest:
        """Parse a signed TaskRequest and check it is the deal's client's, for this provider.

        Cheap (no envelope needed): the API runs it before it reads a task's body, so a
        stranger's upload is refused before a byte of it is read.
        """
        request, request_hash = self._parse_request(request_json)
        sig = parse_signature(signature)
        deal = self.deals.get(request.deal_id)
        if deal.provider.lower() != self.address.lower():
            raise self._reject(
                "deal_not_ours", f"deal {request.deal_id} names provider {deal.provider}"
            )
        try:
            signer = recover_digest(self._digest(request_hash), sig)
        except SignatureError as exc:
            raise self._reject("signature_invalid", str(exc)) from exc
        if signer.lower() != deal.client.lower():
            raise self._reject(
                "signature_invalid",
                f"TaskRequest signed by {signer}, but deal {request.deal_id}'s client is "
                f"{deal.client} (forged, or signed for another deal, chain or escrow "
                f"than chain {self.domain.chain_id} escrow {self.domain.verifying_contract})",
            )
        return CheckedRequest(request, request_hash, sig, deal)

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
        if checked is None:
            checked = self.check_request(request_json, signature)
        request, request_hash = checked.request, checked.request_hash
        sig, deal = checked.signature, checked.deal
        key = (request.deal_id, request.task_index)
        # Only now, the request proven to be the deal's client's: a repeat of it gets its
        # ack (and result) back; a stranger gets the same refusal for used and unused indexes.
        existing = self.journal.ack(key)
        if existing is not None:
            return self._existing(existing, request_hash)
        if deal.status != DEAL_OPEN:
            raise self._reject("deal_not_open", f"deal {request.deal_id} is closed")
        now = self._clock()
        if now >= deal.expiry:
            raise self._reject("deal_expired", f"deal {request.deal_id} expired at {deal.expiry}")
        problem = self.settlement.window_problem(deal.challenge_window)
        if problem is not None:
            raise self._reject("window_too_short", f"deal {request.deal_id}: {problem}")
        self._check_deadline(request, deal.expiry, now)
        plan = self.deals.plan_of(deal)
        if plan is None:
            raise self._reject(
                "unknown_plan", f"deal {request.deal_id} uses a plan this provider never quoted"
            )
        decoded = self._check_envelope(request, target, envelope)
        price = ack_price(plan, request)
        if price > request.max_price:
            raise self._reject(
                "price_above_max", f"the plan charges {price}, above maxPrice {request.max_price}"
            )
        for attempt in (0, 1):
            with self._lock:
                existing = self.journal.ack(key)
                if existing is not None:
                    return self._existing(existing, request_hash)
                short = self._budget_short(request, deal, price, final=attempt == 1)
                if not short:
                    record = self._ack(request, sig, request_hash, target, price, now)
                    self.journal.record_ack(record, envelope, defer=defer_ack)
                    self._start(record, plan, envelope, decoded)
                    break
            # Refunds the journal has not seen are in `committed` already: read the chain's
            # settlement of the deal's overdue tasks (outside the lock), then check again.
            self._refresh(request.deal_id)
        self._acked[request.kind].inc()
        return Submission(record, created=True)

    def _budget_short(
        self, request: TaskRequest, deal: DealState, price: int, *, final: bool
    ) -> bool:
        """Return whether the deal's budget may be short only for refunds the journal has not
        seen (worth a refresh); raise ``insufficient_budget`` when it is short for sure."""
        book = self.journal.deal(request.deal_id)
        unpaid = 0 if book is None else book.unpaid_ack_total()
        # The cap must keep every acked task payable, a tip of the latest voucher counted
        # (provider.receipts.cap_free): the journal's view, which a refresh cannot change.
        free = self._cap_free(request.deal_id, book, deal)
        if free < price:
            raise self._reject(
                "insufficient_budget",
                f"deal {request.deal_id} keeps {max(free, 0)} of its cap {deal.max_spend} free "
                f"once its acked tasks and vouchers are set aside; this task needs {price}",
            )
        available = deal.max_spend - deal.committed - deal.pending
        if available >= request.max_price and available - unpaid >= price:
            return False
        if (
            final
            or book is None
            or self._refresh_settled is None
            or (available < request.max_price)
        ):
            raise self._reject(
                "insufficient_budget",
                f"deal {request.deal_id} has {available} left with {unpaid} acked but "
                f"unpaid; this task needs {price} (maxPrice {request.max_price})",
            )
        return True

    def _cap_free(
        self,
        deal_id: int,
        book: DealBook | None,
        deal: DealState,
        voucher: Voucher | None = None,
    ) -> int:
        """Return what the deal's cap keeps free once every acked task not settled, what the
        chain spent and the tip of ``voucher`` (by default the latest accepted one) are set
        aside (:func:`provider.receipts.cap_free`). Cached per deal until a settlement or a
        voucher is journaled, so the task path stays O(1)."""
        if book is None:
            return deal.max_spend - self._reservation_fee(deal)
        if voucher is not None:
            held = cap_spent(book, self._reservation_fee(deal)) + voucher_reserve(book, voucher)
        else:
            key = (len(book.settlements), len(book.vouchers))
            cached = self._cap_cache.get(deal_id)
            if cached is not None and cached[0] == key:
                held = cached[1]
            else:
                latest = book.latest_voucher
                held = cap_spent(book, self._reservation_fee(deal)) + voucher_reserve(
                    book, None if latest is None else latest.voucher
                )
                self._cap_cache[deal_id] = (key, held)
        return deal.max_spend - held - book.unpaid_ack_total()

    def _reservation_fee(self, deal: DealState) -> int:
        """Return the fee the deal's opening took from its cap (its committed amount then)."""
        plan = self.deals.plan_of(deal)
        return deal.committed if plan is None else plan.reservation_fee

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
            ack_sig=self._sign(ack.struct_hash()),
            acked_at=now,
        )

    def _check_deadline(self, request: TaskRequest, expiry: int, now: float) -> None:
        """Refuse a deadline this provider cannot meet, or one past the deal's expiry."""
        if request.deadline < now + self.slo_s:
            raise self._reject(
                "deadline_too_soon",
                f"deadline {request.deadline} is {request.deadline - now:.1f} s away; this "
                f"provider needs at least its SLO of {self.slo_s} s (set deadline = now + "
                f"{self.slo_s} + a few seconds of slack)",
            )
        if request.deadline > expiry:
            raise self._reject(
                "deadline_after_expiry",
                f"deadline {request.deadline} is after deal {request.deal_id}'s expiry {expiry}",
            )

    def _refresh(self, deal_id: int) -> None:
        """Read the chain's state of a deal's tasks past their settlement instant."""
        if self._refresh_settled is None:
            return
        try:
            self._refresh_settled(deal_id)
        except ProviderError as exc:
            log.warning("cannot refresh settled tasks", extra={"deal": deal_id, "error": str(exc)})

    def _digest(self, struct_hash: bytes) -> bytes:
        """Return the EIP-712 digest of a struct hash under our domain (separator cached)."""
        return keccak256(b"\x19\x01" + self._separator + struct_hash)

    def _sign(self, struct_hash: bytes) -> bytes:
        """Sign a struct hash under our domain: r||s||v, low s, v in {27, 28}."""
        raw = self._signer.sign_recoverable(self._digest(struct_hash), hasher=None)
        return raw[:64] + bytes([raw[64] + 27])

    def _reject(self, code: str, reason: str) -> RejectedError:
        self.metrics.tasks_rejected.labels(code).inc()
        log.info("task rejected", extra={"code": code, "reason": reason})
        return RejectedError(code, reason)

    def _parse_request(self, request_json: str) -> tuple[TaskRequest, bytes]:
        """Parse a TaskRequest header and hash it; any malformed or out-of-range one is a 400."""
        try:
            if json_depth(request_json) > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH}")
            request = TaskRequest.from_json(json.loads(request_json))
            if not 0 <= request.deal_id < 2**256 or not 0 <= request.task_index < 2**32:
                raise ValueError("dealId or taskIndex out of range")
            return request, request.struct_hash()
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise self._reject("bad_request", f"malformed TaskRequest: {_short(exc)}") from exc

    def _existing(self, existing: AckRecord, request_hash: bytes) -> Submission:
        if existing.request_hash != request_hash:
            raise self._reject(
                "task_index_used",
                f"task {existing.ack.task_index} of deal {existing.ack.deal_id} was acked for "
                "another request",
            )
        self.metrics.tasks_retried.inc()
        return Submission(existing, created=False)

    def _check_envelope(
        self, request: TaskRequest, target: str | None, data: bytes
    ) -> ProgramEnvelope:
        if request.kind not in _KIND_NAMES:
            raise self._reject("bad_request", f"unknown task kind {request.kind}")
        if request.kind == KIND_COMPILE and target is None:
            raise self._reject("bad_request", "a compile task needs a target header")
        if request.kind == KIND_INFERENCE and target is not None:
            raise self._reject("bad_request", "an inference task takes no target")
        refusal = None if target is None else self.sandbox.target_refusal(target)
        if refusal is not None:  # refused before the ack: nothing is billed
            raise self._reject("target_unsupported", refusal)
        if len(data) > self.max_envelope_bytes:
            raise self._reject(
                "envelope_too_large", f"{len(data)} bytes, cap {self.max_envelope_bytes}"
            )
        try:
            envelope = decode_envelope(data, max_bytes=self.max_envelope_bytes)
            input_hash = request_input_hash(request.kind, envelope, target)
        except ProgramFormatError as exc:
            raise self._reject("envelope_malformed", str(exc)) from exc
        if envelope.program_sha256 != request.program_hash:
            raise self._reject(
                "hash_mismatch", "programHash of the request differs from the envelope's program"
            )
        if input_hash != request.input_hash:
            raise self._reject(
                "hash_mismatch",
                "inputHash of the request differs from the envelope's inputs"
                + (f" bound to target {target!r}" if target is not None else ""),
            )
        return envelope

    # ---- execution ---------------------------------------------------------------------

    def _start(
        self,
        record: AckRecord,
        plan: Plan,
        envelope: bytes,
        decoded: ProgramEnvelope | None = None,
    ) -> None:
        future: Future[ReceiptRecord] | asyncio.Future[ReceiptRecord]
        loop = _running_loop()
        if loop is not None and record.request.kind == KIND_INFERENCE:
            # On the event loop, which talks to the worker itself: no thread hop.
            future = loop.create_task(self._execute_async(record, plan, envelope, decoded))
        else:
            future = self._executor.submit(self._execute, record, plan, envelope, decoded)
        self._inflight[record.key] = future
        self.metrics.inflight.inc()
        future.add_done_callback(functools.partial(self._done, record.key))

    def _done(
        self, key: Key, future: Future[ReceiptRecord] | asyncio.Future[ReceiptRecord]
    ) -> None:
        # Runs in the task thread, or at once in the submitting thread (which holds
        # self._lock) when the task already finished: so it must not take self._lock.
        self.metrics.inflight.dec()
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            self._inflight.pop(key, None)
        elif not isinstance(error, SandboxClosedError):
            log.error(
                "task failed without a receipt", extra={"task": list(key), "error": str(error)}
            )

    def _execute(
        self, record: AckRecord, plan: Plan, envelope: bytes, decoded: ProgramEnvelope | None
    ) -> ReceiptRecord:
        request = record.request
        started = self._clock()
        if request.kind == KIND_COMPILE:
            outcome: Any = self.sandbox.compile(envelope, record.target or "local")
        else:
            outcome = self.sandbox.run(envelope, decoded=decoded)
        finished = self._clock()
        return self._deliver(record, plan, outcome, started, finished)

    async def _execute_async(
        self, record: AckRecord, plan: Plan, envelope: bytes, decoded: ProgramEnvelope | None
    ) -> ReceiptRecord:
        started = self._clock()
        outcome = await self.sandbox.run_async(envelope, decoded=decoded)
        return self._deliver(record, plan, outcome, started, self._clock())

    def _deliver(
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
            signature = self._sign(receipt_hash)
            stored = self.journal.record_receipt(
                receipt, signature, outputs, detail, receipt_hash=receipt_hash
            )
        self.outputs.put(stored.key, outputs)
        kind = _KIND_NAMES.get(request.kind, "other")
        self.metrics.tasks_delivered.labels(kind, detail["state"]).inc()
        self.metrics.task_seconds.labels(kind).observe(max(0.0, finished - record.acked_at))
        self.metrics.amount_receipted.inc(receipt.amount)
        return stored

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
                self._start(record, plan, self.journal.envelope(record.key))
            keys.append(record.key)
        if keys:
            log.info("re-running unfinished tasks", extra={"tasks": [list(k) for k in keys]})
        return keys

    def future(self, key: Key) -> Future[ReceiptRecord] | asyncio.Future[ReceiptRecord] | None:
        """Return the running task's future (a loop task for inference), if in flight."""
        return self._inflight.get(key)

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
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)

    # ---- vouchers ----------------------------------------------------------------------

    def accept_voucher(self, voucher_json: str, signature: str) -> tuple[VoucherRecord, bool]:
        """Verify and store a client's cumulative voucher; return it and whether it is new.

        Accepted only if it is signed by the deal's client, covers every task the previously
        accepted voucher covered, newly covers only delivered tasks that are not claimed (or
        being claimed) or refunded on chain, and adds at least the receipt amounts of the tasks
        it newly covers over the previous voucher (so its task bits are paid for), and whose
        redemption leaves the deal's cap enough for every other acked task not settled yet (a
        surplus, or tip, must fit in what the cap keeps free: ``voucher_leaves_cap_short``). A
        refusal changes nothing: the next voucher is judged against the same accepted one.
        """
        try:
            if json_depth(voucher_json) > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH}")
            voucher = Voucher.from_json(json.loads(voucher_json))
            if not 0 <= voucher.deal_id < 2**256 or not 0 <= voucher.cumulative_amount < 2**256:
                raise ValueError("dealId or cumulativeAmount out of range")
            if len(voucher.tasks) > MAX_VOUCHER_WORDS or any(
                not 0 <= word < 2**256 for word in voucher.tasks
            ):
                raise ValueError(f"the task bitmap is above {MAX_VOUCHER_WORDS} uint256 words")
            voucher.struct_hash()
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise self._voucher_reject("bad_request", f"malformed Voucher: {_short(exc)}") from exc
        sig = parse_signature(signature)
        deal = self.deals.get(voucher.deal_id)
        if deal.provider.lower() != self.address.lower():
            raise self._voucher_reject("deal_not_ours", f"deal {voucher.deal_id} is not ours")
        try:
            signer = voucher.recover(self.domain, sig)
        except SignatureError as exc:
            raise self._voucher_reject("signature_invalid", str(exc)) from exc
        if signer.lower() != deal.client.lower():
            raise self._voucher_reject(
                "signature_invalid",
                f"Voucher signed by {signer}, but deal {voucher.deal_id}'s client is {deal.client}",
            )
        if voucher.cumulative_amount > deal.max_spend:
            raise self._voucher_reject(
                "voucher_over_cap",
                f"cumulative {voucher.cumulative_amount} is above the deal's cap {deal.max_spend}",
            )
        tasks = voucher_tasks(voucher)
        # Under the task lock too: an ack and a voucher are each checked against the cap with
        # the other in place. The claim job marks the tasks it claims under the journal's lock.
        with self._lock, self.journal.lock:
            book = self.journal.deal(voucher.deal_id)
            if book is None:
                raise self._voucher_reject("voucher_covers_undelivered", "no task was delivered")
            latest = book.latest_voucher
            if latest is not None and latest.voucher == voucher:
                self.metrics.vouchers.labels("duplicate").inc()
                return latest, False
            previous = set() if latest is None else set(voucher_tasks(latest.voucher))
            base = 0 if latest is None else latest.voucher.cumulative_amount
            missing = sorted(previous.difference(tasks))
            if missing:
                raise self._voucher_reject(
                    "voucher_not_cumulative",
                    f"drops tasks {_brief(missing)} of the previous voucher (cumulative {base})",
                )
            fresh = [i for i in tasks if i not in previous]
            owed = self._owed(book, fresh, base)
            increase = voucher.cumulative_amount - base
            if increase <= 0:
                raise self._voucher_reject(
                    "voucher_stale",
                    f"cumulative {voucher.cumulative_amount} is not above the previous "
                    f"voucher's {base}",
                )
            if increase < owed:
                raise self._voucher_reject(
                    "voucher_underpays",
                    f"newly covers tasks {_brief(fresh)} whose receipts sum to {owed}, but adds "
                    f"only {increase} over the previous voucher's {base}: every task bit must "
                    "be paid for",
                )
            self._check_cap_covers(voucher, deal, book, increase - owed)
            stored = self.journal.record_voucher(voucher, sig)
        self.metrics.vouchers.labels("accepted").inc()
        return stored, True

    def _check_cap_covers(
        self, voucher: Voucher, deal: DealState, book: DealBook, tip: int
    ) -> None:
        """Refuse a voucher whose redemption would leave the deal's cap short of what the
        chain may still pay for the other acked tasks (hold the journal's lock).

        Its surplus over the receipts of the tasks it newly covers (``tip``) comes out of the
        same cap as the claims of every other acked task not settled yet; the escrow refuses a
        claim that does not fit. So a client could pay one task generously and leave later
        claims unpayable (:func:`provider.receipts.cap_free`).
        """
        free = self._cap_free(voucher.deal_id, book, deal, voucher)
        if free >= 0:
            return
        latest = book.latest_voucher
        before = self._cap_free(
            voucher.deal_id, book, deal, None if latest is None else latest.voucher
        )
        if free >= before:
            return  # short already (journaled by an older daemon): this voucher adds nothing
        raise self._voucher_reject(
            "voucher_leaves_cap_short",
            f"cumulative {voucher.cumulative_amount} pays {tip} more than the receipts of the "
            f"tasks it newly covers; redeemed, it would leave deal {voucher.deal_id}'s cap "
            f"{deal.max_spend} {-free} short of what its other acked tasks may cost: send one "
            f"that adds exactly the receipts' amounts",
        )

    def _owed(self, book: DealBook, fresh: list[int], base: int) -> int:
        """Return the receipt amounts of the tasks a voucher newly covers; refuse one that
        covers an undelivered task or a task settled on chain otherwise (hold the journal's
        lock)."""
        claimed, refunded = book.claimed_tasks(), book.refunded_tasks()
        owed = 0
        for index in fresh:
            if index in claimed or index in book.claiming:
                raise self._voucher_reject(
                    "voucher_covers_claimed",
                    f"task {index} was claimed on chain: a voucher may not pay it again; send "
                    f"one without it that still covers the previous voucher's tasks and adds "
                    f"the amounts of the tasks it newly covers to {base}",
                )
            if index in refunded:
                raise self._voucher_reject(
                    "voucher_covers_refunded", f"task {index} was refunded on chain"
                )
            record = book.receipts.get(index)
            if record is None:
                raise self._voucher_reject(
                    "voucher_covers_undelivered", f"task {index} has no receipt"
                )
            owed += record.receipt.amount
        return owed

    def _voucher_reject(self, code: str, reason: str) -> RejectedError:
        self.metrics.vouchers.labels(code).inc()
        return RejectedError(code, reason)


def json_depth(text: str | bytes) -> int:
    """Return the deepest nesting of arrays and objects in a JSON text, without parsing it.

    Linear and iterative: run before a recursive parser sees the text, it refuses what would
    exhaust the stack (``[`` x 100,000) however high the recursion limit is.
    """
    data = text.encode("utf-8", "replace") if isinstance(text, str) else text
    stripped = _JSON_STRING.sub(b"", data)
    depth = deepest = 0
    for byte in stripped.translate(None, _NOT_BRACKETS):
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _short(exc: BaseException, most: int = 200) -> str:
    """Return an exception's message cut to ``most`` characters (error answers stay small)."""
    text = str(exc)
    return text if len(text) <= most else text[:most] + "..."


def _brief(indexes: list[int], most: int = 20) -> str:
    """Return a list of task indexes for a message, cut after ``most``."""
    shown = ", ".join(str(i) for i in indexes[:most])
    return f"[{shown}{', ...' if len(indexes) > most else ''}] ({len(indexes)})"


__all__ = [
    "CheckedRequest",
    "ProviderError",
    "Submission",
    "TaskService",
    "TaskView",
    "json_depth",
    "parse_signature",
]
