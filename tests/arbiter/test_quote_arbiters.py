"""A provider's daemon signs no per-fill quote naming an arbiter outside its ``ask.arbiters``:
a real daemon, a real market process, an ask naming the chain's arbiter."""

from __future__ import annotations

from pathlib import Path

from contracts.messages import address_of
from provider.config_sections import AskConfig
from provider.daemon import Daemon
from provider.sandbox import Sandbox
from tests.provider.conftest import cache_dir, chain_world, sandbox  # noqa: F401
from tests.provider.daemon_support import PENALTY, ChainWorld, provider_config
from tests.provider.test_quotes import (  # noqa: F401
    PRICE,
    STAKE,
    bid,
    market_deal,
    market_url,
    post_ask,
    provider_key,
)


def test_ask_naming_an_arbiter_the_daemon_does_not_accept_gets_no_quote(
    chain_world: ChainWorld,  # noqa: F811
    market_url: str,  # noqa: F811
    sandbox: Sandbox,  # noqa: F811
    provider_key: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    world = chain_world
    chosen = address_of(world.other_client)  # any address but the ask's arbiter
    # The daemon's own ask (naming ``chosen``) is priced above the bid, so the bid fills the
    # ask posted by hand.
    terms = AskConfig(
        price=2 * PRICE,
        quantity=1,
        stake=STAKE,
        penalty=PENALTY,
        arbiter=chosen,
        arbiters=(chosen,),
    )
    node = Daemon(
        provider_config(
            world, tmp_path, private_key=provider_key, market_url=market_url, ask=terms
        ),
        chain=world.chain,
        sandbox=sandbox,
    )
    try:
        node.start(schedule=False)  # its first heartbeat: only live providers' asks match
        # An ask posted by hand naming the chain's arbiter, which the daemon does not accept.
        post_ask(world, market_url, provider_key, quantity=1)
        record = bid(world, market_url, world.client)
        assert node.quotes is not None and node.quotes.arbiters == frozenset({chosen.lower()})

        assert node.quotes.run() == []

        assert market_deal(market_url, record["deal_id"])["quote"] is None
        assert node.journal.quotes() == []
        assert b'tpumarket_provider_quotes_total{result="refused"} 1.0' in node.metrics.render()
    finally:
        node.close()
