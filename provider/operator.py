"""``tpumarket provider stake | unstake | ask | asks | deals | earnings | status``.

An operator's commands, read from the daemon's own config (``--config FILE`` and the
``TPUMARKET_PROVIDER_*`` environment): the key, chain, escrow, market and ask terms. Tables
show amounts in tokens; ``--json`` prints one JSON object on the last line, amounts in base
units (decimal strings). Every failure is one ``error: ...`` line on stderr: exit 2 for a bad
config or input, 1 for a chain or market that refuses or cannot be reached.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from web3.exceptions import Web3Exception

from client.errors import ClientError
from client.market_http import MarketHttp
from client.waits import reported
from contracts.binding import DEAL_CLOSED, DEAL_OPEN, Chain, DealState, Escrow, Token
from contracts.errors import EscrowError
from provider.asks import live_asks, post_ask, signed_ask
from provider.config import ProviderConfig, load_config, to_address
from provider.console import UsageError, emit_json, parse_tokens, print_table, tokens
from provider.daemon_probe import daemon_pid
from provider.endpoint import daemon_url
from provider.errors import ConfigError, ProviderError
from provider.escrow_history import DealMoney, deals_of, earnings

Handler = Callable[[argparse.Namespace], int]
CONFIG_ENV = "TPUMARKET_PROVIDER_CONFIG"
_DEAL_STATUS: dict[int, str] = {DEAL_OPEN: "open", DEAL_CLOSED: "closed"}


# ---- connections -------------------------------------------------------------------------


@dataclass
class Operator:
    """The config and what it names on chain, connected and checked."""

    config: ProviderConfig
    chain: Chain
    escrow: Escrow
    token: Token
    decimals: int

    @property
    def address(self) -> str:
        """Return the provider's address."""
        return self.config.address

    def fmt(self, units: int) -> str:
        """Format base units as tokens."""
        return tokens(units, self.decimals)

    def market(self) -> MarketHttp:
        """Return a client of the configured market (a usage error when none is)."""
        if not self.config.market_url:
            raise UsageError("the config names no market: set market_url")
        return MarketHttp(self.config.market_url)

    def deals(self) -> list[int]:
        """Return the ids of every deal opened with this provider."""
        return deals_of(self.chain, self.escrow, self.address, self.config.settlement.start_block)

    def earnings(self, deals: Sequence[int]) -> dict[int, DealMoney]:
        """Sum what ``deals`` paid, hold and cost this provider."""
        return earnings(self.chain, self.escrow, deals, self.config.settlement.start_block)


def config_from(args: argparse.Namespace) -> ProviderConfig:
    """Load the config of ``--config`` (or ``$TPUMARKET_PROVIDER_CONFIG``) and the env."""
    path = args.config or os.environ.get(CONFIG_ENV)
    return load_config(None if path is None else Path(path))


def connect(args: argparse.Namespace) -> Operator:
    """Connect to the config's chain; check that its escrow is a deployed escrow."""
    config = config_from(args)
    try:
        address = to_address(config.escrow)
    except ValueError as exc:
        raise ConfigError(f"escrow: {exc}") from exc
    chain = Chain(config.rpc_url, policy=config.settlement.tx_policy())
    escrow = chain.escrow(address)
    if not chain.w3.eth.get_code(escrow.address):
        raise ConfigError(
            f"no contract at escrow {escrow.address} on chain {chain.tx.chain_id} "
            f"({config.rpc_url}): check the config's escrow"
        )
    try:
        token = chain.token(escrow.token())
        decimals = token.decimals()
    except (EscrowError, Web3Exception, ValueError) as exc:
        raise ConfigError(
            f"the contract at {escrow.address} is not a tpumarket escrow: {exc}"
        ) from exc
    return Operator(config=config, chain=chain, escrow=escrow, token=token, decimals=decimals)


# ---- handlers ----------------------------------------------------------------------------


def _balances(op: Operator) -> dict[str, int]:
    return {
        "wallet": op.token.balance_of(op.address),
        "escrow_balance": op.escrow.balance_of(op.address),
        "free_stake": op.escrow.stake_of(op.address),
    }


