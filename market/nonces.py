"""The (signer, nonce) pairs the writer has seen used, and the SQL lookup behind them.

An order's pair is remembered until the order's expiry (a later copy of the signed order is
refused as expired before any nonce is looked up), a cancel's for good; a pair forgotten since
is still caught by the unique (owner, nonce) index, and looked up with `nonce_stored`.
"""

from __future__ import annotations

import heapq

from sqlalchemy.engine import Connection


class UsedNonces:
    """Used (signer, nonce) pairs: an order's until its expiry, a cancel's for good."""

    def __init__(self) -> None:
        self._expiry: dict[tuple[str, int], int | None] = {}  # None: kept for good
        self._due: dict[int, list[tuple[str, int]]] = {}  # expiry -> pairs
        self._heap: list[int] = []

    @classmethod
    def load(cls, connection: Connection, now: int) -> UsedNonces:
        """Return the pairs of stored orders still live at `now` and of every stored cancel."""
        nonces = cls()
        rows = connection.exec_driver_sql(
            f"SELECT owner, nonce, expiry FROM orders WHERE expiry > {int(now)} "
            "UNION ALL SELECT owner, nonce, NULL FROM nonces"
        )
        for owner, nonce, expiry in rows:
            nonces.claim(owner, nonce, expiry)
        return nonces

    def __len__(self) -> int:
        return len(self._expiry)

    def remembers(self, owner: str, nonce: int) -> bool:
        """Return whether the pair is remembered as used."""
        return (owner, nonce) in self._expiry

    def claim(self, owner: str, nonce: int, expiry: int | None) -> None:
        """Remember a pair until `expiry` (None: for good)."""
        pair = (owner, nonce)
        held = self._expiry.get(pair, 0)
        if held is None or (expiry is not None and expiry <= held):
            return
        self._expiry[pair] = expiry
        if expiry is not None:
            due = self._due.get(expiry)
            if due is None:
                self._due[expiry] = [pair]
                heapq.heappush(self._heap, expiry)
            else:
                due.append(pair)

    def forget(self, now: int) -> None:
        """Forget orders' pairs whose expiry is `now` or earlier."""
        heap, due, expiry_of = self._heap, self._due, self._expiry
        while heap and heap[0] <= now:
            expiry = heapq.heappop(heap)
            for pair in due.pop(expiry):
                if expiry_of.get(pair, 0) == expiry:
                    del expiry_of[pair]


def nonce_stored(connection: Connection, pairs: list[tuple[str, int]]) -> bool:
    """Return whether an order or a cancel stored in SQL used one of `pairs`."""
    mark = "?" if connection.dialect.paramstyle == "qmark" else "%s"
    for owner, nonce in pairs:
        row = connection.exec_driver_sql(
            f"SELECT 1 FROM orders WHERE owner = {mark} AND nonce = {mark} "
            f"UNION ALL SELECT 1 FROM nonces WHERE owner = {mark} AND nonce = {mark}",
            (owner, nonce, owner, nonce),
        ).first()
        if row is not None:
            return True
    return False
