"""Memory and restart of the market as orders die: `rss_growth_mb_per_100k_dead_orders`.

Loaded by `scripts/bench_market.py` (`--memory`). It starts a market server without a chain
(SQLite in a temp dir), posts pairs of an ask and a bid that fill each other (so every order
posted dies at once, filled, while still inside its validity window), and reads the server's
resident memory (`VmRSS`) after a warm-up and after each of two rounds of `dead` more orders.
The growth per 100k dead orders over the second round is what the market keeps of orders it
no longer needs (the first also fills SQLite's bounded page caches as the database grows;
before, the engine kept each order until its expiry, and the writer each nonce). Then the
server is killed (SIGKILL) and started again on its database: `restart_to_serving_s` is the
time from the new process to its first `200 /healthz` (`restart_to_serving_cpu_s`: the CPU
it used meanwhile, which a loaded host does not stretch), with `live_orders` live orders in
the book and the dead ones stored.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.market.signing import Trader

PAIR_PRICE = 1_000


def _sign_pairs(job: tuple[int, int, int]) -> list[dict[str, Any]]:
    """Sign `pairs` ask+bid pairs that fill each other (a worker process), then `live` bids
    that rest below them."""
    seed, pairs, live = job
    now = int(time.time())
    expiry = now + 3_600
    seller = Trader(key="0x" + (seed * 2 + 1).to_bytes(32, "big").hex())
    buyer = Trader(key="0x" + (seed * 2 + 2).to_bytes(32, "big").hex())
    seller.nonces = itertools.count(1)
    buyer.nonces = itertools.count(1)
    quote = seller.quote(slo_ms=100, valid_until=expiry)
    terms: dict[str, Any] = {
        "device_class": "tpu-v5e",
        "slo_ms": 100,
        "memory": 0,
        "expiry": expiry,
    }
    orders = []
    for _ in range(pairs):
        orders.append(seller.ask(now, quote=quote, price=PAIR_PRICE, quantity=3, **terms))
        orders.append(buyer.bid(now, price=PAIR_PRICE, quantity=3, **terms))
    for n in range(live):
        orders.append(buyer.bid(now, price=PAIR_PRICE // 2 - n % 100, quantity=1, **terms))
    return orders


def sign_pairs(pairs: int, live: int, seed: int, workers: int) -> list[dict[str, Any]]:
    """Return `2 * pairs` orders that fill each other pairwise, then `live` resting bids,
    signed by `workers` processes (32 keys each side)."""
    keys = 32
    jobs = [
        (seed * 1_000 + k, pairs // keys + (k < pairs % keys), live // keys + (k < live % keys))
        for k in range(keys)
    ]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        signed = list(pool.map(_sign_pairs, jobs))
    # Interleave the keys' pairs, each ask just before its bid; resting bids at the end.
    dead: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for (_, n_pairs, _), orders in zip(jobs, signed, strict=True):
        dead.extend(orders[: 2 * n_pairs])
        rest.extend(orders[2 * n_pairs :])
    return dead + rest


def _cpu_s(pid: int) -> float:
    """Return the CPU seconds (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Return a process's resident memory in MiB (Linux /proc): `VmRSS` in all, `RssAnon` its
    heap, `RssFile` the pages of mapped files (the database file SQLite reads mapped)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


def run(
    *,
    start_server: Callable[..., tuple[Any, str]],
    post_all: Callable[..., tuple[float, list[float]]],
    data_dir: Path,
    dead: int,
    warmup: int,
    live: int,
    workers: int,
) -> dict[str, Any]:
    """Measure (see the module); return the figures."""
    warm = sign_pairs(warmup // 2, 0, seed=1, workers=workers)
    rounds = [sign_pairs(dead // 2, 0, seed=2 + r, workers=workers) for r in range(2)]
    resting = sign_pairs(0, live, seed=9, workers=workers)
    process, url = start_server(data_dir)
    try:
        post_all(url, warm, batch=100, clients=2)
        rss = [(rss_mb(process.pid), rss_mb(process.pid, "RssAnon"))]
        rates = []
        for orders in rounds:
            seconds, _ = post_all(url, orders, batch=100, clients=2)
            rates.append(len(orders) / seconds)
            rss.append((rss_mb(process.pid), rss_mb(process.pid, "RssAnon")))
        file_after = rss_mb(process.pid, "RssFile")
        if live:
            post_all(url, resting, batch=100, clients=2)
        book = httpx.get(url + "/v1/book/tpu-v5e", params={"levels": 500}).json()
        shown = sum(level["orders"] for level in (*book["bids"], *book["asks"]))
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=15)
    started = time.monotonic()
    again, url = start_server(data_dir)
    restart_s = time.monotonic() - started
    restart_cpu = _cpu_s(again.pid)
    try:
        rss_restarted = rss_mb(again.pid)
        restored = httpx.get(url + "/v1/book/tpu-v5e", params={"levels": 500}).json()
        shown_again = sum(level["orders"] for level in (*restored["bids"], *restored["asks"]))
    finally:
        os.kill(again.pid, signal.SIGTERM)
        again.wait(timeout=15)
    per_100k = 100_000 / len(rounds[0])
    figures = {
        "dead_orders_per_round": len(rounds[0]),
        "dead_orders_per_s": round(min(rates)),
        "rss_mb_rounds": [round(total, 1) for total, _ in rss],
        "rss_anon_mb_rounds": [round(anon, 1) for _, anon in rss],
        # The first round fills SQLite's page caches (bounded: 64 MiB a connection) as the
        # database grows; the second shows what each dead order still costs.
        "rss_growth_mb_per_100k_dead_orders_first": round((rss[1][0] - rss[0][0]) * per_100k, 1),
        "rss_growth_mb_per_100k_dead_orders": round((rss[2][0] - rss[1][0]) * per_100k, 1),
        "rss_file_after_mb": round(file_after, 1),
        "live_orders": shown,
        "live_orders_after_restart": shown_again,
        "restart_to_serving_s": round(restart_s, 2),
        "restart_to_serving_cpu_s": round(restart_cpu, 2),
        "rss_after_restart_mb": round(rss_restarted, 1),
    }
    print(f"memory: {json.dumps(figures)}", flush=True)
    return figures
