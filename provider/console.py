"""The operator commands' console: amounts in tokens, aligned tables, JSON lines, usage errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any


class UsageError(Exception):
    """Bad input found after parsing: exit code 2."""


def tokens(units: int, decimals: int) -> str:
    """Format base units as tokens with all their decimals (``1.500000``)."""
    sign = "-" if units < 0 else ""
    whole, frac = divmod(abs(units), 10**decimals)
    return f"{sign}{whole}.{frac:0{decimals}d}" if decimals else f"{sign}{whole}"


def parse_tokens(text: str, decimals: int) -> int:
    """Parse a positive amount of tokens (``1.5``) into base units."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise UsageError(f"not an amount of tokens: {text!r}") from None
    if not value.is_finite() or value <= 0:
        raise UsageError(f"amount must be a positive number of tokens: {text!r}")
    units = value * 10**decimals
    if units != units.to_integral_value():
        raise UsageError(f"amount has more than {decimals} decimals: {text!r}")
    return int(units)


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print rows under a header, columns aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def emit_json(value: dict[str, Any]) -> None:
    """Print one JSON object on one line."""
    print(json.dumps(value, sort_keys=True), flush=True)
