"""Partition spec changes made by another engine while the table holds the sink's rows."""

from __future__ import annotations

from typing import Any

from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table

from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows
from tests.sink.test_end_to_end import _catalog


def _live_specs(table: Table, content: ManifestContent) -> set[int]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {
        m.partition_spec_id
        for m in snapshot.manifests(table.io)
        if m.content == content and (m.added_files_count or 0) + (m.existing_files_count or 0) > 0
    }


def test_updates_after_a_partition_field_is_added_delete_the_old_rows(make_sink: Any, spark: Any) -> None:
    """Rows land unpartitioned; Spark adds a partition field on the key (bucket(4, id)); updates of
    those rows must still delete them, though a delete scoped to the new spec would not reach them."""
    sink: Sink = make_sink(partitions=1, keys=40)
    sink.produce(120, mix=(1.0, 0.0, 0.0))
    sink.run_until_caught_up()
    catalog = _catalog(sink)
    assert catalog.load_table(sink.table).spec().is_unpartitioned()

    spark.sql(f"ALTER TABLE rest.{sink.table} ADD PARTITION FIELD bucket(4, id)")
    table = catalog.load_table(sink.table)
    # The fault's setting: the default spec partitions by the key only, but every live data file is
    # in the unpartitioned spec.
    assert [str(f.transform) for f in table.spec().fields] == ["bucket[4]"], table.spec()
    assert _live_specs(table, ManifestContent.DATA) == {0} != {table.spec().spec_id}
    old_keys = set(sink.source.rows)

    updates = sink.produce(150, mix=(0.0, 0.9, 0.1))
    assert {c.key["payload"]["id"] for c in updates} & old_keys
    sink.run_until_caught_up()

    assert_rows(spark, sink.table, sink.source.expected_rows())
    table = catalog.load_table(sink.table)
    assert _live_specs(table, ManifestContent.DATA) == {0, table.spec().spec_id}  # new rows: new spec
    assert _live_specs(table, ManifestContent.DELETES) == {0}  # deletes reach every spec's files
