"""`make demo` end to end, once: its JSON figures add up and equal what the chain holds.

Every provider that delivered is paid by the client's vouchers, one per verified delivery, while
the late task is still awaited; the late task is refunded; no provider claims anything (the
demo's client never stops paying); each deal's cap = vouchers + claims + fee + refunds + what its
close returned.

The demo runs through the README's own command, `make demo ARGS="--json ..."` (anvil, the
market, two provider daemons, the client), against an anvil this test starts, so the chain
outlives the demo and can be audited afterwards. The README's Quickstart must list exactly
the two commands (`make demo`, `make test`) that this test and the suite itself run.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from client.demo import CLIENT_FUNDS
from client.demo.terms import CHALLENGE_WINDOW
from contracts.binding import DEAL_CLOSED, TASK_NONE, TASK_REFUNDED, TASK_VOUCHED, Chain, Escrow
from contracts.chain import Anvil, dev_keys
from contracts.messages import address_of
from contracts.states import TASK_CLAIMED
from contracts.transactor import Event

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "tasks_run",
    "tasks_paid",
    "tasks_refunded",
    "failures_diagnosed",
    "total_spent",
    "gas_per_paid_task",
}

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("silero_vad") is None or importlib.util.find_spec("onnx") is None,
        reason="the demo's model needs silero-vad and onnx (make setup installs them)",
    ),
    pytest.mark.skipif(shutil.which("make") is None, reason="the README's commands need make"),
]


@dataclass(frozen=True)
class DemoRun:
    """One finished demo: its output, figures and the chain it settled on."""

    stdout: str
    figures: dict[str, int]
    escrow: Escrow
    urls: list[str]


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoRun]:
    with Anvil.start(accounts=6) as anvil:
        done = subprocess.run(
            ["make", "--no-print-directory", "demo", f"ARGS=--json --rpc-url {anvil.url}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        lines = done.stdout.strip().splitlines()
        escrow = re.search(r"^escrow\s+(0x[0-9a-fA-F]{40})\b", done.stdout, re.MULTILINE)
        assert escrow is not None, done.stdout
        urls = re.findall(
            r"^(?:market|provider)\s+(?:\w+\s+)?(http://127\.0\.0\.1:\d+)",
            done.stdout,
            re.MULTILINE,
        )
        yield DemoRun(
            stdout=done.stdout,
            figures=json.loads(lines[-1]),
            escrow=Chain(anvil.url).escrow(escrow.group(1)),
            urls=urls,
        )


def test_demo_ends_with_one_json_line_of_the_six_figures(demo: DemoRun) -> None:
    assert set(demo.figures) == KEYS
    assert all(isinstance(v, int) and v >= 0 for v in demo.figures.values())


def test_demo_tasks_are_each_paid_refunded_or_diagnosed(demo: DemoRun) -> None:
    f = demo.figures
    assert f["tasks_paid"] + f["tasks_refunded"] + f["failures_diagnosed"] == f["tasks_run"]
    assert f["tasks_paid"] >= 1 and f["tasks_refunded"] >= 1 and f["failures_diagnosed"] >= 1
    assert f["gas_per_paid_task"] > 0
    assert "oom" in demo.stdout and "refunded" in demo.stdout


def test_demo_figures_equal_the_chain(demo: DemoRun) -> None:
    escrow, f = demo.escrow, demo.figures
    deal_ids = range(1, escrow.deal_count() + 1)
    deals = [escrow.get_deal(d) for d in deal_ids]
    assert deals and all(d.status == DEAL_CLOSED for d in deals)
    events = _events(escrow)
    claimed = [e for e in events if e.name == "ClaimFinalized"]
    fees = [e for e in events if e.name == "ReservationFeePaid"]
    assert (
        sum(d.vouched for d in deals)
        + sum(e.args["amount"] for e in claimed)
        + sum(e.args["fee"] for e in fees)
        == f["total_spent"]
    )

    statuses = []
    for deal_id in deal_ids:
        index = 0
        while (status := escrow.task_status(deal_id, index)) != TASK_NONE:
            statuses.append(status)
            index += 1
    assert statuses.count(TASK_REFUNDED) == f["tasks_refunded"]
    # Every delivered task (a diagnosed failure too, at 0) is paid by the client's voucher: the
    # client vouches as each delivery is verified, and never stops paying, so no provider has
    # anything to claim.
    assert statuses.count(TASK_VOUCHED) == f["tasks_paid"] + f["failures_diagnosed"]
    assert statuses.count(TASK_CLAIMED) == 0
    assert [e for e in events if e.name in ("ReceiptsClaimed", "ClaimFinalized")] == []
    assert len(statuses) == f["tasks_run"]

    refunds = [e for e in events if e.name == "BreachRefunded"]
    assert len(refunds) == f["tasks_refunded"]
    penalties = sum(int(e.args["penalty"]) for e in refunds)
    client = address_of(dev_keys(2)[1])
    w3 = escrow.tx.w3
    token = Chain(w3.provider.endpoint_uri).token(escrow.token())  # type: ignore[attr-defined]
    held = token.balance_of(client) + escrow.balance_of(client)
    assert held == CLIENT_FUNDS - f["total_spent"] + penalties


def test_demo_each_deal_adds_up_on_chain(demo: DemoRun) -> None:
    escrow = demo.escrow
    events = _events(escrow)
    for deal_id in range(1, escrow.deal_count() + 1):
        deal = escrow.get_deal(deal_id)
        mine = [e for e in events if int(e.args.get("dealId", -1)) == deal_id]

        def total(name: str, key: str, mine: list[Event] = mine) -> int:
            return sum(int(e.args[key]) for e in mine if e.name == name)

        assert total("VoucherRedeemed", "paid") == deal.vouched
        spent = (
            deal.vouched + total("ClaimFinalized", "amount") + total("ReservationFeePaid", "fee")
        )
        refunded = total("BreachRefunded", "refund")
        returned = total("DealClosed", "returnedToClient")
        assert spent + refunded + returned == deal.max_spend, deal_id


def test_demo_vouches_for_every_provider_as_its_deliveries_are_verified(demo: DemoRun) -> None:
    escrow, lines = demo.escrow, demo.stdout.splitlines()
    events = _events(escrow)
    deal_of: dict[str, int] = {}
    for line in lines:
        match = re.match(r"match\s+\S+: \d+ units from (\w+) at \S+ -> deal (\d+) ", line)
        if match:
            deal_of[match.group(1)] = int(match.group(2))
    assert set(deal_of) == {"alpha", "beta"}

    def verified(name: str, line: str) -> bool:
        return re.match(rf"task\s+{name} #\d+: verified, ", line) is not None

    delivered = {name for name in deal_of if any(verified(name, line) for line in lines)}
    assert "alpha" in delivered  # its SLO is 120 s: all it runs is delivered in time

    for name, deal_id in deal_of.items():
        voucher_line = rf"voucher\s+deal {deal_id} \({name}\): (\S+) in all for (\d+) verified"
        vouchers = [
            (round(float(m.group(1)) * 10**6), int(m.group(2)))
            for line in lines
            if (m := re.match(voucher_line, line))
        ]
        redeemed = [
            e for e in events if e.name == "VoucherRedeemed" and e.args["dealId"] == deal_id
        ]
        if name not in delivered:
            assert vouchers == [] and redeemed == []
            continue
        # Pay per task: each verified delivery's progress line is followed by the deal's next
        # cumulative voucher, handed to the provider while its other tasks are still awaited.
        # (One signed just before may cover it already: a delivery enters the voucher book as
        # soon as it is verified, its line comes after; then the line says so.)
        for i, line in enumerate(lines):
            if verified(name, line):
                index = line.split("#", 1)[1].split(":", 1)[0]
                pays = (
                    rf"{voucher_line}|voucher\s+deal {deal_id} \({name}\): #{index} is in the last"
                )
                assert re.match(pays, lines[i + 1]), lines[i : i + 2]
        assert vouchers == sorted(set(vouchers))  # cumulative: amounts and tasks only grow
        assert redeemed, f"no voucher of {name} was redeemed"
        vouched = escrow.get_deal(deal_id).vouched
        assert vouchers[-1][0] == vouched
        said = [
            m for line in lines if (m := re.match(rf"redeemed\s+deal {deal_id} .*\((\d+) ", line))
        ]
        assert [int(m.group(1)) for m in said] == [len(redeemed)]
        # Vouched while the late task was awaited, not after: before any refund or clock move.
        settling = next(i for i, line in enumerate(lines) if re.match(r"(clock|refunded) ", line))
        assert all(i < settling for i, line in enumerate(lines) if re.match(voucher_line, line)), (
            "a voucher came after the late task's wait"
        )
        # The printed settlement table says the same: paid by its vouchers, none by claims.
        row = rf"\s+{deal_id}\s+{name}\s+(\S+) \((\d+) redemptions?\)\s+none\s"
        match = next((m for line in lines if (m := re.match(row, line))), None)
        assert match is not None, f"no settlement row paid by vouchers for {name}"
        assert round(float(match.group(1)) * 10**6) == vouched
        assert int(match.group(2)) == len(redeemed)


def _events(escrow: Escrow) -> list[Event]:
    """Return the escrow's events in chain order."""
    w3 = escrow.tx.w3
    logs = w3.eth.get_logs({"address": escrow.address, "fromBlock": 0, "toBlock": "latest"})
    return list(escrow.decode_events(logs))


