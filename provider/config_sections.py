"""The ``[settlement]`` and ``[ask]`` sections of the daemon's config, and its error messages.

Each section is a frozen pydantic model that validates every value on construction (also
:meth:`Section.replace`); a value that does not hold is a :class:`provider.errors.ConfigError`
with a one-line message naming the key (:func:`describe`), never a pydantic error.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from contracts.tx_policy import TxPolicy
from provider.errors import ConfigError
from services.fairness import TrustedProxies

ENV_PREFIX = "TPUMARKET_PROVIDER_"
SECRET_FIELDS = frozenset({"private_key", "secret_key"})
"""Fields whose value no message shows."""
log = logging.getLogger("provider.config")

RETIRED_SETTLEMENT_KEYS: dict[str, str] = {
    "redeem_max_age_s": "vouchers are redeemed by each task's settleBy minus the margin",
    "silent_after_s": "tasks are claimed by each task's settleBy minus the margin",
    "expiry_margin_s": "settleBy counts the deadline at most up to the deal's expiry",
}
"""Settlement keys of protocol v1, ignored with a warning (what replaced each)."""

Origin = Callable[[tuple[str, ...]], str | None]
"""Where the value at a location came from (an environment variable, a file), if known."""


def _nowhere(loc: tuple[str, ...]) -> str | None:
    return None


def _shown(value: Any) -> str | None:
    """Return ``value`` as a message shows it: scalars only, long text cut short."""
    if isinstance(value, str):
        return repr(value[:60])
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    return None


class SectionError(ConfigError):
    """A section that does not validate; ``details`` are pydantic's errors, located in it."""

    def __init__(self, message: str, details: list[ErrorDetails]) -> None:
        """Carry the one-line ``message`` and the errors it tells of."""
        super().__init__(message)
        self.details = details


def _flatten(
    base: tuple[str, ...], errors: list[ErrorDetails]
) -> Iterator[tuple[tuple[str, ...], ErrorDetails]]:
    """Yield each error with its location, those of a nested section's own as its errors."""
    for error in errors:
        loc = base + tuple(str(part) for part in error["loc"])
        nested = error.get("ctx", {}).get("error")
        if error["type"] == "value_error" and isinstance(nested, SectionError):
            yield from _flatten(loc, nested.details)
        else:
            yield loc, error


def describe(exc: ValidationError, prefix: str = "", origin: Origin = _nowhere) -> str:
    """Return a one-line account of every problem of ``exc``, naming each key and its source.

    ``prefix`` is the dotted section of a model validated on its own (``"settlement."``);
    ``origin`` names the variable or file a value came from. Secrets are never shown.
    """
    unknown: dict[str, list[str]] = {}
    lacking: dict[str, list[str]] = {}
    where: dict[str, set[str]] = {}
    problems: list[str] = []
    for loc, error in _flatten((), exc.errors(include_url=False)):
        dotted = (prefix + ".".join(loc)).strip(".")
        section, _, key = dotted.rpartition(".")
        source = origin(loc) if loc else None
        if error["type"] in ("extra_forbidden", "missing"):
            found = unknown if error["type"] == "extra_forbidden" else lacking
            found.setdefault(section, []).append(key)
            if source is not None:
                where.setdefault(section, set()).add(source)
            continue
        if error["type"] == "value_error" and "error" in error.get("ctx", {}):
            text = str(error["ctx"]["error"])  # a check of this package: it names the key
        else:
            text = f"{dotted or 'config'}: {error['msg']}"
        got = _shown(error.get("input")) if loc and loc[0] not in SECRET_FIELDS else None
        text += "" if got is None else f", got {got}"
        problems.append(text if source is None else f"{text} (from {source})")
    for section, keys in sorted(unknown.items()):
        sources = f" (from {', '.join(sorted(where.get(section, ())))})" if section in where else ""
        problems.insert(0, f"unknown {section or 'config'} keys {sorted(keys)}{sources}")
    for section, keys in sorted(lacking.items()):
        head = ENV_PREFIX + "".join(f"{part.upper()}_" for part in section.split(".") if part)
        variables = ", ".join(head + key.upper() for key in sorted(keys))
        problems.append(
            f"{section or 'config'} lacks {sorted(keys)} (set in the config file or {variables})"
        )
    return "; ".join(problems)


