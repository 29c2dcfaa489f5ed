"""The read step: the stream's Kafka source, and each micro-batch's records as one :class:`Batch`.

Two sources (``source.reader``): Spark's Kafka source, whose rows are the records; or the range source
(:mod:`service.kafka.stream_source`), whose batches are offset ranges that the write step's tasks
read themselves. Either way a batch ends where Spark's offset log says (past aborted records and
transaction markers), and its topics are checked first: a topic deleted and re-created while the sink
runs would otherwise be read from the old offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from service.commit.plan import BatchPlan
from service.config import SinkConfig
from service.kafka.lookups import (
    SourceError,
    admin,
    end_offsets,
    partitions,
    spark_options,
    task_client,
    topic_ids,
)
from service.kafka.records import KafkaRecords
from service.kafka.retention import OffsetsGone, check_committed, recreated
from service.kafka.stream_source import FORMAT, RangePlan, source_class
from service.model.offsets import Offsets
from service.pipeline.positions import Positions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    """One micro-batch's records, where it ends, and the ids of the topics its offsets belong to."""

    records: KafkaRecords
    end: Offsets
    topic_ids: dict[str, str]
    newest: datetime | None = None  # the newest record's Kafka timestamp, when known (buffered batches)


class Reader:
    """The Kafka side of the stream: its topics, its source, its batches."""

    def __init__(self, config: SinkConfig, positions: Positions) -> None:
        self.config = config
        self.positions = positions
        self.partitions: dict[str, list[int]] = {}
        self.topic_ids: dict[str, str] = {}
        self._admin: AdminClient | None = None

    @property
    def tasks_read(self) -> bool:
        return self.config.source.reader == "tasks"

    def discover(self) -> None:
        """The topics' partitions and ids: a broker or topic that can't be reached stops start-up here,
        before a table is created or the sink is claimed."""
        self.partitions = partitions(self.config.kafka)
        self._admin = admin(self.config.kafka)
        self.topic_ids = topic_ids(self._admin, list(self.partitions))

    def with_records(self) -> set[str]:
        """The topics that hold records."""
        ends = end_offsets(self.config.kafka, self.partitions)
        return {t for t, ps in ends.items() if any(o > 0 for o in ps.values())}

    def check_committed(self, committed: BatchPlan | None, fresh: bool = False) -> None:
        """Raise :class:`OffsetsGone` when Kafka no longer holds what the committed plan points at;
        ``fresh``: against the topics as Kafka has them now, not as :meth:`discover` found them."""
        if committed is None:
            return
        assert self._admin is not None, "discover() first"
        parts = partitions(self.config.kafka) if fresh else self.partitions
        current = topic_ids(self._admin, list(parts)) if fresh else self.topic_ids
        kafka = self.config.kafka
        check_committed(self.config.sink_id, kafka, parts, current, committed.offsets, committed.topic_ids)

    # -- the stream ------------------------------------------------------------------------------------

    def start(
        self,
        spark: SparkSession,
        on_batch: Callable[[DataFrame, int], None],
        checkpoint: str,
        until_caught_up: bool,
    ) -> StreamingQuery:
        """Start the stream from the committed offsets; ``on_batch`` gets each micro-batch. A catch-up
        run ends with Spark's source (``availableNow``), or, the range source planning nothing past
        the target, where the job's run loop sees every partition there."""
        stream = self._task_source(spark) if self.tasks_read else self._spark_source(spark)
        writer = stream.writeStream.foreachBatch(on_batch).option("checkpointLocation", checkpoint)
        if until_caught_up and not self.tasks_read:
            writer = writer.trigger(availableNow=True)
        else:
            period = 0.0 if until_caught_up else self.config.commit.trigger_interval.total_seconds()
            writer = writer.trigger(processingTime=f"{period} seconds")
        return writer.start()

    def explain_failure(self, exc: Exception, committed: BatchPlan | None) -> None:
        """Raise :class:`OffsetsGone` if that is why the stream failed.

        Spark's source fails a batch whose offsets Kafka no longer holds (retention deleted records
        the sink had not read yet while it ran): that is not a crash to restart from, since every
        restart would fail the same way.
        """
        try:
            self.check_committed(committed, fresh=True)
        except OffsetsGone as gone:
            raise gone from exc
        except Exception as check_failed:
            logger.warning("could not check the committed offsets after the failure: %s", check_failed)

    def _spark_source(self, spark: SparkSession) -> DataFrame:
        """Spark's Kafka source: the JVM reads the records (``source.reader: spark``)."""
        kafka = self.config.kafka
        reader = (
            spark.readStream.format("kafka")
            .options(**spark_options(kafka))
            .option(*self._subscription())
            .option("startingOffsets", self.positions.spark_starting(self.partitions))
            .option("failOnDataLoss", "true")
        )
        if kafka.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
        return reader.load()

    def _task_source(self, spark: SparkSession) -> DataFrame:
        """The source that plans offset ranges, which the tasks read."""
        kafka = self.config.kafka
        plan = RangePlan(
            client=task_client(kafka),
            topics=list(kafka.topics),
            pattern=kafka.topic_pattern,
            starting=self.positions.task_starting(self.partitions),
            max_offsets_per_trigger=kafka.max_offsets_per_trigger,
            until=self.positions.target,
            chunk=self.config.backlog_chunk if self.config.table.is_template else None,
        )
        spark.dataSource.register(source_class(plan))
        logger.info(
            "reading Kafka in the tasks (source.reader: tasks, %d records a chunk)",
            self.config.source.chunk_records,
        )
        return spark.readStream.format(FORMAT).load()

    def _subscription(self) -> tuple[str, str]:
        """Spark's source option: the topics, or the pattern (Spark picks up topics created later)."""
        kafka = self.config.kafka
        if kafka.topic_pattern is not None:
            return "subscribePattern", kafka.topic_pattern
        return "subscribe", ",".join(kafka.topics)

    # -- one batch -------------------------------------------------------------------------------------

    def batch(self, frame: DataFrame, batch_id: int) -> Batch:
        """Micro-batch ``batch_id``: its records (Spark's source's rows, or the ranges the tasks read;
        the stream's own rows, the same ranges, are left unread) and where it ends.

        Describing the topics is one request. Retention deleting unread records is Spark's to notice
        (its data-loss check fails the stream; the job explains it with :meth:`check_committed`).
        """
        self._check_topics()
        end = self.positions.batch_end(batch_id)
        if new := sorted(set(end) - set(self.partitions)):  # created since the start: the pattern matched
            logger.info("new topic(s) %s: reading them from the earliest offset", new)
            self.partitions = partitions(self.config.kafka)
            assert self._admin is not None
            self.topic_ids = {**self.topic_ids, **topic_ids(self._admin, new)}
            self.positions.topics_born(self.partitions, new)
        if not self.tasks_read:
            records = KafkaRecords(frame)
        else:
            records = KafkaRecords.of_ranges(
                frame.sparkSession,
                self.positions.batch_ranges(batch_id, end),
                task_client(self.config.kafka),
                self.config.source.chunk_records,
            )
        return Batch(records, end, dict(self.topic_ids))

    def _check_topics(self) -> None:
        assert self._admin is not None, "discover() first"
        try:
            current = topic_ids(self._admin, list(self.partitions), timeout_s=5.0)
        except SourceError as exc:  # Kafka slow to answer: the batch's own read decides
            logger.warning("could not check the topic ids before the batch: %s", exc)
            current = self.topic_ids
        problems = [
            recreated(t, self.topic_ids[t], i, self.positions.committed.get(t, {}))
            for t, i in current.items()
            if self.topic_ids.get(t) not in (None, i)
        ]
        if problems:
            raise OffsetsGone(self.config.sink_id, problems)
