"""Market HTTP client at the protocol level: signed orders, deal records, provider adverts.

The provider daemon posts signed heartbeat adverts with it; a client places signed bids,
waits for them to be matched, and reads the deal records (both orders and the provider's
signed quote) it opens on chain.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from client.errors import ClientError
from contracts.messages import Domain, Quote
from contracts.orders import Ask, Bid, order_request

HEARTBEAT_PATH = "/v1/providers/heartbeat"


class MarketHttpError(ClientError):
    """Raised when the market cannot be reached or answers with an error status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        """Carry the HTTP status when the market answered."""
        super().__init__(message)
        self.status = status


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
            )
        return response.json() if response.content else None