def _move(args: argparse.Namespace, action: str) -> int:
    op = connect(args)
    amount = parse_tokens(args.amount, op.decimals)
    key = op.config.private_key
    if action == "stake":
        wallet = op.token.balance_of(op.address)
        if wallet < amount:
            raise UsageError(
                f"cannot stake {op.fmt(amount)} tokens: the wallet holds {op.fmt(wallet)}"
            )
        if op.token.allowance(op.address, op.escrow.address) < amount:
            op.token.approve(key, op.escrow.address, amount)
        result = op.escrow.stake(key, amount)
    else:
        free = op.escrow.stake_of(op.address)
        if free < amount:
            raise UsageError(
                f"cannot unstake {op.fmt(amount)} tokens: the free stake is {op.fmt(free)} "
                "(stake locked by open deals returns when they close)"
            )
        result = op.escrow.unstake(key, amount)
    after = _balances(op)
    if args.json:
        emit_json(
            {
                "action": action,
                "amount": str(amount),
                "tx": result.tx_hash,
                **{k: str(v) for k, v in after.items()},
            }
        )
        return 0
    print(f"{action}d {op.fmt(amount)} tokens: tx {result.tx_hash}")
    print_table(["balance", "tokens"], [[k, op.fmt(v)] for k, v in after.items()])
    return 0


def _stake(args: argparse.Namespace) -> int:
    return _move(args, "stake")


def _unstake(args: argparse.Namespace) -> int:
    return _move(args, "unstake")


def _now(op: Operator) -> int:
    """Return the time expiries are judged by: the host's clock, or the chain's when it is
    ahead (the last block's time alone lags by minutes on a chain that mines on demand)."""
    return max(int(time.time()), int(op.chain.w3.eth.get_block("latest")["timestamp"]))


def _host_class() -> str:
    """Return the class of this host's devices, the class the daemon's ask goes to when its
    config's [ask] names none (``cpu`` on a CPU host, ``tpu-v5e`` on a v5e VM)."""
    from provider.capacity import discover

    device_class = discover(benchmark=False, aot_targets=()).devices.device_class
    print(
        f"the config's [ask] names no device_class: asking in this host's class {device_class} "
        "(as the daemon does; --device-class compile-v5e asks for compile checks)",
        file=sys.stderr,
        flush=True,
    )
    return device_class


def _ask(args: argparse.Namespace) -> int:
    op = connect(args)
    terms = op.config.ask
    if terms is None:
        raise UsageError("the config has no [ask] section: set the ask's terms there")
    changes: dict[str, Any] = {}
    if args.price is not None:
        changes["price"] = parse_tokens(args.price, op.decimals)
    if args.quantity is not None:
        changes["quantity"] = args.quantity
    if args.expiry_s is not None:
        changes["expiry_s"] = args.expiry_s
    terms = terms.replace(**changes)
    device_class = args.device_class or terms.device_class or _host_class()
    problem = op.config.settlement.window_problem(terms.challenge_window)
    if problem is not None:
        raise UsageError(f"the daemon would refuse every fill of this ask: {problem}")
    free = op.escrow.stake_of(op.address)
    if free < terms.stake:
        raise UsageError(
            f"the free stake ({op.fmt(free)} tokens) cannot cover one deal's stake "
            f"({op.fmt(terms.stake)}): run `tpumarket provider stake` first"
        )
    now = _now(op)
    signed = signed_ask(
        private_key=op.config.private_key,
        terms=terms,
        device_class=device_class,
        plan=op.config.plan,
        slo_ms=op.config.slo_ms,
        domain=op.escrow.domain,
        now=now,
    )
    market = op.market()
    try:
        reply = post_ask(market, signed)
    finally:
        market.close()
    order = reply.get("order") or reply
    fills = reply.get("fills") or []
    summary = {
        "order_id": str(order.get("order_id")),
        "state": str(order.get("state")),
        "device_class": device_class,
        "quantity": terms.quantity,
        "price": str(terms.price),
        "expiry": signed.ask.expiry,
        "fills": len(fills),
    }
    if args.json:
        emit_json(summary)
        return 0
    print(f"ask {summary['order_id']} ({summary['state']}, {len(fills)} fills)")
    print_table(
        ["class", "units", "price", "stake", "penalty", "window", "expires in"],
        [
            [
                device_class,
                str(terms.quantity),
                op.fmt(terms.price),
                op.fmt(terms.stake),
                op.fmt(terms.penalty),
                f"{terms.challenge_window} s",
                f"{terms.expiry_s} s",
            ]
        ],
    )
    return 0


