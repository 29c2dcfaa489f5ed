"""`icesink maintain`: compaction, expiry, manifest and orphan clean-up, fenced by the txnlog.

Each test starts from an upsert table the sink filled in many small commits (one equality-delete
file each), checks that the table really is in that state, and then what maintenance made of it:
the same rows through Spark and DuckDB, fewer files, the deletes applied.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog

from readers import duckdb_connect
from service.config import parse_config
from service.maintenance.lease import lease_id
from service.maintenance.table_health import table_health
from tests.ops.ops_helpers import free_port, http_status
from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows
from txnlog import Phase, TransactionLog


def _catalog(sink: Sink) -> Any:
    config = parse_config(sink.config)
    return load_catalog(config.catalog_name, **config.catalog_properties)


def _health(sink: Sink) -> Any:
    return table_health(_catalog(sink).load_table(sink.table), sink.table)


def _many_small_commits(
    make_sink: Any,
    rounds: int = 12,
    partition_by: list[str] | None = None,
    delete_format: str = "equality",
    **maintenance: Any,
) -> Sink:
    """An upsert table written in ``rounds`` commits of 40 changes each (one delete file per commit;
    in position mode but the first, which has no older row to delete)."""
    sink: Sink = make_sink(
        partitions=1,
        partition_by=partition_by,
        table={"delete_format": delete_format},
        keys=60,
        kafka={"max_offsets_per_trigger": 40},
        maintenance={
            "expiry": {"older_than": "1s", "retain_last": 2},
            "orphans": {"older_than": "1h"},
            **maintenance,
        },
    )
    sink.produce(40 * rounds)
    sink.run_until_caught_up()
    return sink


def _maintain(sink: Sink, *args: str, env: dict[str, str | None] | None = None) -> dict[str, Any]:
    done = sink.cli("maintain", "--once", *args, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _metadata_files(sink: Sink) -> list[str]:
    from service.maintenance.orphans import list_files

    table = _catalog(sink).load_table(sink.table)
    listed = list_files(table.io, table.metadata.location.rstrip("/") + "/metadata")
    return [f.path for f in listed if f.path.endswith(".metadata.json")]


@pytest.mark.parametrize(
    "partition_by",
    [
        pytest.param([], id="unpartitioned"),
        # Its deletes are global (an unpartitioned spec of their own). In `make chaos`, for time.
        pytest.param(["country"], id="partitioned_by_a_non_key_column", marks=pytest.mark.slow),
    ],
)
def test_maintain_once_applies_every_delete_and_keeps_the_rows(
    make_sink: Any, spark: Any, partition_by: list[str]
) -> None:
    sink = _many_small_commits(make_sink, partition_by=partition_by, metadata_versions=3)
    before = _health(sink)
    assert before.delete_files >= 10 and before.snapshots >= 10, before  # the state maintenance is for
    assert_rows(spark, sink.table, sink.source.expected_rows())
    props = _catalog(sink).load_table(sink.table).properties
    assert props["write.metadata.delete-after-commit.enabled"] == "true"
    assert props["write.metadata.previous-versions-max"] == "3"
    # The catalog deleted the metadata files of all but the last few commits as it went.
    assert len(_metadata_files(sink)) <= 4 < before.snapshots

    time.sleep(1.5)  # every snapshot but the newest two is now older than expiry.older_than
    loaded = _catalog(sink).load_table(sink.table)
    first_list = min(loaded.metadata.snapshots, key=lambda s: s.sequence_number or 0).manifest_list
    assert loaded.io.new_input(first_list).exists()
    # A data file of the first commit: compaction will replace it.
    first_manifests = min(loaded.metadata.snapshots, key=lambda s: s.sequence_number or 0).manifests(
        loaded.io
    )
    replaced = next(
        e.data_file.file_path
        for m in first_manifests
        if m.content == 0
        for e in m.fetch_manifest_entry(loaded.io)
    )
    report = _maintain(sink)

    (table,) = report["tables"]
    assert table["failed"] == {}, table
    assert {"compact", "expire_snapshots", "rewrite_manifests", "remove_orphans"} <= set(table["tasks"])
    after = _health(sink)
    assert after.delete_files == 0, after  # a reader opens data files only
    assert after.data_files < before.data_files, (before, after)
    # Every snapshot of the sink's but the newest two was older than expiry.older_than.
    assert table["tasks"]["expire_snapshots"]["snapshots_expired"] >= before.snapshots - 2, table
    # Expiry deleted the expired snapshots' manifest lists and manifests. The data files the
    # compaction replaced go when the compaction's own snapshot expires (Iceberg's incremental
    # clean-up deletes what an expired snapshot removed): see the second pass below.
    expired = table["tasks"]["expire_snapshots"]
    assert expired["detail"]["deleted_manifests_and_lists"] >= before.snapshots - 2, expired
    assert expired["detail"]["not_deleted"] == 0, expired
    assert not loaded.io.new_input(first_list).exists()
    assert after.snapshots < before.snapshots, after
    assert after.records == len(sink.source.expected_rows())
    assert table["tasks"]["compact"]["files_rewritten"] == before.data_files
    assert_rows(spark, sink.table, sink.source.expected_rows())
    status = json.loads(sink.cli("status").stdout)["tables"][0]
    assert status["health"]["delete_files"] == 0 and status["health"]["snapshots"] == after.snapshots
    assert status["maintenance"]["last"]["task"] == "report"
    assert set(status["maintenance"]["last"]["tasks"]) == set(table["tasks"])

    # The sink goes on committing on top of the compacted table, exactly.
    sink.produce(200)
    sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())

    # The next pass expires the compaction's (last) snapshot, and with it the data files it replaced
    # (a partitioned table's compaction commits per file group: the earlier groups' snapshots, and
    # their replaced files, may already have gone in the first pass).
    time.sleep(1.5)
    (again,) = _maintain(sink)["tables"]
    removed = expired["files_removed"] + again["tasks"]["expire_snapshots"]["files_removed"]
    assert removed >= before.data_files, again
    assert not loaded.io.new_input(replaced).exists()
    assert_rows(spark, sink.table, sink.source.expected_rows())


def test_a_maintainer_fenced_between_tasks_commits_nothing_more(make_sink: Any, spark: Any) -> None:
    sink = _many_small_commits(make_sink, rounds=6)
    config = parse_config(sink.config)
    table = _catalog(sink).load_table(sink.table)
    snapshots_before = len(table.metadata.snapshots)
    log = TransactionLog(config.txnlog.dsn)
    try:
        # The maintainer stops before its third task (expiry, after manifests and compaction), its
        # lease row unlocked; meanwhile a newer maintainer claims the table.
        maintainer = sink.start_cli(
            "maintain", "--once", env={"ICESINK_FAILPOINTS": "maintenance_before_task=delay:20@3"}
        )
        row = lease_id(sink.name, sink.table)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            state = log.state(row)
            payload = (
                state.committed_payload if state is not None and state.phase is Phase.COMMITTED else None
            )
            if payload and payload.get("task") == "compact":
                break
            assert maintainer.process.poll() is None, maintainer.log()
            time.sleep(0.5)
        else:
            pytest.fail("the maintainer never finished its compaction")
        assert state is not None  # the loop stopped at the state's committed payload
        newer = log.claim(row, "a newer maintainer")
        assert newer.epoch == state.epoch + 1

        code = maintainer.wait(120)
        assert code == 3, maintainer.log()
        assert "a newer maintainer took over" in maintainer.log()
        after = log.state(row)
        assert after is not None and after.committed_payload is not None
        assert after.committed_payload["task"] == "compact"  # no later task was precommitted
        table = _catalog(sink).load_table(sink.table)
        # compaction's snapshot(s) and nothing expired: the fenced maintainer's expiry never ran
        assert len(table.metadata.snapshots) > snapshots_before
    finally:
        log.close()
    assert_rows(spark, sink.table, sink.source.expected_rows())


def test_a_sink_commit_that_conflicts_with_a_compaction_is_retried_on_top_of_it(
    make_sink: Any, spark: Any, tmp_path: Path
) -> None:
    sink: Sink = make_sink(
        partitions=1,
        keys=60,
        kafka={"max_offsets_per_trigger": 40},
        txnlog={"session_timeout": "600s"},  # the sink's row stays locked while its commit is held
    )
    sink.produce(40 * 6)
    # The seventh commit has built its snapshot on the table as it was, then is held until the
    # compaction has committed (the release file).
    release = tmp_path / "release"
    run = sink.start(env={"ICESINK_FAILPOINTS": f"during_catalog_commit=wait:{release}@7"})
    run.wait_for_log("committed seq 6", timeout=240)
    sink.produce(40)
    run.wait_for_log("fail point during_catalog_commit: wait", timeout=120)

    report = _maintain(sink)
    compacted = report["tables"][0]["tasks"]["compact"]
    assert compacted["files_rewritten"] >= 6, compacted  # the compaction committed meanwhile
    assert "committed seq 7" not in run.log()  # the sink's commit was still held
    release.touch()

    run.wait_for_log("conflicted", timeout=120)  # the sink's commit met the compaction's snapshot
    run.wait_for_log("committed seq 7", timeout=120)
    sink.produce(100)
    run.kill(signal.SIGTERM)
    assert run.wait(120) == 0, run.log()[-4000:]
    sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())


def _command_lines(pid: int) -> list[str]:
    """The command lines of a process and all its descendants (the maintainer's JVM among them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    lines, todo = [], [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            lines.append(
                (Path("/proc") / str(current) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            )
        todo.extend(children.get(current, []))
    return lines


def test_the_maintenance_loop_answers_probes_and_stops_on_sigterm(make_sink: Any) -> None:
    sink = _many_small_commits(make_sink, rounds=3, interval="1s")
    port = free_port()
    maintainer = sink.start_cli("maintain", env={"ICESINK_HEALTH__PORT": str(port)})
    maintainer.wait_for_log("maintenance pass over 1 table(s)", timeout=180, count=2)
    assert http_status(f"http://127.0.0.1:{port}/healthz") == 200
    assert http_status(f"http://127.0.0.1:{port}/readyz") == 200  # a pass has finished
    # The catalog's secret reaches the maintainer's Spark, but never a command line.
    assert isinstance(maintainer.process, subprocess.Popen)  # a run given variables is a process of its own
    lines = _command_lines(maintainer.process.pid)
    assert any("org.apache.spark" in line for line in lines), lines  # the JVM is among them
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert not [line for line in lines if secret in line]
    maintainer.kill(signal.SIGTERM)
    assert maintainer.wait(60) == 0, maintainer.log()[-3000:]
    assert "stop requested" in maintainer.log()


def test_a_maintainer_stopped_while_its_spark_session_starts_exits_cleanly(make_sink: Any) -> None:
    """SIGTERM (a rollout, a scale-down) can come while the JVM is still starting: the maintainer
    finishes starting, does no pass, and exits 0, instead of dying of the signal."""
    sink: Sink = make_sink(partitions=1)
    maintainer = sink.start_cli("maintain")
    # The JVM's first line: the Spark session is starting, no pass can have begun.
    maintainer.wait_for_log("Using Spark's default log4j profile", timeout=120)
    maintainer.kill(signal.SIGTERM)
    assert maintainer.wait(180) == 0, maintainer.log()[-3000:]
    log = maintainer.log()
    assert "stop requested" in log
    assert "maintenance pass over" not in log  # the signal came before the first pass


def test_a_compaction_that_loses_to_a_sink_commit_is_retried_on_top_of_it(
    pg_dsn: str, rest_catalog: Any, spark: Any, unique_name: Any
) -> None:
    """A compaction's commit try built on the table before the sink's next commit is tried again by
    Iceberg on top of it, and lands. The try on the old table found the sink's older delete files
    obsolete; the retry must find them again in the sink's new snapshot, which it can't if the sink
    rewrote the delete manifest that held them (the sink merges its data manifests only)."""
    from tests.sink.test_commit_protocol import committer, new_table, pending_for

    namespace = unique_name("retry")
    table = new_table(rest_catalog, namespace)
    sink = committer(
        TransactionLog(pg_dsn, schema="icesink_protocol_tests"), rest_catalog, unique_name("s"), "a"
    )
    for offset, rows in enumerate(
        [[(1, "a", "c"), (2, "b", "c")], [(1, "a2", "u")], [(2, "b2", "u"), (3, "c", "c")]], 1
    ):
        sink.commit(pending_for(table, rows, offset=offset))

    # The compaction, as rewrite_data_files commits it: the live data files replaced by one file of
    # the table's rows, at the sequence number of the snapshot it read.
    jvm = spark.sparkContext._jvm
    java_table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession, f"rest.{namespace}.t"
    )
    started = java_table.currentSnapshot()
    tasks = java_table.newScan().planFiles().iterator()
    rewritten = []
    while tasks.hasNext():
        rewritten.append(tasks.next().file())
    compacted = pending_for(table, [(1, "a2", "c"), (2, "b2", "c"), (3, "c", "c")], offset=0).data_files[0]
    rewrite = java_table.newRewrite().validateFromSnapshot(started.snapshotId())
    rewrite.dataSequenceNumber(started.sequenceNumber())
    for f in rewritten:
        rewrite.deleteFile(f)
    rewrite.addFile(
        jvm.org.apache.iceberg.DataFiles.builder(java_table.spec())
        .withPath(compacted.file_path)
        .withFormat("PARQUET")
        .withFileSizeInBytes(compacted.file_size_in_bytes)
        .withRecordCount(compacted.record_count)
        .build()
    )
    rewrite.apply()  # the first try, on the table as the compaction read it

    sink.commit(pending_for(table, [(1, "a3", "u")], offset=4))  # the sink lands first
    sink_snapshot = rest_catalog.load_table(f"{namespace}.t").current_snapshot()
    assert sink_snapshot.parent_snapshot_id == started.snapshotId()

    rewrite.commit()  # Iceberg tries again, on top of the sink's snapshot

    final = rest_catalog.load_table(f"{namespace}.t")
    current = final.current_snapshot()
    assert current.summary.operation.value == "replace"
    assert current.parent_snapshot_id == sink_snapshot.snapshot_id  # the retry happened
    assert int(current.summary["total-data-files"]) == 2  # the compacted file and the sink's last
    assert int(current.summary["total-delete-files"]) < 4  # the obsolete deletes went
    con = duckdb_connect()
    rows = con.execute(f"SELECT id, v FROM iceberg_scan('{final.metadata_location}') ORDER BY id").fetchall()
    assert rows == [(1, "a3"), (2, "b2"), (3, "c")]


