"""The funds check's commitments, kept in memory, against the stored rows.

A real market service on a real SQLite store, its writer, cancels and expiry job, with an
escrow whose balances the test sets (`FakeEscrow`: the chain side of the funds check is tested
on anvil in `test_funds.py`, `test_match_gate.py` and `test_balance_index.py`). After any
sequence of bids, asks, cancels, fills, expiries, deposits, withdrawals, deals opened and deals
aging out of the hold, the incremental figures (`market.commitments.Commitments`) equal a
recomputation from the rows, and a bid is admitted exactly when its signer's balance covers it
on top of what it committed.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sqlalchemy import text

from contracts.binding import Escrow
from market.commitments import Commitments
from market.errors import OrderStateError, QuotaError, UnfundedError
from market.escrow_reader import EscrowReader
from market.models import CancelCreate, HeartbeatCreate, OrderCreate
from market.service import MarketService
from market.settings import Settings

from .conftest import START, Clock
from .signing import CHAIN_ID, ESCROW, Trader

HOLD_S = 40  # a matched deal counts this long unless it opens
STAKE = 10**7
CLASSES = ("tpu-v5e", "tpu-v6e")


class FakeEscrow:
    """Balances and stakes the test sets; the escrow's minimum challenge window."""

    def __init__(self) -> None:
        self.balances: dict[str, int] = {}
        self.stakes: dict[str, int] = {}
        self.block = 1

    def balance_of(self, address: str) -> int:
        return self.balances.get(address, 0)

    def stake_of(self, address: str) -> int:
        return self.stakes.get(address, 0)

    def min_challenge_window(self) -> int:
        return 1


class FakeReader(EscrowReader):
    """The market's escrow reader, reading `FakeEscrow` instead of a chain."""

    def __init__(self, settings: Settings, escrow: FakeEscrow) -> None:
        super().__init__(settings)
        self.fake = escrow

    def known(self) -> bool:
        return True

    def read(self, read: Callable[[Escrow], Any]) -> Any:
        return read(self.fake)  # type: ignore[arg-type]  # the calls the funds check makes

    def balance_of(self, account: str) -> int:
        return self.fake.balance_of(account)

    def stake_of(self, provider: str) -> int:
        return self.fake.stake_of(provider)

    def head(self) -> int:
        return self.fake.block


class CommitmentsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="commitments-"))
        self.escrow = FakeEscrow()
        self.clock = Clock(START)
        market_settings = Settings(
            data_dir=self.dir,
            chain_id=CHAIN_ID,
            escrow=ESCROW,
            rpc_url="http://127.0.0.1:9",  # never called: the reader is `FakeReader`
            run_jobs=False,
            unopened_deal_hold_s=HOLD_S,
            max_live_orders_per_owner=12,
        )
        self.service = MarketService(
            market_settings, clock=self.clock, escrow=FakeReader(market_settings, self.escrow)
        )
        self.clients = [Trader() for _ in range(3)]
        self.providers = [Trader() for _ in range(2)]
        for provider in self.providers:  # each advertises its own class: both classes exist
            self.escrow.stakes[provider.address] = STAKE
            self._beat(provider)
        self.placed: list[tuple[Trader, str]] = []

    def teardown(self) -> None:
        self.service.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _beat(self, provider: Trader) -> None:
        self.clock.advance(1)  # a heartbeat must come after the provider's last one
        device_class = CLASSES[self.providers.index(provider)]
        beat = provider.heartbeat(int(self.clock()), device_class=device_class)
        self.service.heartbeat(HeartbeatCreate.model_validate(beat), beat["advert"])

    def _now(self) -> int:
        return self.service.now()

    def _figures(self) -> dict[str, Any]:
        return dict(self.service.commitments.state(self._now()))

    # -- rules ----------------------------------------------------------------------------

    @rule(
        who=st.integers(0, 2),
        price=st.integers(90, 110),
        quantity=st.integers(1, 6),
        klass=st.sampled_from(CLASSES),
        ttl=st.integers(5, 120),
    )
    def bid(self, who: int, price: int, quantity: int, klass: str, ttl: int) -> None:
        client = self.clients[who]
        now = self._now()
        figures = self.service.commitments.figures(client.address, now)
        balance = self.escrow.balance_of(client.address)
        covered = figures.bid_spend + figures.deal_spend + price * quantity <= balance
        body = client.bid(now, price=price, quantity=quantity, device_class=klass, expiry=now + ttl)
        try:
            [placed] = self.service.place([OrderCreate.model_validate(body)])
        except QuotaError:
            quota = self.service.settings.max_live_orders_per_owner
            assert figures.live + figures.cancelled + 1 > quota
            return
        except UnfundedError as exc:
            assert not covered, f"a covered bid was refused: {exc}"
            return
        assert covered, "a bid beyond its signer's balance was admitted"
        self.placed.append((client, placed.order.order_id))

    @rule(
        who=st.integers(0, 1),
        price=st.integers(90, 110),
        quantity=st.integers(1, 8),
        klass=st.sampled_from(CLASSES),
        ttl=st.integers(5, 120),
    )
    def ask(self, who: int, price: int, quantity: int, klass: str, ttl: int) -> None:
        provider = self.providers[who]
        now = self._now()
        quote = provider.quote(slo_ms=100, valid_until=now + ttl)
        body = provider.ask(
            now, price=price, quantity=quantity, device_class=klass, expiry=now + ttl, quote=quote
        )
        try:
            [placed] = self.service.place([OrderCreate.model_validate(body)])
        except QuotaError:
            return
        self.placed.append((provider, placed.order.order_id))

    @rule(pick=st.integers(0, 10**6))
    def cancel(self, pick: int) -> None:
        if not self.placed:
            return
        owner, order_id = self.placed[pick % len(self.placed)]
        body = owner.cancel(order_id, self._now())
        with contextlib.suppress(OrderStateError):  # filled, cancelled or expired before
            self.service.cancel(CancelCreate.model_validate(body))

    @rule(seconds=st.integers(0, 50))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self.service.expire_orders()
        for provider in self.providers:  # its daemon heartbeats all along
            self._beat(provider)

    @rule(who=st.integers(0, 2), amount=st.integers(-2_000, 3_000))
    def deposit_or_withdraw(self, who: int, amount: int) -> None:
        address = self.clients[who].address
        self.escrow.balances[address] = max(0, self.escrow.balance_of(address) + amount)
        self.escrow.block += 1
        self._indexed([address])

    @rule(pick=st.integers(0, 10**6))
    def deal_opens(self, pick: int) -> None:
        with self.service.db.begin() as connection:
            rows = connection.execute(
                text(
                    "SELECT deal_id, client FROM deals WHERE chain_deal_id IS NULL ORDER BY deal_id"
                )
            ).all()
            if not rows:
                return
            deal_id, client = rows[pick % len(rows)]
            connection.execute(
                text("UPDATE deals SET chain_deal_id = :n WHERE deal_id = :d"),
                {"n": pick, "d": deal_id},
            )
        self.escrow.block += 1
        self._indexed([client])

    def _indexed(self, accounts: list[str]) -> None:
        """What an indexer run does after events moved `accounts`: read them again, confirm."""
        reread = self.service.funds.reread(accounts, self._now())
        assert reread.done
        self.service.funds.confirm(self.escrow.block)
        if reread.raised:
            self.service.rematch()

    # -- the property ---------------------------------------------------------------------

    @invariant()
    def incremental_equals_recomputed(self) -> None:
        now = self._now()
        with self.service.db.connect() as connection:
            scratch = Commitments.load(connection, now, HOLD_S).state(now)
        assert self._figures() == scratch


