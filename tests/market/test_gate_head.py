"""The match gate's chain head (`market.funds.FundsGuard.head_now`): read at most once per
`head_max_age_s`, and what a bid's owner can then fill.

The gate takes a bid owner's kept balance only while the chain head is the block the indexer
confirmed it at; the head is reused for `head_max_age_s` (not read once per group commit), so a
withdrawal mined within that window goes unseen for it, and not one moment longer. The clock
here is the test's, so the window's edges are exact; the chain is a counter the test moves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from market.commitments import Commitments
from market.errors import ChainUnavailableError
from market.funds import FundsGuard

CLIENT = "0x" + "c1" * 20
AGE_S = 0.05


class Chain:
    """A chain head and one client's free escrow balance, both set by the test; reads counted."""

    def __init__(self) -> None:
        self.block = 7
        self.balance = 600
        self.head_reads = 0
        self.balance_reads = 0
        self.down = False

    def head(self) -> int:
        self.head_reads += 1
        if self.down:
            raise ChainUnavailableError("the node is down")
        return self.block

    def balance_of(self, owner: str) -> int:
        assert owner == CLIENT
        self.balance_reads += 1
        return self.balance


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def _no_session() -> Iterator[None]:
    raise AssertionError("the gate reads no SQL for a bid")
    yield


def _guard(chain: Chain, clock: Clock, age_s: float = AGE_S) -> FundsGuard:
    return FundsGuard(
        read_balance=chain.balance_of,
        read_stake=lambda _: 0,
        session=_no_session,  # type: ignore[arg-type]  # never entered
        book_classes=list,
        commitments=Commitments(hold_s=3_600),
        min_provider_stake=0,
        max_live_orders=10,
        max_classes_per_provider=1,
        cache_s=0,
        head=chain.head,
        head_max_age_s=age_s,
        monotonic=clock,
    )


def test_head_when_asked_again_within_its_max_age_then_kept_and_at_the_age_read_again() -> None:
    chain, clock = Chain(), Clock()
    guard = _guard(chain, clock)
    assert guard.head_now() == 7
    chain.block = 8
    clock.now += AGE_S * 0.99
    assert (guard.head_now(), chain.head_reads) == (7, 1)
    clock.now += AGE_S * 0.01 + 1e-9  # the read began AGE_S ago: read again
    assert (guard.head_now(), chain.head_reads) == (8, 2)


def test_head_when_the_max_age_is_zero_then_every_group_reads_it() -> None:
    chain, clock = Chain(), Clock()
    guard = _guard(chain, clock, age_s=0)
    for block in (7, 8, 8):
        chain.block = block
        assert guard.head_now() == block
    assert chain.head_reads == 3


def test_head_when_the_node_fails_then_none_and_nothing_kept() -> None:
    chain, clock = Chain(), Clock()
    guard = _guard(chain, clock)
    chain.down = True
    assert guard.head_now() is None
    chain.down = False
    assert (guard.head_now(), chain.head_reads) == (7, 2)  # read again at once, not kept


@pytest.mark.parametrize("elapsed", [AGE_S * 0.5, AGE_S * 1.01])
def test_bid_when_its_wallet_is_emptied_after_the_indexer_confirmed_then_unseen_only_within_the_age(
    elapsed: float,
) -> None:
    """The owner's 600 are kept, confirmed at block 7; it withdraws everything in block 8.
    A group within the head's age fills 6 units on the kept figure (the documented window: a
    match locks no funds until its deal opens, so the client could withdraw just after it
    anyway); a group after it reads the head, sees a block since, reads the balance: nothing."""
    chain, clock = Chain(), Clock()
    guard = _guard(chain, clock)
    guard.balances.read(CLIENT)
    guard.confirm(guard.head_now())
    assert guard.gate(0).bid_units(CLIENT, 100, 6) == 6
    chain.block, chain.balance = 8, 0
    clock.now += elapsed
    units = guard.gate(0).bid_units(CLIENT, 100, 6)
    if elapsed < AGE_S:
        assert (units, chain.head_reads, chain.balance_reads) == (6, 1, 1)
    else:
        assert (units, chain.head_reads, chain.balance_reads) == (0, 2, 2)
