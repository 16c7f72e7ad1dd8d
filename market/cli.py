"""`tpumarket market serve`: run the market (API, web order book, jobs) in one process.

One process per region, or one per group of device classes (`--device-classes`) on one
PostgreSQL database: matching is single-writer per device class, and a second process claiming
a class already served (or the SQLite file of a running market) is refused (`market.partition`).
At start it checks its chain (the RPC answers, its chain id is `--chain-id`, or becomes it when
none is given; the escrow has code) and prints where it listens, where it stores its data and
which chain and escrow it serves. With the chain down and `--chain-id` given it starts all the
same: reads are served, what needs the escrow is answered 503 with `Retry-After`, and
`/v1/health` says the chain is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from contracts.binding import connect
from contracts.cli import InputError, check_address
from contracts.errors import ChainError, EscrowError
from market.database import SQLITE_FILE
from market.errors import MarketConfigError
from market.settings import Settings

if TYPE_CHECKING:
    from market.partition import Partition


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `tpumarket market ...`."""
    market = commands.add_parser("market", help="run the matching service and web order book")
    actions = market.add_subparsers(dest="action", required=True)
    serve = actions.add_parser("serve", help="serve the API, the web order book and the jobs")
    serve.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--data-dir", type=Path, default=None, help="SQLite directory (env MARKET_DATA_DIR)"
    )
    serve.add_argument(
        "--database-url", default=None, help="PostgreSQL URL (env DATABASE_URL; default SQLite)"
    )
    serve.add_argument("--rpc-url", default=None, help="chain JSON-RPC URL (env RPC_URL)")
    serve.add_argument("--escrow", default=None, help="escrow address (env MARKET_ESCROW)")
    serve.add_argument("--chain-id", type=int, default=None, help="chain id (env MARKET_CHAIN_ID)")
    serve.add_argument(
        "--from-block",
        type=int,
        default=None,
        help="the escrow's deployment block, where indexing starts (env MARKET_FROM_BLOCK; "
        "default: asked of the node)",
    )
    serve.add_argument(
        "--min-challenge-window",
        type=int,
        default=None,
        help="shortest challenge window an ask may quote, in s, on top of the escrow's own "
        "minimum (env MARKET_MIN_CHALLENGE_WINDOW)",
    )
    serve.add_argument(
        "--min-provider-stake",
        type=int,
        default=None,
        help="stake (token base units) a provider needs on the escrow to advertise or ask "
        "(default 1,000,000)",
    )
    serve.add_argument(
        "--provider-ttl",
        type=float,
        default=None,
        help="seconds after its last heartbeat a provider's asks stop matching (default 60)",
    )
    serve.add_argument(
        "--head-max-age",
        type=float,
        default=None,
        help="seconds the match gate reuses a chain head it read (default 0.05; 0: one read "
        "per group commit)",
    )
    serve.add_argument(
        "--unopened-deal-hold",
        type=int,
        default=None,
        help="seconds a match not opened on chain holds its client's funds (default 3600)",
    )
    serve.add_argument(
        "--no-funds-check",
        action="store_true",
        help="take orders and adverts without escrow funds behind them (development only)",
    )
    serve.add_argument(
        "--keep-alive",
        type=float,
        default=None,
        help="seconds an idle connection stays open (default 5)",
    )
    serve.add_argument(
        "--request-read-timeout",
        type=float,
        default=None,
        help="seconds a request may take to arrive, headers and body (default 10)",
    )
    serve.add_argument(
        "--device-classes",
        default=None,
        help="device classes this process matches, comma-separated, beside others on one "
        "PostgreSQL database (env TPUMARKET_MARKET_DEVICE_CLASSES; default: every class)",
    )
    serve.add_argument("--no-jobs", action="store_true", help="do not run the scheduled jobs")
    serve.add_argument(
        "--rate-per-address", type=float, default=None, help="orders/s per signer (0: no limit)"
    )
    serve.add_argument(
        "--rate-per-ip", type=float, default=None, help="requests/s per IP (0: no limit)"
    )
    serve.add_argument("--log-level", default="warning", help="uvicorn log level")
    serve.set_defaults(handler=_serve)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Return the settings the command line and the environment describe."""
    overrides = {
        "data_dir": args.data_dir,
        "database_url": args.database_url,
        "rpc_url": args.rpc_url,
        "escrow": args.escrow,
        "chain_id": args.chain_id,
        "index_from_block": args.from_block,
        "min_challenge_window": args.min_challenge_window,
        "rate_per_address": args.rate_per_address,
        "rate_per_ip": args.rate_per_ip,
        "min_provider_stake": args.min_provider_stake,
        "keep_alive_s": args.keep_alive,
        "request_read_timeout_s": args.request_read_timeout,
        "provider_offline_after_s": args.provider_ttl,
        "unopened_deal_hold_s": args.unopened_deal_hold,
        "head_max_age_s": args.head_max_age,
        "device_classes": args.device_classes,
    }
    if args.rate_per_address is not None:
        overrides["burst_per_address"] = max(1.0, 2 * args.rate_per_address)
    if args.rate_per_ip is not None:
        overrides["burst_per_ip"] = max(1.0, 2 * args.rate_per_ip)
    if args.no_jobs:
        overrides["run_jobs"] = False
    if args.no_funds_check:
        overrides["require_funds"] = False
    return Settings.from_env(**overrides)


def check_chain(settings: Settings, *, chain_id_given: bool) -> Settings:
    """Check the settings' chain at start; return them with the RPC's chain id if none given.

    Raise InputError for a chain id other than the RPC's or an escrow with no code, ChainError
    when the RPC does not answer.
    """
    if settings.rpc_url is None:
        return settings
    w3 = connect(settings.rpc_url, timeout_s=10.0)
    actual = int(w3.eth.chain_id)
    if chain_id_given and settings.chain_id != actual:
        raise InputError(
            f"--chain-id {settings.chain_id}, but the chain at {settings.rpc_url} has chain id "
            f"{actual}: orders signed for one would not verify on the other"
        )
    settings.chain_id = actual
    escrow = check_address(settings.escrow, what="--escrow")
    if int(escrow, 16) and not w3.eth.get_code(escrow):  # type: ignore[arg-type]
        raise InputError(
            f"--escrow {escrow} has no contract code on chain {actual} at {settings.rpc_url}"
        )
    settings.escrow = escrow
    return settings


def _storage(settings: Settings) -> str:
    if settings.database_url:
        parts = urlsplit(settings.database_url)
        host = parts.hostname or ""
        netloc = f"{parts.username}@{host}" if parts.username else host
        if parts.port:
            netloc += f":{parts.port}"
        return f"{parts.scheme.split('+')[0]} {urlunsplit(parts._replace(netloc=netloc))}"
    return f"SQLite {(settings.data_dir / SQLITE_FILE).resolve()}"


def _serve(args: argparse.Namespace) -> int:
    from market.api.app import create_app
    from market.api.server import serve

    chain_id_given = args.chain_id is not None or bool(os.environ.get("MARKET_CHAIN_ID"))
    down = False
    try:
        settings = settings_from_args(args)
        try:
            settings = check_chain(settings, chain_id_given=chain_id_given)
        except ChainError:
            if not chain_id_given:
                raise
            down = True  # serve reads; what needs the escrow answers 503 until the node does
    except (InputError, MarketConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except ChainError as exc:
        print(
            f"error: {exc}\n(give --chain-id to start while the chain is down: the market then "
            "serves reads and says what is missing at /v1/health)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    except EscrowError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        writer = _claim(settings)
    except MarketConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{args.port}"
    print(f"market    {url} (order book page {url}/, API docs {url}/docs)")
    print(f"storage   {_storage(settings)}")
    if settings.rpc_url and down:
        print(
            f"chain     {settings.chain_id} at {settings.rpc_url}: NOT REACHABLE now; serving "
            "reads, orders that need the escrow get 503 until it answers (see /v1/health)"
        )
    elif settings.rpc_url:
        print(f"chain     {settings.chain_id} at {settings.rpc_url}, escrow {settings.escrow}")
    else:
        print("chain     none (--rpc-url): orders are not checked against an escrow's funds")
    print("Ctrl-C stops it.", flush=True)
    serve(
        create_app(settings, settle_heap=True),
        settings,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
    )
    writer.release()
    return 0


def _claim(settings: Settings) -> Partition:
    """Claim the database for this process (`market.partition`): a process serving every class
    holds its claim here for its whole life; one serving named classes is checked here (a clear
    refusal) and claims them for good as its service starts."""
    from market import database
    from market.partition import Partition, classes_of

    writer = Partition(classes_of(settings))
    if not settings.database_url:
        if writer.shared:
            writer.claim(database.make_engine(url="sqlite://"))  # refused: needs PostgreSQL
        writer.claim_file(settings.data_dir)
        return writer
    db = database.make_engine(
        url=database.database_url(data_dir=settings.data_dir, url=settings.database_url)
    )
    writer.claim(db)
    if writer.shared:
        writer.release()
        db.dispose()
    return writer


def main(argv: list[str] | None = None) -> int:
    """Run `market ...` without the entry point: `python -m market.cli market serve`."""
    parser = argparse.ArgumentParser(prog="tpumarket")
    commands = parser.add_subparsers(dest="command", required=True)
    register(commands)
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
