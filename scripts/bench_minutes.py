"""What a long benchmark run notes minute by minute: the server's CPU by thread and its I/O,
the host's steal and busy time, and two canaries that time the host's cores and memory.

Used by `scripts/bench_market.py` (the funded run, `MinuteSampler`). A minute whose rate fell
says where from these: more CPU per order in one of the server's threads (the event loop, the
writer), more log written or read per order (its SQLite pages), or a host whose cores or memory
were slower for everyone (the canaries, timed in the sampler's own CPU time, fall with it).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np

from services.threads import os_thread_names

CANARY = bytes(1 << 22)
"""What the sampler hashes once a second to time the host's cores (4 MiB of SHA-256)."""

MEMORY_TABLE_ITEMS = 1 << 25
"""The memory canary's table: 32 Mi 8-byte items (256 MiB), far beyond any core's caches."""

MEMORY_READS = 1 << 17
"""Items the memory canary reads from its table at random places, once a second."""

THREADS = ("event_loop", "market-writer", "other")
"""How the server's CPU is split: its main thread (the event loop), the writer, the rest."""


def process_cpu_s(pid: int) -> float:
    """Return the CPU seconds (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """Return the CPU seconds so far of process `pid`'s threads by `THREADS` role: its main
    thread, the thread it named ``market-writer`` in the system (`services.threads`), and the
    others together (threads that ended are no longer counted)."""
    spent = dict.fromkeys(THREADS, 0.0)
    tick = os.sysconf("SC_CLK_TCK")
    for tid, name in os_thread_names(pid).items():
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        role = "event_loop" if tid == pid else name if name in THREADS else "other"
        spent[role] += (int(fields[11]) + int(fields[12])) / tick
    return spent


def process_io(pid: int) -> tuple[int, int]:
    """Return the bytes process `pid` has written and read through system calls so far (Linux
    ``/proc/<pid>/io``: the log and database pages of its SQLite, whether or not they reached a
    disk)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["wchar"]), int(fields["rchar"])


