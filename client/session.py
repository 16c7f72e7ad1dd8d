"""One open deal from the client's side: submit tasks, verify deliveries, pay for them.

Every request carries the deadline the client signs (``now + ceil(sloMs / 1000) + 2`` s: the
deal's SLO plus two seconds for transit and clock skew); the provider's ack commits to it by
hashing the request, and is checked (it answers this request, at most its ``maxPrice``,
signed by the deal's provider) before anything else happens. Every delivery is verified
(`client.verify`) before it enters the voucher book; optionally a fraction of inference tasks
is re-executed locally and compared. Only verified deliveries are paid, by a cumulative voucher
(`client.deal_payments`); a task acked but not verified is refunded on chain with the penalty
once its settlement instant has passed (`client.deal_refunds`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from web3.exceptions import Web3Exception

from client.accounts import ClientAccount
from client.deal_guards import OUT_OF_ORDER, DealClosing, expected_index
from client.deal_payments import DealPayments
from client.errors import ClientError, DeliveryRejected, ProviderRejected, ProviderUnavailable
from client.provider_http import ProviderHttp, TaskView
from client.tasks import DEADLINE_SLACK_S, TaskOutcome, TaskSpec, request_deadline
from client.verify import Delivery, spot_check, verify_delivery
from client.vouchers import VoucherBook
from contracts.errors import SignatureError
from contracts.messages import (
    KIND_INFERENCE,
    Ack,
    Domain,
    Plan,
    Receipt,
    TaskRequest,
    Voucher,
    verify,
)
from programs.envelope import encode_envelope

Progress = Callable[["TaskOutcome"], None]
KeepEnvelope = Callable[[TaskRequest, bytes, "str | None"], None]
"""Keep the envelope a request is sent with (``client.dispute_evidence.EnvelopeStore.keep``)."""

LATE_GRACE_S = 5.0
"""How long past its deadline a delivery is still awaited (a provider restart fits in it)."""
POLL_BACKOFF_S = (0.2, 1.0)
"""First and longest pause between polls of an unreachable provider."""
CHAIN_CLOCK_READ_S = 1.0
"""How often the chain's clock is read to keep the session's clock from falling behind it."""


@dataclass
class DealSession:
    """Drive one deal's tasks with bounded concurrency and pay only for verified work.

    ``slo_ms`` and ``expiry`` default to the provider's advertised SLO and the deal's expiry
    on chain (read once). ``on_update`` is called whenever a task's state changes (signed,
    acked, delivered), so a ledger can record it before the session goes on. ``payments``
    holds the voucher book and signs the vouchers; the session's lock guards its outcomes
    and the book alike.
    """

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
    slo_ms: int | None = None
    expiry: int | None = None
    grace_s: float = LATE_GRACE_S
    on_update: Progress | None = None
    keep_envelope: KeepEnvelope | None = None
    """Called with each request and the envelope bytes (and compile target) before they are
    sent, so the program can be handed to an arbiter if the task is disputed."""
    payments: DealPayments = field(init=False, repr=False)
    _lead: float = 0.0
    _lead_read_at: float = -CHAIN_CLOCK_READ_S
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _send_lock: threading.Lock = field(default_factory=threading.Lock)
    _order: threading.Condition = field(default_factory=threading.Condition)
    _given_up: set[int] = field(default_factory=set)
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def __post_init__(self) -> None:
        self.payments = DealPayments(
            self.account, self.domain, self.deal_id, self.provider, self.book, lock=self._lock
        )

    # ---- time and terms ---------------------------------------------------------------------

    def now(self) -> float:
        """Return the time deadlines are judged by: the wall clock, never behind the chain's.

        The chain's clock decides settlement (``block.timestamp``), and the provider's daemon
        judges a request's deadline by the same rule; the chain's lead over the wall clock is
        read at most once per ``CHAIN_CLOCK_READ_S`` and only ever grows.
        """
        wall = time.time()
        if wall - self._lead_read_at >= CHAIN_CLOCK_READ_S:
            self._lead_read_at = wall
            try:
                # The pending block carries the chain's clock now; the latest one may be old.
                block = self.account.escrow.tx.w3.eth.get_block("pending")["timestamp"]
            except (OSError, ValueError, Web3Exception):  # unreachable: keep the lead seen
                return wall + self._lead
            self._lead = max(self._lead, int(block) - wall)
        return wall + self._lead

    def resync_clock(self) -> None:
        """Read the chain's clock at the next ``now`` (a provider said our time was behind)."""
        self._lead_read_at = -CHAIN_CLOCK_READ_S

    def terms(self) -> tuple[int, int]:
        """Return the deal's SLO (ms) and expiry, reading what is not known yet."""
        if self.slo_ms is None:
            self.slo_ms = int(self.provider.info()["slo_ms"])
        if self.expiry is None:
            self.expiry = self.account.escrow.get_deal(self.deal_id).expiry
        return self.slo_ms, self.expiry

    def sign_request(self, index: int, spec: TaskSpec, now: float | None = None) -> TaskOutcome:
        """Sign a request for ``spec`` at ``index`` with a deadline from now; return its outcome.

        Raise ``ClientError`` if the deadline would fall after the deal's expiry (the provider
        refuses such a request), and :class:`~client.deal_guards.DealClosing` once the client
        agreed to close the deal (read on chain at each request): an early close must never
        land between a new task's breach and its refund.
        """
        slo_ms, expiry = self.terms()
        if self.account.escrow.get_deal(self.deal_id).client_agreed_close:
            raise DealClosing(
                f"deal {self.deal_id}: this client agreed to close it, so it sends no new task"
            )
        deadline = request_deadline(self.now() if now is None else now, slo_ms)
        if deadline > expiry:
            raise ClientError(
                f"deal {self.deal_id} expires at {expiry}, before this task's deadline {deadline}"
            )
        request = TaskRequest(
            deal_id=self.deal_id,
            task_index=index,
            kind=spec.kind,
            program_hash=spec.envelope.program_sha256,
            input_hash=spec.input_hash(),
            max_price=spec.max_price,
            deadline=deadline,
        )
        outcome = TaskOutcome(
            index=index,
            spec=spec,
            request=request,
            request_signature=request.sign(self.domain, self.account.key),
        )
        self.track(outcome)
        return outcome

    def resign(self, outcome: TaskOutcome, now: float | None = None) -> None:
        """Sign ``outcome``'s task again, same index, with a deadline from ``now``."""
        fresh = self.sign_request(outcome.index, outcome.spec, now)
        outcome.request, outcome.request_signature = fresh.request, fresh.request_signature
        self.track(outcome)

    def track(self, outcome: TaskOutcome) -> None:
        """Make ``outcome`` the session's record of its task (a signed or resumed task)."""
        with self._lock:
            self.outcomes[outcome.index] = outcome

    # ---- submitting -------------------------------------------------------------------------

    def submit(self, spec: TaskSpec) -> TaskOutcome:
        """Sign and submit one task at the deal's next index; return it with the verified ack.

        The provider acks a deal's indexes only in order, so submissions are sent one at a
        time (acks come at once; deliveries are awaited concurrently). A refusal before the
        ack frees its index again: the next task takes it.
        """
        with self._send_lock:
            with self._lock:
                index = self.next_index
                self.next_index += 1
            try:
                outcome = self.sign_request(index, spec)
                self._updated(outcome)
                self.send(outcome)
            except ClientError as exc:
                if _frees_index(exc):
                    with self._lock:  # nothing acked at this index: it is free again
                        if self.next_index == index + 1:
                            self.next_index = index
                            self.outcomes.pop(index, None)
                            self._given_up.discard(index)
                raise
        return outcome

    def send(self, outcome: TaskOutcome) -> TaskOutcome:
        """Send a signed request to the provider (again, idempotently) and accept its ack.

        A provider whose clock runs ahead of ours refuses the deadline as too soon: the task
        is signed once more (same index), with the chain's clock read again and twice the
        slack, and sent again. A provider that expects an earlier index first
        (``task_index_out_of_order``) gets this one again once this session's task at that
        index is acked (see :meth:`_await_turn`).
        """
        envelope = encode_envelope(outcome.spec.envelope)
        if self.keep_envelope is not None:
            self.keep_envelope(outcome.request, envelope, outcome.spec.target)
        resigned = False
        while True:
            try:
                view = self.provider.submit(
                    outcome.request, outcome.request_signature, envelope, target=outcome.spec.target
                )
            except ProviderRejected as exc:
                if exc.error == OUT_OF_ORDER and self._await_turn(outcome, exc.reason):
                    continue
                if exc.error == "deadline_too_soon" and not resigned:
                    resigned = True
                    self.resync_clock()
                    self.resign(outcome, self.now() + DEADLINE_SLACK_S)
                    self._updated(outcome)
                    continue
                if exc.status < 500:
                    self._give_up(outcome.index)
                raise
            except DeliveryRejected:
                self._give_up(outcome.index)
                raise
            try:
                self.accept_ack(outcome, view)
            except DeliveryRejected:
                self._give_up(outcome.index)
                raise
            return outcome

    def _await_turn(self, outcome: TaskOutcome, reason: str) -> bool:
        """Wait until this session's task at the index the provider expects is acked; return
        whether to send ``outcome`` again (False: that task was refused, or is not acked while
        ``outcome``'s deadline can still be met; another thread may not have signed it yet)."""
        expected = expected_index(reason)
        if expected is None or expected >= outcome.index:
            return False
        slo_ms, _ = self.terms()
        send_by = outcome.request.deadline - slo_ms / 1000
        with self._order:
            while True:
                earlier = self.outcomes.get(expected)
                if expected in self._given_up:
                    return False
                if earlier is not None and earlier.ack is not None:
                    return True
                left = send_by - self.now()
                if left <= 0:
                    return False
                self._order.wait(min(left, CHAIN_CLOCK_READ_S))

    def _give_up(self, index: int) -> None:
        """Record that the task at ``index`` will get no ack from this session's sends."""
        with self._order:
            self._given_up.add(index)
            self._order.notify_all()

    def check_ack(self, request: TaskRequest, ack: Ack, signature: bytes) -> None:
        """Raise ``DeliveryRejected`` unless ``ack`` answers ``request``, signed by the provider.

        The ack must hash this very request (so it commits to the request's deadline), name
        its deal and index, price it at most its ``maxPrice``, and recover to the deal's
        provider under the escrow's domain.
        """
        index = request.task_index
        try:
            verify(ack, self.domain, signature, self.provider_address)
        except SignatureError as exc:
            raise DeliveryRejected(index, f"ack signature: {exc}") from exc
        if (ack.deal_id, ack.task_index) != (request.deal_id, index):
            raise DeliveryRejected(index, "ack names another deal or task")
        if ack.request_hash != request.struct_hash():
            raise DeliveryRejected(index, "ack is for another request")
        if ack.price > request.max_price:
            raise DeliveryRejected(index, "ack price above the request's maximum")

    def accept_ack(self, outcome: TaskOutcome, view: TaskView) -> None:
        """Check the provider's ack of ``outcome``'s request and record it."""
        self.check_ack(outcome.request, view.ack, view.ack_signature)
        outcome.ack, outcome.ack_signature = view.ack, view.ack_signature
        with self._order:  # a later index waiting for this one may go
            self._given_up.discard(outcome.index)
            self._order.notify_all()
        self._updated(outcome)

    def _updated(self, outcome: TaskOutcome) -> None:
        if self.on_update is not None:
            self.on_update(outcome)

    # ---- collecting -------------------------------------------------------------------------

    def collect(self, outcome: TaskOutcome, *, wait_s: float = 30.0) -> TaskOutcome:
        """Fetch the task's delivery once (long-poll) and verify it; payable ones enter the book."""
        view = self.provider.fetch(self.deal_id, outcome.index, wait_s=wait_s)
        self.accept_delivery(outcome, view)
        return outcome

    def await_delivery(
        self,
        outcome: TaskOutcome,
        *,
        wait_s: float = 30.0,
        abandon: threading.Event | None = None,
    ) -> TaskOutcome:
        """Poll until the task is delivered or its deadline plus the grace has passed.

        Connection errors and 5xx answers (a provider restarting) do not end the wait: the
        provider is asked again, with backoff, until the deadline plus ``grace_s``. The wait
        ends early only when ``abandon`` is set (the caller gave up: a second Ctrl-C).
        """
        assert outcome.ack is not None
        give_up_at = outcome.request.deadline + self.grace_s
        pause = POLL_BACKOFF_S[0]
        while True:
            if abandon is not None and abandon.is_set():
                outcome.abandoned = True
                return outcome
            left = give_up_at - self.now()
            try:
                self.collect(outcome, wait_s=max(0.0, min(wait_s, left)))
                pause = POLL_BACKOFF_S[0]
            except (ProviderUnavailable, ProviderRejected) as exc:
                if isinstance(exc, ProviderRejected) and not _transient(exc):
                    outcome.rejected = f"not paid: {exc}"
                    self._updated(outcome)
                    return outcome
                if self.now() > give_up_at:
                    return outcome
                # The provider is unreachable (restarting?): ask again after a pause.
                (abandon or threading.Event()).wait(min(pause, max(0.05, left)))
                pause = min(pause * 2, POLL_BACKOFF_S[1])
                continue
            except ClientError as exc:  # paying it would pass the cap
                outcome.rejected = f"not paid: {exc}"
                self._updated(outcome)
                return outcome
            if outcome.view is not None and outcome.view.receipt is not None:
                return outcome
            if self.now() > give_up_at:
                return outcome

    def accept_delivery(self, outcome: TaskOutcome, view: TaskView) -> None:
        """Record the provider's answer for ``outcome``'s task; verify a delivery in it and
        add it to the voucher book (a rejected one says why)."""
        outcome.view = view
        if view.receipt is None or outcome.ack is None or outcome.verified:
            return
        try:
            receipt = self.verify_view(outcome.request, outcome.ack, view, outcome.spec)
            if outcome.spec is not None:
                outcome.spot_checked = self._spot_check(outcome.index, outcome.spec, view)
        except DeliveryRejected as exc:
            outcome.rejected = exc.reason
            self._updated(outcome)
            return
        self.payments.add(receipt)
        outcome.verified = True
        outcome.rejected = None
        self._updated(outcome)

    def verify_view(
        self, request: TaskRequest, ack: Ack, view: TaskView, spec: TaskSpec | None = None
    ) -> Receipt:
        """Return the delivered receipt if it may be paid; raise ``DeliveryRejected``."""
        if view.receipt is None:
            raise DeliveryRejected(request.task_index, "not delivered")
        delivery = Delivery(request, ack, view.receipt, view.receipt_signature, view.outputs or b"")
        return verify_delivery(
            delivery, domain=self.domain, provider=self.provider_address, plan=self.plan
        )

    def _spot_check(self, index: int, spec: TaskSpec, view: TaskView) -> bool:
        if (
            spec.kind != KIND_INFERENCE
            or view.state != "succeeded"
            or self._rng.random() >= self.spot_check_fraction
        ):
            return False
        spot_check(index, spec.envelope, view.outputs or b"", self.spot_check_tolerance)
        return True

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
            self.await_delivery(outcome, wait_s=wait_s)
            if on_done:
                on_done(outcome)
            return outcome

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(one, specs))

    # ---- paying -----------------------------------------------------------------------------

    def pay(self) -> Voucher | None:
        """Sign the cumulative voucher for every verified delivery and hand it over (see
        `DealPayments.pay`); breaches are refunded by `client.deal_refunds`."""
        return self.payments.pay()


def _frees_index(exc: ClientError) -> bool:
    """Return whether a failed submission left its index unacked for sure (a refusal before the
    ack, or a request never sent); an unreachable provider or a bad ack may hold an ack."""
    if isinstance(exc, ProviderRejected):
        return exc.status < 500
    return not isinstance(exc, (DeliveryRejected, ProviderUnavailable))


def _transient(exc: ProviderRejected) -> bool:
    """Return whether a provider's error answer may pass (a restart, a task not reloaded yet)."""
    return exc.status >= 500 or exc.status == 404
