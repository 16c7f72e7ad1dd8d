#!/usr/bin/env python3
"""Benchmark the market: the pure engine, then signed orders over HTTP to a running server.

The API part starts `python -m market.cli market serve` (uvicorn, SQLite persistence in a temp
dir, jobs and rate limits off) as a subprocess, signs the orders up front (as clients would),
then posts them from this process by concurrent clients through the batch endpoint. Each
request's latency is measured from send to parsed answer. Prints one JSON object as the last
line: `{"engine_orders_per_s", "api_orders_per_s", "api_p50_ms", "api_p99_ms"}`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contracts.chain import free_port  # noqa: E402
from tests.market.signing import CHAIN_ID, ESCROW, Trader  # noqa: E402

CLASSES = {"tpu-v5e": 1_000, "tpu-v6e": 1_600, "cpu": 50}


def _engine_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_market_engine", ROOT / "scripts" / "bench_market_engine.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sign_orders(count: int, seed: int) -> list[dict[str, Any]]:
    """Return `count` signed asks and bids over several device classes, near each class's mid."""
    rng = random.Random(seed)
    traders = [Trader(key="0x" + rng.randbytes(32).hex()) for _ in range(32)]
    now = int(time.time())
    orders = []
    for _ in range(count):
        device_class = rng.choice(tuple(CLASSES))
        mid = CLASSES[device_class]
        trader = rng.choice(traders)
        fields: dict[str, Any] = {
            "device_class": device_class,
            "quantity": rng.randint(1, 100),
            "slo_ms": rng.choice((50, 100, 250)),
            "memory": rng.choice((0, 16 << 30, 32 << 30)),
            "expiry": now + 3_600,
        }
        if rng.random() < 0.5:
            price = max(1, round(mid * (1 + rng.gauss(-0.005, 0.01))))
            orders.append(trader.bid(now, price=price, **fields))
        else:
            price = max(1, round(mid * (1 + rng.gauss(0.005, 0.01))))
            orders.append(trader.ask(now, price=price, **fields))
    return orders


def start_server(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the market on a free port with SQLite in `data_dir`; wait until it answers."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "market.cli",
            "market",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--escrow",
            ESCROW,
            "--chain-id",
            str(CHAIN_ID),
            "--no-jobs",
            "--rate-per-address",
            "0",
            "--rate-per-ip",
            "0",
        ],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": ""},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.05)  # readiness poll of the server process
    os.kill(process.pid, signal.SIGKILL)
    raise RuntimeError("market server did not start")


def post_all(
    url: str, orders: list[dict[str, Any]], *, batch: int, clients: int
) -> tuple[float, list[float]]:
    """Post `orders` in batches from `clients` threads; return (seconds, latencies in ms)."""
    batches = [orders[i : i + batch] for i in range(0, len(orders), batch)]
    bodies = [json.dumps({"orders": b}).encode() for b in batches]
    latencies: list[float] = []
    lock = threading.Lock()
    next_index = iter(range(len(bodies)))
    failures: list[str] = []

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while True:
                with lock:
                    index = next(next_index, None)
                if index is None:
                    return
                started = time.perf_counter()
                response = client.post(
                    "/v1/orders/batch",
                    content=bodies[index],
                    headers={"content-type": "application/json"},
                )
                response.json()
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    latencies.append(elapsed)
                    if response.status_code != 201:
                        failures.append(response.text[:300])

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} batches failed, first: {failures[0]}")
    return seconds, latencies


def process_cpu_s(pid: int) -> float:
    """Return the CPU seconds (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    """Return the q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def main(argv: list[str] | None = None) -> int:
    """Run both benchmarks and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--orders", type=int, default=20_000, help="signed orders over HTTP")
    parser.add_argument("--batch", type=int, default=20, help="orders per request")
    parser.add_argument("--clients", type=int, default=2, help="concurrent HTTP clients")
    parser.add_argument("--engine-orders", type=int, default=200_000)
    parser.add_argument("--skip-engine", action="store_true")
    args = parser.parse_args(argv)

    engine = 0.0
    if not args.skip_engine:
        figures = _engine_bench().run(args.engine_orders, 1, 3)
        engine = float(figures["engine_orders_per_s"])
        print(f"engine: {json.dumps(figures)}", flush=True)

    warmup = sign_orders(1_000, seed=2)
    orders = sign_orders(args.orders, seed=3)
    with tempfile.TemporaryDirectory(prefix="bench-market-") as tmp:
        process, url = start_server(Path(tmp))
        try:
            post_all(url, warmup, batch=args.batch, clients=args.clients)
            cpu_before = process_cpu_s(process.pid)
            client_before = time.process_time()
            seconds, latencies = post_all(url, orders, batch=args.batch, clients=args.clients)
            server_cpu_us = (process_cpu_s(process.pid) - cpu_before) / len(orders) * 1e6
            client_cpu_us = (time.process_time() - client_before) / len(orders) * 1e6
            stats = httpx.get(url + "/v1/fills", params={"limit": 1}).json()
        finally:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=15)
    print(
        f"api: {len(orders)} orders in {len(latencies)} requests of {args.batch} "
        f"from {args.clients} clients in {seconds:.2f}s; server CPU {server_cpu_us:.0f} us/order "
        f"({1e6 / server_cpu_us:.0f} orders/s per busy core), client CPU {client_cpu_us:.0f} "
        f"us/order; load average "
        f"{os.getloadavg()[0]:.1f}; last fill {stats[:1]}",
        flush=True,
    )
    result = {
        "engine_orders_per_s": round(engine),
        "api_orders_per_s": round(len(orders) / seconds),
        "api_p50_ms": round(percentile(latencies, 0.50), 2),
        "api_p99_ms": round(percentile(latencies, 0.99), 2),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
