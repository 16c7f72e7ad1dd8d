"""The chain indexer against a real anvil with a real v2 escrow and its events."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlmodel import Session

from contracts.binding import Chain
from contracts.chain import ANVIL_BINARY, DEV_MNEMONIC, Anvil, dev_keys, free_port, rpc
from contracts.errors import ChainError
from contracts.messages import Plan, Voucher, address_of, task_bitmap
from market import chain_index, database
from market.indexer import (
    DeploymentBlockUnknownError,
    Indexer,
    creation_block,
    deployment_block,
    first_block_with_code,
)
from market.models import ChainDeal, Deal
from market.service import MarketService
from market.settings import Settings
from tests import processes

from . import chain as fixtures
from .chain import (
    MIN_WINDOW,
    ChainWorld,
    ack_of,
    attach,
    deal_quote,
    deploy_world,
    match,
    open_on_chain,
    task_request,
)
from .conftest import Clock

# The chain fixtures: one anvil and v2 deployment per session, reverted per test.
chain_session = fixtures.chain_session
world = fixtures.world
market = fixtures.market


def _indexer(world: ChainWorld, service: MarketService, **kwargs: object) -> Indexer:
    return Indexer(service, rpc_url=world.anvil.url, escrow=world.escrow.address, **kwargs)  # type: ignore[arg-type]


def _market_deal(world: ChainWorld, service: MarketService) -> tuple[str, int]:
    """Match an ask and a bid, attach the provider's quote for the fill, open it on chain."""
    provider, client = world.trader(world.providers[0]), world.trader(world.clients[0])
    deal_id, terms = match(world, service, provider, client)
    fill = deal_quote(provider, terms, client.address, 10_000, service.now() + 600)
    attach(service, deal_id, fill, provider.key)
    return deal_id, open_on_chain(world, service, deal_id, client.key, provider.key)


def test_indexer_follows_deal_from_open_to_close(world: ChainWorld, market: MarketService) -> None:
    client, provider = world.clients[0], world.providers[0]
    indexer = _indexer(world, market)
    assert indexer.run_once() == 0
    assert indexer.indexed_block() == world.head()
    deal_id, chain_deal = _market_deal(world, market)
    assert indexer.run_once() == 3  # Deposited, Staked, DealOpened
    record = market.deal(deal_id)
    assert (record.status, record.chain_deal_id) == ("opened", chain_deal)
    assert record.opened_tx is not None

    domain = world.escrow.domain
    v = Voucher(deal_id=chain_deal, cumulative_amount=1_500, tasks=task_bitmap([0, 1, 2]))
    paid = world.escrow.redeem_voucher(provider, v, v.sign(domain, client))
    request = task_request(chain_deal, 3, deadline=world.now() + 10, max_price=600)
    ack = ack_of(request, 500)
    world.anvil.increase_time(10 + MIN_WINDOW + 1)  # past the task's settleBy
    refund = world.escrow.refund_breach(client, request, ack, ack.sign(domain, provider))
    assert indexer.run_once() == 2
    record = market.deal(deal_id)
    assert (record.status, record.tasks_paid, record.paid) == ("paid", 3, "1500")
    assert (record.refunds, record.refunded, record.penalties) == (1, "500", "50000")
    assert record.last_tx == refund.tx_hash != paid.tx_hash

    # Restart: a new service and indexer on the same database resume after the last block.
    market.close()
    restarted = MarketService(market.settings, clock=Clock(world.now()))
    again = _indexer(world, restarted)
    assert again.indexed_block() == indexer.indexed_block() == world.head()
    assert again.run_once() == 0
    world.escrow.close_deal(client, chain_deal)
    closed = world.escrow.close_deal(provider, chain_deal)
    assert again.run_once() == 3  # CloseAgreed by each party, then DealClosed
    record = restarted.deal(deal_id)
    assert (record.status, record.closed_tx, record.tasks_paid) == ("closed", closed.tx_hash, 3)
    restarted.close()


