"""The processes the demo starts: the market and the two provider daemons, by module name."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from client.demo.errors import DemoError
from client.demo.terms import (
    REDEEM_THRESHOLD,
    SETTLEMENT_INTERVAL_S,
    TX_ALLOWANCE_S,
    ProviderProfile,
)
from contracts.chain import free_port
from services.lifetime import dies_with_parent


class Processes:
    """Subprocesses started by the demo; `stop_all` stops each by PID, newest first."""

    def __init__(self, log_dir: Path) -> None:
        """Keep each process's output in ``<log_dir>/<name>.log``."""
        self.log_dir = log_dir
        self._running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> Path:
        """Start ``python -m ...`` (``args``) with its output in ``<log_dir>/<name>.log``."""
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                dies_with_parent([sys.executable, *args]),  # even if the demo is SIGKILLed
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # Ctrl-C reaches the demo only; it stops them itself
            )
        self._running.append((name, process))
        return log_path

    def check(self, name: str) -> None:
        """Raise if the process ``name`` has exited."""
        for known, process in self._running:
            if known == name and process.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise DemoError(f"{name} exited with {process.returncode}:\n{tail}")

    def wait_http(self, name: str, url: str, timeout_s: float) -> None:
        """Wait until ``url`` answers 200, failing at once if the process ``name`` exited."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check(name)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise DemoError(f"{name} did not answer {url} within {timeout_s:.0f} s")
            time.sleep(0.2)  # readiness poll of an external process

    def stop_all(self) -> None:
        """SIGTERM each process by PID (SIGKILL after 10 s), newest first."""
        for _, process in reversed(self._running):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        for _, process in reversed(self._running):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait()
        self._running.clear()


def start_market(processes: Processes, work: Path, rpc_url: str, escrow: str, chain_id: int) -> str:
    """Start the market (SQLite in ``work``, with its chain indexer); return its URL."""
    port = free_port()
    flags = {
        "--port": str(port),
        "--data-dir": str(work / "market"),
        "--rpc-url": rpc_url,
        "--escrow": escrow,
        "--chain-id": str(chain_id),
    }
    processes.start(
        "market",
        ["-m", "market.cli", "market", "serve", *(x for pair in flags.items() for x in pair)],
        env={"DATABASE_URL": ""},  # SQLite in the data dir
    )
    return f"http://127.0.0.1:{port}"


def start_provider(
    processes: Processes,
    profile: ProviderProfile,
    key: str,
    work: Path,
    *,
    rpc_url: str,
    escrow: str,
    market_url: str,
) -> str:
    """Write the provider's config and start its daemon with ``key``; return its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    plan = "\n".join(f"{k} = {_toml(v)}" for k, v in profile.plan.to_json().items())
    # Settlement: redeem a deal's latest voucher when a task it pays is due or at the close
    # (not for its amount: one redemption per deal), run the jobs every second (a deal's window
    # must cover half of it plus one transaction), close a deal within a pass or two of the
    # client's agreement (the demo waits for it).
    text = f"""# provider {profile.name}: {profile.note}
rpc_url = "{rpc_url}"
escrow = "{escrow}"
data_dir = "{work / profile.name}"
market_url = "{market_url}"
public_url = "{url}"
host = "127.0.0.1"
port = {port}
pool_size = 1
slo_ms = {profile.slo_ms}
jax_platforms = "cpu"
benchmark_on_start = false
heartbeat_interval_s = 5
log_level = "WARNING"

[plan]
{plan}

[settlement]
redeem_threshold = {REDEEM_THRESHOLD}
interval_s = {SETTLEMENT_INTERVAL_S}
tx_allowance_s = {TX_ALLOWANCE_S}
"""
    config = work / f"{profile.name}.toml"
    config.write_text(text)
    processes.start(
        profile.name,
        ["-m", "provider.cli", "run", "--config", str(config)],
        env={"TPUMARKET_PROVIDER_PRIVATE_KEY": key, "JAX_PLATFORMS": "cpu"},
    )
    return url


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
