"""Provider daemon overhead and compile-cache benchmark; the last line printed is one JSON object.

1. A small MLP inference called directly through ``jax.jit`` (input in, numpy output back)
   versus the same program submitted through the daemon's HTTP API: the client signs the
   ``TaskRequest``, the daemon (a separate process started by its CLI, as an operator runs it)
   verifies the signature against the deal's client, checks the envelope's hashes, journals and
   signs the ack, runs the task in its sandbox worker, signs and journals the chained receipt,
   and answers (``POST /v1/tasks?wait=``, one round trip); the client then verifies the
   receipt's signature and output hash. ``daemon_task_ms`` is the median of sequential tasks;
   ``tasks_per_s`` is the throughput of several concurrent clients with pre-signed requests.
   Timing starts once the daemon's process tree is idle (its spare validator imports JAX in
   the background after the health check answers): the figures are the steady state's.
2. A transformer block compiled in a fresh sandbox worker with an empty persistent cache
   (``cold_compile_ms``), then in a new worker reading that cache (``warm_compile_ms``).

3. ``output_rss_growth_mb``: the growth of the daemon's and its workers' resident memory over
   ``--rss-tasks`` (200) tasks that each return 20 MB, measured after as many warm-up tasks as
   fill the daemon's output memory budget (target <= 64).
4. ``stall_ratio_after_malformed``: an honest (warm) task's latency right after 2 malformed
   programs (garbage StableHLO bytecode, acked and diagnosed) over its latency alone, the
   median of ``--stall-rounds`` (7) interleaved rounds, no pause between them (target <= 2.0).
5. ``cache_cross_reads``: client A compiles a program in a fresh sandbox; client B compiles
   the same program in a new one over the same store: B's cache hits from A's entries plus
   the store's count of entries offered across clients (target 0).
6. ``honest_p50_ratio_under_attack``: an honest client's median latency of sequential warm
   tasks while an attacker (a second deal) keeps ``--attack-queued`` (6) of the worst valid
   programs it can build acked and queued ahead (endless while loops, killed at their
   deadline; heavy compiles) over the same median alone (target <= 3).

7. ``disk_growth_mb_per_1k_settled_tasks``: the growth of the daemon's data dir over
   ``--disk-tasks`` (1,000) tasks of 256 KiB outputs each, vouched every 50 tasks, redeemed by
   the daemon's own settlement jobs and pruned from its journal, measured after 100 warm-up
   tasks settled the same way, per 1,000 tasks (target <= 50).
8. ``worker_escapes``: the in-sandbox attacker's attempts (code run inside a real worker)
   that reached anything outside (``tests.provider.sandbox_attacker``; target 0).

Usage: scripts/bench-provider [--tasks N] [--throughput-tasks N] [--clients N] [--rss-tasks N]
       [--stall-rounds N] [--stall-only] [--attack-only] [--attack-tasks N]
       [--storage-only] [--disk-tasks N]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import http.client
import json
import os
import signal
import sqlite3
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

from contracts.access import ACCESS_TOKEN_HEADER  # noqa: E402
from contracts.binding import Chain  # noqa: E402
from contracts.chain import Anvil, free_port  # noqa: E402
from contracts.messages import (  # noqa: E402
    KIND_COMPILE,
    KIND_INFERENCE,
    Plan,
    Quote,
    Receipt,
    TaskRequest,
    Voucher,
    address_of,
    task_bitmap,
    verify,
)
from programs.envelope import (  # noqa: E402
    ProgramEnvelope,
    encode_envelope,
    request_input_hash,
)

PLAN = Plan(compile_price=10, inference_price=1)
SLO_MS = 60_000
# A request's deadline (protocol v2: the client sets it): now + the SLO + 2 s of slack. The
# throughput run signs its requests before it starts, so they carry this much more.
PRESIGNED_SLACK_S = 600


def mlp_program() -> tuple[ProgramEnvelope, Any, list[Any]]:
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


def open_deal(
    chain: Chain,
    escrow_address: str,
    keys: list[str],
    token_address: str,
    client_index: int = 2,
    nonce: int = 1,
) -> int:
    escrow = chain.escrow(escrow_address)
    token = chain.token(token_address)
    deployer, provider, client = keys[0], keys[1], keys[client_index]
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
        nonce=nonce,
        plan=PLAN,
    )
    escrow.deposit(client, 10**12)
    escrow.stake(provider, quote.stake)
    result = escrow.open_deal(client, quote, quote.sign(escrow.domain, provider), 10**12)
    return int(result.event("DealOpened").args["dealId"])


def start_daemon(
    anvil: Anvil,
    escrow: str,
    provider_key: str,
    data: Path,
    workers: int,
    platforms: str = "cpu",
    *,
    jobs: bool = False,
    sections: str = "",
) -> tuple[Any, str]:
    """Start the daemon by its CLI, its workers on ``platforms``; return it and its URL.

    ``jobs`` runs its settlement jobs (off: ``--no-jobs``); ``sections`` are TOML tables
    appended to its config."""
    port = free_port()
    config = data / "provider.toml"
    config.write_text(
        f'rpc_url = "{anvil.url}"\nescrow = "{escrow}"\ndata_dir = "{data / "state"}"\n'
        f'jax_platforms = "{platforms}"\nslo_ms = {SLO_MS}\nbenchmark_on_start = false\n'
        f"pool_size = {workers}\n"
        f'log_level = "WARNING"\n[plan]\ncompile_price = {PLAN.compile_price}\n'
        f"inference_price = {PLAN.inference_price}\n{sections}"
    )
    env = dict(os.environ, TPUMARKET_PROVIDER_PRIVATE_KEY=provider_key)
    log = (data / "daemon.log").open("wb")
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "provider.cli", "run", "--config", str(config)),
            *("--port", str(port)),
            *(() if jobs else ("--no-jobs",)),
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
        self,
        deal_id: int,
        envelope: ProgramEnvelope,
        index: int,
        slack_s: int = 0,
        target: str | None = None,
    ) -> dict[str, str]:
        """Sign an inference task, or a compile task for ``target``; return its headers."""
        request = TaskRequest(
            deal_id=deal_id,
            task_index=index,
            kind=KIND_INFERENCE if target is None else KIND_COMPILE,
            program_hash=envelope.program_sha256,
            input_hash=request_input_hash(
                KIND_INFERENCE if target is None else KIND_COMPILE, envelope, target
            ),
            max_price=1_000,
            deadline=int(time.time()) + -(-SLO_MS // 1000) + 2 + slack_s,
        )
        raw = self.signer.sign_recoverable(request.digest(self.domain), hasher=None)
        signature = raw[:64] + bytes([raw[64] + 27])  # r||s||v, as TaskRequest.sign
        headers = {
            "X-Tpumarket-Request": json.dumps(request.to_json(), separators=(",", ":")),
            "X-Tpumarket-Signature": "0x" + signature.hex(),
            "Content-Type": "application/octet-stream",
        }
        if target is not None:
            headers["X-Tpumarket-Target"] = target
        return headers

    def connect(self) -> http.client.HTTPConnection:
        """Open a keep-alive connection (stdlib: a lean client, so the figures are the
        daemon's, not an HTTP library's)."""
        parsed = urllib.parse.urlsplit(self.url)
        return http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=60)

    def submit(
        self,
        conn: http.client.HTTPConnection,
        headers: dict[str, str],
        body: bytes,
        wait_s: int = 60,
    ) -> tuple[int, dict[str, Any]]:
        """Submit one task and wait for its answer (``wait_s`` 0: the ack alone)."""
        conn.request("POST", f"/v1/tasks?wait={wait_s}", body=body, headers=headers)
        reply = conn.getresponse()
        raw = reply.read()
        return reply.status, json.loads(raw)

    def run(self, conn: http.client.HTTPConnection, headers: dict[str, str], body: bytes) -> None:
        """Submit one task, wait for its result, verify the receipt and the outputs."""
        status, data = self.submit(conn, headers, body)
        if status != 200 or data["state"] != "succeeded":
            raise SystemExit(f"task failed: {status} {json.dumps(data)[:500]}")
        receipt = Receipt.from_json(data["receipt"])
        verify(receipt, self.domain, bytes.fromhex(data["receipt_signature"][2:]), self.provider)
        if data["outputs_b64"] is not None:
            outputs = base64.b64decode(data["outputs_b64"])
        else:  # over the inline cap: read the raw bytes with the deal's access token
            path = f"/v1/tasks/{receipt.deal_id}/{receipt.task_index}/outputs"
            conn.request("GET", path, headers={ACCESS_TOKEN_HEADER: data["access_token"]})
            fetched = conn.getresponse()
            outputs = fetched.read()
            if fetched.status != 200:
                raise SystemExit(f"outputs not served: {fetched.status} {outputs[:300]!r}")
        if hashlib.sha256(outputs).digest() != receipt.output_hash:
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


def tree_cpu_s(pid: int) -> float:
    """Return the CPU seconds of a process and every live descendant."""
    total = 0.0
    for each in (pid, *children(pid)):
        with contextlib.suppress(OSError):  # exited between the listing and the read
            total += cpu_s(each)
    return total


def settle(pid: int, timeout_s: float = 180.0, window_s: float = 1.0) -> float:
    """Wait until the daemon's process tree is idle; return the seconds waited.

    The daemon answers its health check once its executing workers are ready; the spare
    validator then imports JAX in the background (seconds of CPU at nice 19). Timing tasks
    during that start-up charges it to the first tasks: this measures the steady state.
    Idle = under 3% of one CPU over ``window_s``, twice in a row.
    """
    started = time.monotonic()
    quiet = 0
    last = tree_cpu_s(pid)
    while quiet < 2 and time.monotonic() - started < timeout_s:
        time.sleep(window_s)  # sampling the tree's CPU, not synchronizing with it
        now = tree_cpu_s(pid)
        quiet = quiet + 1 if now - last < 0.03 * window_s else 0
        last = now
    return time.monotonic() - started


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


def rss_mb(pid: int) -> float:
    """Return one process's resident set size in MB (Linux /proc; 0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss_mb(pid: int) -> float:
    """Return the RSS of a process and every descendant (the daemon and its workers)."""
    return rss_mb(pid) + sum(rss_mb(kid) for kid in children(pid))


