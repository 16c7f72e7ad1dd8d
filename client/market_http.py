"""Market HTTP client at the protocol level: signed orders, deal records, provider adverts.

The provider daemon posts signed heartbeat adverts with it; a client places signed bids,
waits for them to be matched, and reads the deal records (both orders and the provider's
signed quote) it opens on chain.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import httpx

from client.errors import ClientError
from contracts.messages import Domain, Quote, address_of
from contracts.orders import Ask, Bid, CancelOrder, order_request

HEARTBEAT_PATH = "/v1/providers/heartbeat"
CANCEL_REASONS = {
    404: "is not on the market",
    403: "belongs to another owner",
    409: "is no longer live or the cancel's nonce was used",
}
"""What a refused cancel's status says about the order (the market's reason follows)."""


class Level(NamedTuple):
    """One price level of a book: price per unit, live units, resting orders."""

    price: int
    quantity: int
    orders: int


class Book(NamedTuple):
    """Both sides of a device class's book by price level, best first."""

    device_class: str
    bids: tuple[Level, ...]
    asks: tuple[Level, ...]


class MarketHttpError(ClientError):
    """Raised when the market cannot be reached or answers with an error status."""

    def __init__(self, message: str, status: int | None = None, detail: str = "") -> None:
        """Carry the HTTP status and the market's reason when the market answered."""
        super().__init__(message)
        self.status = status
        self.detail = detail


class OrderNotCancelled(MarketHttpError):
    """The market refused a cancel: the order is unknown, someone else's, or no longer live."""


