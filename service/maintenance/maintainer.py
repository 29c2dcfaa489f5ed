"""``icesink maintain``: every table of the sink, each under its lease, each due task in turn.

One table's trouble is that table's: a task that fails is logged and counted, the table's other
tasks and the other tables still run, and the exit code says that something failed. A maintainer
fenced by a newer one (:class:`~txnlog.Fenced` at a task's precommit) stops at once: the newer one
owns the work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from service.config import SinkConfig
from service.failpoints import failpoint
from service.maintenance.lease import TableBusy, TableLease
from service.maintenance.table_health import TableHealth, table_health
from service.maintenance.tasks import Task, TaskContext, TaskResult, default_tasks
from service.metrics import SinkMetrics
from service.retrying import brief
from txnlog import Fenced, LockLost

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

    from txnlog import TransactionLog

logger = logging.getLogger(__name__)


@dataclass
class TableRun:
    """One table's maintenance in one pass."""

    table: str
    skipped: str | None = None  # why nothing ran (another maintainer holds the table)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # task → error
    before: TableHealth | None = None
    after: TableHealth | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "skipped": self.skipped,
            "tasks": self.tasks,
            "failed": self.failed,
            "before": self.before.to_json() if self.before else None,
            "after": self.after.to_json() if self.after else None,
        }


def error_type(exc: BaseException) -> str:
    """A short, bounded name for a task's failure (metrics attribute ``error.type``)."""
    text = str(exc)
    for marker, name in (
        ("CommitFailedException", "conflict"),
        ("CompactionLost", "conflict"),
        ("ValidationException", "conflict"),
        ("NoSuchTableException", "no_such_table"),
        ("ForbiddenException", "forbidden"),
        ("NotAuthorizedException", "forbidden"),
    ):
        if marker in text or marker in type(exc).__name__:
            return name
    return type(exc).__name__


