"""PostgreSQL arrays captured by a real Debezium connector land as Iceberg lists, value by value.

One source table has an array column of each everyday element type (int, bigint, text, numeric(10,2),
date, timestamp, timestamptz, uuid, numeric, boolean, smallint, real, double, varchar, char, bytea) with NULL arrays, empty arrays and NULL elements, in a snapshot and
in streamed changes. The table is read back through Spark and DuckDB and compared with ``SELECT *``
(upsert mode, schemas on, the Arrow decoder) and with every row image the source wrote (append mode,
the columns declared as ``list<...>`` in ``table.columns``, Spark's decoder). A second source table
evolves: an array column is added and an int[] becomes a bigint[] while the sink runs on it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.types import LongType, StringType

from service.cli import EXIT_CONFIG
from service.model.columns import column_from_config, iceberg_schema
from tests.cdc import CdcSource, write_corpus
from tests.sink.conftest import Sink, open_cdc
from tests.sink.debezium_sales import assert_table_matches

# (column, PostgreSQL type, the sink's declared type for events read without their schema section,
#  row 1: values at the type's edges with a NULL element, a generated row's values from g)
COLUMNS = [
    ("ints", "int[]", "list<int>", "ARRAY[1, NULL, -2147483648, 2147483647]", "ARRAY[g, -g]"),
    (
        "bigs",
        "bigint[]",
        "list<long>",
        "ARRAY[9223372036854775807, NULL, -9223372036854775808]",
        "ARRAY[g * 1000000000000]",
    ),
    (
        "texts",
        "text[]",
        "list<string>",
        """ARRAY['a,b', NULL, '', '{}', 'quote " and \\ backslash', 'NULL', 'é😀']""",
        "ARRAY['t' || g, repeat('x', g)]",
    ),
    (
        "amounts",
        "numeric(10,2)[]",
        "list<decimal(10,2)>",
        "ARRAY[99999999.99, NULL, -99999999.99, 0.01]",
        "ARRAY[(g * 1.25)::numeric(10,2)]",
    ),
    (
        "days",
        "date[]",
        "list<date>",
        "ARRAY[date '2024-02-29', NULL, date '1970-01-01', date '9999-12-31']",
        "ARRAY[date '2024-01-01' + g]",
    ),
    (
        "instants",
        "timestamptz[]",
        "list<timestamptz>",
        "ARRAY[timestamptz '2024-01-02 03:04:05.123456+02', NULL, timestamptz '1969-12-31 23:59:59.999999+00',"
        " timestamptz '1582-10-04 23:59:59.999999+00']",
        "ARRAY[timestamptz '2026-03-01 10:00:00+02' + g * interval '1 hour 7 minutes 13.5 seconds',"
        " timestamptz '1000-01-01 12:00+00' + g * interval '1 day 1 second']",
    ),
    (
        "stamps",
        "timestamp[]",
        "list<timestamp>",
        "ARRAY[timestamp '2024-01-02 03:04:05.123456', NULL, timestamp '1969-12-31 23:59:59.999999',"
        " timestamp '1582-10-15 00:00', timestamp '1582-10-04 23:59:59.999999']",
        # and one of the Julian era, which the connector reads in the Julian calendar (see temporal.py)
        "ARRAY[timestamp '2026-03-01 08:00:00.000001' + g * interval '13 minutes 0.25 seconds',"
        " timestamp '1000-01-01 12:00' + g * interval '1 day 1 second']",
    ),
    (
        "ids",
        "uuid[]",
        "list<uuid>",
        "ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, NULL, '00000000-0000-0000-0000-000000000000']",
        "ARRAY[md5(g::text)::uuid]",
    ),
    (
        "numbers",
        "numeric[]",
        "list<decimal(38,10)>",
        "ARRAY[1.5, NULL, -0.0000000001, 1234567890123456789012345678.5]",
        "ARRAY[g * 1.5, g::numeric]",
    ),
    ("flags", "boolean[]", "list<boolean>", "ARRAY[true, NULL, false]", "ARRAY[g % 2 = 0, g % 3 = 0]"),
    ("smalls", "smallint[]", "list<int>", "ARRAY[-32768, NULL, 32767]", "ARRAY[g::smallint]"),
    ("reals", "real[]", "list<float>", "ARRAY[1.5, NULL, -0.25, 1e10, -16777216]", "ARRAY[g * 0.5::real]"),
    (
        "doubles",
        "double precision[]",
        "list<double>",
        "ARRAY[1.7976931348623157e308, NULL, -2.2250738585072014e-308, 0.1]",
        "ARRAY[g / 3.0::float8]",
    ),
    ("names", "varchar(8)[]", "list<string>", "ARRAY['abc', NULL, 'ç']", "ARRAY['n' || g]"),
    ("codes", "char(3)[]", "list<string>", "ARRAY['ab', NULL]", "ARRAY[lpad(g::text, 3)]"),
    (
        "blobs",
        "bytea[]",
        "list<binary>",
        "ARRAY['\\x00ff'::bytea, NULL, ''::bytea]",
        "ARRAY[decode(md5(g::text), 'hex')]",
    ),
]
NAMES = [c[0] for c in COLUMNS]
DECLARED: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True},
    *[{"name": name, "type": declared} for name, _, declared, _, _ in COLUMNS],
]
DECLARED[NAMES.index("instants") + 1]["encoding"] = "io.debezium.time.ZonedTimestamp"
DECLARED[NAMES.index("stamps") + 1]["encoding"] = "io.debezium.time.MicroTimestamp"
DECLARED[NAMES.index("numbers") + 1]["encoding"] = "io.debezium.data.VariableScaleDecimal"
# numeric without precision (io.debezium.data.VariableScaleDecimal) as decimals, as the source has them
VARIABLE_SCALE = {"variable_scale_decimal": "decimal(38,10)"}
GENERATED = 20  # rows 10..29, besides the four written by hand


def _every(value: str) -> str:
    return ", ".join(f"{value}" for _ in COLUMNS)


SNAPSHOT = [
    f"INSERT INTO {{table}} VALUES (1, {', '.join(c[3] for c in COLUMNS)})",
    f"INSERT INTO {{table}} VALUES (2, {_every(chr(39) + '{}' + chr(39))})",  # empty arrays
    "INSERT INTO {table} (id) VALUES (3)",  # NULL arrays
    f"INSERT INTO {{table}} VALUES (4, {_every(chr(39) + '{NULL}' + chr(39))})",  # one NULL element
    f"INSERT INTO {{table}} SELECT g, {', '.join(c[4] for c in COLUMNS)} FROM generate_series(10, {9 + GENERATED}) g",
]
SNAPSHOT_ROWS = 4 + GENERATED
# Statements streamed after the snapshot, each in its own transaction: 4 + 8 updates, 3 deletes
# (each followed by a tombstone), 1 insert.
CHANGES = [
    "UPDATE {table} SET ints = array_append(ints, 7), texts = NULL, blobs = blobs || '\\x01'::bytea WHERE id = 1",
    "UPDATE {table} SET ints = '{NULL}', texts = '{x}' WHERE id = 2",
    "UPDATE {table} SET " + ", ".join(f"{n} = '{{}}'" for n in NAMES) + " WHERE id = 3",
    "UPDATE {table} SET " + ", ".join(f"{n} = NULL" for n in NAMES) + " WHERE id = 4",
    "DELETE FROM {table} WHERE id BETWEEN 10 AND 12",
    """UPDATE {table} SET amounts = amounts || 99999999.99::numeric(10,2),
       instants = instants || timestamptz '1970-01-01 00:00:00+00' WHERE id BETWEEN 13 AND 20""",
    "INSERT INTO {table} SELECT g, " + ", ".join(c[4] for c in COLUMNS) + " FROM generate_series(40, 40) g",
]
EVENTS = SNAPSHOT_ROWS + 4 + 8 + 3 * 2 + 1
# The statements name their table {table} (not str.format: array literals hold braces).


@dataclass
class Captured:
    """The arrays table captured by a connector: its topic and every row image the source wrote."""

    table: str
    topic: str
    appended: list[dict[str, Any]]


@pytest.fixture(scope="module")
def captured(stack: Any) -> Iterator[tuple[CdcSource, Captured]]:
    """The arrays table, its snapshot and streamed changes in Kafka (one connector for the module)."""
    suffix = uuid.uuid4().hex[:8]
    table = f"public.pg_arrays_{suffix}"
    with open_cdc(stack) as cdc:
        columns = ", ".join(f"{name} {pg_type}" for name, pg_type, _, _, _ in COLUMNS)
        cdc.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, {columns})",
            *[q.replace("{table}", table) for q in SNAPSHOT],
        )
        appended = cdc.rows(table)
        connector = cdc.register(f"dbz_arrays_{suffix}", [table], schemas=True)
        connector.wait_snapshot_done()
        for statement in CHANGES:
            images = cdc.query(statement.replace("{table}", table) + " RETURNING *")
            if not statement.startswith("DELETE"):
                appended += images
        connector.wait_for_events(table, EVENTS)
        topic = connector.topic(table)
        write_corpus(
            "pg-arrays",
            "PostgreSQL arrays of every everyday element type, schemas on, decimal.handling.mode=precise",
            ["id"],
            cdc.records(topic),
        )
        yield cdc, Captured(table, topic, appended)


def test_pg_arrays_upsert_match_the_source(
    captured: tuple[CdcSource, Captured],
    make_sink: Callable[..., Sink],
    rest_catalog: Catalog,
    spark: Any,
    unique_name: Callable[[str], str],
) -> None:
    """Schemas on: each array column is a list of its element type; NULL arrays, empty arrays and
    NULL elements are kept; the Arrow decoder wrote every batch."""
    cdc, capture = captured
    sink = make_sink(
        mode="upsert",
        kafka={"topics": [capture.topic]},
        table={"identifier": f"{unique_name('ns')}.arrays", "key": ["id"]},
        source=VARIABLE_SCALE,
    )
    run = sink.run_until_caught_up()
    schema = rest_catalog.load_table(sink.table).schema()
    assert {f.name: str(f.field_type) for f in schema.fields} == {
        c["name"]: c["type"].replace(",", ", ") for c in DECLARED
    }
    assert not any(schema.find_field(f"{c['name']}.element").required for c in DECLARED[1:])
    log = run.log()
    assert "arrow decoder" in log and "declined" not in log and " 0 dead letters" in log, log[-4000:]
    source = cdc.rows(capture.table)
    assert len(source) == SNAPSHOT_ROWS - 3 + 1
    assert_table_matches(spark, sink.table, source, key="id")


def test_pg_arrays_append_with_declared_list_columns(
    captured: tuple[CdcSource, Captured],
    make_sink: Callable[..., Sink],
    spark: Any,
    unique_name: Callable[[str], str],
) -> None:
    """``table.columns`` declares ``list<int>``, ``list<decimal(10,2)>`` ...; Spark's decoder lands
    every row image the source wrote, each once."""
    _, capture = captured
    sink = make_sink(
        mode="append",
        kafka={"topics": [capture.topic]},
        table={"identifier": f"{unique_name('ns')}.arrays", "key": ["id"], "columns": DECLARED},
        source={"decoder": "spark"},
    )
    run = sink.run_until_caught_up()
    assert " 0 dead letters" in run.log() and "arrow decoder" not in run.log()
    assert_table_matches(spark, sink.table, capture.appended, key=None)


def test_pg_array_columns_evolve(
    cdc: CdcSource,
    make_sink: Callable[..., Sink],
    rest_catalog: Catalog,
    spark: Any,
    unique_name: Callable[[str], str],
) -> None:
    """The table holds ``ints list<int>`` (as an earlier run made it); the source adds a text[] column
    and widens int[] to bigint[]: the table evolves (list<string> added, ints.element int → long)
    and keeps every value."""
    table = f"public.{unique_name('evolving')}"
    cdc.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, ints int[])",
        f"INSERT INTO {table} VALUES (1, ARRAY[1, NULL]), (2, NULL), (3, '{{}}')",
    )
    connector = cdc.register(unique_name("dbz"), [table], schemas=True)
    connector.wait_snapshot_done()
    cdc.execute(
        f"ALTER TABLE {table} ADD COLUMN tags text[], ALTER COLUMN ints TYPE bigint[]",
        f"INSERT INTO {table} VALUES (4, ARRAY[9223372036854775807, NULL], ARRAY['a', NULL])",
        f"UPDATE {table} SET tags = '{{}}' WHERE id = 2",
    )
    connector.wait_for_events(table, 3 + 2)
    sink = make_sink(
        mode="upsert",
        kafka={"topics": [connector.topic(table)]},
        table={"identifier": f"{unique_name('ns')}.evolving", "key": ["id"]},
        source={"decoder": "spark"},  # a batch that evolves the table is Spark's anyway: skip the Arrow try
    )
    rest_catalog.create_namespace(sink.table.rsplit(".", 1)[0])
    columns = [
        column_from_config("id", "long", True, None),
        column_from_config("ints", "list<int>", False, None),
    ]
    rest_catalog.create_table(sink.table, schema=iceberg_schema(columns, ["id"]))

    run = sink.run_until_caught_up()
    assert "add tags list<string>, widen ints.element int → long" in run.log(), run.log()[-4000:]
    schema = rest_catalog.load_table(sink.table).schema()
    assert schema.find_field("ints.element").field_type == LongType()
    assert schema.find_field("tags.element").field_type == StringType()
    assert_table_matches(spark, sink.table, cdc.rows(table), key="id")


def test_list_key_column_is_refused_at_start_up(
    make_sink: Callable[..., Sink], rest_catalog: Catalog, unique_name: Callable[[str], str]
) -> None:
    """A key column declared as a list stops start-up (exit 2) before any table is created."""
    sink = make_sink(
        table={
            "identifier": f"{unique_name('ns')}.keyed",
            "key": ["tags"],
            "columns": [{"name": "tags", "type": "list<int>", "required": True}],
        },
    )
    res = sink.cli("run")
    output = res.stdout + res.stderr
    assert res.returncode == EXIT_CONFIG, f"exit {res.returncode}:\n{output[-4000:]}"
    assert "key column(s) tags (list<int>) are not primitive: a key column can't be a list" in output, output
    assert not rest_catalog.table_exists(sink.table)
