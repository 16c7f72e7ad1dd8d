"""Scheduled jobs of the market (apscheduler): expire orders, mark silent providers offline,
index the escrow's events, delete history past its retention."""

from __future__ import annotations

import logging
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler

from market import storage
from market.service import MarketService

log = logging.getLogger(__name__)


class ChainJob(Protocol):
    """What the chain job runs: `market.indexer.Indexer` or `market.follower.ChainFollow`."""

    def run_once(self) -> int: ...


def _guard(name: str, job: object) -> object:
    def run() -> None:
        try:
            job()  # type: ignore[operator]
        except Exception:  # a failed run is logged and retried at the next tick
            log.exception("job %s failed", name)

    return run


PRUNE_BATCH = 10_000
"""Rows deleted per transaction by the retention job (the writer waits at most that long)."""


def prune_history(service: MarketService) -> tuple[int, int]:
    """Delete fills and finished orders past the settings' retention, a batch per transaction;
    return (fills, orders) deleted."""
    settings = service.settings
    total = [0, 0]
    while True:
        with service.db.begin() as connection:
            fills, orders = storage.prune_history(
                connection=connection,
                now=service.now(),
                fills_days=settings.fills_retention_days,
                orders_days=settings.orders_retention_days,
                limit=PRUNE_BATCH,
            )
        total[0] += fills
        total[1] += orders
        if fills < PRUNE_BATCH and orders < PRUNE_BATCH:
            break
    if any(total):
        log.info("retention: deleted %d fills and %d orders", *total)
    return total[0], total[1]


def start_scheduler(service: MarketService, indexer: ChainJob | None) -> BackgroundScheduler:
    """Start the background jobs; return the scheduler (call `shutdown()` to stop it). The
    chain job is `indexer`: an indexer, or a process's share of one (`market.follower`)."""
    settings = service.settings
    scheduler = BackgroundScheduler(daemon=True)
    common = {"max_instances": 1, "coalesce": True}
    scheduler.add_job(
        _guard("expire", service.expire_orders),
        "interval",
        seconds=settings.expire_every_s,
        id="expire",
        **common,
    )
    scheduler.add_job(
        _guard("offline", service.mark_offline),
        "interval",
        seconds=settings.offline_every_s,
        id="offline",
        **common,
    )
    scheduler.add_job(  # the backstop of the indexer's rereads; nothing without a gate
        _guard("bidders", service.refresh_bidders),
        "interval",
        seconds=settings.rematch_every_s,
        id="bidders",
        **common,
    )
    scheduler.add_job(  # does nothing while the market matches without a gate
        _guard("rematch", service.rematch),
        "interval",
        seconds=settings.rematch_every_s,
        id="rematch",
        **common,
    )
    if indexer is not None:
        scheduler.add_job(
            _guard("index", indexer.run_once),
            "interval",
            seconds=settings.index_every_s,
            id="index",
            **common,
        )
    if settings.fills_retention_days is not None or settings.orders_retention_days is not None:
        scheduler.add_job(
            _guard("retention", lambda: prune_history(service)),
            "interval",
            seconds=settings.retention_every_s,
            id="retention",
            **common,
        )
    scheduler.start()
    return scheduler