class Maintainer:
    """Runs the maintenance tasks of every table of one sink (:mod:`service.maintenance.tasks`)."""

    def __init__(
        self,
        config: SinkConfig,
        spark: SparkSession,
        spark_catalog: str,
        catalog: Catalog,
        log: TransactionLog,
        metrics: SinkMetrics,
        owner: str,
        tasks: list[Task] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """``stop`` (set by SIGTERM) ends the work after the task in flight: no further task or table."""
        self.config = config
        self.spark = spark
        self.spark_catalog = spark_catalog
        self.catalog = catalog
        self.log = log
        self.metrics = metrics
        self.owner = owner
        self.tasks = tasks if tasks is not None else default_tasks()
        self.stop = stop or threading.Event()

    def tables(self) -> list[str]:
        from service.commit.sink_tables import existing_sink_tables

        return existing_sink_tables(self.config, self.catalog, self.log)

    def run_once(self, force: bool) -> list[TableRun]:
        """One pass over every table; ``force``: every task with anything to do, whatever the thresholds."""
        tables = self.tables()
        logger.info("maintenance pass over %d table(s) of sink %s", len(tables), self.config.sink_id)
        runs: list[TableRun] = []
        for identifier in tables:
            if self.stop.is_set():
                logger.info("stop requested: %d table(s) left for the next pass", len(tables) - len(runs))
                break
            runs.append(self.maintain(identifier, force))
        return runs

    def run_forever(self, on_pass: Callable[[], None] = lambda: None) -> None:
        """A pass every ``maintenance.interval`` until ``stop`` is set (SIGTERM); ``on_pass`` after each
        (the liveness probe). A pass that fails as a whole (the catalog or the txnlog unreachable) is
        logged and the next one tries again; a fenced maintainer stops."""
        interval = self.config.maintenance.interval.total_seconds()
        while not self.stop.is_set():
            try:
                self.run_once(force=False)
            except Fenced:
                raise
            except Exception as exc:
                logger.error("maintenance pass failed, trying again in %.0f s: %s", interval, brief(exc))
            on_pass()
            self.stop.wait(interval)

    def maintain(self, identifier: str, force: bool) -> TableRun:
        """One table's pass. A failure of the table itself (its lease row, the catalog) or of one task
        is recorded in the run (task ``table`` for the former) and counted; the other tasks and the
        other tables still run."""
        run = TableRun(identifier)
        try:
            lease = TableLease(self.log, self.config.sink_id, identifier, self.owner)
            health = run.before = self._health(identifier)
        except TableBusy as exc:
            logger.info("maintenance of %s skipped: %s", identifier, exc)
            run.skipped = str(exc)
            return run
        except Fenced:
            raise
        except Exception as exc:
            self._failed(run, "table", exc)
            return run
        for task in self.tasks:
            reason = task.due(health, self.config.maintenance, force, datetime.now(UTC))
            if reason is None or self.stop.is_set():
                continue
            started = time.monotonic()
            try:
                result = self._run(lease, task, identifier)
                seconds = time.monotonic() - started
                health = self._health(identifier)
            except Fenced:
                raise
            except LockLost as exc:
                self._failed(run, task.name, exc)
                break  # the lease is in doubt: the table's other tasks wait for the next pass
            except Exception as exc:
                self._failed(run, task.name, exc)
                continue
            self.metrics.maintenance_task(identifier, task.name, seconds, result)
            run.tasks[task.name] = {"reason": reason, "seconds": round(seconds, 3), **_counts(result)}
            logger.info(
                "maintenance of %s: %s (%s) in %.1f s: %d file(s) rewritten, %d added, %d removed, "
                "%d bytes rewritten, %d snapshot(s) expired",
                identifier,
                task.name,
                reason,
                seconds,
                result.files_rewritten,
                result.files_added,
                result.files_removed,
                result.bytes_rewritten,
                result.snapshots_expired,
            )
        run.after = health
        if run.tasks or run.failed:
            try:
                lease.record(
                    {
                        "tasks": run.tasks,
                        "failed": run.failed,
                        "health": health.to_json(),
                        "epoch": lease.epoch,
                    }
                )
            except Fenced:
                raise
            except Exception as exc:  # the work is done; only its record in the lease row is missing
                logger.warning(
                    "maintenance of %s: the run's report was not recorded: %s", identifier, brief(exc)
                )
        return run

    def _failed(self, run: TableRun, task: str, exc: BaseException) -> None:
        run.failed[task] = brief(exc)
        self.metrics.maintenance_failed(run.table, task, error_type(exc))
        logger.error("maintenance of %s: %s failed: %s", run.table, task, brief(exc))

    def _health(self, identifier: str) -> TableHealth:
        health = table_health(self.catalog.load_table(identifier), identifier)
        self.metrics.set_health(health)
        return health

    def _run(self, lease: TableLease, task: Task, identifier: str) -> TaskResult:
        # A job tag, not a job group: Iceberg's actions set job groups of their own.
        context = self.spark.sparkContext
        tag = f"icesink-maintenance-{task.name}-{lease.epoch}"
        failpoint("maintenance_before_task")
        with lease.task(task.name, on_lock_lost=lambda: context.cancelJobsWithTag(tag)) as check:
            context.addJobTag(tag)
            try:
                failpoint("maintenance_during_task")
                ctx = TaskContext(
                    self.config, self.spark, self.spark_catalog, self.catalog, self.log, identifier, check
                )
                return task.run(ctx)
            finally:
                context.removeJobTag(tag)


def _counts(result: TaskResult) -> dict[str, Any]:
    return {
        "files_rewritten": result.files_rewritten,
        "files_added": result.files_added,
        "files_removed": result.files_removed,
        "bytes_rewritten": result.bytes_rewritten,
        "snapshots_expired": result.snapshots_expired,
        "detail": {k: v for k, v in result.detail.items() if isinstance(v, int | str | float | bool)},
    }
