"""What both HTTP services (the market, the provider daemon) need to be safe to serve.

- **The recursion limit.** `py_ecc` (imported by eth-account, so by this package) raises
  Python's recursion limit to 100,000 at import; recursion that deep in C code (Python's `json`
  parser, `repr`) overflows the C stack and kills the process instead of raising
  `RecursionError`. Each service's app calls `restore_recursion_limit` when it is built.
- **Connections a slow or idle client cannot hold open.** uvicorn closes a keep-alive
  connection that stays idle after a response, but it arms no timer on a new connection, nor
  while a request arrives: a client that connects and sends nothing, or sends one byte a second,
  keeps its connection (and its slot) forever. `guarded_protocol` returns uvicorn's httptools
  protocol with three more rules:

  - a new connection that sends nothing closes after the keep-alive timeout, like an idle one;
  - a request must arrive whole (request line, headers and body) within `read_timeout` seconds
    of its first byte, plus one second per `min_body_rate` bytes of body received (so a large
    upload at a fair rate is never cut, and a drip is), or the connection closes (with a 408 if
    its headers never completed);
  - its request line and headers may hold at most `max_header_bytes` (a 400 and close beyond);
  - with a `services.fairness.ConnectionBudget`, a connection beyond its client address's
    share or the service's total is answered at once (429 or 503, ``Retry-After``) and closed;
  - the scope's client address is a trusted reverse proxy's ``X-Forwarded-For`` when the peer
    is one (`services.fairness.TrustedProxies`), else the peer: everything downstream (rate
    limits, stream caps) sees the real client.
- **No secret in what a stranger can make a service say.** A node URL often carries an API key
  (in its path, query or userinfo), and the HTTP libraries put the URL, or its path alone, in
  their exception messages. `redact` strips every URL in a text down to scheme, host and port
  and removes every string registered with `register_secret` (each service registers its RPC
  URL's parts and its signing key when its app is built); each service's one error renderer
  passes its reasons through it, and `redact_logs` adds `RedactingFilter` to every log handler
  so log lines (their messages, extra fields and tracebacks) are redacted the same way.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import traceback
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.fairness import ConnectionBudget, TrustedProxies, host_allowed

RECURSION_LIMIT = 1_000
"""Python's default, put back after eth-account raised it (see the module's docstring)."""


def restore_recursion_limit() -> None:
    """Undo the recursion limit that importing eth-account raised (see `RECURSION_LIMIT`)."""
    import eth_account  # noqa: F401  # its import raises the limit: make sure that happened

    if sys.getrecursionlimit() > RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)


_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


_REFUSED = (
    b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nretry-after: %d\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
REFUSAL_RETRY_S = 1
"""``Retry-After`` of a connection refused for the budget: slots free up as requests end."""


class _HeadersTooLarge(Exception):
    """The request line and headers passed the cap (httptools then answers 400 and closes)."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a per-request read deadline and a header cap."""

    read_timeout: float = 10.0
    min_body_rate: float = 0.0
    """Bytes of body per extra second of reading (0: the whole request within `read_timeout`)."""
    max_header_bytes: int = 32 << 10
    timeout_body: bytes = b'{"detail":"request not received in time","error":"RequestTimeout"}'
    budget: ConnectionBudget | None = None
    """Connections per client address and in all; None: no limit but uvicorn's own."""
    trusted: TrustedProxies = TrustedProxies()
    refusal_bodies: dict[int, bytes] = {}
    """The JSON of a 429 (an address over its share) and a 503 (full), in the service's shape."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Create the protocol for one connection (uvicorn's arguments)."""
        super().__init__(*args, **kwargs)
        self._counted: str | None = None
        self._read_deadline: asyncio.TimerHandle | None = None
        self._read_started = 0.0
        self._header_bytes = 0
        self._body_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Accept the connection (or refuse it, over the budget); close it if no request starts
        within the keep-alive time."""
        super().connection_made(transport)
        if self.budget is not None:
            peer = self.client[0] if self.client else ""
            status = self.budget.admit(peer)
            if status is not None:
                body = self.refusal_bodies.get(status, b"{}")
                phrase = b"Too Many Requests" if status == 429 else b"Service Unavailable"
                transport.write(_REFUSED % (status, phrase, REFUSAL_RETRY_S, len(body), body))
                transport.close()
                return
            self._counted = peer
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the read deadline and the connection's count, then let uvicorn clean up."""
        self._cancel_read_deadline()
        if self._counted is not None and self.budget is not None:
            self.budget.release(self._counted)
            self._counted = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        """Start a request: it must arrive whole within `read_timeout` seconds (plus its body's
        allowance)."""
        super().on_message_begin()
        self._header_bytes = 0
        self._body_bytes = 0
        self._cancel_read_deadline()
        self._read_started = self.loop.time()
        self._read_deadline = self.loop.call_later(self.read_timeout, self._read_too_slow)

    def on_url(self, url: bytes) -> None:
        """Count the request line against the header cap."""
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count each header against the header cap."""
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        """Name the client a trusted proxy forwarded for, then let uvicorn start the request."""
        peer = self.client[0] if self.client else None
        if peer is not None and peer in self.trusted:
            forwarded = b",".join(v for n, v in self.headers if n == b"x-forwarded-for")
            client = self.trusted.client(peer, forwarded.decode("latin-1"))
            self.scope["client"] = (client, 0)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        """Count the body's bytes: each `min_body_rate` of them buys a second more."""
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        """The whole request arrived: the read deadline is met."""
        self._cancel_read_deadline()
        super().on_message_complete()

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.max_header_bytes:
            raise _HeadersTooLarge

    def _cancel_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_too_slow(self) -> None:
        """Close a connection whose request did not arrive in time (or re-arm the deadline if
        the body received since earned more time)."""
        self._read_deadline = None
        if self.min_body_rate > 0:
            allowed = self.read_timeout + self._body_bytes / self.min_body_rate
            left = self._read_started + allowed - self.loop.time()
            if left > 0:
                self._read_deadline = self.loop.call_later(left, self._read_too_slow)
                return
        if self.transport.is_closing():
            return
        idle = self.cycle is None or self.cycle.response_complete  # nothing else being written
        if idle and (self.cycle is None or self.cycle.scope is not self.scope):  # no headers yet
            self.transport.write(_408 % (len(self.timeout_body), self.timeout_body))
        self.transport.close()


