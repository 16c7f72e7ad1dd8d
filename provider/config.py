"""Daemon configuration: a TOML file, overridden by ``TPUMARKET_PROVIDER_*`` environment variables.

Example ``provider.toml``::

    private_key_file = "/etc/tpumarket/provider.key"   # or env TPUMARKET_PROVIDER_PRIVATE_KEY
    rpc_url = "http://127.0.0.1:8545"
    escrow = "0x..."
    market_url = "https://market.example"              # optional: adverts are sent only if set
    public_url = "http://tpu-host:8700"                # what adverts tell clients to call
    host = "0.0.0.0"
    port = 8700
    data_dir = "/var/lib/tpumarket-provider"
    pool_size = 2
    slo_ms = 2000
    output_memory_bytes = 268435456                    # delivered outputs kept in memory;
                                                       # older ones are read from the journal

    [plan]                       # field names of contracts.messages.Plan
    compile_price = 1000
    inference_price = 500

    [settlement]
    interval_s = 5               # the settlement jobs run this often
    margin_fraction = 0.5        # act by settleBy - this share of the deal's challenge window
    tx_allowance_s = 10          # the time one settlement transaction needs to be mined
    redeem_threshold = 100000    # redeem early once this much is vouched but unredeemed
    quote_valid_s = 600          # per-fill quotes are valid this long

    [ask]                        # optional: the daemon posts this ask and keeps it live
    price = 1000                 # base units per unit, at least
    quantity = 100               # units offered by each posted ask
    stake = 1000000              # stake each deal locks (base units)
    penalty = 50000              # paid to the client per breached task (base units)
    challenge_window = 120       # seconds after each task's deadline to settle it
    duration = 3600              # seconds a deal lasts once opened
    arbiter = "0x..."            # who resolves disputes
    expiry_s = 1800              # each posted ask trades this long, then a fresh one is posted
    device_class = "cpu"         # default: the class of the devices this host runs on
    memory = 0                   # bytes offered (0: not stated)
    compile_checks = true        # also post one ask per compile-check class (compile-v5e, ...)

Settlement follows each deal's windows: every delivered task is put on chain (its latest
acceptable voucher redeemed, else the task claimed) by ``settleBy - margin``, with
``settleBy = min(request.deadline, expiry) + challengeWindow`` and ``margin =
margin_fraction * challengeWindow``. The margin must cover a job interval plus a
transaction, so the shortest window this daemon serves is
``(interval_s + tx_allowance_s) / margin_fraction`` (:meth:`SettlementConfig.min_window_s`);
deals and quotes with a shorter window are refused. The retired keys ``redeem_max_age_s``,
``silent_after_s`` and ``expiry_margin_s`` are ignored with a warning.

Every top-level key can be set by ``TPUMARKET_PROVIDER_<KEY>`` (upper case); settlement keys
by ``TPUMARKET_PROVIDER_SETTLEMENT_<KEY>``, ask keys by ``TPUMARKET_PROVIDER_ASK_<KEY>``; the
plan by ``TPUMARKET_PROVIDER_PLAN`` (JSON).

With ``[ask]`` and ``market_url`` set, the daemon posts the ask at start and posts a fresh
one whenever none of its asks is live for at least a fifth of ``expiry_s`` more
(:class:`provider.asks.AskJob`); ``tpumarket provider ask`` posts the same ask by hand. The
ask goes to the class of the devices the host runs on (``cpu``, ``tpu-v5e``, ``gpu-h100``)
and, with ``compile_checks``, the same terms to one ``compile-<generation>`` class per TPU
topology it compiles for (``v5e:1x1`` -> ``compile-v5e``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from contracts.messages import Plan, address_of
from contracts.pricing import plan_is_valid
from provider.errors import ConfigError

ENV_PREFIX = "TPUMARKET_PROVIDER_"
LOCK_FILE = "daemon.lock"
"""The data dir's lock file (:class:`provider.daemon.DataDirLock`)."""
log = logging.getLogger("provider.config")


RETIRED_SETTLEMENT_KEYS: dict[str, str] = {
    "redeem_max_age_s": "vouchers are redeemed by each task's settleBy minus the margin",
    "silent_after_s": "tasks are claimed by each task's settleBy minus the margin",
    "expiry_margin_s": "settleBy counts the deadline at most up to the deal's expiry",
}
"""Settlement keys of protocol v1, ignored with a warning (what replaced each)."""


