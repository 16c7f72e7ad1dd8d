"""The figures the demo ends with, read from the chain, and the per-task table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from client.demo.deals import Deal
from client.demo.text import (
    Say,
    delivered_json,
    diagnosis_line,
    late_or_reason,
    success_detail,
    tokens,
)
from contracts.binding import Escrow

_PAYING_EVENTS = frozenset({"VoucherRedeemed", "ReceiptsClaimed", "ClaimFinalized"})


@dataclass(frozen=True)
class Summary:
    """The figures the demo ends with (the keys of its JSON line)."""

    tasks_run: int
    tasks_paid: int
    tasks_refunded: int
    failures_diagnosed: int
    total_spent: int
    gas_per_paid_task: int

    def to_json(self) -> dict[str, int]:
        """Return the JSON line's object: exactly the six figures."""
        return {
            "tasks_run": self.tasks_run,
            "tasks_paid": self.tasks_paid,
            "tasks_refunded": self.tasks_refunded,
            "failures_diagnosed": self.failures_diagnosed,
            "total_spent": self.total_spent,
            "gas_per_paid_task": self.gas_per_paid_task,
        }


def summarize(escrow: Escrow, deals: list[Deal]) -> tuple[Summary, list[list[str]]]:
    """Return the figures (spending and gas read from the chain) and one table row per task."""
    rows: list[list[str]] = []
    run = paid = refunded = diagnosed = 0
    for deal in deals:
        for outcome in deal.outcomes:
            run += 1
            task = deal.task_of(outcome)
            view = outcome.view
            amount = view.receipt.amount if view and view.receipt else 0
            failure = delivered_json(outcome) if view is not None and view.diagnosis else None
            if outcome.refunded is not None:
                refunded += 1
                refund, penalty = outcome.refunded
                state, money = "refunded", "0"
                detail = (
                    f"{late_or_reason(outcome)}; refund {tokens(refund)} "
                    f"+ penalty {tokens(penalty)}"
                )
            elif outcome.verified and failure is not None:
                diagnosed += 1
                state, money = f"failed: {failure.get('category')}", tokens(amount)
                detail = diagnosis_line(failure)
            elif outcome.verified:
                paid += 1
                state, money = "paid", tokens(amount)
                detail = success_detail(outcome, task)
            else:
                state, money, detail = "unsettled", "0", late_or_reason(outcome)
            label = task.label if task is not None else "?"
            rows.append([deal.profile.name, str(outcome.index), label, state, money, detail])
    ids = [d.chain_id for d in deals]
    total_spent = sum(escrow.get_deal(i).vouched for i in ids) + finalized_claims(escrow, ids)
    gas = settlement_gas(escrow, [d.chain_id for d in deals])
    summary = Summary(
        tasks_run=run,
        tasks_paid=paid,
        tasks_refunded=refunded,
        failures_diagnosed=diagnosed,
        total_spent=total_spent,
        gas_per_paid_task=gas // paid if paid else 0,
    )
    return summary, rows


def finalized_claims(escrow: Escrow, deal_ids: list[int]) -> int:
    """Return what the providers' finalized claims took: tasks paid without a voucher (the
    client's voucher came after the provider's job claimed them)."""
    w3 = escrow.tx.w3
    logs = w3.eth.get_logs(
        {
            "address": escrow.address,
            "fromBlock": 0,
            "toBlock": "latest",
            "topics": [escrow.event_topic("ClaimFinalized")],
        }
    )
    return sum(
        int(e.args["amount"]) for e in escrow.decode_events(logs) if e.args["dealId"] in deal_ids
    )


def settlement_gas(escrow: Escrow, deal_ids: list[int]) -> int:
    """Return the gas of every transaction that paid tasks (redeemed vouchers, claims)."""
    w3 = escrow.tx.w3
    logs = w3.eth.get_logs({"address": escrow.address, "fromBlock": 0, "toBlock": "latest"})
    hashes: set[str] = set()
    for log in logs:
        for event in escrow.decode_events([log]):
            if event.name in _PAYING_EVENTS and int(event.args["dealId"]) in deal_ids:
                hashes.add("0x" + bytes(log["transactionHash"]).hex())
    gas = 0
    for tx_hash in sorted(hashes):
        receipt: Any = w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
        gas += int(receipt["gasUsed"])
    return gas


def print_table(rows: list[list[str]], say: Say) -> None:
    """Print the per-task table."""
    header = ["provider", "task", "what", "outcome", "paid", "detail"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    say("")
    for row in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)]
        say("  " + "  ".join([*cells, row[-1]]))


def print_figures(summary: Summary, say: Say) -> None:
    """Print the six figures."""
    say("")
    say(f"  tasks run            {summary.tasks_run}")
    say(f"  paid                 {summary.tasks_paid}")
    say(f"  refunded (late)      {summary.tasks_refunded}")
    say(f"  diagnosed failures   {summary.failures_diagnosed}")
    say(f"  total spent          {tokens(summary.total_spent)} ({summary.total_spent:,} units)")
    say(f"  gas per paid task    {summary.gas_per_paid_task:,} (voucher redemption)")
