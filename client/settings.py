"""The client's settings from the environment, read in one place and validated.

``TPUMARKET_RPC_URL``, ``TPUMARKET_ESCROW``, ``TPUMARKET_MARKET_URL``,
``TPUMARKET_ESCROW_BLOCK``, ``TPUMARKET_CLIENT_KEY`` and ``TPUMARKET_CLIENT_STATE``; an empty
variable counts as unset. A value that does not validate is a ``ClientSettingsError`` with a
one-line message (the CLI exits 2). The private key is a secret: no repr, log or error shows it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from client.errors import ClientInputError

PREFIX = "TPUMARKET_"


class ClientSettingsError(ClientInputError):
    """An environment variable of the client does not validate."""


class ClientSettings(BaseSettings):
    """What the client reads from the environment (command-line options take precedence)."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_ignore_empty=True, extra="ignore", frozen=True
    )

    rpc_url: str = "http://127.0.0.1:8545"
    escrow: str | None = None
    market_url: str | None = None
    escrow_block: int = Field(default=0, ge=0)
    client_key: SecretStr | None = None
    client_state: Path = Path.home() / ".tpumarket" / "client"


def load_settings() -> ClientSettings:
    """Read and validate the client's environment; raise ``ClientSettingsError`` if it fails."""
    try:
        return ClientSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{PREFIX}{'.'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
        raise ClientSettingsError(problems) from None
