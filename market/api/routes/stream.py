"""The live-update stream (`GET /v1/stream`): server-sent events whenever the market changes.

One task per market (`Changes`) reads the change counter every `STREAM_POLL_S` and wakes every
stream at once through one `asyncio.Event`, on a change or when the shared keep-alive is due
(every `STREAM_KEEPALIVE_S`); a stream owns no timer and no poll of its own, so an idle one
costs one keep-alive write per interval. The task stops when the last stream ends. At most
`max_streams` are served at once, `max_per_ip` to one client address (429 beyond): a stream is
counted by `Changes.admit` in the same step as the check (no await between them, so concurrent
opens cannot all pass the check before any is counted), and uncounted when its response ends,
whether or not its body ever started.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from market.api.deps import ServiceDep
from market.errors import RateLimitedError
from market.service import MarketService

router = APIRouter(prefix="/v1", tags=["market data"])

STREAM_POLL_S = 0.2
STREAM_KEEPALIVE_S = 15.0
STREAM_LIFETIME_S = 600.0
"""A stream ends after this long; the browser's EventSource reconnects (`retry: 1000`)."""
_TICKS_PER_KEEPALIVE = round(STREAM_KEEPALIVE_S / STREAM_POLL_S)


class Changes:
    """One poller of the market's change counter and one keep-alive clock for every stream."""

    def __init__(self, service: MarketService, *, max_streams: int, max_per_ip: int) -> None:
        """Watch `service.version`; serve at most `max_streams` streams, `max_per_ip` each."""
        self._service = service
        self.max_streams = max_streams
        self.max_per_ip = max_per_ip
        self.open = 0
        self._by_ip: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    def check(self, ip: str) -> None:
        """Raise `RateLimitedError` when `max_streams` streams are open, or `max_per_ip` to
        `ip`."""
        if self.open >= self.max_streams:
            raise RateLimitedError("live-update streams", STREAM_KEEPALIVE_S)
        if self._by_ip.get(ip, 0) >= self.max_per_ip:
            raise RateLimitedError(f"live-update streams of {ip}", STREAM_KEEPALIVE_S)

    def admit(self, ip: str) -> None:
        """Check and count a stream of `ip` in one step (no await between); raise
        `RateLimitedError` when there is no room for it."""
        self.check(ip)
        self.enter(ip)

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

    async def next(self, seen: int) -> int:
        """Return the version once it differs from `seen`, or when the keep-alive is due."""
        wake = self._start()
        if self._service.version == seen:  # no await between this read and the wait below
            await wake.wait()
        return self._service.version

    def close(self) -> None:
        """Stop the poller."""
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    def _start(self) -> asyncio.Event:
        """Return the event the next wake-up sets (starting the poller in this loop if none)."""
        if self._poller is None or self._poller.done():
            self._wake = asyncio.Event()
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        return self._wake

    async def _poll(self) -> None:
        last = self._service.version
        ticks = 0
        while self.open > 0:
            await asyncio.sleep(STREAM_POLL_S)  # one poll of an in-memory counter for all
            ticks += 1
            version = self._service.version
            if version != last or ticks >= _TICKS_PER_KEEPALIVE:
                last, ticks = version, 0
                wake, self._wake = self._wake, asyncio.Event()
                wake.set()  # wakes every stream: each sends the update or a keep-alive
        self._poller = None  # the last stream ended; the next one starts a poller again


def _changes(request: Request, service: MarketService) -> Changes:
    changes: Changes | None = getattr(request.app.state, "changes", None)
    if changes is None:  # an app used without its lifespan (schema tools)
        changes = request.app.state.changes = Changes(
            service,
            max_streams=service.settings.max_streams,
            max_per_ip=service.settings.max_streams_per_ip,
        )
    return changes


class CountedStream(StreamingResponse):
    """A streaming response that runs ``release`` once when it ends, however it ends."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None], **kw: Any):
        """Stream ``content``; call ``release`` when done."""
        super().__init__(content, **kw)
        self._release: Callable[[], None] | None = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the stream, then release its count."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()

    def release(self) -> None:
        """Run ``release`` (once)."""
        release, self._release = self._release, None
        if release is not None:
            release()


@router.get("/stream", response_class=StreamingResponse)
async def stream(request: Request, service: ServiceDep) -> StreamingResponse:
    """Server-sent events: an `update` event carrying the version whenever the market changes."""
    changes = _changes(request, service)
    ip = request.client.host if request.client else "unknown"
    changes.admit(ip)  # counted now: a concurrent open sees this one
    loop = asyncio.get_running_loop()

    async def events() -> AsyncIterator[str]:
        try:
            ends = loop.time() + STREAM_LIFETIME_S
            seen = service.version
            yield f"retry: 1000\n\nevent: update\ndata: {seen}\n\n"
            while loop.time() < ends:
                version = await changes.next(seen)
                if version != seen:
                    seen = version
                    yield f"event: update\ndata: {version}\n\n"
                else:
                    yield ": keepalive\n\n"
        finally:
            response.release()

    response = CountedStream(
        events(),
        lambda: changes.leave(ip),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    return response
