"""Server CPU per invalid order batch: what a refused batch within the size caps costs the market.

Starts a real market (`python -m market.cli market serve`, SQLite), posts each kind of invalid
500-order batch `--repeat` times over HTTP, and reads the server's CPU time (user + system, from
/proc) before and after: the figure is CPU milliseconds per request. The kinds:

- ``shape``: 500 ``{"side": "bid"}`` (every order misses its fields);
- ``last_field``: 499 signed bids, then one with a negative price;
- ``last_signature``: 499 signed bids, then one signed by another key;
- ``last_expired``: 499 signed bids, then one that expired;
- ``duplicate_nonce``: 500 signed bids, the last reusing the first's nonce;
- ``single_valid``: one signed bid per request (the normal cost, for comparison).

The last line of stdout is one JSON object: ``{kind: cpu_ms_per_request, ...}`` with each kind's
status code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.market.server import market_process  # noqa: E402
from tests.market.signing import Trader  # noqa: E402

JSON = {"content-type": "application/json"}
BATCH = 500


def cpu_s(pid: int) -> float:
    """Return a process's CPU time so far (user + system), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def signed_bids(now: int, count: int) -> list[dict[str, Any]]:
    """Return `count` signed bids of one fresh trader."""
    trader = Trader()
    return [trader.bid(now) for _ in range(count)]


def batches(now: int) -> dict[str, bytes]:
    """Return each invalid batch kind's body."""

    def body(orders: list[dict[str, Any]]) -> bytes:
        return json.dumps({"orders": orders}).encode()

    last_field = signed_bids(now, BATCH)
    last_field[-1]["price"] = -1
    last_signature = signed_bids(now, BATCH - 1)
    forged = Trader().bid(now, nonce=10**9)  # a nonce of its own: only the signature is wrong
    forged["owner"] = last_signature[0]["owner"]
    last_expired = signed_bids(now, BATCH - 1)
    trader = Trader()
    duplicate = [trader.bid(now) for _ in range(BATCH - 1)]
    return {
        "shape": body([{"side": "bid"}] * BATCH),
        "last_field": body(last_field),
        "last_signature": body([*last_signature, forged]),
        "last_expired": body([*last_expired, Trader().bid(now, expiry=now - 10)]),
        "duplicate_nonce": body([*duplicate, trader.bid(now, nonce=1)]),
    }


def measure(http: httpx.Client, pid: int, path: str, bodies: list[bytes]) -> tuple[float, set[int]]:
    """Post each body to `path`; return the server's CPU ms per request and the statuses."""
    statuses: set[int] = set()
    before = cpu_s(pid)
    for content in bodies:
        statuses.add(http.post(path, content=content, headers=JSON).status_code)
    return 1_000 * (cpu_s(pid) - before) / len(bodies), statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=20, help="requests per kind")
    args = parser.parse_args()
    now = int(time.time())
    kinds = batches(now)
    singles = [json.dumps(bid).encode() for bid in signed_bids(now, args.repeat * 10)]
    figures: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        market_process(Path(tmp) / "data") as (url, pid),
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        for _ in range(3):  # warm the server's code paths
            http.post("/v1/orders/batch", content=kinds["shape"], headers=JSON)
        for kind, content in kinds.items():
            ms, statuses = measure(http, pid, "/v1/orders/batch", [content] * args.repeat)
            figures[kind] = {"cpu_ms": round(ms, 2), "status": sorted(statuses)}
            print(f"{kind:>16}: {ms:7.2f} ms CPU per request, status {sorted(statuses)}")
        ms, statuses = measure(http, pid, "/v1/orders", singles)
        figures["single_valid"] = {"cpu_ms": round(ms, 2), "status": sorted(statuses)}
        print(f"{'single_valid':>16}: {ms:7.2f} ms CPU per request, status {sorted(statuses)}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
