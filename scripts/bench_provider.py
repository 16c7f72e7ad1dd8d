"""Provider daemon overhead and compile-cache benchmark; the last line printed is one JSON object.

1. A small MLP inference called directly through ``jax.jit`` (input in, numpy output back)
   versus the same program submitted through the daemon's HTTP API: the client signs the
   ``TaskRequest``, the daemon (a separate process started by its CLI, as an operator runs it)
   verifies the signature against the deal's client, checks the envelope's hashes, journals and
   signs the ack, runs the task in its sandbox worker, signs and journals the chained receipt,
   and answers (``POST /v1/tasks?wait=``, one round trip); the client then verifies the
   receipt's signature and output hash. ``daemon_task_ms`` is the median of sequential tasks;
   ``tasks_per_s`` is the throughput of several concurrent clients with pre-signed requests.
2. A transformer block compiled in a fresh sandbox worker with an empty persistent cache
   (``cold_compile_ms``), then in a new worker reading that cache (``warm_compile_ms``).

Usage: scripts/bench-provider [--tasks N] [--throughput-tasks N] [--clients N]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import coincurve  # noqa: E402
import httpx  # noqa: E402
import numpy as np  # noqa: E402

from contracts.binding import Chain  # noqa: E402
from contracts.chain import Anvil, free_port  # noqa: E402
from contracts.messages import (  # noqa: E402
    KIND_INFERENCE,
    Plan,
    Quote,
    Receipt,
    TaskRequest,
    address_of,
    verify,
)
from contracts.program import ProgramEnvelope, encode_envelope  # noqa: E402

PLAN = Plan(compile_price=10, inference_price=1)
SLO_MS = 60_000
# A request's deadline (protocol v2: the client sets it): now + the SLO + 2 s of slack. The
# throughput run signs its requests before it starts, so they carry this much more.
PRESIGNED_SLACK_S = 600


def _mlp_program() -> tuple[ProgramEnvelope, Any, list[Any]]:
    from tests.provider.programs import envelope_for, export_fn, mlp, mlp_params, spec

    rng = np.random.default_rng(0)
    params = mlp_params(rng, 16, 32, 4)
    x = rng.standard_normal((1, 16), dtype=np.float32)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec(1, 16))
    envelope = envelope_for(exported, [*params, x], weights=dict(enumerate(params)))
    return envelope, mlp, [*params, x]


def raw_call_ms(fn: Any, args: list[Any], calls: int) -> float:
    """Median ms of one jitted call, numpy input to numpy output."""
    import jax

    jitted = jax.jit(fn)
    for _ in range(20):
        np.asarray(jitted(*args))
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        np.asarray(jitted(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def open_deal(chain: Chain, escrow_address: str, keys: list[str], token_address: str) -> int:
    escrow = chain.escrow(escrow_address)
    token = chain.token(token_address)
    deployer, provider, client = keys[0], keys[1], keys[2]
    for key in (provider, client):
        token.mint(deployer, address_of(key), 10**15)
        token.approve(key, escrow.address, 2**256 - 1)
    now = int(chain.w3.eth.get_block("latest")["timestamp"])
    quote = Quote(
        provider=address_of(provider),
        client=address_of(client),
        arbiter=address_of(keys[3]),
        max_spend=10**12,
        stake=10**6,
        penalty=1,
        duration=86_400,
        challenge_window=120,  # settled with room to spare by a daemon's default jobs
        slo_ms=SLO_MS,
        valid_until=now + 600,
        nonce=1,
        plan=PLAN,
    )
    escrow.deposit(client, 10**12)
    escrow.stake(provider, quote.stake)
    result = escrow.open_deal(client, quote, quote.sign(escrow.domain, provider), 10**12)
    return int(result.event("DealOpened").args["dealId"])


def start_daemon(
    anvil: Anvil, escrow: str, provider_key: str, data: Path, workers: int
) -> tuple[Any, str]:
    port = free_port()
    config = data / "provider.toml"
    config.write_text(
        f'rpc_url = "{anvil.url}"\nescrow = "{escrow}"\ndata_dir = "{data / "state"}"\n'
        f'jax_platforms = "cpu"\nslo_ms = {SLO_MS}\nbenchmark_on_start = false\n'
        f"pool_size = {workers}\n"
        f'log_level = "WARNING"\n[plan]\ncompile_price = {PLAN.compile_price}\n'
        f"inference_price = {PLAN.inference_price}\n"
    )
    env = dict(os.environ, TPUMARKET_PROVIDER_PRIVATE_KEY=provider_key)
    log = (data / "daemon.log").open("wb")
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "provider.cli", "run", "--config", str(config)),
            *("--port", str(port), "--no-jobs"),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # readiness poll of a child process
        if process.poll() is not None:
            raise SystemExit(f"daemon exited: {(data / 'daemon.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("daemon did not come up")


class Submitter:
    """Signs and submits tasks of one deal; verifies what comes back."""

    def __init__(self, url: str, chain: Chain, escrow: str, client_key: str, provider: str) -> None:
        self.url = url
        self.domain = chain.escrow(escrow).domain
        self.signer = coincurve.PrivateKey(bytes.fromhex(client_key.removeprefix("0x")))
        self.provider = provider
        self.index = 0
        self.lock = threading.Lock()

    def next_index(self) -> int:
        with self.lock:
            self.index += 1
            return self.index - 1

    def sign(
        self, deal_id: int, envelope: ProgramEnvelope, index: int, slack_s: int = 0
    ) -> dict[str, str]:
        request = TaskRequest(
            deal_id=deal_id,
            task_index=index,
            kind=KIND_INFERENCE,
            program_hash=envelope.program_sha256,
            input_hash=envelope.inputs_sha256,
            max_price=1_000,
            deadline=int(time.time()) + -(-SLO_MS // 1000) + 2 + slack_s,
        )
        raw = self.signer.sign_recoverable(request.digest(self.domain), hasher=None)
        signature = raw[:64] + bytes([raw[64] + 27])  # r||s||v, as TaskRequest.sign
        return {
            "X-Tpumarket-Request": json.dumps(request.to_json(), separators=(",", ":")),
            "X-Tpumarket-Signature": "0x" + signature.hex(),
            "Content-Type": "application/octet-stream",
        }

    def connect(self) -> http.client.HTTPConnection:
        """Open a keep-alive connection (stdlib: a lean client, so the figures are the
        daemon's, not an HTTP library's)."""
        parsed = urllib.parse.urlsplit(self.url)
        return http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=60)

    def run(self, conn: http.client.HTTPConnection, headers: dict[str, str], body: bytes) -> None:
        """Submit one task, wait for its result, verify the receipt and the outputs."""
        conn.request("POST", "/v1/tasks?wait=30", body=body, headers=headers)
        reply = conn.getresponse()
        raw = reply.read()
        data = json.loads(raw)
        if reply.status != 200 or data["state"] != "succeeded":
            raise SystemExit(f"task failed: {reply.status} {raw[:500]!r}")
        receipt = Receipt.from_json(data["receipt"])
        verify(receipt, self.domain, bytes.fromhex(data["receipt_signature"][2:]), self.provider)
        if hashlib.sha256(base64.b64decode(data["outputs_b64"])).digest() != receipt.output_hash:
            raise SystemExit("output hash mismatch")


def cpu_s(pid: int) -> float:
    """Return user + system CPU seconds of one process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """Return every descendant pid of a process (the daemon's sandbox workers, whichever of
    its threads spawned them, and what they spawned)."""
    found: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids = [int(c) for c in path.read_text().split()]
        except OSError:
            continue
        for kid in kids:
            found += [kid, *children(kid)]
    return found


