"""The arbiter's settings and its page: one-line errors, a secret key, docs that follow the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provider.arbiter.config import ArbiterSettings, load_settings
from provider.arbiter.rules import DEFAULT_ATOL, DEFAULT_RTOL
from provider.errors import ConfigError
from tests.deployment_sample import SAMPLE, write_sample

DOC = Path(__file__).resolve().parents[2] / "docs" / "arbiter.md"
KEY = "0x" + "11" * 32
ESCROW = "0x" + "22" * 20


def test_the_key_is_shown_by_no_repr_and_bad_values_name_their_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TPUMARKET_ARBITER_KEY", KEY)
    monkeypatch.setenv("TPUMARKET_ARBITER_ESCROW", ESCROW)
    settings = load_settings()
    assert KEY not in repr(settings) and KEY not in str(settings.model_dump())
    assert settings.key.get_secret_value() == KEY
    monkeypatch.setenv("TPUMARKET_ARBITER_EVIDENCE_WINDOW_S", "0")
    with pytest.raises(ConfigError, match=r"evidence_window_s.*EVIDENCE_WINDOW_S"):
        load_settings()
    monkeypatch.delenv("TPUMARKET_ARBITER_EVIDENCE_WINDOW_S")
    config = tmp_path / "arbiter.toml"
    config.write_text("port = 70000\n")
    with pytest.raises(ConfigError, match=f"port.*{re.escape(str(config))}"):
        load_settings(config)
    monkeypatch.setenv("TPUMARKET_ARBITER_KEY", "0x1234")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "0x1234" not in str(caught.value)


def test_the_key_comes_from_a_keystore_or_a_raw_key_never_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from contracts.keystore import write_keystore

    store = tmp_path / "arbiter.json"
    write_keystore(store, KEY, "pass", scrypt_n=2**12)
    secret = tmp_path / "pass"
    secret.write_text("pass\n")
    monkeypatch.setenv("TPUMARKET_ARBITER_ESCROW", ESCROW)
    monkeypatch.delenv("TPUMARKET_ARBITER_KEY", raising=False)
    settings = load_settings(keystore=store, passphrase_file=secret)
    assert settings.private_key() == KEY
    assert "development only" not in capsys.readouterr().err
    monkeypatch.setenv("TPUMARKET_ARBITER_KEY", KEY)
    with pytest.raises(ConfigError, match="exactly one of key"):
        load_settings(keystore=store, passphrase_file=secret)
    assert load_settings().private_key() == KEY
    assert "development only" in capsys.readouterr().err


def _table(heading: str) -> list[list[str]]:
    text = DOC.read_text()
    section = text[text.index(heading) :]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("## "):
            break
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append([c.strip().strip("`") for c in line.strip("|").split("|")])
    return rows[1:]


def test_the_configuration_table_lists_every_setting_with_its_default() -> None:
    rows = {r[0]: r[1] for r in _table("## Configuration")}
    assert set(rows) == set(ArbiterSettings.model_fields)
    for name, field in ArbiterSettings.model_fields.items():
        if field.is_required():
            assert rows[name] == "(required)", name
        elif field.default is None:
            assert rows[name] == "(none)", name
        else:
            assert rows[name] == str(field.default), name


def test_the_tolerance_table_is_the_code_s() -> None:
    rows = {r[0]: (float(r[1]), float(r[2])) for r in _table("## The tolerance")}
    assert rows == {k: (DEFAULT_RTOL[k], DEFAULT_ATOL[k]) for k in DEFAULT_RTOL}


def test_a_deployment_file_gives_escrow_first_block_and_chain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = {**SAMPLE, "deployment_block": 99}
    path = write_sample(tmp_path / "deployment.json", deployment_block=99)
    monkeypatch.setenv("TPUMARKET_ARBITER_KEY", KEY)
    monkeypatch.delenv("TPUMARKET_ARBITER_ESCROW", raising=False)
    settings = load_settings(deployment=path, confirmations=4)
    assert (settings.escrow, settings.from_block, settings.chain_id) == (record["escrow"], 99, 8453)
    assert settings.tx_policy().confirmations == 4
    with pytest.raises(ConfigError, match="not the deployment file's"):
        load_settings(deployment=path, escrow=ESCROW)