def check(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` (a validation error of the value) unless ``condition``."""
    if not condition:
        raise ValueError(message)


class Section(BaseModel):
    """A section of the config: frozen, validated, unknown keys refused (a ConfigError)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    SECTION: ClassVar[str] = ""

    def __init__(self, /, **values: Any) -> None:
        """Validate ``values``; raise ConfigError naming each key that does not hold."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            details = exc.errors(include_url=False)
            raise SectionError(describe(exc, f"{self.SECTION}."), details) from None

    def replace(self, **changes: Any) -> Self:
        """Return a copy with ``changes``, validated again."""
        return type(self)(**{**dict(self), **changes})


class SettlementConfig(Section):
    """When the settlement jobs act: each deal's windows, with a margin (see provider.config)."""

    SECTION: ClassVar[str] = "settlement"

    interval_s: float = 5.0
    margin_fraction: float = 0.5
    tx_allowance_s: float = 10.0
    redeem_threshold: int = 100_000
    claim_batch_max: int = 200
    quote_valid_s: float = 600.0
    start_block: int = 0
    arbiter_url: str | None = None
    # Sending on a real chain (contracts.tx_policy): blocks a settlement transaction must be
    # under before it counts as done, blocks it may wait unmined before it is replaced with
    # higher fees, and the most it may pay per gas (None: no cap).
    confirmations: int = Field(default=1, ge=1)
    replace_after_blocks: int = Field(default=3, ge=1)
    max_fee_gwei: float | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _ignore_retired(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for retired in sorted(set(data) & set(RETIRED_SETTLEMENT_KEYS)):
            log.warning(
                f"settlement.{retired} is ignored: {RETIRED_SETTLEMENT_KEYS[retired]}",
                extra={"key": retired},
            )
        return {k: v for k, v in data.items() if k not in RETIRED_SETTLEMENT_KEYS}

    @field_validator("interval_s", "quote_valid_s")
    @classmethod
    def _positive(cls, value: float, info: ValidationInfo) -> float:
        check(value > 0, f"settlement.{info.field_name} must be positive")
        return value

    @field_validator("margin_fraction")
    @classmethod
    def _fraction(cls, value: float) -> float:
        check(0 < value <= 1, "settlement.margin_fraction must be in (0, 1]")
        return value

    @field_validator("tx_allowance_s", "start_block")
    @classmethod
    def _not_negative(cls, value: float, info: ValidationInfo) -> float:
        check(value >= 0, f"settlement.{info.field_name} must not be negative")
        return value

    @field_validator("claim_batch_max", "redeem_threshold")
    @classmethod
    def _at_least_one(cls, value: int, info: ValidationInfo) -> int:
        check(value >= 1, f"settlement.{info.field_name} must be at least 1")
        return value

    def tx_policy(self) -> TxPolicy:
        """Return the transaction policy these keys describe."""
        return TxPolicy.from_settings(
            self.confirmations, self.replace_after_blocks, self.max_fee_gwei
        )

    def margin_s(self, challenge_window: int) -> float:
        """Return how long before a task's settleBy the daemon puts it on chain at the latest."""
        return challenge_window * self.margin_fraction

    def min_window_s(self) -> int:
        """Return the shortest challenge window whose margin covers an interval and a tx."""
        return math.ceil((self.interval_s + self.tx_allowance_s) / self.margin_fraction)

    def window_problem(self, challenge_window: int) -> str | None:
        """Return why this config cannot settle a deal with ``challenge_window``, or None."""
        needed = self.min_window_s()
        if challenge_window >= needed:
            return None
        longest = challenge_window * self.margin_fraction - self.tx_allowance_s
        fix = (
            f"lower settlement.interval_s to at most {longest:g} s"
            if longest > 0
            else "raise settlement.margin_fraction or lower settlement.tx_allowance_s"
        )
        return (
            f"a challenge window of {challenge_window} s is below the {needed} s this daemon "
            f"needs: its margin ({self.margin_fraction:g} x window) must cover one job interval "
            f"({self.interval_s:g} s) plus one transaction ({self.tx_allowance_s:g} s); "
            f"quote a longer window, or {fix}"
        )


def to_address(text: str) -> str:
    """Return ``text`` as a checksummed address; raise ValueError when it is not one."""
    from eth_utils.address import is_address, to_checksum_address

    if not isinstance(text, str) or not is_address(text):
        raise ValueError(f"not an address: {text!r}")
    return str(to_checksum_address(text))


class HttpConfig(Section):
    """Fair use of the task API by client address (``[http]``; ``TPUMARKET_PROVIDER_HTTP_*``).

    At most ``max_connections`` open connections, ``max_connections_per_ip`` of them from one
    client address (429 beyond, 503 when all are taken, both with ``Retry-After``), and
    ``rate_per_ip`` requests a second per address (burst ``burst_per_ip``; 0: no limit). The
    client address is the connection's peer, or the ``X-Forwarded-For`` of a peer listed in
    ``trusted_proxies`` (addresses or networks; none by default). Bound to loopback, the API
    refuses a dotted ``Host`` name not in ``allowed_hosts`` (DNS rebinding).
    """

    SECTION: ClassVar[str] = "http"

    max_connections: PositiveInt = 1_024
    max_connections_per_ip: PositiveInt = 256
    rate_per_ip: NonNegativeFloat = 2_000.0
    burst_per_ip: NonNegativeFloat = 4_000.0
    trusted_proxies: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()

    @field_validator("trusted_proxies", "allowed_hosts", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """Read ``"a, b"`` (an environment variable) as ``("a", "b")``."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Refuse an entry that is no address or network."""
        TrustedProxies(value)  # raises ValueError naming the entry
        return value


class AskConfig(Section):
    """The terms of the ask the daemon keeps on the market (amounts in base units)."""

    SECTION: ClassVar[str] = "ask"

    price: int
    quantity: int
    stake: int
    penalty: int
    arbiter: str
    challenge_window: int = 120
    duration: int = 3_600
    expiry_s: int = 1_800
    device_class: str | None = None
    memory: int = 0
    compile_checks: bool = True
    arbiters: tuple[str, ...] = ()  # the arbiters this provider accepts (empty: `arbiter` only)

    @field_validator("price", "quantity", "duration", "expiry_s", "challenge_window")
    @classmethod
    def _positive(cls, value: int, info: ValidationInfo) -> int:
        check(value >= 1, f"ask.{info.field_name} must be positive")
        return value

    @field_validator("stake", "penalty", "memory")
    @classmethod
    def _not_negative(cls, value: int, info: ValidationInfo) -> int:
        check(value >= 0, f"ask.{info.field_name} must not be negative")
        return value

    @field_validator("arbiter")
    @classmethod
    def _address(cls, value: str) -> str:
        try:
            return to_address(value)
        except ValueError:
            raise ValueError("ask.arbiter is not an address (0x and 40 hex digits)") from None

    @field_validator("arbiters")
    @classmethod
    def _addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        try:
            return tuple(to_address(v) for v in value)
        except ValueError:
            raise ValueError("ask.arbiters holds an entry that is not an address") from None

    @model_validator(mode="after")
    def _arbiter_accepted(self) -> AskConfig:
        check(
            not self.arbiters or self.arbiter.lower() in {a.lower() for a in self.arbiters},
            "ask.arbiter must be one of ask.arbiters",
        )
        return self

    def accepted_arbiters(self) -> frozenset[str]:
        """Return the arbiters this provider accepts (lowercase)."""
        return frozenset(a.lower() for a in (self.arbiters or (self.arbiter,)))
