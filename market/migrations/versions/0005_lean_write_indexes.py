"""Fewer index entries written per order: a deal's quote-hash index holds only attached quotes,
and the fills' class-only index (a prefix of the class+seq one) goes.

Every deal the matcher writes has no quote attached yet (`quote_json` NULL), and the only
queries by quote hash look for attached ones (`storage.quote_attached_elsewhere`,
`chain_index.link_chain_deal`): a partial index serves both, and a deal enters it when its
quote is attached, not when it is made (a random B-tree page a deal less on the placement
path). Figures: docs/benchmarks.md, "Index entries a placement writes".

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels = None
depends_on = None

ATTACHED = sa.text("quote_json IS NOT NULL")


def upgrade() -> None:
    """Make `ix_deals_quote_hash` partial; drop `ix_fills_device_class`."""
    op.drop_index("ix_deals_quote_hash", table_name="deals", if_exists=True)
    op.create_index(
        "ix_deals_quote_hash",
        "deals",
        ["quote_hash"],
        unique=False,
        sqlite_where=ATTACHED,
        postgresql_where=ATTACHED,
    )
    op.drop_index("ix_fills_device_class", table_name="fills", if_exists=True)


def downgrade() -> None:
    """Bring back the full quote-hash index and the fills' class index."""
    op.drop_index("ix_deals_quote_hash", table_name="deals")
    op.create_index("ix_deals_quote_hash", "deals", ["quote_hash"], unique=False)
    op.create_index("ix_fills_device_class", "fills", ["device_class"], unique=False)
