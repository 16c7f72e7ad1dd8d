"""The private key stays out of reprs and logs; a bad plan in the environment is a ConfigError."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from provider.config import load_config
from provider.daemon import Daemon
from provider.errors import ConfigError
from provider.sandbox import Sandbox
from tests.provider.daemon_support import ChainWorld, provider_config

KEY_DIGITS = "5a" * 32


def base_env(**extra: str) -> dict[str, str]:
    env = {
        "TPUMARKET_PROVIDER_PRIVATE_KEY": "0x" + KEY_DIGITS,
        "TPUMARKET_PROVIDER_RPC_URL": "http://127.0.0.1:1",
        "TPUMARKET_PROVIDER_ESCROW": "0x" + "22" * 20,
        "TPUMARKET_PROVIDER_DATA_DIR": "/tmp/provider-data",
    }
    env.update(extra)
    return env


def test_config_when_loaded_then_repr_and_str_hide_the_key() -> None:
    config = load_config(None, base_env())
    assert config.private_key == "0x" + KEY_DIGITS
    for text in (repr(config), str(config), f"{config}"):
        assert KEY_DIGITS not in text.lower()
        assert "rpc_url='http://127.0.0.1:1'" in text


def test_config_when_key_read_from_a_file_then_repr_hides_it(tmp_path: Path) -> None:
    key_file = tmp_path / "provider.key"
    key_file.write_text(KEY_DIGITS.upper() + "\n")
    path = tmp_path / "provider.toml"
    path.write_text(
        f'private_key_file = "{key_file}"\nrpc_url = "http://x"\n'
        f'escrow = "0x{"22" * 20}"\ndata_dir = "{tmp_path}"\n'
    )
    config = load_config(path, {})
    assert config.private_key == KEY_DIGITS.upper()
    assert KEY_DIGITS not in repr(config).lower()


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ("{compile_price: 1", "TPUMARKET_PROVIDER_PLAN is not valid JSON"),
        ("", "TPUMARKET_PROVIDER_PLAN is not valid JSON"),
        ("[1, 2]", "TPUMARKET_PROVIDER_PLAN must be a JSON object"),
        ('{"what": 1}', "plan has unknown fields"),
    ],
)
def test_plan_env_when_not_a_json_object_of_plan_fields_then_one_line_config_error(
    plan: str, message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, base_env(TPUMARKET_PROVIDER_PLAN=plan))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_plan_env_when_valid_then_read() -> None:
    config = load_config(None, base_env(TPUMARKET_PROVIDER_PLAN='{"compile_price": 9}'))
    assert config.plan.compile_price == 9


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TPUMARKET_PROVIDER_POOL_SIZE", "two", "pool_size: Input should be a valid integer"),
        ("TPUMARKET_PROVIDER_BENCHMARK_ON_START", "maybe", "benchmark_on_start: Input should be"),
        ("TPUMARKET_PROVIDER_HEARTBEAT_INTERVAL_S", "1e", "heartbeat_interval_s: Input should"),
        ("TPUMARKET_PROVIDER_SETTLEMENT_CLAIM_BATCH_MAX", "1.5", "claim_batch_max: Input should"),
        ("TPUMARKET_PROVIDER_PORT", "eighty", "port: Input should be a valid integer"),
    ],
)
def test_env_value_of_the_wrong_type_is_a_one_line_config_error_naming_the_field(
    variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, base_env(**{variable: value}))
    assert message in str(raised.value) and repr(value) in str(raised.value)
    assert "\n" not in str(raised.value)


def test_env_values_are_validated_by_their_field_types() -> None:
    config = load_config(
        None,
        base_env(
            TPUMARKET_PROVIDER_POOL_SIZE="3",
            TPUMARKET_PROVIDER_BENCHMARK_ON_START="false",
            TPUMARKET_PROVIDER_OUTPUT_MEMORY_BYTES="1000",
            TPUMARKET_PROVIDER_SETTLEMENT_INTERVAL_S="0.5",
        ),
    )
    assert (config.pool_size, config.benchmark_on_start) == (3, False)
    assert (config.output_memory_bytes, config.settlement.interval_s) == (1000, 0.5)
    assert isinstance(config.data_dir, Path)


def test_daemon_start_when_logging_everything_then_no_line_holds_the_key(
    chain_world: ChainWorld,
    sandbox: Sandbox,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = provider_config(chain_world, tmp_path)
    digits = config.private_key.removeprefix("0x").lower()
    caplog.set_level(logging.DEBUG)
    node = Daemon(config, chain=chain_world.chain, sandbox=sandbox)
    try:
        node.start(schedule=False)
    finally:
        node.close()
    assert any(r.getMessage() == "provider daemon started" for r in caplog.records)
    for record in caplog.records:
        line = f"{record.getMessage()} {vars(record)}".lower()
        assert digits not in line, record.getMessage()
