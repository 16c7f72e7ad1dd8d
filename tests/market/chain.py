"""A real anvil with a v2 escrow for the market's chain tests, and v2 message builders.

One anvil and deployment per session (a few blocks after genesis, so the deployment block is
not 0), a snapshot reverted after each test. The escrow's minimum challenge window is short
(`MIN_WINDOW`) so breach and claim windows pass in a few chain seconds.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from contracts.binding import Chain, Escrow, Token
from contracts.chain import Anvil, rpc
from contracts.messages import (
    KIND_INFERENCE,
    STATUS_SUCCESS,
    ZERO_HASH,
    Ack,
    Claim,
    Plan,
    Quote,
    Receipt,
    TaskRequest,
    address_of,
)
from contracts.orders import plan_kind
from contracts.pricing import price_receipt
from market.errors import ReplayError
from market.models import HeartbeatCreate, OrderCreate, QuoteAttach
from market.service import MarketService
from market.settings import Settings
from tests import chain_clock

from .conftest import Clock
from .signing import METERED, Trader

MIN_WINDOW = 5
ARBITRATION_S = 3_600
FUNDS = 10**15
BLOCKS_BEFORE_DEPLOY = 7


@dataclass
class ChainWorld:
    """A deployed v2 escrow and token on a running anvil, with funded keys."""

    anvil: Anvil
    chain: Chain
    escrow: Escrow
    token: Token
    deploy_block: int
    deployer: str
    clients: list[str]
    providers: list[str]
    arbiter: str

    def now(self) -> int:
        """Return the latest block's timestamp."""
        return self.anvil.latest_timestamp()

    def head(self) -> int:
        """Return the latest block number."""
        return int(self.chain.w3.eth.block_number)

    def trader(self, key: str) -> Trader:
        """Return a market trader signing under this chain's domains, naming its arbiter."""
        return Trader(
            key=key,
            chain_id=self.anvil.chain_id,
            escrow=self.escrow.address,
            arbiter=address_of(self.arbiter),
        )

    def fund(self, key: str) -> None:
        """Give a fresh key ether, tokens and the escrow's allowance."""
        self.anvil.fund(address_of(key), 10**21)
        self.token.mint(self.deployer, address_of(key), FUNDS)
        self.token.approve(key, self.escrow.address, 2**256 - 1)


def deploy_world(anvil: Anvil) -> ChainWorld:
    """Deploy the token and a v2 escrow on `anvil` after a few empty blocks; fund the keys."""
    for _ in range(BLOCKS_BEFORE_DEPLOY):
        rpc(anvil.url, "evm_mine")
    chain = Chain(anvil.url)
    keys = anvil.keys
    deployment = chain.deploy(
        keys[0], min_challenge_window=MIN_WINDOW, arbitration_period=ARBITRATION_S
    )
    deploy_block = int(chain.w3.eth.block_number)  # the escrow's, the last of the two
    world = ChainWorld(
        anvil=anvil,
        chain=chain,
        escrow=chain.escrow(deployment.escrow),
        token=chain.token(deployment.token),
        deploy_block=deploy_block,
        deployer=keys[0],
        clients=keys[1:4],
        providers=keys[4:7],
        arbiter=keys[7],
    )
    for key in keys[1:8]:
        world.token.mint(keys[0], address_of(key), FUNDS)
        world.token.approve(key, world.escrow.address, 2**256 - 1)
    return world


@pytest.fixture(scope="session")
def chain_session() -> Iterator[ChainWorld]:
    """One anvil and one v2 deployment for the session."""
    with Anvil.start(accounts=10) as anvil:
        yield deploy_world(anvil)


@pytest.fixture
def world(chain_session: ChainWorld) -> Iterator[ChainWorld]:
    """The session's deployment, reverted after the test."""
    snapshot = chain_session.anvil.snapshot()
    try:
        yield chain_session
    finally:
        chain_clock.revert(chain_session.anvil, snapshot)  # its clock at the present
        chain_session.chain.tx.reset_nonces()


@pytest.fixture
def market(world: ChainWorld, tmp_path: Path) -> Iterator[MarketService]:
    """A market on the test's escrow (no jobs), its clock at the chain's time."""
    settings = Settings(
        data_dir=tmp_path / "data",
        chain_id=world.anvil.chain_id,
        escrow=world.escrow.address,
        rpc_url=world.anvil.url,
        run_jobs=False,
    )
    service = MarketService(settings, clock=Clock(world.now()))
    yield service
    service.close()


# -- v2 messages ---------------------------------------------------------------------------------


def task_request(
    deal_id: int, index: int, *, deadline: int, max_price: int = 10_000, kind: int = KIND_INFERENCE
) -> TaskRequest:
    """Return a client's task request with random program and input hashes."""
    return TaskRequest(
        deal_id=deal_id,
        task_index=index,
        kind=kind,
        program_hash=os.urandom(32),
        input_hash=os.urandom(32),
        max_price=max_price,
        deadline=deadline,
    )


