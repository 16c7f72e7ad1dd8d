"""``tpumarket provider run --config FILE``: serve the daemon's API with uvicorn.

The operator's other commands (``stake``, ``unstake``, ``ask``, ``asks``, ``deals``,
``earnings``, ``status``) live in :mod:`provider.operator`; ``balance`` and ``withdraw`` (the
provider's money in the escrow, and taking its earnings out) in :mod:`provider.wallet_cli`;
``verify-journal`` in :mod:`provider.journal.command`.

Registered through the ``tpumarket.commands`` entry point ``provider = "provider.cli:register"``;
``python -m provider.cli run ...`` works without it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from provider.errors import ProviderError

if TYPE_CHECKING:
    from provider.config import ProviderConfig
    from provider.warm_sandbox import WarmingSandbox
    from provider.warmup import Warmup


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``tpumarket provider ...``."""
    from provider import operator, wallet_cli
    from provider.journal import command as journal_command

    provider = commands.add_parser("provider", help="run and operate the provider daemon")
    actions = provider.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", help="serve tasks, sign receipts, settle on chain")
    run.add_argument("--config", type=Path, default=None, help="TOML file (env vars override)")
    run.add_argument("--host", default=None, help="bind address (default: from config)")
    run.add_argument("--port", type=int, default=None, help="port (default: from config)")
    run.add_argument(
        "--no-jobs", action="store_true", help="do not schedule settlement jobs (debugging)"
    )
    run.set_defaults(handler=_run)
    operator.register(actions)
    wallet_cli.register(actions)
    journal_command.register(actions)


def _run(args: argparse.Namespace) -> int:
    """Serve the daemon: its API answers once the journal is open and its unfinished tasks
    recovered, while the sandbox's workers, the capacity benchmark, the heartbeat and the ask
    warm up behind it (:mod:`provider.warmup`)."""
    from provider.config import load_config, to_address
    from provider.warmup import Warmup, since_process_start

    imported = since_process_start()
    warmup = Warmup()
    if imported is not None:
        warmup.record("process", imported)  # the interpreter and the CLI, before any phase
    try:
        config = load_config(args.config)
        # A relative data dir is the operator's working directory's, also for the sandbox.
        config = config.replace(data_dir=config.data_dir.resolve())
        if args.host is not None:
            config = config.replace(host=args.host)
        if args.port is not None:  # validated like the config's own value
            config = config.replace(port=args.port)
    except ProviderError as exc:  # a ConfigError names its key (it is a ValueError too)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        to_address(config.escrow)  # checked again with the chain below; no workers for a typo
    except ValueError as exc:
        print(f"error: escrow: {exc}", file=sys.stderr)
        return 2
    # The workers import JAX for seconds: start them before this process's own imports.
    from provider.warm_sandbox import WarmingSandbox

    config.data_dir.mkdir(parents=True, exist_ok=True)
    sandbox = WarmingSandbox(config, warmup)
    try:
        return _serve(args, config, sandbox, warmup)
    finally:
        sandbox.close()


def _serve(
    args: argparse.Namespace, config: ProviderConfig, sandbox: WarmingSandbox, warmup: Warmup
) -> int:
    with warmup.phase("imports"):
        from contracts.errors import EscrowError
        from provider.api import create_app
        from provider.api.server import serve
        from provider.daemon import Daemon
        from provider.logs import configure_logging
        from provider.operator import connect
        from provider.sandbox import Sandbox

    try:
        with warmup.phase("chain"):
            connect(args)  # the config's escrow: an address with an escrow's code on its chain
    except ProviderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except EscrowError as exc:  # the chain does not answer
        print(f"error: {exc}", file=sys.stderr)
        return 1
    configure_logging(config.log_level, scheduler=config.log_scheduler)
    warmup.log_from_now()
    try:
        with warmup.phase("journal"):
            daemon = Daemon(config, sandbox=cast(Sandbox, sandbox), warmup=warmup)
    except ProviderError as exc:  # e.g. a journal whose receipt chain does not verify
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            with warmup.phase("recover"):
                daemon.start(schedule=not args.no_jobs, background=True)
        except ProviderError as exc:  # e.g. a settlement config too slow for a deal's window
            print(f"error: {exc}", file=sys.stderr)
            return 2
        serve(create_app(daemon), config)  # slow and idle connections closed
    finally:
        daemon.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``provider ...`` without the ``tpumarket`` entry point."""
    parser = argparse.ArgumentParser(prog="tpumarket")
    register(parser.add_subparsers(dest="command", required=True))
    namespace = parser.parse_args(["provider", *(sys.argv[1:] if argv is None else argv)])
    code: int = namespace.handler(namespace)
    return code


if __name__ == "__main__":
    sys.exit(main())
