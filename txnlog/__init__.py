"""Postgres transaction log that fences sink replicas by epoch and makes Iceberg commits resumable.

Knows nothing of Spark, Kafka or Iceberg. See docs/txnlog.md.
"""

from txnlog.errors import (
    Fenced,
    InvalidPhase,
    LockLost,
    LockTimeout,
    SchemaVersionError,
    SinkNotFound,
    TxnLogError,
    Unavailable,
)
from txnlog.log import CommitHandle, TransactionLog
from txnlog.model import Action, HistoryEntry, Lease, Phase, SinkState
from txnlog.retry import RetryPolicy
from txnlog.schema import LATEST_VERSION as SCHEMA_VERSION
from txnlog.settings import SessionSettings

__all__ = [
    "SCHEMA_VERSION",
    "Action",
    "CommitHandle",
    "Fenced",
    "HistoryEntry",
    "InvalidPhase",
    "Lease",
    "LockLost",
    "LockTimeout",
    "Phase",
    "RetryPolicy",
    "SchemaVersionError",
    "SessionSettings",
    "SinkNotFound",
    "SinkState",
    "TransactionLog",
    "TxnLogError",
    "Unavailable",
]
