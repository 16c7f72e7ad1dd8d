"""Read a finished run's settlement back from the chain and check it against what was acked.

Every figure about money comes from the escrow's events and balances; what was acked and
delivered comes from the provider daemons' journals (the client's signed request, the ack, the
receipt), read after the daemons stopped. Nothing here trusts a party's own bookkeeping about
what was paid.

- paid: a task newly covered by a redeemed voucher (`VoucherRedeemed.newTasks`), or claimed
  (`ReceiptsClaimed.taskIndexes`) in a batch that paid out (`ClaimFinalized`, or
  `DisputeResolved` won by the provider);
- refunded: `BreachRefunded`, or claimed in a batch the client won (`DisputeResolved`);
- lost: acked but neither paid nor refunded;
- paid twice: a task settled more than once (paid twice, or paid and refunded), or the same
  inputs of one deal paid under two task indexes (a client rerun that submitted again);
- honest provider losses: what a provider earned by delivering on time and was not paid, and
  the penalties it paid for such tasks (base units);
- honest client losses: what a client paid for tasks not delivered by their deadline or above
  their acked price, what a deal's payments exceed the paid tasks' prices by, and every breach
  whose refund or penalty is missing or short (base units);
- the money invariant: the escrow's token balance equals every account's free balance and free
  stake plus every deal's unspent funds (`maxSpend - committed`) and stake, to the unit.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.binding import Escrow, Token
from contracts.messages import Ack, Receipt, TaskRequest

Key = tuple[int, int]  # (deal id, task index)


@dataclass(frozen=True)
class JournalTask:
    """One task a daemon acked: the client's signed request, the ack and the receipt if any."""

    request: TaskRequest
    ack: Ack
    receipt: Receipt | None

    @property
    def delivered_on_time(self) -> bool:
        """Return whether the receipt says the task finished by the request's deadline."""
        return self.receipt is not None and self.receipt.finished_at <= self.request.deadline


def read_journal(path: Path) -> dict[Key, JournalTask]:
    """Return every acked task of a daemon's journal (SQLite), with its receipt if delivered."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        receipts: dict[Key, Receipt] = {}
        for (raw,) in db.execute("SELECT receipt_json FROM receipts"):
            receipt = Receipt.from_json(json.loads(raw))
            receipts[(receipt.deal_id, receipt.task_index)] = receipt
        tasks: dict[Key, JournalTask] = {}
        for request_raw, ack_raw in db.execute("SELECT request_json, ack_json FROM acks"):
            request = TaskRequest.from_json(json.loads(request_raw))
            ack = Ack.from_json(json.loads(ack_raw))
            key = (ack.deal_id, ack.task_index)
            tasks[key] = JournalTask(request, ack, receipts.get(key))
        return tasks
    finally:
        db.close()


@dataclass
class DealTerms:
    """What `DealOpened` said about a deal."""

    client: str
    provider: str
    penalty: int
    stake: int
    max_spend: int


@dataclass
class ChainSettlement:
    """Every settlement the escrow's events record, per task and per deal."""

    deals: dict[int, DealTerms] = field(default_factory=dict)
    paid: Counter[Key] = field(default_factory=Counter)
    refunded: Counter[Key] = field(default_factory=Counter)
    refunds: dict[Key, tuple[int, int]] = field(default_factory=dict)  # (refund, penalty)
    received: Counter[int] = field(default_factory=Counter)  # what each deal paid its provider
    claimed: set[Key] = field(default_factory=set)
    disputed: set[Key] = field(default_factory=set)  # claimed in batches the client won
    dispute_penalties: int = 0
    vouched: set[Key] = field(default_factory=set)
    accounts: set[str] = field(default_factory=set)
    events: Counter[str] = field(default_factory=Counter)
    dispute_shortfall: int = 0  # what client-won disputes paid short of amount + penalties


def _bits(words: list[int]) -> list[int]:
    return [w * 256 + b for w, word in enumerate(words) for b in range(256) if word >> b & 1]


