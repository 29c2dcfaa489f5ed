"""The `sales` table of the lakehouse spec, captured by a real Debezium PostgreSQL connector.

:func:`capturing` creates the table in the stack's source database with SNAPSHOT_ROWS rows, registers a
connector (one of CONNECTORS: schemas on with ``decimal.handling.mode=precise``, schemas off with
``string``), streams a change set of inserts, updates, deletes and a key change, and returns once all of
it is in Kafka; each capture is made once and shared by the sink runs of a test module.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from readers import duckdb_rows, pyiceberg_rows, spark_rows, trino_rows
from tests import avro
from tests.cdc import CdcSource, differences, write_corpus
from tests.sink.conftest import Sink, open_cdc

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

# Without schema sections the sink is told the columns; decimal.handling.mode=string sends the amount as text.
SCHEMALESS_COLUMNS: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "decimal(12,2)", "encoding": "decimal-text"},
    {"name": "sold_at", "type": "timestamptz", "encoding": "io.debezium.time.ZonedTimestamp"},
    {"name": "updated_at", "type": "timestamp", "encoding": "io.debezium.time.MicroTimestamp"},
]


@dataclass(frozen=True)
class ConnectorSettings:
    schemas: bool  # the JSON converters' schemas.enable
    decimal_mode: str  # decimal.handling.mode
    corpus: str  # the file in tests/sink/corpus its records go to (ICESINK_WRITE_CORPUS=1)
    columns: list[dict[str, Any]] | None  # table.columns the sink needs, if any
    avro: bool = False  # Avro in the Confluent wire format through the stack's schema registry


CONNECTORS = {
    "schemas-precise": ConnectorSettings(True, "precise", "sales-precise", None),
    "schemaless-string": ConnectorSettings(False, "string", "sales-string-schemaless", SCHEMALESS_COLUMNS),
    "avro-precise": ConnectorSettings(True, "precise", "", None, avro=True),
}


def _ops(records: list[tuple[bytes | None, bytes | None]], registry: str | None) -> Counter[str]:
    """How many events of each op the records hold ("tombstone" for a record with a null value);
    ``registry``: the records are Avro, their schemas there."""
    ops: Counter[str] = Counter()
    for _, value in records:
        event = None if value is None else avro.read(registry, value) if registry else json.loads(value)
        ops["tombstone" if event is None else event.get("payload", event)["op"]] += 1
    return ops


@dataclass
class Captured:
    """A source table captured by a connector, after its snapshot and a streamed change set."""

    table: str  # schema.table in the source database
    topic: str
    settings: ConnectorSettings
    current: list[dict[str, Any]]  # SELECT * of the source once the change set was captured
    appended: list[dict[str, Any]]  # every row image the source wrote, in order (snapshot, then changes)
    records: list[tuple[bytes | None, bytes | None]]  # what the connector published, by partition
    registry: str  # the stack's schema registry (Confluent-compatible API)


def _capture(cdc: CdcSource, name: str, settings: ConnectorSettings, registry: str) -> Captured:
    """Create the sales table with SNAPSHOT_ROWS rows, register a connector, stream a change set;
    return once all of it is in Kafka."""
    suffix = f"{name.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    table = f"public.sales_{suffix}"
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
    connector = cdc.register(
        f"dbz_{suffix}",
        [table],
        schemas=settings.schemas,
        decimal_mode=settings.decimal_mode,
        avro_registry=registry if settings.avro else None,
    )
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
    assert _ops(records, registry if settings.avro else None) == EXPECTED_OPS
    current = cdc.rows(table)
    assert len(current) == SNAPSHOT_ROWS + 10 - 8
    schemas = "on" if settings.schemas else "off"
    if settings.corpus:
        write_corpus(
            settings.corpus,
            f"sales, schemas {schemas}, decimal.handling.mode={settings.decimal_mode}",
            ["id"],
            records,
            **({"columns": settings.columns} if settings.columns else {}),
        )
    return Captured(table, topic, settings, current, appended, records, registry)


@contextlib.contextmanager
def capturing(stack: Any) -> Iterator[Callable[[str], Captured]]:
    """``capture(name)``: the sales table captured by the connector ``CONNECTORS[name]``, made at its
    first use and then reused; the connectors, slots, publications and tables are dropped at the end."""
    made: dict[str, Captured] = {}
    with open_cdc(stack) as cdc:

        def capture(name: str) -> Captured:
            if name not in made:
                made[name] = _capture(cdc, name, CONNECTORS[name], stack.schema_registry_url)
            return made[name]

        yield capture


def sales_sink(
    make_sink: Callable[..., Sink],
    unique_name: Callable[[str], str],
    captured: Captured,
    mode: str,
    delete_format: str = "equality",
    **kafka: Any,
) -> Sink:
    columns = captured.settings.columns
    avro_source = {"format": "debezium-avro", "schema_registry": {"url": captured.registry}}
    return make_sink(
        mode=mode,
        kafka={"topics": [captured.topic], **kafka},
        table={
            "identifier": f"{unique_name('ns')}.sales",
            "key": ["id"],
            "delete_format": delete_format,
            **({"columns": columns} if columns else {}),
        },
        **({"source": avro_source} if captured.settings.avro else {}),
    )


def assert_table_matches(
    spark: Any, identifier: str, source: list[dict[str, Any]], key: str | None, every_reader: bool = False
) -> None:
    """The table as Spark and DuckDB read it (``every_reader``: Trino and pyiceberg too) is ``source``."""
    problems = differences(source, spark_rows(spark, identifier), key, "spark")
    problems += differences(source, duckdb_rows(identifier), key, "duckdb")
    if every_reader:
        problems += differences(source, trino_rows(identifier), key, "trino")
        problems += differences(source, pyiceberg_rows(identifier), key, "pyiceberg")
    assert not problems, "\n".join(problems[:40])
