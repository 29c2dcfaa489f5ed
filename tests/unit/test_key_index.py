"""The key index and position deletes on a local table (pyiceberg's SQL catalog on SQLite, files on
the local disk): batches resolved against the index read back exactly through pyiceberg's own scan,
and an index built from the table agrees with one kept batch by batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from service.commit.plan import new_snapshot_id
from service.data.files import OP_COLUMN, WriteSpec, writable, write_files
from service.data.position_deletes import FILE_PATH_ID, read_columns
from service.iceberg.row_delta import RowDelta
from service.keyindex.build import current, live_files
from service.keyindex.index import KeyIndex
from service.keyindex.merge import MAX_FILES, live_position_deletes, merge_deletes, pick
from service.keyindex.resolve import resolve

Row = tuple[int, str | None, str | None, str]  # id, name, country, op


class Sink:
    """Batches into a table partitioned by a non-key column, the way the commit step resolves them."""

    def __init__(self, tmp_path: Path) -> None:
        catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
        catalog.create_namespace("ns")
        schema = Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "name", StringType()),
            NestedField(3, "country", StringType()),
            identifier_field_ids=[1],
        )
        spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "country"))
        self.table: Table = catalog.create_table("ns.t", schema, partition_spec=spec)
        self.index: KeyIndex | None = None
        self.model: dict[int, dict[str, Any]] = {}
        self.merges = 0

    def batch(self, rows: list[Row]) -> None:
        columns = list(zip(*rows, strict=True))
        arrow = pa.table(
            {
                "id": pa.array(columns[0], pa.int64()),
                "name": pa.array(columns[1], pa.string()),
                "country": pa.array(columns[2], pa.string()),
                OP_COLUMN: pa.array(columns[3], pa.string()),
            }
        )
        spec = WriteSpec(
            metadata=writable(self.table.metadata),
            io_properties=dict(self.table.io.properties),
            key=["id"],
            upsert=True,
            delete_spec_id=None,
            delete_format="position",
        )
        written = write_files(spec, arrow)
        assert written.located is not None and not written.deletes
        self.index = current(self.index, self.table, "ns.t", ["id"])
        resolved = resolve(self.index, self.table, written.data, written.located)
        snapshot_id = new_snapshot_id()
        merge = merge_deletes(self.table, resolved.delete_files)  # as the committer's attempts do
        self.merges += bool(merge.remove or merge.merged_away)
        self.table = RowDelta(
            self.table, snapshot_id, written.data, merge.add, {}, removed_deletes=merge.remove
        ).commit()
        self.index.ahead.add(snapshot_id)
        for key, name, country, op in rows:
            if op == "d":
                self.model.pop(key, None)
            else:
                self.model[key] = {"id": key, "name": name, "country": country}

    def rows(self) -> list[dict[str, Any]]:
        return sorted(self.table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])

    def expected(self) -> list[dict[str, Any]]:
        return [self.model[k] for k in sorted(self.model)]


def _places(index: KeyIndex) -> dict[Any, tuple[str, int]]:
    return {k: (index.files[v >> 32].path, v & 0xFFFFFFFF) for k, v in index.rows.items()}


@pytest.fixture
def sink(tmp_path: Path) -> Sink:
    return Sink(tmp_path)


def test_updates_moving_rows_between_partitions_read_exactly(sink: Sink) -> None:
    sink.batch([(1, "a", "us", "c"), (2, "b", "fr", "c"), (3, "c", "us", "c")])
    sink.batch([(1, "a2", "fr", "u"), (2, None, None, "d"), (4, "d", "us", "c")])
    sink.batch([(2, "b3", "us", "c"), (1, "a3", "us", "u"), (3, "c3", "us", "u")])
    assert sink.rows() == sink.expected()


def test_delete_files_sit_in_the_partition_of_the_rows_they_delete(sink: Sink) -> None:
    sink.batch([(1, "a", "us", "c"), (2, "b", "fr", "c")])
    sink.batch([(1, "a2", "fr", "u"), (2, "b2", "fr", "u")])
    live = live_files(sink.table)
    data = {f.file_path: f for f, _ in live.data}
    deletes = [f for f, _ in live.position_deletes]
    assert len(deletes) == 2 and not live.equality_deletes  # one per partition of the old rows
    for f in deletes:
        assert f.content == DataFileContent.POSITION_DELETES
        named = read_columns(sink.table.io, f.file_path, ["file_path"])["file_path"].to_pylist()
        assert f.lower_bounds[FILE_PATH_ID].decode() == min(named)
        assert f.upper_bounds[FILE_PATH_ID].decode() == max(named)
        assert {(data[p].spec_id, data[p].partition) for p in named} == {(f.spec_id, f.partition)}


def test_a_key_written_and_changed_in_one_batch_needs_no_delete(sink: Sink) -> None:
    sink.batch([(1, "a", "us", "c")])
    sink.batch([(2, "b", "us", "c")])  # a new key: no earlier row to delete
    assert not live_files(sink.table).position_deletes


def test_an_index_built_from_the_table_agrees_with_the_one_kept_batch_by_batch(sink: Sink) -> None:
    sink.batch([(k, f"n{k}", "us" if k % 2 else "fr", "c") for k in range(50)])
    sink.batch([(k, f"m{k}", "fr" if k % 3 else "us", "u") for k in range(0, 50, 2)])
    sink.batch([(k, None, None, "d") for k in range(0, 50, 5)])
    assert sink.index is not None
    built = current(None, sink.table, "ns.t", ["id"])
    assert _places(built) == _places(sink.index)
    assert sorted(built.rows) == sorted(sink.model)


def test_uuid_and_widened_keys_build_an_index(tmp_path: Path) -> None:
    """A UUID key (pyarrow's uuid extension type) and a key column widened from int to long between
    two files: both are indexed as the batches that wrote them said (the keys compare equal)."""
    import uuid as uuid_module

    from pyiceberg.types import IntegerType, UUIDType

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    ids = [uuid_module.uuid4() for _ in range(3)]
    table = catalog.create_table(
        "ns.u",
        Schema(
            NestedField(1, "id", UUIDType(), required=False),
            NestedField(2, "n", IntegerType(), required=False),
        ),
    )
    table.append(
        pa.table({"id": pa.array([u.bytes for u in ids], pa.uuid()), "n": pa.array([1, 2, 3], pa.int32())})
    )
    built = current(None, catalog.load_table("ns.u"), "ns.u", ["id"])
    assert sorted(built.rows) == sorted(u.bytes for u in ids)

    widened = catalog.create_table("ns.w", Schema(NestedField(1, "id", IntegerType(), required=False)))
    widened.append(pa.table({"id": pa.array([1, 2], pa.int32())}, schema=widened.schema().as_arrow()))
    with widened.update_schema() as update:
        update.update_column("id", LongType())
    widened = catalog.load_table("ns.w")
    widened.append(pa.table({"id": pa.array([3], pa.int64())}, schema=widened.schema().as_arrow()))
    assert sorted(current(None, catalog.load_table("ns.w"), "ns.w", ["id"]).rows) == [1, 2, 3]


def test_delete_files_piling_up_in_a_partition_are_merged(sink: Sink) -> None:
    """Thirty batches, each updating keys of both partitions: each partition keeps at most MAX_FILES
    position-delete files, the removed ones are recorded as deleted in the commit that merged them,
    and the table reads exactly, through pyiceberg and through an index built from it."""
    sink.batch([(k, f"n{k}", "us" if k % 2 else "fr", "c") for k in range(40)])
    for i in range(30):
        sink.batch([(k, f"v{i}-{k}", "us" if (k + i) % 2 else "fr", "u") for k in range(i % 7, 40, 3)])
        live = live_position_deletes(sink.table)
        assert all(len(files) <= MAX_FILES for files in live.values()), {k: len(v) for k, v in live.items()}
    assert sink.merges >= 4, f"{sink.merges} merges in 30 batches"
    assert sink.rows() == sink.expected()
    removed = [
        s
        for s in sink.table.snapshots()
        if s.summary is not None and int(s.summary.get("removed-delete-files") or 0) > 0
    ]
    assert removed, "no snapshot records the delete files it merged away"
    assert sink.index is not None
    assert _places(current(None, sink.table, "ns.t", ["id"])) == _places(sink.index)


def test_merging_rewrites_each_position_a_few_times_only() -> None:
    """A thousand commits of one small delete file each, in one partition: at most MAX_FILES stay
    live, and the rows merges rewrite stay within log2 of the total per row (a merge of all but the
    largest files would rewrite most rows at every merge: quadratic)."""
    from types import SimpleNamespace

    live: list[Any] = []
    rewritten = total = 0
    for i in range(1000):
        new = SimpleNamespace(record_count=10, file_path=f"d{i}")
        total += 10
        files = [*live, new]
        picked = pick(files, len(files))
        if picked:
            merged = sum(f.record_count for f in picked)
            rewritten += merged
            files = [f for f in files if f not in picked] + [
                SimpleNamespace(record_count=merged, file_path=f"m{i}")
            ]
        assert len(files) <= MAX_FILES
        live = files
    assert sum(f.record_count for f in live) == total
    assert rewritten <= total * 11, f"{rewritten} rows rewritten for {total}"  # log2(1000) ~ 10
