"""Batch N's commit in the background while batch N+1 is read and written.

A batch's fixed costs are mostly waits: Spark's job, then the txnlog precommit, the Iceberg commit
and the txnlog commit (round trips to Postgres and the catalog). Run one after the other, the commit
adds its whole duration to every batch; here the job hands the plan over and goes on with the next
batch while one thread commits it. What stays as it was: plans are committed one at a time in the
order they were handed over (the next one waits for the one before to finish, and a failure of the
one before is raised there, so nothing is precommitted after a plan that failed); the txnlog protocol
is :class:`Committer`'s, unchanged, fencing included (each precommit checks the epoch).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from service.commit.committer import CommitResult, Committer
from service.commit.plan import BatchPlan

logger = logging.getLogger(__name__)


class Commits:
    """Hands plans to ``committer`` one at a time: in the background (``overlap``), or in the caller."""

    def __init__(self, committer: Committer, overlap: bool) -> None:
        self.committer = committer
        self.overlap = overlap
        self._pool = ThreadPoolExecutor(1, "icesink-commit-overlap") if overlap else None
        self._in_flight: Future[None] | None = None

    def submit(self, plan: Callable[[], BatchPlan], done: Callable[[CommitResult, float], None]) -> None:
        """Commit the plan ``plan()`` makes after the plan before it; ``done`` reports it (in the
        committing thread), with the seconds the commit took. Making the plan may write its files
        (a sink's held tables): in the background too, then.

        Raises the failure of the plan before, if it failed: this one is then never precommitted.
        """
        self.wait()

        def commit() -> None:
            made = plan()
            started = time.monotonic()
            result = self.committer.commit(made)
            done(result, time.monotonic() - started)

        if self._pool is None:
            commit()
        else:
            self._in_flight = self._pool.submit(commit)

    def failed(self) -> bool:
        """Whether the commit in flight has failed (without waiting): the sink stops at once rather
        than at its next batch, which may never come."""
        in_flight = self._in_flight
        return in_flight is not None and in_flight.done() and in_flight.exception() is not None

    def wait(self) -> None:
        """Until the plan in flight (if any) is committed; raises its failure."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def close(self) -> Exception | None:
        """Wait for the plan in flight without raising (the sink is stopping for another reason) and
        return its failure, if any: the caller decides whether it explains the stop (a fenced commit
        does: the sink was replaced). A plan whose commit failed stays precommitted, and the next
        start finishes it."""
        failure: Exception | None = None
        try:
            self.wait()
        except Exception as exc:
            logger.warning("the commit in flight failed while the sink stopped: %s", exc)
            failure = exc
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        return failure
