"""Cooperative payment: cumulative client vouchers redeemed by the provider."""

from __future__ import annotations

from typing import Any

import pytest

from contracts import reverts
from contracts.binding import TASK_CLAIMED, TASK_NONE, TASK_VOUCHED
from contracts.messages import Voucher, address_of
from provider.journal import AckRecord, DealBook, ReceiptRecord
from provider.receipts import cap_free

from .builders import (
    WINDOW,
    SignedTask,
    bits,
    claim,
    open_deal,
    redeem,
    refund,
    signed_task,
    voucher,
)
from .conftest import World


def _redeem(world: World, v: Voucher, signer: str, sender: str | None = None) -> int:
    sig = v.sign(world.escrow.domain, signer)
    result = world.escrow.redeem_voucher(sender or world.providers[0], v, sig)
    return int(result.event("VoucherRedeemed").args["paid"])


def test_redeem_when_voucher_is_fresh_then_pays_provider_and_marks_tasks(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    assert _redeem(world, voucher(deal_id, 1_500, [0, 1, 2]), client) == 1_500
    assert world.escrow.balance_of(address_of(provider)) == 1_500
    deal = world.escrow.get_deal(deal_id)
    assert (deal.vouched, deal.committed) == (1_500, 1_500)
    assert [world.escrow.task_status(deal_id, i) for i in range(4)] == [TASK_VOUCHED] * 3 + [
        TASK_NONE
    ]


def test_redeem_when_later_voucher_then_pays_only_the_increase(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    _redeem(world, voucher(deal_id, 1_000, [0, 1]), client)
    assert _redeem(world, voucher(deal_id, 2_600, [0, 1, 2, 300]), client) == 1_600
    assert world.escrow.balance_of(address_of(provider)) == 2_600
    assert world.escrow.task_status(deal_id, 300) == TASK_VOUCHED


@pytest.mark.parametrize("amount", [1_000, 999])
def test_redeem_when_voucher_is_stale_then_rejects(world: World, amount: int) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    _redeem(world, voucher(deal_id, 1_000, [0, 1]), client)
    with pytest.raises(reverts.EscrowStaleVoucher):
        _redeem(world, voucher(deal_id, amount, [0, 1]), client)
    assert world.escrow.balance_of(address_of(provider)) == 1_000


def test_redeem_when_signed_by_someone_else_then_rejects(world: World) -> None:
    deal_id, _ = open_deal(world, world.clients[0], world.providers[0])
    with pytest.raises(reverts.EscrowInvalidSignature):
        _redeem(world, voucher(deal_id, 1_000, [0]), world.stranger)


def test_redeem_when_voucher_from_other_deal_then_rejects(world: World) -> None:
    client = world.clients[0]
    deal_a, _ = open_deal(world, client, world.providers[0])
    deal_b, _ = open_deal(world, client, world.providers[1])
    signed_for_a = voucher(deal_a, 1_000, [0])
    sig = signed_for_a.sign(world.escrow.domain, client)
    replayed = Voucher(deal_id=deal_b, cumulative_amount=1_000, tasks=signed_for_a.tasks)
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.redeem_voucher(world.providers[1], replayed, sig)


def test_redeem_when_voucher_from_other_escrow_then_rejects(world: World) -> None:
    client = world.clients[0]
    deal_id, _ = open_deal(world, client, world.providers[0])
    other = world.chain.escrow(world.chain.deploy(world.deployer).escrow)
    v = voucher(deal_id, 1_000, [0])
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.redeem_voucher(world.providers[0], v, v.sign(other.domain, client))


def test_redeem_when_amount_passes_cap_then_rejects(world: World) -> None:
    client = world.clients[0]
    deal_id, _ = open_deal(world, client, world.providers[0], max_spend=5_000)
    with pytest.raises(reverts.EscrowCapExceeded) as info:
        _redeem(world, voucher(deal_id, 5_001, [0]), client)
    assert info.value.error_args["cap"] == 5_000


def test_redeem_when_voucher_covers_refunded_task_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    task = signed_task(world, deal_id, 3, client, provider, deadline=world.now() + 5)
    world.anvil.increase_time(5 + WINDOW + 1)
    refund(world, client, task)
    with pytest.raises(reverts.EscrowTaskAlreadySettled) as info:
        _redeem(world, voucher(deal_id, 1_000, [0, 3]), client)
    assert info.value.error_args["taskIndex"] == 3


def test_redeem_when_voucher_covers_claimed_task_then_rejects(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    claim(world, provider, deal_id, [signed_task(world, deal_id, 7, client, provider)])
    assert world.escrow.task_status(deal_id, 7) == TASK_CLAIMED
    with pytest.raises(reverts.EscrowTaskAlreadySettled):
        _redeem(world, voucher(deal_id, 1_000, [7]), client)


def test_redeem_when_bitmap_longer_than_task_limit_then_rejects(world: World) -> None:
    client = world.clients[0]
    deal_id, _ = open_deal(world, client, world.providers[0])
    v = Voucher(deal_id=deal_id, cumulative_amount=1, tasks=(0,) * 256 + (1,))
    with pytest.raises(reverts.EscrowTaskIndexTooLarge):
        _redeem(world, v, client)


def test_redeem_when_deal_unknown_then_rejects(world: World) -> None:
    with pytest.raises(reverts.EscrowDealNotFound):
        _redeem(world, voucher(42, 1, [0]), world.clients[0])


@pytest.mark.parametrize("who", ["client", "arbiter", "stranger"])
def test_redeem_when_sender_is_not_the_provider_then_rejects(world: World, who: str) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    sender = {"client": client, "arbiter": world.arbiter, "stranger": world.stranger}[who]
    with pytest.raises(reverts.EscrowUnauthorized) as info:
        _redeem(world, voucher(deal_id, 700, [0]), client, sender=sender)
    assert info.value.error_args == {"account": address_of(sender)}
    assert world.escrow.task_status(deal_id, 0) == TASK_NONE
    assert world.escrow.get_deal(deal_id).committed == 0


def test_redeem_event_lists_exactly_the_newly_paid_tasks(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    first = redeem_event(world, client, provider, voucher(deal_id, 1_000, [0, 1, 300]))
    assert bits(first["newTasks"]) == [0, 1, 300]
    assert (first["cumulativeAmount"], first["paid"]) == (1_000, 1_000)
    # A later voucher repeats tasks 0, 1 and 300 (cumulative) and adds 2 and 511.
    later = redeem_event(world, client, provider, voucher(deal_id, 1_900, [0, 1, 2, 300, 511]))
    assert bits(later["newTasks"]) == [2, 511]
    assert len(later["newTasks"]) == 2  # one word per word of the voucher's bitmap
    assert (later["cumulativeAmount"], later["paid"]) == (1_900, 900)
    # A voucher that raises the amount but covers no new task pays nothing per task.
    same = redeem_event(world, client, provider, voucher(deal_id, 2_000, [0, 1]))
    assert bits(same["newTasks"]) == [] and same["paid"] == 100


def redeem_event(world: World, client: str, provider: str, v: Voucher) -> dict[str, Any]:
    """Redeem `v` and return its VoucherRedeemed event's arguments."""
    sig = v.sign(world.escrow.domain, client)
    return dict(world.escrow.redeem_voucher(provider, v, sig).event("VoucherRedeemed").args)


def test_voucher_that_overpays_is_refused_by_the_provider_who_is_then_paid_in_full(
    world: World,
) -> None:
    # Cap 1,000, two delivered tasks of 500, and a client voucher of 650 for the first (a 150
    # tip). The escrow cannot tell a tip from a payment: it pays a voucher's increase and the
    # claims from one cap. Redeemed, the tip leaves 350 for the claim of the second task.
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider, max_spend=1_000)
    first, second = (
        signed_task(world, deal_id, i, client, provider, max_price=500, device_ms=0) for i in (0, 1)
    )
    assert first.receipt.amount == second.receipt.amount == 500
    tip = voucher(deal_id, 650, [0])
    what_if = world.anvil.snapshot()
    redeem(world, client, provider, tip)
    with pytest.raises(reverts.EscrowCapExceeded) as info:
        claim(world, provider, deal_id, [second])
    assert info.value.error_args == {"dealId": deal_id, "cap": 1_000, "needed": 1_150}
    assert world.escrow.balance_of(address_of(provider)) == 650  # of the 1,000 delivered
    world.anvil.revert(what_if)
    world.chain.tx.reset_nonces()

    # So the provider's daemon keeps the cap covering every acked task it has not settled
    # (provider.receipts.cap_free): the tip voucher leaves it 150 short and is refused, a
    # voucher paying exactly the first receipt is taken.
    book = deal_book(first, second)
    assert cap_free(book, tip, max_spend=1_000, reservation_fee=0) == -150
    assert cap_free(book, voucher(deal_id, 500, [0]), max_spend=1_000, reservation_fee=0) == 0

    # The client goes silent: the provider claims both tasks and is paid in full.
    claimed = claim(world, provider, deal_id, [first, second]).event("ReceiptsClaimed").args
    world.anvil.increase_time(WINDOW + 1)
    world.escrow.finalize_claim(provider, deal_id, int(claimed["batchId"]))
    assert world.escrow.balance_of(address_of(provider)) == 1_000


def deal_book(*tasks: SignedTask) -> DealBook:
    """Return the provider's journal view of a deal whose `tasks` were acked and delivered."""
    acks = {
        t.index: AckRecord(
            request=t.request,
            request_sig=t.request_sig,
            request_hash=t.request.struct_hash(),
            target=None,
            ack=t.ack,
            ack_sig=t.ack_sig,
            acked_at=0.0,
        )
        for t in tasks
    }
    receipts = {
        t.index: ReceiptRecord(t.receipt, b"", t.receipt.struct_hash(), {}, seq=t.index)
        for t in tasks
    }
    return DealBook(
        acks=acks,
        receipts=receipts,
        vouchers=[],
        settlements=[],
        ack_total=sum(t.ack.price for t in tasks),
    )
