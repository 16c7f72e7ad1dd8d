"""Shared by the torch route tests and scripts/check-torch-xla: modules, exports, a daemon.

The modules come from ``torch_zoo`` (built here with torch 2.13 for torchax and the eager
reference; by the torch_xla worker in .venv-xla from the same file and this state dict).
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi.testclient import TestClient

from client.models import ExportedModel, export_torch
from client.models.export_diagnosis import ExportCategory, ExportFailed
from client.models.from_torch_xla import XlaJob, export_torch_xla_many
from contracts.access import ACCESS_EXPIRY_HEADER, ACCESS_SIGNATURE_HEADER, result_access_digest
from contracts.messages import KIND_INFERENCE, sign_digest
from programs.envelope import ProgramEnvelope
from provider.api import create_app
from provider.daemon import Daemon
from provider.sandbox import Sandbox, SandboxLimits
from tests.client.models import torch_zoo
from tests.provider.daemon_support import ChainWorld, provider_config, sign_task, start_world

TOLERANCE = 1e-4  # max abs error against torch eager, float32 (measured: about 1e-6)
ROUTES = ("torchax", "torch_xla")
MODELS = {"mlp": (4, 32), "conv": (2, 3, 16, 16), "transformer": (2, 16, 64)}
TRAINED = "silero_vad"  # trained weights from the silero-vad wheel (2 clips x 8 chunks)
NAMES = (*MODELS, TRAINED)
MISSING_FACTORY = "make_nothing"  # a spec whose factory the file lacks: a load failure
FAILURES: dict[str, tuple[tuple[int, ...], ExportCategory, dict[str, str]]] = {
    "no_lowering": (
        (4, 4),
        ExportCategory.UNSUPPORTED_OP,
        {"torch_xla": "aten::linalg_eig", "torchax": "eig"},
    ),
    "dynamic_shape": (
        (8,),
        ExportCategory.DYNAMIC_SHAPE,
        {"torch_xla": "aten::nonzero", "torchax": "aten.index"},
    ),
    "data_dependent_branch": ((8,), ExportCategory.DATA_DEPENDENT_CONTROL_FLOW, {}),
    "custom_op": (
        (8,),
        ExportCategory.CUSTOM_OP,
        {"torch_xla": "tpumarket_test::fused_gelu", "torchax": "tpumarket_test.fused_gelu"},
    ),
}


@dataclass
class Case:
    """A module, its example inputs and torch eager's outputs on them."""

    module: Any
    inputs: list[np.ndarray[Any, Any]]
    expected: list[np.ndarray[Any, Any]]


@dataclass
class Node:
    """A running daemon's task API, its chain and one open deal."""

    api: TestClient
    world: ChainWorld
    deal: int
    indices: Iterator[int]


def example(shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """Seeded float32 normal values."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def run_task(
    node: Node, envelope: ProgramEnvelope, kind: int = KIND_INFERENCE, target: str | None = None
) -> dict[str, Any]:
    """Submit a signed task through the task API and return the delivered result."""
    index = next(node.indices)
    task = sign_task(
        node.world, node.world.client, node.deal, index, envelope, kind=kind, target=target
    )
    reply = node.api.post(
        "/v1/tasks", content=task.body, headers=task.headers(), params={"wait": 60}
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    while body["state"] not in ("succeeded", "failed"):  # a loaded host: ask again
        expiry = int(time.time()) + 300
        digest = result_access_digest(node.world.domain, node.deal, index, expiry)
        headers = {
            ACCESS_EXPIRY_HEADER: str(expiry),
            ACCESS_SIGNATURE_HEADER: "0x" + sign_digest(digest, node.world.client).hex(),
        }
        body = node.api.get(
            f"/v1/tasks/{node.deal}/{index}", params={"wait": 60}, headers=headers
        ).json()
    return body


def make_case(module: Any, inputs: list[np.ndarray[Any, Any]]) -> Case:
    """Run ``module`` eagerly (torch 2.13) on ``inputs``."""
    with torch.no_grad():
        out = module(*(torch.from_numpy(x) for x in inputs))
    outputs = out if isinstance(out, tuple) else (out,)
    return Case(module, inputs, [t.numpy() for t in outputs])


def make_cases() -> dict[str, Case]:
    """The three modules and Silero VAD with its trained weights, eager outputs included."""
    from client.models.zoo import silero_vad

    cases = {
        name: make_case(getattr(torch_zoo, f"make_{name}")(), [example(shape, seed)])
        for seed, (name, shape) in enumerate(MODELS.items())
    }
    vad = torch_zoo.make_silero_vad()
    vad.load_state_dict({k: torch.tensor(v) for k, v in silero_vad.load_weights().items()})
    state, context = silero_vad.initial_state(2)
    cases[TRAINED] = make_case(vad, [silero_vad.speech_like_audio(2, 8), state, context])
    return cases


def max_error(got: list[np.ndarray[Any, Any]], case: Case) -> float:
    """Return the largest absolute difference from torch eager over every output."""
    assert [g.shape for g in got] == [e.shape for e in case.expected]
    return max(float(np.abs(g - e).max()) for g, e in zip(got, case.expected, strict=True))


def export_xla(cases: dict[str, Case]) -> dict[str, ExportedModel | ExportFailed]:
    """Every module (the cases, the failures, a missing factory) by torch_xla in one worker."""
    zoo = Path(torch_zoo.__file__)
    jobs = [
        XlaJob(f"{zoo}:make_{name}", case.inputs, state_dict=case.module.state_dict())
        for name, case in cases.items()
    ] + [
        XlaJob(f"{zoo}:make_{name}", [example(shape, 0)]) for name, (shape, *_) in FAILURES.items()
    ]
    jobs.append(XlaJob(f"{zoo}:{MISSING_FACTORY}", [example((2,), 0)]))
    names = [*cases, *FAILURES, MISSING_FACTORY]
    return dict(zip(names, export_torch_xla_many(jobs), strict=True))


def export_torchax(case: Case) -> ExportedModel:
    """The case's module by torchax, static shapes, for CPU and TPU."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return export_torch(case.module, case.inputs)


@contextmanager
def start_node(data: Path) -> Iterator[Node]:
    """Start anvil, a provider daemon (real sandbox worker) and its task API; open a deal."""
    world = start_world()
    try:
        with Sandbox(1, SandboxLimits(), data / "cache", jax_platforms="cpu") as sandbox:
            daemon = Daemon(provider_config(world, data), chain=world.chain, sandbox=sandbox)
            daemon.start(schedule=False)
            try:
                with TestClient(create_app(daemon)) as api:
                    yield Node(api, world, world.open_deal(), itertools.count())
            finally:
                daemon.close()
    finally:
        world.anvil.stop()
