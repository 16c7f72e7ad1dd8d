"""Fixtures: the escrow world of the contract tests (one anvil, a snapshot per test), a real
program with its honest outputs, and a real arbiter process."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contracts.conftest import World, anvil, deployed, world  # noqa: F401

from .drill import ArbiterProcess, Job, make_job


@pytest.fixture(scope="module")
def job() -> Job:
    """An MLP run once in the provider's sandbox: the honest outputs."""
    return make_job()


@pytest.fixture
def arbiter(world: World, tmp_path: Path) -> Iterator[ArbiterProcess]:  # noqa: F811
    """``python -m provider.arbiter.cli run`` on this test's world, stopped after it."""
    process = ArbiterProcess(world, tmp_path / "arbiter")
    process.start()
    try:
        yield process
    finally:
        process.stop()
