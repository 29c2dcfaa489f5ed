"""Many PostgreSQL types through Debezium in Avro land as they do in JSON, value by value.

One source table with a column of most types the JSON tests check against the source (docs/types.md:
integers, floats, exact and variable-scale numerics, text, bytes, uuid, json, enum, bits, dates, times,
timestamps with and without zone, intervals, arrays), captured by two connectors at once: Kafka
Connect's JSON converter with schemas, and Apicurio's Avro converter through the stack's registry.
Each stream is landed in upsert mode; the two tables must have the same schema and the same rows,
value for value and type for type, through DuckDB and pyiceberg (Spark does not read time columns). The JSON path's own tests prove those
values against the source (test_pg_scalars.py, test_pg_numbers.py, test_pg_temporal.py,
test_pg_arrays.py); here a mismatch can only come from the Avro path.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from readers import duckdb_rows, pyiceberg_rows
from tests.cdc import differences
from tests.sink.conftest import Sink, open_cdc

DDL = """CREATE TYPE {name}_mood AS ENUM ('sad', 'ok', 'ünïcode ☃');
CREATE TABLE {table} (
    id int PRIMARY KEY,
    si smallint, i int, bi bigint, r real, d double precision,
    n numeric(12,3), nv numeric, m money,
    bo boolean, tx text, vc varchar(10), c char(4), b bytea, u uuid, j json, jb jsonb,
    e {name}_mood, bt bit(4), b1 bit(1),
    dt date, t time, t3 time(3), ts timestamp, ts3 timestamp(3), tz timestamptz, iv interval,
    ia int[], ta text[]
)"""
ROWS = [
    """(1, -32768, 2147483647, -9223372036854775808, 1.5, -2.25e100, 123456789.123, 1.5, 12.34,
        true, E'multi\\nline ☃', 'short', 'ab', '\\x00ff10', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11',
        '{"a": 1,  "a": 2}', '{"b": [1, 2], "a": 1}', 'ünïcode ☃', B'1010', B'1',
        '0001-01-01', '23:59:59.999999', '12:00:00.123', '1999-12-31 23:59:59.999999',
        '2026-03-01 08:00:00.123', '2026-03-01 10:00:00+02', '1 year 2 mons 3 days 04:05:06.5',
        '{1,NULL,3}', '{"a","b c",NULL}')""",
    """(2, 0, 0, 0, 'NaN', '-Infinity', -0.001, 'NaN', -1.00,
        false, '', '', '', '', '00000000-0000-0000-0000-000000000000',
        'null', '[]', 'sad', B'0000', B'0',
        '2038-01-19', '00:00:00', '00:00:00', '1970-01-01 00:00:00', '1970-01-01 00:00:00',
        '1970-01-01 00:00:00+00', '0', '{}', '{}')""",
    "(3" + ", NULL" * 28 + ")",
]


def test_many_types_land_from_avro_as_from_json(
    stack: Any, make_sink: Callable[..., Sink], unique_name: Callable[[str], str]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    name = f"types_{suffix}"
    table = f"public.{name}"
    with open_cdc(stack) as cdc:
        cdc.execute(DDL.format(name=name, table=table), f"INSERT INTO {table} VALUES {', '.join(ROWS[:2])}")
        as_json = cdc.register(f"dbz_json_{suffix}", [table], schemas=True)
        as_avro = cdc.register(f"dbz_avro_{suffix}", [table], avro_registry=stack.schema_registry_url)
        for connector in (as_json, as_avro):
            connector.wait_snapshot_done()
        cdc.execute(
            f"INSERT INTO {table} VALUES {ROWS[2]}",
            f"UPDATE {table} SET tx = 'updated', ia = '{{7}}' WHERE id = 1",
            f"DELETE FROM {table} WHERE id = 2",
            f"INSERT INTO {table} VALUES {ROWS[1]}",
        )
        for connector in (as_json, as_avro):
            connector.wait_for_events(table, 2 + 4 + 1)  # snapshot, changes, the delete's tombstone
        source = cdc.rows(table)

        tables = {}
        for label, connector in (("json", as_json), ("avro", as_avro)):
            extra = (
                {"source": {"format": "debezium-avro", "schema_registry": {"url": stack.schema_registry_url}}}
                if label == "avro"
                else {}
            )
            sink = make_sink(
                kafka={"topics": [connector.topic(table)]},
                table={
                    "identifier": f"{unique_name('ns')}.types_{label}",
                    "key": ["id"],
                    "delete_format": "position",  # pyiceberg reads it
                },
                **extra,
            )
            run = sink.run_until_caught_up()
            assert f"{label if label == 'avro' else 'arrow'} decoder" in run.log(), run.log()[-3000:]
            tables[label] = sink.table

    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("rest", **stack.pyiceberg_properties())
    schemas = {label: catalog.load_table(t).schema() for label, t in tables.items()}
    assert [(f.name, str(f.field_type), f.required) for f in schemas["avro"].fields] == [
        (f.name, str(f.field_type), f.required) for f in schemas["json"].fields
    ]
    for reader, read in (("duckdb", duckdb_rows), ("pyiceberg", pyiceberg_rows)):  # Spark reads no time
        json_rows = read(tables["json"])
        assert sorted(r["id"] for r in json_rows) == sorted(r["id"] for r in source)
        problems = differences(json_rows, read(tables["avro"]), "id", reader)
        assert not problems, "\n".join(problems[:40])
