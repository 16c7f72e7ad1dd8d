"""Tables and API schemas of the market, one family per entity (Base, Create, table, Public).

Integers that reach SQL are bounded to signed 64 bits (`INT64`), so a client can never make the
database overflow; the signed messages allow more (uint256), the API accepts this subset.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic import Field as PField
from sqlalchemy import BigInteger, Column, Index, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel

from market import advert_text
from market.deal_states import DealStatus

INT64 = 2**63 - 1
UINT256 = 2**256 - 1
ADDRESS = r"^0x[0-9a-fA-F]{40}$"
HEX_SIGNATURE = r"^0x[0-9a-fA-F]{130}$"
BYTES32 = r"^0x[0-9a-fA-F]{64}$"
LABEL = r"^[a-z0-9][a-z0-9._-]{0,63}$"


# -- orders -------------------------------------------------------------------------------------


class PlanIn(BaseModel):
    """A settlement plan (see `contracts.messages.Plan`), as JSON."""

    model_config = ConfigDict(extra="forbid")

    price_per_device_ms: int = PField(default=0, ge=0, le=2**64 - 1)
    compile_price: int = PField(default=0, ge=0, le=2**64 - 1)
    inference_price: int = PField(default=0, ge=0, le=2**64 - 1)
    reservation_fee: int = PField(default=0, ge=0, le=2**64 - 1)
    reserved_discount_bps: int = PField(default=0, ge=0, le=10_000)
    cache_hit_discount_bps: int = PField(default=0, ge=0, le=10_000)
    tier1_from_task: int = PField(default=0, ge=0, le=2**32 - 1)
    tier1_discount_bps: int = PField(default=0, ge=0, le=10_000)
    tier2_from_task: int = PField(default=0, ge=0, le=2**32 - 1)
    tier2_discount_bps: int = PField(default=0, ge=0, le=10_000)
    outcome_based: bool = False


class QuoteIn(BaseModel):
    """A provider's settlement quote (see `contracts.messages.Quote`), as JSON."""

    model_config = ConfigDict(extra="forbid")

    provider: str = PField(pattern=ADDRESS)
    client: str = PField(pattern=ADDRESS)
    arbiter: str = PField(pattern=ADDRESS)
    max_spend: int = PField(ge=0, le=UINT256)
    stake: int = PField(ge=0, le=UINT256)
    penalty: int = PField(ge=0, le=UINT256)
    duration: int = PField(ge=0, le=2**64 - 1)
    challenge_window: int = PField(ge=0, le=2**64 - 1)
    slo_ms: int = PField(ge=0, le=2**64 - 1)
    valid_until: int = PField(ge=0, le=2**64 - 1)
    nonce: int = PField(ge=0, le=UINT256)
    plan: PlanIn


class OrderBase(SQLModel):
    """Fields an owner signs (EIP-712 `Ask` or `Bid` under the market domain)."""

    side: str = Field(schema_extra={"pattern": r"^(bid|ask)$"}, max_length=3)
    owner: str = Field(schema_extra={"pattern": ADDRESS}, max_length=42)
    device_class: str = Field(schema_extra={"pattern": LABEL}, max_length=64)
    quantity: int = Field(ge=1, le=INT64, sa_type=BigInteger)
    price: int = Field(ge=1, le=INT64, sa_type=BigInteger)
    plan: str = Field(schema_extra={"pattern": LABEL}, max_length=64)
    slo_ms: int = Field(ge=1, le=INT64, sa_type=BigInteger)
    memory: int = Field(ge=0, le=INT64, sa_type=BigInteger)
    expiry: int = Field(ge=0, le=INT64, sa_type=BigInteger)
    nonce: int = Field(ge=0, le=INT64, sa_type=BigInteger)


# A plain pydantic model, not a member of the SQLModel family: it validates a request body
# about 2.5 times faster. It repeats `OrderBase`'s fields and bounds, so the published schema and
# the 422 reasons are the same (a test compares the two field by field).
class OrderCreate(BaseModel):
    """A signed order: the fields, the owner's signature, and for an ask the signed quote."""

    model_config = ConfigDict(extra="forbid")

    side: str = PField(pattern=r"^(bid|ask)$", max_length=3)
    owner: str = PField(pattern=ADDRESS, max_length=42)
    device_class: str = PField(pattern=LABEL, max_length=64)
    quantity: int = PField(ge=1, le=INT64)
    price: int = PField(ge=1, le=INT64)
    plan: str = PField(pattern=LABEL, max_length=64)
    slo_ms: int = PField(ge=1, le=INT64)
    memory: int = PField(ge=0, le=INT64)
    expiry: int = PField(ge=0, le=INT64)
    nonce: int = PField(ge=0, le=INT64)
    signature: str = PField(pattern=HEX_SIGNATURE)
    quote: QuoteIn | None = None
    quote_signature: str | None = PField(default=None, pattern=HEX_SIGNATURE)


