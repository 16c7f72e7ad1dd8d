"""The client's eye on the chain: the deal's opening, the provider's claims, and disputes.

A provider may claim tasks on chain (``ReceiptsClaimed``) instead of redeeming a voucher. The
escrow checks that the client signed each request and that the price is the plan's, but it
cannot know whether the client got the result. The watcher reads the claims of one deal, from
the block the deal was opened in (found once, by a backward scan in bounded chunks when the
ledger does not know it, then kept; never below the escrow's deployment block, configured or
told by the market's ``GET /v1/domain`` as ``escrow_block``), and judges each batch against
the client's ledger:

- every task must have been delivered to the client and verified by its deadline (a task the
  ledger has not seen verified is asked for once more first: an honest provider whose result
  the client missed, during a restart say, is not disputed);
- the batch's amount must not exceed the sum of the acked prices of its tasks.

A batch that fails either check is disputed inside its challenge window. A dispute the
arbiter leaves unresolved past the arbitration period is lapsed for the client (it then gets
the batch's amount back and the penalty per task). Every verdict is kept in the ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

from client.accounts import ClientAccount
from client.amounts import tokens
from client.ledger import DealLedger
from client.ledger_records import BatchRecord, ChainState, TaskRecord, TaskState
from contracts.binding import (
    BATCH_DISPUTED,
    BATCH_PAID,
    BATCH_PENDING,
    BATCH_REJECTED,
    Escrow,
    indexed_topic,
)
from contracts.errors import ChainError, ContractRevert
from contracts.messages import TaskRequest
from contracts.reverts import EscrowChallengeWindowClosed

LOG_CHUNK_BLOCKS = 10_000
"""Blocks per ``eth_getLogs`` query: bounded ranges, as public endpoints require."""

ESCROW_BLOCK_KEY = "escrow_block"
"""The key of the escrow's deployment block in the market's ``GET /v1/domain`` answer."""

Recheck = Callable[[int], TaskRecord | None]
"""Ask the provider once more for a task's result; return the task's updated record."""
Say = Callable[[str], None]
EscrowBlock = Callable[[], int | None]
"""Tell the escrow's deployment block (e.g. :func:`market_escrow_block`); None when unknown."""
Evidence = Callable[[int, int, Mapping[int, TaskRequest | None]], bool]
"""Hand a disputed batch's programs to the arbiter (deal, batch, index -> signed request or None)
(e.g. :class:`client.dispute_evidence.ProgramEvidence`); True once all are there."""


@dataclass(frozen=True)
class WatchReport:
    """What one pass of the watcher saw and did."""

    batches_seen: int
    accepted: tuple[int, ...]
    disputed: tuple[int, ...]
    missed: tuple[int, ...]
    lapsed: tuple[int, ...]
    won: tuple[int, ...]
    lost: tuple[int, ...]
    to_block: int


