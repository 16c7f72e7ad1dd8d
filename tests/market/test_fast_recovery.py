"""Signature recovery through libsecp256k1's bindings gives what coincurve's key API gives, and
refuses every form the market refuses (wrong length, v, high s, r out of range, no key)."""

from __future__ import annotations

import os

import coincurve
import pytest

from contracts.errors import SignatureError
from contracts.hashing import keccak256
from contracts.signing import SECP256K1_N, address_of, recover_address, recover_public, sign_digest


def _reference(digest: bytes, signature: bytes) -> bytes:
    public = coincurve.PublicKey.from_signature_and_message(
        signature[:64] + bytes([signature[64] - 27]), digest, hasher=None
    )
    return bytes(public.format(compressed=False))


def test_recovers_the_key_coincurve_recovers_and_the_signer() -> None:
    for _ in range(50):
        key = os.urandom(32)
        digest = keccak256(os.urandom(40))
        signature = sign_digest(digest, key)
        assert recover_public(digest, signature) == _reference(digest, signature)
        assert recover_address(digest, signature) == address_of(key).lower()


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: s[:64], "65 bytes"),
        (lambda s: s[:64] + b"\x1d", "v must be 27 or 28"),
        (lambda s: s[:32] + (SECP256K1_N - 1).to_bytes(32, "big") + s[64:], "lower half"),
        (lambda s: b"\xff" * 32 + s[32:], "out of range"),
        (lambda s: b"\x00" * 32 + s[32:], "does not recover"),
    ],
)
def test_refuses_malformed_signatures(mutate: object, reason: str) -> None:
    digest = keccak256(b"order")
    signature = sign_digest(digest, os.urandom(32))
    with pytest.raises(SignatureError, match=reason):
        recover_public(digest, mutate(signature))  # type: ignore[operator]


def test_refuses_a_digest_that_is_not_32_bytes() -> None:
    signature = sign_digest(keccak256(b"order"), os.urandom(32))
    with pytest.raises(SignatureError, match="32 bytes"):
        recover_public(b"\x01" * 31, signature)