class OrderBatch(BaseModel):
    """Several signed orders placed atomically: all are accepted or none.

    Validation stops at the first invalid order (its problems are reported, the orders after
    it are not looked at): a refused batch costs at most one order's validation past the
    valid ones."""

    model_config = ConfigDict(extra="forbid")

    orders: list[OrderCreate] = PField(min_length=1, fail_fast=True)


class Order(OrderBase, table=True):
    """An accepted order with the engine's view of its progress."""

    __tablename__ = "orders"
    __table_args__ = (
        UniqueConstraint("device_class", "seq", name="uq_orders_class_seq"),
        Index("ix_orders_class_state", "device_class", "state"),
        # An order's nonce is claimed by its own row (owner lookups use this index too), so
        # placing an order writes no `nonces` row; cancels claim theirs in `NonceUse`.
        Index("uq_orders_owner_nonce", "owner", "nonce", unique=True),
    )

    order_id: str = Field(primary_key=True, max_length=66)
    seq: int = Field(sa_type=BigInteger)
    state: str = Field(max_length=20)
    remaining: int = Field(sa_type=BigInteger)
    created_at: float
    signature: str = Field(max_length=132)
    quote_json: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    quote_signature: str | None = Field(default=None, max_length=132)
    quote_hash: str | None = Field(default=None, max_length=66)


class OrderPublic(OrderBase):
    """An order as the API shows it."""

    order_id: str
    seq: int
    state: str
    remaining: int
    filled: int
    created_at: float
    signature: str
    quote: dict[str, Any] | None = None
    quote_signature: str | None = None


class CancelCreate(BaseModel):
    """A signed `CancelOrder`."""

    model_config = ConfigDict(extra="forbid")

    owner: str = PField(pattern=ADDRESS)
    order_id: str = PField(pattern=BYTES32)
    nonce: int = PField(ge=0, le=INT64)
    expiry: int = PField(ge=0, le=INT64)
    signature: str = PField(pattern=HEX_SIGNATURE)


class NonceUse(SQLModel, table=True):
    """A (signer, nonce) pair a cancel used once and never may be again (an order's nonce is
    claimed by its `Order` row: signers share one nonce space across both tables)."""

    __tablename__ = "nonces"

    owner: str = Field(primary_key=True, max_length=42)
    nonce: int = Field(primary_key=True, sa_type=BigInteger)


# -- fills and deals ----------------------------------------------------------------------------


class FillBase(SQLModel):
    """A trade between a bid and an ask at the resting order's price."""

    device_class: str = Field(max_length=64)  # served by the class+seq/time/id indexes
    fill_id: int = Field(sa_type=BigInteger)
    bid_id: str = Field(max_length=66)
    ask_id: str = Field(max_length=66)
    price: int = Field(sa_type=BigInteger)
    quantity: int = Field(sa_type=BigInteger)
    aggressor: str = Field(max_length=3)
    time: int = Field(sa_type=BigInteger, index=True)


class Fill(FillBase, table=True):
    """A stored fill; its id `<device class>:<fill id>` is also the deal id."""

    __tablename__ = "fills"

    id: str = Field(primary_key=True, max_length=90)
    seq: int | None = Field(default=None, sa_type=BigInteger, index=True)
    """Order of commit across every class: newest fill = highest `seq`."""


class FillPublic(FillBase):
    """A fill as the API shows it."""

    id: str


class Deal(SQLModel, table=True):
    """A match turned into a deal record: who, what, at what price, with which quote."""

    __tablename__ = "deals"
    __table_args__ = (
        # Only deals with a quote attached: the matcher writes deals without one, and lookups by
        # quote hash look for attached ones (migration 0005).
        Index(
            "ix_deals_quote_hash",
            "quote_hash",
            sqlite_where=text("quote_json IS NOT NULL"),
            postgresql_where=text("quote_json IS NOT NULL"),
        ),
    )

    deal_id: str = Field(primary_key=True, max_length=90)
    device_class: str = Field(max_length=64)
    bid_id: str = Field(max_length=66)
    ask_id: str = Field(max_length=66)
    client: str = Field(max_length=42, index=True)
    provider: str = Field(max_length=42, index=True)
    price: int = Field(sa_type=BigInteger)
    quantity: int = Field(sa_type=BigInteger)
    max_spend: str = Field(max_length=80)
    created_at: float
    chain_deal_id: int | None = Field(default=None, sa_type=BigInteger)
    quote_hash: str = Field(max_length=66)
    quote_json: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    quote_signature: str | None = Field(default=None, max_length=132)