def ack_of(request: TaskRequest, price: int) -> Ack:
    """Return the provider's ack of a request at `price`."""
    return Ack(
        deal_id=request.deal_id,
        task_index=request.task_index,
        request_hash=request.struct_hash(),
        price=price,
    )


def claim_of(
    world: ChainWorld, request: TaskRequest, plan: Plan, client_key: str, *, device_ms: int = 40
) -> Claim:
    """Return a claim of a delivered request: its receipt priced by `plan`, the signed request."""
    draft = Receipt(
        deal_id=request.deal_id,
        task_index=request.task_index,
        kind=request.kind,
        status=STATUS_SUCCESS,
        cache_hit=False,
        device_ms=device_ms,
        compile_ms=0,
        program_hash=request.program_hash,
        input_hash=request.input_hash,
        output_hash=os.urandom(32),
        started_at=request.deadline - 2,
        finished_at=request.deadline - 1,
        deadline=request.deadline,
        amount=0,
        prev_receipt_hash=ZERO_HASH,
    )
    receipt = replace(draft, amount=price_receipt(plan, draft))
    return Claim(
        receipt=receipt,
        max_price=request.max_price,
        request_signature=request.sign(world.escrow.domain, client_key),
    )


# -- the market's way to a deal: ask, bid, the provider's quote for the fill, open ---------------


def attach(service: MarketService, deal_id: str, quote: Quote, key: str) -> None:
    """Attach a quote signed by `key` to a market deal (raises the market's error if refused)."""
    body = {
        "quote": quote.to_json(),
        "quote_signature": "0x" + quote.sign(service.escrow_domain, key).hex(),
    }
    service.attach_quote(deal_id, QuoteAttach.model_validate(body))


def fund(
    world: ChainWorld, service: MarketService, *, provider: str, client: str, spend: int, stake: int
) -> None:
    """Put on the escrow what the market asks of orders (`market.funds`): the provider's stake
    (the market's minimum, or the quote's if more) and the client's free balance for `spend`;
    and heartbeat the provider (only live providers' asks match)."""
    need = max(stake, service.settings.min_provider_stake)
    have = world.escrow.stake_of(address_of(provider))
    if have < need:
        world.escrow.stake(provider, need - have)
    beat = world.trader(provider).heartbeat(int(service.clock()))
    with contextlib.suppress(ReplayError):  # it beat within this second already
        service.heartbeat(HeartbeatCreate.model_validate(beat), beat["advert"])
    balance = world.escrow.balance_of(address_of(client))
    if balance < spend:
        world.escrow.deposit(client, spend - balance)


def match(
    world: ChainWorld,
    service: MarketService,
    provider: Trader,
    client: Trader,
    *,
    price: int = 1_000,
    quantity: int = 10,
    plan: Plan = METERED,
    **terms: object,
) -> tuple[str, Quote]:
    """Fund both sides, place an ask and a bid that fill; return the market deal id and the
    ask's quote."""
    now = service.now()
    ask_quote = provider.quote(
        slo_ms=100, valid_until=now + 3_600, plan=plan, challenge_window=MIN_WINDOW, **terms
    )
    fund(
        world,
        service,
        provider=provider.key,
        client=client.key,
        spend=price * quantity,
        stake=ask_quote.stake,
    )
    body = provider.ask(now, price=price, quantity=quantity, quote=ask_quote, plan=plan_kind(plan))
    [ask] = service.place([OrderCreate.model_validate(body)])
    [bid] = service.place(
        [
            OrderCreate.model_validate(
                client.bid(now, price=price, quantity=quantity, plan=plan_kind(plan))
            )
        ]
    )
    return bid.fills[0].id, Quote.from_json(ask.order.quote or {})


def deal_quote(
    provider: Trader, terms: Quote, client: str, max_spend: int, valid_until: int
) -> Quote:
    """Return the quote a provider signs for one fill: the ask's terms, naming the client."""
    return provider.fill_quote(terms, client=client, max_spend=max_spend, valid_until=valid_until)


def open_on_chain(
    world: ChainWorld, service: MarketService, deal_id: str, client_key: str, provider_key: str
) -> int:
    """Open a market deal on chain with the quote its record holds; return the chain deal id."""
    record = service.deal(deal_id)
    assert record.quote is not None and record.quote_signature is not None
    quote = Quote.from_json(record.quote)
    fund(
        world,
        service,
        provider=provider_key,
        client=client_key,
        spend=int(record.max_spend),
        stake=quote.stake,
    )
    signature = bytes.fromhex(record.quote_signature[2:])
    opened = world.escrow.open_deal(client_key, quote, signature, int(record.max_spend))
    return int(opened.event("DealOpened").args["dealId"])
