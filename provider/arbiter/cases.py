"""What the chain says of a dispute: the disputed batches that name this arbiter, and their tasks.

A dispute is found by its ``ClaimDisputed`` event; its tasks come from the calldata of the
``claimReceipts`` transaction that created the batch (found by the batch's ``ReceiptsClaimed``
event): each claim carries the provider's receipt and the client's request signature, and the
escrow accepted both, so the receipt's program and input hashes are the ones the client signed.
Nothing a party says decides which tasks a dispute covers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from contracts.binding import Escrow, indexed_topic
from contracts.messages import Receipt

LOG_CHUNK_BLOCKS = 10_000
"""Blocks per ``eth_getLogs`` query: bounded ranges, as public endpoints require."""


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """One task of a disputed batch: the receipt the escrow accepted and the request's cap."""

    receipt: Receipt
    max_price: int


@dataclass(frozen=True, slots=True)
class Dispute:
    """A disputed batch that names this arbiter, as the chain shows it."""

    deal_id: int
    batch_id: int
    client: str
    provider: str
    disputed_at: int
    """The block timestamp of the ``ClaimDisputed`` event."""
    arbitration_deadline: int
    """The arbiter must rule before this instant (chain time) or the dispute lapses."""
    tasks: tuple[ClaimedTask, ...]


def disputed_events(
    escrow: Escrow, from_block: int, to_block: int, *, chunk: int = LOG_CHUNK_BLOCKS
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(block, args)`` of every ``ClaimDisputed`` event in the range, oldest first."""
    yield from _logs(
        escrow, "ClaimDisputed", [escrow.event_topic("ClaimDisputed")], from_block, to_block, chunk
    )


def load_dispute(escrow: Escrow, deal_id: int, batch_id: int, block: int) -> Dispute:
    """Read a disputed batch's parties, deadline and claimed tasks from the chain."""
    deal = escrow.get_deal(deal_id)
    batch = escrow.get_batch(deal_id, batch_id)
    w3 = escrow.tx.w3
    disputed_at = int(w3.eth.get_block(block)["timestamp"])
    return Dispute(
        deal_id=deal_id,
        batch_id=batch_id,
        client=deal.client,
        provider=deal.provider,
        disputed_at=disputed_at,
        arbitration_deadline=int(batch.deadline),
        tasks=claimed_tasks(escrow, deal_id, batch_id, block),
    )


def claimed_tasks(
    escrow: Escrow, deal_id: int, batch_id: int, until_block: int
) -> tuple[ClaimedTask, ...]:
    """Return the tasks of a batch, decoded from its ``claimReceipts`` calldata."""
    topics = [
        escrow.event_topic("ReceiptsClaimed"),
        indexed_topic(deal_id),
        indexed_topic(batch_id),
    ]
    found = None
    end = until_block
    while end >= 0 and found is None:
        start = max(0, end - LOG_CHUNK_BLOCKS + 1)
        logs = escrow.tx.w3.eth.get_logs(
            {"address": escrow.address, "fromBlock": start, "toBlock": end, "topics": topics}  # type: ignore[typeddict-item]
        )
        if logs:
            found = logs[-1]
        end = start - 1
    if found is None:
        raise LookupError(f"no ReceiptsClaimed event for deal {deal_id} batch {batch_id}")
    tx = escrow.tx.w3.eth.get_transaction(found["transactionHash"])
    function, args = escrow.contract.decode_function_input(tx["input"])
    if function.fn_name != "claimReceipts" or int(args["dealId"]) != deal_id:
        raise LookupError(f"batch {batch_id} of deal {deal_id} was not made by claimReceipts")
    names = [f.name for f in dataclasses.fields(Receipt)]
    tasks = []
    for claim in args["claims"]:
        receipt_args = claim["receipt"] if isinstance(claim, dict) else claim[0]
        values = (
            [receipt_args[_camel(n)] for n in names]
            if isinstance(receipt_args, dict)
            else list(receipt_args)
        )
        receipt = Receipt(**{n: _plain(v) for n, v in zip(names, values, strict=True)})
        max_price = claim["maxPrice"] if isinstance(claim, dict) else claim[1]
        tasks.append(ClaimedTask(receipt=receipt, max_price=int(max_price)))
    return tuple(tasks)


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, (bytes, bytearray)) else value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _logs(
    escrow: Escrow, name: str, topics: list[Any], from_block: int, to_block: int, chunk: int
) -> Iterator[tuple[int, dict[str, Any]]]:
    start = from_block
    while start <= to_block:
        end = min(to_block, start + chunk - 1)
        logs = escrow.tx.w3.eth.get_logs(
            {"address": escrow.address, "fromBlock": start, "toBlock": end, "topics": topics}  # type: ignore[typeddict-item]
        )
        for log, event in zip(logs, escrow.decode_events(logs), strict=True):
            if event.name == name:
                yield int(log["blockNumber"]), event.args
        start = end + 1
