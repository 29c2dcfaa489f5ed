"""Source columns named like the fields of a Kafka record, or with a space, a dot or capitals in their
names, land as any other column.

A PostgreSQL table whose columns are called ``key``, ``value``, ``topic``, ``partition``, ``offset`` and
``timestamp`` (names a key-value or an event table has), ``"Order Date"``, ``"dotted.name"`` and
``"CustomerID"``, keyed by ``"row.id"``, is captured by a real Debezium connector; both decoders read each record's own fields
beside the row's columns of the same names, Spark's writer takes the dotted name (PySpark's
``mapInArrow`` refers to columns by unquoted name), and the table must hold the source's rows exactly.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from readers import pyiceberg_rows, trino_rows
from tests.cdc import CdcSource, differences
from tests.sink.conftest import Sink, open_cdc
from tests.sink.debezium_sales import assert_table_matches

ROWS = 50
# Streamed after the snapshot: 10 updates, 5 deletes (each followed by a tombstone), 1 insert.
CHANGES = [
    'UPDATE {table} SET "value" = "value" + 1, "offset" = -1, "key" = NULL WHERE "row.id" <= 10',
    'DELETE FROM {table} WHERE "row.id" BETWEEN 11 AND 15',
    'INSERT INTO {table} ("row.id") VALUES (100)',
]
EVENTS = ROWS + 10 + 5 * 2 + 1


@pytest.fixture(scope="module")
def captured(stack: Any) -> Iterator[tuple[CdcSource, str, str]]:
    """The table, its snapshot and its streamed changes in Kafka: (source, table, topic)."""
    suffix = uuid.uuid4().hex[:8]
    table = f"public.kafka_names_{suffix}"
    with open_cdc(stack) as cdc:
        cdc.execute(
            f"""CREATE TABLE {table} ("row.id" bigint PRIMARY KEY, "key" text, "value" numeric(12, 2), "topic" text,
                "partition" int, "offset" bigint, "timestamp" timestamptz, "Order Date" date, "dotted.name" int,
                "CustomerID" text)""",
            f"""INSERT INTO {table} SELECT g, 'k' || g, g * 1.5, 'shop.t' || g, g % 3, g * 1000,
                timestamptz '2026-01-01 00:00:00+00' + g * interval '1 hour', date '2026-01-01' + g, g * 7,
                'C' || g FROM generate_series(1, {ROWS}) g""",
        )
        connector = cdc.register(f"dbz_names_{suffix}", [table], schemas=True)
        connector.wait_snapshot_done()
        for statement in CHANGES:
            cdc.execute(statement.format(table=table))
        connector.wait_for_events(table, EVENTS)
        yield cdc, table, connector.topic(table)


@pytest.mark.parametrize(
    ("decoder", "deletes"), [("auto", "equality"), ("spark", "equality"), ("auto", "position")]
)
def test_columns_named_like_kafka_record_fields_land_as_any_column(
    captured: tuple[CdcSource, str, str],
    make_sink: Callable[..., Sink],
    spark: Any,
    unique_name: Callable[[str], str],
    decoder: str,
    deletes: str,
) -> None:
    """With position deletes (the key index keyed by the dotted column) pyiceberg and Trino read the
    table too; Trino names every column in lower case."""
    cdc, table, topic = captured
    sink = make_sink(
        mode="upsert",
        kafka={"topics": [topic]},
        table={"identifier": f"{unique_name('ns')}.kafka_names", "key": ["row.id"], "delete_format": deletes},
        source={"decoder": decoder},
    )
    log = sink.run_until_caught_up().log()
    dead = [int(n) for n in re.findall(r"(\d+) dead letters", log)]
    assert dead and not any(dead), log[-4000:]
    if decoder == "auto":
        assert "arrow decoder" in log and "declined" not in log, log[-4000:]
    source = cdc.rows(table)
    assert len(source) == ROWS - 5 + 1
    assert_table_matches(spark, sink.table, source, key="row.id")
    if deletes == "position":
        problems = differences(source, pyiceberg_rows(sink.table), "row.id", "pyiceberg")
        lower = [{k.lower(): v for k, v in row.items()} for row in source]
        problems += differences(lower, trino_rows(sink.table), "row.id", "trino")
        assert not problems, "\n".join(problems[:40])
