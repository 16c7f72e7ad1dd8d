"""Fixtures: the escrow world of the contract tests (one anvil, a snapshot per test)."""

from tests.contracts.conftest import anvil, deployed, world  # noqa: F401
