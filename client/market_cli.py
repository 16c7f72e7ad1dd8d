"""`tpumarket client offers|cancel|open`: browse the asks, withdraw an order, open a deal.

`open` waits (bounded, with progress) for the provider's quote for this fill, checks it against
the ask the client bid on (`ClientAccount.open_market_deal`) and records the deal's open block
in its ledger, so later commands read its claims from there.

Registered by `client.cli.register` under `tpumarket client`, with the same options, output
(tables, or one JSON object on the last line with `--json`) and exit codes.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from client.accounts import DEFAULT_MIN_CHALLENGE_WINDOW, open_market_deal
from client.cli import (
    account_from,
    emit_json,
    escrow_from,
    guarded,
    key_from,
    market_from,
    parse_amount,
    positive_int,
    print_table,
    tokens,
)
from client.market_http import Level
from contracts.orders import market_domain


def _asks(levels: tuple[Level, ...]) -> list[dict[str, int]]:
    """Return ask levels, cheapest first, each with the units available at it or cheaper."""
    depth = 0
    rows = []
    for level in levels:
        depth += level.quantity
        rows.append(
            {
                "price": level.price,
                "quantity": level.quantity,
                "orders": level.orders,
                "depth": depth,
            }
        )
    return rows


def _ago(seconds: float) -> str:
    """Format an age in seconds as `12s`, `5m` or `3h` ago."""
    whole = max(0, int(seconds))
    if whole < 120:
        return f"{whole}s ago"
    if whole < 7_200:
        return f"{whole // 60}m ago"
    return f"{whole // 3_600}h ago"


def _offers(args: argparse.Namespace) -> int:
    market = market_from(args)
    try:
        classes = [args.device_class] if args.device_class else market.classes()
        books = {name: _asks(market.book(name, levels=args.levels).asks) for name in classes}
        providers = [
            p
            for p in market.providers()
            if not args.device_class or p.get("device_class") == args.device_class
        ]
    finally:
        market.close()
    now = time.time()
    adverts: list[dict[str, Any]] = [
        {
            "address": str(p["address"]),
            "device_class": str(p["device_class"]),
            "device_kind": str(p["device_kind"]),
            "price": int(p["price"]),
            "throughput": float(p["throughput"]),
            "reliability": float(p["reliability"]),
            "last_seen": float(p["last_seen"]),
            "online": bool(p.get("online", True)),
        }
        for p in providers
    ]
    if args.json:
        emit_json({"asks": books, "providers": adverts})
        return 0
    for name, asks in books.items():
        if not asks:
            print(f"{name}: no asks")
            continue
        print(f"{name} asks")
        print_table(
            ["price", "units", "orders", "depth"],
            [
                [tokens(a["price"]), str(a["quantity"]), str(a["orders"]), str(a["depth"])]
                for a in asks
            ],
        )
    if not adverts:
        print("no providers")
        return 0
    print("providers")
    rows = [
        [
            a["address"],
            a["device_class"],
            a["device_kind"],
            tokens(a["price"]),
            f"{a['throughput']:g}",
            f"{a['reliability']:.2f}",
            _ago(now - a["last_seen"]) + ("" if a["online"] else " (offline)"),
        ]
        for a in adverts
    ]
    header = ["provider", "class", "device", "price", "throughput", "reliability", "last seen"]
    print_table(header, rows)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    key = key_from(args)
    escrow = escrow_from(args)
    market = market_from(args)
    try:
        domain = market_domain(escrow.domain.chain_id, escrow.address)
        order = market.cancel_order(args.order_id, domain, key)
    finally:
        market.close()
    summary = {
        "order_id": str(order["order_id"]),
        "state": str(order["state"]),
        "remaining": int(order["remaining"]),
        "filled": int(order["filled"]),
    }
    if args.json:
        emit_json(summary)
        return 0
    print(
        f"order {summary['order_id']} {summary['state']}: {summary['remaining']} units "
        f"withdrawn, {summary['filled']} filled before"
    )
    return 0


def _open(args: argparse.Namespace) -> int:
    from client.job_cli import state_dir_of
    from client.ledger import DealLedger

    account = account_from(args)
    account.min_challenge_window = args.min_window
    market = market_from(args)
    waited = {"last": -10.0}

    def waiting(seconds: float) -> None:
        if seconds - waited["last"] >= 5:
            waited["last"] = seconds
            print(
                f"waiting for the provider's quote for deal {args.deal_id} ({seconds:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    try:
        opened = open_market_deal(
            market,
            account,
            args.deal_id,
            max_spend=args.max_spend,
            wait_s=args.quote_wait_s,
            on_wait=waiting,
        )
    finally:
        market.close()
    # The deal's ledger learns the block it opened in: its claims are read from there.
    escrow = account.escrow
    ledger = DealLedger.open(
        state_dir_of(args), escrow.domain.chain_id, escrow.address, opened.chain_deal_id
    )
    try:
        ledger.open_block = opened.open_block
        ledger.save()
    finally:
        ledger.close()
    summary = {
        "deal_id": opened.market_id,
        "chain_deal_id": opened.chain_deal_id,
        "provider": opened.quote.provider,
        "max_spend": opened.max_spend,
        "locked": opened.locked,
    }
    if args.json:
        emit_json(summary)
        return 0
    print(f"deal {opened.market_id} opened on chain as deal {opened.chain_deal_id}")
    print_table(
        ["field", "value"],
        [
            ["provider", opened.quote.provider],
            ["cap", tokens(opened.max_spend)],
            ["locked", tokens(opened.locked)],
        ],
    )
    return 0


def register(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """Add `offers`, `cancel` and `open` to `tpumarket client`."""
    offers = actions.add_parser(
        "offers", parents=[common], help="asks by price level and the providers behind them"
    )
    offers.add_argument("--device-class", default=None, help="one class (default: every class)")
    offers.add_argument("--levels", type=positive_int, default=20, help="price levels per class")
    offers.set_defaults(handler=guarded(_offers))

    cancel = actions.add_parser("cancel", parents=[common], help="cancel one of your orders")
    cancel.add_argument("order_id", help="the order's id (0x and 64 hex digits)")
    cancel.set_defaults(handler=guarded(_cancel))

    open_ = actions.add_parser(
        "open", parents=[common], help="open a matched deal on chain with the provider's quote"
    )
    open_.add_argument("deal_id", help="the market's deal id (<device class>:<fill id>)")
    open_.add_argument(
        "--max-spend",
        type=parse_amount,
        default=None,
        help="tokens to lock, up to the quote's (default: price x quantity)",
    )
    open_.add_argument(
        "--quote-wait-s",
        type=float,
        default=60.0,
        help="how long to wait for the provider's quote for this fill",
    )
    open_.add_argument(
        "--min-window",
        type=positive_int,
        default=DEFAULT_MIN_CHALLENGE_WINDOW,
        help="the shortest challenge window accepted, seconds (time to dispute a claim)",
    )
    open_.add_argument("--state-dir", default=None, help="deal ledgers (as for `tpumarket job`)")
    open_.set_defaults(handler=guarded(_open))
