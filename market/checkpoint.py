"""SQLite WAL checkpoints in a background thread, so that no commit waits for one.

In WAL mode SQLite copies the log back into the database file (a checkpoint, with an fsync)
inside whichever commit crosses the size threshold, which stalls that commit and every request
waiting on it. The market raises the threshold to a backstop (`database.make_engine`) and this
thread runs a PASSIVE checkpoint a few times a second instead; PASSIVE never blocks the writer
or readers. Durability is unchanged: a commit is in the log before it is answered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from services.threads import name_os_thread

log = logging.getLogger(__name__)


class Checkpointer:
    """Checkpoint a SQLite database every `every_s` seconds while `changes()` keeps growing."""

    def __init__(self, db: Engine, changes: Callable[[], int], every_s: float = 0.25) -> None:
        """Start the thread (only call this for SQLite engines)."""
        self._db = db
        self._changes = changes
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="market-checkpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread after a last checkpoint."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        name_os_thread(self._thread.name)
        seen = self._changes()
        while True:
            stopping = self._stop.wait(self._every_s)
            changes = self._changes()
            if changes != seen:
                seen = changes
                self.checkpoint()
            if stopping:
                return

    def checkpoint(self) -> None:
        """Run one PASSIVE checkpoint; log (and retry at the next tick) if it fails."""
        try:
            with self._db.connect() as connection:
                connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
        except SQLAlchemyError as exc:
            log.warning("WAL checkpoint failed: %s", exc)
