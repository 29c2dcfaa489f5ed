"""PostgreSQL's numeric types through a real Debezium connector, value by value.

One source table holds every numeric type (decimals of fixed precision up to 38 digits, ``numeric``
without precision, ``money``, ``real``/``double precision`` with NaN and ±Infinity, the integers at their
bounds, zeros, NULLs, tiny scales). A real connector captures it, in ``decimal.handling.mode=precise``
with schemas and in ``string`` mode without (columns declared in ``table.columns``); the sink lands it in
upsert mode, and the table read through Spark and DuckDB is compared with ``SELECT *`` of the source.
Where Debezium itself sends something other than the source value (docs/types.md says what), the
expected value is what the connector sent, and the test checks the event said so. The connector's
records are the corpus files ``pg-numbers-*.jsonl`` (written with ``ICESINK_WRITE_CORPUS=1``), on which
tests/sink/test_connector_corpus.py holds Spark's decoder and the Arrow decoder side by side.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Context, Decimal
from typing import Any, cast

import pytest

from readers import duckdb_rows, spark_rows
from service.data import arrow_decode
from service.model.columns import Column, column_from_config, columns_from_envelope_schema
from tests.cdc import CdcSource, Connector, differences, write_corpus
from tests.sink.conftest import Sink
from tests.sink.decoders import comparable, kafka_positions
from tests.sink.expect import Headers, topic_records

DDL = """CREATE TABLE {table} (
    id int PRIMARY KEY,
    n38 numeric(38,0), n3810 numeric(38,10), n29 numeric(29,0), n18 numeric(18,4),
    nv numeric, m money, r real, d double precision, s smallint, i integer, b bigint
)"""
COLUMNS = ["id", "n38", "n3810", "n29", "n18", "nv", "m", "r", "d", "s", "i", "b"]
# Rows as SQL literals, in COLUMNS order.
EDGE_ROWS = [
    "1, 99999999999999999999999999999999999999, 9999999999999999999999999999.9999999999,"
    " 99999999999999999999999999999, 99999999999999.9999, -9999999999999999999999999999.9999999999,"
    " 92233720368547758.07, 3.4028235e38, 1.7976931348623157e308, 32767, 2147483647, 9223372036854775807",
    "2, -99999999999999999999999999999999999999, -9999999999999999999999999999.9999999999,"
    " -99999999999999999999999999999, -99999999999999.9999, 9999999999999999999999999999.9999999999,"
    " -92233720368547758.08, -3.4028235e38, -1.7976931348623157e308, -32768, -2147483648, -9223372036854775808",
    "3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0",
    "4, 1, 1, 1, 1, 'NaN', 1, 'NaN', 'NaN', 1, 1, 1",
    "5, 2, 2, 2, 2, 'Infinity', 2, 'Infinity', 'Infinity', 2, 2, 2",
    "6, 3, 3, 3, 3, '-Infinity', 3, '-Infinity', '-Infinity', 3, 3, 3",
    "7, 1, 0.0000000001, 1, 0.0001, 12345678901234567890.0123456789, 0.01, 1.4e-45, 5e-324, 1, 1, 1",
    "8, -1, -0.0000000001, -1, -0.0001, 1000.00, -0.01, -1.17549435e-38, -2.2250738585072014e-308,"
    " -1, -1, -1",
    "9, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
    "10, 4, 4, 4, 4, 0.000000000000000000000000000001, 4, 4, 4, 4, 4, 4",
    "11, 5, 5, 5, 5, -0.00000000000000000001, 5, 5, 5, 5, 5, 5",
    "12, 6, 6, 6, 6, 123456789012345678901234567890123456789012345, 6, 6, 6, 6, 6, 6",
    "13, 7, 7, 7, 7, 1.50000000000000000000, 12345678.91, '-0', '-0', 7, 7, 7",
]
# ``numeric`` values that do not fit the configured decimal(38,10) without rounding: dead letters.
NOT_DECIMAL_38_10 = {
    10: "0.000000000000000000000000000001",
    11: "-0.00000000000000000001",
    12: "123456789012345678901234567890123456789012345",
}
VARIABLE_SCALE = "decimal(38,10)"
DIGITS = "1234567890" * 4


def _digits(k: int, scale: int = 0, negative: bool = False) -> str:
    """A number of ``k`` digits (all different from their neighbours), ``scale`` of them after the point."""
    text = DIGITS[:k]
    text = f"{text[: k - scale]}.{text[k - scale :]}" if scale else text
    return f"-{text}" if negative else text


# Values of 19 to 38 digits, every other one negative: the widths that used to land with other values.
WIDE_ROWS = [
    f"{k}, {_digits(k, 0, k % 2 == 1)}, {_digits(k, 10, k % 2 == 1)}, {_digits(min(k, 29), 0, k % 2 == 0)},"
    f" {_digits(18, 4, k % 2 == 1)}, {_digits(k, 10, k % 2 == 0)}, {_digits(17, 2, k % 2 == 1)},"
    f" {k}.5, -{k}.25, {k}, {-k}, {(k % 2 * 2 - 1) * (2**62 + k)}"
    for k in range(19, 39)
]
# Streamed after the snapshot, each statement in its own transaction.
CHANGES = [
    "UPDATE {table} SET n38 = -n38, n3810 = -n3810, n29 = -n29, n18 = -n18, nv = -nv, m = m * -1, b = -b"
    " WHERE id BETWEEN 19 AND 28",
    "UPDATE {table} SET r = 'NaN', d = '-Infinity', nv = 'Infinity' WHERE id = 3",
    "DELETE FROM {table} WHERE id = 9",
    "INSERT INTO {table} SELECT 50, n38, n3810, n29, n18, nv, m, r, d, s, i, b FROM {table} WHERE id = 1",
]
SNAPSHOT = len(EDGE_ROWS) + len(WIDE_ROWS)
EVENTS = SNAPSHOT + 10 + 1 + 2 + 1  # reads, updates, a delete and its tombstone, an insert


@dataclass(frozen=True)
class Run:
    """One way of running connector and sink."""

    decimal_mode: str
    schemas: bool
    corpus: str  # the file in tests/sink/corpus its records go to (ICESINK_WRITE_CORPUS=1)
    sink: dict[str, Any]  # make_sink overrides besides kafka and table identifier


PRECISE = Run("precise", True, "pg-numbers-precise", {"source": {"variable_scale_decimal": VARIABLE_SCALE}})
STRING = Run(
    "string",
    False,
    "pg-numbers-string-schemaless",
    {
        "table": {
            "key": ["id"],
            "columns": [
                {"name": "id", "type": "int", "required": True},
                {"name": "n38", "type": "decimal(38,0)", "encoding": "decimal-text"},
                {"name": "n3810", "type": "decimal(38,10)", "encoding": "decimal-text"},
                {"name": "n29", "type": "decimal(29,0)", "encoding": "decimal-text"},
                {"name": "n18", "type": "decimal(18,4)", "encoding": "decimal-text"},
                {"name": "nv", "type": "string"},
                {"name": "m", "type": "decimal(38,2)", "encoding": "decimal-text"},
                {"name": "r", "type": "float"},
                {"name": "d", "type": "double"},
                {"name": "s", "type": "int"},
                {"name": "i", "type": "int"},
                {"name": "b", "type": "long"},
            ],
        }
    },
)
# What Debezium's string mode sends for numeric's special values (a string column keeps the text).
STRING_MODE_SPECIALS = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}
_WIDE = Context(prec=100)


def _float32(value: float) -> float:
    """A real as a reader sees it: the float32 Postgres holds (psycopg reads its shortest text)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def expected_row(row: dict[str, Any], run: Run) -> dict[str, Any]:
    """A source row as the table holds it: what the connector sends where it is not the source value."""
    nv, r = row["nv"], row["r"]
    if run.decimal_mode == "precise":
        # No NaN or Infinity in a Kafka Connect decimal: the connector sends null.
        row = {**row, "nv": None if nv is None or not nv.is_finite() else nv}
    else:
        # numeric without precision is declared a string column: the connector's text, which writes
        # NaN and ±Infinity its own way.
        row = {**row, "nv": None if nv is None else STRING_MODE_SPECIALS.get(str(nv), format(nv, "f"))}
    return {**row, "r": None if r is None else _float32(r)}


