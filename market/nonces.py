"""Replay protection for (signer, nonce) pairs, kept on disk: the lookup behind the writer.

Every order claims its pair in its own row (unique index `(owner, nonce)` on `orders`), every
cancel in the `nonces` table (the same index). The writer holds no pair in memory: before it
matches a group it asks, in one indexed query, which of the group's pairs are stored
(`stored_pairs`). So memory does not grow with the history, a restart loads no pair, and a
used nonce is refused before any engine changes (the unique indexes stay the backstop).

Signers count their nonces up, so most pairs lie above every nonce their signer ever stored.
`NonceMarks` keeps, for the signers seen lately (a bounded number), a mark at or above the
highest nonce each has stored: a pair above its signer's mark cannot be stored and needs no
lookup; only pairs at or below it are looked up. A mark is read from SQL when its signer is
first seen (one index probe per table) and raised before the commit of every order and cancel
the writer stores, so it can be too high (a rolled-back group: one lookup more), never too low.
That needs every pair of the database written through this writer: processes that share a
database (`market.partition`) keep no marks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from sqlalchemy.engine import Connection

from market.storage import placeholder

MAX_PAIRS_PER_QUERY = 200
"""Pairs looked up per statement (bounded parameters; each pair is one index probe)."""


def stored_pairs(
    connection: Connection, pairs: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], str | None]:
    """Return the pairs of `pairs` an order or a cancel stored in SQL used, each with the id of
    the order that used it (None: a cancel)."""
    found: dict[tuple[str, int], str | None] = {}
    mark = placeholder(connection)
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


MAX_MARKED_SIGNERS = 16_384
"""Signers whose marks `NonceMarks` keeps (the least recently seen is forgotten first; its
mark is read from SQL again when it comes back)."""

_NONE = -1
"""The mark of a signer that stored no nonce (nonces are 0 or more)."""


class NonceMarks:
    """For each signer seen lately, a nonce at or above the highest it stored (module doc)."""

    def __init__(self, capacity: int | None = None) -> None:
        """Keep at most `capacity` marks (default `MAX_MARKED_SIGNERS`)."""
        self._marks: OrderedDict[str, int] = OrderedDict()
        self._capacity = MAX_MARKED_SIGNERS if capacity is None else capacity

    def to_look_up(
        self, connection: Connection, pairs: Sequence[tuple[str, int]]
    ) -> list[tuple[str, int]]:
        """Return the pairs of `pairs` that may be stored (at or below their signer's mark),
        reading from SQL the marks of signers not seen lately."""
        marks = self._marks
        known = {owner: marks[owner] for owner, _ in pairs if owner in marks}
        unknown = sorted({owner for owner, _ in pairs} - known.keys())
        if unknown:
            read = highest_nonces(connection, unknown)
            for owner in unknown:
                known[owner] = read.get(owner, _NONE)
        for owner, mark in known.items():
            self._keep(owner, mark)
        return [(owner, nonce) for owner, nonce in pairs if nonce <= known[owner]]

    def raise_to(self, pairs: Iterable[tuple[str, int]]) -> None:
        """Raise the marks of signers whose pairs are about to be stored (call before the
        commit). A signer without a mark keeps none: SQL gives it when the signer is next seen."""
        marks = self._marks
        for owner, nonce in pairs:
            mark = marks.get(owner)
            if mark is not None and nonce > mark:
                marks[owner] = nonce

    def _keep(self, owner: str, mark: int) -> None:
        marks = self._marks
        marks[owner] = max(mark, marks.get(owner, _NONE))
        marks.move_to_end(owner)
        if len(marks) > self._capacity:
            marks.popitem(last=False)


def highest_nonces(connection: Connection, owners: Sequence[str]) -> dict[str, int]:
    """Return the highest nonce each of `owners` stored in an order or a cancel (absent: none),
    two index probes per signer."""
    mark = placeholder(connection)
    found: dict[str, int] = {}
    per_statement = MAX_PAIRS_PER_QUERY // 2
    for start in range(0, len(owners), per_statement):
        chunk = owners[start : start + per_statement]
        parts = [
            f"SELECT owner, nonce FROM (SELECT owner, nonce FROM {table} WHERE owner = {mark} "
            f"ORDER BY nonce DESC LIMIT 1) AS h{i}"
            for i, table in enumerate(("orders", "nonces") * len(chunk))
        ]
        params = tuple(owner for owner in chunk for _ in range(2))
        for owner, nonce in connection.exec_driver_sql(" UNION ALL ".join(parts), params):
            found[owner] = max(int(nonce), found.get(owner, _NONE))
    return found