def _wide_program(value: float) -> ProgramEnvelope:
    import jax.numpy as jnp

    from tests.provider.programs import envelope_for, export_fn, spec

    def widen(x: Any) -> Any:
        return jnp.arange(5_000_000, dtype=jnp.float32) + x[0]  # 20 MB out

    return envelope_for(export_fn(widen, spec(1)), [np.array([value], np.float32)])


def output_rss_growth_mb(sub: Submitter, deal_id: int, daemon_pid: int, tasks: int) -> float:
    """Growth of the daemon's and its workers' RSS over ``tasks`` tasks of 20 MB outputs each,
    after warm-up tasks have filled the daemon's output memory budget (256 MiB) twice over."""
    conn = sub.connect()
    try:
        for i in range(tasks + 30):
            if i == 30:
                before = tree_rss_mb(daemon_pid)
            envelope = _wide_program(float(i))
            sub.run(conn, sub.sign(deal_id, envelope, sub.next_index()), encode_envelope(envelope))
        after = tree_rss_mb(daemon_pid)
    finally:
        conn.close()
    print(f"daemon + workers RSS: {before:.0f} MB after warm-up, {after:.0f} MB after {tasks}")
    return after - before


def _outputs_program(value: float) -> ProgramEnvelope:
    import jax.numpy as jnp

    from tests.provider.programs import envelope_for, export_fn, spec

    def widen(x: Any) -> Any:
        return jnp.arange(65_536, dtype=jnp.float32) + x[0]  # 256 KiB out

    return envelope_for(export_fn(widen, spec(1)), [np.array([value], np.float32)])


