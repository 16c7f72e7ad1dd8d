"""One open deal from the client's side: submit tasks, verify deliveries, pay, refund breaches.

Every delivery is verified (`client.verify`) before it enters the voucher book; optionally a
fraction of inference tasks is re-executed locally and compared. Only verified deliveries are
paid, by a cumulative voucher handed to the provider. A task whose ack deadline (plus the
deal's challenge window) passed with no delivery is refunded on chain with the penalty.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from client.accounts import ClientAccount
from client.errors import DeliveryRejected
from client.provider_http import ProviderHttp, TaskView
from client.verify import Delivery, verify_delivery
from client.vouchers import VoucherBook
from contracts.errors import SignatureError
from contracts.messages import (
    KIND_INFERENCE,
    Ack,
    Domain,
    Plan,
    TaskRequest,
    Voucher,
    verify,
)
from contracts.program import (
    ArrayFormat,
    ProgramEnvelope,
    decode_arrays,
    encode_envelope,
    request_input_hash,
)
from contracts.reverts import EscrowTaskAlreadySettled

Progress = Callable[["TaskOutcome"], None]


@dataclass(frozen=True)
class TaskSpec:
    """One task to run: its kind, program envelope, compile target and price limit."""

    kind: int
    envelope: ProgramEnvelope
    max_price: int
    target: str | None = None


@dataclass
class TaskOutcome:
    """What became of one task: acked, delivered and verified (payable), rejected, refunded."""

    index: int
    spec: TaskSpec
    request: TaskRequest
    ack: Ack | None = None
    ack_signature: bytes = b""
    view: TaskView | None = None
    verified: bool = False
    rejected: str | None = None
    refunded: tuple[int, int] | None = None  # (refund, penalty)
    spot_checked: bool = False

    @property
    def succeeded(self) -> bool:
        """Return whether the provider delivered a successful, verified result."""
        return bool(self.verified and self.view and self.view.state == "succeeded")


@dataclass
class DealSession:
    """Drive one deal's tasks with bounded concurrency and pay only for verified work."""

    provider: ProviderHttp
    account: ClientAccount
    domain: Domain
    deal_id: int
    plan: Plan
    provider_address: str
    book: VoucherBook
    challenge_window: int
    spot_check_fraction: float = 0.0
    spot_check_tolerance: float = 1e-4
    next_index: int = 0
    outcomes: dict[int, TaskOutcome] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def submit(self, spec: TaskSpec) -> TaskOutcome:
        """Sign and submit one task; return its outcome with the verified ack."""
        with self._lock:
            index = self.next_index
            self.next_index += 1
        envelope = spec.envelope
        request = TaskRequest(
            deal_id=self.deal_id,
            task_index=index,
            kind=spec.kind,
            program_hash=envelope.program_sha256,
            input_hash=request_input_hash(spec.kind, envelope, spec.target),
            max_price=spec.max_price,
        )
        outcome = TaskOutcome(index=index, spec=spec, request=request)
        with self._lock:
            self.outcomes[index] = outcome
        signature = request.sign(self.domain, self.account.key)
        view = self.provider.submit(
            request, signature, encode_envelope(envelope), target=spec.target
        )
        self._accept_ack(outcome, view)
        return outcome

    def _accept_ack(self, outcome: TaskOutcome, view: TaskView) -> None:
        ack = view.ack
        try:
            verify(ack, self.domain, view.ack_signature, self.provider_address)
        except SignatureError as exc:
            raise DeliveryRejected(outcome.index, f"ack signature: {exc}") from exc
        if ack.request_hash != outcome.request.struct_hash() or ack.task_index != outcome.index:
            raise DeliveryRejected(outcome.index, "ack is for another request")
        if ack.price > outcome.request.max_price:
            raise DeliveryRejected(outcome.index, "ack price above the request's maximum")
        outcome.ack, outcome.ack_signature = ack, view.ack_signature

    def collect(self, outcome: TaskOutcome, *, wait_s: float = 30.0) -> TaskOutcome:
        """Fetch the task's delivery (long-poll) and verify it; payable ones enter the book."""
        view = self.provider.fetch(self.deal_id, outcome.index, wait_s=wait_s)
        outcome.view = view
        if view.receipt is None or outcome.ack is None:
            return outcome
        delivery = Delivery(
            outcome.request, outcome.ack, view.receipt, view.receipt_signature, view.outputs or b""
        )
        try:
            receipt = verify_delivery(
                delivery, domain=self.domain, provider=self.provider_address, plan=self.plan
            )
            self._spot_check(outcome)
        except DeliveryRejected as exc:
            outcome.rejected = exc.reason
            return outcome
        with self._lock:
            self.book.add(receipt)
        outcome.verified = True
        return outcome

    def _spot_check(self, outcome: TaskOutcome) -> None:
        view = outcome.view
        if (
            outcome.spec.kind != KIND_INFERENCE
            or view is None
            or view.state != "succeeded"
            or self._rng.random() >= self.spot_check_fraction
        ):
            return
        from client.models.jax_export import run_local

        expected = run_local(outcome.spec.envelope)
        delivered = decode_arrays(view.outputs or b"", ArrayFormat.SAFETENSORS)
        for i, want in enumerate(expected):
            got = delivered.get(str(i))
            if got is None or got.shape != want.shape:
                raise DeliveryRejected(
                    outcome.index, f"spot check: output {i} missing or misshapen"
                )
            if not np.allclose(
                got, want, atol=self.spot_check_tolerance, rtol=self.spot_check_tolerance
            ):
                worst = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
                raise DeliveryRejected(
                    outcome.index, f"spot check: output {i} differs by {worst:.3g}"
                )
        outcome.spot_checked = True

    def run(
        self,
        specs: Sequence[TaskSpec],
        *,
        concurrency: int = 4,
        wait_s: float = 30.0,
        on_done: Progress | None = None,
    ) -> list[TaskOutcome]:
        """Submit and collect many tasks, at most `concurrency` in flight; return outcomes."""

        def one(spec: TaskSpec) -> TaskOutcome:
            outcome = self.submit(spec)
            self.collect(outcome, wait_s=wait_s)
            if on_done:
                on_done(outcome)
            return outcome

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(one, specs))

    def pay(self) -> Voucher | None:
        """Sign the cumulative voucher for every verified delivery and hand it over."""
        with self._lock:
            if self.book.total <= self.book.last_signed:
                return None
            voucher, signature = self.book.sign_next(self.domain, self.account.key)
        self.provider.send_voucher(voucher, signature)
        return voucher

    def breached(self, chain_now: int) -> list[TaskOutcome]:
        """Return acked tasks not verified (undelivered, late or wrong) past deadline and grace."""
        return [
            o
            for o in self.outcomes.values()
            if o.ack is not None
            and not o.verified
            and o.refunded is None
            and chain_now > o.ack.deadline + self.challenge_window
        ]

    def refund_breaches(self, chain_now: int) -> list[TaskOutcome]:
        """Refund every breached task on chain with the penalty; return those refunded.

        A task the provider already claimed on chain cannot be refunded: it is left for a
        dispute of its claimed batch (`ClientAccount.dispute`).
        """
        refunded = []
        for outcome in self.breached(chain_now):
            assert outcome.ack is not None
            try:
                outcome.refunded = self.account.refund_breach(outcome.ack, outcome.ack_signature)
            except EscrowTaskAlreadySettled:
                outcome.rejected = outcome.rejected or "claimed on chain by the provider"
                continue
            with self._lock:
                self.book.mark_claimed(outcome.index)
            refunded.append(outcome)
        return refunded
