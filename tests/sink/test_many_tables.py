"""One sink, a whole database: topics matched by a pattern, each landing in a table of its own.

The tables are named from the events' Debezium source (``{source.table}``); keys come from the
records' keys; one table is partitioned by a non-key column, one is in append mode, and one topic is
created while the sink runs. Every table must end exactly equal to its source, through Spark and
DuckDB, with one snapshot per batch that wrote to it.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any, cast

from pyiceberg.catalog import Catalog
from pyiceberg.table.snapshots import Summary

from service.sample import Change, SampleSource, ensure_topic, produce
from tests.sink.conftest import Sink
from tests.sink.expect import appended_rows, assert_rows, assert_seqs_increasing


def _many_table_sink(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str]
) -> tuple[Sink, str, str]:
    prefix = unique_name("shop")
    namespace = unique_name("lake")
    sink = make_sink(
        kafka={
            "topics": [],
            "topic_pattern": rf"{prefix}\..*",
            # Spark's source looks for new topics matching the pattern at each metadata refresh.
            "options": {"metadata.max.age.ms": "2000"},
        },
        # position deletes: every reader, pyiceberg too, reads the upsert tables
        table={
            "identifier": f"{namespace}.{{source.table}}",
            "mode": "upsert",
            "key": [],
            "delete_format": "position",
        },
        tables={
            f"{namespace}.orders": {"partition_by": ["country"]},
            f"{namespace}.events": {"mode": "append"},
        },
    )
    sink.config["kafka"].pop("topics")
    return sink, prefix, namespace


def _feed(bootstrap: str, topic: str, source: SampleSource, n: int, history: list[Any]) -> None:
    ensure_topic(bootstrap, topic, 2)
    changes = [source.next_change() for _ in range(n)]
    produce(bootstrap, topic, changes)
    history.extend(changes)


def _with_a_new_column(change: Change) -> Change:
    """The change as its source table sends it after ``ALTER TABLE ... ADD COLUMN note text``."""
    value = copy.deepcopy(change.value)
    for part in value["schema"]["fields"]:
        if part["field"] in ("before", "after"):
            part["fields"] = [*part["fields"], {"field": "note", "type": "string", "optional": True}]
    if value["payload"].get("after"):
        value["payload"]["after"]["note"] = f"note-{change.key['payload']['id']}"
    return Change(key=change.key, value=value, op=change.op, row=change.row)


def _rows_in(catalog: Catalog, table: str) -> int:
    if not catalog.table_exists(table):
        return -1
    snapshot = catalog.load_table(table).current_snapshot()
    # cast: a format-version 2 snapshot has a summary
    return (
        -1
        if snapshot is None
        else int(cast(Summary, snapshot.summary).additional_properties.get("total-records", 0))
    )


def test_topics_of_a_database_land_in_their_own_tables_exactly(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str], spark: Any, rest_catalog: Catalog
) -> None:
    sink, prefix, namespace = _many_table_sink(make_sink, unique_name)
    names = ["customers", "orders", "events", "products"]
    sources = {name: SampleSource(keys=80, seed=i, table=name) for i, name in enumerate(names)}
    history: dict[str, list[Any]] = {name: [] for name in [*names, "late"]}
    for name in names:
        _feed(sink.bootstrap, f"{prefix}.{name}", sources[name], 300, history[name])

    run = sink.start()
    try:
        run.wait_for_log("committed seq", timeout=180)
        # A table whose topic appears while the sink runs: no restart.
        sources["late"] = SampleSource(keys=50, seed=9, table="late")
        _feed(sink.bootstrap, f"{prefix}.late", sources["late"], 120, history["late"])
        for name in names[:3]:  # and more changes to the others meanwhile
            _feed(sink.bootstrap, f"{prefix}.{name}", sources[name], 100, history[name])
        # products' source table gains a column mid-stream.
        evolved = [_with_a_new_column(sources["products"].next_change()) for _ in range(100)]
        produce(sink.bootstrap, f"{prefix}.products", evolved)
        notes: dict[int, str | None] = {}
        for change in evolved:
            key = change.key["payload"]["id"]
            notes[key] = None if change.op == "d" else f"note-{key}"
        run.wait_for_log(f"to {namespace}.late:", timeout=180)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status = json.loads(sink.cli("status").stdout)
            if all(t["lag"] == 0 for t in status["tables"]) and len(status["tables"]) == 5:
                break
            time.sleep(2)
        else:
            raise AssertionError(f"the sink did not catch up: {status}")
    finally:
        run.kill()

    log = run.log()
    for name in ["customers", "orders", "late"]:  # position deletes: every engine reads them
        assert_rows(spark, f"{namespace}.{name}", sources[name].expected_rows(), every_reader=True)
    products = [{**row, "note": notes.get(row["id"])} for row in sources["products"].expected_rows()]
    assert_rows(spark, f"{namespace}.products", products, every_reader=True)
    assert f"evolved the schema of {namespace}.products" in log
    assert_rows(spark, f"{namespace}.events", appended_rows(history["events"]))
    orders = rest_catalog.load_table(f"{namespace}.orders")
    assert [f.name for f in orders.spec().fields] == ["country"]
    assert orders.schema().identifier_field_names() == {"id"}  # the key, from the records' keys
    for name in [*names, "late"]:
        table = f"{namespace}.{name}"
        commits = log.count(f" to {table}: snapshot ") - log.count(f" to {table}: snapshot None")
        seqs = assert_seqs_increasing(rest_catalog, table, sink.name)
        assert len(seqs) == commits, f"{table}: {commits} commit lines but {len(seqs)} snapshots"
    assert {t["table"] for t in status["tables"]} == {f"{namespace}.{n}" for n in [*names, "late"]}
    assert "topic " + f"{prefix}.late lands in table {namespace}.late" in log
