"""Plan pricing, the exact mirror of `contracts/sol/libraries/PlanPricing.sol`.

Integer arithmetic in the same order as Solidity, so Python's price equals the contract's for
any usage (a property test checks it against the deployed contract).
"""

from __future__ import annotations

from dataclasses import replace

from contracts.messages import KIND_COMPILE, STATUS_SUCCESS, Plan, Receipt

BPS = 10_000


def plan_is_valid(plan: Plan) -> bool:
    """Return whether every discount is at most 100% and the volume tiers are ordered."""
    discounts = (
        plan.reserved_discount_bps,
        plan.cache_hit_discount_bps,
        plan.tier1_discount_bps,
        plan.tier2_discount_bps,
    )
    tiers_ordered = (
        plan.tier2_from_task == 0
        or plan.tier1_from_task == 0
        or plan.tier2_from_task > plan.tier1_from_task
    )
    return all(d <= BPS for d in discounts) and tiers_ordered


def price(
    plan: Plan,
    *,
    kind: int,
    status: int,
    cache_hit: bool,
    device_ms: int,
    task_index: int,
) -> int:
    """Price one task: flat part by kind plus metered part, then the discounts in order."""
    if plan.outcome_based and kind == KIND_COMPILE and status != STATUS_SUCCESS:
        return 0
    flat = plan.compile_price if kind == KIND_COMPILE else plan.inference_price
    amount = flat + plan.price_per_device_ms * device_ms
    if plan.tier2_from_task != 0 and task_index >= plan.tier2_from_task:
        amount = amount * (BPS - plan.tier2_discount_bps) // BPS
    elif plan.tier1_from_task != 0 and task_index >= plan.tier1_from_task:
        amount = amount * (BPS - plan.tier1_discount_bps) // BPS
    if cache_hit:
        amount = amount * (BPS - plan.cache_hit_discount_bps) // BPS
    return amount * (BPS - plan.reserved_discount_bps) // BPS


def locked_stake(quote_stake: int, quote_max_spend: int, max_spend: int) -> int:
    """Return the stake a deal opened for `max_spend` locks under a quote of `quote_stake` for
    `quote_max_spend`: ceil(quote_stake * max_spend / quote_max_spend), as `openDeal` locks it.

    Raise ValueError where the escrow reverts: a spend above the quote's, or a stake or spend
    past 128 bits.
    """
    if max_spend > quote_max_spend:
        raise ValueError(f"max_spend {max_spend} is above the quote's {quote_max_spend}")
    if quote_stake >= 2**128 or max_spend >= 2**128:
        raise ValueError("stake and max_spend must be below 2**128")
    product = quote_stake * max_spend
    return 0 if product == 0 else (product - 1) // quote_max_spend + 1


def price_receipt(plan: Plan, receipt: Receipt) -> int:
    """Return the plan's price for the usage a receipt reports."""
    return price(
        plan,
        kind=receipt.kind,
        status=receipt.status,
        cache_hit=receipt.cache_hit,
        device_ms=receipt.device_ms,
        task_index=receipt.task_index,
    )


def metered(price_per_device_ms: int) -> Plan:
    """Return a plan that charges per device-millisecond."""
    return Plan(price_per_device_ms=price_per_device_ms)


def flat(*, compile_price: int, inference_price: int) -> Plan:
    """Return a plan with a flat price per task by kind."""
    return Plan(compile_price=compile_price, inference_price=inference_price)


def outcome_based(*, compile_price: int, inference_price: int) -> Plan:
    """Return a flat plan where a failed compile costs nothing."""
    return Plan(compile_price=compile_price, inference_price=inference_price, outcome_based=True)


def tiered(base: Plan, *, tiers: tuple[tuple[int, int], ...]) -> Plan:
    """Return `base` with up to two volume tiers, each (from task index, discount bps)."""
    if len(tiers) > 2:
        raise ValueError("at most two volume tiers")
    (t1, d1), (t2, d2) = (*tiers, (0, 0), (0, 0))[:2]
    return _replace(
        base, tier1_from_task=t1, tier1_discount_bps=d1, tier2_from_task=t2, tier2_discount_bps=d2
    )


def with_cache_discount(base: Plan, discount_bps: int) -> Plan:
    """Return `base` with a discount on tasks that hit the compile cache."""
    return _replace(base, cache_hit_discount_bps=discount_bps)


def reserved(base: Plan, *, fee: int, discount_bps: int) -> Plan:
    """Return `base` as a reserved plan: an up-front fee and a discount on every task."""
    return _replace(base, reservation_fee=fee, reserved_discount_bps=discount_bps)


def _replace(plan: Plan, **changes: int) -> Plan:
    return replace(plan, **changes)  # type: ignore[arg-type]