def dir_bytes(path: Path) -> int:
    """Return the bytes of every file under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def pruned_tasks(journal: Path) -> int:
    """Return how many tasks the daemon's journal pruned (read beside the daemon)."""
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=30)
    try:
        return int(db.execute("SELECT COUNT(*) FROM pruned").fetchone()[0])
    except sqlite3.OperationalError:  # no journal yet
        return 0
    finally:
        db.close()


def _settled_batch(
    sub: Submitter, url: str, deal_id: int, client_key: str, tasks: int, owed: int
) -> int:
    """Run ``tasks`` tasks of 256 KiB outputs, vouch for all so far (every 50 tasks); wait
    until the daemon redeemed and pruned them; return what is owed in all."""
    conn = sub.connect()
    try:
        for n in range(tasks):
            index = sub.next_index()
            envelope = _outputs_program(float(index))
            status, data = sub.submit(
                conn, sub.sign(deal_id, envelope, index), encode_envelope(envelope)
            )
            if status != 200 or data["state"] != "succeeded":
                raise SystemExit(f"task failed: {status} {json.dumps(data)[:500]}")
            owed += int(data["receipt"]["amount"])
            if (n + 1) % 50 == 0 or n + 1 == tasks:
                voucher = Voucher(deal_id, owed, task_bitmap(range(sub.index)))
                signature = voucher.sign(sub.domain, client_key)
                body = {"voucher": voucher.to_json(), "signature": "0x" + signature.hex()}
                reply = httpx.post(f"{url}/v1/vouchers", json=body, timeout=60)
                if reply.status_code != 200:
                    raise SystemExit(f"voucher refused: {reply.status_code} {reply.text[:300]}")
    finally:
        conn.close()
    return owed


