"""A real Debezium PostgreSQL connector captures a source table; the sink lands it exactly.

The source is the stack's Postgres database ``cdc`` (wal_level=logical), the connector runs in the stack's
Kafka Connect worker as docs/debezium.md registers it, and the table is read back through Spark and DuckDB
and compared with ``SELECT *`` of the source, value by value.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from tests.cdc import CdcSource, differences
from tests.readers import duckdb_rows, spark_rows
from tests.sink.conftest import Sink

SNAPSHOT_ROWS = 40

# The `sales` table of the lakehouse spec.
SALES_DDL = """CREATE TABLE {table} (
    id bigint PRIMARY KEY,
    customer text,
    amount numeric(12,2),
    sold_at timestamptz,
    updated_at timestamp
)"""


def _ops(bootstrap: str, topic: str) -> Counter[str]:
    """How many events of each op the topic holds ("tombstone" for a record with a null value)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"ops-{topic}", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        total = sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions
        )
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        ops: Counter[str] = Counter()
        for _ in range(30):
            for message in consumer.consume(500, timeout=1):
                if message.error() is None:
                    value = message.value()
                    ops["tombstone" if value is None else json.loads(value)["payload"]["op"]] += 1
            if ops.total() >= total:
                break
        return ops
    finally:
        consumer.close()


def test_debezium_sales_upsert_matches_the_source(
    cdc: CdcSource, make_sink: Callable[..., Sink], spark: Any, unique_name: Callable[[str], str]
) -> None:
    table = f"public.{unique_name('sales')}"
    cdc.execute(
        SALES_DDL.format(table=table),
        # Snapshot rows: amounts with cents, instants at several offsets, microsecond timestamps.
        f"""INSERT INTO {table}
            SELECT g, 'customer-' || g, (g * 123.45 - 2000)::numeric(12,2),
                   timestamptz '2026-03-01 10:00:00+02' + g * interval '1 hour 7 minutes 13.5 seconds',
                   timestamp '2026-03-01 08:00:00.000001' + g * interval '13 minutes 0.25 seconds'
            FROM generate_series(1, {SNAPSHOT_ROWS}) g""",
    )
    connector = cdc.register(unique_name("dbz"), [table])
    connector.wait_snapshot_done()

    # Streamed changes, each in its own transaction: inserts, updates (one key twice), deletes, a row
    # inserted and deleted again, a primary-key change, and NULLs.
    streamed = [
        f"INSERT INTO {table} SELECT g, 'new-' || g, g * 0.01, now(), localtimestamp FROM generate_series(41, 50) g",
        f"UPDATE {table} SET amount = amount + 0.99, customer = upper(customer) WHERE id BETWEEN 1 AND 15",
        f"UPDATE {table} SET amount = -9999999999.99, updated_at = timestamp '1999-12-31 23:59:59.999999' WHERE id = 3",
        f"DELETE FROM {table} WHERE id BETWEEN 20 AND 27",
        f"INSERT INTO {table} VALUES (60, 'brief', 1, now(), localtimestamp)",
        f"DELETE FROM {table} WHERE id = 60",
        f"UPDATE {table} SET id = 1000 WHERE id = 30",
        f"UPDATE {table} SET customer = NULL, amount = NULL, sold_at = NULL, updated_at = NULL WHERE id = 31",
    ]
    for statement in streamed:
        cdc.execute(statement)
    # The topic holds a snapshot read per row and every streamed change: a key change is a delete, its
    # tombstone and an insert; every delete is followed by a tombstone.
    expected = Counter(r=SNAPSHOT_ROWS, c=10 + 1 + 1, u=15 + 1 + 1, d=8 + 1 + 1, tombstone=8 + 1 + 1)
    connector.wait_for_events(table, expected.total())
    assert _ops(cdc.kafka_bootstrap, connector.topic(table)) == expected

    sink = make_sink(
        mode="upsert",
        kafka={"topics": [connector.topic(table)]},
        table={"identifier": f"{unique_name('ns')}.sales", "key": ["id"]},
    )
    sink.run_until_caught_up()

    source = cdc.rows(table)
    assert len(source) == SNAPSHOT_ROWS + 10 - 8  # the change set really inserted and deleted rows
    problems = differences(source, spark_rows(spark, sink.table), "id", "spark") + differences(
        source, duckdb_rows(sink.table), "id", "duckdb"
    )
    assert not problems, "\n".join(problems[:40])
