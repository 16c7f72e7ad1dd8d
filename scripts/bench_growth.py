#!/usr/bin/env python3
"""How the provider's journal and the market grow with history, against live work.

Prints one JSON line:

- ``journal_open_s_1m``: seconds to open a provider journal holding ``--closed-deals`` closed
  deals of ``--tasks`` tasks each (1,000,000 historical tasks by default) and
  ``--open-deals`` open deals of ``--tasks`` tasks, in a fresh process (``Journal(...)`` with
  the provider key: migrate check, load and verify the open deals, seal what is ready);
- ``journal_rss_mb_1m``: that process's RSS right after the open (``journal_rss_base_mb``: the
  same process before it, with the journal's modules imported);
- ``market_rss_growth_mb_1m``: growth of the market's RSS (one process: the market service,
  its books and its writer thread) over ``--orders`` orders placed through the writer
  (``Writer.place``) and expired by the market's own expiry job (``expire_orders``), after
  ``--warmup`` orders; ``market_orders`` says how many.

The journal's history is written through the journal's own API (``record_ack``,
``record_receipt``, ``record_voucher``, ``record_settlement``, ``seal_ready``), one transaction
per deal, with every ack, receipt and checkpoint signed by the provider key (signed in a pool
of processes); it is built once and kept in ``--cache`` (rebuilt when the shape changes).
Orders skip signature checks (the writer takes verified orders): the bench measures what
the writer, the books and the database keep, not the verifier.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEY = "0x" + "11" * 32
CLIENT_KEY = "0x" + "22" * 32
CHAIN_ID = 31337
ESCROW = "0x" + "33" * 20
TASK_PRICE = 500


def rss_mb() -> float:
    """Return this process's resident set size in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


# ---- the journal ---------------------------------------------------------------------------


def _domain() -> Any:
    from contracts.messages import Domain

    return Domain(chain_id=CHAIN_ID, verifying_contract=ESCROW)


def _signed_deal(job: tuple[int, int]) -> list[tuple[Any, Any, bytes]]:
    """Return a deal's tasks signed in a chain: (ack record, receipt, receipt signature)."""
    from contracts.messages import KIND_INFERENCE, ZERO_HASH, Ack, TaskRequest
    from contracts.pricing import flat
    from provider.journal import AckRecord
    from provider.receipts import build_receipt

    deal_id, tasks = job
    domain, plan = _domain(), flat(compile_price=1_000, inference_price=TASK_PRICE)
    previous, out = ZERO_HASH, []
    for index in range(tasks):
        request = TaskRequest(
            deal_id=deal_id,
            task_index=index,
            kind=KIND_INFERENCE,
            program_hash=b"\x01" * 32,
            input_hash=index.to_bytes(32, "big"),
            max_price=900,
            deadline=2_000_000_000,
        )
        ack = Ack(
            deal_id=deal_id, task_index=index, request_hash=request.struct_hash(), price=TASK_PRICE
        )
        record = AckRecord(
            request,
            b"\x00" * 65,  # the client's request signature: the journal never checks it
            request.struct_hash(),
            None,
            ack,
            ack.sign(domain, KEY),
            time.time(),
        )
        receipt = build_receipt(
            plan,
            request,
            deadline=request.deadline,
            outputs=b"out",
            status=0,
            device_ms=1,
            compile_ms=0,
            cache_hit=False,
            started_at=1,
            finished_at=2,
            prev_receipt_hash=previous,
        )
        previous = receipt.struct_hash()
        out.append((record, receipt, receipt.sign(domain, KEY)))
    return out


def _write_deal(
    journal: Any, deal_id: int, signed: list[tuple[Any, Any, bytes]], close: bool
) -> None:
    from contracts.messages import Voucher, task_bitmap

    journal._db.execute("BEGIN")  # one transaction per deal: history built fast
    for record, receipt, signature in signed:
        journal.record_ack(record, b"envelope")
        journal.record_receipt(receipt, signature, b"out", {"state": "succeeded"})
    tasks = len(signed)
    voucher = Voucher(
        deal_id=deal_id, cumulative_amount=TASK_PRICE * tasks, tasks=task_bitmap(range(tasks))
    )
    stored = journal.record_voucher(voucher, voucher.sign(_domain(), CLIENT_KEY))
    if close:
        journal.record_settlement(
            deal_id, "redeem", {"voucher_seq": stored.seq, "paid": str(TASK_PRICE * tasks)}, "0x1"
        )
        journal.record_settlement(deal_id, "closed", {"by": "provider"}, "0x2")
    journal._db.execute("COMMIT")


