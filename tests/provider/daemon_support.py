"""A chain with a deployed escrow, deals, and signed task requests for the daemon tests."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jax
import jax.numpy as jnp
import numpy as np

from contracts.binding import Chain, Escrow, Token
from contracts.chain import Anvil, free_port, rpc
from contracts.messages import (
    KIND_COMPILE,
    KIND_INFERENCE,
    Domain,
    Plan,
    Quote,
    TaskRequest,
    address_of,
)
from programs.envelope import ProgramEnvelope, encode_envelope, request_input_hash
from provider.config import ProviderConfig, SettlementConfig
from tests import processes
from tests.polling import wait_until
from tests.provider.programs import envelope_for, export_fn, mlp, mlp_params, spec

REPO = Path(__file__).resolve().parents[2]
FUNDS = 10**15
PLAN = Plan(compile_price=1_000, inference_price=500, price_per_device_ms=0)
CHALLENGE_WINDOW = 60
PENALTY = 50_000
SLO_S = 30  # the test daemons' SLO (provider_config's slo_ms)
DEADLINE_SLACK_S = 10  # see sign_task
LEAN_SANDBOX: dict[str, int] = {"sandbox_spares": 0, "sandbox_validator_spares": 0}
"""Config of a test daemon that exercises no worker's or validator's replacement: none stands
by, so its sandbox starts 3 processes (a worker, 2 validators), not 5, each importing JAX."""


def toml_lines(values: dict[str, int]) -> str:
    """Return `values` as top-level TOML lines, one key each."""
    return "".join(f"{key} = {value}\n" for key, value in values.items())


LEAN_SANDBOX_TOML = toml_lines(LEAN_SANDBOX)
"""The same as top-level TOML lines."""
_nonces = itertools.count(1)


@dataclass
class ChainWorld:
    """A running anvil with token and escrow deployed and funded actors."""

    anvil: Anvil
    chain: Chain
    escrow: Escrow
    token: Token
    deployer: str
    provider: str
    other_provider: str
    client: str
    other_client: str
    arbiter: str
    deals: list[int] = field(default_factory=list)

    @property
    def domain(self) -> Domain:
        """Return the escrow's EIP-712 domain."""
        return self.escrow.domain

    def now(self) -> int:
        """Return the latest block's timestamp."""
        return int(self.chain.w3.eth.get_block("latest")["timestamp"])

    def chain_time(self) -> int:
        """Mine a block and return its timestamp: the chain's clock now, even when idle."""
        rpc(self.anvil.url, "evm_mine")
        return self.now()

    def advance_to(self, timestamp: int) -> None:
        """Mine a block at ``timestamp`` (moving the chain's clock forward, never back)."""
        now = self.chain_time()
        if timestamp > now:
            self.anvil.increase_time(timestamp - now)

    def open_deal(
        self,
        *,
        provider: str | None = None,
        client: str | None = None,
        max_spend: int = 10**8,
        plan: Plan = PLAN,
        duration: int = 3_600,
        window: int = CHALLENGE_WINDOW,
        stake: int = 10**6,
    ) -> int:
        """Open a deal from a quote the provider signs; return its id."""
        provider = provider or self.provider
        client = client or self.client
        quote = Quote(
            provider=address_of(provider),
            client=address_of(client),
            arbiter=address_of(self.arbiter),
            max_spend=max_spend,
            stake=stake,
            penalty=PENALTY,
            duration=duration,
            challenge_window=window,
            slo_ms=10_000,
            # The chain's clock now: its latest block is old when the session chain sat idle.
            valid_until=self.chain_time() + 600,
            nonce=next(_nonces),
            plan=plan,
        )
        self.escrow.deposit(client, max_spend)
        self.escrow.stake(provider, quote.stake)
        result = self.escrow.open_deal(client, quote, quote.sign(self.domain, provider), max_spend)
        return int(result.event("DealOpened").args["dealId"])


