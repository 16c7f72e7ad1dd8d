"""One open deal from the client's side: submit tasks, verify deliveries, pay, refund breaches.

Every request carries the deadline the client signs (``now + ceil(sloMs / 1000) + 2`` s: the
deal's SLO plus two seconds for transit and clock skew); the provider's ack commits to it by
hashing the request, and is checked (it answers this request, at most its ``maxPrice``,
signed by the deal's provider) before anything else happens. Every delivery is verified
(`client.verify`) before it enters the voucher book; optionally a fraction of inference tasks
is re-executed locally and compared. Only verified deliveries are paid, by a cumulative voucher
handed to the provider; before signing one the book is reconciled with the chain's per-task
state, so a voucher never covers a task the provider claimed. A task acked but not verified
is refunded on chain with the penalty once its settlement instant has passed
(``settleBy = min(deadline, expiry) + challengeWindow``), after asking the provider once more
for its result.
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
from client.errors import ClientError, DeliveryRejected, ProviderRejected, ProviderUnavailable
from client.ledger_records import ChainState
from client.provider_http import ProviderHttp, TaskView
from client.tasks import (
    DEADLINE_SLACK_S,
    BreachResult,
    TaskOutcome,
    TaskSpec,
    chain_states,
    request_deadline,
    settle_by,
)
from client.verify import Delivery, spot_check, verify_delivery
from client.vouchers import VoucherBook
from contracts.errors import ChainError, ContractRevert, SignatureError
from contracts.messages import (
    KIND_INFERENCE,
    Ack,
    Domain,
    Plan,
    Receipt,
    TaskRequest,
    Voucher,
    task_bitmap,
    verify,
)
from contracts.program import (
    encode_envelope,
)
from contracts.reverts import EscrowDeadlineNotPassed, EscrowTaskAlreadySettled

Progress = Callable[["TaskOutcome"], None]

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
    acked, delivered), so a ledger can record it before the session goes on.
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
    confirmed_vouched: set[int] = field(default_factory=set)
    _lead: float = 0.0
    _lead_read_at: float = -CHAIN_CLOCK_READ_S
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

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
        refuses such a request).
        """
        slo_ms, expiry = self.terms()
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
        """Sign and submit one task; return its outcome with the verified ack."""
        with self._lock:
            index = self.next_index
            self.next_index += 1
        outcome = self.sign_request(index, spec)
        self._updated(outcome)
        self.send(outcome)
        return outcome

    def send(self, outcome: TaskOutcome) -> TaskOutcome:
        """Send a signed request to the provider (again, idempotently) and accept its ack.

        A provider whose clock runs ahead of ours refuses the deadline as too soon: the task
        is signed once more (same index), with the chain's clock read again and twice the
        slack, and sent again.
        """
        envelope = encode_envelope(outcome.spec.envelope)
        for attempt in (0, 1):
            try:
                view = self.provider.submit(
                    outcome.request, outcome.request_signature, envelope, target=outcome.spec.target
                )
            except ProviderRejected as exc:
                if exc.error != "deadline_too_soon" or attempt:
                    raise
                self.resync_clock()
                self.resign(outcome, self.now() + DEADLINE_SLACK_S)
                self._updated(outcome)
                continue
            self.accept_ack(outcome, view)
            break
        return outcome

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
        self._updated(outcome)

    def _updated(self, outcome: TaskOutcome) -> None:
        if self.on_update is not None:
            self.on_update(outcome)

    # ---- collecting -------------------------------------------------------------------------

    def collect(self, outcome: TaskOutcome, *, wait_s: float = 30.0) -> TaskOutcome:
        """Fetch the task's delivery once (long-poll) and verify it; payable ones enter the book."""
        view = self.provider.fetch(self.deal_id, outcome.index, wait_s=wait_s)
        self._take_view(outcome, view)
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

    def _take_view(self, outcome: TaskOutcome, view: TaskView) -> None:
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
        with self._lock:
            self.book.add(receipt)
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

    def chain_states(self, indices: Sequence[int]) -> dict[int, ChainState | None]:
        """Return the escrow's settlement state of each task of the deal."""
        return chain_states(self.account.escrow, self.deal_id, indices)

    def reconcile(self) -> dict[int, ChainState]:
        """Align the voucher book with the chain: tasks claimed or refunded leave it.

        Reads the state of every task the book pays that is not yet known to be vouched on
        chain; return the states found (vouched ones are remembered and not read again).
        """
        with self._lock:
            unknown = sorted(set(self.book.paid) - self.confirmed_vouched)
        if not unknown:
            return {}
        found: dict[int, ChainState] = {}
        for index, state in self.chain_states(unknown).items():
            if state is None:
                continue
            found[index] = state
            if state == ChainState.VOUCHED:
                with self._lock:
                    self.confirmed_vouched.add(index)
            else:
                self.mark_claimed(index)
        return found

    def mark_claimed(self, index: int) -> None:
        """Take a task settled on chain without a voucher (claimed or refunded) out of the
        voucher book: no voucher covers it again."""
        with self._lock:
            self.book.mark_claimed(index)

    def add_payable(self, receipt: Receipt) -> None:
        """Add a verified receipt to the voucher book, unless its task was claimed or
        refunded on chain."""
        with self._lock:
            if receipt.task_index not in self.book.claimed:
                self.book.add(receipt)

    def sign_voucher(self, floor: int, *, resend: bool = False) -> tuple[Voucher, bytes] | None:
        """Sign the next voucher above ``floor`` (what the chain counts as vouched); None if
        nothing new is owed.

        With ``resend``, when nothing new is owed, sign the last voucher again if it is above
        ``floor`` (it was signed, but may not have reached the provider).
        """
        with self._lock:
            if self.book.has_news(floor):
                return self.book.sign_next(self.domain, self.account.key, floor)
            if not resend or self.book.last_signed <= floor:
                return None
            voucher = Voucher(
                self.deal_id, self.book.last_signed, task_bitmap(self.book.last_tasks)
            )
            return voucher, voucher.sign(self.domain, self.account.key)

    def prepare_voucher(self) -> tuple[Voucher, bytes] | None:
        """Reconcile with the chain and sign the next voucher; None if nothing new is owed."""
        self.reconcile()
        floor = self.account.escrow.get_deal(self.deal_id).vouched
        return self.sign_voucher(floor)

    def pay(self) -> Voucher | None:
        """Sign the cumulative voucher for every verified delivery and hand it over.

        A provider that refuses the voucher (say it covers a task the provider claimed in the
        meantime) gets one more, signed after reconciling with the chain again.
        """
        signed = self.prepare_voucher()
        if signed is None:
            return None
        try:
            self.provider.send_voucher(*signed)
        except ProviderRejected as exc:
            if exc.status >= 500:
                raise
            signed = self.prepare_voucher()
            if signed is None:
                return None
            self.provider.send_voucher(*signed)
        return signed[0]

    # ---- breaches ---------------------------------------------------------------------------

    def settle_breach(
        self,
        request: TaskRequest,
        ack: Ack,
        ack_signature: bytes,
        chain_now: int,
        *,
        spec: TaskSpec | None = None,
        ask_provider: bool = True,
    ) -> BreachResult:
        """Refund an acked, unverified task once its settlement instant has passed on chain.

        First the provider is asked once more for the result: a delivery that verifies (by
        its deadline) is returned for payment instead. A task already settled on chain comes
        back as ``settled`` with its state.
        """
        _, expiry = self.terms()
        index = request.task_index
        if chain_now <= settle_by(request.deadline, expiry, self.challenge_window):
            return BreachResult("not_due")
        detail = ""
        late: TaskView | None = None
        if ask_provider:
            try:
                view = self.provider.fetch(self.deal_id, index, wait_s=0)
            except ClientError as exc:
                detail = f"provider: {exc}"
            else:
                if view.receipt is not None:
                    try:
                        receipt = self.verify_view(request, ack, view, spec)
                    except DeliveryRejected as exc:
                        detail, late = exc.reason, view
                    else:
                        return BreachResult("delivered", view=view, receipt=receipt)
        try:
            refunded = self.account.refund_breach(request, ack, ack_signature)
        except EscrowTaskAlreadySettled:
            state = self.chain_states([index]).get(index)
            return BreachResult("settled", chain=state, view=late, detail=detail)
        except EscrowDeadlineNotPassed:
            return BreachResult("not_due")
        except (ContractRevert, ChainError) as exc:
            return BreachResult("failed", detail=str(exc))
        return BreachResult("refunded", refund=refunded, view=late, detail=detail)

    def breached(self, chain_now: int) -> list[TaskOutcome]:
        """Return acked tasks not verified (undelivered, late or wrong) past their instant."""
        _, expiry = self.terms()
        return [
            o
            for o in self.outcomes.values()
            if o.ack is not None
            and not o.verified
            and o.refunded is None
            and not o.claimed
            and chain_now > settle_by(o.request.deadline, expiry, self.challenge_window)
        ]

    def refund_breaches(self, chain_now: int) -> list[TaskOutcome]:
        """Refund every breached task on chain with the penalty; return those refunded.

        A task the provider delivered after all (asked once more) enters the voucher book
        instead (call `pay` again); one it already claimed on chain is left for the dispute
        watcher (`client.watch`).
        """
        refunded = []
        for outcome in self.breached(chain_now):
            assert outcome.ack is not None
            result = self.settle_breach(
                outcome.request, outcome.ack, outcome.ack_signature, chain_now, spec=outcome.spec
            )
            if result.kind == "delivered" and result.view is not None:
                self._take_view(outcome, result.view)
            elif result.kind == "refunded":
                outcome.refunded = result.refund
                if result.view is not None:
                    outcome.view, outcome.rejected = result.view, result.detail
                self.mark_claimed(outcome.index)
                refunded.append(outcome)
            elif result.kind == "settled":
                outcome.claimed = True
                outcome.rejected = outcome.rejected or f"{result.chain} on chain by the provider"
                self.mark_claimed(outcome.index)
        return refunded


def _transient(exc: ProviderRejected) -> bool:
    """Return whether a provider's error answer may pass (a restart, a task not reloaded yet)."""
    return exc.status >= 500 or exc.status == 404
