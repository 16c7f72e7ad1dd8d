"""Heartbeat adverts to the market (only when a market URL is configured).

The heartbeat has the market's ``HeartbeatCreate`` shape: ``{provider, timestamp, advert,
signature}``. The signature is the provider's secp256k1 signature (r||s||v, hex) over
``keccak256("tpumarket.heartbeat.v1" || provider address (20 bytes) || timestamp (uint64,
big-endian) || keccak256(canonical JSON of the advert))``, canonical JSON being sorted keys
and no spaces.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from eth_utils.address import to_canonical_address
from eth_utils.crypto import keccak

from client.market_http import MarketHttp, MarketHttpError
from contracts.messages import Domain, Plan, sign_digest
from provider.capacity import Capacity, capacity_to_wire
from provider.metrics import ProviderMetrics

log = logging.getLogger("provider.heartbeat")
HEARTBEAT_DOMAIN = b"tpumarket.heartbeat.v1"


def build_advert(
    *,
    capacity: Capacity | None,
    plan: Plan,
    slo_ms: int,
    endpoint: str,
    domain: Domain,
) -> dict[str, Any]:
    """Return the advert: device figures the market indexes, plus terms and measured capacity."""
    devices = capacity.devices if capacity is not None else None
    throughput = 0.0
    if capacity is not None and capacity.benchmark is not None:
        throughput = capacity.benchmark.gflops
    return {
        "device_class": (devices.platform if devices else "cpu"),
        "device_kind": (devices.device_kind if devices else "unknown")[:64],
        "device_count": devices.count if devices else 0,
        "price": plan.inference_price,
        "throughput": throughput,
        "capacity": devices.count if devices else 0,
        "endpoint": endpoint,
        "plan": plan.to_json(),
        "plan_hash": "0x" + plan.struct_hash().hex(),
        "slo_ms": slo_ms,
        "chain_id": domain.chain_id,
        "escrow": domain.verifying_contract,
        "measured": None if capacity is None else capacity_to_wire(capacity),
    }


def heartbeat_digest(provider: str, timestamp: int, advert: dict[str, Any]) -> bytes:
    """Return the digest a heartbeat's signature signs."""
    canonical = json.dumps(advert, sort_keys=True, separators=(",", ":")).encode()
    return keccak(
        HEARTBEAT_DOMAIN
        + to_canonical_address(provider)
        + timestamp.to_bytes(8, "big")
        + keccak(canonical)
    )


def signed_heartbeat(
    private_key: str, provider: str, advert: dict[str, Any], timestamp: int | None = None
) -> dict[str, Any]:
    """Return the heartbeat JSON, signed by the provider."""
    ts = int(time.time()) if timestamp is None else timestamp
    signature = sign_digest(heartbeat_digest(provider, ts, advert), private_key)
    return {
        "provider": provider,
        "timestamp": ts,
        "advert": advert,
        "signature": "0x" + signature.hex(),
    }


class Heartbeat:
    """Send the advert to the market; failures are logged and counted, never fatal."""

    def __init__(
        self,
        market: MarketHttp,
        *,
        private_key: str,
        provider: str,
        advert: dict[str, Any],
        metrics: ProviderMetrics,
    ) -> None:
        """Advertise ``advert`` as ``provider`` on ``market``."""
        self.market = market
        self._key = private_key
        self.provider = provider
        self.advert = advert
        self.metrics = metrics

    def beat(self) -> bool:
        """Send one heartbeat; return whether the market accepted it."""
        try:
            self.market.heartbeat(signed_heartbeat(self._key, self.provider, self.advert))
        except MarketHttpError as exc:
            self.metrics.heartbeats.labels("failed").inc()
            log.warning("heartbeat failed", extra={"error": str(exc)})
            return False
        self.metrics.heartbeats.labels("ok").inc()
        return True
