"""Connecting to a chain's JSON-RPC endpoints: one, or several that fail over.

An RPC URL setting may name several endpoints separated by commas (``https://a,https://b``).
Requests go to the endpoint that last answered; one that cannot be reached, times out,
answers HTTP 429 (rate limited) or a 5xx is skipped for the next; when every endpoint failed
in a round, the provider waits (doubling from ``BACKOFF_S``, or the ``Retry-After`` a rate
limit gave) and tries again, ``ROUNDS`` rounds in all, then raises the last failure, which the
transactor classifies; a round in which every endpoint timed out is not repeated (each already
took its whole timeout). One endpoint alone gets the same backoff on rate limits. A JSON-RPC
error answer (a revert, a refused transaction) is an answer, never failed over: the same
request elsewhere would get the same answer.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import requests
from web3 import Web3
from web3.exceptions import TooManyRequests
from web3.providers.base import JSONBaseProvider
from web3.providers.rpc import HTTPProvider
from web3.types import RPCEndpoint, RPCResponse

from contracts.transactor import classify

T = TypeVar("T")
ROUNDS = 3
"""Rounds over every endpoint before a request fails."""
BACKOFF_S = 0.25
"""The wait after the first round in which every endpoint failed; it doubles each round."""
MAX_RETRY_AFTER_S = 10.0
"""The longest ``Retry-After`` a rate-limited endpoint is obeyed for."""
FAILOVER_ERRORS = (
    requests.ConnectionError,
    requests.Timeout,
    requests.HTTPError,
    TooManyRequests,
    ConnectionError,
    TimeoutError,
)


def endpoints(rpc_url: str) -> list[str]:
    """Return the endpoints an RPC URL setting names (comma-separated, blanks ignored)."""
    return [part.strip() for part in rpc_url.split(",") if part.strip()]


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    header = response.headers.get("Retry-After") if response is not None else None
    try:
        return min(MAX_RETRY_AFTER_S, float(header)) if header else None
    except ValueError:
        return None


class FailoverProvider(JSONBaseProvider):
    """A web3 provider over several HTTP endpoints of one chain (the module docstring)."""

    def __init__(self, providers: list[HTTPProvider], *, backoff_s: float = BACKOFF_S) -> None:
        super().__init__()
        if not providers:
            raise ValueError("at least one endpoint")
        self.providers = providers
        self.backoff_s = backoff_s
        self.current = 0
        self.failovers = 0
        """Times a request was answered by another endpoint than the one before."""
        self._lock = threading.Lock()

    def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        """Send one request, failing over and backing off as the module docstring says."""
        return self._failing_over(lambda provider: provider.make_request(method, params))

    def make_batch_request(self, requests_: list[tuple[RPCEndpoint, Any]]) -> Any:
        """Send one batch of requests the same way."""
        return self._failing_over(lambda provider: provider.make_batch_request(requests_))

    def _failing_over(self, call: Callable[[HTTPProvider], T]) -> T:
        last: BaseException | None = None
        for round_ in range(ROUNDS):
            start = self.current
            wait = self.backoff_s * (2**round_)
            only_timeouts = True
            for offset in range(len(self.providers)):
                index = (start + offset) % len(self.providers)
                try:
                    response = call(self.providers[index])
                except FAILOVER_ERRORS as exc:
                    last = exc
                    only_timeouts &= isinstance(exc, requests.Timeout | TimeoutError)
                    wait = max(wait, _retry_after(exc) or 0.0)
                    continue
                with self._lock:
                    if index != self.current:
                        self.current = index
                        self.failovers += 1
                return response
            if only_timeouts or round_ == ROUNDS - 1:
                break  # every endpoint already took its whole timeout: no second round
            time.sleep(wait)
        assert last is not None
        raise last

    @property
    def endpoint_uri(self) -> str:
        """Return every endpoint, comma-separated (the RPC URL setting this was made from)."""
        return ",".join(str(p.endpoint_uri) for p in self.providers)

    def is_connected(self, show_traceback: bool = False) -> bool:
        """Return whether any endpoint answers."""
        return any(p.is_connected(show_traceback) for p in self.providers)


_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def connect(rpc_url: str, timeout_s: float = 30.0) -> Web3:
    """Return a Web3 connected to `rpc_url`; raise ChainError if it does not answer."""
    session = requests.Session()
    # Without a proxy configured, skip the per-request scan of the environment for one (it
    # costs more than a local JSON-RPC round trip); with one, requests keeps honouring it.
    session.trust_env = any(
        os.environ.get(name) or os.environ.get(name.lower()) for name in _PROXY_VARIABLES
    )
    w3 = Web3(
        FailoverProvider(
            [
                Web3.HTTPProvider(
                    url,
                    request_kwargs={"timeout": timeout_s},
                    session=session,
                    exception_retry_configuration=None,
                )
                for url in endpoints(rpc_url)
            ]
        )
    )
    try:
        w3.eth.chain_id  # noqa: B018 - the first request: is anything answering, and in time?
    except Exception as exc:
        error = classify(exc)
        raise type(error)(f"no JSON-RPC endpoint answers at {rpc_url}: {error}") from exc
    return w3
