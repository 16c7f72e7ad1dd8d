"""Settings of one market process: limits, TTLs, jobs and where its database and escrow are.

Every field is settable from the environment as `TPUMARKET_MARKET_<FIELD>` (upper case; the
table in docs/market.md); a few keep their older names too (`MARKET_DATA_DIR`, `DATABASE_URL`,
`MARKET_CHAIN_ID`, `MARKET_ESCROW`, `RPC_URL`, `MARKET_FROM_BLOCK`,
`MARKET_MIN_CHALLENGE_WINDOW`, `MARKET_FILLS_RETENTION_DAYS`, `MARKET_ORDERS_RETENTION_DAYS`).
Keyword arguments (the `market serve` flags) win over the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.messages import ZERO_ADDRESS
from market.errors import MarketConfigError
from services.fairness import TrustedProxies

PREFIX = "TPUMARKET_MARKET_"


def _env(name: str, *older: str) -> Any:
    """The environment names of field `name`: the prefixed one, then its older ones."""
    return AliasChoices(PREFIX + name.upper(), *older)


class Settings(BaseSettings):
    """Configuration of one market process (the module docstring names its variables)."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        case_sensitive=False,
        populate_by_name=True,
        extra="forbid",
        env_ignore_empty=True,  # an empty variable is unset, as before
    )

    data_dir: Path = Field(Path("data"), validation_alias=_env("data_dir", "MARKET_DATA_DIR"))
    database_url: str | None = Field(None, validation_alias=_env("database_url", "DATABASE_URL"))
    chain_id: int = Field(31337, gt=0, validation_alias=_env("chain_id", "MARKET_CHAIN_ID"))
    escrow: str = Field(ZERO_ADDRESS, validation_alias=_env("escrow", "MARKET_ESCROW"))
    rpc_url: str | None = Field(None, validation_alias=_env("rpc_url", "RPC_URL"))
    # The device classes this process matches, comma-separated (empty: every class). Several
    # processes on one PostgreSQL database each serve their own (`market.partition`).
    device_classes: str = ""
    # A deployment file (`tpumarket chain deploy`): the chain id, the escrow and the block to
    # index from come from it; an escrow or chain id also given must be the file's.
    deployment: Path | None = Field(None, validation_alias=_env("deployment"))
    # Token buckets: orders (a batch costs its order count), cancels and heartbeats per signing
    # account, requests per client IP. Several source addresses do not widen a signer's bucket.
    # A rate of 0 is no limit.
    rate_per_address: float = Field(200.0, ge=0)
    burst_per_address: float = Field(1_000.0, ge=0)
    rate_per_ip: float = Field(5_000.0, ge=0)  # above one client's pace (docs/market.md)
    burst_per_ip: float = Field(10_000.0, ge=0)
    # Body caps per route (`market.api.body`), enforced while the body streams in.
    max_body_bytes: int = Field(1 << 20, gt=0)  # a batch; also the app-wide backstop
    max_order_bytes: int = Field(16 << 10, gt=0)
    max_heartbeat_bytes: int = Field(16 << 10, gt=0)
    max_small_body_bytes: int = Field(4 << 10, gt=0)  # a cancel, a quote attached to a deal
    max_batch: int = Field(500, gt=0)
    # Connections (`market.api.server`): idle keep-alive connections close after `keep_alive_s`;
    # a request must arrive whole (headers and body) within `request_read_timeout_s` of its
    # first byte, with at most `max_header_bytes` of request line and headers.
    keep_alive_s: float = Field(5.0, gt=0)
    request_read_timeout_s: float = Field(10.0, gt=0)
    max_header_bytes: int = Field(32 << 10, gt=0)
    max_connections: int = Field(4_096, gt=0)
    # ... of which one client address may hold this many (429 beyond, 503 when all are taken);
    # the client address is the peer's, or the `X-Forwarded-For` of a peer listed in
    # `trusted_proxies` (comma-separated addresses or networks; none by default).
    max_connections_per_ip: int = Field(256, gt=0)
    trusted_proxies: str = ""
    # Served on a loopback address, the market refuses a dotted `Host` name not among these
    # (comma-separated): a page of another origin cannot reach it by DNS rebinding.
    allowed_hosts: str = ""
    max_streams: int = Field(2_048, ge=0)  # live-update streams (`/v1/stream`) served at once ...
    max_streams_per_ip: int = Field(16, ge=0)  # ... and to one client address
    # Funds behind orders (`market.funds`), when the market knows its escrow: a bid needs its
    # signer's free escrow balance to cover it and its other commitments, an ask or a heartbeat
    # needs stake, an order needs a device class a staked provider advertises.
    require_funds: bool = True
    min_provider_stake: int = Field(1_000_000, ge=0)
    max_live_orders_per_owner: int = Field(1_000, gt=0)
    # A signer that bids holds at most one live order per this much free escrow balance
    # (token base units; 0: no such bound), and the book shows its bids by the same rule.
    min_balance_per_order: int = Field(100, ge=0)
    max_classes_per_provider: int = Field(16, gt=0)  # a run-time class and compile-<gen> ones
    unopened_deal_hold_s: int = Field(3_600, ge=0)  # a matched deal not opened counts this long
    funds_cache_s: float = Field(2.0, ge=0)
    # The match gate's chain head is read at most once per this many seconds (0: once per
    # group commit); a block mined since can go unseen that long (`market.funds`).
    head_max_age_s: float = Field(0.05, ge=0)
    max_order_ttl_s: int = Field(30 * 24 * 3600, gt=0)
    heartbeat_skew_s: int = Field(300, ge=0)
    provider_offline_after_s: float = Field(60.0, gt=0)
    run_jobs: bool = True
    expire_every_s: float = Field(1.0, gt=0)
    offline_every_s: float = Field(5.0, gt=0)
    # How often resting orders the match gate held back are matched again (a funded client)
    rematch_every_s: float = Field(2.0, gt=0)
    index_every_s: float = Field(2.0, gt=0)
    index_chunk_blocks: int = Field(2_000, gt=0)
    # Blocks under the head the indexer leaves unread (a reorg replaces no indexed block unless
    # deeper); a deeper reorg rebuilds the index from the canonical chain (`market.indexer`).
    index_confirmations: int = Field(0, ge=0)
    # The escrow's deployment block (nothing before it to index); None: the indexer finds it.
    index_from_block: int | None = Field(
        None, ge=0, validation_alias=_env("index_from_block", "MARKET_FROM_BLOCK")
    )
    # The shortest challenge window an ask's quote may set, on top of the escrow's own minimum
    # (read once from the chain when the market knows the escrow); never below 1 s.
    min_challenge_window: int = Field(
        1, validation_alias=_env("min_challenge_window", "MARKET_MIN_CHALLENGE_WINDOW")
    )
    # The prior of the reputation score, in token base units (docs/market.md, "Reputation").
    reputation_prior: int = Field(1_000_000, gt=0)
    # History kept on disk, in days (None keeps all): fills older than this and finished orders
    # whose expiry passed this long ago are deleted by the retention job (`storage.prune_history`).
    fills_retention_days: float | None = Field(
        None, gt=0, validation_alias=_env("fills_retention_days", "MARKET_FILLS_RETENTION_DAYS")
    )
    orders_retention_days: float | None = Field(
        None, gt=0, validation_alias=_env("orders_retention_days", "MARKET_ORDERS_RETENTION_DAYS")
    )
    retention_every_s: float = Field(3_600.0, gt=0)

    @model_validator(mode="after")
    def _from_deployment(self) -> Settings:
        if self.deployment is None:
            return self
        from contracts.deployment import DeploymentError, read_deployment

        try:
            record = read_deployment(self.deployment)
        except DeploymentError as exc:
            raise ValueError(str(exc)) from None
        if self.escrow != ZERO_ADDRESS and self.escrow.lower() != record.escrow.lower():
            raise ValueError(f"escrow {self.escrow} is not the deployment file's {record.escrow}")
        if "chain_id" in self.model_fields_set and self.chain_id != record.chain_id:
            raise ValueError(f"chain id {self.chain_id} is not the deployment file's")
        self.escrow, self.chain_id = record.escrow, record.chain_id
        if self.index_from_block is None:
            self.index_from_block = record.deployment_block
        return self

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: str) -> str:
        """Refuse an entry that is no address or network (a ValueError naming it)."""
        TrustedProxies(part for part in value.split(",") if part.strip())
        return value

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Read the environment; `overrides` that are not None win over it. Raise
        `MarketConfigError` naming the first bad value."""
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        except ValidationError as exc:
            raise MarketConfigError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """Return a one-line account of the first error: the setting, its variable, the problem."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else "?"
    field = name.lower().removeprefix(PREFIX.lower())
    variable = PREFIX + field.upper()
    return f"market setting {field} ({variable}): {error['msg']}, got {error.get('input')!r}"
