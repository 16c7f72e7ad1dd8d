"""SQLite WAL checkpoints in a background thread, so that no commit waits for one.

In WAL mode SQLite copies the log back into the database file (a checkpoint: the log synced,
its pages copied, the database file synced) inside whichever commit crosses the size threshold,
which stalls that commit and every request waiting on it. This thread runs a PASSIVE checkpoint
a few times a second instead; PASSIVE never blocks the writer or readers. Durability is
unchanged: a commit is in the log before it is answered.

A checkpoint by another connection cannot finish while the writer keeps appending: what the
writer committed during it is still to copy, so the log never starts over and grows without
end. Only a checkpoint on the writer's own connection, between two of its commits, copies
everything. So after each checkpoint here, which did the bulk of the copying and syncing, the
writer is told (`on_checkpoint`: `market.writer.Writer.checkpoint_soon`) and, once it has
answered its current group, checkpoints the little appended meanwhile; its next commit then
starts the log over. The writer's own automatic checkpoint is only a backstop
(`market.writer.WRITER_AUTOCHECKPOINT_PAGES`): at 10,000 pages (about 40 MB, a third of a
second of a busy market's log) it ran inside the writer's commit whenever the log passed
that, copying what this thread had not reached and syncing both files there.
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

    def __init__(
        self,
        db: Engine,
        changes: Callable[[], int],
        every_s: float = 0.25,
        on_checkpoint: Callable[[], None] | None = None,
    ) -> None:
        """Start the thread (only call this for SQLite engines); `on_checkpoint` (if given) is
        called after each checkpoint that ran (see the module docstring)."""
        self._db = db
        self._changes = changes
        self._every_s = every_s
        self._on_checkpoint = on_checkpoint
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
        """Run one PASSIVE checkpoint, then call `on_checkpoint`; log (and retry at the next
        tick) if it fails."""
        try:
            with self._db.connect() as connection:
                connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
        except SQLAlchemyError as exc:
            log.warning("WAL checkpoint failed: %s", exc)
            return
        if self._on_checkpoint is not None:
            self._on_checkpoint()
