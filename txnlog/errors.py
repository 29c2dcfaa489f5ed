"""Errors raised by the transaction log.

Every error derives from :class:`TxnLogError`, so a caller can catch the family in one place.
The split that matters to a caller is *what to do next*:

* :class:`Fenced` — another replica claimed the sink; stop, never retry the write.
* :class:`LockTimeout` — the row stayed locked (a writer is inside ``committing``) longer than
  ``lock_timeout``; safe to retry later (``retryable`` is true).
* :class:`LockLost` — inside ``committing``, the locked session died; stop and resume by recovery.
* :class:`Unavailable` — transient database errors outlasted the retry policy; safe to retry later.
* :class:`InvalidPhase` — the call does not fit the row's phase (a caller bug or a stale plan).
* :class:`SchemaVersionError` — the database schema is newer than this code understands.
"""

from __future__ import annotations


class TxnLogError(Exception):
    """Base class of every transaction-log error."""

    retryable: bool = False


class Fenced(TxnLogError):
    """The lease's epoch is no longer the sink's live epoch: a newer claim took over.

    The row was not changed. The replica holding the stale lease must stop writing.
    """

    def __init__(self, sink_id: str, lease_epoch: int, current_epoch: int, current_owner: str | None) -> None:
        self.sink_id = sink_id
        self.lease_epoch = lease_epoch
        self.current_epoch = current_epoch
        self.current_owner = current_owner
        owner = f" (owner {current_owner!r})" if current_owner is not None else ""
        super().__init__(
            f"sink {sink_id!r}: lease epoch {lease_epoch} is fenced; epoch {current_epoch}{owner} took over"
        )

    def __reduce__(self) -> tuple[type[Fenced], tuple[str, int, int, str | None]]:
        return (type(self), (self.sink_id, self.lease_epoch, self.current_epoch, self.current_owner))


class LockTimeout(TxnLogError):
    """The sink row stayed locked longer than ``lock_timeout``.

    Normally another session is inside :meth:`TransactionLog.committing`; a dead writer's lock is
    released once Postgres notices the dead session (see docs/txnlog.md), so retrying later is safe.
    """

    retryable = True

    def __init__(self, sink_id: str, operation: str, lock_timeout_s: float) -> None:
        self.sink_id = sink_id
        self.operation = operation
        self.lock_timeout_s = lock_timeout_s
        super().__init__(
            f"sink {sink_id!r}: {operation} could not lock the sink row within {lock_timeout_s:g}s "
            "(another session holds it, most likely a writer inside committing); retry later"
        )

    def __reduce__(self) -> tuple[type[LockTimeout], tuple[str, str, float]]:
        return (type(self), (self.sink_id, self.operation, self.lock_timeout_s))


class LockLost(TxnLogError):
    """The session holding the row lock inside ``committing`` is gone (timeout, restart, network).

    Raised by :meth:`CommitHandle.heartbeat`. Nothing was flipped: the plan stays ``precommit``, and
    another replica may claim the sink now, so the caller should stop before (another) Iceberg commit
    attempt and resume through recovery.
    """

    retryable = True

    def __init__(self, sink_id: str, detail: str) -> None:
        self.sink_id = sink_id
        self.detail = detail
        super().__init__(f"sink {sink_id!r}: lost the row lock held for the commit: {detail}")

    def __reduce__(self) -> tuple[type[LockLost], tuple[str, str]]:
        return (type(self), (self.sink_id, self.detail))


class InvalidPhase(TxnLogError):
    """The operation does not apply to the sink's current phase (e.g. commit with nothing pending)."""

    def __init__(self, sink_id: str, operation: str, detail: str) -> None:
        self.sink_id = sink_id
        self.operation = operation
        self.detail = detail
        super().__init__(f"sink {sink_id!r}: cannot {operation}: {detail}")

    def __reduce__(self) -> tuple[type[InvalidPhase], tuple[str, str, str]]:
        return (type(self), (self.sink_id, self.operation, self.detail))


class SinkNotFound(TxnLogError):
    """The sink has no row (it was never claimed)."""

    def __init__(self, sink_id: str) -> None:
        self.sink_id = sink_id
        super().__init__(f"sink {sink_id!r} does not exist; claim it first")

    def __reduce__(self) -> tuple[type[SinkNotFound], tuple[str]]:
        return (type(self), (self.sink_id,))


class SchemaVersionError(TxnLogError):
    """The database holds a schema version this code does not know (written by newer code)."""


class Unavailable(TxnLogError):
    """Transient database errors persisted past the retry policy; the operation may be retried."""

    retryable = True
