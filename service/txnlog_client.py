"""One way to open the sink's transaction log, so every command waits and times out alike.

The running sink and the operator commands (status, check, reseed, abandon, offsets, orphans) all
take the row lock or read the row; with one factory they share ``txnlog.lock_timeout`` and
``txnlog.session_timeout`` instead of the library's defaults, and each shows up in
``pg_stat_activity`` under a name saying what it is.
"""

from __future__ import annotations

from datetime import timedelta

from service.config import SinkConfig
from txnlog import TransactionLog


def open_txnlog(config: SinkConfig, role: str, lock_timeout: timedelta | None = None) -> TransactionLog:
    """The sink's txnlog; ``role`` ("run", "status", "reseed", ...) names the connection in Postgres.
    ``lock_timeout`` replaces ``txnlog.lock_timeout`` for a role that would rather give up sooner."""
    return TransactionLog(
        config.txnlog.dsn,
        schema=config.txnlog.schema_name,
        lock_timeout=lock_timeout or config.txnlog.lock_timeout,
        idle_in_transaction_timeout=config.txnlog.session_timeout,
        application_name=f"icesink {role}:{config.sink_id}",
    )
