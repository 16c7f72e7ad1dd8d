"""What a buyer reads: books split by the terms that decide a match, offers, fills, statistics.

Models and pure builders; the live orders come aggregated from SQL (`market.levels`).

A price level of `/v1/book` holds only orders of one plan, SLO and memory, so two displayed
levels can trade exactly when their terms are compatible (`market.engine.compatible`), and the
engine leaves no compatible pair crossed. A buyer's filter (`plan`, `slo_ms`, `memory`) keeps
the asks that could serve a bid with those needs and the bids no more demanding than it: with
all three given, every bid shown can trade with every ask shown, so best bid < best ask.

Amounts are integers of token base units (as orders are signed); `TOKEN_DECIMALS` turns them
into tokens (`tokens`), as the page and the CLI show them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from pydantic import BaseModel
from pydantic import Field as PField

from market import advert_text
from market.deal_states import DealStatus
from market.levels import AskGroup, Level
from market.models import (
    ChainDeal,
    Deal,
    DealPublic,
    FillPublic,
    Order,
    OrderPublic,
    PlaceResult,
    PlaceSummary,
    Provider,
    ProviderClient,
    ProviderPublic,
)
from market.placement import Placed

TOKEN_DECIMALS = 6
"""Decimals of the settlement token (the CLI's `--price` is in tokens of 6 decimals)."""
MAX_CHOICES = 50
"""Distinct plans, SLOs and memories a book lists for its filters, at most."""


def tokens(units: int) -> str:
    """Return base units as a plain decimal number of tokens (`1603` -> `"0.001603"`)."""
    value = Decimal(units).scaleb(-TOKEN_DECIMALS).normalize()
    return f"{value:f}"


# -- the book -----------------------------------------------------------------------------------


class LevelPublic(BaseModel):
    """Live orders at one price with the same terms: they trade, or not, together."""

    price: int = PField(description="per unit, token base units")
    quantity: int = PField(description="live units")
    orders: int
    plan: str
    slo_ms: int = PField(description="an ask's offered latency, a bid's required latency")
    memory: int = PField(description="bytes an ask offers, bytes a bid needs")


class BookChoices(BaseModel):
    """The distinct terms of a class's live orders (at most `MAX_CHOICES` each), for filters."""

    plans: list[str]
    slo_ms: list[int]
    memory: list[int]


class BookPublic(BaseModel):
    """A class's live orders by price level and terms, best first, as one buyer filters them."""

    device_class: str
    plan: str | None = PField(description="the filter: orders of this plan only")
    slo_ms: int | None = PField(description="the filter: asks at most this slow, bids at least")
    memory: int | None = PField(
        description="the filter: asks with at least this memory, bids at most"
    )
    bids: list[LevelPublic]
    asks: list[LevelPublic]
    best_bid: int | None
    best_ask: int | None
    tradable: bool = PField(description="every bid shown can trade with every ask shown")
    spread: int | None = PField(description="best_ask - best_bid, when `tradable`")
    choices: BookChoices


def book_view(
    bids: Sequence[Level],
    asks: Sequence[Level],
    terms: Sequence[Sequence[Any]],
    *,
    device_class: str,
    plan: str | None = None,
    slo_ms: int | None = None,
    memory: int | None = None,
) -> BookPublic:
    """Return the book of levels given best first (`market.levels`), as filtered by the buyer."""
    bid_levels, ask_levels = ([_level(x) for x in side] for side in (bids, asks))
    best_bid = bid_levels[0].price if bid_levels else None
    best_ask = ask_levels[0].price if ask_levels else None
    tradable = _all_compatible(bid_levels, ask_levels)
    plans, slos, memories = terms
    return BookPublic(
        device_class=device_class,
        plan=plan,
        slo_ms=slo_ms,
        memory=memory,
        bids=bid_levels,
        asks=ask_levels,
        best_bid=best_bid,
        best_ask=best_ask,
        tradable=tradable,
        spread=best_ask - best_bid if tradable and best_bid and best_ask else None,
        choices=BookChoices(plans=list(plans), slo_ms=list(slos), memory=list(memories)),
    )


def _level(x: Level) -> LevelPublic:
    return LevelPublic(
        price=x.price,
        quantity=x.quantity,
        orders=x.orders,
        plan=x.plan,
        slo_ms=x.slo_ms,
        memory=x.memory,
    )


def _all_compatible(bids: Sequence[LevelPublic], asks: Sequence[LevelPublic]) -> bool:
    if not bids or not asks:
        return True
    plans = {level.plan for level in (*bids, *asks)}
    return (
        len(plans) == 1
        and max(a.slo_ms for a in asks) <= min(b.slo_ms for b in bids)
        and min(a.memory for a in asks) >= max(b.memory for b in bids)
    )


# -- offers -------------------------------------------------------------------------------------


class OfferPublic(BaseModel):
    """Live asks of one provider at one price and terms, with what a buyer weighs."""

    provider: str
    device_class: str
    device_kind: str = PField(description="from the provider's latest heartbeat; '' if none")
    online: bool = PField(description="heartbeat seen recently")
    reliability: float | None = PField(description="reputation (docs/market.md); None: unknown")
    has_history: bool = PField(
        default=False, description="whether the provider has value settled on chain (else new)"
    )
    plan: str
    slo_ms: int = PField(description="worst latency offered")
    memory: int = PField(description="bytes offered")
    price: int = PField(description="per unit, token base units")
    quantity: int = PField(description="live units at this price")
    orders: int
    capacity: int = PField(description="units the provider says it can sell now")
    throughput: float = PField(description="units per second the provider measured")
    command: str = PField(description="the client command whose bid takes this offer")


OFFER_SORTS = ("price", "reliability", "slo_ms", "memory", "capacity", "quantity")


def offers_view(
    groups: Iterable[AskGroup],
    providers: Sequence[ProviderPublic],
    *,
    min_reliability: float | None = None,
    online_only: bool = False,
    sort: str = "price",
    limit: int = 100,
) -> list[OfferPublic]:
    """Return offers from grouped live asks (`market.levels.ask_groups`), filtered and sorted.

    `sort` is a field of `OFFER_SORTS`, `-` in front for descending; ties go to the lower
    price, then the more reliable provider, then the provider's address.
    """
    registry = {p.address.lower(): p for p in providers}
    rows: list[tuple[AskGroup, ProviderPublic | None, float]] = []
    for g in groups:
        known = registry.get(g.owner.lower())
        reliability = known.reliability if known else None
        if online_only and not (known and known.online):
            continue
        if min_reliability is not None and (reliability or 0.0) < min_reliability:
            continue
        rows.append((g, known, reliability or 0.0))
    field = sort.lstrip("-")
    sign = -1 if sort.startswith("-") else 1

    def key(row: tuple[AskGroup, ProviderPublic | None, float]) -> tuple[float, int, float, str]:
        g, known, score = row
        value = {
            "price": g.price,
            "reliability": score,
            "slo_ms": g.slo_ms,
            "memory": g.memory,
            "capacity": known.capacity if known else 0,
            "quantity": g.quantity,
        }[field]
        return (sign * float(value), g.price, -score, g.owner)

    return [_offer(g, known) for g, known, _ in sorted(rows, key=key)[:limit]]


def _offer(g: AskGroup, known: ProviderPublic | None) -> OfferPublic:
    return OfferPublic(
        provider=g.owner,
        device_class=g.device_class,
        device_kind=known.device_kind if known else "",
        online=bool(known and known.online),
        reliability=known.reliability if known else None,
        has_history=bool(known and known.has_history),
        plan=g.plan,
        slo_ms=g.slo_ms,
        memory=g.memory,
        price=g.price,
        quantity=g.quantity,
        orders=g.orders,
        capacity=known.capacity if known else 0,
        throughput=known.throughput if known else 0.0,
        command=bid_command(g.device_class, g.plan, g.slo_ms, g.memory, g.price, g.quantity),
    )


def bid_command(
    device_class: str, plan: str, slo_ms: int, memory: int, price: int, quantity: int
) -> str:
    """Return the `tpumarket client bid` command whose bid takes an offer of these terms.

    The bid asks for the offer's SLO and memory exactly (so it is compatible) at the offer's
    price (so it crosses): it fills against this offer or a better one. Every value is a label
    or a number (`LABEL`): nothing in it needs shell quoting.
    """
    return (
        f"tpumarket client bid --device-class {device_class} --plan {plan} "
        f"--slo-ms {slo_ms} --memory {memory} --price {tokens(price)} --quantity {quantity}"
    )


# -- providers and deals ---------------------------------------------------------------------


def reliability(*, paid: int, refunded: int, penalties: int, prior: int) -> float:
    """Return the value-weighted share of good outcomes with a prior of `prior` on each side:
    (paid + prior) / (paid + refunded + penalties + 2 prior); 0.5 with no history."""
    return (paid + prior) / (paid + refunded + penalties + 2 * prior)


def provider_public(row: Provider, sums: Sequence[ProviderClient], prior: int) -> ProviderPublic:
    """Return the API view of a provider with its reputation from its clients' on-chain sums."""
    by_client = [int(s.paid) for s in sums]
    paid = sum(by_client)
    refunded = sum(int(s.refunded) for s in sums)
    penalties = sum(int(s.penalties) for s in sums)
    shown = {k: v for k, v in row.model_dump().items() if k in ProviderPublic.model_fields}
    # A row stored before the advert rules (`market.advert_text`) is served by them too.
    shown["device_kind"] = advert_text.shown_text(row.device_kind)
    shown["endpoint"] = advert_text.shown_url(row.endpoint)
    return ProviderPublic(
        **shown,
        paid=str(paid),
        clients=sum(1 for p in by_client if p > 0),
        top_client_share=round(max(by_client) / paid, 4) if paid else 0.0,
        refunded=str(refunded),
        penalties=str(penalties),
        refunds=sum(s.refunds for s in sums),
        disputes_won=sum(s.disputes_won for s in sums),
        disputes_lost=sum(s.disputes_lost for s in sums),
        reliability=round(
            reliability(paid=paid, refunded=refunded, penalties=penalties, prior=prior), 4
        ),
        has_history=bool(paid or refunded or penalties),
    )


def _order_public_from_row(row: dict[str, Any]) -> OrderPublic:
    quote = json.loads(row["quote_json"]) if row.get("quote_json") else None
    return OrderPublic.model_construct(
        side=row["side"],
        owner=row["owner"],
        device_class=row["device_class"],
        quantity=row["quantity"],
        price=row["price"],
        plan=row["plan"],
        slo_ms=row["slo_ms"],
        memory=row["memory"],
        expiry=row["expiry"],
        nonce=row["nonce"],
        order_id=row["order_id"],
        seq=row["seq"],
        state=row["state"],
        remaining=row["remaining"],
        filled=row["quantity"] - row["remaining"],
        created_at=row["created_at"],
        signature=row["signature"],
        quote=quote,
        quote_signature=row.get("quote_signature"),
    )


def order_public(row: Order) -> OrderPublic:
    """Return the API view of a stored order."""
    return _order_public_from_row(row.model_dump())


def deal_public(deal: Deal, orders: dict[str, Order], chain: ChainDeal | None) -> DealPublic:
    """Return the API view of a deal record with its on-chain settlement status."""
    bid = order_public(orders[deal.bid_id])
    ask = order_public(orders[deal.ask_id])
    if chain is None:
        status = DealStatus.MATCHED
    elif chain.status == DealStatus.CLOSED:
        status = DealStatus.CLOSED
    elif int(chain.paid) or chain.tasks_paid:
        status = DealStatus.PAID
    elif chain.refunds or chain.disputes_lost:
        status = DealStatus.REFUNDED
    else:
        status = DealStatus.OPENED
    attached = deal.quote_json is not None
    return DealPublic(
        deal_id=deal.deal_id,
        device_class=deal.device_class,
        client=deal.client,
        provider=deal.provider,
        price=deal.price,
        quantity=deal.quantity,
        max_spend=deal.max_spend,
        created_at=deal.created_at,
        bid=bid,
        ask=ask,
        quote=json.loads(deal.quote_json) if deal.quote_json else None,
        quote_signature=deal.quote_signature if attached else None,
        quote_hash=deal.quote_hash if attached else None,
        status=status,
        chain_deal_id=deal.chain_deal_id,
        tasks_paid=chain.tasks_paid if chain else 0,
        paid=chain.paid if chain else "0",
        reservation_fee=chain.reservation_fee if chain else "0",
        refunds=chain.refunds if chain else 0,
        refunded=chain.refunded if chain else "0",
        penalties=chain.penalties if chain else "0",
        disputes_won=chain.disputes_won if chain else 0,
        disputes_lost=chain.disputes_lost if chain else 0,
        opened_tx=chain.opened_tx if chain else None,
        last_tx=chain.last_tx if chain else None,
        closed_tx=chain.closed_tx if chain else None,
    )


# -- placements ------------------------------------------------------------------------------


def place_results(placed: list[Placed]) -> list[PlaceResult]:
    """Return each placed order and its fills, as answered to its request."""
    return [PlaceResult.model_construct(order=_placed_order(p), fills=_fills(p)) for p in placed]


def place_summaries(placed: list[Placed]) -> list[PlaceSummary]:
    """Return each placed order's id, state and fills (a batch's cheaper answer)."""
    return [
        PlaceSummary.model_construct(
            order_id=p.checked.order.order_id, state=p.state, remaining=p.remaining, fills=_fills(p)
        )
        for p in placed
    ]


def _fills(placed: Placed) -> list[FillPublic]:
    return [
        FillPublic.model_construct(
            id=f"{f.device_class}:{f.fill_id}",
            device_class=f.device_class,
            fill_id=f.fill_id,
            bid_id=f.bid_id,
            ask_id=f.ask_id,
            price=f.price,
            quantity=f.quantity,
            aggressor=f.aggressor.value,
            time=f.time,
        )
        for f in placed.fills
    ]


def _placed_order(placed: Placed) -> OrderPublic:
    c = placed.checked
    o = c.order
    return OrderPublic.model_construct(
        side=o.side.value,
        owner=o.owner,
        device_class=o.device_class,
        quantity=o.quantity,
        price=o.price,
        plan=o.plan,
        slo_ms=o.slo_ms,
        memory=o.memory,
        expiry=o.expiry,
        nonce=c.nonce,
        order_id=o.order_id,
        seq=placed.seq,
        state=placed.state,
        remaining=placed.remaining,
        filled=o.quantity - placed.remaining,
        created_at=c.created_at,
        signature=c.signature,
        quote=json.loads(c.quote_json) if c.quote_json else None,
        quote_signature=c.quote_signature,
    )
