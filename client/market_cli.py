"""`tpumarket client offers|bid|orders|cancel`: browse the asks, bid, see and withdraw orders.

`bid` trades under the terms of the offers it can take: without `--plan` or `--slo-ms` it takes
them from the cheapest live offer at or below its price in its class (and says so), so a bid
at an ask's price matches that ask. Before signing, it checks that the free escrow balance
covers price x quantity.

Registered by `client.cli.register` under `tpumarket client`, with the same options, output
(tables in tokens, or one JSON object on the last line with `--json`, in base units) and exit
codes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from client.accounts import DEFAULT_MIN_CHALLENGE_WINDOW
from client.amounts import tokens
from client.cli import (
    Progress,
    UsageError,
    emit_json,
    escrow_from,
    guarded,
    key_from,
    market_from,
    non_negative_int,
    note,
    parse_amount,
    positive_int,
    print_table,
)
from client.errors import ClientError
from client.market_http import MarketHttp, MarketHttpError
from contracts.messages import address_of
from contracts.orders import Bid, market_domain, order_id

PLANS = ("flat", "metered", "outcome", "tiered", "reserved")
DEFAULT_SLO_MS = 60_000  # a bid's SLO when no offer is there to take one from


REFUSAL_HINTS = {
    401: "the market refused the signature: check --key and this machine's clock",
    403: "the market does not allow it (funds, stake or a quota: see `tpumarket client "
    "balances` and `tpumarket client orders`)",
    404: "no such record on the market: see `tpumarket client orders` and `tpumarket client deals`",
    409: "it conflicts with what the market holds (a nonce used before, an order no longer "
    "live): pass a new --nonce or see `tpumarket client orders`",
    413: "the request is larger than the market accepts",
    415: "the market takes JSON bodies only",
    422: "the market found the request invalid",
    429: "the market limits this caller's rate: retry after the wait it names",
    503: "the market cannot read the chain now: retry in a few seconds",
}
"""What each status the market documents (`market.api.errors.DESCRIPTIONS`) asks of the user."""


def refusal(exc: MarketHttpError) -> UsageError:
    """Return the one-line error (exit 2) for a market's error answer: its status, its reason
    and what to do about it."""
    status = exc.status or 0
    if exc.__class__.__name__ == "OrderNotCancelled":
        return UsageError(" ".join(str(exc).split()))
    hint = REFUSAL_HINTS.get(status) or (
        "the market failed to answer: retry later" if status >= 500 else "the market refused it"
    )
    detail = " ".join(str(exc.detail or "").split())[:300]
    return UsageError(f"{hint} (HTTP {status}{': ' + detail if detail else ''})")


def refusals_exit_2(
    handler: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """Wrap a command's handler: an error status the market answers becomes one line, exit 2
    (the market could not be reached stays a remote failure, exit 1)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except MarketHttpError as exc:
            if exc.status is None:
                raise
            raise refusal(exc) from exc

    return run