def precise_text(value: Decimal) -> str:
    """The text of a numeric as the precise mode's VariableScaleDecimal carries it: without the
    trailing zeros after the point (1000.00 comes as 1000)."""
    return format(value.normalize(_WIDE), "f")


def _as_double(value: Decimal | None) -> Decimal | None:
    return None if value is None else Decimal(repr(float(value)))


def _comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """NaN equals nothing, itself included: compare it as text. Money is compared as the double the
    connector turned it into (in every mode), on both sides."""

    def value(column: str, v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        return _as_double(v) if column == "m" else v

    return [{c: value(c, v) for c, v in row.items()} for row in rows]


Records = list[tuple[bytes | None, bytes | None]]


def _after(records: Records, key: int) -> dict[str, Any]:
    """The after image of the snapshot read of row `key`."""
    for _, value in records:
        event = None if value is None else json.loads(value)
        payload = None if event is None else event.get("payload", event)
        if payload and payload["op"] == "r" and payload["after"]["id"] == key:
            return dict(payload["after"])
    raise AssertionError(f"no snapshot event of id {key}")


@dataclass
class Captured:
    table: str
    connector: Connector
    records: Records  # what the connector published, partition by partition in offset order


def capture(cdc: CdcSource, unique_name: Callable[[str], str], run: Run) -> Captured:
    """The source table, captured by a connector in `run`'s mode: snapshot and streamed changes in Kafka."""
    table = f"public.{unique_name('numbers')}"
    rows = ", ".join(f"({row})" for row in EDGE_ROWS + WIDE_ROWS)
    cdc.execute(DDL.format(table=table), f"INSERT INTO {table} ({', '.join(COLUMNS)}) VALUES {rows}")
    connector = cdc.register(unique_name("dbz"), [table], schemas=run.schemas, decimal_mode=run.decimal_mode)
    connector.wait_snapshot_done()
    for change in CHANGES:
        cdc.execute(change.format(table=table))
    connector.wait_for_events(table, EVENTS)
    records = cdc.records(connector.topic(table))
    schemas = "on" if run.schemas else "off"
    write_corpus(
        run.corpus,
        f"PostgreSQL numbers, schemas {schemas}, decimal.handling.mode={run.decimal_mode}",
        ["id"],
        records,
        **({} if run.schemas else {"columns": run.sink["table"]["columns"]}),
    )
    return Captured(table, connector, records)


def source_rows(cdc: CdcSource, table: str) -> list[dict[str, Any]]:
    """``SELECT *``, with money as numeric (psycopg reads money as locale-formatted text)."""
    columns = ", ".join("m::numeric AS m" if c == "m" else c for c in COLUMNS)
    return cdc.query(f"SELECT {columns} FROM {table}")


def _check_events_say_so(events: Records, run: Run) -> None:
    """The connector really sent the awkward values: special floats as strings, numeric's NaN as null
    (precise) or its own text (string), 38-digit decimals."""
    assert _after(events, 4)["r"] == "NaN" and _after(events, 5)["d"] == "Infinity", _after(events, 4)
    assert _after(events, 6)["r"] == "-Infinity", _after(events, 6)
    if run.decimal_mode == "precise":
        assert _after(events, 4)["nv"] is None, _after(events, 4)
        assert _after(events, 10)["nv"]["scale"] == 30, _after(events, 10)
        assert _after(events, 1)["n38"] == "SztMqFqGxHoJiiI//////w==", _after(events, 1)  # 10**38 - 1
        # money's largest value, through a double: 92233720368547760.00
        assert _after(events, 1)["m"] == "AIAAAAAAAADA", _after(events, 1)
    else:
        assert _after(events, 4)["nv"] == "NAN" and _after(events, 1)["n38"] == "9" * 38, _after(events, 1)
        assert _after(events, 1)["m"] == "9.223372036854776E16", _after(events, 1)


def _decoder_columns(records: Records, run: Run) -> list[Column]:
    """The columns the sink decodes `run`'s records with; in precise mode ``numeric`` as its text."""
    if run.schemas:
        return columns_from_envelope_schema(json.loads(records[0][1] or "{}")["schema"])
    return [
        column_from_config(c["name"], c["type"], c.get("required", False), c.get("encoding"))
        for c in run.sink["table"]["columns"]
    ]


def _arrow_decoded(records: Records, run: Run) -> list[dict[str, Any]]:
    """The connector's records decoded as one batch by the Arrow decoder, which takes them all (that
    Spark's decoder agrees is tests/sink/test_connector_corpus.py's part, on the same records)."""
    decoded = arrow_decode.decode(
        [v for _, v in records],
        [k for k, _ in records],
        kafka_positions(list(range(len(records)))),
        _decoder_columns(records, run),
        ["id"],
        schema_sections=run.schemas,
    )
    return comparable(decoded.rows)


@pytest.mark.parametrize("run", [PRECISE, STRING], ids=["precise-schemas", "string-columns"])
def test_postgres_numbers_land_value_by_value(
    run: Run,
    cdc: CdcSource,
    make_sink: Callable[..., Sink],
    spark: Any,
    stack: Any,
    unique_name: Callable[[str], str],
) -> None:
    """Every numeric type at its edges lands as the source holds it (or, where Debezium sends something
    else, as the connector sent it); in precise mode ``numeric`` values that a decimal(38,10) can't hold
    without rounding are dead letters naming the column."""
    captured = capture(cdc, unique_name, run)
    _check_events_say_so(captured.records, run)
    decoded = _arrow_decoded(captured.records, run)
    table = {**run.sink.get("table", {}), "identifier": f"{unique_name('ns')}.numbers"}
    sink = make_sink(
        kafka={"topics": [captured.connector.topic(captured.table)]}, **{**run.sink, "table": table}
    )
    log = sink.run_until_caught_up().log()

    source = source_rows(cdc, captured.table)
    assert len(source) == SNAPSHOT  # one row deleted, one inserted
    dead = NOT_DECIMAL_38_10 if run.decimal_mode == "precise" else {}
    want = _comparable([expected_row(r, run) for r in source if r["id"] not in dead])
    problems = differences(want, _comparable(spark_rows(spark, sink.table)), "id", "spark")
    problems += differences(want, _comparable(duckdb_rows(sink.table)), "id", "duckdb")
    assert not problems, "\n".join(problems[:40])

    letters = topic_records(stack.kafka_bootstrap, f"{sink.name}.dlq", len(dead))
    reasons = {
        json.loads(cast(bytes, m.key()))["payload"]["id"]: dict(cast(Headers, m.headers()))[
            "icesink.error"
        ].decode()
        for m in letters
    }
    assert sorted(reasons) == sorted(dead), reasons
    for key, value in dead.items():
        assert "column nv" in reasons[key] and value in reasons[key], reasons
        assert "decimal(38, 10)" in reasons[key], reasons
    # The dead letters kept the batch from the Arrow decoder; without them it takes the batch.
    decoder = "spark" if dead else "arrow"
    assert re.search(rf"committed seq \d+ .*, {decoder} decoder", log), log[-4000:]
    if run.decimal_mode == "precise":
        # As text (the default mapping), numeric keeps every value the connector sends.
        latest = {r["id"]: r["nv"] for r in decoded}  # in offset order: a key's changes are in one partition
        nv = {r["id"]: r["nv"] for r in source}
        want_text = {k: None if v is None or not v.is_finite() else precise_text(v) for k, v in nv.items()}
        assert {k: latest[k] for k in want_text} == want_text
