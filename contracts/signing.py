"""secp256k1 keys: sign a 32-byte digest, recover its signer, and the address forms we hand out.

Signatures are 65 bytes r||s||v with v in {27, 28} and s in the lower half order, the form the
escrow accepts (it refuses malleable twins); recovery refuses every other form.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType

import coincurve
from coincurve._libsecp256k1 import ffi, lib
from coincurve.context import GLOBAL_CONTEXT
from eth_utils.address import to_checksum_address

from contracts.errors import SignatureError
from contracts.hashing import keccak256

SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_CONTEXT = GLOBAL_CONTEXT.ctx


def _private_key(private_key: bytes | str) -> coincurve.PrivateKey:
    raw = (
        bytes.fromhex(private_key.removeprefix("0x"))
        if isinstance(private_key, str)
        else private_key
    )
    return coincurve.PrivateKey(raw)


def sign_digest(digest: bytes, private_key: bytes | str) -> bytes:
    """Sign a 32-byte digest; return r||s||v with low s and v in {27, 28}."""
    raw = _private_key(private_key).sign_recoverable(digest, hasher=None)
    return raw[:64] + bytes([raw[64] + 27])


def recover_public(digest: bytes, signature: bytes) -> bytes:
    """Return the uncompressed public key that signed `digest` (65 bytes, 0x04 first).

    Raise SignatureError unless the signature is 65 bytes, v is 27 or 28 and s is in the
    lower half order (no malleable twins).
    """
    _check_form(digest, signature)
    try:
        return _recover(bytes(digest), bytes(signature))
    except ValueError as exc:
        raise SignatureError(str(exc)) from exc


def recover_publics(pairs: Sequence[tuple[bytes, bytes]]) -> list[bytes | SignatureError]:
    """Return `recover_public` of each (digest, signature) pair, its error in its place where it
    has one; the recoveries are made in one library call (the interpreter lock let go once for
    them all) where `contracts._recover` is built."""
    results: list[bytes | SignatureError] = []
    sound: list[tuple[bytes, bytes]] = []
    places: list[int] = []
    for digest, signature in pairs:
        try:
            _check_form(digest, signature)
        except SignatureError as exc:
            results.append(exc)
            continue
        places.append(len(results))
        results.append(b"")
        sound.append((bytes(digest), bytes(signature)))
    for place, recovered in zip(places, _recover_many(sound), strict=True):
        results[place] = (
            recovered if isinstance(recovered, bytes) else SignatureError(_FAILURES[recovered])
        )
    return results


def _check_form(digest: bytes, signature: bytes) -> None:
    if len(signature) != 65:
        raise SignatureError(f"signature must be 65 bytes, got {len(signature)}")
    v = signature[64]
    s = int.from_bytes(signature[32:64], "big")
    if v not in (27, 28):
        raise SignatureError(f"signature v must be 27 or 28, got {v}")
    if not 0 < s <= SECP256K1_N // 2:
        raise SignatureError("signature s is not in the lower half order (malleable)")
    if len(digest) != 32:
        raise SignatureError(f"digest must be 32 bytes, got {len(digest)}")


_FAILURES = {
    1: "signature does not recover: r or s is out of range",
    2: "signature does not recover: no public key signed it",
}


def recover_with_bindings(digest: bytes, signature: bytes) -> bytes:
    """Recover as `recover_public` does (its checks already made) through coincurve's
    bindings of libsecp256k1: three library calls, each letting go of the interpreter lock and
    taking it back. Used where `contracts._recover` is not built."""
    recovered = _with_bindings(digest, signature)
    if isinstance(recovered, int):
        raise ValueError(_FAILURES[recovered])
    return recovered


def recover_many_with_bindings(pairs: list[tuple[bytes, bytes]]) -> list[bytes | int]:
    """`contracts._recover.recover_many` through coincurve's bindings, one pair at a time."""
    return [_with_bindings(digest, signature) for digest, signature in pairs]


