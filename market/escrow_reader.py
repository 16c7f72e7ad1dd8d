"""The market's reads of its escrow: balances and stakes for the funds check, the minimum
challenge window, used quote nonces. One binding, made on first use and again after a failure."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import requests
from web3.exceptions import Web3Exception

from contracts.binding import Chain, Escrow
from contracts.errors import ChainError
from contracts.messages import ZERO_ADDRESS
from market.chain_rpc import BALANCE_OF, STAKE_OF, RawRpc, address_call
from market.errors import ChainUnavailableError, ReplayError
from market.settings import Settings

TRANSIENT_CHAIN = (ChainError, OSError, requests.RequestException, Web3Exception, TimeoutError)
"""Errors that mean "the chain is unreachable now": retried later."""


class EscrowReader:
    """Read one market's escrow (the `rpc_url` and `escrow` of its settings)."""

    def __init__(self, settings: Settings) -> None:
        """Bind nothing yet: the first read connects."""
        self.settings = settings
        self._lock = threading.Lock()
        self._escrow: Escrow | None = None
        self._min_window: int | None = None
        self._rpc: RawRpc | None = None  # the hot reads (head, balances, stakes)

    def known(self) -> bool:
        """Return whether the market can read its escrow (an RPC URL and an escrow address)."""
        return bool(self.settings.rpc_url) and self.settings.escrow.lower() != ZERO_ADDRESS

    def read(self, read: Callable[[Escrow], Any]) -> Any:
        """Run `read` on the bound escrow; raise `ChainUnavailableError` if the chain is down."""
        try:
            with self._lock:
                if self._escrow is None:
                    assert self.settings.rpc_url is not None
                    self._escrow = Chain(self.settings.rpc_url).escrow(self.settings.escrow)
                escrow = self._escrow
            return read(escrow)
        except TRANSIENT_CHAIN as exc:
            with self._lock:
                self._escrow = None
            raise ChainUnavailableError(f"the escrow cannot be read now: {exc}") from exc

    def head(self) -> int:
        """Return the chain head's block number: one small JSON-RPC request on a kept
        connection (the match gate asks it at most once per `head_max_age_s`); raise
        `ChainUnavailableError` if it fails."""
        return self._raw().block_number()

    def balance_of(self, account: str) -> int:
        """Return `account`'s free balance on the escrow (one `eth_call`, `market.chain_rpc`)."""
        return self._raw().view(self.settings.escrow, address_call(BALANCE_OF, account))

    def stake_of(self, provider: str) -> int:
        """Return `provider`'s free stake on the escrow (one `eth_call`)."""
        return self._raw().view(self.settings.escrow, address_call(STAKE_OF, provider))

    def _raw(self) -> RawRpc:
        if self._rpc is None:
            assert self.settings.rpc_url is not None
            self._rpc = RawRpc(self.settings.rpc_url)
        return self._rpc

    def min_challenge_window(self) -> int:
        """Return the shortest challenge window a quote may set, in seconds (at least 1).

        The escrow's `minChallengeWindow()`, read once, when the market knows the escrow; the
        setting `min_challenge_window` if higher.
        """
        if self._min_window is None:
            floor = max(1, self.settings.min_challenge_window)
            if self.known():
                floor = max(floor, int(self.read(lambda e: e.min_challenge_window())))
            self._min_window = floor
        return self._min_window

    def chain_time(self) -> int:
        """Return the latest block's timestamp (0 when the market reads no escrow): the clock
        the escrow judges a quote's ``validUntil`` by."""
        if not self.known():
            return 0
        return int(self.read(lambda e: e.tx.w3.eth.get_block("latest")["timestamp"]))

    def refuse_used_nonce(self, provider: str, nonce: int, what: str) -> None:
        """Raise `ReplayError` if the escrow saw the provider's quote nonce used or cancelled."""
        if self.known() and self.read(lambda e: e.is_nonce_used(provider, nonce)):
            raise ReplayError(f"{what} cannot open a deal: nonce {nonce} is used on chain")