def read_chain(escrow: Escrow) -> ChainSettlement:
    """Decode every escrow event from block 0 into per-task settlements."""
    w3 = escrow.tx.w3
    logs = w3.eth.get_logs({"address": escrow.address, "fromBlock": 0, "toBlock": "latest"})
    out = ChainSettlement()
    batches: dict[tuple[int, int], list[int]] = {}
    for event in escrow.decode_events(logs):
        a = event.args
        out.events[event.name] += 1
        deal = int(a.get("dealId", 0))
        if event.name == "DealOpened":
            out.deals[deal] = DealTerms(
                str(a["client"]),
                str(a["provider"]),
                int(a["penalty"]),
                int(a["stake"]),
                int(a["maxSpend"]),
            )
            out.accounts |= {str(a["client"]), str(a["provider"]), str(a["arbiter"])}
        elif event.name in ("Deposited", "Withdrawn"):
            out.accounts.add(str(a["account"]))
        elif event.name in ("Staked", "Unstaked"):
            out.accounts.add(str(a["provider"]))
        elif event.name == "ReservationFeePaid":
            out.received[deal] += int(a["fee"])
        elif event.name == "VoucherRedeemed":
            out.received[deal] += int(a["paid"])
            for index in _bits([int(w) for w in a["newTasks"]]):
                out.paid[(deal, index)] += 1
                out.vouched.add((deal, index))
        elif event.name == "ReceiptsClaimed":
            indexes = [int(i) for i in a["taskIndexes"]]
            batches[(deal, int(a["batchId"]))] = indexes
            out.claimed |= {(deal, i) for i in indexes}
        elif event.name == "ClaimFinalized":
            out.received[deal] += int(a["amount"])
            for index in batches[(deal, int(a["batchId"]))]:
                out.paid[(deal, index)] += 1
        elif event.name == "DisputeResolved":
            indexes = batches[(deal, int(a["batchId"]))]
            if a["providerWins"]:
                out.received[deal] += int(a["amount"])
                for index in indexes:
                    out.paid[(deal, index)] += 1
            else:  # the client won: the batch's amount back and the penalty per task
                for index in indexes:
                    out.refunded[(deal, index)] += 1
                    out.disputed.add((deal, index))
                expected = out.deals[deal].penalty * len(indexes)
                out.dispute_shortfall += max(0, int(a["amount"]) - int(a["refund"]))
                out.dispute_shortfall += max(0, expected - int(a["penalty"]))
                out.dispute_penalties += int(a["penalty"])
        elif event.name == "BreachRefunded":
            key = (deal, int(a["taskIndex"]))
            out.refunded[key] += 1
            out.refunds[key] = (int(a["refund"]), int(a["penalty"]))
    return out


def money_invariant(escrow: Escrow, token: Token, chain: ChainSettlement) -> tuple[bool, int, int]:
    """Return (holds, tokens held, tokens owed): balances + stakes + deals' unspent and stake."""
    held = token.balance_of(escrow.address)
    owed = sum(escrow.balance_of(a) + escrow.stake_of(a) for a in chain.accounts)
    for deal_id in range(1, escrow.deal_count() + 1):
        deal = escrow.get_deal(deal_id)
        owed += deal.max_spend - deal.committed + deal.stake
    return held == owed, held, owed


@dataclass(frozen=True)
class Audit:
    """The figures of a finished run, read back from the chain."""

    tasks_acked: int
    tasks_paid: int
    tasks_refunded: int
    tasks_lost: int
    tasks_paid_twice: int
    honest_provider_losses: int
    honest_client_losses: int
    invariant_ok: bool
    details: dict[str, Any]

    def figures(self) -> dict[str, Any]:
        """Return the eight figures, then the details."""
        return {
            "tasks_acked": self.tasks_acked,
            "tasks_paid": self.tasks_paid,
            "tasks_refunded": self.tasks_refunded,
            "tasks_lost": self.tasks_lost,
            "tasks_paid_twice": self.tasks_paid_twice,
            "honest_provider_losses": self.honest_provider_losses,
            "honest_client_losses": self.honest_client_losses,
            "invariant_ok": self.invariant_ok,
            **self.details,
        }


