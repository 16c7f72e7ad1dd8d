"""`tpumarket client deals|open|close`: a client's deals, from match to close; deal ids.

A deal has one id on chain (a number, ``7``) once it is open, and before that only the
market's id of the match it comes from (``<device class>:<fill id>``, ``cpu:1``). Every command
that takes a deal (`client open`, `client close`, `job run --deal`, ...) takes either form
(:func:`resolve_deal`): a market id is looked up on the market, which records the chain id of
the deal opened from it.

`open` waits (bounded, with progress) for the provider's quote for this fill, checks it against
the ask the client bid on (`ClientAccount.open_market_deal`) and records the deal's open block
in its ledger, so later commands read its claims from there. `close` agrees to close an open
deal: before its expiry the provider's agreement closes it, after expiry plus the challenge
window the client's alone does; what the deal did not spend returns to the free balance.

Registered by `client.cli.register` under `tpumarket client`.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

from client.accounts import DEFAULT_MIN_CHALLENGE_WINDOW, wait_for_quote
from client.amounts import tokens
from client.cli import (
    UsageError,
    account_from,
    emit_json,
    guarded,
    key_from,
    market_from,
    note,
    parse_amount,
    positive_int,
    print_table,
    settings_of,
)
from client.deal_guards import CodeCheck
from client.errors import ClientError
from client.market_cli import refusals_exit_2
from client.market_http import MarketHttpError
from contracts.binding import DEAL_OPEN
from contracts.messages import address_of

MARKET_DEAL_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*:[1-9][0-9]*$")
STATE_ENV = "TPUMARKET_CLIENT_STATE"
UNILATERAL_CLOSE_WINDOWS = 2
"""Challenge windows past its expiry from which either party closes a deal alone (the escrow's
``closeDeal``: ``expiry + 2 * challengeWindow``; tests/test_docs_claims.py reads the contract)."""


def closes_alone_at(expiry: int, challenge_window: int) -> int:
    """Return the first instant (unix s) at which either party may close a deal alone."""
    return expiry + UNILATERAL_CLOSE_WINDOWS * challenge_window


def state_dir_of(args: argparse.Namespace) -> Path:
    """Return the folder of the deal ledgers: ``--state-dir``, the environment, or ~."""
    if getattr(args, "state_dir", None) is not None:
        return Path(args.state_dir)
    return settings_of(args).client_state


def resolve_deal(args: argparse.Namespace, text: str) -> int:
    """Return the chain id of the deal `text` names: a chain id (``7``) or a market id."""
    text = str(text).strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    if not MARKET_DEAL_ID.match(text):
        raise UsageError(
            f"not a deal id: {text!r} (a chain deal id such as 7, or a market deal id "
            "<device class>:<fill id> such as cpu:1)"
        )
    if not args.market_url:
        raise UsageError(
            f"{text} is a market deal id: pass --market-url (or set TPUMARKET_MARKET_URL) to "
            "look up its deal on chain, or pass the chain deal id `client open` printed"
        )
    market = market_from(args)
    try:
        record = market.deal(text)
    except MarketHttpError as exc:
        if exc.status == 404:
            raise UsageError(f"the market knows no deal {text} (see `client deals`)") from exc
        raise
    finally:
        market.close()
    chain_id = record.get("chain_deal_id")
    if chain_id in (None, "", 0):
        raise ClientError(
            f"deal {text} is matched but not open on chain yet (or the market has not indexed "
            f"it yet): `tpumarket client open {text}` opens it"
        )
    return int(chain_id)


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
        chain_id = r.get("chain_deal_id")
        deals.append(
            {
                "deal_id": str(r["deal_id"]),
                "provider": str(r["provider"]),
                "price": price,
                "quantity": quantity,
                "total": price * quantity,
                "status": status,
                "chain_deal_id": chain_id,
            }
        )
        total = f"{tokens(price)} x {quantity} = {tokens(price * quantity)}"
        on_chain = "-" if chain_id in (None, "") else str(chain_id)
        rows.append([str(r["deal_id"]), on_chain, str(r["provider"]), total, status])
    if args.json:
        emit_json({"client": address, "deals": deals})
        return 0
    if not deals:
        print(f"no deals for {address}")
        return 0
    print_table(["id", "on chain", "provider", "price x qty", "status"], rows)
    return 0


def _open(args: argparse.Namespace) -> int:
    from client.ledger import DealLedger

    if str(args.deal_id).strip().isdigit():
        raise UsageError(
            f"{args.deal_id} is a chain deal id: `client open` opens a match, named by its market "
            "deal id <device class>:<fill id> as `client bid` and `client deals` print it"
        )
    if not MARKET_DEAL_ID.match(str(args.deal_id).strip()):
        raise UsageError(f"not a market deal id: {args.deal_id!r} (such as cpu:1)")
    account = account_from(args)
    account.min_challenge_window = args.min_window
    market = market_from(args)
    waited = {"last": -10.0}

    def waiting(seconds: float) -> None:
        if seconds - waited["last"] >= 5:
            waited["last"] = seconds
            note(f"waiting for the provider's quote for deal {args.deal_id} ({seconds:.0f} s)")

    try:
        try:
            record = wait_for_quote(
                market, account.address, args.deal_id, timeout_s=args.quote_wait_s, on_wait=waiting
            )
        except MarketHttpError as exc:
            if exc.status == 404:
                raise UsageError(
                    f"the market knows no deal {args.deal_id}: `tpumarket client deals` lists "
                    "yours, `tpumarket client bid` makes one"
                ) from exc
            raise
        # A provider with contract code could withdraw its acks' signatures (ERC-1271).
        w3 = account.escrow.tx.w3
        check = CodeCheck(lambda a: bytes(w3.eth.get_code(w3.to_checksum_address(a))))
        check.allow_code = args.allow_provider_code
        quote = record.get("quote") if isinstance(record.get("quote"), dict) else {}
        kind = check.check(str((quote or {}).get("provider", record.get("provider", ""))))
        if kind != "none":
            note(f"the provider's account holds code ({kind}): its ECDSA acks still stand")
        opened = account.open_market_deal(record, max_spend=args.max_spend)
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
    print(f"run work on it: tpumarket job run --deal {opened.chain_deal_id} --program FILE ...")
    return 0


def _close(args: argparse.Namespace) -> int:
    account = account_from(args)
    deal_id = resolve_deal(args, args.deal_id)
    escrow = account.escrow
    if not 0 < deal_id <= escrow.deal_count():
        raise UsageError(f"no deal {deal_id} on this escrow")
    deal = escrow.get_deal(deal_id)
    if deal.client.lower() != account.address.lower():
        raise UsageError(f"deal {deal_id} belongs to {deal.client}, not to {account.address}")
    if deal.status != DEAL_OPEN:
        raise ClientError(f"deal {deal_id} is not open (closed already)")
    free_before = escrow.balance_of(account.address)
    result = account.close(deal_id)
    after = escrow.get_deal(deal_id)
    closed = after.status != DEAL_OPEN
    returned = escrow.balance_of(account.address) - free_before
    summary = {
        "deal_id": deal_id,
        "tx": result.tx_hash,
        "closed": closed,
        "returned": returned,
        "expiry": after.expiry,
        "closes_alone_from": closes_alone_at(after.expiry, after.challenge_window),
    }
    if args.json:
        emit_json(summary)
        return 0
    if closed:
        print(f"deal {deal_id} closed: {tokens(returned)} tokens back to your free balance")
    else:
        alone = time.strftime(
            "%Y-%m-%d %H:%M:%S UTC",
            time.gmtime(closes_alone_at(after.expiry, after.challenge_window)),
        )
        print(
            f"deal {deal_id}: you agreed to close (tx {result.tx_hash}); it closes when the "
            f"provider agrees too (its daemon does) while your agreement is in force (two "
            f"challenge windows), or by either party alone from {alone}"
        )
    return 0


def register(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """Add `deals`, `open` and `close` to `tpumarket client`."""
    deals = actions.add_parser("deals", parents=[common], help="the client's deals on the market")
    deals.add_argument("--limit", type=positive_int, default=50, help="at most this many")
    deals.set_defaults(handler=guarded(refusals_exit_2(_deals)))

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
    open_.add_argument(
        "--allow-provider-code",
        action="store_true",
        help="open even if the provider is a contract wallet, whose ERC-1271 signatures (its "
        "acks) could be withdrawn after the fact, losing breach refunds",
    )
    open_.add_argument("--state-dir", default=None, help="deal ledgers (as for `tpumarket job`)")
    open_.set_defaults(handler=guarded(refusals_exit_2(_open)))

    close = actions.add_parser(
        "close", parents=[common], help="agree to close a deal; unspent tokens come back"
    )
    close.add_argument("deal_id", help="the chain deal id (7) or the market's (cpu:1)")
    close.set_defaults(handler=guarded(refusals_exit_2(_close)))
