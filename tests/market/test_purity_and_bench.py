"""The engine stays a pure module, and the engine benchmark runs and reports its figures."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from market.service import MarketService
from services.threads import name_os_thread

from .conftest import START
from .signing import Trader

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "market" / "engine"
BENCH = ROOT / "scripts" / "bench_market_engine.py"
ALLOWED_IMPORTS = {
    "__future__",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "heapq",
    "typing",
    "market",
}


def imported_roots(path: Path) -> set[str]:
    """Return the top-level package of every import in a source file."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted(ENGINE.glob("*.py")), ids=lambda p: p.name)
def test_engine_module_imports_only_pure_standard_library(path: Path) -> None:
    assert imported_roots(path) <= ALLOWED_IMPORTS


def test_engine_market_imports_stay_inside_engine_and_errors() -> None:
    for path in ENGINE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("market")
            ):
                assert node.module.startswith("market.engine") or node.module == "market.errors"


def load_bench(path: Path = BENCH) -> ModuleType:
    """Import a bench script (scripts/bench_market_engine.py by default) as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_replay_is_deterministic_and_mixes_places_cancels_and_classes() -> None:
    bench = load_bench()
    first = bench.generate_replay(2_000, seed=7)
    second = bench.generate_replay(2_000, seed=7)
    assert first == second
    kinds = {op.kind for op in first}
    assert kinds == {0, 1, 2}
    assert sum(1 for op in first if op.kind != 2) == 2_000
    classes = {op.order.device_class for op in first if op.kind == 0}
    assert len(classes) >= 3
    assert bench.replay(first)[1] == bench.replay(second)[1] > 0


def test_bench_script_prints_one_json_line_with_the_figures() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--orders", "3000", "--repeat", "1"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    figures = json.loads(lines[0])
    assert set(figures) == {"engine_orders_per_s", "orders", "fills", "compiled"}
    assert figures["compiled"] is True
    assert figures["orders"] == 3000
    assert figures["engine_orders_per_s"] > 0


def test_signed_comparison_reports_the_bound_that_verifying_alone_sets() -> None:
    figures = load_bench().versus_peer_signed(orders=300, rounds=1, threads=2)
    # Verified on two threads and matched in order, both trade what they trade on one
    assert figures["same_units_traded_signed"] is True
    assert figures["verify_threads"] == 2
    assert figures["engine_vs_peer_signed_equal_threads"] > 0
    assert figures["signed_verify_us_per_order"] > 0
    # The peer's time over its decoding and verifying alone (a ratio of two timings: noisy)
    assert figures["engine_vs_peer_signed_bound"] > 0


def test_book_growth_bench_prints_its_figures_for_a_book_that_grows_crossed() -> None:
    bench = load_bench(ROOT / "scripts" / "bench_book_growth.py")
    made = bench.orders(4_000, seed=3)
    assert len({(o.slo_ms, o.memory) for o in made}) == 9  # three SLOs x three memory sizes
    result = bench.run(4_000, 1_000, seed=3)
    assert len(result["engine_us_per_order_by_window"]) == 4
    assert result["engine_growth_ratio"] > 0 and result["compiled"] is True
    assert 1_000 < result["live_orders"] < 4_000  # some trade, the rest rests (crossed)


def test_sql_growth_bench_prints_its_figures_for_the_writers_own_path(tmp_path: Path) -> None:
    bench = load_bench(ROOT / "scripts" / "bench_sql_growth.py")
    result = bench.run(2_000, 500, group=32, seed=3, directory=tmp_path)
    assert len(result["sql_us_per_order_by_window"]) == 4
    assert all(us > 0 for us in result["cpu_us_per_order_by_window"])
    for write, commit, whole in zip(
        result["write_us_per_order_by_window"],
        result["commit_us_per_order_by_window"],
        result["sql_us_per_order_by_window"],
        strict=True,
    ):
        assert write > 0 and commit > 0 and abs(write + commit - whole) <= 0.2  # rounding
    # Every window's commits wrote its pages to the log: at least an order's row a order.
    assert all(kb > 0.2 for kb in result["written_kb_per_order_by_window"])
    assert len(result["read_kb_per_order_by_window"]) == 4
    assert list(tmp_path.iterdir()) == []  # its temporary database is gone
    with pytest.raises(FileNotFoundError):  # and it was made in the directory given
        bench.run(10, 10, directory=tmp_path / "missing")
    assert result["sql_growth_ratio"] > 0 and result["group"] == 32
    assert 0 < result["fills"] < 2_000  # the engine matched some, the rest rests


def test_funded_run_figures_by_minute_count_each_whole_minute_and_the_servers_cpu() -> None:
    bench = load_bench(ROOT / "scripts" / "bench_market.py")
    # The run began at 100 and ended at 270: two whole minutes; the answers of the unfinished
    # third are left out.
    done_at = [
        100.0 + 60 * minute + 1
        for minute, count in enumerate((120, 180, 600))
        for _ in range(count)
    ]
    assert bench.rates_by_minute(done_at, 100.0, 270.0) == [2, 3]
    minutes = load_bench(ROOT / "scripts" / "bench_minutes.py")
    small = minutes.MemoryCanary(table_items=1 << 10, reads=64)
    sampler = minutes.MinuteSampler(os.getpid(), time.perf_counter() + 3600, memory=small)
    sampler.stop()  # no minute passed
    assert len(sampler.samples) == 1 and sampler.samples[0].groups == (0.0, 0.0, 0.0)  # no URL

    # Two whole minutes sampled: 1.2 s of server CPU over 6,000 orders (0.6 s of it the event
    # loop's, 0.48 s the writer's), then 0.9 s over 3,000; 30 MB written and 6 MB read, then
    # 3 MB and 0.3 MB; of 500 host ticks 5 stolen and 100 idle, then none stolen and 250 idle;
    # the hashing canary took 2 ms, then 2.5 ms (cores 20% slower), the memory canary 4 ms,
    # then 5 ms.
    def at(
        cpu: float,
        loop: float,
        writer: float,
        io: tuple[int, int],
        ticks: tuple[int, int, int],
        groups: tuple[float, float, float],
    ) -> object:
        threads = {"event_loop": loop, "market-writer": writer, "other": cpu - loop - writer}
        return minutes.Sample(cpu, threads, io, ticks, groups)

    sampler.samples = [
        at(3.0, 2.0, 0.5, (10**6, 10**5), (5, 100, 500), (10.0, 100.0, 5.0)),
        at(4.2, 2.6, 0.98, (31 * 10**6, 61 * 10**5), (10, 200, 1000), (20.0, 300.0, 7.0)),
        at(5.1, 3.0, 1.4, (34 * 10**6, 64 * 10**5), (10, 450, 1500), (20.0, 300.0, 9.0)),
    ]
    sampler.canary_s = [0.002, 0.0025]
    sampler.memory_s = [0.004, 0.005]
    assert sampler.by_minute([100, 50]) == {
        "funded_server_cpu_us_by_minute": [200, 300],
        "funded_server_cpu_us_by_thread_by_minute": {
            "event_loop": [100, 133],
            "market-writer": [80, 140],
            "other": [20, 27],
        },
        "funded_server_written_kb_per_order_by_minute": [5.0, 1.0],
        "funded_server_read_kb_per_order_by_minute": [1.0, 0.1],
        "host_steal_pct_by_minute": [1.0, 0.0],
        "host_busy_pct_by_minute": [80.0, 50.0],
        "host_speed_by_minute": [1.0, 0.8],
        "host_memory_speed_by_minute": [1.0, 0.8],
        "funded_orders_per_group_by_minute": [20.0, None],
        "funded_live_orders_by_minute": [7, 9],
    }


def test_bench_reads_a_processs_cpu_by_thread_its_io_and_a_thread_it_named() -> None:
    minutes = load_bench(ROOT / "scripts" / "bench_minutes.py")
    started, stop = threading.Event(), threading.Event()

    def busy() -> None:
        name_os_thread("market-writer")
        started.set()
        while not stop.is_set():
            hashlib.sha256(bytes(1 << 16)).digest()

    thread = threading.Thread(target=busy)
    before = minutes.thread_cpu_s(os.getpid())
    thread.start()
    try:
        started.wait()
        assert "market-writer" in minutes.os_thread_names(os.getpid()).values()
        spent = minutes.thread_cpu_s(os.getpid())
        while spent["market-writer"] - before["market-writer"] <= 0.05:  # ticks of 10 ms
            spent = minutes.thread_cpu_s(os.getpid())
    finally:
        stop.set()
        thread.join()
    assert set(spent) == {"event_loop", "market-writer", "other"}
    written, read = minutes.process_io(os.getpid())
    Path(os.devnull).write_bytes(bytes(1 << 20))  # a megabyte written through a system call
    assert minutes.process_io(os.getpid())[0] >= written + (1 << 20)
    assert minutes.process_io(os.getpid())[1] >= read
    canary = minutes.MemoryCanary(table_items=1 << 10, reads=64)
    assert canary.run() == sum(int(place) for place in canary.places)  # item i holds i


def test_a_running_markets_writer_is_named_in_the_system(
    service: MarketService,
) -> None:
    service.writer.call(lambda: None)  # the writer thread has begun: it names itself first
    names = load_bench(ROOT / "scripts" / "bench_minutes.py").os_thread_names(os.getpid())
    assert "market-writer" in names.values()


def test_funded_run_reads_groups_and_live_orders_from_the_markets_own_metrics(
    client: TestClient, service: MarketService, alice: Trader, bob: Trader
) -> None:
    bench = load_bench(ROOT / "scripts" / "bench_minutes.py")
    assert bench.group_figures(client.get("/metrics").text) == (0.0, 0.0, 0.0)
    for body in (alice.bid(START, price=90), bob.bid(START, price=80, device_class="tpu-v4")):
        client.post("/v1/orders", json=body).raise_for_status()
    batch = {"orders": [alice.bid(START, price=70), alice.bid(START, price=60)]}
    client.post("/v1/orders/batch", json=batch).raise_for_status()
    service.expire_orders()  # the job that sets the live-orders gauge in a running market
    assert bench.group_figures(client.get("/metrics").text) == (3.0, 4.0, 4.0)