def _manifests(sink: Sink) -> tuple[set[str], set[str]]:
    """The current snapshot's data and delete manifests."""
    table = _catalog(sink).load_table(sink.table)
    manifests = table.current_snapshot().manifests(table.io)
    return {m.manifest_path for m in manifests if m.content == 0}, {
        m.manifest_path for m in manifests if m.content == 1
    }


def test_a_manifest_rewrite_leaves_the_data_manifests_the_sink_merges(make_sink: Any, spark: Any) -> None:
    """The sink merges a table's data manifests at each commit. A manifest rewrite that replaced them
    would lose its commit try to the sink's next commit, which merged them into a new one, and its
    retry would fail, the manifests it deletes gone; the maintainer rewrites the delete manifests,
    one per sink commit, and leaves the data manifests to the sink."""
    off = {"enabled": False}
    sink = _many_small_commits(make_sink, rounds=3, compaction=off, expiry=off)
    target = "commit.manifest.target-size-bytes"
    with _catalog(sink).load_table(sink.table).transaction() as tx:
        tx.set_properties({target: "1"})  # every data manifest too big to merge: they add up
    sink.produce(80)
    sink.run_until_caught_up()
    with _catalog(sink).load_table(sink.table).transaction() as tx:
        tx.remove_properties(target)  # the sink merges them again from its next commit
    data, deletes = _manifests(sink)
    assert len(data) >= 3 and len(deletes) >= 5, (data, deletes)

    (table,) = _maintain(sink)["tables"]

    assert table["failed"] == {}, table
    assert table["tasks"]["rewrite_manifests"]["detail"]["data_manifests_merged_by_the_sink"] is True, table
    after, rewritten = _manifests(sink)
    assert after == data  # the data manifests untouched
    assert len(rewritten) == 1  # the delete manifests rewritten into one
    assert_rows(spark, sink.table, sink.source.expected_rows())

    # The state a rewrite of data manifests would have raced: the sink's next commit merges them.
    sink.produce(40)
    sink.run_until_caught_up()
    merged, _ = _manifests(sink)
    assert len(merged) == 1 and not merged & data, merged
    assert_rows(spark, sink.table, sink.source.expected_rows())
