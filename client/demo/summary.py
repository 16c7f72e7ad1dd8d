"""The figures the demo ends with, read from the chain: each deal's settlement, the per-task
table, the six figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from client.demo.deals import Deal
from client.demo.errors import DemoError
from client.demo.text import (
    Say,
    delivered_json,
    diagnosis_line,
    late_or_reason,
    success_detail,
    tokens,
)
from contracts.binding import Escrow
from contracts.transactor import Event

_PAYING_EVENTS = frozenset({"VoucherRedeemed", "ReceiptsClaimed", "ClaimFinalized"})


@dataclass(frozen=True)
class DealSettlement:
    """What the chain says one deal paid its provider, refunded, and gave back at its close."""

    provider: str
    deal_id: int
    cap: int  # the deal's maxSpend
    vouchers: int  # VoucherRedeemed events: the client's vouchers the provider redeemed
    vouched: int  # what they paid (the deal's `vouched`)
    claims: int  # ClaimFinalized events: the provider's claims no voucher paid
    claimed: int  # what they paid
    fee: int  # the plan's reservation fee, paid at the open
    refunds: int  # BreachRefunded events
    refunded: int  # what they returned to the client ...
    penalties: int  # ... and the penalties from the provider's stake
    returned: int  # to the client at the close (DealClosed)

    @property
    def spent(self) -> int:
        """Return what the client paid the provider: vouchers + finalized claims + fee."""
        return self.vouched + self.claimed + self.fee


@dataclass(frozen=True)
class Summary:
    """The figures the demo ends with (the keys of its JSON line)."""

    tasks_run: int
    tasks_paid: int
    tasks_refunded: int
    failures_diagnosed: int
    total_spent: int
    gas_per_paid_task: int
    settlements: tuple[DealSettlement, ...] = ()  # per deal, for the printed summary only

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
    events = escrow_events(escrow)
    settled = settlements(escrow, deals, [event for _, event in events])
    total_spent = sum(s.spent for s in settled)
    gas = settlement_gas(escrow, [d.chain_id for d in deals], events)
    summary = Summary(
        tasks_run=run,
        tasks_paid=paid,
        tasks_refunded=refunded,
        failures_diagnosed=diagnosed,
        total_spent=total_spent,
        gas_per_paid_task=gas // paid if paid else 0,
        settlements=tuple(settled),
    )
    return summary, rows


def escrow_events(escrow: Escrow) -> list[tuple[Any, Event]]:
    """Return every event of the escrow so far, each with its log."""
    w3 = escrow.tx.w3
    logs = w3.eth.get_logs({"address": escrow.address, "fromBlock": 0, "toBlock": "latest"})
    return [(log, event) for log in logs for event in escrow.decode_events([log])]


def settlements(escrow: Escrow, deals: list[Deal], events: list[Event]) -> list[DealSettlement]:
    """Return each deal's settlement as the chain holds it.

    Raise ``DemoError`` if a closed deal does not add up: its cap = what it spent (vouchers,
    finalized claims, fee) + what was refunded + what the close returned.
    """
    out = []
    for deal in deals:
        mine = [e for e in events if "dealId" in e.args and int(e.args["dealId"]) == deal.chain_id]

        def named(name: str, mine: list[Event] = mine) -> list[Event]:
            return [e for e in mine if e.name == name]

        redeemed, claims = named("VoucherRedeemed"), named("ClaimFinalized")
        refunds, closed = named("BreachRefunded"), named("DealClosed")
        state = escrow.get_deal(deal.chain_id)
        settled = DealSettlement(
            provider=deal.profile.name,
            deal_id=deal.chain_id,
            cap=state.max_spend,
            vouchers=len(redeemed),
            vouched=state.vouched,
            claims=len(claims),
            claimed=sum(int(e.args["amount"]) for e in claims),
            fee=sum(int(e.args["fee"]) for e in named("ReservationFeePaid")),
            refunds=len(refunds),
            refunded=sum(int(e.args["refund"]) for e in refunds),
            penalties=sum(int(e.args["penalty"]) for e in refunds),
            returned=sum(int(e.args["returnedToClient"]) for e in closed),
        )
        accounted = settled.spent + settled.refunded + settled.returned
        if closed and accounted != settled.cap:
            raise DemoError(
                f"deal {deal.chain_id} ({deal.profile.name}) does not add up: cap "
                f"{settled.cap:,} units, spent + refunded + returned {accounted:,}"
            )
        out.append(settled)
    return out


def settlement_gas(escrow: Escrow, deal_ids: list[int], events: list[tuple[Any, Event]]) -> int:
    """Return the gas of every transaction that paid tasks (redeemed vouchers, claims), from
    the escrow's ``events`` (see `escrow_events`)."""
    w3 = escrow.tx.w3
    hashes: set[str] = set()
    for log, event in events:
        if event.name in _PAYING_EVENTS and int(event.args["dealId"]) in deal_ids:
            hashes.add("0x" + bytes(log["transactionHash"]).hex())
    gas = 0
    for tx_hash in sorted(hashes):
        receipt: Any = w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
        gas += int(receipt["gasUsed"])
    return gas


def print_table(rows: list[list[str]], say: Say) -> None:
    """Print the per-task table."""
    _print_rows(["provider", "task", "what", "outcome", "paid", "detail"], rows, say)


def print_settlements(summary: Summary, say: Say) -> None:
    """Print each deal's settlement as the chain holds it: cap = spent + refunded + returned."""

    def count(n: int, what: str) -> str:
        return f"{n} {what}{'s' if n != 1 else ''}"

    header = [
        "deal",
        "provider",
        "paid by vouchers",
        "paid by claims",
        "fee",
        "refunded + penalty",
        "back at close",
        "cap",
    ]
    rows = [
        [
            str(s.deal_id),
            s.provider,
            f"{tokens(s.vouched)} ({count(s.vouchers, 'redemption')})" if s.vouchers else "none",
            f"{tokens(s.claimed)} ({count(s.claims, 'claim')})" if s.claims else "none",
            tokens(s.fee),
            f"{tokens(s.refunded)} + {tokens(s.penalties)} ({count(s.refunds, 'task')})"
            if s.refunds
            else "none",
            tokens(s.returned),
            tokens(s.cap),
        ]
        for s in summary.settlements
    ]
    _print_rows(header, rows, say)
    say("  (each deal: cap = vouchers + claims + fee + refunded + back at close, checked)")


def _print_rows(header: list[str], rows: list[list[str]], say: Say) -> None:
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
    say(f"  gas per paid task    {summary.gas_per_paid_task:,} (voucher redemptions, claims)")
