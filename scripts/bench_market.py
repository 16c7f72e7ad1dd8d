#!/usr/bin/env python3
"""Benchmark the market: the pure engine, then signed orders over HTTP to a running server.

The API part starts `python -m market.cli market serve` (uvicorn, SQLite persistence in a temp
dir, jobs and rate limits off) as a subprocess, signs the orders up front (as clients would),
then posts them from this process by concurrent clients through the batch endpoint. Each
request's latency is measured from send to parsed answer.

The single-order part posts one signed order per request, as clients do: 32 posters, each with
its own key and its own keep-alive connection, send their orders one after another through
real HTTP (a small asyncio HTTP/1.1 client in this process, so the load generator's CPU stays
small next to the server's). `engine_vs_peer` is `bench_market_engine.versus_peer`; the
`engine_vs_peer_signed*` figures (`SIGNED_KEYS`) are `bench_market_engine.versus_peer_signed`.

The funded part (`--funded`, on by default) measures the market as it really runs: a real
anvil with the escrow deployed, every poster a funded client and a staked provider (a deposit,
a stake, a heartbeat), and the server started with `--rpc-url` and `--escrow` so every bid is
checked against its signer's escrow balance, every ask against its stake, and matching goes
through the match gate; the server's jobs run (the chain indexer every 2 s). There, 32 posters
post single orders (`api_single_funded_orders_per_s`, `api_single_funded_p99_ms_32`), then keep
posting for `--funded-minutes` (default 1; 10 for the issue's figure):
`funded_rate_after_10min_ratio` is the rate of the run's last window over its first (windows
of 60 s when the run lasts 3 minutes or more, else a third of the run), counted while every
poster still posts (`funded_all_posting_s`: a poster that ran out of signed orders would lower
the last window's rate); `funded_rate_by_minute` is the rate of each whole minute, beside
what `scripts/bench_minutes.py` notes of it: the server's CPU per order
(`funded_server_cpu_us_by_minute`, and by thread: `funded_server_cpu_us_by_thread_by_minute`),
the kilobytes it wrote and read per order (`funded_server_written_kb_per_order_by_minute`,
`funded_server_read_kb_per_order_by_minute`), the share of the host's CPU time its hypervisor
gave to others (`host_steal_pct_by_minute`), the share it was busy (`host_busy_pct_by_minute`),
its cores' and its memory's speed against the first minute's (`host_speed_by_minute`,
`host_memory_speed_by_minute`: fixed pieces of work timed once a second in their own CPU time),
the orders per group commit (`funded_orders_per_group_by_minute`) and the live orders at each
minute's end (`funded_live_orders_by_minute`), from the server's `/metrics`. Orders of the long
run are signed before it, in worker processes. `--server-root` runs the server from another
tree (an export of an earlier commit), so two versions are measured by one load generator.

Prints one JSON object as the last line: `{"engine_orders_per_s", "api_orders_per_s",
"api_p50_ms", "api_p99_ms", "api_single_orders_per_s", "api_single_p50_ms",
"api_single_p99_ms_32", "api_single_server_cpu_us", "engine_vs_peer",
"engine_vs_peer_signed", "engine_vs_peer_signed_one_thread",
"engine_vs_peer_signed_equal_threads", "engine_vs_peer_signed_bound",
"api_single_funded_orders_per_s", "api_single_funded_p99_ms_32",
"api_single_funded_server_cpu_us", "funded_rate_after_10min_ratio", "funded_rate_by_minute",
"funded_server_cpu_us_by_minute", "funded_server_cpu_us_by_thread_by_minute",
"funded_server_written_kb_per_order_by_minute", "funded_server_read_kb_per_order_by_minute",
"host_steal_pct_by_minute", "host_busy_pct_by_minute", "host_speed_by_minute",
"host_memory_speed_by_minute", "funded_orders_per_group_by_minute",
"funded_live_orders_by_minute", "funded_minutes",
"rss_growth_mb_per_100k_dead_orders", "restart_to_serving_s", ...}` (`--memory`:
`bench_market_memory`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contracts.chain import free_port  # noqa: E402
from scripts.bench_minutes import MinuteSampler, process_cpu_s  # noqa: E402
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


def sign_orders(count: int, seed: int, traders: list[Trader] | None = None) -> list[dict[str, Any]]:
    """Return `count` signed asks and bids over several device classes, near each class's mid,
    each signed by one of `traders` (default: 32 random keys) chosen at random."""
    rng = random.Random(seed)
    if traders is None:
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


def start_server(
    data_dir: Path,
    *,
    escrow: str = ESCROW,
    chain: list[str] | None = None,
    root: Path = ROOT,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the market (the tree at `root`) on a free port with SQLite in `data_dir`; wait
    until it answers. With `chain` (extra flags: the RPC URL) it checks funds and runs its
    jobs; without, no chain and no jobs."""
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
            escrow,
            "--chain-id",
            str(CHAIN_ID),
            *(chain if chain is not None else ["--no-jobs"]),
            "--rate-per-address",
            "0",
            "--rate-per-ip",
            "0",
        ],
        cwd=root,
        env={**os.environ, "DATABASE_URL": "", "PYTHONPATH": str(root), **(env or {})},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a loaded host starts it slowly
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


