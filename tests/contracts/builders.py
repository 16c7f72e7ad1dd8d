"""Builders of signed messages and deals for escrow tests."""

from __future__ import annotations

import itertools
import os
from dataclasses import replace

from contracts.messages import (
    KIND_INFERENCE,
    STATUS_SUCCESS,
    ZERO_ADDRESS,
    ZERO_HASH,
    Ack,
    Plan,
    Quote,
    Receipt,
    Voucher,
    address_of,
    task_bitmap,
)
from contracts.pricing import price_receipt

from .conftest import World

_nonces = itertools.count(1)
DEFAULT_PLAN = Plan(compile_price=1_000, inference_price=500, price_per_device_ms=2)


def quote(
    world: World,
    provider: str,
    *,
    client: str | None = None,
    max_spend: int = 10**9,
    stake: int = 10**6,
    penalty: int = 50_000,
    duration: int = 3_600,
    challenge_window: int = 60,
    plan: Plan = DEFAULT_PLAN,
    valid_for: int = 600,
    nonce: int | None = None,
) -> Quote:
    """Return an unsigned quote from `provider`."""
    return Quote(
        provider=address_of(provider),
        client=address_of(client) if client else ZERO_ADDRESS,
        arbiter=address_of(world.arbiter),
        max_spend=max_spend,
        stake=stake,
        penalty=penalty,
        duration=duration,
        challenge_window=challenge_window,
        slo_ms=2_000,
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
    **terms: object,
) -> tuple[int, Quote]:
    """Deposit, stake and open a deal; return its id and quote."""
    q = quote(world, provider, **terms)  # type: ignore[arg-type]
    world.escrow.deposit(client, deposit if deposit is not None else max_spend)
    if q.stake:
        world.escrow.stake(provider, q.stake)
    result = world.escrow.open_deal(client, q, q.sign(world.escrow.domain, provider), max_spend)
    return int(result.event("DealOpened").args["dealId"]), q


def receipt(
    deal_id: int,
    task_index: int,
    plan: Plan,
    *,
    deadline: int,
    finished_at: int | None = None,
    kind: int = KIND_INFERENCE,
    status: int = STATUS_SUCCESS,
    device_ms: int = 40,
    cache_hit: bool = False,
    prev: bytes = ZERO_HASH,
) -> Receipt:
    """Return an unsigned receipt priced by `plan`."""
    finished = deadline - 1 if finished_at is None else finished_at
    draft = Receipt(
        deal_id=deal_id,
        task_index=task_index,
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
        deadline=deadline,
        amount=0,
        prev_receipt_hash=prev,
    )
    return replace(draft, amount=price_receipt(plan, draft))


def ack(deal_id: int, task_index: int, *, deadline: int, price: int = 500) -> Ack:
    """Return an unsigned ack."""
    return Ack(
        deal_id=deal_id,
        task_index=task_index,
        request_hash=os.urandom(32),
        deadline=deadline,
        price=price,
    )


def voucher(deal_id: int, amount: int, tasks: list[int]) -> Voucher:
    """Return an unsigned voucher covering `tasks`."""
    return Voucher(deal_id=deal_id, cumulative_amount=amount, tasks=task_bitmap(tasks))
