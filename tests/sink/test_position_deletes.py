"""``table.delete_format: position``: position deletes from the sink's key index, read by every engine.

Each test is one story: rows moving between partitions read exactly by Spark, DuckDB, Trino and
pyiceberg; pyiceberg refusing an equality-delete table; a compaction that moves the rows a
precommitted plan deletes, before the plan lands; a compaction the running sink's index follows; a
commit that waits its turn while its table is compacted; many commits that keep few delete files.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from readers import pyiceberg_rows
from service.commit.plan import PendingCommit
from service.commit.turns import lock_name
from service.data.position_deletes import FILE_PATH_ID, read_columns
from service.failpoints import KILL_EXIT_CODE
from service.keyindex.build import live_files
from service.keyindex.merge import MAX_FILES, live_position_deletes
from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows, diff
from txnlog import Phase, TransactionLog

POSITION = {"delete_format": "position"}


def _catalog(sink: Sink) -> Any:
    props = {k: os.path.expandvars(v) for k, v in sink.config["catalog"].items() if k != "name"}
    return load_catalog(sink.config["catalog"].get("name", "default"), **props)


def _deletes(table: Table) -> dict[DataFileContent, list[Any]]:
    live = live_files(table)
    return {
        DataFileContent.POSITION_DELETES: [f for f, _ in live.position_deletes],
        DataFileContent.EQUALITY_DELETES: [f for f, _ in live.equality_deletes],
    }


def _wait_until_pyiceberg_reads_exactly(sink: Sink, timeout: float = 120) -> None:
    """While the sink runs: until pyiceberg reads the rows the source holds (or fail with the diff)."""
    deadline = time.monotonic() + timeout
    while (problem := diff(sink.source.expected_rows(), pyiceberg_rows(sink.table), "pyiceberg")) and (
        time.monotonic() < deadline
    ):
        time.sleep(2)
    assert not problem, problem


def test_rows_moving_between_partitions_read_exactly_by_every_engine(
    make_sink: Any, spark: SparkSession
) -> None:
    """Updates move keys between partitions (country) and deleted keys come back; two runs, the
    second building its key index from the table. Spark, DuckDB, Trino and pyiceberg read the same
    rows, and the table holds position deletes only, each in its data file's partition with the full
    path as its bounds."""
    sink: Sink = make_sink(partition_by=["country"], keys=200, table=POSITION)
    sink.produce(1500)
    sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows(), every_reader=True)

    sink.produce(800)
    second = sink.run_until_caught_up()
    assert "key index of" in second.log() and "keys from" in second.log()
    assert_rows(spark, sink.table, sink.source.expected_rows(), every_reader=True)

    table = _catalog(sink).load_table(sink.table)
    deletes = _deletes(table)
    assert deletes[DataFileContent.EQUALITY_DELETES] == []
    assert deletes[DataFileContent.POSITION_DELETES], (
        "updates of earlier batches' keys wrote no position delete"
    )
    data = {f.file_path: f for f, _ in live_files(table).data}
    for f in deletes[DataFileContent.POSITION_DELETES]:
        lower, upper = f.lower_bounds[FILE_PATH_ID].decode(), f.upper_bounds[FILE_PATH_ID].decode()
        assert lower <= upper and lower.endswith(".parquet") and upper.endswith(".parquet")
        named = [d for path, d in data.items() if lower <= path <= upper]
        assert named and all(d.partition == f.partition and d.spec_id == f.spec_id for d in named)


def test_pyiceberg_refuses_a_table_with_equality_deletes(make_sink: Any) -> None:
    """The reason ``position`` exists: the same stream in ``equality`` mode can't be read by pyiceberg."""
    sink: Sink = make_sink(keys=50, table={"delete_format": "equality"})
    sink.produce(200)
    sink.run_until_caught_up()
    assert _deletes(_catalog(sink).load_table(sink.table))[DataFileContent.EQUALITY_DELETES]
    with pytest.raises(ValueError, match="equality deletes"):
        pyiceberg_rows(sink.table)


def test_compaction_before_a_precommitted_plan_lands_resolves_its_deletes_again(
    make_sink: Any, spark: SparkSession, pg_dsn: str
) -> None:
    """A batch's deletes name rows of the first run's files; the sink dies right after the precommit;
    a compaction replaces those files; the restarted sink finishes the plan: its deletes must name
    the rows where the compaction put them, or the old rows would live on beside the new ones."""
    sink: Sink = make_sink(keys=100, partitions=1, table=POSITION)
    sink.produce(400)
    sink.run_until_caught_up()
    sink.produce(300)
    killed = sink.start(env={"ICESINK_FAILPOINTS": "after_precommit=kill"})
    assert killed.wait() == KILL_EXIT_CODE, killed.log()[-4000:]

    log = TransactionLog(pg_dsn, schema=sink.config["txnlog"].get("schema", "icesink"))
    state = log.state(sink.name)
    assert state is not None and state.phase is Phase.PRECOMMIT and state.pending is not None
    plan = PendingCommit.from_payload(state.pending)
    assert plan.delete_files and plan.position_keys, "the precommitted batch deleted no earlier row"
    catalog = _catalog(sink)
    before = {f.file_path for f, _ in live_files(catalog.load_table(sink.table)).data}

    spark.sql(
        f"CALL rest.system.rewrite_data_files(table => '{sink.table}', options => map('rewrite-all', 'true'))"
    )
    after = {f.file_path for f, _ in live_files(catalog.load_table(sink.table)).data}
    # The fault: the files the plan's deletes name are gone from the table.
    io = catalog.load_table(sink.table).io
    named = {
        p
        for f in plan.delete_files
        for p in read_columns(io, f.file_path, ["file_path"])["file_path"].to_pylist()
    }
    assert named and named <= before and not (named & after)

    resumed = sink.run_until_caught_up()
    assert "moved by another commit since snapshot" in resumed.log(), resumed.log()[-4000:]
    assert_rows(spark, sink.table, sink.source.expected_rows(), every_reader=True)


