"""Which database errors are transient, and the bounded backoff used to retry them.

Only errors where the operation *may* succeed if simply run again are retried: lost connections
(Postgres restart, failover, network reset), admin/crash shutdown, "starting up", too many
connections, serialization failures and deadlocks. Authentication failures, missing databases,
constraint violations and programming errors are not: retrying them only delays a clear message.

Retrying is safe because every write re-reads the row under ``FOR UPDATE`` and decides again (see
``transitions.py``), so an attempt whose COMMIT reached the server but whose acknowledgement was
lost is recognised rather than applied twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import psycopg
from sqlalchemy import exc as sa_exc
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

T = TypeVar("T")

# SQLSTATEs worth another attempt.
TRANSIENT_SQLSTATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "57P01",  # admin_shutdown (fast/smart shutdown, pg_terminate_backend)
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up / shutting down)
        "53300",  # too_many_connections
        "25P03",  # idle_in_transaction_session_timeout (our own session was reaped)
        "08000",
        "08003",
        "08006",
        "08001",
        "08004",  # connection exceptions
    }
)
LOCK_NOT_AVAILABLE = "55P03"
QUERY_CANCELED = "57014"  # statement_timeout

# Connection failures carry no SQLSTATE in psycopg; these message fragments mark the permanent ones.
_PERMANENT_CONNECT_FRAGMENTS = (
    "authentication failed",
    "does not exist",
    "pg_hba.conf",
    "no password supplied",
    "password is required",
    "permission denied",
)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter; stops at whichever limit comes first."""

    max_attempts: int = 30
    deadline: timedelta = timedelta(seconds=60)
    initial_backoff: timedelta = timedelta(milliseconds=50)
    max_backoff: timedelta = timedelta(seconds=2)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")


def driver_error(exc: BaseException) -> BaseException | None:
    """The psycopg exception behind ``exc`` (SQLAlchemy wraps it), if any."""
    if isinstance(exc, sa_exc.DBAPIError):
        return exc.orig
    if isinstance(exc, psycopg.Error):
        return exc
    return None


def sqlstate(exc: BaseException) -> str | None:
    orig = driver_error(exc)
    return getattr(orig, "sqlstate", None) if orig is not None else None


def is_lock_timeout(exc: BaseException) -> bool:
    return sqlstate(exc) == LOCK_NOT_AVAILABLE


def is_transient(exc: BaseException) -> bool:
    """True when running the same operation again may succeed."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    orig = driver_error(exc)
    if orig is None:
        # SQLAlchemy-level disconnects (e.g. pool pre-ping gave up) surface without a driver error.
        return isinstance(exc, sa_exc.DisconnectionError)
    state = getattr(orig, "sqlstate", None)
    if state is not None:
        return state in TRANSIENT_SQLSTATES or state.startswith("08")
    if isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
        message = str(orig).lower()
        return not any(fragment in message for fragment in _PERMANENT_CONNECT_FRAGMENTS)
    return False


def run_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    describe: Callable[[BaseException], str],
    logger: logging.Logger,
) -> T:
    """Call ``fn`` until it succeeds, raises a non-transient error, or the policy runs out.

    On exhaustion the last transient exception is re-raised for the caller to translate.
    ``describe`` renders an exception for the log without secrets.
    """

    def before_sleep(state: RetryCallState) -> None:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        sleep = state.next_action.sleep if state.next_action is not None else 0.0
        logger.warning(
            "transient database error (attempt %d, retrying in %.2fs): %s",
            state.attempt_number,
            sleep,
            describe(exc) if exc is not None else "?",
        )

    retrying = Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(policy.max_attempts) | stop_after_delay(policy.deadline.total_seconds()),
        # Exponential from initial_backoff up to max_backoff, plus up to initial_backoff of jitter so
        # replicas that lost the same server do not reconnect in lockstep.
        wait=wait_exponential(
            multiplier=policy.initial_backoff.total_seconds(), max=policy.max_backoff.total_seconds()
        )
        + wait_random(0, policy.initial_backoff.total_seconds()),
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(fn)
