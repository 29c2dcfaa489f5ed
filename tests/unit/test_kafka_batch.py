"""A batch read by ranges hands the Arrow path its ranges; Spark's rows of them are planned only on demand."""

from __future__ import annotations

from typing import Any, cast

from pyspark.sql import DataFrame

from service.data.arrow_batch import Ranges
from service.kafka.batch import KafkaBatch
from service.pipeline.table import arrow_input


class _Frame:
    """A DataFrame of ranges that records what was planned over it."""

    def __init__(self) -> None:
        self.planned: list[str] = []

    def mapInArrow(self, *args: Any) -> str:
        self.planned.append("mapInArrow")
        return "rows"


def _batch(frame: _Frame) -> KafkaBatch:
    return KafkaBatch(None, cast(DataFrame, frame), read=lambda row: iter(()))


def test_the_arrow_path_takes_the_ranges_without_planning_spark_rows_of_them() -> None:
    frame = _Frame()
    given = arrow_input(_batch(frame))
    assert isinstance(given, Ranges) and given.frame is cast(DataFrame, frame)
    assert frame.planned == []


def test_spark_rows_of_the_ranges_are_planned_once_when_asked() -> None:
    frame = _Frame()
    batch = _batch(frame)
    assert batch.rows == "rows" and batch.rows == "rows"
    assert frame.planned == ["mapInArrow"]
