"""The client's environment is read in one place: validated into a one-line error (the CLI
exits 2), an empty variable counts as unset, and the private key never shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from eth_account import Account

from client.cli import main
from client.settings import ClientSettings, ClientSettingsError, load_settings
from contracts.keystore import KeystoreError, write_keystore
from tests.deployment_sample import SAMPLE, write_sample

VARIABLES = (
    "TPUMARKET_RPC_URL",
    "TPUMARKET_ESCROW",
    "TPUMARKET_MARKET_URL",
    "TPUMARKET_ESCROW_BLOCK",
    "TPUMARKET_CLIENT_KEY",
    "TPUMARKET_CLIENT_STATE",
    "TPUMARKET_CLIENT_KEYSTORE",
    "TPUMARKET_PASSPHRASE_FILE",
    "TPUMARKET_DEPLOYMENT",
    "TPUMARKET_KEYSTORE_PASSPHRASE",
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_settings_from_the_environment_with_empty_variables_as_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TPUMARKET_RPC_URL", "http://node:8545")
    monkeypatch.setenv("TPUMARKET_ESCROW_BLOCK", "17")
    monkeypatch.setenv("TPUMARKET_MARKET_URL", "")
    settings = load_settings()
    assert (settings.rpc_url, settings.escrow_block, settings.market_url) == (
        "http://node:8545",
        17,
        None,
    )
    monkeypatch.setenv("TPUMARKET_ESCROW_BLOCK", "")
    assert load_settings().escrow_block == 0


@pytest.mark.parametrize(
    ("value", "why"),
    [("ten", "valid integer"), ("-1", "greater than or equal to 0")],
)
def test_bad_variable_is_one_typed_line_and_the_cli_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, why: str
) -> None:
    key = Account.create().key.hex()
    monkeypatch.setenv("TPUMARKET_CLIENT_KEY", key)
    monkeypatch.setenv("TPUMARKET_ESCROW_BLOCK", value)
    with pytest.raises(ClientSettingsError, match=f"^TPUMARKET_ESCROW_BLOCK: .*{why}"):
        load_settings()
    assert main(["client", "balances"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: TPUMARKET_ESCROW_BLOCK: "), err
    assert key.removeprefix("0x") not in err


def test_private_key_is_a_secret_never_in_a_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    key = Account.create().key.hex()
    monkeypatch.setenv("TPUMARKET_CLIENT_KEY", key)
    settings = load_settings()
    assert settings.client_key is not None and settings.client_key.get_secret_value() == key
    shown = repr(settings) + str(settings) + repr(settings.model_dump())
    assert key.removeprefix("0x") not in shown and "**********" in shown
    assert isinstance(settings, ClientSettings)


def test_a_deployment_file_gives_the_escrow_and_its_block(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = write_sample(tmp_path / "deployment.json", deployment_block=1234)
    monkeypatch.setenv("TPUMARKET_DEPLOYMENT", str(path))
    settings = load_settings()
    assert (settings.escrow, settings.escrow_block, settings.chain_id) == (
        SAMPLE["escrow"],
        1234,
        8453,
    )
    monkeypatch.setenv("TPUMARKET_ESCROW", "0x" + "11" * 20)  # another escrow beside it
    with pytest.raises(ClientSettingsError, match="not the deployment file's"):
        load_settings()
    monkeypatch.delenv("TPUMARKET_ESCROW")
    path.write_text("{")
    with pytest.raises(ClientSettingsError, match="not JSON"):
        load_settings()


def test_the_key_from_a_keystore(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = "0x" + "42" * 32
    write_keystore(tmp_path / "client.json", key, "pass phrase", scrypt_n=2**4)
    (tmp_path / "pass").write_text("pass phrase\n")
    monkeypatch.setenv("TPUMARKET_CLIENT_KEYSTORE", str(tmp_path / "client.json"))
    monkeypatch.setenv("TPUMARKET_PASSPHRASE_FILE", str(tmp_path / "pass"))
    assert load_settings().key_text() == key
    (tmp_path / "pass").write_text("wrong\n")
    with pytest.raises(KeystoreError):
        load_settings().key_text()
