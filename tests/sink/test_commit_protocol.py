"""The commit protocol, one failure story per test, against the real txnlog and REST catalog.

Files are written in-process with the sink's own writer; Spark is not needed to tell whether a commit
landed once, twice or not at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import cast

import pyarrow as pa
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table

from readers import duckdb_connect
from service.commit.committer import Committer, find_commit
from service.commit.plan import PendingCommit, new_snapshot_id
from service.data.files import OP_COLUMN, WriteSpec, write_files
from service.iceberg.tables import KnownTables
from service.maintenance.orphans import list_files
from service.metrics import SinkMetrics, noop_metrics
from service.model.columns import column_from_config, iceberg_schema
from tests.sink.expect import assert_seqs_increasing, send_txnlog_back
from txnlog import Fenced, Phase, TransactionLog

COLUMNS = [column_from_config("id", "long", True, None), column_from_config("v", "string", False, None)]


@pytest.fixture
def log(pg_dsn: str) -> TransactionLog:
    return TransactionLog(pg_dsn, schema="icesink_protocol_tests")


def new_table(rest_catalog: Catalog, namespace: str) -> Table:
    """``<namespace>.t`` (id, v), keyed by id, in a namespace of its own."""
    rest_catalog.create_namespace(namespace)
    return rest_catalog.create_table(
        f"{namespace}.t", schema=iceberg_schema(COLUMNS, ["id"]), properties={"format-version": "2"}
    )


@pytest.fixture
def table(rest_catalog: Catalog, unique_name: Callable[[str], str]) -> Table:
    return new_table(rest_catalog, unique_name("proto"))


def pending_for(table: Table, rows: Sequence[tuple[int, str | None, str]], offset: int) -> PendingCommit:
    spec = WriteSpec(table.metadata, dict(table.io.properties), ["id"], upsert=True, delete_spec_id=0)
    batch = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "v": pa.array([r[1] for r in rows], pa.string()),
            OP_COLUMN: [r[2] for r in rows],
        }
    )
    written = write_files(spec, batch)
    return PendingCommit(
        table=".".join(table.name()),
        offsets={"t": {0: offset}},
        snapshot_id=new_snapshot_id(),
        data_files=written.data,
        delete_files=written.deletes,
    )


def committer(log: TransactionLog, catalog: Catalog, sink_id: str, owner: str) -> Committer:
    return Committer(log, log.claim(sink_id, owner), catalog, noop_metrics(), max_attempts=5)


def snapshots_of(catalog: Catalog, table: Table, sink_id: str) -> list[int]:
    return assert_seqs_increasing(catalog, ".".join(table.name()), sink_id)


def commit_failures(reader: InMemoryMetricReader) -> dict[str, int]:
    """``icesink.commit.failures`` by ``error.type``, as the reader collected it."""
    data = reader.get_metrics_data()
    points = [
        p
        for rm in (data.resource_metrics if data else [])
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "icesink.commit.failures"
        for p in m.data.data_points
        if isinstance(p, NumberDataPoint)
    ]
    return {str((p.attributes or {})["error.type"]): int(p.value) for p in points}


def test_crash_after_precommit_is_resumed_with_the_same_files(
    log: TransactionLog, rest_catalog: Catalog, table: Table, unique_name: Callable[[str], str]
) -> None:
    sink_id = unique_name("sink")
    first = committer(log, rest_catalog, sink_id, "a")
    pending = pending_for(table, [(1, "x", "c"), (2, "y", "c")], offset=2)
    log.precommit(first.lease, pending.to_payload())  # ... and the process dies here
    assert pending.snapshot_id is not None  # pending_for pre-generates it

    second = committer(log, rest_catalog, sink_id, "b")
    result = second.recover()

    assert result is not None  # a plan was pending, and recover() finished it
    landed = rest_catalog.load_table(".".join(table.name()))
    assert find_commit(landed, sink_id, pending.snapshot_id) is not None
    current = landed.current_snapshot()
    assert current is not None  # the commit find_commit found made one
    assert current.snapshot_id == pending.snapshot_id  # same pre-generated id
    assert snapshots_of(rest_catalog, table, sink_id) == [1]
    state = log.state(sink_id)
    assert state is not None and state.phase is Phase.COMMITTED
    assert (plan := second.committed()) is not None and plan.offsets == {"t": {0: 2}}


def test_lost_acknowledgement_is_not_committed_twice(
    log: TransactionLog, rest_catalog: Catalog, table: Table, unique_name: Callable[[str], str]
) -> None:
    """The Iceberg commit landed but the process died before the txnlog commit."""
    sink_id = unique_name("sink")
    first = committer(log, rest_catalog, sink_id, "a")
    pending = pending_for(table, [(1, "x", "c")], offset=1)
    state = log.precommit(first.lease, pending.to_payload())
    first._commit_to_iceberg(pending, state.seq)  # landed; the log never heard of it

    second = committer(log, rest_catalog, sink_id, "b")
    second.recover()

    assert snapshots_of(rest_catalog, table, sink_id) == [1]
    assert len(rest_catalog.load_table(".".join(table.name())).metadata.snapshots) == 1
    assert log.state(sink_id).phase is Phase.COMMITTED  # type: ignore[union-attr]


def test_a_newer_commit_of_the_sink_is_no_proof_that_a_plan_landed(
    log: TransactionLog, pg_dsn: str, rest_catalog: Catalog, table: Table, unique_name: Callable[[str], str]
) -> None:
    """The log lost its row; the table holds seqs 1 and 2 of the sink. A new plan (seq 1 again) with
    other files must land: matching "any snapshot of this sink with seq >= 1" would skip it."""
    sink_id = unique_name("sink")
    first = committer(log, rest_catalog, sink_id, "a")
    first.commit(pending_for(table, [(1, "x", "c")], offset=1))
    first.commit(pending_for(table, [(2, "y", "c")], offset=2))
    send_txnlog_back(pg_dsn, log.schema, sink_id, None)

    again = committer(log, rest_catalog, sink_id, "b")
    pending = pending_for(table, [(3, "z", "c")], offset=3)
    result = again.commit(pending)

    assert result.seq == 1
    landed = rest_catalog.load_table(".".join(table.name()))
    assert landed.current_snapshot().snapshot_id == pending.snapshot_id  # type: ignore[union-attr]
    assert len(landed.metadata.snapshots) == 3


def test_zombie_writer_is_fenced_and_writes_nothing(
    log: TransactionLog, rest_catalog: Catalog, table: Table, unique_name: Callable[[str], str]
) -> None:
    sink_id = unique_name("sink")
    zombie = committer(log, rest_catalog, sink_id, "old")
    zombie.commit(pending_for(table, [(1, "x", "c")], offset=1))
    successor = committer(log, rest_catalog, sink_id, "new")  # fences the zombie
    successor.recover()

    with pytest.raises(Fenced) as raised:
        zombie.commit(pending_for(table, [(1, "zombie", "u")], offset=2))
    assert raised.value.current_epoch == successor.lease.epoch
    assert snapshots_of(rest_catalog, table, sink_id) == [1]

    successor.commit(pending_for(table, [(1, "fresh", "u")], offset=2))
    assert snapshots_of(rest_catalog, table, sink_id) == [1, 2]  # the fenced attempt took no seq


def test_concurrent_writer_conflict_is_retried_without_loss(
    log: TransactionLog,
    rest_catalog: Catalog,
    table: Table,
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another writer commits between the sink's load of the table and its commit: the catalog
    rejects the snapshot built on the old parent, and it is rebuilt on the new one."""
    sink_id = unique_name("sink")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    known = KnownTables()  # the table as the sink loaded it: its first attempt builds on this
    name = ".".join(table.name())
    known.put(name, rest_catalog.load_table(name), loaded=True)
    ours = Committer(
        log,
        log.claim(sink_id, "a"),
        rest_catalog,
        SinkMetrics(provider.get_meter("icesink"), sink_id, name),
        max_attempts=5,
        known=known,
    )
    pending = pending_for(table, [(1, "ours", "c")], offset=1)
    theirs = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    rest_catalog.load_table(name).append(pa.table({"id": [99], "v": ["theirs"]}, schema=theirs))

    caplog.set_level(logging.WARNING, logger="service.commit.committer")
    ours.commit(pending)
    failures = commit_failures(reader)
    provider.shutdown()

    # The conflict happened: one attempt rejected and counted as a conflict, then the retry landed.
    assert failures == {"conflict": 1}, caplog.text
    conflicted = [r.getMessage() for r in caplog.records if "conflicted (attempt 1/5)" in r.getMessage()]
    assert len(conflicted) == 1 and name in conflicted[0], caplog.text

    final = rest_catalog.load_table(name)
    assert len(final.metadata.snapshots) == 2
    current = final.current_snapshot()
    assert current is not None and current.snapshot_id == pending.snapshot_id
    assert current.parent_snapshot_id is not None  # theirs, under ours
    assert final.metadata.snapshot_by_id(current.parent_snapshot_id) is not None
    assert snapshots_of(rest_catalog, table, sink_id) == [1]
    con = duckdb_connect()
    rows = con.execute(f"SELECT id, v FROM iceberg_scan('{final.metadata_location}') ORDER BY id").fetchall()
    assert rows == [(1, "ours"), (99, "theirs")]
    # The rejected attempt's manifest list and manifests were deleted: every Avro file under the
    # table's metadata is one a snapshot names.
    named = {s.manifest_list for s in final.metadata.snapshots} | {
        m.manifest_path for s in final.metadata.snapshots for m in s.manifests(final.io)
    }
    listed = {f.path for f in list_files(final.io, final.metadata.location.rstrip("/") + "/metadata")}
    assert {p for p in listed if p.endswith(".avro")} == named


