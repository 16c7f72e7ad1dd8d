"""The market side: the providers' asks, the client's bid, and the deals it opens and runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from client.accounts import ClientAccount, open_market_deal
from client.demo.errors import DemoError
from client.demo.terms import (
    ALPHA,
    BETA,
    BID_PRICE,
    BID_SLO_MS,
    CHALLENGE_WINDOW,
    DEAL_DURATION,
    DEVICE_CLASS,
    PROFILES,
    QUOTE_WAIT_S,
    ProviderProfile,
)
from client.demo.text import Say, outcome_line, tokens
from client.demo.workload import Task, Workload
from client.market_http import MarketHttp
from client.provider_http import ProviderHttp
from client.session import DealSession
from client.tasks import TaskOutcome
from client.vouchers import VoucherBook
from contracts.binding import Escrow
from contracts.messages import ZERO_ADDRESS, Quote, Voucher, address_of
from contracts.orders import Ask, Bid, market_domain, order_id, plan_kind


@dataclass
class Deal:
    """One matched deal, opened on chain, its session and what it ran."""

    profile: ProviderProfile
    market_id: str
    chain_id: int
    session: DealSession
    outcomes: list[TaskOutcome] = field(default_factory=list)
    tasks: dict[int, Task] = field(default_factory=dict)  # by id() of the task's spec
    voucher: Voucher | None = None  # the latest voucher the client handed to the provider

    def task_of(self, outcome: TaskOutcome) -> Task | None:
        """Return the workload item an outcome ran."""
        return self.tasks.get(id(outcome.spec))


def post_ask(
    market: MarketHttp,
    escrow: Escrow,
    profile: ProviderProfile,
    provider_key: str,
    arbiter: str,
    nonce: int,
) -> str:
    """As the provider's operator: sign a quote and an ask that binds it; post the ask."""
    expiry = int(time.time()) + 1_800
    quote = Quote(
        provider=address_of(provider_key),
        client=ZERO_ADDRESS,
        arbiter=arbiter,
        max_spend=profile.ask_price * profile.ask_quantity,
        stake=profile.stake,
        penalty=profile.penalty,
        duration=DEAL_DURATION,
        challenge_window=CHALLENGE_WINDOW,
        slo_ms=profile.slo_ms,
        valid_until=expiry,
        nonce=nonce,
        plan=profile.plan,
    )
    ask = Ask(
        owner=address_of(provider_key),
        device_class=DEVICE_CLASS,
        quantity=profile.ask_quantity,
        price=profile.ask_price,
        plan=plan_kind(profile.plan),
        slo_ms=profile.slo_ms,
        memory=0,
        expiry=expiry,
        nonce=nonce,
        quote_hash=quote.struct_hash(),
    )
    domain = market_domain(escrow.domain.chain_id, escrow.address)
    market.place_order(
        ask,
        ask.sign(domain, provider_key),
        quote=quote,
        quote_signature=quote.sign(escrow.domain, provider_key),
    )
    return order_id(ask, domain)


