"""A provider's history in the escrow's logs: its deals, and what each paid, holds and cost."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.binding import Chain, Escrow

SCAN_CHUNK = 10_000
"""Blocks per ``eth_getLogs`` query."""


def escrow_logs(
    chain: Chain, escrow: Escrow, start_block: int, topics: list[Any] | None
) -> Iterator[Any]:
    """Yield the escrow's logs matching ``topics``, from ``start_block``, a chunk at a time."""
    w3 = chain.w3
    latest = int(w3.eth.block_number)
    start = start_block
    while start <= latest:
        end = min(latest, start + SCAN_CHUNK - 1)
        query: dict[str, Any] = {"address": escrow.address, "fromBlock": start, "toBlock": end}
        if topics is not None:
            query["topics"] = topics
        yield w3.eth.get_logs(query)  # type: ignore[arg-type]
        start = end + 1


def deals_of(chain: Chain, escrow: Escrow, provider: str, start_block: int) -> list[int]:
    """Return the ids of every deal opened with ``provider`` (``DealOpened`` logs)."""
    topic = escrow.contract.events.DealOpened.topic
    provider_topic = "0x" + bytes.fromhex(provider[2:]).rjust(32, b"\0").hex()
    ids = []
    for logs in escrow_logs(chain, escrow, start_block, [topic, None, None, provider_topic]):
        ids += [int(e.args["dealId"]) for e in escrow.decode_events(logs)]
    return ids


@dataclass
class DealMoney:
    """What one deal paid the provider, holds for it, and cost it (base units)."""

    deal_id: int
    paid: int = 0
    pending: int = 0
    penalties: int = 0
    refunded: int = 0
    tasks_refunded: int = 0

    def to_json(self) -> dict[str, Any]:
        """Encode with amounts as decimal strings."""
        return {
            "deal_id": self.deal_id,
            "paid": str(self.paid),
            "pending": str(self.pending),
            "penalties": str(self.penalties),
            "refunded": str(self.refunded),
            "tasks_refunded": self.tasks_refunded,
            "net": str(self.paid - self.penalties),
        }


def earnings(
    chain: Chain, escrow: Escrow, deals: Sequence[int], start_block: int
) -> dict[int, DealMoney]:
    """Sum the escrow's money events of ``deals``: paid, pending claims, penalties, refunds."""
    money = {d: DealMoney(d) for d in deals}
    for logs in escrow_logs(chain, escrow, start_block, None):
        for event in escrow.decode_events(logs):
            deal = money.get(int(event.args.get("dealId", -1)))
            if deal is None:
                continue
            args = event.args
            if event.name == "VoucherRedeemed":
                deal.paid += int(args["paid"])
            elif event.name == "ReservationFeePaid":
                deal.paid += int(args["fee"])
            elif event.name == "ReceiptsClaimed":
                deal.pending += int(args["amount"])
            elif event.name == "ClaimFinalized":
                deal.pending -= int(args["amount"])
                deal.paid += int(args["amount"])
            elif event.name == "DisputeResolved":
                deal.pending -= int(args["amount"])
                if args["providerWins"]:
                    deal.paid += int(args["amount"])
                else:
                    deal.penalties += int(args["penalty"])
                    deal.refunded += int(args["refund"])
            elif event.name == "BreachRefunded":
                deal.penalties += int(args["penalty"])
                deal.refunded += int(args["refund"])
                deal.tasks_refunded += 1
    return money