def test_indexer_reports_the_accounts_whose_balance_or_stake_each_runs_events_moved(
    world: ChainWorld, market: MarketService
) -> None:
    indexer = _indexer(world, market)
    assert indexer.run_once() == 0 and indexer.moved == frozenset()
    holder, staker = address_of(world.clients[1]), address_of(world.providers[1])
    world.escrow.deposit(world.clients[1], 5)
    world.escrow.stake(world.providers[1], 7)
    assert indexer.run_once() == 2 and indexer.moved == {holder, staker}
    world.escrow.withdraw(world.clients[1], 5)
    world.escrow.unstake(world.providers[1], 7)
    assert indexer.run_once() == 2 and indexer.moved == {holder, staker}
    client, provider = address_of(world.clients[0]), address_of(world.providers[0])
    _, chain_deal = _market_deal(world, market)
    assert indexer.run_once() == 3 and indexer.moved == {client, provider}  # funds, then the deal
    v = Voucher(deal_id=chain_deal, cumulative_amount=1_500, tasks=task_bitmap([0]))
    world.escrow.redeem_voucher(
        world.providers[0], v, v.sign(world.escrow.domain, world.clients[0])
    )
    assert indexer.run_once() == 1 and indexer.moved == {client, provider}
    world.escrow.close_deal(world.clients[0], chain_deal)  # an agreement moves no money
    assert indexer.run_once() == 1 and indexer.moved == frozenset()
    world.escrow.close_deal(world.providers[0], chain_deal)
    assert indexer.run_once() == 2 and indexer.moved == {client, provider}
    assert indexer.run_once() == 0 and indexer.moved == frozenset()


def test_indexer_stores_every_term_and_credit_the_v2_events_carry(
    world: ChainWorld, market: MarketService
) -> None:
    provider, client = world.trader(world.providers[1]), world.trader(world.clients[1])
    reserved = Plan(inference_price=400, reservation_fee=300, reserved_discount_bps=500)
    deal_id, terms = match(
        world, market, provider, client, plan=reserved, penalty=7_000, stake=90_000
    )
    fill = deal_quote(provider, terms, client.address, 10_000, market.now() + 600)
    attach(market, deal_id, fill, provider.key)
    chain_deal = open_on_chain(world, market, deal_id, client.key, provider.key)
    _indexer(world, market).run_once()
    with market.session() as session:
        row = chain_index.get_chain_deal(session=session, chain_deal_id=chain_deal)
        assert row is not None
        state = world.escrow.get_deal(chain_deal)
        assert (row.client, row.provider, row.arbiter) == (
            state.client,
            state.provider,
            state.arbiter,
        )
        assert (row.stake, row.penalty, row.max_spend) == ("90000", "7000", "10000")
        assert (row.expiry, row.challenge_window, row.slo_ms) == (state.expiry, MIN_WINDOW, 100)
        assert row.plan_hash == "0x" + state.plan_hash.hex()
        assert row.quote_hash == "0x" + fill.struct_hash().hex()
        assert row.reservation_fee == "300"
    record = market.deal(deal_id)
    assert (record.reservation_fee, record.paid) == ("300", "0")  # a fee is not pay for work


def test_indexer_when_rpc_down_then_retries_and_catches_up(
    world: ChainWorld, market: MarketService
) -> None:
    _market_deal(world, market)
    indexer = Indexer(
        market, rpc_url=f"http://127.0.0.1:{free_port()}", escrow=world.escrow.address
    )
    assert indexer.run_once() == 0  # nobody answers: recorded, not raised
    assert indexer.last_error is not None and indexer.indexed_block() is None
    indexer.rpc_url = world.anvil.url  # the endpoint comes back
    assert indexer.run_once() == 3  # Deposited, Staked, DealOpened
    assert indexer.last_error is None


def test_indexer_when_from_block_given_then_skips_earlier_history(
    world: ChainWorld, market: MarketService
) -> None:
    world.escrow.deposit(world.clients[0], 10_000)
    head = world.head()
    indexer = _indexer(world, market, from_block=head + 1)
    assert indexer.run_once() == 0
    world.escrow.deposit(world.clients[0], 5_000)
    assert indexer.run_once() == 1
    assert indexer.indexed_block() == head + 1


