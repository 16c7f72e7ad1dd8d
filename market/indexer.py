"""Chain indexer: follows the escrow's events into deal status and provider reputation.

Events are decoded with the escrow's ABI (`Escrow.decode_events`); every figure comes from an
event's own fields (protocol v2 events carry the deal's terms, the fee, the task bits a voucher
newly paid, a claim's task indexes, a dispute's refund and penalty), never from calldata.

The first run starts at the escrow's deployment block: the configured one, else the block of
the escrow's creating transaction as the node reports it (`ots_getContractCreator`), else a
binary search of `eth_getCode` over history (archive nodes). That start is stored at once, so
no later run searches or scans from block 0 again. Each run then reads `eth_getLogs` over block
ranges up to the head and stores the events of each range together with the new position in one
SQL transaction: a restart resumes where the last committed range ended and never counts an
event twice. When the RPC endpoint is down the run records the failure and returns; the next run
retries.

Reorgs: the indexer reads only blocks `confirmations` deep under the head (the setting
`index_confirmations`; 0 on a local chain) and keeps the hash of the last block it indexed.
A run that finds another block at that height (a reorg deeper than the confirmations replaced
indexed blocks) forgets everything indexed and indexes again from the deployment block: every
deal, event and sum is rebuilt from the canonical chain (time proportional to the escrow's
history; with enough confirmations it does not happen). A range whose last block changed while
its logs were read is not stored; the next run reads it again.

Each run also reports the accounts whose free balance or stake its events moved (`moved`):
Deposited and Withdrawn (the account), Staked and Unstaked (the provider), DealOpened (client
and provider) and the events that pay out, refund or release a deal's money (the indexed
deal's client and provider). After the run the market reads those figures again at the chain
head, for the accounts that hold something on it (`FundsGuard.reread`: no read for the others),
and matches again if a bidder's balance rose. Accounts a run could not read (the chain went
down) are read after the next run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from eth_utils.address import to_checksum_address
from sqlmodel import Session
from web3 import Web3
from web3.exceptions import BlockNotFound

from contracts.binding import Chain, Escrow
from market import chain_index
from market.chain_moves import accounts_moved
from market.deal_states import DealStatus
from market.errors import MarketError
from market.escrow_reader import TRANSIENT_CHAIN
from market.models import INT64, ChainDeal
from market.service import MarketService

log = logging.getLogger(__name__)

TRANSIENT = TRANSIENT_CHAIN
"""Errors that mean "the chain is unreachable now": retried on the next run."""


class DeploymentBlockUnknownError(MarketError, LookupError):
    """Raise when the node can tell neither who created the escrow nor its code in the past."""


class Indexer:
    """Index one escrow's events into the market's database."""

    def __init__(
        self,
        service: MarketService,
        *,
        rpc_url: str,
        escrow: str,
        chunk_blocks: int = 2_000,
        from_block: int | None = None,
        confirmations: int = 0,
        chain_factory: Callable[[str], Chain] = Chain,
    ) -> None:
        """Bind lazily: the chain may be down when the market starts.

        `from_block` is the escrow's deployment block if known (None: found on the first run);
        only blocks `confirmations` under the head are indexed.
        """
        self.confirmations = confirmations
        self.reorgs = 0
        """Reorgs seen under indexed blocks (each rebuilt the index from the canonical chain)."""
        self.service = service
        self.rpc_url = rpc_url
        self.escrow_address = to_checksum_address(escrow)
        self.chunk_blocks = chunk_blocks
        self.from_block = from_block
        self.name = f"escrow:{service.settings.chain_id}:{self.escrow_address.lower()}"
        self._chain_factory = chain_factory
        self._escrow: Escrow | None = None
        self.last_error: str | None = None
        self.moved: frozenset[str] = frozenset()  # accounts the last run's events moved
        self._unread: set[str] = set()  # moved accounts whose figures are not read again yet

    def _bind(self) -> Escrow:
        if self._escrow is None:
            chain = self._chain_factory(self.rpc_url)
            self._escrow = chain.escrow(self.escrow_address)
        return self._escrow

    def run_once(self) -> int:
        """Index up to the chain head; return the number of new events (0 if the RPC is down)."""
        try:
            return self._run()
        except TRANSIENT as exc:
            self._failed(f"{type(exc).__name__}: {exc}", "chain unreachable, will retry")
            self._escrow = None  # rebind (and reconnect) on the next run
            return 0
        except DeploymentBlockUnknownError as exc:
            self._failed(str(exc), "cannot start")
            return 0

    def _failed(self, error: str, what: str) -> None:
        if error != self.last_error:
            log.warning("indexer: %s: %s", what, error)
        self.last_error = error
        self.service.metrics.indexer_errors.inc()

    def _run(self) -> int:
        escrow = self._bind()
        w3 = escrow.tx.w3
        head = int(w3.eth.block_number) - self.confirmations
        last = self.indexed_block()
        if last is not None and self._reorged(w3, last):
            last = None
        if last is None:
            last = self._start(w3, max(head, 0)) - 1
        start = last + 1
        total = 0
        moved: set[str] = set()
        while start <= head:
            end = min(head, start + self.chunk_blocks - 1)
            end_hash = _block_hash(w3, end)
            logs = w3.eth.get_logs({"address": escrow.address, "fromBlock": start, "toBlock": end})
            if _block_hash(w3, end) != end_hash:
                break  # a reorg while the logs were read: this range is read again next run
            chunk: set[str] = set()
            with self.service.session() as session:
                for entry in logs:
                    total += self._apply(session, escrow, entry, chunk)
                chain_index.set_indexed_block(
                    session=session, name=self.name, block=end, block_hash=end_hash
                )
                session.commit()
            moved |= chunk
            self._unread |= chunk  # committed: read again even if a later range fails
            self.service.metrics.indexed_block.set(end)
            start = end + 1
        self.last_error = None
        self.moved = frozenset(moved)
        if total:
            self.service.changed()
        self._reread()
        # Every balance the events up to `head` moved is read again: the kept ones are exact
        # there, and the match gate trusts them while the head stays (`FundsGuard.confirm`).
        self.service.funds.confirm(None if self._unread else head)
        return total

    def _reread(self) -> None:
        """Read again the figures of the moved accounts that hold something on the market
        (`FundsGuard.reread`); match again if a bidder's balance rose."""
        if not self._unread:
            return
        if not self.service.guards_funds():  # no figures kept: nothing to read
            self._unread.clear()
            return
        reread = self.service.funds.reread(self._unread, self.service.now())
        if reread.done:
            self._unread.clear()
        if reread.changed:
            self.service.changed()
        if reread.raised:
            self.service.rematch()  # a deposit can let a bid the gate held back trade

    def _reorged(self, w3: Web3, last: int) -> bool:
        """Return whether the last indexed block was replaced; if so, forget the index (the
        next steps index again from the deployment block)."""
        with self.service.session() as session:
            kept = chain_index.indexed_hash(session=session, name=self.name)
        if kept is None or _block_hash(w3, last) == kept:
            return False
        self.reorgs += 1
        log.warning(
            "indexer: block %d was replaced by a reorg; indexing again from the start", last
        )
        with self.service.session() as session:
            chain_index.reset_chain_index(session=session)
            session.commit()
        self.service.changed()
        return True

    def _start(self, w3: Web3, head: int) -> int:
        """Find and store the first block to index; forget other escrows' events."""
        first = self.from_block
        if first is None:
            first = deployment_block(w3, self.escrow_address, head)
        with self.service.session() as session:
            if any(n != self.name for n in chain_index.indexer_names(session=session)):
                log.warning("indexer: the market now follows %s; forgetting others", self.name)
                chain_index.reset_chain_index(session=session)
            chain_index.set_indexed_block(session=session, name=self.name, block=first - 1)
            session.commit()
        return first

    def indexed_block(self) -> int | None:
        """Return the last block indexed (the deployment block - 1 before any), or None."""
        with self.service.session() as session:
            return chain_index.indexed_block(session=session, name=self.name)

    def _apply(self, session: Session, escrow: Escrow, entry: Any, moved: set[str]) -> int:
        """Store one log's event and apply it; add the accounts whose figures it moved to
        `moved`; return 1 if it was new."""
        events = escrow.decode_events([entry])
        if not events:
            return 0
        event = events[0]
        args = {k: _plain(v) for k, v in event.args.items()}
        tx_hash = _hex(entry["transactionHash"])
        deal_id = event.args.get("dealId")
        fresh = chain_index.add_chain_event(
            session=session,
            tx_hash=tx_hash,
            log_index=int(entry["logIndex"]),
            block_number=int(entry["blockNumber"]),
            name=event.name,
            chain_deal_id=_int64(deal_id) if deal_id is not None else None,
            args=args,
        )
        if not fresh:
            return 0
        moved |= accounts_moved(event.name, event.args, None)  # its deal's parties: below
        if deal_id is None or int(deal_id) > INT64:
            return 1
        deal_id = int(deal_id)
        if event.name == "DealOpened":
            _open(session, event.args, deal_id, tx_hash, int(entry["blockNumber"]))
            return 1
        deal = chain_index.get_chain_deal(session=session, chain_deal_id=deal_id)
        if deal is None:  # opened before the configured first block: nothing to attach to
            return 1
        moved |= accounts_moved(event.name, event.args, (deal.client, deal.provider))
        deal.last_tx = tx_hash
        apply = _APPLY.get(event.name)
        if apply is not None:
            pair = chain_index.provider_client(
                session=session, provider=deal.provider, client=deal.client
            )
            apply(deal, pair, event.args)
            session.add(pair)
        session.add(deal)
        return 1


