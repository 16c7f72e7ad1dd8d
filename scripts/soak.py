"""Settlement soak: real processes, injected faults, every figure read back from the chain.

anvil, the market and two provider daemons run as processes (``tests/e2e/stack.py``); the
client opens one deal with each provider through the market (each deal opened with the quote
the provider's daemon signs for that fill) and runs its tasks with the CLI, ``tpumarket job
run``, as a subprocess, batch after batch, alternating deals. Faults are injected mid-run, once
the run has reported its first task:

- ``provider_kill``: the deal's daemon is killed with SIGKILL and started again;
- ``chain_freeze``: anvil is stopped (SIGSTOP) for ``--freeze-s`` seconds, then continued;
- ``client_kill``: the client run is killed with SIGKILL and stays down until the daemon has
  claimed every task it delivered on time (the client never vouched for them); every other
  kill (the first, the third, ...) is then looked at with ``tpumarket job status`` (as the
  CLI suggests: it records the claims in the client's ledger); then the same command runs
  again (it must resume, and pay none of them again);
- ``double_sigint``: the client run gets SIGINT, and SIGINT again once it says it stopped
  sending; the inputs it left open run again.

After a provider kill or a chain freeze, the inputs a run left open (not sent, or not known to
be acked or collected) run again too, as a user would.

At the end the harness waits (bounded by the tasks' settlement instants, in wall time) until
the daemons have put every task they delivered on time on chain, moves the chain's clock past
every settlement instant and claim window (``evm_setNextBlockTimestamp`` + ``evm_mine``), lets the
client refund its breaches (``tpumarket job refund``) and agree to close, lets the daemons
finalize and close, stops everything and audits (``tests/e2e/audit.py``): acked tasks from
the daemons' journals, money from the escrow's events and balances.

The last line of stdout is one JSON object: ``tasks_acked``, ``tasks_paid``,
``tasks_refunded``, ``tasks_lost``, ``tasks_paid_twice``, ``honest_provider_losses``,
``honest_client_losses``, ``invariant_ok``, ``inputs_paid_twice`` (inputs of a deal paid under
more than one task index, from the escrow's events and the requests the daemons journaled),
then durations, fault counts and details.

With ``--reorgs`` the chain mines a block each second and, while the workload and the
settlement run, reorgs of
1-5 blocks and dropped transactions are injected (``scripts/soak_chain_faults.py``); every
process counts a transaction done 6 blocks deep, and the JSON adds ``reorgs_injected`` and
``txs_dropped_resent`` (dropped transactions whose sender and nonce the chain holds at the end).

Usage: scripts/soak [--tasks N] [--batch N] [--freeze-s S] [--window S] [--rounds N]
                    [--faults F,...] [--reorgs] [--work-dir DIR]   (logs, journals kept there)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from contracts.errors import EscrowError  # noqa: E402
from contracts.messages import ZERO_ADDRESS  # noqa: E402
from contracts.pricing import flat  # noqa: E402
from programs.envelope import encode_arrays, encode_envelope  # noqa: E402
from scripts.soak_chain_faults import MAX_DEPTH, ChainFaults  # noqa: E402
from tests.e2e.audit import audit, read_chain, read_journal  # noqa: E402
from tests.e2e.stack import (  # noqa: E402
    UNIT,
    Provider,
    Stack,
    spin_inputs,
    spin_model,
    stack,
)
from tests.polling import poll_until  # noqa: E402

FAULTS = ("provider_kill", "chain_freeze", "client_kill", "double_sigint")
PLANS = {
    "p1": flat(compile_price=5_000, inference_price=1_000),
    "p2": flat(compile_price=2_500, inference_price=500),
}
SLO_MS = {"p1": 10_000, "p2": 3_000}
PENALTY = 1_000
DEPOSIT = 5 * UNIT
FAST_STEPS, MEDIUM_STEPS = 1_000, 10_000_000  # ~0 s and ~0.2 s of device time
LATE_STEPS = 400_000_000  # ~8 s: past p2's deadline (its SLO plus slack)
RUN_TIMEOUT_S = 600.0
JOURNAL = "journal.sqlite3"


def say(line: str) -> None:
    """Progress on stderr (stdout ends with the JSON line)."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# ---- the client's runs ---------------------------------------------------------------------


