"""Connection and session settings: the knobs that bound how long a lock can outlive its holder.

A writer inside :meth:`TransactionLog.committing` holds the sink row locked while it talks to
Iceberg, so its session sits *idle in transaction*. If the writer dies the lock must go away on
its own. Three mechanisms cover the three ways a writer can die:

* process killed, host alive: the kernel closes the socket, the backend reads EOF and rolls back
  at once (no setting needed);
* process hung (stopped, deadlocked, GC pause): ``idle_in_transaction_session_timeout`` ends the
  session after ``idle_in_transaction_timeout``;
* host or network gone: the server's TCP keepalives (``tcp_keepalives_*``) and
  ``tcp_user_timeout`` notice the silent peer after roughly
  ``keepalives_idle + keepalives_interval * keepalives_count``.

The same keepalive values are given to libpq so the *client* also notices a dead server instead of
hanging. ``lock_timeout`` bounds how long a claimer waits for the row before it gets a retryable
:class:`~txnlog.errors.LockTimeout`; ``statement_timeout`` bounds any single statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any


def _ms(value: timedelta) -> int:
    return max(0, round(value.total_seconds() * 1000))


def _s(value: timedelta) -> int:
    """Whole seconds, at least 1 (keepalive settings have second granularity; 0 means OS default)."""
    return max(1, round(value.total_seconds()))


@dataclass(frozen=True)
class SessionSettings:
    """Timeouts applied to every connection of a :class:`~txnlog.TransactionLog`."""

    lock_timeout: timedelta = timedelta(seconds=10)
    idle_in_transaction_timeout: timedelta = timedelta(seconds=60)
    statement_timeout: timedelta = timedelta(seconds=30)
    connect_timeout: timedelta = timedelta(seconds=10)
    keepalives_idle: timedelta = timedelta(seconds=10)
    keepalives_interval: timedelta = timedelta(seconds=5)
    keepalives_count: int = 3
    tcp_user_timeout: timedelta = timedelta(seconds=30)
    application_name: str = "icesink"

    def __post_init__(self) -> None:
        for name in ("lock_timeout", "idle_in_transaction_timeout", "statement_timeout"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name} must be positive (0 would mean 'no limit' to Postgres)")
        if self.keepalives_count < 1:
            raise ValueError("keepalives_count must be at least 1")

    @property
    def dead_peer_bound(self) -> timedelta:
        """Roughly how long the server needs to notice a vanished client host via keepalives."""
        probes = self.keepalives_idle + self.keepalives_interval * self.keepalives_count
        return min(probes, self.tcp_user_timeout) if self.tcp_user_timeout > timedelta(0) else probes

    def connect_args(self) -> dict[str, Any]:
        """libpq parameters: client-side keepalives and connect timeout."""
        return {
            "application_name": self.application_name,
            "connect_timeout": _s(self.connect_timeout),
            "keepalives": 1,
            "keepalives_idle": _s(self.keepalives_idle),
            "keepalives_interval": _s(self.keepalives_interval),
            "keepalives_count": self.keepalives_count,
            "tcp_user_timeout": _ms(self.tcp_user_timeout),
        }

    def session_gucs(self) -> dict[str, str]:
        """Server-side settings, applied with ``SET`` right after connecting.

        ``SET`` (rather than the libpq ``options`` startup parameter) also works through poolers
        such as PgBouncer that refuse unknown startup parameters.
        """
        return {
            "lock_timeout": f"{_ms(self.lock_timeout)}ms",
            "idle_in_transaction_session_timeout": f"{_ms(self.idle_in_transaction_timeout)}ms",
            "statement_timeout": f"{_ms(self.statement_timeout)}ms",
            "tcp_keepalives_idle": str(_s(self.keepalives_idle)),
            "tcp_keepalives_interval": str(_s(self.keepalives_interval)),
            "tcp_keepalives_count": str(self.keepalives_count),
            "tcp_user_timeout": str(_ms(self.tcp_user_timeout)),
            "application_name": self.application_name,
        }