class QuoteAttach(BaseModel):
    """A fresh quote the provider signs for one matched deal (its ask's quote was used)."""

    model_config = ConfigDict(extra="forbid")

    quote: QuoteIn
    quote_signature: str = PField(pattern=HEX_SIGNATURE)


class ChainDeal(SQLModel, table=True):
    """A deal as the escrow's events tell it (indexed from the chain; the market's truth).

    Amounts are uint256 on chain, stored as decimal strings; uint64 times saturate at int64.
    `paid` is what the provider earned for work (redeemed vouchers' increases, finalized claims,
    disputes it won); the reservation fee is apart. `refunded` and `penalties` are what went back
    to the client (breach refunds, disputes the client won) and what the stake paid it.
    """

    __tablename__ = "chain_deals"

    chain_deal_id: int = Field(primary_key=True, sa_type=BigInteger)
    client: str = Field(max_length=42)
    provider: str = Field(max_length=42, index=True)
    arbiter: str = Field(max_length=42)
    quote_hash: str = Field(max_length=66, index=True)
    plan_hash: str = Field(max_length=66)
    max_spend: str = Field(max_length=80)
    stake: str = Field(max_length=80)
    penalty: str = Field(max_length=80)
    expiry: int = Field(sa_type=BigInteger)
    challenge_window: int = Field(sa_type=BigInteger)
    slo_ms: int = Field(sa_type=BigInteger)
    status: str = Field(default=DealStatus.OPENED, max_length=16)
    opened_tx: str = Field(max_length=66)
    opened_block: int = Field(sa_type=BigInteger)
    last_tx: str = Field(max_length=66)
    closed_tx: str | None = Field(default=None, max_length=66)
    reservation_fee: str = Field(default="0", max_length=80)
    tasks_paid: int = Field(default=0, sa_type=BigInteger)
    tasks_claimed: int = Field(default=0, sa_type=BigInteger)
    paid: str = Field(default="0", max_length=80)
    refunds: int = Field(default=0, sa_type=BigInteger)
    refunded: str = Field(default="0", max_length=80)
    penalties: str = Field(default="0", max_length=80)
    disputes_won: int = Field(default=0, sa_type=BigInteger)
    disputes_lost: int = Field(default=0, sa_type=BigInteger)
    returned_to_client: str | None = Field(default=None, max_length=80)
    batches_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))


class ProviderClient(SQLModel, table=True):
    """What one client's deals with one provider settled on chain (the reputation's terms).

    Kept by the indexer in the same transaction as the events it sums, so reading a provider's
    reputation reads its clients, not every deal.
    """

    __tablename__ = "provider_clients"

    provider: str = Field(primary_key=True, max_length=42)
    client: str = Field(primary_key=True, max_length=42)
    deals: int = Field(default=0, sa_type=BigInteger)
    paid: str = Field(default="0", max_length=80)
    refunded: str = Field(default="0", max_length=80)
    penalties: str = Field(default="0", max_length=80)
    refunds: int = Field(default=0, sa_type=BigInteger)
    disputes_won: int = Field(default=0, sa_type=BigInteger)
    disputes_lost: int = Field(default=0, sa_type=BigInteger)


class DealPublic(BaseModel):
    """A deal record with both signed orders, its own quote, and its settlement status.

    `quote` is the quote the provider signed for this deal, naming its client (None until the
    provider attaches it); the ask's terms are in `ask.quote` (its quote names no client and
    opens nothing on chain).
    """

    deal_id: str
    device_class: str
    client: str
    provider: str
    price: int
    quantity: int
    max_spend: str
    created_at: float
    bid: OrderPublic
    ask: OrderPublic
    quote: dict[str, Any] | None
    quote_signature: str | None
    quote_hash: str | None
    status: DealStatus
    chain_deal_id: int | None
    tasks_paid: int
    paid: str
    reservation_fee: str
    refunds: int
    refunded: str
    penalties: str
    disputes_won: int
    disputes_lost: int
    opened_tx: str | None
    last_tx: str | None
    closed_tx: str | None


class ChainEvent(SQLModel, table=True):
    """One indexed escrow event (kept for audit; its key makes indexing idempotent)."""

    __tablename__ = "chain_events"

    tx_hash: str = Field(primary_key=True, max_length=66)
    log_index: int = Field(primary_key=True, sa_type=BigInteger)
    block_number: int = Field(sa_type=BigInteger, index=True)
    name: str = Field(max_length=32)
    chain_deal_id: int | None = Field(default=None, sa_type=BigInteger, index=True)
    args_json: str = Field(sa_column=Column(Text, nullable=False))