def daemon_task_ms(sub: Submitter, deal_id: int, envelope: ProgramEnvelope, tasks: int) -> float:
    body = encode_envelope(envelope)
    samples = []
    conn = sub.connect()
    try:
        for i in range(tasks + 20):
            start = time.perf_counter()
            sub.run(conn, sub.sign(deal_id, envelope, sub.next_index()), body)
            if i >= 20:
                samples.append(time.perf_counter() - start)
    finally:
        conn.close()
    return statistics.median(samples) * 1000


def tasks_per_s(
    sub: Submitter, deal_id: int, envelope: ProgramEnvelope, tasks: int, clients: int
) -> float:
    body = encode_envelope(envelope)
    signed = [
        sub.sign(deal_id, envelope, sub.next_index(), PRESIGNED_SLACK_S) for _ in range(tasks)
    ]
    chunks = [signed[i::clients] for i in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def work(chunk: list[dict[str, str]]) -> None:
        conn = sub.connect()
        try:
            barrier.wait()
            for headers in chunk:
                sub.run(conn, headers, body)
        finally:
            conn.close()

    threads = [threading.Thread(target=work, args=(c,)) for c in chunks]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return tasks / (time.perf_counter() - start)


def compile_cold_warm_ms() -> tuple[float, float]:
    from provider.sandbox import Sandbox, SandboxLimits
    from tests.provider.programs import (
        envelope_for,
        export_fn,
        spec,
        transformer_block,
        transformer_params,
    )

    params = transformer_params(np.random.default_rng(0), d=64)
    x = np.zeros((4, 64, 64), np.float32)
    exported = export_fn(transformer_block, *(spec(*p.shape) for p in params), spec(4, 64, 64))
    envelope = encode_envelope(envelope_for(exported, [*params, x]))
    times = []
    with tempfile.TemporaryDirectory() as cache:
        for _ in ("cold", "warm"):
            with Sandbox(1, SandboxLimits(), Path(cache), jax_platforms="cpu") as box:
                result = box.compile(envelope, "local")
                compile_time = getattr(result, "compile_time_s", None)
                if compile_time is None:
                    raise SystemExit(f"compile failed: {result}")
                times.append(compile_time * 1000)
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300, help="sequential tasks timed")
    parser.add_argument("--throughput-tasks", type=int, default=1500)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers of the daemon")
    args = parser.parse_args()

    envelope, fn, call_args = _mlp_program()
    raw = raw_call_ms(fn, call_args, 2000)
    cold, warm = compile_cold_warm_ms()
    with Anvil.start(accounts=5) as anvil, tempfile.TemporaryDirectory() as tmp:
        chain = Chain(anvil.url)
        deployment = chain.deploy(anvil.keys[0])
        deal_id = open_deal(chain, deployment.escrow, anvil.keys, deployment.token)
        process, url = start_daemon(
            anvil, deployment.escrow, anvil.keys[1], Path(tmp), args.workers
        )
        try:
            sub = Submitter(url, chain, deployment.escrow, anvil.keys[2], address_of(anvil.keys[1]))
            kids = children(process.pid)
            before = (cpu_s(process.pid), sum(cpu_s(k) for k in kids), time.process_time())
            task_ms = daemon_task_ms(sub, deal_id, envelope, args.tasks)
            after = (cpu_s(process.pid), sum(cpu_s(k) for k in kids), time.process_time())
            per_task = [
                (a - b) * 1000 / (args.tasks + 20) for a, b in zip(after, before, strict=True)
            ]
            throughput = tasks_per_s(sub, deal_id, envelope, args.throughput_tasks, args.clients)
        finally:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(60)
    overhead = task_ms - raw
    figures = {
        "raw_call_ms": round(raw, 4),
        "daemon_task_ms": round(task_ms, 3),
        "overhead_ms": round(overhead, 3),
        "overhead_pct": round(100 * overhead / raw, 1),
        "tasks_per_s": round(throughput, 1),
        "cold_compile_ms": round(cold, 1),
        "warm_compile_ms": round(warm, 1),
    }
    print(
        f"CPU per sequential task: daemon {per_task[0]:.2f} ms, sandbox worker "
        f"{per_task[1]:.2f} ms, client (sign, HTTP, verify) {per_task[2]:.2f} ms; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"MLP 16-32-4, batch 1: jit {raw:.3f} ms, via daemon {task_ms:.3f} ms "
        f"(+{overhead:.3f} ms), {throughput:.0f} tasks/s with {args.clients} clients; "
        f"transformer block compile cold {cold:.0f} ms, warm {warm:.0f} ms"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