def disk_growth_mb_per_1k(args: argparse.Namespace) -> float:
    """Growth of the daemon's data dir over ``--disk-tasks`` tasks settled on chain (vouched,
    redeemed by its settlement jobs, their data pruned), after 100 warm-up tasks, per 1,000."""
    with Anvil.start(accounts=5) as anvil, tempfile.TemporaryDirectory() as tmp:
        chain = Chain(anvil.url)
        deployment = chain.deploy(anvil.keys[0])
        deal_id = open_deal(chain, deployment.escrow, anvil.keys, deployment.token)
        sections = "[settlement]\ninterval_s = 1\nredeem_threshold = 1\n"
        process, url = start_daemon(
            anvil,
            deployment.escrow,
            anvil.keys[1],
            Path(tmp),
            args.workers,
            jobs=True,
            sections=sections,
        )
        state = Path(tmp) / "state"
        journal = state / "journal.sqlite3"
        try:
            sub = Submitter(url, chain, deployment.escrow, anvil.keys[2], address_of(anvil.keys[1]))

            def settled(count: int) -> None:
                deadline = time.monotonic() + 600
                while pruned_tasks(journal) < count:  # the daemon's jobs redeem, then prune
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise SystemExit(f"{pruned_tasks(journal)} of {count} tasks pruned")
                    time.sleep(0.2)

            owed = _settled_batch(sub, url, deal_id, anvil.keys[2], 100, 0)
            settled(100)
            before = dir_bytes(state)
            _settled_batch(sub, url, deal_id, anvil.keys[2], args.disk_tasks, owed)
            settled(100 + args.disk_tasks)
            after = dir_bytes(state)
        finally:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(60)
    tasks = int(args.disk_tasks)
    written = tasks * 256 / 1024
    print(
        f"data dir: {before / 2**20:.1f} MiB after 100 settled tasks, {after / 2**20:.1f} MiB "
        f"after {tasks} more ({written:.0f} MiB of outputs delivered and settled)"
    )
    return (after - before) / 2**20 * 1000 / tasks


def sandbox_escapes() -> int:
    """The in-sandbox attacker's attempts that reached anything outside (target 0)."""
    from tests.provider.sandbox_attacker import worker_escapes

    with tempfile.TemporaryDirectory() as tmp:
        return worker_escapes(Path(tmp))


