"""Scheduled jobs of the market (apscheduler): expire orders, mark silent providers offline,
index the escrow's events."""

from __future__ import annotations

import logging

from apscheduler.schedulers.background import BackgroundScheduler

from market.indexer import Indexer
from market.service import MarketService

log = logging.getLogger(__name__)


def _guard(name: str, job: object) -> object:
    def run() -> None:
        try:
            job()  # type: ignore[operator]
        except Exception:  # a failed run is logged and retried at the next tick
            log.exception("job %s failed", name)

    return run


def start_scheduler(service: MarketService, indexer: Indexer | None) -> BackgroundScheduler:
    """Start the background jobs; return the scheduler (call `shutdown()` to stop it)."""
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
    if indexer is not None:
        scheduler.add_job(
            _guard("index", indexer.run_once),
            "interval",
            seconds=settings.index_every_s,
            id="index",
            **common,
        )
    scheduler.start()
    return scheduler
