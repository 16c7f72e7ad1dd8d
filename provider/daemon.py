"""The daemon: the journal, the sandbox, the task service and the settlement jobs, wired.

The HTTP API (:mod:`provider.api`) serves a :class:`Daemon`; the CLI builds one from a config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from client.market_http import MarketHttp
from contracts.binding import Chain, Escrow
from contracts.messages import Plan
from provider.access import ResultAccess
from provider.capacity import Capacity
from provider.config import ProviderConfig
from provider.deals import DealCache
from provider.errors import RejectedError
from provider.heartbeat import Heartbeat, build_advert
from provider.journal import Journal
from provider.metrics import ProviderMetrics
from provider.sandbox import Sandbox, SandboxLimits
from provider.service import TaskService
from provider.settlement import SettlementJobs

log = logging.getLogger("provider.daemon")
JOURNAL_FILE = "journal.sqlite3"


class Daemon:
    """One provider: owns its journal, sandbox, service, jobs and (optional) heartbeat."""

    def __init__(
        self,
        config: ProviderConfig,
        *,
        chain: Chain | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        """Open the journal (verifying its receipt chains) and start the sandbox workers.

        A ``sandbox`` passed in is shared and left open by :meth:`close`.
        """
        self.config = config
        self.address = config.address
        self.chain = chain or Chain(config.rpc_url)
        self.escrow: Escrow = self.chain.escrow(config.escrow)
        self.domain = self.escrow.domain
        self.access = ResultAccess(config.private_key, self.domain)
        self.metrics = ProviderMetrics()
        self.plans: dict[bytes, Plan] = {config.plan.struct_hash(): config.plan}
        self.deals = DealCache(self.escrow, self.plans, ttl_s=config.deal_cache_ttl_s)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(config.data_dir / JOURNAL_FILE, self.address, self.domain)
        self._owns_sandbox = sandbox is None
        self.sandbox = sandbox or Sandbox(
            config.pool_size,
            SandboxLimits(max_envelope_bytes=config.max_envelope_bytes),
            Path(config.data_dir) / "compile-cache",
            jax_platforms=config.jax_platforms,
        )
        self.service = TaskService(
            private_key=config.private_key,
            address=self.address,
            domain=self.domain,
            journal=self.journal,
            deals=self.deals,
            sandbox=self.sandbox,
            slo_s=config.slo_s,
            workers=config.pool_size,
            metrics=self.metrics,
            max_envelope_bytes=config.max_envelope_bytes,
        )
        self.jobs = SettlementJobs(
            private_key=config.private_key,
            escrow=self.escrow,
            journal=self.journal,
            deals=self.deals,
            config=config.settlement,
            metrics=self.metrics,
        )
        self.capacity: Capacity | None = None
        self.heartbeat: Heartbeat | None = None

    def plan_for_deal(self, deal_id: int) -> Plan | None:
        """Return the plan of one of our deals (reads the chain once per TTL)."""
        try:
            return self.deals.plan_of(self.deals.get(deal_id))
        except RejectedError:
            return None

    def start(self, *, schedule: bool = True) -> None:
        """Re-run unfinished tasks; start the settlement jobs and heartbeat unless ``schedule``
        is false (tests trigger jobs directly)."""
        self.service.recover(self.plan_for_deal)
        self.jobs.reconcile_claims()  # claims mined but not journaled before a crash
        extra: list[tuple[Callable[[], object], float]] = []
        if self.config.market_url:
            self.capacity = self.sandbox.capacity(benchmark=self.config.benchmark_on_start)
            endpoint = self.config.public_url or f"http://{self.config.host}:{self.config.port}"
            self.heartbeat = Heartbeat(
                MarketHttp(self.config.market_url),
                private_key=self.config.private_key,
                provider=self.address,
                advert=build_advert(
                    capacity=self.capacity,
                    plan=self.config.plan,
                    slo_ms=self.config.slo_ms,
                    endpoint=endpoint,
                    domain=self.domain,
                ),
                domain=self.domain,
                metrics=self.metrics,
            )
            self.heartbeat.beat()
            extra.append((self.heartbeat.beat, self.config.heartbeat_interval_s))
        if schedule:
            self.jobs.start(extra)
        log.info(
            "provider daemon started",
            extra={
                "provider": self.address,
                "chain_id": self.domain.chain_id,
                "escrow": self.domain.verifying_contract,
                "receipts_verified": sum(len(b.receipts) for _, b in self.journal.iter_books()),
            },
        )

    def close(self) -> None:
        """Stop jobs and tasks, close the sandbox (if ours) and the journal."""
        self.jobs.stop()
        self.service.close()
        if self._owns_sandbox:
            self.sandbox.close()
        if self.heartbeat is not None:
            self.heartbeat.market.close()
        self.journal.close()
