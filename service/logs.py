"""Logging set-up: plain text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from service.config import LogConfig


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            entry.update(extra)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(config: LogConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level.upper())
    # Chatty libraries stay at WARNING unless asked for DEBUG. py4j always does: at DEBUG it logs
    # every call to the JVM, thousands per batch, and the logging alone slowed a batch by seconds.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if config.level.upper() != "DEBUG":
        for name in ("pyiceberg", "urllib3", "botocore", "s3fs", "fsspec"):
            logging.getLogger(name).setLevel(logging.WARNING)
