"""`tpumarket client balances|deposit|withdraw`: the client's tokens, in its wallet and escrow.

Registered by `client.cli.register` under `tpumarket client`.
"""

from __future__ import annotations

import argparse

from client.accounts import Balances, ClientAccount
from client.amounts import tokens
from client.cli import (
    Progress,
    account_from,
    emit_json,
    guarded,
    parse_amount,
    print_table,
)
from client.errors import ClientError


def locked_in_deals(account: ClientAccount) -> int:
    """Sum what the client's open deals on chain still lock, scanning every deal."""
    count = account.escrow.deal_count()
    progress = Progress("scanning deals", count) if count else None
    locked = 0
    me = account.address.lower()
    for deal_id in range(1, count + 1):
        deal = account.escrow.get_deal(deal_id)
        if deal.client.lower() == me:
            locked += deal.locked
        if progress:
            progress.step(f"deal {deal_id}")
    return locked


def _balances(args: argparse.Namespace) -> int:
    account = account_from(args)
    plain = account.balances()
    balances = Balances(wallet=plain.wallet, free=plain.free, locked=locked_in_deals(account))
    if args.json:
        emit_json(
            {
                "address": account.address,
                "wallet": balances.wallet,
                "free": balances.free,
                "locked": balances.locked,
                "total": balances.total,
            }
        )
        return 0
    print(f"client {account.address}")
    rows = [
        ["wallet", tokens(balances.wallet)],
        ["free", tokens(balances.free)],
        ["locked", tokens(balances.locked)],
        ["total", tokens(balances.total)],
    ]
    print_table(["balance", "tokens"], rows)
    return 0


def _move(args: argparse.Namespace, action: str) -> int:
    account = account_from(args)
    amount: int = args.amount
    before = account.balances()
    held, where = (
        (before.wallet, "wallet holds") if action == "deposit" else (before.free, "free balance is")
    )
    if amount > held:
        raise ClientError(
            f"cannot {action} {tokens(amount)} tokens: the {where} {tokens(held)} tokens"
        )
    progress = Progress(action, 1)
    result = account.deposit(amount) if action == "deposit" else account.withdraw(amount)
    progress.step("confirmed")
    after = account.balances()
    tx = result.tx_hash
    if args.json:
        emit_json(
            {
                "action": action,
                "amount": amount,
                "tx": tx,
                "wallet": after.wallet,
                "free": after.free,
            }
        )
        return 0
    print(f"{action} {tokens(amount)} tokens: tx {tx}")
    print_table(
        ["balance", "tokens"], [["wallet", tokens(after.wallet)], ["free", tokens(after.free)]]
    )
    return 0


def _deposit(args: argparse.Namespace) -> int:
    return _move(args, "deposit")


def _withdraw(args: argparse.Namespace) -> int:
    return _move(args, "withdraw")


def register(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """Add `balances`, `deposit` and `withdraw` to `tpumarket client`."""
    balances = actions.add_parser(
        "balances", parents=[common], help="wallet, free and locked tokens"
    )
    balances.set_defaults(handler=guarded(_balances))
    for name, handler, what in (
        ("deposit", _deposit, "deposit tokens into the escrow (approving it if needed)"),
        ("withdraw", _withdraw, "withdraw free tokens from the escrow"),
    ):
        move = actions.add_parser(name, parents=[common], help=what)
        move.add_argument("amount", type=parse_amount, help="tokens, up to 6 decimals (1.5)")
        move.set_defaults(handler=guarded(handler))
