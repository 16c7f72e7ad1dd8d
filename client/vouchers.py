"""Cumulative vouchers for one deal, kept within the deal's spending cap."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from client.amounts import tokens
from client.errors import ClientError, SpendingCapExceeded
from contracts.messages import Domain, Receipt, Voucher, task_bitmap

Warn = Callable[[str], None]


@dataclass
class VoucherBook:
    """Verified deliveries of one deal and the cumulative voucher that pays them.

    The book never signs past `cap` (the deal's locked funds net of what the chain already
    spent), warns once the projected bill passes `warn_at` of the cap, and leaves out tasks
    settled on chain without a voucher (claimed or refunded), so a voucher can never pay a task
    twice. A task the provider claims after the client vouched it (a voucher it never redeemed)
    leaves the book: the chain is the truth, and the next voucher neither covers nor counts it.
    """

    deal_id: int
    cap: int
    warn_at: float = 0.8
    on_warning: Warn | None = None
    _paid: dict[int, int] = field(default_factory=dict)
    _claimed: set[int] = field(default_factory=set)
    _last_signed: int = 0
    _last_tasks: frozenset[int] = frozenset()
    _warned: bool = False

    @property
    def last_signed(self) -> int:
        """Return the amount of the last voucher signed."""
        return self._last_signed

    @property
    def total(self) -> int:
        """Return what the next voucher owes in all."""
        return sum(self._paid.values())

    @property
    def paid(self) -> dict[int, int]:
        """Return the amount of every task the next voucher pays, by task index."""
        return dict(self._paid)

    @property
    def claimed(self) -> frozenset[int]:
        """Return the tasks settled on chain without a voucher (claimed or refunded)."""
        return frozenset(self._claimed)

    @property
    def last_tasks(self) -> frozenset[int]:
        """Return the tasks the last voucher signed covers."""
        return self._last_tasks

    def restore(
        self,
        paid: dict[int, int],
        claimed: set[int],
        last_signed: int,
        last_tasks: frozenset[int] | None = None,
    ) -> None:
        """Load what an earlier run of this deal recorded, so vouchers stay cumulative."""
        if self._paid or self._claimed or self._last_signed:
            raise ClientError(f"voucher book of deal {self.deal_id} is not empty")
        if set(paid) & claimed:
            raise ClientError("a task cannot be both paid and claimed")
        if sum(paid.values()) > self.cap:
            raise ClientError(f"recorded payments of deal {self.deal_id} exceed its cap")
        self._paid = dict(paid)
        self._claimed = set(claimed)
        self._last_signed = last_signed
        self._last_tasks = frozenset(paid) if last_tasks is None else frozenset(last_tasks)

    def projected(self, extra: int = 0) -> int:
        """Return the bill if `extra` more were vouched."""
        return self.total + extra

    def add(self, receipt: Receipt) -> None:
        """Record a verified receipt to be paid; raise SpendingCapExceeded past the cap."""
        if receipt.deal_id != self.deal_id:
            raise ClientError(f"receipt of deal {receipt.deal_id} added to deal {self.deal_id}")
        index = receipt.task_index
        if index in self._paid or index in self._claimed:
            raise ClientError(f"task {index} is already paid or claimed")
        if self.projected(receipt.amount) > self.cap:
            raise SpendingCapExceeded(
                f"paying task {index} ({tokens(receipt.amount)} tokens) would bring deal "
                f"{self.deal_id} to {tokens(self.projected(receipt.amount))}, past its cap "
                f"{tokens(self.cap)}"
            )
        self._paid[index] = receipt.amount
        if not self._warned and self.total >= self.warn_at * self.cap:
            self._warned = True
            if self.on_warning:
                self.on_warning(
                    f"deal {self.deal_id} has spent {tokens(self.total)} of its cap "
                    f"{tokens(self.cap)} tokens "
                    f"({self.total / self.cap:.0%})"
                )

    def mark_claimed(self, task_index: int) -> None:
        """Record that a task was claimed or refunded on chain: no voucher covers it again.

        If an earlier voucher covered it (the provider claimed instead of redeeming), it leaves
        the book: its amount is paid by the claim, so the next voucher neither covers nor
        counts it, and the older voucher can no longer be redeemed (the chain refuses a voucher
        that newly covers a claimed task).
        """
        self._paid.pop(task_index, None)
        self._claimed.add(task_index)

    def has_news(self, floor: int = 0) -> bool:
        """Return whether a new voucher would pay something: tasks or an amount not yet signed.

        `floor` is what the chain already redeemed for the deal: a voucher at or below it is
        stale and pays nothing.
        """
        if self.total <= floor:
            return False
        return frozenset(self._paid) != self._last_tasks or self.total != self._last_signed

    def next_voucher(self, floor: int = 0) -> Voucher:
        """Return the cumulative voucher for everything verified so far."""
        if not self.has_news(floor):
            raise ClientError("nothing new to pay since the last voucher")
        return Voucher(self.deal_id, self.total, task_bitmap(self._paid))

    def sign_next(self, domain: Domain, private_key: str, floor: int = 0) -> tuple[Voucher, bytes]:
        """Sign the next cumulative voucher and remember it as the latest."""
        voucher = self.next_voucher(floor)
        signature = voucher.sign(domain, private_key)
        self._last_signed = voucher.cumulative_amount
        self._last_tasks = frozenset(self._paid)
        return voucher, signature
