"""A micro-batch's Kafka records, as the stages after the source need them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.kafka.reader import RANGE_SCHEMA, SPARK_KAFKA_SCHEMA, OffsetRange, read_range
from service.spark_session import sql_literal

# How a task reads one range: its Kafka rows, chunk by chunk.
RangeRead = Callable[[OffsetRange], Iterator[pa.RecordBatch]]


def _read_range(client: dict[str, Any], chunk_records: int, r: OffsetRange) -> Iterator[pa.RecordBatch]:
    return read_range(client, r, chunk_records)


def _read_rows(read: RangeRead, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for row in batch.to_pylist():
            yield from read(
                OffsetRange(row["topic"], int(row["partition"]), int(row["start"]), int(row["end"]))
            )


def ranges_frame(spark: SparkSession, ranges: Sequence[OffsetRange]) -> DataFrame:
    """``ranges`` as a DataFrame of :data:`RANGE_SCHEMA`, for Spark's decoder: a ``VALUES`` list, which
    Spark scans in as many tasks as it has cores (at most one per range). Measured per batch of two
    ranges: ~5 ms to plan and ~12 ms to collect, where one JSON literal that Spark parsed
    (``from_json``) took ~20 and ~70 ms, ``createDataFrame`` of a Python list 0.2 s more (its
    conversion in this process, and the schema parsed over py4j), and one JVM expression per range
    field 1.5 s for 100 ranges."""
    if not ranges:
        return spark.createDataFrame([], RANGE_SCHEMA)
    values = ", ".join(
        f"({sql_literal(r.topic)}, {int(r.partition)}, {int(r.start)}L, {int(r.end)}L)" for r in ranges
    )
    return spark.sql(f"SELECT * FROM VALUES {values} AS ranges(topic, `partition`, `start`, `end`)")


@dataclass(frozen=True)
class KafkaRecords:
    """``rows``: the records as Spark's Kafka source gives them (key, value, topic, partition, offset,
    timestamp), what Spark's decoder and the dead-letter writer read. With the task reader
    (:mod:`service.kafka.stream_source`) also ``ranges``, the batch's offset ranges, and ``read``, how a task
    reads one: the Arrow path's tasks read their range themselves (an RDD job over the ranges,
    :class:`service.data.arrow_job.Ranges`), and ``rows`` is read from the same ranges only if
    Spark's decoder needs it (its plan is made then: ~10 ms a batch otherwise)."""

    spark_rows: DataFrame | None = None  # the rows Spark's source read (or kept: persist)
    ranges: tuple[OffsetRange, ...] | None = None
    read: RangeRead | None = None
    spark: SparkSession | None = None  # the session that plans ``rows`` of the ranges

    @cached_property
    def rows(self) -> DataFrame:
        if self.spark_rows is not None:
            return self.spark_rows
        if self.ranges is None or self.read is None or self.spark is None:
            raise ValueError("a Kafka batch of neither Spark's rows nor offset ranges")
        frame = ranges_frame(self.spark, self.ranges)
        return frame.mapInArrow(partial(_read_rows, self.read), SPARK_KAFKA_SCHEMA)

    @classmethod
    def of_ranges(
        cls, spark: SparkSession, ranges: Sequence[OffsetRange], client: dict[str, Any], chunk_records: int
    ) -> KafkaRecords:
        """The batch of ``ranges`` (:func:`service.kafka.stream_source.batch_ranges`), which its tasks
        read one by one.

        The ranges are not taken from the stream's own rows: those would be made by the source's
        ``read()`` in a Python worker of their own, a second one per task beside the one that reads
        the range (measured: workers that each import everything, a warm-up of a dozen batches, and
        twice the workers' memory).
        """
        return cls(None, tuple(ranges), partial(_read_range, client, chunk_records), spark)

    def of_topics(self, topics: list[str]) -> KafkaRecords:
        def only(frame: DataFrame) -> DataFrame:
            return frame.where(F.col("topic").isin(topics))

        return replace(
            self,
            spark_rows=None if self.spark_rows is None else only(self.spark_rows),
            ranges=None if self.ranges is None else tuple(r for r in self.ranges if r.topic in topics),
        )

    def persist(self) -> KafkaRecords:
        """The rows kept after their first read (Spark's path reads them several times)."""
        return replace(self, spark_rows=self.rows.persist())

    def unpersist(self) -> None:
        self.rows.unpersist()
