"""Client tests share the session anvil and deployment of the contract tests."""

from tests.contracts.conftest import anvil, deployed, world  # noqa: F401
