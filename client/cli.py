"""`tpumarket client ...`: a client's balances, deposits, withdrawals, deals and bids.

Browsing offers, cancelling orders and opening matched deals live in `client.market_cli`.

A thin layer over the SDK (`client.accounts`, `client.market_http`, `contracts.orders`):
tables for people, `--json` (one JSON object on the last line) for scripts. SDK errors print
`error: ...` and exit 1; bad input exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, TextIO

from client.accounts import Balances, ClientAccount
from client.errors import ClientError
from client.market_http import MarketHttp
from contracts.binding import Chain, Escrow
from contracts.errors import EscrowError
from contracts.messages import address_of
from contracts.orders import Bid, market_domain, order_id

DECIMALS = 6
UNIT = 10**DECIMALS
KEY_ENV = "TPUMARKET_CLIENT_KEY"
PLANS = ("flat", "metered", "outcome", "tiered", "reserved")

Handler = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """Bad input found after parsing (a missing key or option): exit code 2."""


def parse_amount(text: str) -> int:
    """Parse a positive token amount with at most 6 decimals (``1.5``) into base units."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not an amount of tokens: {text!r}") from None
    if not value.is_finite() or value <= 0:
        raise argparse.ArgumentTypeError(f"amount must be a positive number of tokens: {text!r}")
    units = value * UNIT
    if units != units.to_integral_value():
        raise argparse.ArgumentTypeError(f"amount has more than {DECIMALS} decimals: {text!r}")
    return int(units)


