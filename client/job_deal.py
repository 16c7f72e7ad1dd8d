"""What every `tpumarket job` command does first: find the deal, its ledger and its provider.

The deal is read from the chain and the provider's terms are checked against it; the deal's
ledger (``client.ledger``) is opened under ``--state-dir`` and locked, so one process at a
time runs a deal. ``--deal`` takes the chain's deal id or the market's (``cpu:1``, looked up
on the market: ``client.deal_cli.resolve_deal``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from client.accounts import ClientAccount
from client.cli import UsageError, escrow_from, key_from, token_of
from client.deal_cli import resolve_deal, state_dir_of
from client.dispute_evidence import EnvelopeStore, ProgramEvidence
from client.errors import ClientError
from client.jobs import JobRunner
from client.ledger import DealLedger
from client.market_http import MarketHttp
from client.provider_http import ProviderHttp
from client.session import DealSession
from client.vouchers import VoucherBook
from client.watch import deal_logs, find_open_block, market_escrow_block
from contracts.binding import Escrow
from contracts.errors import ChainError
from contracts.messages import Plan


def warn(message: str) -> None:
    """Print a warning on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def chain_now(escrow: Escrow) -> int:
    """Return the chain's time as far as it can be known: its pending block's, or later."""
    pending = int(escrow.tx.w3.eth.get_block("pending")["timestamp"])
    return max(pending, int(time.time()))


def provider_url(args: argparse.Namespace, provider: str) -> str:
    """Return ``--provider-url``, or the provider's endpoint as the market knows it."""
    if args.provider_url:
        return str(args.provider_url)
    if not args.market_url:
        raise UsageError("no provider: pass --provider-url, or --market-url to look it up")
    market = MarketHttp(args.market_url)
    try:
        for advert in market.providers():
            if str(advert.get("address", "")).lower() == provider.lower():
                return str(advert["endpoint"])
    finally:
        market.close()
    raise ClientError(f"the market knows no endpoint for provider {provider}")


def open_ledger(args: argparse.Namespace, escrow: Escrow, *, lock: bool = True) -> DealLedger:
    """Open the deal's ledger (locked unless ``lock=False``: a read-only look)."""
    return DealLedger.open(
        state_dir_of(args), escrow.domain.chain_id, escrow.address, args.deal, lock=lock
    )


def _deal_slo(escrow: Escrow, ledger: DealLedger, lowest: int) -> int | None:
    """Return the deal's sloMs from its ``DealOpened`` event (None if it cannot be found)."""
    try:
        if ledger.open_block is None:
            block, args = find_open_block(escrow, ledger.deal_id, lowest=lowest)
            ledger.open_block = block
            ledger.save()
            return int(args["sloMs"])
        for _, args in deal_logs(
            escrow, "DealOpened", ledger.deal_id, ledger.open_block, ledger.open_block
        ):
            return int(args["sloMs"])
    except ChainError:
        return None
    return None


def open_runner(
    args: argparse.Namespace, cap: int | None, ledger: DealLedger, escrow: Escrow
) -> tuple[JobRunner, int]:
    """Check the deal and the provider's terms against the chain; resume the deal's ledger."""
    key = key_from(args)
    account = ClientAccount(escrow, token_of(args, escrow), key)
    if not 0 < args.deal <= escrow.deal_count():
        raise UsageError(f"no deal {args.deal} on escrow {escrow.address}")
    deal = escrow.get_deal(args.deal)
    if deal.client.lower() != account.address.lower():
        raise ClientError(f"deal {args.deal} belongs to {deal.client}, not to {account.address}")
    provider = ProviderHttp(provider_url(args, deal.provider), client_key=key)
    info = provider.info()
    plan = Plan.from_json(info["plan"])
    if str(info.get("provider", "")).lower() != deal.provider.lower():
        raise ClientError(f"that endpoint serves {info.get('provider')}, not {deal.provider}")
    if plan.struct_hash() != deal.plan_hash:
        raise ClientError("the provider's plan is not the plan the deal was opened with")
    slo_ms = _deal_slo(escrow, ledger, start_block(args)) or int(info["slo_ms"])
    deal_cap = deal.max_spend if cap is None else min(cap, deal.max_spend)
    session = DealSession(
        provider=provider,
        account=account,
        domain=escrow.domain,
        deal_id=args.deal,
        plan=plan,
        provider_address=deal.provider,
        book=VoucherBook(deal_id=args.deal, cap=deal_cap, on_warning=warn),
        challenge_window=deal.challenge_window,
        spot_check_fraction=getattr(args, "spot_check", 0.0),
        slo_ms=slo_ms,
        expiry=deal.expiry,
        grace_s=getattr(args, "grace_s", 5.0),
    )
    arbiter_url = getattr(args, "arbiter_url", None)
    if arbiter_url:
        store = EnvelopeStore(ledger.path.parent / f"{ledger.path.stem}.envelopes")
        session.keep_envelope = store.keep
    runner = JobRunner.resume(session, ledger, say=warn)
    runner.lowest_block = start_block(args)
    if arbiter_url:
        runner.evidence = ProgramEvidence(
            arbiter_url=arbiter_url, domain=escrow.domain, key=key, store=store, say=warn
        )
    return runner, deal_cap


@contextmanager
def deal_and_ledger(
    args: argparse.Namespace, *, lock: bool = True
) -> Iterator[tuple[Escrow, DealLedger]]:
    """Open the escrow and the deal's ledger (locked: one process per deal at a time)."""
    escrow = escrow_from(args)
    ledger = open_ledger(args, escrow, lock=lock)
    try:
        yield escrow, ledger
    finally:
        ledger.close()


def with_deal(handler: Any) -> Any:
    """Wrap a job handler: ``--deal`` (a chain or market deal id) becomes the chain's id."""

    def run(args: argparse.Namespace) -> int:
        args.deal = resolve_deal(args, args.deal)
        code: int = handler(args)
        return code

    return run


@contextmanager
def sigint(handler: Any) -> Iterator[None]:
    """Install a SIGINT handler for the command's duration (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def start_block(args: argparse.Namespace) -> int:
    """Return where to read the escrow's events from: ``--from-block``, else the escrow's
    deployment block as the market tells it (``GET /v1/domain``, asked once), else 0."""
    if args.from_block:
        return int(args.from_block)
    market_url = getattr(args, "market_url", None)
    if market_url:
        block = market_escrow_block(market_url)
        if block:
            args.from_block = block
            return block
    return 0