def start_world() -> ChainWorld:
    """Start anvil, deploy, mint and approve for every actor."""
    anvil = Anvil.start(accounts=8)
    try:  # a set-up that fails halfway stops its chain
        chain = Chain(anvil.url)
        keys = anvil.keys
        deployment = chain.deploy(keys[0])
        escrow = chain.escrow(deployment.escrow)
        token = chain.token(deployment.token)
        for key in keys[1:7]:
            token.mint(keys[0], address_of(key), FUNDS)
            token.approve(key, escrow.address, 2**256 - 1)
    except BaseException:
        anvil.stop()
        raise
    return ChainWorld(
        anvil=anvil,
        chain=chain,
        escrow=escrow,
        token=token,
        deployer=keys[0],
        provider=keys[1],
        other_provider=keys[2],
        client=keys[3],
        other_client=keys[4],
        arbiter=keys[5],
    )


def provider_config(world: ChainWorld, data_dir: Path, **changes: Any) -> ProviderConfig:
    """Return a daemon config for ``world.provider`` (jobs triggered by hand in tests); the
    sandbox it builds, when none is passed to the daemon, is :data:`LEAN_SANDBOX`'s."""
    settings: dict[str, Any] = {
        **LEAN_SANDBOX,
        "private_key": world.provider,
        "rpc_url": world.anvil.url,
        "escrow": world.escrow.address,
        "data_dir": data_dir,
        "plan": PLAN,
        "slo_ms": SLO_S * 1000,
        "pool_size": 1,
        "jax_platforms": "cpu",
        "benchmark_on_start": False,
        "settlement": SettlementConfig(redeem_threshold=10**12),
    }
    settings.update(changes)
    return ProviderConfig(**settings)


# ---- programs ----------------------------------------------------------------------------


def tiny_mlp_envelope(
    seed: int = 0, batch: int = 1, platforms: tuple[str, ...] | None = None
) -> tuple[ProgramEnvelope, np.ndarray[Any, Any]]:
    """Return an MLP envelope (weights + input) and the reference output."""
    rng = np.random.default_rng(seed)
    params = mlp_params(rng, 16, 32, 4)
    x = rng.standard_normal((batch, 16), dtype=np.float32)
    exported = export_fn(
        mlp, *(spec(*p.shape) for p in params), spec(batch, 16), platforms=platforms
    )
    envelope = envelope_for(exported, [*params, x], weights=dict(enumerate(params)))
    return envelope, np.asarray(mlp(*params, x))


def spin(n: jax.Array, x: jax.Array) -> jax.Array:
    """Loop ``n[0]`` times (~18 ns per step on this CPU): a task whose length we choose."""

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        i, y = carry
        return i + 1, jnp.sin(y) + 1.0

    return jax.lax.while_loop(lambda c: c[0] < n[0], body, (jnp.int32(0), x))[1]


def spin_envelope(steps: int) -> ProgramEnvelope:
    """Return an envelope that spins ``steps`` loop iterations."""
    exported = export_fn(spin, spec(1, dtype=jnp.int32), spec(4))
    return envelope_for(exported, [np.array([steps], np.int32), np.ones(4, np.float32)])


# ---- signed requests ---------------------------------------------------------------------


@dataclass(frozen=True)
class SignedTask:
    """A signed task request and the HTTP pieces to submit it."""

    request: TaskRequest
    signature: bytes
    body: bytes
    target: str | None = None

    def headers(self) -> dict[str, str]:
        """Return the submission headers."""
        out = {
            "X-Tpumarket-Request": json.dumps(self.request.to_json()),
            "X-Tpumarket-Signature": "0x" + self.signature.hex(),
            "Content-Type": "application/octet-stream",
        }
        if self.target is not None:
            out["X-Tpumarket-Target"] = self.target
        return out


