"""The discover job: journal every deal opened with this provider, so deals without tasks close
too; and the check that the config can settle every deal still to settle."""

from __future__ import annotations

import logging
from typing import Final

from provider.lifecycle import SettlementAction
from provider.settlement.context import SettlementContext

log = logging.getLogger("provider.settlement")

DEAL_SCAN_CURSOR: Final = "deal_scan_block"
"""Journal meta key: the last block whose ``DealOpened`` logs were scanned."""
SCAN_CHUNK: Final = 10_000
"""Blocks per ``eth_getLogs`` call."""


class DealDiscovery:
    """Find this provider's deals on chain and check their windows against the config."""

    def __init__(self, ctx: SettlementContext) -> None:
        """Work through ``ctx``."""
        self.ctx = ctx

    def discover_deals(self) -> list[int]:
        """Journal every deal opened with this provider since the last scan; return them.

        Reads ``DealOpened`` logs filtered by the provider topic, from the journal's cursor
        (``settlement.start_block`` at first) to the latest block.
        """
        ctx = self.ctx
        with ctx.lock:
            w3 = ctx.escrow.tx.w3
            stored = ctx.journal.meta(DEAL_SCAN_CURSOR)
            start = ctx.config.start_block if stored is None else int(stored) + 1
            latest = int(w3.eth.block_number)
            topic = ctx.escrow.contract.events.DealOpened.topic
            provider_topic = "0x" + bytes.fromhex(ctx.address[2:]).rjust(32, b"\0").hex()
            found = []
            while start <= latest:
                end = min(latest, start + SCAN_CHUNK - 1)
                logs = w3.eth.get_logs(
                    {
                        "address": ctx.escrow.address,
                        "fromBlock": start,
                        "toBlock": end,
                        "topics": [topic, None, None, provider_topic],
                    }
                )
                for log_entry, event in zip(logs, ctx.escrow.decode_events(logs), strict=True):
                    deal_id = int(event.args["dealId"])
                    book = ctx.journal.deal(deal_id)
                    if book is not None and book.opened() is not None:
                        continue
                    ctx.record(
                        deal_id,
                        SettlementAction.OPENED,
                        {
                            "client": str(event.args["client"]),
                            "expiry": int(event.args["expiry"]),
                            "challenge_window": int(event.args["challengeWindow"]),
                            "max_spend": str(int(event.args["maxSpend"])),
                            "stake": str(int(event.args["stake"])),
                            "block": int(log_entry["blockNumber"]),
                        },
                        "0x" + bytes(log_entry["transactionHash"]).hex(),
                    )
                    found.append(deal_id)
                ctx.journal.set_meta(DEAL_SCAN_CURSOR, str(end))
                start = end + 1
        if found:
            log.info("deals discovered on chain", extra={"deals": found})
        return found

    def window_problems(self) -> list[str]:
        """Return why this config cannot settle some deal it still has to settle (empty: none).

        A deal whose last settlement instant (``expiry + challengeWindow``) has passed needs
        nothing more from the jobs' timing and is not checked.
        """
        ctx = self.ctx
        chain_now = ctx.clock.chain_now()
        problems = []
        for deal_id, book in ctx.books():
            opened = book.opened()
            if opened is not None:
                window, expiry = int(opened["challenge_window"]), int(opened["expiry"])
            else:
                state = ctx.state(deal_id)
                if state is None:
                    continue
                window, expiry = state.challenge_window, state.expiry
            if chain_now > expiry + window:
                continue
            problem = ctx.config.window_problem(window)
            if problem is not None:
                problems.append(f"deal {deal_id}: {problem}")
        return problems
