"""The streaming job: Kafka → decode → latest change per key → Parquet files → one commit per batch.

Start-up order matters and is the exactly-once story in miniature: check Kafka and the table,
start Spark with its jars (a missing one stops start-up here, before anything is claimed), claim the
sink (fencing any older replica), check that the table holds no commit of this sink newer than the log knows, finish a
plan left in precommit, and only then start reading Kafka from the committed offsets held by the
txnlog. Spark's checkpoint is a throwaway directory: the log is the truth.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial, reduce
from typing import Any, TypeVar

from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service import dead_letter, spark_jars
from service.channel.cadence import CommitCadence
from service.channel.committer import Committer
from service.channel.pending import Offsets, PendingCommit, merge_offsets, new_snapshot_id
from service.config import Mode, SinkConfig
from service.data import arrow_batch
from service.data.arrow_decode import Declined, unsupported
from service.data.columns import (
    Column,
    Encoding,
    SchemaError,
    column_from_config,
    columns_for_table,
    columns_from_envelope_schema,
    with_encodings,
)
from service.data.debezium import (
    ERROR_COLUMN,
    KAFKA_POSITION,
    SOURCE_COLUMNS,
    decode,
    latest_per_key,
    schema_text,
)
from service.data.files import OP_COLUMN, OUTPUT_SCHEMA, WriteSpec, write_partition
from service.failpoints import configure as configure_failpoints
from service.health import Health
from service.iceberg.datafile_json import from_json
from service.iceberg.evolution import EvolutionPolicy, apply, check, plan
from service.iceberg.tables import (
    DEFAULT_TABLE_PROPERTIES,
    check_write_properties,
    delete_spec,
    ensure_table,
    format_version_problem,
    open_catalog,
    parse_partition_field,
)
from service.lag import start_lag_monitor
from service.metrics import SinkMetrics, setup_metrics
from service.offsets import OffsetsGone, check_committed, recreated
from service.retrying import Backoff, catalog_answer, log_failure, retry_call
from service.source import (
    SourceError,
    admin,
    batch_end_offsets,
    end_offsets,
    partitions,
    peek_schema,
    spark_options,
    starting_offsets,
    topic_ids,
)
from service.spark_jars import SparkJarsError
from service.txnlog_client import open_txnlog
from service.units import parse_duration
from txnlog import Fenced, Lease, LockTimeout

logger = logging.getLogger(__name__)
T = TypeVar("T")


class StopRequested(RuntimeError):
    """A batch that began after a stop request is not processed (its offsets stay uncommitted)."""


class SinkFenced(RuntimeError):
    """A newer replica took over; this one must stop without writing anything more."""


def _brief(exc: BaseException) -> str:
    """An error in one line: Spark wraps worker failures in pages of Java and Python stack traces."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b.*:", line)]
    last = causes[-1] if causes else lines[-1]
    first = lines[0][:300]
    return f"{type(exc).__name__}: {first}" + (f" ... {last[:300]}" if last[:300] != first else "")


REQUEST_TIMEOUT_PROPERTY = "icesink.request-timeout"  # catalog property, a duration (default 60s)


def bound_catalog_requests(catalog: Catalog, timeout_s: float) -> None:
    """Give the REST catalog's HTTP requests a timeout; pyiceberg sets none.

    A catalog that accepts a request and never answers would otherwise stall the sink for good. A
    commit that times out is an unknown outcome: the Committer looks for its snapshot, then retries.
    """
    session = getattr(catalog, "_session", None)
    if session is None:
        return
    send = session.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = timeout_s
        return send(method, url, *args, **kwargs)

    session.request = request


def catalog_retries(config: SinkConfig, what: str, call: Callable[[], T]) -> T:
    """Run a start-up step that talks to the catalog, again after an answer that may pass.

    A catalog whose database connection was just reset answers a 500 once, a busy one a 429: start-up
    waits and tries again (``commit.retries`` attempts, backoff 0.5 s doubling to 10 s) instead of
    crashing. Every start-up step is safe to run again: it loads what exists and creates only what is
    missing.
    """
    attempts = config.commit.retries
    return retry_call(
        call,
        Backoff(attempts, initial_s=0.5, max_s=10.0),
        retry_on=lambda exc: catalog_answer(exc) is not None,
        on_failure=log_failure(logger, what, attempts),
    )