def sign_task(
    world: ChainWorld,
    client: str,
    deal_id: int,
    index: int,
    envelope: ProgramEnvelope,
    *,
    kind: int = KIND_INFERENCE,
    target: str | None = None,
    max_price: int = 10_000,
    deadline: int | None = None,
    domain: Domain | None = None,
) -> SignedTask:
    """Sign a task request for ``envelope`` as ``client``.

    The deadline is the chain's time now + the SLO + 10 s of slack: the SDK's 2 s (which it
    doubles on a `deadline_too_soon`) is too little on a loaded 2-core host running test daemons.
    """
    request = TaskRequest(
        deal_id=deal_id,
        task_index=index,
        kind=kind,
        program_hash=envelope.program_sha256,
        input_hash=request_input_hash(kind, envelope, target),
        max_price=max_price,
        deadline=world.chain_time() + SLO_S + DEADLINE_SLACK_S if deadline is None else deadline,
    )
    signed = request.sign(domain or world.domain, client)
    return SignedTask(request, signed, encode_envelope(envelope), target)


def compile_task(
    world: ChainWorld, client: str, deal_id: int, index: int, envelope: ProgramEnvelope, target: str
) -> SignedTask:
    """Sign a compile task for ``target``."""
    return sign_task(world, client, deal_id, index, envelope, kind=KIND_COMPILE, target=target)


# ---- the daemon as a process --------------------------------------------------------------


@dataclass
class ServedDaemon:
    """A daemon run from its CLI (real uvicorn, real sockets): its URL, process and log."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        """Return the daemon's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        """Return whether the process runs and answers its health check."""
        if self.process.poll() is not None:
            return False
        return httpx.get(self.url + "/v1/health", timeout=30).status_code == 200


def daemon_toml(
    world: ChainWorld,
    data_dir: Path,
    *,
    rpc_url: str | None = None,
    settings: str = "",
    lean: bool = True,
) -> str:
    """Return a daemon config for ``world`` (its plan and SLO) with ``settings`` (TOML lines of
    the top level, then any ``[section]`` of their own) appended; ``lean``: the
    :data:`LEAN_SANDBOX` keys that ``settings`` does not set (else the daemon's defaults)."""
    top, _, sections = settings.partition("\n[")
    given = {line.partition("=")[0].strip() for line in top.splitlines()}
    sandbox = {k: v for k, v in LEAN_SANDBOX.items() if lean and k not in given}
    return (
        f'rpc_url = "{rpc_url or world.anvil.url}"\n'
        f'escrow = "{world.escrow.address}"\n'
        f'data_dir = "{data_dir}"\n'
        'jax_platforms = "cpu"\n'
        f"slo_ms = {SLO_S * 1000}\n"
        "benchmark_on_start = false\n" + toml_lines(sandbox) + f"{top.strip()}\n"
        "[plan]\n"
        f"compile_price = {PLAN.compile_price}\n"
        f"inference_price = {PLAN.inference_price}\n"
        + (f"[{sections.strip()}\n" if sections.strip() else "")
    )


@contextmanager
def served_daemon(
    world: ChainWorld,
    work: Path,
    *,
    rpc_url: str | None = None,
    settings: str = "",
    lean: bool = True,
) -> Iterator[ServedDaemon]:
    """Run ``provider run --no-jobs`` for ``world.provider`` with its data and log in ``work``
    (a second run on the same ``work`` keeps the data); yield once it answers its health check,
    stop it (SIGTERM, then SIGKILL) on exit.

    ``rpc_url`` replaces the node's (a proxy, a URL with a key); ``settings`` and ``lean`` as
    in :func:`daemon_toml`. Its stdout and stderr go to ``work / "daemon.log"`` (appended).
    """
    config = work / "provider.toml"
    config.write_text(
        daemon_toml(world, work / "data", rpc_url=rpc_url, settings=settings, lean=lean)
    )
    port = free_port()
    env = dict(os.environ, TPUMARKET_PROVIDER_PRIVATE_KEY=world.provider, JAX_PLATFORMS="cpu")
    log_path = work / "daemon.log"
    with log_path.open("ab") as log:
        process = processes.spawn(
            [
                *(sys.executable, "-m", "provider.cli", "run", "--no-jobs"),
                *("--config", str(config), "--port", str(port)),
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    daemon = ServedDaemon(port, process, log_path)

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(log_path.read_text()[-3000:])
        try:
            return daemon.healthy()
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 120, "daemon health")
        yield daemon
    finally:
        processes.stop(process, grace_s=60)