def test_merged_manifests_keep_each_file_s_sequence_number(
    log: TransactionLog, rest_catalog: Catalog, unique_name: Callable[[str], str]
) -> None:
    """The sink merges a table's small data manifests at every commit. An equality delete applies
    to rows of lower data sequence numbers only, so an entry carried into a merged manifest must keep
    the number of the commit that added it: renumbered, key 2's first row would outlive its update."""
    table = new_table(rest_catalog, unique_name("merge"))
    sink_id = unique_name("sink")
    c = committer(log, rest_catalog, sink_id, "a")
    commits: list[list[tuple[int, str | None, str]]] = [
        [(1, "a", "c"), (2, "b", "c")],
        [(1, "a2", "u")],
        [(2, "b2", "u"), (3, "c", "c")],
        [(1, None, "d")],
    ]
    for offset, rows in enumerate(commits, start=1):
        c.commit(pending_for(table, rows, offset=offset))

    final = rest_catalog.load_table(".".join(table.name()))
    snapshot = final.current_snapshot()
    assert snapshot is not None
    manifests = snapshot.manifests(final.io)
    # One data manifest of the three data files; the four delete files each in its own (see
    # RowDelta.manifests for why those are never merged).
    assert sorted(m.content for m in manifests) == [ManifestContent.DATA] + [ManifestContent.DELETES] * 4
    sequence_of = {s.snapshot_id: s.sequence_number for s in final.metadata.snapshots}
    for manifest in manifests:
        entries = manifest.fetch_manifest_entry(final.io)
        assert len(entries) == (3 if manifest.content == ManifestContent.DATA else 1)
        for entry in entries:
            # cast: a fetched entry inherits its manifest's snapshot id when it has none of its own
            assert entry.sequence_number == sequence_of[cast(int, entry.snapshot_id)], (
                entry.data_file.file_path
            )
    con = duckdb_connect()
    rows = con.execute(f"SELECT id, v FROM iceberg_scan('{final.metadata_location}') ORDER BY id").fetchall()
    assert rows == [(2, "b2"), (3, "c")]


