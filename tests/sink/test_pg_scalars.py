"""PostgreSQL's everyday scalar types through a real Debezium connector, value by value (docs/types.md).

One source table holds char(n), varchar, text, bytea, uuid, json, jsonb, xml, inet, cidr, macaddr,
macaddr8, an enum, bit(n), bit varying, bit(1) and boolean, with edge values (padding, empty strings,
multi-byte text, zero bytes, JSON that jsonb rewrites, NULLs). A connector with the default settings
snapshots and streams it, the sink lands it in upsert mode, and the table read through Spark and DuckDB
is compared with ``SELECT *`` of the source, each value as PostgreSQL prints it or as the connector is
documented to carry it. The connector settings that change an encoding (``binary.handling.mode`` hex
and base64, ``interval.handling.mode=string``) are captured from a second table by connectors of their
own and decoded by both decoders, each value checked against the source.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import SparkSession

from readers import duckdb_rows, spark_rows
from service.data.arrow_decode import decode
from service.data.envelope import ERROR_COLUMN
from service.model.columns import columns_from_envelope_schema
from tests.cdc import CdcSource, differences, write_corpus
from tests.sink.conftest import Sink
from tests.sink.decoders import comparable, kafka_positions, spark_decoded

DDL = """CREATE TYPE {table}_mood AS ENUM ('sad', 'ok', 'happy', 'ünïcode ☃');
CREATE TABLE {table} (
    id int PRIMARY KEY,
    c char(5), vc varchar(10), tx text,
    b bytea,
    u uuid,
    j json, jb jsonb,
    x xml,
    ip inet, cd cidr, mac macaddr, mac8 macaddr8,
    e {table}_mood,
    bt bit(4), bv bit varying(20), b1 bit(1), bo boolean
)"""
COLUMNS = ("c", "vc", "tx", "b", "u", "j", "jb", "x", "ip", "cd", "mac", "mac8", "e", "bt", "bv", "b1", "bo")
ROWS: dict[int, dict[str, str]] = {
    1: {
        "c": "'ab'",
        "vc": "'héllo'",
        "tx": "E'multi\\nline ''quoted'' \\\\ text\\ttab'",
        "b": "'\\x00ff10'",
        "u": "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
        "j": """'{"a": 1,   "b":[1,2], "a": 2}'""",
        "jb": """'{"b":[1,2], "a": 1, "a": 3}'""",
        "x": "'<a>x &amp; y</a>'",
        "ip": "'192.168.1.5/24'",
        "cd": "'10.0.0.0/8'",
        "mac": "'08:00:2b:01:02:03'",
        "mac8": "'08:00:2b:01:02:03:04:05'",
        "e": "'happy'",
        "bt": "B'1010'",
        "bv": "B'1'",
        "b1": "B'1'",
        "bo": "true",
    },
    2: {
        "c": "''",
        "vc": "''",
        "tx": "''",
        "b": "'\\x'",
        "u": "'00000000-0000-0000-0000-000000000000'",
        "j": "'null'",
        "jb": "'[]'",
        "x": "'<a/>'",
        "ip": "'::1'",
        "cd": "'2001:db8::/32'",
        "mac": "'00:00:00:00:00:00'",
        "mac8": "'00:00:00:00:00:00:00:00'",
        "e": "'sad'",
        "bt": "B'0000'",
        "bv": "B''",
        "b1": "B'0'",
        "bo": "false",
    },
    3: {},  # all NULL
    4: {
        "c": "'abcde'",
        "vc": "repeat('x', 10)",
        "tx": "repeat('€', 1000) || '😀'",
        "b": "decode(repeat('ab00', 100), 'hex')",
        "u": "'6f9619ff-8b86-d011-b42d-00c04fc964ff'",
        "j": """'"s"'""",
        "jb": """'{"k": "\\u00e9", "n": 1.50, "deep": {"x": [null, true, 1.5e300]}}'""",
        "x": """'<?xml version="1.0"?><r a="1">text</r>'""",
        "ip": "'255.255.255.255'",
        "cd": "'192.168.0.0/16'",
        "mac": "'FF:FF:FF:FF:FF:FF'",
        "mac8": "'ff:ff:ff:ff:ff:ff:ff:ff'",
        "e": "'ünïcode ☃'",
        "bt": "B'1111'",
        "bv": "B'10101010101010101010'",
        "b1": "B'1'",
        "bo": "true",
    },
    5: {
        "c": "'ä'",
        "vc": "'a''b\"c'",
        "tx": "E'control \\u0001 and é'",
        "b": "'\\x00'",
        "ip": "'2001:db8::1/64'",
        "cd": "'::/0'",
        "e": "'ok'",
        "bt": "B'0110'",
        "bv": "B'0001'",
    },
}
STREAMED = 100  # a streamed copy of row n has id n + STREAMED
CHANGES = (
    "UPDATE {table} SET tx = 'changed', jb = '{{\"z\": 0}}', bv = B'11' WHERE id = 1",
    f"DELETE FROM {{table}} WHERE id = {2 + STREAMED}",
    f"UPDATE {{table}} SET c = 'z', b = '\\xffff' WHERE id = {4 + STREAMED}",
)
EVENTS = 2 * len(ROWS) + 2 + 2  # snapshot, streamed copies, 2 updates, a delete and its tombstone

# Settings that change an encoding, each captured by a connector of its own from a second table.
MODES_DDL = "CREATE TABLE {table} (id int PRIMARY KEY, b bytea, iv interval)"
MODES_ROWS = [
    "(1, '\\x00ff10', '1 year 2 months 3 days 04:05:06.789')",
    "(2, '\\x', '-1 mons')",
    "(3, NULL, NULL)",
    "(4, '\\xdeadbeef', '178000000 years')",
    "(5, decode(repeat('00ff', 300), 'hex'), '-3 days 04:00:00.000001')",
    "(6, '\\x0a', '1 day -00:00:01.5')",
]
MODES: dict[str, dict[str, str]] = {
    "hex": {"binary.handling.mode": "hex", "interval.handling.mode": "string"},
    "base64": {"binary.handling.mode": "base64", "interval.handling.mode": "string"},
}


def _bits(text: str | None) -> bytes | None:
    """What Debezium's Bits encoding carries for a bit string: the bits read as a binary number, its
    bytes least significant first (Java's BitSet), none for zero: leading zeros and the length go."""
    if text is None:
        return None
    number = int(text, 2) if text else 0
    return number.to_bytes((number.bit_length() + 7) // 8, "little")


def _expected(row: dict[str, Any]) -> dict[str, Any]:
    """A source row (text of the awkward types) as the connector carries it and the table holds it."""
    return {
        **row,
        "b": None if row["b"] is None else bytes(row["b"]),
        # The connector drops the XML declaration (<?xml ...?>): the document itself is kept.
        "x": None if row["x"] is None else re.sub(r"^<\?xml[^>]*\?>", "", row["x"]),
        "bt": _bits(row["bt"]),
        "bv": _bits(row["bv"]),
        "b1": None if row["b1"] is None else row["b1"] == "1",
    }


def _read(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A reader's rows with binary as bytes and UUIDs as their text (Spark gives bytearray and str,
    DuckDB bytes and UUID)."""

    def plain(value: Any) -> Any:
        if isinstance(value, bytearray):
            return bytes(value)
        return str(value) if isinstance(value, uuid.UUID) else value

    return [{k: plain(v) for k, v in row.items()} for row in rows]


def _source_rows(cdc: CdcSource, table: str) -> list[dict[str, Any]]:
    text = ("u", "j", "jb", "x", "ip", "cd", "mac", "mac8", "e", "bt", "bv", "b1")
    # format('%s'): the type's output function, what SELECT * prints (::text gives inet a /32)
    columns = ", ".join(
        f"CASE WHEN {c} IS NOT NULL THEN format('%s', {c}) END AS {c}" if c in text else c
        for c in ("id", *COLUMNS)
    )
    return [_expected(row) for row in cdc.query(f"SELECT {columns} FROM {table}")]


@pytest.fixture
def enum_cleanup(cdc: CdcSource) -> Iterator[Callable[[str], None]]:
    """Drops a test's enum type after the test (CASCADE: its table is dropped afterwards anyway)."""
    types: list[str] = []
    yield types.append
    for name in types:
        cdc.execute(f"DROP TYPE IF EXISTS {name} CASCADE")


def test_pg_scalars_land_as_the_source_holds_them(
    cdc: CdcSource,
    make_sink: Callable[..., Sink],
    spark: SparkSession,
    unique_name: Callable[[str], str],
    enum_cleanup: Callable[[str], None],
) -> None:
    """Snapshot and streamed rows of the everyday types land equal to the source (through Spark and
    DuckDB); the hex/base64 bytea and string interval encodings decode to the source's values."""
    table, modes = f"public.{unique_name('scalars')}", f"public.{unique_name('modes')}"
    enum_cleanup(f"{table}_mood")

    def insert(rows: dict[int, dict[str, str]], offset: int = 0) -> str:
        values = [
            f"({key + offset}, {', '.join(row.get(c, 'NULL') for c in COLUMNS)})" for key, row in rows.items()
        ]
        return f"INSERT INTO {table} (id, {', '.join(COLUMNS)}) VALUES {', '.join(values)}"

    cdc.execute(*DDL.format(table=table).split(";\n"), insert(ROWS))
    cdc.execute(MODES_DDL.format(table=modes), f"INSERT INTO {modes} VALUES {', '.join(MODES_ROWS)}")
    connector = cdc.register(unique_name("dbz"), [table])
    by_mode = {mode: cdc.register(unique_name("dbz"), [modes], **options) for mode, options in MODES.items()}
    connector.wait_snapshot_done()
    for statement in (insert(ROWS, STREAMED), *(change.format(table=table) for change in CHANGES)):
        cdc.execute(statement)
    connector.wait_for_events(table, EVENTS)
    records = cdc.records(connector.topic(table))
    write_corpus(
        "pg-scalars", "PostgreSQL text, binary and other scalars: schemas on, defaults", ["id"], records
    )

    sink = make_sink(
        mode="upsert",
        kafka={"topics": [connector.topic(table)]},
        table={"identifier": f"{unique_name('ns')}.scalars", "key": ["id"]},
    )
    sink.run_until_caught_up()
    source = _source_rows(cdc, table)
    assert len(source) == 2 * len(ROWS) - 1
    problems = differences(source, _read(spark_rows(spark, sink.table)), "id", "spark")
    problems += differences(source, _read(duckdb_rows(sink.table)), "id", "duckdb")

    # The modes' captures, each record decoded by both decoders and checked against the source.
    expected = cdc.query(
        f"SELECT id, b, CASE WHEN iv IS NOT NULL THEN "
        f"ARRAY[extract(year FROM iv), extract(month FROM iv), extract(day FROM iv), extract(hour FROM iv), "
        f"extract(minute FROM iv), extract(second FROM iv)] END AS iv FROM {modes}"
    )
    for mode, mode_connector in by_mode.items():
        mode_connector.wait_snapshot_done()
        captured = cdc.records(mode_connector.topic(modes))
        settings = ", ".join(f"{k}={v}" for k, v in MODES[mode].items())
        write_corpus(
            f"pg-modes-{mode}", f"PostgreSQL bytea and interval: schemas on, {settings}", ["id"], captured
        )
        problems += _check_mode(spark, mode, captured, expected)
    assert not problems, "\n".join(problems[:60])


_ISO_INTERVAL = re.compile(r"^P(-?\d+)Y(-?\d+)M(-?\d+)DT(-?\d+)H(-?\d+)M(-?[\d.]+)S$")


def _check_mode(
    spark: SparkSession,
    mode: str,
    records: list[tuple[bytes | None, bytes | None]],
    source: list[dict[str, Any]],
) -> list[str]:
    """Both decoders' values of a mode's capture against the source rows (``b`` bytes, ``iv`` as
    PostgreSQL's [years, months, days, hours, minutes, seconds])."""
    columns = columns_from_envelope_schema(json.loads(records[0][1] or b"{}")["schema"])
    spark_rows_ = spark_decoded(spark, records, columns, ["id"], 1 << 20)
    arrow = comparable(
        decode(
            [v for _, v in records],
            [k for k, _ in records],
            kafka_positions(list(range(len(records)))),
            columns,
            ["id"],
            schema_sections=True,
        ).rows
    )
    want = {row["id"]: row for row in source}
    problems = []
    for offset, got in enumerate(arrow):
        reference = spark_rows_[offset]
        if reference[ERROR_COLUMN] is not None:
            problems.append(f"{mode}: record {offset} is a dead letter: {reference[ERROR_COLUMN]}")
        row = want[got["id"]]
        encoded: bytes | str | None  # the source bytes, then as the record encodes them
        encoded = None if row["b"] is None else bytes(row["b"])
        if encoded is not None:
            encoded = encoded.hex() if mode == "hex" else base64.b64encode(encoded).decode()
        for decoder, values in (("arrow", got), ("spark", reference)):
            if values["b"] != encoded:
                problems.append(f"{mode} {decoder}: id {got['id']} b: {values['b']!r}, source {encoded!r}")
            if values["iv"] is not None:
                match = _ISO_INTERVAL.match(values["iv"])
                parsed = None if match is None else [Decimal(g) for g in match.groups()]
                if parsed != row["iv"]:
                    problems.append(
                        f"{mode} {decoder}: id {got['id']} iv: {values['iv']!r}, source {row['iv']}"
                    )
    return problems
