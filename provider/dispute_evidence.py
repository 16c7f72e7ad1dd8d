"""The provider's side of a dispute: hand the outputs of each disputed task to the deal's arbiter.

When a client disputes one of this provider's claims, the arbiter rules for the provider only
if it receives the outputs the receipts commit to before its evidence period ends. This job
reads the escrow's ``ClaimDisputed`` events, keeps those of this provider's deals, reads the
batch's tasks from the claim's calldata (as the arbiter does) and uploads each task's journaled
outputs, signed, to the arbiter at ``settlement.arbiter_url`` after checking that the service
there is the deal's arbiter (``GET /v1/info``). An upload the arbiter already holds is harmless
(the last one wins), so a restart may send again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx

from contracts.binding import BATCH_DISPUTED, Escrow
from contracts.errors import EscrowError
from contracts.evidence import EvidenceUploadError, Role, upload_evidence
from provider.arbiter.cases import claimed_tasks, disputed_events

log = logging.getLogger("provider.disputes")
Outputs = Callable[[tuple[int, int]], bytes | None]
"""The journaled outputs of a task (deal, index), or None when the journal has none."""


class DisputeEvidence:
    """Upload this provider's outputs for its disputed claims to the deal's arbiter."""

    def __init__(
        self,
        *,
        escrow: Escrow,
        private_key: str,
        arbiter_url: str,
        outputs: Outputs,
        start_block: int = 0,
    ) -> None:
        """Watch ``escrow`` from ``start_block``; upload to the arbiter at ``arbiter_url``."""
        self.escrow = escrow
        self._key = private_key
        self.address = escrow.tx.address_of(private_key)
        self.arbiter_url = arbiter_url.rstrip("/")
        self._outputs = outputs
        self._next_block = start_block
        self._sent: set[tuple[int, int]] = set()
        self._arbiter: str | None = None

    def _arbiter_address(self) -> str | None:
        if self._arbiter is None:
            try:
                info = httpx.get(f"{self.arbiter_url}/v1/info", timeout=10).json()
                self._arbiter = str(info["arbiter"]).lower()
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                log.warning(
                    "arbiter not reachable", extra={"url": self.arbiter_url, "error": str(exc)}
                )
                return None
        return self._arbiter

    def run(self) -> list[tuple[int, int]]:
        """Upload the outputs of every newly disputed batch of this provider; return them."""
        latest = int(self.escrow.tx.w3.eth.block_number)
        done: list[tuple[int, int]] = []
        retry_from: int | None = None
        for block, args in disputed_events(self.escrow, self._next_block, latest):
            key = (int(args["dealId"]), int(args["batchId"]))
            if key in self._sent:
                continue
            deal = self.escrow.get_deal(key[0])
            if deal.provider.lower() != self.address.lower():
                continue
            if self.escrow.get_batch(*key).status != BATCH_DISPUTED:
                self._sent.add(key)  # ruled or lapsed already
                continue
            if self._arbiter_address() != deal.arbiter.lower():
                log.warning(
                    "disputed claim of a deal whose arbiter is not the configured one",
                    extra={"deal": key[0], "batch": key[1], "arbiter": deal.arbiter},
                )
                self._sent.add(key)
                continue
            try:
                self._upload(key, block)
            except (EvidenceUploadError, EscrowError, LookupError) as exc:
                log.warning(
                    "outputs not handed to the arbiter",
                    extra={"deal": key[0], "batch": key[1], "error": str(exc)},
                )
                retry_from = block if retry_from is None else min(retry_from, block)
                continue
            self._sent.add(key)
            done.append(key)
        self._next_block = latest + 1 if retry_from is None else retry_from
        return done

    def _upload(self, key: tuple[int, int], block: int) -> None:
        for task in claimed_tasks(self.escrow, key[0], key[1], block):
            index = task.receipt.task_index
            outputs = self._outputs((key[0], index))
            if outputs is None:
                raise LookupError(f"no journaled outputs for task {index} of deal {key[0]}")
            upload_evidence(
                self.arbiter_url,
                self.escrow.domain,
                self._key,
                deal_id=key[0],
                batch_id=key[1],
                task_index=index,
                role=Role.PROVIDER_OUTPUTS,
                body=outputs,
            )
        log.info("outputs handed to the arbiter", extra={"deal": key[0], "batch": key[1]})
