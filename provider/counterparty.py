"""Whose signatures could be withdrawn: the code a deal's client holds (``eth_getCode``).

The escrow recovers an ECDSA signature first and accepts it when it gives the signer, whatever
code the address holds; it asks ERC-1271 only of a signature that does not recover to its
signer. So an account with no code, and an EIP-7702 delegated account (code exactly
``0xef0100 || 20-byte address``), sign what they cannot take back. A contract wallet signs
through ERC-1271, and its answer can change after the fact: a client whose wallet stops
answering "valid" would make the provider's voucher redemptions and claims revert. The daemon
refuses the tasks of such a client (``counterparty_has_code``) unless its operator allows it,
accepting that risk.

Reads are cached per address for ``ttl_s`` and made again for every new deal; past the TTL a
deal's cached answer keeps serving (up to ``STALE_FACTOR`` TTLs) while a thread reads it
again, so a task's hot path makes no RPC call but a new deal's first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from web3 import Web3
from web3.exceptions import Web3Exception

from contracts.signer_code import CodeKind, code_kind
from provider.errors import RejectedError

log = logging.getLogger("provider.counterparty")

STALE_FACTOR: Final = 5
"""Past its TTL, a known address's kind serves up to this many TTLs while it is read again."""
HAS_CODE: Final = "counterparty_has_code"
"""Refusal code: the counterparty is a contract wallet whose signatures could be withdrawn."""


def chain_code(w3: Web3) -> Callable[[str], bytes]:
    """Return a reader of an account's code on ``w3``'s chain (``eth_getCode`` at latest)."""
    return lambda address: bytes(w3.eth.get_code(Web3.to_checksum_address(address)))


@dataclass(frozen=True, slots=True)
class _Seen:
    kind: CodeKind
    read_at: float
    deals: frozenset[int]


class CounterpartyCode:
    """Read and judge the code of the accounts this daemon takes signatures from."""

    def __init__(
        self,
        get_code: Callable[[str], bytes],
        *,
        allow_code: bool = False,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Read code through ``get_code(address)``; ``allow_code`` accepts contract wallets."""
        self._get_code = get_code
        self.allow_code = allow_code
        self._ttl_s = ttl_s
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        self._lock = threading.Lock()
        self._refreshing: set[str] = set()
        self.reads = 0

    def kind(self, address: str, deal_id: int) -> CodeKind:
        """Return the kind of ``address``'s code: cached, read again past the TTL or when
        ``deal_id`` is a deal not seen with this address before."""
        seen = self._seen.get(address.lower())
        if seen is not None and deal_id in seen.deals:
            age = self._clock() - seen.read_at
            if age < self._ttl_s:
                return seen.kind
            if age < STALE_FACTOR * self._ttl_s:  # served while a thread reads it again
                self._refresh_in_background(address, deal_id)
                return seen.kind
        return self._read(address, deal_id)

    def _read(self, address: str, deal_id: int) -> CodeKind:
        key = address.lower()
        now = self._clock()
        kind = code_kind(bytes(self._get_code(address)))
        with self._lock:
            seen = self._seen.get(key)
            deals = frozenset({deal_id}) if seen is None else seen.deals | {deal_id}
            self.reads += 1
            self._seen[key] = _Seen(kind, now, deals)
        if kind is CodeKind.DELEGATED and (seen is None or seen.kind is not kind):
            log.info(
                "counterparty is an EIP-7702 delegated account: its ECDSA signatures stand",
                extra={"address": address, "deal": deal_id},
            )
        return kind

    def _refresh_in_background(self, address: str, deal_id: int) -> None:
        key = address.lower()
        with self._lock:
            if key in self._refreshing:
                return
            self._refreshing.add(key)

        def refresh() -> None:
            try:
                self._read(address, deal_id)
            except (OSError, ValueError, Web3Exception) as exc:
                log.warning("cannot read a counterparty's code", extra={"error": str(exc)})
                self._seen.pop(key, None)  # the next task reads (and reports) it
            finally:
                with self._lock:
                    self._refreshing.discard(key)

        threading.Thread(target=refresh, daemon=True).start()

    def check(
        self, address: str, deal_id: int, reject: Callable[[str, str], RejectedError]
    ) -> CodeKind:
        """Raise ``counterparty_has_code`` for a contract wallet (unless allowed); return the
        kind of its code."""
        try:
            kind = self.kind(address, deal_id)
        except (OSError, ValueError, Web3Exception) as exc:
            raise reject("chain_unavailable", f"cannot read the code of {address}: {exc}") from exc
        if kind is CodeKind.CONTRACT and not self.allow_code:
            raise reject(
                HAS_CODE,
                f"deal {deal_id}'s client {address} is a contract account: its ERC-1271 "
                "signatures can be withdrawn after the fact, so this provider does not take its "
                "tasks (sign from an account without code, or from an EIP-7702 delegated one)",
            )
        return kind


__all__ = [
    "HAS_CODE",
    "CounterpartyCode",
    "chain_code",
]