class IndexerState(SQLModel, table=True):
    """Where the chain indexer has got to."""

    __tablename__ = "indexer_state"

    name: str = Field(primary_key=True, max_length=64)
    block: int = Field(sa_type=BigInteger)
    # The hash of `block` as indexed (None: recorded before hashes were kept); another hash at
    # that height now means a reorg replaced indexed blocks.
    block_hash: str | None = Field(default=None, max_length=66)


# -- providers ----------------------------------------------------------------------------------


class AdvertIn(BaseModel):
    """What a provider advertises: measured capacity and prices (hashed into its heartbeat)."""

    model_config = ConfigDict(extra="allow")

    device_class: str = PField(pattern=LABEL)
    device_kind: str = PField(min_length=1, max_length=64)
    device_count: int = PField(ge=0, le=1_000_000)
    price: int = PField(ge=0, le=INT64)
    throughput: float = PField(ge=0, le=1e12, description="measured units per second")
    capacity: int = PField(default=0, ge=0, le=INT64, description="units it can sell now")
    endpoint: str = PField(default="", max_length=256, description="empty, or an http(s) URL")

    # What every visitor is shown: free text normalized, a URL only http(s) (422 naming the
    # field otherwise; `market.advert_text`).
    _device_kind = field_validator("device_kind")(advert_text.free_text)
    _endpoint = field_validator("endpoint")(advert_text.http_url)


class HeartbeatCreate(BaseModel):
    """A signed heartbeat: the advert and the provider's signature over its hash."""

    model_config = ConfigDict(extra="forbid")

    provider: str = PField(pattern=ADDRESS)
    timestamp: int = PField(ge=0, le=INT64)
    advert: AdvertIn
    signature: str = PField(pattern=HEX_SIGNATURE)


class ProviderBase(SQLModel):
    """A provider as its latest heartbeat describes it."""

    address: str = Field(primary_key=True, max_length=42)
    device_class: str = Field(max_length=64)
    device_kind: str = Field(max_length=64)
    device_count: int = Field(sa_type=BigInteger)
    price: int = Field(sa_type=BigInteger)
    throughput: float
    capacity: int = Field(sa_type=BigInteger)
    endpoint: str = Field(max_length=256)
    last_seen: float
    online: bool = True


class Provider(ProviderBase, table=True):
    """A stored provider registry entry."""

    __tablename__ = "providers"

    heartbeat_ts: int = Field(sa_type=BigInteger)
    advert_json: str = Field(sa_column=Column(Text, nullable=False))


class ArbiterAdvertRow(SQLModel, table=True):
    """An arbiter's latest signed advert on this market (read and written by `market.arbiters`)."""

    __tablename__ = "arbiters"

    address: str = Field(primary_key=True, max_length=42)
    advert_ts: int = Field(sa_type=BigInteger)
    advert_json: str = Field(sa_column=Column(Text, nullable=False))
    signature: str = Field(max_length=132)
    last_seen: float


class ProviderPublic(ProviderBase):
    """A provider with its reputation from on-chain value (see docs/market.md, "Reputation").

    Amounts are decimal strings of token base units. Nothing here counts voucher task bits: a
    figure shown was paid (or refunded) on chain, by the clients counted.
    """

    paid: str = PField(description="value paid for work: vouchers, finalized claims, won disputes")
    clients: int = PField(description="distinct clients that paid it")
    top_client_share: float = PField(description="share of `paid` from its largest client")
    refunded: str = PField(description="value refunded to clients: breaches, lost disputes")
    penalties: str = PField(description="penalties its stake paid to clients")
    refunds: int = PField(description="breach refunds")
    disputes_won: int
    disputes_lost: int
    reliability: float = PField(description="(paid + p) / (paid + refunded + penalties + 2p)")
    has_history: bool = PField(
        default=False,
        description="whether any value it was paid, refunded or penalised settled on chain; "
        "without, `reliability` is the prior alone (the page shows it as new)",
    )


# -- views --------------------------------------------------------------------------------------


class PlaceResult(BaseModel):
    """What placing one order did."""

    order: OrderPublic
    fills: list[FillPublic]


class PlaceSummary(BaseModel):
    """What placing one order of a batch did (fetch `/v1/orders/{id}` for the whole order)."""

    order_id: str
    state: str
    remaining: int
    fills: list[FillPublic]


class BatchResult(BaseModel):
    """What placing a batch did, order by order."""

    results: list[PlaceSummary]
