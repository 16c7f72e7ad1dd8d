"""Storage bounds: what a task may upload and what a deal may keep, checked before the ack.

A task's upload is bounded by what it pays: at most ``upload_base_bytes + price *
upload_bytes_per_unit`` bytes (and never more than ``max_envelope_bytes``), ``price`` being
the ack's price by the deal's plan (a metered plan: the client's ``maxPrice``). The journal
keeps each task's envelope and outputs until the task is settled on chain
(:mod:`provider.journal.retention`); a deal may hold at most ``deal_max_bytes`` of them, the
provider ``total_max_bytes`` over all deals. Each bound is checked before the task's body is
read, counting the uploads in flight, so a refusal reads nothing, acks nothing and bills
nothing:

- ``envelope_too_large`` (413): the declared length is above what the price allows (or the
  body passes that cap while it is read);
- ``deal_storage_full`` (409): the deal holds its bound of unsettled data; it takes new tasks
  once its client vouches (or the chain settles) what it has;
- ``storage_full`` (503, ``Retry-After``): the provider's total is reached.

The settings are ``[storage]`` in the config (:class:`StorageConfig`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator

from provider.config_storage import StorageConfig
from provider.errors import RejectedError
from provider.journal import Journal, Key


class StorageBounds:
    """Admit task uploads within the price's cap and the deal's and provider's bounds."""

    def __init__(self, journal: Journal, config: StorageConfig, max_envelope_bytes: int) -> None:
        """Count what ``journal`` holds, under ``config``; never above ``max_envelope_bytes``."""
        self.journal = journal
        self.config = config
        self.max_envelope_bytes = max_envelope_bytes
        self._lock = threading.Lock()
        self._held: dict[int, tuple[Key, int]] = {}  # uploads in flight, by ticket
        self._tickets = itertools.count()

    def upload_cap(self, price: int) -> int:
        """Return the most bytes a task of ``price`` may upload."""
        allowed = self.config.upload_base_bytes + max(price, 0) * self.config.upload_bytes_per_unit
        return min(self.max_envelope_bytes, allowed)

    def _in_flight(self, deal_id: int | None) -> int:
        """Bytes of uploads in flight not yet journaled (hold the lock)."""
        return sum(
            size
            for key, size in self._held.values()
            if (deal_id is None or key[0] == deal_id) and self.journal.ack(key) is None
        )

    @contextlib.contextmanager
    def admit(self, key: Key, price: int, declared: int | None) -> Iterator[int]:
        """Hold room for the upload of task ``key`` while it is read and acked; yield the
        most bytes it may send. Raise :class:`RejectedError` when it may not be read.

        A task already acked (its client's retry) stores nothing more: only its cap holds.
        Without a declared length the body may stream in up to the least of the price's cap
        and the room the deal's and the provider's bounds leave.
        """
        cap = self.upload_cap(price)
        if declared is not None and declared > cap:
            raise RejectedError(
                "envelope_too_large",
                f"{declared} bytes; a task priced {price} may upload at most {cap} bytes "
                f"(storage.upload_base_bytes + price x storage.upload_bytes_per_unit)",
            )
        if self.journal.ack(key) is not None:
            yield cap if declared is None else declared
            return
        deal_id = key[0]
        with self._lock:
            deal_used = self.journal.stored_bytes(deal_id) + self._in_flight(deal_id)
            used = self.journal.stored_bytes() + self._in_flight(None)
            deal_room = self.config.deal_max_bytes - deal_used
            room = self.config.total_max_bytes - used
            # no declared length: the body may stream in up to what every bound leaves
            need = min(cap, deal_room, room) if declared is None else declared
            if need > deal_room or deal_room <= 0:
                raise RejectedError(
                    "deal_storage_full",
                    f"deal {deal_id} holds {deal_used} bytes of unsettled task data; "
                    f"{need} more would pass its bound of {self.config.deal_max_bytes} "
                    "(storage.deal_max_bytes): it takes new tasks once what it has is settled",
                )
            if need > room or room <= 0:
                raise RejectedError(
                    "storage_full",
                    f"the provider holds {used} bytes of unsettled task data, its bound is "
                    f"{self.config.total_max_bytes} (storage.total_max_bytes): retry later",
                )
            ticket = next(self._tickets)
            self._held[ticket] = (key, need)
        try:
            yield need
        finally:
            with self._lock:
                del self._held[ticket]
