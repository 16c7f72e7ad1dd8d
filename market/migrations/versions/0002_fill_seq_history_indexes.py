"""Fills get a global commit order (`seq`), numbered for the rows already stored in the order of
(time, class, fill id), the best the old rows tell; the queries over history get their indexes.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels = None
depends_on = None

# The queries of the page and the API over tables that grow with history, each served by an
# index so its cost follows the rows it returns, not the rows ever stored: an owner's and a
# class's orders newest first (`storage.list_orders`), a class's fills newest first and since
# a time (`market.tape`), the last fill id of a class (`storage.load_snapshot`), deals newest
# first (`storage.list_deals`).
HISTORY_INDEXES = (
    ("ix_orders_owner_created", "orders", ["owner", "created_at"]),
    ("ix_orders_class_created", "orders", ["device_class", "created_at"]),
    ("ix_orders_created", "orders", ["created_at"]),
    ("ix_fills_class_seq", "fills", ["device_class", "seq"]),
    ("ix_fills_class_time", "fills", ["device_class", "time"]),
    ("ix_fills_class_fill_id", "fills", ["device_class", "fill_id"]),
    ("ix_deals_created", "deals", ["created_at"]),
)


def upgrade() -> None:
    """Add and number `fills.seq`; create the history indexes (a database the last market
    without migrations wrote has both: it is left as it is)."""
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("fills")}
    if "seq" not in have:
        op.add_column("fills", sa.Column("seq", sa.BigInteger(), nullable=True))
        op.execute(
            "UPDATE fills SET seq = r.n FROM (SELECT id, ROW_NUMBER() OVER "
            "(ORDER BY time, device_class, fill_id) AS n FROM fills) AS r WHERE fills.id = r.id"
        )
    op.create_index("ix_fills_seq", "fills", ["seq"], unique=False, if_not_exists=True)
    for name, table, columns in HISTORY_INDEXES:
        op.create_index(name, table, columns, unique=False, if_not_exists=True)


def downgrade() -> None:
    """Drop the history indexes and `fills.seq`."""
    for name, table, _columns in HISTORY_INDEXES:
        op.drop_index(name, table_name=table)
    op.drop_index("ix_fills_seq", table_name="fills")
    with op.batch_alter_table("fills") as batch:
        batch.drop_column("seq")
