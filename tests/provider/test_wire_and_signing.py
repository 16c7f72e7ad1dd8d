"""The task service's pure helpers: its EIP-712 signer and the checks of untrusted wire input."""

from __future__ import annotations

import pytest

from contracts.messages import Ack, Domain, address_of
from provider.errors import RejectedError
from provider.signing import DomainSigner
from provider.wire import MAX_JSON_DEPTH, json_depth, parse_signature, shorten

KEY = "0x" + "5a" * 32
DOMAIN = Domain(chain_id=31337, verifying_contract="0x" + "22" * 20)
OTHER_DOMAIN = Domain(chain_id=31337, verifying_contract="0x" + "33" * 20)
ACK = Ack(deal_id=7, task_index=3, request_hash=b"\x01" * 32, price=10)


def test_signer_when_signing_an_ack_then_same_bytes_as_the_message_signature() -> None:
    signer = DomainSigner(KEY, DOMAIN)

    signature = signer.sign(ACK.struct_hash())

    assert signature == ACK.sign(DOMAIN, KEY)
    assert signer.digest(ACK.struct_hash()) == ACK.digest(DOMAIN)
    assert ACK.recover(DOMAIN, signature) == address_of(KEY)
    assert signature[64] in (27, 28)


def test_signer_when_domain_differs_then_signature_recovers_to_someone_else() -> None:
    signature = DomainSigner(KEY, OTHER_DOMAIN).sign(ACK.struct_hash())

    assert ACK.recover(DOMAIN, signature) != address_of(KEY)


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("{}", 1),
        ('{"a":[1,{"b":2}]}', 3),
        ('{"a":"[[[[{{{{"}', 1),  # brackets inside strings do not nest
        ('{"a":"\\"[[[["}', 1),  # nor after an escaped quote
        (b"[[]]", 2),
        ("7", 0),
    ],
)
def test_json_depth_when_counted_then_only_structure_nests(text: str | bytes, depth: int) -> None:
    assert json_depth(text) == depth


def test_json_depth_when_hundred_thousand_brackets_then_measured_without_recursion() -> None:
    deep = "[" * 100_000 + "]" * 100_000  # a recursive walk would exhaust the stack

    assert json_depth(deep) == 100_000 > MAX_JSON_DEPTH


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0xzz", "signature is not hex"),
        ("0x" + "ab" * 64, "signature must be 65 bytes, got 64"),
        ("", "signature must be 65 bytes, got 0"),
    ],
)
def test_parse_signature_when_malformed_then_bad_request(text: str, reason: str) -> None:
    with pytest.raises(RejectedError) as caught:
        parse_signature(text)

    assert (caught.value.code, caught.value.reason) == ("bad_request", reason)


def test_parse_signature_when_65_hex_bytes_then_raw_bytes_with_or_without_prefix() -> None:
    raw = bytes(range(65))

    assert parse_signature("0x" + raw.hex()) == raw == parse_signature(" " + raw.hex() + " ")


def test_shorten_when_message_is_long_then_cut_with_ellipsis() -> None:
    assert shorten(ValueError("x" * 500), most=10) == "x" * 10 + "..."
    assert shorten(ValueError("short")) == "short"