class ClientRun:
    """One ``tpumarket job ...`` subprocess; its stderr is logged and watched for progress."""

    def __init__(self, args: list[str], env: dict[str, str], log: IO[str]) -> None:
        self.progressed = threading.Event()
        self.interrupted = threading.Event()  # the CLI said it took a Ctrl-C
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "client.cli", "job", *args, "--json"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._log = log
        self._stdout: list[str] = []
        self._readers = [
            threading.Thread(target=self._read_stderr, daemon=True),
            threading.Thread(target=self._read_stdout, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self._log.write(line)
            self._log.flush()
            if line.startswith("tasks"):  # a task finished (the CLI's progress line)
                self.progressed.set()
            if line.startswith("interrupted"):
                self.interrupted.set()
        self.progressed.set()  # it exited: nothing more will come
        self.interrupted.set()

    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        self._stdout.append(self.popen.stdout.read())

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the run (the CLI process itself)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, sig)

    def finish(self, timeout_s: float = RUN_TIMEOUT_S) -> tuple[int, dict[str, Any] | None]:
        """Wait for the run; return its exit code and its JSON line (None if it printed none)."""
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait()
        for reader in self._readers:
            reader.join(30)
        stdout = "".join(self._stdout)
        self._log.write(f"-- exit {self.popen.returncode}\n{stdout[-4000:]}\n")
        self._log.flush()
        lines = stdout.strip().splitlines()
        figures = None
        if lines:
            with contextlib.suppress(ValueError):
                parsed = json.loads(lines[-1])
                figures = parsed if isinstance(parsed, dict) else None
        return self.popen.returncode, figures


@dataclass
class Deal:
    """One deal of the soak: its chain id, provider and the client's state folder."""

    chain_id: int
    provider: Provider
    state: Path


@dataclass
class Soak:
    """The run's settings, the world it runs in and what happened."""

    args: argparse.Namespace
    st: Stack
    work: Path
    deals: list[Deal] = field(default_factory=list)
    program: Path | None = None
    faults: Counter[str] = field(default_factory=Counter)
    runs: Counter[str] = field(default_factory=Counter)
    frozen_s: float = 0.0
    log: IO[str] | None = None

    def env(self) -> dict[str, str]:
        """Return the environment of the client's CLI runs."""
        return {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "TPUMARKET_RPC_URL": self.st.rpc_url,
            "TPUMARKET_ESCROW": self.st.escrow.address,
            "TPUMARKET_CLIENT_KEY": self.st.client,
            "TPUMARKET_CONFIRMATIONS": str(self.st.confirmations),
        }

    def start(self, deal: Deal, action: str, extra: list[str]) -> ClientRun:
        """Start ``tpumarket job ACTION`` on ``deal``."""
        assert self.log is not None
        args = [action, "--deal", str(deal.chain_id), "--provider-url", deal.provider.url]
        args += ["--state-dir", str(deal.state), *extra]
        self.log.write(f"== job {' '.join(args)}\n")
        self.runs[action] += 1
        return ClientRun(args, self.env(), self.log)


# ---- setting up ----------------------------------------------------------------------------


def open_deals(soak: Soak, quantity: int) -> None:
    """Post both providers' asks, bid for all their units, and open each deal it gets.

    Each ask carries the provider's signed terms (a quote naming no client); after the match
    each provider's daemon attaches a quote for that fill naming the client, which the client
    checks against the ask and opens on chain.
    """
    from client.accounts import ClientAccount, open_market_deal
    from client.market_http import MarketHttp
    from tests.e2e.stack import DEVICE_CLASS, bid, post_ask

    st = soak.st
    price = 2 * max(p.inference_price for p in PLANS.values())
    for provider in st.providers:
        terms = st.quote(
            provider,
            max_spend=price * quantity,
            penalty=PENALTY,
            window=soak.args.window,
            client=ZERO_ADDRESS,
        )
        post_ask(st, provider, terms, price=price, quantity=quantity)
    _, records = bid(
        st,
        price=price,
        quantity=quantity * len(st.providers),
        plan="flat",
        slo_ms=max(SLO_MS.values()),
    )
    assert st.market_url is not None
    market = MarketHttp(st.market_url)
    account = ClientAccount(st.escrow, st.token, st.client, min_challenge_window=soak.args.window)
    by_address = {p.address.lower(): p for p in st.providers}
    try:
        for record in records:
            opened = open_market_deal(market, account, str(record["deal_id"]))
            provider = by_address[str(record["provider"]).lower()]
            state = soak.work / "client" / provider.name
            soak.deals.append(Deal(opened.chain_deal_id, provider, state))
            say(
                f"deal {opened.chain_deal_id} opened with {provider.name} with its quote for "
                f"market deal {record['deal_id']} (cap {opened.max_spend}, {DEVICE_CLASS})"
            )
    finally:
        market.close()
    soak.deals.sort(key=lambda d: d.provider.name)


def write_inputs(soak: Soak) -> list[Path]:
    """Write the program and one inputs file per task (distinct inputs: seed = task number)."""
    model = spin_model()
    folder = soak.work / "inputs"
    folder.mkdir(parents=True, exist_ok=True)
    soak.program = folder / "spin.tpmp"
    soak.program.write_bytes(encode_envelope(model.example_envelope()))
    rng = random.Random(soak.args.seed)
    files = []
    # Every `period`-th task of p2 runs past its deadline (the first halfway into a period).
    period = max(1, round(1 / soak.args.late_fraction)) if soak.args.late_fraction > 0 else 0
    p2_tasks = 0
    for number in range(soak.args.tasks):
        deal = soak.deals[(number // soak.args.batch) % len(soak.deals)]
        steps = FAST_STEPS if rng.random() < 0.7 else MEDIUM_STEPS
        if deal.provider.name == "p2":
            if period and p2_tasks % period == period // 2:
                steps = LATE_STEPS
            p2_tasks += 1
        path = folder / f"task-{number:04d}.safetensors"
        path.write_bytes(encode_arrays(spin_inputs(model, steps, number + 1)))
        files.append(path)
    return files


# ---- the workload and its faults -----------------------------------------------------------


def schedule(batches: int, faults: list[str], rounds: int) -> dict[int, str]:
    """Spread ``rounds`` of each fault over the batches (none in the first).

    Batches alternate deals, so each round is shifted by one batch from the last: with an
    even spacing, round 0 hits one provider's deal and round 1 the other's.
    """
    planned = [f for _ in range(rounds) for f in faults]
    if not planned or batches < 2:
        return {}
    step = max(1, (batches - 1) // len(planned))
    out: dict[int, str] = {}
    for i, fault in enumerate(planned):
        at = 1 + i * step + (i // len(faults) if step % 2 == 0 else 0)
        if at < batches and at not in out:
            out[at] = fault
    return out


RETRY_STATES = frozenset({"unknown", "pending", "not sent", "error"})
"""Task states of a run's JSON after which the same inputs run again: not sent, or not known
to be acked or collected (a rerun resumes those by their inputs, re-sending the same signed
request)."""


def open_inputs(files: list[Path], figures: dict[str, Any] | None) -> list[Path]:
    """Return the inputs a run left open: every one if it printed no table (killed, or stopped
    by a second Ctrl-C: a rerun resumes what it left), else those whose task is in
    ``RETRY_STATES`` or missing from its table."""
    if figures is None or "tasks" not in figures:
        return list(files)
    states = {
        str(t.get("task", "")).rsplit(" ", 1)[-1]: str(t.get("state")) for t in figures["tasks"]
    }
    return [f for f in files if states.get(f.name, "not sent") in RETRY_STATES]


def run_batch(soak: Soak, number: int, deal: Deal, files: list[Path], fault: str | None) -> None:
    """Run one batch with the CLI; inject ``fault`` once the run reports its first task.

    After a run killed -9, the same command runs again (it must resume its tasks, not pay for
    them again). After any other run, the inputs it left open (not sent, or not known to be
    acked or collected: a provider down, a second Ctrl-C) run again, as a user would.
    """
    assert soak.program is not None

    def start(inputs: list[Path]) -> ClientRun:
        extra = ["--program", str(soak.program), "--inputs", *map(str, inputs)]
        return soak.start(deal, "run", [*extra, "--concurrency", str(soak.args.concurrency)])

    run = start(files)
    killed = False
    if fault is not None:
        run.progressed.wait(120)
        if run.popen.poll() is not None:
            say(f"batch {number}: the run ended before {fault} could be injected")
        else:
            killed = inject(soak, fault, run, deal)
    code, figures = run.finish()
    paid = int((figures or {}).get("summary", {}).get("tasks_paid", 0))
    left = list(files) if killed else open_inputs(files, figures)
    expected = fault in ("client_kill", "double_sigint")  # the exit is the fault's
    for attempt in range(4):
        if code != 0 and not expected:
            soak.runs["failed"] += 1
        if not left:
            break
        if attempt == 3:
            raise SystemExit(f"batch {number}: inputs still open after 3 reruns: {left}")
        say(f"batch {number}: {len(left)} input(s) open after a run that exited {code}: run again")
        soak.runs["rerun"] += 1
        code, figures = start(left).finish()
        paid += int((figures or {}).get("summary", {}).get("tasks_paid", 0))
        left, killed, expected = open_inputs(left, figures), False, False
    summary = (figures or {}).get("summary", {})
    say(
        f"batch {number} on deal {deal.chain_id} ({deal.provider.name}): {len(files)} tasks"
        + (f", fault {fault}" if fault else "")
        + f"; paid {paid}, voucher total {summary.get('voucher_total', '?')}"
    )


def inject(soak: Soak, fault: str, run: ClientRun, deal: Deal) -> bool:
    """Inject one fault into a running batch; return whether the client run was killed."""
    soak.faults[fault] += 1
    if fault == "provider_kill":
        started = time.monotonic()
        deal.provider.process.kill9()
        deal.provider.restart()
        say(f"  {deal.provider.name} killed -9 and back in {time.monotonic() - started:.1f} s")
        return False
    if fault == "chain_freeze":
        pid = soak.st.anvil.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(soak.args.freeze_s)  # the fault itself: the chain answers nothing
        finally:
            os.kill(pid, signal.SIGCONT)
        soak.frozen_s += soak.args.freeze_s
        say(f"  anvil stopped for {soak.args.freeze_s:.0f} s, continued")
        return False
    if fault == "client_kill":
        run.signal(signal.SIGKILL)
        # The client stays down until the daemon has put on chain, by claims, every task it
        # delivered on time (settleBy - margin at the latest): the rerun must then pay none
        # of them again.
        started = time.monotonic()
        pending, latest, _ = settled_on_time(soak, [deal])
        budget = max(0.0, latest - time.time()) + 10
        settled = poll_until(lambda: settled_on_time(soak, [deal])[0] == 0, budget)
        looked = ""
        if soak.faults[fault] % 2 == 1:  # the user looks first, as the CLI suggests
            soak.faults["status_between"] += 1
            code, _ = soak.start(deal, "status", []).finish()
            looked = f"; `job status` between (exit {code})"
        say(
            f"  client killed -9; down {time.monotonic() - started:.0f} s while "
            f"{deal.provider.name} claimed {pending} delivered task(s)"
            + ("" if settled else " (not all claimed in time)")
            + looked
            + "; the same command runs again"
        )
        return True
    if fault == "double_sigint":
        # Ctrl-C, and again once the CLI says it took the first (two signals sent before the
        # process handles the first may reach its handler as one).
        run.signal(signal.SIGINT)
        run.interrupted.wait(30)
        run.signal(signal.SIGINT)
        say("  client interrupted twice (SIGINT, then SIGINT once it said it stops sending)")
        return False
    raise ValueError(fault)


# ---- the end: settle everything -------------------------------------------------------------


def settled_on_time(soak: Soak, deals: list[Deal] | None = None) -> tuple[int, int, int]:
    """Return (on-time deliveries not yet on chain, the latest settlement instant, acks)."""
    pending = 0
    latest = 0
    acks = 0
    for deal in soak.deals if deals is None else deals:
        chain = soak.st.escrow.get_deal(deal.chain_id)
        journal = soak.work / deal.provider.name / JOURNAL
        tasks = {k: t for k, t in read_journal(journal).items() if k[0] == deal.chain_id}
        acks += len(tasks)
        statuses = soak.st.escrow.read_many(
            [("taskStatus", (deal.chain_id, index)) for _, index in tasks]
        )
        for task, status in zip(tasks.values(), statuses, strict=True):
            settle_by = min(task.request.deadline, chain.expiry) + chain.challenge_window
            latest = max(latest, settle_by)
            if task.delivered_on_time and int(status) == 0:
                pending += 1
    return pending, latest, acks


def settle_all(soak: Soak) -> dict[str, Any]:
    """Let the daemons settle, move the chain's clock past every instant, refund, close."""
    from client.accounts import ClientAccount
    from contracts.binding import DEAL_CLOSED

    st = soak.st
    started = time.monotonic()
    pending, latest, _ = settled_on_time(soak)
    # The daemons settle each task by its settlement instant; wait for them in wall time.
    budget = max(0.0, latest - time.time()) + 10
    say(f"waiting up to {budget:.0f} s for the daemons to settle {pending} on-time deliveries")
    poll_until(lambda: settled_on_time(soak)[0] == 0, budget)
    left, latest, _ = settled_on_time(soak)
    waited = time.monotonic() - started
    say(f"{pending - left} settled in {waited:.1f} s, {left} not")

    window = max(st.escrow.get_deal(d.chain_id).challenge_window for d in soak.deals)
    jump = max(1, latest + window + 2 - st.anvil.latest_timestamp())
    st.anvil.increase_time(jump)  # evm_setNextBlockTimestamp + evm_mine
    say(f"chain clock moved {jump} s forward, past every settlement instant and claim window")

    # Under reorgs a transaction may need several tries: as a user would, run again what
    # says it left work undone, and give the chain's steps longer.
    tries, slow = (5, 4) if soak.args.reorgs else (1, 1)
    refunds = 0
    for deal in soak.deals:
        for _ in range(tries):
            code, figures = soak.start(deal, "refund", []).finish()
            refunds += len((figures or {}).get("refunds", []))
            if code == 0 and not (figures or {}).get("pending_refunds"):
                break
            say(f"job refund on deal {deal.chain_id} exited {code}, refunds left pending")

    def no_pending() -> bool:
        return all(st.escrow.get_deal(d.chain_id).pending == 0 for d in soak.deals)

    finalized = poll_until(no_pending, 60 * slow)
    st.escrow.tx.reset_nonces()  # the client's CLI runs sent transactions with the same key
    account = ClientAccount(st.escrow, st.token, st.client)
    for deal in soak.deals:
        for attempt in range(tries):
            try:
                account.close(deal.chain_id)
                break
            except EscrowError as exc:  # not confirmed in time, or agreed by an earlier try
                say(f"close of deal {deal.chain_id}, try {attempt + 1}: {exc}")
                st.escrow.tx.reset_nonces()

    def closed() -> bool:
        return all(st.escrow.get_deal(d.chain_id).status == DEAL_CLOSED for d in soak.deals)

    closed_by_daemons = poll_until(closed, 90 * slow)
    return {
        "settle_wait_s": round(waited, 1),
        "on_time_unsettled_before_jump": left,
        "chain_jump_s": jump,
        "client_refunds": refunds,
        "claims_finalized": finalized,
        "deals_closed": closed_by_daemons,
    }


def inputs_paid_twice(soak: Soak, journals: list[Path]) -> int:
    """Return how many inputs of a deal the chain paid under more than one task index.

    Paid tasks are read from the escrow's events (newly vouched, or claimed in a batch that
    paid out); a task's input is the one of the client's signed request its daemon journaled.
    """
    chain = read_chain(soak.st.escrow)
    tasks = {}
    for path in journals:
        tasks.update(read_journal(path))
    paid = Counter(
        (key[0], tasks[key].request.input_hash)
        for key, count in chain.paid.items()
        if count and key in tasks
    )
    return sum(1 for count in paid.values() if count > 1)


def client_acks(soak: Soak) -> set[tuple[int, int]]:
    """Return the tasks the client's ledgers hold an ack for (read-only, log replayed)."""
    from client.ledger import DealLedger

    found: set[tuple[int, int]] = set()
    chain_id = soak.st.escrow.domain.chain_id
    for deal in soak.deals:
        ledger = DealLedger.open(
            deal.state, chain_id, soak.st.escrow.address, deal.chain_id, lock=False
        )
        try:
            found |= {(deal.chain_id, i) for i, t in ledger.tasks.items() if t.ack is not None}
        finally:
            ledger.close()
    return found


# ---- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="tasks in all (default 200)")
    parser.add_argument("--batch", type=int, default=10, help="tasks per client run")
    parser.add_argument("--concurrency", type=int, default=4, help="tasks in flight per run")
    parser.add_argument("--window", type=int, default=60, help="deals' challenge window, s")
    parser.add_argument("--freeze-s", type=float, default=10.0, help="anvil SIGSTOP length")
    parser.add_argument("--rounds", type=int, default=2, help="times each fault is injected")
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}"
    )
    parser.add_argument(
        "--late-fraction", type=float, default=0.05, help="share of p2's tasks made late"
    )
    parser.add_argument(
        "--reorgs",
        action="store_true",
        help="anvil mines a block each second; reorgs of 1-5 blocks and dropped transactions are "
        "injected while the workload runs; every process counts a transaction done 6 blocks deep",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir")
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown faults {unknown}")

    started = time.monotonic()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tpumarket-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    say(f"work dir {work}")
    chain_faults = None
    with (
        stack(
            work,
            market=True,
            min_challenge_window=args.window,
            block_time=1 if args.reorgs else None,
            confirmations=MAX_DEPTH + 1 if args.reorgs else 1,
        ) as st,
        _log(work) as log,
    ):
        soak = Soak(args, st, work, log=log)
        for name in PLANS:  # both daemons start at once
            st.start_provider(name, PLANS[name], slo_ms=SLO_MS[name], wait=False)
        for provider in st.providers:
            provider.ready()
        st.escrow.deposit(st.client, DEPOSIT)
        batches = -(-args.tasks // args.batch)
        open_deals(soak, quantity=args.batch * (batches // 2 + 1) * 2)
        files = write_inputs(soak)
        setup_s = time.monotonic() - started
        plan = schedule(batches, faults, args.rounds)
        if args.reorgs:
            chain_faults = ChainFaults(st.rpc_url, seed=args.seed)
            chain_faults.start()
        for number in range(batches):
            deal = soak.deals[number % len(soak.deals)]
            chunk = files[number * args.batch : (number + 1) * args.batch]
            run_batch(soak, number, deal, chunk, plan.get(number))
        workload_s = time.monotonic() - started - setup_s
        end = settle_all(soak)  # vouchers, claims, refunds and closes: still under faults
        if chain_faults is not None:
            chain_faults.stop()
        for process in reversed(st.processes):
            process.stop()
        journals = [work / p.name / JOURNAL for p in st.providers]
        result = audit(st.escrow, st.token, journals, client_acked=client_acks(soak))
        figures = result.figures()
        figures["inputs_paid_twice"] = inputs_paid_twice(soak, journals)
        if chain_faults is not None:
            figures.update(chain_faults.figures())
        figures.update(end)
        figures.update(
            {
                "tasks_requested": args.tasks,
                "provider_kills": soak.faults["provider_kill"],
                "chain_freezes": soak.faults["chain_freeze"],
                "chain_frozen_s": soak.frozen_s,
                "client_kills": soak.faults["client_kill"],
                "status_between_crash_and_rerun": soak.faults["status_between"],
                "double_sigints": soak.faults["double_sigint"],
                "client_runs": soak.runs["run"],
                "client_runs_failed": soak.runs["failed"],
                "client_reruns": soak.runs["rerun"],
                "setup_s": round(setup_s, 1),
                "workload_s": round(workload_s, 1),
                "duration_s": round(time.monotonic() - started, 1),
            }
        )
    print(json.dumps(figures), flush=True)
    return 0


@contextlib.contextmanager
def _log(work: Path) -> Iterator[IO[str]]:
    with (work / "client.log").open("a") as log:
        yield log


if __name__ == "__main__":
    sys.exit(main())