def _asks(args: argparse.Namespace) -> int:
    op = connect(args)
    if not op.config.market_url:
        raise UsageError("the config names no market: set market_url")
    now = _now(op)
    asks = live_asks(op.config.market_url, op.address)
    if args.json:
        emit_json(
            {
                "provider": op.address,
                "asks": [
                    {
                        "order_id": a["order_id"],
                        "device_class": a["device_class"],
                        "state": a["state"],
                        "quantity": int(a["quantity"]),
                        "remaining": int(a["remaining"]),
                        "price": str(a["price"]),
                        "expiry": int(a["expiry"]),
                    }
                    for a in asks
                ],
            }
        )
        return 0
    if not asks:
        print(f"no live asks of {op.address} on {op.config.market_url}")
        return 0
    print_table(
        ["order", "class", "state", "left/units", "price", "expires in"],
        [
            [
                str(a["order_id"])[:18],
                str(a["device_class"]),
                str(a["state"]),
                f"{a['remaining']}/{a['quantity']}",
                op.fmt(int(a["price"])),
                f"{int(a['expiry']) - now} s",
            ]
            for a in asks
        ],
    )
    return 0


def _deal_json(deal_id: int, deal: DealState) -> dict[str, Any]:
    return {
        "deal_id": deal_id,
        "client": deal.client,
        "status": _DEAL_STATUS.get(deal.status, str(deal.status)),
        "expiry": deal.expiry,
        "challenge_window": deal.challenge_window,
        "max_spend": str(deal.max_spend),
        "committed": str(deal.committed),
        "pending": str(deal.pending),
        "stake": str(deal.stake),
        "penalty": str(deal.penalty),
    }


def _deals(args: argparse.Namespace) -> int:
    op = connect(args)
    ids = op.deals()
    if not args.all:
        states = {d: op.escrow.get_deal(d) for d in ids}
        ids = [d for d in ids if states[d].status == DEAL_OPEN]
    else:
        states = {d: op.escrow.get_deal(d) for d in ids}
    ids = ids[-args.limit :]
    if args.json:
        emit_json({"provider": op.address, "deals": [_deal_json(d, states[d]) for d in ids]})
        return 0
    if not ids:
        print(f"no {'' if args.all else 'open '}deals of {op.address}")
        return 0
    now = int(op.chain.w3.eth.get_block("latest")["timestamp"])
    print_table(
        ["deal", "client", "status", "ends in", "max spend", "committed", "pending", "stake"],
        [
            [
                str(d),
                states[d].client[:10],
                _DEAL_STATUS.get(states[d].status, str(states[d].status)),
                f"{states[d].expiry - now} s" if states[d].status == DEAL_OPEN else "-",
                op.fmt(states[d].max_spend),
                op.fmt(states[d].committed),
                op.fmt(states[d].pending),
                op.fmt(states[d].stake),
            ]
            for d in ids
        ],
    )
    return 0


