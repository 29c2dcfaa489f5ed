"""Schema evolution: the table follows compatible changes of the events' schema without losing a record."""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, Producer
from pyiceberg.catalog import Catalog
from pyiceberg.types import DecimalType, IntegerType, LongType, StringType

from readers import duckdb_rows, pyiceberg_rows, spark_rows, trino_rows
from service.iceberg.evolution import EvolutionPolicy, IncompatibleSchema, apply, check, plan
from service.model.columns import (
    Column,
    Encoding,
    column_from_config,
    columns_from_envelope_schema,
    iceberg_schema,
    list_of,
)
from tests.sink.conftest import Sink
from tests.sink.expect import Record
from tests.sink.test_end_to_end import _catalog

TABLE = iceberg_schema(
    [
        column_from_config("id", "long", True, None),
        column_from_config("n", "int", True, None),
        column_from_config("amount", "decimal(10,2)", False, None),
    ],
    ["id"],
)


def cols(*specs: tuple[str, str, bool]) -> list[Any]:
    return [column_from_config(name, type_, required, None) for name, type_, required in specs]


def test_plan_adds_widens_and_relaxes() -> None:
    evolution = plan(
        TABLE,
        cols(
            ("id", "long", True),
            ("n", "long", False),
            ("amount", "decimal(12,2)", False),
            ("tier", "string", False),
        ),
    )
    assert [c.name for c in evolution.add] == ["tier"]
    assert evolution.widen == [
        ("n", IntegerType(), LongType()),
        ("amount", DecimalType(10, 2), DecimalType(12, 2)),
    ]
    assert evolution.make_optional == ["n"]
    assert not evolution.incompatible
    check(evolution, EvolutionPolicy.ADD_COLUMNS, "t")
    with pytest.raises(IncompatibleSchema, match="strict"):
        check(evolution, EvolutionPolicy.STRICT, "t")


def test_plan_accepts_narrower_events_as_they_are() -> None:
    evolution = plan(TABLE, cols(("id", "int", True), ("n", "int", True), ("amount", "decimal(8,2)", False)))
    assert not evolution.changes and not evolution.incompatible


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            cols(("id", "long", True), ("n", "string", True)),
            "column n: the events carry string but the table has int",
        ),
        (cols(("id", "long", True), ("n", "int", True), ("amount", "decimal(10,3)", False)), "column amount"),
        (cols(("n", "int", True)), "key column id is missing"),
    ],
)
def test_plan_refuses_what_iceberg_cannot_express(columns: list[Any], message: str) -> None:
    evolution = plan(TABLE, columns)
    with pytest.raises(IncompatibleSchema, match=message):
        check(evolution, EvolutionPolicy.ADD_COLUMNS, "t")


def _array(name: str, items: dict[str, Any]) -> dict[str, Any]:
    return {"field": name, "type": "array", "optional": True, "items": items}


def test_plan_evolves_a_lists_element_as_a_column(rest_catalog: Catalog) -> None:
    """A list's element widens (int → long) and becomes optional like a column; a new list column
    is added; the catalog applies all three in one schema update."""
    namespace = f"evolve_lists_{uuid.uuid4().hex[:8]}"
    rest_catalog.create_namespace(namespace)
    table = rest_catalog.create_table(
        f"{namespace}.t",
        schema=iceberg_schema(
            [
                column_from_config("id", "long", True, None),
                Column("ints", list_of(IntegerType(), element_required=True), False, Encoding.INTEGER),
            ],
            ["id"],
        ),
    )
    events = columns_from_envelope_schema(
        {
            "fields": [
                {
                    "field": "after",
                    "type": "struct",
                    "fields": [
                        _field("id", "int64", False),
                        _array("ints", {"type": "int64", "optional": True}),
                        _array("tags", {"type": "string", "optional": True}),
                    ],
                }
            ]
        }
    )
    evolution = plan(table.schema(), events)
    assert [c.name for c in evolution.add] == ["tags"]
    assert evolution.widen == [("ints.element", IntegerType(), LongType())]
    assert evolution.make_optional == ["ints.element"]
    schema = apply(table, evolution).schema()
    assert schema.find_field("ints.element").field_type == LongType()
    assert not schema.find_field("ints.element").required
    assert str(schema.find_field("tags").field_type) == "list<string>"
    assert not plan(schema, events).changes


@pytest.mark.parametrize(
    ("events", "message"),
    [
        (
            cols(("id", "long", True), ("ints", "list<string>", False)),
            "column ints.element: the events carry string",
        ),
        (
            cols(("id", "long", True), ("ints", "int", False)),
            "column ints: the events carry int but the table has list<int>",
        ),
        (
            cols(("id", "long", True), ("n", "list<int>", False)),
            "column n: the events carry list<int> but the table has int",
        ),
    ],
)
def test_plan_refuses_list_changes_iceberg_cannot_express(events: list[Any], message: str) -> None:
    table = iceberg_schema(
        [*cols(("id", "long", True), ("n", "int", False), ("ints", "list<int>", False))], ["id"]
    )
    with pytest.raises(IncompatibleSchema, match=message):
        check(plan(table, events), EvolutionPolicy.ADD_COLUMNS, "t")


