"""Daemon configuration: a TOML file, overridden by ``TPUMARKET_PROVIDER_*`` environment variables.

Every key, with its default, is listed in docs/provider-api.md ("Configuration"; the tables are
checked against these models by tests/test_docs_claims.py). An example ``provider.toml`` (some
keys)::

    private_key_file = "/etc/tpumarket/provider.key"   # or env TPUMARKET_PROVIDER_PRIVATE_KEY
    rpc_url = "http://127.0.0.1:8545"
    escrow = "0x..."
    market_url = "https://market.example"              # optional: adverts are sent only if set
    public_url = "http://tpu-host:8700"                # what adverts tell clients to call
    host = "0.0.0.0"
    port = 8700
    data_dir = "/var/lib/tpumarket-provider"
    pool_size = 2
    sandbox_spares = 0                                 # no worker stands by: a crashed one is
    sandbox_validator_spares = 0                       # replaced on demand (fewer processes)
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
plan by ``TPUMARKET_PROVIDER_PLAN`` (JSON: it replaces the file's whole ``[plan]``). A variable
wins over the file key by key; ``private_key`` (file or variable) wins over ``private_key_file``;
``TPUMARKET_PROVIDER_CONFIG`` names the file for the operator's commands and is no key.

:class:`ProviderConfig` is a pydantic-settings model (the sources: :mod:`provider.config_sources`;
the sections: :mod:`provider.config_sections`). Every value is validated against its type and
checks: a file that does not parse, a plan variable that is not a JSON object, a value of the
wrong type or out of range, an unknown key, a missing one, a bad key or arbiter address is a
:class:`provider.errors.ConfigError` with a one-line message naming the key and where it came
from (the variable or the file). The private key is a ``SecretStr``: no repr, str, log line or
error message shows it; :attr:`ProviderConfig.private_key` gives its text to the signers.

With ``[ask]`` and ``market_url`` set, the daemon posts the ask at start and posts a fresh
one whenever none of its asks is live for at least a fifth of ``expiry_s`` more
(:class:`provider.asks.AskJob`); ``tpumarket provider ask`` posts the same ask by hand. The
ask goes to the class of the devices the host runs on (``cpu``, ``tpu-v5e``, ``gpu-h100``)
and, with ``compile_checks``, the same terms to one ``compile-<generation>`` class per TPU
topology it compiles for (``v5e:1x1`` -> ``compile-v5e``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from contracts.messages import Plan, address_of
from contracts.pricing import plan_is_valid
from provider.config_sections import (
    ENV_PREFIX,
    RETIRED_SETTLEMENT_KEYS,
    AskConfig,
    HttpConfig,
    SettlementConfig,
    check,
    describe,
    to_address,
)
from provider.config_sources import ProviderEnvSource, ProviderTomlSource
from provider.config_storage import StorageConfig
from provider.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "LOCK_FILE",
    "RETIRED_SETTLEMENT_KEYS",
    "AskConfig",
    "ProviderConfig",
    "SettlementConfig",
    "load_config",
    "to_address",
]

LOCK_FILE = "daemon.lock"
"""The data dir's lock file (:class:`provider.daemon.DataDirLock`)."""
PLAN_FIELDS = frozenset(f.name for f in dataclasses.fields(Plan))
HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


