"""``tpumarket provider stake | unstake | ask | asks | deals | earnings | status``.

Run in process through :func:`provider.cli.main` against the shared anvil and, for the asks,
a market server started as its own process (as in ``test_quotes``). Each test reads the
daemon's own TOML config, as an operator would.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.chain import free_port
from contracts.messages import KIND_INFERENCE, Ack, Plan, TaskRequest, address_of
from contracts.orders import plan_kind
from provider.asks import REFRESH_FRACTION, live_asks
from provider.cli import main
from provider.config import load_config
from provider.daemon import Daemon, DataDirLock
from provider.receipts import settle_by
from provider.sandbox import Sandbox
from tests import processes
from tests.provider.daemon_support import FUNDS, PENALTY, PLAN, ChainWorld, wait_until

REPO = Path(__file__).resolve().parents[2]
STAKE = 2_000_000


@pytest.fixture(scope="module")
def market_url(chain_world: ChainWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The market server as its own process, indexing the shared escrow."""
    work = tmp_path_factory.mktemp("market")
    port = free_port()
    args = [sys.executable, "-m", "market.cli", "market", "serve", "--port", str(port)]
    args += ["--data-dir", str(work), "--rpc-url", chain_world.anvil.url]
    args += ["--escrow", chain_world.escrow.address, "--chain-id", str(chain_world.domain.chain_id)]
    log = (work / "market.log").open("ab")
    process = processes.spawn(
        args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "DATABASE_URL": ""}
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"market exited: {(work / 'market.log').read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url + "/healthz", timeout=2).status_code == 200
        return False

    try:
        wait_until(up, 120, "the market")
        yield url
    finally:
        processes.stop(process, grace_s=30)
        log.close()


@pytest.fixture
def provider_key(chain_world: ChainWorld) -> str:
    """A fresh provider with tokens in its wallet (no approval, no stake)."""
    key = chain_world.anvil.new_funded_key()
    chain_world.token.mint(chain_world.deployer, address_of(key), FUNDS)
    return key


def write_config(
    path: Path,
    world: ChainWorld,
    key: str,
    *,
    market_url: str | None = None,
    plan: Plan = PLAN,
    top: dict[str, str] | None = None,
) -> Path:
    """Write a daemon config for ``key`` (with an ``[ask]``); ``top`` overrides top-level keys."""
    values: dict[str, str] = {
        "private_key": f'"{key}"',
        "rpc_url": f'"{world.anvil.url}"',
        "escrow": f'"{world.escrow.address}"',
        "data_dir": f'"{path.parent / "data"}"',
        "slo_ms": "30000",
        **(top or {}),
    }
    if market_url is not None:
        values["market_url"] = f'"{market_url}"'
    lines = [f"{k} = {v}" for k, v in values.items()]
    lines += ["[plan]", *(f"{k} = {v}" for k, v in plan.to_json().items() if v)]
    lines += [
        "[ask]",
        "price = 1000",
        "quantity = 4",
        f"stake = {STAKE}",
        f"penalty = {PENALTY}",
        f'arbiter = "{address_of(world.arbiter)}"',
        "challenge_window = 60",
        "expiry_s = 900",
        'device_class = "cpu"',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``tpumarket provider ...``; return the exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def last_json(out: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return value


def test_stake_then_unstake_moves_tokens_with_tables_and_base_units_in_json(
    chain_world: ChainWorld, provider_key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_config(tmp_path / "provider.toml", chain_world, provider_key))
    provider = address_of(provider_key)

    code, out, err = run(capsys, "stake", "2.5", "--config", config, "--json")
    assert (code, err) == (0, "")
    staked = last_json(out)
    assert staked["free_stake"] == "2500000" == str(chain_world.escrow.stake_of(provider))
    assert staked["wallet"] == str(FUNDS - 2_500_000)

    code, out, err = run(capsys, "unstake", "1", "--config", config)
    assert (code, err) == (0, "")
    assert "unstaked 1.000000 tokens" in out
    assert [line.split() for line in out.splitlines() if line.startswith("free_stake")] == [
        ["free_stake", "1.500000"]
    ]
    assert chain_world.escrow.stake_of(provider) == 1_500_000


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("unstake", "5"), "cannot unstake 5.000000 tokens: the free stake is 0.000000"),
        (("stake", "1e12"), "cannot stake 1000000000000.000000 tokens: the wallet holds"),
        (("stake", "0.0000001"), "amount has more than 6 decimals"),
        (("ask",), "the free stake (0.000000 tokens) cannot cover one deal's stake"),
    ],
)
def test_bad_amounts_then_one_line_error_and_exit_2(
    chain_world: ChainWorld,
    provider_key: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    expected: str,
) -> None:
    config = str(write_config(tmp_path / "provider.toml", chain_world, provider_key))
    code, out, err = run(capsys, *argv, "--config", config)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert expected in err