CommitmentsMachine.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_commitments_equal_a_recomputation_and_no_bid_beyond_the_balance = CommitmentsMachine.TestCase


def test_quota_when_a_signer_places_and_cancels_then_its_cancels_count_until_their_expiry(
    tmp_path: Path,
) -> None:
    """Cancelled orders stay remembered until their expiry, so they count against the
    live-order quota until then: placing and cancelling cannot fill memory past it."""
    escrow = FakeEscrow()
    clock = Clock(START)
    market_settings = Settings(
        data_dir=tmp_path,
        chain_id=CHAIN_ID,
        escrow=ESCROW,
        rpc_url="http://127.0.0.1:9",
        run_jobs=False,
        max_live_orders_per_owner=3,
    )
    service = MarketService(
        market_settings, clock=clock, escrow=FakeReader(market_settings, escrow)
    )
    try:
        provider, client = Trader(), Trader()
        escrow.stakes[provider.address] = STAKE
        escrow.balances[client.address] = 10**9
        beat = provider.heartbeat(int(clock()))
        service.heartbeat(HeartbeatCreate.model_validate(beat), beat["advert"])
        now = service.now()
        for _ in range(3):
            body = client.bid(now, price=1, quantity=1, expiry=now + 60)
            [placed] = service.place([OrderCreate.model_validate(body)])
            service.cancel(CancelCreate.model_validate(client.cancel(placed.order.order_id, now)))
        late = client.bid(now, price=1, quantity=1, expiry=now + 600)
        with pytest.raises(QuotaError, match="cancelled ones count"):
            service.place([OrderCreate.model_validate(late)])
        clock.advance(61)  # the cancelled orders' expiry passed: the market forgot them
        service.expire_orders()
        service.place([OrderCreate.model_validate(late)])
    finally:
        service.close()


def test_live_orders_when_counted_then_the_cyclic_collector_stops_walking_their_records() -> None:
    """One record is kept per live order (hundreds of thousands in a busy book), and a full
    collection walks every object the collector tracks, stalling every request meanwhile. The
    records are plain tuples of plain values, which the collector stops tracking at its first
    pass over them (it never does a named tuple's)."""
    import gc

    from market.books import ClassBook
    from market.engine import MatchingEngine
    from market.placement import match_orders
    from market.writer import release
    from scripts.bench_book_growth import NOW
    from scripts.bench_book_growth import orders as bench_orders
    from scripts.bench_sql_growth import checked

    made = checked(bench_orders(2_000, 1, hex_ids=True), 1)
    book = ClassBook(MatchingEngine(), {})
    kept = Commitments(hold_s=3_600)
    for at in range(0, len(made), 14):
        _, rows = match_orders([(made[at : at + 14], NOW)], {"tpu-v5e": book}, None)
        kept.apply(rows.orders, rows.updates, rows.deals)
        release(book)
    gc.collect()
    records = list(kept._orders.values())  # the layout is what is under test
    assert len(records) > 500  # a book of live orders: about half of them rest
    assert not any(gc.is_tracked(r) for r in records)