def _block_hash(w3: Web3, number: int) -> str | None:
    """Return the hash of block `number`, or None when the chain has no such block (now)."""
    try:
        block = w3.eth.get_block(number) if number >= 0 else None
    except BlockNotFound:
        return None
    return _hex(block["hash"]) if block else None


def deployment_block(w3: Web3, address: str, head: int) -> int:
    """Return the block in which the contract at `address` was created.

    Asks the node for the creating transaction (`creation_block`), else searches history for
    the first block with the code (`first_block_with_code`). Raise
    `DeploymentBlockUnknownError` if the node answers neither (configure the block instead).
    """
    block = creation_block(w3, address)
    return block if block is not None else first_block_with_code(w3, address, head)


def creation_block(w3: Web3, address: str) -> int | None:
    """Return the block of the transaction that created `address`, if the node says (the
    Otterscan method `ots_getContractCreator`: anvil, erigon, reth); else None."""
    creator = _request(w3, "ots_getContractCreator", [address])
    if not isinstance(creator, dict) or not creator.get("hash"):
        return None
    return int(w3.eth.get_transaction_receipt(creator["hash"])["blockNumber"])


def first_block_with_code(w3: Web3, address: str, head: int) -> int:
    """Binary-search `eth_getCode` for the first block at which `address` has code (needs a
    node that keeps past state); raise `DeploymentBlockUnknownError` if it does not."""
    if not _has_code(w3, address, head):
        raise DeploymentBlockUnknownError(f"no contract at {address} at block {head}")
    low, high = 0, head  # code at `high`; the answer is the first block with code
    while low < high:
        middle = (low + high) // 2
        if _has_code(w3, address, middle):
            high = middle
        else:
            low = middle + 1
    return low