def build_spark(config: SinkConfig, master: str | None = None) -> SparkSession:
    """The sink's Spark session, with the jars it needs (:mod:`service.spark_jars`).

    A jar that is missing, can't be fetched or resolved, or lacks a class the Kafka source needs raises
    :class:`SparkJarsError` here: the sink builds its session before it claims anything.
    """
    # Python workers must run the same interpreter (and packages) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jars = spark_jars.resolve(config.spark)
    spark_jars.check_files(jars)
    master = master or config.spark.master
    builder = (
        SparkSession.builder.master(master)
        .appName(config.spark.app_name or f"icesink-{config.sink_id}")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(config.write.parallelism))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    if master.startswith("local"):
        # A local-mode driver needs no address reachable from elsewhere.
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    for key, value in {**jars.conf, **config.spark.conf}.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except PySparkRuntimeError as exc:
        # Spark resolves packages before its JVM is up: Ivy's report (above, on stderr) names the
        # module it could not find, and the gateway just exits.
        if jars.packages and exc.getCondition() == "JAVA_GATEWAY_EXITED":
            raise SparkJarsError(
                f"Spark did not start: it could not resolve the packages {', '.join(jars.packages)} "
                f"(spark.jars.packages, through Ivy in {jars.ivy_home}; Ivy's report above says which "
                f"module it did not find)"
            ) from None
        raise
    spark.sparkContext.setLogLevel("WARN")
    try:
        spark_jars.check_session(spark, jars)
    except SparkJarsError:
        spark.stop()
        raise
    logger.info("Spark jars: %s", jars.describe())
    return spark


def check_new_table(config: SinkConfig, catalog: Catalog, declared: list[Column] | None) -> None:
    """Refuse key and partition settings a new table can't have, before anything is created.

    Otherwise the error surfaces halfway: after the namespace was created, or (a transform that does
    not fit its column's type) after the table was created without its partitioning.
    """
    from service.data.columns import SchemaError, check_key_types

    cfg = config.table
    if not cfg.create or declared is None or catalog.table_exists(cfg.identifier):
        return
    version = {**DEFAULT_TABLE_PROPERTIES, **cfg.properties}["format-version"]
    if (problem := format_version_problem(cfg.identifier, version)) is not None:
        raise SchemaError(f"table.properties: {problem}")
    types = {c.name: c.type for c in declared}
    missing = [k for k in cfg.key if k not in types]
    if missing:
        raise SchemaError(f"table.key: column(s) {missing} are not among the columns {sorted(types)}")
    check_key_types(types, cfg.key)
    for text in cfg.partition_by:
        column, transform = parse_partition_field(text)
        if column not in types:
            raise SchemaError(f"partition_by: column {column!r} is not among the columns {sorted(types)}")
        if not transform.can_transform(types[column]):
            raise SchemaError(
                f"partition_by: {text!r}: {transform} can't be applied to {column} (type {types[column]})"
            )


def resolve_columns(config: SinkConfig, catalog: Catalog) -> tuple[Table, dict[str, Encoding]]:
    """The table (created or evolved if needed) and the encodings the events use per column."""
    declared: list[Column] | None = None
    if config.table.columns:
        declared = [column_from_config(c.name, c.type, c.required, c.encoding) for c in config.table.columns]
    else:
        schema = peek_schema(config.kafka)
        if schema is not None:
            declared = columns_from_envelope_schema(schema, variable_scale=config.source.variable_scale_type)
    check_new_table(config, catalog, declared)
    table = ensure_table(catalog, config, declared)
    return table, {c.name: c.encoding for c in declared or []}