def build_journal(path: Path, closed: int, open_: int, tasks: int) -> None:
    """Write the history through the journal's API; seal every closed deal as it closes."""
    from contracts.messages import address_of
    from provider.journal import Journal

    path.unlink(missing_ok=True)
    journal = Journal(path, address_of(KEY), _domain(), private_key=KEY)
    jobs = [(deal_id, tasks) for deal_id in range(1, closed + open_ + 1)]
    started = time.monotonic()
    with multiprocessing.Pool(os.cpu_count() or 1) as pool:
        for n, signed in enumerate(pool.imap(_signed_deal, jobs, chunksize=4), start=1):
            deal_id = signed[0][0].ack.deal_id
            _write_deal(journal, deal_id, signed, close=deal_id <= closed)
            journal.seal_ready()
            if n % 500 == 0:
                print(
                    f"journal: {n}/{len(jobs)} deals in {time.monotonic() - started:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    journal.close()


def clone_history(path: Path, signed: int, total: int, open_: int) -> None:
    """Grow the sealed history from ``signed`` deals to ``total`` by copying sealed deals'
    rows and seals under new deal ids, in SQL (the copies' signatures name the original deal:
    a full verification flags them; opening never reads them)."""
    db = sqlite3.connect(path, isolation_level=None)
    base = signed + open_  # copies are numbered after every built deal
    columns = {
        "acks": "task_index, request_json, request_sig, request_hash, target, envelope, "
        "ack_json, ack_sig, acked_at, program_sha256, weights_sha256, protocol",
        "receipts": "task_index, receipt_json, receipt_sig, receipt_hash, outputs, detail_json, "
        "recorded_at",
        "vouchers": "voucher_json, signature, received_at",
        "settlements": "action, data_json, tx_hash, recorded_at",
    }
    copy = base
    while copy < base + total - signed:
        db.execute("BEGIN")
        for source in range(1, signed + 1):
            if copy >= base + total - signed:
                break
            copy += 1
            for table, cols in columns.items():
                db.execute(
                    f"INSERT INTO {table} (deal_id, {cols}) SELECT ?, {cols} FROM {table} "
                    "WHERE deal_id = ?",
                    (str(copy), str(source)),
                )
            db.execute(
                "INSERT INTO seals (deal_id, checkpoint_json, signature, sealed_at) "
                "SELECT ?, checkpoint_json, signature, sealed_at FROM seals WHERE deal_id = ?",
                (str(copy), str(source)),
            )
        db.execute("COMMIT")
        print(f"journal: {copy - base} sealed deals copied", file=sys.stderr, flush=True)
    db.close()


def strip_history(source: Path, path: Path) -> None:
    """Copy the journal without its sealed deals: the same open deals, no history."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(path) as target:
        src.backup(target)
    db = sqlite3.connect(path, isolation_level=None)
    triggers = db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall()
    for name, _ in triggers:
        db.execute(f"DROP TRIGGER {name}")
    for table in ("acks", "receipts", "vouchers", "settlements", "deals", "seals"):
        db.execute(f"DELETE FROM {table} WHERE deal_id IN (SELECT deal_id FROM seals)")
    for _, create in triggers:
        db.execute(create)
    db.execute("VACUUM")
    db.close()


def _measure(path: Path) -> dict[str, Any]:
    measured = subprocess.run(
        [sys.executable, __file__, "--measure-journal", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    figures: dict[str, Any] = json.loads(measured.stdout.strip().splitlines()[-1])
    return figures


def measure_open(path: Path) -> dict[str, float]:
    """Open the journal in this (fresh) process; return seconds and RSS."""
    from contracts.messages import address_of
    from provider.journal import Journal

    base = rss_mb()
    started, cpu = time.perf_counter(), time.process_time()
    journal = Journal(path, address_of(KEY), _domain(), private_key=KEY)
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    after = rss_mb()
    open_deals = len(journal.open_deal_ids())
    journal.close()
    return {
        "journal_open_s": round(took, 3),
        "journal_open_cpu_s": round(cpu, 3),
        "journal_rss_mb": round(after, 1),
        "journal_rss_base_mb": round(base, 1),
        "journal_open_deals": open_deals,
    }


def journal_figures(args: argparse.Namespace) -> dict[str, Any]:
    signed = min(args.signed_deals or args.closed_deals, args.closed_deals)
    shape = f"{signed}x{args.tasks}+{args.open_deals}"
    args.cache.mkdir(parents=True, exist_ok=True)
    built = args.cache / f"journal-{shape}.sqlite3"
    marker = built.with_suffix(".built")
    if not marker.exists():
        started = time.monotonic()
        build_journal(built, signed, args.open_deals, args.tasks)
        marker.write_text(f"{time.monotonic() - started:.0f}\n")
    path = built
    if args.closed_deals > signed:
        path = args.cache / f"journal-{shape}-to-{args.closed_deals}.sqlite3"
        grown = path.with_suffix(".built")
        if not grown.exists():
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            with sqlite3.connect(built) as source, sqlite3.connect(path) as target:
                source.backup(target)
            clone_history(path, signed, args.closed_deals, args.open_deals)
            grown.write_text("copied\n")
    bare = args.cache / f"journal-{shape}-no-history.sqlite3"
    if not bare.with_suffix(".built").exists():
        strip_history(built, bare)
        bare.with_suffix(".built").write_text("stripped\n")
    figures = _measure(path)
    # The same open deals beside less history, measured in the same run (the host's load moves
    # every absolute figure; the differences are what history costs).
    signed_history = _measure(built)
    figures["journal_open_s_signed_history"] = signed_history["journal_open_s"]
    figures["journal_open_cpu_s_signed_history"] = signed_history["journal_open_cpu_s"]
    no_history = _measure(bare)
    figures["journal_open_s_no_history"] = no_history["journal_open_s"]
    figures["journal_open_cpu_s_no_history"] = no_history["journal_open_cpu_s"]
    figures["journal_rss_mb_no_history"] = no_history["journal_rss_mb"]
    figures["load_average"] = round(os.getloadavg()[0], 1)
    figures["journal_tasks"] = args.closed_deals * args.tasks
    figures["journal_signed_tasks"] = signed * args.tasks
    figures["journal_file_mb"] = round(path.stat().st_size / 2**20, 1)
    return figures


# ---- the market ----------------------------------------------------------------------------


def market_figures(args: argparse.Namespace) -> dict[str, Any]:
    """Place orders through the market's writer, expire them, watch the process's RSS."""
    from market.engine.orders import Order, Side
    from market.service import MarketService
    from market.settings import Settings
    from market.verify import CheckedOrder

    class Clock:
        now = 1_800_000_000.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
        settings = Settings(data_dir=Path(tmp), chain_id=CHAIN_ID, escrow=ESCROW, run_jobs=False)
        service = MarketService(settings, clock=clock)
        owners = [f"0x{n:040x}" for n in range(1, 1001)]
        batch, placed, base = 1000, 0, None
        started = time.monotonic()
        try:
            while placed < args.orders + args.warmup:
                now = int(clock())
                orders = [
                    CheckedOrder(
                        Order(
                            side=Side.BID,
                            order_id=f"0x{placed + i:064x}",
                            owner=owners[(placed + i) % len(owners)],
                            device_class="tpu-v5e",
                            quantity=1,
                            price=100 + (placed + i) % 50,
                            plan="metered",
                            slo_ms=250,
                            memory=0,
                            expiry=now + 30,
                        ),
                        "0x" + "00" * 65,
                        None,
                        None,
                        None,
                        placed + i,  # nonces unique per owner
                        float(now),
                    )
                    for i in range(batch)
                ]
                service.writer.place(orders, now)
                placed += batch
                clock.now += 1
                if placed % (10 * batch) == 0:
                    clock.now += 60  # every order placed so far is past its expiry
                    service.expire_orders()
                if base is None and placed >= args.warmup:
                    base = rss_mb()
                if placed % 100_000 == 0:
                    print(
                        f"market: {placed} orders in {time.monotonic() - started:.0f} s, "
                        f"RSS {rss_mb():.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
            clock.now += 60
            service.expire_orders()
            end = rss_mb()
        finally:
            service.close()
    assert base is not None
    return {
        "market_rss_growth_mb_1m": round((end - base) * 1_000_000 / args.orders, 1),
        "market_rss_growth_mb": round(end - base, 1),
        "market_orders": args.orders,
        "market_rss_mb": round(end, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--closed-deals", type=int, default=10_000)
    parser.add_argument(
        "--signed-deals",
        type=int,
        default=None,
        help="closed deals built through the journal's API with signatures (default: all); "
        "the rest are SQL copies of them",
    )
    parser.add_argument("--open-deals", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=100, help="tasks per deal")
    parser.add_argument("--orders", type=int, default=1_000_000, help="measured, after warm-up")
    parser.add_argument("--warmup", type=int, default=50_000)
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "tpumarket-bench-growth"
    )
    parser.add_argument("--skip-market", action="store_true")
    parser.add_argument("--skip-journal", action="store_true")
    parser.add_argument("--measure-journal", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_journal is not None:
        print(json.dumps(measure_open(args.measure_journal)))
        return 0
    out: dict[str, Any] = {}
    if not args.skip_journal:
        journal = journal_figures(args)
        out["journal_open_s_1m"] = journal.pop("journal_open_s")
        out["journal_rss_mb_1m"] = journal.pop("journal_rss_mb")
        out["journal_open_cpu_s_1m"] = journal.pop("journal_open_cpu_s")
        out.update(journal)
    if not args.skip_market:
        out.update(market_figures(args))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
