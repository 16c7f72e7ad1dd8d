"""Which arbiters this client accepts: a quote naming any other is refused before it is opened.

The list comes from ``TPUMARKET_ARBITERS`` (addresses separated by commas; the market's
``GET /v1/arbiters`` shows each arbiter's fee, tolerance policy, deadlines and measured ruling
time). Unset, the client accepts any arbiter that is neither nobody nor the provider, as the
escrow does.
"""

from __future__ import annotations

import os

from client.errors import ClientInputError, DealMismatch

ARBITERS_VARIABLE = "TPUMARKET_ARBITERS"


def parse_arbiters(raw: str | None) -> frozenset[str] | None:
    """Return the lowercase addresses of a comma-separated list, or None when it is empty."""
    if raw is None or not raw.strip():
        return None
    found = set()
    for part in raw.split(","):
        item = part.strip().lower()
        if not item:
            continue
        digits = item.removeprefix("0x")
        if (
            not item.startswith("0x")
            or len(digits) != 40
            or any(c not in "0123456789abcdef" for c in digits)
        ):
            raise ClientInputError(f"{ARBITERS_VARIABLE}: {part.strip()!r} is not an address")
        found.add(item)
    return frozenset(found) or None


def configured_arbiters() -> frozenset[str] | None:
    """Return the arbiters ``TPUMARKET_ARBITERS`` accepts (None: any)."""
    return parse_arbiters(os.environ.get(ARBITERS_VARIABLE))


def check_arbiter(arbiter: str, accepted: frozenset[str] | None, what: str = "the quote") -> None:
    """Raise ``DealMismatch`` unless ``arbiter`` is one ``accepted`` names (None: any)."""
    if accepted is not None and arbiter.lower() not in accepted:
        raise DealMismatch(
            f"{what} names arbiter {arbiter}, not one this client accepts "
            f"({ARBITERS_VARIABLE}: {', '.join(sorted(accepted))})"
        )
