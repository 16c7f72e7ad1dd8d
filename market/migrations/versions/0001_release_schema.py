"""The market's schema at the release before migrations: every table, the indexes its models
declare, the unique (owner, nonce) index and the partial index of live orders by owner.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels = None
depends_on = None

# Tables the chain indexer derives from the escrow's events, dependants first: they hold
# nothing the chain does not, so a shape written for an older escrow protocol is dropped.
CHAIN_TABLES = ("provider_clients", "chain_events", "chain_deals", "indexer_state")
CHAIN_DEAL_COLUMNS = {
    "chain_deal_id",
    "client",
    "provider",
    "arbiter",
    "quote_hash",
    "plan_hash",
    "max_spend",
    "stake",
    "penalty",
    "expiry",
    "challenge_window",
    "slo_ms",
    "status",
    "opened_tx",
    "opened_block",
    "last_tx",
    "closed_tx",
    "reservation_fee",
    "tasks_paid",
    "tasks_claimed",
    "paid",
    "refunds",
    "refunded",
    "penalties",
    "disputes_won",
    "disputes_lost",
    "returned_to_client",
    "batches_json",
}

# Indexes no query used, or that another index serves (older markets made them).
RETIRED_INDEXES = (
    "ix_orders_quote_hash",
    "ix_orders_owner",
    "ix_fills_bid_id",
    "ix_fills_ask_id",
    "ix_deals_chain_deal_id",
)


def upgrade() -> None:
    """Create the tables and indexes; on a database an older market wrote without migrations,
    only those missing, after dropping its retired indexes and a chain index written for an
    older escrow protocol (the indexer rebuilds it from the escrow's deployment block)."""
    inspector = sa.inspect(op.get_bind())
    tables = set(inspector.get_table_names())
    if "chain_deals" in tables:
        have = {c["name"] for c in inspector.get_columns("chain_deals")}
        if not have >= CHAIN_DEAL_COLUMNS:
            for name in CHAIN_TABLES:
                if name in tables:
                    op.drop_table(name)
            if "deals" in tables:
                op.execute("UPDATE deals SET chain_deal_id = NULL")
            tables -= set(CHAIN_TABLES)
    for name in RETIRED_INDEXES:
        op.drop_index(name, if_exists=True)
    if "chain_deals" not in tables:
        op.create_table(
            "chain_deals",
            sa.Column("chain_deal_id", sa.BigInteger(), nullable=False),
            sa.Column("client", sa.String(length=42), nullable=False),
            sa.Column("provider", sa.String(length=42), nullable=False),
            sa.Column("arbiter", sa.String(length=42), nullable=False),
            sa.Column("quote_hash", sa.String(length=66), nullable=False),
            sa.Column("plan_hash", sa.String(length=66), nullable=False),
            sa.Column("max_spend", sa.String(length=80), nullable=False),
            sa.Column("stake", sa.String(length=80), nullable=False),
            sa.Column("penalty", sa.String(length=80), nullable=False),
            sa.Column("expiry", sa.BigInteger(), nullable=False),
            sa.Column("challenge_window", sa.BigInteger(), nullable=False),
            sa.Column("slo_ms", sa.BigInteger(), nullable=False),
            sa.Column("status", sa.String(length=16), nullable=False),
            sa.Column("opened_tx", sa.String(length=66), nullable=False),
            sa.Column("opened_block", sa.BigInteger(), nullable=False),
            sa.Column("last_tx", sa.String(length=66), nullable=False),
            sa.Column("closed_tx", sa.String(length=66), nullable=True),
            sa.Column("reservation_fee", sa.String(length=80), nullable=False),
            sa.Column("tasks_paid", sa.BigInteger(), nullable=False),
            sa.Column("tasks_claimed", sa.BigInteger(), nullable=False),
            sa.Column("paid", sa.String(length=80), nullable=False),
            sa.Column("refunds", sa.BigInteger(), nullable=False),
            sa.Column("refunded", sa.String(length=80), nullable=False),
            sa.Column("penalties", sa.String(length=80), nullable=False),
            sa.Column("disputes_won", sa.BigInteger(), nullable=False),
            sa.Column("disputes_lost", sa.BigInteger(), nullable=False),
            sa.Column("returned_to_client", sa.String(length=80), nullable=True),
            sa.Column("batches_json", sa.Text(), nullable=False),
            sa.PrimaryKeyConstraint("chain_deal_id"),
        )
    op.create_index(
        "ix_chain_deals_provider", "chain_deals", ["provider"], unique=False, if_not_exists=True
    )
    op.create_index(
        "ix_chain_deals_quote_hash", "chain_deals", ["quote_hash"], unique=False, if_not_exists=True
    )
    if "chain_events" not in tables:
        op.create_table(
            "chain_events",
            sa.Column("tx_hash", sa.String(length=66), nullable=False),
            sa.Column("log_index", sa.BigInteger(), nullable=False),
            sa.Column("block_number", sa.BigInteger(), nullable=False),
            sa.Column("name", sa.String(length=32), nullable=False),
            sa.Column("chain_deal_id", sa.BigInteger(), nullable=True),
            sa.Column("args_json", sa.Text(), nullable=False),
            sa.PrimaryKeyConstraint("tx_hash", "log_index"),
        )
    op.create_index(
        "ix_chain_events_block_number",
        "chain_events",
        ["block_number"],
        unique=False,
        if_not_exists=True,
    )
    op.create_index(
        "ix_chain_events_chain_deal_id",
        "chain_events",
        ["chain_deal_id"],
        unique=False,
        if_not_exists=True,
    )
    if "deals" not in tables:
        op.create_table(
            "deals",
            sa.Column("deal_id", sa.String(length=90), nullable=False),
            sa.Column("device_class", sa.String(length=64), nullable=False),
            sa.Column("bid_id", sa.String(length=66), nullable=False),
            sa.Column("ask_id", sa.String(length=66), nullable=False),
            sa.Column("client", sa.String(length=42), nullable=False),
            sa.Column("provider", sa.String(length=42), nullable=False),
            sa.Column("price", sa.BigInteger(), nullable=False),
            sa.Column("quantity", sa.BigInteger(), nullable=False),
            sa.Column("max_spend", sa.String(length=80), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("chain_deal_id", sa.BigInteger(), nullable=True),
            sa.Column("quote_hash", sa.String(length=66), nullable=False),
            sa.Column("quote_json", sa.Text(), nullable=True),
            sa.Column("quote_signature", sa.String(length=132), nullable=True),
            sa.PrimaryKeyConstraint("deal_id"),
        )
    op.create_index("ix_deals_client", "deals", ["client"], unique=False, if_not_exists=True)
    op.create_index("ix_deals_provider", "deals", ["provider"], unique=False, if_not_exists=True)
    op.create_index(
        "ix_deals_quote_hash", "deals", ["quote_hash"], unique=False, if_not_exists=True
    )
    if "fills" not in tables:
        op.create_table(
            "fills",
            sa.Column("device_class", sa.String(length=64), nullable=False),
            sa.Column("fill_id", sa.BigInteger(), nullable=False),
            sa.Column("bid_id", sa.String(length=66), nullable=False),
            sa.Column("ask_id", sa.String(length=66), nullable=False),
            sa.Column("price", sa.BigInteger(), nullable=False),
            sa.Column("quantity", sa.BigInteger(), nullable=False),
            sa.Column("aggressor", sa.String(length=3), nullable=False),
            sa.Column("time", sa.BigInteger(), nullable=False),
            sa.Column("id", sa.String(length=90), nullable=False),
            sa.PrimaryKeyConstraint("id"),
        )
    op.create_index(
        "ix_fills_device_class", "fills", ["device_class"], unique=False, if_not_exists=True
    )
    op.create_index("ix_fills_time", "fills", ["time"], unique=False, if_not_exists=True)
    if "indexer_state" not in tables:
        op.create_table(
            "indexer_state",
            sa.Column("name", sa.String(length=64), nullable=False),
            sa.Column("block", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("name"),
        )
    if "nonces" not in tables:
        op.create_table(
            "nonces",
            sa.Column("owner", sa.String(length=42), nullable=False),
            sa.Column("nonce", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("owner", "nonce"),
        )
    if "orders" not in tables:
        op.create_table(
            "orders",
            sa.Column("side", sa.String(length=3), nullable=False),
            sa.Column("owner", sa.String(length=42), nullable=False),
            sa.Column("device_class", sa.String(length=64), nullable=False),
            sa.Column("quantity", sa.BigInteger(), nullable=False),
            sa.Column("price", sa.BigInteger(), nullable=False),
            sa.Column("plan", sa.String(length=64), nullable=False),
            sa.Column("slo_ms", sa.BigInteger(), nullable=False),
            sa.Column("memory", sa.BigInteger(), nullable=False),
            sa.Column("expiry", sa.BigInteger(), nullable=False),
            sa.Column("nonce", sa.BigInteger(), nullable=False),
            sa.Column("order_id", sa.String(length=66), nullable=False),
            sa.Column("seq", sa.BigInteger(), nullable=False),
            sa.Column("state", sa.String(length=20), nullable=False),
            sa.Column("remaining", sa.BigInteger(), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("signature", sa.String(length=132), nullable=False),
            sa.Column("quote_json", sa.Text(), nullable=True),
            sa.Column("quote_signature", sa.String(length=132), nullable=True),
            sa.Column("quote_hash", sa.String(length=66), nullable=True),
            sa.PrimaryKeyConstraint("order_id"),
            sa.UniqueConstraint("device_class", "seq", name="uq_orders_class_seq"),
        )
    op.create_index(
        "ix_orders_class_state",
        "orders",
        ["device_class", "state"],
        unique=False,
        if_not_exists=True,
    )
    op.create_index(
        "uq_orders_owner_nonce", "orders", ["owner", "nonce"], unique=True, if_not_exists=True
    )
    if "provider_clients" not in tables:
        op.create_table(
            "provider_clients",
            sa.Column("provider", sa.String(length=42), nullable=False),
            sa.Column("client", sa.String(length=42), nullable=False),
            sa.Column("deals", sa.BigInteger(), nullable=False),
            sa.Column("paid", sa.String(length=80), nullable=False),
            sa.Column("refunded", sa.String(length=80), nullable=False),
            sa.Column("penalties", sa.String(length=80), nullable=False),
            sa.Column("refunds", sa.BigInteger(), nullable=False),
            sa.Column("disputes_won", sa.BigInteger(), nullable=False),
            sa.Column("disputes_lost", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("provider", "client"),
        )
    if "providers" not in tables:
        op.create_table(
            "providers",
            sa.Column("address", sa.String(length=42), nullable=False),
            sa.Column("device_class", sa.String(length=64), nullable=False),
            sa.Column("device_kind", sa.String(length=64), nullable=False),
            sa.Column("device_count", sa.BigInteger(), nullable=False),
            sa.Column("price", sa.BigInteger(), nullable=False),
            sa.Column("throughput", sa.Float(), nullable=False),
            sa.Column("capacity", sa.BigInteger(), nullable=False),
            sa.Column("endpoint", sa.String(length=256), nullable=False),
            sa.Column("last_seen", sa.Float(), nullable=False),
            sa.Column("online", sa.Boolean(), nullable=False),
            sa.Column("heartbeat_ts", sa.BigInteger(), nullable=False),
            sa.Column("advert_json", sa.Text(), nullable=False),
            sa.PrimaryKeyConstraint("address"),
        )
    # Live orders by owner, for the funds check (`market.funds`): a partial index, so it holds
    # only resting orders and an owner's history is never scanned.
    op.create_index(
        "ix_orders_owner_live",
        "orders",
        ["owner"],
        unique=False,
        if_not_exists=True,
        sqlite_where=sa.text("state IN ('open', 'partially_filled')"),
        postgresql_where=sa.text("state IN ('open', 'partially_filled')"),
    )


def downgrade() -> None:
    """Drop every table."""
    for table in (
        "provider_clients",
        "providers",
        "orders",
        "nonces",
        "indexer_state",
        "fills",
        "deals",
        "chain_events",
        "chain_deals",
    ):
        op.drop_table(table)
