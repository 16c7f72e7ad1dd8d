"""What the journal holds, as frozen records, and the per-deal book the hot path reads.

Pure: no database. :mod:`provider.journal.store` turns rows into these records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from contracts.messages import ZERO_HASH, Ack, Quote, Receipt, TaskRequest, Voucher
from provider.lifecycle import SettlementAction

Key = tuple[int, int]

PROTOCOL = 2
"""The settlement protocol of the acks this daemon writes (the escrow's domain version)."""


@dataclass(frozen=True, slots=True)
class AckRecord:
    """A task the daemon accepted: the client's signed request and our signed ack.

    ``protocol`` is the settlement protocol it was acked under. A protocol-1 ack (a journal
    written before v2) signed an ack with its own deadline, and its request signature has no
    deadline: ``request`` carries the ack's deadline so receipts check, ``legacy_ack`` the ack
    as signed, and the task cannot be claimed under v2 (:attr:`claimable`).
    """

    request: TaskRequest
    request_sig: bytes
    request_hash: bytes
    target: str | None
    ack: Ack
    ack_sig: bytes
    acked_at: float
    protocol: int = PROTOCOL
    legacy_ack: dict[str, Any] | None = None

    @property
    def key(self) -> Key:
        """Return (deal id, task index)."""
        return (self.ack.deal_id, self.ack.task_index)

    @property
    def claimable(self) -> bool:
        """Return whether the client's request signature can carry a claim on this escrow."""
        return self.protocol >= 2

    def ack_json(self) -> dict[str, Any]:
        """Return the ack as it was signed (its legacy form for a protocol-1 ack)."""
        return self.legacy_ack if self.legacy_ack is not None else self.ack.to_json()


@dataclass(frozen=True, slots=True)
class ReceiptRecord:
    """A delivered task: the signed receipt, its hash and what the client gets besides."""

    receipt: Receipt
    signature: bytes
    receipt_hash: bytes
    detail: dict[str, Any]
    seq: int

    @property
    def key(self) -> Key:
        """Return (deal id, task index)."""
        return (self.receipt.deal_id, self.receipt.task_index)

    @property
    def on_time(self) -> bool:
        """Return whether the task finished by its deadline (only then can it be claimed)."""
        return self.receipt.finished_at <= self.receipt.deadline


@dataclass(frozen=True, slots=True)
class VoucherRecord:
    """A client-signed cumulative voucher as received."""

    voucher: Voucher
    signature: bytes
    received_at: float
    seq: int


@dataclass(frozen=True, slots=True)
class SettlementRecord:
    """A settlement step of a deal.

    ``action`` is one of :class:`~provider.lifecycle.SettlementAction`.
    """

    deal_id: int
    action: SettlementAction
    data: dict[str, Any]
    tx_hash: str | None
    recorded_at: float
    seq: int


@dataclass(frozen=True, slots=True)
class QuoteRecord:
    """A per-fill quote this daemon signed for a market deal."""

    market_deal_id: str
    quote: Quote
    signature: bytes
    signed_at: float
    seq: int


@dataclass
class DealBook:
    """What the journal knows of one deal, kept in memory for the hot path.

    ``claiming`` holds the tasks of a claim transaction in flight (not journaled yet): a
    voucher covering one of them is refused like one covering a claimed task. ``pruned``
    holds the tasks whose envelope and outputs were dropped once settled
    (:mod:`provider.journal.retention`). ``sealed``
    marks a book read back from a sealed deal (closed and settled): a copy nothing more can
    be recorded in.
    """

    acks: dict[int, AckRecord]
    receipts: dict[int, ReceiptRecord]
    vouchers: list[VoucherRecord]
    settlements: list[SettlementRecord]
    last_receipt_hash: bytes = ZERO_HASH
    ack_total: int = 0
    settled_ack_total: int | None = None
    claiming: set[int] = field(default_factory=set)
    pruned: set[int] = field(default_factory=set)
    sealed: bool = False
    _derived: dict[str, Any] = field(default_factory=dict)

    def _tasks_of(self, action: SettlementAction) -> frozenset[int]:
        cached = self._derived.get(action)
        if cached is None:
            cached = self._derived[action] = frozenset(
                int(i) for s in self.settlements if s.action == action for i in s.data["tasks"]
            )
        return cast(frozenset[int], cached)

    def unusable_vouchers(self) -> frozenset[int]:
        """Return the seqs of vouchers the escrow refused to redeem."""
        cached = self._derived.get("unusable")
        if cached is None:
            cached = self._derived["unusable"] = frozenset(
                int(s.data["voucher_seq"])
                for s in self.settlements
                if s.action is SettlementAction.VOUCHER_UNUSABLE
            )
        return cast(frozenset[int], cached)

    @property
    def latest_voucher(self) -> VoucherRecord | None:
        """Return the latest acceptable voucher (the escrow did not refuse it), if any."""
        unusable = self.unusable_vouchers()
        for record in reversed(self.vouchers):
            if record.seq not in unusable:
                return record
        return None

    def redeemed(self) -> VoucherRecord | None:
        """Return the last voucher redeemed on chain, if any."""
        if "redeemed" not in self._derived:
            found = None
            for settlement in reversed(self.settlements):
                if settlement.action is SettlementAction.REDEEM:
                    seq = int(settlement.data["voucher_seq"])
                    found = next(v for v in self.vouchers if v.seq == seq)
                    break
            self._derived["redeemed"] = found
        return cast(VoucherRecord | None, self._derived["redeemed"])

    def claimed_tasks(self) -> frozenset[int]:
        """Return the task indices claimed on chain."""
        return self._tasks_of(SettlementAction.CLAIM)

    def refunded_tasks(self) -> frozenset[int]:
        """Return the task indices the client refunded on chain."""
        return self._tasks_of(SettlementAction.REFUNDED)

    def missed_tasks(self) -> frozenset[int]:
        """Return the task indices whose settlement instant passed while not on chain."""
        return self._tasks_of(SettlementAction.MISSED)

    def on_chain(self, index: int) -> bool:
        """Return whether a task is settled on chain: vouched (redeemed), claimed or refunded."""
        if index in self.claimed_tasks() or index in self.refunded_tasks():
            return True
        redeemed = self.redeemed()
        return redeemed is not None and redeemed.voucher.covers(index)

    def opened(self) -> dict[str, Any] | None:
        """Return the deal's terms as seen on chain (``opened`` row), if journaled."""
        for settlement in self.settlements:
            if settlement.action is SettlementAction.OPENED:
                return settlement.data
        return None

    def closed(self) -> bool:
        """Return whether a settlement job saw the deal closed on chain."""
        return any(s.action is SettlementAction.CLOSED for s in self.settlements)

    def sealable(self) -> bool:
        """Return whether the deal is closed and settled: closed on chain (the escrow closes
        a deal only once no claim is pending), every acked task delivered, no claim in flight.
        Nothing more can then be journaled for it."""
        return (
            self.closed()
            and not self.claiming
            and all(index in self.receipts for index in self.acks)
        )

    def unpaid_ack_total(self) -> int:
        """Return the ack prices of accepted tasks the chain has not settled yet.

        A task paid by a redeemed voucher or a claim is in the deal's ``committed`` or
        ``pending``; a refunded one is in ``committed`` too: none of them counts here again.
        """
        if self.settled_ack_total is None:
            self.settled_ack_total = sum(
                record.ack.price for index, record in self.acks.items() if self.on_chain(index)
            )
        return self.ack_total - self.settled_ack_total

    def changed(self) -> None:
        """Forget what was derived from the settlements (a row was appended)."""
        self._derived.clear()
        self.settled_ack_total = None


def ack_record(
    request: dict[str, Any],
    request_sig: bytes,
    request_hash: bytes,
    target: str | None,
    ack: dict[str, Any],
    ack_sig: bytes,
    acked_at: float,
    protocol: int,
) -> AckRecord:
    """Return an ack row as a record; a protocol-1 row takes its deadline from its ack."""
    if protocol >= PROTOCOL:
        return AckRecord(
            request=TaskRequest.from_json(request),
            request_sig=request_sig,
            request_hash=request_hash,
            target=target,
            ack=Ack.from_json(ack),
            ack_sig=ack_sig,
            acked_at=acked_at,
        )
    return AckRecord(
        request=TaskRequest.from_json({**request, "deadline": ack["deadline"]}),
        request_sig=request_sig,
        request_hash=request_hash,
        target=target,
        ack=Ack(
            deal_id=int(ack["deal_id"]),
            task_index=int(ack["task_index"]),
            request_hash=request_hash,
            price=int(ack["price"]),
        ),
        ack_sig=ack_sig,
        acked_at=acked_at,
        protocol=protocol,
        legacy_ack=ack,
    )