def _field(name: str, type_: str, optional: bool = True, **extra: Any) -> dict[str, Any]:
    return {"field": name, "type": type_, "optional": optional, **extra}


V1 = [_field("id", "int64", False), _field("name", "string", False), _field("version", "int32")]
V2 = [
    _field("id", "int64", False),
    _field("name", "string"),
    _field("version", "int64"),
    _field("tier", "string"),
]
V3 = [
    _field("id", "int64", False),
    _field("name", "int32"),
    _field("version", "int64"),
    _field("tier", "string"),
]


def _event(fields: list[dict[str, Any]], op: str, row: dict[str, Any]) -> str:
    struct = {"type": "struct", "optional": True, "fields": fields}
    schema = {
        "type": "struct",
        "fields": [
            {**struct, "field": "before"},
            {**struct, "field": "after"},
            _field("op", "string", False),
        ],
    }
    return json.dumps({"schema": schema, "payload": {"op": op, "after": row, "before": None}})


def _send(sink: Sink, events: list[tuple[int, str]]) -> None:
    producer = Producer({"bootstrap.servers": sink.bootstrap})
    for key, value in events:
        producer.produce(sink.topic, key=json.dumps({"id": key}), value=value)
    assert producer.flush(30) == 0


def _rows(spark: Any, table: str) -> dict[str, list[dict[str, Any]]]:
    """The table through every reader (written with position deletes, which pyiceberg reads)."""
    return {
        reader: sorted(rows, key=lambda r: r["id"])
        for reader, rows in (
            ("spark", spark_rows(spark, table)),
            ("duckdb", duckdb_rows(table)),
            ("trino", trino_rows(table)),
            ("pyiceberg", pyiceberg_rows(table)),
        )
    }


def _dead_letters(bootstrap: str, topic: str) -> list[dict[str, str]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    out: list[dict[str, str]] = []
    try:
        for _ in range(8):
            out += [
                {k: v.decode() for k, v in cast(Record, m).headers() or []}
                for m in consumer.consume(100, timeout=1)
                if m.error() is None
            ]
    finally:
        consumer.close()
    return out


def test_running_sink_evolves_its_table(make_sink: Any, spark: Any) -> None:
    sink: Sink = make_sink(
        partitions=1, table={"on_incompatible_schema": "dead_letter", "delete_format": "position"}
    )
    _send(sink, [(i, _event(V1, "c", {"id": i, "name": f"a{i}", "version": 1})) for i in range(1, 4)])
    sink.run_until_caught_up()

    # v2: a new column, version widened int→long, name now optional; v3 (name int32) can't be expressed.
    _send(
        sink,
        [
            (2, _event(V2, "u", {"id": 2, "name": None, "version": 2**40, "tier": "gold"})),
            (4, _event(V2, "c", {"id": 4, "name": "d4", "version": 1, "tier": "silver"})),
            (5, _event(V3, "c", {"id": 5, "name": 5, "version": 1, "tier": "x"})),
            (
                1,
                _event(V1, "u", {"id": 1, "name": "a1-bis", "version": 2}),
            ),  # an old-schema event after the change
        ],
    )
    run = sink.run_until_caught_up()
    assert "evolved the schema" in run.log()

    table = _catalog(sink).load_table(sink.table)
    schema = table.schema()
    assert schema.find_field("tier").field_type == StringType() and not schema.find_field("tier").required
    assert schema.find_field("version").field_type == LongType()
    assert not schema.find_field("name").required
    expected = [
        {"id": 1, "name": "a1-bis", "version": 2, "tier": None},
        {"id": 2, "name": None, "version": 2**40, "tier": "gold"},
        {"id": 3, "name": "a3", "version": 1, "tier": None},
        {"id": 4, "name": "d4", "version": 1, "tier": "silver"},
    ]
    for reader, rows in _rows(spark, sink.table).items():
        assert rows == expected, f"{reader}: {rows}"
    letters = _dead_letters(sink.bootstrap, f"{sink.name}.dlq")
    assert len(letters) == 1 and "incompatible schema change" in letters[0]["icesink.error"], letters
    assert "column name" in letters[0]["icesink.error"]


def test_incompatible_change_stops_the_sink_by_default(make_sink: Any) -> None:
    sink: Sink = make_sink(partitions=1)
    _send(sink, [(1, _event(V1, "c", {"id": 1, "name": "a", "version": 1}))])
    sink.run_until_caught_up()
    _send(sink, [(2, _event(V3, "c", {"id": 2, "name": 7, "version": 1, "tier": "x"}))])
    run = sink.start("--until-caught-up")
    code = run.wait(300)
    assert code == 2, run.log()[-3000:]
    assert "column name: the events carry int but the table has string" in run.log()
    assert len(_catalog(sink).load_table(sink.table).metadata.snapshots) == 1  # nothing more written
