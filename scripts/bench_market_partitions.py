#!/usr/bin/env python3
"""Benchmark device classes split across market processes on one PostgreSQL database.

Starts PostgreSQL (`scripts/postgres-up`, a schema of its own), then measures single signed
orders (one per request, posters on keep-alive connections, `bench_market.post_single`) over
two device classes, without a chain: first one process serving both classes, then two
processes (`--device-classes`), one class each, posted to at the same time. Prints each
process's server CPU per order and the orders/s of each run; the last line is one JSON object:
`{"one_process_orders_per_s", "one_process_cpu_us", "two_processes_orders_per_s",
"two_processes_cpu_us", "load_average"}`. The CPU figure (user + system of the server
processes over the orders they took) is what scales with cores; the rates depend on the host.
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

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from market.database import database_url  # noqa: E402
from tests.market.signing import Trader  # noqa: E402

CLASSES = ("bench-a", "bench-b")
SCHEMA = "bench_partitions"


def _bench_market() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_market", ROOT / "scripts" / "bench_market.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench_market()


def postgres() -> str:
    """Return the URL of a clean schema of the project's throwaway PostgreSQL."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "postgres-up")], capture_output=True, text=True, check=True
    )
    url = done.stdout.strip().splitlines()[-1]
    engine = create_engine(database_url(data_dir=Path("."), url=url))
    with engine.begin() as connection:
        connection.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        connection.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    engine.dispose()
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{SCHEMA}"


def sign(device_class: str, posters: int, per_poster: int, seed: int) -> list[list[bytes]]:
    """Return each poster's signed single orders in `device_class`, bids and asks near 1,000."""
    rng = random.Random(seed)
    out = []
    now = int(time.time())
    for _ in range(posters):
        trader = Trader(key="0x" + rng.randbytes(32).hex())
        bodies = []
        for _ in range(per_poster):
            fields: dict[str, Any] = {"device_class": device_class, "quantity": rng.randint(1, 100)}
            if rng.random() < 0.5:
                body = trader.bid(now, price=rng.randint(985, 1_005), **fields)
            else:
                body = trader.ask(now, price=rng.randint(995, 1_015), **fields)
            bodies.append(json.dumps(body, separators=(",", ":")).encode())
        out.append(bodies)
    return out


def run(url: str, tmp: Path, groups: list[tuple[list[str], list[list[bytes]]]]) -> dict[str, Any]:
    """Start one process per group (its flags, its posters' orders), post to all at once;
    return orders/s over all and each process's server CPU per order (µs)."""
    servers = [
        BENCH.start_server(tmp / f"p{i}", chain=["--no-jobs", "--database-url", url, *flags])
        for i, (flags, _) in enumerate(groups)
    ]
    try:
        before = [BENCH.process_cpu_s(p.pid) for p, _ in servers]
        results: list[tuple[float, int]] = [(0.0, 0)] * len(groups)

        def post(i: int) -> None:
            bodies = groups[i][1]
            seconds, _ = BENCH.post_single(servers[i][1], bodies)
            results[i] = (seconds, sum(len(b) for b in bodies))

        threads = [threading.Thread(target=post, args=(i,)) for i in range(len(groups))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cpu = [
            (BENCH.process_cpu_s(p.pid) - b) / results[i][1] * 1e6
            for i, ((p, _), b) in enumerate(zip(servers, before, strict=True))
        ]
    finally:
        for process, _ in servers:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
    total = sum(n for _, n in results)
    return {
        "orders_per_s": round(total / max(s for s, _ in results)),
        "cpu_us": [round(c) for c in cpu],
    }


def main(argv: list[str] | None = None) -> int:
    """Measure one process against two (see the module); print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--posters", type=int, default=8, help="single-order posters per class")
    parser.add_argument("--single", type=int, default=200, help="orders per poster")
    args = parser.parse_args(argv)
    url = postgres()
    a, b = (sign(name, args.posters, args.single, seed) for seed, name in enumerate(CLASSES))
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        one = run(url, Path(tmp) / "one", [([], a + b)])
        print(f"one process, both classes: {one}", flush=True)
        url = postgres()
        a, b = (sign(name, args.posters, args.single, 10 + s) for s, name in enumerate(CLASSES))
        two = run(
            url,
            Path(tmp) / "two",
            [(["--device-classes", CLASSES[0]], a), (["--device-classes", CLASSES[1]], b)],
        )
        print(f"two processes, one class each: {two}", flush=True)
    print(
        json.dumps(
            {
                "one_process_orders_per_s": one["orders_per_s"],
                "one_process_cpu_us": one["cpu_us"][0],
                "two_processes_orders_per_s": two["orders_per_s"],
                "two_processes_cpu_us": two["cpu_us"],
                "load_average": round(os.getloadavg()[0], 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