def _with_bindings(digest: bytes, signature: bytes) -> bytes | int:
    """The key, or the `_FAILURES` code of why none recovers."""
    # As coincurve's `PublicKey` does, without the key object and its checks repeated.
    recoverable = ffi.new("secp256k1_ecdsa_recoverable_signature *")
    if not lib.secp256k1_ecdsa_recoverable_signature_parse_compact(
        _CONTEXT, recoverable, signature[:64], signature[64] - 27
    ):
        return 1
    public = ffi.new("secp256k1_pubkey *")
    if not lib.secp256k1_ecdsa_recover(_CONTEXT, public, recoverable, digest):
        return 2
    serialized = ffi.new("unsigned char[65]")
    lib.secp256k1_ec_pubkey_serialize(
        _CONTEXT, serialized, ffi.new("size_t *", 65), public, lib.SECP256K1_EC_UNCOMPRESSED
    )
    return bytes(ffi.buffer(serialized, 65))


def native_module(directory: Path = Path(__file__).parent) -> ModuleType | None:
    """Return `contracts._recover` (the same library calls made in one, letting go of the
    interpreter lock once: verifying threads then wait less on each other) if `make setup` built
    it in `directory`, else None. Raise `ImportError` if it was built from an older `_recover.c`."""
    source = directory / "_recover.c"
    for suffix in EXTENSION_SUFFIXES:
        built = source.with_name("_recover" + suffix)
        if built.exists():
            if source.exists() and source.stat().st_mtime > built.stat().st_mtime:
                raise ImportError(
                    f"{built.name} was compiled from an older {source.name}: run `make setup` "
                    "(or `.venv/bin/python scripts/build_engine.py`) to rebuild it, or delete it"
                )
            from contracts import _recover as native

            return native
    return None


_NATIVE = native_module()
_recover: Callable[[bytes, bytes], bytes] = (
    recover_with_bindings if _NATIVE is None else _NATIVE.recover
)
_recover_many: Callable[[list[tuple[bytes, bytes]]], list[bytes | int]] = (
    recover_many_with_bindings if _NATIVE is None else _NATIVE.recover_many
)


def recover_digest(digest: bytes, signature: bytes) -> str:
    """Return the signer of `digest`; raise SignatureError on malformed or malleable signatures."""
    return checksum_of(keccak256(recover_public(digest, signature)[1:])[-20:])


def recover_address(digest: bytes, signature: bytes) -> str:
    """Return the lowercase 0x-address that signed `digest`; raise SignatureError if none did.

    The same rules as `recover_digest` (65 bytes, v in {27, 28}, low s), without the checksum
    encoding (the market compares addresses case-insensitively).
    """
    return _address_of_public(recover_public(digest, signature))


def recover_addresses(pairs: Sequence[tuple[bytes, bytes]]) -> list[str | SignatureError]:
    """Return `recover_address` of each pair, its error in its place where it has one: the
    recoveries made together, as `recover_publics` makes them."""
    return [
        r if isinstance(r, SignatureError) else _address_of_public(r)
        for r in recover_publics(pairs)
    ]


@functools.lru_cache(maxsize=65_536)
def _address_of_public(public: bytes) -> str:
    # Cached: the same signers come back, and the address costs a keccak.
    return "0x" + keccak256(public[1:])[-20:].hex()


@functools.lru_cache(maxsize=65_536)
def checksum_of(address: bytes | str) -> str:
    """Return the EIP-55 form of an address, 20 bytes or text; raise ValueError if it is none.

    Cached: the same parties sign again and again, and the checksum costs about as much as a
    signature recovery (~30 us).
    """
    return to_checksum_address(address)


def address_of(private_key: bytes | str) -> str:
    """Return the checksummed address of a private key."""
    public = _private_key(private_key).public_key.format(compressed=False)
    return checksum_of(keccak256(public[1:])[-20:])
