"""Token amounts as people write them (``1.5``) and as the chain counts them (base units).

The settlement token has 6 decimals: tables and messages show tokens with all 6, ``--json``
output and the wire carry base units.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

DECIMALS = 6
UNIT = 10**DECIMALS


def tokens(units: int) -> str:
    """Format base units as tokens with all 6 decimals."""
    sign = "-" if units < 0 else ""
    whole, frac = divmod(abs(units), UNIT)
    return f"{sign}{whole}.{frac:06d}"


def to_units(text: str) -> int:
    """Parse a positive token amount with at most 6 decimals (``1.5``) into base units.

    Raise ValueError saying what is wrong with it.
    """
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"not an amount of tokens: {text!r}") from None
    if not value.is_finite() or value <= 0:
        raise ValueError(f"amount must be a positive number of tokens: {text!r}")
    units = value * UNIT
    if units != units.to_integral_value():
        raise ValueError(f"amount has more than {DECIMALS} decimals: {text!r}")
    return int(units)
