"""The daemon: the journal, the sandbox, the task service and the settlement jobs, wired.

The HTTP API (:mod:`provider.api`) serves a :class:`Daemon`; the CLI builds one from a config.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from client.market_http import MarketHttp
from contracts.binding import Chain, Escrow
from contracts.errors import ChainError, ContractRevert
from contracts.messages import Plan
from provider.access import REVOCATIONS_FILE, ResultAccess
from provider.asks import AskJob
from provider.capacity import Capacity, compile_class
from provider.clock import ChainClock
from provider.config import LOCK_FILE, AskConfig, ProviderConfig
from provider.deals import DealCache
from provider.dispute_evidence import DisputeEvidence
from provider.endpoint import daemon_url
from provider.errors import ConfigError, RejectedError
from provider.heartbeat import Heartbeat, build_advert
from provider.journal import Journal
from provider.metrics import ProviderMetrics
from provider.quotes import QuoteJob
from provider.receipts import canonical_json
from provider.sandbox import Sandbox
from provider.service import TaskService
from provider.settlement import SettlementJobs
from provider.warm_sandbox import build_sandbox
from provider.warmup import Warmup

log = logging.getLogger("provider.daemon")
JOURNAL_FILE = "journal.sqlite3"
JOURNAL_UPKEEP_S = 60.0
"""Seconds between journal upkeep passes: seal closed and settled deals, check a batch of
sealed ones (``verify-journal`` checks them all at once)."""
JOURNAL_VERIFY_BATCH = 200
"""Sealed deals checked against their seals per upkeep pass."""
MARKET_PHASES = ("capacity", "heartbeat", "ask")
"""The start phases that put the daemon on the market (the ask only with an ``[ask]``)."""


class DataDirLockedError(ConfigError):
    """Raised when another daemon holds the data dir's lock (its PID in the message)."""


