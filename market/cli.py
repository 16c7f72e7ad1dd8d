"""`tpumarket market serve`: run the market (API, web order book, jobs) in one process.

One process per region: matching is single-writer per device class inside it, so do not run
several workers against one database.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from market.service import Settings


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


def _serve(args: argparse.Namespace) -> int:
    from market.api.app import create_app
    from market.api.server import serve

    settings = settings_from_args(args)
    serve(create_app(settings), settings, host=args.host, port=args.port, log_level=args.log_level)
    return 0


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
