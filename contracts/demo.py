"""The settlement scenario end to end on a fresh anvil: what `make demo` runs for now.

A provider stakes and signs a quote; a client opens a deal, sends tasks, verifies each receipt
and pays with cumulative vouchers that the provider redeems in one transaction; one task
breaches its deadline and is refunded with the penalty; the client then goes silent and the
provider claims its last receipts, paid after the challenge window; the deal closes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from contracts.binding import Chain, Escrow
from contracts.chain import Anvil
from contracts.messages import (
    KIND_COMPILE,
    KIND_INFERENCE,
    STATUS_SUCCESS,
    ZERO_ADDRESS,
    ZERO_HASH,
    Ack,
    Quote,
    Receipt,
    TaskRequest,
    Voucher,
    address_of,
    task_bitmap,
    verify,
)
from contracts.pricing import outcome_based, price_receipt, with_cache_discount

UNIT = 10**6  # one token
PLAN = with_cache_discount(outcome_based(compile_price=50_000, inference_price=2_000), 5_000)
CHALLENGE_WINDOW = 30


def run(*, tasks: int = 24, quiet: bool = False) -> dict[str, int]:
    """Run the scenario; return its summary."""

    def say(line: str) -> None:
        if not quiet:
            print(line, flush=True)

    with Anvil.start() as anvil:
        chain = Chain(anvil.url)
        deployer, client, provider, arbiter = anvil.keys[:4]
        deployment = chain.deploy(deployer)
        escrow, token = chain.escrow(deployment.escrow), chain.token(deployment.token)
        say(f"chain {anvil.url}: token {deployment.token}, escrow {deployment.escrow}")
        for key in (client, provider):
            token.mint(deployer, address_of(key), 1_000 * UNIT)
            token.approve(key, escrow.address, 2**256 - 1)
        escrow.deposit(client, 100 * UNIT)
        escrow.stake(provider, 20 * UNIT)
        say("client deposited 100.00, provider staked 20.00")

        now = int(chain.w3.eth.get_block("latest")["timestamp"])
        quote = Quote(
            provider=address_of(provider),
            client=ZERO_ADDRESS,
            arbiter=address_of(arbiter),
            max_spend=50 * UNIT,
            stake=5 * UNIT,
            penalty=1 * UNIT,
            duration=3_600,
            challenge_window=CHALLENGE_WINDOW,
            slo_ms=2_000,
            valid_until=now + 600,
            nonce=1,
            plan=PLAN,
        )
        opened = escrow.open_deal(client, quote, quote.sign(escrow.domain, provider), 10 * UNIT)
        deal = int(opened.event("DealOpened").args["dealId"])
        say(f"deal {deal} opened: cap 10.00, stake 5.00, penalty 1.00 per breach")

        receipts: list[tuple[Receipt, bytes]] = []
        breached: tuple[Ack, bytes] | None = None
        prev = ZERO_HASH
        for index in range(tasks):
            kind = KIND_COMPILE if index % 4 == 0 else KIND_INFERENCE
            request = TaskRequest(deal, index, kind, os.urandom(32), os.urandom(32), 60_000)
            request_sig = request.sign(escrow.domain, client)
            verify(request, escrow.domain, request_sig, address_of(client))  # provider checks
            now = int(chain.w3.eth.get_block("latest")["timestamp"])
            ack = Ack(
                deal,
                index,
                request.struct_hash(),
                now + 2,
                price_receipt(PLAN, _usage(deal, index, kind)),
            )
            ack_sig = ack.sign(escrow.domain, provider)
            if index == 7:  # the provider never delivers this one
                breached = (ack, ack_sig)
                continue
            draft = replace(
                _usage(deal, index, kind, failed=index == 12, cache_hit=index == 16),
                program_hash=request.program_hash,
                input_hash=request.input_hash,
                started_at=now,
                finished_at=now + 1,
                deadline=ack.deadline,
                prev_receipt_hash=prev,
            )
            receipt = replace(draft, amount=price_receipt(PLAN, draft))
            sig = receipt.sign(escrow.domain, provider)
            verify(receipt, escrow.domain, sig, address_of(provider))  # client checks
            assert receipt.amount == price_receipt(PLAN, receipt)
            receipts.append((receipt, sig))
            prev = receipt.struct_hash()
        vouched = receipts[:-5]
        silent = receipts[-5:]
        voucher = Voucher(
            deal, sum(r.amount for r, _ in vouched), task_bitmap(r.task_index for r, _ in vouched)
        )
        redeemed = escrow.redeem_voucher(provider, voucher, voucher.sign(escrow.domain, client))
        say(
            f"{len(vouched)} verified tasks paid by one voucher: "
            f"{voucher.cumulative_amount / UNIT:.4f} tokens, {redeemed.gas_used:,} gas "
            f"({redeemed.gas_used // len(vouched):,} per task)"
        )

        assert breached is not None
        anvil.increase_time(2 + CHALLENGE_WINDOW + 1)
        refund = escrow.refund_breach(client, *breached)
        refunded = refund.event("BreachRefunded").args
        say(
            f"task 7 missed its deadline: refunded {refunded['refund'] / UNIT:.4f} "
            f"+ penalty {refunded['penalty'] / UNIT:.2f}"
        )

        claim = escrow.claim_receipts(
            provider, deal, PLAN, [r for r, _ in silent], [s for _, s in silent]
        )
        batch = int(claim.event("ReceiptsClaimed").args["batchId"])
        anvil.increase_time(CHALLENGE_WINDOW + 1)
        escrow.finalize_claim(provider, deal, batch)
        claimed = sum(r.amount for r, _ in silent)
        say(
            f"client went silent: provider claimed {len(silent)} receipts "
            f"({claimed / UNIT:.4f}), paid after the window"
        )

        escrow.close_deal(client, deal)
        closed = escrow.close_deal(provider, deal).event("DealClosed").args
        say(
            f"deal closed: {closed['returnedToClient'] / UNIT:.4f} back to the client, "
            f"stake {closed['stakeReturned'] / UNIT:.2f} back"
        )
        _check_conservation(escrow, token.balance_of(escrow.address), [client, provider])
        paid_tasks = len(vouched) + len(silent)
        return {
            "tasks_run": tasks,
            "tasks_paid": paid_tasks,
            "tasks_refunded": 1,
            "total_spent": voucher.cumulative_amount + claimed,
            "gas_per_paid_task": (redeemed.gas_used + claim.gas_used) // paid_tasks,
        }


def _usage(
    deal: int, index: int, kind: int, *, failed: bool = False, cache_hit: bool = False
) -> Receipt:
    status = 6 if failed else STATUS_SUCCESS
    compile_ms = 120 if kind == KIND_COMPILE else 0
    return Receipt(
        deal, index, kind, status, cache_hit, 35, compile_ms,
        ZERO_HASH, ZERO_HASH, os.urandom(32), 0, 0, 0, 0, ZERO_HASH,
    )  # fmt: skip


def _check_conservation(escrow: Escrow, held: int, keys: list[str]) -> None:
    free = sum(escrow.balance_of(address_of(k)) + escrow.stake_of(address_of(k)) for k in keys)
    if held != free:
        raise AssertionError(f"escrow holds {held} but accounts sum to {free}")


def main(argv: list[str] | None = None) -> int:
    """Run the scenario from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    parser.add_argument("--tasks", type=int, default=24)
    args = parser.parse_args(argv)
    summary = run(tasks=args.tasks, quiet=False)
    for key, value in summary.items():
        print(f"{key:>18}: {value:,}")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
