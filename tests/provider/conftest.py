"""Fixtures for the provider tests: JAX on CPU, one sandbox pool per test module."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports jax

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from provider.api import create_app
from provider.daemon import Daemon
from provider.sandbox import Sandbox, SandboxLimits
from tests.provider.daemon_support import ChainWorld, provider_config, start_world


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compilation cache directory shared by one module's sandboxes."""
    return tmp_path_factory.mktemp("xla-cache")


@pytest.fixture(scope="module")
def sandbox(cache_dir: Path) -> Iterator[Sandbox]:
    """One spawned worker with default limits, kept for the whole module."""
    with Sandbox(1, SandboxLimits(), cache_dir, jax_platforms="cpu") as box:
        yield box


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator, so every run sees the same numbers."""
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def chain_world() -> Iterator[ChainWorld]:
    """One anvil with the escrow deployed, shared by the daemon tests (fresh deal per test)."""
    world = start_world()
    try:
        yield world
    finally:
        world.anvil.stop()


@pytest.fixture(scope="module")
def daemon(
    chain_world: ChainWorld, sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    """One daemon per module on the shared chain (its jobs triggered by hand)."""
    data = tmp_path_factory.mktemp("provider-data")
    node = Daemon(provider_config(chain_world, data), chain=chain_world.chain, sandbox=sandbox)
    node.start(schedule=False)
    try:
        yield node
    finally:
        node.close()


@pytest.fixture(scope="module")
def api(daemon: Daemon) -> Iterator[TestClient]:
    """The daemon's task API in process."""
    with TestClient(create_app(daemon)) as client:
        yield client
