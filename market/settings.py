"""Settings of one market process: limits, TTLs, jobs and where its database and escrow are."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.messages import ZERO_ADDRESS


@dataclass
class Settings:
    """Configuration of one market process (see `from_env` for the environment variables)."""

    data_dir: Path = Path("data")
    database_url: str | None = None
    chain_id: int = 31337
    escrow: str = ZERO_ADDRESS
    rpc_url: str | None = None
    # Token buckets: orders (a batch costs its order count), cancels and heartbeats per signing
    # account, requests per client IP. Several source addresses do not widen a signer's bucket.
    rate_per_address: float = 200.0
    burst_per_address: float = 1_000.0
    rate_per_ip: float = 5_000.0  # above one client's pace (docs/market.md, "Rate limits")
    burst_per_ip: float = 10_000.0
    # Body caps per route (`market.api.body`), enforced while the body streams in.
    max_body_bytes: int = 1 << 20  # a batch; also the app-wide backstop
    max_order_bytes: int = 16 << 10
    max_heartbeat_bytes: int = 16 << 10
    max_small_body_bytes: int = 4 << 10  # a cancel, a quote attached to a deal
    max_batch: int = 500
    # Connections (`market.api.server`): idle keep-alive connections close after `keep_alive_s`;
    # a request must arrive whole (headers and body) within `request_read_timeout_s` of its
    # first byte, with at most `max_header_bytes` of request line and headers.
    keep_alive_s: float = 5.0
    request_read_timeout_s: float = 10.0
    max_header_bytes: int = 32 << 10
    max_connections: int = 4_096
    max_streams: int = 2_048  # live-update streams (`/v1/stream`) served at once ...
    max_streams_per_ip: int = 16  # ... and to one client address
    # Funds behind orders (`market.funds`), when the market knows its escrow: a bid needs its
    # signer's free escrow balance to cover it and its other commitments, an ask or a heartbeat
    # needs stake, an order needs a device class a staked provider advertises.
    require_funds: bool = True
    min_provider_stake: int = 1_000_000
    max_live_orders_per_owner: int = 1_000
    max_classes_per_provider: int = 16  # a run-time class and compile-<generation> classes
    unopened_deal_hold_s: int = 3_600  # a matched deal not opened on chain counts this long
    funds_cache_s: float = 2.0
    max_order_ttl_s: int = 30 * 24 * 3600
    heartbeat_skew_s: int = 300
    provider_offline_after_s: float = 60.0
    run_jobs: bool = True
    expire_every_s: float = 1.0
    offline_every_s: float = 5.0
    index_every_s: float = 2.0
    index_chunk_blocks: int = 2_000
    # The escrow's deployment block (nothing before it to index); None: the indexer finds it.
    index_from_block: int | None = None
    # The shortest challenge window an ask's quote may set, on top of the escrow's own minimum
    # (read once from the chain when the market knows the escrow); never below 1 s.
    min_challenge_window: int = 1
    # The prior of the reputation score, in token base units (docs/market.md, "Reputation").
    reputation_prior: int = 1_000_000
    # History kept on disk, in days (None keeps all): fills older than this and finished orders
    # whose expiry passed this long ago are deleted by the retention job (`storage.prune_history`).
    fills_retention_days: float | None = None
    orders_retention_days: float | None = None
    retention_every_s: float = 3_600.0

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Read `MARKET_DATA_DIR`, `DATABASE_URL`, `MARKET_CHAIN_ID`, `MARKET_ESCROW`, `RPC_URL`,
        `MARKET_FROM_BLOCK`, `MARKET_MIN_CHALLENGE_WINDOW`, `MARKET_FILLS_RETENTION_DAYS`,
        `MARKET_ORDERS_RETENTION_DAYS`."""
        env = os.environ
        values: dict[str, Any] = {
            "data_dir": Path(env.get("MARKET_DATA_DIR", "data")),
            "database_url": env.get("DATABASE_URL") or None,
            "chain_id": int(env.get("MARKET_CHAIN_ID", "31337")),
            "escrow": env.get("MARKET_ESCROW", ZERO_ADDRESS),
            "rpc_url": env.get("RPC_URL") or None,
            "index_from_block": _optional_int(env.get("MARKET_FROM_BLOCK")),
        }
        for name in ("fills_retention_days", "orders_retention_days"):
            if env.get(f"MARKET_{name.upper()}"):
                values[name] = float(env[f"MARKET_{name.upper()}"])
        if env.get("MARKET_MIN_CHALLENGE_WINDOW"):
            values["min_challenge_window"] = int(env["MARKET_MIN_CHALLENGE_WINDOW"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _optional_int(text: str | None) -> int | None:
    return int(text) if text else None
