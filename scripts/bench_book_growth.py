#!/usr/bin/env python3
"""How the matching engine's cost per order follows the book as it grows.

Places `--orders` orders of the funded market bench's shape (`scripts/bench_market.py`
`sign_orders`: one device class, bids and asks around one mid price, three SLOs and three
memory sizes at random, each living an hour, none cancelled) into one engine, and prints one
JSON line: `engine_us_per_order_by_window` (CPU microseconds per order in each window of
`--window` orders), `engine_growth_ratio` (last window / first), `live_orders` at the end and
`compiled` (whether the engine ran as the C extensions `make setup` builds). About half of the
book rests crossed with orders whose terms it cannot use: what a taker must not walk one by one.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from market.engine import MatchingEngine, Order, Side
from market.native import built_extensions

MID = 1_000_000
NOW = 1_000_000


def orders(count: int, seed: int, hex_ids: bool = False) -> list[Order]:
    """Return `count` orders of the funded bench's shape, built before any clock starts; with
    `hex_ids`, ids are random 32-byte hex strings like the market's (else short ones)."""
    rng = random.Random(seed)
    owners = [f"0x{rng.randrange(1 << 160):040x}" for _ in range(32)]
    made = []
    for n in range(count):
        bid = rng.random() < 0.5
        made.append(
            Order(
                side=Side.BID if bid else Side.ASK,
                order_id="0x" + rng.randbytes(32).hex() if hex_ids else f"o{n}",
                owner=rng.choice(owners),
                device_class="tpu-v5e",
                quantity=rng.randint(1, 100),
                price=max(1, round(MID * (1 + rng.gauss(-0.005 if bid else 0.005, 0.01)))),
                plan="metered",
                slo_ms=rng.choice((50, 100, 250)),
                memory=rng.choice((0, 16 << 30, 32 << 30)),
                expiry=NOW + 3_600,
            )
        )
    return made


def run(count: int = 400_000, window: int = 50_000, seed: int = 1) -> dict[str, object]:
    """Place the orders window by window; return the figures of the module docstring."""
    engine = MatchingEngine()
    made = orders(count, seed)
    per_window: list[float] = []
    for start in range(0, count, window):
        chunk = made[start : start + window]
        began = time.process_time()
        for order in chunk:
            engine.place(order, now=NOW)
        per_window.append(round((time.process_time() - began) / len(chunk) * 1e6, 1))
    live = sum(len(engine.open_orders("tpu-v5e", side)) for side in (Side.BID, Side.ASK))
    return {
        "engine_us_per_order_by_window": per_window,
        "engine_growth_ratio": round(per_window[-1] / per_window[0], 2),
        "window": window,
        "live_orders": live,
        "compiled": bool(built_extensions()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--orders", type=int, default=400_000)
    parser.add_argument("--window", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.orders, args.window, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
