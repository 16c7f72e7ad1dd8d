"""The deal cache against the real escrow on anvil: ids never opened are remembered as missing
for a while, in a bounded map; ids no deal can have are never read."""

from __future__ import annotations

import asyncio

import pytest

from provider.deals import MAX_DEAL_ID, DealCache
from provider.errors import RejectedError
from tests.provider.daemon_support import PLAN, ChainWorld

UNKNOWN = 10**9


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        """Start at 0."""
        self.now = 0.0

    def __call__(self) -> float:
        """Return the time now."""
        return self.now


def _missing(cache: DealCache, deal_id: int) -> str:
    with pytest.raises(RejectedError) as caught:
        asyncio.run(cache.aget(deal_id))
    return caught.value.code


def test_missing_ids_when_asked_again_then_answered_without_a_read_until_they_lapse(
    chain_world: ChainWorld,
) -> None:
    clock = Clock()
    cache = DealCache(
        chain_world.escrow, {PLAN.struct_hash(): PLAN}, ttl_s=2.0, max_negative=3, clock=clock
    )
    try:
        ids = [UNKNOWN + n for n in range(5)]
        assert [_missing(cache, i) for i in ids] == ["deal_not_found"] * 5
        assert cache.reads == 5
        # The 3 latest are remembered; the 2 oldest were dropped and are read again.
        assert [_missing(cache, i) for i in ids[2:]] == ["deal_not_found"] * 3
        assert cache.reads == 5
        assert _missing(cache, ids[0]) == "deal_not_found"
        assert cache.reads == 6
        clock.now += 1.0  # half the TTL: every entry lapses
        assert _missing(cache, ids[4]) == "deal_not_found"
        assert cache.reads == 7
        for never in (0, MAX_DEAL_ID, 2**256 - 1):
            assert _missing(cache, never) == "deal_not_found"
        assert cache.reads == 7
        deal_id = chain_world.open_deal()
        state = asyncio.run(cache.aget(deal_id))
        assert (
            state.client.lower()
            == chain_world.chain.w3.eth.account.from_key(chain_world.client).address.lower()
        )
        assert cache.get(deal_id) is state and cache.reads == 8  # cached: no read
    finally:
        cache.close()


def test_next_deal_id_when_asked_before_it_opens_then_retryable_never_a_final_not_found(
    chain_world: ChainWorld,
) -> None:
    clock = Clock()
    cache = DealCache(chain_world.escrow, {PLAN.struct_hash(): PLAN}, ttl_s=2.0, clock=clock)
    try:
        asyncio.run(cache.aget(chain_world.open_deal()))  # the highest deal seen
        upcoming = chain_world.escrow.deal_count() + 1
        assert _missing(cache, upcoming) == "deal_not_found"  # read: not opened yet
        assert _missing(cache, upcoming) == "deal_not_found_recently"  # from the map
        reads = cache.reads
        assert chain_world.open_deal() == upcoming
        assert _missing(cache, upcoming) == "deal_not_found_recently"  # 503: the client retries
        assert cache.reads == reads
        clock.now += 1.0  # by the retry (Retry-After 2 s) the entry has lapsed
        assert asyncio.run(cache.aget(upcoming)).expiry > 0
        assert cache.reads == reads + 1
    finally:
        cache.close()
