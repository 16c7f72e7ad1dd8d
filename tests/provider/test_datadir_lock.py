"""One daemon per data dir: a second one refuses at start, naming the first one's PID.

Two daemons on one data dir would sign two receipt chains for the same deals (a forked chain
the journal then refuses to open). The daemons here are real processes started through the
CLI, the way an operator starts them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contracts.chain import free_port
from provider.daemon import DataDirLock, DataDirLockedError
from tests import processes
from tests.provider.daemon_support import LEAN_SANDBOX_TOML, PLAN, SLO_S, ChainWorld, wait_until

REPO = Path(__file__).resolve().parents[2]


class Processes:
    """Daemon processes of one test, all stopped at its end."""

    def __init__(self, world: ChainWorld, config: Path, logs: Path) -> None:
        self.world = world
        self.config = config
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def spawn(self, port: int) -> subprocess.Popen[bytes]:
        env = dict(os.environ, TPUMARKET_PROVIDER_PRIVATE_KEY=self.world.provider)
        env["JAX_PLATFORMS"] = "cpu"
        log = self.logs / f"daemon-{len(self.started)}.log"
        with log.open("wb") as out:
            process = processes.spawn(
                [
                    *(sys.executable, "-m", "provider.cli", "run", "--no-jobs"),
                    *("--config", str(self.config), "--port", str(port)),
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        self.started.append(process)
        return process

    def serve(self) -> subprocess.Popen[bytes]:
        """Start a daemon and wait until it answers its health check."""
        port = free_port()
        process = self.spawn(port)

        def healthy() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"daemon exited: {self.log_of(process)[-3000:]}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).is_success
            except httpx.HTTPError:
                return False

        wait_until(healthy, 120, "daemon health")
        return process

    def log_of(self, process: subprocess.Popen[bytes]) -> str:
        return (self.logs / f"daemon-{self.started.index(process)}.log").read_text()

    def stop_all(self) -> None:
        for process in self.started:
            processes.stop(process, grace_s=60)


@pytest.fixture
def daemons(chain_world: ChainWorld, tmp_path: Path) -> Iterator[Processes]:
    config = tmp_path / "provider.toml"
    config.write_text(
        f'rpc_url = "{chain_world.anvil.url}"\n'
        f'escrow = "{chain_world.escrow.address}"\n'
        f'data_dir = "{tmp_path / "data"}"\n'
        'jax_platforms = "cpu"\n'
        f"slo_ms = {SLO_S * 1000}\n"
        "benchmark_on_start = false\n"
        f"{LEAN_SANDBOX_TOML}"
        "[plan]\n"
        f"compile_price = {PLAN.compile_price}\n"
        f"inference_price = {PLAN.inference_price}\n"
    )
    processes = Processes(chain_world, config, tmp_path)
    try:
        yield processes
    finally:
        processes.stop_all()


def test_second_daemon_on_one_data_dir_then_refused_naming_the_first_and_kill9_frees_it(
    daemons: Processes,
) -> None:
    first = daemons.serve()

    second = daemons.spawn(free_port())
    assert second.wait(120) == 1
    lines = daemons.log_of(second).strip().splitlines()
    refusal = [line for line in lines if line.startswith("error:")]
    assert refusal == [
        f"error: data dir {daemons.config.parent / 'data'} is in use by another provider "
        f"daemon (pid {first.pid}); stop it first, or give this daemon its own data_dir"
    ]
    assert not any("Traceback" in line for line in lines)
    assert first.poll() is None  # the holder serves on, untouched

    os.kill(first.pid, signal.SIGKILL)
    first.wait(30)
    third = daemons.serve()  # the kernel dropped the dead holder's lock
    assert (daemons.config.parent / "data" / "daemon.lock").read_text().strip() == str(third.pid)


def test_lock_when_held_in_this_process_then_a_second_refused_until_released(
    tmp_path: Path,
) -> None:
    held = DataDirLock(tmp_path)
    with pytest.raises(DataDirLockedError, match=f"pid {os.getpid()}"):
        DataDirLock(tmp_path)
    held.release()
    held.release()  # idempotent
    again = DataDirLock(tmp_path)
    again.release()