def sign_posters(posters: int, per_poster: int, seed: int) -> list[list[bytes]]:
    """Return, for each of `posters` keys, `per_poster` orders it signed, as request bodies."""
    rng = random.Random(seed)
    bodies = []
    for _ in range(posters):
        trader = Trader(key="0x" + rng.randbytes(32).hex())
        mine = sign_orders(per_poster, rng.randrange(1 << 30), [trader])
        bodies.append([json.dumps(o, separators=(",", ":")).encode() for o in mine])
    return bodies


async def _poster(
    host: str,
    port: int,
    bodies: list[bytes],
    latencies: list[float],
    done_at: list[float] | None = None,
    until: float = math.inf,
    ran_out: list[float] | None = None,
) -> int:
    """Post `bodies` one per request on one keep-alive connection (until `until`, a
    `perf_counter` time); return the failures. Each answer's time goes to `done_at`; the time
    this poster had posted all its bodies before `until` to `ran_out`."""
    reader, writer = await asyncio.open_connection(host, port)
    failures = 0
    head = (
        f"POST /v1/orders HTTP/1.1\r\nhost: {host}:{port}\r\n"
        "content-type: application/json\r\ncontent-length: "
    ).encode()
    try:
        for body in bodies:
            started = time.perf_counter()
            if started >= until:
                break
            writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            answer = await reader.readexactly(length)
            finished = time.perf_counter()
            latencies.append((finished - started) * 1000)
            if done_at is not None:
                done_at.append(finished)
            if status_line.split()[1] != b"201":
                failures += 1
                if failures == 1:
                    print(f"single order refused: {status_line!r} {answer[:300]!r}", flush=True)
        else:
            if ran_out is not None:
                ran_out.append(time.perf_counter())
    finally:
        writer.close()
    return failures


