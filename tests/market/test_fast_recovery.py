"""Signature recovery, in one library call (`contracts._recover`, built by the setup step) and
through libsecp256k1's bindings, gives what coincurve's key API gives, and refuses every form
the market refuses (wrong length, v, high s, r out of range, no key)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import coincurve
import pytest

from contracts import signing
from contracts.errors import SignatureError
from contracts.hashing import keccak256
from contracts.signing import SECP256K1_N, address_of, recover_address, recover_public, sign_digest

NATIVE = signing.native_module()


@pytest.fixture(autouse=True, params=["one call", "bindings"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run each test through both ways of recovering."""
    if request.param == "bindings":
        monkeypatch.setattr(signing, "_recover", signing.recover_with_bindings)
        monkeypatch.setattr(signing, "_recover_many", signing.recover_many_with_bindings)
    yield request.param


def test_setup_built_the_one_call_recovery_and_it_is_the_one_used(path: str) -> None:
    assert NATIVE is not None, "contracts/_recover.c was not compiled: run `make setup`"
    assert signing.native_module() is NATIVE
    if path == "one call":
        assert signing._recover is NATIVE.recover
        assert signing._recover_many is NATIVE.recover_many


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


def test_recovers_many_as_one_at_a_time_each_error_in_its_place() -> None:
    """Good pairs, each malformed form and an unrecoverable one, mixed: the same keys and the
    same errors as `recover_public` on each, in order; none raised."""
    pairs: list[tuple[bytes, bytes]] = []
    for number in range(30):
        digest = keccak256(number.to_bytes(4, "big"))
        signature = sign_digest(digest, os.urandom(32))
        bad = {
            3: signature[:64],
            7: signature[:64] + b"\x1d",
            11: signature[:32] + (SECP256K1_N - 1).to_bytes(32, "big") + signature[64:],
            13: b"\xff" * 32 + signature[32:],
            17: b"\x00" * 32 + signature[32:],
        }
        pairs.append((b"\x01" * 31 if number == 19 else digest, bad.get(number, signature)))
    expected: list[bytes | str] = []
    for digest, signature in pairs:
        try:
            expected.append(recover_public(digest, signature))
        except SignatureError as exc:
            expected.append(str(exc))
    got = signing.recover_publics(pairs)
    assert [g if isinstance(g, bytes) else str(g) for g in got] == expected
    assert sum(isinstance(g, SignatureError) for g in got) == 6
    assert signing.recover_publics([]) == []
    addresses = signing.recover_addresses(pairs[:3])
    assert addresses == [recover_address(d, s) for d, s in pairs[:3]]


def test_refuses_a_digest_that_is_not_32_bytes() -> None:
    signature = sign_digest(keccak256(b"order"), os.urandom(32))
    with pytest.raises(SignatureError, match="32 bytes"):
        recover_public(b"\x01" * 31, signature)


def test_recovers_from_many_threads_at_once() -> None:
    """Each thread gets its own signer back while the others recover beside it."""
    keys = [os.urandom(32) for _ in range(8)]
    digests = [keccak256(os.urandom(40)) for _ in range(40)]
    wrong: list[str] = []

    def work(key: bytes) -> None:
        address = address_of(key).lower()
        for digest in digests:
            if recover_address(digest, sign_digest(digest, key)) != address:
                wrong.append(address)

    threads = [threading.Thread(target=work, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_refuses_a_recovery_module_older_than_its_source(tmp_path: Path) -> None:
    """A stale build would run old code: the loader names the fix instead."""
    source = Path(signing.__file__).with_name("_recover.c")
    built = next(source.parent.glob("_recover.*.so"))
    (tmp_path / source.name).write_bytes(source.read_bytes())
    (tmp_path / built.name).write_bytes(built.read_bytes())
    os.utime(tmp_path / built.name, (0, (tmp_path / source.name).stat().st_mtime - 10))
    with pytest.raises(ImportError, match="make setup"):
        signing.native_module(tmp_path)
    os.utime(tmp_path / built.name)
    assert signing.native_module(tmp_path) is NATIVE


def test_the_one_call_module_refuses_what_is_not_pairs_of_bytes() -> None:
    """Its own checks hold whatever a caller hands it: no read out of bounds, a typed error."""
    assert NATIVE is not None
    digest = keccak256(b"order")
    signature = sign_digest(digest, os.urandom(32))
    for bad in ([(digest,)], [(digest, signature[:64])], [(digest[:31], signature)], [b"x"]):
        with pytest.raises((TypeError, ValueError)):
            NATIVE.recover_many(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        NATIVE.recover_many((digest, signature))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="v must be 27 or 28"):
        NATIVE.recover(digest, signature[:64] + b"\x00")
    with pytest.raises(TypeError):  # a buffer another thread could change while it reads
        NATIVE.recover(bytearray(digest), signature)  # type: ignore[arg-type]
    assert recover_public(bytearray(digest), bytearray(signature)) == NATIVE.recover(  # type: ignore[arg-type]
        digest, signature
    )
    assert NATIVE.recover_many([(digest, signature)] * 3) == [NATIVE.recover(digest, signature)] * 3