def test_running_sink_follows_a_compaction(make_sink: Any, spark: SparkSession) -> None:
    """A compaction commits while the sink runs: the next batch's index follows it (no rebuild) and
    the batch deletes the rows where the compaction put them. (A batch resolved before the compaction
    and committed after it: test_a_commit_waits_its_turn_while_its_table_is_compacted.)"""
    sink: Sink = make_sink(keys=100, partitions=1, table=POSITION)
    sink.produce(400)
    run = sink.start()
    try:
        run.wait_for_log("committed seq", timeout=180)
        spark.sql(
            f"CALL rest.system.rewrite_data_files(table => '{sink.table}', options => map('rewrite-all', 'true'))"
        )
        sink.produce(300)
        run.wait_for_log("followed snapshot", timeout=180)
        sink.produce(100)
        _wait_until_pyiceberg_reads_exactly(sink)
    finally:
        run.kill()
    assert "building again" not in run.log()
    assert_rows(spark, sink.table, sink.source.expected_rows(), every_reader=True)


def test_a_commit_waits_its_turn_while_its_table_is_compacted(
    make_sink: Any, spark: SparkSession, pg_dsn: str
) -> None:
    """A compaction holds the table's turn (as ``icesink maintain`` does) and rewrites every file
    while the sink has updates of those rows to commit: the sink's commit waits instead of adding
    position deletes the rewrite's validation would refuse; the rewrite lands, then the commit, its
    deletes resolved again against the compacted files."""
    sink: Sink = make_sink(keys=100, partitions=1, table=POSITION)
    sink.produce(400)
    run = sink.start()
    log = TransactionLog(pg_dsn, schema=sink.config["txnlog"].get("schema", "icesink"))
    try:
        run.wait_for_log("committed seq", timeout=180)
        catalog = _catalog(sink)
        with log.named_locks(
            [lock_name(sink.name, sink.table)], shared=False, wait=timedelta(seconds=30)
        ) as taken:
            assert taken
            held_at = catalog.load_table(sink.table).current_snapshot()
            sink.produce(300)

            def waiting() -> bool:  # the sink's commit is queued behind the compaction's turn
                with psycopg.connect(pg_dsn.replace("postgresql+psycopg://", "postgresql://")) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                        "AND (classid::bigint << 32 | objid::bigint) = hashtextextended(%s, 0)",
                        (lock_name(sink.name, sink.table),),
                    ).fetchone()
                return bool(row and row[0])

            deadline = time.monotonic() + 180
            while not waiting():
                assert time.monotonic() < deadline, "the sink never waited for the compaction's turn"
                time.sleep(0.5)
            rows = spark.sql(
                f"CALL rest.system.rewrite_data_files(table => '{sink.table}', "
                "options => map('rewrite-all', 'true'))"
            ).collect()
            assert rows[0]["rewritten_data_files_count"] > 0
            compacted = catalog.load_table(sink.table).current_snapshot()
            assert compacted is not None and held_at is not None
            assert compacted.parent_snapshot_id == held_at.snapshot_id, "the sink committed while it waited"
            time.sleep(2)  # the wait outlasts the threshold at which the sink logs it
        run.wait_for_log("for a compaction (icesink maintain) to finish", timeout=60)
        run.wait_for_log("moved by another commit since snapshot", timeout=180)
        _wait_until_pyiceberg_reads_exactly(sink)
    finally:
        run.kill()
        log.close()
    assert_rows(spark, sink.table, sink.source.expected_rows(), every_reader=True)


def test_many_commits_keep_few_delete_files(make_sink: Any, spark: SparkSession) -> None:
    """Every batch updates rows of earlier ones, one commit each: the partition's position-delete files
    are merged as they pile up, so the table holds at most MAX_FILES of them (and about as many delete
    manifests) after any number of commits, and every engine reads the rows exactly."""
    sink: Sink = make_sink(keys=60, partitions=1, kafka={"max_offsets_per_trigger": 40}, table=POSITION)
    sink.produce(800)
    run = sink.run_until_caught_up()
    assert "merged into one" in run.log(), "no merge: the batches never piled up delete files"
    table = _catalog(sink).load_table(sink.table)
    commits = [
        s for s in table.snapshots() if s.summary is not None and s.summary.get("total-position-deletes")
    ]
    live = live_position_deletes(table)
    assert len(commits) > 2 * MAX_FILES, f"{len(commits)} commits with deletes: too few to need merging"
    assert live and all(len(files) <= MAX_FILES for files in live.values()), {
        k: len(v) for k, v in live.items()
    }
    snapshot = table.current_snapshot()
    assert snapshot is not None
    delete_manifests = [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DELETES]
    assert len(delete_manifests) <= MAX_FILES + 1
    assert_rows(spark, sink.table, sink.source.expected_rows(), every_reader=True)
