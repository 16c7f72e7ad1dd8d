"""``tpumarket provider balance | withdraw``: the provider's money in the escrow, and taking it out.

What the escrow holds for the provider, read from the chain with the key and escrow of the
daemon's config (``--config FILE`` and the ``TPUMARKET_PROVIDER_*`` environment):

- **free balance**: what redeemed vouchers, finalized claims, won disputes and closed deals
  paid this provider and it has not withdrawn (the escrow's ``balanceOf``): ``withdraw`` takes
  it out to the provider's address;
- **earnings**: what its deals paid in all (``paid``) and what claims still wait for their
  challenge window (``pending``), from the escrow's events (``provider earnings`` per deal);
- **stake**: free (``stakeOf``: ``unstake`` takes it out) and locked by open deals (each
  deal's stake, returned when it closes).

Tables are in tokens; ``--json`` prints one JSON object, amounts in base units (decimal
strings). Errors are one line: exit 2 for a bad config or amount, 1 for a chain that refuses.
"""

from __future__ import annotations

import argparse

from contracts.binding import DEAL_OPEN
from provider.console import UsageError, emit_json, parse_tokens, print_table
from provider.operator import Operator, connect, guarded


def provider_balance(op: Operator) -> dict[str, int]:
    """Return the provider's wallet, free balance, earnings and stake (free, locked)."""
    deals = op.deals()
    money = op.earnings(deals)
    locked = 0
    for deal_id in deals:
        deal = op.escrow.get_deal(deal_id)
        if deal.status == DEAL_OPEN and deal.provider.lower() == op.address.lower():
            locked += deal.stake
    return {
        "wallet": op.token.balance_of(op.address),
        "free_balance": op.escrow.balance_of(op.address),
        "earned": sum(m.paid for m in money.values()),
        "pending_claims": sum(m.pending for m in money.values()),
        "penalties": sum(m.penalties for m in money.values()),
        "stake_free": op.escrow.stake_of(op.address),
        "stake_locked": locked,
    }


_LABELS = {
    "wallet": "wallet",
    "free_balance": "free balance (withdraw)",
    "earned": "earned (paid by deals)",
    "pending_claims": "pending claims",
    "penalties": "penalties paid",
    "stake_free": "stake, free (unstake)",
    "stake_locked": "stake, locked by open deals",
}


def _balance(args: argparse.Namespace) -> int:
    op = connect(args)
    figures = provider_balance(op)
    if args.json:
        emit_json({"provider": op.address, **{k: str(v) for k, v in figures.items()}})
        return 0
    print(f"provider {op.address}")
    print_table(["balance", "tokens"], [[_LABELS[k], op.fmt(v)] for k, v in figures.items()])
    return 0


def _withdraw(args: argparse.Namespace) -> int:
    op = connect(args)
    free = op.escrow.balance_of(op.address)
    if args.amount is None:
        if free == 0:
            raise UsageError("nothing to withdraw: the free balance is 0 tokens")
        amount = free
    else:
        amount = parse_tokens(args.amount, op.decimals)
        if amount > free:
            raise UsageError(
                f"cannot withdraw {op.fmt(amount)} tokens: the free balance is {op.fmt(free)} "
                "(earnings of claims pending and of vouchers not redeemed yet are not in it)"
            )
    result = op.escrow.withdraw(op.config.private_key, amount)
    wallet = op.token.balance_of(op.address)
    left = op.escrow.balance_of(op.address)
    if args.json:
        emit_json(
            {
                "action": "withdraw",
                "amount": str(amount),
                "tx": result.tx_hash,
                "to": op.address,
                "wallet": str(wallet),
                "free_balance": str(left),
            }
        )
        return 0
    print(f"withdrew {op.fmt(amount)} tokens to {op.address}: tx {result.tx_hash}")
    print_table(
        ["balance", "tokens"],
        [["wallet", op.fmt(wallet)], ["free balance", op.fmt(left)]],
    )
    return 0


def register(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``balance`` and ``withdraw`` under ``tpumarket provider``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=None, help="the daemon's TOML file")
    common.add_argument("--json", action="store_true", help="one JSON object, base units")
    balance = actions.add_parser(
        "balance", parents=[common], help="free balance, earnings and stake in the escrow"
    )
    balance.set_defaults(handler=guarded(_balance))
    withdraw = actions.add_parser(
        "withdraw", parents=[common], help="take earnings out of the escrow to the wallet"
    )
    withdraw.add_argument(
        "amount", nargs="?", default=None, help="tokens (1.5); default: the whole free balance"
    )
    withdraw.set_defaults(handler=guarded(_withdraw))
