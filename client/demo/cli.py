"""The command line: `tpumarket demo` (entry point `client.demo:register`) and `-m client.demo`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from client.demo.runner import DemoOptions, run
from client.demo.summary import Summary
from client.errors import ClientError
from contracts.errors import ChainError

HELP = "run the whole market end to end on a local chain"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="keep the chain, market and providers up after the summary, until Ctrl-C",
    )
    parser.add_argument(
        "--rpc-url",
        default=None,
        help="use this anvil (dev mnemonic) instead of starting one; contracts are deployed",
    )
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="keep data dirs and logs here (default: temp)"
    )


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `tpumarket demo`."""
    demo = commands.add_parser("demo", help=HELP)
    add_arguments(demo)
    demo.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the demo with parsed options; return the exit code."""
    options = DemoOptions(
        json=args.json, keep_running=args.keep_running, rpc_url=args.rpc_url, work_dir=args.work_dir
    )

    def say(line: str) -> None:
        print(line, flush=True)

    def report(summary: Summary) -> None:
        if options.json:
            print(json.dumps(summary.to_json()), flush=True)

    try:
        run(options, say, report)
    except (ChainError, ClientError) as exc:  # DemoError is a ClientError
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted: everything the demo started is stopped", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the demo without the `tpumarket` entry point: `python -m client.demo`."""
    parser = argparse.ArgumentParser(prog="tpumarket demo", description=HELP)
    add_arguments(parser)
    return handle(parser.parse_args(argv))