def test_demo_deals_open_with_per_fill_quotes_and_a_window_the_daemons_meet(
    demo: DemoRun,
) -> None:
    escrow = demo.escrow
    w3 = escrow.tx.w3
    logs = w3.eth.get_logs({"address": escrow.address, "fromBlock": 0, "toBlock": "latest"})
    opened = [e.args for e in escrow.decode_events(logs) if e.name == "DealOpened"]
    client = address_of(dev_keys(2)[1])
    assert len(opened) == 2
    assert escrow.min_challenge_window() == CHALLENGE_WINDOW == 10
    for args in opened:
        assert args["client"] == client  # each fill's quote named the client
        assert args["challengeWindow"] == CHALLENGE_WINDOW
    assert len({args["quoteHash"] for args in opened}) == 2


def test_demo_deals_are_closed_by_their_providers_after_the_clients_agreement(
    demo: DemoRun,
) -> None:
    escrow = demo.escrow
    w3 = escrow.tx.w3
    logs = w3.eth.get_logs({"address": escrow.address, "fromBlock": 0, "toBlock": "latest"})
    agreed: dict[int, list[str]] = {}
    closed_by: dict[int, str] = {}
    for log in logs:
        for event in escrow.decode_events([log]):
            deal_id = int(event.args.get("dealId", 0))
            if event.name == "CloseAgreed":
                agreed.setdefault(deal_id, []).append(str(event.args["party"]).lower())
            elif event.name == "DealClosed":
                sender = w3.eth.get_transaction(log["transactionHash"])["from"]
                closed_by[deal_id] = str(sender).lower()
    client = address_of(dev_keys(2)[1]).lower()
    for deal_id in range(1, escrow.deal_count() + 1):
        provider = escrow.get_deal(deal_id).provider.lower()
        assert agreed[deal_id] == [client, provider]  # the client first, then its provider
        assert closed_by[deal_id] == provider


def test_demo_stops_every_process_it_started(demo: DemoRun) -> None:
    assert len(demo.urls) == 3  # the market and two providers
    for url in demo.urls:
        with pytest.raises(httpx.TransportError):
            httpx.get(url, timeout=2)


def test_readme_quickstart_lists_exactly_make_demo_and_make_test() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the Quickstart has no sh block"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.MULTILINE)
    assert re.search(r"^test:", makefile, re.MULTILINE)
