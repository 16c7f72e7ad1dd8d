"""Heartbeat adverts to the market (only when a market URL is configured).

The heartbeat has the market's ``HeartbeatCreate`` shape: ``{provider, timestamp, advert,
signature}``. The signature is the provider's EIP-712 signature of
``contracts.orders.Heartbeat(provider, advertHash, timestamp)`` under the market's domain
(``tpumarket-market``, ``1``, chain id, escrow), ``advertHash`` being keccak256 of the advert's
canonical JSON (sorted keys, no spaces): the market verifies exactly that.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from client.market_http import MarketHttp, MarketHttpError
from contracts.messages import Domain, Plan
from contracts.orders import Heartbeat as HeartbeatMessage
from contracts.orders import advert_hash, market_domain
from provider.capacity import Capacity, capacity_to_wire
from provider.metrics import ProviderMetrics

log = logging.getLogger("provider.heartbeat")


def build_advert(
    *,
    capacity: Capacity | None,
    plan: Plan,
    slo_ms: int,
    endpoint: str,
    domain: Domain,
) -> dict[str, Any]:
    """Return the advert: device figures the market indexes, plus terms and measured capacity.

    ``device_class`` is what this host runs tasks on (``cpu``, ``tpu-v5e``, ``gpu-h100``, ...);
    ``compile_targets`` apart, the TPU topologies it compiles for ahead of time without a chip
    (``v5e:1x1``, ...): a CPU host with libtpu sells v5e compile checks, not v5e time.
    """
    devices = capacity.devices if capacity is not None else None
    throughput = 0.0
    if capacity is not None and capacity.benchmark is not None:
        throughput = capacity.benchmark.gflops
    return {
        "device_class": (devices.device_class if devices else "cpu"),
        "compile_targets": (
            [t.name for t in capacity.compile_targets] if capacity is not None else []
        ),
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


def heartbeat_message(provider: str, timestamp: int, advert: dict[str, Any]) -> HeartbeatMessage:
    """Return the EIP-712 heartbeat message for an advert."""
    return HeartbeatMessage(provider=provider, advert_hash=advert_hash(advert), timestamp=timestamp)


def signed_heartbeat(
    private_key: str,
    provider: str,
    advert: dict[str, Any],
    domain: Domain,
    timestamp: int | None = None,
) -> dict[str, Any]:
    """Return the heartbeat JSON, signed by the provider under the market domain of `domain`'s
    chain and escrow."""
    ts = int(time.time()) if timestamp is None else timestamp
    market = market_domain(domain.chain_id, domain.verifying_contract)
    signature = heartbeat_message(provider, ts, advert).sign(market, private_key)
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
        domain: Domain,
        metrics: ProviderMetrics,
    ) -> None:
        """Advertise ``advert`` as ``provider`` on ``market`` (for ``domain``'s chain, escrow)."""
        self.market = market
        self.domain = domain
        self._key = private_key
        self.provider = provider
        self.advert = advert
        self.metrics = metrics

    def beat(self) -> bool:
        """Send one heartbeat; return whether the market accepted it."""
        try:
            self.market.heartbeat(
                signed_heartbeat(self._key, self.provider, self.advert, self.domain)
            )
        except MarketHttpError as exc:
            self.metrics.heartbeats.labels("failed").inc()
            log.warning("heartbeat failed", extra={"error": str(exc)})
            return False
        self.metrics.heartbeats.labels("ok").inc()
        return True
