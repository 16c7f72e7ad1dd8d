"""The settlement pass on a timer: every ``interval_s`` on an apscheduler ``BackgroundScheduler``,
the first pass at once (after a restart, whatever came due while the daemon was down is settled
then); a pass still running when the next is due is logged and counted as a chain stall."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Sequence

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from provider.settlement.context import SettlementContext

log = logging.getLogger("provider.settlement")


class SettlementSchedule:
    """Run one settlement pass every ``interval_s`` (plus extra periodic jobs) until stopped."""

    def __init__(self, ctx: SettlementContext, run_all: Callable[[], object]) -> None:
        """Schedule ``run_all`` (one settlement pass), once started."""
        self.ctx = ctx
        self.run_all = run_all
        self._scheduler: BackgroundScheduler | None = None
        self._pass_started: float | None = None

    def start(self, extra: Sequence[tuple[Callable[[], object], float]] = ()) -> None:
        """Run the pass every ``interval_s``, the first at once (plus ``extra``, each every its
        seconds)."""
        scheduler = BackgroundScheduler(daemon=True)
        scheduler.add_job(
            self._safe_run_all,
            "interval",
            seconds=self.ctx.config.interval_s,
            max_instances=1,
            coalesce=True,
            id="settlement",
            next_run_time=datetime.datetime.now(datetime.UTC),
        )
        for i, (job, seconds) in enumerate(extra):
            scheduler.add_job(
                job, "interval", seconds=seconds, max_instances=1, coalesce=True, id=f"extra-{i}"
            )
        scheduler.add_listener(self._still_running, EVENT_JOB_MAX_INSTANCES)
        scheduler.start()
        self._scheduler = scheduler

    def _still_running(self, event: JobSubmissionEvent) -> None:
        """Say why a job was skipped: its previous run still waits on the chain."""
        if event.job_id != "settlement":
            return
        self.ctx.metrics.chain_stalls.inc()
        started = self._pass_started
        running = 0.0 if started is None else time.monotonic() - started
        log.warning(
            "settlement pass still running when the next was due: the chain answers slowly "
            "or not at all (stalled)",
            extra={
                "running_s": round(running, 1),
                "interval_s": self.ctx.config.interval_s,
                "rpc_url": self.ctx.escrow.tx.w3.provider.endpoint_uri,  # type: ignore[attr-defined]
            },
        )

    def _safe_run_all(self) -> None:
        self._pass_started = time.monotonic()
        try:
            self.run_all()
        except Exception:  # a job must never kill the scheduler thread
            log.exception("settlement pass failed")
        finally:
            took = time.monotonic() - self._pass_started
            self._pass_started = None
            self.ctx.metrics.settlement_pass_seconds.set(took)

    def stop(self) -> None:
        """Stop the scheduler (jobs in progress finish)."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
