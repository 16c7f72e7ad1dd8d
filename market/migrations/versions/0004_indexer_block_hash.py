"""The chain indexer keeps the hash of the last block it indexed, to see a reorg under it.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add `indexer_state.block_hash` (unknown for positions recorded before it)."""
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("indexer_state")}
    if "block_hash" in columns:
        return
    with op.batch_alter_table("indexer_state") as batch:
        batch.add_column(sa.Column("block_hash", sa.String(length=66), nullable=True))


def downgrade() -> None:
    """Drop `indexer_state.block_hash`."""
    with op.batch_alter_table("indexer_state") as batch:
        batch.drop_column("block_hash")