def malformed(rng: np.random.Generator) -> ProgramEnvelope:
    """A program whose StableHLO bytecode is garbage after a valid header."""
    import dataclasses

    from tests.provider.programs import envelope_for, export_fn, spec

    base = export_fn(lambda x: x * 2, spec(4))
    header = base.mlir_module_serialized[: len(b"ML\xefR") + 1 + len("StableHLO_v1.15.0") + 1]
    body = rng.integers(0, 256, 256, dtype=np.uint8).tobytes()
    program = bytes(dataclasses.replace(base, mlir_module_serialized=header + body).serialize())
    return envelope_for(base, [np.ones(4, np.float32)], program=program)


def stall_ratio(sub: Submitter, deal_id: int, honest: ProgramEnvelope, rounds: int) -> float:
    """Median over interleaved rounds of an honest task's latency right after 2 malformed
    tasks, over the median of its latency alone (each round: alone, 2 malformed, after)."""
    rng = np.random.default_rng(7)
    body = encode_envelope(honest)
    conn = sub.connect()
    alone, after = [], []

    def honest_ms() -> float:
        start = time.perf_counter()
        sub.run(conn, sub.sign(deal_id, honest, sub.next_index()), body)
        return (time.perf_counter() - start) * 1000

    try:
        honest_ms()
        for _ in range(rounds):
            alone.append(honest_ms())
            for _ in range(2):
                bad = malformed(rng)
                status, data = sub.submit(
                    conn, sub.sign(deal_id, bad, sub.next_index()), encode_envelope(bad)
                )
                if status != 200 or data.get("state") != "failed":
                    raise SystemExit(f"malformed task not diagnosed: {status} {data}")
                if data.get("diagnosis", {}).get("category") != "malformed_input":
                    raise SystemExit(f"malformed task diagnosed as {data.get('diagnosis')}")
            after.append(honest_ms())
    finally:
        conn.close()
    print(
        f"honest task alone: median {statistics.median(alone):.1f} ms; right after 2 "
        f"malformed: median {statistics.median(after):.1f} ms "
        f"({min(after):.1f}-{max(after):.1f}) over {rounds} rounds"
    )
    return statistics.median(after) / statistics.median(alone)


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


def cache_cross_reads() -> int:
    """Client B's cache hits on a program only client A compiled before (target 0)."""
    from provider.sandbox import Sandbox, SandboxLimits
    from tests.provider.programs import envelope_for, export_fn, mlp, mlp_params, spec

    params = mlp_params(np.random.default_rng(5), 16, 32, 4)
    exported = export_fn(mlp, *(spec(*p.shape) for p in params), spec(1, 16))
    envelope = encode_envelope(envelope_for(exported))
    alice, bob = "0x" + "a1" * 20, "0x" + "b0" * 20
    with tempfile.TemporaryDirectory() as cache:
        with Sandbox(1, SandboxLimits(), Path(cache), jax_platforms="cpu", spares=0) as box:
            box.compile(envelope, client=alice)
        with Sandbox(1, SandboxLimits(), Path(cache), jax_platforms="cpu", spares=0) as box:
            result = box.compile(envelope, client=bob)
            own = box.compile(envelope, client=alice)
            crossed = int(bool(getattr(result, "cache_hit", False))) + box.cache_cross_reads
    own_hit = getattr(own, "cache_hit", None)
    print(f"cache: B's compile of A's program hit={crossed > 0}; A's own hit={own_hit}")
    return crossed


def _attack_programs(count: int) -> list[ProgramEnvelope]:
    """The worst valid programs an attacker builds: endless loops and heavy compiles."""
    import jax
    import jax.numpy as jnp

    from tests.provider.programs import envelope_for, export_fn, spec

    def endless(x: Any) -> Any:
        return jax.lax.while_loop(lambda c: c[0] == c[0], lambda c: c * 1.5 + 1.0, x)

    programs = []
    for i in range(count):
        if i % 2 == 0:
            programs.append(envelope_for(export_fn(endless, spec(1)), [np.ones(1, np.float32)]))
            continue

        def heavy(x: Any, salt: float = float(i)) -> Any:
            for k in range(600):  # ~3,000 ops, under the op cap: a long compile, new each time
                x = jnp.sin(x @ x.T + salt + k) * 0.5
            return x

        programs.append(
            envelope_for(export_fn(heavy, spec(64, 64)), [np.ones((64, 64), np.float32)])
        )
    return programs


