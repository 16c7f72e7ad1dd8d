"""The books of every device class, restored from SQL: one engine and one lock per class."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from sqlalchemy.engine import Engine
from sqlmodel import Session

from market import storage
from market.engine import MatchingEngine


class ClassBook:
    """One device class: its engine, the lock readers and the writer share, asks' quote hashes."""

    def __init__(self, engine: MatchingEngine, quote_hashes: dict[str, str]) -> None:
        """Hold a restored engine and the quote hash of each of its asks."""
        self.engine = engine
        self.lock = threading.Lock()
        self.quote_hashes = quote_hashes


class Books:
    """Every device class's book; a class is restored from storage the first time it is used."""

    def __init__(
        self, db: Engine, now: Callable[[], int], owns: Callable[[str], bool] | None = None
    ) -> None:
        """Restore every class that has stored orders (those `owns` names, if given), as
        remembered at `now()`."""
        self._db = db
        self._now = now
        self._classes: dict[str, ClassBook] = {}
        self._lock = threading.Lock()
        with Session(db) as session:
            for name in storage.device_classes(session=session):
                if owns is not None and not owns(name):
                    continue
                self._classes[name] = _restore(session, name, now())

    def get(self, name: str) -> ClassBook:
        """Return a class's book, creating (restoring) it if this process has not used it yet."""
        book = self._classes.get(name)
        if book is None:
            with self._lock:
                book = self._classes.get(name)
                if book is None:
                    with Session(self._db) as session:
                        book = self._classes[name] = _restore(session, name, self._now())
        return book

    def find(self, name: str) -> ClassBook | None:
        """Return a class's book, or None if it has none."""
        return self._classes.get(name)

    def items(self) -> list[tuple[str, ClassBook]]:
        """Return (class, book) pairs, sorted by class."""
        return sorted(self._classes.items())

    def names(self) -> list[str]:
        """Return the classes with a book, sorted."""
        return sorted(self._classes)

    def rebuild(self, names: Sequence[str]) -> None:
        """Reload classes from storage after a failed write (call with their locks held)."""
        with Session(self._db) as session:
            for name in names:
                fresh = _restore(session, name, self._now())
                book = self._classes[name]
                book.engine = fresh.engine
                book.quote_hashes = fresh.quote_hashes


def _restore(session: Session, name: str, now: int) -> ClassBook:
    snapshot = storage.load_snapshot(session=session, device_class=name, now=now)
    engine = MatchingEngine.restore(snapshot)  # type: ignore[arg-type]
    quote_hashes = storage.ask_quote_hashes(session=session, device_class=name, now=now)
    return ClassBook(engine, quote_hashes)
