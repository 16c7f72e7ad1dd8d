"""EIP-7702: an account that delegates its code after signing cannot withdraw what it signed.

Real type-4 transactions on anvil (eth-account signs the authorizations) delegate a client or
a provider to a contract that refuses every ERC-1271 question, to one that burns all the gas it
is given, or to an honest one. The escrow recovers an ECDSA signature first and asks ERC-1271
only when recovery does not give the signer (`contracts/sol/libraries/SignerCheck.sol`), with
a bounded gas stipend. Each `test_attack*` passed in the attacker's favour on the escrow that
asked ERC-1271 first of every address with code.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eth_account import Account
from eth_utils.address import to_checksum_address

from contracts import reverts
from contracts.binding import TASK_CLAIMED, TASK_REFUNDED, TASK_VOUCHED
from contracts.messages import address_of

from .builders import WINDOW, claim, open_deal, refund, settle_by, signed_task, voucher
from .conftest import World
from .delegation import delegate, deploy_delegates

SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
ERC1271_GAS_STIPEND = 50_000  # SignerCheck.ERC1271_GAS_STIPEND


@pytest.fixture
def delegates(world: World) -> Iterator[dict[str, str]]:
    yield deploy_delegates(world)


@pytest.mark.parametrize("target", ["RefusingDelegate", "GasBurningDelegate"])
def test_attack_client_delegating_after_signing_cannot_void_its_voucher_or_requests(
    exact_clock: World, delegates: dict[str, str], target: str
) -> None:
    world = exact_clock
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    deadline = world.now() + 20
    vouched, claimed = (
        signed_task(world, deal_id, i, client, provider, deadline=deadline) for i in (0, 1)
    )
    paid = voucher(deal_id, vouched.receipt.amount, [0])
    paid_sig = paid.sign(world.escrow.domain, client)
    # Both tasks delivered; then the client delegates its account to a contract that says no
    # (or burns gas) and waits for settleBy to refund both with the penalty.
    delegate(world, client, delegates[target])
    world.escrow.redeem_voucher(provider, paid, paid_sig)
    claim(world, provider, deal_id, [claimed])
    world.next_at(settle_by(claimed, world.escrow.get_deal(deal_id).expiry, WINDOW) + 1)
    for task in (vouched, claimed):
        with pytest.raises(reverts.EscrowTaskAlreadySettled):
            refund(world, client, task)
    assert [world.escrow.task_status(deal_id, i) for i in (0, 1)] == [TASK_VOUCHED, TASK_CLAIMED]
    world.escrow.finalize_claim(world.stranger, deal_id, 0)
    owed = vouched.receipt.amount + claimed.receipt.amount
    assert world.escrow.balance_of(address_of(provider)) == owed
    assert world.escrow.balance_of(address_of(client)) == 0


@pytest.mark.parametrize("target", ["RefusingDelegate", "GasBurningDelegate"])
def test_attack_provider_delegating_after_signing_acks_cannot_void_the_clients_refund(
    world: World, delegates: dict[str, str], target: str
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, q = open_deal(world, client, provider)
    breached = signed_task(world, deal_id, 0, client, provider, deadline=world.now() + 10)
    delegate(world, provider, delegates[target])
    world.anvil.increase_time(10 + WINDOW + 1)
    event = refund(world, client, breached).event("BreachRefunded").args
    assert (event["refund"], event["penalty"]) == (breached.ack.price, q.penalty)
    assert world.escrow.task_status(deal_id, 0) == TASK_REFUNDED
    assert world.escrow.balance_of(address_of(client)) == breached.ack.price + q.penalty


def test_attack_gas_burning_delegate_costs_a_refused_signature_at_most_the_stipend(
    world: World, delegates: dict[str, str]
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    delegate(world, client, delegates["GasBurningDelegate"])
    forged = voucher(deal_id, 1_000, [0])
    forged_sig = forged.sign(world.escrow.domain, world.stranger)  # recovers to another key
    with pytest.raises(reverts.EscrowInvalidSignature) as info:
        world.escrow.redeem_voucher(provider, forged, forged_sig)
    assert info.value.error_args == {"expectedSigner": address_of(client)}
    # Sent with a large gas limit anyway: the burner gets the stipend, not the transaction.
    w3 = world.escrow.tx.w3
    tx = {
        "chainId": world.escrow.tx.chain_id,
        "nonce": w3.eth.get_transaction_count(to_checksum_address(address_of(provider))),
        "to": world.escrow.address,
        "data": world.escrow.contract.encode_abi(
            "redeemVoucher", args=[forged.as_args(), forged_sig]
        ),
        "value": 0,
        "gas": 3_000_000,
        "maxFeePerGas": world.escrow.tx.fees(refresh=True)[0],
        "maxPriorityFeePerGas": world.escrow.tx.fees()[1],
    }
    signed = Account.sign_transaction(tx, provider)
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(signed.raw_transaction)
    )
    world.escrow.tx.reset_nonces()
    assert receipt["status"] == 0
    assert receipt["gasUsed"] < ERC1271_GAS_STIPEND + 60_000, receipt["gasUsed"]


def test_honest_delegate_keeps_ecdsa_signatures_and_answers_only_when_recovery_fails(
    world: World, delegates: dict[str, str]
) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    delegate(world, client, delegates["HonestDelegate"])
    paid = voucher(deal_id, 500, [0])
    signature = paid.sign(world.escrow.domain, client)
    # A malleated (high-s) copy of the client's own signature does not pass recovery, so the
    # escrow asks ERC-1271 of the delegated account; the honest delegate accepts it.
    r, s, v = signature[:32], int.from_bytes(signature[32:64], "big"), signature[64]
    high_s = r + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v])
    redeem_high = world.escrow.redeem_voucher(provider, paid, high_s)
    assert redeem_high.event("VoucherRedeemed").args["paid"] == 500
    more = voucher(deal_id, 900, [0, 1])
    world.escrow.redeem_voucher(provider, more, more.sign(world.escrow.domain, client))
    stranger_signed = voucher(deal_id, 1_000, [0, 1, 2])
    with pytest.raises(reverts.EscrowInvalidSignature):
        world.escrow.redeem_voucher(
            provider, stranger_signed, stranger_signed.sign(world.escrow.domain, world.stranger)
        )
    assert world.escrow.balance_of(address_of(provider)) == 900


def test_high_s_signature_of_an_account_without_code_is_refused(world: World) -> None:
    client, provider = world.clients[0], world.providers[0]
    deal_id, _ = open_deal(world, client, provider)
    paid = voucher(deal_id, 500, [0])
    signature = paid.sign(world.escrow.domain, client)
    r, s, v = signature[:32], int.from_bytes(signature[32:64], "big"), signature[64]
    high_s = r + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v])
    for bad in (high_s, signature[:64], signature + b"\x00", b""):
        with pytest.raises(reverts.EscrowInvalidSignature):
            world.escrow.redeem_voucher(provider, paid, bad)
    world.escrow.redeem_voucher(provider, paid, signature)
