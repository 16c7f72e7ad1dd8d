"""The market's hot chain reads (`market.chain_rpc`) against a real anvil with the escrow: the
figures equal the contract binding's, several endpoints fail over, an error answer is not sent
elsewhere, and no failure's text names an endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from contracts.chain import free_port
from contracts.messages import address_of
from market.errors import ChainUnavailableError
from market.escrow_reader import EscrowReader
from market.settings import Settings
from tests.rpc_proxy import RpcProxy

from . import chain as fixtures
from .chain import ChainWorld

chain_session = fixtures.chain_session
world = fixtures.world


class CountingNode(RpcProxy):
    """Forward to the node, counting requests; answer 503 while `down`, or a JSON-RPC error to
    every `eth_call` while `refusing`."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.count = 0
        self.down = False
        self.refusing = False
        self.flooding = False

    def intercept(self, body: bytes) -> tuple[int, bytes] | None:
        self.count += 1
        if self.down:
            return 503, b""
        if self.flooding:  # an endless number: more than any read takes
            return 200, b'{"jsonrpc":"2.0","id":1,"result":"0x' + b"1" * (1 << 20) + b'"}'
        if self.refusing and json.loads(body)["method"] == "eth_call":
            error = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "refused"}}
            return 200, json.dumps(error).encode()
        return None


@pytest.fixture
def nodes(world: ChainWorld) -> Iterator[tuple[CountingNode, CountingNode]]:
    first, second = CountingNode(world.anvil.url), CountingNode(world.anvil.url)
    yield first, second
    first.close()
    second.close()


def _reader(world: ChainWorld, rpc_url: str) -> EscrowReader:
    return EscrowReader(
        Settings(rpc_url=rpc_url, escrow=world.escrow.address, chain_id=world.anvil.chain_id)
    )


def test_figures_and_head_equal_the_bindings_reads(world: ChainWorld) -> None:
    key = world.clients[0]
    world.escrow.deposit(key, 12_345)
    world.escrow.stake(key, 678)
    account = address_of(key)
    reader = _reader(world, world.anvil.url)
    assert reader.balance_of(account) == world.escrow.balance_of(account)
    assert reader.stake_of(account) == world.escrow.stake_of(account)
    assert reader.stake_of(account) >= 678
    assert reader.balance_of("0x" + "ab" * 20) == 0
    assert reader.head() == world.head()


def test_an_unreachable_or_failing_endpoint_is_skipped_and_the_answering_one_kept(
    world: ChainWorld, nodes: tuple[CountingNode, CountingNode]
) -> None:
    first, second = nodes
    account = address_of(world.clients[0])
    expected = world.escrow.balance_of(account)
    reader = _reader(world, f"http://127.0.0.1:{free_port()},{first.url}")
    assert reader.balance_of(account) == expected  # the dead endpoint skipped
    assert reader.head() == world.head()
    first.down = True
    reader = _reader(world, f"{first.url},{second.url}")
    assert reader.balance_of(account) == expected  # the 503 skipped
    first.down = False
    before = first.count
    for _ in range(3):
        assert reader.balance_of(account) == expected
    assert first.count == before  # the endpoint that answered is asked first


def test_an_error_answer_is_not_sent_elsewhere_and_no_failure_names_an_endpoint(
    world: ChainWorld, nodes: tuple[CountingNode, CountingNode]
) -> None:
    first, second = nodes
    account = address_of(world.clients[0])
    first.refusing = True
    reader = _reader(world, f"{first.url},{second.url}")
    with pytest.raises(ChainUnavailableError, match="refused eth_call"):
        reader.stake_of(account)
    assert second.count == 0
    first.down = second.down = True
    dead = f"http://127.0.0.1:{free_port()}"
    reader = _reader(world, f"{first.url},{second.url},{dead}")
    with pytest.raises(ChainUnavailableError) as raised:
        reader.balance_of(account)
    for url in (first.url, second.url, dead):
        assert url.removeprefix("http://") not in str(raised.value)
        assert url.rsplit(":", 1)[1] not in str(raised.value)
    with pytest.raises(ChainUnavailableError):
        reader.head()


def test_an_endpoint_answering_too_much_is_skipped_without_reading_it_all(
    world: ChainWorld, nodes: tuple[CountingNode, CountingNode]
) -> None:
    first, second = nodes
    first.flooding = True
    account = address_of(world.clients[0])
    reader = _reader(world, f"{first.url},{second.url}")
    assert reader.balance_of(account) == world.escrow.balance_of(account)
    assert second.count == 1
    second.flooding = True
    with pytest.raises(ChainUnavailableError, match="no endpoint answered"):
        reader.head()