@dataclass
class _Buffer:
    """Micro-batches read but not yet committed (see service.channel.cadence)."""

    frames: list[DataFrame] = field(default_factory=list)
    offsets: Offsets = field(default_factory=dict)
    bytes: int = 0
    newest: datetime | None = None
    since: float | None = None  # time.monotonic() when the first batch was buffered

    def age(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since


@dataclass
class BatchOutcome:
    records: int = 0
    dead_letters: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    decoder: str = "spark"


class SinkJob:
    def __init__(self, config: SinkConfig, health: Health | None = None) -> None:
        self.config = config
        self.health = health or Health()
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.log = open_txnlog(config, "run")
        self.metrics: SinkMetrics = setup_metrics(config.metrics, config.sink_id, config.table.identifier)
        self.catalog = catalog_retries(config, "connecting to the catalog", lambda: open_catalog(config))
        bound_catalog_requests(
            self.catalog, parse_duration(config.catalog.get(REQUEST_TIMEOUT_PROPERTY, "60s")).total_seconds()
        )
        self.fatal: BaseException | None = None
        self._batch_lock = threading.Lock()
        self._buffer = _Buffer()
        self.cadence = CommitCadence(config.commit.min_size, config.commit.max_period)
        self._stop_requested = threading.Event()

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
        self.table, self.encodings = catalog_retries(
            self.config, "loading (or creating) the table", lambda: resolve_columns(self.config, self.catalog)
        )
        check_write_properties(self.table, self.config.write.table_properties())
        self.columns = columns_for_table(self.table.schema(), self.encodings)
        # Events with schema sections are watched for schema changes; configured columns are fixed.
        self.track_schemas = not self.config.table.columns
        self.known_schemas: dict[str, dict[str, Encoding]] = {}  # schema text → its columns' encodings
        self.rejected_schemas: dict[str, str] = {}
        self.arrow_schemas: set[str] = set()  # schema sections the Arrow path checked (normalised)
        self.arrow_decoder = self._arrow_decoder_usable()

    def claim_and_recover(self) -> None:
        """Claim the sink (fencing older replicas), then finish what the last one left in precommit."""
        self.lease: Lease = self._claim()
        logger.info("sink %s claimed epoch %d as %s", self.config.sink_id, self.lease.epoch, self.owner)
        self.committer = Committer(
            self.log, self.lease, self.catalog, self.metrics, max_attempts=self.config.commit.retries
        )
        self.committer.check_log_is_current(
            catalog_retries(
                self.config,
                "reading the sink's commits in the table",
                lambda: self.catalog.load_table(self.config.table.identifier),
            )
        )
        try:
            self.committer.recover()
            committed = self.committer.committed()
            check_committed(self.config, self.partitions, self.topic_ids, committed)
            self.offsets: Offsets = committed.offsets if committed else {}
            self._record_starting_offsets()
        except Fenced as exc:
            raise SinkFenced(str(exc)) from exc

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
        pending = PendingCommit(
            table=self.config.table.identifier,
            offsets=merge_offsets(self.offsets, latest),
            snapshot_id=None,
            topic_ids=dict(self.topic_ids),
            note=f"starting_offsets latest, resolved for {sorted(new)}",
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
        self._arrow_skip_reason: str | None = None
        return True

    def _arrow_path_for_this_batch(self) -> bool:
        """The Arrow path can be off for a while: a column without an Arrow conversion (added by an
        evolution), or events dead-lettered for their schema (only Spark's decoder knows which)."""
        reason = unsupported(self.columns)
        if reason is None and self.rejected_schemas:
            reason = "events of an incompatible schema are being dead-lettered"
        if reason != self._arrow_skip_reason:
            if reason:
                logger.info("decoding batches with Spark's decoder for now: %s", reason)
            self._arrow_skip_reason = reason
        return reason is None

    def _check_schema_sections(self, table: Table, texts: set[str]) -> str | None:
        """Why the Arrow path can't take events with these schema sections, or None.

        A section is taken when the table needs no change for it (the tasks decoded each event with
        its own section's encodings); anything else (a new column, a widening, an incompatible
        change) is for Spark's path, whose schema step evolves the table or refuses.
        """
        policy = EvolutionPolicy(self.config.table.schema_evolution)
        for text in texts - self.arrow_schemas:
            try:
                columns = columns_from_envelope_schema(
                    json.loads(text), variable_scale=self.config.source.variable_scale_type
                )
                evolution = plan(table.schema(), columns)
                check(evolution, policy, self.config.table.identifier)
            except (SchemaError, ValueError):
                return "an event schema that does not fit the table"
            if evolution.changes:
                return f"an event schema that evolves the table ({evolution.describe()})"
            self.arrow_schemas.add(text)
        return None

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

    @property
    def upsert(self) -> bool:
        return self.config.table.mode is Mode.UPSERT

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
        reader = (
            spark.readStream.format("kafka")
            .options(**spark_options(self.config.kafka))
            .option("subscribe", ",".join(self.config.kafka.topics))
            .option("startingOffsets", start)
            .option("failOnDataLoss", "true")
        )
        if self.config.kafka.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.config.kafka.max_offsets_per_trigger))
        writer = (
            reader.load().writeStream.foreachBatch(self._on_batch).option("checkpointLocation", checkpoint)
        )
        if until_caught_up:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(
                processingTime=f"{self.config.commit.trigger_interval.total_seconds()} seconds"
            )
        query = writer.start()
        self.health.set_ready(sink_id=self.config.sink_id, epoch=self.lease.epoch)
        lag_monitor = start_lag_monitor(self.config, self.partitions, lambda: self.offsets, self.metrics)
        logger.info("consuming %s from %s", self.config.kafka.topics, start)
        try:
            try:
                # A batch that starts after a stop request fails the query on purpose (StopRequested),
                # possibly while this loop still waits: that is the graceful path too.
                while query.isActive and not self._stop_requested.is_set():
                    query.awaitTermination(1)
                    self._flush_when_idle()
                if query.isActive:
                    logger.info("stop requested: finishing the batch in flight, then stopping")
                    with self._batch_lock:
                        query.stop()
                query.awaitTermination()
            except Exception:
                if not isinstance(self.fatal, StopRequested):
                    raise
                logger.info("stop requested: stopped after the batch in flight")
            if self.fatal is None or isinstance(self.fatal, StopRequested):
                with self._batch_lock:
                    self.flush()  # what the cadence held back
        except Exception as exc:
            if self.fatal is not None:
                raise self.fatal from None
            self._explain_stream_failure(exc)
            raise
        finally:
            if query.isActive:  # this loop failed (an idle flush): no batch may run after it
                query.stop()
            self.health.set_not_ready("stopped")
            lag_monitor.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
        if self.fatal is not None and not isinstance(self.fatal, StopRequested):
            raise self.fatal

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

    def _on_batch(self, records: DataFrame, batch_id: int) -> None:
        if self._stop_requested.is_set():
            self.fatal = StopRequested("stop requested before the batch started")
            raise self.fatal
        self._exclusive(lambda: self._batch(records, batch_id))

    def _batch(self, records: DataFrame, batch_id: int) -> None:
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
        self.process_batch(records, batch_end_offsets(self._checkpoint, batch_id))

    def _flush_when_idle(self) -> None:
        """Commit a buffer whose ``commit.max_period`` passed while no micro-batch came.

        Spark runs no micro-batch while no record arrives, so the batch path alone would leave the
        buffer of the last batches before a pause invisible until traffic resumes.
        """
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
            except Fenced as exc:
                self.metrics.fenced.add(1, self.metrics.attrs())
                self.fatal = SinkFenced(str(exc))
                raise
            except BaseException as exc:
                self.fatal = exc
                raise

    # -- one batch -------------------------------------------------------------------------------------

    def process_batch(self, records: DataFrame, end: Offsets) -> None:
        """Buffer one micro-batch; commit the buffer when the cadence says so (default: every batch).

        ``end`` is where Spark's source ends the batch (:func:`service.source.batch_end_offsets`):
        what the commit covers, past any aborted records and transaction markers at its end.
        """
        if (
            self.arrow_decoder
            and not self._buffer.frames
            and self._arrow_path_for_this_batch()
            and self._flush_arrow(records, end)
        ):
            return
        records = records.persist()
        ranges = (
            records.groupBy("topic", "partition")
            .agg(
                F.max("timestamp").alias("newest"),
                F.sum(F.length("value")).alias("bytes"),
            )
            .collect()
        )
        buffer = self._buffer
        if not ranges:
            records.unpersist()
            if buffer.frames:
                buffer.offsets = merge_offsets(buffer.offsets, end)
            else:
                self._commit_offsets(end)
            return
        buffer.frames.append(records)
        buffer.offsets = merge_offsets(buffer.offsets, end)
        now = time.monotonic()
        if buffer.since is None:
            buffer.since = now
        for row in ranges:
            buffer.bytes += row["bytes"] or 0
            if row["newest"] is not None and (buffer.newest is None or row["newest"] > buffer.newest):
                buffer.newest = row["newest"]
        if self.cadence.due(buffer.bytes, buffer.age(now)):
            self.flush()
        else:
            logger.debug("buffered %d bytes in %d batch(es); not yet due", buffer.bytes, len(buffer.frames))

    def flush(self) -> None:
        """Decode, compact, write and commit everything buffered, as one snapshot."""
        buffer, self._buffer = self._buffer, _Buffer()
        if not buffer.frames:
            return
        started = time.monotonic()
        records = reduce(DataFrame.unionAll, buffer.frames)
        offsets = merge_offsets(self.offsets, buffer.offsets)
        try:
            pending, outcome = self._retrying(lambda: self._evolve_and_write(records, offsets))
            self._commit(pending, outcome, started, buffer.newest)
        finally:
            for frame in buffer.frames:
                frame.unpersist()

    def _commit_offsets(self, end: Offsets) -> None:
        """Commit a batch that held no record to read: only aborted records or transaction markers.

        Their offsets are done with; committing them keeps the lag at zero and spares the next start
        reading them again.
        """
        offsets = merge_offsets(self.offsets, end)
        if offsets != self.offsets:
            outcome = BatchOutcome()
            self._commit(self._pending([], offsets, outcome), outcome, time.monotonic(), None)

    def _flush_arrow(self, records: DataFrame, end: Offsets) -> bool:
        """Write and commit the batch through the one-job Arrow path; False if it declined the batch."""
        started = time.monotonic()
        try:
            batch = self._retrying(lambda: self._write_arrow(records))
        except Declined as exc:
            logger.info("batch declined by the Arrow decoder (%s); decoding it with Spark", exc)
            self.metrics.declined_batches.add(1, self.metrics.attrs())
            return False
        logger.debug(
            "Arrow batch: %d records; in the tasks: decode + compaction %.2fs, files %.2fs; job %.2fs",
            batch.records,
            batch.task_seconds.get("decode", 0.0),
            batch.task_seconds.get("write", 0.0),
            time.monotonic() - started,
        )
        offsets = merge_offsets(self.offsets, end)
        if batch.records or offsets != self.offsets:
            outcome = BatchOutcome(records=batch.records, by_op=batch.by_op, decoder="arrow")
            self._commit(self._pending(batch.files, offsets, outcome), outcome, started, batch.newest)
        return True

    def _commit(self, pending: PendingCommit, outcome: BatchOutcome, started: float, newest: object) -> None:
        written = time.monotonic()
        self.metrics.write_duration.record(written - started, self.metrics.attrs())
        result = self.committer.commit(pending)
        committed = time.monotonic()
        self.offsets = pending.offsets
        self._record(pending, outcome, result.seq, written - started, committed - written, newest)

    def _retrying(self, write: Callable[[], T]) -> T:
        """Run ``write`` (a batch's files, no commit), retrying failures that are not the records' fault.

        A batch that fails as a whole (catalog or object store down, the dead-letter topic refusing
        writes) is retried with bounded exponential backoff, and its records are never dead-lettered
        for it. Nothing is precommitted before this returns, so a retry is safe; the files of a failed
        attempt are orphans (``icesink orphans``). After ``commit.retries`` attempts the error stops the
        sink, and a restart resumes from the committed offsets.
        """
        attempts = self.config.commit.retries

        def on_failure(attempt: int, exc: BaseException) -> None:
            logger.warning(
                "writing the batch failed (attempt %d/%d): %s", attempt, max(1, attempts), _brief(exc)
            )

        return retry_call(
            write,
            Backoff(attempts, initial_s=1.0, max_s=30.0),
            retry_on=lambda exc: (
                isinstance(exc, Exception) and not isinstance(exc, SchemaError | StopRequested | Declined)
            ),
            on_failure=on_failure,
        )

    def _evolve_and_write(self, records: DataFrame, offsets: Offsets) -> tuple[PendingCommit, BatchOutcome]:
        return self._write(records, offsets, self._evolve(records))

    def _write_arrow(self, records: DataFrame) -> arrow_batch.ArrowBatch:
        table = self.catalog.load_table(self.config.table.identifier)
        spec = arrow_batch.ArrowBatchSpec(
            write=self._write_spec(table),
            columns=self.columns,
            max_record_bytes=self.config.source.max_record_bytes,
            schema_sections=self.track_schemas,
        )
        check_schemas = partial(self._check_schema_sections, table) if self.track_schemas else None
        return arrow_batch.run(records, spec, check_schemas)

    def _write_spec(self, table: Table) -> WriteSpec:
        """What the tasks need to write this batch's files into ``table`` as it is now."""
        cfg = self.config
        delete_spec_id = None
        if self.upsert:
            table, delete_spec_id = delete_spec(table, cfg.table.key)
        return WriteSpec(
            metadata=table.metadata,
            io_properties=dict(table.io.properties),
            key=list(cfg.table.key),
            upsert=self.upsert,
            delete_spec_id=delete_spec_id,
            writer_properties=cfg.write.table_properties(),
        )

    def _pending(self, files: list[DataFile], offsets: Offsets, outcome: BatchOutcome) -> PendingCommit:
        data = [f for f in files if int(f.content) == 0]
        deletes = [f for f in files if int(f.content) != 0]
        return PendingCommit(
            table=self.config.table.identifier,
            offsets=offsets,
            snapshot_id=new_snapshot_id() if files else None,
            data_files=data,
            delete_files=deletes,
            topic_ids=dict(self.topic_ids),
            stats={
                "records": outcome.records,
                "dead_letters": outcome.dead_letters,
                "data_rows": sum(f.record_count for f in data),
                "delete_rows": sum(f.record_count for f in deletes),
                "bytes": sum(f.file_size_in_bytes for f in files),
            },
        )

    def _evolve(self, records: DataFrame) -> dict[str, list[Column]]:
        """Evolve the table for schema versions first seen in this batch (service.iceberg.evolution).

        Returns the columns to decode each of the batch's schema versions with, for the versions that
        encode a column unlike the sink's current columns: a source column changed from DATETIME(3)
        to DATETIME(6) comes in milliseconds, then in microseconds, and a batch can hold both. The
        current encodings are those of the batch's newest version (by Kafka timestamp), which the
        next batches most likely carry.
        """
        if not self.track_schemas:
            return {}
        section = schema_text(F.col("value")).alias("section")
        newest_first = [
            r["section"]
            for r in records.select(section, "timestamp")
            .where(F.col("section").isNotNull())
            .groupBy("section")
            .agg(F.max("timestamp").alias("newest"))
            .orderBy(F.col("newest").desc())
            .collect()
        ]
        new = [t for t in newest_first if t not in self.known_schemas and t not in self.rejected_schemas]
        cfg = self.config.table
        before = dict(self.encodings)
        table: Table | None = None  # loaded only when something changes
        for text in reversed(new):  # oldest first
            table = table or self.catalog.load_table(cfg.identifier)
            try:
                columns = columns_from_envelope_schema(
                    json.loads(text), variable_scale=self.config.source.variable_scale_type
                )
                evolution = plan(table.schema(), columns)
                check(evolution, EvolutionPolicy(cfg.schema_evolution), cfg.identifier)
            except SchemaError as exc:
                if cfg.on_incompatible_schema != "dead_letter":
                    raise
                logger.error("events with an incompatible schema go to the dead-letter topic: %s", exc)
                self.rejected_schemas[text] = str(exc)
                continue
            table = apply(table, evolution)
            self.known_schemas[text] = {c.name: c.encoding for c in columns}
            self.encodings.update(self.known_schemas[text])
        latest = next((t for t in newest_first if t in self.known_schemas), None)
        if latest is not None:
            self.encodings.update(self.known_schemas[latest])
        if new or self.encodings != before:
            table = table or self.catalog.load_table(cfg.identifier)
            self.columns = columns_for_table(table.schema(), self.encodings)
            self.arrow_schemas.clear()  # checked against the old table and encodings: check them again
        versions = {
            t: with_encodings(self.columns, self.known_schemas[t])
            for t in newest_first
            if t in self.known_schemas
        }
        return {t: columns for t, columns in versions.items() if columns != self.columns}

    def _write(
        self, records: DataFrame, offsets: Offsets, versions: dict[str, list[Column]]
    ) -> tuple[PendingCommit, BatchOutcome]:
        cfg = self.config
        columns = [F.col(f"`{c.name}`") for c in self.columns]
        # Only what counting and writing need is cached: the raw key and value (most of the bytes)
        # stay in the persisted records, from which the rare dead-letter write decodes again.
        changes = (
            self._decode(records, versions)
            .select(*columns, F.col(OP_COLUMN), *SOURCE_COLUMNS, *KAFKA_POSITION, F.col(ERROR_COLUMN))
            .persist()
        )
        try:
            outcome = BatchOutcome()
            for row in (
                changes.groupBy(OP_COLUMN, F.col(ERROR_COLUMN).isNotNull().alias("bad")).count().collect()
            ):
                outcome.records += row["count"]
                if row["bad"]:
                    outcome.dead_letters += row["count"]
                else:
                    op = row[OP_COLUMN]
                    outcome.by_op[op] = outcome.by_op.get(op, 0) + row["count"]
            good = changes.where(F.col(ERROR_COLUMN).isNull()).drop(ERROR_COLUMN)
            rows = latest_per_key(good, cfg.table.key) if self.upsert else good.where(F.col(OP_COLUMN) != "d")
            table = self.catalog.load_table(cfg.table.identifier)
            rows = rows.select(*columns, F.col(OP_COLUMN))
            spec = table.spec()
            if not spec.is_unpartitioned():
                sources = [table.schema().find_column_name(f.source_id) for f in spec.fields]
                rows = rows.repartition(cfg.write.parallelism, *[F.col(f"`{s}`") for s in sources if s])
            write_spec = self._write_spec(table)
            files = [
                from_json(json.loads(r["file"]))
                for r in rows.mapInArrow(partial(write_partition, write_spec), OUTPUT_SCHEMA).collect()
            ]
            # Last, so that a batch retried because its files could not be written (catalog or object
            # store down) does not send its dead letters twice.
            if outcome.dead_letters:
                self._dead_letter(self._decode(records, versions).where(F.col(ERROR_COLUMN).isNotNull()))
        finally:
            changes.unpersist()
        return self._pending(files, offsets, outcome), outcome

    def _decode(self, records: DataFrame, versions: dict[str, list[Column]]) -> DataFrame:
        """Spark's decoder; tombstones are deletes in upsert mode and ignored in append mode;
        ``versions``: see :meth:`_evolve`."""
        cfg = self.config
        return decode(
            records,
            self.columns,
            cfg.table.key,
            cfg.source.max_record_bytes,
            self.rejected_schemas,
            tombstones=self.upsert,
            versions=versions,
        )

    def _dead_letter(self, bad: DataFrame) -> None:
        sent = dead_letter.send(
            bad.withColumnRenamed(ERROR_COLUMN, "error"),
            self.config.kafka,
            self.config.dead_letter_topic,
            self.config.sink_id,
        )
        if sent.failed:
            self.metrics.dead_letters_failed.add(len(sent.failed), self.metrics.attrs())

    def _record(
        self,
        pending: PendingCommit,
        outcome: BatchOutcome,
        seq: int,
        write_s: float,
        commit_s: float,
        newest: object,
    ) -> None:
        m = self.metrics
        attrs = m.attrs()
        m.commit_duration.record(commit_s, attrs)
        m.commits.add(1, attrs)
        for op, n in outcome.by_op.items():
            m.records.add(n, m.attrs(op=op))
        if outcome.dead_letters:
            m.dead_letters.add(outcome.dead_letters, attrs)
        for content, files in (("data", pending.data_files), ("delete", pending.delete_files)):
            if files:
                m.written_bytes.add(sum(f.file_size_in_bytes for f in files), m.attrs(content=content))
                m.written_files.add(len(files), m.attrs(content=content))
        if hasattr(newest, "timestamp"):
            m.set_freshness(max(0.0, time.time() - newest.timestamp()))
        logger.info(
            "committed seq %d to %s: snapshot %s, %d records (%s), %d dead letters, %d data + %d delete rows, "
            "%d bytes, write %.2fs, commit %.2fs, %s decoder",
            seq,
            pending.table,
            pending.snapshot_id,
            outcome.records,
            ", ".join(f"{k}={v}" for k, v in sorted(outcome.by_op.items())) or "none",
            outcome.dead_letters,
            pending.stats["data_rows"],
            pending.stats["delete_rows"],
            pending.stats["bytes"],
            write_s,
            commit_s,
            outcome.decoder,
            extra={
                "fields": {
                    "table": pending.table,
                    "snapshot_id": pending.snapshot_id,
                    "seq": seq,
                    "records": outcome.records,
                    "bytes": pending.stats["bytes"],
                    "duration_s": round(write_s + commit_s, 3),
                    "write_s": round(write_s, 3),
                    "commit_s": round(commit_s, 3),
                    "decoder": outcome.decoder,
                }
            },
        )
        if hasattr(self, "_target"):
            done = sum(o for t in self.offsets.values() for o in t.values())
            todo = sum(o for t in self._target.values() for o in t.values())
            logger.info("catch-up progress: %d of %d offsets", min(done, todo), todo)
