"""Market data: books, fills, price history, the domain to sign under (live updates: `stream`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from market.api.deps import ServiceDep
from market.errors import ChainUnavailableError
from market.indexer import DeploymentBlockUnknownError, deployment_block
from market.models import INT64, LABEL, FillPublic
from market.presenters import OFFER_SORTS, TOKEN_DECIMALS, BookPublic, OfferPublic
from market.service import MarketService
from market.tape import StatsPublic

router = APIRouter(prefix="/v1", tags=["market data"])

OVERVIEW_HISTORY_S = 3 * 3600
"""The page's price chart covers the last three hours in one-minute bars."""


_ESCROW_BLOCKS: dict[tuple[str, str], int] = {}
"""The escrow deployment blocks found on the chain, by (RPC URL, escrow address)."""


def escrow_block(service: MarketService) -> int | None:
    """Return the escrow's deployment block: the configured one (`MARKET_FROM_BLOCK`), else
    the one the node tells (found once, as the indexer finds it); None when unknown."""
    settings = service.settings
    if settings.index_from_block is not None:
        return settings.index_from_block
    if not service.knows_escrow():
        return None
    key = (str(settings.rpc_url), settings.escrow.lower())
    if key not in _ESCROW_BLOCKS:
        try:
            _ESCROW_BLOCKS[key] = service.escrow.read(
                lambda e: deployment_block(e.tx.w3, e.address, int(e.tx.w3.eth.block_number))
            )
        except (ChainUnavailableError, DeploymentBlockUnknownError):
            return None
    return _ESCROW_BLOCKS[key]


@router.get("/domain")
def domain(service: ServiceDep) -> dict[str, Any]:
    """Return the EIP-712 domains: market messages (orders) and settlement messages (quotes),
    and `escrow_block`, the escrow's deployment block (null when unknown): the block from
    which a client's indexer or claim watcher reads the escrow's logs."""
    market = service.domain
    return {
        "escrow_block": escrow_block(service),
        "market": {
            "name": market.name,
            "version": market.version,
            "chain_id": market.chain_id,
            "verifying_contract": market.verifying_contract,
        },
        "escrow": {
            "name": service.escrow_domain.name,
            "version": service.escrow_domain.version,
            "chain_id": service.escrow_domain.chain_id,
            "verifying_contract": service.escrow_domain.verifying_contract,
        },
    }


@router.get("/health", tags=["health"])
def health(service: ServiceDep) -> dict[str, Any]:
    """Return `status` (`ok`, or `degraded` with what is `missing`), whether the chain node
    answers (`chain`: `ok`, `unreachable`, or `none` without an escrow) and whether orders are
    checked against escrow funds (`funds_check`). Reads are served whatever it says; `/healthz`
    only says the process serves."""
    return service.health()


@router.get("/typed-data")
def typed_data(service: ServiceDep) -> dict[str, Any]:
    """Return the EIP-712 typed data of every settlement message, domain filled for the escrow.

    A wallet takes `messages[<type>].typedData` (`types`, `primaryType`, `domain`), adds
    `message`, and signs it with `eth_signTypedData_v4`.
    """
    return service.typed_data()


@router.get("/classes")
def classes(service: ServiceDep) -> list[str]:
    """Return the device classes that have a book."""
    return service.device_classes()


Plan = Annotated[str | None, Query(pattern=LABEL, description="orders of this plan only")]
Units = Annotated[int | None, Query(ge=0, le=INT64)]
SORT = "^-?(" + "|".join(OFFER_SORTS) + ")$"


@router.get("/book/{device_class}")
def book(
    device_class: Annotated[str, Path(pattern=LABEL)],
    service: ServiceDep,
    levels: Annotated[int, Query(ge=1, le=500)] = 50,
    plan: Plan = None,
    slo_ms: Annotated[
        int | None, Query(ge=1, le=INT64, description="a bid's SLO: asks this fast, bids slower")
    ] = None,
    memory: Annotated[
        int | None, Query(ge=0, le=INT64, description="a bid's memory: asks with it, bids less")
    ] = None,
) -> BookPublic:
    """Return a class's live orders by price level and terms (plan, SLO, memory), best first.

    Each level holds orders of one plan, SLO and memory. With `plan`, `slo_ms` and `memory`
    given (a buyer's needs), only asks that can serve such a bid and bids no more demanding are
    shown: every bid shown can trade with every ask shown (`tradable`), so best bid < best ask.
    """
    return service.book(device_class, levels, plan=plan, slo_ms=slo_ms, memory=memory)


@router.get("/offers")
def offers(
    service: ServiceDep,
    device_class: Annotated[str | None, Query(pattern=LABEL)] = None,
    plan: Plan = None,
    max_slo_ms: Units = None,
    min_memory: Units = None,
    max_price: Annotated[int | None, Query(ge=0, le=INT64, description="token base units")] = None,
    min_reliability: Annotated[float | None, Query(ge=0, le=1)] = None,
    online: Annotated[bool, Query(description="only providers with a recent heartbeat")] = False,
    sort: Annotated[str, Query(pattern=SORT, description="a field; `-` for descending")] = "price",
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[OfferPublic]:
    """Return live asks as offers: provider, reliability, terms, price, capacity, and the
    `tpumarket client bid` command that takes each."""
    return service.offers(
        device_class=device_class,
        plan=plan,
        max_slo_ms=max_slo_ms,
        min_memory=min_memory,
        max_price=max_price,
        min_reliability=min_reliability,
        online_only=online,
        sort=sort,
        limit=limit,
    )


@router.get("/fills")
def fills(
    service: ServiceDep,
    device_class: Annotated[str | None, Query(pattern=LABEL)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[FillPublic]:
    """Return recent matches, newest first across every class (in the order they committed)."""
    return service.fills(device_class=device_class, limit=limit)


@router.get("/history/{device_class}")
def history(
    device_class: Annotated[str, Path(pattern=LABEL)],
    service: ServiceDep,
    since: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    bucket_s: Annotated[int, Query(ge=1, le=86_400)] = 60,
) -> list[list[int]]:
    """Return price bars `[start, open, high, low, close, volume]` of a class's fills, oldest
    first (prices in token base units)."""
    return [list(bar) for bar in service.history(device_class, since=since, bucket_s=bucket_s)]


@router.get("/stats/{device_class}")
def stats(device_class: Annotated[str, Path(pattern=LABEL)], service: ServiceDep) -> StatsPublic:
    """Return a class's last price, 24 h change, high, low and volume."""
    return service.stats(device_class)


@router.get("/overview")
def overview(service: ServiceDep) -> dict[str, Any]:
    """Return what the web page shows besides the book and offers, in one response."""
    names = service.device_classes()
    since = service.now() - OVERVIEW_HISTORY_S
    return {
        "version": service.version,
        "token_decimals": TOKEN_DECIMALS,
        "escrow": service.domain.verifying_contract,
        "classes": names,
        "stats": {n: service.stats(n).model_dump() for n in names},
        "fills": [f.model_dump() for f in service.fills(device_class=None, limit=30)],
        "providers": [p.model_dump() for p in service.providers()],
        "deals": [
            d.model_dump(exclude={"bid", "ask", "quote"})
            for d in service.deals(party=None, limit=30)
        ],
        "history": {n: service.history(n, since=since, bucket_s=60) for n in names},
    }
