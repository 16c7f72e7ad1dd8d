"""Provider daemon start: seconds from ``tpumarket provider run`` to a healthy daemon.

anvil and the market run as processes (``tests/e2e/stack.py``); one provider daemon is started
``--runs`` times on the same config and data dir (a restart, as an operator does it), with an
``[ask]`` and the config's default start benchmark, and stopped after each run. For each run
it measures, from the process's spawn:

- ``healthy_s``: the first ``GET /v1/health`` answering 200;
- ``ready_s``: the first health answer whose ``warming`` list is empty (every slow part warm:
  sandbox workers, capacity, heartbeat, the ask on the market);
- ``ask_live_s``: the first time the market lists a live ask of this provider;
- ``phases``: the seconds of each start phase, as the daemon's ``start phase`` log lines say.

The last line of stdout is one JSON object: the median of each figure, the runs, the load
average.

Usage: scripts/bench-provider-start [--runs N] [--pool-size N] [--no-market] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from contracts.chain import free_port  # noqa: E402
from contracts.messages import Plan, address_of  # noqa: E402
from tests.e2e.stack import PROVIDER_STAKE, Process, Stack, stack  # noqa: E402

POLL_S = 0.05
"""Seconds between probes (the resolution of the figures)."""
GIVE_UP_S = 300.0


def _config(st: Stack, key: str, pool_size: int) -> tuple[Path, str]:
    """Write a provider config with an [ask]; return its path and the daemon's URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    plan = Plan(compile_price=1_000, inference_price=2_000)
    lines = [
        f'rpc_url = "{st.rpc_url}"',
        f'escrow = "{st.escrow.address}"',
        f'data_dir = "{st.work / "provider"}"',
        f'public_url = "{url}"',
        'host = "127.0.0.1"',
        f"port = {port}",
        f"pool_size = {pool_size}",
        'jax_platforms = "cpu"',
        'log_level = "INFO"',
        *([f'market_url = "{st.market_url}"'] if st.market_url else []),
        "[plan]",
        *(f"{k} = {str(v).lower()}" for k, v in plan.to_json().items()),
        "[ask]",
        "price = 2000",
        "quantity = 10",
        "stake = 10000",
        "penalty = 1000",
        f'arbiter = "{address_of(st.arbiter)}"',
        "challenge_window = 60",
    ]
    path = st.work / "provider.toml"
    path.write_text("\n".join(lines) + "\n")
    return path, url


def _health(url: str) -> dict[str, Any] | None:
    try:
        reply = httpx.get(url + "/v1/health", timeout=2)
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    body = reply.json()
    return body if isinstance(body, dict) else None


def _ask_live(market_url: str, owner: str) -> bool:
    try:
        reply = httpx.get(
            market_url + "/v1/orders", params={"owner": owner, "live": "true"}, timeout=2
        )
    except httpx.HTTPError:
        return False
    return reply.status_code == 200 and any(o.get("side") == "ask" for o in reply.json())


def _phases(log: Path, since: int) -> dict[str, float]:
    """The ``start phase`` lines the daemon logged past byte ``since`` of its log."""
    phases: dict[str, float] = {}
    with log.open("rb") as lines:
        lines.seek(since)
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("msg") == "start phase":
                phases[str(record["phase"])] = float(record["seconds"])
    return phases


def _cancel_asks(st: Stack, owner: str) -> None:
    """Let the next run post its own ask: wait for none, by moving the chain past them."""
    st.anvil.increase_time(4_000)  # past every ask's expiry (1,800 s by default)


def one_run(st: Stack, process: Process, url: str, owner: str) -> dict[str, Any]:
    """Start the daemon, measure, stop it; return the run's figures."""
    since = process.log.stat().st_size if process.log.exists() else 0
    start = time.monotonic()
    process.start()
    healthy = ready = ask_live = None
    while time.monotonic() - start < GIVE_UP_S:
        assert process.popen is not None
        if process.popen.poll() is not None:
            raise SystemExit(f"the daemon exited: {process.log.read_text()[-3000:]}")
        now = time.monotonic() - start
        body = _health(url)
        if body is not None and healthy is None:
            healthy = now
        if body is not None and ready is None and not body.get("warming"):
            ready = now
        if ask_live is None and (not st.market_url or _ask_live(st.market_url, owner)):
            ask_live = time.monotonic() - start
        if healthy is not None and ready is not None and ask_live is not None:
            break
        time.sleep(POLL_S)
    process.stop()
    return {
        "healthy_s": None if healthy is None else round(healthy, 2),
        "ready_s": None if ready is None else round(ready, 2),
        "ask_live_s": None if ask_live is None else round(ask_live, 2),
        "phases": _phases(process.log, since),
    }


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return round(statistics.median(values), 2) if values else None


def main(argv: list[str] | None = None) -> int:
    """Measure the daemon's start; print one JSON object last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument(
        "--no-market", action="store_true", help="no market: no heartbeat, capacity or ask"
    )
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-provider-start-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    with stack(work, market=not args.no_market) as st:
        key = st.spare_keys.pop()
        st.token.mint(st.deployer, address_of(key), PROVIDER_STAKE)
        st.token.approve(key, st.escrow.address, PROVIDER_STAKE)
        st.escrow.stake(key, PROVIDER_STAKE)
        config, url = _config(st, key, args.pool_size)
        process = Process(
            "provider",
            ["-m", "contracts.cli", "provider", "run", "--config", str(config)],  # `tpumarket`
            work / "provider.log",
            {"TPUMARKET_PROVIDER_PRIVATE_KEY": key, "JAX_PLATFORMS": "cpu"},
        )
        st.processes.append(process)
        for number in range(args.runs):
            if number:
                _cancel_asks(st, address_of(key))
            run = one_run(st, process, url, address_of(key))
            print(json.dumps({"run": number + 1, **run}), flush=True)
            runs.append(run)
    summary = {
        "healthy_s": _median(runs, "healthy_s"),
        "ready_s": _median(runs, "ready_s"),
        "ask_live_s": _median(runs, "ask_live_s"),
        "runs": len(runs),
        "pool_size": args.pool_size,
        "load_average": round(os.getloadavg()[0], 1),
        "work_dir": str(work),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
