"""``tpumarket arbiter run``: watch the disputes that name this arbiter, take evidence, rule.

Registered through the ``tpumarket.commands`` entry point ``arbiter``; ``python -m
provider.arbiter.cli run ...`` works without it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path

from provider.errors import ProviderError

log = logging.getLogger("provider.arbiter")


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``tpumarket arbiter ...``."""
    arbiter = commands.add_parser("arbiter", help="rule disputed claims by re-executing them")
    actions = arbiter.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", help="serve the evidence API and rule disputes on chain")
    run.add_argument("--config", type=Path, default=None, help="TOML file (env vars override)")
    run.add_argument("--host", default=None, help="bind address (default: from config)")
    run.add_argument("--port", type=int, default=None, help="port (default: from config)")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    import uvicorn

    from contracts.binding import Chain
    from contracts.errors import EscrowError
    from provider.arbiter.advert import AdvertJob
    from provider.arbiter.api import create_app
    from provider.arbiter.config import load_settings
    from provider.arbiter.journal import ArbiterJournal
    from provider.arbiter.service import Arbiter, ArbiterTerms
    from provider.logs import configure_logging
    from provider.sandbox import Sandbox

    try:
        settings = load_settings(args.config, host=args.host, port=args.port)
        chain = Chain(settings.rpc_url, policy=settings.tx_policy())
        if settings.chain_id is not None and chain.w3.eth.chain_id != settings.chain_id:
            raise ProviderError(
                f"the node serves chain id {chain.w3.eth.chain_id}; the deployment is for chain "
                f"id {settings.chain_id}"
            )
        escrow = chain.escrow(settings.escrow)
        if not chain.w3.eth.get_code(escrow.address):
            raise ProviderError(f"no contract at escrow {escrow.address} ({settings.rpc_url})")
        escrow.arbitration_period()  # an escrow answers; anything else raises
        key = settings.private_key()
    except ProviderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (EscrowError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    configure_logging("INFO")
    journal = ArbiterJournal(settings.data_dir.resolve())
    arbiter = Arbiter(
        escrow=escrow,
        key=key,
        journal=journal,
        sandbox=lambda: Sandbox(pool_size=1, jax_platforms="cpu"),
        terms=ArbiterTerms(
            evidence_window_s=settings.evidence_window_s,
            ruling_margin_s=settings.ruling_margin_s,
            fee=settings.fee,
        ),
        from_block=settings.from_block,
    )
    try:
        # The fee deals opened from now on take (a deal keeps the fee it opened with).
        if escrow.arbiter_fee(arbiter.address) != settings.fee:
            escrow.set_arbiter_fee(key, settings.fee)
    except EscrowError as exc:
        print(f"error: setting the arbiter fee on chain failed: {exc}", file=sys.stderr)
        return 1
    advert = None
    if settings.market_url:
        advert = AdvertJob(
            market_url=settings.market_url,
            chain_id=escrow.domain.chain_id,
            escrow=escrow.address,
            key=key,
            address=arbiter.address,
            url=settings.public_url or f"http://{settings.host}:{settings.port}",
            terms=arbiter.terms,
            journal=journal,
            interval_s=settings.advert_interval_s,
        )
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                arbiter.tick()
            except Exception:  # a node hiccup: log it, the next tick reads again
                log.exception("arbiter tick failed")
            if advert is not None:
                advert.tick()
            stop.wait(settings.poll_interval_s)

    worker = threading.Thread(target=loop, name="arbiter-ticks", daemon=True)
    worker.start()
    print(f"arbiter {arbiter.address} on http://{settings.host}:{settings.port}", flush=True)
    try:
        uvicorn.run(
            create_app(arbiter),
            host=settings.host,
            port=settings.port,
            ws="none",
            log_config=None,
            access_log=False,
            limit_concurrency=256,
        )
    finally:
        stop.set()
        worker.join(timeout=30)
        arbiter.close()
        journal.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``arbiter ...`` without the ``tpumarket`` entry point."""
    parser = argparse.ArgumentParser(prog="tpumarket")
    register(parser.add_subparsers(dest="command", required=True))
    namespace = parser.parse_args(["arbiter", *(sys.argv[1:] if argv is None else argv)])
    code: int = namespace.handler(namespace)
    return code


if __name__ == "__main__":
    sys.exit(main())
