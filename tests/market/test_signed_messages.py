"""The market's EIP-712 messages (`contracts/orders.py`): encoding parity and signature rules."""

from __future__ import annotations

from typing import Any

import pytest
from eth_account import Account
from eth_utils.crypto import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.eip712 import attribute, encode_word
from contracts.errors import SignatureError
from contracts.messages import (
    SECP256K1_N,
    Ack,
    Domain,
    Plan,
    Quote,
    Receipt,
    TaskRequest,
    Voucher,
)
from contracts.orders import (
    Ask,
    Bid,
    CancelOrder,
    Heartbeat,
    advert_hash,
    canonical_json,
    digest,
    market_domain,
    plan_kind,
    recover_address,
    struct_hash,
)

from .signing import ESCROW, Trader

DOMAIN = market_domain(31337, ESCROW)
KEY = "0x" + "42" * 32
EIP712_DOMAIN = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]


def _messages() -> list[Any]:
    owner = Trader(key=KEY).address
    return [
        Bid(owner, "tpu-v5e", 3, 10**30, "metered", 100, 1 << 34, 2_000_000_000, 2**200),
        Ask(owner, "cpu", 1, 1, "flat", 5, 0, 1, 0, b"\x07" * 32),
        CancelOrder(owner, b"\x01" * 32, 9, 77),
        Heartbeat(owner, advert_hash({"b": 1, "a": [1.5, "é"]}), 1_900_000_000),
    ]


@pytest.mark.parametrize("message", _messages(), ids=lambda m: type(m).__name__)
def test_signature_when_signed_then_equals_eth_account_typed_data(message: Any) -> None:
    full = {
        "types": {"EIP712Domain": EIP712_DOMAIN, **message.typed_data_types()},
        "primaryType": message.TYPE_NAME,
        "domain": DOMAIN.as_dict(),
        "message": message.as_typed_data(),
    }
    expected = Account.sign_typed_data(KEY, full_message=full).signature
    assert message.sign(DOMAIN, KEY) == bytes(expected)
    assert type(message).from_json(message.to_json()) == message


uint64 = st.integers(0, 2**64 - 1)
uint256 = st.integers(0, 2**256 - 1)
bytes32 = st.binary(min_size=32, max_size=32)
address = st.binary(min_size=20, max_size=20).map(lambda b: "0x" + b.hex())
plans = st.builds(
    Plan,
    price_per_device_ms=uint64,
    compile_price=uint64,
    outcome_based=st.booleans(),
    tier1_from_task=st.integers(0, 2**32 - 1),
    cache_hit_discount_bps=st.integers(0, 10_000),
)


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(
        st.builds(
            Quote,
            address,
            address,
            address,
            uint256,
            uint256,
            uint256,
            uint64,
            uint64,
            uint64,
            uint64,
            uint256,
            plans,
        ),
        plans,
        st.builds(Ack, uint256, st.integers(0, 2**32 - 1), bytes32, uint256),
        st.builds(
            TaskRequest,
            uint256,
            st.integers(0, 2**32 - 1),
            st.integers(0, 255),
            bytes32,
            bytes32,
            uint256,
            uint64,
        ),
        st.builds(Voucher, uint256, uint256, st.lists(uint256, max_size=3).map(tuple)),
        st.builds(
            Receipt,
            uint256,
            st.integers(0, 2**32 - 1),
            st.integers(0, 1),
            st.integers(0, 9),
            st.booleans(),
            uint64,
            uint64,
            bytes32,
            bytes32,
            bytes32,
            uint64,
            uint64,
            uint64,
            uint256,
            bytes32,
        ),
        st.builds(
            Bid,
            address,
            st.text(max_size=8),
            uint64,
            uint256,
            st.text(max_size=8),
            uint64,
            uint64,
            uint64,
            uint256,
        ),
    )
)
def test_fast_struct_hash_when_any_message_then_equals_reference(message: Any) -> None:
    expected = _reference_bid(message) if isinstance(message, Bid) else message.struct_hash()
    assert struct_hash(message) == expected


def _reference_bid(bid: Bid) -> bytes:
    """Encode word by word with the public field encoder, strings hashed as EIP-712 says."""
    words = []
    for name, kind in Bid.TYPES:
        value = getattr(bid, attribute(name))
        words.append(keccak(value.encode()) if kind == "string" else encode_word(kind, value))
    return keccak(Bid.typehash() + b"".join(words))


def test_recover_when_signature_malleable_or_malformed_then_rejects() -> None:
    message = _messages()[0]
    signature = message.sign(DOMAIN, KEY)
    d = digest(message, DOMAIN)
    assert recover_address(d, signature) == Trader(key=KEY).address.lower()
    high_s = (SECP256K1_N - int.from_bytes(signature[32:64], "big")).to_bytes(32, "big")
    flipped = signature[:32] + high_s + bytes([55 - signature[64]])
    for bad in (signature[:64], signature[:64] + b"\x01", flipped, b"\x00" * 65):
        with pytest.raises(SignatureError):
            recover_address(d, bad)


def test_domain_when_signed_for_escrow_or_other_chain_then_recovers_someone_else() -> None:
    message = _messages()[0]
    owner = Trader(key=KEY).address.lower()
    escrow_domain = Domain(chain_id=31337, verifying_contract=ESCROW)
    for other in (escrow_domain, market_domain(1, ESCROW), market_domain(31337, "0x" + "11" * 20)):
        signature = message.sign(other, KEY)
        assert recover_address(digest(message, DOMAIN), signature) != owner


@pytest.mark.parametrize(
    ("plan", "kind"),
    [
        (Plan(price_per_device_ms=1), "metered"),
        (Plan(compile_price=5), "flat"),
        (Plan(compile_price=5, outcome_based=True), "outcome"),
        (Plan(price_per_device_ms=1, tier1_from_task=10, tier1_discount_bps=500), "tiered"),
        (Plan(price_per_device_ms=1, reservation_fee=100), "reserved"),
    ],
)
def test_plan_kind_names_the_most_specific_feature(plan: Plan, kind: str) -> None:
    assert plan_kind(plan) == kind


def test_canonical_json_sorts_keys_and_drops_spaces() -> None:
    assert canonical_json({"b": [1, 2.5], "a": "x"}) == b'{"a":"x","b":[1,2.5]}'
    assert advert_hash({"a": 1, "b": 2}) == advert_hash({"b": 2, "a": 1})


def test_order_ids_when_only_nonce_differs_then_differ() -> None:
    trader = Trader(key=KEY)
    first, second = trader.bid(1_000), trader.bid(1_000)
    assert first["nonce"] != second["nonce"] and first["signature"] != second["signature"]