def _reliability(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def _offers(args: argparse.Namespace) -> int:
    market = market_from(args)
    try:
        offers = market.offers(
            device_class=args.device_class,
            plan=args.plan,
            max_slo_ms=args.max_slo_ms,
            min_memory=args.min_memory,
            max_price=args.max_price,
            online=args.online or None,
            sort=args.sort,
            limit=args.limit,
        )
    finally:
        market.close()
    if args.json:
        emit_json({"offers": offers})
        return 0
    if not offers:
        if args.device_class:
            market = market_from(args)
            try:
                sold = sorted(_classes_sold(market) - {args.device_class})
            finally:
                market.close()
            others = f"; classes sold: {', '.join(sold)}" if sold else ""
            print(f"no offers in {args.device_class}{others}")
        else:
            print("no offers")
        return 0
    rows = [
        [
            str(o["device_class"]),
            tokens(int(o["price"])),
            str(o["quantity"]),
            str(o["plan"]),
            str(o["slo_ms"]),
            str(o["memory"]),
            str(o["provider"]),
            _reliability(o.get("reliability")),
            "yes" if o.get("online") else "no",
        ]
        for o in offers
    ]
    header = ["class", "price", "units", "plan", "slo ms", "memory", "provider", "rel.", "online"]
    print_table(header, rows)
    print(f"take the first: {offers[0]['command']}")
    return 0


def _terms(args: argparse.Namespace, market: MarketHttp) -> tuple[str, int]:
    """Return the bid's plan and SLO: as given, else those of the cheapest offer it can take."""
    if args.plan is not None and args.slo_ms is not None:
        return args.plan, args.slo_ms
    offers = market.offers(
        device_class=args.device_class,
        plan=args.plan,
        max_slo_ms=args.slo_ms,
        min_memory=args.memory or None,
        max_price=args.price,
        sort="price",
        limit=1,
    )
    if not offers:
        plan = args.plan or "flat"
        slo_ms = args.slo_ms or DEFAULT_SLO_MS
        note(
            f"no offer in {args.device_class} at or below {tokens(args.price)}: the bid rests "
            f"with plan {plan} and SLO {slo_ms} ms (--plan and --slo-ms choose others)"
        )
        return plan, slo_ms
    best = offers[0]
    plan = args.plan or str(best["plan"])
    slo_ms = args.slo_ms or int(best["slo_ms"])
    note(
        f"plan {plan}, SLO {slo_ms} ms: the terms of the cheapest offer at or below "
        f"{tokens(args.price)} ({tokens(int(best['price']))} from {best['provider']}); "
        "--plan and --slo-ms choose others"
    )
    return plan, slo_ms


def _classes_sold(market: MarketHttp) -> set[str]:
    """Return the device classes someone sells, as the market counts them for a bid: those of
    live asks, of providers' adverts and of the books (an ask filled out is posted again)."""
    sold = {str(o["device_class"]) for o in market.offers(limit=500)}
    sold.update(str(p["device_class"]) for p in market.providers() if p.get("device_class"))
    sold.update(market.classes())
    return sold


def _check_class(device_class: str, market: MarketHttp) -> None:
    """Refuse (exit 2) a bid in a class no provider sells, naming the classes sold and the one
    that does what was asked (a compile check of a TPU class is sold as `compile-<chip>`)."""
    sold = _classes_sold(market)
    if device_class in sold:
        return
    listed = ", ".join(sorted(sold)) if sold else "none (no provider advertises yet)"
    why = f"no provider sells device class {device_class!r} on this market; classes sold: {listed}"
    chip = device_class.split("-", 1)[1] if "-" in device_class else ""
    compile_class = f"compile-{chip}"
    if chip and compile_class in sold and device_class != compile_class:
        why += (
            f". Compile checks for {chip} (what a host without that chip sells) are "
            f"{compile_class}: --device-class {compile_class}"
        )
    elif sold:
        why += ": pick one with --device-class"
    raise UsageError(why)


def _check_windows(args: argparse.Namespace, market: MarketHttp, plan: str, slo_ms: int) -> None:
    """Refuse (exit 2) a bid that would match an ask whose challenge window is below the
    client's minimum: `client open` would refuse the deal after the match."""
    offers = market.offers(
        device_class=args.device_class,
        plan=plan,
        max_slo_ms=slo_ms,
        min_memory=args.memory or None,
        max_price=args.price,
        sort="price",
        limit=500,
    )
    short: list[tuple[int, int, str]] = []
    for provider in sorted({str(o["provider"]) for o in offers}):
        for order in market.orders(provider, device_class=args.device_class, live=True):
            quote = order.get("quote")
            if str(order.get("side")) != "ask" or not isinstance(quote, dict):
                continue
            window = int(quote.get("challenge_window", 0))
            fits = int(order["price"]) <= args.price and str(order["plan"]) == plan
            fits = fits and int(order["slo_ms"]) <= slo_ms and int(order["memory"]) >= args.memory
            if fits and window < args.min_window:
                short.append((int(order["price"]), window, provider))
    if short:
        price, window, provider = min(short)
        raise UsageError(
            f"this bid would match an ask of {provider} at {tokens(price)} whose challenge window "
            f"is {window} s, below your minimum of {args.min_window} s (`client open` would "
            f"refuse the deal): bid below {tokens(price)}, or accept it with --min-window {window}"
        )


def _bid(args: argparse.Namespace) -> int:
    key = key_from(args)
    escrow = escrow_from(args)
    owner = address_of(key)
    need = args.price * args.quantity
    free = escrow.balance_of(owner)
    if free < need:
        raise ClientError(
            f"a bid of {args.quantity} x {tokens(args.price)} needs {tokens(need)} tokens free "
            f"in the escrow; {owner} has {tokens(free)}: `tpumarket client deposit "
            f"{tokens(need - free)}` first"
        )
    market = market_from(args)
    progress = Progress("bid", 2)
    try:
        _check_class(args.device_class, market)
        plan, slo_ms = _terms(args, market)
        _check_windows(args, market, plan, slo_ms)
        domain = market_domain(escrow.domain.chain_id, escrow.address)
        bid = Bid(
            owner=owner,
            device_class=args.device_class,
            quantity=args.quantity,
            price=args.price,
            plan=plan,
            slo_ms=slo_ms,
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
        deal = f"{args.device_class}:{int(f['fill_id'])}"
        fills.append(
            {
                "fill_id": int(f["fill_id"]),
                "deal_id": deal,
                "ask_id": str(f["ask_id"]),
                "price": price,
                "quantity": quantity,
            }
        )
        total = f"{tokens(price)} x {quantity} = {tokens(price * quantity)}"
        rows.append([deal, str(f["ask_id"]), total])
    summary = {
        "order_id": str(order.get("order_id", order_id(bid, domain))),
        "state": str(order.get("state", "")),
        "remaining": int(order.get("remaining", bid.quantity)),
        "plan": plan,
        "slo_ms": slo_ms,
        "fills": fills,
        "deals": [f["deal_id"] for f in fills],
    }
    if args.json:
        emit_json(summary)
        return 0
    print(f"order {summary['order_id']} ({summary['state']}, {summary['remaining']} unmatched)")
    if fills:
        print_table(["deal", "ask", "price x qty"], rows)
        print(f"open it on chain: tpumarket client open {fills[0]['deal_id']}")
    else:
        print("no fills yet: the bid rests on the book (`tpumarket client orders`)")
    return 0


def _orders(args: argparse.Namespace) -> int:
    owner = address_of(key_from(args))
    market = market_from(args)
    try:
        orders = market.orders(
            owner, device_class=args.device_class, live=args.live, limit=args.limit
        )
    finally:
        market.close()
    rows: list[dict[str, Any]] = [
        {
            "order_id": str(o["order_id"]),
            "side": str(o["side"]),
            "device_class": str(o["device_class"]),
            "price": int(o["price"]),
            "quantity": int(o["quantity"]),
            "filled": int(o["filled"]),
            "remaining": int(o["remaining"]),
            "plan": str(o["plan"]),
            "slo_ms": int(o["slo_ms"]),
            "state": str(o["state"]),
            "expiry": int(o["expiry"]),
        }
        for o in orders
    ]
    if args.json:
        emit_json({"owner": owner, "orders": rows})
        return 0
    if not rows:
        print(f"no {'live ' if args.live else ''}orders for {owner}")
        return 0
    print_table(
        ["order", "side", "class", "price", "filled/qty", "plan", "slo ms", "state"],
        [
            [
                str(r["order_id"]),
                str(r["side"]),
                str(r["device_class"]),
                tokens(int(r["price"])),
                f"{r['filled']}/{r['quantity']}",
                str(r["plan"]),
                str(r["slo_ms"]),
                str(r["state"]),
            ]
            for r in rows
        ],
    )
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


def _order_id(text: str) -> str:
    value = text.strip()
    digits = value.removeprefix("0x")
    if len(digits) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise argparse.ArgumentTypeError(
            f"not an order id: {text!r} (0x and 64 hex digits, as `client orders` shows)"
        )
    return "0x" + digits.lower()


def register(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """Add `offers`, `bid`, `orders` and `cancel` to `tpumarket client`."""
    offers = actions.add_parser(
        "offers", parents=[common], help="live asks: provider, terms, price, reliability"
    )
    offers.add_argument("--device-class", default=None, help="one class (default: every class)")
    offers.add_argument("--plan", choices=PLANS, default=None, help="this plan only")
    offers.add_argument("--max-slo-ms", type=positive_int, default=None, help="this fast or faster")
    offers.add_argument("--min-memory", type=non_negative_int, default=None, help="bytes, at least")
    offers.add_argument("--max-price", type=parse_amount, default=None, help="tokens, at most")
    offers.add_argument("--online", action="store_true", help="providers heard from recently")
    offers.add_argument(
        "--sort",
        default="price",
        choices=[
            f"{s}{f}"
            for f in ("price", "reliability", "slo_ms", "memory", "capacity", "quantity")
            for s in ("", "-")
        ],
        help="a field; '-' in front for descending (default price)",
    )
    offers.add_argument("--limit", type=positive_int, default=50, help="at most this many")
    offers.set_defaults(handler=guarded(refusals_exit_2(_offers)))

    bid = actions.add_parser("bid", parents=[common], help="place a signed bid on the market")
    bid.add_argument("--device-class", required=True, help="e.g. cpu, tpu-v5e, compile-v5e")
    bid.add_argument("--quantity", type=positive_int, required=True, help="units wanted")
    bid.add_argument("--price", type=parse_amount, required=True, help="tokens per unit, at most")
    bid.add_argument(
        "--plan", choices=PLANS, default=None, help="default: the cheapest offer's plan"
    )
    bid.add_argument(
        "--slo-ms",
        type=positive_int,
        default=None,
        help="worst latency accepted (default: the cheapest offer's)",
    )
    bid.add_argument("--memory", type=non_negative_int, default=0, help="bytes needed")
    bid.add_argument(
        "--expiry-s", type=positive_int, default=1_800, help="seconds the bid may trade"
    )
    bid.add_argument("--nonce", type=non_negative_int, default=None, help="default: the time")
    bid.add_argument(
        "--min-window",
        type=positive_int,
        default=DEFAULT_MIN_CHALLENGE_WINDOW,
        help="the shortest challenge window accepted, seconds (as `client open --min-window`): "
        "an ask below it is refused before the bid is placed",
    )
    bid.set_defaults(handler=guarded(refusals_exit_2(_bid)))

    orders = actions.add_parser(
        "orders", parents=[common], help="your orders on the market: resting, filled, cancelled"
    )
    orders.add_argument("--device-class", default=None, help="one class (default: every class)")
    orders.add_argument("--live", action="store_true", help="resting orders only")
    orders.add_argument("--limit", type=positive_int, default=50, help="at most this many")
    orders.set_defaults(handler=guarded(refusals_exit_2(_orders)))

    cancel = actions.add_parser("cancel", parents=[common], help="cancel one of your orders")
    cancel.add_argument("order_id", type=_order_id, help="the order's id (0x and 64 hex digits)")
    cancel.set_defaults(handler=guarded(refusals_exit_2(_cancel)))
