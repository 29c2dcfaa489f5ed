"""The streaming job: Kafka → decode → latest change per key → Parquet files → one commit per batch.

Start-up order matters and is the exactly-once story in miniature: check Kafka and the table,
start Spark with its jars (a missing one stops start-up here, before anything is claimed), claim the
sink (fencing any older replica), check that the table holds no commit of this sink newer than the log knows, finish a
plan left in precommit, and only then start reading Kafka from the committed offsets held by the
txnlog. Spark's checkpoint is a throwaway directory: the log is the truth.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import reduce
from typing import Any

from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.channel.cadence import Buffer, CommitCadence
from service.channel.committer import CommitResult, Committer
from service.channel.overlap import Commits
from service.channel.pending import BatchPlan, PendingCommit
from service.config import SinkConfig
from service.failpoints import configure as configure_failpoints
from service.health import Health
from service.iceberg.catalog import catalog_retries, connect
from service.iceberg.tables import KnownTables
from service.kafka import dead_letter
from service.kafka.batch import KafkaBatch
from service.kafka.lag import start_lag_monitor
from service.kafka.offsets import OffsetsGone, check_committed, recreated
from service.kafka.ranges import FORMAT, RangePlan, source_class
from service.kafka.source import (
    SourceError,
    admin,
    batch_end_offsets,
    earliest_offsets,
    end_offsets,
    partitions,
    spark_options,
    starting_offsets,
    task_client,
    topic_ids,
)
from service.metrics import SinkMetrics, setup_metrics
from service.model.offsets import Offsets, merge_offsets
from service.pipeline.held import HeldTables
from service.pipeline.result import TableWrite
from service.pipeline.routes import Routes
from service.pipeline.table import TABLE_FAILURES, ArrowTables, StopRequested, write_arrow_tables
from service.report import report_commit
from service.retrying import Backoff, retry_call
from service.spark_session import build_spark
from service.txnlog_client import open_txnlog
from txnlog import Fenced, Lease, LockTimeout

logger = logging.getLogger(__name__)


class SinkFenced(RuntimeError):
    """A newer replica took over; this one must stop without writing anything more."""


def _log_progress(progress: dict[str, Any] | None) -> None:
    """Spark's own account of its last micro-batch (planning, offset log, the batch itself), in ms."""
    if progress:
        logger.debug(
            "micro-batch %s, Spark's durations (ms): %s", progress.get("batchId"), progress.get("durationMs")
        )


