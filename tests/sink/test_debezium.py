"""A real Debezium PostgreSQL connector captures a source table; the sink lands it exactly.

The source is the stack's Postgres database ``cdc`` (wal_level=logical), the connector runs in the stack's
Kafka Connect worker as docs/debezium.md registers it, and the table is read back through Spark and DuckDB
and compared value by value with ``SELECT *`` of the source (upsert mode) or with every row image the
source's statements returned (append mode).

The table is captured once per connector configuration (tests/sink/debezium_sales.py: schemas on with
``decimal.handling.mode=precise``, schemas off with ``string``, Avro through the stack's schema
registry with ``precise``) and each capture is landed in upsert and
in append mode: every combination costs one sink run. tests/chaos/test_chaos_debezium.py SIGKILLs an
upsert run mid-commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.sink.conftest import Sink
from tests.sink.debezium_sales import Captured, assert_table_matches, capturing, sales_sink


@pytest.fixture(scope="module")
def captures(stack: Any) -> Iterator[Callable[[str], Captured]]:
    with capturing(stack) as capture:
        yield capture


@pytest.mark.parametrize(
    ("connector", "mode"),
    [
        ("schemas-precise", "upsert"),
        ("schemas-precise", "append"),
        ("schemaless-string", "upsert"),
        ("schemaless-string", "append"),
        ("schemas-precise", "upsert-position"),
        ("avro-precise", "upsert"),
        # the Avro decoder is the same in both modes (upsert's is in the default suite)
        pytest.param("avro-precise", "append", marks=pytest.mark.slow),
        ("avro-precise", "upsert-position"),
    ],
)
def test_debezium_sales_matches_the_source(
    captures: Callable[[str], Captured],
    make_sink: Callable[..., Sink],
    spark: Any,
    unique_name: Callable[[str], str],
    connector: str,
    mode: str,
) -> None:
    """Upsert mode: the table is the source's current rows (keyed, no duplicate). Append mode: it holds
    every row image the source wrote, each once. upsert-position: upsert with position deletes, read
    by Trino and pyiceberg too."""
    captured = captures(connector)
    mode, _, deletes = mode.partition("-")
    sink = sales_sink(make_sink, unique_name, captured, mode, delete_format=deletes or "equality")
    sink.run_until_caught_up()
    if mode == "upsert":
        assert_table_matches(spark, sink.table, captured.current, key="id", every_reader=bool(deletes))
    else:
        assert_table_matches(spark, sink.table, captured.appended, key=None)
