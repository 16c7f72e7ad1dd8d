"""The `tpumarket` command: subcommands are registered by each package through entry points."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable
from importlib.metadata import entry_points

from contracts.binding import DEFAULT_MIN_CHALLENGE_WINDOW, Chain
from contracts.chain import Anvil
from contracts.errors import EscrowError
from contracts.messages import address_of

DEV_TOKENS = 10**6 * 10**6  # one million tokens of 6 decimals per dev account

Register = Callable[[argparse._SubParsersAction], None]  # type: ignore[type-arg]


def main(argv: list[str] | None = None) -> int:
    """Run the `tpumarket` command line."""
    parser = argparse.ArgumentParser(prog="tpumarket", description="Accelerator compute market")
    commands = parser.add_subparsers(dest="command", required=True)
    for entry in sorted(entry_points(group="tpumarket.commands"), key=lambda e: e.name):
        register: Register = entry.load()
        register(commands)
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except EscrowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code


def register_chain(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `tpumarket chain ...`."""
    chain = commands.add_parser("chain", help="run a local chain with the contracts deployed")
    actions = chain.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="start anvil, deploy token and escrow, fund dev accounts")
    up.add_argument("--port", type=int, default=None, help="RPC port (default: a free one)")
    up.add_argument("--accounts", type=int, default=10, help="dev accounts to fund")
    up.add_argument("--json", action="store_true", help="print the chain's details as JSON")
    up.add_argument(
        "--min-challenge-window",
        type=int,
        default=DEFAULT_MIN_CHALLENGE_WINDOW,
        help="shortest challenge window (s) a quote may set on this escrow "
        f"(default {DEFAULT_MIN_CHALLENGE_WINDOW})",
    )
    up.set_defaults(handler=_chain_up)


def _chain_up(args: argparse.Namespace) -> int:
    with Anvil.start(port=args.port, accounts=args.accounts) as anvil:
        chain = Chain(anvil.url)
        deployer = anvil.keys[0]
        if args.min_challenge_window < 1:
            print("error: --min-challenge-window must be at least 1 second", file=sys.stderr)
            return 2
        deployment = chain.deploy(deployer, min_challenge_window=args.min_challenge_window)
        token = chain.token(deployment.token)
        for key in anvil.keys:
            token.mint(deployer, address_of(key), DEV_TOKENS)
        details = {
            "rpc_url": anvil.url,
            "chain_id": anvil.chain_id,
            "anvil_pid": anvil.pid,
            "token": deployment.token,
            "escrow": deployment.escrow,
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
            print("In another shell:")
            print(f"  export TPUMARKET_RPC_URL={anvil.url}")
            print(f"  export TPUMARKET_ESCROW={deployment.escrow}")
            print(f"  export TPUMARKET_CLIENT_KEY={anvil.keys[1]}")
            print("Ctrl-C stops the chain.", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
