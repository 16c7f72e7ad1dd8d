"""The daemon's settings: a real TOML file under real ``TPUMARKET_PROVIDER_*`` variables.

Precedence (the environment wins key by key, a plan variable replaces the file's plan), every
class of bad value as one ConfigError line naming the key and the variable or file it came
from, and the private key absent from every repr, str, log line and error.
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path

import pytest

from contracts.messages import Plan, address_of
from provider.cli import main
from provider.config import AskConfig, ProviderConfig, SettlementConfig, load_config, to_address
from provider.errors import ConfigError

KEY = "0x" + "5a" * 32
OTHER_KEY = "0x" + "6b" * 32
ARBITER = "0x" + "ab" * 20
PREFIX = "TPUMARKET_PROVIDER_"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start from an environment without the provider's variables (the test sets its own)."""
    for name in list(os.environ):
        if name.startswith(PREFIX):
            monkeypatch.delenv(name)


def write_toml(tmp_path: Path, body: str = "", *, key: str | None = KEY) -> Path:
    path = tmp_path / "provider.toml"
    head = f'private_key = "{key}"\n' if key is not None else ""
    head += f'rpc_url = "http://file"\nescrow = "0x{"22" * 20}"\ndata_dir = "{tmp_path}"\n'
    path.write_text(head + body)
    return path


