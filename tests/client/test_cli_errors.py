"""Bad input and failing parties: one line on stderr, exit 2 for input, 1 for remote, 130 Ctrl-C.

The `tpumarket` entry point runs in-process (`contracts.cli.main`, the `client` commands
registered as pyproject does) or as a subprocess (`python -m ...`, Ctrl-C, `--version`, the
market and the provider daemon), against the session's real anvil and escrow.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import contracts.cli
from client.cli import register
from client.models import export_jax
from contracts.chain import free_port
from programs.envelope import encode_arrays, encode_envelope
from tests import processes
from tests.contracts.conftest import World

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class _Entry:
    name: str

    def load(self) -> Any:
        return register


@pytest.fixture(autouse=True)
def _client_entry_point(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(contracts.cli, "entry_points", lambda group: [_Entry("client")])
    for name in ("TPUMARKET_CLIENT_KEY", "TPUMARKET_ESCROW", "TPUMARKET_MARKET_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPUMARKET_CLIENT_STATE", str(tmp_path / "client-state"))


def _one_error(err: str) -> str:
    """Return the single `error: ...` line of stderr; fail on a traceback or more lines."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _chain(world: World) -> list[str]:
    return ["--rpc-url", world.anvil.url, "--escrow", world.escrow.address]


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("notakey", "expected 0x and 64 hex digits, got 7 characters"),
        ("0x" + "00" * 32, "it must be between 1 and the curve order"),
        ("0x1234", "expected 0x and 64 hex digits, got 4 hex digits"),  # never padded
        ("0x" + "ff" * 32, "it must be between 1 and the curve order"),
        ("0x" + "ab" * 33, "expected 0x and 64 hex digits, got 66 hex digits"),
    ],
)
def test_key_that_is_not_a_private_key_exits_2_in_one_line_without_echoing_it(
    world: World, capsys: pytest.CaptureFixture[str], key: str, why: str
) -> None:
    assert contracts.cli.main(["client", "balances", *_chain(world), "--key", key]) == 2
    line = _one_error(capsys.readouterr().err)
    assert line == f"error: --key is not a private key: {why}"
    assert key.removeprefix("0x") not in line


