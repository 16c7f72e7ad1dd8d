"""The provider's EIP-712 signer: digests and signatures of struct hashes under its domain."""

from __future__ import annotations

import coincurve

from contracts.hashing import keccak256
from contracts.messages import Domain


class DomainSigner:
    """Sign struct hashes (acks, receipts) with the provider's key under one EIP-712 domain.

    The domain separator is computed once: a task signs an ack and a receipt, and a request's
    signature is checked against :meth:`digest`, so the task path hashes no domain.
    """

    def __init__(self, private_key: str, domain: Domain) -> None:
        """Hold the key (never sent anywhere) and ``domain``'s separator."""
        self._key = coincurve.PrivateKey(bytes.fromhex(private_key.removeprefix("0x")))
        self._separator = domain.separator()

    def digest(self, struct_hash: bytes) -> bytes:
        """Return the EIP-712 digest of a struct hash under the domain."""
        return keccak256(b"\x19\x01" + self._separator + struct_hash)

    def sign(self, struct_hash: bytes) -> bytes:
        """Sign a struct hash under the domain: r||s||v, low s, v in {27, 28}."""
        raw = self._key.sign_recoverable(self.digest(struct_hash), hasher=None)
        return raw[:64] + bytes([raw[64] + 27])


__all__ = ["DomainSigner"]