def host_ticks() -> tuple[int, int, int]:
    """Return the host's CPU ticks so far (Linux /proc/stat): (steal, idle, all). Steal is the
    time a virtual machine's CPUs were ready but given to others; idle counts I/O wait too."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7], fields[3] + fields[4], sum(fields[:8])


def group_figures(metrics: str) -> tuple[float, float, float]:
    """Return, from a market's `/metrics` text, its group commits and the orders they carried so
    far, and its live orders now (every class)."""
    figures = {"count": 0.0, "sum": 0.0, "live": 0.0}
    for line in metrics.splitlines():
        name, _, value = line.rpartition(" ")
        if name == "market_commit_group_orders_count":
            figures["count"] = float(value)
        elif name == "market_commit_group_orders_sum":
            figures["sum"] = float(value)
        elif name.startswith("market_live_orders{"):
            figures["live"] += float(value)
    return figures["count"], figures["sum"], figures["live"]


class MemoryCanary:
    """A fixed piece of work bound by memory latency: sum `MEMORY_READS` items read at random
    places of a `MEMORY_TABLE_ITEMS` table (the places drawn once, so every run reads the same)."""

    def __init__(self, table_items: int = MEMORY_TABLE_ITEMS, reads: int = MEMORY_READS) -> None:
        """Allocate and touch the table (256 MiB by default) in pages of the base size: huge
        pages, which the kernel may assemble in the background, would make the same reads
        faster minutes later for reasons of this process alone."""
        rng = np.random.default_rng(7)
        self._memory = mmap.mmap(-1, table_items * 8)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
            self._memory.madvise(mmap.MADV_NOHUGEPAGE)
        self.table = np.frombuffer(self._memory, dtype=np.int64)
        self.table[:] = np.arange(table_items, dtype=np.int64)
        self.places = rng.integers(0, table_items, size=reads, dtype=np.int64)

    def run(self) -> int:
        """Read the items; return their sum (so the reads cannot be skipped)."""
        return int(self.table[self.places].sum())


class Sample(NamedTuple):
    """The counters noted at one instant: the server's CPU seconds (all, and by thread), the
    bytes it wrote and read, the host's ticks (`host_ticks`), and the market's group commits,
    the orders they carried and its live orders (`group_figures`)."""

    cpu: float
    threads: dict[str, float]
    io: tuple[int, int]
    ticks: tuple[int, int, int]
    groups: tuple[float, float, float]


def sample(pid: int, groups: tuple[float, float, float]) -> Sample:
    """Return the `Sample` of server `pid` now, with `groups` (`OSError` if it has gone)."""
    return Sample(process_cpu_s(pid), thread_cpu_s(pid), process_io(pid), host_ticks(), groups)


class MinuteSampler:
    """Note a `Sample` at the start and at each whole minute of a run; once a second, time the
    two canaries (`CANARY` hashed, `MemoryCanary`) in this thread's own CPU time, so a minute
    whose cores or memory were slower (shared with other machines) shows (a thread; `stop`
    ends it)."""

    def __init__(
        self,
        pid: int,
        started: float,
        url: str | None = None,
        memory: MemoryCanary | None = None,
    ) -> None:
        """Start sampling server `pid` (and its `/metrics` at `url`, if given) from `started`
        (a `time.perf_counter` instant)."""
        self._pid, self._started, self._url = pid, started, url
        self._memory = memory if memory is not None else MemoryCanary()
        self.samples: list[Sample] = [sample(pid, self._groups())]
        self.canary_s: list[float] = []  # each whole minute's mean CPU seconds per canary
        self.memory_s: list[float] = []  # each whole minute's mean CPU seconds per memory canary
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        minute, spent, memory_spent, runs = 1, 0.0, 0.0, 0
        while not self._stop.wait(
            max(0.0, min(1.0, self._started + 60 * minute - time.perf_counter()))
        ):
            if time.perf_counter() >= self._started + 60 * minute:
                with contextlib.suppress(OSError):  # the server has gone: no more samples
                    self.samples.append(sample(self._pid, self._groups()))
                    self.canary_s.append(spent / max(1, runs))
                    self.memory_s.append(memory_spent / max(1, runs))
                minute, spent, memory_spent, runs = minute + 1, 0.0, 0.0, 0
                continue
            began = time.thread_time()
            hashlib.sha256(CANARY).digest()
            hashed = time.thread_time()
            self._memory.run()
            spent += hashed - began
            memory_spent += time.thread_time() - hashed
            runs += 1

    def _groups(self) -> tuple[float, float, float]:
        """Return `group_figures` of the server's `/metrics` (zeros without a URL or answer)."""
        if self._url is None:
            return 0.0, 0.0, 0.0
        try:
            return group_figures(httpx.get(self._url + "/metrics", timeout=10).text)
        except httpx.HTTPError:
            return 0.0, 0.0, 0.0

    def stop(self) -> None:
        """End the thread."""
        self._stop.set()
        self._thread.join()

    def by_minute(self, rates: list[int]) -> dict[str, Any]:
        """Return, for each whole minute sampled (`rates`: orders per second of each minute):
        the server's CPU microseconds per order answered, in all and by thread (`THREADS`); the
        kilobytes it wrote and read per order; the host's steal and busy time in percent of all
        its CPU time; its cores' and its memory's speed against the first minute's (a
        canary's CPU time in the first minute over this minute's: 0.9 is 10% slower); the orders
        per group commit and the live orders at the minute's end."""
        cpu: list[int] = []
        by_thread: dict[str, list[int]] = {name: [] for name in THREADS}
        written: list[float] = []
        read: list[float] = []
        steal: list[float] = []
        busy: list[float] = []
        speed: list[float | None] = []
        memory: list[float | None] = []
        per_group: list[float | None] = []
        live: list[int] = []
        for a, b, canary, memory_canary, rate in zip(
            self.samples, self.samples[1:], self.canary_s, self.memory_s, rates, strict=False
        ):
            orders = max(1, rate * 60)
            cpu.append(round((b.cpu - a.cpu) / orders * 1e6))
            for name in THREADS:
                by_thread[name].append(round((b.threads[name] - a.threads[name]) / orders * 1e6))
            written.append(round((b.io[0] - a.io[0]) / orders / 1e3, 1))
            read.append(round((b.io[1] - a.io[1]) / orders / 1e3, 1))
            ticks = max(1, b.ticks[2] - a.ticks[2])
            steal.append(round(100 * (b.ticks[0] - a.ticks[0]) / ticks, 1))
            busy.append(round(100 * (ticks - (b.ticks[1] - a.ticks[1])) / ticks, 1))
            speed.append(round(self.canary_s[0] / canary, 3) if canary else None)
            memory.append(round(self.memory_s[0] / memory_canary, 3) if memory_canary else None)
            (g0, o0, _), (g1, o1, l1) = a.groups, b.groups
            per_group.append(round((o1 - o0) / (g1 - g0), 1) if g1 > g0 else None)
            live.append(round(l1))
        return {
            "funded_server_cpu_us_by_minute": cpu,
            "funded_server_cpu_us_by_thread_by_minute": by_thread,
            "funded_server_written_kb_per_order_by_minute": written,
            "funded_server_read_kb_per_order_by_minute": read,
            "host_steal_pct_by_minute": steal,
            "host_busy_pct_by_minute": busy,
            "host_speed_by_minute": speed,
            "host_memory_speed_by_minute": memory,
            "funded_orders_per_group_by_minute": per_group,
            "funded_live_orders_by_minute": live,
        }