def test_empty_batch_moves_offsets_without_a_snapshot(
    log: TransactionLog, rest_catalog: Catalog, table: Table, unique_name: Callable[[str], str]
) -> None:
    """A batch of dead letters only (or of tombstones in append mode): offsets advance, no snapshot."""
    sink_id = unique_name("sink")
    c = committer(log, rest_catalog, sink_id, "a")
    c.commit(PendingCommit(table=".".join(table.name()), offsets={"t": {0: 5}}, snapshot_id=None))
    assert (plan := c.committed()) is not None and plan.offsets == {"t": {0: 5}}
    assert rest_catalog.load_table(".".join(table.name())).metadata.snapshots == []


def test_one_batch_writes_distinct_files_with_true_sizes(table: Table) -> None:
    """Data and delete files of one batch never share a path (one once overwrote the other)."""
    pending = pending_for(table, [(1, "x", "c"), (2, None, "d"), (3, "z", "u")], offset=3)
    files = pending.data_files + pending.delete_files
    assert len(pending.data_files) == 1 and len(pending.delete_files) == 1
    assert len({f.file_path for f in files}) == len(files)
    for f in files:
        assert f.file_size_in_bytes == len(table.io.new_input(f.file_path)), f.file_path
    assert pending.delete_files[0].record_count == 3 and pending.data_files[0].record_count == 2
