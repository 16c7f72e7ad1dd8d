"""Builders of signed messages and deals for escrow tests."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, replace

from contracts.binding import TxResult
from contracts.messages import (
    KIND_INFERENCE,
    STATUS_SUCCESS,
    ZERO_HASH,
    Ack,
    Claim,
    Plan,
    Quote,
    Receipt,
    TaskRequest,
    Voucher,
    address_of,
    task_bitmap,
)
from contracts.pricing import price_receipt

from .conftest import World

_nonces = itertools.count(1)
DEFAULT_PLAN = Plan(compile_price=1_000, inference_price=500, price_per_device_ms=2)
WINDOW = 60  # the default deal's challenge window


def quote(
    world: World,
    provider: str,
    client: str,
    *,
    max_spend: int = 10**9,
    stake: int = 10**6,
    penalty: int = 50_000,
    duration: int = 3_600,
    challenge_window: int = WINDOW,
    slo_ms: int = 2_000,
    plan: Plan = DEFAULT_PLAN,
    valid_for: int = 600,
    nonce: int | None = None,
) -> Quote:
    """Return an unsigned quote from `provider` naming the client whose key is `client`."""
    return Quote(
        provider=address_of(provider),
        client=address_of(client),
        arbiter=address_of(world.arbiter),
        max_spend=max_spend,
        stake=stake,
        penalty=penalty,
        duration=duration,
        challenge_window=challenge_window,
        slo_ms=slo_ms,
        valid_until=world.now() + valid_for,
        nonce=next(_nonces) if nonce is None else nonce,
        plan=plan,
    )


def open_deal(
    world: World,
    client: str,
    provider: str,
    /,
    *,
    max_spend: int = 10**8,
    deposit: int | None = None,
    quote_max_spend: int | None = None,
    **terms: object,
) -> tuple[int, Quote]:
    """Deposit, stake and open a deal; return its id and quote.

    The quote's maxSpend is the deal's unless `quote_max_spend` says otherwise, so the deal
    locks the quote's whole stake (a deal locks the share of it that its spend is of the quote's).
    """
    cap = max_spend if quote_max_spend is None else quote_max_spend
    q = quote(world, provider, client, max_spend=cap, **terms)  # type: ignore[arg-type]
    world.escrow.deposit(client, deposit if deposit is not None else max_spend)
    if q.stake:
        world.escrow.stake(provider, q.stake)
    result = world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), max_spend)
    return int(result.event("DealOpened").args["dealId"]), q


@dataclass(frozen=True)
class SignedTask:
    """One task of a deal as both parties signed it, and the provider's receipt for it."""

    request: TaskRequest
    request_sig: bytes  # the client's
    ack: Ack
    ack_sig: bytes  # the provider's
    receipt: Receipt  # priced by the plan; finished before the deadline unless built otherwise

    @property
    def index(self) -> int:
        """Return the task index."""
        return self.request.task_index

    def claim(self, receipt: Receipt | None = None, *, signature: bytes | None = None) -> Claim:
        """Return the claim of this task (optionally of another receipt or signature)."""
        return Claim(
            receipt=receipt or self.receipt,
            max_price=self.request.max_price,
            request_signature=self.request_sig if signature is None else signature,
        )


def signed_task(
    world: World,
    deal_id: int,
    index: int,
    client: str,
    provider: str,
    *,
    plan: Plan = DEFAULT_PLAN,
    deadline: int | None = None,
    max_price: int | None = None,
    ack_price: int | None = None,
    kind: int = KIND_INFERENCE,
    status: int = STATUS_SUCCESS,
    device_ms: int = 40,
    cache_hit: bool = False,
    finished_at: int | None = None,
    prev: bytes = ZERO_HASH,
) -> SignedTask:
    """Return a task the client requested and the provider acked, with a receipt for it.

    Defaults: deadline 100 s from the latest block, the receipt finished a second before it,
    maxPrice twice the plan's price and the ack's price equal to the plan's price.
    """
    due = world.now() + 100 if deadline is None else deadline
    finished = due - 1 if finished_at is None else finished_at
    draft = Receipt(
        deal_id=deal_id,
        task_index=index,
        kind=kind,
        status=status,
        cache_hit=cache_hit,
        device_ms=device_ms,
        compile_ms=0,
        program_hash=os.urandom(32),
        input_hash=os.urandom(32),
        output_hash=os.urandom(32),
        started_at=finished - 1,
        finished_at=finished,
        deadline=due,
        amount=0,
        prev_receipt_hash=prev,
    )
    receipt = replace(draft, amount=price_receipt(plan, draft))
    request = receipt.request(2 * receipt.amount if max_price is None else max_price)
    ack = Ack(
        deal_id=deal_id,
        task_index=index,
        request_hash=request.struct_hash(),
        price=receipt.amount if ack_price is None else ack_price,
    )
    domain = world.escrow.domain
    return SignedTask(
        request=request,
        request_sig=request.sign(domain, client),
        ack=ack,
        ack_sig=ack.sign(domain, provider),
        receipt=receipt,
    )


def claim(
    world: World, provider: str, deal_id: int, tasks: list[SignedTask], plan: Plan = DEFAULT_PLAN
) -> TxResult:
    """Claim `tasks` with their receipts and the client's request signatures."""
    return world.escrow.claim_receipts(provider, deal_id, plan, [t.claim() for t in tasks])


def refund(world: World, client: str, task: SignedTask) -> TxResult:
    """Refund a breached task with its request and the provider's ack."""
    return world.escrow.refund_breach(client, task.request, task.ack, task.ack_sig)


def voucher(deal_id: int, amount: int, tasks: list[int] | range) -> Voucher:
    """Return an unsigned voucher covering `tasks`."""
    return Voucher(deal_id=deal_id, cumulative_amount=amount, tasks=task_bitmap(tasks))


def redeem(world: World, client: str, provider: str, v: Voucher) -> TxResult:
    """Sign `v` as `client` and redeem it as `provider`."""
    return world.escrow.redeem_voucher(provider, v, v.sign(world.escrow.domain, client))


def settle_by(task: SignedTask, expiry: int, window: int) -> int:
    """Return the task's settlement instant: the last second a claim lands, before any refund."""
    return min(task.request.deadline, expiry) + window


def bits(words: list[int] | tuple[int, ...]) -> list[int]:
    """Return the task indexes a bitmap (voucher words, from word 0) marks, ascending."""
    return [w * 256 + b for w, word in enumerate(words) for b in range(256) if word >> b & 1]
