"""The settle-by rule is written once per language: `contracts.settle_by` (used by the daemon and
the SDK) and the escrow's `_settleBy`; they agree on the deployed contract, for deadlines before,
at and past the deal's expiry, and at the instant's both edges."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from client import tasks
from contracts import reverts
from contracts.settle_by import settle_by
from provider import receipts

from .builders import WINDOW, claim, open_deal, refund, signed_task
from .conftest import World

ESCROW_SOURCE = Path(__file__).resolve().parents[2] / "contracts" / "sol" / "ComputeEscrow.sol"


def test_the_daemon_and_the_sdk_use_the_one_python_copy() -> None:
    assert receipts.settle_by is settle_by
    assert tasks.settle_by is settle_by
    assert inspect.getmodule(settle_by).__name__ == "contracts.settle_by"  # type: ignore[union-attr]
    # the Solidity copy still reads as this rule (the parity tests below run it)
    body = re.search(r"function _settleBy\([^)]*\)[^{]*\{([^}]*)\}", ESCROW_SOURCE.read_text())
    assert body is not None, "ComputeEscrow.sol lost _settleBy: update contracts/settle_by.py"
    rule = "return (deadline < expiry ? deadline : expiry) + window;"
    assert " ".join(body.group(1).split()) == rule, "the escrow's _settleBy changed: follow it"


@pytest.mark.parametrize("offset", [-3_000, -1, 0, 1, 10_000], ids=lambda o: f"expiry{o:+}")
def test_refund_refused_until_the_instant_python_computes(world: World, offset: int) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    expiry = world.escrow.get_deal(deal_id).expiry
    deadline = expiry + offset
    task = signed_task(
        world, deal_id, 0, client, provider, deadline=deadline, finished_at=world.now()
    )
    with pytest.raises(reverts.EscrowDeadlineNotPassed) as refused:
        refund(world, client, task)
    assert refused.value.error_args == {"refundableAt": settle_by(deadline, expiry, WINDOW)}


def test_claim_lands_at_the_instant_and_not_a_second_later_past_expiry(
    exact_clock: World,
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    expiry = world.escrow.get_deal(deal_id).expiry
    deadline = expiry + 500  # the deadline counts only up to the expiry
    first, second = (
        signed_task(world, deal_id, i, client, provider, deadline=deadline, finished_at=world.now())
        for i in (0, 1)
    )
    instant = settle_by(deadline, expiry, WINDOW)
    assert instant == expiry + WINDOW
    world.next_at(instant)
    claim(world, provider, deal_id, [first])  # lands at the instant: the last second allowed
    with pytest.raises(reverts.EscrowClaimPeriodOver) as late:
        claim(world, provider, deal_id, [second])  # the instant + 1
    assert late.value.error_args == {"taskIndex": 1, "settleBy": instant}