class MarketHttp:
    """A synchronous client of one market's HTTP API."""

    def __init__(self, base_url: str, *, timeout_s: float = 10.0) -> None:
        """Talk to the market at ``base_url`` (e.g. ``https://market.example``)."""
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def heartbeat(self, heartbeat: dict[str, Any]) -> dict[str, Any]:
        """POST a signed heartbeat JSON to ``{market}/v1/providers/heartbeat``; return the reply."""
        try:
            response = self._http.post(HEARTBEAT_PATH, json=heartbeat)
        except httpx.HTTPError as exc:
            raise MarketHttpError(f"market at {self.base_url} unreachable: {exc}") from exc
        if response.status_code >= 400:
            raise MarketHttpError(
                f"market refused the heartbeat: {response.status_code} {response.text[:300]}",
                response.status_code,
            )
        body = response.json() if response.content else {}
        return body if isinstance(body, dict) else {"reply": body}

    def place_order(
        self,
        order: Ask | Bid,
        signature: bytes,
        *,
        quote: Quote | None = None,
        quote_signature: bytes | None = None,
    ) -> dict[str, Any]:
        """Place a signed ask or bid (an ask with its quote); return the order and its fills."""
        body = order_request(order, signature, quote=quote, quote_signature=quote_signature)
        reply = self._call("POST", "/v1/orders", json=body)
        if not isinstance(reply, dict):
            raise MarketHttpError("market answered an order with something else than an object")
        return reply

    def place_bid(self, bid: Bid, domain: Domain, private_key: str) -> dict[str, Any]:
        """Sign ``bid`` under the market ``domain`` and place it; return the order and fills."""
        return self.place_order(bid, bid.sign(domain, private_key))

    def cancel(self, cancel: CancelOrder, domain: Domain, private_key: str) -> dict[str, Any]:
        """Sign ``cancel`` under the market ``domain`` and send it; return the order's final state.

        Raise ``OrderNotCancelled`` when the market refuses it (unknown order, another owner's
        order, an order no longer live, a nonce used before).
        """
        body = {
            "owner": cancel.owner,
            "order_id": "0x" + cancel.order_id.hex(),
            "nonce": cancel.nonce,
            "expiry": cancel.expiry,
            "signature": "0x" + cancel.sign(domain, private_key).hex(),
        }
        try:
            reply = self._call("POST", "/v1/orders/cancel", json=body)
        except MarketHttpError as exc:
            reason = CANCEL_REASONS.get(exc.status or 0)
            if reason is None:
                raise
            order = body["order_id"]
            raise OrderNotCancelled(
                f"cannot cancel order {order}: it {reason} ({exc.detail})", exc.status, exc.detail
            ) from exc
        if not isinstance(reply, dict):
            raise MarketHttpError("market answered a cancel with something else than an object")
        return reply

    def cancel_order(
        self,
        order_id: str,
        domain: Domain,
        private_key: str,
        *,
        nonce: int | None = None,
        expiry_s: int = 300,
    ) -> dict[str, Any]:
        """Cancel one of our orders by id (``0x`` + 64 hex); return the order's final state.

        The nonce defaults to the time in microseconds (orders and cancels of one signer share
        the market's nonce space); the signed cancel is valid for ``expiry_s`` seconds.
        """
        raw = order_id.removeprefix("0x")
        if len(raw) != 64:
            raise OrderNotCancelled(f"not an order id: {order_id!r} (0x and 64 hex digits)")
        try:
            digest = bytes.fromhex(raw)
        except ValueError:
            raise OrderNotCancelled(
                f"not an order id: {order_id!r} (0x and 64 hex digits)"
            ) from None
        cancel = CancelOrder(
            owner=address_of(private_key),
            order_id=digest,
            nonce=nonce if nonce is not None else time.time_ns() // 1000,
            expiry=int(time.time()) + expiry_s,
        )
        return self.cancel(cancel, domain, private_key)

    def order(self, order_id: str) -> dict[str, Any]:
        """Return one order by id, with its state and remaining units."""
        reply = self._call("GET", f"/v1/orders/{order_id}")
        if not isinstance(reply, dict):
            raise MarketHttpError(f"order {order_id}: unexpected reply")
        return reply

    def classes(self) -> list[str]:
        """Return the device classes that have a book."""
        reply = self._call("GET", "/v1/classes")
        return [str(c) for c in reply] if isinstance(reply, list) else []

    def book(self, device_class: str, *, levels: int = 50) -> Book:
        """Return a device class's book by price level (at most ``levels`` a side), best first."""
        reply = self._call("GET", f"/v1/book/{device_class}", params={"levels": levels})
        if not isinstance(reply, dict):
            raise MarketHttpError(f"book {device_class}: unexpected reply")

        def side(name: str) -> tuple[Level, ...]:
            return tuple(
                Level(int(v["price"]), int(v["quantity"]), int(v["orders"]))
                for v in reply.get(name) or []
            )

        return Book(str(reply.get("device_class", device_class)), side("bids"), side("asks"))

    def deals(self, party: str, *, limit: int = 50) -> list[dict[str, Any]]:
        """Return the deal records of one client or provider address, newest first."""
        reply = self._call("GET", "/v1/deals", params={"party": party, "limit": limit})
        return [d for d in reply if isinstance(d, dict)] if isinstance(reply, list) else []

    def deal(self, deal_id: str) -> dict[str, Any]:
        """Return one deal record by its market id (``<device class>:<fill id>``)."""
        reply = self._call("GET", f"/v1/deals/{deal_id}")
        if not isinstance(reply, dict):
            raise MarketHttpError(f"deal {deal_id}: unexpected reply")
        return reply

    def attach_quote(self, deal_id: str, quote: Quote, signature: bytes) -> dict[str, Any]:
        """Attach a provider-signed quote to a matched deal (``POST /v1/deals/{id}/quote``).

        The provider daemon signs one quote per fill, naming the deal's client; return the
        deal record the market answers.
        """
        body = {"quote": quote.to_json(), "quote_signature": "0x" + signature.hex()}
        reply = self._call("POST", f"/v1/deals/{deal_id}/quote", json=body)
        if not isinstance(reply, dict):
            raise MarketHttpError(f"deal {deal_id}: unexpected reply to a quote")
        return reply

    def orders(
        self, owner: str, *, device_class: str | None = None, live: bool = False, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Return one owner's orders (resting, filled, cancelled, expired), newest first."""
        params: dict[str, Any] = {"owner": owner, "live": live, "limit": limit}
        if device_class:
            params["device_class"] = device_class
        reply = self._call("GET", "/v1/orders", params=params)
        return [o for o in reply if isinstance(o, dict)] if isinstance(reply, list) else []

    def offers(self, **filters: Any) -> list[dict[str, Any]]:
        """Return live asks as offers (``GET /v1/offers``: device_class, plan, max_slo_ms,
        min_memory, max_price, online, sort, limit), cheapest first by default."""
        params = {k: v for k, v in filters.items() if v is not None}
        reply = self._call("GET", "/v1/offers", params=params)
        return [o for o in reply if isinstance(o, dict)] if isinstance(reply, list) else []

    def providers(self) -> list[dict[str, Any]]:
        """Return the providers the market heard from, with their adverts' endpoints."""
        reply = self._call("GET", "/v1/providers")
        return [p for p in reply if isinstance(p, dict)] if isinstance(reply, list) else []

    def wait_for_deals(
        self, party: str, bid_id: str, *, timeout_s: float = 30.0, poll_s: float = 0.2
    ) -> list[dict[str, Any]]:
        """Wait until the bid ``bid_id`` is fully matched; return its deal records.

        A bid that crossed resting asks is matched before ``place_order`` answers; one that
        rests waits here for asks to arrive. Raise ``MarketHttpError`` at the timeout with
        whatever matched so far named in the message.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            order = self._call("GET", f"/v1/orders/{bid_id}")
            records = [d for d in self.deals(party, limit=500) if d["bid"]["order_id"] == bid_id]
            if isinstance(order, dict) and order.get("remaining") == 0:
                return records
            if time.monotonic() > deadline:
                left = order.get("remaining") if isinstance(order, dict) else "?"
                raise MarketHttpError(
                    f"bid {bid_id} still has {left} units unmatched after {timeout_s:.0f} s "
                    f"({len(records)} deals)"
                )
            time.sleep(poll_s)  # polling the market's HTTP API for a match

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise MarketHttpError(f"market at {self.base_url} unreachable: {exc}") from exc
        if response.status_code >= 400:
            raise MarketHttpError(
                f"{method} {path}: {response.status_code} {response.text[:300]}",
                response.status_code,
                _detail(response),
            )
        return response.json() if response.content else None


def _detail(response: httpx.Response) -> str:
    """Return the market's reason for an error status (its JSON ``detail``, else the text)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    detail = body.get("detail") if isinstance(body, dict) else None
    return detail if isinstance(detail, str) else response.text[:300]
