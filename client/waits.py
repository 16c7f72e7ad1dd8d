"""Say what a command waits for: any request to the chain, the market or a provider that
has not answered within :data:`NOTE_AFTER_S` seconds is named on stderr, with how long it has
waited and the timeout after which it gives up.

The CLI's commands run inside :func:`reported` (``client.cli.guarded`` and the provider's
operator commands): every HTTP request the process sends (the chain's JSON-RPC through
``requests``, the market and the providers through ``httpx``) is registered while it is in
flight, and a watcher thread names the ones past :data:`NOTE_AFTER_S`, again every
:data:`NOTE_EVERY_S`. A stalled node thus reads ``waiting 10 s for the chain at
http://127.0.0.1:8545 (eth_call); each try gives up after 30 s``, not silence. Long-polls
(a ``wait`` query above 0, as ``job run`` asks a provider for results) are waits the command
chose and reports itself; they are not named here.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

NOTE_AFTER_S = 10.0
"""A request unanswered this long is named on stderr."""
NOTE_EVERY_S = 10.0
"""And named again this often while it stays unanswered."""
_MARKET_PATHS = ("/v1/orders", "/v1/deals", "/v1/providers", "/v1/offers", "/v1/book")
_PROVIDER_PATHS = ("/v1/tasks", "/v1/vouchers", "/v1/health", "/v1/info", "/v1/deals/")


@dataclass
class _Pending:
    method: str
    url: str
    body: bytes
    timeout_s: float | None
    started: float
    noted: float = 0.0


_lock = threading.Lock()
_pending: dict[int, _Pending] = {}
_ids = itertools.count()
_active = 0
_installed = False


def describe(method: str, url: str, body: bytes) -> str:
    """Name what a request waits for: the chain (with its JSON-RPC method), the market or a
    provider (with the path), else the URL."""
    parts = urlsplit(url)
    where = f"{parts.scheme}://{parts.netloc}"
    if method == "POST" and parts.path in ("", "/") and body[:1] in (b"{", b"["):
        try:
            call = json.loads(body)
        except ValueError:
            call = None
        calls = call if isinstance(call, list) else [call]
        names = sorted({str(c.get("method")) for c in calls if isinstance(c, dict)})
        return f"the chain at {where} ({', '.join(names) or 'JSON-RPC'})"
    if parts.path.startswith(_MARKET_PATHS) and not parts.path.startswith("/v1/deals/"):
        return f"the market at {where} ({method} {parts.path})"
    if parts.path.startswith(_PROVIDER_PATHS):
        return f"the service at {where} ({method} {parts.path})"
    return f"{where} ({method} {parts.path})"


def _long_poll(url: str) -> bool:
    values = parse_qs(urlsplit(url).query).get("wait", [])
    try:
        return any(float(v) > 0 for v in values)
    except ValueError:
        return False


def note_line(pending: _Pending, now: float) -> str:
    """Return the stderr line for a request still unanswered at ``now``."""
    line = (
        f"waiting {now - pending.started:.0f} s for "
        f"{describe(pending.method, pending.url, pending.body)}"
    )
    if pending.timeout_s is not None:
        line += f"; each try gives up after {pending.timeout_s:g} s"
    return line


@contextlib.contextmanager
def _tracked(method: str, url: str, body: Any, timeout_s: float | None) -> Iterator[None]:
    if _active == 0 or _long_poll(url):
        yield
        return
    raw = body if isinstance(body, bytes) else b""
    key = next(_ids)
    with _lock:
        _pending[key] = _Pending(method, url, raw, timeout_s, time.monotonic())
    try:
        yield
    finally:
        with _lock:
            _pending.pop(key, None)


def _requests_timeout(value: Any) -> float | None:
    if isinstance(value, tuple):
        value = value[-1]  # (connect, read): the read timeout is the wait
    return float(value) if isinstance(value, int | float) else None


def _httpx_timeout(request: Any) -> float | None:
    timeout = request.extensions.get("timeout", {}) if hasattr(request, "extensions") else {}
    value = timeout.get("read") if isinstance(timeout, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _install() -> None:
    """Wrap ``requests`` and ``httpx`` sends once (a no-op while nothing is reported)."""
    global _installed
    if _installed:
        return
    import httpx
    import requests

    send_requests = requests.Session.send
    send_httpx = httpx.Client.send

    def requests_send(self: requests.Session, request: Any, **kwargs: Any) -> Any:
        timeout = _requests_timeout(kwargs.get("timeout"))
        with _tracked(str(request.method), str(request.url), request.body, timeout):
            return send_requests(self, request, **kwargs)

    def httpx_send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> Any:
        try:
            body = request.content
        except httpx.RequestNotRead:  # a streamed upload: named by its URL alone
            body = b""
        with _tracked(request.method, str(request.url), body, _httpx_timeout(request)):
            return send_httpx(self, request, **kwargs)

    requests.Session.send = requests_send  # type: ignore[method-assign]
    httpx.Client.send = httpx_send  # type: ignore[method-assign]
    _installed = True


def _watch(stop: threading.Event) -> None:
    while not stop.wait(1.0):
        now = time.monotonic()
        with _lock:
            due = [
                p
                for p in _pending.values()
                if now - p.started >= NOTE_AFTER_S and now - p.noted >= NOTE_EVERY_S
            ]
            for p in due:
                p.noted = now
        for p in due:
            print(note_line(p, now), file=sys.stderr, flush=True)


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Name on stderr every request that stays unanswered while the block runs."""
    global _active
    _install()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(stop,), name="waits", daemon=True)
    with _lock:
        _active += 1
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        with _lock:
            _active -= 1
