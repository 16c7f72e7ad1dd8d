"""Health, provider info and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from contracts.typed_data import schema
from programs.rules import DEFAULT_MAX_NESTING, DEFAULT_MAX_OPS, ranges_from_wire, ranges_to_wire
from provider.api.deps import DaemonDep
from provider.capacity import device_class
from provider.daemon import Daemon
from provider.sandbox.walls import summary

router = APIRouter(tags=["system"])


@router.get("/v1/health")
async def health(daemon: DaemonDep, response: Response) -> dict[str, Any]:
    """Say the daemon is up, with its address, live sandbox workers and the start phases
    still warming (and those that failed); 503 while no task can run yet
    (:mod:`provider.warmup`)."""
    serving = daemon.warmup.serving()
    if not serving:
        response.status_code = 503
        response.headers["Retry-After"] = "1"
    return {
        "ok": serving,
        "provider": daemon.address,
        "workers": len(daemon.sandbox.workers()),
        "warming": daemon.warmup.warming(),
        "failed": daemon.warmup.failures,
    }


def _isolation(daemon: Daemon) -> dict[str, Any]:
    """How the sandbox walls its workers in, as the live workers measured it from inside.

    ``syscalls`` (``allowlist``/``none``), ``user_namespace``, ``uid``, ``capabilities``
    (``none``/``some``), ``no_new_privs``, ``network`` (``none``: no socket can be made) and
    ``inherited_fds`` hold for every live worker (a value the workers disagree on reads
    ``varies``); ``shortfalls`` lists what any of them lacks of full isolation.
    """
    workers = daemon.sandbox.workers()
    mode = daemon.sandbox.isolation
    measured = summary([w.walls for w in workers])
    syscalls = measured.pop("seccomp", "none")
    return {
        "mode": mode,
        "bubblewrap": mode == "bwrap",
        "seccomp": bool(workers) and all(w.seccomp for w in workers),
        "syscalls": syscalls,
        **measured,
        "workers": len(workers),
    }


def _device_class(daemon: Daemon) -> str | None:
    """The device class this host sells runs in (``cpu``, ``tpu-v5e``, ``gpu-h100``, ...)."""
    if daemon.capacity is not None:
        return daemon.capacity.devices.device_class
    workers = daemon.sandbox.workers()
    return device_class(workers[0].platform, workers[0].device_kind) if workers else None


def _program_rules(daemon: Daemon) -> dict[str, Any]:
    """What the workers check a program by (``job export --provider-url`` checks by it too):
    their JAX's version ranges (None while no worker is up) and the op and nesting caps (the
    daemon builds its sandbox with the defaults)."""
    found = (ranges_from_wire(worker.versions) for worker in daemon.sandbox.workers())
    ranges = next(filter(None, found), None)
    return {
        "ranges": None if ranges is None else ranges_to_wire(ranges),
        "max_ops": DEFAULT_MAX_OPS,
        "max_nesting": DEFAULT_MAX_NESTING,
    }


@router.get("/v1/info")
async def info(daemon: DaemonDep) -> dict[str, Any]:
    """Return the terms and the chain this provider works on, its devices and its walls."""
    config = daemon.config
    return {
        "device_class": _device_class(daemon),
        "isolation": _isolation(daemon),
        "output_memory_bytes": daemon.service.outputs.budget_bytes,
        "provider": daemon.address,
        "chain_id": daemon.domain.chain_id,
        "escrow": daemon.domain.verifying_contract,
        "plan": config.plan.to_json(),
        "plan_hash": "0x" + config.plan.struct_hash().hex(),
        "slo_ms": config.slo_ms,
        "max_envelope_bytes": config.max_envelope_bytes,
        "programs": _program_rules(daemon),
        "protocol": daemon.domain.version,
        "settlement": {
            "interval_s": config.settlement.interval_s,
            "margin_fraction": config.settlement.margin_fraction,
            "tx_allowance_s": config.settlement.tx_allowance_s,
            "min_challenge_window_s": config.settlement.min_window_s(),
        },
    }


@router.get("/v1/typed-data")
async def typed_data(daemon: DaemonDep) -> dict[str, Any]:
    """Return the EIP-712 typed-data schema of every signed message, for this escrow."""
    return schema(daemon.domain)


@router.get("/metrics")
async def metrics(daemon: DaemonDep) -> Response:
    """Return the Prometheus metrics."""
    return Response(daemon.metrics.render(), media_type=CONTENT_TYPE_LATEST)
