"""EIP-712 digests equal the contract's and eth-account's; plan pricing equals Solidity's."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils.crypto import keccak
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import typed_data
from contracts.binding import Chain
from contracts.errors import SignatureError
from contracts.messages import (
    SECP256K1_N,
    Ack,
    Plan,
    Quote,
    Receipt,
    TaskRequest,
    Voucher,
    address_of,
    recover_digest,
    task_bitmap,
    verify,
)
from contracts.pricing import plan_is_valid, price

from .conftest import World

u = st.integers
bps = u(0, 10_000)
plans = st.builds(
    Plan,
    price_per_device_ms=u(0, 2**64 - 1),
    compile_price=u(0, 2**64 - 1),
    inference_price=u(0, 2**64 - 1),
    reservation_fee=u(0, 2**64 - 1),
    reserved_discount_bps=bps,
    cache_hit_discount_bps=bps,
    tier1_from_task=u(0, 2**32 - 1),
    tier1_discount_bps=bps,
    tier2_from_task=u(0, 2**32 - 1),
    tier2_discount_bps=bps,
    outcome_based=st.booleans(),
)
addresses = st.binary(min_size=20, max_size=20).map(lambda b: "0x" + b.hex())
hashes = st.binary(min_size=32, max_size=32)
u64, u32, u256 = u(0, 2**64 - 1), u(0, 2**32 - 1), u(0, 2**256 - 1)
quotes = st.builds(
    Quote,
    provider=addresses,
    client=addresses,
    arbiter=addresses,
    max_spend=u256,
    stake=u256,
    penalty=u256,
    duration=u64,
    challenge_window=u64,
    slo_ms=u64,
    valid_until=u64,
    nonce=u256,
    plan=plans,
)
requests = st.builds(
    TaskRequest,
    deal_id=u256,
    task_index=u32,
    kind=u(0, 255),
    program_hash=hashes,
    input_hash=hashes,
    max_price=u256,
    deadline=u64,
)
acks = st.builds(Ack, deal_id=u256, task_index=u32, request_hash=hashes, price=u256)
receipts = st.builds(
    Receipt,
    deal_id=u256,
    task_index=u32,
    kind=u(0, 255),
    status=u(0, 255),
    cache_hit=st.booleans(),
    device_ms=u64,
    compile_ms=u64,
    program_hash=hashes,
    input_hash=hashes,
    output_hash=hashes,
    started_at=u64,
    finished_at=u64,
    deadline=u64,
    amount=u256,
    prev_receipt_hash=hashes,
)
vouchers = st.builds(
    Voucher, deal_id=u256, cumulative_amount=u256, tasks=st.lists(u256, max_size=4).map(tuple)
)
messages = st.one_of(quotes, requests, acks, receipts, vouchers)
chain_settings = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@chain_settings
@given(message=messages)
def test_digest_equals_contract_and_typed_data_encoder(deployed: World, message: object) -> None:
    assert isinstance(message, Quote | TaskRequest | Ack | Receipt | Voucher)
    domain = deployed.escrow.domain
    ours = message.digest(domain)
    assert ours == deployed.escrow.digest(message)
    encoded = encode_typed_data(
        domain.as_dict(), message.typed_data_types(), message.as_typed_data()
    )
    key = deployed.clients[0]
    assert Account.sign_message(encoded, key).signature == message.sign(domain, key)


@chain_settings
@given(message=messages)
def test_published_typed_data_schema_signs_what_the_contract_verifies(
    deployed: World, message: object
) -> None:
    # A wallet that knows only the served schema (GET /v1/typed-data, as JSON) and the message's
    # fields signs the digest the escrow computes: the schema gives each message its whole
    # `eth_signTypedData_v4` request but the message.
    assert isinstance(message, Quote | TaskRequest | Ack | Receipt | Voucher)
    domain = deployed.escrow.domain
    served = json.loads(json.dumps(typed_data.schema(domain)))
    assert served["types"] == typed_data.shipped()["types"]
    assert served["messages"][message.TYPE_NAME]["signer"] in ("client", "provider")
    full = typed_data.full_message(served, message.TYPE_NAME, wallet_values(message))
    key = deployed.providers[0]
    signed = Account.sign_message(encode_typed_data(full_message=full), key)
    assert signed.message_hash == deployed.escrow.digest(message)
    assert recover_digest(deployed.escrow.digest(message), signed.signature) == address_of(key)


SIGNED_MESSAGES: dict[str, st.SearchStrategy[Any]] = {
    "Quote": quotes,
    "TaskRequest": requests,
    "Ack": acks,
    "Receipt": receipts,
    "Voucher": vouchers,
}


def test_typed_data_json_publishes_every_signed_message_whole() -> None:
    shipped = json.loads(typed_data.SCHEMA_FILE.read_text())
    assert sorted(shipped["messages"]) == sorted(SIGNED_MESSAGES)
    for name, entry in shipped["messages"].items():
        request = entry["typedData"]
        assert request["primaryType"] == name
        assert request["domain"] == {"name": "ComputeEscrow", "version": "2"}
        assert shipped["domainToFill"] == ["chainId", "verifyingContract"]
        types = request["types"]
        assert types["EIP712Domain"] == shipped["types"]["EIP712Domain"]
        referred = {f["type"] for fields in types.values() for f in fields} & set(types)
        assert set(types) - referred == {"EIP712Domain", name}  # the primary type, found alone
        assert all(types[t] == shipped["types"][t] for t in types)


@pytest.mark.parametrize("name", sorted(SIGNED_MESSAGES))
@settings(chain_settings, max_examples=15)
@given(data=st.data())
def test_every_signed_message_signs_from_the_typed_data_json_alone(
    deployed: World, name: str, data: st.DataObject
) -> None:
    # For each signed message: the shipped file (and the served schema), parsed as JSON, plus
    # the message's values and the escrow's chain id and address give eth-account the digest
    # our encoder computes and the escrow's own view returns.
    message = data.draw(SIGNED_MESSAGES[name])
    domain = deployed.escrow.domain
    values = wallet_values(message)
    shipped = json.loads(typed_data.SCHEMA_FILE.read_text())
    served = json.loads(json.dumps(typed_data.schema(domain)))
    from_file = typed_data.full_message(
        shipped,
        name,
        values,
        chainId=domain.chain_id,
        verifyingContract=domain.verifying_contract,
    )
    from_server = typed_data.full_message(served, name, values)
    ours, on_chain = message.digest(domain), deployed.escrow.digest(message)
    assert ours == on_chain
    for full in (from_file, from_server):
        signable = encode_typed_data(full_message=json.loads(json.dumps(full)))
        digest = keccak(b"\x19" + signable.version + signable.header + signable.body)
        assert digest == ours


def wallet_values(message: Quote | TaskRequest | Ack | Receipt | Voucher) -> dict[str, Any]:
    """Return the message's typed-data fields as a wallet gets them in JSON (bytes as 0x-hex)."""
    text = json.dumps(message.as_typed_data(), default=lambda b: "0x" + bytes(b).hex())
    values: dict[str, Any] = json.loads(text)
    return values


