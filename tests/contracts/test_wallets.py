"""ERC-1271: smart-contract wallets as client or provider, and wallets that say no."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from contracts import reverts
from contracts.binding import TASK_CLAIMED, TASK_REFUNDED, TASK_VOUCHED
from contracts.messages import address_of

from .builders import DEFAULT_PLAN, WINDOW, claim, quote, signed_task, voucher
from .conftest import World
from .wallet import Wallet

FUNDS = 10**9


@pytest.fixture
def wallet(world: World) -> Iterator[Wallet]:
    """A funded wallet whose owner key is fresh, with the escrow approved for its tokens."""
    owner = world.anvil.new_funded_key()
    wallet = Wallet.deploy(owner, world.escrow, world.token)
    world.token.mint(world.deployer, wallet.address, FUNDS)
    wallet.call(world.token, "approve", world.escrow.address, 2**256 - 1)
    yield wallet


def _wallet_client_deal(world: World, wallet: Wallet) -> int:
    provider = world.providers[0]
    wallet.call(world.escrow, "deposit", 10**6)
    world.escrow.stake(provider, 10**6)
    q = replace(quote(world, provider, wallet.owner, max_spend=10**6), client=wallet.address)
    sig = q.sign(world.escrow.domain, provider)
    result = wallet.call(world.escrow, "openDeal", q.as_args(), sig, 10**6)
    opened = result.event("DealOpened").args
    assert opened["client"] == wallet.address
    return int(opened["dealId"])


def test_wallet_client_signs_requests_and_vouchers_the_escrow_accepts(
    world: World, wallet: Wallet
) -> None:
    provider = world.providers[0]
    deal_id = _wallet_client_deal(world, wallet)
    deadline = world.now() + 10
    # The owner's key signs for the wallet; the escrow asks the wallet (ERC-1271).
    claimed, vouched, breached = (
        signed_task(world, deal_id, i, wallet.owner, provider, deadline=deadline) for i in range(3)
    )
    claim(world, provider, deal_id, [claimed])
    v = voucher(deal_id, vouched.receipt.amount, [1])
    world.escrow.redeem_voucher(provider, v, v.sign(world.escrow.domain, wallet.owner))
    world.anvil.increase_time(10 + WINDOW + 1)
    refunded = wallet.call(
        world.escrow,
        "refundBreach",
        breached.request.as_args(),
        breached.ack.as_args(),
        breached.ack_sig,
    )
    assert refunded.event("BreachRefunded").args["taskIndex"] == 2
    assert [world.escrow.task_status(deal_id, i) for i in range(3)] == [
        TASK_CLAIMED,
        TASK_VOUCHED,
        TASK_REFUNDED,
    ]
    assert world.escrow.balance_of(wallet.address) == breached.ack.price + 50_000


def test_wallet_that_says_no_is_refused_and_voids_what_it_signed(
    world: World, wallet: Wallet
) -> None:
    provider = world.providers[0]
    deal_id = _wallet_client_deal(world, wallet)
    task = signed_task(world, deal_id, 0, wallet.owner, provider)
    v = voucher(deal_id, task.receipt.amount, [0])
    v_sig = v.sign(world.escrow.domain, wallet.owner)
    # Signed by a key that is not the wallet's owner: refused even while the wallet accepts.
    stranger_signed = signed_task(world, deal_id, 1, world.stranger, provider)
    with pytest.raises(reverts.EscrowInvalidSignature) as info:
        claim(world, provider, deal_id, [stranger_signed])
    assert info.value.error_args == {"expectedSigner": wallet.address}
    # A wallet that stops accepting voids the signatures it gave before: the owner's signature
    # recovers to the owner, not to the wallet, so the escrow asks the wallet (ERC-1271) each
    # time. A true contract wallet's are the only signatures its signer can withdraw
    # (docs/settlement.md; an account delegating with EIP-7702 cannot: test_delegation.py).
    wallet.set_accepting(False)
    with pytest.raises(reverts.EscrowInvalidSignature):
        claim(world, provider, deal_id, [task])
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.redeem_voucher(provider, v, v_sig)
    wallet.set_accepting(True)
    world.escrow.redeem_voucher(provider, v, v_sig)
    assert world.escrow.balance_of(address_of(provider)) == task.receipt.amount


def test_wallet_provider_signs_quotes_and_acks_the_escrow_accepts(
    world: World, wallet: Wallet
) -> None:
    client = world.clients[0]
    wallet.call(world.escrow, "stake", 10**6)
    world.escrow.deposit(client, 10**6)
    q = replace(quote(world, wallet.owner, client, max_spend=10**6), provider=wallet.address)
    sig = q.sign(world.escrow.domain, wallet.owner)
    wallet.set_accepting(False)
    with pytest.raises(reverts.EscrowInvalidSignature) as info:
        world.escrow.open_deal(client, q, sig, 10**6)
    assert info.value.error_args == {"expectedSigner": wallet.address}
    wallet.set_accepting(True)
    opened = world.escrow.open_deal(client, q, sig, 10**6).event("DealOpened").args
    assert opened["provider"] == wallet.address
    deal_id = opened["dealId"]
    task = signed_task(world, deal_id, 0, client, wallet.owner, deadline=world.now() + 5)
    paid = wallet.call(
        world.escrow, "claimReceipts", deal_id, DEFAULT_PLAN.as_args(), [task.claim().as_args()]
    )
    assert list(paid.event("ReceiptsClaimed").args["taskIndexes"]) == [0]
    breached = signed_task(world, deal_id, 1, client, wallet.owner, deadline=world.now() + 5)
    world.anvil.increase_time(5 + WINDOW + 1)
    result = world.escrow.refund_breach(client, breached.request, breached.ack, breached.ack_sig)
    assert result.event("BreachRefunded").args["penalty"] == q.penalty
