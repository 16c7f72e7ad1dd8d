"""Chain indexer: follows the escrow's events into deal status and provider outcomes.

Each run reads `eth_getLogs` over block ranges from the block after the last one indexed up to
the chain head, and stores the events of each range together with the new position in one SQL
transaction, so a restart resumes exactly where the last committed range ended and never counts
an event twice. When the RPC endpoint is down the run records the failure and returns; the next
run retries. Reorgs are not handled (anvil and L2 sequencers do not reorg in practice); add a
confirmation depth before a chain that does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import requests
from eth_utils.address import to_checksum_address
from sqlmodel import Session
from web3.exceptions import Web3Exception

from contracts.binding import Chain, Escrow
from contracts.errors import ChainError
from market import storage
from market.models import ChainDeal
from market.service import MarketService

log = logging.getLogger(__name__)

TRANSIENT = (ChainError, OSError, requests.RequestException, Web3Exception, TimeoutError)
"""Errors that mean "the chain is unreachable now": retried on the next run."""


class Indexer:
    """Index one escrow's events into the market's database."""

    def __init__(
        self,
        service: MarketService,
        *,
        rpc_url: str,
        escrow: str,
        chunk_blocks: int = 2_000,
        from_block: int = 0,
        chain_factory: Callable[[str], Chain] = Chain,
    ) -> None:
        """Bind lazily: the chain may be down when the market starts."""
        self.service = service
        self.rpc_url = rpc_url
        self.escrow_address = to_checksum_address(escrow)
        self.chunk_blocks = chunk_blocks
        self.from_block = from_block
        self.name = f"escrow:{service.settings.chain_id}:{self.escrow_address.lower()}"
        self._chain_factory = chain_factory
        self._escrow: Escrow | None = None
        self.last_error: str | None = None

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
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.service.metrics.indexer_errors.inc()
            log.warning("indexer: chain unreachable, will retry: %s", self.last_error)
            self._escrow = None  # rebind (and reconnect) on the next run
            return 0

    def _run(self) -> int:
        escrow = self._bind()
        w3 = escrow.tx.w3
        head = int(w3.eth.block_number)
        with self.service.session() as session:
            last = storage.indexed_block(session=session, name=self.name)
        start = self.from_block if last is None else last + 1
        total = 0
        while start <= head:
            end = min(head, start + self.chunk_blocks - 1)
            logs = w3.eth.get_logs({"address": escrow.address, "fromBlock": start, "toBlock": end})
            with self.service.session() as session:
                for entry in logs:
                    total += self._apply(session, escrow, entry)
                storage.set_indexed_block(session=session, name=self.name, block=end)
                session.commit()
            self.service.metrics.indexed_block.set(end)
            start = end + 1
        self.last_error = None
        if total:
            self.service._changed()
        return total

    def indexed_block(self) -> int | None:
        """Return the last block indexed, or None before the first run."""
        with self.service.session() as session:
            return storage.indexed_block(session=session, name=self.name)

    def _apply(self, session: Session, escrow: Escrow, entry: Any) -> int:
        events = escrow.decode_events([entry])
        if not events:
            return 0
        event = events[0]
        args = {k: _plain(v) for k, v in event.args.items()}
        tx_hash = _hex(entry["transactionHash"])
        deal_id = args.get("dealId")
        fresh = storage.add_chain_event(
            session=session,
            tx_hash=tx_hash,
            log_index=int(entry["logIndex"]),
            block_number=int(entry["blockNumber"]),
            name=event.name,
            chain_deal_id=int(deal_id) if deal_id is not None else None,
            args=args,
        )
        if not fresh or deal_id is None:
            return int(fresh)
        deal_id = int(deal_id)
        if event.name == "DealOpened":
            session.add(
                ChainDeal(
                    chain_deal_id=deal_id,
                    client=to_checksum_address(args["client"]),
                    provider=to_checksum_address(args["provider"]),
                    quote_hash=str(args["quoteHash"]).lower(),
                    max_spend=str(args["maxSpend"]),
                    opened_tx=tx_hash,
                    opened_block=int(entry["blockNumber"]),
                    last_tx=tx_hash,
                )
            )
            session.flush()
            storage.link_chain_deal(
                session=session,
                quote_hash=str(args["quoteHash"]).lower(),
                client=str(args["client"]),
                chain_deal_id=deal_id,
            )
            return 1
        deal = storage.get_chain_deal(session=session, chain_deal_id=deal_id)
        if deal is None:  # opened before the indexer's first block: nothing to attach to
            return 1
        deal.last_tx = tx_hash
        extra = json.loads(deal.batches_json)
        if event.name == "VoucherRedeemed":
            deal.paid = str(int(deal.paid) + int(args["paid"]))
            bits = self._voucher_bits(escrow, tx_hash)
            held = [int(w, 16) for w in extra.get("vouched_bits", [])]
            merged = [
                (held[i] if i < len(held) else 0) | (bits[i] if i < len(bits) else 0)
                for i in range(max(len(held), len(bits)))
            ]
            extra["vouched_bits"] = [hex(w) for w in merged]
            extra["vouched"] = sum(bin(w).count("1") for w in merged)
        elif event.name == "ReceiptsClaimed":
            extra.setdefault("batches", {})[str(args["batchId"])] = int(args["tasks"])
        elif event.name == "ClaimFinalized":
            tasks = extra.get("batches", {}).get(str(args["batchId"]), 0)
            extra["claimed_paid"] = extra.get("claimed_paid", 0) + tasks
            deal.paid = str(int(deal.paid) + int(args["amount"]))
        elif event.name == "DisputeResolved":
            if args["providerWins"]:
                deal.disputes_won += 1
                tasks = extra.get("batches", {}).get(str(args["batchId"]), 0)
                extra["claimed_paid"] = extra.get("claimed_paid", 0) + tasks
                deal.paid = str(int(deal.paid) + int(args["amount"]))
            else:
                deal.disputes_lost += 1
        elif event.name == "BreachRefunded":
            deal.refunds += 1
            deal.refunded = str(int(deal.refunded) + int(args["refund"]))
        elif event.name == "DealClosed":
            deal.status = "closed"
            deal.closed_tx = tx_hash
            deal.returned_to_client = str(args["returnedToClient"])
        deal.tasks_paid = int(extra.get("vouched", 0)) + int(extra.get("claimed_paid", 0))
        deal.batches_json = json.dumps(extra)
        session.add(deal)
        return 1

    def _voucher_bits(self, escrow: Escrow, tx_hash: str) -> list[int]:
        """Return the task bitmap of the voucher a `redeemVoucher` transaction carried."""
        tx = escrow.tx.w3.eth.get_transaction(tx_hash)  # type: ignore[arg-type]
        try:
            _fn, params = escrow.contract.decode_function_input(tx["input"])
        except ValueError:  # redeemed through another contract: the count is unknown
            return []
        voucher = params.get("voucher")
        if voucher is None:
            return []
        tasks = voucher["tasks"] if isinstance(voucher, dict) else voucher[2]
        return [int(w) for w in tasks]


def _hex(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    text = str(value)
    return text if text.startswith("0x") else "0x" + text


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return str(value)
    return value