def _earnings(args: argparse.Namespace) -> int:
    op = connect(args)
    money = op.earnings(op.deals())
    total = DealMoney(0)
    for deal in money.values():
        total.paid += deal.paid
        total.pending += deal.pending
        total.penalties += deal.penalties
        total.refunded += deal.refunded
        total.tasks_refunded += deal.tasks_refunded
    if args.json:
        totals = total.to_json()
        del totals["deal_id"]
        emit_json(
            {
                "provider": op.address,
                "deals": [m.to_json() for m in money.values()],
                "total": totals,
            }
        )
        return 0

    def row(label: str, m: DealMoney) -> list[str]:
        return [
            label,
            op.fmt(m.paid),
            op.fmt(m.pending),
            op.fmt(m.penalties),
            f"{op.fmt(m.refunded)} ({m.tasks_refunded} tasks)",
            op.fmt(m.paid - m.penalties),
        ]

    print_table(
        ["deal", "paid", "pending claims", "penalties", "refunded to clients", "net"],
        [*(row(str(d), m) for d, m in money.items()), row("total", total)],
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    op = connect(args)
    config = op.config
    block = op.chain.w3.eth.get_block("latest")
    head_age = int(time.time()) - int(block["timestamp"])
    pid = daemon_pid(config.data_dir)
    url = daemon_url(config.host, config.port, config.public_url)
    health: str
    try:
        reply = httpx.get(url + "/v1/health", timeout=3)
        health = "ok" if reply.is_success else f"answers {reply.status_code}"
    except httpx.HTTPError:
        health = "unreachable"
    ids = op.deals()
    open_deals = sum(1 for d in ids if op.escrow.get_deal(d).status == DEAL_OPEN)
    balances = _balances(op)
    market: str | None = None
    asks: int | None = None
    if config.market_url:
        try:
            asks = len(live_asks(config.market_url, op.address))
            market = "ok"
        except ClientError as exc:
            market = f"unreachable: {exc}"
    status = {
        "provider": op.address,
        "chain_id": op.chain.tx.chain_id,
        "escrow": op.escrow.address,
        "block": int(block["number"]),
        "block_age_s": head_age,
        "daemon_pid": pid,
        "daemon_url": url,
        "daemon_health": health,
        "deals": len(ids),
        "open_deals": open_deals,
        "market": market,
        "live_asks": asks,
        **{k: str(v) for k, v in balances.items()},
    }
    if args.json:
        emit_json(status)
        return 0
    running = "not running" if pid is None else f"running, pid {pid}"
    rows = [
        ["provider", op.address],
        ["chain", f"{status['chain_id']} block {status['block']} ({head_age} s old)"],
        ["escrow", op.escrow.address],
        ["daemon", f"{running}; {url} {health}"],
        ["deals", f"{open_deals} open of {len(ids)}"],
        ["wallet", op.fmt(balances["wallet"]) + " tokens"],
        ["escrow balance", op.fmt(balances["escrow_balance"]) + " tokens"],
        ["free stake", op.fmt(balances["free_stake"]) + " tokens"],
    ]
    if market is not None:
        rows.append(["market", f"{config.market_url} {market}; {asks} live asks"])
    print_table(["", ""], rows)
    return 0


def guarded(handler: Handler) -> Handler:
    """Wrap a handler: one ``error: ...`` line, exit 2 for usage or config, 1 otherwise."""

    def run(args: argparse.Namespace) -> int:
        try:
            with reported():  # a request unanswered for seconds is named on stderr
                return handler(args)
        except (UsageError, ConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 2
        except (ProviderError, ClientError, EscrowError, Web3Exception, OSError) as exc:
            line = " ".join(str(exc).split()) or type(exc).__name__
            print(f"error: {line}", file=sys.stderr, flush=True)
            return 1

    return run


def register(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the operator's commands under ``tpumarket provider``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=None, help=f"the daemon's TOML file (env {CONFIG_ENV})")
    common.add_argument("--json", action="store_true", help="one JSON object, base units")
    for name, handler, what in (
        ("stake", _stake, "move tokens from the wallet into the free stake"),
        ("unstake", _unstake, "move free stake back to the wallet"),
    ):
        move = actions.add_parser(name, parents=[common], help=what)
        move.add_argument("amount", help="tokens (1.5)")
        move.set_defaults(handler=guarded(handler))
    ask = actions.add_parser(
        "ask", parents=[common], help="post the config's ask on the market now"
    )
    ask.add_argument("--price", default=None, help="tokens per unit (default: the config's)")
    ask.add_argument("--quantity", type=int, default=None, help="units (default: the config's)")
    ask.add_argument("--expiry-s", type=int, default=None, help="seconds the ask trades")
    ask.add_argument("--device-class", default=None, help="default: the config's")
    ask.set_defaults(handler=guarded(_ask))
    asks = actions.add_parser("asks", parents=[common], help="this provider's live asks")
    asks.set_defaults(handler=guarded(_asks))
    deals = actions.add_parser("deals", parents=[common], help="this provider's deals on chain")
    deals.add_argument("--all", action="store_true", help="closed deals too")
    deals.add_argument("--limit", type=int, default=50, help="the latest this many")
    deals.set_defaults(handler=guarded(_deals))
    earnings_ = actions.add_parser(
        "earnings", parents=[common], help="paid, pending, penalties and refunds per deal"
    )
    earnings_.set_defaults(handler=guarded(_earnings))
    status = actions.add_parser(
        "status", parents=[common], help="chain, daemon, stake, deals and market at a glance"
    )
    status.set_defaults(handler=guarded(_status))
