"""One definition of every signed type: `contracts/typed_data.json`.

The Solidity structs and type hashes, the Python message classes and the encoder all agree with
it; eth-account, reading only the file, signs what our encoder signs; and every field encoder is
equally strict for the escrow's messages and the market's orders.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from eth_account.messages import encode_typed_data
from eth_utils.crypto import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import eip712, typed_data
from contracts.compiler import SOURCE_DIR
from contracts.eip712 import Domain, Message
from contracts.messages import Ack, Plan, Quote, Receipt, TaskRequest, Voucher, address_of
from contracts.orders import Ask, Bid, CancelOrder, Heartbeat, market_domain

SETTLEMENT = ("Quote", "TaskRequest", "Ack", "Receipt", "Voucher")
MARKET = ("Ask", "Bid", "CancelOrder", "Heartbeat")
ESCROW = "0x" + "ab" * 20
KEY = "0x" + "42" * 32


# ---- the Solidity mirror ---------------------------------------------------------------------


def solidity_structs() -> dict[str, list[tuple[str, str]]]:
    """Return the structs of `types/Messages.sol`: name -> [(field, type)], in order."""
    source = (SOURCE_DIR / "types" / "Messages.sol").read_text()
    structs = {}
    for name, body in re.findall(r"struct (\w+) \{(.*?)\}", source, re.S):
        lines = (re.sub(r"//.*", "", line).strip() for line in body.splitlines())
        structs[name] = [
            (m[2], m[1]) for line in lines if (m := re.fullmatch(r"([\w\[\]]+) (\w+);", line))
        ]
    return structs


def solidity_type_strings() -> dict[str, str]:
    """Return the type string behind each `*_TYPEHASH` of `MessageHashing.sol`, by struct name
    (`TASK_REQUEST_TYPEHASH` -> `TaskRequest`), constants it concatenates resolved."""
    source = (SOURCE_DIR / "libraries" / "MessageHashing.sol").read_text()
    constants: dict[str, str] = {}
    for name, expression in re.findall(r"constant (\w+)\s*=\s*(.*?);", source, re.S):
        parts = re.findall(r'"([^"]*)"|\b([A-Z][A-Z0-9_]+)\b', expression)
        constants[name] = "".join(text or constants.get(ref, "") for text, ref in parts)
    return {
        "".join(w.title() for w in name.removesuffix("_TYPEHASH").split("_")): text
        for name, text in constants.items()
        if name.endswith("_TYPEHASH")
    }


def test_solidity_structs_equal_the_definition_field_for_field() -> None:
    structs = solidity_structs()
    for name in ("Plan", *SETTLEMENT):
        assert structs[name] == list(eip712.fields_of(name)), name
    # Claim carries a signature, it is not signed: every other struct is in the definition
    assert set(structs) - set(eip712.struct_types()) == {"Claim"}


def test_solidity_type_hashes_hash_the_definitions_type_strings() -> None:
    found = solidity_type_strings()
    assert sorted(found) == sorted(("Plan", *SETTLEMENT))
    for name, text in found.items():
        assert text == eip712.type_string(name), name
        assert keccak(text=text) == eip712.type_hash(name)


def test_escrow_domain_in_solidity_equals_the_definitions() -> None:
    source = (SOURCE_DIR / "ComputeEscrow.sol").read_text()
    domain = typed_data.shipped()["domain"]
    assert f'EIP712("{domain["name"]}", "{domain["version"]}")' in source


def test_type_string_of_a_nested_struct_appends_it() -> None:
    assert eip712.type_string("Quote").endswith(")" + eip712.type_string("Plan"))
    assert eip712.type_string("EIP712Domain") == (
        "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
    )


# ---- the Python mirror -----------------------------------------------------------------------


def test_every_struct_has_one_message_class_with_its_fields_in_order() -> None:
    classes = {c.TYPE_NAME: c for c in (Plan, *_classes(SETTLEMENT), *_classes(MARKET))}
    structs = set(eip712.struct_types()) - {eip712.DOMAIN_TYPE}
    assert set(classes) == structs
    for name, cls in classes.items():
        assert eip712.message_class(name) is cls
        assert eip712.fields_of(name) == cls.TYPES
        assert [f.name for f in dataclasses.fields(cls)] == [
            eip712.attribute(field) for field, _ in eip712.fields_of(name)
        ]


def test_message_class_when_fields_drift_from_the_definition_then_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Swapped(Message):  # Ack's fields, two of them in the wrong order
        TYPE_NAME = "Ack"

        deal_id: int
        request_hash: bytes
        task_index: int
        price: int

    with pytest.raises(TypeError, match=r"typed_data\.json"):
        eip712.check(Swapped)
    assert eip712.message_class("Ack") is Ack


def _classes(names: tuple[str, ...]) -> list[type[Message]]:
    known = {c.TYPE_NAME: c for c in (Quote, TaskRequest, Ack, Receipt, Voucher)}
    known |= {c.TYPE_NAME: c for c in (Ask, Bid, CancelOrder, Heartbeat)}
    return [known[n] for n in names]


def test_typed_data_json_publishes_every_market_message_whole() -> None:
    shipped = json.loads(typed_data.SCHEMA_FILE.read_text())
    market = shipped["market"]
    assert sorted(market["messages"]) == sorted(MARKET)
    assert market["domainToFill"] == ["chainId", "verifyingContract"]
    assert set(market["types"]).isdisjoint(set(shipped["types"]) - {"EIP712Domain"})
    for name, entry in market["messages"].items():
        request = entry["typedData"]
        assert request["primaryType"] == name
        assert request["domain"] == {"name": "tpumarket-market", "version": "1"}
        assert request["types"] == {
            "EIP712Domain": shipped["types"]["EIP712Domain"],
            **eip712.typed_data_types(name),
        }


def test_served_schema_is_the_file_with_both_domains_filled() -> None:
    domain = Domain(chain_id=31337, verifying_contract=ESCROW)
    served, shipped = typed_data.schema(domain), typed_data.shipped()
    assert served["types"] == shipped["types"]
    assert served["market"]["types"] == shipped["market"]["types"]
    assert served["domain"] == domain.as_dict()
    assert served["market"]["domain"] == market_domain(31337, ESCROW).as_dict()
    assert "domainToFill" not in served and "domainToFill" not in served["market"]
    assert typed_data.schema() == shipped


# ---- eth-account, reading only the file, signs what we sign ----------------------------------

text = st.text(max_size=12)
u64, u256 = st.integers(0, 2**64 - 1), st.integers(0, 2**256 - 1)
b32 = st.binary(min_size=32, max_size=32)
owner = st.binary(min_size=20, max_size=20).map(lambda b: "0x" + b.hex())
orders = st.one_of(
    st.builds(Bid, owner, text, u64, u256, text, u64, u64, u64, u256),
    st.builds(Ask, owner, text, u64, u256, text, u64, u64, u64, u256, b32),
    st.builds(CancelOrder, owner, b32, u256, u64),
    st.builds(Heartbeat, owner, b32, u64),
)


@settings(max_examples=80, deadline=None)
@given(message=orders, chain_id=st.integers(1, 2**64))
def test_every_market_message_signs_from_the_typed_data_json_alone(
    message: Any, chain_id: int
) -> None:
    domain = market_domain(chain_id, ESCROW)
    values = json.loads(
        json.dumps(message.as_typed_data(), default=lambda b: "0x" + bytes(b).hex())
    )
    shipped = json.loads(typed_data.SCHEMA_FILE.read_text())
    served = json.loads(json.dumps(typed_data.schema(Domain(chain_id, ESCROW))))
    name = "market." + message.TYPE_NAME
    from_file = typed_data.full_message(
        shipped, name, values, chainId=chain_id, verifyingContract=ESCROW
    )
    for full in (from_file, typed_data.full_message(served, name, values)):
        signable = encode_typed_data(full_message=full)
        assert signable.header == domain.separator()
        assert signable.body == message.struct_hash()
        assert keccak(b"\x19" + signable.version + signable.header + signable.body) == (
            message.digest(domain)
        )


# ---- one strictness for every message --------------------------------------------------------

RECEIPT = Receipt(
    1, 2, 1, 0, True, 3, 4, b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, 5, 6, 7, 8, b"\x04" * 32
)
QUOTE = Quote(ESCROW, ESCROW, ESCROW, 1, 2, 3, 4, 5, 6, 7, 8, Plan(compile_price=1))
BID = Bid(ESCROW, "cpu", 1, 2, "flat", 3, 4, 5, 6)
ASK = Ask(ESCROW, "cpu", 1, 2, "flat", 3, 4, 5, 6, b"\x05" * 32)

# (kind, a settlement message and field of that kind, a market message and field of that kind)
FIELDS = {
    "uint64": ((RECEIPT, "device_ms"), (BID, "quantity")),
    "uint256": ((QUOTE, "max_spend"), (BID, "price")),
    "address": ((QUOTE, "provider"), (BID, "owner")),
    "bytes32": ((RECEIPT, "output_hash"), (ASK, "quote_hash")),
    "string": (None, (BID, "device_class")),
    "bool": ((RECEIPT, "cache_hit"), None),
}
BAD = {
    "uint64": [True, False, 1.0, -1, 2**64, "5", None],
    "uint256": [True, 1.0, -1, 2**256, "5", b"\x05"],
    "address": [
        bytes(20),
        "0x" + "zz" * 20,
        "0x" + " 1" * 20,
        "0x" + "11" * 19,
        "11" * 21,
        None,
    ],
    "bytes32": [b"\x01" * 31, b"\x01" * 33, "0x" + "01" * 32, None],
    "string": [b"cpu", None, 5],
    "bool": [1, 0, None, "true"],
}


@pytest.mark.parametrize(
    ("kind", "value"), [(k, v) for k, values in BAD.items() for v in values], ids=repr
)
def test_field_encoders_refuse_the_same_bad_values_in_every_message(kind: str, value: Any) -> None:
    domain = Domain(chain_id=1, verifying_contract=ESCROW)
    targets = [t for t in FIELDS[kind] if t is not None]
    for message, field in targets:
        bad = dataclasses.replace(message, **{field: value})
        for encode in (
            bad.struct_hash,
            lambda m=bad: m.digest(domain),
            lambda m=bad: m.sign(domain, KEY),
        ):
            with pytest.raises(ValueError):
                encode()
    with pytest.raises(ValueError):
        eip712.encode_word(kind, value)


def test_nested_plan_when_equal_but_not_a_uint_then_refused_even_after_the_good_one() -> None:
    good = QUOTE.struct_hash()  # the plan's hash is cached by value and type
    for price in (True, 1.0):
        with pytest.raises(ValueError, match="does not fit"):
            dataclasses.replace(QUOTE, plan=Plan(compile_price=price)).struct_hash()  # type: ignore[arg-type]
    assert dataclasses.replace(QUOTE, plan=Plan(compile_price=1)).struct_hash() == good


@pytest.mark.parametrize("value", [True, 1.5, "1_000", " 7", "0x10", -1, None])
def test_from_json_refuses_the_same_bad_uints_for_every_message(value: Any) -> None:
    for message, field in ((Ack(1, 2, b"\x00" * 32, 3), "price"), (BID, "quantity")):
        data = {**message.to_json(), field: value}
        with pytest.raises(ValueError):
            type(message).from_json(data)


def test_from_json_takes_uints_as_integers_or_decimal_text() -> None:
    ack = Ack(1, 2, b"\x00" * 32, 2**255)
    assert Ack.from_json({**ack.to_json(), "price": str(2**255)}) == ack
    voucher = Voucher(1, 2, (3, 2**256 - 1))
    assert voucher.to_json()["tasks"] == ["3", str(2**256 - 1)]
    assert Voucher.from_json(voucher.to_json()) == voucher
    with pytest.raises(ValueError):
        Voucher.from_json({**voucher.to_json(), "tasks": ["-1"]})


def test_signature_recovers_its_signer_for_every_message_kind() -> None:
    domain = market_domain(1, ESCROW)
    for message in (BID, ASK, RECEIPT, QUOTE):
        assert message.recover(domain, message.sign(domain, KEY)) == address_of(KEY)
