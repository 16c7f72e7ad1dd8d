"""The `tpumarket` command: subcommands are registered by each package through entry points.

Also what every command checks at the door (keys, addresses, contracts, chain ids) and how every
command ends: `dispatch` turns a bad input into one line on stderr and exit 2, a failure of the
chain or another remote party into one line and exit 1, Ctrl-C into `interrupted` and exit 130.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import string
import sys
import threading
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.errors import EscrowError

if TYPE_CHECKING:
    from contracts.binding import Chain

DEV_TOKENS = 10**6 * 10**6  # one million tokens of 6 decimals per dev account
INTERRUPTED = 130  # the shell's code for a command ended by SIGINT
SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
DEFAULT_MARKET_URL = "http://127.0.0.1:8000"  # `tpumarket market serve` without --port

Register = Callable[[argparse._SubParsersAction], None]  # type: ignore[type-arg]


class InputError(EscrowError, ValueError):
    """A bad input found at the door (a key, an address, a chain id): exit code 2."""


def check_private_key(text: str, *, what: str = "key") -> str:
    """Return `text` as a private key (0x and 64 hex digits, in 1..n-1); never pad or echo it."""
    digits = text.strip().removeprefix("0x").removeprefix("0X")
    if len(digits) != 64 or any(c not in string.hexdigits for c in digits):
        shape = "hex digits" if all(c in string.hexdigits for c in digits) else "characters"
        raise InputError(
            f"{what} is not a private key: expected 0x and 64 hex digits, got {len(digits)} {shape}"
        )
    if not 0 < int(digits, 16) < SECP256K1_ORDER:
        raise InputError(f"{what} is not a private key: it must be between 1 and the curve order")
    return "0x" + digits.lower()


def check_address(text: str, *, what: str = "address") -> str:
    """Return `text` as a checksummed address (0x and 40 hex digits; mixed case must check)."""
    from eth_utils.address import is_address, to_checksum_address

    if not is_address(text.strip()):
        raise InputError(f"{what} is not an address: {text!r} (expected 0x and 40 hex digits)")
    return str(to_checksum_address(text.strip()))


def check_contract(chain: Chain, address: str, *, what: str = "contract") -> None:
    """Raise InputError unless the chain holds contract code at `address`."""
    if not chain.w3.eth.get_code(check_address(address, what=what)):  # type: ignore[arg-type]
        raise InputError(
            f"{what} {address} has no contract code on chain {chain.w3.eth.chain_id} at "
            f"{chain.rpc_url}: is it the address `tpumarket chain up` printed?"
        )


def dispatch(args: argparse.Namespace) -> int:
    """Run a parsed command: one-line errors (2: bad input, 1: remote failure), 130: Ctrl-C."""
    from programs.envelope import ProgramFormatError  # numpy: not on `--version`'s path

    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED
    except (InputError, ProgramFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except EscrowError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return code


def _version() -> str:
    try:
        return version("tpumarket")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Run the `tpumarket` command line."""
    words = sys.argv[1:] if argv is None else argv
    if words == ["--version"]:  # answered before any subcommand (and web3) is imported
        print(f"tpumarket {_version()}", flush=True)
        return 0
    parser = argparse.ArgumentParser(prog="tpumarket", description="Accelerator compute market")
    parser.add_argument("--version", action="version", version=f"tpumarket {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    groups = sorted(entry_points(group="tpumarket.commands"), key=lambda e: e.name)
    # A command that names its group loads that group alone (`provider run` starts without
    # importing the market's or the client's modules); anything else loads them all.
    named = [entry for entry in groups if words and entry.name == words[0]]
    for entry in named or groups:
        register: Register = entry.load()
        register(commands)
    try:
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        return INTERRUPTED
    return dispatch(args)


def register_chain(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `tpumarket chain ...`."""
    from contracts.binding import DEFAULT_MIN_CHALLENGE_WINDOW

    chain = commands.add_parser("chain", help="run a local chain with the contracts deployed")
    actions = chain.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="start anvil, deploy token and escrow, fund dev accounts")
    up.add_argument("--port", type=int, default=None, help="RPC port (default: a free one)")
    up.add_argument(
        "--accounts", type=_dev_accounts, default=10, help="dev accounts to fund (at least 4)"
    )
    up.add_argument("--json", action="store_true", help="print the chain's details as JSON")
    up.add_argument(
        "--min-challenge-window",
        type=int,
        default=DEFAULT_MIN_CHALLENGE_WINDOW,
        help="shortest challenge window (s) a quote may set on this escrow "
        f"(default {DEFAULT_MIN_CHALLENGE_WINDOW})",
    )
    up.add_argument(
        "--deployment-out",
        type=Path,
        default=None,
        help="also write the local deployment's file here (read by every component's "
        "`deployment` setting)",
    )
    up.set_defaults(handler=_chain_up)
    from contracts.deploy_cli import register_deploy

    register_deploy(actions)


def _dev_accounts(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if count < 4:  # deployer, client, provider, arbiter
        raise argparse.ArgumentTypeError(f"at least 4 accounts: {text!r}")
    return count


def _chain_up(args: argparse.Namespace) -> int:
    from contracts.binding import Chain
    from contracts.chain import Anvil
    from contracts.deployment import deploy, write_deployment
    from contracts.signing import address_of

    if args.min_challenge_window < 1:
        raise InputError("--min-challenge-window must be at least 1 second")
    if args.deployment_out is not None and args.deployment_out.exists():
        raise InputError(f"{args.deployment_out} exists; choose a new path for the deployment file")
    with Anvil.start(port=args.port, accounts=args.accounts) as anvil:
        chain = Chain(anvil.url)
        deployer = anvil.keys[0]
        deployment = deploy(chain, deployer, min_challenge_window=args.min_challenge_window)
        if args.deployment_out is not None:
            write_deployment(args.deployment_out, deployment)
        token = chain.token(deployment.token)
        for key in anvil.keys:
            token.mint(deployer, address_of(key), DEV_TOKENS)
        details = {
            "rpc_url": anvil.url,
            "chain_id": anvil.chain_id,
            "anvil_pid": anvil.pid,
            "token": deployment.token,
            "escrow": deployment.escrow,
            "deployment_block": deployment.deployment_block,
            "min_challenge_window": args.min_challenge_window,
            "dev_accounts": [{"address": address_of(k), "private_key": k} for k in anvil.keys],
        }
        if args.json:
            print(json.dumps(details), flush=True)
        else:
            print(f"RPC URL   {anvil.url} (chain id {anvil.chain_id}, anvil pid {anvil.pid})")
            print(f"token     {deployment.token} (6 decimals)")
            print(f"escrow    {deployment.escrow}")
            print(f"windows   challenge windows of at least {args.min_challenge_window} s")
            print("dev accounts (each holds 1,000,000 tokens and 10,000 ether):")
            for account in details["dev_accounts"]:  # type: ignore[attr-defined]
                print(f"  {account['address']}  {account['private_key']}")
            print("In each other shell (the client is dev account 1, the provider account 2,")
            print(f"the arbiter account 3; the market at {DEFAULT_MARKET_URL}):")
            for line in export_lines(details):
                print(f"  {line}")
            print("Ctrl-C stops the chain.", flush=True)
        stop = threading.Event()  # SIGTERM stops the chain; Ctrl-C too (KeyboardInterrupt)
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


def export_lines(details: dict[str, Any]) -> list[str]:
    """Return the shell lines that point the client, provider and market commands at a chain."""
    from contracts.signing import address_of

    keys = [str(a["private_key"]) for a in details["dev_accounts"]]
    rpc, escrow = details["rpc_url"], details["escrow"]
    return [
        f"export TPUMARKET_RPC_URL={rpc} TPUMARKET_ESCROW={escrow} "
        f"TPUMARKET_CHAIN_ID={details['chain_id']}",
        f"export TPUMARKET_MARKET_URL={DEFAULT_MARKET_URL}",
        f"export TPUMARKET_CLIENT_KEY={keys[1]}",
        f"export TPUMARKET_PROVIDER_PRIVATE_KEY={keys[2]} TPUMARKET_PROVIDER_RPC_URL={rpc} "
        f"TPUMARKET_PROVIDER_ESCROW={escrow}",
        f"export TPUMARKET_PROVIDER_MARKET_URL={DEFAULT_MARKET_URL} "
        f"TPUMARKET_PROVIDER_ASK_ARBITER={address_of(keys[3])}",
    ]


if __name__ == "__main__":
    sys.exit(main())