def guarded_protocol(
    name: str,
    *,
    read_timeout: float,
    max_header_bytes: int,
    min_body_rate: float = 0.0,
    timeout_body: bytes | None = None,
    budget: ConnectionBudget | None = None,
    refusal_bodies: dict[int, bytes] | None = None,
) -> type[GuardedHttpToolsProtocol]:
    """Return the protocol class (called `name`) with these limits, for `uvicorn.run(http=...)`.

    `timeout_body` is the JSON of the 408 and `refusal_bodies` those of the budget's 429 and
    503 (in the service's own error shape); `budget` is this server's alone (its trusted
    proxies also name the client of each request).
    """
    body = timeout_body or (
        b'{"detail":"request not received within %d s","error":"RequestTimeout"}'
        % int(read_timeout)
    )
    return type(
        name,
        (GuardedHttpToolsProtocol,),
        {
            "read_timeout": read_timeout,
            "max_header_bytes": max_header_bytes,
            "min_body_rate": min_body_rate,
            "timeout_body": body,
            "budget": budget,
            "trusted": budget.trusted if budget is not None else TrustedProxies(),
            "refusal_bodies": refusal_bodies or {},
        },
    )


MARKET_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The market's pages: scripts, styles, images and fetches from this origin only, no frames."""
API_CSP = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
"""A JSON API's: nothing may load, run or frame."""
Headers = tuple[tuple[bytes, bytes], ...]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def security_headers(csp: str) -> Headers:
    """Return the headers every answer of a service carries: CSP, no sniffing, no framing, no
    referrer, its own browsing context group."""
    return (
        (b"content-security-policy", csp.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"no-referrer"),
        (b"cross-origin-opener-policy", b"same-origin"),
    )


