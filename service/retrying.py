"""Trying again what may succeed when run again: the service's one retry loop, and what the catalog's
error answers mean.

Every retry of the service goes through :func:`retry_call` (bounded exponential backoff with jitter,
with tenacity): the claim at start-up, the catalog calls at start-up, a batch's file writing, the
commit loop and its re-locking of the txnlog row. The txnlog library has its own
(``txnlog/retry.py``), as it knows nothing of the service.

The catalog's answers are sorted here, once, by :func:`catalog_answer`:

* ``conflict``: the branch moved under the commit (409), or a commit on another branch raised the
  table's last sequence number past the one this snapshot was built with (a 400, "Cannot add snapshot
  with sequence number N older than last sequence number M"). Either way nothing landed: reload, look
  for the snapshot, build it again on the new metadata.
* ``rate_limited``: 429. Nothing was done; wait (at least the ``Retry-After`` the catalog asked for,
  up to the backoff's maximum) and try again.
* ``unknown_outcome``: a 5xx, a dropped connection or a timeout (a REST catalog's HTTP, a Hive
  metastore's Thrift transport, Glue's AWS client). A commit may have landed: the commit loop looks for
  it before trying again; any other call is simply run again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import requests
from botocore.exceptions import ConnectionError as AwsConnectionError
from botocore.exceptions import ReadTimeoutError as AwsReadTimeoutError
from pyiceberg.exceptions import (
    BadRequestError,
    CommitFailedException,
    CommitStateUnknownException,
    ServerError,
    ServiceUnavailableError,
    TooManyRequestsError,
)
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)
from thrift.transport.TTransport import TTransportException

T = TypeVar("T")


class CatalogAnswer(StrEnum):
    """A catalog error worth another attempt; the value is the ``error.type`` of the failure metric."""

    CONFLICT = "conflict"
    RATE_LIMITED = "rate_limited"
    UNKNOWN_OUTCOME = "unknown_outcome"


# Iceberg's TableMetadata refuses a snapshot whose sequence number is not above the table's last one;
# the REST catalog answers it as a 400 (ValidationException), not as a 409.
_STALE_SEQUENCE_NUMBER = re.compile(r"sequence number \d+ older than last sequence number", re.IGNORECASE)

_UNAVAILABLE = (
    CommitStateUnknownException,
    ServerError,
    ServiceUnavailableError,
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.ChunkedEncodingError,
    TTransportException,  # a Hive metastore unreachable, or its connection dropped mid-call
    AwsConnectionError,  # Glue: no connection, or it broke
    AwsReadTimeoutError,
)


def catalog_answer(exc: BaseException) -> CatalogAnswer | None:
    """What a catalog error means for the caller, or None when trying again can't help."""
    if isinstance(exc, CommitFailedException):
        return CatalogAnswer.CONFLICT
    if isinstance(exc, BadRequestError) and _STALE_SEQUENCE_NUMBER.search(str(exc)):
        return CatalogAnswer.CONFLICT
    if isinstance(exc, TooManyRequestsError):
        return CatalogAnswer.RATE_LIMITED
    if isinstance(exc, _UNAVAILABLE):
        return CatalogAnswer.UNKNOWN_OUTCOME
    return None


def retry_after_s(exc: BaseException) -> float:
    """Seconds the server asked to wait (a ``Retry-After`` header in seconds), else 0.

    pyiceberg raises its own exception from the HTTP error, whose response carries the header.
    """
    response = getattr(exc.__cause__, "response", None)
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except ValueError:  # an HTTP date: rare, and the backoff is a fine answer to it
        return 0.0


@dataclass(frozen=True)
class Backoff:
    """``attempts`` tries in all; waits start at ``initial_s`` and double up to ``max_s``."""

    attempts: int
    initial_s: float
    max_s: float


def retry_call(
    fn: Callable[[], T],
    backoff: Backoff,
    *,
    retry_on: Callable[[BaseException], bool],
    on_failure: Callable[[int, BaseException], None],
    before_retry: Callable[[], None] | None = None,
) -> T:
    """Call ``fn`` until it returns, raises an error ``retry_on`` rejects, or the attempts run out.

    ``on_failure(attempt, exc)`` hears of every failure worth another attempt (the last one too);
    ``before_retry`` runs after the wait, before each attempt but the first. When the attempts run out
    the last error is raised.
    """
    exponential = wait_exponential(multiplier=backoff.initial_s, max=backoff.max_s) + wait_random(
        0, backoff.initial_s
    )

    def wait(state: RetryCallState) -> float:
        outcome = state.outcome
        asked = retry_after_s(outcome.exception() or Exception()) if outcome is not None else 0.0
        return min(max(exponential(state), asked), backoff.max_s)

    def after(state: RetryCallState) -> None:
        outcome = state.outcome
        if outcome is not None and (exc := outcome.exception()) is not None:
            on_failure(state.attempt_number, exc)

    def before(state: RetryCallState) -> None:
        if before_retry is not None and state.attempt_number > 1:
            before_retry()

    retrying = Retrying(
        retry=retry_if_exception(retry_on),
        stop=stop_after_attempt(max(1, backoff.attempts)),
        wait=wait,
        after=after,
        before=before,
        reraise=True,
    )
    return retrying(fn)


def log_failure(logger: logging.Logger, what: str, attempts: int) -> Callable[[int, BaseException], None]:
    """An ``on_failure`` that logs one warning line per failed attempt of ``what``."""

    def on_failure(attempt: int, exc: BaseException) -> None:
        logger.warning(
            "%s failed (attempt %d/%d): %s: %s", what, attempt, max(1, attempts), type(exc).__name__, exc
        )

    return on_failure


def brief(exc: BaseException) -> str:
    """An error in one line: Spark wraps worker failures in pages of Java and Python stack traces."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b.*:", line)]
    last = causes[-1] if causes else lines[-1]
    first = lines[0][:300]
    return f"{type(exc).__name__}: {first}" + (f" ... {last[:300]}" if last[:300] != first else "")
