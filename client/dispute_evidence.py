"""The client's side of a dispute: keep each task's program, hand it to the arbiter when asked.

The arbiter rules a disputed task for the client only if it can re-execute what the client
signed; a client that does not hand the program over in time loses the task. So the SDK keeps
every envelope it sends (:class:`EnvelopeStore`, content-addressed by the request's program and
input hashes, in the deal's state folder) until the task is settled, and the claim watcher,
after disputing a batch, uploads the envelope of each of its tasks (:class:`ProgramEvidence`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from contracts.evidence import EvidenceUploadError, Role, upload_evidence
from contracts.messages import Domain, TaskRequest

Say = Callable[[str], None]


class EnvelopeStore:
    """Program envelopes as sent, one file per (program hash, input hash), written atomically."""

    def __init__(self, folder: Path) -> None:
        """Keep the envelopes under ``folder`` (created private on first use)."""
        self.folder = folder

    def _path(self, request: TaskRequest) -> Path:
        return self.folder / f"{request.program_hash.hex()}-{request.input_hash.hex()}"

    def keep(self, request: TaskRequest, envelope: bytes, target: str | None) -> None:
        """Keep the envelope (and compile target) a request was sent with; once is enough."""
        path = self._path(request)
        if path.exists():
            return
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        temp = path.with_suffix(".part")
        with open(temp, "wb") as out:
            out.write(envelope)
            out.flush()
            os.fsync(out.fileno())
        if target is not None:
            path.with_suffix(".target").write_text(target)
        os.replace(temp, path)

    def find(self, request: TaskRequest) -> tuple[bytes, str | None] | None:
        """Return the envelope and target a request was sent with, or None if not kept."""
        path = self._path(request)
        if not path.is_file():
            return None
        target_path = path.with_suffix(".target")
        target = target_path.read_text() if target_path.is_file() else None
        return path.read_bytes(), target


class ProgramEvidence:
    """Upload the programs of a disputed batch's tasks to the deal's arbiter (once each)."""

    def __init__(
        self,
        *,
        arbiter_url: str,
        domain: Domain,
        key: str,
        store: EnvelopeStore,
        say: Say | None = None,
    ) -> None:
        """Upload to ``arbiter_url`` with the client's ``key``, from ``store``."""
        self.arbiter_url = arbiter_url
        self.domain = domain
        self._key = key
        self.store = store
        self._say = say
        self._sent: set[tuple[int, int]] = set()

    def __call__(
        self, deal_id: int, batch_id: int, requests: Mapping[int, TaskRequest | None]
    ) -> bool:
        """Upload each task's program (``requests``: the batch's task index -> the request the
        client signed, None for a task it never requested); return whether all are with the
        arbiter. A failure (the arbiter has not seen the dispute yet, or is down) is said and
        retried at the next call."""
        done = True
        for index, request in sorted(requests.items()):
            if (batch_id, index) in self._sent or request is None:
                continue  # a task the client never requested needs no program: it wins it
            kept = self.store.find(request)
            if kept is None:
                self._report(f"batch {batch_id}: no kept program for task {index}")
                continue
            envelope, target = kept
            try:
                upload_evidence(
                    self.arbiter_url,
                    self.domain,
                    self._key,
                    deal_id=deal_id,
                    batch_id=batch_id,
                    task_index=index,
                    role=Role.CLIENT_PROGRAM,
                    body=envelope,
                    target=target,
                )
            except EvidenceUploadError as exc:
                self._report(f"batch {batch_id}: program of task {index} not handed over ({exc})")
                done = False
                continue
            self._sent.add((batch_id, index))
        return done

    def _report(self, text: str) -> None:
        if self._say is not None:
            self._say(text)