def _has_code(w3: Web3, address: str, block: int) -> bool:
    code = _request(w3, "eth_getCode", [address, hex(block)])
    if not isinstance(code, str):
        raise DeploymentBlockUnknownError(
            f"the node keeps no state of block {block}, so the escrow's deployment block is "
            "unknown: set MARKET_FROM_BLOCK (or --from-block)"
        )
    return code not in ("0x", "0x0", "")


def _request(w3: Web3, method: str, params: list[Any]) -> Any:
    """Return a JSON-RPC method's result, or None if the node answers with an error."""
    reply = w3.provider.make_request(method, params)  # type: ignore[arg-type]
    if "error" in reply:
        return None
    return reply.get("result")


# -- what each event does to a deal and to its (provider, client) sums ---------------------------


def _open(session: Session, args: dict[str, Any], deal_id: int, tx_hash: str, block: int) -> None:
    client = to_checksum_address(args["client"])
    provider = to_checksum_address(args["provider"])
    quote_hash = _hex(args["quoteHash"]).lower()
    session.add(
        ChainDeal(
            chain_deal_id=deal_id,
            client=client,
            provider=provider,
            arbiter=to_checksum_address(args["arbiter"]),
            quote_hash=quote_hash,
            plan_hash=_hex(args["planHash"]).lower(),
            max_spend=str(args["maxSpend"]),
            stake=str(args["stake"]),
            penalty=str(args["penalty"]),
            expiry=_int64(args["expiry"]),
            challenge_window=_int64(args["challengeWindow"]),
            slo_ms=_int64(args["sloMs"]),
            opened_tx=tx_hash,
            opened_block=block,
            last_tx=tx_hash,
        )
    )
    pair = chain_index.provider_client(session=session, provider=provider, client=client)
    pair.deals += 1
    session.add(pair)
    session.flush()
    chain_index.link_chain_deal(
        session=session, quote_hash=quote_hash, client=client, chain_deal_id=deal_id
    )


