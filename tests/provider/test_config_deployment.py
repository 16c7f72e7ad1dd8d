"""The daemon's key from an encrypted keystore and its escrow from a deployment file: a real
TOML file, a real keystore, and a real daemon that refuses a node serving another chain."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contracts.keystore import PASSPHRASE_ENV, write_keystore
from contracts.messages import address_of
from provider.config import load_config
from provider.daemon import Daemon
from provider.errors import ConfigError
from tests.deployment_sample import write_sample
from tests.provider.daemon_support import ChainWorld, provider_config

KEY = "0x" + "5a" * 32
ESCROW = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TPUMARKET_PROVIDER_") or name == PASSPHRASE_ENV:
            monkeypatch.delenv(name)


def _deployment(tmp_path: Path) -> Path:
    return write_sample(tmp_path / "deployment.json", escrow=ESCROW)


def _toml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "provider.toml"
    path.write_text(f'rpc_url = "http://node"\ndata_dir = "{tmp_path}"\n' + body)
    return path


def test_keystore_and_deployment_give_key_escrow_and_chain(tmp_path: Path) -> None:
    write_keystore(tmp_path / "key.json", KEY, "s3cret", scrypt_n=2**4)
    (tmp_path / "pass").write_text("s3cret\n")
    deployment = _deployment(tmp_path)
    config = load_config(
        _toml(
            tmp_path,
            f'keystore = "{tmp_path / "key.json"}"\npassphrase_file = "{tmp_path / "pass"}"\n'
            f'deployment = "{deployment}"\n',
        )
    )
    assert (config.address, config.escrow, config.chain_id) == (address_of(KEY), ESCROW, 8453)
    assert KEY.removeprefix("0x") not in repr(config)


def test_wrong_passphrase_and_foreign_escrow_are_one_line_errors(tmp_path: Path) -> None:
    write_keystore(tmp_path / "key.json", KEY, "s3cret", scrypt_n=2**4)
    (tmp_path / "pass").write_text("wrong\n")
    body = f'keystore = "{tmp_path / "key.json"}"\npassphrase_file = "{tmp_path / "pass"}"\n'
    with pytest.raises(ConfigError) as raised:
        load_config(_toml(tmp_path, body))
    assert "\n" not in str(raised.value) and KEY.removeprefix("0x") not in str(raised.value)
    (tmp_path / "pass").write_text("s3cret\n")
    body += f'deployment = "{_deployment(tmp_path)}"\nescrow = "0x{"22" * 20}"\n'
    with pytest.raises(ConfigError, match="not the deployment file's"):
        load_config(_toml(tmp_path, body))


def test_daemon_refuses_a_node_of_another_chain(chain_world: ChainWorld, tmp_path: Path) -> None:
    config = provider_config(
        chain_world, tmp_path / "data", chain_id=chain_world.anvil.chain_id + 1
    )
    with pytest.raises(ConfigError, match="chain id"):
        Daemon(config)
    assert not (tmp_path / "data" / "journal.sqlite").exists()  # refused before opening anything
