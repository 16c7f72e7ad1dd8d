"""A real market server in a subprocess (`python -m market.cli market serve`) for tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from contracts.chain import free_port
from tests import processes

from .signing import CHAIN_ID, ESCROW

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def market_server(data_dir: Path, *extra: str) -> Iterator[str]:
    """Start the market on a free port; yield its base URL; stop it by PID."""
    with market_process(data_dir, *extra) as (url, _):
        yield url


def peak_rss_mb(pid: int) -> float:
    """Return a process's peak resident memory so far (`VmHWM`), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


@contextmanager
def market_process(data_dir: Path, *extra: str) -> Iterator[tuple[str, int]]:
    """Start the market on a free port; yield its base URL and PID; stop it by PID."""
    port = free_port()
    log = (data_dir.parent / f"server-{port}.log").open("wb")
    process = processes.spawn(
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
            ESCROW,
            "--chain-id",
            str(CHAIN_ID),
            *extra,
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "DATABASE_URL": ""},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"market exited: {Path(log.name).read_text()[-2000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("market did not start within 30 s")
            time.sleep(0.05)  # readiness poll of an external process
        yield url, process.pid
    finally:
        processes.stop(process, grace_s=10)
        log.close()
