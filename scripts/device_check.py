"""Run the provider daemon on this machine's accelerator; print one JSON line.

Finds the accelerator (TPU chips: ``/dev/accel*`` or ``/dev/vfio/<n>``; an NVIDIA GPU:
``/dev/nvidia<n>``), starts a local chain with the escrow and a deal, starts the daemon by its
CLI with one worker on that accelerator (one process owns it), then measures inference
tasks/s through the HTTP API and submits a few programs that must fail, printing how each
was diagnosed. On a host without an accelerator it says so in the JSON and exits 0.

Usage: scripts/device-check [--platform tpu|cuda|cpu] [--tasks N] [--clients N]
(``--platform cpu`` runs the same checks on the CPU, to try the script itself.)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def detect() -> str | None:
    """Return ``tpu`` or ``cuda`` for the accelerator this host has, or None."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return "tpu"
    if glob.glob("/dev/nvidia[0-9]*"):
        return "cuda"
    return None


def _failing_programs(platform: str) -> list[tuple[str, Any, str | None]]:
    """Programs that must fail on ``platform``: (case, envelope, compile target or None)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from bench_provider import malformed

    from tests.provider.programs import envelope_for, export_fn, spec

    here = "cuda" if platform == "cuda" else platform
    cases: list[tuple[str, Any, str | None]] = []
    cases.append(("malformed_bytecode", malformed(np.random.default_rng(1)), None))
    other = "cpu" if platform != "cpu" else "tpu"
    foreign = export_fn(lambda x: x * 2, spec(4), platforms=(other,))
    cases.append(("exported_for_" + other, envelope_for(foreign, [np.ones(4, np.float32)]), None))
    with jax.enable_x64(True):
        f64 = export_fn(lambda x: jnp.sin(x), spec(4, dtype=jnp.float64), platforms=(here,))
    cases.append(("float64_program", envelope_for(f64, [np.ones(4, np.float64)]), None))
    # Sorting 256 GiB needs it all at once: more than any one device has.
    huge = export_fn(
        lambda x: jnp.sort(jnp.arange(1 << 36, dtype=jnp.float32) * x[0])[:4],
        spec(4),
        platforms=(here,),
    )
    cases.append(("needs_256_gib", envelope_for(huge, [np.ones(4, np.float32)]), None))
    wrong = "gpu" if platform == "tpu" else "tpu"
    cases.append(("target_" + wrong, envelope_for(foreign), wrong))
    return cases


def check(platform: str, tasks: int, clients: int) -> dict[str, Any]:
    """Run the daemon on ``platform`` and measure it (see the module docstring)."""
    os.environ["JAX_PLATFORMS"] = platform
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_provider import (
        REPO,
        Submitter,
        daemon_task_ms,
        mlp_program,
        open_deal,
        start_daemon,
        tasks_per_s,
    )

    sys.path.insert(0, str(REPO))
    import httpx

    from contracts.binding import Chain
    from contracts.chain import Anvil
    from contracts.messages import address_of
    from programs.envelope import encode_envelope

    envelope, _, _ = mlp_program()
    with Anvil.start(accounts=5) as anvil, tempfile.TemporaryDirectory() as tmp:
        chain = Chain(anvil.url)
        deployment = chain.deploy(anvil.keys[0])
        deal_id = open_deal(chain, deployment.escrow, anvil.keys, deployment.token)
        process, url = start_daemon(anvil, deployment.escrow, anvil.keys[1], Path(tmp), 1, platform)
        try:
            info = httpx.get(f"{url}/v1/info", timeout=10).json()
            sub = Submitter(url, chain, deployment.escrow, anvil.keys[2], address_of(anvil.keys[1]))
            task_ms = daemon_task_ms(sub, deal_id, envelope, max(20, tasks // 10))
            throughput = tasks_per_s(sub, deal_id, envelope, tasks, clients)
            failures = []
            conn = sub.connect()
            try:
                for case, bad, target in _failing_programs(platform):
                    index = sub.next_index()
                    headers = sub.sign(deal_id, bad, index, target=target)
                    started = time.perf_counter()
                    status, data = sub.submit(conn, headers, encode_envelope(bad))
                    elapsed_ms = (time.perf_counter() - started) * 1000
                    diagnosis = data.get("diagnosis") or {}
                    failures.append(
                        {
                            "case": case,
                            "http": status,
                            "state": data.get("state"),
                            "category": diagnosis.get("category") or data.get("error"),
                            "message": (diagnosis.get("message") or data.get("reason") or "")[:300],
                            "required_bytes": diagnosis.get("required_bytes"),
                            "available_bytes": diagnosis.get("available_bytes"),
                            "ms": round(elapsed_ms, 1),
                        }
                    )
            finally:
                conn.close()
        finally:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(60)
    return {
        "accelerator": platform,
        "ran": True,
        "device_class": info.get("device_class"),
        "isolation": info.get("isolation"),
        "daemon_task_ms": round(task_ms, 3),
        "tasks_per_s": round(throughput, 1),
        "clients": clients,
        "failures": failures,
    }


def main() -> int:
    """Parse the arguments, run the check, print its JSON line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--platform", choices=("tpu", "cuda", "cpu"), default=None)
    parser.add_argument("--tasks", type=int, default=1000, help="tasks of the throughput run")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    platform = args.platform or detect()
    if platform is None:
        print(
            json.dumps(
                {
                    "accelerator": None,
                    "ran": False,
                    "reason": "no accelerator on this host (no /dev/accel*, /dev/vfio/<n> "
                    "or /dev/nvidia<n>); nothing measured",
                }
            )
        )
        return 0
    print(json.dumps(check(platform, args.tasks, args.clients)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