def with_headers(send: Send, headers: Headers) -> Send:
    """Return ``send`` adding ``headers`` to a response's start (keeping any the app set)."""

    async def send_with_headers(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            sent = list(message.get("headers", []))
            present = {name.lower() for name, _ in sent}
            message = {**message, "headers": sent + [h for h in headers if h[0] not in present]}
        await send(message)

    return send_with_headers


class HostCheck:
    """Answer 421 to a request whose ``Host`` a DNS-rebinding page could send
    (`services.fairness.host_allowed`: a dotted name not in ``allowed``).

    For a service bound to a loopback address (`services.fairness.is_loopback_bind`): a page
    of another origin whose name the attacker points at 127.0.0.1 sends its own name as
    ``Host`` and is refused.
    """

    def __init__(self, app: Any, allowed: tuple[str, ...], body: bytes) -> None:
        """Wrap ``app``; ``body`` is the 421's JSON in the service's error shape."""
        self.app = app
        self.allowed = allowed
        self.body = body

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        """Pass the request on, or refuse it."""
        if scope["type"] in ("http", "websocket"):
            host = next((v for n, v in scope["headers"] if n == b"host"), b"")
            if not host_allowed(host.decode("latin-1"), self.allowed):
                headers = [(b"content-type", b"application/json")]
                headers.append((b"content-length", str(len(self.body)).encode()))
                await send({"type": "http.response.start", "status": 421, "headers": headers})
                await send({"type": "http.response.body", "body": self.body})
                return
        await self.app(scope, receive, send)


async def read_streamed_body(
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    max_bytes: int,
    too_large: Callable[[], Exception],
) -> bytes | None:
    """Read an ASGI request body, raising ``too_large()`` as soon as more than ``max_bytes``
    have arrived (nothing past the cap is kept); None if the client disconnected first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise too_large()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# ---- redaction -------------------------------------------------------------------------------

_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,15})://([^\s'\"<>()\[\]{},;]+)")
_SECRETS: set[str] = set()
REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6
"""A shorter registered string (a path such as ``/``) would redact ordinary text."""


def register_secret(text: str | None) -> None:
    """Have `redact` remove ``text`` (and, for a URL, its userinfo, path and query) anywhere."""
    if not text:
        return
    parts = [text]
    if "://" in text:
        url = urlsplit(text)
        parts = [url.path, url.query, url.fragment, url.username or "", url.password or ""]
        parts += [url.path + ("?" + url.query if url.query else "")]
        parts += [segment for segment in url.path.split("/") if segment]
    for part in parts:
        if len(part.strip("/")) >= MIN_SECRET_CHARS:
            _SECRETS.add(part)


def _host_only(match: re.Match[str]) -> str:
    scheme, rest = match.group(1), match.group(2)
    host = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].rsplit("@", 1)[-1]
    return f"{scheme}://{host}" + ("/" + REDACTED if len(host) < len(rest) else "")


def redact(text: str) -> str:
    """Return ``text`` with every URL cut to scheme, host and port and every registered secret
    replaced by ``[redacted]``."""
    text = _URL.sub(_host_only, text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


class RedactingFilter(logging.Filter):
    """Redact a record's message, its extra fields and its traceback (see `redact`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` in place; never drop it."""
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        record.msg, record.args = redact(message), ()
        for key, value in list(vars(record).items()):
            if key not in _RECORD_FIELDS and isinstance(value, (str, list, tuple, dict)):
                setattr(record, key, _redact_value(value))
        if record.exc_info and record.exc_info[1] is not None:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_text, record.exc_info = redact(text), None
            record.exc = record.exc_text  # what a JSON formatter prints of the traceback
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_value(v) for v in value]
    return value


_FILTER = RedactingFilter()


def redact_logs() -> None:
    """Add the redacting filter to every log handler configured now (and the last resort)."""
    handlers = list(logging.getLogger().handlers)
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            handlers += logger.handlers
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
