"""Structured logs: one JSON object per line on stderr."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Final

_STANDARD: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    """Format a record as JSON: time, level, logger, message and every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one JSON line."""
        data: dict[str, Any] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure_logging(level: str = "INFO", *, scheduler: bool = False) -> None:
    """Send the ``provider`` loggers (and uvicorn's) to stderr as JSON lines.

    The job scheduler's own lines (a line per job run, and "maximum number of running
    instances reached" where the daemon logs what it means) show only with ``scheduler``
    (config ``log_scheduler = true``); its errors always do.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("provider", "uvicorn", "uvicorn.error", "apscheduler"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper() if scheduler or name != "apscheduler" else logging.ERROR)
        logger.propagate = False
