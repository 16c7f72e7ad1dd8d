"""Fixtures for the model tests: JAX on CPU, one spawned sandbox worker for the session."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports jax

from collections.abc import Iterator

import numpy as np
import pytest

from provider.sandbox import Sandbox, SandboxLimits


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """One real spawned worker (the provider's sandbox), shared by every model test."""
    cache = tmp_path_factory.mktemp("models-xla-cache")
    with Sandbox(1, SandboxLimits(), cache, jax_platforms="cpu") as box:
        yield box


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator, so every run sees the same numbers."""
    return np.random.default_rng(20261202)
