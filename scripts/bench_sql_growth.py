#!/usr/bin/env python3
"""How the market writer's SQL cost per order follows the database as it grows.

Runs the writer's own path without HTTP or signatures: orders of the funded market bench's
shape (`scripts/bench_book_growth.py`, with 32-byte hex ids like the market's; an ask carries a
quote of the size the market stores) matched by the real engine (`market.placement.
match_orders`) in groups of `--group`, each group's rows written by `market.storage.
record_placement` and committed on one connection to a SQLite database the market's own
`make_engine`/`init_db` made (its pragmas, its migrations), with the market's checkpoint thread
running beside it and the writer's own checkpoints between groups when that thread asks
(`market.writer.Writer.checkpoint_soon`, its backstop `WRITER_AUTOCHECKPOINT_PAGES`), filled
orders released from memory after each commit as the writer does.

Prints one JSON line: `sql_us_per_order_by_window` (wall microseconds per order spent in the
writes and the commit, per window of `--window` orders), split into
`write_us_per_order_by_window` (the inserts and updates) and `commit_us_per_order_by_window`
(the `COMMIT`: the group's pages written to the log, and the writer's checkpoints between
groups), `cpu_us_per_order_by_window` (the process's CPU, checkpoints included, per order),
`written_kb_per_order_by_window` and `read_kb_per_order_by_window` (what the process wrote and
read through system calls: log frames, checkpoints, pages missing from the cache),
`sql_growth_ratio` (last window / first), `db_mb` at the end, `fills`. `--dir` puts the
database in that directory (a memory file system such as /dev/shm tells what the disk's file
system adds).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
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
from market.writer import WRITER_AUTOCHECKPOINT_PAGES, release
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


def io_bytes() -> tuple[int, int]:
    """Return the bytes this process has written and read through system calls (Linux)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["wchar"]), int(fields["rchar"])


def run(
    count: int = 400_000,
    window: int = 100_000,
    group: int = 32,
    seed: int = 1,
    directory: Path | None = None,
) -> dict[str, object]:
    """Write the orders group by group (the database in a temporary directory under
    `directory`, if given); return the figures of the module docstring."""
    made = checked(bench_orders(count, seed, hex_ids=True), seed)
    book = ClassBook(MatchingEngine(), {})
    sql_s: list[float] = []
    commit_s: list[float] = []
    cpu_s: list[float] = []
    io_kb: list[tuple[float, float]] = []
    fills = 0
    with tempfile.TemporaryDirectory(prefix="bench-sql-growth-", dir=directory) as tmp:
        db = database.make_engine(url=database.database_url(data_dir=Path(tmp), url=None))
        database.init_db(engine=db)
        written = [0]
        due = threading.Event()
        checkpoints = Checkpointer(db, lambda: written[0], on_checkpoint=due.set)
        last_seq: int | None = 0
        try:
            with db.connect() as connection:
                connection.exec_driver_sql(
                    f"PRAGMA wal_autocheckpoint={WRITER_AUTOCHECKPOINT_PAGES}"
                )
                connection.commit()
                for start in range(0, count, window):
                    spent, committing, began = 0.0, 0.0, time.process_time()
                    io_began = io_bytes()
                    end = min(start + window, count)
                    for at in range(start, end, group):
                        chunk = made[at : min(at + group, end)]
                        _, rows = match_orders([(chunk, NOW)], {"tpu-v5e": book}, None)
                        wrote = time.perf_counter()
                        last_seq = storage.record_placement(
                            connection=connection, last_fill_seq=last_seq, **rows._asdict()
                        )
                        committed = time.perf_counter()
                        connection.commit()
                        if due.is_set():  # as the writer does, between groups
                            due.clear()
                            connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
                            connection.commit()
                        done_at = time.perf_counter()
                        spent += done_at - wrote
                        committing += done_at - committed
                        written[0] += len(chunk)
                        fills += len(rows.fills)
                        release(book)
                    done = end - start
                    sql_s.append(spent / done)
                    commit_s.append(committing / done)
                    cpu_s.append((time.process_time() - began) / done)
                    io_now = io_bytes()
                    io_kb.append(
                        (
                            (io_now[0] - io_began[0]) / done / 1e3,
                            (io_now[1] - io_began[1]) / done / 1e3,
                        )
                    )
        finally:
            checkpoints.close()
        db_mb = (Path(tmp) / database.SQLITE_FILE).stat().st_size / 1e6
        db.dispose()
    return {
        "sql_us_per_order_by_window": [round(s * 1e6, 1) for s in sql_s],
        "write_us_per_order_by_window": [
            round((s - c) * 1e6, 1) for s, c in zip(sql_s, commit_s, strict=True)
        ],
        "commit_us_per_order_by_window": [round(c * 1e6, 1) for c in commit_s],
        "cpu_us_per_order_by_window": [round(s * 1e6, 1) for s in cpu_s],
        "written_kb_per_order_by_window": [round(w, 1) for w, _ in io_kb],
        "read_kb_per_order_by_window": [round(r, 1) for _, r in io_kb],
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
    parser.add_argument("--dir", type=Path, default=None, help="where the database is made")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.orders, args.window, args.group, args.seed, args.dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