class ProviderConfig(BaseSettings):
    """Everything the daemon needs; build with :func:`load_config` or directly in tests.

    Built directly it takes only its arguments (no file, no environment), validated all the
    same. The private key is a ``SecretStr`` (``secret_key``, argument ``private_key``): it
    never shows in the repr (nor so in a log line or a traceback's locals).
    """

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", case_sensitive=True, allow_inf_nan=False
    )

    secret_key: SecretStr = Field(alias="private_key")
    rpc_url: str
    escrow: str
    # A deployment file (`tpumarket chain deploy`): the escrow and the chain id come from it,
    # and the daemon refuses a node that serves another chain.
    deployment: Path | None = None
    chain_id: int | None = None
    data_dir: Path
    plan: Plan = Field(default_factory=Plan)
    slo_ms: int = 2_000
    pool_size: int = 1
    market_url: str | None = None
    public_url: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65_535)
    deal_cache_ttl_s: float = Field(2.0, ge=0)
    max_envelope_bytes: int = Field(256 * 1024 * 1024, gt=0)
    # Bytes of delivered outputs kept in memory (0: none; older ones are read from the journal);
    # None: provider.service's default, 256 MiB.
    output_memory_bytes: int | None = None
    heartbeat_interval_s: float = Field(30.0, gt=0)
    quote_poll_s: float = Field(2.0, gt=0)
    benchmark_on_start: bool = True
    jax_platforms: str | None = None
    # Start sandbox workers short of full isolation (no bubblewrap, root, sockets, no syscall
    # allowlist); /v1/info then lists what they lack. Off: such workers are refused.
    sandbox_weak_isolation: bool = False
    # Sandbox processes beside the `pool_size` workers, each importing JAX at start: workers
    # standing by to replace one retired after a crash or a timeout (None: enough for two ready
    # workers in all), the validators that check every new program, and validators standing by
    # to replace one a malformed program retired. Without spares a replacement starts on demand.
    sandbox_spares: int | None = None
    sandbox_validators: int = 2
    sandbox_validator_spares: int = 1
    log_level: str = "INFO"
    settlement: SettlementConfig = Field(default_factory=lambda: SettlementConfig())
    http: HttpConfig = Field(default_factory=lambda: HttpConfig())
    storage: StorageConfig = Field(default_factory=lambda: StorageConfig())
    ask: AskConfig | None = None
    log_scheduler: bool = False
    keep_alive_s: float = 5.0  # an idle connection (new, or after an answer) closes then
    request_read_timeout_s: float = 10.0  # a request's headers (and body, at a fair rate) by then

    def __init__(self, /, **values: Any) -> None:
        """Validate ``values`` (or the sources :func:`load_config` passes); a ConfigError."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            sources = values.get("_build_sources", ((), {}))[0]

            def origin(loc: tuple[str, ...]) -> str | None:
                for source in sources:
                    where = getattr(source, "origin", lambda _: None)(loc)
                    if where is not None:
                        return str(where)
                return None

            raise ConfigError(describe(exc, origin=origin)) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Built directly: the arguments only (:func:`load_config` reads the file and env)."""
        return (init_settings,)

    @model_validator(mode="before")
    @classmethod
    def _key_from_file(cls, data: Any) -> Any:
        """Read ``private_key_file`` (a raw key, development only) or decrypt ``keystore``
        (its passphrase from ``passphrase_file``, the environment or a prompt) unless
        ``private_key`` is given; take ``escrow`` and ``chain_id`` from a ``deployment`` file."""
        if not isinstance(data, dict):
            return data
        values = dict(data)
        key_file = values.pop("private_key_file", None)
        keystore = values.pop("keystore", None)
        passphrase_file = values.pop("passphrase_file", None)
        if "private_key" not in values and keystore is not None:
            from contracts.keystore import KeystoreError, load_key, read_passphrase

            try:
                passphrase = read_passphrase(Path(passphrase_file) if passphrase_file else None)
                values["private_key"] = SecretStr(load_key(Path(str(keystore)), passphrase))
            except KeystoreError as exc:
                raise ValueError(str(exc)) from None
        elif "private_key" not in values and key_file is not None:
            try:
                values["private_key"] = SecretStr(Path(str(key_file)).read_text().strip())
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read private_key_file: {exc}") from None
        if values.get("deployment") is not None:
            from contracts.deployment import with_deployment

            values = with_deployment(values)
        return values

    @field_validator("secret_key")
    @classmethod
    def _secp256k1(cls, value: SecretStr) -> SecretStr:
        key = value.get_secret_value()
        digits = key.removeprefix("0x")
        check(
            len(digits) == 64 and set(digits) <= HEX_DIGITS,
            "private key is not a secp256k1 key: expected 64 hex digits (0x optional), "
            f"got {len(digits)} characters",
        )
        try:
            address_of(key)
        except (ValueError, TypeError):
            raise ValueError(
                "private key is not a secp256k1 key: out of the curve's range"
            ) from None
        return value

    @field_validator("plan", mode="before")
    @classmethod
    def _plan_fields(cls, value: Any) -> Any:
        if isinstance(value, dict):
            unknown = sorted(set(value) - PLAN_FIELDS)
            check(not unknown, f"plan has unknown fields {unknown}")
        return value

    @field_validator("plan")
    @classmethod
    def _plan_valid(cls, value: Plan) -> Plan:
        check(plan_is_valid(value), "plan has a discount above 100% or unordered tiers")
        return value

    @field_validator("slo_ms")
    @classmethod
    def _whole_seconds(cls, value: int) -> int:
        check(value >= 1000, "slo_ms must be at least 1000 (deadlines are whole seconds)")
        return value

    @field_validator("pool_size")
    @classmethod
    def _a_worker(cls, value: int) -> int:
        check(value >= 1, "pool_size must be at least 1")
        return value

    @field_validator("sandbox_spares", "sandbox_validator_spares")
    @classmethod
    def _spares(cls, value: int | None, info: ValidationInfo) -> int | None:
        check(value is None or value >= 0, f"{info.field_name} must not be negative")
        return value

    @field_validator("sandbox_validators")
    @classmethod
    def _a_validator(cls, value: int) -> int:
        check(value >= 1, "sandbox_validators must be at least 1")
        return value

    @field_validator("output_memory_bytes")
    @classmethod
    def _budget(cls, value: int | None) -> int | None:
        check(value is None or value >= 0, "output_memory_bytes must be >= 0")
        return value

    @field_validator("keep_alive_s", "request_read_timeout_s")
    @classmethod
    def _timeout(cls, value: float, info: ValidationInfo) -> float:
        check(value > 0, f"{info.field_name} must be positive")
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        levels = logging.getLevelNamesMapping()
        check(value.upper() in levels, f"log_level must be one of {sorted(levels)}")
        return value

    def replace(self, **changes: Any) -> Self:
        """Return a copy with ``changes`` (field names; the key as ``private_key``), validated."""
        values = {f.alias or n: getattr(self, n) for n, f in type(self).model_fields.items()}
        return type(self)(**{**values, **changes})

    @property
    def private_key(self) -> str:
        """Return the private key's text (for the signers; never log it)."""
        return self.secret_key.get_secret_value()

    @property
    def address(self) -> str:
        """Return the provider's checksummed address."""
        return address_of(self.private_key)

    @property
    def slo_s(self) -> int:
        """Return the SLO rounded up to whole seconds (the unit of on-chain deadlines)."""
        return -(-self.slo_ms // 1000)


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> ProviderConfig:
    """Read ``path`` (TOML, optional) and ``env`` (default: the process's), the env winning.

    Validate everything; raise ConfigError with one line naming each bad key and its source.
    """
    sources: list[PydanticBaseSettingsSource] = [
        ProviderEnvSource(ProviderConfig, os.environ if env is None else env)
    ]
    if path is not None:
        sources.append(ProviderTomlSource(ProviderConfig, path))
    return ProviderConfig(_build_sources=(tuple(sources), {}))
