"""Several RPC endpoints for one chain, in front of a real anvil: an endpoint that goes down
mid-run is failed over without losing or repeating a transaction, a rate limit (HTTP 429 with
Retry-After) is waited out, and with every endpoint down the error is typed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from eth_account import Account

from contracts.binding import Chain
from contracts.chain import Anvil, free_port
from contracts.errors import ChainError
from contracts.rpc_endpoints import FailoverProvider
from tests.rpc_proxy import RpcProxy


class Flaky(RpcProxy):
    """Forwards, except while `down` (HTTP 503) or for its next `limited` requests (429)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.down = False
        self.limited = 0
        self.seen = 0

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        self.seen += 1
        if self.down:
            return 503, b'{"error": "maintenance"}'
        if self.limited > 0:
            self.limited -= 1
            return 429, b'{"error": "rate limited"}'
        return None


@pytest.fixture
def node() -> Iterator[Anvil]:
    with Anvil.start(accounts=2) as anvil:
        yield anvil


def _send(chain: Chain, key: str, to: str) -> None:
    chain.tx.send(key, to, b"", gas=21_000)


def test_an_endpoint_down_at_start_or_mid_run_is_failed_over(node: Anvil) -> None:
    proxy = Flaky(node.url)
    try:
        dead = f"http://127.0.0.1:{free_port()}"
        chain = Chain(f"{dead}, {proxy.url}, {node.url}")
        provider = chain.w3.provider
        assert isinstance(provider, FailoverProvider)
        assert provider.endpoint_uri == f"{dead},{proxy.url},{node.url}"  # what logs name
        assert provider.failovers == 1  # the dead one was passed over at the first request
        key, to = node.keys[0], Account.create().address
        _send(chain, key, to)
        proxy.down = True  # the endpoint in use goes down mid-run
        _send(chain, key, to)
        _send(chain, key, to)
        assert provider.failovers == 2 and provider.current == 2
        sender = chain.tx.address_of(key)
        assert chain.w3.eth.get_transaction_count(sender) == 3  # each sent once, none lost
    finally:
        proxy.close()


def test_a_rate_limit_is_waited_out(node: Anvil) -> None:
    proxy = Flaky(node.url)
    try:
        chain = Chain(proxy.url)
        proxy.limited = 2  # the next two requests get 429
        seen = proxy.seen
        assert chain.w3.eth.block_number >= 0
        assert proxy.seen - seen == 3
    finally:
        proxy.close()


def test_every_endpoint_down_is_a_typed_error(node: Anvil) -> None:
    proxy = Flaky(node.url)
    try:
        chain = Chain(proxy.url)
        proxy.down = True
        with pytest.raises(ChainError):
            chain.tx.send(node.keys[0], Account.create().address, b"", gas=21_000)
        proxy.down = False
        reply = chain.w3.provider.make_request("eth_chainId", [])  # type: ignore[arg-type]
        assert int(json.loads(json.dumps(reply))["result"], 16) == node.chain_id
    finally:
        proxy.close()