def positive_int(text: str) -> int:
    """Parse a positive integer option."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def tokens(units: int) -> str:
    """Format base units as tokens with all 6 decimals."""
    sign = "-" if units < 0 else ""
    whole, frac = divmod(abs(units), UNIT)
    return f"{sign}{whole}.{frac:06d}"


class Progress:
    """Progress on stderr: a redrawn bar on a TTY, one plain line per step otherwise."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(1, total)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, what: str = "") -> None:
        """Count one step done."""
        self.done = min(self.total, self.done + 1)
        if self.tty:
            width = 24
            filled = width * self.done // self.total
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {what}\033[K")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(f"{self.label}: {self.done}/{self.total} {what}".rstrip() + "\n")
        self.stream.flush()


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print rows under a header, columns left-aligned (numbers right-aligned)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def emit_json(value: dict[str, Any]) -> None:
    """Print one JSON object on one line (the last line of a `--json` run)."""
    print(json.dumps(value, sort_keys=True), flush=True)


# ---- connections ---------------------------------------------------------------------------


def key_from(args: argparse.Namespace) -> str:
    """Return the client key from `--key` or the environment."""
    key = args.key or os.environ.get(KEY_ENV)
    if not key:
        raise UsageError(f"no client key: pass --key or set {KEY_ENV}")
    return str(key)


def escrow_from(args: argparse.Namespace) -> Escrow:
    """Return the escrow named by `--escrow` on `--rpc-url`."""
    if not args.escrow:
        raise UsageError("no escrow address: pass --escrow or set TPUMARKET_ESCROW")
    return Chain(args.rpc_url).escrow(args.escrow)


def account_from(args: argparse.Namespace) -> ClientAccount:
    """Return the client account of `--key` on the escrow of `--escrow`."""
    key = key_from(args)
    escrow = escrow_from(args)
    token = Chain(args.rpc_url).token(escrow.token())
    return ClientAccount(escrow, token, key)


def market_from(args: argparse.Namespace) -> MarketHttp:
    """Return a client of the market at `--market-url`."""
    if not args.market_url:
        raise UsageError("no market: pass --market-url or set TPUMARKET_MARKET_URL")
    return MarketHttp(args.market_url)


# ---- handlers ------------------------------------------------------------------------------


def _locked(account: ClientAccount) -> int:
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
    balances = Balances(wallet=plain.wallet, free=plain.free, locked=_locked(account))
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


def _deals(args: argparse.Namespace) -> int:
    address = address_of(key_from(args))
    market = market_from(args)
    try:
        records = market.deals(address, limit=args.limit)
    finally:
        market.close()
    rows: list[list[str]] = []
    deals: list[dict[str, Any]] = []
    for r in records:
        price, quantity = int(r["price"]), int(r["quantity"])
        status = str(r.get("status", ""))
        deals.append(
            {
                "deal_id": str(r["deal_id"]),
                "provider": str(r["provider"]),
                "price": price,
                "quantity": quantity,
                "total": price * quantity,
                "status": status,
                "chain_deal_id": r.get("chain_deal_id"),
            }
        )
        total = f"{tokens(price)} x {quantity} = {tokens(price * quantity)}"
        rows.append([str(r["deal_id"]), str(r["provider"]), total, status])
    if args.json:
        emit_json({"client": address, "deals": deals})
        return 0
    if not deals:
        print(f"no deals for {address}")
        return 0
    print_table(["id", "provider", "price x qty", "status"], rows)
    return 0


def _bid(args: argparse.Namespace) -> int:
    key = key_from(args)
    escrow = escrow_from(args)
    market = market_from(args)
    progress = Progress("bid", 2)
    try:
        domain = market_domain(escrow.domain.chain_id, escrow.address)
        bid = Bid(
            owner=address_of(key),
            device_class=args.device_class,
            quantity=args.quantity,
            price=args.price,
            plan=args.plan,
            slo_ms=args.slo_ms,
            memory=args.memory,
            expiry=int(time.time()) + args.expiry_s,
            nonce=args.nonce if args.nonce is not None else time.time_ns() // 1000,
        )
        progress.step("signed")
        reply = market.place_bid(bid, domain, key)
        progress.step("placed")
    finally:
        market.close()
    order = reply.get("order") or {}
    fills: list[dict[str, Any]] = []
    rows: list[list[str]] = []
    for f in reply.get("fills") or []:
        price, quantity = int(f["price"]), int(f["quantity"])
        fills.append(
            {
                "fill_id": int(f["fill_id"]),
                "ask_id": str(f["ask_id"]),
                "price": price,
                "quantity": quantity,
            }
        )
        total = f"{tokens(price)} x {quantity} = {tokens(price * quantity)}"
        rows.append([str(f["fill_id"]), str(f["ask_id"]), total])
    summary = {
        "order_id": str(order.get("order_id", order_id(bid, domain))),
        "state": str(order.get("state", "")),
        "remaining": int(order.get("remaining", bid.quantity)),
        "fills": fills,
    }
    if args.json:
        emit_json(summary)
        return 0
    print(f"order {summary['order_id']} ({summary['state']}, {summary['remaining']} unmatched)")
    if fills:
        print_table(["fill", "ask", "price x qty"], rows)
    else:
        print("no fills yet")
    return 0


def guarded(handler: Handler) -> Handler:
    """Wrap a handler: SDK errors print `error: ...` and exit 1, bad input exits 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 2
        except (ClientError, EscrowError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 1

    return run


# ---- parser --------------------------------------------------------------------------------


def common_options() -> argparse.ArgumentParser:
    """Return the options every client command shares (chain, escrow, market, key, --json)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--rpc-url",
        default=os.environ.get("TPUMARKET_RPC_URL", "http://127.0.0.1:8545"),
        help="chain RPC URL (env TPUMARKET_RPC_URL)",
    )
    common.add_argument(
        "--escrow",
        default=os.environ.get("TPUMARKET_ESCROW"),
        help="escrow contract address (env TPUMARKET_ESCROW)",
    )
    common.add_argument(
        "--market-url",
        default=os.environ.get("TPUMARKET_MARKET_URL"),
        help="market base URL (env TPUMARKET_MARKET_URL)",
    )
    common.add_argument("--key", default=None, help=f"client private key (env {KEY_ENV})")
    common.add_argument(
        "--json", action="store_true", help="print one JSON object on the last line"
    )
    return common


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `tpumarket client ...` and `tpumarket job ...` (`client.job_cli`)."""
    from client import job_cli, market_cli  # they build on this module's helpers

    job_cli.register(commands)
    client = commands.add_parser(
        "client", help="a client's balances, deposits, offers, bids and deals"
    )
    actions = client.add_subparsers(dest="action", required=True)
    common = common_options()

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

    deals = actions.add_parser("deals", parents=[common], help="the client's deals on the market")
    deals.add_argument("--limit", type=positive_int, default=50, help="at most this many")
    deals.set_defaults(handler=guarded(_deals))

    bid = actions.add_parser("bid", parents=[common], help="place a signed bid on the market")
    bid.add_argument("--device-class", required=True, help="e.g. tpu-v5e")
    bid.add_argument("--quantity", type=positive_int, required=True, help="units wanted")
    bid.add_argument("--price", type=parse_amount, required=True, help="tokens per unit, at most")
    bid.add_argument("--plan", choices=PLANS, default="flat", help="plan kind to trade under")
    bid.add_argument("--slo-ms", type=positive_int, required=True, help="worst latency accepted")
    bid.add_argument("--memory", type=_non_negative_int, default=0, help="bytes needed")
    bid.add_argument(
        "--expiry-s", type=positive_int, default=1_800, help="seconds the bid may trade"
    )
    bid.add_argument("--nonce", type=_non_negative_int, default=None, help="default: the time")
    bid.set_defaults(handler=guarded(_bid))
    market_cli.register(actions, common)


def build_parser() -> argparse.ArgumentParser:
    """Return a `tpumarket` parser with only the `client` subcommands (for tests and -m)."""
    parser = argparse.ArgumentParser(prog="tpumarket", description="Accelerator compute market")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `tpumarket client ...` without the entry point: `python -m client.cli client ...`."""
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
