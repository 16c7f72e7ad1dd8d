"""What the parent keeps apart per client: compile caches, AOT reports, turns on the workers.

:class:`Tenancy` wraps each request to a worker with the requesting client's cache section
(its own entries for that program, nothing of anyone else's) and stores what the worker
compiled under that client only. AOT compile reports are kept here too: the daemon serves a
report as a cache hit only from what that client's own worker answered before.
"""

from __future__ import annotations

import hashlib
from importlib.metadata import version
from pathlib import Path

from programs.envelope import ProgramEnvelope
from provider.diagnosis import Diagnosis
from provider.sandbox.aot_reports import AotReport, report_digest
from provider.sandbox.cache_wire import CacheSection, pack_request, split_reply
from provider.sandbox.compile_store import MAX_ENTRY_BYTES, CompileStore, client_id
from provider.sandbox.results import CompileResult, CostFigures, MemoryFigures
from provider.sandbox.wire import Header

Reply = tuple[Header, bytes] | Diagnosis


class Tenancy:
    """Per-client compile caches (``store``; None: no persistent cache)."""

    def __init__(self, cache_dir: Path | None) -> None:
        """Keep each client's entries and reports under ``cache_dir`` (None: keep none)."""
        self.store = None if cache_dir is None else CompileStore(cache_dir)
        self._jax = version("jax")

    @property
    def cross_reads(self) -> int:
        """Entries found under a client that another client's worker wrote (never served)."""
        return 0 if self.store is None else self.store.cross_reads

    def request(
        self,
        client: str | None,
        program: bytes,
        payload: bytes,
        allowance: int | None = None,
    ) -> bytes:
        """``payload`` with ``client``'s cache section for ``program`` (and a memory share)."""
        entries = {} if self.store is None else self.store.entries(client, program)
        return pack_request(CacheSection(client_id(client), entries, allowance), payload)

    def absorb(self, client: str | None, program: bytes, reply: Reply) -> Reply:
        """Store the entries a worker listed under ``client``; return the reply without them."""
        if isinstance(reply, Diagnosis):
            return reply
        header, body = reply
        outputs, entries = split_reply(header, body, MAX_ENTRY_BYTES)
        if entries and self.store is not None:
            self.store.put_entries(client, program, entries)
        return header, outputs

    def report_key(self, envelope: ProgramEnvelope, target: str) -> str:
        """The digest naming an AOT compile: program, arguments, target, compiler version."""
        arguments = hashlib.sha256(
            (envelope.weights or b"") + b"\x00" + (envelope.inputs or b"")
        ).hexdigest()
        return report_digest((envelope.program_sha256.hex(), arguments, target, self._jax))

    def cached_report(
        self, client: str | None, envelope: ProgramEnvelope, target: str
    ) -> CompileResult | None:
        """A compile result from ``client``'s own stored report, or None."""
        if self.store is None:
            return None
        report = self.store.report(client, self.report_key(envelope, target))
        if report is None:
            return None
        memory, cost = report["memory"], report["cost"]
        try:
            return CompileResult(
                program_sha256=envelope.program_sha256,
                target=target,
                platform=report["platform"],
                device_kind=report["device_kind"],
                compile_time_s=0.0,
                cache_hit=True,
                memory=None if memory is None else MemoryFigures(**memory),
                cost=None if cost is None else CostFigures(**cost),
                available_bytes=report["available_bytes"],
            )
        except TypeError:
            return None

    def keep_report(
        self, client: str | None, envelope: ProgramEnvelope, result: CompileResult
    ) -> None:
        """Store the report ``client``'s worker answered for an AOT compile."""
        if self.store is None or result.program_sha256 != envelope.program_sha256:
            return
        report: AotReport = {
            "memory": None if result.memory is None else _fields(result.memory),
            "cost": None if result.cost is None else _fields(result.cost),  # type: ignore[typeddict-item]
            "available_bytes": result.available_bytes,
            "platform": result.platform,
            "device_kind": result.device_kind,
        }
        self.store.put_report(client, self.report_key(envelope, result.target), report)


def _fields(figures: MemoryFigures | CostFigures) -> dict[str, int]:
    import dataclasses

    return dict(dataclasses.asdict(figures))


__all__ = ["Reply", "Tenancy"]