def honest_ratio_under_attack(
    sub: Submitter,
    deal_id: int,
    attacker: Submitter,
    attacker_deal: int,
    honest: ProgramEnvelope,
    tasks: int,
    connections: int,
) -> float:
    """Median honest latency with the attacker sending beside it, over the median alone."""
    body = encode_envelope(honest)
    conn = sub.connect()

    def honest_ms() -> float:
        start = time.perf_counter()
        sub.run(conn, sub.sign(deal_id, honest, sub.next_index()), body)
        return (time.perf_counter() - start) * 1000

    programs = _attack_programs(8)
    stop = threading.Event()
    answers: dict[str, int] = {}

    def attack(queued: int) -> None:
        """Keep ``queued`` of the worst programs acked and waiting (in index order)."""
        link = attacker.connect()
        i = 0
        while not stop.is_set():
            program = programs[i % len(programs)]
            headers = attacker.sign(attacker_deal, program, attacker.next_index())
            try:
                status, data = attacker.submit(link, headers, encode_envelope(program), 0)
                seen = f"{status} {data.get('state') or data.get('error')}"
            except (OSError, http.client.HTTPException, ValueError) as exc:
                seen = type(exc).__name__
                link.close()
                link = attacker.connect()
            answers[seen] = answers.get(seen, 0) + 1
            i += 1
            if i % queued == 0:
                stop.wait(30.0)  # the queue is full for a while: top it up later
        link.close()

    try:
        for _ in range(5):
            honest_ms()
        alone = [honest_ms() for _ in range(tasks)]
        threads = [threading.Thread(target=attack, args=(connections,), daemon=True)]
        for thread in threads:
            thread.start()
        time.sleep(2.0)  # let the attack fill its share of the workers (load, not sync)
        under = [honest_ms() for _ in range(tasks)]
    finally:
        stop.set()
        conn.close()
    print(
        f"honest alone: median {statistics.median(alone):.1f} ms; under attack "
        f"(attacker keeps {connections} tasks queued; its answers {answers}): median "
        f"{statistics.median(under):.1f} ms ({min(under):.1f}-{max(under):.1f})"
    )
    return statistics.median(under) / statistics.median(alone)


def attack_only(args: argparse.Namespace) -> float:
    """Start a chain and the daemon with two deals; measure the honest ratio under attack."""
    envelope, _, _ = mlp_program()
    with Anvil.start(accounts=5) as anvil, tempfile.TemporaryDirectory() as tmp:
        chain = Chain(anvil.url)
        deployment = chain.deploy(anvil.keys[0])
        deal_id = open_deal(chain, deployment.escrow, anvil.keys, deployment.token)
        evil_deal = open_deal(chain, deployment.escrow, anvil.keys, deployment.token, 4, 2)
        process, url = start_daemon(
            anvil, deployment.escrow, anvil.keys[1], Path(tmp), args.workers
        )
        try:
            provider = address_of(anvil.keys[1])
            sub = Submitter(url, chain, deployment.escrow, anvil.keys[2], provider)
            evil = Submitter(url, chain, deployment.escrow, anvil.keys[4], provider)
            settle(process.pid)
            return honest_ratio_under_attack(
                sub, deal_id, evil, evil_deal, envelope, args.attack_tasks, args.attack_queued
            )
        finally:
            os.kill(process.pid, signal.SIGKILL)  # attack tasks may still run: no drain
            process.wait(60)


