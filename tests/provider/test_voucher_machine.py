"""The daemon's budget rule as a hypothesis machine: a client crafting tasks and vouchers in any
order, and a stranger signing for it, never leave a delivered task unpaid.

The property, on a real daemon and anvil: whatever the client and a third party send, in any
order, once the client goes silent and the provider settles alone (redeem, claim, finalize),
the provider has been paid at least the price of every task it delivered, and at most that plus
the tip of a voucher the client itself signed; the deal keeps nothing pending, and the client
got back the rest of its cap. Each example opens its own deal on the module's chain and daemon.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from contracts.messages import Receipt, Voucher, address_of, task_bitmap
from provider.daemon import Daemon
from tests.provider.daemon_support import (
    CHALLENGE_WINDOW,
    ChainWorld,
    sign_task,
    tiny_mlp_envelope,
)

PRICE = 500
EXAMPLES = int(os.environ.get("PROVIDER_VOUCHER_EXAMPLES", "15"))
STEPS = int(os.environ.get("PROVIDER_VOUCHER_STEPS", "12"))

# Every refusal the daemon may answer to a task or a voucher in this game; anything else (a 5xx,
# an unknown code) fails the machine.
TASK_REFUSALS = {"insufficient_budget"}
STRANGER_REFUSALS = {"signature_invalid"}
REPLAY_REFUSALS = {"task_index_used", "insufficient_budget"}


def test_any_sequence_of_tasks_and_vouchers_pays_every_delivered_task(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon
) -> None:
    world = chain_world
    envelope = tiny_mlp_envelope()[0]
    provider = address_of(world.provider)
    codes: dict[str, int] = {}

    class Deal(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.cap = 0
            self.deal_id = 0
            self.next_index = 0
            self.delivered: dict[int, int] = {}  # task index -> price on its receipt
            self.tips: list[int] = []  # tips of the client's vouchers the daemon took

        def opened(self) -> bool:
            return self.deal_id != 0

        @precondition(lambda self: not self.opened())
        @rule(tasks=st.integers(min_value=1, max_value=4))
        def open(self, tasks: int) -> None:
            self.cap = tasks * PRICE + PRICE // 2  # room for a modest tip, never a whole task
            self.deal_id = world.open_deal(max_spend=self.cap)
            self.balance_before = world.escrow.balance_of(provider)

        @precondition(lambda self: self.opened())
        @rule(replay=st.booleans(), stranger=st.booleans())
        def task(self, replay: bool, stranger: bool) -> None:
            index = self.next_index - 1 if replay and self.next_index else self.next_index
            signer = world.other_client if stranger else world.client
            signed = sign_task(world, signer, self.deal_id, index, envelope, max_price=PRICE)
            answer = api.post(
                "/v1/tasks", content=signed.body, headers=signed.headers(), params={"wait": 60}
            )
            body = answer.json()
            if answer.status_code == 200 and body.get("state") == "succeeded":
                assert not stranger, body  # a stranger's request never runs on this deal
                receipt = Receipt.from_json(body["receipt"])
                if index in self.delivered:  # the same signed request again: the same answer
                    assert body["created"] is False and receipt.amount == self.delivered[index]
                    return
                self.delivered[index] = receipt.amount
                codes["task_delivered"] = codes.get("task_delivered", 0) + 1
                self.next_index = index + 1
                return
            if answer.status_code == 200 and body.get("created") is False:
                # The same signed request again: its ack alone, never the result (a repeat can
                # come from anyone who read the request in a claim's calldata).
                assert not stranger and index in self.delivered, body
                assert body["state"] == "acked" and "receipt" not in body, body
                codes["replay_ack_only"] = codes.get("replay_ack_only", 0) + 1
                return
            assert answer.status_code < 500, answer.text
            code = body.get("error", body.get("state"))
            codes[str(code)] = codes.get(str(code), 0) + 1
            expected = (
                STRANGER_REFUSALS if stranger else REPLAY_REFUSALS if replay else TASK_REFUSALS
            )
            assert code in expected, answer.text

        @precondition(lambda self: self.opened())
        @rule(
            data=st.data(),
            tip=st.sampled_from([-1, 0, 0, 1, 150, 300, PRICE, 10**6]),
            stranger=st.booleans(),
            unknown=st.booleans(),
        )
        def voucher(self, data: Any, tip: int, stranger: bool, unknown: bool) -> None:
            delivered = sorted(self.delivered)
            chosen = (
                data.draw(st.lists(st.sampled_from(delivered), unique=True)) if delivered else []
            )
            indices = [*chosen, self.next_index + 3] if unknown else chosen
            amount = sum(self.delivered.get(i, PRICE) for i in indices) + tip
            if amount <= 0 or not indices:
                return
            voucher = Voucher(self.deal_id, amount, task_bitmap(indices))
            signer = world.other_client if stranger else world.client
            answer = api.post(
                "/v1/vouchers",
                json={
                    "voucher": voucher.to_json(),
                    "signature": "0x" + voucher.sign(world.domain, signer).hex(),
                },
            )
            assert answer.status_code < 500, answer.text
            if answer.status_code == 200:
                assert not stranger and not unknown, (voucher, answer.text)
                self.tips.append(tip)
                codes["voucher_taken"] = codes.get("voucher_taken", 0) + 1
            else:
                code = answer.json().get("error")
                codes[str(code)] = codes.get(str(code), 0) + 1
                if stranger:
                    assert code == "signature_invalid", answer.text

        @invariant()
        def cap_covers_what_was_delivered(self) -> None:
            # Seen from outside: the daemon never delivers more than the cap can pay for.
            if self.opened():
                assert sum(self.delivered.values()) <= self.cap

        def teardown(self) -> None:
            if not self.opened():
                return
            # The client goes silent: the provider settles alone, then the window passes.
            daemon.jobs.settle_due(force=True, deals=[self.deal_id])
            world.anvil.increase_time(CHALLENGE_WINDOW + 1)
            daemon.jobs.finalize_claims(deals=[self.deal_id])
            deal = world.escrow.get_deal(self.deal_id)
            gained = world.escrow.balance_of(provider) - self.balance_before
            owed = sum(self.delivered.values())
            assert deal.pending == 0, deal
            assert gained >= owed, (gained, owed, self.delivered, self.tips)
            assert gained <= owed + max([0, *self.tips]), (gained, owed, self.tips)

    Deal.TestCase.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # real chain and daemon: no replay of shrinks
        suppress_health_check=list(HealthCheck),
    )
    Deal.TestCase().runTest()
    print("refusals seen:", codes)
