"""Paying one deal from the client's side: the voucher book, reconciled with the chain.

Only verified deliveries enter the book (`client.session` verifies them); the book is paid by
one cumulative voucher handed to the provider. Before a voucher is signed, the book is
reconciled with the chain's per-task state, so a voucher never covers a task the provider
claimed or the client had refunded.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field

from client.accounts import ClientAccount
from client.errors import ProviderRejected
from client.ledger_records import ChainState
from client.provider_http import ProviderHttp
from client.tasks import chain_states
from client.vouchers import VoucherBook
from contracts.messages import Domain, Receipt, Voucher, task_bitmap


@dataclass
class DealPayments:
    """The voucher book of one deal, the tasks known vouched on chain, and the vouchers.

    One lock guards the book and ``confirmed_vouched``; a session passes its own ``lock``,
    so the same lock guards its tasks' outcomes.
    """

    account: ClientAccount
    domain: Domain
    deal_id: int
    provider: ProviderHttp
    book: VoucherBook
    confirmed_vouched: set[int] = field(default_factory=set)
    lock: InitVar[threading.Lock | None] = None
    _lock: threading.Lock = field(init=False, repr=False)

    def __post_init__(self, lock: threading.Lock | None) -> None:
        self._lock = threading.Lock() if lock is None else lock

    def restore(
        self,
        paid: dict[int, int],
        claimed: set[int],
        last_signed: int,
        last_tasks: frozenset[int] | None,
        *,
        vouched: set[int],
    ) -> None:
        """Load what an earlier run of this deal recorded, and the tasks vouched on chain."""
        with self._lock:
            self.book.restore(paid, claimed, last_signed, last_tasks)
            self.confirmed_vouched = set(vouched)

    def add(self, receipt: Receipt) -> None:
        """Add a verified receipt to the voucher book; raise SpendingCapExceeded past the cap."""
        with self._lock:
            self.book.add(receipt)

    def add_payable(self, receipt: Receipt) -> None:
        """Add a verified receipt to the voucher book, unless its task was claimed or
        refunded on chain."""
        with self._lock:
            if receipt.task_index not in self.book.claimed:
                self.book.add(receipt)

    def mark_claimed(self, index: int) -> None:
        """Take a task settled on chain without a voucher (claimed or refunded) out of the
        voucher book: no voucher covers it again."""
        with self._lock:
            self.book.mark_claimed(index)

    def chain_states(self, indices: Sequence[int]) -> dict[int, ChainState | None]:
        """Return the escrow's settlement state of each task of the deal."""
        return chain_states(self.account.escrow, self.deal_id, indices)

    def reconcile(self) -> dict[int, ChainState]:
        """Align the voucher book with the chain: tasks claimed or refunded leave it.

        Reads the state of every task the book pays that is not yet known to be vouched on
        chain; return the states found (vouched ones are remembered and not read again).
        """
        with self._lock:
            unknown = sorted(set(self.book.paid) - self.confirmed_vouched)
        if not unknown:
            return {}
        found: dict[int, ChainState] = {}
        for index, state in self.chain_states(unknown).items():
            if state is None:
                continue
            found[index] = state
            if state == ChainState.VOUCHED:
                with self._lock:
                    self.confirmed_vouched.add(index)
            else:
                self.mark_claimed(index)
        return found

    def sign_voucher(self, floor: int, *, resend: bool = False) -> tuple[Voucher, bytes] | None:
        """Sign the next voucher above ``floor`` (what the chain counts as vouched); None if
        nothing new is owed.

        With ``resend``, when nothing new is owed, sign the last voucher again if it is above
        ``floor`` (it was signed, but may not have reached the provider).
        """
        with self._lock:
            if self.book.has_news(floor):
                return self.book.sign_next(self.domain, self.account.key, floor)
            if not resend or self.book.last_signed <= floor:
                return None
            voucher = Voucher(
                self.deal_id, self.book.last_signed, task_bitmap(self.book.last_tasks)
            )
            return voucher, voucher.sign(self.domain, self.account.key)

    def prepare_voucher(self) -> tuple[Voucher, bytes] | None:
        """Reconcile with the chain and sign the next voucher; None if nothing new is owed."""
        self.reconcile()
        floor = self.account.escrow.get_deal(self.deal_id).vouched
        return self.sign_voucher(floor)

    def pay(self) -> Voucher | None:
        """Sign the cumulative voucher for every verified delivery and hand it over.

        A provider that refuses the voucher (say it covers a task the provider claimed in the
        meantime) gets one more, signed after reconciling with the chain again.
        """
        signed = self.prepare_voucher()
        if signed is None:
            return None
        try:
            self.provider.send_voucher(*signed)
        except ProviderRejected as exc:
            if exc.status >= 500:
                raise
            signed = self.prepare_voucher()
            if signed is None:
                return None
            self.provider.send_voucher(*signed)
        return signed[0]
