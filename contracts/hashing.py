"""keccak-256 for hot paths: a C implementation (``safe-pysha3``), ~6x faster than eth-utils'.

eth-utils' ``keccak`` goes through pycryptodome's ctypes backend (~10 µs a call); the market
hashes every order and the provider every task several times, so both use this one.
"""

from __future__ import annotations

from typing import Protocol, cast

import sha3


class _Hasher(Protocol):
    def digest(self) -> bytes: ...


class _KeccakFactory(Protocol):
    def __call__(self, data: bytes = ...) -> _Hasher: ...


_keccak_256 = cast(_KeccakFactory, sha3.keccak_256)


def keccak256(data: bytes) -> bytes:
    """Return the keccak-256 digest of `data` (Ethereum's hash, not NIST SHA3-256)."""
    return _keccak_256(data).digest()


def keccak_text(text: str) -> bytes:
    """Return keccak-256 of `text` encoded as UTF-8."""
    return _keccak_256(text.encode()).digest()
