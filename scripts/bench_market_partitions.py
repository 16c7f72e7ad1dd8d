#!/usr/bin/env python3
"""Benchmark device classes split across market processes on one PostgreSQL database.

Starts PostgreSQL (`scripts/postgres-up`, a schema of its own), then measures single signed
orders (one per request, posters on keep-alive connections, `bench_market.post_single`) over
two device classes: first one process serving both classes, then two processes
(`--device-classes`), one class each, posted to at the same time. Without a chain by default;
with `--funded`, as the market really runs: a real anvil with the escrow, every poster a funded
client and a staked provider heartbeating its class, the servers checking every order's funds
(across processes, under a per-signer lock, when there are two) and running their jobs. Prints
each process's server CPU per order and the orders/s of each run; the last line is one JSON
object: `{"funded", "one_process_orders_per_s", "one_process_cpu_us",
"two_processes_orders_per_s", "two_processes_cpu_us", "load_average"}`. The CPU figure (user +
system of the server processes over the orders they took) is what scales with cores; the
rates depend on the host.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
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
from typing import Any, NamedTuple

import httpx
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from market.database import database_url  # noqa: E402
from tests.market.signing import ARBITER, CHAIN_ID, ESCROW, Trader  # noqa: E402

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


class Chain(NamedTuple):
    """Where orders are signed for and what the servers are told: no chain, or a funded one."""

    escrow: str
    arbiter: str | None
    flags: list[str]
    env: dict[str, str]


NO_CHAIN = Chain(ESCROW, None, ["--no-jobs"], {})


def sign(
    device_class: str, keys: list[str], per_poster: int, seed: int, chain: Chain
) -> list[list[bytes]]:
    """Return each poster's signed single orders in `device_class`, bids and asks near 1,000."""
    rng = random.Random(seed)
    out = []
    now = int(time.time())
    for key in keys:
        arbiter = ARBITER if chain.arbiter is None else chain.arbiter
        trader = Trader(key=key, chain_id=CHAIN_ID, escrow=chain.escrow, arbiter=arbiter)
        trader.nonces = itertools.count(seed * 1_000_000 + 1)
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


class Group(NamedTuple):
    """One server: its extra flags, its posters' keys by class, their orders."""

    flags: list[str]
    keys: dict[str, list[str]]
    bodies: list[list[bytes]]


def run(url: str, tmp: Path, groups: list[Group], chain: Chain) -> dict[str, Any]:
    """Start one process per group, post to all at once; return orders/s over all and each
    process's server CPU per order (µs)."""
    servers = [
        BENCH.start_server(
            tmp / f"p{i}",
            escrow=chain.escrow,
            chain=[*chain.flags, "--database-url", url, *group.flags],
            env=chain.env,
        )
        for i, group in enumerate(groups)
    ]
    try:
        if chain.arbiter is not None:  # each poster a live provider of its class
            for (_, server_url), group in zip(servers, groups, strict=True):
                for name, keys in group.keys.items():
                    for key in keys:
                        trader = Trader(key=key, chain_id=CHAIN_ID, escrow=chain.escrow)
                        beat = trader.heartbeat(int(time.time()), device_class=name)
                        reply = httpx.post(f"{server_url}/v1/providers/heartbeat", json=beat)
                        reply.raise_for_status()
            time.sleep(6)  # the indexer's first runs: the setup's events indexed
        before = [BENCH.process_cpu_s(p.pid) for p, _ in servers]
        results: list[tuple[float, int]] = [(0.0, 0)] * len(groups)

        def post(i: int) -> None:
            bodies = groups[i].bodies
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


def measure(args: argparse.Namespace, chain: Chain, keys: dict[str, list[str]]) -> dict[str, Any]:
    """Run one process serving both classes, then two serving one each; return the figures."""
    a, b = CLASSES
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        url = postgres()
        signed = {n: sign(n, keys[n], args.single, s + 1, chain) for s, n in enumerate(CLASSES)}
        one = run(url, Path(tmp) / "one", [Group([], keys, signed[a] + signed[b])], chain)
        print(f"one process, both classes: {one}", flush=True)
        url = postgres()
        signed = {n: sign(n, keys[n], args.single, s + 3, chain) for s, n in enumerate(CLASSES)}
        groups = [Group(["--device-classes", n], {n: keys[n]}, signed[n]) for n in CLASSES]
        two = run(url, Path(tmp) / "two", groups, chain)
        print(f"two processes, one class each: {two}", flush=True)
    return {
        "funded": chain.arbiter is not None,
        "one_process_orders_per_s": one["orders_per_s"],
        "one_process_cpu_us": one["cpu_us"][0],
        "two_processes_orders_per_s": two["orders_per_s"],
        "two_processes_cpu_us": two["cpu_us"],
        "load_average": round(os.getloadavg()[0], 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure one process against two (see the module); print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--posters", type=int, default=8, help="single-order posters per class")
    parser.add_argument("--single", type=int, default=200, help="orders per poster")
    parser.add_argument("--funded", action="store_true", help="anvil, the escrow, funds checked")
    args = parser.parse_args(argv)
    rng = random.Random(7)
    keys = {n: ["0x" + rng.randbytes(32).hex() for _ in range(args.posters)] for n in CLASSES}
    if not args.funded:
        print(json.dumps(measure(args, NO_CHAIN, keys)))
        return 0
    from contracts.chain import Anvil
    from contracts.messages import address_of
    from tests.market.chain import deploy_world

    with Anvil.start(accounts=10) as anvil:
        world = deploy_world(anvil)
        for key in (k for group in keys.values() for k in group):
            world.fund(key)
            world.escrow.deposit(key, BENCH.FUNDED_DEPOSIT)
            world.escrow.stake(key, BENCH.FUNDED_STAKE)
        flags = ["--rpc-url", anvil.url, "--provider-ttl", "86400"]
        chain = Chain(world.escrow.address, address_of(world.arbiter), flags, BENCH.FUNDED_ENV)
        print(json.dumps(measure(args, chain, keys)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