def config_error(path: Path | None, monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    """Set ``env`` for real, load, and return the ConfigError's message (one line)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    error = raised.value  # no chained parser or validation error shows under it
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    message = str(raised.value)
    assert "\n" not in message and message
    return message


# ---- sources and precedence ---------------------------------------------------------------


def test_env_wins_over_the_file_key_by_key_in_every_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_toml(
        tmp_path,
        "slo_ms = 5000\npool_size = 2\nport = 9000\nsandbox_validators = 3\n"
        "[plan]\ninference_price = 7\ncompile_price = 3\n"
        "[settlement]\ninterval_s = 12\nquote_valid_s = 300\n"
        f'[ask]\nprice = 7\nquantity = 3\nstake = 9\npenalty = 1\narbiter = "{ARBITER}"\n',
    )
    monkeypatch.setenv(f"{PREFIX}PRIVATE_KEY", OTHER_KEY)
    monkeypatch.setenv(f"{PREFIX}SLO_MS", "3000")
    monkeypatch.setenv(f"{PREFIX}BENCHMARK_ON_START", "false")
    monkeypatch.setenv(f"{PREFIX}SANDBOX_VALIDATOR_SPARES", "0")
    monkeypatch.setenv(f"{PREFIX}SETTLEMENT_REDEEM_THRESHOLD", "99")
    monkeypatch.setenv(f"{PREFIX}SETTLEMENT_INTERVAL_S", "0.5")
    monkeypatch.setenv(f"{PREFIX}ASK_QUANTITY", "5")
    monkeypatch.setenv(f"{PREFIX}ask_device_class", "tpu-v5e")  # the key part in any case
    monkeypatch.setenv(f"{PREFIX}CONFIG", str(path))  # names the file: no key
    config = load_config(path)
    assert config.private_key == OTHER_KEY and config.address == address_of(OTHER_KEY)
    assert (config.slo_ms, config.slo_s, config.pool_size, config.port) == (3000, 3, 2, 9000)
    assert config.benchmark_on_start is False and config.rpc_url == "http://file"
    assert (config.sandbox_spares, config.sandbox_validators) == (None, 3)
    assert config.sandbox_validator_spares == 0
    assert config.plan == Plan(inference_price=7, compile_price=3)
    assert config.settlement == SettlementConfig(
        interval_s=0.5, quote_valid_s=300, redeem_threshold=99
    )
    assert config.ask == AskConfig(
        price=7, quantity=5, stake=9, penalty=1, arbiter=ARBITER, device_class="tpu-v5e"
    )
    assert config.ask.arbiter == to_address(ARBITER)
    assert config.data_dir == tmp_path and isinstance(config.data_dir, Path)


def test_plan_variable_replaces_the_files_whole_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_toml(tmp_path, "[plan]\ninference_price = 7\ncompile_price = 3\n")
    monkeypatch.setenv(f"{PREFIX}PLAN", '{"compile_price": 9, "outcome_based": true}')
    assert load_config(path).plan == Plan(compile_price=9, outcome_based=True)


def test_defaults_hold_where_neither_file_nor_env_sets_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(write_toml(tmp_path))
    assert (config.slo_ms, config.pool_size, config.host, config.port) == (
        2000,
        1,
        "127.0.0.1",
        8700,
    )
    assert config.plan == Plan() and config.settlement == SettlementConfig()
    assert config.ask is None and config.output_memory_bytes is None
    assert config.settlement.min_window_s() == 30  # (5 + 10) / 0.5
    sandbox = (config.sandbox_spares, config.sandbox_validators, config.sandbox_validator_spares)
    assert sandbox == (None, 2, 1)  # a spare worker for pool_size 1, 2 validators and a spare


def test_key_from_a_file_yields_to_a_key_set_directly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "provider.key"
    key_file.write_text(OTHER_KEY + "\n")
    path = write_toml(tmp_path, f'private_key_file = "{key_file}"\n', key=None)
    assert load_config(path).private_key == OTHER_KEY
    monkeypatch.setenv(f"{PREFIX}PRIVATE_KEY", KEY)
    assert load_config(path).private_key == KEY
    monkeypatch.delenv(f"{PREFIX}PRIVATE_KEY")
    monkeypatch.setenv(f"{PREFIX}PRIVATE_KEY_FILE", str(tmp_path / "missing.key"))
    message = config_error(path, monkeypatch)
    assert "cannot read private_key_file" in message and "missing.key" in message


def test_a_config_built_directly_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"{PREFIX}PORT", "1")
    monkeypatch.setenv(f"{PREFIX}BOGUS", "1")
    config = ProviderConfig(private_key=KEY, rpc_url="x", escrow="y", data_dir=Path("z"))
    assert config.port == 8700 and config.private_key == KEY


def test_retired_settlement_keys_from_file_or_env_are_ignored_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_toml(tmp_path, "[settlement]\nsilent_after_s = 86400\ninterval_s = 7\n")
    monkeypatch.setenv(f"{PREFIX}SETTLEMENT_EXPIRY_MARGIN_S", "300")
    with caplog.at_level("WARNING", logger="provider.config"):
        config = load_config(path)
    assert config.settlement == SettlementConfig(interval_s=7)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "silent_after_s is ignored" in warned and "expiry_margin_s is ignored" in warned


def test_replace_validates_the_changes_and_keeps_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_toml(
        tmp_path,
        f'[ask]\nprice = 7\nquantity = 3\nstake = 9\npenalty = 1\narbiter = "{ARBITER}"\n',
    )
    config = load_config(path)
    moved = config.replace(port=9100, data_dir=tmp_path / "elsewhere")
    assert (moved.port, moved.private_key, moved.ask) == (9100, KEY, config.ask)
    assert config.port == 8700  # frozen: the original is unchanged
    with pytest.raises(ConfigError, match="port: Input should be less than or equal to 65535"):
        config.replace(port=70_000)
    assert config.ask is not None
    with pytest.raises(ConfigError, match=r"ask\.quantity must be positive, got 0"):
        config.ask.replace(quantity=0)
    with pytest.raises(ConfigError, match=r"settlement\.margin_fraction must be in"):
        config.settlement.replace(margin_fraction=2)


# ---- bad values: one ConfigError line naming the key and its source -----------------------


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("PORT", "eighty", "port: Input should be a valid integer"),
        ("PORT", "70000", "port: Input should be less than or equal to 65535"),
        ("POOL_SIZE", "0", "pool_size must be at least 1"),
        ("SLO_MS", "10", "slo_ms must be at least 1000"),
        ("BENCHMARK_ON_START", "maybe", "benchmark_on_start: Input should be a valid boolean"),
        ("HEARTBEAT_INTERVAL_S", "0", "heartbeat_interval_s: Input should be greater than 0"),
        ("QUOTE_POLL_S", "inf", "quote_poll_s: Input should be a finite number"),
        ("OUTPUT_MEMORY_BYTES", "-5", "output_memory_bytes must be >= 0"),
        ("KEEP_ALIVE_S", "0", "keep_alive_s must be positive"),
        ("SANDBOX_SPARES", "-1", "sandbox_spares must not be negative"),
        ("SANDBOX_VALIDATORS", "0", "sandbox_validators must be at least 1"),
        ("SANDBOX_VALIDATOR_SPARES", "-2", "sandbox_validator_spares must not be negative"),
        ("LOG_LEVEL", "loud", "log_level must be one of"),
        ("SETTLEMENT_INTERVAL_S", "nan", "settlement.interval_s: Input should be a finite"),
        ("SETTLEMENT_CLAIM_BATCH_MAX", "1.5", "settlement.claim_batch_max: Input should be"),
        ("SETTLEMENT_MARGIN_FRACTION", "1.5", "settlement.margin_fraction must be in (0, 1]"),
        ("SETTLEMENT_START_BLOCK", "-1", "settlement.start_block must not be negative"),
        ("ASK_ARBITER", "0x1234", "ask.arbiter is not an address"),
        ("ASK_PRICE", "0", "ask.price must be positive"),
        ("ASK_STAKE", "-1", "ask.stake must not be negative"),
        ("ASK_COMPILE_CHECKS", "often", "ask.compile_checks: Input should be a valid boolean"),
    ],
)
def test_a_bad_variable_is_a_config_error_naming_it_and_its_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    path = write_toml(
        tmp_path,
        f'[ask]\nprice = 7\nquantity = 3\nstake = 9\npenalty = 1\narbiter = "{ARBITER}"\n',
    )
    message = config_error(path, monkeypatch, **{PREFIX + variable: value})
    assert expected in message
    assert f"got {value!r}" in message and message.endswith(f"(from {PREFIX}{variable})")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("port = 'eighty'\n", "port: Input should be a valid integer, unable to parse"),
        ("pool_size = 1.5\n", "pool_size: Input should be a valid integer"),
        ("sandbox_spares = -1\n", "sandbox_spares must not be negative, got -1"),
        ("sandbox_validator_spares = -1\n", "sandbox_validator_spares must not be negative"),
        ("sandbox_validators = 0\n", "sandbox_validators must be at least 1, got 0"),
        ("[settlement]\ninterval_s = -1\n", "settlement.interval_s must be positive, got -1"),
        ("[plan]\ncompile_price = 'lots'\n", "plan.compile_price: Input should be a valid integer"),
        ("[plan]\ncache_hit_discount_bps = 20000\n", "plan has a discount above 100%"),
        ('[ask]\nprice = 7\nquantity = 3\nstake = 9\npenalty = 1\narbiter = "x"\n', "ask.arbiter"),
    ],
)
def test_a_bad_file_value_is_a_config_error_naming_the_key_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, expected: str
) -> None:
    path = write_toml(tmp_path, body)
    message = config_error(path, monkeypatch)
    assert expected in message and message.endswith(f"(from {path})")


def test_unknown_keys_are_refused_by_table_naming_their_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_toml(tmp_path, "bogus = 1\n[settlement]\nwhat = 2\n")
    message = config_error(path, monkeypatch, **{f"{PREFIX}SETTLEMENT_HOW": "3"})
    assert f"unknown config keys ['bogus'] (from {path})" in message
    assert "unknown settlement keys ['how', 'what']" in message
    assert f"{PREFIX}SETTLEMENT_HOW" in message
    message = config_error(
        None, monkeypatch, **{f"{PREFIX}BOGUS": "1", f"{PREFIX}PRIVATE_KEY": KEY}
    )
    assert f"unknown config keys ['bogus'] (from {PREFIX}BOGUS)" in message


def test_missing_keys_are_named_with_their_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = config_error(None, monkeypatch, **{f"{PREFIX}RPC_URL": "http://x"})
    assert "config lacks ['data_dir', 'escrow', 'private_key']" in message
    assert f"{PREFIX}PRIVATE_KEY" in message and f"{PREFIX}DATA_DIR" in message
    path = write_toml(tmp_path, "[ask]\nprice = 7\n")
    message = config_error(path, monkeypatch)
    assert "ask lacks ['arbiter', 'penalty', 'quantity', 'stake']" in message
    assert f"{PREFIX}ASK_PENALTY" in message


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        ("{compile_price: 1", f"{PREFIX}PLAN is not valid JSON"),
        ("", f"{PREFIX}PLAN is not valid JSON"),
        ("[1, 2]", f"{PREFIX}PLAN must be a JSON object of plan fields"),
        ('{"what": 1}', f"plan has unknown fields ['what'] (from {PREFIX}PLAN)"),
        ('{"compile_price": 1.5}', "plan.compile_price: Input should be a valid integer"),
        ('{"outcome_based": "perhaps"}', "plan.outcome_based: Input should be a valid boolean"),
    ],
)
def test_a_bad_plan_variable_is_a_config_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: str, expected: str
) -> None:
    message = config_error(write_toml(tmp_path), monkeypatch, **{f"{PREFIX}PLAN": plan})
    assert expected in message and f"{PREFIX}PLAN" in message


@pytest.mark.parametrize(
    "text",
    ['rpc_url = "unterminated\n', "= 1\n", "[settlement\n", b"\xff\xfe = 1\n"],
)
def test_a_file_that_does_not_parse_is_a_config_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str | bytes
) -> None:
    path = tmp_path / "provider.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert config_error(path, monkeypatch).startswith(f"cannot read config {path}: ")
    missing = tmp_path / "absent.toml"
    assert config_error(missing, monkeypatch) == f"cannot read config {missing}: no such file"


def test_sections_built_directly_raise_config_errors_not_validation_errors() -> None:
    with pytest.raises(ConfigError, match=r"settlement.interval_s must be positive, got 0"):
        SettlementConfig(interval_s=0)
    with pytest.raises(ConfigError, match=r"unknown settlement keys \['nope'\]"):
        SettlementConfig(nope=1)
    with pytest.raises(ConfigError, match=r"ask.arbiter is not an address .*; ask lacks"):
        AskConfig(price=1, quantity=1, stake=1, arbiter="0x12")
    with pytest.raises(ConfigError, match=r"slo_ms must be at least 1000"):
        ProviderConfig(private_key=KEY, rpc_url="x", escrow="y", data_dir=Path("z"), slo_ms=5)


# ---- the key: never in a repr, str, log line or error --------------------------------------


def _digits(key: str) -> str:
    return key.removeprefix("0x").lower()


def test_the_key_is_in_no_repr_str_or_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"{PREFIX}PRIVATE_KEY", OTHER_KEY)
    config = load_config(write_toml(tmp_path, key=None))
    assert config.private_key == OTHER_KEY
    shown = [repr(config), str(config), f"{config}", config.model_dump_json()]
    shown += [repr(config.secret_key), str(config.secret_key), repr(config.model_dump())]
    for text in shown:
        assert _digits(OTHER_KEY) not in text.lower()
    assert "rpc_url='http://file'" in repr(config) and "**********" in repr(config)


@pytest.mark.parametrize(
    "key",
    [
        "0x" + "ff" * 32,  # 64 hex digits above the curve's order
        "0x" + "5a" * 31 + "zz",  # not hex
        "0x" + "5a" * 33,  # too long
    ],
)
def test_a_bad_key_is_a_config_error_that_does_not_show_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    message = config_error(
        write_toml(tmp_path, key=None), monkeypatch, **{f"{PREFIX}PRIVATE_KEY": key}
    )
    assert message.startswith("private key is not a secp256k1 key")
    assert message.endswith(f"(from {PREFIX}PRIVATE_KEY)")
    assert _digits(key)[:20] not in message.lower()
    with pytest.raises(ConfigError) as raised:
        ProviderConfig(private_key=key, rpc_url="x", escrow="y", data_dir=Path("z"))
    assert _digits(key)[:20] not in str(raised.value).lower()


def test_errors_tracebacks_and_debug_logs_of_a_failed_load_do_not_show_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PYDANTIC_SETTINGS_DEBUG", "1")  # the library logs each source's values
    path = write_toml(tmp_path, "port = 'x'\nbogus = 1\n[settlement]\ninterval_s = 0\n")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    texts = ["".join(traceback.format_exception(raised.value)), str(raised.value)]
    context = raised.value.__context__
    texts.append(repr(context) + str(context))  # the suppressed validation error, too
    texts += [f"{r.getMessage()} {vars(r)}" for r in caplog.records]
    assert any(r.name == "pydantic_settings" for r in caplog.records)  # the debug lines ran
    for text in texts:
        assert _digits(KEY) not in text.lower()


def test_daemon_cli_with_a_bad_variable_exits_2_with_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_toml(tmp_path)
    monkeypatch.setenv(f"{PREFIX}SETTLEMENT_QUOTE_VALID_S", "soon")
    code = main(["run", "--config", str(path)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.startswith("error: settlement.quote_valid_s: Input should be a valid number")
    assert err.strip().endswith(f"(from {PREFIX}SETTLEMENT_QUOTE_VALID_S)")
    assert len(err.strip().splitlines()) == 1 and _digits(KEY) not in err.lower()


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_daemon_cli_with_a_port_out_of_range_exits_2_with_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str
) -> None:
    code = main(["run", "--config", str(write_toml(tmp_path)), "--port", port])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.startswith("error: port") and len(err.strip().splitlines()) == 1, err