def _fee(deal: ChainDeal, _pair: Any, args: dict[str, Any]) -> None:
    deal.reservation_fee = str(int(deal.reservation_fee) + int(args["fee"]))


def _voucher(deal: ChainDeal, pair: Any, args: dict[str, Any]) -> None:
    paid = int(args["paid"])
    deal.paid = _add(deal.paid, paid)
    pair.paid = _add(pair.paid, paid)
    deal.tasks_paid += sum(int(word).bit_count() for word in args["newTasks"])


def _claimed(deal: ChainDeal, _pair: Any, args: dict[str, Any]) -> None:
    batches = json.loads(deal.batches_json)
    tasks = len(args["taskIndexes"])
    batches[str(args["batchId"])] = {"amount": str(args["amount"]), "tasks": tasks}
    deal.batches_json = json.dumps(batches)
    deal.tasks_claimed += tasks


def _batch_tasks(deal: ChainDeal, batch_id: int) -> int:
    return int(json.loads(deal.batches_json).get(str(batch_id), {}).get("tasks", 0))


def _finalized(deal: ChainDeal, pair: Any, args: dict[str, Any]) -> None:
    amount = int(args["amount"])
    deal.paid = _add(deal.paid, amount)
    pair.paid = _add(pair.paid, amount)
    deal.tasks_paid += _batch_tasks(deal, int(args["batchId"]))


def _resolved(deal: ChainDeal, pair: Any, args: dict[str, Any]) -> None:
    if args["providerWins"]:
        _finalized(deal, pair, args)
        deal.disputes_won += 1
        pair.disputes_won += 1
        return
    refund, penalty = int(args["refund"]), int(args["penalty"])
    deal.refunded, pair.refunded = _add(deal.refunded, refund), _add(pair.refunded, refund)
    deal.penalties, pair.penalties = _add(deal.penalties, penalty), _add(pair.penalties, penalty)
    deal.disputes_lost += 1
    pair.disputes_lost += 1


def _breach(deal: ChainDeal, pair: Any, args: dict[str, Any]) -> None:
    refund, penalty = int(args["refund"]), int(args["penalty"])
    deal.refunded, pair.refunded = _add(deal.refunded, refund), _add(pair.refunded, refund)
    deal.penalties, pair.penalties = _add(deal.penalties, penalty), _add(pair.penalties, penalty)
    deal.refunds += 1
    pair.refunds += 1


def _closed(deal: ChainDeal, _pair: Any, args: dict[str, Any]) -> None:
    deal.status = DealStatus.CLOSED
    deal.closed_tx = deal.last_tx
    deal.returned_to_client = str(args["returnedToClient"])
    # The escrow closes a deal only once no claim is pending: no batch event can follow, so
    # the per-batch working map goes; the deal's totals above summarise it.
    deal.batches_json = "{}"


_APPLY: dict[str, Callable[[ChainDeal, Any, dict[str, Any]], None]] = {
    "ReservationFeePaid": _fee,
    "VoucherRedeemed": _voucher,
    "ReceiptsClaimed": _claimed,
    "ClaimFinalized": _finalized,
    "DisputeResolved": _resolved,
    "BreachRefunded": _breach,
    "DealClosed": _closed,
}
"""Events that change a deal's figures; the others (deposits, stakes, disputes opened, close
agreements) are only stored as events."""


def _add(total: str, amount: int) -> str:
    return str(int(total) + amount)


def _int64(value: Any) -> int:
    """Return a uint64 from an event as an SQL integer (saturated: 2^63 - 1 is forever)."""
    return min(int(value), INT64)


def _hex(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    text = str(value)
    return text if text.startswith("0x") else "0x" + text


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return str(value)
    return value