def audit(
    escrow: Escrow,
    token: Token,
    journals: list[Path],
    *,
    client_acked: set[Key] | None = None,
) -> Audit:
    """Audit every deal on the escrow against the daemons' journals.

    ``client_acked`` (optional) are the tasks the clients' ledgers hold an ack for; a task a
    client holds an ack for but no daemon journaled is counted as acked (and shows up lost).
    """
    chain = read_chain(escrow)
    tasks: dict[Key, JournalTask] = {}
    for path in journals:
        tasks.update(read_journal(path))
    acked = set(tasks) | (client_acked or set())
    paid = {k for k, n in chain.paid.items() if n}
    refunded = {k for k, n in chain.refunded.items() if n}
    lost = acked - paid - refunded

    twice = {k for k in acked | paid | refunded if chain.paid[k] + chain.refunded[k] > 1}
    by_inputs: Counter[tuple[int, bytes]] = Counter(
        (deal, tasks[(deal, index)].request.input_hash)
        for deal, index in paid
        if (deal, index) in tasks
    )
    same_inputs = sum(n - 1 for n in by_inputs.values() if n > 1)

    provider_losses = 0
    client_losses = 0
    owed_by_deal: Counter[int] = Counter()
    for key in sorted(acked | paid | refunded):
        deal = chain.deals.get(key[0])
        task = tasks.get(key)
        price = task.ack.price if task is not None else 0
        if task is not None and task.delivered_on_time:
            assert task.receipt is not None
            amount = task.receipt.amount
            if key in paid:
                owed_by_deal[key[0]] += amount
                if amount > price or amount > task.request.max_price:
                    client_losses += amount - min(price, task.request.max_price)
            else:
                provider_losses += amount
            if key in refunded:
                penalty = deal.penalty if deal is not None else 0
                provider_losses += chain.refunds.get(key, (0, penalty))[1]
            continue
        # Not delivered by its deadline (or never acked by a daemon): a breach for the client.
        if key in paid:
            client_losses += task.receipt.amount if task and task.receipt else price
        elif key in chain.disputed:
            continue  # won in a dispute: its batch's shortfall is counted once, below
        elif deal is not None and task is not None:
            refund, penalty = chain.refunds.get(key, (0, 0))
            client_losses += max(0, price - refund) + max(0, deal.penalty - penalty)
    client_losses += chain.dispute_shortfall
    for deal_id, received in chain.received.items():
        client_losses += max(0, received - owed_by_deal[deal_id])
        provider_losses += max(0, owed_by_deal[deal_id] - received)

    ok, held, owed = money_invariant(escrow, token, chain)
    delivered = [t for t in tasks.values() if t.receipt is not None]
    details: dict[str, Any] = {
        "deals": len(chain.deals),
        "tasks_delivered_on_time": sum(t.delivered_on_time for t in tasks.values()),
        "tasks_delivered_late": sum(not t.delivered_on_time for t in delivered),
        "tasks_undelivered": sum(t.receipt is None for t in tasks.values()),
        "tasks_vouched": len(chain.vouched & paid),
        "tasks_claimed": len(chain.claimed),
        "tasks_same_inputs_paid_again": same_inputs,
        "inputs_acked": len({(k[0], t.request.input_hash) for k, t in tasks.items()}),
        "paid_to_providers": sum(chain.received.values()),
        "refunded_to_clients": sum(r for r, _ in chain.refunds.values()),
        "penalties_to_clients": sum(p for _, p in chain.refunds.values()) + chain.dispute_penalties,
        "tasks_paid_without_ack": len(paid - set(tasks)),
        "escrow_tokens": held,
        "escrow_owes": owed,
        "events": dict(sorted(chain.events.items())),
        "lost": [list(k) for k in sorted(lost)][:20],
    }
    return Audit(
        tasks_acked=len(acked),
        tasks_paid=len(paid),
        tasks_refunded=len(refunded),
        tasks_lost=len(lost),
        tasks_paid_twice=len(twice) + same_inputs,
        honest_provider_losses=provider_losses,
        honest_client_losses=client_losses,
        invariant_ok=ok,
        details=details,
    )
