"""A tombstone (a key and a null value) deletes its key in upsert mode; append mode ignores it.

A compacted topic keeps only the last record of each key: of a deleted row, the tombstone, its `d`
event gone. A sink that lags behind compaction sees nothing else of the delete.
"""

from __future__ import annotations

import json
from typing import Any, cast

from readers import duckdb_rows, spark_rows
from tests.sink.conftest import Sink, change
from tests.sink.expect import topic_records


def _names(spark: Any, table: str) -> dict[str, dict[int, str]]:
    return {
        reader: {r["id"]: r["name"] for r in rows}
        for reader, rows in (("spark", spark_rows(spark, table)), ("duckdb", duckdb_rows(table)))
    }


def test_tombstone_deletes_the_key(make_sink: Any, spark: Any) -> None:
    sink: Sink = make_sink(partitions=1)
    sink.send([change(1, "one", {"lsn": 10}), change(2, "two", {"lsn": 11})])
    sink.run_until_caught_up()
    assert _names(spark, sink.table) == {"spark": {1: "one", 2: "two"}, "duckdb": {1: "one", 2: "two"}}

    # What compaction leaves of a deleted row: the tombstone alone, keyed with or without a schema
    # section; and two tombstones that name no row.
    sink.send(
        [
            (json.dumps({"schema": {"type": "struct"}, "payload": {"id": 1}}), None),
            ("{not json", None),
            (json.dumps({"other": 2}), None),
        ]
    )
    records = topic_records(sink.bootstrap, sink.topic, 5)
    events = [json.loads(cast(bytes, m.value()))["payload"] for m in records if m.value() is not None]
    assert len(records) == 5 and [e["op"] for e in events] == ["u", "u"]  # the topic holds no `d` event

    run = sink.run_until_caught_up()

    assert _names(spark, sink.table) == {"spark": {2: "two"}, "duckdb": {2: "two"}}
    assert ", 3 records (d=1), 2 dead letters" in run.log(), run.log()[-3000:]
    letters = topic_records(sink.bootstrap, f"{sink.name}.dlq", 2)
    assert all(m.value() is None for m in letters)
    headers = [{k: v.decode() for k, v in m.headers() or []} for m in letters]
    assert sorted((h["icesink.source.offset"], h["icesink.error"]) for h in headers) == [
        ("3", "tombstone whose key can't be parsed (not JSON, or a key column of the wrong JSON type)"),
        ("4", "tombstone whose key has no column id"),
    ], headers


def test_append_mode_ignores_tombstones(make_sink: Any, spark: Any) -> None:
    sink: Sink = make_sink(mode="append", partitions=1)
    sink.send([change(1, "one", {"lsn": 10}), (json.dumps({"id": 1}), None), ("{not json", None)])
    run = sink.run_until_caught_up()

    assert ", 1 records (u=1), 0 dead letters" in run.log(), run.log()[-3000:]
    assert _names(spark, sink.table) == {"spark": {1: "one"}, "duckdb": {1: "one"}}