@pytest.mark.parametrize(
    ("change", "code", "expected"),
    [
        ({"private_key": '"0x1234"'}, 2, "error: private key is not a secp256k1 key"),
        ({"rpc_url": '"http://127.0.0.1:9"'}, 1, "error: no JSON-RPC endpoint answers at"),
        ({"escrow": '"0x00000000000000000000000000000000000000aa"'}, 2, "error: no contract at"),
        ({"escrow": '"not-an-address"'}, 2, "error: escrow: not an address"),
        ({"escrow": "TOKEN"}, 2, "is not a tpumarket escrow"),
    ],
)
def test_bad_key_escrow_or_chain_then_one_line_error_without_traceback(
    chain_world: ChainWorld,
    provider_key: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, str],
    code: int,
    expected: str,
) -> None:
    if change.get("escrow") == "TOKEN":
        change = {"escrow": f'"{chain_world.token.address}"'}
    config = write_config(tmp_path / "provider.toml", chain_world, provider_key, top=change)
    for command in ("status", "deals", "earnings"):
        got, out, err = run(capsys, command, "--config", str(config))
        assert (got, out) == (code, "")
        assert len(err.strip().splitlines()) == 1, err
        assert expected in err and "Traceback" not in err


def test_ask_then_asks_lists_it_on_the_market_in_tokens_and_base_units(
    chain_world: ChainWorld,
    provider_key: str,
    market_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = str(
        write_config(tmp_path / "provider.toml", chain_world, provider_key, market_url=market_url)
    )
    assert run(capsys, "stake", "2", "--config", config)[0] == 0

    code, out, err = run(capsys, "ask", "--config", config, "--price", "0.002", "--json")
    assert (code, err) == (0, "")
    posted = last_json(out)
    assert posted["state"] == "open" and posted["price"] == "2000"

    code, out, err = run(capsys, "asks", "--config", config, "--json")
    assert (code, err) == (0, "")
    listed = last_json(out)["asks"]
    assert [(a["order_id"], a["device_class"], a["price"], a["remaining"]) for a in listed] == [
        (posted["order_id"], "cpu", "2000", 4)
    ]
    order = httpx.get(f"{market_url}/v1/orders/{posted['order_id']}", timeout=10).json()
    assert order["quote"]["client"] == "0x" + "0" * 40
    assert order["plan"] == plan_kind(PLAN) and order["quote"]["stake"] == STAKE

    code, out, err = run(capsys, "asks", "--config", config)
    assert code == 0
    assert "0.002000" in out and "0/4" not in out and "4/4" in out


def test_deals_and_earnings_when_a_fee_is_paid_and_a_task_refunded_then_each_counted(
    chain_world: ChainWorld, provider_key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = chain_world
    world.token.approve(provider_key, world.escrow.address, 2**256 - 1)
    plan = Plan(compile_price=1_000, inference_price=500, reservation_fee=300)
    config = str(write_config(tmp_path / "provider.toml", world, provider_key, plan=plan))
    deal_id = world.open_deal(provider=provider_key, plan=plan, max_spend=10_000)
    request = TaskRequest(
        deal_id=deal_id,
        task_index=0,
        kind=KIND_INFERENCE,
        program_hash=b"\1" * 32,
        input_hash=b"\2" * 32,
        max_price=500,
        deadline=world.chain_time() + 30,
    )
    ack = Ack(deal_id=deal_id, task_index=0, request_hash=request.struct_hash(), price=500)
    deal = world.escrow.get_deal(deal_id)
    world.advance_to(settle_by(request.deadline, deal.expiry, deal.challenge_window) + 1)
    world.escrow.refund_breach(world.client, request, ack, ack.sign(world.domain, provider_key))

    code, out, err = run(capsys, "deals", "--config", config, "--json")
    assert (code, err) == (0, "")
    [listed] = last_json(out)["deals"]
    assert listed["deal_id"] == deal_id and listed["status"] == "open"
    assert listed["client"] == address_of(world.client) and listed["max_spend"] == "10000"

    code, out, err = run(capsys, "earnings", "--config", config, "--json")
    assert (code, err) == (0, "")
    money = last_json(out)
    assert money["total"] == {
        "paid": "300",
        "pending": "0",
        "penalties": str(PENALTY),
        "refunded": "500",
        "tasks_refunded": 1,
        "net": str(300 - PENALTY),
    }
    code, out, _ = run(capsys, "earnings", "--config", config)
    total = [line.split() for line in out.splitlines() if line.startswith("total")]
    assert total == [["total", "0.000300", "0.000000", "0.050000", "0.000500", "(1", "tasks)",
                      "-0.049700"]]  # fmt: skip


def test_status_names_the_daemon_holding_the_data_dir_and_the_chain_head(
    chain_world: ChainWorld, provider_key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_config(tmp_path / "provider.toml", chain_world, provider_key))
    (tmp_path / "data").mkdir()

    code, out, err = run(capsys, "status", "--config", config, "--json")
    assert (code, err) == (0, "")
    idle = last_json(out)
    assert idle["daemon_pid"] is None and idle["daemon_health"] == "unreachable"
    assert idle["provider"] == address_of(provider_key)
    assert idle["block"] == chain_world.chain.w3.eth.block_number

    lock = DataDirLock(tmp_path / "data")  # as a running daemon holds it
    try:
        code, out, _ = run(capsys, "status", "--config", config)
    finally:
        lock.release()
    assert code == 0 and f"running, pid {os.getpid()}" in out


def test_daemon_with_an_ask_in_its_config_posts_it_at_start_and_a_fresh_one_before_it_ends(
    chain_world: ChainWorld,
    provider_key: str,
    market_url: str,
    sandbox: Sandbox,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    world = chain_world
    path = write_config(tmp_path / "provider.toml", world, provider_key, market_url=market_url)
    assert run(capsys, "stake", "2", "--config", str(path))[0] == 0
    config = load_config(path).replace(jax_platforms="cpu", benchmark_on_start=False, ask=None)
    terms = load_config(path).ask
    assert terms is not None
    node = Daemon(
        config.replace(ask=terms.replace(device_class=None)),
        chain=world.chain,
        sandbox=sandbox,
    )
    try:
        node.start(schedule=False)  # posts the ask for the class of the devices it runs on
        assert node.asks is not None and node.capacity is not None
        sold = ["cpu"] + (["compile-v5e"] if node.capacity.compile_targets else [])
        assert list(node.asks.device_classes) == sold
        first = {a["device_class"]: a for a in live_asks(market_url, address_of(provider_key))}
        assert sorted(first) == sorted(sold)
        assert {int(a["quantity"]) for a in first.values()} == {terms.quantity}
        assert node.asks.run() == []  # live long enough: nothing posted

        ends = min(int(a["expiry"]) for a in first.values())
        world.advance_to(ends - terms.expiry_s // REFRESH_FRACTION)
        posted = [o["order"] for o in node.asks.run()]
        assert sorted(o["device_class"] for o in posted) == sorted(sold)
        for order in posted:
            old = first[order["device_class"]]
            assert order["order_id"] != old["order_id"]
            assert int(order["expiry"]) >= int(old["expiry"]) + terms.expiry_s // REFRESH_FRACTION
        assert node.metrics.registry.get_sample_value(
            "tpumarket_provider_asks_total", {"result": "posted"}
        ) == 2 * len(sold)
    finally:
        node.close()
