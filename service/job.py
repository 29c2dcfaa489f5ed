"""The streaming job: wires the steps of a batch and runs the stream; it owns none of the steps.

A batch flows one way (docs/architecture.md): read (:mod:`service.pipeline.read`) → buffered or not
(:mod:`service.pipeline.batches`) → written into each table (:mod:`service.pipeline.write`) → one
outcome (:mod:`service.pipeline.outcome`) → committed and reported (:mod:`service.pipeline.commit`);
every offset rule is :mod:`service.pipeline.positions`'s.

Start-up order matters and is the exactly-once story in miniature: check Kafka and the table, start
Spark with its jars (a missing one stops start-up here, before anything is claimed), claim the sink
(fencing any older replica), then :func:`service.pipeline.startup.recover`, and only then start
reading Kafka from the committed offsets held by the txnlog. Spark's checkpoint is a throwaway
directory: the log is the truth.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

from service import scratch
from service.commit.committer import Committer
from service.commit.overlap import Commits
from service.config import SinkConfig
from service.failpoints import configure as configure_failpoints
from service.health import Health
from service.iceberg.catalog import connect
from service.iceberg.tables import KnownTables
from service.kafka.lag import start_lag_monitor
from service.metrics import SinkMetrics, setup_metrics
from service.pipeline import startup
from service.pipeline.batches import Batches
from service.pipeline.cadence import CommitCadence
from service.pipeline.commit import CommitStep
from service.pipeline.held import HeldTables
from service.pipeline.positions import Positions
from service.pipeline.read import Reader
from service.pipeline.routes import Routes
from service.pipeline.table import StopRequested
from service.pipeline.write import BatchWriter
from service.spark_session import build_spark
from service.txnlog_client import open_txnlog
from txnlog import Fenced, Lease

logger = logging.getLogger(__name__)


class SinkFenced(RuntimeError):
    """A newer replica took over; this one must stop without writing anything more."""


class SinkJob:
    def __init__(self, config: SinkConfig, health: Health | None = None) -> None:
        self.config = config
        self.health = health or Health()
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.log = open_txnlog(config, "run")
        self.metrics: SinkMetrics = setup_metrics(config.metrics, config.sink_id, config.table.identifier)
        self.catalog = connect(config)
        self.positions = Positions(config.kafka)
        self.reader = Reader(config, self.positions)
        self.routes = Routes(config, self.catalog, self.metrics, KnownTables())
        commit = config.commit
        self.cadence = CommitCadence(commit.min_size, commit.max_period)
        self.held = (  # a sink of many tables holding each table's changes until they are due
            HeldTables(CommitCadence(commit.table_min_records, commit.table_max_period), commit.concurrency)
            if commit.holds_tables
            else None
        )
        self.fatal: BaseException | None = None
        self.lease: Lease | None = None
        self.committer: Committer | None = None
        self.commit: CommitStep | None = None  # set by the claim, with the epoch it commits under
        self.batches: Batches | None = None
        self._batch_lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._batch_done = threading.Event()  # set after each micro-batch: the run loop looks again

    def request_stop(self) -> None:
        """Stop after the batch in flight (if any) is committed: SIGTERM's graceful path."""
        self._stop_requested.set()

    def start(self) -> None:
        """Start-up without the stream: Kafka and the tables, then the claim and the recovery."""
        self.prepare()
        self.claim_and_recover()

    def prepare(self) -> None:
        """What start-up checks and loads before it claims the sink: Kafka first, then the tables
        (topics a template routes by their events' source are routed once they hold records)."""
        configure_failpoints()
        self.reader.discover()
        with_records = self.reader.with_records() if self.routes.many else None
        self.routes.add(self.reader.partitions, with_records=with_records)

    def claim_and_recover(self) -> None:
        """Claim the sink (fencing older replicas), then finish what the last one left in precommit."""
        self.lease = startup.claim(self.log, self.config.sink_id, self.owner)
        self.committer = Committer.of(self.config, self.log, self.lease, self.metrics, self.routes.known)
        commits = Commits(self.committer, self.config.commit.overlap)
        write = self.config.write.table_properties()
        self.commit = CommitStep(commits, self.metrics, self.positions, self.routes.known, write)
        writer = BatchWriter(self.config, self.routes, self.positions, self.held, self.commit, self.metrics)
        self.batches = Batches(self.cadence, writer, startup.arrow_first(self.config, self.cadence))
        try:
            startup.recover(
                self.config, self.committer, self.catalog, self.routes, self.reader, self.positions
            )
        except Fenced as exc:
            raise SinkFenced(str(exc)) from exc

    def run(self, until_caught_up: bool = False) -> None:
        self.prepare()
        spark = build_spark(self.config)  # before the claim: a missing jar stops start-up here
        self.claim_and_recover()
        assert self.commit is not None and self.batches is not None and self.lease is not None
        own = scratch.current()  # removed at the next start if this process is killed
        checkpoint = tempfile.mkdtemp(
            prefix=f"checkpoint-{self.config.sink_id}-",
            dir=self.config.spark.checkpoint_dir or (own.root if own else None),
        )
        self.positions.checkpoint = checkpoint
        if until_caught_up:
            self.positions.catch_up(self.reader.partitions, watched=self.reader.tasks_read)
        query = self.reader.start(spark, self._on_batch, checkpoint, until_caught_up)
        self.health.set_ready(sink_id=self.config.sink_id, epoch=self.lease.epoch)
        lag = start_lag_monitor(
            self.config, lambda: self.reader.partitions, lambda: self.positions.committed, self.metrics
        )
        logger.info(
            "consuming %s from %s",
            self.config.kafka.topic_pattern or sorted(self.reader.partitions),
            self.positions.spark_starting(self.reader.partitions),
        )
        failure: Exception | None = None
        try:
            self._loop(query)
        except Exception as exc:
            failure = exc
        finally:
            if query.isActive:  # this loop failed (an idle flush): no batch may run after it
                query.stop()
            in_flight = self.commit.close()
            self.health.set_not_ready("stopped")
            lag.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
        if isinstance(in_flight, Fenced):  # replaced mid-commit: that explains the stop, even when
            self._failed(in_flight)  # the next batch failed first (a frozen replica wakes to timeouts)
            if failure is not None:
                logger.warning("the sink was fenced; what failed after its last commit: %s", failure)
        elif failure is not None and self.fatal is None:
            assert self.committer is not None
            self.reader.explain_failure(failure, self.committer.committed())
            raise failure
        if self.fatal is not None and (failure or not isinstance(self.fatal, StopRequested)):
            raise self.fatal from None

    def _loop(self, query: Any) -> None:
        """Until the query ends, a stop is requested or a catch-up run is caught up; then land the rest.
        A batch that starts after a stop request fails the query on purpose (StopRequested): that is
        the graceful path too."""
        assert self.commit is not None and self.batches is not None
        commit, batches = self.commit, self.batches
        caught_up = self.positions.caught_up
        try:
            while query.isActive and not self._stop_requested.is_set() and not caught_up():
                batch = self._batch_done.wait(1)
                self._batch_done.clear()
                if commit.failed():  # fenced, or the catalog gave up: stop now
                    self._exclusive(commit.wait)
                if not batch and batches.due_when_idle():  # a batch commits what is due itself
                    self._exclusive(lambda: batches.idle(self.reader.topic_ids))
                elif batch and logger.isEnabledFor(logging.DEBUG) and (progress := query.lastProgress):
                    logger.debug(
                        "micro-batch %s, Spark's durations (ms): %s",
                        progress.get("batchId"),
                        progress.get("durationMs"),
                    )
            if query.isActive and caught_up():  # what is buffered or held lands now, not after the stop
                self._exclusive(lambda: batches.land_the_rest(self.reader.topic_ids))
            if query.isActive:
                logger.info(
                    "caught up to the target: stopping"
                    if caught_up()
                    else "stop requested: finishing the batch in flight, then stopping"
                )
                with self._batch_lock:
                    query.stop()
            query.awaitTermination()
        except Exception:
            if not isinstance(self.fatal, StopRequested):
                raise
            logger.info("stop requested: stopped after the batch in flight")
        if self.fatal is None or isinstance(self.fatal, StopRequested):
            with self._batch_lock:
                try:  # what is left, and the last commit in flight: their failure is the run's
                    batches.land_the_rest(self.reader.topic_ids)
                    commit.wait()
                except BaseException as exc:
                    self._failed(exc)
                    raise

    def _on_batch(self, frame: DataFrame, batch_id: int) -> None:
        """Spark's foreachBatch: read the batch, hand it on; the run loop is told it happened."""
        if self._stop_requested.is_set():
            self.fatal = StopRequested("stop requested before the batch started")
            raise self.fatal
        batches = self.batches
        assert batches is not None

        def one() -> None:
            batch = self.reader.batch(frame, batch_id)
            batches.take(batch)
            self.positions.advance(batch.end)
            if self.held is not None:
                self.metrics.set_held(self.held.counts())
            self._batch_done.set()

        self._exclusive(one)

    def _exclusive(self, work: Callable[[], None]) -> None:
        """Run batch work (a micro-batch, or an idle flush) under the batch lock.

        The first failure is fatal and recorded: work that comes after it is refused, since the failed
        work's buffer is gone and committing later offsets would skip its records.
        """
        with self._batch_lock:
            if self.fatal is not None:
                raise RuntimeError("the sink already failed; nothing more is processed") from self.fatal
            try:
                work()
            except BaseException as exc:
                self._failed(exc)
                raise

    def _failed(self, exc: BaseException) -> None:
        """Record the run's failure; a fenced one is counted and stops the sink as SinkFenced (exit 3)."""
        if isinstance(exc, Fenced):
            self.metrics.fenced.add(1, self.metrics.attrs())
            self.fatal = SinkFenced(str(exc))
        else:
            self.fatal = exc