def test_key_from_the_environment_is_checked_too(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUMARKET_CLIENT_KEY", "0x1234")
    assert contracts.cli.main(["client", "balances", *_chain(world)]) == 2
    assert _one_error(capsys.readouterr().err).startswith(
        "error: TPUMARKET_CLIENT_KEY is not a private key"
    )


def test_escrow_that_is_not_an_escrow_exits_2_and_an_unreachable_chain_exits_1(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    key = ["--key", world.clients[0], "--rpc-url", world.anvil.url]
    cases = [
        ("0x123", "error: --escrow is not an address: '0x123' (expected 0x and 40 hex digits)"),
        (world.addr(world.clients[1]), "has no contract code on chain 31337"),
        (world.token.address, "is a contract but not a tpumarket escrow"),
    ]
    for escrow, why in cases:
        assert contracts.cli.main(["client", "balances", *key, "--escrow", escrow]) == 2
        assert why in _one_error(capsys.readouterr().err)
    dead = ["--rpc-url", f"http://127.0.0.1:{free_port()}", "--escrow", world.escrow.address]
    assert contracts.cli.main(["client", "balances", "--key", world.clients[0], *dead]) == 1
    assert "no JSON-RPC endpoint answers" in _one_error(capsys.readouterr().err)


def test_bid_without_free_balance_says_what_it_needs_in_tokens(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    key = world.anvil.new_funded_key()
    bid = ["--device-class", "cpu", "--quantity", "3", "--price", "0.02"]
    market = ["--market-url", f"http://127.0.0.1:{free_port()}"]  # never asked
    argv = ["client", "bid", *_chain(world), "--key", key, *market, *bid]
    assert contracts.cli.main(argv) == 1
    line = _one_error(capsys.readouterr().err)
    assert "a bid of 3 x 0.020000 needs 0.060000 tokens free in the escrow" in line
    assert "has 0.000000: `tpumarket client deposit 0.060000` first" in line


def test_deal_ids_of_either_form_are_checked_at_the_door(
    world: World, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key = ["--key", world.clients[0]]
    program = tmp_path / "p.tpmp"
    program.write_bytes(b"")
    for deal, code, why in (
        ("seven", 2, "not a deal id: 'seven'"),
        ("cpu:1", 2, "cpu:1 is a market deal id: pass --market-url"),
        ("0", 2, "not a deal id: '0'"),
    ):
        argv = ["job", "status", *_chain(world), *key, "--deal", deal]
        assert contracts.cli.main(argv) == code
        assert why in _one_error(capsys.readouterr().err)
    assert contracts.cli.main(["client", "open", "1", *_chain(world), *key]) == 2
    assert "1 is a chain deal id: `client open` opens a match" in capsys.readouterr().err
    assert contracts.cli.main(["client", "close", "999", *_chain(world), *key]) == 2
    assert _one_error(capsys.readouterr().err) == "error: no deal 999 on this escrow"


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real program file: weights (3,), one input (batch, 2) float32."""

    def fn(w: Any, x: Any) -> Any:
        return x * w.sum()

    model = export_jax(
        fn,
        weights=np.ones(3, np.float32),
        example_inputs=[np.zeros((4, 2), np.float32)],
        batch_dim="batch",
    )
    path = tmp_path_factory.mktemp("program") / "p.tpmp"
    path.write_bytes(encode_envelope(model.example_envelope()))
    return path


def test_bad_files_and_inputs_that_do_not_fit_the_program_exit_2_before_anything_is_sent(
    world: World, capsys: pytest.CaptureFixture[str], tmp_path: Path, program: Path
) -> None:
    def run(*files: str, prog: Path = program) -> str:
        # No deal 1, no provider: the files are checked before either is asked.
        argv = ["job", "run", *_chain(world), "--key", world.clients[0], "--deal", "1"]
        argv += ["--program", str(prog), "--inputs", *files]
        assert contracts.cli.main(argv) == 2
        return _one_error(capsys.readouterr().err)

    assert "not a readable program envelope" in run(prog=tmp_path / "missing.tpmp")
    junk = tmp_path / "junk.tpmp"
    junk.write_bytes(b"TPMP not an envelope")
    assert "not a readable program envelope" in run(prog=junk)
    assert "not a safetensors or npz file" in run(str(tmp_path / "missing.safetensors"))
    good, bad = tmp_path / "good.npz", tmp_path / "bad.safetensors"
    np.savez(good, **{"1": np.ones((3, 2), np.float32)})
    for arrays, why in (
        ({"1": np.ones((3, 5), np.float32)}, "axis 1 must be 2"),
        ({"1": np.ones((3, 2), np.float64)}, "got dtype float64, expected float32"),
        ({"2": np.ones((3, 2), np.float32)}, "missing inputs ['1']"),
        ({"1": np.ones((3, 2), np.float32), "7": np.ones(1, np.float32)}, "['7'] are not inputs"),
    ):
        bad.write_bytes(encode_arrays(arrays))
        line = run(str(good), str(bad))
        assert line.startswith(f"error: {bad}: ") and why in line, line
    assert not (tmp_path / "client-state").exists() or not any(
        (tmp_path / "client-state").iterdir()
    )  # no deal ledger: nothing was signed or sent


def _default_sigint() -> None:
    """In the child before it runs: SIGINT back to its default disposition. A test run started
    in the background by a shell (`make test &`) has SIGINT ignored, which Python keeps, so a
    Ctrl-C test would otherwise depend on how the suite was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _python(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return processes.spawn(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


@pytest.fixture
def silent_chain() -> Iterator[tuple[str, socket.socket]]:
    """An RPC URL whose server accepts connections and never answers (a stalled chain)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", server
    finally:
        server.close()


def test_ctrl_c_while_the_chain_does_not_answer_is_one_line_and_exit_130(
    world: World, silent_chain: tuple[str, socket.socket]
) -> None:
    url, _ = silent_chain
    argv = ["-m", "client.cli", "client", "balances", "--rpc-url", url]
    process = _python(*argv, "--escrow", world.escrow.address, "--key", world.clients[0])
    # Interrupted once it says it waits on this chain (its request sits unanswered in the
    # server's queue): that line proves the wait is this client's, whoever else connects.
    assert process.stderr is not None
    said = []
    for line in process.stderr:
        said.append(line)
        if line.startswith("waiting ") and f"for the chain at {url}" in line:
            break
    else:
        raise AssertionError(f"the client never said it waits on the chain: {said}")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    err = "".join(said) + err
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err


def test_provider_run_refuses_an_escrow_that_is_not_one_in_its_config(
    world: World, tmp_path: Path
) -> None:
    for escrow, code, why in (
        ("0x123", 2, "error: escrow: not an address: '0x123'"),
        (world.addr(world.clients[1]), 2, "no contract at escrow"),
    ):
        config = tmp_path / "provider.toml"
        config.write_text(
            f'rpc_url = "{world.anvil.url}"\nescrow = "{escrow}"\n'
            f'data_dir = "{tmp_path / "data"}"\n[plan]\ninference_price = 1\n'
        )
        process = _python(
            "-m",
            "provider.cli",
            "run",
            "--config",
            str(config),
            env={"TPUMARKET_PROVIDER_PRIVATE_KEY": world.providers[0]},
        )
        _, err = process.communicate(timeout=120)
        assert process.returncode == code, err
        assert why in _one_error(err)


def test_market_serve_refuses_a_chain_id_other_than_its_rpcs(world: World, tmp_path: Path) -> None:
    flags = ["--rpc-url", world.anvil.url, "--escrow", world.escrow.address]
    flags += ["--data-dir", str(tmp_path / "market"), "--port", str(free_port())]
    process = _python("-m", "market.cli", "market", "serve", *flags, "--chain-id", "1")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2 and out == ""
    line = _one_error(err)
    assert line.startswith(f"error: --chain-id 1, but the chain at {world.anvil.url} has chain id")
    assert not (tmp_path / "market").exists()  # refused before storing anything


def test_version_is_the_installed_release() -> None:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "tpumarket"), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "tpumarket 0.1.0"
