"""A task's upload admitted before its body is read: the cap its price allows, room held in
the deal's and the provider's storage bounds (:mod:`provider.storage_bounds`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from provider.errors import RejectedError
from provider.journal import Journal
from provider.receipts import ack_price
from provider.storage_bounds import StorageBounds
from provider.task_checks import CheckedRequest

if TYPE_CHECKING:
    from provider.daemon import Daemon

_BOUNDS: WeakKeyDictionary[Journal, StorageBounds] = WeakKeyDictionary()


def bounds_of(daemon: Daemon) -> StorageBounds:
    """Return the storage bounds of a daemon's journal (made at first use)."""
    bounds = _BOUNDS.get(daemon.journal)
    if bounds is None:
        bounds = _BOUNDS.setdefault(
            daemon.journal,
            StorageBounds(daemon.journal, daemon.config.storage, daemon.config.max_envelope_bytes),
        )
    return bounds


def admit_upload(
    daemon: Daemon, checked: CheckedRequest, headers: Mapping[str, str]
) -> contextlib.AbstractContextManager[int]:
    """Admit a task's upload (raise ``RejectedError`` when it may not be read): a context
    that holds its room until the task is acked, and gives the most bytes it may send.

    Its price is the ack's by the deal's plan (none known: only ``upload_base_bytes``; the
    submission refuses the plan then). ``Content-Length`` was checked to be a number.
    """
    plan = daemon.deals.plan_of(checked.deal)
    price = 0 if plan is None else ack_price(plan, checked.request)
    length = headers.get("content-length")
    declared = int(length) if length is not None and length.strip().isdigit() else None
    request = checked.request
    return bounds_of(daemon).admit((request.deal_id, request.task_index), price, declared)


async def read_request_body(chunks: AsyncIterator[bytes], cap: int) -> bytes:
    """Read a body as it streams in, refused (``envelope_too_large``) once past ``cap``."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > cap:
            raise RejectedError("envelope_too_large", f"more than {cap} bytes, cap {cap}")
        parts.append(chunk)
    return b"".join(parts)
