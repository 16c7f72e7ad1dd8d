"""`tpumarket client ...`: what every client and job command shares, and their registration.

The commands live beside it: `client.wallet_cli` (balances, deposit, withdraw),
`client.market_cli` (offers, bid, orders, cancel), `client.deal_cli` (deals, open, close) and
`client.job_cli` (`tpumarket job ...`). A thin layer over the SDK (`client.accounts`,
`client.market_http`, `contracts.orders`): tables in tokens for people, `--json` (one JSON
object on the last line, amounts in base units) for scripts. Keys, addresses and the escrow are
checked at the door. Exit codes: 0 done; 2 a usage or input error (a bad key, address, amount,
file or id); 1 a failure of the chain, the market or a provider; 130 Ctrl-C. Every error is one
line on stderr (`error: ...`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import httpx
import requests
from web3.exceptions import Web3Exception

from client.accounts import ClientAccount
from client.amounts import to_units
from client.errors import ClientError, ClientInputError
from client.market_http import MarketHttp
from client.settings import ClientSettings, load_settings
from client.waits import reported
from contracts.binding import Chain, Escrow, Token
from contracts.cli import InputError, check_address, check_contract, check_private_key, dispatch
from contracts.errors import EscrowError

KEY_ENV = "TPUMARKET_CLIENT_KEY"

Handler = Callable[[argparse.Namespace], int]


class UsageError(InputError):
    """Bad input found after parsing (a missing key or option): exit code 2."""


def parse_amount(text: str) -> int:
    """Parse a positive token amount with at most 6 decimals (``1.5``) into base units."""
    try:
        return to_units(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """Parse a positive integer option."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """Parse an integer option that may be 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


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


def note(message: str) -> None:
    """Say something on stderr (progress and notes; stdout keeps tables and JSON)."""
    print(message, file=sys.stderr, flush=True)


# ---- connections, checked at the door ------------------------------------------------------


def settings_of(args: argparse.Namespace) -> ClientSettings:
    """Return the environment's settings; options left unset take their values from them.

    Read once per command, inside ``guarded`` (a bad variable exits 2 with one line).
    """
    settings: ClientSettings | None = getattr(args, "settings", None)
    if settings is None:
        settings = load_settings()
        args.settings = settings
        for option, value in (
            ("rpc_url", settings.rpc_url),
            ("escrow", settings.escrow),
            ("market_url", settings.market_url),
            ("from_block", settings.escrow_block),
            ("state_dir", settings.client_state),
        ):
            if hasattr(args, option) and getattr(args, option) is None:
                setattr(args, option, value)
    return settings


def key_from(args: argparse.Namespace) -> str:
    """Return the client key from `--key` or the environment, checked (never padded)."""
    key = args.key or settings_of(args).key_text()
    if not key:
        raise UsageError(
            f"no client key: pass --key, set {KEY_ENV} (development) or TPUMARKET_CLIENT_KEYSTORE"
        )
    what = "--key" if args.key else KEY_ENV
    return check_private_key(str(key), what=what)


def escrow_from(args: argparse.Namespace) -> Escrow:
    """Return the escrow named by `--escrow` on `--rpc-url`, checked to be an escrow there."""
    bound: Escrow | None = getattr(args, "_escrow_bound", None)
    if bound is not None:
        return bound
    if not args.escrow:
        raise UsageError("no escrow address: pass --escrow or set TPUMARKET_ESCROW")
    address = check_address(str(args.escrow), what="--escrow")
    chain = Chain(args.rpc_url, policy=settings_of(args).tx_policy())
    expected = settings_of(args).chain_id  # from a deployment file
    if expected is not None and chain.w3.eth.chain_id != expected:
        raise InputError(
            f"the node serves chain id {chain.w3.eth.chain_id}; the deployment "
            f"file is for chain id {expected}"
        )
    check_contract(chain, address, what="--escrow")
    escrow = chain.escrow(address)
    try:
        escrow.token()
    except (Web3Exception, ValueError, EscrowError) as exc:  # it answered get_code just now
        raise InputError(f"--escrow {address} is a contract but not a tpumarket escrow") from exc
    args._escrow_bound = escrow
    return escrow


def account_from(args: argparse.Namespace) -> ClientAccount:
    """Return the client account of `--key` on the escrow of `--escrow`."""
    key = key_from(args)
    escrow = escrow_from(args)
    return ClientAccount(escrow, token_of(args, escrow), key)


def token_of(args: argparse.Namespace, escrow: Escrow) -> Token:
    """Return the escrow's token, sent to under the settings' transaction policy."""
    return Chain(args.rpc_url, policy=settings_of(args).tx_policy()).token(escrow.token())


def market_from(args: argparse.Namespace) -> MarketHttp:
    """Return a client of the market at `--market-url`."""
    if not args.market_url:
        raise UsageError("no market: pass --market-url or set TPUMARKET_MARKET_URL")
    if not str(args.market_url).startswith(("http://", "https://")):
        raise UsageError(f"--market-url is not an http(s) URL: {args.market_url!r}")
    return MarketHttp(args.market_url)


# ---- errors --------------------------------------------------------------------------------

REMOTE_ERRORS = (
    ClientError,
    EscrowError,
    OSError,
    Web3Exception,
    requests.RequestException,
    httpx.HTTPError,
)
"""Failures of the chain, the market or a provider (and of this machine): exit code 1."""


def guarded(handler: Handler) -> Handler:
    """Wrap a handler: one-line errors; bad input exits 2, remote failures exit 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            settings_of(args)
            with reported():  # a request unanswered for seconds is named on stderr
                return handler(args)
        except (InputError, ClientInputError) as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 2
        except REMOTE_ERRORS as exc:
            print(f"error: {_one_line(exc)}", file=sys.stderr, flush=True)
            return 1

    return run


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 400 else text[:397] + "..."


# ---- parser --------------------------------------------------------------------------------


def common_options() -> argparse.ArgumentParser:
    """Return the options every client command shares (chain, escrow, market, key, --json)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--rpc-url",
        default=None,
        help="chain RPC URL (env TPUMARKET_RPC_URL, default http://127.0.0.1:8545)",
    )
    common.add_argument(
        "--escrow",
        default=None,
        help="escrow contract address (env TPUMARKET_ESCROW)",
    )
    common.add_argument(
        "--market-url",
        default=None,
        help="market base URL (env TPUMARKET_MARKET_URL)",
    )
    common.add_argument("--key", default=None, help=f"client private key (env {KEY_ENV})")
    common.add_argument(
        "--json", action="store_true", help="print one JSON object on the last line"
    )
    return common


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `tpumarket client ...` and `tpumarket job ...` (`client.job_cli`)."""
    from client import deal_cli, job_cli, market_cli, wallet_cli  # they build on this module

    job_cli.register(commands)
    client = commands.add_parser(
        "client", help="a client's balances, deposits, offers, bids, orders and deals"
    )
    actions = client.add_subparsers(dest="action", required=True)
    common = common_options()
    wallet_cli.register(actions, common)
    market_cli.register(actions, common)
    deal_cli.register(actions, common)


def build_parser() -> argparse.ArgumentParser:
    """Return a `tpumarket` parser with only the `client` and `job` commands (tests and -m)."""
    parser = argparse.ArgumentParser(prog="tpumarket", description="Accelerator compute market")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `tpumarket client ...` without the entry point: `python -m client.cli client ...`."""
    return dispatch(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
