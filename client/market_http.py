"""Minimal market HTTP client at the protocol level (the client package will grow it).

Only what the provider daemon needs today: post a signed heartbeat advert.
"""

from __future__ import annotations

from typing import Any

import httpx

HEARTBEAT_PATH = "/v1/providers/heartbeat"


class MarketHttpError(Exception):
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

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()
