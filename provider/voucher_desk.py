"""The voucher desk: accept a client's cumulative voucher only if redeeming it is safe.

A voucher is judged against the last accepted one and the deal's journal: it must keep every
task the previous one covered, pay the receipts of the tasks it newly covers, cover no task
undelivered or settled on chain otherwise, and leave the deal's cap enough for every other
acked task. A refusal changes nothing.
"""

from __future__ import annotations

import json
import threading

from contracts.binding import DealState
from contracts.errors import SignatureError
from contracts.messages import Domain, Voucher
from provider.deal_budget import DealBudget
from provider.deals import DealCache
from provider.errors import RejectedError
from provider.journal import DealBook, Journal, VoucherRecord
from provider.metrics import ProviderMetrics
from provider.receipts import voucher_tasks
from provider.wire import MAX_JSON_DEPTH, json_depth, parse_signature, shorten

MAX_VOUCHER_WORDS = 256
"""The most uint256 words of a voucher's task bitmap (65,536 task indexes)."""


class VoucherDesk:
    """Verify and journal the vouchers of this provider's deals."""

    def __init__(
        self,
        *,
        address: str,
        domain: Domain,
        journal: Journal,
        deals: DealCache,
        budget: DealBudget,
        task_lock: threading.Lock,
        metrics: ProviderMetrics,
    ) -> None:
        """Accept vouchers to ``address`` under ``domain``; ``task_lock`` is the task
        service's, held while a voucher is checked against the cap."""
        self.address = address
        self.domain = domain
        self.journal = journal
        self.deals = deals
        self.budget = budget
        self._task_lock = task_lock
        self.metrics = metrics

    def accept(self, voucher_json: str, signature: str) -> tuple[VoucherRecord, bool]:
        """Verify and store a client's cumulative voucher; return it and whether it is new.

        Accepted only if it is signed by the deal's client, covers every task the previously
        accepted voucher covered, newly covers only delivered tasks that are not claimed (or
        being claimed) or refunded on chain, and adds at least the receipt amounts of the tasks
        it newly covers over the previous voucher (so its task bits are paid for), and whose
        redemption leaves the deal's cap enough for every other acked task not settled yet (a
        surplus, or tip, must fit in what the cap keeps free: ``voucher_leaves_cap_short``). A
        refusal changes nothing: the next voucher is judged against the same accepted one.
        """
        try:
            if json_depth(voucher_json) > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH}")
            voucher = Voucher.from_json(json.loads(voucher_json))
            if not 0 <= voucher.deal_id < 2**256 or not 0 <= voucher.cumulative_amount < 2**256:
                raise ValueError("dealId or cumulativeAmount out of range")
            if len(voucher.tasks) > MAX_VOUCHER_WORDS or any(
                not 0 <= word < 2**256 for word in voucher.tasks
            ):
                raise ValueError(f"the task bitmap is above {MAX_VOUCHER_WORDS} uint256 words")
            voucher.struct_hash()
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise self.reject("bad_request", f"malformed Voucher: {shorten(exc)}") from exc
        sig = parse_signature(signature)
        deal = self.deals.get(voucher.deal_id)
        if deal.provider.lower() != self.address.lower():
            raise self.reject("deal_not_ours", f"deal {voucher.deal_id} is not ours")
        try:
            signer = voucher.recover(self.domain, sig)
        except SignatureError as exc:
            raise self.reject("signature_invalid", str(exc)) from exc
        if signer.lower() != deal.client.lower():
            raise self.reject(
                "signature_invalid",
                f"Voucher signed by {signer}, but deal {voucher.deal_id}'s client is {deal.client}",
            )
        if voucher.cumulative_amount > deal.max_spend:
            raise self.reject(
                "voucher_over_cap",
                f"cumulative {voucher.cumulative_amount} is above the deal's cap {deal.max_spend}",
            )
        tasks = voucher_tasks(voucher)
        # Under the task lock too: an ack and a voucher are each checked against the cap with
        # the other in place. The claim job marks the tasks it claims under the journal's lock.
        with self._task_lock, self.journal.lock:
            book = self.journal.deal(voucher.deal_id)
            if book is None:
                raise self.reject("voucher_covers_undelivered", "no task was delivered")
            latest = book.latest_voucher
            if latest is not None and latest.voucher == voucher:
                self.metrics.vouchers.labels("duplicate").inc()
                return latest, False
            previous = set() if latest is None else set(voucher_tasks(latest.voucher))
            base = 0 if latest is None else latest.voucher.cumulative_amount
            missing = sorted(previous.difference(tasks))
            if missing:
                raise self.reject(
                    "voucher_not_cumulative",
                    f"drops tasks {brief(missing)} of the previous voucher (cumulative {base})",
                )
            fresh = [i for i in tasks if i not in previous]
            owed = self.owed(book, fresh, base)
            increase = voucher.cumulative_amount - base
            if increase <= 0:
                raise self.reject(
                    "voucher_stale",
                    f"cumulative {voucher.cumulative_amount} is not above the previous "
                    f"voucher's {base}",
                )
            if increase < owed:
                raise self.reject(
                    "voucher_underpays",
                    f"newly covers tasks {brief(fresh)} whose receipts sum to {owed}, but adds "
                    f"only {increase} over the previous voucher's {base}: every task bit must "
                    "be paid for",
                )
            self.check_cap_covers(voucher, deal, book, increase - owed)
            stored = self.journal.record_voucher(voucher, sig)
        self.metrics.vouchers.labels("accepted").inc()
        return stored, True

    def check_cap_covers(self, voucher: Voucher, deal: DealState, book: DealBook, tip: int) -> None:
        """Refuse a voucher whose redemption would leave the deal's cap short of what the
        chain may still pay for the other acked tasks (hold the journal's lock).

        Its surplus over the receipts of the tasks it newly covers (``tip``) comes out of the
        same cap as the claims of every other acked task not settled yet; the escrow refuses a
        claim that does not fit. So a client could pay one task generously and leave later
        claims unpayable (:func:`provider.receipts.cap_free`).
        """
        free = self.budget.cap_free(voucher.deal_id, book, deal, voucher)
        if free >= 0:
            return
        latest = book.latest_voucher
        before = self.budget.cap_free(
            voucher.deal_id, book, deal, None if latest is None else latest.voucher
        )
        if free >= before:
            return  # short already (journaled by an older daemon): this voucher adds nothing
        raise self.reject(
            "voucher_leaves_cap_short",
            f"cumulative {voucher.cumulative_amount} pays {tip} more than the receipts of the "
            f"tasks it newly covers; redeemed, it would leave deal {voucher.deal_id}'s cap "
            f"{deal.max_spend} {-free} short of what its other acked tasks may cost: send one "
            f"that adds exactly the receipts' amounts",
        )

    def owed(self, book: DealBook, fresh: list[int], base: int) -> int:
        """Return the receipt amounts of the tasks a voucher newly covers; refuse one that
        covers an undelivered task or a task settled on chain otherwise (hold the journal's
        lock)."""
        claimed, refunded = book.claimed_tasks(), book.refunded_tasks()
        owed = 0
        for index in fresh:
            if index in claimed or index in book.claiming:
                raise self.reject(
                    "voucher_covers_claimed",
                    f"task {index} was claimed on chain: a voucher may not pay it again; send "
                    f"one without it that still covers the previous voucher's tasks and adds "
                    f"the amounts of the tasks it newly covers to {base}",
                )
            if index in refunded:
                raise self.reject("voucher_covers_refunded", f"task {index} was refunded on chain")
            record = book.receipts.get(index)
            if record is None:
                raise self.reject("voucher_covers_undelivered", f"task {index} has no receipt")
            owed += record.receipt.amount
        return owed

    def reject(self, code: str, reason: str) -> RejectedError:
        """Count a refused voucher; return the error to raise."""
        self.metrics.vouchers.labels(code).inc()
        return RejectedError(code, reason)


def brief(indexes: list[int], most: int = 20) -> str:
    """Return a list of task indexes for a message, cut after ``most``."""
    shown = ", ".join(str(i) for i in indexes[:most])
    return f"[{shown}{', ...' if len(indexes) > most else ''}] ({len(indexes)})"


__all__ = ["MAX_VOUCHER_WORDS", "VoucherDesk", "brief"]
