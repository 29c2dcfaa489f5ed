"""Random CDC workloads through the real sink, checked by Spark and DuckDB against a model of the source."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.manifest import ManifestContent

from readers import duckdb_connect
from service.sample import table_columns
from tests.sink.conftest import Sink
from tests.sink.expect import appended_rows, assert_rows, assert_seqs_increasing, diff, sink_snapshots


def _catalog(sink: Sink) -> Catalog:
    props = {k: v for k, v in sink.config["catalog"].items() if k != "name"}
    resolved = {k: os.path.expandvars(v) for k, v in props.items()}
    return load_catalog(sink.config["catalog"].get("name", "default"), **resolved)


@pytest.mark.parametrize("decoder", ["auto", "spark"])
def test_upsert_partitioned_by_non_key_column(make_sink: Any, spark: Any, decoder: str) -> None:
    """Rows move between partitions (country changes on update) and deleted keys come back.

    Two runs with more changes in between: the second run resumes from the committed offsets.
    Events with schema sections, through each decoder (auto: the Arrow path).
    """
    sink: Sink = make_sink(partition_by=["country"], keys=200, source={"decoder": decoder})
    sink.produce(1500)
    first = sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())
    assert f"{'arrow' if decoder == 'auto' else 'spark'} decoder" in first.log()

    sink.produce(800)
    sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())
    assert_seqs_increasing(_catalog(sink), sink.table, sink.name)

    status = json.loads(sink.cli("status").stdout)
    assert status["phase"] == "committed"
    assert sum(status["committed_offsets"][sink.topic].values()) == len(sink.history)
    summaries = sink_snapshots(_catalog(sink), sink.table, sink.name)
    assert json.loads(summaries[-1]["icesink.offsets"]) == status["committed_offsets"]


def test_append_mode_keeps_every_insert_and_update(make_sink: Any, spark: Any) -> None:
    sink: Sink = make_sink(mode="append", keys=100)
    sink.produce(600)
    sink.run_until_caught_up()
    assert_rows(spark, sink.table, appended_rows(sink.history))


def test_sql_catalog_local_warehouse_bucketed_without_schema_section(
    make_sink: Any, spark: Any, stack: Any, tmp_path: Any
) -> None:
    """SQL catalog on Postgres, files on the local disk, events without a schema section.

    The table is bucketed by the key, so equality deletes are scoped to partitions.
    """
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    sink: Sink = make_sink(
        table={"delete_format": "equality"},
        partition_by=["bucket(4, id)"],
        with_schema=False,
        columns=table_columns(),
        catalog={
            "name": "sql",
            "type": "sql",
            "uri": stack.pg_dsn,
            "warehouse": f"file://{warehouse}",
        },
    )
    sink.produce(900)
    sink.run_until_caught_up()
    catalog = _catalog(sink)
    table = catalog.load_table(sink.table)
    expected = sink.source.expected_rows()
    # Spark reads the SQL catalog's table through its metadata file; DuckDB through iceberg_scan.
    rows = [r.asDict() for r in spark.read.format("iceberg").load(table.metadata_location).collect()]
    assert not diff(expected, rows, "spark"), diff(expected, rows, "spark")
    con = duckdb_connect()
    cursor = con.execute(f"SELECT * FROM iceberg_scan('{table.metadata_location}')")
    names = [d[0] for d in cursor.description or []]
    duck = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
    assert not diff(expected, duck, "duckdb"), diff(expected, duck, "duckdb")
    # Bucketed by the key: a key never changes bucket, so deletes are scoped to the table's spec.
    snapshot = table.current_snapshot()
    assert snapshot is not None
    delete_specs = {
        m.partition_spec_id for m in snapshot.manifests(table.io) if m.content == ManifestContent.DELETES
    }
    assert delete_specs == {table.spec().spec_id}


def test_time_and_truncate_transforms(make_sink: Any, spark: Any) -> None:
    """month/day/hour/truncate partitions on non-key columns: rows move between partitions on update."""
    sink: Sink = make_sink(partition_by=["month(birthday)", "truncate(3, name)"], keys=60)
    sink.produce(400)
    sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())
    table = _catalog(sink).load_table(sink.table)
    assert [f.transform.__class__.__name__ for f in table.spec().fields] == [
        "MonthTransform",
        "TruncateTransform",
    ]