def test_indexer_starts_at_the_escrows_deployment_block_and_stores_it_at_once(
    world: ChainWorld, market: MarketService
) -> None:
    w3 = world.chain.w3
    assert creation_block(w3, world.escrow.address) == world.deploy_block
    assert deployment_block(w3, world.escrow.address, world.head()) == world.deploy_block
    indexer = _indexer(world, market)
    world.escrow.deposit(world.clients[0], 10_000)
    assert indexer.run_once() == 1
    # A restart finds its position stored: it neither searches nor scans from block 0 again.
    assert indexer.indexed_block() == world.head()


def test_deployment_block_when_node_keeps_no_history_then_refuses_to_guess(
    world: ChainWorld, market: MarketService
) -> None:
    with pytest.raises(DeploymentBlockUnknownError, match="MARKET_FROM_BLOCK"):
        first_block_with_code(world.chain.w3, world.escrow.address, world.head())
    stranger = "0x" + "77" * 20  # no code, no creator
    with pytest.raises(DeploymentBlockUnknownError):
        deployment_block(world.chain.w3, stranger, world.head())
    indexer = Indexer(market, rpc_url=world.anvil.url, escrow=stranger)
    assert indexer.run_once() == 0
    assert indexer.last_error is not None and indexer.indexed_block() is None


@pytest.fixture
def archive_anvil() -> Iterator[Anvil]:
    """An anvil that keeps every past state (no `--prune-history`), as an archive node does."""
    port = free_port()
    args = [
        str(ANVIL_BINARY), "--host", "127.0.0.1", "--port", str(port),
        "--accounts", "10", "--mnemonic", DEV_MNEMONIC, "--silent",
    ]  # fmt: skip
    process = processes.spawn(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    anvil = Anvil(port=port, chain_id=31337, process=process, keys=dev_keys(10))
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                rpc(anvil.url, "eth_chainId", timeout=1.0)
                break
            except ChainError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.05)  # readiness poll of an external process
        yield anvil
    finally:
        anvil.stop()


def test_deployment_block_when_node_keeps_history_then_binary_search_finds_it(
    archive_anvil: Anvil,
) -> None:
    archive = deploy_world(archive_anvil)
    w3 = Chain(archive_anvil.url).w3
    head = int(w3.eth.block_number)
    assert head > archive.deploy_block > 0
    assert first_block_with_code(w3, archive.escrow.address, head) == archive.deploy_block
    assert first_block_with_code(w3, archive.token.address, head) == archive.deploy_block - 1


def test_indexer_when_the_market_moves_to_another_escrow_then_forgets_the_old_ones_deals(
    world: ChainWorld, market: MarketService
) -> None:
    deal_id, _ = _market_deal(world, market)
    _indexer(world, market).run_once()
    assert market.deal(deal_id).chain_deal_id is not None
    other = world.chain.deploy(world.deployer, min_challenge_window=MIN_WINDOW)
    Indexer(market, rpc_url=world.anvil.url, escrow=other.escrow).run_once()
    assert market.deal(deal_id).chain_deal_id is None
    with market.session() as session:
        assert chain_index.chain_deals(session=session, ids=[0, 1, 2]) == {}


def test_init_db_when_chain_index_is_from_an_older_protocol_then_rebuilt(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", run_jobs=False)
    engine = database.make_engine(url=database.database_url(data_dir=settings.data_dir, url=None))
    with engine.begin() as connection:  # the v1 shape: no terms, no penalties
        connection.exec_driver_sql(
            "CREATE TABLE chain_deals (chain_deal_id BIGINT PRIMARY KEY, client VARCHAR(42), "
            "provider VARCHAR(42), tasks_paid BIGINT)"
        )
        connection.exec_driver_sql("INSERT INTO chain_deals VALUES (1, '0x1', '0x2', 65536)")
        connection.exec_driver_sql("CREATE TABLE indexer_state (name VARCHAR(64), block BIGINT)")
        connection.exec_driver_sql("INSERT INTO indexer_state VALUES ('escrow:old', 99)")
    database.init_db(engine=engine)
    with Session(engine) as session:
        assert session.get(ChainDeal, 1) is None
        assert chain_index.indexer_names(session=session) == []
        columns = session.execute(text("SELECT * FROM chain_deals")).keys()
        assert "penalties" in columns and "challenge_window" in columns
        assert session.get(Deal, "x") is None  # the deals table exists and is usable
    engine.dispose()
