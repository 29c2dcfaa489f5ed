"""A real Debezium PostgreSQL connector captures a source table; the sink lands it exactly.

The source is the stack's Postgres database ``cdc`` (wal_level=logical), the connector runs in the stack's
Kafka Connect worker as docs/debezium.md registers it, and the table is read back through Spark and DuckDB
and compared value by value with ``SELECT *`` of the source (upsert mode) or with every row image the
source's statements returned (append mode).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.cdc import CdcSource, differences, write_corpus
from tests.readers import duckdb_rows, spark_rows
from tests.sink.conftest import Sink

SNAPSHOT_ROWS = 40
# What a streamed change set does to the topic: a snapshot read per row; a key change is a delete, its
# tombstone and an insert; every delete is followed by a tombstone.
EXPECTED_OPS = Counter(r=SNAPSHOT_ROWS, c=10 + 1 + 1, u=15 + 1 + 1, d=8 + 1 + 1, tombstone=8 + 1 + 1)

# The `sales` table of the lakehouse spec.
SALES_DDL = """CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    customer text,
    amount numeric(12,2),
    sold_at timestamptz,
    updated_at timestamp
)"""


def _ops(records: list[tuple[bytes | None, bytes | None]]) -> Counter[str]:
    """How many events of each op the records hold ("tombstone" for a record with a null value)."""
    ops: Counter[str] = Counter()
    for _, value in records:
        event = None if value is None else json.loads(value)
        ops["tombstone" if event is None else event.get("payload", event)["op"]] += 1
    return ops


@dataclass
class Captured:
    """A source table captured by a connector, after its snapshot and a streamed change set."""

    table: str  # schema.table in the source database
    topic: str
    appended: list[dict[str, Any]]  # every row image the source wrote, in order (snapshot, then changes)
    records: list[tuple[bytes | None, bytes | None]]  # what the connector published, by partition


def _capture(cdc: CdcSource, unique_name: Callable[[str], str], **connector_options: Any) -> Captured:
    """Create the sales table with SNAPSHOT_ROWS rows, register a connector (options as
    CdcSource.connector_config takes them), stream a change set; return once all of it is in Kafka."""
    table = f"public.{unique_name('sales')}"
    cdc.execute(
        SALES_DDL.format(table=table),
        # Amounts with cents, instants at several offsets, microsecond timestamps.
        f"""INSERT INTO {table}
            SELECT g, 'customer-' || g, (g * 123.45 - 2000)::numeric(12,2),
                   timestamptz '2026-03-01 10:00:00+02' + g * interval '1 hour 7 minutes 13.5 seconds',
                   timestamp '2026-03-01 08:00:00.000001' + g * interval '13 minutes 0.25 seconds'
            FROM generate_series(1, {SNAPSHOT_ROWS}) g""",
    )
    appended = cdc.rows(table)
    connector = cdc.register(unique_name("dbz"), [table], **connector_options)
    connector.wait_snapshot_done()
    # Each statement in its own transaction: inserts, updates (id 3 twice), deletes, a row inserted and
    # deleted again, a primary-key change, NULLs, the largest numeric(12,2).
    for statement in (
        f"INSERT INTO {table} SELECT g, 'new-' || g, g * 0.01, now(), localtimestamp FROM generate_series(41, 50) g",
        f"UPDATE {table} SET amount = amount + 0.99, customer = upper(customer) WHERE id BETWEEN 1 AND 15",
        f"UPDATE {table} SET amount = -9999999999.99, updated_at = '1999-12-31 23:59:59.999999' WHERE id = 3",
        f"DELETE FROM {table} WHERE id BETWEEN 20 AND 27",
        f"INSERT INTO {table} VALUES (60, 'brief', 1, now(), localtimestamp)",
        f"DELETE FROM {table} WHERE id = 60",
        f"UPDATE {table} SET id = 1000 WHERE id = 30",
        f"UPDATE {table} SET customer = NULL, amount = NULL, sold_at = NULL, updated_at = NULL WHERE id = 31",
    ):
        images = cdc.query(statement + " RETURNING *")
        if not statement.startswith("DELETE"):  # a delete's RETURNING is the row it removed
            appended += images
    topic = connector.topic(table)
    connector.wait_for_events(table, EXPECTED_OPS.total())
    records = cdc.records(topic)
    assert _ops(records) == EXPECTED_OPS
    return Captured(table, topic, appended, records)


def _assert_table_matches(spark: Any, identifier: str, source: list[dict[str, Any]], key: str | None) -> None:
    problems = differences(source, spark_rows(spark, identifier), key, "spark")
    problems += differences(source, duckdb_rows(identifier), key, "duckdb")
    assert not problems, "\n".join(problems[:40])


def test_debezium_sales_upsert_matches_the_source(
    cdc: CdcSource, make_sink: Callable[..., Sink], spark: Any, unique_name: Callable[[str], str]
) -> None:
    """Schemas on, decimal.handling.mode=precise: the table is the source's current rows."""
    captured = _capture(cdc, unique_name, schemas=True, decimal_mode="precise")
    write_corpus(
        "sales-precise", "sales, schemas on, decimal.handling.mode=precise", ["id"], captured.records
    )
    sink = make_sink(
        mode="upsert",
        kafka={"topics": [captured.topic]},
        table={"identifier": f"{unique_name('ns')}.sales", "key": ["id"]},
    )
    sink.run_until_caught_up()
    source = cdc.rows(captured.table)
    assert len(source) == SNAPSHOT_ROWS + 10 - 8
    _assert_table_matches(spark, sink.table, source, key="id")


def test_debezium_sales_append_without_schemas_matches_the_source(
    cdc: CdcSource, make_sink: Callable[..., Sink], spark: Any, unique_name: Callable[[str], str]
) -> None:
    """Schemas off, decimal.handling.mode=string (the columns configured in the sink): the table holds
    every row image the source wrote, each once."""
    captured = _capture(cdc, unique_name, schemas=False, decimal_mode="string")
    columns = [
        {"name": "id", "type": "long", "required": True},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "decimal(12,2)", "encoding": "decimal-text"},
        {"name": "sold_at", "type": "timestamptz", "encoding": "io.debezium.time.ZonedTimestamp"},
        {"name": "updated_at", "type": "timestamp", "encoding": "io.debezium.time.MicroTimestamp"},
    ]
    write_corpus(
        "sales-string-schemaless",
        "sales, schemas off, decimal.handling.mode=string",
        ["id"],
        captured.records,
        columns=columns,
    )
    sink = make_sink(
        mode="append",
        kafka={"topics": [captured.topic]},
        table={"identifier": f"{unique_name('ns')}.sales", "key": ["id"], "columns": columns},
    )
    sink.run_until_caught_up()
    _assert_table_matches(spark, sink.table, captured.appended, key=None)