def post_single(
    url: str,
    bodies: list[list[bytes]],
    done_at: list[float] | None = None,
    seconds: float = math.inf,
    ran_out: list[float] | None = None,
) -> tuple[float, list[float]]:
    """Post each poster's bodies one per request, all posters at once, for at most `seconds`;
    return (seconds, latencies in ms); each answer's time goes to `done_at`, each poster's
    running out of bodies to `ran_out`."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    until = time.perf_counter() + seconds

    async def run() -> int:
        counts = await asyncio.gather(
            *(_poster(host, int(port), b, latencies, done_at, until, ran_out) for b in bodies)
        )
        return sum(counts)

    started = time.perf_counter()
    failures = asyncio.run(run())
    seconds = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{failures} single orders failed")
    return seconds, latencies


FUNDED_DEPOSIT = 10**14  # each poster's free escrow balance: its bids never run out
FUNDED_STAKE = 10**7  # each poster's stake: above the market's minimum and its quotes' stake
MAX_PER_POSTER = 60_000  # signed orders per poster for the long run (about 1 KB each)
FUNDED_ENV = {"TPUMARKET_MARKET_MAX_LIVE_ORDERS_PER_OWNER": "1000000"}  # a long run's book


def _sign_funded(job: tuple[str, str, str, int, int, int]) -> list[bytes]:
    """Sign `count` orders of one poster under the real escrow's domains (a worker process)."""
    key, escrow, arbiter, count, seed, first_nonce = job
    trader = Trader(key=key, chain_id=CHAIN_ID, escrow=escrow, arbiter=arbiter)
    trader.nonces = itertools.count(first_nonce)
    return [
        json.dumps(o, separators=(",", ":")).encode() for o in sign_orders(count, seed, [trader])
    ]


def sign_funded(
    keys: list[str], escrow: str, arbiter: str, per_poster: int, first_nonce: int
) -> list[list[bytes]]:
    """Return each poster's `per_poster` signed orders as request bodies, signed in parallel."""
    jobs = [(k, escrow, arbiter, per_poster, i, first_nonce) for i, k in enumerate(keys)]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(_sign_funded, jobs))


def rate_ratio(
    done_at: list[float], started: float, end: float | None = None
) -> tuple[float, float, float]:
    """Return (window s, first window's rate, last window's rate) of answers at `done_at`
    between `started` and `end` (default: the last answer): windows of 60 s in a run of 3
    minutes or more, else a third of the run."""
    end = max(done_at) if end is None else end
    done_at = [t for t in done_at if t <= end]
    window = 60.0 if end - started >= 180 else (end - started) / 3
    first = sum(1 for t in done_at if t < started + window) / window
    last = sum(1 for t in done_at if t > end - window) / window
    return window, first, last