@dataclass(frozen=True, slots=True)
class SettlementConfig:
    """When the settlement jobs act: each deal's windows, with a margin (see the module doc)."""

    interval_s: float = 5.0
    margin_fraction: float = 0.5
    tx_allowance_s: float = 10.0
    redeem_threshold: int = 100_000
    claim_batch_max: int = 200
    quote_valid_s: float = 600.0
    start_block: int = 0

    def __post_init__(self) -> None:
        """Reject settings that cannot work."""
        if not self.interval_s > 0:
            raise ConfigError("settlement.interval_s must be positive")
        if not 0 < self.margin_fraction <= 1:
            raise ConfigError("settlement.margin_fraction must be in (0, 1]")
        if self.tx_allowance_s < 0:
            raise ConfigError("settlement.tx_allowance_s must not be negative")
        if self.claim_batch_max < 1:
            raise ConfigError("settlement.claim_batch_max must be at least 1")
        if self.redeem_threshold < 1:
            raise ConfigError("settlement.redeem_threshold must be at least 1")
        if not self.quote_valid_s > 0:
            raise ConfigError("settlement.quote_valid_s must be positive")
        if self.start_block < 0:
            raise ConfigError("settlement.start_block must not be negative")

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


@dataclass(frozen=True, slots=True)
class AskConfig:
    """The terms of the ask the daemon keeps on the market (amounts in base units)."""

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

    def __post_init__(self) -> None:
        """Reject terms that cannot work."""
        for name in ("price", "quantity", "duration", "expiry_s", "challenge_window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ask.{name} must be positive")
        for name in ("stake", "penalty", "memory"):
            if getattr(self, name) < 0:
                raise ConfigError(f"ask.{name} must not be negative")
        try:
            address_of_arbiter = to_address(self.arbiter)
        except ValueError as exc:
            raise ConfigError(f"ask.arbiter: {exc}") from exc
        object.__setattr__(self, "arbiter", address_of_arbiter)