@chain_settings
@given(plan=plans)
def test_plan_hash_equals_contract(deployed: World, plan: Plan) -> None:
    assert plan.struct_hash() == deployed.escrow.plan_hash(plan)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=plans,
    kind=u(0, 1),
    status=u(0, 10),
    cache_hit=st.booleans(),
    device_ms=u64,
    task_index=u32,
)
def test_price_equals_contract_for_any_usage(
    deployed: World,
    plan: Plan,
    kind: int,
    status: int,
    cache_hit: bool,
    device_ms: int,
    task_index: int,
) -> None:
    usage: dict[str, Any] = {
        "kind": kind,
        "status": status,
        "cache_hit": cache_hit,
        "device_ms": device_ms,
        "task_index": task_index,
    }
    assert price(plan, **usage) == deployed.escrow.price(plan, **usage)


@given(plan=plans)
def test_plan_validity_matches_contract_rule(plan: Plan) -> None:
    discounts_ok = max(plan.reserved_discount_bps, plan.cache_hit_discount_bps) <= 10_000
    tiers_ok = not (
        plan.tier1_from_task
        and plan.tier2_from_task
        and plan.tier2_from_task <= plan.tier1_from_task
    )
    assert plan_is_valid(plan) == (discounts_ok and tiers_ok)


def test_json_round_trip_keeps_every_message() -> None:
    r = Receipt(
        1,
        2,
        1,
        0,
        True,
        3,
        4,
        os.urandom(32),
        os.urandom(32),
        os.urandom(32),
        5,
        6,
        7,
        8,
        os.urandom(32),
    )
    q = Quote(
        address_of(os.urandom(32)),
        "0x" + "00" * 20,
        address_of(os.urandom(32)),
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        8,
        Plan(1, 2),
    )
    v = Voucher(1, 2, task_bitmap([0, 9, 700]))
    request = r.request(max_price=99)
    a = Ack(1, 2, request.struct_hash(), 3)
    for message in (r, q, v, request, a):
        assert type(message).from_json(message.to_json()) == message


def test_from_json_when_field_missing_or_out_of_range_then_rejects() -> None:
    good = Ack(1, 2, b"\x00" * 32, 3).to_json()
    with pytest.raises(ValueError, match="lacks field"):
        Ack.from_json({k: v for k, v in good.items() if k != "price"})
    with pytest.raises(ValueError, match="does not fit"):
        Ack.from_json({**good, "task_index": 2**32})


def test_sign_then_recover_and_verify() -> None:
    key = "0x" + os.urandom(32).hex()
    from contracts.messages import Domain

    domain = Domain(chain_id=5, verifying_contract="0x" + "11" * 20)
    ack = Ack(1, 2, b"\x01" * 32, 3)
    sig = ack.sign(domain, key)
    assert verify(ack, domain, sig, address_of(key)) is ack
    with pytest.raises(SignatureError):
        verify(
            ack,
            Domain(chain_id=6, verifying_contract=domain.verifying_contract),
            sig,
            address_of(key),
        )


def test_recover_when_signature_is_malleable_or_malformed_then_rejects() -> None:
    key = "0x" + os.urandom(32).hex()
    digest = os.urandom(32)
    from contracts.messages import sign_digest

    sig = sign_digest(digest, key)
    high_s = (SECP256K1_N - int.from_bytes(sig[32:64], "big")).to_bytes(32, "big")
    with pytest.raises(SignatureError, match="malleable"):
        recover_digest(digest, sig[:32] + high_s + bytes([55 - sig[64]]))
    with pytest.raises(SignatureError, match="65 bytes"):
        recover_digest(digest, sig[:64])
    with pytest.raises(SignatureError, match="v must be"):
        recover_digest(digest, sig[:64] + b"\x01")


def test_task_bitmap_marks_each_index() -> None:
    v = Voucher(1, 1, task_bitmap([0, 255, 256, 1000]))
    assert [i for i in range(1100) if v.covers(i)] == [0, 255, 256, 1000]
    assert task_bitmap([]) == ()


def test_chain_binding_rejects_unreachable_rpc() -> None:
    from contracts.errors import ChainError

    with pytest.raises(ChainError):
        Chain("http://127.0.0.1:9")