def bid_and_open(
    market: MarketHttp,
    escrow: Escrow,
    account: ClientAccount,
    providers: Mapping[str, tuple[ProviderProfile, str]],
    say: Say,
) -> list[Deal]:
    """Bid for every ask's units, wait for the match, open each deal with its quote.

    ``providers`` maps each provider's address (lower case) to its profile and daemon URL.
    """
    domain = market_domain(escrow.domain.chain_id, escrow.address)
    quantity = sum(p.ask_quantity for p in PROFILES)
    bid = Bid(
        owner=account.address,
        device_class=DEVICE_CLASS,
        quantity=quantity,
        price=BID_PRICE,
        plan=plan_kind(PROFILES[0].plan),
        slo_ms=BID_SLO_MS,
        memory=0,
        expiry=int(time.time()) + 1_800,
        nonce=1,
    )
    market.place_bid(bid, domain, account.key)
    bid_id = order_id(bid, domain)
    say(f"bid       {quantity} units at up to {tokens(BID_PRICE)}, SLO up to {BID_SLO_MS} ms")
    records = market.wait_for_deals(account.address, bid_id)
    adverts = {p["address"].lower(): p for p in market.providers()}
    deals = []
    for record in sorted(records, key=lambda r: str(r["deal_id"])):
        known = providers.get(str(record["provider"]).lower())
        if known is None:
            raise DemoError(f"deal {record['deal_id']} names an unknown provider")
        profile, url = known
        # The ask's quote names nobody: it is the provider's signed terms. For this fill the
        # provider's daemon signs a quote naming the client, which the client checks against
        # the ask's terms before opening the deal with it.
        started = time.monotonic()
        opened = open_market_deal(market, account, str(record["deal_id"]), wait_s=QUOTE_WAIT_S)
        say(
            f"quote     {profile.name} signed a quote for {record['deal_id']} naming the client "
            f"({time.monotonic() - started:.1f} s after the match), with the ask's terms"
        )
        quote, max_spend, chain_deal = opened.quote, opened.max_spend, opened.chain_deal_id
        advert = adverts.get(quote.provider.lower())
        endpoint = str(advert["endpoint"]) if advert else url
        say(
            f"match     {record['deal_id']}: {record['quantity']} units from {profile.name} "
            f"at {tokens(int(record['price']))} -> deal {chain_deal} opened on chain "
            f"(cap {tokens(max_spend)}), tasks go to {endpoint}"
        )
        session = DealSession(
            provider=ProviderHttp(endpoint, client_key=account.key),
            account=account,
            domain=escrow.domain,
            deal_id=chain_deal,
            plan=quote.plan,
            provider_address=quote.provider,
            book=VoucherBook(deal_id=chain_deal, cap=max_spend, on_warning=say),
            challenge_window=quote.challenge_window,
            # Half of alpha's inference deliveries are re-run on the client's CPU before they
            # are paid. Beta's are not: its provider may claim a task 5 s after its deadline
            # (settleBy - window / 2), and a local re-run (a compile, then seconds of CPU on a
            # loaded host) could hold the task's voucher past that instant.
            spot_check_fraction=0.5 if profile is ALPHA else 0.0,
        )
        deals.append(Deal(profile, str(record["deal_id"]), chain_deal, session))
    expected = {p.name for p in PROFILES}
    if {d.profile.name for d in deals} != expected:
        raise DemoError(f"expected a deal with each provider, got {[d.market_id for d in deals]}")
    return deals


def run_workload(
    deals: list[Deal],
    workload: Workload,
    say: Say,
    on_verified: Callable[[Deal, TaskOutcome], object] | None = None,
) -> None:
    """Run each deal's tasks (all deals at once), verifying every delivery.

    ``on_verified`` is called with the deal and the task's outcome as soon as one of its
    deliveries is verified (the client pays per task), right after that task's progress line;
    one lock keeps each task's lines together and the calls one at a time.
    """
    lock = threading.Lock()

    def progress(deal: Deal) -> Callable[[TaskOutcome], None]:
        def done(outcome: TaskOutcome) -> None:
            line = outcome_line(outcome, deal.task_of(outcome))
            with lock:
                say(f"task      {deal.profile.name} #{outcome.index}: {line}")
                if outcome.verified and on_verified is not None:
                    on_verified(deal, outcome)

        return done

    def one(deal: Deal) -> None:
        tasks = workload.tasks[deal.profile.name]
        deal.tasks = {id(task.spec): task for task in tasks}
        concurrency = 3 if deal.profile is BETA else 2
        deal.outcomes = deal.session.run(
            [t.spec for t in tasks], concurrency=concurrency, wait_s=60, on_done=progress(deal)
        )

    with ThreadPoolExecutor(max_workers=len(deals)) as pool:
        for future in [pool.submit(one, d) for d in deals]:
            future.result()
