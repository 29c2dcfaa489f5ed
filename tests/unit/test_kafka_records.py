"""A batch read by ranges hands the Arrow path its ranges; Spark's rows of them are planned only on demand."""

from __future__ import annotations

from typing import Any, cast

from pyspark.sql import SparkSession

from service.data.arrow_job import Ranges
from service.kafka.reader import OffsetRange
from service.kafka.records import KafkaRecords
from service.pipeline.table import arrow_input


class _Spark:
    """A session that records what was planned through it."""

    def __init__(self) -> None:
        self.planned: list[str] = []

    def sql(self, text: str) -> _Spark:
        self.planned.append("sql")
        return self

    def mapInArrow(self, *args: Any) -> str:
        self.planned.append("mapInArrow")
        return "rows"


RANGES = (OffsetRange("a", 0, 0, 5), OffsetRange("b", 1, 3, 4))


def _batch(spark: _Spark) -> KafkaRecords:
    return KafkaRecords(None, RANGES, read=lambda r: iter(()), spark=cast(SparkSession, spark))


def test_the_arrow_path_takes_the_ranges_without_planning_spark_rows_of_them() -> None:
    spark = _Spark()
    given = arrow_input(_batch(spark))
    assert isinstance(given, Ranges) and list(given.ranges) == list(RANGES)
    assert spark.planned == []


def test_spark_rows_of_the_ranges_are_planned_once_when_asked() -> None:
    spark = _Spark()
    batch = _batch(spark)
    assert batch.rows == "rows" and batch.rows == "rows"
    assert spark.planned == ["sql", "mapInArrow"]


def test_a_batch_of_some_topics_keeps_their_ranges_only() -> None:
    batch = _batch(_Spark()).of_topics(["b"])
    assert batch.ranges == (RANGES[1],)
