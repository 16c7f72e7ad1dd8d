"""The client's settings from the environment, read in one place and validated.

``TPUMARKET_RPC_URL``, ``TPUMARKET_ESCROW``, ``TPUMARKET_MARKET_URL``,
``TPUMARKET_ESCROW_BLOCK``, ``TPUMARKET_CLIENT_KEY`` (a raw key, development only) or
``TPUMARKET_CLIENT_KEYSTORE`` with ``TPUMARKET_PASSPHRASE_FILE`` (or
``TPUMARKET_KEYSTORE_PASSPHRASE``), ``TPUMARKET_DEPLOYMENT`` (a deployment file from
``tpumarket chain deploy``: the escrow and its block come from it) and
``TPUMARKET_CLIENT_STATE``, and for a real chain ``TPUMARKET_CONFIRMATIONS``,
``TPUMARKET_REPLACE_AFTER_BLOCKS`` and ``TPUMARKET_MAX_FEE_GWEI``; an empty variable counts
as unset. A value that does not validate
is a ``ClientSettingsError`` with a one-line message (the CLI exits 2). The private key is a
secret: no repr, log or error shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from client.errors import ClientInputError
from contracts.tx_policy import TxPolicy

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
    client_keystore: Path | None = None
    passphrase_file: Path | None = None
    deployment: Path | None = None
    chain_id: int | None = None
    client_state: Path = Path.home() / ".tpumarket" / "client"
    # Sending on a real chain (contracts.tx_policy): blocks under which a transaction counts as
    # done, blocks it may wait unmined before a replacement, the most paid per gas.
    confirmations: int = Field(default=1, ge=1)
    replace_after_blocks: int = Field(default=3, ge=1)
    max_fee_gwei: float | None = Field(default=None, gt=0)

    def tx_policy(self) -> TxPolicy:
        """Return the transaction policy the settings describe."""
        return TxPolicy.from_settings(
            self.confirmations, self.replace_after_blocks, self.max_fee_gwei
        )

    @model_validator(mode="before")
    @classmethod
    def _from_deployment(cls, data: Any) -> Any:
        """Take the escrow, its block and the chain id from the deployment file, if one is
        named; an escrow also given must be the file's."""
        if not isinstance(data, dict):
            return data
        from contracts.deployment import with_deployment

        return with_deployment(data, block_key="escrow_block")

    def key_text(self) -> str | None:
        """Return the client key: the raw key if set, else decrypted from the keystore (its
        passphrase from the passphrase file, the environment or a prompt); None if neither."""
        if self.client_key is not None:
            return self.client_key.get_secret_value()
        if self.client_keystore is None:
            return None
        from contracts.keystore import load_key, read_passphrase

        return load_key(self.client_keystore, read_passphrase(self.passphrase_file))


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
