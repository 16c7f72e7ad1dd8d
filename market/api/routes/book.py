"""Market data: books, fills, price history, the domain to sign under, and a live stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse

from market.api.deps import ServiceDep
from market.errors import RateLimitedError
from market.models import INT64, LABEL, FillPublic
from market.presenters import OFFER_SORTS, TOKEN_DECIMALS, BookPublic, OfferPublic
from market.service import MarketService
from market.tape import StatsPublic

router = APIRouter(prefix="/v1", tags=["market data"])

STREAM_POLL_S = 0.2
STREAM_KEEPALIVE_S = 15.0
STREAM_LIFETIME_S = 600.0
"""A stream ends after this long; the browser's EventSource reconnects (`retry: 1000`)."""
OVERVIEW_HISTORY_S = 3 * 3600
"""The page's price chart covers the last three hours in one-minute bars."""


@router.get("/domain")
def domain(service: ServiceDep) -> dict[str, Any]:
    """Return the EIP-712 domains: market messages (orders) and settlement messages (quotes)."""
    market = service.domain
    return {
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


@router.get("/typed-data")
def typed_data(service: ServiceDep) -> dict[str, Any]:
    """Return the EIP-712 typed data of every settlement message, domain filled for the escrow.

    A wallet picks a type from `primaryTypes`, fills `message`, and signs
    `{"types", "primaryType", "domain", "message"}` with `eth_signTypedData_v4`.
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
) -> list[tuple[int, int, int, int, int, int]]:
    """Return price bars (start, open, high, low, close, volume) of a class's fills."""
    return service.history(device_class, since=since, bucket_s=bucket_s)


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


class Changes:
    """One poller of the market's change counter that wakes every live-update stream.

    An idle stream waits on an event and costs nothing until the market changes (or its
    keep-alive is due); the counter is read every `STREAM_POLL_S` by one task, however many
    streams are open. At most `max_streams` are served at once, `max_per_ip` to one address
    (429 beyond).
    """

    def __init__(self, service: MarketService, *, max_streams: int, max_per_ip: int) -> None:
        """Watch `service.version`; serve at most `max_streams` streams, `max_per_ip` each."""
        self._service = service
        self.max_streams = max_streams
        self.max_per_ip = max_per_ip
        self.open = 0
        self._by_ip: dict[str, int] = {}
        self._changed = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    def check(self, ip: str) -> None:
        """Raise `RateLimitedError` when `max_streams` streams are open, or `max_per_ip` to
        `ip`."""
        if self.open >= self.max_streams:
            raise RateLimitedError("live-update streams", STREAM_KEEPALIVE_S)
        if self._by_ip.get(ip, 0) >= self.max_per_ip:
            raise RateLimitedError(f"live-update streams of {ip}", STREAM_KEEPALIVE_S)

    def enter(self, ip: str) -> None:
        """Count a stream of `ip` opened."""
        self.open += 1
        self._by_ip[ip] = self._by_ip.get(ip, 0) + 1

    def leave(self, ip: str) -> None:
        """Count a stream of `ip` ended."""
        self.open -= 1
        left = self._by_ip.pop(ip, 1) - 1
        if left:
            self._by_ip[ip] = left

    async def wait(self, seen: int, timeout: float) -> int:
        """Return the version once it differs from `seen`, or after `timeout` seconds."""
        changed = self._start()
        if self._service.version == seen:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # no task, no lock: cheap to cancel
                    await changed.wait()
        return self._service.version

    def close(self) -> None:
        """Stop the poller."""
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    def _start(self) -> asyncio.Event:
        """Return the event the next change sets (starting the poller in this loop if none)."""
        if self._poller is None or self._poller.done():
            self._changed = asyncio.Event()
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        return self._changed

    async def _poll(self) -> None:
        last = self._service.version
        while True:
            await asyncio.sleep(STREAM_POLL_S)  # one poll of an in-memory counter for all
            version = self._service.version
            if version != last:
                last = version
                changed, self._changed = self._changed, asyncio.Event()
                changed.set()  # wakes every stream waiting on this change


def _changes(request: Request, service: MarketService) -> Changes:
    changes: Changes | None = getattr(request.app.state, "changes", None)
    if changes is None:  # an app used without its lifespan (schema tools)
        changes = request.app.state.changes = Changes(
            service,
            max_streams=service.settings.max_streams,
            max_per_ip=service.settings.max_streams_per_ip,
        )
    return changes


@router.get("/stream", response_class=StreamingResponse)
async def stream(request: Request, service: ServiceDep) -> StreamingResponse:
    """Server-sent events: an `update` event carrying the version whenever the market changes."""
    changes = _changes(request, service)
    ip = request.client.host if request.client else "unknown"
    changes.check(ip)
    loop = asyncio.get_running_loop()

    async def events() -> AsyncIterator[str]:
        changes.enter(ip)  # counted here: a stream never started never ends either
        try:
            ends = loop.time() + STREAM_LIFETIME_S
            seen = service.version
            yield f"retry: 1000\n\nevent: update\ndata: {seen}\n\n"
            while loop.time() < ends:
                version = await changes.wait(seen, STREAM_KEEPALIVE_S)
                if version != seen:
                    seen = version
                    yield f"event: update\ndata: {version}\n\n"
                else:
                    yield ": keepalive\n\n"
        finally:
            changes.leave(ip)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
