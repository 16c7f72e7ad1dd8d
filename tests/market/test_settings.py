"""Market settings from the environment: every limit and TTL settable, flags win, a bad value
is a one-line `MarketConfigError` (exit 2 from `market serve`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from market.errors import MarketConfigError
from market.settings import PREFIX, Settings
from tests.deployment_sample import SAMPLE, write_sample

from .conftest import ROOT


def _other(value: Any, name: str = "") -> Any:
    """A value of the same kind as a default, but not it."""
    if name == "trusted_proxies":  # addresses or networks only
        return "10.0.0.0/8"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if value is None:
        return 3
    return "elsewhere"


@pytest.mark.parametrize("name", sorted(set(Settings.model_fields) - {"deployment"}))
def test_from_env_when_a_setting_is_in_the_environment_then_it_is_used(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = Settings.model_fields[name].default
    wanted = _other(default, name)
    monkeypatch.setenv(
        PREFIX + name.upper(), str(wanted).lower() if isinstance(wanted, bool) else str(wanted)
    )
    got = getattr(Settings.from_env(), name)
    assert (got == wanted or str(got) == str(wanted)) and got != default


def test_from_env_when_older_names_are_set_then_they_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MARKET_CHAIN_ID", "9")
    monkeypatch.setenv("MARKET_FROM_BLOCK", "41")
    monkeypatch.setenv("MARKET_FILLS_RETENTION_DAYS", "2.5")
    monkeypatch.setenv("DATABASE_URL", "")  # empty: unset
    settings = Settings.from_env()
    assert (settings.chain_id, settings.index_from_block) == (9, 41)
    assert settings.fills_retention_days == 2.5 and settings.database_url is None


def test_from_env_when_a_flag_is_given_then_it_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PREFIX + "MAX_BATCH", "12")
    monkeypatch.setenv(PREFIX + "RATE_PER_IP", "7")
    settings = Settings.from_env(max_batch=5, rate_per_ip=None)
    assert (settings.max_batch, settings.rate_per_ip) == (5, 7.0)


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("MAX_BATCH", "many", "valid integer"),  # int
        ("MAX_BATCH", "0", "greater than 0"),
        ("KEEP_ALIVE_S", "soon", "valid number"),  # float
        ("RATE_PER_ADDRESS", "-1", "greater than or equal to 0"),
        ("REQUIRE_FUNDS", "perhaps", "valid boolean"),  # bool
        ("INDEX_FROM_BLOCK", "genesis", "valid integer"),  # optional int
        ("ORDERS_RETENTION_DAYS", "0", "greater than 0"),  # optional float
        ("CHAIN_ID", "-5", "greater than 0"),
    ],
)
def test_from_env_when_a_value_is_bad_then_config_error_names_it(
    variable: str, value: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PREFIX + variable, value)
    with pytest.raises(MarketConfigError) as caught:
        Settings.from_env()
    message = str(caught.value)
    assert PREFIX + variable in message and problem in message and repr(value) in message
    assert "\n" not in message


def test_serve_when_a_setting_is_bad_then_exit_2_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, PREFIX + "MAX_STREAMS": "lots"}
    done = subprocess.run(
        [sys.executable, "-m", "market.cli", "market", "serve", "--data-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: market setting max_streams")


def test_from_env_when_a_deployment_file_is_named_then_escrow_chain_and_block_come_from_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = SAMPLE
    path = write_sample(tmp_path / "deployment.json")
    monkeypatch.setenv(PREFIX + "DEPLOYMENT", str(path))
    settings = Settings.from_env()
    assert (settings.escrow, settings.chain_id, settings.index_from_block) == (
        record["escrow"],
        8453,
        77,
    )
    monkeypatch.setenv(PREFIX + "CHAIN_ID", "31337")
    with pytest.raises(MarketConfigError, match="deployment file"):
        Settings.from_env()
