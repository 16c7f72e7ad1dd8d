"""Real processes for the client's job tests: anvil, provider daemons, and `tpumarket job`.

The chain and the daemons come from `tests.e2e.stack` (anvil, ``python -m provider.cli run``);
the client runs as ``python -m client.cli job ...`` so that it can be killed with SIGKILL or
interrupted with SIGINT like a user's terminal would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.ledger import DealLedger
from client.ledger_records import TaskRecord
from contracts.access import ACCESS_EXPIRY_HEADER, ACCESS_SIGNATURE_HEADER, result_access_digest
from contracts.messages import sign_digest
from programs.envelope import encode_arrays, encode_envelope
from tests import processes
from tests.e2e.stack import ROOT, Provider, Stack, spin_inputs, spin_model, wait_until

STEPS_SLOW = 50_000_000  # about 1 s of device time on this CPU: a task still in flight


@dataclass
class JobFiles:
    """A program file and inputs files of the spin model, by name."""

    program: Path
    inputs: dict[str, Path]


def write_files(folder: Path, steps: dict[str, int]) -> JobFiles:
    """Write the spin program and one inputs file per name (each its own loop length)."""
    model = spin_model()
    program = folder / "spin.tpmp"
    program.write_bytes(encode_envelope(model.example_envelope()))
    inputs = {}
    for seed, (name, count) in enumerate(sorted(steps.items())):
        path = folder / f"{name}.safetensors"
        path.write_bytes(encode_arrays(spin_inputs(model, count, seed)))
        inputs[name] = path
    return JobFiles(program, inputs)


def job_env(st: Stack, state: Path) -> dict[str, str]:
    """Return the environment a client's `tpumarket job` runs with."""
    return {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "TPUMARKET_RPC_URL": st.rpc_url,
        "TPUMARKET_ESCROW": st.escrow.address,
        "TPUMARKET_CLIENT_KEY": st.client,
        "TPUMARKET_CLIENT_STATE": str(state),
    }


def run_args(deal_id: int, provider: Provider, files: JobFiles, *names: str) -> list[str]:
    """Return `job run` arguments for the named inputs files."""
    args = ["run", "--deal", str(deal_id), "--provider-url", provider.url]
    args += ["--program", str(files.program), "--inputs"]
    return args + [str(files.inputs[n]) for n in names]


def job(st: Stack, state: Path, *args: str, expect: int = 0) -> tuple[dict[str, Any], str]:
    """Run `tpumarket job ... --json` to its end; return its JSON line and its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "client.cli", "job", *args, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=job_env(st, state),
    )
    assert done.returncode == expect, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines else {}), done.stderr


class JobProcess:
    """A `tpumarket job ...` started in the background, to be killed or interrupted."""

    def __init__(self, st: Stack, state: Path, *args: str) -> None:
        self.popen = processes.spawn(
            [sys.executable, "-m", "client.cli", "job", *args, "--json"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=job_env(st, state),
        )
        self.err_lines: list[str] = []

    def wait_stderr(self, text: str) -> None:
        """Read the client's stderr until a line contains ``text`` (it said so: in order)."""
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.err_lines.append(line)
            if text in line:
                return
        raise AssertionError(f"the client ended without saying {text!r}: {self.err_lines}")

    def kill9(self) -> None:
        """SIGKILL the client: no handler, no cleanup."""
        os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)

    def interrupt(self) -> None:
        """Send one SIGINT, as one Ctrl-C in a terminal does."""
        os.kill(self.popen.pid, signal.SIGINT)

    def finish(self, expect: int = 0, timeout_s: float = 300) -> tuple[dict[str, Any], str]:
        """Wait for the end; return the JSON line and stderr."""
        out, err = self.popen.communicate(timeout=timeout_s)
        err = "".join(self.err_lines) + err
        assert self.popen.returncode == expect, out[-3000:] + err[-3000:]
        lines = out.strip().splitlines()
        return (json.loads(lines[-1]) if lines else {}), err

    def stop(self) -> None:
        """Make sure the process is gone (test cleanup)."""
        processes.kill(self.popen)


def ledger_of(st: Stack, state: Path, deal_id: int) -> DealLedger:
    """Read a deal's ledger without taking its lock (as another process writes it)."""
    return DealLedger.open(state, st.escrow.domain.chain_id, st.escrow.address, deal_id, lock=False)


def wait_ledger(
    st: Stack,
    state: Path,
    deal_id: int,
    predicate: Callable[[dict[int, TaskRecord]], bool],
    what: str,
    timeout_s: float = 120,
    client: JobProcess | None = None,
) -> dict[int, TaskRecord]:
    """Poll the client's ledger file (another process's state) until ``predicate`` holds.

    Fail at once, with its output, if the ``client`` process ended first.
    """
    found: dict[int, dict[int, TaskRecord]] = {}

    def check() -> bool:
        if client is not None and client.popen.poll() is not None:
            out, err = client.popen.communicate()
            raise AssertionError(f"the client ended first ({client.popen.returncode}): {out}{err}")
        if not DealLedger.file_for(
            state, st.escrow.domain.chain_id, st.escrow.address, deal_id
        ).exists():
            return False
        found[0] = ledger_of(st, state, deal_id).tasks
        return predicate(found[0])

    wait_until(check, timeout_s, what)
    return found[0]


DEAL_SCOPE = 2**256 - 1
"""The task index an access proof for a whole deal signs (the daemon's deal summary)."""


def provider_deal(st: Stack, provider: Provider, deal_id: int) -> dict[str, Any] | None:
    """Return the daemon's summary of a deal (``GET /v1/deals/{id}``: what its journal holds),
    asked as the deal's client; None if the journal has no such deal."""
    import time

    import httpx

    expiry = int(time.time()) + 60
    digest = result_access_digest(st.escrow.domain, deal_id, DEAL_SCOPE, expiry)
    headers = {
        ACCESS_EXPIRY_HEADER: str(expiry),
        ACCESS_SIGNATURE_HEADER: "0x" + sign_digest(digest, st.client).hex(),
    }
    reply = httpx.get(f"{provider.url}/v1/deals/{deal_id}", headers=headers, timeout=10)
    if reply.status_code == 404:
        return None
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def acked_by_provider(st: Stack, provider: Provider, deal_id: int) -> int:
    """Return how many tasks of the deal the daemon's journal holds (0 if none)."""
    summary = provider_deal(st, provider, deal_id)
    return 0 if summary is None else int(summary["acked"])


def delivered_by_provider(st: Stack, provider: Provider, deal_id: int) -> int:
    """Return how many tasks of the deal the daemon delivered (0 if none)."""
    summary = provider_deal(st, provider, deal_id)
    return 0 if summary is None else int(summary["delivered"])
