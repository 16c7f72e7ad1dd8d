"""``tpumarket provider balance | withdraw``: a provider takes its earnings out of the escrow.

Against the session's anvil and escrow: a deal is opened, the client's voucher redeemed by the
provider (its earnings enter its free balance in the escrow); the commands read the key and the
escrow from the daemon's TOML config, as an operator would, and every figure is read back from
the chain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contracts.messages import Plan, Voucher, address_of, task_bitmap
from provider.cli import main
from tests.contracts.builders import open_deal
from tests.contracts.conftest import World

PLAN = Plan(compile_price=1_000, inference_price=500, price_per_device_ms=2)
STAKE = 10**6


def _config(tmp_path: Path, world: World, key: str) -> Path:
    path = tmp_path / "provider.toml"
    lines = [
        f'private_key = "{key}"',
        f'rpc_url = "{world.anvil.url}"',
        f'escrow = "{world.escrow.address}"',
        f'data_dir = "{tmp_path / "data"}"',
        "slo_ms = 2000",
        "[plan]",
        *(f"{k} = {v}" for k, v in PLAN.to_json().items() if v),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, (json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}), err


def _earn(world: World, client: str, provider: str, amount: int) -> int:
    """Open a deal and redeem the client's voucher for ``amount``; return the deal's id."""
    deal_id, _ = open_deal(world, client, provider, plan=PLAN, stake=STAKE)
    voucher = Voucher(deal_id, amount, task_bitmap([0]))
    world.escrow.redeem_voucher(provider, voucher, voucher.sign(world.escrow.domain, client))
    return deal_id


def test_provider_balance_shows_earnings_and_stake_and_withdraw_takes_the_earnings_out(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client, provider = world.clients[0], world.providers[0]
    me = address_of(provider)
    world.escrow.stake(provider, STAKE)  # free stake, beside the deal's
    _earn(world, client, provider, 700)
    config = str(_config(tmp_path, world, provider))
    wallet_before = world.token.balance_of(me)

    code, balance, _ = _run(capsys, "balance", "--config", config, "--json")
    assert code == 0
    assert balance["provider"] == me
    assert (balance["free_balance"], balance["earned"], balance["pending_claims"]) == (
        "700",
        "700",
        "0",
    )
    assert (balance["stake_free"], balance["stake_locked"]) == (str(STAKE), str(STAKE))
    assert balance["wallet"] == str(wallet_before)

    code, moved, _ = _run(capsys, "withdraw", "0.0003", "--config", config, "--json")
    assert code == 0 and (moved["amount"], moved["to"], moved["free_balance"]) == ("300", me, "400")
    assert world.escrow.balance_of(me) == 400
    assert world.token.balance_of(me) == wallet_before + 300

    code, moved, _ = _run(capsys, "withdraw", "--config", config, "--json")  # the rest
    assert code == 0 and moved["amount"] == "400"
    assert world.escrow.balance_of(me) == 0
    assert world.token.balance_of(me) == wallet_before + 700

    code, _, err = _run(capsys, "withdraw", "--config", config)
    assert code == 2 and err.strip() == "error: nothing to withdraw: the free balance is 0 tokens"


def test_provider_withdraw_refuses_more_than_the_free_balance_and_moves_nothing(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client, provider = world.clients[1], world.providers[1]
    me = address_of(provider)
    _earn(world, client, provider, 500)
    config = str(_config(tmp_path, world, provider))
    wallet_before = world.token.balance_of(me)

    code, _, err = _run(capsys, "withdraw", "0.000501", "--config", config)
    assert code == 2
    assert err.startswith("error: cannot withdraw 0.000501 tokens: the free balance is 0.000500")
    assert len(err.strip().splitlines()) == 1
    assert world.escrow.balance_of(me) == 500 and world.token.balance_of(me) == wallet_before

    code, _, err = _run(capsys, "withdraw", "abc", "--config", config)
    assert code == 2 and "not an amount of tokens" in err

    code, _, _ = _run(capsys, "balance", "--config", config)
    assert code == 0


def test_provider_balance_table_names_each_figure_in_tokens(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client, provider = world.clients[2], world.providers[2]
    _earn(world, client, provider, 1_500)
    config = str(_config(tmp_path, world, provider))
    assert main(["balance", "--config", config]) == 0
    out = capsys.readouterr().out
    assert f"provider {address_of(provider)}" in out
    assert "free balance (withdraw)" in out and "0.001500" in out
    assert "stake, locked by open deals" in out
