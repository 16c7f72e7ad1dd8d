"""What an account's code says of the signatures it makes (``eth_getCode``), for both parties.

The escrow recovers an ECDSA signature first and accepts it when it gives the signer, whatever
code the address holds; it asks ERC-1271 only of a signature that does not recover to its
signer. So an account with no code and an EIP-7702 delegated account sign what they cannot
take back; a contract wallet's ERC-1271 answer can change after the fact.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

DELEGATION_PREFIX: Final = b"\xef\x01\x00"
"""EIP-7702: a delegated account's code is this prefix and the 20-byte delegate address."""


class CodeKind(StrEnum):
    """What an account's code says of the signatures it makes."""

    NONE = "none"
    """No code: an externally owned account; its ECDSA signatures stand."""
    DELEGATED = "delegated"
    """An EIP-7702 delegation: the escrow recovers its ECDSA signatures first; they stand."""
    CONTRACT = "contract"
    """Contract code: its ERC-1271 signatures may be withdrawn."""


def code_kind(code: bytes) -> CodeKind:
    """Return what ``code`` (as ``eth_getCode`` returns it) says of its account's signatures."""
    if not code:
        return CodeKind.NONE
    if len(code) == 23 and code.startswith(DELEGATION_PREFIX):
        return CodeKind.DELEGATED
    return CodeKind.CONTRACT