def to_address(text: str) -> str:
    """Return ``text`` as a checksummed address; raise ValueError when it is not one."""
    from eth_utils.address import is_address, to_checksum_address

    if not isinstance(text, str) or not is_address(text):
        raise ValueError(f"not an address: {text!r}")
    return str(to_checksum_address(text))


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """Everything the daemon needs; build with :func:`load_config` or directly in tests.

    The private key never shows in the repr (nor so in a log line or a traceback's locals).
    """

    private_key: str = field(repr=False)
    rpc_url: str
    escrow: str
    data_dir: Path
    plan: Plan
    slo_ms: int = 2_000
    pool_size: int = 1
    market_url: str | None = None
    public_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8700
    deal_cache_ttl_s: float = 2.0
    max_envelope_bytes: int = 256 * 1024 * 1024
    # Bytes of delivered outputs kept in memory (0: none; older ones are read from the journal);
    # None: provider.service's default, 256 MiB.
    output_memory_bytes: int | None = None
    heartbeat_interval_s: float = 30.0
    quote_poll_s: float = 2.0
    benchmark_on_start: bool = True
    jax_platforms: str | None = None
    log_level: str = "INFO"
    settlement: SettlementConfig = field(default_factory=SettlementConfig)
    ask: AskConfig | None = None
    log_scheduler: bool = False
    keep_alive_s: float = 5.0  # an idle connection (new, or after an answer) closes then
    request_read_timeout_s: float = 10.0  # a request's headers (and body, at a fair rate) by then

    def __post_init__(self) -> None:
        """Reject settings that cannot work."""
        if self.slo_ms < 1000:
            raise ConfigError("slo_ms must be at least 1000 (deadlines are whole seconds)")
        if self.pool_size < 1:
            raise ConfigError("pool_size must be at least 1")
        if self.output_memory_bytes is not None and self.output_memory_bytes < 0:
            raise ConfigError(f"output_memory_bytes must be >= 0, got {self.output_memory_bytes}")
        if not (self.keep_alive_s > 0 and self.request_read_timeout_s > 0):
            raise ConfigError("keep_alive_s and request_read_timeout_s must be positive")
        if not plan_is_valid(self.plan):
            raise ConfigError("plan has a discount above 100% or unordered tiers")
        digits = str(self.private_key).removeprefix("0x")
        if len(digits) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise ConfigError(
                "private key is not a secp256k1 key: expected 64 hex digits (0x optional), "
                f"got {len(digits)} characters"
            )
        try:
            address_of(self.private_key)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"private key is not a secp256k1 key: {exc}") from exc

    @property
    def address(self) -> str:
        """Return the provider's checksummed address."""
        return address_of(self.private_key)

    @property
    def slo_s(self) -> int:
        """Return the SLO rounded up to whole seconds (the unit of on-chain deadlines)."""
        return -(-self.slo_ms // 1000)


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


@functools.cache
def _hints(config: type) -> dict[str, Any]:
    """Return the field types of a config dataclass, resolved (this module defers them)."""
    return typing.get_type_hints(config)


def _coerce(config: type, name: str, value: Any) -> Any:
    """Validate one field of ``config`` (TOML value or environment text) against its type."""
    try:
        return _adapter(_hints(config)[name]).validate_python(value)
    except ValidationError as exc:
        shown = "" if "key" in name else f" (got {str(value)[:60]!r})"
        raise ConfigError(f"{name}: {exc.errors()[0]['msg']}{shown}") from exc


def _plan_from(data: Mapping[str, Any]) -> Plan:
    known = {f.name for f in dataclasses.fields(Plan)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"plan has unknown fields {unknown}")
    try:
        values: dict[str, Any] = {
            k: bool(v) if k == "outcome_based" else int(v) for k, v in data.items()
        }
        return Plan(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"plan: {exc}") from exc


def _plan_json(name: str, value: str) -> dict[str, Any]:
    try:
        plan = json.loads(value)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError's kin
        raise ConfigError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(plan, dict):
        raise ConfigError(f"{name} must be a JSON object of plan fields, got {value!r}")
    return plan


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> ProviderConfig:
    """Read ``path`` (TOML, optional) and apply environment overrides; validate everything."""
    environ = os.environ if env is None else env
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    settlement_raw: dict[str, Any] = dict(raw.pop("settlement", {}))
    plan_raw: dict[str, Any] = dict(raw.pop("plan", {}))
    ask_raw: dict[str, Any] = dict(raw.pop("ask", {}))
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name == "plan":
            plan_raw = _plan_json(key, value)
        elif name.startswith("settlement_"):
            settlement_raw[name[len("settlement_") :]] = value
        elif name.startswith("ask_"):
            ask_raw[name[len("ask_") :]] = value
        else:
            raw[name] = value
    key_file = raw.pop("private_key_file", None)
    if "private_key" not in raw and key_file is not None:
        try:
            raw["private_key"] = Path(str(key_file)).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read private_key_file: {exc}") from exc
    fields = {f.name: f for f in dataclasses.fields(ProviderConfig)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config keys {unknown}")
    for required in ("private_key", "rpc_url", "escrow", "data_dir"):
        if required not in raw:
            raise ConfigError(f"config lacks {required} (or {ENV_PREFIX}{required.upper()})")
    kwargs = {n: _coerce(ProviderConfig, n, v) for n, v in raw.items()}
    for retired in sorted(set(settlement_raw) & set(RETIRED_SETTLEMENT_KEYS)):
        settlement_raw.pop(retired)
        log.warning(
            f"settlement.{retired} is ignored: {RETIRED_SETTLEMENT_KEYS[retired]}",
            extra={"key": retired},
        )
    s_fields = {f.name: f for f in dataclasses.fields(SettlementConfig)}
    s_unknown = sorted(set(settlement_raw) - set(s_fields))
    if s_unknown:
        raise ConfigError(f"unknown settlement keys {s_unknown}")
    settlement = SettlementConfig(
        **{n: _coerce(SettlementConfig, n, v) for n, v in settlement_raw.items()}
    )
    ask = None
    if ask_raw:
        a_fields = {f.name: f for f in dataclasses.fields(AskConfig)}
        a_unknown = sorted(set(ask_raw) - set(a_fields))
        if a_unknown:
            raise ConfigError(f"unknown ask keys {a_unknown}")
        a_missing = sorted(
            n for n, f in a_fields.items() if f.default is dataclasses.MISSING and n not in ask_raw
        )
        if a_missing:
            raise ConfigError(f"ask lacks {a_missing}")
        ask = AskConfig(**{n: _coerce(AskConfig, n, v) for n, v in ask_raw.items()})
    return ProviderConfig(**kwargs, plan=_plan_from(plan_raw), settlement=settlement, ask=ask)