def rates_by_minute(done_at: list[float], started: float, end: float) -> list[int]:
    """Return the answers per second in each whole minute from `started` to `end`."""
    minutes = int((end - started) // 60)
    counts = [0] * minutes
    for t in done_at:
        at = int((t - started) // 60)
        if 0 <= at < minutes:
            counts[at] += 1
    return [round(c / 60) for c in counts]


def funded(args: argparse.Namespace) -> dict[str, Any]:
    """Measure single orders with the funds check on (see the module): anvil, the escrow,
    funded and staked posters, the indexer running; then `args.funded_minutes` of posting."""
    from contracts.chain import Anvil
    from contracts.messages import address_of
    from tests.market.chain import deploy_world

    with Anvil.start(accounts=10) as anvil:
        world = deploy_world(anvil)
        rng = random.Random(5)
        keys = ["0x" + rng.randbytes(32).hex() for _ in range(args.posters)]
        for key in keys:
            world.fund(key)
            world.escrow.deposit(key, FUNDED_DEPOSIT)
            world.escrow.stake(key, FUNDED_STAKE)
        escrow, arbiter = world.escrow.address, address_of(world.arbiter)
        singles = sign_funded(keys, escrow, arbiter, args.single, 1)
        single_count = sum(len(b) for b in singles)
        flags = ["--rpc-url", anvil.url, "--provider-ttl", "86400"]
        with tempfile.TemporaryDirectory(prefix="bench-market-funded-") as tmp:
            process, url = start_server(
                Path(tmp), escrow=escrow, chain=flags, root=args.server_root, env=FUNDED_ENV
            )
            try:
                for number, key in enumerate(keys):  # each a live provider of one class
                    trader = world.trader(key)
                    name = tuple(CLASSES)[number % len(CLASSES)]
                    beat = trader.heartbeat(int(time.time()), device_class=name)
                    reply = httpx.post(url + "/v1/providers/heartbeat", json=beat, timeout=30)
                    reply.raise_for_status()
                time.sleep(6)  # the indexer's first runs: the setup's events indexed
                cpu_before = process_cpu_s(process.pid)
                load_before = os.getloadavg()[0]
                seconds, latencies = post_single(url, singles)
                cpu_us = (process_cpu_s(process.pid) - cpu_before) / single_count * 1e6
                rate = single_count / seconds
                print(
                    f"api single funded: {single_count} orders from {args.posters} posters in "
                    f"{seconds:.2f}s; server CPU {cpu_us:.0f} us/order; load average "
                    f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after",
                    flush=True,
                )
                run_s = args.funded_minutes * 60
                per_poster = min(MAX_PER_POSTER, math.ceil(rate * run_s * 1.5 / args.posters))
                long_bodies = sign_funded(keys, escrow, arbiter, per_poster, 10**9)
                done_at: list[float] = []
                ran_out: list[float] = []
                started = time.perf_counter()
                load_before = os.getloadavg()[0]
                sampler = MinuteSampler(process.pid, started, url)
                try:
                    post_single(url, long_bodies, done_at, run_s, ran_out)
                finally:
                    sampler.stop()
            finally:
                os.kill(process.pid, signal.SIGTERM)
                process.wait(timeout=15)
    # The rate counts while every poster posts: one that ran out of signed orders lowers it.
    end = min(ran_out) if ran_out else max(done_at)
    window, first, last = rate_ratio(done_at, started, end)
    by_minute = rates_by_minute(done_at, started, end)
    print(
        f"funded run: {len(done_at)} orders in {max(done_at) - started:.0f}s, every poster "
        f"posting for the first {end - started:.0f}s; rate {first:.0f}/s in the first "
        f"{window:.0f}s, {last:.0f}/s in the last {window:.0f}s of those; load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after",
        flush=True,
    )
    return {
        "api_single_funded_orders_per_s": round(rate),
        "api_single_funded_p50_ms": round(percentile(latencies, 0.50), 2),
        "api_single_funded_p99_ms_32": round(percentile(latencies, 0.99), 2),
        "api_single_funded_server_cpu_us": round(cpu_us),
        "funded_rate_after_10min_ratio": round(last / first, 3),
        "funded_rate_by_minute": by_minute,
        **sampler.by_minute(by_minute),
        "funded_minutes": args.funded_minutes,
        "funded_all_posting_s": round(end - started),
    }


def memory(args: argparse.Namespace) -> dict[str, Any]:
    """Measure memory as orders die and the restart after (`bench_market_memory`)."""
    spec = importlib.util.spec_from_file_location(
        "bench_market_memory", ROOT / "scripts" / "bench_market_memory.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its signing workers find their function by name
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory(prefix="bench-market-memory-") as tmp:
        figures: dict[str, Any] = module.run(
            start_server=lambda data_dir: start_server(data_dir, root=args.server_root),
            post_all=post_all,
            data_dir=Path(tmp),
            dead=args.dead_orders,
            warmup=args.dead_orders // 5,
            live=args.live_orders,
            workers=os.cpu_count() or 2,
        )
    return figures


def percentile(values: list[float], q: float) -> float:
    """Return the q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def no_chain(args: argparse.Namespace) -> dict[str, Any]:
    """Measure the market without a chain: batches from 2 clients, then single orders."""
    warmup = sign_orders(1_000, seed=2)
    orders = sign_orders(args.orders, seed=3)
    singles = sign_posters(args.posters, args.single, seed=4)
    single_count = sum(len(b) for b in singles)
    with tempfile.TemporaryDirectory(prefix="bench-market-") as tmp:
        process, url = start_server(Path(tmp), root=args.server_root)
        try:
            post_all(url, warmup, batch=args.batch, clients=args.clients)
            cpu_before = process_cpu_s(process.pid)
            client_before = time.process_time()
            seconds, latencies = post_all(url, orders, batch=args.batch, clients=args.clients)
            server_cpu_us = (process_cpu_s(process.pid) - cpu_before) / len(orders) * 1e6
            client_cpu_us = (time.process_time() - client_before) / len(orders) * 1e6
            stats = httpx.get(url + "/v1/fills", params={"limit": 1}).json()
            cpu_before = process_cpu_s(process.pid)
            load_before = os.getloadavg()[0]
            single_seconds, single_latencies = post_single(url, singles)
            single_cpu_us = (process_cpu_s(process.pid) - cpu_before) / single_count * 1e6
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
    print(
        f"api single: {single_count} orders, one per request, from {args.posters} posters in "
        f"{single_seconds:.2f}s; server CPU {single_cpu_us:.0f} us/order; load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after",
        flush=True,
    )
    return {
        "api_orders_per_s": round(len(orders) / seconds),
        "api_p50_ms": round(percentile(latencies, 0.50), 2),
        "api_p99_ms": round(percentile(latencies, 0.99), 2),
        "api_single_orders_per_s": round(single_count / single_seconds),
        "api_single_p50_ms": round(percentile(single_latencies, 0.50), 2),
        "api_single_p99_ms_32": round(percentile(single_latencies, 0.99), 2),
        "api_single_server_cpu_us": round(single_cpu_us),
    }


SIGNED_KEYS = (
    "engine_vs_peer_signed",
    "engine_vs_peer_signed_one_thread",
    "engine_vs_peer_signed_equal_threads",
    "engine_vs_peer_signed_bound",
)
"""The signed-order comparison's figures the summary line carries (`versus_peer_signed`)."""


def main(argv: list[str] | None = None) -> int:
    """Run both benchmarks and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--orders", type=int, default=20_000, help="signed orders over HTTP")
    parser.add_argument("--batch", type=int, default=20, help="orders per request")
    parser.add_argument("--clients", type=int, default=2, help="concurrent HTTP clients")
    parser.add_argument("--engine-orders", type=int, default=200_000)
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--posters", type=int, default=32, help="single-order posters")
    parser.add_argument("--single", type=int, default=375, help="single orders per poster")
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure RSS growth as orders die, and the restart after",
    )
    parser.add_argument("--dead-orders", type=int, default=100_000, help="for --memory")
    parser.add_argument("--live-orders", type=int, default=10_000, help="for --memory")
    parser.add_argument(
        "--funded",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure with the funds check on (anvil, escrow, indexer)",
    )
    parser.add_argument(
        "--funded-minutes",
        type=float,
        default=1.0,
        help="length of the funded run (10: the issue's)",
    )
    parser.add_argument(
        "--chainless",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the market without a chain (batches, single orders)",
    )
    parser.add_argument(
        "--server-root", type=Path, default=ROOT, help="run the server from this tree"
    )
    args = parser.parse_args(argv)

    engine = 0.0
    versus: dict[str, Any] = dict.fromkeys(("engine_vs_peer", *SIGNED_KEYS))
    if not args.skip_engine:
        bench = _engine_bench()
        figures = bench.run(args.engine_orders, 1, 3)
        engine = float(figures["engine_orders_per_s"])
        print(f"engine: {json.dumps(figures)}", flush=True)
        versus = bench.versus_peer()
        print(f"engine vs lightmatchingengine: {json.dumps(versus)}", flush=True)
        signed = bench.versus_peer_signed()
        print(f"from the signed order: {json.dumps(signed)}", flush=True)
        versus.update({key: signed[key] for key in SIGNED_KEYS})

    # The load generator's own heap (the signed bodies, the libraries) out of its collector's
    # scans: a full collection in this process would pause every poster and count as latency.
    result: dict[str, Any] = {
        "engine_orders_per_s": round(engine),
        "engine_vs_peer": versus["engine_vs_peer"],
        **{key: versus[key] for key in SIGNED_KEYS},
    }
    if args.chainless:
        gc.collect()
        gc.freeze()
        result.update(no_chain(args))
    if args.memory:
        result.update(memory(args))
    if args.funded:
        gc.collect()
        gc.freeze()
        result.update(funded(args))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
