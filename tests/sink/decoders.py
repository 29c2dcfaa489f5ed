"""Run both decoders over the same Kafka records and make their results comparable.

Spark's decoder (service.data.spark_decode) is the reference; the Arrow decoder (service.data.arrow_decode)
may decline a record but must otherwise produce the same values. Tests that hold the two side by side
use these helpers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from service.data.envelope import ERROR_COLUMN, OFFSET, SOURCE_COLUMNS
from service.data.files import OP_COLUMN
from service.data.spark_decode import decode as spark_decode
from service.model.columns import Column

KAFKA_ROW = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
    ]
)


def kafka_positions(offsets: list[int], partitions: list[int] | None = None, topic: str = "t") -> pa.Table:
    """Kafka positions of records: one topic, partition 0 unless given."""
    return pa.table(
        {
            "topic": pa.array([topic] * len(offsets)),
            "partition": pa.array(partitions or [0] * len(offsets), pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
        }
    )


def comparable(table: pa.Table) -> list[dict[str, Any]]:
    """Rows with dates as epoch days and timestamps as epoch micros (Python's datetime stops at 9999),
    list elements too."""

    def plain(t: pa.DataType) -> pa.DataType:
        if pa.types.is_list(t):
            return pa.list_(plain(t.value_type))
        if pa.types.is_date32(t):
            return pa.int32()
        return pa.int64() if pa.types.is_timestamp(t) else t

    columns = [c if plain(c.type) == c.type else c.cast(plain(c.type)) for c in table.columns]
    return pa.table(columns, names=table.column_names).to_pylist()


def normalise(value: Any) -> Any:
    """Decimals compare by value (Decimal('1.10') == Decimal('1.1') already; normalise for the message);
    NaN, which equals nothing (itself included), compares as text; lists element by element."""
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value.normalize() if isinstance(value, Decimal) else value


def spark_decoded(
    spark: SparkSession,
    records: Sequence[tuple[bytes | None, bytes | None]],
    columns: list[Column],
    key: list[str],
    max_record_bytes: int,
) -> dict[int, dict[str, Any]]:
    """Spark's decoding of (key, value) records, in one job, by offset (the record's index)."""
    now = datetime.now(UTC)
    rows = [(k, v, "t", 0, i, now) for i, (k, v) in enumerate(records)]
    frame = spark.createDataFrame(rows, KAFKA_ROW)
    decoded = spark_decode(frame, columns, key, max_record_bytes, tombstones=True).select(
        OFFSET, ERROR_COLUMN, OP_COLUMN, *[c.name for c in columns], *SOURCE_COLUMNS
    )
    return {r[OFFSET]: r for r in comparable(decoded.toArrow())}


def value_columns(columns: list[Column]) -> list[str]:
    """The columns both decoders must agree on: the op, every table column, the source position."""
    return [OP_COLUMN, *[c.name for c in columns], *SOURCE_COLUMNS]
