"""Health, provider info and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from provider.api.deps import DaemonDep

router = APIRouter(tags=["system"])


@router.get("/v1/health")
async def health(daemon: DaemonDep) -> dict[str, Any]:
    """Say the daemon is up, with its address and live sandbox workers."""
    return {
        "ok": True,
        "provider": daemon.address,
        "workers": len(daemon.sandbox.workers()),
    }


@router.get("/v1/info")
async def info(daemon: DaemonDep) -> dict[str, Any]:
    """Return the terms and the chain this provider works on."""
    config = daemon.config
    return {
        "provider": daemon.address,
        "chain_id": daemon.domain.chain_id,
        "escrow": daemon.domain.verifying_contract,
        "plan": config.plan.to_json(),
        "plan_hash": "0x" + config.plan.struct_hash().hex(),
        "slo_ms": config.slo_ms,
        "max_envelope_bytes": config.max_envelope_bytes,
    }


@router.get("/metrics")
async def metrics(daemon: DaemonDep) -> Response:
    """Return the Prometheus metrics."""
    return Response(daemon.metrics.render(), media_type=CONTENT_TYPE_LATEST)
