"""The arbiter's settings: a TOML file, then ``TPUMARKET_ARBITER_*`` variables key by key.

The key is a secret (shown by no repr, log or error); every value is validated into one
:class:`provider.errors.ConfigError` line naming the key.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.tx_policy import TxPolicy
from provider.errors import ConfigError

ENV_PREFIX = "TPUMARKET_ARBITER_"


class ArbiterSettings(BaseSettings):
    """Everything ``tpumarket arbiter run`` needs."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    key: SecretStr | None = Field(None, description="a raw private key (development only)")
    keystore: Path | None = Field(None, description="the arbiter's encrypted keystore file")
    passphrase_file: Path | None = Field(None, description="the keystore's passphrase")
    rpc_url: str = Field("http://127.0.0.1:8545", description="the chain's JSON-RPC URL")
    escrow: str = Field(description="the escrow's address")
    data_dir: Path = Field(Path("arbiter-data"), description="journal and evidence")
    host: str = Field("127.0.0.1", description="bind address of the API")
    port: int = Field(8300, ge=1, le=65535, description="port of the API")
    evidence_window_s: int = Field(
        600, gt=0, description="seconds after a dispute to take evidence"
    )
    ruling_margin_s: int = Field(300, ge=0, description="rule at least this long before a lapse")
    poll_interval_s: float = Field(2.0, gt=0, le=60, description="seconds between chain scans")
    from_block: int = Field(0, ge=0, description="first block to scan for disputes")
    fee: int = Field(
        0, ge=0, lt=2**128, description="fee per disputed batch, paid by the side that loses"
    )
    market_url: str | None = Field(None, description="the market to advertise on (none: no advert)")
    public_url: str | None = Field(
        None, description="the API's URL in the advert (default http://host:port)"
    )
    advert_interval_s: float = Field(
        60.0, ge=1, le=86_400, description="seconds between adverts to the market"
    )
    deployment: Path | None = Field(
        None, description="a deployment file: the escrow, its block and the chain id from it"
    )
    chain_id: int | None = Field(None, description="the chain the node must serve")
    confirmations: int = Field(1, ge=1, description="blocks a ruling must be under to count")
    replace_after_blocks: int = Field(
        3, ge=1, description="blocks a transaction waits unmined before a replacement"
    )
    max_fee_gwei: float | None = Field(None, gt=0, description="the most paid per gas")

    @model_validator(mode="before")
    @classmethod
    def _from_deployment(cls, data: Any) -> Any:
        """Take the escrow, the first block and the chain id from the deployment file; an
        escrow also given must be the file's."""
        if not isinstance(data, dict):
            return data
        from contracts.deployment import with_deployment

        return with_deployment(data, block_key="from_block")

    def tx_policy(self) -> TxPolicy:
        """Return the transaction policy the settings describe."""
        return TxPolicy.from_settings(
            self.confirmations, self.replace_after_blocks, self.max_fee_gwei
        )

    @field_validator("key")
    @classmethod
    def _key_shape(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        digits = value.get_secret_value().strip().removeprefix("0x")
        if len(digits) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise ValueError("must be 0x and 64 hex digits")
        return SecretStr("0x" + digits.lower())

    @model_validator(mode="after")
    def _one_key(self) -> ArbiterSettings:
        if (self.key is None) == (self.keystore is None):
            raise ValueError("give exactly one of key (development only) and keystore")
        return self

    def private_key(self) -> str:
        """Return the private key: decrypted from the keystore, or the raw key (with a
        development-only warning on stderr)."""
        from contracts.keystore import RAW_KEY_WARNING, load_key, read_passphrase

        if self.keystore is not None:
            return load_key(self.keystore, read_passphrase(self.passphrase_file))
        assert self.key is not None
        print(RAW_KEY_WARNING, file=sys.stderr, flush=True)
        return self.key.get_secret_value()


def load_settings(path: Path | None = None, **overrides: Any) -> ArbiterSettings:
    """Load the settings: the TOML file at ``path`` (optional), then ``TPUMARKET_ARBITER_*``
    variables key by key, then ``overrides`` (command-line flags) that are not None."""
    values: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            values.update(tomllib.loads(path.read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path} is not TOML: {exc}") from None
    origin = {name: str(path) for name in values}
    for name in ArbiterSettings.model_fields:
        raw = os.environ.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = raw
            origin[name] = ENV_PREFIX + name.upper()
    for name, value in overrides.items():
        if value is not None:
            values[name] = value
            origin[name] = "the command line"
    try:
        return ArbiterSettings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        source = origin.get(where.split(".")[0], f"{ENV_PREFIX}{where.upper()} or the file")
        raise ConfigError(f"{where}: {first['msg']} (from {source})") from None
