"""What the client checks of a deal before it commits: the provider's code, the close agreement,
and the provider's order of task indexes.

- **The provider's code** (at deal open, through ``eth_getCode``): the escrow recovers an ECDSA
  signature first and accepts it when it gives the signer, whatever code the address holds, so
  the acks of an account with no code or with an EIP-7702 delegation (code exactly
  ``0xef0100 || 20-byte address``) cannot be withdrawn. A contract wallet signs through
  ERC-1271, whose answer can change after the fact: its acks could stop verifying when the
  client presents them for a breach refund. Such a provider is refused
  (:class:`CounterpartyHasCode`) unless the client allows it, taking that risk.
- **The close agreement**: a client that agreed to close a deal sends no new task on it
  (:class:`DealClosing`): an early close could otherwise land between that task's breach and
  its refund.
- **Index order**: a provider acks a deal's task indexes only in order; its refusal
  ``task_index_out_of_order`` names the index it expects next (:func:`expected_index`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from client.errors import ClientError
from contracts.signer_code import code_kind

OUT_OF_ORDER: Final = "task_index_out_of_order"
"""The provider's refusal code of a task index sent before the indexes below it were acked."""
CODE_TTL_S: Final = 30.0
"""How long an account's code, once read, is taken as still the same."""


class CounterpartyHasCode(ClientError):
    """The counterparty is a contract wallet: its ERC-1271 signatures could be withdrawn."""

    code = "counterparty_has_code"


class DealClosing(ClientError):
    """The client agreed to close the deal: it sends no new task on it."""

    code = "deal_closing"


class CodeCheck:
    """Judge counterparties by their code, each address read at most once per ``ttl_s``."""

    def __init__(
        self,
        get_code: Callable[[str], bytes],
        *,
        allow_code: bool = False,
        ttl_s: float = CODE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Read code through ``get_code(address)``; ``allow_code`` accepts contract wallets."""
        self._get_code = get_code
        self.allow_code = allow_code
        self._ttl_s = ttl_s
        self._clock = clock
        self._seen: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def kind(self, address: str, *, fresh: bool = False) -> str:
        """Return the kind of ``address``'s code (read again past the TTL, or when ``fresh``)."""
        key = address.lower()
        now = self._clock()
        seen = self._seen.get(key)
        if seen is not None and not fresh and now - seen[1] < self._ttl_s:
            return seen[0]
        kind = code_kind(bytes(self._get_code(address)))
        with self._lock:
            self._seen[key] = (kind, now)
        return kind

    def check(self, address: str, role: str = "provider", *, fresh: bool = True) -> str:
        """Raise :class:`CounterpartyHasCode` for a contract wallet (unless allowed); return
        the kind of its code. A new deal reads the code afresh (``fresh``)."""
        kind = self.kind(address, fresh=fresh)
        if kind == "contract" and not self.allow_code:
            raise CounterpartyHasCode(
                f"the {role} {address} is a contract account: its ERC-1271 signatures can be "
                "withdrawn after the fact (an ack that stops verifying cannot be refunded); "
                "deal with an account without code or an EIP-7702 delegated one, or allow "
                "contract counterparties and take that risk"
            )
        return kind


def expected_index(reason: str) -> int | None:
    """Return the index a ``task_index_out_of_order`` reason says the provider expects next."""
    _, sep, tail = reason.rpartition("expected ")
    return int(tail) if sep and tail.isdigit() else None


__all__ = [
    "CODE_TTL_S",
    "OUT_OF_ORDER",
    "CodeCheck",
    "CounterpartyHasCode",
    "DealClosing",
    "expected_index",
]
