"""Replay protection for (signer, nonce) pairs, kept on disk: the lookup behind the writer.

Every order claims its pair in its own row (unique index `(owner, nonce)` on `orders`), every
cancel in the `nonces` table (the same index). The writer holds no pair in memory: before it
matches a group it asks, in one indexed query, which of the group's pairs are stored
(`stored_pairs`). So memory does not grow with the history, a restart loads no pair, and a
used nonce is refused before any engine changes (the unique indexes stay the backstop).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Connection

MAX_PAIRS_PER_QUERY = 200
"""Pairs looked up per statement (bounded parameters; each pair is one index probe)."""


def stored_pairs(
    connection: Connection, pairs: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], str | None]:
    """Return the pairs of `pairs` an order or a cancel stored in SQL used, each with the id of
    the order that used it (None: a cancel)."""
    found: dict[tuple[str, int], str | None] = {}
    mark = "?" if connection.dialect.paramstyle == "qmark" else "%s"
    unique = sorted(set(pairs))
    for start in range(0, len(unique), MAX_PAIRS_PER_QUERY):
        chunk = unique[start : start + MAX_PAIRS_PER_QUERY]
        terms = " OR ".join([f"(owner = {mark} AND nonce = {mark})"] * len(chunk))
        params = tuple(v for pair in chunk for v in pair)
        rows = connection.exec_driver_sql(
            f"SELECT owner, nonce, order_id FROM orders WHERE {terms} "
            f"UNION ALL SELECT owner, nonce, NULL FROM nonces WHERE {terms}",
            params + params,
        )
        for owner, nonce, order_id in rows:
            found.setdefault((owner, int(nonce)), order_id)
    return found


def nonce_stored(connection: Connection, pairs: Sequence[tuple[str, int]]) -> bool:
    """Return whether an order or a cancel stored in SQL used one of `pairs`."""
    return bool(stored_pairs(connection, pairs))
