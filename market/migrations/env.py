"""The Alembic environment of the market's database: migrations run on the connection the
market passes in (`market.database.init_db`), never from a URL of their own."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

from market import models as models  # the tables of `SQLModel.metadata`

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError("market migrations run through market.database.init_db, on its connection")
context.configure(connection=connection, target_metadata=SQLModel.metadata)
with context.begin_transaction():
    context.run_migrations()