class DataDirLock:
    """An exclusive ``flock`` on ``<data_dir>/daemon.lock``, held for the daemon's life.

    Two daemons on one data dir would sign two receipt chains for the same deals; the second
    one refuses at start instead. The kernel drops the lock when its holder exits, however it
    exits (``kill -9`` included), so a restart after a crash finds the dir free. The file
    holds the holder's PID, for the error message only: the lock, not the file, decides.
    """

    def __init__(self, data_dir: Path) -> None:
        """Take the lock or raise :class:`DataDirLockedError` naming the holder's PID."""
        self.path = data_dir / LOCK_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLockedError(
                f"data dir {data_dir} is in use by another provider daemon (pid {holder}); "
                "stop it first, or give this daemon its own data_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays, its PID is stale and ignored."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor releases the flock


class Daemon:
    """One provider: owns its journal, sandbox, service, jobs and (optional) heartbeat."""

    def __init__(
        self,
        config: ProviderConfig,
        *,
        chain: Chain | None = None,
        sandbox: Sandbox | None = None,
        warmup: Warmup | None = None,
    ) -> None:
        """Open the journal (verifying its receipt chains) and start the sandbox workers.

        A ``sandbox`` passed in is shared and left open by :meth:`close` (the CLI passes one
        whose workers are still starting: :mod:`provider.warm_sandbox`). ``warmup`` tracks
        the start phases that ``/v1/health`` lists as warming.
        """
        self.config = config
        self.warmup = warmup or Warmup()
        self.address = config.address
        self.chain = chain or Chain(config.rpc_url, policy=config.settlement.tx_policy())
        self.escrow: Escrow = self.chain.escrow(config.escrow)
        self.domain = self.escrow.domain
        if config.chain_id is not None and self.domain.chain_id != config.chain_id:
            raise ConfigError(
                f"the node serves chain id {self.domain.chain_id}; the configured deployment "
                f"is for chain id {config.chain_id}"
            )
        self.access = ResultAccess(
            config.private_key, self.domain, revocations=config.data_dir / REVOCATIONS_FILE
        )
        self.metrics = ProviderMetrics()
        self.plans: dict[bytes, Plan] = {config.plan.struct_hash(): config.plan}
        self.deals = DealCache(self.escrow, self.plans, ttl_s=config.deal_cache_ttl_s)
        self.clock = ChainClock(self._latest_block_time)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.lock = DataDirLock(config.data_dir)
        try:
            self.journal = Journal(
                config.data_dir / JOURNAL_FILE,
                self.address,
                self.domain,
                private_key=config.private_key,
            )
        except BaseException:
            self.lock.release()
            raise
        self.metrics.restore(self.journal.settlement_history())
        self.jobs = SettlementJobs(
            private_key=config.private_key,
            escrow=self.escrow,
            journal=self.journal,
            deals=self.deals,
            config=config.settlement,
            metrics=self.metrics,
            clock=self.clock,
        )
        self._owns_sandbox = sandbox is None
        try:
            self.sandbox = sandbox or build_sandbox(config)
        except BaseException:
            self.journal.close()
            self.lock.release()
            raise
        self.service = TaskService(
            config,
            domain=self.domain,
            journal=self.journal,
            deals=self.deals,
            sandbox=self.sandbox,
            metrics=self.metrics,
            clock=self.clock.now,
            refresh_settled=self._refresh_settled,
            ready=self.warmup.serving,
        )
        self.capacity: Capacity | None = None
        self.heartbeat: Heartbeat | None = None
        self.market: MarketHttp | None = None
        self.quotes: QuoteJob | None = None
        self.asks: AskJob | None = None
        self.disputes: DisputeEvidence | None = None
        if config.market_url:
            self.market = MarketHttp(config.market_url)
            self.quotes = QuoteJob(
                market=self.market,
                private_key=config.private_key,
                escrow=self.escrow,
                journal=self.journal,
                plans=self.plans,
                slo_ms=config.slo_ms,
                settlement=config.settlement,
                metrics=self.metrics,
                clock=self.clock,
                arbiters=config.ask.accepted_arbiters() if config.ask is not None else None,
            )

    @staticmethod
    def _ask_classes(terms: AskConfig, capacity: Capacity) -> tuple[str, ...]:
        """Return the classes the ask goes to: the devices' (or the config's), then one
        compile-check class per TPU generation the host compiles for."""
        classes = [terms.device_class or capacity.devices.device_class]
        if terms.compile_checks:
            for target in capacity.compile_targets:
                name = compile_class(target.name)
                if name not in classes:
                    classes.append(name)
        return tuple(classes)

    def _latest_block_time(self) -> int:
        return int(self.chain.w3.eth.get_block("latest")["timestamp"])

    def _refresh_settled(self, deal_id: int) -> None:
        try:
            self.jobs.sync_overdue(deal_id)
        except (ChainError, ContractRevert) as exc:
            raise RejectedError("chain_unavailable", f"cannot read deal {deal_id}: {exc}") from exc

    def plan_for_deal(self, deal_id: int) -> Plan | None:
        """Return the plan of one of our deals (reads the chain once per TTL)."""
        try:
            return self.deals.plan_of(self.deals.get(deal_id))
        except RejectedError:
            return None

    def start(self, *, schedule: bool = True, background: bool = False) -> None:
        """Check the settlement timing against our deals, re-run unfinished tasks, and start
        the settlement jobs (first pass at once), quotes and heartbeat unless ``schedule`` is
        false (tests trigger jobs directly); then, with a market, measure the host, beat and
        post the ask (on a thread with ``background``: the API serves meanwhile, and
        ``/v1/health`` lists those phases as warming).

        Raise :class:`ConfigError` when the settlement config cannot meet the challenge window
        of a deal it still has to settle.
        """
        self.clock.chain_now()
        try:
            self.jobs.discover_deals()
        except (ChainError, ValueError) as exc:
            log.error("cannot scan the chain for our deals", extra={"error": str(exc)})
        needed = self.config.settlement.min_window_s()
        try:
            allowed = self.escrow.min_challenge_window()
        except (ChainError, ContractRevert):
            allowed = needed
        if allowed < needed:
            log.warning(
                "the escrow admits shorter challenge windows than this daemon serves: quotes "
                "and tasks of such deals are refused",
                extra={"escrow_min_window_s": allowed, "daemon_min_window_s": needed},
            )
        problems = self.jobs.window_problems()
        if self.config.ask is not None:
            problem = self.config.settlement.window_problem(self.config.ask.challenge_window)
            if problem is not None:
                problems.append(f"the [ask] in the config: {problem}")
            if self.market is None:
                log.warning("the config has an [ask] but no market_url: no ask is posted")
        if problems:
            raise ConfigError(
                "the settlement config cannot settle every deal in time: " + "; ".join(problems)
            )
        self.service.recover(self.plan_for_deal)
        self.jobs.reconcile_claims()  # claims mined but not journaled before a crash
        extra: list[tuple[Callable[[], object], float]] = []
        if self.market is not None and self.quotes is not None:
            for phase in MARKET_PHASES[: 3 if self.config.ask else 2]:
                self.warmup.begin(phase)
            extra.append((self._beat, self.config.heartbeat_interval_s))
            extra.append((self._quote_fills, self.config.quote_poll_s))
            if self.config.ask is not None:
                extra.append((self._post_asks, max(5.0, self.config.ask.expiry_s / 10)))
        extra.append((self._journal_upkeep, JOURNAL_UPKEEP_S))
        if self.config.settlement.arbiter_url:
            self.disputes = DisputeEvidence(
                escrow=self.escrow,
                private_key=self.config.private_key,
                arbiter_url=self.config.settlement.arbiter_url,
                outputs=self._delivered_bytes,
                start_block=self.config.settlement.start_block,
            )
            extra.append((self._hand_over_evidence, self.config.settlement.interval_s))
        else:
            log.warning(
                "no settlement.arbiter_url: the outputs of a disputed claim are not handed to "
                "the arbiter, and a dispute without them is lost"
            )
        if schedule:
            self.jobs.start(extra)
        if background:
            threading.Thread(target=self._warm_up, name="market-warm-up", daemon=True).start()
        else:
            self._register()
        log.info(
            "provider daemon started",
            extra={
                "provider": self.address,
                "chain_id": self.domain.chain_id,
                "escrow": self.domain.verifying_contract,
                "protocol": self.domain.version,
                "receipts_verified": sum(len(b.receipts) for _, b in self.journal.iter_books()),
                "min_challenge_window_s": self.config.settlement.min_window_s(),
            },
        )

    def _register(self) -> None:
        """Measure the host, send the first heartbeat and post the ask (each a start phase)."""
        if self.market is None:
            return
        with self.warmup.phase("capacity"):
            self.capacity = self.sandbox.capacity(benchmark=self.config.benchmark_on_start)
        endpoint = daemon_url(self.config.host, self.config.port, self.config.public_url)
        self.heartbeat = Heartbeat(
            self.market,
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
        with self.warmup.phase("heartbeat"):
            self.heartbeat.beat()
        if self.config.ask is not None:
            self.asks = AskJob(
                market=self.market,
                private_key=self.config.private_key,
                terms=self.config.ask,
                device_classes=self._ask_classes(self.config.ask, self.capacity),
                plan=self.config.plan,
                slo_ms=self.config.slo_ms,
                domain=self.domain,
                clock=self.clock,
                metrics=self.metrics,
            )
            with self.warmup.phase("ask"):
                self.asks.run()

    def _warm_up(self) -> None:
        """:meth:`_register` on its thread: a failure is logged, and listed by the health."""
        try:
            self._register()
        except Exception as exc:  # the daemon serves its deals without a market presence
            log.error("registering on the market failed", extra={"error": str(exc)})
            self.warmup.abandon(MARKET_PHASES, f"not reached: {exc}")

    def _beat(self) -> None:
        """Send a heartbeat (once the first one was sent at start)."""
        if self.heartbeat is not None:
            self.heartbeat.beat()

    def _post_asks(self) -> None:
        """Keep the ask live (once the first one was posted at start)."""
        if self.asks is not None:
            self.asks.run()

    def _quote_fills(self) -> None:
        """Quote the market's new fills; a fill may have taken the ask off the book, so post
        a fresh one at once rather than at the ask job's next turn."""
        if self.quotes is not None and self.quotes.run():
            self._post_asks()

    def _delivered_bytes(self, key: tuple[int, int]) -> bytes | None:
        """Return the bytes a receipt's outputHash commits to (outputs, report or diagnosis)."""
        record = self.journal.receipt(key)
        if record is None:
            return None
        outputs = self.journal.outputs(key)
        if outputs:
            return outputs
        detail = record.detail
        body = detail.get("report") if "report" in detail else detail.get("diagnosis")
        return canonical_json(body) if body is not None else b""

    def _hand_over_evidence(self) -> None:
        """Hand the outputs of this provider's disputed claims to the arbiter (errors logged)."""
        try:
            if self.disputes is not None:
                self.disputes.run()
        except Exception:  # a job must never kill the scheduler thread
            log.exception("handing evidence to the arbiter failed")

    def _journal_upkeep(self) -> None:
        """Seal what closed, check the next batch of sealed deals (an error is logged)."""
        try:
            self.journal.seal_ready()
            self.journal.verify_sealed_batch(JOURNAL_VERIFY_BATCH)
        except Exception:  # a job must never kill the scheduler thread
            log.exception("journal upkeep failed")

    def close(self) -> None:
        """Stop jobs and tasks, close the sandbox (if ours) and the journal."""
        self.jobs.stop()
        self.service.close()
        if self._owns_sandbox:
            self.sandbox.close()
        if self.market is not None:
            self.market.close()
        self.journal.close()
        self.lock.release()