def stall_only(args: argparse.Namespace) -> float:
    """Start a chain and the daemon; measure only the stall after malformed programs."""
    envelope, _, _ = mlp_program()
    with Anvil.start(accounts=5) as anvil, tempfile.TemporaryDirectory() as tmp:
        chain = Chain(anvil.url)
        deployment = chain.deploy(anvil.keys[0])
        deal_id = open_deal(chain, deployment.escrow, anvil.keys, deployment.token)
        process, url = start_daemon(
            anvil, deployment.escrow, anvil.keys[1], Path(tmp), args.workers
        )
        try:
            sub = Submitter(url, chain, deployment.escrow, anvil.keys[2], address_of(anvil.keys[1]))
            return stall_ratio(sub, deal_id, envelope, args.stall_rounds)
        finally:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300, help="sequential tasks timed")
    parser.add_argument("--throughput-tasks", type=int, default=1500)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers of the daemon")
    parser.add_argument("--rss-tasks", type=int, default=200, help="20 MB-output tasks")
    parser.add_argument("--stall-rounds", type=int, default=7)
    parser.add_argument(
        "--stall-only", action="store_true", help="measure stall_ratio_after_malformed alone"
    )
    parser.add_argument("--attack-tasks", type=int, default=30, help="honest tasks timed")
    parser.add_argument(
        "--attack-queued", type=int, default=6, help="attack tasks the attacker keeps queued"
    )
    parser.add_argument(
        "--attack-only", action="store_true", help="measure honest_p50_ratio_under_attack alone"
    )
    parser.add_argument("--disk-tasks", type=int, default=1000, help="settled tasks measured")
    parser.add_argument(
        "--storage-only",
        action="store_true",
        help="measure disk_growth_mb_per_1k_settled_tasks and worker_escapes alone",
    )
    args = parser.parse_args()
    if args.storage_only:
        figures = {
            "disk_growth_mb_per_1k_settled_tasks": round(disk_growth_mb_per_1k(args), 2),
            "worker_escapes": sandbox_escapes(),
        }
        print(json.dumps(figures))
        return
    if args.stall_only:
        print(json.dumps({"stall_ratio_after_malformed": round(stall_only(args), 2)}))
        return
    if args.attack_only:
        figures = {
            "cache_cross_reads": cache_cross_reads(),
            "honest_p50_ratio_under_attack": round(attack_only(args), 2),
        }
        print(json.dumps(figures))
        return

    envelope, fn, call_args = mlp_program()
    raw = raw_call_ms(fn, call_args, 2000)
    cold, warm = compile_cold_warm_ms()
    crossed = cache_cross_reads()
    attack_ratio = attack_only(args)
    disk_growth = disk_growth_mb_per_1k(args)
    escapes = sandbox_escapes()
    with Anvil.start(accounts=5) as anvil, tempfile.TemporaryDirectory() as tmp:
        chain = Chain(anvil.url)
        deployment = chain.deploy(anvil.keys[0])
        deal_id = open_deal(chain, deployment.escrow, anvil.keys, deployment.token)
        process, url = start_daemon(
            anvil, deployment.escrow, anvil.keys[1], Path(tmp), args.workers
        )
        try:
            sub = Submitter(url, chain, deployment.escrow, anvil.keys[2], address_of(anvil.keys[1]))
            print(f"daemon's process tree idle {settle(process.pid):.1f} s after its health check")
            kids = children(process.pid)
            before = (cpu_s(process.pid), sum(cpu_s(k) for k in kids), time.process_time())
            task_ms = daemon_task_ms(sub, deal_id, envelope, args.tasks)
            after = (cpu_s(process.pid), sum(cpu_s(k) for k in kids), time.process_time())
            per_task = [
                (a - b) * 1000 / (args.tasks + 20) for a, b in zip(after, before, strict=True)
            ]
            throughput = tasks_per_s(sub, deal_id, envelope, args.throughput_tasks, args.clients)
            ratio = stall_ratio(sub, deal_id, envelope, args.stall_rounds)
            growth = output_rss_growth_mb(sub, deal_id, process.pid, args.rss_tasks)
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
        "output_rss_growth_mb": round(growth, 1),
        "stall_ratio_after_malformed": round(ratio, 2),
        "cache_cross_reads": crossed,
        "honest_p50_ratio_under_attack": round(attack_ratio, 2),
        "disk_growth_mb_per_1k_settled_tasks": round(disk_growth, 2),
        "worker_escapes": escapes,
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
