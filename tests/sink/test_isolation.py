"""One table's failure does not stall the others (``table.on_failure: dead_letter`` or ``pause``).

A sink of three tables; one table's events change a column's type incompatibly (string → int32)
while the sink runs. That table is isolated: its records go to the dead-letter topic with the reason,
and the two others keep landing exactly, in the same running process.
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
from tests.sink.expect import assert_rows, topic_records

NAMES = ["customers", "orders", "products"]


def _name_becomes_an_int(change: Change) -> Change:
    """The same change with its ``name`` column an int32: not an evolution Iceberg allows."""
    value = copy.deepcopy(change.value)
    for part in value["schema"]["fields"]:
        for field in part.get("fields", []):
            if field["field"] == "name":
                field["type"] = "int32"
    for side in ("before", "after"):
        if value["payload"].get(side):
            value["payload"][side]["name"] = 7
    return Change(key=change.key, value=value, op=change.op, row=None)


def _landed(catalog: Catalog, table: str) -> int:
    snapshot = catalog.load_table(table).current_snapshot() if catalog.table_exists(table) else None
    # cast: a format-version 2 snapshot has a summary
    return (
        int(cast(Summary, snapshot.summary).additional_properties.get("total-records", -1))
        if snapshot
        else -1
    )


def _three_tables(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str], on_failure: str
) -> tuple[Sink, str, dict[str, str], dict[str, SampleSource]]:
    """A sink of the three tables, 100 changes in each topic already: (sink, namespace, topics, sources)."""
    prefix, namespace = unique_name("db"), unique_name("lake")
    topics = {name: f"{prefix}.{name}" for name in NAMES}
    sink = make_sink(
        kafka={"topics": list(topics.values())},
        table={"identifier": f"{namespace}.{{source.table}}", "key": [], "on_failure": on_failure},
    )
    sources = {name: SampleSource(keys=50, seed=i, table=name) for i, name in enumerate(NAMES)}
    for name in NAMES:
        ensure_topic(sink.bootstrap, topics[name], 2)
        produce(sink.bootstrap, topics[name], [sources[name].next_change() for _ in range(100)])
    return sink, namespace, topics, sources


def _products_turn_incompatible(sink: Sink, topics: dict[str, str], sources: dict[str, SampleSource]) -> None:
    """products' source table changes a column's type (20 changes); the other tables go on changing."""
    bad = [_name_becomes_an_int(sources["products"].next_change()) for _ in range(20)]
    produce(sink.bootstrap, topics["products"], bad)
    for name in ["customers", "orders"]:
        produce(sink.bootstrap, topics[name], [sources[name].next_change() for _ in range(100)])


def test_a_table_with_an_incompatible_schema_is_isolated_while_the_others_land(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str], spark: Any, rest_catalog: Catalog
) -> None:
    sink, namespace, topics, sources = _three_tables(make_sink, unique_name, "dead_letter")
    landed_before = {name: sources[name].expected_rows() for name in NAMES}

    run = sink.start()
    try:
        run.wait_for_log(f"to {namespace}.products: snapshot", timeout=180)
        _products_turn_incompatible(sink, topics, sources)
        run.wait_for_log(f"table {namespace}.products isolated", timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status = json.loads(sink.cli("status").stdout)
            if all(t["lag"] == 0 for t in status["tables"]):
                break
            time.sleep(2)
        else:
            raise AssertionError(f"the sink did not catch up: {status}")
        assert run.process.poll() is None, "the sink stopped: the isolated table stalled the others"
    finally:
        run.kill()

    log = run.log()
    assert "IncompatibleSchema" in log.split(f"table {namespace}.products isolated", 1)[1].splitlines()[0]
    for name in ["customers", "orders"]:
        assert_rows(spark, f"{namespace}.{name}", sources[name].expected_rows())
    assert_rows(spark, f"{namespace}.products", landed_before["products"])  # as before the change
    letters = topic_records(
        sink.bootstrap, sink.config["kafka"].get("dead_letter_topic") or f"{sink.name}.dlq", 20
    )
    assert len(letters) == 20
    headers = [dict(m.headers() or []) for m in letters]
    assert all(
        h["icesink.error"].decode().startswith(f"table {namespace}.products isolated: IncompatibleSchema")
        for h in headers
    )
    assert {h["icesink.source.topic"].decode() for h in headers} == {topics["products"]}


def test_a_paused_table_keeps_its_records_in_kafka_until_the_sink_restarts(
    make_sink: Callable[..., Sink], unique_name: Callable[[str], str], spark: Any, rest_catalog: Catalog
) -> None:
    """``on_failure: pause``: the failing table's records are neither written nor dead-lettered, its
    topic's committed offsets stay behind while the others land; restarted with the table fixed (here:
    its incompatible events sent to the dead-letter topic instead), the sink reads them again."""
    sink, namespace, topics, sources = _three_tables(make_sink, unique_name, "pause")
    landed_before = sources["products"].expected_rows()
    products = f"{namespace}.products"

    run = sink.start()
    try:
        run.wait_for_log(f"to {products}: snapshot", timeout=180)
        _products_turn_incompatible(sink, topics, sources)
        run.wait_for_log(f"table {products} paused", timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status = {t["table"]: t for t in json.loads(sink.cli("status").stdout)["tables"]}
            if all(status[f"{namespace}.{n}"]["lag"] == 0 for n in ["customers", "orders"]):
                break
            time.sleep(2)
        else:
            raise AssertionError(f"the other tables did not catch up: {status}")
        assert run.process.poll() is None, "the sink stopped: the paused table stalled the others"
        assert status[products]["lag"] == 20  # the paused table's records wait in Kafka
    finally:
        run.kill()
    log = run.log()
    assert "IncompatibleSchema" in log.split(f"table {products} paused", 1)[1].splitlines()[0]
    assert "dead-letter topic" not in log.split(f"table {products} paused", 1)[1].split("\n", 1)[1]
    for name in ["customers", "orders"]:
        assert_rows(spark, f"{namespace}.{name}", sources[name].expected_rows())
    assert_rows(spark, products, landed_before)

    # The operator's fix: this table's incompatible events go to the dead-letter topic.
    sink.config["tables"] = {products: {"on_incompatible_schema": "dead_letter"}}
    sink.run_until_caught_up()
    letters = topic_records(
        sink.bootstrap, sink.config["kafka"].get("dead_letter_topic") or f"{sink.name}.dlq", 20
    )
    assert len(letters) == 20  # read again from the paused table's offsets: none was skipped
    assert {dict(m.headers() or [])["icesink.source.topic"].decode() for m in letters} == {topics["products"]}
    for name in ["customers", "orders"]:
        assert_rows(spark, f"{namespace}.{name}", sources[name].expected_rows())
    assert_rows(spark, products, landed_before)
