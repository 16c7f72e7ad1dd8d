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

NATIVE = signing.native_recover()


@pytest.fixture(autouse=True, params=["one call", "bindings"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run each test through both ways of recovering."""
    if request.param == "bindings":
        monkeypatch.setattr(signing, "_recover", signing.recover_with_bindings)
    yield request.param


def test_setup_built_the_one_call_recovery_and_it_is_the_one_used(path: str) -> None:
    assert NATIVE is not None, "contracts/_recover.c was not compiled: run `make setup`"
    assert signing.native_recover() is NATIVE
    if path == "one call":
        assert signing._recover is NATIVE


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
        signing.native_recover(tmp_path)
    os.utime(tmp_path / built.name)
    assert signing.native_recover(tmp_path) is NATIVE
