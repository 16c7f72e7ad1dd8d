"""Volume tiers by count: the n-th task the provider acks in a deal is priced at the plan's
tier for n, the same in Solidity and in `contracts.pricing`.

The escrow prices by task index; the provider's daemon acks indexes only in order and with no
gaps (index n is its n-th ack), so index and count cannot diverge. These properties check that
the Python price equals the escrow's `price` view for random plans, usages and index sequences
(in order, with gaps, descending, at the range's edge), and that in order the n-th task gets
tier n's discount and no deeper one.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.messages import KIND_COMPILE, STATUS_SUCCESS, Plan
from contracts.pricing import BPS, plan_is_valid, price

from .conftest import World

MAX_TASKS = 65_536
bps = st.integers(0, BPS)
small_or_any = st.integers(0, 12) | st.integers(0, 2**32 - 1)
plans = st.builds(
    Plan,
    price_per_device_ms=st.integers(0, 2**64 - 1) | st.integers(0, 10),
    compile_price=st.integers(0, 2**64 - 1) | st.integers(0, 10_000),
    inference_price=st.integers(0, 2**64 - 1) | st.integers(0, 10_000),
    reservation_fee=st.just(0),
    reserved_discount_bps=bps,
    cache_hit_discount_bps=bps,
    tier1_from_task=small_or_any,
    tier1_discount_bps=bps,
    tier2_from_task=small_or_any,
    tier2_discount_bps=bps,
    outcome_based=st.booleans(),
).filter(plan_is_valid)
usages = st.fixed_dictionaries(
    {
        "kind": st.integers(0, 1),
        "status": st.sampled_from([STATUS_SUCCESS, 3, 6]),
        "cache_hit": st.booleans(),
        "device_ms": st.integers(0, 2**64 - 1) | st.integers(0, 1_000),
    }
)
in_order = st.integers(1, 16).map(lambda n: list(range(n)))
any_order = st.lists(
    st.integers(0, 40) | st.sampled_from([MAX_TASKS - 1, MAX_TASKS, 2**32 - 1]),
    min_size=1,
    max_size=16,
)
chain_settings = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _escrow_prices(world: World, plan: Plan, priced: list[tuple[dict[str, Any], int]]) -> list[int]:
    calls = [
        (
            "price",
            (
                plan.as_args(),
                u["kind"],
                u["status"],
                u["cache_hit"],
                u["device_ms"],
                index,
            ),
        )
        for u, index in priced
    ]
    return [int(p) for p in world.escrow.read_many(calls)]


@chain_settings
@given(plan=plans, data=st.data())
def test_python_price_equals_the_escrows_for_any_index_sequence(
    deployed: World, plan: Plan, data: st.DataObject
) -> None:
    indexes = data.draw(in_order | any_order)
    priced: list[tuple[dict[str, Any], int]] = [(data.draw(usages), index) for index in indexes]
    ours = [price(plan, task_index=index, **usage) for usage, index in priced]
    assert ours == _escrow_prices(deployed, plan, priced)


@given(plan=plans, usage=usages, count=st.integers(1, 40))
def test_in_order_the_nth_task_gets_tier_n_and_no_deeper_one(
    plan: Plan, usage: dict[str, Any], count: int
) -> None:
    undiscounted = replace_tiers(plan)
    for n in range(count):
        if plan.outcome_based and usage["kind"] == KIND_COMPILE and usage["status"]:
            assert price(plan, task_index=n, **usage) == 0
            continue
        base = price(undiscounted, task_index=n, **usage)
        tier = tier_of(plan, n)
        tiered = replace_tiers(plan, tier1_from_task=1, tier1_discount_bps=tier) if tier else None
        expected = price(tiered, task_index=n, **usage) if tiered else base
        assert price(plan, task_index=n, **usage) == expected


def tier_of(plan: Plan, n: int) -> int:
    """Return the discount (bps) the plan gives its n-th task (0-based count): the deepest tier
    whose first task is at most n."""
    if plan.tier2_from_task and n >= plan.tier2_from_task:
        return plan.tier2_discount_bps
    if plan.tier1_from_task and n >= plan.tier1_from_task:
        return plan.tier1_discount_bps
    return 0


def replace_tiers(plan: Plan, **tiers: int) -> Plan:
    """Return `plan` with no volume tier, or with the given tier fields."""
    fields = {
        "tier1_from_task": 0,
        "tier1_discount_bps": 0,
        "tier2_from_task": 0,
        "tier2_discount_bps": 0,
        **tiers,
    }
    return Plan(**{**plan.__dict__, **fields})