def deal_logs(
    escrow: Escrow,
    name: str,
    deal_id: int,
    from_block: int,
    to_block: int,
    *,
    chunk: int = LOG_CHUNK_BLOCKS,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(block, args)`` of the escrow's ``name`` events of one deal, oldest first.

    The deal id is the event's first indexed argument; the range is read in chunks.
    """
    topics = [escrow.event_topic(name), indexed_topic(deal_id)]
    start = from_block
    while start <= to_block:
        end = min(to_block, start + chunk - 1)
        logs = escrow.tx.w3.eth.get_logs(
            {"address": escrow.address, "fromBlock": start, "toBlock": end, "topics": topics}  # type: ignore[typeddict-item]
        )
        for log, event in zip(logs, escrow.decode_events(logs), strict=True):
            yield int(log["blockNumber"]), event.args
        start = end + 1


def find_open_block(
    escrow: Escrow, deal_id: int, *, lowest: int = 0, chunk: int = LOG_CHUNK_BLOCKS
) -> tuple[int, dict[str, Any]]:
    """Return the block and arguments of the deal's ``DealOpened`` event.

    Scan backwards from the latest block in bounded chunks (a deal is usually recent), never
    below ``lowest`` (the escrow's deployment block when known). Raise ``ChainError`` if the
    event is not found.
    """
    latest = int(escrow.tx.w3.eth.block_number)
    end = latest
    while end >= lowest:
        start = max(lowest, end - chunk + 1)
        for block, args in deal_logs(escrow, "DealOpened", deal_id, start, end, chunk=chunk):
            return block, args
        end = start - 1
    raise ChainError(f"no DealOpened event of deal {deal_id} at or after block {lowest}")


def escrow_block_of(answer: Mapping[str, Any]) -> int | None:
    """Return the escrow's deployment block a market's ``GET /v1/domain`` answer names, if any
    (null when the market does not know it; absent from markets older than the key)."""
    block = answer.get(ESCROW_BLOCK_KEY)
    if isinstance(block, bool) or not isinstance(block, int) or block < 0:
        return None
    return block


def market_escrow_block(market_url: str, *, timeout_s: float = 10.0) -> int | None:
    """Ask a market where its escrow was deployed (``GET /v1/domain``); None when it does not
    say or cannot be reached (the watcher then reads from block 0, as before)."""
    try:
        reply = httpx.get(market_url.rstrip("/") + "/v1/domain", timeout=timeout_s)
        reply.raise_for_status()
        answer = reply.json()
    except (httpx.HTTPError, ValueError):
        return None
    return escrow_block_of(answer) if isinstance(answer, dict) else None


def judge_batch(
    ledger: DealLedger, amount: int, tasks: tuple[int, ...], recheck: Recheck | None = None
) -> tuple[bool, str]:
    """Return (dispute?, why) for a claimed batch, from the client's ledger.

    A task must be verified by its deadline (asked once more through ``recheck`` when the
    ledger has not seen it verified); the amount must not pass the acked prices' sum.
    """
    acked = 0
    for index in tasks:
        record = ledger.tasks.get(index)
        if record is not None and record.state != TaskState.VERIFIED and recheck is not None:
            record = recheck(index) or record
        if record is None:
            return True, f"task {index} was never requested by this client"
        if record.state != TaskState.VERIFIED:
            return True, f"task {index} was not delivered and verified by its deadline"
        acked += record.ack.price if record.ack is not None else 0
    if amount > acked:
        return True, f"the batch claims {amount}, above its tasks' acked prices {acked}"
    return False, "every task delivered and verified, within the acked prices"


@dataclass
class ClaimWatcher:
    """Read a deal's claims since the ledger last looked; dispute the bad ones; lapse them."""

    account: ClientAccount
    ledger: DealLedger
    recheck: Recheck | None = None
    say: Say | None = None
    lowest_block: int = 0  # the escrow's deployment block, when known
    escrow_block: EscrowBlock | None = None  # asked when lowest_block is 0 (e.g. the market)
    evidence: Evidence | None = None  # hands a disputed batch's programs to the arbiter

    @property
    def escrow(self) -> Escrow:
        """Return the escrow the account uses."""
        return self.account.escrow

    def lowest(self) -> int:
        """Return the block below which no log is read: ``lowest_block`` when set, else the
        escrow's deployment block as ``escrow_block`` tells it (asked once), else 0."""
        if not self.lowest_block and self.escrow_block is not None:
            self.lowest_block = self.escrow_block() or 0
            self.escrow_block = None
        return self.lowest_block

    def open_block(self) -> int:
        """Return the deal's open block (found once, then kept in the ledger)."""
        if self.ledger.open_block is None:
            block, _ = find_open_block(self.escrow, self.ledger.deal_id, lowest=self.lowest())
            self.ledger.open_block = block
            self.ledger.save()
        return int(self.ledger.open_block)

    def _say(self, text: str) -> None:
        if self.say is not None:
            self.say(text)

    def scan(self) -> WatchReport:
        """Read new claims, judge and dispute them, and lapse expired disputes."""
        ledger, deal_id = self.ledger, self.ledger.deal_id
        first = (
            self.open_block()
            if ledger.scanned_block is None
            else max(self.open_block(), ledger.scanned_block + 1)
        )
        latest = int(self.escrow.tx.w3.eth.block_number)
        seen = 0
        for _, args in deal_logs(self.escrow, "ReceiptsClaimed", deal_id, first, latest):
            seen += 1
            batch = int(args["batchId"])
            tasks = tuple(int(i) for i in args["taskIndexes"])
            for index in tasks:
                if index in ledger.tasks:
                    ledger.update(index, chain=ChainState.CLAIMED, batch=batch)
            if batch not in ledger.batches:
                ledger.set_batch(
                    BatchRecord(
                        batch=batch,
                        amount=int(args["amount"]),
                        tasks=tasks,
                        deadline=int(args["deadline"]),
                        verdict="unjudged",
                    )
                )
        ledger.scanned_block = latest
        ledger.save()
        accepted, disputed, missed = self._judge()
        lapsed, won, lost = self._follow_disputes()
        return WatchReport(seen, accepted, disputed, missed, lapsed, won, lost, latest)

    def _judge(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        ledger = self.ledger
        accepted: list[int] = []
        disputed: list[int] = []
        missed: list[int] = []
        for batch_id, batch in sorted(ledger.batches.items()):
            if batch.verdict not in ("unjudged", "to_dispute"):
                continue
            dispute, why = judge_batch(ledger, batch.amount, batch.tasks, self.recheck)
            if not dispute:
                ledger.set_batch(replace(batch, verdict="accepted", reason=why))
                accepted.append(batch_id)
                ledger.save()
                continue
            short = self._fee_missing()
            if short is not None:
                ledger.set_batch(replace(batch, verdict="to_dispute", reason=why))
                ledger.save()
                self._say(f"batch {batch_id}: not disputed ({why}): {short}; will retry")
                continue
            try:
                self.account.dispute(ledger.deal_id, batch_id)
            except EscrowChallengeWindowClosed:
                ledger.set_batch(replace(batch, verdict="missed", reason=why))
                missed.append(batch_id)
                self._say(f"batch {batch_id}: its window closed before it could be disputed")
            except ContractRevert as exc:
                state = self.escrow.get_batch(ledger.deal_id, batch_id).status
                verdict = "disputed" if state == BATCH_DISPUTED else "missed"
                ledger.set_batch(replace(batch, verdict=verdict, reason=f"{why} ({exc})"))
                (disputed if verdict == "disputed" else missed).append(batch_id)
            except ChainError as exc:
                ledger.set_batch(replace(batch, verdict="to_dispute", reason=why))
                self._say(f"batch {batch_id}: dispute not sent yet ({exc}); will retry")
            else:
                ledger.set_batch(replace(batch, verdict="disputed", reason=why))
                disputed.append(batch_id)
                self._say(f"disputed batch {batch_id}: {why}")
            ledger.save()
        return tuple(accepted), tuple(disputed), tuple(missed)

    def _fee_missing(self) -> str | None:
        """Say what is missing when a dispute would hold the arbiter's fee from the client's
        free escrow balance and that balance is short (the dispute would revert); else None."""
        fee, _ = self.escrow.deal_arbiter_fee(self.ledger.deal_id)
        free = self.escrow.balance_of(self.account.address)
        if fee <= free:
            return None
        return (
            f"a dispute holds the arbiter's fee of {tokens(fee)} tokens from the free escrow "
            f"balance, which is {tokens(free)}: deposit {tokens(fee - free)} more "
            "(`tpumarket client deposit AMOUNT`)"
        )

    def _follow_disputes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Record how disputes ended; lapse those the arbiter left past its period."""
        ledger = self.ledger
        lapsed: list[int] = []
        won: list[int] = []
        lost: list[int] = []
        now = int(self.escrow.tx.w3.eth.get_block("latest")["timestamp"])
        for batch_id, batch in sorted(ledger.batches.items()):
            if batch.verdict != "disputed" or batch.outcome is not None:
                continue
            state = self.escrow.get_batch(ledger.deal_id, batch_id)
            if state.status == BATCH_DISPUTED and now < state.deadline and self.evidence:
                requests = {
                    i: (r.request if (r := ledger.tasks.get(i)) is not None else None)
                    for i in batch.tasks
                }
                self.evidence(ledger.deal_id, batch_id, requests)
            if state.status == BATCH_DISPUTED and now >= state.deadline:
                try:
                    self.escrow.lapse_dispute(self.account.key, ledger.deal_id, batch_id)
                except (ContractRevert, ChainError) as exc:
                    self._say(f"batch {batch_id}: lapse not sent yet ({exc})")
                    continue
                lapsed.append(batch_id)
                state = self.escrow.get_batch(ledger.deal_id, batch_id)
            if state.status == BATCH_REJECTED:
                ledger.set_batch(replace(batch, outcome="client_won"))
                won.append(batch_id)
            elif state.status == BATCH_PAID:
                ledger.set_batch(replace(batch, outcome="provider_won"))
                lost.append(batch_id)
            elif state.status == BATCH_PENDING:
                continue
            ledger.save()
        return tuple(lapsed), tuple(won), tuple(lost)
