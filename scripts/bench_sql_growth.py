#!/usr/bin/env python3
"""How the market writer's SQL cost per order follows the database as it grows.

Runs the writer's own path without HTTP or signatures: orders of the funded market bench's
shape (`scripts/bench_book_growth.py`, with 32-byte hex ids like the market's; an ask carries a
quote of the size the market stores) matched by the real engine (`market.placement.
match_orders`) in groups of `--group`, each group's rows written by `market.storage.
record_placement` and committed on one connection to a SQLite database the market's own
`make_engine`/`init_db` made (its pragmas, its migrations), with the market's checkpoint thread
running beside it, filled orders released from memory after each commit as the writer does.

Prints one JSON line: `sql_us_per_order_by_window` (wall microseconds per order spent in the
writes and the commit, per window of `--window` orders), `cpu_us_per_order_by_window` (the
process's CPU, checkpoints included, per order), `sql_growth_ratio` (last window / first),
`db_mb` at the end, `fills`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from market import database, storage
from market.books import ClassBook
from market.checkpoint import Checkpointer
from market.engine import MatchingEngine
from market.engine import Order as EngineOrder
from market.placement import match_orders
from market.verify import CheckedOrder
from market.writer import release
from scripts.bench_book_growth import NOW
from scripts.bench_book_growth import orders as bench_orders

QUOTE_BYTES = 420
"""About the size of a stored ask's quote JSON (the quote's fields as the market keeps them)."""


def checked(made: list[EngineOrder], seed: int) -> list[CheckedOrder]:
    """Return the orders as the verifier hands them to the writer: signature, nonce, quote."""
    rng = random.Random(seed)
    nonces: dict[str, int] = {}
    out = []
    for order in made:
        nonce = nonces[order.owner] = nonces.get(order.owner, 0) + 1
        ask = order.side.value == "ask"
        out.append(
            CheckedOrder(
                order=order,
                signature="0x" + rng.randbytes(65).hex(),
                quote_json=json.dumps({"pad": "q" * QUOTE_BYTES}) if ask else None,
                quote_signature="0x" + rng.randbytes(65).hex() if ask else None,
                quote_hash="0x" + rng.randbytes(32).hex() if ask else None,
                nonce=nonce,
                created_at=float(NOW),
            )
        )
    return out


def run(
    count: int = 400_000, window: int = 100_000, group: int = 32, seed: int = 1
) -> dict[str, object]:
    """Write the orders group by group; return the figures of the module docstring."""
    made = checked(bench_orders(count, seed, hex_ids=True), seed)
    book = ClassBook(MatchingEngine(), {})
    sql_s: list[float] = []
    cpu_s: list[float] = []
    fills = 0
    with tempfile.TemporaryDirectory(prefix="bench-sql-growth-") as tmp:
        db = database.make_engine(url=database.database_url(data_dir=Path(tmp), url=None))
        database.init_db(engine=db)
        written = [0]
        checkpoints = Checkpointer(db, lambda: written[0])
        last_seq: int | None = 0
        try:
            with db.connect() as connection:
                for start in range(0, count, window):
                    spent, began = 0.0, time.process_time()
                    end = min(start + window, count)
                    for at in range(start, end, group):
                        chunk = made[at : min(at + group, end)]
                        _, rows = match_orders([(chunk, NOW)], {"tpu-v5e": book}, None)
                        wrote = time.perf_counter()
                        last_seq = storage.record_placement(
                            connection=connection, last_fill_seq=last_seq, **rows._asdict()
                        )
                        connection.commit()
                        spent += time.perf_counter() - wrote
                        written[0] += len(chunk)
                        fills += len(rows.fills)
                        release(book)
                    done = end - start
                    sql_s.append(spent / done)
                    cpu_s.append((time.process_time() - began) / done)
        finally:
            checkpoints.close()
        db_mb = (Path(tmp) / database.SQLITE_FILE).stat().st_size / 1e6
        db.dispose()
    return {
        "sql_us_per_order_by_window": [round(s * 1e6, 1) for s in sql_s],
        "cpu_us_per_order_by_window": [round(s * 1e6, 1) for s in cpu_s],
        "sql_growth_ratio": round(sql_s[-1] / sql_s[0], 2),
        "window": window,
        "group": group,
        "db_mb": round(db_mb),
        "fills": fills,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--orders", type=int, default=400_000)
    parser.add_argument("--window", type=int, default=100_000)
    parser.add_argument("--group", type=int, default=32, help="orders per commit")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.orders, args.window, args.group, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
