"""Protobuf in the Confluent wire format (message indexes, then the message), produced from Python with
confluent-kafka's ProtobufSerializer against the stack's schema registry: the sales stream lands
exactly, in upsert and append mode, read back by Spark and DuckDB."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from readers import duckdb_rows, spark_rows
from tests.cdc import differences
from tests.sink.conftest import Sink
from tests.sink.protobuf_sales import ProtobufSales


@pytest.mark.parametrize("mode", ["upsert", pytest.param("append", marks=pytest.mark.slow)])
def test_protobuf_sales_stream_lands_exactly(
    make_sink: Callable[..., Sink], stack: Any, spark: Any, mode: str
) -> None:
    """Upsert: the table is the source's current rows; append: every row image written, once each."""
    sink = make_sink(
        mode=mode,
        source={
            "format": "debezium-protobuf",
            "schema_registry": {"url": stack.schema_registry_url},
            "variable_scale_decimal": "decimal(12,2)",  # confluent.type.Decimal carries its scale per value
        },
    )
    sales = ProtobufSales(stack.schema_registry_url, sink.topic)
    sink.send(sales.stream())  # type: ignore[arg-type]
    run = sink.run_until_caught_up()
    assert "protobuf decoder" in run.log(), run.log()[-3000:]
    expected, key = (sales.expected(), "id") if mode == "upsert" else (sales.appended, None)
    problems = differences(expected, spark_rows(spark, sink.table), key, "spark")
    problems += differences(expected, duckdb_rows(sink.table), key, "duckdb")
    assert not problems, "\n".join(problems[:40])
