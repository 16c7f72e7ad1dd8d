"""Gas of the escrow's hot paths on a fresh anvil; the last line printed is one JSON object."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts.binding import Chain, Escrow
from contracts.chain import Anvil
from contracts.messages import (
    KIND_INFERENCE,
    STATUS_SUCCESS,
    ZERO_HASH,
    Ack,
    Claim,
    Plan,
    Quote,
    Receipt,
    Voucher,
    address_of,
    task_bitmap,
)
from contracts.pricing import price_receipt

PLAN = Plan(inference_price=500, price_per_device_ms=2)
SNAPSHOT = Path(__file__).resolve().parent.parent / "contracts" / "gas-snapshot.json"
"""The committed figures; tests/contracts/test_gas_snapshot.py compares a fresh run with them.
After an intended change of the contract's costs: `scripts/bench-gas --snapshot`."""


def main() -> None:
    with Anvil.start() as anvil:
        chain = Chain(anvil.url)
        deployer, client, provider, arbiter = anvil.keys[:4]
        deployment = chain.deploy(deployer)
        escrow, token = chain.escrow(deployment.escrow), chain.token(deployment.token)
        for key in (client, provider):
            token.mint(deployer, address_of(key), 10**15)
            token.approve(key, escrow.address, 2**256 - 1)
        gas: dict[str, int] = {"deploy": deployment.escrow_gas}
        gas["deposit"] = escrow.deposit(client, 10**13).gas_used
        escrow.stake(provider, 10**12)
        nonce = iter(range(1, 10**6))

        def open_deal() -> tuple[int, int]:
            now = int(chain.w3.eth.get_block("latest")["timestamp"])
            quote = Quote(
                provider=address_of(provider),
                client=address_of(client),
                arbiter=address_of(arbiter),
                max_spend=10**10,
                stake=10**6,
                penalty=10**4,
                duration=3_600,
                challenge_window=60,
                slo_ms=1_000,
                valid_until=now + 600,
                nonce=next(nonce),
                plan=PLAN,
            )
            result = escrow.open_deal(client, quote, quote.sign(escrow.domain, provider), 10**9)
            return int(result.event("DealOpened").args["dealId"]), result.gas_used

        deal, gas["open_deal"] = open_deal()
        for n in (1, 10, 100):
            deal_n, _ = open_deal()
            gas[f"coop_gas_per_task_{n}"] = (
                _redeem(escrow, client, provider, deal_n, n * 500, range(n)) // n
            )
        _redeem(escrow, client, provider, deal, 500, range(1))
        gas["redeem_voucher"] = _redeem(escrow, client, provider, deal, 1_000, range(2))
        for n in (1, 100):
            deal_n, _ = open_deal()
            gas[f"claim_gas_per_task_{n}"] = _claim(escrow, chain, client, provider, deal_n, n) // n
        now = int(chain.w3.eth.get_block("latest")["timestamp"])
        request = _receipt(deal, 50, now + 5, ZERO_HASH).request(max_price=1_000)
        ack = Ack(deal, 50, request.struct_hash(), 500)
        anvil.increase_time(5 + 60 + 1)
        gas["refund_breach"] = escrow.refund_breach(
            client, request, ack, ack.sign(escrow.domain, provider)
        ).gas_used
        escrow.close_deal(client, deal)
        gas["close_deal"] = escrow.close_deal(provider, deal).gas_used
    keys = [
        "deploy", "deposit", "open_deal", "redeem_voucher",
        "coop_gas_per_task_1", "coop_gas_per_task_10", "coop_gas_per_task_100",
        "claim_gas_per_task_1", "claim_gas_per_task_100", "refund_breach", "close_deal",
    ]  # fmt: skip
    for key in keys:
        print(f"{key:>24}: {gas[key]:>9,} gas", file=sys.stderr)
    figures = {key: gas[key] for key in keys}
    if "--snapshot" in sys.argv[1:]:
        SNAPSHOT.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {SNAPSHOT}", file=sys.stderr)
    print(json.dumps(figures))


def _redeem(
    escrow: Escrow, client: str, provider: str, deal: int, amount: int, tasks: range
) -> int:
    voucher = Voucher(deal, amount, task_bitmap(tasks))
    return escrow.redeem_voucher(provider, voucher, voucher.sign(escrow.domain, client)).gas_used


def _receipt(deal: int, index: int, deadline: int, prev: bytes) -> Receipt:
    draft = Receipt(
        deal, index, KIND_INFERENCE, STATUS_SUCCESS, False, 40, 0,
        os.urandom(32), os.urandom(32), os.urandom(32),
        deadline - 99, deadline - 98, deadline, 0, prev,
    )  # fmt: skip
    return replace(draft, amount=price_receipt(PLAN, draft))


def _claim(escrow: Escrow, chain: Chain, client: str, provider: str, deal: int, n: int) -> int:
    """Claim `n` receipts in one batch, each with the client's signature over its request."""
    now = int(chain.w3.eth.get_block("latest")["timestamp"])
    claims, prev = [], ZERO_HASH
    for i in range(n):
        receipt = _receipt(deal, i, now + 100, prev)
        request = receipt.request(max_price=1_000)
        claims.append(Claim(receipt, request.max_price, request.sign(escrow.domain, client)))
        prev = receipt.struct_hash()
    return escrow.claim_receipts(provider, deal, PLAN, claims).gas_used


if __name__ == "__main__":
    main()
