"""The maintenance lease: one maintainer per table at a time, fenced by the sink's transaction log.

Each table of a sink has a txnlog row of its own, ``<sink_id>/maintenance/<table>``, with the same
protocol as the sink's: a maintainer *claims* it (a new epoch, which fences every older maintainer of
the table), and runs each task as a plan: ``precommit`` the task (conditional on the epoch: a fenced
maintainer stops here), then run it while ``committing`` holds the row locked, then flip it to
committed. While a task runs, nobody can claim the table (a claimer waits ``lock_timeout``, then skips
it); between tasks a newer maintainer can, and the older one's next precommit raises
:class:`~txnlog.Fenced`. So a maintainer never commits to a table it no longer owns.

A task's Spark procedure may run longer than the session's idle-in-transaction timeout: a heartbeat
thread touches the locked session every few seconds. If the session is lost anyway (Postgres
restarted, this process frozen), the heartbeat cancels the task's Spark jobs and the task fails with
:class:`~txnlog.LockLost`; icesink's own commits (dangling deletes, orphans) check the lease first.
A commit Iceberg's procedure has already begun on the driver may still land: Iceberg's validation
orders it against whatever a newer maintainer commits, as it would for any two writers.

A maintainer killed inside a task leaves the row in ``precommit``: the next claim aborts that plan.
Every task is safe to run again (Iceberg decides from the table as it is now).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from txnlog import Fenced, Lease, LockLost, LockTimeout, Phase, SinkState, TransactionLog

logger = logging.getLogger(__name__)

HEARTBEAT_S = 5.0


def lease_id(sink_id: str, table: str) -> str:
    """The txnlog row of a table's maintenance lease."""
    return f"{sink_id}/maintenance/{table}"


class TableBusy(RuntimeError):
    """Another maintainer is inside a task of this table (its lease row is locked)."""


class TableLease:
    """A claimed maintenance lease on one table."""

    def __init__(self, log: TransactionLog, sink_id: str, table: str, owner: str) -> None:
        self.log = log
        self.table = table
        self._id = lease_id(sink_id, table)
        try:
            self.lease: Lease = log.claim(self._id, owner)
        except LockTimeout as exc:
            raise TableBusy(f"another maintainer is running a task on {table}") from exc
        if self.lease.state.phase is Phase.PRECOMMIT:
            pending = self.lease.state.pending or {}
            logger.info(
                "maintenance of %s: the task %r of epoch %s did not finish (its maintainer stopped); "
                "dropping it, it runs again when due",
                table,
                pending.get("task"),
                self.lease.state.precommit_epoch,
            )
            log.abort(self.lease)

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @contextmanager
    def task(
        self, name: str, on_lock_lost: Callable[[], None] = lambda: None
    ) -> Iterator[Callable[[], None]]:
        """Run the block as the task ``name`` under the lease (see the module's docstring).

        The block gets a check to call right before any commit of its own: it raises
        :class:`~txnlog.LockLost` once the heartbeat found the locked session gone. ``on_lock_lost`` is
        called from the heartbeat thread at that moment: it must stop the block's Spark jobs.
        After a lost lock the task is aborted if the epoch is still ours (a newer maintainer that
        claimed meanwhile does that itself), and :class:`~txnlog.LockLost` is raised: the table's
        remaining tasks wait for the next pass.
        """
        state = self.log.precommit(
            self.lease, {"task": name, "table": self.table, "started_at": _now()}
        )  # raises Fenced
        try:
            with self._committing(name, state.seq, on_lock_lost) as check:
                yield check
        except Exception as exc:
            # The task failed, or its lock was lost: drop it, conditionally on our epoch (raises
            # Fenced if a newer maintainer claimed the table meanwhile).
            try:
                self.log.abort(self.lease, seq=state.seq)
            except Fenced:
                raise
            except Exception as abort_exc:
                logger.warning(
                    "maintenance of %s: could not drop the task %s: %s", self.table, name, abort_exc
                )
            raise exc

    @contextmanager
    def _committing(
        self, name: str, seq: int, on_lock_lost: Callable[[], None]
    ) -> Iterator[Callable[[], None]]:
        with self.log.committing(self.lease, seq=seq) as handle:
            stop = threading.Event()
            lost: list[LockLost] = []

            def beat() -> None:
                while not stop.wait(HEARTBEAT_S):
                    try:
                        handle.heartbeat()
                    except LockLost as exc:
                        lost.append(exc)
                        logger.error("maintenance of %s: %s; cancelling the task %s", self.table, exc, name)
                        on_lock_lost()
                        return

            def check() -> None:
                if lost:
                    raise lost[0]

            thread = threading.Thread(target=beat, name=f"icesink-lease-{name}", daemon=True)
            thread.start()
            try:
                yield check
            finally:
                stop.set()
                thread.join()
            check()

    def record(self, report: dict[str, Any]) -> None:
        """Record the run's report as the lease's last committed plan (what ``icesink status`` shows)."""
        state = self.log.precommit(self.lease, {"task": "report", "finished_at": _now(), **report})
        self.log.commit(self.lease, seq=state.seq)


def last_maintenance(state: SinkState | None) -> dict[str, Any] | None:
    """What a table's lease row says about its maintenance: the last task or run report, who ran it."""
    if state is None:
        return None
    return {
        "epoch": state.epoch,
        "owner": state.owner,
        "running": (state.pending or {}).get("task") if state.phase is Phase.PRECOMMIT else None,
        "last": state.committed_payload,
        "updated_at": state.updated_at.isoformat(),
    }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