class SinkJob:
    def __init__(self, config: SinkConfig, health: Health | None = None) -> None:
        self.config = config
        self.health = health or Health()
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.log = open_txnlog(config, "run")
        self.metrics: SinkMetrics = setup_metrics(config.metrics, config.sink_id, config.table.identifier)
        self.catalog = connect(config)
        self.fatal: BaseException | None = None
        self._batch_lock = threading.Lock()
        self._buffer = Buffer()
        self.cadence = CommitCadence(config.commit.min_size, config.commit.max_period)
        commit = config.commit
        self.held = (  # a sink of many tables holding each table's changes until they are due
            HeldTables(CommitCadence(commit.table_min_records, commit.table_max_period), commit.concurrency)
            if commit.holds_tables
            else None
        )
        self._stop_requested = threading.Event()
        self._batch_done = threading.Event()  # set after each micro-batch: the run loop looks again
        self._target: Offsets | None = None  # until_caught_up: where the run stops
        self._checkpoint: str  # run(): Spark's throwaway checkpoint, where each batch's end is read
        # Set by prepare(): the topics' partitions and ids, the table's pipeline, and whether batches
        # try the Arrow path first.
        self.partitions: dict[str, list[int]]
        self.topic_ids: dict[str, str]
        self._admin: AdminClient
        self.known = KnownTables()  # each table as the sink's last commit left it
        self.routes = Routes(config, self.catalog, self.metrics, self.known)
        self.arrow_decoder: bool
        # Set by claim_and_recover(): the claim, its committer, the committed offsets, and where the
        # stream has read to (past them by the batches buffered or the tables' changes held).
        self.lease: Lease
        self.committer: Committer
        self.commits: Commits  # the committer's plans, one at a time, in the background
        self.offsets: Offsets
        self._read: Offsets
        # Topics the pattern matched while the sink ran: where Spark began reading them (the earliest
        # offset then), in case their table holds changes or is paused before its first commit.
        self._starts: Offsets = {}
        self._stream_start: Offsets = {}  # source.reader tasks: where the stream's first batch starts

    def request_stop(self) -> None:
        """Stop after the batch in flight (if any) is committed: SIGTERM's graceful path."""
        self._stop_requested.set()

    # -- start-up ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start-up without the stream: :meth:`prepare`, then :meth:`claim_and_recover`."""
        self.prepare()
        self.claim_and_recover()

    def prepare(self) -> None:
        """What start-up checks and loads before it claims the sink: Kafka, then the table."""
        configure_failpoints()
        # Kafka first: a broker or topic that can't be reached stops start-up before a table is
        # created or the sink is claimed.
        self.partitions = partitions(self.config.kafka)
        self._admin = admin(self.config.kafka)
        self.topic_ids = topic_ids(self._admin, list(self.partitions))
        # Topics a template routes by their events' source are routed once they hold records.
        self.routes.add(self.partitions, with_records=self._with_records(self.partitions))
        self.arrow_decoder = self._arrow_decoder_usable()

    def _with_records(self, parts: dict[str, list[int]]) -> set[str] | None:
        if not self.routes.many:
            return None
        ends = end_offsets(self.config.kafka, parts)
        return {t for t, ps in ends.items() if any(o > 0 for o in ps.values())}

    def claim_and_recover(self) -> None:
        """Claim the sink (fencing older replicas), then finish what the last one left in precommit."""
        self.lease = self._claim()
        logger.info("sink %s claimed epoch %d as %s", self.config.sink_id, self.lease.epoch, self.owner)
        self.committer = Committer(
            self.log,
            self.lease,
            connect(self.config),  # its own: the commit may run in the background (service.channel.overlap)
            self.metrics,
            max_attempts=self.config.commit.retries,
            concurrency=self.config.commit.concurrency,
            catalog_factory=lambda: connect(self.config),
            known=self.known,
        )
        self.commits = Commits(self.committer, self.config.commit.overlap)
        for identifier in self.routes.pipelines:
            self._check_log_is_current(identifier)
        try:
            self.committer.recover()
            committed = self.committer.committed()
            check_committed(self.config, self.partitions, self.topic_ids, committed)
            self.offsets = committed.offsets if committed else {}
            self._record_starting_offsets()
            self._read = dict(self.offsets)
        except Fenced as exc:
            raise SinkFenced(str(exc)) from exc

    def _check_log_is_current(self, identifier: str) -> None:
        self.committer.check_log_is_current(
            catalog_retries(
                self.config,
                f"reading the sink's commits in {identifier}",
                lambda: self.catalog.load_table(identifier),
            )
        )

    def _offsets_plan(self, offsets: Offsets, note: str | None = None) -> BatchPlan:
        """A plan that only moves the offsets (in a one-table sink's row format for one table)."""
        if not self.routes.many:
            only = PendingCommit(
                self.config.table.identifier, offsets, None, topic_ids=dict(self.topic_ids), note=note
            )
            return BatchPlan.of_one_table(only)
        return BatchPlan(offsets, topic_ids=dict(self.topic_ids), routes=dict(self.routes.tables), note=note)

    def _record_starting_offsets(self) -> None:
        """Resolve ``starting_offsets: latest`` for topics the sink never read, and commit the result.

        Left to Spark, "latest" is resolved again at every start for each partition without a
        committed offset, and a partition that had no record in any committed batch (a quiet one, or
        a sink killed before its first commit) would skip what was produced to it meanwhile. Recorded
        as a plan without files before anything is read, the offsets are the sink's from then on;
        partitions added to a topic later have no offset and are read from the earliest.
        """
        if self.config.kafka.starting_offsets != "latest":
            return
        new = {t: ps for t, ps in self.partitions.items() if t not in self.offsets}
        if not new:
            return
        latest = end_offsets(self.config.kafka, new)
        pending = self._offsets_plan(
            merge_offsets(self.offsets, latest), f"starting_offsets latest, resolved for {sorted(new)}"
        )
        seq = self.committer.commit(pending).seq
        self.offsets = pending.offsets
        logger.info(
            "starting_offsets latest: recorded the latest offsets %s in the txnlog (seq %d)", latest, seq
        )

    def _arrow_decoder_usable(self) -> bool:
        """Whether batches go through the one-job Arrow path first (service.data.arrow_batch)."""
        reason = None
        if self.config.source.decoder == "spark":
            reason = "source.decoder is spark"
        elif not self.cadence.every_trigger:
            reason = "commit.min_size/max_period buffer batches"
        if reason:
            logger.info("decoding every batch with Spark's decoder: %s", reason)
            return False
        logger.info("decoding with the Arrow decoder; Spark's decoder takes any batch it declines")
        return True

    def _claim(self, attempts: int = 5) -> Lease:
        """Claim the sink, waiting for a predecessor that still holds the row in the middle of a commit.

        Each try waits up to ``txnlog.lock_timeout``; a hung predecessor's session is ended by Postgres
        after ``txnlog.session_timeout``, so a few tries are enough.
        """
        sink_id = self.config.sink_id

        def waiting(attempt: int, _: BaseException) -> None:
            logger.warning(
                "sink %s: another replica holds the txnlog row (committing); waiting (%d/%d)",
                sink_id,
                attempt,
                attempts,
            )

        return retry_call(
            lambda: self.log.claim(sink_id, self.owner),
            Backoff(attempts=attempts, initial_s=0.1, max_s=1.0),
            retry_on=lambda exc: isinstance(exc, LockTimeout),
            on_failure=waiting,
        )

    # -- the stream ----------------------------------------------------------------------------------

    def run(self, until_caught_up: bool = False) -> None:
        self.prepare()
        # Spark before the claim: a jar that is missing or can't be resolved stops start-up here.
        spark = build_spark(self.config)
        self.claim_and_recover()
        checkpoint = tempfile.mkdtemp(
            prefix=f"icesink-{self.config.sink_id}-", dir=self.config.spark.checkpoint_dir
        )
        self._checkpoint = checkpoint
        start = starting_offsets(self.partitions, self.offsets)
        if until_caught_up:
            self._target = end_offsets(self.config.kafka, self.partitions)
            logger.info("catching up to %s", self._target)
        tasks_read = self.config.source.reader == "tasks"
        stream = self._task_source(spark) if tasks_read else self._spark_source(spark, start)
        writer = stream.writeStream.foreachBatch(self._on_batch).option("checkpointLocation", checkpoint)
        if until_caught_up and not tasks_read:
            writer = writer.trigger(availableNow=True)
        elif until_caught_up:  # the source plans nothing past the target; the loop stops there
            writer = writer.trigger(processingTime="0 seconds")
        else:
            writer = writer.trigger(
                processingTime=f"{self.config.commit.trigger_interval.total_seconds()} seconds"
            )
        query = writer.start()
        self.health.set_ready(sink_id=self.config.sink_id, epoch=self.lease.epoch)
        lag_monitor = start_lag_monitor(
            self.config, lambda: self.partitions, lambda: self.offsets, self.metrics
        )
        logger.info("consuming %s from %s", self.config.kafka.topic_pattern or sorted(self.partitions), start)
        try:
            try:
                # A batch that starts after a stop request fails the query on purpose (StopRequested),
                # possibly while this loop still waits: that is the graceful path too.
                while query.isActive and not self._stop_requested.is_set() and not self._caught_up():
                    batch = self._batch_done.wait(1)
                    self._batch_done.clear()
                    if self.commits.failed():  # fenced, or the catalog gave up: stop now
                        self._exclusive(self.commits.wait)
                    if not batch:  # a batch commits what is due itself
                        self._flush_when_idle()
                    elif logger.isEnabledFor(logging.DEBUG):
                        _log_progress(query.lastProgress)
                if query.isActive and self._caught_up():
                    # The source plans nothing past the target: what is buffered or held lands now,
                    # not after the query's stop (a second or more).
                    self._exclusive(self._land_the_rest)
                if query.isActive:
                    logger.info(
                        "caught up to the target: stopping"
                        if self._caught_up()
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
                        self._land_the_rest()
                        self.commits.wait()
                    except BaseException as exc:
                        self._failed(exc)
                        raise
        except Exception as exc:
            if self.fatal is not None:
                raise self.fatal from None
            self._explain_stream_failure(exc)
            raise
        finally:
            if query.isActive:  # this loop failed (an idle flush): no batch may run after it
                query.stop()
            self.commits.close()
            self.health.set_not_ready("stopped")
            lag_monitor.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
        if self.fatal is not None and not isinstance(self.fatal, StopRequested):
            raise self.fatal

    def _land_the_rest(self) -> None:
        """Write and commit what the cadence buffered and the tables' held changes (the stream ended)."""
        self.flush()
        self._commit_held(self.held.tables() if self.held else [], "the stream ended")

    def _spark_source(self, spark: SparkSession, start: str) -> DataFrame:
        """Spark's Kafka source: the JVM reads the records (``source.reader: spark``)."""
        reader = (
            spark.readStream.format("kafka")
            .options(**spark_options(self.config.kafka))
            .option(*self._subscription())
            .option("startingOffsets", start)
            .option("failOnDataLoss", "true")
        )
        if self.config.kafka.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.config.kafka.max_offsets_per_trigger))
        return reader.load()

    def _task_source(self, spark: SparkSession) -> DataFrame:
        """The source that plans offset ranges, which the tasks read (service.kafka.ranges)."""
        kafka = self.config.kafka
        # Resolved here, so that the first batch's ranges start where the source's do.
        unread = {t: [p for p in ps if p not in self.offsets.get(t, {})] for t, ps in self.partitions.items()}
        earliest = earliest_offsets(kafka, {t: ps for t, ps in unread.items() if ps})
        starting = merge_offsets(earliest, self.offsets)
        self._stream_start = starting
        plan = RangePlan(
            client=task_client(kafka),
            topics=list(kafka.topics),
            pattern=kafka.topic_pattern,
            starting=starting,
            max_offsets_per_trigger=kafka.max_offsets_per_trigger,
            until=self._target,
            chunk=self.config.backlog_chunk if self.routes.many else None,
        )
        spark.dataSource.register(source_class(plan))
        logger.info(
            "reading Kafka in the tasks (source.reader: tasks, %d records a chunk)",
            self.config.source.chunk_records,
        )
        return spark.readStream.format(FORMAT).load()

    def _caught_up(self) -> bool:
        """Whether a catch-up run (``until_caught_up``) read every partition to its target."""
        if self._target is None or self.config.source.reader != "tasks":
            return False
        return all(
            self._read.get(t, {}).get(p, 0) >= o for t, ps in self._target.items() for p, o in ps.items()
        )

    def _subscription(self) -> tuple[str, str]:
        """Spark's source option: the topics, or the pattern (Spark picks up topics created later)."""
        kafka = self.config.kafka
        if kafka.topic_pattern is not None:
            return "subscribePattern", kafka.topic_pattern
        return "subscribe", ",".join(kafka.topics)

    def _explain_stream_failure(self, exc: Exception) -> None:
        """Raise :class:`OffsetsGone` if that is why the stream failed.

        Spark's source fails a batch whose offsets Kafka no longer holds (retention deleted records
        the sink had not read yet while it ran): that is not a crash to restart from, since every
        restart would fail the same way.
        """
        try:
            parts = partitions(self.config.kafka)
            check_committed(
                self.config, parts, topic_ids(self._admin, list(parts)), self.committer.committed()
            )
        except OffsetsGone as gone:
            raise gone from exc
        except Exception as check_failed:
            logger.warning("could not check the committed offsets after the failure: %s", check_failed)

    def _on_batch(self, frame: DataFrame, batch_id: int) -> None:
        if self._stop_requested.is_set():
            self.fatal = StopRequested("stop requested before the batch started")
            raise self.fatal
        self._exclusive(lambda: self._batch(frame, batch_id))

    def _records(self, frame: DataFrame, batch_id: int, end: Offsets) -> KafkaBatch:
        """The batch's records: Spark's source's rows, or (``source.reader: tasks``) the ranges from
        where the batch before ended (the offsets the stream started from, for the first) to ``end``,
        which the tasks read themselves; the stream's own rows, the same ranges, are left unread."""
        if self.config.source.reader != "tasks":
            return KafkaBatch(frame)
        start = self._stream_start if batch_id == 0 else batch_end_offsets(self._checkpoint, batch_id - 1)
        new = {t: [p for p in ps if p not in start.get(t, {})] for t, ps in end.items()}
        if any(new.values()):  # partitions born since the batch before: read from their earliest offset
            start = merge_offsets(
                start, earliest_offsets(self.config.kafka, {t: ps for t, ps in new.items() if ps})
            )
        return KafkaBatch.of_offsets(
            frame.sparkSession, start, end, task_client(self.config.kafka), self.config.source.chunk_records
        )

    def _batch(self, frame: DataFrame, batch_id: int) -> None:
        """One micro-batch, after checking that its topics are still those the offsets belong to.

        Describing the topics is one request: a topic deleted and re-created while the sink runs
        would otherwise be read from the old offsets. Retention deleting unread records is Spark's
        to notice (its data-loss check fails the stream; see :meth:`_explain_stream_failure`).
        """
        try:
            current = topic_ids(self._admin, list(self.partitions), timeout_s=5.0)
        except SourceError as exc:  # Kafka slow to answer: the batch's own read decides
            logger.warning("could not check the topic ids before the batch: %s", exc)
            current = self.topic_ids
        problems = [
            recreated(t, self.topic_ids[t], i, self.offsets.get(t, {}))
            for t, i in current.items()
            if self.topic_ids.get(t) not in (None, i)
        ]
        if problems:
            raise OffsetsGone(self.config.sink_id, problems)
        end = batch_end_offsets(self._checkpoint, batch_id)
        if new := sorted(set(end) - set(self.partitions)):  # created since the start: the pattern matched
            logger.info("new topic(s) %s: reading them from the earliest offset", new)
            self.partitions = partitions(self.config.kafka)
            self.topic_ids = {**self.topic_ids, **topic_ids(self._admin, new)}
            self._starts |= earliest_offsets(self.config.kafka, {t: self.partitions.get(t, []) for t in new})
        self.process_batch(self._records(frame, batch_id, end), end)
        self._read = merge_offsets(self._read, end)
        if self.held is not None:
            self.metrics.set_held(self.held.counts())
        self._batch_done.set()

    def _flush_when_idle(self) -> None:
        """Commit a buffer whose ``commit.max_period`` passed while no micro-batch came.

        Spark runs no micro-batch while no record arrives, so the batch path alone would leave the
        buffer of the last batches before a pause invisible until traffic resumes.
        """
        if self.held is not None and self.held.due(time.monotonic()):
            self._exclusive(
                lambda: self._commit_held(
                    self.held.due(time.monotonic()) if self.held else [], "due, no new batch"
                )
            )
        buffer = self._buffer
        if not buffer.frames or not self.cadence.due(buffer.bytes, buffer.age(time.monotonic())):
            return

        def flush() -> None:
            buffer = self._buffer  # a batch may have flushed it meanwhile
            if buffer.frames and self.cadence.due(buffer.bytes, buffer.age(time.monotonic())):
                logger.info(
                    "commit.max_period passed with no new batch: committing %d buffered batch(es), %d bytes",
                    len(buffer.frames),
                    buffer.bytes,
                )
                self.flush()

        self._exclusive(flush)

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

    # -- one batch -------------------------------------------------------------------------------------

    def process_batch(self, records: KafkaBatch, end: Offsets) -> None:
        """Write one micro-batch and commit it, or buffer it while the cadence says to wait.

        ``end`` is where Spark's source ends the batch (:func:`service.kafka.source.batch_end_offsets`):
        what the commit covers, past any aborted records and transaction markers at its end. With an
        empty buffer the Arrow path is tried first, table by table; a table's records it declines are
        written by Spark's path.
        """
        if self.arrow_decoder and not self._buffer.frames:
            self._write_and_commit(records, end, arrow=True)
            return
        rows = records.rows.persist()
        ranges = (
            rows.groupBy("topic", "partition")
            .agg(F.max("timestamp").alias("newest"), F.sum(F.length("value")).alias("bytes"))
            .collect()
        )
        buffer = self._buffer
        if not ranges:
            rows.unpersist()
            if buffer.frames:
                buffer.offsets = merge_offsets(buffer.offsets, end)
            else:
                self._commit_offsets(end)
            return
        newest = max((r["newest"] for r in ranges if r["newest"] is not None), default=None)
        buffer.add(rows, end, sum(r["bytes"] or 0 for r in ranges), newest, time.monotonic())
        if self.cadence.due(buffer.bytes, buffer.age(time.monotonic())):
            self.flush()
        else:
            logger.debug("buffered %d bytes in %d batch(es); not yet due", buffer.bytes, len(buffer.frames))

    def flush(self) -> None:
        """Decode, compact, write and commit everything buffered, one snapshot per table."""
        buffer, self._buffer = self._buffer, Buffer()
        if not buffer.frames:
            return
        records = reduce(DataFrame.unionAll, buffer.frames)
        try:
            self._write_and_commit(KafkaBatch(records), buffer.offsets, arrow=False, newest=buffer.newest)
        finally:
            for frame in buffer.frames:
                frame.unpersist()

    def _write_and_commit(
        self, records: KafkaBatch, end: Offsets, arrow: bool, newest: datetime | None = None
    ) -> None:
        """Each table the batch touches writes its records (its topics'), then one plan commits them."""
        offsets = merge_offsets(self.offsets, end)
        writes: list[TableWrite] = []
        persisted: KafkaBatch | None = None
        touched = self.routes.touched(end, self._read if self.held else self.offsets)
        if (
            arrow and len(touched) > 1 and records.ranges is None
        ):  # each table's job reads its rows: once from Kafka
            persisted = records = records.persist()
        try:
            done = (
                self._arrow_tables(records, touched, offsets, end)
                if arrow and self.routes.many
                else ArrowTables()
            )
            held = self._hold(done, offsets, touched)
            for identifier, topics in touched.items():
                if identifier in done.held:
                    continue
                if identifier in self.routes.paused:  # its records stay in Kafka, its offsets behind
                    continue
                if identifier in self.routes.isolated:
                    self._dead_letter_table(identifier, self._records_of(records, topics).rows)
                    continue
                pipeline = self.routes.pipelines[identifier]
                mine = self._offsets_of(identifier, offsets) if self.routes.many else offsets
                if self.held is not None and identifier in self.held and identifier not in done.writes:
                    # Spark's path writes this batch: the changes held from earlier ones land first. Not
                    # under the isolation below: held rows that fail to land stop the sink, and the
                    # next start reads them again.
                    self._commit_held([identifier], "its batch takes Spark's path")
                try:
                    write = done.writes.get(identifier)
                    if arrow and not self.routes.many and pipeline.arrow_ready():
                        write = pipeline.write_arrow(self._records_of(records, topics), mine)
                    if write is None:
                        if arrow and persisted is None:  # declined: Spark's path reads the batch again
                            persisted = records = records.persist()
                        write = pipeline.write_spark(self._records_of(records, topics).rows, mine, newest)
                except Exception as exc:
                    if not self.routes.may_isolate(identifier, exc):
                        raise
                    self.routes.isolate(identifier, exc)
                    if identifier in self.routes.isolated:
                        self._dead_letter_table(identifier, self._records_of(records, topics).rows)
                    continue
                writes.append(write)
        finally:
            if persisted is not None:
                persisted.unpersist()
        if self.routes.many:
            writes = [w for w in writes if w.files or w.records]
        offsets = self._sink_offsets(offsets)
        if writes or held is not None or offsets != self.offsets:
            self._commit(writes, offsets, held)

    def _arrow_tables(
        self, records: KafkaBatch, touched: dict[str, list[str]], offsets: Offsets, end: Offsets
    ) -> ArrowTables:
        """The tables of a batch the Arrow path can take, written (or, for a table whose changes are
        held, decoded) in one Spark job; the others (and any it declined) are left to Spark's path,
        table by table."""
        ready = {
            identifier: (pipeline, topics, self._offsets_of(identifier, offsets))
            for identifier, topics in touched.items()
            if (pipeline := self.routes.pipelines.get(identifier)) is not None and pipeline.arrow_ready()
        }
        if not ready:
            return ArrowTables()
        hold = set()
        if self.held is not None:
            new_records = {t: self._records_in(end, topics) for t, (_, topics, _) in ready.items()}
            self._commit_held(self.held.big_batches(new_records), "a batch big enough on its own")
            hold = {t for t, n in new_records.items() if self.held.to_hold(t, n)}
        try:
            return write_arrow_tables(records, ready, hold)
        except TABLE_FAILURES as exc:  # one table's own failure: found again, table by table, below
            logger.warning(
                "writing %d tables in one job failed (%s); writing them one by one", len(ready), exc
            )
            return ArrowTables()

    def _records_in(self, end: Offsets, topics: list[str]) -> int:
        """About how many records of ``topics`` a batch ending at ``end`` holds (markers included)."""
        return sum(
            max(0, o - self._read.get(t, {}).get(p, 0)) for t in topics for p, o in end.get(t, {}).items()
        )

    def _hold(
        self, done: ArrowTables, offsets: Offsets, touched: dict[str, list[str]]
    ) -> Callable[[], list[TableWrite]] | None:
        """Hold the batch's rows of the tables whose changes are held; take those now due (by their
        count, or by the age of their oldest held change, whether this batch touched them or not):
        what writes them, with the batch's plan (in the commit thread).

        A table this batch touched whose rows it did not hold (declined, or not for the Arrow path) is
        left alone here: its batch takes Spark's path, and its held rows are committed first, as a plan
        of their own (``_write_and_commit``), never beside that batch's files in one plan."""
        if self.held is None:
            return None
        now = time.monotonic()
        for identifier, batch in done.held.items():
            self.held.add(identifier, batch, self._offsets_of(identifier, offsets), now)
        due = [t for t in self.held.due(now) if t in done.held or t not in touched]
        if due or done.held:
            logger.debug(
                "changes held (records) for %s; due now: %s", self.held.summary(), ", ".join(due) or "none"
            )
        if not due:
            return None
        return self.held.take(due, lambda t: self.routes.pipelines[t].write_spec())

    def _offsets_of(self, identifier: str, offsets: Offsets) -> Offsets:
        """``offsets`` of every topic that lands in the table (those the batch did not move too: a
        table's last commit then says where each of its topics stands, which reseed relies on)."""
        return {t: offsets[t] for t in self.routes.topics_of(identifier) if t in offsets}

    def _commit_held(self, tables: list[str], why: str) -> None:
        """Write and commit the held changes of ``tables`` as a plan of their own."""
        if self.held is None or not tables:
            return
        writes = [
            w
            for w in self.held.write(tables, lambda t: self.routes.pipelines[t].write_spec())
            if w.files or w.records
        ]
        offsets = self._sink_offsets(
            merge_offsets(self.offsets, {t: o for w in writes for t, o in w.offsets.items()})
        )
        logger.info("committing the held changes of %d table(s): %s", len(tables), why)
        if writes or offsets != self.offsets:
            self._commit(writes, offsets)
        self.metrics.set_held(self.held.counts())

    def _sink_offsets(self, offsets: Offsets) -> Offsets:
        """``offsets`` with the topics of the tables holding changes, and of paused tables, kept where
        they were committed: their records are read again after a restart."""
        behind = self.routes.paused_topics()
        if self.held is not None:
            behind |= self.held.topics(self.routes.topics_of)
        if not behind:
            return offsets
        kept = {t: parts for t, parts in offsets.items() if t not in behind}
        # A topic never committed yet is recorded where the sink began reading it: left out, a restart
        # under `starting_offsets: latest` would take it to be new and skip what the sink had read.
        committed = {t: self.offsets.get(t) or self._starts.get(t) for t in behind}
        return kept | {t: dict(parts) for t, parts in committed.items() if parts}

    def _dead_letter_table(self, identifier: str, records: DataFrame) -> None:
        """An isolated table's records of this batch, to the dead-letter topic with the reason."""
        reason = f"table {identifier} isolated: {self.routes.isolated[identifier]}"
        sent = dead_letter.send(
            records.withColumn("error", F.lit(reason)),
            self.config.kafka,
            self.config.dead_letter_topic,
            self.config.sink_id,
        )
        if sent.sent:
            self.metrics.dead_letters.add(sent.sent, self.metrics.attrs(table=identifier))
            logger.warning(
                "table %s is isolated: %d record(s) sent to the dead-letter topic", identifier, sent.sent
            )
        if sent.failed:
            self.metrics.dead_letters_failed.add(len(sent.failed), self.metrics.attrs(table=identifier))

    def _records_of(self, records: KafkaBatch, topics: list[str]) -> KafkaBatch:
        return records.of_topics(topics) if self.routes.many else records

    def _commit_offsets(self, end: Offsets) -> None:
        """Commit a batch that held no record to read: only aborted records or transaction markers.

        Their offsets are done with; committing them keeps the lag at zero and spares the next start
        reading them again.
        """
        offsets = self._sink_offsets(merge_offsets(self.offsets, end))
        if offsets == self.offsets:
            return
        now = time.monotonic()
        writes = [] if self.routes.many else [TableWrite(t, offsets, now, now) for t in self.routes.pipelines]
        self._commit(writes, offsets)

    def _commit(
        self,
        writes: list[TableWrite],
        offsets: Offsets,
        later: Callable[[], list[TableWrite]] | None = None,
    ) -> None:
        """Commit the batch's writes as one plan (service.channel.committer), then report each table's.

        ``later`` writes more of the plan's tables (held tables come due) where the plan is made: in
        the commit thread, while the next batch is read and written."""
        topic_ids, tables, many = dict(self.topic_ids), dict(self.routes.tables), self.routes.many
        # A one-table sink whose table is isolated: only the offsets move.
        offsets_only = self._offsets_plan(offsets) if not many and not writes else None
        plans: list[PendingCommit] = []
        # The offsets of the last plan handed over: committed, or being committed in the background;
        # a plan that fails stops the sink, and the next start reads the txnlog's.
        self.offsets = offsets

        def plan() -> BatchPlan:
            if later is not None:
                writes.extend(w for w in later() if w.files or w.records)
            plans.extend(w.plan({t: i for t, i in topic_ids.items() if t in w.offsets}) for w in writes)
            for write in writes:
                self.metrics.write_duration.record(write.write_s, self.metrics.attrs(table=write.table))
            if many:
                return BatchPlan(offsets, plans, topic_ids, tables)
            return BatchPlan.of_one_table(plans[0]) if offsets_only is None else offsets_only

        def done(result: CommitResult, commit_s: float) -> None:
            for write, table_plan in zip(writes, plans, strict=True):
                report_commit(self.metrics, write, table_plan, result.seq, commit_s)
            if not writes:
                logger.info("committed seq %d: offsets only (no records to write)", result.seq)
            if self._target is not None:
                reached = sum(o for t in offsets.values() for o in t.values())
                todo = sum(o for t in self._target.values() for o in t.values())
                logger.info("catch-up progress: %d of %d offsets", min(reached, todo), todo)

        self.commits.submit(plan, done)
