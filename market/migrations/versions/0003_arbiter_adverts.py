"""Arbiters advertise on the market: the latest signed advert of each arbiter (`market.arbiters`).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the `arbiters` table."""
    if "arbiters" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "arbiters",
        sa.Column("address", sa.String(length=42), nullable=False),
        sa.Column("advert_ts", sa.BigInteger(), nullable=False),
        sa.Column("advert_json", sa.Text(), nullable=False),
        sa.Column("signature", sa.String(length=132), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("address"),
    )


def downgrade() -> None:
    """Drop the `arbiters` table."""
    op.drop_table("arbiters")
